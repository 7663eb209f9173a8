//! Fault-injection matrix: every public write path × every fault the simulated disk models
//! (a full disk, `EIO` on write, `EIO` on fsync, a short write, a failed rename), each at
//! several points of the path. Every cell must end in a typed error (or not reach the fault),
//! never a panic; afterwards the live store answers with typed errors only, and both the
//! durable image (power cut) and the volatile image (process kill) reopen with every
//! acknowledged event present and byte-identical. A second writer process and a read-only
//! directory are covered in `cli/tests/cli.rs` and `faults/mod.rs`.

use crate::common;

use common::*;
use dshdb::exchange::{self, ExchangeError};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::{CrashImage, FaultKind, SimStorage};
use dshdb::store::{NewEvent, Store};
use dshdb::Error;
use std::collections::BTreeMap;

/// Operations of one path tried per cell before giving up on reaching the fault.
const OPERATIONS_PER_CELL: usize = 24;
/// Fault positions tried per path and fault kind (the n-th matching disk operation).
const FAULT_POSITIONS: u64 = 6;
/// Bytes of each appended event's data.
const EVENT_BYTES: usize = 300;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WritePath {
    CreateSession,
    Append,
    AppendBatch,
    SubmitBatch,
    Fork,
    ImportDsh,
    Repair,
    BufferedThenClose,
}

const PATHS: [WritePath; 8] = [
    WritePath::CreateSession,
    WritePath::Append,
    WritePath::AppendBatch,
    WritePath::SubmitBatch,
    WritePath::Fork,
    WritePath::ImportDsh,
    WritePath::Repair,
    WritePath::BufferedThenClose,
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The disk is full `slack` bytes after the fault is armed.
    DiskFull,
    Io(FaultKind),
}

const FAULTS: [Fault; 5] = [
    Fault::DiskFull,
    Fault::Io(FaultKind::Write),
    Fault::Io(FaultKind::Sync),
    Fault::Io(FaultKind::ShortWrite),
    Fault::Io(FaultKind::Rename),
];

/// What the workload was told is durable: per session, its acknowledged length and the data
/// of every seq it wrote.
#[derive(Default, Clone)]
struct Ledger {
    acknowledged: BTreeMap<String, u64>,
    data: BTreeMap<String, Vec<String>>,
}

impl Ledger {
    fn wrote(&mut self, session: &str, data: String) {
        self.data.entry(session.to_owned()).or_default().push(data);
    }

    fn acknowledge(&mut self, store: &Store, session: &str) {
        let length = store.session(session).map(|summary| summary.events);
        self.acknowledged.insert(
            session.to_owned(),
            length.expect("an acknowledged session exists"),
        );
    }
}

