//! The rebuild's replay without a consumer, on the real servers: `Nats::replay_by_get` (one
//! `STREAM.MSG.GET` with `next_by_subj` per message, answered by the stream leader alone),
//! which `replay` falls back to while JetStream's meta leader is being elected, returns the
//! same messages in the same order as the ordered consumer: from the start, from the middle
//! of a subject interleaved with another, and past its end.
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::{run_token, servers_present, set_up_streams};
use dshdb_fleet::backend::TailLog;
use dshdb_fleet::shard::{session_subject, stream_name};

/// A shard no other test uses (they use fewer than 64), so that its subjects hold only this
/// test's messages.
const SHARD: u32 = 1000;
/// Messages published on each of the two subjects, interleaved.
const MESSAGES_PER_SUBJECT: usize = 15;

#[test]
fn replay_by_get_returns_what_the_consumer_returns() {
    let Some(_turn) = servers_present("replay_by_get") else {
        return;
    };
    let token = run_token();
    let runtime = common::runtime();
    let nats = set_up_streams(&runtime);
    let stream = stream_name(SHARD);
    let subjects = [
        session_subject(&format!("rbga{token}"), SHARD),
        session_subject(&format!("rbgb{token}"), SHARD),
    ];
    let mut sequences = Vec::new();
    runtime.block_on(async {
        for index in 0..MESSAGES_PER_SUBJECT {
            for subject in &subjects {
                let payload = format!("{subject} {index}");
                let ack = nats
                    .context()
                    .publish(subject.clone(), payload.into())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                if subject == &subjects[0] {
                    sequences.push(ack.sequence);
                }
            }
        }
    });
    let middle = sequences[MESSAGES_PER_SUBJECT / 2];
    let past_end = sequences[MESSAGES_PER_SUBJECT - 1] + 10;
    for (from, expected) in [
        (sequences[0], MESSAGES_PER_SUBJECT),
        (middle, MESSAGES_PER_SUBJECT - MESSAGES_PER_SUBJECT / 2),
        (past_end, 0),
    ] {
        let (by_consumer, by_get) = runtime.block_on(async {
            (
                nats.replay(&stream, &subjects[0], from).await.unwrap(),
                nats.replay_by_get(&stream, &subjects[0], from)
                    .await
                    .unwrap(),
            )
        });
        assert_eq!(by_get, by_consumer, "from stream seq {from}");
        assert_eq!(by_get.len(), expected, "from stream seq {from}");
        let seqs: Vec<u64> = by_get.iter().map(|message| message.stream_seq).collect();
        let wanted: Vec<u64> = sequences
            .iter()
            .copied()
            .filter(|seq| *seq >= from)
            .collect();
        assert_eq!(seqs, wanted, "from stream seq {from}");
        assert!(by_get.iter().all(|message| message.subject == subjects[0]));
    }
}

/// The fallback when it matters: `kill -9` of the server that leads JetStream's meta group
/// (not the stream's leader), then at once a replay through the two survivors. Creating the
/// consumer waits for an election measured at 4.5 s and more (F2); the replay instead
/// answers from the stream leader by message gets, with every message, within
/// [`REPLAY_BOUND`].
#[test]
fn a_replay_needs_no_meta_leader() {
    let Some(_turn) = servers_present("replay_by_get") else {
        return;
    };
    common::wait_cluster_settled();
    let token = run_token();
    let runtime = common::runtime();
    let nats = set_up_streams(&runtime);
    let meta = common::meta_leader().expect("a meta leader");
    let shard = (0..16)
        .map(|index| SHARD - SHARD % 16 + index)
        .find(|shard| {
            common::stream_leader(&stream_name(*shard)).is_some_and(|leader| leader != meta)
        })
        .expect("a tail stream led by another server than the meta leader");
    let stream = stream_name(shard);
    let subject = session_subject(&format!("rbgm{token}"), shard);
    let sequences: Vec<u64> = runtime.block_on(async {
        let mut sequences = Vec::new();
        for index in 0..MESSAGES_PER_SUBJECT {
            let ack = nats
                .context()
                .publish(subject.clone(), format!("{index}").into())
                .await
                .unwrap()
                .await
                .unwrap();
            sequences.push(ack.sequence);
        }
        sequences
    });
    let survivors: Vec<String> = common::NATS_SERVERS
        .iter()
        .filter(|server| **server != meta)
        .map(|server| format!("nats://127.0.0.1:{}", 14220 + server))
        .collect();
    let survivors_config = dshdb_fleet::nats::NatsConfig {
        urls: survivors.join(","),
        ..common::nats_config()
    };
    let through_survivors = runtime
        .block_on(dshdb_fleet::nats::Nats::connect(&survivors_config))
        .unwrap();
    let victim = format!("nats{meta}");
    let mut back = common::ServersBack::new(&["restart", &victim]);
    back.down = true;
    common::servers_script(&["kill", &victim]);
    let started = std::time::Instant::now();
    let replayed = runtime
        .block_on(through_survivors.replay(&stream, &subject, 1))
        .unwrap();
    let took = started.elapsed();
    let seqs: Vec<u64> = replayed.iter().map(|message| message.stream_seq).collect();
    assert_eq!(seqs, sequences, "the replay after the meta leader's kill");
    assert!(took < REPLAY_BOUND, "the replay took {took:?}");
    eprintln!(
        "replay_by_get: meta leader n{meta} killed; replay of {} messages in {took:?}, {} by \
         message gets",
        replayed.len(),
        through_survivors.replays_by_get()
    );
    back.start();
    drop(back);
    common::wait_cluster_settled();
}

/// Longest a replay may take right after the meta leader's kill: the consumer request's
/// timeout (at most 5 s) and the gets, well under the meta election it used to wait for.
const REPLAY_BOUND: std::time::Duration = std::time::Duration::from_secs(7);
