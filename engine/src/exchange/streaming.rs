//! Streaming import of DSH session logs in bounded memory, all or nothing (issue #14).
//!
//! The log is read a chunk at a time (`session.jsonl.zstd` decompressed as it streams, its
//! frame boundaries kept), cut into lines, scanned with DSH's committed-region rules (those of
//! [`super::scan::scan`]), checked with DSH's cold-load rules event by event
//! ([`RestoreCheck`]) and written in batches of about [`STAGE_BATCH_BYTES`] to a hidden
//! stage ([`Store::create_stage`]). Only when the whole log has passed is it published, with
//! one durable batch ([`Store::publish_stage`]). A crash before the publication leaves only
//! the stage, which the next writable open deletes; a refusal deletes it at once. Either way
//! the session leaves no trace.
//!
//! Memory: the line being read and the chunk after it, the batch being staged, and the
//! cold-load state (the surface fold without its messages, the repair scan).
//!
//! The streaming import decides only what it can decide exactly as the in-memory import
//! ([`super::import_dsh_jsonl`], [`super::import_dsh_jsonl_zstd`]) would: a log it would
//! accept, with the same report and the same stored events; a line past the line limit
//! ([`ExchangeError::TooLarge`], checked in the same order); a store failure. Anything else
//! (any refusal, a legacy shape whose migration needs earlier events, a damaged zstd frame)
//! hands over to the in-memory import, which gives DSH's exact result or error text. Unlike
//! the in-memory import it has no ceiling on the plaintext
//! ([`super::MAX_IMPORT_PLAINTEXT_BYTES`] is the in-memory import's).

use super::bounded::{ImportLimits, LineGuard};
use super::row_line::{opens_as_row, read_canonical_row, CanonicalRow, MEMBER_DATA_DEPTH};
use super::scan::{check_header, decode_record, Record};
use super::scan::{push_member_data, ROW_MEMBER_TYPE};
use super::zstd_codec::torn_tail;
use super::{
    stored_line, DroppedTail, ExchangeError, ImportReport, OwnedEvent, Result, TornFrame,
    ZSTD_MAGIC,
};
use crate::limits::{
    DECODE_AHEAD_CHUNKS, DECODE_AHEAD_CHUNK_BYTES, EVENT_FRAME_ESTIMATE_BYTES, STREAM_DECODE_BYTES,
    STREAM_READ_BYTES,
};
use crate::session::{RestoreCheck, TURN_END};
use crate::storage::frame::{EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START};
use crate::store::{is_stage_id, now_millis, ParsedBatch, ParsedEvent, SessionWriter, Store};
use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};

pub use crate::limits::{STAGE_BATCH_BYTES, STREAM_CHECK_KEY_BYTES};

/// How a streaming import reports progress: input bytes read so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Sizes of a streaming import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// Bytes of stored events per staged batch ([`STAGE_BATCH_BYTES`]).
    pub stage_batch_bytes: usize,
    /// Longest line, in bytes ([`super::MAX_IMPORT_LINE_BYTES`]).
    pub max_line_bytes: usize,
    /// Bytes of `tool/result` payloads whose rewrite keys the cold-load check keeps
    /// ([`STREAM_CHECK_KEY_BYTES`]; [`RestoreCheck`]).
    pub check_key_bytes: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            stage_batch_bytes: STAGE_BATCH_BYTES,
            max_line_bytes: ImportLimits::default().max_line_bytes,
            check_key_bytes: STREAM_CHECK_KEY_BYTES,
        }
    }
}

/// Imports the DSH log in file `path` in bounded memory, all or nothing (module doc):
/// `session.jsonl.zstd` when `zstd`, else `session.jsonl`. `progress` gets the file bytes
/// read. When the in-memory import must decide, the file is read again, whole.
pub fn import_dsh_file(
    store: &Store,
    path: &Path,
    zstd: bool,
    progress: Progress<'_>,
) -> Result<ImportReport> {
    let cannot_read = |error: std::io::Error| crate::Error::io("import file read", error);
    let file = std::fs::File::open(path).map_err(cannot_read)?;
    import_dsh_stream(
        store,
        file,
        zstd,
        &StreamOptions::default(),
        progress,
        || {
            let size = std::fs::metadata(path).map_err(cannot_read)?.len();
            if size > super::MAX_IMPORT_PLAINTEXT_BYTES {
                return Err(ExchangeError::TooLarge {
                    reason: format!(
                        "the file is {size} bytes; the import limit is {} bytes",
                        super::MAX_IMPORT_PLAINTEXT_BYTES
                    ),
                });
            }
            let bytes = std::fs::read(path).map_err(cannot_read)?;
            if zstd {
                super::import_dsh_jsonl_zstd(store, &bytes)
            } else {
                super::import_dsh_jsonl(store, &bytes)
            }
        },
    )
}

