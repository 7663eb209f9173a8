//! Projection cache (format-spec/07, F-07-1..F-07-9): a cold read from checkpoints equals a
//! fold from scratch on every DSH fixture and on generated sessions; a missing, stale,
//! foreign, ahead-of-log or damaged checkpoint (every byte flipped in turn) is discarded and
//! rebuilt with the same result.

use crate::common;
use crate::common::dsh_fixtures;

use common::*;
use dsh_fixtures::*;
use dshdb::derive::cache::{session_cache_dir, Builtins, CacheOptions, ProjectionCache};
use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent};
use dshdb::derive::projection::{
    fold_from_scratch, MessagesUnit, ProjectionUnit, StatsUnit, SurfaceUnit, TokenEncoding,
    TokenMeterUnit, TurnIndexUnit,
};
use dshdb::exchange::{import_dsh_jsonl, session_events};
use dshdb::session::SessionEvent;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::store::{Options, Store};
use std::fs;

fn new_store(disk: &SimStorage) -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(disk, options).expect("open sim store")
}

fn cache(store: &Store, every_events: u64) -> ProjectionCache {
    ProjectionCache::new(store, CacheOptions { every_events })
}

/// Asserts that `cached` equals the from-scratch fold of `events` for every built-in unit.
fn assert_equals_scratch(cached: &Builtins, events: &[SessionEvent], context: &str) {
    let surface = fold_from_scratch(&SurfaceUnit, events).expect("surface folds");
    assert!(cached.surface == surface, "{context}: surface differs");
    let messages = fold_from_scratch(&MessagesUnit, events).expect("messages fold");
    assert_eq!(cached.messages, messages, "{context}: messages differ");
    let surface_texts: Vec<&str> = surface
        .derive_message_texts()
        .iter()
        .map(|raw| raw.get())
        .collect();
    assert_eq!(cached.messages.message_texts(), surface_texts, "{context}");
    let tokens = fold_from_scratch(&TokenMeterUnit::default(), events).expect("tokens fold");
    assert_eq!(cached.tokens, tokens, "{context}: tokens differ");
    let stats = fold_from_scratch(&StatsUnit, events).expect("stats fold");
    assert_eq!(cached.stats, stats, "{context}: stats differ");
    let turns = fold_from_scratch(&TurnIndexUnit, events).expect("turns fold");
    assert_eq!(cached.turns, turns, "{context}: turns differ");
    assert_eq!(cached.length, events.len() as u64, "{context}");
}

/// Imports every fixture that DSH accepts and whose surface folds; returns (store, ids).
fn fixture_store(disk: &SimStorage) -> (Store, Vec<String>) {
    let store = new_store(disk);
    let mut ids = Vec::new();
    for name in case_names() {
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("fixture readable");
        let Ok(report) = import_dsh_jsonl(&store, &bytes) else {
            continue;
        };
        let events = session_events(&store, &report.session_id).expect("events decode");
        if fold_from_scratch(&SurfaceUnit, &events).is_ok() {
            ids.push(report.session_id);
        }
    }
    assert!(ids.len() >= 10, "most fixtures fold: {ids:?}");
    (store, ids)
}

/// F-07-6: cold read = newest checkpoint + tail, equal to the fold from scratch.
#[test]
fn fixtures_cold_read_from_checkpoints_equals_fold_from_scratch() {
    if !dsh_fixtures::present() {
        return;
    }
    let disk = SimStorage::new();
    let (store, ids) = fixture_store(&disk);
    let cache = cache(&store, 1);
    for id in &ids {
        let events = session_events(&store, id).expect("events");
        let (first, report) = cache.read_builtins(id).expect("first read");
        assert_equals_scratch(&first, &events, id);
        assert!(
            report.started_from.iter().all(|(_, seq)| seq.is_none()),
            "{id}"
        );
        if events.is_empty() {
            continue;
        }
        assert!(report.written, "{id}: checkpoints written");
        let (second, report) = cache.read_builtins(id).expect("second read");
        assert_equals_scratch(&second, &events, id);
        assert_eq!(report.folded_events, 0, "{id}: nothing left to fold");
        let expected = Some(events.len() as u64);
        assert!(
            report.started_from.iter().all(|(_, seq)| *seq == expected),
            "{id}"
        );
    }
}

