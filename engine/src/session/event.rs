//! The `SessionEvent` record (model §1), its line parser and its DSH line renderings.

use super::error::SessionError;
use super::json::{self, js_safe_integer, ObjectText, MAX_SAFE_INTEGER};
use serde_json::value::RawValue;

pub const USER_MESSAGE: &str = "user/message";
pub const ASSISTANT_MESSAGE: &str = "assistant/message";
pub const TOOL_RESULT: &str = "tool/result";
pub const END_SEED_TYPE: &str = "session/end-seed";
/// Opens a turn; the fork rule and repair look for the last `turn/start`/`turn/end`.
pub const TURN_START: &str = "turn/start";
/// Closes a turn.
pub const TURN_END: &str = "turn/end";

/// `KNOWN_SESSION_EVENT_TYPES` at DSH `b150a551b8` (48 entries, sorted).
pub const KNOWN_EVENT_TYPES: [&str; 48] = [
    "agent-preset/selected",
    "agent/inbox/spliced",
    "approval/asked",
    "approval/decided",
    "approval/policy",
    "assistant/chunk",
    "assistant/message",
    "command/done",
    "command/run",
    "compaction/end",
    "compaction/prune",
    "compaction/start",
    "compaction/summary",
    "feedback/record",
    "goal/change",
    "hook/invoked",
    "hook/result",
    "llm/retry",
    "llm/retry-started",
    "permission/preset",
    "plan/mode",
    "request/context",
    "request/header",
    "sandbox/mode",
    "schedule/change",
    "session/end-seed",
    "session/title",
    "session/title-llm-request",
    "step/end",
    "step/start",
    "subagent/descriptor",
    "team/member",
    "team/message/delivered",
    "team/message/queued",
    "team/task",
    "todo/write",
    "tool-workflow/agent-end",
    "tool-workflow/agent-start",
    "tool-workflow/run-end",
    "tool-workflow/run-start",
    "tool/call",
    "tool/code-dispatch",
    "tool/code-dispatch-start",
    "tool/result",
    "turn/end",
    "turn/start",
    "user/message",
    "web/deepseek-search-llm-request",
];

/// Whether the persistence read path knows `event_type` (unknown types need `ignorable`).
pub fn is_known_event_type(event_type: &str) -> bool {
    KNOWN_EVENT_TYPES.binary_search(&event_type).is_ok()
}

/// Largest edit distance at which a known type is offered as the one probably meant.
const SUGGESTION_MAX_EDITS: usize = 2;

/// The known event type closest to an unknown `event_type` (a typo such as `user/mesage`),
/// when one is within [`SUGGESTION_MAX_EDITS`] single-character edits.
pub fn closest_known_event_type(event_type: &str) -> Option<&'static str> {
    KNOWN_EVENT_TYPES
        .iter()
        .map(|known| (edit_distance(event_type, known), *known))
        .filter(|(edits, _)| *edits <= SUGGESTION_MAX_EDITS)
        .min_by_key(|(edits, _)| *edits)
        .map(|(_, known)| known)
}

/// Levenshtein distance over chars (one row at a time).
fn edit_distance(left: &str, right: &str) -> usize {
    let right: Vec<char> = right.chars().collect();
    let mut previous: Vec<usize> = (0..=right.len()).collect();
    for (row, left_char) in left.chars().enumerate() {
        let mut current = vec![row + 1; right.len() + 1];
        for (column, right_char) in right.iter().enumerate() {
            let substitution = previous[column] + usize::from(left_char != *right_char);
            current[column + 1] = substitution
                .min(previous[column + 1] + 1)
                .min(current[column] + 1);
        }
        previous = current;
    }
    previous[right.len()]
}

/// The three types that may (and must) carry a surface marker.
pub fn is_surface_eligible_type(event_type: &str) -> bool {
    matches!(event_type, USER_MESSAGE | ASSISTANT_MESSAGE | TOOL_RESULT)
}

