//! Parsing of `dshdb append` input lines: `{"type":..,"data":..,"time"?:..,"surfaceOp"?:..,
//! "sourceEventSeqs"?:..,"ignorable"?:..}`. Values are kept as their exact JSON text.

use dshdb::derive::cache::{CacheOptions, ProjectionCache};
use dshdb::derive::projection::SurfaceUnit;
use dshdb::exchange::MAX_IMPORT_LINE_BYTES;
use dshdb::session::error::SessionError;
use dshdb::session::event::{
    closest_known_event_type, is_known_event_type, parse_event_line, SessionEvent,
};
use dshdb::session::json::single_line_error;
use dshdb::session::seed::{validate_seed_event, SeedMode};
use dshdb::session::surface::SurfaceFold;
use dshdb::session::{MAX_SAFE_INTEGER, OPTIONAL_ENVELOPE_KEYS};
use dshdb::store::{check_data_depth, Event};
use dshdb::{NewEvent, Store};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;
use std::io::{BufRead, Read};

/// Longest input line `append` reads, in bytes: the largest event the store holds plus its
/// envelope, the same bound a DSH log line has on import.
pub const MAX_INPUT_LINE_BYTES: usize = MAX_IMPORT_LINE_BYTES;

/// One read from the input.
pub enum InputLine {
    /// A line (without its `\n`).
    Line(String),
    /// The input ended.
    End,
}

/// Reads the next line, never holding more than `limit` bytes of it: a longer line is an
/// error, so an endless line is refused instead of exhausting memory.
pub fn read_line(input: &mut impl BufRead, limit: usize) -> Result<InputLine, String> {
    let mut bytes = Vec::new();
    let read = input
        .by_ref()
        .take(limit as u64 + 1)
        .read_until(b'\n', &mut bytes)
        .map_err(|error| format!("cannot read input: {error}"))?;
    if read == 0 {
        return Ok(InputLine::End);
    }
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    } else if bytes.len() > limit {
        return Err(format!(
            "more than {limit} bytes without a newline (the largest event plus its envelope)"
        ));
    }
    String::from_utf8(bytes)
        .map(InputLine::Line)
        .map_err(|_| "cannot read input: stream did not contain valid UTF-8".to_owned())
}

/// The members of one JSON object, in the order they appear, values as raw JSON text.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;
        impl<'de> Visitor<'de> for MembersVisitor {
            type Value = Members;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value: Box<RawValue> = map.next_value()?;
                    members.push((key, value));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(MembersVisitor)
    }
}

/// One parsed input line.
#[derive(Debug)]
pub struct InputEvent {
    pub event_type: String,
    pub time: Option<i64>,
    /// `seq`, when the line carries one (e.g. a line exported by `dshdb events`).
    pub seq: Option<u64>,
    pub data: Box<RawValue>,
    /// The envelope members as `"key":value` text, in input order.
    pub envelope: String,
}

impl InputEvent {
    pub fn as_new_event(&self) -> NewEvent<'_> {
        NewEvent {
            time: self.time,
            envelope: &self.envelope,
            ..NewEvent::new(&self.event_type, self.data.get())
        }
    }
}

/// Refuses an event that the session views (`messages`, `surface`, `repair`, DSH export
/// and import) could not read back, before it is stored: they refuse the whole session
/// afterwards. `seq` is the seq the event would get. Checks the event on its own (nesting
/// depth, type, envelope and message shape, as DSH's cold load checks each event); the
/// surface fold across events (replace ranges) is not replayed here.
pub fn check_readable_by_session_views(
    event: &InputEvent,
    seq: u64,
) -> Result<SessionEvent, String> {
    check_data_depth(event.data.get()).map_err(|error| error.to_string())?;
    let ignorable = event.envelope.contains("\"ignorable\":true");
    if !ignorable && !is_known_event_type(&event.event_type) {
        let hint = match closest_known_event_type(&event.event_type) {
            Some(known) => format!(" (did you mean {known:?}?)"),
            None => String::new(),
        };
        return Err(format!(
            "event type {:?} is not a DSH event type{hint}; a type of your own needs \
             \"ignorable\":true, or DSH and the session views refuse the whole session",
            event.event_type
        ));
    }
    let line = Event {
        seq,
        time: event.time.unwrap_or(0),
        event_type: event.event_type.clone(),
        data: event.data.get().to_owned(),
        envelope: event.envelope.clone(),
        flags: 0,
    }
    .to_json_line();
    let unreadable =
        |error: SessionError| format!("the session views could not read this event back: {error}");
    let parsed = parse_event_line(&line).map_err(unreadable)?;
    let index = usize::try_from(seq).unwrap_or(usize::MAX);
    validate_seed_event(index, &parsed, SeedMode::Restore).map_err(unreadable)?;
    Ok(parsed)
}

/// The session's surface as its last event left it (a checkpointed cold read), so each
/// appended event can be checked against DSH's surface rules: what the fold refuses, the
/// session views (messages, surface, repair, DSH import) would refuse for good.
pub fn current_surface(store: &Store, session: &str) -> Result<SurfaceFold, String> {
    if store
        .session(session)
        .is_ok_and(|summary| summary.events == 0)
    {
        return Ok(SurfaceFold::new());
    }
    ProjectionCache::new(store, CacheOptions::default())
        .read(session, &SurfaceUnit)
        .map(|(surface, _)| surface)
        .map_err(|error| {
            format!(
                "the session's surface cannot be read, so appends to it are not accepted: {error}"
            )
        })
}

