//! A simulated disk with a written fault model, for crash and fault-injection tests.
//!
//! # Fault model
//! - Every file has *volatile* bytes (what reads see) and *durable* bytes (what survives a
//!   power cut). `sync_data` makes a file's volatile bytes durable.
//! - The namespace (which name points at which file) is volatile too: a create, rename or
//!   remove becomes durable only when its directory is synced with `sync_dir`.
//! - Every mutating call is one *operation*, numbered from 0. [`SimStorage::crash_at`] arms a
//!   power cut at an operation: that operation does not complete, it and every later call fail,
//!   and the crash images are recorded:
//!   - the durable state, with no trace of unsynced writes;
//!   - if the cut operation is a write: the durable state plus every prefix of that write that
//!     ends on a sector boundary (a torn write), including the whole write;
//!   - the process-crash image: the volatile state before the cut operation (what a `kill -9`
//!     leaves, since the kernel keeps written pages).
//! - Faults: a capacity in bytes (allocation and writes past it fail with `ENOSPC`), one-shot
//!   failures of the n-th write, sync or rename with `EIO` (or a chosen error number, such as
//!   the `ENOSPC` a write into a preallocated segment or an `fdatasync` can still return on
//!   some file systems), and a one-shot short write (the n-th write lands only its first half,
//!   rounded down to a sector, then fails with `EIO`).

// Test support, not a format: offsets into in-memory disk images that exist, so they fit
// `usize` (storage/ denies narrowing casts for its format code).
#![allow(clippy::cast_possible_truncation)]

use super::{parent_dir, LockGuard, Storage, StorageFile};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;

/// Sector size for torn writes, in bytes.
pub const SECTOR_BYTES: u64 = 512;

#[derive(Clone, Default)]
struct SimFile {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    allocated: u64,
}

/// The files and names a power cut leaves behind. Open it with [`SimStorage::from_image`].
#[derive(Clone, Default)]
pub struct CrashImage {
    files: BTreeMap<String, Vec<u8>>,
    directories: BTreeSet<String>,
    /// What kind of image this is, for failure messages.
    pub label: String,
}

impl CrashImage {
    /// The file names in this image.
    pub fn file_names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// Drops a file from the image (for damage tests).
    pub fn remove_file(&mut self, name: &str) {
        self.files.remove(name);
    }

    /// One file's bytes.
    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(Vec::as_slice)
    }

    /// Mutable access to one file's bytes (for bit-flip tests).
    pub fn file_mut(&mut self, name: &str) -> Option<&mut Vec<u8>> {
        self.files.get_mut(name)
    }
}

/// Kinds of operation that can be made to fail once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    Write,
    Sync,
    Rename,
    /// A write of which only the first half (rounded down to a sector) reaches the file
    /// before the call fails with `EIO`: what a short `pwrite` followed by a failing retry
    /// leaves.
    ShortWrite,
}

#[derive(Default)]
struct State {
    files: BTreeMap<u64, SimFile>,
    names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    directories: BTreeSet<String>,
    next_inode: u64,
    operations: u64,
    crash_at: Option<u64>,
    crashed: bool,
    images: Vec<CrashImage>,
    capacity: Option<u64>,
    /// One-shot failures: (kind, index) to the error number it fails with.
    failures: BTreeMap<(FaultKind, u64), i32>,
    counts: BTreeMap<FaultKind, u64>,
    /// Held whole-file locks: path → (exclusive, holders).
    locks: BTreeMap<String, (bool, u32)>,
    /// The shared files of many-process coordination, by path: memory, not disk, so a
    /// power cut (a new storage from an image) starts them zeroed, like a reboot.
    shared: BTreeMap<String, Arc<crate::storage::io::shared::sim::SimSharedBlock>>,
}

/// The simulated disk. Cloning shares the same disk.
#[derive(Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

fn power_cut() -> io::Error {
    io::Error::other("simulated power cut")
}

fn no_space() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{path}: not found"))
}

