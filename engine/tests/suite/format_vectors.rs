//! Golden vectors of the on-disk format (format-spec/vectors/).
//!
//! Every `<name>.bin` has a `<name>.json` with its expected decoding, written independently
//! of the engine (by `format-spec/vectors/reference.py` from values chosen by hand). These
//! tests decode each `.bin` with the engine, compare with the JSON, and re-encode the JSON's
//! values with the engine's encoders, which must give the `.bin` bytes back exactly.
//!
//! `cargo test -p dshdb --test suite -- --ignored format_vectors::regenerate` rewrites the `.bin`
//! files with the engine's encoders; `git diff format-spec/vectors` must then stay empty.

use dshdb::error::Error;
use dshdb::fuzzing::{walked_event, WalkedEvent};
use dshdb::storage::frame::{decode_frame, EventRecord, FrameError, Record, FLAG_SKIPPABLE};
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::{Manifest, SegmentEntry};
use dshdb::storage::run::rows::encode_row_frame;
use dshdb::storage::segment::{check_header, encode_header, scan_frames, segment_path};
use dshdb::store::{Event, Options, Store};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Frame vectors that decode to one known record.
const RECORD_FRAMES: [&str; 8] = [
    "frame-session-header",
    "frame-type-definition",
    "frame-event",
    "frame-event-verbatim",
    "frame-event-row",
    "frame-commit",
    "frame-seal",
    "frame-tombstone",
];

/// Every single-frame vector (the flip check runs over all of them).
const ALL_FRAMES: [&str; 10] = [
    "frame-row-entry",
    "frame-session-header",
    "frame-type-definition",
    "frame-event",
    "frame-event-verbatim",
    "frame-event-row",
    "frame-commit",
    "frame-seal",
    "frame-tombstone",
    "frame-unknown-skippable",
];

/// Whole-segment vectors (a sealed, trimmed segment 1 each).
const SEGMENTS: [&str; 2] = ["segment-two-sessions", "segment-fork"];

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("format-spec")
        .join("vectors")
}

fn load(name: &str) -> (Vec<u8>, Value) {
    let dir = vectors_dir();
    let bytes = std::fs::read(dir.join(format!("{name}.bin"))).expect("vector .bin");
    let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("vector .json");
    let json = serde_json::from_str(&text).expect("vector .json parses");
    (bytes, json)
}

fn load_json(name: &str) -> Value {
    let path = vectors_dir().join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("vector .json")).expect("parses")
}

fn hex(value: &Value) -> u64 {
    let text = value.as_str().expect("hex string");
    u64::from_str_radix(text.strip_prefix("0x").expect("0x prefix"), 16).expect("hex digits")
}

fn uint(value: &Value) -> u64 {
    value.as_u64().expect("unsigned integer")
}

fn u32_of(value: &Value) -> u32 {
    u32::try_from(uint(value)).expect("fits u32")
}

fn text(value: &Value) -> &str {
    value.as_str().expect("string")
}

/// Builds the record a JSON `record` object describes.
fn record_from_json(json: &Value) -> Record<'_> {
    match text(&json["kind"]) {
        "session_header" => Record::SessionHeader {
            session: u32_of(&json["session"]),
            seed_parent: u32_of(&json["seed_parent"]),
            seed_length: uint(&json["seed_length"]),
            header_json: text(&json["header_json"]).as_bytes(),
        },
        "type_definition" => Record::TypeDefinition {
            type_number: u32_of(&json["type_number"]),
            name: text(&json["name"]).as_bytes(),
        },
        "event" => Record::Event(EventRecord {
            session: u32_of(&json["session"]),
            seq: uint(&json["seq"]),
            time: json["time"].as_i64().expect("i64 time"),
            type_number: u32_of(&json["type_number"]),
            flags: u8::try_from(uint(&json["flags"])).expect("u8 flags"),
            data: text(&json["data"]).as_bytes(),
            envelope: text(&json["envelope"]).as_bytes(),
        }),
        "commit" => Record::Commit {
            session: u32_of(&json["session"]),
            first_seq: uint(&json["first_seq"]),
            event_count: u32_of(&json["event_count"]),
            durable_offset: uint(&json["durable_offset"]),
        },
        "seal" => Record::Seal {
            used_bytes: uint(&json["used_bytes"]),
            durable_offset: uint(&json["durable_offset"]),
        },
        "tombstone" => Record::Tombstone {
            session: u32_of(&json["session"]),
        },
        other => panic!("unknown record kind {other:?} in a vector"),
    }
}

