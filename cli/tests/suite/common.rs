//! Running the built `dshdb` binary, shared by the CLI test files.

use std::io::Write;
use std::process::{Command, Output, Stdio};

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
