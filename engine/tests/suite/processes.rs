//! Many processes on one store (format-spec/08-many-processes.md) on the simulated disk:
//! each `Store` opened with `Options::shared` on one `SimStorage` is one process (its own
//! `SHARED` lock owner). A power cut kills them all; the crash-point enumeration checks,
//! with two and three writers interleaved, that every acknowledged event of every writer
//! survives, nothing unacknowledged appears as committed, and the store works on.

use crate::common;

use common::hooked::{Hooked, Moment, Step};
use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;
use std::time::Duration;

fn shared() -> Options {
    Options {
        shared: true,
        ..sim_options(Durability::Sync)
    }
}

fn data(process: usize, seq: u64) -> String {
    event_data(process, seq, 60 + (seq as usize * 37) % 300)
}

#[test]
fn two_processes_interleave_appends_and_a_reopen_keeps_both() {
    let disk = SimStorage::new();
    let first = open_sim(&disk, shared()).expect("first process");
    let second = open_sim(&disk, shared()).expect("second process joins");
    assert!(first.is_shared() && second.is_shared());
    let mut writers = [
        first.create_session_with_id("a").expect("create a"),
        second.create_session_with_id("b").expect("create b"),
    ];
    for seq in 0..40u64 {
        for (process, writer) in writers.iter_mut().enumerate() {
            let text = data(process, seq);
            let receipt = writer.append(chunk(&text)).expect("append");
            assert_eq!(receipt.first_seq, seq);
        }
    }
    assert!(
        second.refresh().expect("refresh"),
        "the first one's commits are new"
    );
    assert_eq!(second.session("a").expect("a seen").events, 40);
    assert!(
        !second.refresh().expect("refresh"),
        "nothing new the second time"
    );
    drop(writers);
    first.close().expect("close first");
    second.close().expect("close second, the last one");
    let reopened = open_sim(&disk, sim_writable()).expect("an exclusive open after them");
    for (process, id) in ["a", "b"].iter().enumerate() {
        let events = reopened.read(id, 0, u64::MAX).expect("read");
        assert_eq!(events.len(), 40, "{id}");
        for (seq, event) in events.iter().enumerate() {
            assert_eq!(event.data, data(process, seq as u64), "{id} seq {seq}");
        }
    }
}

/// The last segment file of the simulated store: the tail a joiner reads a prefix of.
fn last_segment_path(disk: &SimStorage) -> String {
    let last = disk
        .list("wal")
        .expect("list wal")
        .iter()
        .filter_map(|name| u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok())
        .max()
        .expect("a segment");
    dshdb::storage::segment::segment_path(last)
}

/// Segment size of the join test: its 20 events (at most 400 bytes each) fit in one.
const JOIN_TEST_SEGMENT_BYTES: u64 = 64 * 1024;

/// F-08-15: a joiner reads the checkpoint before the published tail. Here another process
/// commits more and checkpoints it exactly between the joiner's read of the tail and its
/// read of the tail segment (the race the many-process `kill -9` test hit once): the
/// checkpoint on disk then ends past the end the joiner replays to. Read after the tail, it
/// made the joiner refuse the store as `Corrupt` ("the checkpoint recorded them durable up
/// to offset …"); the joiner must open, and catch up on the rest.
#[test]
fn a_checkpoint_written_while_a_process_joins_does_not_fail_its_open() {
    let disk = SimStorage::new();
    let options = Options {
        checkpoint_every_bytes: None,
        // Room for every event in one segment: the race is within the tail segment.
        segment_bytes: JOIN_TEST_SEGMENT_BYTES,
        ..shared()
    };
    let first = open_sim(&disk, options.clone()).expect("first process");
    let mut writer = first.create_session_with_id("a").expect("create a");
    for seq in 0..10u64 {
        writer.append(chunk(&data(0, seq))).expect("append");
    }
    assert!(first.checkpoint().expect("checkpoint").is_some(), "written");
    let behind = first.clone();
    let step: Step = Box::new(move || {
        for seq in 10..20u64 {
            writer
                .append(chunk(&data(0, seq)))
                .expect("append meanwhile");
        }
        assert!(
            behind.checkpoint().expect("checkpoint meanwhile").is_some(),
            "the newer checkpoint is written"
        );
    });
    let hooked = Hooked::new(&disk, last_segment_path(&disk), Moment::BeforeRead, step);
    let joiner = Store::open_on(hooked.clone(), options, std::path::Path::new("sim"))
        .expect("the joiner opens");
    assert!(
        hooked.fired(),
        "the other process committed during the join"
    );
    joiner.refresh().expect("catch up");
    let events = joiner.read("a", 0, u64::MAX).expect("read");
    assert_eq!(
        events.len(),
        20,
        "every acknowledged event, the later ten too"
    );
    for event in &events {
        assert_eq!(event.data, data(0, event.seq), "seq {}", event.seq);
    }
}