fn append_turns(store: &Store, id: &str, turns: std::ops::Range<u64>) {
    let mut writer = store.writer(id).expect("writer");
    for turn in turns {
        let owned: Vec<OwnedEvent> = turn_events(turn, 64);
        let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
        writer.append_batch(&events).expect("append turn");
    }
}

fn generated_session(store: &Store, id: &str, turns: u64) {
    drop(store.create_session_with_id(id).expect("create"));
    append_turns(store, id, 1..turns + 1);
}

/// F-07-6: only the tail past the checkpoint is folded.
#[test]
fn cold_read_folds_only_the_tail() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "s", 20);
    let cache = cache(&store, 10);
    let (_, report) = cache.read_builtins("s").expect("read");
    assert_eq!(report.folded_events, 240);
    append_turns(&store, "s", 21..23);
    let (cached, report) = cache.read_builtins("s").expect("read tail");
    assert_eq!(report.folded_events, 24, "only the two new turns");
    let events = session_events(&store, "s").expect("events");
    assert_equals_scratch(&cached, &events, "tail");
    assert_eq!(cached.turns.turns.len(), 22);
    assert_eq!(cached.turns.steps.len(), 44);
    let last_steps = cached.turns.steps_of(21);
    assert_eq!(last_steps.len(), 2);
    assert_eq!(last_steps[0].start_seq, 21 * 12 + 2);
    assert_eq!(cached.stats.usage.get("inputTokens"), Some(&(22 * 250)));
    assert!(cached.tokens.total > 0);
}

fn checkpoint_files(store: &Store, id: &str) -> Vec<String> {
    let dir = session_cache_dir(id);
    let mut names = store.storage().list(&dir).expect("list cache");
    names.sort();
    names
        .into_iter()
        .map(|name| format!("{dir}/{name}"))
        .collect()
}

fn read_file(storage: &dyn Storage, path: &str) -> Vec<u8> {
    storage
        .open_read(path)
        .expect("open")
        .read_all()
        .expect("read")
}

fn write_file(storage: &dyn Storage, path: &str, bytes: &[u8]) {
    let file = storage.open(path, true).expect("open for write");
    file.set_len(0).expect("truncate");
    file.write_at(bytes, 0).expect("write");
}

/// F-07-2, F-07-7: flip every byte of one checkpoint in turn: each time it is discarded and
/// the read still equals the fold from scratch; the store keeps opening.
#[test]
fn every_flipped_byte_of_a_checkpoint_is_discarded_and_rebuilt() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "s", 3);
    let cache = cache(&store, 1);
    cache.read_builtins("s").expect("write checkpoints");
    let events = session_events(&store, "s").expect("events");
    let storage = store.storage();
    let target = checkpoint_files(&store, "s")
        .into_iter()
        .find(|path| path.contains("/turns-"))
        .expect("turns checkpoint");
    let original = read_file(storage.as_ref(), &target);
    for index in 0..original.len() {
        let mut damaged = original.clone();
        damaged[index] ^= 0x5a;
        write_file(storage.as_ref(), &target, &damaged);
        let (cached, report) = cache.read_builtins("s").expect("read despite damage");
        assert!(report.discarded >= 1, "byte {index}: damage detected");
        assert_equals_scratch(&cached, &events, &format!("byte {index}"));
        write_file(storage.as_ref(), &target, &original);
    }
    drop(cache);
    drop(store);
    assert!(open_sim(&disk, sim_options(Durability::Sync)).is_ok());
}

