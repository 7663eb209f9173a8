//! Many processes on one store (format-spec/08-many-processes.md), measured:
//!
//! `cargo run --release -p dshdb-benches --bin processes [-- [--only NAME] [DIR]]` prints
//! (NAME: refresh, catch-up, follow or aggregate)
//! - `refresh()` with nothing new (ns per call);
//! - `refresh()` catching up on a few new batches of another process, once early in the
//!   write-ahead segment and once after tens of MB were written to it: the cost follows
//!   the new bytes, not the segment (F-08-11);
//! - follow latency from a commit in one process to its delivery in another (p50, p99;
//!   delivery waits for the event to be durable, so an `fdatasync` is inside it);
//! - aggregate pipelined `Sync` appends: 8 processes × 8 sessions against 1 process × 64
//!   sessions, each process one thread that submits a batch to each of its sessions and
//!   then waits for them all.
//!
//! The worker processes are this binary again (`--worker ROLE ...`).

use anyhow::{bail, Context, Result};
use dshdb::store::{NewEvent, Options, PendingReceipt, Store};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long each aggregate run appends.
const AGGREGATE_RUN: Duration = Duration::from_secs(5);
/// Events the follow-latency writer commits.
const FOLLOW_EVENTS: u64 = 2_000;
/// `refresh()` calls timed.
const REFRESH_CALLS: u32 = 1_000_000;
/// Catch-ups timed per segment fill, each after one new batch of another process.
const CATCH_UP_ROUNDS: u32 = 200;
/// Events in each new batch a catch-up applies.
const CATCH_UP_BATCH_EVENTS: usize = 16;
/// Bytes written into the segment before the second round of catch-ups.
const CATCH_UP_FILL_BYTES: usize = 48 << 20;

