//! The lease outlives a busy runtime: a node whose every runtime worker is blocked for
//! three lease TTLs (the `stall` test hook, as CPU-bound work or a slow takeover would hold
//! them) keeps its lease, its shards and its sessions, because the lease is refreshed on a
//! thread of its own. Before that thread, the refresh waited for a worker, the lease lapsed
//! at the server, and the node dropped every shard (`leases_lost`, `shards_lost`).
//!
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common::{
    append_once, check_session, create_sessions, run_token, servers_present, session_names, Client,
    Fleet, SessionModel, NODE_TTL, SETUP_DEADLINE,
};
use serde_json::json;

const SHARDS: u32 = 8;
const SESSIONS: usize = 4;
/// How many lease TTLs the runtime is held: well past the TTL, so that a refresh on the
/// runtime would surely lapse.
const STALL_TTLS: u32 = 3;

#[test]
fn the_lease_outlives_a_runtime_blocked_past_its_ttl() {
    let Some(_turn) = servers_present("heartbeat") else {
        return;
    };
    let token = run_token();
    let fleet = Fleet::spawn("hb", &token, 1, SHARDS);
    fleet.wait_ownership_settled(SETUP_DEADLINE);
    let mut router = fleet.router();
    let sessions = session_names("hb", &token, SESSIONS);
    create_sessions(&mut router, &sessions);
    let mut models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();
    for (session, model) in sessions.iter().zip(&mut models) {
        assert!(
            append_once(&mut router, session, model),
            "{session}: append"
        );
    }
    let metrics = |fleet: &Fleet| {
        let status = fleet.status(0);
        (
            status["metrics"]["leases_lost"].as_u64().unwrap(),
            status["metrics"]["shards_lost"].as_u64().unwrap(),
            status["metrics"]["reregistrations"].as_u64().unwrap(),
        )
    };
    let before = metrics(&fleet);
    let owned_before = fleet.owned_shards(0);
    assert_eq!(
        owned_before.len(),
        SHARDS as usize,
        "one node owns every shard"
    );

    let stall_ms = u64::try_from((NODE_TTL * STALL_TTLS).as_millis()).unwrap();
    let mut client = Client::connect(&fleet.addrs[0]).unwrap();
    let reply = client
        .call(&json!({"op": "stall", "ms": stall_ms}))
        .unwrap();
    assert_eq!(reply["ok"], json!(true), "stall: {reply}");
    assert!(reply["workers"].as_u64().unwrap() >= 1, "stall: {reply}");
    // The runtime answers this test before its takeover loop comes round again: give that
    // loop a lease's time (several ticks) to find out what became of the lease.
    std::thread::sleep(NODE_TTL);

    assert_eq!(
        metrics(&fleet),
        before,
        "(leases lost, shards lost, re-registrations) changed while the runtime was blocked"
    );
    assert_eq!(
        fleet.owned_shards(0),
        owned_before,
        "the node's shards changed"
    );
    for (session, model) in sessions.iter().zip(&mut models) {
        assert!(
            append_once(&mut router, session, model),
            "{session}: append after the stall"
        );
        assert_eq!(check_session(&mut router, session, model), 4, "{session}");
    }
}
