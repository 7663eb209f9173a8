//! Hostile opens (issues 12 and 13): a disk with less free space than a segment, a creation
//! that fails half-way, a folder that is not a store, data no view can read back, and
//! session ids that listings could not show.

use crate::common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::storage::segment::PREALLOCATION_RESERVE_BYTES;
use dshdb::store::{
    NewEvent, Options, Store, DEFAULT_SEGMENT_BYTES, MAX_EVENT_DATA_DEPTH, RESERVE_FILE,
};
use dshdb::Error;

/// Default options: 64 MiB segments, as the CLI opens stores.
fn default_options() -> Options {
    Options {
        durability: Durability::Sync,
        ..Options::default()
    }
}

/// A store with session `s` of a few events, closed, on a disk of unlimited size.
fn store_with_a_session(disk: &SimStorage, sessions: &[&str]) {
    let store = open_sim(disk, sim_options(Durability::Sync)).expect("create");
    for id in sessions {
        let mut writer = store.create_session_with_id(id).expect("session");
        for seq in 0..20 {
            writer
                .append(chunk(&event_data(0, seq, 200)))
                .expect("append");
        }
    }
    store.close().expect("close");
}

#[test]
fn a_disk_with_less_free_than_a_segment_still_takes_writable_opens() {
    for free in [
        DEFAULT_SEGMENT_BYTES / 2,
        PREALLOCATION_RESERVE_BYTES + 4096,
        PREALLOCATION_RESERVE_BYTES / 2,
        64 * 1024,
    ] {
        let disk = SimStorage::new();
        store_with_a_session(&disk, &["a", "b"]);
        disk.set_capacity(Some(disk.used_bytes() + free));
        let store = open_sim(&disk, default_options())
            .unwrap_or_else(|error| panic!("{free} bytes free: writable open failed: {error}"));
        let mut writer = store.writer("a").expect("writer");
        writer.append(chunk("{\"more\":1}")).expect("append");
        drop(writer);
        // The two commands that free space work too.
        store.delete_session("b").expect("rm on a nearly full disk");
        store.maintain().expect("maintain on a nearly full disk");
        store.close().expect("close");
        let reopened = open_sim(&disk, default_options()).expect("reopen");
        assert_eq!(reopened.session("a").expect("a").events, 21, "{free} free");
        assert!(reopened.session("b").is_err(), "b stays deleted");
        reopened.close().expect("close");
    }
}

#[test]
fn a_disk_with_no_byte_free_still_takes_rm_and_maintain() {
    let disk = SimStorage::new();
    // A disk that reports its free space (a writer keeps the reserve only on such a disk).
    disk.set_capacity(Some(1 << 30));
    store_with_a_session(&disk, &["a", "b"]);
    assert!(
        disk.exists(RESERVE_FILE).expect("list"),
        "a writable store keeps its reserve"
    );
    // Not one byte free: only the reserve's space is left to start the log.
    disk.set_capacity(Some(disk.used_bytes()));
    let store = open_sim(&disk, default_options()).expect("writable open on a full disk");
    store.delete_session("b").expect("rm on a full disk");
    store.maintain().expect("maintain on a full disk");
    store.close().expect("close");
    let reopened = open_sim(&disk, default_options()).expect("reopen");
    assert_eq!(reopened.session("a").expect("a").events, 20);
    assert!(reopened.session("b").is_err(), "b stays deleted");
    reopened.close().expect("close");
    // With room again, maintenance puts the reserve back.
    disk.set_capacity(Some(1 << 30));
    let store = open_sim(&disk, default_options()).expect("open");
    store.maintain().expect("maintain");
    assert!(
        disk.exists(RESERVE_FILE).expect("list"),
        "the reserve is back"
    );
    store.close().expect("close");
}

#[test]
fn preallocation_leaves_the_reserve_free() {
    let disk = SimStorage::new();
    let free = PREALLOCATION_RESERVE_BYTES + 1024 * 1024;
    disk.set_capacity(Some(free));
    let store = open_sim(&disk, default_options()).expect("create on a small disk");
    let left = disk
        .available_bytes()
        .expect("free space")
        .expect("the sim knows its capacity");
    assert!(
        left >= PREALLOCATION_RESERVE_BYTES - 4096,
        "preallocation left only {left} bytes of {free}"
    );
    store.close().expect("close");
}

#[test]
fn a_creation_that_fails_for_space_leaves_nothing() {
    // Every capacity from none to a little more than a store's first files: the open either
    // creates a whole store or leaves the directory as empty as it found it.
    let mut refused = 0;
    for capacity in (0..=512).step_by(16) {
        let disk = SimStorage::new();
        disk.set_capacity(Some(capacity));
        match open_sim(&disk, default_options()) {
            Ok(store) => {
                // The close may fail for want of room for its seal; a store it stays.
                drop(store.close());
                assert!(disk.exists("MANIFEST").expect("exists"), "{capacity}");
            }
            Err(error) => {
                assert!(
                    matches!(error, Error::DiskFull { .. }),
                    "{capacity}: {error}"
                );
                refused += 1;
                let left = disk.list("").expect("list");
                assert!(
                    left.is_empty(),
                    "capacity {capacity}: a failed creation left {left:?}"
                );
            }
        }
    }
    assert!(
        refused > 0,
        "no capacity was too small: the test checks nothing"
    );
}

