//! The manifest (format-spec/04-manifest.md): which segments are live, in log order.
//! Replaced atomically: write `MANIFEST.tmp`, sync it, rename over `MANIFEST`, sync the root.

use crate::error::{Error, Result};
use crate::storage::coding::{checked_count_u32, u32_at, u32_to_usize, widen, Reader, Writer};
use crate::storage::io::Storage;

pub const MANIFEST_FILE: &str = "MANIFEST";
pub const MANIFEST_TEMP_FILE: &str = "MANIFEST.tmp";
const MANIFEST_MAGIC: &[u8; 8] = b"DSHDBMAN";
/// The manifest format version written while the store has no run (F-04-2, F-06-8).
pub const MANIFEST_VERSION: u32 = 1;
/// The manifest format version that adds the run list (F-06-7); written once a run exists.
pub const MANIFEST_VERSION_RUNS: u32 = 2;
/// The manifest format version whose run ids need not increase along the list (F-06-7):
/// written only once a rewritten run (F-06-26) took an older run's place, so that readers
/// that know version 2 only refuse it with a version error rather than call it corrupt.
pub const MANIFEST_VERSION_REWRITTEN_RUNS: u32 = 3;
const FIXED_BYTES: usize = 24;
/// Fixed bytes of a version-2 manifest (run count and a reserved word added).
const FIXED_BYTES_V2: usize = 32;
const ENTRY_BYTES: usize = 16;
/// Bytes of one run entry of a version-2 manifest: id, salt, file length.
const RUN_ENTRY_BYTES: usize = 24;
const CHECKSUM_BYTES: usize = 4;
pub use crate::limits::MAX_RUNS;
pub use crate::limits::MAX_SEGMENTS;

/// One live run file (format-spec/06-runs-and-index.md): id, frame salt and exact length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunEntry {
    pub id: u64,
    pub salt: u64,
    pub file_bytes: u64,
}

/// One live segment: its id and the salt its frames are checksummed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEntry {
    pub id: u64,
    pub salt: u64,
}

/// The decoded manifest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub segments: Vec<SegmentEntry>,
    /// Runs holding the log's prefix, in log order (F-06-9); empty in a version-1 manifest.
    pub runs: Vec<RunEntry>,
    /// The id the next segment will get; every id on disk is below it.
    pub next_segment_id: u64,
}

