//! Runs the built `dshdb` binary against stores in temporary directories.

use crate::common::*;

use std::path::PathBuf;

#[test]
fn quickstart_writes_realistic_sessions_and_prints_them() {
    let dir = temp_dir("quickstart");
    let store = dir.join("demo-store");
    let store = path_str(&store);
    let out = ok(&["quickstart", store], "");
    assert!(out.contains("closed the store; reopening it"), "{out}");
    assert!(
        out.contains("session quickstart-fix-failing-test: 28 events"),
        "{out}"
    );
    // The last events are printed as DSH JSON lines.
    let lines: Vec<&str> = out.lines().filter(|line| line.starts_with('{')).collect();
    assert!(lines.len() >= 6, "{out}");
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        assert!(
            value.get("type").is_some() && value.get("seq").is_some(),
            "{line}"
        );
    }
    assert!(lines
        .iter()
        .any(|line| line.starts_with(r#"{"type":"turn/end""#)));

    // The whole session holds the DSH round: message, turn, step, chunks, tool call/result.
    let events = ok(&["events", store, "quickstart-fix-failing-test"], "");
    let types: Vec<String> = events
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("JSON line");
            value["type"].as_str().expect("type").to_string()
        })
        .collect();
    for wanted in [
        "turn/start",
        "user/message",
        "step/start",
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "step/end",
        "turn/end",
    ] {
        assert!(
            types.iter().any(|t| t == wanted),
            "no {wanted} in {types:?}"
        );
    }
    assert!(types.iter().filter(|t| *t == "assistant/chunk").count() >= 3);
    let user = events
        .lines()
        .find(|line| line.contains(r#""type":"user/message""#))
        .expect("user/message");
    assert!(user.ends_with(r#","surfaceOp":"append"}"#), "{user}");
    assert!(user.contains(r#""data":{"role":"user","content":[{"type":"text","text":"#));
    let result = events
        .lines()
        .find(|line| line.contains(r#""type":"tool/result""#))
        .expect("tool/result");
    assert!(
        result.contains(r#""sourceEventSeqs":["#) && result.contains(r#""surfaceOp":"append""#)
    );

    // A second run adds fresh sessions instead of failing on duplicates.
    ok(&["quickstart", store], "");
    let listing = ok(&["ls", store], "");
    assert!(
        listing.contains("quickstart-fix-failing-test-2"),
        "{listing}"
    );
    assert_eq!(listing.lines().count(), 1 + 6, "{listing}");
    let verified = ok(&["verify", store], "");
    assert!(verified.contains("events: 168"), "{verified}");
}

#[test]
fn append_and_events_round_trip_exact_bytes() {
    let dir = temp_dir("roundtrip");
    let store = dir.join("store");
    let store = path_str(&store);
    ok(&["init", store], "");
    let input = concat!(
        r#"{"type":"user/message","data":{"role":"user","content":[{"type":"text","text":"\ud800"}],"source":{"kind":"user"},"id":"m1","n":1e+21,"f":1.50,"e":"\u00e9"},"time":1700000000000,"surfaceOp":"append"}"#,
        "\n",
        "\n",
        r#"{"time":5,"data":  [1, 2 ,3] ,"type":"custom/thing","ignorable":true}"#,
        "\n",
        r#"{"type":"tool/result","data":{"message":{"role":"user","id":"r1","source":{"kind":"tool","callId":"c1"},"content":[{"type":"tool-result","toolCallId":"c1","content":[]}]}},"sourceEventSeqs":[ 0 ],"surfaceOp":"append","time":-7}"#,
        "\n",
    );
    ok(&["append", store, "s1", "--create"], input);
    let out = ok(&["events", store, "s1"], "");
    let expected = concat!(
        r#"{"type":"user/message","seq":0,"time":1700000000000,"data":{"role":"user","content":[{"type":"text","text":"\ud800"}],"source":{"kind":"user"},"id":"m1","n":1e+21,"f":1.50,"e":"\u00e9"},"surfaceOp":"append"}"#,
        "\n",
        r#"{"type":"custom/thing","seq":1,"time":5,"data":[1, 2 ,3],"ignorable":true}"#,
        "\n",
        r#"{"type":"tool/result","seq":2,"time":-7,"data":{"message":{"role":"user","id":"r1","source":{"kind":"tool","callId":"c1"},"content":[{"type":"tool-result","toolCallId":"c1","content":[]}]}},"sourceEventSeqs":[ 0 ],"surfaceOp":"append"}"#,
        "\n",
    );
    assert_eq!(out, expected);

    // The exported lines append again unchanged (their seqs match) to a second session.
    ok(&["append", store, "s2", "--create"], &out);
    assert_eq!(ok(&["events", store, "s2"], ""), expected);

    // Filters and the JSON array form.
    let only = ok(&["events", store, "s1", "--type", "custom/thing"], "");
    assert_eq!(only.lines().count(), 1);
    assert!(
        only.starts_with(r#"{"type":"custom/thing","seq":1"#),
        "{only}"
    );
    let range = ok(&["events", store, "s1", "--from", "1", "--to", "2"], "");
    assert_eq!(
        range,
        expected
            .lines()
            .nth(1)
            .map(|l| format!("{l}\n"))
            .unwrap_or_default()
    );
    let array = ok(&["events", store, "s1", "--json"], "");
    // (serde_json::Value refuses the lone surrogate; RawValue keeps it.)
    let parsed: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_str(&array).expect("JSON array");
    let items: Vec<&str> = parsed.iter().map(|item| item.get()).collect();
    assert_eq!(items, expected.lines().collect::<Vec<_>>());
    assert_eq!(
        ok(&["events", store, "s1", "--from", "9", "--json"], "").trim(),
        "[]"
    );
}

#[test]
fn append_with_ack_reports_each_durable_seq() {
    let dir = temp_dir("ack");
    let store = dir.join("store");
    let store = path_str(&store);
    let lines =
        "{\"type\":\"turn/start\",\"data\":1}\n{\"type\":\"turn/start\",\"data\":2}\n{\"type\":\"turn/start\",\"data\":3}\n";
    let out = ok(&["append", store, "s", "--create", "--ack"], lines);
    assert_eq!(out, "durable 0\ndurable 1\ndurable 2\n");
    for durability in ["batched", "buffered", "sync"] {
        let out = ok(
            &["append", store, "s", "--ack", "--durability", durability],
            "{\"type\":\"turn/start\",\"data\":4}\n{\"type\":\"turn/start\",\"data\":5}\n",
        );
        let count = ok(&["events", store, "s"], "").lines().count();
        assert_eq!(
            out,
            format!("durable {}\ndurable {}\n", count - 2, count - 1),
            "{durability}"
        );
    }
    // Without --ack nothing is printed.
    assert_eq!(
        ok(
            &["append", store, "s"],
            "{\"type\":\"turn/start\",\"data\":6}\n"
        ),
        ""
    );
}

#[test]
fn bad_line_exits_1_names_the_line_and_appends_nothing_of_it() {
    let dir = temp_dir("badline");
    let store = dir.join("store");
    let store = path_str(&store);
    let bad_lines = [
        r#"{"type":"x","data":{"unterminated":}"#,
        r#"{"type":"x"}"#,
        r#"{"type":"x","data":1,"color":"red"}"#,
        r#"{"type":"","data":1}"#,
        r#"{"type":"x","data":1,"ignorable":false}"#,
        r#"{"type":"x","data":1,"time":"yesterday"}"#,
        r#"{"type":"x","data":1,"seq":99}"#,
        r#"["type","x"]"#,
    ];
    let mut expected_events = 0;
    for (attempt, bad) in bad_lines.iter().enumerate() {
        let input = format!(
            "{{\"type\":\"turn/start\",\"data\":{attempt}}}\n{bad}\n{{\"type\":\"turn/end\",\"data\":\"after\"}}\n"
        );
        let output = dshdb(&["append", store, "s", "--create", "--ack"], &input);
        assert_eq!(output.status.code(), Some(1), "{bad}: {}", stderr(&output));
        let message = stderr(&output);
        assert!(message.contains("line 2"), "{bad}: {message}");
        // The good line before it was appended (and acked); the bad one and the rest were not.
        expected_events += 1;
        assert_eq!(
            stdout(&output),
            format!("durable {}\n", expected_events - 1)
        );
        let events = ok(&["events", store, "s"], "");
        assert_eq!(events.lines().count(), expected_events, "{bad}: {events}");
        assert!(!events.contains("\"after\""), "{events}");
    }
    // Invalid UTF-8 is a bad line too.
    let output = dshdb(
        &["append", store, "s"],
        b"{\"type\":\"turn/start\",\"data\":\"\xff\"}\n",
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("line 1"), "{}", stderr(&output));
    assert_eq!(
        ok(&["events", store, "s"], "").lines().count(),
        expected_events
    );
}

#[test]
fn verify_is_clean_on_a_good_store_and_exits_3_after_a_flipped_byte() {
    let dir = temp_dir("verify");
    let store_path = dir.join("store");
    let store = path_str(&store_path);
    ok(&["quickstart", store], "");
    let out = ok(&["verify", store], "");
    assert!(out.contains("segments scanned: 1"), "{out}");
    assert!(out.contains("events: 84"), "{out}");
    assert!(out.contains("batches: 87"), "{out}");
    assert!(!out.contains("torn tail"), "{out}");

    // The store is closed, so its segments are sealed: any flip before the seal is damage.
    let mut segments: Vec<PathBuf> = std::fs::read_dir(store_path.join("wal"))
        .expect("wal dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    segments.sort_by_key(|path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0));
    let segment = segments.pop().expect("a segment");
    let mut bytes = std::fs::read(&segment).expect("read segment");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&segment, &bytes).expect("write segment");

    let output = dshdb(&["verify", store], "");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(
        message.contains("segment") && message.contains("offset"),
        "{message}"
    );
}

#[test]
fn verify_reports_a_missing_store_as_an_error_not_corruption() {
    let dir = temp_dir("missing");
    let missing = dir.join("nothing-here");
    for args in [
        vec!["verify", path_str(&missing)],
        vec!["ls", path_str(&missing)],
        vec!["events", path_str(&missing), "s"],
    ] {
        let output = dshdb(&args, "");
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&output).contains("no dshdb store"),
            "{}",
            stderr(&output)
        );
        assert!(
            !missing.exists(),
            "a read command created {}",
            missing.display()
        );
    }
    // An existing store refuses `init`, and `append` needs --create for a new session.
    let store = dir.join("store");
    let store = path_str(&store);
    ok(&["init", store], "");
    assert_eq!(dshdb(&["init", store], "").status.code(), Some(1));
    let output = dshdb(
        &["append", store, "nope"],
        "{\"type\":\"turn/start\",\"data\":1}\n",
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("--create"), "{}", stderr(&output));
    let output = dshdb(&["events", store, "nope"], "");
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("unknown session"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec![],
        vec!["bogus"],
        vec!["append"],
        vec!["events", "store"],
        vec!["append", "store", "s", "--durability", "never"],
        vec!["events", "store", "s", "--from", "minus-one"],
    ] {
        let output = dshdb(&args, "");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
    assert_eq!(dshdb(&["--help"], "").status.code(), Some(0));
}

#[test]
fn ls_lists_sessions_with_event_counts() {
    let dir = temp_dir("ls");
    let store = dir.join("store");
    let store = path_str(&store);
    ok(&["init", store], "");
    assert_eq!(ok(&["ls", store], ""), "no sessions\n");
    assert_eq!(ok(&["ls", store, "--json"], ""), "[]\n");
    ok(
        &["append", store, "beta", "--create"],
        "{\"type\":\"turn/start\",\"data\":1}\n",
    );
    ok(
        &["append", store, "alpha", "--create"],
        "{\"type\":\"turn/start\",\"data\":1}\n{\"type\":\"turn/start\",\"data\":2}\n",
    );
    let listing = ok(&["ls", store], "");
    let rows: Vec<Vec<&str>> = listing
        .lines()
        .map(|line| line.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["SESSION", "EVENTS"],
            vec!["alpha", "2"],
            vec!["beta", "1"]
        ]
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["ls", store, "--json"], "")).expect("JSON");
    assert_eq!(json[0]["id"], "alpha");
    assert_eq!(json[0]["events"], 2);
    assert_eq!(json[1]["header"]["id"], "beta");
    assert_eq!(json[1]["header"]["version"], 0);
}

#[test]
fn quickstart_sessions_pass_the_dsh_session_model_checks() {
    use dshdb::session::{parse_event_line, validate_seed, InvariantTracker, SeedMode};
    let dir = temp_dir("model");
    let store = dir.join("store");
    let store = path_str(&store);
    ok(&["quickstart", store], "");
    let listing: serde_json::Value =
        serde_json::from_str(&ok(&["ls", store, "--json"], "")).expect("JSON");
    let sessions = listing.as_array().expect("array");
    assert_eq!(sessions.len(), 3);
    for session in sessions {
        let id = session["id"].as_str().expect("id");
        let lines = ok(&["events", store, id], "");
        let mut tracker = InvariantTracker::new();
        let mut events = Vec::new();
        for line in lines.lines() {
            let event = parse_event_line(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            tracker
                .check_next(&event)
                .unwrap_or_else(|e| panic!("{id}: {line}: {e}"));
            events.push(event);
        }
        assert_eq!(events.len() as u64, session["events"].as_u64().expect("n"));
        if let Err(error) = validate_seed(&events, SeedMode::Snapshot) {
            panic!("{id}: {error}");
        }
    }
}

/// A second writer *process*: while this process holds the store open for writing, `dshdb
/// append` in a child process is refused with the lock error and writes nothing; a read-only
/// command works alongside; once the holder closes, the child can write.
#[test]
fn a_second_writer_process_is_refused_and_changes_nothing() {
    let dir = temp_dir("second-writer");
    let store_path = dir.join("store");
    let holder =
        dshdb::store::Store::open(&store_path, dshdb::store::Options::default()).expect("open");
    let mut writer = holder.create_session_with_id("held").expect("create");
    writer
        .append(dshdb::store::NewEvent::new("assistant/chunk", r#"{"n":0}"#))
        .expect("append");
    let store = store_path.to_str().expect("UTF-8 path");
    let line = "{\"type\":\"assistant/chunk\",\"data\":{\"n\":1}}\n";
    let refused = dshdb(&["append", store, "held"], line);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("locked by another writer process"),
        "{message}"
    );
    let listed = dshdb(&["ls", store], "");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert_eq!(holder.session("held").expect("session").events, 1);
    drop(writer);
    holder.close().expect("close");
    drop(holder);
    let accepted = dshdb(&["append", store, "held"], line);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    let events = dshdb(&["events", store, "held", "--json"], "");
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&stdout(&events)).expect("events --json is a JSON array");
    assert_eq!(listed.len(), 2);
}

#[test]
fn maintain_seals_segments_into_runs_and_stats_reports_them() {
    let dir = temp_dir("maintain");
    let store_path = dir.join("store");
    let store = path_str(&store_path);
    let line = |n: usize| format!("{{\"type\":\"assistant/chunk\",\"data\":{{\"n\":{n}}}}}\n");
    let first: String = (0..3).map(line).collect();
    let second: String = (3..5).map(line).collect();
    // Each clean close seals its segment; the next open starts a new one.
    ok(&["append", store, "s", "--create"], &first);
    ok(&["append", store, "s"], &second);
    let out = ok(&["maintain", store], "");
    assert!(
        out.contains("sealed 2 segments into runs: 5 events"),
        "{out}"
    );
    let runs = std::fs::read_dir(store_path.join("runs"))
        .expect("runs dir")
        .count();
    assert_eq!(runs, 2);
    let stats: serde_json::Value =
        serde_json::from_str(&ok(&["stats", store, "--json"], "")).expect("json");
    assert_eq!(stats["events"], 5);
    assert_eq!(stats["events_in_runs"], 5);
    assert_eq!(stats["runs"], 2);
    assert_eq!(stats["segments"], 1);
    assert_eq!(stats["maintenance_failures"], 0);
    assert!(stats["last_maintenance_failure"].is_null(), "{stats}");
    let session: serde_json::Value =
        serde_json::from_str(&ok(&["stats", store, "s", "--json"], "")).expect("json");
    assert_eq!(session["events"], 5);
    assert_eq!(session["runs"], 2);
    let text = ok(&["stats", store], "");
    assert!(text.contains("run compression ratio"), "{text}");
    assert!(
        text.contains("background maintenance failures in this process: 0"),
        "{text}"
    );
    let events = ok(&["events", store, "s"], "");
    assert_eq!(events.lines().count(), 5);
    assert!(events.contains(r#""seq":4"#), "{events}");
    let verified = ok(&["verify", store], "");
    assert!(verified.contains("runs decoded: 2"), "{verified}");
    assert!(verified.contains("events: 5"), "{verified}");
}

#[test]
fn rm_deletes_a_session_and_maintain_reclaims_its_events() {
    let dir = temp_dir("rm");
    let store_path = dir.join("store");
    let store = path_str(&store_path);
    let lines: String = (0..50)
        .map(|n| format!("{{\"type\":\"assistant/chunk\",\"data\":{{\"n\":{n}}}}}\n"))
        .collect();
    ok(&["append", store, "doomed", "--create"], &lines);
    ok(&["append", store, "kept", "--create"], &lines);
    let out = ok(&["rm", store, "doomed"], "");
    assert!(out.contains("deleted doomed"), "{out}");
    let listing = ok(&["ls", store], "");
    assert!(!listing.contains("doomed"), "{listing}");
    assert!(listing.contains("kept"), "{listing}");
    let again = dshdb(&["rm", store, "doomed"], "");
    assert!(!again.status.success());
    assert!(stderr(&again).contains("doomed"), "{}", stderr(&again));
    let out = ok(&["maintain", store], "");
    assert!(
        out.contains("50 events of deleted sessions dropped"),
        "{out}"
    );
    assert_eq!(ok(&["events", store, "kept"], "").lines().count(), 50);
    let alias = dshdb(&["delete", store, "kept"], "");
    assert!(alias.status.success(), "{}", stderr(&alias));
}

#[test]
fn fork_inside_an_open_turn_prints_dsh_text_and_creates_no_child() {
    let dir = temp_dir("fork-open-turn");
    let store = dir.join("store");
    let store = path_str(&store);
    let input = concat!(
        r#"{"type":"turn/start","data":{"turn":1},"time":1}"#,
        "\n",
        r#"{"type":"assistant/chunk","data":{},"time":2}"#,
        "\n",
    );
    ok(&["append", store, "p", "--create"], input);
    let output = dshdb(&["fork", store, "p", "c", "--at", "1"], "");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim_end(),
        r#"dshdb: error: fork boundary 1 in session "p" ends inside open turn 1"#
    );
    let info = dshdb(&["info", store, "c"], "");
    assert_ne!(
        info.status.code(),
        Some(0),
        "a refused fork creates no child"
    );
}

#[test]
fn tail_prints_from_a_seq_and_follows_what_another_process_commits() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir("tail");
    let store_dir = dir.join("store");
    let store = path_str(&store_dir);
    let lines = "{\"type\":\"turn/start\",\"data\":0}\n\
                 {\"type\":\"turn/start\",\"data\":1}\n\
                 {\"type\":\"turn/start\",\"data\":2}\n";
    ok(&["append", store, "chat", "--create"], lines);
    let printed = ok(&["tail", store, "chat", "--from", "1"], "");
    let seqs: Vec<u64> = printed
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("JSON line");
            value["seq"].as_u64().expect("seq")
        })
        .collect();
    assert_eq!(seqs, [1, 2]);

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dshdb"))
        .args(["tail", store, "chat", "--from", "2", "--follow", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn tail --follow");
    let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
    let mut next_object = || {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read tail output");
        serde_json::from_str::<serde_json::Value>(&line).expect("JSON object")
    };
    assert_eq!(next_object()["seq"], 2, "the existing event first");
    let writer_store = dshdb::Store::open(
        &store_dir,
        dshdb::Options {
            shared: true,
            ..dshdb::Options::default()
        },
    )
    .expect("a writer beside the follower");
    let mut writer = writer_store.writer("chat").expect("writer");
    for n in 3..6 {
        let data = n.to_string();
        writer
            .append(dshdb::NewEvent::new("turn/start", &data))
            .expect("append");
    }
    for n in 3..6u64 {
        let object = next_object();
        assert_eq!(object["seq"], n);
        assert_eq!(object["type"], "turn/start");
        assert_eq!(object["data"], n);
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(writer);
    writer_store.close().expect("close");
}
