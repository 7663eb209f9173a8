//! `dshdb-benches compare [--quick] [--only cold-resume|dsh-layout|crash-reopen|sync-latency] [--out DIR]`: dshdb against DSH JSONL, DSH SQLite and the
//! raw `pwrite`+`fdatasync` floor, on the same machine and the same event stream.
//! See BENCHMARKS.md at the repository root for the method.

use anyhow::{bail, Context, Result};
use dshdb::storage::commit::Durability;
use dshdb::store::{NewEvent, Options, SessionWriter, Store};
use dshdb_benches::baselines::{JsonlEncoding, JsonlSession, Prealloc, RawFile, Redb, Sqlite};
use dshdb_benches::chart;
use dshdb_benches::workload::{GenEvent, SessionStream, Shape};
use parking_lot_free::Mutex;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod exchange_run;
mod layout_run;
mod resume_run;

/// `std::sync::Mutex` without poisoning noise.
mod parking_lot_free {
    pub struct Mutex<T>(std::sync::Mutex<T>);
    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(std::sync::Mutex::new(value))
        }
        pub fn into_inner(self) -> T {
            self.0
                .into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        }
    }
}

const SEED: u64 = 0xD5D8_2026;
const FLEET_EVENT_BYTES: usize = 256;
const FLEET_THREADS: usize = 64;
/// Index in the fleet table of each dshdb mode, with its short name.
const DSHDB_FLEET_MODES: [(usize, &str); 3] = [(0, "Sync"), (1, "Batched"), (2, "pipelined")];
/// Index of the JSONL and SQLite baselines in the fleet table.
const JSONL_FLEET: usize = 3;
const JSONL_ZSTD_FLEET: usize = 4;
const SQLITE_FLEET: usize = 5;
const REDB_FLEET: usize = 6;
/// Appends a pipelined fleet session keeps in flight (submitted, not yet acknowledged durable).
const PIPELINE_WINDOW: usize = 8;

#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    /// Only this fleet configuration (the `fleet` command).
    single: Option<(System, usize)>,
    /// Only the DSH import/export throughput (the `exchange` command).
    exchange_only: bool,
    /// Only the cold-resume section (`compare --only cold-resume`).
    cold_resume_only: bool,
    /// Only the DSH-files section on both layouts (`compare --only dsh-layout`).
    layout_only: bool,
    /// Only the reopen-after-crash section (`compare --only crash-reopen`).
    crash_reopen_only: bool,
    /// Only the single-session 256 B durable latency of dshdb and the raw floor
    /// (`compare --only sync-latency`).
    sync_latency_only: bool,
    reps: usize,
    /// Appends measured per interactive run (after a warm-up).
    interactive_appends: usize,
    warmup: usize,
    /// Duration of one fleet run.
    fleet_time: Duration,
    /// Bytes-on-disk stream: sessions × events per session.
    disk_sessions: usize,
    disk_events: usize,
    out: PathBuf,
}

