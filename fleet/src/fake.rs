//! Deterministic in-memory fakes of the tail log, the coordinator and the cold store, with the
//! semantics fleet mode relies on from NATS JetStream and S3:
//!
//! - tail: per-stream sequences; `Nats-Msg-Id` deduplication within a window, checked
//!   *before* the fence as nats-server does (a retry of a stored message is acknowledged as a
//!   duplicate even after the fence moved); expected-last-subject-sequence fences on another
//!   subject; `discard: new` limits; purge by subject below a sequence; a fenced publish is
//!   refused as fenced while another publish fenced on the same subject is in flight (as
//!   nats-server 2.15.1 does; a publish is in flight across one yield to the runtime);
//! - KV: per-bucket revisions, create-if-absent, update-if-revision, TTL on a virtual clock
//!   (an expired entry is absent, and a CAS on it fails);
//! - cold store: immutable puts.
//!
//! Each node gets its own handle ([`FakeTail::client`] and so on) with a [`Link`]: up, down
//! (calls fail as unavailable, nothing happens) or losing replies (the call takes effect,
//! then fails as unavailable: the outcome the caller cannot tell from a lost request).

use crate::backend::{
    Bucket, Clock, ColdStore, Coordinator, Fence, KvEntry, PublishAck, TailLog, TailMessage,
    TailPublish,
};
use crate::error::{BackendError, BackendResult};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Default dedup window of the fake tail, in virtual milliseconds (FLEET.md: 2 min).
pub const FAKE_DEDUP_WINDOW_MS: u64 = 120_000;

/// A clock the test advances by hand.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
}

impl VirtualClock {
    pub fn new(start_ms: u64) -> Arc<VirtualClock> {
        Arc::new(VirtualClock {
            now: AtomicU64::new(start_ms),
        })
    }

    pub fn advance(&self, milliseconds: u64) {
        self.now.fetch_add(milliseconds, Ordering::SeqCst);
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// How often a publish over a hanging link looks whether it changed.
const HANG_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// The state of one node's connection to a fake service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Up,
    /// Partitioned: every call fails as unavailable and has no effect.
    Down,
    /// Replies are lost: every call takes effect, then fails as unavailable.
    LoseReplies,
    /// Publishes never answer while it lasts (a server gone without closing the
    /// connection); once the link changes they go on under the new state.
    Hang,
}

/// A handle to set a node's [`Link`].
#[derive(Debug, Clone)]
pub struct LinkControl(Arc<Mutex<Link>>);

impl Default for LinkControl {
    fn default() -> Self {
        LinkControl(Arc::new(Mutex::new(Link::Up)))
    }
}

impl LinkControl {
    pub fn set(&self, link: Link) {
        *self.0.lock() = link;
    }

    pub fn get(&self) -> Link {
        *self.0.lock()
    }

    /// Fails before the call when the link is down.
    fn before(&self) -> BackendResult<()> {
        match self.get() {
            Link::Down => Err(unavailable("partitioned")),
            Link::Up | Link::LoseReplies | Link::Hang => Ok(()),
        }
    }

    /// Waits while the link hangs (publishes only).
    async fn hold(&self) {
        while self.get() == Link::Hang {
            tokio::time::sleep(HANG_POLL).await;
        }
    }

    /// Turns a result into a lost reply when replies are lost.
    fn after<T>(&self, result: BackendResult<T>) -> BackendResult<T> {
        match self.get() {
            Link::LoseReplies => Err(unavailable("reply lost")),
            Link::Up | Link::Down | Link::Hang => result,
        }
    }
}

fn unavailable(reason: &str) -> BackendError {
    BackendError::Unavailable {
        reason: reason.to_string(),
    }
}

#[derive(Debug, Default)]
struct FakeStream {
    last_seq: u64,
    messages: BTreeMap<u64, TailMessage>,
    last_by_subject: HashMap<String, u64>,
    /// msg id → (stream seq, stored at ms).
    dedup: HashMap<String, (u64, u64)>,
}

impl FakeStream {
    /// Stores `message` at the next stream seq (checks done by the caller), remembering its
    /// msg id for the dedup window from `now` (ms); returns the seq.
    fn append(&mut self, message: TailPublish, now: u64) -> u64 {
        self.last_seq += 1;
        let stream_seq = self.last_seq;
        self.last_by_subject
            .insert(message.subject.clone(), stream_seq);
        self.dedup.insert(message.msg_id, (stream_seq, now));
        self.messages.insert(
            stream_seq,
            TailMessage {
                stream_seq,
                subject: message.subject,
                payload: message.payload.to_vec(),
            },
        );
        stream_seq
    }
}

#[derive(Debug, Default)]
struct TailState {
    streams: BTreeMap<String, FakeStream>,
    /// `discard: new` limit of messages per stream.
    max_messages: Option<usize>,
    /// Fenced publishes refused (for the tests' counts).
    fenced: u64,
}

/// The fake tail log shared by all nodes of a test.
#[derive(Clone)]
pub struct FakeTail {
    state: Arc<Mutex<TailState>>,
    clock: Arc<VirtualClock>,
    dedup_window_ms: u64,
    /// Fence subjects with a fenced publish in flight.
    in_flight: Arc<Mutex<HashSet<String>>>,
}

/// Marks a fence subject as having a publish in flight until dropped.
struct InFlight {
    subjects: Arc<Mutex<HashSet<String>>>,
    subject: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.subjects.lock().remove(&self.subject);
    }
}

