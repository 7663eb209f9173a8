//! Sealing write-ahead segments into run files (format-spec/06-runs-and-index.md): reads
//! through runs, power cuts at every step of sealing (F-06-10), orphan runs (F-06-11), the
//! seq-index checkpoint (F-06-20..22) and damage to runs (F-06-6).

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::index::CHECKPOINT_FILE;
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::Manifest;
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::io::Write;

const SESSIONS: usize = 3;
const EVENTS_PER_SESSION: u64 = 40;

fn expected(session: usize, seq: u64) -> String {
    event_data(session, seq, 60 + (seq as usize * 37 + session * 11) % 300)
}

fn session_id(session: usize) -> String {
    format!("r{session}")
}

/// Sessions with interleaved appends over several small segments, plus a fork of r0.
fn populate(store: &Store) {
    let mut writers: Vec<_> = (0..SESSIONS)
        .map(|session| {
            store
                .create_session_with_id(&session_id(session))
                .expect("create")
        })
        .collect();
    for seq in 0..EVENTS_PER_SESSION {
        for (session, writer) in writers.iter_mut().enumerate() {
            let data = expected(session, seq);
            writer.append(chunk(&data)).expect("append");
        }
    }
    drop(writers);
    let mut fork = store.fork("r0", 9, "fork").expect("fork");
    fork.append(chunk(r#"{"forked":true}"#))
        .expect("fork append");
}

/// Every session reads back exactly what `populate` wrote (later appends may follow).
fn check_contents(store: &Store) -> Result<(), String> {
    for session in 0..SESSIONS {
        let id = session_id(session);
        let events = store
            .read(&id, 0, u64::MAX)
            .map_err(|error| format!("read {id}: {error}"))?;
        if (events.len() as u64) < EVENTS_PER_SESSION {
            return Err(format!("{id} has {} events", events.len()));
        }
        for (seq, event) in events.iter().enumerate() {
            let seq_matches = event.seq == seq as u64;
            if !seq_matches
                || (seq < EVENTS_PER_SESSION as usize
                    && event.data != expected(session, seq as u64))
            {
                return Err(format!("{id} seq {seq} differs"));
            }
        }
    }
    let fork = store
        .read("fork", 0, u64::MAX)
        .map_err(|error| format!("read fork: {error}"))?;
    let seed_matches = fork[..10]
        .iter()
        .enumerate()
        .all(|(seq, event)| event.data == expected(0, seq as u64));
    if fork.len() != 12 || !seed_matches || fork[11].data != r#"{"forked":true}"# {
        return Err("fork differs".to_string());
    }
    Ok(())
}

fn manifest_of(disk: &SimStorage) -> Manifest {
    Manifest::read(disk).expect("manifest").expect("present")
}

/// A closed store image holding the populated sessions, not yet sealed.
fn populated_image() -> CrashImage {
    closed_image(populate)
}

#[test]
fn maintain_moves_sealed_segments_into_runs_and_reads_are_unchanged() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let segments_before = manifest_of(&disk).segments.len();
    assert!(segments_before > 3, "the workload spans several segments");
    let report = store.maintain().expect("maintain");
    assert_eq!(report.segments_sealed, segments_before - 1);
    let manifest = manifest_of(&disk);
    assert_eq!(manifest.segments.len(), 1, "only the active segment stays");
    assert_eq!(manifest.runs.len(), segments_before - 1);
    assert_eq!(disk.list("wal").expect("wal").len(), 1);
    check_contents(&store).expect("contents after sealing");
    for id in ["r0", "fork"] {
        let events = store.read(id, 0, u64::MAX).expect("read");
        let expected: String = events
            .iter()
            .map(|event| event.to_json_line() + "\n")
            .collect();
        let mut lines = String::new();
        let count = store
            .read_json_lines(id, 0, u64::MAX, &mut lines)
            .expect("json lines");
        assert_eq!(count, events.len() as u64);
        assert_eq!(lines, expected, "{id}: JSON lines straight from the runs");
    }
    let stats = store.stats(None).expect("stats");
    assert_eq!(stats.events_in_segments, 0);
    assert_eq!(stats.events, SESSIONS as u64 * EVENTS_PER_SESSION + 2);
    assert!(stats.run_compression_ratio > 1.0);
    let session = store.stats(Some("r1")).expect("session stats");
    assert_eq!(session.events, EVENTS_PER_SESSION);
    assert!(session.runs >= 1);
    // Appends go on; a second maintain after more rolls seals those too.
    let mut writer = store.writer("r1").expect("writer");
    for seq in 0..30 {
        writer
            .append(chunk(&event_data(1, 1000 + seq, 200)))
            .expect("append");
    }
    drop(writer);
    assert!(store.maintain().expect("maintain again").segments_sealed > 0);
    store.close().expect("close");
    let reopened = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    check_contents(&reopened).expect("contents after reopen");
    assert!(reopened.recovery_report().checkpoint_used);
    assert_eq!(reopened.recovery_report().runs_replayed, 0);
    assert_eq!(reopened.recovery_report().segments_scanned, 0);
    assert_eq!(
        reopened.session("r1").expect("r1").events,
        EVENTS_PER_SESSION + 30
    );
    // The sparse index read from the checkpoint and the one rebuilt by replaying every run
    // describe the same events and bytes.
    let from_checkpoint = reopened.stats(None).expect("stats");
    reopened.close().expect("close");
    let options = Options {
        use_checkpoint: false,
        ..sim_options(Durability::Sync)
    };
    let replayed = open_sim(&disk, options).expect("reopen without the checkpoint");
    let rebuilt = replayed.stats(None).expect("stats");
    assert_eq!(rebuilt.events, from_checkpoint.events);
    assert_eq!(rebuilt.raw_bytes, from_checkpoint.raw_bytes);
    assert_eq!(rebuilt.events_in_runs, from_checkpoint.events_in_runs);
}

