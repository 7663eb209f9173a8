//! Replays the fuzz targets' properties in CI (no nightly needed) over the seed corpora
//! committed in `fuzz/seeds/<target>/` and a fixed number of deterministic mutations of every
//! seed. The seeds are built here from the engine's encoders and, for the DSH-log targets, from
//! the smaller DSH fixtures (`write_fuzz_seeds`, ignored, writes them;
//! `committed_seeds_are_current` checks they are). A target with no committed seed fails: a
//! replay over nothing proves nothing. When the DSH fixtures are present, every fixture also
//! joins the replay, also the larger ones that are not committed.

use crate::common::dsh_fixtures;
use crate::common::{open_sim, sim_options};
use dshdb::derive::projection::synthetic::{turn_events, OwnedEvent};
use dshdb::exchange::export_dsh_jsonl;
use dshdb::fuzzing::{
    check_damaged_seal, check_dsh_import, check_frame_decode, check_model, check_run_entries,
    check_segment_recovery, check_surface_fold, FUZZ_SALT, MODEL_PROCESSES, MODEL_SEED_SCRIPT,
};
use dshdb::storage::commit::Durability;
use dshdb::storage::frame::{EventRecord, Record, NO_SEED_PARENT};
use dshdb::storage::io::sim::SimStorage;
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::{Manifest, RunEntry};
use dshdb::storage::run::rows::encode_row_frame;
use dshdb::storage::run::{decode_block, run_path, RunIndex};
use dshdb::storage::segment::encode_header;
use dshdb::store::NewEvent;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Mutations tried per seed.
const MUTATIONS_PER_SEED: u64 = 64;

fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Flips, overwrites, truncates or duplicates a few bytes.
fn mutate(seed: &[u8], state: &mut u64) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..1 + next_random(state) % 3 {
        if bytes.is_empty() {
            bytes.push(next_random(state) as u8);
            continue;
        }
        let at = (next_random(state) % bytes.len() as u64) as usize;
        match next_random(state) % 4 {
            0 => bytes[at] ^= 1 << (next_random(state) % 8),
            1 => bytes[at] = next_random(state) as u8,
            2 => bytes.truncate(at),
            _ => {
                let copy = bytes[at..].to_vec();
                bytes.extend_from_slice(&copy[..copy.len().min(64)]);
            }
        }
    }
    bytes
}

/// DSH fixtures up to this size (bytes of `NAME.input.jsonl`) are committed as seeds; the
/// larger ones join the replay only when the fixtures are present.
const MAX_COMMITTED_FIXTURE_BYTES: usize = 8 * 1024;

/// The fuzz targets, as named in `fuzz/Cargo.toml`.
const TARGETS: [&str; 7] = [
    "frame_decode",
    "run_entries",
    "segment_recovery",
    "damaged_seal",
    "surface_fold",
    "model",
    "dsh_import",
];

/// Seed file name → bytes.
type Seeds = BTreeMap<String, Vec<u8>>;

fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target)
}

/// Every file in `fuzz/seeds/<target>/`; fails when there is none.
fn committed_seeds(target: &str) -> Seeds {
    let dir = seeds_dir(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|error| {
        panic!(
            "{}: {error}; the committed seeds are missing (rewrite them with `cargo test \
             --release -p dshdb --test suite -- --ignored fuzz_replay::write_fuzz_seeds`)",
            dir.display()
        )
    });
    let mut seeds = Seeds::new();
    for entry in entries {
        let path = entry.expect("list seed directory").path();
        let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{path:?}: {error}"));
        let name = path.file_name().expect("file name").to_string_lossy();
        seeds.insert(name.into_owned(), bytes);
    }
    assert!(
        !seeds.is_empty(),
        "{} holds no seed: a replay over nothing proves nothing",
        dir.display()
    );
    seeds
}

/// Session 0's header (`header_json`) and type 0 = `assistant/chunk`, under [`FUZZ_SALT`]:
/// what a segment holds before the session's first batch of chunks.
fn session_definitions(header_json: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Record::SessionHeader {
        session: 0,
        seed_parent: NO_SEED_PARENT,
        seed_length: 0,
        header_json,
    }
    .encode(&mut out, FUZZ_SALT)
    .expect("encode");
    Record::TypeDefinition {
        type_number: 0,
        name: b"assistant/chunk",
    }
    .encode(&mut out, FUZZ_SALT)
    .expect("encode");
    out
}

