//! Crash-point enumeration on the simulated disk.
//!
//! A scripted multi-session workload runs once per operation number k with a power cut armed
//! at k. Every image the cut leaves (durable state, every sector prefix of a torn write, and
//! the process-kill image) is reopened and checked:
//! - the store opens (a torn tail is fine, corruption is not);
//! - every acknowledged-durable event is there, byte-identical, with no seq gap; events that
//!   were only written (`Buffered`) are there after a process kill;
//! - nothing appears that was not written whole: every event equals what the workload
//!   appended at that seq, and every session ends on a batch boundary (batches are atomic);
//! - the recovered store takes a new append, closes and reopens with it.

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::store::{NewEvent, Store};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Fewest crash images one CI run must check.
const MIN_IMAGES_PER_RUN: u64 = 100_000;

#[derive(Clone, Copy, Debug)]
struct Workload {
    seed: u64,
    sessions: usize,
    steps: usize,
    durability: Durability,
    threads: usize,
    /// One batch in this many is larger than a segment (it gets a segment of its own);
    /// 0 = never.
    oversized_every: u64,
    /// Each step submits one batch to every session of the thread with `submit_batch` and
    /// only then waits for them all (the pipelined durable API).
    pipelined: bool,
}

/// Events in an oversized batch: about 12 × 390 bytes, above the 4096-byte test segment.
const OVERSIZED_BATCH_EVENTS: u64 = 12;

/// What the workload tried and what the store acknowledged, per session.
#[derive(Default, Debug, Clone)]
struct Ledger {
    /// Session created durably.
    created: BTreeMap<usize, u8>,
    /// Batch end seqs attempted, in order.
    batch_ends: BTreeMap<usize, Vec<u64>>,
    /// Length acknowledged durable.
    durable: BTreeMap<usize, u64>,
    /// Length acknowledged written (survives a process kill).
    written: BTreeMap<usize, u64>,
}

fn size_of(session: usize, seq: u64) -> usize {
    let mut state = (session as u64) << 32 ^ seq;
    40 + (next_random(&mut state) % 700) as usize
}

fn expected(session: usize, seq: u64) -> String {
    event_data(session, seq, size_of(session, seq))
}

fn session_id(session: usize) -> String {
    format!("s{session}")
}

/// The texts of the next batch of `count` events of a session at `length`, recorded in the
/// ledger as attempted before it is appended.
fn planned_batch(
    session: usize,
    length: u64,
    count: u64,
    ledger: &parking_lot::Mutex<Ledger>,
) -> Vec<String> {
    ledger
        .lock()
        .batch_ends
        .entry(session)
        .or_default()
        .push(length + count);
    (0..count)
        .map(|index| expected(session, length + index))
        .collect()
}

/// Runs one thread's share of the workload; stops at the first error (the power cut).
fn run_sessions(
    store: &Store,
    workload: Workload,
    owned: Vec<usize>,
    ledger: &parking_lot::Mutex<Ledger>,
) {
    let mut random = workload.seed ^ owned.first().copied().unwrap_or(0) as u64;
    let mut writers = Vec::new();
    for session in &owned {
        match store.create_session_with_id(&session_id(*session)) {
            Ok(writer) => {
                // 2 = durable, 1 = written (survives a process kill), 0 = queued only.
                let level = match workload.durability {
                    Durability::Sync => 2,
                    Durability::Buffered => 1,
                    Durability::Batched { .. } => 0,
                };
                ledger.lock().created.insert(*session, level);
                writers.push((*session, writer, 0u64));
            }
            Err(_) => return,
        }
    }
    if workload.pipelined {
        run_pipelined(&mut writers, workload.steps, &mut random, ledger);
        return;
    }
    for _ in 0..workload.steps {
        let pick = (next_random(&mut random) % writers.len() as u64) as usize;
        let (session, writer, length) = &mut writers[pick];
        let oversized = workload.oversized_every > 0
            && next_random(&mut random).is_multiple_of(workload.oversized_every);
        let count = if oversized {
            OVERSIZED_BATCH_EVENTS
        } else {
            1 + (next_random(&mut random) % 3)
        };
        let texts = planned_batch(*session, *length, count, ledger);
        let events: Vec<NewEvent<'_>> = texts.iter().map(|text| chunk(text)).collect();
        let Ok(receipt) = writer.append_batch(&events) else {
            return;
        };
        *length = receipt.end_seq;
        let mut entries = ledger.lock();
        if receipt.durable {
            entries.durable.insert(*session, receipt.end_seq);
        }
        if !matches!(workload.durability, Durability::Batched { .. }) {
            // Batched receipts come back at enqueue: neither written nor durable yet.
            entries.written.insert(*session, receipt.end_seq);
        }
        drop(entries);
        if workload.durability != Durability::Sync && next_random(&mut random).is_multiple_of(5) {
            if store.flush().is_err() {
                return;
            }
            let mut ledger = ledger.lock();
            for (session, _, length) in &writers {
                ledger.durable.insert(*session, *length);
                ledger.created.insert(*session, 2);
            }
        }
    }
    let _ = store.flush().map(|()| {
        let mut ledger = ledger.lock();
        for (session, _, length) in &writers {
            ledger.durable.insert(*session, *length);
            ledger.created.insert(*session, 2);
        }
    });
}

