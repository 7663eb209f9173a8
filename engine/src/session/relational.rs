//! Optional relational companions, kept apart from the always-on rules exactly as DSH keeps
//! them in plugins: the session invariant (model §3.7) and tool-call/result pairing (§5.6).
//! A bare DSH `Session` accepts logs these reject, so callers opt in.

use super::error::SessionError;
use super::event::{SessionEvent, SurfaceOp, ASSISTANT_MESSAGE, TOOL_RESULT};
use super::repair::js_text;
use serde_json::Value;

/// DSH's `@deepseek-ai/dsh-session/invariant` trace: turn/step numbering, enclosure, and
/// same-step tool pairing, checked one event at a time before commit.
#[derive(Debug, Clone)]
pub struct InvariantTracker {
    last_seq: Option<u64>,
    open_turn: Option<Value>,
    open_step: Option<Value>,
    next_turn: u64,
    next_step: u64,
    pending_calls: Vec<String>,
}

impl Default for InvariantTracker {
    fn default() -> Self {
        Self {
            last_seq: None,
            open_turn: None,
            open_step: None,
            next_turn: 1,
            next_step: 1,
            pending_calls: Vec::new(),
        }
    }
}

fn text_of(value: Option<&Value>) -> String {
    value.map_or_else(
        || "undefined".to_owned(),
        |value| match value {
            Value::String(text) => text.clone(),
            other => js_text(other),
        },
    )
}

fn number_equals(value: Option<&Value>, expected: u64) -> bool {
    value.and_then(Value::as_f64) == Some(expected as f64)
}

impl InvariantTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks `event` and, if it passes, records it. Atomic: a failure changes nothing.
    pub fn check_next(&mut self, event: &SessionEvent) -> Result<(), SessionError> {
        let mut next = self.clone();
        next.observe(event)?;
        *self = next;
        Ok(())
    }

    fn observe(&mut self, event: &SessionEvent) -> Result<(), SessionError> {
        if let Some(last) = self.last_seq.filter(|last| event.seq <= *last) {
            return Err(fail(format!(
                "seq must strictly increase: saw {} after {last}",
                event.seq
            )));
        }
        self.last_seq = Some(event.seq);
        let data = event.data_value();
        let replaced = matches!(event.surface_op, Some(SurfaceOp::Replace { .. }));
        match event.event_type.as_str() {
            "turn/start" => self.turn_start(&data),
            "turn/end" => self.turn_end(&data),
            "step/start" => self.step_start(&data),
            TOOL_RESULT if replaced => {
                self.require_turn("tool/result surface replacement appended outside any open turn")
            }
            "step/end" | "assistant/chunk" | ASSISTANT_MESSAGE | "tool/call" | TOOL_RESULT => {
                self.in_step(&event.event_type, &data)
            }
            "todo/write" | "request/header" | "request/context" => {
                let message = format!("{} appended outside any open turn (core execution events must be turn-enclosed)", event.event_type);
                self.require_turn(&message)
            }
            _ => Ok(()),
        }
    }

    fn require_turn(&self, message: &str) -> Result<(), SessionError> {
        self.open_turn
            .as_ref()
            .map(|_| ())
            .ok_or_else(|| fail(message.to_owned()))
    }

    fn turn_start(&mut self, data: &Value) -> Result<(), SessionError> {
        let turn = data.get("turn");
        if let Some(open) = &self.open_turn {
            return Err(fail(format!(
                "turn/start {} while turn {} is still open",
                text_of(turn),
                text_of(Some(open))
            )));
        }
        if !number_equals(turn, self.next_turn) {
            return Err(fail(format!(
                "turn/start expected turn {}, got {}",
                self.next_turn,
                text_of(turn)
            )));
        }
        self.open_turn = turn.cloned();
        self.next_step = 1;
        Ok(())
    }

    fn turn_end(&mut self, data: &Value) -> Result<(), SessionError> {
        let turn = data.get("turn");
        if self.open_turn.is_none() || turn != self.open_turn.as_ref() {
            return Err(fail(format!(
                "turn/end {} does not match open turn {}",
                text_of(turn),
                text_of(self.open_turn.as_ref())
            )));
        }
        if let Some(step) = &self.open_step {
            return Err(fail(format!(
                "turn/end {} while step {} is still open",
                text_of(turn),
                text_of(Some(step))
            )));
        }
        self.open_turn = None;
        self.next_turn += 1;
        self.pending_calls.clear();
        Ok(())
    }

    fn step_start(&mut self, data: &Value) -> Result<(), SessionError> {
        let (turn, step) = (data.get("turn"), data.get("step"));
        if self.open_turn.is_none() || turn != self.open_turn.as_ref() {
            return Err(fail(format!(
                "step/start in turn {} but open turn is {}",
                text_of(turn),
                text_of(self.open_turn.as_ref())
            )));
        }
        if let Some(open) = &self.open_step {
            return Err(fail(format!(
                "step/start {} while step {} is still open",
                text_of(step),
                text_of(Some(open))
            )));
        }
        if !number_equals(step, self.next_step) {
            let message = format!(
                "step/start expected step {} in turn {}, got {}",
                self.next_step,
                text_of(turn),
                text_of(step)
            );
            return Err(fail(message));
        }
        self.open_step = step.cloned();
        Ok(())
    }

    /// Events that must name the open turn/step; `step/end` closes it, `tool/call` and an
    /// appended `tool/result` maintain the pending calls of the step.
    fn in_step(&mut self, kind: &str, data: &Value) -> Result<(), SessionError> {
        let (turn, step) = (data.get("turn"), data.get("step"));
        let names_open = self.open_turn.is_some()
            && self.open_step.is_some()
            && turn == self.open_turn.as_ref()
            && step == self.open_step.as_ref();
        if !names_open {
            let (open_turn, open_step) = (
                text_of(self.open_turn.as_ref()),
                text_of(self.open_step.as_ref()),
            );
            let message = format!(
                "{kind} names turn {}/step {} but open is turn {open_turn}/step {open_step}",
                text_of(turn),
                text_of(step)
            );
            return Err(fail(message));
        }
        match kind {
            "step/end" => {
                self.pending_calls.clear();
                self.open_step = None;
                self.next_step += 1;
            }
            "tool/call" => self.pending_calls.push(text_of(data.get("callId"))),
            TOOL_RESULT => self.check_result_pairing(data)?,
            _ => {}
        }
        Ok(())
    }

    fn check_result_pairing(&self, data: &Value) -> Result<(), SessionError> {
        let call_id = text_of(data.pointer("/message/source/callId"));
        let not_started = data.pointer("/message/content/0/isError") == Some(&Value::Bool(true))
            && data.pointer("/error/code").and_then(Value::as_str) == Some("TOOL_NOT_STARTED");
        if self.pending_calls.contains(&call_id) || not_started {
            return Ok(());
        }
        Err(fail(format!(
            "tool/result for {call_id} with no prior tool/call in this step"
        )))
    }
}

