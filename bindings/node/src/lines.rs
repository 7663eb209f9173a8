//! DSH event lines ↔ dshdb events, byte for byte.
//!
//! DSH hands each event as its `JSON.stringify` text. The store keeps `type`, `seq`, `time`,
//! `data` (raw text) and the other envelope members (raw text, in their order), and renders
//! them back as `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`. A line that would not
//! come back identical that way (another member order, a member the store's envelope does not
//! admit, a type with a lone surrogate, a non-integer time) is stored verbatim instead, hex
//! encoded like the engine's DSH importer does (`{"dshdb:hex":"…"}`), so reading it back
//! always gives the exact text DSH wrote.

use dshdb::storage::frame::{EVENT_FLAG_ROW_VERBATIM, EVENT_FLAG_VERBATIM_LINE};
use dshdb::{EventView, NewEvent};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt::Write as _;

/// Prefix of a hex-encoded verbatim line (the engine's importer uses the same form).
const HEX_PREFIX: &str = "{\"dshdb:hex\":\"";
/// Envelope members the store admits besides `type`, `seq`, `time` and `data`.
const ENVELOPE_KEYS: [&str; 3] = ["surfaceOp", "sourceEventSeqs", "ignorable"];
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
        if !ENVELOPE_KEYS.contains(&key.as_ref()) {
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
    render_canonical(
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
    let mut envelope = String::with_capacity(HEX_PREFIX.len() + line.len() * 2 + 2);
    envelope.push_str(HEX_PREFIX);
    for byte in line.bytes() {
        let _ = write!(envelope, "{byte:02x}");
    }
    envelope.push_str("\"}");
    StoredLine {
        event_type: event_type.to_string(),
        time,
        data: "null".to_string(),
        envelope,
        flags: EVENT_FLAG_VERBATIM_LINE,
    }
}

/// `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`, the store's rendering.
fn render_canonical(
    out: &mut String,
    event_type: &str,
    seq: u64,
    time: i64,
    data: &str,
    envelope: &str,
) {
    out.push_str("{\"type\":");
    let plain = |byte: u8| byte >= 0x20 && byte != b'"' && byte != b'\\';
    if event_type.bytes().all(plain) {
        out.push('"');
        out.push_str(event_type);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::String(event_type.to_string()).to_string());
    }
    let _ = write!(out, ",\"seq\":{seq},\"time\":{time},\"data\":");
    out.push_str(data);
    if !envelope.is_empty() {
        out.push(',');
        out.push_str(envelope);
    }
    out.push('}');
}

/// Appends the DSH event line of a stored event to `out`. A packed chunk row's members
/// (imported logs) render as plain events; a verbatim line as its original text.
pub fn render_event(out: &mut String, event: &EventView<'_>) {
    if event.flags & EVENT_FLAG_ROW_VERBATIM != 0 {
        render_canonical(out, event.event_type, event.seq, event.time, event.data, "");
    } else if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        match decode_hex(event.envelope) {
            Some(bytes) => out.push_str(&String::from_utf8_lossy(&bytes)),
            None => out.push_str(event.envelope),
        }
    } else {
        render_canonical(
            out,
            event.event_type,
            event.seq,
            event.time,
            event.data,
            event.envelope,
        );
    }
}

/// The bytes of a hex-encoded verbatim line, `None` for a line stored as plain text.
fn decode_hex(envelope: &str) -> Option<Vec<u8>> {
    let hex = envelope.strip_prefix(HEX_PREFIX)?.strip_suffix("\"}")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
        .collect()
}
