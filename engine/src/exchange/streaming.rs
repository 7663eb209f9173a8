//! Streaming import of DSH session logs in bounded memory (issue #14).
//!
//! The log is read line by line ([`PlainLines`], or [`ZstdLines`] one zstd frame at a time),
//! scanned with DSH's committed-region rules ([`LineScanner`], the rules of
//! [`super::scan::scan`]), checked with DSH's cold-load rules event by event (an
//! [`EventCheck`]: cold resume's streaming load, one layer up), and written in
//! batches of about [`STAGE_BATCH_BYTES`] to a hidden *staging* session (id
//! [`STAGING_PREFIX`]…). Only when the whole log has passed is it published, with one durable
//! batch ([`Store::publish_staged`]): the session's own header as a fork of the staging
//! session that seeds all of its events, then a tombstone of the staging session. A crash
//! before the publication leaves only the hidden staging session, which the next writable
//! open deletes; a refusal deletes it at once. Either way the session leaves no trace.
//!
//! Memory: the line being read, the batch being staged, one zstd frame and the cold-load
//! state (the surface fold and the repair scan, not the messages). Whatever a log DSH
//! would refuse, or a same-version legacy shape the streaming check does not migrate,
//! hands over to the in-memory import ([`super::import_dsh_jsonl`]), which gives DSH's exact
//! result or error text.

use super::scan::{check_header, decode_record, Record};
use super::{stored_line, DroppedTail, ExchangeError, ImportReport, OwnedEvent, Result};
use crate::db::{NewEvent, SessionWriter, Store};
use crate::frame::EVENT_FLAG_BATCH_START;
use crate::session::SessionEvent;
use std::io::{BufRead, BufReader, Read};

/// Bytes of stored events per staging batch: bounds the memory of an import.
pub const STAGE_BATCH_BYTES: usize = 8 * 1024 * 1024;
/// Read buffer of the input, bytes.
pub const READ_BUFFER_BYTES: usize = 1024 * 1024;
/// Ids of staging sessions start with this (hidden from listings; deleted on open).
pub const STAGING_PREFIX: &str = crate::db::STAGING_PREFIX;

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

fn refused(text: impl Into<String>) -> ExchangeError {
    ExchangeError::Refused(text.into())
}

fn io_refusal(error: std::io::Error) -> ExchangeError {
    refused(format!("cannot read the session log: {error}"))
}

/// One read from a [`LineSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineRead {
    /// A complete line (its `\n` removed); whether it starts a recorded write batch.
    Line {
        batch_start: bool,
    },
    /// The input ended after these bytes without a `\n`.
    Tail,
    End,
}

/// Plaintext lines of a DSH log.
pub(crate) trait LineSource {
    /// Reads the next line into `line` (cleared first).
    fn next_line(&mut self, line: &mut Vec<u8>) -> Result<LineRead>;
    /// Input bytes consumed so far (compressed bytes for zstd), for progress.
    fn consumed(&self) -> u64;
    /// Checks at the end of the input, given the committed plaintext length: the zstd rule
    /// that every complete frame holds only committed lines. Returns the suffix to add to a
    /// dropped tail's reason.
    fn finish(&self, committed: u64) -> Result<Option<String>>;
    fn frames(&self) -> u64;
}

/// `session.jsonl`, line by line.
pub(crate) struct PlainLines<R: Read> {
    reader: BufReader<R>,
    consumed: u64,
}

impl<R: Read> PlainLines<R> {
    pub(crate) fn new(input: R) -> Self {
        Self {
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, input),
            consumed: 0,
        }
    }
}

impl<R: Read> LineSource for PlainLines<R> {
    fn next_line(&mut self, line: &mut Vec<u8>) -> Result<LineRead> {
        line.clear();
        let read = self.reader.read_until(b'\n', line).map_err(io_refusal)?;
        self.consumed += read as u64;
        Ok(match line.last() {
            None => LineRead::End,
            Some(b'\n') => {
                line.pop();
                LineRead::Line { batch_start: false }
            }
            Some(_) => LineRead::Tail,
        })
    }

    fn consumed(&self) -> u64 {
        self.consumed
    }

    fn finish(&self, _committed: u64) -> Result<Option<String>> {
        Ok(None)
    }

    fn frames(&self) -> u64 {
        0
    }
}