impl State {
    /// Counts one mutating operation; records crash images and fails when the cut is armed.
    fn begin(&mut self, torn_write: Option<(u64, u64, &[u8])>) -> io::Result<()> {
        if self.crashed {
            return Err(power_cut());
        }
        let number = self.operations;
        self.operations += 1;
        if self.crash_at == Some(number) {
            self.record_images(torn_write);
            self.crashed = true;
            return Err(power_cut());
        }
        Ok(())
    }

    fn fail_once(&mut self, kind: FaultKind) -> io::Result<()> {
        let count = self.counts.entry(kind).or_insert(0);
        let index = *count;
        *count += 1;
        if let Some(errno) = self.failures.remove(&(kind, index)) {
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(())
    }

    fn durable_image(&self, label: String) -> CrashImage {
        let mut files = BTreeMap::new();
        for (name, inode) in &self.durable_names {
            if let Some(file) = self.files.get(inode) {
                files.insert(name.clone(), file.durable.clone());
            }
        }
        CrashImage {
            files,
            directories: self.directories.clone(),
            label,
        }
    }

    fn record_images(&mut self, torn_write: Option<(u64, u64, &[u8])>) {
        let number = self.operations - 1;
        self.images
            .push(self.durable_image(format!("power cut at op {number}")));
        if let Some((inode, offset, bytes)) = torn_write {
            let name = self
                .durable_names
                .iter()
                .find(|(_, candidate)| **candidate == inode)
                .map(|(name, _)| name.clone());
            if let Some(name) = name {
                for prefix in torn_prefixes(offset, bytes.len() as u64) {
                    let mut image =
                        self.durable_image(format!("op {number} torn after {prefix} bytes"));
                    if let Some(data) = image.files.get_mut(&name) {
                        apply_write(data, offset, &bytes[..prefix as usize]);
                    }
                    self.images.push(image);
                }
            }
        }
        let mut process = CrashImage {
            files: BTreeMap::new(),
            directories: self.directories.clone(),
            label: format!("process killed at op {number}"),
        };
        for (name, inode) in &self.names {
            if let Some(file) = self.files.get(inode) {
                process.files.insert(name.clone(), file.volatile.clone());
            }
        }
        self.images.push(process);
    }

    /// Bytes of the files a name still refers to, now or in the durable directory image: a
    /// removed file gives its space back once its removal is durable (`sync_dir`), as a
    /// file system frees an unlinked file's blocks.
    fn used_bytes(&self) -> u64 {
        let named: BTreeSet<u64> = self
            .names
            .values()
            .chain(self.durable_names.values())
            .copied()
            .collect();
        self.files
            .iter()
            .filter(|(inode, _)| named.contains(inode))
            .map(|(_, file)| file.allocated.max(file.volatile.len() as u64))
            .sum()
    }

    fn file(&mut self, inode: u64) -> io::Result<&mut SimFile> {
        self.files
            .get_mut(&inode)
            .ok_or_else(|| io::Error::other("file was removed"))
    }
}

/// Prefix lengths of a write at `offset` that end on sector boundaries, plus the whole write.
/// The empty prefix is not listed: it equals the plain durable image.
fn torn_prefixes(offset: u64, length: u64) -> Vec<u64> {
    let mut prefixes = Vec::new();
    let mut boundary = (offset / SECTOR_BYTES + 1) * SECTOR_BYTES;
    while boundary < offset + length {
        prefixes.push(boundary - offset);
        boundary += SECTOR_BYTES;
    }
    if length > 0 {
        prefixes.push(length);
    }
    prefixes
}

fn apply_write(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

struct SimHandle {
    state: Arc<Mutex<State>>,
    inode: u64,
    writable: bool,
}

impl StorageFile for SimHandle {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut state = self.state.lock();
        if state.crashed {
            return Err(power_cut());
        }
        let file = state.file(self.inode)?;
        let Some(start) = usize::try_from(offset)
            .ok()
            .filter(|start| *start < file.volatile.len())
        else {
            return Ok(0);
        };
        let count = buf.len().min(file.volatile.len() - start);
        buf[..count].copy_from_slice(&file.volatile[start..start + count]);
        Ok(count)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let mut state = self.state.lock();
        state.begin(Some((self.inode, offset, buf)))?;
        state.fail_once(FaultKind::Write)?;
        if state.fail_once(FaultKind::ShortWrite).is_err() {
            let landed = (buf.len() as u64 / 2 / SECTOR_BYTES * SECTOR_BYTES) as usize;
            let file = state.file(self.inode)?;
            apply_write(&mut file.volatile, offset, &buf[..landed]);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let end = offset + buf.len() as u64;
        let capacity = state.capacity;
        let used = state.used_bytes();
        let file = state.file(self.inode)?;
        let growth = end.saturating_sub(file.allocated.max(file.volatile.len() as u64));
        if let Some(capacity) = capacity {
            if growth > 0 && used + growth > capacity {
                return Err(no_space());
            }
        }
        apply_write(&mut file.volatile, offset, buf);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        state.fail_once(FaultKind::Sync)?;
        let file = state.file(self.inode)?;
        file.durable = file.volatile.clone();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let mut state = self.state.lock();
        if state.crashed {
            return Err(power_cut());
        }
        Ok(state.file(self.inode)?.volatile.len() as u64)
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        let file = state.file(self.inode)?;
        file.volatile.resize(length as usize, 0);
        file.allocated = file.allocated.min(length);
        Ok(())
    }

    fn allocate(&self, length: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        let capacity = state.capacity;
        let used = state.used_bytes();
        let file = state.file(self.inode)?;
        let growth = length.saturating_sub(file.allocated.max(file.volatile.len() as u64));
        if let Some(capacity) = capacity {
            if used + growth > capacity {
                return Err(no_space());
            }
        }
        file.allocated = file.allocated.max(length);
        if (file.volatile.len() as u64) < length {
            file.volatile.resize(length as usize, 0);
        }
        Ok(())
    }
}

struct SimLock {
    state: Arc<Mutex<State>>,
    path: String,
}

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut state = self.state.lock();
        if let Some((_, holders)) = state.locks.get_mut(&self.path) {
            *holders -= 1;
            if *holders == 0 {
                state.locks.remove(&self.path);
            }
        }
    }
}

