//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use dshdb::commit::Durability;
use dshdb::db::{NewEvent, Options, Store};
use dshdb::io::sim::SimStorage;
use std::path::Path;
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
