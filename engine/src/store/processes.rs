//! Many processes on one store, the `Store`'s side (format-spec/08-many-processes.md):
//! the shared-mode open (alone or joining), catching the catalog up on what other
//! processes published, `refresh`, session leases, and `subscribe`.

use super::create::{create_store, remove_orphans, start_log};
use super::{io_error, Event, EventView, Inner, Options, Store, LOCK_FILE};
use crate::error::{Error, Result};
use crate::storage::catalog::Catalog;
use crate::storage::commit::{CatchUp, Log, LogOptions, SharedLog};
use crate::storage::index::{CHECKPOINT_FILE, MAX_CHECKPOINT_BYTES};
use crate::storage::io::snapshot::SnapshotStorage;
use crate::storage::io::{LockGuard, MemoryFile, Storage, StorageFile};
use crate::storage::manifest::{Manifest, SegmentEntry, MANIFEST_FILE};
use crate::storage::multi::lease::{try_lease, Lease, LeaseRefused};
use crate::storage::multi::lock::{ByteLock, OPEN_LOCK, PRESENCE_LOCK};
use crate::storage::multi::tail::{LogPosition, Tail, TailIndex, SHARED_LAYOUT};
use crate::storage::multi::{LockMode, SharedFile, SHARED_FILE};
use crate::storage::recovery::{apply_published, recover, Access, Recovered};
use crate::storage::segment::{segment_path, SEGMENT_HEADER_BYTES};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

pub use crate::limits::FOLLOW_POLL;

/// What a store open in many-process mode shares with the others.
pub(super) struct Processes {
    pub(super) file: Arc<dyn SharedFile>,
    pub(super) tail: TailIndex,
    pid: u32,
    /// Leases this process holds, by session id (F-08-10).
    leases: Mutex<HashMap<String, Lease>>,
    /// The store generation the catalog last caught up to (F-08-11).
    seen_generation: AtomicU64,
    /// The manifest the catalog reflects.
    known: Mutex<Manifest>,
    /// The `manifest_generation` that `known` was read at (F-08-17).
    seen_manifest_generation: AtomicU64,
    /// Held shared while open (F-08-4), and `LOCK` shared (F-08-2); both given back at close.
    presence: Mutex<Option<(ByteLock, Box<dyn LockGuard>)>>,
}

/// A store opened by [`open_shared_writer`] before its `Inner` exists.
pub(super) struct SharedOpen {
    pub(super) manifest: Manifest,
    pub(super) recovered: Recovered,
    pub(super) log: Log,
    pub(super) processes: Processes,
    /// Where the log's catch-up finds the catalog, once the store is assembled.
    pub(super) inner_cell: Arc<OnceLock<Weak<Inner>>>,
    /// Whether this process opened the store alone (no other process had it open).
    pub(super) alone: bool,
}

