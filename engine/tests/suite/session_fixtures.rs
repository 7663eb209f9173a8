//! DSH conformance: every case in `shared/fixtures/dsh` is cold-loaded through the session
//! model and compared with what DSH itself derived (surface, messages, events, repair,
//! rejections). The JSONL scan (header line, packed chunk rows, torn tail) belongs to the
//! storage layer; a minimal copy of DSH's scanner lives here only to feed the model.

use crate::common::dsh_fixtures;

use dsh_fixtures::*;

use dshdb::session::json::{js_safe_integer, value_lossy};
use dshdb::session::{
    fold_surface, parse_event_line, restore_session, KeyOrder, SessionEvent, SurfaceFold,
};
use serde_json::Value;
use std::fs;

fn read_json(name: &str, suffix: &str) -> Option<Value> {
    read_optional(name, suffix).map(|text| value_lossy(&text).expect("fixture JSON parses"))
}

/// The logical log of a DSH JSONL file: header id and committed events.
struct ScannedLog {
    session_id: String,
    events: Vec<SessionEvent>,
}

/// DSH's `SessionLogScanner` (persistence §5.2), reduced to what these fixtures need.
fn scan_log(bytes: &[u8]) -> Result<ScannedLog, String> {
    let header_end = bytes
        .iter()
        .position(|byte| *byte == b'\n')
        .ok_or("empty or header-less session log")?;
    let header = value_lossy(&String::from_utf8_lossy(&bytes[..header_end]))
        .map_err(|_| "corrupt session log: header line is not valid JSON".to_owned())?;
    let session_id =
        header_id(&header).ok_or("corrupt session log: first line is not a session header")?;
    let mut events: Vec<SessionEvent> = Vec::new();
    let mut issue: Option<String> = None;
    let mut rest = &bytes[header_end + 1..];
    let mut line_number = 0;
    while let Some(end) = rest.iter().position(|byte| *byte == b'\n') {
        line_number += 1;
        let decoded = decode_record(&String::from_utf8_lossy(&rest[..end]));
        rest = &rest[end + 1..];
        let has_turn_end =
            |row: &[SessionEvent]| row.iter().any(|event| event.event_type == "turn/end");
        match (decoded, &issue) {
            (Ok(row), Some(issue)) if has_turn_end(&row) => return Err(issue.clone()),
            (_, Some(_)) => {}
            (Err(()), None) => {
                issue = Some(format!(
                    "corrupt session log: unparsable committed event at line {line_number}"
                ))
            }
            (Ok(row), None) => {
                let expected = events.len() as u64;
                if let Some(bad) = row
                    .iter()
                    .enumerate()
                    .find(|(offset, event)| event.seq != expected + *offset as u64)
                {
                    let gap = format!("corrupt session log: seq gap in committed region at line {line_number} (expected {}, got {})", expected + bad.0 as u64, bad.1.seq);
                    return if has_turn_end(&row) {
                        Err(gap)
                    } else {
                        Ok(ScannedLog { session_id, events })
                    };
                }
                events.extend(row);
            }
        }
    }
    Ok(ScannedLog { session_id, events })
}

/// `isHeaderLine` (persistence §2.3).
fn header_id(header: &Value) -> Option<String> {
    let non_negative = |key: &str| {
        header
            .get(key)
            .and_then(|value| js_safe_integer(&value.to_string()))
            .is_some_and(|value| value >= 0)
    };
    let optional_string = |key: &str| header.get(key).is_none_or(Value::is_string);
    let origin_ok = header
        .get("origin")
        .is_none_or(|origin| origin == "subagent");
    let valid = header.get("type") == Some(&Value::from("session"))
        && header.get("version").is_some_and(Value::is_number)
        && non_negative("createdAt")
        && non_negative("delegationDepth")
        && origin_ok
        && optional_string("agentPreset");
    valid
        .then(|| header.get("id")?.as_str().map(str::to_owned))
        .flatten()
}

/// `decodeStorageRecord`: a plain event, or a packed chunk row expanded to its members.
fn decode_record(line: &str) -> Result<Vec<SessionEvent>, ()> {
    let value = value_lossy(line).map_err(|_| ())?;
    let tag = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match tag {
        "text-chunks" | "reasoning-chunks" | "tool-call-chunks" => expand_row(tag, &value),
        _ => parse_event_line(line)
            .map(|event| vec![event])
            .map_err(|_| ()),
    }
}

