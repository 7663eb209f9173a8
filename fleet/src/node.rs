//! A fleet node: owns shards, serves their sessions from the local tier, replicates every
//! commit batch to the tail log before acknowledging it, seals tails into cold runs, and
//! takes over the shards of dead nodes. The design is FLEET.md of issue #17.
//!
//! Safety rests on three compare-and-sets, never on timing:
//! - the tail fence: every session write carries the stream sequence of the writer's epoch
//!   marker as `expected last sequence` of the shard's epoch subject; a newer marker refuses
//!   it (a zombie cannot write after a takeover);
//! - the marker itself is published with the previous marker's sequence as its fence, so
//!   two would-be owners cannot both install a marker on top of the same one;
//! - session manifests carry the epoch of their last writer; a rebuild claims a manifest
//!   (CAS to its epoch) before it reads the tail, so a zombie's seal (manifest CAS, then
//!   purge) either lands before the claim (and is seen) or fails.

use crate::backend::{
    Bucket, Clock, ColdStore, Coordinator, Fence, KvEntry, PublishAck, TailLog, TailMessage,
    TailPublish,
};
use crate::error::{BackendError, FleetError, FleetResult};
use crate::modes::{tail_message, DurabilityMode, ModeMetrics, Replication, Route, Shipped};
use crate::shard::{
    epoch_subject, group_subject, manifest_copy_key, rendezvous_owner, run_key, session_key,
    session_subject, shard_key, stream_name, valid_session_id,
};
use crate::tier::{LocalPending, LocalTier};
use crate::wire::{
    blake3_hex, decode_tail_message, from_json, to_json, EpochMarker, NodeRecord, RunObject,
    RunRef, SessionManifest, ShardRecord, TailBatch, TailCheckpoint, TailGroup,
};
use dshdb::Event;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Version of [`SessionManifest`] written.
pub const MANIFEST_FORMAT: u32 = 1;
/// Largest session header, in bytes: it lives in a KV value (NATS `max_payload` 1 MiB).
pub const MAX_FLEET_HEADER_BYTES: usize = 256 * 1024;
/// Largest encoded tail message, in bytes: below NATS's default `max_payload` (1 MiB) with
/// room for headers. Larger batches are refused; large content belongs in spill blobs.
pub const MAX_TAIL_PAYLOAD_BYTES: usize = 1000 * 1024;
/// Largest estimated size, in bytes, of one backlog batch of inherited events (half the
/// tail payload limit: the estimate is not the encoding).
pub const MAX_INHERITED_BATCH_BYTES: usize = MAX_TAIL_PAYLOAD_BYTES / 2;
/// Bytes counted per inherited event on top of its type and data, in that estimate (more
/// than the tail encoding's seq, time and lengths take).
const INHERITED_EVENT_OVERHEAD_BYTES: usize = 64;
/// Attempts at a manifest compare-and-set before giving up (each lost race re-reads it).
pub const MANIFEST_CAS_ATTEMPTS: u32 = 8;
/// Times a fenced session write refused only because another fenced write of the same
/// shard was in flight (see [`Node::publish_fenced`]) is sent again before giving up.
pub const FENCE_COLLISION_ATTEMPTS: u32 = 500;
/// Pause before sending such a write again.
pub const FENCE_COLLISION_PAUSE: Duration = Duration::from_millis(1);
/// Most session batches one group publish carries (nats-server takes up to 1,000 messages
/// in an atomic batch; a smaller group bounds the wait of the batches at its end).
pub const MAX_GROUP_MESSAGES: usize = 256;
/// Most bytes of session batches one group publish carries, each counted with its 4-byte
/// length prefix (a group always takes its first batch): so a shard's group message
/// (F-09-23, a 21-byte header more) stays within [`MAX_TAIL_PAYLOAD_BYTES`] plus that
/// header, below NATS's `max_payload` (1 MiB), and the server stages a bounded batch.
pub const MAX_GROUP_BYTES: usize = MAX_TAIL_PAYLOAD_BYTES;
/// The length prefix of each batch inside a group message, in bytes.
const GROUP_ENTRY_BYTES: usize = 4;
/// Most sessions whose tail checkpoint one heartbeat writes (one manifest CAS each); the
/// others wait for the next heartbeats.
pub const MAX_CHECKPOINTS_PER_TICK: usize = 256;
/// Most group messages one seal examines for the group purge (F-09-43): a seal's cost stays
/// bounded whatever the shard's traffic; the next seal goes on from where this one stopped.
pub const MAX_GROUP_PURGE_SCAN: usize = 10_000;
/// The first stream sequence of a JetStream stream (sequences start at 1).
const FIRST_STREAM_SEQ: u64 = 1;
/// Lease TTL of `DSH_NODES` entries, in milliseconds (FLEET.md: 10 s).
pub const DEFAULT_LEASE_TTL_MS: u64 = 10_000;

/// How a node is set up.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: String,
    /// Where clients reach this node (carried in `Moved` answers through `DSH_NODES`).
    pub addr: String,
    /// Distinguishes this process from earlier ones with the same id.
    pub generation: u64,
    /// Virtual shards of the fleet (fixed at fleet creation; 1024 in production).
    pub shard_count: u32,
    /// Attempts at publishing one batch while the answer is unknown (same msg id).
    pub publish_attempts: u32,
    /// Pause between those attempts, in milliseconds (0: none, as in the model tests).
    pub publish_retry_backoff_ms: u64,
    /// The `DSH_NODES` TTL, in milliseconds: a lease not refreshed for this long may have
    /// expired on the server, and other nodes may take this node's shards.
    pub lease_ttl_ms: u64,
    /// When appends are acknowledged (FLEET.md §5.3).
    pub mode: DurabilityMode,
    /// In `replicated` mode: after this many ms without a tail ack (or once the publish
    /// retries give up), ack in `local` mode for the stalled stream and ship the backlog in
    /// the background (`None`: stall, and fail the append if the retries give up).
    pub degrade_to_local_after_ms: Option<u64>,
    /// How long the replicator waits for its probe of a stalled stream, in ms.
    pub stalled_probe_timeout_ms: u64,
    /// How long the replicator waits for a message on a stream not known to be stalled,
    /// in ms (then the stream counts as stalled).
    pub ship_wait_timeout_ms: u64,
    /// When a session is sealed without being asked: tail size and idleness (FLEET.md
    /// §5.4; [`crate::triggers`]).
    pub seal_policy: crate::triggers::SealPolicy,
}

impl NodeConfig {
    pub fn new(node_id: &str, addr: &str, generation: u64) -> NodeConfig {
        NodeConfig {
            node_id: node_id.to_string(),
            addr: addr.to_string(),
            generation,
            shard_count: crate::shard::SHARD_COUNT,
            publish_attempts: 20,
            publish_retry_backoff_ms: 250,
            lease_ttl_ms: DEFAULT_LEASE_TTL_MS,
            mode: DurabilityMode::Replicated,
            degrade_to_local_after_ms: None,
            stalled_probe_timeout_ms: crate::modes::DEFAULT_STALLED_PROBE_TIMEOUT_MS,
            ship_wait_timeout_ms: crate::modes::DEFAULT_SHIP_WAIT_TIMEOUT_MS,
            seal_policy: crate::triggers::SealPolicy::default(),
        }
    }
}

/// An event as a client sends it; the node gives it its seq (and its time when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingEvent {
    pub event_type: String,
    pub time: Option<i64>,
    pub data: String,
    pub envelope: String,
    pub flags: u8,
}

impl IncomingEvent {
    pub fn new(event_type: &str, data: &str) -> IncomingEvent {
        IncomingEvent {
            event_type: event_type.to_string(),
            time: None,
            data: data.to_string(),
            envelope: String::new(),
            flags: 0,
        }
    }
}

/// An acknowledged append: durable locally, and in the replicated tail when `replicated`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    pub first_seq: u64,
    pub end_seq: u64,
    /// Stream sequence of the tail message (0 when not `replicated`).
    pub stream_seq: u64,
    /// The stream had this batch already (a retry of a stored message); nothing new stored.
    pub duplicate: bool,
    /// The tail acknowledged the batch before this ack. `false`: acknowledged after the
    /// local fsync only (`local` or `sealed` mode, or a degraded stream): at risk until
    /// shipped or sealed (see [`Node::unshipped`]).
    pub replicated: bool,
    /// The shard epoch it was acknowledged under (names it in [`Node::unshipped`] and
    /// [`Node::lost_unshipped`] ranges).
    pub epoch: u64,
}

/// What one seal did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealReport {
    pub events: u64,
    pub run_bytes: u64,
    pub run_key: Option<String>,
    pub purged_messages: u64,
    /// Messages of the shard's group subject purged after the seal (F-09-43).
    pub purged_group_messages: u64,
}

/// How far a seal goes (the model tests stop it part-way to model a crash in between).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SealStep {
    PutRun = 1,
    VerifyRun = 2,
    UpdateManifest = 3,
    CopyManifest = 4,
    PurgeTail = 5,
}

/// Counters a node keeps (FLEET.md's metrics).
#[derive(Debug, Default)]
pub struct NodeMetrics {
    pub appends_acked: AtomicU64,
    pub events_acked: AtomicU64,
    pub publish_retries: AtomicU64,
    pub dedup_hits: AtomicU64,
    pub fenced_writes: AtomicU64,
    pub shards_lost: AtomicU64,
    pub takeovers: AtomicU64,
    pub rebuilds: AtomicU64,
    pub rebuilt_events: AtomicU64,
    pub seals: AtomicU64,
    pub sealed_events: AtomicU64,
    pub purged_messages: AtomicU64,
    /// Group messages (F-09-23) purged because every session they carry is sealed past them.
    pub purged_group_messages: AtomicU64,
    pub not_acknowledged: AtomicU64,
    /// Times the node dropped every shard it held because its lease was lost (expired on
    /// the server, or not refreshed within the TTL).
    pub leases_lost: AtomicU64,
    /// Times the node registered again after losing its lease.
    pub reregistrations: AtomicU64,
    /// Fenced writes refused while the fence still held (another write of the shard was
    /// in flight) and sent again.
    pub fence_collisions: AtomicU64,
    /// Fenced publishes sent (a single session batch, or one atomic group of several).
    pub fenced_publishes: AtomicU64,
    /// Messages those publishes stored (one per shard of a group).
    pub published_messages: AtomicU64,
    /// Session batches carried by those messages (their ratio is the batching factor).
    pub published_batches: AtomicU64,
    /// Groups refused for a duplicate message id and then sent one batch at a time.
    pub group_duplicate_fallbacks: AtomicU64,
    /// Microseconds spent in fenced publishes, summed (over `fenced_publishes`: the mean
    /// time one takes, the JetStream part of a replicated append).
    pub publish_micros: AtomicU64,
    /// Tail checkpoints written to manifests by heartbeats.
    pub tail_checkpoints: AtomicU64,
    /// Events found on the local disk past a session's replicated history after a restart
    /// (acknowledged locally by this node id's previous process, never shipped) and queued
    /// to be shipped (or sealed) again.
    pub inherited_events: AtomicU64,
}

