//! F4 of FLEET.md with real processes, and the run-object half of F7: sessions written on
//! three node processes are sealed by their owners' background sealers; then one sealed run
//! object is corrupted on the S3 server's disk and its owner is killed (`kill -9`), so that
//! the survivors open its sessions cold, from S3 alone (their tails were purged).
//!
//! Checks (F4): each session's runs are in S3 under the immutable key naming its seq range
//! and epoch, with the blake3 the manifest names; a manifest copy equal to the KV manifest is
//! in S3; the session's tail subject is purged and the streams' `num_subjects` (read from the
//! server) falls by at least the number of sessions; a survivor's export of each cold session
//! is byte-identical to the one its first owner gave.
//! Checks (F7, run object): the session whose run was corrupted is never served; reading it
//! fails with an error naming the session, the run's seq range and the blake3 mismatch.
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::{
    append_once, create_sessions, owner_index, run_dir, servers_present, session_names,
    set_up_streams, wait_until, Fleet, Outcome, SessionModel,
};
use dshdb_fleet::backend::{Bucket, ColdStore, Coordinator, TailLog};
use dshdb_fleet::nats::Nats;
use dshdb_fleet::shard::{
    manifest_copy_key, run_key, session_key, session_subject, shard_of_in, stream_name,
    STREAM_COUNT,
};
use dshdb_fleet::wire::{blake3_hex, from_json, SessionManifest};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

const NODES: usize = 3;
const SESSIONS: usize = 12;
const SHARDS: u32 = 16;
const BATCHES: usize = 4;
/// Longest wait for every shard to have an owner, for the seals, for a takeover.
const DEADLINE: Duration = Duration::from_secs(25);

fn subjects_in_streams(runtime: &tokio::runtime::Runtime, nats: &Nats) -> u64 {
    runtime.block_on(async {
        let mut total = 0;
        for index in 0..STREAM_COUNT {
            let mut stream = nats
                .context()
                .get_stream(format!("DSH_{index:02}"))
                .await
                .unwrap();
            total += stream.info().await.unwrap().state.subjects_count;
        }
        total
    })
}

fn tail_present(runtime: &tokio::runtime::Runtime, nats: &Nats, session: &str) -> bool {
    let shard = shard_of_in(session, SHARDS);
    runtime
        .block_on(nats.last_on_subject(&stream_name(shard), &session_subject(session, shard)))
        .unwrap()
        .is_some()
}

fn manifest(runtime: &tokio::runtime::Runtime, nats: &Nats, session: &str) -> SessionManifest {
    let entry = runtime
        .block_on(nats.get(Bucket::Sessions, &session_key(session)))
        .unwrap()
        .unwrap();
    from_json(&entry.value, "manifest").unwrap()
}

/// Checks the sealed runs and the manifest copy of `session` in S3.
fn check_cold_objects(
    runtime: &tokio::runtime::Runtime,
    s3: &dshdb_fleet::s3::S3,
    session: &str,
    manifest: &SessionManifest,
) {
    assert!(!manifest.runs.is_empty(), "{session}: no run");
    for run in &manifest.runs {
        assert_eq!(
            run.key,
            run_key(session, run.first_seq, run.last_seq, manifest.epoch),
            "{session}: run key does not name its range and epoch"
        );
        let bytes = runtime.block_on(s3.get(&run.key)).unwrap().unwrap();
        assert_eq!(blake3_hex(&bytes), run.blake3, "{}", run.key);
        assert_eq!(bytes.len() as u64, run.bytes, "{}", run.key);
    }
    let copy_key = manifest_copy_key(session, manifest.epoch, manifest.sealed_end);
    let copy = runtime.block_on(s3.get(&copy_key)).unwrap();
    let copy: SessionManifest = from_json(&copy.expect("manifest copy in S3"), "copy").unwrap();
    assert_eq!(&copy, manifest, "{session}: manifest copy differs");
}

