//! Readers beside a writer (format-spec F-01-3, F-05-13): a read-only open sees a consistent
//! snapshot whatever the writer does meanwhile. Deterministic cases put the writer's step at
//! the worst moment of the reader's open on the simulated disk (a storage that runs the step
//! when the reader touches a file); a real concurrent case runs a writer thread that appends,
//! closes and maintains beside readers that open, list and read, on real files.

use crate::common;

use common::hooked::{Hooked, Moment, Step};
use common::*;
use dshdb::storage::frame::Record;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::{LockGuard, Storage, StorageFile};
use dshdb::storage::manifest::{Manifest, MANIFEST_FILE};
use dshdb::storage::segment::{scan_frames, segment_path};
use dshdb::store::{Options, Store};
use parking_lot::Mutex;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of each event's data: a few dozen events fill a 4096-byte test segment.
const EVENT_BYTES: usize = 200;
/// Events the rolling store's session holds (several segments' worth).
const ROLLING_EVENTS: u64 = 60;
/// How long the real concurrent case runs.
const CONCURRENT_RUN: Duration = Duration::from_secs(3);
/// Sessions the concurrent writer appends to, and events per batch.
const CONCURRENT_SESSIONS: usize = 3;
const CONCURRENT_BATCH_EVENTS: u64 = 4;

fn data(seq: u64) -> String {
    event_data(0, seq, EVENT_BYTES)
}

/// A live writer whose session `a` rolled over several segments.
fn rolled_writer(disk: &SimStorage) -> Store {
    let store = open_sim(disk, sim_writable()).expect("open");
    let mut writer = store.create_session_with_id("a").expect("session");
    for seq in 0..ROLLING_EVENTS {
        writer.append(chunk(&data(seq))).expect("append");
    }
    drop(writer);
    let segments = manifest(disk).segments.len();
    assert!(segments >= 3, "only {segments} segments");
    store
}

fn manifest(disk: &SimStorage) -> Manifest {
    let bytes = disk
        .open_read(MANIFEST_FILE)
        .and_then(|file| file.read_all())
        .expect("manifest");
    Manifest::decode(&bytes).expect("manifest decodes")
}

fn assert_reads_all(store: &Store, events: u64) {
    let read = store.read("a", 0, u64::MAX).expect("read");
    assert_eq!(read.len() as u64, events);
    for event in &read {
        assert_eq!(event.data, data(event.seq), "seq {}", event.seq);
    }
}

fn open_hooked(hooked: &Arc<Hooked>, use_checkpoint: bool) -> dshdb::Result<Store> {
    Store::open_on(
        hooked.clone(),
        sim_read_only(use_checkpoint),
        Path::new("sim"),
    )
}

fn write_file(disk: &SimStorage, path: &str, bytes: &[u8]) {
    let file = disk.open(path, false).expect("open");
    file.write_at(bytes, 0).expect("write");
    file.set_len(bytes.len() as u64).expect("length");
    file.sync_data().expect("sync");
}

#[test]
fn a_reader_keeps_reading_segments_that_maintenance_replaced_after_its_open() {
    let disk = SimStorage::new();
    let writer = rolled_writer(&disk);
    for use_checkpoint in [true, false] {
        let reader = open_sim(&disk, sim_read_only(use_checkpoint)).expect("read-only open");
        writer.maintain().expect("maintain");
        assert_reads_all(&reader, ROLLING_EVENTS);
    }
}

#[test]
fn a_reader_whose_files_vanish_during_its_open_starts_over_from_the_new_manifest() {
    let disk = SimStorage::new();
    let writer = rolled_writer(&disk);
    let first = segment_path(manifest(&disk).segments[0].id);
    let maintainer = writer.clone();
    // The old reader opened the first segment after reading the manifest, so a maintenance
    // pass that ran just before made it fail on a healthy store.
    let at_open = VanishOnOpen {
        inner: disk.clone(),
        path: first,
        step: Mutex::new(Some(Box::new(move || {
            maintainer.maintain().expect("maintain");
        }))),
    };
    let reader = Store::open_on(Arc::new(at_open), sim_read_only(false), Path::new("sim"))
        .expect("the read-only open sees the new manifest");
    assert_reads_all(&reader, ROLLING_EVENTS);
    assert!(!manifest(&disk).runs.is_empty(), "maintenance ran");
}

/// Runs a writer step when `path` is opened for reading, before it is opened.
struct VanishOnOpen {
    inner: SimStorage,
    path: String,
    step: Mutex<Option<Step>>,
}