/// How a zstd frame read from the input ended.
enum FrameRead {
    Complete(Vec<u8>),
    /// The input ended (or the frame's structure broke) inside it: the frame's bytes from
    /// its start to the end of the input.
    Torn(Vec<u8>),
    End,
}

/// `session.jsonl.zstd`, one frame at a time (persistence §2.7): frame 1 is the header line,
/// every later frame starts a recorded write batch.
pub(crate) struct ZstdLines<R: Read> {
    reader: BufReader<R>,
    consumed: u64,
    /// Plaintext of the current frame and the read position in it.
    plaintext: Vec<u8>,
    position: usize,
    /// Whether the next line starts at a frame start (a batch start).
    at_frame_start: bool,
    complete_frames: u64,
    /// Plaintext bytes of all complete frames.
    complete_end: u64,
    /// Input offset of a torn final frame.
    torn_start: Option<u64>,
    ended: bool,
}

impl<R: Read> ZstdLines<R> {
    pub(crate) fn new(input: R) -> Self {
        Self {
            reader: BufReader::with_capacity(READ_BUFFER_BYTES, input),
            consumed: 0,
            plaintext: Vec::new(),
            position: 0,
            at_frame_start: false,
            complete_frames: 0,
            complete_end: 0,
            torn_start: None,
            ended: false,
        }
    }

    /// Appends up to `count` input bytes to `frame`; returns whether all of them came.
    fn take(&mut self, frame: &mut Vec<u8>, count: usize) -> Result<bool> {
        let start = frame.len();
        let got = (&mut self.reader)
            .take(count as u64)
            .read_to_end(frame)
            .map_err(io_refusal)?;
        self.consumed += got as u64;
        Ok(frame.len() - start == count)
    }

    /// Reads the rest of the input into `frame` (a torn frame is decoded from all of it).
    fn take_rest(&mut self, mut frame: Vec<u8>) -> Result<FrameRead> {
        let got = self.reader.read_to_end(&mut frame).map_err(io_refusal)?;
        self.consumed += got as u64;
        Ok(FrameRead::Torn(frame))
    }

