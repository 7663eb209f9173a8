//! The shared tail index (F-08-5): the published end of the log, how far it is durable,
//! generation counters, the futex word, and the lease records. Every field is a 64-bit
//! word of the `SHARED` map. Multi-word values are read and written under seqlocks: the
//! tail fields by the `WRITE` holder, the durable pair by the `DURABLE` holder.

use crate::storage::io::shared::{load, store, SharedFile, LEASE_RECORDS, SHARED_HEADER_BYTES};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// `DSHDBSHM` as a little-endian word.
pub const SHARED_MAGIC: u64 = u64::from_le_bytes(*b"DSHDBSHM");
/// The layout of F-08-5.
pub const SHARED_LAYOUT: u64 = 1;

const MAGIC: usize = 0;
const LAYOUT: usize = 1;
const TAIL_SEQUENCE: usize = 2;
const TAIL_SEGMENT: usize = 3;
const TAIL_SALT: usize = 4;
const WRITTEN_END: usize = 5;
const IN_PROGRESS_END: usize = 6;
const MANIFEST_GENERATION: usize = 7;
const STORE_GENERATION: usize = 8;
const DURABLE_SEQUENCE: usize = 9;
const DURABLE_SEGMENT: usize = 10;
const DURABLE_END: usize = 11;
// Word 12 holds the futex word `notify` in its low half (byte 96, see `fs::NOTIFY_BYTE`).
const LEASE_RECORDS_START: usize = (SHARED_HEADER_BYTES / 8) as usize;

/// Longest a reader spins on an odd seqlock word before it yields: a writer is between two
/// stores, which takes nanoseconds unless it was descheduled (or died, see below).
const SEQLOCK_SPINS: u32 = 1_000;

/// The published tail, as one consistent copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tail {
    pub segment: u64,
    pub salt: u64,
    /// Every byte of `segment` below it is a whole, committed, published batch.
    pub written_end: u64,
    /// 0, or the end of bytes being written after `written_end` (F-08-9).
    pub in_progress_end: u64,
    pub manifest_generation: u64,
    pub store_generation: u64,
}

/// A position in the log: a segment and an offset in it. Ordered by segment, then offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct LogPosition {
    pub segment: u64,
    pub offset: u64,
}

/// A process's view of the shared index.
#[derive(Clone)]
pub struct TailIndex {
    file: Arc<dyn SharedFile>,
}

impl TailIndex {
    pub fn new(file: Arc<dyn SharedFile>) -> TailIndex {
        TailIndex { file }
    }

    /// The shared file behind it.
    pub fn file(&self) -> &Arc<dyn SharedFile> {
        &self.file
    }

    /// The layout the index declares when its magic is there (an initialized index, of
    /// this layout or another dshdb's), else `None`.
    pub fn declared_layout(&self) -> Option<u64> {
        (load(self.file.as_ref(), MAGIC) == SHARED_MAGIC).then(|| load(self.file.as_ref(), LAYOUT))
    }

    /// Whether an alone opener initialized it (F-08-4); a joiner refuses an uninitialized one.
    pub fn is_initialized(&self) -> bool {
        load(self.file.as_ref(), MAGIC) == SHARED_MAGIC
            && load(self.file.as_ref(), LAYOUT) == SHARED_LAYOUT
    }

    /// Initializes the index for an alone opener (F-08-4): the tail where appends continue,
    /// durable up to `end` (recovery synced it, F-05-11). Generations keep growing from what
    /// the file held, so a reader that slept through the re-initialization still sees a change.
    pub fn initialize(&self, segment: u64, salt: u64, end: u64) {
        let file = self.file.as_ref();
        let known = self.is_initialized();
        let generation = if known {
            load(file, STORE_GENERATION)
        } else {
            0
        };
        let manifest_generation = if known {
            load(file, MANIFEST_GENERATION)
        } else {
            0
        };
        // Dead holders may have left a seqlock odd: start both even.
        store(file, TAIL_SEQUENCE, 0);
        store(file, DURABLE_SEQUENCE, 0);
        store(file, MANIFEST_GENERATION, manifest_generation + 1);
        store(file, STORE_GENERATION, generation + 1);
        self.publish(|tail| {
            tail.segment = segment;
            tail.salt = salt;
            tail.written_end = end;
            tail.in_progress_end = 0;
        });
        self.set_durable(LogPosition {
            segment,
            offset: end,
        });
        store(file, LAYOUT, SHARED_LAYOUT);
        store(file, MAGIC, SHARED_MAGIC);
        self.notify();
    }

    /// A consistent copy of the tail fields.
    pub fn read(&self) -> Tail {
        let file = self.file.as_ref();
        read_consistent(file, TAIL_SEQUENCE, || Tail {
            segment: load(file, TAIL_SEGMENT),
            salt: load(file, TAIL_SALT),
            written_end: load(file, WRITTEN_END),
            in_progress_end: load(file, IN_PROGRESS_END),
            manifest_generation: load(file, MANIFEST_GENERATION),
            store_generation: load(file, STORE_GENERATION),
        })
    }

