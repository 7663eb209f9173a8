//! Exchange with DeepSeek Harness session files (`session.jsonl`, `session.jsonl.zstd`, DSH's
//! SQLite with the `sqlite` feature) and dshdb's canonical JSON: DSH files in and out only.
//! May import `spill`, `store`, `storage`, `session` and `error`; the cold-resume projections
//! above it live in `derive`.
//!
//! Import keeps every byte: an event line whose re-rendering by [`Event::to_json_line`]
//! would differ is stored verbatim ([`EVENT_FLAG_VERBATIM_LINE`]); a packed chunk row is
//! expanded into its `assistant/chunk` members (flagged [`EVENT_FLAG_ROW_START`] /
//! [`EVENT_FLAG_ROW_MEMBER`]) and its original line kept ([`EVENT_FLAG_ROW_VERBATIM`]) when
//! re-packing would differ. Export is therefore byte-identical to the imported plaintext,
//! minus the discardable tail DSH itself drops (reported in [`ImportReport`]).
//!
//! A line the store cannot hold as text (invalid UTF-8, or JSON that the store's verbatim
//! check rejects, such as lone surrogate escapes) is kept verbatim as a hex envelope
//! `{"dshdb:hex":"…"}`; an original line that itself starts that way is hex-encoded too, so
//! decoding is unambiguous.

// Format code: a value that does not fit its field is a typed error, never a silent `as`
// narrowing (the lossless widenings live in `storage::coding`). Unit tests may index their
// own buffers with `as`.
#![cfg_attr(
    not(test),
    deny(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )
)]

mod bounded;
pub mod canonical;
mod dsh_lines;
pub mod layout;
mod parts;
mod row_line;
pub(crate) mod scan;
pub mod spill_lines;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod streaming;
mod zstd_codec;

use crate::session::json::{object_keys, object_members, string_text};
use crate::session::{restore_session, SessionError, SessionEvent};
use crate::storage::frame::{
    EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START, EVENT_FLAG_ROW_VERBATIM,
    EVENT_FLAG_VERBATIM_LINE,
};
use crate::store::{now_millis, Event, NewEvent, ParsedEvent, Store};
use scan::{pack_row, Record, Scanned};
use serde_json::value::RawValue;

pub use bounded::{
    ImportLimits, IMPORT_LINE_ENVELOPE_BYTES, MAX_IMPORT_LINE_BYTES, MAX_IMPORT_PLAINTEXT_BYTES,
};
pub use canonical::{
    export_canonical, import_canonical, import_canonical_with_progress, is_canonical,
    write_canonical, CanonicalError, CanonicalImport, CANONICAL_FORMAT, CANONICAL_VERSION,
};
pub use dsh_lines::{visit_dsh_lines, DshLine};
pub use zstd_codec::{
    export_dsh_jsonl_zstd, import_dsh_jsonl_zstd, import_dsh_jsonl_zstd_limited,
    write_dsh_jsonl_zstd, ZSTD_MAGIC,
};

use crate::limits::IMPORT_BATCH_BYTES;
use crate::storage::coding::widen;
/// Prefix of a hex-encoded verbatim envelope.
pub(crate) const HEX_PREFIX: &str = "{\"dshdb:hex\":\"";

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// DSH refuses the log; the text is DSH's (scan, header or zstd framing refusals).
    #[error("{0}")]
    Refused(String),
    /// DSH's session model refuses the log on cold load; the text is DSH's.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::Error),
    /// A stored event cannot be exported as DSH JSONL.
    #[error("session {session}: event at seq {seq} cannot be exported: {reason}")]
    Unexportable {
        session: String,
        seq: u64,
        reason: String,
    },
    /// Zstandard compression failed.
    #[error("zstd compression failed: {0}")]
    Compress(String),
    /// The input exceeds an import bound ([`ImportLimits`]); nothing was written.
    #[error("{reason}")]
    TooLarge { reason: String },
    /// A visitor ended the walk early on purpose (e.g. its reader went away); not a failure
    /// of the store.
    #[error("the walk was stopped by its visitor")]
    Stopped,
}

pub type Result<T, E = ExchangeError> = std::result::Result<T, E>;

/// Bytes at the end of the input that DSH treats as a discardable tail and that were not imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedTail {
    /// Offset of the tail in the (decompressed) plaintext.
    pub offset: u64,
    pub bytes: u64,
    pub reason: String,
    /// The torn final zstd frame the tail ends in, if any.
    pub torn_frame: Option<TornFrame>,
}

