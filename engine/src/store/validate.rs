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
/// strings count). Every staged event passes here, and most of an agent log's bytes are
/// inside strings (chunk texts), so a string is crossed with `memchr` jumps from one quote
/// or backslash to the next rather than byte by byte.
pub fn check_data_depth(data: &str) -> Result<()> {
    let bytes = data.as_bytes();
    let mut depth = 0usize;
    let mut position = 0;
    while let Some(&byte) = bytes.get(position) {
        position += 1;
        match byte {
            b'"' => position = after_string(bytes, position),
            b'[' | b'{' => {
                depth += 1;
                check_depth(depth)?;
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Refuses `data` nesting arrays and objects `depth` deep, past [`MAX_EVENT_DATA_DEPTH`].
fn check_depth(depth: usize) -> Result<()> {
    if depth > MAX_EVENT_DATA_DEPTH {
        return Err(Error::invalid(format!(
            "event data is nested more than {MAX_EVENT_DATA_DEPTH} levels deep \
             (arrays and objects); no session view could read it back"
        )));
    }
    Ok(())
}

/// The offset just past the closing quote of the string whose text starts at `start` (after
/// its opening quote), or the length of `bytes` when the string is not closed. A backslash
/// escapes the byte after it, whatever that byte is.
fn after_string(bytes: &[u8], start: usize) -> usize {
    let mut position = start;
    while let Some(found) = bytes
        .get(position..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        position += found;
        if bytes[position] == b'"' {
            return position + 1;
        }
        position += 2;
    }
    bytes.len()
}

pub(super) fn validate_event(event: &NewEvent<'_>) -> Result<()> {
    check_type_and_size(event)?;
    serde_json::from_str::<&serde_json::value::RawValue>(event.data)
        .map_err(|error| Error::invalid(format!("event data is not valid JSON: {error}")))?;
    check_parsed_event(event)
}

/// [`validate_event`] of an event whose `data` is the text of a parsed JSON value
/// ([`super::ParsedEvent`]): every check but parsing `data` again, and with its nesting
/// `depth` taken as given when its builder knows it.
pub(super) fn validate_parsed_event(event: &NewEvent<'_>, depth: Option<usize>) -> Result<()> {
    check_type_and_size(event)?;
    match depth {
        Some(depth) => check_depth(depth)?,
        None => check_data_depth(event.data)?,
    }
    check_flags_and_envelope(event)
}

fn check_type_and_size(event: &NewEvent<'_>) -> Result<()> {
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
    Ok(())
}

/// The checks after `data` is known to be one JSON value: its depth, the flags, the envelope.
fn check_parsed_event(event: &NewEvent<'_>) -> Result<()> {
    check_data_depth(event.data)?;
    check_flags_and_envelope(event)
}

/// The flags and the envelope of an event.
fn check_flags_and_envelope(event: &NewEvent<'_>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-at-a-time scan [`check_data_depth`] replaced: the deepest bracket nesting
    /// outside strings.
    fn deepest_byte_by_byte(data: &str) -> usize {
        let (mut depth, mut deepest) = (0usize, 0usize);
        let (mut in_string, mut escaped) = (false, false);
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
                    deepest = deepest.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        deepest
    }

    fn nested(depth: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn the_depth_check_agrees_with_a_byte_by_byte_scan() {
        let limit = MAX_EVENT_DATA_DEPTH;
        let inners = [
            "0",
            r#""[[[[""#,
            r#""a\"[[[""#,
            r#""\\""#,
            r#""\\",[[{}]]"#,
            r#""unclosed [[["#,
            r#""ends in a backslash \"#,
            r#"{"k":"v\u005b","l":[["]]"]]}"#,
            "\"",
        ];
        for inner in inners {
            for depth in [0, 1, limit - 2, limit - 1, limit, limit + 1] {
                let data = nested(depth, inner);
                let refused = check_data_depth(&data).is_err();
                assert_eq!(
                    refused,
                    deepest_byte_by_byte(&data) > limit,
                    "depth {depth}, inner {inner}"
                );
            }
        }
    }

    #[test]
    fn brackets_inside_strings_do_not_count_and_outside_they_do() {
        let deep_text = format!("\"{}\"", "[".repeat(MAX_EVENT_DATA_DEPTH + 5));
        assert!(check_data_depth(&deep_text).is_ok());
        let too_deep = nested(MAX_EVENT_DATA_DEPTH + 1, "0");
        assert!(check_data_depth(&too_deep).is_err());
        assert!(check_data_depth(&nested(MAX_EVENT_DATA_DEPTH, "0")).is_ok());
    }
}