/// One node's handle to the fake tail log.
#[derive(Clone)]
pub struct FakeTailClient {
    tail: FakeTail,
    link: LinkControl,
}

/// The stream a subject `dsh.<k>.…` belongs to.
fn stream_of(subject: &str) -> BackendResult<String> {
    let index = subject
        .strip_prefix("dsh.")
        .and_then(|rest| rest.split('.').next())
        .ok_or_else(|| BackendError::Other {
            reason: format!("no stream holds subject {subject}"),
        })?;
    Ok(format!("DSH_{index}"))
}

impl FakeTail {
    pub fn new(clock: Arc<VirtualClock>) -> FakeTail {
        FakeTail {
            state: Arc::default(),
            clock,
            dedup_window_ms: FAKE_DEDUP_WINDOW_MS,
            in_flight: Arc::default(),
        }
    }

    /// A handle for one node, with its own link.
    pub fn client(&self, link: LinkControl) -> FakeTailClient {
        FakeTailClient {
            tail: self.clone(),
            link,
        }
    }

    /// Sets the `discard: new` message limit per stream.
    pub fn set_max_messages(&self, limit: Option<usize>) {
        self.state.lock().max_messages = limit;
    }

    /// Every stored message on `subject`, in order (for checks).
    pub fn messages_on(&self, subject: &str) -> Vec<TailMessage> {
        let state = self.state.lock();
        let Ok(stream) = stream_of(subject) else {
            return Vec::new();
        };
        state.streams.get(&stream).map_or_else(Vec::new, |stream| {
            stream
                .messages
                .values()
                .filter(|message| message.subject == subject)
                .cloned()
                .collect()
        })
    }

    /// Every stored message of every stream, in stream order per stream.
    pub fn all_messages(&self) -> Vec<TailMessage> {
        let state = self.state.lock();
        state
            .streams
            .values()
            .flat_map(|stream| stream.messages.values().cloned())
            .collect()
    }

    /// Loses the stored message at `stream_seq` of `stream` silently, as a replica that
    /// drops a corrupted message while it leads (F7): reads no longer see it, and the last
    /// message of its subject becomes the one before it.
    pub fn drop_message_silently(&self, stream: &str, stream_seq: u64) {
        let mut state = self.state.lock();
        let Some(stream) = state.streams.get_mut(stream) else {
            return;
        };
        let Some(dropped) = stream.messages.remove(&stream_seq) else {
            return;
        };
        let previous = stream
            .messages
            .range(..stream_seq)
            .rev()
            .find(|(_, message)| message.subject == dropped.subject)
            .map(|(seq, _)| *seq);
        match previous {
            Some(seq) => stream.last_by_subject.insert(dropped.subject, seq),
            None => stream.last_by_subject.remove(&dropped.subject),
        };
    }

    /// Fenced publishes refused so far.
    pub fn fenced_count(&self) -> u64 {
        self.state.lock().fenced
    }

    fn publish_now(&self, message: TailPublish) -> BackendResult<PublishAck> {
        let now = self.clock.now_ms();
        let stream_name = stream_of(&message.subject)?;
        let mut state = self.state.lock();
        let max_messages = state.max_messages;
        let stream = state.streams.entry(stream_name).or_default();
        let window = self.dedup_window_ms;
        stream
            .dedup
            .retain(|_, (_, stored_at)| now.saturating_sub(*stored_at) < window);
        if let Some((stream_seq, _)) = stream.dedup.get(&message.msg_id) {
            return Ok(PublishAck {
                stream_seq: *stream_seq,
                duplicate: true,
            });
        }
        if let Some(fence) = &message.fence {
            let last = stream
                .last_by_subject
                .get(&fence.subject)
                .copied()
                .unwrap_or(0);
            if last != fence.last_seq {
                state.fenced += 1;
                return Err(BackendError::Fenced {
                    subject: fence.subject.clone(),
                    expected: fence.last_seq,
                });
            }
        }
        if max_messages.is_some_and(|limit| stream.messages.len() >= limit) {
            return Err(BackendError::Full {
                reason: "maximum messages exceeded".to_string(),
            });
        }
        let stream_seq = stream.append(message, now);
        Ok(PublishAck {
            stream_seq,
            duplicate: false,
        })
    }
}