fn export_line(record: &Record<'_>, type_name: &str) -> String {
    let Record::Event(event) = record else {
        panic!("only events export");
    };
    Event {
        seq: event.seq,
        time: event.time,
        event_type: type_name.to_string(),
        data: String::from_utf8(event.data.to_vec()).expect("UTF-8 data"),
        envelope: String::from_utf8(event.envelope.to_vec()).expect("UTF-8 envelope"),
        flags: event.flags,
    }
    .to_json_line()
}

fn check_frame_header(bytes: &[u8], expected: &Value, salt: u64) {
    let frame = decode_frame(bytes, salt).expect("the vector is a valid frame");
    assert_eq!(frame.total_bytes, bytes.len(), "one frame fills the vector");
    assert_eq!(frame.total_bytes as u64, uint(&expected["total_bytes"]));
    assert_eq!(u64::from(frame.kind), uint(&expected["kind"]));
    assert_eq!(u64::from(frame.flags), uint(&expected["flags"]));
    assert_eq!(frame.payload.len() as u64, uint(&expected["length"]));
    let stored = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    assert_eq!(u64::from(stored), hex(&expected["checksum"]));
}

#[test]
fn record_frames_decode_to_their_json_and_re_encode_identically() {
    for name in RECORD_FRAMES {
        let (bytes, json) = load(name);
        let salt = hex(&json["salt"]);
        check_frame_header(&bytes, &json["frame"], salt);
        let frame = decode_frame(&bytes, salt).expect("valid frame");
        let decoded = Record::decode(&frame)
            .unwrap_or_else(|error| panic!("{name}: {error:?}"))
            .unwrap_or_else(|| panic!("{name}: kind unknown"));
        let expected = record_from_json(&json["record"]);
        assert_eq!(decoded, expected, "{name}: decoded record");
        let mut encoded = Vec::new();
        expected.encode(&mut encoded, salt).expect("encode");
        assert_eq!(encoded, bytes, "{name}: re-encoding differs");
        if let Some(export) = json.get("export") {
            assert_eq!(
                export_line(&decoded, text(&export["type_name"])),
                text(&export["json_line"]),
                "{name}: exported line"
            );
        }
    }
}

/// The members of a `row_entry` vector as the events they stand for (F-06-30), their
/// `data` built in `data` (one string per member).
fn row_members_from_json<'d>(json: &Value, data: &'d [String]) -> Vec<EventRecord<'d>> {
    let first_seq = uint(&json["first_seq"]);
    json["members"]
        .as_array()
        .expect("members")
        .iter()
        .zip(data)
        .zip(first_seq..)
        .enumerate()
        .map(|(index, ((member, data), seq))| EventRecord {
            session: u32_of(&json["session"]),
            seq,
            time: member["time"].as_i64().expect("i64 time"),
            type_number: u32_of(&json["type_number"]),
            flags: u8::try_from(uint(match index {
                0 => &json["first_flags"],
                _ => &json["member_flags"],
            }))
            .expect("u8 flags"),
            data: data.as_bytes(),
            envelope: b"",
        })
        .collect()
}

