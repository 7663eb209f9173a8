//! The one helper module of the engine's integration tests: the simulated-disk store,
//! deterministic event data, a seeded random generator, scratch directories and (in
//! `dsh_fixtures`) the DSH oracle fixtures.
#![allow(dead_code)]

pub mod dsh_fixtures;

use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Options, Store};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Small segments so that tests roll segments often.
pub const TEST_SEGMENT_BYTES: u64 = 4096;

pub fn sim_options(durability: Durability) -> Options {
    Options {
        durability,
        segment_bytes: TEST_SEGMENT_BYTES,
        ..Options::default()
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

/// A fresh directory under the target's scratch space (`CARGO_TARGET_TMPDIR`), removed when
/// dropped. The name holds the process id and a counter, so parallel tests never share one.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("engine-{name}-{}-{unique}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch directory");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
