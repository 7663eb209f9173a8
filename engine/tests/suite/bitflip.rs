//! Bit flips: every byte of a small, cleanly closed store's files is flipped in turn. Each
//! flip must be detected: a typed corruption error at open or read, or (for a flip in a seal,
//! past the last batch) a reported torn tail with every event intact. Never silent loss.

use crate::common;

use common::*;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::store::{Event, Options, Store};
use dshdb::Error;
use std::collections::BTreeMap;
use std::io::Write;

fn build_store() -> CrashImage {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    for session in 0..3 {
        let mut writer = store
            .create_session_with_id(&format!("s{session}"))
            .expect("create");
        for seq in 0..6 {
            let data = event_data(session, seq, 90 + 40 * seq as usize);
            writer.append(chunk(&data)).expect("append");
        }
    }
    store.close().expect("close");
    disk.durable_image()
}

fn contents(store: &Store) -> Result<BTreeMap<String, Vec<Event>>, Error> {
    let mut all = BTreeMap::new();
    for summary in store.sessions() {
        all.insert(summary.id.clone(), store.read(&summary.id, 0, u64::MAX)?);
    }
    Ok(all)
}

fn read_only() -> Options {
    Options {
        read_only: true,
        create_if_missing: false,
        // A checkpoint stands in for the sealed segments it covers; verification (this
        // test, `dshdb verify`) checks every frame instead.
        use_checkpoint: false,
        ..sim_options(Durability::Sync)
    }
}

#[test]
fn every_flipped_byte_is_detected() {
    let image = build_store();
    let original = contents(&open_sim(&SimStorage::from_image(&image), read_only()).expect("open"))
        .expect("read");
    assert_eq!(original.len(), 3);
    let names: Vec<String> = image.file_names().map(str::to_string).collect();
    let mut flips = 0u64;
    let mut files = 0;
    for name in names
        .iter()
        .filter(|name| name.starts_with("wal/") || *name == "MANIFEST")
    {
        files += 1;
        let length = image.clone().file_mut(name).map_or(0, |bytes| bytes.len());
        for index in 0..length {
            let mut damaged = image.clone();
            if let Some(bytes) = damaged.file_mut(name) {
                bytes[index] ^= 0x5a;
            }
            let disk = SimStorage::from_image(&damaged);
            let outcome = open_sim(&disk, read_only()).and_then(|store| {
                let torn = store.recovery_report().torn_tail.is_some();
                contents(&store).map(|all| (torn, all))
            });
            match outcome {
                Err(error) => assert!(
                    error.is_corruption(),
                    "{name} byte {index}: unexpected error kind {error}"
                ),
                Ok((torn, all)) => {
                    assert!(torn, "{name} byte {index}: flip went unnoticed");
                    assert_eq!(all, original, "{name} byte {index}: data changed silently");
                }
            }
            flips += 1;
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "bit flips checked: {flips} over {files} files"
    );
    assert!(
        files >= 3 && flips > 5_000,
        "too small a store: {flips} flips"
    );
}
