//! Spill artifact store (format-spec/07, F-07-10..F-07-14): content-addressed blobs,
//! DSH's preview sizing, range reads, damage is loud, collection keeps what events cite,
//! and a crash at every write/sync/rename never leaves an event citing a missing blob.

use crate::common;

use common::*;
use dshdb::compaction::{collect_spill, spill_references};
use dshdb::spill::{
    locators_in, preview_text, spill_tool_result, BlobHash, SpillStore, DSH_MAX_INLINE_BYTES,
    SPILL_DIR,
};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::store::{NewEvent, Store};
use dshdb::Error;
use serde_json::{json, Value};

fn text_of(bytes: usize) -> String {
    (0..bytes)
        .map(|index| char::from(b'a' + (index % 23) as u8))
        .collect()
}

fn tool_result(text: &str) -> String {
    json!({"turn": 1, "step": 1, "message": {"role": "user", "id": "r1",
        "source": {"kind": "tool", "callId": "c1"},
        "content": [{"type": "tool-result", "toolCallId": "c1",
                     "content": [{"type": "text", "text": text}]}]}})
    .to_string()
}

fn store_on(disk: &SimStorage) -> Store {
    open_sim(disk, sim_options(Durability::Sync)).expect("open")
}

/// F-07-10, F-07-11: put/get round trip, dedup, byte ranges.
#[test]
fn blobs_round_trip_dedup_and_read_by_range() {
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let spill = SpillStore::new(store.storage());
    let payload = text_of(200_000).into_bytes();
    let hash = spill.put(&payload).expect("put");
    assert_eq!(hash, BlobHash::of(&payload));
    assert_eq!(spill.put(&payload).expect("second put"), hash, "dedup");
    assert_eq!(spill.list().expect("list").len(), 1);
    assert_eq!(spill.get(&hash).expect("get"), payload);
    for (offset, length) in [
        (0, 10),
        (199_990, 100),
        (5, 0),
        (65_536, 70_000),
        (300_000, 5),
    ] {
        let start = (offset as usize).min(payload.len());
        let end = (start + length as usize).min(payload.len());
        let range = spill.get_range(&hash, offset, length).expect("range");
        assert_eq!(range, payload[start..end], "range {offset}+{length}");
    }
    let info = &spill.list().expect("list")[0];
    assert_eq!(info.raw_bytes, 200_000);
    assert!(
        info.stored_bytes < 20_000,
        "compressed: {}",
        info.stored_bytes
    );
    assert_eq!(BlobHash::parse(&hash.locator()), Some(hash));
    assert_eq!(locators_in(&format!("x {} y", hash.locator())), vec![hash]);
}

/// F-07-10: any flipped byte of a blob is a loud typed error, never wrong bytes.
#[test]
fn a_damaged_blob_is_a_typed_error() {
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let storage = store.storage();
    let spill = SpillStore::new(storage.clone());
    let hash = spill.put(text_of(5_000).as_bytes()).expect("put");
    let path = format!("{SPILL_DIR}/{}", hash.to_hex());
    let original = storage
        .open_read(&path)
        .expect("open")
        .read_all()
        .expect("read");
    for index in 0..original.len() {
        let mut damaged = original.clone();
        damaged[index] ^= 0x01;
        storage
            .open(&path, false)
            .expect("open")
            .write_at(&damaged, 0)
            .expect("write");
        let result = spill.get(&hash);
        assert!(
            matches!(result, Err(Error::Spill { .. })),
            "byte {index}: {result:?}"
        );
        assert!(result.is_err_and(|error| error.is_corruption()));
    }
    let missing = BlobHash::of(b"never stored");
    assert!(matches!(spill.get(&missing), Err(Error::Spill { .. })));
}