/// Opens the store for writing in shared mode (F-08-4): alone, with recovery's repairs and
/// cleanup and a fresh shared index; or joining the live processes at their published end.
pub(super) fn open_shared_writer(
    storage: &Arc<dyn Storage>,
    options: &Options,
    label: &Path,
) -> Result<SharedOpen> {
    let flock = super::take_store_lock(label, || storage.try_lock_shared(LOCK_FILE))?;
    let file = storage
        .open_shared(SHARED_FILE)
        .map_err(io_error("shared file"))?;
    let tail = TailIndex::new(file.clone());
    let _opening =
        ByteLock::wait(&file, OPEN_LOCK, LockMode::Exclusive).map_err(io_error("open lock"))?;
    let inner_cell: Arc<OnceLock<Weak<Inner>>> = Arc::new(OnceLock::new());
    let shared_log = SharedLog {
        file: file.clone(),
        tail: tail.clone(),
        catch_up: catch_up_hook(inner_cell.clone()),
    };
    let alone = ByteLock::try_take(&file, PRESENCE_LOCK, LockMode::Exclusive)
        .map_err(io_error("presence lock"))?;
    let opened_alone = alone.is_some();
    let (manifest, recovered, log, presence, generations) = match alone {
        Some(presence) => {
            let (manifest, recovered, log) = open_alone(storage, options, label, shared_log)?;
            let (segment, salt, offset) = log.tail_position();
            tail.initialize(segment, salt, offset);
            presence
                .convert(LockMode::Shared)
                .map_err(io_error("presence lock"))?;
            // Alone under `OPEN`: nobody published since the initialization.
            let generations = Generations::read(&tail);
            (manifest, recovered, log, presence, generations)
        }
        None => {
            let presence = ByteLock::wait(&file, PRESENCE_LOCK, LockMode::Shared)
                .map_err(io_error("presence lock"))?;
            let (manifest, recovered, log, generations) =
                join(storage, options, label, &tail, shared_log)?;
            (manifest, recovered, log, presence, generations)
        }
    };
    let seen_generation = AtomicU64::new(generations.store);
    let seen_manifest_generation = AtomicU64::new(generations.manifest);
    Ok(SharedOpen {
        manifest: manifest.clone(),
        recovered,
        log,
        processes: Processes {
            file,
            tail,
            pid: std::process::id(),
            leases: Mutex::new(HashMap::new()),
            seen_generation,
            known: Mutex::new(manifest),
            seen_manifest_generation,
            presence: Mutex::new(Some((presence, flock))),
        },
        inner_cell,
        alone: opened_alone,
    })
}

/// The first writer process (F-08-4 step 2): chapter 05's recovery with every repair and
/// chapter 01's cleanup, as a single writer opens.
fn open_alone(
    storage: &Arc<dyn Storage>,
    options: &Options,
    label: &Path,
    shared_log: SharedLog,
) -> Result<(Manifest, Recovered, Log)> {
    let manifest = match Manifest::read(storage.as_ref())? {
        Some(manifest) => manifest,
        None if options.create_if_missing => create_store(storage.as_ref())?,
        None => {
            return Err(Error::NotAStore {
                path: label.to_path_buf(),
            })
        }
    };
    let mut recovered = recover(
        storage.as_ref(),
        &manifest,
        options.use_checkpoint,
        Access::Writable,
    )?;
    if recovered.report.checkpoint_distrusted {
        super::create::discard_checkpoint(storage.as_ref())?;
    }
    remove_orphans(storage.as_ref(), &manifest, &mut recovered.report)?;
    let log = start_log(
        storage,
        options,
        manifest,
        recovered.tail.clone(),
        Some(shared_log),
    )?;
    Ok((log.manifest(), recovered, log))
}

/// A process joining live writers (F-08-4 step 3): the catalog from the checkpoint and the
/// log up to the published written end, with no repair and no cleanup.
fn join(
    storage: &Arc<dyn Storage>,
    options: &Options,
    label: &Path,
    tail: &TailIndex,
    shared_log: SharedLog,
) -> Result<(Manifest, Recovered, Log, Generations)> {
    if let Some(layout) = tail
        .declared_layout()
        .filter(|layout| *layout != SHARED_LAYOUT)
    {
        // A dshdb of another shared-index layout is live (F-08-14): nothing is touched.
        return Err(Error::UnsupportedVersion {
            file: SHARED_FILE.to_string(),
            found: u32::try_from(layout).unwrap_or(u32::MAX),
            supported: u32::try_from(SHARED_LAYOUT).unwrap_or(u32::MAX),
        });
    }
    if !tail.is_initialized() {
        return Err(Error::CorruptFile {
            file: SHARED_FILE.to_string(),
            reason: "live writers but an uninitialized shared index".to_string(),
        });
    }
    if Manifest::read(storage.as_ref())?.is_none() {
        return Err(Error::NotAStore {
            path: label.to_path_buf(),
        });
    }
    let (manifest, published, recovered, generations) =
        recover_published(storage, options.use_checkpoint, tail)?;
    let segment_file = storage
        .open(&segment_path(published.segment), false)
        .map_err(io_error("segment open"))?;
    let log = Log::start_with(
        storage.clone(),
        log_options(options),
        manifest.clone(),
        (
            segment_file,
            published.segment,
            published.salt,
            published.written_end,
        ),
        Some(shared_log),
    )?;
    log.claim_durable_at_most(tail.durable());
    Ok((manifest, recovered, log, generations))
}

