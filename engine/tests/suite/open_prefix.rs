//! Checkpoints written while the log grows (format-spec F-06-27..29): a checkpoint that
//! covers a prefix of the unsealed segment, what a reopen checks before it trusts one, and
//! the tail it replays after it.
//!
//! - crash-point enumeration on the simulated disk over a workload that checkpoints twice
//!   between appends: every image a power cut leaves at every write and sync (torn last
//!   writes included) and the process-kill image reopen with every acknowledged event and
//!   nothing that was not written whole;
//! - a damaged, stale or forged checkpoint is detected and not trusted;
//! - the tail after the checkpoint (new sessions, types, a deletion, a roll) is replayed
//!   and reads the same as a full scan.

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::index::{
    decode_checkpoint, OpenPrefix, CHECKPOINT_FILE, OPEN_PREFIX_CHECKPOINT_VERSION,
};
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;

use dshdb::store::{NewEvent, Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;

/// Segments large enough that a checkpoint's open prefix holds several batches, small
/// enough that the workload rolls once.
const SEGMENT_BYTES: u64 = 16 * 1024;
/// Sessions of the crash workload.
const SESSIONS: usize = 2;
/// Append steps before, between and after the two checkpoints.
const STEPS_PER_PHASE: usize = 6;

fn options(durability: Durability) -> Options {
    Options {
        durability,
        segment_bytes: SEGMENT_BYTES,
        // The test decides when a checkpoint is written: no background thread.
        checkpoint_every_bytes: None,
        ..Options::default()
    }
}

fn session_id(session: usize) -> String {
    format!("p{session}")
}

fn text(session: usize, seq: u64) -> String {
    let mut state = (session as u64) << 32 ^ seq;
    event_data(session, seq, 60 + (next_random(&mut state) % 500) as usize)
}

/// What the workload appended and what the store acknowledged, per session.
#[derive(Default, Debug, Clone)]
struct Ledger {
    /// Batch end seqs attempted, in order.
    batch_ends: BTreeMap<usize, Vec<u64>>,
    /// Length acknowledged durable.
    durable: BTreeMap<usize, u64>,
    /// Length acknowledged written (survives a process kill).
    written: BTreeMap<usize, u64>,
    /// Checkpoints the workload saw written.
    checkpoints: usize,
}

/// Appends `STEPS_PER_PHASE` batches, checkpoints, twice, then appends once more; the
/// middle phase is `Buffered` (written, then flushed), the others `Sync`. Stops at the
/// first error (the power cut).
fn run_workload(disk: &SimStorage) -> Ledger {
    let mut ledger = Ledger::default();
    let Ok(store) = open_sim(disk, options(Durability::Sync)) else {
        return ledger;
    };
    let _ = workload_steps(&store, &mut ledger);
    ledger
}

fn workload_steps(store: &Store, ledger: &mut Ledger) -> dshdb::Result<()> {
    let mut writers = Vec::new();
    for session in 0..SESSIONS {
        // Recorded before: a session created by an unacknowledged batch may survive.
        ledger.batch_ends.entry(session).or_default().push(0);
        writers.push((store.create_session_with_id(&session_id(session))?, 0u64));
        ledger.durable.insert(session, 0);
        ledger.written.insert(session, 0);
    }
    let mut random = 7u64;
    for phase in 0..3 {
        let durability = if phase == 1 {
            Durability::Buffered
        } else {
            Durability::Sync
        };
        for _ in 0..STEPS_PER_PHASE {
            let session = (next_random(&mut random) % SESSIONS as u64) as usize;
            let (writer, length) = &mut writers[session];
            let count = 1 + next_random(&mut random) % 3;
            let texts: Vec<String> = (0..count).map(|i| text(session, *length + i)).collect();
            let events: Vec<NewEvent<'_>> = texts.iter().map(|data| chunk(data)).collect();
            ledger
                .batch_ends
                .entry(session)
                .or_default()
                .push(*length + count);
            writer.set_durability(durability);
            let receipt = writer.append_batch(&events)?;
            *length = receipt.end_seq;
            ledger.written.insert(session, receipt.end_seq);
            if receipt.durable {
                ledger.durable.insert(session, receipt.end_seq);
            }
        }
        if phase == 1 {
            store.flush()?;
            for (session, (_, length)) in writers.iter().enumerate() {
                ledger.durable.insert(session, *length);
            }
        }
        if phase < 2 && store.checkpoint()?.is_some() {
            ledger.checkpoints += 1;
        }
    }
    Ok(())
}

/// Checks one image: it opens writable with the checkpoint; every acknowledged event is
/// there and equal to what was appended; each session ends on a batch boundary; the store
/// takes an append and reopens with it. Returns whether the open used an open prefix.
fn check_image(image: &CrashImage, ledger: &Ledger) -> Result<bool, String> {
    let label = &image.label;
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, options(Durability::Sync))
        .map_err(|error| format!("{label}: reopen failed: {error}"))?;
    let used_prefix = store.recovery_report().checkpoint_open_prefix.is_some();
    let process_kill = label.starts_with("process killed");
    for session in 0..SESSIONS {
        let id = session_id(session);
        let durable = ledger.durable.get(&session).copied().unwrap_or(0);
        let written = ledger.written.get(&session).copied().unwrap_or(0);
        let must_have = if process_kill { written } else { durable };
        let length = match store.session(&id) {
            Ok(summary) => summary.events,
            Err(_) if must_have == 0 => continue,
            Err(error) => return Err(format!("{label}: {id} lost: {error}")),
        };
        if length < must_have {
            return Err(format!(
                "{label}: {id} has {length}, {must_have} acknowledged"
            ));
        }
        let ends = ledger.batch_ends.get(&session).cloned().unwrap_or_default();
        if !ends.contains(&length) {
            return Err(format!("{label}: {id} ends at {length}, inside a batch"));
        }
        let events = store
            .read(&id, 0, u64::MAX)
            .map_err(|error| format!("{label}: read {id}: {error}"))?;
        for (seq, event) in events.iter().enumerate() {
            if event.seq != seq as u64 || event.data != text(session, seq as u64) {
                return Err(format!("{label}: {id} seq {seq} is not what was appended"));
            }
        }
    }
    let mut writer = store
        .writer(&session_id(0))
        .or_else(|_| store.create_session_with_id(&session_id(0)))
        .map_err(|error| format!("{label}: writer after reopen: {error}"))?;
    let receipt = writer
        .append(chunk("{\"after\":true}"))
        .map_err(|error| format!("{label}: append after reopen: {error}"))?;
    drop(writer);
    store
        .close()
        .map_err(|error| format!("{label}: close: {error}"))?;
    let reopened = open_sim(&disk, options(Durability::Sync))
        .map_err(|error| format!("{label}: second reopen: {error}"))?;
    let last = reopened
        .get(&session_id(0), receipt.first_seq)
        .map_err(|error| format!("{label}: read after second reopen: {error}"))?;
    if last.data != "{\"after\":true}" {
        return Err(format!("{label}: the append after recovery was lost"));
    }
    Ok(used_prefix)
}

