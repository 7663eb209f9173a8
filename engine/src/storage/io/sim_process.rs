//! One process on the simulated disk, for the many-process tests and the `model` fuzz
//! target (format-spec/08-many-processes.md): a [`Storage`] over a shared
//! [`SimStorage`] that can be killed as `kill -9` kills, now or at one of its own later
//! operations, while the other processes on the disk run on.
//!
//! # Kill model
//! - The operation the process dies at does not happen, except a write, of which a chosen
//!   number of whole sectors lands first (a `pwrite` cut by the signal: the kernel keeps the
//!   pages it copied). Every later call of the process fails.
//! - Its `SHARED` handles are killed ([`SimShared::kill`]): their byte-range locks are
//!   released at once, and whatever its code stores in the shared words while it unwinds
//!   goes to a private copy no other process sees.
//! - What it wrote before stays in the disk's volatile state (the page cache outlives the
//!   process); a power cut ([`SimStorage::crash_at`]) is a different, whole-disk event.
//!
//! Its whole-file lock (`LOCK`) is released when the caller drops the dead process's store.

use super::shared::sim::SimShared;
use super::shared::SharedFile;
use super::sim::{SimStorage, SECTOR_BYTES};
use super::{LockGuard, Storage, StorageFile};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Where an armed process dies: its `operation`-th mutating operation (counted from 0 over
/// its life); a write there lands its first `landed_sectors` sectors.
#[derive(Debug, Clone, Copy)]
struct KillPoint {
    operation: u64,
    landed_sectors: u64,
}

/// What one process's files and handles share: whether it lives.
#[derive(Default)]
struct Life {
    dead: AtomicBool,
    /// Mutating operations the process ran (or tried).
    operations: AtomicU64,
    armed: Mutex<Option<KillPoint>>,
    shared: Mutex<Vec<Arc<SimShared>>>,
}

fn killed() -> io::Error {
    io::Error::other("simulated process killed")
}

impl Life {
    fn check_alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(killed());
        }
        Ok(())
    }

    /// Counts one mutating operation. `Ok(None)`: it runs; `Ok(Some(sectors))`: the process
    /// dies at it (a write lands that many sectors first); `Err`: the process is dead.
    fn begin(&self) -> io::Result<Option<u64>> {
        self.check_alive()?;
        let operation = self.operations.fetch_add(1, Ordering::AcqRel);
        let armed = *self.armed.lock();
        match armed {
            Some(point) if point.operation <= operation => Ok(Some(point.landed_sectors)),
            _ => Ok(None),
        }
    }

    fn die(&self) {
        self.dead.store(true, Ordering::Release);
        for shared in self.shared.lock().iter() {
            shared.kill();
        }
    }

    /// Runs a mutating operation unless the process dies at it (then it does not happen).
    fn run<T>(&self, operation: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        match self.begin()? {
            None => operation(),
            Some(_) => {
                self.die();
                Err(killed())
            }
        }
    }
}

/// One simulated process: the disk as it sees it. Cloning shares the process.
#[derive(Clone)]
pub struct SimProcess {
    disk: SimStorage,
    life: Arc<Life>,
}

impl SimProcess {
    /// A new live process on `disk`.
    pub fn new(disk: &SimStorage) -> SimProcess {
        SimProcess {
            disk: disk.clone(),
            life: Arc::new(Life::default()),
        }
    }

    /// Kills the process now, between two of its operations.
    pub fn kill(&self) {
        self.life.die();
    }

    /// Arms the process's death at its `after`-th mutating operation from now (0: the
    /// next one); a write there lands its first `landed_sectors` sectors.
    pub fn kill_at(&self, after: u64, landed_sectors: u64) {
        let operation = self.life.operations.load(Ordering::Acquire) + after;
        *self.life.armed.lock() = Some(KillPoint {
            operation,
            landed_sectors,
        });
    }

    /// Whether the process was killed.
    pub fn is_dead(&self) -> bool {
        self.life.dead.load(Ordering::Acquire)
    }

    /// Mutating operations the process ran so far.
    pub fn operation_count(&self) -> u64 {
        self.life.operations.load(Ordering::Acquire)
    }

