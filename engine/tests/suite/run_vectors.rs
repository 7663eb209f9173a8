//! Golden vectors of format-spec/06-runs-and-index.md: a run file, a version-2 manifest and
//! a seq-index checkpoint (format-spec/vectors/run-*, manifest-runs.*, checkpoint.*).
//! Each `.bin` decodes, with the engine's code, to the values its `.json` states; the
//! manifest and the checkpoint re-encode to the same bytes. The run's zstd blocks are
//! checked by decoding only: another zstd encoder may compress the same bytes differently.
//! The ignored test `regenerate_run_vectors` rewrote the files with the engine's encoders.

use dshdb::storage::frame::Record;
use dshdb::storage::index::{decode_checkpoint, CHECKPOINT_FILE};
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::{Manifest, RunEntry, SegmentEntry};
use dshdb::storage::run::rows::RowEntry;
use dshdb::storage::run::{build_run, decode_block, run_path, walk_block, BlockItem, RunIndex};
use dshdb::store::{Options, Store};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The source segment vector and its salt (format-spec/vectors/README.md).
const SOURCE_SEGMENT: &str = "segment-two-sessions";
const SOURCE_SALT: u64 = 0xfeed_face_cafe_beef;
const RUN_ID: u64 = 2;
const RUN_SALT: u64 = 0x0123_4567_89ab_cdef;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("format-spec")
        .join("vectors")
}

fn read_bin(name: &str) -> Vec<u8> {
    std::fs::read(vectors_dir().join(format!("{name}.bin"))).expect("vector .bin")
}

fn read_json(name: &str) -> Value {
    let text =
        std::fs::read_to_string(vectors_dir().join(format!("{name}.json"))).expect("vector .json");
    serde_json::from_str(&text).expect("vector .json parses")
}

fn hex64(value: u64) -> String {
    format!("0x{value:016x}")
}

fn hex32(value: u32) -> String {
    format!("0x{value:08x}")
}

fn run_entry(bytes: &[u8]) -> RunEntry {
    RunEntry {
        id: RUN_ID,
        salt: RUN_SALT,
        file_bytes: bytes.len() as u64,
    }
}

