//! The CLI against DSH's oracle fixtures (conformance; skipped with one stderr line when the
//! fixtures are missing, a failure under `CI=true`): `dshdb import` → `dshdb export` gives back
//! the DSH file byte for byte, refusals write nothing, DSH sessions directories import as DSH
//! discovers them, and the canonical JSON format round-trips.

use dshdb_e2e::{dshdb, fixtures_dir, fixtures_present, text};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("e2e-dsh-logs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("create scratch dir");
    path
}

#[test]
fn import_then_export_is_byte_identical() {
    if !fixtures_present() {
        return;
    }
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
        let input = fixtures_dir().join(format!("{name}.input.jsonl"));
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
    if !fixtures_present() {
        return;
    }
    let dir = scratch("refused");
    let store = dir.join("store");
    let store = store.to_str().expect("utf8 path");
    let input = fixtures_dir().join("syn-corrupt-middle.input.jsonl");
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
    if !fixtures_present() {
        return;
    }
    let dir = scratch("canonical");
    let first = dir.join("first");
    let second = dir.join("second");
    let (first, second) = (
        first.to_str().expect("utf8 path"),
        second.to_str().expect("utf8 path"),
    );
    let input = fixtures_dir().join("syn-packed-chunks.input.jsonl");
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
    let _ = std::fs::remove_dir_all(&dir);
}

/// Copies a fixture into a DSH sessions root at `<root>/<project>/<session dir>/session.jsonl`.
fn place(root: &Path, project: &str, session_directory: &str, fixture: &str) -> PathBuf {
    let directory = root.join(project).join(session_directory);
    std::fs::create_dir_all(&directory).expect("create session dir");
    let path = directory.join("session.jsonl");
    std::fs::copy(fixtures_dir().join(format!("{fixture}.input.jsonl")), &path)
        .expect("copy fixture");
    path
}

#[test]
fn sessions_directory_import_binds_header_to_path() {
    if !fixtures_present() {
        return;
    }
    let dir = scratch("layout");
    let root = dir.join("sessions");
    // The fixtures' cwd is /home/oracle/project: DSH's projectKey is --home-oracle-project--.
    let project = "--home-oracle-project--";
    place(&root, project, "syn-packed-chunks", "syn-packed-chunks");
    let misplaced = place(&root, project, "someone-else", "syn-numbers");
    let wrong_project = place(
        &root,
        "--elsewhere--",
        "syn-unicode-crlf",
        "syn-unicode-crlf",
    );
    let store = dir.join("store");
    let store = store.to_str().expect("utf8 path");
    let output = dshdb(&["import", store, root.to_str().expect("utf8 path")]);
    assert!(!output.status.success(), "two logs are misplaced");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "corrupt session log \"{}\": requested id \"someone-else\" does not match header id \"syn-numbers\"",
            misplaced.display()
        )),
        "{stderr}"
    );
    let expected = root
        .join(project)
        .join("syn-unicode-crlf")
        .join("session.jsonl");
    assert!(
        stderr.contains(&format!(
            "corrupt session log \"{}\": header id \"syn-unicode-crlf\" and cwd identify \"{}\"",
            wrong_project.display(),
            expected.display()
        )),
        "{stderr}"
    );
    assert!(text(&output.stdout).contains("imported syn-packed-chunks: "));
    let listed = text(&dshdb(&["ls", store]).stdout);
    assert!(listed.contains("syn-packed-chunks"), "{listed}");
    assert!(!listed.contains("syn-numbers"), "{listed}");
    assert!(!listed.contains("syn-unicode-crlf"), "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sessions_directory_layout_refusals_write_nothing() {
    if !fixtures_present() {
        return;
    }
    let dir = scratch("layout-refusals");
    let store = dir.join("store");
    let store = store.to_str().expect("utf8 path");
    let project = "--home-oracle-project--";

    let flat_root = dir.join("flat");
    place(
        &flat_root,
        project,
        "syn-packed-chunks",
        "syn-packed-chunks",
    );
    let flat = flat_root.join(project).join("old.jsonl");
    std::fs::write(&flat, b"{}\n").expect("write flat file");
    let output = dshdb(&["import", store, flat_root.to_str().expect("utf8")]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("uses the unsupported flat-file layout"),
        "{}",
        text(&output.stderr)
    );

    let duplicate_root = dir.join("duplicate");
    place(
        &duplicate_root,
        project,
        "syn-packed-chunks",
        "syn-packed-chunks",
    );
    place(
        &duplicate_root,
        "--other--",
        "syn-packed-chunks",
        "syn-packed-chunks",
    );
    let output = dshdb(&["import", store, duplicate_root.to_str().expect("utf8")]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains(
            "duplicate JSONL session id \"syn-packed-chunks\" appears in multiple project directories"
        ),
        "{}",
        text(&output.stderr)
    );

    let mixed_root = dir.join("mixed");
    place(
        &mixed_root,
        project,
        "syn-packed-chunks",
        "syn-packed-chunks",
    );
    let zstd_dir = mixed_root.join(project).join("syn-numbers");
    std::fs::create_dir_all(&zstd_dir).expect("mkdir");
    std::fs::write(zstd_dir.join("session.jsonl.zstd"), b"").expect("write");
    let output = dshdb(&["import", store, mixed_root.to_str().expect("utf8")]);
    assert!(!output.status.success());
    // Logs are found in name order; the first (syn-numbers, zstd) sets the root's encoding.
    assert!(
        text(&output.stderr)
            .contains("uses .jsonl, but this backend is configured for compression \"zstd\""),
        "{}",
        text(&output.stderr)
    );
    // Every refusal came before the store was even created.
    assert!(!Path::new(store).exists());

    // One session directory given alone imports, its identity checked against its parent.
    let single = dshdb(&[
        "import",
        store,
        flat_root
            .join(project)
            .join("syn-packed-chunks")
            .to_str()
            .expect("utf8"),
    ]);
    assert!(single.status.success(), "{}", text(&single.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}
