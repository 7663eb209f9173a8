//! Row entries of version-2 runs (format-spec/06-runs-and-index.md, F-06-30 … F-06-33): a
//! stretch of consecutive events of one session whose `data` differ only in their last JSON
//! string (a DSH chunk row's members, or live chunk events that DSH would pack the same
//! way) stored as one entry that covers their seq range. The shared text before and after
//! that string is stored once, the time gaps and the strings' lengths as two varint
//! columns, then the strings back to back: what differs between chunk events sits together
//! and what repeats is not repeated, which is what both zstd and a reader want.
//!
//! The form is exact whatever the bytes: a member's `data` is `prefix ‖ payload ‖ suffix`,
//! so the grouping rule ([`row_groups`]) decides only what is packed, never what is read.
//! Pure: no I/O.

use crate::error::{Error, Result};
use crate::limits::{MAX_ROW_ENTRY_BYTES, MIN_ROW_ENTRY_MEMBERS};
use crate::storage::coding::{
    checked_count_u32, push_varint, u32_to_usize, widen, zigzag, MAX_VARINT_BYTES,
};
pub use crate::storage::frame::row::{
    peek_row_entry, RowEntry, RowEntryError, RowMember, RowMembers, ROW_ENTRY_FIXED_BYTES,
    ROW_ENTRY_KIND,
};
use crate::storage::frame::{EventRecord, EVENT_FLAG_ROW_START};
use std::ops::Range;

/// Where the payload of `data` lies: its last JSON string token (quotes included), found
/// by one forward scan that steps over escapes. `None` when `data` holds no whole string
/// token. Any split would read back exactly; this one makes the prefix and suffix of DSH's
/// chunk events (`{"turn":…,"step":…,"chunk":{…,"text":` and `}}`) shared by a row.
fn payload_span(data: &[u8]) -> Option<Range<usize>> {
    let mut last = None;
    let mut at = 0usize;
    // Jumps from quote to quote (and over escapes) instead of stepping byte by byte: a
    // chunk's data is mostly the text of its string.
    while let Some(found) = data.get(at..).and_then(|rest| memchr::memchr(b'"', rest)) {
        let start = at + found;
        at = start + 1;
        loop {
            let stop = at + memchr::memchr2(b'"', b'\\', data.get(at..)?)?;
            if data[stop] == b'"' {
                at = stop;
                break;
            }
            at = stop + 2;
        }
        at += 1;
        last = Some(start..at);
    }
    last
}

/// The first member of a row entry being gathered: what later members must share.
struct Leader<'e> {
    type_number: u32,
    prefix: &'e [u8],
    suffix: &'e [u8],
}

impl<'e> Leader<'e> {
    /// The shared shape `event` gives a row entry it starts, or `None` when it cannot be a
    /// member (an envelope, no string in its data).
    fn of(event: &EventRecord<'e>) -> Option<Self> {
        if !event.envelope.is_empty() {
            return None;
        }
        let span = payload_span(event.data)?;
        Some(Leader {
            type_number: event.type_number,
            prefix: &event.data[..span.start],
            suffix: &event.data[span.end..],
        })
    }

    /// The payload of `event` when it has this leader's shape.
    fn payload<'d>(&self, event: &EventRecord<'d>) -> Option<&'d [u8]> {
        if !event.envelope.is_empty() || event.type_number != self.type_number {
            return None;
        }
        let data = event.data;
        let fits = data.len() >= self.prefix.len() + self.suffix.len()
            && data.starts_with(self.prefix)
            && data.ends_with(self.suffix);
        fits.then(|| &data[self.prefix.len()..data.len() - self.suffix.len()])
    }
}

/// Bytes a member adds to an entry at most: its payload and two varints.
fn member_bytes(payload: &[u8]) -> usize {
    payload.len() + 2 * MAX_VARINT_BYTES
}

