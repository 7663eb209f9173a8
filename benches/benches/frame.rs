//! Frame encode/decode throughput (`dshdb::storage::frame`), for 256 B and 1 KiB event data.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dshdb::storage::frame::{decode_frame, EventRecord, Record};
use dshdb_benches::workload::{SessionStream, Shape};

const SALT: u64 = 0x5A17_5A17_5A17_5A17;

fn frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for size in [256usize, 1024] {
        let event = SessionStream::new(1, 0, Shape::Fixed(size)).next_event();
        let record = EventRecord {
            session: 3,
            seq: 12_345,
            time: 1_786_073_817_152,
            type_number: 7,
            flags: 0,
            data: event.data.as_bytes(),
            envelope: b"",
        };
        let mut encoded = Vec::new();
        record.encode(&mut encoded, SALT).expect("encode");
        group.throughput(Throughput::Bytes(encoded.len() as u64));
        group.bench_with_input(BenchmarkId::new("encode", size), &record, |b, record| {
            let mut out = Vec::with_capacity(2 * encoded.len());
            b.iter(|| {
                out.clear();
                black_box(record).encode(&mut out, SALT).expect("encode");
                black_box(out.len())
            })
        });
        group.bench_with_input(BenchmarkId::new("decode", size), &encoded, |b, bytes| {
            b.iter(|| {
                let frame = decode_frame(black_box(bytes), SALT).expect("valid frame");
                match Record::decode(&frame) {
                    Ok(Some(Record::Event(event))) => black_box(event.seq),
                    _ => panic!("not an event"),
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, frames);
criterion_main!(benches);
