//! One DSH agent log through the CLI, with no fixture from outside the repository: the log is
//! written by the engine's own DSH export (a native session of two closed turns and a third a
//! crash cut after a tool call), then handed to the `dshdb` binary as a user would.

use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent};
use dshdb::exchange::export_dsh_jsonl;
use dshdb::store::{NewEvent, Options, Store};
use dshdb_e2e::{arg, dshdb, dshdb_ok, scratch, text, Scratch};
use std::path::Path;

const SESSION: &str = "e2e-agent";
/// Events of the interrupted third turn that reached the log: up to its `tool/call`, before
/// the tool's result.
const INTERRUPTED_TURN_EVENTS: usize = 6;
/// A user text holding the lone-surrogate escapes DSH keeps (and `"` and `\` escapes).
const ODD_TEXT: &str = r#"lone \ud800 and \udfff, swapped \udc00\ud800, quote \" slash \\"#;

/// Writes the DSH log of the scenario to `path` and returns its bytes.
fn write_agent_log(scratch: &Scratch, path: &Path) -> Vec<u8> {
    let store = Store::open(scratch.join("author"), Options::default()).expect("open");
    let header = format!(
        r#"{{"version":0,"id":"{SESSION}","createdAt":1790000000000,"cwd":"/home/e2e/project"}}"#
    );
    let mut writer = store.create_session(&header).expect("create");
    let odd_user = format!(
        r#"{{"role":"user","content":[{{"type":"text","text":"{ODD_TEXT}"}}],"source":{{"kind":"user"}},"id":"u-odd"}}"#
    );
    for turn in 1..=3 {
        let mut owned = turn_events(turn, 200);
        if turn == 2 {
            owned[1].data = odd_user.clone();
        }
        if turn == 3 {
            owned.truncate(INTERRUPTED_TURN_EVENTS);
        }
        let events: Vec<NewEvent<'_>> = owned.iter().map(OwnedEvent::as_new_event).collect();
        writer.append_batch(&events).expect("append");
    }
    drop(writer);
    let log = export_dsh_jsonl(&store, SESSION).expect("export");
    store.close().expect("close");
    std::fs::write(path, &log).expect("write log");
    log
}

fn lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    text(bytes)
        .lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect()
}

#[test]
fn import_export_messages_repair_and_verify_an_interrupted_agent_log() {
    let scratch = scratch("agent-log");
    let log_path = scratch.join("session.jsonl");
    let log = write_agent_log(&scratch, &log_path);
    let store = scratch.join("store");
    let store = arg(&store);

    let report = text(&dshdb_ok(&["import", store, arg(&log_path)]));
    assert!(
        report.contains(&format!("imported {SESSION}: ")),
        "{report}"
    );

    // Export gives the file back byte for byte, to stdout and to a file.
    assert!(
        dshdb_ok(&["export", store, SESSION]) == log,
        "plain export differs"
    );
    let zstd_path = scratch.join("session.jsonl.zstd");
    dshdb_ok(&[
        "export",
        store,
        SESSION,
        "--format",
        "dsh-jsonl-zstd",
        "-o",
        arg(&zstd_path),
    ]);
    let second = scratch.join("second");
    dshdb_ok(&["import", arg(&second), arg(&zstd_path)]);
    assert!(
        dshdb_ok(&["export", arg(&second), SESSION]) == log,
        "the zstd round trip differs"
    );

    // Messages: DSH's deriveMessages, with the escapes as they are in the log.
    let messages = text(&dshdb_ok(&["messages", store, SESSION]));
    assert!(messages.contains(ODD_TEXT), "{messages}");
    let parsed: serde_json::Value = serde_json::from_str(
        &messages
            .replace(r"\ud800", "?")
            .replace(r"\udfff", "?")
            .replace(r"\udc00", "?"),
    )
    .expect("messages are one JSON array");
    let roles: Vec<&str> = parsed
        .as_array()
        .expect("array")
        .iter()
        .map(|message| message["role"].as_str().expect("role"))
        .collect();
    // Per closed turn: user, assistant (tool call), tool result (as user), assistant; the
    // interrupted turn: user, the assistant's tool call, and the result DSH's cold load
    // repairs in memory (outcome unknown).
    let closed_turn = ["user", "assistant", "user", "assistant"];
    let expected: Vec<&str> = closed_turn
        .iter()
        .chain(&closed_turn)
        .chain(&["user", "assistant", "user"])
        .copied()
        .collect();
    assert_eq!(roles, expected, "{messages}");
    let repaired_result = &parsed[expected.len() - 1];
    assert_eq!(
        repaired_result["content"][0]["isError"], true,
        "{repaired_result}"
    );

    // Repair closes the interrupted turn durably, once; the log before it is unchanged.
    let repaired = text(&dshdb_ok(&["repair", store, SESSION]));
    let closers: usize = repaired
        .split("appended ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no closer count in {repaired:?}"));
    assert!(closers >= 2, "{repaired}");
    let after = dshdb_ok(&["export", store, SESSION]);
    assert!(after.starts_with(&log), "repair rewrote the log before it");
    let added = lines(&after[log.len()..]);
    assert_eq!(added.len(), closers);
    let last = added.last().expect("a closer");
    assert_eq!(last["type"], "turn/end", "{last}");
    let again = text(&dshdb_ok(&["repair", store, SESSION]));
    assert!(again.contains("appended 0 closers"), "{again}");

    let verified = dshdb(&["verify", store]);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{}",
        text(&verified.stderr)
    );
}
