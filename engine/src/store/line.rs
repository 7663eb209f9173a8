//! An event's DSH JSONL line as the store renders it.

use crate::session::line::push_event_line;
use crate::storage::frame::EVENT_FLAG_VERBATIM_LINE;

/// Appends an event's DSH JSONL line (without the newline) to `line`: the verbatim line when
/// it was stored so, else `{"type":..,"seq":..,"time":..,"data":..,<envelope>}`.
pub(super) fn push_json_line(
    line: &mut String,
    event_type: &str,
    seq: u64,
    time: i64,
    data: &str,
    envelope: &str,
    flags: u8,
) {
    if flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        line.push_str(envelope);
        return;
    }
    push_event_line(line, event_type, seq, time, data, envelope);
}