impl FakeTail {
    /// An atomic group: every check (dedup, fences against the stream before the group,
    /// limits) passes for all messages, then all are stored; else nothing is.
    fn publish_batch_now(&self, messages: Vec<TailPublish>) -> BackendResult<Vec<PublishAck>> {
        let now = self.clock.now_ms();
        let Some(first) = messages.first() else {
            return Ok(Vec::new());
        };
        let stream_name = stream_of(&first.subject)?;
        for message in &messages {
            if stream_of(&message.subject)? != stream_name {
                return Err(BackendError::Other {
                    reason: "a group publish spans two streams".to_string(),
                });
            }
        }
        let mut state = self.state.lock();
        let TailState {
            streams,
            max_messages,
            fenced,
        } = &mut *state;
        let stream = streams.entry(stream_name).or_default();
        let window = self.dedup_window_ms;
        stream
            .dedup
            .retain(|_, (_, stored_at)| now.saturating_sub(*stored_at) < window);
        let mut ids = HashSet::new();
        for message in &messages {
            if stream.dedup.contains_key(&message.msg_id) || !ids.insert(&message.msg_id) {
                return Err(BackendError::DuplicateInBatch {
                    reason: message.msg_id.clone(),
                });
            }
        }
        for fence in messages.iter().filter_map(|message| message.fence.as_ref()) {
            let last = stream
                .last_by_subject
                .get(&fence.subject)
                .copied()
                .unwrap_or(0);
            if last != fence.last_seq {
                *fenced += 1;
                return Err(BackendError::Fenced {
                    subject: fence.subject.clone(),
                    expected: fence.last_seq,
                });
            }
        }
        if max_messages.is_some_and(|limit| stream.messages.len() + messages.len() > limit) {
            return Err(BackendError::Full {
                reason: "maximum messages exceeded".to_string(),
            });
        }
        let mut acks = Vec::with_capacity(messages.len());
        for message in messages {
            let stream_seq = stream.append(message, now);
            acks.push(PublishAck {
                stream_seq,
                duplicate: false,
            });
        }
        Ok(acks)
    }
}

impl FakeTailClient {
    /// Marks the fence subjects of a publish as in flight across one yield to the runtime;
    /// refuses it as fenced if one of them already is (as nats-server 2.15.1 does).
    async fn enter_flight<'a>(
        &self,
        fences: impl Iterator<Item = &'a Fence>,
    ) -> BackendResult<Vec<InFlight>> {
        let mut held = Vec::new();
        for fence in fences {
            if held
                .iter()
                .any(|in_flight: &InFlight| in_flight.subject == fence.subject)
            {
                continue;
            }
            if !self.tail.in_flight.lock().insert(fence.subject.clone()) {
                self.tail.state.lock().fenced += 1;
                return Err(BackendError::Fenced {
                    subject: fence.subject.clone(),
                    expected: fence.last_seq,
                });
            }
            held.push(InFlight {
                subjects: self.tail.in_flight.clone(),
                subject: fence.subject.clone(),
            });
        }
        if !held.is_empty() {
            // In flight across one yield: a concurrent publish fenced on the same subject
            // meets it.
            tokio::task::yield_now().await;
        }
        Ok(held)
    }
}

impl TailLog for FakeTailClient {
    async fn publish(&self, message: TailPublish) -> BackendResult<PublishAck> {
        self.link.hold().await;
        self.link.before()?;
        let _in_flight = self.enter_flight(message.fence.iter()).await?;
        let result = self.tail.publish_now(message);
        self.link.after(result)
    }

    async fn publish_batch(&self, messages: Vec<TailPublish>) -> BackendResult<Vec<PublishAck>> {
        self.link.hold().await;
        self.link.before()?;
        let _in_flight = self
            .enter_flight(messages.iter().filter_map(|message| message.fence.as_ref()))
            .await?;
        let result = self.tail.publish_batch_now(messages);
        self.link.after(result)
    }