impl SimStorage {
    fn take_lock(&self, path: &str, exclusive: bool) -> Option<Box<dyn LockGuard>> {
        let mut state = self.state.lock();
        match state.locks.get_mut(path) {
            Some((held_exclusive, holders)) => {
                if exclusive || *held_exclusive {
                    return None;
                }
                *holders += 1;
            }
            None => {
                state.locks.insert(path.to_string(), (exclusive, 1));
            }
        }
        Some(Box::new(SimLock {
            state: self.state.clone(),
            path: path.to_string(),
        }))
    }
}

impl SimStorage {
    pub fn new() -> Self {
        let storage = SimStorage::default();
        storage.state.lock().directories.insert(String::new());
        storage
    }

    /// A fresh disk holding exactly what a crash image holds (all of it durable).
    pub fn from_image(image: &CrashImage) -> Self {
        let storage = SimStorage::new();
        {
            let mut state = storage.state.lock();
            state.directories = image.directories.clone();
            for (name, bytes) in &image.files {
                let inode = state.next_inode;
                state.next_inode += 1;
                state.files.insert(
                    inode,
                    SimFile {
                        volatile: bytes.clone(),
                        durable: bytes.clone(),
                        allocated: bytes.len() as u64,
                    },
                );
                state.names.insert(name.clone(), inode);
                state.durable_names.insert(name.clone(), inode);
            }
        }
        storage
    }

    /// The current durable state as an image (what a power cut right now would leave).
    pub fn durable_image(&self) -> CrashImage {
        self.state.lock().durable_image("durable now".to_string())
    }

    /// The current volatile state as an image (what a process kill right now would leave).
    pub fn volatile_image(&self) -> CrashImage {
        let state = self.state.lock();
        let mut image = CrashImage {
            files: BTreeMap::new(),
            directories: state.directories.clone(),
            label: "volatile now".to_string(),
        };
        for (name, inode) in &state.names {
            if let Some(file) = state.files.get(inode) {
                image.files.insert(name.clone(), file.volatile.clone());
            }
        }
        image
    }

