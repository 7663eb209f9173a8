//! Typed errors of fleet mode.

use thiserror::Error;

/// What a tail-log, coordinator or cold-store call can fail with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// The fence did not match: another node published a newer epoch marker (JetStream
    /// `err_code 10071`, wrong last sequence).
    #[error("fenced: expected last sequence {expected} on {subject}")]
    Fenced { subject: String, expected: u64 },
    /// A KV compare-and-set lost: the key is not at the revision named (or exists, on create).
    #[error("revision mismatch on {key}")]
    RevisionMismatch { key: String },
    /// The call got no definitive answer (timeout, connection lost, no leader). The write may
    /// or may not have happened.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String },
    /// The stream refused the write because a limit is reached (`discard: new`).
    #[error("stream full: {reason}")]
    Full { reason: String },
    /// An atomic group publish carried a message id already stored: nothing of the group
    /// was stored (JetStream `err_code 10201`).
    #[error("group publish holds a duplicate message id: {reason}")]
    DuplicateInBatch { reason: String },
    /// Anything else the server said.
    #[error("backend: {reason}")]
    Other { reason: String },
}

/// What the fleet node's operations fail with.
#[derive(Debug, Error)]
pub enum FleetError {
    /// This node does not own the session's shard: ask `owner`.
    #[error("moved: shard {shard} is owned by {owner:?} (epoch {epoch})")]
    Moved {
        shard: u32,
        owner: Option<String>,
        epoch: u64,
    },
    #[error("unknown session {session}")]
    UnknownSession { session: String },
    #[error("session {session} exists")]
    DuplicateSession { session: String },
    /// The outcome of a write is unknown (a publish never got a definitive answer): not
    /// acknowledged; the session is rebuilt from the replicated sources on next access.
    #[error("not acknowledged: {reason}")]
    NotAcknowledged { reason: String },
    /// Replicated or cold data failed a check (CRC, blake3, seq continuity).
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: &'static str, reason: String },
    /// A session's rebuilt history is damaged or has a gap: refused, never served.
    #[error("session {session}: cannot rebuild seqs {from}..: {reason}")]
    Rebuild {
        session: String,
        from: u64,
        reason: String,
    },
    #[error("invalid input: {reason}")]
    InvalidInput { reason: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Engine(#[from] dshdb::Error),
    /// The engine could not export the local copy as DSH JSONL.
    #[error("export: {0}")]
    Export(#[from] dshdb::exchange::ExchangeError),
}

pub type FleetResult<T> = Result<T, FleetError>;
pub type BackendResult<T> = Result<T, BackendError>;
