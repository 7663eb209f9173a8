//! Golden vectors of format-spec/07 (`cache-checkpoint`, `spill-blob`), written by
//! `format-spec/vectors/reference_07.py` from the spec text alone: the engine decodes them,
//! re-encodes the checkpoint byte for byte, and uses both files from a store.

use crate::common;

use common::*;
use dshdb::derive::cache::{
    checkpoint_file_name, decode_checkpoint, encode_checkpoint, session_cache_dir, CacheOptions,
    ProjectionCache,
};
use dshdb::derive::projection::StatsUnit;
use dshdb::spill::{BlobHash, SpillStore};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::store::NewEvent;
use serde_json::Value;
use std::path::Path;

fn vector(name: &str) -> (Vec<u8>, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
    let bytes = std::fs::read(dir.join(format!("{name}.bin"))).expect("vector .bin");
    let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("vector .json");
    (bytes, serde_json::from_str(&json).expect("vector JSON"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn place(storage: &dyn Storage, path: &str, bytes: &[u8]) {
    storage
        .create_dir(path.rsplit_once('/').expect("dir").0)
        .expect("dir");
    storage
        .open(path, true)
        .expect("open")
        .write_at(bytes, 0)
        .expect("write");
}

/// F-07-1..F-07-4.
#[test]
fn checkpoint_vector_decodes_re_encodes_and_is_used() {
    let (bytes, expected) = vector("cache-checkpoint");
    let checkpoint = decode_checkpoint(&bytes).expect("decodes");
    assert_eq!(checkpoint.unit, expected["unit"]);
    assert_eq!(
        u64::from(checkpoint.state_version),
        expected["state_version"]
    );
    assert_eq!(checkpoint.seq, expected["seq"]);
    assert_eq!(hex(&checkpoint.identity), expected["identity"]);
    assert_eq!(hex(&checkpoint.anchor), expected["anchor"]);
    assert_eq!(hex(checkpoint.state), expected["state"]);
    let re_encoded = encode_checkpoint(&checkpoint).expect("encode");
    assert_eq!(re_encoded, bytes, "byte-exact re-encoding");
    let session = expected["session"].as_str().expect("session");
    let file_name = format!(
        "{}/{}",
        session_cache_dir(session),
        checkpoint_file_name(checkpoint.unit, checkpoint.state_version, checkpoint.seq)
    );
    assert_eq!(file_name, expected["file_name"]);
    // A store holding that session: the cache must accept the checkpoint (identity and
    // anchor as the spec computes them) and fold nothing.
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let header = expected["header"].as_str().expect("header");
    let mut writer = store.create_session(header).expect("create");
    for seq in 0..3 {
        let event = NewEvent {
            time: Some(1_790_000_000_000 + seq),
            ..NewEvent::new("turn/end", r#"{"turn":1}"#)
        };
        writer.append(event).expect("append");
    }
    place(store.storage().as_ref(), &file_name, &bytes);
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let (stats, report) = cache.read(session, &StatsUnit).expect("read");
    assert_eq!(report.discarded, 0);
    assert_eq!(report.started_from, vec![("stats".to_owned(), Some(3))]);
    assert_eq!(report.folded_events, 0);
    assert_eq!(stats.by_type.get("turn/end"), Some(&3));
}

/// F-07-10.
#[test]
fn blob_vector_is_read_by_the_spill_store() {
    let (bytes, expected) = vector("spill-blob");
    let locator = expected["locator"].as_str().expect("locator");
    let hash = BlobHash::parse(locator).expect("locator parses");
    let payload = expected["payload"].as_str().expect("payload");
    assert_eq!(hash, BlobHash::of(payload.as_bytes()));
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let file_name = expected["file_name"].as_str().expect("file name");
    place(store.storage().as_ref(), file_name, &bytes);
    let spill = SpillStore::new(store.storage());
    assert_eq!(spill.get(&hash).expect("get"), payload.as_bytes());
    assert_eq!(spill.get_range(&hash, 4, 4).expect("range"), b"full");
    let info = spill.verify(&hash).expect("verify");
    assert_eq!(info.raw_bytes, expected["raw_bytes"]);
    assert_eq!(info.stored_bytes, bytes.len() as u64);
}
