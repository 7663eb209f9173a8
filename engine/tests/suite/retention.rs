//! Retention: deleting a session (tombstones, F-02-18) and reclaiming its space at sealing
//! without dropping what a live fork still reads (F-06-24), with a crash at every point.

use crate::common;

use common::*;
use dshdb::compaction::collect_spill;
use dshdb::spill::SpillStore;
use dshdb::storage::commit::Durability;
use dshdb::storage::index::{decode_checkpoint, CHECKPOINT_FILE};
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;
use dshdb::store::{NewEvent, Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;

/// Bytes of each test event: with 4 KiB segments, a session spans several segments.
const EVENT_BYTES: usize = 200;

fn data_of(session: usize, seq: u64) -> String {
    event_data(session, seq, EVENT_BYTES)
}

/// Creates `id` with `count` events of `data_of(tag, seq)`.
fn fill(store: &Store, id: &str, tag: usize, count: u64) -> dshdb::Result<()> {
    let mut writer = store.create_session_with_id(id)?;
    for seq in 0..count {
        writer.append(chunk(&data_of(tag, seq)))?;
    }
    Ok(())
}

fn unknown(outcome: dshdb::Result<impl Sized>) -> bool {
    matches!(outcome, Err(Error::UnknownSession { .. }))
}

fn datas(store: &Store, id: &str) -> Vec<String> {
    store
        .read(id, 0, u64::MAX)
        .expect("read")
        .into_iter()
        .map(|event| event.data)
        .collect()
}

fn no_checkpoint() -> Options {
    Options {
        use_checkpoint: false,
        ..sim_options(Durability::Sync)
    }
}

#[test]
fn a_deleted_session_is_gone_after_reopen_and_its_id_can_be_reused() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    fill(&store, "a", 0, 30).expect("a");
    fill(&store, "b", 1, 10).expect("b");
    store.delete_session("a").expect("delete");
    let listed: Vec<String> = store.sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(listed, vec!["b".to_string()]);
    assert!(unknown(store.session("a")));
    assert!(unknown(store.read("a", 0, 10)));
    assert!(unknown(store.writer("a")));
    assert!(unknown(store.fork("a", 3, "a2")));
    assert!(unknown(store.delete_session("a")));
    store.close().expect("close");

    for options in [sim_options(Durability::Sync), no_checkpoint()] {
        let store = open_sim(&disk, options).expect("reopen");
        assert!(unknown(store.session("a")));
        assert_eq!(store.session("b").expect("b").events, 10);
        store.close().expect("close");
    }
    // Sealing writes the tombstone into a run and a checkpoint that lists the deletion (F-06-25).
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    store.maintain().expect("maintain");
    let mut reused = store.create_session_with_id("a").expect("reuse id");
    reused.append(chunk("{\"new\":1}")).expect("append");
    drop(reused);
    store.close().expect("close");
    let checkpoint = disk
        .open_read(CHECKPOINT_FILE)
        .and_then(|file| file.read_all())
        .expect("checkpoint");
    let decoded = decode_checkpoint(&checkpoint).expect("a valid checkpoint");
    assert!(
        decoded.catalog.sessions.values().any(|entry| entry.deleted),
        "the deleted session is listed"
    );
    for options in [sim_options(Durability::Sync), no_checkpoint()] {
        let use_checkpoint = options.use_checkpoint;
        let store = open_sim(&disk, options).expect("reopen");
        // The closing checkpoint lists the deleted session (F-06-25).
        assert_eq!(store.recovery_report().checkpoint_used, use_checkpoint);
        assert_eq!(datas(&store, "a"), vec!["{\"new\":1}".to_string()]);
        assert_eq!(datas(&store, "b").len(), 10);
        store.close().expect("close");
    }
}

#[test]
fn deleting_an_unknown_or_busy_session_errors_and_writes_nothing() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    fill(&store, "a", 0, 5).expect("a");
    let writer = store.writer("a").expect("writer");
    let operations = disk.operation_count();
    assert!(matches!(
        store.delete_session("a"),
        Err(Error::SessionBusy { .. })
    ));
    assert!(unknown(store.delete_session("nope")));
    assert_eq!(disk.operation_count(), operations);
    drop(writer);
    assert_eq!(store.session("a").expect("a").events, 5);
    store.close().expect("close");
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    assert_eq!(datas(&store, "a").len(), 5);
}

/// parent (40 events) ← child (fork at 19, +10 own) ← grandchild (fork of child at 24).
fn build_lineage(store: &Store) -> Vec<String> {
    fill(store, "parent", 0, 40).expect("parent");
    let mut child = store.fork("parent", 19, "child").expect("fork");
    for seq in 0..10 {
        child.append(chunk(&data_of(1, seq))).expect("child append");
    }
    drop(child);
    let grandchild = store.fork("child", 24, "grandchild").expect("fork 2");
    drop(grandchild);
    datas(store, "grandchild")
}