/// The settings of the log, from the store's options.
pub(super) fn log_options(options: &Options) -> LogOptions {
    LogOptions {
        segment_bytes: options.segment_bytes,
        max_pending_bytes: options.max_pending_bytes,
        max_batch_bytes: options.max_batch_bytes,
    }
}

/// Recovery of the log up to the published end (F-08-4 step 3): the tail segment is read
/// only below `written_end`, and segments after it (a roll in progress) are left out, since
/// they may be in the middle of being written. The checkpoint is the one read before the
/// tail (`checkpoint`, F-08-15), never a newer one on disk.
fn recover_until(
    storage: &Arc<dyn Storage>,
    manifest: &Manifest,
    checkpoint: Option<Vec<u8>>,
    published: &Tail,
) -> Result<Recovered> {
    let mut limited = manifest.clone();
    if let Some(index) = limited
        .segments
        .iter()
        .position(|entry| entry.id == published.segment)
    {
        limited.segments.truncate(index + 1);
    }
    let path = segment_path(published.segment);
    let file = storage
        .open_read(&path)
        .map_err(|error| Error::opening_named_file("segment open", &path, error))?;
    let mut prefix = vec![0; crate::storage::coding::checked_usize(published.written_end, "tail")?];
    file.read_exact_at(&mut prefix, 0)
        .map_err(io_error("segment read"))?;
    let prefix: Arc<dyn StorageFile> = Arc::new(MemoryFile::new(prefix));
    let mut pinned = HashMap::from([(path, prefix)]);
    let use_checkpoint = checkpoint.is_some();
    if let Some(bytes) = checkpoint {
        let file: Arc<dyn StorageFile> = Arc::new(MemoryFile::new(bytes));
        pinned.insert(CHECKPOINT_FILE.to_string(), file);
    }
    let view: Arc<dyn Storage> = Arc::new(SnapshotStorage::with_files(storage.clone(), pinned));
    recover(view.as_ref(), &limited, use_checkpoint, Access::Preview)
}

/// Reads the checkpoint file whole, before the published tail is read (F-08-15): a
/// checkpoint covers only bytes published before it was written, so the tail read after it
/// reaches at least its end. Read after the tail, a checkpoint written in between could end
/// past the published end the joiner replays to, and its open prefix would look lost
/// (found by the many-process `kill -9` test: a joiner refused the store as `Corrupt`).
/// `None` when not asked for, absent, too large or unreadable: derived data (F-06-22), so
/// the log is replayed instead.
fn read_checkpoint_first(storage: &dyn Storage, use_checkpoint: bool) -> Option<Vec<u8>> {
    if !use_checkpoint {
        return None;
    }
    let file = storage.open_read(CHECKPOINT_FILE).ok()?;
    if file.len().ok()? > MAX_CHECKPOINT_BYTES {
        return None;
    }
    file.read_all().ok()
}

fn end_of(tail: &Tail) -> LogPosition {
    LogPosition {
        segment: tail.segment,
        offset: tail.written_end,
    }
}

fn catch_up_hook(cell: Arc<OnceLock<Weak<Inner>>>) -> Box<CatchUp> {
    Box::new(move |from, tail| {
        let inner = cell.get().and_then(Weak::upgrade).ok_or(Error::Closed)?;
        catch_up(&inner, from, tail)
    })
}

