//! Typed engine errors. Every failure a caller can act on has its own kind.
//!
//! Sits above `session` (a stored event that breaks the DSH model keeps its
//! [`SessionError`]) and below everything else; it imports nothing but `session`. The codes of
//! a refused compaction live here, not in `compaction`, so no layer below reaches up.

use crate::session::SessionError;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Result alias used across the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine, by cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O failure that is not one of the kinds below.
    #[error("I/O error during {operation}: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    /// The disk (or the simulated disk) is full. Nothing was written.
    #[error("disk full during {operation}; nothing was written")]
    DiskFull {
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    /// The store's file system is mounted read-only (`EROFS`): a writable open cannot take
    /// its lock or write. Nothing was written; a read-only open still reads the store.
    #[error(
        "the store's file system is read-only (during {operation}: {source}); nothing was \
         written; open the store read-only to read it"
    )]
    ReadOnlyFileSystem {
        operation: &'static str,
        #[source]
        source: io::Error,
    },
    /// A checksum or structure check failed before the durable point: data is damaged.
    #[error("corruption in segment {segment} at offset {offset}: {reason}")]
    Corrupt {
        segment: u64,
        offset: u64,
        reason: String,
    },
    /// A checksum or structure check of a run file failed: data is damaged.
    #[error("corruption in run {run} at offset {offset}: {reason}")]
    CorruptRun {
        run: u64,
        offset: u64,
        reason: String,
    },
    /// A metadata file (manifest, segment header) is damaged or inconsistent.
    #[error("corrupt {file}: {reason}")]
    CorruptFile { file: String, reason: String },
    /// The store was written by a format version this build cannot read.
    #[error("{file} has format version {found}; this build reads version {supported}")]
    UnsupportedVersion {
        file: String,
        found: u32,
        supported: u32,
    },
    /// A record kind this build does not know and that the spec does not allow skipping.
    #[error("segment {segment} offset {offset}: unknown required record kind {kind}")]
    UnknownRecordKind { segment: u64, offset: u64, kind: u8 },
    /// Another process holds the store's writer lock.
    #[error("store {path} is locked by another writer process")]
    Locked { path: PathBuf },
    /// The directory holds no dshdb store.
    #[error("no dshdb store at {path}")]
    NotAStore { path: PathBuf },
    /// A store already exists where a new one was requested.
    #[error("a dshdb store already exists at {path}")]
    AlreadyExists { path: PathBuf },
    /// A write or sync of the log failed; the store refuses further writes. Every appender
    /// waiting then, and every later call, gets the same `source` (shared: `io::Error` is not
    /// `Clone`), so a full disk says so to all of them ([`Error::io_kind`]).
    #[error(
        "store refuses writes after a failed {operation}: {}; reopen it to recover",
        describe_io_failure(.source)
    )]
    Poisoned {
        operation: &'static str,
        #[source]
        source: Arc<io::Error>,
    },
    /// A background thread of the store (the committer, the maintenance thread) could not be
    /// started; the store was not opened.
    #[error("cannot start the {thread} thread: {source}")]
    ThreadStart {
        thread: &'static str,
        #[source]
        source: io::Error,
    },
    /// A pass of the background maintenance thread failed earlier; returned once, by the next
    /// `maintain`, `flush` or `close` (whose own work succeeded), so that no failure goes
    /// unseen. `Store::stats` counts these failures and shows the last.
    #[error("background maintenance failed: {source}")]
    Maintenance {
        #[source]
        source: Arc<Error>,
    },
    /// The store (or the handle) was closed.
    #[error("store is closed")]
    Closed,
    /// The store was opened read-only.
    #[error("store is open read-only")]
    ReadOnly,
    /// No session with that id.
    #[error("unknown session {id:?}")]
    UnknownSession { id: String },
    /// A session with that id already exists.
    #[error("session {id:?} already exists")]
    DuplicateSession { id: String },
    /// Another writer holds the session: a handle in this process (`pid` is this process),
    /// or another process's lease (F-08-10), whose pid is named when the lease record
    /// knows it (`None`: unknown).
    #[error("session {id:?} is being written by {}", busy_holder(*pid))]
    SessionBusy { id: String, pid: Option<u32> },
    /// The caller's input is malformed; nothing was written.
    #[error("invalid input: {reason}")]
    InvalidInput { reason: String },
    /// A record, batch or field exceeds a limit (or a value does not fit its field on
    /// disk); nothing was written. `unit` is what `size` and `limit` count (`bytes`,
    /// `events`, `segments`, ...).
    #[error("{what} is {size} {unit}; the limit is {limit} {unit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
        unit: &'static str,
    },
    /// A seq outside the session's log.
    #[error("session {id:?} has no event at seq {seq} (length {length})")]
    SeqOutOfRange { id: String, seq: u64, length: u64 },
    /// A stored event breaks the DSH session model (text is DSH's); found above the log
    /// (projections, compaction).
    #[error("session {id:?}: {source}")]
    SessionModel {
        id: String,
        #[source]
        source: SessionError,
    },
    /// A fork was refused by DSH's fork rule (`SessionForkError`): the text is DSH's and
    /// [`SessionError::fork_error_code`] gives its code.
    #[error(transparent)]
    Fork { source: SessionError },
    /// A projection unit cannot fold an event or decode its state.
    #[error("projection {unit}: {reason}")]
    Projection { unit: String, reason: String },
    /// A spill blob is missing or damaged.
    #[error("spill blob {hash}: {reason}")]
    Spill { hash: String, reason: String },
    /// A compaction or prune was refused; `code` is DSH's manual-compaction code.
    #[error("{message}")]
    Compaction {
        code: CompactionErrorCode,
        message: String,
    },
}

