//! DSH exchange commands: import, export, messages, surface, repair, fork, info.

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use dshdb::derive;
use dshdb::exchange::{self, layout, spill_lines, ImportReport};
use dshdb::{Options, Store};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Read;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Inputs or outputs larger than this get a progress bar (when stderr is a terminal).
const PROGRESS_THRESHOLD: u64 = 1024 * 1024;

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: never show progress bars.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether progress may be drawn at all: not `--quiet` and stderr is a terminal.
fn progress_allowed() -> bool {
    !QUIET.load(Ordering::Relaxed) && std::io::stderr().is_terminal()
}

/// A progress bar on stderr, hidden until [`Progress::reveal`] (and never when not allowed).
struct Progress {
    bar: ProgressBar,
    allowed: bool,
    shown: bool,
}

impl Progress {
    fn new(message: String) -> Progress {
        let bar = ProgressBar::hidden();
        let style = ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({percent}%)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(message);
        Progress {
            bar,
            allowed: progress_allowed(),
            shown: false,
        }
    }

    /// Starts drawing (once), if allowed.
    fn reveal(&mut self) {
        if self.allowed && !self.shown {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    fn update(&self, done: u64, total: u64) {
        if self.bar.length() != Some(total) {
            self.bar.set_length(total);
        }
        self.bar.set_position(done);
    }

    fn finish(&self) {
        if self.shown {
            self.bar.finish_and_clear();
        }
    }
}

/// A writer that counts the bytes written through it.
struct Counting<'a, W: Write> {
    inner: W,
    written: &'a Cell<u64>,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let count = self.inner.write(buf)?;
        self.written.set(self.written.get() + count as u64);
        Ok(count)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Export formats.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// DSH `session.jsonl`.
    DshJsonl,
    /// DSH `session.jsonl.zstd` (one zstd frame per recorded batch).
    DshJsonlZstd,
    /// dshdb's canonical, versioned, self-describing JSONL (`dshdb-json` v1): lossless.
    Json,
}

/// Opens the store an import writes to, creating it when missing (`import` is one of the
/// commands that may create a store).
fn open_or_create(path: &Path) -> Result<Store> {
    Store::open(path, Options::default())
        .with_context(|| format!("cannot open store {}", path.display()))
}

/// One thing to import: a file named on the command line, or a log found in a DSH sessions
/// directory (`<root>/--project--/<id>/session.jsonl[.zstd]`), whose identity is checked.
enum Source {
    File(PathBuf),
    Artifact(layout::SessionArtifact),
}

impl Source {
    fn path(&self) -> &Path {
        match self {
            Source::File(path) => path,
            Source::Artifact(artifact) => &artifact.path,
        }
    }
}

/// Bytes of a file's start read to find its header line (or first zstd frame) at first; a
/// longer header is looked for up to the line limit.
const HEADER_PROBE_BYTES: u64 = 64 * 1024;

/// Most sessions imported at once (each holds at most one staged batch and one line).
const MAX_IMPORT_THREADS: usize = 8;

/// The first bytes of a file: enough for its header line, never more than a line's limit
/// (plus room for a zstd frame's framing).
fn read_prefix(path: &Path) -> Result<Vec<u8>> {
    let read = |limit: u64| -> Result<Vec<u8>> {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut prefix = Vec::new();
        std::io::Read::take(file, limit)
            .read_to_end(&mut prefix)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(prefix)
    };
    let prefix = read(HEADER_PROBE_BYTES)?;
    let has_line = prefix.contains(&b'\n');
    if has_line || (prefix.len() as u64) < HEADER_PROBE_BYTES {
        return Ok(prefix);
    }
    read(exchange::MAX_IMPORT_LINE_BYTES as u64 + exchange::IMPORT_LINE_ENVELOPE_BYTES as u64)
}

/// DSH binds a stored header to its path before loading; so does a directory import.
fn check_identity(artifact: &layout::SessionArtifact) -> Result<()> {
    let prefix = read_prefix(&artifact.path)?;
    layout::check_artifact(artifact, &prefix)
        .with_context(|| format!("cannot import {}", artifact.path.display()))
}

/// What importing one file did.
enum Imported {
    Dsh(ImportReport),
    Canonical(exchange::CanonicalImport),
}

/// Reads an input file whole, refusing one larger than the plaintext an import may hold.
fn read_input(path: &Path) -> Result<Vec<u8>> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > exchange::MAX_IMPORT_PLAINTEXT_BYTES {
        bail!(
            "cannot import {}: the file is {size} bytes; the import limit is {} bytes",
            path.display(),
            exchange::MAX_IMPORT_PLAINTEXT_BYTES
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Imports one file: a canonical `dshdb-json` log (in memory, with its own progress), or a
/// DSH log, streamed in bounded memory; `progress` gets the file bytes read.
fn import_file(
    store: &Store,
    path: &Path,
    progress: exchange::streaming::Progress<'_>,
) -> Result<Imported> {
    let prefix = read_prefix(path)?;
    let first_line = prefix
        .split(|&byte| byte == b'\n')
        .next()
        .unwrap_or_default();
    if exchange::is_canonical(first_line) {
        let bytes = read_input(path)?;
        let report = spill_lines::import_canonical_with_spill(store, &bytes, &mut |_, _| {});
        progress(bytes.len() as u64);
        return report
            .map(Imported::Canonical)
            .with_context(|| format!("cannot import {}", path.display()));
    }
    let zstd = path.extension().is_some_and(|ext| ext == "zstd");
    exchange::streaming::import_dsh_file(store, path, zstd, progress)
        .map(Imported::Dsh)
        .with_context(|| format!("cannot import {}", path.display()))
}

/// What importing one source printed: its lines for stdout, or the error.
fn import_source(
    store: &Store,
    source: &Source,
    progress: exchange::streaming::Progress<'_>,
) -> Result<Vec<u8>> {
    let path = source.path();
    if let Source::Artifact(artifact) = source {
        check_identity(artifact)?;
    }
    let mut out = Vec::new();
    if let Some(result) = crate::sqlite_import::try_import(store, path, &mut out) {
        result?;
        return Ok(out);
    }
    match import_file(store, path, progress)? {
        Imported::Canonical(report) => writeln!(
            out,
            "imported {}: {} events (dshdb-json, {} batches) from {}",
            report.session_id,
            report.events,
            report.batches,
            path.display()
        )?,
        Imported::Dsh(report) => {
            write!(
                out,
                "imported {}: {} events ({} lines, {} packed rows, {} verbatim",
                report.session_id, report.events, report.lines, report.rows, report.verbatim
            )?;
            if report.frames > 0 {
                write!(out, ", {} zstd frames", report.frames)?;
            }
            writeln!(out, ") from {}", path.display())?;
            if let Some(tail) = &report.dropped {
                print_dropped_tail(tail, &mut out)?;
            }
        }
    }
    Ok(out)
}

/// One progress bar over every file being imported: bytes read of the files' total size.
fn import_progress(files: &[Source]) -> ProgressBar {
    let total: u64 = files
        .iter()
        .filter_map(|source| std::fs::metadata(source.path()).ok())
        .map(|metadata| metadata.len())
        .sum();
    if !progress_allowed() || total <= PROGRESS_THRESHOLD {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({percent}%, {binary_bytes_per_sec})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(match files.len() {
        1 => format!("importing {}", files[0].path().display()),
        count => format!("importing {count} sessions"),
    });
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Imports every source, several at once (one thread per core, at most
/// [`MAX_IMPORT_THREADS`]); returns each one's outcome, in order.
fn import_all(store: &Store, files: &[Source], bar: &ProgressBar) -> Vec<Result<Vec<u8>>> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = cores.min(MAX_IMPORT_THREADS).min(files.len()).max(1);
    let next = AtomicUsize::new(0);
    let outcomes: Vec<Mutex<Option<Result<Vec<u8>>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(source) = files.get(index) else {
                    return;
                };
                // The bar advances by what this file read since its last report.
                let reported = AtomicU64::new(0);
                let progress = |read: u64| {
                    let before = reported.swap(read, Ordering::Relaxed);
                    bar.inc(read.saturating_sub(before));
                };
                let outcome = import_source(store, source, &progress);
                if let Ok(mut slot) = outcomes[index].lock() {
                    *slot = Some(outcome);
                }
            });
        }
    });
    outcomes
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .ok()
                .flatten()
                .unwrap_or_else(|| Err(anyhow::anyhow!("an import thread failed")))
        })
        .collect()
}

