//! DSH exchange: every case in `shared/fixtures/dsh` imports (or is refused with DSH's text,
//! leaving nothing behind), exports back byte for byte (minus the reported discardable tail),
//! round-trips through `session.jsonl.zstd` with the same frames, and derives DSH's messages
//! and surface.

use crate::common::dsh_fixtures;

use dsh_fixtures::*;

use crate::common;

use common::*;
use dshdb::derive::{message_texts as messages, repair, resume, surface};
use dshdb::exchange::{
    export_dsh_jsonl, export_dsh_jsonl_zstd, import_dsh_jsonl, import_dsh_jsonl_zstd, ExchangeError,
};
use dshdb::session::json::value_lossy;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{Options, Store};
use std::fs;

fn new_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(&SimStorage::new(), options).expect("open sim store")
}

/// The header id of an input (for the refusal check).
fn input_id(bytes: &[u8]) -> String {
    let end = bytes
        .iter()
        .position(|byte| *byte == b'\n')
        .expect("header");
    let header = value_lossy(&String::from_utf8_lossy(&bytes[..end])).expect("header JSON");
    header["id"].as_str().expect("header id").to_owned()
}

/// Compresses a DSH plaintext the way DSH writes it: frame 1 = the header line, then one
/// frame per batch of `lines_per_frame` lines. Returns the file and its frame count.
fn dsh_zstd(plain: &[u8], lines_per_frame: usize) -> (Vec<u8>, usize) {
    let mut parts: Vec<&[u8]> = Vec::new();
    let mut rest = plain;
    while let Some(end) = rest.iter().position(|byte| *byte == b'\n') {
        parts.push(&rest[..=end]);
        rest = &rest[end + 1..];
    }
    assert!(rest.is_empty(), "plaintext ends with a newline");
    let mut frames: Vec<Vec<u8>> = vec![parts[0].to_vec()];
    for group in parts[1..].chunks(lines_per_frame) {
        frames.push(group.concat());
    }
    let mut out = Vec::new();
    for frame in &frames {
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).expect("encoder");
        encoder.include_checksum(true).expect("checksum flag");
        std::io::Write::write_all(&mut encoder, frame).expect("compress");
        out.extend(encoder.finish().expect("finish"));
    }
    (out, frames.len())
}

fn frame_plaintexts(file: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at < file.len() {
        let size = zstd::zstd_safe::find_frame_compressed_size(&file[at..]).expect("whole frame");
        assert_eq!(file[at + 4] & 0x04, 0x04, "frame carries a checksum");
        frames.push(zstd::stream::decode_all(&file[at..at + size]).expect("frame decodes"));
        at += size;
    }
    frames
}

#[test]
fn refused_fixtures_fail_with_dsh_text_and_write_nothing() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        let Some(report) = read_optional(&name, "error.txt") else {
            continue;
        };
        let expected = dsh_error_message(&report);
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input");
        let store = new_store();
        let error = import_dsh_jsonl(&store, &bytes).expect_err(&format!("{name}: DSH refused it"));
        assert!(
            matches!(error, ExchangeError::Refused(_) | ExchangeError::Session(_)),
            "{name}: typed refusal, got {error:?}"
        );
        let message = error.to_string();
        let backend_suffix = expected
            .strip_prefix(&message)
            .filter(|rest| rest.starts_with(" (raw log: "));
        assert!(
            message == expected || backend_suffix.is_some(),
            "{name}:\n  ours: {message}\n  dsh:  {expected}"
        );
        assert!(
            store.sessions().is_empty(),
            "{name}: refusal wrote a session"
        );
        assert!(store.session(&input_id(&bytes)).is_err(), "{name}");
        checked += 1;
    }
    assert_eq!(checked, 4, "the four refused cases");
}

#[test]
fn accepted_fixtures_round_trip_byte_for_byte() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    let mut torn = 0;
    for name in case_names() {
        if read_optional(&name, "error.txt").is_some() {
            continue;
        }
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input");
        let store = new_store();
        let report = import_dsh_jsonl(&store, &bytes)
            .unwrap_or_else(|error| panic!("{name}: import failed: {error}"));
        let kept = match &report.dropped {
            Some(tail) => {
                torn += 1;
                assert_eq!(tail.offset + tail.bytes, bytes.len() as u64, "{name}");
                assert!(!tail.reason.is_empty(), "{name}");
                tail.offset as usize
            }
            None => bytes.len(),
        };
        let exported = export_dsh_jsonl(&store, &report.session_id).expect("export");
        assert!(
            exported == bytes[..kept],
            "{name}: export differs from input at byte {:?}",
            exported
                .iter()
                .zip(&bytes[..kept])
                .position(|(a, b)| a != b)
                .or(Some(exported.len().min(kept)))
        );
        assert_eq!(
            store.session(&report.session_id).expect("session").events,
            report.events,
            "{name}"
        );
        // A store reopened from the same disk exports the same bytes.
        checked += 1;
    }
    assert_eq!(checked, 25, "every accepted case");
    assert_eq!(torn, 2, "the two cases with a discardable tail");
}