/// Flips one byte in the middle of an object as s3s-fs stores it (a file per key).
fn corrupt_object(key: &str) {
    let bucket = std::env::var("DSHDB_FLEET_S3_BUCKET").unwrap();
    let path = run_dir().join("s3").join(bucket).join(key);
    let mut bytes = std::fs::read(&path)
        .unwrap_or_else(|error| panic!("{}: {error} (s3s-fs layout?)", path.display()));
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn f4_seal_and_cold_reopen_f7_corrupt_run() {
    let Some(_turn) = servers_present("f4_seal_and_cold_reopen_f7_corrupt_run") else {
        return;
    };
    let token = common::run_token();
    let runtime = common::runtime();
    let nats = set_up_streams(&runtime);
    let s3 = dshdb_fleet::s3::S3::new(&common::s3_config()).unwrap();
    let mut fleet = Fleet::spawn("c", &token, NODES, SHARDS);
    fleet.wait_ownership_settled(DEADLINE);
    let mut router = fleet.router();
    let sessions = session_names("f4", &token, SESSIONS);
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();
    for _ in 0..BATCHES {
        for (session, model) in sessions.iter().zip(models.iter_mut()) {
            assert!(append_once(&mut router, session, model), "{session}");
        }
    }
    for session in &sessions {
        assert!(tail_present(&runtime, &nats, session), "{session}: no tail");
    }
    let subjects_before = subjects_in_streams(&runtime, &nats);

    // A queued seal whose session moves to another node is dropped (`dropped_moved`); one
    // whose node lost its lease stays queued until the node takes the shard back. A session
    // not sealed once the sealers are idle is still asked again, as its user would, within
    // the deadline.
    let started = std::time::Instant::now();
    let mut unsealed: Vec<&String> = sessions.iter().collect();
    while !unsealed.is_empty() && started.elapsed() < DEADLINE {
        for session in &unsealed {
            router.call_until_ok(session, &json!({"op": "seal", "session": session}));
        }
        wait_until("the sealers finish", DEADLINE, || {
            (0..NODES).all(|index| fleet.status(index)["seal_queue"]["pending"] == json!(0))
        });
        unsealed = sessions
            .iter()
            .zip(&models)
            .filter(|(session, model)| {
                manifest(&runtime, &nats, session).sealed_end != model.acked.len() as u64
            })
            .map(|(session, _)| session)
            .collect();
    }
    let sealing = started.elapsed();
    let mut exports = BTreeMap::new();
    for (session, model) in sessions.iter().zip(&models) {
        let manifest = manifest(&runtime, &nats, session);
        if manifest.sealed_end != model.acked.len() as u64 {
            let queues: Vec<Value> = (0..NODES)
                .map(|index| fleet.status(index)["seal_queue"].clone())
                .collect();
            panic!(
                "{session}: sealed to {} of {} acknowledged events; seal queues: {queues:?}",
                manifest.sealed_end,
                model.acked.len()
            );
        }
        check_cold_objects(&runtime, &s3, session, &manifest);
        assert!(
            !tail_present(&runtime, &nats, session),
            "{session}: tail not purged"
        );
        let reply = router.call_until_ok(session, &json!({"op": "export", "session": session}));
        exports.insert(
            session.clone(),
            reply["export"].as_str().unwrap().to_string(),
        );
    }
    let subjects_after = subjects_in_streams(&runtime, &nats);
    assert!(
        subjects_after + SESSIONS as u64 <= subjects_before,
        "num_subjects {subjects_before} -> {subjects_after}"
    );

    // The node serving the most sessions dies; one of its sessions has a corrupted run.
    let served_by = |index: usize| -> Vec<&String> {
        sessions
            .iter()
            .filter(|session| owner_index(&fleet, &router, session) == Some(index))
            .collect()
    };
    let victim = (0..NODES)
        .max_by_key(|index| served_by(*index).len())
        .unwrap();
    let cold: Vec<String> = served_by(victim).into_iter().cloned().collect();
    assert!(cold.len() >= 2, "the victim serves {} sessions", cold.len());
    let corrupted = cold[0].clone();
    let corrupted_run = manifest(&runtime, &nats, &corrupted).runs[0].clone();
    corrupt_object(&corrupted_run.key);
    let victim_shards = fleet.owned_shards(victim);
    fleet.kill(victim);
    let takeover = wait_until("survivors own the dead node's shards", DEADLINE, || {
        fleet
            .shards_owned_by_others(victim)
            .is_superset(&victim_shards)
    });

    let mut survivors = fleet.router_without(&[victim]);
    for session in &cold[1..] {
        let reply = survivors.call_until_ok(session, &json!({"op": "export", "session": session}));
        assert!(
            reply["export"].as_str() == Some(exports[session].as_str()),
            "{session}: the cold export differs from the first owner's"
        );
    }
    let error = match survivors.call(&corrupted, &json!({"op": "read", "session": corrupted})) {
        Outcome::Refused(error) => error,
        Outcome::Ok(reply) => panic!("{corrupted}: corrupt run served: {reply}"),
        Outcome::Unknown => panic!("{corrupted}: no answer"),
    };
    let range = format!(
        "seqs {}..={}",
        corrupted_run.first_seq, corrupted_run.last_seq
    );
    assert!(
        error.contains(&corrupted) && error.contains(&range) && error.contains("blake3"),
        "the refusal does not name the session, the range and the check: {error}"
    );
    assert!(matches!(
        survivors.call(&corrupted, &json!({"op": "export", "session": corrupted})),
        Outcome::Refused(_)
    ));
    eprintln!(
        "f4: {SESSIONS} sessions sealed in {sealing:?}; num_subjects {subjects_before} -> \
         {subjects_after}; {} sessions opened cold on survivors after {takeover:?}, exports \
         byte-identical; f7: corrupted run {} refused: {error}",
        cold.len() - 1,
        corrupted_run.key
    );
}
