//! The store: `Store` and `SessionWriter`, the only place that wires storage and the
//! session model together.
//!
//! Owns opening and closing a store and the value types of its API (`Options`, `NewEvent`,
//! `Event`, `EventView`, `Receipt`, `SessionSummary`); its children hold the write path
//! (`writer`), the read path (`read`), maintenance and sealing (`maintenance`), the session
//! lifecycle (`lifecycle`), `stats`, input validation (`validate`) and store creation
//! (`create`). May import `storage`, `session` and `error`; nothing above.
// Store code reads offsets and lengths of the files: no silent narrowing (issue #12).
#![cfg_attr(
    not(test),
    deny(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )
)]

mod checkpointer;
mod create;
mod lifecycle;
mod line;
mod maintenance;
mod processes;
mod read;
mod staging;
mod stats;
mod validate;
mod writer;

pub use crate::session::END_SEED_TYPE;
pub use maintenance::{MaintenanceReport, MAINTENANCE_THREAD};
pub use processes::{Subscription, FOLLOW_POLL};
pub use read::{EntryView, ReadScan, RowMember, RowMembers, RowView};
pub use staging::{is_stage_id, STAGE_PREFIX};
pub use stats::Stats;
pub use validate::check_data_depth;
pub use writer::PendingReceipt;
pub(crate) use writer::{ParsedBatch, ParsedEvent};

use create::{
    check_creatable, check_creatable_before_lock, create_store, discard_checkpoint, remove_orphans,
    start_log, undo_create,
};
use line::push_json_line;
use maintenance::MaintenanceSignal;

use crate::error::{Error, Result};
use crate::storage::catalog::Catalog;
use crate::storage::commit::{Durability, Log, DEFAULT_MAX_BATCH_BYTES};
use crate::storage::io::fs::FsStorage;
use crate::storage::io::snapshot::SnapshotStorage;
use crate::storage::io::{LockGuard, Storage, StorageFile};
use crate::storage::manifest::{Manifest, RunEntry, MANIFEST_FILE};
use crate::storage::recovery::{recover, Access, Recovered, RecoveryReport};
use crate::storage::run::run_path;
use crate::storage::run::{BlockCache, RunReader};
use crate::storage::segment::segment_path;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The writer lock file.
pub const LOCK_FILE: &str = "LOCK";
/// Name of the thread that checkpoints the seq index while the store runs (F-06-27).
pub const CHECKPOINT_THREAD: &str = "checkpointer";
pub use crate::limits::DEFAULT_CHECKPOINT_EVERY_LOG_BYTES;
/// Space a writable store keeps for a full disk (F-01-9, [`DISK_FULL_RESERVE_BYTES`]).
///
/// [`DISK_FULL_RESERVE_BYTES`]: crate::limits::DISK_FULL_RESERVE_BYTES
pub const RESERVE_FILE: &str = "RESERVE";
pub use crate::limits::DEFAULT_BLOCK_CACHE_BYTES;
pub use crate::limits::DEFAULT_MAX_PENDING_BYTES;
pub use crate::limits::DEFAULT_SEGMENT_BYTES;
pub use crate::limits::MAX_EVENT_DATA_BYTES;
pub use crate::limits::MAX_EVENT_DATA_DEPTH;
pub use crate::limits::MAX_HEADER_BYTES;
pub use crate::limits::MAX_TYPE_BYTES;

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
    /// (format-spec/08-many-processes.md): `LOCK` is taken shared, session leases keep one
    /// writer per session, and [`Store::refresh`] and [`Store::subscribe`] see the others'
    /// commits. Off (the default), a writable open takes the store exclusively (F-01-2).
    /// Ignored by read-only opens, which read a snapshot.
    pub shared: bool,
    /// In the shared mode, let [`Store::maintain`] (and the background thread) seal and
    /// rewrite files while other processes are live (F-08-16); on by default. Off, a
    /// shared-mode pass does nothing and sealing waits for an exclusive open or for the last
    /// process's close (for a process that should leave maintenance to others). Other
    /// processes follow a pass either way (F-08-17).
    pub shared_maintenance: bool,
    /// Write a seq-index checkpoint on a background thread whenever this many bytes of
    /// log were committed since the last (F-06-27; more for a large catalog), so that a
    /// reopen after a crash replays only the log after it. `None`: checkpoints only after
    /// maintenance and at a clean close, and when [`Store::checkpoint`] is called.
    pub checkpoint_every_bytes: Option<u64>,
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
            shared_maintenance: true,
            checkpoint_every_bytes: Some(DEFAULT_CHECKPOINT_EVERY_LOG_BYTES),
        }
    }
}

