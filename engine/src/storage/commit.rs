//! Group commit (format-spec/05-commit-and-recovery.md).
//!
//! Appenders encode their batch under the log's lock (so the bytes know their segment, salt
//! and offset) and queue them; one committer thread writes everything queued with one write
//! per segment and one `fdatasync`, then wakes the waiters. A failed write or sync poisons the
//! log: nothing after it is acknowledged, and every waiting and later caller gets the failure's
//! operating-system error (a full disk says so), not only the name of the operation.

use crate::error::{Error, Result};
use crate::storage::frame::Record;
use crate::storage::io::{Storage, StorageFile};
use crate::storage::manifest::{Manifest, RunEntry, SegmentEntry};
use crate::storage::segment::{
    create_segment, segment_path, SEAL_FRAME_BYTES, SEGMENT_HEADER_BYTES,
};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How durable an append is when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Returns once the batch is on stable storage (`fdatasync` done).
    Sync,
    /// Returns at once; a sync follows within `max_delay` or once `max_bytes` are queued.
    /// `flush()` waits for it.
    Batched {
        max_delay: Duration,
        max_bytes: usize,
    },
    /// Returns once the batch is written to the operating system, never synced by itself:
    /// survives a process crash, not a power cut.
    Buffered,
}

/// Settings of the log.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Preallocated size of one segment, in bytes.
    pub segment_bytes: u64,
    /// Queued bytes above which appenders wait (back-pressure), in bytes.
    pub max_pending_bytes: usize,
    /// Largest encoded batch accepted, in bytes.
    pub max_batch_bytes: u64,
}

/// What an appender's encoder sees: the segment its bytes go to.
pub struct SegmentContext {
    pub segment: u64,
    pub salt: u64,
    /// Absolute offset in the segment where the encoded bytes will start.
    pub base_offset: u64,
    /// Offset below which the segment is known durable (goes into commit records).
    pub durable_offset: u64,
    /// Session numbers whose header record this segment already holds.
    pub defined_sessions: HashSet<u32>,
    /// Type numbers whose definition record this segment already holds.
    pub defined_types: HashSet<u32>,
}

struct Active {
    file: Arc<dyn StorageFile>,
    context: SegmentContext,
}

struct Chunk {
    file: Arc<dyn StorageFile>,
    segment: u64,
    offset: u64,
    bytes: Vec<u8>,
    /// Set on the last chunk of a segment: after writing, sync and trim the file to this size.
    trim_to: Option<u64>,
}

struct State {
    active: Active,
    manifest: Manifest,
    queue: VecDeque<Chunk>,
    queued_bytes: usize,
    next_ticket: u64,
    written_ticket: u64,
    durable_ticket: u64,
    /// Highest ticket whose appender (or a flush) wants a sync now.
    sync_wanted: u64,
    /// Highest ticket that must at least be written now.
    write_wanted: u64,
    batched_deadline: Option<Instant>,
    batched_bytes: usize,
    batched_max_bytes: usize,
    /// (segment, offset) up to which queued bytes have been written.
    written_position: (u64, u64),
    /// The first failed write or sync; from then on the log refuses every batch.
    poisoned: Option<Poison>,
    closing: bool,
    committer_done: bool,
    sealed: bool,
    /// Appenders asleep until their ticket is written or durable.
    waiters: Vec<Waiter>,
    /// `Sync` and `Buffered` batches in the previous group: about how many its appenders
    /// (threads it woke, or one thread pipelining many sessions with `submit`) will submit
    /// again soon. `Batched` batches do not count: nobody waits for them.
    last_group_tickets: usize,
    /// `Sync` and `Buffered` batches queued since the last group.
    queued_waitable: usize,
    /// When the oldest queued batch was submitted.
    queued_since: Option<Instant>,
    /// A flush or a reader waits: write without gathering.
    urgent: bool,
}

/// What poisoned the log: the failed operation and its error, shared by every caller that
/// gets it (an `io::Error` cannot be cloned).
#[derive(Debug, Clone)]
struct Poison {
    operation: &'static str,
    source: Arc<io::Error>,
}

impl Poison {
    fn error(&self) -> Error {
        Error::Poisoned {
            operation: self.operation,
            source: self.source.clone(),
        }
    }
}