/// F-07-12: DSH's preview sizing: reserve = notice at the full total + 2, head ceil(budget/2),
/// tail floor(budget/2), `\n\n` and the notice at the omitted count; fits the limit.
#[test]
fn tool_results_above_the_limit_keep_dsh_preview_and_locator() {
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let spill = SpillStore::new(store.storage());
    let full = text_of(120_000);
    let spilled = spill_tool_result(&spill, &tool_result(&full), DSH_MAX_INLINE_BYTES)
        .expect("spill")
        .expect("spilled");
    let data: Value = serde_json::from_str(&spilled.data).expect("json");
    let text = data["message"]["content"][0]["content"][0]["text"]
        .as_str()
        .expect("text");
    assert!(text.len() <= DSH_MAX_INLINE_BYTES);
    let locator = spilled.hash.locator();
    let notice_full = format!(
        "(Omitted 120000 bytes. Full formatted result stored at: {locator}. {})",
        dshdb::spill::RETRIEVAL_HINT
    );
    let budget = DSH_MAX_INLINE_BYTES - (notice_full.len() + 2);
    let head = budget.div_ceil(2);
    let tail = budget / 2;
    assert!(text.starts_with(&full[..head]));
    let omitted = 120_000 - head - tail;
    let expected_end = format!(
        "{}\n\n(Omitted {omitted} bytes. Full formatted result stored at: {locator}. {})",
        &full[full.len() - tail..],
        dshdb::spill::RETRIEVAL_HINT
    );
    assert!(text.ends_with(&expected_end));
    assert_eq!(text.len(), head + expected_end.len());
    assert_eq!(spill.get(&spilled.hash).expect("get"), full.as_bytes());
    assert_eq!(data["message"]["id"], "r1", "everything else kept");
    // At the limit, not above it: nothing spilled. Not plain text: nothing spilled.
    let small = tool_result(&text_of(DSH_MAX_INLINE_BYTES));
    assert!(spill_tool_result(&spill, &small, DSH_MAX_INLINE_BYTES)
        .expect("small")
        .is_none());
    let image = tool_result(&full).replace("\"type\":\"text\"", "\"type\":\"image\"");
    assert!(spill_tool_result(&spill, &image, DSH_MAX_INLINE_BYTES)
        .expect("image")
        .is_none());
}

/// Multi-byte text: the preview is cut on UTF-8 boundaries.
#[test]
fn preview_respects_utf8_boundaries() {
    let full: String = "é😀".repeat(5_000);
    let (text, kept) = preview_text(&full, "dshdb-spill:x", 800).expect("fits");
    assert!(text.len() <= 800);
    assert!(kept > 0 && kept < full.len());
}

/// F-07-13, F-07-14: collection keeps cited blobs (including those only a fork's parent
/// prefix cites) and removes the rest and leftover temp files.
#[test]
fn gc_keeps_cited_blobs_and_removes_the_rest() {
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let spill = SpillStore::new(store.storage());
    let cited = spill.put(b"cited payload").expect("put");
    let orphan = spill.put(b"orphan payload").expect("put");
    let mut writer = store.create_session_with_id("parent").expect("create");
    let data = json!({"note": cited.locator()}).to_string();
    writer
        .append(NewEvent::new("plugin/note", &data))
        .expect("append");
    drop(writer);
    drop(store.fork("parent", 0, "child").expect("fork"));
    let temp = format!("{SPILL_DIR}/{}.tmp", orphan.to_hex());
    store.storage().open(&temp, true).expect("temp");
    // Blobs put in this process are pending until cited: a collection keeps them.
    let report = collect_spill(&store, &SpillStore::new(store.storage())).expect("gc");
    assert!(report.removed.is_empty(), "pending puts survive");
    assert_eq!(report.temp_removed, 1);
    store.storage().open(&temp, true).expect("temp again");
    // Another process (a reopened store on the same disk) collects the orphan.
    drop(spill);
    store.close().expect("close");
    drop(store);
    let store = store_on(&disk);
    let spill = SpillStore::new(store.storage());
    let collector = SpillStore::new(store.storage());
    let report = collect_spill(&store, &collector).expect("gc");
    assert_eq!(report.removed, vec![orphan]);
    assert_eq!(report.kept, 1);
    assert_eq!(report.temp_removed, 1);
    assert!(spill.get(&cited).is_ok());
    assert!(matches!(spill.get(&orphan), Err(Error::Spill { .. })));
    assert!(spill_references(&store).expect("refs").contains(&cited));
    // The putting handle protects its own unreferenced puts from its own collection.
    let fresh = spill.put(b"just put").expect("put");
    let report = collect_spill(&store, &spill).expect("gc");
    assert!(report.removed.is_empty());
    assert!(spill.get(&fresh).is_ok());
}