#[test]
fn torn_tails_are_reported_with_dsh_byte_counts() {
    if !dsh_fixtures::present() {
        return;
    }
    for (name, dropped) in [("syn-crash-torn-open-turn", 99), ("syn-unicode-crlf", 1)] {
        let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input");
        let report = import_dsh_jsonl(&new_store(), &bytes).expect("import");
        let tail = report.dropped.expect("tail reported");
        assert_eq!(tail.bytes, dropped, "{name}");
    }
    // Lines that do not re-render (CRLF, duplicate keys, invalid UTF-8) were kept verbatim,
    // and unusual packed rows too.
    for (name, rows) in [("syn-unicode-crlf", 0), ("syn-packed-chunks", 1)] {
        let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input");
        let report = import_dsh_jsonl(&new_store(), &bytes).expect("import");
        assert!(report.verbatim > 0, "{name}: {report:?}");
        assert!(report.rows >= rows, "{name}: {report:?}");
    }
}

#[test]
fn accepted_fixtures_round_trip_through_zstd_frames() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        if read_optional(&name, "error.txt").is_some() {
            continue;
        }
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input");
        let committed = import_dsh_jsonl(&new_store(), &bytes)
            .expect("plain import")
            .dropped
            .map_or(bytes.len(), |tail| tail.offset as usize);
        let plain = &bytes[..committed];
        let (file, frame_count) = dsh_zstd(plain, 3);
        let store = new_store();
        let report = import_dsh_jsonl_zstd(&store, &file)
            .unwrap_or_else(|error| panic!("{name}: zstd import failed: {error}"));
        assert_eq!(report.frames as usize, frame_count, "{name}");
        assert!(report.dropped.is_none(), "{name}");
        let exported = export_dsh_jsonl_zstd(&store, &report.session_id).expect("export");
        let ours = frame_plaintexts(&exported);
        let theirs = frame_plaintexts(&file);
        assert_eq!(ours.len(), frame_count, "{name}: frame count");
        assert!(ours == theirs, "{name}: frame plaintexts differ");
        assert!(ours.concat() == plain, "{name}: plaintext differs");
        assert!(
            export_dsh_jsonl(&store, &report.session_id).expect("jsonl") == plain,
            "{name}"
        );
        checked += 1;
    }
    assert_eq!(checked, 25);
}

#[test]
fn zstd_torn_final_frame_recovers_complete_lines() {
    if !dsh_fixtures::present() {
        return;
    }
    let bytes = fs::read(fixture_path("fresh-round-trip.session", "input.jsonl")).expect("input");
    let (mut file, _) = dsh_zstd(&bytes, 5);
    let whole = file.len();
    file.truncate(whole - 3);
    let report = import_dsh_jsonl_zstd(&new_store(), &file).expect("torn frame tolerated");
    assert!(report.events > 0);
    // A damaged magic is corruption, not a torn tail.
    let (mut bad, _) = dsh_zstd(&bytes, 5);
    let second = zstd::zstd_safe::find_frame_compressed_size(&bad).expect("frame 1");
    bad[second] ^= 0xFF;
    let error = import_dsh_jsonl_zstd(&new_store(), &bad).expect_err("bad magic");
    assert_eq!(
        error.to_string(),
        format!("corrupt Zstandard session log: invalid frame magic at byte {second}")
    );
}

