//! Shipping after a restart, with real processes: a `local`-mode node acknowledges appends
//! while the three NATS servers are down (its lease still valid), so they cannot ship; it is
//! killed with `kill -9`; NATS comes back; the node's next process takes its shards straight
//! back, finds those events on its disk past the tail's history, serves them and ships them.
//! Every acknowledged event is present once, in order, and the backlog drains to 0.
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::{
    append_once, check_session, create_sessions, run_token, servers_present, servers_script,
    session_names, set_up_streams, wait_cluster_settled, wait_listening, wait_until, Fleet,
    ServersBack, SessionModel, SETUP_DEADLINE,
};
use std::time::{Duration, Instant};

const SHARDS: u32 = 8;
const SESSIONS: usize = 4;
/// The node's lease: longer than the suite's usual TTL, so that the appends after NATS went
/// down fall inside it even on a loaded machine (the last refresh may be a third of a TTL old,
/// and every heartbeat fails from the kill on).
const LEASE_TTL: Duration = Duration::from_secs(6);
/// How long the test appends after killing NATS: well inside the lease, so that the node
/// still acknowledges locally.
const APPEND_AFTER_STOP: Duration = Duration::from_millis(800);
/// Longest wait for the restarted node to ship its inherited backlog.
const SHIP_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn a_killed_local_node_ships_its_backlog_after_its_restart() {
    let Some(_turn) = servers_present("restart_ship") else {
        return;
    };
    let token = run_token();
    let runtime = common::runtime();
    set_up_streams(&runtime);
    let mut fleet =
        Fleet::spawn_with_args("rs", &token, 1, SHARDS, LEASE_TTL, &["--mode", "local"]);
    fleet.wait_ownership_settled(SETUP_DEADLINE);
    let mut router = fleet.router();
    let sessions = session_names("rs", &token, SESSIONS);
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();
    for (session, model) in sessions.iter().zip(&mut models) {
        assert!(append_once(&mut router, session, model), "{session}");
    }

    // NATS goes down at once (SIGKILL: a clean shutdown of JetStream can take seconds, and
    // the lease runs out meanwhile); the node still acknowledges locally while it lasts.
    let mut back = ServersBack::new(&["start-nats"]);
    back.down = true;
    let killing = Instant::now();
    servers_script(&["kill-nats"]);
    let kill_took = killing.elapsed();
    let before: usize = models.iter().map(|model| model.acked.len()).sum();
    let started = Instant::now();
    'appending: while started.elapsed() < APPEND_AFTER_STOP {
        for (session, model) in sessions.iter().zip(&mut models) {
            if !append_once(&mut router, session, model) {
                break 'appending;
            }
        }
    }
    let acked_while_down: usize =
        models.iter().map(|model| model.acked.len()).sum::<usize>() - before;
    assert!(
        acked_while_down > 0,
        "nothing acknowledged while NATS was down (killing it took {kill_took:?}, lease {LEASE_TTL:?})"
    );
    fleet.kill(0);
    back.start();
    wait_cluster_settled();

    // The node's next process: every acknowledged event is served, and shipped.
    fleet.start(0);
    wait_listening(&fleet.addrs[0]);
    let mut router = fleet.router();
    for (session, model) in sessions.iter().zip(&models) {
        let stored = check_session(&mut router, session, model);
        assert_eq!(stored, model.acked.len(), "{session}: events stored");
    }
    let inherited = fleet.metric(0, "inherited_events");
    assert!(inherited > 0, "no event inherited from the killed process");
    wait_until("the inherited backlog ships", SHIP_DEADLINE, || {
        fleet.status(0)["replication"]["lag"]["events"] == serde_json::json!(0)
    });
    // Appends go on after the inherited events.
    for (session, model) in sessions.iter().zip(&mut models) {
        assert!(append_once(&mut router, session, model), "{session}");
        check_session(&mut router, session, model);
    }
    eprintln!(
        "restart_ship: {acked_while_down} events acknowledged locally while NATS was down, \
         {inherited} inherited and shipped by the restarted process"
    );
    drop(fleet);
    drop(back);
}
