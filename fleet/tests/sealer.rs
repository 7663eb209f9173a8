//! The retrying sealer on the fakes: seals queued while the cold store is unreachable fail,
//! stay queued with a backoff and change nothing; once it is back, the next due round seals
//! them; a seal queued on a node that loses its lease survives it (the queue's own unit
//! tests cover the `Moved` refusals).

#![allow(clippy::unwrap_used)]

use dshdb_fleet::backend::{Bucket, Clock};
use dshdb_fleet::fake::{
    FakeCold, FakeColdClient, FakeKv, FakeKvClient, FakeTail, FakeTailClient, Link, LinkControl,
    VirtualClock,
};
use dshdb_fleet::sealer::{SealQueue, SEAL_RETRY_FIRST_BACKOFF, SEAL_RETRY_MAX_BACKOFF};
use dshdb_fleet::shard::session_key;
use dshdb_fleet::tier::{LocalTier, MemoryTier};
use dshdb_fleet::triggers::SealPolicy;
use dshdb_fleet::wire::{from_json, SessionManifest};
use dshdb_fleet::{IncomingEvent, Node, NodeConfig};
use std::sync::Arc;

const SHARDS: u32 = 4;
const NODE_TTL_MS: u64 = 10_000;

/// One node `n1` on the fakes, reaching NATS through `nats_link` and S3 through `s3_link`.
struct World {
    runtime: tokio::runtime::Runtime,
    clock: Arc<VirtualClock>,
    kv: FakeKv,
    cold: FakeCold,
    node: Node<FakeTailClient, FakeKvClient, FakeColdClient>,
}

fn one_node(nats_link: &LinkControl, s3_link: &LinkControl) -> World {
    one_node_with(nats_link, s3_link, SealPolicy::default())
}

/// [`one_node`] with the seal policy `policy`.
fn one_node_with(nats_link: &LinkControl, s3_link: &LinkControl, policy: SealPolicy) -> World {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clock = VirtualClock::new(1_000_000);
    let tail = FakeTail::new(clock.clone());
    let kv = FakeKv::new(clock.clone(), NODE_TTL_MS);
    let cold = FakeCold::default();
    let mut config = NodeConfig::new("n1", "n1", 1);
    config.shard_count = SHARDS;
    config.lease_ttl_ms = NODE_TTL_MS;
    config.seal_policy = policy;
    let local: Arc<dyn LocalTier> = Arc::new(MemoryTier::default());
    let node = Node::new(
        config,
        tail.client(nats_link.clone()),
        kv.client(nats_link.clone()),
        cold.client(s3_link.clone()),
        local,
        clock.clone(),
    );
    World {
        runtime,
        clock,
        kv,
        cold,
        node,
    }
}

#[test]
fn seals_retry_until_the_cold_store_is_back() {
    let nats_link = LinkControl::default();
    let s3_link = LinkControl::default();
    let World {
        runtime,
        clock,
        kv,
        cold,
        node,
    } = one_node(&nats_link, &s3_link);
    let sessions = ["a", "b", "c"];
    runtime.block_on(async {
        node.start().await.unwrap();
        node.tick().await.unwrap();
        for session in sessions {
            let header = format!(r#"{{"version":0,"id":"{session}"}}"#);
            node.create_session(session, &header).await.unwrap();
            node.append(session, &[IncomingEvent::new("message", "{}")])
                .await
                .unwrap();
        }
    });
    let queue = SealQueue::default();
    for session in sessions {
        queue.request(session).unwrap();
    }
    let now = || clock.now_ms();

    s3_link.set(Link::Down);
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 0);
    let status = queue.status();
    assert_eq!(status.pending, 3);
    assert_eq!(status.failed_attempts, 3);
    assert!(status.last_error.is_some());
    assert!(cold.keys().is_empty());
    // Backing off: nothing is due until the first backoff has passed.
    assert!(queue.due(now()).is_empty());

    s3_link.set(Link::Up);
    clock.advance(u64::try_from(SEAL_RETRY_FIRST_BACKOFF.as_millis()).unwrap());
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 3);
    let status = queue.status();
    assert_eq!(status.pending, 0);
    assert_eq!(status.completed, 3);
    for session in sessions {
        let manifest: SessionManifest = from_json(
            &kv.peek(Bucket::Sessions, &session_key(session)).unwrap(),
            "manifest",
        )
        .unwrap();
        assert_eq!(manifest.sealed_end, 1, "{session}");
        assert_eq!(manifest.runs.len(), 1, "{session}");
    }
}

