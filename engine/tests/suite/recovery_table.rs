//! Recovery's decision table (format-spec/05-commit-and-recovery.md, F-05-8) as data: one
//! case per row (some rows have two sides), each naming the row, the F-numbers it rests on,
//! the situation it builds on the simulated disk and the action recovery must take. The test
//! drives every case and fails on a row the table has but no case covers.

use crate::common::{chunk, event_data, TEST_SEGMENT_BYTES};
use dshdb::storage::commit::Durability;
use dshdb::storage::frame::{encode_frame, EventRecord, Record, FLAG_SKIPPABLE};
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::{parent_dir, Storage};
use dshdb::storage::manifest::{Manifest, SegmentEntry, MANIFEST_FILE, MANIFEST_TEMP_FILE};
use dshdb::storage::segment::{encode_header, scan_frames, segment_path, SEAL_FRAME_BYTES};
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::path::Path;
use std::sync::Arc;

/// Rows of F-05-8.
const TABLE_ROWS: u32 = 21;
/// Batches the base store commits to session `a` (its session number is 0), two events each.
const BATCHES: u64 = 3;
const EVENTS_PER_BATCH: u64 = 2;
const SESSION_EVENTS: u64 = BATCHES * EVENTS_PER_BATCH;
/// Session number of `a`, the first session created; type number of its only event type.
const SESSION_NUMBER: u32 = 0;
const TYPE_NUMBER: u32 = 0;
/// Event bytes of the store that rolls segments, and a bound on its appends.
const ROLLING_EVENT_BYTES: usize = 600;
const MAX_ROLLING_APPENDS: usize = 100;

/// How a case opens the store.
#[derive(Clone, Copy, Debug)]
enum OpenMode {
    /// Writable, creating the store if missing.
    Create,
    /// Writable, the store must exist.
    Writable,
    ReadOnly,
}

/// What the open gave; `Ok(())` when it is what the row says.
type Check = fn(Result<Store, Error>, &SimStorage) -> Result<(), String>;

struct Case {
    row: u32,
    cites: &'static str,
    situation: &'static str,
    build: fn() -> SimStorage,
    open: OpenMode,
    action: &'static str,
    check: Check,
}

fn options(mode: OpenMode) -> Options {
    Options {
        durability: Durability::Sync,
        segment_bytes: TEST_SEGMENT_BYTES,
        // Recovery's own scan decides, not the seq-index checkpoint.
        use_checkpoint: false,
        create_if_missing: matches!(mode, OpenMode::Create),
        read_only: matches!(mode, OpenMode::ReadOnly),
        ..Options::default()
    }
}

fn open(disk: &SimStorage, mode: OpenMode) -> Result<Store, Error> {
    Store::open_on(Arc::new(disk.clone()), options(mode), Path::new("sim"))
}

// ---- building situations ----

fn read(disk: &SimStorage, path: &str) -> Vec<u8> {
    let file = disk.open_read(path).expect("open for read");
    file.read_all().expect("read")
}

fn write(disk: &SimStorage, path: &str, bytes: &[u8], offset: u64) {
    let file = disk.open(path, true).expect("open for write");
    file.write_at(bytes, offset).expect("write");
    file.sync_data().expect("sync");
}

/// Writes `path` anew, durably (the file and its directory entry).
fn replace(disk: &SimStorage, path: &str, bytes: &[u8]) {
    let file = disk.open(path, true).expect("open for write");
    file.set_len(0).expect("truncate");
    file.write_at(bytes, 0).expect("write");
    file.sync_data().expect("sync");
    disk.sync_dir(parent_dir(path)).expect("sync directory");
}

fn manifest(disk: &SimStorage) -> Manifest {
    Manifest::decode(&read(disk, MANIFEST_FILE)).expect("manifest")
}

fn last_segment(disk: &SimStorage) -> SegmentEntry {
    *manifest(disk).segments.last().expect("a segment")
}

/// The end of the last valid frame of the last segment: its committed end in a store built
/// here. (Not the last non-zero byte: a frame may end in zero bytes.)
fn data_end(disk: &SimStorage) -> u64 {
    let segment = last_segment(disk);
    let bytes = read(disk, &segment_path(segment.id));
    scan_frames(&bytes, segment.id, segment.salt, |_, _| Ok(()))
        .expect("scan")
        .valid_end
}

