//! Helpers of the workspace's end-to-end suite (`tests/e2e`): the built `dshdb` binary, scratch
//! directories, and the DSH oracle fixtures beside the repository.
//!
//! The suite runs the real binary, so [`dshdb_binary`] first runs `cargo build -p dshdb-cli`
//! in the suite's own profile and target directory: a no-op after `cargo test --workspace`
//! (which builds it for the CLI's tests), and never a stale binary when `cargo test -p
//! dshdb-e2e` runs alone.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Points the suite at another `dshdb` binary.
pub const BINARY_VARIABLE: &str = "DSHDB_BIN";
/// Overrides where the DSH fixtures are looked for.
pub const FIXTURES_VARIABLE: &str = "DSH_FIXTURES";

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

/// `cargo build -p dshdb-cli` into the profile directory the suite was built in.
fn build_binary(profile_dir: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--quiet",
            "-p",
            "dshdb-cli",
            "--bin",
            "dshdb",
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
        "cargo build -p dshdb-cli failed: {}",
        text(&output.stderr)
    );
}

/// Runs `dshdb ARGS` with `stdin` as its input.
pub fn dshdb_with_input(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(dshdb_binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dshdb");
    let mut input = child.stdin.take().expect("stdin");
    // A command that fails before reading its input closes the pipe early.
    if let Err(error) = input.write_all(stdin) {
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::BrokenPipe,
            "write stdin: {error}"
        );
    }
    drop(input);
    child.wait_with_output().expect("wait for dshdb")
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
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("dshdb-e2e-{name}-{}-{unique}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch directory");
        Scratch(path)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the DSH oracle fixtures are: `$DSH_FIXTURES`, else `shared/fixtures/dsh` beside the
/// repository.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os(FIXTURES_VARIABLE) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/dsh"
        )),
    }
}

/// Whether the environment says this is a CI run (`CI=true`).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// Whether the DSH oracle fixtures are there. Without them the first call prints one line on
/// stderr naming what is skipped and why, and the caller skips; under `CI=true` it panics.
pub fn fixtures_present() -> bool {
    let directory = fixtures_dir();
    if directory.join("README.md").is_file() {
        return true;
    }
    assert!(
        !in_ci(),
        "CI=true but the DSH oracle fixtures are missing at {}: the DSH conformance suite \
         must run in CI (set {FIXTURES_VARIABLE} or put shared/fixtures/dsh beside the repository)",
        directory.display()
    );
    static NOTICE: Once = Once::new();
    NOTICE.call_once(|| {
        // Straight to the stream, past the test harness's capture: a skip must be visible.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the DSH conformance tests of this suite (they compare with DSH's oracle \
             fixtures, which are not in the repository): no fixtures at {} (set \
             {FIXTURES_VARIABLE}, or put shared/fixtures/dsh beside the repository; under \
             CI=true this is an error)",
            directory.display()
        );
    });
    false
}

/// The path of fixture `NAME.input.jsonl`.
pub fn fixture_input(name: &str) -> PathBuf {
    fixtures_dir().join(format!("{name}.input.jsonl"))
}
