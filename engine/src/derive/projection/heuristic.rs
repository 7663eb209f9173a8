//! DSH's heuristic token surface (model §5.8): `estimate.ts` prices and the shadow-price
//! protocol, as the unit `tokens.dsh_heuristic`.

use super::units::{check_next, splice_node};
use super::{decode_postcard, encode_postcard, unit_error, ProjectionUnit};
use crate::error::Result;
use crate::session::json::value_lossy;
use crate::session::SessionEvent;
use crate::session::SurfaceOp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// DSH's heuristic price added per message and per block, in tokens.
pub const HEURISTIC_OVERHEAD_TOKENS: u64 = 4;

/// `ceil(UTF-16 code units / 4)`, DSH's price of a string.
fn quarter_units(text: &str) -> u64 {
    (text.encode_utf16().count() as u64).div_ceil(4)
}

/// DSH's `estimate.ts` price of one content block.
fn estimate_block(block: &Value) -> u64 {
    let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
    match block.get("type").and_then(Value::as_str) {
        Some("text") | Some("reasoning") => quarter_units(text("text")) + HEURISTIC_OVERHEAD_TOKENS,
        Some("tool-call") => {
            let arguments = match block.get("arguments") {
                Some(Value::String(arguments)) => arguments.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            quarter_units(text("name")) + quarter_units(&arguments) + HEURISTIC_OVERHEAD_TOKENS
        }
        Some("tool-result") => {
            let inner = block.get("content").and_then(Value::as_array);
            let inner: u64 = inner.into_iter().flatten().map(estimate_block).sum();
            inner + HEURISTIC_OVERHEAD_TOKENS
        }
        _ => HEURISTIC_OVERHEAD_TOKENS + quarter_units(&block.to_string()),
    }
}

/// DSH's `estimateMessage`: the content blocks plus the message overhead.
pub fn estimate_message(message: &Value) -> u64 {
    let blocks = message.get("content").and_then(Value::as_array);
    let content: u64 = blocks.into_iter().flatten().map(estimate_block).sum();
    content + HEURISTIC_OVERHEAD_TOKENS
}

/// [`estimate_message`] over a message's JSON text (`None`: a node without a message).
pub fn estimate_message_text(message: Option<&str>) -> u64 {
    match message {
        Some(text) => estimate_message(&value_lossy(text).unwrap_or(Value::Null)),
        None => HEURISTIC_OVERHEAD_TOKENS,
    }
}

/// The message a surface event carries (the whole data of a `user/message`).
fn carried_message(event: &SessionEvent) -> Value {
    let data = event.data_value();
    match event.event_type.as_str() {
        crate::session::event::USER_MESSAGE => data,
        _ => data.get("message").cloned().unwrap_or(Value::Null),
    }
}

/// A shadow price armed by `compaction/summary` or `compaction/prune` for the next event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowClaim {
    pub start: u64,
    pub end: u64,
    pub tokens: u64,
}

/// DSH's token surface: heuristic node prices and the running total.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeuristicMeterState {
    pub next_seq: u64,
    /// Per visible node in positional order: its seq and its heuristic price.
    pub nodes: Vec<(u64, u64)>,
    /// The total: appends add their price; a replace adds its price minus the consumed
    /// claim (or nothing without a claim).
    pub total: u64,
    pub armed: Option<ShadowClaim>,
}

/// The DSH heuristic meter unit; state is [`HeuristicMeterState`].
#[derive(Debug, Clone, Copy, Default)]
pub struct HeuristicMeterUnit;

/// The claim a `compaction/summary` or `compaction/prune` arms, if well formed.
fn claim_of(event: &SessionEvent) -> Option<ShadowClaim> {
    if !matches!(
        event.event_type.as_str(),
        "compaction/summary" | "compaction/prune"
    ) {
        return None;
    }
    let data = event.data_value();
    let number = |pointer: &str| data.pointer(pointer).and_then(Value::as_u64);
    Some(ShadowClaim {
        start: number("/shadowedRange/start")?,
        end: number("/shadowedRange/end")?,
        tokens: number("/shadowedTokenCount")?,
    })
}

impl ProjectionUnit for HeuristicMeterUnit {
    type State = HeuristicMeterState;

    fn name(&self) -> String {
        "tokens.dsh_heuristic".to_owned()
    }
    fn state_version(&self) -> u32 {
        1
    }
    fn init(&self) -> HeuristicMeterState {
        HeuristicMeterState::default()
    }
    fn apply(&self, state: &mut HeuristicMeterState, event: &SessionEvent) -> Result<()> {
        check_next("tokens.dsh_heuristic", &mut state.next_seq, event)?;
        // A claim prices only the immediately next event; anything else expires it.
        let claim = state.armed.take();
        if let Some(armed) = claim_of(event) {
            state.armed = Some(armed);
            return Ok(());
        }
        let Some(surface_op) = event.surface_op else {
            return Ok(());
        };
        let price = estimate_message(&carried_message(event));
        let delta_base = match (surface_op, claim) {
            (SurfaceOp::Append, _) | (SurfaceOp::Replace { .. }, None) => None,
            (SurfaceOp::Replace { start, end }, Some(claim)) => {
                if (claim.start, claim.end) != (start, end) {
                    return Err(unit_error(
                        "tokens.dsh_heuristic",
                        format!("token surface: replace at seq {} over range {start}-{end} has no adjacent shadow price (armed claim covers {}-{})", event.seq, claim.start, claim.end),
                    ));
                }
                Some(claim.tokens)
            }
        };
        splice_node("tokens.dsh_heuristic", &mut state.nodes, event, || price)?;
        state.total = match (surface_op, delta_base) {
            (SurfaceOp::Append, _) => state.total + price,
            (_, Some(claimed)) => (state.total + price).saturating_sub(claimed),
            (_, None) => state.total,
        };
        Ok(())
    }
    fn encode(&self, state: &HeuristicMeterState) -> Result<Vec<u8>> {
        encode_postcard("tokens.dsh_heuristic", state)
    }
    fn decode(&self, bytes: &[u8]) -> Result<HeuristicMeterState> {
        decode_postcard("tokens.dsh_heuristic", bytes)
    }
}