impl Storage for VanishOnOpen {
    fn open(&self, path: &str, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        self.inner.open(path, create)
    }
    fn open_read(&self, path: &str) -> io::Result<Arc<dyn StorageFile>> {
        if path == self.path {
            let step = self.step.lock().take();
            if let Some(step) = step {
                step();
            }
        }
        self.inner.open_read(path)
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &str) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.create_dir(dir)
    }
    fn sync_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn exists(&self, path: &str) -> io::Result<bool> {
        self.inner.exists(path)
    }
    fn remove_dir(&self, dir: &str) -> io::Result<()> {
        self.inner.remove_dir(dir)
    }
    fn available_bytes(&self) -> io::Result<Option<u64>> {
        self.inner.available_bytes()
    }
    fn try_lock(&self, path: &str) -> io::Result<Option<Box<dyn LockGuard>>> {
        self.inner.try_lock(path)
    }
}

/// The writer's bytes of a segment pair at a roll, and what a reader could have seen of
/// them a moment earlier: the older segment not yet sealed (nor trimmed), the newer empty.
struct Roll {
    older: String,
    newer: String,
    older_final: Vec<u8>,
    newer_final: Vec<u8>,
}

fn read_file(disk: &SimStorage, path: &str) -> Vec<u8> {
    disk.open_read(path)
        .and_then(|file| file.read_all())
        .expect("read")
}

/// Puts the last two segments of `disk` back to the moment before the roll between them
/// was written: the older unsealed and untrimmed, the newer holding only its header.
fn undo_last_roll(disk: &SimStorage) -> Roll {
    let segments = manifest(disk).segments;
    let (older, newer) = (segments[segments.len() - 2], segments[segments.len() - 1]);
    let older_path = segment_path(older.id);
    let newer_path = segment_path(newer.id);
    let older_final = read_file(disk, &older_path);
    let newer_final = read_file(disk, &newer_path);
    let scan = scan_frames(&older_final, older.id, older.salt, |_, _| Ok(())).expect("scan");
    assert!(scan.sealed, "the older segment is sealed");
    let seal_at = older_final.len() - dshdb::storage::segment::SEAL_FRAME_BYTES as usize;
    let mut older_before = older_final[..seal_at].to_vec();
    older_before.resize(TEST_SEGMENT_BYTES as usize, 0);
    let mut newer_before = newer_final[..64].to_vec();
    newer_before.resize(newer_final.len(), 0);
    write_file(disk, &older_path, &older_before);
    write_file(disk, &newer_path, &newer_before);
    Roll {
        older: older_path,
        newer: newer_path,
        older_final,
        newer_final,
    }
}

#[test]
fn a_reader_that_sees_a_segment_unsealed_and_then_its_successor_with_data_reads_it_again() {
    let disk = SimStorage::new();
    let writer = rolled_writer(&disk);
    drop(writer);
    let disk = SimStorage::from_image(&disk.durable_image());
    let roll = undo_last_roll(&disk);
    let writer_disk = disk.clone();
    let older = roll.older.clone();
    // When the reader first reads the newer segment, the writer has sealed (and trimmed)
    // the older one and written its first batch to the newer one (F-05-2 order).
    let step: Step = Box::new(move || {
        write_file(&writer_disk, &older, &roll.older_final);
        write_file(&writer_disk, &roll.newer, &roll.newer_final);
    });
    let hooked = Hooked::new(&disk, roll_newer_path(&disk), Moment::BeforeRead, step);
    let reader = open_hooked(&hooked, false).expect("the reader reads the older segment again");
    assert!(hooked.fired(), "the writer step ran");
    assert_reads_all(&reader, ROLLING_EVENTS);
}

fn roll_newer_path(disk: &SimStorage) -> String {
    segment_path(manifest(disk).segments.last().expect("segment").id)
}

#[test]
fn a_reader_that_misses_a_batch_and_sees_a_later_commit_reads_the_segment_again() {
    // A live store: three Sync batches in its one segment, each commit recording the one
    // before as durable.
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_writable()).expect("open");
    let mut writer = store.create_session_with_id("a").expect("session");
    for seq in 0..3 {
        writer.append(chunk(&data(seq))).expect("append");
    }
    let disk = SimStorage::from_image(&disk.durable_image());
    drop(writer);
    drop(store);
    let segment = manifest(&disk).segments[0];
    let path = segment_path(segment.id);
    let bytes = read_file(&disk, &path);
    let mut commit_ends = Vec::new();
    scan_frames(&bytes, segment.id, segment.salt, |offset, record| {
        if let Record::Commit { .. } = record {
            commit_ends.push(offset as usize + 12 + 24);
        }
        Ok(())
    })
    .expect("scan");
    // What a read racing the writer's second and third group commits can see: the second
    // batch not yet there, the third already.
    let (second_start, second_end) = (commit_ends[1], commit_ends[2]);
    let mut racing = bytes.clone();
    racing[second_start..second_end].fill(0);
    write_file(&disk, &path, &racing);
    let writer_disk = disk.clone();
    let writer_path = path.clone();
    let step: Step = Box::new(move || write_file(&writer_disk, &writer_path, &bytes));
    let hooked = Hooked::new(&disk, path, Moment::AfterRead, step);
    let reader = open_hooked(&hooked, false).expect("not damage: the writer was writing");
    assert!(hooked.fired());
    assert_reads_all(&reader, 3);
    assert!(reader.recovery_report().torn_tail.is_none());
}