/// How a surface event changes the model-visible node list (model §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceOp {
    Append,
    /// Replace the nodes from seq `start` to seq `end` (positions, inclusive) with this event.
    Replace {
        start: u64,
        end: u64,
    },
}

impl SurfaceOp {
    /// The marker's compact JSON text, as `JSON.stringify` writes it.
    pub fn to_json(self) -> String {
        match self {
            Self::Append => "\"append\"".to_owned(),
            Self::Replace { start, end } => {
                format!("{{\"op\":\"replace\",\"start\":{start},\"end\":{end}}}")
            }
        }
    }
}

/// Key order of a rendered line: DSH writes live appends and repair closers differently (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrder {
    /// `Session.append`: `{type, seq, time, data, sourceEventSeqs?, surfaceOp?}`.
    LiveAppend,
    /// `interruptedTurnClosers`: `{type, seq, time, data, surfaceOp, sourceEventSeqs?}`.
    RepairCloser,
}

/// One DSH session event. `data` is the exact JSON text it arrived as.
#[derive(Debug, Clone)]
pub struct SessionEvent {
    pub event_type: String,
    pub seq: u64,
    pub time: i64,
    pub data: Box<RawValue>,
    pub ignorable: bool,
    pub surface_op: Option<SurfaceOp>,
    pub source_event_seqs: Option<Vec<u64>>,
}

impl PartialEq for SessionEvent {
    fn eq(&self, other: &Self) -> bool {
        self.event_type == other.event_type
            && self.seq == other.seq
            && self.time == other.time
            && self.data.get() == other.data.get()
            && self.ignorable == other.ignorable
            && self.surface_op == other.surface_op
            && self.source_event_seqs == other.source_event_seqs
    }
}

impl SessionEvent {
    /// A log-only or appended event with `data` given as JSON text (rejected if not JSON).
    pub fn new(
        event_type: &str,
        seq: u64,
        time: i64,
        data_text: &str,
    ) -> Result<Self, SessionError> {
        Self::with_data_text(event_type, seq, time, data_text.to_owned())
    }

    /// [`SessionEvent::new`] keeping `data_text` itself as the event's `data` (no copy).
    pub fn with_data_text(
        event_type: &str,
        seq: u64,
        time: i64,
        data_text: String,
    ) -> Result<Self, SessionError> {
        let data =
            RawValue::from_string(data_text).map_err(|error| SessionError::UnparsableLine {
                reason: error.to_string(),
            })?;
        Ok(Self {
            event_type: event_type.to_owned(),
            seq,
            time,
            data,
            ignorable: false,
            surface_op: None,
            source_event_seqs: None,
        })
    }

    /// Renders the event as one compact JSONL line (no newline) in DSH's key order; `data`
    /// is copied byte for byte. `ignorable` (never written by DSH) goes after `data`.
    pub fn to_json_line(&self, order: KeyOrder) -> String {
        let mut line = ObjectText::new()
            .string("type", &self.event_type)
            .raw("seq", &self.seq.to_string())
            .raw("time", &self.time.to_string())
            .raw("data", self.data.get());
        if self.ignorable {
            line = line.raw("ignorable", "true");
        }
        let sources = self
            .source_event_seqs
            .as_ref()
            .map(|seqs| seq_list_text(seqs));
        let surface_op = self.surface_op.map(SurfaceOp::to_json);
        let (first, second) = match order {
            KeyOrder::LiveAppend => (("sourceEventSeqs", sources), ("surfaceOp", surface_op)),
            KeyOrder::RepairCloser => (("surfaceOp", surface_op), ("sourceEventSeqs", sources)),
        };
        for (key, text) in [first, second] {
            if let Some(text) = text {
                line = line.raw(key, &text);
            }
        }
        line.finish()
    }

    /// The payload parsed for structural reads (lone surrogates become U+FFFD; see `json`).
    pub fn data_value(&self) -> serde_json::Value {
        json::value_lossy(self.data.get()).unwrap_or(serde_json::Value::Null)
    }
}

