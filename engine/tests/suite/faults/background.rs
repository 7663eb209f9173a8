//! Failures that happen away from the caller: in the group commit that many appenders share,
//! when a background thread is started, and in a pass of the background maintenance thread.
//! Each reaches a caller with its cause: a full disk says so to every appender, a thread
//! that cannot start fails `open` (and the store opens afterwards), and a failed background
//! pass is returned by the next `flush` or `maintain` and counted by `stats`.

use crate::common;

use common::*;
use dshdb::storage::commit::thread_start_faults::fail_next_start;
use dshdb::storage::commit::{Durability, COMMITTER_THREAD};
use dshdb::storage::io::sim::{FaultKind, SimStorage};
use dshdb::store::{Options, Store, MAINTENANCE_THREAD};
use dshdb::Error;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// Appenders that share the failing group commit.
const APPENDERS: usize = 4;
/// How long a test waits for the background thread before it fails, in seconds.
const BACKGROUND_TIMEOUT_SECONDS: u64 = 20;

fn assert_disk_full(error: &Error, context: &str) {
    assert!(
        matches!(error, Error::Poisoned { .. }),
        "{context}: {error:?}"
    );
    assert_eq!(
        error.io_kind(),
        Some(ErrorKind::StorageFull),
        "{context}: {error:?}"
    );
    assert!(
        error.to_string().contains("the disk is full"),
        "{context}: {error}"
    );
    assert!(
        std::error::Error::source(error).is_some(),
        "{context}: the cause is kept as the source"
    );
}

/// ENOSPC on the write or on the `fdatasync` of a group commit that several sessions' batches
/// share: every pending receipt, and every append after it, fails with the full disk as its
/// cause (before, each got only `Poisoned { operation: "write" }`).
#[test]
fn a_full_disk_in_group_commit_reaches_every_pending_receipt_and_later_appends() {
    for fault in [FaultKind::Write, FaultKind::Sync] {
        let disk = SimStorage::new();
        let options = Options {
            segment_bytes: 1 << 20,
            ..sim_options(Durability::Sync)
        };
        let store = open_sim(&disk, options).expect("open");
        let mut writers: Vec<_> = (0..APPENDERS)
            .map(|index| {
                store
                    .create_session_with_id(&format!("s{index}"))
                    .expect("create")
            })
            .collect();
        disk.fail_nth_with(fault, 0, libc::ENOSPC);
        let mut pending = 0;
        let mut failures = Vec::new();
        for (index, writer) in writers.iter_mut().enumerate() {
            let data = event_data(index, 0, 200);
            // The committer may fail the first batch before the others are submitted: then
            // their submit fails at once, with the same cause.
            match writer.submit_batch(&[chunk(&data)]) {
                Ok(receipt) => {
                    pending += 1;
                    failures.push(receipt.wait().expect_err("a failed group is not durable"));
                }
                Err(error) => failures.push(error),
            }
        }
        assert!(pending >= 1, "{fault:?}: the first batch is always queued");
        for (index, error) in failures.iter().enumerate() {
            assert_disk_full(error, &format!("{fault:?}: appender {index}"));
        }
        let later = writers[0]
            .append(chunk(&event_data(0, 1, 200)))
            .expect_err("a poisoned store takes no append");
        assert_disk_full(&later, &format!("{fault:?}: a later append"));
        let flush = store.flush().expect_err("nothing more becomes durable");
        assert_disk_full(&flush, &format!("{fault:?}: a later flush"));
        drop(writers);
        drop(store);
        // The acknowledged session headers survive; the store opens and takes appends.
        let reopened = open_sim(
            &SimStorage::from_image(&disk.durable_image()),
            sim_options(Durability::Sync),
        )
        .expect("reopen after the full disk");
        assert_eq!(reopened.session("s0").expect("s0").events, 0);
        reopened
            .writer("s0")
            .expect("writer")
            .append(chunk(&event_data(0, 0, 200)))
            .expect("append after reopen");
    }
}

/// A store with `events` events in session `s0`, closed.
fn store_with_events(events: u64) -> SimStorage {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writer = store.create_session_with_id("s0").expect("create");
    for seq in 0..events {
        writer
            .append(chunk(&event_data(0, seq, 100)))
            .expect("append");
    }
    drop(writer);
    store.close().expect("close");
    disk
}

