//! `dshdb prune | spill get|ls|gc | compact | project` against a real store directory.

use crate::common;
use crate::common::temp_dir;

use dshdb::derive::projection::synthetic::turn_events;
use serde_json::Value;
use std::process::Output;

fn dshdb(args: &[&str], stdin: &[u8]) -> Output {
    let output = common::run_dshdb(args, stdin);
    assert!(
        output.status.success(),
        "dshdb {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect()
}

/// Two turns; the first tool result holds 20,000 characters.
fn session_lines() -> String {
    let mut lines = String::new();
    for turn in 1..=2 {
        for (index, event) in turn_events(turn, 300).into_iter().enumerate() {
            let mut data: Value = serde_json::from_str(&event.data).expect("json");
            if turn == 1 && index == 6 {
                data["message"]["content"][0]["content"][0]["text"] =
                    Value::String("0123456789".repeat(2_000));
            }
            let mut line = serde_json::json!({"type": event.event_type, "data": data});
            if !event.envelope.is_empty() {
                line["surfaceOp"] = Value::String("append".into());
            }
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
    }
    lines
}

#[test]
fn prune_spill_compact_and_project_from_the_command_line() {
    let scratch = temp_dir("above-flow");
    let dir = scratch.path().to_path_buf();
    let store = dir.join("store");
    let store = store.to_str().expect("utf-8 path");
    dshdb(
        &["append", store, "s", "--create"],
        session_lines().as_bytes(),
    );
    let pruned = json_lines(&dshdb(&["prune", store, "s"], b""));
    assert_eq!(pruned.len(), 2, "one pruned result and the total");
    let locator = pruned[0]["spilled"].as_str().expect("locator").to_owned();
    assert_eq!(pruned[0]["originalSeq"], 6);
    let listed = String::from_utf8(dshdb(&["spill", "ls", store], b"").stdout).expect("utf-8");
    assert_eq!(
        listed.trim().split('\t').collect::<Vec<_>>()[..2],
        [locator.as_str(), "20000"]
    );
    let range = dshdb(
        &[
            "spill", "get", store, &locator, "--offset", "12", "--length", "5",
        ],
        b"",
    );
    assert_eq!(range.stdout, b"23456");
    let whole = dshdb(&["spill", "get", store, &locator], b"");
    assert_eq!(whole.stdout.len(), 20_000);
    let before = &json_lines(&dshdb(&["project", store, "s"], b""))[0];
    assert_eq!(before["events"], 26);
    assert_eq!(before["surfaceNodes"], 8);
    assert_eq!(before["replaceGeneration"], 1);
    let summary = dir.join("summary.txt");
    std::fs::write(&summary, "Turn one ran a tool.\n").expect("summary");
    let summary = summary.to_str().expect("utf-8 path");
    let args = [
        "compact",
        store,
        "s",
        "--start",
        "1",
        "--end",
        "9",
        "--summary-file",
        summary,
    ];
    let compacted = &json_lines(&dshdb(&args, b""))[0];
    assert_eq!(compacted["startSeq"], 26);
    assert_eq!(compacted["endSeq"], 29);
    let after = &json_lines(&dshdb(&["project", store, "s"], b""))[0];
    assert_eq!(after["surfaceNodes"], 5);
    assert!(after["tokens"]["total"].as_u64() < before["tokens"]["total"].as_u64());
    let cl100k = &json_lines(&dshdb(
        &["project", store, "s", "--encoding", "cl100k_base"],
        b"",
    ))[0];
    assert_eq!(cl100k["tokens"]["encoding"], "cl100k_base");
    assert_eq!(cl100k["surfaceNodes"], after["surfaceNodes"]);
    let gc = &json_lines(&dshdb(&["spill", "gc", store], b""))[0];
    assert_eq!(gc["kept"], 1, "the pruned replacement cites the blob");
    // The canonical export carries the blob; the import stores it with the session.
    let exported = dir.join("s.dshdb.jsonl");
    let exported = exported.to_str().expect("utf-8 path");
    dshdb(
        &["export", store, "s", "--format", "json", "-o", exported],
        b"",
    );
    let copy = dir.join("copy");
    let copy = copy.to_str().expect("utf-8 path");
    dshdb(&["init", copy], b"");
    dshdb(&["import", copy, exported], b"");
    let travelled = dshdb(&["spill", "get", copy, &locator], b"");
    assert_eq!(travelled.stdout, whole.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}
