//! `session.jsonl.zstd` (persistence §2.7, §5.3): concatenated zstd frames, frame 1 = the
//! header line, every later frame = one durable append batch.

use super::bounded::{decode_frame, FrameEnd, ImportLimits, LineGuard};
use super::{
    header_line, import_scanned, scan, visit_dsh_lines, DroppedTail, ExchangeError, ImportReport,
    Result, TornFrame,
};
use crate::store::Store;
use std::io::Write;

/// Plaintext bytes after which the export of a session with no recorded batch starts a new
/// zstd frame (8 MiB: DSH's reader then holds one such frame at a time).
pub const UNMARKED_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// Zstandard frame magic (`28 B5 2F FD`): an input starting so is `.jsonl.zstd`.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
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
    /// A torn final frame: where it starts in the file and how long it is there.
    torn: Option<(usize, usize)>,
}

fn frame_failed(at: usize) -> ExchangeError {
    refused(format!(
        "corrupt Zstandard session log: frame at byte {at} failed validation"
    ))
}

/// Walks the frames of a zstd session file, decoding each within `limits`.
fn decode_frames(bytes: &[u8], limits: &ImportLimits) -> Result<Decoded> {
    let mut decoded = Decoded {
        plaintext: Vec::new(),
        frame_starts: Vec::new(),
        complete_end: 0,
        complete_frames: 0,
        torn: None,
    };
    let mut guard = LineGuard::new(*limits);
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() >= 4 && rest[..4] != ZSTD_MAGIC {
            return Err(refused(format!(
                "corrupt Zstandard session log: invalid frame magic at byte {at}"
            )));
        }
        if decoded.complete_frames > 0 {
            decoded.frame_starts.push(decoded.plaintext.len());
        }
        let size = match zstd::zstd_safe::find_frame_compressed_size(rest) {
            Ok(size) if size <= rest.len() => size,
            _ => {
                // Torn final frame: keep what its complete blocks decode to, errors ignored
                // (persistence §2.7), still within the bounds.
                decoded.torn = Some((at, rest.len()));
                decode_frame(rest, &mut guard, &mut decoded.plaintext)?;
                if decoded.complete_frames == 0 {
                    decoded.frame_starts.clear();
                }
                break;
            }
        };
        let frame_start = decoded.plaintext.len();
        match decode_frame(&rest[..size], &mut guard, &mut decoded.plaintext)? {
            FrameEnd::Complete => {}
            FrameEnd::Failed => return Err(frame_failed(at)),
        }
        if decoded.complete_frames == 0 {
            let frame = &decoded.plaintext[frame_start..];
            let newline = frame.iter().position(|byte| *byte == b'\n');
            if newline != Some(frame.len().wrapping_sub(1)) {
                return Err(refused(
                    "corrupt Zstandard session log: first frame is not exactly one header line"
                        .to_owned(),
                ));
            }
        }
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
    import_dsh_jsonl_zstd_limited(store, bytes, &ImportLimits::default())
}

/// [`import_dsh_jsonl_zstd`] under explicit bounds: decoding stops, and the import is refused
/// ([`ExchangeError::TooLarge`]), as soon as a line or the plaintext passes `limits`.
/// A torn final frame is dropped as DSH drops it (the complete lines its complete blocks
/// give are kept) and reported in [`ImportReport::dropped`].
pub fn import_dsh_jsonl_zstd_limited(
    store: &Store,
    bytes: &[u8],
    limits: &ImportLimits,
) -> Result<ImportReport> {
    let decoded = decode_frames(bytes, limits)?;
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
    if let Some((file_offset, file_bytes)) = decoded.torn {
        report.dropped = Some(torn_frame_tail(
            report.dropped.take(),
            &decoded,
            file_offset,
            file_bytes,
        ));
    }
    Ok(report)
}

