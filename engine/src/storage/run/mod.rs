//! Run files (format-spec/06-runs-and-index.md): a sealed segment's records regrouped per
//! session into zstd-compressed blocks, with a checksummed footer index
//! `(session, seq range) → block`. Pure encoding and decoding plus block reads; the sealing
//! protocol (file sync, manifest, removal) lives in `store::maintenance`. Row entries
//! (several events as one entry, version 2) are encoded in [`rows`].

mod read_ahead;
pub mod rows;

use crate::error::{Error, Result};
use crate::storage::catalog::Extent;
use crate::storage::coding::{
    checked_count_u32, checked_u32, checked_usize, id_file_name, parse_id_file_name, u32_at,
    u32_to_usize, u64_at, widen, Reader, ShortInput, Writer,
};
use crate::storage::frame::{decode_run_frame, Record, FRAME_HEADER_BYTES};
use crate::storage::frame::{EventRecord, Frame};
use crate::storage::io::StorageFile;
use crate::storage::manifest::RunEntry;
use crate::storage::segment::scan_frames;
use parking_lot::Mutex;
use rows::{encode_row_entry, row_groups, RowEntry, ROW_ENTRY_KIND};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Directory that holds run files.
pub const RUNS_DIR: &str = "runs";
/// Bytes of the run header, as its `header_bytes` field holds them (F-06-5).
const HEADER_BYTES_FIELD: u32 = 64;
/// Bytes of the run header; block 0 starts here (F-06-5).
pub const RUN_HEADER_BYTES: u64 = HEADER_BYTES_FIELD as u64;
/// [`RUN_HEADER_BYTES`] as an in-memory length.
const HEADER_LENGTH: usize = HEADER_BYTES_FIELD as usize;
const RUN_MAGIC: &[u8; 8] = b"DSHDBRUN";
const RUN_TRAILER_MAGIC: &[u8; 8] = b"DSHDBRNF";
/// The run file format version this build writes (F-06-2): version 2 may hold row entries
/// (F-06-30).
pub const RUN_VERSION: u32 = 2;
/// The first run file version, which holds event frames only; this build reads it as it
/// reads version 2 (F-06-33).
pub const RUN_VERSION_WITHOUT_ROWS: u32 = 1;
pub use crate::limits::RUN_BLOCK_RAW_BYTES;
/// Bytes of one footer entry.
pub const FOOTER_ENTRY_BYTES: usize = 48;
/// Bytes of the trailer that ends a run file.
pub const TRAILER_BYTES: usize = 24;
/// The `session` of the definitions block (block 0).
pub const DEFINITIONS_SESSION: u32 = u32::MAX;
/// zstd level of run blocks. Measured on the DSH mix with 512 KiB blocks (BENCHMARKS.md,
/// `run_sweep`): level 9 stores 32.6 B/event (0.81x DSH's per-turn jsonl.zstd), level 12
/// 31.1 (0.77x) sealing at ~28 MB/s, level 15 29.7 at ~6 MB/s, level 19 27.3 at ~2 MB/s.
/// Sealing runs on the maintenance thread, off the append path; 12 is the cheapest level
/// that meets the 0.8x target with margin.
pub const RUN_ZSTD_LEVEL: i32 = 12;
pub use crate::limits::MAX_RUN_BLOCKS;

/// Extension of a run file (`<id as 16 lower-case hex digits>.run`, F-01-1).
const RUN_EXTENSION: &str = "run";

/// The path of run `id`.
pub fn run_path(id: u64) -> String {
    format!("{RUNS_DIR}/{}", id_file_name(id, RUN_EXTENSION))
}

/// Parses a run file name back to its id.
pub fn parse_run_name(name: &str) -> Option<u64> {
    parse_id_file_name(name, RUN_EXTENSION)
}

/// One footer entry: where a block lies and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockEntry {
    pub session: u32,
    pub event_count: u32,
    pub first_seq: u64,
    pub raw_offset: u64,
    pub raw_bytes: u32,
    pub stored_checksum: u32,
    pub file_offset: u64,
    pub stored_bytes: u32,
}

impl BlockEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        Writer::new(out)
            .u32(self.session)
            .u32(self.event_count)
            .u64(self.first_seq)
            .u64(self.raw_offset)
            .u32(self.raw_bytes)
            .u32(self.stored_checksum)
            .u64(self.file_offset)
            .u32(self.stored_bytes)
            .u32(0);
    }

    fn decode(reader: &mut Reader<'_>) -> std::result::Result<BlockEntry, ShortInput> {
        let entry = BlockEntry {
            session: reader.u32("block session")?,
            event_count: reader.u32("block event count")?,
            first_seq: reader.u64("block first seq")?,
            raw_offset: reader.u64("block raw offset")?,
            raw_bytes: reader.u32("block raw bytes")?,
            stored_checksum: reader.u32("block checksum")?,
            file_offset: reader.u64("block file offset")?,
            stored_bytes: reader.u32("block stored bytes")?,
        };
        // The entry's reserved word (FOOTER_ENTRY_BYTES = 48 with it).
        reader.u32("block reserved")?;
        Ok(entry)
    }

    /// One past the block's last raw byte.
    pub fn raw_end(&self) -> u64 {
        self.raw_offset + u64::from(self.raw_bytes)
    }
}

/// A run made from a segment, ready to be written.
pub struct BuiltRun {
    pub bytes: Vec<u8>,
    pub entry: RunEntry,
    /// Where the events went, one extent per event block: `(session, first seq, extent)`.
    pub moved: Vec<(u32, u64, Extent)>,
    /// Events the run holds.
    pub events: u64,
    /// Raw (uncompressed) bytes of its blocks.
    pub raw_bytes: u64,
    /// Events of deleted sessions left out (F-06-24), and their frame bytes in the segment.
    pub dropped_events: u64,
    pub dropped_bytes: u64,
}

/// What sealing keeps of deleted sessions (F-06-24): for each deleted session number, the
/// events with a seq below the value are kept (the prefix live forks still read as their
/// seed); its later events are dropped. Sessions not named are kept whole.
pub type Retained = HashMap<u32, u64>;

