//! Projection units: state derived from a session's log by a pure fold.
//!
//! A unit has `init`, a pure `apply(state, event)` (in Rust: a mutation of a state the
//! caller owns, with no other effect), a state version and an encoding of its state. The
//! checkpointed cache that persists unit states lives in [`crate::derive::cache`]; this module is
//! pure (no I/O).
//!
//! Built in: [`SurfaceUnit`] (DSH's surface fold), [`MessagesUnit`] (`deriveMessages`),
//! [`TokenMeterUnit`] (tiktoken counts per surface node and in total), [`StatsUnit`] (counts
//! by type, usage totals) and [`TurnIndexUnit`] (turns, steps, compaction brackets).

mod heuristic;
#[cfg(any(test, feature = "testing"))]
pub mod synthetic;
mod tokens;
mod units;

pub use heuristic::{
    estimate_message, estimate_message_text, HeuristicMeterState, HeuristicMeterUnit, ShadowClaim,
    HEURISTIC_OVERHEAD_TOKENS,
};
pub use tokens::{TokenEncoding, TokenMeterState, TokenMeterUnit, MESSAGE_OVERHEAD_TOKENS};
pub use units::{
    MessagesState, MessagesUnit, SessionStats, StatsUnit, StepEntry, SurfaceUnit, TurnEntry,
    TurnIndex, TurnIndexUnit,
};

use crate::error::{Error, Result};
use crate::session::{parse_event_line, SessionError, SessionEvent};
use crate::storage::frame::{
    EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START, EVENT_FLAG_VERBATIM_LINE,
};
use crate::store::Event;

/// A projection unit: a pure fold over a session's events.
pub trait ProjectionUnit {
    /// The folded state.
    type State: Clone;
    /// The unit's name in checkpoint file names: `[a-z0-9._]`, configuration included
    /// (e.g. `tokens.o200k_base`), so differently configured units never share a checkpoint.
    fn name(&self) -> String;
    /// Bumped whenever the state's meaning or encoding changes: older checkpoints are discarded.
    fn state_version(&self) -> u32;
    /// The state of the empty log.
    fn init(&self) -> Self::State;
    /// Folds one event (the next seq). Depends on nothing but `state` and `event`.
    fn apply(&self, state: &mut Self::State, event: &SessionEvent) -> Result<()>;
    /// The state as bytes (postcard).
    fn encode(&self, state: &Self::State) -> Result<Vec<u8>>;
    /// The state from [`Self::encode`]'s bytes; an error for anything else.
    fn decode(&self, bytes: &[u8]) -> Result<Self::State>;
}

/// Folds `events` into a fresh state: the from-scratch reference every cached read must equal.
pub fn fold_from_scratch<U: ProjectionUnit>(unit: &U, events: &[SessionEvent]) -> Result<U::State> {
    let mut state = unit.init();
    for event in events {
        unit.apply(&mut state, event)?;
    }
    Ok(state)
}

/// A stored event as DSH's session model sees it.
pub fn session_event(session: &str, event: &Event) -> Result<SessionEvent> {
    let parsed = if event.flags & (EVENT_FLAG_ROW_START | EVENT_FLAG_ROW_MEMBER) != 0 {
        // A member of a packed chunk row: its own data; a row start's envelope may hold the
        // row's original line, which is not envelope members.
        let member = Event {
            envelope: String::new(),
            flags: 0,
            ..event.clone()
        };
        parse_event_line(&member.to_json_line())
    } else if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        parse_event_line(&verbatim_line(&event.envelope))
    } else {
        parse_event_line(&event.to_json_line())
    };
    parsed.map_err(|source| session_error(session, source))
}

/// Wraps a session-model error with the session's id.
pub fn session_error(session: &str, source: SessionError) -> Error {
    Error::SessionModel {
        id: session.to_owned(),
        source,
    }
}

fn verbatim_line(envelope: &str) -> String {
    let Some(hex) = envelope
        .strip_prefix(crate::exchange::HEX_PREFIX)
        .and_then(|rest| rest.strip_suffix("\"}"))
    else {
        return envelope.to_owned();
    };
    let bytes: Vec<u8> = hex
        .as_bytes()
        .chunks(2)
        .filter_map(|pair| {
            let text = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(text, 16).ok()
        })
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A projection error for `unit`.
pub(crate) fn unit_error(unit: &str, reason: impl Into<String>) -> Error {
    Error::Projection {
        unit: unit.to_owned(),
        reason: reason.into(),
    }
}

/// Postcard encoding shared by the built-in units.
pub(crate) fn encode_postcard<T: serde::Serialize>(unit: &str, state: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(state).map_err(|error| unit_error(unit, error.to_string()))
}

/// Postcard decoding shared by the built-in units; trailing bytes are an error.
pub(crate) fn decode_postcard<T: serde::de::DeserializeOwned>(
    unit: &str,
    bytes: &[u8],
) -> Result<T> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|error| unit_error(unit, error.to_string()))?;
    if !rest.is_empty() {
        return Err(unit_error(unit, "trailing bytes after the state"));
    }
    Ok(value)
}