/// One sleeping appender. The committer wakes exactly the appenders a group finished, so a
/// group costs one wake-up per finished appender rather than one per sleeping thread.
struct Waiter {
    ticket: u64,
    durable: bool,
    thread: std::thread::Thread,
    woken: Arc<std::sync::atomic::AtomicBool>,
}

struct Shared {
    storage: Arc<dyn Storage>,
    options: LogOptions,
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    space: Condvar,
}

/// The write-ahead log: segments plus the committer thread.
pub struct Log {
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

/// The ticket of a queued batch and where its bytes start.
#[derive(Debug, Clone, Copy)]
pub struct Submitted {
    pub ticket: u64,
    pub segment: u64,
    pub offset: u64,
}

pub use crate::limits::MAX_GROUP_GATHER;

pub use crate::limits::DEFAULT_MAX_BATCH_BYTES;

/// Name of the group-commit thread (`dshdb-committer`), as [`Error::ThreadStart`] names it.
pub const COMMITTER_THREAD: &str = "committer";

/// Starts the store's background thread `thread` (named `dshdb-<thread>`); an operating
/// system that cannot start it (out of threads or memory) is an [`Error::ThreadStart`]: the
/// caller must not go on without the thread, or everything waiting for it would wait forever.
pub fn start_thread(
    thread: &'static str,
    body: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>> {
    #[cfg(any(test, feature = "testing"))]
    if thread_start_faults::take(thread) {
        return Err(Error::ThreadStart {
            thread,
            source: io::Error::from_raw_os_error(libc::EAGAIN),
        });
    }
    std::thread::Builder::new()
        .name(format!("dshdb-{thread}"))
        .spawn(body)
        .map_err(|source| Error::ThreadStart { thread, source })
}

/// Test hook: makes a thread start fail as when the process is out of threads.
#[cfg(any(test, feature = "testing"))]
pub mod thread_start_faults {
    use std::cell::RefCell;

    thread_local! {
        /// Threads whose next start from this thread fails. Thread-local, so that tests
        /// running in parallel in one binary never see each other's faults.
        static FAILING: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
    }

    /// The next start of the background thread `thread` ([`super::COMMITTER_THREAD`],
    /// `store::MAINTENANCE_THREAD`) by the calling thread fails with `EAGAIN`; later starts
    /// succeed again.
    pub fn fail_next_start(thread: &'static str) {
        FAILING.with(|failing| failing.borrow_mut().push(thread));
    }

    /// Whether this start of `thread` is to fail (consuming the fault).
    pub(super) fn take(thread: &'static str) -> bool {
        FAILING.with(|failing| {
            let mut failing = failing.borrow_mut();
            let position = failing.iter().position(|name| *name == thread);
            position.map(|index| failing.remove(index)).is_some()
        })
    }
}

fn check_batch_size(bytes: usize, limit: u64) -> Result<()> {
    let size = bytes as u64;
    if size > limit {
        return Err(Error::TooLarge {
            what: "batch",
            unit: "bytes",
            size,
            limit,
        });
    }
    Ok(())
}

/// A fresh random salt: segments must never share one, so that stale bytes never validate.
pub fn new_salt() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    hasher.finish()
}

impl State {
    /// A log whose active segment's data ends at `tail`, durable up to there, nothing queued.
    fn new(
        file: Arc<dyn StorageFile>,
        manifest: Manifest,
        segment: u64,
        salt: u64,
        tail: u64,
    ) -> State {
        State {
            active: Active {
                file,
                context: SegmentContext {
                    segment,
                    salt,
                    base_offset: tail,
                    durable_offset: tail,
                    defined_sessions: HashSet::new(),
                    defined_types: HashSet::new(),
                },
            },
            manifest,
            queue: VecDeque::new(),
            queued_bytes: 0,
            next_ticket: 1,
            written_ticket: 0,
            durable_ticket: 0,
            sync_wanted: 0,
            write_wanted: 0,
            batched_deadline: None,
            batched_bytes: 0,
            batched_max_bytes: usize::MAX,
            written_position: (segment, tail),
            poisoned: None,
            closing: false,
            committer_done: false,
            sealed: false,
            waiters: Vec::new(),
            last_group_tickets: 0,
            queued_waitable: 0,
            queued_since: None,
            urgent: false,
        }
    }
}

impl Log {
    /// Starts the log on an open active segment (its data ends at `tail`, durable up to there).
    /// Fails when the committer thread cannot start: without it no batch would ever finish.
    pub fn start(
        storage: Arc<dyn Storage>,
        options: LogOptions,
        manifest: Manifest,
        file: Arc<dyn StorageFile>,
        segment: u64,
        salt: u64,
        tail: u64,
    ) -> Result<Log> {
        let state = State::new(file, manifest, segment, salt, tail);
        let log = Log::without_committer(storage, options, state);
        let worker = log.shared.clone();
        let committer = start_thread(COMMITTER_THREAD, move || worker.run_committer())?;
        *log.committer.lock() = Some(committer);
        Ok(log)
    }

