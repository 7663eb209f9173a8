//! What a new user meets: lossless derived messages, usage errors exit 2, a quickstart that
//! says what it read back and how to run `dshdb`, and empty results said on stderr.

use crate::common::*;

/// Exit code of a usage error (clap's, and the README's).
const EXIT_USAGE: i32 = 2;

/// A `user/message` whose text holds the lone-surrogate escapes DSH keeps.
const SURROGATE_TEXT: &str = r"a\ud800b\udfff c\udc00\ud800";

fn store_with_one_message(dir: &TempDir) -> String {
    let store = path_str(&dir.join("store")).to_owned();
    let line = format!(
        r#"{{"type":"user/message","data":{{"role":"user","content":[{{"type":"text","text":"{SURROGATE_TEXT}"}}],"source":{{"kind":"user"}},"id":"m1"}},"surfaceOp":"append"}}"#
    );
    ok(
        &["append", &store, "chat", "--create"],
        &format!("{line}\n"),
    );
    store
}

#[test]
fn messages_keep_lone_surrogate_escapes_as_in_the_events() {
    let dir = temp_dir("surrogates");
    let store = store_with_one_message(&dir);
    let events = ok(&["events", &store, "chat"], "");
    assert!(events.contains(SURROGATE_TEXT), "{events}");
    let messages = ok(&["messages", &store, "chat"], "");
    assert!(
        messages.contains(&format!(r#""text":"{SURROGATE_TEXT}""#)),
        "the escapes must come out as in the event: {messages}"
    );
    assert!(!messages.contains('\u{fffd}'), "{messages}");
    assert!(!messages.contains(r"\ufffd"), "{messages}");
}

#[test]
fn an_unknown_token_encoding_is_a_usage_error() {
    let dir = temp_dir("encoding");
    let store = store_with_one_message(&dir);
    let output = dshdb(&["project", &store, "chat", "--encoding", "gpt2"], "");
    assert_eq!(
        output.status.code(),
        Some(EXIT_USAGE),
        "{}",
        stderr(&output)
    );
    let message = stderr(&output);
    assert!(
        message.contains("gpt2") && message.contains("cl100k_base"),
        "{message}"
    );
    // The valid names still work.
    for encoding in ["o200k_base", "cl100k_base"] {
        ok(&["project", &store, "chat", "--encoding", encoding], "");
    }
}

#[test]
fn quickstart_says_what_it_read_back_and_how_to_run_dshdb() {
    let dir = temp_dir("quickstart-read-back");
    let store = dir.join("store");
    let out = ok(&["quickstart", path_str(&store)], "");
    let written: u64 = out
        .lines()
        .filter_map(|line| line.strip_prefix("wrote session "))
        .map(|rest| {
            let count = rest.rsplit(": ").next().expect("count");
            let count = count.strip_suffix(" events").expect("events");
            count.parse::<u64>().expect("number")
        })
        .sum();
    assert!(written > 0, "{out}");
    let read_back = out
        .lines()
        .find(|line| line.starts_with("read back: "))
        .unwrap_or_else(|| panic!("no read-back line in {out}"));
    assert!(
        read_back.starts_with(&format!("read back: 3 sessions, {written} events, ")),
        "{read_back}"
    );
    // The hints name a command that runs: this binary's own path (it is not on PATH here).
    let binary = env!("CARGO_BIN_EXE_dshdb");
    let hints: Vec<&str> = out
        .lines()
        .skip_while(|line| *line != "next:")
        .skip(1)
        .collect();
    assert!(!hints.is_empty(), "{out}");
    let first = hints[0].trim_start();
    let program = first.split(" ls ").next().expect("program");
    let resolved = std::fs::canonicalize(program).expect("the hint's program exists");
    assert_eq!(resolved, std::fs::canonicalize(binary).expect("binary"));
    assert!(out.contains("cargo install --path cli"), "{out}");
}

#[test]
fn empty_results_are_said_on_stderr() {
    let dir = temp_dir("empty-results");
    let store = store_with_one_message(&dir);
    let cases: [(&[&str], &str); 4] = [
        (
            &["events", &store, "chat", "--from", "5", "--to", "2"],
            "--from 5 is not below --to 2",
        ),
        (
            &["events", &store, "chat", "--type", "no/such-type"],
            r#"no events of type "no/such-type""#,
        ),
        (&["events", &store, "chat", "--from", "7"], "past its end"),
        (&["spill", "ls", &store], "no spill blobs"),
    ];
    for (args, said) in cases {
        let output = dshdb(args, "");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), "", "{args:?}");
        assert!(
            stderr(&output).contains(said),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    // `--json` still prints its (empty) array on stdout, and says why on stderr.
    let output = dshdb(&["events", &store, "chat", "--type", "x/y", "--json"], "");
    assert_eq!(stdout(&output).trim(), "[]");
    assert!(
        stderr(&output).contains("no events of type"),
        "{}",
        stderr(&output)
    );
}
