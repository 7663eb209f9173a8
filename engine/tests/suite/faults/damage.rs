//! Damage at rest, then a writable open (format-spec F-05-12): a lost or torn seal of the
//! last segment the checkpoint covers is repaired as after a crash; damage below the durable
//! point refuses the writable open and changes nothing; a writer whose read finds damage
//! refuses further writes; and no sequence of damage at the tail, opens and appends turns a
//! store that reads into one that does not.

use crate::common;

use common::*;
use dshdb::storage::index::CHECKPOINT_FILE;
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::manifest::{Manifest, MANIFEST_FILE};
use dshdb::storage::run::run_path;
use dshdb::storage::segment::{segment_path, SEAL_FRAME_BYTES};
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;

/// Events each session of the base store holds.
const EVENTS_PER_SESSION: u64 = 3;
/// Bytes of each event's data.
const EVENT_BYTES: usize = 80;
/// Damage sequences the enumeration tries, and the most steps in one.
const DAMAGE_CASES: u64 = 300;
const MAX_DAMAGE_STEPS: u64 = 3;
/// How far from the end of the last segment damage lands, in bytes: the seal and the end
/// of the commit before it.
const TAIL_WINDOW_BYTES: u64 = SEAL_FRAME_BYTES + 16;

/// Every file's bytes: what a test compares to show that nothing changed.
type Files = BTreeMap<String, Vec<u8>>;
/// Every session's event texts.
type Contents = BTreeMap<String, Vec<String>>;

fn data(session: &str, seq: u64) -> String {
    event_data(usize::from(session.as_bytes()[0]), seq, EVENT_BYTES)
}

fn append(store: &Store, session: &str, count: u64) -> dshdb::Result<()> {
    let mut writer = match store.writer(session) {
        Ok(writer) => writer,
        Err(Error::UnknownSession { .. }) => store.create_session_with_id(session)?,
        Err(error) => return Err(error),
    };
    let start = store.session(session)?.events;
    for seq in start..start + count {
        writer.append(chunk(&data(session, seq)))?;
    }
    Ok(())
}

/// A closed store: session `b` in segment 1, session `a` in segment 2 (the last), both
/// sealed and covered by the checkpoint the second close wrote.
fn base() -> CrashImage {
    let disk = SimStorage::new();
    for session in ["b", "a"] {
        let store = open_sim(&disk, sim_writable()).expect("open");
        append(&store, session, EVENTS_PER_SESSION).expect("append");
        store.close().expect("close");
    }
    disk.durable_image()
}

fn manifest(image: &CrashImage) -> Manifest {
    Manifest::decode(image.file(MANIFEST_FILE).expect("a manifest")).expect("manifest")
}

fn last_segment_path(image: &CrashImage) -> String {
    segment_path(manifest(image).segments.last().expect("a segment").id)
}

fn files(disk: &SimStorage) -> Files {
    let image = disk.volatile_image();
    image
        .file_names()
        .map(|name| (name.to_string(), image.file(name).unwrap_or(&[]).to_vec()))
        .collect()
}

/// What every session holds, read through a read-only open with or without the checkpoint.
fn contents(image: &CrashImage, use_checkpoint: bool) -> Result<Contents, String> {
    let disk = SimStorage::from_image(image);
    let store =
        open_sim(&disk, sim_read_only(use_checkpoint)).map_err(|error| error.to_string())?;
    let mut contents = Contents::new();
    for session in store.sessions() {
        let events = store
            .read(&session.id, 0, u64::MAX)
            .map_err(|error| format!("reading {}: {error}", session.id))?;
        contents.insert(
            session.id,
            events.into_iter().map(|event| event.data).collect(),
        );
    }
    Ok(contents)
}

/// What the store holds if it reads whole both with its checkpoint and without (as after
/// `rm index/checkpoint`), and both agree.
fn reads_whole(image: &CrashImage) -> Result<Contents, String> {
    let with = contents(image, true).map_err(|error| format!("with the checkpoint: {error}"))?;
    let without =
        contents(image, false).map_err(|error| format!("without the checkpoint: {error}"))?;
    if with != without {
        return Err(format!("the checkpoint says {with:?}, the log {without:?}"));
    }
    Ok(with)
}