/// Put a blob, then append an event citing it; returns whether the append was acknowledged.
fn spill_then_cite(disk: &SimStorage) -> bool {
    let Ok(store) = open_sim(disk, sim_options(Durability::Sync)) else {
        return false;
    };
    let spill = SpillStore::new(store.storage());
    let Ok(hash) = spill.put(text_of(70_000).as_bytes()) else {
        return false;
    };
    let Ok(mut writer) = store.create_session_with_id("s") else {
        return false;
    };
    let data = json!({"locator": hash.locator()}).to_string();
    writer.append(NewEvent::new("plugin/note", &data)).is_ok()
}

/// F-07-11: at every crash point of put + cite, an event that survived cites a blob that
/// reads back whole; an acknowledged event always survives; collection then tidies up.
#[test]
fn crash_at_every_point_never_leaves_a_dangling_locator() {
    let reference = SimStorage::new();
    assert!(spill_then_cite(&reference));
    let operations = reference.operation_count();
    let mut checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let acknowledged = spill_then_cite(&disk);
        let images = disk.take_crash_images();
        for image in &images {
            let recovered = SimStorage::from_image(image);
            let store = open_sim(&recovered, sim_options(Durability::Sync)).expect("reopen");
            let spill = SpillStore::new(store.storage());
            let events = store.read("s", 0, 10).unwrap_or_default();
            assert!(!acknowledged || events.len() == 1, "cut {cut}: ack lost");
            for event in &events {
                for hash in locators_in(&event.data) {
                    let payload = spill.get(&hash).expect("cited blob readable");
                    assert_eq!(payload.len(), 70_000, "cut {cut}");
                }
            }
            let report = collect_spill(&store, &spill).expect("gc after crash");
            let left: Vec<String> = recovered.list(SPILL_DIR).expect("list");
            assert!(left.iter().all(|name| !name.ends_with(".tmp")), "cut {cut}");
            assert_eq!(report.kept, events.len(), "cut {cut}");
            checked += 1;
        }
    }
    assert!(checked > 10, "enumerated {checked} images");
}

/// F-07-19: a canonical export carries the blobs its events cite; the import stores them
/// before the events; a tampered blob line is refused and leaves nothing behind.
#[test]
fn canonical_export_carries_cited_blobs() {
    use dshdb::exchange::export_canonical;
    use dshdb::exchange::spill_lines::{import_canonical_with_spill, write_spill_lines};
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let spill = SpillStore::new(store.storage());
    let full = text_of(80_000);
    let spilled = spill_tool_result(&spill, &tool_result(&full), DSH_MAX_INLINE_BYTES)
        .expect("spill")
        .expect("spilled");
    let mut writer = store.create_session_with_id("s").expect("create");
    let envelope = "\"surfaceOp\":\"append\"";
    writer
        .append(NewEvent {
            envelope,
            ..NewEvent::new("tool/result", &spilled.data)
        })
        .expect("append");
    drop(writer);
    let mut exported = export_canonical(&store, "s").expect("export");
    assert_eq!(
        write_spill_lines(&store, "s", &mut exported).expect("blobs"),
        1
    );
    let other = store_on(&SimStorage::new());
    let imported = import_canonical_with_spill(&other, &exported, &mut |_, _| {}).expect("import");
    assert_eq!(imported.events, 1);
    let copy = SpillStore::new(other.storage());
    assert_eq!(
        copy.get(&spilled.hash).expect("blob travelled"),
        full.as_bytes()
    );
    // Tampered payload: refused, nothing written.
    let text = String::from_utf8(exported.clone()).expect("utf-8");
    let (events_part, blob_line) = text.trim_end().rsplit_once('\n').expect("blob line");
    let tampered = format!(
        "{events_part}\n{}\n",
        blob_line.replacen("abcdefg", "abcdefh", 1)
    );
    let tampered = tampered.into_bytes();
    let third = store_on(&SimStorage::new());
    let refused = import_canonical_with_spill(&third, &tampered, &mut |_, _| {});
    assert!(matches!(
        refused,
        Err(dshdb::exchange::CanonicalError::Malformed { .. })
    ));
    assert!(third.sessions().is_empty());
    assert!(SpillStore::new(third.storage())
        .list()
        .expect("list")
        .is_empty());
    // Refused events: the blobs the import brought are dropped again.
    let bad_events = text
        .replacen("\"type\":\"tool/result\"", "\"type\":\"\"", 1)
        .into_bytes();
    let fourth = store_on(&SimStorage::new());
    assert!(import_canonical_with_spill(&fourth, &bad_events, &mut |_, _| {}).is_err());
    assert!(SpillStore::new(fourth.storage())
        .list()
        .expect("list")
        .is_empty());
}

