//! The tail log and the coordinator on NATS JetStream (server ≥ 2.11 for the cross-subject
//! fence header): streams `DSH_00..DSH_15` and KV buckets `DSH_NODES`, `DSH_SHARDS`,
//! `DSH_SESSIONS`, created on connect if absent (FLEET.md §5.2).
//!
//! Error mapping, which the node's safety rests on: a wrong-last-sequence answer (JetStream
//! `err_code 10071`) is [`BackendError::Fenced`] on a tail publish and
//! [`BackendError::RevisionMismatch`] on a KV write; a timeout, a broken connection or a
//! missing responder (a stream electing its leader) is [`BackendError::Unavailable`], an
//! outcome the caller cannot know, retried with the same `Nats-Msg-Id`.

use crate::backend::{Bucket, Coordinator, KvEntry, PublishAck, TailLog, TailMessage, TailPublish};
use crate::error::{BackendError, BackendResult};
use crate::shard::{stream_subjects, STREAM_COUNT};
use async_nats::jetstream::{self, consumer, kv, stream};
use async_nats::HeaderMap;
use futures::StreamExt;
use std::time::Duration;

/// The header naming the subject whose last sequence `Nats-Expected-Last-Subject-Sequence`
/// checks (nats-server ≥ 2.11); without it the server checks the published subject.
pub const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str =
    "Nats-Expected-Last-Subject-Sequence-Subject";
/// Deduplication window of the tail streams (FLEET.md: 2 min): a retry with the same msg id
/// inside it is acknowledged with the first copy's sequence.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(120);
/// Safety-only age limit of tail messages (sealing purges them long before): 30 days.
pub const TAIL_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest wait for one JetStream answer (publish ack, KV write, stream API call), and for
/// connecting.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Lease refreshes per lease TTL that a wait for one answer may take at most: a request
/// lost in a stream leader's election must not hold the node's lease loop (or an append's
/// publish) for a whole TTL, so its answer timeout is at most TTL / this (and at most
/// [`REQUEST_TIMEOUT`]).
pub const REQUESTS_PER_LEASE_TTL: u32 = 2;

/// The answer timeout for a fleet with lease TTL `node_ttl` (see [`REQUESTS_PER_LEASE_TTL`]).
pub fn request_timeout(node_ttl: Duration) -> Duration {
    REQUEST_TIMEOUT.min(node_ttl / REQUESTS_PER_LEASE_TTL)
}
/// Longest wait for the next message of a replay before it is declared unavailable.
pub const REPLAY_MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// Header naming the atomic batch a message belongs to (ADR-50, server ≥ 2.12).
pub const BATCH_ID_HEADER: &str = "Nats-Batch-Id";
/// Header numbering a message within its batch, from 1.
pub const BATCH_SEQUENCE_HEADER: &str = "Nats-Batch-Sequence";
/// Header marking the batch's last message, which commits it (value `1`).
pub const BATCH_COMMIT_HEADER: &str = "Nats-Batch-Commit";
/// Most messages nats-server accepts in one atomic batch.
pub const SERVER_MAX_BATCH_MESSAGES: usize = 1000;

/// Most keys [`Coordinator::keys`] lists from one bucket (it lists `DSH_NODES`: one key per
/// node of the fleet); more is refused rather than read without end.
pub const MAX_KV_KEYS: usize = 100_000;

/// Attempts at creating or opening the streams and buckets on connect.
pub const SETUP_ATTEMPTS: u32 = 5;
/// Pause between those attempts.
pub const SETUP_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How the JetStream side of a fleet is set up.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Comma-separated server URLs.
    pub urls: String,
    /// Replicas of every stream and bucket (3 in production and in the tests).
    pub replicas: usize,
    /// Lease TTL: age at which a `DSH_NODES` entry expires.
    pub node_ttl: Duration,
}