pub(crate) fn seq_list_text(seqs: &[u64]) -> String {
    let items: Vec<String> = seqs.iter().map(u64::to_string).collect();
    format!("[{}]", items.join(","))
}

/// Parses one DSH JSONL event line (a `StorageRecord` that is a plain event) with the
/// envelope rules of model §1.2. Envelope failures use DSH's seed wording without an index;
/// use [`parse_event_line_at`] when the position in the log is known.
pub fn parse_event_line(line: &str) -> Result<SessionEvent, SessionError> {
    parse_line(line, None)
}

/// [`parse_event_line`] for the event at `index` of a seed, so errors carry DSH's exact text.
pub fn parse_event_line_at(line: &str, index: usize) -> Result<SessionEvent, SessionError> {
    parse_line(line, Some(index))
}

/// Every key an event envelope may have (persistence §1.2); any other is corruption.
pub const ENVELOPE_KEYS: [&str; 7] = [
    "type",
    "seq",
    "time",
    "data",
    "surfaceOp",
    "sourceEventSeqs",
    "ignorable",
];

/// The envelope keys besides `type`, `seq`, `time` and `data`: the ones an event may carry.
pub const OPTIONAL_ENVELOPE_KEYS: [&str; 3] =
    [ENVELOPE_KEYS[4], ENVELOPE_KEYS[5], ENVELOPE_KEYS[6]];

fn parse_line(line: &str, index: Option<usize>) -> Result<SessionEvent, SessionError> {
    // Borrowed: only `data` is copied, once, into the event.
    let members =
        json::object_members_borrowed(line).ok_or_else(|| SessionError::UnparsableLine {
            reason: serde_json::from_str::<serde::de::IgnoredAny>(line)
                .err()
                .map_or_else(|| "not an object".to_owned(), |error| error.to_string()),
        })?;
    parse_members(&members, index)
}

/// [`parse_event_line`] of a line whose members (`json::object_members_borrowed`) the
/// caller has read already.
pub(crate) fn parse_event_members(
    members: &[(String, &RawValue)],
) -> Result<SessionEvent, SessionError> {
    parse_members(members, None)
}

fn parse_members(
    members: &[(String, &RawValue)],
    index: Option<usize>,
) -> Result<SessionEvent, SessionError> {
    let field = |key: &str| {
        members
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    };
    let invalid = || SessionError::InvalidEnvelope { index };
    let event_type: String = field("type")
        .and_then(|raw| serde_json::from_str(raw.get()).ok())
        .ok_or_else(invalid)?;
    if event_type == "request/header-delta" {
        if let Some(index) = index {
            return Err(SessionError::SeedHeaderDelta { index });
        }
        return Err(SessionError::AppendHeaderDelta { event_type });
    }
    if members
        .iter()
        .any(|(name, _)| !ENVELOPE_KEYS.contains(&name.as_str()))
    {
        return Err(invalid());
    }
    let seq = field("seq")
        .and_then(|raw| js_safe_integer(raw.get()))
        .filter(|seq| *seq >= 0);
    let time = field("time").and_then(|raw| js_safe_integer(raw.get()));
    let (Some(seq), Some(time), Some(data)) = (seq, time, field("data")) else {
        return Err(invalid());
    };
    let ignorable = match field("ignorable").map(|raw| raw.get()) {
        None => false,
        Some("true") => true,
        Some(_) => return Err(invalid()),
    };
    let seq = seq as u64;
    let surface = parse_surface_metadata(
        &event_type,
        seq,
        field("surfaceOp"),
        field("sourceEventSeqs"),
    )
    .map_err(|error| match index {
        Some(index) => error.in_seed(index),
        None => error,
    })?;
    Ok(SessionEvent {
        event_type,
        seq,
        time,
        data: data.to_owned(),
        ignorable,
        surface_op: surface.0,
        source_event_seqs: surface.1,
    })
}