    /// A log on `state` whose committer is not running yet (unit tests run its groups).
    fn without_committer(storage: Arc<dyn Storage>, options: LogOptions, state: State) -> Log {
        let shared = Arc::new(Shared {
            storage,
            options,
            state: Mutex::new(state),
            work: Condvar::new(),
            done: Condvar::new(),
            space: Condvar::new(),
        });
        Log {
            shared,
            committer: Mutex::new(None),
        }
    }

    /// Encodes a batch with `encode` into the active segment's queue and returns its ticket.
    /// `encode` may run twice (again after a segment roll); it must only append to `out`.
    /// It returns the batch size limit check's verdict as an error to refuse the batch.
    pub fn submit<T>(
        &self,
        durability: Durability,
        mut encode: impl FnMut(&mut SegmentContext, &mut Vec<u8>) -> Result<T>,
    ) -> Result<(Submitted, T)> {
        let shared = &self.shared;
        let mut state = shared.state.lock();
        loop {
            state.check_usable()?;
            if state.queued_bytes <= shared.options.max_pending_bytes {
                break;
            }
            shared.space.wait(&mut state);
        }
        let mut bytes = Vec::new();
        let mut context_snapshot = state.active.context.clone_sets();
        let mut outcome = encode(&mut context_snapshot, &mut bytes)?;
        check_batch_size(bytes.len(), shared.options.max_batch_bytes)?;
        let fits = state.active.context.base_offset + bytes.len() as u64 + SEAL_FRAME_BYTES
            <= shared.options.segment_bytes;
        if !fits {
            // In a new segment the batch repeats its session headers and type definitions:
            // size the segment for that encoding, so that a batch larger than a segment gets
            // a segment of its own instead of being refused (F-03-9).
            let mut fresh = state.active.context.clone_sets();
            fresh.defined_sessions.clear();
            fresh.defined_types.clear();
            bytes.clear();
            encode(&mut fresh, &mut bytes)?;
            check_batch_size(bytes.len(), shared.options.max_batch_bytes)?;
            let capacity = shared
                .options
                .segment_bytes
                .max(SEGMENT_HEADER_BYTES + bytes.len() as u64 + SEAL_FRAME_BYTES);
            shared.roll(&mut state, capacity)?;
            bytes.clear();
            context_snapshot = state.active.context.clone_sets();
            outcome = encode(&mut context_snapshot, &mut bytes)?;
            if state.active.context.base_offset + bytes.len() as u64 + SEAL_FRAME_BYTES > capacity {
                return Err(Error::TooLarge {
                    what: "batch",
                    unit: "bytes",
                    size: bytes.len() as u64,
                    limit: capacity - SEGMENT_HEADER_BYTES - SEAL_FRAME_BYTES,
                });
            }
        }
        let ticket = state.next_ticket;
        let context = &mut state.active.context;
        context.defined_sessions = context_snapshot.defined_sessions;
        context.defined_types = context_snapshot.defined_types;
        let submitted = Submitted {
            ticket,
            segment: context.segment,
            offset: context.base_offset,
        };
        context.base_offset += bytes.len() as u64;
        state.next_ticket += 1;
        if state.queued_since.is_none() {
            state.queued_since = Some(Instant::now());
        }
        state.note_durability(durability, bytes.len(), submitted.ticket);
        let file = state.active.file.clone();
        state.enqueue(file, submitted.segment, submitted.offset, bytes, None);
        // Wake the committer when a group starts or when the gathered group is complete;
        // waking it for every arrival in between would only cost context switches.
        let queued = state.next_ticket - 1 - state.written_ticket;
        if queued == 1 || state.queued_waitable >= state.last_group_tickets {
            shared.work.notify_one();
        }
        Ok((submitted, outcome))
    }