    /// Reads one frame by walking its structure (header, block headers, checksum) without
    /// decoding it. A frame the walk cannot complete is torn, as the scanner treats it.
    fn read_frame(&mut self) -> Result<FrameRead> {
        let start = self.consumed;
        let mut frame = Vec::new();
        if !self.take(&mut frame, 4)? {
            return Ok(if frame.is_empty() {
                FrameRead::End
            } else {
                FrameRead::Torn(frame)
            });
        }
        if frame[..4] != ZSTD_MAGIC {
            return Err(refused(format!(
                "corrupt Zstandard session log: invalid frame magic at byte {start}"
            )));
        }
        if !self.take(&mut frame, 1)? {
            return Ok(FrameRead::Torn(frame));
        }
        let descriptor = frame[4];
        const RESERVED_BITS: u8 = 0x18;
        if descriptor & RESERVED_BITS != 0 {
            return self.take_rest(frame);
        }
        let single_segment = descriptor & 0x20 != 0;
        let window = usize::from(!single_segment);
        let dictionary = [0, 1, 2, 4][usize::from(descriptor & 3)];
        let content_size = match descriptor >> 6 {
            0 => usize::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        if !self.take(&mut frame, window + dictionary + content_size)? {
            return Ok(FrameRead::Torn(frame));
        }
        loop {
            if !self.take(&mut frame, 3)? {
                return Ok(FrameRead::Torn(frame));
            }
            let at = frame.len() - 3;
            let header = u32::from(frame[at])
                | u32::from(frame[at + 1]) << 8
                | u32::from(frame[at + 2]) << 16;
            let last = header & 1 != 0;
            let block_type = (header >> 1) & 3;
            const RESERVED_BLOCK: u32 = 3;
            const RLE_BLOCK: u32 = 1;
            if block_type == RESERVED_BLOCK {
                return self.take_rest(frame);
            }
            let size = if block_type == RLE_BLOCK {
                1
            } else {
                usize::try_from(header >> 3).unwrap_or(usize::MAX)
            };
            if !self.take(&mut frame, size)? {
                return Ok(FrameRead::Torn(frame));
            }
            if last {
                break;
            }
        }
        const CHECKSUM_FLAG: u8 = 0x04;
        if descriptor & CHECKSUM_FLAG != 0 && !self.take(&mut frame, 4)? {
            return Ok(FrameRead::Torn(frame));
        }
        Ok(FrameRead::Complete(frame))
    }

    /// Loads the next frame's plaintext; returns false at the end of the input.
    fn next_frame(&mut self) -> Result<bool> {
        if self.ended {
            return Ok(false);
        }
        let start = self.consumed;
        match self.read_frame()? {
            FrameRead::End => {
                self.ended = true;
                if self.complete_frames == 0 {
                    return Err(refused("empty or header-less Zstandard session log"));
                }
                Ok(false)
            }
            FrameRead::Torn(bytes) => {
                self.ended = true;
                if self.complete_frames == 0 {
                    return Err(refused("empty or header-less Zstandard session log"));
                }
                self.torn_start = Some(start);
                // What a flushing decoder yields; its errors are ignored, as DSH's are.
                let mut partial = Vec::new();
                if let Ok(mut decoder) = zstd::stream::read::Decoder::with_buffer(&bytes[..]) {
                    let _ = decoder.read_to_end(&mut partial);
                }
                self.plaintext = partial;
                self.position = 0;
                self.at_frame_start = true;
                Ok(true)
            }
            FrameRead::Complete(bytes) => {
                let plaintext = zstd::stream::decode_all(&bytes[..]).map_err(|_| {
                    refused(format!(
                        "corrupt Zstandard session log: frame at byte {start} failed validation"
                    ))
                })?;
                if self.complete_frames == 0 {
                    let newline = plaintext.iter().position(|byte| *byte == b'\n');
                    if newline != Some(plaintext.len().wrapping_sub(1)) {
                        return Err(refused(
                            "corrupt Zstandard session log: first frame is not exactly one header line",
                        ));
                    }
                }
                self.at_frame_start = self.complete_frames > 0;
                self.complete_frames += 1;
                self.complete_end += plaintext.len() as u64;
                self.plaintext = plaintext;
                self.position = 0;
                Ok(true)
            }
        }
    }
}

impl<R: Read> LineSource for ZstdLines<R> {
    fn next_line(&mut self, line: &mut Vec<u8>) -> Result<LineRead> {
        line.clear();
        let mut batch_start = None;
        loop {
            let rest = &self.plaintext[self.position..];
            if !rest.is_empty() {
                // A line starting at a frame start starts a batch (the header frame's does not).
                let starts_here = batch_start.is_none();
                let flag = *batch_start.get_or_insert(starts_here && self.at_frame_start);
                self.at_frame_start = false;
                if let Some(end) = rest.iter().position(|byte| *byte == b'\n') {
                    line.extend_from_slice(&rest[..end]);
                    self.position += end + 1;
                    return Ok(LineRead::Line { batch_start: flag });
                }
                line.extend_from_slice(rest);
                self.position = self.plaintext.len();
            }
            if !self.next_frame()? {
                return Ok(if line.is_empty() {
                    LineRead::End
                } else {
                    LineRead::Tail
                });
            }
        }
    }

    fn consumed(&self) -> u64 {
        self.consumed
    }

    fn finish(&self, committed: u64) -> Result<Option<String>> {
        if committed < self.complete_end {
            return Err(refused(
                "corrupt Zstandard session log: complete frame contains a torn JSONL record",
            ));
        }
        Ok(self
            .torn_start
            .map(|start| format!(" (torn zstd frame at byte {start})")))
    }

    fn frames(&self) -> u64 {
        self.complete_frames
    }
}

/// DSH's `SessionLogScanner` line by line (persistence §5.2; the rules of
/// [`super::scan::scan`]).
pub(crate) struct LineScanner {
    expected: u64,
    line_number: usize,
    /// Plaintext offset of the next line.
    offset: u64,
    /// Plaintext bytes up to the end of the last committed line.
    committed: u64,
    /// The first defect: its refusal text, should a later line hold a `turn/end`.
    issue: Option<String>,
    /// A seq gap with no `turn/end` ended the committed region: the rest is not read.
    gap: Option<String>,
}

/// Whether a record holds a `turn/end` (which makes an earlier defect a refusal).
fn has_turn_end(record: &Record) -> bool {
    record
        .events()
        .iter()
        .any(|event| event.event_type == "turn/end")
}

impl LineScanner {
    /// After the header line of `header_bytes` bytes (its `\n` included).
    pub(crate) fn new(header_bytes: u64) -> Self {
        Self {
            expected: 0,
            line_number: 0,
            offset: header_bytes,
            committed: header_bytes,
            issue: None,
            gap: None,
        }
    }

