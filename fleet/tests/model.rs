//! Model test of the fleet protocol on the deterministic fakes: random schedules of appends,
//! lease ticks, node crashes (with the disk kept or lost), pauses (zombies), partitions,
//! lost replies, cold-store outages and seals stopped part-way. After each schedule every
//! fault is healed, leases run out, and the checks run:
//!
//! - every acknowledged event is on the shard's owner exactly once, at its acknowledged seq,
//!   in order, with contiguous seqs; no event appears that no client sent;
//! - the owner accepts an append at the next seq;
//! - across all schedules, zombie writes were attempted and every one was refused.
//!
//! The same schedules run in `local` mode and in `replicated` mode with
//! `degrade_to_local_after` (a background replicator round is one more action): an event
//! acknowledged with the tail ack is never lost; an event acknowledged locally is lost only
//! if it was in the node's reported backlog when the node died or was fenced (the RPO); the
//! reported lag equals the true count of locally acknowledged events in neither the tail nor
//! a sealed run; ordering and exactly-once hold through degrade and return.
//!
//! `DSHDB_FLEET_MODEL_SCHEDULES` sets the number of schedules (default 10,000);
//! `DSHDB_FLEET_MODEL_SEED` replays one schedule.

use dshdb_fleet::backend::{Bucket, Clock};
use dshdb_fleet::fake::{
    FakeCold, FakeColdClient, FakeKv, FakeKvClient, FakeTail, FakeTailClient, Link, LinkControl,
    VirtualClock,
};
use dshdb_fleet::tier::{EngineTier, LocalTier, MemoryTier};
use dshdb_fleet::wire::{decode_tail_message, from_json, RunObject, SessionManifest, ShardRecord};
use dshdb_fleet::{
    AppendAck, DurabilityMode, FleetError, IncomingEvent, Node, NodeConfig, SealStep,
    UnshippedRange,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

const NODE_TTL_MS: u64 = 10_000;
const REFRESH_MS: u64 = 2_000;
/// 18 shards: shards 0 and 16, 1 and 17 share a tail stream (16 streams), so concurrent
/// appends form atomic publishes of several shards as well as group messages.
const SHARDS: u32 = 18;
const NODES: usize = 3;
const SESSIONS: usize = 6;
const STEPS: usize = 60;
const DEFAULT_SCHEDULES: u64 = 10_000;
/// Schedules run with the real engine (on simulated storage) as the local tier.
const ENGINE_SCHEDULES: u64 = 150;
/// Schedules run in `local` mode, and in `replicated` mode with the degrade policy.
const MODE_SCHEDULES: u64 = 2_000;
/// `degrade_to_local_after` of the degrade schedules, in real ms, and the replicator's probe
/// timeout: far above anything the fakes take, so that the schedules stay deterministic (a
/// stall is a publish whose retries gave up, a partition, never a real-time timer; a timer
/// fired once in a loaded run with 1 s and 0.5 s, and that run failed: see fleet/STATUS.md).
const DEGRADE_AFTER_MS: u64 = 60_000;
/// Background replicator rounds run at the end of a schedule to drain every backlog.
const SETTLE_SHIP_ROUNDS: usize = 20;

type FakeNode = Node<FakeTailClient, FakeKvClient, FakeColdClient>;

/// splitmix64: small, seedable, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TierKind {
    Memory,
    Engine,
}

/// A node's disk: kept across crashes unless wiped.
enum Disk {
    Memory(MemoryTier),
    Engine(Arc<dshdb::storage::io::sim::SimStorage>),
}

impl Disk {
    fn new(kind: TierKind) -> Disk {
        match kind {
            TierKind::Memory => Disk::Memory(MemoryTier::default()),
            TierKind::Engine => Disk::Engine(Arc::new(dshdb::storage::io::sim::SimStorage::new())),
        }
    }

    fn open(&self) -> Arc<dyn LocalTier> {
        match self {
            Disk::Memory(tier) => Arc::new(tier.clone()),
            Disk::Engine(storage) => {
                let options = dshdb::Options {
                    segment_bytes: 256 * 1024,
                    ..dshdb::Options::default()
                };
                let store = dshdb::Store::open_on(storage.clone(), options, Path::new("node"))
                    .expect("the simulated store opens");
                Arc::new(EngineTier::new(store))
            }
        }
    }

    /// What survives a crash: the durable image (the engine's store is dropped first).
    fn after_crash(&mut self) {
        if let Disk::Engine(storage) = self {
            *storage = Arc::new(dshdb::storage::io::sim::SimStorage::from_image(
                &storage.durable_image(),
            ));
        }
    }

    fn wipe(&mut self, kind: TierKind) {
        *self = Disk::new(kind);
    }
}

struct NodeHarness {
    id: String,
    generation: u64,
    nats: LinkControl,
    s3: LinkControl,
    disk: Disk,
    node: Option<Arc<FakeNode>>,
    started: bool,
    paused: bool,
    /// Its tail link lost replies since it booted (a message may be stored while the node
    /// still counts it in its backlog).
    lossy: bool,
}

/// An acknowledged event: by which process, and whether after the tail ack.
#[derive(Debug, Clone)]
struct Acked {
    data: String,
    replicated: bool,
    epoch: u64,
    node: usize,
    generation: u64,
}

/// The modes a schedule runs its nodes in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Modes {
    mode: DurabilityMode,
    degrade_after_ms: Option<u64>,
}

impl Modes {
    const REPLICATED: Modes = Modes {
        mode: DurabilityMode::Replicated,
        degrade_after_ms: None,
    };

    /// Whether nodes may ack without the tail ack (and run the background replicator).
    fn acks_locally(self) -> bool {
        self.mode != DurabilityMode::Replicated || self.degrade_after_ms.is_some()
    }
}

#[derive(Default)]
struct SessionModel {
    created: bool,
    /// seq → the acknowledged event (the latest acknowledgement of the seq).
    acked: BTreeMap<u64, Acked>,
    /// Locally acknowledged events whose seq a later acknowledgement reused: each must have
    /// been reported lost (seq, event).
    superseded: Vec<(u64, Acked)>,
    /// data of every event sent (acknowledged or not).
    sent: BTreeSet<String>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Totals {
    acked_events: u64,
    zombie_attempts: u64,
    zombie_acks_after_takeover: u64,
    fenced: u64,
    takeovers: u64,
    rebuilds: u64,
    seals: u64,
    crashes: u64,
    leases_lost: u64,
    reregistrations: u64,
    /// Nodes that stopped for good (their id taken): never, as every id has one process.
    stops: u64,
    /// Appends sent together by [`World::append_concurrently`].
    concurrent_appends: u64,
    /// Session batches that shared a group message with another (batches - messages).
    grouped_batches: u64,
    /// Messages that shared an atomic publish with another (messages - publishes).
    atomic_companions: u64,
    /// Events acknowledged without the tail ack.
    local_acked_events: u64,
    /// Backlog events the replicator shipped.
    shipped_events: u64,
    /// At-risk windows opened by degraded streams.
    degrades: u64,
    /// Locally acknowledged events lost (in a backlog at a crash or fence).
    lost_events: u64,
    /// Lag checks made at crashes.
    lag_checks: u64,
    /// Backlog events a seal took off the node (in a run named by a manifest).
    sealed_backlog_events: u64,
    /// Session events found in the tail at the end of a schedule.
    tail_events: u64,
    /// Group messages purged after seals (every session they carry sealed past them).
    purged_group_messages: u64,
}

impl Totals {
    /// Adds a node's counters (at its crash, or at the end of the schedule).
    fn add(&mut self, metrics: &dshdb_fleet::node::NodeMetrics) {
        let read = |counter: &std::sync::atomic::AtomicU64| {
            counter.load(std::sync::atomic::Ordering::Relaxed)
        };
        self.fenced += read(&metrics.fenced_writes);
        self.takeovers += read(&metrics.takeovers);
        self.rebuilds += read(&metrics.rebuilds);
        self.seals += read(&metrics.seals);
        self.leases_lost += read(&metrics.leases_lost);
        self.reregistrations += read(&metrics.reregistrations);
        self.purged_group_messages += read(&metrics.purged_group_messages);
        self.grouped_batches +=
            read(&metrics.published_batches) - read(&metrics.published_messages);
        self.atomic_companions +=
            read(&metrics.published_messages) - read(&metrics.fenced_publishes);
    }