    /// Waits until `ticket` is written (`Buffered`) or durable (otherwise).
    pub fn wait(&self, ticket: u64, durable: bool) -> Result<()> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let woken = Arc::new(AtomicBool::new(false));
        {
            let mut state = self.shared.state.lock();
            if let Some(outcome) = state.wait_outcome(ticket, durable) {
                return outcome;
            }
            state.waiters.push(Waiter {
                ticket,
                durable,
                thread: std::thread::current(),
                woken: woken.clone(),
            });
        }
        // `park` may return spuriously: only the committer's flag ends the wait.
        while !woken.load(Ordering::Acquire) {
            std::thread::park();
        }
        let state = self.shared.state.lock();
        state
            .wait_outcome(ticket, durable)
            .unwrap_or(Err(Error::Closed))
    }

    /// Makes everything queued so far durable.
    pub fn flush(&self) -> Result<()> {
        let ticket = {
            let mut state = self.shared.state.lock();
            let last = state.next_ticket - 1;
            state.sync_wanted = state.sync_wanted.max(last);
            state.write_wanted = state.write_wanted.max(last);
            state.urgent = true;
            if state.durable_ticket < last {
                // A flush after buffered writes with nothing new queued still needs a sync.
                self.shared.work.notify_one();
            }
            last
        };
        self.wait(ticket, true)
    }

    /// Waits until the bytes up to (`segment`, `end`) are written, so a reader can read them.
    pub fn wait_written(&self, segment: u64, end: u64) -> Result<()> {
        let mut state = self.shared.state.lock();
        loop {
            if state.written_position >= (segment, end) {
                return Ok(());
            }
            if let Some(poison) = &state.poisoned {
                return Err(poison.error());
            }
            state.write_wanted = state.next_ticket - 1;
            state.urgent = true;
            self.shared.work.notify_one();
            self.shared.done.wait(&mut state);
        }
    }

    /// The file behind a live segment, for readers.
    pub fn active_segment(&self) -> (u64, Arc<dyn StorageFile>) {
        let state = self.shared.state.lock();
        (state.active.context.segment, state.active.file.clone())
    }

    /// The salt of a segment the manifest names.
    pub fn salt_of(&self, segment: u64) -> Option<u64> {
        let state = self.shared.state.lock();
        state
            .manifest
            .segments
            .iter()
            .find(|entry| entry.id == segment)
            .map(|entry| entry.salt)
    }

    /// A copy of the manifest in force.
    pub fn manifest(&self) -> Manifest {
        self.shared.state.lock().manifest.clone()
    }

    /// The oldest live segment if it is not the one taking appends (so it is sealed; its
    /// seal is durable once a `flush` returned after the roll that queued it).
    pub fn oldest_sealed_segment(&self) -> Option<SegmentEntry> {
        let state = self.shared.state.lock();
        let oldest = *state.manifest.segments.first()?;
        (oldest.id != state.active.context.segment && state.written_position.0 > oldest.id)
            .then_some(oldest)
    }

    /// Takes the next file id from the manifest's counter for a run file (F-06-10 step 1);
    /// it reaches the disk with the next manifest write.
    pub fn allocate_file_id(&self) -> Result<u64> {
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        let id = state.manifest.next_segment_id;
        state.manifest.next_segment_id += 1;
        Ok(id)
    }

    /// Replaces the manifest by one where the oldest segment `segment` is replaced by `run`
    /// (F-06-10 step 3), or just dropped when it held no record (`None`, F-06-14). A failure
    /// after the rename poisons the log like a failed roll.
    pub fn replace_segment_with_run(&self, segment: u64, run: Option<RunEntry>) -> Result<()> {
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        if state.manifest.segments.first().map(|entry| entry.id) != Some(segment)
            || segment == state.active.context.segment
        {
            return Err(Error::invalid(
                "only the oldest sealed segment can become a run",
            ));
        }
        let mut manifest = state.manifest.clone();
        manifest.segments.remove(0);
        manifest.runs.extend(run);
        self.install_manifest(&mut state, manifest)
    }

    /// Makes a manifest naming `new` where it named run `old` (same place in the log
    /// order) durable and in force (F-06-26).
    pub fn replace_run(&self, old: u64, new: RunEntry) -> Result<()> {
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        let mut manifest = state.manifest.clone();
        let slot = manifest
            .runs
            .iter_mut()
            .find(|run| run.id == old)
            .ok_or_else(|| Error::invalid("the run to replace is not in the manifest"))?;
        *slot = new;
        self.install_manifest(&mut state, manifest)
    }