/// The catalog as a joiner builds it (F-08-4 step 3, F-08-17): the checkpoint and the log
/// up to the published end, from the manifest in force. Another process may seal or
/// rewrite a file between the read of the manifest and the opening of the file; the
/// attempt is then made again from the new manifest, at most
/// [`MAX_REBUILD_ATTEMPTS`] times.
fn recover_published(
    storage: &Arc<dyn Storage>,
    use_checkpoint: bool,
    tail: &TailIndex,
) -> Result<(Manifest, Tail, Recovered, Generations)> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        // Both before the tail: commits published after them are caught up on by the next
        // refresh, never taken as seen (found by the join test below F-08-15's rule).
        let generations = Generations::read(tail);
        let generation = generations.manifest;
        // The checkpoint before the tail, and the tail before the manifest: a checkpoint
        // covers only published bytes, and a roll names its segment before publishing it.
        let checkpoint = read_checkpoint_first(storage.as_ref(), use_checkpoint);
        let published = tail.read();
        let manifest = read_manifest(storage.as_ref())?;
        let names_tail = manifest
            .segments
            .iter()
            .any(|entry| entry.id == published.segment);
        let attempt = match names_tail {
            true => recover_until(storage, &manifest, checkpoint, &published),
            false => Err(Error::CorruptFile {
                file: MANIFEST_FILE.to_string(),
                reason: "does not name the published tail segment".to_string(),
            }),
        };
        match attempt {
            Ok(recovered) => return Ok((manifest, published, recovered, generations)),
            Err(error) => {
                let replaced_meanwhile = tail.manifest_generation() != generation
                    || tail.read().segment != published.segment;
                if attempts >= MAX_REBUILD_ATTEMPTS || !replaced_meanwhile {
                    return Err(error);
                }
            }
        }
    }
}

/// The shared index's generations as read before the published tail a catalog was built
/// up to (F-08-11, F-08-17): what the process has seen.
#[derive(Debug, Clone, Copy)]
struct Generations {
    store: u64,
    manifest: u64,
}

impl Generations {
    fn read(tail: &TailIndex) -> Generations {
        Generations {
            store: tail.store_generation(),
            manifest: tail.manifest_generation(),
        }
    }
}

/// Times a process builds its catalog again from a newer manifest when files the one it
/// read named were replaced meanwhile (F-08-17), before the failure stands.
pub const MAX_REBUILD_ATTEMPTS: usize = 8;

/// What applying the published log found.
enum Applied {
    /// Applied up to this position.
    To(LogPosition),
    /// A file it needed was sealed into a run or replaced by another process (F-08-12):
    /// the catalog must be rebuilt.
    Replaced,
}

/// Applies the published log between `from` and the tail to the catalog (F-08-11): the
/// new bytes only, segment by segment along the manifest. When another process replaced
/// files (F-08-12: a seal, a run rewrite), the catalog is rebuilt as a joiner's instead
/// (F-08-17). Returns the position applied to and, when it changed, the manifest the
/// catalog now reflects.
fn catch_up(
    inner: &Inner,
    from: LogPosition,
    tail: &Tail,
) -> Result<(LogPosition, Option<Manifest>)> {
    let Some(processes) = &inner.processes else {
        return Ok((from, None));
    };
    let mut known = processes.known.lock();
    let generation = processes.tail.manifest_generation();
    let mut changed = false;
    if generation != processes.seen_manifest_generation.load(Ordering::Acquire) {
        let manifest = read_manifest(inner.storage.as_ref())?;
        if !only_appended(&manifest, &known) {
            return rebuild(inner, processes, &mut known);
        }
        processes
            .seen_manifest_generation
            .store(generation, Ordering::Release);
        changed = manifest != *known;
        *known = manifest;
    }
    match apply_range(inner, &mut known, from, end_of(tail), &mut changed)? {
        Applied::To(position) => Ok((position, changed.then(|| known.clone()))),
        Applied::Replaced => rebuild(inner, processes, &mut known),
    }
}

/// Rebuilds the catalog from the checkpoint and the log up to the published end, as a
/// joiner does (F-08-17), and swaps it in.
fn rebuild(
    inner: &Inner,
    processes: &Processes,
    known: &mut Manifest,
) -> Result<(LogPosition, Option<Manifest>)> {
    let (manifest, published, recovered, generations) = recover_published(
        &inner.storage,
        inner.options.use_checkpoint,
        &processes.tail,
    )?;
    keep_segments_open(inner, &manifest);
    swap_catalog(inner, recovered.catalog, &manifest);
    *known = manifest;
    processes
        .seen_manifest_generation
        .store(generations.manifest, Ordering::Release);
    Ok((end_of(&published), Some(known.clone())))
}

