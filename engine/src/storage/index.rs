//! The persisted seq index (format-spec/06-runs-and-index.md, F-06-20..23): the catalog
//! as of a prefix of the runs and of the sealed segments, so that an open replays only the
//! files after it. Derived data: a checkpoint that is missing, damaged or does not match the
//! manifest is ignored and the catalog is rebuilt from the log.

use crate::error::{Error, Result};
use crate::storage::catalog::{Catalog, EventIndex, Extent, Seed};
use crate::storage::frame::NO_SEED_PARENT;
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
/// The checkpoint format version this build writes and reads (F-06-21): sparse extents
/// and the list of deleted sessions. Versions 1 and 2 (one frame size per event) are
/// ignored like any other version (F-06-22): the first open rebuilds the index.
pub const CHECKPOINT_VERSION: u32 = 3;
/// Bytes of one encoded extent (F-06-21).
const EXTENT_BYTES: usize = 8 + 8 + 8 + 4;
/// Largest checkpoint this build loads, in bytes (bounds memory on a damaged length).
pub const MAX_CHECKPOINT_BYTES: u64 = 1 << 34;

/// A sealed segment a checkpoint covers, with the end of its data (past its seal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoveredSegment {
    pub id: u64,
    pub salt: u64,
    pub end: u64,
}

/// A decoded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// (id, salt) of the covered runs, a prefix of the manifest's.
    pub runs: Vec<(u64, u64)>,
    pub segments: Vec<CoveredSegment>,
    pub catalog: Catalog,
}

/// Encodes the catalog's sessions that were defined in covered files, each with the prefix
/// of its extents that lies in covered files (runs and segments hold a log prefix, so a
/// session's covered extents are a prefix of its extents).
pub fn encode_checkpoint(
    catalog: &Catalog,
    runs: &[RunEntry],
    segments: &[CoveredSegment],
) -> Vec<u8> {
    let covered: HashSet<u64> = runs
        .iter()
        .map(|run| run.id)
        .chain(segments.iter().map(|segment| segment.id))
        .collect();
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
    out.extend_from_slice(CHECKPOINT_MAGIC);
    put_u32(&mut out, CHECKPOINT_VERSION);
    put_u32(&mut out, 0);
    put_u32(&mut out, count_u32(runs.len()));
    for run in runs {
        put_u64(&mut out, run.id);
        put_u64(&mut out, run.salt);
    }
    put_u32(&mut out, count_u32(segments.len()));
    for segment in segments {
        put_u64(&mut out, segment.id);
        put_u64(&mut out, segment.salt);
        put_u64(&mut out, segment.end);
    }
    let mut types: Vec<(&u32, &String)> = catalog.type_names.iter().collect();
    types.sort();
    put_u32(&mut out, count_u32(types.len()));
    for (number, name) in types {
        put_u32(&mut out, *number);
        put_u32(&mut out, count_u32(name.len()));
        out.extend_from_slice(name.as_bytes());
    }
    put_u32(&mut out, count_u32(deleted.len()));
    for number in &deleted {
        put_u32(&mut out, *number);
    }
    put_u32(&mut out, count_u32(sessions.len()));
    for entry in sessions {
        put_u32(&mut out, entry.number);
        put_u32(
            &mut out,
            entry.seed.map_or(NO_SEED_PARENT, |seed| seed.parent),
        );
        put_u64(&mut out, entry.seed.map_or(0, |seed| seed.length));
        put_u64(&mut out, entry.defined_in.unwrap_or(0));
        put_u32(&mut out, count_u32(entry.header_json.len()));
        out.extend_from_slice(entry.header_json.as_bytes());
        let extents = entry.events.extents();
        let covered_count = extents
            .iter()
            .take_while(|extent| covered.contains(&extent.file))
            .count();
        let covered_extents = &extents[..covered_count];
        let events: u64 = covered_extents
            .iter()
            .map(|extent| u64::from(extent.count))
            .sum();
        put_u64(&mut out, events);
        put_u32(&mut out, count_u32(covered_extents.len()));
        for extent in covered_extents {
            put_u64(&mut out, extent.file);
            put_u64(&mut out, extent.offset);
            put_u64(&mut out, extent.bytes);
            put_u32(&mut out, extent.count);
        }
    }
    let sum = crc32fast::hash(&out);
    put_u32(&mut out, sum);
    out
}