    /// Writes `manifest` and puts it in force; a failure after its rename poisons the log
    /// (the file on disk may then be either manifest).
    fn install_manifest(&self, state: &mut State, manifest: Manifest) -> Result<()> {
        if let Err(failure) = manifest.write_reporting_stage(self.shared.storage.as_ref()) {
            if failure.after_rename {
                return Err(state.poison_with(failure.error));
            }
            return Err(failure.error);
        }
        state.manifest = manifest;
        Ok(())
    }

    /// Durable ticket so far (for receipts).
    pub fn durable_ticket(&self) -> u64 {
        self.shared.state.lock().durable_ticket
    }

    /// The error every write gets once an earlier failure poisoned the log.
    pub fn poisoned(&self) -> Option<Error> {
        self.shared
            .state
            .lock()
            .poisoned
            .as_ref()
            .map(Poison::error)
    }

    /// Drains the queue, syncs, seals the active segment and stops the committer.
    /// After this the log takes no more batches.
    pub fn close(&self) -> Result<()> {
        {
            let mut state = self.shared.state.lock();
            state.closing = true;
            state.sync_wanted = state.next_ticket - 1;
            self.shared.work.notify_one();
        }
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
        let mut state = self.shared.state.lock();
        if state.sealed {
            return Ok(());
        }
        if let Some(poison) = &state.poisoned {
            return Err(poison.error());
        }
        let result = self.shared.seal_active(&state);
        state.sealed = true;
        result.map_err(|(operation, source)| state.poison(operation, source))
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.closing = true;
        self.shared.work.notify_one();
        drop(state);
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }
}

impl SegmentContext {
    fn clone_sets(&self) -> SegmentContext {
        SegmentContext {
            segment: self.segment,
            salt: self.salt,
            base_offset: self.base_offset,
            durable_offset: self.durable_offset,
            defined_sessions: self.defined_sessions.clone(),
            defined_types: self.defined_types.clone(),
        }
    }
}

impl State {
    /// `Some` once waiting for `ticket` is over: reached, poisoned or stopped.
    fn wait_outcome(&self, ticket: u64, durable: bool) -> Option<Result<()>> {
        let reached = if durable {
            self.durable_ticket >= ticket
        } else {
            self.written_ticket >= ticket
        };
        if reached {
            return Some(Ok(()));
        }
        if let Some(poison) = &self.poisoned {
            return Some(Err(poison.error()));
        }
        if self.committer_done {
            return Some(Err(Error::Closed));
        }
        None
    }

    /// Removes and returns the waiters whose wait is over.
    fn finished_waiters(&mut self) -> Vec<Waiter> {
        let mut finished = Vec::new();
        let mut index = 0;
        while index < self.waiters.len() {
            let waiter = &self.waiters[index];
            if self.wait_outcome(waiter.ticket, waiter.durable).is_some() {
                finished.push(self.waiters.swap_remove(index));
            } else {
                index += 1;
            }
        }
        finished
    }

    /// Poisons the log with a failed `operation` (the first failure stays the cause) and
    /// returns the error its callers get.
    fn poison(&mut self, operation: &'static str, source: io::Error) -> Error {
        self.poisoned
            .get_or_insert(Poison {
                operation,
                source: Arc::new(source),
            })
            .error()
    }

    /// Poisons the log with a failed I/O step that came back as an [`Error`].
    fn poison_with(&mut self, error: Error) -> Error {
        match error.into_io() {
            Ok((operation, source)) => self.poison(operation, source),
            // Every step of a manifest write is I/O; should another error ever come here,
            // its text is kept as the cause.
            Err(other) => self.poison("manifest write", io::Error::other(other.to_string())),
        }
    }