fn fail(message: String) -> SessionError {
    SessionError::invariant(message)
}

/// Tool-call/result balance over the current surface (a count, not id matching).
#[derive(Debug, Clone)]
pub struct ToolPairing {
    /// Per visible node in positional order: its seq and the running total after it.
    totals: Vec<(u64, i64)>,
}

impl ToolPairing {
    /// Walks `nodes` (positional order); `events` is the log window starting at `base_seq`.
    pub fn build(
        nodes: &[u64],
        events: &[SessionEvent],
        base_seq: u64,
    ) -> Result<Self, SessionError> {
        let mut total = 0_i64;
        let mut totals = Vec::with_capacity(nodes.len());
        for &seq in nodes {
            let event = seq
                .checked_sub(base_seq)
                .and_then(|offset| events.get(offset as usize))
                .filter(|event| event.seq == seq);
            let Some(event) = event else {
                return Err(fail(format!("tool-pairing balance: surface seq {seq} has no matching session event (corrupt surface)")));
            };
            total += node_delta(event);
            if total < 0 {
                return Err(fail(format!("tool-pairing balance: tool/result at surface seq {seq} has no matching tool-call (corrupt surface)")));
            }
            totals.push((seq, total));
        }
        Ok(Self { totals })
    }

    fn position(&self, seq: u64) -> Result<usize, SessionError> {
        let position = self.totals.iter().position(|(node, _)| *node == seq);
        position.ok_or_else(|| fail(format!("tool-pairing balance: surface seq {seq} not found")))
    }

    /// Whether the cut just before `seq`'s position is balanced.
    pub fn balanced_before(&self, seq: u64) -> Result<bool, SessionError> {
        let position = self.position(seq)?;
        Ok(position == 0 || self.totals[position - 1].1 == 0)
    }

    /// Whether the cut just after `seq`'s position is balanced.
    pub fn balanced_after(&self, seq: u64) -> Result<bool, SessionError> {
        let position = self.position(seq)?;
        Ok(self.totals[position].1 == 0)
    }
}

/// Tool-pairing delta of a surface node (§5.6): an assistant message adds its tool-call blocks,
/// a tool result subtracts one, anything else adds nothing.
pub fn node_delta(event: &SessionEvent) -> i64 {
    match event.event_type.as_str() {
        ASSISTANT_MESSAGE => {
            let data = event.data_value();
            let blocks = data.pointer("/message/content").and_then(Value::as_array);
            let calls = blocks
                .into_iter()
                .flatten()
                .filter(|block| block.get("type").and_then(Value::as_str) == Some("tool-call"));
            calls.count() as i64
        }
        TOOL_RESULT => -1,
        _ => 0,
    }
}
