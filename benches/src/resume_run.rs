//! Cold resume and reopen-after-crash, each measured in a fresh child process so that its
//! peak RSS (`VmHWM`) is its own.
//!
//! - **Cold resume**: open a store holding one long generated session and derive its messages,
//!   against reading that session's DSH `session.jsonl.zstd` with zstd + serde_json (every line
//!   parsed to a `Value`, as any reader of the file must; no derivation: favourable to it).
//! - **Reopen after a crash**: a child writes a fleet of sessions and exits without closing
//!   (`_exit`, as a kill leaves it); the next process times opening the store until it can
//!   list its sessions. DSH JSONL lists by reading each session's header line.

use anyhow::{bail, Context, Result};
use dshdb::store::{NewEvent, Options, Store};
use dshdb::{derive, exchange};
use dshdb_benches::baselines::{dsh_frame, JsonlEncoding, JsonlSession, Redb, Sqlite};
use dshdb_benches::workload::{session_jsonl, GenEvent, SessionStream, Shape, SESSION_JSONL_ID};
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Lines per zstd frame of the DSH file (about one 200 ms write-behind batch).
const LINES_PER_FRAME: usize = 16;
/// Child runs per system; the median is reported.
const RUNS: usize = 3;
/// Child runs per system of the cold resume (seconds each, on a machine whose load moves).
const RESUME_RUNS: usize = 5;
/// Events per append batch of the crash writer.
const CRASH_BATCH_EVENTS: usize = 16;

/// What one child reports: wall time of the measured part and its peak RSS.
pub(crate) struct ChildReport {
    pub(crate) millis: f64,
    pub(crate) peak_rss_mib: f64,
    /// CPU time the process spent running (`/proc/self/schedstat`), in ms: less moved than
    /// the wall time by other work on the machine.
    pub(crate) cpu_millis: f64,
}

/// The process's time on a CPU so far, in ms: its main thread's, the first field of
/// `/proc/self/schedstat` (ns); both sides of the cold resume run on one thread.
fn cpu_millis() -> f64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |nanos| nanos / 1e6)
}

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

/// The child side: `dshdb-benches child KIND ARGS...`; prints `millis peak_rss_mib`.
pub fn child(args: &[String]) -> Result<()> {
    let started = Instant::now();
    let layout_step = match args {
        [kind, rest @ ..] if kind.starts_with("layout-") => crate::layout_run::child(kind, rest)?,
        _ => false,
    };
    match args {
        _ if layout_step => {}
        [kind, path] if kind == "resume-dshdb" => {
            let options = Options {
                read_only: true,
                ..Options::default()
            };
            let store = Store::open(path, options)?;
            let messages = derive::messages(&store, SESSION_JSONL_ID)?;
            anyhow::ensure!(!messages.is_empty(), "no messages derived");
        }
        [kind, path] if kind == "resume-dshdb-texts" => {
            let options = Options {
                read_only: true,
                ..Options::default()
            };
            let store = Store::open(path, options)?;
            let texts = derive::message_texts(&store, SESSION_JSONL_ID)?;
            anyhow::ensure!(!texts.is_empty(), "no messages derived");
        }
        [kind, path] if kind == "resume-dshdb-full" => {
            let options = Options {
                read_only: true,
                ..Options::default()
            };
            let store = Store::open(path, options)?;
            let messages = derive::messages_full(&store, SESSION_JSONL_ID)?;
            anyhow::ensure!(!messages.is_empty(), "no messages derived");
        }
        [kind, path] if kind == "resume-zstd" => {
            let file = std::fs::read(path)?;
            let plain = zstd::decode_all(file.as_slice())?;
            let values = plain
                .split(|&byte| byte == b'\n')
                .filter(|line| !line.is_empty())
                .map(serde_json::from_slice::<serde_json::Value>)
                .collect::<Result<Vec<_>, _>>()?;
            anyhow::ensure!(values.len() > 1, "no events read");
        }
        [kind, system, dir, sessions, events] if kind == "crash-writer" => {
            crash_writer(system, Path::new(dir), sessions.parse()?, events.parse()?)?;
        }
        [kind, system, dir] if kind == "reopen" => reopen(system, Path::new(dir))?,
        [kind, dir] if kind == "reopen-report" => {
            // What the dshdb reopen found (a writable open, as `reopen` makes it).
            let store = Store::open(dir, Options::default())?;
            eprintln!("{:?}", store.recovery_report());
        }
        other => bail!("unknown child command {other:?}"),
    }
    println!(
        "{} {} {}",
        started.elapsed().as_secs_f64() * 1e3,
        peak_rss_mib(),
        cpu_millis()
    );
    Ok(())
}

