//! Above the log: resume of a long, periodically compacted session to its surface and token
//! count from projection checkpoints (target ≤ 20 ms, independent of session length), the
//! same for all five built-in units, and storage growth per compaction.
//!
//! Sessions of 130k and 1.3M events are generated once per run (12 events per turn, a
//! compaction every 50 turns keeping the last 5), on the real file system.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use dshdb::compaction::{compact, CompactionOwner, SummaryInput};
use dshdb::derive::cache::{CacheOptions, ProjectionCache};
use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent, EVENTS_PER_TURN};
use dshdb::derive::projection::{fold_from_scratch, SurfaceUnit};
use dshdb::exchange::session_events;
use dshdb::storage::commit::Durability;
use dshdb::store::{Options, Store};
use std::path::PathBuf;
use std::time::Duration;

/// Turns between compactions.
const TURNS_PER_COMPACTION: u64 = 50;
/// Surface nodes kept after each compaction (the last five turns).
const RETAINED_NODES: usize = 20;
/// Longest session also folded from scratch (the slow baseline), in events.
const FROM_SCRATCH_MAX_EVENTS: u64 = 200_000;
/// Bytes of each generated message text.
const TEXT_BYTES: usize = 200;

struct Generated {
    dir: PathBuf,
    store: Store,
    /// Bytes of event data and envelope appended by each compaction batch.
    compaction_batch_bytes: Vec<u64>,
}

fn generate(events: u64) -> Generated {
    let dir = std::env::temp_dir().join(format!("dshdb-bench-above-{events}"));
    let _ = std::fs::remove_dir_all(&dir);
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    let store = Store::open(&dir, options).expect("open bench store");
    let cache = ProjectionCache::new(&store, CacheOptions::default());
    let mut writer = store.create_session_with_id("long").expect("create");
    let summary = SummaryInput::text("Earlier turns ran tools; everything succeeded.", "p", "m");
    let mut compaction_batch_bytes = Vec::new();
    let mut turn = 1;
    while store.session("long").expect("session").events + EVENTS_PER_TURN <= events {
        let owned = turn_events(turn, TEXT_BYTES);
        let batch: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
        writer.append_batch(&batch).expect("append turn");
        if turn % TURNS_PER_COMPACTION == 0 {
            let (surface, _, _) = cache.read_surface_and_tokens("long").expect("read");
            let nodes = surface.nodes();
            let end = nodes[nodes.len() - RETAINED_NODES - 1];
            let result = compact(
                &cache,
                &mut writer,
                nodes[0],
                end,
                CompactionOwner::Manual,
                &summary,
            )
            .expect("compact");
            let batch = store
                .read("long", result.start_seq, result.end_seq + 1)
                .expect("read batch");
            compaction_batch_bytes.push(
                batch
                    .iter()
                    .map(|e| (e.data.len() + e.envelope.len()) as u64)
                    .sum(),
            );
        }
        turn += 1;
    }
    store.flush().expect("flush");
    // Bring every checkpoint up to the end of the log, as a live session's turn/end does.
    ProjectionCache::new(&store, CacheOptions { every_events: 1 })
        .read_builtins("long")
        .expect("checkpoint");
    Generated {
        dir,
        store,
        compaction_batch_bytes,
    }
}

/// Session lengths to generate: `DSHDB_BENCH_ABOVE_EVENTS` (comma-separated) or 130k and 1.3M.
fn session_lengths() -> Vec<u64> {
    match std::env::var("DSHDB_BENCH_ABOVE_EVENTS") {
        Ok(list) => list
            .split(',')
            .filter_map(|item| item.trim().parse().ok())
            .collect(),
        Err(_) => vec![130_000, 1_300_000],
    }
}

fn above(c: &mut Criterion) {
    let mut group = c.benchmark_group("resume_from_checkpoint");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    for events in session_lengths() {
        let generated = generate(events);
        let store = &generated.store;
        let length = store.session("long").expect("session").events;
        let cache = ProjectionCache::new(store, CacheOptions::default());
        let (surface, tokens, report) = cache.read_surface_and_tokens("long").expect("resume");
        assert_eq!(report.folded_events, 0, "resumed from checkpoints");
        let bytes = &generated.compaction_batch_bytes;
        eprintln!(
            "session of {length} events: {} surface nodes, {} tokens; {} compactions, batch bytes min {} max {} last {}",
            surface.nodes().len(),
            tokens.total,
            bytes.len(),
            bytes.iter().min().unwrap_or(&0),
            bytes.iter().max().unwrap_or(&0),
            bytes.last().unwrap_or(&0),
        );
        group.bench_with_input(
            BenchmarkId::new("surface+tokens", length),
            &cache,
            |b, cache| b.iter(|| cache.read_surface_and_tokens("long").expect("resume")),
        );
        group.bench_with_input(
            BenchmarkId::new("all-builtins", length),
            &cache,
            |b, cache| b.iter(|| cache.read_builtins("long").expect("resume")),
        );
        if length <= FROM_SCRATCH_MAX_EVENTS {
            // The baseline a checkpoint saves: read, parse and fold the whole log.
            let surface_unit = SurfaceUnit;
            let tokens_unit = &cache.units().tokens;
            group.bench_with_input(
                BenchmarkId::new("from-scratch", length),
                store,
                |b, store| {
                    b.iter(|| {
                        let events = session_events(store, "long").expect("events");
                        let surface = fold_from_scratch(&surface_unit, &events).expect("surface");
                        let tokens = fold_from_scratch(tokens_unit, &events).expect("tokens");
                        (surface.nodes().len(), tokens.total)
                    })
                },
            );
        }
        drop(cache);
        generated.store.close().expect("close");
        let _ = std::fs::remove_dir_all(&generated.dir);
    }
    group.finish();
}

criterion_group!(benches, above);
criterion_main!(benches);