/// Puts a rebuilt catalog in place of the process's own. Writer handles this process holds
/// stay taken. The handles of files the new manifest no longer names stay open (a reader
/// may still be reading them, F-08-18) until [`Store::forget_replaced_files`] drops them.
fn swap_catalog(inner: &Inner, mut rebuilt: Catalog, manifest: &Manifest) {
    let mut catalog = inner.catalog.write();
    for (number, entry) in &catalog.sessions {
        if entry.has_writer {
            if let Some(rebuilt_entry) = rebuilt.sessions.get_mut(number) {
                rebuilt_entry.has_writer = true;
            }
        }
    }
    *catalog = rebuilt;
    let mut salts = inner.salts.write();
    for segment in &manifest.segments {
        salts.insert(segment.id, segment.salt);
    }
    let mut runs = inner.run_entries.write();
    for run in &manifest.runs {
        runs.insert(run.id, *run);
    }
}

/// Opens the segments `manifest` names that the process does not hold open yet, so that a
/// later seal by another process cannot take them from under its catalog (F-08-18): only
/// the few segments not sealed yet. One already gone is left to the next follow.
pub(super) fn keep_segments_open(inner: &Inner, manifest: &Manifest) {
    let mut files = inner.files.lock();
    for segment in &manifest.segments {
        if files.contains_key(&segment.id) {
            continue;
        }
        if let Ok(file) = inner.storage.open_read(&segment_path(segment.id)) {
            files.insert(segment.id, file);
        }
    }
}

/// Whether `manifest` differs from `known` in nothing but segments appended (rolls).
fn only_appended(manifest: &Manifest, known: &Manifest) -> bool {
    manifest.runs == known.runs && manifest.segments.starts_with(&known.segments)
}

/// The published log from `from` to `target`, applied segment by segment; sets `changed`
/// when it had to re-read the manifest (another process rolled).
fn apply_range(
    inner: &Inner,
    known: &mut Manifest,
    from: LogPosition,
    target: LogPosition,
    changed: &mut bool,
) -> Result<Applied> {
    let mut position = from;
    while position < target {
        let entry = match segment_entry(known, position.segment) {
            Some(entry) => entry,
            None => {
                if !reread_manifest(inner, known, changed)? {
                    return Ok(Applied::Replaced);
                }
                segment_entry(known, position.segment).ok_or_else(|| Error::Corrupt {
                    segment: position.segment,
                    offset: position.offset,
                    reason: "a published segment the manifest does not name".to_string(),
                })?
            }
        };
        inner.salts.write().insert(entry.id, entry.salt);
        let end = (entry.id == target.segment).then_some(target.offset);
        // A segment before the tail was rolled away from: read it to its seal.
        match apply_segment_range(inner, entry, position.offset, end) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                // Sealed into a run since this process last looked (it lagged).
                return Ok(Applied::Replaced);
            }
            outcome => outcome?,
        }
        if end.is_some() {
            return Ok(Applied::To(target));
        }
        let next = match next_segment(known, entry.id) {
            Some(next) => next,
            None => {
                if !reread_manifest(inner, known, changed)? {
                    return Ok(Applied::Replaced);
                }
                next_segment(known, entry.id).ok_or_else(|| Error::Corrupt {
                    segment: entry.id,
                    offset: 0,
                    reason: "a rolled segment has no successor in the manifest".to_string(),
                })?
            }
        };
        position = LogPosition {
            segment: next.id,
            offset: SEGMENT_HEADER_BYTES,
        };
    }
    Ok(Applied::To(position))
}

fn segment_entry(manifest: &Manifest, segment: u64) -> Option<SegmentEntry> {
    manifest
        .segments
        .iter()
        .find(|entry| entry.id == segment)
        .copied()
}