fn shared_options() -> Options {
    Options {
        shared: true,
        ..Options::default()
    }
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return worker(&args[1..]);
    }
    let (only, rest): (Option<&str>, &[String]) = match args.as_slice() {
        [flag, name, rest @ ..] if flag == "--only" => (Some(name.as_str()), rest),
        rest => (None, rest),
    };
    let base = match rest.first() {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("dshdb-processes-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let outcome = run_all(&base, only);
    let _ = std::fs::remove_dir_all(&base);
    outcome
}

/// The measurements, by the name `--only` takes.
const MEASUREMENTS: [&str; 4] = ["refresh", "catch-up", "follow", "aggregate"];

fn run_all(base: &Path, only: Option<&str>) -> Result<()> {
    if let Some(name) = only.filter(|name| !MEASUREMENTS.contains(name)) {
        bail!("--only takes one of {MEASUREMENTS:?}, not {name:?}");
    }
    let runs = |name: &str| only.is_none_or(|only| only == name);
    if runs("refresh") {
        refresh_nothing_new(&base.join("refresh"))?;
    }
    if runs("catch-up") {
        refresh_new_commits(&base.join("catch-up"))?;
    }
    if runs("follow") {
        follow_latency(&base.join("follow"))?;
    }
    if runs("aggregate") {
        let alone = aggregate(&base.join("one"), 1, 64, false)?;
        let many = aggregate(&base.join("many"), 8, 8, true)?;
        println!(
            "aggregate pipelined Sync appends: 1 process x 64 sessions (exclusive open) \
             {alone:.0} events/s; 8 processes x 8 sessions (shared) {many:.0} events/s ({:.2}x)",
            many / alone
        );
    }
    Ok(())
}

fn refresh_nothing_new(dir: &Path) -> Result<()> {
    let store = Store::open(dir, shared_options())?;
    let mut writer = store.create_session_with_id("s")?;
    writer.append(NewEvent::new("turn/start", "1"))?;
    store.refresh()?;
    let started = Instant::now();
    for _ in 0..REFRESH_CALLS {
        std::hint::black_box(store.refresh()?);
    }
    let per_call = started.elapsed().as_nanos() / u128::from(REFRESH_CALLS);
    println!("refresh() with nothing new: {per_call} ns per call");
    drop(writer);
    store.close()?;
    Ok(())
}

/// Times `refresh()` in one store while another (another process as far as the store can
/// tell: its own `SHARED` lock owner) appends a batch before each call.
fn refresh_new_commits(dir: &Path) -> Result<()> {
    let options = Options {
        checkpoint_every_bytes: None,
        ..shared_options()
    };
    let writer_store = Store::open(dir, options.clone())?;
    let reader_store = Store::open(dir, options)?;
    let mut writer = writer_store.create_session_with_id("catch-up")?;
    let data = format!("\"{}\"", "x".repeat(240));
    let batch: Vec<NewEvent<'_>> = (0..CATCH_UP_BATCH_EVENTS)
        .map(|_| NewEvent::new("assistant/chunk", &data))
        .collect();
    time_catch_ups(&reader_store, &mut writer, &batch, "log nearly empty")?;
    let big = format!("\"{}\"", "y".repeat(60_000));
    let fill: Vec<NewEvent<'_>> = (0..16)
        .map(|_| NewEvent::new("tool/result", &big))
        .collect();
    for _ in 0..CATCH_UP_FILL_BYTES / (16 * 60_000) {
        writer.submit_batch(&fill)?.wait()?;
    }
    let label = format!("after {} MB more", CATCH_UP_FILL_BYTES >> 20);
    time_catch_ups(&reader_store, &mut writer, &batch, &label)?;
    drop(writer);
    reader_store.close()?;
    writer_store.close()?;
    Ok(())
}

fn time_catch_ups(
    reader_store: &Store,
    writer: &mut dshdb::store::SessionWriter,
    batch: &[NewEvent<'_>],
    label: &str,
) -> Result<()> {
    reader_store.refresh()?;
    let mut spent = Duration::ZERO;
    for _ in 0..CATCH_UP_ROUNDS {
        writer.submit_batch(batch)?.wait()?;
        let started = Instant::now();
        reader_store.refresh()?;
        spent += started.elapsed();
    }
    println!(
        "refresh() catching up on one {CATCH_UP_BATCH_EVENTS}-event batch ({label}): \
         {:.1} us per call",
        spent.as_secs_f64() * 1e6 / f64::from(CATCH_UP_ROUNDS)
    );
    Ok(())
}

fn spawn_worker(args: &[&str]) -> Result<std::process::Child> {
    Command::new(std::env::current_exe()?)
        .arg("--worker")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawn worker")
}

/// Waits for a worker and fails loudly if it did (its error is on the inherited stderr).
fn check_worker(name: &str, child: &mut std::process::Child) -> Result<()> {
    let status = child
        .wait()
        .with_context(|| format!("wait for worker {name}"))?;
    if !status.success() {
        bail!("worker {name} failed ({status}); its error is on stderr above");
    }
    Ok(())
}

fn follow_latency(dir: &Path) -> Result<()> {
    let store = Store::open(dir, shared_options())?;
    let mut subscription = store.subscribe("live", 0)?;
    let dir_text = dir.to_str().context("path")?;
    let mut child = spawn_worker(&["follow-writer", dir_text])?;
    let mut latencies = Vec::with_capacity(FOLLOW_EVENTS as usize);
    while (latencies.len() as u64) < FOLLOW_EVENTS {
        let Some(event) = subscription.next_timeout(Duration::from_secs(30))? else {
            bail!("no event within 30 s after {}", latencies.len());
        };
        let sent: u128 = event.data.parse().context("send time")?;
        latencies.push(now_nanos().saturating_sub(sent));
    }
    check_worker("follow-writer", &mut child)?;
    latencies.sort_unstable();
    let percentile = |fraction: f64| {
        let index = ((latencies.len() - 1) as f64 * fraction) as usize;
        latencies[index] as f64 / 1000.0
    };
    println!(
        "follow latency, commit in one process to delivery in another (durable): \
         p50 {:.0} us, p99 {:.0} us over {FOLLOW_EVENTS} events",
        percentile(0.5),
        percentile(0.99)
    );
    store.close()?;
    Ok(())
}

/// Runs `processes` appender processes with `sessions` sessions each; returns events/s.
fn aggregate(dir: &Path, processes: usize, sessions: usize, shared: bool) -> Result<f64> {
    Store::open(dir, shared_options())?.close()?;
    let mode = if shared { "shared" } else { "exclusive" };
    let dir_text = dir.to_str().context("path")?;
    let sessions_text = sessions.to_string();
    let seconds = AGGREGATE_RUN.as_secs().to_string();
    let children: Vec<_> = (0..processes)
        .map(|process| {
            let index = process.to_string();
            spawn_worker(&["appender", dir_text, &index, &sessions_text, &seconds, mode])
        })
        .collect::<Result<_>>()?;
    let mut total = 0u64;
    for (process, mut child) in children.into_iter().enumerate() {
        let stdout = child.stdout.take().context("stdout")?;
        for line in BufReader::new(stdout).lines() {
            if let Ok(count) = line?.trim().parse::<u64>() {
                total += count;
            }
        }
        // A worker that failed printed no count: summing without it would report a lower
        // (or zero) rate as if it were measured.
        check_worker(&format!("appender {process}"), &mut child)?;
    }
    Ok(total as f64 / AGGREGATE_RUN.as_secs_f64())
}

fn worker(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("follow-writer") => follow_writer(Path::new(&args[1])),
        Some("appender") => appender(
            Path::new(&args[1]),
            &args[2],
            args[3].parse()?,
            Duration::from_secs(args[4].parse()?),
            args[5] == "shared",
        ),
        _ => bail!("unknown worker {args:?}"),
    }
}

fn follow_writer(dir: &Path) -> Result<()> {
    let store = Store::open(dir, shared_options())?;
    let mut writer = store.create_session_with_id("live")?;
    for _ in 0..FOLLOW_EVENTS {
        let sent = now_nanos().to_string();
        writer.append(NewEvent::new("turn/start", &sent))?;
        // A pace well below the disk's sync rate, so the latency is not queueing.
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(writer);
    store.close()?;
    Ok(())
}

fn appender(dir: &Path, process: &str, sessions: usize, run: Duration, shared: bool) -> Result<()> {
    let store = Store::open(
        dir,
        Options {
            shared,
            ..Options::default()
        },
    )?;
    let mut writers = (0..sessions)
        .map(|session| store.create_session_with_id(&format!("p{process}-s{session}")))
        .collect::<dshdb::Result<Vec<_>>>()?;
    let data = format!("{{\"text\":\"{}\"}}", "x".repeat(200));
    let started = Instant::now();
    let mut appended = 0u64;
    while started.elapsed() < run {
        let pending: Vec<PendingReceipt> = writers
            .iter_mut()
            .map(|writer| writer.submit_batch(&[NewEvent::new("turn/start", &data)]))
            .collect::<dshdb::Result<_>>()?;
        for receipt in pending {
            receipt.wait()?;
            appended += 1;
        }
    }
    drop(writers);
    store.close()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{appended}")?;
    Ok(())
}