/// Imports a DSH log read from `input` in bounded memory, all or nothing (module doc).
/// `in_memory` is the in-memory import of the same input, called when it must decide.
pub fn import_dsh_stream<R: Read + Send>(
    store: &Store,
    input: R,
    zstd: bool,
    options: &StreamOptions,
    progress: Progress<'_>,
    in_memory: impl FnOnce() -> Result<ImportReport>,
) -> Result<ImportReport> {
    let guard = LineGuard::new(ImportLimits {
        max_line_bytes: options.max_line_bytes,
        max_plaintext_bytes: u64::MAX,
    });
    let outcome = if zstd {
        std::thread::scope(|scope| {
            let (source, thread) = DecodeAhead::start(scope, ZstdInput::new(input))?;
            let outcome = stream(store, Lines::new(source, guard), options, progress);
            // A panic there is already this import's error ("the decompressing thread
            // stopped"): the reader saw the thread end without an answer.
            let _ = thread.join();
            outcome
        })
    } else {
        stream(
            store,
            Lines::new(PlainInput::new(input), guard),
            options,
            progress,
        )
    };
    match outcome {
        Ok(report) => Ok(report),
        Err(Stop::Failed(error)) => Err(error),
        Err(Stop::HandOver) => in_memory(),
    }
}

/// Why a streaming import stopped before publishing.
enum Stop {
    /// An error the in-memory import would give too (a line too long, a store failure).
    Failed(ExchangeError),
    /// The in-memory import must decide.
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

type Streamed<T> = std::result::Result<T, Stop>;

fn read_error(error: std::io::Error) -> Stop {
    Stop::Failed(ExchangeError::Store(crate::Error::io("import read", error)))
}

/// Reads into the spare room of `out`, at most `count` bytes; returns how many came.
fn read_some(reader: &mut impl Read, out: &mut Vec<u8>, count: usize) -> Streamed<usize> {
    let start = out.len();
    out.resize(start + count, 0);
    loop {
        match reader.read(&mut out[start..]) {
            Ok(read) => {
                out.truncate(start + read);
                return Ok(read);
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => {
                out.truncate(start);
                return Err(read_error(error));
            }
        }
    }
}

/// The plaintext of a DSH log, a chunk at a time.
trait Plaintext {
    /// Appends the next plaintext bytes to `out`; returns how many (0: the end).
    fn fill(&mut self, out: &mut Vec<u8>) -> Streamed<usize>;
    /// Input bytes read so far.
    fn consumed(&self) -> u64;
    /// Moves to `into` the plaintext offsets, in order, where recorded batches (zstd frames
    /// after the first) start in the bytes filled so far.
    fn take_batch_starts(&mut self, into: &mut VecDeque<u64>);
    /// The checks at the end of the input, given the committed plaintext length, and the
    /// report's zstd part: frames read and a torn final frame.
    fn finish(&self, committed: u64) -> Streamed<(u64, Option<TornFrame>)>;
}

/// `session.jsonl`.
struct PlainInput<R> {
    reader: R,
    consumed: u64,
}

impl<R: Read> PlainInput<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            consumed: 0,
        }
    }
}

impl<R: Read> Plaintext for PlainInput<R> {
    fn fill(&mut self, out: &mut Vec<u8>) -> Streamed<usize> {
        let read = read_some(&mut self.reader, out, STREAM_READ_BYTES)?;
        self.consumed += read as u64;
        Ok(read)
    }

    fn consumed(&self) -> u64 {
        self.consumed
    }

    fn take_batch_starts(&mut self, _into: &mut VecDeque<u64>) {}

    fn finish(&self, _committed: u64) -> Streamed<(u64, Option<TornFrame>)> {
        Ok((0, None))
    }
}

/// The frame being decoded: where it starts in the file and in the plaintext.
#[derive(Clone, Copy)]
struct OpenFrame {
    file_start: u64,
    plaintext_start: u64,
}

/// `session.jsonl.zstd` (persistence §2.7), decompressed as it streams: frame 1 is the header
/// line, every later frame starts a recorded batch. The rules of the in-memory decode
/// (`zstd_codec::decode_frames`): a frame that does not start with the magic, a decoder
/// error, or a first frame that is not exactly one line hand over; the input ending inside a
/// frame makes it the torn final frame.
struct ZstdInput<R> {
    reader: R,
    decoder: zstd::zstd_safe::DCtx<'static>,
    /// Input read and not yet decoded: `input[input_at..]`.
    input: Vec<u8>,
    input_at: usize,
    input_ended: bool,
    /// File offset of `input[input_at]`.
    file_offset: u64,
    frame: Option<OpenFrame>,
    plaintext_bytes: u64,
    complete_end: u64,
    complete_frames: u64,
    /// Plaintext offsets where frames 2.. start, not yet taken.
    frame_starts: VecDeque<u64>,
    /// The first newline of frame 1.
    first_newline: Option<u64>,
    torn: Option<TornFrame>,
    ended: bool,
}