fn parse_args() -> Result<Config> {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_default();
    let mut single = None;
    let mut exchange_only = false;
    match command.as_str() {
        "compare" => {}
        "exchange" => exchange_only = true,
        // Diagnosis: one fleet configuration, e.g. `fleet sync 64` (for strace/perf).
        "fleet" => {
            let system = match args.next().as_deref() {
                Some("sync") => System::Dshdb,
                Some("batched") => System::DshdbBatched,
                Some("pipelined") => System::DshdbPipelined,
                Some("jsonl") => System::Jsonl,
                Some("jsonl-zstd") => System::JsonlZstd,
                Some("sqlite") => System::Sqlite,
                Some("redb") => System::Redb,
                other => bail!("fleet needs sync|batched|pipelined|jsonl|jsonl-zstd|sqlite|redb, not {other:?}"),
            };
            let sessions = args
                .next()
                .context("fleet needs a session count")?
                .parse()?;
            single = Some((system, sessions));
        }
        _ => bail!(
            "usage: dshdb-benches compare [--quick] [--only cold-resume|dsh-layout|crash-reopen|sync-latency] [--out DIR]\n       \
             dshdb-benches fleet sync|batched|pipelined|jsonl|jsonl-zstd|sqlite|redb SESSIONS [--quick] [--out DIR]\n       \
             dshdb-benches exchange [--quick] [--out DIR]\n       \
             dshdb-benches dsh-layout-file DIR [EVENTS]   (a DSH packed-layout session.jsonl and .jsonl.zstd)"
        ),
    }
    let mut quick = false;
    let mut cold_resume_only = false;
    let mut layout_only = false;
    let mut crash_reopen_only = false;
    let mut sync_latency_only = false;
    let mut out = PathBuf::from("bench-out");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--only" => match args.next().as_deref() {
                Some("cold-resume") => cold_resume_only = true,
                Some("dsh-layout") => layout_only = true,
                Some("crash-reopen") => crash_reopen_only = true,
                Some("sync-latency") => sync_latency_only = true,
                other => bail!(
                    "--only takes cold-resume, dsh-layout, crash-reopen or sync-latency, \
                     not {other:?}"
                ),
            },
            "--out" => out = PathBuf::from(args.next().context("--out needs a directory")?),
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(if quick {
        Config {
            quick,
            single,
            exchange_only,
            cold_resume_only,
            layout_only,
            crash_reopen_only,
            sync_latency_only,
            reps: 1,
            interactive_appends: 300,
            warmup: 20,
            fleet_time: Duration::from_millis(1000),
            disk_sessions: 16,
            disk_events: 300,
            out,
        }
    } else {
        Config {
            quick,
            single,
            exchange_only,
            cold_resume_only,
            layout_only,
            crash_reopen_only,
            sync_latency_only,
            reps: 5,
            interactive_appends: 600,
            warmup: 50,
            fleet_time: Duration::from_millis(2000),
            disk_sessions: 64,
            disk_events: 500,
            out,
        }
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        return resume_run::child(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("dsh-layout-file") {
        return layout_run::write_packed_files(&args[1..]);
    }
    let config = parse_args()?;
    std::fs::create_dir_all(&config.out)?;
    let work = config
        .out
        .canonicalize()?
        .join(format!("work-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let started = Instant::now();
    if let Some((system, sessions)) = config.single {
        let result = fleet(&config, &work, system, sessions);
        let _ = std::fs::remove_dir_all(&work);
        println!(
            "{}, {sessions} sessions: {:.0} events/s",
            system.name(),
            result?
        );
        return Ok(());
    }
    let result = if config.exchange_only {
        exchange_run::run(&work, exchange_events(&config))
    } else if config.cold_resume_only {
        cold_resume_only(&work, exchange_events(&config))
    } else if config.layout_only {
        layout_run::run(&work, exchange_events(&config))
            .map(|section| format!("## dshdb compare --only dsh-layout\n\n{section}"))
    } else if config.crash_reopen_only {
        let (sessions, events) = crash_size(&config);
        resume_run::crash_reopen(&work, sessions, events)
            .map(|section| format!("## dshdb compare --only crash-reopen\n\n{section}"))
    } else if config.sync_latency_only {
        sync_latency_only(&config, &work)
    } else {
        run(&config, &work)
    };
    let _ = std::fs::remove_dir_all(&work);
    let report = result?;
    let report = format!(
        "{report}\nTotal run time: {:.0} s.\n",
        started.elapsed().as_secs_f64()
    );
    let name = match (
        config.exchange_only,
        config.cold_resume_only
            || config.layout_only
            || config.crash_reopen_only
            || config.sync_latency_only,
        config.quick,
    ) {
        (false, true, _) if config.crash_reopen_only => "crash-reopen.md",
        (false, true, _) if config.sync_latency_only => "sync-latency.md",
        (false, true, true) if config.layout_only => "dsh-layout-quick.md",
        (false, true, false) if config.layout_only => "dsh-layout.md",
        (true, _, true) => "exchange-quick.md",
        (true, _, false) => "exchange.md",
        (false, true, true) => "cold-resume-quick.md",
        (false, true, false) => "cold-resume.md",
        (false, false, true) => "compare-quick.md",
        (false, false, false) => "compare.md",
    };
    let path = config.out.join(name);
    std::fs::write(&path, &report)?;
    println!("{report}");
    eprintln!("written to {}", path.display());
    Ok(())
}

/// `compare --only cold-resume`: the cold-resume section alone, with the machine's load.
fn cold_resume_only(work: &Path, events: usize) -> Result<String> {
    let load_before = load_average();
    let section = resume_run::cold_resume(work, events)?;
    Ok(format!(
        "## dshdb compare --only cold-resume\n\nLoad average before the run {load_before}, \
         after {}.\n\n{section}",
        load_average()
    ))
}

/// The single-session durable 256 B latency of dshdb (`Sync`) and the raw `pwrite` +
/// `fdatasync` floor, taking turns append by append, over the configured repetitions.
fn sync_latency_only(config: &Config, work: &Path) -> Result<String> {
    let systems = [System::Raw, System::Dshdb];
    let mut runs: Vec<Vec<Latency>> = vec![Vec::new(); systems.len()];
    for rep in 0..config.reps {
        eprintln!("rep {rep}: interactive 256 B");
        for (k, run) in interactive(config, work, &systems, 256)?
            .into_iter()
            .enumerate()
        {
            eprintln!("  {}: p50 {:.0} µs", systems[k].name(), run.p50);
            runs[k].push(run);
        }
    }
    let mut out = format!(
        "## dshdb compare --only sync-latency\n\nLoad average {}.\n\n| system | p50 (µs) | \
         p99 (µs) |\n|---|---:|---:|\n",
        load_average()
    );
    for (system, runs) in systems.iter().zip(&runs) {
        let latency = median_latency(runs);
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} |\n",
            system.name(),
            latency.p50,
            latency.p99
        ));
    }
    Ok(out)
}

/// Sessions and events per session of the reopen-after-crash run.
fn crash_size(config: &Config) -> (usize, usize) {
    if config.quick {
        (100, 100)
    } else {
        (1_000, 400)
    }
}

fn exchange_events(config: &Config) -> usize {
    if config.quick {
        exchange_run::QUICK_SESSION_EVENTS
    } else {
        exchange_run::SESSION_EVENTS
    }
}

// ---------------------------------------------------------------- statistics

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank]
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

