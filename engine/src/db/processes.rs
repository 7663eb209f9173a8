//! Many processes on one store, the `Store`'s side (format-spec/08-many-processes.md):
//! the shared-mode open (alone or joining), catching the catalog up on what other
//! processes published, `refresh`, session leases, and `subscribe`.

use super::*;
use crate::commit::SharedLog;
use crate::multi::lease::{try_lease, Lease, LeaseRefused};
use crate::multi::lock::{ByteLock, MAINTENANCE_LOCK, OPEN_LOCK, PRESENCE_LOCK};
use crate::multi::tail::{LogPosition, Tail, TailIndex};
use crate::multi::{LockMode, SharedFile, SHARED_FILE};
use crate::recovery::{apply_published, recover_until};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, Weak};

/// Longest a follower sleeps on the futex before it looks again: bounds the cost of a
/// missed wake-up (F-08-11).
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);

/// How often a read retries after a file named by an older manifest vanished (F-08-12).
const UNLINKED_READ_RETRIES: usize = 3;

/// What a store open in many-process mode shares with the others.
pub(super) struct Processes {
    pub(super) file: Arc<dyn SharedFile>,
    pub(super) tail: TailIndex,
    pub(super) pid: u32,
    /// Leases this process holds, by session id (F-08-10).
    leases: Mutex<HashMap<String, Lease>>,
    /// The store generation the catalog last caught up to (F-08-11).
    seen_generation: AtomicU64,
    /// The manifest the catalog reflects, and (read-only followers) how far it applied.
    known: Mutex<Known>,
    /// Held shared while open (F-08-4); `None` for read-only followers.
    presence: Option<ByteLock>,
    _flock: Option<Box<dyn LockGuard>>,
}

struct Known {
    manifest: Manifest,
    manifest_generation: u64,
    /// Read-only followers: how far the catalog applied (writers keep it in the log).
    applied: LogPosition,
}

/// A store opened by [`open_shared_writer`] before its `Inner` exists.
pub(super) struct SharedOpen {
    pub(super) manifest: Manifest,
    pub(super) recovered: crate::recovery::Recovered,
    pub(super) log: Log,
    pub(super) processes: Processes,
    pub(super) inner_cell: Arc<OnceLock<Weak<Inner>>>,
}

fn io_failure(operation: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |error| Error::io(operation, error)
}

