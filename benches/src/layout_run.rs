//! `compare` section "DSH's own files" (`compare --only dsh-layout`): import, export, cold
//! resume and bytes after `maintain`, on both layouts of one 1.3M-event session: one line per
//! event (the workload the other sections use) and DSH's own packed layout
//! ([`dsh_layout`]: chunk rows per write-behind batch, one zstd frame per batch). Every timed
//! step runs in a fresh child process so that its peak RSS (`VmHWM`) is its own; the plain
//! Rust reader of the zstd file runs in the same run, interleaved.
//!
//! DSH itself restoring the file (its npm JSONL-zstd provider: prepare + deriveMessages) is
//! measured when `DSHDB_BENCH_DSH_RESUME` names a command: it is run with the
//! `session.jsonl.zstd` path and the session id appended and must print
//! `millis peak_rss_mib [cpu_millis]` on stdout, as the child commands here do.

use crate::resume_run::{self, ChildReport};
use anyhow::{ensure, Context, Result};
use dshdb::derive;
use dshdb::exchange;
use dshdb::{Options, Store};
use dshdb_benches::dsh_layout;
use dshdb_benches::workload::{session_jsonl, SESSION_JSONL_ID};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Timed child runs per measurement; the median is reported.
const RUNS: usize = 3;
/// Environment variable naming the DSH restore command (the `node` branch's harness).
pub const DSH_RESUME_COMMAND: &str = "DSHDB_BENCH_DSH_RESUME";
/// Lines per zstd frame of the line-per-event file (about one 200 ms write-behind batch).
const LINES_PER_FRAME: usize = 16;

/// One session in one layout, written as both of DSH's files.
struct Layout {
    name: &'static str,
    id: &'static str,
    events: u64,
    lines: u64,
    rows: u64,
    frames: usize,
    plain_path: PathBuf,
    zstd_path: PathBuf,
    plain_bytes: u64,
    zstd_bytes: u64,
}

/// The line-per-event file as `session.jsonl.zstd`: the header frame, then
/// `LINES_PER_FRAME` lines a frame.
fn line_per_event_zstd(jsonl: &[u8]) -> Result<(Vec<u8>, usize)> {
    let mut lines = jsonl.split_inclusive(|&byte| byte == b'\n');
    let header = lines.next().context("header line")?;
    let mut out = dshdb_benches::baselines::dsh_frame(header)?;
    let rest: Vec<&[u8]> = lines.collect();
    let mut frames = 1;
    for frame in rest.chunks(LINES_PER_FRAME) {
        out.extend(dshdb_benches::baselines::dsh_frame(&frame.concat())?);
        frames += 1;
    }
    Ok((out, frames))
}

fn write_layout(
    dir: &Path,
    name: &'static str,
    id: &'static str,
    jsonl: &[u8],
    zstd: &[u8],
    counts: (u64, u64, u64, usize),
) -> Result<Layout> {
    std::fs::create_dir_all(dir)?;
    let (plain_path, zstd_path) = (dir.join("session.jsonl"), dir.join("session.jsonl.zstd"));
    std::fs::write(&plain_path, jsonl)?;
    std::fs::write(&zstd_path, zstd)?;
    let (events, lines, rows, frames) = counts;
    Ok(Layout {
        name,
        id,
        events,
        lines,
        rows,
        frames,
        plain_path,
        zstd_path,
        plain_bytes: jsonl.len() as u64,
        zstd_bytes: zstd.len() as u64,
    })
}

/// Both layouts of a session of about `events` events, written under `work`.
fn layouts(work: &Path, events: usize) -> Result<Vec<Layout>> {
    eprintln!("dsh layout: generating the line-per-event session");
    let jsonl = session_jsonl(0x5E55_10E5, events);
    let lines = jsonl.iter().filter(|&&byte| byte == b'\n').count() as u64 - 1;
    let (zstd, frames) = line_per_event_zstd(&jsonl)?;
    let line_per_event = write_layout(
        &work.join("line-per-event"),
        "one line per event",
        SESSION_JSONL_ID,
        &jsonl,
        &zstd,
        (events as u64, lines, 0, frames),
    )?;
    drop((jsonl, zstd));
    eprintln!("dsh layout: generating the DSH packed session");
    let layout = dsh_layout::generate(0x5E55_10E5, events as u64);
    let zstd = layout.zstd()?;
    let packed = write_layout(
        &work.join("dsh-packed"),
        "DSH packed (chunk rows, a frame per batch)",
        dsh_layout::SESSION_ID,
        &layout.jsonl,
        &zstd,
        (layout.events, layout.lines, layout.rows, layout.frames()),
    )?;
    Ok(vec![line_per_event, packed])
}

