//! Profiling aid for the cold-resume benchmark: builds (once) a store holding the generated
//! 1.3M-event session at `DIR/store` and its DSH `session.jsonl.zstd`, then times the phases
//! of a cold resume. `resume_phases DIR [EVENTS]`. One path alone (for `perf` or
//! `valgrind --tool=callgrind`): `TEXTS_ONLY=1` (`messages`), `STREAM_ONLY=1`
//! (`cold::stream_messages`), `FULL_ONLY=1` (`messages_full`), `READ_ONLY=1` (the chunked
//! `Store::read` alone); `MAINTAIN=1` seals the store into runs first.

use anyhow::{Context, Result};
use dshdb::store::{Options, Store};
use dshdb::{derive, exchange};
use dshdb_benches::baselines::dsh_frame;
use dshdb_benches::workload::{session_jsonl, SESSION_JSONL_ID};
use std::path::Path;
use std::time::Instant;

/// Events in the generated session, as in `compare`'s cold-resume section.
const DEFAULT_EVENTS: usize = 1_300_000;

/// Lines per zstd frame, as in `compare` (about one 200 ms write-behind batch).
const LINES_PER_FRAME: usize = 16;

/// The DSH `session.jsonl.zstd` of `jsonl`: the header frame, then `LINES_PER_FRAME` lines a frame.
fn dsh_zstd(jsonl: &[u8]) -> Result<Vec<u8>> {
    let mut lines = jsonl.split_inclusive(|&byte| byte == b'\n');
    let mut out = dsh_frame(lines.next().context("header line")?)?;
    let rest: Vec<&[u8]> = lines.collect();
    for frame in rest.chunks(LINES_PER_FRAME) {
        out.extend(dsh_frame(&frame.concat())?);
    }
    Ok(out)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().context("usage: resume_phases DIR [EVENTS]")?;
    let events: usize = args
        .next()
        .map_or(Ok(DEFAULT_EVENTS), |text| text.parse())?;
    let store_path = Path::new(&dir).join("store");
    if !store_path.exists() {
        let jsonl = session_jsonl(0x5E55_10E5, events);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            Path::new(&dir).join("session.jsonl.zstd"),
            dsh_zstd(&jsonl)?,
        )?;
        let store = Store::open(&store_path, Options::default())?;
        exchange::import_dsh_jsonl(&store, &jsonl)?;
        store.close()?;
        eprintln!("built {}", store_path.display());
    }
    if std::env::var_os("MAINTAIN").is_some() {
        let store = Store::open(&store_path, Options::default())?;
        let report = store.maintain()?;
        store.close()?;
        eprintln!("maintain: {report:?}");
    }
    let started = Instant::now();
    let read_only = Options {
        read_only: true,
        ..Options::default()
    };
    let store = Store::open(&store_path, read_only)?;
    if std::env::var_os("READ_ONLY").is_some() {
        let length = store.session(SESSION_JSONL_ID)?.events;
        let mut from = 0;
        let mut bytes = 0;
        while from < length {
            let to = length.min(from + derive::cold::READ_CHUNK_EVENTS);
            for event in store.read(SESSION_JSONL_ID, from, to)? {
                bytes += event.data.len();
            }
            from = to;
        }
        println!(
            "chunked Store::read {:?} ({bytes} data bytes)",
            started.elapsed()
        );
        return Ok(());
    }
    if std::env::var_os("FULL_ONLY").is_some() {
        let messages = derive::messages_full(&store, SESSION_JSONL_ID)?;
        println!(
            "open + messages_full {:?} ({} messages)",
            started.elapsed(),
            messages.len()
        );
        return Ok(());
    }
    if std::env::var_os("TEXTS_ONLY").is_some() {
        let texts = derive::message_texts(&store, SESSION_JSONL_ID)?;
        println!(
            "open + messages (texts) {:?} ({} messages)",
            started.elapsed(),
            texts.len()
        );
        return Ok(());
    }
    let streamed = derive::cold::stream_messages(&store, SESSION_JSONL_ID)?;
    let streamed_time = started.elapsed();
    let derive::cold::Streamed::Messages(streamed) = streamed else {
        anyhow::bail!("stream fell back: {streamed:?}");
    };
    println!(
        "open + stream_messages {streamed_time:?} ({} messages)",
        streamed.len()
    );
    drop(store);
    if std::env::var_os("STREAM_ONLY").is_some() {
        return Ok(());
    }
    let started = Instant::now();
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    let store = Store::open(&store_path, options)?;
    let opened = started.elapsed();
    let phase = Instant::now();
    let summary = store.session(SESSION_JSONL_ID)?;
    let stored = store.read(SESSION_JSONL_ID, 0, summary.events)?;
    let read = phase.elapsed();
    drop(stored);
    let phase = Instant::now();
    let session_events = exchange::session_events(&store, SESSION_JSONL_ID)?;
    let decoded = phase.elapsed();
    let phase = Instant::now();
    let restored = dshdb::session::restore_session(SESSION_JSONL_ID, &session_events, 0)?;
    let restore = phase.elapsed();
    let phase = Instant::now();
    let messages = restored.surface.derive_messages();
    let derive = phase.elapsed();
    println!(
        "open {:?} | read Events {:?} | read+render+decode SessionEvents {:?} | restore {:?} | derive {:?} ({} messages)",
        opened,
        read,
        decoded,
        restore,
        derive,
        messages.len()
    );
    anyhow::ensure!(
        messages == streamed,
        "streamed messages differ from the full load's"
    );
    Ok(())
}
