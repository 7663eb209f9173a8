//! Maintenance beside other writer processes (format-spec F-08-12, F-08-16 – F-08-18) on the
//! simulated disk: each `Store` opened with `Options::shared` on one `SimStorage` is one
//! process. One process seals segments into runs and rewrites runs while others append,
//! read, lag behind and delete; a power cut at every write and sync of such a pass keeps
//! every acknowledged event.

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;

fn shared() -> Options {
    Options {
        shared: true,
        shared_maintenance: true,
        ..sim_options(Durability::Sync)
    }
}

fn data(session: usize, seq: u64) -> String {
    event_data(session, seq, 120 + (seq as usize * 37) % 300)
}

/// Appends `count` events to session `id` through `store`, from its current length.
fn append(store: &Store, session: usize, id: &str, count: u64) {
    let mut writer = match store.writer(id) {
        Ok(writer) => writer,
        Err(Error::UnknownSession { .. }) => store.create_session_with_id(id).expect("create"),
        Err(error) => panic!("writer {id}: {error}"),
    };
    let length = store.session(id).map(|summary| summary.events).unwrap_or(0);
    for seq in length..length + count {
        let text = data(session, seq);
        writer.append(chunk(&text)).expect("append");
    }
}

/// Every event of `id` as `append` wrote it, `length` of them.
fn assert_reads(store: &Store, session: usize, id: &str, length: u64, label: &str) {
    let events = store
        .read(id, 0, u64::MAX)
        .unwrap_or_else(|error| panic!("{label}: read {id}: {error}"));
    assert_eq!(events.len() as u64, length, "{label}: length of {id}");
    for (seq, event) in events.iter().enumerate() {
        assert_eq!(event.seq, seq as u64, "{label}: {id} seq");
        assert_eq!(
            event.data,
            data(session, seq as u64),
            "{label}: {id} seq {seq}"
        );
    }
}

fn wal_segments(disk: &SimStorage) -> usize {
    disk.list("wal").map(|names| names.len()).unwrap_or(0)
}

#[test]
fn one_process_seals_while_another_appends_and_both_read_everything() {
    let disk = SimStorage::new();
    let writer_process = open_sim(&disk, shared()).expect("writer");
    let maintainer = open_sim(&disk, shared()).expect("maintainer");
    append(&writer_process, 0, "w", 60);
    append(&maintainer, 1, "m", 20);
    let before = wal_segments(&disk);
    let report = maintainer.maintain().expect("maintain");
    assert!(report.segments_sealed >= 2, "{report:?}");
    assert!(
        wal_segments(&disk) < before,
        "sealed segments were not removed"
    );
    // The writer keeps appending into the tail, then follows the seal.
    append(&writer_process, 0, "w", 10);
    writer_process.refresh().expect("refresh");
    assert_reads(&writer_process, 0, "w", 70, "writer");
    assert_reads(&writer_process, 1, "m", 20, "writer");
    maintainer.refresh().expect("refresh");
    assert_reads(&maintainer, 0, "w", 70, "maintainer");
    // A second pass, now from the writer process, seals what the first left.
    append(&maintainer, 1, "m", 40);
    writer_process.refresh().expect("refresh");
    let second = writer_process.maintain().expect("second maintain");
    assert!(second.segments_sealed >= 1, "{second:?}");
    maintainer.refresh().expect("refresh");
    assert_reads(&maintainer, 1, "m", 60, "maintainer after the second pass");
    assert_reads(&maintainer, 0, "w", 70, "maintainer after the second pass");
    writer_process.close().expect("close");
    maintainer.close().expect("close");
    let reopened = open_sim(&disk, sim_writable()).expect("reopen");
    assert_reads(&reopened, 0, "w", 70, "reopened");
    assert_reads(&reopened, 1, "m", 60, "reopened");
    assert!(!reopened.recovery_report().checkpoint_distrusted);
}

#[test]
fn a_process_that_cannot_take_maintenance_skips_the_pass() {
    let disk = SimStorage::new();
    let first = open_sim(&disk, shared()).expect("first");
    let second = open_sim(&disk, shared()).expect("second");
    append(&first, 0, "a", 40);
    // Another process's checkpoint holds `MAINTENANCE` only while it writes; take it here
    // through a third process's maintenance lock to see the skip.
    let holder = dshdb::storage::multi::lock::ByteLock::try_take(
        &disk
            .open_shared(dshdb::storage::multi::SHARED_FILE)
            .expect("shared file"),
        dshdb::storage::multi::lock::MAINTENANCE_LOCK,
        dshdb::storage::multi::LockMode::Exclusive,
    )
    .expect("lock")
    .expect("free");
    let skipped = second.maintain().expect("maintain");
    assert_eq!(skipped, dshdb::store::MaintenanceReport::default());
    drop(holder);
    let done = second.maintain().expect("maintain");
    assert!(done.segments_sealed >= 1, "{done:?}");
    first.refresh().expect("refresh");
    assert_reads(&first, 0, "a", 40, "first");
}

