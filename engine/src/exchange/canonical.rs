//! dshdb's canonical JSONL export (`--format json`): versioned, self-describing and lossless.
//!
//! The first line describes the file:
//!
//! ```text
//! {"format":"dshdb-json","version":1,"header":<stored header>,"lineage":{..}|null,"events":N}
//! ```
//!
//! and each following line holds one event, in seq order from 0:
//!
//! ```text
//! {"seq":S,"time":T,"type":"..","flags":F,"data":<stored data>,"envelope":".."}
//! ```
//!
//! The header and `data` are the stored JSON text itself, so numbers and escapes are kept as
//! stored; a text JSON would not reproduce (leading or trailing whitespace) travels as a JSON
//! string in `headerText` / `dataText` instead. The envelope is always a JSON string: it may
//! be a verbatim original line or a hex envelope. A fork is exported with its seed
//! materialized (every event it reads); `lineage` repeats the header's `parentSession` /
//! `seedLength` for readers and is checked on import.

use super::scan::Record;
use crate::session::event::SessionEvent;
use crate::session::json::{object_keys, single_line_error};
use crate::storage::frame::{
    EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_VERBATIM, EVENT_FLAG_VERBATIM_LINE, KNOWN_EVENT_FLAGS,
};
use crate::store::{NewEvent, Store, MAX_EVENT_DATA_BYTES, MAX_HEADER_BYTES, MAX_TYPE_BYTES};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::io::Write;

/// The `format` member of a canonical file's first line.
pub const CANONICAL_FORMAT: &str = "dshdb-json";
/// The canonical format version this build writes and reads.
pub const CANONICAL_VERSION: u64 = 1;

/// Why a canonical export or import failed. On an import refusal nothing was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// The first line does not name the `dshdb-json` format.
    #[error("not a dshdb-json file: format is {found}")]
    UnknownFormat { found: String },
    /// The file is `dshdb-json` of a version this build cannot read.
    #[error("dshdb-json version {found} is not supported; this build reads version {supported}")]
    UnsupportedVersion { found: String, supported: u64 },
    /// A line of the file is malformed (1-based line number).
    #[error("malformed dshdb-json line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    /// The store failed or refused the session.
    #[error(transparent)]
    Store(#[from] crate::Error),
    /// Writing the export failed.
    #[error("cannot write export: {0}")]
    Write(#[from] std::io::Error),
}

/// What a canonical import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalImport {
    pub session_id: String,
    pub events: u64,
    /// Append batches written (1 unless the session was too large for one atomic batch).
    pub batches: u64,
}

use crate::limits::{EVENTS_PER_READ, MAX_PREALLOCATED_EVENTS};

/// JSON whitespace, the only text [`RawValue`] drops around a value.
fn is_json_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Whether `text` travels raw: it has no whitespace around it for a parser to drop.
fn travels_raw(text: &str) -> bool {
    text.trim_matches(is_json_whitespace) == text
}

/// The `lineage` member for a header: `{"parentSession":..,"seedLength":..}` or `null`.
fn lineage_of(header_json: &str) -> Value {
    let header: Value = serde_json::from_str(header_json).unwrap_or(Value::Null);
    match header.get("parentSession") {
        Some(parent) => {
            let mut lineage = Map::new();
            lineage.insert("parentSession".into(), parent.clone());
            lineage.insert(
                "seedLength".into(),
                header.get("seedLength").cloned().unwrap_or(Value::Null),
            );
            Value::Object(lineage)
        }
        None => Value::Null,
    }
}

fn json_string(text: &str) -> String {
    // Serializing a string cannot fail.
    serde_json::to_string(text).unwrap_or_default()
}

/// Whether `first_line` (a file's first line, without newline) is a canonical header line
/// of any version: an object whose `format` is `dshdb-json`.
pub fn is_canonical(first_line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<String>,
    }
    serde_json::from_slice::<Probe>(first_line)
        .ok()
        .and_then(|probe| probe.format)
        .is_some_and(|format| format == CANONICAL_FORMAT)
}

