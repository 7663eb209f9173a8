//! The CLI tried as a hostile or careless user would (issues 12 and 13): typo'd store paths,
//! ordinary folders, typo'd event types, deep data, outputs aimed into the store, the
//! writer lock held elsewhere, and ids that listings could not show.

use crate::common::*;

use dshdb::spill::SpillStore;
use dshdb::store::{Options, Store, MAX_EVENT_DATA_DEPTH};
use std::path::Path;

const TURN: &str = r#"{"type":"turn/start","data":{"turn":1}}"#;

fn entries(folder: &Path) -> Vec<String> {
    dshdb_test_support::sorted_entries(folder)
}

fn failure(args: &[&str], stdin: &str) -> String {
    let output = dshdb(args, stdin);
    assert_eq!(
        output.status.code(),
        Some(1),
        "dshdb {args:?}: {}",
        stderr(&output)
    );
    stderr(&output)
}

#[test]
fn only_creating_commands_create_a_store() {
    let dir = temp_dir("typo-store");
    let typo = dir.join("typo");
    let typo_path = path_str(&typo);
    let commands: Vec<Vec<&str>> = vec![
        vec!["repair", typo_path],
        vec!["repair", typo_path, "s"],
        vec!["fork", typo_path, "a", "b", "--at", "0"],
        vec!["maintain", typo_path],
        vec!["rm", typo_path, "s"],
        vec!["prune", typo_path, "s"],
        vec!["spill", "gc", typo_path],
        vec!["append", typo_path, "s"],
    ];
    for command in &commands {
        let message = failure(command, TURN);
        assert!(
            message.contains(&format!("no dshdb store at {typo_path}")),
            "{command:?}: {message}"
        );
        assert!(!typo.exists(), "{command:?} created {typo_path}");
    }
    // The creating ones do.
    ok(&["append", typo_path, "s", "--create"], TURN);
    assert!(typo.join("MANIFEST").exists());
}

#[test]
fn writing_commands_leave_no_lock_in_an_ordinary_folder() {
    let dir = temp_dir("ordinary-folder");
    let folder = dir.join("notes");
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::write(folder.join("todo.txt"), b"mine").expect("file");
    let folder_path = path_str(&folder);
    for command in [
        vec!["repair", folder_path],
        vec!["maintain", folder_path],
        vec!["rm", folder_path, "s"],
        vec!["append", folder_path, "s"],
        vec!["append", folder_path, "s", "--create"],
    ] {
        let message = failure(&command, TURN);
        assert!(
            message.contains("no dshdb store at"),
            "{command:?}: {message}"
        );
        assert_eq!(
            entries(&folder),
            vec!["todo.txt".to_string()],
            "{command:?}"
        );
    }
}

#[test]
fn init_of_a_non_empty_folder_says_so_and_leaves_nothing() {
    let dir = temp_dir("init-non-empty");
    let folder = dir.join("ns");
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::write(folder.join("readme"), b"mine").expect("file");
    let message = failure(&["init", path_str(&folder)], "");
    assert!(
        message.contains("the folder is not empty and holds no dshdb store"),
        "{message}"
    );
    assert!(!message.contains("no dshdb store at"), "{message}");
    assert_eq!(entries(&folder), vec!["readme".to_string()]);
}

#[test]
fn error_chains_do_not_repeat_a_cause() {
    // /proc takes no new directories: the I/O error is wrapped by the engine's error, which
    // prints it too.
    let message = failure(&["init", "/proc/dshdb-no-such/store"], "");
    assert_eq!(message.matches("(os error").count(), 1, "{message}");
}