#[test]
fn a_reader_keeps_reading_an_old_segment_sealed_under_it_then_follows_the_run() {
    let disk = SimStorage::new();
    let reader = open_sim(&disk, shared()).expect("reader");
    let maintainer = open_sim(&disk, shared()).expect("maintainer");
    append(&reader, 0, "r", 50);
    let mut seen = Vec::new();
    let mut sealed = None;
    // The visit holds the reader's positions in the old segments while the other process
    // seals and removes them.
    reader
        .visit_events("r", 0, u64::MAX, |event| {
            if sealed.is_none() {
                maintainer.refresh().expect("maintainer refresh");
                sealed = Some(maintainer.maintain().expect("maintain"));
            }
            seen.push((event.seq, event.data.to_string()));
            Ok(())
        })
        .expect("visit across the seal");
    let sealed = sealed.expect("maintained");
    assert!(sealed.segments_sealed >= 2, "{sealed:?}");
    assert_eq!(seen.len(), 50);
    for (seq, text) in &seen {
        assert_eq!(*text, data(0, *seq));
    }
    // Without a refresh the reader still knows only the old file names: a read opens them
    // by name, finds them gone, follows the new manifest and reads the runs.
    assert_reads(&reader, 0, "r", 50, "reader before its refresh");
    assert!(reader.refresh().expect("refresh"));
    assert_reads(&reader, 0, "r", 50, "reader after its refresh");
    let stats = reader.stats(Some("r")).expect("stats");
    assert!(
        stats.runs >= 2,
        "the reader does not read from runs: {stats:?}"
    );
    reader.close().expect("close");
    maintainer.close().expect("close");
}

#[test]
fn a_lagging_process_catches_up_across_segments_sealed_away() {
    let disk = SimStorage::new();
    let lagging = open_sim(&disk, shared()).expect("lagging");
    append(&lagging, 0, "own", 5);
    let busy = open_sim(&disk, shared()).expect("busy");
    // Several rolls and seals the lagging process never sees.
    for round in 0..4 {
        append(&busy, 1, "busy", 30);
        let report = busy.maintain().expect("maintain");
        assert!(report.segments_sealed >= 1, "round {round}: {report:?}");
    }
    assert!(lagging.refresh().expect("refresh"));
    assert_reads(&lagging, 1, "busy", 120, "lagging");
    assert_reads(&lagging, 0, "own", 5, "lagging");
    // It writes on after every event the others published.
    append(&lagging, 0, "own", 25);
    append(&lagging, 1, "busy", 3);
    busy.refresh().expect("refresh");
    assert_reads(&busy, 1, "busy", 123, "busy");
    assert_reads(&busy, 0, "own", 30, "busy");
    // And it can maintain in turn.
    let report = lagging.maintain().expect("lagging maintain");
    assert!(report.segments_sealed >= 1, "{report:?}");
    busy.refresh().expect("refresh");
    assert_reads(
        &busy,
        1,
        "busy",
        123,
        "busy after the lagging process sealed",
    );
    lagging.close().expect("close");
    busy.close().expect("close");
    let reopened = open_sim(&disk, sim_writable()).expect("reopen");
    assert_reads(&reopened, 1, "busy", 123, "reopened");
    assert_reads(&reopened, 0, "own", 30, "reopened");
}

#[test]
fn a_deletion_and_run_rewrite_in_one_process_while_another_holds_the_old_extents() {
    let disk = SimStorage::new();
    let holder = open_sim(&disk, shared()).expect("holder");
    let deleter = open_sim(&disk, shared()).expect("deleter");
    append(&holder, 0, "doomed", 40);
    append(&holder, 1, "kept", 40);
    let first = deleter.maintain().expect("seal");
    assert!(first.segments_sealed >= 2, "{first:?}");
    holder.refresh().expect("refresh");
    // The holder now reads both sessions from the runs; it starts a visit of the doomed
    // session, during which the other process deletes it and rewrites the runs.
    let mut seen = 0;
    let mut rewritten = None;
    holder
        .visit_events("doomed", 0, u64::MAX, |event| {
            if rewritten.is_none() {
                deleter.refresh().expect("deleter refresh");
                deleter.delete_session("doomed").expect("delete");
                append(&deleter, 1, "kept", 5);
                rewritten = Some(deleter.maintain().expect("rewrite"));
            }
            assert_eq!(event.data, data(0, event.seq));
            seen += 1;
            Ok(())
        })
        .expect("visit across the rewrite");
    assert_eq!(seen, 40);
    let rewritten = rewritten.expect("maintained");
    assert!(rewritten.runs_rewritten >= 1, "{rewritten:?}");
    assert!(rewritten.events_dropped >= 40, "{rewritten:?}");
    assert!(holder.refresh().expect("refresh"));
    assert!(matches!(
        holder.read("doomed", 0, 1),
        Err(Error::UnknownSession { .. })
    ));
    assert_reads(&holder, 1, "kept", 45, "holder");
    // The id is free again in every process.
    append(&holder, 2, "doomed", 3);
    deleter.refresh().expect("refresh");
    assert_reads(&deleter, 2, "doomed", 3, "deleter");
    assert_reads(&deleter, 1, "kept", 45, "deleter");
    holder.close().expect("close");
    deleter.close().expect("close");
    let reopened = open_sim(&disk, sim_writable()).expect("reopen");
    assert_reads(&reopened, 2, "doomed", 3, "reopened");
    assert_reads(&reopened, 1, "kept", 45, "reopened");
}

