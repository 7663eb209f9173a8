//! Fault-injection matrix: for each write path (create session, append, segment roll, close),
//! ENOSPC, EIO on write, EIO on fsync, a failed rename. Each ends in a clear typed error;
//! nothing acknowledged is lost; the store opens afterwards.

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::{FaultKind, SimStorage};
use dshdb::store::Store;
use dshdb::Error;

/// Appends `count` Sync events to `s0` and returns how many were acknowledged.
fn append_until_error(store: &Store, count: u64) -> (u64, Option<Error>) {
    let mut writer = match store.writer("s0") {
        Ok(writer) => writer,
        Err(_) => match store.create_session_with_id("s0") {
            Ok(writer) => writer,
            Err(error) => return (0, Some(error)),
        },
    };
    let start = store
        .session("s0")
        .map(|summary| summary.events)
        .unwrap_or(0);
    for seq in start..start + count {
        if let Err(error) = writer.append(chunk(&event_data(0, seq, 300))) {
            return (seq - start, Some(error));
        }
    }
    (count, None)
}

fn reopen_and_count(disk: &SimStorage) -> u64 {
    let image = disk.durable_image();
    let store = open_sim(
        &SimStorage::from_image(&image),
        sim_options(Durability::Sync),
    )
    .expect("the store opens after the fault");
    let events = store.read("s0", 0, u64::MAX).unwrap_or_default();
    for (seq, event) in events.iter().enumerate() {
        assert_eq!(event.data, event_data(0, seq as u64, 300));
    }
    events.len() as u64
}

#[test]
fn a_failed_fsync_poisons_the_store_and_keeps_acknowledged_events() {
    for nth_sync in 0..12 {
        let disk = SimStorage::new();
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        disk.fail_nth(FaultKind::Sync, nth_sync);
        let (acked, error) = append_until_error(&store, 30);
        let error = error.expect("a sync failed");
        match error {
            // A failed commit sync: nothing after it may be acknowledged.
            Error::Poisoned { .. } => {
                let (more, later) = append_until_error(&store, 1);
                assert_eq!(
                    more, 0,
                    "sync #{nth_sync}: an append after poisoning succeeded"
                );
                assert!(matches!(later, Some(Error::Poisoned { .. })), "{later:?}");
            }
            // A failed sync while preparing a new segment: the batch was refused whole.
            Error::Io { .. } => {}
            other => panic!("sync #{nth_sync}: unexpected {other}"),
        }
        drop(store);
        assert!(reopen_and_count(&disk) >= acked, "sync #{nth_sync}");
    }
}

#[test]
fn a_failed_write_poisons_the_store_and_keeps_acknowledged_events() {
    for nth_write in 0..12 {
        let disk = SimStorage::new();
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        disk.fail_nth(FaultKind::Write, nth_write);
        let (acked, error) = append_until_error(&store, 30);
        let error = error.expect("a write failed");
        assert!(
            matches!(error, Error::Poisoned { .. } | Error::Io { .. }),
            "write #{nth_write}: {error}"
        );
        drop(store);
        assert!(reopen_and_count(&disk) >= acked, "write #{nth_write}");
    }
}

#[test]
fn a_failed_manifest_rename_during_a_roll_fails_the_append_cleanly() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let (first, none) = append_until_error(&store, 3);
    assert!(none.is_none());
    disk.fail_nth(FaultKind::Rename, 0);
    let (acked, error) = append_until_error(&store, 40);
    assert!(matches!(error, Some(Error::Io { .. })), "{error:?}");
    // The roll failed before anything of the batch was queued: the store still works.
    let (after, none) = append_until_error(&store, 3);
    assert!(none.is_none(), "{none:?}");
    store.close().expect("close");
    assert_eq!(reopen_and_count(&disk), first + acked + after);
}

#[test]
fn a_full_disk_fails_the_roll_with_disk_full_and_changes_nothing() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let (first, none) = append_until_error(&store, 3);
    assert!(none.is_none());
    disk.set_capacity(Some(disk_usage(&disk) + 100));
    let (acked, error) = append_until_error(&store, 40);
    assert!(matches!(error, Some(Error::DiskFull { .. })), "{error:?}");
    let length = store.session("s0").expect("session").events;
    assert_eq!(length, first + acked, "the refused batch left no trace");
    disk.set_capacity(None);
    let (after, none) = append_until_error(&store, 3);
    assert!(none.is_none(), "{none:?}");
    store.close().expect("close");
    assert_eq!(reopen_and_count(&disk), first + acked + after);
}

#[test]
fn a_full_disk_at_creation_is_a_typed_error() {
    let disk = SimStorage::new();
    disk.set_capacity(Some(10));
    let outcome = open_sim(&disk, sim_options(Durability::Sync));
    assert!(
        matches!(outcome, Err(Error::DiskFull { .. })),
        "{:?}",
        outcome.err()
    );
}

#[test]
fn a_read_only_directory_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("dshdb-ro-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let mut permissions = std::fs::metadata(&dir).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o555);
    std::fs::set_permissions(&dir, permissions).expect("chmod");
    let outcome = Store::open(&dir, dshdb::store::Options::default());
    // Root ignores directory permissions; then the open succeeds and that is fine too.
    if let Err(error) = &outcome {
        assert!(matches!(error, Error::Io { .. }), "{error}");
    }
    drop(outcome);
    let _ = std::fs::remove_dir_all(&dir);
}

fn disk_usage(disk: &SimStorage) -> u64 {
    let image = disk.volatile_image();
    let mut total = 0;
    for name in image.file_names().map(str::to_string).collect::<Vec<_>>() {
        total += image
            .clone()
            .file_mut(&name)
            .map_or(0, |bytes| bytes.len() as u64);
    }
    total
}

/// Every write path × every fault kind, at several points of each path.
mod matrix;

/// Failures away from the caller: a shared group commit, thread starts, background passes.
mod background;
/// Damage at rest, then writable opens and appends (F-05-12).
mod damage;