/// A torn final zstd frame: where it starts in the file, how long it is there, and how much
/// plaintext its complete blocks gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornFrame {
    pub file_offset: u64,
    pub file_bytes: u64,
    pub recovered_bytes: u64,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub session_id: String,
    /// Events stored (packed rows count their members).
    pub events: u64,
    /// Record lines imported (after the header).
    pub lines: u64,
    /// Packed chunk rows expanded.
    pub rows: u64,
    /// Lines (or rows) kept verbatim because re-rendering would differ.
    pub verbatim: u64,
    /// Zstd frames read (0 for plain JSONL).
    pub frames: u64,
    pub dropped: Option<DroppedTail>,
}

/// Imports a DSH `session.jsonl` (its bytes). Validates like DSH's cold load first; on a
/// refusal nothing is written.
pub fn import_dsh_jsonl(store: &Store, bytes: &[u8]) -> Result<ImportReport> {
    import_dsh_jsonl_limited(store, bytes, &ImportLimits::default())
}

/// [`import_dsh_jsonl`] under explicit bounds: a line or a log past `limits` is refused
/// ([`ExchangeError::TooLarge`]) before anything is parsed or written.
pub fn import_dsh_jsonl_limited(
    store: &Store,
    bytes: &[u8],
    limits: &ImportLimits,
) -> Result<ImportReport> {
    bounded::LineGuard::new(*limits).feed(bytes)?;
    let scanned = scan::scan(bytes)?;
    import_scanned(store, &scanned, &[], 0)
}

/// Stores a scanned log. Lines starting at an offset in `batch_starts` (sorted) start a
/// recorded batch.
fn import_scanned(
    store: &Store,
    scanned: &Scanned<'_>,
    batch_starts: &[usize],
    frames: u64,
) -> Result<ImportReport> {
    let events = scanned.events();
    restore_session(&scanned.session_id, &events, now_millis())?;
    let mut report = ImportReport {
        session_id: scanned.session_id.clone(),
        events: events.len() as u64,
        lines: scanned.lines.len() as u64,
        rows: 0,
        verbatim: 0,
        frames,
        dropped: scanned.dropped.clone(),
    };
    let mut owned: Vec<OwnedEvent> = Vec::with_capacity(events.len());
    for line in &scanned.lines {
        let batch_flag = if batch_starts.binary_search(&line.offset).is_ok() {
            EVENT_FLAG_BATCH_START
        } else {
            0
        };
        owned.extend(stored_line(
            line.raw,
            line.record.clone(),
            batch_flag,
            &mut report,
        ));
    }
    let batches = batch_ranges(
        owned
            .iter()
            .map(|event| (event.stored_bytes(), event.flags)),
    );
    // The header travels with the first batch, so a log that fits one batch (all but the
    // largest) is imported atomically.
    let as_new = |range: std::ops::Range<usize>| -> Vec<NewEvent<'_>> {
        owned[range].iter().map(OwnedEvent::as_new).collect()
    };
    let mut ranges = batches.into_iter();
    let first = ranges.next().map(as_new).unwrap_or_default();
    let mut writer = store.create_session_with_events(scanned.header, &first)?;
    for range in ranges {
        writer.append_batch(&as_new(range))?;
    }
    Ok(report)
}

/// How one committed line of a DSH log is stored: its event (split into fields when that
/// re-renders exactly, else verbatim), or a packed row's members (the row's line kept
/// verbatim when re-packing would differ). `batch_flag` goes on the first event. Counts
/// rows and verbatim lines in `report`.
pub(crate) fn stored_line(
    raw: &[u8],
    record: Record,
    batch_flag: u8,
    report: &mut ImportReport,
) -> Vec<OwnedEvent> {
    match record {
        Record::Event(event) => {
            let mut stored = plain_event(&event, raw);
            if stored.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
                report.verbatim += 1;
            }
            stored.flags |= batch_flag;
            vec![stored]
        }
        Record::Row { members } => {
            report.rows += 1;
            let triples: Vec<(u64, i64, &str)> = members
                .iter()
                .map(|event| (event.seq, event.time, event.data.get()))
                .collect();
            let repacked = pack_row(&triples);
            let exact = repacked.as_deref() == Some(raw);
            let mut stored_members = Vec::with_capacity(members.len());
            // The members' texts move into the stored events: nothing is copied per member.
            for (position, event) in members.into_iter().enumerate() {
                let mut stored = OwnedEvent {
                    event_type: event.event_type,
                    time: event.time,
                    data: event.data,
                    envelope: String::new(),
                    flags: EVENT_FLAG_ROW_MEMBER,
                };
                if position == 0 {
                    stored.flags = EVENT_FLAG_ROW_START | batch_flag;
                    if !exact {
                        report.verbatim += 1;
                        // The store checks a non-verbatim envelope as event members, so
                        // the row line travels as a verbatim envelope.
                        stored.flags |= EVENT_FLAG_ROW_VERBATIM | EVENT_FLAG_VERBATIM_LINE;
                        stored.envelope = verbatim_envelope(raw);
                    }
                }
                stored_members.push(stored);
            }
            stored_members
        }
    }
}

