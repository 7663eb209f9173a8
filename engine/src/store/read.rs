//! The read path: collecting a session's extents, walking their frames (segments and run
//! blocks), `visit_events`, `read`, `read_json_lines` and `get`.

use super::{io_error, line::push_json_line, Event, EventView, Store};
use crate::error::{Error, Result};
use crate::storage::catalog::{collect_slices, Extent, ExtentSlice, Position};
use crate::storage::coding::{checked_u32, checked_usize};
use crate::storage::frame::{decode_frame, decode_run_frame, peek_frame, EventRecord, Record};
use crate::storage::io::StorageFile;
use crate::storage::run::{run_path, BlockCache, RunReader, ScanBuffer};
use crate::storage::segment::segment_path;
use std::collections::HashMap;
use std::sync::Arc;

/// An event's text field, which must be UTF-8 (else corruption at its position).
pub(super) fn event_text<'a>(field: &'a [u8], position: &Position) -> Result<&'a str> {
    std::str::from_utf8(field).map_err(|_| Error::Corrupt {
        segment: position.segment,
        offset: position.offset,
        reason: "event text is not UTF-8".to_string(),
    })
}

/// Where one walk gets its run blocks: the shared cache for the first block it misses
/// there (so short reads repeated by a caller hit), its own reused buffer for the rest (so
/// a whole-session scan, like export or a cold load, neither flushes the cache that other
/// readers share nor allocates a fresh block each time).
#[derive(Default)]
pub(super) struct WalkBlocks {
    cached_a_miss: bool,
    scan: ScanBuffer,
}

impl WalkBlocks {
    fn block(
        &mut self,
        reader: &RunReader,
        block: usize,
        cache: &BlockCache,
    ) -> Result<Arc<Vec<u8>>> {
        if let Some(bytes) = cache.get(reader.index.id, block) {
            return Ok(bytes);
        }
        if !self.cached_a_miss {
            self.cached_a_miss = true;
            return reader.block(block, Some(cache));
        }
        reader.block_into(block, &mut self.scan)
    }
}

