//! The DSH oracle fixtures in `shared/fixtures/dsh` beside the repository (or in
//! `$DSH_FIXTURES`), shared by the conformance tests. They are not part of the repository, so
//! a fresh clone has none: every test reading them starts with `if !present() { return; }`,
//! which skips it after one line on stderr (once per test binary), and fails it under `CI=true`,
//! where the conformance suite must run.
#![allow(dead_code)]

use dshdb::session::json::js_number;
use serde_json::Value;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Once;

/// Overrides where the fixtures are looked for.
pub const DIRECTORY_VARIABLE: &str = "DSH_FIXTURES";

/// Where the fixtures are: `$DSH_FIXTURES`, else `shared/fixtures/dsh` beside the repository.
pub fn directory() -> PathBuf {
    match std::env::var_os(DIRECTORY_VARIABLE) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/dsh"
        )),
    }
}

/// Whether the environment says this is a CI run (`CI=true`, as CI services set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// Whether the DSH oracle fixtures are there. Without them, the first call prints one line on
/// stderr naming what is skipped and why; under `CI=true` it panics instead.
pub fn present() -> bool {
    let directory = directory();
    if directory.join("README.md").is_file() {
        return true;
    }
    assert!(
        !in_ci(),
        "CI=true but the DSH oracle fixtures are missing at {}: the DSH conformance suite \
         must run in CI (set {DIRECTORY_VARIABLE} or put shared/fixtures/dsh beside the repository)",
        directory.display()
    );
    static NOTICE: Once = Once::new();
    NOTICE.call_once(|| {
        // Straight to the stream, past the test harness's capture: a skip must be visible.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: the DSH conformance tests of this suite (they compare with DSH's oracle \
             fixtures, which are not in the repository): no fixtures at {} (set \
             {DIRECTORY_VARIABLE}, or put shared/fixtures/dsh beside the repository; under \
             CI=true this is an error)",
            directory.display()
        );
    });
    false
}

pub fn fixture_path(name: &str, suffix: &str) -> PathBuf {
    directory().join(format!("{name}.{suffix}"))
}

pub fn read_optional(name: &str, suffix: &str) -> Option<String> {
    fs::read(fixture_path(name, suffix))
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// The bytes of fixture `NAME.input.jsonl`.
pub fn input(name: &str) -> Vec<u8> {
    let path = fixture_path(name, "input.jsonl");
    fs::read(&path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// Every case name (`NAME.input.jsonl`), sorted.
pub fn case_names() -> Vec<String> {
    let entries = fs::read_dir(directory()).expect("fixture directory is readable");
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|file| file.strip_suffix(".input.jsonl").map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The first `message:` line of a DSH error report.
pub fn dsh_error_message(report: &str) -> String {
    report
        .lines()
        .find_map(|line| line.strip_prefix("message: "))
        .expect("error report has a message line")
        .to_owned()
}

/// JSON as DSH holds it: numbers are doubles (`1.0` = `1`, `-0` prints `0`, overflow is
/// `null` once stringified); objects compare without key order.
pub fn js_normalized(value: &Value) -> Value {
    match value {
        Value::Number(number) => match js_number(&number.to_string()) {
            Some(double) if double.is_finite() => {
                serde_json::Number::from_f64(double + 0.0).map_or(Value::Null, Value::Number)
            }
            _ => Value::Null,
        },
        Value::Array(items) => Value::Array(items.iter().map(js_normalized).collect()),
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map
                .iter()
                .map(|(key, value)| (key.clone(), js_normalized(value)))
                .collect();
            entries.sort_by(|left, right| left.0.cmp(&right.0));
            Value::Object(entries.into_iter().collect())
        }
        other => other.clone(),
    }
}
