//! The persisted seq index (format-spec/06-runs-and-index.md, F-06-20..23): the catalog
//! as of a prefix of the runs and of the sealed segments, so that an open replays only the
//! files after it. Derived data: a checkpoint that is missing, damaged or does not match the
//! manifest is ignored and the catalog is rebuilt from the log.

use crate::error::{Error, Result};
use crate::storage::catalog::{Catalog, EventIndex, Extent, Seed};
use crate::storage::coding::{checked_count_u32, u32_at, u32_to_usize, Reader, Writer};
use crate::storage::frame::{decode_frame, Kind, FRAME_HEADER_BYTES, NO_SEED_PARENT};
use crate::storage::io::Storage;
use crate::storage::manifest::{Manifest, RunEntry};
use std::collections::HashSet;

/// Directory of the checkpoint.
pub const INDEX_DIR: &str = "index";
/// The checkpoint file.
pub const CHECKPOINT_FILE: &str = "index/checkpoint";
/// The checkpoint being written (never read).
pub const CHECKPOINT_TEMP_FILE: &str = "index/checkpoint.tmp";
const CHECKPOINT_MAGIC: &[u8; 8] = b"DSHDBIDX";
/// The checkpoint format version of a checkpoint that covers sealed segments only (F-06-21):
/// sparse extents and the list of deleted sessions. Versions 1 and 2 (one frame size per
/// event) are ignored like any other version (F-06-22): the first open rebuilds the index.
pub const CHECKPOINT_VERSION: u32 = 3;
/// The version of a checkpoint that also covers a prefix of the first unsealed segment
/// (F-06-27): version 3 with the open prefix after the segment list. A writer writes it
/// only when it covers such a prefix, so that readers of version 3 keep using the others.
pub const OPEN_PREFIX_CHECKPOINT_VERSION: u32 = 4;
/// Bytes of a commit frame: a header and a 24-byte payload (F-02-13).
pub const COMMIT_FRAME_LENGTH: usize = FRAME_HEADER_BYTES + 24;
/// [`COMMIT_FRAME_LENGTH`] as a file offset.
pub const COMMIT_FRAME_BYTES: u64 = COMMIT_FRAME_LENGTH as u64;
/// Bytes of one encoded extent (F-06-21).
const EXTENT_BYTES: usize = 8 + 8 + 8 + 4;
pub use crate::limits::MAX_INDEX_CHECKPOINT_BYTES as MAX_CHECKPOINT_BYTES;

/// A sealed segment a checkpoint covers, with the end of its data (past its seal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoveredSegment {
    pub id: u64,
    pub salt: u64,
    pub end: u64,
}

/// The prefix `0 .. end` of the first unsealed segment a checkpoint covers (F-06-27): `end`
/// is the end of a durable commit frame whose stored checksum is `commit_checksum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenPrefix {
    pub id: u64,
    pub salt: u64,
    pub end: u64,
    pub commit_checksum: u32,
}

/// A decoded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// (id, salt) of the covered runs, a prefix of the manifest's.
    pub runs: Vec<(u64, u64)>,
    /// Covered sealed segments, a prefix of the manifest's.
    pub segments: Vec<CoveredSegment>,
    /// The covered prefix of the segment after them (version 4 only).
    pub open: Option<OpenPrefix>,
    pub catalog: Catalog,
}

/// Encodes the catalog's sessions that were defined in covered files, each with the prefix
/// of its extents that lies in covered files (runs and segments hold a log prefix, so a
/// session's covered extents are a prefix of its extents).
/// With `open`, the prefix of the next segment is covered too (version 4, F-06-27); the
/// caller guarantees the catalog holds exactly the batches below its end there.
pub fn encode_checkpoint(
    catalog: &Catalog,
    runs: &[RunEntry],
    segments: &[CoveredSegment],
    open: Option<OpenPrefix>,
) -> Result<Vec<u8>> {
    let open_segment = open.map(|prefix| (prefix.id, prefix.end));
    let body = encode_catalog(catalog, runs, segments, open_segment)?;
    assemble_checkpoint(runs, segments, open, &body)
}