pub(crate) fn run_child(args: &[&str]) -> Result<ChildReport> {
    let mut command = Command::new(std::env::current_exe()?);
    command.arg("child").args(args);
    run_measured(command, args)
}

/// Runs a child that prints `millis peak_rss_mib` and reads its report.
pub(crate) fn run_measured(mut command: Command, args: &[&str]) -> Result<ChildReport> {
    let output = command.output().context("spawn child")?;
    if !output.status.success() {
        bail!(
            "child {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    let mut number =
        || -> Result<f64> { Ok(fields.next().context("child report")?.parse::<f64>()?) };
    Ok(ChildReport {
        millis: number()?,
        peak_rss_mib: number()?,
        cpu_millis: number().unwrap_or(f64::NAN),
    })
}

pub(crate) fn median_report(mut runs: Vec<ChildReport>) -> ChildReport {
    runs.sort_by(|a, b| a.millis.total_cmp(&b.millis));
    runs.swap_remove(runs.len() / 2)
}

/// Writes the DSH JSONL of one session as `session.jsonl.zstd`, `LINES_PER_FRAME` lines a frame.
fn write_dsh_zstd(jsonl: &[u8], path: &Path) -> Result<u64> {
    let mut lines = jsonl.split_inclusive(|&byte| byte == b'\n');
    let header = lines.next().context("header line")?;
    let mut out = dsh_frame(header)?;
    let rest: Vec<&[u8]> = lines.collect();
    for frame in rest.chunks(LINES_PER_FRAME) {
        out.extend(dsh_frame(&frame.concat())?);
    }
    std::fs::write(path, &out)?;
    Ok(out.len() as u64)
}

/// Manifest of the cold-resume baseline crate: its own workspace, so that its serde_json
/// has the default features only (see its Cargo.toml and BENCHMARKS.md).
const BASELINE_MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/resume-baseline/Cargo.toml");

/// Builds the baseline crate (release) and returns its executable.
pub(crate) fn build_baseline() -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--message-format=json"])
        .args(["--manifest-path", BASELINE_MANIFEST])
        .output()
        .context("run cargo to build the baseline")?;
    if !output.status.success() {
        bail!(
            "building {BASELINE_MANIFEST} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no baseline executable")
}

/// Cold resume, as a markdown section.
pub fn cold_resume(work: &Path, events: usize) -> Result<String> {
    let baseline_binary = build_baseline()?;
    eprintln!("cold resume: a {events}-event session");
    let dir = work.join("resume");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let jsonl = session_jsonl(0x5E55_10E5, events);
    let zstd_path = dir.join("session.jsonl.zstd");
    let zstd_bytes = write_dsh_zstd(&jsonl, &zstd_path)?;
    let store_path = dir.join("store");
    let store = Store::open(&store_path, Options::default())?;
    exchange::import_dsh_jsonl(&store, &jsonl)?;
    store.close()?;
    drop(store);
    let store_bytes = crate::disk_use(&store_path)?.apparent;
    let (store_text, zstd_text) = (path_text(&store_path)?, path_text(&zstd_path)?);
    let mut runs: [Vec<ChildReport>; 5] = Default::default();
    for _ in 0..RESUME_RUNS {
        warm_zstd_file(&zstd_path);
        runs[0].push(run_child(&["resume-dshdb-texts", store_text])?);
        runs[1].push(run_child(&["resume-dshdb", store_text])?);
        runs[2].push(run_child(&["resume-dshdb-full", store_text])?);
        let mut baseline = Command::new(&baseline_binary);
        baseline.arg(zstd_text);
        runs[3].push(run_measured(baseline, &["resume-baseline", zstd_text])?);
        runs[4].push(run_child(&["resume-zstd", zstd_text])?);
    }
    let [texts, dshdb, full, baseline, baseline_workspace] = runs.map(median_report);
    std::fs::remove_dir_all(&dir)?;
    let mut out = String::new();
    writeln!(
        out,
        "### Cold resume of one {events}-event session ({:.0} MB of JSONL; fresh process each, \
         median of {RESUME_RUNS}, runs interleaved; page cache warm)\n",
        jsonl.len() as f64 / 1e6
    )?;
    writeln!(
        out,
        "| system | time (ms) | CPU time (ms) | peak RSS (MiB) | on disk (MB) |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let store_mb = store_bytes as f64 / 1e6;
    let zstd_mb = zstd_bytes as f64 / 1e6;
    let rows = [
        ("dshdb: open + derive messages as exact JSON texts (`derive::message_texts`, streamed)", &texts, store_mb),
        ("dshdb: open + derive messages as serde_json Values (`derive::messages`, streamed)", &dshdb, store_mb),
        ("dshdb: open + full cold load, then derive (`derive::messages_full`; the path before streaming)", &full, store_mb),
        ("DSH session.jsonl.zstd: zstd + serde_json Value per line, no derivation (baseline: separate crate, default serde_json features)", &baseline, zstd_mb),
        ("same, built in the workspace (serde_json `preserve_order` + `arbitrary_precision`)", &baseline_workspace, zstd_mb),
    ];
    for (label, report, mb) in rows {
        writeln!(
            out,
            "| {label} | {:.0} | {:.0} | {:.0} | {mb:.1} |",
            report.millis, report.cpu_millis, report.peak_rss_mib
        )?;
    }
    let ratio = |report: &ChildReport| {
        format!(
            "time {:.2}× (CPU time {:.2}×), peak RSS {:.2}×",
            report.millis / baseline.millis,
            report.cpu_millis / baseline.cpu_millis,
            report.peak_rss_mib / baseline.peak_rss_mib
        )
    };
    writeln!(
        out,
        "\nAgainst the JSONL-zstd baseline (issue #4 targets: time ≤ 0.2×, RSS ≤ 0.5×): \
         message texts {}; message Values {}; the full cold load {}.\n",
        ratio(&texts),
        ratio(&dshdb),
        ratio(&full)
    )?;
    Ok(out)
}

/// The page cache is left warm for both (dropping it needs root): the store was just
/// written by the import, and this reads the zstd file once so it is cached too.
fn warm_zstd_file(file: &Path) {
    let _ = std::fs::read(file);
}

fn path_text(path: &Path) -> Result<&str> {
    path.to_str().context("a UTF-8 path")
}

/// Child: writes `sessions` × `events` DSH-mix events to `system` at `dir`, then exits
/// without closing anything.
fn crash_writer(system: &str, dir: &Path, sessions: usize, events: usize) -> Result<()> {
    let ids: Vec<String> = (0..sessions).map(|i| format!("session-{i:05}")).collect();
    let streams: Vec<Vec<_>> = (0..sessions)
        .map(|i| SessionStream::new(7, i as u64, Shape::Dsh).take(events))
        .collect();
    match system {
        "dshdb" => {
            let options = Options {
                durability: dshdb::storage::commit::Durability::Buffered,
                ..Options::default()
            };
            let store = Store::open(dir, options)?;
            for (id, stream) in ids.iter().zip(&streams) {
                let mut writer = store.create_session_with_id(id)?;
                for batch in stream.chunks(CRASH_BATCH_EVENTS) {
                    let events: Vec<NewEvent<'_>> =
                        batch.iter().map(GenEvent::as_new_event).collect();
                    writer.append_batch(&events)?;
                }
            }
            store.flush()?;
        }
        "sqlite" => {
            std::fs::create_dir_all(dir)?;
            let mut db = Sqlite::create(&dir.join("dsh.sqlite"))?;
            db.unsynced()?;
            db.create_sessions(&ids)?;
            for (id, stream) in ids.iter().zip(&streams) {
                for batch in stream.chunks(CRASH_BATCH_EVENTS) {
                    db.append_batch(id, batch)?;
                }
            }
        }
        "redb" => {
            std::fs::create_dir_all(dir)?;
            let db = Redb::create(&dir.join("events.redb"))?;
            for (id, stream) in ids.iter().zip(&streams) {
                for (index, batch) in stream.chunks(CRASH_BATCH_EVENTS).enumerate() {
                    let first = (index * CRASH_BATCH_EVENTS) as u64;
                    db.append_batch_unsynced(id, first, batch)?;
                }
            }
        }
        "jsonl-zstd" => {
            for (id, stream) in ids.iter().zip(&streams) {
                let mut file = JsonlSession::create_encoded(dir, id, false, JsonlEncoding::Zstd)?;
                for batch in stream.chunks(CRASH_BATCH_EVENTS) {
                    file.append_batch(batch, false)?;
                }
            }
        }
        other => bail!("unknown system {other}"),
    }
    // A kill: no close, no destructors, no final flush of anything buffered in the process.
    // SAFETY: _exit(2) has no preconditions.
    unsafe { libc::_exit(0) }
}

/// Child: opens `system` at `dir` after the crash until it can list its sessions.
fn reopen(system: &str, dir: &Path) -> Result<()> {
    let sessions = match system {
        "dshdb" => Store::open(dir, Options::default())?.sessions().len(),
        "sqlite" => {
            let connection = rusqlite::Connection::open(dir.join("dsh.sqlite"))?;
            let count: i64 =
                connection.query_row("SELECT count(*) FROM sessions", [], |row| row.get(0))?;
            usize::try_from(count)?
        }
        "redb" => {
            let database = redb::Database::create(dir.join("events.redb"))?;
            let read = database.begin_read()?;
            drop(read);
            1
        }
        "jsonl-zstd" => {
            let root = dir.join("_no-cwd");
            let mut count = 0;
            for entry in std::fs::read_dir(root)? {
                let file = std::fs::File::open(entry?.path().join("session.jsonl.zstd"))?;
                let mut header = String::new();
                std::io::BufReader::new(zstd::Decoder::new(file)?).read_line(&mut header)?;
                count += usize::from(header.contains("\"type\":\"session\""));
            }
            count
        }
        other => bail!("unknown system {other}"),
    };
    anyhow::ensure!(sessions > 0, "no sessions after reopen");
    Ok(())
}

/// Reopen after a crash, as a markdown section.
pub fn crash_reopen(work: &Path, sessions: usize, events: usize) -> Result<String> {
    let mut out = String::new();
    writeln!(
        out,
        "### Reopen after a crash ({sessions} sessions × {events} DSH-mix events written, then \
         the writer process exits without closing; fresh process each, median of {RUNS})\n"
    )?;
    writeln!(
        out,
        "| system | reopen until sessions listed (ms) | on disk (MB) |"
    )?;
    writeln!(out, "|---|---:|---:|")?;
    for system in ["dshdb", "jsonl-zstd", "sqlite", "redb"] {
        eprintln!("crash reopen: {system}");
        let mut runs = Vec::new();
        let mut bytes = 0;
        for _ in 0..RUNS {
            let dir = work.join(format!("crash-{system}"));
            let _ = std::fs::remove_dir_all(&dir);
            let dir_text = path_text(&dir)?;
            let (sessions_text, events_text) = (sessions.to_string(), events.to_string());
            let writer = Command::new(std::env::current_exe()?)
                .args([
                    "child",
                    "crash-writer",
                    system,
                    dir_text,
                    &sessions_text,
                    &events_text,
                ])
                .status()?;
            anyhow::ensure!(writer.success(), "crash writer for {system} failed");
            bytes = crate::disk_use(&dir)?.apparent;
            runs.push(run_child(&["reopen", system, dir_text])?);
            std::fs::remove_dir_all(&dir)?;
        }
        let report = median_report(runs);
        writeln!(
            out,
            "| {system} | {:.1} | {:.1} |",
            report.millis,
            bytes as f64 / 1e6
        )?;
    }
    writeln!(out)?;
    Ok(out)
}
