//! Group commit (format-spec/05-commit-and-recovery.md).
//!
//! Appenders encode their batch under the log's lock (so the bytes know their segment, salt
//! and offset) and queue them; one committer thread writes everything queued with one write
//! per segment and one `fdatasync`, then wakes the waiters. A failed write or sync poisons the
//! log: nothing after it is acknowledged, and every waiting and later caller gets the failure's
//! operating-system error (a full disk says so), not only the name of the operation.

use crate::error::{Error, Result};
use crate::storage::coding::widen;
use crate::storage::frame::Record;
use crate::storage::io::{Storage, StorageFile};
use crate::storage::manifest::{Manifest, RunEntry, SegmentEntry, MANIFEST_FILE};
use crate::storage::multi::lock::{ByteLock, DURABLE_LOCK, MANIFEST_LOCK, SYNC_LOCK, WRITE_LOCK};
use crate::storage::multi::repair::{repair_announced_range, zero_unpublished};
use crate::storage::multi::tail::{LogPosition, Tail, TailIndex};
use crate::storage::multi::{LockMode, SharedFile};
use crate::storage::segment::{
    create_segment, segment_path, SEAL_FRAME_BYTES, SEGMENT_HEADER_BYTES, WAL_DIR,
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
    defined_sessions: HashSet<u32>,
    /// Type numbers whose definition record this segment already holds.
    defined_types: HashSet<u32>,
    /// What the batch being encoded added to the two sets, so that a refused batch takes
    /// its definitions back. (Cloning the sets for every batch instead cost time in
    /// proportion to the sessions in the segment, under the log's lock, on every append.)
    added_sessions: Vec<u32>,
    added_types: Vec<u32>,
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
    /// Many-process mode: the `WRITE` lock, held from the first batch queued (or the first
    /// [`TailPin`]) until the queue is written and published (F-08-6).
    write_lock: Option<ByteLock>,
    /// Many-process mode: live [`TailPin`]s; the `WRITE` lock stays while any is alive.
    tail_pins: usize,
    /// Many-process mode: the committer is writing a group it took from the queue.
    writing: bool,
    /// Many-process mode: how far this process's catalog reflects the log.
    applied: LogPosition,
    /// Emptied batch buffers of written groups, reused by the next batches: a batch of
    /// megabytes otherwise grows a fresh buffer from empty, and its pages are faulted in
    /// again, every time.
    spare_buffers: Vec<Vec<u8>>,
}

/// Applies to the process's catalog what other processes published after `from`, up to
/// the tail (F-08-6 step 3, F-08-11); returns how far it applied, and the manifest the
/// catalog reflects now when it changed (another process rolled, sealed or rewrote a run,
/// F-08-12): the log takes it as its own, so that its manifest never names files the
/// catalog does not point into.
pub type CatchUp =
    dyn Fn(LogPosition, &Tail) -> Result<(LogPosition, Option<Manifest>)> + Send + Sync;

/// The log's side of many-process mode (format-spec/08-many-processes.md).
pub struct SharedLog {
    pub file: Arc<dyn SharedFile>,
    pub tail: TailIndex,
    pub catch_up: Box<CatchUp>,
}

/// `in_progress_end` while the `WRITE` holder rolls to a new segment (from before the new
/// segment is created until the group after the roll is published): the next holder then
/// completes or undoes the roll (F-08-8, F-08-9 row 4).
pub const ROLLING: u64 = u64::MAX;

/// Holds this process's turn at the log tail (the `WRITE` lock) while alive, so that the
/// session and type numbers a caller takes from the caught-up catalog stay unused by other
/// processes until its batch is queued (F-08-6 step 4). Without other processes it holds
/// nothing.
pub struct TailPin<'log> {
    log: Option<&'log Log>,
}

impl Drop for TailPin<'_> {
    fn drop(&mut self) {
        if let Some(log) = self.log {
            let mut state = log.shared.state.lock();
            state.tail_pins -= 1;
            state.release_tail_if_idle();
        }
    }
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
    call: SettledCall,
}

/// What [`Log::when_settled`] calls once a wait would return at once: it runs on the
/// committer's thread, so it must be short (a wake-up of an async task).
pub type SettledCall = Box<dyn FnOnce() + Send>;