impl<R: Read> ZstdInput<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            decoder: zstd::zstd_safe::DCtx::create(),
            input: Vec::new(),
            input_at: 0,
            input_ended: false,
            file_offset: 0,
            frame: None,
            plaintext_bytes: 0,
            complete_end: 0,
            complete_frames: 0,
            frame_starts: VecDeque::new(),
            first_newline: None,
            torn: None,
            ended: false,
        }
    }

    /// Reads until at least `count` input bytes wait (or the input ends); returns how many.
    fn available(&mut self, count: usize) -> Streamed<usize> {
        while self.input.len() - self.input_at < count && !self.input_ended {
            self.input.drain(..self.input_at);
            self.input_at = 0;
            if read_some(&mut self.reader, &mut self.input, STREAM_READ_BYTES)? == 0 {
                self.input_ended = true;
            }
        }
        Ok(self.input.len() - self.input_at)
    }

    /// Starts the next frame; `false` at the end of the input (or of a torn frame).
    fn open_frame(&mut self) -> Streamed<bool> {
        let available = self.available(ZSTD_MAGIC.len())?;
        if available == 0 {
            return Ok(false);
        }
        if available >= ZSTD_MAGIC.len()
            && self.input[self.input_at..self.input_at + ZSTD_MAGIC.len()] != ZSTD_MAGIC
        {
            return Err(Stop::HandOver);
        }
        if self.complete_frames > 0 {
            self.frame_starts.push_back(self.plaintext_bytes);
        }
        self.frame = Some(OpenFrame {
            file_start: self.file_offset,
            plaintext_start: self.plaintext_bytes,
        });
        Ok(true)
    }

    /// The input ended inside `frame`: it is the torn final frame.
    fn torn(&mut self, frame: OpenFrame) -> Streamed<()> {
        self.torn = Some(TornFrame {
            file_offset: frame.file_start,
            file_bytes: self.file_offset + (self.input.len() - self.input_at) as u64
                - frame.file_start,
            recovered_bytes: self.plaintext_bytes - frame.plaintext_start,
        });
        Ok(())
    }

    /// Checks frame 1 when it ends: exactly one line, the header.
    fn first_frame_ended(&self) -> Streamed<()> {
        let exactly_one_line =
            self.plaintext_bytes > 0 && self.first_newline == Some(self.plaintext_bytes - 1);
        if exactly_one_line {
            Ok(())
        } else {
            Err(Stop::HandOver)
        }
    }
}

impl<R: Read> Plaintext for ZstdInput<R> {
    fn fill(&mut self, out: &mut Vec<u8>) -> Streamed<usize> {
        loop {
            if self.ended {
                return Ok(0);
            }
            let Some(frame) = self.frame else {
                if !self.open_frame()? {
                    self.ended = true;
                }
                continue;
            };
            if self.available(1)? == 0 {
                self.torn(frame)?;
                self.ended = true;
                continue;
            }
            // Decompressed straight into `out`'s spare room (at least a step's worth).
            let start = out.len();
            out.reserve(STREAM_DECODE_BYTES);
            let mut input = zstd::zstd_safe::InBuffer::around(&self.input[self.input_at..]);
            let mut output = zstd::zstd_safe::OutBuffer::around_pos(out, start);
            let hint = self
                .decoder
                .decompress_stream(&mut output, &mut input)
                .map_err(|_| Stop::HandOver)?;
            let (taken, produced) = (input.pos(), out.len() - start);
            self.input_at += taken;
            self.file_offset += taken as u64;
            if self.complete_frames == 0 && self.first_newline.is_none() {
                self.first_newline =
                    memchr::memchr(b'\n', &out[start..]).map(|at| self.plaintext_bytes + at as u64);
            }
            self.plaintext_bytes += produced as u64;
            if hint == 0 {
                if self.complete_frames == 0 {
                    self.first_frame_ended()?;
                }
                self.complete_frames += 1;
                self.complete_end = self.plaintext_bytes;
                self.frame = None;
            }
            if produced > 0 {
                return Ok(produced);
            }
        }
    }

    fn consumed(&self) -> u64 {
        self.file_offset
    }

    fn take_batch_starts(&mut self, into: &mut VecDeque<u64>) {
        into.append(&mut self.frame_starts);
    }

    fn finish(&self, committed: u64) -> Streamed<(u64, Option<TornFrame>)> {
        // No complete frame (the header's) is DSH's refusal; so is a complete frame that
        // ends inside a record.
        if self.complete_frames == 0 || committed < self.complete_end {
            return Err(Stop::HandOver);
        }
        Ok((self.complete_frames, self.torn))
    }
}

/// What the decompressing thread of [`DecodeAhead`] hands over, in order.
enum Ahead<P> {
    /// The next plaintext bytes, the batch starts in them, and the input read so far.
    Chunk {
        bytes: Vec<u8>,
        batch_starts: VecDeque<u64>,
        consumed: u64,
    },
    /// The plaintext ended; the source comes back for [`Plaintext::finish`].
    End(P),
    /// The source stopped (after every chunk it filled before).
    Stopped(Stop),
}

/// A plaintext decoded on a thread of its own, up to [`DECODE_AHEAD_CHUNKS`] chunks ahead:
/// decompressing a zstd log then overlaps with reading and checking its lines instead of
/// sitting on their critical path. The lines, the batch starts and every stop come in the
/// order the source gives them, so an import reads exactly what it reads without the thread.
struct DecodeAhead<P> {
    chunks: Receiver<Ahead<P>>,
    /// Emptied chunk buffers going back to be filled again.
    emptied: Sender<Vec<u8>>,
    batch_starts: VecDeque<u64>,
    consumed: u64,
    ended: Option<P>,
}

impl<P: Plaintext + Send> DecodeAhead<P> {
    /// Starts decoding `source` on a thread of `scope`, which ends when the returned reader
    /// is dropped (at its next hand-over).
    fn start<'scope>(
        scope: &'scope std::thread::Scope<'scope, '_>,
        source: P,
    ) -> Streamed<(Self, std::thread::ScopedJoinHandle<'scope, ()>)>
    where
        P: 'scope,
    {
        let (chunk_sender, chunks) = sync_channel(DECODE_AHEAD_CHUNKS);
        let (emptied, emptied_receiver) = channel();
        let thread = std::thread::Builder::new()
            .name("dshdb-decode".to_owned())
            .spawn_scoped(scope, move || {
                decode_ahead(source, &chunk_sender, &emptied_receiver)
            })
            .map_err(|source| crate::Error::ThreadStart {
                thread: "dshdb-decode",
                source,
            })?;
        let reader = Self {
            chunks,
            emptied,
            batch_starts: VecDeque::new(),
            consumed: 0,
            ended: None,
        };
        Ok((reader, thread))
    }
}