/// Opens the store for writing in shared mode (F-08-4): alone, with recovery's repairs and
/// cleanup and a fresh shared index; or joining the live processes at their published end.
pub(super) fn open_shared_writer(
    storage: &Arc<dyn Storage>,
    options: &Options,
    label: &Path,
) -> Result<SharedOpen> {
    let flock = storage
        .try_lock_shared(LOCK_FILE)
        .map_err(io_failure("lock"))?
        .ok_or_else(|| Error::Locked {
            path: label.to_path_buf(),
        })?;
    let file = storage
        .open_shared(SHARED_FILE)
        .map_err(io_failure("shared file"))?;
    let tail = TailIndex::new(file.clone());
    let _opening =
        ByteLock::wait(&file, OPEN_LOCK, LockMode::Exclusive).map_err(io_failure("open lock"))?;
    let inner_cell: Arc<OnceLock<Weak<Inner>>> = Arc::new(OnceLock::new());
    let shared_log = |file: &Arc<dyn SharedFile>, tail: &TailIndex| SharedLog {
        file: file.clone(),
        tail: tail.clone(),
        catch_up: catch_up_hook(inner_cell.clone()),
    };
    let alone = ByteLock::try_take(&file, PRESENCE_LOCK, LockMode::Exclusive)
        .map_err(io_failure("presence lock"))?;
    let (manifest, recovered, log, presence) = match alone {
        Some(presence) => {
            let manifest = match Manifest::read(storage.as_ref())? {
                Some(manifest) => manifest,
                None if options.create_if_missing => create_store(storage.as_ref(), label)?,
                None => {
                    return Err(Error::NotAStore {
                        path: label.to_path_buf(),
                    })
                }
            };
            let mut recovered = recover(storage.as_ref(), &manifest, options.use_checkpoint)?;
            remove_orphans(storage.as_ref(), &manifest, &mut recovered.report)?;
            let (log, start) = start_log(
                storage,
                options,
                manifest.clone(),
                recovered.tail.clone(),
                Some(shared_log(&file, &tail)),
            )?;
            tail.initialize(start.segment, start.salt, start.offset);
            presence
                .convert(LockMode::Shared)
                .map_err(io_failure("presence lock"))?;
            (log.manifest(), recovered, log, presence)
        }
        None => {
            let presence = ByteLock::wait(&file, PRESENCE_LOCK, LockMode::Shared)
                .map_err(io_failure("presence lock"))?;
            if !tail.is_initialized() {
                return Err(Error::CorruptFile {
                    file: SHARED_FILE.to_string(),
                    reason: "live writers but an uninitialized shared index".to_string(),
                });
            }
            let published = tail.read();
            let manifest = Manifest::read(storage.as_ref())?.ok_or_else(|| Error::NotAStore {
                path: label.to_path_buf(),
            })?;
            let recovered = recover_until(
                storage.as_ref(),
                &manifest,
                options.use_checkpoint,
                Some(end_of(&published)),
            )?;
            let segment_file = storage
                .open(&segment_path(published.segment), false)
                .map_err(io_failure("segment open"))?;
            let log = Log::start(
                storage.clone(),
                log_options(options),
                manifest.clone(),
                segment_file,
                published.segment,
                published.salt,
                published.written_end,
                Some(shared_log(&file, &tail)),
            );
            (manifest, recovered, log, presence)
        }
    };
    let manifest_generation = tail.manifest_generation();
    let seen_generation = AtomicU64::new(tail.store_generation());
    let applied = end_of(&tail.read());
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
            known: Mutex::new(Known {
                manifest,
                manifest_generation,
                applied,
            }),
            presence: Some(presence),
            _flock: Some(flock),
        },
        inner_cell,
    })
}

/// A read-only open that follows live writers (F-08-4): when a shared-mode writer is live,
/// the catalog stops at the published end and `refresh` moves it on; otherwise (no writer,
/// no `SHARED`, a read-only file system) the open is the snapshot of F-01-3.
pub(super) fn follow_read_only(
    storage: &Arc<dyn Storage>,
    options: &Options,
) -> Result<Option<(crate::recovery::Recovered, Processes)>> {
    if !storage.exists(SHARED_FILE).unwrap_or(false) {
        return Ok(None);
    }
    let Ok(file) = storage.open_shared(SHARED_FILE) else {
        return Ok(None);
    };
    let tail = TailIndex::new(file.clone());
    let probe = (|| -> std::io::Result<bool> {
        let _opening = ByteLock::wait(&file, OPEN_LOCK, LockMode::Exclusive)?;
        let nobody = ByteLock::try_take(&file, PRESENCE_LOCK, LockMode::Exclusive)?;
        Ok(nobody.is_none() && tail.is_initialized())
    })();
    if !matches!(probe, Ok(true)) {
        return Ok(None);
    }
    let published = tail.read();
    let Some(manifest) = Manifest::read(storage.as_ref())? else {
        return Ok(None);
    };
    let recovered = recover_until(
        storage.as_ref(),
        &manifest,
        options.use_checkpoint,
        Some(end_of(&published)),
    )?;
    let manifest_generation = tail.manifest_generation();
    let seen_generation = AtomicU64::new(tail.store_generation());
    Ok(Some((
        recovered,
        Processes {
            file,
            tail,
            pid: std::process::id(),
            leases: Mutex::new(HashMap::new()),
            seen_generation,
            known: Mutex::new(Known {
                manifest,
                manifest_generation,
                applied: end_of(&published),
            }),
            presence: None,
            _flock: None,
        },
    )))
}

fn end_of(tail: &Tail) -> LogPosition {
    LogPosition {
        segment: tail.segment,
        offset: tail.written_end,
    }
}

