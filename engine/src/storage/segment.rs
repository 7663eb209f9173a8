//! Segment files (format-spec/03-segments.md): header, frames, seal, and the scan that
//! tells a torn tail from corruption.

use crate::error::{Error, Result};
use crate::storage::coding::{
    checked_usize, id_file_name, parse_id_file_name, u32_at, Reader, Writer,
};
use crate::storage::frame::{self, decode_frame, FrameError, Kind, Record, FRAME_HEADER_BYTES};
use crate::storage::io::{Storage, StorageFile};
use std::sync::Arc;

/// Directory that holds write-ahead segments.
pub const WAL_DIR: &str = "wal";
/// Bytes of the segment header, as its `header_bytes` field holds them (F-03-1).
const HEADER_BYTES_FIELD: u32 = 64;
/// Bytes of the segment header; frames start here.
pub const SEGMENT_HEADER_BYTES: u64 = HEADER_BYTES_FIELD as u64;
/// [`SEGMENT_HEADER_BYTES`] as an in-memory length.
pub(crate) const HEADER_LENGTH: usize = HEADER_BYTES_FIELD as usize;
const SEGMENT_MAGIC: &[u8; 8] = b"DSHDBSEG";
/// The segment format version this build reads and writes (F-03-2).
pub const SEGMENT_VERSION: u32 = 1;
/// Bytes of a seal frame (header plus its 16-byte payload).
pub const SEAL_FRAME_BYTES: u64 = FRAME_HEADER_BYTES as u64 + 16;

/// Extension of a segment file (`<id as 16 lower-case hex digits>.seg`, F-01-1).
const SEGMENT_EXTENSION: &str = "seg";

/// The path of segment `id`.
pub fn segment_path(id: u64) -> String {
    format!("{WAL_DIR}/{}", id_file_name(id, SEGMENT_EXTENSION))
}

/// Parses a segment file name back to its id.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    parse_id_file_name(name, SEGMENT_EXTENSION)
}

/// Encodes the 64-byte segment header (F-03-1).
pub fn encode_header(id: u64, salt: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LENGTH);
    Writer::new(&mut out)
        .bytes(SEGMENT_MAGIC)
        .u32(SEGMENT_VERSION)
        .u32(HEADER_BYTES_FIELD)
        .u64(id)
        .u64(salt);
    out.resize(60, 0);
    let sum = crc32fast::hash(&out);
    Writer::new(&mut out).u32(sum);
    out
}

/// Checks a segment header against the id and salt the manifest gives.
pub fn check_header(bytes: &[u8], id: u64, salt: u64) -> Result<()> {
    let file = segment_path(id);
    let corrupt = |reason: &str| Error::CorruptFile {
        file: file.clone(),
        reason: reason.to_string(),
    };
    if bytes.len() < HEADER_LENGTH || &bytes[..8] != SEGMENT_MAGIC {
        return Err(corrupt("bad magic or shorter than its header"));
    }
    let short = |_| corrupt("bad magic or shorter than its header");
    if crc32fast::hash(&bytes[..60])
        != u32_at(bytes, 60, "segment header checksum").map_err(short)?
    {
        return Err(corrupt("header checksum mismatch"));
    }
    let mut reader = Reader::at(bytes, SEGMENT_MAGIC.len());
    let version = reader.u32("segment version").map_err(short)?;
    if version != SEGMENT_VERSION {
        return Err(Error::UnsupportedVersion {
            file,
            found: version,
            supported: SEGMENT_VERSION,
        });
    }
    let _header_bytes = reader.u32("segment header bytes").map_err(short)?;
    let stored_id = reader.u64("segment id").map_err(short)?;
    let stored_salt = reader.u64("segment salt").map_err(short)?;
    if stored_id != id || stored_salt != salt {
        return Err(corrupt("header id or salt differs from the manifest"));
    }
    Ok(())
}

pub use crate::limits::PREALLOCATION_RESERVE_BYTES;

/// How many bytes of a segment of `capacity_bytes` to preallocate (F-03-3 step 2): all of
/// it, or, on a disk with less free, what the disk has beyond
/// [`PREALLOCATION_RESERVE_BYTES`] (zero: no preallocation, the file grows as it is
/// written, and a write past the free space fails as "disk full").
pub fn preallocation_bytes(storage: &dyn Storage, capacity_bytes: u64) -> Result<u64> {
    let available = storage
        .available_bytes()
        .map_err(|error| Error::io("free space query", error))?;
    Ok(match available {
        Some(free) => capacity_bytes.min(free.saturating_sub(PREALLOCATION_RESERVE_BYTES)),
        None => capacity_bytes,
    })
}

