//! A session read streamed to JavaScript in chunks, so that the engine's walk and
//! JavaScript's `JSON.parse` run at the same time instead of one after the other.
//!
//! `NativeStore::open_read` starts a producer thread that walks the session's DSH lines
//! (`exchange::visit_dsh_lines`) and hands JSON array texts of about [`CHUNK_BYTES`] each
//! through a bounded channel; `NativeRead::next` takes the next one off a libuv worker.
//! Memory stays bounded by the channel ([`READ_AHEAD_CHUNKS`] chunks ahead of JavaScript),
//! not by the session's size, and a cold restore costs about the larger of the engine's and
//! JavaScript's parts instead of their sum.

use crate::{engine_error, panic_error, Shared};
use dshdb::exchange;
use napi::bindgen_prelude::*;
use napi::{Env, Task};
use napi_derive::napi;
use parking_lot::Mutex;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of DSH lines after which a chunk is handed over (a chunk ends at a line boundary,
/// so one longer line makes one longer chunk). Small enough that JavaScript starts parsing
/// within milliseconds, large enough that the per-chunk round trip is noise.
const CHUNK_BYTES: usize = 2 * 1024 * 1024;

/// Chunks the producer may run ahead of JavaScript: what bounds the read's memory.
const READ_AHEAD_CHUNKS: usize = 4;

/// What the producer sends: a chunk, the end with the engine's busy time, or why it stopped.
enum Message {
    Chunk { text: Vec<u8>, packed: bool },
    Done { engine_millis: f64 },
    Failed(Error),
}

/// One chunk for JavaScript: a JSON array text of DSH records, and whether any of them is a
/// packed chunk row (which DSH's `decodeStorageRecord` expands into several events).
#[napi(object)]
pub struct ReadChunk {
    pub lines: Buffer,
    pub packed: bool,
}

/// A session read in progress. `next()` resolves with the next chunk, then with `null` once
/// every line was handed over; `cancel()` stops the producer early (an aborted restore).
#[napi]
pub struct NativeRead {
    header: String,
    revision: String,
    torn: bool,
    receiver: Arc<Mutex<Option<Receiver<Message>>>>,
    engine_millis: Arc<Mutex<Option<f64>>>,
    /// Set by `cancel`; a `next()` still waiting drops the receiver when it wakes.
    cancelled: Arc<AtomicBool>,
}

#[napi]
impl NativeRead {
    /// The session header's JSON text (as of the read's start).
    #[napi(getter)]
    pub fn header(&self) -> String {
        self.header.clone()
    }

    /// The revision naming exactly the events this read returns.
    #[napi(getter)]
    pub fn revision(&self) -> String {
        self.revision.clone()
    }

    /// Whether the store's open discarded an unacknowledged tail of this session.
    #[napi(getter)]
    pub fn torn(&self) -> bool {
        self.torn
    }

    /// Milliseconds the producer spent walking the session, once the read has ended.
    #[napi(getter)]
    pub fn engine_millis(&self) -> Option<f64> {
        *self.engine_millis.lock()
    }

    /// The next chunk, or `null` at the end. Rejects with the engine's error if the walk
    /// failed (a damaged row, a closed store).
    #[napi(ts_return_type = "Promise<ReadChunk | null>")]
    pub fn next(&self) -> AsyncTask<NextChunkTask> {
        AsyncTask::new(NextChunkTask {
            receiver: self.receiver.clone(),
            engine_millis: self.engine_millis.clone(),
            cancelled: self.cancelled.clone(),
        })
    }

    /// Stops the read: dropping the receiver ends the producer at its next chunk, which
    /// releases its memory and its hold on the store. Never blocks the JavaScript thread: a
    /// `next()` still waiting on the channel drops the receiver itself when it wakes.
    #[napi]
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        if let Some(mut slot) = self.receiver.try_lock() {
            slot.take();
        }
    }
}

/// Waits for the producer's next message (off the JavaScript thread).
pub struct NextChunkTask {
    receiver: Arc<Mutex<Option<Receiver<Message>>>>,
    engine_millis: Arc<Mutex<Option<f64>>>,
    cancelled: Arc<AtomicBool>,
}

impl Task for NextChunkTask {
    type Output = Option<(Vec<u8>, bool)>;
    type JsValue = Option<ReadChunk>;