impl Error {
    /// Opening a file the manifest names failed: a missing one is damage
    /// ([`Error::CorruptFile`]), any other failure an I/O error of `operation`.
    pub fn opening_named_file(operation: &'static str, path: &str, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::CorruptFile {
                file: path.to_string(),
                reason: "named by the manifest but missing".to_string(),
            }
        } else {
            Error::io(operation, source)
        }
    }

    /// Wraps an I/O error, turning "no space" into [`Error::DiskFull`].
    pub fn io(operation: &'static str, source: io::Error) -> Self {
        if is_disk_full(&source) {
            Error::DiskFull { operation, source }
        } else if source.raw_os_error() == Some(libc::EROFS) {
            Error::ReadOnlyFileSystem { operation, source }
        } else {
            Error::Io { operation, source }
        }
    }

    /// The kind of the operating-system failure behind this error, if one is behind it:
    /// `StorageFull` for a full disk, whether the failing call returned it directly or it
    /// poisoned the store earlier, or stopped the background maintenance.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::DiskFull { .. } => Some(io::ErrorKind::StorageFull),
            Error::Io { source, .. }
            | Error::ReadOnlyFileSystem { source, .. }
            | Error::ThreadStart { source, .. } => Some(source.kind()),
            Error::Poisoned { source, .. } if is_disk_full(source) => {
                Some(io::ErrorKind::StorageFull)
            }
            Error::Poisoned { source, .. } => Some(source.kind()),
            Error::Maintenance { source } => source.io_kind(),
            _ => None,
        }
    }

    /// The operation and operating-system error of an I/O failure ([`Error::Io`],
    /// [`Error::DiskFull`]); any other error back unchanged.
    pub(crate) fn into_io(self) -> std::result::Result<(&'static str, io::Error), Error> {
        match self {
            Error::Io { operation, source }
            | Error::DiskFull { operation, source }
            | Error::ReadOnlyFileSystem { operation, source } => Ok((operation, source)),
            other => Err(other),
        }
    }

    /// Whether the error means damaged or unreadable stored data (as opposed to bad input, a
    /// missing store, a lock or an I/O failure).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. }
                | Error::CorruptRun { .. }
                | Error::CorruptFile { .. }
                | Error::UnknownRecordKind { .. }
                | Error::UnsupportedVersion { .. }
                | Error::Spill { .. }
        )
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            reason: reason.into(),
        }
    }
}

/// Whether an operating-system error means "no space left on the device".
fn is_disk_full(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOSPC) || error.kind() == io::ErrorKind::StorageFull
}

/// The cause of a poisoned store as its message says it: a full disk in plain words.
fn describe_io_failure(error: &io::Error) -> String {
    if is_disk_full(error) {
        format!("the disk is full ({error})")
    } else {
        error.to_string()
    }
}

/// DSH's manual-compaction error codes (model §5.2), plus `Region` for a refused region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompactionErrorCode {
    /// A compaction is in progress, or (manual) a turn is open.
    Busy,
    /// The region is not a balanced span of the current surface.
    Region,
    /// The summary is unusable (not text, or not smaller than what it replaces).
    Summary,
    /// The surface changed under the compaction.
    Changed,
}

/// Who holds a busy session, for [`Error::SessionBusy`]'s message.
fn busy_holder(pid: Option<u32>) -> String {
    match pid {
        Some(pid) if pid == std::process::id() => {
            "another writer handle in this process".to_string()
        }
        Some(pid) => format!("process {pid}"),
        None => "another process".to_string(),
    }
}