#[test]
fn a_leased_session_is_busy_for_another_process_and_continues_after_it() {
    let disk = SimStorage::new();
    let first = open_sim(&disk, shared()).expect("first");
    let second = open_sim(&disk, shared()).expect("second");
    let mut writer = first.create_session_with_id("chat").expect("create");
    writer.append(chunk("{\"n\":0}")).expect("append");
    match second.writer("chat") {
        Err(Error::SessionBusy { id, pid }) => {
            assert_eq!(id, "chat");
            assert_eq!(pid, Some(std::process::id()), "the holder's pid is named");
        }
        other => panic!("expected SessionBusy, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        second.create_session_with_id("chat"),
        Err(Error::SessionBusy { .. })
    ));
    writer.append(chunk("{\"n\":1}")).expect("append");
    drop(writer);
    let mut next = second.writer("chat").expect("free once the holder let go");
    let receipt = next.append(chunk("{\"n\":2}")).expect("append");
    assert_eq!(
        receipt.first_seq, 2,
        "continues after every event of the first"
    );
    drop(next);
    assert!(matches!(
        first.create_session_with_id("chat"),
        Err(Error::DuplicateSession { .. })
    ));
}

#[test]
fn a_dead_processs_lease_is_free_and_its_acknowledged_events_stay() {
    let disk = SimStorage::new();
    let survivor = open_sim(&disk, shared()).expect("survivor");
    let doomed = open_sim(&disk, shared()).expect("doomed");
    let mut writer = doomed.create_session_with_id("s").expect("create");
    for seq in 0..5u64 {
        writer.append(chunk(&data(0, seq))).expect("append");
    }
    // The process dies: its handles go without a close, so its locks are released the
    // way the kernel releases them.
    std::mem::drop(writer);
    drop(doomed);
    let mut taken = survivor.writer("s").expect("the lease is free");
    assert_eq!(
        taken.append(chunk(&data(0, 5))).expect("append").first_seq,
        5
    );
}

#[test]
fn a_subscriber_sees_every_durable_event_of_another_process_once_in_order() {
    let disk = SimStorage::new();
    let writer_process = open_sim(&disk, shared()).expect("writer");
    let follower_process = open_sim(&disk, shared()).expect("follower");
    let mut subscription = follower_process.subscribe("live", 0).expect("subscribe");
    let producer = std::thread::spawn(move || {
        let mut writer = writer_process
            .create_session_with_id("live")
            .expect("create");
        for seq in 0..30u64 {
            writer.append(chunk(&data(1, seq))).expect("append");
        }
        drop(writer);
        writer_process.close().expect("close");
    });
    let mut seen = Vec::new();
    while seen.len() < 30 {
        match subscription
            .next_timeout(Duration::from_secs(10))
            .expect("follow")
        {
            Some(event) => seen.push(event),
            None => panic!("no event within 10 s after {}", seen.len()),
        }
    }
    producer.join().expect("producer");
    for (seq, event) in seen.iter().enumerate() {
        assert_eq!(event.seq, seq as u64);
        assert_eq!(event.data, data(1, seq as u64));
    }
    assert!(subscription
        .next_timeout(Duration::from_millis(50))
        .expect("follow")
        .is_none());
}

#[test]
fn an_exclusive_writer_and_a_shared_one_exclude_each_other() {
    let disk = SimStorage::new();
    let exclusive = open_sim(&disk, sim_writable()).expect("exclusive");
    assert!(matches!(
        open_sim(&disk, shared()),
        Err(Error::Locked { .. })
    ));
    exclusive.close().expect("close");
    drop(exclusive);
    let shared_store = open_sim(&disk, shared()).expect("shared");
    assert!(matches!(
        open_sim(&disk, sim_writable()),
        Err(Error::Locked { .. })
    ));
    shared_store.close().expect("close");
}

