//! Rendering of a DSH JSONL event line from its parts (pure).

use std::fmt::Write as _;

/// Appends the DSH JSONL line of an event (without the newline) to `line`:
/// `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`, where `data` and `envelope` are
/// exact JSON texts (the envelope's members, comma-separated, possibly empty).
pub fn push_event_line(
    line: &mut String,
    event_type: &str,
    seq: u64,
    time: i64,
    data: &str,
    envelope: &str,
) {
    line.push_str("{\"type\":");
    let plain = |byte: u8| byte >= 0x20 && byte != b'"' && byte != b'\\';
    if event_type.bytes().all(plain) {
        // The common case (`assistant/chunk`): nothing to escape, no serializer needed.
        line.push('"');
        line.push_str(event_type);
        line.push('"');
    } else {
        line.push_str(&serde_json::Value::String(event_type.to_string()).to_string());
    }
    // Writing to a String cannot fail.
    let _ = write!(line, ",\"seq\":{seq},\"time\":{time},\"data\":");
    line.push_str(data);
    if !envelope.is_empty() {
        line.push(',');
        line.push_str(envelope);
    }
    line.push('}');
}
