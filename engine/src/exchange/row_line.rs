//! A packed chunk row line read in one pass when it is exactly what DSH's JSONL backend
//! writes (persistence §2.4; [`RowShape::row_line`]'s text): `{"type":<tag>,"seq0":..,
//! "time0":..,"data":{"turn":..,"step":..,"index":..,"dt":[..],<id, name>,<payloads>}}` with
//! no whitespace, DSH's key order, each key once and integers as DSH prints them.
//!
//! The general reader ([`super::scan::decode_record`]) parses the line with serde: once for
//! its members, again for `data`'s, once per array, then once per member `data` it builds;
//! and the import then re-packs the members to learn whether the line can be stored split
//! ([`super::scan::pack_row`]). A line this reader accepts is one the general reader decodes
//! to the same members and whose re-packing is the line itself, by construction: every
//! integer is checked to be the text `itoa` writes for its value, and every string to be
//! one JSON string token serde accepts. Any other line (whitespace, another key order, a
//! duplicate key, `-0`, `1.0`, a control character, an unsafe integer) is `None`, and goes
//! the general way, so refusals and their texts are those of the general reader.

use super::scan::{split_plain_integer, RowShape, RowTag, ROW_LINE_END};
use crate::session::json::MAX_SAFE_INTEGER;
use crate::session::plain_json::{is_plain_string_byte, split_canonical_integer};

/// How deep a member's `data` nests objects: the data object, its `chunk` (the payload is
/// a string).
pub(crate) const MEMBER_DATA_DEPTH: usize = 2;

/// A row line read by [`read_canonical_row`]: its shape, its members' seqs and times, and
/// their payloads (each one JSON string token, borrowed from the line).
pub(crate) struct CanonicalRow<'line> {
    pub shape: RowShape<'line>,
    pub seq0: u64,
    pub times: Vec<i64>,
    pub payloads: Vec<&'line str>,
}

impl CanonicalRow<'_> {
    /// How many events the row holds (at least one).
    pub(crate) fn members(&self) -> u64 {
        // A `usize` count always fits a `u64` on the targets dshdb builds for.
        u64::try_from(self.payloads.len()).unwrap_or(u64::MAX)
    }

    /// The time of the row's last member.
    pub(crate) fn last_time(&self) -> i64 {
        self.times.last().copied().unwrap_or_default()
    }
}

/// How every line [`read_canonical_row`] reads starts (before the row's tag).
const ROW_OPENING: &str = "{\"type\":\"";

/// Whether `raw` starts as a packed row line DSH writes: a cheap test before a line's
/// UTF-8 check and [`read_canonical_row`].
pub(crate) fn opens_as_row(raw: &[u8]) -> bool {
    raw.strip_prefix(ROW_OPENING.as_bytes())
        .is_some_and(|rest| {
            RowTag::ALL
                .iter()
                .any(|tag| rest.starts_with(tag.tag().as_bytes()))
        })
}

/// Reads `line` as a packed row exactly as DSH writes it (module doc), or `None`.
pub(crate) fn read_canonical_row(line: &str) -> Option<CanonicalRow<'_>> {
    let rest = line.strip_prefix(ROW_OPENING)?;
    let (tag, rest) = RowTag::ALL
        .into_iter()
        .find_map(|tag| Some((tag, rest.strip_prefix(tag.tag())?)))?;
    let rest = rest.strip_prefix("\",\"seq0\":")?;
    let (seq0, rest) = split_canonical_integer(rest)?;
    let seq0 = u64::try_from(seq0).ok()?;
    let rest = rest.strip_prefix(",\"time0\":")?;
    let (time0, rest) = split_canonical_integer(rest)?;
    let rest = rest.strip_prefix(",\"data\":{\"turn\":")?;
    let (turn, rest) = split_plain_integer(rest)?;
    let rest = rest.strip_prefix(",\"step\":")?;
    let (step, rest) = split_plain_integer(rest)?;
    let rest = rest.strip_prefix(",\"index\":")?;
    let (index, rest) = split_plain_integer(rest)?;
    let rest = rest.strip_prefix(",\"dt\":[")?;
    let (times, rest) = split_times(time0, rest)?;
    let (id, name, rest) = match tag {
        RowTag::ToolCall => split_call_names(rest)?,
        _ => (None, None, rest.strip_prefix(",\"texts\":[")?),
    };
    let payloads = split_payloads(rest, times.len())?;
    let last_seq = seq0.checked_add(u64::try_from(times.len() - 1).ok()?)?;
    (last_seq <= MAX_SAFE_INTEGER).then_some(CanonicalRow {
        shape: RowShape {
            tag,
            turn,
            step,
            index,
            id,
            name,
        },
        seq0,
        times,
        payloads,
    })
}