/// Writes session `id` as canonical JSONL to `out`. `progress(done, total)` is called with
/// events written so far.
pub fn write_canonical(
    store: &Store,
    id: &str,
    out: &mut dyn Write,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), CanonicalError> {
    let summary = store.session(id)?;
    let total = summary.events;
    let mut line = String::with_capacity(summary.header_json.len() + 128);
    line.push_str("{\"format\":");
    line.push_str(&json_string(CANONICAL_FORMAT));
    line.push_str(&format!(",\"version\":{CANONICAL_VERSION},"));
    if travels_raw(&summary.header_json) {
        line.push_str("\"header\":");
        line.push_str(&summary.header_json);
    } else {
        line.push_str("\"headerText\":");
        line.push_str(&json_string(&summary.header_json));
    }
    line.push_str(",\"lineage\":");
    line.push_str(&lineage_of(&summary.header_json).to_string());
    line.push_str(&format!(",\"events\":{total}}}\n"));
    out.write_all(line.as_bytes())?;
    let mut from = 0;
    progress(0, total);
    while from < total {
        let to = total.min(from + EVENTS_PER_READ);
        let events = store.read(id, from, to)?;
        for event in &events {
            line.clear();
            line.push_str(&format!(
                "{{\"seq\":{},\"time\":{},\"type\":{},\"flags\":{},",
                event.seq,
                event.time,
                json_string(&event.event_type),
                event.flags
            ));
            if travels_raw(&event.data) {
                line.push_str("\"data\":");
                line.push_str(&event.data);
            } else {
                line.push_str("\"dataText\":");
                line.push_str(&json_string(&event.data));
            }
            line.push_str(",\"envelope\":");
            line.push_str(&json_string(&event.envelope));
            line.push_str("}\n");
            out.write_all(line.as_bytes())?;
        }
        if events.is_empty() {
            break;
        }
        from = to;
        progress(from, total);
    }
    Ok(())
}

/// Exports session `id` as canonical JSONL bytes.
pub fn export_canonical(store: &Store, id: &str) -> Result<Vec<u8>, CanonicalError> {
    let mut out = Vec::new();
    write_canonical(store, id, &mut out, &mut |_, _| {})?;
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine<'a> {
    format: String,
    version: u64,
    #[serde(borrow, default)]
    header: Option<&'a RawValue>,
    #[serde(default, rename = "headerText")]
    header_text: Option<String>,
    lineage: Value,
    events: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventLine<'a> {
    seq: u64,
    time: i64,
    #[serde(rename = "type")]
    event_type: String,
    flags: u8,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(default, rename = "dataText")]
    data_text: Option<String>,
    envelope: String,
}

/// One parsed event, its data either borrowed from the input or owned.
struct Parsed<'a> {
    time: i64,
    event_type: String,
    flags: u8,
    data: std::borrow::Cow<'a, str>,
    envelope: String,
}

/// The first line's format and version, checked before anything else is parsed.
fn check_format(first: &[u8]) -> Result<(), CanonicalError> {
    #[derive(Deserialize)]
    struct Probe {
        format: Option<Value>,
        version: Option<Value>,
    }
    let probe: Probe =
        serde_json::from_slice(first).map_err(|error| CanonicalError::Malformed {
            line: 1,
            reason: format!("not a JSON object: {}", single_line_error(&error)),
        })?;
    match probe.format {
        Some(Value::String(format)) if format == CANONICAL_FORMAT => {}
        Some(other) => {
            return Err(CanonicalError::UnknownFormat {
                found: other.to_string(),
            })
        }
        None => {
            return Err(CanonicalError::UnknownFormat {
                found: "missing".into(),
            })
        }
    }
    match probe.version {
        Some(version) if version.as_u64() == Some(CANONICAL_VERSION) => Ok(()),
        Some(version) => Err(CanonicalError::UnsupportedVersion {
            found: version.to_string(),
            supported: CANONICAL_VERSION,
        }),
        None => Err(CanonicalError::UnsupportedVersion {
            found: "missing".into(),
            supported: CANONICAL_VERSION,
        }),
    }
}