/// Opens a new store on `disk` with `options` while another process creates it at the
/// worst moment: right after this open, before its lock, looked for `MANIFEST` and found
/// none, or (`(path, moment)` = `("", AfterList)`) listed the directory before the
/// creation and `wal/` after it. The creator (opened with `creator`, with one event in
/// session "first") is returned alive beside the outcome.
fn open_while_another_creates(
    disk: &SimStorage,
    (path, moment): (&str, Moment),
    creator: Options,
    options: Options,
) -> (dshdb::Result<Store>, Store) {
    let slot = std::sync::Arc::new(parking_lot::Mutex::new(None));
    let filled = slot.clone();
    let other = disk.clone();
    let step: Step = Box::new(move || {
        let store = open_sim(&other, creator).expect("the other process creates the store");
        let mut writer = store.create_session_with_id("first").expect("create");
        writer.append(chunk(&data(1, 0))).expect("append");
        drop(writer);
        *filled.lock() = Some(store);
    });
    let hooked = Hooked::new(disk, path.to_string(), moment, step);
    let opened = Store::open_on(hooked.clone(), options, std::path::Path::new("sim"));
    assert!(
        hooked.fired(),
        "the other process created the store meanwhile"
    );
    let creator = slot.lock().take().expect("the creator is open");
    (opened, creator)
}

/// The pre-lock look for `MANIFEST` that found none.
const MANIFEST_LOOKED_FOR: (&str, Moment) = ("MANIFEST", Moment::AfterExists);
/// The pre-lock listing of the store directory, before `wal/`'s.
const STORE_DIR_LISTED: (&str, Moment) = ("", Moment::AfterList);

#[test]
fn a_creation_between_the_pre_lock_listings_is_joined_not_called_damage() {
    let disk = SimStorage::new();
    let (opened, creator) = open_while_another_creates(&disk, STORE_DIR_LISTED, shared(), shared());
    // Before the fix: `CorruptFile { "MANIFEST" }` ("missing while sim holds segments"),
    // for the creator's first segment, listed in `wal/` after the directory without it.
    let joiner = opened.expect("the second process joins the store the first created");
    assert_eq!(joiner.session("first").expect("seen").events, 1);
    joiner.close().expect("close joiner");
    creator.close().expect("close creator");
}

#[test]
fn two_processes_creating_one_store_at_once_both_open_it() {
    let disk = SimStorage::new();
    let (opened, creator) =
        open_while_another_creates(&disk, MANIFEST_LOOKED_FOR, shared(), shared());
    // Before the fix: `NotAStore`, from the pre-lock check that listed the creator's
    // `MANIFEST` as a foreign entry (1 worker in ~40 runs of 8 `processes` workers).
    let joiner = opened.expect("the second process joins the store the first created");
    assert_eq!(joiner.session("first").expect("seen").events, 1);
    let mut writer = joiner.create_session_with_id("second").expect("create");
    writer.append(chunk(&data(2, 0))).expect("append");
    drop(writer);
    assert!(
        creator.refresh().expect("refresh"),
        "the joiner's commit is new"
    );
    assert_eq!(creator.session("second").expect("seen").events, 1);
    joiner.close().expect("close joiner");
    creator.close().expect("close creator");
}

#[test]
fn an_exclusive_open_racing_a_creation_gets_locked_and_changes_nothing() {
    let disk = SimStorage::new();
    let (opened, creator) =
        open_while_another_creates(&disk, MANIFEST_LOOKED_FOR, sim_writable(), sim_writable());
    assert!(
        matches!(opened, Err(Error::Locked { .. })),
        "a typed refusal while the creator holds the store, got {:?}",
        opened.map(|_| ())
    );
    creator.close().expect("close creator");
    drop(creator);
    let reopened = open_sim(&disk, shared()).expect("the created store opens");
    let events = reopened.read("first", 0, u64::MAX).expect("read");
    assert_eq!(events.len(), 1, "the creator's event is intact");
    reopened.close().expect("close");
}

/// The crash-enumeration workload: `processes` stores on one disk, each on its own thread,
/// each writing its own sessions; every step also moves one session's lease to the next
/// process, so that writers take over sessions others wrote.
#[derive(Clone, Copy, Debug)]
struct Workload {
    processes: usize,
    steps: u64,
}

/// Per session id: what was acknowledged durable and which batch ends were attempted.
#[derive(Default, Debug)]
struct Ledger {
    durable: BTreeMap<String, u64>,
    attempted: BTreeMap<String, Vec<u64>>,
}

