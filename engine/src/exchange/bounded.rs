//! Bounds on what an import decodes and holds in memory (format-spec/02-records.md,
//! "Limits"). A DSH log is read line by line into the store, so no line may be longer than
//! the largest event a frame holds plus its envelope; and an import holds the whole
//! session's plaintext while it validates it, so the plaintext has a ceiling too. A zstd
//! frame is decompressed in small steps, each checked against both bounds before it is
//! kept, so a decompression bomb is refused after at most one step past a limit.

use super::ExchangeError;
use std::io::Read;

use crate::limits::IMPORT_DECODE_STEP_BYTES;
pub use crate::limits::IMPORT_LINE_ENVELOPE_BYTES;
pub use crate::limits::MAX_IMPORT_LINE_BYTES;
pub use crate::limits::MAX_IMPORT_PLAINTEXT_BYTES;

/// The bounds one import works under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Longest line, in bytes ([`MAX_IMPORT_LINE_BYTES`]).
    pub max_line_bytes: usize,
    /// Largest plaintext, in bytes ([`MAX_IMPORT_PLAINTEXT_BYTES`]).
    pub max_plaintext_bytes: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        ImportLimits {
            max_line_bytes: MAX_IMPORT_LINE_BYTES,
            max_plaintext_bytes: MAX_IMPORT_PLAINTEXT_BYTES,
        }
    }
}

/// Follows a plaintext as it grows and refuses it at the first line or total past a limit.
#[derive(Debug)]
pub(crate) struct LineGuard {
    limits: ImportLimits,
    total: u64,
    /// Lines completed so far (the header is line 0, records count from 1 as in DSH).
    completed_lines: u64,
    /// Bytes of the line not yet ended by a `\n`.
    open_line: usize,
}

impl LineGuard {
    pub(crate) fn new(limits: ImportLimits) -> LineGuard {
        LineGuard {
            limits,
            total: 0,
            completed_lines: 0,
            open_line: 0,
        }
    }

    /// Accounts for `chunk`, the next bytes of the plaintext.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), ExchangeError> {
        self.total = self.total.saturating_add(chunk.len() as u64);
        if self.total > self.limits.max_plaintext_bytes {
            return Err(ExchangeError::TooLarge {
                reason: format!(
                    "the decoded log exceeds the import limit of {} bytes",
                    self.limits.max_plaintext_bytes
                ),
            });
        }
        let mut rest = chunk;
        while let Some(newline) = memchr::memchr(b'\n', rest) {
            self.check_line(self.open_line.saturating_add(newline))?;
            self.completed_lines += 1;
            self.open_line = 0;
            rest = &rest[newline + 1..];
        }
        self.open_line = self.open_line.saturating_add(rest.len());
        self.check_line(self.open_line)
    }

    fn check_line(&self, length: usize) -> Result<(), ExchangeError> {
        if length <= self.limits.max_line_bytes {
            return Ok(());
        }
        let which = match self.completed_lines {
            0 => "the header line".to_owned(),
            line => format!("line {line}"),
        };
        Err(ExchangeError::TooLarge {
            reason: format!(
                "{which} is longer than {} bytes (the largest event dshdb stores plus its envelope)",
                self.limits.max_line_bytes
            ),
        })
    }
}

/// How decompressing one zstd frame ended.
pub(crate) enum FrameEnd {
    /// The frame decoded completely (and its checksum matched).
    Complete,
    /// The decoder failed; what it produced before is kept.
    Failed,
}

/// Decompresses the zstd frame at the start of `frame` into `out`, step by step, feeding
/// `guard` before each step is kept. A bound exceeded is an error; a decoder failure is
/// [`FrameEnd::Failed`] with the plaintext decoded before it kept.
pub(crate) fn decode_frame(
    frame: &[u8],
    guard: &mut LineGuard,
    out: &mut Vec<u8>,
) -> Result<FrameEnd, ExchangeError> {
    let Ok(decoder) = zstd::stream::read::Decoder::with_buffer(frame) else {
        return Ok(FrameEnd::Failed);
    };
    let mut decoder = decoder.single_frame();
    // Decode straight into `out`'s spare room, one step at a time.
    loop {
        let start = out.len();
        out.resize(start + IMPORT_DECODE_STEP_BYTES, 0);
        let read = decoder.read(&mut out[start..]);
        out.truncate(start + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) => return Ok(FrameEnd::Complete),
            Ok(_) => {
                if let Err(error) = guard.feed(&out[start..]) {
                    out.truncate(start);
                    return Err(error);
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Ok(FrameEnd::Failed),
        }
    }
}

/// The first line of a zstd log's first frame, decoded no further than the line limit;
/// `None` when the frame does not decode to a line within it.
pub(crate) fn first_frame_line(bytes: &[u8]) -> Option<Vec<u8>> {
    let limits = ImportLimits {
        max_plaintext_bytes: MAX_IMPORT_LINE_BYTES as u64 + 1,
        ..ImportLimits::default()
    };
    let mut guard = LineGuard::new(limits);
    let mut plaintext = Vec::new();
    // A refusal still leaves the bytes decoded before it; only a whole line counts.
    let _ = decode_frame(bytes, &mut guard, &mut plaintext);
    let end = plaintext.iter().position(|&byte| byte == b'\n')?;
    plaintext.truncate(end);
    Some(plaintext)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ImportLimits {
        ImportLimits {
            max_line_bytes: 8,
            max_plaintext_bytes: 32,
        }
    }

    #[test]
    fn a_line_past_the_limit_is_refused_with_its_number_across_chunks() {
        let mut guard = LineGuard::new(small());
        assert!(guard.feed(b"header\n12345").is_ok());
        let error = guard.feed(b"6789\n").expect_err("line 1 is 9 bytes");
        assert_eq!(
            error.to_string(),
            "line 1 is longer than 8 bytes (the largest event dshdb stores plus its envelope)"
        );
    }

    #[test]
    fn the_header_line_and_the_total_are_bounded() {
        let mut guard = LineGuard::new(small());
        let error = guard.feed(b"123456789").expect_err("header too long");
        assert!(error.to_string().starts_with("the header line is longer"));
        let mut guard = LineGuard::new(small());
        for _ in 0..4 {
            assert!(guard.feed(b"1234567\n").is_ok());
        }
        let error = guard.feed(b"\n").expect_err("33 bytes in all");
        assert_eq!(
            error.to_string(),
            "the decoded log exceeds the import limit of 32 bytes"
        );
    }

    #[test]
    fn a_frame_of_zeros_stops_one_step_past_the_line_limit() {
        let zeros = vec![0u8; 4 * IMPORT_DECODE_STEP_BYTES];
        let frame = zstd::bulk::compress(&zeros, 3).expect("compress");
        let limits = ImportLimits {
            max_line_bytes: IMPORT_DECODE_STEP_BYTES,
            max_plaintext_bytes: u64::MAX,
        };
        let mut guard = LineGuard::new(limits);
        let mut out = Vec::new();
        assert!(decode_frame(&frame, &mut guard, &mut out).is_err());
        assert!(out.len() <= IMPORT_DECODE_STEP_BYTES);
    }
}