/// Events of one session gathered from the source segment, in seq order.
pub(crate) struct SessionEvents<'a> {
    pub session: u32,
    pub first_seq: u64,
    pub events: Vec<EventRecord<'a>>,
}

/// A session's events laid out as a run's entries: event frames and row entries.
pub(crate) struct SessionEntries {
    pub session: u32,
    pub raw: Vec<u8>,
    /// (first seq, offset in `raw`, entry bytes, events) of every entry.
    pub entries: Vec<(u64, usize, usize, u32)>,
}

fn corrupt(segment: u64, offset: u64, reason: &str) -> Error {
    Error::Corrupt {
        segment,
        offset,
        reason: reason.to_string(),
    }
}

/// Damage inside run `run` at plaintext offset `offset` (named as a run, never a segment).
pub(crate) fn run_corrupt(run: u64, offset: u64, reason: &str) -> Error {
    Error::CorruptRun {
        run,
        offset,
        reason: reason.to_string(),
    }
}

/// Rewrites the records of a sealed segment as a run (F-06-1), leaving out the events of
/// deleted sessions that `retained` does not keep (F-06-24). The segment must end with a
/// seal; records that no commit covers make it corrupt.
pub fn build_run(
    segment_bytes: &[u8],
    segment: u64,
    segment_salt: u64,
    run_id: u64,
    run_salt: u64,
    retained: &Retained,
) -> Result<BuiltRun> {
    let mut definitions = Vec::new();
    let mut sessions: Vec<SessionEvents> = Vec::new();
    let mut slot_of: HashMap<u32, usize> = HashMap::new();
    let mut uncommitted = 0usize;
    let mut dropped_events = 0u64;
    let mut dropped_bytes = 0u64;
    let mut records = Vec::new();
    let scan = scan_frames(segment_bytes, segment, segment_salt, |offset, record| {
        records.push((offset, record));
        Ok(())
    })?;
    // A row entry of the segment (F-02-20) is laid out again from its members, so that
    // retention cuts it like any events and the run's own grouping decides its entries.
    let rows_data: Vec<Vec<u8>> = records
        .iter()
        .filter_map(|(_, record)| match record {
            Record::Row(row) => Some(row.members_data()),
            _ => None,
        })
        .collect();
    let mut rows_data = rows_data.iter();
    for (offset, record) in &records {
        let offset = *offset;
        let members;
        let events: &[EventRecord<'_>] = match record {
            // Headers and tombstones stay (a few bytes each): older runs still hold the
            // deleted session's header, and only its tombstone keeps it deleted.
            Record::SessionHeader { .. }
            | Record::TypeDefinition { .. }
            | Record::Tombstone { .. } => {
                let start = definitions.len();
                record.encode(&mut definitions, run_salt)?;
                clear_checksum(&mut definitions[start..]);
                uncommitted += 1;
                continue;
            }
            Record::Commit { .. } => {
                uncommitted = 0;
                continue;
            }
            Record::Seal { .. } => continue,
            Record::Event(event) => std::slice::from_ref(event),
            Record::Row(row) => {
                let data = rows_data
                    .next()
                    .ok_or_else(|| corrupt(segment, offset, "row entry data missing"))?;
                members = row.member_records(data);
                &members
            }
        };
        uncommitted += 1;
        for event in events {
            if retained
                .get(&event.session)
                .is_some_and(|kept| event.seq >= *kept)
            {
                dropped_events += 1;
                dropped_bytes += (FRAME_HEADER_BYTES + event.payload_bytes()) as u64;
                continue;
            }
            let slot = *slot_of.entry(event.session).or_insert_with(|| {
                sessions.push(SessionEvents {
                    session: event.session,
                    first_seq: event.seq,
                    events: Vec::new(),
                });
                sessions.len() - 1
            });
            let gathered = &mut sessions[slot];
            let expected = gathered.first_seq + widen(gathered.events.len());
            if event.seq != expected {
                return Err(corrupt(
                    segment,
                    offset,
                    "event seq not contiguous in segment",
                ));
            }
            gathered.events.push(*event);
        }
    }
    if !scan.sealed {
        return Err(corrupt(segment, scan.valid_end, "segment is not sealed"));
    }
    if uncommitted != 0 {
        return Err(corrupt(
            segment,
            scan.valid_end,
            "records after the last commit",
        ));
    }
    let entries = sessions
        .iter()
        .map(|session| lay_out_entries(session, run_salt))
        .collect::<Result<Vec<_>>>()?;
    let mut built = assemble(&definitions, &entries, segment, run_id, run_salt)?;
    built.dropped_events = dropped_events;
    built.dropped_bytes = dropped_bytes;
    Ok(built)
}

/// Lays out a session's events as run entries (F-06-31): each stretch [`row_groups`]
/// finds as one row entry, every other event as its event frame; checksum fields zero.
pub(crate) fn lay_out_entries(
    session: &SessionEvents<'_>,
    run_salt: u64,
) -> Result<SessionEntries> {
    let events = &session.events;
    let mut laid_out = SessionEntries {
        session: session.session,
        raw: Vec::new(),
        entries: Vec::new(),
    };
    let mut next = 0usize;
    let end = std::iter::once(events.len()..events.len());
    for group in row_groups(events).into_iter().chain(end) {
        for event in &events[next..group.start] {
            let start = laid_out.raw.len();
            event.encode(&mut laid_out.raw, run_salt)?;
            clear_checksum(&mut laid_out.raw[start..]);
            let bytes = laid_out.raw.len() - start;
            laid_out.entries.push((event.seq, start, bytes, 1));
        }
        if !group.is_empty() {
            let start = laid_out.raw.len();
            encode_row_entry(&events[group.clone()], &mut laid_out.raw)?;
            let count = checked_count_u32(group.len(), "row entry", "events")?;
            let bytes = laid_out.raw.len() - start;
            laid_out
                .entries
                .push((events[group.start].seq, start, bytes, count));
        }
        next = group.end;
    }
    Ok(laid_out)
}

