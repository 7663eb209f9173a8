//! `dshdb import` → `dshdb export` gives back the DSH file byte for byte.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/dsh");

fn scratch(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-exchange-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("create scratch dir");
    path
}

fn dshdb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dshdb"))
        .args(args)
        .output()
        .expect("run dshdb")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn import_then_export_is_byte_identical() {
    let dir = scratch("roundtrip");
    let store = dir.join("store");
    let store = store.to_str().expect("utf8 path");
    for (name, id) in [
        ("syn-packed-chunks", "syn-packed-chunks"),
        (
            "goal-multi-turn-actions.session",
            "oracle-goal-multi-turn-actions.session",
        ),
        ("syn-unicode-crlf", "syn-unicode-crlf"),
    ] {
        let input = Path::new(FIXTURES).join(format!("{name}.input.jsonl"));
        let original = std::fs::read(&input).expect("fixture");
        let imported = dshdb(&["import", store, input.to_str().expect("utf8 path")]);
        assert!(
            imported.status.success(),
            "{name}: {}",
            text(&imported.stderr)
        );
        let report = text(&imported.stdout);
        assert!(
            report.contains(&format!("imported {id}: ")),
            "{name}: {report}"
        );
        let out = dir.join(format!("{name}.jsonl"));
        let exported = dshdb(&[
            "export",
            store,
            id,
            "--format",
            "dsh-jsonl",
            "-o",
            out.to_str().expect("utf8"),
        ]);
        assert!(
            exported.status.success(),
            "{name}: {}",
            text(&exported.stderr)
        );
        let mut expected = original.clone();
        if name == "syn-unicode-crlf" {
            assert!(report.contains("dropped tail: 1 bytes"), "{report}");
            expected.pop();
        }
        assert!(
            std::fs::read(&out).expect("export") == expected,
            "{name}: bytes differ"
        );
        let stdout = dshdb(&["export", store, id]);
        assert!(stdout.stdout == expected, "{name}: stdout export differs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refused_log_is_reported_and_not_imported() {
    let dir = scratch("refused");
    let store = dir.join("store");
    let store = store.to_str().expect("utf8 path");
    let input = Path::new(FIXTURES).join("syn-corrupt-middle.input.jsonl");
    let output = dshdb(&["import", store, input.to_str().expect("utf8 path")]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("corrupt session log: unparsable committed event at line 3"),
        "{}",
        text(&output.stderr)
    );
    let info = dshdb(&["info", store, "syn-corrupt-middle"]);
    assert!(!info.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
