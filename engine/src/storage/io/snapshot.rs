//! A read-only reader's view of a store (format-spec F-01-3, F-05-13): the files one
//! manifest names, opened together right after that manifest was read, so that a writer
//! that seals a segment into a run and removes it (or rewrites a run) meanwhile changes
//! nothing this reader sees. POSIX keeps a removed file's bytes while it is open; the
//! simulated disk does the same.

use super::{LockGuard, Storage, StorageFile};
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

/// A storage whose named files are pinned: `open_read` of one returns the handle opened
/// when the view was made; every other call goes to the storage underneath.
pub struct SnapshotStorage {
    inner: Arc<dyn Storage>,
    pinned: HashMap<String, Arc<dyn StorageFile>>,
}

impl SnapshotStorage {
    /// Opens every file of `paths` for reading. On failure returns the path that failed
    /// with its error (`NotFound` when it is missing; the caller decides whether the
    /// manifest changed meanwhile).
    pub fn pin(
        inner: Arc<dyn Storage>,
        paths: &[String],
    ) -> Result<SnapshotStorage, (String, io::Error)> {
        let mut pinned = HashMap::with_capacity(paths.len());
        for path in paths {
            let file = inner
                .open_read(path)
                .map_err(|error| (path.clone(), error))?;
            pinned.insert(path.clone(), file);
        }
        Ok(SnapshotStorage { inner, pinned })
    }

    /// A view where `open_read` of each path of `files` returns the given handle (e.g. a
    /// prefix of a segment in memory, what a process joining others reads, F-08-4).
    pub fn with_files(
        inner: Arc<dyn Storage>,
        files: HashMap<String, Arc<dyn StorageFile>>,
    ) -> SnapshotStorage {
        SnapshotStorage {
            inner,
            pinned: files,
        }
    }
}

impl Storage for SnapshotStorage {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.inner.open(path, create)
    }

    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        match self.pinned.get(path) {
            Some(file) => Ok(file.clone()),
            None => self.inner.open_read(path),
        }
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        self.inner.remove(path)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn create_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.create_dir(dir)
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        if self.pinned.contains_key(path) {
            return Ok(true);
        }
        self.inner.exists(path)
    }

    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.remove_dir(dir)
    }

    fn available_bytes(&self) -> io::Result<Option<u64>> {
        self.inner.available_bytes()
    }

    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.inner.try_lock(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::sim::SimStorage;

    #[test]
    fn a_pinned_file_reads_after_it_is_removed_and_a_missing_one_is_not_found() {
        let disk = SimStorage::new();
        let file = disk.open("a", true).expect("create");
        file.write_at(b"bytes", 0).expect("write");
        let view = SnapshotStorage::pin(Arc::new(disk.clone()), &["a".to_string()]).expect("pin");
        disk.remove("a").expect("remove");
        let pinned = view.open_read("a").expect("still pinned");
        assert_eq!(pinned.read_all().expect("read"), b"bytes");
        let missing = SnapshotStorage::pin(Arc::new(disk), &["a".to_string()]);
        assert!(matches!(
            missing.map(|_| ()).map_err(|(path, error)| (path, error.kind())),
            Err((path, io::ErrorKind::NotFound)) if path == "a"
        ));
    }
}
