//! DSH's JSONL scan (persistence §2.3–2.5, §5.2): the header line, storage records (plain
//! events and packed chunk rows) and the committed-region / discardable-tail rule.

use super::{DroppedTail, ExchangeError};
use crate::session::event::parse_event_members;
use crate::session::json::{
    js_safe_integer, object_members_as_written, object_members_borrowed, resolve_duplicates,
    value_lossy,
};
use crate::session::plain_json::{split_plain_string, MAX_CANONICAL_INTEGER_BYTES};
use crate::session::{parse_event_line, SessionEvent};
use serde_json::value::RawValue;
use serde_json::Value;

/// The three packed chunk row tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowTag {
    Text,
    Reasoning,
    ToolCall,
}

impl RowTag {
    pub(crate) fn from_tag(tag: &str) -> Option<RowTag> {
        match tag {
            "text-chunks" => Some(RowTag::Text),
            "reasoning-chunks" => Some(RowTag::Reasoning),
            "tool-call-chunks" => Some(RowTag::ToolCall),
            _ => None,
        }
    }

    pub(crate) fn from_chunk_type(chunk_type: &str) -> Option<RowTag> {
        match chunk_type {
            "text-delta" => Some(RowTag::Text),
            "reasoning-delta" => Some(RowTag::Reasoning),
            "tool-call-delta" => Some(RowTag::ToolCall),
            _ => None,
        }
    }

    /// Every row tag.
    pub(crate) const ALL: [RowTag; 3] = [RowTag::Text, RowTag::Reasoning, RowTag::ToolCall];

    pub(crate) fn tag(self) -> &'static str {
        match self {
            RowTag::Text => "text-chunks",
            RowTag::Reasoning => "reasoning-chunks",
            RowTag::ToolCall => "tool-call-chunks",
        }
    }

    fn chunk_type(self) -> &'static str {
        match self {
            RowTag::Text => "text-delta",
            RowTag::Reasoning => "reasoning-delta",
            RowTag::ToolCall => "tool-call-delta",
        }
    }
}

/// One decoded storage record.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    Event(SessionEvent),
    /// A packed row: its members as events.
    Row {
        members: Vec<SessionEvent>,
    },
}

impl Record {
    pub(crate) fn events(&self) -> &[SessionEvent] {
        match self {
            Record::Event(event) => std::slice::from_ref(event),
            Record::Row { members, .. } => members,
        }
    }
}

/// A committed line of the log.
#[derive(Debug)]
pub(crate) struct ScannedLine<'a> {
    /// Byte offset of the line in the scanned plaintext.
    pub offset: usize,
    /// The line without its `\n`.
    pub raw: &'a [u8],
    pub record: Record,
}

/// The committed content of a DSH JSONL plaintext.
#[derive(Debug)]
pub(crate) struct Scanned<'a> {
    /// The header line text, without its `\n`.
    pub header: &'a str,
    pub session_id: String,
    pub lines: Vec<ScannedLine<'a>>,
    /// Bytes up to and including the last committed line's `\n`.
    pub committed: usize,
    pub dropped: Option<DroppedTail>,
}

impl Scanned<'_> {
    pub(crate) fn events(&self) -> Vec<SessionEvent> {
        self.lines
            .iter()
            .flat_map(|line| line.record.events().iter().cloned())
            .collect()
    }
}

fn corrupt(text: impl Into<String>) -> ExchangeError {
    ExchangeError::Refused(text.into())
}

/// Parses and checks the header line (persistence §2.3, §2.9); returns the session id.
pub(crate) fn check_header(line: &str) -> Result<String, ExchangeError> {
    let header = value_lossy(line)
        .map_err(|_| corrupt("corrupt session log: header line is not valid JSON"))?;
    if let Some(object) = header.as_object() {
        if let Some(version) = object.get("version").filter(|version| version.is_number()) {
            let number = version.as_f64().unwrap_or(f64::NAN);
            if number != 0.0 {
                let id = match object.get("id") {
                    Some(Value::String(id)) => id.clone(),
                    Some(other) => other.to_string(),
                    None => "undefined".to_owned(),
                };
                return Err(ExchangeError::Refused(if number > 0.0 {
                    format!("session \"{id}\" uses log format v{version}, but this harness reads only v0: the log was written by a newer harness — upgrade the harness to open it")
                } else {
                    format!("session \"{id}\" uses log format v{version}, but this harness reads only v0")
                }));
            }
        }
    }
    let non_negative = |key: &str| {
        header
            .get(key)
            .and_then(|value| js_safe_integer(&value.to_string()))
            .is_some_and(|value| value >= 0)
    };
    let valid = header.get("type") == Some(&Value::from("session"))
        && header.get("version").is_some_and(Value::is_number)
        && non_negative("createdAt")
        && non_negative("delegationDepth")
        && header
            .get("origin")
            .is_none_or(|origin| origin == "subagent")
        && header.get("agentPreset").is_none_or(Value::is_string);
    let id = header
        .get("id")
        .and_then(Value::as_str)
        .filter(|_| valid)
        .ok_or_else(|| corrupt("corrupt session log: first line is not a session header"))?;
    if header.get("sandboxMode").is_some() || header.get("approvalPolicy").is_some() {
        return Err(corrupt(
            "session header uses retired policy baseline fields",
        ));
    }
    Ok(id.to_owned())
}