/// Pipelined durable appends: submit a batch to every session, then wait for each; only a
/// waited receipt counts as acknowledged.
fn run_pipelined(
    writers: &mut [(usize, dshdb::store::SessionWriter, u64)],
    steps: usize,
    random: &mut u64,
    ledger: &parking_lot::Mutex<Ledger>,
) {
    for _ in 0..steps {
        let mut pending = Vec::new();
        for (session, writer, length) in writers.iter_mut() {
            let count = 1 + (next_random(random) % 3);
            let texts = planned_batch(*session, *length, count, ledger);
            let events: Vec<NewEvent<'_>> = texts.iter().map(|text| chunk(text)).collect();
            let Ok(receipt) = writer.submit_batch(&events) else {
                return;
            };
            *length += count;
            pending.push((*session, receipt));
        }
        for (session, receipt) in pending {
            let Ok(receipt) = receipt.wait() else {
                return;
            };
            let mut entries = ledger.lock();
            entries.durable.insert(session, receipt.end_seq);
            entries.written.insert(session, receipt.end_seq);
        }
    }
}

/// Runs the whole workload on `disk`: open, sessions on `threads` threads, close.
fn run_workload(disk: &SimStorage, workload: Workload) -> Ledger {
    let ledger = parking_lot::Mutex::new(Ledger::default());
    let Ok(store) = open_sim(disk, sim_options(workload.durability)) else {
        return ledger.into_inner();
    };
    std::thread::scope(|scope| {
        for thread in 0..workload.threads {
            let owned: Vec<usize> = (0..workload.sessions)
                .filter(|session| session % workload.threads == thread)
                .collect();
            let store = &store;
            let ledger = &ledger;
            scope.spawn(move || run_sessions(store, workload, owned, ledger));
        }
    });
    let _ = store.close();
    ledger.into_inner()
}

/// Checks one crash image against the ledger; returns a description of the first violation.
fn check_image(image: &CrashImage, workload: Workload, ledger: &Ledger) -> Result<(), String> {
    let label = &image.label;
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, sim_options(Durability::Sync))
        .map_err(|error| format!("{label}: reopen failed: {error}"))?;
    let process_kill = label.starts_with("process killed");
    for session in 0..workload.sessions {
        let id = session_id(session);
        let durable = ledger.durable.get(&session).copied().unwrap_or(0);
        let written = ledger.written.get(&session).copied().unwrap_or(0);
        let must_have = if process_kill {
            written.max(durable)
        } else {
            durable
        };
        let Ok(summary) = store.session(&id) else {
            let created = ledger.created.get(&session).copied().unwrap_or(0);
            let required = if process_kill { 1 } else { 2 };
            if created >= required || must_have > 0 {
                return Err(format!("{label}: session {id} lost"));
            }
            continue;
        };
        if summary.events < must_have {
            return Err(format!(
                "{label}: {id} has {} events, {must_have} acknowledged",
                summary.events
            ));
        }
        let ends = ledger.batch_ends.get(&session).cloned().unwrap_or_default();
        if summary.events > 0 && !ends.contains(&summary.events) {
            return Err(format!(
                "{label}: {id} ends at {} inside a batch",
                summary.events
            ));
        }
        let events = store
            .read(&id, 0, u64::MAX)
            .map_err(|error| format!("{label}: read {id}: {error}"))?;
        for (seq, event) in events.iter().enumerate() {
            if event.seq != seq as u64 || event.data != expected(session, seq as u64) {
                return Err(format!(
                    "{label}: {id} seq {seq} differs from what was written"
                ));
            }
        }
    }
    check_store_still_works(&store, &disk).map_err(|error| format!("{label}: {error}"))
}