    fn check_usable(&self) -> Result<()> {
        if let Some(poison) = &self.poisoned {
            return Err(poison.error());
        }
        if self.closing {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn note_durability(&mut self, durability: Durability, bytes: usize, ticket: u64) {
        match durability {
            Durability::Sync => {
                self.sync_wanted = ticket;
                self.write_wanted = ticket;
                self.queued_waitable += 1;
            }
            Durability::Buffered => {
                self.write_wanted = ticket;
                self.queued_waitable += 1;
            }
            Durability::Batched {
                max_delay,
                max_bytes,
            } => {
                self.batched_bytes += bytes;
                self.batched_max_bytes = self.batched_max_bytes.min(max_bytes);
                if self.batched_deadline.is_none() {
                    self.batched_deadline = Some(Instant::now() + max_delay);
                }
            }
        }
    }

    fn enqueue(
        &mut self,
        file: Arc<dyn StorageFile>,
        segment: u64,
        offset: u64,
        bytes: Vec<u8>,
        trim_to: Option<u64>,
    ) {
        self.queued_bytes += bytes.len();
        // Appending to the previous chunk keeps one write per segment per group.
        if let Some(last) = self.queue.back_mut() {
            if last.segment == segment
                && last.trim_to.is_none()
                && last.offset + last.bytes.len() as u64 == offset
            {
                last.bytes.extend_from_slice(&bytes);
                last.trim_to = trim_to;
                return;
            }
        }
        self.queue.push_back(Chunk {
            file,
            segment,
            offset,
            bytes,
            trim_to,
        });
    }

    /// Whether the committer has something to do right now, and if not, until when to sleep.
    fn due(&self, now: Instant) -> (bool, Option<Instant>) {
        let unwritten = self.next_ticket - 1 > self.written_ticket;
        let unsynced = self.next_ticket - 1 > self.durable_ticket;
        if !self.closing && !self.urgent && self.queued_waitable < self.last_group_tickets {
            if let Some(since) = self.queued_since {
                let gather_end = since + MAX_GROUP_GATHER;
                if now < gather_end {
                    return (false, Some(gather_end));
                }
            }
        }
        if self.closing || self.write_wanted > self.written_ticket {
            return (true, None);
        }
        if self.sync_wanted > self.durable_ticket && unsynced {
            return (true, None);
        }
        if self.batched_bytes >= self.batched_max_bytes && (unwritten || unsynced) {
            return (true, None);
        }
        match self.batched_deadline {
            Some(deadline) if deadline <= now => (true, None),
            Some(deadline) => (false, Some(deadline)),
            None => (false, None),
        }
    }
}

impl Shared {
    /// Starts a new segment: creates and syncs it, names it in the manifest, and queues the
    /// seal of the old one. Runs under the state lock; rolls are rare (one per segment).
    fn roll(&self, state: &mut State, capacity_bytes: u64) -> Result<()> {
        let id = state.manifest.next_segment_id;
        let salt = new_salt();
        let file = create_segment(self.storage.as_ref(), id, salt, capacity_bytes)?;
        let mut manifest = state.manifest.clone();
        manifest.segments.push(SegmentEntry { id, salt });
        manifest.next_segment_id = id + 1;
        if let Err(failure) = manifest.write_reporting_stage(self.storage.as_ref()) {
            if failure.after_rename {
                // The new manifest may be durable: keep the segment file, refuse further
                // writes, and let the next open decide from what is on disk.
                return Err(state.poison_with(failure.error));
            }
            let _ = self.storage.remove(&segment_path(id));
            return Err(failure.error);
        }
        state.manifest = manifest;
        let old = &state.active.context;
        let mut seal = Vec::new();
        Record::Seal {
            used_bytes: old.base_offset,
            durable_offset: old.durable_offset,
        }
        .encode(&mut seal, old.salt)?;
        let (old_segment, old_offset) = (old.segment, old.base_offset);
        let trim = old_offset + seal.len() as u64;
        let old_file = state.active.file.clone();
        state.enqueue(old_file, old_segment, old_offset, seal, Some(trim));
        state.active = Active {
            file,
            context: SegmentContext {
                segment: id,
                salt,
                base_offset: SEGMENT_HEADER_BYTES,
                durable_offset: SEGMENT_HEADER_BYTES,
                defined_sessions: HashSet::new(),
                defined_types: HashSet::new(),
            },
        };
        Ok(())
    }

    fn run_committer(self: Arc<Self>) {
        let mut state = self.state.lock();
        loop {
            let (due, deadline) = state.due(Instant::now());
            if !due {
                match deadline {
                    Some(deadline) => {
                        self.work.wait_until(&mut state, deadline);
                    }
                    None => self.work.wait(&mut state),
                }
                continue;
            }
            if state.poisoned.is_some() || (state.closing && state.queue.is_empty()) {
                if state.poisoned.is_none() && state.durable_ticket < state.next_ticket - 1 {
                    // Closing after buffered writes: make them durable before stopping.
                    let file = state.active.file.clone();
                    let last = state.next_ticket - 1;
                    drop(state);
                    let synced = file.sync_data();
                    state = self.state.lock();
                    match synced {
                        Ok(()) => state.durable_ticket = last,
                        Err(source) => {
                            state.poison("sync", source);
                        }
                    }
                }
                state.committer_done = true;
                let finished = state.finished_waiters();
                self.done.notify_all();
                drop(state);
                wake(finished);
                return;
            }
            state = self.commit_group(state);
        }
    }

    /// Writes (and syncs when wanted) everything queued; returns with the lock held again.
    fn commit_group<'a>(
        &'a self,
        mut state: parking_lot::MutexGuard<'a, State>,
    ) -> parking_lot::MutexGuard<'a, State> {
        let chunks: Vec<Chunk> = state.queue.drain(..).collect();
        let last_ticket = state.next_ticket - 1;
        let group_waitable = std::mem::take(&mut state.queued_waitable);
        state.queued_since = None;
        state.urgent = false;
        let batched_due = state.batched_deadline.is_some();
        let sync = state.sync_wanted > state.durable_ticket || batched_due || state.closing;
        let active_file = state.active.file.clone();
        let active_segment = state.active.context.segment;
        drop(state);
        let outcome = write_chunks(&chunks, sync, &active_file);
        let mut state = self.state.lock();
        let written_bytes: usize = chunks.iter().map(|chunk| chunk.bytes.len()).sum();
        state.queued_bytes -= written_bytes;
        match outcome {
            Ok(()) => {
                state.written_ticket = last_ticket;
                if let Some(last) = chunks.last() {
                    state.written_position = (last.segment, last.offset + last.bytes.len() as u64);
                }
                if sync {
                    state.durable_ticket = last_ticket;
                    state.batched_deadline = None;
                    state.batched_bytes = 0;
                    state.batched_max_bytes = usize::MAX;
                    let position = state.written_position;
                    if position.0 == active_segment {
                        let context = &mut state.active.context;
                        context.durable_offset = context.durable_offset.max(position.1);
                    }
                }
            }
            Err((operation, source)) => {
                state.poison(operation, source);
            }
        }
        let finished = state.finished_waiters();
        state.last_group_tickets = group_waitable;
        self.done.notify_all();
        self.space.notify_all();
        drop(state);
        wake(finished);
        self.state.lock()
    }