/// `SessionLogScanner` over a whole plaintext (persistence §5.2).
pub(crate) fn scan(bytes: &[u8]) -> Result<Scanned<'_>, ExchangeError> {
    let header_end = bytes
        .iter()
        .position(|byte| *byte == b'\n')
        .filter(|end| *end > 0)
        .ok_or_else(|| corrupt("empty or header-less session log"))?;
    let header = std::str::from_utf8(&bytes[..header_end])
        .map_err(|_| corrupt("corrupt session log: header line is not valid UTF-8"))?;
    let session_id = check_header(header)?;
    let mut lines: Vec<ScannedLine<'_>> = Vec::new();
    let mut expected: u64 = 0;
    let mut committed = header_end + 1;
    // The first defect: its text and where the discardable tail starts.
    let mut issue: Option<(String, usize)> = None;
    let mut offset = header_end + 1;
    let mut line_number = 0usize;
    while let Some(length) = bytes[offset..].iter().position(|byte| *byte == b'\n') {
        line_number += 1;
        let raw = &bytes[offset..offset + length];
        let line_start = offset;
        offset += length + 1;
        let decoded = decode_record(raw);
        let has_turn_end = |record: &Record| {
            record
                .events()
                .iter()
                .any(|event| event.event_type == crate::session::TURN_END)
        };
        if let Some((text, _)) = &issue {
            if decoded.as_ref().is_ok_and(has_turn_end) {
                return Err(corrupt(text.clone()));
            }
            continue;
        }
        let Ok(record) = decoded else {
            issue = Some((
                format!("corrupt session log: unparsable committed event at line {line_number}"),
                line_start,
            ));
            continue;
        };
        if let Some((index, bad)) = record
            .events()
            .iter()
            .enumerate()
            .find(|(index, event)| event.seq != expected + *index as u64)
        {
            let gap = format!(
                "corrupt session log: seq gap in committed region at line {line_number} (expected {}, got {})",
                expected + index as u64,
                bad.seq
            );
            if has_turn_end(&record) {
                return Err(corrupt(gap));
            }
            return Ok(Scanned {
                header,
                session_id,
                lines,
                committed,
                dropped: Some(DroppedTail {
                    offset: committed as u64,
                    bytes: (bytes.len() - committed) as u64,
                    reason: gap,
                    torn_frame: None,
                }),
            });
        }
        expected += record.events().len() as u64;
        committed = offset;
        lines.push(ScannedLine {
            offset: line_start,
            raw,
            record,
        });
    }
    let dropped = match issue {
        Some((reason, _)) => Some(reason),
        None if committed < bytes.len() => Some("torn final line (no trailing newline)".to_owned()),
        None => None,
    }
    .map(|reason| DroppedTail {
        offset: committed as u64,
        bytes: (bytes.len() - committed) as u64,
        reason,
        torn_frame: None,
    });
    Ok(Scanned {
        header,
        session_id,
        lines,
        committed,
        dropped,
    })
}

/// `decodeStorageRecord` on one line's bytes (decoded lossily, as DSH's `TextDecoder` does).
/// The top-level `type` member alone, for the fast tag read in [`decode_record`]: a duplicate
/// `type` member, a lone surrogate or any other oddity makes this parse fail and the record is
/// read the slow, lossy way instead, so both ways agree wherever this one succeeds.
#[derive(serde::Deserialize)]
struct TypeTag {
    #[serde(rename = "type")]
    tag: Option<Value>,
}

fn record_tag(text: &str) -> Result<Option<String>, ()> {
    if let Ok(TypeTag { tag }) = serde_json::from_str::<TypeTag>(text) {
        return Ok(tag.and_then(|tag| tag.as_str().map(str::to_owned)));
    }
    let value = value_lossy(text).map_err(|_| ())?;
    Ok(value.get("type").and_then(Value::as_str).map(str::to_owned))
}

pub(crate) fn decode_record(raw: &[u8]) -> Result<Record, ()> {
    // `from_utf8` first: the same text for valid UTF-8, checked several times faster than
    // the lossy decoder checks it.
    let text = match std::str::from_utf8(raw) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(raw),
    };
    if let Some(row) = row_parsed_once(&text) {
        return row;
    }
    if let Some(event) = event_parsed_once(&text) {
        return event;
    }
    decode_generally(&text)
}