#[test]
fn append_refuses_a_mistyped_event_type_and_names_the_known_one() {
    let dir = temp_dir("typo-type");
    let store = dir.join("store");
    let store = path_str(&store);
    let input = format!("{TURN}\n{}\n", r#"{"type":"user/mesage","data":{}}"#);
    let message = failure(&["append", store, "typo", "--create"], &input);
    assert!(message.contains("line 2"), "{message}");
    assert!(message.contains("\"user/mesage\""), "{message}");
    assert!(
        message.contains("did you mean \"user/message\""),
        "{message}"
    );
    // The line before it stays; the session still derives its messages.
    assert_eq!(ok(&["events", store, "typo"], "").lines().count(), 1);
    ok(&["messages", store, "typo"], "");
    // A type of one's own is fine when marked ignorable, and views still read the session.
    ok(
        &["append", store, "typo"],
        r#"{"type":"plugin/note","data":{},"ignorable":true}"#,
    );
    ok(&["messages", store, "typo"], "");
    // A message event whose data no view can read is refused too, and named.
    let message = failure(
        &["append", store, "typo"],
        r#"{"type":"user/message","data":{},"surfaceOp":"append"}"#,
    );
    assert!(message.contains("line 1"), "{message}");
    assert!(message.contains("lacks an identified message"), "{message}");
    ok(&["messages", store, "typo"], "");
}

/// A user message whose data carries `depth` levels of nested arrays in total.
fn deep_message(depth: usize) -> String {
    let arrays = depth - 1;
    format!(
        r#"{{"type":"user/message","data":{{"role":"user","content":[{{"type":"text","text":"hi"}}],"source":{{"kind":"user"}},"id":"m1","x":{}0{}}},"surfaceOp":"append"}}"#,
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

#[test]
fn deep_data_is_refused_past_the_limit_and_round_trips_at_it() {
    let dir = temp_dir("deep-data");
    let store = dir.join("store");
    let store = path_str(&store);
    let message = failure(
        &["append", store, "deep", "--create"],
        &deep_message(MAX_EVENT_DATA_DEPTH + 1),
    );
    assert!(message.contains("nested more than 127 levels"), "{message}");
    assert!(!message.contains("identified message"), "{message}");
    // At the limit every view reads it, and it survives both exports and imports.
    ok(
        &["append", store, "deep", "--create"],
        &deep_message(MAX_EVENT_DATA_DEPTH),
    );
    let messages = ok(&["messages", store, "deep"], "");
    assert!(messages.contains("\"m1\""), "{messages}");
    ok(&["surface", store, "deep"], "");
    ok(&["repair", store, "deep"], "");
    for format in ["dsh-jsonl", "json"] {
        let file = dir.join(&format!("deep.{format}.jsonl"));
        let file = path_str(&file);
        ok(
            &["export", store, "deep", "--format", format, "-o", file],
            "",
        );
        let copy = dir.join(&format!("copy-{format}"));
        let copy = path_str(&copy);
        ok(&["import", copy, file], "");
        assert_eq!(ok(&["messages", copy, "deep"], ""), messages, "{format}");
    }
}

#[test]
fn a_bad_line_names_its_line_once() {
    let dir = temp_dir("line-numbers");
    let store = dir.join("store");
    let store = path_str(&store);
    let message = failure(
        &["append", store, "s", "--create"],
        &format!("{TURN}\n{{\n"),
    );
    assert!(message.contains("line 2:"), "{message}");
    assert!(!message.contains("line 1 column"), "{message}");
    assert!(message.contains("column"), "{message}");
}

/// A store with one spill blob of `bytes` bytes; returns its locator.
fn store_with_blob(store: &Path, bytes: &[u8]) -> String {
    let opened = Store::open(store, Options::default()).expect("store");
    let locator = SpillStore::new(opened.storage())
        .put(bytes)
        .expect("put")
        .locator();
    opened.close().expect("close");
    locator
}

#[test]
fn spill_get_refuses_an_offset_past_the_end_and_an_output_inside_the_store() {
    let dir = temp_dir("spill-get");
    let store = dir.join("store");
    let locator = store_with_blob(&store, b"0123456789");
    let store_path = path_str(&store);
    let tail = ok(&["spill", "get", store_path, &locator, "--offset", "9"], "");
    assert_eq!(tail, "9");
    for offset in ["10", "11", "1000"] {
        let message = failure(
            &["spill", "get", store_path, &locator, "--offset", offset],
            "",
        );
        assert!(message.contains("past the end"), "{offset}: {message}");
    }
    let manifest = store.join("MANIFEST");
    let before = std::fs::read(&manifest).expect("manifest");
    let message = failure(
        &[
            "spill",
            "get",
            store_path,
            &locator,
            "-o",
            path_str(&manifest),
        ],
        "",
    );
    assert!(message.contains("inside the store"), "{message}");
    let message = failure(
        &[
            "spill",
            "get",
            store_path,
            &locator,
            "-o",
            path_str(&store.join("new-file")),
        ],
        "",
    );
    assert!(message.contains("inside the store"), "{message}");
    assert_eq!(std::fs::read(&manifest).expect("manifest"), before);
    assert!(!store.join("new-file").exists());
    let outside = dir.join("blob.bin");
    ok(
        &[
            "spill",
            "get",
            store_path,
            &locator,
            "-o",
            path_str(&outside),
        ],
        "",
    );
    assert_eq!(std::fs::read(&outside).expect("blob"), b"0123456789");
}

#[test]
fn project_reads_without_the_writer_lock() {
    let dir = temp_dir("project-read-only");
    let store = dir.join("store");
    let store_path = path_str(&store);
    ok(&["append", store_path, "s", "--create"], TURN);
    // Another writer holds the lock for the whole run of `project`.
    let writer = Store::open(&store, Options::default()).expect("writer");
    let line = ok(&["project", store_path, "s"], "");
    let value: serde_json::Value = serde_json::from_str(line.trim()).expect("JSON");
    assert_eq!(value["events"], 1);
    writer.close().expect("close");
}

#[test]
fn empty_and_control_character_session_ids_are_refused() {
    let dir = temp_dir("bad-ids");
    let store = dir.join("store");
    let store = path_str(&store);
    for id in ["", "a\nb", "carriage\rreturn"] {
        let message = failure(&["append", store, id, "--create"], TURN);
        assert!(message.contains("session id"), "{id:?}: {message}");
    }
    let log = dir.join("session.jsonl");
    std::fs::write(
        &log,
        "{\"type\":\"session\",\"version\":0,\"id\":\"x\\ny\",\"createdAt\":1,\"cwd\":\"/x\",\"delegationDepth\":0}\n",
    )
    .expect("log");
    let message = failure(&["import", store, path_str(&log)], "");
    assert!(message.contains("session id"), "{message}");
    assert_eq!(ok(&["ls", store], ""), "no sessions\n");
}

/// A minimal DSH log of session `id` (cwd `/x`, so its project directory is `--x--`).
fn dsh_log(id: &str) -> String {
    format!(
        "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":1,\"cwd\":\"/x\",\"delegationDepth\":0}}\n{TURN_LINE}\n"
    )
}

const TURN_LINE: &str = r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#;

#[test]
fn directory_import_does_not_follow_links_out_of_the_sessions_root() {
    use std::os::unix::fs::symlink;
    let dir = temp_dir("symlinks");
    let root = dir.join("root");
    let outside = dir.join("outside");
    for (base, id) in [(&root, "inside"), (&outside, "escaped")] {
        let session = base.join("--x--").join(id);
        std::fs::create_dir_all(&session).expect("session dir");
        std::fs::write(session.join("session.jsonl"), dsh_log(id)).expect("log");
    }
    // A session directory, a project directory and a root two levels up, all outside.
    symlink(outside.join("--x--/escaped"), root.join("--x--/escaped")).expect("link");
    symlink("../outside/--x--", root.join("--y--")).expect("link");
    symlink("../..", root.join("up")).expect("link");
    let store = dir.join("store");
    let output = dshdb(&["import", path_str(&store), path_str(&root)], "");
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{message}");
    for skipped in ["--x--/escaped", "--y--", "up"] {
        assert!(
            message.contains(&format!(
                "{}: it links outside",
                root.join(skipped).display()
            )),
            "{skipped}: {message}"
        );
    }
    let ids = listed_ids(&store);
    assert_eq!(ids, vec!["inside"]);
}

#[test]
fn damage_in_a_run_file_is_named_as_a_run() {
    let dir = temp_dir("run-damage");
    let store_path = dir.join("store");
    let store = path_str(&store_path);
    let lines: String = (0..400)
        .map(|n| format!("{{\"type\":\"assistant/chunk\",\"data\":{{\"n\":{n},\"text\":\"chunk {n} of a reply\"}}}}\n"))
        .collect();
    ok(&["append", store, "s", "--create"], &lines);
    ok(&["maintain", store], "");
    let run = std::fs::read_dir(store_path.join("runs"))
        .expect("runs dir")
        .map(|entry| entry.expect("entry").path())
        .find(|path| path.extension().is_some_and(|ext| ext == "run"))
        .expect("a run file");
    let mut bytes = std::fs::read(&run).expect("read run");
    // Just past the 64-byte header: inside the first compressed block.
    bytes[64 + 16] ^= 0x40;
    std::fs::write(&run, &bytes).expect("write run");
    let output = dshdb(&["verify", store], "");
    let message = stderr(&output);
    assert_eq!(output.status.code(), Some(3), "{message}");
    assert!(message.contains("corruption in run "), "{message}");
    assert!(!message.contains("segment"), "{message}");
}

#[test]
fn verify_checks_the_spill_blobs_sessions_cite() {
    let dir = temp_dir("verify-spill");
    let store_path = dir.join("store");
    let locator = store_with_blob(&store_path, b"the whole tool output");
    let store = path_str(&store_path);
    let line = format!("{{\"type\":\"turn/start\",\"data\":{{\"note\":\"{locator}\"}}}}\n");
    ok(&["append", store, "s", "--create"], &line);
    let verified = ok(&["verify", store], "");
    assert!(
        verified.contains("spill blobs cited and checked: 1"),
        "{verified}"
    );
    let blob = std::fs::read_dir(store_path.join("spill"))
        .expect("spill dir")
        .map(|entry| entry.expect("entry").path())
        .next()
        .expect("the blob file");
    let mut bytes = std::fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, &bytes).expect("damage");
    let output = dshdb(&["verify", store], "");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(stderr(&output).contains(&locator), "{}", stderr(&output));
    std::fs::remove_file(&blob).expect("remove");
    let output = dshdb(&["verify", store], "");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no such blob"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_failed_dsh_export_leaves_no_file_and_an_export_replaces_one_whole() {
    let dir = temp_dir("export-whole");
    let store = dir.join("store");
    let store = path_str(&store);
    ok(&["append", store, "s", "--create"], TURN);
    for format in ["dsh-jsonl", "dsh-jsonl-zstd"] {
        let file = dir.join(&format!("missing.{format}"));
        let file_text = path_str(&file);
        let message = failure(
            &[
                "export", store, "missing", "--format", format, "-o", file_text,
            ],
            "",
        );
        assert!(message.contains("missing"), "{message}");
        let left: Vec<_> = entries(dir.path())
            .into_iter()
            .filter(|name| name.starts_with("missing"))
            .collect();
        assert!(left.is_empty(), "a failed export left {left:?}");
        // Over an existing file, a successful export leaves exactly the new bytes.
        let target = dir.join(&format!("s.{format}"));
        std::fs::write(&target, vec![b'x'; 1 << 16]).expect("old file");
        let target_text = path_str(&target);
        ok(
            &["export", store, "s", "--format", format, "-o", target_text],
            "",
        );
        let streamed = std::fs::read(&target).expect("exported file");
        let to_stdout = dshdb(&["export", store, "s", "--format", format], "");
        assert_eq!(to_stdout.status.code(), Some(0), "{}", stderr(&to_stdout));
        assert_eq!(
            streamed, to_stdout.stdout,
            "{format}: file and stdout differ"
        );
    }
}

#[test]
fn append_refuses_a_surface_replace_the_views_would_refuse_across_invocations() {
    let dir = temp_dir("surface-rules");
    let store = dir.join("store");
    let store = path_str(&store);
    let user = |id: &str, op: &str| {
        format!(
            r#"{{"type":"user/message","data":{{"role":"user","content":[{{"type":"text","text":"{id}"}}],"source":{{"kind":"user"}},"id":"{id}"}},{op}}}"#
        )
    };
    ok(
        &["append", store, "s", "--create"],
        &format!("{TURN}\n{}\n", user("m1", r#""surfaceOp":"append""#)),
    );
    // A later invocation: the surface comes from the store, not from this process.
    let message = failure(
        &["append", store, "s"],
        &user("m2", r#""surfaceOp":{"op":"replace","start":5,"end":9}"#),
    );
    assert!(message.contains("line 1:"), "{message}");
    assert!(
        message.contains("start seq 5 not found in surface"),
        "{message}"
    );
    let listed = ok(&["ls", store], "");
    assert!(
        listed.contains("s             2"),
        "nothing was appended: {listed}"
    );
    let messages = ok(&["messages", store, "s"], "");
    assert!(messages.contains("\"m1\""), "{messages}");
    // A replace the rules admit goes in, and the views read it.
    ok(
        &["append", store, "s"],
        &user(
            "m3",
            r#""sourceEventSeqs":[1],"surfaceOp":{"op":"replace","start":1,"end":1}"#,
        ),
    );
    let messages = ok(&["messages", store, "s"], "");
    assert!(
        messages.contains("\"m3\"") && !messages.contains("\"m1\""),
        "{messages}"
    );
}