fn expand_row(tag: &str, row: &Value) -> Result<Vec<SessionEvent>, ()> {
    let number = |value: Option<&Value>| {
        value
            .and_then(|value| js_safe_integer(&value.to_string()))
            .ok_or(())
    };
    let data = row.get("data").ok_or(())?;
    let (seq0, mut time) = (number(row.get("seq0"))?, number(row.get("time0"))?);
    let members_key = if tag == "tool-call-chunks" {
        "args"
    } else {
        "texts"
    };
    let members = data.get(members_key).and_then(Value::as_array).ok_or(())?;
    let gaps = data.get("dt").and_then(Value::as_array).ok_or(())?;
    if gaps.len() + 1 != members.len() {
        return Err(());
    }
    let mut events = Vec::with_capacity(members.len());
    for (offset, member) in members.iter().enumerate() {
        if offset > 0 {
            time += number(gaps.get(offset - 1))?;
        }
        let chunk = chunk_json(tag, data, member);
        let text = format!(
            r#"{{"type":"assistant/chunk","seq":{},"time":{time},"data":{{"turn":{},"step":{},"chunk":{chunk}}}}}"#,
            seq0 + offset as i64,
            data["turn"],
            data["step"]
        );
        events.push(parse_event_line(&text).map_err(|_| ())?);
    }
    Ok(events)
}

fn chunk_json(tag: &str, data: &Value, member: &Value) -> String {
    let index = &data["index"];
    match tag {
        "tool-call-chunks" => {
            let name = data
                .get("name")
                .map(|name| format!(r#","name":{name}"#))
                .unwrap_or_default();
            format!(
                r#"{{"type":"tool-call-delta","index":{index},"id":{}{name},"argumentsDelta":{member}}}"#,
                data["id"]
            )
        }
        "reasoning-chunks" => {
            format!(r#"{{"type":"reasoning-delta","index":{index},"text":{member}}}"#)
        }
        _ => format!(r#"{{"type":"text-delta","index":{index},"text":{member}}}"#),
    }
}

fn assert_same_json(actual: &Value, expected: &Value, context: &str) {
    assert_eq!(js_normalized(actual), js_normalized(expected), "{context}");
}

fn event_value(event: &SessionEvent) -> Value {
    value_lossy(&event.to_json_line(KeyOrder::LiveAppend)).expect("rendered event parses")
}

fn fixed_now(name: &str) -> i64 {
    let meta = read_json(name, "meta.json");
    meta.and_then(|meta| meta.get("fixedNow")?.as_i64())
        .unwrap_or(1_790_000_000_000)
}

#[test]
fn fixture_directory_has_every_case() {
    if !dsh_fixtures::present() {
        return;
    }
    let names = case_names();
    assert!(
        names.len() >= 29,
        "expected the 29 DSH cases, found {}",
        names.len()
    );
}

#[test]
fn rejected_fixtures_fail_with_dsh_text() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        let Some(report) = read_optional(&name, "error.txt") else {
            continue;
        };
        let expected = dsh_error_message(&report);
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input is readable");
        let actual = scan_log(&bytes).and_then(|log| {
            restore_session(&log.session_id, &log.events, fixed_now(&name))
                .map(|_| ())
                .map_err(|error| error.to_string())
        });
        let message = actual.expect_err(&format!("{name}: DSH rejected this log"));
        // DSH's JSONL backend appends the artifact location to format refusals.
        let backend_suffix = expected
            .strip_prefix(&message)
            .filter(|rest| rest.starts_with(" (raw log: "));
        assert!(
            message == expected || backend_suffix.is_some(),
            "{name}:\n  ours: {message}\n  dsh:  {expected}"
        );
        checked += 1;
    }
    assert_eq!(checked, 4, "the four rejected cases");
}

#[test]
fn upstream_replay_scripts_are_not_logs() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        let (Some(report), Ok(bytes)) = (
            read_optional(&name, "fixture-scan.error.txt"),
            fs::read(fixture_path(&name, "fixture.jsonl")),
        ) else {
            continue;
        };
        let error = scan_log(&bytes).err();
        assert_eq!(
            error.as_deref(),
            Some(dsh_error_message(&report).as_str()),
            "{name}"
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} replay scripts checked");
}

#[test]
fn loaded_fixtures_match_dsh_derivations() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut checked = 0;
    for name in case_names() {
        let Some(surface) = read_json(&name, "surface.json") else {
            continue;
        };
        check_loaded_case(&name, &surface);
        checked += 1;
    }
    assert_eq!(checked, 25, "every accepted case has DSH derivations");
}