/// p50 and p99 of one run, in microseconds.
#[derive(Debug, Clone, Copy)]
struct Latency {
    p50: f64,
    p99: f64,
}

fn latency_of(mut micros: Vec<f64>) -> Latency {
    micros.sort_by(f64::total_cmp);
    Latency {
        p50: percentile(&micros, 0.5),
        p99: percentile(&micros, 0.99),
    }
}

/// Median p50 and median p99 over the repetitions.
fn median_latency(runs: &[Latency]) -> Latency {
    Latency {
        p50: median(&runs.iter().map(|run| run.p50).collect::<Vec<_>>()),
        p99: median(&runs.iter().map(|run| run.p99).collect::<Vec<_>>()),
    }
}

fn micros(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e6
}

// ---------------------------------------------------------------- single session

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Raw,
    RawFallocate,
    Dshdb,
    DshdbBatched,
    /// `Sync` through `submit_batch`: up to `PIPELINE_WINDOW` appends in flight per session.
    DshdbPipelined,
    Jsonl,
    JsonlZstd,
    Sqlite,
    Redb,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Raw => "raw floor (pwrite+fdatasync, zero-filled file)",
            System::RawFallocate => "raw, fallocate'd file (unwritten extents)",
            System::Dshdb => "dshdb Sync",
            System::DshdbBatched => "dshdb Batched (5 ms / 1 MiB)",
            System::DshdbPipelined => "dshdb Sync, pipelined (submit_batch, ≤ 8 in flight/session)",
            System::Jsonl => "DSH JSONL (fdatasync per append)",
            System::JsonlZstd => "DSH JSONL-zstd (a frame + fdatasync per append)",
            System::Sqlite => "DSH SQLite (WAL, synchronous=FULL)",
            System::Redb => "redb 2 ((session, seq) → event, fsync per commit)",
        }
    }
}