/// Parses one input line. The error says what is wrong (without the line number).
pub fn parse_line(line: &str) -> Result<InputEvent, String> {
    let Members(members) = serde_json::from_str(line).map_err(|error| single_line_error(&error))?;
    let mut event_type = None;
    let mut time = None;
    let mut seq = None;
    let mut data = None;
    let mut envelope = String::new();
    let mut seen: Vec<&str> = Vec::new();
    for (key, value) in &members {
        if seen.contains(&key.as_str()) {
            return Err(format!("duplicate member {key:?}"));
        }
        seen.push(key);
        let raw = value.get();
        match key.as_str() {
            "type" => {
                let name: String = serde_json::from_str(raw)
                    .map_err(|_| format!("\"type\" must be a string, got {raw}"))?;
                if name.is_empty() {
                    return Err("\"type\" must not be empty".to_string());
                }
                event_type = Some(name);
            }
            "data" => data = Some(value.clone()),
            "time" => {
                let parsed = raw
                    .parse::<i64>()
                    .ok()
                    .filter(|time| time.unsigned_abs() <= MAX_SAFE_INTEGER);
                time = Some(parsed.ok_or_else(|| {
                    format!("\"time\" must be a safe integer (epoch milliseconds), got {raw}")
                })?);
            }
            "seq" => {
                let parsed = raw
                    .parse::<u64>()
                    .ok()
                    .filter(|seq| *seq <= MAX_SAFE_INTEGER);
                seq =
                    Some(parsed.ok_or_else(|| {
                        format!("\"seq\" must be a safe integer >= 0, got {raw}")
                    })?);
            }
            "surfaceOp" | "sourceEventSeqs" | "ignorable" => {
                check_envelope_value(key, raw)?;
                if !envelope.is_empty() {
                    envelope.push(',');
                }
                envelope.push('"');
                envelope.push_str(key);
                envelope.push_str("\":");
                envelope.push_str(raw);
            }
            other => {
                return Err(format!(
                    "unknown member {other:?}; allowed: type, data, time, seq, {}",
                    OPTIONAL_ENVELOPE_KEYS.join(", ")
                ))
            }
        }
    }
    let event_type = event_type.ok_or("missing member \"type\"")?;
    let data = data.ok_or("missing member \"data\"")?;
    Ok(InputEvent {
        event_type,
        time,
        seq,
        data,
        envelope,
    })
}

/// The DSH envelope rules on value shapes (reference/dsh-persistence.md §1.2).
fn check_envelope_value(key: &str, raw: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_str(raw)
        .map_err(|error| format!("\"{key}\" is not valid JSON: {error}"))?;
    let ok = match key {
        "ignorable" => value == serde_json::Value::Bool(true),
        "surfaceOp" => value.as_str() == Some("append") || value.is_object(),
        "sourceEventSeqs" => value
            .as_array()
            .is_some_and(|seqs| seqs.iter().all(|seq| seq.as_u64().is_some())),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        let expected = match key {
            "ignorable" => "true",
            "surfaceOp" => "\"append\" or a replace record",
            _ => "an array of seqs",
        };
        Err(format!("\"{key}\" must be {expected}, got {raw}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_raw_text_and_envelope_order() {
        let line = r#"{"type":"tool/result","data":{"n":1e+21,"s":"\ud800"},"sourceEventSeqs":[3],"time":7,"surfaceOp":"append"}"#;
        let event = parse_line(line).expect("parses");
        assert_eq!(event.event_type, "tool/result");
        assert_eq!(event.data.get(), r#"{"n":1e+21,"s":"\ud800"}"#);
        assert_eq!(event.time, Some(7));
        assert_eq!(
            event.envelope,
            r#""sourceEventSeqs":[3],"surfaceOp":"append""#
        );
    }

    #[test]
    fn a_line_past_the_limit_is_refused_without_reading_it_all() {
        let mut input = std::io::Cursor::new(b"12345\n123456789\nrest".to_vec());
        assert!(matches!(read_line(&mut input, 5), Ok(InputLine::Line(line)) if line == "12345"));
        assert!(read_line(&mut input, 5).is_err());
        // At most the limit plus one byte of the long line was consumed.
        assert_eq!(input.position(), 12);
    }

    #[test]
    fn rejects_bad_lines() {
        for line in [
            "",
            "[]",
            r#"{"data":{}}"#,
            r#"{"type":"x"}"#,
            r#"{"type":1,"data":{}}"#,
            r#"{"type":"x","data":{},"extra":1}"#,
            r#"{"type":"x","data":{},"time":1.5}"#,
            r#"{"type":"x","data":{},"ignorable":false}"#,
            r#"{"type":"x","data":{},"type":"y"}"#,
            r#"{"type":"x","data":{"#,
        ] {
            assert!(parse_line(line).is_err(), "{line} should be rejected");
        }
    }
}
