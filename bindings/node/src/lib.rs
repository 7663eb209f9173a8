//! Node.js binding of the dshdb engine (napi-rs), the storage under
//! `@dshdb/dsh-session-persistence-dshdb`, DSH's persistence provider.
//!
//! It speaks only the engine's public facade. Events cross the boundary as DSH's own
//! `JSON.stringify` text (kept byte for byte, see [`lines`]) and come back as JSON array texts
//! of DSH's own lines, streamed in chunks ([`stream`]), so JavaScript builds fresh objects with
//! one `JSON.parse` per chunk while the engine reads the next. Session ids
//! are passed already mapped to store ids by the JavaScript side (lone surrogates cannot
//! cross as strings). Appends settle their promise from the binding's receipt thread once the
//! engine's group commit made them durable ([`receipts`]); no fsync runs on the event loop
//! or on a libuv worker.

mod holder;
mod lines;
mod receipts;
mod stream;

use dshdb::exchange;
use dshdb::{Durability, Options, PendingReceipt, SessionWriter, Store};
use napi::bindgen_prelude::*;
use napi::{Env, Task};
use napi_derive::napi;
use parking_lot::Mutex;
use receipts::{Job, ReceiptThread, Settle};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

/// Revision prefix: revisions name the store they come from.
const REVISION_SCHEME: &str = "dshdb";

/// A JavaScript error carrying an engine error's text (its cause chain included).
pub(crate) fn engine_error(error: &dyn std::error::Error) -> Error {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            let _ = write!(message, ": {text}");
        }
        source = cause.source();
    }
    Error::new(Status::GenericFailure, message)
}

/// A JavaScript error for a Rust panic caught at the boundary.
pub(crate) fn panic_error(panic: &(dyn std::any::Any + Send)) -> Error {
    let text = panic
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    Error::new(
        Status::GenericFailure,
        format!("dshdb native panic: {text}"),
    )
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Status::InvalidArg, message.into())
}

fn parse_durability(name: &str) -> Result<Durability> {
    match name {
        "sync" => Ok(Durability::Sync),
        "buffered" => Ok(Durability::Buffered),
        other => Err(invalid(format!(
            "durability must be \"sync\" or \"buffered\", got {other:?}"
        ))),
    }
}

/// A seq from JavaScript: a non-negative safe integer.
fn seq_from(value: i64, what: &str) -> Result<u64> {
    u64::try_from(value)
        .ok()
        .filter(|seq| *seq <= dshdb::session::MAX_SAFE_INTEGER)
        .ok_or_else(|| {
            invalid(format!(
                "{what} must be a non-negative safe integer, got {value}"
            ))
        })
}

/// The open store and the binding's state around it.
pub struct Shared {
    store: Store,
    /// The writer handle of every session this handle appended to.
    writers: Mutex<HashMap<String, SessionWriter>>,
    /// Sessions whose unacknowledged tail the open discarded, until `repair` clears them.
    torn: Mutex<HashSet<String>>,
    /// `dshdb:<device>:<inode>` of the store directory: stable across reopen and
    /// maintenance, distinct between stores.
    source: String,
    durability: Durability,
    receipts: Mutex<ReceiptThread>,
}

impl Shared {
    /// The revision of a session of `length` events: its store, its header (a deleted and
    /// recreated id differs), its length, and whether a torn marker is pending. Events are
    /// append-only, so nothing else changes what a session holds; maintenance changes none
    /// of these.
    fn revision(&self, id: &str, header_json: &str, length: u64) -> String {
        let header = crc32fast::hash(header_json.as_bytes());
        let torn = if self.torn.lock().contains(id) {
            ":torn"
        } else {
            ""
        };
        format!("{}:{header:08x}:{length}{torn}", self.source)
    }

    fn send(&self, job: Job) {
        self.receipts.lock().send(job);
    }

    /// Catches the catalog up on what other processes committed, in the shared mode (one
    /// load from shared memory when nothing is new); an exclusive store has nothing to see.
    fn fresh(&self) -> Result<()> {
        self.store
            .refresh()
            .map(|_| ())
            .map_err(|error| engine_error(&error))
    }
}

/// An open dshdb store.
#[napi]
pub struct NativeStore {
    shared: Arc<Mutex<Option<Arc<Shared>>>>,
}