/// The durable image of a store still open: session `a` with [`BATCHES`] committed batches,
/// the only segment unsealed (as after a power cut).
fn live() -> SimStorage {
    let disk = SimStorage::new();
    let store = open(&disk, OpenMode::Create).expect("create");
    let mut writer = store.create_session_with_id("a").expect("session");
    for batch in 0..BATCHES {
        let data: Vec<String> = (0..EVENTS_PER_BATCH)
            .map(|index| event_data(0, batch * EVENTS_PER_BATCH + index, 60))
            .collect();
        let events: Vec<_> = data.iter().map(|text| chunk(text)).collect();
        writer.append_batch(&events).expect("append");
    }
    let image = disk.durable_image();
    drop(writer);
    drop(store);
    SimStorage::from_image(&image)
}

/// The same store closed cleanly: its segment sealed.
fn closed() -> SimStorage {
    let disk = live();
    open(&disk, OpenMode::Writable)
        .expect("open")
        .close()
        .expect("close");
    SimStorage::from_image(&disk.durable_image())
}

/// A store whose appends rolled over several segments, still open: every segment but the
/// last is sealed.
fn rolled() -> SimStorage {
    let disk = SimStorage::new();
    let store = open(&disk, OpenMode::Create).expect("create");
    let mut writer = store.create_session_with_id("a").expect("session");
    let data = event_data(0, 0, ROLLING_EVENT_BYTES);
    for _ in 0..MAX_ROLLING_APPENDS {
        if manifest(&disk).segments.len() >= 3 {
            break;
        }
        writer.append(chunk(&data)).expect("append");
    }
    assert!(
        manifest(&disk).segments.len() >= 3,
        "the store did not roll"
    );
    let image = disk.durable_image();
    drop(writer);
    drop(store);
    SimStorage::from_image(&image)
}

/// Frames `records` with the last segment's salt and writes them at its data end.
fn append_frames(disk: &SimStorage, frames: &[u8]) {
    let segment = last_segment(disk);
    write(disk, &segment_path(segment.id), frames, data_end(disk));
}

fn encoded(records: &[Record<'_>], salt: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for record in records {
        record.encode(&mut out, salt).expect("encode");
    }
    out
}

fn event(seq: u64) -> Record<'static> {
    Record::Event(EventRecord {
        session: SESSION_NUMBER,
        seq,
        time: 1,
        type_number: TYPE_NUMBER,
        flags: 0,
        data: b"{}",
        envelope: b"",
    })
}

/// An empty commit of session `a` that a reader accepts at the data end.
fn empty_commit(disk: &SimStorage) -> Record<'static> {
    Record::Commit {
        session: SESSION_NUMBER,
        first_seq: SESSION_EVENTS,
        event_count: 0,
        durable_offset: data_end(disk),
    }
}

/// An unknown record kind, followed by an empty commit so that it sits inside a batch.
fn unknown_kind_then_commit(flags: u8) -> SimStorage {
    let disk = live();
    let salt = last_segment(&disk).salt;
    let mut frames = Vec::new();
    encode_frame(&mut frames, salt, 77, flags, &[b"future"]).expect("encode");
    let commit = empty_commit(&disk);
    frames.extend(encoded(&[commit], salt));
    append_frames(&disk, &frames);
    disk
}

/// Rewrites a 32-bit version field at `at` and the CRC-32 of everything before `crc_at`.
fn with_version(bytes: &mut [u8], at: usize, crc_at: usize, version: u32) {
    bytes[at..at + 4].copy_from_slice(&version.to_le_bytes());
    let sum = crc32fast::hash(&bytes[..crc_at]);
    bytes[crc_at..crc_at + 4].copy_from_slice(&sum.to_le_bytes());
}

// ---- checking actions ----

fn opened(result: Result<Store, Error>) -> Result<Store, String> {
    result.map_err(|error| format!("open failed: {error}"))
}

fn refused(result: Result<Store, Error>) -> Result<Error, String> {
    match result {
        Ok(_) => Err("the open succeeded".into()),
        Err(error) => Ok(error),
    }
}

fn corrupt_file(result: Result<Store, Error>, file: &str) -> Result<(), String> {
    match refused(result)? {
        Error::CorruptFile { file: found, .. } if found == file => Ok(()),
        other => Err(format!("expected CorruptFile {{ {file} }}, got {other:?}")),
    }
}

