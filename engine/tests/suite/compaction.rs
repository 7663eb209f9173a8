//! Compaction transactions and the pruner (model §5, §8; format-spec/07 F-07-15..F-07-18):
//! DSH's region validation, lock and owner rules, the four events as one atomic batch (a crash
//! at every point leaves all four or none), region selection by token budget, the pruner's
//! exact cut, and DSH-valid logs that round-trip through export.

use crate::common;
use crate::common::dsh_fixtures;

use common::*;
use dshdb::compaction::{
    compact, measure_content, prune_content, prune_session, select_compactable_range,
    CompactionErrorCode, CompactionOwner, PrunerConfig, SummaryInput, CHECKPOINT_PREAMBLE,
    PRUNE_MARKER,
};
use dshdb::derive::cache::{CacheOptions, ProjectionCache};
use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent, APPEND};
use dshdb::derive::projection::{fold_from_scratch, SurfaceUnit};
use dshdb::exchange::{export_dsh_jsonl, import_dsh_jsonl, session_events};
use dshdb::spill::SpillStore;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Store};
use dshdb::Error;
use serde_json::{json, Value};

const TEXT_BYTES: usize = 400;

fn append_owned(store: &Store, id: &str, owned: &[OwnedEvent]) {
    let mut writer = store.writer(id).expect("writer");
    let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
    writer.append_batch(&events).expect("append");
}

fn session_with_turns(store: &Store, id: &str, turns: u64) {
    drop(store.create_session_with_id(id).expect("create"));
    for turn in 1..=turns {
        append_owned(store, id, &turn_events(turn, TEXT_BYTES));
    }
}

fn sim_store(disk: &SimStorage) -> Store {
    open_sim(disk, sim_options(Durability::Sync)).expect("open")
}

fn summary() -> SummaryInput {
    SummaryInput::text("The user ran tools; all went fine.", "p", "m")
}

fn code_of(result: &Result<impl std::fmt::Debug, Error>) -> Option<CompactionErrorCode> {
    match result {
        Err(Error::Compaction { code, .. }) => Some(*code),
        _ => None,
    }
}

/// F-07-15: the four events, in order, with DSH's framing and provenance; the surface
/// shows the checkpoint in place of the span; cached state equals a fold from scratch.
#[test]
fn compact_commits_four_events_and_rewrites_the_surface() {
    let disk = SimStorage::new();
    let store = sim_store(&disk);
    session_with_turns(&store, "s", 5);
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let (before, _) = cache.read_builtins("s").expect("read");
    let nodes = before.surface.nodes();
    assert_eq!(nodes.len(), 20, "four nodes per turn");
    let mut writer = store.writer("s").expect("writer");
    let result = compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[11],
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("compact");
    assert_eq!(result.start_seq, 60);
    assert_eq!(result.end_seq, 63);
    assert_eq!(result.shadowed_seqs, nodes[..12].to_vec());
    let events = store.read("s", 60, 64).expect("read batch");
    let types: Vec<&str> = events
        .iter()
        .map(|event| event.event_type.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end"
        ]
    );
    let start: Value = serde_json::from_str(&events[0].data).expect("json");
    assert_eq!(start["turn"], Value::Null);
    assert_eq!(start["compactionId"], result.compaction_id.as_str());
    let summary_data: Value = serde_json::from_str(&events[1].data).expect("json");
    assert_eq!(
        summary_data["shadowedRange"],
        json!({"start": nodes[0], "end": nodes[11]})
    );
    assert_eq!(
        summary_data["shadowedTokenCount"],
        result.shadowed_token_count
    );
    let checkpoint: Value = serde_json::from_str(&events[2].data).expect("json");
    assert_eq!(
        checkpoint["content"][0]["text"],
        format!("{CHECKPOINT_PREAMBLE}\n\n<compacted-summary>")
    );
    assert_eq!(checkpoint["content"][2]["text"], "</compacted-summary>");
    assert_eq!(checkpoint["source"]["plugin"], "compact");
    let mut sources = vec![60, 61];
    sources.extend(&nodes[..12]);
    assert!(events[2].envelope.contains(&format!(
        "\"sourceEventSeqs\":{}",
        serde_json::to_string(&sources).expect("json")
    )));
    let (after, _) = cache.read_builtins("s").expect("read after");
    let mut expected_nodes = vec![62];
    expected_nodes.extend(&nodes[12..]);
    assert_eq!(after.surface.nodes(), expected_nodes);
    assert_eq!(after.surface.replace_generation(), 1);
    assert!(after.tokens.total < before.tokens.total);
    let all = session_events(&store, "s").expect("events");
    assert!(after.surface == fold_from_scratch(&SurfaceUnit, &all).expect("fold"));
    // Nested: a second compaction may shadow the checkpoint itself.
    let again = compact(
        &cache,
        &mut writer,
        62,
        nodes[15],
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("nested compaction");
    assert_eq!(again.shadowed_seqs[0], 62);
}

