//! The simulated `SHARED` file: shared words in memory and byte-range locks with one owner
//! per handle, so that several stores opened on one [`crate::storage::io::sim::SimStorage`] behave
//! like several processes. Dropping a handle releases its locks, as a process's death does;
//! so does [`SimShared::kill`], which also cuts the handle off the shared memory while the
//! dead process's code unwinds (what `kill -9` does: nothing it runs after is seen).

use super::{LockMode, SharedFile, SHARED_WORDS};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Who holds one byte: an exclusive owner, or shared owners.
#[derive(Default)]
struct ByteHolders {
    exclusive: Option<u64>,
    shared: HashMap<u64, ()>,
}

/// The memory every handle of one simulated shared file sees.
pub struct SimSharedBlock {
    words: Vec<AtomicU64>,
    notify: AtomicU32,
    locks: Mutex<HashMap<u64, ByteHolders>>,
    released: Condvar,
    notified: Mutex<()>,
    wake: Condvar,
    next_owner: AtomicU64,
}

impl Default for SimSharedBlock {
    fn default() -> Self {
        SimSharedBlock {
            words: (0..SHARED_WORDS).map(|_| AtomicU64::new(0)).collect(),
            notify: AtomicU32::new(0),
            locks: Mutex::new(HashMap::new()),
            released: Condvar::new(),
            notified: Mutex::new(()),
            wake: Condvar::new(),
            next_owner: AtomicU64::new(1),
        }
    }
}

/// The private memory a killed handle writes to: the words and the notify word as they
/// were at the kill, seen by the dead process's code only.
struct DeadMemory {
    words: Vec<AtomicU64>,
    notify: AtomicU32,
}

/// One lock owner of a simulated shared file.
pub struct SimShared {
    block: Arc<SimSharedBlock>,
    owner: u64,
    /// Set by [`SimShared::kill`]: every later lock fails, and the words are `dead_memory`.
    dead: AtomicBool,
    dead_memory: OnceLock<DeadMemory>,
}

fn killed() -> io::Error {
    io::Error::other("simulated process killed")
}

impl SimShared {
    pub fn new(block: Arc<SimSharedBlock>) -> SimShared {
        let owner = block.next_owner.fetch_add(1, Ordering::Relaxed);
        SimShared {
            block,
            owner,
            dead: AtomicBool::new(false),
            dead_memory: OnceLock::new(),
        }
    }

    /// The owning process dies (`kill -9`): its locks are released at once, as the kernel
    /// releases them, and from now on the words it stores go to a private copy that no
    /// other handle sees, its locks fail and its waits return at once, so that what its
    /// code does while unwinding never reaches the live processes.
    pub fn kill(&self) {
        self.dead_memory.get_or_init(|| DeadMemory {
            words: self
                .block
                .words
                .iter()
                .map(|word| AtomicU64::new(word.load(Ordering::Acquire)))
                .collect(),
            notify: AtomicU32::new(self.block.notify.load(Ordering::Acquire)),
        });
        self.dead.store(true, Ordering::Release);
        self.release_all();
        let _guard = self.block.notified.lock();
        self.block.wake.notify_all();
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Releases every lock this owner holds.
    fn release_all(&self) {
        let mut locks = self.block.locks.lock();
        locks.retain(|_, holders| {
            holders.shared.remove(&self.owner);
            if holders.exclusive == Some(self.owner) {
                holders.exclusive = None;
            }
            holders.exclusive.is_some() || !holders.shared.is_empty()
        });
        self.block.released.notify_all();
    }

    fn grantable(&self, holders: &ByteHolders, mode: LockMode) -> bool {
        let others_shared = holders.shared.keys().any(|owner| *owner != self.owner);
        let other_exclusive = holders.exclusive.is_some_and(|owner| owner != self.owner);
        match mode {
            LockMode::Shared => !other_exclusive,
            LockMode::Exclusive => !other_exclusive && !others_shared,
        }
    }
}

impl SharedFile for SimShared {
    fn word(&self, index: usize) -> &AtomicU64 {
        match self.dead_memory.get() {
            Some(memory) => &memory.words[index],
            None => &self.block.words[index],
        }
    }

    fn notify_word(&self) -> &AtomicU32 {
        match self.dead_memory.get() {
            Some(memory) => &memory.notify,
            None => &self.block.notify,
        }
    }

    fn wait_notify(&self, seen: u32, timeout: Duration) {
        if self.is_dead() {
            return;
        }
        let mut guard = self.block.notified.lock();
        if u32::from_le(self.block.notify.load(Ordering::Acquire)) != seen {
            return;
        }
        self.block.wake.wait_for(&mut guard, timeout);
    }

    fn wake_all(&self) {
        if self.is_dead() {
            return;
        }
        let _guard = self.block.notified.lock();
        self.block.wake.notify_all();
    }

    fn lock(&self, offset: u64, mode: LockMode, wait: bool) -> io::Result<bool> {
        let mut locks = self.block.locks.lock();
        loop {
            if self.is_dead() {
                return Err(killed());
            }
            let holders = locks.entry(offset).or_default();
            if self.grantable(holders, mode) {
                holders.shared.remove(&self.owner);
                holders.exclusive = None;
                match mode {
                    LockMode::Shared => {
                        holders.shared.insert(self.owner, ());
                    }
                    LockMode::Exclusive => holders.exclusive = Some(self.owner),
                }
                // A downgrade may let shared waiters in.
                self.block.released.notify_all();
                return Ok(true);
            }
            if !wait {
                return Ok(false);
            }
            self.block.released.wait(&mut locks);
        }
    }

    fn unlock(&self, offset: u64) -> io::Result<()> {
        if self.is_dead() {
            // Released at the kill; a lock taken since by another owner is not this one's.
            return Ok(());
        }
        let mut locks = self.block.locks.lock();
        if let Some(holders) = locks.get_mut(&offset) {
            holders.shared.remove(&self.owner);
            if holders.exclusive == Some(self.owner) {
                holders.exclusive = None;
            }
            if holders.exclusive.is_none() && holders.shared.is_empty() {
                locks.remove(&offset);
            }
        }
        self.block.released.notify_all();
        Ok(())
    }
}

impl Drop for SimShared {
    fn drop(&mut self) {
        self.release_all();
    }
}
