//! `dshdb-resume-baseline FILE`: the cold-resume baseline of `dshdb-benches compare`.
//!
//! Reads a DSH `session.jsonl.zstd` as any reader of that file must: zstd-decode it and parse
//! every line to a `serde_json::Value` (no derivation of messages, which favours it). Built
//! outside the main workspace so serde_json has its default features only (see Cargo.toml).
//! Prints `millis peak_rss_mib cpu_millis`, like the `dshdb-benches child` commands.

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

fn resume(path: &str) -> Result<usize, Box<dyn std::error::Error>> {
    let file = std::fs::read(path)?;
    let plain = zstd::decode_all(file.as_slice())?;
    let values = plain
        .split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
        .map(serde_json::from_slice::<serde_json::Value>)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(values.len())
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