    /// Changes the tail fields (segment, salt, written and in-progress ends) as one update;
    /// the generations in the copy are ignored (they are bumped on their own). Only the
    /// `WRITE` holder calls it (F-08-5).
    pub fn publish(&self, change: impl FnOnce(&mut Tail)) {
        let file = self.file.as_ref();
        let mut tail = Tail {
            segment: load(file, TAIL_SEGMENT),
            salt: load(file, TAIL_SALT),
            written_end: load(file, WRITTEN_END),
            in_progress_end: load(file, IN_PROGRESS_END),
            manifest_generation: load(file, MANIFEST_GENERATION),
            store_generation: load(file, STORE_GENERATION),
        };
        change(&mut tail);
        let sequence = load(file, TAIL_SEQUENCE) | 1;
        store(file, TAIL_SEQUENCE, sequence);
        std::sync::atomic::fence(Ordering::Release);
        store(file, TAIL_SEGMENT, tail.segment);
        store(file, TAIL_SALT, tail.salt);
        store(file, WRITTEN_END, tail.written_end);
        store(file, IN_PROGRESS_END, tail.in_progress_end);
        store(file, TAIL_SEQUENCE, sequence + 1);
    }

    /// Counts a manifest replacement (F-08-12); any process may, under `MANIFEST`.
    pub fn bump_manifest_generation(&self) {
        bump(self.file.as_ref(), MANIFEST_GENERATION);
    }

    /// Counts a publication (F-08-11).
    pub fn bump_store_generation(&self) {
        bump(self.file.as_ref(), STORE_GENERATION);
    }

    /// The manifest generation alone.
    pub fn manifest_generation(&self) -> u64 {
        load(self.file.as_ref(), MANIFEST_GENERATION)
    }

    /// The store generation alone: one load, what `refresh` with nothing new costs.
    pub fn store_generation(&self) -> u64 {
        load(self.file.as_ref(), STORE_GENERATION)
    }

    /// How far the log is durable (F-08-7).
    pub fn durable(&self) -> LogPosition {
        let file = self.file.as_ref();
        read_consistent(file, DURABLE_SEQUENCE, || LogPosition {
            segment: load(file, DURABLE_SEGMENT),
            offset: load(file, DURABLE_END),
        })
    }

    /// Raises the durable position to `position` unless it is already past it. Only the
    /// `DURABLE` holder calls it (F-08-7).
    pub fn raise_durable(&self, position: LogPosition) {
        if self.durable() < position {
            self.set_durable(position);
        }
    }

    fn set_durable(&self, position: LogPosition) {
        let file = self.file.as_ref();
        let sequence = load(file, DURABLE_SEQUENCE) | 1;
        store(file, DURABLE_SEQUENCE, sequence);
        std::sync::atomic::fence(Ordering::Release);
        store(file, DURABLE_SEGMENT, position.segment);
        store(file, DURABLE_END, position.offset);
        store(file, DURABLE_SEQUENCE, sequence + 1);
    }

    /// Counts a publication on the futex word and wakes every follower (F-08-11).
    pub fn notify(&self) {
        let word = self.file.notify_word();
        let next = u32::from_le(word.load(Ordering::Acquire)).wrapping_add(1);
        word.store(next.to_le(), Ordering::Release);
        self.file.wake_all();
    }

    /// The futex word's count, to wait on.
    pub fn notify_count(&self) -> u32 {
        u32::from_le(self.file.notify_word().load(Ordering::Acquire))
    }

    /// Sleeps until a publication after `seen` (or `timeout`).
    pub fn wait(&self, seen: u32, timeout: Duration) {
        self.file.wait_notify(seen, timeout);
    }

    /// Records `pid` as the holder of the lease of hash `hash` (F-08-10).
    pub fn write_lease_record(&self, hash: u64, pid: u32) {
        let slot = lease_slot(hash);
        store(self.file.as_ref(), slot + 1, u64::from(pid));
        store(self.file.as_ref(), slot, hash);
    }

    /// The pid the record of `hash` names, when the slot holds that hash.
    pub fn lease_holder(&self, hash: u64) -> Option<u32> {
        let slot = lease_slot(hash);
        if load(self.file.as_ref(), slot) != hash {
            return None;
        }
        u32::try_from(load(self.file.as_ref(), slot + 1))
            .ok()
            .filter(|pid| *pid != 0)
    }
}

/// The first word of the lease record of `hash` (F-08-10): record `hash mod 65 536`.
fn lease_slot(hash: u64) -> usize {
    let record = usize::try_from(hash % LEASE_RECORDS).expect("a record index is below 65 536");
    LEASE_RECORDS_START + 2 * record
}

