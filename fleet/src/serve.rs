//! A fleet node as a process (`dshdb fleet-node`, `dshdb-fleet-node`): the node over NATS
//! and S3 with its local store, a lease/takeover loop, and a small request protocol on a
//! loopback TCP port, so that tests can `kill -9` a real node.
//!
//! Protocol: one JSON object per line each way.
//! - `{"op":"create","session":S,"header":H}` → `{"ok":true}`
//! - `{"op":"append","session":S,"events":[{"type":T,"data":D}]}` →
//!   `{"ok":true,"first_seq":F,"end_seq":E}` (sent only after the local fsync and the
//!   JetStream ack)
//! - `{"op":"read","session":S}` → `{"ok":true,"events":[{"seq","type","data"}]}`
//!
//! A failure is `{"ok":false,"error":TEXT}`, plus `"moved":true,"owner":ID` when another
//! node owns the session's shard.

use crate::backend::SystemClock;
use crate::error::{FleetError, FleetResult};
use crate::nats::{Nats, NatsConfig};
use crate::s3::{S3Config, S3};
use crate::tier::{EngineTier, LocalTier};
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
}

type ProcessNode = Node<Nats, Nats, S3>;

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

async fn handle(node: &ProcessNode, request: &Value) -> FleetResult<Value> {
    let session = text_field(request, "session")?;
    match text_field(request, "op")? {
        "create" => {
            node.create_session(session, text_field(request, "header")?)
                .await?;
            Ok(json!({"ok": true}))
        }
        "append" => {
            let ack = node.append(session, &incoming_events(request)?).await?;
            Ok(json!({"ok": true, "first_seq": ack.first_seq, "end_seq": ack.end_seq}))
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
        other => Err(FleetError::InvalidInput {
            reason: format!("unknown op {other:?}"),
        }),
    }
}

async fn serve_connection(node: Arc<ProcessNode>, stream: TcpStream) {
    let (reader, mut writer) = stream.into_split();
    let mut lines = BufReader::new(reader).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = if line.len() > MAX_REQUEST_LINE_BYTES {
            json!({"ok": false, "error": "request line too long"})
        } else {
            match serde_json::from_str::<Value>(&line) {
                Ok(request) => handle(&node, &request)
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

/// Lease refresh and takeovers, until the node stops (its id taken by another process).
async fn tick_loop(node: Arc<ProcessNode>, interval: Duration) {
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
    let local: Arc<dyn LocalTier> = Arc::new(EngineTier::new(store));
    let generation = crate::backend::Clock::now_ms(&SystemClock);
    let mut node_config = NodeConfig::new(&config.node_id, &config.listen, generation);
    node_config.shard_count = config.shard_count;
    let node = Arc::new(Node::new(
        node_config,
        nats.clone(),
        nats,
        s3,
        local,
        Arc::new(SystemClock),
    ));
    start_node(&node, config.nats.node_ttl).await?;
    let listener =
        TcpListener::bind(&config.listen)
            .await
            .map_err(|error| FleetError::InvalidInput {
                reason: format!("listen on {}: {error}", config.listen),
            })?;
    // Nodes started together register before any takes shards, so that the first round
    // already spreads them by rendezvous (a later node only takes dead nodes' shards).
    tokio::time::sleep(config.tick_interval).await;
    tokio::spawn(tick_loop(node.clone(), config.tick_interval));
    eprintln!(
        "fleet-node {} listening on {}",
        config.node_id, config.listen
    );
    loop {
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|error| FleetError::InvalidInput {
                reason: format!("accept: {error}"),
            })?;
        tokio::spawn(serve_connection(node.clone(), stream));
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
    })
}

/// Defaults of a node process: lease TTL (FLEET.md: 10 s), refresh interval (2 s).
pub const DEFAULT_NODE_TTL: Duration = Duration::from_secs(10);
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_secs(2);
