//! `dshdb import` of a DSH sessions folder: several sessions at once, each streamed all or
//! nothing; a refused log is reported with DSH's text and leaves no session, the others are
//! imported and export byte for byte as they were; no progress is drawn when stderr is not
//! a terminal.

use crate::common::*;
use std::path::Path;

/// A DSH log of `turns` closed turns, each with a few titles between its brackets.
fn dsh_log(id: &str, turns: u64) -> String {
    let mut log = format!(
        "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":1,\"cwd\":\"/x\",\"delegationDepth\":0}}\n"
    );
    let mut seq = 0;
    for turn in 1..=turns {
        let mut line = |event_type: &str, data: String| {
            log.push_str(&format!(
                "{{\"type\":\"{event_type}\",\"seq\":{seq},\"time\":{seq},\"data\":{data}}}\n"
            ));
            seq += 1;
        };
        line("turn/start", format!("{{\"turn\":{turn}}}"));
        for title in 0..3 {
            line(
                "session/title",
                format!("{{\"title\":\"{id} {turn}.{title}\"}}"),
            );
        }
        line(
            "turn/end",
            format!("{{\"turn\":{turn},\"reason\":{{\"kind\":\"completed\"}}}}"),
        );
    }
    log
}

fn write_session(root: &Path, id: &str, name: &str, bytes: &[u8]) {
    let folder = root.join("--x--").join(id);
    std::fs::create_dir_all(&folder).expect("session folder");
    std::fs::write(folder.join(name), bytes).expect("session log");
}

/// The log as `session.jsonl.zstd`, by way of a scratch store's export.
fn zstd_of(dir: &Path, id: &str, log: &str) -> Vec<u8> {
    let scratch = dir.join(format!("scratch-{id}"));
    let file = dir.join(format!("{id}.jsonl"));
    std::fs::write(&file, log).expect("scratch log");
    ok(&["import", path_str(&scratch), path_str(&file)], "");
    let output = dshdb(
        &[
            "export",
            path_str(&scratch),
            id,
            "--format",
            "dsh-jsonl-zstd",
        ],
        "",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    output.stdout
}

#[test]
fn a_sessions_folder_imports_every_session_at_once_and_refuses_one_alone() {
    let dir = temp_dir("folder-import");
    // DSH keeps one encoding per root: plain logs in one, zstd in the other.
    let (plain_root, zstd_root) = (dir.join("plain"), dir.join("zstd"));
    let mut expected = Vec::new();
    for index in 0..6u64 {
        let id = format!("session-{index}");
        let log = dsh_log(&id, 20 + index);
        if index % 2 == 0 {
            write_session(&plain_root, &id, "session.jsonl", log.as_bytes());
        } else {
            write_session(
                &zstd_root,
                &id,
                "session.jsonl.zstd",
                &zstd_of(dir.path(), &id, &log),
            );
        }
        expected.push((id, log));
    }
    // A seq gap before a `turn/end`: DSH refuses the whole log.
    let mut refused = dsh_log("refused", 2);
    refused.push_str(
        "{\"type\":\"turn/end\",\"seq\":99,\"time\":1,\"data\":{\"turn\":3,\"reason\":{\"kind\":\"completed\"}}}\n",
    );
    write_session(&plain_root, "refused", "session.jsonl", refused.as_bytes());
    let store = dir.join("store");
    let output = dshdb(
        &[
            "import",
            path_str(&store),
            path_str(&plain_root),
            path_str(&zstd_root),
        ],
        "",
    );
    let message = stderr(&output);
    assert_ne!(output.status.code(), Some(0));
    assert!(
        message.contains(
            "corrupt session log: seq gap in committed region at line 11 (expected 10, got 99)"
        ),
        "{message}"
    );
    assert!(
        message.contains("1 of 7 files were not imported"),
        "{message}"
    );
    // Nothing but the error lines: no progress bar off a terminal.
    assert_eq!(message.lines().count(), 2, "{message}");
    let printed = stdout(&output);
    for (id, log) in &expected {
        assert!(printed.contains(&format!("imported {id}: ")), "{printed}");
        let exported = dshdb(
            &["export", path_str(&store), id, "--format", "dsh-jsonl"],
            "",
        );
        assert!(
            exported.stdout == log.as_bytes(),
            "{id} does not export as imported"
        );
    }
    let ids = listed_ids(&store);
    let expected_ids: Vec<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, expected_ids);
}

/// `export -o` to a FIFO (as to `/dev/null`): the log is written into it and it stays a
/// FIFO. The export used to write `<path>.partial` and rename it over the path, which
/// replaced a device or a pipe with a regular file.
#[test]
fn export_to_a_fifo_writes_into_it_and_leaves_it_a_fifo() {
    use std::os::unix::fs::FileTypeExt;
    let dir = temp_dir("export-fifo");
    let store = dir.join("store");
    let log = dsh_log("fifo-session", 3);
    let file = dir.join("fifo-session.jsonl");
    std::fs::write(&file, &log).expect("log");
    ok(&["import", path_str(&store), path_str(&file)], "");
    let fifo = dir.join("out.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo failed");
    let reader_path = fifo.clone();
    let reader = std::thread::spawn(move || std::fs::read(reader_path).expect("read the fifo"));
    ok(
        &[
            "export",
            path_str(&store),
            "fifo-session",
            "-o",
            path_str(&fifo),
        ],
        "",
    );
    // Checked before waiting for the reader, which a replaced FIFO would leave blocked.
    let kind = std::fs::symlink_metadata(&fifo).expect("fifo").file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
    let received = reader.join().expect("reader thread");
    assert!(received == log.as_bytes(), "the fifo got another text");
    assert!(!dir.join("out.fifo.partial").exists());
}