/// The seq sits inside the last string, so a batch's events share the text around it and
/// the log stores each batch of two or three as one row entry (format-spec F-02-20): the
/// enumeration covers row entries written, caught up on and recovered across processes.
fn workload_data(id: &str, seq: u64) -> String {
    format!(
        "{{\"id\":\"{id}\",\"pad\":\"{seq}:{}\"}}",
        "p".repeat((seq as usize * 53) % 400)
    )
}

fn run_process(
    store: &Store,
    process: usize,
    workload: Workload,
    ledger: &parking_lot::Mutex<Ledger>,
) {
    let own = format!("p{process}");
    let shared_id = "handoff".to_string();
    for step in 0..workload.steps {
        for id in [&own, &shared_id] {
            if id == &shared_id && step as usize % workload.processes != process {
                continue;
            }
            let writer = match store.writer(id) {
                Ok(writer) => Some(writer),
                Err(Error::UnknownSession { .. }) => store.create_session_with_id(id).ok(),
                Err(_) => None,
            };
            let Some(mut writer) = writer else {
                continue;
            };
            let length = store.session(id).map(|summary| summary.events).unwrap_or(0);
            let count = 1 + (step % 3);
            let texts: Vec<String> = (length..length + count)
                .map(|seq| workload_data(id, seq))
                .collect();
            let events: Vec<_> = texts.iter().map(|text| chunk(text)).collect();
            ledger
                .lock()
                .attempted
                .entry(id.clone())
                .or_default()
                .push(length + count);
            match writer.append_batch(&events) {
                Ok(receipt) => {
                    let mut ledger = ledger.lock();
                    let durable = ledger.durable.entry(id.clone()).or_default();
                    *durable = (*durable).max(receipt.end_seq);
                }
                Err(_) => return,
            }
        }
    }
}

fn run_workload(disk: &SimStorage, workload: Workload) -> Ledger {
    let ledger = parking_lot::Mutex::new(Ledger::default());
    let stores: Vec<Store> = (0..workload.processes)
        .filter_map(|_| open_sim(disk, shared()).ok())
        .collect();
    std::thread::scope(|scope| {
        for (process, store) in stores.iter().enumerate() {
            let ledger = &ledger;
            scope.spawn(move || run_process(store, process, workload, ledger));
        }
    });
    for store in &stores {
        let _ = store.close();
    }
    ledger.into_inner()
}

fn check_image(image: &CrashImage, ledger: &Ledger) -> Result<(), String> {
    let label = &image.label;
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, shared()).map_err(|error| format!("{label}: reopen: {error}"))?;
    check_acknowledged(
        &store,
        label,
        &ledger.durable,
        &ledger.attempted,
        workload_data,
    )?;
    let mut writer = match store.writer("p0") {
        Ok(writer) => writer,
        Err(_) => store
            .create_session_with_id("after")
            .map_err(|error| format!("{label}: create after recovery: {error}"))?,
    };
    writer
        .append(chunk("{\"after\":true}"))
        .map_err(|error| format!("{label}: append after recovery: {error}"))?;
    drop(writer);
    store
        .close()
        .map_err(|error| format!("{label}: close: {error}"))
}

/// Every crash point of one workload; returns how many images were checked.
fn enumerate(workload: Workload) -> u64 {
    let reference = SimStorage::new();
    run_workload(&reference, workload);
    assert!(
        segment_row_entries(&reference).0 > 0,
        "the workload's batches are written as row entries"
    );
    let operations = reference.operation_count();
    let mut checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        if std::env::var_os("DSHDB_TRACE_CUTS").is_some() {
            eprintln!("cut {cut}/{operations}");
        }
        let ledger = run_workload(&disk, workload);
        for image in &disk.take_crash_images() {
            if let Err(violation) = check_image(image, &ledger) {
                panic!("{workload:?} cut at op {cut}: {violation}");
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn every_crash_point_with_two_and_three_writers_keeps_what_they_acknowledged() {
    let mut checked = 0;
    for workload in [
        Workload {
            processes: 2,
            steps: 60,
        },
        Workload {
            processes: 3,
            steps: 40,
        },
    ] {
        checked += enumerate(workload);
    }
    eprintln!("many-process crash images checked: {checked}");
    assert!(checked >= 3_000, "only {checked} crash images");
}