#[test]
fn sealing_drops_deleted_events_but_keeps_every_seed_a_live_fork_reads() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let seed = build_lineage(&store);
    fill(&store, "other", 3, 20).expect("other");
    store.delete_session("child").expect("delete child");
    store.delete_session("parent").expect("delete parent");
    assert_eq!(datas(&store, "grandchild"), seed);
    store.close().expect("close");

    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    let report = store.maintain().expect("maintain");
    // The parent keeps its 20 seed events, the child its first 25 (20 seed + 5 own): the
    // parent's seqs 20..40 and the child's own seqs 25..31 (the marker and 10 appends) go.
    assert_eq!(report.events_dropped, 20 + 6);
    assert!(report.bytes_reclaimed > 26 * EVENT_BYTES as u64);
    assert_eq!(datas(&store, "grandchild"), seed);
    assert_eq!(datas(&store, "other").len(), 20);
    store.close().expect("close");
    for options in [sim_options(Durability::Sync), no_checkpoint()] {
        let store = open_sim(&disk, options).expect("reopen");
        assert_eq!(datas(&store, "grandchild"), seed);
        assert!(unknown(store.session("child")));
        assert!(unknown(store.session("parent")));
        assert_eq!(store.sessions().len(), 2);
        store.close().expect("close");
    }
}

#[test]
fn stats_show_the_bytes_reclaimed_by_sealing() {
    let measure = |delete: bool| {
        let disk = SimStorage::new();
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        fill(&store, "big", 0, 400).expect("big");
        fill(&store, "small", 1, 20).expect("small");
        if delete {
            store.delete_session("big").expect("delete");
        }
        store.close().expect("close");
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
        let before = store.stats(None).expect("stats").bytes_on_disk;
        let report = store.maintain().expect("maintain");
        let after = store.stats(None).expect("stats").bytes_on_disk;
        (before, after, report)
    };
    let (kept_before, kept_after, kept) = measure(false);
    let (before, after, dropped) = measure(true);
    eprintln!(
        "400 x {EVENT_BYTES} B events deleted: store {before} B before maintain, {after} B \
         after (undeleted: {kept_before} -> {kept_after} B); dropped {} events, {} frame \
         bytes; runs {} B vs {} B",
        dropped.events_dropped, dropped.bytes_reclaimed, dropped.run_bytes, kept.run_bytes
    );
    assert_eq!(kept.events_dropped, 0);
    assert_eq!(dropped.events_dropped, 400);
    assert!(dropped.run_bytes < kept.run_bytes);
    assert!(after < kept_after);
}

/// Names of the run files in the store.
fn run_files(disk: &SimStorage) -> Vec<String> {
    let mut names = disk.list("runs").unwrap_or_default();
    names.sort();
    names
}

#[test]
fn events_already_sealed_into_runs_are_reclaimed_when_their_session_is_deleted() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let seed = build_lineage(&store);
    fill(&store, "other", 3, 20).expect("other");
    store.close().expect("close");
    // Everything sealed into runs before anything is deleted.
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    store.maintain().expect("seal");
    let before = store.stats(None).expect("stats");
    assert_eq!(before.events_in_segments, 0);
    let runs_before = run_files(&disk);
    store.delete_session("child").expect("delete child");
    store.delete_session("parent").expect("delete parent");
    let report = store.maintain().expect("reclaim");
    // As when sealing (F-06-24): the parent keeps its 20 seed events, the child its 25.
    assert_eq!(report.events_dropped, 20 + 6);
    assert!(report.runs_rewritten >= 1);
    assert!(report.bytes_reclaimed > 0);
    assert_eq!(datas(&store, "grandchild"), seed);
    assert_eq!(datas(&store, "other").len(), 20);
    let after = store.stats(None).expect("stats");
    assert!(
        after.bytes_on_disk < before.bytes_on_disk,
        "{} B after, {} B before",
        after.bytes_on_disk,
        before.bytes_on_disk
    );
    assert_eq!(
        run_files(&disk).len(),
        runs_before.len(),
        "old runs removed"
    );
    assert_ne!(run_files(&disk), runs_before);
    // Nothing left to reclaim: a second pass rewrites nothing.
    assert_eq!(store.maintain().expect("again").runs_rewritten, 0);
    store.close().expect("close");
    for options in [sim_options(Durability::Sync), no_checkpoint()] {
        let store = open_sim(&disk, options).expect("reopen");
        assert_eq!(datas(&store, "grandchild"), seed);
        assert_eq!(datas(&store, "other").len(), 20);
        assert!(unknown(store.session("child")));
        assert!(unknown(store.session("parent")));
        assert_eq!(store.maintain().expect("nothing to do").runs_rewritten, 0);
        store.close().expect("close");
    }
}