#[test]
fn a_row_entry_frame_decodes_to_its_members_and_re_encodes_identically() {
    let (bytes, json) = load("frame-row-entry");
    let salt = hex(&json["salt"]);
    check_frame_header(&bytes, &json["frame"], salt);
    let frame = decode_frame(&bytes, salt).expect("valid frame");
    let Ok(Some(Record::Row(entry))) = Record::decode(&frame) else {
        panic!("frame-row-entry does not decode as a row entry");
    };
    let record = &json["record"];
    let (prefix, suffix) = (text(&record["prefix"]), text(&record["suffix"]));
    assert_eq!(entry.session, u32_of(&record["session"]));
    assert_eq!(entry.first_seq, uint(&record["first_seq"]));
    assert_eq!(entry.type_number, u32_of(&record["type_number"]));
    assert_eq!(u64::from(entry.first_flags), uint(&record["first_flags"]));
    assert_eq!(u64::from(entry.member_flags), uint(&record["member_flags"]));
    assert_eq!(
        (entry.prefix, entry.suffix),
        (prefix.as_bytes(), suffix.as_bytes())
    );
    let data: Vec<String> = record["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|member| format!("{prefix}{}{suffix}", text(&member["payload"])))
        .collect();
    let expected = row_members_from_json(record, &data);
    let mut rebuilt = Vec::new();
    let decoded: Vec<WalkedEvent> = entry
        .members()
        .map(|member| walked_event(&entry.member_event(&member, &mut rebuilt)))
        .collect();
    let wanted: Vec<WalkedEvent> = expected.iter().map(walked_event).collect();
    assert_eq!(decoded, wanted, "the members the entry stands for");
    let mut encoded = Vec::new();
    encode_row_frame(&expected, &mut encoded, salt).expect("encode");
    assert_eq!(encoded, bytes, "re-encoding the members differs");
}

#[test]
fn a_frame_checked_with_another_salt_is_refused() {
    for name in ALL_FRAMES {
        let (bytes, json) = load(name);
        let salt = hex(&json["salt"]);
        assert!(
            matches!(decode_frame(&bytes, salt ^ 1), Err(FrameError::BadChecksum)),
            "{name}"
        );
    }
}

#[test]
fn every_defined_event_flag_decodes_and_the_others_make_the_record_invalid() {
    let (bytes, json) = load("frame-event-row");
    let salt = hex(&json["salt"]);
    // The event flags byte is payload offset 24, frame offset 36.
    for flags in 0..=u8::MAX {
        let mut variant = bytes.clone();
        variant[36] = flags;
        let sum = dshdb::storage::frame::checksum(salt, &variant[4..]);
        variant[0..4].copy_from_slice(&sum.to_le_bytes());
        let frame = decode_frame(&variant, salt).expect("checksum recomputed");
        let decoded = Record::decode(&frame);
        if flags & 0xe0 == 0 {
            assert!(
                matches!(decoded, Ok(Some(Record::Event(event))) if event.flags == flags),
                "flags {flags:#04x}: {decoded:?}"
            );
        } else {
            assert!(
                matches!(decoded, Err(FrameError::BadPayload(_))),
                "flags {flags:#04x}: {decoded:?}"
            );
        }
    }
}

#[test]
fn flipping_any_byte_of_a_frame_vector_is_detected() {
    for name in ALL_FRAMES {
        let (bytes, json) = load(name);
        let salt = hex(&json["salt"]);
        for index in 0..bytes.len() {
            for mask in [0x01u8, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff] {
                let mut damaged = bytes.clone();
                damaged[index] ^= mask;
                assert!(
                    decode_frame(&damaged, salt).is_err(),
                    "{name}: flip {mask:#04x} at byte {index} went unnoticed"
                );
            }
        }
    }
}

#[test]
fn an_unknown_kind_is_skipped_only_when_skippable() {
    let (bytes, json) = load("frame-unknown-skippable");
    let salt = hex(&json["salt"]);
    check_frame_header(&bytes, &json["frame"], salt);
    let frame = decode_frame(&bytes, salt).expect("valid frame");
    assert_eq!(frame.flags & FLAG_SKIPPABLE, FLAG_SKIPPABLE);
    assert_eq!(frame.payload, text(&json["payload_utf8"]).as_bytes());
    assert_eq!(
        Record::decode(&frame),
        Ok(None),
        "kind is unknown to version 1"
    );

    // In a segment: header, the unknown frame, then a seal at the right offset.
    let segment_with = |frame_bytes: &[u8]| {
        let mut segment = encode_header(9, salt);
        segment.extend_from_slice(frame_bytes);
        let used_bytes = segment.len() as u64;
        Record::Seal {
            used_bytes,
            durable_offset: used_bytes,
        }
        .encode(&mut segment, salt)
        .expect("encode");
        segment
    };
    let segment = segment_with(&bytes);
    let mut seen = Vec::new();
    let scan = scan_frames(&segment, 9, salt, |offset, record| {
        seen.push((offset, record.clone()));
        Ok(())
    })
    .expect("skippable kind is skipped");
    assert!(scan.sealed);
    assert_eq!(scan.valid_end, segment.len() as u64);
    assert_eq!(seen.len(), 1, "only the seal is delivered");
    assert_eq!(seen[0].0, 64 + bytes.len() as u64);

    // The same frame without the skippable bit (checksum recomputed) must be refused.
    let mut required = bytes.clone();
    required[9] = 0;
    let sum = dshdb::storage::frame::checksum(salt, &required[4..]);
    required[0..4].copy_from_slice(&sum.to_le_bytes());
    let segment = segment_with(&required);
    let outcome = scan_frames(&segment, 9, salt, |_, _| Ok(()));
    assert!(
        matches!(
            outcome,
            Err(Error::UnknownRecordKind {
                segment: 9,
                offset: 64,
                kind: 200
            })
        ),
        "{outcome:?}"
    );
}

#[test]
fn segment_header_vector() {
    let (bytes, json) = load("segment-header");
    let id = hex(&json["segment_id"]);
    let salt = hex(&json["salt"]);
    assert_eq!(bytes.len(), 64);
    assert_eq!(&bytes[0..8], text(&json["magic"]).as_bytes());
    let word = |at: usize| {
        u64::from(u32::from_le_bytes(
            bytes[at..at + 4].try_into().expect("4 bytes"),
        ))
    };
    assert_eq!(word(8), uint(&json["version"]));
    assert_eq!(word(12), uint(&json["header_bytes"]));
    assert_eq!(word(60), hex(&json["header_checksum"]));
    assert!(bytes[32..60].iter().all(|byte| *byte == 0), "reserved");
    check_header(&bytes, id, salt).expect("valid header");
    assert_eq!(encode_header(id, salt), bytes, "re-encoding differs");

    assert!(matches!(
        check_header(&bytes, id, salt ^ 1),
        Err(Error::CorruptFile { .. })
    ));
    assert!(matches!(
        check_header(&bytes, id + 1, salt),
        Err(Error::CorruptFile { .. })
    ));
    assert!(matches!(
        check_header(&[0; 64], id, salt),
        Err(Error::CorruptFile { .. })
    ));
    for index in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[index] ^= 0x10;
        assert!(check_header(&damaged, id, salt).is_err(), "flip at {index}");
    }
    // A later version with a valid checksum is refused as a version, not as damage.
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&2u32.to_le_bytes());
    let sum = crc32fast::hash(&newer[..60]);
    newer[60..64].copy_from_slice(&sum.to_le_bytes());
    assert!(matches!(
        check_header(&newer, id, salt),
        Err(Error::UnsupportedVersion {
            found: 2,
            supported: 1,
            ..
        })
    ));
}