impl Options {
    /// `Batched` durability with the usual settings: sync within 5 ms or 1 MiB.
    pub fn batched() -> Durability {
        Durability::Batched {
            max_delay: crate::limits::DEFAULT_BATCHED_MAX_DELAY,
            max_bytes: crate::limits::DEFAULT_BATCHED_MAX_BYTES,
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
    /// Damage a read of this writable store found (F-05-12): from then on it refuses every
    /// write with a copy of this error, so nothing is built on it.
    damage: Mutex<Option<Error>>,
    /// Many-process mode (format-spec/08): what this process shares with the others.
    processes: Option<processes::Processes>,
    /// Checkpoints while the store runs (F-06-27).
    checkpoints: Arc<checkpointer::Checkpoints>,
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
    /// Ticket of the last batch queued: with other processes, the lease is given back only
    /// once it is written (F-08-10).
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

impl Drop for Inner {
    fn drop(&mut self) {
        *self.maintenance.stop.lock() = true;
        self.maintenance.wake.notify_all();
        self.checkpoints.stop_without_waiting();
        if !*self.closed.lock() {
            if let Some(log) = &self.log {
                // Best effort: a drop cannot report; `close()` is the way to see errors.
                let _ = log.close();
            }
        }
    }
}

/// A copy of an error that says the log's files are damaged; `None` for any other error.
fn copy_of_damage(error: &Error) -> Option<Error> {
    Some(match error {
        Error::Corrupt {
            segment,
            offset,
            reason,
        } => Error::Corrupt {
            segment: *segment,
            offset: *offset,
            reason: reason.clone(),
        },
        Error::CorruptFile { file, reason } => Error::CorruptFile {
            file: file.clone(),
            reason: reason.clone(),
        },
        Error::UnknownRecordKind {
            segment,
            offset,
            kind,
        } => Error::UnknownRecordKind {
            segment: *segment,
            offset: *offset,
            kind: *kind,
        },
        Error::UnsupportedVersion {
            file,
            found,
            supported,
        } => Error::UnsupportedVersion {
            file: file.clone(),
            found: *found,
            supported: *supported,
        },
        _ => return None,
    })
}

/// The manifest file name, for tools.
pub const MANIFEST: &str = MANIFEST_FILE;

/// Times a read-only open reads the manifest again when a file it names vanished (a writer's
/// maintenance replaced it) before the open fails (F-05-13).
pub const MAX_SNAPSHOT_ATTEMPTS: usize = 8;

/// A read-only open (F-01-3, F-05-13), or a preview of a writable one: pins every file the manifest names, then recovers
/// from those handles. When that fails and the manifest changed meanwhile (a writer sealed
/// a segment into a run, or rewrote a run, and removed the old file), it starts again from
/// the new manifest; with the manifest unchanged the failure stands.
fn open_snapshot(
    storage: Arc<dyn Storage>,
    use_checkpoint: bool,
    access: Access,
    label: &Path,
) -> Result<(Manifest, Arc<dyn Storage>, Recovered)> {
    let read_manifest = || {
        Manifest::read(storage.as_ref())?.ok_or_else(|| Error::NotAStore {
            path: label.to_path_buf(),
        })
    };
    let mut manifest = read_manifest()?;
    let mut attempts = 1;
    loop {
        let snapshot = pin_named_files(&storage, &manifest).and_then(|pinned| {
            let recovered = recover(pinned.as_ref(), &manifest, use_checkpoint, access)?;
            Ok((pinned, recovered))
        });
        let error = match snapshot {
            Ok((pinned, recovered)) => return Ok((manifest, pinned, recovered)),
            Err(error) => error,
        };
        if attempts >= MAX_SNAPSHOT_ATTEMPTS {
            return Err(error);
        }
        let now = read_manifest()?;
        if now == manifest {
            return Err(error);
        }
        manifest = now;
        attempts += 1;
    }
}

/// Files a read-only open keeps open from its start (F-05-13): each holds a descriptor for
/// the life of the store, so a store of very many files must not exhaust the process's.
pub const MAX_PINNED_FILES: usize = 512;

/// Opens the segments and runs `manifest` names, oldest segments first (maintenance replaces
/// those first), at most [`MAX_PINNED_FILES`]; a missing one is `CorruptFile`.
fn pin_named_files(storage: &Arc<dyn Storage>, manifest: &Manifest) -> Result<Arc<dyn Storage>> {
    let paths: Vec<String> = manifest
        .segments
        .iter()
        .map(|segment| segment_path(segment.id))
        .chain(manifest.runs.iter().map(|run| run_path(run.id)))
        .take(MAX_PINNED_FILES)
        .collect();
    let pinned = SnapshotStorage::pin(storage.clone(), &paths)
        .map_err(|(path, error)| Error::opening_named_file("file open", &path, error))?;
    Ok(Arc::new(pinned))
}

impl Store {
    /// Opens (or creates) the store in directory `path` on the real file system.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<Store> {
        let path = path.as_ref();
        // The directories this open creates, outermost first: a failed creation removes them
        // again, so that it leaves nothing behind.
        let mut created_dirs = Vec::new();
        if options.create_if_missing && !options.read_only {
            let mut missing = Some(path);
            while let Some(dir) = missing.filter(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            {
                created_dirs.push(dir.to_path_buf());
                missing = dir.parent();
            }
            created_dirs.reverse();
            std::fs::create_dir_all(path).map_err(io_error("store directory create"))?;
        }
        if !path.is_dir() {
            return Err(Error::NotAStore {
                path: path.to_path_buf(),
            });
        }
        let opened = Store::open_on(Arc::new(FsStorage::new(path)), options, path);
        if opened.is_err() {
            for dir in created_dirs.iter().rev() {
                // Best effort, and only while empty: a directory someone else filled stays.
                let _ = std::fs::remove_dir(dir);
            }
        }
        opened
    }

    /// Opens a store on any storage (the simulator in tests). `label` names it in errors.
    pub fn open_on(storage: Arc<dyn Storage>, options: Options, label: &Path) -> Result<Store> {
        // Before the lock, which creates `LOCK`: a directory that is not a store and may not
        // become one is refused without a trace (F-01-4, F-01-5). The checks run again under
        // the lock.
        if !options.read_only
            && !storage
                .exists(MANIFEST_FILE)
                .map_err(io_error("store list"))?
        {
            if !options.create_if_missing {
                return Err(Error::NotAStore {
                    path: label.to_path_buf(),
                });
            }
            check_creatable_before_lock(storage.as_ref(), label)?;
        }
        if options.shared && !options.read_only {
            return Store::open_shared(storage, options, label);
        }
        let lock = if options.read_only {
            None
        } else {
            Some(take_store_lock(label, || storage.try_lock(LOCK_FILE))?)
        };
        if options.read_only {
            // A consistent snapshot whatever a writer does meanwhile (F-05-13).
            let (manifest, storage, recovered) =
                open_snapshot(storage, options.use_checkpoint, Access::ReadOnly, label)?;
            return Store::assemble(storage, options, manifest, recovered, lock);
        }
        let (manifest, created) = match Manifest::read(storage.as_ref())? {
            Some(manifest) => (manifest, false),
            None if options.create_if_missing => {
                check_creatable(storage.as_ref(), label)?;
                match create_store(storage.as_ref()) {
                    Ok(manifest) => (manifest, true),
                    Err(error) => {
                        undo_create(storage.as_ref());
                        return Err(error);
                    }
                }
            }
            None => {
                return Err(Error::NotAStore {
                    path: label.to_path_buf(),
                })
            }
        };
        let opened = Store::open_manifest(storage.clone(), options, manifest, lock);
        if opened.is_err() && created {
            // A creation that failed half-way (a full disk) leaves nothing behind (F-01-4).
            undo_create(storage.as_ref());
        }
        opened
    }

    /// Opens the store as one of many writer processes (F-08-4).
    fn open_shared(storage: Arc<dyn Storage>, options: Options, label: &Path) -> Result<Store> {
        let opened = processes::open_shared_writer(&storage, &options, label)?;
        // Only the first process may drop stages: those it recovered are a dead process's.
        // A joining one would take another live process's import in progress.
        let leftover_stages = match opened.alone {
            true => staging::stage_ids(&opened.recovered.catalog),
            false => Vec::new(),
        };
        let store = Store::build(
            storage,
            options,
            &opened.manifest,
            opened.recovered,
            (Some(opened.log), None, Some(opened.processes)),
        );
        // The log's catch-up reaches the catalog through this (the log exists first).
        let _ = opened.inner_cell.set(Arc::downgrade(&store.inner));
        processes::keep_segments_open(&store.inner, &opened.manifest);
        create::keep_reserve(store.inner.storage.as_ref());
        store.drop_stages(leftover_stages)?;
        if let Some(interval) = store.inner.options.maintenance_interval {
            // Its passes run beside the other processes' (F-08-16): one at a time.
            store.start_maintenance_thread(interval)?;
        }
        store.start_checkpoints()?;
        Ok(store)
    }

    /// The rest of a writable open once the lock is held and the manifest read: recovery
    /// that checks what the writer will build on (F-05-12), then the store.
    fn open_manifest(
        storage: Arc<dyn Storage>,
        options: Options,
        manifest: Manifest,
        lock: Option<Box<dyn LockGuard>>,
    ) -> Result<Store> {
        let recovered = recover(
            storage.as_ref(),
            &manifest,
            options.use_checkpoint,
            Access::Writable,
        )?;
        Store::assemble(storage, options, manifest, recovered, lock)
    }

    /// The store over a recovered manifest; for a writer also the orphan removal, the start
    /// of the log and of the maintenance thread.
    fn assemble(
        storage: Arc<dyn Storage>,
        options: Options,
        manifest: Manifest,
        mut recovered: Recovered,
        lock: Option<Box<dyn LockGuard>>,
    ) -> Result<Store> {
        let write_fresh_checkpoint = !recovered.report.checkpoint_used && !manifest.runs.is_empty();
        let log = if options.read_only {
            None
        } else {
            if recovered.report.checkpoint_distrusted {
                // Before the repair continues the segment it calls sealed (F-05-12).
                discard_checkpoint(storage.as_ref())?;
            }
            remove_orphans(storage.as_ref(), &manifest, &mut recovered.report)?;
            Some(start_log(
                &storage,
                &options,
                manifest.clone(),
                recovered.tail.clone(),
                None,
            )?)
        };
        let interval = options.maintenance_interval;
        let store = Store::build(storage, options, &manifest, recovered, (log, lock, None));
        if store.inner.log.is_some() {
            create::keep_reserve(store.inner.storage.as_ref());
            // Stages a crash left unpublished never existed (module `staging`).
            store.drop_stages(store.stages())?;
            if write_fresh_checkpoint {
                // Derived data (F-06-22): a failure here only costs the next open a rebuild.
                let _ = store.write_runs_checkpoint();
            }
            if let Some(interval) = interval {
                // On failure `store` drops here: the log closes and the lock is released,
                // so the store opens again once threads can be started.
                store.start_maintenance_thread(interval)?;
            }
            store.start_checkpoints()?;
        }
        Ok(store)
    }

    /// The store's shared state over a recovered catalog.
    fn build(
        storage: Arc<dyn Storage>,
        options: Options,
        manifest: &Manifest,
        recovered: Recovered,
        (log, lock, processes): (
            Option<Log>,
            Option<Box<dyn LockGuard>>,
            Option<processes::Processes>,
        ),
    ) -> Store {
        let salts: HashMap<u64, u64> = manifest
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
                damage: Mutex::new(None),
                processes,
                checkpoints: Arc::default(),
            }),
        }
    }