/// The decompressing thread of [`DecodeAhead`]: fills chunks from `source` and sends them
/// until the plaintext ends, the source stops, or the reader is gone.
fn decode_ahead<P: Plaintext>(
    mut source: P,
    chunks: &SyncSender<Ahead<P>>,
    emptied: &Receiver<Vec<u8>>,
) {
    loop {
        let mut bytes = emptied.try_recv().unwrap_or_default();
        bytes.clear();
        let mut ended = false;
        let mut stopped = None;
        while bytes.len() < DECODE_AHEAD_CHUNK_BYTES {
            match source.fill(&mut bytes) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(_) => {}
                Err(stop) => {
                    stopped = Some(stop);
                    break;
                }
            }
        }
        let mut batch_starts = VecDeque::new();
        source.take_batch_starts(&mut batch_starts);
        let chunk = Ahead::Chunk {
            bytes,
            batch_starts,
            consumed: source.consumed(),
        };
        if chunks.send(chunk).is_err() {
            return;
        }
        let last = match (stopped, ended) {
            (Some(stop), _) => Ahead::Stopped(stop),
            (None, true) => Ahead::End(source),
            (None, false) => continue,
        };
        let _ = chunks.send(last);
        return;
    }
}

/// The decompressing thread ended without saying why (it panicked).
fn decoder_stopped() -> Stop {
    Stop::Failed(ExchangeError::Store(crate::Error::invalid(
        "the decompressing thread stopped",
    )))
}

impl<P: Plaintext> Plaintext for DecodeAhead<P> {
    fn fill(&mut self, out: &mut Vec<u8>) -> Streamed<usize> {
        while self.ended.is_none() {
            match self.chunks.recv().map_err(|_| decoder_stopped())? {
                Ahead::Chunk {
                    bytes,
                    mut batch_starts,
                    consumed,
                } => {
                    out.extend_from_slice(&bytes);
                    self.batch_starts.append(&mut batch_starts);
                    self.consumed = consumed;
                    let filled = bytes.len();
                    // The thread may be gone already; the buffer is then simply freed.
                    let _ = self.emptied.send(bytes);
                    if filled > 0 {
                        return Ok(filled);
                    }
                }
                Ahead::End(source) => self.ended = Some(source),
                Ahead::Stopped(stop) => return Err(stop),
            }
        }
        Ok(0)
    }

    fn consumed(&self) -> u64 {
        self.consumed
    }

    fn take_batch_starts(&mut self, into: &mut VecDeque<u64>) {
        into.append(&mut self.batch_starts);
    }

    fn finish(&self, committed: u64) -> Streamed<(u64, Option<TornFrame>)> {
        match &self.ended {
            Some(source) => source.finish(committed),
            None => Err(decoder_stopped()),
        }
    }
}

/// One read of [`Lines`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineRead {
    /// A line ended by `\n` ([`Lines::line`]), at plaintext `offset`.
    Line {
        offset: u64,
        batch_start: bool,
    },
    /// The plaintext ended after this many bytes without a `\n`.
    Tail,
    End,
}

/// The lines of a plaintext, each checked against the line limit as its bytes arrive.
struct Lines<P> {
    source: P,
    guard: LineGuard,
    buffer: Vec<u8>,
    /// Start of the unread bytes in `buffer`.
    start: usize,
    /// `buffer[start..searched]` holds no newline.
    searched: usize,
    /// Plaintext offset of `buffer[0]`.
    base: u64,
    line: std::ops::Range<usize>,
    /// Plaintext offsets where recorded batches start, not yet passed by a line.
    batch_starts: VecDeque<u64>,
    ended: bool,
}

impl<P: Plaintext> Lines<P> {
    fn new(source: P, guard: LineGuard) -> Self {
        Self {
            source,
            guard,
            buffer: Vec::new(),
            start: 0,
            searched: 0,
            base: 0,
            line: 0..0,
            batch_starts: VecDeque::new(),
            ended: false,
        }
    }

    /// Whether a recorded batch starts at plaintext `offset`, the start of a line; forgets
    /// the starts up to it.
    fn batch_starts_at(&mut self, offset: u64) -> bool {
        let mut starts = false;
        while let Some(&start) = self.batch_starts.front() {
            if start > offset {
                break;
            }
            starts |= start == offset;
            self.batch_starts.pop_front();
        }
        starts
    }

    /// The line of the last [`LineRead::Line`] (without its `\n`).
    fn line(&self) -> &[u8] {
        &self.buffer[self.line.clone()]
    }

    /// Plaintext bytes read so far.
    fn total(&self) -> u64 {
        self.base + self.buffer.len() as u64
    }