/// The `dt` entries (after `[`, through `]`) as the members' times from `time0`: every gap
/// and every running time a safe integer, as the general reader requires.
fn split_times(time0: i64, text: &str) -> Option<(Vec<i64>, &str)> {
    // Sized once from the commas before the list's end (a row has tens of members: growing
    // the list one push at a time reallocated it at every power of two).
    let listed = memchr::memchr(b']', text.as_bytes()).unwrap_or(text.len());
    let gaps = memchr::memchr_iter(b',', &text.as_bytes()[..listed]).count() + 1;
    let mut times = Vec::with_capacity(gaps + 1);
    times.push(time0);
    if let Some(rest) = text.strip_prefix(']') {
        return Some((times, rest));
    }
    let mut rest = text;
    let mut time = time0;
    loop {
        let (gap, after) = split_canonical_integer(rest)?;
        time = time
            .checked_add(gap)
            .filter(|time| time.unsigned_abs() <= MAX_SAFE_INTEGER)?;
        times.push(time);
        match after.as_bytes().first()? {
            b',' => rest = &after[1..],
            b']' => return Some((times, &after[1..])),
            _ => return None,
        }
    }
}

/// A tool-call row's `,"id":<string>` and optional `,"name":<string>`, then `,"args":[`.
fn split_call_names(text: &str) -> Option<(Option<&str>, Option<&str>, &str)> {
    let rest = text.strip_prefix(",\"id\":")?;
    let (id, rest) = split_string_token(rest)?;
    let (name, rest) = match rest.strip_prefix(",\"name\":") {
        Some(rest) => {
            let (name, rest) = split_string_token(rest)?;
            (Some(name), rest)
        }
        None => (None, rest),
    };
    Some((Some(id), name, rest.strip_prefix(",\"args\":[")?))
}

/// Exactly `count` payload tokens separated by `,`, then [`ROW_LINE_END`] and the line's end.
fn split_payloads(text: &str, count: usize) -> Option<Vec<&str>> {
    let mut payloads = Vec::with_capacity(count);
    let mut rest = text;
    loop {
        let (payload, after) = split_string_token(rest)?;
        payloads.push(payload);
        if payloads.len() == count {
            return (after == ROW_LINE_END).then_some(payloads);
        }
        rest = after.strip_prefix(',')?;
    }
}

/// Splits one JSON string token off the front of `text`, checked as serde checks a string
/// it skips: no control character, escapes `\" \\ \/ \b \f \n \r \t` and `\u` with four hex
/// digits (a lone surrogate included, as serde's raw values take it).
fn split_string_token(text: &str) -> Option<(&str, &str)> {
    let bytes = text.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut position = 1;
    loop {
        position += plain_run(&bytes[position..]);
        match *bytes.get(position)? {
            b'"' => return Some(text.split_at(position + 1)),
            b'\\' => position += escape_bytes(&bytes[position + 1..])? + 1,
            _ => return None,
        }
    }
}

/// Bytes of a valid escape after its backslash (`bytes` starts after it).
fn escape_bytes(bytes: &[u8]) -> Option<usize> {
    /// `\u` and its four hex digits.
    const UNICODE_ESCAPE_BYTES: usize = 5;
    match *bytes.first()? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(1),
        b'u' => bytes
            .get(1..UNICODE_ESCAPE_BYTES)?
            .iter()
            .all(u8::is_ascii_hexdigit)
            .then_some(UNICODE_ESCAPE_BYTES),
        _ => None,
    }
}

/// Whether a string token's byte ends its plain run: a quote, a backslash or a control
/// character.
fn ends_plain_run(byte: u8) -> bool {
    !is_plain_string_byte(byte)
}

/// Bytes at the front of `bytes` before the first one that [`ends_plain_run`]: eight at a
/// time (a word test for each of the three kinds, as serde's own string skip does), since
/// nearly all of a row's bytes are its payloads' text.
fn plain_run(bytes: &[u8]) -> usize {
    const WORD_BYTES: usize = 8;
    const ONES: u64 = u64::MAX / 0xff;
    const HIGH_BITS: u64 = ONES << 7;
    let matches_byte = |word: u64, byte: u8| {
        let differs = word ^ (ONES * u64::from(byte));
        differs.wrapping_sub(ONES) & !differs
    };
    let mut offset = 0;
    for chunk in bytes.chunks_exact(WORD_BYTES) {
        let Ok(word_bytes) = <[u8; WORD_BYTES]>::try_from(chunk) else {
            break;
        };
        let word = u64::from_le_bytes(word_bytes);
        let control = word.wrapping_sub(ONES * 0x20) & !word;
        let found = (control | matches_byte(word, b'"') | matches_byte(word, b'\\')) & HIGH_BITS;
        if found != 0 {
            // The lowest flagged byte is exact: a borrow only flags bytes above a match.
            let first = usize::try_from(found.trailing_zeros() / 8).unwrap_or(0);
            return offset + first;
        }
        offset += WORD_BYTES;
    }
    offset
        + bytes[offset..]
            .iter()
            .position(|&byte| ends_plain_run(byte))
            .unwrap_or(bytes.len() - offset)
}

#[cfg(test)]
mod tests;