fn manifest_from_json(json: &Value) -> Manifest {
    Manifest {
        segments: json["segments"]
            .as_array()
            .expect("segments")
            .iter()
            .map(|entry| SegmentEntry {
                id: hex(&entry["id"]),
                salt: hex(&entry["salt"]),
            })
            .collect(),
        runs: Vec::new(),
        next_segment_id: hex(&json["next_segment_id"]),
    }
}

#[test]
fn manifest_vector() {
    let (bytes, json) = load("manifest");
    let expected = manifest_from_json(&json);
    assert_eq!(&bytes[0..8], text(&json["magic"]).as_bytes());
    assert_eq!(bytes.len(), 28 + 16 * expected.segments.len());
    let stored = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes"));
    assert_eq!(u64::from(stored), hex(&json["checksum"]));
    assert_eq!(Manifest::decode(&bytes).expect("valid manifest"), expected);
    assert_eq!(
        expected.encode().expect("encode"),
        bytes,
        "re-encoding differs"
    );
    for index in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[index] ^= 0x01;
        assert!(Manifest::decode(&damaged).is_err(), "flip at {index}");
    }
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&7u32.to_le_bytes());
    let body = newer.len() - 4;
    let sum = crc32fast::hash(&newer[..body]);
    newer[body..].copy_from_slice(&sum.to_le_bytes());
    assert!(matches!(
        Manifest::decode(&newer),
        Err(Error::UnsupportedVersion { found: 7, .. })
    ));
}

#[test]
fn whole_segment_vectors_scan_to_their_records() {
    for name in SEGMENTS {
        check_segment_scan(name);
    }
}

fn check_segment_scan(name: &str) {
    let (bytes, json) = load(name);
    let id = hex(&json["segment_id"]);
    let salt = hex(&json["salt"]);
    assert_eq!(bytes.len() as u64, uint(&json["file_bytes"]));
    check_header(&bytes, id, salt).expect("valid header");

    let mut seen = Vec::new();
    let scan = scan_frames(&bytes, id, salt, |offset, record| {
        seen.push((offset, record));
        Ok(())
    })
    .expect("clean scan");
    assert_eq!(scan.sealed, json["sealed"].as_bool().expect("bool"));
    assert_eq!(scan.valid_end, bytes.len() as u64);
    assert_eq!(scan.stop, None);

    let expected = json["records"].as_array().expect("records");
    assert_eq!(seen.len(), expected.len());
    let mut encoded = encode_header(id, salt);
    for ((offset, record), want) in seen.iter().zip(expected) {
        assert_eq!(*offset, uint(&want["offset"]), "record offset");
        assert_eq!(encoded.len() as u64, *offset, "records are contiguous");
        let want_record = record_from_json(want);
        assert_eq!(record, &want_record, "{name}: record at {offset}");
        want_record.encode(&mut encoded, salt).expect("encode");
    }
    assert_eq!(encoded, bytes, "{name}: re-encoding the segment differs");
}

