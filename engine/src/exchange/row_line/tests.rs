//! The one-pass row reader against the general reader: on every line it decides, the same
//! members and a re-packing that is the line itself; on DSH's own rows, it decides.

use super::*;
use crate::exchange::scan::{decode_generally, pack_row, push_member_data, Record};

use dshdb_test_support::mutation::{mutated as mutated_bytes, Draws};

/// Pieces of payload text: plain, multi-byte, every escape kind, a lone surrogate.
const PAYLOAD_PIECES: [&str; 12] = [
    "a",
    "hello ",
    "é",
    "日本",
    "\\\"",
    "\\\\",
    "\\/",
    "\\n\\t\\r\\b\\f",
    "\\u0041",
    "\\ud800",
    "{\\\"k\\\":",
    "🙂",
];

fn payload(draws: &mut Draws) -> String {
    let mut text = String::from("\"");
    for _ in 0..draws.below(6) {
        text.push_str(draws.pick(&PAYLOAD_PIECES));
    }
    text.push('"');
    text
}

/// A row line as DSH writes it ([`RowShape::row_line`]), of random shape and size.
fn dsh_row(draws: &mut Draws) -> String {
    let integers = ["0", "1", "7", "-3", "12", "9007199254740991"];
    let tag = [RowTag::Text, RowTag::Reasoning, RowTag::ToolCall][draws.below(3)];
    let id = payload(draws);
    let name = payload(draws);
    let shape = RowShape {
        tag,
        turn: draws.pick(&integers),
        step: draws.pick(&integers),
        index: draws.pick(&integers),
        id: (tag == RowTag::ToolCall).then_some(id.as_str()),
        name: (tag == RowTag::ToolCall && draws.below(2) == 0).then_some(name.as_str()),
    };
    let members = 1 + draws.below(5);
    let payloads: Vec<String> = (0..members).map(|_| payload(draws)).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    let gaps: Vec<i64> = (1..members)
        .map(|_| [0, 1, 5, -2, 40, 1000][draws.below(6)])
        .collect();
    let seq0 = [0, 4, 99][draws.below(3)];
    let time0 = [0, 1_790_000_000_000, -5][draws.below(3)];
    let line = shape.row_line(seq0, time0, &gaps, &payloads);
    String::from_utf8(line).expect("a row line is UTF-8")
}

/// Bytes a mutation inserts or writes: JSON's structure, whitespace, digits and signs,
/// escape and control characters.
const MUTATION_BYTES: &[u8] = b" ,:\"\\{}[]0-19.eEu\x01\x1ftx";

fn mutated(line: &str, draws: &mut Draws) -> Vec<u8> {
    mutated_bytes(line.as_bytes(), MUTATION_BYTES, draws)
}

/// Checks one line: when the one-pass reader decides, the general reader gives the same
/// members and re-packs them into the line itself. Returns whether it decided.
fn agrees(line: &str) -> bool {
    let Some(row) = read_canonical_row(line) else {
        return false;
    };
    let Ok(Record::Row { members }) = decode_generally(line) else {
        panic!("the general reader refuses a line the one-pass reader read: {line}");
    };
    let prefix = row.shape.member_prefix();
    let fast: Vec<(u64, i64, String)> = row
        .payloads
        .iter()
        .zip(row.seq0..)
        .zip(&row.times)
        .map(|((payload, seq), time)| {
            let mut data = String::new();
            push_member_data(&mut data, &prefix, payload);
            (seq, *time, data)
        })
        .collect();
    let general: Vec<(u64, i64, String)> = members
        .iter()
        .map(|event| {
            assert_eq!(event.event_type, crate::exchange::scan::ROW_MEMBER_TYPE);
            assert!(!event.ignorable && event.surface_op.is_none());
            (event.seq, event.time, event.data.get().to_owned())
        })
        .collect();
    assert_eq!(fast, general, "{line}");
    assert_eq!(row.members(), u64::try_from(members.len()).expect("count"));
    let triples: Vec<(u64, i64, &str)> = general
        .iter()
        .map(|(seq, time, data)| (*seq, *time, data.as_str()))
        .collect();
    assert_eq!(
        pack_row(&triples).as_deref(),
        Some(line.as_bytes()),
        "re-packed: {line}"
    );
    true
}