fn encoded_records() -> Vec<u8> {
    let mut out = session_definitions(br#"{"version":0,"id":"f","createdAt":1}"#);
    for seq in 0..3 {
        Record::Event(EventRecord {
            session: 0,
            seq,
            time: 5,
            type_number: 0,
            flags: 0,
            data: br#"{"t":"x"}"#,
            envelope: b"",
        })
        .encode(&mut out, FUZZ_SALT)
        .expect("encode");
    }
    Record::Commit {
        session: 0,
        first_seq: 0,
        event_count: 3,
        durable_offset: 64,
    }
    .encode(&mut out, FUZZ_SALT)
    .expect("encode");
    out
}

/// A batch whose first three events are one row entry (F-02-20), then an event frame: the
/// records of a segment after its header, under [`FUZZ_SALT`].
fn encoded_row_batch() -> Vec<u8> {
    let mut out = session_definitions(br#"{"version":0,"id":"r","createdAt":1}"#);
    let texts = [
        r#"{"t":"a"}"#,
        r#"{"t":"bc"}"#,
        r#"{"t":"d"e"}"#,
        r#"{"u":1}"#,
    ];
    let events: Vec<EventRecord<'_>> = (0u64..)
        .zip(texts)
        .map(|(seq, data)| EventRecord {
            session: 0,
            seq,
            time: 5 + 3 * i64::try_from(seq).expect("small") - 4 * i64::from(seq == 2),
            type_number: 0,
            flags: 0,
            data: data.as_bytes(),
            envelope: b"",
        })
        .collect();
    encode_row_frame(&events[..3], &mut out, FUZZ_SALT).expect("encode row entry");
    Record::Event(events[3])
        .encode(&mut out, FUZZ_SALT)
        .expect("encode");
    Record::Commit {
        session: 0,
        first_seq: 0,
        event_count: 4,
        durable_offset: 64,
    }
    .encode(&mut out, FUZZ_SALT)
    .expect("encode");
    out
}

/// The decompressed event block of the row-entry run vector (format-spec/vectors/run-rows).
fn rows_vector_event_block() -> Vec<u8> {
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
    let bytes = std::fs::read(vectors.join("run-rows.bin")).expect("run vector");
    decompressed_event_blocks(&bytes, 2, 0x0123_4567_89ab_cdef)
}

/// The event blocks, decompressed and concatenated, of a run the engine seals from a session
/// of DSH chunk events appended one at a time (packed into row entries), between others.
fn engine_chunks_block() -> Vec<u8> {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("open");
    let header = r#"{"version":0,"id":"fuzz-seed","createdAt":1790000000000}"#;
    let mut writer = store.create_session(header).expect("create");
    let mut time = 1_790_000_000_000;
    for turn in 1..=2 {
        let start = format!(r#"{{"turn":{turn}}}"#);
        writer
            .append(NewEvent {
                time: Some(time),
                ..NewEvent::new("turn/start", &start)
            })
            .expect("append");
        for step in 0..2 {
            for part in 0..4 {
                time += 3 - part;
                let data = format!(
                    r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":"part {part}\n"}}}}"#
                );
                writer
                    .append(NewEvent {
                        time: Some(time),
                        ..NewEvent::new("assistant/chunk", &data)
                    })
                    .expect("append");
            }
        }
    }
    drop(writer);
    store.close().expect("close");
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("reopen");
    store.maintain().expect("maintain");
    store.close().expect("close");
    let manifest = Manifest::read(&disk).expect("manifest").expect("present");
    let run = manifest.runs.first().expect("a run");
    let bytes = disk
        .open_read(&run_path(run.id))
        .and_then(|file| file.read_all())
        .expect("run bytes");
    decompressed_event_blocks(&bytes, run.id, run.salt)
}

/// The event blocks of a run file, decompressed, back to back.
fn decompressed_event_blocks(bytes: &[u8], id: u64, salt: u64) -> Vec<u8> {
    let entry = RunEntry {
        id,
        salt,
        file_bytes: bytes.len() as u64,
    };
    let index = RunIndex::decode(&bytes[..64], bytes, 0, &entry).expect("run index");
    let mut raw = Vec::new();
    for block in index.blocks.iter().skip(1) {
        let stored = &bytes[block.file_offset as usize..][..block.stored_bytes as usize];
        raw.extend(decode_block(stored, block, id).expect("block"));
    }
    raw
}

/// A native session of two synthetic turns, exported by the engine as a DSH log.
fn engine_dsh_log() -> Vec<u8> {
    let store = open_sim(&SimStorage::new(), sim_options(Durability::Buffered)).expect("open");
    // A fixed header time: the seed is the same on every run.
    let header = r#"{"version":0,"id":"fuzz-seed","createdAt":1790000000000}"#;
    let mut writer = store.create_session(header).expect("create");
    for turn in 1..=2 {
        let owned = turn_events(turn, 120);
        let events: Vec<_> = owned.iter().map(OwnedEvent::as_new_event).collect();
        writer.append_batch(&events).expect("append");
    }
    drop(writer);
    export_dsh_jsonl(&store, "fuzz-seed").expect("export")
}

/// A DSH log without its header line: the fold sees events only. (Some fixtures hold invalid
/// UTF-8 on purpose; the check then returns early, which is its contract.)
fn events_only(log: &[u8]) -> Vec<u8> {
    log.split_inclusive(|byte| *byte == b'\n')
        .skip(1)
        .flatten()
        .copied()
        .collect()
}

/// Every DSH fixture input (name without `.input.jsonl`, bytes), in name order; none when the
/// fixtures are missing.
fn fixture_inputs() -> Vec<(String, Vec<u8>)> {
    if !dsh_fixtures::present() {
        return Vec::new();
    }
    dsh_fixtures::case_names()
        .into_iter()
        .map(|name| {
            let bytes = dsh_fixtures::input(&name);
            (name, bytes)
        })
        .collect()
}

/// The seeds of `target` built from the engine's encoders (and the format vectors).
fn encoder_seeds(target: &str) -> Seeds {
    let mut seeds = Seeds::new();
    match target {
        "frame_decode" => {
            let mut salted = FUZZ_SALT.to_le_bytes().to_vec();
            salted.extend(encoded_records());
            seeds.insert("engine-records.bin".into(), salted);
            // The row-entry vector under its salt: the target decodes the first frame.
            let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
            let mut salted = 0x0123_4567_89ab_cdef_u64.to_le_bytes().to_vec();
            salted.extend(std::fs::read(vectors.join("frame-row-entry.bin")).expect("vector"));
            seeds.insert("vector-frame-row-entry.bin".into(), salted);
        }
        "run_entries" => {
            seeds.insert(
                "vector-run-rows-block.bin".into(),
                rows_vector_event_block(),
            );
            seeds.insert("engine-chunks-block.bin".into(), engine_chunks_block());
        }
        "segment_recovery" => {
            seeds.insert("engine-records.bin".into(), encoded_records());
            // A whole segment file (the target reads its id and salt from the header).
            let mut segment = encode_header(1, FUZZ_SALT);
            segment.extend(encoded_row_batch());
            seeds.insert("engine-row-batch.bin".into(), segment);
            seeds.insert("empty.bin".into(), Vec::new());
            let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
            for name in ["segment-two-sessions.bin", "segment-fork.bin"] {
                let bytes = std::fs::read(vectors.join(name)).expect("segment vector");
                seeds.insert(format!("vector-{name}"), bytes);
            }
        }
        "damaged_seal" => {
            // The seal lost whole (28 cuts of one byte), and a flip in each of its bytes.
            seeds.insert("seal-lost.bin".into(), [0u8, 0, 0].repeat(8));
            for byte in 0..28u8 {
                seeds.insert(format!("seal-flip-{byte:02}.bin"), vec![1, byte, byte]);
            }
            seeds.insert("commit-cut.bin".into(), vec![0, 40, 0]);
        }
        "surface_fold" => {
            seeds.insert("engine-turns.jsonl".into(), events_only(&engine_dsh_log()));
        }
        "model" => {
            for cut in 0..16u8 {
                let mut script = vec![cut.wrapping_mul(7)];
                script.extend((0..24u8).map(|step| step.wrapping_mul(37).wrapping_add(cut)));
                seeds.insert(format!("appends-cut-{cut:02}.bin"), script);
            }
            for cut in 0..24u8 {
                // Sealing, a delete and a run rewrite, cut anywhere.
                let mut script = vec![cut.wrapping_mul(11)];
                script.extend_from_slice(MODEL_SEED_SCRIPT);
                seeds.insert(format!("maintenance-cut-{cut:02}.bin"), script);
            }
            for (number, seed) in processes_seeds().into_iter().enumerate() {
                seeds.insert(format!("processes-{number:02}.bin"), seed);
            }
        }
        "dsh_import" => {
            let log = engine_dsh_log();
            for (mode, label) in [(0u8, "plain"), (1, "framed")] {
                seeds.insert(
                    format!("{label}-engine-turns.jsonl"),
                    [&[mode], &log[..]].concat(),
                );
            }
        }
        other => panic!("unknown fuzz target {other}"),
    }
    seeds
}

/// Power-cut bytes of the many-process model seeds: 255 arms none (the processes run the
/// script to its end and close), the others cut after that many disk operations × 2.
const PROCESSES_SEED_CUTS: [u8; 8] = [255, 255, 3, 10, 20, 30, 45, 60];
/// Steps (two bytes each) of one many-process model seed.
const PROCESSES_SEED_STEPS: usize = 80;

/// Many-process `model` scripts (`fuzzing/processes.rs`): a pseudo-random mix of appends,
/// lease hand-overs, refreshes, followers, maintenance, deletions and kills across two to
/// four processes, with and without a power cut.
fn processes_seeds() -> Vec<Vec<u8>> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    PROCESSES_SEED_CUTS
        .iter()
        .enumerate()
        .map(|(number, &cut)| {
            let mut script = vec![MODEL_PROCESSES, cut, number as u8];
            script.extend((0..PROCESSES_SEED_STEPS * 2).map(|_| next_random(&mut state) as u8));
            script
        })
        .collect()
}

/// The seeds of `target` built from DSH fixtures, each with whether it is small enough to be
/// committed.
fn fixture_seeds(target: &str) -> Vec<(String, Vec<u8>, bool)> {
    let mut seeds = Vec::new();
    for (name, bytes) in fixture_inputs() {
        let committed = bytes.len() <= MAX_COMMITTED_FIXTURE_BYTES;
        match target {
            "surface_fold" => seeds.push((format!("{name}.jsonl"), events_only(&bytes), committed)),
            "dsh_import" => {
                // Whole logs (header included) in the plain and the framed-zstd import mode.
                for (mode, label) in [(0u8, "plain"), (1, "framed")] {
                    let seed = [&[mode], bytes.as_slice()].concat();
                    seeds.push((format!("{label}-{name}.jsonl"), seed, committed));
                }
            }
            _ => {}
        }
    }
    seeds
}

/// The committed seeds, plus (with the fixtures present) the fixture seeds not committed.
fn replay(target: &str, check: fn(&[u8])) -> u64 {
    let mut seeds: Vec<Vec<u8>> = committed_seeds(target).into_values().collect();
    let committed = seeds.len();
    for (_, bytes, _) in fixture_seeds(target) {
        if !seeds.contains(&bytes) {
            seeds.push(bytes);
        }
    }
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut runs = 0;
    for seed in &seeds {
        check(seed);
        runs += 1;
        for _ in 0..MUTATIONS_PER_SEED {
            check(&mutate(seed, &mut state));
            runs += 1;
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "{target}: {runs} inputs from {} seeds ({committed} committed)",
        seeds.len()
    );
    runs
}

#[test]
fn frame_decode_corpus() {
    replay("frame_decode", check_frame_decode);
}

#[test]
fn run_entries_corpus() {
    replay("run_entries", check_run_entries);
}

#[test]
fn segment_recovery_corpus() {
    replay("segment_recovery", check_segment_recovery);
}

#[test]
fn damaged_seal_corpus() {
    replay("damaged_seal", check_damaged_seal);
}

#[test]
fn surface_fold_corpus() {
    replay("surface_fold", check_surface_fold);
}

#[test]
fn model_corpus() {
    replay("model", check_model);
}

#[test]
fn dsh_import_corpus() {
    replay("dsh_import", check_dsh_import);
}

/// Every seed this file builds that is meant to be committed, per target.
fn seeds_to_commit(target: &str) -> Seeds {
    let mut seeds = encoder_seeds(target);
    for (name, bytes, committed) in fixture_seeds(target) {
        if committed {
            seeds.insert(name, bytes);
        }
    }
    seeds
}

/// The committed seeds are the ones built here: a change of an encoder (or of a fixture)
/// shows up as a stale seed. Seeds added by hand (a small input that once found a bug) may sit
/// beside them. The fixture-built seeds are checked only when the fixtures are present.
#[test]
fn committed_seeds_are_current() {
    for target in TARGETS {
        let committed = committed_seeds(target);
        for (name, bytes) in seeds_to_commit(target) {
            assert!(
                committed.get(&name) == Some(&bytes),
                "fuzz/seeds/{target}/{name} is missing or stale: rewrite the seeds with \
                 `cargo test --release -p dshdb --test suite -- --ignored \
                 fuzz_replay::write_fuzz_seeds`"
            );
        }
    }
}

/// Writes `fuzz/seeds/<target>/` from the engine's encoders and the DSH fixtures (which must
/// be present). Files already there are left alone.
#[test]
#[ignore = "writes fuzz/seeds; run by hand after an encoder change"]
fn write_fuzz_seeds() {
    assert!(dsh_fixtures::present(), "the DSH fixtures are needed");
    for target in TARGETS {
        let dir = seeds_dir(target);
        std::fs::create_dir_all(&dir).expect("create seed directory");
        for (name, bytes) in seeds_to_commit(target) {
            std::fs::write(dir.join(&name), bytes).expect("write seed");
        }
    }
}
