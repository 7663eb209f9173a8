//! Helpers every test suite of the workspace shares (the engine's, the CLI's and the
//! end-to-end suite): scratch directories, running a binary with piped input, and where the
//! DSH oracle fixtures are. One copy here, so the suites cannot drift apart (the fixture skip
//! line and its `CI=true` rule in particular).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod fixtures;
pub mod mutation;

/// A fresh directory `<base>/<prefix>-<name>-<pid>-<counter>`, removed when dropped. The pid
/// and the counter keep parallel tests (and parallel test binaries) apart.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new_in(base: &Path, prefix: &str, name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = base.join(format!("{prefix}-{name}-{}-{unique}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch directory");
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

/// The names of the entries directly inside `folder`, sorted: what a test compares to show
/// that a command left a folder as it was.
pub fn sorted_entries(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .unwrap_or_else(|error| panic!("list {}: {error}", folder.display()))
        .map(|entry| {
            entry
                .expect("directory entry")
                .file_name()
                .into_string()
                .expect("UTF-8 file name")
        })
        .collect();
    names.sort();
    names
}

/// Runs `binary ARGS` with `stdin` as its input and returns what it printed and its status.
pub fn run_with_input(binary: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("spawn {}: {error}", binary.display()));
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
    child.wait_with_output().expect("wait for the child")
}