pub fn import(store_path: &Path, paths: &[PathBuf], out: &mut impl Write) -> Result<()> {
    // Layout refusals (flat files, mixed encodings, an id in two projects) come before any
    // write, as in DSH.
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let discovered = layout::discover_directory(path)
                .with_context(|| format!("cannot import sessions directory {}", path.display()))?;
            for link in &discovered.outside_links {
                eprintln!(
                    "dshdb: skipped {}: it links outside the sessions directory {}",
                    link.display(),
                    path.display()
                );
            }
            files.extend(discovered.artifacts.into_iter().map(Source::Artifact));
        } else {
            files.push(Source::File(path.clone()));
        }
    }
    let store = open_or_create(store_path)?;
    if files.is_empty() {
        bail!("no DSH session files found");
    }
    let bar = import_progress(&files);
    let outcomes = import_all(&store, &files, &bar);
    bar.finish_and_clear();
    let mut failures = 0;
    for outcome in outcomes {
        match outcome {
            Ok(printed) => out.write_all(&printed)?,
            Err(error) => {
                failures += 1;
                eprintln!("dshdb: {}", crate::error_chain_text(&error));
            }
        }
    }
    store.close()?;
    if failures > 0 {
        bail!("{failures} of {} files were not imported", files.len());
    }
    Ok(())
}