#[test]
fn a_read_only_open_reads_runs_without_writing() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let before = disk.durable_image();
    let options = Options {
        read_only: true,
        ..sim_options(Durability::Sync)
    };
    let reader = open_sim(&disk, options).expect("read-only open");
    check_contents(&reader).expect("contents");
    assert!(matches!(reader.maintain(), Err(Error::ReadOnly)));
    drop(reader);
    let after = disk.durable_image();
    for name in before.file_names() {
        assert_eq!(before.file(name), after.file(name), "{name} changed");
    }
}

/// Power cut at every storage operation of `maintain`: every image opens, holds every
/// event exactly once, and takes appends again (F-06-10).
#[test]
fn a_power_cut_at_every_step_of_sealing_loses_nothing() {
    let (operations, images_checked) =
        every_cut_of_maintain(&populated_image(), |label, recovered, store| {
            if let Err(violation) = check_contents(&store) {
                panic!("{label}: {violation}");
            }
            let manifest = manifest_of(recovered);
            let named = manifest.runs.len();
            let run_files = recovered.list("runs").expect("runs").len();
            assert_eq!(run_files, named, "{label}: orphan run left after open");
            let mut writer = store.writer("r2").expect("writer");
            writer
                .append(chunk("{\"after\":1}"))
                .expect("append after recovery");
            drop(writer);
            store.maintain().expect("maintain after recovery");
            check_contents(&store).unwrap_or_else(|violation| panic!("{label}: {violation}"));
            store.close().expect("close");
        });
    assert!(images_checked > operations, "{images_checked} images");
}

#[test]
fn an_orphan_run_is_removed_at_open() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let mut image = disk.durable_image();
    let (name, bytes) = {
        let name = image
            .file_names()
            .find(|name| name.starts_with("runs/"))
            .expect("a run")
            .to_string();
        (name.clone(), image.file(&name).expect("bytes").to_vec())
    };
    let orphan = SimStorage::from_image(&image);
    let file = orphan
        .open("runs/00000000000fffff.run", true)
        .expect("orphan");
    file.write_at(&bytes, 0).expect("write");
    file.sync_data().expect("sync");
    orphan.sync_dir("runs").expect("dir");
    let store = open_sim(&orphan, sim_options(Durability::Sync)).expect("open");
    assert_eq!(
        store.recovery_report().orphan_runs,
        vec!["00000000000fffff.run".to_string()]
    );
    check_contents(&store).expect("contents");
    image.remove_file(&name);
    let missing = SimStorage::from_image(&image);
    let outcome = open_sim(&missing, sim_options(Durability::Sync))
        .and_then(|store| store.read("r0", 0, u64::MAX).map(|_| ()));
    assert!(
        matches!(outcome, Err(Error::CorruptFile { .. })),
        "a missing run is loud: {outcome:?}"
    );
}