/// Decodes a checkpoint; the error says why it is unusable (it is then ignored, F-06-22).
pub fn decode_checkpoint(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
    if bytes.len() < 16 + 4 || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err("bad magic or too short".to_string());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]) {
        return Err("checksum mismatch".to_string());
    }
    let mut reader = Reader { bytes: body, at: 8 };
    let version = reader.u32()?;
    if version != CHECKPOINT_VERSION || reader.u32()? != 0 {
        return Err(format!("version {version} is not {CHECKPOINT_VERSION}"));
    }
    let run_count = reader.count(16)?;
    let runs = (0..run_count)
        .map(|_| Ok((reader.u64()?, reader.u64()?)))
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let segment_count = reader.count(24)?;
    let segments = (0..segment_count)
        .map(|_| {
            Ok(CoveredSegment {
                id: reader.u64()?,
                salt: reader.u64()?,
                end: reader.u64()?,
            })
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    let mut catalog = Catalog::default();
    for _ in 0..reader.count(8)? {
        let number = reader.u32()?;
        let length = reader.count(1)?;
        catalog.define_type(number, reader.take(length)?)?;
    }
    let mut deleted = HashSet::new();
    for _ in 0..reader.count(4)? {
        deleted.insert(reader.u32()?);
    }
    for _ in 0..reader.count(32)? {
        let number = decode_session(&mut reader, &mut catalog)?;
        // Right after its own restore, before a later session reuses its id.
        if deleted.contains(&number) {
            catalog.delete_session(number)?;
        }
    }
    if reader.at != body.len() {
        return Err("bytes after the last session".to_string());
    }
    catalog.check_seeds()?;
    Ok(Checkpoint {
        runs,
        segments,
        catalog,
    })
}

/// Restores one session; returns its number.
fn decode_session(
    reader: &mut Reader<'_>,
    catalog: &mut Catalog,
) -> std::result::Result<u32, String> {
    let number = reader.u32()?;
    let seed_parent = reader.u32()?;
    let seed_length = reader.u64()?;
    let defined_in = reader.u64()?;
    let header_length = reader.count(1)?;
    let header = reader.take(header_length)?;
    let event_count = reader.u64()?;
    let mut events = EventIndex::default();
    for _ in 0..reader.count(EXTENT_BYTES)? {
        let extent = Extent {
            file: reader.u64()?,
            offset: reader.u64()?,
            bytes: reader.u64()?,
            count: reader.u32()?,
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
    let all_runs = checkpoint.segments.is_empty() || checkpoint.runs.len() == manifest.runs.len();
    if !runs_match || !segments_match || !all_runs {
        return Err("does not match the manifest".to_string());
    }
    Ok(checkpoint)
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

fn count_u32(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

/// Bounds-checked little-endian reads.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, length: usize) -> std::result::Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(length)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| "truncated".to_string())?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let bytes = self.take(8)?;
        let mut word = [0; 8];
        word.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(word))
    }

    /// A count of items of at least `item_bytes` bytes each, checked against what is left.
    fn count(&mut self, item_bytes: usize) -> std::result::Result<usize, String> {
        let count = self.u32()? as usize;
        if count.saturating_mul(item_bytes) > self.bytes.len() - self.at {
            return Err("count larger than the bytes left".to_string());
        }
        Ok(count)
    }
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
        let bytes = encode_checkpoint(&catalog, &runs, &[]);
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
        );
        let loaded = decode_checkpoint(&all).expect("valid");
        assert_eq!(
            loaded.catalog.sessions[&0].events,
            catalog.sessions[&0].events
        );
        assert_eq!(loaded.catalog.sessions[&1].seed, catalog.sessions[&1].seed);
    }

    #[test]
    fn every_flip_makes_the_checkpoint_unusable() {
        let bytes = encode_checkpoint(&sample_catalog(), &[], &[]);
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x04;
            assert!(decode_checkpoint(&damaged).is_err(), "flip at {index}");
        }
    }
}
