//! The decision table of F-08-9: what the next `WRITE` holder does with the bytes a dead
//! holder announced (`in_progress_end`) but never published.

use super::tail::Tail;
use crate::error::{Error, Result};
use crate::storage::coding::{checked_usize, widen};
use crate::storage::frame::{peek_frame, Record};
use crate::storage::io::StorageFile;
use crate::storage::segment::{nonzero_end, scan_frames_from, SEGMENT_HEADER_BYTES};

/// Scans the announced range of the tail segment from its published end, keeps the whole
/// batches (rows 1–2), zeroes the rest, and returns where appends continue; frames that are
/// valid but malformed, or of an unknown required kind, fail the call (row 3). With
/// `rolling` (the manifest names a later segment) the segment is sealed there too (row 4):
/// synced first, so that the seal's `durable_offset` is true (F-05-3), then the seal and
/// zeros, synced.
pub fn repair_announced_range(file: &dyn StorageFile, tail: &Tail, rolling: bool) -> Result<u64> {
    let start = tail.written_end;
    let length = file
        .len()
        .map_err(|error| Error::io("segment length", error))?;
    let end = if rolling {
        length
    } else {
        tail.in_progress_end.min(length)
    };
    let mut bytes = vec![0; checked_usize(end.max(start), "announced range end")?];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|error| Error::io("segment read", error))?;
    let (committed_end, sealed) = last_whole_batch_end(&bytes, start, tail)?;
    let stale_end = nonzero_end(&bytes, committed_end);
    if !rolling {
        if sealed {
            return Err(Error::Corrupt {
                segment: tail.segment,
                offset: committed_end,
                reason: "a seal in the tail segment with no later segment named".to_string(),
            });
        }
        zero_range(file, committed_end, stale_end)?;
        return Ok(committed_end);
    }
    file.sync_data()
        .map_err(|error| Error::io("segment sync", error))?;
    if !sealed {
        let mut patch = Vec::new();
        Record::Seal {
            used_bytes: committed_end,
            durable_offset: committed_end,
        }
        .encode(&mut patch, tail.salt)?;
        let stale = checked_usize(stale_end.saturating_sub(committed_end), "stale bytes")?;
        if patch.len() < stale {
            patch.resize(stale, 0);
        }
        file.write_at(&patch, committed_end)
            .map_err(|error| Error::io("seal write", error))?;
        file.sync_data()
            .map_err(|error| Error::io("seal sync", error))?;
    }
    Ok(committed_end)
}

/// The end of the last batch ending in a commit at or after `start`, and whether a valid
/// seal follows it directly (the dead holder was rolling).
fn last_whole_batch_end(bytes: &[u8], start: u64, tail: &Tail) -> Result<(u64, bool)> {
    let mut committed_end = start;
    let mut sealed = false;
    let mut after_commit = false;
    scan_frames_from(bytes, start, tail.segment, tail.salt, |offset, record| {
        match record {
            Record::Commit { .. } => {
                committed_end = offset + frame_bytes(bytes, offset)?;
                after_commit = false;
            }
            Record::Seal { used_bytes, .. } if !after_commit && used_bytes == offset => {
                sealed = true;
            }
            Record::Seal { .. } => {
                return Err(Error::Corrupt {
                    segment: tail.segment,
                    offset,
                    reason: "a seal inside an announced batch".to_string(),
                })
            }
            _ => after_commit = true,
        }
        Ok(())
    })?;
    Ok((committed_end, sealed))
}

/// Bytes of the (already validated) frame at `at`.
fn frame_bytes(bytes: &[u8], at: u64) -> Result<u64> {
    let at = checked_usize(at, "frame offset")?;
    let peek = peek_frame(&bytes[at.min(bytes.len())..]).map_err(|error| Error::Corrupt {
        segment: 0,
        offset: widen(at),
        reason: format!("a scanned frame no longer decodes: {error:?}"),
    })?;
    Ok(widen(peek.total_bytes))
}

/// Overwrites `from..to` of `file` with zeros (F-03-4), when there is anything there.
fn zero_range(file: &dyn StorageFile, from: u64, to: u64) -> Result<()> {
    if to > from {
        let zeros = vec![0; checked_usize(to - from, "torn tail bytes")?];
        file.write_at(&zeros, from)
            .map_err(|error| Error::io("torn tail wipe", error))?;
    }
    Ok(())
}