/// One line saying what an import dropped and why: the plaintext tail, and the torn zstd
/// frame it ends in.
pub fn print_dropped_tail(tail: &exchange::DroppedTail, out: &mut impl Write) -> Result<()> {
    match &tail.torn_frame {
        Some(frame) => writeln!(
            out,
            "  dropped tail: torn zstd frame of {} bytes at file byte {}; {} bytes of plaintext at offset {} dropped: {}",
            frame.file_bytes, frame.file_offset, tail.bytes, tail.offset, tail.reason
        )?,
        None => writeln!(
            out,
            "  dropped tail: {} bytes at offset {}: {}",
            tail.bytes, tail.offset, tail.reason
        )?,
    }
    Ok(())
}

pub fn export(
    store_path: &Path,
    session: &str,
    format: ExportFormat,
    output: Option<&Path>,
    out: &mut impl Write,
) -> Result<()> {
    if let Some(path) = output {
        crate::above::refuse_output_inside_store(store_path, path)?;
    }
    let store = super::open_read_only(store_path)?;
    if format == ExportFormat::Json {
        return export_canonical(&store, session, output, out);
    }
    // DSH files stream out (one packed row in memory at a time). A file is written beside
    // its destination and renamed into place, so a failed export leaves no partial file.
    let write = |mut writer: &mut dyn Write| -> Result<u64> {
        Ok(match format {
            ExportFormat::DshJsonlZstd => {
                exchange::write_dsh_jsonl_zstd(&store, session, &mut writer)?
            }
            _ => exchange::write_dsh_jsonl(&store, session, &mut writer)?,
        })
    };
    match output {
        // A device or pipe (`-o /dev/null`, `-o /dev/stdout`) is written in place: renaming
        // a partial file over it would replace the device with a regular file.
        Some(path) if is_special_file(path) => {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            let mut buffered = BufWriter::new(file);
            write(&mut buffered)?;
            buffered
                .flush()
                .with_context(|| format!("cannot write {}", path.display()))
        }
        Some(path) => {
            let partial = partial_path(path);
            let written = std::fs::File::create(&partial)
                .with_context(|| format!("cannot create {}", partial.display()))
                .and_then(|file| {
                    let mut buffered = BufWriter::new(file);
                    write(&mut buffered)?;
                    let file = buffered
                        .into_inner()
                        .map_err(|error| error.into_error())
                        .with_context(|| format!("cannot write {}", partial.display()))?;
                    file.sync_all()
                        .with_context(|| format!("cannot sync {}", partial.display()))
                })
                .and_then(|()| {
                    std::fs::rename(&partial, path)
                        .with_context(|| format!("cannot write {}", path.display()))
                });
            if written.is_err() {
                let _ = std::fs::remove_file(&partial);
            }
            written
        }
        None => {
            let mut buffered = BufWriter::new(&mut *out);
            write(&mut buffered)?;
            buffered.flush()?;
            Ok(())
        }
    }
}

/// Whether `path` exists and is neither a regular file nor a directory (a device, a pipe,
/// a socket), following symbolic links.
fn is_special_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|metadata| !metadata.is_file() && !metadata.is_dir())
}

/// Where an export to `path` is written before it is renamed into place.
fn partial_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

