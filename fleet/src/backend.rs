//! The three services fleet mode runs on (FLEET.md §5.9), as traits: the NATS JetStream and
//! S3 implementations back them in production, the deterministic fakes of [`crate::fake`]
//! back the model tests.

use crate::error::BackendResult;
use std::future::Future;

/// A write fence: the last stream sequence `subject` must have for the write to be accepted
/// (`Nats-Expected-Last-Subject-Sequence` with `Nats-Expected-Last-Subject-Sequence-Subject`).
/// `last_seq == 0` means "no message on `subject` yet".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub subject: String,
    pub last_seq: u64,
}

/// One message to append to the tail log.
#[derive(Debug, Clone, Default)]
pub struct TailPublish {
    pub subject: String,
    pub payload: bytes::Bytes,
    /// Deduplication id (`Nats-Msg-Id`): a retry with the same id within the window is
    /// acknowledged with the first copy's sequence and not stored twice.
    pub msg_id: String,
    pub fence: Option<Fence>,
    /// Informational headers (`Dsh-Epoch`, `Dsh-First-Seq`, `Dsh-Last-Seq`).
    pub headers: Vec<(String, String)>,
}

/// A definitive acknowledgement: the message is stored (replicated, synced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishAck {
    pub stream_seq: u64,
    /// The message id was seen within the window; nothing new was stored.
    pub duplicate: bool,
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailMessage {
    pub stream_seq: u64,
    pub subject: String,
    pub payload: Vec<u8>,
}

/// The replicated commit tail: streams `DSH_00..DSH_15`.
pub trait TailLog: Send + Sync + 'static {
    /// Appends a message, honouring the fence and the dedup window.
    fn publish(
        &self,
        message: TailPublish,
    ) -> impl Future<Output = BackendResult<PublishAck>> + Send;

    /// Appends several messages of one stream as one atomic group: all are stored, in
    /// order, at consecutive stream sequences, or none is (JetStream atomic batch publish,
    /// server ≥ 2.12). Every fence is checked against the stream as it was before the group.
    /// A message id already stored (within the window) refuses the whole group with
    /// [`crate::error::BackendError::DuplicateInBatch`]; the caller then sends the messages
    /// one by one, where each duplicate is acknowledged with its stored sequence.
    fn publish_batch(
        &self,
        messages: Vec<TailPublish>,
    ) -> impl Future<Output = BackendResult<Vec<PublishAck>>> + Send;

    /// The last message stored on `subject` of `stream`, if any.
    fn last_on_subject(
        &self,
        stream: &str,
        subject: &str,
    ) -> impl Future<Output = BackendResult<Option<TailMessage>>> + Send;

    /// The message stored at `stream_seq` of `stream`, if any (read from the stream's
    /// leader): checks what a deduplicated publish was deduplicated against.
    fn message_at(
        &self,
        stream: &str,
        stream_seq: u64,
    ) -> impl Future<Output = BackendResult<Option<TailMessage>>> + Send;

    /// The messages on `subject` with stream sequence ≥ `from_stream_seq`, in order, up to
    /// the stream's last sequence at the time of the call.
    fn replay(
        &self,
        stream: &str,
        subject: &str,
        from_stream_seq: u64,
    ) -> impl Future<Output = BackendResult<Vec<TailMessage>>> + Send;

    /// The last stream sequence of `stream` (0 while it never stored a message; purges
    /// do not lower it).
    fn last_seq(&self, stream: &str) -> impl Future<Output = BackendResult<u64>> + Send;

    /// Removes the messages on `subject` below `before_stream_seq`; returns how many.
    fn purge(
        &self,
        stream: &str,
        subject: &str,
        before_stream_seq: u64,
    ) -> impl Future<Output = BackendResult<u64>> + Send;
}

/// The KV buckets of the coordination state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bucket {
    /// `DSH_NODES`: live nodes; entries expire (the lease TTL).
    Nodes,
    /// `DSH_SHARDS`: shard ownership.
    Shards,
    /// `DSH_SESSIONS`: session manifests.
    Sessions,
}

impl Bucket {
    pub const ALL: [Bucket; 3] = [Bucket::Nodes, Bucket::Shards, Bucket::Sessions];

    pub fn name(self) -> &'static str {
        match self {
            Bucket::Nodes => "DSH_NODES",
            Bucket::Shards => "DSH_SHARDS",
            Bucket::Sessions => "DSH_SESSIONS",
        }
    }
}

/// A KV value and the revision it was written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    pub value: Vec<u8>,
    pub revision: u64,
}

/// Coordination state: KV with revision compare-and-set; `DSH_NODES` entries expire.
pub trait Coordinator: Send + Sync + 'static {
    fn get(
        &self,
        bucket: Bucket,
        key: &str,
    ) -> impl Future<Output = BackendResult<Option<KvEntry>>> + Send;

    /// Writes `key` only if it does not exist (or has expired); returns the new revision.
    /// `RevisionMismatch` if it exists.
    fn create(
        &self,
        bucket: Bucket,
        key: &str,
        value: Vec<u8>,
    ) -> impl Future<Output = BackendResult<u64>> + Send;

    /// Writes `key` only if its current revision is `revision`; returns the new revision.
    fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Vec<u8>,
        revision: u64,
    ) -> impl Future<Output = BackendResult<u64>> + Send;

    /// The keys present (not expired), in no particular order.
    fn keys(&self, bucket: Bucket) -> impl Future<Output = BackendResult<Vec<String>>> + Send;
}

/// Object storage for sealed runs and manifest copies. Never relies on conditional writes:
/// keys are immutable by construction (they name the seq range and the epoch).
pub trait ColdStore: Send + Sync + 'static {
    /// Stores `bytes` under `key`. A key already holding the same bytes is success; holding
    /// other bytes is an error (an immutable key is never overwritten).
    fn put_immutable(
        &self,
        key: &str,
        bytes: Vec<u8>,
    ) -> impl Future<Output = BackendResult<()>> + Send;

    fn get(&self, key: &str) -> impl Future<Output = BackendResult<Option<Vec<u8>>>> + Send;

    /// The object's size, if it exists.
    fn head(&self, key: &str) -> impl Future<Output = BackendResult<Option<u64>>> + Send;

    /// Keys under `prefix`, sorted.
    fn list(&self, prefix: &str) -> impl Future<Output = BackendResult<Vec<String>>> + Send;
}

/// Milliseconds since some fixed origin; virtual in the model tests.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}