/// Creates, preallocates (as far as the free space allows) and syncs a new segment file, and
/// syncs its directory (F-03-3). On failure the file is removed again, so a full disk leaves
/// nothing behind.
pub fn create_segment(
    storage: &dyn Storage,
    id: u64,
    salt: u64,
    capacity_bytes: u64,
) -> Result<Arc<dyn StorageFile>> {
    let path = segment_path(id);
    let file = storage
        .open(&path, true)
        .map_err(|error| Error::io("segment create", error))?;
    let prepared = preallocation_bytes(storage, capacity_bytes)
        .and_then(|length| match length {
            0 => Ok(()),
            length => file
                .allocate(length)
                .map_err(|error| Error::io("segment preallocate", error)),
        })
        .and_then(|()| {
            file.write_at(&encode_header(id, salt), 0)
                .map_err(|error| Error::io("segment header write", error))
        })
        .and_then(|()| {
            file.sync_data()
                .map_err(|error| Error::io("segment sync", error))
        })
        .and_then(|()| {
            storage
                .sync_dir(WAL_DIR)
                .map_err(|error| Error::io("directory sync", error))
        });
    if let Err(error) = prepared {
        // Best effort: the manifest does not name this file yet, so a later open removes it
        // anyway if this removal fails too.
        let _ = storage.remove(&path);
        return Err(error);
    }
    Ok(file)
}

/// Reads a whole segment file into memory.
pub fn read_segment(storage: &dyn Storage, id: u64) -> Result<Vec<u8>> {
    let path = segment_path(id);
    let file = storage
        .open_read(&path)
        .map_err(|error| Error::opening_named_file("segment open", &path, error))?;
    file.read_all()
        .map_err(|error| Error::io("segment read", error))
}

/// Where and why a scan stopped before the end of the segment's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub offset: u64,
    pub reason: String,
}

/// The result of scanning one segment's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentScan {
    /// Offset just past the last valid frame (commit, seal or otherwise).
    pub valid_end: u64,
    /// Whether a valid seal frame ends the segment.
    pub sealed: bool,
    /// The first invalid frame, if the scan stopped at one that is not a seal.
    pub stop: Option<Stop>,
}

/// Walks the valid frames of a segment from its header on, calling `on_record` for each with
/// its offset. Stops at the seal, at the first invalid frame, or at the end of the bytes.
pub fn scan_frames<'a>(
    bytes: &'a [u8],
    segment: u64,
    salt: u64,
    on_record: impl FnMut(u64, Record<'a>) -> Result<()>,
) -> Result<SegmentScan> {
    scan_frames_from(bytes, SEGMENT_HEADER_BYTES, segment, salt, on_record)
}

/// [`scan_frames`] from offset `from`, which must be where a frame starts (the end of a
/// commit): a reader that read the segment again continues where its first scan's
/// committed batches ended.
pub fn scan_frames_from<'a>(
    bytes: &'a [u8],
    from: u64,
    segment: u64,
    salt: u64,
    on_record: impl FnMut(u64, Record<'a>) -> Result<()>,
) -> Result<SegmentScan> {
    scan_frames_in(bytes, 0, from, segment, salt, on_record)
}