/// Whether a run holds events that `retained` drops (F-06-26).
pub fn holds_dropped_events(index: &RunIndex, retained: &Retained) -> bool {
    index.blocks.iter().any(|block| {
        block.session != DEFINITIONS_SESSION
            && retained
                .get(&block.session)
                .is_some_and(|kept| block.first_seq + u64::from(block.event_count) > *kept)
    })
}

/// Rewrites a run without the events of deleted sessions that `retained` does not keep
/// (F-06-26). The definitions block and every block kept whole are copied as stored; a
/// block cut by a retained prefix is recompressed with its first events.
pub fn rebuild_run(
    reader: &RunReader,
    run_id: u64,
    run_salt: u64,
    retained: &Retained,
) -> Result<BuiltRun> {
    let source = &reader.index;
    let mut writer = BlockWriter {
        // Blocks copied as stored may hold row entries: the source's version stays.
        out: encode_run_header(run_id, run_salt, source.source_segment, source.version),
        blocks: Vec::new(),
        raw_offset: 0,
        compressor: new_compressor()?,
    };
    let (mut moved, mut events, mut dropped_events, mut dropped_bytes) = (Vec::new(), 0, 0, 0);
    for (index, block) in source.blocks.iter().enumerate() {
        let kept = match retained.get(&block.session) {
            Some(kept) => kept
                .saturating_sub(block.first_seq)
                .min(u64::from(block.event_count)),
            None => u64::from(block.event_count),
        };
        let definitions = block.session == DEFINITIONS_SESSION;
        if !definitions && kept == 0 {
            dropped_events += u64::from(block.event_count);
            dropped_bytes += u64::from(block.raw_bytes);
            continue;
        }
        let raw_offset = writer.raw_offset;
        let count = u32::try_from(kept).unwrap_or(block.event_count);
        if definitions || count == block.event_count {
            writer.push_stored(block, &reader.stored_block(index)?);
        } else {
            let raw = reader.block(index, None)?;
            let kept_raw = block_prefix(&raw, count, block, source)?;
            writer.push(block.session, count, block.first_seq, &kept_raw)?;
            dropped_events += u64::from(block.event_count - count);
            dropped_bytes += widen(raw.len().saturating_sub(kept_raw.len()));
        }
        if !definitions {
            let bytes = writer.raw_offset - raw_offset;
            let extent = Extent {
                file: run_id,
                offset: raw_offset,
                bytes,
                count,
            };
            moved.push((block.session, block.first_seq, extent));
            events += kept;
        }
    }
    let mut built = writer.finish(run_id, run_salt, moved, events)?;
    built.dropped_events = dropped_events;
    built.dropped_bytes = dropped_bytes;
    Ok(built)
}

/// The entries of a decompressed event block that hold its first `count` events. A row
/// entry the cut falls inside is kept as its first members' event frames (F-06-26: a
/// retained prefix may end inside a row).
fn block_prefix(raw: &[u8], count: u32, block: &BlockEntry, index: &RunIndex) -> Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut events = 0u32;
    let mut data = Vec::new();
    walk_block(raw, block, index, |offset, frame_bytes, item| {
        if events >= count {
            return Ok(());
        }
        let start = checked_usize(offset - block.raw_offset, "run entry offset")?;
        let frame = &raw[start..start + u32_to_usize(frame_bytes)];
        match item {
            BlockItem::Row(row) if count - events < row.member_count => {
                for member in row.members().take(u32_to_usize(count - events)) {
                    let at = kept.len();
                    row.member_event(&member, &mut data).encode(&mut kept, 0)?;
                    clear_checksum(&mut kept[at..]);
                }
                events = count;
            }
            BlockItem::Row(row) => {
                kept.extend_from_slice(frame);
                events += row.member_count;
            }
            BlockItem::Record(_) => {
                kept.extend_from_slice(frame);
                events += 1;
            }
        }
        Ok(())
    })?;
    Ok(kept)
}

/// Frames in a run carry no checksum of their own (F-06-13): the block's stored checksum
/// and zstd's content checksum cover them, and the four bytes of a per-frame crc32 cost
/// about a fifth of a compressed DSH event.
fn clear_checksum(frame: &mut [u8]) {
    frame[..4].copy_from_slice(&[0; 4]);
}

/// Lays out header, blocks, footer and trailer.
fn assemble(
    definitions: &[u8],
    sessions: &[SessionEntries],
    source_segment: u64,
    run_id: u64,
    run_salt: u64,
) -> Result<BuiltRun> {
    let mut writer = BlockWriter {
        out: encode_run_header(run_id, run_salt, source_segment, version_for(sessions)),
        blocks: Vec::new(),
        raw_offset: 0,
        compressor: new_compressor()?,
    };
    let mut moved = Vec::new();
    let mut events = 0u64;
    writer.push(DEFINITIONS_SESSION, 0, 0, definitions)?;
    for session in sessions {
        let mut start = 0;
        while start < session.entries.len() {
            let block_raw_start = session.entries[start].1;
            let mut end = start + 1;
            while end < session.entries.len()
                && session.entries[end].1 + session.entries[end].2 - block_raw_start
                    <= RUN_BLOCK_RAW_BYTES
            {
                end += 1;
            }
            let last = session.entries[end - 1];
            let raw = &session.raw[block_raw_start..last.1 + last.2];
            let events_in_block: u64 = session.entries[start..end]
                .iter()
                .map(|entry| u64::from(entry.3))
                .sum();
            let count = u32::try_from(events_in_block).map_err(|_| Error::TooLarge {
                what: "run block",
                size: events_in_block,
                limit: u64::from(u32::MAX),
                unit: "events",
            })?;
            moved.push((
                session.session,
                session.entries[start].0,
                Extent {
                    file: run_id,
                    offset: writer.raw_offset,
                    bytes: raw.len() as u64,
                    count,
                },
            ));
            writer.push(session.session, count, session.entries[start].0, raw)?;
            events += u64::from(count);
            start = end;
        }
    }
    writer.finish(run_id, run_salt, moved, events)
}

