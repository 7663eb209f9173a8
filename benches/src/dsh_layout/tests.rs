//! The packer against DSH's own output, and the generated session against dshdb's DSH
//! validation.

use super::*;
use dshdb_test_support::fixtures;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The fixture directory, or `None` when it is absent (the one skip / `CI=true` rule of
/// `dshdb_test_support::fixtures`).
fn fixture_dir() -> Option<PathBuf> {
    fixtures::present().then(fixtures::directory)
}

type Raw = BTreeMap<String, Box<RawValue>>;

fn raw_object(text: &str) -> Option<Raw> {
    serde_json::from_str(text).ok()
}

fn keys(object: &Raw) -> Vec<&str> {
    object.keys().map(String::as_str).collect()
}

fn string_value(raw: &RawValue) -> Option<String> {
    serde_json::from_str(raw.get()).ok()
}

fn integer(raw: &RawValue) -> Option<i64> {
    raw.get().parse().ok()
}

/// The delta of an event line when DSH's writer may pack it (§2.4 eligibility), checked the
/// way DSH checks it: by exact key sets.
fn eligible_delta(event: &Raw) -> Option<Delta> {
    let mut event_keys = keys(event);
    event_keys.sort_unstable();
    if event_keys != ["data", "seq", "time", "type"]
        || string_value(event.get("type")?)? != "assistant/chunk"
    {
        return None;
    }
    let data = raw_object(event.get("data")?.get())?;
    if keys(&data) != ["chunk", "step", "turn"] {
        return None;
    }
    let chunk = raw_object(data.get("chunk")?.get())?;
    let chunk_keys = keys(&chunk);
    let kind = match string_value(chunk.get("type")?)?.as_str() {
        "text-delta" if chunk_keys == ["index", "text", "type"] => DeltaKind::Text,
        "reasoning-delta" if chunk_keys == ["index", "text", "type"] => DeltaKind::Reasoning,
        "tool-call-delta"
            if chunk_keys == ["argumentsDelta", "id", "index", "type"]
                || chunk_keys == ["argumentsDelta", "id", "index", "name", "type"] =>
        {
            DeltaKind::ToolCall {
                id: chunk.get("id")?.get().to_owned(),
                name: chunk.get("name").map(|name| name.get().to_owned()),
            }
        }
        _ => return None,
    };
    let payload_key = if matches!(kind, DeltaKind::ToolCall { .. }) {
        "argumentsDelta"
    } else {
        "text"
    };
    Some(Delta {
        turn: data.get("turn")?.get().to_owned(),
        step: data.get("step")?.get().to_owned(),
        index: chunk.get("index")?.get().to_owned(),
        kind,
        payload: chunk.get(payload_key)?.get().to_owned(),
    })
}

/// A DSH-written packed row expanded into its member deltas (their unpacked line left empty:
/// the packer must pack them again).
fn row_members(row: &Raw) -> Option<Vec<StorageEvent>> {
    let kind_tag = string_value(row.get("type")?)?;
    let data = raw_object(row.get("data")?.get())?;
    let kind = match kind_tag.as_str() {
        "text-chunks" => DeltaKind::Text,
        "reasoning-chunks" => DeltaKind::Reasoning,
        "tool-call-chunks" => DeltaKind::ToolCall {
            id: data.get("id")?.get().to_owned(),
            name: data.get("name").map(|name| name.get().to_owned()),
        },
        _ => return None,
    };
    let payload_key = if matches!(kind, DeltaKind::ToolCall { .. }) {
        "args"
    } else {
        "texts"
    };
    let payloads: Vec<Box<RawValue>> = serde_json::from_str(data.get(payload_key)?.get()).ok()?;
    let gaps: Vec<i64> = serde_json::from_str(data.get("dt")?.get()).ok()?;
    let (seq0, mut time) = (integer(row.get("seq0")?)?, integer(row.get("time0")?)?);
    let mut members = Vec::new();
    for (offset, payload) in payloads.iter().enumerate() {
        if offset > 0 {
            time += gaps.get(offset - 1)?;
        }
        members.push(StorageEvent {
            seq: u64::try_from(seq0).ok()? + offset as u64,
            time,
            line: String::new(),
            delta: Some(Delta {
                turn: data.get("turn")?.get().to_owned(),
                step: data.get("step")?.get().to_owned(),
                index: data.get("index")?.get().to_owned(),
                kind: kind.clone(),
                payload: payload.get().to_owned(),
            }),
        });
    }
    Some(members)
}

/// The events of a DSH-written log's record lines, as the writer had them before packing.
fn expanded_events(records: &str) -> Vec<StorageEvent> {
    let mut events = Vec::new();
    for line in records.lines() {
        let object = raw_object(line).unwrap_or_else(|| panic!("fixture line is JSON: {line}"));
        if let Some(members) = row_members(&object) {
            events.extend(members);
            continue;
        }
        events.push(StorageEvent {
            seq: object
                .get("seq")
                .and_then(|seq| integer(seq))
                .map_or(0, |seq| seq as u64),
            time: object
                .get("time")
                .and_then(|time| integer(time))
                .unwrap_or(0),
            line: line.to_owned(),
            delta: eligible_delta(&object),
        });
    }
    events
}

#[test]
fn packer_reproduces_the_dsh_written_fixtures_byte_for_byte() {
    let Some(dir) = fixture_dir() else {
        return;
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixture directory is readable")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("");
            // DSH's JSONL backend wrote these (one batch each); `syn-*` are hand-written.
            name.ends_with(".session.input.jsonl") || name.ends_with(".seed.input.jsonl")
        })
        .collect();
    names.sort();
    let mut rows = 0;
    let mut cases = 0;
    for path in names {
        let text = std::fs::read_to_string(&path).expect("fixture is UTF-8");
        let Some((_, records)) = text.split_once('\n') else {
            continue;
        };
        let events = expanded_events(records);
        let mut packed = Vec::new();
        let counts = pack_batch(&events, &mut packed);
        assert!(
            packed == records.as_bytes(),
            "{}: packing its expanded events differs from DSH's file",
            path.display()
        );
        rows += counts.rows;
        cases += 1;
    }
    assert!(cases >= 15, "{cases} DSH-written fixtures");
    assert!(rows >= 60, "{rows} packed rows in the fixtures");
}

