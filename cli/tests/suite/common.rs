//! The one helper module of the CLI's integration tests: running the built `dshdb` binary
//! and scratch directories.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `dshdb ARGS` with `stdin` as its input and returns what it printed and its status.
pub fn run_dshdb(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dshdb"))
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

/// A directory under the target's test scratch space, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("cli-{name}-{}-{unique}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