/// Appends compressed blocks to a run being written, with one zstd context for them all.
struct BlockWriter {
    out: Vec<u8>,
    blocks: Vec<BlockEntry>,
    raw_offset: u64,
    compressor: zstd::bulk::Compressor<'static>,
}

/// A zstd context at the run level with content checksums on (F-06-13).
fn new_compressor() -> Result<zstd::bulk::Compressor<'static>> {
    let mut compressor = zstd::bulk::Compressor::new(RUN_ZSTD_LEVEL)
        .map_err(|error| Error::io("run block compress", error))?;
    compressor
        .include_checksum(true)
        .map_err(|error| Error::io("run block compress", error))?;
    Ok(compressor)
}

impl BlockWriter {
    /// Appends the footer and trailer: the finished run file.
    fn finish(
        self,
        run_id: u64,
        run_salt: u64,
        moved: Vec<(u32, u64, Extent)>,
        events: u64,
    ) -> Result<BuiltRun> {
        let BlockWriter {
            mut out,
            blocks,
            raw_offset,
            ..
        } = self;
        let footer_offset = out.len() as u64;
        let footer_start = out.len();
        for block in &blocks {
            block.encode(&mut out);
        }
        Writer::new(&mut out).u64(footer_offset);
        let block_count = checked_count_u32(blocks.len(), "run", "blocks")?;
        Writer::new(&mut out).u32(block_count);
        let sum = crc32fast::hash(&out[footer_start..]);
        Writer::new(&mut out).u32(sum).bytes(RUN_TRAILER_MAGIC);
        let file_bytes = out.len() as u64;
        Ok(BuiltRun {
            bytes: out,
            entry: RunEntry {
                id: run_id,
                salt: run_salt,
                file_bytes,
            },
            moved,
            events,
            raw_bytes: raw_offset,
            dropped_events: 0,
            dropped_bytes: 0,
        })
    }

    /// Appends a block of another run as it is stored (its checksum already checked):
    /// only its offsets change.
    fn push_stored(&mut self, block: &BlockEntry, stored: &[u8]) {
        self.blocks.push(BlockEntry {
            raw_offset: self.raw_offset,
            file_offset: self.out.len() as u64,
            ..*block
        });
        self.raw_offset += u64::from(block.raw_bytes);
        self.out.extend_from_slice(stored);
    }

    fn push(&mut self, session: u32, event_count: u32, first_seq: u64, raw: &[u8]) -> Result<()> {
        let stored = self
            .compressor
            .compress(raw)
            .map_err(|error| Error::io("run block compress", error))?;
        let raw_bytes = checked_u32(raw.len(), "run block")?;
        let stored_bytes = checked_u32(stored.len(), "run block")?;
        self.blocks.push(BlockEntry {
            session,
            event_count,
            first_seq,
            raw_offset: self.raw_offset,
            raw_bytes,
            stored_checksum: crc32fast::hash(&stored),
            file_offset: self.out.len() as u64,
            stored_bytes,
        });
        self.raw_offset += u64::from(raw_bytes);
        self.out.extend_from_slice(&stored);
        Ok(())
    }
}

/// The version a new run of these entries gets (F-06-33): 2 when it holds a row entry, 1
/// otherwise, so that a store without chunk rows stays readable by earlier builds.
fn version_for(sessions: &[SessionEntries]) -> u32 {
    let holds_rows = sessions
        .iter()
        .any(|session| session.entries.iter().any(|entry| entry.3 > 1));
    match holds_rows {
        true => RUN_VERSION,
        false => RUN_VERSION_WITHOUT_ROWS,
    }
}

/// The 64-byte run header of a run file of format `version`.
pub fn encode_run_header(run_id: u64, salt: u64, source_segment: u64, version: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LENGTH);
    Writer::new(&mut out)
        .bytes(RUN_MAGIC)
        .u32(version)
        .u32(HEADER_BYTES_FIELD)
        .u64(run_id)
        .u64(salt)
        .u64(source_segment);
    out.resize(60, 0);
    let sum = crc32fast::hash(&out);
    Writer::new(&mut out).u32(sum);
    out
}

/// A run's decoded header and footer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIndex {
    pub id: u64,
    /// The file's format version: [`RUN_VERSION_WITHOUT_ROWS`] or [`RUN_VERSION`].
    pub version: u32,
    pub salt: u64,
    pub source_segment: u64,
    pub blocks: Vec<BlockEntry>,
}