    fn next(&mut self) -> Streamed<LineRead> {
        loop {
            if let Some(at) = memchr::memchr(b'\n', &self.buffer[self.searched..]) {
                let end = self.searched + at;
                self.line = self.start..end;
                let offset = self.base + self.start as u64;
                self.start = end + 1;
                self.searched = self.start;
                let batch_start = self.batch_starts_at(offset);
                return Ok(LineRead::Line {
                    offset,
                    batch_start,
                });
            }
            self.searched = self.buffer.len();
            if self.ended {
                if self.start < self.buffer.len() {
                    self.start = self.buffer.len();
                    return Ok(LineRead::Tail);
                }
                return Ok(LineRead::End);
            }
            // Keep only the open line, then read on.
            self.buffer.drain(..self.start);
            self.base += self.start as u64;
            self.searched -= self.start;
            self.start = 0;
            let before = self.buffer.len();
            if self.source.fill(&mut self.buffer)? == 0 {
                self.ended = true;
            }
            self.source.take_batch_starts(&mut self.batch_starts);
            self.guard.feed(&self.buffer[before..])?;
        }
    }
}

/// DSH's `SessionLogScanner` line by line (persistence §5.2; the rules of
/// [`super::scan::scan`]). Its refusals hand over.
struct LineScanner {
    expected: u64,
    line_number: usize,
    /// Plaintext bytes up to the end of the last committed line.
    committed: u64,
    /// The first defect's text (the tail starts there); a later `turn/end` is a refusal.
    issue: Option<String>,
    /// A seq gap with no `turn/end` ended the committed region: the rest is not read.
    gap: Option<String>,
}

/// A committed line's content.
enum Decoded<'line> {
    /// A packed row exactly as DSH writes it, read in one pass (`row_line`).
    Row(CanonicalRow<'line>),
    /// Any other line, read the general way ([`decode_record`]).
    Record(Record),
}

impl Decoded<'_> {
    fn events(&self) -> u64 {
        match self {
            Decoded::Row(row) => row.members(),
            Decoded::Record(record) => record.events().len() as u64,
        }
    }

    /// A row's members are `assistant/chunk` events.
    fn has_turn_end(&self) -> bool {
        match self {
            Decoded::Row(_) => false,
            Decoded::Record(record) => record
                .events()
                .iter()
                .any(|event| event.event_type == TURN_END),
        }
    }

    /// The first event whose seq is not the one expected from `expected` on: its seq and
    /// the one expected.
    fn misplaced(&self, expected: u64) -> Option<(u64, u64)> {
        match self {
            Decoded::Row(row) => (row.seq0 != expected).then_some((row.seq0, expected)),
            Decoded::Record(record) => record
                .events()
                .iter()
                .zip(expected..)
                .find(|(event, expected)| event.seq != *expected)
                .map(|(event, expected)| (event.seq, expected)),
        }
    }
}

/// Decodes one line: a row as DSH writes it in one pass, anything else the general way.
fn decode_line(raw: &[u8]) -> Result<Decoded<'_>, ()> {
    let row = opens_as_row(raw)
        .then(|| std::str::from_utf8(raw).ok())
        .flatten()
        .and_then(read_canonical_row);
    match row {
        Some(row) => Ok(Decoded::Row(row)),
        None => decode_record(raw).map(Decoded::Record),
    }
}

impl LineScanner {
    fn new(header_bytes: u64) -> Self {
        Self {
            expected: 0,
            line_number: 0,
            committed: header_bytes,
            issue: None,
            gap: None,
        }
    }

    /// Takes the next complete line, ending at plaintext offset `end` (after its `\n`);
    /// returns its record when it is committed.
    fn line<'line>(&mut self, raw: &'line [u8], end: u64) -> Streamed<Option<Decoded<'line>>> {
        if self.gap.is_some() {
            return Ok(None);
        }
        self.line_number += 1;
        let decoded = decode_line(raw);
        if self.issue.is_some() {
            if decoded.as_ref().is_ok_and(Decoded::has_turn_end) {
                return Err(Stop::HandOver);
            }
            return Ok(None);
        }
        let Ok(decoded) = decoded else {
            self.issue = Some(format!(
                "corrupt session log: unparsable committed event at line {}",
                self.line_number
            ));
            return Ok(None);
        };
        if let Some((bad, expected)) = decoded.misplaced(self.expected) {
            if decoded.has_turn_end() {
                return Err(Stop::HandOver);
            }
            self.gap = Some(format!(
                "corrupt session log: seq gap in committed region at line {} (expected {expected}, got {bad})",
                self.line_number
            ));
            return Ok(None);
        }
        self.expected += decoded.events();
        self.committed = end;
        Ok(Some(decoded))
    }

    /// The discardable tail, given the plaintext length read.
    fn finish(self, total: u64) -> Option<DroppedTail> {
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
            torn_frame: None,
        })
    }
}

/// The batch being gathered, and the channel to the thread that writes batches to the
/// stage (decoding and writing overlap; the channel holds one batch, so memory stays at
/// about three batches).
///
/// The writing thread sends each batch back once written, and this thread empties it and
/// gathers the next one in it: the events are freed by the thread that allocated them (a
/// free from another thread takes the allocator's arena lock, and the two threads contended
/// for it on every event), and the batch's vector and texts are not grown again from empty.
struct Stage {
    batches: SyncSender<Batch>,
    written: Receiver<Batch>,
    batch: Batch,
    batch_bytes: usize,
    limit: usize,
}

/// Events on their way to the stage.
#[derive(Default)]
struct Batch {
    events: Vec<StagedEvent>,
    /// The `data` texts of the batch's row members, one after another: one buffer reused
    /// from batch to batch instead of an allocation per member.
    texts: String,
}

