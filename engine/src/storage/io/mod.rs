//! The storage abstraction. The engine touches the disk only through [`Storage`], so every crash
//! test can run on `sim::SimStorage` (with the `testing` feature), which models volatile vs
//! durable bytes and power cuts.
//!
//! Paths are relative to the store's root and use `/` as separator.

pub mod fs;
pub mod shared;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
#[cfg(any(test, feature = "testing"))]
pub mod sim_process;
pub mod snapshot;

use std::io;
use std::sync::Arc;

/// One open file. Offsets are absolute; there is no cursor.
pub trait StorageFile: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every byte written so far durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Truncates or extends (with zeros) to `length` bytes.
    fn set_len(&self, length: u64) -> io::Result<()>;
    /// Reserves `length` bytes of disk (zero-filled), so later writes below it cannot fail
    /// for lack of space. Fails with "no space" when the disk is full.
    fn allocate(&self, length: u64) -> io::Result<()>;

    /// An offset at or after `from` past which every byte of the file reads as zero: the
    /// end of its last data region where the file system reports holes (a preallocated
    /// segment's unwritten rest is one), else the file's length. Lets a reader skip tens of
    /// MiB of zeros without reading them; the answer never changes what a read returns.
    fn data_end(&self, from: u64) -> io::Result<u64> {
        let _ = from;
        self.len()
    }

    /// Maps the file read-only, where the storage can (real files); `Ok(None)` means "read
    /// it with `read_at`". Only for files that are never written again (run files).
    fn map_read(&self) -> io::Result<Option<MappedFile>> {
        Ok(None)
    }

    /// Reads the whole file into memory: the bytes up to its length when the read starts,
    /// or up to its end if it shrinks meanwhile (a writer trimming a segment it seals, while
    /// a read-only reader reads it: F-05-13). Bytes it gains meanwhile are not read.
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let length = usize::try_from(self.len()?)
            .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "file larger than memory"))?;
        let mut bytes = vec![0; length];
        let read = self.read_up_to(&mut bytes, 0)?;
        bytes.truncate(read);
        Ok(bytes)
    }

    /// Reads up to `buf.len()` bytes at `offset`, fewer only at the end of the file; returns
    /// how many were read.
    fn read_up_to(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(read) => done += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(done)
    }

    /// Reads exactly `buf.len()` bytes at `offset`, failing on a short read.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let read = self.read_at(&mut buf[done..], offset + done as u64)?;
            if read == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
            }
            done += read;
        }
        Ok(())
    }
}

/// A read-only memory map of an immutable file.
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `file` read-only.
    ///
    /// # Safety
    /// The caller guarantees that nobody writes or truncates the file while the map lives
    /// (dshdb maps only run files, which are complete and synced before the manifest names
    /// them and are never modified afterwards).
    pub unsafe fn map(file: &std::fs::File) -> io::Result<MappedFile> {
        // SAFETY: forwarded to the caller, see above.
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(MappedFile { map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// A file held in memory (read-only), for tests and tools that decode bytes they already
/// have with the same code as files on a storage.
pub struct MemoryFile {
    bytes: Vec<u8>,
}

impl MemoryFile {
    pub fn new(bytes: Vec<u8>) -> Self {
        MemoryFile { bytes }
    }
}

impl StorageFile for MemoryFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // Reading at or past the end reads nothing.
        let length = self.bytes.len();
        let start = usize::try_from(offset).map_or(length, |offset| offset.min(length));
        let count = buf.len().min(self.bytes.len() - start);
        buf[..count].copy_from_slice(&self.bytes[start..start + count]);
        Ok(count)
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> io::Result<()> {
        Err(read_only_error())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.len() as u64)
    }

    fn set_len(&self, _length: u64) -> io::Result<()> {
        Err(read_only_error())
    }

    fn allocate(&self, _length: u64) -> io::Result<()> {
        Err(read_only_error())
    }
}

fn read_only_error() -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, "read-only memory file")
}

/// A held exclusive lock; dropping it releases the lock.
pub trait LockGuard: Send + Sync {}

/// A directory tree that holds one store.
pub trait Storage: Send + Sync {
    /// Opens a file for reading and writing; creates it when `create` is set.
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens a file for reading only.
    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &str) -> io::Result<()>;
    /// Names of the entries directly inside `dir` (empty when it does not exist).
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    /// Creates a directory (and its parents); no error when it exists.
    fn create_dir(&self, dir: &str) -> io::Result<()>;
    /// Makes creations, renames and removals inside `dir` durable (`fsync` of the directory).
    fn sync_dir(&self, dir: &str) -> io::Result<()>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &str) -> io::Result<bool>;
    /// Removes an empty directory.
    fn remove_dir(&self, dir: &str) -> io::Result<()>;
    /// Bytes the disk can still take (`statvfs`'s blocks available to unprivileged users),
    /// or `None` where the storage cannot tell. Preallocation shrinks to it (F-03-3).
    fn available_bytes(&self) -> io::Result<Option<u64>>;
    /// Takes the exclusive writer lock on `path` without waiting.
    /// Returns `Ok(None)` when another holder has it.
    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>>;
    /// Takes a shared lock on `path` without waiting (many shared holders; none while an
    /// exclusive [`Storage::try_lock`] is held, F-08-2). Returns `Ok(None)` on a conflict.
    fn try_lock_shared(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this storage has no shared locks",
        ))
    }
    /// Opens (creating when missing) the store's shared file of many-process coordination
    /// (format-spec/08-many-processes.md). Every call returns a new lock owner.
    fn open_shared(
        &self,
        path: &str,
    ) -> io::Result<Arc<dyn crate::storage::io::shared::SharedFile>> {
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this storage cannot share a store between processes",
        ))
    }
}

/// The parent directory of a relative path ("" for the root).
pub fn parent_dir(path: &str) -> &str {
    match path.rfind('/') {
        Some(index) => &path[..index],
        None => "",
    }
}