/// Splits `events` (consecutive seqs of one session, in order) into the stretches a writer
/// stores as one row entry each (F-06-31); events outside every stretch stay event frames.
/// A stretch grows while the next event has an empty envelope, the first one's type, the
/// text before and after its last string equal to the first one's, a time gap that fits a
/// signed 64-bit number, and, after the second member, the second member's flags; it does
/// not grow over an event that starts a DSH row (`ROW_START`), nor past
/// [`MAX_ROW_ENTRY_BYTES`]. So each imported DSH row that fits is one entry, and live chunk
/// events of one turn, step and chunk index (which DSH's `packChunks` would pack) are one
/// entry, whatever batches they arrived in.
pub fn row_groups(events: &[EventRecord<'_>]) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0usize;
    while start < events.len() {
        let end = group_end(events, start);
        if end - start >= u32_to_usize(MIN_ROW_ENTRY_MEMBERS) {
            groups.push(start..end);
        }
        start = end;
    }
    groups
}

/// One past the last event of the stretch that starts at `start` (at least `start + 1`).
fn group_end(events: &[EventRecord<'_>], start: usize) -> usize {
    let Some(leader) = Leader::of(&events[start]) else {
        return start + 1;
    };
    let mut bytes = ROW_ENTRY_FIXED_BYTES
        + leader.prefix.len()
        + leader.suffix.len()
        + member_bytes(
            &events[start].data
                [leader.prefix.len()..events[start].data.len() - leader.suffix.len()],
        );
    let mut end = start + 1;
    while let Some(event) = events.get(end) {
        let previous = &events[end - 1];
        let flags_fit = event.flags & EVENT_FLAG_ROW_START == 0
            && (end == start + 1 || event.flags == events[start + 1].flags);
        let Some(payload) = leader.payload(event) else {
            break;
        };
        bytes += member_bytes(payload);
        let continues = flags_fit
            && event.time.checked_sub(previous.time).is_some()
            && bytes <= MAX_ROW_ENTRY_BYTES;
        if !continues {
            break;
        }
        end += 1;
    }
    end
}

/// Appends `members` (a stretch [`row_groups`] returned) as one row entry frame (F-06-30),
/// with a zero checksum field as every frame in a run (F-06-13).
pub fn encode_row_entry(members: &[EventRecord<'_>], out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    encode_row_frame(members, out, 0)?;
    out[start..start + 4].copy_from_slice(&[0; 4]);
    Ok(())
}

/// Appends `members` (a stretch [`row_groups`] returned) as one row entry frame
/// checksummed under `salt`: a segment's frame (F-02-20).
pub fn encode_row_frame(members: &[EventRecord<'_>], out: &mut Vec<u8>, salt: u64) -> Result<()> {
    let not_a_row = || Error::InvalidInput {
        reason: "events given as a row entry do not share one row shape".to_string(),
    };
    let (first, rest) = members.split_first().ok_or_else(not_a_row)?;
    let leader = Leader::of(first).ok_or_else(not_a_row)?;
    let member_flags = rest.first().map_or(0, |second| second.flags);
    let mut gaps = Vec::with_capacity(members.len());
    let mut lengths = Vec::with_capacity(members.len());
    let mut payloads = Vec::new();
    let mut previous_time = first.time;
    for (position, member) in members.iter().enumerate() {
        let payload = leader.payload(member).ok_or_else(not_a_row)?;
        if position > 0 {
            if member.flags != member_flags {
                return Err(not_a_row());
            }
            let gap = member
                .time
                .checked_sub(previous_time)
                .ok_or_else(not_a_row)?;
            push_varint(&mut gaps, zigzag(gap));
        }
        previous_time = member.time;
        push_varint(&mut lengths, widen(payload.len()));
        payloads.extend_from_slice(payload);
    }
    RowEntry {
        session: first.session,
        first_seq: first.seq,
        member_count: checked_count_u32(members.len(), "row entry", "events")?,
        type_number: first.type_number,
        first_flags: first.flags,
        member_flags,
        first_time: first.time,
        prefix: leader.prefix,
        suffix: leader.suffix,
        gaps: &gaps,
        lengths: &lengths,
        payloads: &payloads,
    }
    .encode(out, salt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::frame::{decode_run_frame, EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER};
    use proptest::prelude::*;

    /// F-06-31's split read literally: one byte at a time from the start, a string from a
    /// `"` to the next `"` not escaped by `\\`.
    fn payload_span_byte_by_byte(data: &[u8]) -> Option<Range<usize>> {
        let mut last = None;
        let mut at = 0usize;
        while at < data.len() {
            if data[at] != b'"' {
                at += 1;
                continue;
            }
            let start = at;
            at += 1;
            loop {
                match data.get(at)? {
                    b'\\' => at += 2,
                    b'"' => break,
                    _ => at += 1,
                }
            }
            at += 1;
            last = Some(start..at);
        }
        last
    }

    proptest! {
        #[test]
        fn the_payload_split_is_the_byte_by_byte_reading(
            data in proptest::collection::vec(
                prop_oneof![Just(b'"'), Just(b'\\'), Just(b'a'), Just(b'{'), any::<u8>()],
                0..48,
            )
        ) {
            prop_assert_eq!(payload_span(&data), payload_span_byte_by_byte(&data));
        }
    }

    fn chunk(seq: u64, time: i64, flags: u8, text: &str) -> (u64, i64, u8, String) {
        (
            seq,
            time,
            flags,
            format!(
                r#"{{"turn":1,"step":0,"chunk":{{"type":"text-delta","index":0,"text":{}}}}}"#,
                serde_json::to_string(text).expect("string")
            ),
        )
    }

    fn events(specs: &[(u64, i64, u8, String)]) -> Vec<EventRecord<'_>> {
        specs
            .iter()
            .map(|(seq, time, flags, data)| EventRecord {
                session: 4,
                seq: *seq,
                time: *time,
                type_number: 2,
                flags: *flags,
                data: data.as_bytes(),
                envelope: b"",
            })
            .collect()
    }

    #[test]
    fn an_entry_reads_back_every_member_exactly() {
        let specs = [
            chunk(
                10,
                1_000,
                EVENT_FLAG_ROW_START | EVENT_FLAG_BATCH_START,
                "He",
            ),
            chunk(11, 990, EVENT_FLAG_ROW_MEMBER, "llo \"q\" \\"),
            chunk(12, i64::from(i32::MAX), EVENT_FLAG_ROW_MEMBER, ""),
        ];
        let members = events(&specs);
        assert_eq!(row_groups(&members), vec![0..3]);
        let mut out = Vec::new();
        encode_row_entry(&members, &mut out).expect("encodes");
        let frame = decode_run_frame(&out).expect("frame");
        assert_eq!((frame.kind, frame.total_bytes), (ROW_ENTRY_KIND, out.len()));
        let entry = RowEntry::decode(frame.payload).expect("decodes");
        let mut buffer = Vec::new();
        let read: Vec<_> = entry
            .members()
            .map(|member| format!("{:?}", entry.member_event(&member, &mut buffer)))
            .collect();
        let expected: Vec<_> = members.iter().map(|event| format!("{event:?}")).collect();
        assert_eq!(read, expected);
    }

    #[test]
    fn stretches_end_at_a_new_row_another_shape_or_other_flags() {
        let specs = [
            chunk(0, 5, 0, "a"),
            chunk(1, 6, 0, "b"),
            chunk(2, 7, EVENT_FLAG_ROW_START, "c"),
            chunk(3, 7, EVENT_FLAG_ROW_MEMBER, "d"),
            chunk(4, 7, 0, "e"),
            (
                5,
                7,
                0,
                r#"{"turn":2,"step":0,"chunk":{"type":"text-delta","index":0,"text":"f"}}"#
                    .to_string(),
            ),
            (
                6,
                7,
                0,
                r#"{"turn":2,"step":0,"chunk":{"type":"block-end","index":0}}"#.to_string(),
            ),
        ];
        assert_eq!(row_groups(&events(&specs)), vec![0..2, 2..4]);
    }

    #[test]
    fn damaged_payloads_are_refused() {
        let specs = [chunk(0, 5, 0, "a"), chunk(1, 6, 0, "bc")];
        let mut out = Vec::new();
        encode_row_entry(&events(&specs), &mut out).expect("encodes");
        let payload = out[12..].to_vec();
        assert!(RowEntry::decode(&payload).is_ok());
        for cut in 0..payload.len() {
            assert!(RowEntry::decode(&payload[..cut]).is_err(), "cut at {cut}");
        }
        let mut one_member = payload.clone();
        one_member[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert!(RowEntry::decode(&one_member).is_err());
        let mut bad_flags = payload.clone();
        bad_flags[20] = 0x20;
        assert!(RowEntry::decode(&bad_flags).is_err());
        let mut longer = payload;
        longer.push(b'x');
        assert!(RowEntry::decode(&longer).is_err());
    }

    /// The payloads column is checked for UTF-8 in one pass (`payloads_are_utf8`): a column
    /// that is UTF-8 as a whole but splits a character between two payloads is refused,
    /// like the per-member check it replaces; multi-byte characters inside payloads pass.
    #[test]
    fn payloads_that_split_a_character_are_not_utf8() {
        let specs = [chunk(0, 5, 0, "aé"), chunk(1, 6, 0, "€d")];
        let mut out = Vec::new();
        encode_row_entry(&events(&specs), &mut out).expect("encodes");
        let payload = out[12..].to_vec();
        assert!(RowEntry::decode(&payload)
            .expect("decodes")
            .payloads_are_utf8());
        let column = "\"aé\"\"€d\"".as_bytes();
        let at = payload
            .windows(column.len())
            .position(|window| window == column)
            .expect("the payloads column");
        // The same lengths (5 and 6 bytes) over `"aé€d"` and two spaces: the column reads
        // as UTF-8, but `€` starts in the first payload and ends in the second.
        let mut split = payload.clone();
        let moved = [
            0x22, 0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0x64, 0x22, 0x20, 0x20,
        ];
        split[at..at + column.len()].copy_from_slice(&moved);
        assert!(std::str::from_utf8(&split[at..]).is_ok());
        let entry = RowEntry::decode(&split).expect("still decodes");
        assert!(!entry.payloads_are_utf8());
        let mut invalid = payload;
        invalid[at + 1] = 0xFF;
        assert!(!RowEntry::decode(&invalid)
            .expect("decodes")
            .payloads_are_utf8());
    }
}