enum StagedEvent {
    /// An event of a line read the general way ([`stored_line`]).
    Line(OwnedEvent),
    /// A member of a row read in one pass: its `data` is `texts[data]` of its batch.
    RowMember {
        time: i64,
        data: std::ops::Range<usize>,
        flags: u8,
    },
}

impl Batch {
    fn clear(&mut self) {
        self.events.clear();
        self.texts.clear();
    }

    /// The batch as the store takes it, into `into` (emptied).
    fn parse_into<'a>(&'a self, into: &mut ParsedBatch<'a>) -> crate::Result<()> {
        into.reserve(self.events.len());
        for event in &self.events {
            into.push(self.parsed_event(event)?);
        }
        Ok(())
    }

    fn parsed_event<'a>(&'a self, event: &'a StagedEvent) -> crate::Result<ParsedEvent<'a>> {
        match event {
            StagedEvent::Line(owned) => Ok(owned.as_parsed()),
            StagedEvent::RowMember { time, data, flags } => {
                let text = self.texts.get(data.clone()).ok_or_else(|| {
                    crate::Error::invalid("a staged row member's text is not in its batch")
                })?;
                Ok(ParsedEvent::built(
                    ROW_MEMBER_TYPE,
                    *time,
                    (text, MEMBER_DATA_DEPTH),
                    "",
                    *flags,
                ))
            }
        }
    }
}

/// The writing thread stopped; its own result says why.
fn writer_stopped() -> Stop {
    Stop::Failed(ExchangeError::Store(crate::Error::invalid(
        "the staging writer stopped",
    )))
}

impl Stage {
    /// Adds one line's events (a packed row's members stay in one batch).
    fn push(&mut self, events: Vec<OwnedEvent>) -> Streamed<()> {
        if self.batch_bytes >= self.limit {
            self.flush()?;
        }
        for event in events {
            self.batch_bytes += event.stored_bytes() + EVENT_FRAME_ESTIMATE_BYTES;
            self.batch.events.push(StagedEvent::Line(event));
        }
        Ok(())
    }

    /// Adds a row read in one pass as [`stored_line`] stores a row whose re-packing is its
    /// line (which it is, by construction): its members split, the first flagged as the
    /// row's start and with `batch_flag`, no verbatim copy.
    fn push_row(&mut self, row: &CanonicalRow<'_>, batch_flag: u8) -> Streamed<()> {
        if self.batch_bytes >= self.limit {
            self.flush()?;
        }
        let prefix = row.shape.member_prefix();
        for (position, (payload, time)) in row.payloads.iter().zip(&row.times).enumerate() {
            let start = self.batch.texts.len();
            push_member_data(&mut self.batch.texts, &prefix, payload);
            let data = start..self.batch.texts.len();
            self.batch_bytes += data.len() + EVENT_FRAME_ESTIMATE_BYTES;
            let flags = if position == 0 {
                EVENT_FLAG_ROW_START | batch_flag
            } else {
                EVENT_FLAG_ROW_MEMBER
            };
            self.batch.events.push(StagedEvent::RowMember {
                time: *time,
                data,
                flags,
            });
        }
        Ok(())
    }

    fn flush(&mut self) -> Streamed<()> {
        if self.batch.events.is_empty() {
            return Ok(());
        }
        let capacity = (self.batch.events.capacity(), self.batch.texts.capacity());
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        self.batches.send(batch).map_err(|_| writer_stopped())?;
        // Every batch written so far is emptied here; the last one is reused.
        for mut written in self.written.try_iter() {
            written.clear();
            self.batch = written;
        }
        if self.batch.events.capacity() == 0 {
            self.batch = Batch {
                events: Vec::with_capacity(capacity.0),
                texts: String::with_capacity(capacity.1),
            };
        }
        Ok(())
    }
}

/// The writing thread: appends every batch received to the stage and sends it back
/// ([`Stage`]), until the channel closes or an append fails.
fn write_batches(
    writer: &mut SessionWriter,
    batches: Receiver<Batch>,
    written: Sender<Batch>,
) -> crate::Result<()> {
    let mut spare = ParsedBatch::default();
    for batch in batches {
        let mut parsed = spare.renewed();
        batch.parse_into(&mut parsed)?;
        writer.append_parsed_batch(&parsed)?;
        spare = parsed.renewed();
        // Once the gathering thread has stopped, the batch is dropped here instead.
        let _ = written.send(batch);
    }
    Ok(())
}

/// The header line: the log's first line, its session id checked. Any defect hands over.
fn read_header(lines: &mut Lines<impl Plaintext>) -> Streamed<(String, String)> {
    if !matches!(lines.next()?, LineRead::Line { .. }) || lines.line().is_empty() {
        return Err(Stop::HandOver);
    }
    let header = std::str::from_utf8(lines.line())
        .map_err(|_| Stop::HandOver)?
        .to_owned();
    let id = check_header(&header).map_err(|_| Stop::HandOver)?;
    Ok((header, id))
}