#[test]
fn dsh_rows_are_read_in_one_pass_as_the_general_reader_reads_them() {
    let mut draws = Draws::new(0x5eed_1234_abcd_0001);
    for _ in 0..3_000 {
        let line = dsh_row(&mut draws);
        assert!(agrees(&line), "DSH's own row not read in one pass: {line}");
    }
}

#[test]
fn mutated_rows_decide_only_as_the_general_reader_does() {
    let mut draws = Draws::new(0x0dd_ba11_cafe_0002);
    let (mut lines, mut decided) = (0, 0);
    for _ in 0..4_000 {
        let line = dsh_row(&mut draws);
        for _ in 0..10 {
            let bytes = mutated(&line, &mut draws);
            // The import reads a line that is not UTF-8 the general (lossy) way only.
            let Ok(text) = std::str::from_utf8(&bytes) else {
                continue;
            };
            lines += 1;
            decided += usize::from(agrees(text));
        }
    }
    // Some mutations keep a DSH row (a digit changed, a payload grown): both ways read it.
    assert!(
        decided > lines / 20,
        "{decided} of {lines} mutated lines decided"
    );
}

/// The odd rows issue #14 names, each beside what the one-pass reader does with it.
#[test]
fn odd_rows_go_the_general_way_or_agree_with_it() {
    let decided = [
        // A negative gap, a one-member row, a tool call without a name.
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3,-2],"texts":["a","b\"c","d"]}}"#,
        r#"{"type":"reasoning-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":2,"index":1,"dt":[],"texts":["\ud800"]}}"#,
        r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"dt":[1],"id":"c1","args":["{\"","}"]}}"#,
        r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"dt":[1],"id":"c1","name":"ls","args":["{\"","}"]}}"#,
    ];
    let general_only = [
        // Odd key order, duplicate keys, whitespace, a number DSH does not print.
        r#"{"seq0":4,"type":"text-chunks","time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]},"type":"turn/start"}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"],"dt":[4]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a", "b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[-0],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3.0],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":010,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":-1,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":9007199254740991,"data":{"turn":1,"step":0,"index":0,"dt":[1],"texts":["a","b"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b","c"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[],"texts":[]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[],"texts":["a\x"]}}"#,
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[],"texts":["a\u12"]}}"#,
        "{\"type\":\"text-chunks\",\"seq0\":4,\"time0\":10,\"data\":{\"turn\":1,\"step\":0,\"index\":0,\"dt\":[],\"texts\":[\"a\tb\"]}}",
        r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[],"texts":["a"]}} "#,
        r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"id":"c1","name":"ls","dt":[1],"args":["a","b"]}}"#,
        r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"dt":[1],"name":"ls","id":"c1","args":["a","b"]}}"#,
        r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"dt":[1],"id":null,"args":["a","b"]}}"#,
    ];
    for line in decided {
        assert!(agrees(line), "not read in one pass: {line}");
    }
    for line in general_only {
        assert!(
            read_canonical_row(line).is_none(),
            "read in one pass: {line}"
        );
    }
}

/// The word-at-a-time run agrees with a byte loop wherever the stop byte falls.
#[test]
fn the_plain_run_stops_where_a_byte_loop_stops() {
    for length in 0..40 {
        for stop in [None, Some(b'"'), Some(b'\\'), Some(0x00), Some(0x1f)] {
            for at in 0..length {
                let mut bytes = vec![b'x'; length];
                bytes.iter_mut().step_by(3).for_each(|byte| *byte = 0xc3);
                if let Some(stop) = stop {
                    bytes[at] = stop;
                }
                let expected = bytes
                    .iter()
                    .position(|&byte| ends_plain_run(byte))
                    .unwrap_or(length);
                assert_eq!(plain_run(&bytes), expected, "{bytes:?}");
            }
        }
    }
}