/// Splits events (given as stored size in bytes and flags) into import batches of about
/// [`IMPORT_BATCH_BYTES`], never splitting a packed row.
pub(crate) fn batch_ranges(
    events: impl ExactSizeIterator<Item = (usize, u8)>,
) -> Vec<std::ops::Range<usize>> {
    let events: Vec<(usize, u8)> = events.collect();
    let mut batches = Vec::new();
    let mut start = 0;
    while start < events.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < events.len() && (end == start || bytes < IMPORT_BATCH_BYTES) {
            // Per-event framing overhead, roughly.
            bytes += events[end].0 + 64;
            end += 1;
        }
        while end < events.len() && events[end].1 & EVENT_FLAG_ROW_MEMBER != 0 {
            end += 1;
        }
        batches.push(start..end);
        start = end;
    }
    batches
}

pub(crate) struct OwnedEvent {
    event_type: String,
    time: i64,
    /// Parsed when the line was read: the store need not parse it again
    /// ([`OwnedEvent::as_parsed`]).
    data: Box<RawValue>,
    envelope: String,
    pub(crate) flags: u8,
}

impl OwnedEvent {
    /// Bytes the event stores, about (its payload and envelope).
    pub(crate) fn stored_bytes(&self) -> usize {
        self.data.get().len() + self.envelope.len()
    }

    pub(crate) fn as_new(&self) -> NewEvent<'_> {
        NewEvent {
            event_type: &self.event_type,
            time: Some(self.time),
            data: self.data.get(),
            envelope: &self.envelope,
            flags: self.flags,
        }
    }

    pub(crate) fn as_parsed(&self) -> ParsedEvent<'_> {
        ParsedEvent::new(
            &self.event_type,
            self.time,
            &self.data,
            &self.envelope,
            self.flags,
        )
    }
}

/// The envelope members of a line other than `type`/`seq`/`time`/`data`, as their exact text.
fn envelope_members(line: &str) -> Option<String> {
    let members = object_members(line)?;
    let parts: Vec<String> = members
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "type" | "seq" | "time" | "data"))
        .map(|(key, value)| format!("{}:{}", string_text(key), value.get()))
        .collect();
    Some(parts.join(","))
}

/// The envelope of a line in DSH's own layout, `{"type":..,"seq":..,"time":..,"data":..,<rest>}`,
/// read off the text without parsing `data` again; `None` when the line is laid out otherwise
/// or the rest repeats an event field. [`plain_event`] still checks that the event re-renders
/// to the exact line.
fn canonical_envelope(event: &SessionEvent, line: &str) -> Option<String> {
    let head = Event {
        seq: event.seq,
        time: event.time,
        event_type: event.event_type.clone(),
        data: String::new(),
        envelope: String::new(),
        flags: 0,
    }
    .to_json_line();
    // `head` ends with `"data":}`: drop the brace, then the data text follows.
    let prefix = head.strip_suffix('}')?;
    let rest = line.strip_prefix(prefix)?.strip_prefix(event.data.get())?;
    let members = rest.strip_suffix('}')?;
    if members.is_empty() {
        return Some(String::new());
    }
    let members = members.strip_prefix(',')?;
    let keys = object_keys(&format!("{{{members}}}")).ok()?;
    let repeats_event_field = keys
        .iter()
        .any(|key| matches!(key.as_str(), "type" | "seq" | "time" | "data"));
    (!repeats_event_field).then(|| members.to_owned())
}