fn expected_contents(extra_a: u64) -> Contents {
    let texts = |session: &str, count: u64| (0..count).map(|seq| data(session, seq)).collect();
    Contents::from([
        ("a".to_string(), texts("a", EVENTS_PER_SESSION + extra_a)),
        ("b".to_string(), texts("b", EVENTS_PER_SESSION)),
    ])
}

/// Opens writable, appends one event to `a` and closes; returns the image after.
fn open_append_close(image: &CrashImage) -> dshdb::Result<CrashImage> {
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, sim_writable())?;
    append(&store, "a", 1)?;
    store.close()?;
    Ok(disk.durable_image())
}

/// The torn seal is repaired at the writable open: the append goes on, everything reads
/// with and without the checkpoint, a second writable open is clean.
fn assert_repaired(damaged: &CrashImage, label: &str) {
    // The open distrusts the checkpoint and removes it before it repairs the segment.
    let disk = SimStorage::from_image(damaged);
    let store = open_sim(&disk, sim_writable()).unwrap_or_else(|error| panic!("{label}: {error}"));
    assert!(store.recovery_report().checkpoint_distrusted, "{label}");
    assert_eq!(disk.durable_image().file(CHECKPOINT_FILE), None, "{label}");
    drop(store);
    let after = open_append_close(damaged).unwrap_or_else(|error| panic!("{label}: {error}"));
    assert_eq!(
        reads_whole(&after).unwrap_or_else(|error| panic!("{label}: {error}")),
        expected_contents(1),
        "{label}"
    );
    let mut without_checkpoint = after.clone();
    without_checkpoint.remove_file(CHECKPOINT_FILE);
    assert_eq!(
        contents(&without_checkpoint, true),
        Ok(expected_contents(1)),
        "{label}: index/checkpoint removed"
    );
    let again = open_append_close(&after).unwrap_or_else(|error| panic!("{label}: {error}"));
    assert_eq!(reads_whole(&again), Ok(expected_contents(2)), "{label}");
}

#[test]
fn a_seal_that_never_reached_the_disk_is_repaired_by_the_next_writable_open() {
    let mut image = base();
    let path = last_segment_path(&image);
    let segment = image.file_mut(&path).expect("last segment");
    segment.truncate(segment.len() - SEAL_FRAME_BYTES as usize);
    // Before the append the store reads whole: the seal held no event.
    assert_eq!(reads_whole(&image), Ok(expected_contents(0)));
    assert_repaired(&image, "seal dropped");
}

#[test]
fn a_writable_open_without_the_checkpoint_that_continues_a_covered_segment_removes_it() {
    let mut image = base();
    let path = last_segment_path(&image);
    let segment = image.file_mut(&path).expect("last segment");
    segment.truncate(segment.len() - SEAL_FRAME_BYTES as usize);
    let disk = SimStorage::from_image(&image);
    let options = Options {
        use_checkpoint: false,
        ..sim_writable()
    };
    let store = open_sim(&disk, options).expect("open");
    append(&store, "a", 1).expect("append");
    // A power cut before the close: the checkpoint that called the segment sealed is gone.
    let cut = disk.durable_image();
    drop(store);
    assert_eq!(cut.file(CHECKPOINT_FILE), None);
    assert_eq!(reads_whole(&cut), Ok(expected_contents(1)));
    let after = open_append_close(&cut).expect("a later writable open");
    assert_eq!(reads_whole(&after), Ok(expected_contents(2)));
}

#[test]
fn every_torn_byte_of_the_seal_is_repaired_by_the_next_writable_open() {
    let image = base();
    let path = last_segment_path(&image);
    let length = image.file(&path).expect("last segment").len();
    for at in length - SEAL_FRAME_BYTES as usize..length {
        for flip in [0x01u8, 0x80] {
            let mut damaged = image.clone();
            damaged.file_mut(&path).expect("last segment")[at] ^= flip;
            assert_repaired(&damaged, &format!("seal byte {at} ^ {flip:#x}"));
        }
    }
}