fn catch_up_hook(cell: Arc<OnceLock<Weak<Inner>>>) -> Box<crate::commit::CatchUp> {
    Box::new(move |from, tail| {
        let inner = cell.get().and_then(Weak::upgrade).ok_or(Error::Closed)?;
        catch_up(&inner, from, tail)
    })
}

/// Applies the published log between `from` and the tail to the catalog (F-08-11): the
/// new bytes only, segment by segment; after a manifest replacement that dropped files
/// (sealing, a run rewrite) the catalog is rebuilt from the checkpoint and the log up to
/// the published end instead.
fn catch_up(inner: &Inner, from: LogPosition, tail: &Tail) -> Result<LogPosition> {
    let Some(processes) = &inner.processes else {
        return Ok(from);
    };
    let storage = inner.storage.as_ref();
    let mut known = processes.known.lock();
    let generation = processes.tail.manifest_generation();
    if generation != known.manifest_generation {
        let manifest = Manifest::read(storage)?.ok_or_else(|| Error::CorruptFile {
            file: MANIFEST_FILE.to_string(),
            reason: "removed while the store is open".to_string(),
        })?;
        let only_appended = manifest.runs == known.manifest.runs
            && manifest.segments.starts_with(&known.manifest.segments);
        known.manifest = manifest;
        known.manifest_generation = generation;
        if !only_appended {
            reload_catalog(inner, &known.manifest, tail)?;
            return Ok(end_of(tail));
        }
    }
    let target = end_of(tail);
    let mut position = from;
    while position < target {
        let Some(index) = known
            .manifest
            .segments
            .iter()
            .position(|entry| entry.id == position.segment)
        else {
            reload_catalog(inner, &known.manifest, tail)?;
            return Ok(target);
        };
        let entry = known.manifest.segments[index];
        inner.salts.write().insert(entry.id, entry.salt);
        if entry.id == target.segment {
            apply_segment_range(inner, entry, position.offset, Some(target.offset))?;
            return Ok(target);
        }
        // A segment before the tail was rolled away from: read it to its seal.
        apply_segment_range(inner, entry, position.offset, None)?;
        if known.manifest.segments.get(index + 1).is_none() {
            // The roll's manifest is newer than the one read.
            if let Some(manifest) = Manifest::read(storage)? {
                known.manifest = manifest;
            }
        }
        let next = known
            .manifest
            .segments
            .iter()
            .find(|later| later.id > entry.id)
            .ok_or_else(|| Error::Corrupt {
                segment: entry.id,
                offset: 0,
                reason: "a rolled segment has no successor in the manifest".to_string(),
            })?;
        position = LogPosition {
            segment: next.id,
            offset: SEGMENT_HEADER_BYTES,
        };
    }
    Ok(position)
}

/// Applies segment `entry` from `start` to `end`, or (`None`) to its seal.
fn apply_segment_range(
    inner: &Inner,
    entry: SegmentEntry,
    start: u64,
    end: Option<u64>,
) -> Result<()> {
    let file = match inner.files.lock().get(&entry.id) {
        Some(file) => file.clone(),
        None => inner
            .storage
            .open_read(&segment_path(entry.id))
            .map_err(io_failure("segment open"))?,
    };
    let to_seal = end.is_none();
    let end = match end {
        Some(end) => end,
        None => file.len().map_err(io_failure("segment length"))?,
    };
    if end <= start {
        return Ok(());
    }
    let mut bytes = vec![0; (end - start) as usize];
    file.read_exact_at(&mut bytes, start)
        .map_err(io_failure("segment read"))?;
    inner.files.lock().entry(entry.id).or_insert(file);
    let mut catalog = inner.catalog.write();
    apply_published(&mut catalog, &bytes, start, entry.id, entry.salt, to_seal)?;
    Ok(())
}