/// Zeroes everything after the header of a segment that no process published a byte of
/// (the new segment of an interrupted roll, F-08-8), and syncs it.
pub fn zero_unpublished(file: &dyn StorageFile) -> Result<()> {
    let bytes = file
        .read_all()
        .map_err(|error| Error::io("segment read", error))?;
    let stale_end = nonzero_end(&bytes, SEGMENT_HEADER_BYTES);
    if stale_end > SEGMENT_HEADER_BYTES {
        zero_range(file, SEGMENT_HEADER_BYTES, stale_end)?;
        file.sync_data()
            .map_err(|error| Error::io("segment sync", error))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::sim::SimStorage;
    use crate::storage::io::Storage;
    use crate::storage::segment::encode_header;

    const SALT: u64 = 0x5eed;

    /// A tail segment: its header, then `body` at offset 64, then `padding` zero bytes.
    fn segment(body: &[u8], padding: usize) -> (SimStorage, std::sync::Arc<dyn StorageFile>) {
        let disk = SimStorage::new();
        let file = disk.open("seg", true).expect("create");
        let mut bytes = encode_header(7, SALT);
        bytes.extend_from_slice(body);
        bytes.resize(bytes.len() + padding, 0);
        file.write_at(&bytes, 0).expect("write");
        (disk, file)
    }

    fn commit() -> Vec<u8> {
        let mut out = Vec::new();
        Record::Commit {
            session: 0,
            first_seq: 0,
            event_count: 0,
            durable_offset: SEGMENT_HEADER_BYTES,
        }
        .encode(&mut out, SALT)
        .expect("encode");
        out
    }

    fn tail(in_progress_end: u64) -> Tail {
        Tail {
            segment: 7,
            salt: SALT,
            written_end: SEGMENT_HEADER_BYTES,
            in_progress_end,
            ..Tail::default()
        }
    }

    #[test]
    fn row_1_nothing_written_keeps_the_published_end() {
        let (_disk, file) = segment(&[], 256);
        let end = repair_announced_range(file.as_ref(), &tail(300), false).expect("repair");
        assert_eq!(end, SEGMENT_HEADER_BYTES);
    }

    #[test]
    fn row_2_whole_batches_stay_and_the_torn_rest_is_zeroed() {
        let whole = commit();
        let mut body = whole.clone();
        body.extend_from_slice(&[0xab; 40]); // a torn second batch
        let (_disk, file) = segment(&body, 64);
        let announced = SEGMENT_HEADER_BYTES + widen(body.len());
        let end = repair_announced_range(file.as_ref(), &tail(announced), false).expect("repair");
        assert_eq!(end, SEGMENT_HEADER_BYTES + widen(whole.len()));
        let bytes = file.read_all().expect("read");
        let rest = &bytes[checked_usize(end, "end").expect("fits")..];
        assert!(rest.iter().all(|byte| *byte == 0), "torn bytes zeroed");
    }

    #[test]
    fn row_3_a_valid_frame_with_a_malformed_payload_is_corruption() {
        // A seal frame whose `used_bytes` is not where it stands, inside an announced batch.
        let mut body = Vec::new();
        Record::Tombstone { session: 3 }
            .encode(&mut body, SALT)
            .expect("encode");
        Record::Seal {
            used_bytes: 1,
            durable_offset: 1,
        }
        .encode(&mut body, SALT)
        .expect("encode");
        let (_disk, file) = segment(&body, 0);
        let announced = SEGMENT_HEADER_BYTES + widen(body.len());
        let outcome = repair_announced_range(file.as_ref(), &tail(announced), false);
        assert!(matches!(outcome, Err(Error::Corrupt { segment: 7, .. })));
    }

    #[test]
    fn row_4_an_interrupted_roll_gets_its_seal() {
        let whole = commit();
        let (_disk, file) = segment(&whole, 0);
        let end = repair_announced_range(file.as_ref(), &tail(u64::MAX), true).expect("repair");
        assert_eq!(end, SEGMENT_HEADER_BYTES + widen(whole.len()));
        let bytes = file.read_all().expect("read");
        let mut sealed = false;
        scan_frames_from(&bytes, end, 7, SALT, |offset, record| {
            sealed |= matches!(record, Record::Seal { used_bytes, .. } if used_bytes == offset);
            Ok(())
        })
        .expect("scan");
        assert!(sealed, "the seal stands at the committed end");
    }

    #[test]
    fn an_unpublished_new_segment_is_zeroed_after_its_header() {
        let (_disk, file) = segment(&[0x11; 30], 10);
        zero_unpublished(file.as_ref()).expect("zero");
        let bytes = file.read_all().expect("read");
        assert!(bytes[64..].iter().all(|byte| *byte == 0));
        check_header_ok(&bytes);
    }

    fn check_header_ok(bytes: &[u8]) {
        crate::storage::segment::check_header(bytes, 7, SALT).expect("header kept");
    }
}