fn check_store_still_works(store: &Store, disk: &SimStorage) -> Result<(), String> {
    let mut writer = match store.writer("s0") {
        Ok(writer) => writer,
        Err(_) => store
            .create_session_with_id("s0")
            .map_err(|error| error.to_string())?,
    };
    let receipt = writer
        .append(chunk("{\"after\":true}"))
        .map_err(|error| error.to_string())?;
    drop(writer);
    store.close().map_err(|error| error.to_string())?;
    let reopened =
        open_sim(disk, sim_options(Durability::Sync)).map_err(|error| error.to_string())?;
    let last = reopened
        .get("s0", receipt.first_seq)
        .map_err(|error| error.to_string())?;
    if last.data != "{\"after\":true}" {
        return Err("append after recovery was lost".to_string());
    }
    Ok(())
}

/// Enumerates every crash point of one workload; returns how many images were checked.
fn enumerate(workload: Workload) -> u64 {
    let reference = SimStorage::new();
    run_workload(&reference, workload);
    let operations = reference.operation_count();
    let mut images_checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let ledger = run_workload(&disk, workload);
        let images = disk.take_crash_images();
        for image in &images {
            if let Err(violation) = check_image(image, workload, &ledger) {
                panic!("{workload:?} cut at op {cut}: {violation}");
            }
            images_checked += 1;
        }
    }
    images_checked
}

fn workloads() -> Vec<Workload> {
    let batched = Durability::Batched {
        max_delay: Duration::from_micros(200),
        max_bytes: 2048,
    };
    let mut list = Vec::new();
    for seed in 0..72 {
        list.push(Workload {
            seed,
            sessions: 3,
            steps: 60,
            durability: Durability::Sync,
            threads: 1,
            oversized_every: 0,
            pipelined: false,
        });
    }
    for seed in 0..8 {
        list.push(Workload {
            seed,
            sessions: 2,
            steps: 24,
            durability: Durability::Sync,
            threads: 1,
            oversized_every: 6,
            pipelined: false,
        });
    }
    for seed in 0..8 {
        list.push(Workload {
            seed,
            sessions: 4,
            steps: 12,
            durability: Durability::Sync,
            threads: 2,
            oversized_every: 0,
            pipelined: true,
        });
    }
    for seed in 0..16 {
        list.push(Workload {
            seed,
            sessions: 4,
            steps: 40,
            durability: Durability::Sync,
            threads: 4,
            oversized_every: 0,
            pipelined: false,
        });
        list.push(Workload {
            seed,
            sessions: 3,
            steps: 60,
            durability: Durability::Buffered,
            threads: 1,
            oversized_every: 0,
            pipelined: false,
        });
        list.push(Workload {
            seed,
            sessions: 3,
            steps: 60,
            durability: batched,
            threads: 1,
            oversized_every: 0,
            pipelined: false,
        });
    }
    list
}

#[test]
fn every_crash_point_keeps_acknowledged_events_and_invents_nothing() {
    let total = AtomicU64::new(0);
    let list = workloads();
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(workload) = list.get(index) else {
                    break;
                };
                total.fetch_add(enumerate(*workload), Ordering::Relaxed);
            });
        }
    });
    let total = total.load(Ordering::Relaxed);
    let _ = writeln!(
        std::io::stderr(),
        "crash images checked: {total} over {} workloads",
        list.len()
    );
    assert!(
        total >= MIN_IMAGES_PER_RUN,
        "only {total} crash images checked"
    );
}

#[test]
fn the_simulated_cut_really_loses_unsynced_bytes() {
    // Guards the test itself: with Buffered appends and no flush, a power cut must lose data,
    // otherwise the enumeration above could not catch a missing sync.
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("open");
    let mut writer = store.create_session_with_id("s0").expect("create");
    writer.append(chunk("{}")).expect("append");
    let image = disk.durable_image();
    let reopened = open_sim(
        &SimStorage::from_image(&image),
        sim_options(Durability::Sync),
    )
    .expect("reopen");
    assert!(
        reopened.session("s0").is_err(),
        "an unsynced session survived a power cut"
    );
    let _ = Arc::new(());
}
