//! `Store` and `SessionWriter`: the only place that wires the layers together.

use crate::catalog::{
    collect_slices, header_id, Catalog, Extent, ExtentSlice, Position, Seed, SessionEntry,
};
use crate::commit::{
    new_salt, Durability, Log, LogOptions, SegmentContext, DEFAULT_MAX_BATCH_BYTES,
};
use crate::error::{Error, Result};
use crate::frame::{
    decode_frame, decode_run_frame, peek_frame, EventRecord, Record, EVENT_FIXED_BYTES,
    EVENT_FLAG_VERBATIM_LINE, KNOWN_EVENT_FLAGS, MAX_PAYLOAD_BYTES, NO_SEED_PARENT,
};
use crate::index::{
    encode_checkpoint, write_checkpoint, CoveredSegment, CHECKPOINT_FILE, CHECKPOINT_TEMP_FILE,
    INDEX_DIR,
};
use crate::io::fs::FsStorage;
use crate::io::{LockGuard, Storage, StorageFile};
use crate::manifest::{Manifest, RunEntry, SegmentEntry, MANIFEST_FILE, MANIFEST_TEMP_FILE};
use crate::recovery::{recover, LogTail, RecoveryReport, TornSegment};
use crate::run::{
    build_run, holds_dropped_events, parse_run_name, rebuild_run, run_path, BlockCache, BuiltRun,
    Retained, RunReader, RUNS_DIR,
};
use crate::segment::{
    check_header, create_segment, parse_segment_name, read_segment, segment_path,
    SEGMENT_HEADER_BYTES, WAL_DIR,
};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod processes;
pub use processes::{Subscription, FOLLOW_POLL};

/// The writer lock file.
pub const LOCK_FILE: &str = "LOCK";
/// Default preallocated segment size, in bytes (64 MiB).
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Default queued bytes above which appenders wait, in bytes (64 MiB).
pub const DEFAULT_MAX_PENDING_BYTES: usize = 64 * 1024 * 1024;
/// Largest `data` text of one event, in bytes: what fits in one record.
pub const MAX_EVENT_DATA_BYTES: usize = MAX_PAYLOAD_BYTES - EVENT_FIXED_BYTES - 4096;
/// Largest session header, in bytes.
pub const MAX_HEADER_BYTES: usize = 1024 * 1024;
/// Default bytes of decompressed run blocks kept in memory (64 MiB): bounds read memory
/// whatever the store's size.
pub const DEFAULT_BLOCK_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Largest event type name, in bytes.
pub const MAX_TYPE_BYTES: usize = 1024;
/// 2^53: JavaScript's safe integers (DSH's `createdAt`, `seq`, `time`) lie below it.
pub const MAX_SAFE_INTEGER_EXCLUSIVE: u64 = 1 << 53;
/// Envelope keys besides `type`, `seq`, `time` and `data` that an event may carry.
pub const ENVELOPE_KEYS: [&str; 3] = ["surfaceOp", "sourceEventSeqs", "ignorable"];

/// How to open a store.
#[derive(Debug, Clone)]
pub struct Options {
    /// Create the store when the directory holds none.
    pub create_if_missing: bool,
    /// Open without the writer lock; no writes, no repair.
    pub read_only: bool,
    /// Durability of appends that do not name one.
    pub durability: Durability,
    /// Preallocated size of one segment, in bytes.
    pub segment_bytes: u64,
    /// Queued bytes above which appenders wait, in bytes.
    pub max_pending_bytes: usize,
    /// Largest encoded batch accepted, in bytes; a batch larger than a segment gets a
    /// segment of its own.
    pub max_batch_bytes: u64,
    /// Bytes of decompressed run blocks the read cache may hold.
    pub block_cache_bytes: usize,
    /// Load the seq-index checkpoint at open (F-06-21). Off, the open decodes and checks
    /// every run and segment (`dshdb verify`), and costs O(store) instead of O(tail).
    pub use_checkpoint: bool,
    /// Run [`Store::maintain`] on a background thread this often; `None` (the default)
    /// leaves sealing to explicit `maintain` calls.
    pub maintenance_interval: Option<Duration>,
    /// Share the store with other writer processes on this host
    /// (format-spec/08-many-processes.md). Off (the default for now: the shared path is
    /// built but not yet covered by the crash enumeration), a writable open takes the store
    /// exclusively (F-01-2), as older builds do.
    pub shared: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            create_if_missing: true,
            read_only: false,
            durability: Durability::Sync,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            block_cache_bytes: DEFAULT_BLOCK_CACHE_BYTES,
            use_checkpoint: true,
            maintenance_interval: None,
            shared: false,
        }
    }
}

impl Options {
    /// `Batched` durability with the usual settings: sync within 5 ms or 1 MiB.
    pub fn batched() -> Durability {
        Durability::Batched {
            max_delay: Duration::from_millis(5),
            max_bytes: 1024 * 1024,
        }
    }
}

/// An event to append. `data` is JSON text, stored exactly as given.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    pub event_type: &'a str,
    /// Unix epoch milliseconds; `None` means now.
    pub time: Option<i64>,
    pub data: &'a str,
    /// Further envelope members as JSON object members without braces, in the order they are
    /// to be exported, e.g. `"sourceEventSeqs":[3],"surfaceOp":"append"`. Empty for none.
    /// With [`EVENT_FLAG_VERBATIM_LINE`] it holds the whole original line instead.
    pub envelope: &'a str,
    /// Event flags (`frame::EVENT_FLAG_*`): how an importer saw the event, for byte-exact export.
    pub flags: u8,
}

impl<'a> NewEvent<'a> {
    pub fn new(event_type: &'a str, data: &'a str) -> Self {
        NewEvent {
            event_type,
            time: None,
            data,
            envelope: "",
            flags: 0,
        }
    }
}

/// A stored event borrowed for the duration of a [`Store::visit_events`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventView<'a> {
    pub seq: u64,
    pub time: i64,
    pub event_type: &'a str,
    pub data: &'a str,
    pub envelope: &'a str,
    pub flags: u8,
}

impl EventView<'_> {
    /// The event as an owned [`Event`].
    pub fn to_event(&self) -> Event {
        Event {
            seq: self.seq,
            time: self.time,
            event_type: self.event_type.to_string(),
            data: self.data.to_string(),
            envelope: self.envelope.to_string(),
            flags: self.flags,
        }
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    pub time: i64,
    pub event_type: String,
    pub data: String,
    pub envelope: String,
    pub flags: u8,
}

impl Event {
    /// The event as one DSH JSONL line: `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`,
    /// or the original line when it was stored verbatim.
    pub fn to_json_line(&self) -> String {
        let mut line = String::with_capacity(
            self.data.len() + self.envelope.len() + self.event_type.len() + 64,
        );
        push_json_line(
            &mut line,
            &self.event_type,
            self.seq,
            self.time,
            &self.data,
            &self.envelope,
            self.flags,
        );
        line
    }
}

/// An event's text field, which must be UTF-8 (else corruption at its position).
fn event_text<'a>(field: &'a [u8], position: &Position) -> Result<&'a str> {
    std::str::from_utf8(field).map_err(|_| Error::Corrupt {
        segment: position.segment,
        offset: position.offset,
        reason: "event text is not UTF-8".to_string(),
    })
}

/// Appends an event's DSH JSONL line (without the newline) to `line`: the verbatim line when
/// it was stored so, else `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`.
fn push_json_line(
    line: &mut String,
    event_type: &str,
    seq: u64,
    time: i64,
    data: &str,
    envelope: &str,
    flags: u8,
) {
    use std::fmt::Write as _;
    if flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        line.push_str(envelope);
        return;
    }
    line.push_str("{\"type\":");
    let plain = |byte: u8| byte >= 0x20 && byte != b'"' && byte != b'\\';
    if event_type.bytes().all(plain) {
        // The common case (`assistant/chunk`): nothing to escape, no serializer needed.
        line.push('"');
        line.push_str(event_type);
        line.push('"');
    } else {
        line.push_str(&serde_json::Value::String(event_type.to_string()).to_string());
    }
    // Writing to a String cannot fail.
    let _ = write!(line, ",\"seq\":{seq},\"time\":{time},\"data\":");
    line.push_str(data);
    if !envelope.is_empty() {
        line.push(',');
        line.push_str(envelope);
    }
    line.push('}');
}

/// What an append returns: the seqs it got and whether they are durable yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub first_seq: u64,
    /// One past the last seq of the batch (the session's length after it).
    pub end_seq: u64,
    pub durable: bool,
}

/// A session as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    pub id: String,
    pub header_json: String,
    pub events: u64,
}

