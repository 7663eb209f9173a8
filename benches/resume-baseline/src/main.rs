//! `dshdb-resume-baseline FILE`: the cold-resume baseline of `dshdb-benches compare`.
//!
//! Reads a DSH `session.jsonl.zstd` as any reader of that file must: stream-decode the zstd
//! frames, parse every line to a `serde_json::Value` and expand packed chunk rows into their
//! member events (no derivation of messages, which favours it). Built
//! outside the main workspace so serde_json has its default features only (see Cargo.toml).
//! Prints `millis peak_rss_mib cpu_millis`, like the `dshdb-benches child` commands.

use serde_json::{Map, Value};
use std::io::{BufRead, BufReader};
use std::process::ExitCode;
use std::time::Instant;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The process's time on a CPU so far, in ms: its main thread's, the first field of
/// `/proc/self/schedstat` (ns); both sides of the cold resume run on one thread.
fn cpu_millis() -> f64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |nanos| nanos / 1e6)
}

/// The `assistant/chunk` delta type of a packed row tag (persistence §2.4), if it is one.
fn delta_type(tag: &str) -> Option<&'static str> {
    match tag {
        "text-chunks" => Some("text-delta"),
        "reasoning-chunks" => Some("reasoning-delta"),
        "tool-call-chunks" => Some("tool-call-delta"),
        _ => None,
    }
}

/// Expands a packed chunk row into its member events, as every reader of DSH's file must;
/// any other record is one event.
fn push_events(record: Value, events: &mut Vec<Value>) -> Result<(), String> {
    let Some(kind) = record.get("type").and_then(Value::as_str).and_then(delta_type) else {
        events.push(record);
        return Ok(());
    };
    let malformed = || format!("malformed {kind} row");
    let data = record.get("data").ok_or_else(malformed)?;
    let tool = kind == "tool-call-delta";
    let payloads = data
        .get(if tool { "args" } else { "texts" })
        .and_then(Value::as_array)
        .ok_or_else(malformed)?;
    let gaps = data.get("dt").and_then(Value::as_array).ok_or_else(malformed)?;
    let seq0 = record.get("seq0").and_then(Value::as_u64).ok_or_else(malformed)?;
    let mut time = record.get("time0").and_then(Value::as_i64).ok_or_else(malformed)?;
    for (offset, payload) in payloads.iter().enumerate() {
        if offset > 0 {
            time += gaps.get(offset - 1).and_then(Value::as_i64).ok_or_else(malformed)?;
        }
        let mut chunk = Map::new();
        chunk.insert("type".into(), Value::from(kind));
        chunk.insert("index".into(), data["index"].clone());
        if tool {
            chunk.insert("id".into(), data["id"].clone());
            if let Some(name) = data.get("name") {
                chunk.insert("name".into(), name.clone());
            }
            chunk.insert("argumentsDelta".into(), payload.clone());
        } else {
            chunk.insert("text".into(), payload.clone());
        }
        let mut member_data = Map::new();
        member_data.insert("turn".into(), data["turn"].clone());
        member_data.insert("step".into(), data["step"].clone());
        member_data.insert("chunk".into(), Value::Object(chunk));
        let mut event = Map::new();
        event.insert("type".into(), Value::from("assistant/chunk"));
        event.insert("seq".into(), Value::from(seq0 + offset as u64));
        event.insert("time".into(), Value::from(time));
        event.insert("data".into(), Value::Object(member_data));
        events.push(Value::Object(event));
    }
    Ok(())
}

/// Streams the zstd file line by line, parsing each to a `Value` and expanding packed rows.
fn resume(path: &str) -> Result<usize, Box<dyn std::error::Error>> {
    let file = std::fs::File::open(path)?;
    let mut reader = BufReader::with_capacity(1 << 20, zstd::stream::read::Decoder::new(file)?);
    let mut events = Vec::new();
    let mut line = Vec::new();
    let mut header = None;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        if text.is_empty() {
            continue;
        }
        let value: Value = serde_json::from_slice(text)?;
        if header.is_none() {
            header = Some(value);
            continue;
        }
        push_events(value, &mut events)?;
    }
    Ok(events.len() + usize::from(header.is_some()))
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: dshdb-resume-baseline FILE");
        return ExitCode::FAILURE;
    };
    let started = Instant::now();
    match resume(&path) {
        Ok(lines) if lines > 1 => {
            println!(
                "{} {} {}",
                started.elapsed().as_secs_f64() * 1e3,
                peak_rss_mib(),
                cpu_millis()
            );
            ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("no events read");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}