#[test]
fn spill_gc_collects_blobs_cited_only_by_deleted_sessions_but_keeps_a_forks_seed() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let spill = SpillStore::new(store.storage());
    let in_seed = spill
        .put(b"read by the fork through its seed")
        .expect("put");
    let after_seed = spill.put(b"cited after the fork point").expect("put");
    let doomed_only = spill
        .put(b"cited by the deleted session only")
        .expect("put");
    let mut parent = store.create_session_with_id("parent").expect("create");
    for blob in [&in_seed, &after_seed] {
        let data = format!("{{\"note\":\"{}\"}}", blob.locator());
        parent
            .append(NewEvent::new("plugin/note", &data))
            .expect("append");
    }
    drop(parent);
    drop(store.fork("parent", 0, "child").expect("fork"));
    let mut doomed = store.create_session_with_id("doomed").expect("create");
    let data = format!("{{\"note\":\"{}\"}}", doomed_only.locator());
    doomed
        .append(NewEvent::new("plugin/note", &data))
        .expect("append");
    drop(doomed);
    store.delete_session("parent").expect("delete parent");
    store.delete_session("doomed").expect("delete doomed");
    store.close().expect("close");
    // Another handle collects: blobs put by this one are protected while it lives.
    drop(spill);
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    let spill = SpillStore::new(store.storage());
    let mut report = collect_spill(&store, &spill).expect("gc");
    report.removed.sort();
    let mut expected = vec![after_seed, doomed_only];
    expected.sort();
    assert_eq!(report.removed, expected);
    assert!(spill.get(&in_seed).is_ok());
    assert!(matches!(spill.get(&doomed_only), Err(Error::Spill { .. })));
}

// ---- crash-point enumeration -----------------------------------------------------------

/// Sessions of the crash workload and the tag of their event data.
const PARENT: (&str, usize) = ("parent", 0);
const CHILD: (&str, usize) = ("child", 1);
const DOOMED: (&str, usize) = ("doomed", 2);
const OTHER: (&str, usize) = ("other", 3);
/// Events the parent gets; the child forks it after seq `FORK_AT`.
const PARENT_EVENTS: u64 = 24;
const FORK_AT: u64 = 11;
const CHILD_EVENTS: u64 = 4;

#[derive(Default)]
struct Ledger {
    /// Events acknowledged (synced) per session; a fork counts from its first own event.
    acknowledged: BTreeMap<&'static str, u64>,
    child_forked: bool,
    /// Deletes that returned Ok, and deletes that were attempted.
    deleted: Vec<&'static str>,
    attempted: Vec<&'static str>,
    /// Runs the last maintain rewrote (F-06-26).
    runs_rewritten: usize,
}