/// Opens `image` writable and asserts the open is refused with what `expected` accepts,
/// changing no byte; returns the error.
fn assert_refused(image: &CrashImage, expected: fn(&Error) -> bool, label: &str) {
    let disk = SimStorage::from_image(image);
    let before = files(&disk);
    match open_sim(&disk, sim_writable()) {
        Ok(_) => panic!("{label}: the writable open built on the damage"),
        Err(error) => assert!(expected(&error), "{label}: {error:?}"),
    }
    assert_eq!(
        files(&disk),
        before,
        "{label}: the refused open changed bytes"
    );
}

#[test]
fn a_flipped_record_byte_in_the_last_sealed_segment_refuses_writable_opens_only() {
    let image = base();
    let path = last_segment_path(&image);
    let segment = image.file(&path).expect("last segment");
    let marker = data("a", 1);
    let at = segment
        .windows(marker.len())
        .position(|window| window == marker.as_bytes())
        .expect("event 1 of a in the last segment");
    let mut damaged = image.clone();
    damaged.file_mut(&path).expect("last segment")[at + 10] ^= 0x04;
    assert_refused(
        &damaged,
        |error| matches!(error, Error::Corrupt { .. }),
        "flipped event byte",
    );
    // A read-only open still reads the session the damage does not touch.
    let disk = SimStorage::from_image(&damaged);
    let store = open_sim(&disk, sim_read_only(true)).expect("read-only open");
    let b = store.read("b", 0, u64::MAX).expect("b is undamaged");
    assert_eq!(b.len() as u64, EVENTS_PER_SESSION);
    assert!(store
        .read("a", 0, u64::MAX)
        .is_err_and(|error| error.is_corruption()));
}

#[test]
fn a_cut_below_the_seal_loses_acknowledged_batches_and_refuses_the_writable_open() {
    let mut image = base();
    let path = last_segment_path(&image);
    let segment = image.file_mut(&path).expect("last segment");
    segment.truncate(segment.len() - SEAL_FRAME_BYTES as usize - 5);
    assert_refused(
        &image,
        |error| matches!(error, Error::Corrupt { .. }),
        "cut into the last batch",
    );
}

#[test]
fn a_missing_covered_segment_or_run_refuses_the_writable_open() {
    let image = base();
    let mut missing = image.clone();
    let first = segment_path(manifest(&image).segments[0].id);
    missing.remove_file(&first);
    assert_refused(
        &missing,
        |error| matches!(error, Error::CorruptFile { file, .. } if file.starts_with("wal/")),
        "missing segment",
    );

    // Seal both segments into runs; the checkpoint then covers the runs.
    let disk = SimStorage::from_image(&image);
    let store = open_sim(&disk, sim_writable()).expect("open");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let sealed = disk.durable_image();
    let run = run_path(manifest(&sealed).runs[0].id);
    let mut missing_run = sealed.clone();
    missing_run.remove_file(&run);
    assert_refused(
        &missing_run,
        |error| matches!(error, Error::CorruptFile { file, .. } if file.starts_with("runs/")),
        "missing run",
    );
    let mut damaged_footer = sealed.clone();
    let bytes = damaged_footer.file_mut(&run).expect("run");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    assert_refused(
        &damaged_footer,
        |error| matches!(error, Error::CorruptFile { file, .. } if file.starts_with("runs/")),
        "damaged run footer",
    );
}