/// Any damage to the checkpoint makes the open ignore it and rebuild; it never blocks the
/// open (F-06-22).
#[test]
fn a_damaged_checkpoint_is_ignored_and_rebuilt() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let image = disk.durable_image();
    let length = image.file(CHECKPOINT_FILE).expect("checkpoint").len();
    let step = (length / 97).max(1);
    let mut flips = 0;
    for at in (0..length).step_by(step).chain([length - 1]) {
        let mut damaged = image.clone();
        damaged.file_mut(CHECKPOINT_FILE).expect("checkpoint")[at] ^= 0x08;
        let disk = SimStorage::from_image(&damaged);
        let store = open_sim(&disk, sim_options(Durability::Sync))
            .unwrap_or_else(|error| panic!("flip at {at}: open failed: {error}"));
        let report = store.recovery_report();
        assert!(!report.checkpoint_used, "flip at {at} went unnoticed");
        assert!(report.checkpoint_ignored.is_some());
        assert!(report.runs_replayed > 0);
        check_contents(&store).unwrap_or_else(|violation| panic!("flip at {at}: {violation}"));
        store.close().expect("close");
        let again = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
        assert!(
            again.recovery_report().checkpoint_used,
            "rewritten at close"
        );
        flips += 1;
    }
    assert!(flips > 50);
    // A truncated or foreign checkpoint is ignored the same way.
    for replacement in [Vec::new(), b"not a checkpoint".to_vec()] {
        let mut foreign = image.clone();
        *foreign.file_mut(CHECKPOINT_FILE).expect("checkpoint") = replacement;
        let disk = SimStorage::from_image(&foreign);
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        assert!(!store.recovery_report().checkpoint_used);
        check_contents(&store).expect("contents");
    }
}

/// A flipped byte inside a run's blocks is a loud typed error when read, never a silent
/// truncation (F-06-6).
#[test]
fn damage_inside_a_run_is_corruption() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let image = disk.durable_image();
    let name = image
        .file_names()
        .find(|name| name.starts_with("runs/"))
        .expect("a run")
        .to_string();
    // A byte of the last event block (just before the footer).
    let run_bytes = image.file(&name).expect("run");
    let trailer = &run_bytes[run_bytes.len() - 24..];
    let footer_offset = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes")) as usize;
    let target = footer_offset - 5;
    let mut damaged = image.clone();
    damaged.file_mut(&name).expect("run")[target] ^= 0x01;
    damaged.remove_file(CHECKPOINT_FILE);
    let disk = SimStorage::from_image(&damaged);
    let outcome = open_sim(&disk, sim_options(Durability::Sync)).map(|_| ());
    assert!(
        matches!(outcome, Err(ref error) if error.is_corruption()),
        "without a checkpoint the open replays the run and finds the damage: {outcome:?}"
    );
    let mut damaged = image.clone();
    damaged.file_mut(&name).expect("run")[target] ^= 0x01;
    let disk = SimStorage::from_image(&damaged);
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("checkpointed open");
    let reads: Vec<_> = (0..SESSIONS)
        .map(|session| store.read(&session_id(session), 0, u64::MAX))
        .collect();
    assert!(
        reads
            .iter()
            .any(|read| matches!(read, Err(error) if error.is_corruption())),
        "the damaged block is reported when read"
    );
}

#[test]
fn the_background_thread_starts_and_stops_with_the_store() {
    let disk = SimStorage::from_image(&populated_image());
    let options = Options {
        maintenance_interval: Some(std::time::Duration::from_millis(1)),
        ..sim_options(Durability::Sync)
    };
    // Reads race the thread's seals (the read gate keeps positions valid), and close races
    // a pass that is starting; repeat to give the races a chance.
    for round in 0..20 {
        let store = open_sim(&disk, options.clone()).expect("open");
        check_contents(&store).unwrap_or_else(|violation| panic!("round {round}: {violation}"));
        let mut writer = store.writer("r1").expect("writer");
        for seq in 0..10 {
            writer
                .append(chunk(&event_data(1, 5000 + seq, 300)))
                .expect("append");
        }
        drop(writer);
        check_contents(&store).unwrap_or_else(|violation| panic!("round {round}: {violation}"));
        store.close().expect("close joins the thread");
    }
    let reopened = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    check_contents(&reopened).expect("contents");
}

