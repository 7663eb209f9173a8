//! Crash repair: DSH `interruptedTurnClosers` (model §6, persistence §5.6). The closers are
//! ordinary events with DSH's exact payload text and key order, ready to append.

use super::event::{SessionEvent, SurfaceOp, ASSISTANT_MESSAGE, TOOL_RESULT};
use super::json::{js_number, raw_from_built, string_text, ObjectText};
use serde_json::Value;

pub const NOT_STARTED_TEXT: &str =
    "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed.";
pub const OUTCOME_UNKNOWN_TEXT: &str = "The tool call was interrupted after it was recorded, but no result was durably recorded. Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the operation is read-only or idempotent; if it may have side effects, first verify external state or ask the user. Do not retry blindly.";

/// A tool call from an assistant message still waiting for its result.
struct PendingCall {
    call_id: String,
    step: Value,
    call_seq: Option<u64>,
}

/// The repair scan (`interruptedTurnClosers`) as a stream: observe the log's events in
/// order, then ask for the closers. [`interrupted_turn_closers`] is this over a slice.
#[derive(Default)]
pub struct RepairScan {
    open_turn: Option<Value>,
    open_step: Option<Value>,
    pending: Vec<PendingCall>,
}

/// Whether the repair scan reads the payload of an event of this type (it reads no other
/// event at all but `turn/end` and `step/end`, by type alone).
pub fn repair_reads_payload(event_type: &str) -> bool {
    matches!(
        event_type,
        "turn/start" | "step/start" | ASSISTANT_MESSAGE | "tool/call" | TOOL_RESULT
    )
}

/// Whether the repair scan looks at an event of this type at all.
pub fn repair_observes_type(event_type: &str) -> bool {
    repair_reads_payload(event_type) || matches!(event_type, "turn/end" | "step/end")
}

impl RepairScan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Observes the next event of the log.
    pub fn observe(&mut self, event: &SessionEvent) {
        // Parse only the payloads this scan reads (chunks are most of a session), and of
        // `turn/start`, `step/start` and `tool/call` only the member it reads.
        let event_type = event.event_type.as_str();
        if matches!(event_type, "turn/start" | "step/start" | "tool/call") {
            if let Some(member) = lone_member(event_type, event.data.get()) {
                self.observe_member(event_type, event.seq, member.as_ref());
                return;
            }
        }
        let data = if repair_reads_payload(event_type) {
            event.data_value()
        } else {
            Value::Null
        };
        self.observe_parsed(event_type, event.seq, &data);
    }

    /// [`Self::observe`] with the payload already parsed (`SessionEvent::data_value`).
    pub fn observe_parsed(&mut self, event_type: &str, seq: u64, data: &Value) {
        match event_type {
            "turn/start" => self.observe_member(event_type, seq, data.get("turn")),
            "step/start" => self.observe_member(event_type, seq, data.get("step")),
            "tool/call" => self.observe_member(event_type, seq, data.get("callId")),
            "turn/end" => *self = Self::default(),
            "step/end" => {
                self.pending.clear();
                self.open_step = None;
            }
            ASSISTANT_MESSAGE => self.register_calls(data),
            TOOL_RESULT => self.resolve(data),
            _ => {}
        }
    }

    /// A `turn/start`, `step/start` or `tool/call` by the one member the scan reads of it
    /// (`turn`, `step`, `callId`; `None` when absent).
    fn observe_member(&mut self, event_type: &str, seq: u64, member: Option<&Value>) {
        match event_type {
            "turn/start" => {
                self.open_turn = Some(member.cloned().unwrap_or(Value::Null));
                self.open_step = None;
                self.pending.clear();
            }
            "step/start" => self.open_step = Some(member.cloned().unwrap_or(Value::Null)),
            "tool/call" => self.record_start(member, seq),
            _ => {}
        }
    }

    fn register_calls(&mut self, data: &Value) {
        let step = data.get("step").cloned().unwrap_or(Value::Null);
        // `get` chains rather than `pointer`, which allocates per path token.
        let blocks = data
            .get("message")
            .and_then(|message| message.get("content"))
            .and_then(Value::as_array);
        let calls = blocks
            .into_iter()
            .flatten()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool-call"));
        for block in calls {
            let call_id = key_text(block.get("id"));
            // A JS Map keeps the first insertion position when a key is set again.
            match self
                .pending
                .iter_mut()
                .find(|pending| pending.call_id == call_id)
            {
                Some(existing) => existing.step = step.clone(),
                None => self.pending.push(PendingCall {
                    call_id,
                    step: step.clone(),
                    call_seq: None,
                }),
            }
        }
    }

    fn record_start(&mut self, call_id: Option<&Value>, seq: u64) {
        let call_id = key_text(call_id);
        if let Some(pending) = self
            .pending
            .iter_mut()
            .find(|pending| pending.call_id == call_id)
        {
            pending.call_seq = Some(seq);
        }
    }

    fn resolve(&mut self, data: &Value) {
        let call_id = key_text(
            data.get("message")
                .and_then(|message| message.get("source"))
                .and_then(|source| source.get("callId")),
        );
        self.pending.retain(|pending| pending.call_id != call_id);
    }
}

