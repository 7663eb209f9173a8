//! Real files. `fdatasync` for data, `fsync` of the directory after every namespace change,
//! `fallocate` for preallocation, `flock` for the writer lock.

use super::{LockGuard, Storage, StorageFile};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A store directory on the real file system.
#[derive(Debug, Clone)]
pub struct FsStorage {
    root: PathBuf,
}

impl FsStorage {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FsStorage { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, relative: &str) -> PathBuf {
        if relative.is_empty() {
            self.root.clone()
        } else {
            self.root.join(relative)
        }
    }
}

struct FsFile {
    file: File,
}

/// Data regions [`StorageFile::data_end`] steps over before it gives up and answers the
/// file's length (a segment has one: its written bytes, then the preallocated hole).
const MAX_DATA_REGIONS: usize = 64;

/// `lseek(SEEK_DATA | SEEK_HOLE)`: `None` when there is no such offset (`ENXIO`), and also
/// where the file system does not support it (`EINVAL`): then the caller reads it all.
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let Ok(signed) = libc::off_t::try_from(offset) else {
        return Ok(None);
    };
    // SAFETY: plain syscall on a file descriptor we own; no memory is passed. The file's
    // cursor it moves is used by nothing (every read and write is positioned).
    let result = unsafe { libc::lseek(file.as_raw_fd(), signed, whence) };
    if result >= 0 {
        return Ok(u64::try_from(result).ok());
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENXIO) => Ok(None),
        Some(libc::EINVAL) if whence == libc::SEEK_DATA => Ok(Some(offset)),
        Some(libc::EINVAL) => Ok(None),
        _ => Err(error),
    }
}

impl StorageFile for FsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        self.file.set_len(length)
    }

    fn data_end(&self, from: u64) -> io::Result<u64> {
        let length = self.file.metadata()?.len();
        let mut position = from;
        let mut end = from.min(length);
        // Each round steps over one data region and the hole after it.
        for _ in 0..MAX_DATA_REGIONS {
            let Some(data) = seek(&self.file, position, libc::SEEK_DATA)? else {
                // No data at or after `position`: the rest reads as zeros.
                return Ok(end);
            };
            let hole = seek(&self.file, data, libc::SEEK_HOLE)?.unwrap_or(length);
            end = hole.min(length);
            if hole >= length {
                return Ok(end);
            }
            position = hole;
        }
        // Too fragmented to be worth it: read all of it.
        Ok(length)
    }

    fn map_read(&self) -> io::Result<Option<super::MappedFile>> {
        if self.file.metadata()?.len() == 0 {
            // A zero-length map is an error on Linux; nothing to map anyway.
            return Ok(None);
        }
        // SAFETY: only run files are mapped, and they are never written after they are named
        // by the manifest (see `MappedFile::map`).
        unsafe { super::MappedFile::map(&self.file) }.map(Some)
    }

    fn allocate(&self, length: u64) -> io::Result<()> {
        let length_signed = libc::off_t::try_from(length)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        // SAFETY: plain syscall on a file descriptor we own; no memory is passed.
        let result = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, length_signed) };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        // File systems without fallocate: fall back to extending the file.
        if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
            if self.len()? < length {
                self.file.set_len(length)?;
            }
            return Ok(());
        }
        Err(error)
    }
}

struct FsLock {
    _file: File,
}

impl LockGuard for FsLock {}

impl Storage for FsStorage {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(self.path(path))?;
        Ok(Arc::new(FsFile { file }))
    }

    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        let file = File::open(self.path(path))?;
        Ok(Arc::new(FsFile { file }))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path(from), self.path(to))
    }

    fn remove(&self, path: &str) -> io::Result<()> {
        std::fs::remove_file(self.path(path))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(self.path(dir)) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut names = Vec::new();
        for entry in entries {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn create_dir(&self, dir: &str) -> io::Result<()> {
        std::fs::create_dir_all(self.path(dir))
    }

    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        File::open(self.path(dir))?.sync_all()
    }

    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        std::fs::remove_dir(self.path(dir))
    }

    fn available_bytes(&self) -> io::Result<Option<u64>> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.root.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in store path"))?;
        // SAFETY: `statvfs` is plain old data, fully written by a successful call.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a NUL-terminated string and `stats` a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut stats) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // The field types differ between targets (32 bits on some); `from` widens losslessly.
        #[allow(clippy::useless_conversion)]
        let (blocks, block_bytes) = (u64::from(stats.f_bavail), u64::from(stats.f_frsize));
        Ok(Some(blocks.saturating_mul(block_bytes)))
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        self.path(path).try_exists()
    }

    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.flock(path, libc::LOCK_EX)
    }

    fn try_lock_shared(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.flock(path, libc::LOCK_SH)
    }

    fn open_shared(
        &self,
        path: &str,
    ) -> io::Result<Arc<dyn crate::storage::io::shared::SharedFile>> {
        Ok(Arc::new(crate::storage::io::shared::fs::FsShared::open(
            &self.path(path),
        )?))
    }
}

impl FsStorage {
    /// `flock(mode | LOCK_NB)` on `path` (created empty when missing).
    fn flock(&self, path: &str, mode: libc::c_int) -> io::Result<Option<Box<dyn LockGuard>>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.path(path))?;
        // SAFETY: plain syscall on a file descriptor we own.
        let result = unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) };
        if result == 0 {
            return Ok(Some(Box::new(FsLock { _file: file })));
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(error)
    }
}