    /// Takes the next complete line; returns its record when it is committed.
    pub(crate) fn line(&mut self, raw: &[u8]) -> Result<Option<Record>> {
        if self.gap.is_some() {
            return Ok(None);
        }
        self.line_number += 1;
        self.offset += raw.len() as u64 + 1;
        let decoded = decode_record(raw);
        if let Some(text) = &self.issue {
            if decoded.as_ref().is_ok_and(has_turn_end) {
                return Err(refused(text.clone()));
            }
            return Ok(None);
        }
        let Ok(record) = decoded else {
            self.issue = Some(format!(
                "corrupt session log: unparsable committed event at line {}",
                self.line_number
            ));
            return Ok(None);
        };
        let misplaced = record
            .events()
            .iter()
            .enumerate()
            .find(|(index, event)| event.seq != self.expected + *index as u64);
        if let Some((index, bad)) = misplaced {
            let gap = format!(
                "corrupt session log: seq gap in committed region at line {} (expected {}, got {})",
                self.line_number,
                self.expected + index as u64,
                bad.seq
            );
            if has_turn_end(&record) {
                return Err(refused(gap));
            }
            self.gap = Some(gap);
            return Ok(None);
        }
        self.expected += record.events().len() as u64;
        self.committed = self.offset;
        Ok(Some(record))
    }

    /// The discardable tail, given the plaintext length read.
    pub(crate) fn finish(self, total: u64) -> Option<DroppedTail> {
        let reason = match (self.gap, self.issue) {
            (Some(gap), _) => gap,
            (None, Some(issue)) => issue,
            (None, None) if self.committed < total => {
                "torn final line (no trailing newline)".to_owned()
            }
            (None, None) => return None,
        };
        Some(DroppedTail {
            offset: self.committed,
            bytes: total - self.committed,
            reason,
        })
    }

    pub(crate) fn committed(&self) -> u64 {
        self.committed
    }
}

/// DSH's cold-load checks, event by event (implemented above this layer, by cold resume's
/// streaming load): [`HandOver`] when the log needs the in-memory import to decide.
pub trait EventCheck {
    fn admit(&mut self, event: &SessionEvent) -> std::result::Result<(), HandOver>;
    /// After the last event: the checks that need the whole log (the closers).
    fn finish(self: Box<Self>) -> std::result::Result<(), HandOver>;
}

/// An [`EventCheck`] cannot decide on its own: the in-memory import must (DSH refuses the
/// log, and only the full load has its error text; or a legacy shape needs earlier events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the streaming checks hand over at seq {seq}: {reason}")]
pub struct HandOver {
    pub seq: u64,
    pub reason: &'static str,
}

/// Makes the [`EventCheck`] of a session, given its id.
pub type CheckFactory<'a> = &'a dyn Fn(&str) -> Box<dyn EventCheck>;

/// How an import reports progress: input bytes consumed so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Why a streaming import stopped before publishing.
enum Stop {
    /// DSH's refusal, with DSH's text (or a store error): reported as such.
    Failed(ExchangeError),
    /// The in-memory import must decide (a cold-load check failed or a legacy shape).
    HandOver,
}

impl From<ExchangeError> for Stop {
    fn from(error: ExchangeError) -> Self {
        Stop::Failed(error)
    }
}

impl From<crate::Error> for Stop {
    fn from(error: crate::Error) -> Self {
        Stop::Failed(ExchangeError::Store(error))
    }
}

/// The staging session being written and the batch being collected.
struct Stage {
    writer: SessionWriter,
    batch: Vec<OwnedEvent>,
    batch_bytes: usize,
    limit: usize,
}

impl Stage {
    fn push(&mut self, events: Vec<OwnedEvent>) -> std::result::Result<(), Stop> {
        // A packed row's events stay in one batch (`events` is one line's).
        if self.batch_bytes >= self.limit {
            self.flush()?;
        }
        for event in events {
            // Per-event framing overhead, roughly.
            self.batch_bytes += event.data.len() + event.envelope.len() + 64;
            self.batch.push(event);
        }
        Ok(())
    }