/// Per session: what was acknowledged durable, and every batch end attempted; and what
/// became of the session `gone`, which process 0 creates and later deletes.
#[derive(Default, Debug)]
struct Ledger {
    durable: BTreeMap<String, u64>,
    attempted: BTreeMap<String, Vec<u64>>,
    gone_created: bool,
    gone_delete_tried: bool,
    gone_deleted: bool,
}

/// Events of the session `gone`, and the steps at which it is created and deleted.
const GONE_EVENTS: u64 = 6;
const GONE_CREATED_AT_STEP: u64 = 0;
const GONE_DELETED_AT_STEP: u64 = 13;

/// Process 0's part with the session `gone`: created at one step, deleted at a later one
/// (so that maintenance drops its events from a run, or rewrites a run without them).
fn create_or_delete_gone(store: &Store, step: u64, ledger: &mut Ledger) {
    if step == GONE_CREATED_AT_STEP {
        let texts: Vec<String> = (0..GONE_EVENTS)
            .map(|seq| crash_data("gone", seq))
            .collect();
        let events: Vec<_> = texts.iter().map(|text| chunk(text)).collect();
        let created = store
            .create_session_with_id("gone")
            .and_then(|mut writer| writer.append_batch(&events));
        ledger.gone_created = created.is_ok();
    }
    if step == GONE_DELETED_AT_STEP {
        ledger.gone_delete_tried = true;
        ledger.gone_deleted = store.delete_session("gone").is_ok();
    }
}

/// The crash workload: process 0 appends and deletes, process 1 appends and maintains,
/// interleaved step by step on one thread (a deterministic operation order).
fn run_workload(disk: &SimStorage) -> Ledger {
    let mut ledger = Ledger::default();
    let (Ok(first), Ok(second)) = (open_sim(disk, shared()), open_sim(disk, shared())) else {
        return ledger;
    };
    let processes = [&first, &second];
    for step in 0..24u64 {
        create_or_delete_gone(&first, step, &mut ledger);
        for (index, store) in processes.iter().enumerate() {
            let id = format!("s{}", (step as usize + index) % 3);
            let _ = store.refresh();
            let writer = match store.writer(&id) {
                Ok(writer) => Some(writer),
                Err(Error::UnknownSession { .. }) => store.create_session_with_id(&id).ok(),
                Err(_) => None,
            };
            let Some(mut writer) = writer else {
                continue;
            };
            let length = store
                .session(&id)
                .map(|summary| summary.events)
                .unwrap_or(0);
            let count = 1 + step % 3;
            let texts: Vec<String> = (length..length + count)
                .map(|seq| crash_data(&id, seq))
                .collect();
            let events: Vec<_> = texts.iter().map(|text| chunk(text)).collect();
            ledger
                .attempted
                .entry(id.clone())
                .or_default()
                .push(length + count);
            if let Ok(receipt) = writer.append_batch(&events) {
                let durable = ledger.durable.entry(id.clone()).or_default();
                *durable = (*durable).max(receipt.end_seq);
            }
        }
        if step % 6 == 5 {
            let _ = second.maintain();
        }
    }
    let _ = first.close();
    let _ = second.close();
    ledger
}

/// The session `gone` after a cut: gone once its deletion was acknowledged, whole while its
/// creation was acknowledged and no deletion tried, else gone or whole.
fn check_gone(store: &Store, ledger: &Ledger) -> Result<(), String> {
    let events = match store.read("gone", 0, u64::MAX) {
        Ok(events) => Some(events),
        Err(Error::UnknownSession { .. }) => None,
        Err(error) => return Err(format!("read gone: {error}")),
    };
    match events {
        Some(_) if ledger.gone_deleted => Err("gone is back after its deletion".to_string()),
        None if ledger.gone_created && !ledger.gone_delete_tried => {
            Err("gone lost before any deletion".to_string())
        }
        // Created in two batches (the header, then the events): a cut between them.
        Some(events) if events.is_empty() && !ledger.gone_created => Ok(()),
        Some(events) => {
            let whole = events.len() as u64 == GONE_EVENTS
                && events
                    .iter()
                    .enumerate()
                    .all(|(seq, event)| event.data == crash_data("gone", seq as u64));
            match whole {
                true => Ok(()),
                false => Err(format!("gone holds {} events, not its own", events.len())),
            }
        }
        None => Ok(()),
    }
}

