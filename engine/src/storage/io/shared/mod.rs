//! The `SHARED` file of many processes on one store (format-spec/08-many-processes.md,
//! F-08-3, F-08-5): 64-bit words in a shared memory map, byte-range locks that the kernel
//! releases when the holding process dies, and a futex word followers sleep on. This is the
//! I/O primitive only; what the words and locks mean is `storage::multi`'s.
//!
//! - [`fs`]: a real file (`MAP_SHARED`, `F_OFD_SETLK`, `FUTEX_WAIT`);
//! - [`sim`]: the simulated twin on [`super::sim::SimStorage`], for the crash tests.

pub mod fs;
#[cfg(any(test, feature = "testing"))]
pub mod sim;

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// The shared file's name inside the store (F-08-1).
pub const SHARED_FILE: &str = "SHARED";

/// Bytes of the shared file's fixed header (F-08-5).
pub const SHARED_HEADER_BYTES: u64 = 4096;
/// Lease records in the shared file (F-08-10).
pub const LEASE_RECORDS: u64 = 65_536;
/// Bytes of one lease record: the session hash and the holder's pid.
pub const LEASE_RECORD_BYTES: u64 = 16;
/// Bytes of the whole shared file: the header and the lease records (1 MiB + 4 KiB).
pub const SHARED_FILE_BYTES: u64 = SHARED_HEADER_BYTES + LEASE_RECORDS * LEASE_RECORD_BYTES;
/// 64-bit words in the shared file.
pub const SHARED_WORDS: usize = (SHARED_FILE_BYTES / 8) as usize;

const _: () = assert!(SHARED_FILE_BYTES.is_multiple_of(8));

/// How a byte-range lock is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Any number of holders (`F_RDLCK`).
    Shared,
    /// One holder (`F_WRLCK`).
    Exclusive,
}

/// The `SHARED` file as one process sees it: shared 64-bit words and byte-range locks owned
/// by this handle. Each handle is one lock owner, as an open file description is, so two
/// handles in one process exclude each other like two processes (what the tests use).
/// Dropping the handle releases every lock it holds, as a process's death does.
pub trait SharedFile: Send + Sync {
    /// Word `index` (`< SHARED_WORDS`), stored little-endian (F-08-5).
    fn word(&self, index: usize) -> &AtomicU64;
    /// The futex word (`notify`, F-08-11): the low half of the word at byte 96.
    fn notify_word(&self) -> &AtomicU32;
    /// Sleeps until the notify word differs from `seen`, a wake-up, or `timeout`.
    fn wait_notify(&self, seen: u32, timeout: Duration);
    /// Wakes every sleeper of [`SharedFile::wait_notify`], in every process.
    fn wake_all(&self);
    /// Locks the byte at `offset`; returns `false` when `wait` is off and another owner
    /// holds a conflicting lock. Re-locking a byte this owner holds converts the mode.
    fn lock(&self, offset: u64, mode: LockMode, wait: bool) -> io::Result<bool>;
    /// Releases this owner's lock on the byte at `offset` (no error when none is held).
    fn unlock(&self, offset: u64) -> io::Result<()>;
}

/// Reads word `index` of `file` (little-endian on disk, F-08-5).
pub fn load(file: &dyn SharedFile, index: usize) -> u64 {
    u64::from_le(file.word(index).load(std::sync::atomic::Ordering::Acquire))
}

/// Writes word `index` of `file`.
pub fn store(file: &dyn SharedFile, index: usize, value: u64) {
    file.word(index)
        .store(value.to_le(), std::sync::atomic::Ordering::Release);
}