#[test]
fn a_reader_reads_a_segment_the_writer_trims_while_it_reads() {
    let disk = SimStorage::new();
    let writer = rolled_writer(&disk);
    drop(writer);
    let disk = SimStorage::from_image(&disk.durable_image());
    // The older segment sealed but not yet trimmed: the seal's zeros up to its preallocation.
    let roll = undo_last_roll(&disk);
    let mut sealed_untrimmed = roll.older_final.clone();
    sealed_untrimmed.resize(TEST_SEGMENT_BYTES as usize, 0);
    write_file(&disk, &roll.older, &sealed_untrimmed);
    write_file(&disk, &roll.newer, &roll.newer_final);
    let writer_disk = disk.clone();
    let older = roll.older.clone();
    let trimmed = roll.older_final.len() as u64;
    // Between the reader asking the length and reading, the writer trims.
    let step: Step = Box::new(move || {
        let file = writer_disk.open(&older, false).expect("open");
        file.set_len(trimmed).expect("trim");
    });
    let hooked = Hooked::new(&disk, roll.older, Moment::AtLength, step);
    let reader = open_hooked(&hooked, false).expect("no short read");
    assert!(hooked.fired());
    assert_reads_all(&reader, ROLLING_EVENTS);
}

/// The concurrent writer: appends batches to a few sessions, every few rounds closes and
/// reopens (sealing and trimming its segment, writing a checkpoint) and maintains (sealing
/// segments into runs and removing them), until told to stop. Returns rounds done.
fn concurrent_writer(dir: &Path, stop: &AtomicBool, appended: &[AtomicU64]) -> u64 {
    let options = Options {
        segment_bytes: 16 * 1024,
        ..Options::default()
    };
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) {
        let store = Store::open(dir, options.clone()).expect("writer open");
        for _ in 0..4 {
            for (session, count) in appended.iter().enumerate() {
                let id = format!("s{session}");
                let mut writer = store
                    .writer(&id)
                    .or_else(|_| store.create_session_with_id(&id))
                    .expect("writer");
                let start = count.load(Ordering::Relaxed);
                let texts: Vec<String> = (start..start + CONCURRENT_BATCH_EVENTS)
                    .map(|seq| event_data(session, seq, EVENT_BYTES))
                    .collect();
                let events: Vec<_> = texts.iter().map(|text| chunk(text)).collect();
                writer.append_batch(&events).expect("append");
                count.store(start + CONCURRENT_BATCH_EVENTS, Ordering::Relaxed);
            }
            store.maintain().expect("maintain");
        }
        store.close().expect("close");
        rounds += 1;
    }
    rounds
}

/// One reader pass: a read-only open (with or without the checkpoint), the session list,
/// every event checked against what the writer appended at its seq.
fn reader_pass(dir: &Path, use_checkpoint: bool) -> Result<u64, String> {
    let options = Options {
        read_only: true,
        create_if_missing: false,
        use_checkpoint,
        ..Options::default()
    };
    let store = Store::open(dir, options).map_err(|error| format!("open: {error}"))?;
    let mut events = 0;
    for session in store.sessions() {
        let number: usize = session.id[1..].parse().map_err(|_| "session id")?;
        let read = store
            .read(&session.id, 0, u64::MAX)
            .map_err(|error| format!("read {}: {error}", session.id))?;
        for event in &read {
            if event.data != event_data(number, event.seq, EVENT_BYTES) {
                return Err(format!("{} seq {} differs", session.id, event.seq));
            }
        }
        events += read.len() as u64;
    }
    Ok(events)
}

#[test]
fn readers_beside_a_writer_that_appends_closes_and_maintains_never_fail() {
    let dir = temp_dir("readers-beside-a-writer");
    let store_dir = dir.join("store");
    Store::open(&store_dir, Options::default())
        .expect("create")
        .close()
        .expect("close");
    let stop = AtomicBool::new(false);
    let appended: Vec<AtomicU64> = (0..CONCURRENT_SESSIONS)
        .map(|_| AtomicU64::new(0))
        .collect();
    let (rounds, passes, failures) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| concurrent_writer(&store_dir, &stop, &appended));
        let started = Instant::now();
        let mut passes = 0u64;
        let mut failures = Vec::new();
        while started.elapsed() < CONCURRENT_RUN {
            match reader_pass(&store_dir, passes.is_multiple_of(2)) {
                Ok(_) => {}
                Err(failure) => failures.push(failure),
            }
            passes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        (writer.join().expect("writer thread"), passes, failures)
    });
    eprintln!("{passes} reader passes beside {rounds} writer rounds");
    assert!(
        failures.is_empty(),
        "{} of {passes} passes failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        passes > 10 && rounds > 0,
        "{passes} passes, {rounds} rounds"
    );
}
