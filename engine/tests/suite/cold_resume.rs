//! Cold resume by streaming (`exchange::cold`): the messages it derives are exactly those of
//! the full cold load (`exchange::messages_full`) on every DSH fixture and on generated
//! sessions with packed chunk rows across read chunks, compactions, pruned tool results,
//! forks and interrupted turns; a log that needs the full load (legacy shapes, refusals)
//! is handed over to it, so `exchange::messages` (texts) and `exchange::messages_full` give the same
//! result or the same error, also on 100 mutated logs.

use crate::common::dsh_fixtures;

use dsh_fixtures::*;

use crate::common;

use common::*;
use dshdb::derive::cold::{stream_message_texts, stream_messages, Streamed, READ_CHUNK_EVENTS};
use dshdb::derive::{message_texts, messages_full, restore};
use dshdb::exchange::import_dsh_jsonl;
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Options, Store};
use std::fmt::Write as _;
use std::fs;

fn new_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(&SimStorage::new(), options).expect("open sim store")
}

/// The full load's message texts (exact JSON text of each message).
fn full_texts(store: &Store, id: &str) -> Result<Vec<String>, String> {
    let restored = restore(store, id).map_err(|error| error.to_string())?;
    let texts = restored.surface.derive_message_texts();
    Ok(texts.iter().map(|text| text.get().to_owned()).collect())
}

/// Asserts that streaming agrees with the full load on session `id`, as values and as
/// exact texts; returns whether both streamed (rather than handing over to the full load).
fn assert_stream_agrees(store: &Store, id: &str, context: &str) -> bool {
    let full = messages_full(store, id).map_err(|error| error.to_string());
    let full_text = full_texts(store, id);
    let public_texts = message_texts(store, id).map_err(|error| error.to_string());
    assert_eq!(
        public_texts, full_text,
        "{context}: messages() vs the full load"
    );
    let values_streamed = match stream_messages(store, id).expect("no store error") {
        Streamed::Messages(streamed) => {
            assert_eq!(Ok(streamed), full, "{context}: streamed vs the full load");
            true
        }
        Streamed::NeedsFullLoad(_) => false,
    };
    let texts_streamed = match stream_message_texts(store, id).expect("no store error") {
        Streamed::Messages(streamed) => {
            assert_eq!(
                Ok(streamed),
                full_text,
                "{context}: streamed texts vs the full load"
            );
            true
        }
        Streamed::NeedsFullLoad(_) => false,
    };
    assert_eq!(
        values_streamed, texts_streamed,
        "{context}: both forms stream"
    );
    values_streamed
}

#[test]
fn streamed_messages_equal_the_full_load_on_every_fixture() {
    if !dsh_fixtures::present() {
        return;
    }
    let (mut streamed, mut handed_over) = (Vec::new(), Vec::new());
    for name in case_names() {
        let bytes = fs::read(fixture_path(&name, "input.jsonl")).expect("input");
        let store = new_store();
        let Ok(report) = import_dsh_jsonl(&store, &bytes) else {
            continue;
        };
        if assert_stream_agrees(&store, &report.session_id, &name) {
            streamed.push(name);
        } else {
            handed_over.push(name);
        }
    }
    eprintln!("streamed: {streamed:?}\nhanded over to the full load: {handed_over:?}");
    // Legacy shapes (most of the real DSH logs here) are migrated as the log streams.
    assert!(handed_over.is_empty(), "{handed_over:?}");
    // The current-shape cases stream (rows, verbatim lines, compaction, prune, repair).
    for name in [
        "syn-compaction-replace",
        "syn-crash-torn-open-turn",
        "syn-closed-dangling-tool-call",
        "syn-packed-chunks",
        "syn-unicode-crlf",
        "syn-numbers",
    ] {
        assert!(streamed.contains(&name.to_owned()), "{name} should stream");
    }
}

/// A visible `tool/result` node the generator may prune: its seq and payload parts.
#[derive(Clone)]
struct ResultNode {
    seq: u64,
    turn: u64,
    step: u64,
    call: String,
}

/// A DSH `session.jsonl` built line by line, tracking the surface as DSH would.
struct Generator {
    rng: Rng,
    text: String,
    seq: u64,
    time: i64,
    turn: u64,
    /// Visible surface node seqs, in positional order.
    nodes: Vec<u64>,
    results: Vec<ResultNode>,
}

const START_TIME_MS: i64 = 1_790_000_000_000;