    fn flush(&mut self) -> std::result::Result<(), Stop> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let events: Vec<NewEvent<'_>> = self.batch.iter().map(OwnedEvent::as_new).collect();
        self.writer.append_batch(&events)?;
        self.batch.clear();
        self.batch_bytes = 0;
        Ok(())
    }
}

/// Sizes of a streaming import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Bytes of stored events per staging batch ([`STAGE_BATCH_BYTES`] by default).
    pub stage_batch_bytes: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            stage_batch_bytes: STAGE_BATCH_BYTES,
        }
    }
}

/// Imports a DSH log from `input` (`zstd`: `session.jsonl.zstd`, else `session.jsonl`) in
/// bounded memory, all or nothing (module doc). `progress` gets the input bytes consumed.
/// `in_memory` is called with the whole input when the in-memory import must decide (it
/// re-reads the input; a refusal's text is DSH's either way).
pub fn import_stream<R: Read>(
    store: &Store,
    input: R,
    zstd: bool,
    limits: StreamLimits,
    checks: CheckFactory<'_>,
    progress: Progress<'_>,
    in_memory: impl FnOnce() -> Result<ImportReport>,
) -> Result<ImportReport> {
    let outcome = if zstd {
        stream_into_stage(store, ZstdLines::new(input), limits, checks, progress)
    } else {
        stream_into_stage(store, PlainLines::new(input), limits, checks, progress)
    };
    match outcome {
        Ok(report) => Ok(report),
        Err(Stop::Failed(error)) => Err(error),
        Err(Stop::HandOver) => in_memory(),
    }
}

/// The header line: the first line of the log.
fn read_header(source: &mut impl LineSource, line: &mut Vec<u8>) -> Result<(String, String)> {
    let read = source.next_line(line)?;
    if read != (LineRead::Line { batch_start: false }) || line.is_empty() {
        return Err(refused("empty or header-less session log"));
    }
    let header = std::str::from_utf8(line)
        .map_err(|_| refused("corrupt session log: header line is not valid UTF-8"))?
        .to_owned();
    let id = check_header(&header)?;
    Ok((header, id))
}

fn stream_into_stage(
    store: &Store,
    mut source: impl LineSource,
    limits: StreamLimits,
    checks: CheckFactory<'_>,
    progress: Progress<'_>,
) -> std::result::Result<ImportReport, Stop> {
    let mut line = Vec::new();
    let (header, session_id) = read_header(&mut source, &mut line)?;
    if session_id.starts_with(STAGING_PREFIX) {
        return Err(Stop::Failed(refused(format!(
            "session id \"{session_id}\" uses the prefix dshdb reserves for staged imports"
        ))));
    }
    if store.session(&session_id).is_ok() {
        return Err(Stop::Failed(ExchangeError::Store(
            crate::Error::DuplicateSession { id: session_id },
        )));
    }
    let mut writer = store.create_staging_session()?;
    // Not synced: the publication's durable commit makes every staged batch before it
    // durable, and a crash before it drops the stage anyway.
    writer.set_durability(crate::commit::Durability::Buffered);
    let staging_id = writer.id().to_owned();
    let mut stage = Stage {
        writer,
        batch: Vec::new(),
        batch_bytes: 0,
        limit: limits.stage_batch_bytes,
    };
    let check = checks(&session_id);
    let staged = stage_lines(
        &mut stage,
        &mut source,
        check,
        &session_id,
        header.len(),
        progress,
    );
    let report = match staged {
        Ok(report) => report,
        Err(stop) => {
            drop(stage);
            // Best effort: a stage left behind is deleted by the next writable open.
            let _ = store.delete_session(&staging_id);
            return Err(stop);
        }
    };
    let Stage { writer, .. } = stage;
    match store.publish_staged(writer, &header) {
        Ok(_) => Ok(report),
        Err(error) => {
            let _ = store.delete_session(&staging_id);
            Err(Stop::Failed(ExchangeError::Store(error)))
        }
    }
}