/// What a run's bytes say, as the vector's JSON states it.
fn describe_run(bytes: &[u8], description: &str) -> Value {
    let entry = run_entry(bytes);
    let index = RunIndex::decode(&bytes[..64], bytes, 0, &entry).expect("run index");
    let mut blocks = Vec::new();
    let mut definitions = Vec::new();
    let mut events = Vec::new();
    let mut rows = Vec::new();
    for block in &index.blocks {
        blocks.push(json!({
            "session": block.session,
            "event_count": block.event_count,
            "first_seq": block.first_seq,
            "raw_offset": block.raw_offset,
            "raw_bytes": block.raw_bytes,
            "stored_checksum": hex32(block.stored_checksum),
            "file_offset": block.file_offset,
            "stored_bytes": block.stored_bytes,
        }));
        let stored = &bytes[block.file_offset as usize..][..block.stored_bytes as usize];
        assert_eq!(&stored[..4], &[0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
        assert_ne!(
            stored[4] & 0x04,
            0,
            "zstd content checksum enabled (F-06-13)"
        );
        let raw = decode_block(stored, block, RUN_ID).expect("block");
        let mut at = 0;
        while at < raw.len() {
            assert_eq!(&raw[at..at + 4], &[0; 4], "frame checksum field is zero");
            at += 12 + u32::from_le_bytes(raw[at + 4..at + 8].try_into().expect("4")) as usize;
        }
        walk_block(&raw, block, &index, |offset, frame_bytes, item| {
            let record = match item {
                BlockItem::Row(row) => {
                    rows.push(describe_row(&row, offset, frame_bytes));
                    return Ok(());
                }
                BlockItem::Record(record) => record,
            };
            match record {
                Record::SessionHeader {
                    session,
                    seed_parent,
                    seed_length,
                    header_json,
                } => definitions.push(json!({
                    "kind": "session_header",
                    "session": session,
                    "seed_parent": hex32(seed_parent),
                    "seed_length": seed_length,
                    "header_json": String::from_utf8_lossy(header_json),
                })),
                Record::TypeDefinition { type_number, name } => definitions.push(json!({
                    "kind": "type_definition",
                    "type_number": type_number,
                    "name": String::from_utf8_lossy(name),
                })),
                Record::Event(event) => events.push(json!({
                    "session": event.session,
                    "seq": event.seq,
                    "raw_offset": offset,
                    "frame_bytes": frame_bytes,
                    "type_number": event.type_number,
                    "time": event.time,
                    "data": String::from_utf8_lossy(event.data),
                    "envelope": String::from_utf8_lossy(event.envelope),
                })),
                other => panic!("unexpected record in a run: {other:?}"),
            }
            Ok(())
        })
        .expect("frames");
    }
    let mut described = json!({
        "description": description,
        "magic": "DSHDBRUN",
        "version": index.version,
        "run_id": hex64(index.id),
        "salt": hex64(index.salt),
        "source_segment": hex64(index.source_segment),
        "file_bytes": bytes.len(),
        "blocks": blocks,
        "definitions": definitions,
        "events": events,
    });
    if index.holds_rows() {
        described["row_entries"] = Value::Array(rows);
    }
    described
}

/// A row entry as the rows vector's JSON states it: its fields and the events it stands for.
fn describe_row(row: &RowEntry<'_>, offset: u64, frame_bytes: u32) -> Value {
    let mut data = Vec::new();
    let members: Vec<Value> = row
        .members()
        .map(|member| {
            let event = row.member_event(&member, &mut data);
            json!({
                "seq": event.seq,
                "time": event.time,
                "flags": event.flags,
                "payload": String::from_utf8_lossy(member.payload),
                "data": String::from_utf8_lossy(event.data),
            })
        })
        .collect();
    json!({
        "raw_offset": offset,
        "frame_bytes": frame_bytes,
        "session": row.session,
        "first_seq": row.first_seq,
        "member_count": row.member_count,
        "type_number": row.type_number,
        "first_flags": row.first_flags,
        "member_flags": row.member_flags,
        "first_time": row.first_time,
        "prefix": String::from_utf8_lossy(row.prefix),
        "suffix": String::from_utf8_lossy(row.suffix),
        "members": members,
    })
}

const TWO_SESSIONS_DESCRIPTION: &str = "segment-two-sessions.bin rewritten as run 2 (F-06-1): a definitions block, then one event block per session";

fn manifest_with_run(run_bytes: &[u8]) -> Manifest {
    Manifest {
        segments: vec![SegmentEntry {
            id: 3,
            salt: 0x3333_3333_3333_3333,
        }],
        runs: vec![run_entry(run_bytes)],
        next_segment_id: 4,
    }
}

fn describe_manifest(manifest: &Manifest) -> Value {
    json!({
        "description": "A version-2 manifest (F-06-7): run 2 holds the log's prefix, segment 3 the rest",
        "magic": "DSHDBMAN",
        "version": 2,
        "next_segment_id": hex64(manifest.next_segment_id),
        "segments": manifest.segments.iter().map(|segment| json!({
            "id": hex64(segment.id), "salt": hex64(segment.salt)
        })).collect::<Vec<_>>(),
        "runs": manifest.runs.iter().map(|run| json!({
            "id": hex64(run.id), "salt": hex64(run.salt), "file_bytes": run.file_bytes
        })).collect::<Vec<_>>(),
    })
}

/// A sim store holding only the run vector (and an empty segment 3 taking appends).
fn store_with_run(run_bytes: &[u8]) -> SimStorage {
    let disk = SimStorage::new();
    disk.create_dir("wal").expect("wal");
    disk.create_dir("runs").expect("runs");
    let file = disk.open(&run_path(RUN_ID), true).expect("run file");
    file.write_at(run_bytes, 0).expect("write");
    file.sync_data().expect("sync");
    let segment = dshdb::storage::segment::encode_header(3, 0x3333_3333_3333_3333);
    let file = disk
        .open(&dshdb::storage::segment::segment_path(3), true)
        .expect("segment");
    file.write_at(&segment, 0).expect("write");
    file.sync_data().expect("sync");
    manifest_with_run(run_bytes).write(&disk).expect("manifest");
    disk
}

fn describe_checkpoint(bytes: &[u8]) -> Value {
    let checkpoint = decode_checkpoint(bytes).expect("checkpoint");
    let mut types: Vec<_> = checkpoint.catalog.type_names.iter().collect();
    types.sort();
    let mut sessions: Vec<_> = checkpoint.catalog.sessions.values().collect();
    sessions.sort_by_key(|entry| entry.number);
    json!({
        "description": "The seq-index checkpoint of a store whose log is run 2 (F-06-20): both sessions, one extent per event block in the run's raw stream",
        "magic": "DSHDBIDX",
        "version": 3,
        "runs": checkpoint.runs.iter().map(|(id, salt)| json!({"id": hex64(*id), "salt": hex64(*salt)})).collect::<Vec<_>>(),
        "segments": checkpoint.segments.iter().map(|segment| json!({"id": hex64(segment.id), "salt": hex64(segment.salt), "end": segment.end})).collect::<Vec<_>>(),
        "types": types.iter().map(|(number, name)| json!({"number": number, "name": name})).collect::<Vec<_>>(),
        "sessions": sessions.iter().map(|entry| json!({
            "number": entry.number,
            "id": entry.id,
            "seed": entry.seed.map(|seed| json!({"parent": seed.parent, "length": seed.length})),
            "defined_in": entry.defined_in.map(hex64),
            "header_json": entry.header_json.to_string(),
            "events": entry.length(),
            "extents": entry.events.extents().iter().map(|extent| json!({
                "file": hex64(extent.file),
                "offset": extent.offset,
                "bytes": extent.bytes,
                "count": extent.count,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[test]
#[ignore = "rewrites the vectors; run by hand after a deliberate format change"]
fn regenerate_run_vectors() {
    // A version-1 run, written by the builds before row entries (F-06-33): kept as it was,
    // since this build writes version 2.
    let version_1_run = read_bin("run-two-sessions");
    let dir = vectors_dir();
    let write = |name: &str, bytes: &[u8], value: &Value| {
        std::fs::write(dir.join(format!("{name}.bin")), bytes).expect("write bin");
        let text = serde_json::to_string_pretty(value).expect("json") + "\n";
        std::fs::write(dir.join(format!("{name}.json")), text).expect("write json");
    };
    write(
        "run-two-sessions",
        &version_1_run,
        &describe_run(&version_1_run, TWO_SESSIONS_DESCRIPTION),
    );
    let rows_run = build_rows_run();
    write(
        "run-rows",
        &rows_run,
        &describe_run(&rows_run, ROWS_DESCRIPTION),
    );
    let manifest = manifest_with_run(&version_1_run);
    write(
        "manifest-runs",
        &manifest.encode().expect("encode"),
        &describe_manifest(&manifest),
    );
    let disk = store_with_run(&version_1_run);
    let store = Store::open_on(Arc::new(disk.clone()), Options::default(), Path::new("vec"))
        .expect("open writes a fresh checkpoint");
    drop(store);
    let checkpoint = disk
        .open_read(CHECKPOINT_FILE)
        .and_then(|file| file.read_all())
        .expect("checkpoint");
    write("checkpoint", &checkpoint, &describe_checkpoint(&checkpoint));
}

#[test]
fn the_run_vector_decodes_to_its_json_and_any_header_or_footer_flip_is_refused() {
    let bytes = read_bin("run-two-sessions");
    assert_eq!(
        describe_run(&bytes, TWO_SESSIONS_DESCRIPTION),
        read_json("run-two-sessions")
    );
    let entry = run_entry(&bytes);
    let footer_offset =
        u64::from_le_bytes(bytes[bytes.len() - 24..][..8].try_into().expect("8")) as usize;
    for at in (0..64).chain(footer_offset..bytes.len()) {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x01;
        assert!(
            RunIndex::decode(&damaged[..64], &damaged, 0, &entry).is_err(),
            "flip at {at}"
        );
    }
    // The engine writes the same run from the source segment (same zstd build).
    let segment = read_bin(SOURCE_SEGMENT);
    let built = build_run(
        &segment,
        1,
        SOURCE_SALT,
        RUN_ID,
        RUN_SALT,
        &Default::default(),
    )
    .expect("run");
    let rebuilt = RunIndex::decode(&built.bytes[..64], &built.bytes, 0, &entry);
    assert!(matches!(rebuilt, Ok(ref index) if index.blocks.len() == 3));
    // It holds no row entry, so it stays version 1: readable by the builds before them
    // (F-06-33).
    assert!(matches!(rebuilt, Ok(ref index) if index.version == 1 && !index.holds_rows()));
}

#[test]
fn the_version_2_manifest_vector_round_trips() {
    let bytes = read_bin("manifest-runs");
    let manifest = Manifest::decode(&bytes).expect("valid");
    assert_eq!(describe_manifest(&manifest), read_json("manifest-runs"));
    assert_eq!(manifest.encode().expect("encode"), bytes);
}

#[test]
fn the_checkpoint_vector_round_trips_and_a_store_on_the_run_reads_its_events() {
    let bytes = read_bin("checkpoint");
    assert_eq!(describe_checkpoint(&bytes), read_json("checkpoint"));
    let checkpoint = decode_checkpoint(&bytes).expect("checkpoint");
    assert_eq!(
        crate::common::reencode_checkpoint(&checkpoint, checkpoint.open),
        bytes
    );
    let run_bytes = read_bin("run-two-sessions");
    let disk = store_with_run(&run_bytes);
    disk.create_dir("index").expect("index");
    let file = disk.open(CHECKPOINT_FILE, true).expect("checkpoint");
    file.write_at(&bytes, 0).expect("write");
    let store = Store::open_on(Arc::new(disk), Options::default(), Path::new("vec")).expect("open");
    assert!(store.recovery_report().checkpoint_used);
    let run = read_json("run-two-sessions");
    for event in run["events"].as_array().expect("events") {
        let session_number = event["session"].as_u64().expect("session") as u32;
        let id = &checkpoint.catalog.sessions[&session_number].id;
        let seq = event["seq"].as_u64().expect("seq");
        let stored = store.get(id, seq).expect("event");
        assert_eq!(stored.data, event["data"].as_str().expect("data"));
    }
}

const ROWS_DESCRIPTION: &str = "A version-2 run (F-06-30): one session whose chunk events are stored as row entries: an imported DSH row with a negative dt, live chunk events of one step, and events that stay event frames (an envelope, a verbatim row's line, a lone member)";

/// The event types of the rows vector, by number.
const ROWS_TYPES: [&str; 2] = ["turn/start", "assistant/chunk"];

/// A chunk event's `data` of turn 1, step `step`.
fn chunk_data(step: u32, text: &str) -> String {
    format!(
        r#"{{"turn":1,"step":{step},"chunk":{{"type":"text-delta","index":0,"text":{}}}}}"#,
        serde_json::to_string(text).expect("a string")
    )
}

/// The events of the rows vector's session: (time, type number, flags, data, envelope).
fn rows_events() -> Vec<(i64, u32, u8, String, String)> {
    const BATCH: u8 = 0x02;
    const ROW_START: u8 = 0x04;
    const ROW_MEMBER: u8 = 0x08;
    const ROW_VERBATIM: u8 = 0x10;
    const VERBATIM_LINE: u8 = 0x01;
    let verbatim_row = r#"{"seq0":11,"type":"text-chunks","time0":1733011200100,"data":{"turn":1,"step":3,"index":0,"dt":[1],"texts":["x","y"]}}"#;
    vec![
        (
            1_733_011_200_000,
            0,
            BATCH,
            r#"{"turn":1}"#.to_string(),
            String::new(),
        ),
        (
            1_733_011_200_010,
            1,
            BATCH | ROW_START,
            chunk_data(0, "Hel"),
            String::new(),
        ),
        (
            1_733_011_200_012,
            1,
            ROW_MEMBER,
            chunk_data(0, "lo, \"w\""),
            String::new(),
        ),
        (
            1_733_011_200_009,
            1,
            ROW_MEMBER,
            chunk_data(0, "orld"),
            String::new(),
        ),
        (
            1_733_011_200_030,
            1,
            ROW_MEMBER,
            chunk_data(0, "!\n"),
            String::new(),
        ),
        (
            1_733_011_200_040,
            1,
            0,
            chunk_data(1, "alone"),
            String::new(),
        ),
        (1_733_011_200_050, 1, 0, chunk_data(2, "li"), String::new()),
        (1_733_011_200_051, 1, 0, chunk_data(2, "ve"), String::new()),
        (
            1_733_011_200_051,
            1,
            0,
            chunk_data(2, " chunks"),
            String::new(),
        ),
        (
            1_733_011_200_060,
            1,
            0,
            chunk_data(2, "tail"),
            r#""ignorable":true"#.to_string(),
        ),
        (
            1_733_011_200_070,
            0,
            BATCH,
            r#"{"turn":2}"#.to_string(),
            String::new(),
        ),
        (
            1_733_011_200_100,
            1,
            BATCH | ROW_START | ROW_VERBATIM | VERBATIM_LINE,
            chunk_data(3, "x"),
            verbatim_row.to_string(),
        ),
        (
            1_733_011_200_101,
            1,
            ROW_MEMBER,
            chunk_data(3, "y"),
            String::new(),
        ),
    ]
}

/// A sealed segment 1 (salt [`SOURCE_SALT`]) holding session 0 `rows` with [`rows_events`],
/// one commit per event.
fn rows_source_segment() -> Vec<u8> {
    use dshdb::storage::frame::{EventRecord, NO_SEED_PARENT};
    use dshdb::storage::segment::{encode_header, SEGMENT_HEADER_BYTES};
    let mut bytes = encode_header(1, SOURCE_SALT);
    Record::SessionHeader {
        session: 0,
        seed_parent: NO_SEED_PARENT,
        seed_length: 0,
        header_json: br#"{"version":0,"id":"rows","createdAt":1733011200000}"#,
    }
    .encode(&mut bytes, SOURCE_SALT)
    .expect("header");
    for (number, name) in ROWS_TYPES.iter().enumerate() {
        Record::TypeDefinition {
            type_number: number as u32,
            name: name.as_bytes(),
        }
        .encode(&mut bytes, SOURCE_SALT)
        .expect("type");
    }
    for (seq, (time, type_number, flags, data, envelope)) in rows_events().iter().enumerate() {
        let durable_offset = bytes.len() as u64;
        EventRecord {
            session: 0,
            seq: seq as u64,
            time: *time,
            type_number: *type_number,
            flags: *flags,
            data: data.as_bytes(),
            envelope: envelope.as_bytes(),
        }
        .encode(&mut bytes, SOURCE_SALT)
        .expect("event");
        Record::Commit {
            session: 0,
            first_seq: seq as u64,
            event_count: 1,
            durable_offset: durable_offset.max(SEGMENT_HEADER_BYTES),
        }
        .encode(&mut bytes, SOURCE_SALT)
        .expect("commit");
    }
    let used = bytes.len() as u64;
    Record::Seal {
        used_bytes: used,
        durable_offset: used,
    }
    .encode(&mut bytes, SOURCE_SALT)
    .expect("seal");
    bytes
}

fn build_rows_run() -> Vec<u8> {
    build_run(
        &rows_source_segment(),
        1,
        SOURCE_SALT,
        RUN_ID,
        RUN_SALT,
        &Default::default(),
    )
    .expect("run")
    .bytes
}

/// The decoded records of a run description, without what another zstd encoder may change
/// (stored sizes, checksums, file offsets).
fn decoded_part(described: &Value) -> Value {
    json!({
        "version": described["version"],
        "definitions": described["definitions"],
        "events": described["events"],
        "row_entries": described["row_entries"],
        "raw": described["blocks"].as_array().expect("blocks").iter().map(|block| json!({
            "session": block["session"],
            "event_count": block["event_count"],
            "first_seq": block["first_seq"],
            "raw_offset": block["raw_offset"],
            "raw_bytes": block["raw_bytes"],
        })).collect::<Vec<_>>(),
    })
}

#[test]
fn the_rows_run_vector_decodes_to_its_json_and_the_engine_writes_the_same_entries() {
    let bytes = read_bin("run-rows");
    let described = describe_run(&bytes, ROWS_DESCRIPTION);
    assert_eq!(described, read_json("run-rows"));
    assert_eq!(described["version"], json!(2));
    // The imported row (seq 1..=4) and the live chunks (6..=8) are one entry each; the rest
    // stays event frames.
    let entries: Vec<(u64, u64)> = described["row_entries"]
        .as_array()
        .expect("row entries")
        .iter()
        .map(|row| {
            (
                row["first_seq"].as_u64().expect("seq"),
                row["member_count"].as_u64().expect("count"),
            )
        })
        .collect();
    assert_eq!(entries, vec![(1, 4), (6, 3)]);
    let rebuilt = build_rows_run();
    assert_eq!(
        decoded_part(&describe_run(&rebuilt, ROWS_DESCRIPTION)),
        decoded_part(&described)
    );
}

#[test]
fn a_store_on_the_rows_vector_reads_every_event_and_every_range_exactly() {
    let disk = store_with_run(&read_bin("run-rows"));
    let store = Store::open_on(Arc::new(disk), Options::default(), Path::new("vec")).expect("open");
    let expected: Vec<(u64, i64, String, u8, String, String)> = rows_events()
        .into_iter()
        .enumerate()
        .map(|(seq, (time, type_number, flags, data, envelope))| {
            let name = ROWS_TYPES[type_number as usize].to_string();
            (seq as u64, time, name, flags, data, envelope)
        })
        .collect();
    let total = expected.len() as u64;
    for from in 0..total {
        for to in from + 1..=total {
            let read: Vec<_> = store
                .read("rows", from, to)
                .expect("read")
                .into_iter()
                .map(|event| {
                    (
                        event.seq,
                        event.time,
                        event.event_type,
                        event.flags,
                        event.data,
                        event.envelope,
                    )
                })
                .collect();
            assert_eq!(
                read,
                expected[from as usize..to as usize],
                "read({from}, {to})"
            );
        }
    }
}

#[test]
fn any_flip_in_the_rows_vector_is_refused_or_found_when_read() {
    use dshdb::storage::run::decode_block;
    let bytes = read_bin("run-rows");
    let entry = run_entry(&bytes);
    let index = RunIndex::decode(&bytes[..64], &bytes, 0, &entry).expect("index");
    for at in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x10;
        let found = match RunIndex::decode(&damaged[..64], &damaged, 0, &entry) {
            Err(_) => true,
            Ok(damaged_index) => damaged_index.blocks.iter().any(|block| {
                let stored = &damaged[block.file_offset as usize..][..block.stored_bytes as usize];
                decode_block(stored, block, RUN_ID).is_err()
            }),
        };
        assert!(found, "flip at byte {at} of {} went unnoticed", bytes.len());
    }
    assert!(index.holds_rows());
}

/// Rewriting the rows run with a retained prefix of every length (F-06-26) keeps exactly
/// those events, also when the cut falls inside a row entry (its first members become
/// event frames, F-06-33).
#[test]
fn rewriting_the_rows_run_keeps_every_prefix_exactly() {
    use dshdb::storage::frame::Record as FrameRecord;
    use dshdb::storage::run::{rebuild_run, RunReader};
    let bytes = build_rows_run();
    let disk = store_with_run(&bytes);
    let reader = RunReader::open(
        disk.open_read(&run_path(RUN_ID)).expect("run"),
        &run_entry(&bytes),
    )
    .expect("run opens");
    let events = rows_events();
    for kept in 0..=events.len() as u64 {
        let retained = [(0u32, kept)].into_iter().collect();
        let rebuilt = rebuild_run(&reader, RUN_ID + 1, RUN_SALT, &retained).expect("rebuilt");
        assert_eq!(rebuilt.events, kept);
        let entry = RunEntry {
            id: RUN_ID + 1,
            salt: RUN_SALT,
            file_bytes: rebuilt.bytes.len() as u64,
        };
        let index = RunIndex::decode(&rebuilt.bytes[..64], &rebuilt.bytes, 0, &entry)
            .expect("rebuilt index");
        let mut read = Vec::new();
        let mut data = Vec::new();
        for block in index.blocks.iter().skip(1) {
            let stored =
                &rebuilt.bytes[block.file_offset as usize..][..block.stored_bytes as usize];
            let raw = decode_block(stored, block, RUN_ID + 1).expect("block");
            walk_block(&raw, block, &index, |_, _, item| {
                match item {
                    BlockItem::Row(row) => {
                        for member in row.members() {
                            let event = row.member_event(&member, &mut data);
                            read.push((
                                event.seq,
                                event.time,
                                event.flags,
                                String::from_utf8_lossy(event.data).into_owned(),
                            ));
                        }
                    }
                    BlockItem::Record(FrameRecord::Event(event)) => {
                        read.push((
                            event.seq,
                            event.time,
                            event.flags,
                            String::from_utf8_lossy(event.data).into_owned(),
                        ));
                    }
                    BlockItem::Record(other) => panic!("not an event: {other:?}"),
                }
                Ok(())
            })
            .expect("walk");
        }
        let expected: Vec<_> = events[..kept as usize]
            .iter()
            .enumerate()
            .map(|(seq, (time, _, flags, data, _))| (seq as u64, *time, *flags, data.clone()))
            .collect();
        assert_eq!(read, expected, "retained prefix {kept}");
    }
}
