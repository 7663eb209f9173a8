//! Plain DSH JSONL export on several cores: the session is cut into parts of
//! [`EXPORT_PART_EVENTS`] seqs, worker threads render parts into buffers
//! ([`visit_dsh_part`], which moves a cut to the next line start), and the calling thread
//! writes the buffers in seq order. A single-threaded export of DSH's packed layout spends
//! its time reading write-ahead frames (checksums, UTF-8 checks) and rendering rows member by
//! member; on two free cores the parts run side by side, byte for byte the same output.
//!
//! Memory stays bounded: a worker takes one of [`PARTS_IN_FLIGHT_PER_WORKER`] buffers per
//! worker before it takes a part, and it comes back once the part is written, so at most
//! that many parts are held.

use super::dsh_lines::visit_dsh_part;
use super::{ExchangeError, Result};
use crate::store::ReadScan;
use crate::Store;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

/// Seqs per part: about 1.8 MB of DSH-layout JSONL (54 bytes an event on the benchmark's
/// packed session), large enough that a part's cut (one short read past its end) costs
/// little, small enough that a few parts in flight stay a few MB.
pub(crate) const EXPORT_PART_EVENTS: u64 = 32_768;

/// Most render threads an export starts, whatever the machine offers: past this the
/// writing thread and the disk are the bound.
const MAX_EXPORT_WORKERS: usize = 4;

/// Buffers (parts rendered or being rendered) per worker.
const PARTS_IN_FLIGHT_PER_WORKER: usize = 2;

/// The render threads an export of `events` events uses: `None` for one walk on the
/// calling thread (a single core, or a session of fewer than two parts).
pub(crate) fn export_workers(events: u64) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let workers = cores.min(MAX_EXPORT_WORKERS);
    (workers > 1 && events >= 2 * EXPORT_PART_EVENTS).then_some(workers)
}

/// How a session is cut: its events, the seqs per part and the number of parts.
#[derive(Debug, Clone, Copy)]
struct Plan {
    events: u64,
    part_events: u64,
    parts: u64,
}

/// One rendered part, or why it could not be.
type Rendered = (u64, Result<Vec<u8>>);

/// Writes the lines of the session's `events` events to `out` (the header is the
/// caller's), rendered by `workers` threads in parts of `part_events` seqs; returns the
/// bytes written. The first error in
/// seq order is the one returned, as a single walk would.
pub(crate) fn write_lines_in_parts(
    store: &Store,
    id: &str,
    (events, part_events): (u64, u64),
    workers: usize,
    out: &mut impl Write,
) -> Result<u64> {
    let part_events = part_events.max(1);
    let parts = events.div_ceil(part_events);
    let next_part = AtomicU64::new(0);
    let (free, free_buffers) = channel::<Vec<u8>>();
    for _ in 0..workers * PARTS_IN_FLIGHT_PER_WORKER {
        // The receiver is alive: it is in this scope.
        let _ = free.send(Vec::new());
    }
    let free_buffers = Mutex::new(free_buffers);
    let (done, rendered) = channel::<Rendered>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let done = done.clone();
            let (free_buffers, next_part) = (&free_buffers, &next_part);
            let plan = Plan {
                events,
                part_events,
                parts,
            };
            scope.spawn(move || render_parts(store, id, plan, free_buffers, next_part, done));
        }
        drop(done);
        let written = write_in_order(parts, &rendered, &free, out);
        // A failed write leaves the parts not yet taken to no one, and wakes the workers
        // waiting for a buffer (they end).
        next_part.store(parts, Ordering::Relaxed);
        drop(free);
        written
    })
}

/// A worker: takes a free buffer, then the next part, renders it and hands it over, until
/// no part or no buffer is left.
fn render_parts(
    store: &Store,
    id: &str,
    Plan {
        events,
        part_events,
        parts,
    }: Plan,
    free_buffers: &Mutex<Receiver<Vec<u8>>>,
    next_part: &AtomicU64,
    done: Sender<Rendered>,
) {
    // The parts keep both cores busy: no read-ahead thread besides, and one block buffer
    // carried from part to part.
    let mut scan = ReadScan::on_this_thread();
    loop {
        // A poisoned lock means another worker panicked; the scope reports that panic.
        let Ok(buffer) = free_buffers.lock().map(|buffers| buffers.recv()) else {
            return;
        };
        let Ok(mut buffer) = buffer else {
            return;
        };
        // Taken after the buffer, so the part the writer waits for always has one.
        let part = next_part.fetch_add(1, Ordering::Relaxed);
        if part >= parts {
            return;
        }
        let from = part * part_events;
        let to = events.min(from + part_events);
        buffer.clear();
        let outcome = visit_dsh_part(store, &mut scan, id, (from, to), events, |line| {
            buffer.extend_from_slice(line.bytes);
            buffer.push(b'\n');
            Ok(())
        })
        .map(|()| buffer);
        if done.send((part, outcome)).is_err() {
            return;
        }
    }
}

/// The writer: writes parts `0..parts` in order as they come, giving each buffer back.
fn write_in_order(
    parts: u64,
    rendered: &Receiver<Rendered>,
    free: &Sender<Vec<u8>>,
    out: &mut impl Write,
) -> Result<u64> {
    let mut early: BTreeMap<u64, Result<Vec<u8>>> = BTreeMap::new();
    let mut written = 0u64;
    for part in 0..parts {
        let outcome = loop {
            if let Some(outcome) = early.remove(&part) {
                break outcome;
            }
            let (number, outcome) = rendered.recv().map_err(|_| {
                ExchangeError::Store(crate::Error::InvalidInput {
                    reason: "an export worker ended without its part".to_owned(),
                })
            })?;
            early.insert(number, outcome);
        };
        let bytes = outcome?;
        out.write_all(&bytes)
            .map_err(|source| crate::Error::io("export write", source))?;
        written += crate::storage::coding::widen(bytes.len());
        // A worker that has ended no longer needs it.
        let _ = free.send(bytes);
    }
    Ok(written)
}