/// A connection to the JetStream cluster; cheap to clone.
#[derive(Clone)]
pub struct Nats {
    context: jetstream::Context,
    /// Distinguishes this connection's batch ids from other processes' (time of connect).
    batch_prefix: u64,
    next_batch: std::sync::Arc<std::sync::atomic::AtomicU64>,
    nodes: kv::Store,
    shards: kv::Store,
    sessions: kv::Store,
    /// Replays done by message gets because no consumer could be created.
    replays_by_get: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// A message got from the stream (a message get, not a consumer's delivery).
fn stored_message(message: &jetstream::message::StreamMessage) -> TailMessage {
    TailMessage {
        stream_seq: message.sequence,
        subject: message.subject.to_string(),
        payload: message.payload.to_vec(),
    }
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable {
        reason: format!("{what}: {error}"),
    }
}

fn other(what: &str, error: impl std::fmt::Display) -> BackendError {
    BackendError::Other {
        reason: format!("{what}: {error}"),
    }
}

fn tail_stream_config(index: u32, replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("DSH_{index:02}"),
        subjects: vec![stream_subjects(index)],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        // Hitting a limit must refuse writes, never drop unsealed tails.
        discard: stream::DiscardPolicy::New,
        max_age: TAIL_MAX_AGE,
        duplicate_window: DEDUP_WINDOW,
        deny_delete: true,
        // Group publishes (ADR-50 atomic batches): one fenced write per shard in flight
        // carries many sessions' batches.
        allow_atomic_publish: true,
        ..Default::default()
    }
}

fn bucket_config(bucket: Bucket, config: &NatsConfig) -> kv::Config {
    let (history, max_age) = match bucket {
        Bucket::Nodes => (1, config.node_ttl),
        Bucket::Shards => (8, Duration::ZERO),
        Bucket::Sessions => (4, Duration::ZERO),
    };
    kv::Config {
        bucket: bucket.name().to_string(),
        history,
        max_age,
        storage: stream::StorageType::File,
        num_replicas: config.replicas,
        ..Default::default()
    }
}

async fn open_bucket(
    context: &jetstream::Context,
    bucket: Bucket,
    config: &NatsConfig,
) -> BackendResult<kv::Store> {
    match context.get_key_value(bucket.name()).await {
        Ok(store) => Ok(store),
        Err(_) => context
            .create_key_value(bucket_config(bucket, config))
            .await
            .map_err(|error| unavailable(bucket.name(), error)),
    }
}

impl Nats {
    /// [`TailLog::replay`] one message get at a time (`STREAM.MSG.GET` with
    /// `next_by_subj`, answered by the stream leader), which needs no consumer: what
    /// `replay` falls back to when it cannot create one (JetStream's meta leader is being
    /// elected). The same messages, in the same order, up to the stream's last sequence
    /// when it is called.
    pub async fn replay_by_get(
        &self,
        stream: &str,
        subject: &str,
        from_stream_seq: u64,
    ) -> BackendResult<Vec<TailMessage>> {
        use jetstream::stream::RawMessageErrorKind;
        let handle = self.stream(stream).await?;
        let last = match handle.get_info().await {
            Ok(info) => info.state.last_sequence,
            Err(error) => return Err(unavailable("replay by get: stream info", error)),
        };
        let mut messages = Vec::new();
        let mut next = from_stream_seq.max(1);
        while next <= last {
            let got = handle
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(subject)
                .send()
                .await;
            let message = match got {
                Ok(message) => message,
                Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(error) => return Err(unavailable("replay by get", error)),
            };
            if message.sequence > last {
                break;
            }
            next = message.sequence + 1;
            messages.push(stored_message(&message));
        }
        Ok(messages)
    }

