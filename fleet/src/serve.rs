//! A fleet node as a process (`dshdb fleet-node`, `dshdb-fleet-node`): the node over NATS
//! and S3 with its local store, a heartbeat thread, a takeover loop, and a small request
//! protocol on a loopback TCP port, so that tests can `kill -9` a real node.
//!
//! Protocol: one JSON object per line each way.
//! - `{"op":"create","session":S,"header":H}` → `{"ok":true}`
//! - `{"op":"append","session":S,"events":[{"type":T,"data":D}]}` →
//!   `{"ok":true,"first_seq":F,"end_seq":E,"replicated":R}` (sent after the local fsync
//!   and, with `"replicated":true`, the JetStream ack; `false` in `local` or `sealed` mode
//!   and on a degraded stream)
//! - `{"op":"read","session":S}` → `{"ok":true,"events":[{"seq","type","data"}]}`
//! - `{"op":"export","session":S}` → `{"ok":true,"export":TEXT}`: the session as DSH
//!   `session.jsonl` (the engine's export of the checked local copy)
//! - `{"op":"seal","session":S}` → `{"ok":true,"queued":true}`: queued for the background
//!   sealer, which retries with backoff until the seal completes (or the shard moves to
//!   another node; a lost lease keeps it queued)
//! - `{"op":"status"}` → `{"ok":true,"node","mode","stopped","owned_shards":[..],"metrics":{..},
//!   "replication":{"lag":{"events","bytes","oldest_age_ms","sessions"},"unshipped":[..],
//!   "at_risk_windows":[..],"lost_unshipped":[..]},
//!   "seal_queue":{"pending","completed","failed_attempts","dropped_moved",
//!   "triggered_by_size","triggered_by_idle","unsealed_sessions","last_error"}}`
//! - `{"op":"stall","ms":N}` → `{"ok":true,"workers":W}`: test hook, answered only with
//!   [`TEST_HOOKS_VARIABLE`] set: blocks every runtime worker for N ms
//!
//! The lease is refreshed on a thread of its own (`dshdb-heartbeat`, with its own runtime
//! and NATS connection), so that a busy runtime cannot delay it past the TTL.
//!
//! A failure is `{"ok":false,"error":TEXT}`, plus `"moved":true,"owner":ID` when another
//! node owns the session's shard.

use crate::backend::SystemClock;
use crate::error::{FleetError, FleetResult};
use crate::modes::{DurabilityMode, UnshippedRange};
use crate::nats::{Nats, NatsConfig};
use crate::s3::{S3Config, S3};
use crate::sealer::SealQueue;
use crate::tier::{EngineTier, LocalTier};
use crate::triggers::{SealPolicy, DEFAULT_SEAL_IDLE_MS, DEFAULT_SEAL_TAIL_BYTES};
use crate::{IncomingEvent, Node, NodeConfig};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Largest request line, in bytes (a batch must fit a tail message anyway).
pub const MAX_REQUEST_LINE_BYTES: usize = 2 * 1024 * 1024;

/// What a node process needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub node_id: String,
    /// Loopback address the request protocol listens on.
    pub listen: String,
    pub store_dir: PathBuf,
    pub nats: NatsConfig,
    pub s3: S3Config,
    pub shard_count: u32,
    /// Pause between lease refreshes and takeover rounds.
    pub tick_interval: Duration,
    /// When appends are acknowledged (`DSHDB_FLEET_MODE`, default `replicated`).
    pub mode: DurabilityMode,
    /// `degrade_to_local_after` in ms (`DSHDB_FLEET_DEGRADE_TO_LOCAL_AFTER_MS`; unset: off).
    pub degrade_to_local_after_ms: Option<u64>,
    /// When sessions are sealed without being asked (`DSHDB_FLEET_SEAL_TAIL_BYTES`,
    /// `DSHDB_FLEET_SEAL_IDLE_MS`; 0 turns a trigger off; unset: 4 MiB and 5 min).
    pub seal_policy: SealPolicy,
}

type ProcessNode = Node<Nats, Nats, S3>;

/// Pause between rounds of the background sealer.
pub const SEAL_ROUND_INTERVAL: Duration = Duration::from_millis(100);
/// Pause of the background replicator after a round that shipped nothing (a round that
/// shipped something is followed at once: the backlog drains at the tail's pace).
pub const SHIP_IDLE_INTERVAL: Duration = Duration::from_millis(2);
/// Pause of the background replicator after a round in which a stream stalled.
pub const SHIP_STALLED_INTERVAL: Duration = Duration::from_millis(100);
/// Unshipped and lost ranges listed in a status reply (their totals are in the lag and
/// the metrics).
pub const MAX_STATUS_RANGES: usize = 1024;

