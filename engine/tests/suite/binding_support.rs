//! What the Node binding relies on: a new session's first batch submitted without waiting
//! (so many sessions share one group commit), and the sessions a discarded torn tail cost
//! events (DSH's torn marker), on the simulated disk.

use dshdb::storage::io::sim::SimStorage;
use dshdb::{Durability, NewEvent, Options, Store};
use std::path::Path;
use std::sync::Arc;

fn header(id: &str) -> String {
    format!(r#"{{"version":0,"id":"{id}","createdAt":1}}"#)
}

fn open(storage: &SimStorage) -> Store {
    Store::open_on(
        Arc::new(storage.clone()),
        Options::default(),
        Path::new("sim"),
    )
    .expect("open")
}

#[test]
fn submitted_sessions_are_readable_at_once_and_durable_after_wait() {
    let storage = SimStorage::new();
    let store = open(&storage);
    let event = NewEvent::new("turn/start", r#"{"turn":1}"#);
    let mut pending = Vec::new();
    let mut writers = Vec::new();
    for id in ["a", "b", "c"] {
        let (writer, receipt) = store
            .submit_session_with_events(&header(id), &[event], Durability::Sync)
            .expect("submit");
        assert_eq!(store.session(id).expect("listed").events, 1);
        pending.push(receipt);
        writers.push(writer);
    }
    for receipt in pending {
        let receipt = receipt.wait().expect("durable");
        assert!(receipt.durable);
        assert_eq!((receipt.first_seq, receipt.end_seq), (0, 1));
    }
    let durable = SimStorage::from_image(&storage.durable_image());
    let reopened = open(&durable);
    let ids: Vec<String> = reopened.sessions().into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert!(reopened.torn_sessions().is_empty());
}

#[test]
fn refused_submission_reserves_nothing() {
    let storage = SimStorage::new();
    let store = open(&storage);
    let empty = store.submit_session_with_events(&header("a"), &[], Durability::Sync);
    assert!(matches!(empty, Err(dshdb::Error::InvalidInput { .. })));
    let bad = NewEvent::new("x", "{not json");
    let invalid = store.submit_session_with_events(&header("a"), &[bad], Durability::Sync);
    assert!(matches!(invalid, Err(dshdb::Error::InvalidInput { .. })));
    assert!(store.session("a").is_err());
}

#[test]
fn torn_tail_names_the_sessions_that_lost_events() {
    let storage = SimStorage::new();
    let store = open(&storage);
    let event = NewEvent::new("turn/start", r#"{"turn":1}"#);
    let (mut a, first) = store
        .submit_session_with_events(&header("a"), &[event], Durability::Sync)
        .expect("a");
    first.wait().expect("durable a");
    let (_b, second) = store
        .submit_session_with_events(&header("b"), &[event], Durability::Sync)
        .expect("b");
    second.wait().expect("durable b");
    let written = a
        .submit_batch_as(&[event, event], Durability::Buffered)
        .expect("buffered")
        .wait()
        .expect("written");
    assert!(!written.durable);
    // A process kill mid-write: the last batch reached the disk only in part.
    let mut image = storage.volatile_image();
    let segment = image
        .file_names()
        .find(|name| name.starts_with("wal/") && name.ends_with(".seg"))
        .map(str::to_string)
        .expect("segment");
    let bytes = image.file_mut(&segment).expect("segment bytes");
    let end = bytes.iter().rposition(|byte| *byte != 0).expect("data") + 1;
    bytes[end - 6..end].fill(0);
    let reopened = open(&SimStorage::from_image(&image));
    let torn = reopened.recovery_report().torn_tail.clone().expect("torn");
    assert_eq!(torn.dropped_events, 2);
    assert_eq!(reopened.torn_sessions(), ["a"]);
    assert_eq!(reopened.session("a").expect("a").events, 1);
    assert_eq!(reopened.session("b").expect("b").events, 1);
}