fn fresh_dir(work: &Path, name: &str) -> Result<PathBuf> {
    let dir = work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// One open single-session target of the interactive measurement.
enum Target {
    Raw(RawFile),
    Dshdb(Store, SessionWriter),
    Jsonl(JsonlSession),
    Sqlite(Sqlite),
    /// The store and the next seq.
    Redb(Redb, u64),
}

impl Target {
    fn open(system: System, dir: &Path) -> Result<Target> {
        Ok(match system {
            System::Raw => Target::Raw(RawFile::create(
                &dir.join("raw"),
                64 << 20,
                Prealloc::Zeroed,
            )?),
            System::RawFallocate => Target::Raw(RawFile::create(
                &dir.join("raw-fallocate"),
                64 << 20,
                Prealloc::Fallocate,
            )?),
            System::Dshdb | System::DshdbBatched | System::DshdbPipelined => {
                let store = Store::open(dir.join("store"), Options::default())?;
                let writer = store.create_session_with_id("interactive")?;
                Target::Dshdb(store, writer)
            }
            System::Jsonl => Target::Jsonl(JsonlSession::create(dir, "interactive", true)?),
            System::JsonlZstd => Target::Jsonl(JsonlSession::create_encoded(
                dir,
                "interactive",
                true,
                JsonlEncoding::Zstd,
            )?),
            System::Sqlite => {
                let mut db = Sqlite::create(&dir.join("dsh.sqlite"))?;
                db.create_sessions(&["interactive".to_string()])?;
                Target::Sqlite(db)
            }
            System::Redb => Target::Redb(Redb::create(&dir.join("events.redb"))?, 0),
        })
    }

    /// One durable append; returns its latency in µs.
    fn append(&mut self, event: &GenEvent) -> Result<f64> {
        let start = Instant::now();
        match self {
            Target::Raw(file) => file.append_sync(event.data.as_bytes())?,
            Target::Dshdb(_, writer) => {
                writer.append(NewEvent::new(event.event_type, &event.data))?;
            }
            Target::Jsonl(session) => session.append_batch(std::slice::from_ref(event), true)?,
            Target::Sqlite(db) => db.append_batch("interactive", std::slice::from_ref(event))?,
            Target::Redb(db, seq) => {
                db.append_batch("interactive", *seq, std::slice::from_ref(event))?;
                *seq += 1;
            }
        }
        Ok(micros(start.elapsed()))
    }

    fn close(self) -> Result<()> {
        match self {
            Target::Dshdb(store, writer) => {
                drop(writer);
                store.close()?;
            }
            Target::Sqlite(db) => db.close()?,
            Target::Redb(db, _) => db.close()?,
            Target::Raw(_) | Target::Jsonl(_) => {}
        }
        Ok(())
    }
}

/// Durable single-event appends to one session per system. The systems take turns append by
/// append, so that a change in the device's fsync latency during the run hits all of them
/// alike. Returns, per system, the latency distribution after the warm-up.
fn interactive(
    config: &Config,
    work: &Path,
    systems: &[System],
    size: usize,
) -> Result<Vec<Latency>> {
    let total = config.warmup + config.interactive_appends;
    let events = SessionStream::new(SEED, 0, Shape::Fixed(size)).take(total);
    let dir = fresh_dir(work, "interactive")?;
    let mut targets = Vec::new();
    for (k, &system) in systems.iter().enumerate() {
        let sub = dir.join(format!("{k}"));
        std::fs::create_dir_all(&sub)?;
        targets.push(Target::open(system, &sub)?);
    }
    let mut samples = vec![Vec::with_capacity(total); systems.len()];
    for event in &events {
        for (target, samples) in targets.iter_mut().zip(samples.iter_mut()) {
            samples.push(target.append(event)?);
        }
    }
    for target in targets {
        target.close()?;
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(samples
        .into_iter()
        .map(|mut samples| latency_of(samples.split_off(config.warmup)))
        .collect())
}

// ---------------------------------------------------------------- fleet ingest

/// Per thread, a pool of pre-generated 256 B events cycled through (no generation in the loop).
fn event_pool(thread: usize) -> Vec<GenEvent> {
    SessionStream::new(
        SEED,
        10_000 + thread as u64,
        Shape::Fixed(FLEET_EVENT_BYTES),
    )
    .take(64)
}

/// Runs `body(thread, stop)` on `FLEET_THREADS` threads for the fleet time; returns the sum of
/// what they return (events appended) and the wall time from start to the last join.
fn run_threads<S: Send>(
    config: &Config,
    states: Vec<S>,
    body: impl Fn(usize, S, &AtomicBool) -> Result<u64> + Sync,
) -> Result<(u64, Duration)> {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(states.len() + 1);
    let total = AtomicU64::new(0);
    let mut failure = None;
    let mut elapsed = Duration::ZERO;
    std::thread::scope(|scope| {
        let handles: Vec<_> = states
            .into_iter()
            .enumerate()
            .map(|(thread, state)| {
                let (stop, barrier, total, body) = (&stop, &barrier, &total, &body);
                scope.spawn(move || -> Result<()> {
                    barrier.wait();
                    let count = body(thread, state, stop)?;
                    total.fetch_add(count, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(config.fleet_time);
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            match handle.join() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => failure = Some(error),
                Err(_) => failure = Some(anyhow::anyhow!("a fleet thread panicked")),
            }
        }
        elapsed = start.elapsed();
    });
    if let Some(error) = failure {
        return Err(error);
    }
    Ok((total.load(Ordering::Relaxed), elapsed))
}

/// dshdb's fleet run: `Sync` appends (one at a time, or pipelined through `submit_batch`) or
/// `Batched` ones, one writer per session, the sessions split evenly over the threads.
fn dshdb_fleet(
    config: &Config,
    dir: &Path,
    system: System,
    ids: &[String],
    threads: usize,
) -> Result<f64> {
    let per_thread = ids.len() / threads;
    let durability = if system == System::DshdbBatched {
        Options::batched()
    } else {
        Durability::Sync
    };
    // Sessions are created unsynced then flushed once: setup is not measured.
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    let store = Store::open(dir.join("store"), options)?;
    let mut groups: Vec<Vec<SessionWriter>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, id) in ids.iter().enumerate() {
        let mut writer = store.create_session_with_id(id)?;
        writer.set_durability(durability);
        groups[i / per_thread].push(writer);
    }
    store.flush()?;
    let start = Instant::now();
    let pipelined = system == System::DshdbPipelined;
    let (count, _) = run_threads(config, groups, |thread, mut writers, stop| {
        let pool = event_pool(thread);
        if pipelined {
            return pipelined_appends(&pool, &mut writers, stop);
        }
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for writer in writers.iter_mut() {
                let event = &pool[n as usize % pool.len()];
                writer.append(NewEvent::new(event.event_type, &event.data))?;
                n += 1;
            }
        }
        Ok(n)
    })?;
    // Batched appends are durable only once flushed: the flush is part of the time.
    store.flush()?;
    let elapsed = start.elapsed();
    store.close()?;
    Ok(count as f64 / elapsed.as_secs_f64())
}

/// One thread's pipelined appends: each session keeps up to `PIPELINE_WINDOW` single-event
/// batches in flight; only acknowledged (waited-for, durable) events are counted.
fn pipelined_appends(
    pool: &[GenEvent],
    writers: &mut [SessionWriter],
    stop: &AtomicBool,
) -> Result<u64> {
    let mut in_flight = std::collections::VecDeque::new();
    let mut submitted = 0u64;
    let mut durable = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for writer in writers.iter_mut() {
            let event = &pool[submitted as usize % pool.len()];
            in_flight
                .push_back(writer.submit_batch(&[NewEvent::new(event.event_type, &event.data)])?);
            submitted += 1;
        }
        while in_flight.len() >= PIPELINE_WINDOW * writers.len() {
            if let Some(pending) = in_flight.pop_front() {
                pending.wait()?;
                durable += 1;
            }
        }
    }
    for pending in in_flight {
        pending.wait()?;
        durable += 1;
    }
    Ok(durable)
}

/// Durable events/s with `sessions` live sessions spread over `FLEET_THREADS` threads, each
/// thread appending one 256 B event at a time to its sessions in turn.
fn fleet(config: &Config, work: &Path, system: System, sessions: usize) -> Result<f64> {
    let threads = FLEET_THREADS.min(sessions);
    let per_thread = sessions / threads;
    let dir = fresh_dir(work, "fleet")?;
    let ids: Vec<String> = (0..sessions).map(|i| format!("session-{i:05}")).collect();
    let rate = match system {
        System::Dshdb | System::DshdbBatched | System::DshdbPipelined => {
            dshdb_fleet(config, &dir, system, &ids, threads)?
        }
        System::Jsonl | System::JsonlZstd => {
            let encoding = if system == System::Jsonl {
                JsonlEncoding::Raw
            } else {
                JsonlEncoding::Zstd
            };
            let mut groups: Vec<Vec<JsonlSession>> = (0..threads).map(|_| Vec::new()).collect();
            for (i, id) in ids.iter().enumerate() {
                groups[i / per_thread]
                    .push(JsonlSession::create_encoded(&dir, id, false, encoding)?);
            }
            // SAFETY: sync(2) has no preconditions.
            unsafe { libc::sync() };
            let (count, elapsed) = run_threads(config, groups, |thread, mut files, stop| {
                let pool = event_pool(thread);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for file in files.iter_mut() {
                        let event = &pool[n as usize % pool.len()];
                        file.append_batch(std::slice::from_ref(event), true)?;
                        n += 1;
                    }
                }
                Ok(n)
            })?;
            count as f64 / elapsed.as_secs_f64()
        }
        System::Sqlite => {
            let mut db = Sqlite::create(&dir.join("dsh.sqlite"))?;
            db.create_sessions(&ids)?;
            let db = Arc::new(Mutex::new(db));
            let groups: Vec<Vec<String>> = ids.chunks(per_thread).map(<[String]>::to_vec).collect();
            let (count, elapsed) = run_threads(config, groups, |thread, mine, stop| {
                let pool = event_pool(thread);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for id in &mine {
                        let event = &pool[n as usize % pool.len()];
                        db.lock().append_batch(id, std::slice::from_ref(event))?;
                        n += 1;
                    }
                }
                Ok(n)
            })?;
            match Arc::try_unwrap(db) {
                Ok(db) => db.into_inner().close()?,
                Err(_) => bail!("sqlite handle still shared"),
            }
            count as f64 / elapsed.as_secs_f64()
        }
        System::Redb => {
            let db = Redb::create(&dir.join("events.redb"))?;
            let groups: Vec<Vec<String>> = ids.chunks(per_thread).map(<[String]>::to_vec).collect();
            let (count, elapsed) = run_threads(config, groups, |thread, mine, stop| {
                let pool = event_pool(thread);
                let mut next_seq = vec![0u64; mine.len()];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for (id, seq) in mine.iter().zip(next_seq.iter_mut()) {
                        let event = &pool[n as usize % pool.len()];
                        db.append_batch(id, *seq, std::slice::from_ref(event))?;
                        *seq += 1;
                        n += 1;
                    }
                }
                Ok(n)
            })?;
            db.close()?;
            count as f64 / elapsed.as_secs_f64()
        }
        System::Raw | System::RawFallocate => bail!("no fleet run for the raw floor"),
    };
    std::fs::remove_dir_all(&dir)?;
    Ok(rate)
}