impl RunIndex {
    /// Decodes and checks a run's header, trailer and footer (F-06-2, F-06-5) given its
    /// header bytes and its tail (everything from `footer_offset` on is enough; `tail_start`
    /// says where `tail` starts in the file).
    pub fn decode(header: &[u8], tail: &[u8], tail_start: u64, entry: &RunEntry) -> Result<Self> {
        let file = run_path(entry.id);
        let corrupt = |reason: &str| Error::CorruptFile {
            file: file.clone(),
            reason: reason.to_string(),
        };
        let minimum = RUN_HEADER_BYTES + (FOOTER_ENTRY_BYTES + TRAILER_BYTES) as u64;
        if entry.file_bytes < minimum || header.len() < HEADER_LENGTH || &header[..8] != RUN_MAGIC {
            return Err(corrupt("bad magic or shorter than a run"));
        }
        let short = |_| corrupt("bad magic or shorter than a run");
        if crc32fast::hash(&header[..60])
            != u32_at(header, 60, "run header checksum").map_err(short)?
        {
            return Err(corrupt("header checksum mismatch"));
        }
        let mut reader = Reader::at(header, RUN_MAGIC.len());
        let version = reader.u32("run version").map_err(short)?;
        if version != RUN_VERSION && version != RUN_VERSION_WITHOUT_ROWS {
            return Err(Error::UnsupportedVersion {
                file,
                found: version,
                supported: RUN_VERSION,
            });
        }
        let _header_bytes = reader.u32("run header bytes").map_err(short)?;
        let stored_id = reader.u64("run id").map_err(short)?;
        let stored_salt = reader.u64("run salt").map_err(short)?;
        let source_segment = reader.u64("run source segment").map_err(short)?;
        if stored_id != entry.id || stored_salt != entry.salt {
            return Err(corrupt("header id or salt differs from the manifest"));
        }
        if tail_start + tail.len() as u64 != entry.file_bytes || tail.len() < TRAILER_BYTES {
            return Err(corrupt("file length differs from the manifest"));
        }
        let trailer = &tail[tail.len() - TRAILER_BYTES..];
        if &trailer[16..24] != RUN_TRAILER_MAGIC {
            return Err(corrupt("bad trailer magic"));
        }
        let mut trailer_reader = Reader::new(trailer);
        let footer_offset = trailer_reader.u64("run footer offset").map_err(short)?;
        let block_count = u32_to_usize(trailer_reader.u32("run block count").map_err(short)?);
        let footer_checksum = trailer_reader.u32("run footer checksum").map_err(short)?;
        let footer_bytes = (block_count as u64).saturating_mul(FOOTER_ENTRY_BYTES as u64);
        let expected_length = footer_offset
            .checked_add(footer_bytes)
            .and_then(|end| end.checked_add(TRAILER_BYTES as u64));
        if block_count == 0
            || block_count > MAX_RUN_BLOCKS
            || expected_length != Some(entry.file_bytes)
            || footer_offset < tail_start
            || footer_offset < RUN_HEADER_BYTES
        {
            return Err(corrupt("footer does not fit the file"));
        }
        let footer_start = usize::try_from(footer_offset - tail_start)
            .map_err(|_| corrupt("footer larger than memory"))?;
        let checked = &tail[footer_start..tail.len() - 12];
        if crc32fast::hash(checked) != footer_checksum {
            return Err(corrupt("footer checksum mismatch"));
        }
        let mut footer = Reader::new(&checked[..block_count * FOOTER_ENTRY_BYTES]);
        let blocks = (0..block_count)
            .map(|_| BlockEntry::decode(&mut footer))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| corrupt("footer does not fit the file"))?;
        check_block_layout(&blocks, footer_offset).map_err(corrupt)?;
        Ok(RunIndex {
            id: entry.id,
            version,
            salt: entry.salt,
            source_segment,
            blocks,
        })
    }

    /// Reads and checks a run's index from its file.
    pub fn read(file: &dyn StorageFile, entry: &RunEntry) -> Result<Self> {
        let io = |error| Error::io("run read", error);
        let length = file.len().map_err(io)?;
        if length != entry.file_bytes {
            return Err(Error::CorruptFile {
                file: run_path(entry.id),
                reason: "file length differs from the manifest".to_string(),
            });
        }
        let mut header = vec![0; HEADER_LENGTH];
        file.read_exact_at(&mut header, 0).map_err(io)?;
        let mut trailer = [0u8; TRAILER_BYTES];
        file.read_exact_at(&mut trailer, length - TRAILER_BYTES as u64)
            .map_err(io)?;
        let footer_offset = u64_at(&trailer, 0, "run footer offset")
            .map_err(|_| Error::CorruptFile {
                file: run_path(entry.id),
                reason: "trailer shorter than its fields".to_string(),
            })?
            .clamp(RUN_HEADER_BYTES, length - TRAILER_BYTES as u64);
        let tail_length =
            usize::try_from(length - footer_offset).map_err(|_| Error::CorruptFile {
                file: run_path(entry.id),
                reason: "footer larger than memory".to_string(),
            })?;
        let mut tail = vec![0; tail_length];
        file.read_exact_at(&mut tail, footer_offset).map_err(io)?;
        RunIndex::decode(&header, &tail, footer_offset, entry)
    }

    /// Whether the run's event blocks may hold row entries (version 2, F-06-33).
    pub fn holds_rows(&self) -> bool {
        self.version >= RUN_VERSION
    }

    /// The block holding raw offset `offset`.
    pub fn block_at(&self, offset: u64) -> Option<usize> {
        let index = self
            .blocks
            .partition_point(|block| block.raw_end() <= offset);
        (index < self.blocks.len() && self.blocks[index].raw_offset <= offset).then_some(index)
    }
}

fn check_block_layout(
    blocks: &[BlockEntry],
    footer_offset: u64,
) -> std::result::Result<(), &'static str> {
    let mut file_offset = RUN_HEADER_BYTES;
    let mut raw_offset = 0u64;
    for (index, block) in blocks.iter().enumerate() {
        let definitions = block.session == DEFINITIONS_SESSION;
        if definitions != (index == 0) || (definitions && block.event_count != 0) {
            return Err("block 0 and only block 0 holds the definitions");
        }
        if !definitions && block.event_count == 0 {
            return Err("event block without events");
        }
        if block.file_offset != file_offset || block.raw_offset != raw_offset {
            return Err("blocks do not follow each other");
        }
        file_offset += u64::from(block.stored_bytes);
        raw_offset += u64::from(block.raw_bytes);
    }
    if file_offset != footer_offset {
        return Err("last block does not end at the footer");
    }
    Ok(())
}

/// Decompresses and checks one block's stored bytes (F-06-6).
pub fn decode_block(stored: &[u8], block: &BlockEntry, run: u64) -> Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut decompressor = zstd::bulk::Decompressor::new()
        .map_err(|error| Error::io("run block decompressor", error))?;
    decode_block_into(stored, block, run, &mut decompressor, &mut raw)?;
    Ok(raw)
}

/// [`decode_block`] into `raw` (its capacity reused) with a caller's zstd context: a scan
/// over many blocks then touches the same memory for each instead of fresh pages.
pub fn decode_block_into(
    stored: &[u8],
    block: &BlockEntry,
    run: u64,
    decompressor: &mut zstd::bulk::Decompressor<'static>,
    raw: &mut Vec<u8>,
) -> Result<()> {
    let damaged = |reason: &str| run_corrupt(run, block.raw_offset, reason);
    if stored.len() != block.stored_bytes as usize
        || crc32fast::hash(stored) != block.stored_checksum
    {
        return Err(damaged("run block checksum mismatch"));
    }
    raw.clear();
    raw.reserve(block.raw_bytes as usize);
    decompressor
        .decompress_to_buffer(stored, raw)
        .map_err(|_| damaged("run block does not decompress"))?;
    if raw.len() != block.raw_bytes as usize {
        return Err(damaged("run block decompresses to another size"));
    }
    Ok(())
}