/// Rebuilds the catalog from the checkpoint and the log up to the published end (after
/// another process sealed or rewrote files), keeping which sessions have a writer here.
fn reload_catalog(inner: &Inner, manifest: &Manifest, tail: &Tail) -> Result<()> {
    let recovered = recover_until(
        inner.storage.as_ref(),
        manifest,
        inner.options.use_checkpoint,
        Some(end_of(tail)),
    )?;
    let mut fresh = recovered.catalog;
    let mut catalog = inner.catalog.write();
    for (number, entry) in &catalog.sessions {
        if entry.has_writer {
            if let Some(reloaded) = fresh.sessions.get_mut(number) {
                reloaded.has_writer = true;
            }
        }
    }
    *catalog = fresh;
    *inner.salts.write() = manifest
        .segments
        .iter()
        .map(|entry| (entry.id, entry.salt))
        .collect();
    *inner.run_entries.write() = manifest.runs.iter().map(|run| (run.id, *run)).collect();
    let live: std::collections::HashSet<u64> = manifest
        .segments
        .iter()
        .map(|entry| entry.id)
        .chain(manifest.runs.iter().map(|run| run.id))
        .collect();
    inner.run_readers.lock().retain(|id, _| live.contains(id));
    inner.files.lock().retain(|id, _| live.contains(id));
    Ok(())
}

impl Processes {
    /// The manifest the catalog reflects.
    pub(super) fn manifest(&self) -> Manifest {
        self.known.lock().manifest.clone()
    }
}

impl Store {
    /// Whether this store shares its files with other processes (format-spec/08).
    pub fn is_shared(&self) -> bool {
        self.inner.processes.is_some()
    }

    /// Sees what other processes committed since the last look (F-08-11). Returns whether
    /// anything changed. With nothing new it costs one load from shared memory; otherwise
    /// it reads the new bytes only (or, after another process sealed or rewrote files,
    /// rebuilds the catalog from the checkpoint). A store without other processes (an
    /// exclusive writer, a snapshot) never changes under it: `Ok(false)`.
    pub fn refresh(&self) -> Result<bool> {
        let Some(processes) = &self.inner.processes else {
            return Ok(false);
        };
        let generation = processes.tail.store_generation();
        if generation == processes.seen_generation.load(Ordering::Acquire) {
            return Ok(false);
        }
        match &self.inner.log {
            Some(log) => log.catch_up()?,
            None => {
                let tail = processes.tail.read();
                let from = processes.known.lock().applied;
                let applied = catch_up(&self.inner, from, &tail)?;
                processes.known.lock().applied = applied;
            }
        }
        processes
            .seen_generation
            .store(generation, Ordering::Release);
        Ok(true)
    }