/// Opens (or creates) the store in directory `path`.
#[napi(ts_return_type = "Promise<NativeStore>")]
/// With `shared`, other processes may open it too (format-spec/08-many-processes.md): each
/// session has one writer process at a time, and reads see the others' commits.
pub fn open_store(
    path: String,
    durability: String,
    shared: Option<bool>,
) -> Result<AsyncTask<OpenTask>> {
    Ok(AsyncTask::new(OpenTask {
        path,
        durability: parse_durability(&durability)?,
        shared: shared.unwrap_or(false),
    }))
}

pub struct OpenTask {
    path: String,
    durability: Durability,
    shared: bool,
}

impl Task for OpenTask {
    type Output = Arc<Shared>;
    type JsValue = NativeStore;

    fn compute(&mut self) -> Result<Self::Output> {
        let options = Options {
            durability: self.durability,
            shared: self.shared,
            ..Options::default()
        };
        let store = match Store::open(&self.path, options) {
            Ok(store) => store,
            Err(dshdb::Error::Locked { .. }) => {
                return Err(Error::new(
                    Status::GenericFailure,
                    holder::locked_message(&self.path),
                ))
            }
            Err(error) => return Err(engine_error(&error)),
        };
        let source = holder::store_source(&self.path)
            .map(|(device, inode)| format!("{REVISION_SCHEME}:{device:x}:{inode:x}"))
            .map_err(|error| engine_error(&error))?;
        let torn = store.torn_sessions().into_iter().collect();
        let receipts = ReceiptThread::start().map_err(|error| engine_error(&error))?;
        Ok(Arc::new(Shared {
            store,
            writers: Mutex::new(HashMap::new()),
            torn: Mutex::new(torn),
            source,
            durability: self.durability,
            receipts: Mutex::new(receipts),
        }))
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(NativeStore {
            shared: Arc::new(Mutex::new(Some(output))),
        })
    }
}

/// Exports a session as DSH JSONL bytes (`dshdb export`).
pub struct ExportTask {
    shared: Arc<Shared>,
    id: String,
}

impl Task for ExportTask {
    type Output = Option<Vec<u8>>;
    type JsValue = Option<Buffer>;

    fn compute(&mut self) -> Result<Self::Output> {
        self.shared.fresh()?;
        if self.shared.store.session(&self.id).is_err() {
            return Ok(None);
        }
        exchange::export_dsh_jsonl(&self.shared.store, &self.id)
            .map(Some)
            .map_err(|error| engine_error(&error))
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(output.map(Buffer::from))
    }
}

/// Imports one DSH session log (`session.jsonl` or `.jsonl.zstd` bytes).
pub struct ImportTask {
    shared: Arc<Shared>,
    bytes: Vec<u8>,
}

impl Task for ImportTask {
    type Output = String;
    type JsValue = String;

    fn compute(&mut self) -> Result<Self::Output> {
        let store = &self.shared.store;
        let report = if self.bytes.starts_with(&dshdb::exchange::ZSTD_MAGIC) {
            exchange::import_dsh_jsonl_zstd(store, &self.bytes)
        } else {
            exchange::import_dsh_jsonl(store, &self.bytes)
        };
        report
            .map(|report| report.session_id)
            .map_err(|error| engine_error(&error))
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> Result<Self::JsValue> {
        Ok(output)
    }
}

/// One maintenance pass.
pub struct MaintainTask {
    shared: Arc<Shared>,
}

impl Task for MaintainTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> Result<Self::Output> {
        self.shared
            .store
            .maintain()
            .map(|_| ())
            .map_err(|error| engine_error(&error))
    }

    fn resolve(&mut self, _env: Env, _output: Self::Output) -> Result<Self::JsValue> {
        Ok(())
    }
}

/// Drains the receipts, releases the writers and closes the store (final sync, lock freed).
pub struct CloseTask {
    shared: Option<Arc<Shared>>,
}

impl Task for CloseTask {
    type Output = ();
    type JsValue = ();

    fn compute(&mut self) -> Result<Self::Output> {
        let Some(shared) = self.shared.take() else {
            return Ok(());
        };
        shared.receipts.lock().stop();
        shared.writers.lock().clear();
        shared.store.close().map_err(|error| engine_error(&error))
    }