/// F-07-16: DSH's refusals, each leaving the log untouched.
#[test]
fn refused_compactions_append_nothing() {
    let disk = SimStorage::new();
    let store = sim_store(&disk);
    session_with_turns(&store, "s", 3);
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let nodes = cache.read_builtins("s").expect("read").0.surface.nodes();
    let mut writer = store.writer("s").expect("writer");
    let manual = CompactionOwner::Manual;
    // End right after the assistant's tool call: splits a call/result pair.
    let split = compact(&cache, &mut writer, nodes[0], nodes[1], manual, &summary());
    assert_eq!(code_of(&split), Some(CompactionErrorCode::Region));
    assert!(split.is_err_and(|error| error.to_string().contains("is not a balanced boundary")));
    let missing = compact(&cache, &mut writer, 999, nodes[3], manual, &summary());
    assert_eq!(code_of(&missing), Some(CompactionErrorCode::Region));
    let reversed = compact(&cache, &mut writer, nodes[3], nodes[0], manual, &summary());
    assert_eq!(code_of(&reversed), Some(CompactionErrorCode::Region));
    let huge = SummaryInput::text(&"word ".repeat(5_000), "p", "m");
    let too_big = compact(&cache, &mut writer, nodes[0], nodes[3], manual, &huge);
    assert_eq!(code_of(&too_big), Some(CompactionErrorCode::Summary));
    let automatic = compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[3],
        CompactionOwner::OpenTurn,
        &summary(),
    );
    assert_eq!(code_of(&automatic), Some(CompactionErrorCode::Busy));
    assert_eq!(
        store.session("s").expect("session").events,
        36,
        "nothing appended"
    );
    // An open turn blocks manual compaction; automatic compaction is owned by it.
    writer
        .append(NewEvent::new("turn/start", r#"{"turn":4}"#))
        .expect("open turn");
    let busy = compact(&cache, &mut writer, nodes[0], nodes[3], manual, &summary());
    assert_eq!(code_of(&busy), Some(CompactionErrorCode::Busy));
    let owned = compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[3],
        CompactionOwner::OpenTurn,
        &summary(),
    )
    .expect("automatic compaction");
    let start: Value =
        serde_json::from_str(&store.get("s", owned.start_seq).expect("get").data).expect("json");
    assert_eq!(start["turn"], 4);
}

