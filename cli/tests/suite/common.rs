//! The one helper module of the CLI's integration tests: running the built `dshdb` binary
//! and scratch directories.
#![allow(dead_code)]

use dshdb_test_support::run_with_input;
use std::path::Path;
use std::process::Output;

/// Runs `dshdb ARGS` with `stdin` as its input and returns what it printed and its status.
pub fn run_dshdb(args: &[&str], stdin: &[u8]) -> Output {
    run_with_input(Path::new(env!("CARGO_BIN_EXE_dshdb")), args, stdin)
}

pub use dshdb_test_support::TempDir;

/// A directory under the target's test scratch space, removed on drop.
pub fn temp_dir(name: &str) -> TempDir {
    TempDir::new_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "cli", name)
}

pub fn dshdb(args: &[&str], stdin: impl AsRef<[u8]>) -> Output {
    run_dshdb(args, stdin.as_ref())
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs dshdb and asserts it exits 0; returns stdout.
pub fn ok(args: &[&str], stdin: &str) -> String {
    let output = dshdb(args, stdin);
    assert_eq!(
        output.status.code(),
        Some(0),
        "dshdb {args:?} failed: {}",
        stderr(&output)
    );
    stdout(&output)
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// The session ids `dshdb ls --json` lists for the store in `store`, in its order.
pub fn listed_ids(store: &Path) -> Vec<String> {
    let listing = ok(&["ls", path_str(store), "--json"], "");
    let sessions: serde_json::Value = serde_json::from_str(&listing).expect("JSON");
    sessions
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|session| session["id"].as_str().map(str::to_owned))
        .collect()
}