/// What a node process serves requests with.
struct Served {
    node: ProcessNode,
    tier: Arc<EngineTier>,
    seals: SealQueue,
}

fn error_reply(error: &FleetError) -> Value {
    match error {
        FleetError::Moved { owner, epoch, .. } => json!({
            "ok": false, "moved": true, "owner": owner, "epoch": epoch,
            "error": error.to_string(),
        }),
        other => json!({"ok": false, "error": other.to_string()}),
    }
}

fn text_field<'a>(request: &'a Value, name: &str) -> FleetResult<&'a str> {
    request
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| FleetError::InvalidInput {
            reason: format!("request field {name:?} missing or not text"),
        })
}

fn incoming_events(request: &Value) -> FleetResult<Vec<IncomingEvent>> {
    let events = request
        .get("events")
        .and_then(Value::as_array)
        .ok_or_else(|| FleetError::InvalidInput {
            reason: "request field \"events\" missing or not an array".to_string(),
        })?;
    events
        .iter()
        .map(|event| {
            Ok(IncomingEvent::new(
                text_field(event, "type")?,
                text_field(event, "data")?,
            ))
        })
        .collect()
}

fn metrics_json(metrics: &crate::node::NodeMetrics) -> Value {
    let read =
        |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    json!({
        "appends_acked": read(&metrics.appends_acked),
        "events_acked": read(&metrics.events_acked),
        "publish_retries": read(&metrics.publish_retries),
        "dedup_hits": read(&metrics.dedup_hits),
        "fenced_writes": read(&metrics.fenced_writes),
        "shards_lost": read(&metrics.shards_lost),
        "takeovers": read(&metrics.takeovers),
        "rebuilds": read(&metrics.rebuilds),
        "rebuilt_events": read(&metrics.rebuilt_events),
        "seals": read(&metrics.seals),
        "sealed_events": read(&metrics.sealed_events),
        "purged_messages": read(&metrics.purged_messages),
        "purged_group_messages": read(&metrics.purged_group_messages),
        "not_acknowledged": read(&metrics.not_acknowledged),
        "leases_lost": read(&metrics.leases_lost),
        "reregistrations": read(&metrics.reregistrations),
        "fence_collisions": read(&metrics.fence_collisions),
        "fenced_publishes": read(&metrics.fenced_publishes),
        "published_messages": read(&metrics.published_messages),
        "published_batches": read(&metrics.published_batches),
        "group_duplicate_fallbacks": read(&metrics.group_duplicate_fallbacks),
        "publish_micros": read(&metrics.publish_micros),
        "tail_checkpoints": read(&metrics.tail_checkpoints),
        "inherited_events": read(&metrics.inherited_events),
    })
}

fn ranges_json(ranges: &[UnshippedRange]) -> Vec<Value> {
    ranges
        .iter()
        .take(MAX_STATUS_RANGES)
        .map(|range| {
            json!({"session": range.session, "shard": range.shard, "epoch": range.epoch,
                   "first_seq": range.first_seq, "end_seq": range.end_seq,
                   "acked_at_ms": range.acked_at_ms})
        })
        .collect()
}

/// The replication part of the status: lag, the exact at-risk ranges, the windows.
fn replication_json(node: &ProcessNode) -> Value {
    let lag = node.replication_lag();
    let read =
        |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    let metrics = &node.mode_metrics;
    let windows: Vec<Value> = node
        .at_risk_windows()
        .iter()
        .map(|window| {
            json!({"stream": window.stream, "from_ms": window.from_ms, "to_ms": window.to_ms,
                   "events": window.events})
        })
        .collect();
    json!({
        "lag": {"events": lag.events, "bytes": lag.bytes, "oldest_age_ms": lag.oldest_age_ms,
                "sessions": lag.sessions},
        "unshipped": ranges_json(&node.unshipped()),
        "lost_unshipped": ranges_json(&node.lost_unshipped()),
        "at_risk_windows": windows,
        "local_acks": read(&metrics.local_acks),
        "local_acked_events": read(&metrics.local_acked_events),
        "degraded_events": read(&metrics.degraded_events),
        "degrades": read(&metrics.degrades),
        "shipped_messages": read(&metrics.shipped_messages),
        "shipped_events": read(&metrics.shipped_events),
        "unshipped_events_lost": read(&metrics.unshipped_events_lost),
        "unshipped_events_sealed": read(&metrics.unshipped_events_sealed),
    })
}