type SurfaceMetadata = (Option<SurfaceOp>, Option<Vec<u64>>);

/// Reads `surfaceOp`/`sourceEventSeqs`. Shapes the typed event cannot hold are rejected here
/// with DSH's surface texts; representable violations (marker on an ineligible type, missing
/// marker, empty/duplicate/later sources) are left to the surface fold, which reports them
/// in DSH's order. (Only an event with several defects can thus see a different first error.)
fn parse_surface_metadata(
    event_type: &str,
    seq: u64,
    surface_op: Option<&RawValue>,
    sources: Option<&RawValue>,
) -> Result<SurfaceMetadata, SessionError> {
    // On an ineligible type DSH reports the eligibility rule before any shape rule, so a
    // malformed marker there is reported as ineligible; a well-formed one is kept for the
    // fold to reject in order.
    let eligible = is_surface_eligible_type(event_type);
    let owned = || event_type.to_owned();
    let surface_op = surface_op
        .map(|raw| parse_surface_op(event_type, raw.get()))
        .transpose()
        .map_err(|error| match eligible {
            true => error,
            false => SessionError::SurfaceOpOnIneligible {
                event_type: owned(),
            },
        })?;
    let sources = sources
        .map(|raw| parse_sources(event_type, seq, raw.get()))
        .transpose()
        .map_err(|error| match (eligible, surface_op.is_some()) {
            (true, _) => error,
            (false, true) => SessionError::SurfaceOpOnIneligible {
                event_type: owned(),
            },
            (false, false) => SessionError::SourcesOnIneligible {
                event_type: owned(),
            },
        })?;
    Ok((surface_op, sources))
}

fn parse_surface_op(event_type: &str, text: &str) -> Result<SurfaceOp, SessionError> {
    if text.trim() == "\"append\"" {
        return Ok(SurfaceOp::Append);
    }
    let Some(members) = json::object_members(text) else {
        return Err(SessionError::InvalidSurfaceOp {
            event_type: event_type.to_owned(),
        });
    };
    let invalid_replace = || SessionError::InvalidReplaceSurfaceOp {
        event_type: event_type.to_owned(),
    };
    let field = |key: &str| {
        members
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.get())
    };
    let bound = |key: &str| {
        field(key)
            .and_then(js_safe_integer)
            .filter(|value| *value >= 0)
            .map(|value| value as u64)
    };
    let is_replace = field("op").map(str::trim) == Some("\"replace\"");
    match (members.len(), is_replace, bound("start"), bound("end")) {
        (3, true, Some(start), Some(end)) => Ok(SurfaceOp::Replace { start, end }),
        _ => Err(invalid_replace()),
    }
}