/// The one member the repair scan reads of a `turn/start` (`turn`), `step/start` (`step`)
/// or `tool/call` (`callId`) payload object: `Some(None)` when absent; `None` when the text
/// is not an object this way reads (duplicate keys, lone surrogates): the caller then parses
/// the whole payload.
fn lone_member(event_type: &str, data: &str) -> Option<Option<Value>> {
    /// A member present with any value, `null` included (`Option` alone reads `null` as
    /// absent).
    fn present<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Value>, D::Error> {
        serde::Deserialize::deserialize(deserializer).map(Some)
    }
    #[derive(serde::Deserialize)]
    struct Turn {
        #[serde(default, deserialize_with = "present")]
        turn: Option<Value>,
    }
    #[derive(serde::Deserialize)]
    struct Step {
        #[serde(default, deserialize_with = "present")]
        step: Option<Value>,
    }
    #[derive(serde::Deserialize)]
    struct Call {
        #[serde(default, deserialize_with = "present", rename = "callId")]
        call_id: Option<Value>,
    }
    // A derived struct also reads a JSON array (by position): only objects qualify.
    if !data.trim_start().starts_with('{') {
        return None;
    }
    match event_type {
        "turn/start" => serde_json::from_str::<Turn>(data)
            .ok()
            .map(|read| read.turn),
        "step/start" => serde_json::from_str::<Step>(data)
            .ok()
            .map(|read| read.step),
        "tool/call" => serde_json::from_str::<Call>(data)
            .ok()
            .map(|read| read.call_id),
        _ => None,
    }
}

/// A call id as the JS template literal would print it (ids are strings in practice).
fn key_text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
        None => "undefined".to_owned(),
    }
}

/// `JSON.stringify` of a scalar read back from a payload (numbers print as JS doubles).
pub(crate) fn js_text(value: &Value) -> String {
    if let Value::Number(number) = value {
        if let Some(double) = js_number(&number.to_string()) {
            if double.fract() == 0.0 && double.abs() < 1e21 {
                return format!("{double:.0}");
            }
            return format!("{double}");
        }
    }
    value.to_string()
}

/// The events DSH appends to close a trailing open turn; empty when the log is balanced.
pub fn interrupted_turn_closers(events: &[SessionEvent]) -> Vec<SessionEvent> {
    let mut scan = RepairScan::new();
    events.iter().for_each(|event| scan.observe(event));
    match events.last() {
        Some(last) => scan.closers(last.seq, last.time),
        None => Vec::new(),
    }
}

impl RepairScan {
    /// The closers after observing a log whose last event has `last_seq` and `last_time`;
    /// empty when the log is balanced.
    pub fn closers(&self, last_seq: u64, last_time: i64) -> Vec<SessionEvent> {
        let Some(open_turn) = self.open_turn.as_ref() else {
            return Vec::new();
        };
        closers_of(self, open_turn, last_seq, last_time)
    }
}