fn status(served: &Served) -> Value {
    let seals = served.seals.status();
    let owned: Vec<u32> = served.node.owned_shards().keys().copied().collect();
    json!({
        "ok": true,
        "node": served.node.id(),
        "mode": served.node.config().mode.name(),
        "degrade_to_local_after_ms": served.node.config().degrade_to_local_after_ms,
        "stopped": served.node.is_stopped(),
        "owned_shards": owned,
        "metrics": metrics_json(&served.node.metrics),
        "replication": replication_json(&served.node),
        "seal_queue": {
            "pending": seals.pending,
            "completed": seals.completed,
            "failed_attempts": seals.failed_attempts,
            "dropped_moved": seals.dropped_moved,
            "triggered_by_size": seals.triggered_by_size,
            "triggered_by_idle": seals.triggered_by_idle,
            "unsealed_sessions": served.node.unsealed_sessions(),
            "last_error": seals.last_error,
        },
    })
}

async fn handle(served: &Served, request: &Value) -> FleetResult<Value> {
    let op = text_field(request, "op")?;
    if op == "status" {
        return Ok(status(served));
    }
    if op == "stall" && std::env::var_os(TEST_HOOKS_VARIABLE).is_some() {
        return stall_runtime(request).await;
    }
    let node = &served.node;
    let session = text_field(request, "session")?;
    match op {
        "create" => {
            node.create_session(session, text_field(request, "header")?)
                .await?;
            Ok(json!({"ok": true}))
        }
        "append" => {
            let ack = node.append(session, &incoming_events(request)?).await?;
            Ok(
                json!({"ok": true, "first_seq": ack.first_seq, "end_seq": ack.end_seq,
                      "replicated": ack.replicated}),
            )
        }
        "read" => {
            let events = node.read(session, 0, u64::MAX).await?;
            let events: Vec<Value> = events
                .iter()
                .map(
                    |event| json!({"seq": event.seq, "type": event.event_type, "data": event.data}),
                )
                .collect();
            Ok(json!({"ok": true, "events": events}))
        }
        "export" => {
            // The header read checks the local copy against the replicated history first
            // (rebuilding it when needed), so the export is of the checked copy.
            node.header(session).await?;
            let bytes = dshdb::exchange::export_dsh_jsonl(served.tier.store(), session)?;
            let text = String::from_utf8(bytes).map_err(|error| FleetError::Corrupt {
                what: "export",
                reason: format!("{session}: not UTF-8: {error}"),
            })?;
            Ok(json!({"ok": true, "export": text}))
        }
        "seal" => {
            // Only the owner seals; a request elsewhere is answered with the owner.
            node.check_owner(session).await?;
            served
                .seals
                .request(session)
                .map_err(|error| FleetError::InvalidInput {
                    reason: error.to_string(),
                })?;
            Ok(json!({"ok": true, "queued": true}))
        }
        other => Err(FleetError::InvalidInput {
            reason: format!("unknown op {other:?}"),
        }),
    }
}

