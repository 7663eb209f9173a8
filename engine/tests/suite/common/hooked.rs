//! The simulated disk with one step armed on one file: the step runs when the code under
//! test touches that file at the chosen moment, so a test puts another writer's (or
//! process's) step at the worst moment of an open.

use dshdb::storage::io::shared::SharedFile;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::{LockGuard, Storage, StorageFile};
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// What the hook does when it fires, and when: before a read of `path` (or after one, or
/// when its length is asked, or once the store has asked whether it exists, or once it
/// has listed it as a directory).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    BeforeRead,
    AfterRead,
    AtLength,
    AfterExists,
    AfterList,
}

pub type Step = Box<dyn FnOnce() + Send>;

/// The simulated disk, seen by a reader, with one writer step armed on one file.
pub struct Hooked {
    disk: SimStorage,
    armed: Arc<Mutex<Option<(String, Moment, Step)>>>,
}

impl Hooked {
    pub fn new(disk: &SimStorage, path: String, moment: Moment, step: Step) -> Arc<Hooked> {
        Arc::new(Hooked {
            disk: disk.clone(),
            armed: Arc::new(Mutex::new(Some((path, moment, step)))),
        })
    }

    pub fn fired(&self) -> bool {
        self.armed.lock().is_none()
    }
}

/// Runs the armed step if it is for `path` at `moment` (outside the lock: the step uses the
/// same disk).
fn fire(armed: &Mutex<Option<(String, Moment, Step)>>, path: &str, moment: Moment) {
    let step = {
        let mut armed = armed.lock();
        match armed.as_ref() {
            Some((armed_path, armed_moment, _))
                if armed_path == path && *armed_moment == moment =>
            {
                armed.take().map(|(_, _, step)| step)
            }
            _ => None,
        }
    };
    if let Some(step) = step {
        step();
    }
}

struct HookedFile {
    inner: Arc<dyn StorageFile>,
    path: String,
    armed: Arc<Mutex<Option<(String, Moment, Step)>>>,
}

impl StorageFile for HookedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        fire(&self.armed, &self.path, Moment::BeforeRead);
        let read = self.inner.read_at(buf, offset);
        fire(&self.armed, &self.path, Moment::AfterRead);
        read
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        let length = self.inner.len();
        fire(&self.armed, &self.path, Moment::AtLength);
        length
    }
    fn set_len(&self, length: u64) -> io::Result<()> {
        self.inner.set_len(length)
    }
    fn allocate(&self, length: u64) -> io::Result<()> {
        self.inner.allocate(length)
    }
}

impl Storage for Hooked {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.disk.open(path, create)
    }
    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.disk.open_read(path)?;
        Ok(Arc::new(HookedFile {
            inner,
            path: path.to_string(),
            armed: self.armed.clone(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.disk.rename(from, to)
    }
    fn remove(&self, path: &str) -> io::Result<()> {
        self.disk.remove(path)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let names = self.disk.list(dir);
        fire(&self.armed, dir, Moment::AfterList);
        names
    }
    fn create_dir(&self, dir: &str) -> io::Result<()> {
        self.disk.create_dir(dir)
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.disk.sync_dir(dir)
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        let exists = self.disk.exists(path);
        fire(&self.armed, path, Moment::AfterExists);
        exists
    }
    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        self.disk.remove_dir(dir)
    }
    fn available_bytes(&self) -> io::Result<Option<u64>> {
        self.disk.available_bytes()
    }
    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.disk.try_lock(path)
    }
    fn try_lock_shared(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.disk.try_lock_shared(path)
    }
    fn open_shared(&self, path: &str) -> io::Result<Arc<dyn SharedFile>> {
        self.disk.open_shared(path)
    }
}