/// F-07-3, F-07-4, F-07-8: foreign, stale-version, ahead-of-log and truncated checkpoints
/// are discarded.
#[test]
fn foreign_stale_ahead_and_truncated_checkpoints_are_discarded() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "a", 3);
    generated_session(&store, "b", 3);
    let cache = cache(&store, 1);
    cache.read_builtins("a").expect("checkpoint a");
    let storage = store.storage();
    let events_b = session_events(&store, "b").expect("events b");
    let dir_b = session_cache_dir("b");
    storage.create_dir(&dir_b).expect("dir");
    // Foreign: a's checkpoints copied under b's directory (same names and seqs).
    for path in checkpoint_files(&store, "a") {
        let name = path.rsplit('/').next().expect("name");
        let bytes = read_file(storage.as_ref(), &path);
        write_file(storage.as_ref(), &format!("{dir_b}/{name}"), &bytes);
    }
    let (cached, report) = cache.read_builtins("b").expect("read b");
    assert_eq!(report.discarded, 5, "all five foreign checkpoints");
    assert_equals_scratch(&cached, &events_b, "foreign");
    // Stale version and ahead of the log: renamed copies of b's own checkpoints.
    for path in checkpoint_files(&store, "b") {
        let bytes = read_file(storage.as_ref(), &path);
        let stale = path.replace("-v1-", "-v0-").replace("-v2-", "-v0-");
        write_file(storage.as_ref(), &stale, &bytes);
        let ahead = path.replace("-00000000000000000036", "-00000000000000000999");
        write_file(storage.as_ref(), &ahead, &bytes);
    }
    let (cached, report) = cache.read_builtins("b").expect("read b again");
    assert_eq!(report.discarded, 10, "five stale, five ahead");
    assert_equals_scratch(&cached, &events_b, "stale/ahead");
    // Truncated: every checkpoint cut in half.
    for path in checkpoint_files(&store, "b") {
        let bytes = read_file(storage.as_ref(), &path);
        write_file(storage.as_ref(), &path, &bytes[..bytes.len() / 2]);
    }
    let (cached, report) = cache.read_builtins("b").expect("read truncated");
    assert_eq!(report.discarded, 5);
    assert_equals_scratch(&cached, &events_b, "truncated");
}

/// F-07-4: a checkpoint whose anchor event differs (another log with the same id and header
/// re-created after the checkpoint) is discarded.
#[test]
fn checkpoint_not_anchored_on_the_log_is_discarded() {
    let disk_a = SimStorage::new();
    let store_a = new_store(&disk_a);
    let header = r#"{"version":0,"id":"s","createdAt":1}"#;
    drop(store_a.create_session(header).expect("create"));
    append_turns(&store_a, "s", 1..4);
    cache(&store_a, 1).read_builtins("s").expect("checkpoint");
    let disk_b = SimStorage::new();
    let store_b = new_store(&disk_b);
    drop(store_b.create_session(header).expect("create"));
    append_turns(&store_b, "s", 11..14);
    for path in checkpoint_files(&store_a, "s") {
        let bytes = read_file(store_a.storage().as_ref(), &path);
        store_b
            .storage()
            .create_dir(&session_cache_dir("s"))
            .expect("dir");
        write_file(store_b.storage().as_ref(), &path, &bytes);
    }
    let (cached, report) = cache(&store_b, 1).read_builtins("s").expect("read");
    assert_eq!(report.discarded, 5);
    let events = session_events(&store_b, "s").expect("events");
    assert_equals_scratch(&cached, &events, "unanchored");
}

/// F-07-9: a read-only store reads through the cache and writes nothing.
#[test]
fn read_only_store_reads_checkpoints_and_writes_none() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "s", 4);
    store.close().expect("close");
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    let reader = open_sim(&disk, options).expect("read-only open");
    let (cached, report) = cache(&reader, 1).read_builtins("s").expect("read");
    assert!(!report.written);
    assert!(checkpoint_files(&reader, "s").is_empty());
    let events = session_events(&reader, "s").expect("events");
    assert_equals_scratch(&cached, &events, "read-only");
}

/// F-07-1: the token meter's encoding is part of the unit name, so a meter with another
/// encoding never reads the default one's checkpoint.
#[test]
fn token_encoding_is_part_of_the_checkpoint_identity() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "s", 2);
    let cache = cache(&store, 1);
    let o200k = TokenMeterUnit::new(TokenEncoding::O200kBase);
    let cl100k = TokenMeterUnit::new(TokenEncoding::Cl100kBase);
    let (first, _) = cache.read("s", &o200k).expect("o200k");
    let (second, report) = cache.read("s", &cl100k).expect("cl100k");
    assert_eq!(report.started_from, vec![(cl100k.name(), None)]);
    let events = session_events(&store, "s").expect("events");
    assert_eq!(second, fold_from_scratch(&cl100k, &events).expect("fold"));
    assert_eq!(first.nodes.len(), second.nodes.len());
    assert_eq!(o200k.text_tokens("hello world"), 2);
}