/// One entry of a decompressed block: a record's frame, or (version 2) a row entry that
/// stands for several events (F-06-30).
#[derive(Debug, Clone)]
pub enum BlockItem<'a> {
    Record(Record<'a>),
    Row(RowEntry<'a>),
}

/// Decodes one entry's frame of a run: a row entry where `index`'s version allows them
/// (F-06-30, F-06-33), else a record of a known kind (a run has no unknown kinds).
pub fn decode_block_item<'a>(
    frame: &Frame<'a>,
    index: &RunIndex,
) -> std::result::Result<BlockItem<'a>, String> {
    if frame.kind == ROW_ENTRY_KIND && index.holds_rows() {
        return RowEntry::decode(frame.payload)
            .map(BlockItem::Row)
            .map_err(|error| error.0.to_string());
    }
    match Record::decode(frame) {
        Ok(Some(record)) => Ok(BlockItem::Record(record)),
        Ok(None) => Err("unknown record kind in a run".to_string()),
        Err(error) => Err(format!("{error:?}")),
    }
}

/// Walks the entries of a decompressed block, calling `on_item` with each entry's raw
/// offset in the run, its frame size and what it holds. Every frame must be valid (F-06-6,
/// F-06-13, F-06-32).
pub fn walk_block<'a>(
    raw: &'a [u8],
    block: &BlockEntry,
    index: &RunIndex,
    mut on_item: impl FnMut(u64, u32, BlockItem<'a>) -> Result<()>,
) -> Result<()> {
    let run = index.id;
    let mut offset = 0usize;
    while offset < raw.len() {
        let at = block.raw_offset + widen(offset);
        let frame = decode_run_frame(&raw[offset..])
            .map_err(|error| run_corrupt(run, at, &format!("{error:?}")))?;
        let item =
            decode_block_item(&frame, index).map_err(|reason| run_corrupt(run, at, &reason))?;
        let frame_bytes = u32::try_from(frame.total_bytes)
            .map_err(|_| run_corrupt(run, at, "frame larger than 4 GiB"))?;
        debug_assert!(frame.total_bytes >= FRAME_HEADER_BYTES);
        on_item(at, frame_bytes, item)?;
        offset += frame.total_bytes;
    }
    Ok(())
}

/// A byte-bounded LRU cache of decompressed run blocks, shared by all readers of a store.
pub struct BlockCache {
    capacity_bytes: usize,
    state: Mutex<CacheState>,
}

/// A cache key: (run id, block index).
type BlockKey = (u64, usize);

#[derive(Default)]
struct CacheState {
    /// Block bytes and the tick of their last use.
    blocks: HashMap<BlockKey, (Arc<Vec<u8>>, u64)>,
    /// Last-use tick → key, oldest first.
    order: BTreeMap<u64, BlockKey>,
    tick: u64,
    bytes: usize,
}