/// F-07-14: a power cut at every step of a collection never removes a cited blob; a later
/// collection finishes the job.
#[test]
fn crash_at_every_point_of_a_collection_keeps_cited_blobs() {
    let base = SimStorage::new();
    let cited = {
        let store = store_on(&base);
        let spill = SpillStore::new(store.storage());
        let cited = spill.put(b"cited").expect("put");
        spill.put(b"orphan one").expect("put");
        spill.put(b"orphan two").expect("put");
        store
            .storage()
            .open(&format!("{SPILL_DIR}/leftover.tmp"), true)
            .expect("temp");
        let mut writer = store.create_session_with_id("s").expect("create");
        let data = json!({"locator": cited.locator()}).to_string();
        writer
            .append(NewEvent::new("plugin/note", &data))
            .expect("append");
        drop(writer);
        store.close().expect("close");
        cited
    };
    let image = base.durable_image();
    let collect = |disk: &SimStorage| {
        let Ok(store) = open_sim(disk, sim_options(Durability::Sync)) else {
            return;
        };
        let _ = collect_spill(&store, &SpillStore::new(store.storage()));
    };
    let reference = SimStorage::from_image(&image);
    collect(&reference);
    let operations = reference.operation_count();
    for cut in 0..operations + 2 {
        let disk = SimStorage::from_image(&image);
        disk.crash_at(disk.operation_count() + cut);
        collect(&disk);
        let images = disk.take_crash_images();
        for crashed in &images {
            let recovered = SimStorage::from_image(crashed);
            let store = store_on(&recovered);
            let spill = SpillStore::new(store.storage());
            assert!(spill.get(&cited).is_ok(), "cut {cut}: cited blob kept");
            collect_spill(&store, &spill).expect("finish collection");
            assert_eq!(spill.list().expect("list").len(), 1, "cut {cut}");
        }
    }
}

/// F-01-3: a read-only handle reads blobs and refuses every write.
#[test]
fn read_only_handles_refuse_writes() {
    let disk = SimStorage::new();
    let store = store_on(&disk);
    let hash = SpillStore::new(store.storage()).put(b"kept").expect("put");
    store.close().expect("close");
    drop(store);
    let options = dshdb::store::Options {
        read_only: true,
        ..dshdb::store::Options::default()
    };
    let reader = open_sim(&disk, options).expect("read-only open");
    let spill = SpillStore::new_read_only(reader.storage());
    assert_eq!(spill.get(&hash).expect("get"), b"kept");
    assert!(matches!(spill.put(b"new"), Err(Error::ReadOnly)));
    assert!(matches!(
        spill.gc(&Default::default()),
        Err(Error::ReadOnly)
    ));
    let writable_handle = SpillStore::new(reader.storage());
    assert!(matches!(
        collect_spill(&reader, &writable_handle),
        Err(Error::ReadOnly)
    ));
    assert_eq!(spill.list().expect("list").len(), 1);
}
