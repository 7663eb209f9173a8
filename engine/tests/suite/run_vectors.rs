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
use dshdb::storage::run::{build_run, decode_block, run_path, walk_block, RunIndex};
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
fn describe_run(bytes: &[u8]) -> Value {
    let entry = run_entry(bytes);
    let index = RunIndex::decode(&bytes[..64], bytes, 0, &entry).expect("run index");
    let mut blocks = Vec::new();
    let mut definitions = Vec::new();
    let mut events = Vec::new();
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
        walk_block(&raw, block, RUN_ID, |offset, frame_bytes, record| {
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
    json!({
        "description": "segment-two-sessions.bin rewritten as run 2 (F-06-1): a definitions block, then one event block per session",
        "magic": "DSHDBRUN",
        "version": 1,
        "run_id": hex64(index.id),
        "salt": hex64(index.salt),
        "source_segment": hex64(index.source_segment),
        "file_bytes": bytes.len(),
        "blocks": blocks,
        "definitions": definitions,
        "events": events,
    })
}

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
    let dir = vectors_dir();
    let write = |name: &str, bytes: &[u8], value: &Value| {
        std::fs::write(dir.join(format!("{name}.bin")), bytes).expect("write bin");
        let text = serde_json::to_string_pretty(value).expect("json") + "\n";
        std::fs::write(dir.join(format!("{name}.json")), text).expect("write json");
    };
    write(
        "run-two-sessions",
        &built.bytes,
        &describe_run(&built.bytes),
    );
    let manifest = manifest_with_run(&built.bytes);
    write(
        "manifest-runs",
        &manifest.encode().expect("encode"),
        &describe_manifest(&manifest),
    );
    let disk = store_with_run(&built.bytes);
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
    assert_eq!(describe_run(&bytes), read_json("run-two-sessions"));
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