/// [`scan_frames_from`] over part of a segment: `bytes` are the segment's bytes from file
/// offset `base` on (`base` ≤ `from`), so a process catching up on a few new batches reads
/// those, not the segment from its start (F-08-11). Offsets passed to `on_record` and
/// returned are file offsets.
pub fn scan_frames_in<'a>(
    bytes: &'a [u8],
    base: u64,
    from: u64,
    segment: u64,
    salt: u64,
    mut on_record: impl FnMut(u64, Record<'a>) -> Result<()>,
) -> Result<SegmentScan> {
    let start = from.checked_sub(base).ok_or_else(|| Error::Corrupt {
        segment,
        offset: from,
        reason: format!("a scan from {from} over bytes that start at {base}"),
    })?;
    let mut offset = checked_usize(start, "segment scan offset")?;
    loop {
        let position = base + offset as u64;
        let frame = match decode_frame(&bytes[offset.min(bytes.len())..], salt) {
            Ok(frame) => frame,
            Err(error) => {
                return Ok(SegmentScan {
                    valid_end: position,
                    sealed: false,
                    stop: stop_reason(&error, bytes.len() - offset.min(bytes.len())).map(
                        |reason| Stop {
                            offset: position,
                            reason,
                        },
                    ),
                })
            }
        };
        let record = match Record::decode(&frame) {
            Ok(Some(record)) => record,
            Ok(None) if frame.flags & frame::FLAG_SKIPPABLE != 0 => {
                offset += frame.total_bytes;
                continue;
            }
            Ok(None) => {
                return Err(Error::UnknownRecordKind {
                    segment,
                    offset: position,
                    kind: frame.kind,
                })
            }
            // A frame with a valid checksum but a malformed payload was written that way:
            // that is corruption, never a torn write.
            Err(error) => {
                return Err(Error::Corrupt {
                    segment,
                    offset: position,
                    reason: format!("{error:?}"),
                })
            }
        };
        offset += frame.total_bytes;
        let sealed = matches!(record, Record::Seal { .. });
        on_record(position, record)?;
        if sealed {
            return Ok(SegmentScan {
                valid_end: base + offset as u64,
                sealed: true,
                stop: None,
            });
        }
    }
}

/// `None` when the scan simply reached unwritten space or the end of the file.
fn stop_reason(error: &FrameError, remaining: usize) -> Option<String> {
    match error {
        FrameError::Zero | FrameError::Incomplete if remaining < FRAME_HEADER_BYTES => None,
        FrameError::Zero => None,
        other => Some(format!("{other:?}")),
    }
}

/// Bytes the evidence search skips at once when they are all zero (no frame can start
/// where its kind byte would be zero).
const ZERO_SKIP_BYTES: usize = 64;
/// The larger stretch tried first (a reopen scans tens of MiB of preallocated zeros).
const ZERO_SKIP_PAGE_BYTES: usize = 4096;

/// Whether every byte is zero, a word at a time (the compiler vectorizes the fold).
fn is_all_zero(bytes: &[u8]) -> bool {
    let (words, rest) = bytes.as_chunks::<8>();
    words
        .iter()
        .fold(0u64, |any, word| any | u64::from_ne_bytes(*word))
        == 0
        && rest.iter().all(|byte| *byte == 0)
}

/// Whether any valid commit or seal frame after `damage` proves that the bytes at `damage`
/// had been made durable before it was written (F-05-3). Such a frame's `durable_offset`
/// lies past the damage.
pub fn durable_evidence_after(bytes: &[u8], salt: u64, damage: u64) -> bool {
    // Damage past the bytes (or past memory) has nothing after it.
    let Some(start) = usize::try_from(damage)
        .ok()
        .and_then(|damage| damage.checked_add(1))
        .filter(|start| *start <= bytes.len())
    else {
        return false;
    };
    let mut offset = start;
    while offset + FRAME_HEADER_BYTES <= bytes.len() {
        // A candidate needs a non-zero kind byte at `offset + 8`: skip zero stretches (the
        // preallocated tail) a page, then a chunk, at a time instead of byte by byte.
        let page = &bytes[offset + 8..(offset + 8 + ZERO_SKIP_PAGE_BYTES).min(bytes.len())];
        if page.len() == ZERO_SKIP_PAGE_BYTES && is_all_zero(page) {
            offset += ZERO_SKIP_PAGE_BYTES;
            continue;
        }
        let kinds = &bytes[offset + 8..(offset + 8 + ZERO_SKIP_BYTES).min(bytes.len())];
        if kinds.len() == ZERO_SKIP_BYTES && kinds.iter().fold(0u8, |any, byte| any | byte) == 0 {
            offset += ZERO_SKIP_BYTES;
            continue;
        }
        let kind = bytes[offset + 8];
        let plausible = (kind == Kind::Commit as u8 || kind == Kind::Seal as u8)
            && bytes[offset + 9] & !frame::FLAG_SKIPPABLE == 0
            && bytes[offset + 10] == 0
            && bytes[offset + 11] == 0;
        if plausible {
            if let Ok(frame) = decode_frame(&bytes[offset..], salt) {
                let durable_offset = match Record::decode(&frame) {
                    Ok(Some(Record::Commit { durable_offset, .. }))
                    | Ok(Some(Record::Seal { durable_offset, .. })) => durable_offset,
                    _ => 0,
                };
                if durable_offset > damage {
                    return true;
                }
            }
        }
        offset += 1;
    }
    false
}