/// When the committer or the maintenance thread cannot start, `open` fails with
/// `ThreadStart` naming it (before, the committer's failure left every append waiting
/// forever and the maintenance thread's was ignored), releases the lock and changes nothing:
/// the next open finds every event.
#[test]
fn a_background_thread_that_cannot_start_fails_open_and_the_store_opens_afterwards() {
    for thread in [COMMITTER_THREAD, MAINTENANCE_THREAD] {
        let disk = store_with_events(5);
        let options = Options {
            maintenance_interval: Some(Duration::from_secs(3600)),
            ..sim_options(Durability::Sync)
        };
        fail_next_start(thread);
        let error = open_sim(&disk, options.clone())
            .err()
            .unwrap_or_else(|| panic!("open succeeded without the {thread} thread"));
        assert!(
            matches!(&error, Error::ThreadStart { thread: failed, .. } if *failed == thread),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains(&format!("cannot start the {thread} thread")),
            "{error}"
        );
        assert!(error.io_kind().is_some(), "the OS error is kept: {error:?}");
        // The failed open released the lock and kept every event; the store takes appends.
        let store = open_sim(&disk, options).expect("the store opens afterwards");
        let events = store.read("s0", 0, u64::MAX).expect("read");
        assert_eq!(
            events.len(),
            5,
            "after a failed start of the {thread} thread"
        );
        let mut writer = store.writer("s0").expect("writer");
        writer
            .append(chunk(&event_data(0, 5, 100)))
            .expect("append after reopening");
        drop(writer);
        store.close().expect("close");
    }
}

/// The image a killed process leaves of a store with several sealed segments and no runs:
/// opening it writes no manifest (the tail is continued, not sealed), so the first manifest
/// rename after the open is the background pass's. Returns it and its sealed segments.
fn killed_store_with_sealed_segments() -> (SimStorage, u64) {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writer = store.create_session_with_id("s0").expect("create");
    let mut seq = 0;
    while store.stats(None).expect("stats").segments < 3 {
        writer
            .append(chunk(&event_data(0, seq, 300)))
            .expect("append");
        seq += 1;
    }
    let sealed = store.stats(None).expect("stats").segments - 1;
    let image = disk.volatile_image();
    drop(writer);
    drop(store);
    (SimStorage::from_image(&image), sealed)
}

fn background_options() -> Options {
    Options {
        maintenance_interval: Some(Duration::from_millis(5)),
        ..sim_options(Durability::Sync)
    }
}

/// Waits until the background thread has failed `count` passes and then sealed everything.
fn wait_for_failed_then_sealed(store: &Store, count: u64) -> dshdb::store::Stats {
    let deadline = Instant::now() + Duration::from_secs(BACKGROUND_TIMEOUT_SECONDS);
    loop {
        let stats = store.stats(None).expect("stats");
        if stats.maintenance_failures >= count && stats.segments == 1 && stats.runs > 0 {
            return stats;
        }
        assert!(
            Instant::now() < deadline,
            "the background thread did not fail and then seal: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A failed pass of the background maintenance thread (the manifest rename of a seal, or
/// the seq-index checkpoint after the seals) is counted and shown by `stats`, and returned
/// once by the next `flush`, `maintain` or `close`, whose own work is done (before, the thread
/// dropped it: `let _ = maintain()`).
#[test]
fn a_failed_background_maintenance_pass_is_reported_by_the_next_call_and_stats() {
    type Call = fn(&Store) -> dshdb::Result<()>;
    let calls: [(&str, Call); 3] = [
        ("flush", |store| store.flush()),
        ("maintain", |store| store.maintain().map(drop)),
        ("close", |store| store.close()),
    ];
    for (name, call) in calls {
        for (step, operation) in [
            ("seal", "manifest rename"),
            ("checkpoint", "checkpoint rename"),
        ] {
            let context = format!("{name} after a failed {step}");
            let (disk, sealed) = killed_store_with_sealed_segments();
            // Renames of a pass: one manifest per sealed segment, then the checkpoint.
            let rename = if step == "seal" { 0 } else { sealed };
            disk.fail_nth(FaultKind::Rename, rename);
            let store = open_sim(&disk, background_options()).expect("open");
            let stats = wait_for_failed_then_sealed(&store, 1);
            let last = stats
                .last_maintenance_failure
                .unwrap_or_else(|| panic!("{context}: stats shows no failure"));
            assert!(last.contains(operation), "{context}: {last}");
            let error = call(&store).expect_err("the failed pass is reported");
            let Error::Maintenance { source } = &error else {
                panic!("{context}: {error:?}");
            };
            assert!(
                matches!(source.as_ref(), Error::Io { operation: failed, .. } if *failed == operation),
                "{context}: {source:?}"
            );
            assert!(error.to_string().contains(operation), "{context}: {error}");
            call(&store).unwrap_or_else(|error| panic!("{context}: reported twice: {error}"));
            let after = store.stats(None).expect("stats");
            assert!(
                after.maintenance_failures >= 1,
                "{context}: stats keeps the count"
            );
            assert_eq!(
                store.read("s0", 0, u64::MAX).expect("read").len() as u64,
                store.session("s0").expect("s0").events,
                "{context}"
            );
            store.close().expect("close");
        }
    }
}