    fn resolve(&mut self, _env: Env, _output: Self::Output) -> Result<Self::JsValue> {
        Ok(())
    }
}

#[napi]
impl NativeStore {
    fn open(&self) -> Result<Arc<Shared>> {
        self.shared
            .lock()
            .clone()
            .ok_or_else(|| Error::new(Status::GenericFailure, "the dshdb store is closed"))
    }

    /// The session's revision, `null` when it is absent. Reads the catalog only.
    #[napi]
    pub fn revision(&self, id: String) -> Result<Option<String>> {
        let shared = self.open()?;
        shared.fresh()?;
        match shared.store.session(&id) {
            Ok(summary) => Ok(Some(shared.revision(
                &id,
                &summary.header_json,
                summary.events,
            ))),
            Err(dshdb::Error::UnknownSession { .. }) => Ok(None),
            Err(error) => Err(engine_error(&error)),
        }
    }

    /// Every session as `[[<header JSON>, "<revision>"], ...]` text, ordered by id. Reads
    /// the catalog only.
    #[napi]
    pub fn list(&self) -> Result<String> {
        let shared = self.open()?;
        shared.fresh()?;
        let sessions = shared.store.sessions();
        let mut text = String::with_capacity(sessions.len() * 160 + 2);
        text.push('[');
        for (index, session) in sessions.iter().enumerate() {
            if index > 0 {
                text.push(',');
            }
            text.push('[');
            text.push_str(&session.header_json);
            let revision = shared.revision(&session.id, &session.header_json, session.events);
            let _ = write!(text, ",\"{revision}\"]");
        }
        text.push(']');
        Ok(text)
    }

    /// Starts a streamed read of the events with seq ≥ `from` (a seek through the engine's
    /// seq index), in chunks that JavaScript parses while the engine reads the next ones
    /// ([`stream`]); `null` when the session is absent.
    #[napi(ts_return_type = "Promise<NativeRead | null>")]
    pub fn open_read(&self, id: String, from: i64) -> Result<AsyncTask<stream::OpenReadTask>> {
        Ok(AsyncTask::new(stream::OpenReadTask {
            shared: self.open()?,
            id,
            from: seq_from(from, "fromSeq")?,
        }))
    }

    /// Appends `lines` (DSH event JSON texts joined by newlines, seqs from `firstSeq`) as one
    /// atomic batch. With `header` the session is created by the same batch. The promise
    /// settles once the batch is durable (or written, with buffered durability).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn append<'env>(
        &self,
        env: &'env Env,
        id: String,
        header: Option<String>,
        first_seq: i64,
        lines: String,
    ) -> Result<Object<'env>> {
        let shared = self.open()?;
        let first_seq = seq_from(first_seq, "firstSeq")?;
        let pending = submit(&shared, &id, header.as_deref(), first_seq, &lines)?;
        settle_when_durable(env, &shared, pending)
    }

    /// Makes a crash repair durable: clears the session's torn marker (the torn tail itself
    /// was discarded when the store opened) and appends the closers, if any.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn repair<'env>(
        &self,
        env: &'env Env,
        id: String,
        first_seq: i64,
        closers: Option<String>,
    ) -> Result<Object<'env>> {
        let shared = self.open()?;
        let first_seq = seq_from(first_seq, "firstSeq")?;
        let pending = match closers.as_deref() {
            Some(lines) if !lines.is_empty() => Some(submit(&shared, &id, None, first_seq, lines)?),
            _ => None,
        };
        shared.torn.lock().remove(&id);
        match pending {
            Some(pending) => settle_when_durable(env, &shared, pending),
            None => {
                let (settle, promise) = env.create_deferred::<(), fn(Env) -> Result<()>>()?;
                settle.resolve(|_| Ok(()));
                Ok(promise)
            }
        }
    }

    /// The session as DSH JSONL text bytes (what `dshdb export` writes); `null` when absent.
    #[napi(ts_return_type = "Promise<Buffer | null>")]
    pub fn export_jsonl(&self, id: String) -> Result<AsyncTask<ExportTask>> {
        Ok(AsyncTask::new(ExportTask {
            shared: self.open()?,
            id,
        }))
    }

    /// Imports one DSH session log (plain or zstd bytes), validated as DSH's cold load
    /// does; resolves with the session id.
    #[napi(ts_return_type = "Promise<string>")]
    pub fn import_jsonl(&self, bytes: Buffer) -> Result<AsyncTask<ImportTask>> {
        Ok(AsyncTask::new(ImportTask {
            shared: self.open()?,
            bytes: bytes.to_vec(),
        }))
    }

    /// Runs the engine's maintenance once (seals write-ahead segments into run files and
    /// checkpoints the seq index). Revisions do not change.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn maintain(&self) -> Result<AsyncTask<MaintainTask>> {
        Ok(AsyncTask::new(MaintainTask {
            shared: self.open()?,
        }))
    }

    /// Closes the store: every pending append settles, the log is synced and the writer
    /// lock released. Later calls on this handle fail; closing twice is a no-op.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close(&self) -> AsyncTask<CloseTask> {
        AsyncTask::new(CloseTask {
            shared: self.shared.lock().take(),
        })
    }

    /// Test hook: a promise settled by a panic on the receipt thread (it must reject).
    #[napi(ts_return_type = "Promise<void>")]
    pub fn test_panic_on_receipt_thread<'env>(&self, env: &'env Env) -> Result<Object<'env>> {
        let shared = self.open()?;
        let (settle, promise) = env.create_deferred::<(), fn(Env) -> Result<()>>()?;
        shared.send(Job::Panic(settle));
        Ok(promise)
    }
}