fn check_loaded_case(name: &str, dsh_surface: &Value) {
    let bytes = fs::read(fixture_path(name, "input.jsonl")).expect("input is readable");
    let log = scan_log(&bytes).unwrap_or_else(|error| panic!("{name}: scan failed: {error}"));
    let decoded = read_json(name, "decoded.json").expect("decoded.json exists");
    let ours: Vec<Value> = log.events.iter().map(event_value).collect();
    assert_same_json(
        &Value::Array(ours),
        &decoded,
        &format!("{name}: decoded events"),
    );

    let restored = restore_session(&log.session_id, &log.events, fixed_now(name))
        .unwrap_or_else(|error| panic!("{name}: DSH accepted this log but we reject it: {error}"));
    let events: Vec<Value> = restored.events.iter().map(event_value).collect();
    let dsh_events = read_json(name, "events.json").expect("events.json exists");
    assert_same_json(
        &Value::Array(events),
        &dsh_events,
        &format!("{name}: loaded events"),
    );

    let fold = fold_surface(&restored.events).expect("restored log folds");
    let replacements: Vec<Value> = fold.replacements.iter().map(|replacement| {
        serde_json::json!({"seq": replacement.seq, "start": replacement.start, "end": replacement.end, "shadowedSeqs": replacement.shadowed_seqs})
    }).collect();
    let surface = serde_json::json!({
        "nodes": restored.surface.nodes(),
        "replaceGeneration": restored.surface.replace_generation(),
        "foldSurface": {"nodes": fold.nodes, "replacements": replacements},
    });
    assert_same_json(&surface, dsh_surface, &format!("{name}: surface"));

    let messages = Value::Array(restored.surface.derive_messages());
    let dsh_messages = read_json(name, "messages.json").expect("messages.json exists");
    assert_same_json(&messages, &dsh_messages, &format!("{name}: messages"));

    check_meta(name, &restored);
    check_repair_bytes(name, log.events.len(), &restored.closers);
}

fn check_meta(name: &str, restored: &dshdb::session::RestoredSession) {
    let meta = read_json(name, "meta.json").expect("meta.json exists");
    let migrated = serde_json::json!(restored.migrated_seqs);
    assert_same_json(
        &migrated,
        &meta["migratedSeqs"],
        &format!("{name}: migrated seqs"),
    );
    assert_eq!(
        meta["firstLiveSeq"].as_u64(),
        Some(restored.first_live_seq),
        "{name}: firstLiveSeq"
    );
    let appended: Vec<Value> = restored
        .closers
        .iter()
        .map(|closer| serde_json::json!({"seq": closer.seq, "type": closer.event_type}))
        .collect();
    assert_same_json(
        &Value::Array(appended),
        &meta["repair"]["appendedEvents"],
        &format!("{name}: repair"),
    );
}

/// Where DSH wrote closers to disk, ours must be the same bytes in DSH's closer key order.
fn check_repair_bytes(name: &str, stored_count: usize, closers: &[SessionEvent]) {
    let Some(disk) = read_optional(name, "disk-after-load.jsonl") else {
        assert!(
            closers.is_empty(),
            "{name}: closers without a repaired file"
        );
        return;
    };
    // Packed chunk rows hold several events per line, so the closers are the file's tail.
    let lines: Vec<&str> = disk.lines().collect();
    assert!(
        lines.len() > closers.len() && stored_count > 0,
        "{name}: repaired file too short"
    );
    let written = &lines[lines.len() - closers.len()..];
    let ours: Vec<String> = closers
        .iter()
        .map(|closer| closer.to_json_line(KeyOrder::RepairCloser))
        .collect();
    assert_eq!(
        written,
        ours.iter().map(String::as_str).collect::<Vec<_>>(),
        "{name}: closer bytes"
    );
}

/// The incremental fold after each event equals a fold from scratch over that prefix, and
/// derived messages agree too, for every prefix of every accepted fixture.
#[test]
fn incremental_fold_equals_scratch_fold_on_every_prefix() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut prefixes = 0;
    for name in case_names() {
        let Ok(bytes) = fs::read(fixture_path(&name, "input.jsonl")) else {
            continue;
        };
        let Ok(log) = scan_log(&bytes) else { continue };
        let Ok(restored) = restore_session(&log.session_id, &log.events, fixed_now(&name)) else {
            continue;
        };
        let mut incremental = SurfaceFold::new();
        for length in 1..=restored.events.len() {
            incremental
                .apply(&restored.events[length - 1])
                .expect("accepted log applies");
            let mut scratch = SurfaceFold::new();
            restored.events[..length]
                .iter()
                .try_for_each(|event| scratch.apply(event).map(|_| ()))
                .expect("prefix folds");
            assert!(incremental == scratch, "{name}: prefix {length} differs");
            let from_scratch = fold_surface(&restored.events[..length]).expect("prefix folds");
            assert_eq!(
                incremental.nodes(),
                from_scratch.nodes,
                "{name}: prefix {length}"
            );
            assert_eq!(
                incremental.derive_messages(),
                scratch.derive_messages(),
                "{name}: prefix {length}"
            );
            prefixes += 1;
        }
        assert!(
            incremental == restored.surface,
            "{name}: restore surface differs from replay"
        );
    }
    assert!(prefixes > 1000, "only {prefixes} prefixes folded");
}