/// A DSH log of `turns` closed turns (and, with `open`, a trailing open one).
fn dsh_log(id: &str, open: bool) -> String {
    let mut lines = vec![format!(
        r#"{{"type":"session","version":0,"id":"{id}","createdAt":1786073817152,"cwd":"/p","delegationDepth":0}}"#
    )];
    lines.push(r#"{"type":"user/message","seq":0,"time":2,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#.to_owned());
    lines.push(r#"{"type":"turn/start","seq":1,"time":3,"data":{"turn":1}}"#.to_owned());
    if !open {
        lines.push(r#"{"type":"turn/end","seq":2,"time":4,"data":{"turn":1,"reason":{"kind":"completed"}}}"#.to_owned());
    }
    format!("{}\n", lines.join("\n"))
}

fn store_error(error: ExchangeError) -> Error {
    match error {
        ExchangeError::Store(error) => error,
        other => panic!("a disk fault surfaced as a non-store error: {other}"),
    }
}

/// One operation of `path` (the `step`-th); on success the ledger learns what became durable.
fn operate(store: &Store, path: WritePath, step: usize, ledger: &mut Ledger) -> Result<(), Error> {
    let session = format!("{path:?}-{step}");
    match path {
        WritePath::CreateSession => {
            drop(store.create_session_with_id(&session)?);
            ledger.acknowledge(store, &session);
        }
        WritePath::Append | WritePath::AppendBatch | WritePath::SubmitBatch => {
            let mut writer = store.writer("base")?;
            let start = store.session("base")?.events;
            let count = if path == WritePath::Append { 1 } else { 3 };
            let data: Vec<String> = (0..count)
                .map(|offset| event_data(0, start + offset, EVENT_BYTES))
                .collect();
            let events: Vec<NewEvent<'_>> = data.iter().map(|data| chunk(data)).collect();
            for data in &data {
                ledger.wrote("base", data.clone());
            }
            match path {
                WritePath::Append => drop(writer.append(events[0])?),
                WritePath::AppendBatch => drop(writer.append_batch(&events)?),
                _ => drop(writer.submit_batch(&events)?.wait()?),
            }
            ledger.acknowledge(store, "base");
        }
        WritePath::Fork => {
            drop(store.fork("base", 1, &session)?);
            ledger.acknowledge(store, &session);
        }
        WritePath::ImportDsh => {
            exchange::import_dsh_jsonl(store, dsh_log(&session, false).as_bytes())
                .map_err(store_error)?;
            ledger.acknowledge(store, &session);
        }
        WritePath::Repair => {
            // The import (without the fault's attention) then the repair's durable closers.
            exchange::import_dsh_jsonl(store, dsh_log(&session, true).as_bytes())
                .map_err(store_error)?;
            ledger.acknowledge(store, &session);
            dshdb::derive::repair(store, &session).map_err(store_error)?;
            ledger.acknowledge(store, &session);
        }
        WritePath::BufferedThenClose => {
            let mut writer = store.writer("base")?;
            writer.set_durability(Durability::Buffered);
            let start = store.session("base")?.events;
            let data = event_data(0, start, EVENT_BYTES);
            ledger.wrote("base", data.clone());
            writer.append(chunk(&data))?;
            drop(writer);
            if step + 1 == OPERATIONS_PER_CELL || step % 4 == 3 {
                store.flush()?;
                ledger.acknowledge(store, "base");
            }
        }
    }
    Ok(())
}

fn is_fault_error(error: &Error) -> bool {
    matches!(
        error,
        Error::Io { .. } | Error::DiskFull { .. } | Error::Poisoned { .. }
    )
}

/// Reopens `image` and checks every acknowledged event against the ledger.
fn check_image(image: &CrashImage, ledger: &Ledger, cell: &str) {
    let disk = SimStorage::from_image(image);
    let store = open_sim(&disk, sim_options(Durability::Sync))
        .unwrap_or_else(|error| panic!("{cell}: the store does not reopen: {error}"));
    for (session, &length) in &ledger.acknowledged {
        let summary = store
            .session(session)
            .unwrap_or_else(|error| panic!("{cell}: acknowledged session {session} lost: {error}"));
        assert!(
            summary.events >= length,
            "{cell}: {session} has {} events, {length} were acknowledged",
            summary.events
        );
    }
    if let Some(written) = ledger.data.get("base") {
        let events = store.read("base", 0, u64::MAX).expect("read base");
        for event in &events {
            let index = usize::try_from(event.seq).expect("seq fits");
            assert_eq!(
                Some(&event.data),
                written.get(index),
                "{cell}: base seq {} differs from what was written",
                event.seq
            );
        }
    }
    // The recovered store takes a new session and closes.
    drop(
        store
            .create_session_with_id("after-recovery")
            .expect("append after recovery"),
    );
    store.close().expect("close after recovery");
}

/// Runs one cell; returns whether the fault was reached (an operation failed).
fn run_cell(path: WritePath, fault: Fault, position: u64) -> Option<Error> {
    let cell = format!("{path:?} × {fault:?} at {position}");
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut ledger = Ledger::default();
    let mut base = store.create_session_with_id("base").expect("create base");
    for seq in 0..3 {
        let data = event_data(0, seq, EVENT_BYTES);
        ledger.wrote("base", data.clone());
        base.append(chunk(&data)).expect("base append");
    }
    drop(base);
    ledger.acknowledge(&store, "base");
    match fault {
        Fault::DiskFull => disk.set_capacity(Some(disk.used_bytes() + position * 1024)),
        Fault::Io(kind) => disk.fail_nth(kind, position),
    }
    let mut failure = None;
    for step in 0..OPERATIONS_PER_CELL {
        if let Err(error) = operate(&store, path, step, &mut ledger) {
            assert!(is_fault_error(&error), "{cell}: untyped failure {error:?}");
            failure = Some(error);
            break;
        }
    }
    // After the fault the live store still answers, with typed errors only.
    disk.set_capacity(None);
    if let Err(error) = operate(&store, path, OPERATIONS_PER_CELL + 1, &mut ledger) {
        assert!(
            is_fault_error(&error) || matches!(error, Error::SessionBusy { .. }),
            "{cell}: after the fault: {error:?}"
        );
    }
    check_image(
        &disk.durable_image(),
        &ledger,
        &format!("{cell}, power cut"),
    );
    check_image(
        &disk.volatile_image(),
        &ledger,
        &format!("{cell}, process kill"),
    );
    failure
}

#[test]
fn every_write_path_survives_every_fault() {
    let mut reached: BTreeMap<String, u64> = BTreeMap::new();
    let mut disk_full_errors = 0;
    for path in PATHS {
        for fault in FAULTS {
            for position in 0..FAULT_POSITIONS {
                if let Some(error) = run_cell(path, fault, position) {
                    *reached.entry(format!("{fault:?}")).or_default() += 1;
                    disk_full_errors += u64::from(matches!(error, Error::DiskFull { .. }));
                }
            }
        }
    }
    println!("fault matrix: cells that reached their fault, by fault: {reached:?}");
    for fault in FAULTS {
        assert!(
            reached.get(&format!("{fault:?}")).copied().unwrap_or(0) > 0,
            "no write path ever reached {fault:?}"
        );
    }
    assert!(
        disk_full_errors > 0,
        "a full disk never surfaced as DiskFull"
    );
}
