//! `dshdb-benches exchange [--quick]`: DSH JSONL import and export throughput against a
//! serde_json line-parsing floor, on one generated session shaped like the fixtures.

use anyhow::{bail, Result};
use dshdb::exchange;
use dshdb::store::{Options, Store};
use dshdb_benches::workload::{session_jsonl, SESSION_JSONL_ID};
use serde::de::IgnoredAny;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// Events in the benchmark session (the 1.3M-event session).
pub const SESSION_EVENTS: usize = 1_300_000;
/// Events in the `--quick` session.
pub const QUICK_SESSION_EVENTS: usize = 100_000;
/// Timed repetitions of each measurement; the median is reported.
const REPETITIONS: usize = 3;

/// Runs `body` `REPETITIONS` times; returns the median rate in MB/s of `bytes`.
fn rate(bytes: usize, mut body: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut rates = Vec::new();
    for _ in 0..REPETITIONS {
        let start = Instant::now();
        body()?;
        rates.push(bytes as f64 / 1e6 / start.elapsed().as_secs_f64());
    }
    Ok(crate::median(&rates))
}

fn parse_lines_value(bytes: &[u8]) -> Result<usize> {
    let mut count = 0;
    for line in bytes
        .split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
    {
        let value: serde_json::Value = serde_json::from_slice(line)?;
        count += usize::from(value.is_object());
    }
    Ok(count)
}

fn parse_lines_ignored(bytes: &[u8]) -> Result<usize> {
    let mut count = 0;
    for line in bytes
        .split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
    {
        let _: IgnoredAny = serde_json::from_slice(line)?;
        count += 1;
    }
    Ok(count)
}

fn fresh_store(dir: &Path) -> Result<Store> {
    let _ = std::fs::remove_dir_all(dir);
    Ok(Store::open(dir, Options::default())?)
}

/// The measurements, as a markdown section.
pub fn run(work: &Path, events: usize) -> Result<String> {
    eprintln!("exchange: generating a {events}-event session");
    let jsonl = session_jsonl(0xD5D8_2026, events);
    let megabytes = jsonl.len() as f64 / 1e6;
    eprintln!("exchange: {megabytes:.0} MB of JSONL; serde_json floors");
    let floor_value = rate(jsonl.len(), || parse_lines_value(&jsonl).map(drop))?;
    let floor_ignored = rate(jsonl.len(), || parse_lines_ignored(&jsonl).map(drop))?;

    eprintln!("exchange: import dsh-jsonl");
    let dir = work.join("exchange-store");
    let import = rate(jsonl.len(), || {
        let store = fresh_store(&dir)?;
        exchange::import_dsh_jsonl(&store, &jsonl)?;
        store.close()?;
        Ok(())
    })?;
    eprintln!("exchange: export dsh-jsonl");
    let store = Store::open(&dir, Options::default())?;
    let mut exported = Vec::new();
    let export = rate(jsonl.len(), || {
        exported = exchange::export_dsh_jsonl(&store, SESSION_JSONL_ID)?;
        Ok(())
    })?;
    if exported != jsonl {
        bail!("export is not byte-identical to the imported JSONL");
    }
    eprintln!("exchange: export dsh-jsonl-zstd");
    let mut compressed = Vec::new();
    let export_zstd = rate(jsonl.len(), || {
        compressed = exchange::export_dsh_jsonl_zstd(&store, SESSION_JSONL_ID)?;
        Ok(())
    })?;
    store.close()?;
    drop(store);
    eprintln!("exchange: import dsh-jsonl-zstd");
    let zstd_dir = work.join("exchange-store-zstd");
    let import_zstd = rate(jsonl.len(), || {
        let store = fresh_store(&zstd_dir)?;
        exchange::import_dsh_jsonl_zstd(&store, &compressed)?;
        store.close()?;
        Ok(())
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&zstd_dir);

    let mut out = String::new();
    writeln!(
        out,
        "### DSH import and export throughput ({events} events, {megabytes:.0} MB of JSONL, \
         {:.0} MB as JSONL-zstd; MB/s of plaintext JSONL, median of {REPETITIONS})\n",
        compressed.len() as f64 / 1e6
    )?;
    writeln!(out, "| operation | MB/s | vs serde_json Value floor |")?;
    writeln!(out, "|---|---:|---:|")?;
    for (name, value) in [
        (
            "floor: serde_json::from_slice::<Value> per line",
            floor_value,
        ),
        (
            "floor: serde_json::from_slice::<IgnoredAny> per line (validate only)",
            floor_ignored,
        ),
        (
            "dshdb import dsh-jsonl (validated, durable: one atomic batch + fdatasync)",
            import,
        ),
        (
            "dshdb export dsh-jsonl (byte-identical to the input)",
            export,
        ),
        ("dshdb import dsh-jsonl-zstd", import_zstd),
        ("dshdb export dsh-jsonl-zstd", export_zstd),
    ] {
        writeln!(out, "| {name} | {value:.0} | {:.2}× |", value / floor_value)?;
    }
    writeln!(out)?;
    Ok(out)
}