fn check_event(line: usize, event: &Parsed<'_>) -> Result<(), CanonicalError> {
    let malformed = |reason: String| CanonicalError::Malformed { line, reason };
    if event.event_type.is_empty() || event.event_type.len() > MAX_TYPE_BYTES {
        return Err(malformed(format!(
            "event type must be 1 to {MAX_TYPE_BYTES} bytes"
        )));
    }
    if event.data.len() > MAX_EVENT_DATA_BYTES {
        return Err(malformed(format!(
            "event data is {} bytes; the limit is {MAX_EVENT_DATA_BYTES}",
            event.data.len()
        )));
    }
    serde_json::from_str::<&RawValue>(&event.data)
        .map_err(|error| malformed(format!("event data is not JSON: {error}")))?;
    if event.flags & !KNOWN_EVENT_FLAGS != 0 {
        return Err(malformed(format!("unknown event flags {:#x}", event.flags)));
    }
    let envelope_ok = if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        object_keys(&event.envelope).is_ok()
    } else {
        event.envelope.is_empty() || object_keys(&format!("{{{}}}", event.envelope)).is_ok()
    };
    if !envelope_ok {
        return Err(malformed(
            "envelope is not valid for the event's flags".into(),
        ));
    }
    Ok(())
}

/// A verbatim event keeps the DSH line it was imported from, and export writes that line:
/// the line must say what the event's own fields say (type, seq, time, data), or `events`
/// and the DSH export would show two different events. A verbatim packed row covers the
/// row's start event and the members after it.
fn check_verbatim_lines(events: &[Parsed<'_>]) -> Result<(), CanonicalError> {
    for (index, event) in events.iter().enumerate() {
        if event.flags & EVENT_FLAG_VERBATIM_LINE == 0 {
            continue;
        }
        let line = index + 2;
        let refuse = |reason: String| CanonicalError::Malformed { line, reason };
        let bytes = super::verbatim_bytes(&event.envelope)
            .ok_or_else(|| refuse("damaged verbatim line".into()))?;
        let record = super::scan::decode_record(&bytes)
            .map_err(|()| refuse("the verbatim line is not a DSH event line".into()))?;
        let (members, member_data): (Vec<&SessionEvent>, Vec<&str>) = match &record {
            Record::Event(parsed) => (vec![parsed], vec![parsed.data.get()]),
            Record::Row { members } => (
                members.iter().collect(),
                members.iter().map(|member| member.data.get()).collect(),
            ),
        };
        let is_row = event.flags & EVENT_FLAG_ROW_VERBATIM != 0;
        if is_row != matches!(record, Record::Row { .. }) {
            return Err(refuse(
                "the verbatim line's kind (event or packed row) contradicts the event's flags"
                    .into(),
            ));
        }
        for (offset, (member, data)) in members.iter().zip(member_data).enumerate() {
            let seq = index + offset;
            let Some(stored) = events.get(seq) else {
                return Err(refuse(
                    "the verbatim row has more members than the file".into(),
                ));
            };
            let field = if member.event_type != stored.event_type {
                Some("type")
            } else if member.seq != seq as u64 {
                Some("seq")
            } else if member.time != stored.time {
                Some("time")
            } else if data != stored.data.as_ref() {
                Some("data")
            } else {
                None
            };
            if let Some(field) = field {
                return Err(refuse(format!(
                    "the verbatim line contradicts the {field} of the event at seq {seq}"
                )));
            }
        }
    }
    Ok(())
}

/// Imports a canonical JSONL file. Every line is checked before anything is written; the
/// session is created with all its events in one atomic batch when they fit one batch.
/// `progress(done, total)` is called with input bytes parsed, then events written.
pub fn import_canonical_with_progress(
    store: &Store,
    bytes: &[u8],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<CanonicalImport, CanonicalError> {
    let first_end = bytes
        .iter()
        .position(|&byte| byte == b'\n')
        .unwrap_or(bytes.len());
    check_format(&bytes[..first_end])?;
    let text = std::str::from_utf8(bytes).map_err(|error| {
        let line = 1 + bytes[..error.valid_up_to()]
            .iter()
            .filter(|&&byte| byte == b'\n')
            .count();
        CanonicalError::Malformed {
            line,
            reason: "invalid UTF-8".into(),
        }
    })?;
    let Some(body) = text.strip_suffix('\n') else {
        return Err(CanonicalError::Malformed {
            line: text.lines().count().max(1),
            reason: "the file does not end with a newline".into(),
        });
    };
    let mut lines = body.split('\n');
    let first = lines.next().unwrap_or_default();
    let header: HeaderLine<'_> =
        serde_json::from_str(first).map_err(|error| CanonicalError::Malformed {
            line: 1,
            reason: error.to_string(),
        })?;
    debug_assert!(header.format == CANONICAL_FORMAT && header.version == CANONICAL_VERSION);
    let header_json: String = match (header.header, header.header_text) {
        (Some(raw), None) => raw.get().to_owned(),
        (None, Some(text)) => text,
        _ => {
            return Err(CanonicalError::Malformed {
                line: 1,
                reason: "exactly one of header and headerText is required".into(),
            })
        }
    };
    if header_json.len() > MAX_HEADER_BYTES
        || serde_json::from_str::<Map<String, Value>>(&header_json).is_err()
    {
        return Err(CanonicalError::Malformed {
            line: 1,
            reason: "the header is not a JSON object within the size limit".into(),
        });
    }
    if header.lineage != lineage_of(&header_json) {
        return Err(CanonicalError::Malformed {
            line: 1,
            reason: "lineage does not match the header".into(),
        });
    }
    let total_bytes = bytes.len() as u64;
    let mut parsed_bytes = first.len() as u64 + 1;
    let reserved = usize::try_from(header.events).map_or(MAX_PREALLOCATED_EVENTS, |events| {
        events.min(MAX_PREALLOCATED_EVENTS)
    });
    let mut events: Vec<Parsed<'_>> = Vec::with_capacity(reserved);
    for (index, raw_line) in lines.enumerate() {
        let line = index + 2;
        let event: EventLine<'_> =
            serde_json::from_str(raw_line).map_err(|error| CanonicalError::Malformed {
                line,
                reason: single_line_error(&error),
            })?;
        if event.seq != index as u64 {
            return Err(CanonicalError::Malformed {
                line,
                reason: format!("seq {} where {index} was expected", event.seq),
            });
        }
        let data = match (event.data, event.data_text) {
            (Some(raw), None) => std::borrow::Cow::Borrowed(raw.get()),
            (None, Some(text)) => std::borrow::Cow::Owned(text),
            _ => {
                return Err(CanonicalError::Malformed {
                    line,
                    reason: "exactly one of data and dataText is required".into(),
                })
            }
        };
        let parsed = Parsed {
            time: event.time,
            event_type: event.event_type,
            flags: event.flags,
            data,
            envelope: event.envelope,
        };
        check_event(line, &parsed)?;
        events.push(parsed);
        parsed_bytes += raw_line.len() as u64 + 1;
        if index % 4096 == 0 {
            progress(parsed_bytes, total_bytes);
        }
    }
    progress(total_bytes, total_bytes);
    if events.len() as u64 != header.events {
        return Err(CanonicalError::Malformed {
            line: 1,
            reason: format!(
                "the header announces {} events; the file holds {}",
                header.events,
                events.len()
            ),
        });
    }
    check_verbatim_lines(&events)?;
    if events
        .first()
        .is_some_and(|event| event.flags & EVENT_FLAG_ROW_MEMBER != 0)
    {
        return Err(CanonicalError::Malformed {
            line: 2,
            reason: "the first event is a packed-row member without a row start".into(),
        });
    }
    // Split like the DSH import: batches of about IMPORT_BATCH_BYTES, never inside a row.
    let batches = super::batch_ranges(
        events
            .iter()
            .map(|event| (event.data.len() + event.envelope.len(), event.flags)),
    );
    let as_new = |range: std::ops::Range<usize>| -> Vec<NewEvent<'_>> {
        events[range]
            .iter()
            .map(|event| NewEvent {
                event_type: &event.event_type,
                time: Some(event.time),
                data: &event.data,
                envelope: &event.envelope,
                flags: event.flags,
            })
            .collect()
    };
    let total_events = events.len() as u64;
    let batch_count = batches.len().max(1) as u64;
    let mut ranges = batches.into_iter();
    let first_range = ranges.next().unwrap_or(0..0);
    let mut written = first_range.len() as u64;
    let mut writer = store.create_session_with_events(&header_json, &as_new(first_range))?;
    progress(written, total_events);
    for range in ranges {
        written += range.len() as u64;
        writer.append_batch(&as_new(range))?;
        progress(written, total_events);
    }
    Ok(CanonicalImport {
        session_id: writer.id().to_owned(),
        events: total_events,
        batches: batch_count,
    })
}

/// Imports a canonical JSONL file (see [`import_canonical_with_progress`]).
pub fn import_canonical(store: &Store, bytes: &[u8]) -> Result<CanonicalImport, CanonicalError> {
    import_canonical_with_progress(store, bytes, &mut |_, _| {})
}
