//! Replays the fuzz targets' properties in CI (no nightly needed): over the committed seed
//! corpora in `fuzz/seeds/`, over seeds built here from the engine's encoders and the DSH
//! fixtures, and over a fixed number of deterministic mutations of every seed.

use dshdb::frame::{EventRecord, Record, NO_SEED_PARENT};
use dshdb::fuzzing::{
    check_dsh_import, check_frame_decode, check_model, check_segment_recovery, check_surface_fold,
    FUZZ_SALT, MODEL_SEED_SCRIPT,
};
use std::io::Write;
use std::path::Path;

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

fn committed_seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut seeds = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            if let Ok(bytes) = std::fs::read(entry.path()) {
                seeds.push(bytes);
            }
        }
    }
    seeds
}

fn encoded_records() -> Vec<u8> {
    let mut out = Vec::new();
    Record::SessionHeader {
        session: 0,
        seed_parent: NO_SEED_PARENT,
        seed_length: 0,
        header_json: br#"{"version":0,"id":"f","createdAt":1}"#,
    }
    .encode(&mut out, FUZZ_SALT);
    Record::TypeDefinition {
        type_number: 0,
        name: b"assistant/chunk",
    }
    .encode(&mut out, FUZZ_SALT);
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
        .encode(&mut out, FUZZ_SALT);
    }
    Record::Commit {
        session: 0,
        first_seq: 0,
        event_count: 3,
        durable_offset: 64,
    }
    .encode(&mut out, FUZZ_SALT);
    out
}

/// The bytes of every DSH fixture input, in name order.
fn fixture_inputs() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/dsh");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("DSH fixtures beside the repo")
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.to_string_lossy().ends_with(".input.jsonl"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|path| std::fs::read(path).expect("fixture"))
        .collect()
}

fn fixture_logs() -> Vec<Vec<u8>> {
    // Drop the header line: the fold sees events only. (Some fixtures hold invalid UTF-8 on
    // purpose; the check then returns early, which is its contract.)
    fixture_inputs()
        .iter()
        .map(|bytes| {
            bytes
                .split_inclusive(|byte| *byte == b'\n')
                .skip(1)
                .flatten()
                .copied()
                .collect()
        })
        .collect()
}

fn replay(target: &str, mut seeds: Vec<Vec<u8>>, check: fn(&[u8])) -> u64 {
    seeds.extend(committed_seeds(target));
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
        "{target}: {runs} inputs from {} seeds",
        seeds.len()
    );
    assert!(!seeds.is_empty(), "{target} has no seeds");
    runs
}

#[test]
fn frame_decode_corpus() {
    let mut salted = FUZZ_SALT.to_le_bytes().to_vec();
    salted.extend(encoded_records());
    replay("frame_decode", vec![salted], check_frame_decode);
}

#[test]
fn segment_recovery_corpus() {
    let vectors = Path::new(env!("CARGO_MANIFEST_DIR")).join("../format-spec/vectors");
    let mut seeds = vec![encoded_records(), Vec::new()];
    for name in ["segment-two-sessions.bin", "segment-fork.bin"] {
        seeds.push(std::fs::read(vectors.join(name)).expect("segment vector"));
    }
    replay("segment_recovery", seeds, check_segment_recovery);
}

#[test]
fn surface_fold_corpus() {
    replay("surface_fold", fixture_logs(), check_surface_fold);
}

#[test]
fn model_corpus() {
    let seeds = (0..16u8)
        .map(|cut| {
            let mut script = vec![cut.wrapping_mul(7)];
            script.extend((0..24u8).map(|step| step.wrapping_mul(37).wrapping_add(cut)));
            script
        })
        .chain((0..24u8).map(|cut| {
            // Sealing, a delete and a run rewrite, cut anywhere.
            let mut script = vec![cut.wrapping_mul(11)];
            script.extend_from_slice(MODEL_SEED_SCRIPT);
            script
        }))
        .collect();
    replay("model", seeds, check_model);
}

/// Whole fixture logs (header included) in the plain and the framed-zstd import mode.
fn import_seeds() -> Vec<Vec<u8>> {
    fixture_inputs()
        .iter()
        .flat_map(|bytes| [0u8, 1].map(|mode| [&[mode], bytes.as_slice()].concat()))
        .collect()
}

#[test]
fn dsh_import_corpus() {
    replay("dsh_import", import_seeds(), check_dsh_import);
}