/// Model §5.4: an interrupted DSH bracket (imported orphan `compaction/start`) is live and
/// blocks compaction until a `session/end-seed` makes it stale.
#[test]
fn interrupted_brackets_are_detected() {
    let disk = SimStorage::new();
    let store = sim_store(&disk);
    session_with_turns(&store, "s", 3);
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let mut writer = store.writer("s").expect("writer");
    writer
        .append(NewEvent::new(
            "compaction/start",
            r#"{"compactionId":"x","turn":null}"#,
        ))
        .expect("orphan");
    let (builtins, _) = cache.read_builtins("s").expect("read");
    assert_eq!(builtins.turns.live_compaction_start(), Some(36));
    let nodes = builtins.surface.nodes();
    let blocked = compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[3],
        CompactionOwner::Manual,
        &summary(),
    );
    assert_eq!(code_of(&blocked), Some(CompactionErrorCode::Busy));
    assert!(blocked.is_err_and(|error| error.to_string().contains("already in progress")));
    writer
        .append(NewEvent::new("session/end-seed", "{}"))
        .expect("end-seed");
    let (builtins, _) = cache.read_builtins("s").expect("read");
    assert_eq!(builtins.turns.stale_compaction_start(), Some(36));
    assert!(compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[3],
        CompactionOwner::Manual,
        &summary()
    )
    .is_ok());
}

