//! The fleet tests against the real servers (3 × nats-server, s3s-fs: started by
//! `tests/fleet/servers.sh`), as one test binary: one build and one link for all of them
//! instead of one per file. They take the servers one at a time ([`common::servers_present`]
//! hands out the turn), since they kill, stop and restart servers and load the machine.
//!
//! Without `DSHDB_FLEET_SERVERS=1` each prints a SKIPPED line and passes, except under
//! `CI=true`, where missing servers fail it. `f9_report` (the F9 report run, `--ignored`) is
//! a binary of its own that `cargo test` does not build unless named (`--test f9_report`).

#![allow(clippy::unwrap_used)]

mod common;

mod f1_node_kill;
mod f2_nats_leader_kill;
mod f3_zombie;
mod f4_seal_cold;
mod f5_s3_outage;
mod f6_cluster_restart;
mod f7_block_corruption;
mod group_purge;
mod heartbeat;
mod replay_by_get;
mod restart_ship;
mod seal_triggers;
mod sealed_mode;
mod servers;