/// Scans, checks and stages every committed line; returns the report (not yet published).
fn stage_lines(
    stage: &mut Stage,
    source: &mut impl LineSource,
    mut check: Box<dyn EventCheck>,
    session_id: &str,
    header_len: usize,
    progress: Progress<'_>,
) -> std::result::Result<ImportReport, Stop> {
    let mut scanner = LineScanner::new(header_len as u64 + 1);
    let mut report = ImportReport {
        session_id: session_id.to_owned(),
        events: 0,
        lines: 0,
        rows: 0,
        verbatim: 0,
        frames: 0,
        dropped: None,
    };
    let mut line = Vec::new();
    let mut total = header_len as u64 + 1;
    let mut last_progress = 0;
    loop {
        let read = source.next_line(&mut line)?;
        let batch_start = match read {
            LineRead::End => break,
            LineRead::Tail => {
                total += line.len() as u64;
                break;
            }
            LineRead::Line { batch_start } => batch_start,
        };
        total += line.len() as u64 + 1;
        if let Some(record) = scanner.line(&line)? {
            for event in record.events() {
                check.admit(event).map_err(|_| Stop::HandOver)?;
            }
            report.events += record.events().len() as u64;
            report.lines += 1;
            let flag = if batch_start {
                EVENT_FLAG_BATCH_START
            } else {
                0
            };
            let stored = stored_line(&line, &record, flag, &mut report);
            stage.push(stored)?;
        }
        let consumed = source.consumed();
        if consumed - last_progress >= READ_BUFFER_BYTES as u64 {
            progress(consumed);
            last_progress = consumed;
        }
    }
    progress(source.consumed());
    let committed = scanner.committed();
    let suffix = source.finish(committed)?;
    report.dropped = scanner.finish(total);
    if let (Some(tail), Some(suffix)) = (report.dropped.as_mut(), suffix) {
        tail.reason.push_str(&suffix);
    }
    report.frames = source.frames();
    check.finish().map_err(|_| Stop::HandOver)?;
    stage.flush()?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(source: &mut impl LineSource) -> Vec<(Vec<u8>, LineRead)> {
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            let read = source.next_line(&mut line).expect("readable");
            if read == LineRead::End {
                return out;
            }
            out.push((line.clone(), read));
            if read == LineRead::Tail {
                return out;
            }
        }
    }

    #[test]
    fn plain_lines_report_a_torn_tail() {
        let mut source = PlainLines::new(&b"a\nbc\nd"[..]);
        let lines = lines_of(&mut source);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[2], (b"d".to_vec(), LineRead::Tail));
        assert_eq!(source.consumed(), 6);
    }

    fn frame(plain: &[u8]) -> Vec<u8> {
        let mut compressor = zstd::bulk::Compressor::new(3).expect("compressor");
        compressor
            .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .expect("checksum flag");
        compressor.compress(plain).expect("compress")
    }

    #[test]
    fn zstd_lines_flag_frame_starts_and_keep_lines_across_frames() {
        let mut file = frame(b"header\n");
        file.extend(frame(b"one\ntw"));
        file.extend(frame(b"o\nthree\n"));
        file.extend(frame(b"four\n"));
        let mut source = ZstdLines::new(&file[..]);
        let lines = lines_of(&mut source);
        let flags: Vec<(&[u8], bool)> = lines
            .iter()
            .map(|(line, read)| {
                (
                    line.as_slice(),
                    matches!(read, LineRead::Line { batch_start: true }),
                )
            })
            .collect();
        assert_eq!(
            flags,
            [
                (&b"header"[..], false),
                (b"one", true),
                (b"two", false),
                (b"three", false),
                (b"four", true)
            ]
        );
        assert_eq!(source.frames(), 4);
        assert!(source.finish(file.len() as u64).is_ok());
    }

    #[test]
    fn zstd_lines_recover_a_torn_final_frame_and_refuse_bad_magic() {
        let mut file = frame(b"header\n");
        let whole = frame(b"one\ntwo\n");
        let cut = whole.len() - 3;
        file.extend_from_slice(&whole[..cut]);
        let mut source = ZstdLines::new(&file[..]);
        let lines = lines_of(&mut source);
        assert!(!lines.is_empty());
        let suffix = source.finish(7).expect("torn tail is not a refusal");
        assert!(suffix.is_some_and(|text| text.contains("torn zstd frame at byte")));
        let mut bad = frame(b"header\n");
        bad.extend_from_slice(b"nope-not-zstd");
        let mut source = ZstdLines::new(&bad[..]);
        let mut line = Vec::new();
        assert!(source.next_line(&mut line).is_ok());
        let error = source.next_line(&mut line);
        assert!(
            matches!(error, Err(ExchangeError::Refused(text)) if text.contains("invalid frame magic"))
        );
    }
}
