//! F9 of FLEET.md: the report run. Measures, on the real servers, and writes to a JSON file
//! (`DSHDB_FLEET_REPORT`, default `target/fleet-report.json`):
//!
//! - append latency, one event per append, one session at a time: `local` (the node's local
//!   tier alone: submit to the group commit, wait for the fdatasync) and `replicated`
//!   (`Node::append`: local fdatasync and JetStream quorum ack), p50/p99/p999, and
//!   `tail_publish_floor`: bare publishes with ack to a tail stream, outside any node (the
//!   server's share of a `replicated` append);
//! - replicated ingest of one node: 1,024 live sessions, one task per session appending
//!   batches concurrently, events/s and MB/s, and the same load on the local tier alone;
//! - `local` durability mode, on a node of its own run with `mode: Local`, its background
//!   replicator and heartbeat running: one-event append latency p50/p99/p999, the same
//!   ingest, the replication lag (events, bytes, age of the oldest unshipped event) sampled
//!   every 100 ms during the ingest, and the time the replicator takes to ship the backlog
//!   once the ingest stops;
//! - failover: `kill -9` of a node process, time until each of its sessions accepts an
//!   append on a survivor (lease TTL of the test fleets: 2 s);
//! - zombie writes after a takeover: attempted, rejected, fenced by the server;
//! - configuration facts: server version, `sync_interval`, replicas, stream count.
//!
//! Slow (about a minute) and machine-dependent, so `#[ignore]`d: run with
//! `cargo test --release -p dshdb-fleet --test f9_report -- --ignored --nocapture`
//! against `tests/fleet/servers.sh start` (with its `env`).

#![allow(clippy::unwrap_used)]

#[path = "real/common/mod.rs"]
mod common;

use common::{
    check_session, create_sessions, monitor_json, nats_monitor_port, servers_present,
    session_names, set_up_streams, wait_until, Fleet, SessionModel,
};
use dshdb::Event;
use dshdb_fleet::backend::{Fence, SystemClock, TailLog, TailPublish};
use dshdb_fleet::nats::Nats;
use dshdb_fleet::s3::S3;
use dshdb_fleet::shard::session_subject;
use dshdb_fleet::tier::{EngineTier, LocalTier};
use dshdb_fleet::{DurabilityMode, FleetError, IncomingEvent, Node, NodeConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Appends timed per mode for the latency figures.
const LATENCY_APPENDS: usize = 1_000;
/// Live sessions of the ingest figure (FLEET.md target: at 1,024 live sessions).
const INGEST_SESSIONS: usize = 1_024;
/// Events per append batch in the ingest run (an assistant turn's burst of chunks).
const INGEST_BATCH_EVENTS: usize = 4;
/// Length of each ingest run.
const INGEST_RUN: Duration = Duration::from_secs(10);
/// Shards of the in-process node (fewer than production's 1,024 to keep its takeover
/// round short; ownership does not enter the append path).
const SHARDS: u32 = 64;
/// Sessions of the failover and zombie measurements.
const FAILOVER_SESSIONS: usize = 24;
const ZOMBIE_SESSIONS: usize = 16;
/// Longest wait for a takeover, or for a session to accept an append again.
const DEADLINE: Duration = Duration::from_secs(30);
/// Lease TTL of the `local`-mode node: short, so that the replicated node takes its shards
/// soon after it stops.
const LOCAL_NODE_TTL: Duration = Duration::from_secs(2);
/// Heartbeat of the `local`-mode node (its local acks need a live lease).
const LOCAL_NODE_TICK: Duration = Duration::from_millis(500);
/// Live sessions of the `local`-mode ingest: as many as the replicated ingest's (an append
/// awaits its fsync without holding a runtime worker, so 1,024 of them no longer starve
/// the node's heartbeat past the test bucket's 2 s lease).
const LOCAL_MODE_INGEST_SESSIONS: usize = INGEST_SESSIONS;
/// Interval of the replication-lag samples.
const LAG_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// Pause of the test's replicator after a round that shipped nothing.
const SHIP_IDLE: Duration = Duration::from_millis(1);

type RealNode = Node<Nats, Nats, S3>;

/// A DSH-shaped event body of about 300 bytes.
fn event_data(session: &str, index: u64) -> String {
    format!(
        r#"{{"role":"assistant","session":"{session}","index":{index},"text":"{}"}}"#,
        "lorem ipsum dolor sit amet ".repeat(9)
    )
}

fn percentile(sorted: &[Duration], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index].as_secs_f64() * 1e3
}