    async fn last_on_subject(
        &self,
        stream: &str,
        subject: &str,
    ) -> BackendResult<Option<TailMessage>> {
        self.link.before()?;
        let state = self.tail.state.lock();
        let found = state.streams.get(stream).and_then(|stream| {
            let seq = stream.last_by_subject.get(subject)?;
            stream.messages.get(seq).cloned()
        });
        self.link.after(Ok(found))
    }

    async fn message_at(
        &self,
        stream: &str,
        stream_seq: u64,
    ) -> BackendResult<Option<TailMessage>> {
        self.link.before()?;
        let state = self.tail.state.lock();
        let found = state
            .streams
            .get(stream)
            .and_then(|stream| stream.messages.get(&stream_seq).cloned());
        self.link.after(Ok(found))
    }

    async fn replay(
        &self,
        stream: &str,
        subject: &str,
        from_stream_seq: u64,
    ) -> BackendResult<Vec<TailMessage>> {
        self.link.before()?;
        let state = self.tail.state.lock();
        let messages = state.streams.get(stream).map_or_else(Vec::new, |stream| {
            stream
                .messages
                .range(from_stream_seq..)
                .map(|(_, message)| message)
                .filter(|message| message.subject == subject)
                .cloned()
                .collect()
        });
        self.link.after(Ok(messages))
    }

    async fn last_seq(&self, stream: &str) -> BackendResult<u64> {
        self.link.before()?;
        let state = self.tail.state.lock();
        let last = state
            .streams
            .get(stream)
            .map_or(0, |stream| stream.last_seq);
        self.link.after(Ok(last))
    }

    async fn purge(
        &self,
        stream: &str,
        subject: &str,
        before_stream_seq: u64,
    ) -> BackendResult<u64> {
        self.link.before()?;
        let mut state = self.tail.state.lock();
        let mut purged = 0;
        if let Some(stream) = state.streams.get_mut(stream) {
            let doomed: Vec<u64> = stream
                .messages
                .range(..before_stream_seq)
                .filter(|(_, message)| message.subject == subject)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in doomed {
                stream.messages.remove(&seq);
                purged += 1;
            }
            let still_last = stream
                .last_by_subject
                .get(subject)
                .is_some_and(|seq| stream.messages.contains_key(seq));
            if !still_last {
                stream.last_by_subject.remove(subject);
            }
        }
        self.link.after(Ok(purged))
    }
}

#[derive(Debug, Clone)]
struct FakeKvValue {
    value: Vec<u8>,
    revision: u64,
    written_at_ms: u64,
}

#[derive(Debug, Default)]
struct FakeBucket {
    last_revision: u64,
    entries: HashMap<String, FakeKvValue>,
}

/// The fake KV shared by all nodes of a test.
#[derive(Clone)]
pub struct FakeKv {
    buckets: Arc<Mutex<HashMap<Bucket, FakeBucket>>>,
    clock: Arc<VirtualClock>,
    /// TTL of `DSH_NODES` entries, in virtual milliseconds.
    node_ttl_ms: u64,
}

/// One node's handle to the fake KV.
#[derive(Clone)]
pub struct FakeKvClient {
    kv: FakeKv,
    link: LinkControl,
}

impl FakeKv {
    pub fn new(clock: Arc<VirtualClock>, node_ttl_ms: u64) -> FakeKv {
        FakeKv {
            buckets: Arc::default(),
            clock,
            node_ttl_ms,
        }
    }

    pub fn client(&self, link: LinkControl) -> FakeKvClient {
        FakeKvClient {
            kv: self.clone(),
            link,
        }
    }

    fn ttl(&self, bucket: Bucket) -> Option<u64> {
        match bucket {
            Bucket::Nodes => Some(self.node_ttl_ms),
            Bucket::Shards | Bucket::Sessions => None,
        }
    }

    /// The live (not expired) entry of `key`.
    fn live(&self, bucket: Bucket, key: &str) -> Option<FakeKvValue> {
        let now = self.clock.now_ms();
        let buckets = self.buckets.lock();
        let entry = buckets.get(&bucket)?.entries.get(key)?;
        match self.ttl(bucket) {
            Some(ttl) if now.saturating_sub(entry.written_at_ms) >= ttl => None,
            _ => Some(entry.clone()),
        }
    }