/// F-07-8: on a live session, checkpoints follow `turn/end` once it is durable.
#[test]
fn live_checkpoints_follow_durable_turn_ends() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    drop(store.create_session_with_id("s").expect("create"));
    let cache = cache(&store, 1000);
    let mut writer = store.writer("s").expect("writer");
    let owned = turn_events(1, 32);
    let (head, tail) = owned.split_at(5);
    for part in [head, tail] {
        let events: Vec<_> = part.iter().map(OwnedEvent::as_new_event).collect();
        let types: Vec<&str> = part.iter().map(|event| event.event_type.as_str()).collect();
        let receipt = writer.append_batch(&events).expect("append");
        let written = cache.note_appended("s", &receipt, &types).expect("note");
        assert_eq!(
            written,
            types.contains(&"turn/end"),
            "written only at turn/end"
        );
    }
    let files = checkpoint_files(&store, "s");
    assert_eq!(files.len(), 5);
    assert!(files
        .iter()
        .all(|path| path.ends_with("-00000000000000000012.ckpt")));
    let (_, report) = cache.read_builtins("s").expect("read");
    assert_eq!(report.folded_events, 0);
}

/// Readers on several threads while the session grows: every read is a consistent prefix
/// fold, and the final read equals the fold from scratch.
#[test]
fn concurrent_readers_while_appending() {
    let disk = SimStorage::new();
    let store = new_store(&disk);
    generated_session(&store, "s", 2);
    let cache = cache(&store, 5);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for _ in 0..20 {
                    let (cached, _) = cache.read_builtins("s").expect("read");
                    assert_eq!(cached.stats.events, cached.length);
                    assert_eq!(cached.turns.next_seq, cached.length);
                }
            });
        }
        append_turns(&store, "s", 3..12);
    });
    let (cached, _) = cache.read_builtins("s").expect("final read");
    let events = session_events(&store, "s").expect("events");
    assert_equals_scratch(&cached, &events, "concurrent");
}

/// Buffered appends and cache reads: one store open, three turns, a cache read (which must
/// flush before it checkpoints), one more turn left unflushed.
fn buffered_workload(disk: &SimStorage) {
    let Ok(store) = open_sim(disk, sim_options(Durability::Buffered)) else {
        return;
    };
    let cache = cache(&store, 1);
    let Ok(mut writer) = store.create_session_with_id("s") else {
        return;
    };
    for turn in 1..=3 {
        let owned = turn_events(turn, 64);
        let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
        if writer.append_batch(&events).is_err() {
            return;
        }
    }
    let _ = cache.read_builtins("s");
    let owned = turn_events(4, 64);
    let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
    let _ = writer.append_batch(&events);
}

/// F-07-5: with buffered appends, a power cut at every point never leaves a checkpoint
/// ahead of the recovered log, and the cache then reads the fold from scratch.
#[test]
fn crash_at_every_point_never_leaves_a_checkpoint_ahead_of_the_log() {
    let reference = SimStorage::new();
    buffered_workload(&reference);
    let operations = reference.operation_count();
    let mut checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        buffered_workload(&disk);
        let images = disk.take_crash_images();
        for image in &images {
            let recovered = SimStorage::from_image(image);
            let store = open_sim(&recovered, sim_options(Durability::Sync)).expect("reopen");
            let Ok(summary) = store.session("s") else {
                continue;
            };
            for path in checkpoint_files(&store, "s") {
                let bytes = read_file(store.storage().as_ref(), &path);
                if let Ok(checkpoint) = dshdb::derive::cache::decode_checkpoint(&bytes) {
                    assert!(
                        checkpoint.seq <= summary.events,
                        "cut {cut}: ahead of the log"
                    );
                }
            }
            let (cached, _) = cache(&store, 1).read_builtins("s").expect("read");
            let events = session_events(&store, "s").expect("events");
            assert_equals_scratch(&cached, &events, &format!("cut {cut}"));
            checked += 1;
        }
    }
    assert!(checked > 10, "enumerated {checked} images");
}