/// How an event line is stored: split into fields when that re-renders exactly, else verbatim.
pub(crate) fn plain_event(event: &SessionEvent, raw: &[u8]) -> OwnedEvent {
    let line = std::str::from_utf8(raw).ok();
    // A line in DSH's own layout is the event re-rendered, by construction: it is the
    // rendered head, `data` and the envelope members whose keys `canonical_envelope` read,
    // which is all the check below would make again (and, for a long `sourceEventSeqs`,
    // reading the keys costs as much as the rest of the line).
    if let Some(envelope) = line.and_then(|line| canonical_envelope(event, line)) {
        return OwnedEvent {
            event_type: event.event_type.clone(),
            time: event.time,
            data: event.data.clone(),
            envelope,
            flags: 0,
        };
    }
    if let Some(envelope) = line.and_then(envelope_members) {
        let candidate = Event {
            seq: event.seq,
            time: event.time,
            event_type: event.event_type.clone(),
            data: event.data.get().to_owned(),
            envelope,
            flags: 0,
        };
        let envelope_ok = candidate.envelope.is_empty()
            || object_keys(&format!("{{{}}}", candidate.envelope)).is_ok();
        if envelope_ok && candidate.to_json_line().as_bytes() == raw {
            return OwnedEvent {
                event_type: candidate.event_type,
                time: candidate.time,
                data: event.data.clone(),
                envelope: candidate.envelope,
                flags: 0,
            };
        }
    }
    OwnedEvent {
        event_type: event.event_type.clone(),
        time: event.time,
        data: event.data.clone(),
        envelope: verbatim_envelope(raw),
        flags: EVENT_FLAG_VERBATIM_LINE,
    }
}

/// The original line as a verbatim envelope: the text itself, or a hex wrapper (module doc).
fn verbatim_envelope(raw: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(raw) {
        if !text.starts_with(HEX_PREFIX) && object_keys(text).is_ok() {
            return text.to_owned();
        }
    }
    hex_verbatim_envelope(raw)
}

/// The original line as a hex-wrapped verbatim envelope (`{"dshdb:hex":"…"}`), whatever it
/// holds: the form for bytes that are no JSON object, or that a writer wants kept exactly.
pub fn hex_verbatim_envelope(raw: &[u8]) -> String {
    let mut hex = String::with_capacity(HEX_PREFIX.len() + raw.len() * 2 + 2);
    hex.push_str(HEX_PREFIX);
    for byte in raw {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex.push_str("\"}");
    hex
}

/// The original line bytes of a verbatim envelope (`None`: a malformed hex wrapper).
pub fn verbatim_bytes(envelope: &str) -> Option<Vec<u8>> {
    let Some(hex) = envelope
        .strip_prefix(HEX_PREFIX)
        .and_then(|rest| rest.strip_suffix("\"}"))
    else {
        return Some(envelope.as_bytes().to_vec());
    };
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
        .collect()
}

/// The DSH header line of a stored session: the stored header when it is one (imported),
/// otherwise DSH's `toHeaderLine` layout synthesized from it.
fn header_line(header_json: &str) -> String {
    let members = object_members(header_json).unwrap_or_default();
    let raw = |key: &str| {
        members
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.get())
    };
    if raw("type") == Some("\"session\"") {
        return header_json.to_owned();
    }
    let mut line = String::from("{\"type\":\"session\"");
    for key in [
        "version",
        "id",
        "createdAt",
        "cwd",
        "parentSession",
        "seedLength",
        "origin",
        "delegationDepth",
        "agentPreset",
    ] {
        let value = match (key, raw(key)) {
            ("delegationDepth", None) => Some("0"),
            (_, value) => value,
        };
        if let Some(value) = value {
            line.push_str(&format!(",\"{key}\":{value}"));
        }
    }
    line.push('}');
    line
}

fn unexportable(session: &str, seq: u64, reason: &str) -> ExchangeError {
    ExchangeError::Unexportable {
        session: session.to_owned(),
        seq,
        reason: reason.to_owned(),
    }
}

/// The DSH line of a packed row: its start event (flagged [`EVENT_FLAG_ROW_START`]) and the
/// member events after it.
pub(crate) fn row_line(session: &str, row: &[Event]) -> Result<Vec<u8>> {
    let Some(start) = row.first() else {
        return Ok(Vec::new());
    };
    if start.flags & EVENT_FLAG_ROW_VERBATIM != 0 {
        return verbatim_bytes(&start.envelope)
            .ok_or_else(|| unexportable(session, start.seq, "damaged verbatim row"));
    }
    let members: Vec<(u64, i64, &str)> = row
        .iter()
        .map(|member| (member.seq, member.time, member.data.as_str()))
        .collect();
    pack_row(&members).ok_or_else(|| unexportable(session, start.seq, "row members do not pack"))
}

/// The DSH line of a stored event that does not start a packed row.
pub(crate) fn event_line(session: &str, event: &Event) -> Result<Vec<u8>> {
    if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
        return verbatim_bytes(&event.envelope)
            .ok_or_else(|| unexportable(session, event.seq, "damaged verbatim line"));
    }
    Ok(event.to_json_line().into_bytes())
}

/// Exports a session as DSH `session.jsonl` bytes (byte-identical to an imported file).
pub fn export_dsh_jsonl(store: &Store, id: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_dsh_jsonl(store, id, &mut out)?;
    Ok(out)
}