#[test]
fn every_crash_point_while_checkpointing_keeps_acknowledged_events_and_invents_nothing() {
    let reference = SimStorage::new();
    let reference_ledger = run_workload(&reference);
    assert_eq!(reference_ledger.checkpoints, 2, "both checkpoints written");
    let operations = reference.operation_count();
    let (mut images_checked, mut opened_from_prefix) = (0u64, 0u64);
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let ledger = run_workload(&disk);
        for image in disk.take_crash_images() {
            match check_image(&image, &ledger) {
                Ok(used_prefix) => opened_from_prefix += u64::from(used_prefix),
                Err(violation) => panic!("cut at op {cut}: {violation}"),
            }
            images_checked += 1;
        }
    }
    assert!(images_checked > operations, "{images_checked} images");
    // The images after a checkpoint became durable reopen from it.
    assert!(
        opened_from_prefix * 4 > images_checked,
        "only {opened_from_prefix} of {images_checked} images used an open prefix"
    );
}

/// A store killed (no close) after a checkpoint and more appends: the process-kill image.
/// Returns the disk, the checkpoint's end and the sessions' contents.
fn killed_after_checkpoint() -> (SimStorage, (u64, u64), BTreeMap<String, Vec<String>>) {
    let disk = SimStorage::new();
    let store = open_sim(&disk, options(Durability::Sync)).expect("open");
    let mut expected = BTreeMap::new();
    let mut writer = store.create_session_with_id("a").expect("create");
    let mut texts = Vec::new();
    for seq in 0..8 {
        texts.push(text(0, seq));
        writer.append(chunk(&texts[seq as usize])).expect("append");
    }
    let end = store.checkpoint().expect("checkpoint").expect("written");
    // The tail: more events of "a", a new session with a new type, a deleted session.
    for seq in 8..12 {
        texts.push(text(0, seq));
        writer.append(chunk(&texts[seq as usize])).expect("append");
    }
    expected.insert("a".to_string(), texts);
    let mut other = store.create_session_with_id("b").expect("create b");
    other
        .append(NewEvent::new("tool/result", r#"{"ok":true}"#))
        .expect("append b");
    expected.insert("b".to_string(), vec![r#"{"ok":true}"#.to_string()]);
    drop(other);
    let doomed = store.create_session_with_id("c").expect("create c");
    drop(doomed);
    store.delete_session("c").expect("delete c");
    drop(writer);
    let image = disk.volatile_image();
    drop(store);
    (SimStorage::from_image(&image), end, expected)
}

fn contents(store: &Store) -> BTreeMap<String, Vec<String>> {
    store
        .sessions()
        .into_iter()
        .map(|summary| {
            let events = store.read(&summary.id, 0, u64::MAX).expect("read");
            let texts = events.into_iter().map(|event| event.data).collect();
            (summary.id, texts)
        })
        .collect()
}

#[test]
fn the_tail_past_the_checkpoint_is_replayed_and_reads_like_a_full_scan() {
    let (disk, end, expected) = killed_after_checkpoint();
    let checkpoint = disk.open_read(CHECKPOINT_FILE).expect("checkpoint");
    let bytes = checkpoint.read_all().expect("read");
    assert_eq!(bytes[8..12], OPEN_PREFIX_CHECKPOINT_VERSION.to_le_bytes());
    let store = open_sim(&disk, sim_read_only(true)).expect("open from the checkpoint");
    let report = store.recovery_report();
    assert!(report.checkpoint_used, "{report:?}");
    assert_eq!(report.checkpoint_open_prefix, Some(end));
    assert_eq!(contents(&store), expected);
    let full = open_sim(&disk, sim_read_only(false)).expect("open without it");
    assert!(!full.recovery_report().checkpoint_used);
    assert_eq!(contents(&full), expected);
    // A writable open continues after the tail and a clean close leaves version 3.
    let writable = open_sim(&disk, options(Durability::Sync)).expect("writable");
    assert_eq!(writable.recovery_report().checkpoint_open_prefix, Some(end));
    let mut writer = writable.writer("a").expect("writer");
    let receipt = writer.append(chunk("{\"next\":1}")).expect("append");
    assert_eq!(receipt.first_seq, 12);
    drop(writer);
    writable.close().expect("close");
    let closed = disk.open_read(CHECKPOINT_FILE).expect("checkpoint");
    let closed = closed.read_all().expect("read");
    assert_eq!(closed[8..12], 3u32.to_le_bytes());
}

/// The checkpoint on `disk`, re-encoded (with a valid checksum) with its open prefix
/// changed by `forge`.
fn forge_checkpoint(disk: &SimStorage, forge: impl FnOnce(&mut OpenPrefix)) {
    let file = disk.open_read(CHECKPOINT_FILE).expect("checkpoint");
    let checkpoint = decode_checkpoint(&file.read_all().expect("read")).expect("decode");
    let mut prefix = checkpoint.open.expect("an open prefix");
    forge(&mut prefix);
    let bytes = reencode_checkpoint(&checkpoint, Some(prefix));
    disk.remove(CHECKPOINT_FILE).expect("remove");
    let file = disk.open(CHECKPOINT_FILE, true).expect("create");
    file.write_at(&bytes, 0).expect("write");
    file.sync_data().expect("sync");
}

#[test]
fn a_damaged_checkpoint_is_ignored_and_everything_is_rebuilt() {
    let (disk, _, expected) = killed_after_checkpoint();
    let file = disk.open_read(CHECKPOINT_FILE).expect("checkpoint");
    let mut bytes = file.read_all().expect("read");
    // A flip inside the open prefix's fields (after the segment list): the checksum fails.
    let index = bytes.len() / 2;
    bytes[index] ^= 0x10;
    disk.remove(CHECKPOINT_FILE).expect("remove");
    let damaged = disk.open(CHECKPOINT_FILE, true).expect("create");
    damaged.write_at(&bytes, 0).expect("write");
    let store = open_sim(&disk, options(Durability::Sync)).expect("open");
    let report = store.recovery_report();
    assert!(!report.checkpoint_used, "{report:?}");
    assert!(report.checkpoint_ignored.is_some(), "{report:?}");
    assert_eq!(contents(&store), expected);
}

#[test]
fn an_open_prefix_whose_commit_frame_differs_is_not_trusted() {
    let (disk, _, expected) = killed_after_checkpoint();
    forge_checkpoint(&disk, |prefix| prefix.commit_checksum ^= 1);
    let read_only = open_sim(&disk, sim_read_only(true)).expect("read-only open");
    let report = read_only.recovery_report();
    assert!(!report.checkpoint_used, "{report:?}");
    let reason = report.checkpoint_ignored.clone().unwrap_or_default();
    assert!(reason.contains("not the one recorded"), "{reason}");
    assert_eq!(contents(&read_only), expected);
    drop(read_only);
    // A writable open finds the batches past the recorded end: the checkpoint is only
    // stale, and removed before anything is written.
    let store = open_sim(&disk, options(Durability::Sync)).expect("writable open");
    assert!(store.recovery_report().checkpoint_distrusted);
    assert_eq!(contents(&store), expected);
    assert!(!disk.exists(CHECKPOINT_FILE).expect("exists"));
}

#[test]
fn an_open_prefix_past_the_surviving_log_refuses_the_writable_open() {
    // The log as it was durable before the checkpoint's batches, with a checkpoint that
    // says they were durable: acknowledged batches were lost.
    let disk = SimStorage::new();
    let store = open_sim(&disk, options(Durability::Buffered)).expect("open");
    let mut writer = store.create_session_with_id("a").expect("create");
    writer.append(chunk(&text(0, 0))).expect("append");
    store.flush().expect("flush");
    let before = disk.durable_image();
    for seq in 1..6 {
        writer.append(chunk(&text(0, seq))).expect("append");
    }
    store.checkpoint().expect("checkpoint").expect("written");
    let checkpoint = disk.open_read(CHECKPOINT_FILE).expect("checkpoint");
    let checkpoint = checkpoint.read_all().expect("read");
    drop(writer);
    drop(store);
    let lost = SimStorage::from_image(&before);
    lost.create_dir("index").expect("index");
    let file = lost.open(CHECKPOINT_FILE, true).expect("create");
    file.write_at(&checkpoint, 0).expect("write");
    file.sync_data().expect("sync");
    let refused = open_sim(&lost, options(Durability::Sync));
    assert!(
        matches!(refused, Err(Error::Corrupt { .. })),
        "{:?}",
        refused.as_ref().map(|_| ())
    );
    // A read-only open still reads what survived.
    let read_only = open_sim(&lost, sim_read_only(true)).expect("read-only open");
    assert!(!read_only.recovery_report().checkpoint_used);
    assert_eq!(read_only.session("a").expect("a").events, 1);
}

#[test]
fn a_checkpoint_of_another_segment_or_a_later_manifest_is_ignored() {
    let (disk, _, expected) = killed_after_checkpoint();
    forge_checkpoint(&disk, |prefix| prefix.salt ^= 1);
    let store = open_sim(&disk, sim_read_only(true)).expect("open");
    let report = store.recovery_report();
    assert!(!report.checkpoint_used, "{report:?}");
    assert_eq!(contents(&store), expected);
}