fn closers_of(
    scan: &RepairScan,
    open_turn: &Value,
    last_seq: u64,
    last_time: i64,
) -> Vec<SessionEvent> {
    let turn = js_text(open_turn);
    let mut seq = last_seq + 1;
    let mut closers = Vec::new();
    for pending in &scan.pending {
        let mut result = closer(
            TOOL_RESULT,
            seq,
            last_time,
            tool_result_closer_data(&turn, pending, seq),
        );
        result.surface_op = Some(SurfaceOp::Append);
        result.source_event_seqs = pending.call_seq.map(|call_seq| vec![call_seq]);
        closers.push(result);
        seq += 1;
    }
    if let Some(step) = &scan.open_step {
        let data = ObjectText::new()
            .raw("turn", &turn)
            .raw("step", &js_text(step))
            .finish();
        closers.push(closer("step/end", seq, last_time, data));
        seq += 1;
    }
    let reason = ObjectText::new().string("kind", "interrupted").finish();
    let data = ObjectText::new()
        .raw("turn", &turn)
        .raw("reason", &reason)
        .finish();
    closers.push(closer("turn/end", seq, last_time, data));
    closers
}

fn closer(event_type: &str, seq: u64, time: i64, data: String) -> SessionEvent {
    SessionEvent {
        event_type: event_type.to_owned(),
        seq,
        time,
        data: raw_from_built(data),
        ignorable: false,
        surface_op: None,
        source_event_seqs: None,
    }
}

fn tool_result_closer_data(turn: &str, pending: &PendingCall, seq: u64) -> String {
    let (text, name, code) = match pending.call_seq {
        Some(_) => (
            OUTCOME_UNKNOWN_TEXT,
            "ToolOutcomeUnknownError",
            "TOOL_OUTCOME_UNKNOWN",
        ),
        None => (NOT_STARTED_TEXT, "ToolNotStartedError", "TOOL_NOT_STARTED"),
    };
    let call_id = &pending.call_id;
    let text_block = ObjectText::new()
        .string("type", "text")
        .string("text", text)
        .finish();
    let result_block = ObjectText::new()
        .string("type", "tool-result")
        .string("toolCallId", call_id)
        .raw("isError", "true")
        .raw("content", &format!("[{text_block}]"))
        .finish();
    let source = ObjectText::new()
        .string("kind", "tool")
        .string("callId", call_id)
        .finish();
    let message = ObjectText::new()
        .raw(
            "id",
            &string_text(&format!("interrupted-tool-result-{call_id}-{seq}")),
        )
        .string("role", "user")
        .raw("source", &source)
        .raw("content", &format!("[{result_block}]"))
        .finish();
    let error = ObjectText::new()
        .string("name", name)
        .string("code", code)
        .finish();
    ObjectText::new()
        .raw("turn", turn)
        .raw("step", &js_text(&pending.step))
        .raw("message", &message)
        .raw("error", &error)
        .finish()
}

#[cfg(test)]
mod lone_member_tests {
    use super::*;

    #[test]
    fn lone_members_read_what_the_full_parse_reads() {
        for data in [
            r#"{"turn":1,"trigger":{"kind":"x"}}"#,
            r#"{"turn":null,"step":2.50}"#,
            r#"{"callId":"c","name":"bash","arguments":"{}"}"#,
            r#"{"callId":null}"#,
            r#"{"step":{"a":[1,2]},"x":"\ud800"}"#,
            r#"{}"#,
        ] {
            let full: Value = crate::session::json::value_lossy(data).expect("JSON");
            for (event_type, key) in [
                ("turn/start", "turn"),
                ("step/start", "step"),
                ("tool/call", "callId"),
            ] {
                let lone = lone_member(event_type, data).expect("read");
                assert_eq!(lone.as_ref(), full.get(key), "{data} {key}");
            }
        }
        for other in [r#"[1,2,3]"#, r#"{"turn":1,"turn":2}"#, r#""text""#, "7"] {
            assert_eq!(lone_member("turn/start", other), None, "{other}");
        }
    }
}
