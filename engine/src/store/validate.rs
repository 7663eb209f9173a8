//! Validation of a session header and of an event before anything is encoded.

use super::{NewEvent, MAX_EVENT_DATA_BYTES, MAX_HEADER_BYTES, MAX_TYPE_BYTES};
use crate::error::{Error, Result};
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
    header_id(header_json.as_bytes()).map_err(Error::invalid)
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
    if event.flags & !KNOWN_EVENT_FLAGS != 0 {
        return Err(Error::invalid(format!(
            "unknown event flags {:#x}",
            event.flags
        )));
    }
    if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(event.envelope)
            .map_err(|error| {
                Error::invalid(format!("verbatim line is not a JSON object: {error}"))
            })?;
        return Ok(());
    }
    if event.envelope.is_empty() {
        return Ok(());
    }
    let members: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&format!("{{{}}}", event.envelope)).map_err(|error| {
            Error::invalid(format!("event envelope is not JSON members: {error}"))
        })?;
    if let Some(key) = members
        .keys()
        .find(|key| !OPTIONAL_ENVELOPE_KEYS.contains(&key.as_str()))
    {
        return Err(Error::invalid(format!(
            "event envelope key {key:?} is not allowed"
        )));
    }
    Ok(())
}