fn parse_sources(event_type: &str, seq: u64, text: &str) -> Result<Vec<u64>, SessionError> {
    // A list in the plain form is read without a serde pass and a box per seq.
    if let Some(seqs) = super::plain_json::canonical_seq_list(text) {
        return Ok(seqs);
    }
    let items: Vec<Box<RawValue>> =
        serde_json::from_str(text).map_err(|_| SessionError::SourcesNotArray {
            seq: seq.to_string(),
        })?;
    items
        .iter()
        .map(|item| match js_safe_integer(item.get()) {
            Some(value) if value >= 0 && value as u64 <= MAX_SAFE_INTEGER => Ok(value as u64),
            _ => Err(SessionError::SourcesNotDense {
                event_type: event_type.to_owned(),
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#;

    #[test]
    fn known_types_are_sorted_and_complete() {
        assert!(KNOWN_EVENT_TYPES.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(is_known_event_type("web/deepseek-search-llm-request"));
        assert!(!is_known_event_type("plugin/event"));
    }

    #[test]
    fn invalid_envelopes_match_dsh_table() {
        let cases = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"extra":true}"#,
            r#"{"type":1,"seq":0,"time":1,"data":{}}"#,
            r#"{"type":"turn/start","seq":"0","time":1,"data":{}}"#,
            r#"{"type":"turn/start","seq":0.5,"time":1,"data":{}}"#,
            r#"{"type":"turn/start","seq":-1,"time":1,"data":{}}"#,
            r#"{"type":"turn/start","seq":0,"time":"1","data":{}}"#,
            r#"{"type":"turn/start","seq":0,"time":0.5,"data":{}}"#,
            r#"{"type":"turn/start","seq":0,"time":1}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{},"ignorable":false}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{},"ignorable":"yes"}"#,
        ];
        for line in cases {
            let error = parse_event_line_at(line, 0)
                .err()
                .map(|error| error.to_string());
            assert_eq!(
                error.as_deref(),
                Some("seed event at index 0 has an invalid event envelope"),
                "{line}"
            );
        }
        let accepted = parse_event_line_at(&BASE.replace("}}", "},\"ignorable\":true}"), 0);
        assert!(matches!(
            accepted,
            Ok(SessionEvent {
                ignorable: true,
                ..
            })
        ));
    }

    #[test]
    fn data_text_is_kept_exactly() {
        let line = r#"{"type":"x/y","seq":1.0,"time":-0,"data": {"a":1.0,"s":"\ud800","a":2} }"#;
        let event = parse_event_line(line);
        assert!(matches!(&event, Ok(event) if event.seq == 1 && event.time == 0));
        let data = event
            .map(|event| event.data.get().to_owned())
            .unwrap_or_default();
        assert_eq!(data, r#"{"a":1.0,"s":"\ud800","a":2}"#);
    }

    #[test]
    fn surface_markers_are_typed_or_rejected_with_dsh_texts() {
        let line = |extra: &str| {
            format!(r#"{{"type":"user/message","seq":0,"time":1,"data":{{}}{extra}}}"#)
        };
        let message = |extra: &str| parse_event_line(&line(extra)).err().map(|e| e.to_string());
        assert_eq!(
            message(r#","surfaceOp":"invalid""#).as_deref(),
            Some("session event \"user/message\" carries an invalid surfaceOp")
        );
        assert_eq!(
            message(r#","surfaceOp":{"op":"replace","start":-1,"end":0}"#).as_deref(),
            Some("session event \"user/message\" carries an invalid replace surfaceOp")
        );
        assert_eq!(
            message(r#","surfaceOp":"append","sourceEventSeqs":"x""#).as_deref(),
            Some("sourceEventSeqs on event at seq 0 must be an array when present")
        );
        assert_eq!(message(r#","surfaceOp":"append","sourceEventSeqs":[0,-1]"#).as_deref(), Some("session event \"user/message\" sourceEventSeqs must densely contain non-negative safe integers"));
        let replace = parse_event_line(&line(
            r#","sourceEventSeqs":[],"surfaceOp":{"end":2,"op":"replace","start":1}"#,
        ));
        assert!(matches!(
            replace,
            Ok(SessionEvent {
                surface_op: Some(SurfaceOp::Replace { start: 1, end: 2 }),
                ..
            })
        ));
    }

    #[test]
    fn renders_both_dsh_key_orders() {
        let mut event = SessionEvent::new("tool/result", 4, 7, r#"{"k":1}"#).expect("valid data");
        event.surface_op = Some(SurfaceOp::Append);
        event.source_event_seqs = Some(vec![3]);
        let live = r#"{"type":"tool/result","seq":4,"time":7,"data":{"k":1},"sourceEventSeqs":[3],"surfaceOp":"append"}"#;
        let closer = r#"{"type":"tool/result","seq":4,"time":7,"data":{"k":1},"surfaceOp":"append","sourceEventSeqs":[3]}"#;
        assert_eq!(event.to_json_line(KeyOrder::LiveAppend), live);
        assert_eq!(event.to_json_line(KeyOrder::RepairCloser), closer);
        assert_eq!(parse_event_line(live).ok(), Some(event));
    }
}