fn next_segment(manifest: &Manifest, after: u64) -> Option<SegmentEntry> {
    manifest
        .segments
        .iter()
        .find(|entry| entry.id > after)
        .copied()
}

/// The manifest on disk (never absent while the store is open).
fn read_manifest(storage: &dyn Storage) -> Result<Manifest> {
    Manifest::read(storage)?.ok_or_else(|| Error::CorruptFile {
        file: MANIFEST_FILE.to_string(),
        reason: "removed while the store is open".to_string(),
    })
}

/// Takes the manifest on disk as `known` after another process rolled; returns `false`
/// (leaving `known`) when it also replaced files (F-08-12), which a rebuild must follow.
fn reread_manifest(inner: &Inner, known: &mut Manifest, changed: &mut bool) -> Result<bool> {
    let manifest = read_manifest(inner.storage.as_ref())?;
    if !only_appended(&manifest, known) {
        return Ok(false);
    }
    *changed |= manifest != *known;
    *known = manifest;
    Ok(true)
}

/// Applies segment `entry` from `start` to `end`, or (`None`) to its seal.
fn apply_segment_range(
    inner: &Inner,
    entry: SegmentEntry,
    start: u64,
    end: Option<u64>,
) -> Result<()> {
    let cached = inner.files.lock().get(&entry.id).cloned();
    let file = match cached {
        Some(file) => file,
        None => inner
            .storage
            .open_read(&segment_path(entry.id))
            .map_err(io_error("segment open"))?,
    };
    let to_seal = end.is_none();
    let end = match end {
        Some(end) => end,
        None => file.len().map_err(io_error("segment length"))?,
    };
    if end <= start {
        return Ok(());
    }
    // The new bytes only (F-08-11): a catch-up costs what others wrote since, not the
    // segment so far.
    let mut bytes = vec![0; crate::storage::coding::checked_usize(end - start, "segment range")?];
    file.read_exact_at(&mut bytes, start)
        .map_err(io_error("segment read"))?;
    inner.files.lock().entry(entry.id).or_insert(file);
    let mut catalog = inner.catalog.write();
    apply_published(&mut catalog, &bytes, start, (entry.id, entry.salt), to_seal)?;
    Ok(())
}

impl Store {
    /// Whether this store shares its files with other processes (format-spec/08).
    pub fn is_shared(&self) -> bool {
        self.inner.processes.is_some()
    }

    /// Sees what other processes committed since the last look (F-08-11). Returns whether
    /// anything changed. With nothing new it costs one load from shared memory; otherwise
    /// it reads the new bytes only. A store without other processes (an exclusive writer,
    /// a snapshot) never changes under it: `Ok(false)`.
    pub fn refresh(&self) -> Result<bool> {
        let Some(processes) = &self.inner.processes else {
            return Ok(false);
        };
        let generation = processes.tail.store_generation();
        if generation == processes.seen_generation.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.open_log()?.catch_up()?;
        processes
            .seen_generation
            .store(generation, Ordering::Release);
        self.forget_replaced_files();
        Ok(true)
    }

    /// Drops the handles, salts and run entries of files the manifest the catalog reflects
    /// no longer names (another process sealed or rewrote them, F-08-17), under the read
    /// gate: no reader holds a position in them any more. Until then a reader that opened
    /// such a file keeps reading it (F-08-18); afterwards the file's space is freed.
    pub(super) fn forget_replaced_files(&self) {
        let Some(processes) = &self.inner.processes else {
            return;
        };
        let _no_readers = self.inner.read_gate.write();
        let known = processes.known.lock();
        let Some(first_segment) = known.segments.first().map(|entry| entry.id) else {
            return;
        };
        let is_run = |id: &u64| known.runs.iter().any(|run| run.id == *id);
        // Segments below the first one named were sealed away; later ones may be this
        // process's own roll that `known` does not list yet.
        let segment_named = |id: &u64| *id >= first_segment || is_run(id);
        self.inner.files.lock().retain(|id, _| segment_named(id));
        self.inner.salts.write().retain(|id, _| segment_named(id));
        self.inner.run_entries.write().retain(|id, _| is_run(id));
        self.inner.run_readers.lock().retain(|id, _| is_run(id));
    }