/// A seal queued on a node that then loses its lease is not dropped: while the shard's
/// record still names the node (or cannot be read), the seal stays queued and backs off;
/// once the node has taken its shards back, the next due round seals the session.
#[test]
fn a_seal_request_survives_its_nodes_lost_lease() {
    let nats_link = LinkControl::default();
    let World {
        runtime,
        clock,
        kv,
        node,
        ..
    } = one_node(&nats_link, &LinkControl::default());
    let session = "a";
    runtime.block_on(async {
        node.start().await.unwrap();
        node.tick().await.unwrap();
        node.create_session(session, r#"{"version":0,"id":"a"}"#)
            .await
            .unwrap();
        node.append(session, &[IncomingEvent::new("message", "{}")])
            .await
            .unwrap();
    });
    let queue = SealQueue::default();
    queue.request(session).unwrap();
    let now = || clock.now_ms();

    // NATS is unreachable past the lease: the node drops every shard.
    nats_link.set(Link::Down);
    clock.advance(NODE_TTL_MS + 1);
    assert!(runtime.block_on(node.tick()).is_err());
    assert!(node.owned_shards().is_empty());
    // A round while the record cannot be read, and one while it still names this node:
    // both refused as moved, neither drops the seal.
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 0);
    nats_link.set(Link::Up);
    clock.advance(u64::try_from(SEAL_RETRY_FIRST_BACKOFF.as_millis()).unwrap());
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 0);
    let status = queue.status();
    assert_eq!((status.pending, status.dropped_moved), (1, 0), "{status:?}");
    assert_eq!(status.failed_attempts, 2);

    // The node registers again and takes its shards back; the seal completes when due.
    runtime.block_on(node.tick()).unwrap();
    assert_eq!(node.owned_shards().len(), SHARDS as usize);
    clock.advance(u64::try_from(SEAL_RETRY_MAX_BACKOFF.as_millis()).unwrap());
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 1);
    let status = queue.status();
    assert_eq!((status.pending, status.completed), (0, 1), "{status:?}");
    let manifest: SessionManifest = from_json(
        &kv.peek(Bucket::Sessions, &session_key(session)).unwrap(),
        "manifest",
    )
    .unwrap();
    assert_eq!(manifest.sealed_end, 1);
}

fn sealed_end(kv: &FakeKv, session: &str) -> u64 {
    let manifest: SessionManifest = from_json(
        &kv.peek(Bucket::Sessions, &session_key(session)).unwrap(),
        "manifest",
    )
    .unwrap();
    manifest.sealed_end
}

/// The seal policy (FLEET.md §5.4) on the fakes: a session whose unsealed tail reaches the
/// size threshold is queued at once, one with something unsealed and no append for the idle
/// time is queued then, and the queue seals both; a sealed session is not queued again
/// until it is appended to.
#[test]
fn the_seal_policy_queues_sessions_by_tail_size_and_by_idleness() {
    const TAIL_BYTES: u64 = 2_000;
    const IDLE_MS: u64 = 60_000;
    let nats_link = LinkControl::default();
    let s3_link = LinkControl::default();
    let policy = SealPolicy {
        tail_bytes: Some(TAIL_BYTES),
        idle_ms: Some(IDLE_MS),
    };
    let World {
        runtime,
        clock,
        kv,
        node,
        ..
    } = one_node_with(&nats_link, &s3_link, policy);
    let append = |session: &str, data: &str| {
        runtime
            .block_on(node.append(session, &[IncomingEvent::new("message", data)]))
            .unwrap();
    };
    runtime.block_on(async {
        node.start().await.unwrap();
        node.tick().await.unwrap();
        for session in ["big", "quiet"] {
            let header = format!(r#"{{"version":0,"id":"{session}"}}"#);
            node.create_session(session, &header).await.unwrap();
        }
    });
    append("quiet", "{}");
    append("big", "{}");
    let queue = SealQueue::default();
    let now = || clock.now_ms();
    assert_eq!(queue.request_due(&node), 0, "nothing is due yet");

    // "big" passes the size threshold: due at once.
    let large = format!("\"{}\"", "x".repeat(usize::try_from(TAIL_BYTES).unwrap()));
    append("big", &large);
    assert_eq!(queue.request_due(&node), 1);
    assert_eq!(queue.status().triggered_by_size, 1);
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 1);
    assert_eq!(sealed_end(&kv, "big"), 2);
    assert_eq!(
        queue.request_due(&node),
        0,
        "big is sealed, quiet not idle yet"
    );

    // "quiet" has had no append for the idle time.
    clock.advance(IDLE_MS - 1);
    assert_eq!(queue.request_due(&node), 0);
    clock.advance(1);
    assert_eq!(queue.request_due(&node), 1);
    assert_eq!(queue.status().triggered_by_idle, 1);
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 1);
    assert_eq!(sealed_end(&kv, "quiet"), 1);

    // Nothing unsealed: nothing is due however long it stays idle, until the next append.
    clock.advance(10 * IDLE_MS);
    assert_eq!(queue.request_due(&node), 0);
    assert_eq!(node.unsealed_sessions(), 0);
    append("quiet", "{}");
    clock.advance(IDLE_MS);
    assert_eq!(queue.request_due(&node), 1);
    assert_eq!(runtime.block_on(queue.run_round(&node, now)), 1);
    assert_eq!(sealed_end(&kv, "quiet"), 2);
}