/// Splits and submits one batch to the engine's commit queue without waiting.
fn submit(
    shared: &Shared,
    id: &str,
    header: Option<&str>,
    first_seq: u64,
    lines: &str,
) -> Result<PendingReceipt> {
    let stored =
        lines::split_batch(lines, first_seq).map_err(|error| invalid(error.to_string()))?;
    let events: Vec<_> = stored.iter().map(lines::StoredLine::as_new).collect();
    let mut writers = shared.writers.lock();
    if let Some(header) = header {
        if first_seq != 0 {
            return Err(invalid("a session's first batch must start at seq 0"));
        }
        let (writer, pending) = shared
            .store
            .submit_session_with_events(header, &events, shared.durability)
            .map_err(|error| engine_error(&error))?;
        writers.insert(id.to_string(), writer);
        return Ok(pending);
    }
    shared.fresh()?;
    let stored_next = shared
        .store
        .session(id)
        .map_err(|error| engine_error(&error))?
        .events;
    if stored_next != first_seq {
        return Err(invalid(format!(
            "append to \"{id}\" is stale: stored next seq is {stored_next}, the batch starts at {first_seq}"
        )));
    }
    let writer = match writers.entry(id.to_string()) {
        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
        std::collections::hash_map::Entry::Vacant(entry) => {
            let writer = shared
                .store
                .writer(id)
                .map_err(|error| engine_error(&error))?;
            entry.insert(writer)
        }
    };
    writer
        .submit_batch_as(&events, shared.durability)
        .map_err(|error| engine_error(&error))
}

/// A promise settled from the receipt thread once `pending` is durable.
fn settle_when_durable<'env>(
    env: &'env Env,
    shared: &Shared,
    pending: PendingReceipt,
) -> Result<Object<'env>> {
    let (settle, promise): (Settle, Object<'env>) = env.create_deferred()?;
    shared.send(Job::Receipt(pending, settle));
    Ok(promise)
}

/// Test hook: panics inside a synchronous call, which must throw, not end the process.
#[napi(catch_unwind)]
pub fn test_panic_sync() -> Result<()> {
    panic!("dshdb-node test hook: panic in a synchronous call");
}

/// Test hook, for a closed store: tears the last batch of the newest write-ahead segment as
/// a crash in the middle of its write would (its commit record cut short, the seal after
/// it gone) and drops the seq-index checkpoint so that the next open scans the segment.
/// Returns the bytes zeroed.
#[napi]
pub fn test_tear_last_batch(path: String, cut_bytes: u32) -> Result<u32> {
    holder::tear_last_batch(std::path::Path::new(&path), cut_bytes as usize)
        .map_err(|error| engine_error(&error))
}