fn corrupt_at(result: Result<Store, Error>, segment: u64, offset: u64) -> Result<(), String> {
    match refused(result)? {
        Error::Corrupt {
            segment: found,
            offset: at,
            ..
        } if found == segment && at == offset => Ok(()),
        other => Err(format!(
            "expected Corrupt at {segment}:{offset}, got {other:?}"
        )),
    }
}

fn corrupt_in(result: Result<Store, Error>, segment: u64) -> Result<(), String> {
    match refused(result)? {
        Error::Corrupt { segment: found, .. } if found == segment => Ok(()),
        other => Err(format!(
            "expected Corrupt in segment {segment}, got {other:?}"
        )),
    }
}

fn unsupported_version(result: Result<Store, Error>, found: u32) -> Result<(), String> {
    match refused(result)? {
        Error::UnsupportedVersion { found: version, .. } if version == found => Ok(()),
        other => Err(format!(
            "expected UnsupportedVersion {found}, got {other:?}"
        )),
    }
}

fn not_a_store(result: Result<Store, Error>) -> Result<(), String> {
    match refused(result)? {
        Error::NotAStore { .. } => Ok(()),
        other => Err(format!("expected NotAStore, got {other:?}")),
    }
}

/// The store opened with session `a` whole and, when writable, takes an append that a reopen
/// reads back.
fn whole_and_appendable(store: &Store, disk: &SimStorage) -> Result<(), String> {
    let events = store
        .session("a")
        .map_err(|error| error.to_string())?
        .events;
    if events != SESSION_EVENTS {
        return Err(format!(
            "session a has {events} events, not {SESSION_EVENTS}"
        ));
    }
    let mut writer = store.writer("a").map_err(|error| error.to_string())?;
    writer
        .append(chunk("{\"after\":1}"))
        .map_err(|error| format!("append after recovery: {error}"))?;
    drop(writer);
    store.close().map_err(|error| error.to_string())?;
    let reopened = open(
        &SimStorage::from_image(&disk.durable_image()),
        OpenMode::ReadOnly,
    )
    .map_err(|error| format!("reopen: {error}"))?;
    let after = reopened
        .session("a")
        .map_err(|error| error.to_string())?
        .events;
    if after != SESSION_EVENTS + 1 {
        return Err(format!("after the append and a reopen: {after} events"));
    }
    Ok(())
}

fn clean_open(result: Result<Store, Error>, disk: &SimStorage) -> Result<(), String> {
    let store = opened(result)?;
    if let Some(tail) = &store.recovery_report().torn_tail {
        return Err(format!("unexpected torn tail {tail:?}"));
    }
    whole_and_appendable(&store, disk)
}

// ---- the table ----