#[test]
fn a_writer_whose_read_finds_damage_refuses_further_writes() {
    // Damage in an older segment: the writable open does not read it (F-05-12), a read does.
    let mut image = base();
    let first = segment_path(manifest(&image).segments[0].id);
    let marker = data("b", 0);
    let segment = image.file_mut(&first).expect("first segment");
    let at = segment
        .windows(marker.len())
        .position(|window| window == marker.as_bytes())
        .expect("event 0 of b");
    segment[at + 10] ^= 0x04;
    let disk = SimStorage::from_image(&image);
    let store = open_sim(&disk, sim_writable()).expect("the open checks the last segment only");
    append(&store, "a", 1).expect("nothing found yet");
    let found = store.read("b", 0, u64::MAX);
    assert!(
        matches!(found, Err(Error::Corrupt { .. })),
        "{:?}",
        found.map(|events| events.len())
    );
    let refused = append(&store, "a", 1);
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    assert!(matches!(
        store.create_session_with_id("c").map(|_| ()),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(store.maintain(), Err(Error::Corrupt { .. })));
    store.close().expect("close still seals what was written");
}

/// One step of damage at the tail of the last segment.
fn damage(image: &mut CrashImage, random: &mut Rng) -> String {
    let path = last_segment_path(image);
    let segment = image.file_mut(&path).expect("last segment");
    let length = segment.len() as u64;
    let at = length - 1 - random.below(TAIL_WINDOW_BYTES.min(length - 1));
    match random.below(3) {
        0 => {
            let cut = 1 + random.below(TAIL_WINDOW_BYTES);
            segment.truncate(length.saturating_sub(cut).max(1) as usize);
            format!("cut {cut}")
        }
        1 => {
            let flip = 1u8 << random.below(8);
            segment[at as usize] ^= flip;
            format!("flip {at} ^ {flip:#x}")
        }
        _ => {
            let end = (at + 1 + random.below(40)).min(length);
            segment[at as usize..end as usize].fill(0);
            format!("zero {at}..{end}")
        }
    }
}

#[test]
fn no_damage_at_the_tail_then_opens_and_appends_turns_a_readable_store_unreadable() {
    let base = base();
    let mut random = Rng(0xda3a6e);
    let mut refused = 0;
    let mut readable_cases = 0;
    for case in 0..DAMAGE_CASES {
        let mut image = base.clone();
        let steps: Vec<String> = (0..1 + random.below(MAX_DAMAGE_STEPS))
            .map(|_| damage(&mut image, &mut random))
            .collect();
        let label = format!("case {case}: {steps:?}");
        let Ok(before) = reads_whole(&image) else {
            continue;
        };
        readable_cases += 1;
        let disk = SimStorage::from_image(&image);
        let files_before = files(&disk);
        let store = match open_sim(&disk, sim_writable()) {
            Ok(store) => store,
            Err(error) => {
                assert!(error.is_corruption(), "{label}: {error}");
                assert_eq!(files(&disk), files_before, "{label}: refused but changed");
                refused += 1;
                continue;
            }
        };
        append(&store, "a", 1).unwrap_or_else(|error| panic!("{label}: append: {error}"));
        store
            .close()
            .unwrap_or_else(|error| panic!("{label}: close: {error}"));
        let after = reads_whole(&disk.durable_image())
            .unwrap_or_else(|error| panic!("{label}: unreadable after the append: {error}"));
        for (session, events) in &before {
            let now = &after[session];
            assert!(
                now.len() >= events.len() && now[..events.len()] == events[..],
                "{label}: session {session} lost events"
            );
        }
    }
    eprintln!("{readable_cases} of {DAMAGE_CASES} damaged stores read whole; {refused} of them refused a writable open");
    assert!(
        readable_cases > DAMAGE_CASES / 4,
        "{readable_cases} readable cases"
    );
}

#[test]
fn a_power_cut_anywhere_in_the_repair_of_a_torn_seal_leaves_a_readable_store() {
    let mut image = base();
    let path = last_segment_path(&image);
    let length = image.file(&path).expect("last segment").len();
    image.file_mut(&path).expect("last segment")[length - 3] ^= 0x20;
    let mut operation = 0;
    loop {
        let disk = SimStorage::from_image(&image);
        disk.crash_at(operation);
        let acknowledged = open_sim(&disk, sim_writable())
            .and_then(|store| append(&store, "a", 1).map(|()| store))
            .is_ok();
        if !disk.crashed() {
            break;
        }
        for crashed in disk.take_crash_images() {
            let label = format!("cut at op {operation}, {}", crashed.label);
            let contents = reads_whole(&crashed).unwrap_or_else(|error| panic!("{label}: {error}"));
            let minimum = if acknowledged { 1 } else { 0 };
            assert!(
                contents == expected_contents(0) || contents == expected_contents(1),
                "{label}: {contents:?}"
            );
            assert!(
                contents["a"].len() as u64 >= EVENTS_PER_SESSION + minimum,
                "{label}"
            );
            let repaired =
                open_append_close(&crashed).unwrap_or_else(|error| panic!("{label}: {error}"));
            reads_whole(&repaired).unwrap_or_else(|error| panic!("{label}: {error}"));
        }
        operation += 1;
    }
    assert!(operation > 3, "the repair took {operation} operations");
}