    /// Arms a power cut at operation number `operation` (counted from 0 over the disk's life).
    pub fn crash_at(&self, operation: u64) {
        self.state.lock().crash_at = Some(operation);
    }

    /// How many mutating operations have run so far.
    pub fn operation_count(&self) -> u64 {
        self.state.lock().operations
    }

    /// Whether the armed power cut has happened.
    pub fn crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// The images recorded by the power cut (empty before it).
    pub fn take_images(&self) -> Vec<CrashImage> {
        std::mem::take(&mut self.state.lock().images)
    }

    /// The images the armed power cut recorded or, when the workload finished before the
    /// cut, the durable image as it stands: what a crash-point test reopens.
    pub fn take_crash_images(&self) -> Vec<CrashImage> {
        let images = self.take_images();
        if images.is_empty() {
            vec![self.durable_image()]
        } else {
            images
        }
    }

    /// Bytes the disk holds now (allocated or written, whichever is larger, over all files).
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// Limits the disk to `bytes` bytes in all; growth past it fails with `ENOSPC`.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.lock().capacity = bytes;
    }

    /// Makes the `index`-th (from 0, counted from now) operation of `kind` fail once with `EIO`.
    pub fn fail_nth(&self, kind: FaultKind, index: u64) {
        self.fail_nth_with(kind, index, libc::EIO);
    }

    /// Makes the `index`-th (from 0, counted from now) operation of `kind` fail once with the
    /// error number `errno` (`ShortWrite` always fails with `EIO`).
    pub fn fail_nth_with(&self, kind: FaultKind, index: u64, errno: i32) {
        let mut state = self.state.lock();
        let already = state.counts.get(&kind).copied().unwrap_or(0);
        state.failures.insert((kind, already + index), errno);
    }

    /// A new lock owner of the simulated shared file `path` (what `open_shared` returns),
    /// as its concrete type, so that a simulated process can kill it.
    pub fn open_sim_shared(
        &self,
        path: &str,
    ) -> io::Result<Arc<crate::storage::io::shared::sim::SimShared>> {
        let block = {
            let mut state = self.state.lock();
            if state.crashed {
                return Err(power_cut());
            }
            state.shared.entry(path.to_string()).or_default().clone()
        };
        Ok(Arc::new(crate::storage::io::shared::sim::SimShared::new(
            block,
        )))
    }

    fn lookup(&self, path: &str) -> io::Result<u64> {
        self.state
            .lock()
            .names
            .get(path)
            .copied()
            .ok_or_else(|| not_found(path))
    }
}