// ---------------------------------------------------------------- bytes on disk

#[derive(Debug, Clone, Copy, Default)]
struct DiskUse {
    /// Sum of file sizes (`ls -l`).
    apparent: u64,
    /// Sum of allocated blocks (`du`), st_blocks × 512.
    allocated: u64,
}

fn disk_use(path: &Path) -> Result<DiskUse> {
    use std::os::unix::fs::MetadataExt;
    let mut total = DiskUse::default();
    let metadata = std::fs::symlink_metadata(path)?;
    if metadata.is_dir() {
        for entry in std::fs::read_dir(path)? {
            let inner = disk_use(&entry?.path())?;
            total.apparent += inner.apparent;
            total.allocated += inner.allocated;
        }
    } else {
        total.apparent = metadata.len();
        total.allocated = metadata.blocks() * 512;
    }
    Ok(total)
}

struct DiskReport {
    events: u64,
    jsonl_line_bytes: u64,
    dshdb_open: DiskUse,
    dshdb_closed: DiskUse,
    jsonl: DiskUse,
    jsonl_zstd: DiskUse,
    sqlite: DiskUse,
    redb: DiskUse,
}

/// Events per append batch in the bytes-on-disk run: about what DSH's 200 ms write-behind
/// window gathers from a streaming reply (persistence §4.2).
const DISK_BATCH_EVENTS: usize = 16;

