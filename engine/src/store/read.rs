//! The read path: collecting a session's extents, walking their frames (segments and run
//! blocks), `visit_events`, `read`, `read_json_lines` and `get`.

use super::{io_error, line::push_json_line, Event, EventView, Store};
use crate::error::{Error, Result};
use crate::limits::MAX_FOLLOW_ATTEMPTS;
use crate::storage::catalog::{collect_slices, Extent, ExtentSlice, Position};
use crate::storage::coding::{checked_u32, checked_usize, widen};
use crate::storage::frame::{decode_frame, decode_run_frame, peek_frame, EventRecord, Record};
use crate::storage::io::StorageFile;
use crate::storage::run::rows::{peek_row_entry, RowEntry, ROW_ENTRY_KIND};
pub use crate::storage::run::rows::{RowMember, RowMembers};
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

/// A stored event as its view: its text fields checked as UTF-8 (at `position`).
fn event_view<'a>(
    event: &EventRecord<'a>,
    event_type: &'a str,
    position: &Position,
) -> Result<EventView<'a>> {
    Ok(EventView {
        seq: event.seq,
        time: event.time,
        event_type,
        data: event_text(event.data, position)?,
        envelope: event_text(event.envelope, position)?,
        flags: event.flags,
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

/// The blocks of one whole-session scan that reads in steps ([`Store::visit_entries_in`]):
/// one buffer for all its steps, so that the block a step ends in is not decompressed again
/// by the next, and nothing of the scan goes into the shared cache. (A fresh walk per step
/// put each step's first block in the cache: a cold resume of 1.3M events filled all
/// 64 MiB of it, half its peak memory, and decompressed most blocks twice.)
pub struct ReadScan {
    blocks: WalkBlocks,
}

impl Default for ReadScan {
    fn default() -> Self {
        ReadScan {
            blocks: WalkBlocks {
                cached_a_miss: true,
                scan: ScanBuffer::reading_ahead(),
            },
        }
    }
}

impl ReadScan {
    /// A scan that decompresses each block on the thread that walks it, with no read-ahead
    /// thread: for callers that already keep every core busy with scans of their own (an
    /// export's parts).
    pub fn on_this_thread() -> Self {
        ReadScan {
            blocks: WalkBlocks {
                cached_a_miss: true,
                scan: ScanBuffer::default(),
            },
        }
    }
}

impl WalkBlocks {
    fn block(
        &mut self,
        reader: &Arc<RunReader>,
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

/// What [`Store::visit_entries`] lends: one event, or a whole row entry.
#[derive(Debug, Clone, Copy)]
pub enum EntryView<'v, 'a> {
    Event(&'v EventView<'a>),
    Row(&'v RowView<'a>),
}

/// A stored row entry (format-spec F-06-30) lent whole by [`Store::visit_entries`]: the
/// events of seqs `first_seq() ..` of one type whose `data` are `prefix ‖ payload ‖
/// suffix` and whose envelopes are empty. Its prefix, suffix and payloads were checked to
/// be UTF-8 (F-02-16), as a member read one by one would be.
#[derive(Debug, Clone, Copy)]
pub struct RowView<'a> {
    pub event_type: &'a str,
    pub prefix: &'a str,
    pub suffix: &'a str,
    entry: RowEntry<'a>,
    position: Position,
}

impl<'a> RowView<'a> {
    fn new(entry: RowEntry<'a>, event_type: &'a str, position: &Position) -> Result<Self> {
        let prefix = event_text(entry.prefix, position)?;
        let suffix = event_text(entry.suffix, position)?;
        if !entry.payloads_are_utf8() {
            return Err(Error::Corrupt {
                segment: position.segment,
                offset: position.offset,
                reason: "event text is not UTF-8".to_string(),
            });
        }
        Ok(RowView {
            event_type,
            prefix,
            suffix,
            entry,
            position: *position,
        })
    }

    pub fn first_seq(&self) -> u64 {
        self.entry.first_seq
    }

    pub fn member_count(&self) -> u32 {
        self.entry.member_count
    }

    /// Event flags of the first member.
    pub fn first_flags(&self) -> u8 {
        self.entry.first_flags
    }

    /// Event flags of every later member.
    pub fn member_flags(&self) -> u8 {
        self.entry.member_flags
    }

    /// The members in seq order (each payload UTF-8, checked at construction).
    pub fn members(&self) -> RowMembers<'_, 'a> {
        self.entry.members()
    }

    /// Calls `visit` with each member as the event it stands for, in seq order (its `data`
    /// rebuilt in one reused buffer), until `visit` fails.
    pub fn visit_events<E>(
        &self,
        mut visit: impl FnMut(&EventView<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E>
    where
        E: From<Error>,
    {
        let mut data = Vec::new();
        for member in self.entry.members() {
            let event = self.entry.member_event(&member, &mut data);
            visit(&EventView {
                seq: event.seq,
                time: event.time,
                event_type: self.event_type,
                data: event_text(event.data, &self.position)?,
                envelope: "",
                flags: event.flags,
            })?;
        }
        Ok(())
    }
}

/// How the frames an extent's bytes hold are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameForm {
    /// A write-ahead segment: checksummed frames under the segment's salt.
    Segment,
    /// A version-1 run block: frames with a zero checksum field, event frames only.
    Run,
    /// A version-2 run block: also row entries (F-06-30).
    RunWithRows,
}

/// What a walk does with a row entry that lies wholly in its range: lends it whole
/// ([`Store::visit_entries`]) instead of its members one by one.
type WholeRows<'w> = Option<&'w mut dyn FnMut(&RowEntry<'_>, &str, &Position) -> Result<()>>;

/// One row entry met by a walk: which of its members the walk visits.
struct RowWalk {
    session: u32,
    /// Index in the extent's events of the entry's first member, if it is the session's.
    first_index: u64,
    /// Indexes in the extent's events the walk visits.
    wanted: std::ops::Range<u64>,
    /// Seq of the extent's first event.
    first_seq: u64,
}

impl RowWalk {
    /// Visits the wanted members of the row entry `frame` (decoded only when one is wanted)
    /// and returns how many of the extent's events it holds (0 for another session's).
    /// `salt` is the segment's for a row entry of a segment (F-02-20), `None` in a run.
    #[allow(clippy::too_many_arguments)]
    fn visit(
        &self,
        frame: &[u8],
        salt: Option<u64>,
        position: &Position,
        types: &HashMap<u32, String>,
        member_data: &mut Vec<u8>,
        visit: &mut impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
        whole_rows: &mut WholeRows<'_>,
    ) -> Result<u64> {
        let damaged = |reason: &str| damage_at(position, salt, reason.to_string());
        let decoded = match salt {
            None => decode_run_frame(frame),
            Some(salt) => decode_frame(frame, salt),
        }
        .map_err(|error| damaged(&format!("{error:?}")))?;
        let (session, count) = peek_row_entry(decoded.payload).map_err(|error| damaged(error.0))?;
        if session != self.session {
            return Ok(0);
        }
        let count = u64::from(count);
        if self.first_index + count <= self.wanted.start {
            return Ok(count);
        }
        let row = RowEntry::decode(decoded.payload).map_err(|error| damaged(error.0))?;
        if row.first_seq != self.first_seq + self.first_index {
            return Err(damaged("indexed row entry has another seq"));
        }
        let event_type = types
            .get(&row.type_number)
            .ok_or_else(|| damaged("unknown type number"))?;
        let inside =
            self.first_index >= self.wanted.start && self.first_index + count <= self.wanted.end;
        if let (true, Some(whole)) = (inside, whole_rows.as_mut()) {
            whole(&row, event_type, position)?;
            return Ok(count);
        }
        for (member_index, member) in (self.first_index..).zip(row.members()) {
            if member_index >= self.wanted.end {
                break;
            }
            if member_index >= self.wanted.start {
                let event = row.member_event(&member, member_data);
                visit(&event, event_type, position)?;
            }
        }
        Ok(count)
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
            visit(&event_view(event, event_type, position)?)
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
        let walked = self.walk_events(id, from, to, visit, None);
        if let Err(error) = &walked {
            self.note_damage(error);
        }
        walked
    }

    /// [`Store::visit_events`], except that a row entry of a run (format-spec F-06-30) that
    /// lies wholly in `from..to` is lent whole as [`EntryView::Row`] instead of member by
    /// member: a reader that needs only its members' seqs, times and flags (cold resume of
    /// log-only chunk events) then never builds their `data`.
    pub fn visit_entries(
        &self,
        id: &str,
        from: u64,
        to: u64,
        visit: impl FnMut(EntryView<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        self.visit_entries_walking(&mut WalkBlocks::default(), id, from, to, visit)
    }

    /// [`Store::visit_entries`] as one step of a scan that reads a session in steps:
    /// `scan` carries the decompressed block from one step to the next.
    pub fn visit_entries_in(
        &self,
        scan: &mut ReadScan,
        id: &str,
        from: u64,
        to: u64,
        visit: impl FnMut(EntryView<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        self.visit_entries_walking(&mut scan.blocks, id, from, to, visit)
    }

    fn visit_entries_walking(
        &self,
        blocks: &mut WalkBlocks,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(EntryView<'_, '_>) -> Result<()>,
    ) -> Result<()> {
        let walked = {
            let visit_cell = std::cell::RefCell::new(&mut visit);
            let mut whole = |row: &RowEntry<'_>, event_type: &str, position: &Position| {
                let view = RowView::new(*row, event_type, position)?;
                (visit_cell.borrow_mut())(EntryView::Row(&view))
            };
            self.walk_events_in(
                blocks,
                id,
                from,
                to,
                |event, event_type, position| {
                    (visit_cell.borrow_mut())(EntryView::Event(&event_view(
                        event, event_type, position,
                    )?))
                },
                Some(&mut whole),
            )
        };
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
        visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
        whole_rows: WholeRows<'_>,
    ) -> Result<()> {
        let mut blocks = WalkBlocks::default();
        self.walk_events_in(&mut blocks, id, from, to, visit, whole_rows)
    }

    fn walk_events_in(
        &self,
        blocks: &mut WalkBlocks,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
        mut whole_rows: WholeRows<'_>,
    ) -> Result<()> {
        let mut attempts = 0;
        let (_positions_stay_valid, slices, types) = loop {
            attempts += 1;
            let gate = self.inner.read_gate.read();
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
            // Every file opened before the first event is visited: from then on another
            // process's seal or rewrite cannot take a file from under the walk (F-08-18).
            match self.open_files_of(&slices) {
                Ok(()) => break (gate, slices, types),
                Err(error) if self.is_shared() => {
                    drop(gate);
                    if !self.follow_replaced_file(&error)? {
                        return Err(error);
                    }
                    if attempts >= MAX_FOLLOW_ATTEMPTS {
                        // Not damage (F-08-12): this process's own appends kept it from
                        // following for the whole patience; a later read succeeds.
                        return Err(Error::io(
                            "file replaced by another process",
                            std::io::Error::new(std::io::ErrorKind::NotFound, error.to_string()),
                        ));
                    }
                }
                Err(error) => return Err(error),
            }
        };
        for slice in &slices {
            self.walk_slice(slice, &types, blocks, &mut visit, &mut whole_rows)?;
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
        whole_rows: &mut WholeRows<'_>,
    ) -> Result<()> {
        let extent = slice.extent;
        let (bytes, base, form) = self.extent_bytes(&extent, blocks)?;
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
        let mut seen = 0u64;
        let mut last_type: Option<(u32, &str)> = None;
        let skip = u64::from(slice.skip);
        let wanted = skip.saturating_add(u64::from(slice.take));
        let mut member_data = Vec::new();
        // One lookup of the segment's salt for all its frames (not one per event).
        let salt = match form {
            FrameForm::Segment => Some(self.salt_of(extent.file)?),
            FrameForm::Run | FrameForm::RunWithRows => None,
        };
        while seen < wanted {
            let offset = base + widen(at);
            let frame = span
                .get(at..)
                .filter(|rest| !rest.is_empty())
                .ok_or_else(|| corrupt(offset, "extent holds fewer events than indexed"))?;
            let peek = peek_frame(frame).map_err(|error| corrupt(offset, &format!("{error:?}")))?;
            if form != FrameForm::Run && peek.kind == ROW_ENTRY_KIND {
                let position = Position {
                    segment: extent.file,
                    offset,
                    frame_bytes: checked_u32(peek.total_bytes, "frame length")?,
                };
                let walk = RowWalk {
                    session: slice.session,
                    first_index: seen,
                    wanted: skip..wanted,
                    first_seq: slice.first_seq,
                };
                seen += walk.visit(
                    &frame[..peek.total_bytes],
                    salt,
                    &position,
                    types,
                    &mut member_data,
                    visit,
                    whole_rows,
                )?;
                at += peek.total_bytes;
                continue;
            }
            let ours = peek.event_session == Some(slice.session);
            if ours && seen >= skip {
                let position = Position {
                    segment: extent.file,
                    offset,
                    frame_bytes: checked_u32(peek.total_bytes, "frame length")?,
                };
                let event = decode_record(frame, &position, salt)?;
                if event.seq != slice.first_seq + seen {
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
            seen += u64::from(ours);
            at += peek.total_bytes;
        }
        Ok(())
    }

    /// The bytes holding an extent: in a run, the decompressed block itself (no copy), in a
    /// segment one read of the extent's span. Returns the bytes, the offset they start at
    /// and the form of their frames.
    fn extent_bytes(
        &self,
        extent: &Extent,
        blocks: &mut WalkBlocks,
    ) -> Result<(Arc<Vec<u8>>, u64, FrameForm)> {
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
            let form = match reader.index.holds_rows() {
                true => FrameForm::RunWithRows,
                false => FrameForm::Run,
            };
            return Ok((bytes, block.raw_offset, form));
        }
        let bytes = self.read_segment_span(extent.file, extent.offset, extent.end())?;
        Ok((Arc::new(bytes), extent.offset, FrameForm::Segment))
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

    /// Opens every file the slices read (kept open in `files` and `run_readers`).
    fn open_files_of(&self, slices: &[ExtentSlice]) -> Result<()> {
        let mut opened = std::collections::HashSet::new();
        for slice in slices {
            let file = slice.extent.file;
            if opened.insert(file) && self.run_reader(file)?.is_none() {
                self.segment_file(file)?;
            }
        }
        Ok(())
    }

    /// After a read found a file gone that the catalog points into: when another process
    /// replaced it (F-08-12), follows the manifest in force (F-08-17) and returns `true`
    /// (the read is tried again); otherwise `false` (the error stands).
    fn follow_replaced_file(&self, error: &Error) -> Result<bool> {
        let vanished = match error {
            Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::CorruptFile { .. } => true,
            _ => false,
        };
        if !vanished || !self.behind_replacements()? {
            return Ok(false);
        }
        // Another thread of this process may be appending (holding the tail): the catch-up
        // then waits for its turn, and a later try follows.
        self.open_log()?.catch_up()?;
        self.forget_replaced_files();
        std::thread::sleep(crate::limits::FOLLOW_REPLACED_PAUSE);
        Ok(true)
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
}

/// Damage at `position`: of a segment when its frames carry a `salt`, else of a run.
fn damage_at(position: &Position, salt: Option<u64>, reason: String) -> Error {
    match salt {
        None => Error::CorruptRun {
            run: position.segment,
            offset: position.offset,
            reason,
        },
        Some(_) => Error::Corrupt {
            segment: position.segment,
            offset: position.offset,
            reason,
        },
    }
}

/// Decodes the event frame at the start of `bytes`: a write-ahead frame checked against its
/// segment's `salt`, or (no salt) a frame of a run block.
fn decode_record<'a>(
    bytes: &'a [u8],
    position: &Position,
    salt: Option<u64>,
) -> Result<EventRecord<'a>> {
    let corrupt = |reason: String| damage_at(position, salt, reason);
    let frame = match salt {
        None => decode_run_frame(bytes),
        Some(salt) => decode_frame(bytes, salt),
    }
    .map_err(|error| corrupt(format!("{error:?}")))?;
    match Record::decode(&frame) {
        Ok(Some(Record::Event(event))) => Ok(event),
        _ => Err(corrupt("indexed frame is not an event".to_string())),
    }
}
