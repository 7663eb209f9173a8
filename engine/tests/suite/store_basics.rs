//! End-to-end behaviour of the store on real files and on the simulator.

use crate::common;

use common::*;
use dshdb::session::ForkErrorCode;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Options, Store};
use dshdb::Error;

#[test]
fn events_survive_close_and_reopen_byte_for_byte() {
    let scratch = temp_dir("basics");
    let dir = scratch.path().to_path_buf();
    let store = Store::open(&dir, Options::default()).expect("open");
    let mut writer = store.create_session_with_id("s1").expect("create");
    let data = r#"{"n":1e+21,"s":"\ud800","f":0.1}"#;
    let envelope = r#""sourceEventSeqs":[0],"surfaceOp":"append""#;
    writer
        .append(NewEvent {
            event_type: "user/message",
            time: Some(-5),
            data,
            envelope,
            flags: 0,
        })
        .expect("append");
    let receipt = writer
        .append_batch(&[chunk("{\"a\":1}"), chunk("[1,2]")])
        .expect("batch");
    assert_eq!(
        (receipt.first_seq, receipt.end_seq, receipt.durable),
        (1, 3, true)
    );
    drop(writer);
    store.close().expect("close");
    drop(store);
    let reopened = Store::open(&dir, Options::default()).expect("reopen");
    let events = reopened.read("s1", 0, 10).expect("read");
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].data, data);
    assert_eq!(events[0].time, -5);
    assert_eq!(
        events[0].to_json_line(),
        format!(r#"{{"type":"user/message","seq":0,"time":-5,"data":{data},{envelope}}}"#)
    );
    assert_eq!(events[2].data, "[1,2]");
    assert!(reopened.recovery_report().torn_tail.is_none());
}

#[test]
fn a_second_writer_on_the_same_store_is_refused_and_read_only_opens_work() {
    let scratch = temp_dir("basics");
    let dir = scratch.path().to_path_buf();
    let store = Store::open(&dir, Options::default()).expect("open");
    store.create_session_with_id("a").expect("create");
    let second = Store::open(&dir, Options::default());
    assert!(matches!(second, Err(Error::Locked { .. })));
    let reader = Store::open(
        &dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .expect("read-only open");
    assert_eq!(reader.sessions().len(), 1);
    assert!(matches!(
        reader.create_session_with_id("b"),
        Err(Error::ReadOnly)
    ));
}

#[test]
fn many_sessions_roll_segments_and_read_back_after_reopen() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writers: Vec<_> = (0..5)
        .map(|index| {
            store
                .create_session_with_id(&format!("s{index}"))
                .expect("create")
        })
        .collect();
    for seq in 0..40u64 {
        for (session, writer) in writers.iter_mut().enumerate() {
            let data = event_data(session, seq, 60 + (seq as usize % 7) * 30);
            writer.append(chunk(&data)).expect("append");
        }
    }
    drop(writers);
    store.close().expect("close");
    let reopened = open_sim(&disk, sim_options(Durability::Sync)).expect("reopen");
    assert!(
        reopened.recovery_report().segments_scanned + reopened.recovery_report().segments_covered
            > 3,
        "segments rolled"
    );
    for session in 0..5 {
        let events = reopened
            .read(&format!("s{session}"), 0, u64::MAX)
            .expect("read");
        assert_eq!(events.len(), 40);
        for (seq, event) in events.iter().enumerate() {
            assert_eq!(event.seq, seq as u64);
            assert_eq!(
                event.data,
                event_data(session, seq as u64, 60 + (seq % 7) * 30)
            );
        }
    }
}