/// Writes a session as DSH `session.jsonl` to `out`, streamed: memory stays bounded by one
/// packed row whatever the session's size. Returns the bytes written.
pub fn write_dsh_jsonl(store: &Store, id: &str, out: &mut impl std::io::Write) -> Result<u64> {
    write_dsh_jsonl_with(store, id, None, out)
}

/// [`write_dsh_jsonl`] rendered by `workers` threads in parts of `part_events` seqs,
/// whatever the session's size (the export takes this way on its own for large sessions
/// on several cores): for tests that cut sessions at every seq.
#[doc(hidden)]
pub fn write_dsh_jsonl_in_parts(
    store: &Store,
    id: &str,
    part_events: u64,
    workers: usize,
    out: &mut impl std::io::Write,
) -> Result<u64> {
    write_dsh_jsonl_with(store, id, Some((part_events, workers.max(1))), out)
}

/// The header line, then the lines: in parts of `(part_events, workers)` when given, else
/// in parts when the session is large enough on a machine with several cores
/// ([`parts::export_workers`]), else in one walk on this thread.
fn write_dsh_jsonl_with(
    store: &Store,
    id: &str,
    parts_plan: Option<(u64, usize)>,
    out: &mut impl std::io::Write,
) -> Result<u64> {
    let summary = store.session(id)?;
    let write_error = |source| crate::Error::io("export write", source);
    let header = header_line(&summary.header_json);
    out.write_all(header.as_bytes()).map_err(write_error)?;
    out.write_all(b"\n").map_err(write_error)?;
    let mut written = widen(header.len()) + 1;
    let parts_plan = parts_plan.or_else(|| {
        parts::export_workers(summary.events).map(|workers| (parts::EXPORT_PART_EVENTS, workers))
    });
    if let Some((part_events, workers)) = parts_plan {
        let plan = (summary.events, part_events);
        let lines = parts::write_lines_in_parts(store, id, plan, workers, out)?;
        return Ok(written + lines);
    }
    visit_dsh_lines(store, id, 0, summary.events, |line| {
        out.write_all(line.bytes).map_err(write_error)?;
        out.write_all(b"\n").map_err(write_error)?;
        written += widen(line.bytes.len()) + 1;
        Ok(())
    })?;
    Ok(written)
}

/// The stored events as DSH's session model sees them (decoded from the exported lines).
pub fn session_events(store: &Store, id: &str) -> Result<Vec<SessionEvent>> {
    let summary = store.session(id)?;
    let mut events = Vec::new();
    let mut number = 0;
    visit_dsh_lines(store, id, 0, summary.events, |line| {
        number += 1;
        let record = scan::decode_record(line.bytes).map_err(|()| {
            ExchangeError::Refused(format!(
                "corrupt session log: unparsable committed event at line {number}"
            ))
        })?;
        match record {
            Record::Event(event) => events.push(event),
            Record::Row { members, .. } => events.extend(members),
        }
        Ok(())
    })?;
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::parse_event_line;

    fn rendered(stored: &OwnedEvent, seq: u64) -> String {
        let new = stored.as_new();
        Event {
            seq,
            time: stored.time,
            event_type: new.event_type.to_owned(),
            data: new.data.to_owned(),
            envelope: new.envelope.to_owned(),
            flags: stored.flags,
        }
        .to_json_line()
    }

    /// Lines in DSH's layout are split into fields (no verbatim copy) and re-render
    /// exactly; lines laid out otherwise re-render exactly too, split or verbatim.
    #[test]
    fn a_plain_event_re_renders_its_line_exactly() {
        let canonical = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"assistant/message","seq":3,"time":-5,"data":{"a":[1,2]},"sourceEventSeqs":[1,2],"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":7,"time":9,"data":{"text":"x"},"surfaceOp":"append"}"#,
        ];
        let other_layouts = [
            r#"{"seq":0,"type":"turn/start","time":1,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1} ,"surfaceOp":"append"}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"seq":0}"#,
        ];
        for (line, must_split) in canonical
            .iter()
            .map(|line| (line, true))
            .chain(other_layouts.iter().map(|line| (line, false)))
        {
            let event = match parse_event_line(line) {
                Ok(event) => event,
                // A line of another layout may be no event at all; DSH's own layout must be.
                Err(error) => {
                    assert!(!must_split, "{line}: {error}");
                    continue;
                }
            };
            let stored = plain_event(&event, line.as_bytes());
            if must_split {
                assert_eq!(stored.flags, 0, "{line}");
            }
            assert_eq!(rendered(&stored, event.seq), *line, "{line}");
        }
    }
}
