//! The one helper module of the engine's integration tests: the simulated-disk store,
//! deterministic event data, a seeded random generator, scratch directories and (in
//! `dsh_fixtures`) the DSH oracle fixtures.
#![allow(dead_code)]

pub mod dsh_fixtures;
pub mod hooked;

use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Options, Store};
use std::path::Path;
use std::sync::Arc;

/// Small segments so that tests roll segments often.
pub const TEST_SEGMENT_BYTES: u64 = 4096;

/// A decoded checkpoint encoded again, with `open` as its open-segment prefix: the runs
/// carry no file sizes (the checkpoint does not record them).
pub fn reencode_checkpoint(
    checkpoint: &dshdb::storage::index::Checkpoint,
    open: Option<dshdb::storage::index::OpenPrefix>,
) -> Vec<u8> {
    let runs: Vec<dshdb::storage::manifest::RunEntry> = checkpoint
        .runs
        .iter()
        .map(|(id, salt)| dshdb::storage::manifest::RunEntry {
            id: *id,
            salt: *salt,
            file_bytes: 0,
        })
        .collect();
    dshdb::storage::index::encode_checkpoint(&checkpoint.catalog, &runs, &checkpoint.segments, open)
        .expect("encode")
}

pub fn sim_options(durability: Durability) -> Options {
    Options {
        durability,
        segment_bytes: TEST_SEGMENT_BYTES,
        ..Options::default()
    }
}

/// A writable store on the simulated disk, `Sync` appends.
pub fn sim_writable() -> Options {
    sim_options(Durability::Sync)
}

/// A read-only open on the simulated disk, with or without the seq-index checkpoint.
pub fn sim_read_only(use_checkpoint: bool) -> Options {
    Options {
        read_only: true,
        create_if_missing: false,
        use_checkpoint,
        ..sim_options(Durability::Sync)
    }
}

pub fn open_sim(disk: &SimStorage, options: Options) -> dshdb::Result<Store> {
    Store::open_on(Arc::new(disk.clone()), options, Path::new("sim"))
}

/// Deterministic event data of roughly `size` bytes for (session, seq).
pub fn event_data(session: usize, seq: u64, size: usize) -> String {
    let filler: String = std::iter::repeat_n('x', size.saturating_sub(40)).collect();
    format!(r#"{{"s":{session},"n":{seq},"t":"{filler}"}}"#)
}

pub fn chunk(data: &str) -> NewEvent<'_> {
    NewEvent {
        event_type: "assistant/chunk",
        time: Some(1_700_000_000_000),
        data,
        envelope: "",
        flags: 0,
    }
}

/// splitmix64: the same sequence on every run, so a failing case can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        next_random(&mut self.0)
    }

    /// A value in `0..bound` (`0` when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// One splitmix64 step on `state`.
pub fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut mixed = *state;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    mixed ^ (mixed >> 31)
}

pub use dshdb_test_support::TempDir;

/// A fresh directory under the target's scratch space (`CARGO_TARGET_TMPDIR`), removed when
/// dropped.
pub fn temp_dir(name: &str) -> TempDir {
    TempDir::new_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "engine", name)
}

/// Cuts power at every storage operation of one `maintain` over the store in `base` (and two
/// past its last) and hands each image that leaves to `check_image` with its label and the
/// image opened again; returns how many operations the pass has and how many images were
/// checked. The crash enumeration of sealing, shared by the run tests.
pub fn every_cut_of_maintain(
    base: &dshdb::storage::io::sim::CrashImage,
    mut check_image: impl FnMut(&str, &SimStorage, Store),
) -> (u64, u64) {
    let reference = SimStorage::from_image(base);
    let store = open_sim(&reference, sim_options(Durability::Sync)).expect("open");
    let start = reference.operation_count();
    store.maintain().expect("maintain");
    let operations = reference.operation_count() - start;
    drop(store);
    let mut images_checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::from_image(base);
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        disk.crash_at(disk.operation_count() + cut);
        let _ = store.maintain();
        let mut images = disk.take_images();
        drop(store);
        if images.is_empty() {
            images.push(disk.durable_image());
        }
        for image in &images {
            let label = format!("cut {cut}, {}", image.label);
            let recovered = SimStorage::from_image(image);
            let store = open_sim(&recovered, sim_options(Durability::Sync))
                .unwrap_or_else(|error| panic!("{label}: reopen failed: {error}"));
            check_image(&label, &recovered, store);
            images_checked += 1;
        }
    }
    (operations, images_checked)
}

/// A closed store image on the simulated disk that `populate` filled, not yet sealed.
pub fn closed_image(populate: impl FnOnce(&Store)) -> dshdb::storage::io::sim::CrashImage {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    populate(&store);
    store.close().expect("close");
    disk.durable_image()
}

/// The crash invariants of many writers on one store, per session id: every acknowledged
/// event is there (`durable`: how many), the session ends at the end of a batch it attempted
/// (`attempted`), and each event is the one `data` says was written at its seq. Returns each
/// session's events.
pub fn check_acknowledged(
    store: &Store,
    label: &str,
    durable: &std::collections::BTreeMap<String, u64>,
    attempted: &std::collections::BTreeMap<String, Vec<u64>>,
    data: fn(&str, u64) -> String,
) -> Result<Vec<(String, Vec<dshdb::store::Event>)>, String> {
    let mut contents = Vec::new();
    for (id, ends) in attempted {
        let acknowledged = durable.get(id).copied().unwrap_or(0);
        let length = match store.session(id) {
            Ok(summary) => summary.events,
            Err(_) if acknowledged == 0 => continue,
            Err(error) => return Err(format!("{label}: {id} lost: {error}")),
        };
        if length < acknowledged {
            return Err(format!(
                "{label}: {id} has {length}, {acknowledged} acknowledged"
            ));
        }
        if length > 0 && !ends.contains(&length) {
            return Err(format!("{label}: {id} ends at {length}, inside a batch"));
        }
        let events = store
            .read(id, 0, u64::MAX)
            .map_err(|error| format!("{label}: read {id}: {error}"))?;
        for (seq, event) in events.iter().enumerate() {
            if event.seq != seq as u64 || event.data != data(id, seq as u64) {
                return Err(format!("{label}: {id} seq {seq} is not what was written"));
            }
        }
        contents.push((id.clone(), events));
    }
    Ok(contents)
}

/// Row entries in the segments the manifest names: (entries, events they stand for).
pub fn segment_row_entries(disk: &SimStorage) -> (u64, u64) {
    let manifest = dshdb::storage::manifest::Manifest::read(disk)
        .expect("manifest")
        .expect("present");
    let (mut entries, mut members) = (0, 0);
    for segment in &manifest.segments {
        let bytes = dshdb::storage::segment::read_segment(disk, segment.id).expect("segment");
        dshdb::storage::segment::scan_frames(&bytes, segment.id, segment.salt, |_, record| {
            if let dshdb::storage::frame::Record::Row(row) = record {
                entries += 1;
                members += u64::from(row.member_count);
            }
            Ok(())
        })
        .expect("scan");
    }
    (entries, members)
}