    fn add_modes(&mut self, metrics: &dshdb_fleet::modes::ModeMetrics) {
        let read = |counter: &std::sync::atomic::AtomicU64| {
            counter.load(std::sync::atomic::Ordering::Relaxed)
        };
        self.local_acked_events += read(&metrics.local_acked_events);
        self.shipped_events += read(&metrics.shipped_events);
        self.degrades += read(&metrics.degrades);
        self.sealed_backlog_events += read(&metrics.unshipped_events_sealed);
    }
}

struct World {
    kind: TierKind,
    modes: Modes,
    /// session → acknowledged ranges reported lost (backlogs at crashes, fenced backlogs):
    /// (epoch, first seq, end seq).
    lost: BTreeMap<String, Vec<(u64, u64, u64)>>,
    rng: Rng,
    clock: Arc<VirtualClock>,
    tail: FakeTail,
    kv: FakeKv,
    cold: FakeCold,
    nodes: Vec<NodeHarness>,
    sessions: Vec<SessionModel>,
    next_payload: u64,
    totals: Totals,
    runtime: tokio::runtime::Runtime,
}

fn session_id(index: usize) -> String {
    static IDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    IDS.get_or_init(pick_session_ids)[index].clone()
}

/// The model's session ids, chosen so that concurrent appends can group (the first write
/// of a stream goes out alone, the ones queued behind it together): sessions 0, 1 and 2
/// share shard 2 (group messages); sessions 3 and 4 are in shard 0 and session 5 in shard
/// 16, which share tail stream 0 (atomic publishes of several shards).
fn pick_session_ids() -> Vec<String> {
    use dshdb_fleet::shard::{shard_of_in, STREAM_COUNT};
    let of_shard = |shard: u32, count: usize| -> Vec<String> {
        (0..10_000)
            .map(|index| format!("s{index}"))
            .filter(|id| shard_of_in(id, SHARDS) == shard)
            .take(count)
            .collect()
    };
    let mut ids = of_shard(2, 3);
    ids.extend(of_shard(0, 2));
    ids.extend(of_shard(STREAM_COUNT, 1));
    assert_eq!(ids.len(), SESSIONS, "session ids of the model");
    ids
}

impl World {
    fn new(seed: u64, kind: TierKind, modes: Modes) -> World {
        let clock = VirtualClock::new(1_000_000);
        let world = World {
            kind,
            modes,
            lost: BTreeMap::new(),
            rng: Rng(seed),
            tail: FakeTail::new(clock.clone()),
            kv: FakeKv::new(clock.clone(), NODE_TTL_MS),
            cold: FakeCold::default(),
            clock,
            nodes: (0..NODES)
                .map(|index| NodeHarness {
                    id: format!("n{}", index + 1),
                    generation: 0,
                    nats: LinkControl::default(),
                    s3: LinkControl::default(),
                    disk: Disk::new(kind),
                    node: None,
                    started: false,
                    paused: false,
                    lossy: false,
                })
                .collect(),
            sessions: (0..SESSIONS).map(|_| SessionModel::default()).collect(),
            next_payload: 0,
            totals: Totals::default(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime"),
        };
        let mut world = world;
        for index in 0..NODES {
            world.boot(index);
        }
        world
    }

    fn boot(&mut self, index: usize) {
        let harness = &mut self.nodes[index];
        harness.generation += 1;
        let mut config = NodeConfig::new(&harness.id, &harness.id, harness.generation);
        config.shard_count = SHARDS;
        config.publish_attempts = 3;
        config.publish_retry_backoff_ms = 0;
        config.lease_ttl_ms = NODE_TTL_MS;
        config.mode = self.modes.mode;
        config.degrade_to_local_after_ms = self.modes.degrade_after_ms;
        config.stalled_probe_timeout_ms = DEGRADE_AFTER_MS;
        let node = Node::new(
            config,
            self.tail.client(harness.nats.clone()),
            self.kv.client(harness.nats.clone()),
            self.cold.client(harness.s3.clone()),
            harness.disk.open(),
            self.clock.clone(),
        );
        harness.node = Some(Arc::new(node));
        harness.started = false;
        harness.paused = false;
        harness.lossy = harness.nats.get() == Link::LoseReplies;
    }

    fn crash(&mut self, index: usize, wipe: bool) {
        let kind = self.kind;
        if let Some(node) = self.nodes[index].node.clone() {
            self.check_lag(index, &node);
            // What the node held unshipped dies with it: the RPO of this crash.
            let mut ranges = node.unshipped();
            ranges.extend(node.lost_unshipped());
            self.record_lost(&ranges);
        }
        let harness = &mut self.nodes[index];
        if let Some(node) = harness.node.take() {
            self.totals.add(&node.metrics);
            self.totals.add_modes(&node.mode_metrics);
        }
        harness.disk.after_crash();
        if wipe {
            harness.disk.wipe(kind);
        }
        self.totals.crashes += 1;
    }

    /// The owner `DSH_SHARDS` names for a session's shard.
    fn recorded_owner(&self, session: &str) -> Option<(String, u64, u64)> {
        let shard = dshdb_fleet::shard::shard_of_in(session, SHARDS);
        let value = self.kv.peek(Bucket::Shards, &shard.to_string())?;
        let record: ShardRecord = from_json(&value, "shard record").ok()?;
        Some((record.owner, record.generation, record.epoch))
    }

    fn node_index(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|harness| harness.id == id)
    }

    fn tick(&mut self, index: usize) {
        let Some(node) = self.nodes[index].node.clone() else {
            return;
        };
        if self.nodes[index].paused {
            return;
        }
        if !self.nodes[index].started {
            if self.runtime.block_on(node.start()).is_ok() {
                self.nodes[index].started = true;
            }
            return;
        }
        if node.is_stopped() {
            // It exits (its id was taken by another process) and is restarted.
            self.totals.stops += 1;
            self.crash(index, false);
            self.boot(index);
            return;
        }
        let _ = self.runtime.block_on(node.tick());
    }

    fn new_payload(&mut self) -> String {
        self.next_payload += 1;
        format!("{{\"n\":{}}}", self.next_payload)
    }