/// The dropped tail of a log whose last frame is torn: the whole frame is gone from the
/// file's point of view, whatever of its plaintext the scan kept or dropped.
fn torn_frame_tail(
    scanned: Option<DroppedTail>,
    decoded: &Decoded,
    file_offset: usize,
    file_bytes: usize,
) -> DroppedTail {
    torn_tail(
        scanned,
        decoded.plaintext.len() as u64,
        TornFrame {
            file_offset: file_offset as u64,
            file_bytes: file_bytes as u64,
            recovered_bytes: (decoded.plaintext.len() - decoded.complete_end) as u64,
        },
    )
}

/// [`torn_frame_tail`] given the plaintext length and the torn frame (the streaming import's
/// form).
pub(super) fn torn_tail(
    scanned: Option<DroppedTail>,
    plaintext_bytes: u64,
    torn_frame: TornFrame,
) -> DroppedTail {
    let frame_text = match torn_frame.recovered_bytes {
        0 => "torn final zstd frame (no complete block to recover)".to_owned(),
        recovered => format!(
            "torn final zstd frame ({recovered} bytes of plaintext recovered from its complete blocks)"
        ),
    };
    match scanned {
        Some(tail) => DroppedTail {
            reason: format!("{}; {frame_text}", tail.reason),
            torn_frame: Some(torn_frame),
            ..tail
        },
        None => DroppedTail {
            offset: plaintext_bytes,
            bytes: 0,
            reason: frame_text,
            torn_frame: Some(torn_frame),
        },
    }
}

fn compress(compressor: &mut zstd::bulk::Compressor<'_>, plain: &[u8]) -> Result<Vec<u8>> {
    compressor
        .compress(plain)
        .map_err(|error| ExchangeError::Compress(error.to_string()))
}

/// Exports a session as `session.jsonl.zstd` (see [`write_dsh_jsonl_zstd`]).
pub fn export_dsh_jsonl_zstd(store: &Store, id: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_dsh_jsonl_zstd(store, id, &mut out)?;
    Ok(out)
}

/// Writes a session as `session.jsonl.zstd` to `out`, streamed: frame 1 = the header line,
/// then one frame per recorded batch (a new frame at each batch-start event). A session with
/// no recorded batch (written live, not imported) gets a new frame every
/// [`UNMARKED_FRAME_BYTES`] of plaintext, so memory stays bounded and DSH's reader, which
/// decodes a frame at a time, is too. Level 3, content checksums on. Returns the bytes
/// written.
pub fn write_dsh_jsonl_zstd(store: &Store, id: &str, out: &mut impl Write) -> Result<u64> {
    let summary = store.session(id)?;
    let mut compressor = zstd::bulk::Compressor::new(LEVEL)
        .map_err(|error| ExchangeError::Compress(error.to_string()))?;
    compressor
        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .map_err(|error| ExchangeError::Compress(error.to_string()))?;
    let mut written = 0u64;
    let mut emit = |compressor: &mut zstd::bulk::Compressor<'_>, plain: &[u8]| -> Result<()> {
        let frame = compress(compressor, plain)?;
        out.write_all(&frame)
            .map_err(|source| crate::Error::io("export write", source))?;
        written += frame.len() as u64;
        Ok(())
    };
    emit(
        &mut compressor,
        format!("{}\n", header_line(&summary.header_json)).as_bytes(),
    )?;
    let mut frame: Vec<u8> = Vec::new();
    let mut batches_recorded = false;
    visit_dsh_lines(store, id, 0, summary.events, |line| {
        batches_recorded |= line.batch_start;
        let cut = if batches_recorded {
            line.batch_start
        } else {
            frame.len() >= UNMARKED_FRAME_BYTES
        };
        if cut && !frame.is_empty() {
            emit(&mut compressor, &frame)?;
            frame.clear();
        }
        frame.extend_from_slice(line.bytes);
        frame.push(b'\n');
        Ok(())
    })?;
    if !frame.is_empty() {
        emit(&mut compressor, &frame)?;
    }
    Ok(written)
}
