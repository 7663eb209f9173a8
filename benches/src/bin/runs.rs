//! `runs [--sessions N] [--events M] [--reopen-sessions S] [--reopen-events E] [--out DIR]`:
//! figures for issue #4 (run files, seq-index checkpoint, mmap reads), on the seeded
//! DSH-shaped workload of `workload.rs`:
//! - bytes on disk per event of sealed runs vs the same sessions as DSH `session.jsonl.zstd`
//!   (one zstd frame per durable batch: per event, and per turn), and write amplification;
//! - range read of 10,000 events (GB/s of JSON lines out) and point read p50/p99, warm;
//! - reopen of a store with many sessions: clean (checkpoint), after a crash (checkpoint of
//!   the runs + scan of the unsealed WAL tail), and with the checkpoint ignored (full replay).
//!
//! Prints a plain report; nothing is asserted (timings are not tests).

use anyhow::{Context, Result};
use dshdb::storage::commit::Durability;
use dshdb::store::{NewEvent, Options, Store};
use dshdb_benches::workload::{GenEvent, SessionStream, Shape};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const SEED: u64 = 0xD5D8_2026;
/// zstd level DSH's writer uses (Node's default).
const DSH_ZSTD_LEVEL: i32 = 3;
/// Events in one range read.
const RANGE_EVENTS: u64 = 10_000;
/// Point reads sampled.
const POINT_READS: usize = 20_000;

struct Config {
    sessions: usize,
    events: usize,
    reopen_sessions: usize,
    reopen_events: usize,
    out: PathBuf,
    /// Keep the reopen store (for profiling opens with `--open-only`).
    keep: bool,
    /// Only time read-only opens of this existing store.
    open_only: Option<PathBuf>,
}

fn parse_args() -> Result<Config> {
    let mut config = Config {
        sessions: 100,
        events: 5_000,
        reopen_sessions: 10_000,
        reopen_events: 100,
        out: std::env::temp_dir().join("dshdb-runs-bench"),
        keep: false,
        open_only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().context("missing value");
        match arg.as_str() {
            "--sessions" => config.sessions = value()?.parse()?,
            "--events" => config.events = value()?.parse()?,
            "--reopen-sessions" => config.reopen_sessions = value()?.parse()?,
            "--reopen-events" => config.reopen_events = value()?.parse()?,
            "--out" => config.out = PathBuf::from(value()?),
            "--keep" => config.keep = true,
            "--open-only" => config.open_only = Some(PathBuf::from(value()?)),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(config)
}

fn fresh(dir: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    Ok(())
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(metadata) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !metadata.is_dir() {
        return metadata.len();
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| dir_bytes(&entry.path()))
                .sum()
        })
        .unwrap_or(0)
}

/// The DSH `session.jsonl.zstd` size of one session: a header frame, then one frame per
/// batch, batches cut where `cut_after` says.
fn dsh_zstd_bytes(
    id: &str,
    events: &[GenEvent],
    cut_after: impl Fn(&GenEvent) -> bool,
) -> Result<u64> {
    let compress = |text: &str| -> Result<u64> {
        let mut encoder = zstd::bulk::Compressor::new(DSH_ZSTD_LEVEL)?;
        encoder.include_checksum(true)?;
        Ok(encoder.compress(text.as_bytes())?.len() as u64)
    };
    let header = format!(
        "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":1700000000000}}\n"
    );
    let mut total = compress(&header)?;
    let mut batch = String::new();
    for (seq, event) in events.iter().enumerate() {
        batch.push_str(&event.jsonl_line(seq as u64, 1_700_000_000_000 + seq as i64));
        if cut_after(event) {
            total += compress(&batch)?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        total += compress(&batch)?;
    }
    Ok(total)
}

fn write_sessions(store: &Store, streams: &[Vec<GenEvent>], prefix: &str) -> Result<u64> {
    let mut writers = (0..streams.len())
        .map(|index| store.create_session_with_id(&format!("{prefix}{index:05}")))
        .collect::<dshdb::Result<Vec<_>>>()?;
    let mut line_bytes = 0u64;
    let longest = streams.iter().map(Vec::len).max().unwrap_or(0);
    for step in 0..longest {
        for (writer, stream) in writers.iter_mut().zip(streams) {
            if let Some(event) = stream.get(step) {
                let mut new = NewEvent::new(event.event_type, &event.data);
                new.time = Some(1_700_000_000_000 + step as i64);
                writer.append(new)?;
                line_bytes += event.jsonl_line(step as u64, 0).len() as u64;
            }
        }
    }
    store.flush()?;
    Ok(line_bytes)
}

fn options() -> Options {
    Options {
        durability: Durability::Buffered,
        ..Options::default()
    }
}