/// The same DSH-mix stream (sessions appended round-robin, `DISK_BATCH_EVENTS` events per
/// append batch) into each store, then the bytes each leaves on disk.
fn bytes_on_disk(config: &Config, work: &Path) -> Result<DiskReport> {
    let dir = fresh_dir(work, "disk")?;
    let streams: Vec<Vec<GenEvent>> = (0..config.disk_sessions)
        .map(|i| SessionStream::new(SEED, i as u64, Shape::Dsh).take(config.disk_events))
        .collect();
    let ids: Vec<String> = (0..config.disk_sessions)
        .map(|i| format!("session-{i:05}"))
        .collect();
    let events = (config.disk_sessions * config.disk_events) as u64;
    let now = dshdb::store::now_millis();
    let jsonl_line_bytes = streams
        .iter()
        .flat_map(|stream| stream.iter().enumerate())
        .map(|(seq, event)| event.jsonl_line(seq as u64, now).len() as u64)
        .sum();
    // Every store gets the same batches in the same order: (session index, first seq, events).
    let batches: Vec<(usize, usize, &[GenEvent])> = (0..config.disk_events)
        .step_by(DISK_BATCH_EVENTS)
        .flat_map(|start| {
            streams.iter().enumerate().map(move |(session, stream)| {
                let end = (start + DISK_BATCH_EVENTS).min(stream.len());
                (session, start, &stream[start..end])
            })
        })
        .collect();

    let (dshdb_open, dshdb_closed) = dshdb_disk(&dir.join("dshdb"), &ids, &batches)?;
    let mut jsonl_use = Vec::new();
    for encoding in [JsonlEncoding::Raw, JsonlEncoding::Zstd] {
        let jsonl_dir = dir.join(format!("jsonl-{encoding:?}"));
        let mut files = ids
            .iter()
            .map(|id| JsonlSession::create_encoded(&jsonl_dir, id, false, encoding))
            .collect::<Result<Vec<_>>>()?;
        for (session, _, batch) in &batches {
            files[*session].append_batch(batch, false)?;
        }
        drop(files);
        // SAFETY: sync(2) has no preconditions; it makes delayed allocation visible in st_blocks.
        unsafe { libc::sync() };
        jsonl_use.push(disk_use(&jsonl_dir)?);
    }

    let sqlite_dir = dir.join("sqlite");
    std::fs::create_dir_all(&sqlite_dir)?;
    let mut db = Sqlite::create(&sqlite_dir.join("dsh.sqlite"))?;
    db.unsynced()?;
    db.create_sessions(&ids)?;
    for (session, _, batch) in &batches {
        db.append_batch(&ids[*session], batch)?;
    }
    db.close()?;

    let redb_dir = dir.join("redb");
    std::fs::create_dir_all(&redb_dir)?;
    let redb = Redb::create(&redb_dir.join("events.redb"))?;
    for (session, start, batch) in &batches {
        redb.append_batch_unsynced(&ids[*session], *start as u64, batch)?;
    }
    redb.close()?;
    // SAFETY: as above.
    unsafe { libc::sync() };
    let sqlite = disk_use(&sqlite_dir)?;
    let redb = disk_use(&redb_dir)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(DiskReport {
        events,
        jsonl_line_bytes,
        dshdb_open,
        dshdb_closed,
        jsonl: jsonl_use[0],
        jsonl_zstd: jsonl_use[1],
        sqlite,
        redb,
    })
}

/// dshdb's bytes for the disk run: open (active segment preallocated) and after close.
fn dshdb_disk(
    store_dir: &Path,
    ids: &[String],
    batches: &[(usize, usize, &[GenEvent])],
) -> Result<(DiskUse, DiskUse)> {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    let store = Store::open(store_dir, options)?;
    let mut writers = ids
        .iter()
        .map(|id| store.create_session_with_id(id))
        .collect::<dshdb::Result<Vec<_>>>()?;
    for (session, _, batch) in batches {
        let events: Vec<NewEvent<'_>> = batch.iter().map(GenEvent::as_new_event).collect();
        writers[*session].append_batch(&events)?;
    }
    store.flush()?;
    let open = disk_use(store_dir)?;
    drop(writers);
    store.close()?;
    drop(store);
    Ok((open, disk_use(store_dir)?))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_string())
}

fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**not met**"
    }
}

