//! Generated DSH sessions for tests and benchmarks: valid turns with tool calls.

use crate::store::NewEvent;
use serde_json::json;

/// An event to append, owning its texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedEvent {
    pub event_type: String,
    pub data: String,
    pub envelope: String,
}

impl OwnedEvent {
    fn new(event_type: &str, data: serde_json::Value, envelope: &str) -> Self {
        Self {
            event_type: event_type.to_owned(),
            data: data.to_string(),
            envelope: envelope.to_owned(),
        }
    }

    /// Borrowed for `append_batch`; the time is fixed so runs are reproducible.
    pub fn as_new_event(&self) -> NewEvent<'_> {
        NewEvent {
            event_type: &self.event_type,
            time: Some(1_790_000_000_000),
            data: &self.data,
            envelope: &self.envelope,
            flags: 0,
        }
    }
}

/// Envelope of an appended surface event.
pub const APPEND: &str = "\"surfaceOp\":\"append\"";

/// Deterministic filler text of about `bytes` bytes, different per `salt`.
pub fn filler(salt: u64, bytes: usize) -> String {
    let words = ["alpha", "bravo", "delta", "kilo", "lima", "oscar", "tango"];
    let mut text = String::with_capacity(bytes + 8);
    let mut index = salt;
    while text.len() < bytes {
        text.push_str(words[(index % words.len() as u64) as usize]);
        text.push(' ');
        index = index
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 7;
    }
    text
}

/// One closed turn number `turn`: a user message,
/// a step with one tool call and its result, a step with the final answer.
/// `text_bytes` sizes the message and tool-result texts. 12 events.
pub fn turn_events(turn: u64, text_bytes: usize) -> Vec<OwnedEvent> {
    let call_id = format!("call-{turn}");
    let user = json!({"role": "user", "content": [{"type": "text", "text": filler(turn, text_bytes)}],
        "source": {"kind": "user"}, "id": format!("u-{turn}")});
    let calling = json!({"turn": turn, "step": 1, "message": {"role": "assistant",
        "content": [{"type": "text", "text": "running a tool"},
                    {"type": "tool-call", "id": call_id, "name": "bash", "arguments": "{\"command\":\"ls\"}"}],
        "source": {"kind": "model", "provider": "p", "model": "m"}, "id": format!("a-{turn}-1")},
        "usage": {"inputTokens": 100, "outputTokens": 20}});
    let result = json!({"turn": turn, "step": 1, "message": {"role": "user",
        "content": [{"type": "tool-result", "toolCallId": call_id,
                     "content": [{"type": "text", "text": filler(turn + 7, text_bytes)}]}],
        "source": {"kind": "tool", "callId": call_id}, "id": format!("r-{turn}")}});
    let answer = json!({"turn": turn, "step": 2, "message": {"role": "assistant",
        "content": [{"type": "text", "text": filler(turn + 3, text_bytes / 2)}],
        "source": {"kind": "model", "provider": "p", "model": "m"}, "id": format!("a-{turn}-2")},
        "usage": {"inputTokens": 150, "outputTokens": 40}});
    let step = |number: u64| json!({"turn": turn, "step": number});
    let chunk = json!({"turn": turn, "step": 1, "chunk": {"type": "text-delta", "text": "run"}});
    vec![
        OwnedEvent::new("turn/start", json!({"turn": turn}), ""),
        OwnedEvent::new("user/message", user, APPEND),
        OwnedEvent::new("step/start", step(1), ""),
        OwnedEvent::new("assistant/chunk", chunk, ""),
        OwnedEvent::new("assistant/message", calling, APPEND),
        OwnedEvent::new(
            "tool/call",
            json!({"turn": turn, "step": 1, "callId": call_id, "name": "bash"}),
            "",
        ),
        OwnedEvent::new("tool/result", result, APPEND),
        OwnedEvent::new("step/end", step(1), ""),
        OwnedEvent::new("step/start", step(2), ""),
        OwnedEvent::new("assistant/message", answer, APPEND),
        OwnedEvent::new("step/end", step(2), ""),
        OwnedEvent::new(
            "turn/end",
            json!({"turn": turn, "reason": {"kind": "completed"}}),
            "",
        ),
    ]
}

/// Events per generated turn.
pub const EVENTS_PER_TURN: u64 = 12;