    /// Connects and creates the streams and buckets that do not exist yet.
    pub async fn connect(config: &NatsConfig) -> BackendResult<Nats> {
        let servers = config
            .urls
            .split(',')
            .map(|url| url.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| other("server list", error))?;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(REQUEST_TIMEOUT)
            .connect(servers)
            .await
            .map_err(|error| unavailable("connect", error))?;
        let mut context = jetstream::new(client);
        context.set_timeout(request_timeout(config.node_ttl));
        let mut attempt = 0;
        loop {
            match Nats::set_up(context.clone(), config).await {
                Ok(nats) => return Ok(nats),
                // Nodes starting together race to create the streams; the loser's request
                // can time out while the winner's stream forms. Try again, bounded.
                Err(error) if attempt + 1 < SETUP_ATTEMPTS => {
                    attempt += 1;
                    eprintln!("fleet: JetStream setup attempt {attempt}: {error}; retrying");
                    tokio::time::sleep(SETUP_RETRY_PAUSE).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn set_up(context: jetstream::Context, config: &NatsConfig) -> BackendResult<Nats> {
        for index in 0..STREAM_COUNT {
            // Create, or update a stream created before group publishes were allowed.
            context
                .create_or_update_stream(tail_stream_config(index, config.replicas))
                .await
                .map_err(|error| unavailable(&format!("stream DSH_{index:02}"), error))?;
        }
        let batch_prefix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()).rotate_left(40);
        Ok(Nats {
            batch_prefix,
            next_batch: std::sync::Arc::default(),
            replays_by_get: std::sync::Arc::default(),
            nodes: open_bucket(&context, Bucket::Nodes, config).await?,
            shards: open_bucket(&context, Bucket::Shards, config).await?,
            sessions: open_bucket(&context, Bucket::Sessions, config).await?,
            context,
        })
    }

    /// How many replays fell back to message gets ([`Nats::replay_by_get`]).
    pub fn replays_by_get(&self) -> u64 {
        self.replays_by_get
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The JetStream context (for tests that inspect streams).
    pub fn context(&self) -> &jetstream::Context {
        &self.context
    }

    fn store(&self, bucket: Bucket) -> &kv::Store {
        match bucket {
            Bucket::Nodes => &self.nodes,
            Bucket::Shards => &self.shards,
            Bucket::Sessions => &self.sessions,
        }
    }

    async fn stream(&self, name: &str) -> BackendResult<stream::Stream<()>> {
        self.context
            .get_stream_no_info(name)
            .await
            .map_err(|error| unavailable(name, error))
    }
}

fn publish_headers(message: &TailPublish) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, message.msg_id.as_str());
    if let Some(fence) = &message.fence {
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            fence.last_seq.to_string().as_str(),
        );
        headers.insert(
            EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
            fence.subject.as_str(),
        );
    }
    for (name, value) in &message.headers {
        headers.insert(name.as_str(), value.as_str());
    }
    headers
}

/// Whether a JetStream error text is a refused sequence check. The server answers a failed
/// expected-last-sequence check with `err_code 10071` ("wrong last sequence: N"), which the
/// client maps, or with 10164 ("wrong last sequence", seen here when two nodes race to
/// install an epoch marker), which it does not: both are definitive refusals, nothing stored.
fn refused_by_sequence_check(text: &str) -> bool {
    text.contains("wrong last sequence")
}

/// Maps a publish failure: fenced, unknown outcome, full, or other.
fn publish_error(
    subject: &str,
    expected: u64,
    error: jetstream::context::PublishError,
) -> BackendError {
    use jetstream::context::PublishErrorKind;
    match error.kind() {
        PublishErrorKind::WrongLastSequence => BackendError::Fenced {
            subject: subject.to_string(),
            expected,
        },
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::StreamNotFound
        | PublishErrorKind::MaxAckPending => unavailable("publish", error),
        _ => {
            let text = error.to_string();
            if refused_by_sequence_check(&text) {
                BackendError::Fenced {
                    subject: subject.to_string(),
                    expected,
                }
            } else if text.contains("maximum") {
                BackendError::Full { reason: text }
            } else if text.contains("leader") || text.contains("unavailable") {
                unavailable("publish", text)
            } else {
                other("publish", text)
            }
        }
    }
}

/// Maps a group publish failure: as [`publish_error`], plus a duplicate message id in the
/// group (`err_code 10201`), after which nothing of the group is stored.
fn batch_error(
    subject: &str,
    expected: u64,
    error: jetstream::context::PublishError,
) -> BackendError {
    let text = error.to_string();
    if text.contains("duplicate") {
        return BackendError::DuplicateInBatch { reason: text };
    }
    if text.contains("incomplete") || text.contains("batch") && text.contains("unknown") {
        // A staged message was lost on the way: nothing stored, send the group again.
        return unavailable("group publish", text);
    }
    publish_error(subject, expected, error)
}

impl TailLog for Nats {
    async fn publish(&self, message: TailPublish) -> BackendResult<PublishAck> {
        let headers = publish_headers(&message);
        let (fence_subject, expected) =
            message.fence.as_ref().map_or((String::new(), 0), |fence| {
                (fence.subject.clone(), fence.last_seq)
            });
        let pending = self
            .context
            .publish_with_headers(message.subject, headers, message.payload)
            .await
            .map_err(|error| publish_error(&fence_subject, expected, error))?;
        let ack = pending
            .await
            .map_err(|error| publish_error(&fence_subject, expected, error))?;
        Ok(PublishAck {
            stream_seq: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    async fn publish_batch(&self, messages: Vec<TailPublish>) -> BackendResult<Vec<PublishAck>> {
        let count = messages.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        if count > SERVER_MAX_BATCH_MESSAGES {
            return Err(other(
                "group publish",
                format!("{count} messages (limit {SERVER_MAX_BATCH_MESSAGES})"),
            ));
        }
        let (fence_subject, expected) = messages
            .iter()
            .find_map(|message| message.fence.as_ref())
            .map_or((String::new(), 0), |fence| {
                (fence.subject.clone(), fence.last_seq)
            });
        let batch_id = format!(
            "{:016x}-{:x}",
            self.batch_prefix,
            self.next_batch
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let client = self.context.client();
        let mut commit = None;
        for (index, message) in messages.into_iter().enumerate() {
            let mut headers = publish_headers(&message);
            headers.insert(BATCH_ID_HEADER, batch_id.as_str());
            headers.insert(BATCH_SEQUENCE_HEADER, (index + 1).to_string().as_str());
            if index + 1 == count {
                headers.insert(BATCH_COMMIT_HEADER, "1");
                commit = Some((message.subject, headers, message.payload));
            } else {
                // Staged by the server without an answer; the commit's answer covers them
                // (a lost one makes the batch incomplete, refused as a whole).
                client
                    .publish_with_headers(message.subject, headers, message.payload)
                    .await
                    .map_err(|error| unavailable("group publish", error))?;
            }
        }
        let Some((subject, headers, payload)) = commit else {
            return Ok(Vec::new());
        };
        let pending = self
            .context
            .publish_with_headers(subject, headers, payload)
            .await
            .map_err(|error| batch_error(&fence_subject, expected, error))?;
        let ack = pending
            .await
            .map_err(|error| batch_error(&fence_subject, expected, error))?;
        // The ack names the last message; the batch holds the ones just before it.
        let first = ack
            .sequence
            .checked_sub(count as u64 - 1)
            .ok_or_else(|| other("group publish", format!("ack at {}", ack.sequence)))?;
        Ok((0..count as u64)
            .map(|offset| PublishAck {
                stream_seq: first + offset,
                duplicate: false,
            })
            .collect())
    }

    async fn last_on_subject(
        &self,
        stream: &str,
        subject: &str,
    ) -> BackendResult<Option<TailMessage>> {
        use jetstream::stream::LastRawMessageErrorKind;
        let handle = self.stream(stream).await?;
        match handle.get_last_raw_message_by_subject(subject).await {
            Ok(message) => Ok(Some(stored_message(&message))),
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(unavailable("last message by subject", error)),
        }
    }

    async fn message_at(
        &self,
        stream: &str,
        stream_seq: u64,
    ) -> BackendResult<Option<TailMessage>> {
        use jetstream::stream::RawMessageErrorKind;
        let handle = self.stream(stream).await?;
        match handle.get_raw_message(stream_seq).await {
            Ok(message) => Ok(Some(stored_message(&message))),
            Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(error) => Err(unavailable("message by sequence", error)),
        }
    }

    async fn last_seq(&self, stream: &str) -> BackendResult<u64> {
        let handle = self
            .context
            .get_stream(stream)
            .await
            .map_err(|error| unavailable(stream, error))?;
        Ok(handle.cached_info().state.last_sequence)
    }

    async fn replay(
        &self,
        stream: &str,
        subject: &str,
        from_stream_seq: u64,
    ) -> BackendResult<Vec<TailMessage>> {
        let handle = self.stream(stream).await?;
        let created = handle
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.to_string(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from_stream_seq.max(1),
                },
                ..Default::default()
            })
            .await;
        let consumer = match created {
            Ok(consumer) => consumer,
            // A consumer needs the JetStream meta leader, which a `kill -9` of its server
            // leaves unelected for 10 s and more (F2); the stream leader alone answers
            // message gets, one message at a time.
            Err(_) => {
                self.replays_by_get
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return self.replay_by_get(stream, subject, from_stream_seq).await;
            }
        };
        // What the stream holds at the time of the call; later messages are not asked for.
        let mut pending = consumer.cached_info().num_pending;
        let mut messages = Vec::new();
        if pending == 0 {
            return Ok(messages);
        }
        let mut delivered = consumer
            .messages()
            .await
            .map_err(|error| unavailable("replay", error))?;
        while pending > 0 {
            // A message the stream counts but does not deliver (a replica that drops a
            // corrupted message serves the consumer) ends here: name where.
            let after = messages
                .last()
                .map_or(from_stream_seq.max(1) - 1, |message: &TailMessage| {
                    message.stream_seq
                });
            let next = tokio::time::timeout(REPLAY_MESSAGE_TIMEOUT, delivered.next())
                .await
                .map_err(|_| {
                    unavailable(
                        "replay",
                        format!(
                            "{subject}: no message in time after stream seq {after} \
                             ({pending} pending)"
                        ),
                    )
                })?
                .ok_or_else(|| unavailable("replay", "the consumer ended"))?
                .map_err(|error| unavailable("replay", error))?;
            let info = next.info().map_err(|error| other("replay", error))?;
            messages.push(TailMessage {
                stream_seq: info.stream_sequence,
                subject: next.subject.to_string(),
                payload: next.payload.to_vec(),
            });
            pending = info.pending;
        }
        Ok(messages)
    }

    async fn purge(
        &self,
        stream: &str,
        subject: &str,
        before_stream_seq: u64,
    ) -> BackendResult<u64> {
        let handle = self.stream(stream).await?;
        let response = handle
            .purge()
            .filter(subject)
            .sequence(before_stream_seq)
            .await
            .map_err(|error| unavailable("purge", error))?;
        Ok(response.purged)
    }
}

fn kv_error(key: &str, error: impl std::error::Error) -> BackendError {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if refused_by_sequence_check(&text) {
        return BackendError::RevisionMismatch {
            key: key.to_string(),
        };
    }
    unavailable(&format!("kv {key}"), text)
}

impl Coordinator for Nats {
    async fn get(&self, bucket: Bucket, key: &str) -> BackendResult<Option<KvEntry>> {
        let entry = self
            .store(bucket)
            .entry(key)
            .await
            .map_err(|error| kv_error(key, error))?;
        Ok(entry
            .filter(|entry| entry.operation == kv::Operation::Put)
            .map(|entry| KvEntry {
                value: entry.value.to_vec(),
                revision: entry.revision,
            }))
    }

    async fn create(&self, bucket: Bucket, key: &str, value: Vec<u8>) -> BackendResult<u64> {
        match self.store(bucket).create(key, value.into()).await {
            Ok(revision) => Ok(revision),
            Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
                Err(BackendError::RevisionMismatch {
                    key: key.to_string(),
                })
            }
            Err(error) => Err(kv_error(key, error)),
        }
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Vec<u8>,
        revision: u64,
    ) -> BackendResult<u64> {
        match self.store(bucket).update(key, value.into(), revision).await {
            Ok(revision) => Ok(revision),
            Err(error) if error.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(BackendError::RevisionMismatch {
                    key: key.to_string(),
                })
            }
            Err(error) => Err(kv_error(key, error)),
        }
    }