/// Events of the session `dsh-layout-file` writes by default: the size of issue #14's
/// measured DSH coding session.
const PACKED_FILE_DEFAULT_EVENTS: u64 = 1_300_000;

/// `dsh-layout-file DIR [EVENTS]`: writes a DSH packed-layout session as DIR/session.jsonl
/// and DIR/session.jsonl.zstd (for benchmarks outside this runner, such as the Node
/// provider's cold restore) and prints its id and counts.
pub fn write_packed_files(args: &[String]) -> Result<()> {
    let dir = PathBuf::from(args.first().context("dsh-layout-file needs a directory")?);
    let events = match args.get(1) {
        Some(text) => text.parse().context("EVENTS must be a count")?,
        None => PACKED_FILE_DEFAULT_EVENTS,
    };
    let layout = dsh_layout::generate(0x5E55_10E5, events);
    let zstd = layout.zstd()?;
    let written = write_layout(
        &dir,
        "DSH packed",
        dsh_layout::SESSION_ID,
        &layout.jsonl,
        &zstd,
        (layout.events, layout.lines, layout.rows, layout.frames()),
    )?;
    println!(
        "{} {} events, {} lines ({} packed rows), {} zstd frames; {} / {} bytes in {}",
        written.id,
        written.events,
        written.lines,
        written.rows,
        written.frames,
        written.plain_bytes,
        written.zstd_bytes,
        dir.display()
    );
    Ok(())
}

/// The child side: `child layout-KIND ARGS...`. Returns whether `kind` was one of these.
pub fn child(kind: &str, args: &[String]) -> Result<bool> {
    match (kind, args) {
        // What `dshdb import` runs: the streaming import, in bounded memory.
        // The store is new: the parent removed the previous run's before starting the clock.
        ("layout-import", [encoding, file, store]) => {
            ensure!(
                !Path::new(store).exists(),
                "the import's store exists already"
            );
            let opened = Store::open(store, Options::default())?;
            let zstd = encoding == "zstd";
            let report =
                exchange::streaming::import_dsh_file(&opened, Path::new(file), zstd, &|_| {})?;
            ensure!(report.events > 0, "nothing imported");
            opened.close()?;
        }
        // What `dshdb export -o FILE` runs: the streaming export through a buffered file
        // (the CLI then syncs the file before renaming it into place; that flush of the
        // disk is left out here, as it is of the other systems' exports).
        ("layout-export", [encoding, store, id, file]) => {
            let opened = Store::open(store, read_only())?;
            let mut out = std::io::BufWriter::new(std::fs::File::create(file)?);
            if encoding == "zstd" {
                exchange::write_dsh_jsonl_zstd(&opened, id, &mut out)?;
            } else {
                exchange::write_dsh_jsonl(&opened, id, &mut out)?;
            }
            std::io::Write::flush(&mut out)?;
        }
        ("layout-resume", [store, id]) => {
            let opened = Store::open(store, read_only())?;
            let messages = derive::messages(&opened, id)?;
            ensure!(!messages.is_empty(), "no messages derived");
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Removes a store directory left by an earlier run, if any.
fn remove_store(store: &Path) -> Result<()> {
    match std::fs::remove_dir_all(store) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error.into()),
        _ => Ok(()),
    }
}

fn read_only() -> Options {
    Options {
        read_only: true,
        ..Options::default()
    }
}

fn text(path: &Path) -> Result<&str> {
    path.to_str().context("a UTF-8 path")
}

/// The medians of one layout's measurements.
struct Measured {
    import_plain: ChildReport,
    import_zstd: ChildReport,
    export_plain: ChildReport,
    export_zstd: ChildReport,
    maintain_millis: f64,
    bytes_after_maintain: u64,
    resume: ChildReport,
    reader: ChildReport,
    dsh: Option<ChildReport>,
}

/// Runs the DSH restore command of [`DSH_RESUME_COMMAND`], if set.
fn dsh_resume(layout: &Layout) -> Result<Option<ChildReport>> {
    let Ok(command_line) = std::env::var(DSH_RESUME_COMMAND) else {
        return Ok(None);
    };
    let mut parts = command_line.split_whitespace();
    let program = parts.next().context("empty DSH resume command")?;
    let mut command = Command::new(program);
    command.args(parts).arg(&layout.zstd_path).arg(layout.id);
    resume_run::run_measured(command, &["dsh-resume"]).map(Some)
}

fn measure(work: &Path, layout: &Layout, baseline: &Path) -> Result<Measured> {
    let store = work.join("store");
    let zstd_store = work.join("store-zstd");
    let (store_text, zstd_store_text) = (text(&store)?, text(&zstd_store)?);
    let (plain_text, zstd_text) = (text(&layout.plain_path)?, text(&layout.zstd_path)?);
    let mut imports = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        eprintln!("dsh layout, {}: import", layout.name);
        // Deleting the previous run's store is no part of an import: not on its clock.
        remove_store(&store)?;
        remove_store(&zstd_store)?;
        imports.0.push(resume_run::run_child(&[
            "layout-import",
            "plain",
            plain_text,
            store_text,
        ])?);
        imports.1.push(resume_run::run_child(&[
            "layout-import",
            "zstd",
            zstd_text,
            zstd_store_text,
        ])?);
    }
    std::fs::remove_dir_all(&zstd_store)?;
    let exported = work.join("exported.jsonl");
    let exported_zstd = work.join("exported.jsonl.zstd");
    let mut exports = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        eprintln!("dsh layout, {}: export", layout.name);
        exports.0.push(resume_run::run_child(&[
            "layout-export",
            "plain",
            store_text,
            layout.id,
            text(&exported)?,
        ])?);
        exports.1.push(resume_run::run_child(&[
            "layout-export",
            "zstd",
            store_text,
            layout.id,
            text(&exported_zstd)?,
        ])?);
    }
    let original = std::fs::read(&layout.plain_path)?;
    ensure!(
        std::fs::read(&exported)? == original,
        "{}: export is not byte-identical to the imported file",
        layout.name
    );
    ensure!(
        zstd::decode_all(std::fs::read(&exported_zstd)?.as_slice())? == original,
        "{}: zstd export does not decompress to the imported file",
        layout.name
    );
    drop(original);
    std::fs::remove_file(&exported)?;
    std::fs::remove_file(&exported_zstd)?;
    eprintln!("dsh layout, {}: maintain", layout.name);
    let started = Instant::now();
    let opened = Store::open(&store, Options::default())?;
    opened.maintain()?;
    opened.close()?;
    drop(opened);
    let maintain_millis = started.elapsed().as_secs_f64() * 1e3;
    let bytes_after_maintain = crate::disk_use(&store)?.apparent;
    let (mut resumes, mut readers, mut dsh) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        eprintln!("dsh layout, {}: cold resume", layout.name);
        let _ = std::fs::read(&layout.zstd_path);
        resumes.push(resume_run::run_child(&[
            "layout-resume",
            store_text,
            layout.id,
        ])?);
        let mut reader = Command::new(baseline);
        reader.arg(zstd_text);
        readers.push(resume_run::run_measured(
            reader,
            &["plain-reader", zstd_text],
        )?);
        if let Some(report) = dsh_resume(layout)? {
            dsh.push(report);
        }
    }
    std::fs::remove_dir_all(&store)?;
    Ok(Measured {
        import_plain: resume_run::median_report(imports.0),
        import_zstd: resume_run::median_report(imports.1),
        export_plain: resume_run::median_report(exports.0),
        export_zstd: resume_run::median_report(exports.1),
        maintain_millis,
        bytes_after_maintain,
        resume: resume_run::median_report(resumes),
        reader: resume_run::median_report(readers),
        dsh: (!dsh.is_empty()).then(|| resume_run::median_report(dsh)),
    })
}