fn stream(
    store: &Store,
    mut lines: Lines<impl Plaintext>,
    options: &StreamOptions,
    progress: Progress<'_>,
) -> Streamed<ImportReport> {
    let (header, session_id) = read_header(&mut lines)?;
    // The store's own refusals, before anything is staged (the in-memory import meets them
    // only after its checks: a log both refused and named so differs in which error wins).
    if is_stage_id(&session_id) {
        return Err(Stop::HandOver);
    }
    if store.session(&session_id).is_ok() {
        return Err(crate::Error::DuplicateSession { id: session_id }.into());
    }
    let mut writer = store.create_stage()?;
    let header_bytes = header.len() as u64 + 1;
    let (staged, written) = std::thread::scope(|scope| {
        let (sender, receiver) = sync_channel(1);
        let (written_sender, written) = channel();
        let writing = std::thread::Builder::new()
            .name("dshdb-stage".to_owned())
            .spawn_scoped(scope, || {
                write_batches(&mut writer, receiver, written_sender)
            });
        let writing = match writing {
            Ok(writing) => writing,
            Err(source) => {
                let error = crate::Error::ThreadStart {
                    thread: "dshdb-stage",
                    source,
                };
                return (Err(error.into()), Ok(()));
            }
        };
        let mut stage = Stage {
            batches: sender,
            written,
            batch: Batch::default(),
            batch_bytes: 0,
            limit: options.stage_batch_bytes,
        };
        let check = RestoreCheck::new(&session_id, options.check_key_bytes);
        let staged = stage_lines(&mut stage, &mut lines, check, header_bytes, progress);
        // Closes the channel: the writer finishes the batches sent and stops.
        drop(stage);
        let written = writing
            .join()
            .unwrap_or_else(|_| Err(crate::Error::invalid("the staging writer panicked")));
        (staged, written)
    });
    match (staged, written) {
        (Ok(report), Ok(())) => {
            store.publish_stage(writer, &header)?;
            Ok(report)
        }
        // A failed append explains a writer that stopped.
        (_, Err(error)) => {
            store.discard_stage(writer);
            Err(error.into())
        }
        (Err(stop), Ok(())) => {
            store.discard_stage(writer);
            Err(stop)
        }
    }
}

