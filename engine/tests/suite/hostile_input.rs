//! Hostile input (issue 13): every decoder is bounded and refuses past a bound with a typed
//! error, every dropped tail is reported, what append accepts every view can read, and
//! crafted exchange files are refused before anything is written.

use crate::common::*;
use dshdb::exchange::{
    export_dsh_jsonl_zstd, import_dsh_jsonl, import_dsh_jsonl_zstd, import_dsh_jsonl_zstd_limited,
    ExchangeError, ImportLimits, MAX_IMPORT_LINE_BYTES,
};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{Options, Store};
use std::io::Write;

const HEADER: &str =
    r#"{"type":"session","version":0,"id":"bomb","createdAt":1,"cwd":"/x","delegationDepth":0}"#;

fn new_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(&SimStorage::new(), options).expect("open sim store")
}

/// One zstd frame with a content checksum, as DSH writes them.
fn frame(plain: &[u8]) -> Vec<u8> {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).expect("encoder");
    encoder.include_checksum(true).expect("checksum flag");
    encoder.write_all(plain).expect("compress");
    encoder.finish().expect("finish")
}

/// A header frame, then one frame that decodes to `zeros` zero bytes (a few hundred KB of
/// zstd per GiB), written in steps so the test itself stays small.
fn zero_bomb(zeros: usize) -> Vec<u8> {
    let mut file = frame(format!("{HEADER}\n").as_bytes());
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 1).expect("encoder");
    encoder.include_checksum(true).expect("checksum flag");
    let step = vec![0u8; 1 << 20];
    let mut left = zeros;
    while left > 0 {
        let now = left.min(step.len());
        encoder.write_all(&step[..now]).expect("compress");
        left -= now;
    }
    file.extend(encoder.finish().expect("finish"));
    file
}

fn line(seq: u64, turn: u64) -> String {
    format!(r#"{{"type":"turn/start","seq":{seq},"time":1,"data":{{"turn":{turn}}}}}"#)
}

fn turn_lines(from: u64, count: u64) -> String {
    (from..from + count)
        .map(|seq| {
            let text = if seq % 2 == 0 {
                line(seq, seq / 2 + 1)
            } else {
                format!(
                    r#"{{"type":"turn/end","seq":{seq},"time":1,"data":{{"turn":{},"reason":{{"kind":"completed"}}}}}}"#,
                    seq / 2 + 1
                )
            };
            text + "\n"
        })
        .collect()
}

#[test]
fn a_zstd_bomb_of_one_gib_of_zeros_is_refused_as_too_large_with_its_line() {
    let file = zero_bomb(1 << 30);
    assert!(
        file.len() < 1 << 20,
        "the bomb is small: {} bytes",
        file.len()
    );
    let store = new_store();
    let started = std::time::Instant::now();
    let error = import_dsh_jsonl_zstd(&store, &file).expect_err("refused");
    assert!(
        matches!(error, ExchangeError::TooLarge { .. }),
        "typed bound error, got {error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!(
            "line 1 is longer than {MAX_IMPORT_LINE_BYTES} bytes (the largest event dshdb stores plus its envelope)"
        )
    );
    // Refused after about one line's worth of decoding, not after the whole GiB.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert!(store.sessions().is_empty());
}

#[test]
fn a_bomb_of_short_lines_is_refused_at_the_plaintext_limit() {
    let mut plain = format!("{HEADER}\n").into_bytes();
    plain.extend(turn_lines(0, 4).as_bytes());
    let limits = ImportLimits {
        max_line_bytes: 1024,
        max_plaintext_bytes: plain.len() as u64 - 1,
    };
    let file = [
        frame(format!("{HEADER}\n").as_bytes()),
        frame(&plain[HEADER.len() + 1..]),
    ]
    .concat();
    let store = new_store();
    let error = import_dsh_jsonl_zstd_limited(&store, &file, &limits).expect_err("refused");
    assert!(matches!(error, ExchangeError::TooLarge { .. }), "{error:?}");
    assert!(store.sessions().is_empty());
    // At the limit it imports.
    let limits = ImportLimits {
        max_plaintext_bytes: plain.len() as u64,
        ..limits
    };
    let report = import_dsh_jsonl_zstd_limited(&store, &file, &limits).expect("imports");
    assert_eq!(report.events, 4);
}

#[test]
fn a_plain_jsonl_line_past_the_limit_is_refused_before_parsing() {
    let mut plain = format!("{HEADER}\n").into_bytes();
    plain.extend(turn_lines(0, 2).as_bytes());
    let data = "y".repeat(MAX_IMPORT_LINE_BYTES);
    plain.extend(format!(r#"{{"type":"x","seq":2,"time":1,"data":"{data}"}}"#).as_bytes());
    plain.push(b'\n');
    let store = new_store();
    let error = import_dsh_jsonl(&store, &plain).expect_err("refused");
    assert!(matches!(error, ExchangeError::TooLarge { .. }), "{error:?}");
    assert!(
        error.to_string().starts_with("line 3 is longer than"),
        "{error}"
    );
}

#[test]
fn a_torn_zstd_frame_without_a_complete_block_is_reported_as_a_dropped_tail() {
    // Frame 2 is whole; frame 3 is cut inside its only block: nothing of it decodes.
    let header = frame(format!("{HEADER}\n").as_bytes());
    let second = frame(turn_lines(0, 2).as_bytes());
    let third = frame(turn_lines(2, 2).as_bytes());
    let cut = third.len() / 2;
    let file = [header.clone(), second.clone(), third[..cut].to_vec()].concat();
    let store = new_store();
    let report = import_dsh_jsonl_zstd(&store, &file).expect("a torn frame is tolerated");
    assert_eq!(report.events, 2, "frame 2's events are kept");
    let tail = report.dropped.expect("the torn frame is reported");
    let torn = tail.torn_frame.expect("as a torn zstd frame");
    assert_eq!(torn.file_offset, (header.len() + second.len()) as u64);
    assert_eq!(torn.file_bytes, cut as u64);
    assert_eq!(torn.recovered_bytes, 0);
    assert_eq!(
        tail.reason,
        "torn final zstd frame (no complete block to recover)"
    );
}

#[test]
fn a_torn_zstd_frame_keeps_the_complete_lines_of_its_complete_blocks() {
    // Frame 2 spans several 128 KiB blocks; cut inside the last one.
    let lines = turn_lines(0, 20_000);
    let header = frame(format!("{HEADER}\n").as_bytes());
    let second = frame(lines.as_bytes());
    let file = [header.clone(), second[..second.len() - 8].to_vec()].concat();
    let store = new_store();
    let report = import_dsh_jsonl_zstd(&store, &file).expect("a torn frame is tolerated");
    let tail = report.dropped.clone().expect("reported");
    let torn = tail.torn_frame.expect("torn frame");
    assert!(torn.recovered_bytes > 0, "{tail:?}");
    assert!(report.events > 0 && report.events < 20_000, "{report:?}");
    // What was kept is exactly the complete lines before the reported tail.
    let exported = export_dsh_jsonl_zstd(&store, &report.session_id).expect("export");
    let plain = zstd::stream::decode_all(exported.as_slice()).expect("decodes");
    let whole = format!("{HEADER}\n{lines}");
    assert_eq!(plain.len() as u64, tail.offset);
    assert!(whole.as_bytes().starts_with(&plain));
    assert_eq!(
        tail.offset + tail.bytes,
        (HEADER.len() + 1) as u64 + torn.recovered_bytes
    );
}