    /// Takes `manifest`, which this process just put in force (F-08-16), as the one its
    /// catalog reflects: the caller re-points the catalog itself.
    pub(super) fn adopt_own_manifest(&self, manifest: Manifest) {
        if let Some(processes) = &self.inner.processes {
            *processes.known.lock() = manifest;
        }
    }

    /// Whether the catalog reflects a manifest with exactly these runs (a checkpoint must
    /// not name runs the catalog does not point into, nor leave out runs it does).
    pub(super) fn catalog_runs_are(&self, runs: &[crate::storage::manifest::RunEntry]) -> bool {
        match &self.inner.processes {
            Some(processes) => processes.known.lock().runs == runs,
            None => true,
        }
    }

    /// Whether the manifest on disk differs from the one the catalog reflects in anything
    /// but appended segments: another process sealed or rewrote files, and this process
    /// has not followed yet (F-08-17).
    pub(super) fn behind_replacements(&self) -> Result<bool> {
        let Some(processes) = &self.inner.processes else {
            return Ok(false);
        };
        let manifest = read_manifest(self.inner.storage.as_ref())?;
        Ok(!only_appended(&manifest, &processes.known.lock()))
    }

    /// Takes the lease of session `id` for this process (F-08-10) unless it holds it;
    /// returns whether it took it now.
    pub(super) fn take_lease(&self, id: &str) -> Result<bool> {
        let Some(processes) = &self.inner.processes else {
            return Ok(false);
        };
        let mut leases = processes.leases.lock();
        if leases.contains_key(id) {
            return Ok(false);
        }
        match try_lease(&processes.file, &processes.tail, id, processes.pid) {
            Ok(lease) => {
                leases.insert(id.to_string(), lease);
                Ok(true)
            }
            Err(LeaseRefused::Busy { pid }) => Err(Error::SessionBusy {
                id: id.to_string(),
                pid,
            }),
            Err(LeaseRefused::Io(error)) => Err(Error::io("lease lock", error)),
        }
    }

    /// Gives the lease of `id` back (after its batches are written, F-08-10).
    pub(super) fn release_lease(&self, id: &str) {
        if let Some(processes) = &self.inner.processes {
            processes.leases.lock().remove(id);
        }
    }

    /// Takes the lease of `id` and sees the others' commits before a writer handle is
    /// handed out, so that appends continue at the session's true next seq. Returns
    /// whether the lease was taken now (to give back if what follows fails).
    pub(super) fn lease_and_refresh(&self, id: &str) -> Result<bool> {
        let taken = self.take_lease(id)?;
        // A turn at the tail, not only a refresh: a dead writer's whole batches it announced
        // but never published are kept by the next `WRITE` holder (F-08-9 row 2), and the
        // session's next seq must count them.
        let caught_up = match self.inner.processes {
            Some(_) => self.open_log().and_then(|log| log.pin_tail().map(drop)),
            None => Ok(()),
        };
        if let Err(error) = caught_up.and_then(|()| self.refresh().map(drop)) {
            if taken {
                self.release_lease(id);
            }
            return Err(error);
        }
        Ok(taken)
    }

    /// Whether this process is the last writer process (under `OPEN`, so none joins
    /// meanwhile): then a close may seal and checkpoint as a single writer does (F-08-4).
    /// Returns the `OPEN` lock to hold through the close.
    pub(super) fn last_writer(&self) -> Option<ByteLock> {
        let processes = self.inner.processes.as_ref()?;
        let opening = ByteLock::wait(&processes.file, OPEN_LOCK, LockMode::Exclusive).ok()?;
        let alone = processes
            .file
            .lock(PRESENCE_LOCK, LockMode::Exclusive, false)
            .unwrap_or(false);
        alone.then_some(opening)
    }

