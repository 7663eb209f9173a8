//! F6 of FLEET.md with real processes: the whole NATS cluster restarts mid-ingest, once
//! cleanly (SIGTERM to all 3 servers) and once as a coordinated crash (`kill -9` of all 3 at
//! once, together with `kill -9` of both fleet nodes).
//!
//! Checks: the servers run with `sync_interval: always` (read back from `/varz` before and
//! after each restart); after each restart every acknowledged event is in the replicated
//! tail (each tail message decoded from the stream, exactly one event per seq) and served by
//! the owner at its seq (after the crash: by restarted nodes that rebuild from the stream);
//! the sessions accept appends again.
//!
//! The servers are `tests/fleet/servers.sh`'s: they are started again even if the test
//! fails, and the test ends only when all three are healthy, for the tests after it.
//! Skipped (a SKIPPED line) without `DSHDB_FLEET_SERVERS=1`, failed under `CI=true`.

#![allow(clippy::unwrap_used)]

use crate::common;

use crate::common::{
    append_once, check_session, create_sessions, monitor_json, nats_monitor_port, servers_present,
    servers_script, session_names, set_up_streams, wait_listening, wait_until, write_until, Fleet,
    Router, ServersBack, SessionModel, Writer, NATS_SERVERS,
};
use dshdb_fleet::backend::TailLog;
use dshdb_fleet::shard::{group_subject, session_subject, shard_of_in, stream_name};
use dshdb_fleet::wire::decode_tail_message;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const NODES: usize = 2;
const SESSIONS: usize = 8;
const SHARDS: u32 = 16;
/// Ingest before each restart.
const INGEST: Duration = Duration::from_secs(2);
/// Pause of each session's writer between appends.
const APPEND_PAUSE: Duration = Duration::from_millis(20);
/// Longest wait for the tail to be readable, or for a session to accept appends again.
const DEADLINE: Duration = Duration::from_secs(30);

/// Fails unless every server reports `sync_interval: always` (a default-fsync run must not
/// pass: acknowledged writes would not survive the coordinated crash).
fn assert_sync_always() {
    for server in NATS_SERVERS {
        let varz = monitor_json(nats_monitor_port(server), "varz")
            .unwrap_or_else(|| panic!("nats{server}: no /varz"));
        assert_eq!(
            varz["jetstream"]["config"]["sync_always"], true,
            "nats{server} does not run with sync_interval: always: {}",
            varz["jetstream"]["config"]
        );
    }
}

/// The session's events as its replicated tail holds them: seq → data, every tail message
/// decoded (CRCs checked); a seq stored with two different events fails.
fn tail_events(
    runtime: &tokio::runtime::Runtime,
    nats: &dshdb_fleet::nats::Nats,
    session: &str,
) -> Option<BTreeMap<u64, String>> {
    let shard = shard_of_in(session, SHARDS);
    let mut messages = Vec::new();
    // A batch is stored alone on the session's subject, or in a group message of its shard.
    for subject in [session_subject(session, shard), group_subject(shard)] {
        messages.extend(
            runtime
                .block_on(nats.replay(&stream_name(shard), &subject, 1))
                .ok()?,
        );
    }
    let mut events = BTreeMap::new();
    for message in messages {
        let batches = decode_tail_message(&message.payload).unwrap();
        for batch in batches.into_iter().filter(|batch| batch.session == session) {
            for event in batch.events {
                if let Some(before) = events.insert(event.seq, event.data.clone()) {
                    assert_eq!(
                        before, event.data,
                        "{session}: two events at seq {}",
                        event.seq
                    );
                }
            }
        }
    }
    Some(events)
}

/// Every acknowledged event is in the replicated tail at its seq; returns how many events
/// the tail holds for the sessions.
fn check_tails(
    runtime: &tokio::runtime::Runtime,
    sessions: &[String],
    models: &[SessionModel],
) -> usize {
    // A fresh connection: the servers restarted under the old one.
    let nats = set_up_streams(runtime);
    let mut stored = 0;
    for (session, model) in sessions.iter().zip(models) {
        let mut events = None;
        wait_until(
            &format!("{session}: the tail is readable"),
            DEADLINE,
            || {
                events = tail_events(runtime, &nats, session);
                events.is_some()
            },
        );
        let events = events.unwrap();
        for (seq, data) in &model.acked {
            assert_eq!(
                events.get(seq),
                Some(data),
                "{session}: acknowledged seq {seq} not in the tail after the restart"
            );
        }
        stored += events.len();
    }
    stored
}

