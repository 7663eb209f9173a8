//! `dshdb`: the command-line front end of the dshdb storage engine.

mod above;
mod exchange;
#[cfg(test)]
mod help_texts;
mod input;
mod quickstart;
mod sqlite_import;
mod tail;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use dshdb::spill::{locators_in, BlobHash, SpillStore};
use dshdb::storage::run::run_path;
use dshdb::storage::segment::segment_path;
use dshdb::store::MANIFEST;
use dshdb::{Durability, Error, Options, SessionWriter, Store};
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code of a command that finds the store damaged (`verify` and the others).
const EXIT_CORRUPT: u8 = 3;
/// Events read per call while streaming a session out.
const READ_CHUNK: u64 = 4096;

#[derive(Parser)]
#[command(
    name = "dshdb",
    version,
    about = "Embedded storage engine for AI-agent session logs (DSH model)"
)]
struct Cli {
    /// Do not show progress bars on stderr.
    #[arg(long, short = 'q', global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a store in DIR, write a few demo agent sessions, reopen it and print them.
    Quickstart {
        /// Store directory (created if missing; an existing store gets new sessions).
        dir: PathBuf,
    },
    /// Create an empty store.
    Init {
        /// Store directory (created if missing; must not already hold a store).
        store: PathBuf,
    },
    /// Append events read from stdin, one JSON object per line:
    /// {"type":..,"data":..,"time"?:..,"surfaceOp"?:..,"sourceEventSeqs"?:..,"ignorable"?:..}
    Append {
        /// Store directory (must hold a store unless --create).
        store: PathBuf,
        /// Session to append to.
        session: String,
        /// Create the store and the session (with a minimal header) if missing.
        #[arg(long)]
        create: bool,
        /// When an append counts as done.
        #[arg(long, value_enum, default_value_t = DurabilityArg::Sync)]
        durability: DurabilityArg,
        /// Print `durable <seq>` on stdout as each event becomes durable.
        #[arg(long)]
        ack: bool,
    },
    /// Print a session's events as DSH JSON lines.
    Events {
        /// Store directory.
        store: PathBuf,
        /// Session to print.
        session: String,
        /// First seq to print (inclusive).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Seq to stop at (exclusive); default: the end of the session.
        #[arg(long)]
        to: Option<u64>,
        /// Print only events of this type.
        #[arg(long = "type", value_name = "TYPE")]
        event_type: Option<String>,
        /// Print one JSON array instead of JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List sessions with their event counts.
    Ls {
        /// Store directory.
        store: PathBuf,
        /// Print a JSON array of {"id","events","header"}.
        #[arg(long)]
        json: bool,
    },
    /// Check every segment of a store (read-only). Exit 0 when readable, 3 on corruption.
    Verify {
        /// Store directory.
        store: PathBuf,
    },
    /// Import DSH session logs (`.jsonl` / `.jsonl.zstd` files or DSH sessions directories)
    /// or dshdb-json files (`export --format json`; recognized by their first line).
    Import {
        /// Store directory (created if missing).
        store: PathBuf,
        /// DSH session logs (`session.jsonl`, `session.jsonl.zstd`), DSH sessions
        /// directories, or dshdb-json files.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Export a session as a DSH session log (byte-identical for imported logs) or as
    /// dshdb's canonical, versioned JSONL (`--format json`).
    Export {
        /// Store directory.
        store: PathBuf,
        /// Session to export.
        session: String,
        /// Output format: a DSH session log, zstd-framed or plain, or dshdb's canonical JSONL.
        #[arg(long, value_enum, default_value_t = exchange::ExportFormat::DshJsonl)]
        format: exchange::ExportFormat,
        /// Write to FILE instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Print DSH's derived model messages of a session (JSON array).
    Messages {
        /// Store directory.
        store: PathBuf,
        /// Session to derive the messages of.
        session: String,
    },
    /// Print the DSH surface of a session (JSON).
    Surface {
        /// Store directory.
        store: PathBuf,
        /// Session to print the surface of.
        session: String,
    },
    /// Append DSH's interrupted-turn closers to one session or to every session.
    Repair {
        /// Store directory.
        store: PathBuf,
        /// Session to repair (default: every session of the store).
        session: Option<String>,
    },
    /// Fork PARENT into CHILD sharing the events up to and including seq --at.
    Fork {
        /// Store directory.
        store: PathBuf,
        /// Session to fork.
        parent: String,
        /// Id of the new session.
        child: String,
        /// Last seq of PARENT that CHILD shares (inclusive).
        #[arg(long)]
        at: u64,
    },
    /// Print a session's header, event counts by type and lineage (JSON).
    Info {
        /// Store directory.
        store: PathBuf,
        /// Session to describe.
        session: String,
    },
    /// Rewrite every sealed write-ahead segment into compressed run files and checkpoint
    /// the seq index (what the background maintenance does).
    Maintain {
        /// Store directory.
        store: PathBuf,
    },
    /// Delete a session (durable tombstone). Its space is reclaimed by the next `maintain`,
    /// except the prefix a live fork still reads.
    #[command(alias = "delete")]
    Rm {
        /// Store directory.
        store: PathBuf,
        /// Session to delete.
        session: String,
    },
    /// Print events, bytes on disk, compression ratio, runs and segments of the store or of
    /// one session.
    Stats {
        /// Store directory.
        store: PathBuf,
        /// Give the figures of this session only (default: the whole store).
        session: Option<String>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print a session's events from seq --from on as DSH JSON lines; with --follow keep
    /// printing what writers (other processes too) commit after them, like `tail -f`.
    Tail {
        /// Store directory.
        store: PathBuf,
        /// Session to print.
        session: String,
        /// First seq to print (inclusive).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Keep waiting for new durable events (stop with Ctrl-C).
        #[arg(long, short = 'f')]
        follow: bool,
        /// Print one JSON object per event: {"seq","type","time","data"}.
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Above(above::AboveCommand),
    /// Run one fleet node (issue #17): the local store in STORE as the hot tier, the commit
    /// tail and coordination on NATS JetStream, sealed runs on S3, all configured by the
    /// DSHDB_FLEET_* variables (`tests/fleet/servers.sh env` prints them). Serves a JSON-lines
    /// request protocol on LISTEN until killed (see fleet/src/serve.rs).
    FleetNode {
        /// Node id, unique in the fleet.
        #[arg(long)]
        id: String,
        /// Loopback address of the request protocol, e.g. 127.0.0.1:14500.
        #[arg(long)]
        listen: String,
        /// Local store directory (created if missing).
        #[arg(long)]
        store: PathBuf,
        /// Lease TTL in milliseconds (the DSH_NODES bucket keeps the TTL of its creation).
        #[arg(long, default_value_t = 10_000)]
        ttl_ms: u64,
        /// Pause between lease refreshes and takeover rounds, in milliseconds.
        #[arg(long, default_value_t = 2_000)]
        tick_ms: u64,
        /// Virtual shards of the fleet (fixed at fleet creation).
        #[arg(long, default_value_t = dshdb_fleet::shard::SHARD_COUNT)]
        shards: u32,
        /// When appends are acknowledged: replicated (local fsync + JetStream ack), local
        /// (local fsync; shipped in the background), sealed (local fsync; only sealed runs
        /// leave the node). Default: DSHDB_FLEET_MODE, else replicated.
        #[arg(long)]
        mode: Option<String>,
        /// In replicated mode: ack locally for a tail stream whose publishes stalled this
        /// long (ms), and ship the backlog in the background. Default:
        /// DSHDB_FLEET_DEGRADE_TO_LOCAL_AFTER_MS, else off.
        #[arg(long)]
        degrade_to_local_after_ms: Option<u64>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// Each append returns once it is on stable storage.
    Sync,
    /// Appends are synced in groups (within 5 ms or 1 MiB); flushed at the end.
    Batched,
    /// Appends reach the OS at once and are synced at the end.
    Buffered,
}

impl DurabilityArg {
    fn durability(self) -> Durability {
        match self {
            DurabilityArg::Sync => Durability::Sync,
            DurabilityArg::Batched => Options::batched(),
            DurabilityArg::Buffered => Durability::Buffered,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exchange::set_quiet(cli.quiet);
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = run(cli.command, &mut out).and_then(|code| {
        out.flush()?;
        Ok(code)
    });
    match result {
        Ok(code) => code,
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = out.flush();
            eprintln!("dshdb: error: {}", error_chain_text(&error));
            match damaged_store(&error) {
                Some(store) => {
                    eprintln!(
                        "dshdb: the store is damaged; writable commands refuse to build on \
                         damage they find. `dshdb verify {}` says where and what can be done.",
                        store.display()
                    );
                    // Damage is its own exit code for every command, as for `verify`.
                    ExitCode::from(EXIT_CORRUPT)
                }
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message
/// before it already holds (an I/O error wrapped by an error that prints its source would
/// otherwise read `Read-only file system (os error 30): Read-only file system (os error 30)`).
pub(crate) fn error_chain_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if !previous.is_empty() && previous.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
        previous = message;
    }
    text
}

/// The store `error` found damaged: its chain holds an engine corruption error of the log
/// (not of a spill blob) and the "cannot open store PATH" context of the command.
fn damaged_store(error: &anyhow::Error) -> Option<PathBuf> {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<Error>())
        .filter(|engine| engine.is_corruption() && !matches!(engine, Error::Spill { .. }))?;
    error.chain().find_map(|cause| {
        cause
            .to_string()
            .strip_prefix("cannot open store ")
            .map(PathBuf::from)
    })
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run(command: Command, out: &mut impl Write) -> Result<ExitCode> {
    match command {
        Command::Quickstart { dir } => quickstart::run(&dir, out)?,
        Command::Init { store } => init(&store, out)?,
        Command::Append {
            store,
            session,
            create,
            durability,
            ack,
        } => append(&store, &session, create, durability.durability(), ack, out)?,
        Command::Events {
            store,
            session,
            from,
            to,
            event_type,
            json,
        } => events(&store, &session, from, to, event_type.as_deref(), json, out)?,
        Command::Ls { store, json } => ls(&store, json, out)?,
        Command::Verify { store } => return verify(&store, out),
        Command::Import { store, paths } => exchange::import(&store, &paths, out)?,
        Command::Export {
            store,
            session,
            format,
            output,
        } => exchange::export(&store, &session, format, output.as_deref(), out)?,
        Command::Messages { store, session } => exchange::messages(&store, &session, out)?,
        Command::Surface { store, session } => exchange::surface(&store, &session, out)?,
        Command::Repair { store, session } => exchange::repair(&store, session.as_deref(), out)?,
        Command::Fork {
            store,
            parent,
            child,
            at,
        } => exchange::fork(&store, &parent, &child, at, out)?,
        Command::Info { store, session } => exchange::info(&store, &session, out)?,
        Command::Maintain { store } => maintain(&store, out)?,
        Command::Rm { store, session } => remove_session(&store, &session, out)?,
        Command::Stats {
            store,
            session,
            json,
        } => stats(&store, session.as_deref(), json, out)?,
        Command::Tail {
            store,
            session,
            from,
            follow,
            json,
        } => tail::run(&store, &session, from, follow, json, out)?,
        Command::Above(command) => above::run(command, out)?,
        Command::FleetNode {
            id,
            listen,
            store,
            ttl_ms,
            tick_ms,
            shards,
            mode,
            degrade_to_local_after_ms,
        } => fleet_node(
            &id,
            &listen,
            store,
            (ttl_ms, tick_ms, shards),
            mode.as_deref(),
            degrade_to_local_after_ms,
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

fn fleet_node(
    id: &str,
    listen: &str,
    store: PathBuf,
    (ttl_ms, tick_ms, shards): (u64, u64, u32),
    mode: Option<&str>,
    degrade_to_local_after_ms: Option<u64>,
) -> Result<()> {
    let mut config = dshdb_fleet::serve::config_from_env(
        id,
        listen,
        store,
        std::time::Duration::from_millis(ttl_ms),
        std::time::Duration::from_millis(tick_ms),
        shards,
    )?;
    if let Some(mode) = mode {
        config.mode = mode.parse()?;
    }
    if degrade_to_local_after_ms.is_some() {
        config.degrade_to_local_after_ms = degrade_to_local_after_ms;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime
        .block_on(dshdb_fleet::serve::run(config))
        .with_context(|| format!("fleet node {id}"))?;
    Ok(())
}

fn maintain(path: &Path, out: &mut impl Write) -> Result<()> {
    let store = open_existing(path, false)?;
    let report = store.maintain().context("maintenance failed")?;
    store.close().context("closing the store")?;
    let ratio = if report.run_bytes > 0 {
        report.raw_bytes as f64 / report.run_bytes as f64
    } else {
        0.0
    };
    writeln!(
        out,
        "sealed {} segments into runs: {} events, {} bytes -> {} bytes (ratio {ratio:.2})",
        report.segments_sealed, report.events, report.raw_bytes, report.run_bytes
    )?;
    if report.events_dropped > 0 {
        writeln!(
            out,
            "reclaimed {} bytes: {} events of deleted sessions dropped ({} runs rewritten)",
            report.bytes_reclaimed, report.events_dropped, report.runs_rewritten
        )?;
    }
    Ok(())
}

fn remove_session(path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = open_existing(path, false)?;
    store
        .delete_session(session)
        .with_context(|| format!("cannot delete session {session}"))?;
    store.close().context("closing the store")?;
    writeln!(
        out,
        "deleted {session}; its space is reclaimed by the next maintain"
    )?;
    Ok(())
}

fn stats(path: &Path, session: Option<&str>, json: bool, out: &mut impl Write) -> Result<()> {
    let store = open_read_only(path)?;
    let stats = store
        .stats(session)
        .with_context(|| format!("cannot compute stats of {}", path.display()))?;
    if json {
        let value = serde_json::json!({
            "session": session,
            "sessions": stats.sessions,
            "events": stats.events,
            "events_in_runs": stats.events_in_runs,
            "events_in_segments": stats.events_in_segments,
            "bytes_on_disk": stats.bytes_on_disk,
            "raw_bytes": stats.raw_bytes,
            "run_compression_ratio": stats.run_compression_ratio,
            "runs": stats.runs,
            "segments": stats.segments,
            "maintenance_failures": stats.maintenance_failures,
            "last_maintenance_failure": stats.last_maintenance_failure,
        });
        writeln!(out, "{value}")?;
        return Ok(());
    }
    if let Some(session) = session {
        writeln!(out, "session {session}")?;
    } else {
        writeln!(out, "store {}", path.display())?;
        writeln!(out, "sessions: {}", stats.sessions)?;
    }
    writeln!(
        out,
        "events: {} ({} in runs, {} in segments)",
        stats.events, stats.events_in_runs, stats.events_in_segments
    )?;
    writeln!(out, "bytes on disk: {}", stats.bytes_on_disk)?;
    writeln!(out, "raw frame bytes: {}", stats.raw_bytes)?;
    writeln!(
        out,
        "run compression ratio: {:.2}",
        stats.run_compression_ratio
    )?;
    writeln!(out, "runs: {}", stats.runs)?;
    writeln!(out, "segments: {}", stats.segments)?;
    writeln!(
        out,
        "background maintenance failures in this process: {}",
        stats.maintenance_failures
    )?;
    if let Some(failure) = &stats.last_maintenance_failure {
        writeln!(out, "last background maintenance failure: {failure}")?;
    }
    Ok(())
}

fn read_only_options() -> Options {
    Options {
        read_only: true,
        create_if_missing: false,
        ..Options::default()
    }
}

fn open_read_only(path: &Path) -> Result<Store> {
    open_existing(path, true)
}

/// Opens a store that must already exist (`read_only` or as its writer).
pub(crate) fn open_existing(path: &Path, read_only: bool) -> Result<Store> {
    let options = Options {
        read_only,
        ..read_only_options()
    };
    Store::open(path, options).with_context(|| format!("cannot open store {}", path.display()))
}

fn init(path: &Path, out: &mut impl Write) -> Result<()> {
    if path.join(MANIFEST).exists() {
        return Err(Error::AlreadyExists {
            path: path.to_path_buf(),
        }
        .into());
    }
    let store = match Store::open(path, Options::default()) {
        Ok(store) => store,
        // With creation allowed, "no store" can only mean a folder holding other things.
        Err(Error::NotAStore { .. }) => bail!(
            "cannot create store {}: the folder is not empty and holds no dshdb store \
             (init needs a new or empty folder)",
            path.display()
        ),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot create store {}", path.display()))
        }
    };
    store.close()?;
    writeln!(out, "created store {}", path.display())?;
    Ok(())
}

fn append(
    path: &Path,
    session: &str,
    create: bool,
    durability: Durability,
    ack: bool,
    out: &mut impl Write,
) -> Result<()> {
    let options = Options {
        create_if_missing: create,
        durability,
        ..Options::default()
    };
    let store = Store::open(path, options)
        .with_context(|| format!("cannot open store {}", path.display()))?;
    let outcome = append_lines(&store, session, create, durability, ack, out);
    let closed = store.close().context("closing the store");
    outcome.and(closed)
}

fn open_writer(store: &Store, session: &str, create: bool) -> Result<SessionWriter> {
    match store.writer(session) {
        Ok(writer) => Ok(writer),
        Err(Error::UnknownSession { .. }) if create => store
            .create_session_with_id(session)
            .with_context(|| format!("cannot create session {session:?}")),
        Err(Error::UnknownSession { .. }) => {
            bail!("session {session:?} does not exist (use --create to create it)")
        }
        Err(error) => Err(error).with_context(|| format!("cannot write session {session:?}")),
    }
}

fn append_lines(
    store: &Store,
    session: &str,
    create: bool,
    durability: Durability,
    ack: bool,
    out: &mut impl Write,
) -> Result<()> {
    let mut writer = open_writer(store, session, create)?;
    writer.set_durability(durability);
    let mut next_seq = store.session(session)?.events;
    let mut surface =
        input::current_surface(store, session).map_err(|reason| anyhow::anyhow!(reason))?;
    // Seqs appended but not yet reported durable.
    let first_unacked = next_seq;
    let mut acked_to = next_seq;
    let stdin = std::io::stdin();
    let mut stdin = stdin.lock();
    let mut failure = None;
    for number in 1.. {
        let line = match input::read_line(&mut stdin, input::MAX_INPUT_LINE_BYTES) {
            Ok(input::InputLine::Line(line)) => line,
            Ok(input::InputLine::End) => break,
            Err(reason) => {
                failure = Some(anyhow::anyhow!("line {number}: {reason}"));
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let event = match input::parse_line(&line) {
            Ok(event) => event,
            Err(reason) => {
                failure = Some(anyhow::anyhow!("line {number}: {reason}"));
                break;
            }
        };
        if let Some(seq) = event.seq {
            if seq != next_seq {
                failure = Some(anyhow::anyhow!(
                    "line {number}: \"seq\" is {seq} but the event would get seq {next_seq}"
                ));
                break;
            }
        }
        let checked = input::check_readable_by_session_views(&event, next_seq).and_then(|parsed| {
            // DSH's surface rules across events: a replace must name current nodes, ...
            surface.apply(&parsed).map(|_| ()).map_err(|error| {
                format!("the session views could not read this event back: {error}")
            })
        });
        if let Err(reason) = checked {
            failure = Some(anyhow::anyhow!("line {number}: {reason}"));
            break;
        }
        match writer.append(event.as_new_event()) {
            Ok(receipt) => {
                next_seq = receipt.end_seq;
                if ack && receipt.durable {
                    for seq in acked_to..receipt.end_seq {
                        writeln!(out, "durable {seq}")?;
                    }
                    out.flush()?;
                    acked_to = receipt.end_seq;
                }
            }
            Err(error) => {
                failure = Some(anyhow::Error::new(error).context(format!(
                    "line {number}: event of type {:?} not appended",
                    event.event_type
                )));
                break;
            }
        }
    }
    // Whatever was appended before a bad line stays, made durable.
    let flushed = if next_seq > first_unacked {
        store.flush().map_err(anyhow::Error::new).and_then(|()| {
            if ack {
                for seq in acked_to..next_seq {
                    writeln!(out, "durable {seq}")?;
                }
                out.flush()?;
            }
            Ok(())
        })
    } else {
        Ok(())
    };
    match (failure, flushed) {
        (None, flushed) => flushed.context("flushing the appended events"),
        (Some(error), Ok(())) => Err(error),
        (Some(error), Err(flush_error)) => Err(anyhow::anyhow!(
            "{}; flushing the events before it failed too: {}",
            error_chain_text(&error),
            error_chain_text(&flush_error)
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn events(
    path: &Path,
    session: &str,
    from: u64,
    to: Option<u64>,
    event_type: Option<&str>,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let store = open_read_only(path)?;
    let length = store.session(session)?.events;
    let end = to.unwrap_or(length).min(length);
    let mut first = true;
    if json {
        write!(out, "[")?;
    }
    let mut start = from.min(end);
    while start < end {
        let stop = end.min(start.saturating_add(READ_CHUNK));
        for event in store.read(session, start, stop)? {
            if event_type.is_some_and(|wanted| wanted != event.event_type) {
                continue;
            }
            let line = event.to_json_line();
            if json {
                if !first {
                    write!(out, ",")?;
                }
                write!(out, "\n{line}")?;
            } else {
                writeln!(out, "{line}")?;
            }
            first = false;
        }
        start = stop;
    }
    if json {
        writeln!(out, "{}]", if first { "" } else { "\n" })?;
    }
    if first {
        out.flush()?;
        eprintln!(
            "dshdb: {}",
            no_events_reason(session, length, from, to, event_type)
        );
    }
    Ok(())
}

/// Why `events` printed nothing, for stderr: an empty result must not look like a failure.
fn no_events_reason(
    session: &str,
    length: u64,
    from: u64,
    to: Option<u64>,
    event_type: Option<&str>,
) -> String {
    let end = to.unwrap_or(length).min(length);
    if length == 0 {
        return format!("no events: session {session:?} has none");
    }
    if from >= end {
        return match to {
            Some(to) if to <= from => {
                format!("no events: --from {from} is not below --to {to} (--to is exclusive)")
            }
            _ => format!("no events: session {session:?} has {length} events (seqs 0..{length}); --from {from} is past its end"),
        };
    }
    match event_type {
        Some(wanted) => format!(
            "no events of type {wanted:?} in session {session:?} between seq {from} and {end} (exclusive)"
        ),
        None => format!("no events in session {session:?} between seq {from} and {end}"),
    }
}

fn ls(path: &Path, json: bool, out: &mut impl Write) -> Result<()> {
    let store = open_read_only(path)?;
    let sessions = store.sessions();
    if json {
        let items: Vec<String> = sessions
            .iter()
            .map(|session| {
                format!(
                    "{{\"id\":{},\"events\":{},\"header\":{}}}",
                    serde_json::Value::String(session.id.clone()),
                    session.events,
                    session.header_json
                )
            })
            .collect();
        writeln!(out, "[{}]", items.join(","))?;
        return Ok(());
    }
    if sessions.is_empty() {
        writeln!(out, "no sessions")?;
        return Ok(());
    }
    let width = sessions
        .iter()
        .map(|session| session.id.chars().count())
        .max()
        .unwrap_or(0)
        .max("SESSION".len());
    writeln!(out, "{:<width$}  EVENTS", "SESSION")?;
    for session in &sessions {
        writeln!(out, "{:<width$}  {:>6}", session.id, session.events)?;
    }
    Ok(())
}

/// The file a corruption error names, relative to the store (a segment or run id is
/// looked up among the store's files).
fn damaged_file(path: &Path, error: &Error) -> Option<String> {
    match error {
        Error::CorruptFile { file, .. } | Error::UnsupportedVersion { file, .. } => {
            Some(file.clone())
        }
        Error::Corrupt { segment: id, .. } | Error::UnknownRecordKind { segment: id, .. } => {
            [segment_path(*id), run_path(*id)]
                .into_iter()
                .find(|file| path.join(file).exists())
        }
        _ => None,
    }
}

/// What a user of a damaged store can do, after `verify` found `error`: whether writable
/// opens are refused (they check what they build on, F-05-12) or still work, and how to
/// get the undamaged sessions out.
fn damage_advice(path: &Path, error: &Error) -> String {
    let file = damaged_file(path, error)
        .map(|file| format!("the damage is in {}. ", path.join(file).display()))
        .unwrap_or_default();
    let writable = match Store::check_writable_open(path) {
        Err(refusal) if refusal.is_corruption() => {
            "Writable opens of this store are refused (append, import, maintain, rm, fork, \
             repair), so nothing is built on the damage."
        }
        _ => {
            "Writable opens still work (they do not read that file), but a writer that reads \
             the damage refuses every later write."
        }
    };
    format!(
        "{file}{writable} Read-only commands (ls, events, export) still read the sessions \
         the damage does not touch: export them and import them into a new store, or \
         restore the damaged file from a backup. (`dshdb repair` closes interrupted DSH \
         sessions; it does not mend damaged files.)"
    )
}

fn verify(path: &Path, out: &mut impl Write) -> Result<ExitCode> {
    let corrupt = |error: Error, out: &mut dyn Write| -> Result<ExitCode> {
        out.flush()?;
        eprintln!("dshdb: CORRUPT: store {}: {error}", path.display());
        eprintln!("dshdb: {}", damage_advice(path, &error));
        Ok(ExitCode::from(EXIT_CORRUPT))
    };
    // Decode every run and segment instead of trusting the seq-index checkpoint.
    let options = Options {
        use_checkpoint: false,
        ..read_only_options()
    };
    let store = match Store::open(path, options) {
        Ok(store) => store,
        Err(error) if error.is_corruption() => return corrupt(error, out),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot open store {}", path.display()))
        }
    };
    // Recovery checked every frame; reading every event back checks the index as well.
    let sessions = store.sessions();
    // Every spill blob a session cites, and the first session citing it.
    let mut cited: BTreeMap<BlobHash, String> = BTreeMap::new();
    for session in &sessions {
        let mut start = 0;
        while start < session.events {
            let stop = session.events.min(start + READ_CHUNK);
            match store.read(&session.id, start, stop) {
                Ok(events) => {
                    for event in &events {
                        for hash in locators_in(&event.data)
                            .into_iter()
                            .chain(locators_in(&event.envelope))
                        {
                            cited.entry(hash).or_insert_with(|| session.id.clone());
                        }
                    }
                }
                Err(error) if error.is_corruption() => return corrupt(error, out),
                Err(error) => {
                    return Err(error).with_context(|| format!("reading session {:?}", session.id))
                }
            }
            start = stop;
        }
    }
    // A cited blob must exist and hold what its hash names.
    let spill = SpillStore::new_read_only(store.storage());
    for (hash, session) in &cited {
        match spill.get(hash) {
            Ok(_) => {}
            Err(error) if error.is_corruption() => {
                out.flush()?;
                eprintln!(
                    "dshdb: CORRUPT: store {}: session {session:?} cites {}: {error}",
                    path.display(),
                    hash.locator()
                );
                return Ok(ExitCode::from(EXIT_CORRUPT));
            }
            Err(error) => {
                return Err(error).with_context(|| format!("reading spill blob {}", hash.locator()))
            }
        }
    }
    // Every file decodes; the next writable open also checks them against the checkpoint
    // (F-05-12): say what it will do, or refuse.
    let writable = match Store::check_writable_open(path) {
        Ok(report) => report,
        Err(error) if error.is_corruption() => return corrupt(error, out),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot check store {}", path.display()))
        }
    };
    let report = store.recovery_report();
    writeln!(out, "store {}: ok", path.display())?;
    writeln!(out, "runs decoded: {}", report.runs_replayed)?;
    writeln!(out, "segments scanned: {}", report.segments_scanned)?;
    writeln!(out, "events: {}", report.events)?;
    writeln!(out, "batches: {}", report.batches)?;
    writeln!(out, "sessions: {}", sessions.len())?;
    writeln!(out, "spill blobs cited and checked: {}", cited.len())?;
    if let Some(tail) = &report.torn_tail {
        writeln!(
            out,
            "torn tail: segment {} offset {}: {} bytes of an unfinished write, {} events of incomplete batches dropped ({})",
            tail.segment, tail.offset, tail.bytes, tail.dropped_events, tail.reason
        )?;
        writeln!(
            out,
            "(an interrupted write; the next writable open discards it)"
        )?;
    }
    if writable.checkpoint_distrusted {
        let reason = writable.checkpoint_ignored.as_deref().unwrap_or("");
        writeln!(out, "torn seal: {reason}")?;
        writeln!(
            out,
            "(the next writable open repairs the torn seal as after a crash and removes the stale index/checkpoint)"
        )?;
    }
    for orphan in &report.orphan_segments {
        writeln!(
            out,
            "orphan segment {orphan} (not in the manifest; removed by the next writable open)"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
