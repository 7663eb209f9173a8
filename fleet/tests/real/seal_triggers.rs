//! The seal policy (FLEET.md §5.4) with real processes and servers: two nodes in `--mode
//! sealed` (only sealed runs leave a node, so whatever the policy does not seal is at risk)
//! with `--seal-idle-ms 500` and the size trigger off. Sessions get a few batches, then no
//! one asks for a seal: the nodes' background sealers seal every session once it is idle,
//! and the lag (unsealed acknowledged events) falls to 0. Then the node owning most sessions
//! is `kill -9`ed, and the survivor serves every acknowledged event of every session, from
//! the runs in S3: nothing was at risk any more.
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common::{
    append_once, check_session, create_sessions, lag_events, owners_and_busiest, run_token,
    servers_present, session_names, set_up_streams, wait_cluster_settled, wait_until, Fleet,
    SessionModel, NODE_TTL,
};
use std::time::Duration;

const NODES: usize = 2;
const SESSIONS: usize = 6;
const SHARDS: u32 = 16;
const BATCHES: usize = 5;
/// The nodes' idle trigger, in ms (as the flag takes it).
const IDLE_MS: &str = "500";
/// The sealers take every session's lag to 0 within this long after the last append.
const SEAL_DEADLINE: Duration = Duration::from_secs(20);

fn seal_counter(fleet: &Fleet, index: usize, name: &str) -> u64 {
    fleet.status(index)["seal_queue"][name].as_u64().unwrap()
}

#[test]
fn idle_sessions_are_sealed_without_being_asked() {
    let Some(_turn) = servers_present("idle_sessions_are_sealed_without_being_asked") else {
        return;
    };
    let token = run_token();
    let runtime = crate::common::runtime();
    set_up_streams(&runtime);
    wait_cluster_settled();
    let mut fleet = Fleet::spawn_with_args(
        "st",
        &token,
        NODES,
        SHARDS,
        NODE_TTL,
        &[
            "--mode",
            "sealed",
            "--seal-idle-ms",
            IDLE_MS,
            "--seal-tail-bytes",
            "0",
        ],
    );
    let mut router = fleet.router();
    let sessions = session_names("st", &token, SESSIONS);
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();
    for (session, model) in sessions.iter().zip(&mut models) {
        for _ in 0..BATCHES {
            assert!(append_once(&mut router, session, model), "{session}");
        }
    }
    let acked: usize = models.iter().map(|model| model.acked.len()).sum();

    // No seal is asked for: the idle trigger seals every session.
    let sealing = wait_until("every idle session sealed (lag 0)", SEAL_DEADLINE, || {
        (0..NODES).all(|index| lag_events(&fleet, index) == 0)
    });
    let by_idle: u64 = (0..NODES)
        .map(|index| seal_counter(&fleet, index, "triggered_by_idle"))
        .sum();
    let by_size: u64 = (0..NODES)
        .map(|index| seal_counter(&fleet, index, "triggered_by_size"))
        .sum();
    assert!(
        by_idle >= SESSIONS as u64,
        "{by_idle} seals triggered by idleness"
    );
    assert_eq!(by_size, 0, "the size trigger is off");

    // Nothing is at risk now: the owner of most sessions dies, the survivor has it all.
    let (_, killed) = owners_and_busiest(&fleet, &router, &sessions);
    fleet.kill(killed);
    let mut survivors = fleet.router_without(&[killed]);
    for (session, model) in sessions.iter().zip(&models) {
        let stored = check_session(&mut survivors, session, model);
        assert_eq!(stored, model.acked.len(), "{session}: events stored");
    }
    eprintln!(
        "seal triggers: {acked} events of {SESSIONS} idle sessions sealed without a request \
         in {sealing:?} ({by_idle} idle-triggered seals); every one served after kill -9 of \
         node {killed}"
    );
    drop(fleet);
}