fn fill_logged(
    store: &Store,
    (id, tag): (&'static str, usize),
    count: u64,
    ledger: &mut Ledger,
) -> Option<()> {
    let mut writer = store.create_session_with_id(id).ok()?;
    ledger.acknowledged.insert(id, 0);
    for seq in 0..count {
        writer.append(chunk(&data_of(tag, seq))).ok()?;
        ledger.acknowledged.insert(id, seq + 1);
    }
    Some(())
}

fn delete_logged(store: &Store, id: &'static str, ledger: &mut Ledger) -> Option<()> {
    ledger.attempted.push(id);
    store.delete_session(id).ok()?;
    ledger.deleted.push(id);
    Some(())
}

/// Writes, forks, deletes, closes, reopens and seals (the reclaiming maintain). With
/// `seal_first`, everything is sealed into runs before the deletes, so that the reclaiming
/// maintain rewrites runs (F-06-26) rather than leaving events out of new ones.
fn workload_steps(disk: &SimStorage, ledger: &mut Ledger, seal_first: bool) -> Option<()> {
    let mut store = open_sim(disk, sim_options(Durability::Sync)).ok()?;
    fill_logged(&store, PARENT, PARENT_EVENTS, ledger)?;
    let mut child = store.fork(PARENT.0, FORK_AT, CHILD.0).ok()?;
    ledger.child_forked = true;
    for seq in 0..CHILD_EVENTS {
        child.append(chunk(&data_of(CHILD.1, seq))).ok()?;
        ledger.acknowledged.insert(CHILD.0, seq + 1);
    }
    drop(child);
    fill_logged(&store, DOOMED, 16, ledger)?;
    fill_logged(&store, OTHER, 8, ledger)?;
    if seal_first {
        store.close().ok()?;
        store = open_sim(disk, sim_options(Durability::Sync)).ok()?;
        store.maintain().ok()?;
    }
    delete_logged(&store, DOOMED.0, ledger)?;
    delete_logged(&store, PARENT.0, ledger)?;
    store.close().ok()?;
    let store = open_sim(disk, sim_options(Durability::Sync)).ok()?;
    ledger.runs_rewritten = store.maintain().ok()?.runs_rewritten;
    store.close().ok()
}

fn run_workload(disk: &SimStorage, seal_first: bool) -> Ledger {
    let mut ledger = Ledger::default();
    let _ = workload_steps(disk, &mut ledger, seal_first);
    ledger
}

/// The events the child must read: the parent's seed, the end-seed marker, its own.
fn check_child(store: &Store, ledger: &Ledger) -> Result<(), String> {
    if !ledger.child_forked {
        return Ok(());
    }
    let events = store
        .read(CHILD.0, 0, u64::MAX)
        .map_err(|error| format!("child lost: {error}"))?;
    let own = ledger.acknowledged.get(CHILD.0).copied().unwrap_or(0);
    let seed = FORK_AT + 1;
    if (events.len() as u64) < seed + 1 + own {
        return Err(format!("child has {} events", events.len()));
    }
    for (seq, event) in events.iter().enumerate() {
        let seq = seq as u64;
        let expected = if seq < seed {
            data_of(PARENT.1, seq)
        } else if seq == seed {
            "{}".to_string()
        } else {
            data_of(CHILD.1, seq - seed - 1)
        };
        if event.data != expected {
            return Err(format!("child seq {seq} differs"));
        }
    }
    Ok(())
}

fn check_state(store: &Store, ledger: &Ledger) -> Result<(), String> {
    for id in &ledger.deleted {
        if !unknown(store.session(id)) {
            return Err(format!("acknowledged delete of {id} undone"));
        }
    }
    for (id, tag) in [PARENT, DOOMED, OTHER] {
        let acknowledged = ledger.acknowledged.get(id).copied().unwrap_or(0);
        if ledger.attempted.contains(&id) {
            continue;
        }
        let Ok(summary) = store.session(id) else {
            if acknowledged > 0 {
                return Err(format!("{id} lost"));
            }
            continue;
        };
        if summary.events < acknowledged {
            return Err(format!("{id}: {} of {acknowledged} events", summary.events));
        }
        let events = store.read(id, 0, u64::MAX).map_err(|e| e.to_string())?;
        for (seq, event) in events.iter().enumerate() {
            if event.data != data_of(tag, seq as u64) {
                return Err(format!("{id} seq {seq} differs"));
            }
        }
    }
    check_child(store, ledger)
}

fn check_image(image: &CrashImage, ledger: &Ledger) -> Result<(), String> {
    let label = &image.label;
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, sim_options(Durability::Sync))
        .map_err(|error| format!("{label}: reopen failed: {error}"))?;
    check_state(&store, ledger).map_err(|error| format!("{label}: {error}"))?;
    // Finishing the interrupted sealing must keep everything the child reads.
    store
        .maintain()
        .map_err(|error| format!("{label}: maintain: {error}"))?;
    check_state(&store, ledger).map_err(|error| format!("{label}: after maintain: {error}"))?;
    store.close().map_err(|error| error.to_string())?;
    for options in [sim_options(Durability::Sync), no_checkpoint()] {
        let store = open_sim(&disk, options)
            .map_err(|error| format!("{label}: second reopen failed: {error}"))?;
        check_state(&store, ledger)
            .map_err(|error| format!("{label}: after second reopen: {error}"))?;
        store.close().map_err(|error| error.to_string())?;
    }
    Ok(())
}

fn enumerate_crash_points(seal_first: bool) {
    let reference = SimStorage::new();
    let full = run_workload(&reference, seal_first);
    assert_eq!(full.deleted, vec![DOOMED.0, PARENT.0]);
    assert_eq!(full.runs_rewritten > 0, seal_first);
    let operations = reference.operation_count();
    let mut images_checked = 0u64;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let ledger = run_workload(&disk, seal_first);
        let images = disk.take_crash_images();
        for image in &images {
            if let Err(violation) = check_image(image, &ledger) {
                panic!("cut at op {cut}: {violation}");
            }
            images_checked += 1;
        }
    }
    eprintln!("{operations} operations, {images_checked} crash images checked");
    assert!(images_checked > operations);
}

#[test]
fn every_crash_point_of_delete_and_reclaiming_maintain_keeps_acknowledged_state() {
    enumerate_crash_points(false);
}

#[test]
fn every_crash_point_of_rewriting_runs_after_a_delete_keeps_acknowledged_state() {
    enumerate_crash_points(true);
}
