//! Single-session append latency through the `Store` API: `Sync` (one `fdatasync` per append)
//! for 256 B and 1 KiB events, and `Buffered` (written, not synced).
//! Stores live under `target/` (a real file system, unlike a tmpfs /tmp) and are removed after.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dshdb::storage::commit::Durability;
use dshdb::store::{NewEvent, Options, Store};
use dshdb_benches::workload::{SessionStream, Shape};
use std::path::PathBuf;
use std::time::Duration;

fn bench_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = base
        .join("bench-stores")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    let cases = [
        ("sync", Durability::Sync, 256usize),
        ("sync", Durability::Sync, 1024),
        ("buffered", Durability::Buffered, 256),
        ("buffered", Durability::Buffered, 1024),
    ];
    for (name, durability, size) in cases {
        let dir = bench_dir(&format!("append-{name}-{size}"));
        let store = Store::open(
            &dir,
            Options {
                durability,
                ..Options::default()
            },
        )
        .expect("open store");
        let mut writer = store.create_session_with_id("bench").expect("session");
        let events = SessionStream::new(7, 0, Shape::Fixed(size)).take(64);
        let mut next = 0usize;
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::new(name, size), |b| {
            b.iter(|| {
                let event = &events[next % events.len()];
                next += 1;
                writer
                    .append(NewEvent::new(event.event_type, &event.data))
                    .expect("append")
            })
        });
        drop(writer);
        store.close().expect("close");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
