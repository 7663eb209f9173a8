//! The DSH oracle fixtures, read by the conformance tests. Where they are, and the skip (or,
//! under `CI=true`, the failure) when they are missing: `dshdb_test_support::fixtures`.
#![allow(dead_code)]

use dshdb::session::json::js_number;
use serde_json::Value;
use std::fs;
use std::path::PathBuf;

pub use dshdb_test_support::fixtures::{directory, present};

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