fn disk_and_reads(config: &Config) -> Result<()> {
    let dir = config.out.join("disk");
    fresh(&dir)?;
    let streams: Vec<Vec<GenEvent>> = (0..config.sessions)
        .map(|index| SessionStream::new(SEED, index as u64, Shape::Dsh).take(config.events))
        .collect();
    let events = (config.sessions * config.events) as u64;
    let store = Store::open(&dir, options())?;
    let line_bytes = write_sessions(&store, &streams, "s")?;
    // Close and reopen so that every segment is sealed, then seal them all into runs.
    store.close()?;
    drop(store);
    let wal_written = dir_bytes(&dir.join("wal"));
    let store = Store::open(&dir, options())?;
    let started = Instant::now();
    let report = store.maintain()?;
    let seal_seconds = started.elapsed().as_secs_f64();
    let stats = store.stats(None)?;
    store.close()?;
    drop(store);
    let runs_bytes = dir_bytes(&dir.join("runs"));
    let store_bytes = dir_bytes(&dir);
    let (mut per_event, mut per_turn, mut whole) = (0u64, 0u64, 0u64);
    for (index, stream) in streams.iter().enumerate() {
        let id = format!("s{index:05}");
        per_event += dsh_zstd_bytes(&id, stream, |_| true)?;
        per_turn += dsh_zstd_bytes(&id, stream, |event| event.event_type == "turn/end")?;
        whole += dsh_zstd_bytes(&id, stream, |_| false)?;
    }
    let per = |bytes: u64| bytes as f64 / events as f64;
    println!(
        "## bytes on disk ({} sessions x {} DSH-mix events = {events} events)",
        config.sessions, config.events
    );
    println!(
        "DSH JSONL lines:                 {:>8.1} B/event",
        per(line_bytes)
    );
    println!(
        "dshdb WAL (frames, before seal): {:>8.1} B/event",
        per(wal_written)
    );
    println!(
        "dshdb runs/ only:                {:>8.1} B/event",
        per(runs_bytes)
    );
    println!("dshdb whole store after seal:    {:>8.1} B/event (runs + checkpoint + manifest + empty active segment)", per(store_bytes));
    println!(
        "DSH jsonl.zstd, frame per event: {:>8.1} B/event  -> dshdb runs = {:.2}x",
        per(per_event),
        runs_bytes as f64 / per_event as f64
    );
    println!(
        "DSH jsonl.zstd, frame per turn:  {:>8.1} B/event  -> dshdb runs = {:.2}x",
        per(per_turn),
        runs_bytes as f64 / per_turn as f64
    );
    println!(
        "DSH jsonl.zstd, one frame:       {:>8.1} B/event  -> dshdb runs = {:.2}x",
        per(whole),
        runs_bytes as f64 / whole as f64
    );
    println!(
        "run compression ratio (raw frames / stored blocks): {:.2}",
        stats.run_compression_ratio
    );
    println!(
        "write amplification (WAL + runs) / WAL = {:.3}; bound 1 + 1/ratio = {:.3}",
        (wal_written + report.run_bytes) as f64 / wal_written as f64,
        1.0 + 1.0 / stats.run_compression_ratio
    );
    println!(
        "sealing: {} segments, {:.1} MB raw in {seal_seconds:.2} s ({:.0} MB/s)",
        report.segments_sealed,
        report.raw_bytes as f64 / 1e6,
        report.raw_bytes as f64 / 1e6 / seal_seconds
    );

    let store = Store::open(&dir, options())?;
    let id = "s00000";
    let length = store.session(id)?.events;
    let range = RANGE_EVENTS.min(length);
    let (mut events_rates, mut lines_rates) = (Vec::new(), Vec::new());
    let mut out = String::new();
    for round in 0..11 {
        let started = Instant::now();
        let events = store.read(id, 0, range)?;
        let json: usize = events
            .iter()
            .map(|event| event.to_json_line().len() + 1)
            .sum();
        let seconds = started.elapsed().as_secs_f64();
        out.clear();
        let started = Instant::now();
        store.read_json_lines(id, 0, range, &mut out)?;
        let lines_seconds = started.elapsed().as_secs_f64();
        if round > 0 {
            events_rates.push(json as f64 / seconds / 1e9);
            lines_rates.push(out.len() as f64 / lines_seconds / 1e9);
        }
    }
    events_rates.sort_by(f64::total_cmp);
    lines_rates.sort_by(f64::total_cmp);
    println!("## reads (session {id}, {length} events, in runs; warm block cache)");
    println!(
        "range read of {range} events, read_json_lines: median {:.2} GB/s of JSON lines (best {:.2})",
        lines_rates[lines_rates.len() / 2],
        lines_rates[lines_rates.len() - 1]
    );
    println!(
        "range read of {range} events, read + to_json_line: median {:.2} GB/s (best {:.2})",
        events_rates[events_rates.len() / 2],
        events_rates[events_rates.len() - 1]
    );
    let mut rng = dshdb_benches::workload::Rng::new(SEED);
    let mut micros = Vec::with_capacity(POINT_READS);
    for _ in 0..POINT_READS {
        let seq = rng.next_u64() % length;
        let started = Instant::now();
        let event = store.get(id, seq)?;
        std::hint::black_box(event);
        micros.push(started.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(f64::total_cmp);
    let at = |p: f64| micros[((micros.len() - 1) as f64 * p) as usize];
    println!(
        "point read by seq: p50 {:.1} us, p99 {:.1} us, max {:.1} us ({POINT_READS} reads)",
        at(0.5),
        at(0.99),
        at(1.0)
    );
    store.close()?;
    Ok(())
}

fn timed_open(dir: &Path, options: Options) -> Result<(Duration, Store)> {
    let started = Instant::now();
    let store = Store::open(dir, options)?;
    Ok((started.elapsed(), store))
}

/// Read-only opens change nothing, so the same store is opened `OPENS` times: the median
/// time, and the last store opened (for its recovery report).
fn median_read_only_open(dir: &Path) -> Result<(Duration, Store)> {
    const OPENS: usize = 5;
    let mut times = Vec::with_capacity(OPENS);
    let mut last = None;
    for _ in 0..OPENS {
        drop(last.take());
        let read_only = Options {
            read_only: true,
            ..options()
        };
        let (elapsed, store) = timed_open(dir, read_only)?;
        times.push(elapsed);
        last = Some(store);
    }
    times.sort();
    let store = last.context("at least one open")?;
    Ok((times[OPENS / 2], store))
}

fn reopen(config: &Config) -> Result<()> {
    let dir = config.out.join("reopen");
    fresh(&dir)?;
    let streams: Vec<Vec<GenEvent>> = (0..config.reopen_sessions)
        .map(|index| {
            SessionStream::new(SEED ^ 7, index as u64, Shape::Dsh).take(config.reopen_events)
        })
        .collect();
    let store = Store::open(&dir, options())?;
    write_sessions(&store, &streams, "r")?;
    store.close()?;
    drop(store);
    let store = Store::open(&dir, options())?;
    store.maintain()?;
    store.close()?;
    drop(store);
    let bytes = dir_bytes(&dir);
    let raw: u64 = {
        let store = Store::open(
            &dir,
            Options {
                read_only: true,
                ..options()
            },
        )?;
        store.stats(None)?.raw_bytes
    };
    println!(
        "## reopen ({} sessions x {} events; {:.2} GB of frames, {:.2} GB on disk)",
        config.reopen_sessions,
        config.reopen_events,
        raw as f64 / 1e9,
        bytes as f64 / 1e9
    );
    let mut clean = Vec::new();
    for _ in 0..5 {
        let (elapsed, store) = timed_open(&dir, options())?;
        assert_eq!(store.recovery_report().segments_scanned, 0);
        clean.push(elapsed);
        store.close()?;
    }
    clean.sort();
    println!(
        "clean reopen, writable (checkpoint, nothing scanned; includes creating the next 64 MiB segment): median {:.1} ms",
        clean[2].as_secs_f64() * 1e3
    );
    let (read_only, store) = median_read_only_open(&dir)?;
    drop(store);
    println!(
        "clean reopen, read-only (checkpoint): median {:.1} ms",
        read_only.as_secs_f64() * 1e3
    );
    // A tail: 1% more sessions appended after the seal-time checkpoint.
    let store = Store::open(&dir, options())?;
    let tail: Vec<Vec<GenEvent>> = (0..config.reopen_sessions / 100)
        .map(|index| {
            SessionStream::new(SEED ^ 9, index as u64, Shape::Dsh).take(config.reopen_events)
        })
        .collect();
    write_sessions(&store, &tail, "t")?;
    // A crash: the appended tail is written (flushed) but the active segment is neither
    // sealed nor checkpointed. `forget` keeps `Drop` from sealing it; the leaked handle
    // holds the writer lock, so the timed open is read-only.
    std::mem::forget(store);
    let wal = dir_bytes(&dir.join("wal"));
    let (crash_open, store) = median_read_only_open(&dir)?;
    println!(
        "reopen after a crash (read-only): median {:.1} ms of 5, target {:.0} ms (checkpoint used: {}, {} segments scanned, {:.1} MB WAL)",
        crash_open.as_secs_f64() * 1e3,
        100.0 + wal as f64 / 1e6,
        store.recovery_report().checkpoint_used,
        store.recovery_report().segments_scanned,
        wal as f64 / 1e6
    );
    drop(store);
    let (elapsed, store) = timed_open(
        &dir,
        Options {
            read_only: true,
            use_checkpoint: false,
            ..options()
        },
    )?;
    println!(
        "open with the checkpoint ignored (every run decoded): {:.1} ms ({} runs)",
        elapsed.as_secs_f64() * 1e3,
        store.recovery_report().runs_replayed
    );
    Ok(())
}

fn main() -> Result<()> {
    let config = parse_args()?;
    if let Some(dir) = &config.open_only {
        for _ in 0..20 {
            let read_only = Options {
                read_only: true,
                ..options()
            };
            let (elapsed, store) = timed_open(dir, read_only)?;
            println!("read-only open: {:.1} ms", elapsed.as_secs_f64() * 1e3);
            drop(store);
        }
        return Ok(());
    }
    disk_and_reads(&config)?;
    reopen(&config)?;
    if !config.keep {
        let _ = std::fs::remove_dir_all(&config.out);
    }
    Ok(())
}