async fn serve_connection(served: Arc<Served>, stream: TcpStream) {
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = if line.len() > MAX_REQUEST_LINE_BYTES {
            json!({"ok": false, "error": "request line too long"})
        } else {
            match serde_json::from_str::<Value>(&line) {
                Ok(request) => handle(&served, &request)
                    .await
                    .unwrap_or_else(|error| error_reply(&error)),
                Err(error) => json!({"ok": false, "error": format!("not JSON: {error}")}),
            }
        };
        let mut text = reply.to_string();
        text.push('\n');
        if writer.write_all(text.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// With this variable set (to anything), a node answers `{"op":"stall","ms":N}` by
/// blocking every worker of its runtime for N ms, as CPU-bound work would: the tests'
/// way to show that the lease outlives a busy runtime. Nothing else reads it.
pub const TEST_HOOKS_VARIABLE: &str = "DSHDB_FLEET_TEST_HOOKS";

/// Longest stall the test hook accepts, in milliseconds.
const MAX_STALL_MS: u64 = 60_000;

/// The `stall` test hook: one blocking task per runtime worker, each holding its worker
/// for the stall, while this request waits for them.
async fn stall_runtime(request: &Value) -> FleetResult<Value> {
    let millis = request
        .get("ms")
        .and_then(Value::as_u64)
        .filter(|millis| *millis <= MAX_STALL_MS)
        .ok_or_else(|| FleetError::InvalidInput {
            reason: format!("stall needs \"ms\": a number of at most {MAX_STALL_MS}"),
        })?;
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let stalls: Vec<_> = (0..workers)
        .map(|_| {
            tokio::spawn(async move {
                std::thread::sleep(Duration::from_millis(millis));
            })
        })
        .collect();
    for stall in stalls {
        let _ = stall.await;
    }
    Ok(json!({"ok": true, "workers": workers}))
}

/// Queues what the seal policy makes due and seals what is queued and due, until the node
/// stops.
async fn seal_loop(served: Arc<Served>) {
    let now_ms = || crate::backend::Clock::now_ms(&SystemClock);
    while !served.node.is_stopped() {
        served.seals.request_due(&served.node);
        served.seals.run_round(&served.node, now_ms).await;
        tokio::time::sleep(SEAL_ROUND_INTERVAL).await;
    }
}

/// Ships the backlog (`local` mode, degraded streams) until the node stops.
async fn ship_loop(served: Arc<Served>) {
    while !served.node.is_stopped() {
        let round = served.node.ship().await;
        let pause = if round.stalled > 0 {
            SHIP_STALLED_INTERVAL
        } else if round.messages > 0 {
            Duration::ZERO
        } else {
            SHIP_IDLE_INTERVAL
        };
        if pause.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(pause).await;
        }
    }
}

/// Ownership checks and takeovers, until the node stops (its id taken by another process;
/// a lease that merely expired drops the shards and the heartbeat registers again).
async fn tick_loop(served: Arc<Served>, interval: Duration) {
    let node = &served.node;
    loop {
        if let Err(error) = node.tick().await {
            eprintln!("fleet-node {}: tick: {error}", node.id());
            if node.is_stopped() {
                return;
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Starts the lease refresh on a thread of its own, with its own runtime and NATS
/// connection, and hands the refresh over to it once it is connected. On the node's
/// runtime a refresh waited behind whatever kept the workers busy (a thousand appends, a
/// takeover's rebuilds), and a refresh later than the TTL drops every shard: F4 once failed
/// from that in CI, and F9's `local` mode was held to 64 sessions by it.
async fn start_heartbeat(
    served: Arc<Served>,
    nats: NatsConfig,
    interval: Duration,
) -> FleetResult<()> {
    let (connected, answer) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("dshdb-heartbeat".to_string())
        .spawn(move || heartbeat_thread(&served, &nats, interval, connected));
    if let Err(error) = spawned {
        return Err(FleetError::InvalidInput {
            reason: format!("heartbeat thread: {error}"),
        });
    }
    match answer.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(FleetError::InvalidInput {
            reason: "the heartbeat thread ended before it connected".to_string(),
        }),
    }
}

/// The heartbeat thread: connects, reports it, then refreshes the lease every `interval`
/// until the node stops.
fn heartbeat_thread(
    served: &Served,
    nats: &NatsConfig,
    interval: Duration,
    connected: tokio::sync::oneshot::Sender<FleetResult<()>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = connected.send(Err(FleetError::InvalidInput {
                reason: format!("heartbeat runtime: {error}"),
            }));
            return;
        }
    };
    runtime.block_on(async {
        let coordinator = match Nats::connect(nats).await {
            Ok(coordinator) => coordinator,
            Err(error) => {
                let _ = connected.send(Err(FleetError::Backend(error)));
                return;
            }
        };
        let node = &served.node;
        node.refresh_elsewhere();
        let _ = connected.send(Ok(()));
        while !node.is_stopped() {
            tokio::time::sleep(interval).await;
            if let Err(error) = node.heartbeat(&coordinator).await {
                eprintln!("fleet-node {}: heartbeat: {error}", node.id());
            }
        }
    });
}

/// Registers the node, waiting out an earlier process's lease on the same id.
async fn start_node(node: &ProcessNode, ttl: Duration) -> FleetResult<()> {
    let deadline = tokio::time::Instant::now() + ttl * 3;
    loop {
        match node.start().await {
            Ok(()) => return Ok(()),
            Err(error) if tokio::time::Instant::now() < deadline => {
                eprintln!("fleet-node {}: start: {error}; retrying", node.id());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// Runs a node process until it is killed.
pub async fn run(config: ServeConfig) -> FleetResult<()> {
    let nats = Nats::connect(&config.nats).await?;
    let s3 = S3::new(&config.s3)?;
    let store = dshdb::Store::open(&config.store_dir, dshdb::Options::default())?;
    let tier = Arc::new(EngineTier::new(store));
    let local: Arc<dyn LocalTier> = tier.clone();
    let generation = crate::backend::Clock::now_ms(&SystemClock);
    let mut node_config = NodeConfig::new(&config.node_id, &config.listen, generation);
    node_config.shard_count = config.shard_count;
    node_config.lease_ttl_ms = u64::try_from(config.nats.node_ttl.as_millis()).unwrap_or(u64::MAX);
    node_config.mode = config.mode;
    node_config.degrade_to_local_after_ms = config.degrade_to_local_after_ms;
    node_config.seal_policy = config.seal_policy;
    let node = Node::new(
        node_config,
        nats.clone(),
        nats,
        s3,
        local,
        Arc::new(SystemClock),
    );
    start_node(&node, config.nats.node_ttl).await?;
    let served = Arc::new(Served {
        node,
        tier,
        seals: SealQueue::default(),
    });
    start_heartbeat(served.clone(), config.nats.clone(), config.tick_interval).await?;
    let listener =
        TcpListener::bind(&config.listen)
            .await
            .map_err(|error| FleetError::InvalidInput {
                reason: format!("listen on {}: {error}", config.listen),
            })?;
    // Nodes started together register before any takes shards, so that the first round
    // already spreads them by rendezvous (a later node only takes dead nodes' shards).
    tokio::time::sleep(config.tick_interval).await;
    tokio::spawn(tick_loop(served.clone(), config.tick_interval));
    tokio::spawn(seal_loop(served.clone()));
    tokio::spawn(ship_loop(served.clone()));
    eprintln!(
        "fleet-node {} ({} mode) listening on {}",
        config.node_id,
        config.mode.name(),
        config.listen
    );
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|error| FleetError::InvalidInput {
                reason: format!("accept: {error}"),
            })?;
        tokio::spawn(serve_connection(served.clone(), stream));
    }
}

/// The process configuration from `DSHDB_FLEET_*` variables (as `tests/fleet/servers.sh
/// env` prints them) and the node's own arguments.
pub fn config_from_env(
    node_id: &str,
    listen: &str,
    store_dir: PathBuf,
    node_ttl: Duration,
    tick_interval: Duration,
    shard_count: u32,
) -> FleetResult<ServeConfig> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| FleetError::InvalidInput {
            reason: format!("{name} is not set (see tests/fleet/servers.sh env)"),
        })
    };
    Ok(ServeConfig {
        node_id: node_id.to_string(),
        listen: listen.to_string(),
        store_dir,
        nats: NatsConfig {
            urls: var("DSHDB_FLEET_NATS")?,
            replicas: 3,
            node_ttl,
        },
        s3: S3Config {
            endpoint: var("DSHDB_FLEET_S3_ENDPOINT")?,
            bucket: var("DSHDB_FLEET_S3_BUCKET")?,
            region: "us-east-1".to_string(),
            access_key: var("DSHDB_FLEET_S3_ACCESS_KEY")?,
            secret_key: var("DSHDB_FLEET_S3_SECRET_KEY")?,
        },
        shard_count,
        tick_interval,
        mode: match std::env::var("DSHDB_FLEET_MODE") {
            Ok(text) => text.parse()?,
            Err(_) => DurabilityMode::Replicated,
        },
        degrade_to_local_after_ms: match std::env::var("DSHDB_FLEET_DEGRADE_TO_LOCAL_AFTER_MS") {
            Ok(text) => Some(text.parse().map_err(|_| FleetError::InvalidInput {
                reason: format!("DSHDB_FLEET_DEGRADE_TO_LOCAL_AFTER_MS: not a number: {text:?}"),
            })?),
            Err(_) => None,
        },
        seal_policy: SealPolicy {
            tail_bytes: seal_trigger_from_env(
                "DSHDB_FLEET_SEAL_TAIL_BYTES",
                DEFAULT_SEAL_TAIL_BYTES,
            )?,
            idle_ms: seal_trigger_from_env("DSHDB_FLEET_SEAL_IDLE_MS", DEFAULT_SEAL_IDLE_MS)?,
        },
    })
}

/// A seal trigger's threshold from `variable`: its default when unset, off when 0.
fn seal_trigger_from_env(variable: &str, default: u64) -> FleetResult<Option<u64>> {
    match std::env::var(variable) {
        Ok(text) => seal_trigger(variable, &text),
        Err(_) => Ok(Some(default)),
    }
}

/// A seal trigger's threshold as a flag or variable `name` gives it: a number, 0 for off.
pub fn seal_trigger(name: &str, text: &str) -> FleetResult<Option<u64>> {
    let value: u64 = text.parse().map_err(|_| FleetError::InvalidInput {
        reason: format!("{name}: not a number: {text:?}"),
    })?;
    Ok((value > 0).then_some(value))
}

/// Defaults of a node process: lease TTL (FLEET.md: 10 s), refresh interval (2 s).
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_secs(2);