/// [`decode_record`] of a line's text without [`row_parsed_once`] or [`event_parsed_once`].
pub(crate) fn decode_generally(text: &str) -> Result<Record, ()> {
    let tag = record_tag(text)?;
    match tag.as_deref().and_then(RowTag::from_tag) {
        Some(tag) => expand_row(tag, text),
        None => parse_event_line(text).map(Record::Event).map_err(|_| ()),
    }
}

/// A line that opens as DSH writes a packed row (`{"type":"text-chunks",` …) decoded with
/// one parse of the line instead of two ([`record_tag`], then the row's members): `None`
/// when that cannot decide, and [`decode_record`] goes the general way. When it decides it
/// agrees with that way: the line parsed as an object, its last `type` member (which both
/// [`record_tag`] and [`object_members_borrowed`] take, a duplicate included) is that row tag, and
/// [`expand_row`] would parse the same members again.
fn row_parsed_once(text: &str) -> Option<Result<Record, ()>> {
    const ROW_OPENING: &str = "{\"type\":\"";
    const ROW_TAGS: [&str; 3] = ["text-chunks", "reasoning-chunks", "tool-call-chunks"];
    let rest = text.strip_prefix(ROW_OPENING)?;
    let opens_as_row = ROW_TAGS.iter().any(|tag| {
        rest.strip_prefix(tag)
            .is_some_and(|after| after.starts_with('"'))
    });
    if !opens_as_row {
        return None;
    }
    let top = object_members_borrowed(text)?;
    let tag_text: String = serde_json::from_str(raw_member(&top, "type")?).ok()?;
    let tag = RowTag::from_tag(&tag_text)?;
    Some(expand_row_members(tag, &top))
}

/// A plain event line decoded with one parse of the line instead of two ([`record_tag`],
/// then [`parse_event_line`]'s): `None` when that cannot decide, and [`decode_record`] goes
/// the general way. It decides only a line that parses as an object with exactly one
/// member whose key reads `type`, that member a string token without escapes or control
/// characters that is no row tag. For such a line [`record_tag`]'s parse succeeds (the
/// same grammar for every other member, which both parses skip the same way, and no
/// duplicate field) and gives that tag, so the general way calls [`parse_event_line`],
/// which reads these same members again.
fn event_parsed_once(text: &str) -> Option<Result<Record, ()>> {
    let every = object_members_as_written(text)?;
    let mut tags = every.iter().filter(|(name, _)| name == "type");
    let (_, tag) = tags.next()?;
    if tags.next().is_some() {
        return None;
    }
    let tag = plain_string_content(tag.get())?;
    if RowTag::from_tag(tag).is_some() {
        return None;
    }
    let members = resolve_duplicates(every);
    Some(
        parse_event_members(&members)
            .map(Record::Event)
            .map_err(|_| ()),
    )
}

/// The content of a string token without escapes or control characters (which every
/// JSON reader reads as that content), or `None`.
fn plain_string_content(token: &str) -> Option<&str> {
    split_plain_string(token)
        .filter(|(_, rest)| rest.is_empty())
        .map(|(content, _)| content)
}

/// An object's members as [`object_members_borrowed`] gives them.
type Members<'text> = [(String, &'text RawValue)];

fn raw_member<'text>(members: &Members<'text>, key: &str) -> Option<&'text str> {
    members
        .iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value.get())
}

fn has_exact_keys(members: &Members<'_>, required: &[&str], optional: &[&str]) -> bool {
    required
        .iter()
        .all(|key| members.iter().any(|(name, _)| name == key))
        && members
            .iter()
            .all(|(name, _)| required.contains(&name.as_str()) || optional.contains(&name.as_str()))
}

fn is_number(text: &str) -> bool {
    value_lossy(text).is_ok_and(|value| value.is_number())
}

fn is_string(text: &str) -> bool {
    text.starts_with('"')
}

fn safe(value: i64) -> Option<i64> {
    (value.unsigned_abs() <= crate::session::json::MAX_SAFE_INTEGER).then_some(value)
}

/// The raw texts of a row's shared fields.
pub(crate) struct RowShape<'t> {
    pub tag: RowTag,
    pub turn: &'t str,
    pub step: &'t str,
    pub index: &'t str,
    pub id: Option<&'t str>,
    pub name: Option<&'t str>,
}