#[test]
fn every_durability_mode_reads_back_and_flush_makes_batched_durable() {
    for durability in [Durability::Sync, Options::batched(), Durability::Buffered] {
        let disk = SimStorage::new();
        let store = open_sim(&disk, sim_options(durability)).expect("open");
        let mut writer = store.create_session_with_id("s").expect("create");
        for seq in 0..10 {
            writer
                .append(chunk(&event_data(0, seq, 50)))
                .expect("append");
        }
        assert_eq!(store.read("s", 0, 100).expect("read").len(), 10);
        store.flush().expect("flush");
        let image = disk.durable_image();
        let after_cut = open_sim(&SimStorage::from_image(&image), sim_options(durability))
            .expect("reopen after cut");
        assert_eq!(
            after_cut.read("s", 0, 100).expect("read").len(),
            10,
            "{durability:?}"
        );
    }
}

#[test]
fn a_batch_larger_than_a_segment_gets_a_segment_of_its_own_and_survives_a_power_cut() {
    let disk = SimStorage::new();
    let options = sim_options(Durability::Sync);
    let store = open_sim(&disk, options.clone()).expect("open");
    let mut writer = store.create_session_with_id("s").expect("create");
    writer.append(chunk("{}")).expect("small");
    // Five times the segment size, in one atomic batch.
    let big: Vec<String> = (0..20u64).map(|seq| event_data(0, seq, 1000)).collect();
    let batch: Vec<NewEvent<'_>> = big.iter().map(|data| chunk(data)).collect();
    let receipt = writer.append_batch(&batch).expect("oversized batch");
    assert_eq!((receipt.first_seq, receipt.end_seq), (1, 21));
    writer
        .append(chunk("{\"after\":true}"))
        .expect("small after");
    let image = disk.durable_image();
    let segments: Vec<u64> = image
        .file_names()
        .filter(|name| name.starts_with("wal/"))
        .filter_map(|name| image.file(name).map(|bytes| bytes.len() as u64))
        .collect();
    assert!(
        segments.iter().any(|&len| len > TEST_SEGMENT_BYTES),
        "one segment is larger than the configured size: {segments:?}"
    );
    let reopened = open_sim(&SimStorage::from_image(&image), options).expect("reopen");
    let events = reopened.read("s", 0, u64::MAX).expect("read");
    assert_eq!(events.len(), 22);
    for (event, data) in events[1..21].iter().zip(&big) {
        assert_eq!(&event.data, data);
    }
    assert_eq!(events[21].data, "{\"after\":true}");
}

#[test]
fn submitted_batches_from_one_thread_share_a_sync_and_are_durable_when_waited() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writers: Vec<_> = (0..8)
        .map(|session| {
            store
                .create_session_with_id(&format!("s{session}"))
                .expect("create")
        })
        .collect();
    let data: Vec<String> = (0..8).map(|session| event_data(session, 0, 100)).collect();
    let pending: Vec<_> = writers
        .iter_mut()
        .zip(&data)
        .map(|(writer, data)| writer.submit_batch(&[chunk(data)]).expect("submit"))
        .collect();
    for receipt in pending {
        let receipt = receipt.wait().expect("durable");
        assert!(receipt.durable);
        assert_eq!((receipt.first_seq, receipt.end_seq), (0, 1));
    }
    let reopened = open_sim(
        &SimStorage::from_image(&disk.durable_image()),
        sim_options(Durability::Sync),
    )
    .expect("reopen after a power cut");
    for (session, data) in data.iter().enumerate() {
        let events = reopened
            .read(&format!("s{session}"), 0, u64::MAX)
            .expect("read");
        assert_eq!(events.len(), 1);
        assert_eq!(&events[0].data, data);
    }
}

