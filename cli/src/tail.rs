//! `dshdb tail STORE SESSION [--from N] [--follow] [--json]`: a session's events from seq N
//! on, and with `--follow` every event other processes commit after them, as `tail -f` does.
//!
//! Following opens the store in the shared mode (format-spec/08-many-processes.md) and
//! subscribes: events arrive as they become durable, in order, each once. A store that an
//! exclusive writer holds (or that cannot be opened for the shared mode, e.g. on a read-only
//! file system) is followed by reading a fresh read-only snapshot every
//! [`SNAPSHOT_POLL`] instead.

use anyhow::{Context, Result};
use dshdb::{Error, Event, Options, Store};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// How often a follower without the shared mode reads a new snapshot.
pub const SNAPSHOT_POLL: Duration = Duration::from_millis(200);

/// Prints the events of `session` from `from` on; with `follow`, never returns on success.
pub fn run(
    path: &Path,
    session: &str,
    from: u64,
    follow: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    if !follow {
        let store = crate::open_existing(path, true)?;
        print_from(&store, session, from, json, out)?;
        return Ok(());
    }
    let shared = Options {
        shared: true,
        create_if_missing: false,
        ..Options::default()
    };
    match Store::open(path, shared) {
        Ok(store) => follow_shared(&store, session, from, json, out),
        Err(error @ Error::NotAStore { .. }) => {
            Err(error).with_context(|| format!("cannot open store {}", path.display()))
        }
        // An exclusive writer (or a file system where the shared file cannot be written):
        // follow by snapshots.
        Err(_) => follow_snapshots(path, session, from, json, out),
    }
}

/// Prints what a read of `session` from `from` gives now; returns the next seq to print.
fn print_from(
    store: &Store,
    session: &str,
    from: u64,
    json: bool,
    out: &mut impl Write,
) -> Result<u64> {
    let mut next = from;
    for event in store.read(session, from, u64::MAX)? {
        print_event(&event, json, out)?;
        next = event.seq + 1;
    }
    out.flush()?;
    Ok(next)
}

fn follow_shared(
    store: &Store,
    session: &str,
    from: u64,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    for event in store.subscribe(session, from)? {
        print_event(&event?, json, out)?;
        out.flush()?;
    }
    Ok(())
}

fn follow_snapshots(
    path: &Path,
    session: &str,
    from: u64,
    json: bool,
    out: &mut impl Write,
) -> Result<()> {
    let mut next = from;
    loop {
        let store = crate::open_existing(path, true)?;
        match print_from(&store, session, next, json, out) {
            Ok(after) => next = after,
            // Not created yet: wait for it like for new events.
            Err(error)
                if matches!(
                    error.downcast_ref::<Error>(),
                    Some(Error::UnknownSession { .. })
                ) => {}
            Err(error) => return Err(error),
        }
        drop(store);
        std::thread::sleep(SNAPSHOT_POLL);
    }
}

/// One event: its DSH JSON line, or with `json` an object naming its fields.
fn print_event(event: &Event, json: bool, out: &mut impl Write) -> Result<()> {
    if !json {
        writeln!(out, "{}", event.to_json_line())?;
        return Ok(());
    }
    let data: serde_json::Value =
        serde_json::from_str(&event.data).unwrap_or(serde_json::Value::String(event.data.clone()));
    let object = serde_json::json!({
        "seq": event.seq,
        "type": event.event_type,
        "time": event.time,
        "data": data,
    });
    writeln!(out, "{object}")?;
    Ok(())
}