/// Appends and seals interleaved on one thread (segments roll every few batches, `maintain`
/// runs between batches), with a power cut at every storage operation of the whole script:
/// every acknowledged (`Sync`) event survives with its exact data, nothing unwritten
/// appears, and the store reopens and seals again (F-06-10 with a live log).
#[test]
fn a_power_cut_anywhere_in_appends_interleaved_with_sealing_loses_nothing_acknowledged() {
    const ROUNDS: u64 = 6;
    const BATCH: u64 = 4;
    let script = |disk: &SimStorage, acknowledged: &mut [u64; SESSIONS]| {
        let Ok(store) = open_sim(disk, sim_options(Durability::Sync)) else {
            return;
        };
        let mut writers = Vec::new();
        for session in 0..SESSIONS {
            match store.create_session_with_id(&session_id(session)) {
                Ok(writer) => writers.push(writer),
                Err(_) => return,
            }
        }
        for round in 0..ROUNDS {
            for (session, writer) in writers.iter_mut().enumerate() {
                let first = round * BATCH;
                let texts: Vec<String> = (first..first + BATCH)
                    .map(|seq| expected(session, seq))
                    .collect();
                let batch: Vec<_> = texts.iter().map(|text| chunk(text)).collect();
                if writer.append_batch(&batch).is_err() {
                    return;
                }
                acknowledged[session] = first + BATCH;
            }
            if store.maintain().is_err() {
                return;
            }
        }
        let _ = store.close();
    };
    let reference = SimStorage::new();
    let mut acknowledged = [0u64; SESSIONS];
    script(&reference, &mut acknowledged);
    assert_eq!(
        acknowledged,
        [ROUNDS * BATCH; SESSIONS],
        "the script runs whole"
    );
    assert!(
        !manifest_of(&reference).runs.is_empty(),
        "the script seals segments"
    );
    let operations = reference.operation_count();
    let mut images_checked = 0u64;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let mut acknowledged = [0u64; SESSIONS];
        script(&disk, &mut acknowledged);
        let images = disk.take_crash_images();
        for image in &images {
            let label = format!("cut {cut}, {}", image.label);
            let recovered = SimStorage::from_image(image);
            let store = open_sim(&recovered, sim_options(Durability::Sync))
                .unwrap_or_else(|error| panic!("{label}: reopen failed: {error}"));
            for (session, durable) in acknowledged.iter().enumerate() {
                let id = session_id(session);
                let events = match store.read(&id, 0, u64::MAX) {
                    Ok(events) => events,
                    Err(_) if *durable == 0 => continue,
                    Err(error) => panic!("{label}: {id} lost: {error}"),
                };
                assert!(
                    events.len() as u64 >= *durable,
                    "{label}: {id} has {} events, {durable} acknowledged",
                    events.len()
                );
                assert_eq!(
                    events.len() as u64 % BATCH,
                    0,
                    "{label}: {id} ends inside a batch"
                );
                for (seq, event) in events.iter().enumerate() {
                    assert_eq!(event.seq, seq as u64, "{label}: {id} seq gap");
                    assert_eq!(
                        event.data,
                        expected(session, seq as u64),
                        "{label}: {id} seq {seq}"
                    );
                }
            }
            store
                .maintain()
                .unwrap_or_else(|error| panic!("{label}: maintain: {error}"));
            store
                .close()
                .unwrap_or_else(|error| panic!("{label}: close: {error}"));
            images_checked += 1;
        }
    }
    assert!(images_checked > operations, "{images_checked} images");
    let _ = writeln!(
        std::io::stderr(),
        "interleaved sealing: {images_checked} crash images over {operations} operations"
    );
}

/// Segments that never held a record (each clean reopen starts one) are dropped from the
/// manifest without a run file (F-06-14); the manifest stays version 1.
#[test]
fn empty_segments_are_dropped_without_a_run() {
    let disk = SimStorage::new();
    for _ in 0..3 {
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        store.close().expect("close");
    }
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let report = store.maintain().expect("maintain");
    assert_eq!(report.segments_sealed, 3);
    assert_eq!(report.run_bytes, 0);
    let manifest = manifest_of(&disk);
    assert!(manifest.runs.is_empty());
    assert_eq!(manifest.segments.len(), 1);
    assert!(disk.list("runs").expect("runs").is_empty());
    assert_eq!(disk.list("wal").expect("wal").len(), 1);
    let mut writer = store.create_session_with_id("after").expect("create");
    writer.append(chunk("{}")).expect("append");
    drop(writer);
    store.close().expect("close");
    let reopened = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    assert_eq!(reopened.session("after").expect("session").events, 1);
}

#[test]
fn borrowed_visits_see_the_same_events_as_read_and_stop_at_an_error() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.maintain().expect("maintain");
    for id in ["r0", "fork"] {
        let owned = store.read(id, 3, 40).expect("read");
        let mut visited = Vec::new();
        store
            .visit_events(id, 3, 40, |event| {
                visited.push(event.to_event());
                Ok(())
            })
            .expect("visit");
        assert_eq!(visited, owned);
    }
    let mut calls = 0;
    let outcome = store.visit_events("r0", 0, u64::MAX, |_| {
        calls += 1;
        Err(Error::Closed)
    });
    assert!(matches!(outcome, Err(Error::Closed)));
    assert_eq!(calls, 1);
}
