//! F7's `.blk` half of FLEET.md against the real servers: a byte flipped in one NATS
//! replica's block file, inside a session's last tail message. nats-server 2.15.1 then
//! drops that message silently while that replica leads the stream (`STREAM.MSG.GET`
//! answers "no message found"; asserted here as the premise). The new owner's rebuild must
//! never serve a shorter or damaged history. Three outcomes are accepted, and all three have
//! been seen: the replay's consumer reads the intact message from another replica (the
//! exact acknowledged history); the replay refuses, as the stream counts a message it does
//! not deliver ("no message in time after stream seq N", naming the session's subject); or
//! the rebuild refuses because its history ends below the manifest's tail checkpoint
//! (naming the session and the missing seqs). On the fakes, the last one is tested alone
//! (`model.rs`, `a_silently_dropped_last_message_is_refused_by_the_tail_checkpoint`).
//!
//! Steps: node A (in process) owns the test's shards, appends three one-event batches to
//! the session and three to a filler session of the same shard (so that the corrupted
//! message is not the stream's last), and ticks (the checkpoint). One follower of the
//! stream is stopped by SIGTERM (`servers.sh stop-one`), the byte flipped, the server
//! restarted; the stream's leadership is moved to it (`STREAM.LEADER.STEPDOWN` with a
//! preferred placement). A stops (its lease expires: for the fleet, a dead node), node B
//! takes the shards and reads the session. About 10-15 s.

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::{
    monitor_json, nats_healthy, nats_monitor_port, servers_present, servers_script,
};
use dshdb_fleet::backend::{SystemClock, TailLog};
use dshdb_fleet::nats::Nats;
use dshdb_fleet::s3::S3;
use dshdb_fleet::shard::{shard_of_in, stream_name};
use dshdb_fleet::tier::{EngineTier, LocalTier};
use dshdb_fleet::{BackendError, FleetError, IncomingEvent, Node, NodeConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Shards of the test's nodes (few: the takeover round is short).
const SHARDS: u32 = 4;
/// One-event batches appended to the session; the last one is corrupted.
const BATCHES: u64 = 3;
/// Longest wait for a takeover or a healthy server.
const DEADLINE: Duration = Duration::from_secs(30);

type RealNode = Node<Nats, Nats, S3>;

async fn node(id: &str) -> (RealNode, Nats) {
    let nats = Nats::connect(&common::nats_config()).await.unwrap();
    let s3 = S3::new(&common::s3_config()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fleet-f7b-{id}"));
    let _ = std::fs::remove_dir_all(&dir);
    let store = dshdb::Store::open(&dir, dshdb::Options::default()).unwrap();
    let local: Arc<dyn LocalTier> = Arc::new(EngineTier::new(store));
    let mut config = NodeConfig::new(id, &format!("test://{id}"), 1);
    config.shard_count = SHARDS;
    config.lease_ttl_ms = u64::try_from(common::NODE_TTL.as_millis()).unwrap();
    let node = Node::new(
        config,
        nats.clone(),
        nats.clone(),
        s3,
        local,
        Arc::new(SystemClock),
    );
    let started = Instant::now();
    while node.start().await.is_err() {
        assert!(started.elapsed() < DEADLINE, "{id} registers");
        tokio::time::sleep(common::POLL).await;
    }
    (node, nats)
}

async fn take_all(node: &RealNode) {
    let started = Instant::now();
    while node.owned_shards().len() < SHARDS as usize {
        let _ = node.tick().await;
        assert!(
            started.elapsed() < DEADLINE,
            "{} takes the shards",
            node.id()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The leader of `stream` (node number) and each server's `last_seq` of it.
fn leader_and_last_seqs(stream: &str) -> (Option<u16>, Vec<u64>) {
    let mut leader = None;
    let mut last_seqs = Vec::new();
    for server in 1..=3u16 {
        let Some(jsz) = monitor_json(nats_monitor_port(server), "jsz?streams=true") else {
            last_seqs.push(0);
            continue;
        };
        let detail = jsz["account_details"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten())
            .find(|detail| detail["name"] == stream);
        if let Some(detail) = detail {
            if let Some(name) = detail["cluster"]["leader"].as_str() {
                leader = name
                    .strip_prefix('n')
                    .and_then(|number| number.parse().ok());
            }
            last_seqs.push(detail["state"]["last_seq"].as_u64().unwrap_or(0));
        } else {
            last_seqs.push(0);
        }
    }
    (leader, last_seqs)
}

/// Each server's (messages, last_seq) of `stream`, for the servers that answer.
fn replica_views(stream: &str) -> Vec<(u64, u64)> {
    (1..=3u16)
        .filter_map(|server| {
            let jsz = monitor_json(nats_monitor_port(server), "jsz?streams=true")?;
            let detail = jsz["account_details"]
                .as_array()?
                .iter()
                .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten())
                .find(|detail| detail["name"] == stream)?
                .clone();
            Some((
                detail["state"]["messages"].as_u64()?,
                detail["state"]["last_seq"].as_u64()?,
            ))
        })
        .collect()
}

/// Flips one byte inside `marker` in the block files of `stream` under `store`; returns
/// how many copies were found (each flipped).
fn flip_in_block_files(store: &Path, stream: &str, marker: &[u8]) -> usize {
    let messages = store.join("jetstream/$G/streams").join(stream).join("msgs");
    let mut flipped = 0;
    for entry in std::fs::read_dir(&messages).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|extension| extension.to_str()) != Some("blk") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        let mut at = 0;
        while let Some(found) = bytes[at..]
            .windows(marker.len())
            .position(|window| window == marker)
        {
            let position = at + found + marker.len() / 2;
            bytes[position] ^= 0x20;
            flipped += 1;
            at = position + 1;
        }
        std::fs::write(&path, &bytes).unwrap();
    }
    flipped
}

#[test]
fn f7_corrupt_block_file_never_yields_a_shorter_history() {
    let Some(_turn) = servers_present("f7_corrupt_block_file_never_yields_a_shorter_history")
    else {
        return;
    };
    let token = common::run_token();
    let runtime = common::two_worker_runtime();
    runtime.block_on(async {
        let session = format!("f7bx{token}");
        let shard = shard_of_in(&session, SHARDS);
        let filler = (0..1_000)
            .map(|index| format!("f7fx{token}x{index}"))
            .find(|candidate| shard_of_in(candidate, SHARDS) == shard)
            .unwrap();
        let stream = stream_name(shard);
        let (a, nats) = node(&format!("f7a{token}")).await;
        take_all(&a).await;
        let header = |id: &str| format!(r#"{{"version":0,"id":"{id}","createdAt":1}}"#);
        let marker = |index: u64| format!("MARK-{token}-{index}-END");
        let mut last_ack = 0;
        for id in [&session, &filler] {
            a.create_session(id, &header(id)).await.unwrap();
            for index in 0..BATCHES {
                let event = IncomingEvent::new("user/message", &format!("\"{}\"", marker(index)));
                let ack = a.append(id, &[event]).await.unwrap();
                if id == &session {
                    last_ack = ack.stream_seq;
                }
            }
        }
        a.tick().await.unwrap();
        assert!(
            a.metrics
                .tail_checkpoints
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1,
            "the heartbeat recorded no checkpoint"
        );

        // A follower of the stream, once it holds everything.
        let (leader, _) = leader_and_last_seqs(&stream);
        let victim = (1..=3u16).find(|server| Some(*server) != leader).unwrap();
        let started = Instant::now();
        while leader_and_last_seqs(&stream).1[usize::from(victim - 1)] < last_ack {
            assert!(started.elapsed() < DEADLINE, "n{victim} catches up");
            tokio::time::sleep(common::POLL).await;
        }
        servers_script(&["stop-one", &format!("nats{victim}")]);
        let store = common::run_dir().join(format!("nats{victim}/store"));
        let flipped = flip_in_block_files(&store, &stream, marker(BATCHES - 1).as_bytes());
        // Both sessions' last batches carry the same marker text: the session's and the
        // filler's (which stays readable on the other replicas, not checked here).
        assert!(flipped >= 1, "the marker is not in n{victim}'s block files");
        servers_script(&["restart", &format!("nats{victim}")]);
        let started = Instant::now();
        while !nats_healthy(victim) {
            assert!(started.elapsed() < DEADLINE, "n{victim} healthy again");
            tokio::time::sleep(common::POLL).await;
        }
        common::move_stream_leader(&nats, &stream, victim).await;
        // The premise: the corrupted replica, leading, does not serve the message.
        let served = nats.message_at(&stream, last_ack).await.unwrap();
        assert!(
            served.is_none(),
            "n{victim} served the corrupted message at stream seq {last_ack}"
        );

        // A stops (no more lease refreshes); B takes the shards and rebuilds the session.
        drop(a);
        let (b, _) = node(&format!("f7b{token}")).await;
        take_all(&b).await;
        let outcome = b.read(&session, 0, u64::MAX).await;
        match outcome {
            // Recovered from another source: the exact acknowledged history, intact.
            Ok(events) => {
                let datas: Vec<String> = events.iter().map(|event| event.data.clone()).collect();
                let expected: Vec<String> = (0..BATCHES)
                    .map(|index| format!("\"{}\"", marker(index)))
                    .collect();
                assert_eq!(datas, expected, "a shorter or damaged history was served");
                eprintln!("f7b: the rebuild read the intact message from another replica");
            }
            // Or refused loudly, naming the session and the missing seqs.
            Err(FleetError::Rebuild {
                session: named,
                from,
                reason,
            }) => {
                assert_eq!(named, session);
                assert_eq!(from, BATCHES - 1, "{reason}");
                assert!(
                    reason.contains(&format!("seqs {}..{BATCHES} are missing", BATCHES - 1)),
                    "{reason}"
                );
                eprintln!("f7b: the rebuild was refused: {reason}");
            }
            // Or refused by the replay: the stream counts a message it does not deliver.
            Err(FleetError::Backend(BackendError::Unavailable { reason })) => {
                assert!(reason.contains(&session), "{reason}");
                assert!(
                    reason.contains("no message in time after stream seq"),
                    "{reason}"
                );
                eprintln!("f7b: the replay was refused: {reason}");
            }
            other => panic!("neither the history nor a loud refusal: {other:?}"),
        }
        // Leave the stream led by an intact replica, and the damaged replica rebuilt from
        // the others (its copy of the stream removed while it is down): later tests compare
        // the replicas (F2, F6) and read from any leader.
        let other = (1..=3u16).find(|server| *server != victim).unwrap();
        common::move_stream_leader(&nats, &stream, other).await;
        servers_script(&["stop-one", &format!("nats{victim}")]);
        std::fs::remove_dir_all(store.join("jetstream/$G/streams").join(&stream)).unwrap();
        servers_script(&["restart", &format!("nats{victim}")]);
        let started = Instant::now();
        loop {
            let views = replica_views(&stream);
            if views.len() == 3 && views.iter().all(|view| *view == views[0]) {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{stream}: n{victim} did not catch up again: {views:?}"
            );
            tokio::time::sleep(common::POLL).await;
        }
    });
}