/// Member keys of a generated row line in order, top level and `data`.
fn row_key_order(line: &str) -> (Vec<String>, Vec<String>) {
    let value: serde_json::Value = serde_json::from_str(line).expect("row is JSON");
    let top = value.as_object().expect("row is an object");
    let data = top["data"].as_object().expect("row data is an object");
    (
        top.keys().cloned().collect(),
        data.keys().cloned().collect(),
    )
}

#[test]
fn generated_rows_have_dsh_row_layout_and_cover_every_seq() {
    let layout = generate(11, 30_000);
    let text = std::str::from_utf8(&layout.jsonl).expect("UTF-8");
    let mut lines = text.lines();
    let _header = lines.next();
    let mut next_seq = 0u64;
    let mut rows = 0;
    for line in lines {
        let object = raw_object(line).expect("line is JSON");
        if let Some(members) = row_members(&object) {
            rows += 1;
            assert!(members.len() >= MIN_RUN, "short row {line}");
            let (top, data) = row_key_order(line);
            assert_eq!(top, ["type", "seq0", "time0", "data"]);
            let expected: &[&str] = if line.starts_with("{\"type\":\"tool-call-chunks\"") {
                &["turn", "step", "index", "dt", "id", "name", "args"]
            } else {
                &["turn", "step", "index", "dt", "texts"]
            };
            assert_eq!(data, expected);
            for member in members {
                assert_eq!(member.seq, next_seq);
                next_seq += 1;
            }
        } else {
            let seq = object.get("seq").and_then(|seq| integer(seq));
            assert_eq!(seq, Some(next_seq as i64), "{line}");
            next_seq += 1;
        }
    }
    assert_eq!(next_seq, layout.events);
    assert_eq!(rows, layout.rows);
    assert!(layout.events >= 30_000);
    // Every batch starts at a line start, and packing split rows only at batch ends.
    for start in &layout.batch_starts[1..] {
        assert_eq!(layout.jsonl[start - 1], b'\n');
    }
    // Mostly packed: the layout the issue measures (about 28 members per row).
    let members_per_row = (layout.events as f64) / (layout.rows as f64);
    assert!(members_per_row > 10.0, "{members_per_row} events per row");
}

#[test]
fn generation_is_reproducible() {
    let a = generate(5, 5_000);
    let b = generate(5, 5_000);
    assert!(a.jsonl == b.jsonl);
    assert_eq!(a.batch_starts, b.batch_starts);
    let c = generate(6, 5_000);
    assert!(a.jsonl != c.jsonl);
}

#[test]
fn generated_session_is_dsh_valid_and_round_trips_through_dshdb() {
    let layout = generate(3, 20_000);
    let zstd_file = layout.zstd().expect("compress");
    let dir = std::env::temp_dir().join(format!("dshdb-dsh-layout-{}", std::process::id()));
    for zstd in [false, true] {
        let _ = std::fs::remove_dir_all(&dir);
        let store = dshdb::Store::open(&dir, dshdb::Options::default()).expect("open");
        let report = if zstd {
            dshdb::exchange::import_dsh_jsonl_zstd(&store, &zstd_file)
        } else {
            dshdb::exchange::import_dsh_jsonl(&store, &layout.jsonl)
        }
        .expect("DSH-valid");
        assert_eq!(report.events, layout.events);
        assert_eq!(report.rows, layout.rows);
        assert_eq!(report.lines, layout.lines);
        assert_eq!(report.dropped, None);
        let exported = dshdb::exchange::export_dsh_jsonl(&store, SESSION_ID).expect("export");
        assert!(
            exported == layout.jsonl,
            "export differs from the generated JSONL"
        );
        if zstd {
            assert_eq!(report.frames, layout.frames() as u64);
            let again = dshdb::exchange::export_dsh_jsonl_zstd(&store, SESSION_ID).expect("export");
            let plain = zstd::decode_all(again.as_slice()).expect("decompress");
            assert!(plain == layout.jsonl);
        }
        let messages = dshdb::derive::messages(&store, SESSION_ID).expect("messages");
        assert!(messages.len() > 20, "{} messages", messages.len());
        drop(store);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The full-size session's figures (slow; `cargo test --release -p dshdb-benches --lib
/// dsh_layout::tests::full_size -- --ignored --nocapture`).
#[test]
#[ignore]
fn full_size() {
    let layout = generate(0xD5D8_2026, 1_300_000);
    let zstd_file = layout.zstd().expect("compress");
    println!(
        "events {} lines {} rows {} jsonl {:.1} MB zstd {:.1} MB frames {}",
        layout.events,
        layout.lines,
        layout.rows,
        layout.jsonl.len() as f64 / 1e6,
        zstd_file.len() as f64 / 1e6,
        layout.frames()
    );
}