impl Manifest {
    /// Encodes as version 1 without runs and as version 2 with them (F-06-8). More segments
    /// or runs than a reader accepts ([`MAX_SEGMENTS`], [`MAX_RUNS`]) is `TooLarge`: such a
    /// manifest would make the store unopenable.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let count = checked_count(self.segments.len(), MAX_SEGMENTS, "segments")?;
        let run_count = checked_count(self.runs.len(), MAX_RUNS, "runs")?;
        let mut out = Vec::with_capacity(
            FIXED_BYTES_V2
                + self.segments.len() * ENTRY_BYTES
                + self.runs.len() * RUN_ENTRY_BYTES
                + CHECKSUM_BYTES,
        );
        let version = if self.runs.is_empty() {
            MANIFEST_VERSION
        } else if self.runs.windows(2).all(|pair| pair[0].id < pair[1].id) {
            MANIFEST_VERSION_RUNS
        } else {
            MANIFEST_VERSION_REWRITTEN_RUNS
        };
        let mut writer = Writer::new(&mut out);
        writer
            .bytes(MANIFEST_MAGIC)
            .u32(version)
            .u32(count)
            .u64(self.next_segment_id);
        if !self.runs.is_empty() {
            writer.u32(run_count).u32(0);
        }
        for entry in &self.segments {
            writer.u64(entry.id).u64(entry.salt);
        }
        for run in &self.runs {
            writer.u64(run.id).u64(run.salt).u64(run.file_bytes);
        }
        let sum = crc32fast::hash(&out);
        Writer::new(&mut out).u32(sum);
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        let corrupt = |reason: &str| Error::CorruptFile {
            file: MANIFEST_FILE.to_string(),
            reason: reason.to_string(),
        };
        if bytes.len() < FIXED_BYTES + CHECKSUM_BYTES || &bytes[..8] != MANIFEST_MAGIC {
            return Err(corrupt("bad magic or too short"));
        }
        let short = |_| corrupt("shorter than its fields");
        let (body, stored) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
        if crc32fast::hash(body) != u32_at(stored, 0, "manifest checksum").map_err(short)? {
            return Err(corrupt("checksum mismatch"));
        }
        let mut reader = Reader::at(body, MANIFEST_MAGIC.len());
        let version = reader.u32("manifest version").map_err(short)?;
        let fixed_bytes = match version {
            MANIFEST_VERSION => FIXED_BYTES,
            MANIFEST_VERSION_RUNS | MANIFEST_VERSION_REWRITTEN_RUNS
                if body.len() >= FIXED_BYTES_V2 =>
            {
                FIXED_BYTES_V2
            }
            MANIFEST_VERSION_RUNS | MANIFEST_VERSION_REWRITTEN_RUNS => {
                return Err(corrupt("shorter than its fields"))
            }
            _ => {
                return Err(Error::UnsupportedVersion {
                    file: MANIFEST_FILE.to_string(),
                    found: version,
                    supported: MANIFEST_VERSION_REWRITTEN_RUNS,
                })
            }
        };
        let count = u32_to_usize(reader.u32("manifest segment count").map_err(short)?);
        let next_segment_id = reader.u64("manifest next segment id").map_err(short)?;
        let run_count = if version != MANIFEST_VERSION {
            let run_count = u32_to_usize(reader.u32("manifest run count").map_err(short)?);
            if reader.u32("manifest reserved").map_err(short)? != 0 {
                return Err(corrupt("reserved bytes are not zero"));
            }
            run_count
        } else {
            0
        };
        let runs_valid = version == MANIFEST_VERSION || (1..=MAX_RUNS).contains(&run_count);
        if count > MAX_SEGMENTS
            || !runs_valid
            || body.len() != fixed_bytes + count * ENTRY_BYTES + run_count * RUN_ENTRY_BYTES
        {
            return Err(corrupt("segment or run count does not match the length"));
        }
        let segments = (0..count)
            .map(|_| {
                Ok(SegmentEntry {
                    id: reader.u64("manifest segment id")?,
                    salt: reader.u64("manifest segment salt")?,
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(short)?;
        let runs = (0..run_count)
            .map(|_| {
                Ok(RunEntry {
                    id: reader.u64("manifest run id")?,
                    salt: reader.u64("manifest run salt")?,
                    file_bytes: reader.u64("manifest run file bytes")?,
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(short)?;
        let runs_in_order = if version == MANIFEST_VERSION_REWRITTEN_RUNS {
            let distinct: std::collections::HashSet<u64> = runs.iter().map(|run| run.id).collect();
            distinct.len() == runs.len()
        } else {
            runs.windows(2).all(|pair| pair[0].id < pair[1].id)
        };
        let ascending = segments.windows(2).all(|pair| pair[0].id < pair[1].id) && runs_in_order;
        let below_next = segments.iter().all(|entry| entry.id < next_segment_id)
            && runs.iter().all(|entry| entry.id < next_segment_id);
        if !ascending || !below_next {
            return Err(corrupt("segment or run ids out of order"));
        }
        Ok(Manifest {
            segments,
            runs,
            next_segment_id,
        })
    }

    /// Reads the manifest; `Ok(None)` when there is none.
    pub fn read(storage: &dyn Storage) -> Result<Option<Manifest>> {
        if !storage
            .exists(MANIFEST_FILE)
            .map_err(|error| Error::io("manifest lookup", error))?
        {
            return Ok(None);
        }
        let bytes = storage
            .open_read(MANIFEST_FILE)
            .and_then(|file| file.read_all())
            .map_err(|error| Error::io("manifest read", error))?;
        Manifest::decode(&bytes).map(Some)
    }

    /// Replaces the manifest atomically (F-04-4).
    pub fn write(&self, storage: &dyn Storage) -> Result<()> {
        self.write_reporting_stage(storage)
            .map_err(|failure| failure.error)
    }

    /// Like [`Manifest::write`], but says whether the failure came after the rename, when
    /// the new manifest may or may not be durable and the caller must not undo anything.
    pub fn write_reporting_stage(
        &self,
        storage: &dyn Storage,
    ) -> std::result::Result<(), ManifestWriteFailure> {
        let bytes = self.encode().map_err(|error| ManifestWriteFailure {
            error,
            after_rename: false,
        })?;
        let before = |operation| {
            move |error| ManifestWriteFailure {
                error: Error::io(operation, error),
                after_rename: false,
            }
        };
        if storage
            .exists(MANIFEST_TEMP_FILE)
            .map_err(before("manifest write"))?
        {
            storage
                .remove(MANIFEST_TEMP_FILE)
                .map_err(before("manifest write"))?;
        }
        let file = storage
            .open(MANIFEST_TEMP_FILE, true)
            .map_err(before("manifest write"))?;
        file.write_at(&bytes, 0).map_err(before("manifest write"))?;
        file.sync_data().map_err(before("manifest sync"))?;
        // A failed rename did not happen (rename is atomic), so it still counts as "before".
        storage
            .rename(MANIFEST_TEMP_FILE, MANIFEST_FILE)
            .map_err(before("manifest rename"))?;
        storage.sync_dir("").map_err(|error| ManifestWriteFailure {
            error: Error::io("directory sync", error),
            after_rename: true,
        })
    }
}

/// A count of `unit` as its u32 field, or `TooLarge` when above `limit` (what a reader
/// accepts).
fn checked_count(count: usize, limit: usize, unit: &'static str) -> Result<u32> {
    if count > limit {
        return Err(Error::TooLarge {
            what: "manifest",
            size: widen(count),
            limit: widen(limit),
            unit,
        });
    }
    checked_count_u32(count, "manifest", unit)
}

/// A failed manifest replacement and whether it failed after the rename.
#[derive(Debug)]
pub struct ManifestWriteFailure {
    pub error: Error,
    pub after_rename: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_any_flip_is_refused() {
        let manifest = Manifest {
            segments: vec![
                SegmentEntry { id: 1, salt: 11 },
                SegmentEntry { id: 4, salt: 44 },
            ],
            runs: Vec::new(),
            next_segment_id: 5,
        };
        let bytes = manifest.encode().expect("encode");
        assert_eq!(Manifest::decode(&bytes).expect("valid"), manifest);
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 1;
            assert!(Manifest::decode(&damaged).is_err(), "flip at {index}");
        }
    }
}

#[cfg(test)]
mod run_list_tests {
    use super::*;

    #[test]
    fn a_manifest_with_runs_is_version_2_round_trips_and_any_flip_is_refused() {
        let manifest = Manifest {
            segments: vec![SegmentEntry { id: 9, salt: 99 }],
            runs: vec![
                RunEntry {
                    id: 10,
                    salt: 1,
                    file_bytes: 300,
                },
                RunEntry {
                    id: 11,
                    salt: 2,
                    file_bytes: 400,
                },
            ],
            next_segment_id: 12,
        };
        let bytes = manifest.encode().expect("encode");
        assert_eq!(
            u32_at(&bytes, 8, "version").expect("encoded"),
            MANIFEST_VERSION_RUNS
        );
        assert_eq!(bytes.len(), 36 + 16 + 2 * 24);
        assert_eq!(Manifest::decode(&bytes).expect("valid"), manifest);
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 1;
            assert!(Manifest::decode(&damaged).is_err(), "flip at {index}");
        }
    }

    #[test]
    fn a_rewritten_run_out_of_id_order_makes_version_3_and_duplicate_ids_are_refused() {
        let run = |id| RunEntry {
            id,
            salt: id,
            file_bytes: 300,
        };
        let mut manifest = Manifest {
            segments: vec![SegmentEntry { id: 9, salt: 99 }],
            runs: vec![run(12), run(11)],
            next_segment_id: 13,
        };
        let bytes = manifest.encode().expect("encode");
        assert_eq!(
            u32_at(&bytes, 8, "version").expect("encoded"),
            MANIFEST_VERSION_REWRITTEN_RUNS
        );
        assert_eq!(Manifest::decode(&bytes).expect("valid"), manifest);
        manifest.runs = vec![run(11), run(11)];
        assert!(matches!(
            Manifest::decode(&manifest.encode().expect("encode")),
            Err(Error::CorruptFile { .. })
        ));
    }

    #[test]
    fn a_manifest_a_reader_would_refuse_is_too_large_to_encode() {
        let segments = (0..=MAX_SEGMENTS as u64)
            .map(|id| SegmentEntry { id, salt: 0 })
            .collect::<Vec<_>>();
        let manifest = Manifest {
            next_segment_id: segments.len() as u64,
            segments,
            runs: Vec::new(),
        };
        let outcome = manifest.encode();
        assert!(
            matches!(
                outcome,
                Err(Error::TooLarge { what: "manifest", unit: "segments", size, limit })
                    if size == MAX_SEGMENTS as u64 + 1 && limit == MAX_SEGMENTS as u64
            ),
            "{:?}",
            outcome.map(|bytes| bytes.len())
        );
    }

    #[test]
    fn a_manifest_without_runs_stays_version_1() {
        let manifest = Manifest {
            segments: vec![SegmentEntry { id: 1, salt: 5 }],
            runs: Vec::new(),
            next_segment_id: 2,
        };
        let bytes = manifest.encode().expect("encode");
        assert_eq!(
            u32_at(&bytes, 8, "version").expect("encoded"),
            MANIFEST_VERSION
        );
        assert_eq!(Manifest::decode(&bytes).expect("valid"), manifest);
    }
}