    /// Writes the seal of the active segment at close; a failure names its step.
    fn seal_active(&self, state: &State) -> std::result::Result<(), (&'static str, io::Error)> {
        let context = &state.active.context;
        let mut seal = Vec::new();
        Record::Seal {
            used_bytes: context.base_offset,
            durable_offset: context.base_offset,
        }
        .encode(&mut seal, context.salt)
        // A seal has fixed-size fields: it cannot be too large; keep the cause if it were.
        .map_err(|error| {
            (
                "seal encode",
                io::Error::new(io::ErrorKind::InvalidData, error.to_string()),
            )
        })?;
        let file = &state.active.file;
        let step = |operation| move |error| (operation, error);
        file.write_at(&seal, context.base_offset)
            .map_err(step("seal write"))?;
        file.set_len(context.base_offset + seal.len() as u64)
            .map_err(step("seal trim"))?;
        file.sync_data().map_err(step("seal sync"))
    }
}

fn wake(finished: Vec<Waiter>) {
    for waiter in finished {
        waiter
            .woken
            .store(true, std::sync::atomic::Ordering::Release);
        waiter.thread.unpark();
    }
}

/// One write per chunk; before moving on to a newer segment the older one is synced, so data
/// in a newer segment always proves the older one whole (F-05-2). A failure names its step
/// and keeps the operating system's error.
fn write_chunks(
    chunks: &[Chunk],
    sync: bool,
    active: &Arc<dyn StorageFile>,
) -> std::result::Result<(), (&'static str, io::Error)> {
    let step = |operation| move |error| (operation, error);
    for chunk in chunks {
        chunk
            .file
            .write_at(&chunk.bytes, chunk.offset)
            .map_err(step("write"))?;
        if let Some(length) = chunk.trim_to {
            chunk.file.sync_data().map_err(step("sync"))?;
            chunk.file.set_len(length).map_err(step("trim"))?;
            chunk.file.sync_data().map_err(step("sync"))?;
        }
    }
    if sync {
        active.sync_data().map_err(step("sync"))?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "commit_tests.rs"]
mod tests;