struct Shared {
    storage: Arc<dyn Storage>,
    options: LogOptions,
    multi: Option<SharedLog>,
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
use crate::limits::{MAX_SPARE_BUFFER_BYTES, SPARE_BATCH_BUFFERS};

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
                context: SegmentContext::new(segment, salt, tail, tail),
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
            write_lock: None,
            tail_pins: 0,
            writing: false,
            applied: LogPosition {
                segment,
                offset: tail,
            },
            spare_buffers: Vec::new(),
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
        Log::start_with(
            storage,
            options,
            manifest,
            (file, segment, salt, tail),
            None,
        )
    }

    /// [`Log::start`] for one of many writer processes (`multi`), or alone (`None`).
    pub fn start_with(
        storage: Arc<dyn Storage>,
        options: LogOptions,
        manifest: Manifest,
        (file, segment, salt, tail): (Arc<dyn StorageFile>, u64, u64, u64),
        multi: Option<SharedLog>,
    ) -> Result<Log> {
        let state = State::new(file, manifest, segment, salt, tail);
        let mut log = Log::without_committer(storage, options, state);
        if let Some(shared) = Arc::get_mut(&mut log.shared) {
            shared.multi = multi;
        }
        let worker = log.shared.clone();
        let committer = start_thread(COMMITTER_THREAD, move || worker.run_committer())?;
        *log.committer.lock() = Some(committer);
        Ok(log)
    }

    /// Many-process mode, a joining process (F-08-4 step 3, F-08-7): the published end it
    /// starts at may lie past the durable position (another process's batch written, not
    /// yet synced, or kept from a dead writer by F-08-9), so its commits may claim durable
    /// only what the shared durable position says, never the published end.
    pub fn claim_durable_at_most(&self, durable: LogPosition) {
        let mut state = self.shared.state.lock();
        let context = &mut state.active.context;
        let limit = match durable.segment.cmp(&context.segment) {
            std::cmp::Ordering::Equal => durable.offset,
            std::cmp::Ordering::Less => SEGMENT_HEADER_BYTES,
            std::cmp::Ordering::Greater => context.durable_offset,
        };
        context.durable_offset = context.durable_offset.min(limit.max(SEGMENT_HEADER_BYTES));
    }

    /// A log on `state` whose committer is not running yet (unit tests run its groups).
    fn without_committer(storage: Arc<dyn Storage>, options: LogOptions, state: State) -> Log {
        let shared = Arc::new(Shared {
            storage,
            options,
            multi: None,
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
        if shared.multi.is_some() && state.write_lock.is_none() {
            shared.take_write_lock(&mut state)?;
        }
        let mut bytes = state.spare_buffers.pop().unwrap_or_default();
        let max_batch_bytes = shared.options.max_batch_bytes;
        let mut outcome = encode_batch(
            &mut state.active.context,
            &mut bytes,
            &mut encode,
            max_batch_bytes,
        )?;
        let fits = state.active.context.base_offset + bytes.len() as u64 + SEAL_FRAME_BYTES
            <= shared.options.segment_bytes;
        if !fits {
            state.active.context.undo_batch();
            // In a new segment the batch repeats its session headers and type definitions:
            // size the segment for that encoding, so that a batch larger than a segment gets
            // a segment of its own instead of being refused (F-03-9).
            let mut fresh = state.active.context.without_definitions();
            bytes.clear();
            encode_batch(&mut fresh, &mut bytes, &mut encode, max_batch_bytes)?;
            let capacity = shared
                .options
                .segment_bytes
                .max(SEGMENT_HEADER_BYTES + bytes.len() as u64 + SEAL_FRAME_BYTES);
            shared.roll(&mut state, capacity)?;
            bytes.clear();
            outcome = encode_batch(
                &mut state.active.context,
                &mut bytes,
                &mut encode,
                max_batch_bytes,
            )?;
            if state.active.context.base_offset + bytes.len() as u64 + SEAL_FRAME_BYTES > capacity {
                state.active.context.undo_batch();
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

    /// Whether waiting for `ticket` would return at once (reached, poisoned or stopped):
    /// lets an async caller skip handing its thread to a blocking wait.
    pub fn is_settled(&self, ticket: u64, durable: bool) -> bool {
        self.shared
            .state
            .lock()
            .wait_outcome(ticket, durable)
            .is_some()
    }

    /// Waits until `ticket` is written (`Buffered`) or durable (otherwise).
    pub fn wait(&self, ticket: u64, durable: bool) -> Result<()> {
        use std::sync::atomic::{AtomicBool, Ordering};
        if let Some(outcome) = self.shared.state.lock().wait_outcome(ticket, durable) {
            return outcome;
        }
        let woken = Arc::new(AtomicBool::new(false));
        let (flag, thread) = (woken.clone(), std::thread::current());
        self.when_settled(
            ticket,
            durable,
            Box::new(move || {
                flag.store(true, Ordering::Release);
                thread.unpark();
            }),
        );
        // `park` may return spuriously: only the call's flag ends the wait.
        while !woken.load(Ordering::Acquire) {
            std::thread::park();
        }
        let state = self.shared.state.lock();
        state
            .wait_outcome(ticket, durable)
            .unwrap_or(Err(Error::Closed))
    }

    /// Calls `call` once waiting for `ticket` would return at once (reached, poisoned or
    /// stopped): at once if it would now, else on the committer's thread when it does. An
    /// async caller awaits this instead of blocking a thread in [`Log::wait`].
    pub fn when_settled(&self, ticket: u64, durable: bool, call: SettledCall) {
        {
            let mut state = self.shared.state.lock();
            if state.wait_outcome(ticket, durable).is_none() {
                state.waiters.push(Waiter {
                    ticket,
                    durable,
                    call,
                });
                return;
            }
        }
        call();
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
        if let Some(multi) = &self.shared.multi {
            // Bytes another process published are written.
            let tail = multi.tail.read();
            if (segment, end) <= (tail.segment, tail.written_end) {
                return Ok(());
            }
        }
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

    /// The manifest in force: alone the cached copy; with other processes the one on disk
    /// (they roll and seal meanwhile, F-08-16).
    pub fn manifest_in_force(&self) -> Result<Manifest> {
        match &self.shared.multi {
            Some(_) => read_manifest_in_force(self.shared.storage.as_ref()),
            None => Ok(self.manifest()),
        }
    }

    /// The oldest live segment if it is not the one taking appends (so it is sealed; its
    /// seal is durable once a `flush` returned after the roll that queued it).
    pub fn oldest_sealed_segment(&self) -> Option<SegmentEntry> {
        let state = self.shared.state.lock();
        let oldest = *state.manifest.segments.first()?;
        (oldest.id != state.active.context.segment && state.written_position.0 > oldest.id)
            .then_some(oldest)
    }

    /// Takes the next file id from the manifest's counter for a run file (F-06-10 step 1).
    /// Alone it reaches the disk with the next manifest write; with other processes the
    /// counter is theirs too (a roll takes the next id), so the id is reserved at once by a
    /// manifest written under `MANIFEST` (F-08-16).
    pub fn allocate_file_id(&self) -> Result<u64> {
        if self.shared.multi.is_some() {
            return self.replace_manifest(
                |manifest, _| {
                    let id = manifest.next_segment_id;
                    manifest.next_segment_id += 1;
                    Ok(id)
                },
                |_| {},
            );
        }
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        let id = state.manifest.next_segment_id;
        state.manifest.next_segment_id += 1;
        Ok(id)
    }

    /// Replaces the manifest by one where the oldest segment `segment` is replaced by `run`
    /// (F-06-10 step 3), or just dropped when it held no record (`None`, F-06-14). A failure
    /// after the rename poisons the log like a failed roll. Never the segment taking
    /// appends: with other processes, never the published tail or a segment after it (a
    /// roll in progress, F-08-16).
    /// `adopt` is given the new manifest under the log's lock, before anything else of
    /// this process can see it (F-08-17: the process's catalog follows it).
    pub fn replace_segment_with_run(
        &self,
        segment: u64,
        run: Option<RunEntry>,
        adopt: impl FnOnce(&Manifest),
    ) -> Result<()> {
        let published_tail = self
            .shared
            .multi
            .as_ref()
            .map(|multi| multi.tail.read().segment);
        self.replace_manifest(
            |manifest, active| {
                if manifest.segments.first().map(|entry| entry.id) != Some(segment)
                    || segment == active
                    || published_tail.is_some_and(|tail| segment >= tail)
                {
                    return Err(Error::invalid(
                        "only the oldest sealed segment can become a run",
                    ));
                }
                manifest.segments.remove(0);
                manifest.runs.extend(run);
                Ok(())
            },
            adopt,
        )
    }

    /// Makes a manifest naming `new` where it named run `old` (same place in the log
    /// order) durable and in force (F-06-26); `adopt` as for
    /// [`Log::replace_segment_with_run`].
    pub fn replace_run(
        &self,
        old: u64,
        new: RunEntry,
        adopt: impl FnOnce(&Manifest),
    ) -> Result<()> {
        self.replace_manifest(
            |manifest, _| {
                let slot = manifest
                    .runs
                    .iter_mut()
                    .find(|run| run.id == old)
                    .ok_or_else(|| Error::invalid("the run to replace is not in the manifest"))?;
                *slot = new;
                Ok(())
            },
            adopt,
        )
    }

    /// Writes the manifest `edit` makes of the one in force and puts it in force. With
    /// other processes (F-08-16) under `MANIFEST`, from the manifest on disk (they roll
    /// meanwhile), and followed by an increment of `manifest_generation` and of
    /// `store_generation`, so that their next refresh re-reads it. `edit` is also given the
    /// segment this process appends to.
    fn replace_manifest<T>(
        &self,
        edit: impl FnOnce(&mut Manifest, u64) -> Result<T>,
        adopt: impl FnOnce(&Manifest),
    ) -> Result<T> {
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        let _manifest_lock = match &self.shared.multi {
            Some(multi) => {
                let lock = ByteLock::wait(&multi.file, MANIFEST_LOCK, LockMode::Exclusive)
                    .map_err(|error| Error::io("manifest lock", error))?;
                state.manifest = read_manifest_in_force(self.shared.storage.as_ref())?;
                Some(lock)
            }
            None => None,
        };
        let mut manifest = state.manifest.clone();
        let outcome = edit(&mut manifest, state.active.context.segment)?;
        self.install_manifest(&mut state, manifest)?;
        adopt(&state.manifest);
        if let Some(multi) = &self.shared.multi {
            multi.tail.bump_manifest_generation();
            multi.tail.bump_store_generation();
            multi.tail.notify();
        }
        Ok(outcome)
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

    /// Where the next append goes: the active segment, its salt and the offset.
    pub fn tail_position(&self) -> (u64, u64, u64) {
        let state = self.shared.state.lock();
        let context = &state.active.context;
        (context.segment, context.salt, context.base_offset)
    }

    /// Whether every byte of `segment` before `end` is known durable: a sync this log ran
    /// (or, with other processes, the shared durable position) covered it.
    pub fn is_durable(&self, segment: u64, end: u64) -> bool {
        if let Some(multi) = &self.shared.multi {
            let durable = multi.tail.durable();
            if (segment, end) <= (durable.segment, durable.offset) {
                return true;
            }
        }
        let state = self.shared.state.lock();
        let context = &state.active.context;
        context.segment == segment && context.durable_offset >= end
    }

    /// Many-process mode: what this process knows of the others (F-08-5).
    pub fn shared_tail(&self) -> Option<&TailIndex> {
        self.shared.multi.as_ref().map(|multi| &multi.tail)
    }

    /// Takes this process's turn at the tail (the `WRITE` lock, caught up on what others
    /// published) until the returned pin drops; see [`TailPin`]. Alone it does nothing.
    pub fn pin_tail(&self) -> Result<TailPin<'_>> {
        if self.shared.multi.is_none() {
            return Ok(TailPin { log: None });
        }
        let mut state = self.shared.state.lock();
        state.check_usable()?;
        if state.write_lock.is_none() {
            self.shared.take_write_lock(&mut state)?;
        }
        state.tail_pins += 1;
        Ok(TailPin { log: Some(self) })
    }

    /// Many-process mode: applies what others published since this process last looked
    /// (F-08-11). Serialized with appends, so that the catalog never applies a batch twice.
    pub fn catch_up(&self) -> Result<()> {
        let Some(multi) = &self.shared.multi else {
            return Ok(());
        };
        let mut state = self.shared.state.lock();
        if state.write_lock.is_some() {
            // This process holds the tail: nobody else published since it caught up.
            return Ok(());
        }
        let tail = multi.tail.read();
        let (applied, manifest) = (multi.catch_up)(state.applied, &tail)?;
        state.applied = applied;
        if let Some(manifest) = manifest {
            state.manifest = manifest;
        }
        let published = (tail.segment, tail.written_end);
        if published > state.written_position {
            state.written_position = published;
        }
        Ok(())
    }

    /// Many-process mode: makes everything published so far durable (F-08-7), this
    /// process's bytes and others' alike, so that what a writer that died left written but
    /// unsynced is delivered to followers too. Used at close.
    pub fn sync_published(&self) -> Result<()> {
        let Some(multi) = &self.shared.multi else {
            return Ok(());
        };
        let tail = multi.tail.read();
        let file = self
            .shared
            .storage
            .open(&segment_path(tail.segment), false)
            .map_err(|error| Error::io("segment open", error))?;
        let target = LogPosition {
            segment: tail.segment,
            offset: tail.written_end,
        };
        sync_shared(multi, &file, target)
            .map(|_| ())
            .map_err(|(operation, source)| Error::io(operation, source))
    }

    /// Many-process mode: takes the tail with nothing to write, so that the last process to
    /// close can seal the segment where every process left it (F-08-4). Holds the lock
    /// until [`Log::close`].
    pub fn take_tail(&self) -> Result<()> {
        let mut state = self.shared.state.lock();
        if self.shared.multi.is_some() && state.write_lock.is_none() {
            self.shared.take_write_lock(&mut state)?;
        }
        // Never released by an idle queue again: the close seals under it.
        state.tail_pins += 1;
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
        if self.shared.multi.is_some() && state.write_lock.is_none() {
            // Others may still append to this segment: leave it open (F-08-4).
            state.sealed = true;
            return Ok(());
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
    fn new(segment: u64, salt: u64, base_offset: u64, durable_offset: u64) -> SegmentContext {
        SegmentContext {
            segment,
            salt,
            base_offset,
            durable_offset,
            defined_sessions: HashSet::new(),
            defined_types: HashSet::new(),
            added_sessions: Vec::new(),
            added_types: Vec::new(),
        }
    }

    /// The same position in a segment that holds no definitions yet.
    fn without_definitions(&self) -> SegmentContext {
        SegmentContext::new(
            self.segment,
            self.salt,
            self.base_offset,
            self.durable_offset,
        )
    }

    /// Records that the segment now holds `session`'s header; `false` if it already did.
    pub fn define_session(&mut self, session: u32) -> bool {
        let new = self.defined_sessions.insert(session);
        if new {
            self.added_sessions.push(session);
        }
        new
    }

    /// Records that the segment now holds `type_number`'s definition; `false` if it
    /// already did.
    pub fn define_type(&mut self, type_number: u32) -> bool {
        let new = self.defined_types.insert(type_number);
        if new {
            self.added_types.push(type_number);
        }
        new
    }

    fn begin_batch(&mut self) {
        self.added_sessions.clear();
        self.added_types.clear();
    }

    /// Takes back the definitions of the batch being encoded (it was refused or moved).
    fn undo_batch(&mut self) {
        for session in self.added_sessions.drain(..) {
            self.defined_sessions.remove(&session);
        }
        for type_number in self.added_types.drain(..) {
            self.defined_types.remove(&type_number);
        }
    }
}

/// Encodes one batch into `out` on `context`, checking its size; a refused batch leaves
/// `context`'s definitions as they were.
fn encode_batch<T>(
    context: &mut SegmentContext,
    out: &mut Vec<u8>,
    encode: &mut impl FnMut(&mut SegmentContext, &mut Vec<u8>) -> Result<T>,
    max_batch_bytes: u64,
) -> Result<T> {
    context.begin_batch();
    let encoded = encode(context, out)
        .and_then(|outcome| check_batch_size(out.len(), max_batch_bytes).map(|()| outcome));
    if encoded.is_err() {
        context.undo_batch();
    }
    encoded
}

impl State {
    /// Many-process mode: gives the `WRITE` lock back once nothing of this process is
    /// queued, being written, or pinned (F-08-6 step 6).
    fn release_tail_if_idle(&mut self) {
        if self.tail_pins == 0 && self.queue.is_empty() && !self.writing {
            self.write_lock = None;
        }
    }

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
        // Nothing more is written: other processes must not wait for this one's `WRITE`
        // lock; what it announced and did not publish is the next holder's (F-08-9).
        self.write_lock = None;
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
                self.recycle(bytes);
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

    /// Keeps `bytes`, emptied, for a later batch, within [`SPARE_BATCH_BUFFERS`] buffers of
    /// at most [`MAX_SPARE_BUFFER_BYTES`] each.
    fn recycle(&mut self, mut bytes: Vec<u8>) {
        if self.spare_buffers.len() < SPARE_BATCH_BUFFERS
            && bytes.capacity() <= MAX_SPARE_BUFFER_BYTES
        {
            bytes.clear();
            self.spare_buffers.push(bytes);
        }
    }

    /// Keeps the buffers of a written group's chunks ([`State::recycle`]).
    fn recycle_chunks(&mut self, chunks: Vec<Chunk>) {
        for chunk in chunks {
            self.recycle(chunk.bytes);
        }
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
        // With other processes the manifest is taken from the disk under its lock (F-08-8),
        // held until the new manifest is in force; the roll is announced first, so that a
        // death half-way leaves the next `WRITE` holder to finish it (F-08-9 row 4).
        let manifest_lock = match &self.multi {
            Some(multi) => {
                multi.tail.publish(|tail| tail.in_progress_end = ROLLING);
                let lock = ByteLock::wait(&multi.file, MANIFEST_LOCK, LockMode::Exclusive)
                    .map_err(|error| Error::io("manifest lock", error))?;
                state.manifest = read_manifest_in_force(self.storage.as_ref())?;
                Some(lock)
            }
            None => None,
        };
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
        drop(manifest_lock);
        if let Some(multi) = &self.multi {
            multi.tail.bump_manifest_generation();
        }
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
            context: SegmentContext::new(id, salt, SEGMENT_HEADER_BYTES, SEGMENT_HEADER_BYTES),
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
        if self.multi.is_some() {
            return self.commit_shared_group(
                state,
                chunks,
                (last_ticket, group_waitable),
                sync,
                &active_file,
            );
        }
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
        state.recycle_chunks(chunks);
        self.finish_group(state, group_waitable)
    }

    /// A group in many-process mode (F-08-6 steps 5–6, F-08-7): announce, write, publish
    /// and release the tail, and only then sync, so that other processes write meanwhile
    /// and one `fdatasync` covers their bytes too.
    fn commit_shared_group<'a>(
        &'a self,
        mut state: parking_lot::MutexGuard<'a, State>,
        chunks: Vec<Chunk>,
        (last_ticket, group_waitable): (u64, usize),
        sync: bool,
        active_file: &Arc<dyn StorageFile>,
    ) -> parking_lot::MutexGuard<'a, State> {
        let Some(multi) = &self.multi else {
            return state;
        };
        let rolls = chunks.iter().any(|chunk| chunk.trim_to.is_some());
        if let Some(last) = chunks.last() {
            let end = last.offset + widen(last.bytes.len());
            multi.tail.publish(|tail| {
                tail.in_progress_end = if rolls { ROLLING } else { end };
            });
        }
        state.writing = true;
        drop(state);
        let outcome = write_chunks(&chunks, false, active_file);
        let mut state = self.state.lock();
        state.writing = false;
        let written_bytes: usize = chunks.iter().map(|chunk| chunk.bytes.len()).sum();
        state.queued_bytes -= written_bytes;
        if let Err((operation, source)) = outcome {
            // Poisoning gives the `WRITE` lock back; the next holder finds the announced
            // range and repairs it (F-08-9).
            state.poison(operation, source);
            return self.finish_group(state, group_waitable);
        }
        state.written_ticket = last_ticket;
        if let Some(last) = chunks.last() {
            self.publish_group(&mut state, multi, last, rolls);
        }
        state.release_tail_if_idle();
        state.recycle_chunks(chunks);
        if !sync {
            return self.finish_group(state, group_waitable);
        }
        let target = LogPosition {
            segment: state.written_position.0,
            offset: state.written_position.1,
        };
        let file = state.active.file.clone();
        drop(state);
        let synced = sync_shared(multi, &file, target);
        let mut state = self.state.lock();
        match synced {
            Ok(durable) => {
                state.durable_ticket = last_ticket;
                state.batched_deadline = None;
                state.batched_bytes = 0;
                state.batched_max_bytes = usize::MAX;
                let context = &mut state.active.context;
                if durable.segment == context.segment {
                    context.durable_offset = context.durable_offset.max(durable.offset);
                }
            }
            Err((operation, source)) => {
                state.poison(operation, source);
            }
        }
        self.finish_group(state, group_waitable)
    }

    /// Publishes a written group (F-08-6 step 5): the new written end, `in_progress_end`
    /// cleared, the generation and the futex word bumped.
    fn publish_group(&self, state: &mut State, multi: &SharedLog, last: &Chunk, rolls: bool) {
        let end = last.offset + widen(last.bytes.len());
        let segment = last.segment;
        let salt = state.active.context.salt;
        state.written_position = (segment, end);
        state.applied = LogPosition {
            segment,
            offset: end,
        };
        multi.tail.publish(|tail| {
            tail.segment = segment;
            tail.salt = salt;
            tail.written_end = end;
            tail.in_progress_end = 0;
        });
        if rolls {
            // The old segment was sealed and synced before the new one took a byte.
            if let Err(source) = raise_durable(multi, segment, SEGMENT_HEADER_BYTES) {
                state.poison("durable lock", source);
            }
        }
        multi.tail.bump_store_generation();
        multi.tail.notify();
    }

    /// Wakes the appenders a group finished; returns with the lock held again.
    fn finish_group<'a>(
        &'a self,
        mut state: parking_lot::MutexGuard<'a, State>,
        group_waitable: usize,
    ) -> parking_lot::MutexGuard<'a, State> {
        let finished = state.finished_waiters();
        state.last_group_tickets = group_waitable;
        self.done.notify_all();
        self.space.notify_all();
        drop(state);
        wake(finished);
        self.state.lock()
    }

    /// Takes the `WRITE` lock and makes the active segment the published tail (F-08-6 steps
    /// 1–3): repairs what a dead holder announced (completing its roll), follows a roll
    /// another process made, and catches the catalog up.
    fn take_write_lock(&self, state: &mut State) -> Result<()> {
        let Some(multi) = &self.multi else {
            return Ok(());
        };
        let lock = ByteLock::wait(&multi.file, WRITE_LOCK, LockMode::Exclusive)
            .map_err(|error| Error::io("write lock", error))?;
        let mut tail = multi.tail.read();
        if tail.in_progress_end != 0 {
            self.repair_dead_writer(multi, &tail)?;
            tail = multi.tail.read();
        }
        if tail.segment != state.active.context.segment {
            let file = self
                .storage
                .open(&segment_path(tail.segment), false)
                .map_err(|error| Error::io("segment open", error))?;
            state.manifest = read_manifest_in_force(self.storage.as_ref())?;
            state.active = Active {
                file,
                context: SegmentContext::new(
                    tail.segment,
                    tail.salt,
                    tail.written_end,
                    SEGMENT_HEADER_BYTES,
                ),
            };
        }
        let context = &mut state.active.context;
        context.base_offset = tail.written_end;
        let durable = multi.tail.durable();
        if durable.segment == tail.segment {
            context.durable_offset = context
                .durable_offset
                .max(durable.offset.min(tail.written_end));
        }
        let published = (tail.segment, tail.written_end);
        if published > state.written_position {
            state.written_position = published;
        }
        let (applied, manifest) = (multi.catch_up)(state.applied, &tail)?;
        state.applied = applied;
        if let Some(manifest) = manifest {
            state.manifest = manifest;
        }
        state.write_lock = Some(lock);
        Ok(())
    }

    /// F-08-9: the previous `WRITE` holder died after announcing bytes. Keeps the whole
    /// batches it wrote, zeroes the rest, completes an interrupted roll, and publishes.
    fn repair_dead_writer(&self, multi: &SharedLog, tail: &Tail) -> Result<()> {
        let storage = self.storage.as_ref();
        let manifest = read_manifest_in_force(storage)?;
        let rolled_to = manifest
            .segments
            .iter()
            .find(|entry| entry.id > tail.segment)
            .copied();
        let file = storage
            .open(&segment_path(tail.segment), false)
            .map_err(|error| Error::io("segment open", error))?;
        let repaired = repair_announced_range(file.as_ref(), tail, rolled_to.is_some())?;
        match rolled_to {
            Some(next) => {
                // Finish the roll (F-08-8 steps 3–4): the old segment is sealed and synced
                // now; the new one never took a published byte, so what is in it is a dead
                // writer's unacknowledged bytes, zeroed.
                let next_file = storage
                    .open(&segment_path(next.id), false)
                    .map_err(|error| Error::io("segment open", error))?;
                zero_unpublished(next_file.as_ref())?;
                // The dead writer may have died before the syncs that make the new
                // segment's name and the manifest naming it durable: without them a power
                // cut would take the segment back, with every batch acknowledged in it.
                sync_roll_names(storage)?;
                multi.tail.publish(|published| {
                    published.segment = next.id;
                    published.salt = next.salt;
                    published.written_end = SEGMENT_HEADER_BYTES;
                    published.in_progress_end = 0;
                });
                raise_durable(multi, next.id, SEGMENT_HEADER_BYTES)
                    .map_err(|error| Error::io("durable lock", error))?;
                multi.tail.bump_manifest_generation();
            }
            None => multi.tail.publish(|published| {
                published.written_end = repaired;
                published.in_progress_end = 0;
            }),
        }
        multi.tail.bump_store_generation();
        multi.tail.notify();
        Ok(())
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
        if self.multi.is_some() {
            // The seal claims every byte before it durable. With other processes the tail
            // holds their batches too, and one that died left its last ones unsynced: a
            // seal reaching the disk before them would claim bytes a power cut lost, and
            // recovery would refuse the log as damaged (found by the `model` fuzz target).
            file.sync_data().map_err(step("sync"))?;
        }
        file.write_at(&seal, context.base_offset)
            .map_err(step("seal write"))?;
        file.set_len(context.base_offset + seal.len() as u64)
            .map_err(step("seal trim"))?;
        file.sync_data().map_err(step("seal sync"))
    }
}

/// Makes a roll's directory entries durable (F-08-9 row 4): the new segment's name in
/// `wal/` and the manifest's rename in the store's directory.
fn sync_roll_names(storage: &dyn Storage) -> Result<()> {
    storage
        .sync_dir(WAL_DIR)
        .and_then(|()| storage.sync_dir(""))
        .map_err(|error| Error::io("directory sync", error))
}

/// The manifest on disk, which another process may have replaced (F-08-12).
fn read_manifest_in_force(storage: &dyn Storage) -> Result<Manifest> {
    Manifest::read(storage)?.ok_or_else(|| Error::CorruptFile {
        file: MANIFEST_FILE.to_string(),
        reason: "removed while the store is open".to_string(),
    })
}

/// Raises the shared durable position under the `DURABLE` lock (F-08-7).
fn raise_durable(multi: &SharedLog, segment: u64, offset: u64) -> io::Result<()> {
    let _durable = ByteLock::wait(&multi.file, DURABLE_LOCK, LockMode::Exclusive)?;
    multi.tail.raise_durable(LogPosition { segment, offset });
    Ok(())
}

/// Makes `target` durable (F-08-7): nothing to do when another process's sync already
/// covered it; else, under `SYNC`, one `fdatasync` of the tail segment, which covers every
/// byte published before it began, and the durable position raised to that published end.
/// Processes that queue on `SYNC` behind a sync are usually covered by it when they get the
/// lock (a group commit across processes): without it each process ran its own `fdatasync`
/// for its few events, and eight processes of eight sessions did a quarter of one process's
/// work.
fn sync_shared(
    multi: &SharedLog,
    file: &Arc<dyn StorageFile>,
    target: LogPosition,
) -> std::result::Result<LogPosition, (&'static str, io::Error)> {
    let durable = multi.tail.durable();
    if durable >= target {
        return Ok(durable);
    }
    let _syncing = ByteLock::wait(&multi.file, SYNC_LOCK, LockMode::Exclusive)
        .map_err(|error| ("sync lock", error))?;
    let durable = multi.tail.durable();
    if durable >= target {
        return Ok(durable);
    }
    let published = multi.tail.read();
    // Every byte below the published end was written before this sync starts. After a roll
    // by another process the target's segment is no longer the tail: the roll synced it
    // whole, and this sync covers the target too.
    let covered = if published.segment == target.segment {
        LogPosition {
            segment: published.segment,
            offset: published.written_end.max(target.offset),
        }
    } else {
        target
    };
    file.sync_data().map_err(|error| ("sync", error))?;
    raise_durable(multi, covered.segment, covered.offset)
        .map_err(|error| ("durable lock", error))?;
    // Followers deliver only durable events: wake them for these.
    multi.tail.notify();
    Ok(multi.tail.durable())
}

fn wake(finished: Vec<Waiter>) {
    for waiter in finished {
        (waiter.call)();
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
