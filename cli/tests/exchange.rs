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

#[test]
fn json_format_round_trips_through_a_second_store() {
    let dir = scratch("canonical");
    let first = dir.join("first");
    let second = dir.join("second");
    let (first, second) = (
        first.to_str().expect("utf8 path"),
        second.to_str().expect("utf8 path"),
    );
    let input = Path::new(FIXTURES).join("syn-packed-chunks.input.jsonl");
    let output = dshdb(&[
        "import",
        first,
        input.to_str().expect("utf8 path"),
        "--quiet",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let dsh = dshdb(&["export", first, "syn-packed-chunks"]);
    assert!(dsh.status.success(), "{}", text(&dsh.stderr));

    let canonical_path = dir.join("session.dshdb.jsonl");
    let canonical_file = canonical_path.to_str().expect("utf8 path");
    let output = dshdb(&[
        "--quiet",
        "export",
        first,
        "syn-packed-chunks",
        "--format",
        "json",
        "-o",
        canonical_file,
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let canonical = std::fs::read(&canonical_path).expect("read canonical export");
    assert!(text(&canonical).starts_with(r#"{"format":"dshdb-json","version":1,"header":"#));
    let stdout = dshdb(&["export", first, "syn-packed-chunks", "--format", "json"]);
    assert!(stdout.stdout == canonical, "stdout and -o exports agree");

    let output = dshdb(&["import", second, canonical_file]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("dshdb-json"),
        "{}",
        text(&output.stdout)
    );
    assert!(output.stderr.is_empty(), "no progress without a terminal");
    let dsh_again = dshdb(&["export", second, "syn-packed-chunks"]);
    assert!(dsh_again.status.success(), "{}", text(&dsh_again.stderr));
    assert!(
        dsh_again.stdout == dsh.stdout,
        "DSH export differs after round trip"
    );
    let again = dshdb(&["export", second, "syn-packed-chunks", "--format", "json"]);
    assert!(again.stdout == canonical, "canonical export is not stable");

    // A canonical file of an unknown version is refused.
    let bumped = text(&canonical).replacen(r#""version":1,"#, r#""version":9,"#, 1);
    let bumped_path = dir.join("bumped.jsonl");
    std::fs::write(&bumped_path, bumped).expect("write bumped");
    let third = dir.join("third");
    let output = dshdb(&[
        "import",
        third.to_str().expect("utf8 path"),
        bumped_path.to_str().expect("utf8 path"),
    ]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("version 9 is not supported"),
        "{}",
        text(&output.stderr)
    );
}