/// Adds `by` to a metrics counter (the node's and the modes' alike).
pub(crate) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnedShard {
    pub(crate) epoch: u64,
    pub(crate) fence_seq: u64,
}

/// What the node knows of one session it serves.
#[derive(Debug, Default)]
pub(crate) struct SessionSlot {
    /// The shard epoch the local copy was last checked against the replicated history
    /// under (0: not checked; rebuild before serving).
    pub(crate) validated_epoch: u64,
    header: String,
    next_seq: u64,
    /// Stream sequence of the last tail message of this session the node knows.
    pub(crate) last_stream_seq: u64,
    /// End of the events known to be in the replicated history (tail or runs): below
    /// `next_seq` while acknowledged batches wait in the backlog.
    pub(crate) replicated_end: u64,
    /// The tail position last recorded in the manifest (`tail_checkpoint`) by this node.
    checkpointed_stream_seq: u64,
}

/// The node's `DSH_NODES` entry as this process last knew it.
#[derive(Debug, Default, Clone, Copy)]
struct Lease {
    /// Revision of the entry (`None`: not registered, or the lease was lost).
    revision: Option<u64>,
    /// Clock time (ms) until which no other node can see the entry expired: the send time
    /// of the last refresh known to have landed, plus the TTL (the server starts the TTL
    /// when it stores the write, which is later).
    valid_until_ms: u64,
    /// Whether this process registered once: a later registration that finds the id
    /// held means another process took it.
    registered_once: bool,
}

/// Whose a node id's `DSH_NODES` entry is.
enum NodeEntry {
    /// Expired (or never written).
    Absent,
    /// This process's (its generation), at `revision`.
    Ours { revision: u64 },
    /// Another process's: the id is taken.
    Other,
}

/// What a queued session write learns from the task that sends its shard's group.
enum Turn {
    /// Its outcome.
    Done(Result<PublishAck, BackendError>),
    /// It is first in the queue and no publish of the shard is in flight: it sends the next
    /// group itself.
    Lead,
}

/// A session write waiting for its stream's group publish.
struct QueuedWrite {
    ticket: u64,
    shard: u32,
    owned: OwnedShard,
    message: TailPublish,
    /// Taken when the write is told to lead (its task then takes its outcome directly).
    reply: Option<tokio::sync::oneshot::Sender<Turn>>,
}

/// One write of a group publish.
struct GroupWrite {
    shard: u32,
    owned: OwnedShard,
    message: TailPublish,
}

/// One message of a group publish and the writes it carries (indices into the group).
struct Outgoing {
    shard: u32,
    owned: OwnedShard,
    message: TailPublish,
    writes: Vec<usize>,
}

/// The writes of one tail stream not yet sent; `leading` while a task sends a group of it.
#[derive(Default)]
struct StreamQueue {
    queued: std::collections::VecDeque<QueuedWrite>,
    leading: bool,
}

/// A task's turn at sending its stream's group. Dropped unfinished (the task was
/// cancelled), it tells the group's writes their outcome is unknown and hands the turn on,
/// so that the shard's queue never stalls.
struct GroupTurn<'node, T: TailLog, C: Coordinator, S: ColdStore> {
    node: &'node Node<T, C, S>,
    stream: u32,
    group: Vec<QueuedWrite>,
    finished: bool,
}

impl<T: TailLog, C: Coordinator, S: ColdStore> GroupTurn<'_, T, C, S> {
    /// Gives every write of the group its outcome, hands the turn on, and returns the
    /// outcome of the write `own_ticket`.
    fn finish(
        mut self,
        own_ticket: u64,
        mut outcomes: Vec<Result<PublishAck, BackendError>>,
    ) -> Result<PublishAck, BackendError> {
        let mut own = None;
        let group = std::mem::take(&mut self.group);
        outcomes.resize(
            group.len(),
            Err(BackendError::Other {
                reason: "group publish returned too few outcomes".to_string(),
            }),
        );
        for (write, outcome) in group.into_iter().zip(outcomes) {
            if write.ticket == own_ticket {
                own = Some(outcome);
            } else if let Some(reply) = write.reply {
                // A write whose task is gone needs no answer.
                let _ = reply.send(Turn::Done(outcome));
            }
        }
        self.finished = true;
        self.node.hand_on_turn(self.stream);
        own.unwrap_or_else(|| {
            Err(BackendError::Other {
                reason: "a group publish lost its own write".to_string(),
            })
        })
    }
}

impl<T: TailLog, C: Coordinator, S: ColdStore> Drop for GroupTurn<'_, T, C, S> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for write in std::mem::take(&mut self.group) {
            if let Some(reply) = write.reply {
                let _ = reply.send(Turn::Done(Err(BackendError::Unavailable {
                    reason: "the task sending the group publish was cancelled".to_string(),
                })));
            }
        }
        self.node.hand_on_turn(self.stream);
    }
}

/// One fleet node over a tail log `T`, a coordinator `C` and a cold store `S`.
pub struct Node<T, C, S> {
    config: NodeConfig,
    tail: T,
    coordinator: C,
    cold: S,
    local: Arc<dyn LocalTier>,
    clock: Arc<dyn Clock>,
    shards: Mutex<BTreeMap<u32, OwnedShard>>,
    /// Shards whose `DSH_SHARDS` record may name this process while it does not serve them
    /// (dropped with a lost lease, fenced by a node whose record write then lost, a
    /// takeover whose record write got no answer): it takes
    /// them back (or learns their new owner) whatever the rendezvous says, as no other node
    /// takes a shard from a live recorded owner.
    reclaim: Mutex<BTreeSet<u32>>,
    /// Shards taken, at the epoch in the value, straight from this node id's previous
    /// process (the record named it at the epoch before, nobody in between): the local copy
    /// of their sessions may hold events that process acknowledged locally and never
    /// shipped, which the rebuild keeps and queues for shipping ([`Node::inherited_excess`]).
    inherited: Mutex<HashMap<u32, u64>>,
    /// One fenced write in flight per shard: the server refuses a second one while the
    /// first is in flight (see [`Node::publish_grouped`]), so the node queues the others
    /// and sends them together as the next group publish of the shard's tail stream.
    stream_queues: Mutex<HashMap<u32, StreamQueue>>,
    next_ticket: AtomicU64,
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<SessionSlot>>>>,
    lease: Mutex<Lease>,
    /// The lease is refreshed by [`Node::heartbeat`] on a thread of its own (a node
    /// process), not by [`Node::tick`]: a runtime busy with appends or a slow takeover then
    /// cannot delay the refresh past the lease's TTL.
    heartbeat_elsewhere: AtomicBool,
    /// Set by a heartbeat that registered the node anew (its lease had been lost); the next
    /// tick takes it, as it would its own refresh's answer.
    registered_anew: AtomicBool,
    stopped: AtomicBool,
    /// Acknowledged batches not yet in the tail, and the stall state of each stream.
    pub(crate) replication: Mutex<Replication>,
    /// Per session, the unsealed tail this node appended (the seal triggers).
    seal_triggers: crate::triggers::SealTriggers,
    pub metrics: NodeMetrics,
    pub mode_metrics: ModeMetrics,
}

fn backend(error: BackendError) -> FleetError {
    FleetError::Backend(error)
}

/// Waits for a local append without holding a thread: the log wakes this task once its
/// fsync ended. A thread blocked per waiting append (as `block_in_place` did) starved the
/// runtime with a thousand sessions in flight, the node's heartbeat included, and cost a
/// thread hand-off per append.
async fn wait_local(pending: Box<dyn LocalPending>) -> FleetResult<()> {
    if !pending.is_settled() {
        let (settled, wait) = tokio::sync::oneshot::channel();
        pending.when_settled(Box::new(move || {
            // The waiting task may be gone (cancelled); nobody is left to tell.
            let _ = settled.send(());
        }));
        // A call dropped unmade (the log went away) ends the wait too: `wait` then reports.
        let _ = wait.await;
    }
    pending.wait()
}

fn valid_header(session: &str, header: &str) -> FleetResult<()> {
    if header.len() > MAX_FLEET_HEADER_BYTES {
        return Err(FleetError::InvalidInput {
            reason: format!(
                "header of {} bytes (limit {MAX_FLEET_HEADER_BYTES})",
                header.len()
            ),
        });
    }
    let value: serde_json::Value =
        serde_json::from_str(header).map_err(|error| FleetError::InvalidInput {
            reason: format!("header is not JSON: {error}"),
        })?;
    match value.get("id").and_then(serde_json::Value::as_str) {
        Some(id) if id == session => Ok(()),
        _ => Err(FleetError::InvalidInput {
            reason: format!("header id must be {session:?}"),
        }),
    }
}