    /// What a writable open of the store in `path` would find (F-05-12), without taking the
    /// lock or writing anything: the recovery it runs, as a read-only snapshot (F-05-13).
    /// `Err` is what the writable open would refuse with; a report with a torn tail or
    /// `checkpoint_distrusted` is what it would repair. `dshdb verify` says which.
    pub fn check_writable_open(path: impl AsRef<Path>) -> Result<RecoveryReport> {
        let path = path.as_ref();
        if !path.is_dir() {
            return Err(Error::NotAStore {
                path: path.to_path_buf(),
            });
        }
        let storage: Arc<dyn Storage> = Arc::new(FsStorage::new(path));
        let (_, _, recovered) = open_snapshot(storage, true, Access::Preview, path)?;
        Ok(recovered.report)
    }

    /// The store's directory (derived files above the log, `cache/` and `spill/`, live there).
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.inner.storage.clone()
    }

    /// Bytes of decompressed run blocks this handle's shared read cache holds now (at most
    /// [`Options::block_cache_bytes`]): a diagnostic of what reads keep resident.
    pub fn cached_block_bytes(&self) -> usize {
        self.inner.cache.held_bytes()
    }

    /// Whether the store was opened read-only (no writes of any kind, derived files included).
    pub fn is_read_only(&self) -> bool {
        self.inner.options.read_only
    }

    /// What recovery found when this store was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    /// Ids of the sessions that lost unacknowledged events in the torn tail this open
    /// discarded (sessions defined only inside it are gone and not named).
    pub fn torn_sessions(&self) -> Vec<String> {
        let Some(torn) = &self.inner.report.torn_tail else {
            return Vec::new();
        };
        let catalog = self.inner.catalog.read();
        torn.dropped_sessions
            .iter()
            .filter_map(|number| catalog.sessions.get(number))
            .filter(|entry| !entry.deleted)
            .map(|entry| entry.id.clone())
            .collect()
    }

    /// The log, for a write: refused when closed, read-only, or after a read found damage.
    fn log(&self) -> Result<&Log> {
        let log = self.open_log()?;
        if let Some(damage) = self.inner.damage.lock().as_ref().and_then(copy_of_damage) {
            return Err(damage);
        }
        Ok(log)
    }

    fn open_log(&self) -> Result<&Log> {
        if *self.inner.closed.lock() {
            return Err(Error::Closed);
        }
        self.inner.log.as_ref().ok_or(Error::ReadOnly)
    }

    /// Remembers damage a read of the log found, so that a writable store refuses further
    /// writes (F-05-12). Spill blobs are outside the log and do not count.
    pub(super) fn note_damage(&self, error: &Error) {
        if self.inner.log.is_none() {
            return;
        }
        if let Some(copy) = copy_of_damage(error) {
            self.inner.damage.lock().get_or_insert(copy);
        }
    }

    /// Makes every append so far durable (also after a read found damage: those bytes are
    /// the caller's, written before it).
    ///
    /// When the flush succeeds but a pass of the background maintenance thread failed since
    /// the last `maintain` or `flush`, returns that failure ([`Error::Maintenance`], once):
    /// the appends are durable all the same.
    pub fn flush(&self) -> Result<()> {
        self.open_log()?.flush()?;
        self.inner.maintenance.take_unreported()
    }

    /// Flushes, seals the active segment and releases the writer lock.
    /// Later calls on this store (and its clones) fail with [`Error::Closed`].
    ///
    /// Once closed, returns a failure of the background maintenance thread that no
    /// `maintain` or `flush` returned yet ([`Error::Maintenance`]), so that none is lost.
    pub fn close(&self) -> Result<()> {
        // Before taking `closed`: a maintenance pass that is starting takes it too (through
        // `log()`), and joining the thread while holding it would deadlock.
        self.stop_maintenance_thread();
        self.stop_checkpoint_thread();
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
        outcome?;
        self.inner.maintenance.take_unreported()
    }
}

/// Takes the store's `LOCK` through `try_lock`, asking again for up to
/// [`STORE_LOCK_PATIENCE`](crate::limits::STORE_LOCK_PATIENCE) before the refusal is
/// `Error::Locked` (why: that constant).
pub(super) fn take_store_lock(
    label: &Path,
    try_lock: impl Fn() -> std::io::Result<Option<Box<dyn LockGuard>>>,
) -> Result<Box<dyn LockGuard>> {
    use crate::limits::{STORE_LOCK_PATIENCE, STORE_LOCK_RETRY};
    let started = std::time::Instant::now();
    loop {
        if let Some(guard) = try_lock().map_err(io_error("lock"))? {
            return Ok(guard);
        }
        if started.elapsed() >= STORE_LOCK_PATIENCE {
            return Err(Error::Locked {
                path: label.to_path_buf(),
            });
        }
        std::thread::sleep(STORE_LOCK_RETRY);
    }
}
