//! Validation of a session header and of an event before anything is encoded.

use super::{
    NewEvent, MAX_EVENT_DATA_BYTES, MAX_EVENT_DATA_DEPTH, MAX_HEADER_BYTES, MAX_TYPE_BYTES,
};
use crate::error::{Error, Result};
use crate::session::json::object_keys;
use crate::session::{MAX_SAFE_INTEGER, OPTIONAL_ENVELOPE_KEYS};
use crate::storage::catalog::header_id;
use crate::storage::frame::{EVENT_FLAG_VERBATIM_LINE, KNOWN_EVENT_FLAGS};

pub(super) fn validate_header(header_json: &str) -> Result<String> {
    if header_json.len() > MAX_HEADER_BYTES {
        return Err(Error::TooLarge {
            what: "session header",
            unit: "bytes",
            size: header_json.len() as u64,
            limit: MAX_HEADER_BYTES as u64,
        });
    }
    let value: serde_json::Value = serde_json::from_str(header_json)
        .map_err(|error| Error::invalid(format!("session header is not JSON: {error}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid("session header is not a JSON object"))?;
    match object.get("version").and_then(serde_json::Value::as_u64) {
        Some(0) => {}
        _ => return Err(Error::invalid("session header version must be 0")),
    }
    match object.get("createdAt").and_then(serde_json::Value::as_u64) {
        Some(created) if created <= MAX_SAFE_INTEGER => {}
        _ => {
            return Err(Error::invalid(
                "session header createdAt must be a safe integer >= 0",
            ))
        }
    }
    let id = header_id(header_json.as_bytes()).map_err(Error::invalid)?;
    validate_session_id(&id)?;
    Ok(id)
}

/// Refuses a session id that listings could not show unambiguously: an empty one, or one
/// holding a C0 control character or DEL (a newline would make `ls` print two lines for one
/// session). The Node binding maps DSH ids of that kind to encoded store ids by the same
/// rule (bindings/node/ts/ids.ts).
pub(super) fn validate_session_id(id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid("session id is empty"));
    }
    if let Some(control) = id.chars().find(char::is_ascii_control) {
        return Err(Error::invalid(format!(
            "session id {id:?} holds the control character {control:?}; ids must be printable"
        )));
    }
    Ok(())
}

/// Refuses `data` nested deeper than [`MAX_EVENT_DATA_DEPTH`]: what no derived view can
/// parse must not be stored (the text is valid JSON already, so only brackets outside
/// strings count).
pub fn check_data_depth(data: &str) -> Result<()> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for byte in data.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_EVENT_DATA_DEPTH {
                    return Err(Error::invalid(format!(
                        "event data is nested more than {MAX_EVENT_DATA_DEPTH} levels deep \
                         (arrays and objects); no session view could read it back"
                    )));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

pub(super) fn validate_event(event: &NewEvent<'_>) -> Result<()> {
    if event.event_type.is_empty() || event.event_type.len() > MAX_TYPE_BYTES {
        return Err(Error::invalid(format!(
            "event type must be 1 to {MAX_TYPE_BYTES} bytes"
        )));
    }
    if event.data.len() > MAX_EVENT_DATA_BYTES {
        return Err(Error::TooLarge {
            what: "event data",
            unit: "bytes",
            size: event.data.len() as u64,
            limit: MAX_EVENT_DATA_BYTES as u64,
        });
    }
    serde_json::from_str::<&serde_json::value::RawValue>(event.data)
        .map_err(|error| Error::invalid(format!("event data is not valid JSON: {error}")))?;
    check_data_depth(event.data)?;
    if event.flags & !KNOWN_EVENT_FLAGS != 0 {
        return Err(Error::invalid(format!(
            "unknown event flags {:#x}",
            event.flags
        )));
    }
    if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        object_keys(event.envelope).map_err(|error| {
            Error::invalid(format!("verbatim line is not a JSON object: {error}"))
        })?;
        return Ok(());
    }
    if event.envelope.is_empty() {
        return Ok(());
    }
    let keys = object_keys(&format!("{{{}}}", event.envelope))
        .map_err(|error| Error::invalid(format!("event envelope is not JSON members: {error}")))?;
    if let Some(key) = keys
        .iter()
        .find(|key| !OPTIONAL_ENVELOPE_KEYS.contains(&key.as_str()))
    {
        return Err(Error::invalid(format!(
            "event envelope key {key:?} is not allowed"
        )));
    }
    Ok(())
}