fn cases() -> Vec<Case> {
    vec![
        Case {
            row: 1,
            cites: "F-05-8 row 1, F-01-4",
            situation: "no MANIFEST, an empty directory, writable open with create_if_missing",
            build: SimStorage::new,
            open: OpenMode::Create,
            action: "the store is created and opens with an empty manifest",
            check: |result, disk| {
                let store = opened(result)?;
                if !store.sessions().is_empty() || !disk.exists(MANIFEST_FILE).unwrap_or(false) {
                    return Err("no fresh store".into());
                }
                Ok(())
            },
        },
        Case {
            row: 1,
            cites: "F-05-8 row 1, F-01-1",
            situation: "no MANIFEST but wal/ holds a segment, writable open with create_if_missing",
            build: || {
                let disk = live();
                disk.remove(MANIFEST_FILE).expect("remove manifest");
                disk
            },
            open: OpenMode::Create,
            action: "open fails with CorruptFile { MANIFEST }; nothing is created",
            check: |result, disk| {
                corrupt_file(result, MANIFEST_FILE)?;
                match disk.exists(MANIFEST_FILE) {
                    Ok(false) => Ok(()),
                    _ => Err("a MANIFEST was created".into()),
                }
            },
        },
        Case {
            row: 2,
            cites: "F-05-8 row 2",
            situation: "no MANIFEST, read-only open",
            build: SimStorage::new,
            open: OpenMode::ReadOnly,
            action: "open fails with NotAStore",
            check: |result, _| not_a_store(result),
        },
        Case {
            row: 2,
            cites: "F-05-8 row 2",
            situation: "no MANIFEST and a foreign file in the directory, create_if_missing",
            build: || {
                let disk = SimStorage::new();
                replace(&disk, "notes.txt", b"mine");
                disk
            },
            open: OpenMode::Create,
            action: "open fails with NotAStore; the foreign file stays",
            check: |result, disk| {
                not_a_store(result)?;
                (read(disk, "notes.txt") == b"mine")
                    .then_some(())
                    .ok_or_else(|| "the foreign file changed".into())
            },
        },
        Case {
            row: 3,
            cites: "F-05-8 row 3",
            situation: "MANIFEST with a bad checksum",
            build: || {
                let disk = live();
                let mut bytes = read(&disk, MANIFEST_FILE);
                bytes[16] ^= 0x40;
                replace(&disk, MANIFEST_FILE, &bytes);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with CorruptFile { MANIFEST }",
            check: |result, _| corrupt_file(result, MANIFEST_FILE),
        },
        Case {
            row: 4,
            cites: "F-05-8 row 4",
            situation: "MANIFEST of version 9 with a valid checksum",
            build: || {
                let disk = live();
                let mut bytes = read(&disk, MANIFEST_FILE);
                let crc_at = bytes.len() - 4;
                with_version(&mut bytes, 8, crc_at, 9);
                replace(&disk, MANIFEST_FILE, &bytes);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with UnsupportedVersion",
            check: |result, _| unsupported_version(result, 9),
        },
        Case {
            row: 5,
            cites: "F-05-8 row 5, F-01-8",
            situation: "a MANIFEST.tmp left by an interrupted manifest write",
            build: || {
                let disk = live();
                replace(&disk, MANIFEST_TEMP_FILE, b"half a manifest");
                disk
            },
            open: OpenMode::Writable,
            action: "ignored, and removed by the writable open",
            check: |result, disk| {
                let store = opened(result)?;
                if disk.exists(MANIFEST_TEMP_FILE).unwrap_or(true) {
                    return Err("MANIFEST.tmp is still there".into());
                }
                whole_and_appendable(&store, disk)
            },
        },
        Case {
            row: 6,
            cites: "F-05-8 row 6",
            situation: "the segment the manifest names is missing",
            build: || {
                let disk = live();
                let path = segment_path(last_segment(&disk).id);
                disk.remove(&path).expect("remove segment");
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with CorruptFile (named but missing)",
            check: |result, _| match refused(result)? {
                Error::CorruptFile { reason, .. } if reason.contains("missing") => Ok(()),
                other => Err(format!("expected CorruptFile (missing), got {other:?}")),
            },
        },
        Case {
            row: 7,
            cites: "F-05-8 row 7",
            situation: "a segment header with a bad magic (all zero)",
            build: || {
                let disk = live();
                let path = segment_path(last_segment(&disk).id);
                write(&disk, &path, &[0; 8], 0);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with CorruptFile { wal/<id>.seg }",
            check: |result, _| corrupt_file(result, &segment_path(1)),
        },
        Case {
            row: 8,
            cites: "F-05-8 row 8",
            situation: "a segment header of version 9 with a valid checksum",
            build: || {
                let disk = live();
                let segment = last_segment(&disk);
                let mut header = encode_header(segment.id, segment.salt);
                with_version(&mut header, 8, 60, 9);
                write(&disk, &segment_path(segment.id), &header, 0);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with UnsupportedVersion",
            check: |result, _| unsupported_version(result, 9),
        },
        Case {
            row: 9,
            cites: "F-05-8 row 9",
            situation: "a segment header whose salt differs from the manifest's",
            build: || {
                let disk = live();
                let segment = last_segment(&disk);
                let header = encode_header(segment.id, segment.salt ^ 1);
                write(&disk, &segment_path(segment.id), &header, 0);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with CorruptFile",
            check: |result, _| corrupt_file(result, &segment_path(1)),
        },
        Case {
            row: 10,
            cites: "F-05-8 row 10, F-02-15",
            situation: "a frame with a valid checksum and a malformed event payload",
            build: || {
                let disk = live();
                let mut frame = Vec::new();
                encode_frame(&mut frame, last_segment(&disk).salt, 3, 0, &[&[1, 2, 3]])
                    .expect("encode");
                append_frames(&disk, &frame);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt at that frame",
            check: |result, _| corrupt_in(result, 1),
        },
        Case {
            row: 11,
            cites: "F-05-8 row 11, F-02-7",
            situation: "an unknown record kind flagged skippable, inside a committed batch",
            build: || unknown_kind_then_commit(FLAG_SKIPPABLE),
            open: OpenMode::Writable,
            action: "skipped: the store opens whole and takes appends",
            check: clean_open,
        },
        Case {
            row: 11,
            cites: "F-05-8 row 11, F-02-7",
            situation: "an unknown record kind not flagged skippable",
            build: || unknown_kind_then_commit(0),
            open: OpenMode::Writable,
            action: "open fails with UnknownRecordKind",
            check: |result, _| match refused(result)? {
                Error::UnknownRecordKind { kind: 77, .. } => Ok(()),
                other => Err(format!("expected UnknownRecordKind 77, got {other:?}")),
            },
        },
        Case {
            row: 12,
            cites: "F-05-8 row 12, F-05-5",
            situation: "a committed batch whose event has the wrong seq",
            build: || {
                let disk = live();
                let commit = Record::Commit {
                    session: SESSION_NUMBER,
                    first_seq: SESSION_EVENTS,
                    event_count: 1,
                    durable_offset: data_end(&disk),
                };
                let salt = last_segment(&disk).salt;
                append_frames(&disk, &encoded(&[event(SESSION_EVENTS + 5), commit], salt));
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt",
            check: |result, _| corrupt_in(result, 1),
        },
        Case {
            row: 13,
            cites: "F-05-8 row 13, F-03-7",
            situation: "a seal whose used_bytes is not its own offset",
            build: || {
                let disk = live();
                let end = data_end(&disk);
                let seal = Record::Seal {
                    used_bytes: end + 8,
                    durable_offset: end,
                };
                append_frames(&disk, &encoded(&[seal], last_segment(&disk).salt));
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt",
            check: |result, _| corrupt_in(result, 1),
        },
        Case {
            row: 14,
            cites: "F-05-8 row 14",
            situation: "a valid seal with an uncommitted event before it",
            build: || {
                let disk = live();
                let salt = last_segment(&disk).salt;
                let pending = encoded(&[event(SESSION_EVENTS)], salt);
                let end = data_end(&disk) + pending.len() as u64;
                let seal = Record::Seal {
                    used_bytes: end,
                    durable_offset: end,
                };
                let mut frames = pending;
                frames.extend(encoded(&[seal], salt));
                append_frames(&disk, &frames);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt",
            check: |result, _| corrupt_in(result, 1),
        },
        Case {
            row: 15,
            cites: "F-05-8 row 15, F-01-6",
            situation: "the last segment ends in a clean seal (closed store)",
            build: closed,
            open: OpenMode::Writable,
            action: "complete; the writable open starts a new segment for appends",
            check: |result, disk| {
                // `closed` sealed segment 1, the store's only one.
                let sealed = 1;
                let store = opened(result)?;
                let now = last_segment(disk).id;
                if now <= sealed {
                    return Err(format!("appends continue in segment {now}, not a new one"));
                }
                whole_and_appendable(&store, disk)
            },
        },
        Case {
            row: 16,
            cites: "F-05-8 row 16, F-05-2",
            situation: "an older segment ends without its seal while a later one holds data",
            build: || {
                let disk = rolled();
                let first = manifest(&disk).segments[0];
                let path = segment_path(first.id);
                let length = read(&disk, &path).len() as u64;
                write(
                    &disk,
                    &path,
                    &[0; SEAL_FRAME_BYTES as usize],
                    length - SEAL_FRAME_BYTES,
                );
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt at the end of the older segment's data",
            check: |result, disk| {
                let first = manifest(disk).segments[0];
                let path = segment_path(first.id);
                let end = read(disk, &path).len() as u64 - SEAL_FRAME_BYTES;
                corrupt_at(result, first.id, end)
            },
        },
        Case {
            row: 17,
            cites: "F-05-8 row 17, F-05-3",
            situation: "damage in the first batch, which a later commit records as durable",
            build: || {
                let disk = live();
                let path = segment_path(last_segment(&disk).id);
                let mut byte = read(&disk, &path)[64 + 14];
                byte ^= 0x01;
                write(&disk, &path, &[byte], 64 + 14);
                disk
            },
            open: OpenMode::Writable,
            action: "open fails with Corrupt at the damaged frame (offset 64)",
            check: |result, _| corrupt_at(result, 1, 64),
        },
        Case {
            row: 18,
            cites: "F-05-8 row 18, F-05-11",
            situation: "an unsealed last segment whose bytes after the committed end are zero",
            build: live,
            open: OpenMode::Writable,
            action: "clean end: appends continue at the committed end",
            check: clean_open,
        },
        Case {
            row: 19,
            cites: "F-05-8 row 19, F-05-9",
            situation: "non-zero bytes of an unfinished write after the committed end",
            build: || {
                let disk = live();
                let end = data_end(&disk);
                write(&disk, &segment_path(1), &[0xab; 10], end + 5);
                disk
            },
            open: OpenMode::Writable,
            action: "torn tail reported (segment, committed end, bytes) and wiped; appends go on",
            check: |result, disk| {
                let end = data_end(&SimStorage::from_image(&disk.durable_image()));
                let store = opened(result)?;
                let tail = store.recovery_report().torn_tail.clone();
                match tail {
                    Some(tail) if tail.segment == 1 && tail.bytes == 15 => {}
                    other => return Err(format!("expected a 15-byte torn tail, got {other:?}")),
                }
                let bytes = read(disk, &segment_path(1));
                if bytes[end as usize..].iter().any(|byte| *byte != 0) {
                    return Err("the torn bytes were not wiped".into());
                }
                whole_and_appendable(&store, disk)
            },
        },
        Case {
            row: 19,
            cites: "F-05-8 row 19, F-01-3",
            situation: "the same torn tail, read-only open",
            build: || {
                let disk = live();
                let end = data_end(&disk);
                write(&disk, &segment_path(1), &[0xab; 10], end + 5);
                disk
            },
            open: OpenMode::ReadOnly,
            action: "torn tail reported; nothing is wiped",
            check: |result, disk| {
                let store = opened(result)?;
                if store.recovery_report().torn_tail.is_none() {
                    return Err("no torn tail reported".into());
                }
                let bytes = read(disk, &segment_path(1));
                (bytes.contains(&0xab))
                    .then_some(())
                    .ok_or_else(|| "a read-only open wiped bytes".into())
            },
        },
        Case {
            row: 20,
            cites: "F-05-8 row 20, F-05-10",
            situation: "a clean end in segment S and a later named segment that holds no frame",
            build: || {
                let disk = live();
                let mut named = manifest(&disk);
                let id = named.next_segment_id;
                let salt = 0x5a17;
                let mut file = encode_header(id, salt);
                file.resize(TEST_SEGMENT_BYTES as usize, 0);
                replace(&disk, &segment_path(id), &file);
                named.segments.push(SegmentEntry { id, salt });
                named.next_segment_id = id + 1;
                replace(&disk, MANIFEST_FILE, &named.encode().expect("encode"));
                disk
            },
            open: OpenMode::Writable,
            action: "appends continue in the last named segment; S is sealed",
            check: clean_open,
        },
        Case {
            row: 21,
            cites: "F-05-8 row 21, F-01-7",
            situation: "a segment file in wal/ that the manifest does not name",
            build: || {
                let disk = live();
                replace(&disk, &segment_path(90), &encode_header(90, 9));
                disk
            },
            open: OpenMode::Writable,
            action: "removed at the writable open and reported",
            check: |result, disk| {
                let store = opened(result)?;
                let orphan = segment_path(90);
                let reported = store.recovery_report().orphan_segments.clone();
                if !reported.iter().any(|name| orphan.ends_with(name.as_str())) {
                    return Err(format!("orphans reported: {reported:?}"));
                }
                if disk.exists(&orphan).unwrap_or(true) {
                    return Err("the orphan is still there".into());
                }
                whole_and_appendable(&store, disk)
            },
        },
        Case {
            row: 21,
            cites: "F-05-8 row 21, F-01-3",
            situation: "the same orphan, read-only open",
            build: || {
                let disk = live();
                replace(&disk, &segment_path(90), &encode_header(90, 9));
                disk
            },
            open: OpenMode::ReadOnly,
            action: "ignored: the store opens whole and the file stays",
            check: |result, disk| {
                let store = opened(result)?;
                if store.session("a").ok().map(|session| session.events) != Some(SESSION_EVENTS) {
                    return Err("session a is not whole".into());
                }
                disk.exists(&segment_path(90))
                    .ok()
                    .filter(|exists| *exists)
                    .map(|_| ())
                    .ok_or_else(|| "a read-only open removed the orphan".into())
            },
        },
    ]
}

#[test]
fn every_row_of_the_recovery_decision_table_takes_its_action() {
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        let disk = (case.build)();
        let result = open(&disk, case.open);
        if let Err(failure) = (case.check)(result, &disk) {
            failures.push(format!(
                "row {} ({}): {} [{:?} open] should be \"{}\": {failure}",
                case.row, case.cites, case.situation, case.open, case.action
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for row in 1..=TABLE_ROWS {
        assert!(
            cases.iter().any(|case| case.row == row),
            "row {row} of F-05-8 has no case"
        );
    }
}

// ---- F-05-12: what a writable open checks before it builds on a checkpoint ----

/// Opens writable with the checkpoint (what every `dshdb` writer does).
fn open_with_checkpoint(disk: &SimStorage) -> Result<Store, Error> {
    let options = Options {
        use_checkpoint: true,
        ..options(OpenMode::Writable)
    };
    Store::open_on(Arc::new(disk.clone()), options, Path::new("sim"))
}

/// Every file's name and bytes.
type Files = Vec<(String, Vec<u8>)>;

/// What a checked writable open gave, given the files before it; `Ok(())` when it is what
/// F-05-12 says.
type WritableCheck = fn(Result<Store, Error>, &SimStorage, &Files) -> Result<(), String>;

/// Every file's bytes, to show a refused open changed nothing.
fn all_files(disk: &SimStorage) -> Files {
    let image = disk.volatile_image();
    image
        .file_names()
        .map(|name| (name.to_string(), image.file(name).unwrap_or(&[]).to_vec()))
        .collect()
}

/// A closed store whose last segment's length is cut by `bytes` (the checkpoint written by
/// the close still records the seal).
fn closed_and_cut(bytes: u64) -> SimStorage {
    let disk = closed();
    let path = segment_path(last_segment(&disk).id);
    let length = read(&disk, &path).len() as u64;
    disk.open(&path, false)
        .and_then(|file| file.set_len(length - bytes))
        .expect("cut");
    disk
}

#[test]
fn every_case_of_the_writable_open_check_takes_its_action() {
    struct CheckCase {
        item: &'static str,
        build: fn() -> SimStorage,
        check: WritableCheck,
    }
    let cases = [
        CheckCase {
            item: "F-05-12 item 1: a covered segment is missing",
            build: || {
                let disk = closed();
                disk.remove(&segment_path(1)).expect("remove");
                disk
            },
            check: |result, disk, before| {
                corrupt_file(result, &segment_path(1))?;
                (all_files(disk) == *before)
                    .then_some(())
                    .ok_or_else(|| "changed bytes".into())
            },
        },
        CheckCase {
            item: "F-05-12 item 2: the last covered segment lost its seal",
            build: || closed_and_cut(SEAL_FRAME_BYTES),
            check: |result, disk, _| {
                let store = opened(result)?;
                if !store.recovery_report().checkpoint_distrusted {
                    return Err("the checkpoint was trusted".into());
                }
                if disk.exists("index/checkpoint").unwrap_or(true) {
                    return Err("the stale checkpoint is still there".into());
                }
                whole_and_appendable(&store, disk)
            },
        },
        CheckCase {
            item: "F-05-12 item 2: the last covered segment lost committed batches",
            build: || closed_and_cut(SEAL_FRAME_BYTES + 1),
            check: |result, disk, before| {
                corrupt_in(result, 1)?;
                (all_files(disk) == *before)
                    .then_some(())
                    .ok_or_else(|| "changed bytes".into())
            },
        },
        CheckCase {
            item: "F-05-12 item 2: a flipped byte in the last covered segment's first batch",
            build: || {
                let disk = closed();
                let path = segment_path(1);
                let byte = read(&disk, &path)[64 + 14] ^ 0x01;
                write(&disk, &path, &[byte], 64 + 14);
                disk
            },
            check: |result, disk, before| {
                corrupt_at(result, 1, 64)?;
                (all_files(disk) == *before)
                    .then_some(())
                    .ok_or_else(|| "changed bytes".into())
            },
        },
    ];
    let mut failures = Vec::new();
    for case in &cases {
        let disk = (case.build)();
        let before = all_files(&disk);
        if let Err(failure) = (case.check)(open_with_checkpoint(&disk), &disk, &before) {
            failures.push(format!("{}: {failure}", case.item));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
