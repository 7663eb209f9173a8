//! What a shared-mode open (format-spec/08-many-processes.md) refuses, and how: a store on
//! a read-only file system, a live dshdb of another shared-index layout (F-08-14), and
//! lease conflicts (F-08-10); and what it accepts: a store a single writer (an older
//! dshdb) wrote opens unchanged (F-08-14). Each refusal is a typed error that changes
//! nothing on disk.

use crate::common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::shared::{LockMode, SharedFile};
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::{Manifest, SegmentEntry};
use dshdb::storage::multi::lock::PRESENCE_LOCK;
use dshdb::storage::multi::tail::{SHARED_LAYOUT, SHARED_MAGIC};
use dshdb::storage::segment::segment_path;
use dshdb::store::{Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::Ordering;

fn shared() -> Options {
    Options {
        shared: true,
        ..sim_options(Durability::Sync)
    }
}

/// Every file of a simulated image, by name.
fn image_files(image: &CrashImage) -> BTreeMap<String, Vec<u8>> {
    image
        .file_names()
        .map(|name| {
            (
                name.to_string(),
                image.file(name).unwrap_or_default().to_vec(),
            )
        })
        .collect()
}

/// Every file under `dir` (relative path → bytes).
fn dir_files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).expect("list") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                let relative = path.strip_prefix(dir).expect("inside").to_path_buf();
                files.insert(relative, bytes);
            }
        }
    }
    files
}