/// The part of a checkpoint after its file list: types, deletions and sessions as of the
/// covered files (`open_segment`: the id and covered end of the open segment). Split from
/// [`assemble_checkpoint`] so that a writer can encode it under the catalog's lock and learn
/// the open prefix's commit checksum afterwards.
pub fn encode_catalog(
    catalog: &Catalog,
    runs: &[RunEntry],
    segments: &[CoveredSegment],
    open_segment: Option<(u64, u64)>,
) -> Result<Vec<u8>> {
    let covered: HashSet<u64> = runs
        .iter()
        .map(|run| run.id)
        .chain(segments.iter().map(|segment| segment.id))
        .chain(open_segment.iter().map(|(id, _)| *id))
        .collect();
    // An extent of the open segment counts only if it ends inside the covered prefix.
    let is_covered = |extent: &Extent| {
        covered.contains(&extent.file)
            && open_segment.is_none_or(|(id, end)| extent.file != id || extent.end() <= end)
    };
    let mut sessions: Vec<_> = catalog
        .sessions
        .values()
        .filter(|entry| entry.defined_in.is_some_and(|file| covered.contains(&file)))
        .collect();
    sessions.sort_by_key(|entry| entry.number);
    let deleted: Vec<u32> = sessions
        .iter()
        .filter(|entry| entry.deleted)
        .map(|entry| entry.number)
        .collect();
    let mut out = Vec::new();
    let mut writer = Writer::new(&mut out);
    let mut types: Vec<(&u32, &String)> = catalog.type_names.iter().collect();
    types.sort();
    writer.u32(count_u32(types.len())?);
    for (number, name) in types {
        writer.u32(*number);
        writer.u32(count_u32(name.len())?);
        writer.bytes(name.as_bytes());
    }
    writer.u32(count_u32(deleted.len())?);
    for number in &deleted {
        writer.u32(*number);
    }
    writer.u32(count_u32(sessions.len())?);
    for entry in sessions {
        writer.u32(entry.number);
        writer.u32(entry.seed.map_or(NO_SEED_PARENT, |seed| seed.parent));
        writer.u64(entry.seed.map_or(0, |seed| seed.length));
        writer.u64(entry.defined_in.unwrap_or(0));
        writer.u32(count_u32(entry.header_json.len())?);
        writer.bytes(entry.header_json.as_bytes());
        let extents = entry.events.extents();
        let covered_count = extents
            .iter()
            .take_while(|extent| is_covered(extent))
            .count();
        let covered_extents = &extents[..covered_count];
        let events: u64 = covered_extents
            .iter()
            .map(|extent| u64::from(extent.count))
            .sum();
        writer.u64(events);
        writer.u32(count_u32(covered_extents.len())?);
        for extent in covered_extents {
            writer.u64(extent.file);
            writer.u64(extent.offset);
            writer.u64(extent.bytes);
            writer.u32(extent.count);
        }
    }
    Ok(out)
}

/// The whole checkpoint file: magic, version (4 with an open prefix, else 3), the covered
/// files, `catalog_bytes` from [`encode_catalog`] and the checksum.
pub fn assemble_checkpoint(
    runs: &[RunEntry],
    segments: &[CoveredSegment],
    open: Option<OpenPrefix>,
    catalog_bytes: &[u8],
) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(catalog_bytes.len() + 64);
    let mut writer = Writer::new(&mut out);
    writer.bytes(CHECKPOINT_MAGIC);
    writer.u32(if open.is_some() {
        OPEN_PREFIX_CHECKPOINT_VERSION
    } else {
        CHECKPOINT_VERSION
    });
    writer.u32(0);
    writer.u32(count_u32(runs.len())?);
    for run in runs {
        writer.u64(run.id);
        writer.u64(run.salt);
    }
    writer.u32(count_u32(segments.len())?);
    for segment in segments {
        writer.u64(segment.id);
        writer.u64(segment.salt);
        writer.u64(segment.end);
    }
    if let Some(prefix) = open {
        writer.u64(prefix.id);
        writer.u64(prefix.salt);
        writer.u64(prefix.end);
        writer.u32(prefix.commit_checksum);
        writer.u32(0);
    }
    writer.bytes(catalog_bytes);
    let sum = crc32fast::hash(&out);
    Writer::new(&mut out).u32(sum);
    Ok(out)
}