#[test]
fn derived_views_match_dsh() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        let (Some(dsh_messages), Some(dsh_surface)) = (
            read_optional(&name, "messages.json"),
            read_optional(&name, "surface.json"),
        ) else {
            continue;
        };
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input");
        let store = new_store();
        let report = import_dsh_jsonl(&store, &bytes).expect("import");
        let texts = messages(&store, &report.session_id).expect("messages");
        let ours = value_lossy(&format!("[{}]", texts.join(","))).expect("messages parse");
        let theirs = value_lossy(&dsh_messages).expect("messages.json");
        assert_eq!(
            js_normalized(&ours),
            js_normalized(&theirs),
            "{name}: messages"
        );
        let ours = surface(&store, &report.session_id).expect("surface");
        let theirs = value_lossy(&dsh_surface).expect("surface.json");
        assert_eq!(
            js_normalized(&ours),
            js_normalized(&theirs),
            "{name}: surface"
        );
        checked += 1;
    }
    assert_eq!(checked, 25);
}

#[test]
fn repair_appends_dsh_closers_once() {
    if !dsh_fixtures::present() {
        return;
    }
    let name = "syn-crash-torn-open-turn";
    let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input");
    let store = new_store();
    let report = import_dsh_jsonl(&store, &bytes).expect("import");
    assert_eq!(repair(&store, &report.session_id).expect("repair"), 4);
    assert_eq!(repair(&store, &report.session_id).expect("repair again"), 0);
    let exported = export_dsh_jsonl(&store, &report.session_id).expect("export");
    let disk = fs::read(fixture_path(name, "disk-after-load.jsonl")).expect("disk-after-load");
    assert!(
        exported == disk,
        "repaired export equals DSH's repaired file"
    );
}

/// The stored events of a session as (type, seq, data) triples.
fn stored(store: &Store, id: &str) -> Vec<(String, u64, String)> {
    store
        .read(id, 0, u64::MAX)
        .expect("read")
        .into_iter()
        .map(|event| (event.event_type, event.seq, event.data))
        .collect()
}