/// A directory bind-mounted read-only over itself; unmounted on drop.
struct ReadOnlyMount {
    dir: PathBuf,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

impl ReadOnlyMount {
    /// Mounts `dir` read-only over itself (`mount --bind`, then a read-only remount, which
    /// root's permission bits would not give), and proves it: creating a file in it must
    /// fail with "read-only file system". `Err`: the machine cannot set it up (not root, no
    /// `CAP_SYS_ADMIN`), with why.
    fn new(dir: &Path) -> Result<ReadOnlyMount, String> {
        let text = dir.to_str().ok_or("a non-UTF-8 path")?;
        run("mount", &["--bind", text, text])?;
        let mount = ReadOnlyMount {
            dir: dir.to_path_buf(),
        };
        run("mount", &["-o", "remount,bind,ro", text])?;
        match std::fs::File::create(dir.join("probe")) {
            Ok(_) => {
                let _ = std::fs::remove_file(dir.join("probe"));
                Err("the remount left the directory writable".to_string())
            }
            Err(error) if error.kind() == std::io::ErrorKind::ReadOnlyFilesystem => Ok(mount),
            Err(error) => Err(format!("probe: {error}")),
        }
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let text = self.dir.to_string_lossy().into_owned();
        if run("umount", &[&text]).is_err() {
            // Busy (a handle still open): detach it now, the kernel finishes later.
            let _ = run("umount", &["-l", &text]);
        }
    }
}

#[test]
fn writable_opens_on_a_read_only_mount_are_refused_clearly_and_a_read_only_open_reads() {
    let temp = temp_dir("read-only-mount");
    let dir = temp.join("store");
    let store = Store::open(&dir, Options::default()).expect("create");
    let mut writer = store.create_session_with_id("s").expect("create s");
    for seq in 0..3 {
        writer
            .append(chunk(&event_data(0, seq, 80)))
            .expect("append");
    }
    drop(writer);
    store.close().expect("close");
    drop(store);
    let before = dir_files(&dir);
    let mount = match ReadOnlyMount::new(&dir) {
        Ok(mount) => mount,
        Err(reason) => {
            eprintln!(
                "SKIPPED: shared_open::writable_opens_on_a_read_only_mount_...: cannot mount \
                 {} read-only ({reason}); it needs root with CAP_SYS_ADMIN",
                dir.display()
            );
            return;
        }
    };
    for (mode, shared) in [("shared", true), ("exclusive", false)] {
        let options = Options {
            shared,
            ..Options::default()
        };
        match Store::open(&dir, options) {
            Err(error @ Error::ReadOnlyFileSystem { .. }) => {
                assert!(error.to_string().contains("read-only"), "{mode}: {error}");
                assert_eq!(
                    error.io_kind(),
                    Some(std::io::ErrorKind::ReadOnlyFilesystem),
                    "{mode}: the cause is kept"
                );
            }
            Err(other) => panic!("{mode} writable open: expected ReadOnlyFileSystem, got {other}"),
            Ok(_) => panic!("{mode} writable open succeeded on a read-only mount"),
        }
    }
    let reader = Store::open(
        &dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .expect("a read-only open works");
    let events = reader.read("s", 0, u64::MAX).expect("read");
    assert_eq!(events.len(), 3);
    for (seq, event) in events.iter().enumerate() {
        assert_eq!(event.data, event_data(0, seq as u64, 80));
    }
    drop(reader);
    drop(mount);
    assert_eq!(dir_files(&dir), before, "the refused opens changed nothing");
}

/// A store as a single writer of chapters 01–07 leaves it (what an older dshdb writes):
/// the `segment-two-sessions` vector named by a version-1 manifest.
fn vector_store() -> (SimStorage, serde_json::Value) {
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
    let bytes = std::fs::read(vectors.join("segment-two-sessions.bin")).expect("vector");
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(vectors.join("segment-two-sessions.json")).expect("vector json"),
    )
    .expect("json");
    let hex = |value: &serde_json::Value| {
        u64::from_str_radix(value.as_str().expect("hex").trim_start_matches("0x"), 16).expect("hex")
    };
    let (id, salt) = (hex(&json["segment_id"]), hex(&json["salt"]));
    let disk = SimStorage::new();
    disk.create_dir("wal").expect("wal");
    let file = disk.open(&segment_path(id), true).expect("segment");
    file.write_at(&bytes, 0).expect("write");
    file.sync_data().expect("sync");
    disk.sync_dir("wal").expect("sync wal");
    Manifest {
        segments: vec![SegmentEntry { id, salt }],
        runs: Vec::new(),
        next_segment_id: id + 1,
    }
    .write(&disk)
    .expect("manifest");
    (disk, json)
}

#[test]
fn a_store_a_single_writer_wrote_opens_in_the_shared_mode_unchanged() {
    let (disk, json) = vector_store();
    let segment = disk
        .durable_image()
        .file("wal/0000000000000001.seg")
        .map(<[u8]>::to_vec);
    assert!(segment.is_some(), "the vector store is durable");
    let first = open_sim(&disk, shared()).expect("the first process opens it alone");
    let second = open_sim(&disk, shared()).expect("a second one joins");
    for session in json["sessions"].as_array().expect("sessions") {
        let id = session["id"].as_str().expect("id");
        let want: Vec<&str> = session["json_lines"]
            .as_array()
            .expect("lines")
            .iter()
            .map(|line| line.as_str().expect("line"))
            .collect();
        for (process, store) in [&first, &second].iter().enumerate() {
            let lines: Vec<String> = store
                .read(id, 0, u64::MAX)
                .expect("read")
                .iter()
                .map(|event| event.to_json_line())
                .collect();
            assert_eq!(lines, want, "process {process} reads {id} as written");
        }
    }
    let before = second.session("alpha").expect("alpha").events;
    let mut writer = first.writer("alpha").expect("alpha's lease");
    let receipt = writer.append(chunk("{\"after\":1}")).expect("append");
    assert_eq!(receipt.first_seq, before, "continues the old session");
    drop(writer);
    assert!(second.refresh().expect("refresh"));
    assert_eq!(second.session("alpha").expect("alpha").events, before + 1);
    first.close().expect("close");
    second.close().expect("close the last");
    assert_eq!(
        disk.durable_image()
            .file("wal/0000000000000001.seg")
            .map(<[u8]>::to_vec),
        segment,
        "the old segment's bytes are untouched (a store of chapters 01-07 is not converted)"
    );
    let exclusive = open_sim(&disk, sim_writable()).expect("an exclusive open after them");
    assert_eq!(
        exclusive.session("alpha").expect("alpha").events,
        before + 1
    );
}

#[test]
fn a_live_process_of_another_shared_layout_refuses_a_joiner_and_changes_nothing() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_writable()).expect("create");
    store.create_session_with_id("s").expect("s");
    store.close().expect("close");
    drop(store);
    // A dshdb of shared-index layout 2 is live: its SHARED is initialized and it is present.
    let foreign = disk.open_sim_shared("SHARED").expect("shared");
    assert!(foreign
        .lock(PRESENCE_LOCK, LockMode::Shared, false)
        .expect("presence"));
    let foreign_layout = SHARED_LAYOUT + 1;
    foreign
        .word(1)
        .store(foreign_layout.to_le(), Ordering::SeqCst);
    foreign
        .word(0)
        .store(SHARED_MAGIC.to_le(), Ordering::SeqCst);
    let before = image_files(&disk.volatile_image());
    match open_sim(&disk, shared()) {
        Err(Error::UnsupportedVersion {
            file,
            found,
            supported,
        }) => {
            assert_eq!(file, "SHARED");
            assert_eq!(u64::from(found), foreign_layout);
            assert_eq!(u64::from(supported), SHARED_LAYOUT);
        }
        Err(other) => panic!("expected UnsupportedVersion, got {other}"),
        Ok(_) => panic!("joined a live process of another shared layout"),
    }
    assert_eq!(
        image_files(&disk.volatile_image()),
        before,
        "no file changed"
    );
    assert_eq!(
        u64::from_le(foreign.word(1).load(Ordering::SeqCst)),
        foreign_layout,
        "the live process's index is left alone"
    );
    // Once it is gone the index carries nothing (F-08-1): an alone open re-initializes it.
    drop(foreign);
    let store = open_sim(&disk, shared()).expect("alone after the other left");
    assert!(store.session("s").is_ok());
    store.close().expect("close");
}