/// Streams a canonical export; a progress bar appears once more than 1 MiB was written.
fn export_canonical(
    store: &Store,
    session: &str,
    output: Option<&Path>,
    out: &mut impl Write,
) -> Result<()> {
    let written = Cell::new(0);
    let mut progress = Progress::new(format!("exporting {session}"));
    let mut on_progress = |done: u64, total: u64| {
        if written.get() > PROGRESS_THRESHOLD {
            progress.reveal();
        }
        progress.update(done, total);
    };
    let result = match output {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let mut writer = Counting {
                inner: BufWriter::new(file),
                written: &written,
            };
            exchange::write_canonical(store, session, &mut writer, &mut on_progress)
                .and_then(|()| spill_lines::write_spill_lines(store, session, &mut writer))
                .map_err(anyhow::Error::from)
                .and_then(|_| {
                    writer
                        .flush()
                        .with_context(|| format!("cannot write {}", path.display()))
                })
        }
        None => {
            let mut writer = Counting {
                inner: &mut *out,
                written: &written,
            };
            exchange::write_canonical(store, session, &mut writer, &mut on_progress)
                .and_then(|()| spill_lines::write_spill_lines(store, session, &mut writer))
                .map(|_| ())
                .map_err(anyhow::Error::from)
        }
    };
    progress.finish();
    result
}

pub fn messages(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    // The messages' exact JSON texts: an escape such as `\ud800` stays as in the events.
    let messages = derive::message_texts(&store, session)?;
    // Written piece by piece: joining them first copied the whole array (30 MB for a
    // 1.3M-event session) into fresh memory, a tenth of the command's time.
    out.write_all(b"[")?;
    for (index, message) in messages.iter().enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        out.write_all(message.as_bytes())?;
    }
    out.write_all(b"]\n")?;
    Ok(())
}

pub fn surface(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let surface = derive::surface(&store, session)?;
    writeln!(out, "{}", serde_json::to_string(&surface)?)?;
    Ok(())
}

pub fn repair(store_path: &Path, session: Option<&str>, out: &mut impl Write) -> Result<()> {
    let store = super::open_existing(store_path, false)?;
    let ids: Vec<String> = match session {
        Some(id) => vec![id.to_owned()],
        None => store
            .sessions()
            .into_iter()
            .map(|summary| summary.id)
            .collect(),
    };
    let mut failures = 0;
    for id in &ids {
        match derive::repair(&store, id) {
            Ok(count) => writeln!(out, "{id}: appended {count} closers")?,
            Err(error) => {
                failures += 1;
                eprintln!("dshdb: {id}: {error}");
            }
        }
    }
    store.close()?;
    if failures > 0 {
        bail!("{failures} sessions could not be repaired");
    }
    Ok(())
}

pub fn fork(
    store_path: &Path,
    parent: &str,
    child: &str,
    at: u64,
    out: &mut impl Write,
) -> Result<()> {
    let store = super::open_existing(store_path, false)?;
    drop(store.fork(parent, at, child)?);
    let events = store.session(child)?.events;
    store.close()?;
    writeln!(
        out,
        "forked {child} from {parent} at seq {at} ({events} events)"
    )?;
    Ok(())
}

pub fn info(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let summary = store.session(session)?;
    let events = store.read(session, 0, summary.events)?;
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for event in &events {
        *counts.entry(event.event_type.as_str()).or_default() += 1;
    }
    let header: Value = serde_json::from_str(&summary.header_json).unwrap_or(Value::Null);
    let mut lineage = Vec::new();
    let mut current = header.clone();
    while let Some(parent) = current.get("parentSession").and_then(Value::as_str) {
        let seed = current.get("seedLength").cloned().unwrap_or(Value::Null);
        lineage.push(serde_json::json!({"parent": parent, "seedLength": seed}));
        if lineage.len() > 1000 {
            break;
        }
        current = match store.session(parent) {
            Ok(parent) => serde_json::from_str(&parent.header_json).unwrap_or(Value::Null),
            Err(_) => break,
        };
    }
    let children: Vec<String> = store
        .sessions()
        .into_iter()
        .filter(|other| {
            serde_json::from_str::<Value>(&other.header_json)
                .ok()
                .and_then(|header| header.get("parentSession").cloned())
                .is_some_and(|parent| parent == session)
        })
        .map(|other| other.id)
        .collect();
    let info = serde_json::json!({
        "id": summary.id,
        "header": header,
        "events": summary.events,
        "types": counts,
        "lineage": lineage,
        "children": children,
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&info)?)?;
    Ok(())
}
