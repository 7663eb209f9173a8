//! The built-in projection units besides the token meter.

use super::{decode_postcard, encode_postcard, session_error, unit_error, ProjectionUnit};
use crate::error::Result;
use crate::session::event::{ASSISTANT_MESSAGE, END_SEED_TYPE};
use crate::session::surface::projected_message;
use crate::session::{SessionEvent, SurfaceFold, SurfaceFoldParts, SurfaceOp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Applies a surface event's marker to a positional node list (append, or replace the
/// span between two seqs by one node). Returns whether the list changed. The full DSH
/// validation is the surface unit's; here a replace naming absent seqs is an error.
/// Returns the nodes removed (none for an append), or `None` for a log-only event.
pub(crate) fn splice_node<T>(
    unit: &str,
    nodes: &mut Vec<(u64, T)>,
    event: &SessionEvent,
    value: impl FnOnce() -> T,
) -> Result<Option<Vec<(u64, T)>>> {
    match event.surface_op {
        None => Ok(None),
        Some(SurfaceOp::Append) => {
            nodes.push((event.seq, value()));
            Ok(Some(Vec::new()))
        }
        Some(SurfaceOp::Replace { start, end }) => {
            let position = |seq: u64| nodes.iter().position(|(node, _)| *node == seq);
            match (position(start), position(end)) {
                (Some(first), Some(last)) if first <= last => {
                    let removed = nodes.splice(first..=last, [(event.seq, value())]);
                    Ok(Some(removed.collect()))
                }
                _ => Err(unit_error(
                    unit,
                    format!(
                        "replace at seq {} over {start}..{end} names no surface span",
                        event.seq
                    ),
                )),
            }
        }
    }
}

/// Checks that `event` is the next seq of a unit whose state has seen `next_seq` events.
pub(crate) fn check_next(unit: &str, next_seq: &mut u64, event: &SessionEvent) -> Result<()> {
    if event.seq != *next_seq {
        return Err(unit_error(
            unit,
            format!(
                "event seq {} is not contiguous; expected {next_seq}",
                event.seq
            ),
        ));
    }
    *next_seq += 1;
    Ok(())
}

// ---- surface -------------------------------------------------------------------------------

/// DSH's surface fold (model §3) as a unit; state is [`SurfaceFold`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SurfaceUnit;

impl ProjectionUnit for SurfaceUnit {
    type State = SurfaceFold;

    fn name(&self) -> String {
        "surface".to_owned()
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> SurfaceFold {
        SurfaceFold::new()
    }
    fn apply(&self, state: &mut SurfaceFold, event: &SessionEvent) -> Result<()> {
        // The session id is not known here; the cache re-labels errors with it.
        state
            .apply(event)
            .map(|_| ())
            .map_err(|source| session_error("", source))
    }
    fn encode(&self, state: &SurfaceFold) -> Result<Vec<u8>> {
        encode_postcard("surface", &state.to_parts())
    }
    fn decode(&self, bytes: &[u8]) -> Result<SurfaceFold> {
        let parts: SurfaceFoldParts = decode_postcard("surface", bytes)?;
        SurfaceFold::from_parts(parts).ok_or_else(|| unit_error("surface", "node text is not JSON"))
    }
}

// ---- messages ------------------------------------------------------------------------------

/// `deriveMessages()` kept incrementally: the projected message of each visible node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessagesState {
    pub next_seq: u64,
    pub replace_generation: u64,
    /// Per visible node in positional order: its seq and its message text (`None` when the
    /// node derives no message, e.g. an empty-content assistant message).
    pub nodes: Vec<(u64, Option<String>)>,
}

impl MessagesState {
    /// The derived messages as exact JSON texts, in order.
    pub fn message_texts(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter_map(|(_, message)| message.as_deref())
            .collect()
    }
}

/// The messages unit; state is [`MessagesState`].
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagesUnit;

impl ProjectionUnit for MessagesUnit {
    type State = MessagesState;

    fn name(&self) -> String {
        "messages".to_owned()
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> MessagesState {
        MessagesState::default()
    }
    fn apply(&self, state: &mut MessagesState, event: &SessionEvent) -> Result<()> {
        check_next("messages", &mut state.next_seq, event)?;
        let message = || projected_message(event).map(|raw| raw.get().to_owned());
        let changed = splice_node("messages", &mut state.nodes, event, message)?;
        if changed.is_some() && matches!(event.surface_op, Some(SurfaceOp::Replace { .. })) {
            state.replace_generation += 1;
        }
        Ok(())
    }
    fn encode(&self, state: &MessagesState) -> Result<Vec<u8>> {
        encode_postcard("messages", state)
    }
    fn decode(&self, bytes: &[u8]) -> Result<MessagesState> {
        decode_postcard("messages", bytes)
    }
}

// ---- session stats -------------------------------------------------------------------------

/// Counts by event type and usage totals from `assistant/message` `data.usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionStats {
    pub events: u64,
    pub by_type: BTreeMap<String, u64>,
    /// Sum of every non-negative integer member of `assistant/message` `data.usage`
    /// (`inputTokens`, `outputTokens`, `cacheReadTokens`, …), by member name.
    pub usage: BTreeMap<String, u64>,
    /// Assistant messages that carried a `usage` object.
    pub messages_with_usage: u64,
}

/// The session stats unit; state is [`SessionStats`].
#[derive(Debug, Clone, Copy, Default)]
pub struct StatsUnit;

impl ProjectionUnit for StatsUnit {
    type State = SessionStats;

    fn name(&self) -> String {
        "stats".to_owned()
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> SessionStats {
        SessionStats::default()
    }
    fn apply(&self, state: &mut SessionStats, event: &SessionEvent) -> Result<()> {
        check_next("stats", &mut state.events, event)?;
        *state.by_type.entry(event.event_type.clone()).or_default() += 1;
        if event.event_type == ASSISTANT_MESSAGE {
            add_usage(state, &event.data_value());
        }
        Ok(())
    }
    fn encode(&self, state: &SessionStats) -> Result<Vec<u8>> {
        encode_postcard("stats", state)
    }
    fn decode(&self, bytes: &[u8]) -> Result<SessionStats> {
        decode_postcard("stats", bytes)
    }
}

fn add_usage(state: &mut SessionStats, data: &Value) {
    let Some(usage) = data.get("usage").and_then(Value::as_object) else {
        return;
    };
    state.messages_with_usage += 1;
    for (name, value) in usage {
        if let Some(count) = value.as_u64() {
            let total = state.usage.entry(name.clone()).or_default();
            *total = total.saturating_add(count);
        }
    }
}

// ---- turn / step index ---------------------------------------------------------------------

/// One step: its turn's position in [`TurnIndex::turns`], `step/start` and `step/end` seqs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEntry {
    pub turn_position: u64,
    pub step: u64,
    pub start_seq: u64,
    pub end_seq: Option<u64>,
}

/// One turn: `turn/start` and `turn/end` seqs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEntry {
    pub turn: u64,
    pub start_seq: u64,
    pub end_seq: Option<u64>,
}