#[test]
fn a_lease_taken_for_a_missing_session_is_given_back() {
    let disk = SimStorage::new();
    let first = open_sim(&disk, shared()).expect("first");
    let second = open_sim(&disk, shared()).expect("second");
    assert!(matches!(
        first.writer("ghost"),
        Err(Error::UnknownSession { .. })
    ));
    let mut writer = second
        .create_session_with_id("ghost")
        .expect("the failed writer() left no lease behind");
    writer.append(chunk("{\"n\":0}")).expect("append");
}

#[test]
fn deleting_a_session_another_process_writes_is_busy_and_changes_nothing() {
    let disk = SimStorage::new();
    let first = open_sim(&disk, shared()).expect("first");
    let second = open_sim(&disk, shared()).expect("second");
    let mut writer = first.create_session_with_id("s").expect("create");
    for seq in 0..2 {
        writer
            .append(chunk(&event_data(1, seq, 60)))
            .expect("append");
    }
    let before = image_files(&disk.volatile_image());
    match second.delete_session("s") {
        Err(Error::SessionBusy { id, pid }) => {
            assert_eq!(id, "s");
            assert_eq!(pid, Some(std::process::id()));
        }
        other => panic!("expected SessionBusy, got {other:?}"),
    }
    assert_eq!(
        image_files(&disk.volatile_image()),
        before,
        "a refused delete writes nothing"
    );
    let receipt = writer
        .append(chunk(&event_data(1, 2, 60)))
        .expect("the holder goes on");
    assert_eq!(receipt.first_seq, 2);
    second.refresh().expect("refresh");
    assert_eq!(second.session("s").expect("still there").events, 3);
    drop(writer);
    second
        .delete_session("s")
        .expect("free once the holder let go");
    first.refresh().expect("refresh");
    assert!(matches!(
        first.session("s"),
        Err(Error::UnknownSession { .. })
    ));
}