/// `PendingReceipt::when_settled` calls back once `wait` would return at once: only after
/// the batch's sync (what the disk holds durably at the call has the batch), at once for a
/// settled batch, and with the log's failure when its sync fails.
#[test]
fn when_settled_calls_back_after_the_sync_or_the_failure() {
    use dshdb::storage::io::sim::FaultKind;
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writer = store.create_session_with_id("s").expect("create");
    let data = event_data(0, 0, 100);
    for round in 0..20u64 {
        let pending = writer.submit_batch(&[chunk(&data)]).expect("submit");
        let (sender, called) = std::sync::mpsc::channel();
        let seen = disk.clone();
        pending.when_settled(move || {
            let _ = sender.send(seen.durable_image());
        });
        let image = called.recv().expect("called back");
        let durable = open_sim(
            &SimStorage::from_image(&image),
            sim_options(Durability::Sync),
        )
        .expect("reopen the image taken at the call");
        let events = durable.read("s", 0, u64::MAX).expect("read");
        assert_eq!(events.len() as u64, round + 1, "round {round}");
        assert!(pending.is_settled());
        assert!(pending.wait().expect("durable").durable);
    }
    let settled = writer.submit_batch(&[chunk(&data)]).expect("submit");
    let receipt_waited = writer.submit_batch(&[chunk(&data)]).expect("submit");
    assert!(receipt_waited.wait().expect("durable").durable);
    let called_at_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = called_at_once.clone();
    settled.when_settled(move || flag.store(true, std::sync::atomic::Ordering::SeqCst));
    assert!(called_at_once.load(std::sync::atomic::Ordering::SeqCst));
    disk.fail_nth(FaultKind::Sync, 0);
    let failing = writer.submit_batch(&[chunk(&data)]).expect("submit");
    let (sender, called) = std::sync::mpsc::channel();
    failing.when_settled(move || {
        let _ = sender.send(());
    });
    assert!(called.recv().is_ok());
    assert!(failing.wait().is_err());
}

#[test]
fn a_batch_above_max_batch_bytes_is_refused_and_writes_nothing() {
    let disk = SimStorage::new();
    let options = Options {
        max_batch_bytes: 8192,
        ..sim_options(Durability::Sync)
    };
    let store = open_sim(&disk, options).expect("open");
    let mut writer = store.create_session_with_id("s").expect("create");
    writer.append(chunk("{}")).expect("small");
    let before = disk.operation_count();
    let big: Vec<String> = (0..10u64).map(|seq| event_data(0, seq, 1000)).collect();
    let batch: Vec<NewEvent<'_>> = big.iter().map(|data| chunk(data)).collect();
    assert!(matches!(
        writer.append_batch(&batch),
        Err(Error::TooLarge {
            what: "batch",
            limit: 8192,
            ..
        })
    ));
    assert_eq!(disk.operation_count(), before, "nothing was written");
    assert_eq!(store.read("s", 0, u64::MAX).expect("read").len(), 1);
}

#[test]
fn bad_input_is_refused_with_a_typed_error_and_writes_nothing() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut writer = store.create_session_with_id("s").expect("create");
    writer.append(chunk("{}")).expect("first");
    let before = disk.operation_count();
    let cases: Vec<NewEvent<'_>> = vec![
        chunk("{not json"),
        NewEvent::new("", "{}"),
        NewEvent {
            envelope: r#""extra":1"#,
            ..chunk("{}")
        },
        NewEvent {
            envelope: r#""surfaceOp":"#,
            ..chunk("{}")
        },
    ];
    for case in cases {
        let outcome = writer.append(case);
        assert!(
            matches!(outcome, Err(Error::InvalidInput { .. })),
            "{case:?}"
        );
    }
    let huge = format!("\"{}\"", "x".repeat(dshdb::store::MAX_EVENT_DATA_BYTES));
    assert!(matches!(
        writer.append(chunk(&huge)),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        store.create_session_with_id("s"),
        Err(Error::DuplicateSession { .. })
    ));
    assert!(matches!(store.writer("s"), Err(Error::SessionBusy { .. })));
    assert!(matches!(
        store.writer("nope"),
        Err(Error::UnknownSession { .. })
    ));
    assert!(matches!(
        store.create_session(r#"{"version":1,"id":"x","createdAt":1}"#),
        Err(Error::InvalidInput { .. })
    ));
    assert_eq!(disk.operation_count(), before, "nothing was written");
    assert_eq!(store.read("s", 0, 10).expect("read").len(), 1);
    store.close().expect("close");
    assert!(matches!(writer.append(chunk("{}")), Err(Error::Closed)));
}