#[test]
fn resume_after_a_power_cut_closes_the_open_turn_durably_and_seeds_the_next_batch() {
    if !dsh_fixtures::present() {
        return;
    }
    let name = "syn-crash-torn-open-turn";
    let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input");
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let id = import_dsh_jsonl(&store, &bytes).expect("import").session_id;
    let imported = stored(&store, &id);
    drop(store);

    // Cold open after a power cut: the resume appends the closers before anything else.
    let disk = SimStorage::from_image(&disk.durable_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    let mut resumed = resume(&store, &id).expect("resume");
    assert_eq!(resumed.closers_appended(), 4);
    assert!(matches!(
        store.writer(&id),
        Err(dshdb::Error::SessionBusy { .. })
    ));
    let repaired = stored(&store, &id);
    assert_eq!(repaired.len(), imported.len() + 4);
    assert_eq!(
        repaired.last().map(|event| event.0.as_str()),
        Some("turn/end")
    );
    let marker_seq = resumed.next_seq() - 1;
    assert_eq!(marker_seq, repaired.len() as u64);

    // The closers are durable on their own: cut power again before any live append.
    let disk = SimStorage::from_image(&disk.durable_image());
    drop(resumed);
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen again");
    assert_eq!(stored(&store, &id), repaired);
    let exported = export_dsh_jsonl(&store, &id).expect("export");
    let dsh_repaired = fs::read(fixture_path(name, "disk-after-load.jsonl")).expect("disk");
    assert!(exported == dsh_repaired, "repaired bytes equal DSH's");

    // A session closed cleanly needs no closers; the first live batch carries the end-seed.
    resumed = resume(&store, &id).expect("resume a closed session");
    assert_eq!(resumed.closers_appended(), 0);
    let live = [dshdb::store::NewEvent::new("turn/start", r#"{"turn":9}"#)];
    let receipt = resumed.append_batch(&live).expect("live append");
    assert_eq!(receipt.first_seq, repaired.len() as u64);
    let after = stored(&store, &id);
    assert_eq!(after.len(), repaired.len() + 2);
    assert_eq!(after[repaired.len()].0, "session/end-seed");
    assert_eq!(after[repaired.len()].2, "{}");
    assert_eq!(after[repaired.len() + 1].0, "turn/start");
    // Later batches of the same lifecycle carry no second marker.
    let more = [dshdb::store::NewEvent::new(
        "turn/end",
        r#"{"turn":9,"reason":{"kind":"completed"}}"#,
    )];
    resumed.append_batch(&more).expect("second live append");
    assert_eq!(stored(&store, &id).len(), repaired.len() + 3);
}

#[test]
fn resume_of_a_log_dsh_refuses_writes_nothing() {
    let store = new_store();
    let mut writer = store.create_session_with_id("bad").expect("create");
    writer
        .append(dshdb::store::NewEvent::new("no/such-type", "{}"))
        .expect("raw append");
    drop(writer);
    let before = stored(&store, "bad");
    assert!(matches!(
        resume(&store, "bad"),
        Err(ExchangeError::Session(_))
    ));
    assert_eq!(stored(&store, "bad"), before);
    assert!(
        store.writer("bad").is_ok(),
        "the failed resume released the writer"
    );
}

#[test]
fn an_import_larger_than_a_segment_is_atomic_at_every_crash_point() {
    if !dsh_fixtures::present() {
        return;
    }
    // 88 KB of DSH log into 4 KiB segments: one batch in a segment of its own.
    let name = "goal-multi-turn-actions.session";
    let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input");
    let import = |disk: &SimStorage| -> Option<String> {
        let store = open_sim(disk, sim_options(Durability::Sync)).ok()?;
        import_dsh_jsonl(&store, &bytes)
            .ok()
            .map(|report| report.session_id)
    };
    let reference = SimStorage::new();
    let id = import(&reference).expect("import");
    let operations = reference.operation_count();
    let mut images = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let acknowledged = import(&disk).is_some();
        let mut cut_images = disk.take_images();
        cut_images.push(disk.durable_image());
        for image in &cut_images {
            let Ok(store) = open_sim(
                &SimStorage::from_image(image),
                sim_options(Durability::Sync),
            ) else {
                panic!("cut {cut}: the store does not reopen");
            };
            match store.session(&id) {
                Ok(_) => {
                    let exported = export_dsh_jsonl(&store, &id).expect("export");
                    assert!(exported == bytes, "cut {cut}: a partial import survived");
                }
                Err(_) => assert!(!acknowledged, "cut {cut}: an acknowledged import is lost"),
            }
            images += 1;
        }
    }
    assert!(images > operations, "checked {images} images");
}

#[test]
fn native_sessions_export_a_dsh_header() {
    let store = new_store();
    let mut writer = store.create_session_with_id("native").expect("create");
    writer
        .append(dshdb::store::NewEvent {
            time: Some(5),
            ..dshdb::store::NewEvent::new("turn/start", r#"{"turn":1}"#)
        })
        .expect("append");
    let exported =
        String::from_utf8(export_dsh_jsonl(&store, "native").expect("export")).expect("utf8");
    let mut lines = exported.lines();
    let header = lines.next().expect("header");
    assert!(header.starts_with(r#"{"type":"session","version":0,"id":"native","createdAt":"#));
    assert!(header.ends_with(r#","delegationDepth":0}"#));
    assert_eq!(
        lines.next(),
        Some(r#"{"type":"turn/start","seq":0,"time":5,"data":{"turn":1}}"#)
    );
    let again = new_store();
    let report = import_dsh_jsonl(&again, exported.as_bytes()).expect("re-import");
    assert_eq!(report.events, 1);
}

/// Lines in DSH's own layout are split into fields by reading the envelope off the text; lines
/// with other spacing or another field order must still export byte for byte (stored verbatim,
/// not split wrongly).
#[test]
fn envelope_fast_path_keeps_odd_lines_exact() {
    let lines = [
        r#"{"type":"session","version":0,"id":"envelope-odd","createdAt":1786073817152,"cwd":"/p","delegationDepth":0}"#,
        r#"{"type":"user/message","seq":0,"time":2,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
        r#"{"type":"turn/start","seq":1,"time":3,"data":{"turn":1} }"#,
        r#"{"type":"step/start","seq":2,"time":4,"data":{"turn":1,"step":1}}"#,
        r#"{"type":"step/end","data":{"turn":1,"step":1},"seq":3,"time":5}"#,
        r#"{"type":"turn/end","seq":4,"time":6,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
    ];
    let input = format!("{}\n", lines.join("\n"));
    let store = new_store();
    let report = dshdb::exchange::import_dsh_jsonl(&store, input.as_bytes()).expect("import");
    assert_eq!(report.events, 5);
    // The two odd lines (a space before the brace, data before seq) are kept verbatim.
    assert_eq!(report.verbatim, 2);
    let exported = dshdb::exchange::export_dsh_jsonl(&store, "envelope-odd").expect("export");
    assert_eq!(String::from_utf8_lossy(&exported), input);
    let events = store.read("envelope-odd", 0, 5).expect("read");
    assert_eq!(events[0].envelope, r#""surfaceOp":"append""#);
    assert_eq!(events[4].envelope, "");
}