    fn compute(&mut self) -> Result<Self::Output> {
        let mut slot = self.receiver.lock();
        let Some(receiver) = slot.as_ref() else {
            return Ok(None);
        };
        // A closed channel without `Done` means the producer died without a word: say so
        // rather than return a silently short session.
        let message = receiver.recv().unwrap_or_else(|_| {
            Message::Failed(Error::new(
                Status::GenericFailure,
                "dshdb read ended before the session's last event",
            ))
        });
        if self.cancelled.load(Ordering::Acquire) {
            slot.take();
            return Ok(None);
        }
        match message {
            Message::Chunk { text, packed } => Ok(Some((text, packed))),
            Message::Done { engine_millis } => {
                *self.engine_millis.lock() = Some(engine_millis);
                slot.take();
                Ok(None)
            }
            Message::Failed(error) => {
                slot.take();
                Err(error)
            }
        }
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(output.map(|(text, packed)| ReadChunk {
            lines: text.into(),
            packed,
        }))
    }
}

/// Starts a streamed read of session `id` from seq `from` (`null` when the session is absent).
pub struct OpenReadTask {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: String,
    pub(crate) from: u64,
}

impl Task for OpenReadTask {
    type Output = Option<NativeRead>;
    type JsValue = Option<NativeRead>;

    fn compute(&mut self) -> Result<Self::Output> {
        let shared = &self.shared;
        shared.fresh()?;
        let summary = match shared.store.session(&self.id) {
            Ok(summary) => summary,
            Err(dshdb::Error::UnknownSession { .. }) => return Ok(None),
            Err(error) => return Err(engine_error(&error)),
        };
        // The length read here bounds the events read, so the revision names exactly them.
        let length = summary.events;
        let (sender, receiver) = sync_channel(READ_AHEAD_CHUNKS);
        let producer = Producer {
            shared: shared.clone(),
            id: self.id.clone(),
            from: self.from,
            to: length,
        };
        std::thread::Builder::new()
            .name("dshdb-read".to_owned())
            .spawn(move || producer.run(sender))
            .map_err(|error| engine_error(&error))?;
        Ok(Some(NativeRead {
            revision: shared.revision(&self.id, &summary.header_json, length),
            torn: shared.torn.lock().contains(&self.id),
            header: summary.header_json,
            receiver: Arc::new(Mutex::new(Some(receiver))),
            engine_millis: Arc::new(Mutex::new(None)),
            cancelled: Arc::new(AtomicBool::new(false)),
        }))
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(output)
    }
}

/// The walk on its own thread.
struct Producer {
    shared: Arc<Shared>,
    id: String,
    from: u64,
    to: u64,
}

/// Why the walk stopped early: JavaScript cancelled (nothing to report), or the engine failed.
enum Stop {
    Cancelled,
    Failed(Error),
}

impl Producer {
    fn run(self, sender: SyncSender<Message>) {
        let started = Instant::now();
        let walked = catch_unwind(AssertUnwindSafe(|| self.walk(&sender)));
        let message = match walked {
            Ok(Ok(())) => Message::Done {
                engine_millis: started.elapsed().as_secs_f64() * 1000.0,
            },
            Ok(Err(Stop::Cancelled)) => return,
            Ok(Err(Stop::Failed(error))) => Message::Failed(error),
            Err(panic) => Message::Failed(panic_error(panic.as_ref())),
        };
        // A receiver gone by now was cancelled: nobody is left to tell.
        let _ = sender.send(message);
    }

    fn walk(&self, sender: &SyncSender<Message>) -> std::result::Result<(), Stop> {
        let mut chunk = Chunk::default();
        let mut cancelled = false;
        let walked =
            exchange::visit_dsh_lines(&self.shared.store, &self.id, self.from, self.to, |line| {
                chunk.push(line.bytes, line.row);
                if chunk.text.len() >= CHUNK_BYTES && !chunk.send(sender) {
                    cancelled = true;
                    return Err(exchange::ExchangeError::Stopped);
                }
                Ok(())
            });
        if cancelled {
            return Err(Stop::Cancelled);
        }
        walked.map_err(|error| Stop::Failed(engine_error(&error)))?;
        if !chunk.is_empty() && !chunk.send(sender) {
            return Err(Stop::Cancelled);
        }
        Ok(())
    }
}

/// The JSON array text being gathered.
#[derive(Default)]
struct Chunk {
    text: Vec<u8>,
    packed: bool,
}

impl Chunk {
    fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    fn push(&mut self, line: &[u8], row: bool) {
        if self.text.is_empty() {
            self.text.reserve(CHUNK_BYTES + line.len() + 2);
            self.text.push(b'[');
        } else {
            self.text.push(b',');
        }
        self.text.extend_from_slice(line);
        self.packed |= row;
    }

    /// Closes the array and hands it over; `false` when JavaScript has cancelled the read.
    fn send(&mut self, sender: &SyncSender<Message>) -> bool {
        let mut text = std::mem::take(&mut self.text);
        text.push(b']');
        let packed = std::mem::replace(&mut self.packed, false);
        sender.send(Message::Chunk { text, packed }).is_ok()
    }
}