impl<T: TailLog, C: Coordinator, S: ColdStore> Node<T, C, S> {
    pub fn new(
        config: NodeConfig,
        tail: T,
        coordinator: C,
        cold: S,
        local: Arc<dyn LocalTier>,
        clock: Arc<dyn Clock>,
    ) -> Node<T, C, S> {
        Node {
            config,
            tail,
            coordinator,
            cold,
            local,
            clock,
            shards: Mutex::new(BTreeMap::new()),
            reclaim: Mutex::new(BTreeSet::new()),
            inherited: Mutex::new(HashMap::new()),
            stream_queues: Mutex::new(HashMap::new()),
            next_ticket: AtomicU64::new(0),
            sessions: Mutex::new(HashMap::new()),
            lease: Mutex::new(Lease::default()),
            heartbeat_elsewhere: AtomicBool::new(false),
            registered_anew: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            replication: Mutex::new(Replication::default()),
            seal_triggers: crate::triggers::SealTriggers::default(),
            metrics: NodeMetrics::default(),
            mode_metrics: ModeMetrics::default(),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub fn id(&self) -> &str {
        &self.config.node_id
    }

    pub(crate) fn clock_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Whether the lease is surely still live on the server: no other node can have taken
    /// this node's shards yet, so a local acknowledgement is not a zombie's.
    fn lease_valid(&self) -> bool {
        self.clock.now_ms() < self.lease.lock().valid_until_ms
    }

    /// Whether the node stopped because another process holds its id.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The shards this node serves, with their epochs.
    pub fn owned_shards(&self) -> BTreeMap<u32, u64> {
        self.shards
            .lock()
            .iter()
            .map(|(shard, owned)| (*shard, owned.epoch))
            .collect()
    }

    pub fn shard_of(&self, session: &str) -> u32 {
        crate::shard::shard_of_in(session, self.config.shard_count)
    }

    /// The sessions this node owns that its seal policy makes due now (tail size or
    /// idleness, [`crate::triggers`]), with why; a noted session whose shard this node no
    /// longer serves is forgotten (its owner seals it).
    pub fn due_seals(&self) -> Vec<(String, crate::triggers::SealReason)> {
        let due = self
            .seal_triggers
            .due(self.config.seal_policy, self.clock.now_ms());
        let shards = self.shards.lock();
        due.into_iter()
            .filter(|(session, _)| {
                let owned = shards.contains_key(&self.shard_of(session));
                if !owned {
                    self.seal_triggers.settled(session);
                }
                owned
            })
            .collect()
    }

    /// Sessions with something unsealed that this node appended (the seal triggers' view).
    pub fn unsealed_sessions(&self) -> usize {
        self.seal_triggers.tracked()
    }

    fn node_record(&self) -> Vec<u8> {
        to_json(&NodeRecord {
            addr: self.config.addr.clone(),
            generation: self.config.generation,
            started_at_ms: self.clock.now_ms(),
        })
    }

    /// Registers the node in `DSH_NODES`. Fails with `RevisionMismatch` while an entry of
    /// this id is live (an earlier process's lease has not expired, or a duplicate runs):
    /// the caller waits and tries again.
    pub async fn start(&self) -> FleetResult<()> {
        self.start_with(&self.coordinator).await
    }

    /// [`Node::start`] through `coordinator` (the node's own, or the heartbeat's).
    async fn start_with(&self, coordinator: &C) -> FleetResult<()> {
        let sent_at_ms = self.clock.now_ms();
        let id = &self.config.node_id;
        let revision = match coordinator
            .create(Bucket::Nodes, id, self.node_record())
            .await
        {
            Ok(revision) => revision,
            // Our own create whose reply was lost wrote the entry: adopt it.
            Err(error @ BackendError::RevisionMismatch { .. }) => {
                match self.node_entry(coordinator).await? {
                    NodeEntry::Ours { revision } => revision,
                    NodeEntry::Absent | NodeEntry::Other => return Err(backend(error)),
                }
            }
            Err(error) => return Err(backend(error)),
        };
        let mut lease = self.lease.lock();
        lease.revision = Some(revision);
        lease.valid_until_ms = sent_at_ms.saturating_add(self.config.lease_ttl_ms);
        lease.registered_once = true;
        Ok(())
    }

    /// Whose this node id's `DSH_NODES` entry is now.
    async fn node_entry(&self, coordinator: &C) -> FleetResult<NodeEntry> {
        let current = coordinator
            .get(Bucket::Nodes, &self.config.node_id)
            .await
            .map_err(backend)?;
        let Some(entry) = current else {
            return Ok(NodeEntry::Absent);
        };
        let ours = from_json::<NodeRecord>(&entry.value, "node record")
            .is_ok_and(|record| record.generation == self.config.generation);
        Ok(if ours {
            NodeEntry::Ours {
                revision: entry.revision,
            }
        } else {
            NodeEntry::Other
        })
    }

    /// Stops serving for good: another process holds this node's id.
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.shards.lock().clear();
    }

    fn id_taken(&self) -> FleetError {
        self.stop();
        FleetError::Moved {
            shard: 0,
            owner: None,
            epoch: 0,
        }
    }

    /// Drops every shard at once: the lease may have expired, so other nodes may own them
    /// now (a write would be fenced anyway; this also stops serving reads of a stale copy).
    fn drop_all_shards(&self) {
        let dropped = {
            let mut shards = self.shards.lock();
            self.reclaim.lock().extend(shards.keys().copied());
            let count = shards.len() as u64;
            shards.clear();
            count
        };
        if dropped > 0 {
            bump(&self.metrics.shards_lost, dropped);
            bump(&self.metrics.leases_lost, 1);
        }
    }

    /// The lease expired on the server: forget it and drop every shard. The next
    /// registration makes the node live again; it then takes shards through the normal
    /// takeover path (its own ones back at the same epoch if nobody took them meanwhile).
    fn lose_lease(&self) {
        {
            let mut lease = self.lease.lock();
            lease.revision = None;
            lease.valid_until_ms = 0;
        }
        self.drop_all_shards();
    }

    /// After a failed refresh: drops every shard once the lease is past its TTL, as the
    /// server may have expired it (the node keeps its revision: the next refresh tells).
    fn drop_shards_if_lease_expired(&self) {
        let valid_until_ms = self.lease.lock().valid_until_ms;
        let expired = self.clock.now_ms() >= valid_until_ms;
        if expired {
            self.drop_all_shards();
        }
    }

    /// Registers again after the lease was lost; the id held by another process stops
    /// this one for good.
    async fn register_again(&self, coordinator: &C) -> FleetResult<()> {
        let registered_once = self.lease.lock().registered_once;
        match self.start_with(coordinator).await {
            Ok(()) => {
                if registered_once {
                    bump(&self.metrics.reregistrations, 1);
                }
                Ok(())
            }
            Err(FleetError::Backend(BackendError::RevisionMismatch { .. })) if registered_once => {
                Err(self.id_taken())
            }
            Err(error) => Err(error),
        }
    }

    /// Refreshes the lease by CAS. An expired entry drops every shard and registers again;
    /// an entry of another process stops this one for good. Returns whether the node
    /// registered anew (its lease had been lost).
    async fn refresh_lease(&self, coordinator: &C) -> FleetResult<bool> {
        let Some(revision) = self.lease.lock().revision else {
            return self.register_again(coordinator).await.map(|()| true);
        };
        let sent_at_ms = self.clock.now_ms();
        let id = &self.config.node_id;
        match coordinator
            .update(Bucket::Nodes, id, self.node_record(), revision)
            .await
        {
            Ok(next) => {
                let mut lease = self.lease.lock();
                lease.revision = Some(next);
                lease.valid_until_ms = sent_at_ms.saturating_add(self.config.lease_ttl_ms);
                Ok(false)
            }
            Err(BackendError::RevisionMismatch { .. }) => {
                match self.node_entry(coordinator).await? {
                    // Our own refresh whose reply was lost moved the revision: adopt it (the
                    // validity stays that of the last refresh known to have landed).
                    NodeEntry::Ours { revision } => {
                        self.lease.lock().revision = Some(revision);
                        Ok(false)
                    }
                    NodeEntry::Other => Err(self.id_taken()),
                    NodeEntry::Absent => {
                        self.lose_lease();
                        self.register_again(coordinator).await.map(|()| true)
                    }
                }
            }
            Err(error) => Err(backend(error)),
        }
    }

    /// Live nodes: id → generation.
    async fn live_nodes(&self) -> FleetResult<HashMap<String, u64>> {
        let mut live = HashMap::new();
        for id in self
            .coordinator
            .keys(Bucket::Nodes)
            .await
            .map_err(backend)?
        {
            if let Some(entry) = self
                .coordinator
                .get(Bucket::Nodes, &id)
                .await
                .map_err(backend)?
            {
                if let Ok(record) = from_json::<NodeRecord>(&entry.value, "node record") {
                    live.insert(id, record.generation);
                }
            }
        }
        Ok(live)
    }

    /// From now on the lease is refreshed by [`Node::heartbeat`] calls, not by
    /// [`Node::tick`] (a node process calls it once its heartbeat thread is connected).
    pub fn refresh_elsewhere(&self) {
        self.heartbeat_elsewhere.store(true, Ordering::SeqCst);
    }

    /// Refreshes the lease through `coordinator` (a connection of the heartbeat's own):
    /// registers again after a lost lease; after a failed refresh, drops every shard once
    /// the lease is past its TTL.
    pub async fn heartbeat(&self, coordinator: &C) -> FleetResult<()> {
        match self.refresh_lease(coordinator).await {
            Ok(registered_now) => {
                if registered_now {
                    self.registered_anew.store(true, Ordering::SeqCst);
                }
                Ok(())
            }
            Err(error) => {
                self.drop_shards_if_lease_expired();
                Err(error)
            }
        }
    }

    /// A tick's view of a lease the heartbeat refreshes: whether it registered anew since
    /// the last tick; an error while the lease is not live (not registered, or past its
    /// TTL: the shards are dropped then, as a failed refresh drops them).
    fn lease_from_heartbeat(&self) -> FleetResult<bool> {
        self.drop_shards_if_lease_expired();
        let registered = self.lease.lock().revision.is_some();
        if !registered || !self.lease_valid() {
            // No takeover without a live lease: the shards taken would be a zombie's.
            return Err(FleetError::InvalidInput {
                reason: "no live lease: the heartbeat refreshes it or registers the node again"
                    .to_string(),
            });
        }
        Ok(self.registered_anew.swap(false, Ordering::SeqCst))
    }

    /// One round of lease refresh, ownership checks and takeovers. Returns the shards taken,
    /// or the first error met (the other shards were still settled).
    pub async fn tick(&self) -> FleetResult<Vec<u32>> {
        if self.is_stopped() {
            return Err(FleetError::InvalidInput {
                reason: "node stopped: its id is held by another process".to_string(),
            });
        }
        let registered_now = if self.heartbeat_elsewhere.load(Ordering::SeqCst) {
            self.lease_from_heartbeat()?
        } else {
            match self.refresh_lease(&self.coordinator).await {
                Ok(registered_now) => registered_now,
                Err(error) => {
                    self.drop_shards_if_lease_expired();
                    return Err(error);
                }
            }
        };
        let live = self.live_nodes().await?;
        self.drop_shards_owned_elsewhere().await?;
        let mut names: Vec<String> = live.keys().cloned().collect();
        names.sort();
        let mut taken = Vec::new();
        // A shard whose tail stream (or record) does not answer must not hold up the others:
        // F2 saw one stream stay leaderless (10008) after its server's restart while the
        // takeover of every shard after it in this loop waited for it. The first error is
        // still reported, after the other shards and the checkpoints had their turn.
        let mut first_error = None;
        for shard in 0..self.config.shard_count {
            let reclaim = self.reclaim.lock().contains(&shard);
            if rendezvous_owner(shard, &names).map(String::as_str) != Some(self.id()) && !reclaim {
                continue;
            }
            // In the tick that registers again after a lost lease, only the shards this node
            // held come back: the other nodes whose leases lapsed in the same outage (an
            // election of `DSH_NODES`) register within a tick too, and taking their shards
            // now would make them take them back at a newer epoch and rebuild every session
            // (F2 saw 5-6 lease losses and 4.5 s recoveries from that churn).
            if registered_now && !reclaim {
                continue;
            }
            if self.shards.lock().contains_key(&shard) {
                self.reclaim.lock().remove(&shard);
                continue;
            }
            match self.settle_shard(shard, reclaim, &live).await {
                Ok(true) => taken.push(shard),
                Ok(false) => {}
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        self.checkpoint_tails().await;
        // The shards taken are served whatever the error says; the caller only logs it.
        match first_error {
            Some(error) => Err(error),
            None => Ok(taken),
        }
    }

    /// Takes `shard` if it is free (or recorded for this process); a shard in the reclaim
    /// set leaves it once its record names another owner. Returns whether it was taken.
    async fn settle_shard(
        &self,
        shard: u32,
        reclaim: bool,
        live: &HashMap<String, u64>,
    ) -> FleetResult<bool> {
        if self.try_take(shard, live).await? {
            self.reclaim.lock().remove(&shard);
            return Ok(true);
        }
        if !reclaim {
            return Ok(false);
        }
        let Some((record, _)) = self.shard_record(shard).await? else {
            return Ok(false);
        };
        if record.owner != self.config.node_id || record.generation != self.config.generation {
            self.reclaim.lock().remove(&shard);
            // Another process owns the shard at a newer epoch: this node's backlog of it can
            // never be shipped (fenced) nor sealed (the manifest names the newer epoch). In
            // `local` mode the replicator would learn that from a fence; a `sealed` node
            // never sends, so without this its loss went unreported (the sealed-mode model
            // schedules found it: seed 0).
            self.drop_shard_backlog(shard, record.epoch.saturating_sub(1));
        }
        Ok(false)
    }

    /// Records in the manifests of sessions whose tail moved since the last record the
    /// acknowledged tail position (`tail_checkpoint`), at most [`MAX_CHECKPOINTS_PER_TICK`]
    /// per heartbeat. What it guarantees: a rebuild never silently serves a history shorter
    /// than the last checkpoint (one heartbeat behind the acknowledgements at most while the
    /// node lives); events acknowledged after it are covered only by the replay's own checks
    /// (the subject's last message). Failures are left to the next heartbeat.
    async fn checkpoint_tails(&self) {
        let slots: Vec<(String, Arc<tokio::sync::Mutex<SessionSlot>>)> = self
            .sessions
            .lock()
            .iter()
            .map(|(session, slot)| (session.clone(), slot.clone()))
            .collect();
        let mut written = 0;
        for (session, slot) in slots {
            if written >= MAX_CHECKPOINTS_PER_TICK {
                break;
            }
            let Ok(mut slot) = slot.try_lock() else {
                // An append, read or seal holds it; the next heartbeat comes back.
                continue;
            };
            if slot.validated_epoch == 0 || slot.last_stream_seq <= slot.checkpointed_stream_seq {
                continue;
            }
            let shard = self.shard_of(&session);
            let owned = self.shards.lock().get(&shard).copied();
            let Some(owned) = owned.filter(|owned| owned.epoch == slot.validated_epoch) else {
                continue;
            };
            if self
                .write_checkpoint(&session, shard, owned, &slot)
                .await
                .is_ok()
            {
                slot.checkpointed_stream_seq = slot.last_stream_seq;
                written += 1;
                bump(&self.metrics.tail_checkpoints, 1);
            }
        }
    }

    async fn write_checkpoint(
        &self,
        session: &str,
        shard: u32,
        owned: OwnedShard,
        slot: &SessionSlot,
    ) -> FleetResult<()> {
        let (mut manifest, revision) = self.claim_manifest(session, shard, owned).await?;
        let checkpoint = TailCheckpoint {
            end_seq: slot.replicated_end,
            stream_seq: slot.last_stream_seq,
        };
        if manifest
            .tail_checkpoint
            .is_some_and(|recorded| recorded.stream_seq >= checkpoint.stream_seq)
        {
            return Ok(());
        }
        manifest.tail_checkpoint = Some(checkpoint);
        self.coordinator
            .update(
                Bucket::Sessions,
                &session_key(session),
                to_json(&manifest),
                revision,
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// Drops shards whose `DSH_SHARDS` record names another owner (learned without a
    /// fenced write, e.g. while idle).
    async fn drop_shards_owned_elsewhere(&self) -> FleetResult<()> {
        let owned: Vec<(u32, OwnedShard)> = self
            .shards
            .lock()
            .iter()
            .map(|(shard, owned)| (*shard, *owned))
            .collect();
        for (shard, owned) in owned {
            let record = self.shard_record(shard).await?;
            let still_ours = record.as_ref().is_some_and(|(record, _)| {
                record.owner == self.config.node_id
                    && record.generation == self.config.generation
                    && record.epoch == owned.epoch
            });
            if !still_ours {
                self.lose_shard(shard, owned.epoch);
            }
        }
        Ok(())
    }

    async fn shard_record(&self, shard: u32) -> FleetResult<Option<(ShardRecord, u64)>> {
        let entry = self
            .coordinator
            .get(Bucket::Shards, &shard_key(shard))
            .await
            .map_err(backend)?;
        match entry {
            None => Ok(None),
            Some(KvEntry { value, revision }) => {
                Ok(Some((from_json(&value, "shard record")?, revision)))
            }
        }
    }

    /// Takes `shard` if its owner is not live; adopts it if the record already names this
    /// process (a takeover whose reply was lost). Returns whether the node now owns it.
    async fn try_take(&self, shard: u32, live: &HashMap<String, u64>) -> FleetResult<bool> {
        let record = self.shard_record(shard).await?;
        let stream = stream_name(shard);
        let subject = epoch_subject(shard);
        let last_marker = self
            .tail
            .last_on_subject(&stream, &subject)
            .await
            .map_err(backend)?;
        let marker_seq = last_marker.as_ref().map_or(0, |message| message.stream_seq);
        let marker: Option<EpochMarker> = last_marker
            .as_ref()
            .and_then(|message| from_json(&message.payload, "epoch marker").ok());
        let is_us = |owner: &str, generation: u64| {
            owner == self.config.node_id && generation == self.config.generation
        };
        if let Some((current, _)) = &record {
            if is_us(&current.owner, current.generation) {
                // Ours already: valid only if our marker is still the last one.
                if current.fence_seq == marker_seq {
                    self.own(shard, current.epoch, current.fence_seq);
                    return Ok(true);
                }
            } else if live.get(&current.owner) == Some(&current.generation) {
                return Ok(false);
            }
        }
        let recorded_epoch = record.as_ref().map_or(0, |(current, _)| current.epoch);
        let marker_epoch = marker.as_ref().map_or(0, |marker| marker.epoch);
        // A marker of ours that the record does not name yet (the CAS after it was lost):
        // reuse it rather than fence ourselves.
        let (epoch, fence_seq) = match &marker {
            Some(marker)
                if is_us(&marker.owner, marker.generation) && marker.epoch > recorded_epoch =>
            {
                (marker.epoch, marker_seq)
            }
            _ => {
                let epoch = recorded_epoch.max(marker_epoch) + 1;
                match self.publish_marker(shard, epoch, marker_seq).await {
                    Ok(ack) => (epoch, ack.stream_seq),
                    Err(BackendError::Fenced { .. } | BackendError::Unavailable { .. }) => {
                        return Ok(false)
                    }
                    Err(error) => return Err(backend(error)),
                }
            }
        };
        // The previous process of this node id held the shard at the epoch just before:
        // nobody else wrote its sessions since, so what that process acknowledged locally
        // is on this disk and may still be shipped.
        let from_previous_process = record.as_ref().is_some_and(|(current, _)| {
            current.owner == self.config.node_id
                && current.generation != self.config.generation
                && current.epoch + 1 == epoch
        });
        let value = to_json(&ShardRecord {
            owner: self.config.node_id.clone(),
            generation: self.config.generation,
            epoch,
            fence_seq,
        });
        let key = shard_key(shard);
        let written = match &record {
            None => self.coordinator.create(Bucket::Shards, &key, value).await,
            Some((_, revision)) => {
                self.coordinator
                    .update(Bucket::Shards, &key, value, *revision)
                    .await
            }
        };
        match written {
            Ok(_) => {
                self.own(shard, epoch, fence_seq);
                if from_previous_process {
                    self.inherited.lock().insert(shard, epoch);
                }
                bump(&self.metrics.takeovers, 1);
                Ok(true)
            }
            Err(BackendError::RevisionMismatch { .. }) => Ok(false),
            Err(BackendError::Unavailable { .. }) => {
                // The record may name this process now: no other node would take the shard
                // from a live owner, so this one settles it whatever the rendezvous says.
                self.reclaim.lock().insert(shard);
                Ok(false)
            }
            Err(error) => Err(backend(error)),
        }
    }

    async fn publish_marker(
        &self,
        shard: u32,
        epoch: u64,
        previous_seq: u64,
    ) -> Result<PublishAck, BackendError> {
        let subject = epoch_subject(shard);
        let marker = EpochMarker {
            epoch,
            owner: self.config.node_id.clone(),
            generation: self.config.generation,
        };
        self.tail
            .publish(TailPublish {
                subject: subject.clone(),
                payload: to_json(&marker).into(),
                msg_id: format!(
                    "e/{shard}/{epoch}/{}/{}",
                    self.config.node_id, self.config.generation
                ),
                fence: Some(Fence {
                    subject,
                    last_seq: previous_seq,
                }),
                headers: vec![("Dsh-Epoch".to_string(), epoch.to_string())],
            })
            .await
    }

    fn own(&self, shard: u32, epoch: u64, fence_seq: u64) {
        self.shards
            .lock()
            .insert(shard, OwnedShard { epoch, fence_seq });
    }

    /// Stops serving `shard` if it is still held at `epoch`. The record may still name
    /// this process (the node that fenced it lost its record write), so the next ticks
    /// settle it: take it back, or see it recorded for another node.
    /// A newer epoch exists, so the shard's backlog of `epoch` can never be shipped: it is
    /// dropped as lost.
    pub(crate) fn lose_shard(&self, shard: u32, epoch: u64) {
        let lost = {
            let mut shards = self.shards.lock();
            let held = shards.get(&shard).is_some_and(|owned| owned.epoch == epoch);
            if held {
                shards.remove(&shard);
                self.reclaim.lock().insert(shard);
                bump(&self.metrics.shards_lost, 1);
            }
            held
        };
        if lost {
            self.drop_shard_backlog(shard, epoch);
        }
    }

    /// `Moved` naming the owner `DSH_SHARDS` knows (if it can be read).
    async fn moved(&self, shard: u32) -> FleetError {
        let record = self.shard_record(shard).await.ok().flatten();
        FleetError::Moved {
            shard,
            owner: record.as_ref().map(|(record, _)| record.owner.clone()),
            epoch: record.map_or(0, |(record, _)| record.epoch),
        }
    }

    async fn owned(&self, session: &str) -> FleetResult<(u32, OwnedShard)> {
        if !valid_session_id(session) {
            return Err(FleetError::InvalidInput {
                reason: format!("session id {session:?}: 1..=200 bytes of [A-Za-z0-9_-]"),
            });
        }
        let shard = self.shard_of(session);
        let owned = self.shards.lock().get(&shard).copied();
        match owned {
            Some(owned) if !self.is_stopped() => Ok((shard, owned)),
            _ => Err(self.moved(shard).await),
        }
    }

    /// `Ok` if this node serves `session`'s shard now, else `Moved` naming the owner.
    pub async fn check_owner(&self, session: &str) -> FleetResult<()> {
        self.owned(session).await.map(|_| ())
    }

    pub(crate) fn slot(&self, session: &str) -> Arc<tokio::sync::Mutex<SessionSlot>> {
        self.sessions
            .lock()
            .entry(session.to_string())
            .or_default()
            .clone()
    }

    /// Creates a session: its manifest in `DSH_SESSIONS` (the create is the decision), then
    /// the local copy.
    pub async fn create_session(&self, session: &str, header: &str) -> FleetResult<()> {
        let (shard, owned) = self.owned(session).await?;
        valid_header(session, header)?;
        // F-09-58: nothing of the session is in the tail before its manifest exists, so a
        // rebuild replays from past the stream's last sequence now (read before the
        // manifest is written), not through the shard's whole group subject.
        let last_stream_seq = self
            .tail
            .last_seq(&stream_name(shard))
            .await
            .map_err(backend)?;
        let manifest = SessionManifest {
            format: MANIFEST_FORMAT,
            session: session.to_string(),
            shard,
            header: header.to_string(),
            epoch: owned.epoch,
            sealed_end: 0,
            tail_from_stream_seq: last_stream_seq + 1,
            runs: Vec::new(),
            tail_checkpoint: None,
        };
        let slot = self.slot(session);
        let mut slot = slot.lock().await;
        match self
            .coordinator
            .create(Bucket::Sessions, &session_key(session), to_json(&manifest))
            .await
        {
            Ok(_) => {}
            Err(BackendError::RevisionMismatch { .. }) => {
                return Err(FleetError::DuplicateSession {
                    session: session.to_string(),
                })
            }
            Err(error) => return Err(backend(error)),
        }
        *slot = SessionSlot::default();
        self.local.replace(session, header, &[])?;
        *slot = SessionSlot {
            validated_epoch: owned.epoch,
            header: header.to_string(),
            next_seq: 0,
            last_stream_seq,
            replicated_end: 0,
            checkpointed_stream_seq: 0,
        };
        Ok(())
    }

    /// Appends one batch: the local durable append, and the JetStream ack unless the
    /// node's mode (or a stalled stream under `degrade_to_local_after`) acks without it.
    pub async fn append(
        &self,
        session: &str,
        incoming: &[IncomingEvent],
    ) -> FleetResult<AppendAck> {
        if incoming.is_empty() {
            return Err(FleetError::InvalidInput {
                reason: "an empty batch".to_string(),
            });
        }
        let (shard, owned) = self.owned(session).await?;
        let route = self.route(shard);
        let slot = self.slot(session);
        let mut slot = slot.lock().await;
        if slot.validated_epoch != owned.epoch {
            self.rebuild(session, shard, owned, &mut slot).await?;
        }
        let (batch, payload) = Self::new_batch(session, owned, slot.next_seq, incoming)?;
        let tail_bytes = payload.len() as u64;
        if matches!(route, Route::Local | Route::Sealed) && !self.lease_valid() {
            // Only the tail fence would refuse a zombie, and a local ack skips it: ack
            // locally only while no other node can have taken the shard.
            return Err(self.moved(shard).await);
        }
        // From here on a failure leaves the outcome unknown: the slot is invalidated so that
        // the next access rebuilds the local copy from the replicated history.
        slot.validated_epoch = 0;
        let pending = self.local.submit(session, &batch.events)?;
        let acked = match route {
            Route::Replicated => {
                let message = tail_message(shard, owned, &batch, payload);
                self.append_replicated(shard, owned, batch, message, pending, &mut slot)
                    .await
            }
            Route::Degradable { after_ms } => {
                self.append_degradable(shard, owned, batch, pending, after_ms, &mut slot)
                    .await
            }
            Route::Local | Route::Sealed => {
                wait_local(pending).await?;
                self.push_backlog(shard, owned, batch.clone(), true);
                Ok(self.ack_locally(shard, owned, &batch, &mut slot))
            }
        };
        if acked.is_ok() {
            self.seal_triggers
                .appended(session, tail_bytes, self.clock.now_ms());
        }
        acked
    }

    /// The batch of `incoming` at `first_seq` and its encoded tail payload (refused above
    /// [`MAX_TAIL_PAYLOAD_BYTES`]).
    fn new_batch(
        session: &str,
        owned: OwnedShard,
        first_seq: u64,
        incoming: &[IncomingEvent],
    ) -> FleetResult<(TailBatch, Vec<u8>)> {
        let events: Vec<Event> = incoming
            .iter()
            .enumerate()
            .map(|(offset, event)| Event {
                seq: first_seq + offset as u64,
                time: event.time.unwrap_or_else(dshdb::store::now_millis),
                event_type: event.event_type.clone(),
                data: event.data.clone(),
                envelope: event.envelope.clone(),
                flags: event.flags,
            })
            .collect();
        let batch = TailBatch {
            session: session.to_string(),
            epoch: owned.epoch,
            events,
        };
        let payload = batch.encode();
        if payload.len() > MAX_TAIL_PAYLOAD_BYTES {
            return Err(FleetError::InvalidInput {
                reason: format!(
                    "batch of {} bytes (limit {MAX_TAIL_PAYLOAD_BYTES}); spill large content",
                    payload.len()
                ),
            });
        }
        Ok((batch, payload))
    }

    /// Acknowledges a batch durable locally and waiting in the backlog.
    fn ack_locally(
        &self,
        shard: u32,
        owned: OwnedShard,
        batch: &TailBatch,
        slot: &mut SessionSlot,
    ) -> AppendAck {
        let (first_seq, end_seq) = (batch.first_seq(), batch.end_seq());
        self.count_local_ack(shard, end_seq - first_seq);
        slot.validated_epoch = owned.epoch;
        slot.next_seq = end_seq;
        bump(&self.metrics.appends_acked, 1);
        bump(&self.metrics.events_acked, end_seq - first_seq);
        AppendAck {
            first_seq,
            end_seq,
            stream_seq: 0,
            duplicate: false,
            replicated: false,
            epoch: owned.epoch,
        }
    }

    /// `replicated` with `degrade_to_local_after`: the batch joins the session's backlog,
    /// which the append ships in order (its own batch last) within `after_ms`. Shipped: a
    /// replicated ack. Stalled (no definitive answer in time): a local ack, the stream is
    /// marked stalled (its next appends ack locally at once) and the background replicator
    /// ships the backlog. Fenced: `Moved`.
    async fn append_degradable(
        &self,
        shard: u32,
        owned: OwnedShard,
        batch: TailBatch,
        pending: Box<dyn LocalPending>,
        after_ms: u64,
        slot: &mut SessionSlot,
    ) -> FleetResult<AppendAck> {
        self.push_backlog(shard, owned, batch.clone(), false);
        let drained = tokio::time::timeout(
            Duration::from_millis(after_ms),
            self.drain_session(&batch.session, slot),
        )
        .await;
        let local = wait_local(pending).await;
        match drained {
            Ok(Shipped::Lost) => return Err(self.moved(shard).await),
            // The backlog emptied without this batch shipped: a fence on another write of
            // the shard dropped it (the shard is lost).
            Ok(Shipped::Empty | Shipped::One { .. }) if slot.replicated_end < batch.end_seq() => {
                return Err(self.moved(shard).await)
            }
            Ok(shipped @ (Shipped::Empty | Shipped::One { .. })) => {
                local?;
                let (first_seq, end_seq) = (batch.first_seq(), batch.end_seq());
                slot.validated_epoch = owned.epoch;
                slot.next_seq = end_seq;
                bump(&self.metrics.appends_acked, 1);
                bump(&self.metrics.events_acked, end_seq - first_seq);
                return Ok(AppendAck {
                    first_seq,
                    end_seq,
                    stream_seq: slot.last_stream_seq,
                    duplicate: matches!(
                        shipped,
                        Shipped::One {
                            duplicate: true,
                            ..
                        }
                    ),
                    replicated: true,
                    epoch: owned.epoch,
                });
            }
            Ok(Shipped::Stalled) | Err(_) => {}
        }
        self.note_stalled(crate::shard::stream_index(shard));
        local?;
        if !self.lease_valid() {
            // The batch stays in the backlog (shipped if the fence still holds), but a
            // local ack now could be a zombie's.
            bump(&self.metrics.not_acknowledged, 1);
            return Err(FleetError::NotAcknowledged {
                reason: "the tail stalled and the lease may have expired".to_string(),
            });
        }
        self.mark_acked(&batch.session, batch.first_seq(), batch.end_seq());
        Ok(self.ack_locally(shard, owned, &batch, slot))
    }

    /// `replicated` without a degrade policy: the tail ack, then the acknowledgement.
    async fn append_replicated(
        &self,
        shard: u32,
        owned: OwnedShard,
        batch: TailBatch,
        message: TailPublish,
        pending: Box<dyn LocalPending>,
        slot: &mut SessionSlot,
    ) -> FleetResult<AppendAck> {
        let (first_seq, end_seq) = (batch.first_seq(), batch.end_seq());
        let published = self.publish_grouped(shard, owned, message).await;
        let local = wait_local(pending).await;
        let ack = match published {
            Ok(ack) if ack.duplicate => match self.check_deduplicated(shard, &batch, ack).await {
                Ok(()) => ack,
                Err(error) => {
                    bump(&self.metrics.not_acknowledged, 1);
                    return Err(error);
                }
            },
            Ok(ack) => ack,
            Err(BackendError::Fenced { .. }) => {
                bump(&self.metrics.fenced_writes, 1);
                self.lose_shard(shard, owned.epoch);
                return Err(self.moved(shard).await);
            }
            Err(error) => {
                bump(&self.metrics.not_acknowledged, 1);
                return Err(FleetError::NotAcknowledged {
                    reason: error.to_string(),
                });
            }
        };
        local?;
        if ack.duplicate {
            bump(&self.metrics.dedup_hits, 1);
        }
        slot.validated_epoch = owned.epoch;
        slot.next_seq = end_seq;
        slot.replicated_end = end_seq;
        slot.last_stream_seq = ack.stream_seq;
        bump(&self.metrics.appends_acked, 1);
        bump(&self.metrics.events_acked, end_seq - first_seq);
        Ok(AppendAck {
            first_seq,
            end_seq,
            stream_seq: ack.stream_seq,
            duplicate: ack.duplicate,
            replicated: true,
            epoch: owned.epoch,
        })
    }

    /// Whether the message a deduplicated publish was deduplicated against carries `batch`
    /// (alone on the session's subject, or in a group message of the shard).
    pub(crate) async fn duplicate_carries(
        &self,
        shard: u32,
        batch: &TailBatch,
        ack: PublishAck,
    ) -> Result<bool, BackendError> {
        let stored = self
            .tail
            .message_at(&stream_name(shard), ack.stream_seq)
            .await?;
        Ok(stored.is_some_and(|stored| {
            let subject_fits = stored.subject == session_subject(&batch.session, shard)
                || stored.subject == group_subject(shard);
            subject_fits
                && decode_tail_message(&stored.payload)
                    .is_ok_and(|batches| batches.iter().any(|stored| stored == batch))
        }))
    }

    /// A deduplicated publish is acknowledged only if the message it was deduplicated
    /// against carries this batch (alone on the session's subject, or in a group message of
    /// the shard): a different batch under the same msg id (same session, first seq and
    /// epoch) means the local copy missed an acknowledged batch, and acknowledging this one
    /// would hand out a seq twice.
    async fn check_deduplicated(
        &self,
        shard: u32,
        batch: &TailBatch,
        ack: PublishAck,
    ) -> FleetResult<()> {
        let carries_batch = self
            .duplicate_carries(shard, batch, ack)
            .await
            .map_err(|error| FleetError::NotAcknowledged {
                reason: format!(
                    "checking the duplicate of {}/{}: {error}",
                    batch.session,
                    batch.first_seq()
                ),
            })?;
        if carries_batch {
            Ok(())
        } else {
            Err(FleetError::NotAcknowledged {
                reason: format!(
                    "the message at stream seq {} deduplicated against does not carry batch \
                     {}/{} of epoch {}: the local copy is behind the replicated history",
                    ack.stream_seq,
                    batch.session,
                    batch.first_seq(),
                    batch.epoch
                ),
            })
        }
    }

    /// Publishes a fenced session write, grouped with the other queued writes of the
    /// shard's tail stream. nats-server (2.15.1, clustered) refuses a write whose
    /// expected-last-subject-sequence check names a subject that another such write is still
    /// in flight on, with the same "wrong last sequence" answer as a failed check (measured:
    /// of N concurrent writes fenced on one shard's epoch subject, N - 1 are refused). So the
    /// node sends one fenced publish per stream at a time (so at most one per shard); the
    /// writes that arrive meanwhile wait in the stream's queue and go out together as the
    /// next publish: an atomic group in which each session batch stays its own message on
    /// its own subject, fenced on its shard's epoch.
    pub(crate) async fn publish_grouped(
        &self,
        shard: u32,
        owned: OwnedShard,
        message: TailPublish,
    ) -> Result<PublishAck, BackendError> {
        let stream = crate::shard::stream_index(shard);
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (reply, turn) = tokio::sync::oneshot::channel();
        let lead_now = {
            let mut queues = self.stream_queues.lock();
            let queue = queues.entry(stream).or_default();
            queue.queued.push_back(QueuedWrite {
                ticket,
                shard,
                owned,
                message,
                reply: Some(reply),
            });
            !std::mem::replace(&mut queue.leading, true)
        };
        if !lead_now {
            match turn.await {
                Ok(Turn::Done(outcome)) => return outcome,
                Ok(Turn::Lead) => {}
                Err(_) => {
                    return Err(BackendError::Unavailable {
                        reason: "the stream's publishing task ended".to_string(),
                    })
                }
            }
        }
        let mut group = GroupTurn {
            node: self,
            stream,
            group: self.take_group(stream),
            finished: false,
        };
        // The messages move to the publish: the turn keeps only what answers each write.
        let writes: Vec<GroupWrite> = group
            .group
            .iter_mut()
            .map(|write| GroupWrite {
                shard: write.shard,
                owned: write.owned,
                message: std::mem::take(&mut write.message),
            })
            .collect();
        let started = std::time::Instant::now();
        let outcomes = self.publish_group(writes).await;
        bump(
            &self.metrics.publish_micros,
            u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        );
        group.finish(ticket, outcomes)
    }

    /// The writes at the front of the stream's queue that go out together: one fence per
    /// shard (a write made under an older epoch of a shard waits for the next group, and is
    /// refused), within [`MAX_GROUP_MESSAGES`] and [`MAX_GROUP_BYTES`].
    fn take_group(&self, stream: u32) -> Vec<QueuedWrite> {
        let mut queues = self.stream_queues.lock();
        let Some(queue) = queues.get_mut(&stream) else {
            return Vec::new();
        };
        let mut group: Vec<QueuedWrite> = Vec::new();
        let mut fences: HashMap<u32, u64> = HashMap::new();
        let mut bytes = 0;
        while let Some(next) = queue.queued.front() {
            let same_fence = fences
                .get(&next.shard)
                .is_none_or(|fence_seq| *fence_seq == next.owned.fence_seq);
            let next_bytes = next.message.payload.len() + GROUP_ENTRY_BYTES;
            let fits = group.is_empty()
                || (same_fence
                    && group.len() < MAX_GROUP_MESSAGES
                    && bytes + next_bytes <= MAX_GROUP_BYTES);
            if !fits {
                break;
            }
            bytes += next_bytes;
            fences.insert(next.shard, next.owned.fence_seq);
            if let Some(write) = queue.queued.pop_front() {
                group.push(write);
            }
        }
        group
    }

    /// Ends a task's turn at the stream: the first queued write whose task still waits
    /// sends the next group; with none, the stream is idle.
    fn hand_on_turn(&self, stream: u32) {
        let mut queues = self.stream_queues.lock();
        let Some(queue) = queues.get_mut(&stream) else {
            return;
        };
        while let Some(front) = queue.queued.front_mut() {
            let told = front
                .reply
                .take()
                .is_some_and(|reply| reply.send(Turn::Lead).is_ok());
            if told {
                return;
            }
            // Its task is gone (cancelled): nobody waits for this write.
            queue.queued.pop_front();
        }
        queue.leading = false;
    }

    /// The messages that carry a group's writes: a shard with one write sends it alone on
    /// its session subject (F-09-20); a shard with several sends them as one group message
    /// on the shard's group subject (F-09-23), fenced like any write of the shard. Its msg
    /// id names its content (blake3), so a retry of the same group is deduplicated.
    fn outgoing(writes: &[GroupWrite]) -> Vec<Outgoing> {
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (index, write) in writes.iter().enumerate() {
            by_shard.entry(write.shard).or_default().push(index);
        }
        by_shard
            .into_iter()
            .map(|(shard, indices)| {
                let first = &writes[indices[0]];
                if indices.len() == 1 {
                    return Outgoing {
                        shard,
                        owned: first.owned,
                        message: first.message.clone(),
                        writes: indices,
                    };
                }
                let payloads: Vec<&[u8]> = indices
                    .iter()
                    .map(|index| writes[*index].message.payload.as_ref())
                    .collect();
                let payload = TailGroup::encode_from(shard, first.owned.epoch, &payloads);
                let digest = blake3::hash(&payload).to_hex();
                Outgoing {
                    shard,
                    owned: first.owned,
                    message: TailPublish {
                        subject: group_subject(shard),
                        msg_id: format!("g/{shard}/e{}/{}", first.owned.epoch, &digest[..32]),
                        payload: payload.into(),
                        fence: first.message.fence.clone(),
                        headers: vec![
                            ("Dsh-Epoch".to_string(), first.owned.epoch.to_string()),
                            ("Dsh-Batches".to_string(), indices.len().to_string()),
                        ],
                    },
                    writes: indices,
                }
            })
            .collect()
    }

    /// Sends one group of writes of a stream: one message per shard ([`Node::outgoing`]),
    /// a single message as a plain fenced publish, several as one atomic publish.
    async fn publish_group(
        &self,
        writes: Vec<GroupWrite>,
    ) -> Vec<Result<PublishAck, BackendError>> {
        let outgoing = Self::outgoing(&writes);
        bump(&self.metrics.fenced_publishes, 1);
        bump(&self.metrics.published_messages, outgoing.len() as u64);
        bump(&self.metrics.published_batches, writes.len() as u64);
        let message_outcomes = if let [single] = outgoing.as_slice() {
            vec![
                self.publish_fenced(single.shard, single.owned, &single.message)
                    .await,
            ]
        } else {
            self.publish_atomic(&outgoing).await
        };
        let mut outcomes: Vec<Result<PublishAck, BackendError>> = vec![
            Err(BackendError::Other {
                reason: "a write of the group was not sent".to_string(),
            });
            writes.len()
        ];
        for (message, outcome) in outgoing.iter().zip(message_outcomes) {
            for index in &message.writes {
                outcomes[*index] = outcome.clone();
            }
        }
        outcomes
    }

    /// Sends several messages as atomic publishes. A publish refused by a fence loses the
    /// messages of the shards whose last epoch marker is no longer this node's (they are
    /// fenced); the others go out again (the refusal was a collision with another node's
    /// marker write in flight, or came from a lost shard's message). A publish refused for a
    /// duplicate message id (a retry of messages stored before) goes out again one message
    /// at a time, where each duplicate is acknowledged with its stored sequence and checked
    /// by the caller.
    async fn publish_atomic(&self, outgoing: &[Outgoing]) -> Vec<Result<PublishAck, BackendError>> {
        let mut outcomes: Vec<Option<Result<PublishAck, BackendError>>> =
            vec![None; outgoing.len()];
        for _ in 0..FENCE_COLLISION_ATTEMPTS {
            let open: Vec<usize> = (0..outgoing.len())
                .filter(|index| outcomes[*index].is_none())
                .collect();
            if open.is_empty() {
                break;
            }
            let messages: Vec<TailPublish> = open
                .iter()
                .map(|index| outgoing[*index].message.clone())
                .collect();
            match self.publish_batch_with_retries(messages).await {
                Ok(acks) => {
                    for (index, ack) in open.iter().zip(acks) {
                        outcomes[*index] = Some(Ok(ack));
                    }
                }
                Err(fenced @ BackendError::Fenced { .. }) => {
                    let lost = match self.lost_shards(outgoing, &open).await {
                        Ok(lost) => lost,
                        Err(error) => {
                            for index in &open {
                                outcomes[*index] = Some(Err(error.clone()));
                            }
                            break;
                        }
                    };
                    if lost.is_empty() {
                        bump(&self.metrics.fence_collisions, 1);
                        tokio::time::sleep(FENCE_COLLISION_PAUSE).await;
                    }
                    for index in &open {
                        if lost.contains(&outgoing[*index].shard) {
                            outcomes[*index] = Some(Err(fenced.clone()));
                        }
                    }
                }
                Err(BackendError::DuplicateInBatch { .. }) => {
                    bump(&self.metrics.group_duplicate_fallbacks, 1);
                    for index in &open {
                        let message = &outgoing[*index];
                        outcomes[*index] = Some(
                            self.publish_fenced(message.shard, message.owned, &message.message)
                                .await,
                        );
                    }
                }
                Err(error) => {
                    for index in &open {
                        outcomes[*index] = Some(Err(error.clone()));
                    }
                }
            }
        }
        outcomes
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| {
                    Err(BackendError::Unavailable {
                        reason: format!(
                            "an atomic publish refused {FENCE_COLLISION_ATTEMPTS} times while \
                             its fences held"
                        ),
                    })
                })
            })
            .collect()
    }

    /// The shards among the messages `open` whose last epoch marker is no longer this
    /// node's.
    async fn lost_shards(
        &self,
        outgoing: &[Outgoing],
        open: &[usize],
    ) -> Result<BTreeSet<u32>, BackendError> {
        let shards: BTreeMap<u32, OwnedShard> = open
            .iter()
            .map(|index| (outgoing[*index].shard, outgoing[*index].owned))
            .collect();
        let mut lost = BTreeSet::new();
        for (shard, owned) in shards {
            if !self.fence_still_holds(shard, owned).await? {
                lost.insert(shard);
            }
        }
        Ok(lost)
    }

    /// Whether a refusal by the fence may have been a collision with another node's
    /// marker write in flight: the shard's last epoch marker is still this node's.
    async fn fence_still_holds(&self, shard: u32, owned: OwnedShard) -> Result<bool, BackendError> {
        let marker = self
            .tail
            .last_on_subject(&stream_name(shard), &epoch_subject(shard))
            .await?;
        Ok(marker.map(|marker| marker.stream_seq) == Some(owned.fence_seq))
    }

    /// Publishes one fenced write; a refusal means the shard is lost only if the shard's
    /// last epoch marker is no longer this node's, otherwise nothing was stored and the
    /// write is sent again.
    async fn publish_fenced(
        &self,
        shard: u32,
        owned: OwnedShard,
        message: &TailPublish,
    ) -> Result<PublishAck, BackendError> {
        for _ in 0..FENCE_COLLISION_ATTEMPTS {
            match self.publish_with_retries(message).await {
                Err(fenced @ BackendError::Fenced { .. }) => {
                    if !self.fence_still_holds(shard, owned).await? {
                        return Err(fenced);
                    }
                    bump(&self.metrics.fence_collisions, 1);
                    tokio::time::sleep(FENCE_COLLISION_PAUSE).await;
                }
                other => return other,
            }
        }
        Err(BackendError::Unavailable {
            reason: format!(
                "{}: refused {FENCE_COLLISION_ATTEMPTS} times while the fence held",
                message.msg_id
            ),
        })
    }

    /// Sends an atomic group, again as a whole (same message ids) while its outcome is
    /// unknown.
    async fn publish_batch_with_retries(
        &self,
        messages: Vec<TailPublish>,
    ) -> Result<Vec<PublishAck>, BackendError> {
        self.retrying_unavailable(|| self.tail.publish_batch(messages.clone()))
            .await
    }

    /// Publishes, retrying with the same msg id while the answer is unknown.
    async fn publish_with_retries(
        &self,
        message: &TailPublish,
    ) -> Result<PublishAck, BackendError> {
        self.retrying_unavailable(|| self.tail.publish(message.clone()))
            .await
    }

    /// Runs `send` up to `publish_attempts` times while it answers `Unavailable` (the
    /// outcome unknown: the same message ids make a repeat safe), with the configured
    /// backoff between attempts; any other answer is final.
    async fn retrying_unavailable<Answer, F, Fut>(&self, send: F) -> Result<Answer, BackendError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<Answer, BackendError>>,
    {
        let attempts = self.config.publish_attempts.max(1);
        let mut last_error = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                bump(&self.metrics.publish_retries, 1);
                if self.config.publish_retry_backoff_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(self.config.publish_retry_backoff_ms))
                        .await;
                }
            }
            match send().await {
                Ok(answer) => return Ok(answer),
                Err(error @ BackendError::Unavailable { .. }) => last_error = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last_error.unwrap_or(BackendError::Unavailable {
            reason: "no attempt made".to_string(),
        }))
    }

    /// The session's events `from..to`, from the local copy once it is checked.
    pub async fn read(&self, session: &str, from: u64, to: u64) -> FleetResult<Vec<Event>> {
        let (shard, owned) = self.owned(session).await?;
        let slot = self.slot(session);
        let mut slot = slot.lock().await;
        if slot.validated_epoch != owned.epoch {
            self.rebuild(session, shard, owned, &mut slot).await?;
        }
        self.local.read(session, from, to.min(slot.next_seq))
    }

    /// The session's header (checked like a read).
    pub async fn header(&self, session: &str) -> FleetResult<String> {
        let (shard, owned) = self.owned(session).await?;
        let slot = self.slot(session);
        let mut slot = slot.lock().await;
        if slot.validated_epoch != owned.epoch {
            self.rebuild(session, shard, owned, &mut slot).await?;
        }
        Ok(slot.header.clone())
    }

    /// Reads the manifest, claiming it for `owned.epoch` (CAS) when an older epoch wrote it.
    async fn claim_manifest(
        &self,
        session: &str,
        shard: u32,
        owned: OwnedShard,
    ) -> FleetResult<(SessionManifest, u64)> {
        let key = session_key(session);
        for _ in 0..MANIFEST_CAS_ATTEMPTS {
            let entry = self
                .coordinator
                .get(Bucket::Sessions, &key)
                .await
                .map_err(backend)?
                .ok_or_else(|| FleetError::UnknownSession {
                    session: session.to_string(),
                })?;
            let mut manifest: SessionManifest = from_json(&entry.value, "session manifest")?;
            if manifest.epoch > owned.epoch {
                self.lose_shard(shard, owned.epoch);
                return Err(self.moved(shard).await);
            }
            if manifest.epoch == owned.epoch {
                return Ok((manifest, entry.revision));
            }
            manifest.epoch = owned.epoch;
            match self
                .coordinator
                .update(Bucket::Sessions, &key, to_json(&manifest), entry.revision)
                .await
            {
                Ok(revision) => return Ok((manifest, revision)),
                Err(BackendError::RevisionMismatch { .. }) => continue,
                Err(error) => return Err(backend(error)),
            }
        }
        Err(FleetError::NotAcknowledged {
            reason: format!("manifest of {session} kept changing"),
        })
    }

    /// Rebuilds the session from its sealed runs and its tail, checking every record's CRC,
    /// blake3 of every run and seq continuity; makes the local copy equal to it.
    async fn rebuild(
        &self,
        session: &str,
        shard: u32,
        owned: OwnedShard,
        slot: &mut SessionSlot,
    ) -> FleetResult<()> {
        // Batches of older epochs can never be shipped (a newer marker fences them); the
        // current epoch's must be shipped (or sealed) first, or the rebuild would drop
        // acknowledged events that only this node holds.
        self.drop_stale_backlog(session, owned.epoch);
        if self.holds_unreplicated(session) {
            return Err(FleetError::NotAcknowledged {
                reason: format!(
                    "{session}: acknowledged batches wait in the backlog; the session is \
                     served again once they are shipped or sealed"
                ),
            });
        }
        let (manifest, _) = self.claim_manifest(session, shard, owned).await?;
        let mut events = self.load_runs(session, &manifest).await?;
        let tail_from = manifest.tail_from_stream_seq.max(1);
        let messages = self
            .replay_tail(session, shard, tail_from, slot.last_stream_seq)
            .await?;
        let mut last_stream_seq = tail_from - 1;
        for message in messages {
            let rebuild_error = |reason: String, from: u64| FleetError::Rebuild {
                session: session.to_string(),
                from,
                reason,
            };
            let batches = decode_tail_message(&message.payload).map_err(|error| {
                rebuild_error(
                    format!("tail message at stream seq {}: {error}", message.stream_seq),
                    events.len() as u64,
                )
            })?;
            let in_group = message.subject == group_subject(shard);
            if !in_group && batches.iter().any(|batch| batch.session != session) {
                return Err(rebuild_error(
                    format!(
                        "tail message at stream seq {} names another session",
                        message.stream_seq
                    ),
                    events.len() as u64,
                ));
            }
            let mut carried = false;
            for batch in batches.into_iter().filter(|batch| batch.session == session) {
                carried = true;
                for event in batch.events {
                    Self::rebuild_one(&mut events, event)
                        .map_err(|(reason, from)| rebuild_error(reason, from))?;
                }
            }
            if carried {
                last_stream_seq = message.stream_seq;
            }
        }
        Self::check_checkpoint(session, &manifest, events.len() as u64, last_stream_seq)?;
        let length = events.len() as u64;
        let inherited = self.inherited_excess(session, shard, owned, &events)?;
        let next_seq = length + inherited.len() as u64;
        let local_matches = self.local.length(session) == Some(next_seq)
            && (!inherited.is_empty() || self.local.read(session, 0, length)? == events);
        if !local_matches {
            self.local.replace(session, &manifest.header, &events)?;
        }
        self.queue_inherited(session, shard, owned, inherited);
        *slot = SessionSlot {
            validated_epoch: owned.epoch,
            header: manifest.header,
            next_seq,
            last_stream_seq,
            replicated_end: length,
            checkpointed_stream_seq: manifest
                .tail_checkpoint
                .map_or(0, |checkpoint| checkpoint.stream_seq),
        };
        bump(&self.metrics.rebuilds, 1);
        bump(&self.metrics.rebuilt_events, length);
        Ok(())
    }

    /// The events of the local copy past the replicated `history`, when they are what this
    /// node id's previous process acknowledged locally and never shipped: the shard was
    /// taken straight from that process, the node acks locally (`local`, `sealed`, or a
    /// degrade policy), and the local copy extends the history exactly. Otherwise none: the
    /// local copy is made equal to the history, as before.
    fn inherited_excess(
        &self,
        session: &str,
        shard: u32,
        owned: OwnedShard,
        history: &[Event],
    ) -> FleetResult<Vec<Event>> {
        let config = self.config();
        let acks_locally =
            config.mode != DurabilityMode::Replicated || config.degrade_to_local_after_ms.is_some();
        if !acks_locally || self.inherited.lock().get(&shard) != Some(&owned.epoch) {
            return Ok(Vec::new());
        }
        let replicated = history.len() as u64;
        let Some(local_length) = self.local.length(session) else {
            return Ok(Vec::new());
        };
        if local_length <= replicated || self.local.read(session, 0, replicated)? != history {
            return Ok(Vec::new());
        }
        self.local.read(session, replicated, local_length)
    }

    /// Queues inherited events ([`Node::inherited_excess`]) as acknowledged backlog batches
    /// of at most [`MAX_INHERITED_BATCH_BYTES`] each (estimated), shipped (or sealed) as the
    /// session's own backlog is.
    fn queue_inherited(&self, session: &str, shard: u32, owned: OwnedShard, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        bump(&self.metrics.inherited_events, events.len() as u64);
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        for event in events {
            let bytes = event.data.len() + event.event_type.len() + INHERITED_EVENT_OVERHEAD_BYTES;
            if !batch.is_empty() && batch_bytes + bytes > MAX_INHERITED_BATCH_BYTES {
                self.push_inherited(session, shard, owned, std::mem::take(&mut batch));
                batch_bytes = 0;
            }
            batch_bytes += bytes;
            batch.push(event);
        }
        self.push_inherited(session, shard, owned, batch);
    }

    fn push_inherited(&self, session: &str, shard: u32, owned: OwnedShard, events: Vec<Event>) {
        let batch = TailBatch {
            session: session.to_string(),
            epoch: owned.epoch,
            events,
        };
        self.push_backlog(shard, owned, batch, true);
    }

    /// The tail messages that may carry the session's batches from `tail_from` on: its own
    /// subject and its shard's group subject, merged in stream order. Each replay must
    /// reach its subject's last message, and together they must reach the last message
    /// this node saw acknowledged for the session: a replay served from a state that lags
    /// (a stream that just elected its leader) would rebuild a shorter history and hand out
    /// seqs again.
    async fn replay_tail(
        &self,
        session: &str,
        shard: u32,
        tail_from: u64,
        acknowledged_stream_seq: u64,
    ) -> FleetResult<Vec<TailMessage>> {
        let stream = stream_name(shard);
        let mut merged = Vec::new();
        let mut replayed_to = tail_from - 1;
        for subject in [session_subject(session, shard), group_subject(shard)] {
            let last_on_subject = self
                .tail
                .last_on_subject(&stream, &subject)
                .await
                .map_err(backend)?
                .map_or(0, |message| message.stream_seq);
            let messages = self
                .tail
                .replay(&stream, &subject, tail_from)
                .await
                .map_err(backend)?;
            let reached = messages
                .last()
                .map_or(tail_from - 1, |message| message.stream_seq);
            if reached < last_on_subject {
                return Err(backend(BackendError::Unavailable {
                    reason: format!(
                        "replay of {subject} for {session} ended at stream seq {reached}, \
                         before its last message {last_on_subject}"
                    ),
                }));
            }
            replayed_to = replayed_to.max(reached);
            merged.extend(messages);
        }
        if replayed_to < acknowledged_stream_seq {
            return Err(backend(BackendError::Unavailable {
                reason: format!(
                    "replay of {session} ended at stream seq {replayed_to}, before \
                     {acknowledged_stream_seq}"
                ),
            }));
        }
        merged.sort_by_key(|message| message.stream_seq);
        Ok(merged)
    }

    /// Adds one replayed event to the history rebuilt so far: the next seq is appended, a
    /// seq already rebuilt (a sealed range not yet purged, a batch stored twice) must be the
    /// same event, and a gap is an error (reason, first missing seq).
    fn rebuild_one(events: &mut Vec<Event>, event: Event) -> Result<(), (String, u64)> {
        let have = events.len() as u64;
        if event.seq < have {
            let index = usize::try_from(event.seq).unwrap_or(usize::MAX);
            if events.get(index) != Some(&event) {
                return Err(("two different events with one seq".to_string(), event.seq));
            }
        } else if event.seq == have {
            events.push(event);
        } else {
            return Err((format!("gap: seq {} follows {}", event.seq, have), have));
        }
        Ok(())
    }

    /// A rebuilt history must reach the manifest's tail checkpoint: events and the stream
    /// sequence of the last message carrying them. Shorter means acknowledged events are
    /// missing from the replicated tail (a replica that drops a corrupted message serves the
    /// read silently): refused loudly, naming the session and the missing seqs.
    fn check_checkpoint(
        session: &str,
        manifest: &SessionManifest,
        rebuilt_end: u64,
        last_stream_seq: u64,
    ) -> FleetResult<()> {
        let Some(checkpoint) = manifest.tail_checkpoint else {
            return Ok(());
        };
        if rebuilt_end >= checkpoint.end_seq && last_stream_seq >= checkpoint.stream_seq {
            return Ok(());
        }
        Err(FleetError::Rebuild {
            session: session.to_string(),
            from: rebuilt_end,
            reason: format!(
                "the replicated tail ends at seq {rebuilt_end} (stream seq {last_stream_seq}) but \
                 the manifest records seqs up to {} acknowledged at stream seq {}: seqs \
                 {rebuilt_end}..{} are missing from the tail",
                checkpoint.end_seq, checkpoint.stream_seq, checkpoint.end_seq
            ),
        })
    }

    async fn load_runs(
        &self,
        session: &str,
        manifest: &SessionManifest,
    ) -> FleetResult<Vec<Event>> {
        let mut runs = manifest.runs.clone();
        runs.sort_by_key(|run| run.first_seq);
        let mut events: Vec<Event> = Vec::new();
        for run in runs {
            let failure = |reason: String| FleetError::Rebuild {
                session: session.to_string(),
                from: run.first_seq,
                reason: format!(
                    "run {} (seqs {}..={}): {reason}",
                    run.key, run.first_seq, run.last_seq
                ),
            };
            let bytes = self
                .cold
                .get(&run.key)
                .await
                .map_err(backend)?
                .ok_or_else(|| failure("object missing".to_string()))?;
            if blake3_hex(&bytes) != run.blake3 {
                return Err(failure("blake3 mismatch".to_string()));
            }
            let object = RunObject::decode(&bytes).map_err(|error| failure(error.to_string()))?;
            let first = object.events.first().map(|event| event.seq);
            let last = object.events.last().map(|event| event.seq);
            if object.session != session
                || first != Some(run.first_seq)
                || last != Some(run.last_seq)
                || run.first_seq != events.len() as u64
            {
                return Err(failure("does not continue the sealed history".to_string()));
            }
            events.extend(object.events);
        }
        if events.len() as u64 != manifest.sealed_end {
            return Err(FleetError::Rebuild {
                session: session.to_string(),
                from: events.len() as u64,
                reason: format!(
                    "runs end at {}, manifest says {}",
                    events.len(),
                    manifest.sealed_end
                ),
            });
        }
        Ok(events)
    }

    /// Seals the session's unsealed acknowledged events into a cold run.
    pub async fn seal(&self, session: &str) -> FleetResult<SealReport> {
        self.seal_until(session, SealStep::PurgeTail).await
    }

    /// A seal that stops after `last_step` (for the model tests' crashes between steps).
    #[doc(hidden)]
    pub async fn seal_until(&self, session: &str, last_step: SealStep) -> FleetResult<SealReport> {
        let (shard, owned) = self.owned(session).await?;
        let slot = self.slot(session);
        let mut slot = slot.lock().await;
        if slot.validated_epoch != owned.epoch {
            self.rebuild(session, shard, owned, &mut slot).await?;
        }
        let (mut manifest, revision) = self.claim_manifest(session, shard, owned).await?;
        let mut report = SealReport::default();
        if manifest.sealed_end >= slot.next_seq {
            self.seal_triggers.settled(session);
            return Ok(report);
        }
        let events = self
            .local
            .read(session, manifest.sealed_end, slot.next_seq)?;
        crate::wire::check_contiguous(&events, manifest.sealed_end, "local events")?;
        let first_seq = manifest.sealed_end;
        let last_seq = slot.next_seq - 1;
        let bytes = RunObject {
            session: session.to_string(),
            events,
        }
        .encode()?;
        let key = run_key(session, first_seq, last_seq, owned.epoch);
        let digest = blake3_hex(&bytes);
        report.run_bytes = bytes.len() as u64;
        report.run_key = Some(key.clone());
        self.cold
            .put_immutable(&key, bytes)
            .await
            .map_err(backend)?;
        if last_step == SealStep::PutRun {
            return Ok(report);
        }
        let stored = self.cold.get(&key).await.map_err(backend)?;
        if stored.as_deref().map(blake3_hex) != Some(digest.clone()) {
            return Err(FleetError::Corrupt {
                what: "run object",
                reason: format!("{key} reads back different bytes"),
            });
        }
        if last_step == SealStep::VerifyRun {
            return Ok(report);
        }
        manifest.runs.push(RunRef {
            key,
            first_seq,
            last_seq,
            bytes: report.run_bytes,
            blake3: digest,
        });
        manifest.sealed_end = slot.next_seq;
        // Never backwards: a session with no tail message yet starts past its creation.
        manifest.tail_from_stream_seq = manifest.tail_from_stream_seq.max(slot.last_stream_seq + 1);
        manifest.tail_checkpoint = Some(TailCheckpoint {
            end_seq: slot.next_seq,
            stream_seq: slot.last_stream_seq,
        });
        match self
            .coordinator
            .update(
                Bucket::Sessions,
                &session_key(session),
                to_json(&manifest),
                revision,
            )
            .await
        {
            Ok(_) => {}
            Err(BackendError::RevisionMismatch { .. }) => {
                // A newer owner claimed the manifest: we are stale.
                slot.validated_epoch = 0;
                return Err(self.moved(shard).await);
            }
            Err(error) => return Err(backend(error)),
        }
        slot.checkpointed_stream_seq = slot.last_stream_seq;
        slot.replicated_end = slot.replicated_end.max(manifest.sealed_end);
        self.drop_sealed_backlog(session, manifest.sealed_end);
        // The seal holds the slot: no append came in between, everything is sealed.
        self.seal_triggers.settled(session);
        report.events = manifest.sealed_end - first_seq;
        bump(&self.metrics.seals, 1);
        bump(&self.metrics.sealed_events, report.events);
        if last_step == SealStep::UpdateManifest {
            return Ok(report);
        }
        self.cold
            .put_immutable(
                &manifest_copy_key(session, owned.epoch, manifest.sealed_end),
                to_json(&manifest),
            )
            .await
            .map_err(backend)?;
        if last_step == SealStep::CopyManifest {
            return Ok(report);
        }
        report.purged_messages = self
            .tail
            .purge(
                &stream_name(shard),
                &session_subject(session, shard),
                manifest.tail_from_stream_seq,
            )
            .await
            .map_err(backend)?;
        bump(&self.metrics.purged_messages, report.purged_messages);
        report.purged_group_messages = self.purge_sealed_group_messages(shard).await?;
        bump(
            &self.metrics.purged_group_messages,
            report.purged_group_messages,
        );
        Ok(report)
    }

    /// Purges the longest prefix of the shard's group subject (F-09-23) in which every batch's
    /// session has a manifest whose `tail_from_stream_seq` is past the message (F-09-43): no
    /// rebuild replays those messages any more. Stops at the first message that carries an
    /// unsealed session (or that does not decode: the rebuild that meets it refuses loudly),
    /// and after [`MAX_GROUP_PURGE_SCAN`] messages. Manifests only move `tail_from_stream_seq`
    /// forward, so a stale read purges less, never too much. Returns the messages purged.
    async fn purge_sealed_group_messages(&self, shard: u32) -> FleetResult<u64> {
        let stream = stream_name(shard);
        let subject = group_subject(shard);
        let messages = self
            .tail
            .replay(&stream, &subject, FIRST_STREAM_SEQ)
            .await
            .map_err(backend)?;
        let mut tail_from: HashMap<String, u64> = HashMap::new();
        let mut purge_below = None;
        for message in messages.iter().take(MAX_GROUP_PURGE_SCAN) {
            let Ok(batches) = decode_tail_message(&message.payload) else {
                break;
            };
            let mut sealed_past = true;
            for batch in &batches {
                let from = match tail_from.get(&batch.session) {
                    Some(from) => *from,
                    None => {
                        let from = self.sealed_tail_from(&batch.session).await?;
                        tail_from.insert(batch.session.clone(), from);
                        from
                    }
                };
                if from <= message.stream_seq {
                    sealed_past = false;
                    break;
                }
            }
            if !sealed_past {
                break;
            }
            purge_below = Some(message.stream_seq + 1);
        }
        let Some(before) = purge_below else {
            return Ok(0);
        };
        self.tail
            .purge(&stream, &subject, before)
            .await
            .map_err(backend)
    }

    /// The manifest's `tail_from_stream_seq` of `session` (0 without a manifest: nothing of
    /// it may be purged).
    async fn sealed_tail_from(&self, session: &str) -> FleetResult<u64> {
        let entry = self
            .coordinator
            .get(Bucket::Sessions, &session_key(session))
            .await
            .map_err(backend)?;
        match entry {
            None => Ok(0),
            Some(entry) => Ok(
                from_json::<SessionManifest>(&entry.value, "session manifest")?
                    .tail_from_stream_seq,
            ),
        }
    }
}
