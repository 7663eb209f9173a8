//! Helpers of the workspace's end-to-end suite (`tests/e2e`): the built `dshdb` binary, scratch
//! directories, and the DSH oracle fixtures beside the repository.
//!
//! The suite runs the real binary, so [`dshdb_binary`] first runs `cargo build --workspace
//! --tests --bins` in the suite's own profile and target directory: the very build of `cargo
//! test --workspace`, so a no-op after it (`-p dshdb-cli` alone resolves the dependencies'
//! features differently and rebuilt 60-90 crates: two minutes of every CI run), and never a
//! stale binary when `cargo test -p dshdb-e2e` runs alone.

use dshdb_test_support::run_with_input;
pub use dshdb_test_support::TempDir;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Points the suite at another `dshdb` binary.
pub const BINARY_VARIABLE: &str = "DSHDB_BIN";

/// The `dshdb` binary of this build: `$DSHDB_BIN`, else `dshdb` in the profile directory the
/// test binary runs from (`target/<profile>/deps/..`), brought up to date by `cargo build`.
pub fn dshdb_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os(BINARY_VARIABLE) {
            return PathBuf::from(path);
        }
        let test_binary = std::env::current_exe().expect("path of the test binary");
        let profile_dir = test_binary
            .parent()
            .and_then(Path::parent)
            .expect("the test binary runs from target/<profile>/deps");
        let binary = profile_dir.join(format!("dshdb{}", std::env::consts::EXE_SUFFIX));
        build_binary(profile_dir);
        assert!(binary.is_file(), "no dshdb binary at {}", binary.display());
        binary
    })
}

/// Prefixes of the variables cargo sets for a test process (and for build scripts), which
/// the inner `cargo build` must not inherit.
const TEST_PROCESS_VARIABLES: &[&str] = &[
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_CFG_",
    "OUT_DIR",
];

/// `cargo build --workspace --tests --bins` (module doc) into the profile directory the suite
/// was built in.
fn build_binary(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let mut command = Command::new(cargo);
    // The variables cargo gave this test process (its package's name and version, manifest
    // dir, ...) are not the outer build's: build scripts that watch them (ring's watches
    // CARGO_PKG_NAME and CARGO_MANIFEST_DIR) would run again and rebuild their dependents.
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|name| {
            TEST_PROCESS_VARIABLES
                .iter()
                .any(|prefix| name.starts_with(prefix))
        }) {
            command.env_remove(&name);
        }
    }
    command
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--tests",
            "--bins",
            "--target-dir",
        ])
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        command.arg("--release");
    }
    let output = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo build");
    assert!(
        output.status.success(),
        "cargo build --workspace --tests --bins failed: {}",
        text(&output.stderr)
    );
}

/// Runs `dshdb ARGS` with `stdin` as its input.
pub fn dshdb_with_input(args: &[&str], stdin: &[u8]) -> Output {
    run_with_input(dshdb_binary(), args, stdin)
}

/// Runs `dshdb ARGS` with no input.
pub fn dshdb(args: &[&str]) -> Output {
    dshdb_with_input(args, b"")
}

/// Runs `dshdb ARGS`, asserts it exits 0 and returns its stdout.
pub fn dshdb_ok(args: &[&str]) -> Vec<u8> {
    let output = dshdb(args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "dshdb {args:?}: {}",
        text(&output.stderr)
    );
    output.stdout
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A path as the `&str` argument of a command.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A fresh directory under the system's temporary directory, removed when dropped.
pub type Scratch = TempDir;

/// A fresh scratch directory for test `name`.
pub fn scratch(name: &str) -> Scratch {
    TempDir::new_in(&std::env::temp_dir(), "dshdb-e2e", name)
}

pub use dshdb_test_support::fixtures::{directory as fixtures_dir, present as fixtures_present};

/// The path of fixture `NAME.input.jsonl`.
pub fn fixture_input(name: &str) -> PathBuf {
    fixtures_dir().join(format!("{name}.input.jsonl"))
}