impl RowShape<'_> {
    /// Whether the shared fields have the types the row decoder requires.
    fn fields_decode(&self) -> bool {
        [self.turn, self.step, self.index]
            .into_iter()
            .all(is_number)
            && self.id.is_none_or(is_string)
            && self.name.is_none_or(is_string)
    }

    /// What every member's `data` text starts with, in DSH key order: the data object up to
    /// the chunk's payload key (`"text":` or `"argumentsDelta":`); the payload and
    /// [`MEMBER_DATA_SUFFIX`] follow.
    pub(crate) fn member_prefix(&self) -> String {
        let (id, name) = (self.id.unwrap_or("null"), self.name.unwrap_or(""));
        let mut prefix = String::with_capacity(96 + self.shared_bytes());
        prefix.push_str("{\"turn\":");
        prefix.push_str(self.turn);
        prefix.push_str(",\"step\":");
        prefix.push_str(self.step);
        prefix.push_str(",\"chunk\":{\"type\":\"");
        prefix.push_str(self.tag.chunk_type());
        prefix.push_str("\",\"index\":");
        prefix.push_str(self.index);
        match self.tag {
            RowTag::ToolCall => {
                prefix.push_str(",\"id\":");
                prefix.push_str(id);
                if self.name.is_some() {
                    prefix.push_str(",\"name\":");
                    prefix.push_str(name);
                }
                prefix.push_str(",\"argumentsDelta\":");
            }
            _ => prefix.push_str(",\"text\":"),
        }
        prefix
    }

    /// The packed row line (no newline) in DSH's key order, written into one buffer sized
    /// up front: the import's exactness check builds one per row, so no per-gap or
    /// per-part strings.
    pub(crate) fn row_line(
        &self,
        seq0: u64,
        time0: i64,
        gaps: &[i64],
        payloads: &[&str],
    ) -> Vec<u8> {
        const DIGITS_PER_GAP: usize = 4;
        const FIXED_TEXT_BYTES: usize = 128;
        let payload_bytes: usize = payloads.iter().map(|payload| payload.len() + 1).sum();
        let mut line = Vec::with_capacity(
            FIXED_TEXT_BYTES + payload_bytes + gaps.len() * DIGITS_PER_GAP + self.shared_bytes(),
        );
        self.push_row_head(&mut line, seq0, time0);
        let mut digits = itoa::Buffer::new();
        for (position, gap) in gaps.iter().enumerate() {
            if position > 0 {
                line.push(b',');
            }
            line.extend_from_slice(digits.format(*gap).as_bytes());
        }
        self.push_row_middle(&mut line);
        for (position, payload) in payloads.iter().enumerate() {
            if position > 0 {
                line.push(b',');
            }
            line.extend_from_slice(payload.as_bytes());
        }
        line.extend_from_slice(ROW_LINE_END.as_bytes());
        line
    }

    /// A row line's text before its `dt` entries: `{"type":..,"seq0":..,"time0":..,
    /// "data":{"turn":..,"step":..,"index":..,"dt":[`.
    pub(crate) fn push_row_head(&self, line: &mut Vec<u8>, seq0: u64, time0: i64) {
        let mut digits = itoa::Buffer::new();
        // The tags are plain ASCII names (no escapes).
        line.extend_from_slice(b"{\"type\":\"");
        line.extend_from_slice(self.tag.tag().as_bytes());
        line.extend_from_slice(b"\",\"seq0\":");
        line.extend_from_slice(digits.format(seq0).as_bytes());
        line.extend_from_slice(b",\"time0\":");
        line.extend_from_slice(digits.format(time0).as_bytes());
        line.extend_from_slice(b",\"data\":{\"turn\":");
        line.extend_from_slice(self.turn.as_bytes());
        line.extend_from_slice(b",\"step\":");
        line.extend_from_slice(self.step.as_bytes());
        line.extend_from_slice(b",\"index\":");
        line.extend_from_slice(self.index.as_bytes());
        line.extend_from_slice(b",\"dt\":[");
    }

    /// A row line's text between its `dt` entries and its payloads: `],` the tool call's
    /// `id` and `name`, and the payload key (`"texts":[` or `"args":[`).
    pub(crate) fn push_row_middle(&self, line: &mut Vec<u8>) {
        line.push(b']');
        let payload_key: &[u8] = match self.tag {
            RowTag::ToolCall => {
                line.extend_from_slice(b",\"id\":");
                line.extend_from_slice(self.id.unwrap_or("null").as_bytes());
                if let Some(name) = self.name {
                    line.extend_from_slice(b",\"name\":");
                    line.extend_from_slice(name.as_bytes());
                }
                b",\"args\":["
            }
            _ => b",\"texts\":[",
        };
        line.extend_from_slice(payload_key);
    }

    /// Bytes of the shared fields' raw texts.
    fn shared_bytes(&self) -> usize {
        self.turn.len()
            + self.step.len()
            + self.index.len()
            + self.id.map_or(0, str::len)
            + self.name.map_or(0, str::len)
    }
}

fn expand_row(tag: RowTag, text: &str) -> Result<Record, ()> {
    let top = object_members_borrowed(text).ok_or(())?;
    expand_row_members(tag, &top)
}