fn latency_json(mut samples: Vec<Duration>) -> Value {
    samples.sort();
    json!({
        "appends": samples.len(),
        "p50_ms": percentile(&samples, 0.50),
        "p99_ms": percentile(&samples, 0.99),
        "p999_ms": percentile(&samples, 0.999),
    })
}

struct InProcess {
    node: Arc<RealNode>,
    tier: Arc<EngineTier>,
}

async fn in_process_node(id: &str, generation: u64, ttl: Duration) -> InProcess {
    in_process_node_in(id, generation, ttl, DurabilityMode::Replicated).await
}

async fn in_process_node_in(
    id: &str,
    generation: u64,
    ttl: Duration,
    mode: DurabilityMode,
) -> InProcess {
    let mut nats_config = common::nats_config();
    nats_config.node_ttl = ttl;
    let nats = Nats::connect(&nats_config).await.unwrap();
    let s3 = S3::new(&common::s3_config()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fleet-f9-{id}"));
    let _ = std::fs::remove_dir_all(&dir);
    let store = dshdb::Store::open(&dir, dshdb::Options::default()).unwrap();
    let tier = Arc::new(EngineTier::new(store));
    let mut config = NodeConfig::new(id, &format!("test://{id}"), generation);
    config.shard_count = SHARDS;
    config.lease_ttl_ms = u64::try_from(ttl.as_millis()).unwrap();
    config.mode = mode;
    let local: Arc<dyn LocalTier> = tier.clone();
    let node = Node::new(config, nats.clone(), nats, s3, local, Arc::new(SystemClock));
    wait_until_async(&format!("{id} registers"), || node.start()).await;
    InProcess {
        node: Arc::new(node),
        tier,
    }
}

async fn wait_until_async<F, Fut, T>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, FleetError>>,
{
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) => assert!(started.elapsed() < DEADLINE, "{what}: {error}"),
        }
        tokio::time::sleep(common::POLL).await;
    }
}