#[test]
fn a_writer_open_of_a_folder_that_is_not_a_store_creates_nothing() {
    let disk = SimStorage::new();
    let notes = disk.open("notes.txt", true).expect("foreign file");
    notes.write_at(b"mine", 0).expect("write");
    for create_if_missing in [false, true] {
        let options = Options {
            create_if_missing,
            ..default_options()
        };
        let error = open_sim(&disk, options).err().expect("not a store");
        assert!(matches!(error, Error::NotAStore { .. }), "{error}");
        assert_eq!(disk.list("").expect("list"), vec!["notes.txt".to_string()]);
    }
    // Without create_if_missing an empty folder stays empty too.
    let empty = SimStorage::new();
    let options = Options {
        create_if_missing: false,
        ..default_options()
    };
    let error = open_sim(&empty, options).err().expect("not a store");
    assert!(matches!(error, Error::NotAStore { .. }), "{error}");
    assert!(empty.list("").expect("list").is_empty());
}

#[test]
fn a_writer_open_of_a_foreign_folder_on_disk_leaves_no_lock() {
    let dir = temp_dir("foreign-folder");
    let folder = dir.join("notes");
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::write(folder.join("notes.txt"), b"mine").expect("file");
    for create_if_missing in [false, true] {
        let options = Options {
            create_if_missing,
            ..Options::default()
        };
        let error = Store::open(&folder, options).err().expect("not a store");
        assert!(matches!(error, Error::NotAStore { .. }), "{error}");
        assert_eq!(
            dshdb_test_support::sorted_entries(&folder),
            vec!["notes.txt".to_string()]
        );
    }
    // A store that does not exist is not created by an open that may not create one.
    let typo = dir.join("typo");
    let options = Options {
        create_if_missing: false,
        ..Options::default()
    };
    assert!(matches!(
        Store::open(&typo, options),
        Err(Error::NotAStore { .. })
    ));
    assert!(!typo.exists());
}

/// `data` that nests `depth` levels of arrays (`depth` 0 is a number).
fn nested(depth: usize) -> String {
    format!("{}0{}", "[".repeat(depth), "]".repeat(depth))
}

#[test]
fn data_nested_past_the_depth_limit_is_refused_and_the_limit_itself_reads_back() {
    let store = open_sim(&SimStorage::new(), sim_options(Durability::Sync)).expect("store");
    let mut writer = store.create_session_with_id("deep").expect("session");
    let too_deep = nested(MAX_EVENT_DATA_DEPTH + 1);
    let error = writer
        .append(NewEvent::new("tool/call", &too_deep))
        .expect_err("refused");
    assert!(
        matches!(&error, Error::InvalidInput { reason } if reason.contains("nested more than 127")),
        "{error}"
    );
    // Brackets inside strings do not count.
    let in_string = format!("{{\"text\":\"{}\"}}", "[".repeat(500));
    writer
        .append(NewEvent::new("tool/call", &in_string))
        .expect("brackets in a string are text");
    writer
        .append(NewEvent::new("tool/call", &nested(MAX_EVENT_DATA_DEPTH)))
        .expect("the limit itself is accepted");
    assert_eq!(store.session("deep").expect("deep").events, 2);
}

#[test]
fn empty_and_control_character_session_ids_are_refused() {
    let store = open_sim(&SimStorage::new(), sim_options(Durability::Sync)).expect("store");
    for id in ["", "a\nb", "tab\there", "bell\u{7}", "delete\u{7f}"] {
        let error = store.create_session_with_id(id).err().expect("refused id");
        assert!(
            matches!(error, Error::InvalidInput { .. }),
            "{id:?}: {error}"
        );
        let header = format!(
            r#"{{"version":0,"id":{},"createdAt":1}}"#,
            serde_json::json!(id)
        );
        assert!(
            matches!(
                store.create_session(&header),
                Err(Error::InvalidInput { .. })
            ),
            "{id:?} in a header"
        );
    }
    let mut writer = store.create_session_with_id("ok").expect("a plain id");
    writer.append(chunk("{}")).expect("append");
    drop(writer);
    for child in [
        "", "new
line",
    ] {
        let error = store.fork("ok", 0, child).err();
        assert!(
            matches!(error, Some(Error::InvalidInput { .. })),
            "{error:?}"
        );
    }
    assert_eq!(store.sessions().len(), 1);
}

/// A capacity at which a store's first files fit but its first segment does not.
fn capacity_failing_at_the_segment() -> u64 {
    (0..=512)
        .step_by(8)
        .find(|&capacity| {
            let disk = SimStorage::new();
            disk.set_capacity(Some(capacity));
            // Failed for space at the segment, so after the manifest had fitted.
            matches!(
                open_sim(&disk, default_options()),
                Err(Error::DiskFull { operation, .. }) if operation.starts_with("segment")
            )
        })
        .expect("some capacity fits the manifest and not the segment")
}

#[test]
fn a_power_cut_while_a_failed_creation_is_taken_back_leaves_a_creatable_folder() {
    let capacity = capacity_failing_at_the_segment();
    let mut cuts = 0;
    for operation in 0.. {
        let disk = SimStorage::new();
        disk.set_capacity(Some(capacity));
        disk.crash_at(operation);
        assert!(open_sim(&disk, default_options()).is_err());
        let images = disk.take_images();
        if images.is_empty() {
            // The failed open ended before this operation: every cut was tried.
            break;
        }
        cuts += 1;
        for image in images {
            // Whatever the cut left is an empty folder or an empty store: a later open on a
            // disk with room creates or opens it, with no session in it.
            let after = SimStorage::from_image(&image);
            let store = open_sim(&after, default_options())
                .unwrap_or_else(|error| panic!("{}: {error}", image.label));
            assert!(store.sessions().is_empty(), "{}", image.label);
            store.close().expect("close");
        }
    }
    assert!(cuts > 5, "only {cuts} operations: the creation did not run");
}