struct Inner {
    storage: Arc<dyn Storage>,
    options: Options,
    catalog: RwLock<Catalog>,
    log: Option<Log>,
    files: Mutex<HashMap<u64, Arc<dyn StorageFile>>>,
    salts: RwLock<HashMap<u64, u64>>,
    report: RecoveryReport,
    closed: Mutex<bool>,
    lock: Mutex<Option<Box<dyn LockGuard>>>,
    /// Live runs by id, as the manifest names them.
    run_entries: RwLock<HashMap<u64, RunEntry>>,
    /// Opened runs (index read, file mapped), by id.
    run_readers: Mutex<HashMap<u64, Arc<RunReader>>>,
    cache: BlockCache,
    /// One `maintain` at a time. It holds how many sessions were deleted when a pass last
    /// rewrote every run that needed it: until another deletion, no run needs it.
    maintaining: Mutex<Option<usize>>,
    /// Readers hold it shared from collecting positions to decoding them; a seal holds it
    /// exclusively while it moves positions from a segment to its run.
    read_gate: RwLock<()>,
    maintenance: Arc<MaintenanceSignal>,
    /// Many-process mode (format-spec/08): what this process shares with the others.
    processes: Option<processes::Processes>,
}

/// Stops the background maintenance thread.
#[derive(Default)]
struct MaintenanceSignal {
    stop: Mutex<bool>,
    wake: parking_lot::Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What one [`Store::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Segments rewritten as runs.
    pub segments_sealed: usize,
    /// Events moved into runs.
    pub events: u64,
    /// Bytes of the frames moved (uncompressed).
    pub raw_bytes: u64,
    /// Bytes of the run files written.
    pub run_bytes: u64,
    /// Events of deleted sessions left out of the runs (F-06-24), and their frame bytes:
    /// the space reclaimed from the write-ahead log.
    pub events_dropped: u64,
    pub bytes_reclaimed: u64,
    /// Runs rewritten without the events of deleted sessions (F-06-26); their bytes
    /// reclaimed count in `bytes_reclaimed`.
    pub runs_rewritten: usize,
}

/// Figures of [`Store::stats`], for the whole store or one session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Sessions counted (1 for one session).
    pub sessions: u64,
    /// Events, a fork's seed included for one session, every stored event for the store.
    pub events: u64,
    /// Events stored in runs, and in write-ahead segments.
    pub events_in_runs: u64,
    pub events_in_segments: u64,
    /// Run files (holding the session's events, for one session).
    pub runs: u64,
    /// Write-ahead segments (holding the session's events, for one session).
    pub segments: u64,
    /// Bytes on disk: every file of the store, or the session's run blocks and frames.
    pub bytes_on_disk: u64,
    /// Frame bytes of the events counted, uncompressed (the spans of their index extents:
    /// in write-ahead segments this includes the commit records between batches).
    pub raw_bytes: u64,
    /// Uncompressed over compressed bytes of the run blocks counted (0 without runs).
    pub run_compression_ratio: f64,
}

/// A file a new run takes the place of: a sealed segment or a run being rewritten.
struct Replaced {
    file: u64,
    path: String,
    dir: &'static str,
}

/// An open store. Cheap to clone; all clones share one store.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// The one writer of a session inside this process.
pub struct SessionWriter {
    store: Store,
    number: u32,
    id: String,
    durability: Durability,
    /// Ticket of the last batch queued: the lease is given back only once it is written.
    last_ticket: u64,
}

fn io_error(operation: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |error| Error::io(operation, error)
}

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Store {
    /// Opens (or creates) the store in directory `path` on the real file system.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<Store> {
        let path = path.as_ref();
        if options.create_if_missing && !options.read_only {
            std::fs::create_dir_all(path).map_err(io_error("store directory create"))?;
        }
        if !path.is_dir() {
            return Err(Error::NotAStore {
                path: path.to_path_buf(),
            });
        }
        Store::open_on(Arc::new(FsStorage::new(path)), options, path)
    }

    /// Opens a store on any storage (the simulator in tests). `label` names it in errors.
    pub fn open_on(storage: Arc<dyn Storage>, options: Options, label: &Path) -> Result<Store> {
        if options.shared && !options.read_only {
            return Store::open_shared(storage, options, label);
        }
        let follower = if options.read_only && options.shared {
            processes::follow_read_only(&storage, &options)?
        } else {
            None
        };
        if let Some((recovered, processes)) = follower {
            let manifest = processes.manifest();
            return Ok(Store::assemble(
                storage,
                options,
                &manifest,
                recovered,
                None,
                None,
                Some(processes),
            ));
        }
        let lock = if options.read_only {
            None
        } else {
            let guard = storage.try_lock(LOCK_FILE).map_err(io_error("lock"))?;
            Some(guard.ok_or_else(|| Error::Locked {
                path: label.to_path_buf(),
            })?)
        };
        let manifest = match Manifest::read(storage.as_ref())? {
            Some(manifest) => manifest,
            None if options.create_if_missing && !options.read_only => {
                create_store(storage.as_ref(), label)?
            }
            None => {
                return Err(Error::NotAStore {
                    path: label.to_path_buf(),
                })
            }
        };
        let mut recovered = recover(storage.as_ref(), &manifest, options.use_checkpoint)?;
        let log = if options.read_only {
            None
        } else {
            remove_orphans(storage.as_ref(), &manifest, &mut recovered.report)?;
            Some(
                start_log(
                    &storage,
                    &options,
                    manifest.clone(),
                    recovered.tail.clone(),
                    None,
                )?
                .0,
            )
        };
        let store = Store::assemble(storage, options, &manifest, recovered, log, lock, None);
        store.after_open();
        Ok(store)
    }

    /// Opens the store as one of many writer processes (F-08-4).
    fn open_shared(storage: Arc<dyn Storage>, options: Options, label: &Path) -> Result<Store> {
        let opened = processes::open_shared_writer(&storage, &options, label)?;
        let store = Store::assemble(
            storage,
            options,
            &opened.manifest,
            opened.recovered,
            Some(opened.log),
            None,
            Some(opened.processes),
        );
        // The log's catch-up reaches the catalog through this (the log exists first).
        let _ = opened.inner_cell.set(Arc::downgrade(&store.inner));
        store.after_open();
        Ok(store)
    }

    fn assemble(
        storage: Arc<dyn Storage>,
        options: Options,
        manifest: &Manifest,
        recovered: crate::recovery::Recovered,
        log: Option<Log>,
        lock: Option<Box<dyn LockGuard>>,
        processes: Option<processes::Processes>,
    ) -> Store {
        let salts = manifest
            .segments
            .iter()
            .map(|entry| (entry.id, entry.salt))
            .collect();
        let run_entries = manifest.runs.iter().map(|run| (run.id, *run)).collect();
        let cache = BlockCache::new(options.block_cache_bytes);
        Store {
            inner: Arc::new(Inner {
                storage,
                options,
                catalog: RwLock::new(recovered.catalog),
                log,
                files: Mutex::new(HashMap::new()),
                salts: RwLock::new(salts),
                report: recovered.report,
                closed: Mutex::new(false),
                lock: Mutex::new(lock),
                run_entries: RwLock::new(run_entries),
                run_readers: Mutex::new(HashMap::new()),
                cache,
                maintaining: Mutex::new(None),
                read_gate: RwLock::new(()),
                maintenance: Arc::new(MaintenanceSignal::default()),
                processes,
            }),
        }
    }

    /// A fresh checkpoint when the open could not use one, and the maintenance thread.
    fn after_open(&self) {
        let inner = &self.inner;
        let write_fresh_checkpoint = !inner.report.checkpoint_used
            && !inner.run_entries.read().is_empty()
            && inner.processes.is_none();
        let interval = inner.options.maintenance_interval;
        let store = self;
        if store.inner.log.is_some() {
            if write_fresh_checkpoint {
                // Derived data (F-06-22): a failure here only costs the next open a rebuild.
                let _ = store.write_runs_checkpoint();
            }
            if let Some(interval) = interval {
                store.start_maintenance_thread(interval);
            }
        }
    }

    fn start_maintenance_thread(&self, interval: Duration) {
        let weak = Arc::downgrade(&self.inner);
        let signal = self.inner.maintenance.clone();
        let thread_signal = signal.clone();
        let spawned = std::thread::Builder::new()
            .name("dshdb-maintenance".to_string())
            .spawn(move || loop {
                {
                    let mut stop = thread_signal.stop.lock();
                    if !*stop {
                        thread_signal.wake.wait_for(&mut stop, interval);
                    }
                    if *stop {
                        return;
                    }
                }
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                // Errors poison the log or are retried next time; appenders see them.
                let _ = (Store { inner }).maintain();
            });
        if let Ok(handle) = spawned {
            *signal.thread.lock() = Some(handle);
        }
    }

    fn stop_maintenance_thread(&self) {
        let signal = &self.inner.maintenance;
        *signal.stop.lock() = true;
        signal.wake.notify_all();
        let handle = signal.thread.lock().take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    /// Rewrites every sealed write-ahead segment into a run file (F-06-10), oldest first,
    /// then checkpoints the seq index. Crash-safe at every step: the segment is removed only
    /// after the run file and the manifest naming it are durable.
    pub fn maintain(&self) -> Result<MaintenanceReport> {
        let log = self.log()?;
        let mut reclaimed_at = self.inner.maintaining.lock();
        // One process at a time (F-08-12); another one's pass makes this one unneeded.
        let Some(_maintenance_turn) = self.maintenance_turn()? else {
            return Ok(MaintenanceReport::default());
        };
        let mut report = MaintenanceReport::default();
        // With only the segment taking appends nothing is sealed, nothing to flush for.
        if log.manifest().segments.len() >= 2 {
            // Makes the seal of every rolled segment durable (it is queued with the roll).
            log.flush()?;
            while let Some(segment) = log.oldest_sealed_segment() {
                self.seal_segment(log, segment, &mut report)?;
            }
        }
        // Tombstones are durable before the catalog marks a session deleted, so dropping
        // its sealed events here never outruns its deletion.
        self.reclaim_runs(log, &mut reclaimed_at, &mut report)?;
        if report.segments_sealed > 0 || report.runs_rewritten > 0 {
            // Once per maintain, not per segment: the checkpoint covers the whole catalog,
            // and an older one stays valid for the runs it names (F-06-21).
            // Derived data (F-06-22): a failure only costs the next open a replay of runs.
            let _ = self.write_runs_checkpoint();
        }
        Ok(report)
    }

    fn seal_segment(
        &self,
        log: &Log,
        segment: SegmentEntry,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let storage = self.inner.storage.as_ref();
        let bytes = read_segment(storage, segment.id)?;
        check_header(&bytes, segment.id, segment.salt)?;
        let run_id = log.allocate_file_id()?;
        let retained = self.inner.catalog.read().retained_prefixes();
        let built = build_run(
            &bytes,
            segment.id,
            segment.salt,
            run_id,
            new_salt(),
            &retained,
        )?;
        // A segment without any record (a clean reopen's fresh segment, closed unused)
        // needs no run: it is dropped from the manifest (F-06-14).
        let run = (built.raw_bytes > 0).then_some(built.entry);
        let replaced = Replaced {
            file: segment.id,
            path: segment_path(segment.id),
            dir: WAL_DIR,
        };
        self.put_run_in_place_of(replaced, run, &built, &retained, || {
            log.replace_segment_with_run(segment.id, run)
        })?;
        report.segments_sealed += 1;
        report.events += built.events;
        report.raw_bytes += built.raw_bytes;
        report.run_bytes += run.map_or(0, |run| run.file_bytes);
        report.events_dropped += built.dropped_events;
        report.bytes_reclaimed += built.dropped_bytes;
        Ok(())
    }

    /// Rewrites every run that holds events of deleted sessions no live fork reads
    /// (F-06-26): the new run durable, then the manifest naming it in the old one's place,
    /// then the old file removed. A crash leaves one of the two an orphan (F-06-11).
    fn reclaim_runs(
        &self,
        log: &Log,
        reclaimed_at: &mut Option<usize>,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let retained = self.inner.catalog.read().retained_prefixes();
        if retained.is_empty() || *reclaimed_at == Some(retained.len()) {
            return Ok(());
        }
        for old in log.manifest().runs {
            let Some(reader) = self.run_reader(old.id)? else {
                continue;
            };
            if !holds_dropped_events(&reader.index, &retained) {
                continue;
            }
            let run_id = log.allocate_file_id()?;
            let built = rebuild_run(&reader, run_id, new_salt(), &retained)?;
            drop(reader);
            let replaced = Replaced {
                file: old.id,
                path: run_path(old.id),
                dir: RUNS_DIR,
            };
            self.put_run_in_place_of(replaced, Some(built.entry), &built, &retained, || {
                log.replace_run(old.id, built.entry)
            })?;
            report.runs_rewritten += 1;
            report.events_dropped += built.dropped_events;
            report.bytes_reclaimed += old.file_bytes.saturating_sub(built.entry.file_bytes);
        }
        *reclaimed_at = Some(retained.len());
        Ok(())
    }

    /// The shared steps of sealing and of rewriting a run (F-06-10, F-06-26): the new run
    /// durable, then the manifest naming it (`swap_manifest`), then the catalog pointed at
    /// it, then the replaced file removed. A failure before the manifest leaves the new run
    /// an orphan, removed here or at the next open (F-06-11).
    fn put_run_in_place_of(
        &self,
        replaced: Replaced,
        run: Option<RunEntry>,
        built: &BuiltRun,
        retained: &Retained,
        swap_manifest: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let storage = self.inner.storage.as_ref();
        self.check_moves(replaced.file, &built.moved)?;
        if let Some(run) = run {
            write_run_file(storage, run.id, &built.bytes)?;
        }
        if let Err(error) = swap_manifest() {
            let poisoned = self.log().map_or(true, |log| log.poisoned().is_some());
            if let (false, Some(run)) = (poisoned, run) {
                // The old manifest is in force: the run file is an orphan either way.
                let _ = storage.remove(&run_path(run.id));
            }
            return Err(error);
        }
        self.move_positions(replaced.file, run, &built.moved, retained)?;
        storage
            .remove(&replaced.path)
            .map_err(io_error("sealed file remove"))?;
        storage
            .sync_dir(replaced.dir)
            .map_err(io_error("directory sync"))
    }

    /// Every event of the run must be indexed in the segment it came from.
    fn check_moves(&self, segment: u64, moved: &[(u32, u64, Extent)]) -> Result<()> {
        let catalog = self.inner.catalog.read();
        for (session, first_seq, extent) in moved {
            let indexed_here = catalog.sessions.get(session).is_some_and(|entry| {
                first_seq
                    .checked_sub(entry.seed_length())
                    .is_some_and(|first| {
                        (first..first + u64::from(extent.count))
                            .all(|index| entry.events.file_of(index) == Some(segment))
                    })
            });
            if !indexed_here {
                return Err(Error::Corrupt {
                    segment,
                    offset: 0,
                    reason: format!(
                        "events from {first_seq} of session {session} are not indexed here"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Points the catalog at the run instead of the segment or the run it replaces (under
    /// the read gate, so no reader holds extents of the old file any more when it is
    /// removed).
    /// Deleted sessions lose the events past what they retain: those events were left
    /// out of the run (F-06-24) and nothing reads them any more.
    fn move_positions(
        &self,
        segment: u64,
        run: Option<RunEntry>,
        moved: &[(u32, u64, Extent)],
        retained: &Retained,
    ) -> Result<()> {
        let inner = &self.inner;
        let _no_readers = inner.read_gate.write();
        let mut catalog = inner.catalog.write();
        for (number, kept) in retained {
            if let Some(entry) = catalog.sessions.get_mut(number) {
                let own_kept = kept.saturating_sub(entry.seed_length());
                entry.events.truncate(own_kept);
            }
        }
        let mut by_session: HashMap<u32, Vec<(u64, Extent)>> = HashMap::new();
        for (session, first_seq, extent) in moved {
            by_session
                .entry(*session)
                .or_default()
                .push((*first_seq, *extent));
        }
        for entry in catalog.sessions.values_mut() {
            let mut replacement = by_session.remove(&entry.number).unwrap_or_default();
            for (first, _) in &mut replacement {
                *first -= entry.seed_length();
            }
            entry
                .events
                .replace_file(segment, &replacement)
                .map_err(|reason| Error::Corrupt {
                    segment,
                    offset: 0,
                    reason,
                })?;
        }
        if let Some(run) = run {
            for entry in catalog.sessions.values_mut() {
                if entry.defined_in == Some(segment) {
                    entry.defined_in = Some(run.id);
                }
            }
            inner.run_entries.write().insert(run.id, run);
        }
        inner.files.lock().remove(&segment);
        inner.salts.write().remove(&segment);
        inner.run_entries.write().remove(&segment);
        inner.run_readers.lock().remove(&segment);
        Ok(())
    }

    /// Checkpoints the seq index as of the runs (F-06-20).
    fn write_runs_checkpoint(&self) -> Result<()> {
        let Some(log) = &self.inner.log else {
            return Ok(());
        };
        let manifest = log.manifest();
        let bytes = encode_checkpoint(&self.inner.catalog.read(), &manifest.runs, &[]);
        write_checkpoint(self.inner.storage.as_ref(), &bytes)
    }

    /// Checkpoints the seq index as of every run and segment, after a clean close sealed
    /// them all (F-06-20).
    fn write_closing_checkpoint(&self, log: &Log) -> Result<()> {
        let manifest = if self.is_shared() {
            // Others may have sealed since this process's log last read it.
            Manifest::read(self.inner.storage.as_ref())?.unwrap_or_else(|| log.manifest())
        } else {
            log.manifest()
        };
        let mut covered = Vec::with_capacity(manifest.segments.len());
        for segment in &manifest.segments {
            let end = self
                .inner
                .storage
                .open_read(&segment_path(segment.id))
                .and_then(|file| file.len())
                .map_err(io_error("segment length"))?;
            covered.push(CoveredSegment {
                id: segment.id,
                salt: segment.salt,
                end,
            });
        }
        let bytes = encode_checkpoint(&self.inner.catalog.read(), &manifest.runs, &covered);
        write_checkpoint(self.inner.storage.as_ref(), &bytes)
    }

    /// The store's directory (derived files above the log, `cache/` and `spill/`, live there).
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.inner.storage.clone()
    }

    /// Whether the store was opened read-only (no writes of any kind, derived files included).
    pub fn is_read_only(&self) -> bool {
        self.inner.options.read_only
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    fn log(&self) -> Result<&Log> {
        if *self.inner.closed.lock() {
            return Err(Error::Closed);
        }
        self.inner.log.as_ref().ok_or(Error::ReadOnly)
    }

    /// Creates a session from its DSH header (JSON text, kept verbatim) and returns its writer.
    pub fn create_session(&self, header_json: &str) -> Result<SessionWriter> {
        self.create_session_with(header_json, self.inner.options.durability)
    }

    /// Creates a session with a minimal DSH header `{"version":0,"id":..,"createdAt":now}`.
    pub fn create_session_with_id(&self, id: &str) -> Result<SessionWriter> {
        let header = serde_json::json!({"version": 0, "id": id, "createdAt": now_millis()});
        self.create_session(&header.to_string())
    }

    /// Creates a session and commits its header together with `events` as one atomic batch:
    /// after a crash either the session exists with all of them or not at all.
    pub fn create_session_with_events(
        &self,
        header_json: &str,
        events: &[NewEvent<'_>],
    ) -> Result<SessionWriter> {
        self.create_with_seed(header_json, None, events, self.inner.options.durability)
    }

    fn create_session_with(
        &self,
        header_json: &str,
        durability: Durability,
    ) -> Result<SessionWriter> {
        self.create_with_seed(header_json, None, &[], durability)
    }

    /// Creates a session (optionally a fork sharing `seed`) and commits its header together
    /// with `initial` events as one batch.
    fn create_with_seed(
        &self,
        header_json: &str,
        seed: Option<Seed>,
        initial: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<SessionWriter> {
        self.log()?;
        let id = validate_header(header_json)?;
        for event in initial {
            validate_event(event)?;
        }
        // Another process may be creating the same id: its lease decides (F-08-10).
        let leased = self.lease_and_refresh(&id)?;
        let release = |store: &Store| {
            if leased {
                store.release_lease(&id);
            }
        };
        if self.inner.catalog.read().by_id.contains_key(&id) {
            release(self);
            return Err(Error::DuplicateSession { id });
        }
        let target = BatchTarget::Create {
            id: &id,
            seed,
            header_json,
        };
        let (pending, number) = match self.commit_batch(target, initial, durability) {
            Ok(queued) => queued,
            Err(error) => {
                release(self);
                return Err(error);
            }
        };
        let writer = SessionWriter {
            store: self.clone(),
            number,
            id,
            durability,
            last_ticket: pending.ticket,
        };
        if let Err(error) = pending.wait() {
            // Not written: forget the reservation. Otherwise (a poisoned log) the outcome
            // is unknown and the next open decides.
            if matches!(
                error,
                Error::TooLarge { .. } | Error::DiskFull { .. } | Error::Closed | Error::Io { .. }
            ) {
                self.inner.catalog.write().unreserve_session(number);
            }
            return Err(error);
        }
        Ok(writer)
    }

    /// Forks `parent` after seq `at` (inclusive) into a new session `child` (DSH `fork`): the
    /// child's header names the parent and `seedLength = at + 1`; its first events are read
    /// from the parent, never copied; a `session/end-seed` event follows them.
    pub fn fork(&self, parent: &str, at: u64, child: &str) -> Result<SessionWriter> {
        self.log()?;
        if self.session(child).is_ok() {
            return Err(Error::DuplicateSession {
                id: child.to_string(),
            });
        }
        let parent_summary = self.session(parent)?;
        if at >= parent_summary.events {
            return Err(Error::SeqOutOfRange {
                id: parent.to_string(),
                seq: at,
                length: parent_summary.events,
            });
        }
        let seed_events = self.read(parent, 0, at + 1)?;
        if let Some(open_turn) = open_turn_at_end(&seed_events) {
            return Err(Error::invalid(format!(
                "fork boundary {at} in session \"{parent}\" ends inside open turn {open_turn}"
            )));
        }
        let parent_number = self.with_session(parent, |entry| entry.number)?;
        let mut header = serde_json::Map::new();
        header.insert("version".into(), 0.into());
        header.insert("id".into(), child.into());
        header.insert("createdAt".into(), now_millis().into());
        let parent_header: serde_json::Value =
            serde_json::from_str(&parent_summary.header_json).unwrap_or_default();
        if let Some(cwd) = parent_header.get("cwd") {
            header.insert("cwd".into(), cwd.clone());
        }
        header.insert("parentSession".into(), parent.into());
        header.insert("seedLength".into(), (at + 1).into());
        let header_json = serde_json::Value::Object(header).to_string();
        let seed = Some(Seed {
            parent: parent_number,
            length: at + 1,
        });
        let ends_with_marker = seed_events
            .last()
            .is_some_and(|event| event.event_type == END_SEED_TYPE);
        let marker = NewEvent::new(END_SEED_TYPE, "{}");
        let initial: &[NewEvent<'_>] = if ends_with_marker { &[] } else { &[marker] };
        self.create_with_seed(&header_json, seed, initial, self.inner.options.durability)
    }

    /// Commits `events` (possibly none, for a new session's header) to a session. Session
    /// and type numbers are taken inside the log's encoder, after it caught up on what
    /// other processes published (F-08-6 step 4), so that no two processes pick the same.
    fn commit_batch(
        &self,
        target: BatchTarget<'_>,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<(PendingReceipt, u32)> {
        let inner = &self.inner;
        let log = self.log()?;
        let header_bytes = match &target {
            BatchTarget::Create { header_json, .. } => header_json.len(),
            BatchTarget::Session(number) => inner
                .catalog
                .read()
                .sessions
                .get(number)
                .map_or(MAX_HEADER_BYTES, |entry| entry.header_json.len()),
        };
        check_batch_estimate(header_bytes, events, inner.options.max_batch_bytes)?;
        let now = now_millis();
        let mut reserved: Option<u32> = None;
        let submitted = log.submit(durability, |context, out| {
            let (number, type_numbers, first_seq, seed, header_json) = {
                let mut catalog = inner.catalog.write();
                let number = target.number(&mut catalog, &mut reserved)?;
                let type_numbers: Vec<u32> = events
                    .iter()
                    .map(|event| catalog.intern_type(event.event_type))
                    .collect();
                let entry = catalog
                    .sessions
                    .get(&number)
                    .ok_or_else(|| Error::invalid("session vanished"))?;
                (
                    number,
                    type_numbers,
                    entry.length(),
                    entry.seed,
                    entry.header_json.clone(),
                )
            };
            encode_header_if_new(context, out, number, seed, &header_json);
            for (event, type_number) in events.iter().zip(&type_numbers) {
                if context.defined_types.insert(*type_number) {
                    Record::TypeDefinition {
                        type_number: *type_number,
                        name: event.event_type.as_bytes(),
                    }
                    .encode(out, context.salt);
                }
            }
            let mut positions = Vec::with_capacity(events.len());
            for (index, (event, type_number)) in events.iter().zip(&type_numbers).enumerate() {
                let start = out.len();
                EventRecord {
                    session: number,
                    seq: first_seq + index as u64,
                    time: event.time.unwrap_or(now),
                    type_number: *type_number,
                    flags: event.flags,
                    data: event.data.as_bytes(),
                    envelope: event.envelope.as_bytes(),
                }
                .encode(out, context.salt);
                positions.push(Position {
                    segment: context.segment,
                    offset: context.base_offset + start as u64,
                    frame_bytes: u32::try_from(out.len() - start).unwrap_or(u32::MAX),
                });
            }
            let count = u32::try_from(events.len()).unwrap_or(u32::MAX);
            encode_commit(context, out, number, first_seq, count);
            Ok((number, first_seq, positions))
        });
        let (submitted, (number, first_seq, positions)) = match submitted {
            Ok(submitted) => submitted,
            Err(error) => {
                // Refused before anything was queued: forget the reservation.
                if let Some(number) = reserved {
                    inner.catalog.write().unreserve_session(number);
                }
                return Err(error);
            }
        };
        if let Some(entry) = inner.catalog.write().sessions.get_mut(&number) {
            for position in positions {
                entry.events.push_frame(position);
            }
            entry.defined_in.get_or_insert(submitted.segment);
        }
        let pending = PendingReceipt {
            store: self.clone(),
            ticket: submitted.ticket,
            first_seq,
            end_seq: first_seq + events.len() as u64,
            durability,
        };
        Ok((pending, number))
    }

    /// Deletes session `id` (F-02-18): logs a tombstone and returns once it is durable.
    /// Afterwards the session is gone from [`Store::sessions`], reads and [`Store::writer`]
    /// (`UnknownSession`) and its id may name a new session. Its events are dropped at the
    /// next sealing, except the prefix a live fork reads as its seed (F-06-24).
    /// A session whose writer handle is alive is refused (`SessionBusy`), changing nothing.
    pub fn delete_session(&self, id: &str) -> Result<()> {
        let log = self.log()?;
        let leased = self.lease_and_refresh(id)?;
        let outcome = self.delete_leased(log, id);
        if leased {
            self.release_lease(id);
        }
        outcome
    }

    fn delete_leased(&self, log: &Log, id: &str) -> Result<()> {
        let (number, header_json, seed, length) = {
            let mut catalog = self.inner.catalog.write();
            // Holds off writers and a second delete while the tombstone is on its way.
            let (number, entry) = claim_writer_slot(&mut catalog, id)?;
            (
                number,
                entry.header_json.clone(),
                entry.seed,
                entry.length(),
            )
        };
        let durable = log
            .submit(Durability::Sync, |context, out| {
                // A batch's commit must name a session its segment defines (F-05-1).
                encode_header_if_new(context, out, number, seed, &header_json);
                Record::Tombstone { session: number }.encode(out, context.salt);
                encode_commit(context, out, number, length, 0);
                Ok(())
            })
            .and_then(|(submitted, ())| log.wait(submitted.ticket, true));
        let mut catalog = self.inner.catalog.write();
        match durable {
            Ok(()) => catalog.delete_session(number).map_err(Error::invalid),
            Err(error) => {
                // Not acknowledged: the session stays (the next open decides if the
                // tombstone made it to disk).
                if let Some(entry) = catalog.sessions.get_mut(&number) {
                    entry.has_writer = false;
                }
                Err(error)
            }
        }
    }

    /// Takes the writer handle of an existing session.
    /// With other processes, the session's lease is taken first (`SessionBusy` naming the
    /// holder's pid while another process writes it) and the catalog catches up, so that
    /// appends continue after every event the previous holder committed (F-08-10).
    pub fn writer(&self, id: &str) -> Result<SessionWriter> {
        self.log()?;
        let leased = self.lease_and_refresh(id)?;
        let claimed =
            claim_writer_slot(&mut self.inner.catalog.write(), id).map(|(number, _)| number);
        match claimed {
            Ok(number) => Ok(SessionWriter {
                store: self.clone(),
                number,
                id: id.to_string(),
                durability: self.inner.options.durability,
                last_ticket: 0,
            }),
            Err(error) => {
                if leased {
                    self.release_lease(id);
                }
                Err(error)
            }
        }
    }

    /// Every session, ordered by id.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let catalog = self.inner.catalog.read();
        let mut list: Vec<SessionSummary> = catalog
            .sessions
            .values()
            .filter(|entry| !entry.deleted)
            .map(|entry| SessionSummary {
                id: entry.id.clone(),
                header_json: entry.header_json.to_string(),
                events: entry.length(),
            })
            .collect();
        list.sort_by(|left, right| left.id.cmp(&right.id));
        list
    }

    /// One session's summary.
    pub fn session(&self, id: &str) -> Result<SessionSummary> {
        self.with_session(id, |entry| SessionSummary {
            id: entry.id.clone(),
            header_json: entry.header_json.to_string(),
            events: entry.length(),
        })
    }

    fn with_session<T>(&self, id: &str, read: impl FnOnce(&SessionEntry) -> T) -> Result<T> {
        let catalog = self.inner.catalog.read();
        let number = catalog
            .by_id
            .get(id)
            .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
        let entry = catalog
            .sessions
            .get(number)
            .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
        Ok(read(entry))
    }

    /// The events with seq in `from..to` (clamped to the session's length).
    pub fn read(&self, id: &str, from: u64, to: u64) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        self.visit_events(id, from, to, |event| {
            events.push(event.to_event());
            Ok(())
        })?;
        Ok(events)
    }

    /// Calls `visit` with every event of `from..to` in seq order (clamped to the session's
    /// length), borrowed from the store's buffers: nothing is copied per event. An error
    /// from `visit` stops the walk and is returned.
    pub fn visit_events(
        &self,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventView<'_>) -> Result<()>,
    ) -> Result<()> {
        self.for_each_event(id, from, to, |event, event_type, position| {
            visit(&EventView {
                seq: event.seq,
                time: event.time,
                event_type,
                data: event_text(event.data, position)?,
                envelope: event_text(event.envelope, position)?,
                flags: event.flags,
            })
        })
    }

    /// Appends the DSH JSONL lines (each ending in `\n`) of the events with seq in
    /// `from..to` to `out`, without building [`Event`]s; returns how many were written.
    pub fn read_json_lines(&self, id: &str, from: u64, to: u64, out: &mut String) -> Result<u64> {
        let mut count = 0;
        self.for_each_event(id, from, to, |event, event_type, position| {
            let data = event_text(event.data, position)?;
            let envelope = event_text(event.envelope, position)?;
            push_json_line(
                out,
                event_type,
                event.seq,
                event.time,
                data,
                envelope,
                event.flags,
            );
            out.push('\n');
            count += 1;
            Ok(())
        })?;
        Ok(count)
    }

    /// Calls `visit` with every event of `from..to` in seq order, its type name and its
    /// position (for [`event_text`]).
    fn for_each_event(
        &self,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        // A file another process's maintenance removed is read again from where the walk
        // stopped, after a refresh (F-08-12).
        let mut next = from;
        self.retry_unlinked(|| {
            self.for_each_event_once(id, next, to, |event, event_type, position| {
                visit(event, event_type, position)?;
                next = event.seq + 1;
                Ok(())
            })
        })
    }

    fn for_each_event_once(
        &self,
        id: &str,
        from: u64,
        to: u64,
        mut visit: impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        let _positions_stay_valid = self.inner.read_gate.read();
        let (slices, types) = {
            let catalog = self.inner.catalog.read();
            let number = *catalog
                .by_id
                .get(id)
                .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
            let mut slices = Vec::new();
            collect_slices(&catalog, number, from, to, &mut slices);
            (slices, catalog.type_names.clone())
        };
        for slice in &slices {
            self.walk_slice(slice, &types, &mut visit)?;
        }
        Ok(())
    }

    /// Walks the frames of one extent: steps over frames that are not the session's
    /// events, and over the first `skip` of its events, then decodes (checksums included)
    /// and visits `take` events, each checked to be of the session and the expected seq
    /// (F-06-23: an index that disagrees with the file is corruption).
    fn walk_slice(
        &self,
        slice: &ExtentSlice,
        types: &HashMap<u32, String>,
        visit: &mut impl FnMut(&EventRecord<'_>, &str, &Position) -> Result<()>,
    ) -> Result<()> {
        let extent = slice.extent;
        let (bytes, base, in_run) = self.extent_bytes(&extent)?;
        let corrupt = |offset: u64, reason: &str| Error::Corrupt {
            segment: extent.file,
            offset,
            reason: reason.to_string(),
        };
        let span_end = usize::try_from(extent.end() - base).unwrap_or(usize::MAX);
        let span = bytes
            .get(..span_end)
            .ok_or_else(|| corrupt(extent.offset, "extent past its bytes"))?;
        let mut at = usize::try_from(extent.offset - base).unwrap_or(usize::MAX);
        let mut seen = 0u32;
        let mut last_type: Option<(u32, &str)> = None;
        let wanted = slice.skip.saturating_add(slice.take);
        while seen < wanted {
            let offset = base + at as u64;
            let frame = span
                .get(at..)
                .filter(|rest| !rest.is_empty())
                .ok_or_else(|| corrupt(offset, "extent holds fewer events than indexed"))?;
            let peek = peek_frame(frame).map_err(|error| corrupt(offset, &format!("{error:?}")))?;
            let ours = peek.event_session == Some(slice.session);
            if ours && seen >= slice.skip {
                let position = Position {
                    segment: extent.file,
                    offset,
                    frame_bytes: u32::try_from(peek.total_bytes).unwrap_or(u32::MAX),
                };
                let event = self.decode_record(frame, &position, in_run)?;
                if event.seq != slice.first_seq + u64::from(seen) {
                    return Err(corrupt(offset, "indexed event has another seq"));
                }
                // Neighbouring events mostly share a type (chunk runs): one lookup for them.
                let event_type = match last_type {
                    Some((number, name)) if number == event.type_number => name,
                    _ => types
                        .get(&event.type_number)
                        .ok_or_else(|| corrupt(offset, "unknown type number"))?,
                };
                last_type = Some((event.type_number, event_type));
                visit(&event, event_type, &position)?;
            }
            seen += u32::from(ours);
            at += peek.total_bytes;
        }
        Ok(())
    }

    /// The bytes holding an extent: in a run, the cached decompressed block itself (no
    /// copy), in a segment one read of the extent's span. Returns the bytes, the offset
    /// they start at and whether they come from a run.
    fn extent_bytes(&self, extent: &Extent) -> Result<(Arc<Vec<u8>>, u64, bool)> {
        if let Some(reader) = self.run_reader(extent.file)? {
            let past_run = || Error::Corrupt {
                segment: extent.file,
                offset: extent.offset,
                reason: "extent past its run block".to_string(),
            };
            let block_index = reader.index.block_at(extent.offset).ok_or_else(past_run)?;
            let block = reader.index.blocks[block_index];
            if extent.end() > block.raw_end() {
                return Err(past_run());
            }
            let bytes = reader.block(block_index, Some(&self.inner.cache))?;
            return Ok((bytes, block.raw_offset, true));
        }
        let bytes = self.read_segment_span(extent.file, extent.offset, extent.end())?;
        Ok((Arc::new(bytes), extent.offset, false))
    }

    /// One event by seq.
    pub fn get(&self, id: &str, seq: u64) -> Result<Event> {
        let length = self.session(id)?.events;
        if seq >= length {
            return Err(Error::SeqOutOfRange {
                id: id.to_string(),
                seq,
                length,
            });
        }
        let mut events = self.read(id, seq, seq + 1)?;
        events.pop().ok_or(Error::SeqOutOfRange {
            id: id.to_string(),
            seq,
            length,
        })
    }

    fn salt_of(&self, segment: u64) -> Result<u64> {
        if let Some(salt) = self.inner.salts.read().get(&segment) {
            return Ok(*salt);
        }
        if let Some(run) = self.inner.run_entries.read().get(&segment) {
            return Ok(run.salt);
        }
        let salt = self
            .inner
            .log
            .as_ref()
            .and_then(|log| log.salt_of(segment))
            .ok_or_else(|| Error::CorruptFile {
                file: segment_path(segment),
                reason: "not named by the manifest".to_string(),
            })?;
        self.inner.salts.write().insert(segment, salt);
        Ok(salt)
    }

    /// Bytes `start..end` of write-ahead segment `segment` (runs are read by block).
    fn read_segment_span(&self, segment: u64, start: u64, end: u64) -> Result<Vec<u8>> {
        if let Some(log) = &self.inner.log {
            log.wait_written(segment, end)?;
        }
        let file = self.segment_file(segment)?;
        let mut bytes = vec![0; (end - start) as usize];
        file.read_exact_at(&mut bytes, start)
            .map_err(io_error("segment read"))?;
        Ok(bytes)
    }

    /// The opened run `id`, or `None` when `id` is not a live run.
    fn run_reader(&self, id: u64) -> Result<Option<Arc<RunReader>>> {
        let Some(entry) = self.inner.run_entries.read().get(&id).copied() else {
            return Ok(None);
        };
        let mut readers = self.inner.run_readers.lock();
        if let Some(reader) = readers.get(&id) {
            return Ok(Some(reader.clone()));
        }
        let file = self
            .inner
            .storage
            .open_read(&run_path(id))
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::NotFound => Error::CorruptFile {
                    file: run_path(id),
                    reason: "named by the manifest but missing".to_string(),
                },
                _ => Error::io("run open", error),
            })?;
        let reader = Arc::new(RunReader::open(file, &entry)?);
        readers.insert(id, reader.clone());
        Ok(Some(reader))
    }

    /// Events, files and compression of the store, or of one session (`dshdb stats`).
    pub fn stats(&self, session: Option<&str>) -> Result<Stats> {
        let _positions_stay_valid = self.inner.read_gate.read();
        let run_ids: Vec<u64> = self.inner.run_entries.read().keys().copied().collect();
        let mut readers = HashMap::new();
        for id in run_ids {
            if let Some(reader) = self.run_reader(id)? {
                readers.insert(id, reader);
            }
        }
        let catalog = self.inner.catalog.read();
        let mut stats = Stats::default();
        let mut runs_seen = std::collections::HashSet::new();
        let mut segments_seen = std::collections::HashSet::new();
        let numbers: Vec<u32> = match session {
            Some(id) => {
                let number = *catalog
                    .by_id
                    .get(id)
                    .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
                if let Some(entry) = catalog.sessions.get(&number) {
                    stats.events = entry.length();
                }
                vec![number]
            }
            None => catalog.sessions.keys().copied().collect(),
        };
        for number in &numbers {
            let Some(entry) = catalog.sessions.get(number) else {
                continue;
            };
            stats.sessions += u64::from(!entry.deleted);
            for extent in entry.events.extents() {
                stats.raw_bytes += extent.bytes;
                if readers.contains_key(&extent.file) {
                    stats.events_in_runs += u64::from(extent.count);
                    runs_seen.insert(extent.file);
                } else {
                    stats.events_in_segments += u64::from(extent.count);
                    segments_seen.insert(extent.file);
                }
            }
        }
        let (mut run_raw, mut run_stored) = (0u64, 0u64);
        for (id, reader) in &readers {
            for block in &reader.index.blocks {
                if session.is_none() || numbers.contains(&block.session) {
                    run_raw += u64::from(block.raw_bytes);
                    run_stored += u64::from(block.stored_bytes);
                }
            }
            if session.is_none() {
                runs_seen.insert(*id);
            }
        }
        if run_stored > 0 {
            stats.run_compression_ratio = run_raw as f64 / run_stored as f64;
        }
        stats.runs = runs_seen.len() as u64;
        match session {
            Some(_) => {
                stats.segments = segments_seen.len() as u64;
                let wal_bytes = stats.raw_bytes - run_raw.min(stats.raw_bytes);
                stats.bytes_on_disk = run_stored + wal_bytes;
            }
            None => {
                stats.events = stats.events_in_runs + stats.events_in_segments;
                stats.segments = self.store_file_bytes(&mut stats.bytes_on_disk)?;
            }
        }
        Ok(stats)
    }

    /// Adds the length of every store file to `bytes`; returns how many segments there are.
    fn store_file_bytes(&self, bytes: &mut u64) -> Result<u64> {
        let storage = self.inner.storage.as_ref();
        let length = |path: &str| {
            storage
                .open_read(path)
                .and_then(|file| file.len())
                .map_err(io_error("stats"))
        };
        let mut segments = 0;
        for (dir, is_store_file) in [
            (WAL_DIR, parse_segment_name as fn(&str) -> Option<u64>),
            (RUNS_DIR, parse_run_name),
        ] {
            for name in storage.list(dir).map_err(io_error("stats"))? {
                if is_store_file(&name).is_some() {
                    *bytes += length(&format!("{dir}/{name}"))?;
                    if dir == WAL_DIR {
                        segments += 1;
                    }
                }
            }
        }
        for file in [MANIFEST_FILE, CHECKPOINT_FILE] {
            if storage.exists(file).map_err(io_error("stats"))? {
                *bytes += length(file)?;
            }
        }
        Ok(segments)
    }

    fn segment_file(&self, segment: u64) -> Result<Arc<dyn StorageFile>> {
        let mut files = self.inner.files.lock();
        if let Some(file) = files.get(&segment) {
            return Ok(file.clone());
        }
        let file = self
            .inner
            .storage
            .open_read(&segment_path(segment))
            .map_err(io_error("segment open"))?;
        files.insert(segment, file.clone());
        Ok(file)
    }

    fn decode_record<'a>(
        &self,
        bytes: &'a [u8],
        position: &Position,
        in_run: bool,
    ) -> Result<EventRecord<'a>> {
        let corrupt = |reason: String| Error::Corrupt {
            segment: position.segment,
            offset: position.offset,
            reason,
        };
        let frame = if in_run {
            decode_run_frame(bytes)
        } else {
            decode_frame(bytes, self.salt_of(position.segment)?)
        }
        .map_err(|error| corrupt(format!("{error:?}")))?;
        match Record::decode(&frame) {
            Ok(Some(Record::Event(event))) => Ok(event),
            _ => Err(corrupt("indexed frame is not an event".to_string())),
        }
    }

    /// Makes every append so far durable.
    pub fn flush(&self) -> Result<()> {
        self.log()?.flush()
    }

    /// Flushes, seals the active segment and releases the writer lock.
    /// Later calls on this store (and its clones) fail with [`Error::Closed`].
    pub fn close(&self) -> Result<()> {
        // Before taking `closed`: a maintenance pass that is starting takes it too (through
        // `log()`), and joining the thread while holding it would deadlock.
        self.stop_maintenance_thread();
        let mut closed = self.inner.closed.lock();
        if *closed {
            return Ok(());
        }
        *closed = true;
        let outcome = match &self.inner.log {
            Some(log) if self.is_shared() => self.close_shared(log),
            Some(log) => log.close().inspect(|()| {
                // Derived data (F-06-22): a failure only costs the next open a replay.
                let _ = self.write_closing_checkpoint(log);
            }),
            None => Ok(()),
        };
        self.inner.lock.lock().take();
        outcome
    }

    /// Closes one of many writer processes (F-08-4): everything queued is made durable;
    /// the last process to leave also takes the tail, seals it and checkpoints, as a single
    /// writer does; the others leave the segment open for those still writing.
    fn close_shared(&self, log: &Log) -> Result<()> {
        let flushed = log.flush();
        let last = self.last_writer();
        let took_tail = match (&last, &flushed) {
            (Some(_), Ok(())) => log.take_tail(),
            _ => Ok(()),
        };
        let closed = log.close();
        if last.is_some() && took_tail.is_ok() && closed.is_ok() {
            // Derived data (F-06-22): a failure only costs the next open a replay.
            let _ = self.write_closing_checkpoint(log);
        }
        drop(last);
        flushed.and(took_tail).and(closed)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        *self.maintenance.stop.lock() = true;
        self.maintenance.wake.notify_all();
        if !*self.closed.lock() {
            if let Some(log) = &self.log {
                // Best effort: a drop cannot report; `close()` is the way to see errors.
                let _ = log.close();
            }
        }
    }
}

impl SessionWriter {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sets the durability of this handle's appends.
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = durability;
    }

    /// Appends one event.
    pub fn append(&mut self, event: NewEvent<'_>) -> Result<Receipt> {
        self.append_batch(&[event])
    }

    /// Appends events as one atomic batch: after a crash either all of them are there or none.
    /// Returns when the batch is as durable as this handle's durability says.
    pub fn append_batch(&mut self, events: &[NewEvent<'_>]) -> Result<Receipt> {
        let durability = self.durability;
        self.submit_with(events, durability)?.wait()
    }

    /// Queues events as one atomic batch for a durable commit without waiting for it: the
    /// committer syncs it with the next group, and [`PendingReceipt::wait`] returns once it
    /// is durable. One thread can so keep many sessions' appends in one group commit (as an
    /// async runtime would) instead of sleeping once per append. The batch is readable at
    /// once; it is acknowledged only by `wait`.
    pub fn submit_batch(&mut self, events: &[NewEvent<'_>]) -> Result<PendingReceipt> {
        self.submit_with(events, Durability::Sync)
    }

    fn submit_with(
        &mut self,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<PendingReceipt> {
        if events.is_empty() {
            return Err(Error::invalid("an empty batch"));
        }
        self.store.log()?;
        for event in events {
            validate_event(event)?;
        }
        let (pending, _) =
            self.store
                .commit_batch(BatchTarget::Session(self.number), events, durability)?;
        self.last_ticket = pending.ticket;
        Ok(pending)
    }
}

impl Drop for SessionWriter {
    fn drop(&mut self) {
        if self.store.is_shared() {
            // The next holder must find every batch of this one written (F-08-10).
            if let (Some(log), true) = (&self.store.inner.log, self.last_ticket > 0) {
                let _ = log.wait(self.last_ticket, false);
            }
            self.store.release_lease(&self.id);
        }
        if let Some(entry) = self
            .store
            .inner
            .catalog
            .write()
            .sessions
            .get_mut(&self.number)
        {
            entry.has_writer = false;
        }
    }
}

/// Looks up session `id` and takes its writer slot: one writer handle (or one delete in
/// flight) per session; a taken slot is `SessionBusy`.
fn claim_writer_slot<'catalog>(
    catalog: &'catalog mut Catalog,
    id: &str,
) -> Result<(u32, &'catalog mut SessionEntry)> {
    let unknown = || Error::UnknownSession { id: id.to_string() };
    let number = *catalog.by_id.get(id).ok_or_else(unknown)?;
    let entry = catalog.sessions.get_mut(&number).ok_or_else(unknown)?;
    if entry.has_writer {
        return Err(Error::SessionBusy {
            session: id.to_string(),
            pid: Some(std::process::id()),
        });
    }
    entry.has_writer = true;
    Ok((number, entry))
}

/// The event type DSH appends after a seed.
pub const END_SEED_TYPE: &str = "session/end-seed";

/// The open turn, if the last `turn/start`/`turn/end` of `events` is a start (DSH `OPEN_TURN`).
fn open_turn_at_end(events: &[Event]) -> Option<String> {
    let last = events
        .iter()
        .rev()
        .find(|event| event.event_type == "turn/start" || event.event_type == "turn/end")?;
    if last.event_type != "turn/start" {
        return None;
    }
    let data: serde_json::Value = serde_json::from_str(&last.data).unwrap_or_default();
    Some(match data.get("turn") {
        Some(turn) => turn.to_string(),
        None => last.seq.to_string(),
    })
}

/// Waits as the durability asks; returns whether the batch is durable.
/// A batch queued by [`SessionWriter::submit_batch`] (or an append on its way).
#[must_use = "a pending batch is acknowledged only by waiting for it"]
pub struct PendingReceipt {
    store: Store,
    ticket: u64,
    first_seq: u64,
    end_seq: u64,
    durability: Durability,
}

impl PendingReceipt {
    /// The seq of the batch's first event.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Waits until the batch is as durable as it was submitted (durable for
    /// `submit_batch`). An error means it must not be taken as durable.
    pub fn wait(self) -> Result<Receipt> {
        let log = self.store.log()?;
        let durable = wait_for(log, self.ticket, self.durability)?;
        Ok(Receipt {
            first_seq: self.first_seq,
            end_seq: self.end_seq,
            durable,
        })
    }
}

fn wait_for(log: &Log, ticket: u64, durability: Durability) -> Result<bool> {
    match durability {
        Durability::Sync => log.wait(ticket, true).map(|()| true),
        Durability::Buffered => log.wait(ticket, false).map(|()| false),
        Durability::Batched { .. } => Ok(false),
    }
}

/// The session a batch goes to: an existing one, or one it creates.
enum BatchTarget<'a> {
    Session(u32),
    Create {
        id: &'a str,
        seed: Option<Seed>,
        header_json: &'a str,
    },
}

impl BatchTarget<'_> {
    /// The session's number; a new session is reserved once (the encoder may run twice).
    fn number(&self, catalog: &mut Catalog, reserved: &mut Option<u32>) -> Result<u32> {
        match self {
            BatchTarget::Session(number) => Ok(*number),
            BatchTarget::Create { .. } if reserved.is_some() => {
                reserved.ok_or_else(|| Error::invalid("session vanished"))
            }
            BatchTarget::Create {
                id,
                seed,
                header_json,
            } => {
                if catalog.by_id.contains_key(*id) {
                    return Err(Error::DuplicateSession { id: id.to_string() });
                }
                let number =
                    catalog.reserve_session(id.to_string(), *seed, header_json.to_string());
                if let Some(entry) = catalog.sessions.get_mut(&number) {
                    entry.has_writer = true;
                }
                *reserved = Some(number);
                Ok(number)
            }
        }
    }
}

/// Refuses a batch whose encoding could exceed `limit` before any number is taken for it:
/// a type number interned for a refused batch would never reach the log, and another
/// process could give that number to another type (F-08-6).
fn check_batch_estimate(header_bytes: usize, events: &[NewEvent<'_>], limit: u64) -> Result<()> {
    const FRAME_AND_FIXED_BYTES: u64 =
        (crate::frame::FRAME_HEADER_BYTES + EVENT_FIXED_BYTES) as u64;
    // A session header, a type definition and a commit frame, beyond their texts.
    const RECORD_OVERHEAD_BYTES: u64 = 64;
    let header = header_bytes as u64;
    let events_bytes: u64 = events
        .iter()
        .map(|event| {
            FRAME_AND_FIXED_BYTES
                + RECORD_OVERHEAD_BYTES
                + (event.data.len() + event.envelope.len() + event.event_type.len()) as u64
        })
        .sum();
    let size = events_bytes + header + 2 * RECORD_OVERHEAD_BYTES;
    if size > limit {
        return Err(Error::TooLarge {
            what: "batch",
            size,
            limit,
        });
    }
    Ok(())
}

fn encode_header_if_new(
    context: &mut SegmentContext,
    out: &mut Vec<u8>,
    number: u32,
    seed: Option<Seed>,
    header_json: &str,
) {
    if context.defined_sessions.insert(number) {
        Record::SessionHeader {
            session: number,
            seed_parent: seed.map_or(NO_SEED_PARENT, |seed| seed.parent),
            seed_length: seed.map_or(0, |seed| seed.length),
            header_json: header_json.as_bytes(),
        }
        .encode(out, context.salt);
    }
}

fn encode_commit(
    context: &SegmentContext,
    out: &mut Vec<u8>,
    session: u32,
    first_seq: u64,
    count: u32,
) {
    Record::Commit {
        session,
        first_seq,
        event_count: count,
        durable_offset: context.durable_offset,
    }
    .encode(out, context.salt);
}

fn validate_header(header_json: &str) -> Result<String> {
    if header_json.len() > MAX_HEADER_BYTES {
        return Err(Error::TooLarge {
            what: "session header",
            size: header_json.len() as u64,
            limit: MAX_HEADER_BYTES as u64,
        });
    }
    let value: serde_json::Value = serde_json::from_str(header_json)
        .map_err(|error| Error::invalid(format!("session header is not JSON: {error}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid("session header is not a JSON object"))?;
    match object.get("version").and_then(serde_json::Value::as_u64) {
        Some(0) => {}
        _ => return Err(Error::invalid("session header version must be 0")),
    }
    match object.get("createdAt").and_then(serde_json::Value::as_u64) {
        Some(created) if created < MAX_SAFE_INTEGER_EXCLUSIVE => {}
        _ => {
            return Err(Error::invalid(
                "session header createdAt must be a safe integer >= 0",
            ))
        }
    }
    header_id(header_json.as_bytes()).map_err(Error::invalid)
}

fn validate_event(event: &NewEvent<'_>) -> Result<()> {
    if event.event_type.is_empty() || event.event_type.len() > MAX_TYPE_BYTES {
        return Err(Error::invalid(format!(
            "event type must be 1 to {MAX_TYPE_BYTES} bytes"
        )));
    }
    if event.data.len() > MAX_EVENT_DATA_BYTES {
        return Err(Error::TooLarge {
            what: "event data",
            size: event.data.len() as u64,
            limit: MAX_EVENT_DATA_BYTES as u64,
        });
    }
    serde_json::from_str::<&serde_json::value::RawValue>(event.data)
        .map_err(|error| Error::invalid(format!("event data is not valid JSON: {error}")))?;
    if event.flags & !KNOWN_EVENT_FLAGS != 0 {
        return Err(Error::invalid(format!(
            "unknown event flags {:#x}",
            event.flags
        )));
    }
    if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(event.envelope)
            .map_err(|error| {
                Error::invalid(format!("verbatim line is not a JSON object: {error}"))
            })?;
        return Ok(());
    }
    if event.envelope.is_empty() {
        return Ok(());
    }
    let members: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&format!("{{{}}}", event.envelope)).map_err(|error| {
            Error::invalid(format!("event envelope is not JSON members: {error}"))
        })?;
    if let Some(key) = members
        .keys()
        .find(|key| !ENVELOPE_KEYS.contains(&key.as_str()))
    {
        return Err(Error::invalid(format!(
            "event envelope key {key:?} is not allowed"
        )));
    }
    Ok(())
}

fn create_store(storage: &dyn Storage, label: &Path) -> Result<Manifest> {
    let existing = storage.list("").map_err(io_error("store list"))?;
    let store_names = [
        LOCK_FILE,
        MANIFEST_TEMP_FILE,
        WAL_DIR,
        RUNS_DIR,
        INDEX_DIR,
        crate::multi::SHARED_FILE,
    ];
    let foreign = existing
        .iter()
        .any(|name| !store_names.contains(&name.as_str()));
    if foreign {
        return Err(Error::NotAStore {
            path: label.to_path_buf(),
        });
    }
    let segments_left = storage
        .list(WAL_DIR)
        .map_err(io_error("store list"))?
        .iter()
        .any(|name| parse_segment_name(name).is_some())
        || storage
            .list(RUNS_DIR)
            .map_err(io_error("store list"))?
            .iter()
            .any(|name| parse_run_name(name).is_some())
        || storage
            .exists(CHECKPOINT_FILE)
            .map_err(io_error("store list"))?;
    if segments_left {
        // Segments, runs or a checkpoint without a MANIFEST are a damaged store, never a
        // new one (F-06-11): creating a
        // manifest here would make this very open delete every segment as an orphan.
        return Err(Error::CorruptFile {
            file: MANIFEST_FILE.to_string(),
            reason: format!("missing while {} holds segments", label.display()),
        });
    }
    storage
        .create_dir(WAL_DIR)
        .map_err(io_error("store create"))?;
    storage.sync_dir("").map_err(io_error("directory sync"))?;
    let manifest = Manifest {
        segments: Vec::new(),
        runs: Vec::new(),
        next_segment_id: 1,
    };
    manifest.write(storage)?;
    Ok(manifest)
}

fn remove_orphans(
    storage: &dyn Storage,
    manifest: &Manifest,
    report: &mut RecoveryReport,
) -> Result<()> {
    let mut removed = false;
    for name in storage.list(WAL_DIR).map_err(io_error("wal list"))? {
        let named = parse_segment_name(&name)
            .is_some_and(|id| manifest.segments.iter().any(|entry| entry.id == id));
        if !named && parse_segment_name(&name).is_some() {
            storage
                .remove(&format!("{WAL_DIR}/{name}"))
                .map_err(io_error("orphan remove"))?;
            report.orphan_segments.push(name);
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(WAL_DIR)
            .map_err(io_error("directory sync"))?;
    }
    let mut removed_runs = false;
    for name in storage.list(RUNS_DIR).map_err(io_error("runs list"))? {
        let named = parse_run_name(&name)
            .is_some_and(|id| manifest.runs.iter().any(|entry| entry.id == id));
        if !named && parse_run_name(&name).is_some() {
            storage
                .remove(&format!("{RUNS_DIR}/{name}"))
                .map_err(io_error("orphan remove"))?;
            report.orphan_runs.push(name);
            removed_runs = true;
        }
    }
    if removed_runs {
        storage
            .sync_dir(RUNS_DIR)
            .map_err(io_error("directory sync"))?;
    }
    for temporary in [MANIFEST_TEMP_FILE, CHECKPOINT_TEMP_FILE] {
        if storage.exists(temporary).map_err(io_error("store list"))? {
            storage.remove(temporary).map_err(io_error("temp remove"))?;
        }
    }
    Ok(())
}

/// Writes a run file whole and makes it and its directory entry durable (F-06-10 step 2).
/// On failure the file is removed again (best effort; otherwise it is an orphan, F-06-11).
fn write_run_file(storage: &dyn Storage, id: u64, bytes: &[u8]) -> Result<()> {
    if !storage.exists(RUNS_DIR).map_err(io_error("runs list"))? {
        storage
            .create_dir(RUNS_DIR)
            .map_err(io_error("runs directory"))?;
        storage.sync_dir("").map_err(io_error("directory sync"))?;
    }
    let path = run_path(id);
    let written = storage
        .open(&path, true)
        .and_then(|file| {
            file.write_at(bytes, 0)?;
            file.sync_data()
        })
        .and_then(|()| storage.sync_dir(RUNS_DIR));
    if let Err(error) = written {
        let _ = storage.remove(&path);
        return Err(Error::io("run write", error));
    }
    Ok(())
}

/// Continues the log where recovery left it: wipes a torn tail, seals a torn segment that is
/// no longer the last, or starts a fresh segment after a clean close.
/// The settings of the log, from the store's options.
fn log_options(options: &Options) -> LogOptions {
    LogOptions {
        segment_bytes: options.segment_bytes,
        max_pending_bytes: options.max_pending_bytes,
        max_batch_bytes: options.max_batch_bytes,
    }
}

/// Where a started log takes its first append.
#[derive(Debug, Clone, Copy)]
struct LogStart {
    segment: u64,
    salt: u64,
    offset: u64,
}

fn start_log(
    storage: &Arc<dyn Storage>,
    options: &Options,
    mut manifest: Manifest,
    tail: Option<LogTail>,
    multi: Option<crate::commit::SharedLog>,
) -> Result<(Log, LogStart)> {
    let log_options = log_options(options);
    if let Some(tail) = tail.filter(|tail| !tail.sealed) {
        let file = storage
            .open(&segment_path(tail.segment), false)
            .map_err(io_error("segment open"))?;
        if tail.wipe_end > tail.offset {
            let zeros = vec![0; (tail.wipe_end - tail.offset) as usize];
            file.write_at(&zeros, tail.offset)
                .map_err(io_error("torn tail wipe"))?;
        }
        // The previous process may have left Buffered or Batched writes unsynced: make what
        // recovery kept durable before new commits claim it as their durable offset.
        file.sync_data().map_err(io_error("tail sync"))?;
        for torn in &tail.seal_earlier {
            seal_torn_segment(storage.as_ref(), torn)?;
        }
        let start = LogStart {
            segment: tail.segment,
            salt: tail.salt,
            offset: tail.offset,
        };
        let log = Log::start(
            storage.clone(),
            log_options,
            manifest,
            file,
            tail.segment,
            tail.salt,
            tail.offset,
            multi,
        );
        return Ok((log, start));
    }
    let id = manifest.next_segment_id;
    let salt = new_salt();
    let file = create_segment(storage.as_ref(), id, salt, options.segment_bytes)?;
    manifest.segments.push(SegmentEntry { id, salt });
    manifest.next_segment_id = id + 1;
    if let Err(failure) = manifest.write_reporting_stage(storage.as_ref()) {
        // After the rename the new manifest may be durable: then the file must stay.
        if !failure.after_rename {
            let _ = storage.remove(&segment_path(id));
        }
        return Err(failure.error);
    }
    let log = Log::start(
        storage.clone(),
        log_options,
        manifest,
        file,
        id,
        salt,
        SEGMENT_HEADER_BYTES,
        multi,
    );
    let start = LogStart {
        segment: id,
        salt,
        offset: SEGMENT_HEADER_BYTES,
    };
    Ok((log, start))
}

/// Recovery found the tail in an older segment than the newest one (a crash right after a
/// roll). Seal that older segment at its committed end so that the newest can take data.
fn seal_torn_segment(storage: &dyn Storage, torn: &TornSegment) -> Result<()> {
    let mut patch = Vec::new();
    Record::Seal {
        used_bytes: torn.committed_end,
        durable_offset: torn.committed_end,
    }
    .encode(&mut patch, torn.salt);
    let wiped = torn.wipe_end.saturating_sub(torn.committed_end);
    if (patch.len() as u64) < wiped {
        patch.resize(wiped as usize, 0);
    }
    let file = storage
        .open(&segment_path(torn.segment), false)
        .map_err(io_error("segment open"))?;
    file.write_at(&patch, torn.committed_end)
        .map_err(io_error("seal write"))?;
    file.sync_data().map_err(io_error("seal sync"))
}

/// The manifest file name, for tools.
pub const MANIFEST: &str = MANIFEST_FILE;
