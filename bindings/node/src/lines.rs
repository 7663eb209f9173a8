//! DSH event lines ↔ dshdb events, byte for byte.
//!
//! DSH hands each event as its `JSON.stringify` text. The store keeps `type`, `seq`, `time`,
//! `data` (raw text) and the other envelope members (raw text, in their order), and renders
//! them back as `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`. A line that would not
//! come back identical that way (another member order, a member the store's envelope does not
//! admit, a type with a lone surrogate, a non-integer time) is stored verbatim instead, hex
//! encoded like the engine's DSH importer does (`{"dshdb:hex":"…"}`), so reading it back
//! always gives the exact text DSH wrote.

use dshdb::exchange;
use dshdb::session::line::push_event_line;
use dshdb::session::OPTIONAL_ENVELOPE_KEYS;
use dshdb::storage::frame::EVENT_FLAG_VERBATIM_LINE;
use dshdb::NewEvent;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt::Write as _;

/// Type recorded for a verbatim line whose `type` the store cannot hold as text.
const UNREADABLE_TYPE: &str = "dshdb:unreadable-type";

/// Why a batch was refused.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("event line {index} is not a JSON object")]
    NotAnObject { index: usize },
    #[error("append seq mismatch: expected {expected} at index {index}, got {got}")]
    SeqMismatch {
        index: usize,
        expected: u64,
        got: String,
    },
}

/// One event as the store will hold it.
pub struct StoredLine {
    pub event_type: String,
    pub time: i64,
    pub data: String,
    pub envelope: String,
    pub flags: u8,
}

impl StoredLine {
    pub fn as_new(&self) -> NewEvent<'_> {
        NewEvent {
            event_type: &self.event_type,
            time: Some(self.time),
            data: &self.data,
            envelope: &self.envelope,
            flags: self.flags,
        }
    }
}

/// The top-level members of one JSON object, in order, values as raw text.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members<'de>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// Splits `lines` (one event per `\n`-separated line) into stored events whose seqs run
/// from `first_seq`.
pub fn split_batch(lines: &str, first_seq: u64) -> Result<Vec<StoredLine>, LineError> {
    lines
        .split('\n')
        .enumerate()
        .map(|(index, line)| split_line(line, index, first_seq + index as u64))
        .collect()
}

fn split_line(line: &str, index: usize, expected_seq: u64) -> Result<StoredLine, LineError> {
    let seq_mismatch = |got: String| LineError::SeqMismatch {
        index,
        expected: expected_seq,
        got,
    };
    let Ok(Members(members)) = serde_json::from_str::<Members<'_>>(line) else {
        // Not splittable as text (a top-level key with a lone surrogate): DSH already
        // checked the batch's seqs; keep the line whole.
        if !line.trim_start().starts_with('{') {
            return Err(LineError::NotAnObject { index });
        }
        return Ok(verbatim(line, UNREADABLE_TYPE, 0));
    };
    let member = |name: &str| {
        members
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.get())
    };
    let seq_text = member("seq").unwrap_or("undefined");
    if seq_text.parse::<u64>().ok() != Some(expected_seq) {
        return Err(seq_mismatch(seq_text.to_string()));
    }
    let event_type = member("type").and_then(|raw| serde_json::from_str::<String>(raw).ok());
    let time = member("time").and_then(|raw| raw.parse::<i64>().ok());
    let (Some(event_type), Some(time), Some(data)) = (event_type, time, member("data")) else {
        let event_type = member("type")
            .and_then(|raw| serde_json::from_str::<String>(raw).ok())
            .unwrap_or_else(|| UNREADABLE_TYPE.to_string());
        return Ok(verbatim(line, &event_type, time.unwrap_or(0)));
    };
    let mut envelope = String::new();
    for (key, value) in &members {
        if matches!(key.as_ref(), "type" | "seq" | "time" | "data") {
            continue;
        }
        if !OPTIONAL_ENVELOPE_KEYS.contains(&key.as_ref()) {
            return Ok(verbatim(line, &event_type, time));
        }
        if !envelope.is_empty() {
            envelope.push(',');
        }
        let _ = write!(envelope, "\"{key}\":{}", value.get());
    }
    let stored = StoredLine {
        event_type,
        time,
        data: data.to_string(),
        envelope,
        flags: 0,
    };
    let mut rendered = String::with_capacity(line.len());
    push_event_line(
        &mut rendered,
        &stored.event_type,
        expected_seq,
        time,
        &stored.data,
        &stored.envelope,
    );
    if rendered != line {
        return Ok(verbatim(line, &stored.event_type, time));
    }
    Ok(stored)
}

/// A line kept whole: its text is what reads give back.
fn verbatim(line: &str, event_type: &str, time: i64) -> StoredLine {
    let envelope = exchange::hex_verbatim_envelope(line.as_bytes());
    StoredLine {
        event_type: event_type.to_string(),
        time,
        data: "null".to_string(),
        envelope,
        flags: EVENT_FLAG_VERBATIM_LINE,
    }
}