/// Adds one to word `index` atomically (the words are little-endian, F-08-5).
fn bump(file: &dyn SharedFile, index: usize) {
    let word = file.word(index);
    let mut current = word.load(Ordering::Acquire);
    loop {
        let next = u64::from_le(current).wrapping_add(1).to_le();
        match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Waits until seqlock word `index` is even and returns it. A word that stays odd belongs
/// to a holder that died between its two stores; the next holder of the lock re-publishes
/// (and an alone opener resets it, [`TailIndex::initialize`]), so readers only yield.
/// What `read` returns from words a seqlock at `sequence` guards, read again until no
/// update ran during the read (the sequence was even before and unchanged after).
fn read_consistent<T>(file: &dyn SharedFile, sequence: usize, read: impl Fn() -> T) -> T {
    loop {
        let before = wait_even(file, sequence);
        let value = read();
        std::sync::atomic::fence(Ordering::Acquire);
        if load(file, sequence) == before {
            return value;
        }
    }
}

fn wait_even(file: &dyn SharedFile, index: usize) -> u64 {
    let mut spins = 0;
    loop {
        let value = load(file, index);
        if value.is_multiple_of(2) {
            return value;
        }
        spins += 1;
        if spins < SEQLOCK_SPINS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::sim::SimStorage;
    use crate::storage::io::Storage;

    fn two_views() -> (TailIndex, TailIndex) {
        let disk = SimStorage::new();
        let open = || {
            TailIndex::new(
                disk.open_shared(crate::storage::multi::SHARED_FILE)
                    .expect("shared"),
            )
        };
        (open(), open())
    }

    #[test]
    fn a_publication_is_seen_whole_by_another_process() {
        let (writer, reader) = two_views();
        assert!(!reader.is_initialized());
        writer.initialize(3, 33, 64);
        assert!(reader.is_initialized());
        let first = reader.read();
        assert_eq!((first.segment, first.salt, first.written_end), (3, 33, 64));
        let seen = reader.notify_count();
        writer.publish(|tail| tail.written_end = 500);
        writer.bump_store_generation();
        writer.notify();
        assert_ne!(reader.notify_count(), seen);
        let second = reader.read();
        assert_eq!(second.written_end, 500);
        assert_eq!(second.store_generation, first.store_generation + 1);
        assert_eq!(reader.store_generation(), second.store_generation);
    }

    #[test]
    fn durable_only_grows_and_a_roll_moves_it_to_the_next_segment() {
        let (writer, reader) = two_views();
        writer.initialize(3, 33, 64);
        writer.raise_durable(LogPosition {
            segment: 3,
            offset: 900,
        });
        writer.raise_durable(LogPosition {
            segment: 3,
            offset: 400,
        });
        assert_eq!(
            reader.durable(),
            LogPosition {
                segment: 3,
                offset: 900
            }
        );
        writer.raise_durable(LogPosition {
            segment: 4,
            offset: 64,
        });
        // A late sync of the old segment cannot lower it.
        writer.raise_durable(LogPosition {
            segment: 3,
            offset: 2000,
        });
        assert_eq!(
            reader.durable(),
            LogPosition {
                segment: 4,
                offset: 64
            }
        );
    }

    #[test]
    fn reinitializing_keeps_generations_growing() {
        let (first, second) = two_views();
        first.initialize(1, 1, 64);
        let before = second.read();
        second.initialize(2, 2, 64);
        let after = first.read();
        assert!(after.store_generation > before.store_generation);
        assert!(after.manifest_generation > before.manifest_generation);
    }

    /// How long `follower`, waiting for a notification, sleeps until `writer` notifies
    /// (30 ms after it started waiting).
    fn wait_for_notify(writer: &TailIndex, follower: TailIndex) -> Duration {
        let seen = follower.notify_count();
        let waiter = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while follower.notify_count() == seen {
                follower.wait(seen, Duration::from_secs(5));
            }
            started.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        writer.notify();
        waiter.join().expect("follower")
    }

    #[test]
    fn a_follower_sleeps_until_notified() {
        let disk = SimStorage::new();
        let writer = TailIndex::new(disk.open_shared("SHARED").expect("shared"));
        let follower = TailIndex::new(disk.open_shared("SHARED").expect("shared"));
        writer.initialize(1, 1, 64);
        let waited = wait_for_notify(&writer, follower);
        assert!(waited < Duration::from_secs(4), "{waited:?}");
    }

    #[test]
    fn the_real_futex_wakes_a_follower_of_another_mapping() {
        let dir = std::env::temp_dir().join(format!("dshdb-futex-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("SHARED");
        let open = || {
            TailIndex::new(Arc::new(
                crate::storage::io::shared::fs::FsShared::open(&path).expect("map"),
            ))
        };
        let (writer, follower) = (open(), open());
        writer.initialize(1, 1, 64);
        let waited = wait_for_notify(&writer, follower);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(waited < Duration::from_secs(4), "{waited:?}");
    }
}