/// Ticks until the node owns every shard; returns how long that took.
async fn take_all(node: &RealNode) -> Duration {
    let started = Instant::now();
    while node.owned_shards().len() < SHARDS as usize {
        let _ = node.tick().await;
        assert!(
            started.elapsed() < DEADLINE,
            "{} owns too few shards",
            node.id()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    started.elapsed()
}

fn header(session: &str) -> String {
    format!(r#"{{"version":0,"id":"{session}","createdAt":1}}"#)
}

/// Latencies of `LATENCY_APPENDS` one-event appends through the node to a new session.
async fn node_append_latencies(process: &InProcess, session: &str) -> Vec<Duration> {
    process
        .node
        .create_session(session, &header(session))
        .await
        .unwrap();
    let mut samples = Vec::with_capacity(LATENCY_APPENDS);
    for index in 0..LATENCY_APPENDS as u64 {
        let event = IncomingEvent::new("assistant/chunk", &event_data(session, index));
        let started = Instant::now();
        process.node.append(session, &[event]).await.unwrap();
        samples.push(started.elapsed());
    }
    samples
}

/// Latency of one-event appends: the local tier alone, then through the node.
async fn latency(process: &InProcess, token: &str) -> Value {
    let replicated = node_append_latencies(process, &format!("f9lx{token}")).await;
    let local_session = format!("f9ox{token}");
    process
        .tier
        .replace(&local_session, &header(&local_session), &[])
        .unwrap();
    let mut local = Vec::with_capacity(LATENCY_APPENDS);
    for index in 0..LATENCY_APPENDS as u64 {
        let event = Event {
            seq: index,
            time: 1,
            event_type: "assistant/chunk".to_string(),
            data: event_data(&local_session, index),
            envelope: String::new(),
            flags: 0,
        };
        let started = Instant::now();
        let pending = process.tier.submit(&local_session, &[event]).unwrap();
        tokio::task::block_in_place(|| pending.wait()).unwrap();
        local.push(started.elapsed());
    }
    let floor = tail_publish_latencies(token).await;
    json!({
        "local": latency_json(local),
        "replicated": latency_json(replicated),
        "tail_publish_floor": latency_json(floor),
    })
}

/// The server's floor under `replicated` appends (FLEET.md's F9 asks the ack latency split
/// into the local fsync and the JetStream ack): bare publishes with ack of one event's
/// bytes to a tail stream, from a connection of their own, no fence, no node around them.
/// The subject is a session subject of shard 0 that no session uses.
async fn tail_publish_latencies(token: &str) -> Vec<Duration> {
    let nats = Nats::connect(&common::nats_config()).await.unwrap();
    let subject = session_subject(&format!("f9floor{token}"), 0);
    let mut samples = Vec::with_capacity(LATENCY_APPENDS);
    for index in 0..LATENCY_APPENDS as u64 {
        let message = TailPublish {
            subject: subject.clone(),
            payload: event_data(&subject, index).into_bytes().into(),
            msg_id: format!("f9floor{token}x{index}"),
            fence: None,
            headers: Vec::new(),
        };
        let started = Instant::now();
        nats.publish(message).await.unwrap();
        samples.push(started.elapsed());
    }
    samples
}

/// CPU time counters: the machine's (`/proc/stat`, all cores), this process's and each
/// NATS server's (`/proc/<pid>/stat`), all in clock ticks. On a machine with as few cores as
/// the servers it hosts, the ingest's bound is where the cores go.
struct CpuSample {
    machine_busy: u64,
    machine_total: u64,
    processes: Vec<(String, u64)>,
}

impl CpuSample {
    fn take() -> CpuSample {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|field| field.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        let mut processes = vec![(
            "test process (node, clients)".to_string(),
            process_ticks("self"),
        )];
        for server in 1..=3 {
            let pid_file = common::run_dir().join(format!("pids/nats{server}.pid"));
            let pid = std::fs::read_to_string(pid_file).unwrap_or_default();
            processes.push((format!("nats{server}"), process_ticks(pid.trim())));
        }
        CpuSample {
            machine_busy: total - idle,
            machine_total: total,
            processes,
        }
    }

    /// Cores used since this sample, overall and per process, and the machine's busy share.
    fn since(&self) -> Value {
        let now = CpuSample::take();
        let elapsed_ticks = (now.machine_total - self.machine_total).max(1) as f64;
        let cores = std::thread::available_parallelism().map_or(1, |count| count.get()) as f64;
        // Wall time in ticks of one core: the machine's ticks are summed over its cores.
        let wall_ticks = elapsed_ticks / cores;
        let mut per_process = serde_json::Map::new();
        for ((name, before), (_, after)) in self.processes.iter().zip(&now.processes) {
            per_process.insert(
                name.clone(),
                json!((after.saturating_sub(*before)) as f64 / wall_ticks),
            );
        }
        json!({
            "cores": cores,
            "machine_busy_share": (now.machine_busy - self.machine_busy) as f64 / elapsed_ticks,
            "cores_used_by": per_process,
        })
    }
}

/// utime + stime of `/proc/<pid>/stat` (fields 14 and 15, after the parenthesized name).
fn process_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let field = |index: usize| -> u64 {
        fields
            .get(index)
            .and_then(|text| text.parse().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// Payload sizes of the throughput floor's single-message publishes, as multiples of the
/// node's mean group payload.
const FLOOR_SIZE_FACTORS: [usize; 3] = [1, 4, 16];
/// Length of each throughput floor run.
const FLOOR_RUN: Duration = Duration::from_secs(4);

/// The server's publish rate under the replicated ingest (the bound on events/s is this
/// rate times the events each publish carries): one closed-loop publisher per tail stream,
/// as the node keeps one fenced publish in flight per stream, bare (no fence, no node).
/// Single messages of the node's mean group payload and of larger ones (does the server's
/// rate follow the bytes or the publishes?), then the node's mean payload split into as many
/// messages as its publishes carried, sent as one atomic batch as the node sends them,
/// without and with the node's fence on every message.
async fn tail_publish_throughput(
    token: &str,
    group_bytes: f64,
    messages_per_publish: f64,
) -> Value {
    let nats = Arc::new(Nats::connect(&common::nats_config()).await.unwrap());
    // Rounded to whole bytes and messages; a group is never empty.
    let group_bytes = group_bytes.max(1.0) as usize;
    let mut cases: Vec<(usize, usize, bool)> = FLOOR_SIZE_FACTORS
        .iter()
        .map(|factor| (group_bytes * factor, 1, false))
        .collect();
    let split = (messages_per_publish.ceil() as usize).max(1);
    if split > 1 {
        // Split unfenced: the first case already is a single message of this payload.
        cases.push((group_bytes, split, false));
    }
    cases.push((group_bytes, split, true));
    let mut runs = Vec::new();
    for (case, (bytes, messages, fenced)) in cases.into_iter().enumerate() {
        let name = format!("f9tput{token}x{case}");
        let publishes = publish_closed_loop(&nats, &name, bytes, messages, fenced).await;
        let seconds = FLOOR_RUN.as_secs_f64();
        runs.push(json!({
            "payload_bytes": bytes,
            "messages_per_publish": messages,
            "fenced": fenced,
            "publishers": dshdb_fleet::shard::STREAM_COUNT,
            "publishes_per_s": publishes as f64 / seconds,
            "payload_mb_per_s": (publishes as f64 * bytes as f64) / seconds / 1e6,
        }));
    }
    json!(runs)
}

/// Publishes of `bytes` in `messages` messages (one atomic batch when more than one, each on
/// a shard subject of its own in the stream) completed in [`FLOOR_RUN`] by one closed-loop
/// publisher per tail stream; `fenced`: every message carries the node's fence (expected
/// last sequence of a marker subject, which nothing else writes, so it always holds).
async fn publish_closed_loop(
    nats: &Arc<Nats>,
    name: &str,
    bytes: usize,
    messages: usize,
    fenced: bool,
) -> u64 {
    let publishes = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + FLOOR_RUN;
    let stream_count = dshdb_fleet::shard::STREAM_COUNT;
    let tasks: Vec<_> = (0..stream_count)
        .map(|stream| {
            let (nats, publishes, name) = (nats.clone(), publishes.clone(), name.to_string());
            tokio::spawn(async move {
                let fence = if fenced {
                    Some(floor_marker(&nats, &session_subject(&format!("{name}e"), stream)).await)
                } else {
                    None
                };
                let mut index = 0u64;
                while Instant::now() < deadline {
                    let batch: Vec<TailPublish> = (0..messages as u32)
                        .map(|part| {
                            let subject = session_subject(&name, stream + part * stream_count);
                            TailPublish {
                                msg_id: format!("{subject}x{index}"),
                                subject,
                                payload: vec![b'x'; bytes / messages].into(),
                                fence: fence.clone(),
                                headers: Vec::new(),
                            }
                        })
                        .collect();
                    if messages == 1 {
                        let [single] = <[TailPublish; 1]>::try_from(batch).unwrap();
                        nats.publish(single).await.unwrap();
                    } else {
                        nats.publish_batch(batch).await.unwrap();
                    }
                    publishes.fetch_add(1, Ordering::Relaxed);
                    index += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    publishes.load(Ordering::Relaxed)
}

/// Publishes a marker on `subject`: the fence of the messages that follow.
async fn floor_marker(nats: &Nats, subject: &str) -> Fence {
    let marker = TailPublish {
        subject: subject.to_string(),
        payload: bytes::Bytes::new(),
        msg_id: format!("{subject}x-marker"),
        fence: None,
        headers: Vec::new(),
    };
    let ack = nats.publish(marker).await.unwrap();
    Fence {
        subject: subject.to_string(),
        last_seq: ack.stream_seq,
    }
}

/// Events/s of `INGEST_SESSIONS` concurrent writers for `INGEST_RUN`, through the node
/// (`replicated`) or on the local tier alone.
/// `label` names the run's sessions; `replicated`: through the node (whatever its mode),
/// else on the local tier alone.
async fn ingest(process: &InProcess, token: &str, label: &str, replicated: bool) -> Value {
    ingest_sessions(process, token, label, replicated, INGEST_SESSIONS).await
}

async fn ingest_sessions(
    process: &InProcess,
    token: &str,
    label: &str,
    replicated: bool,
    count: usize,
) -> Value {
    let sessions: Vec<String> = (0..count)
        .map(|index| format!("f9i{label}x{token}x{index}"))
        .collect();
    for session in &sessions {
        if replicated {
            process
                .node
                .create_session(session, &header(session))
                .await
                .unwrap();
        } else {
            process
                .tier
                .replace(session, &header(session), &[])
                .unwrap();
        }
    }
    let events = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let publishes_before = process
        .node
        .metrics
        .fenced_publishes
        .load(Ordering::Relaxed);
    let messages_before = process
        .node
        .metrics
        .published_messages
        .load(Ordering::Relaxed);
    let deadline = Instant::now() + INGEST_RUN;
    let started = Instant::now();
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            let (node, tier) = (process.node.clone(), process.tier.clone());
            let (events, bytes) = (events.clone(), bytes.clone());
            tokio::spawn(async move {
                let mut next = 0u64;
                while Instant::now() < deadline {
                    let data: Vec<String> = (0..INGEST_BATCH_EVENTS as u64)
                        .map(|offset| event_data(&session, next + offset))
                        .collect();
                    let size: usize = data.iter().map(String::len).sum();
                    if replicated {
                        let batch: Vec<IncomingEvent> = data
                            .iter()
                            .map(|data| IncomingEvent::new("assistant/chunk", data))
                            .collect();
                        node.append(&session, &batch).await.unwrap();
                    } else {
                        let batch: Vec<Event> = data
                            .into_iter()
                            .enumerate()
                            .map(|(offset, data)| Event {
                                seq: next + offset as u64,
                                time: 1,
                                event_type: "assistant/chunk".to_string(),
                                data,
                                envelope: String::new(),
                                flags: 0,
                            })
                            .collect();
                        let pending = tier.submit(&session, &batch).unwrap();
                        tokio::task::block_in_place(|| pending.wait()).unwrap();
                    }
                    next += INGEST_BATCH_EVENTS as u64;
                    events.fetch_add(INGEST_BATCH_EVENTS as u64, Ordering::Relaxed);
                    bytes.fetch_add(size as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let events = events.load(Ordering::Relaxed);
    let bytes = bytes.load(Ordering::Relaxed);
    let metrics = &process.node.metrics;
    let publishes = metrics.fenced_publishes.load(Ordering::Relaxed) - publishes_before;
    json!({
        "fenced_publishes_in_run": publishes,
        "events_per_publish": events as f64 / publishes.max(1) as f64,
        "messages_per_publish": (metrics.published_messages.load(Ordering::Relaxed) - messages_before) as f64
            / publishes.max(1) as f64,
        "data_bytes_per_publish": bytes as f64 / publishes.max(1) as f64,
        "fence_collisions_total": metrics.fence_collisions.load(Ordering::Relaxed),
        "fenced_writes_total": metrics.fenced_writes.load(Ordering::Relaxed),
        "fenced_publishes_total": metrics.fenced_publishes.load(Ordering::Relaxed),
        "published_messages_total": metrics.published_messages.load(Ordering::Relaxed),
        "published_batches_total": metrics.published_batches.load(Ordering::Relaxed),
        "group_duplicate_fallbacks_total": metrics.group_duplicate_fallbacks.load(Ordering::Relaxed),
        "publish_micros_total": metrics.publish_micros.load(Ordering::Relaxed),
        "sessions": count,
        "events_per_append": INGEST_BATCH_EVENTS,
        "seconds": seconds,
        "events": events,
        "events_per_s": events as f64 / seconds,
        "data_mb_per_s": bytes as f64 / seconds / 1e6,
    })
}

/// Runs the node's replicator until `stop`.
async fn ship_until(node: Arc<RealNode>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        if node.ship().await.messages == 0 {
            tokio::time::sleep(SHIP_IDLE).await;
        }
    }
}

/// Runs the node's heartbeat until `stop`.
async fn tick_until(node: Arc<RealNode>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let _ = node.tick().await;
        tokio::time::sleep(LOCAL_NODE_TICK).await;
    }
}

/// Samples the node's replication lag every [`LAG_SAMPLE_INTERVAL`] until `stop`.
async fn sample_lag(
    node: Arc<RealNode>,
    stop: Arc<AtomicBool>,
) -> Vec<dshdb_fleet::ReplicationLag> {
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        samples.push(node.replication_lag());
        tokio::time::sleep(LAG_SAMPLE_INTERVAL).await;
    }
    samples
}

/// Median and maximum of `values`.
fn median_max(mut values: Vec<u64>) -> Value {
    values.sort_unstable();
    json!({
        "p50": values.get(values.len() / 2).copied().unwrap_or(0),
        "max": values.last().copied().unwrap_or(0),
    })
}

/// The `local` mode figures (see the module comment); the node stops at the end, and its
/// lease runs out within [`LOCAL_NODE_TTL`].
async fn local_mode(token: &str) -> Value {
    let process = in_process_node_in(
        &format!("f9m{token}"),
        1,
        LOCAL_NODE_TTL,
        DurabilityMode::Local,
    )
    .await;
    take_all(&process.node).await;
    let stop = Arc::new(AtomicBool::new(false));
    let heartbeat = tokio::spawn(tick_until(process.node.clone(), stop.clone()));
    let shipper = tokio::spawn(ship_until(process.node.clone(), stop.clone()));
    let latency = node_append_latencies(&process, &format!("f9mlx{token}")).await;
    let sampling = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_lag(process.node.clone(), sampling.clone()));
    let ingest = ingest_sessions(&process, token, "m", true, LOCAL_MODE_INGEST_SESSIONS).await;
    sampling.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    let drain_started = Instant::now();
    while process.node.replication_lag().events > 0 {
        assert!(
            drain_started.elapsed() < DEADLINE,
            "the backlog did not drain"
        );
        tokio::time::sleep(SHIP_IDLE).await;
    }
    let drain = drain_started.elapsed();
    stop.store(true, Ordering::Relaxed);
    heartbeat.await.unwrap();
    shipper.await.unwrap();
    let metrics = &process.node.mode_metrics;
    json!({
        "append_latency": latency_json(latency),
        "ingest": ingest,
        "replication_lag": {
            "sample_interval_ms": LAG_SAMPLE_INTERVAL.as_millis() as u64,
            "samples": samples.len(),
            "events": median_max(samples.iter().map(|lag| lag.events).collect()),
            "bytes": median_max(samples.iter().map(|lag| lag.bytes).collect()),
            "oldest_age_ms": median_max(samples.iter().map(|lag| lag.oldest_age_ms).collect()),
            "drain_ms": drain.as_secs_f64() * 1e3,
            "after_drain_events": process.node.replication_lag().events,
        },
        "local_acked_events": metrics.local_acked_events.load(Ordering::Relaxed),
        "shipped_events": metrics.shipped_events.load(Ordering::Relaxed),
        "shipped_messages": metrics.shipped_messages.load(Ordering::Relaxed),
        "unshipped_events_lost": metrics.unshipped_events_lost.load(Ordering::Relaxed),
    })
}

/// Node A owns every shard, stops ticking past its lease (a pause), node B takes over,
/// then A writes to its sessions: every write must be refused.
async fn zombie(token: &str) -> Value {
    let ttl = common::NODE_TTL;
    let a = in_process_node(&format!("f9za{token}"), 1, ttl).await;
    take_all(&a.node).await;
    let sessions: Vec<String> = (0..ZOMBIE_SESSIONS)
        .map(|index| format!("f9zx{token}x{index}"))
        .collect();
    for session in &sessions {
        a.node
            .create_session(session, &header(session))
            .await
            .unwrap();
        a.node
            .append(session, &[IncomingEvent::new("message", "{}")])
            .await
            .unwrap();
    }
    let b = in_process_node(&format!("f9zb{token}"), 1, ttl).await;
    let takeover = take_all(&b.node).await;
    let (mut rejected, mut acknowledged) = (0u64, 0u64);
    for session in &sessions {
        match a
            .node
            .append(
                session,
                &[IncomingEvent::new("message", r#"{"zombie":true}"#)],
            )
            .await
        {
            Ok(_) => acknowledged += 1,
            Err(FleetError::Moved { .. }) => rejected += 1,
            Err(error) => panic!("zombie write to {session}: {error}"),
        }
    }
    let fenced = a.node.metrics.fenced_writes.load(Ordering::Relaxed);
    assert_eq!(acknowledged, 0, "a zombie write was acknowledged");
    json!({
        "attempted": sessions.len(),
        "rejected": rejected,
        "acknowledged": acknowledged,
        "fenced_by_server": fenced,
        "takeover_after_pause_s": takeover.as_secs_f64(),
    })
}

/// `kill -9` of one of three node processes; for each of its sessions, the time until it
/// accepts an append on a survivor.
fn failover(token: &str) -> Value {
    let mut fleet = Fleet::spawn("q", token, 3, 16);
    let mut router = fleet.router();
    let sessions = session_names("f9f", token, FAILOVER_SESSIONS);
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();
    for (session, model) in sessions.iter().zip(models.iter_mut()) {
        wait_until("an append", DEADLINE, || {
            common::append_once(&mut router, session, model)
        });
    }
    let victim = fleet.ids[1].clone();
    let victims: Vec<usize> = (0..FAILOVER_SESSIONS)
        .filter(|index| router.owner_of.get(&sessions[*index]) == Some(&victim))
        .collect();
    fleet.kill(1);
    let killed_at = Instant::now();
    let mut survivors = fleet.router_without(&[1]);
    let mut recovered = Vec::new();
    for index in &victims {
        let (session, model) = (&sessions[*index], &mut models[*index]);
        wait_until(&format!("{session} accepts appends"), DEADLINE, || {
            common::append_once(&mut survivors, session, model)
        });
        recovered.push(killed_at.elapsed());
    }
    for (session, model) in sessions.iter().zip(&models) {
        check_session(&mut survivors, session, model);
    }
    recovered.sort();
    json!({
        "lease_ttl_s": common::NODE_TTL.as_secs_f64(),
        "sessions_on_killed_node": victims.len(),
        "first_writable_after_s": recovered.first().map_or(0.0, Duration::as_secs_f64),
        "all_writable_after_s": recovered.last().map_or(0.0, Duration::as_secs_f64),
    })
}

fn configuration() -> Value {
    let varz = monitor_json(nats_monitor_port(1), "varz").unwrap();
    let jsz = monitor_json(nats_monitor_port(1), "jsz?streams=true&config=true").unwrap();
    let tail_streams: Vec<&Value> = jsz["account_details"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten())
        .filter(|stream| {
            stream["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("DSH_"))
        })
        .collect();
    json!({
        "server_version": varz["version"],
        "sync_always": varz["jetstream"]["config"]["sync_always"],
        "servers": 3,
        "tail_streams": tail_streams.len(),
        "tail_replicas": tail_streams.first().map(|stream| stream["config"]["num_replicas"].clone()),
        "shards_in_process_node": SHARDS,
    })
}

#[test]
#[ignore = "the F9 report run: slow, run with --ignored against the fleet servers"]
fn f9_report() {
    let Some(_turn) = servers_present("f9_report") else {
        return;
    };
    let token = common::run_token();
    let runtime = common::two_worker_runtime();
    set_up_streams(&runtime);
    let (local_mode, latency, ingest_replicated, ingest_local, zombie) = runtime.block_on(async {
        // First, so that its shards pass to the replicated node once its short lease ends.
        let local_mode = local_mode(&token).await;
        let process = in_process_node(&format!("f9n{token}"), 1, Duration::from_secs(10)).await;
        take_all(&process.node).await;
        let latency = latency(&process, &token).await;
        let cpu_before = CpuSample::take();
        let mut replicated = ingest(&process, &token, "r", true).await;
        replicated["cpu"] = cpu_before.since();
        let group_bytes = replicated["data_bytes_per_publish"].as_f64().unwrap_or(0.0);
        let messages = replicated["messages_per_publish"].as_f64().unwrap_or(1.0);
        replicated["publish_floor"] = tail_publish_throughput(&token, group_bytes, messages).await;
        let local = ingest(&process, &token, "o", false).await;
        let zombie = zombie(&token).await;
        (local_mode, latency, replicated, local, zombie)
    });
    let failover = failover(&token);
    let report = json!({
        "configuration": configuration(),
        "append_latency": latency,
        "ingest_replicated": ingest_replicated,
        "ingest_local": ingest_local,
        "local_mode": local_mode,
        "failover": failover,
        "zombie_writes": zombie,
    });
    let path = std::env::var("DSHDB_FLEET_REPORT").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/fleet-report.json"),
        PathBuf::from,
    );
    let text = serde_json::to_string_pretty(&report).unwrap();
    std::fs::write(&path, &text).unwrap();
    eprintln!("f9: report written to {}:\n{text}", path.display());
    assert_eq!(report["zombie_writes"]["acknowledged"], 0);
    assert_eq!(
        report["local_mode"]["replication_lag"]["after_drain_events"],
        0
    );
    assert_eq!(report["configuration"]["sync_always"], true);
}
