//! The CLI on damaged stores and beside a writer (format-spec F-05-12, F-05-13): the
//! reproducers of issue 13, defects 1 and 2.

use crate::common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a seal frame (format-spec 03-segments.md).
const SEAL_FRAME_BYTES: u64 = 28;
/// How long the concurrent case runs.
const CONCURRENT_RUN: Duration = Duration::from_secs(3);

fn last_segment(store: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(store.join("wal"))
        .expect("wal dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

/// Every file under `dir` with its bytes.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).expect("read file"));
            }
        }
    }
    files
}

#[test]
fn a_lost_seal_is_repaired_by_the_next_append_and_the_store_keeps_reading() {
    let dir = temp_dir("lost-seal");
    let store_path = dir.join("s");
    let store = path_str(&store_path);
    ok(&["init", store], "");
    ok(
        &["append", store, "s", "--create", "--ack"],
        "{\"type\":\"turn/start\",\"data\":{\"turn\":1}}\n",
    );
    let segment = last_segment(&store_path);
    let length = std::fs::metadata(&segment).expect("segment").len();
    std::fs::File::options()
        .write(true)
        .open(&segment)
        .and_then(|file| file.set_len(length - SEAL_FRAME_BYTES))
        .expect("drop the seal");
    let verified = ok(&["verify", store], "");
    assert!(
        verified.contains("the next writable open repairs the torn seal"),
        "{verified}"
    );
    ok(
        &["append", store, "s", "--ack"],
        "{\"type\":\"turn/start\",\"data\":{\"turn\":2}}\n",
    );
    let verified = ok(&["verify", store], "");
    assert!(!verified.contains("torn"), "{verified}");
    std::fs::remove_file(store_path.join("index/checkpoint")).expect("remove the checkpoint");
    let listed = ok(&["ls", store], "");
    assert!(listed.contains("s") && listed.contains('2'), "{listed}");
    assert_eq!(ok(&["events", store, "s"], "").lines().count(), 2);
    ok(&["maintain", store], "");
    assert_eq!(ok(&["events", store, "s"], "").lines().count(), 2);
}

#[test]
fn damage_below_the_durable_point_refuses_appends_changes_nothing_and_verify_says_why() {
    let dir = temp_dir("flipped-record");
    let store_path = dir.join("t");
    let store = path_str(&store_path);
    ok(&["init", store], "");
    ok(
        &["append", store, "b", "--create"],
        "{\"type\":\"turn/start\",\"data\":{\"turn\":1}}\n",
    );
    let line = "{\"type\":\"user/message\",\"data\":{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"MARKER\"}],\"source\":{\"kind\":\"user\"},\"id\":\"m1\"},\"surfaceOp\":\"append\"}\n";
    ok(&["append", store, "a", "--create"], line);
    let segment = last_segment(&store_path);
    let mut bytes = std::fs::read(&segment).expect("segment");
    let at = bytes
        .windows(6)
        .position(|window| window == b"MARKER")
        .expect("the marker is in the last segment");
    bytes[at] = b'X';
    std::fs::write(&segment, &bytes).expect("flip");
    let before = tree(&store_path);
    for args in [
        vec!["append", store, "a", "--ack"],
        vec!["repair", store],
        vec!["maintain", store],
    ] {
        let output = dshdb(&args, "{\"type\":\"turn/start\",\"data\":{}}\n");
        assert_eq!(output.status.code(), Some(3), "{args:?}: damage exits 3");
        let message = stderr(&output);
        assert!(
            message.contains("corruption") && message.contains("dshdb verify"),
            "{args:?}: {message}"
        );
        assert_eq!(tree(&store_path), before, "{args:?} changed bytes");
    }
    let output = dshdb(&["verify", store], "");
    assert_eq!(output.status.code(), Some(3));
    let message = stderr(&output);
    let file_name = segment
        .file_name()
        .and_then(|name| name.to_str())
        .expect("name");
    assert!(
        message.contains(file_name) && message.contains("Writable opens of this store are refused"),
        "{message}"
    );
    // The undamaged session still reads.
    assert_eq!(ok(&["events", store, "b"], "").lines().count(), 1);
    assert!(ok(&["ls", store], "").contains('b'));
}

#[test]
fn verify_events_and_ls_beside_append_and_maintain_never_fail() {
    let dir = temp_dir("beside-a-writer");
    let store_path = dir.join("s");
    let store = path_str(&store_path);
    ok(&["init", store], "");
    ok(
        &["append", store, "s", "--create"],
        "{\"type\":\"turn/start\",\"data\":{\"turn\":0}}\n",
    );
    let stop = AtomicBool::new(false);
    let (writes, reads, failures) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let events: String = (0..20)
                    .map(|turn| {
                        format!("{{\"type\":\"turn/start\",\"data\":{{\"turn\":{turn}}}}}\n")
                    })
                    .collect();
                ok(&["append", store, "s"], &events);
                if writes % 3 == 2 {
                    ok(&["maintain", store], "");
                }
                writes += 1;
            }
            writes
        });
        let started = Instant::now();
        let mut reads = 0u64;
        let mut failures = Vec::new();
        while started.elapsed() < CONCURRENT_RUN {
            for args in [
                vec!["verify", store],
                vec!["events", store, "s"],
                vec!["ls", store],
            ] {
                let output = dshdb(&args, "");
                if output.status.code() != Some(0) {
                    failures.push(format!("{args:?}: {}", stderr(&output)));
                }
                reads += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        (writer.join().expect("writer"), reads, failures)
    });
    eprintln!("{reads} reader commands beside {writes} appends");
    assert!(
        failures.is_empty(),
        "{} of {reads} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(writes > 2 && reads > 10, "{writes} appends, {reads} reads");
}