#[test]
fn whole_segment_vectors_open_as_a_store() {
    for name in SEGMENTS {
        check_segment_store(name);
    }
}

fn check_segment_store(name: &str) {
    let (bytes, json) = load(name);
    let id = hex(&json["segment_id"]);
    let salt = hex(&json["salt"]);
    let disk = SimStorage::new();
    let manifest = Manifest {
        segments: vec![SegmentEntry { id, salt }],
        runs: Vec::new(),
        next_segment_id: id + 1,
    };
    disk.create_dir("wal").expect("wal");
    let file = disk.open(&segment_path(id), true).expect("segment file");
    file.write_at(&bytes, 0).expect("segment write");
    file.sync_data().expect("segment sync");
    manifest.write(&disk).expect("manifest");

    let options = Options {
        read_only: true,
        create_if_missing: false,
        ..Options::default()
    };
    let store = Store::open_on(Arc::new(disk), options, Path::new("vector")).expect("store opens");
    let report = store.recovery_report();
    assert_eq!(report.torn_tail, None);
    assert_eq!(report.segments_scanned, 1);
    let sessions = json["sessions"].as_array().expect("sessions");
    assert_eq!(store.sessions().len(), sessions.len());
    for session in sessions {
        let id = text(&session["id"]);
        let summary = store.session(id).expect("session exists");
        assert_eq!(summary.header_json, text(&session["header_json"]));
        let want_events = session["json_lines"].as_array().expect("lines").len() as u64;
        assert_eq!(summary.events, want_events, "{name}: length of {id}");
        let lines: Vec<String> = store
            .read(id, 0, u64::MAX)
            .expect("read")
            .iter()
            .map(Event::to_json_line)
            .collect();
        let want: Vec<&str> = session["json_lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(text)
            .collect();
        assert_eq!(lines, want, "{name}: session {id}");
        // Any range reads the same lines, across a fork's seed boundary too.
        for from in 0..=want.len() {
            for to in from..=want.len() {
                let part: Vec<String> = store
                    .read(id, from as u64, to as u64)
                    .expect("read")
                    .iter()
                    .map(Event::to_json_line)
                    .collect();
                assert_eq!(part, want[from..to], "{name}: {id} {from}..{to}");
            }
        }
    }
}

/// Rewrites every `.bin` from its JSON with the engine's encoders.
#[test]
#[ignore = "rewrites format-spec/vectors/*.bin"]
fn regenerate_vectors_with_engine_encoders() {
    let dir = vectors_dir();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(format!("{name}.bin")), bytes).expect("write vector");
    };
    for name in RECORD_FRAMES {
        let json = load_json(name);
        let mut bytes = Vec::new();
        record_from_json(&json["record"])
            .encode(&mut bytes, hex(&json["salt"]))
            .expect("encode");
        write(name, &bytes);
    }
    let json = load_json("frame-row-entry");
    let record = &json["record"];
    let data: Vec<String> = record["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|member| {
            let (prefix, suffix) = (text(&record["prefix"]), text(&record["suffix"]));
            format!("{prefix}{}{suffix}", text(&member["payload"]))
        })
        .collect();
    let mut bytes = Vec::new();
    encode_row_frame(
        &row_members_from_json(record, &data),
        &mut bytes,
        hex(&json["salt"]),
    )
    .expect("encode");
    write("frame-row-entry", &bytes);
    let json = load_json("frame-unknown-skippable");
    let mut bytes = Vec::new();
    dshdb::storage::frame::encode_frame(
        &mut bytes,
        hex(&json["salt"]),
        u8::try_from(uint(&json["frame"]["kind"])).expect("kind"),
        FLAG_SKIPPABLE,
        &[text(&json["payload_utf8"]).as_bytes()],
    )
    .expect("encode");
    write("frame-unknown-skippable", &bytes);
    let json = load_json("segment-header");
    write(
        "segment-header",
        &encode_header(hex(&json["segment_id"]), hex(&json["salt"])),
    );
    write(
        "manifest",
        &manifest_from_json(&load_json("manifest"))
            .encode()
            .expect("encode"),
    );
    for name in SEGMENTS {
        let json = load_json(name);
        let salt = hex(&json["salt"]);
        let mut bytes = encode_header(hex(&json["segment_id"]), salt);
        for record in json["records"].as_array().expect("records") {
            record_from_json(record)
                .encode(&mut bytes, salt)
                .expect("encode");
        }
        write(name, &bytes);
    }
}