impl Storage for SimStorage {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let existing = self.state.lock().names.get(path).copied();
        let inode = match existing {
            Some(inode) => inode,
            None if create => {
                let mut state = self.state.lock();
                if !state.directories.contains(parent_dir(path)) {
                    return Err(not_found(parent_dir(path)));
                }
                state.begin(None)?;
                let inode = state.next_inode;
                state.next_inode += 1;
                state.files.insert(inode, SimFile::default());
                state.names.insert(path.to_string(), inode);
                inode
            }
            None => return Err(not_found(path)),
        };
        Ok(Arc::new(SimHandle {
            state: self.state.clone(),
            inode,
            writable: true,
        }))
    }

    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        let inode = self.lookup(path)?;
        Ok(Arc::new(SimHandle {
            state: self.state.clone(),
            inode,
            writable: false,
        }))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        state.fail_once(FaultKind::Rename)?;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_string(), inode);
        Ok(())
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        state.names.remove(path).ok_or_else(|| not_found(path))?;
        Ok(())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let state = self.state.lock();
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut names: BTreeSet<String> = BTreeSet::new();
        let all = state.names.keys().chain(state.directories.iter());
        for name in all {
            if let Some(rest) = name.strip_prefix(&prefix) {
                if !rest.is_empty() && !rest.contains('/') {
                    names.insert(rest.to_string());
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    fn create_dir(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.directories.contains(dir) {
            return Ok(());
        }
        state.begin(None)?;
        // Directories are modelled as durable once created: the engine syncs the parent
        // right after, and a lost directory would show up as lost files anyway.
        let mut path = String::new();
        for part in dir.split('/') {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(part);
            state.directories.insert(path.clone());
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        state.begin(None)?;
        let in_dir = |name: &String| parent_dir(name) == dir;
        state.durable_names.retain(|name, _| !in_dir(name));
        let entries: Vec<(String, u64)> = state
            .names
            .iter()
            .filter(|(name, _)| in_dir(name))
            .map(|(name, inode)| (name.clone(), *inode))
            .collect();
        state.durable_names.extend(entries);
        Ok(())
    }

    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        let mut state = self.state.lock();
        let prefix = format!("{dir}/");
        let occupied = state
            .names
            .keys()
            .chain(state.directories.iter())
            .any(|name| name.starts_with(&prefix));
        if occupied {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{dir}: directory not empty"),
            ));
        }
        state.begin(None)?;
        if !state.directories.remove(dir) {
            return Err(not_found(dir));
        }
        Ok(())
    }

    fn available_bytes(&self) -> io::Result<Option<u64>> {
        let state = self.state.lock();
        Ok(state
            .capacity
            .map(|capacity| capacity.saturating_sub(state.used_bytes())))
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        let state = self.state.lock();
        Ok(state.names.contains_key(path) || state.directories.contains(path))
    }

    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        Ok(self.take_lock(path, true))
    }

    fn try_lock_shared(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        Ok(self.take_lock(path, false))
    }

    fn open_shared(
        &self,
        path: &str,
    ) -> io::Result<Arc<dyn crate::storage::io::shared::SharedFile>> {
        Ok(self.open_sim_shared(path)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsynced_writes_vanish_and_synced_ones_survive_a_power_cut() {
        let disk = SimStorage::new();
        let file = disk.open("a", true).expect("create");
        disk.sync_dir("").expect("sync dir");
        file.write_at(b"hello", 0).expect("write");
        file.sync_data().expect("sync");
        file.write_at(b"world", 5).expect("write");
        let image = disk.durable_image();
        let reopened = SimStorage::from_image(&image);
        let handle = reopened.open_read("a").expect("open");
        let mut buffer = vec![0; 16];
        let read = handle.read_at(&mut buffer, 0).expect("read");
        assert_eq!(&buffer[..read], b"hello");
    }

    #[test]
    fn a_name_is_durable_only_after_its_directory_is_synced() {
        let disk = SimStorage::new();
        let file = disk.open("b", true).expect("create");
        file.sync_data().expect("sync");
        assert!(!disk.durable_image().files.contains_key("b"));
        disk.sync_dir("").expect("sync dir");
        assert!(disk.durable_image().files.contains_key("b"));
    }

    #[test]
    fn a_cut_write_yields_every_sector_prefix() {
        let disk = SimStorage::new();
        let file = disk.open("c", true).expect("create");
        disk.sync_dir("").expect("sync dir");
        let cut = disk.operation_count();
        disk.crash_at(cut);
        assert!(file.write_at(&[7u8; 1300], 100).is_err());
        let images = disk.take_images();
        // Durable image, prefixes ending at 512 and 1024 and the whole write, process image.
        let lengths: Vec<usize> = images.iter().map(|image| image.files["c"].len()).collect();
        assert_eq!(lengths, vec![0, 512, 1024, 1400, 0]);
        assert!(file.sync_data().is_err(), "every call after the cut fails");
    }

    #[test]
    fn capacity_and_one_shot_faults_fail_with_the_right_errors() {
        let disk = SimStorage::new();
        disk.set_capacity(Some(1000));
        let file = disk.open("d", true).expect("create");
        let error = file.allocate(2000).expect_err("over capacity");
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
        disk.fail_nth(FaultKind::Sync, 0);
        assert_eq!(
            file.sync_data().expect_err("armed").raw_os_error(),
            Some(libc::EIO)
        );
        file.sync_data().expect("one shot only");
    }
}