    fn write(
        &self,
        bucket: Bucket,
        key: &str,
        value: Vec<u8>,
        expected: Option<u64>,
    ) -> BackendResult<u64> {
        let current = self.live(bucket, key).map(|entry| entry.revision);
        if current != expected {
            return Err(BackendError::RevisionMismatch {
                key: key.to_string(),
            });
        }
        let now = self.clock.now_ms();
        let mut buckets = self.buckets.lock();
        let state = buckets.entry(bucket).or_default();
        state.last_revision += 1;
        let revision = state.last_revision;
        state.entries.insert(
            key.to_string(),
            FakeKvValue {
                value,
                revision,
                written_at_ms: now,
            },
        );
        Ok(revision)
    }

    /// The live value of a key (for checks).
    pub fn peek(&self, bucket: Bucket, key: &str) -> Option<Vec<u8>> {
        self.live(bucket, key).map(|entry| entry.value)
    }
}

impl Coordinator for FakeKvClient {
    async fn get(&self, bucket: Bucket, key: &str) -> BackendResult<Option<KvEntry>> {
        self.link.before()?;
        let found = self.kv.live(bucket, key).map(|entry| KvEntry {
            value: entry.value,
            revision: entry.revision,
        });
        self.link.after(Ok(found))
    }

    async fn create(&self, bucket: Bucket, key: &str, value: Vec<u8>) -> BackendResult<u64> {
        self.link.before()?;
        let result = self.kv.write(bucket, key, value, None);
        self.link.after(result)
    }

    async fn update(
        &self,
        bucket: Bucket,
        key: &str,
        value: Vec<u8>,
        revision: u64,
    ) -> BackendResult<u64> {
        self.link.before()?;
        let result = self.kv.write(bucket, key, value, Some(revision));
        self.link.after(result)
    }

    async fn keys(&self, bucket: Bucket) -> BackendResult<Vec<String>> {
        self.link.before()?;
        let names: Vec<String> = {
            let buckets = self.kv.buckets.lock();
            buckets
                .get(&bucket)
                .map(|state| state.entries.keys().cloned().collect())
                .unwrap_or_default()
        };
        let mut live: Vec<String> = names
            .into_iter()
            .filter(|key| self.kv.live(bucket, key).is_some())
            .collect();
        live.sort();
        self.link.after(Ok(live))
    }
}

/// The fake object store shared by all nodes of a test.
#[derive(Clone, Default)]
pub struct FakeCold {
    objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

/// One node's handle to the fake object store.
#[derive(Clone)]
pub struct FakeColdClient {
    cold: FakeCold,
    link: LinkControl,
}

impl FakeCold {
    pub fn client(&self, link: LinkControl) -> FakeColdClient {
        FakeColdClient {
            cold: self.clone(),
            link,
        }
    }

    /// Flips one byte of a stored object (for corruption tests); false if absent or empty.
    pub fn corrupt(&self, key: &str, index: usize) -> bool {
        let mut objects = self.objects.lock();
        match objects.get_mut(key) {
            Some(bytes) if !bytes.is_empty() => {
                let at = index % bytes.len();
                bytes[at] ^= 0x01;
                true
            }
            _ => false,
        }
    }

    pub fn keys(&self) -> Vec<String> {
        self.objects.lock().keys().cloned().collect()
    }

    /// A stored object's bytes (for checks).
    pub fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.objects.lock().get(key).cloned()
    }
}

impl ColdStore for FakeColdClient {
    async fn put_immutable(&self, key: &str, bytes: Vec<u8>) -> BackendResult<()> {
        self.link.before()?;
        let result = {
            let mut objects = self.cold.objects.lock();
            match objects.get(key) {
                Some(existing) if *existing == bytes => Ok(()),
                Some(_) => Err(BackendError::Other {
                    reason: format!("immutable key {key} holds other bytes"),
                }),
                None => {
                    objects.insert(key.to_string(), bytes);
                    Ok(())
                }
            }
        };
        self.link.after(result)
    }

    async fn get(&self, key: &str) -> BackendResult<Option<Vec<u8>>> {
        self.link.before()?;
        let found = self.cold.objects.lock().get(key).cloned();
        self.link.after(Ok(found))
    }

    async fn head(&self, key: &str) -> BackendResult<Option<u64>> {
        self.link.before()?;
        let found = self
            .cold
            .objects
            .lock()
            .get(key)
            .map(|bytes| bytes.len() as u64);
        self.link.after(Ok(found))
    }

    async fn list(&self, prefix: &str) -> BackendResult<Vec<String>> {
        self.link.before()?;
        let keys = self
            .cold
            .objects
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, _)| key.clone())
            .collect();
        self.link.after(Ok(keys))
    }
}
