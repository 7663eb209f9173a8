//! The decision table of F-08-9: what the next `WRITE` holder does with the bytes a dead
//! holder announced (`in_progress_end`) but never published.

use super::tail::Tail;
use crate::error::{Error, Result};
use crate::frame::Record;
use crate::io::StorageFile;
use crate::segment::{nonzero_end, scan_frames_at, SEGMENT_HEADER_BYTES};

/// Scans the announced range of the tail segment from its published end, keeps the whole
/// batches (rows 1–2), and returns where appends continue; frames that are valid but
/// malformed, or of an unknown required kind, fail the call (row 3). With `rolling` (the
/// manifest names a later segment) the segment is sealed there too (row 4): synced first,
/// so that the seal's `durable_offset` is true (F-05-3), then the seal and zeros, synced.
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
    let mut bytes = vec![0; usize::try_from(end.saturating_sub(start)).unwrap_or(0)];
    file.read_exact_at(&mut bytes, start)
        .map_err(|error| Error::io("segment read", error))?;
    let mut committed_end = start;
    let mut sealed_at = None;
    let mut after_commit = false;
    let scan = scan_frames_at(&bytes, start, tail.segment, tail.salt, |offset, record| {
        match record {
            Record::Commit { .. } => {
                committed_end = offset + frame_bytes(&bytes, offset - start);
                after_commit = false;
            }
            Record::Seal { used_bytes, .. } if !after_commit && used_bytes == offset => {
                sealed_at = Some(offset);
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
    let _ = scan;
    let stale_end = nonzero_end(&bytes, committed_end - start) + start;
    if !rolling {
        if sealed_at.is_some() {
            return Err(Error::Corrupt {
                segment: tail.segment,
                offset: committed_end,
                reason: "a seal in the tail segment with no later segment named".to_string(),
            });
        }
        if stale_end > committed_end {
            let zeros = vec![0; (stale_end - committed_end) as usize];
            file.write_at(&zeros, committed_end)
                .map_err(|error| Error::io("torn tail wipe", error))?;
        }
        return Ok(committed_end);
    }
    file.sync_data()
        .map_err(|error| Error::io("segment sync", error))?;
    if sealed_at.is_none() {
        let mut patch = Vec::new();
        Record::Seal {
            used_bytes: committed_end,
            durable_offset: committed_end,
        }
        .encode(&mut patch, tail.salt);
        let stale = stale_end.saturating_sub(committed_end);
        if (patch.len() as u64) < stale {
            patch.resize(stale as usize, 0);
        }
        file.write_at(&patch, committed_end)
            .map_err(|error| Error::io("seal write", error))?;
        file.sync_data()
            .map_err(|error| Error::io("seal sync", error))?;
    }
    Ok(committed_end)
}

/// Bytes of the frame at `at` (its length field plus the header).
fn frame_bytes(bytes: &[u8], at: u64) -> u64 {
    let at = at as usize;
    let mut length = [0u8; 4];
    length.copy_from_slice(&bytes[at + 4..at + 8]);
    crate::frame::FRAME_HEADER_BYTES as u64 + u64::from(u32::from_le_bytes(length))
}

/// Zeroes everything after the header of a segment that no process published a byte of
/// (the new segment of an interrupted roll, F-08-8), and syncs it.
pub fn zero_unpublished(file: &dyn StorageFile) -> Result<()> {
    let bytes = file
        .read_all()
        .map_err(|error| Error::io("segment read", error))?;
    let stale_end = nonzero_end(&bytes, SEGMENT_HEADER_BYTES);
    if stale_end > SEGMENT_HEADER_BYTES {
        let zeros = vec![0; (stale_end - SEGMENT_HEADER_BYTES) as usize];
        file.write_at(&zeros, SEGMENT_HEADER_BYTES)
            .map_err(|error| Error::io("torn tail wipe", error))?;
        file.sync_data()
            .map_err(|error| Error::io("segment sync", error))?;
    }
    Ok(())
}