fn text_block(text: &str) -> String {
    format!(r#"{{"type":"text","text":"{text}"}}"#)
}

fn tool_result_data(node: &ResultNode, id: &str, output: &str) -> String {
    let block = format!(
        r#"{{"type":"tool-result","toolCallId":"{}","content":[{}]}}"#,
        node.call,
        text_block(output)
    );
    format!(
        r#"{{"turn":{},"step":{},"message":{{"source":{{"kind":"tool","callId":"{}"}},"content":[{block}],"role":"user","id":"{id}"}}}}"#,
        node.turn, node.step, node.call
    )
}

impl Generator {
    fn new(seed: u64, id: &str) -> Self {
        let mut text = String::new();
        let _ = writeln!(
            text,
            r#"{{"type":"session","version":0,"id":"{id}","createdAt":{START_TIME_MS},"cwd":"/w","delegationDepth":0}}"#
        );
        Self {
            rng: Rng(seed),
            text,
            seq: 0,
            time: START_TIME_MS,
            turn: 0,
            nodes: Vec::new(),
            results: Vec::new(),
        }
    }

    /// Writes one event line; returns its seq.
    fn line(&mut self, event_type: &str, data: &str, envelope: &str) -> u64 {
        let seq = self.seq;
        let separator = if envelope.is_empty() { "" } else { "," };
        let _ = writeln!(
            self.text,
            r#"{{"type":"{event_type}","seq":{seq},"time":{},"data":{data}{separator}{envelope}}}"#,
            self.time
        );
        self.seq += 1;
        self.time += 1 + i64::try_from(self.rng.below(3)).unwrap_or(0);
        seq
    }

    fn append(&mut self, event_type: &str, data: &str, sources: &[u64]) -> u64 {
        let envelope = if sources.is_empty() {
            r#""surfaceOp":"append""#.to_owned()
        } else {
            let list: Vec<String> = sources.iter().map(u64::to_string).collect();
            format!(
                r#""sourceEventSeqs":[{}],"surfaceOp":"append""#,
                list.join(",")
            )
        };
        let seq = self.line(event_type, data, &envelope);
        self.nodes.push(seq);
        seq
    }

    /// Replaces visible nodes `first..=last` (positions) with a new surface event.
    fn replace(&mut self, event_type: &str, data: &str, first: usize, last: usize, extra: &[u64]) {
        let (start, end) = (self.nodes[first], self.nodes[last]);
        let mut sources: Vec<u64> = extra.to_vec();
        sources.extend(&self.nodes[first..=last]);
        let list: Vec<String> = sources.iter().map(u64::to_string).collect();
        let envelope = format!(
            r#""sourceEventSeqs":[{}],"surfaceOp":{{"op":"replace","start":{start},"end":{end}}}"#,
            list.join(",")
        );
        let seq = self.line(event_type, data, &envelope);
        let shadowed: Vec<u64> = self.nodes.splice(first..=last, [seq]).collect();
        self.results.retain(|node| !shadowed.contains(&node.seq));
    }

    fn user_message(&mut self, text: &str) {
        let id = format!("u-{}", self.seq);
        let data = format!(
            r#"{{"content":[{}],"source":{{"kind":"user"}},"role":"user","id":"{id}"}}"#,
            text_block(text)
        );
        self.append("user/message", &data, &[]);
    }

    /// Streaming chunks of one step: packed rows (up to 80 members, so rows cross read
    /// chunks) or single `assistant/chunk` lines.
    fn chunks(&mut self, step: u64) {
        let turn = self.turn;
        for _ in 0..1 + self.rng.below(3) {
            let members = 1 + self.rng.below(80);
            if self.rng.below(3) > 0 {
                let tag = if self.rng.below(2) == 0 {
                    "text-chunks"
                } else {
                    "reasoning-chunks"
                };
                let texts: Vec<String> = (0..members).map(|k| format!("\"t{k} \"")).collect();
                let gaps: Vec<String> = (1..members).map(|k| (k % 7).to_string()).collect();
                let _ = writeln!(
                    self.text,
                    r#"{{"type":"{tag}","seq0":{},"time0":{},"data":{{"turn":{turn},"step":{step},"index":0,"dt":[{}],"texts":[{}]}}}}"#,
                    self.seq,
                    self.time,
                    gaps.join(","),
                    texts.join(",")
                );
                self.seq += members;
                self.time += (1..members)
                    .map(|k| i64::try_from(k % 7).unwrap_or(0))
                    .sum::<i64>()
                    + 1;
            } else {
                for k in 0..members {
                    let data = format!(
                        r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":"c{k}"}}}}"#
                    );
                    self.line("assistant/chunk", &data, "");
                }
            }
        }
    }

    /// One step: chunks, an assistant message with 0-2 tool calls, their calls and results.
    /// With `interrupted`, the step stops after the first `tool/call` (no results, no end).
    fn step(&mut self, step: u64, interrupted: bool) {
        let turn = self.turn;
        self.line(
            "step/start",
            &format!(r#"{{"turn":{turn},"step":{step}}}"#),
            "",
        );
        self.chunks(step);
        let calls: Vec<String> = (0..self.rng.below(3) + u64::from(interrupted))
            .map(|k| format!("call-{}-{k}", self.seq))
            .collect();
        let mut content: Vec<String> = Vec::new();
        if calls.is_empty() && self.rng.below(8) == 0 {
            // An empty assistant message: a surface node without a message.
        } else {
            content.push(text_block("thinking about it"));
        }
        for call in &calls {
            content.push(format!(
                r#"{{"type":"tool-call","id":"{call}","name":"bash","arguments":"{{}}"}}"#
            ));
        }
        let data = format!(
            r#"{{"turn":{turn},"step":{step},"message":{{"role":"assistant","content":[{}],"source":{{"kind":"model","provider":"p","model":"m"}},"id":"a-{}"}}}}"#,
            content.join(","),
            self.seq
        );
        self.append("assistant/message", &data, &[]);
        for call in &calls {
            let call_data = format!(
                r#"{{"turn":{turn},"step":{step},"callId":"{call}","name":"bash","arguments":"{{}}"}}"#
            );
            let call_seq = self.line("tool/call", &call_data, "");
            if interrupted {
                return;
            }
            let node = ResultNode {
                seq: self.seq,
                turn,
                step,
                call: call.clone(),
            };
            let output = "x".repeat(usize::try_from(self.rng.below(200)).unwrap_or(0));
            let data = tool_result_data(&node, &format!("r-{}", node.seq), &output);
            self.append("tool/result", &data, &[call_seq]);
            self.results.push(node);
        }
        self.line(
            "step/end",
            &format!(r#"{{"turn":{turn},"step":{step}}}"#),
            "",
        );
    }

    fn turn(&mut self, interrupted: bool) {
        self.turn += 1;
        let turn = self.turn;
        self.line("turn/start", &format!(r#"{{"turn":{turn}}}"#), "");
        self.user_message("please do the thing");
        let steps = 1 + self.rng.below(3);
        for step in 1..=steps {
            let last = step == steps;
            self.step(step, interrupted && last);
        }
        if !interrupted {
            let data = format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#);
            self.line("turn/end", &data, "");
        }
    }

    /// A standalone compaction bracket replacing a run of visible nodes with a summary.
    fn compaction(&mut self) {
        if self.nodes.len() < 4 {
            return;
        }
        let id = format!("compaction-{}", self.seq);
        let last = usize::try_from(self.rng.below(self.nodes.len() as u64 - 1)).unwrap_or(0) + 1;
        let first = usize::try_from(self.rng.below(last as u64)).unwrap_or(0);
        let start = self.line(
            "compaction/start",
            &format!(r#"{{"compactionId":"{id}","turn":null}}"#),
            "",
        );
        let shadowed: Vec<String> = self.nodes[first..=last]
            .iter()
            .map(u64::to_string)
            .collect();
        let summary = self.line(
            "compaction/summary",
            &format!(
                r#"{{"compactionId":"{id}","summary":[{}],"shadowedRange":{{"start":{},"end":{}}},"shadowedSeqs":[{}],"shadowedTokenCount":0,"provider":"mock","model":"stub"}}"#,
                text_block("summary"),
                self.nodes[first],
                self.nodes[last],
                shadowed.join(",")
            ),
            "",
        );
        let data = format!(
            r#"{{"content":[{}],"source":{{"kind":"plugin","plugin":"compact","compactionId":"{id}"}},"role":"user","id":"s-{}"}}"#,
            text_block("summary"),
            self.seq
        );
        self.replace("user/message", &data, first, last, &[start, summary]);
        self.line(
            "compaction/end",
            &format!(r#"{{"compactionId":"{id}","turn":null}}"#),
            "",
        );
    }

    /// A pruned tool result: the visible result replaced by one with shorter content.
    fn prune(&mut self) {
        let Some(node) = self.results.last().cloned() else {
            return;
        };
        let Some(position) = self.nodes.iter().position(|seq| *seq == node.seq) else {
            return;
        };
        self.line(
            "compaction/prune",
            &format!(
                r#"{{"shadowedRange":{{"start":{0},"end":{0}}},"shadowedSeqs":[{0}],"shadowedTokenCount":1}}"#,
                node.seq
            ),
            "",
        );
        let data = tool_result_data(&node, &format!("r-{}", node.seq), "pruned");
        self.replace("tool/result", &data, position, position, &[]);
    }

    /// A session of about `events` events, ending inside an interrupted turn.
    fn session(mut self, events: u64) -> Vec<u8> {
        while self.seq < events {
            self.turn(false);
            match self.rng.below(6) {
                0 => self.compaction(),
                1 => self.prune(),
                _ => {}
            }
        }
        self.turn(true);
        self.text.into_bytes()
    }
}

#[test]
fn streamed_messages_equal_the_full_load_on_generated_sessions() {
    for seed in 0..4_u64 {
        let id = format!("generated-{seed}");
        let jsonl = Generator::new(seed, &id).session(3 * READ_CHUNK_EVENTS);
        let store = new_store();
        let report = import_dsh_jsonl(&store, &jsonl).expect("a DSH-valid generated session");
        assert!(report.rows > 0 && report.events > 2 * READ_CHUNK_EVENTS);
        assert!(
            assert_stream_agrees(&store, &id, &id),
            "{id} should stream, not hand over"
        );
        let derived = messages_full(&store, &id).expect("messages");
        let interrupted = derived
            .iter()
            .filter(|message| {
                message["id"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("interrupted-")
            })
            .count();
        assert!(
            interrupted >= 1,
            "{id}: the open turn's pending calls are closed"
        );
    }
}

fn append(writer: &mut dshdb::store::SessionWriter, event_type: &str, data: &str, envelope: &str) {
    writer
        .append(NewEvent {
            event_type,
            time: Some(START_TIME_MS),
            data,
            envelope,
            flags: 0,
        })
        .expect("append");
}

#[test]
fn forks_stream_their_parents_seed() {
    let store = new_store();
    let jsonl = Generator::new(11, "parent").session(READ_CHUNK_EVENTS + 500);
    import_dsh_jsonl(&store, &jsonl).expect("import");
    let events = store.read("parent", 0, u64::MAX).expect("read");
    let boundaries: Vec<u64> = events
        .iter()
        .filter(|event| event.event_type == "turn/end")
        .map(|event| event.seq)
        .collect();
    for (number, at) in [boundaries[1], boundaries[boundaries.len() - 1]]
        .into_iter()
        .enumerate()
    {
        let child = format!("child-{number}");
        let mut writer = store.fork("parent", at, &child).expect("fork");
        let turn = 1000 + number;
        append(
            &mut writer,
            "turn/start",
            &format!(r#"{{"turn":{turn}}}"#),
            "",
        );
        append(
            &mut writer,
            "user/message",
            r#"{"content":[],"source":{"kind":"user"},"role":"user","id":"child-u"}"#,
            r#""surfaceOp":"append""#,
        );
        drop(writer);
        assert!(
            assert_stream_agrees(&store, &child, &child),
            "{child} streams"
        );
    }
}

#[test]
fn logs_the_stream_cannot_take_are_handed_over_with_the_same_result_or_error() {
    let store = new_store();
    let mut writer = store.create_session_with_id("legacy").expect("create");
    // A legacy user message (no id/role): DSH migrates it in memory on load.
    append(
        &mut writer,
        "user/message",
        r#"{"content":[],"source":{"kind":"user"}}"#,
        r#""surfaceOp":"append""#,
    );
    drop(writer);
    assert!(
        assert_stream_agrees(&store, "legacy", "legacy"),
        "migrated as it streams"
    );
    assert_eq!(message_texts(&store, "legacy").expect("migrated").len(), 1);

    // A legacy replacement result inherits the id of the result it replaces: handed over.
    let mut writer = store.create_session_with_id("inherits").expect("create");
    append(
        &mut writer,
        "tool/result",
        r#"{"callId":"c","content":[]}"#,
        r#""surfaceOp":"append""#,
    );
    append(
        &mut writer,
        "tool/result",
        r#"{"callId":"c","content":[{"type":"text","text":"x"}]}"#,
        r#""sourceEventSeqs":[0],"surfaceOp":{"op":"replace","start":0,"end":0}"#,
    );
    drop(writer);
    assert!(!assert_stream_agrees(&store, "inherits", "inherits"));
    assert_eq!(
        message_texts(&store, "inherits").expect("migrated").len(),
        1
    );

    let refusals = [
        ("unknown type", "plugin/thing", "{}", ""),
        (
            "bad message shape",
            "assistant/message",
            r#"{"message":{"id":"a","role":"user","content":[],"source":{"kind":"model","provider":"p","model":"m"}}}"#,
            r#""surfaceOp":"append""#,
        ),
        (
            "marker on a log-only type",
            "assistant/chunk",
            "{}",
            r#""surfaceOp":"append""#,
        ),
        (
            "replace of a missing node",
            "user/message",
            r#"{"content":[],"source":{"kind":"user"},"role":"user","id":"u"}"#,
            r#""sourceEventSeqs":[0],"surfaceOp":{"op":"replace","start":7,"end":7}"#,
        ),
        ("removed legacy type", "mode/set", "{}", ""),
    ];
    for (case, event_type, data, envelope) in refusals {
        let store = new_store();
        let mut writer = store.create_session_with_id("s").expect("create");
        for _ in 0..3 {
            writer.append(chunk("{}")).expect("chunk");
        }
        append(&mut writer, event_type, data, envelope);
        drop(writer);
        let full = messages_full(&store, "s");
        assert!(full.is_err(), "{case}: the full load refuses it");
        assert!(
            !assert_stream_agrees(&store, "s", case),
            "{case}: handed over"
        );
    }
}

#[test]
fn empty_and_log_only_sessions_stream() {
    let store = new_store();
    drop(store.create_session_with_id("empty").expect("create"));
    assert!(assert_stream_agrees(&store, "empty", "empty"));
    let mut writer = store.create_session_with_id("chunks").expect("create");
    for _ in 0..10 {
        writer.append(chunk("{}")).expect("chunk");
    }
    append(&mut writer, "session/end-seed", "{}", "");
    drop(writer);
    assert!(assert_stream_agrees(&store, "chunks", "chunks"));
}

/// One stored event of a mutation case: type, time, data and envelope.
type Stored = (String, i64, String, String);

/// A small valid session as stored events (closed turns, a tool call, an open last turn).
fn base_events() -> Vec<Stored> {
    let event = |event_type: &str, data: &str, envelope: &str| {
        (
            event_type.to_owned(),
            START_TIME_MS,
            data.to_owned(),
            envelope.to_owned(),
        )
    };
    let append = r#""surfaceOp":"append""#;
    let mut events = Vec::new();
    for turn in 1..=3 {
        let seq = events.len();
        events.push(event("turn/start", &format!(r#"{{"turn":{turn}}}"#), ""));
        events.push(event(
            "user/message",
            &format!(r#"{{"content":[{{"type":"text","text":"q{turn} \ud83d\ude00"}}],"source":{{"kind":"user"}},"role":"user","id":"u{seq}"}}"#),
            append,
        ));
        events.push(event(
            "step/start",
            &format!(r#"{{"turn":{turn},"step":1}}"#),
            "",
        ));
        for k in 0..3 {
            events.push(event(
                "assistant/chunk",
                &format!(r#"{{"turn":{turn},"step":1,"chunk":{{"type":"text-delta","index":0,"text":"c{k}"}}}}"#),
                "",
            ));
        }
        events.push(event(
            "assistant/message",
            &format!(r#"{{"turn":{turn},"step":1,"message":{{"role":"assistant","content":[{{"type":"text","text":"a"}},{{"type":"tool-call","id":"call-{turn}","name":"bash","arguments":"{{}}"}}],"source":{{"kind":"model","provider":"p","model":"m"}},"id":"a{seq}"}}}}"#),
            append,
        ));
        let call = events.len();
        events.push(event(
            "tool/call",
            &format!(r#"{{"turn":{turn},"step":1,"callId":"call-{turn}","name":"bash","arguments":"{{}}"}}"#),
            "",
        ));
        if turn < 3 {
            events.push(event(
                "tool/result",
                &format!(r#"{{"turn":{turn},"step":1,"message":{{"source":{{"kind":"tool","callId":"call-{turn}"}},"content":[{{"type":"tool-result","toolCallId":"call-{turn}","content":[{{"type":"text","text":"out"}}]}}],"role":"user","id":"r{call}"}}}}"#),
                &format!(r#""sourceEventSeqs":[{call}],"surfaceOp":"append""#),
            ));
            events.push(event(
                "step/end",
                &format!(r#"{{"turn":{turn},"step":1}}"#),
                "",
            ));
            events.push(event(
                "turn/end",
                &format!(r#"{{"turn":{turn},"reason":{{"kind":"completed"}}}}"#),
                "",
            ));
        }
    }
    events
}

/// Mutates one event the way a damaged, legacy or unusual log would differ.
fn mutate(events: &mut [Stored], rng: &mut Rng) {
    let position = usize::try_from(rng.below(events.len() as u64)).unwrap_or(0);
    let (event_type, time, data, envelope) = &mut events[position];
    let replace = |text: &mut String, from: &str, to: &str| *text = text.replacen(from, to, 1);
    match rng.below(16) {
        0 => replace(data, r#""id":"#, r#""identity":"#),
        1 => replace(data, r#""role":"user""#, r#""role":"assistant""#),
        2 => replace(
            data,
            r#""content":["#,
            r#""content":"not an array","was":["#,
        ),
        3 => replace(data, r#""callId":"call-1"}"#, r#""callId":"other"}"#),
        4 => *envelope = r#""surfaceOp":"append""#.to_owned(),
        5 => envelope.clear(),
        6 => {
            *envelope =
                r#""sourceEventSeqs":[0],"surfaceOp":{"op":"replace","start":1,"end":1}"#.to_owned()
        }
        7 => *envelope = r#""sourceEventSeqs":[999],"surfaceOp":"append""#.to_owned(),
        8 => *event_type = "plugin/unknown".to_owned(),
        9 => *event_type = "mode/set".to_owned(),
        10 => *time = 1 << 60,
        11 => replace(data, "{", "{ \"id\" : \"dup\" , "),
        12 => replace(data, r#""text":""#, r#""text":"\ud800"#),
        13 => *envelope = r#""ignorable":true"#.to_owned(),
        14 => replace(data, r#""turn":"#, r#""trigger":{"kind":"user"},"turn":"#),
        _ => replace(data, r#""type":"tool-call""#, r#""type":"tool\u002dcall""#),
    }
}

/// Mutated logs checked (each is loaded six ways).
const MUTATION_CASES: u64 = 100;

#[test]
fn mutated_logs_give_the_full_loads_result_or_error() {
    let mut streamed = 0;
    for seed in 0..MUTATION_CASES {
        let mut rng = Rng(seed);
        let mut events = base_events();
        for _ in 0..1 + rng.below(2) {
            mutate(&mut events, &mut rng);
        }
        let store = new_store();
        let mut writer = store.create_session_with_id("m").expect("create");
        for (event_type, time, data, envelope) in &events {
            let appended = writer.append(NewEvent {
                event_type,
                time: Some(*time),
                data,
                envelope,
                flags: 0,
            });
            assert!(appended.is_ok(), "seed {seed}: {appended:?}");
        }
        drop(writer);
        streamed += usize::from(assert_stream_agrees(&store, "m", &format!("seed {seed}")));
    }
    eprintln!("{streamed} of {MUTATION_CASES} mutated logs streamed");
    assert!(
        streamed > 10,
        "{streamed} of {MUTATION_CASES} mutated logs streamed"
    );
}

/// `exchange::messages` is as lossless as the events: lone-surrogate escapes in a message's
/// text come out as the escapes they are in the event, on the streamed path and on the full
/// load it hands over to; only the `Value` form (`message_values`) must turn them into U+FFFD.
#[test]
fn messages_keep_lone_surrogate_escapes_streamed_and_handed_over() {
    const ODD: &str = r"a\ud800b\udfff c\udc00\ud800";
    let store = new_store();
    let mut writer = store.create_session_with_id("streamed").expect("create");
    let user = format!(
        r#"{{"role":"user","content":[{{"type":"text","text":"{ODD}"}}],"source":{{"kind":"user"}},"id":"u"}}"#
    );
    append(
        &mut writer,
        "user/message",
        &user,
        r#""surfaceOp":"append""#,
    );
    drop(writer);
    // A legacy replacement result that inherits the id it replaces: handed over to the full
    // load (see `logs_the_stream_cannot_take_are_handed_over_...`).
    let mut writer = store.create_session_with_id("handed-over").expect("create");
    append(
        &mut writer,
        "tool/result",
        r#"{"callId":"c","content":[]}"#,
        r#""surfaceOp":"append""#,
    );
    let replacement = format!(r#"{{"callId":"c","content":[{{"type":"text","text":"{ODD}"}}]}}"#);
    append(
        &mut writer,
        "tool/result",
        &replacement,
        r#""sourceEventSeqs":[0],"surfaceOp":{"op":"replace","start":0,"end":0}"#,
    );
    drop(writer);
    assert!(assert_stream_agrees(&store, "streamed", "streamed"));
    assert!(!assert_stream_agrees(&store, "handed-over", "handed-over"));
    for id in ["streamed", "handed-over"] {
        let texts = message_texts(&store, id).expect("messages");
        assert_eq!(texts.len(), 1, "{id}");
        assert!(texts[0].contains(ODD), "{id}: {}", texts[0]);
        let values = dshdb::derive::messages(&store, id).expect("values");
        assert!(
            values[0].to_string().contains('\u{fffd}'),
            "{id}: lossy by type"
        );
    }
}

/// Stored packed rows are admitted member by member without rebuilding their line (the
/// bulk of a DSH log); a row whose members would not pack back into a line the decoder
/// reads (another shape, a payload that is not one string, a `dt` past the safe integers,
/// an envelope, another type) must still give the full load's result or error.
#[test]
fn stored_rows_that_do_not_pack_give_the_full_loads_result_or_error() {
    use dshdb::storage::frame::{EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START};
    let chunk = |index: u32, text: &str| {
        format!(
            r#"{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":{index},"text":{text}}}}}"#
        )
    };
    // (case, the second member's type, time, data, envelope); the first is a clean row.
    let cases: Vec<(&str, &str, i64, String, &str)> = vec![
        (
            "packs",
            "assistant/chunk",
            START_TIME_MS + 5,
            chunk(0, r#""b""#),
            "",
        ),
        (
            "another index",
            "assistant/chunk",
            START_TIME_MS,
            chunk(1, r#""b""#),
            "",
        ),
        (
            "not a string",
            "assistant/chunk",
            START_TIME_MS,
            chunk(0, "7"),
            "",
        ),
        (
            "a second member",
            "assistant/chunk",
            START_TIME_MS,
            chunk(0, r#""b","extra":"c""#),
            "",
        ),
        (
            "dt too large",
            "assistant/chunk",
            -(1 << 52),
            chunk(0, r#""b""#),
            "",
        ),
        (
            "an envelope",
            "assistant/chunk",
            START_TIME_MS,
            chunk(0, r#""b""#),
            r#""ignorable":true"#,
        ),
        (
            "another type",
            "step/start",
            START_TIME_MS,
            r#"{"turn":1,"step":2}"#.to_owned(),
            "",
        ),
    ];
    for (case, member_type, member_time, member_data, member_envelope) in cases {
        let store = new_store();
        let mut writer = store.create_session_with_id("rows").expect("create");
        let plain = |event_type: &'static str, data: &'static str| (event_type, data);
        for (event_type, data) in [
            plain("turn/start", r#"{"turn":1}"#),
            plain("step/start", r#"{"turn":1,"step":1}"#),
        ] {
            append(&mut writer, event_type, data, "");
        }
        let first = chunk(0, r#""a""#);
        let time_of_first = START_TIME_MS + (1 << 52);
        let row = [
            (
                "assistant/chunk",
                time_of_first,
                first.as_str(),
                "",
                EVENT_FLAG_ROW_START,
            ),
            (
                member_type,
                member_time,
                member_data.as_str(),
                member_envelope,
                EVENT_FLAG_ROW_MEMBER,
            ),
            (
                "assistant/chunk",
                member_time,
                first.as_str(),
                "",
                EVENT_FLAG_ROW_MEMBER,
            ),
        ];
        for (event_type, time, data, envelope, flags) in row {
            let time = if case == "dt too large" || flags == EVENT_FLAG_ROW_START {
                time
            } else {
                time_of_first + (time - START_TIME_MS)
            };
            let appended = writer.append(NewEvent {
                event_type,
                time: Some(time),
                data,
                envelope,
                flags,
            });
            assert!(appended.is_ok(), "{case}: {appended:?}");
        }
        append(&mut writer, "step/end", r#"{"turn":1,"step":1}"#, "");
        drop(writer);
        let streamed = assert_stream_agrees(&store, "rows", case);
        assert_eq!(streamed, case == "packs", "{case}: streamed");
    }
}

/// What a session reads as, compared before and after sealing it into runs: its DSH export
/// (plain and zstd), its messages (texts, or the error text) and whether they stream.
#[derive(Debug, PartialEq)]
struct SessionViews {
    export: Vec<u8>,
    export_zstd: Vec<u8>,
    texts: Result<Vec<String>, String>,
    streamed: bool,
}

fn session_views(store: &Store, id: &str, context: &str) -> SessionViews {
    SessionViews {
        export: dshdb::exchange::export_dsh_jsonl(store, id).expect("export"),
        export_zstd: dshdb::exchange::export_dsh_jsonl_zstd(store, id).expect("zstd export"),
        texts: message_texts(store, id).map_err(|error| error.to_string()),
        streamed: assert_stream_agrees(store, id, context),
    }
}

/// Imports `log` into a store of small segments, then seals every segment into runs
/// (format-spec F-06-30: chunk rows become row entries); returns the views before and
/// after sealing (`None` for a log the import refuses).
fn views_before_and_after_sealing(
    log: &[u8],
    context: &str,
) -> Option<(SessionViews, SessionViews)> {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("open");
    let report = import_dsh_jsonl(&store, log).ok()?;
    let id = report.session_id;
    let before = session_views(&store, &id, context);
    store.close().expect("close");
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("reopen");
    let sealed = store.maintain().expect("maintain");
    assert!(sealed.segments_sealed > 0, "{context}: nothing sealed");
    let after = session_views(&store, &id, &format!("{context}, sealed"));
    Some((before, after))
}

/// Sealing packs DSH rows (DSH's own row boundaries and unusual rows in the fixtures:
/// negative `dt`, one-member rows, odd key order, verbatim rows) into row entries, which
/// cold resume admits whole where it can: exports stay byte for byte, messages the same,
/// and a session that streamed before still streams.
#[test]
fn sealed_row_entries_export_and_stream_as_the_log_did() {
    let mut logs: Vec<(String, Vec<u8>)> = Vec::new();
    if dsh_fixtures::present() {
        for name in case_names() {
            logs.push((
                name.clone(),
                fs::read(fixture_path(&name, "input.jsonl")).expect("input"),
            ));
        }
    }
    for seed in 0..2_u64 {
        let id = format!("generated-{seed}");
        let jsonl = Generator::new(seed, &id).session(3 * READ_CHUNK_EVENTS);
        logs.push((id, jsonl));
    }
    let mut compared = 0;
    for (name, log) in &logs {
        let Some((before, after)) = views_before_and_after_sealing(log, name) else {
            continue;
        };
        assert_eq!(after, before, "{name}: sealed into runs");
        compared += 1;
    }
    assert!(compared >= 2, "{compared} sessions compared");
}

/// A cold resume reads a sealed session in steps of [`READ_CHUNK_EVENTS`] through one scan:
/// nothing of it goes into the store's shared block cache (filling it was half the peak
/// memory of resuming a 1.3M-event session), while a single read still caches the block it
/// missed, for the reads that repeat it.
#[test]
fn a_stepped_cold_resume_leaves_the_shared_block_cache_empty() {
    let disk = SimStorage::new();
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("open");
    let jsonl = Generator::new(7, "stepped").session(4 * READ_CHUNK_EVENTS);
    let id = import_dsh_jsonl(&store, &jsonl).expect("import").session_id;
    store.close().expect("close");
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("reopen");
    assert!(store.maintain().expect("maintain").segments_sealed > 0);
    store.close().expect("close");
    let store = open_sim(&disk, sim_options(Durability::Buffered)).expect("reopen sealed");
    let length = store.session(&id).expect("session").events;
    assert!(
        length > 3 * READ_CHUNK_EVENTS,
        "{length} events: several steps"
    );
    assert!(matches!(
        stream_message_texts(&store, &id).expect("stream"),
        Streamed::Messages(_)
    ));
    assert_eq!(
        store.cached_block_bytes(),
        0,
        "the scan's blocks stay its own"
    );
    store
        .visit_entries(&id, 1, 2, |_| Ok(()))
        .expect("one short read");
    assert!(
        store.cached_block_bytes() > 0,
        "a short read caches its block"
    );
}