    /// Takes the lease of session `id` for this process (F-08-10), unless it holds it.
    pub(super) fn take_lease(&self, id: &str) -> Result<()> {
        let Some(processes) = &self.inner.processes else {
            return Ok(());
        };
        if processes.presence.is_none() {
            return Err(Error::ReadOnly);
        }
        let mut leases = processes.leases.lock();
        if leases.contains_key(id) {
            return Ok(());
        }
        match try_lease(&processes.file, &processes.tail, id, processes.pid) {
            Ok(lease) => {
                leases.insert(id.to_string(), lease);
                Ok(())
            }
            Err(LeaseRefused::Busy { pid }) => Err(Error::SessionBusy {
                session: id.to_string(),
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
    /// handed out, so that appends continue at the session's true next seq.
    pub(super) fn lease_and_refresh(&self, id: &str) -> Result<bool> {
        let Some(processes) = &self.inner.processes else {
            return Ok(false);
        };
        let held_before = processes.leases.lock().contains_key(id);
        self.take_lease(id)?;
        if let Err(error) = self.refresh() {
            if !held_before {
                self.release_lease(id);
            }
            return Err(error);
        }
        Ok(!held_before)
    }

    /// The `MAINTENANCE` lock when other processes may maintain too (F-08-12): `Ok(None)`
    /// means another process is maintaining and this pass is skipped.
    pub(super) fn maintenance_turn(&self) -> Result<Option<Option<ByteLock>>> {
        let Some(processes) = &self.inner.processes else {
            return Ok(Some(None));
        };
        match ByteLock::try_take(&processes.file, MAINTENANCE_LOCK, LockMode::Exclusive)
            .map_err(io_failure("maintenance lock"))?
        {
            Some(lock) => {
                self.refresh()?;
                Ok(Some(Some(lock)))
            }
            None => Ok(None),
        }
    }

    /// Whether this process is the last writer process (under `OPEN`, so none joins
    /// meanwhile): then a close may seal and checkpoint as a single writer does (F-08-4).
    /// Returns the `OPEN` lock to hold through the close.
    pub(super) fn last_writer(&self) -> Option<ByteLock> {
        let processes = self.inner.processes.as_ref()?;
        let presence = processes.presence.as_ref()?;
        let opening = ByteLock::wait(&processes.file, OPEN_LOCK, LockMode::Exclusive).ok()?;
        let alone = processes
            .file
            .lock(presence.offset(), LockMode::Exclusive, false)
            .unwrap_or(false);
        alone.then_some(opening)
    }

    /// The durable position of the log (F-08-7), for followers.
    fn durable_position(&self) -> Option<LogPosition> {
        self.inner
            .processes
            .as_ref()
            .map(|processes| processes.tail.durable())
    }

    /// Reads `from..` of session `id` but only the events that are durable (F-08-11).
    fn read_durable(&self, id: &str, from: u64) -> Result<Vec<Event>> {
        let durable = self.durable_position();
        let runs: std::collections::HashSet<u64> =
            self.inner.run_entries.read().keys().copied().collect();
        let mut events = Vec::new();
        let result = self.for_each_event(id, from, u64::MAX, |event, event_type, position| {
            let is_durable = runs.contains(&position.segment)
                || durable.is_none_or(|durable| {
                    (position.segment, position.end()) <= (durable.segment, durable.offset)
                        || position.segment < durable.segment
                });
            if !is_durable {
                return Err(Error::Closed);
            }
            events.push(
                EventView {
                    seq: event.seq,
                    time: event.time,
                    event_type,
                    data: event_text(event.data, position)?,
                    envelope: event_text(event.envelope, position)?,
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
    /// processes commit them.
    pub fn subscribe(&self, id: &str, from_seq: u64) -> Result<Subscription> {
        Ok(Subscription {
            store: self.clone(),
            id: id.to_string(),
            next_seq: from_seq,
            buffered: VecDeque::new(),
        })
    }

    /// Runs `read`, and when a file it needs was removed by another process's maintenance
    /// since the catalog last looked (F-08-12), refreshes and runs it again: never a
    /// corruption for a file an older manifest named.
    pub(super) fn retry_unlinked<T>(&self, mut read: impl FnMut() -> Result<T>) -> Result<T> {
        let mut attempts = 0;
        loop {
            match read() {
                Err(error) if self.is_shared() && attempts < UNLINKED_READ_RETRIES => {
                    if !vanished_file(&error) {
                        return Err(error);
                    }
                    attempts += 1;
                    self.refresh()?;
                }
                outcome => return outcome,
            }
        }
    }
}

/// Whether a read failed because a file is gone (not because it is damaged).
fn vanished_file(error: &Error) -> bool {
    match error {
        Error::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
        Error::CorruptFile { reason, .. } => reason == "named by the manifest but missing",
        _ => false,
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

    /// The next event, waiting at most `timeout` for it (`Ok(None)`: none came). A
    /// session that does not exist yet is waited for like one with no new events.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Ok(Some(event));
            }
            let seen = self
                .store
                .inner
                .processes
                .as_ref()
                .map(|processes| processes.tail.notify_count());
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
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let nap = (deadline - now).min(FOLLOW_POLL);
            match (&self.store.inner.processes, seen) {
                (Some(processes), Some(seen)) => processes.tail.wait(seen, nap),
                _ => std::thread::sleep(nap.min(Duration::from_millis(5))),
            }
        }
    }
}

impl Iterator for Subscription {
    type Item = Result<Event>;

    /// Blocks until the next durable event (or an error).
    fn next(&mut self) -> Option<Result<Event>> {
        loop {
            match self.next_timeout(Duration::from_secs(3600)) {
                Ok(Some(event)) => return Some(Ok(event)),
                Ok(None) => continue,
                Err(error) => return Some(Err(error)),
            }
        }
    }
}