/// [`expand_row`] of a line whose members are `top`.
fn expand_row_members(tag: RowTag, top: &Members<'_>) -> Result<Record, ()> {
    if !has_exact_keys(top, &["type", "seq0", "time0", "data"], &[]) {
        return Err(());
    }
    let seq0 = raw_member(top, "seq0")
        .and_then(js_safe_integer)
        .filter(|seq| *seq >= 0)
        .ok_or(())?;
    let time0 = raw_member(top, "time0")
        .and_then(js_safe_integer)
        .ok_or(())?;
    let data = object_members_borrowed(raw_member(top, "data").ok_or(())?).ok_or(())?;
    let (required, optional, payload_key): (&[&str], &[&str], &str) = match tag {
        RowTag::ToolCall => (
            &["turn", "step", "index", "id", "dt", "args"],
            &["name"],
            "args",
        ),
        _ => (&["turn", "step", "index", "dt", "texts"], &[], "texts"),
    };
    if !has_exact_keys(&data, required, optional) {
        return Err(());
    }
    let field = |key: &str| raw_member(&data, key).ok_or(());
    let shape = RowShape {
        tag,
        turn: field("turn")?,
        step: field("step")?,
        index: field("index")?,
        id: raw_member(&data, "id"),
        name: raw_member(&data, "name"),
    };
    if !shape.fields_decode() {
        return Err(());
    }
    // Borrowed from the line: no allocation per member for the arrays' items.
    let payloads: Vec<&RawValue> = serde_json::from_str(field(payload_key)?).map_err(|_| ())?;
    if payloads.is_empty() || !payloads.iter().all(|payload| is_string(payload.get())) {
        return Err(());
    }
    let gaps: Vec<&RawValue> = serde_json::from_str(field("dt")?).map_err(|_| ())?;
    if gaps.len() + 1 != payloads.len() {
        return Err(());
    }
    let prefix = shape.member_prefix();
    let mut members = Vec::with_capacity(payloads.len());
    let mut time = time0;
    for (offset, payload) in payloads.iter().enumerate() {
        if offset > 0 {
            let gap = js_safe_integer(gaps[offset - 1].get()).ok_or(())?;
            time = time.checked_add(gap).and_then(safe).ok_or(())?;
        }
        let seq = i64::try_from(offset)
            .ok()
            .and_then(|offset| seq0.checked_add(offset))
            .and_then(safe)
            .and_then(|seq| u64::try_from(seq).ok())
            .ok_or(())?;
        let data_text = member_data_of(&prefix, payload.get());
        members.push(
            SessionEvent::with_data_text(ROW_MEMBER_TYPE, seq, time, data_text).map_err(|_| ())?,
        );
    }
    Ok(Record::Row { members })
}

/// The type of every event a packed row holds.
pub(crate) const ROW_MEMBER_TYPE: &str = "assistant/chunk";

/// Re-packs stored chunk events `(seq, time, data)` into one row line, or `None` when they
/// do not form a row (different shape, non-chunk data).
///
/// Only the first member is parsed: it gives the row's shape, and every member must then be
/// exactly the text that shape expands a payload into (`member_data`), i.e. the shape's
/// prefix, one JSON string, and `}}`. So a read of a packed log pays a prefix comparison
/// per member, not a parse.
pub(crate) fn pack_row(members: &[(u64, i64, &str)]) -> Option<Vec<u8>> {
    let (first_seq, first_time, first_data) = *members.first()?;
    with_row_shape(first_data, |shape| {
        let prefix = member_prefix(shape)?;
        let mut payloads: Vec<&str> = Vec::with_capacity(members.len());
        let mut gaps = Vec::with_capacity(members.len());
        let mut previous_time = first_time;
        for (position, (_, time, data)) in members.iter().enumerate() {
            payloads.push(row_member_payload(&prefix, data)?);
            if position > 0 {
                gaps.push(row_gap(previous_time, *time)?);
            }
            previous_time = *time;
        }
        Some(shape.row_line(first_seq, first_time, &gaps, &payloads))
    })
}

/// Starts the row line whose first member has `data` `first_data`, seq `seq0` and time
/// `time0`: writes the row's member prefix ([`row_member_prefix`]) into `prefix`, the
/// line's text before its `dt` entries into `head` and the text between them and the
/// payloads into `middle` (all three cleared first). `None` when `first_data` cannot start
/// a row ([`pack_row`] refuses it too). Export renders a row as its members come with this,
/// [`row_member_payload`] and [`row_gap`], never holding the members themselves.
pub(crate) fn start_row_line(
    first_data: &str,
    seq0: u64,
    time0: i64,
    prefix: &mut String,
    head: &mut Vec<u8>,
    middle: &mut Vec<u8>,
) -> Option<()> {
    with_row_shape(first_data, |shape| {
        prefix.clear();
        head.clear();
        middle.clear();
        prefix.push_str(&shape.member_prefix());
        shape.push_row_head(head, seq0, time0);
        shape.push_row_middle(middle);
        Some(())
    })
}

