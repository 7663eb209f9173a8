//! The transcribed DSH examples of model §9.2 (EX2-EX7, EX9, EX11-EX13) as unit tests.

use super::*;
use proptest::prelude::*;

fn line(event_type: &str, seq: u64, data: &str, extra: &str) -> SessionEvent {
    let text =
        format!(r#"{{"type":"{event_type}","seq":{seq},"time":{seq},"data":{data}{extra}}}"#);
    parse_event_line(&text).unwrap_or_else(|error| panic!("test event {text}: {error}"))
}

fn user(seq: u64, text: &str, extra: &str) -> SessionEvent {
    let data = format!(
        r#"{{"id":"u{seq}","role":"user","content":[{{"type":"text","text":"{text}"}}],"source":{{"kind":"user"}}}}"#
    );
    line("user/message", seq, &data, extra)
}

fn assistant_data(turn: u64, step: u64, blocks: &str) -> String {
    format!(
        r#"{{"turn":{turn},"step":{step},"message":{{"id":"a","role":"assistant","content":[{blocks}],"source":{{"kind":"model","provider":"mock","model":"mock"}}}}}}"#
    )
}

fn tool_result_data(call_id: &str, text: &str, message_id: &str) -> String {
    format!(
        r#"{{"turn":1,"step":1,"message":{{"id":"{message_id}","role":"user","source":{{"kind":"tool","callId":"{call_id}"}},"content":[{{"type":"tool-result","toolCallId":"{call_id}","content":[{{"type":"text","text":"{text}"}}],"isError":false}}]}}}}"#
    )
}

const APPEND: &str = r#","surfaceOp":"append""#;

fn replace(start: u64, end: u64, sources: &str) -> String {
    format!(r#","surfaceOp":{{"op":"replace","start":{start},"end":{end}}}{sources}"#)
}

fn fold_error(events: &[SessionEvent]) -> Option<String> {
    fold_surface(events).err().map(|error| error.to_string())
}

#[test]
fn ex2_range_replacements_splice_by_position() {
    let base = || {
        vec![
            user(0, "a", APPEND),
            user(1, "b", APPEND),
            user(2, "c", APPEND),
        ]
    };
    let summary = |seq, start, end, sources: &str| {
        line(
            "assistant/message",
            seq,
            &assistant_data(1, 1, r#"{"type":"text","text":"s"}"#),
            &replace(start, end, sources),
        )
    };
    let mut ranged = base();
    ranged.push(summary(3, 0, 1, r#","sourceEventSeqs":[0,1]"#));
    let mut middle = base();
    middle.push(summary(3, 1, 1, r#","sourceEventSeqs":[1]"#));
    assert_eq!(
        fold_surface(&ranged).map(|fold| fold.nodes).ok(),
        Some(vec![3, 2])
    );
    assert_eq!(
        fold_surface(&middle).map(|fold| fold.nodes).ok(),
        Some(vec![0, 3, 2])
    );
}

#[test]
fn ex3_nested_replacement_reports_fold_history() {
    let text = r#"{"type":"text","text":"summary"}"#;
    let events = [
        user(0, "a", APPEND),
        user(1, "b", APPEND),
        line(
            "assistant/message",
            2,
            &assistant_data(1, 1, text),
            &replace(0, 0, r#","sourceEventSeqs":[0]"#),
        ),
        line(
            "assistant/message",
            3,
            &assistant_data(1, 2, text),
            &replace(2, 1, r#","sourceEventSeqs":[2,1]"#),
        ),
    ];
    let result = fold_surface(&events).expect("EX3 folds");
    assert_eq!(result.nodes, vec![3]);
    let expected = vec![
        SurfaceReplacement {
            seq: 2,
            start: 0,
            end: 0,
            shadowed_seqs: vec![0],
        },
        SurfaceReplacement {
            seq: 3,
            start: 2,
            end: 1,
            shadowed_seqs: vec![2, 1],
        },
    ];
    assert_eq!(result.replacements, expected);
}

#[test]
fn ex4_replace_errors_leave_state_untouched() {
    let mut fold = SurfaceFold::new();
    fold.apply(&user(0, "a", APPEND)).expect("append");
    let candidate = |start, end, sources: &str| {
        line(
            "assistant/message",
            1,
            &assistant_data(1, 1, ""),
            &replace(start, end, sources),
        )
    };
    let cases = [
        (
            candidate(5, 0, r#","sourceEventSeqs":[0]"#),
            "surface replace: start seq 5 not found in surface",
        ),
        (
            candidate(0, 99, r#","sourceEventSeqs":[0]"#),
            "surface replace: end seq 99 not found in surface",
        ),
        (
            candidate(0, 0, ""),
            "surface replace: sourceEventSeqs must include every shadowed surface node; missing 0",
        ),
    ];
    for (event, expected) in cases {
        assert_eq!(
            fold.apply(&event)
                .err()
                .map(|error| error.to_string())
                .as_deref(),
            Some(expected)
        );
        assert_eq!(
            (fold.nodes(), fold.replace_generation(), fold.next_seq()),
            (vec![0], 0, 1)
        );
    }
    let reversed = [
        user(0, "a", APPEND),
        user(1, "b", APPEND),
        candidate(1, 0, r#","sourceEventSeqs":[1,0]"#),
    ];
    let reversed = [
        reversed[0].clone(),
        reversed[1].clone(),
        SessionEvent {
            seq: 2,
            ..reversed[2].clone()
        },
    ];
    let expected = "surface replace: start seq 1 (index 1) is after end seq 0 (index 0)";
    assert_eq!(fold_error(&reversed).as_deref(), Some(expected));
    let seeded = validate_seed(
        &[
            user(0, "a", APPEND),
            user(1, "b", &replace(42, 0, r#","sourceEventSeqs":[0]"#)),
        ],
        SeedMode::Snapshot,
    );
    let expected =
        "invalid seed event at index 1: surface replace: start seq 42 not found in surface";
    assert_eq!(
        seeded.err().map(|error| error.to_string()).as_deref(),
        Some(expected)
    );
}

#[test]
fn ex5_marker_and_provenance_table() {
    let cases: [(Vec<SessionEvent>, &str); 7] = [
        (
            vec![user(
                0,
                "a",
                r#","surfaceOp":"append","sourceEventSeqs":[]"#,
            )],
            "sourceEventSeqs must not be empty except on assistant/message",
        ),
        (
            vec![
                user(0, "a", APPEND),
                user(1, "b", r#","surfaceOp":"append","sourceEventSeqs":[0,0]"#),
            ],
            "sourceEventSeqs must not contain duplicates",
        ),
        (
            vec![user(
                0,
                "a",
                r#","surfaceOp":"append","sourceEventSeqs":[0]"#,
            )],
            "sourceEventSeqs must reference earlier events: 0 >= current seq 0",
        ),
        (
            vec![user(0, "a", APPEND), user(2, "b", APPEND)],
            "session event seq 2 is not contiguous; expected 1",
        ),
        (
            vec![
                user(0, "a", APPEND),
                user(1, "b", APPEND),
                user(2, "c", &replace(0, 1, r#","sourceEventSeqs":[0]"#)),
            ],
            "surface replace: sourceEventSeqs must include every shadowed surface node; missing 1",
        ),
        (
            vec![line(
                "turn/start",
                0,
                r#"{"turn":1}"#,
                r#","sourceEventSeqs":[0]"#,
            )],
            "session event \"turn/start\" is not surface-eligible and cannot carry sourceEventSeqs",
        ),
        (
            vec![user(0, "a", "")],
            "session event \"user/message\" is surface-eligible and requires a surfaceOp marker",
        ),
    ];
    for (events, expected) in cases {
        assert_eq!(fold_error(&events).as_deref(), Some(expected));
    }
    let empty_on_assistant = line(
        "assistant/message",
        0,
        &assistant_data(1, 1, ""),
        r#","surfaceOp":"append","sourceEventSeqs":[]"#,
    );
    assert!(matches!(fold_surface(&[empty_on_assistant]), Ok(result) if result.nodes == vec![0]));
}

#[test]
fn ex6_tool_result_rewrite_may_change_only_content() {
    let original = line(
        "tool/result",
        0,
        &tool_result_data("call", "result 0", "m"),
        APPEND,
    );
    let rewrite = |call_id: &str, text: &str| {
        line(
            "tool/result",
            1,
            &tool_result_data(call_id, text, "m"),
            &replace(0, 0, r#","sourceEventSeqs":[0]"#),
        )
    };
    assert!(fold_surface(&[original.clone(), rewrite("call", "pruned")])
        .is_ok_and(|fold| fold.nodes == vec![1]));
    let changed = fold_error(&[original, rewrite("changed", "pruned")]);
    assert_eq!(
        changed.as_deref(),
        Some("tool/result surface replacement may change only content")
    );
    let not_result = [user(0, "a", APPEND), rewrite("call", "x")];
    assert_eq!(
        fold_error(&not_result).as_deref(),
        Some("tool/result surface replacement must target a current tool/result")
    );
}

#[test]
fn ex7_windowed_fold_uses_absolute_seqs() {
    let mut window = SurfaceFold::with_base_seq(400_000);
    window
        .apply(&user(400_000, "a", APPEND))
        .expect("window head");
    window.apply(&user(400_001, "b", APPEND)).expect("second");
    let crossing = user(
        400_002,
        "c",
        &replace(399_999, 400_000, r#","sourceEventSeqs":[399999,400000]"#),
    );
    let error = window.apply(&crossing).err().map(|error| error.to_string());
    assert_eq!(
        error.as_deref(),
        Some("surface replace: start seq 399999 not found in surface")
    );
    window
        .apply(&user(
            400_002,
            "c",
            &replace(400_000, 400_000, r#","sourceEventSeqs":[400000]"#),
        ))
        .expect("replace");
    assert_eq!(
        (window.nodes(), window.replace_generation()),
        (vec![400_002, 400_001], 1)
    );
}

#[test]
fn ex8_empty_assistant_content_derives_nothing() {
    let events = [
        user(0, "hi", APPEND),
        line("assistant/message", 1, &assistant_data(1, 1, ""), APPEND),
    ];
    let fold = validate_seed(&events, SeedMode::Snapshot).expect("valid seed");
    assert_eq!(fold.nodes(), vec![0, 1]);
    assert_eq!(fold.derive_messages().len(), 1);
    assert_eq!(fold.derive_message_texts()[0].get(), events[0].data.get());
}

#[test]
fn ex9_end_seed_and_contiguity() {
    assert_eq!(
        end_seed_marker(&[], 7)
            .map(|marker| marker.to_json_line(KeyOrder::LiveAppend))
            .as_deref(),
        Some(r#"{"type":"session/end-seed","seq":0,"time":7,"data":{}}"#)
    );
    let sealed = end_seed_marker(&[], 7).into_iter().collect::<Vec<_>>();
    assert!(end_seed_marker(&sealed, 8).is_none());
    let gap = [
        line("turn/start", 0, r#"{"turn":1}"#, ""),
        line(
            "turn/end",
            5,
            r#"{"turn":1,"reason":{"kind":"completed"}}"#,
            "",
        ),
    ];
    let error = validate_seed(&gap, SeedMode::Restore)
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        error.as_deref(),
        Some("seed event at index 1 has seq 5 (expected 1); seed must be contiguous from 0")
    );
    let negative_zero = [line("plugin/event", 0, r#"{"x":-0}"#, "")];
    assert!(validate_seed(&negative_zero, SeedMode::Restore).is_ok());
    let error = validate_seed(&negative_zero, SeedMode::Snapshot)
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        error.as_deref(),
        Some("seed event at index 0 is not losslessly JSON-serializable")
    );
}

fn turn_start(seq: u64, turn: u64) -> SessionEvent {
    line("turn/start", seq, &format!(r#"{{"turn":{turn}}}"#), "")
}

fn step_start(seq: u64, turn: u64) -> SessionEvent {
    line(
        "step/start",
        seq,
        &format!(r#"{{"turn":{turn},"step":1}}"#),
        "",
    )
}

fn closer_types(events: &[SessionEvent]) -> Vec<String> {
    interrupted_turn_closers(events)
        .iter()
        .map(|closer| format!("{}@{}", closer.event_type, closer.seq))
        .collect()
}

#[test]
fn ex11_repair_closers() {
    assert!(interrupted_turn_closers(&[]).is_empty());
    assert_eq!(closer_types(&[turn_start(0, 1)]), ["turn/end@1"]);
    assert_eq!(
        closer_types(&[turn_start(0, 1), step_start(1, 1)]),
        ["step/end@2", "turn/end@3"]
    );
    let call = r#"{"type":"text","text":"calling a tool"},{"type":"tool-call","id":"call-1","name":"bash","arguments":"{}"}"#;
    let mut events = vec![
        turn_start(0, 2),
        step_start(1, 2),
        line("assistant/message", 2, &assistant_data(2, 1, call), APPEND),
    ];
    let closers = interrupted_turn_closers(&events);
    let expected = r#"{"type":"tool/result","seq":3,"time":2,"data":{"turn":2,"step":1,"message":{"id":"interrupted-tool-result-call-1-3","role":"user","source":{"kind":"tool","callId":"call-1"},"content":[{"type":"tool-result","toolCallId":"call-1","isError":true,"content":[{"type":"text","text":"The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed."}]}]},"error":{"name":"ToolNotStartedError","code":"TOOL_NOT_STARTED"}},"surfaceOp":"append"}"#;
    assert_eq!(
        closers
            .first()
            .map(|closer| closer.to_json_line(KeyOrder::RepairCloser))
            .as_deref(),
        Some(expected)
    );
    assert_eq!(
        closers.iter().map(|closer| closer.time).collect::<Vec<_>>(),
        [2, 2, 2]
    );
    events.push(line("step/end", 3, r#"{"turn":2,"step":1}"#, ""));
    assert_eq!(
        closer_types(&events),
        ["turn/end@4"],
        "calls of a closed step get no result"
    );
    let orphan = [
        turn_start(0, 1),
        step_start(1, 1),
        line(
            "tool/call",
            2,
            r#"{"turn":1,"step":1,"callId":"orphan","name":"bash","arguments":"{}"}"#,
            "",
        ),
    ];
    assert_eq!(closer_types(&orphan), ["step/end@3", "turn/end@4"]);
    let mut repaired = events.clone();
    repaired.extend(interrupted_turn_closers(&events));
    assert!(validate_seed(&repaired, SeedMode::Restore).is_ok());
}

#[test]
fn ex12_fork_boundaries() {
    let completed = r#"{"turn":1,"reason":{"kind":"completed"}}"#;
    let parent = [
        turn_start(0, 1),
        user(1, "first", APPEND),
        line("turn/end", 2, completed, ""),
        turn_start(3, 2),
        user(4, "open", APPEND),
    ];
    let seed = fork_seed("parent", &parent, Some(2)).map(|seed| seed.len());
    assert_eq!(seed.ok(), Some(3));
    let open = validate_fork_boundary("parent", &parent, Some(4)).err();
    assert_eq!(
        open.as_ref().map(ToString::to_string).as_deref(),
        Some("fork boundary 4 in session \"parent\" ends inside open turn 2")
    );
    assert_eq!(
        open.and_then(|error| error.fork_error_code()),
        Some(ForkErrorCode::OpenTurn)
    );
    let missing = validate_fork_boundary("parent", &parent[..3], Some(3))
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        missing.as_deref(),
        Some("fork boundary 3 does not exist in session \"parent\" (last seq: 2)")
    );
    let empty = validate_fork_boundary("empty", &[], Some(0))
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        empty.as_deref(),
        Some("fork boundary 0 does not exist in session \"empty\" (last seq: none)")
    );
    assert!(matches!(
        validate_fork_boundary("empty", &[], None),
        Ok(None)
    ));
    let unsafe_boundary = validate_fork_boundary("p", &parent, Some(1 << 53))
        .err()
        .and_then(|error| error.fork_error_code());
    assert_eq!(unsafe_boundary, Some(ForkErrorCode::InvalidBoundary));
}

#[test]
fn ex13_tool_pairing_balance() {
    let call = r#"{"type":"tool-call","id":"c1","name":"bash","arguments":"{}"}"#;
    let events = [
        user(0, "go", APPEND),
        line("assistant/message", 1, &assistant_data(1, 1, call), APPEND),
        line(
            "tool/result",
            2,
            &tool_result_data("c1", "done", "t"),
            APPEND,
        ),
    ];
    let fold = fold_surface(&events).expect("S1 folds");
    let pairing = ToolPairing::build(&fold.nodes, &events, 0).expect("balanced");
    let cuts: Vec<(bool, bool)> = (0..3)
        .map(|seq| {
            (
                pairing.balanced_before(seq).unwrap_or(false),
                pairing.balanced_after(seq).unwrap_or(true),
            )
        })
        .collect();
    assert_eq!(cuts, [(true, true), (true, false), (false, true)]);
    let missing = pairing
        .balanced_before(999)
        .err()
        .map(|error| error.to_string());
    assert_eq!(
        missing.as_deref(),
        Some("tool-pairing balance: surface seq 999 not found")
    );
    let orphan = [line(
        "tool/result",
        0,
        &tool_result_data("orphan", "x", "t"),
        APPEND,
    )];
    let error = ToolPairing::build(&[0], &orphan, 0)
        .err()
        .map(|error| error.to_string());
    assert_eq!(error.as_deref(), Some("tool-pairing balance: tool/result at surface seq 0 has no matching tool-call (corrupt surface)"));
}

#[test]
fn invariant_enforces_turn_numbering_and_enclosure() {
    let mut tracker = InvariantTracker::new();
    let completed = r#"{"turn":1,"reason":{"kind":"completed"}}"#;
    for event in [turn_start(0, 1), line("turn/end", 1, completed, "")] {
        tracker.check_next(&event).expect("well-formed turn");
    }
    let error = tracker
        .check_next(&turn_start(2, 3))
        .err()
        .map(|error| error.to_string());
    assert_eq!(error.as_deref(), Some("turn/start expected turn 2, got 3"));
    let outside = line("todo/write", 2, r#"{"todos":[]}"#, "");
    let error = tracker
        .check_next(&outside)
        .err()
        .map(|error| error.to_string());
    assert_eq!(error.as_deref(), Some("todo/write appended outside any open turn (core execution events must be turn-enclosed)"));
    tracker
        .check_next(&turn_start(2, 2))
        .expect("turn 2 after a rejected candidate");
}

proptest! {
    /// Random append/replace scripts: the incremental fold equals a fresh fold of the
    /// accepted events, and a rejected candidate never changes the state.
    #[test]
    fn incremental_fold_is_atomic_and_replayable(script in proptest::collection::vec((0u64..6, 0u64..6, any::<bool>()), 1..40)) {
        let mut fold = SurfaceFold::new();
        let mut accepted: Vec<SessionEvent> = Vec::new();
        for (start, end, is_append) in script {
            let seq = fold.next_seq();
            let (start, end) = (seq.saturating_sub(start + 1), seq.saturating_sub(end + 1));
            let extra = if is_append { APPEND.to_owned() } else {
                let sources: Vec<String> = (0..seq).map(|source| source.to_string()).collect();
                replace(start, end, &format!(r#","sourceEventSeqs":[{}]"#, sources.join(",")))
            };
            let candidate = user(seq, "x", &extra);
            let before = fold.clone();
            match fold.apply(&candidate) {
                Ok(_) => accepted.push(candidate),
                Err(_) => prop_assert!(fold == before),
            }
        }
        let mut scratch = SurfaceFold::new();
        for event in &accepted {
            prop_assert!(scratch.apply(event).is_ok());
        }
        prop_assert!(scratch == fold);
    }
}

/// A tool result's rewrite key lives as long as its node is visible: a forgotten key makes
/// its rewrite a wrong target; a rewrite's own key is what the next rewrite is checked
/// against; a range replacement takes the keys of what it covers; a fold rebuilt from its
/// parts keeps the keys of the visible results.
#[test]
fn rewrite_keys_follow_the_visible_results() {
    let result = |seq, call_id: &str, extra: &str| {
        line(
            "tool/result",
            seq,
            &tool_result_data(call_id, "r", "m"),
            extra,
        )
    };
    let rewrite = |seq, of: u64, call_id: &str| {
        let sources = format!(r#","sourceEventSeqs":[{of}]"#);
        result(seq, call_id, &replace(of, of, &sources))
    };
    let wrong_target = "tool/result surface replacement must target a current tool/result";
    let mut forgetting = SurfaceFold::new();
    assert!(forgetting.apply(&result(0, "call", APPEND)).is_ok());
    forgetting.forget_rewrite_key(0);
    let refused = forgetting
        .apply(&rewrite(1, 0, "call"))
        .map_err(|error| error.to_string());
    assert_eq!(refused.err().as_deref(), Some(wrong_target));

    let mut chain = SurfaceFold::new();
    for event in [
        result(0, "call", APPEND),
        rewrite(1, 0, "call"),
        rewrite(2, 1, "call"),
    ] {
        assert!(chain.apply(&event).is_ok(), "seq {}", event.seq);
    }
    let changed = chain.clone().apply(&rewrite(3, 2, "other"));
    assert_eq!(
        changed.map_err(|error| error.to_string()).err().as_deref(),
        Some("tool/result surface replacement may change only content")
    );
    let summary = line(
        "assistant/message",
        3,
        &assistant_data(1, 1, r#"{"type":"text","text":"s"}"#),
        &replace(2, 2, r#","sourceEventSeqs":[2]"#),
    );
    let mut rebuilt = SurfaceFold::from_parts(chain.to_parts()).expect("parts");
    assert!(rebuilt.clone().apply(&rewrite(3, 2, "call")).is_ok());
    assert!(rebuilt.apply(&summary).is_ok());
    let parts = rebuilt.to_parts();
    assert_eq!(parts.nodes.len(), 1);
    assert!(parts.nodes.iter().all(|node| node.rewrite_key.is_none()));
    assert!(chain.to_parts().nodes[0].rewrite_key.is_some());
}
