//! Fleet mode against real servers: 3 × nats-server 2.15.1 (JetStream, `sync_interval:
//! always`) and s3s-fs, started by `tests/fleet/servers.sh`, which also prints the variables
//! this test reads (`eval "$(bash tests/fleet/servers.sh env)"`).
//!
//! Without `DSHDB_FLEET_SERVERS=1` the test prints a SKIPPED line and passes, except under
//! `CI=true`, where missing servers fail it (a CI run must not pass without them).
//!
//! One test runs the phases in order, because they share the cluster's shard records:
//! 1. node A takes the shards and appends; every acknowledged batch is read back from the
//!    JetStream stream itself at the acknowledged stream sequence;
//! 2. A's lease expires, node B takes over; A (a zombie that still believes it owns the
//!    shard) is fenced by the server on its next write; B rebuilds from the tail and
//!    continues at the next seq;
//! 3. B seals: the run is PUT to S3, the manifest CAS'd, the tail purged;
//! 4. B's lease expires, node C (an empty disk) opens the session cold from S3 plus the tail
//!    and has exactly B's history.

#![allow(clippy::unwrap_used)]

use dshdb_fleet::backend::{Bucket, ColdStore, Coordinator, SystemClock, TailLog};
use dshdb_fleet::nats::{Nats, NatsConfig};
use dshdb_fleet::s3::{S3Config, S3};
use dshdb_fleet::shard::{session_subject, stream_name};
use dshdb_fleet::tier::{EngineTier, LocalTier};
use dshdb_fleet::wire::{from_json, SessionManifest, TailBatch};
use dshdb_fleet::{FleetError, IncomingEvent, Node, NodeConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

type RealNode = Node<Nats, Nats, S3>;

/// Shards of the test fleet (1024 in production; a few keep takeovers quick).
const SHARDS: u32 = 4;
/// Lease TTL of the test fleet.
const NODE_TTL: Duration = Duration::from_secs(2);
/// Longest wait for a takeover once a lease should have expired.
const TAKEOVER_DEADLINE: Duration = Duration::from_secs(20);
/// Batches node A appends (and times).
const TIMED_BATCHES: usize = 300;
/// Batches node B appends after the takeover, before sealing.
const MORE_BATCHES: usize = 20;
const EVENTS_PER_BATCH: usize = 2;

struct Env {
    nats: NatsConfig,
    s3: S3Config,
}

fn env() -> Option<Env> {
    if std::env::var("DSHDB_FLEET_SERVERS").as_deref() != Ok("1") {
        return None;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    Some(Env {
        nats: NatsConfig {
            urls: var("DSHDB_FLEET_NATS"),
            replicas: 3,
            node_ttl: NODE_TTL,
        },
        s3: S3Config {
            endpoint: var("DSHDB_FLEET_S3_ENDPOINT"),
            bucket: var("DSHDB_FLEET_S3_BUCKET"),
            region: "us-east-1".to_string(),
            access_key: var("DSHDB_FLEET_S3_ACCESS_KEY"),
            secret_key: var("DSHDB_FLEET_S3_SECRET_KEY"),
        },
    })
}

/// A token unique to this run, so that reruns against the same servers do not collide.
fn run_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", nanos, std::process::id())
}

fn store_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fleet-servers-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

struct Member {
    node: Arc<RealNode>,
    tier: Arc<EngineTier>,
}

async fn member(env: &Env, id: &str, generation: u64) -> Member {
    let nats = Nats::connect(&env.nats).await.unwrap();
    let s3 = S3::new(&env.s3).unwrap();
    let store = dshdb::Store::open(store_dir(id), dshdb::Options::default()).unwrap();
    let tier = Arc::new(EngineTier::new(store));
    let mut config = NodeConfig::new(id, &format!("test://{id}"), generation);
    config.shard_count = SHARDS;
    let local: Arc<dyn LocalTier> = tier.clone();
    let node = Node::new(config, nats.clone(), nats, s3, local, Arc::new(SystemClock));
    node.start().await.unwrap();
    Member {
        node: Arc::new(node),
        tier,
    }
}

/// Ticks `node` until it owns every shard (a dead owner's lease must expire first).
async fn take_all_shards(node: &RealNode) -> Duration {
    let started = Instant::now();
    loop {
        node.tick().await.unwrap();
        if node.owned_shards().len() == SHARDS as usize {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < TAKEOVER_DEADLINE,
            "{} owns {:?} after {:?}",
            node.id(),
            node.owned_shards(),
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn batch(label: &str, index: usize) -> Vec<IncomingEvent> {
    (0..EVENTS_PER_BATCH)
        .map(|offset| {
            IncomingEvent::new(
                "message",
                &format!(r#"{{"role":"user","text":"{label} {index}.{offset}"}}"#),
            )
        })
        .collect()
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    eprintln!(
        "fleet servers: {label}: n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
}

/// The local-only floor: the same appends on a plain store with the same durability.
fn local_append_latencies() -> Vec<Duration> {
    let store = dshdb::Store::open(store_dir("local-floor"), dshdb::Options::default()).unwrap();
    let mut writer = store.create_session_with_id("local-floor").unwrap();
    (0..TIMED_BATCHES)
        .map(|index| {
            let events = batch("local", index);
            let new: Vec<dshdb::NewEvent<'_>> = events
                .iter()
                .map(|event| dshdb::NewEvent::new(&event.event_type, &event.data))
                .collect();
            let started = Instant::now();
            writer.append_batch(&new).unwrap();
            started.elapsed()
        })
        .collect()
}

async fn phase_replicated_appends(a: &Member, nats: &Nats, session: &str) -> Vec<Duration> {
    let header = format!(r#"{{"version":0,"id":"{session}","createdAt":1}}"#);
    a.node.create_session(session, &header).await.unwrap();
    let shard = a.node.shard_of(session);
    let mut latencies = Vec::with_capacity(TIMED_BATCHES);
    for index in 0..TIMED_BATCHES {
        let events = batch("a", index);
        let started = Instant::now();
        let ack = a.node.append(session, &events).await.unwrap();
        latencies.push(started.elapsed());
        assert_eq!(ack.first_seq, (index * EVENTS_PER_BATCH) as u64);
        // Acknowledged means stored in the stream: the message at the acknowledged stream
        // sequence is this batch (read back from the server, not from the node).
        let last = nats
            .last_on_subject(&stream_name(shard), &session_subject(session, shard))
            .await
            .unwrap()
            .expect("an acknowledged batch is in the stream");
        assert_eq!(last.stream_seq, ack.stream_seq);
        let stored = TailBatch::decode(&last.payload).unwrap();
        assert_eq!(stored.first_seq(), ack.first_seq);
        assert_eq!(stored.events.len(), EVENTS_PER_BATCH);
        assert_eq!(stored.events[0].data, events[0].data);
    }
    latencies
}

async fn phase_zombie_fenced(a: &Member, b: &Member, session: &str) {
    // A stops refreshing its lease (paused); B takes over once it expires.
    let takeover = take_all_shards(&b.node).await;
    eprintln!("fleet servers: takeover after A's lease stopped: {takeover:?}");
    assert!(
        !a.node.owned_shards().is_empty(),
        "A still believes it owns its shards (a zombie)"
    );
    let zombie = a.node.append(session, &batch("zombie", 0)).await;
    assert!(
        matches!(zombie, Err(FleetError::Moved { .. })),
        "the zombie's write must be fenced: {zombie:?}"
    );
    assert_eq!(
        a.node
            .metrics
            .fenced_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // B continues at the next seq after a rebuild from the tail.
    let acked_by_a = (TIMED_BATCHES * EVENTS_PER_BATCH) as u64;
    let ack = b.node.append(session, &batch("b", 0)).await.unwrap();
    assert_eq!(ack.first_seq, acked_by_a);
    for index in 1..MORE_BATCHES {
        b.node.append(session, &batch("b", index)).await.unwrap();
    }
    let events = b.node.read(session, 0, u64::MAX).await.unwrap();
    let expected = acked_by_a + (MORE_BATCHES * EVENTS_PER_BATCH) as u64;
    assert_eq!(events.len() as u64, expected);
    assert!(events.iter().all(|event| !event.data.contains("zombie")));
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.seq, index as u64);
    }
}

async fn phase_seal(b: &Member, nats: &Nats, s3: &S3, session: &str) -> u64 {
    let shard = b.node.shard_of(session);
    let subject = session_subject(session, shard);
    let started = Instant::now();
    let sealed = b.node.seal(session).await.unwrap();
    eprintln!(
        "fleet servers: seal of {} events ({} run bytes, {} messages purged) in {:?}",
        sealed.events,
        sealed.run_bytes,
        sealed.purged_messages,
        started.elapsed()
    );
    let key = sealed.run_key.clone().unwrap();
    assert_eq!(s3.head(&key).await.unwrap(), Some(sealed.run_bytes));
    let manifest = nats.get(Bucket::Sessions, session).await.unwrap().unwrap();
    let manifest: SessionManifest = from_json(&manifest.value, "manifest").unwrap();
    assert_eq!(manifest.sealed_end, sealed.events);
    assert_eq!(manifest.runs.len(), 1);
    assert_eq!(manifest.runs[0].key, key);
    assert!(sealed.purged_messages >= (TIMED_BATCHES + MORE_BATCHES) as u64);
    let left = nats.replay(&stream_name(shard), &subject, 1).await.unwrap();
    assert!(left.is_empty(), "{} tail messages left", left.len());
    let copies = s3
        .list(&format!("v1/s/{}/{session}/m/", &session[..2]))
        .await
        .unwrap();
    assert_eq!(copies.len(), 1, "{copies:?}");
    // An unsealed tail after the seal, so that the cold open needs both sources.
    for index in 0..MORE_BATCHES {
        b.node
            .append(session, &batch("after-seal", index))
            .await
            .unwrap();
    }
    sealed.events
}

async fn phase_cold_open(b: &Member, c: &Member, session: &str) {
    let takeover = take_all_shards(&c.node).await;
    eprintln!("fleet servers: node C took the shards after {takeover:?}");
    let started = Instant::now();
    let rebuilt = c.node.read(session, 0, u64::MAX).await.unwrap();
    eprintln!(
        "fleet servers: cold open of {} events (S3 run + tail) in {:?}",
        rebuilt.len(),
        started.elapsed()
    );
    let original = b.tier.read(session, 0, u64::MAX).unwrap();
    assert_eq!(rebuilt, original);
    // The local store C rebuilt exports byte-identically to B's.
    let mut exported_b = String::new();
    let mut exported_c = String::new();
    b.tier
        .store()
        .read_json_lines(session, 0, u64::MAX, &mut exported_b)
        .unwrap();
    c.tier
        .store()
        .read_json_lines(session, 0, u64::MAX, &mut exported_c)
        .unwrap();
    assert!(!exported_b.is_empty());
    assert_eq!(exported_b, exported_c);
    assert_eq!(
        c.node.header(session).await.unwrap(),
        b.tier.store().session(session).unwrap().header_json
    );
}

#[test]
fn fleet_on_real_servers() {
    let Some(_turn) = crate::common::servers_present("fleet_on_real_servers") else {
        return;
    };
    let env = env().expect("DSHDB_FLEET_SERVERS=1 comes with the servers' variables");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let token = run_token();
        let started = Instant::now();
        let nats = Nats::connect(&env.nats).await.unwrap();
        eprintln!(
            "fleet servers: connect and stream setup in {:?}",
            started.elapsed()
        );
        let s3 = S3::new(&env.s3).unwrap();
        let a = member(&env, &format!("a{token}"), 1).await;
        take_all_shards(&a.node).await;
        let session = format!("s{token}");
        let replicated = phase_replicated_appends(&a, &nats, &session).await;
        report(
            "replicated append (local fsync + JetStream R3 ack)",
            replicated,
        );
        report("local-only append (fsync)", local_append_latencies());
        let b = member(&env, &format!("b{token}"), 1).await;
        phase_zombie_fenced(&a, &b, &session).await;
        phase_seal(&b, &nats, &s3, &session).await;
        let c = member(&env, &format!("c{token}"), 1).await;
        phase_cold_open(&b, &c, &session).await;
    });
}