/// Turns and steps by seq (two flat lists, so a long session's index decodes fast), plus
/// the lifecycle markers compaction needs (model §5.2, §5.4).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnIndex {
    pub next_seq: u64,
    pub turns: Vec<TurnEntry>,
    /// Every step, in log order (so grouped by turn).
    pub steps: Vec<StepEntry>,
    /// The seq of the latest `session/end-seed`.
    pub last_end_seed: Option<u64>,
    /// The latest `compaction/start` or `compaction/end`: its seq and whether it is a start.
    pub last_compaction_marker: Option<(u64, bool)>,
    /// The latest `turn/start` or `turn/end`: its seq and whether it is a start.
    pub last_turn_marker: Option<(u64, bool)>,
}

impl TurnIndex {
    /// The steps of the turn at `position` in [`Self::turns`].
    pub fn steps_of(&self, position: usize) -> &[StepEntry] {
        let position = position as u64;
        let first = self
            .steps
            .partition_point(|step| step.turn_position < position);
        let end = self
            .steps
            .partition_point(|step| step.turn_position <= position);
        &self.steps[first..end]
    }

    /// The open turn (DSH: the latest turn marker is a `turn/start`).
    pub fn open_turn(&self) -> Option<u64> {
        match self.last_turn_marker {
            Some((_, true)) => self.turns.last().map(|turn| turn.turn),
            _ => None,
        }
    }

    /// The seq of a live orphan `compaction/start` (model §5.4): the latest compaction
    /// marker is a start and no `session/end-seed` follows it.
    pub fn live_compaction_start(&self) -> Option<u64> {
        match (self.last_compaction_marker, self.last_end_seed) {
            (Some((start, true)), None) => Some(start),
            (Some((start, true)), Some(end_seed)) if end_seed < start => Some(start),
            _ => None,
        }
    }

    /// The seq of a stale orphan `compaction/start`: an interrupted bracket of an ended
    /// lifecycle (a `session/end-seed` follows it).
    pub fn stale_compaction_start(&self) -> Option<u64> {
        match (self.last_compaction_marker, self.last_end_seed) {
            (Some((start, true)), Some(end_seed)) if end_seed > start => Some(start),
            _ => None,
        }
    }
}

/// The turn/step index unit; state is [`TurnIndex`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnIndexUnit;

impl ProjectionUnit for TurnIndexUnit {
    type State = TurnIndex;

    fn name(&self) -> String {
        "turns".to_owned()
    }
    fn state_version(&self) -> u32 {
        2
    }
    fn init(&self) -> TurnIndex {
        TurnIndex::default()
    }
    fn apply(&self, state: &mut TurnIndex, event: &SessionEvent) -> Result<()> {
        check_next("turns", &mut state.next_seq, event)?;
        let number = |key: &str| event.data_value().get(key).and_then(Value::as_u64);
        let seq = event.seq;
        match event.event_type.as_str() {
            "turn/start" => {
                state.turns.push(TurnEntry {
                    turn: number("turn").unwrap_or(0),
                    start_seq: seq,
                    end_seq: None,
                });
                state.last_turn_marker = Some((seq, true));
            }
            "turn/end" => {
                if let Some(turn) = state.turns.last_mut() {
                    turn.end_seq.get_or_insert(seq);
                }
                state.last_turn_marker = Some((seq, false));
            }
            "step/start" => {
                if let Some(last) = state.turns.len().checked_sub(1) {
                    state.steps.push(StepEntry {
                        turn_position: last as u64,
                        step: number("step").unwrap_or(0),
                        start_seq: seq,
                        end_seq: None,
                    });
                }
            }
            "step/end" => {
                if let Some(step) = state.steps.last_mut() {
                    step.end_seq.get_or_insert(seq);
                }
            }
            "compaction/start" => state.last_compaction_marker = Some((seq, true)),
            "compaction/end" => state.last_compaction_marker = Some((seq, false)),
            END_SEED_TYPE => state.last_end_seed = Some(seq),
            _ => {}
        }
        Ok(())
    }
    fn encode(&self, state: &TurnIndex) -> Result<Vec<u8>> {
        encode_postcard("turns", state)
    }
    fn decode(&self, bytes: &[u8]) -> Result<TurnIndex> {
        decode_postcard("turns", bytes)
    }
}