/// MB/s of `bytes` in `millis`.
fn rate(bytes: u64, millis: f64) -> f64 {
    bytes as f64 / 1e6 / (millis / 1e3)
}

fn verdict(met: bool) -> &'static str {
    crate::verdict(met)
}

/// The section, as markdown.
pub fn run(work: &Path, events: usize) -> Result<String> {
    let baseline = resume_run::build_baseline()?;
    let dir = work.join("dsh-layout");
    let _ = std::fs::remove_dir_all(&dir);
    let layouts = layouts(&dir, events)?;
    let mut measured = Vec::new();
    for layout in &layouts {
        measured.push(measure(&dir, layout, &baseline)?);
    }
    std::fs::remove_dir_all(&dir)?;
    let mut out = String::new();
    writeln!(
        out,
        "### DSH's own files, both layouts (fresh process per step, median of {RUNS}; MB/s of \
         plaintext JSONL; page cache warm; import and export stream as `dshdb import` and \
         `dshdb export -o FILE` do; the export file is not synced)\n"
    )?;
    writeln!(
        out,
        "| | {} |",
        layouts
            .iter()
            .map(|l| l.name)
            .collect::<Vec<_>>()
            .join(" | ")
    )?;
    writeln!(out, "|---|{}", "---:|".repeat(layouts.len()))?;
    let row = |out: &mut String, label: &str, cell: &dyn Fn(&Layout, &Measured) -> String| {
        let cells: Vec<String> = layouts
            .iter()
            .zip(&measured)
            .map(|(layout, measured)| cell(layout, measured))
            .collect();
        writeln!(out, "| {label} | {} |", cells.join(" | "))
    };
    row(
        &mut out,
        "events / lines / packed rows / zstd frames",
        &|l, _| format!("{} / {} / {} / {}", l.events, l.lines, l.rows, l.frames),
    )?;
    row(
        &mut out,
        "session.jsonl / session.jsonl.zstd (MB)",
        &|l, _| {
            format!(
                "{:.1} / {:.1}",
                l.plain_bytes as f64 / 1e6,
                l.zstd_bytes as f64 / 1e6
            )
        },
    )?;
    let timed = |report: &ChildReport, bytes: u64| {
        format!(
            "{:.0} MB/s ({:.0} ms, {:.0} MiB)",
            rate(bytes, report.millis),
            report.millis,
            report.peak_rss_mib
        )
    };
    row(
        &mut out,
        "import session.jsonl (rate, time, peak RSS)",
        &|l, m| timed(&m.import_plain, l.plain_bytes),
    )?;
    row(&mut out, "import session.jsonl.zstd", &|l, m| {
        timed(&m.import_zstd, l.plain_bytes)
    })?;
    row(&mut out, "export dsh-jsonl (byte-identical)", &|l, m| {
        timed(&m.export_plain, l.plain_bytes)
    })?;
    row(&mut out, "export dsh-jsonl-zstd", &|l, m| {
        timed(&m.export_zstd, l.plain_bytes)
    })?;
    row(
        &mut out,
        "maintain (ms) / bytes after (MB, × the zstd file)",
        &|l, m| {
            format!(
                "{:.0} / {:.1} ({:.2}×)",
                m.maintain_millis,
                m.bytes_after_maintain as f64 / 1e6,
                m.bytes_after_maintain as f64 / l.zstd_bytes as f64
            )
        },
    )?;
    let resumed =
        |report: &ChildReport| format!("{:.0} ms, {:.0} MiB", report.millis, report.peak_rss_mib);
    row(
        &mut out,
        "dshdb cold resume to messages (`derive::messages`, no projection checkpoint)",
        &|_, m| resumed(&m.resume),
    )?;
    row(&mut out, "plain Rust reader of the zstd file (zstd stream + serde_json Value per line + rows expanded)", &|_, m| {
        resumed(&m.reader)
    })?;
    row(
        &mut out,
        "DSH itself (npm JSONL-zstd provider: prepare + deriveMessages)",
        &|_, m| {
            m.dsh
                .as_ref()
                .map_or_else(|| format!("not run (set {DSH_RESUME_COMMAND})"), &resumed)
        },
    )?;
    row(
        &mut out,
        "cold resume speed-up over the plain reader / over DSH",
        &|_, m| {
            let dsh = m.dsh.as_ref().map_or_else(
                || "–".to_owned(),
                |report| format!("{:.2}×", report.millis / m.resume.millis),
            );
            format!("{:.2}× / {dsh}", m.reader.millis / m.resume.millis)
        },
    )?;
    writeln!(out)?;
    let packed = layouts.len() - 1;
    let (layout, m) = (&layouts[packed], &measured[packed]);
    writeln!(out, "Issue #14 targets on the DSH packed layout:\n")?;
    writeln!(out, "| target | measured | verdict |")?;
    writeln!(out, "|---|---|---|")?;
    for (name, report) in [("plain", &m.import_plain), ("zstd", &m.import_zstd)] {
        let mbs = rate(layout.plain_bytes, report.millis);
        writeln!(
            out,
            "| import {name} ≥ 150 MB/s, peak RSS ≤ 128 MiB | {mbs:.0} MB/s, {:.0} MiB | {} |",
            report.peak_rss_mib,
            verdict(mbs >= 150.0 && report.peak_rss_mib <= 128.0)
        )?;
    }
    let export = rate(layout.plain_bytes, m.export_plain.millis);
    writeln!(
        out,
        "| export plain ≥ 400 MB/s | {export:.0} MB/s | {} |",
        verdict(export >= 400.0)
    )?;
    let speedup = m.reader.millis / m.resume.millis;
    writeln!(
        out,
        "| cold resume ≥ 5× the plain Rust reader | {speedup:.2}× | {} |",
        verdict(speedup >= 5.0)
    )?;
    let bytes = m.bytes_after_maintain as f64 / layout.zstd_bytes as f64;
    writeln!(
        out,
        "| bytes after maintain ≤ 0.7× session.jsonl.zstd | {bytes:.2}× | {} |",
        verdict(bytes <= 0.7)
    )?;
    writeln!(out)?;
    Ok(out)
}