impl Store {
    /// The events with seq in `from..to` (clamped to the session's length).
    pub fn read(&self, id: &str, from: u64, to: u64) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        self.visit_events(id, from, to, |event| {
            events.push(event.to_event());
            Ok(())
        })?;
        Ok(events)
    }

    /// Calls `visit` with every event of `from..to` in seq order (clamped to the session's
    /// length), borrowed from the store's buffers: nothing is copied per event. An error
    /// from `visit` stops the walk and is returned.
    pub fn visit_events(
        &self,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventView<'_>) -> Result<()>,
    ) -> Result<()> {
        self.for_each_event(id, from, to, |event, event_type, position| {
            visit(&EventView {
                seq: event.seq,
                time: event.time,
                event_type,
                data: event_text(event.data, position)?,
                envelope: event_text(event.envelope, position)?,
                flags: event.flags,
            })
        })
    }

    /// Appends the DSH JSONL lines (each ending in `\n`) of the events with seq in
    /// `from..to` to `out`, without building [`Event`]s; returns how many were written.
    pub fn read_json_lines(&self, id: &str, from: u64, to: u64, out: &mut String) -> Result<u64> {
        let mut count = 0;
        self.for_each_event(id, from, to, |event, event_type, position| {
            let data = event_text(event.data, position)?;
            let envelope = event_text(event.envelope, position)?;
            push_json_line(
                out,
                event_type,
                event.seq,
                event.time,
                data,
                envelope,
                event.flags,
            );
            out.push('\n');
            count += 1;
            Ok(())
        })?;
        Ok(count)
    }

    /// Calls `visit` with every event of `from..to` in seq order, its type name and its
    /// position (for [`event_text`]).
    pub(super) fn for_each_event(
        &self,
        id: &str,
        from: u64,
        to: u64,
        visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        let walked = self.walk_events(id, from, to, visit);
        if let Err(error) = &walked {
            self.note_damage(error);
        }
        walked
    }

    fn walk_events(
        &self,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        let _positions_stay_valid = self.inner.read_gate.read();
        let (slices, types) = {
            let catalog = self.inner.catalog.read();
            let number = *catalog
                .by_id
                .get(id)
                .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
            let mut slices = Vec::new();
            collect_slices(&catalog, number, from, to, &mut slices);
            (slices, catalog.type_names.clone())
        };
        let mut blocks = WalkBlocks::default();
        for slice in &slices {
            self.walk_slice(slice, &types, &mut blocks, &mut visit)?;
        }
        Ok(())
    }

    /// Walks the frames of one extent: steps over frames that are not the session's
    /// events, and over the first `skip` of its events, then decodes (checksums included)
    /// and visits `take` events, each checked to be of the session and the expected seq
    /// (F-06-23: an index that disagrees with the file is corruption).
    pub(super) fn walk_slice(
        &self,
        slice: &ExtentSlice,
        types: &HashMap<u32, String>,
        blocks: &mut WalkBlocks,
        visit: &mut impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        let extent = slice.extent;
        let (bytes, base, in_run) = self.extent_bytes(&extent, blocks)?;
        let corrupt = |offset: u64, reason: &str| Error::Corrupt {
            segment: extent.file,
            offset,
            reason: reason.to_string(),
        };
        let span_end = checked_usize(extent.end() - base, "extent end")?;
        let span = bytes
            .get(..span_end)
            .ok_or_else(|| corrupt(extent.offset, "extent past its bytes"))?;
        let mut at = checked_usize(extent.offset - base, "extent offset")?;
        let mut seen = 0u32;
        let mut last_type: Option<(u32, &str)> = None;
        let wanted = slice.skip.saturating_add(slice.take);
        while seen < wanted {
            let offset = base + at as u64;
            let frame = span
                .get(at..)
                .filter(|rest| !rest.is_empty())
                .ok_or_else(|| corrupt(offset, "extent holds fewer events than indexed"))?;
            let peek = peek_frame(frame).map_err(|error| corrupt(offset, &format!("{error:?}")))?;
            let ours = peek.event_session == Some(slice.session);
            if ours && seen >= slice.skip {
                let position = Position {
                    segment: extent.file,
                    offset,
                    frame_bytes: checked_u32(peek.total_bytes, "frame length")?,
                };
                let event = self.decode_record(frame, &position, in_run)?;
                if event.seq != slice.first_seq + u64::from(seen) {
                    return Err(corrupt(offset, "indexed event has another seq"));
                }
                // Neighbouring events mostly share a type (chunk runs): one lookup for them.
                let event_type = match last_type {
                    Some((number, name)) if number == event.type_number => name,
                    _ => types
                        .get(&event.type_number)
                        .ok_or_else(|| corrupt(offset, "unknown type number"))?,
                };
                last_type = Some((event.type_number, event_type));
                visit(&event, event_type, &position)?;
            }
            seen += u32::from(ours);
            at += peek.total_bytes;
        }
        Ok(())
    }

    /// The bytes holding an extent: in a run, the decompressed block itself (no copy), in a
    /// segment one read of the extent's span. Returns the bytes, the offset they start at
    /// and whether they come from a run.
    fn extent_bytes(
        &self,
        extent: &Extent,
        blocks: &mut WalkBlocks,
    ) -> Result<(Arc<Vec<u8>>, u64, bool)> {
        if let Some(reader) = self.run_reader(extent.file)? {
            let past_run = || Error::CorruptRun {
                run: extent.file,
                offset: extent.offset,
                reason: "extent past its run block".to_string(),
            };
            let block_index = reader.index.block_at(extent.offset).ok_or_else(past_run)?;
            let block = reader.index.blocks[block_index];
            if extent.end() > block.raw_end() {
                return Err(past_run());
            }
            let bytes = blocks.block(&reader, block_index, &self.inner.cache)?;
            return Ok((bytes, block.raw_offset, true));
        }
        let bytes = self.read_segment_span(extent.file, extent.offset, extent.end())?;
        Ok((Arc::new(bytes), extent.offset, false))
    }

    /// One event by seq.
    pub fn get(&self, id: &str, seq: u64) -> Result<Event> {
        let length = self.session(id)?.events;
        if seq >= length {
            return Err(Error::SeqOutOfRange {
                id: id.to_string(),
                seq,
                length,
            });
        }
        let mut events = self.read(id, seq, seq + 1)?;
        events.pop().ok_or(Error::SeqOutOfRange {
            id: id.to_string(),
            seq,
            length,
        })
    }

    pub(super) fn salt_of(&self, segment: u64) -> Result<u64> {
        if let Some(salt) = self.inner.salts.read().get(&segment) {
            return Ok(*salt);
        }
        if let Some(run) = self.inner.run_entries.read().get(&segment) {
            return Ok(run.salt);
        }
        let salt = self
            .inner
            .log
            .as_ref()
            .and_then(|log| log.salt_of(segment))
            .ok_or_else(|| Error::CorruptFile {
                file: segment_path(segment),
                reason: "not named by the manifest".to_string(),
            })?;
        self.inner.salts.write().insert(segment, salt);
        Ok(salt)
    }

    /// Bytes `start..end` of write-ahead segment `segment` (runs are read by block).
    pub(super) fn read_segment_span(&self, segment: u64, start: u64, end: u64) -> Result<Vec<u8>> {
        if let Some(log) = &self.inner.log {
            log.wait_written(segment, end)?;
        }
        let file = self.segment_file(segment)?;
        let mut bytes = vec![0; checked_usize(end - start, "segment span")?];
        file.read_exact_at(&mut bytes, start)
            .map_err(io_error("segment read"))?;
        Ok(bytes)
    }

    /// The opened run `id`, or `None` when `id` is not a live run.
    pub(super) fn run_reader(&self, id: u64) -> Result<Option<Arc<RunReader>>> {
        let Some(entry) = self.inner.run_entries.read().get(&id).copied() else {
            return Ok(None);
        };
        let mut readers = self.inner.run_readers.lock();
        if let Some(reader) = readers.get(&id) {
            return Ok(Some(reader.clone()));
        }
        let file = self
            .inner
            .storage
            .open_read(&run_path(id))
            .map_err(|error| Error::opening_named_file("run open", &run_path(id), error))?;
        let reader = Arc::new(RunReader::open(file, &entry)?);
        readers.insert(id, reader.clone());
        Ok(Some(reader))
    }

    pub(super) fn segment_file(&self, segment: u64) -> Result<Arc<dyn StorageFile>> {
        let mut files = self.inner.files.lock();
        if let Some(file) = files.get(&segment) {
            return Ok(file.clone());
        }
        let file = self
            .inner
            .storage
            .open_read(&segment_path(segment))
            .map_err(io_error("segment open"))?;
        files.insert(segment, file.clone());
        Ok(file)
    }

    pub(super) fn decode_record<'a>(
        &self,
        bytes: &'a [u8],
        position: &Position,
        in_run: bool,
    ) -> Result<EventRecord<'a>> {
        let corrupt = |reason: String| match in_run {
            true => Error::CorruptRun {
                run: position.segment,
                offset: position.offset,
                reason,
            },
            false => Error::Corrupt {
                segment: position.segment,
                offset: position.offset,
                reason,
            },
        };
        let frame = if in_run {
            decode_run_frame(bytes)
        } else {
            decode_frame(bytes, self.salt_of(position.segment)?)
        }
        .map_err(|error| corrupt(format!("{error:?}")))?;
        match Record::decode(&frame) {
            Ok(Some(Record::Event(event))) => Ok(event),
            _ => Err(corrupt("indexed frame is not an event".to_string())),
        }
    }
}