    /// Closes one of many writer processes (F-08-4): everything queued is made durable;
    /// the last process to leave also takes the tail, seals it and checkpoints, as a single
    /// writer does; the others leave the segment open for those still writing.
    pub(super) fn close_shared(&self, log: &Log) -> Result<()> {
        let flushed = log.flush().and_then(|()| log.sync_published());
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
        if let Some(processes) = &self.inner.processes {
            // Another opener need not wait for this handle to be dropped.
            processes.presence.lock().take();
        }
        flushed.and(took_tail).and(closed)
    }

    /// The durable position of the log (F-08-7), for followers.
    fn durable_position(&self) -> Option<LogPosition> {
        self.inner
            .processes
            .as_ref()
            .map(|processes| processes.tail.durable())
    }

    /// The events of `from..` of session `id` that are durable (F-08-11), in seq order.
    fn read_durable(&self, id: &str, from: u64) -> Result<Vec<Event>> {
        let durable = self.durable_position();
        let runs: std::collections::HashSet<u64> =
            self.inner.run_entries.read().keys().copied().collect();
        let mut events = Vec::new();
        let result = self.for_each_event(id, from, u64::MAX, |event, event_type, position| {
            let is_durable = runs.contains(&position.segment)
                || durable.is_none_or(|durable| {
                    position.segment < durable.segment
                        || (position.segment, position.end()) <= (durable.segment, durable.offset)
                });
            if !is_durable {
                // Stops the walk: later events are not durable either.
                return Err(Error::Closed);
            }
            events.push(
                EventView {
                    seq: event.seq,
                    time: event.time,
                    event_type,
                    data: super::read::event_text(event.data, position)?,
                    envelope: super::read::event_text(event.envelope, position)?,
                    flags: event.flags,
                }
                .to_event(),
            );
            Ok(())
        });
        match result {
            Ok(()) | Err(Error::Closed) => Ok(events),
            Err(error) => Err(error),
        }
    }

    /// Follows session `id` from seq `from_seq` (F-08-11): the returned subscription yields
    /// every durable event from there on, in seq order, each exactly once, as this or other
    /// processes commit them. A session that does not exist yet is waited for. A store
    /// opened without [`Options::shared`] has no other writers: its subscription yields
    /// this process's own appends as they reach the log, durable or not yet, and polls
    /// every `FOLLOW_POLL_ALONE`. A read-only store cannot subscribe (`Error::ReadOnly`).
    pub fn subscribe(&self, id: &str, from_seq: u64) -> Result<Subscription> {
        self.open_log()?;
        Ok(Subscription {
            store: self.clone(),
            id: id.to_string(),
            next_seq: from_seq,
            buffered: VecDeque::new(),
        })
    }
}

/// A follower of one session (see [`Store::subscribe`]).
pub struct Subscription {
    store: Store,
    id: String,
    next_seq: u64,
    buffered: VecDeque<Event>,
}

impl Subscription {
    /// The seq of the next event it yields.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The next event, waiting at most `timeout` for it (`Ok(None)`: none came).
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Ok(Some(event));
            }
            let processes = self.store.inner.processes.as_ref();
            let seen = processes.map(|processes| processes.tail.notify_count());
            self.store.refresh()?;
            let events = match self.store.read_durable(&self.id, self.next_seq) {
                Ok(events) => events,
                Err(Error::UnknownSession { .. }) => Vec::new(),
                Err(error) => return Err(error),
            };
            if let Some(last) = events.last() {
                self.next_seq = last.seq + 1;
                self.buffered.extend(events);
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let nap = (deadline - now).min(FOLLOW_POLL);
            match (processes, seen) {
                (Some(processes), Some(seen)) => processes.tail.wait(seen, nap),
                _ => std::thread::sleep(nap.min(crate::limits::FOLLOW_POLL_ALONE)),
            }
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<Event>;

    /// Blocks until the next durable event (or an error).
    fn next(&mut self) -> Option<Result<Event>> {
        loop {
            match self.next_timeout(FOLLOW_POLL) {
                Ok(Some(event)) => return Some(Ok(event)),
                Ok(None) => continue,
                Err(error) => return Some(Err(error)),
            }
        }
    }
}