fn run(config: &Config, work: &Path) -> Result<String> {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load_before = load_average();
    let sizes = [256usize, 1024];
    let single = [
        System::Raw,
        System::RawFallocate,
        System::Dshdb,
        System::Jsonl,
        System::JsonlZstd,
        System::Sqlite,
        System::Redb,
    ];
    // Latencies[size][system] over reps; repetitions are interleaved so drift hits all alike.
    let mut latencies: Vec<Vec<Vec<Latency>>> = vec![vec![Vec::new(); single.len()]; sizes.len()];
    let fleet_sizes = [64usize, 1024];
    let fleet_systems = [
        System::Dshdb,
        System::DshdbBatched,
        System::DshdbPipelined,
        System::Jsonl,
        System::JsonlZstd,
        System::Sqlite,
        System::Redb,
    ];
    let mut rates: Vec<Vec<Vec<f64>>> =
        vec![vec![Vec::new(); fleet_systems.len()]; fleet_sizes.len()];
    for rep in 0..config.reps {
        for (s, &size) in sizes.iter().enumerate() {
            eprintln!("rep {rep}: interactive {size} B");
            let runs = interactive(config, work, &single, size)?;
            for (k, run) in runs.into_iter().enumerate() {
                eprintln!(
                    "  {}: p50 {:.0} µs, p99 {:.0} µs",
                    single[k].name(),
                    run.p50,
                    run.p99
                );
                latencies[s][k].push(run);
            }
        }
        for (f, &sessions) in fleet_sizes.iter().enumerate() {
            for (k, &system) in fleet_systems.iter().enumerate() {
                eprintln!("rep {rep}: fleet {sessions} sessions {}", system.name());
                let rate = fleet(config, work, system, sessions)?;
                eprintln!("  {rate:.0} events/s");
                rates[f][k].push(rate);
            }
        }
    }
    eprintln!("bytes on disk");
    let disk = bytes_on_disk(config, work)?;
    let resume_section = resume_run::cold_resume(work, exchange_events(config))?;
    let (crash_sessions, crash_events) = crash_size(config);
    let crash_section = resume_run::crash_reopen(work, crash_sessions, crash_events)?;
    let exchange_section = exchange_run::run(work, exchange_events(config))?;
    let layout_section = layout_run::run(work, exchange_events(config))?;
    let load_after = load_average();

    let lat: Vec<Vec<Latency>> = latencies
        .iter()
        .map(|per| per.iter().map(|runs| median_latency(runs)).collect())
        .collect();
    let rate: Vec<Vec<f64>> = rates
        .iter()
        .map(|per| per.iter().map(|runs| median(runs)).collect())
        .collect();

    let mut out = String::new();
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .unwrap_or_default();
    writeln!(
        out,
        "## dshdb compare ({})\n",
        if config.quick { "--quick" } else { "default" }
    )?;
    writeln!(
        out,
        "{date}; {cores} cores; load average before the run {load_before}, after {load_after} \
         (the fleet runs' 64 threads blocked in fsync count towards it); \
         {} repetition(s), medians shown; {} measured appends per latency run \
         (after {} warm-up); fleet runs of {:.1} s with {FLEET_THREADS} threads.\n",
        config.reps,
        config.interactive_appends,
        config.warmup,
        config.fleet_time.as_secs_f64()
    )?;
    let floor = lat[0][0].p50;
    writeln!(
        out,
        "**fsync floor** (pwrite 256 B + fdatasync, zero-filled preallocated file): \
         p50 {floor:.0} µs, p99 {:.0} µs.\n",
        lat[0][0].p99
    )?;

    writeln!(
        out,
        "### One interactive session, durable append latency (µs)\n"
    )?;
    writeln!(
        out,
        "| system | 256 B p50 | 256 B p99 | 1 KiB p50 | 1 KiB p99 | p50 vs dshdb (256 B / 1 KiB) |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
    let dshdb_index = 2;
    for (k, system) in single.iter().enumerate() {
        writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2}× / {:.2}× |",
            system.name(),
            lat[0][k].p50,
            lat[0][k].p99,
            lat[1][k].p50,
            lat[1][k].p99,
            lat[0][k].p50 / lat[0][dshdb_index].p50,
            lat[1][k].p50 / lat[1][dshdb_index].p50,
        )?;
    }
    let floor_ratio_256 = lat[0][dshdb_index].p50 / lat[0][0].p50;
    let floor_ratio_1k = lat[1][dshdb_index].p50 / lat[1][0].p50;
    writeln!(
        out,
        "\ndshdb Sync p50 / raw floor p50: {floor_ratio_256:.2}× (256 B), {floor_ratio_1k:.2}× (1 KiB); \
         against the fallocate'd raw file: {:.2}× / {:.2}×.\n",
        lat[0][dshdb_index].p50 / lat[0][1].p50,
        lat[1][dshdb_index].p50 / lat[1][1].p50,
    )?;

    writeln!(
        out,
        "### Fleet ingest, durable 256 B events/s ({FLEET_THREADS} threads)\n"
    )?;
    writeln!(out, "| system | 64 sessions | 1024 sessions |")?;
    writeln!(out, "|---|---:|---:|")?;
    for (k, system) in fleet_systems.iter().enumerate() {
        writeln!(
            out,
            "| {} | {:.0} | {:.0} |",
            system.name(),
            rate[0][k],
            rate[1][k]
        )?;
    }
    writeln!(out)?;
    writeln!(out, "| ratio | 64 sessions | 1024 sessions |")?;
    writeln!(out, "|---|---:|---:|")?;
    for (dk, dname) in DSHDB_FLEET_MODES {
        for (bk, bname) in [
            (JSONL_FLEET, "JSONL"),
            (JSONL_ZSTD_FLEET, "JSONL-zstd"),
            (SQLITE_FLEET, "SQLite"),
            (REDB_FLEET, "redb"),
        ] {
            writeln!(
                out,
                "| {dname} / {bname} | {:.2}× | {:.2}× |",
                rate[0][dk] / rate[0][bk],
                rate[1][dk] / rate[1][bk]
            )?;
        }
    }
    writeln!(out)?;

    writeln!(
        out,
        "### Bytes on disk, same DSH-mix stream ({} sessions × {} events = {} events, \
         mean JSONL line {:.0} B)\n",
        config.disk_sessions,
        config.disk_events,
        disk.events,
        disk.jsonl_line_bytes as f64 / disk.events as f64
    )?;
    writeln!(
        out,
        "| store | file sizes, B/event | allocated (du), B/event |"
    )?;
    writeln!(out, "|---|---:|---:|")?;
    let per = |bytes: u64| bytes as f64 / disk.events as f64;
    for (name, usage) in [
        ("dshdb, open (active segment preallocated)", disk.dshdb_open),
        ("dshdb, after close (trimmed)", disk.dshdb_closed),
        ("DSH JSONL (raw, one file per session)", disk.jsonl),
        (
            "DSH JSONL-zstd (a frame per batch, one file per session)",
            disk.jsonl_zstd,
        ),
        ("DSH SQLite (after close, WAL checkpointed)", disk.sqlite),
        ("redb 2 (after close)", disk.redb),
    ] {
        writeln!(
            out,
            "| {name} | {:.1} | {:.1} |",
            per(usage.apparent),
            per(usage.allocated)
        )?;
    }
    writeln!(out)?;

    let chart_name = if config.quick {
        "compare-quick.svg"
    } else {
        "compare.svg"
    };
    let fleet_panel = |f: usize, sessions: usize| chart::Panel {
        title: format!("Fleet ingest, {sessions} sessions, durable 256 B events/s"),
        unit: "higher is better",
        bars: fleet_systems
            .iter()
            .enumerate()
            .map(|(k, system)| (system.name().to_owned(), rate[f][k]))
            .collect(),
        log_scale: true,
    };
    let latency_panel = chart::Panel {
        title: "One interactive session, durable append p50 (256 B), µs".to_owned(),
        unit: "lower is better",
        bars: single
            .iter()
            .enumerate()
            .map(|(k, system)| (system.name().to_owned(), lat[0][k].p50))
            .collect(),
        log_scale: false,
    };
    std::fs::write(
        config.out.join(chart_name),
        chart::render(&[fleet_panel(0, 64), fleet_panel(1, 1024), latency_panel]),
    )?;
    writeln!(out, "![fleet ingest and latency]({chart_name})\n")?;
    out.push_str(&resume_section);
    out.push_str(&crash_section);
    out.push_str(&exchange_section);
    out.push_str(&layout_section);

    writeln!(out, "### Targets\n")?;
    writeln!(out, "| target | measured | verdict |")?;
    writeln!(out, "|---|---|---|")?;
    writeln!(
        out,
        "| single-session Sync p50 ≤ 1.3× raw floor (256 B) | {floor_ratio_256:.2}× ({:.0} µs vs {floor:.0} µs) | {} |",
        lat[0][dshdb_index].p50,
        verdict(floor_ratio_256 <= 1.3)
    )?;
    let modes = |value: &dyn Fn(usize) -> f64, unit: &str, met: &dyn Fn(usize) -> bool| {
        let measured: Vec<String> = DSHDB_FLEET_MODES
            .iter()
            .map(|(k, name)| format!("{name} {}{unit}", value(*k)))
            .collect();
        let verdicts: Vec<String> = DSHDB_FLEET_MODES
            .iter()
            .map(|(k, name)| format!("{name} {}", verdict(met(*k))))
            .collect();
        format!("{} | {}", measured.join(", "), verdicts.join(", "))
    };
    writeln!(
        out,
        "| ≥ 300,000 durable 256 B events/s at 64 sessions | {} |",
        modes(&|k| rate[0][k].round(), "/s", &|k| rate[0][k] >= 300_000.0)
    )?;
    for (f, sessions) in fleet_sizes.iter().enumerate() {
        for (bk, bname, factor) in [(SQLITE_FLEET, "SQLite", 10.0), (JSONL_FLEET, "JSONL", 5.0)] {
            writeln!(
                out,
                "| ≥ {factor}× {bname}, fleet {sessions} | {} |",
                modes(
                    &|k| (rate[f][k] / rate[f][bk] * 10.0).round() / 10.0,
                    "×",
                    &|k| rate[f][k] >= factor * rate[f][bk]
                )
            )?;
        }
    }
    Ok(out)
}
