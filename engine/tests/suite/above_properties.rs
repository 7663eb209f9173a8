//! Property: whatever mix of turns, compactions, prunes and cache reads a session sees, every
//! cached read equals the fold from scratch (F-07-6), and the log stays DSH-valid.

use crate::common;

use common::*;
use dshdb::compaction::{
    compact, pairing_deltas, prune_session, select_compactable_range, CompactionOwner,
    PrunerConfig, SummaryInput,
};
use dshdb::derive::cache::{Builtins, CacheOptions, ProjectionCache};
use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent};
use dshdb::derive::projection::{
    fold_from_scratch, MessagesUnit, StatsUnit, SurfaceUnit, TokenMeterUnit, TurnIndexUnit,
};
use dshdb::exchange::session_events;
use dshdb::spill::SpillStore;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::Store;
use proptest::prelude::*;
use serde_json::Value;

#[derive(Debug, Clone)]
enum Step {
    /// A turn whose tool result has this many characters.
    Turn(usize),
    /// Compact by token budget, retaining this many tokens.
    Compact(u64),
    Prune,
    Read,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop_oneof![Just(100usize), Just(12_000usize)].prop_map(Step::Turn),
        1 => (0u64..3_000).prop_map(Step::Compact),
        1 => Just(Step::Prune),
        2 => Just(Step::Read),
    ]
}

fn turn(number: u64, result_chars: usize) -> Vec<OwnedEvent> {
    let mut events = turn_events(number, 300);
    let mut data: Value = serde_json::from_str(&events[6].data).expect("json");
    data["message"]["content"][0]["content"][0]["text"] = Value::String("z".repeat(result_chars));
    events[6].data = data.to_string();
    events
}

fn check(cached: &Builtins, store: &Store) -> Result<(), TestCaseError> {
    let events = session_events(store, "s").expect("events");
    let surface = fold_from_scratch(&SurfaceUnit, &events).expect("surface");
    prop_assert!(cached.surface == surface);
    prop_assert_eq!(
        &cached.messages,
        &fold_from_scratch(&MessagesUnit, &events).expect("messages")
    );
    let tokens = fold_from_scratch(&TokenMeterUnit::default(), &events).expect("tokens");
    prop_assert_eq!(&cached.tokens, &tokens);
    prop_assert_eq!(
        &cached.stats,
        &fold_from_scratch(&StatsUnit, &events).expect("stats")
    );
    prop_assert_eq!(
        &cached.turns,
        &fold_from_scratch(&TurnIndexUnit, &events).expect("turns")
    );
    Ok(())
}

fn run(steps: &[Step], every_events: u64) -> Result<(), TestCaseError> {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("open");
    let cache = ProjectionCache::new(&store, CacheOptions { every_events });
    let spill = SpillStore::new(store.storage());
    let mut writer = store.create_session_with_id("s").expect("create");
    let summary = SummaryInput::text("Summary of earlier work.", "p", "m");
    let mut turns = 0;
    for step in steps {
        match step {
            Step::Turn(chars) => {
                turns += 1;
                let owned = turn(turns, *chars);
                let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
                let receipt = writer.append_batch(&events).expect("append");
                let types: Vec<&str> = owned.iter().map(|e| e.event_type.as_str()).collect();
                cache.note_appended("s", &receipt, &types).expect("note");
            }
            Step::Compact(retain) => {
                let (builtins, _) = cache.read_builtins("s").expect("read");
                let nodes = builtins.surface.nodes();
                let deltas = pairing_deltas(&store, "s", &nodes).expect("deltas");
                let range =
                    select_compactable_range(&nodes, &builtins.tokens.nodes, &deltas, *retain)
                        .expect("select");
                if let Some((start, end)) = range {
                    // A refusal (summary not smaller) must leave the log as it was.
                    let before = store.session("s").expect("session").events;
                    if compact(
                        &cache,
                        &mut writer,
                        start,
                        end,
                        CompactionOwner::Manual,
                        &summary,
                    )
                    .is_err()
                    {
                        prop_assert_eq!(store.session("s").expect("session").events, before);
                    }
                }
            }
            Step::Prune => {
                prune_session(&cache, &mut writer, Some(&spill), &PrunerConfig::default())
                    .expect("prune");
            }
            Step::Read => {
                let (cached, _) = cache.read_builtins("s").expect("read");
                check(&cached, &store)?;
            }
        }
    }
    let (cached, _) = cache.read_builtins("s").expect("final read");
    check(&cached, &store)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]
    #[test]
    fn cached_reads_equal_folds_from_scratch(steps in proptest::collection::vec(step(), 1..24), every_events in 1u64..40) {
        run(&steps, every_events)?;
    }
}
