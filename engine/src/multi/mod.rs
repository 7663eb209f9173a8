//! Many processes on one store (format-spec/08-many-processes.md).
//!
//! The pieces every writer process shares with the others on one host:
//! - [`SharedFile`]: the `SHARED` file, a memory map of 64-bit words plus byte-range locks
//!   that the kernel releases when the holding process dies (open-file-description locks on
//!   real files; [`crate::io::sim`] models them for the crash tests);
//! - [`lock`]: the fixed locks of F-08-3 (`OPEN`, `PRESENCE`, `WRITE`, `MANIFEST`,
//!   `MAINTENANCE`) as guards;
//! - [`lease`]: session leases (F-08-10), with the holder's pid for `SessionBusy`;
//! - [`tail`]: the shared tail index (F-08-5): where the published end of the log is, how far
//!   it is durable, generation counters for a cheap `refresh`, and the futex followers sleep
//!   on.

pub mod fs;
pub mod lease;
pub mod lock;
pub mod repair;
pub mod sim;
pub mod tail;

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

const _: () = assert!(SHARED_FILE_BYTES % 8 == 0);

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