/// Whether the segment holds at least one valid frame (used to decide whether an earlier
/// segment's damage lies before data that was written after it was synced).
pub fn has_valid_frame(bytes: &[u8], salt: u64) -> bool {
    let start = HEADER_LENGTH;
    start < bytes.len() && decode_frame(&bytes[start..], salt).is_ok()
}

/// The end of the last non-zero byte at or after `from` (for wiping a torn tail).
pub fn nonzero_end(bytes: &[u8], from: u64) -> u64 {
    let from = usize::try_from(from)
        .unwrap_or(bytes.len())
        .min(bytes.len());
    // Whole zero pages from the end first: the preallocated rest of a segment is long.
    let mut end = bytes.len();
    while end - from >= ZERO_SKIP_PAGE_BYTES && is_all_zero(&bytes[end - ZERO_SKIP_PAGE_BYTES..end])
    {
        end -= ZERO_SKIP_PAGE_BYTES;
    }
    bytes[from..end]
        .iter()
        .rposition(|byte| *byte != 0)
        .map(|index| (from + index + 1) as u64)
        .unwrap_or(from as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scan over the tail of a segment (a catch-up's new bytes) sees the records, offsets
    /// and ends a scan of the whole segment sees from there; a start before the bytes is
    /// refused, not read as other bytes.
    #[test]
    fn a_scan_of_the_new_bytes_only_matches_a_scan_of_the_whole_segment() {
        const SALT: u64 = 0x5a17;
        let mut bytes = vec![0u8; usize::try_from(SEGMENT_HEADER_BYTES).expect("small")];
        for session in 1..=4u32 {
            Record::Tombstone { session }
                .encode(&mut bytes, SALT)
                .expect("encode");
        }
        let used = u64::try_from(bytes.len()).expect("small");
        Record::Seal {
            used_bytes: used,
            durable_offset: used,
        }
        .encode(&mut bytes, SALT)
        .expect("encode");
        let mut whole = Vec::new();
        let whole_scan =
            scan_frames_from(&bytes, SEGMENT_HEADER_BYTES, 7, SALT, |offset, record| {
                whole.push((offset, format!("{record:?}")));
                Ok(())
            })
            .expect("scan");
        for (index, (from, _)) in whole.clone().into_iter().enumerate() {
            let tail = &bytes[usize::try_from(from).expect("small")..];
            let mut seen = Vec::new();
            let scan = scan_frames_in(tail, from, from, 7, SALT, |offset, record| {
                seen.push((offset, format!("{record:?}")));
                Ok(())
            })
            .expect("scan");
            assert_eq!(seen, whole[index..], "from {from}");
            assert_eq!((scan.valid_end, scan.sealed), (whole_scan.valid_end, true));
        }
        let refused = scan_frames_in(&bytes[80..], 80, 64, 7, SALT, |_, _| Ok(()));
        assert!(matches!(
            refused,
            Err(Error::Corrupt {
                segment: 7,
                offset: 64,
                ..
            })
        ));
    }

    #[test]
    fn damage_at_or_past_the_end_has_no_evidence_after_it() {
        let bytes = vec![0u8; 200];
        for damage in [199, 200, 1 << 40, u64::MAX] {
            assert!(!durable_evidence_after(&bytes, 1, damage), "{damage}");
        }
    }

    #[test]
    fn a_header_round_trips_and_a_wrong_salt_is_refused() {
        let header = encode_header(3, 77);
        assert_eq!(header.len() as u64, SEGMENT_HEADER_BYTES);
        check_header(&header, 3, 77).expect("valid header");
        assert!(matches!(
            check_header(&header, 3, 78),
            Err(Error::CorruptFile { .. })
        ));
    }

    #[test]
    fn segment_names_round_trip() {
        let path = segment_path(0xabc);
        let name = path.strip_prefix("wal/").expect("in wal");
        assert_eq!(parse_segment_name(name), Some(0xabc));
        assert_eq!(parse_segment_name("x.seg"), None);
    }
}