/// Runs one writer thread per session for [`INGEST`], then `fault` while their appends are
/// in flight (the writers stop once it returns); returns the models and the appends of
/// unknown outcome once the writers are done.
fn ingest_then(
    routers: Vec<Router>,
    sessions: &[String],
    models: Vec<SessionModel>,
    fault: impl FnOnce(),
) -> (Vec<SessionModel>, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = sessions
        .iter()
        .zip(models)
        .zip(routers)
        .map(|((session, model), router)| {
            let (session, stop) = (session.clone(), stop.clone());
            std::thread::spawn(move || write_until(router, session, model, APPEND_PAUSE, stop))
        })
        .collect();
    std::thread::sleep(INGEST);
    fault();
    stop.store(true, Ordering::SeqCst);
    let writers: Vec<Writer> = writers
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .collect();
    let unknown = writers.iter().map(|writer| writer.unknown).sum();
    (
        writers.into_iter().map(|writer| writer.model).collect(),
        unknown,
    )
}

fn acked(models: &[SessionModel]) -> usize {
    models.iter().map(|model| model.acked.len()).sum()
}

/// Each session accepts an append again (bounded), and serves every acknowledged event.
fn appends_resume(fleet: &Fleet, sessions: &[String], models: &mut [SessionModel]) -> usize {
    let mut router = fleet.router();
    let mut stored = 0;
    for (session, model) in sessions.iter().zip(models.iter_mut()) {
        wait_until(&format!("{session} accepts appends"), DEADLINE, || {
            append_once(&mut router, session, model)
        });
        stored += check_session(&mut router, session, model);
    }
    stored
}

#[test]
fn f6_whole_cluster_restart() {
    let Some(_turn) = servers_present("f6_whole_cluster_restart") else {
        return;
    };
    assert_sync_always();
    let token = common::run_token();
    let runtime = common::runtime();
    set_up_streams(&runtime);
    let mut fleet = Fleet::spawn("w", &token, NODES, SHARDS);
    let mut router = fleet.router();
    let sessions = session_names("f6", &token, SESSIONS);
    create_sessions(&mut router, &sessions);
    let models: Vec<SessionModel> = sessions.iter().map(|_| SessionModel::default()).collect();

    // 1. SIGTERM to all three servers at once, mid-ingest; start them again.
    let mut back = ServersBack::new(&["start-nats"]);
    let routers = sessions.iter().map(|_| fleet.router()).collect();
    let (models, unknown_term) = ingest_then(routers, &sessions, models, || {
        back.down = true;
        servers_script(&["stop-nats"]);
        back.start();
    });
    assert_sync_always();
    let acked_term = acked(&models);
    assert!(acked_term > 0, "nothing acknowledged before the SIGTERM");
    let in_tail_term = check_tails(&runtime, &sessions, &models);
    let mut models = models;
    let served_term = appends_resume(&fleet, &sessions, &mut models);

    // 2. kill -9 of all three servers at once and of both fleet nodes; start everything
    // again on its disk. The new node processes rebuild every session from the stream.
    let acked_before = acked(&models);
    let routers = sessions.iter().map(|_| fleet.router()).collect();
    let (mut models, unknown_kill) = ingest_then(routers, &sessions, models, || {
        back.down = true;
        servers_script(&["kill-nats"]);
        for index in 0..NODES {
            fleet.kill(index);
        }
    });
    back.start();
    assert_sync_always();
    let acked_kill = acked(&models);
    assert!(
        acked_kill > acked_before,
        "nothing acknowledged before the kill -9"
    );
    let in_tail_kill = check_tails(&runtime, &sessions, &models);
    for index in 0..NODES {
        fleet.start(index);
    }
    for addr in &fleet.addrs {
        wait_listening(addr);
    }
    let served_kill = appends_resume(&fleet, &sessions, &mut models);
    eprintln!(
        "f6: {SESSIONS} sessions on {NODES} nodes; SIGTERM of the 3 servers: events acked \
         {acked_term} ({unknown_term} appends of unknown outcome), in the tail after the \
         restart {in_tail_term}, served {served_term}; kill -9 of the 3 servers and both \
         nodes: events acked {acked_kill} ({unknown_kill} unknown), in the tail after the \
         restart {in_tail_kill}, served by the restarted nodes {served_kill}; sync_interval \
         always on all 3 before and after"
    );
    drop(fleet);
    drop(back);
}