/// Decodes a checkpoint; the error says why it is unusable (it is then ignored, F-06-22).
pub fn decode_checkpoint(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    if bytes.len() < 16 + 4 || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err("bad magic or too short".to_string());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32_at(sum, 0, "checkpoint checksum")? {
        return Err("checksum mismatch".to_string());
    }
    let mut reader = Reader::at(body, CHECKPOINT_MAGIC.len());
    let version = reader.u32("checkpoint version")?;
    let known = version == CHECKPOINT_VERSION || version == OPEN_PREFIX_CHECKPOINT_VERSION;
    if !known || reader.u32("checkpoint reserved")? != 0 {
        return Err(format!(
            "version {version} is neither {CHECKPOINT_VERSION} nor \
             {OPEN_PREFIX_CHECKPOINT_VERSION}"
        ));
    }
    let run_count = count(&mut reader, 16, "run count")?;
    let runs = (0..run_count)
        .map(|_| Ok((reader.u64("run id")?, reader.u64("run salt")?)))
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let segment_count = count(&mut reader, 24, "segment count")?;
    let segments = (0..segment_count)
        .map(|_| {
            Ok(CoveredSegment {
                id: reader.u64("segment id")?,
                salt: reader.u64("segment salt")?,
                end: reader.u64("segment end")?,
            })
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let open = if version == OPEN_PREFIX_CHECKPOINT_VERSION {
        Some(decode_open_prefix(&mut reader)?)
    } else {
        None
    };
    let mut catalog = Catalog::default();
    for _ in 0..count(&mut reader, 8, "type count")? {
        let number = reader.u32("type number")?;
        let length = count(&mut reader, 1, "type name length")?;
        catalog.define_type(number, reader.bytes(length, "type name")?)?;
    }
    let mut deleted = HashSet::new();
    for _ in 0..count(&mut reader, 4, "deleted session count")? {
        deleted.insert(reader.u32("deleted session")?);
    }
    for _ in 0..count(&mut reader, 32, "session count")? {
        let number = decode_session(&mut reader, &mut catalog)?;
        // Right after its own restore, before a later session reuses its id.
        if deleted.contains(&number) {
            catalog.delete_session(number)?;
        }
    }
    if !reader.is_at_end() {
        return Err("bytes after the last session".to_string());
    }
    catalog.check_seeds()?;
    Ok(Checkpoint {
        runs,
        segments,
        open,
        catalog,
    })
}

/// The open prefix of a version-4 checkpoint (F-06-27).
fn decode_open_prefix(reader: &mut Reader<'_>) -> std::result::Result<OpenPrefix, String> {
    let prefix = OpenPrefix {
        id: reader.u64("open segment id")?,
        salt: reader.u64("open segment salt")?,
        end: reader.u64("open segment end")?,
        commit_checksum: reader.u32("open segment commit checksum")?,
    };
    if reader.u32("open segment reserved")? != 0 {
        return Err("open segment reserved field is not zero".to_string());
    }
    if prefix.end < crate::storage::segment::SEGMENT_HEADER_BYTES + COMMIT_FRAME_BYTES {
        return Err("open segment end before its first commit".to_string());
    }
    Ok(prefix)
}

/// Restores one session; returns its number.
fn decode_session(
    reader: &mut Reader<'_>,
    catalog: &mut Catalog,
) -> std::result::Result<u32, String> {
    let number = reader.u32("session number")?;
    let seed_parent = reader.u32("session seed parent")?;
    let seed_length = reader.u64("session seed length")?;
    let defined_in = reader.u64("session defined in")?;
    let header_length = count(reader, 1, "session header length")?;
    let header = reader.bytes(header_length, "session header")?;
    let event_count = reader.u64("session event count")?;
    let mut events = EventIndex::default();
    for _ in 0..count(reader, EXTENT_BYTES, "extent count")? {
        let extent = Extent {
            file: reader.u64("extent file")?,
            offset: reader.u64("extent offset")?,
            bytes: reader.u64("extent bytes")?,
            count: reader.u32("extent event count")?,
        };
        if extent.count == 0 || extent.offset.checked_add(extent.bytes).is_none() {
            return Err("an empty or overflowing extent".to_string());
        }
        events.push_extent(extent);
    }
    if events.len() != event_count {
        return Err("extents hold another number of events".to_string());
    }
    let seed = (seed_parent != NO_SEED_PARENT).then_some(Seed {
        parent: seed_parent,
        length: seed_length,
    });
    catalog.restore_session(number, seed, header, defined_in, events)?;
    Ok(number)
}

/// Reads the checkpoint and checks it against the manifest (F-06-21). `Err` carries the
/// reason it is ignored; a missing checkpoint is `Err` too.
pub fn load_checkpoint(
    storage: &dyn Storage,
    manifest: &Manifest,
) -> std::result::Result<Checkpoint, String> {
    let file = storage
        .open_read(CHECKPOINT_FILE)
        .map_err(|error| format!("cannot open: {error}"))?;
    let length = file
        .len()
        .map_err(|error| format!("cannot read: {error}"))?;
    if length > MAX_CHECKPOINT_BYTES {
        return Err("larger than the limit".to_string());
    }
    let bytes = file
        .read_all()
        .map_err(|error| format!("cannot read: {error}"))?;
    let checkpoint = decode_checkpoint(&bytes)?;
    let runs_match = checkpoint.runs.len() <= manifest.runs.len()
        && checkpoint
            .runs
            .iter()
            .zip(&manifest.runs)
            .all(|(covered, run)| *covered == (run.id, run.salt));
    let segments_match = checkpoint.segments.len() <= manifest.segments.len()
        && checkpoint
            .segments
            .iter()
            .zip(&manifest.segments)
            .all(|(covered, segment)| (covered.id, covered.salt) == (segment.id, segment.salt));
    let covers_segments = !checkpoint.segments.is_empty() || checkpoint.open.is_some();
    let all_runs = !covers_segments || checkpoint.runs.len() == manifest.runs.len();
    let open_matches = checkpoint.open.is_none_or(|prefix| {
        manifest
            .segments
            .get(checkpoint.segments.len())
            .is_some_and(|segment| (segment.id, segment.salt) == (prefix.id, prefix.salt))
    });
    if !runs_match || !segments_match || !all_runs || !open_matches {
        return Err("does not match the manifest".to_string());
    }
    // The open prefix's frame check (F-06-28) is recovery's: what a failed one means
    // depends on what the log holds.
    Ok(checkpoint)
}

/// F-06-28: the open prefix is trusted only if the segment still holds, ending at the
/// recorded end, the commit frame the checkpoint saw (valid under the segment's salt, with
/// the recorded checksum). One read of 28 bytes.
pub fn check_open_prefix(
    storage: &dyn Storage,
    prefix: &OpenPrefix,
) -> std::result::Result<(), String> {
    let file = storage
        .open_read(&crate::storage::segment::segment_path(prefix.id))
        .map_err(|error| format!("open segment {}: cannot open: {error}", prefix.id))?;
    let mut frame = [0u8; COMMIT_FRAME_LENGTH];
    let start = prefix.end - COMMIT_FRAME_BYTES;
    file.read_exact_at(&mut frame, start).map_err(|error| {
        format!(
            "open segment {}: no commit frame ends at offset {}: {error}",
            prefix.id, prefix.end
        )
    })?;
    let stale = || {
        format!(
            "open segment {}: the commit frame ending at offset {} is not the one recorded",
            prefix.id, prefix.end
        )
    };
    let decoded = decode_frame(&frame, prefix.salt).map_err(|_| stale())?;
    let stored_checksum = u32_at(&frame, 0, "frame checksum").map_err(|_| stale())?;
    if decoded.kind != Kind::Commit as u8
        || decoded.total_bytes != frame.len()
        || stored_checksum != prefix.commit_checksum
    {
        return Err(stale());
    }
    Ok(())
}

/// Writes a checkpoint atomically (F-06-20).
pub fn write_checkpoint(storage: &dyn Storage, bytes: &[u8]) -> Result<()> {
    let io = |operation| move |error| Error::io(operation, error);
    storage
        .create_dir(INDEX_DIR)
        .map_err(io("checkpoint directory"))?;
    if storage
        .exists(CHECKPOINT_TEMP_FILE)
        .map_err(io("checkpoint write"))?
    {
        storage
            .remove(CHECKPOINT_TEMP_FILE)
            .map_err(io("checkpoint write"))?;
    }
    let file = storage
        .open(CHECKPOINT_TEMP_FILE, true)
        .map_err(io("checkpoint write"))?;
    file.write_at(bytes, 0).map_err(io("checkpoint write"))?;
    file.sync_data().map_err(io("checkpoint sync"))?;
    storage
        .rename(CHECKPOINT_TEMP_FILE, CHECKPOINT_FILE)
        .map_err(io("checkpoint rename"))?;
    storage
        .sync_dir(INDEX_DIR)
        .map_err(io("checkpoint directory sync"))
}

/// A count of entries (or a name's or header's length) as its u32 field; one that does not
/// fit is `TooLarge`.
fn count_u32(count: usize) -> Result<u32> {
    checked_count_u32(count, "index checkpoint", "entries or bytes")
}

/// A `u32` count of items of at least `item_bytes` bytes each, checked against the bytes
/// left (a damaged count cannot make the decoder allocate more than the file holds).
fn count(
    reader: &mut Reader<'_>,
    item_bytes: usize,
    field: &'static str,
) -> std::result::Result<usize, String> {
    let count = u32_to_usize(reader.u32(field)?);
    if count.saturating_mul(item_bytes) > reader.remaining() {
        return Err(format!("{field} larger than the bytes left"));
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::catalog::Position;

    fn sample_catalog() -> Catalog {
        let mut catalog = Catalog::default();
        catalog.define_type(0, b"note").expect("type");
        catalog
            .define_session(0, None, br#"{"version":0,"id":"a","createdAt":1}"#, 5, true)
            .expect("session");
        for seq in 0..10u64 {
            let position = Position {
                segment: if seq < 6 { 5 } else { 9 },
                offset: if seq < 6 {
                    seq * 40
                } else {
                    64 + (seq - 6) * 40
                },
                frame_bytes: 40,
            };
            catalog.push_event(0, seq, position).expect("event");
        }
        catalog
            .define_session(
                1,
                Some(Seed {
                    parent: 0,
                    length: 3,
                }),
                br#"{"version":0,"id":"b","createdAt":1}"#,
                9,
                true,
            )
            .expect("fork");
        catalog
    }

    #[test]
    fn a_checkpoint_keeps_only_covered_files_and_round_trips() {
        let catalog = sample_catalog();
        let runs = [RunEntry {
            id: 5,
            salt: 55,
            file_bytes: 1000,
        }];
        let bytes = encode_checkpoint(&catalog, &runs, &[], None).expect("encode");
        let loaded = decode_checkpoint(&bytes).expect("valid");
        assert_eq!(loaded.runs, vec![(5, 55)]);
        let session = &loaded.catalog.sessions[&0];
        assert_eq!(session.length(), 6);
        assert_eq!(
            session.events.extents(),
            &catalog.sessions[&0].events.extents()[..1]
        );
        assert!(
            !loaded.catalog.sessions.contains_key(&1),
            "defined in an uncovered file"
        );
        let all = encode_checkpoint(
            &catalog,
            &runs,
            &[CoveredSegment {
                id: 9,
                salt: 99,
                end: 500,
            }],
            None,
        )
        .expect("encode");
        let loaded = decode_checkpoint(&all).expect("valid");
        assert_eq!(
            loaded.catalog.sessions[&0].events,
            catalog.sessions[&0].events
        );
        assert_eq!(loaded.catalog.sessions[&1].seed, catalog.sessions[&1].seed);
    }

    #[test]
    fn every_flip_makes_the_checkpoint_unusable() {
        let bytes = encode_checkpoint(&sample_catalog(), &[], &[], None).expect("encode");
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x04;
            assert!(decode_checkpoint(&damaged).is_err(), "flip at {index}");
        }
    }
}