/// The text every member's `data` of a row starting with `first_data` begins with (its
/// payload and `}}` follow), or `None` when `first_data` cannot start a row that
/// [`decode_record`] would read back. Cold resume admits the members of a stored row with
/// this and [`row_member_payload`] instead of building and decoding the row's line.
pub(crate) fn row_member_prefix(first_data: &str) -> Option<String> {
    with_row_shape(first_data, member_prefix)
}

/// The payload (one JSON string token) of a row member's `data`, when it follows the
/// row's `prefix` ([`row_member_prefix`]).
pub(crate) fn row_member_payload<'d>(prefix: &str, data: &'d str) -> Option<&'d str> {
    let payload = data
        .strip_prefix(prefix)?
        .strip_suffix(MEMBER_DATA_SUFFIX)?;
    is_one_string_token(payload).then_some(payload)
}

/// The `dt` entry between two members' times, when the row's decoder accepts it (a safe
/// integer).
pub(crate) fn row_gap(previous_time: i64, time: i64) -> Option<i64> {
    time.checked_sub(previous_time).and_then(safe)
}

/// Calls `use_shape` with the shared fields of the row a first member's `data` starts,
/// checked as the row decoder checks them (numbers, strings).
fn with_row_shape<T>(
    first_data: &str,
    use_shape: impl FnOnce(&RowShape<'_>) -> Option<T>,
) -> Option<T> {
    if let Some(shape) = canonical_row_shape(first_data) {
        return use_shape(&shape);
    }
    let outer = object_members_borrowed(first_data)?;
    if !has_exact_keys(&outer, &["turn", "step", "chunk"], &[]) {
        return None;
    }
    let chunk = object_members_borrowed(raw_member(&outer, "chunk")?)?;
    let chunk_type: String = serde_json::from_str(raw_member(&chunk, "type")?).ok()?;
    let shape = RowShape {
        tag: RowTag::from_chunk_type(&chunk_type)?,
        turn: raw_member(&outer, "turn")?,
        step: raw_member(&outer, "step")?,
        index: raw_member(&chunk, "index")?,
        id: raw_member(&chunk, "id"),
        name: raw_member(&chunk, "name"),
    };
    if !shape.fields_decode() {
        return None;
    }
    use_shape(&shape)
}

/// The shape of a text or reasoning row's first member whose `data` is exactly what
/// [`RowShape::member_prefix`] writes, one string token and [`MEMBER_DATA_SUFFIX`], with
/// plain integers: read by matching the text instead of parsing it (export starts every
/// row with this; a general parse cost about as much as the rest of the row). Anything
/// else is `None`, for the general way, which gives the same shape for these texts.
fn canonical_row_shape(data: &str) -> Option<RowShape<'_>> {
    let rest = data.strip_prefix("{\"turn\":")?;
    let (turn, rest) = split_plain_integer(rest)?;
    let rest = rest.strip_prefix(",\"step\":")?;
    let (step, rest) = split_plain_integer(rest)?;
    let rest = rest.strip_prefix(",\"chunk\":{\"type\":\"")?;
    let (tag, rest) = [RowTag::Text, RowTag::Reasoning]
        .into_iter()
        .find_map(|tag| Some((tag, rest.strip_prefix(tag.chunk_type())?)))?;
    let rest = rest.strip_prefix("\",\"index\":")?;
    let (index, rest) = split_plain_integer(rest)?;
    let payload = rest
        .strip_prefix(",\"text\":")?
        .strip_suffix(MEMBER_DATA_SUFFIX)?;
    is_one_string_token(payload).then_some(RowShape {
        tag,
        turn,
        step,
        index,
        id: None,
        name: None,
    })
}

/// Splits a JSON integer without fraction or exponent (`-?(0|[1-9][0-9]*)`, at most
/// [`MAX_CANONICAL_INTEGER_BYTES`]) off the front of `text`.
pub(crate) fn split_plain_integer(text: &str) -> Option<(&str, &str)> {
    let bytes = text.as_bytes();
    let sign = usize::from(bytes.first() == Some(&b'-'));
    let digits = bytes[sign..]
        .iter()
        .take_while(|byte| byte.is_ascii_digit())
        .count();
    let leading_zero = digits > 1 && bytes[sign] == b'0';
    let end = sign + digits;
    (digits > 0 && !leading_zero && end <= MAX_CANONICAL_INTEGER_BYTES).then(|| text.split_at(end))
}

fn member_prefix(shape: &RowShape<'_>) -> Option<String> {
    Some(shape.member_prefix())
}

/// A member's `data` text: the row's prefix, the payload, and the closing braces.
fn member_data_of(prefix: &str, payload: &str) -> String {
    let mut data = String::with_capacity(prefix.len() + payload.len() + MEMBER_DATA_SUFFIX.len());
    push_member_data(&mut data, prefix, payload);
    data
}

