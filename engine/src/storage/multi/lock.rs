//! The fixed cross-process locks of F-08-3, as guards that unlock when dropped.

use super::{LockMode, SharedFile};
use std::io;
use std::sync::Arc;

/// Serializes opens (F-08-4).
pub const OPEN_LOCK: u64 = 0;
/// Held shared by every live writer process; exclusive only to learn "alone" (F-08-4).
pub const PRESENCE_LOCK: u64 = 1;
/// Held while writing at the log tail (F-08-6).
pub const WRITE_LOCK: u64 = 2;
/// Held while replacing `MANIFEST` (F-08-12).
pub const MANIFEST_LOCK: u64 = 3;
/// Held for one maintenance pass (F-08-12).
pub const MAINTENANCE_LOCK: u64 = 4;
/// Held while raising the durable position (F-08-7).
pub const DURABLE_LOCK: u64 = 5;
/// Held by the one process syncing the tail segment for every process (F-08-7): the others
/// wait for it and then usually find their bytes covered, so one `fdatasync` serves many.
pub const SYNC_LOCK: u64 = 6;

/// A held byte-range lock of the shared file.
pub struct ByteLock {
    file: Arc<dyn SharedFile>,
    offset: u64,
}

impl ByteLock {
    /// Takes the lock at `offset`, waiting for it.
    pub fn wait(file: &Arc<dyn SharedFile>, offset: u64, mode: LockMode) -> io::Result<ByteLock> {
        file.lock(offset, mode, true)?;
        Ok(ByteLock {
            file: file.clone(),
            offset,
        })
    }

    /// Takes the lock at `offset` if no other owner holds a conflicting one.
    pub fn try_take(
        file: &Arc<dyn SharedFile>,
        offset: u64,
        mode: LockMode,
    ) -> io::Result<Option<ByteLock>> {
        if !file.lock(offset, mode, false)? {
            return Ok(None);
        }
        Ok(Some(ByteLock {
            file: file.clone(),
            offset,
        }))
    }

    /// Changes the mode of the held lock (e.g. `PRESENCE` exclusive to shared, F-08-4).
    /// Downgrading never waits; upgrading waits.
    pub fn convert(&self, mode: LockMode) -> io::Result<()> {
        self.file.lock(self.offset, mode, true).map(|_| ())
    }

    /// The byte it locks.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Drop for ByteLock {
    fn drop(&mut self) {
        // An unlock only fails on a bad descriptor; the lock then dies with the descriptor.
        let _ = self.file.unlock(self.offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::sim::SimStorage;
    use crate::storage::io::Storage;

    fn two_owners() -> (Arc<dyn SharedFile>, Arc<dyn SharedFile>, tempdir::Dir) {
        let dir = tempdir::Dir::new("locks");
        let path = dir.path().join("SHARED");
        let first: Arc<dyn SharedFile> =
            Arc::new(crate::storage::io::shared::fs::FsShared::open(&path).expect("open"));
        let second: Arc<dyn SharedFile> =
            Arc::new(crate::storage::io::shared::fs::FsShared::open(&path).expect("open"));
        (first, second, dir)
    }

    /// A tiny scratch directory, removed on drop (no extra crate).
    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new(tag: &str) -> Dir {
                let path = std::env::temp_dir().join(format!(
                    "dshdb-{tag}-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|elapsed| elapsed.as_nanos())
                        .unwrap_or(0)
                ));
                std::fs::create_dir_all(&path).expect("scratch dir");
                Dir(path)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn exclusion_holds(first: &Arc<dyn SharedFile>, second: &Arc<dyn SharedFile>) {
        let held = ByteLock::try_take(first, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .expect("free");
        assert!(ByteLock::try_take(second, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .is_none());
        assert!(ByteLock::try_take(second, WRITE_LOCK, LockMode::Shared)
            .expect("lock")
            .is_none());
        // Another byte is independent.
        assert!(
            ByteLock::try_take(second, MANIFEST_LOCK, LockMode::Exclusive)
                .expect("lock")
                .is_some()
        );
        drop(held);
        assert!(ByteLock::try_take(second, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .is_some());
    }

    fn presence_tells_alone(first: &Arc<dyn SharedFile>, second: &Arc<dyn SharedFile>) {
        let alone = ByteLock::try_take(first, PRESENCE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .expect("first is alone");
        alone.convert(LockMode::Shared).expect("downgrade");
        assert!(
            ByteLock::try_take(second, PRESENCE_LOCK, LockMode::Exclusive)
                .expect("lock")
                .is_none(),
            "the second opener is not alone"
        );
        let joined = ByteLock::try_take(second, PRESENCE_LOCK, LockMode::Shared)
            .expect("lock")
            .expect("shared presence");
        drop(alone);
        drop(joined);
        assert!(
            ByteLock::try_take(second, PRESENCE_LOCK, LockMode::Exclusive)
                .expect("lock")
                .is_some()
        );
    }

    #[test]
    fn open_file_description_locks_exclude_across_handles_and_convert() {
        let (first, second, _dir) = two_owners();
        exclusion_holds(&first, &second);
        presence_tells_alone(&first, &second);
    }

    /// Two handles of one simulated `SHARED` file: two lock owners, like two processes.
    fn two_simulated_owners(disk: &SimStorage) -> (Arc<dyn SharedFile>, Arc<dyn SharedFile>) {
        let open = || {
            disk.open_shared(crate::storage::multi::SHARED_FILE)
                .expect("shared")
        };
        (open(), open())
    }

    #[test]
    fn simulated_locks_behave_like_real_ones() {
        let disk = SimStorage::new();
        let (first, second) = two_simulated_owners(&disk);
        exclusion_holds(&first, &second);
        presence_tells_alone(&first, &second);
    }

    #[test]
    fn dropping_a_handle_releases_its_locks_like_a_process_death() {
        let disk = SimStorage::new();
        let (first, second) = two_simulated_owners(&disk);
        assert!(first
            .lock(WRITE_LOCK, LockMode::Exclusive, false)
            .expect("lock"));
        assert!(ByteLock::try_take(&second, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .is_none());
        drop(first);
        assert!(ByteLock::try_take(&second, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .is_some());
    }

    #[test]
    fn a_waiting_lock_is_granted_when_the_holder_lets_go() {
        let (first, second, _dir) = two_owners();
        let held = ByteLock::try_take(&first, WRITE_LOCK, LockMode::Exclusive)
            .expect("lock")
            .expect("free");
        let waiter = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let _granted = ByteLock::wait(&second, WRITE_LOCK, LockMode::Exclusive).expect("lock");
            started.elapsed()
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(held);
        let waited = waiter.join().expect("waiter");
        assert!(waited >= std::time::Duration::from_millis(40), "{waited:?}");
    }
}