fn crash_data(id: &str, seq: u64) -> String {
    format!(
        "{{\"id\":\"{id}\",\"seq\":{seq},\"pad\":\"{}\"}}",
        "q".repeat(80 + (seq as usize * 53) % 300)
    )
}

fn check_image(image: &dshdb::storage::io::sim::CrashImage, ledger: &Ledger) -> Result<(), String> {
    let label = &image.label;
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, shared()).map_err(|error| format!("{label}: reopen: {error}"))?;
    check_gone(&store, ledger).map_err(|violation| format!("{label}: {violation}"))?;
    let contents = check_acknowledged(
        &store,
        label,
        &ledger.durable,
        &ledger.attempted,
        crash_data,
    )?;
    store
        .maintain()
        .map_err(|error| format!("{label}: maintain after recovery: {error}"))?;
    store
        .close()
        .map_err(|error| format!("{label}: close: {error}"))?;
    // A closed last process holds the tail until it is dropped (F-08-4).
    drop(store);
    // Reopened again, it reads identically.
    let again = open_sim(&disk, shared()).map_err(|error| format!("{label}: reopen: {error}"))?;
    for (id, events) in &contents {
        let read = again
            .read(id, 0, u64::MAX)
            .map_err(|error| format!("{label}: second read {id}: {error}"))?;
        if &read != events {
            return Err(format!(
                "{label}: {id} reads otherwise after a second reopen"
            ));
        }
    }
    again
        .close()
        .map_err(|error| format!("{label}: second close: {error}"))
}

#[test]
fn every_crash_point_of_maintenance_beside_an_appending_process_keeps_what_was_acknowledged() {
    let reference = SimStorage::new();
    let ledger = run_workload(&reference);
    let sealed = {
        let store = open_sim(&reference, sim_writable()).expect("reopen reference");
        store.stats(None).expect("stats").runs
    };
    assert!(sealed >= 2, "the workload sealed only {sealed} runs");
    assert!(ledger.gone_created && ledger.gone_deleted, "{ledger:?}");
    assert!(ledger.durable.values().sum::<u64>() > 0);
    let operations = reference.operation_count();
    let mut checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let ledger = run_workload(&disk);
        for image in &disk.take_crash_images() {
            if let Err(violation) = check_image(image, &ledger) {
                panic!("cut at op {cut}: {violation}");
            }
            checked += 1;
        }
    }
    eprintln!("maintenance-beside-writers crash images checked: {checked}");
    assert!(checked >= 500, "only {checked} crash images");
}

#[test]
fn appenders_readers_and_a_maintainer_on_threads_never_fail_and_agree() {
    let disk = SimStorage::new();
    let appending = open_sim(&disk, shared()).expect("appending process");
    let maintaining = open_sim(&disk, shared()).expect("maintaining process");
    const ROUNDS: u64 = 60;
    let sealed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        // Two appender threads in one process, each re-reading its whole session (old
        // events included, which the other process seals away meanwhile).
        for session in 0..2 {
            let store = &appending;
            scope.spawn(move || {
                let id = format!("t{session}");
                for round in 0..ROUNDS {
                    append(store, session, &id, 2);
                    assert_reads(store, session, &id, 2 * (round + 1), "appender");
                }
            });
        }
        let store = &maintaining;
        let sealed = &sealed;
        scope.spawn(move || {
            for _ in 0..ROUNDS / 2 {
                let report = store.maintain().expect("maintain beside the appenders");
                sealed.fetch_add(report.segments_sealed, std::sync::atomic::Ordering::Relaxed);
                store.refresh().expect("refresh");
                for session in 0..2 {
                    let id = format!("t{session}");
                    if let Ok(summary) = store.session(&id) {
                        assert_reads(store, session, &id, summary.events, "maintainer");
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
    });
    maintaining.maintain().expect("last pass");
    assert!(
        sealed.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "nothing was sealed beside the appenders"
    );
    appending.refresh().expect("refresh");
    for session in 0..2 {
        assert_reads(
            &appending,
            session,
            &format!("t{session}"),
            2 * ROUNDS,
            "appender at the end",
        );
    }
    appending.close().expect("close");
    drop(appending);
    maintaining.close().expect("close");
}