/// Scans, checks and stages every committed line; returns the report (not yet published).
fn stage_lines(
    stage: &mut Stage,
    lines: &mut Lines<impl Plaintext>,
    mut check: RestoreCheck,
    header_bytes: u64,
    progress: Progress<'_>,
) -> Streamed<ImportReport> {
    let mut scanner = LineScanner::new(header_bytes);
    let mut report = ImportReport {
        session_id: check.session_id().to_owned(),
        events: 0,
        lines: 0,
        rows: 0,
        verbatim: 0,
        frames: 0,
        dropped: None,
    };
    let mut reported = 0;
    while let LineRead::Line {
        offset,
        batch_start,
    } = lines.next()?
    {
        let end = offset + lines.line().len() as u64 + 1;
        if let Some(decoded) = scanner.line(lines.line(), end)? {
            report.events += decoded.events();
            report.lines += 1;
            let flag = if batch_start {
                EVENT_FLAG_BATCH_START
            } else {
                0
            };
            match decoded {
                Decoded::Row(row) => {
                    check
                        .admit_chunk_row(row.seq0, row.members(), row.last_time())
                        .map_err(|_| Stop::HandOver)?;
                    report.rows += 1;
                    stage.push_row(&row, flag)?;
                }
                Decoded::Record(record) => {
                    for event in record.events() {
                        check.admit(event).map_err(|_| Stop::HandOver)?;
                    }
                    stage.push(stored_line(lines.line(), record, flag, &mut report))?;
                }
            }
        }
        let consumed = lines.source.consumed();
        if consumed - reported >= STREAM_READ_BYTES as u64 {
            progress(consumed);
            reported = consumed;
        }
    }
    progress(lines.source.consumed());
    let total = lines.total();
    let (frames, torn) = lines.source.finish(scanner.committed)?;
    report.frames = frames;
    report.dropped = scanner.finish(total);
    if let Some(torn) = torn {
        report.dropped = Some(torn_tail(report.dropped.take(), total, torn));
    }
    check.finish(now_millis()).map_err(|_| Stop::HandOver)?;
    stage.flush()?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(lines: &mut Lines<impl Plaintext>) -> Vec<(Vec<u8>, LineRead)> {
        let mut out = Vec::new();
        loop {
            match lines.next() {
                Ok(LineRead::End) => return out,
                Ok(LineRead::Tail) => {
                    out.push((Vec::new(), LineRead::Tail));
                    return out;
                }
                Ok(read) => out.push((lines.line().to_vec(), read)),
                Err(_) => panic!("the lines read"),
            }
        }
    }

    fn guard() -> LineGuard {
        LineGuard::new(ImportLimits::default())
    }

    fn frame(plain: &[u8]) -> Vec<u8> {
        let mut compressor = zstd::bulk::Compressor::new(3).expect("compressor");
        compressor
            .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .expect("checksum flag");
        compressor.compress(plain).expect("compress")
    }

    #[test]
    fn plain_lines_end_in_a_torn_tail() {
        let mut lines = Lines::new(PlainInput::new(&b"a\nbc\nd"[..]), guard());
        let read = lines_of(&mut lines);
        assert_eq!(read.len(), 3);
        assert_eq!(
            read[1],
            (
                b"bc".to_vec(),
                LineRead::Line {
                    offset: 2,
                    batch_start: false
                }
            )
        );
        assert_eq!(read[2].1, LineRead::Tail);
        assert_eq!(lines.total(), 6);
    }

    #[test]
    fn zstd_lines_flag_frame_starts_and_keep_lines_across_frames() {
        let mut file = frame(b"header\n");
        file.extend(frame(b"one\ntw"));
        file.extend(frame(b"o\nthree\n"));
        file.extend(frame(b"four\n"));
        let mut lines = Lines::new(ZstdInput::new(&file[..]), guard());
        let read: Vec<(Vec<u8>, bool)> = lines_of(&mut lines)
            .into_iter()
            .map(|(line, read)| {
                let starts = matches!(
                    read,
                    LineRead::Line {
                        batch_start: true,
                        ..
                    }
                );
                (line, starts)
            })
            .collect();
        let expected: Vec<(Vec<u8>, bool)> = [
            ("header", false),
            ("one", true),
            ("two", false),
            ("three", false),
            ("four", true),
        ]
        .iter()
        .map(|(line, starts)| (line.as_bytes().to_vec(), *starts))
        .collect();
        assert_eq!(read, expected);
        let finished = lines.source.finish(lines.total());
        assert!(matches!(finished, Ok((4, None))));
    }

    #[test]
    fn a_zstd_log_cut_inside_a_frame_has_a_torn_final_frame() {
        let mut file = frame(b"header\n");
        let header_frame = file.len() as u64;
        let whole = frame(b"one\ntwo\n");
        file.extend_from_slice(&whole[..whole.len() - 3]);
        let mut lines = Lines::new(ZstdInput::new(&file[..]), guard());
        let _ = lines_of(&mut lines);
        let Ok((frames, Some(torn))) = lines.source.finish(7) else {
            panic!("a torn final frame is no refusal");
        };
        assert_eq!(frames, 1);
        assert_eq!(torn.file_offset, header_frame);
        assert_eq!(torn.file_bytes, file.len() as u64 - header_frame);
    }

    #[test]
    fn a_zstd_log_with_a_bad_magic_hands_over() {
        let mut file = frame(b"header\n");
        file.extend_from_slice(b"nope-not-zstd");
        let mut lines = Lines::new(ZstdInput::new(&file[..]), guard());
        assert!(matches!(lines.next(), Ok(LineRead::Line { .. })));
        assert!(matches!(lines.next(), Err(Stop::HandOver)));
    }

    /// What reading `file` line by line gives: the lines with their batch starts, how it
    /// ended (a stop is `None`), and the finish's frames and torn frame offset.
    type Reading = (Vec<(Vec<u8>, LineRead)>, Option<(u64, Option<u64>)>);

    fn reading(lines: &mut Lines<impl Plaintext>) -> Reading {
        let mut read = Vec::new();
        loop {
            match lines.next() {
                Ok(LineRead::End) => break,
                Ok(LineRead::Tail) => {
                    read.push((Vec::new(), LineRead::Tail));
                    break;
                }
                Ok(line) => read.push((lines.line().to_vec(), line)),
                Err(_) => return (read, None),
            }
        }
        let finished = lines.source.finish(lines.total()).ok();
        let finished = finished.map(|(frames, torn)| (frames, torn.map(|torn| torn.file_offset)));
        (read, finished)
    }

    #[test]
    fn decoding_ahead_reads_exactly_what_decoding_in_line_reads() {
        // Many frames (past several hand-over chunks), a torn last frame, a bad magic.
        let mut whole = frame(b"header\n");
        for number in 0..3_000u32 {
            let text = format!("line {number} {}\nsecond {number}\n", "x".repeat(400));
            whole.extend(frame(text.as_bytes()));
        }
        let mut torn = whole.clone();
        let last = frame(b"cut\nhere\n");
        torn.extend_from_slice(&last[..last.len() - 2]);
        let mut bad_magic = whole.clone();
        bad_magic.extend_from_slice(b"nope-not-zstd");
        for file in [&whole, &torn, &bad_magic] {
            let in_line = reading(&mut Lines::new(ZstdInput::new(&file[..]), guard()));
            let ahead = std::thread::scope(|scope| {
                let Ok((source, thread)) = DecodeAhead::start(scope, ZstdInput::new(&file[..]))
                else {
                    panic!("the decompressing thread starts");
                };
                let ahead = reading(&mut Lines::new(source, guard()));
                assert!(thread.join().is_ok());
                ahead
            });
            assert_eq!(ahead, in_line);
            assert!(in_line.0.len() > 6_000);
        }
    }

    #[test]
    fn a_reader_that_stops_early_ends_the_decompressing_thread() {
        let mut file = frame(b"header\n");
        for _ in 0..2_000 {
            file.extend(frame("y".repeat(2_000).as_bytes()));
        }
        std::thread::scope(|scope| {
            let Ok((source, thread)) = DecodeAhead::start(scope, ZstdInput::new(&file[..])) else {
                panic!("the decompressing thread starts");
            };
            let mut lines = Lines::new(source, guard());
            assert!(matches!(lines.next(), Ok(LineRead::Line { .. })));
            drop(lines);
            assert!(thread.join().is_ok());
        });
    }

    #[test]
    fn a_line_past_the_limit_is_refused_as_the_in_memory_import_refuses_it() {
        let limits = ImportLimits {
            max_line_bytes: 4,
            max_plaintext_bytes: u64::MAX,
        };
        let mut lines = Lines::new(
            PlainInput::new(&b"abc\nabcdef\n"[..]),
            LineGuard::new(limits),
        );
        let refused = lines.next();
        let Err(Stop::Failed(ExchangeError::TooLarge { reason })) = refused else {
            panic!("line 1 is too long");
        };
        assert!(
            reason.starts_with("line 1 is longer than 4 bytes"),
            "{reason}"
        );
    }
}