#[test]
fn a_fork_reads_its_seed_from_the_parent_and_survives_reopen() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut parent = store.create_session_with_id("parent").expect("create");
    let texts: Vec<String> = (0..6).map(|seq| event_data(0, seq, 80)).collect();
    for text in &texts {
        parent.append(chunk(text)).expect("append");
    }
    let before = disk.operation_count();
    let mut child = store.fork("parent", 3, "child").expect("fork");
    let forked_bytes = disk.operation_count() - before;
    child.append(chunk("{\"own\":1}")).expect("child append");
    parent
        .append(chunk("{\"parent\":7}"))
        .expect("parent append");
    let check = |store: &Store| {
        let events = store.read("child", 0, u64::MAX).expect("read child");
        assert_eq!(events.len(), 6, "4 seed events, end-seed, own event");
        for seq in 0..4 {
            assert_eq!(events[seq].data, texts[seq]);
        }
        assert_eq!(events[4].event_type, "session/end-seed");
        assert_eq!(events[4].seq, 4);
        assert_eq!(events[5].data, "{\"own\":1}");
        assert_eq!(store.read("child", 2, 5).expect("range").len(), 3);
        let header: serde_json::Value =
            serde_json::from_str(&store.session("child").expect("child").header_json)
                .expect("json");
        assert_eq!(header["parentSession"], "parent");
        assert_eq!(header["seedLength"], 4);
    };
    check(&store);
    assert!(forked_bytes < 10, "a fork writes one batch, not a copy");
    let past_the_end = store.fork("parent", 99, "other").err();
    assert_eq!(
        past_the_end.as_ref().map(ToString::to_string).as_deref(),
        Some("fork boundary 99 does not exist in session \"parent\" (last seq: 6)"),
        "DSH's INVALID_BOUNDARY text"
    );
    assert!(
        matches!(&past_the_end, Some(Error::Fork { source }) if source.fork_error_code() == Some(ForkErrorCode::InvalidBoundary))
    );
    assert!(matches!(
        store.fork("parent", 1, "child"),
        Err(Error::DuplicateSession { .. })
    ));
    drop((parent, child));
    store.close().expect("close");
    check(&open_sim(&disk, sim_options(Durability::Sync)).expect("reopen"));
}

#[test]
fn a_fork_inside_an_open_turn_is_refused() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let mut parent = store.create_session_with_id("p").expect("create");
    parent
        .append(NewEvent::new("turn/start", "{\"turn\":1}"))
        .expect("append");
    parent.append(chunk("{}")).expect("append");
    let outcome = store.fork("p", 1, "c").err();
    assert_eq!(
        outcome.as_ref().map(ToString::to_string).as_deref(),
        Some("fork boundary 1 in session \"p\" ends inside open turn 1"),
        "DSH's OPEN_TURN text, exactly"
    );
    assert!(
        matches!(&outcome, Some(Error::Fork { source }) if source.fork_error_code() == Some(ForkErrorCode::OpenTurn))
    );
    assert!(
        store.session("c").is_err(),
        "a refused fork creates no child"
    );
}

#[test]
fn a_store_without_its_manifest_is_refused_not_recreated() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    store.create_session_with_id("s").expect("create");
    store.close().expect("close");
    let mut image = disk.durable_image();
    let mut files = image.clone();
    let _ = &mut files;
    let stripped = {
        let names: Vec<String> = image.file_names().map(str::to_string).collect();
        assert!(names.iter().any(|name| name == "MANIFEST"));
        image.remove_file("MANIFEST");
        image
    };
    let outcome = open_sim(
        &SimStorage::from_image(&stripped),
        sim_options(Durability::Sync),
    );
    assert!(
        matches!(outcome, Err(Error::CorruptFile { .. })),
        "{:?}",
        outcome.err()
    );
}