    /// The bucket's keys from the stream leader's subject list (`STREAM.INFO` with a
    /// subjects filter), not from async-nats's `keys()`: that one creates an ordered
    /// consumer, which needs the JetStream meta leader. F2 measured the meta leader's
    /// election after a `kill -9` at up to 10 s or more, longer than the bucket's own
    /// election, and every node's tick (live nodes, then takeovers) waited on it. A key
    /// whose last message is a delete marker is listed too; `get` skips it.
    async fn keys(&self, bucket: Bucket) -> BackendResult<Vec<String>> {
        let prefix = format!("$KV.{}.", bucket.name());
        let mut subjects = self
            .store(bucket)
            .stream
            .info_with_subjects(format!("{prefix}>"))
            .await
            .map_err(|error| kv_error(bucket.name(), error))?;
        let mut names = Vec::new();
        while let Some(item) = subjects.next().await {
            let (subject, _count) = item.map_err(|error| kv_error(bucket.name(), error))?;
            if names.len() >= MAX_KV_KEYS {
                return Err(other(
                    bucket.name(),
                    format!("more than {MAX_KV_KEYS} keys listed"),
                ));
            }
            if let Some(key) = subject.strip_prefix(&prefix) {
                names.push(key.to_string());
            }
        }
        names.sort();
        Ok(names)
    }
}