impl BlockCache {
    /// A cache that holds at most `capacity_bytes` of decompressed blocks.
    pub fn new(capacity_bytes: usize) -> Self {
        BlockCache {
            capacity_bytes,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// The cached block, marked as just used.
    pub fn get(&self, run: u64, block: usize) -> Option<Arc<Vec<u8>>> {
        let mut state = self.state.lock();
        state.tick += 1;
        let tick = state.tick;
        let (bytes, old_tick) = {
            let (bytes, last_use) = state.blocks.get_mut(&(run, block))?;
            let old = *last_use;
            *last_use = tick;
            (bytes.clone(), old)
        };
        state.order.remove(&old_tick);
        state.order.insert(tick, (run, block));
        Some(bytes)
    }

    /// Caches a block, evicting the least recently used ones beyond the capacity. A block
    /// larger than the whole capacity is not kept.
    pub fn insert(&self, run: u64, block: usize, bytes: Arc<Vec<u8>>) {
        if bytes.len() > self.capacity_bytes {
            return;
        }
        let mut state = self.state.lock();
        state.tick += 1;
        let tick = state.tick;
        if let Some((old, old_tick)) = state.blocks.insert((run, block), (bytes.clone(), tick)) {
            state.bytes -= old.len();
            state.order.remove(&old_tick);
        }
        state.bytes += bytes.len();
        state.order.insert(tick, (run, block));
        while state.bytes > self.capacity_bytes {
            let Some((_, key)) = state.order.pop_first() else {
                break;
            };
            if let Some((evicted, _)) = state.blocks.remove(&key) {
                state.bytes -= evicted.len();
            }
        }
    }

    /// Decompressed bytes held now.
    pub fn held_bytes(&self) -> usize {
        self.state.lock().bytes
    }
}

/// One walk's own decompressed block and zstd context ([`RunReader::block_into`]).
#[derive(Default)]
pub struct ScanBuffer {
    held: Option<(BlockKey, Arc<Vec<u8>>)>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
    /// Whether to read ahead once the walk reads a second block (a whole-session scan).
    wants_read_ahead: bool,
    read_ahead: Option<read_ahead::ReadAhead>,
    blocks_decoded: u64,
}

impl ScanBuffer {
    /// A buffer for a scan that reads block after block: from its second block on, a
    /// worker thread decompresses the next block while the scan reads the current one.
    pub fn reading_ahead() -> ScanBuffer {
        ScanBuffer {
            wants_read_ahead: true,
            ..ScanBuffer::default()
        }
    }
}

/// An open run: its index and its bytes (memory-mapped on real files).
pub struct RunReader {
    pub index: RunIndex,
    file: Arc<dyn StorageFile>,
    map: Option<crate::storage::io::MappedFile>,
}

impl RunReader {
    /// Opens a run named by the manifest and checks its header and footer.
    pub fn open(file: Arc<dyn StorageFile>, entry: &RunEntry) -> Result<Self> {
        let index = RunIndex::read(file.as_ref(), entry)?;
        let map = file
            .map_read()
            .map_err(|error| Error::io("run map", error))?;
        Ok(RunReader { index, file, map })
    }

    /// Decompressed block `block`, through `cache` when one is given.
    pub fn block(&self, block: usize, cache: Option<&BlockCache>) -> Result<Arc<Vec<u8>>> {
        if let Some(bytes) = cache.and_then(|cache| cache.get(self.index.id, block)) {
            return Ok(bytes);
        }
        let entry = &self.index.blocks[block];
        let raw =
            Arc::new(self.with_stored(block, |stored| decode_block(stored, entry, self.index.id))?);
        if let Some(cache) = cache {
            cache.insert(self.index.id, block, raw.clone());
        }
        Ok(raw)
    }

    /// Block `block` decompressed into `scan`'s buffer, which it reuses: for walks over
    /// more blocks than one, so that a long scan neither evicts the shared cache nor
    /// allocates (and page-faults) a fresh block per block. A scan made with
    /// [`ScanBuffer::reading_ahead`] takes the block from its read-ahead worker when that
    /// was the one it decompressed, and asks it for the next.
    pub fn block_into(
        self: &Arc<Self>,
        block: usize,
        scan: &mut ScanBuffer,
    ) -> Result<Arc<Vec<u8>>> {
        let key = (self.index.id, block);
        if let Some((held_key, bytes)) = &scan.held {
            if *held_key == key {
                return Ok(bytes.clone());
            }
        }
        // Reuse the buffer unless a caller still holds it.
        let mut spare = match scan.held.take() {
            Some((_, bytes)) => Arc::try_unwrap(bytes).unwrap_or_default(),
            None => Vec::new(),
        };
        let read_ahead = scan.read_ahead.as_mut().and_then(|ahead| ahead.take(key));
        let raw = match read_ahead {
            Some(outcome) => outcome?,
            None => {
                let mut raw = std::mem::take(&mut spare);
                self.decode_into(block, scan, &mut raw)?;
                raw
            }
        };
        scan.blocks_decoded += 1;
        if scan.wants_read_ahead && scan.read_ahead.is_none() && scan.blocks_decoded > 1 {
            scan.read_ahead = read_ahead::ReadAhead::start();
        }
        if let Some(ahead) = &mut scan.read_ahead {
            ahead.ask_next(self, block, spare);
        }
        let bytes = Arc::new(raw);
        scan.held = Some((key, bytes.clone()));
        Ok(bytes)
    }

    /// Decompresses block `block` into `raw` with `scan`'s zstd context.
    fn decode_into(&self, block: usize, scan: &mut ScanBuffer, raw: &mut Vec<u8>) -> Result<()> {
        let entry = &self.index.blocks[block];
        let decompressor = match &mut scan.decompressor {
            Some(decompressor) => decompressor,
            empty => empty.insert(
                zstd::bulk::Decompressor::new()
                    .map_err(|error| Error::io("run block decompressor", error))?,
            ),
        };
        self.with_stored(block, |stored| {
            decode_block_into(stored, entry, self.index.id, decompressor, raw)
        })
    }

    /// Block `block` as stored (compressed), its checksum checked (F-06-6).
    pub fn stored_block(&self, block: usize) -> Result<Vec<u8>> {
        let entry = &self.index.blocks[block];
        self.with_stored(block, |stored| {
            if crc32fast::hash(stored) != entry.stored_checksum {
                return Err(run_corrupt(
                    self.index.id,
                    entry.raw_offset,
                    "run block checksum mismatch",
                ));
            }
            Ok(stored.to_vec())
        })
    }

    /// Calls `use_stored` with block `block`'s stored bytes: from the map when the file is
    /// mapped, else read.
    fn with_stored<T>(
        &self,
        block: usize,
        use_stored: impl FnOnce(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let entry = &self.index.blocks[block];
        let start = entry.file_offset;
        let end = start + u64::from(entry.stored_bytes);
        match &self.map {
            Some(map) => {
                let range = usize::try_from(start).ok().zip(usize::try_from(end).ok());
                match range.and_then(|(from, to)| map.bytes().get(from..to)) {
                    Some(stored) => use_stored(stored),
                    None => Err(run_corrupt(
                        self.index.id,
                        entry.raw_offset,
                        "block past the mapped file",
                    )),
                }
            }
            None => {
                let mut stored = vec![0; entry.stored_bytes as usize];
                self.file
                    .read_exact_at(&mut stored, start)
                    .map_err(|error| Error::io("run read", error))?;
                use_stored(&stored)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::frame::{EventRecord, NO_SEED_PARENT};
    use crate::storage::segment::{encode_header, SEGMENT_HEADER_BYTES};

    /// A sealed segment with two interleaved sessions of `events` events each.
    fn sealed_segment(salt: u64, events: u64) -> Vec<u8> {
        let mut bytes = encode_header(1, salt);
        for session in 0..2u32 {
            Record::SessionHeader {
                session,
                seed_parent: NO_SEED_PARENT,
                seed_length: 0,
                header_json: format!(r#"{{"version":0,"id":"s{session}","createdAt":1}}"#)
                    .as_bytes(),
            }
            .encode(&mut bytes, salt)
            .expect("encode");
        }
        Record::TypeDefinition {
            type_number: 0,
            name: b"note",
        }
        .encode(&mut bytes, salt)
        .expect("encode");
        let data: Vec<String> = (0..events).map(|seq| format!(r#"{{"n":{seq}}}"#)).collect();
        for seq in 0..events {
            for session in 0..2u32 {
                EventRecord {
                    session,
                    seq,
                    time: 5,
                    type_number: 0,
                    flags: 0,
                    data: data[seq as usize].as_bytes(),
                    envelope: b"",
                }
                .encode(&mut bytes, salt)
                .expect("encode");
                Record::Commit {
                    session,
                    first_seq: seq,
                    event_count: 1,
                    durable_offset: SEGMENT_HEADER_BYTES,
                }
                .encode(&mut bytes, salt)
                .expect("encode");
            }
        }
        let used = bytes.len() as u64;
        Record::Seal {
            used_bytes: used,
            durable_offset: used,
        }
        .encode(&mut bytes, salt)
        .expect("encode");
        bytes
    }

    /// A run of several blocks, open, and its bytes (to damage).
    fn multi_block_reader(bytes_of: impl FnOnce(&mut Vec<u8>, &RunIndex)) -> Arc<RunReader> {
        let segment = sealed_segment(7, 30_000);
        let mut built = build_run(&segment, 1, 7, 2, 9, &Retained::new()).expect("built");
        let index =
            RunIndex::decode(&built.bytes[..64], &built.bytes, 0, &built.entry).expect("index");
        bytes_of(&mut built.bytes, &index);
        let file: Arc<dyn StorageFile> =
            Arc::new(crate::storage::io::MemoryFile::new(built.bytes.clone()));
        Arc::new(RunReader::open(file, &built.entry).expect("reader"))
    }

    /// Reading ahead hands out exactly the blocks a plain decode gives, in order, after a
    /// jump back or forward, and twice in a row.
    #[test]
    fn reading_ahead_gives_every_block_as_decoded_in_any_order() {
        let reader = multi_block_reader(|_, _| {});
        let count = reader.index.blocks.len();
        assert!(count > 3, "{count} blocks");
        let mut order: Vec<usize> = (0..count).collect();
        order.extend([2, 0, count - 1, 1, 1, 3, 2]);
        let mut scan = ScanBuffer::reading_ahead();
        for block in order {
            let read = reader.block_into(block, &mut scan).expect("read");
            assert_eq!(
                *read,
                *reader.block(block, None).expect("decode"),
                "block {block}"
            );
        }
        assert!(scan.read_ahead.is_some(), "the worker started");
    }

    /// A block damaged on disk is reported when the scan reaches it, as the scan without
    /// reading ahead reports it, not when the worker decompressed it.
    #[test]
    fn a_damaged_block_read_ahead_fails_when_it_is_reached() {
        let reader = multi_block_reader(|bytes, index| {
            let offset = usize::try_from(index.blocks[2].file_offset).expect("offset");
            bytes[offset + 4] ^= 0x40;
        });
        let mut scan = ScanBuffer::reading_ahead();
        for block in 0..2 {
            reader.block_into(block, &mut scan).expect("intact block");
        }
        let error = reader.block_into(2, &mut scan).expect_err("damaged block");
        assert!(
            matches!(error, Error::CorruptRun { .. }),
            "unexpected error: {error:?}"
        );
        assert!(
            reader.block_into(3, &mut scan).is_ok(),
            "the next block reads"
        );
    }

    #[test]
    fn a_segment_becomes_a_run_whose_index_and_blocks_decode() {
        let segment = sealed_segment(7, 30_000);
        let built = build_run(&segment, 1, 7, 2, 9, &Retained::new()).expect("built");
        assert_eq!(built.events, 60_000);
        let header = &built.bytes[..64];
        let index = RunIndex::decode(header, &built.bytes, 0, &built.entry).expect("index");
        assert!(
            index.blocks.len() > 3,
            "30k events per session need several blocks"
        );
        assert_eq!(index.source_segment, 1);
        let cache = BlockCache::new(1 << 20);
        let file: Arc<dyn StorageFile> =
            Arc::new(crate::storage::io::MemoryFile::new(built.bytes.clone()));
        let reader = RunReader::open(file, &built.entry).expect("reader");
        for (session, seq, position) in built.moved.iter().step_by(997) {
            let block = reader.index.block_at(position.offset).expect("block");
            let raw = reader.block(block, Some(&cache)).expect("raw");
            let start = (position.offset - reader.index.blocks[block].raw_offset) as usize;
            let frame = decode_run_frame(&raw[start..]).expect("frame");
            let Ok(Some(Record::Event(event))) = Record::decode(&frame) else {
                panic!("not an event");
            };
            assert_eq!((event.session, event.seq), (*session, *seq));
        }
        assert!(cache.held_bytes() <= 1 << 20);
    }

    #[test]
    fn any_flip_in_header_or_footer_is_refused() {
        let segment = sealed_segment(7, 20);
        let built = build_run(&segment, 1, 7, 2, 9, &Retained::new()).expect("built");
        let bytes = &built.bytes;
        let footer_offset = index_footer_offset(bytes);
        let checked: Vec<usize> = (0..64).chain(footer_offset..bytes.len()).collect();
        for at in checked {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x20;
            let outcome = RunIndex::decode(&damaged[..64], &damaged, 0, &built.entry);
            assert!(outcome.is_err(), "flip at {at} went unnoticed");
        }
    }

    #[test]
    fn a_flip_inside_a_block_is_corruption_when_read() {
        let segment = sealed_segment(7, 20);
        let built = build_run(&segment, 1, 7, 2, 9, &Retained::new()).expect("built");
        let index =
            RunIndex::decode(&built.bytes[..64], &built.bytes, 0, &built.entry).expect("index");
        let block = index.blocks[1];
        let mut damaged = built.bytes.clone();
        damaged[block.file_offset as usize + 3] ^= 1;
        let stored = &damaged[block.file_offset as usize..][..block.stored_bytes as usize];
        assert!(matches!(
            decode_block(stored, &block, 2),
            Err(Error::CorruptRun { run: 2, .. })
        ));
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let cache = BlockCache::new(1000);
        for block in 0..50 {
            cache.insert(1, block, Arc::new(vec![0; 300]));
            assert!(cache.held_bytes() <= 1000);
        }
        assert!(cache.get(1, 49).is_some());
        assert!(cache.get(1, 0).is_none());
    }

    fn index_footer_offset(bytes: &[u8]) -> usize {
        let trailer = &bytes[bytes.len() - TRAILER_BYTES..];
        usize::try_from(u64_at(trailer, 0, "footer offset").expect("a whole trailer"))
            .expect("fits memory")
    }
}