    /// A client appends to session `which` through node `index` (following one `Moved`).
    fn append(&mut self, which: usize, index: usize) {
        let session = session_id(which);
        let count = 1 + self.rng.below(3) as usize;
        let payloads: Vec<String> = (0..count).map(|_| self.new_payload()).collect();
        let events: Vec<IncomingEvent> = payloads
            .iter()
            .map(|data| IncomingEvent {
                time: Some(1_700_000_000_000),
                ..IncomingEvent::new("assistant/chunk", data)
            })
            .collect();
        let mut target = index;
        for _ in 0..2 {
            let Some(node) = self.nodes[target].node.clone() else {
                return;
            };
            if self.nodes[target].paused {
                return;
            }
            let model = &mut self.sessions[which];
            if !model.created {
                let header = format!("{{\"version\":0,\"id\":\"{session}\",\"createdAt\":1}}");
                match self
                    .runtime
                    .block_on(node.create_session(&session, &header))
                {
                    Ok(()) | Err(FleetError::DuplicateSession { .. }) => model.created = true,
                    Err(FleetError::Moved {
                        owner: Some(owner), ..
                    }) => match self.node_index(&owner) {
                        Some(next) if next != target => {
                            target = next;
                            continue;
                        }
                        _ => return,
                    },
                    Err(_) => return,
                }
            }
            let model = &mut self.sessions[which];
            model.sent.extend(payloads.iter().cloned());
            let was_owner = self.recorded_owner(&session);
            match self.runtime.block_on(node.append(&session, &events)) {
                Ok(ack) => {
                    self.record_ack(which, target, &payloads, ack, was_owner.as_ref());
                    return;
                }
                Err(FleetError::Moved { owner, .. }) => {
                    let harness = &self.nodes[target];
                    if was_owner.as_ref().map(|(owner, _, _)| owner.as_str())
                        != Some(harness.id.as_str())
                        || was_owner.as_ref().map(|(_, generation, _)| *generation)
                            != Some(harness.generation)
                    {
                        self.totals.zombie_attempts += 1;
                    }
                    match owner.as_deref().and_then(|owner| self.node_index(owner)) {
                        Some(next) if next != target => target = next,
                        _ => return,
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// Records an acknowledged append in the model: each seq acknowledged once; a node the
    /// shard record did not name may acknowledge only a duplicate (a retry the stream had
    /// stored before the takeover).
    fn record_ack(
        &mut self,
        which: usize,
        target: usize,
        payloads: &[String],
        ack: AppendAck,
        was_owner: Option<&(String, u64, u64)>,
    ) {
        let generation = self.nodes[target].generation;
        let model = &mut self.sessions[which];
        for (offset, data) in payloads.iter().enumerate() {
            let seq = ack.first_seq + offset as u64;
            let acked = Acked {
                data: data.clone(),
                replicated: ack.replicated,
                epoch: ack.epoch,
                node: target,
                generation,
            };
            if let Some(previous) = model.acked.insert(seq, acked) {
                // Only a locally acknowledged event can lose its seq (its node died or was
                // fenced with it unshipped); the check finds it reported lost.
                assert!(!previous.replicated, "seq {seq} acknowledged twice");
                model.superseded.push((seq, previous));
            }
        }
        self.totals.acked_events += payloads.len() as u64;
        let harness = &self.nodes[target];
        if was_owner.map(|(owner, generation, _)| (owner.as_str(), *generation))
            != Some((harness.id.as_str(), harness.generation))
        {
            assert!(
                ack.replicated,
                "a node the shard record does not name acknowledged locally"
            );
            assert!(ack.duplicate, "a zombie's new write was acknowledged");
            self.totals.zombie_acks_after_takeover += 1;
        }
    }

    /// Clients append to several created sessions at once through node `index`, without
    /// following `Moved`: the node's stream queues group them (group messages of a shard,
    /// atomic publishes of a stream's shards).
    fn append_concurrently(&mut self, index: usize) {
        let Some(node) = self.nodes[index].node.clone() else {
            return;
        };
        if self.nodes[index].paused {
            return;
        }
        let chosen: Vec<usize> = (0..SESSIONS)
            .filter(|which| self.sessions[*which].created)
            .filter(|_| self.rng.chance(80))
            .collect();
        if chosen.len() < 2 {
            return;
        }
        let mut work = Vec::new();
        for which in chosen {
            let count = 1 + self.rng.below(3) as usize;
            let payloads: Vec<String> = (0..count).map(|_| self.new_payload()).collect();
            self.sessions[which].sent.extend(payloads.iter().cloned());
            let was_owner = self.recorded_owner(&session_id(which));
            work.push((which, payloads, was_owner));
        }
        let results = self
            .runtime
            .block_on(futures::future::join_all(work.iter().map(
                |(which, payloads, _)| {
                    let node = node.clone();
                    let session = session_id(*which);
                    let events: Vec<IncomingEvent> = payloads
                        .iter()
                        .map(|data| IncomingEvent {
                            time: Some(1_700_000_000_000),
                            ..IncomingEvent::new("assistant/chunk", data)
                        })
                        .collect();
                    async move { node.append(&session, &events).await }
                },
            )));
        self.totals.concurrent_appends += results.len() as u64;
        for ((which, payloads, was_owner), result) in work.into_iter().zip(results) {
            match result {
                Ok(ack) => self.record_ack(which, index, &payloads, ack, was_owner.as_ref()),
                Err(FleetError::Moved { .. }) => {
                    let harness = &self.nodes[index];
                    if was_owner
                        .as_ref()
                        .map(|(owner, generation, _)| (owner.as_str(), *generation))
                        != Some((harness.id.as_str(), harness.generation))
                    {
                        self.totals.zombie_attempts += 1;
                    }
                }
                Err(_) => {}
            }
        }
    }

    fn seal(&mut self, which: usize) {
        let session = session_id(which);
        let Some((owner, _, _)) = self.recorded_owner(&session) else {
            return;
        };
        let Some(index) = self.node_index(&owner) else {
            return;
        };
        let Some(node) = self.nodes[index].node.clone() else {
            return;
        };
        if self.nodes[index].paused {
            return;
        }
        let steps = [
            SealStep::PutRun,
            SealStep::VerifyRun,
            SealStep::UpdateManifest,
            SealStep::CopyManifest,
            SealStep::PurgeTail,
        ];
        let step = if self.rng.chance(70) {
            SealStep::PurgeTail
        } else {
            steps[self.rng.below(steps.len() as u64) as usize]
        };
        let _ = self.runtime.block_on(node.seal_until(&session, step));
        if step != SealStep::PurgeTail && self.rng.chance(50) {
            self.crash(index, false);
            self.boot(index);
        }
    }

    /// Resumes a paused node and, mostly, has a client with a stale route write through it
    /// at once, before its next tick: a zombie write if its shard moved meanwhile.
    fn resume(&mut self, index: usize) {
        let was_paused = self.nodes[index].paused;
        self.nodes[index].paused = false;
        let Some(node) = self.nodes[index].node.clone() else {
            return;
        };
        if !was_paused || !self.rng.chance(80) {
            return;
        }
        let owned = node.owned_shards();
        let stale = (0..SESSIONS).find(|which| {
            self.sessions[*which].created
                && owned.contains_key(&dshdb_fleet::shard::shard_of_in(
                    &session_id(*which),
                    SHARDS,
                ))
        });
        if let Some(which) = stale {
            self.append(which, index);
        }
    }

    /// Pauses node `index` past its lease while the others tick (they take its shards), then
    /// resumes it with a stale client writing through it.
    fn zombie(&mut self, index: usize) {
        self.nodes[index].paused = true;
        for _ in 0..(NODE_TTL_MS / REFRESH_MS + 2) {
            self.clock.advance(REFRESH_MS);
            for other in 0..NODES {
                if other != index {
                    self.tick(other);
                }
            }
        }
        self.resume(index);
    }

    fn record_lost(&mut self, ranges: &[UnshippedRange]) {
        for range in ranges {
            self.lost.entry(range.session.clone()).or_default().push((
                range.epoch,
                range.first_seq,
                range.end_seq,
            ));
        }
    }

    fn is_lost(&self, session: &str, seq: u64, acked: &Acked) -> bool {
        self.lost.get(session).is_some_and(|ranges| {
            ranges
                .iter()
                .any(|(epoch, first, end)| *epoch == acked.epoch && (*first..*end).contains(&seq))
        })
    }

    /// Data of every event in the tail or in a sealed run: off the nodes.
    fn replicated_datas(&self) -> BTreeSet<String> {
        let mut datas = BTreeSet::new();
        for message in self.tail.all_messages() {
            if let Ok(batches) = decode_tail_message(&message.payload) {
                for batch in batches {
                    datas.extend(batch.events.into_iter().map(|event| event.data));
                }
            }
        }
        // Runs count once a manifest names them (a seal stopped after its PUT did not
        // take the events off the node).
        for which in 0..SESSIONS {
            let key = dshdb_fleet::shard::session_key(&session_id(which));
            let manifest = self
                .kv
                .peek(Bucket::Sessions, &key)
                .and_then(|value| from_json::<SessionManifest>(&value, "manifest").ok());
            for run in manifest.map(|manifest| manifest.runs).unwrap_or_default() {
                let decoded = self
                    .cold
                    .object(&run.key)
                    .and_then(|bytes| RunObject::decode(&bytes).ok());
                if let Some(decoded) = decoded {
                    datas.extend(decoded.events.into_iter().map(|event| event.data));
                }
            }
        }
        datas
    }

    /// The lag a node reports against the truth: its locally acknowledged events in
    /// neither the tail nor a run, less those it reported lost. Equal, unless a reply was
    /// lost (a message stored that the node still counts, so it reports more, never less).
    fn check_lag(&mut self, index: usize, node: &FakeNode) {
        if !self.modes.acks_locally() {
            return;
        }
        let generation = self.nodes[index].generation;
        let off_node = self.replicated_datas();
        let lost_by_node: Vec<UnshippedRange> = node.lost_unshipped();
        // What an earlier process of this node acknowledged locally and this one found on
        // its disk after taking the shard straight back (its backlog ranges, under the new
        // epoch): counted when still unshipped. Everything else in the truth is this
        // process's own acknowledgements.
        let inherited_by_node: Vec<UnshippedRange> = node.unshipped();
        let mut truth = 0u64;
        for (which, model) in self.sessions.iter().enumerate() {
            let session = session_id(which);
            let all = model
                .acked
                .iter()
                .map(|(seq, acked)| (*seq, acked, true))
                .chain(
                    model
                        .superseded
                        .iter()
                        .map(|(seq, acked)| (*seq, acked, false)),
                );
            for (seq, acked, latest) in all {
                let reported_lost = lost_by_node.iter().any(|range| {
                    range.session == session
                        && range.epoch == acked.epoch
                        && (range.first_seq..range.end_seq).contains(&seq)
                });
                // Only the latest acknowledgement of a seq can be on the disk.
                let inherited = latest
                    && acked.generation < generation
                    && inherited_by_node.iter().any(|range| {
                        range.session == session && (range.first_seq..range.end_seq).contains(&seq)
                    });
                if acked.node == index
                    && (acked.generation == generation || inherited)
                    && !acked.replicated
                    && !off_node.contains(&acked.data)
                    && !reported_lost
                {
                    truth += 1;
                }
            }
        }
        let lag = node.replication_lag().events;
        if self.nodes[index].lossy {
            assert!(truth <= lag, "lag {lag} under the truth {truth}");
        } else {
            assert_eq!(lag, truth, "reported lag against the true unshipped count");
        }
        self.totals.lag_checks += 1;
    }

    /// One round of a node's background replicator.
    fn ship(&mut self, index: usize) {
        let Some(node) = self.nodes[index].node.clone() else {
            return;
        };
        if self.nodes[index].paused {
            return;
        }
        self.runtime.block_on(node.ship());
    }

    fn random_link(&mut self) -> Link {
        match self.rng.below(3) {
            0 => Link::Up,
            1 => Link::Down,
            _ => Link::LoseReplies,
        }
    }

    fn step(&mut self) {
        let index = self.rng.below(NODES as u64) as usize;
        if self.modes.acks_locally() && self.rng.chance(20) {
            self.ship(index);
        }
        let roll = self.rng.below(100);
        match roll {
            0..=5 => self.append_concurrently(index),
            6..=39 => {
                let which = self.rng.below(SESSIONS as u64) as usize;
                // Clients mostly route by the shard record; some use a stale cache.
                let recorded = self
                    .recorded_owner(&session_id(which))
                    .and_then(|(owner, _, _)| self.node_index(&owner));
                let target = match recorded {
                    Some(owner) if self.rng.chance(75) => owner,
                    _ => index,
                };
                self.append(which, target);
            }
            40..=64 => self.tick(index),
            65..=71 => self.clock.advance(self.rng.below(4_000)),
            72..=73 => {
                if self.nodes[index].node.is_some() {
                    let wipe = self.rng.chance(20);
                    self.crash(index, wipe);
                }
            }
            74..=77 => {
                if self.nodes[index].node.is_none() {
                    self.boot(index);
                }
            }
            78..=80 => self.nodes[index].paused = true,
            81..=83 => self.resume(index),
            84..=86 => {
                let link = self.random_link();
                self.nodes[index].nats.set(link);
                self.nodes[index].lossy |= link == Link::LoseReplies;
            }
            87..=89 => self.nodes[index].nats.set(Link::Up),
            90 => {
                let link = self.random_link();
                self.nodes[index].s3.set(link);
            }
            91 => self.nodes[index].s3.set(Link::Up),
            92..=94 => self.zombie(index),
            _ => {
                let which = self.rng.below(SESSIONS as u64) as usize;
                self.seal(which);
            }
        }
        self.clock.advance(self.rng.below(300));
    }

    /// Heals every fault and lets the fleet settle.
    fn settle(&mut self) {
        for index in 0..NODES {
            self.nodes[index].paused = false;
            self.nodes[index].nats.set(Link::Up);
            self.nodes[index].s3.set(Link::Up);
            if self.nodes[index].node.is_none() {
                self.boot(index);
            }
        }
        // Ticks every 2 s (the refresh interval) for well past the lease TTL: leases of the
        // dead expire, restarted nodes register, shards move and settle.
        for _ in 0..(3 * NODE_TTL_MS / REFRESH_MS) {
            self.clock.advance(REFRESH_MS);
            for index in 0..NODES {
                self.tick(index);
            }
        }
        if !self.modes.acks_locally() {
            return;
        }
        // The replicators drain every backlog over healed links (a fenced one is lost).
        for _ in 0..SETTLE_SHIP_ROUNDS {
            for index in 0..NODES {
                self.ship(index);
                self.tick(index);
            }
        }
        if self.modes.mode == DurabilityMode::Sealed {
            // Only seals take a `sealed` node's events off it: seal every session on its
            // owner, over healed links; each seal must complete.
            for which in 0..SESSIONS {
                if !self.sessions[which].created {
                    continue;
                }
                let session = session_id(which);
                let (owner, _, _) = self
                    .recorded_owner(&session)
                    .unwrap_or_else(|| panic!("{session} has no recorded owner"));
                let index = self.node_index(&owner).expect("a known node");
                let node = self.nodes[index].node.clone().expect("booted");
                self.runtime
                    .block_on(node.seal(&session))
                    .unwrap_or_else(|error| panic!("sealing {session} on {owner}: {error}"));
            }
        }
        for index in 0..NODES {
            if let Some(node) = self.nodes[index].node.clone() {
                // In `sealed` mode a node may still hold the backlog of a shard it no longer
                // owns (never sent, so never fenced): it counts in the lag until reported.
                if self.modes.mode != DurabilityMode::Sealed {
                    assert_eq!(node.replication_lag().events, 0, "a backlog after settling");
                }
                self.check_lag(index, &node);
                self.record_lost(&node.lost_unshipped());
            }
        }
    }

    /// The checks after a schedule; returns the events found.
    fn check(&mut self, seed: u64) -> u64 {
        let mut found = 0;
        for message in self.tail.all_messages() {
            if let Ok(batches) = decode_tail_message(&message.payload) {
                for batch in batches {
                    self.totals.tail_events += batch.events.len() as u64;
                }
            }
        }
        for which in 0..SESSIONS {
            if !self.sessions[which].created {
                continue;
            }
            let session = session_id(which);
            let (owner, generation, _) = self
                .recorded_owner(&session)
                .unwrap_or_else(|| panic!("seed {seed}: {session} has no recorded owner"));
            let index = self.node_index(&owner).expect("a known node");
            let node = self.nodes[index].node.clone().expect("booted");
            assert_eq!(
                self.nodes[index].generation, generation,
                "seed {seed}: the record names a dead generation of {owner}"
            );
            let events = self
                .runtime
                .block_on(node.read(&session, 0, u64::MAX))
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: reading {session} on {owner}: {error}")
                });
            let model = &self.sessions[which];
            let mut seen = BTreeSet::new();
            for (position, event) in events.iter().enumerate() {
                assert_eq!(
                    event.seq, position as u64,
                    "seed {seed}: {session} seqs not contiguous"
                );
                assert!(
                    seen.insert(event.data.clone()),
                    "seed {seed}: {session} holds {} twice",
                    event.data
                );
                assert!(
                    model.sent.contains(&event.data),
                    "seed {seed}: {session} holds {} that no client sent",
                    event.data
                );
            }
            for (seq, acked) in &model.acked {
                let index = usize::try_from(*seq).expect("small");
                let present = events.get(index).map(|event| &event.data) == Some(&acked.data);
                // A local ack may be lost only where its node reported it at risk.
                assert!(
                    present || (!acked.replicated && self.is_lost(&session, *seq, acked)),
                    "seed {seed}: {session} lost acknowledged seq {seq} ({acked:?})"
                );
                if !present {
                    self.totals.lost_events += 1;
                }
            }
            for (seq, acked) in &model.superseded {
                assert!(
                    self.is_lost(&session, *seq, acked),
                    "seed {seed}: {session}: seq {seq} ({acked:?}) reused without a report"
                );
                self.totals.lost_events += 1;
            }
            found += events.len() as u64;
            // The owner accepts the next append at the next seq.
            let next = self
                .runtime
                .block_on(node.append(&session, &[IncomingEvent::new("turn/start", "{}")]))
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: append to {session} after settling: {error}")
                });
            assert_eq!(
                next.first_seq,
                events.len() as u64,
                "seed {seed}: {session}"
            );
        }
        for harness in &self.nodes {
            if let Some(node) = &harness.node {
                self.totals.add(&node.metrics);
                self.totals.add_modes(&node.mode_metrics);
            }
        }
        found
    }
}

fn run_schedule(seed: u64, kind: TierKind, modes: Modes) -> Totals {
    let mut world = World::new(seed, kind, modes);
    for _ in 0..STEPS {
        world.step();
    }
    world.settle();
    world.check(seed);
    world.totals
}

fn add(total: &mut Totals, one: Totals) {
    total.acked_events += one.acked_events;
    total.zombie_attempts += one.zombie_attempts;
    total.zombie_acks_after_takeover += one.zombie_acks_after_takeover;
    total.fenced += one.fenced;
    total.takeovers += one.takeovers;
    total.rebuilds += one.rebuilds;
    total.seals += one.seals;
    total.crashes += one.crashes;
    total.leases_lost += one.leases_lost;
    total.reregistrations += one.reregistrations;
    total.stops += one.stops;
    total.concurrent_appends += one.concurrent_appends;
    total.grouped_batches += one.grouped_batches;
    total.atomic_companions += one.atomic_companions;
    total.local_acked_events += one.local_acked_events;
    total.shipped_events += one.shipped_events;
    total.degrades += one.degrades;
    total.lost_events += one.lost_events;
    total.lag_checks += one.lag_checks;
    total.sealed_backlog_events += one.sealed_backlog_events;
    total.tail_events += one.tail_events;
    total.purged_group_messages += one.purged_group_messages;
}

fn run_many(count: u64, kind: TierKind, modes: Modes) -> Totals {
    if let Some(seed) = std::env::var("DSHDB_FLEET_MODEL_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
    {
        return run_schedule(seed, kind, modes);
    }
    let threads = 2u64;
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            std::thread::spawn(move || {
                let mut total = Totals::default();
                let mut seed = thread;
                while seed < count {
                    add(&mut total, run_schedule(seed, kind, modes));
                    seed += threads;
                }
                total
            })
        })
        .collect();
    let mut total = Totals::default();
    for handle in handles {
        add(&mut total, handle.join().expect("a schedule panicked"));
    }
    total
}

#[test]
fn random_schedules_lose_no_acknowledged_event() {
    let count = std::env::var("DSHDB_FLEET_MODEL_SCHEDULES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_SCHEDULES);
    let started = std::time::Instant::now();
    let totals = run_many(count, TierKind::Memory, Modes::REPLICATED);
    eprintln!(
        "model: {count} schedules in {:.1?}: {totals:?}",
        started.elapsed()
    );
    if count >= 1_000 {
        // The schedules must exercise what they claim to.
        assert!(totals.acked_events > count, "{totals:?}");
        assert!(
            totals.takeovers > 0 && totals.rebuilds > 0 && totals.seals > 0,
            "{totals:?}"
        );
        assert!(
            totals.zombie_attempts > 0 && totals.fenced > 0,
            "{totals:?}"
        );
        // Concurrent appends form group messages (sessions of one shard) and atomic
        // publishes (shards of one stream).
        assert!(
            totals.concurrent_appends > 0
                && totals.grouped_batches > 0
                && totals.atomic_companions > 0,
            "{totals:?}"
        );
        // Seals purge group messages whose sessions are all sealed past them (F-09-43),
        // and the checks above found every acknowledged event all the same.
        assert!(totals.purged_group_messages > 0, "{totals:?}");
        // Leases run out during partitions and pauses; the nodes register again rather
        // than stop for good.
        assert!(
            totals.leases_lost > 0 && totals.reregistrations > 0,
            "{totals:?}"
        );
    }
    assert_eq!(totals.stops, 0, "a node stopped for good: {totals:?}");
    // Replicated mode never acks locally, so nothing acked is lost.
    assert_eq!(totals.local_acked_events, 0, "{totals:?}");
    assert_eq!(totals.lost_events, 0, "{totals:?}");
}

fn mode_schedules() -> u64 {
    if std::env::var("DSHDB_FLEET_MODEL_SEED").is_ok() {
        return 1;
    }
    std::env::var("DSHDB_FLEET_MODEL_SCHEDULES")
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map_or(MODE_SCHEDULES, |count| count.min(MODE_SCHEDULES))
}

#[test]
fn random_schedules_in_local_mode() {
    let count = mode_schedules();
    let modes = Modes {
        mode: DurabilityMode::Local,
        degrade_after_ms: None,
    };
    let totals = run_many(count, TierKind::Memory, modes);
    eprintln!("model (local mode): {count} schedules: {totals:?}");
    if count >= 1_000 {
        // Everything is acked locally and shipped in the background; crashes and fences
        // lose some backlogs (each one reported), and the lag was checked at every crash.
        assert!(totals.local_acked_events > count, "{totals:?}");
        assert!(totals.shipped_events > count, "{totals:?}");
        assert!(
            totals.lost_events > 0 && totals.lag_checks > count,
            "{totals:?}"
        );
        assert!(totals.takeovers > 0 && totals.seals > 0, "{totals:?}");
    }
    assert_eq!(totals.stops, 0, "a node stopped for good: {totals:?}");
}

/// `sealed` mode (FLEET.md: "local fdatasync; only sealed runs leave the node"; RPO the
/// unsealed tail): the same schedules with every node in `sealed` mode. Besides the checks
/// of every schedule (an acknowledged event is on the owner, or its node reported it lost:
/// its unsealed backlog at a crash or at the loss of its shard; the reported lag equals the
/// true count of events only the node holds), no session event ever reaches the tail, and
/// after settling, a seal of every session on its owner completes.
#[test]
fn random_schedules_in_sealed_mode() {
    let count = mode_schedules();
    let modes = Modes {
        mode: DurabilityMode::Sealed,
        degrade_after_ms: None,
    };
    let totals = run_many(count, TierKind::Memory, modes);
    eprintln!("model (sealed mode): {count} schedules: {totals:?}");
    assert_eq!(
        totals.tail_events, 0,
        "a sealed node sent events to the tail"
    );
    assert_eq!(
        totals.shipped_events, 0,
        "a sealed node shipped: {totals:?}"
    );
    if count >= 1_000 {
        // Everything is acked locally; seals take backlogs off the nodes; crashes and lost
        // shards lose unsealed tails, each reported.
        assert!(totals.local_acked_events > count, "{totals:?}");
        assert!(totals.sealed_backlog_events > count, "{totals:?}");
        assert!(
            totals.lost_events > 0 && totals.lag_checks > count,
            "{totals:?}"
        );
        assert!(totals.takeovers > 0 && totals.seals > 0, "{totals:?}");
    }
    assert_eq!(totals.stops, 0, "a node stopped for good: {totals:?}");
}

#[test]
fn random_schedules_with_degrade_to_local() {
    let count = mode_schedules();
    let modes = Modes {
        mode: DurabilityMode::Replicated,
        degrade_after_ms: Some(DEGRADE_AFTER_MS),
    };
    let totals = run_many(count, TierKind::Memory, modes);
    eprintln!("model (degrade to local): {count} schedules: {totals:?}");
    if count >= 1_000 {
        // Partitions stall publishes: streams degrade, ack locally, ship the backlog and
        // return; the replicated acks stay the majority.
        assert!(totals.degrades > 0, "{totals:?}");
        assert!(totals.local_acked_events > 0, "{totals:?}");
        assert!(totals.shipped_events > 0, "{totals:?}");
        assert!(
            totals.acked_events > 2 * totals.local_acked_events,
            "{totals:?}"
        );
        assert!(
            totals.zombie_attempts > 0 && totals.fenced > 0,
            "{totals:?}"
        );
    }
    assert_eq!(totals.stops, 0, "a node stopped for good: {totals:?}");
}

#[test]
fn random_schedules_on_the_engine_tier() {
    let totals = run_many(ENGINE_SCHEDULES, TierKind::Engine, Modes::REPLICATED);
    eprintln!("model (engine tier): {ENGINE_SCHEDULES} schedules: {totals:?}");
    assert!(totals.acked_events > 0 && totals.rebuilds > 0, "{totals:?}");
}

#[test]
fn virtual_clock_drives_lease_expiry() {
    let clock = VirtualClock::new(0);
    let kv = FakeKv::new(clock.clone(), NODE_TTL_MS);
    let client = kv.client(LinkControl::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    use dshdb_fleet::backend::Coordinator;
    let revision = runtime
        .block_on(client.create(Bucket::Nodes, "n1", b"a".to_vec()))
        .expect("create");
    assert!(matches!(
        runtime.block_on(client.create(Bucket::Nodes, "n1", b"b".to_vec())),
        Err(dshdb_fleet::BackendError::RevisionMismatch { .. })
    ));
    clock.advance(NODE_TTL_MS);
    assert_eq!(clock.now_ms(), NODE_TTL_MS);
    assert!(runtime
        .block_on(client.get(Bucket::Nodes, "n1"))
        .expect("get")
        .is_none());
    assert!(matches!(
        runtime.block_on(client.update(Bucket::Nodes, "n1", b"c".to_vec(), revision)),
        Err(dshdb_fleet::BackendError::RevisionMismatch { .. })
    ));
    assert!(runtime
        .block_on(client.create(Bucket::Nodes, "n1", b"d".to_vec()))
        .is_ok());
}

/// Two nodes on the fakes, driven step by step, for the lease-expiry stop.
struct LeaseWorld {
    clock: Arc<VirtualClock>,
    tail: FakeTail,
    kv: FakeKv,
    cold: FakeCold,
    runtime: tokio::runtime::Runtime,
}

impl LeaseWorld {
    fn new() -> LeaseWorld {
        let clock = VirtualClock::new(1_000_000);
        LeaseWorld {
            tail: FakeTail::new(clock.clone()),
            kv: FakeKv::new(clock.clone(), NODE_TTL_MS),
            cold: FakeCold::default(),
            clock,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime"),
        }
    }

    fn node(&self, id: &str, link: &LinkControl) -> FakeNode {
        self.node_in(id, link, Modes::REPLICATED)
    }

    fn node_in(&self, id: &str, link: &LinkControl, modes: Modes) -> FakeNode {
        let mut config = NodeConfig::new(id, id, 1);
        config.shard_count = SHARDS;
        config.publish_attempts = 2;
        config.publish_retry_backoff_ms = 0;
        config.lease_ttl_ms = NODE_TTL_MS;
        config.mode = modes.mode;
        config.degrade_to_local_after_ms = modes.degrade_after_ms;
        let node = Node::new(
            config,
            self.tail.client(link.clone()),
            self.kv.client(link.clone()),
            self.cold.client(LinkControl::default()),
            Arc::new(MemoryTier::default()),
            self.clock.clone(),
        );
        self.runtime.block_on(node.start()).expect("registers");
        node
    }

    fn append(&self, node: &FakeNode, session: &str, data: &str) -> Result<u64, FleetError> {
        self.runtime
            .block_on(node.append(session, &[IncomingEvent::new("message", data)]))
            .map(|ack| ack.first_seq)
    }

    fn datas(&self, node: &FakeNode, session: &str) -> Vec<String> {
        self.runtime
            .block_on(node.read(session, 0, u64::MAX))
            .expect("the owner reads")
            .into_iter()
            .map(|event| event.data)
            .collect()
    }

    fn leases_lost(node: &FakeNode) -> u64 {
        node.metrics
            .leases_lost
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[test]
fn lost_lease_drops_shards_then_registers_again() {
    let world = LeaseWorld::new();
    let session = "s0";
    let link1 = LinkControl::default();
    let n1 = world.node("n1", &link1);
    assert_eq!(
        world.runtime.block_on(n1.tick()).expect("tick").len(),
        SHARDS as usize
    );
    let epochs = n1.owned_shards();
    world
        .runtime
        .block_on(n1.create_session(session, r#"{"id":"s0"}"#))
        .expect("create");
    assert_eq!(world.append(&n1, session, "1").expect("append"), 0);

    // KV and the tail stop answering (an election) for longer than the lease TTL: the tick
    // that finds the lease past its TTL drops every shard at once; the node does not stop.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    assert!(world.runtime.block_on(n1.tick()).is_err());
    assert!(n1.owned_shards().is_empty(), "shards kept past the lease");
    assert_eq!(LeaseWorld::leases_lost(&n1), 1);
    assert!(!n1.is_stopped());
    assert!(matches!(
        world.append(&n1, session, "not served"),
        Err(FleetError::Moved { .. })
    ));

    // NATS answers again: the expired entry is found, the node registers again and takes
    // its shards back through the takeover path, at the same epochs (nobody took them).
    link1.set(Link::Up);
    world
        .runtime
        .block_on(n1.tick())
        .expect("tick after the outage");
    assert!(!n1.is_stopped());
    assert_eq!(
        n1.metrics
            .reregistrations
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(n1.owned_shards(), epochs);
    assert_eq!(world.append(&n1, session, "2").expect("append"), 1);
    assert_eq!(world.datas(&n1, session), ["1", "2"]);

    // Second outage, and this time n2 takes the shards while n1's lease is expired.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let link2 = LinkControl::default();
    let n2 = world.node("n2", &link2);
    assert!(world.runtime.block_on(n1.tick()).is_err());
    assert!(n1.owned_shards().is_empty());
    assert_eq!(
        world.runtime.block_on(n2.tick()).expect("tick").len(),
        SHARDS as usize
    );
    assert_eq!(world.append(&n2, session, "3").expect("append"), 2);
    link1.set(Link::Up);
    world
        .runtime
        .block_on(n1.tick())
        .expect("n1 registers again");
    assert!(
        n1.owned_shards().is_empty(),
        "n1 took shards of a live owner"
    );
    match world.append(&n1, session, "refused") {
        Err(FleetError::Moved { owner, .. }) => assert_eq!(owner.as_deref(), Some("n2")),
        other => panic!("n1 answered {other:?}"),
    }

    // n2 dies: n1, live again, takes the shards at a newer epoch and rebuilds the session.
    for _ in 0..(NODE_TTL_MS / REFRESH_MS + 1) {
        world.clock.advance(REFRESH_MS);
        let _ = world.runtime.block_on(n1.tick());
    }
    assert_eq!(n1.owned_shards().len(), SHARDS as usize);
    for (shard, epoch) in n1.owned_shards() {
        assert!(
            epoch > epochs[&shard],
            "shard {shard} not taken at a newer epoch"
        );
    }
    assert_eq!(world.append(&n1, session, "4").expect("append"), 3);
    assert_eq!(world.datas(&n1, session), ["1", "2", "3", "4"]);
    assert!(!n1.is_stopped());
}

#[test]
fn concurrent_writes_of_one_shard_are_not_taken_for_a_fence() {
    use dshdb_fleet::backend::{Fence, TailLog, TailPublish};
    let world = LeaseWorld::new();
    let link = LinkControl::default();
    let n1 = world.node("n1", &link);
    world.runtime.block_on(n1.tick()).expect("tick");
    let epochs = n1.owned_shards();
    // Sessions of one shard.
    let shard = dshdb_fleet::shard::shard_of_in("c0", SHARDS);
    let sessions: Vec<String> = (0..200)
        .map(|index| format!("c{index}"))
        .filter(|session| dshdb_fleet::shard::shard_of_in(session, SHARDS) == shard)
        .take(6)
        .collect();
    assert_eq!(sessions.len(), 6);
    for session in &sessions {
        let header = format!(r#"{{"id":"{session}"}}"#);
        world
            .runtime
            .block_on(n1.create_session(session, &header))
            .expect("create");
    }

    // The fake refuses a second publish fenced on a subject while the first is in flight,
    // as the server does.
    let tail = world.tail.client(LinkControl::default());
    let fenced = |index: usize| TailPublish {
        subject: format!("dsh.99.{index}.s.x"),
        payload: vec![1].into(),
        msg_id: format!("probe/{index}"),
        fence: Some(Fence {
            subject: "dsh.99.0.e".to_string(),
            last_seq: 0,
        }),
        headers: Vec::new(),
    };
    let (first, second) = world
        .runtime
        .block_on(async { futures::join!(tail.publish(fenced(1)), tail.publish(fenced(2))) });
    assert!(first.is_ok(), "{first:?}");
    assert!(
        matches!(second, Err(dshdb_fleet::BackendError::Fenced { .. })),
        "{second:?}"
    );

    // Concurrent appends to the shard's sessions: all acknowledged, none taken for a fence.
    let batch = [IncomingEvent::new("message", "{}")];
    let results = world.runtime.block_on(futures::future::join_all(
        sessions.iter().map(|session| n1.append(session, &batch)),
    ));
    for (session, result) in sessions.iter().zip(&results) {
        assert!(result.is_ok(), "{session}: {result:?}");
    }
    assert_eq!(n1.owned_shards(), epochs, "a shard was dropped");
    assert_eq!(
        n1.metrics
            .fenced_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// Group commit on the fakes, step by step: concurrent appends to three sessions of shard 0
/// and two of shard 16 (one tail stream) go out as group messages inside atomic publishes;
/// a takeover rebuilds every history from them; the zombie's grouped writes are all fenced.
#[test]
fn group_publishes_carry_many_sessions_through_a_takeover() {
    use dshdb_fleet::shard::{group_subject, shard_of_in};
    use std::sync::atomic::Ordering;
    let world = LeaseWorld::new();
    let pick = |shard: u32, count: usize| -> Vec<String> {
        (0..2_000)
            .map(|index| format!("g{index}"))
            .filter(|session| shard_of_in(session, SHARDS) == shard)
            .take(count)
            .collect()
    };
    let mut sessions = pick(0, 3);
    sessions.extend(pick(16, 2));
    assert_eq!(sessions.len(), 5);
    let link1 = LinkControl::default();
    let n1 = world.node("n1", &link1);
    world.runtime.block_on(n1.tick()).expect("tick");
    for session in &sessions {
        let header = format!(r#"{{"id":"{session}"}}"#);
        world
            .runtime
            .block_on(n1.create_session(session, &header))
            .expect("create");
    }
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        let results = world
            .runtime
            .block_on(futures::future::join_all(sessions.iter().map(|session| {
                let batch = vec![IncomingEvent::new("message", &format!("{round}-{session}"))];
                let n1 = &n1;
                async move { n1.append(session, &batch).await }
            })));
        for (session, result) in sessions.iter().zip(results) {
            let ack = result.unwrap_or_else(|error| panic!("{session} round {round}: {error}"));
            assert_eq!(ack.first_seq, round as u64);
        }
    }
    let read = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    let publishes = read(&n1.metrics.fenced_publishes);
    let messages = read(&n1.metrics.published_messages);
    let batches = read(&n1.metrics.published_batches);
    assert_eq!(batches, (ROUNDS * sessions.len()) as u64);
    assert!(
        messages < batches,
        "no group message: {messages} of {batches}"
    );
    assert!(
        publishes < messages,
        "no atomic publish: {publishes} of {messages}"
    );
    assert!(!world.tail.messages_on(&group_subject(0)).is_empty());
    assert!(!world.tail.messages_on(&group_subject(16)).is_empty());

    // n1 is cut off past its lease; n2 takes every shard and rebuilds from the tail.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let n2 = world.node("n2", &LinkControl::default());
    world.runtime.block_on(n2.tick()).expect("tick");
    assert_eq!(n2.owned_shards().len(), SHARDS as usize);
    let expected = |session: &str| -> Vec<String> {
        (0..ROUNDS)
            .map(|round| format!("{round}-{session}"))
            .collect()
    };
    for session in &sessions {
        assert_eq!(world.datas(&n2, session), expected(session), "{session}");
    }

    // The zombie, back before its next tick, still thinks it owns the shards: its grouped
    // writes are refused by the fences, each as `Moved`, and change no history.
    link1.set(Link::Up);
    let results = world
        .runtime
        .block_on(futures::future::join_all(sessions.iter().map(|session| {
            let batch = vec![IncomingEvent::new("message", "zombie")];
            let n1 = &n1;
            async move { n1.append(session, &batch).await }
        })));
    for (session, result) in sessions.iter().zip(results) {
        assert!(
            matches!(result, Err(FleetError::Moved { .. })),
            "{session}: {result:?}"
        );
    }
    assert_eq!(read(&n1.metrics.fenced_writes), sessions.len() as u64);
    for session in &sessions {
        assert_eq!(world.datas(&n2, session), expected(session), "{session}");
    }
}

/// F7's `.blk` half on the fakes: a replica that silently drops a session's last tail
/// message while it leads. The owner's heartbeat recorded the acknowledged tail position in
/// the manifest (`tail_checkpoint`), so the new owner's rebuild refuses the shorter history
/// loudly, naming the session and the missing seqs. What the checkpoint does not cover (a
/// message acknowledged after the last heartbeat) is shown too: the documented limit.
#[test]
fn a_silently_dropped_last_message_is_refused_by_the_tail_checkpoint() {
    use dshdb_fleet::shard::{shard_of_in, stream_name};
    use std::sync::atomic::Ordering;
    let world = LeaseWorld::new();
    let link1 = LinkControl::default();
    let n1 = world.node("n1", &link1);
    world.runtime.block_on(n1.tick()).expect("tick");
    let (checked, unchecked) = ("k0", "k1");
    for session in [checked, unchecked] {
        let header = format!(r#"{{"id":"{session}"}}"#);
        world
            .runtime
            .block_on(n1.create_session(session, &header))
            .expect("create");
    }
    let mut last_acks = std::collections::HashMap::new();
    for session in [checked, unchecked] {
        for index in 0..3 {
            let ack = world
                .runtime
                .block_on(n1.append(
                    session,
                    &[IncomingEvent::new("message", &index.to_string())],
                ))
                .expect("append");
            last_acks.insert(session, ack.stream_seq);
        }
    }
    // The heartbeat records both tails (3 events each).
    world.runtime.block_on(n1.tick()).expect("tick");
    assert_eq!(n1.metrics.tail_checkpoints.load(Ordering::Relaxed), 2);
    // One more event of `unchecked` after the heartbeat: not in its checkpoint.
    let late = world
        .runtime
        .block_on(n1.append(unchecked, &[IncomingEvent::new("message", "3")]))
        .expect("append");
    // A replica drops each session's last message and then serves the reads.
    let stream = |session: &str| stream_name(shard_of_in(session, SHARDS));
    world
        .tail
        .drop_message_silently(&stream(checked), last_acks[checked]);
    world
        .tail
        .drop_message_silently(&stream(unchecked), late.stream_seq);

    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let n2 = world.node("n2", &LinkControl::default());
    world.runtime.block_on(n2.tick()).expect("tick");
    match world.runtime.block_on(n2.read(checked, 0, u64::MAX)) {
        Err(FleetError::Rebuild {
            session,
            from,
            reason,
        }) => {
            assert_eq!(session, checked);
            assert_eq!(from, 2, "{reason}");
            assert!(reason.contains("seqs 2..3 are missing"), "{reason}");
        }
        other => panic!("a shorter history was served: {other:?}"),
    }
    // The limit: an event acknowledged after the last checkpoint can still vanish silently
    // when its message was the session's last (FLEET.md's scrub would find it).
    assert_eq!(world.datas(&n2, unchecked), ["0", "1", "2"]);
}

/// Degrade and return on the fakes, step by step: a `replicated` node with the degrade policy
/// loses its tail link; its next append is acknowledged locally (not replicated) and opens an
/// at-risk window on the stream; later appends of the stream ack locally at once, each in the
/// lag, the exact unshipped range and the window. When the link returns the replicator ships
/// the backlog in order (the batch sent before as that same message, the others merged into
/// one), closes the window, and the next append is replicated again. A new owner then rebuilds exactly the acknowledged history.
#[test]
fn degrade_to_local_and_return_ship_the_backlog_in_order() {
    let world = LeaseWorld::new();
    let link1 = LinkControl::default();
    let degrade = Modes {
        mode: DurabilityMode::Replicated,
        degrade_after_ms: Some(DEGRADE_AFTER_MS),
    };
    let n1 = world.node_in("n1", &link1, degrade);
    world.runtime.block_on(n1.tick()).expect("tick");
    let session = "k0";
    world
        .runtime
        .block_on(n1.create_session(session, r#"{"id":"k0"}"#))
        .expect("create");
    let append = |data: &str| {
        world
            .runtime
            .block_on(n1.append(session, &[IncomingEvent::new("message", data)]))
            .expect("append")
    };
    assert!(append("0").replicated && append("1").replicated);
    assert_eq!(n1.replication_lag().events, 0);

    link1.set(Link::Down);
    let degraded: Vec<AppendAck> = ["2", "3", "4"].iter().map(|data| append(data)).collect();
    assert!(degraded.iter().all(|ack| !ack.replicated), "{degraded:?}");
    assert_eq!(n1.replication_lag().events, 3);
    let unshipped = n1.unshipped();
    assert_eq!(unshipped.len(), 1, "{unshipped:?}");
    assert_eq!((unshipped[0].first_seq, unshipped[0].end_seq), (2, 5));
    let windows = n1.at_risk_windows();
    assert_eq!(windows.len(), 1, "{windows:?}");
    assert_eq!((windows[0].events, windows[0].to_ms), (3, None));
    // While the link is down the replicator's round stalls and keeps everything.
    let stalled = world.runtime.block_on(n1.ship());
    assert_eq!((stalled.messages, stalled.stalled), (0, 1));
    assert_eq!(n1.replication_lag().events, 3);

    link1.set(Link::Up);
    world.clock.advance(500);
    // Batch 2 went out once (its append's own try): it is sent again as that very message;
    // batches 3 and 4, never sent, go out merged as one.
    let first = world.runtime.block_on(n1.ship());
    assert_eq!((first.messages, first.events), (1, 1), "{first:?}");
    let second = world.runtime.block_on(n1.ship());
    assert_eq!((second.messages, second.events), (1, 2), "{second:?}");
    assert_eq!(n1.replication_lag().events, 0);
    let windows = n1.at_risk_windows();
    assert!(
        windows[0].to_ms.is_some(),
        "the window stays open: {windows:?}"
    );
    assert!(append("5").replicated, "not back to replicated");

    // The tail holds each batch once, in seq order.
    let shard = dshdb_fleet::shard::shard_of_in(session, SHARDS);
    let seqs: Vec<u64> = world
        .tail
        .messages_on(&dshdb_fleet::shard::session_subject(session, shard))
        .iter()
        .flat_map(|message| decode_tail_message(&message.payload).expect("decodes"))
        .flat_map(|batch| batch.events.into_iter().map(|event| event.seq))
        .collect();
    assert_eq!(seqs, (0..6).collect::<Vec<u64>>());

    // n1 dies; n2 rebuilds the whole acknowledged history from the tail.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let n2 = world.node("n2", &LinkControl::default());
    world.runtime.block_on(n2.tick()).expect("tick");
    assert_eq!(world.datas(&n2, session), ["0", "1", "2", "3", "4", "5"]);
}

/// The group purge (F-09-43) step by step on the fakes: concurrent appends to three
/// sessions of one shard form group messages; sealing two of them purges no group message
/// (each carries the third, unsealed); sealing the third purges every group message below
/// its `tail_from_stream_seq`, and later group messages (appends after the seals) stay. A
/// new owner then rebuilds every session exactly, from the runs plus what the tail still
/// holds. Checked once that it fails with the purge ignoring the sessions' manifests (cut at
/// the last group message): here the first seal purged 10 group messages; the 10,000
/// replicated schedules then failed too (seed 97: an acknowledged seq lost; seed 322: a
/// rebuild gap).
#[test]
fn group_messages_are_purged_once_every_session_they_carry_is_sealed() {
    use dshdb_fleet::shard::{group_subject, shard_of_in};
    use std::sync::atomic::Ordering;
    let world = LeaseWorld::new();
    let sessions: Vec<String> = (0..2_000)
        .map(|index| format!("p{index}"))
        .filter(|session| shard_of_in(session, SHARDS) == 0)
        .take(3)
        .collect();
    assert_eq!(sessions.len(), 3);
    let link1 = LinkControl::default();
    let n1 = world.node("n1", &link1);
    world.runtime.block_on(n1.tick()).expect("tick");
    for session in &sessions {
        let header = format!(r#"{{"id":"{session}"}}"#);
        world
            .runtime
            .block_on(n1.create_session(session, &header))
            .expect("create");
    }
    let append_all = |label: &str| {
        let results = world
            .runtime
            .block_on(futures::future::join_all(sessions.iter().map(|session| {
                let batch = vec![IncomingEvent::new("message", &format!("{label}-{session}"))];
                let n1 = &n1;
                async move { n1.append(session, &batch).await }
            })));
        for (session, result) in sessions.iter().zip(results) {
            result.unwrap_or_else(|error| panic!("{session} {label}: {error}"));
        }
    };
    const ROUNDS: usize = 10;
    for round in 0..ROUNDS {
        append_all(&format!("a{round}"));
    }
    let groups_before = world.tail.messages_on(&group_subject(0)).len();
    assert!(groups_before > 0, "no group message formed");

    // Two of three sealed: every group message still carries the third.
    for session in &sessions[..2] {
        let report = world.runtime.block_on(n1.seal(session)).expect("seal");
        assert_eq!(report.purged_group_messages, 0, "{session}: {report:?}");
    }
    assert_eq!(
        world.tail.messages_on(&group_subject(0)).len(),
        groups_before
    );
    // The third sealed: all of them go.
    let report = world.runtime.block_on(n1.seal(&sessions[2])).expect("seal");
    assert_eq!(report.purged_group_messages, groups_before as u64);
    assert!(world.tail.messages_on(&group_subject(0)).is_empty());
    assert_eq!(
        n1.metrics.purged_group_messages.load(Ordering::Relaxed),
        groups_before as u64
    );

    // Appends after the seals form group messages again; a seal of one session purges none
    // of them (the others are unsealed past them).
    for round in 0..ROUNDS {
        append_all(&format!("b{round}"));
    }
    let groups_after = world.tail.messages_on(&group_subject(0)).len();
    assert!(groups_after > 0, "no group message formed after the seals");
    let report = world.runtime.block_on(n1.seal(&sessions[0])).expect("seal");
    assert_eq!(report.purged_group_messages, 0, "{report:?}");
    assert_eq!(
        world.tail.messages_on(&group_subject(0)).len(),
        groups_after
    );

    // A new owner rebuilds every session exactly from the runs and the remaining tail.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let n2 = world.node("n2", &LinkControl::default());
    world.runtime.block_on(n2.tick()).expect("tick");
    for session in &sessions {
        let expected: Vec<String> = (0..ROUNDS)
            .map(|round| format!("a{round}-{session}"))
            .chain((0..ROUNDS).map(|round| format!("b{round}-{session}")))
            .collect();
        assert_eq!(world.datas(&n2, session), expected, "{session}");
    }
}

/// A node whose lease is refreshed by heartbeats on a connection of their own (a node
/// process's heartbeat thread): a takeover loop that cannot reach KV keeps the shards while
/// the heartbeats land; heartbeats that stop lose them at the TTL, and the first heartbeat
/// that lands again registers the node anew, after which the loop takes its shards back.
#[test]
fn heartbeats_elsewhere_keep_the_lease_and_their_silence_loses_it() {
    let world = LeaseWorld::new();
    let (loop_link, heartbeat_link) = (LinkControl::default(), LinkControl::default());
    let n1 = world.node("n1", &loop_link);
    let heartbeat = world.kv.client(heartbeat_link.clone());
    n1.refresh_elsewhere();
    let beat = || world.runtime.block_on(n1.heartbeat(&heartbeat));
    assert_eq!(
        world.runtime.block_on(n1.tick()).expect("tick").len(),
        SHARDS as usize
    );
    let epochs = n1.owned_shards();

    // The loop's link is down for three TTLs; the heartbeats land every half TTL.
    loop_link.set(Link::Down);
    for _ in 0..6 {
        world.clock.advance(NODE_TTL_MS / 2);
        beat().expect("a heartbeat lands");
        let _ = world.runtime.block_on(n1.tick());
    }
    assert_eq!(
        n1.owned_shards(),
        epochs,
        "shards lost while the lease was refreshed"
    );
    assert_eq!(LeaseWorld::leases_lost(&n1), 0);

    // The heartbeats stop landing: past the TTL the loop drops every shard.
    loop_link.set(Link::Up);
    heartbeat_link.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    assert!(beat().is_err());
    let _ = world.runtime.block_on(n1.tick());
    assert!(n1.owned_shards().is_empty(), "shards kept past the lease");
    assert_eq!(LeaseWorld::leases_lost(&n1), 1);

    // A heartbeat lands again: it registers the node anew, and the loop takes the shards
    // back at the same epochs (nobody took them meanwhile).
    heartbeat_link.set(Link::Up);
    beat().expect("the heartbeat registers again");
    assert_eq!(
        n1.metrics
            .reregistrations
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    world.runtime.block_on(n1.tick()).expect("tick");
    assert_eq!(n1.owned_shards(), epochs);
    assert!(!n1.is_stopped());
}

/// A `local`-mode node with `id` and `generation` over `disk`, registered.
fn local_node(world: &LeaseWorld, id: &str, generation: u64, disk: &Arc<MemoryTier>) -> FakeNode {
    let mut config = NodeConfig::new(id, id, generation);
    config.shard_count = SHARDS;
    config.lease_ttl_ms = NODE_TTL_MS;
    config.mode = DurabilityMode::Local;
    let local: Arc<dyn LocalTier> = disk.clone();
    let node = Node::new(
        config,
        world.tail.client(LinkControl::default()),
        world.kv.client(LinkControl::default()),
        world.cold.client(LinkControl::default()),
        local,
        world.clock.clone(),
    );
    world.runtime.block_on(node.start()).expect("registers");
    node
}

/// Shipping after a restart: what a `local`-mode process acknowledged and never shipped is
/// on its disk; the next process of the same node id that takes the shard straight back
/// (nobody in between) keeps those events, continues after them, and ships them. When
/// another node held the shard in between, they stay lost (reported by the dead process, as
/// before) and the local copy is made equal to the replicated history.
#[test]
fn a_restarted_local_node_ships_what_its_previous_process_acknowledged() {
    let world = LeaseWorld::new();
    let inherited = |node: &FakeNode| {
        node.metrics
            .inherited_events
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let disk = Arc::new(MemoryTier::default());
    let first = local_node(&world, "n1", 1, &disk);
    world.runtime.block_on(first.tick()).expect("tick");
    world
        .runtime
        .block_on(first.create_session("s0", r#"{"id":"s0"}"#))
        .expect("create");
    for data in ["1", "2", "3"] {
        world
            .append(&first, "s0", data)
            .expect("acknowledged locally");
    }
    assert_eq!(first.replication_lag().events, 3, "nothing shipped yet");
    drop(first);

    // The process dies with its backlog; its lease expires; the next process takes back
    // every shard at the next epoch and finds the three events past the tail's history.
    world.clock.advance(NODE_TTL_MS + 1);
    let second = local_node(&world, "n1", 2, &disk);
    world.runtime.block_on(second.tick()).expect("tick");
    assert_eq!(world.datas(&second, "s0"), ["1", "2", "3"]);
    assert_eq!(inherited(&second), 3);
    assert_eq!(second.replication_lag().events, 3);
    assert_eq!(world.append(&second, "s0", "4").expect("append"), 3);
    let round = world.runtime.block_on(second.ship());
    assert!(round.messages > 0, "{round:?}");
    assert_eq!(second.replication_lag().events, 0, "the backlog is shipped");
    drop(second);

    // Now the tail holds 1..4. A third process acknowledges 5 and dies; this time another
    // node takes the shards first, then the node id's next process gets them back: 5 was
    // not in the history the other node served, so it is not inherited.
    world.clock.advance(NODE_TTL_MS + 1);
    let third = local_node(&world, "n1", 3, &disk);
    world.runtime.block_on(third.tick()).expect("tick");
    world.append(&third, "s0", "5").expect("append");
    assert_eq!(world.datas(&third, "s0"), ["1", "2", "3", "4", "5"]);
    drop(third);
    world.clock.advance(NODE_TTL_MS + 1);
    let other = world.node("n2", &LinkControl::default());
    world.runtime.block_on(other.tick()).expect("tick");
    assert_eq!(world.datas(&other, "s0"), ["1", "2", "3", "4"]);
    drop(other);
    world.clock.advance(NODE_TTL_MS + 1);
    let fourth = local_node(&world, "n1", 4, &disk);
    world.runtime.block_on(fourth.tick()).expect("tick");
    assert_eq!(world.datas(&fourth, "s0"), ["1", "2", "3", "4"]);
    assert_eq!(inherited(&fourth), 0);
}

/// A tail that stops answering (servers gone without closing the connection) must not hold
/// a `local`-mode append behind the background shipping for longer than the round's wait:
/// the round gives up on the session's message after `ship_wait_timeout_ms`, marks the
/// stream stalled and releases the slot; later rounds only probe the stream. Once the tail
/// answers again the backlog ships in seq order. Without the round's wait the append waits
/// as long as the tail hangs (here: the test's deadline).
#[test]
fn a_hanging_tail_does_not_hold_local_appends_behind_the_shipping() {
    const SHIP_WAIT_MS: u64 = 200;
    const PROBE_WAIT_MS: u64 = 50;
    const DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
    let world = LeaseWorld::new();
    let tail_link = LinkControl::default();
    let mut config = NodeConfig::new("n1", "n1", 1);
    config.shard_count = SHARDS;
    config.lease_ttl_ms = NODE_TTL_MS;
    config.mode = DurabilityMode::Local;
    config.ship_wait_timeout_ms = SHIP_WAIT_MS;
    config.stalled_probe_timeout_ms = PROBE_WAIT_MS;
    let local: Arc<dyn LocalTier> = Arc::new(MemoryTier::default());
    let node = Node::new(
        config,
        world.tail.client(tail_link.clone()),
        world.kv.client(LinkControl::default()),
        world.cold.client(LinkControl::default()),
        local,
        world.clock.clone(),
    );
    world.runtime.block_on(node.start()).expect("registers");
    world.runtime.block_on(node.tick()).expect("tick");
    world
        .runtime
        .block_on(node.create_session("h0", r#"{"id":"h0"}"#))
        .expect("create");
    world.append(&node, "h0", "1").expect("append");
    assert_eq!(world.runtime.block_on(node.ship()).messages, 1);

    tail_link.set(Link::Hang);
    world
        .append(&node, "h0", "2")
        .expect("acknowledged locally");
    let (round, append_wait) = world
        .runtime
        .block_on(async {
            tokio::time::timeout(DEADLINE, async {
                tokio::join!(node.ship(), async {
                    // Lets the round take the session's slot and send first.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let started = std::time::Instant::now();
                    let ack = node
                        .append("h0", &[IncomingEvent::new("message", "3")])
                        .await;
                    (ack, started.elapsed())
                })
            })
            .await
        })
        .expect("the append waited for the hanging tail");
    let (ack, waited) = append_wait;
    assert_eq!(ack.expect("acknowledged locally").first_seq, 2);
    assert!(
        waited < std::time::Duration::from_millis(SHIP_WAIT_MS * 5),
        "the append waited {waited:?}"
    );
    assert_eq!((round.messages, round.stalled), (0, 1), "{round:?}");
    // The stream counts as stalled: the next round sends one probe and waits less.
    let probed = std::time::Instant::now();
    let round = world.runtime.block_on(node.ship());
    assert_eq!((round.messages, round.stalled), (0, 1), "{round:?}");
    assert!(probed.elapsed() < std::time::Duration::from_millis(SHIP_WAIT_MS));
    assert_eq!(node.replication_lag().events, 2);

    tail_link.set(Link::Up);
    for _ in 0..4 {
        world.runtime.block_on(node.ship());
    }
    assert_eq!(node.replication_lag().events, 0, "the backlog ships");
    let shard = dshdb_fleet::shard::shard_of_in("h0", SHARDS);
    let seqs: Vec<u64> = world
        .tail
        .messages_on(&dshdb_fleet::shard::session_subject("h0", shard))
        .iter()
        .flat_map(|message| decode_tail_message(&message.payload).expect("decodes"))
        .flat_map(|batch| batch.events.into_iter().map(|event| event.seq))
        .collect();
    assert_eq!(seqs, [0, 1, 2]);
}

/// F-09-58: a session created when its shard's stream already holds messages starts its
/// manifest's `tail_from_stream_seq` past them (read before the manifest is written), so a
/// new owner's rebuild replays only what came after the creation; both sessions of the
/// shard are rebuilt exactly.
#[test]
fn a_new_session_starts_its_tail_past_the_streams_last_message() {
    use dshdb_fleet::backend::TailLog;
    use dshdb_fleet::shard::{session_key, shard_of_in, stream_name};
    let world = LeaseWorld::new();
    let link1 = LinkControl::default();
    let n1 = world.node("n1", &link1);
    world.runtime.block_on(n1.tick()).expect("tick");
    let first = "early";
    let shard = shard_of_in(first, SHARDS);
    let second = (0..)
        .map(|index| format!("late{index}"))
        .find(|name| shard_of_in(name, SHARDS) == shard)
        .expect("a session id of the same shard");
    let manifest = |session: &str| -> SessionManifest {
        from_json(
            &world
                .kv
                .peek(Bucket::Sessions, &session_key(session))
                .expect("a manifest"),
            "manifest",
        )
        .expect("decodes")
    };
    let create = |session: &str| {
        world
            .runtime
            .block_on(n1.create_session(session, &format!(r#"{{"id":"{session}"}}"#)))
            .expect("create");
    };
    create(first);
    for data in ["1", "2", "3"] {
        world.append(&n1, first, data).expect("append");
    }
    let tail = world.tail.client(LinkControl::default());
    let before = world
        .runtime
        .block_on(tail.last_seq(&stream_name(shard)))
        .expect("last seq");
    assert!(before >= 3, "the stream holds the first session's messages");
    create(&second);
    assert_eq!(manifest(&second).tail_from_stream_seq, before + 1);
    for data in ["x", "y"] {
        world.append(&n1, &second, data).expect("append");
    }

    // n1 dies; n2 rebuilds both from the tail.
    link1.set(Link::Down);
    world.clock.advance(NODE_TTL_MS + 1);
    let n2 = world.node("n2", &LinkControl::default());
    world.runtime.block_on(n2.tick()).expect("tick");
    assert_eq!(world.datas(&n2, first), ["1", "2", "3"]);
    assert_eq!(world.datas(&n2, &second), ["x", "y"]);
}