    fn file(&self, inner: Arc<dyn StorageFile>) -> Arc<dyn StorageFile> {
        Arc::new(ProcessFile {
            inner,
            life: self.life.clone(),
        })
    }
}

/// A file as one simulated process sees it.
struct ProcessFile {
    inner: Arc<dyn StorageFile>,
    life: Arc<Life>,
}

impl StorageFile for ProcessFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.life.check_alive()?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match self.life.begin()? {
            None => self.inner.write_at(buf, offset),
            Some(landed_sectors) => {
                let landed = usize::try_from(landed_sectors.saturating_mul(SECTOR_BYTES))
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                if landed > 0 {
                    // What the kernel copied before the signal stays in the page cache.
                    let _ = self.inner.write_at(&buf[..landed], offset);
                }
                self.life.die();
                Err(killed())
            }
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        self.life.run(|| self.inner.sync_data())
    }

    fn len(&self) -> io::Result<u64> {
        self.life.check_alive()?;
        self.inner.len()
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        self.life.run(|| self.inner.set_len(length))
    }

    fn allocate(&self, length: u64) -> io::Result<()> {
        self.life.run(|| self.inner.allocate(length))
    }

    fn data_end(&self, from: u64) -> io::Result<u64> {
        self.life.check_alive()?;
        self.inner.data_end(from)
    }
}

impl Storage for SimProcess {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let inner = if create {
            self.life.run(|| self.disk.open(path, true))?
        } else {
            self.life.check_alive()?;
            self.disk.open(path, false)?
        };
        Ok(self.file(inner))
    }

    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        self.life.check_alive()?;
        Ok(self.file(self.disk.open_read(path)?))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.life.run(|| self.disk.rename(from, to))
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        self.life.run(|| self.disk.remove(path))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.life.check_alive()?;
        self.disk.list(dir)
    }

    fn create_dir(&self, dir: &str) -> io::Result<()> {
        self.life.run(|| self.disk.create_dir(dir))
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.life.run(|| self.disk.sync_dir(dir))
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        self.life.check_alive()?;
        self.disk.exists(path)
    }

    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        self.life.run(|| self.disk.remove_dir(dir))
    }

    fn available_bytes(&self) -> io::Result<Option<u64>> {
        self.life.check_alive()?;
        self.disk.available_bytes()
    }

    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.life.check_alive()?;
        self.disk.try_lock(path)
    }

    fn try_lock_shared(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.life.check_alive()?;
        self.disk.try_lock_shared(path)
    }

    fn open_shared(&self, path: &str) -> io::Result<Arc<dyn SharedFile>> {
        self.life.check_alive()?;
        let shared = self.disk.open_sim_shared(path)?;
        self.life.shared.lock().push(shared.clone());
        Ok(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::shared::LockMode;

    #[test]
    fn a_killed_process_fails_every_call_and_its_locks_are_free() {
        let disk = SimStorage::new();
        let doomed = SimProcess::new(&disk);
        let other = SimProcess::new(&disk);
        let held = doomed.open_shared("SHARED").expect("shared");
        assert!(held.lock(2, LockMode::Exclusive, false).expect("lock"));
        let theirs = other.open_shared("SHARED").expect("shared");
        assert!(!theirs.lock(2, LockMode::Exclusive, false).expect("try"));
        doomed.kill();
        assert!(theirs.lock(2, LockMode::Exclusive, false).expect("free"));
        assert!(held.lock(3, LockMode::Exclusive, false).is_err());
        assert!(doomed.open("a", true).is_err());
        // What the dead process stores no live process sees.
        held.word(5).store(7, Ordering::Release);
        assert_eq!(theirs.word(5).load(Ordering::Acquire), 0);
    }

    #[test]
    fn an_armed_kill_lands_whole_sectors_of_the_write_it_cuts() {
        let disk = SimStorage::new();
        let process = SimProcess::new(&disk);
        let file = process.open("f", true).expect("create");
        process.kill_at(0, 1);
        assert!(file.write_at(&[9u8; 1300], 0).is_err());
        assert!(process.is_dead());
        let mut landed = vec![0u8; 2048];
        let read = disk
            .open_read("f")
            .expect("open")
            .read_up_to(&mut landed, 0)
            .expect("read");
        assert_eq!(read, 512, "one sector of the write reached the page cache");
    }
}
