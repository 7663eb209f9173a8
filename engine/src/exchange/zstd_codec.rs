//! `session.jsonl.zstd` (persistence §2.7, §5.3): concatenated zstd frames, frame 1 = the
//! header line, every later frame = one durable append batch.

use super::{export_lines, import_scanned, scan, ExchangeError, ImportReport, Result};
use crate::store::Store;
use std::io::Read;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// DSH compresses with Node's default zstd level.
const LEVEL: i32 = 3;

fn refused(text: String) -> ExchangeError {
    ExchangeError::Refused(text)
}

/// The decompressed plaintext of a zstd session file.
struct Decoded {
    plaintext: Vec<u8>,
    /// Plaintext offsets where frames 2.. start.
    frame_starts: Vec<usize>,
    /// Plaintext length covered by complete frames.
    complete_end: usize,
    complete_frames: u64,
    /// Byte offset of a torn final frame in the file.
    torn_start: Option<usize>,
}

fn decode_frames(bytes: &[u8]) -> Result<Decoded> {
    let mut decoded = Decoded {
        plaintext: Vec::new(),
        frame_starts: Vec::new(),
        complete_end: 0,
        complete_frames: 0,
        torn_start: None,
    };
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() >= 4 && rest[..4] != ZSTD_MAGIC {
            return Err(refused(format!(
                "corrupt Zstandard session log: invalid frame magic at byte {at}"
            )));
        }
        let size = match zstd::zstd_safe::find_frame_compressed_size(rest) {
            Ok(size) if size <= rest.len() => size,
            _ => {
                // Torn final frame: recover what a flushing decoder yields, errors ignored.
                decoded.torn_start = Some(at);
                let mut partial = Vec::new();
                if let Ok(mut decoder) = zstd::stream::read::Decoder::with_buffer(rest) {
                    let _ = decoder.read_to_end(&mut partial);
                }
                if decoded.complete_frames > 0 {
                    decoded.frame_starts.push(decoded.plaintext.len());
                }
                decoded.plaintext.extend_from_slice(&partial);
                break;
            }
        };
        let frame = zstd::stream::decode_all(&rest[..size]).map_err(|_| {
            refused(format!(
                "corrupt Zstandard session log: frame at byte {at} failed validation"
            ))
        })?;
        if decoded.complete_frames == 0 {
            let newline = frame.iter().position(|byte| *byte == b'\n');
            if newline != Some(frame.len().wrapping_sub(1)) {
                return Err(refused(
                    "corrupt Zstandard session log: first frame is not exactly one header line"
                        .to_owned(),
                ));
            }
        } else {
            decoded.frame_starts.push(decoded.plaintext.len());
        }
        decoded.plaintext.extend_from_slice(&frame);
        decoded.complete_end = decoded.plaintext.len();
        decoded.complete_frames += 1;
        at += size;
    }
    if decoded.complete_frames == 0 {
        return Err(refused(
            "empty or header-less Zstandard session log".to_owned(),
        ));
    }
    Ok(decoded)
}

/// Imports a DSH `session.jsonl.zstd`. The first event of each frame after the header frame
/// is flagged as a batch start, so export reproduces the frame boundaries.
pub fn import_dsh_jsonl_zstd(store: &Store, bytes: &[u8]) -> Result<ImportReport> {
    let decoded = decode_frames(bytes)?;
    let scanned = scan::scan(&decoded.plaintext)?;
    if scanned.committed < decoded.complete_end {
        return Err(refused(
            "corrupt Zstandard session log: complete frame contains a torn JSONL record".to_owned(),
        ));
    }
    let mut report = import_scanned(
        store,
        &scanned,
        &decoded.frame_starts,
        decoded.complete_frames,
    )?;
    if let (Some(tail), Some(torn_start)) = (report.dropped.as_mut(), decoded.torn_start) {
        tail.reason = format!("{} (torn zstd frame at byte {torn_start})", tail.reason);
    }
    Ok(report)
}

fn compress(compressor: &mut zstd::bulk::Compressor<'_>, plain: &[u8]) -> Result<Vec<u8>> {
    compressor
        .compress(plain)
        .map_err(|error| ExchangeError::Compress(error.to_string()))
}

/// Exports a session as `session.jsonl.zstd`: frame 1 = the header line, then one frame per
/// recorded batch (a new frame at each batch-start event; all events in one frame when none
/// is recorded). Level 3, content checksums on.
pub fn export_dsh_jsonl_zstd(store: &Store, id: &str) -> Result<Vec<u8>> {
    let (header, lines) = export_lines(store, id)?;
    let mut compressor = zstd::bulk::Compressor::new(LEVEL)
        .map_err(|error| ExchangeError::Compress(error.to_string()))?;
    compressor
        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .map_err(|error| ExchangeError::Compress(error.to_string()))?;
    let mut out = compress(&mut compressor, format!("{header}\n").as_bytes())?;
    let mut frame: Vec<u8> = Vec::new();
    for (line, batch_start) in lines {
        if batch_start && !frame.is_empty() {
            out.extend(compress(&mut compressor, &frame)?);
            frame.clear();
        }
        frame.extend_from_slice(&line);
        frame.push(b'\n');
    }
    if !frame.is_empty() {
        out.extend(compress(&mut compressor, &frame)?);
    }
    Ok(out)
}