/// Appends a row member's `data` text to `out`: `prefix` ([`RowShape::member_prefix`]),
/// its `payload` and [`MEMBER_DATA_SUFFIX`]. One JSON value when the parts are checked
/// (`row_line::MEMBER_DATA_DEPTH` deep).
pub(crate) fn push_member_data(out: &mut String, prefix: &str, payload: &str) {
    out.push_str(prefix);
    out.push_str(payload);
    out.push_str(MEMBER_DATA_SUFFIX);
}

/// How every member's `data` text ends (`member_data`): the chunk object, then the data
/// object.
pub(crate) const MEMBER_DATA_SUFFIX: &str = "}}";

/// How a row line ends after its last payload: the payload array, the data object, the
/// line's object.
pub(crate) const ROW_LINE_END: &str = "]}}";

/// Whether `text` is exactly one JSON string token (so a member whose chunk carries more
/// than its payload never packs).
fn is_one_string_token(text: &str) -> bool {
    is_row_payload_token(text.as_bytes())
}

/// Whether `bytes` are exactly one JSON string token: what a row member's payload must be
/// ([`row_member_payload`]), for a reader that holds the payload alone.
pub(crate) fn is_row_payload_token(bytes: &[u8]) -> bool {
    if bytes.len() < 2 || bytes[0] != b'"' {
        return false;
    }
    let mut position = 1;
    // Jumps from one quote or backslash to the next (memchr's word-at-a-time search):
    // export checks every payload it writes.
    while let Some(found) = bytes
        .get(position..)
        .and_then(|rest| memchr::memchr2(b'\\', b'"', rest))
    {
        position += found;
        match bytes[position] {
            b'"' => return position == bytes.len() - 1,
            _ => position += 2,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matched shape of a canonical first member is the parsed one (same prefix, head
    /// and middle); a member it does not match goes the general way.
    #[test]
    fn a_canonical_row_start_is_matched_as_the_general_way_parses_it() {
        let matched = [
            r#"{"turn":1,"step":0,"chunk":{"type":"text-delta","index":0,"text":"a\"b"}}"#,
            r#"{"turn":-12,"step":30,"chunk":{"type":"reasoning-delta","index":7,"text":""}}"#,
        ];
        let general_only = [
            r#"{"turn":01,"step":0,"chunk":{"type":"text-delta","index":0,"text":"a"}}"#,
            r#"{"turn":1.5,"step":0,"chunk":{"type":"text-delta","index":0,"text":"a"}}"#,
            r#"{"turn":1,"step":0,"chunk":{"type":"text-delta","index":0,"text":"a","x":1}}"#,
            r#"{"turn":1,"step":0,"chunk":{"type":"tool-call-delta","index":0,"id":"c","argumentsDelta":"a"}}"#,
            r#"{"turn":1,"step":0,"chunk":{"type":"text-delta","index":0,"text":"a"},"turn":2}"#,
            r#"{"step":0,"turn":1,"chunk":{"type":"text-delta","index":0,"text":"a"}}"#,
        ];
        let parts = |shape: &RowShape<'_>| {
            let (mut head, mut middle) = (Vec::new(), Vec::new());
            shape.push_row_head(&mut head, 3, 4);
            shape.push_row_middle(&mut middle);
            (shape.member_prefix(), head, middle)
        };
        for data in matched {
            let fast = canonical_row_shape(data).map(|shape| parts(&shape));
            assert!(fast.is_some(), "{data}");
            let outer = object_members_borrowed(data).expect("an object");
            let chunk = object_members_borrowed(raw_member(&outer, "chunk").expect("chunk"))
                .expect("an object");
            let general = RowShape {
                tag: canonical_row_shape(data).expect("matched").tag,
                turn: raw_member(&outer, "turn").expect("turn"),
                step: raw_member(&outer, "step").expect("step"),
                index: raw_member(&chunk, "index").expect("index"),
                id: None,
                name: None,
            };
            assert_eq!(fast, Some(parts(&general)), "{data}");
        }
        for data in general_only {
            assert!(canonical_row_shape(data).is_none(), "{data}");
        }
        assert!(row_member_prefix(general_only[1]).is_some());
    }

    /// Row lines (and lines that only open like one) decode the same parsed once as the
    /// general way: duplicate `type` members either way round, an escaped tag, a lone
    /// surrogate, a negative gap, a missing or extra member, broken JSON.
    #[test]
    fn a_row_parsed_once_decodes_as_the_general_way() {
        let lines = [
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3,-2],"texts":["a","b\"c","d"]}}"#,
            r#"{"type":"reasoning-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":2,"index":1,"dt":[],"texts":["\ud800"]}}"#,
            r#"{"type":"tool-call-chunks","seq0":7,"time0":1,"data":{"turn":1,"step":0,"index":0,"id":"c1","name":"ls","dt":[1],"args":["{\"", "}"]}}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]},"type":"turn/start"}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]},"type":"text\u002dchunks"}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]},"type":"reasoning-chunks"}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"type":"text-chunks"}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3,4],"texts":["a","b"]}}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]},"extra":1}"#,
            r#"{"type":"text-chunks","seq0":4,"time0":10,"data":{"turn":1,"step":0,"index":0,"dt":[3],"texts":["a","b"]}"#,
            r#"{"type":"text-chunksX","seq0":4,"time0":10,"data":{}}"#,
        ];
        let mut decided = 0;
        for line in lines {
            let general = format!("{:?}", decode_generally(line));
            if let Some(once) = row_parsed_once(line) {
                decided += 1;
                assert_eq!(format!("{once:?}"), general, "{line}");
            }
            assert_eq!(
                format!("{:?}", decode_record(line.as_bytes())),
                general,
                "{line}"
            );
        }
        assert!(decided >= 6, "the one-parse way decided {decided} lines");
    }

    /// Plain event lines in DSH's shapes, and the odd ones issue #14 names: duplicate
    /// `type` members (with a number out of double range, which the general way's second
    /// read refuses), a key that reads `type` through an escape, an escaped or non-string
    /// tag, a row tag on an event's shape, lone surrogates, whitespace.
    const PLAIN_LINES: [&str; 12] = [
        r#"{"type":"turn/start","seq":0,"time":1786000000000,"data":{"turn":1,"trigger":{"kind":"message","source":{"kind":"user","rpcId":"rpc-1"}}}}"#,
        r#"{"type":"assistant/message","seq":5,"time":7,"data":{"turn":1,"step":1,"content":[{"type":"text","text":"a\nb\"c\ud800"}],"provenance":{"provider":"p","model":"m"},"usage":{"in":1e400,"out":-0}},"sourceEventSeqs":[1,2,3,4],"surfaceOp":"append"}"#,
        r#"{"type":"tool/result","seq":9,"time":8,"data":{"turn":1,"step":1,"callId":"call_1","content":[{"type":"text","text":"ok"}],"isError":false},"sourceEventSeqs":[8],"surfaceOp":{"op":"replace","start":1,"end":2}}"#,
        r#"{"type":"user/message","seq":2,"time":3,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append","ignorable":true}"#,
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"n":1e400},"type":"turn/end"}"#,
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"typ\u0065":"turn/end"}"#,
        r#"{"type":"turn\/start","seq":0,"time":1,"data":{"turn":1}}"#,
        r#"{"type":7,"seq":0,"time":1,"data":{"turn":1}}"#,
        r#"{"type":"text-chunks","seq":0,"time":1,"data":{"turn":1}}"#,
        r#"{"type":"x/\ud800","seq":0,"time":1,"data":{"turn":1}}"#,
        r#" {"type" : "turn/end", "seq":3 ,"time":1.0,"data":{"turn":1,"reason":{"kind":"completed"}}} "#,
        r#"{"seq":1,"data":{"\ud800":1},"time":-0,"type":"step/start"}"#,
    ];

    use dshdb_test_support::mutation::{mutated as mutated_bytes, Draws};

    /// Bytes a mutation writes: JSON's structure, whitespace, digits, escapes, control
    /// characters, and the letters of `type`.
    const MUTATION_BYTES: &[u8] = b" ,:\"\\{}[]0-19.eEu\x01typ\xff";

    fn mutated(line: &str, draws: &mut Draws) -> Vec<u8> {
        mutated_bytes(line.as_bytes(), MUTATION_BYTES, draws)
    }

    /// Wherever the one-parse reading of a plain line decides, the general way (a tag
    /// pass, then the event's) gives the same event or refusal; and `decode_record`, with
    /// its strict UTF-8 check first, reads every line as the lossy general way does.
    #[test]
    fn a_plain_line_parsed_once_decodes_as_the_general_way() {
        let mut draws = Draws::new(0x0005_eed0_f0e1_ea5e);
        let (mut lines, mut decided) = (0, 0);
        let mut check = |bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            let general = format!("{:?}", decode_generally(&text));
            if let Some(once) = event_parsed_once(&text) {
                assert_eq!(format!("{once:?}"), general, "{text}");
                decided += 1;
            }
            assert_eq!(format!("{:?}", decode_record(bytes)), general, "{text}");
            lines += 1;
        };
        for line in PLAIN_LINES {
            check(line.as_bytes());
        }
        for _ in 0..2_000 {
            for line in PLAIN_LINES {
                check(&mutated(line, &mut draws));
            }
        }
        assert!(decided > lines / 10, "{decided} of {lines} lines decided");
        for (line, once) in PLAIN_LINES.iter().zip([
            true, true, true, true, false, false, false, false, false, false, true, true,
        ]) {
            assert_eq!(event_parsed_once(line).is_some(), once, "{line}");
        }
    }
}