/// Model §5.7: region selection by token budget is head-anchored, keeps about
/// `retain_tokens` of the newest surface and never splits a call/result pair.
#[test]
fn region_selection_by_token_budget() {
    let disk = SimStorage::new();
    let store = sim_store(&disk);
    session_with_turns(&store, "s", 6);
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let (builtins, _) = cache.read_builtins("s").expect("read");
    let nodes = builtins.surface.nodes();
    let deltas = dshdb::compaction::pairing_deltas(&store, "s", &nodes).expect("deltas");
    let prices = &builtins.tokens.nodes;
    let last_turn: u64 = prices[20..].iter().map(|(_, tokens)| tokens).sum();
    let range = select_compactable_range(&nodes, prices, &deltas, last_turn)
        .expect("select")
        .expect("something to compact");
    assert_eq!(range, (nodes[0], nodes[19]), "the last turn is retained");
    // A budget that ends inside a step rounds head-ward to a balanced cut.
    let inside: u64 = prices[22..].iter().map(|(_, tokens)| tokens).sum();
    let range = select_compactable_range(&nodes, prices, &deltas, inside).expect("select");
    assert_eq!(
        range,
        Some((nodes[0], nodes[20])),
        "the cut after the user message"
    );
    let zero = select_compactable_range(&nodes, prices, &deltas, 0).expect("select");
    assert_eq!(
        zero,
        Some((nodes[0], nodes[22])),
        "at least the last node is retained"
    );
    let everything = select_compactable_range(&nodes, prices, &deltas, u64::MAX).expect("select");
    assert_eq!(everything, None);
    let (range_start, range_end) = range.expect("range");
    let mut writer = store.writer("s").expect("writer");
    compact(
        &cache,
        &mut writer,
        range_start,
        range_end,
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("compact the selection");
}

/// One compaction on a fresh 3-turn session; true when acknowledged.
fn compaction_workload(disk: &SimStorage) -> bool {
    let Ok(store) = open_sim(disk, sim_options(Durability::Sync)) else {
        return false;
    };
    let cache = ProjectionCache::new(&store, CacheOptions { every_events: 1 });
    let Ok(mut writer) = store.writer("s") else {
        return false;
    };
    compact(
        &cache,
        &mut writer,
        1,
        21,
        CompactionOwner::Manual,
        &summary(),
    )
    .is_ok()
}

/// F-07-15: a power cut at every write/sync/rename of a compaction (cache checkpoints
/// included) leaves all four events or none; acknowledged means all four.
#[test]
fn crash_at_every_point_leaves_all_four_events_or_none() {
    let base = SimStorage::new();
    {
        let store = sim_store(&base);
        session_with_turns(&store, "s", 3);
        store.close().expect("close");
    }
    let image = base.durable_image();
    let reference = SimStorage::from_image(&image);
    let before = reference.operation_count();
    assert!(compaction_workload(&reference));
    let operations = reference.operation_count() - before;
    let mut checked = 0;
    let mut lengths = std::collections::BTreeSet::new();
    for cut in 0..operations + 2 {
        let disk = SimStorage::from_image(&image);
        disk.crash_at(disk.operation_count() + cut);
        let acknowledged = compaction_workload(&disk);
        let images = disk.take_crash_images();
        for crashed in &images {
            let recovered = SimStorage::from_image(crashed);
            let store = sim_store(&recovered);
            let length = store.session("s").expect("session").events;
            assert!(length == 36 || length == 40, "cut {cut}: length {length}");
            lengths.insert(length);
            assert!(
                !acknowledged || length == 40,
                "cut {cut}: acknowledged compaction lost"
            );
            // The log leads: no checkpoint that survived covers more than the durable log.
            let dir = dshdb::derive::cache::session_cache_dir("s");
            for name in store.storage().list(&dir).expect("list cache") {
                let file = store
                    .storage()
                    .open_read(&format!("{dir}/{name}"))
                    .expect("open");
                let bytes = file.read_all().expect("read");
                if let Ok(checkpoint) = dshdb::derive::cache::decode_checkpoint(&bytes) {
                    assert!(
                        checkpoint.seq <= length,
                        "cut {cut}: checkpoint ahead of the log"
                    );
                }
            }
            let events = session_events(&store, "s").expect("events");
            let cache = ProjectionCache::new(&store, CacheOptions { every_events: 1 });
            let (cached, _) = cache.read_builtins("s").expect("cache read after crash");
            assert!(cached.surface == fold_from_scratch(&SurfaceUnit, &events).expect("fold"));
            let expected_nodes = if length == 40 { 5 } else { 12 };
            assert_eq!(cached.surface.nodes().len(), expected_nodes, "cut {cut}");
            checked += 1;
        }
    }
    assert!(checked > 10, "enumerated {checked} images");
    assert_eq!(lengths.len(), 2, "both outcomes occur: {lengths:?}");
}

/// Model §8: DSH's exact cut over a multi-block stream.
#[test]
fn prune_content_cuts_the_middle_of_the_text_stream() {
    let config = PrunerConfig {
        threshold_chars: 60,
        head_chars: 10,
        tail_chars: 5,
    };
    let text = |text: &str| json!({"type": "text", "text": text});
    let blocks = vec![
        text(&"a".repeat(8)),
        json!({"type": "image", "data": "x"}),
        text(&"b".repeat(50)),
        text(&"c".repeat(8)),
    ];
    assert_eq!(measure_content(&blocks), 66);
    let pruned = prune_content(&blocks, &config).expect("prunes");
    assert_eq!(
        pruned,
        vec![
            text(&"a".repeat(8)),
            json!({"type": "image", "data": "x"}),
            text(&format!("bb{PRUNE_MARKER}")),
            text("ccccc"),
        ]
    );
    assert_eq!(measure_content(&pruned), 10 + 39 + 5);
    assert!(
        prune_content(&pruned, &config).is_none(),
        "converges in one pass"
    );
    assert!(prune_content(&blocks[..1], &config).is_none());
    let invalid = PrunerConfig {
        threshold_chars: 40,
        ..config
    };
    assert!(matches!(
        invalid.validate(),
        Err(Error::InvalidInput { .. })
    ));
}

fn big_tool_turn(turn: u64, bytes: usize) -> Vec<OwnedEvent> {
    let mut events = turn_events(turn, TEXT_BYTES);
    let result = &mut events[6];
    let mut data: Value = serde_json::from_str(&result.data).expect("json");
    data["message"]["content"][0]["content"][0]["text"] =
        Value::String("0123456789".repeat(bytes / 10));
    result.data = data.to_string();
    assert_eq!(result.envelope, APPEND);
    events
}

/// F-07-17: the pruner rewrites oversized tool results (content only), spills the full text,
/// commits pairs atomically, converges in one pass; the log stays DSH-valid and round-trips
/// through export and import.
#[test]
fn pruner_spills_and_round_trips_through_export() {
    let disk = SimStorage::new();
    let store = sim_store(&disk);
    drop(store.create_session_with_id("s").expect("create"));
    append_owned(&store, "s", &big_tool_turn(1, 20_000));
    append_owned(&store, "s", &turn_events(2, TEXT_BYTES));
    append_owned(&store, "s", &big_tool_turn(3, 30_000));
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let spill = SpillStore::new(store.storage());
    let mut writer = store.writer("s").expect("writer");
    let report =
        prune_session(&cache, &mut writer, Some(&spill), &PrunerConfig::default()).expect("prune");
    assert_eq!(report.pruned.len(), 2);
    assert_eq!(report.pruned[0].original_seq, 6);
    assert_eq!(report.pruned[0].replacement_seq, 37);
    let hash = report.pruned[0].spilled.expect("spilled");
    assert_eq!(spill.get(&hash).expect("blob").len(), 20_000);
    let replacement: Value =
        serde_json::from_str(&store.get("s", 37).expect("get").data).expect("json");
    let inner = replacement["message"]["content"][0]["content"]
        .as_array()
        .expect("inner");
    assert!(inner[0]["text"]
        .as_str()
        .expect("text")
        .contains(PRUNE_MARKER));
    assert_eq!(inner[1]["text"], format!("[full text: {}]", hash.locator()));
    assert_eq!(
        report.chars_removed,
        20_000 + 30_000 - 2 * (measure_content(inner))
    );
    let again = prune_session(&cache, &mut writer, Some(&spill), &PrunerConfig::default())
        .expect("second pass");
    assert!(again.pruned.is_empty(), "converges in one pass");
    let nodes = cache.read_builtins("s").expect("read").0.surface.nodes();
    compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[7],
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("compact after pruning");
    drop(writer);
    // The log is valid for DSH's cold load: export, import elsewhere, export again.
    let exported = export_dsh_jsonl(&store, "s").expect("export");
    let other = sim_store(&SimStorage::new());
    let imported = import_dsh_jsonl(&other, &exported).expect("DSH accepts the log");
    assert_eq!(imported.events, 44);
    assert_eq!(export_dsh_jsonl(&other, "s").expect("re-export"), exported);
    let (original, _) = cache.read_builtins("s").expect("read");
    let (copy, _) = ProjectionCache::new(&other, CacheOptions::default())
        .read_builtins("s")
        .expect("read copy");
    assert!(original.surface == copy.surface);
    assert_eq!(original.tokens, copy.tokens);
}

/// Model §5.4 on a real DSH log: the fixture's trailing unmatched `compaction/start` is a
/// live orphan after import, and blocks compaction with DSH's text.
#[test]
fn imported_dsh_orphan_bracket_is_detected() {
    if !dsh_fixtures::present() {
        return;
    }
    let store = sim_store(&SimStorage::new());
    let bytes = std::fs::read(dsh_fixtures::fixture_path(
        "syn-closed-dangling-tool-call",
        "input.jsonl",
    ))
    .expect("fixture");
    let report = import_dsh_jsonl(&store, &bytes).expect("import");
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let (builtins, _) = cache.read_builtins(&report.session_id).expect("read");
    assert_eq!(builtins.turns.live_compaction_start(), Some(15));
    assert_eq!(builtins.turns.open_turn(), None);
    let nodes = builtins.surface.nodes();
    let mut writer = store.writer(&report.session_id).expect("writer");
    let last = *nodes.last().expect("nodes");
    let refused = compact(
        &cache,
        &mut writer,
        nodes[0],
        last,
        CompactionOwner::Manual,
        &summary(),
    );
    assert_eq!(code_of(&refused), Some(CompactionErrorCode::Busy));
}

/// One pruning pass with spill on a session with two oversized results; true when acknowledged.
fn prune_workload(disk: &SimStorage) -> bool {
    let Ok(store) = open_sim(disk, sim_options(Durability::Sync)) else {
        return false;
    };
    let cache = ProjectionCache::new(&store, CacheOptions { every_events: 1 });
    let spill = SpillStore::new(store.storage());
    let Ok(mut writer) = store.writer("s") else {
        return false;
    };
    prune_session(&cache, &mut writer, Some(&spill), &PrunerConfig::default()).is_ok()
}

/// F-07-17, F-07-11: a power cut at every write/sync/rename of a pruning pass (blob puts,
/// the batch, cache checkpoints) leaves both pairs or none, and every surviving
/// replacement's locator reads back the whole text.
#[test]
fn crash_at_every_point_of_a_pruning_pass() {
    let base = SimStorage::new();
    {
        let store = sim_store(&base);
        drop(store.create_session_with_id("s").expect("create"));
        append_owned(&store, "s", &big_tool_turn(1, 20_000));
        append_owned(&store, "s", &big_tool_turn(2, 30_000));
        store.close().expect("close");
    }
    let image = base.durable_image();
    let reference = SimStorage::from_image(&image);
    assert!(prune_workload(&reference));
    let operations = reference.operation_count();
    let mut lengths = std::collections::BTreeSet::new();
    for cut in 0..operations + 2 {
        let disk = SimStorage::from_image(&image);
        disk.crash_at(disk.operation_count() + cut);
        let acknowledged = prune_workload(&disk);
        let images = disk.take_crash_images();
        for crashed in &images {
            let recovered = SimStorage::from_image(crashed);
            let store = sim_store(&recovered);
            let length = store.session("s").expect("session").events;
            assert!(length == 24 || length == 28, "cut {cut}: length {length}");
            assert!(
                !acknowledged || length == 28,
                "cut {cut}: acknowledged pass lost"
            );
            lengths.insert(length);
            let spill = SpillStore::new(store.storage());
            for event in store.read("s", 24, length).expect("read") {
                for hash in dshdb::spill::locators_in(&event.data) {
                    assert!(spill.get(&hash).is_ok(), "cut {cut}: cited blob readable");
                }
            }
        }
    }
    assert_eq!(lengths.len(), 2, "both outcomes occur: {lengths:?}");
}

/// Every DSH fixture that folds with no open turn and no live bracket: prune, compact by
/// token budget, export, and DSH's cold-load validation accepts the result on import, with
/// the same projections.
#[test]
fn fixtures_with_compaction_and_pruning_round_trip_through_export() {
    if !dsh_fixtures::present() {
        return;
    }
    let store = sim_store(&SimStorage::new());
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let spill = SpillStore::new(store.storage());
    let small = PrunerConfig {
        threshold_chars: 200,
        head_chars: 100,
        tail_chars: 50,
    };
    let mut compacted = 0;
    let mut pruned = 0;
    for name in dsh_fixtures::case_names() {
        let bytes = std::fs::read(dsh_fixtures::fixture_path(&name, "input.jsonl")).expect("read");
        let Ok(report) = import_dsh_jsonl(&store, &bytes) else {
            continue;
        };
        let id = report.session_id;
        let Ok((builtins, _)) = cache.read_builtins(&id) else {
            continue;
        };
        if builtins.turns.open_turn().is_some() || builtins.turns.live_compaction_start().is_some()
        {
            continue;
        }
        let mut writer = store.writer(&id).expect("writer");
        let pruning = prune_session(&cache, &mut writer, Some(&spill), &small).expect("prune");
        pruned += pruning.pruned.len();
        let (builtins, _) = cache.read_builtins(&id).expect("read");
        let nodes = builtins.surface.nodes();
        let deltas = dshdb::compaction::pairing_deltas(&store, &id, &nodes).expect("deltas");
        let range = select_compactable_range(&nodes, &builtins.tokens.nodes, &deltas, 0);
        if let Ok(Some((start, end))) = range {
            let summary = SummaryInput::text("Done so far.", "p", "m");
            if compact(
                &cache,
                &mut writer,
                start,
                end,
                CompactionOwner::Manual,
                &summary,
            )
            .is_ok()
            {
                compacted += 1;
            }
        }
        drop(writer);
        let exported = export_dsh_jsonl(&store, &id).expect("export");
        let other = sim_store(&SimStorage::new());
        let imported = import_dsh_jsonl(&other, &exported)
            .unwrap_or_else(|error| panic!("{name}: DSH refuses the compacted log: {error}"));
        assert_eq!(
            export_dsh_jsonl(&other, &id).expect("re-export"),
            exported,
            "{name}"
        );
        let (original, _) = cache.read_builtins(&id).expect("read");
        let copy_cache = ProjectionCache::new(&other, CacheOptions::default());
        let (copy, _) = copy_cache
            .read_builtins(&imported.session_id)
            .expect("read copy");
        assert!(original.surface == copy.surface, "{name}");
        assert_eq!(original.tokens, copy.tokens, "{name}");
    }
    assert!(compacted >= 5, "compacted {compacted} fixtures");
    assert!(pruned >= 3, "pruned {pruned} tool results");
}

/// `LiveSession`: oversized tool results are spilled on append (DSH policy), checkpoints
/// follow `turn/end`, and compaction by token budget hands the span to the summarizer.
#[test]
fn live_session_spills_checkpoints_and_compacts_to_budget() {
    use dshdb::compaction::LiveSession;
    use dshdb::derive::cache::session_cache_dir;
    let store = sim_store(&SimStorage::new());
    let writer = store.create_session_with_id("s").expect("create");
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let mut live = LiveSession::new(writer, cache);
    let owned = big_tool_turn(1, 120_000);
    let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
    let (receipt, blobs) = live.append_batch(&events).expect("append");
    assert_eq!(receipt.end_seq, 12);
    let hash = blobs[6].expect("the big result was spilled");
    assert!(blobs
        .iter()
        .enumerate()
        .all(|(index, blob)| blob.is_none() || index == 6));
    let stored = store.get("s", 6).expect("get");
    assert!(
        stored.data.len() < 52_000,
        "preview only: {}",
        stored.data.len()
    );
    assert!(stored.data.contains(&hash.locator()));
    assert_eq!(live.spill().get(&hash).expect("blob").len(), 120_000);
    let checkpoints = store.storage().list(&session_cache_dir("s")).expect("list");
    assert_eq!(checkpoints.len(), 5, "checkpoints at turn/end");
    for turn in 2..=6 {
        let owned = turn_events(turn, TEXT_BYTES);
        let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
        live.append_batch(&events).expect("append");
    }
    let before = live.projections().expect("projections");
    let mut span_messages = 0;
    let result = live
        .compact_to_budget(0, CompactionOwner::Manual, |span| {
            span_messages = span.len();
            SummaryInput::text("Six turns of tool use.", "p", "m")
        })
        .expect("compact")
        .expect("something to compact");
    assert_eq!(span_messages, result.shadowed_seqs.len());
    let after = live.projections().expect("projections");
    assert!(after.surface.nodes().len() < before.surface.nodes().len());
    assert!(after.tokens.total < before.tokens.total);
}

/// Model §5.8: DSH's heuristic token surface. A compaction's and a prune's claims price the
/// replacements, so the total stays the sum of the node prices; a replace whose adjacent
/// claim covers another range is refused with DSH's text; the fixture folds.
#[test]
fn heuristic_meter_follows_shadow_prices() {
    if !dsh_fixtures::present() {
        return;
    }
    use dshdb::derive::projection::{HeuristicMeterUnit, ProjectionUnit};
    let store = sim_store(&SimStorage::new());
    drop(store.create_session_with_id("s").expect("create"));
    append_owned(&store, "s", &big_tool_turn(1, 20_000));
    for turn in 2..=4 {
        append_owned(&store, "s", &turn_events(turn, TEXT_BYTES));
    }
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let mut writer = store.writer("s").expect("writer");
    prune_session(&cache, &mut writer, None, &PrunerConfig::default()).expect("prune");
    let nodes = cache.read_builtins("s").expect("read").0.surface.nodes();
    compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[7],
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("compact");
    let (meter, _) = cache.read("s", &HeuristicMeterUnit).expect("meter");
    let sum: u64 = meter.nodes.iter().map(|(_, price)| price).sum();
    assert_eq!(meter.total, sum, "claims equal the shadowed prices");
    assert_eq!(meter.nodes.len(), 9);
    // A replace right after a claim for another range.
    let events = session_events(&store, "s").expect("events");
    let mut state = fold_from_scratch(&HeuristicMeterUnit, &events).expect("fold");
    let next = events.len() as u64;
    let claim = dshdb::session::parse_event_line(&format!(
        r#"{{"type":"compaction/prune","seq":{next},"time":0,"data":{{"shadowedRange":{{"start":1,"end":1}},"shadowedSeqs":[1],"shadowedTokenCount":3}}}}"#
    ))
    .expect("line");
    HeuristicMeterUnit.apply(&mut state, &claim).expect("arms");
    let last = *meter.nodes.last().expect("node");
    let replace = dshdb::session::parse_event_line(&format!(
        r#"{{"type":"user/message","seq":{},"time":0,"data":{{"role":"user","content":[],"source":{{"kind":"user"}},"id":"x"}},"sourceEventSeqs":[{}],"surfaceOp":{{"op":"replace","start":{},"end":{}}}}}"#,
        next + 1, last.0, last.0, last.0
    ))
    .expect("line");
    let refused = HeuristicMeterUnit.apply(&mut state, &replace);
    let text = format!(
        "token surface: replace at seq {} over range {}-{} has no adjacent shadow price (armed claim covers 1-1)",
        next + 1, last.0, last.0
    );
    assert!(refused.is_err_and(|error| error.to_string().contains(&text)));
    // DSH's own fixture with a prune and a compaction folds.
    let fixture = sim_store(&SimStorage::new());
    let bytes = std::fs::read(dsh_fixtures::fixture_path(
        "syn-compaction-replace",
        "input.jsonl",
    ))
    .expect("fixture");
    let report = import_dsh_jsonl(&fixture, &bytes).expect("import");
    let events = session_events(&fixture, &report.session_id).expect("events");
    let folded = fold_from_scratch(&HeuristicMeterUnit, &events).expect("fixture folds");
    let nodes: Vec<u64> = folded.nodes.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(nodes, [16, 9, 19, 21]);
}

/// A fork reads its parent's prefix: compacting the child shadows inherited nodes, appends
/// only to the child, and leaves the parent as it was.
#[test]
fn compacting_a_fork_leaves_the_parent_alone() {
    let store = sim_store(&SimStorage::new());
    session_with_turns(&store, "parent", 3);
    drop(
        store
            .fork("parent", 23, "child")
            .expect("fork after turn 2"),
    );
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let (before, _) = cache.read_builtins("parent").expect("parent");
    let nodes = cache
        .read_builtins("child")
        .expect("child")
        .0
        .surface
        .nodes();
    assert_eq!(nodes.len(), 8);
    let mut writer = store.writer("child").expect("writer");
    let result = compact(
        &cache,
        &mut writer,
        nodes[0],
        nodes[7],
        CompactionOwner::Manual,
        &summary(),
    )
    .expect("compact the fork");
    assert_eq!(result.start_seq, 25, "after the child's end-seed");
    let (child, _) = cache.read_builtins("child").expect("child");
    assert_eq!(child.surface.nodes(), vec![27]);
    let (after, _) = cache.read_builtins("parent").expect("parent");
    assert!(after.surface == before.surface);
    assert_eq!(after.length, 36);
}
