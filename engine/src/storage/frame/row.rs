//! Row entries (format-spec/06-runs-and-index.md F-06-30 … F-06-32; in segments
//! 02-records.md F-02-20): a stretch of consecutive events of one session whose `data`
//! differ only in their last JSON string, stored as one frame that covers their seq range.
//! This is the reading side and the frame form, shared by runs (whose frames carry a zero
//! checksum field) and segments (checksummed under the segment's salt); which stretches
//! become entries is the writer's choice (`storage::run::rows::row_groups`).
//! Pure: no I/O.

use crate::error::Result as EngineResult;
use crate::limits::MIN_ROW_ENTRY_MEMBERS;
use crate::storage::coding::{
    checked_u32, read_varint, u32_to_usize, unzigzag, widen, Reader, ShortInput, Writer,
};
use crate::storage::frame::{encode_frame, EventRecord, KNOWN_EVENT_FLAGS};

/// Frame kind of a row entry: in the event blocks of a version-2 run (F-06-30) and in
/// segments (F-02-20).
pub const ROW_ENTRY_KIND: u8 = 7;
/// Bytes of a row entry payload's fixed fields, before its prefix (F-06-30).
pub const ROW_ENTRY_FIXED_BYTES: usize = 38;

/// A decoded, checked row entry payload. Its members are read with [`RowEntry::members`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowEntry<'a> {
    pub session: u32,
    pub first_seq: u64,
    pub member_count: u32,
    pub type_number: u32,
    /// Event flags of the first member.
    pub first_flags: u8,
    /// Event flags of every later member.
    pub member_flags: u8,
    pub first_time: i64,
    /// The text every member's `data` starts with.
    pub prefix: &'a [u8],
    /// The text every member's `data` ends with.
    pub suffix: &'a [u8],
    /// `member_count − 1` zigzag varints: each member's time minus the previous one's.
    pub(crate) gaps: &'a [u8],
    /// `member_count` varints: each member's payload length in bytes.
    pub(crate) lengths: &'a [u8],
    /// The payloads back to back.
    pub(crate) payloads: &'a [u8],
}

/// One member of a row entry: an event whose `data` is `prefix ‖ payload ‖ suffix` and
/// whose envelope is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowMember<'a> {
    pub seq: u64,
    pub time: i64,
    pub flags: u8,
    pub payload: &'a [u8],
}

impl From<ShortInput> for RowEntryError {
    fn from(short: ShortInput) -> Self {
        RowEntryError(short.field)
    }
}

/// Why a row entry payload does not match its layout (the run is then corrupt, F-06-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowEntryError(pub &'static str);

impl<'a> RowEntry<'a> {
    /// Decodes and checks a row entry payload (F-06-30, F-06-32): every field present, at
    /// least [`MIN_ROW_ENTRY_MEMBERS`] members, defined flags only, seqs and times that do
    /// not overflow, canonical varints, and payload lengths that add up to exactly the
    /// bytes left.
    pub fn decode(payload: &'a [u8]) -> std::result::Result<Self, RowEntryError> {
        let mut reader = Reader::new(payload);
        let session = reader.u32("row session")?;
        let first_seq = reader.u64("row first seq")?;
        let member_count = reader.u32("row member count")?;
        let type_number = reader.u32("row type number")?;
        let first_flags = reader.u8("row first flags")?;
        let member_flags = reader.u8("row member flags")?;
        let first_time = reader.i64("row first time")?;
        let prefix_bytes = u32_to_usize(reader.u32("row prefix bytes")?);
        let suffix_bytes = u32_to_usize(reader.u32("row suffix bytes")?);
        let prefix = reader.bytes(prefix_bytes, "row prefix")?;
        let suffix = reader.bytes(suffix_bytes, "row suffix")?;
        let columns = reader.rest();
        if member_count < MIN_ROW_ENTRY_MEMBERS {
            return Err(RowEntryError("row entry of fewer than two members"));
        }
        if (first_flags | member_flags) & !KNOWN_EVENT_FLAGS != 0 {
            return Err(RowEntryError("undefined event flags in a row entry"));
        }
        if first_seq.checked_add(u64::from(member_count - 1)).is_none() {
            return Err(RowEntryError("row entry seqs overflow"));
        }
        let mut at = 0usize;
        let mut time = first_time;
        for _ in 1..member_count {
            let (gap, used) = next_varint(columns, at, "row time gap")?;
            time = time
                .checked_add(unzigzag(gap))
                .ok_or(RowEntryError("row member time overflows"))?;
            at += used;
        }
        let gaps_end = at;
        let mut payload_total = 0u64;
        for _ in 0..member_count {
            let (length, used) = next_varint(columns, at, "row payload length")?;
            payload_total = payload_total
                .checked_add(length)
                .ok_or(RowEntryError("row payload lengths overflow"))?;
            at += used;
        }
        let payloads = &columns[at..];
        if widen(payloads.len()) != payload_total {
            return Err(RowEntryError(
                "row payload lengths do not add up to the bytes left",
            ));
        }
        Ok(RowEntry {
            session,
            first_seq,
            member_count,
            type_number,
            first_flags,
            member_flags,
            first_time,
            prefix,
            suffix,
            gaps: &columns[..gaps_end],
            lengths: &columns[gaps_end..at],
            payloads,
        })
    }

    /// Appends this entry as a frame checksummed under `salt` (a segment's frame, F-02-20;
    /// a run's writer then clears the checksum field, F-06-13).
    pub fn encode(&self, out: &mut Vec<u8>, salt: u64) -> EngineResult<()> {
        let mut fixed = Vec::with_capacity(ROW_ENTRY_FIXED_BYTES);
        Writer::new(&mut fixed)
            .u32(self.session)
            .u64(self.first_seq)
            .u32(self.member_count)
            .u32(self.type_number)
            .u8(self.first_flags)
            .u8(self.member_flags)
            .i64(self.first_time)
            .u32(checked_u32(self.prefix.len(), "row prefix")?)
            .u32(checked_u32(self.suffix.len(), "row suffix")?);
        encode_frame(
            out,
            salt,
            ROW_ENTRY_KIND,
            0,
            &[
                &fixed,
                self.prefix,
                self.suffix,
                self.gaps,
                self.lengths,
                self.payloads,
            ],
        )
    }

    /// Payload size of this entry in bytes.
    pub fn payload_bytes(&self) -> usize {
        ROW_ENTRY_FIXED_BYTES
            + self.prefix.len()
            + self.suffix.len()
            + self.gaps.len()
            + self.lengths.len()
            + self.payloads.len()
    }

    /// Every member's `data` (`prefix ‖ payload ‖ suffix`) back to back, in seq order:
    /// for a caller that needs the members as event records borrowing one buffer.
    pub fn members_data(&self) -> Vec<u8> {
        let shared = self.prefix.len() + self.suffix.len();
        let mut data =
            Vec::with_capacity(self.payloads.len() + shared * u32_to_usize(self.member_count));
        for member in self.members() {
            data.extend_from_slice(self.prefix);
            data.extend_from_slice(member.payload);
            data.extend_from_slice(self.suffix);
        }
        data
    }

    /// The members as event records whose `data` lie in `data`, which
    /// [`RowEntry::members_data`] returned for this entry.
    pub fn member_records<'d>(&self, data: &'d [u8]) -> Vec<EventRecord<'d>> {
        let shared = self.prefix.len() + self.suffix.len();
        let mut at = 0usize;
        let mut records = Vec::with_capacity(u32_to_usize(self.member_count));
        for member in self.members() {
            let end = (at + shared + member.payload.len()).min(data.len());
            records.push(EventRecord {
                session: self.session,
                seq: member.seq,
                time: member.time,
                type_number: self.type_number,
                flags: member.flags,
                data: &data[at.min(end)..end],
                envelope: &[],
            });
            at = end;
        }
        records
    }

    /// The members in seq order.
    pub fn members(&self) -> RowMembers<'_, 'a> {
        RowMembers {
            entry: self,
            index: 0,
            time: self.first_time,
            gap_at: 0,
            length_at: 0,
            payload_at: 0,
        }
    }

    /// Whether every member's payload is UTF-8 (F-02-16), checked in one pass over the
    /// payloads column: the column is UTF-8, and no payload starts inside a character
    /// (on a continuation byte), so each piece is UTF-8 too. One long check instead of one
    /// per member, whose payloads are a few bytes each.
    pub fn payloads_are_utf8(&self) -> bool {
        const CONTINUATION_MASK: u8 = 0b1100_0000;
        const CONTINUATION_BITS: u8 = 0b1000_0000;
        if std::str::from_utf8(self.payloads).is_err() {
            return false;
        }
        // The lengths column alone gives where each payload starts (the gaps are not read).
        let mut at = 0usize;
        let mut start = 0usize;
        for _ in 0..self.member_count {
            let Some((length, used)) = self.lengths.get(at..).and_then(read_varint) else {
                return false;
            };
            at += used;
            let starts_a_character = self
                .payloads
                .get(start)
                .is_none_or(|byte| byte & CONTINUATION_MASK != CONTINUATION_BITS);
            let Some(end) = usize::try_from(length)
                .ok()
                .and_then(|length| start.checked_add(length))
            else {
                return false;
            };
            if !starts_a_character {
                return false;
            }
            start = end;
        }
        true
    }

    /// Member `member` as the event it stands for, its `data` rebuilt in `data`.
    pub fn member_event<'b>(
        &self,
        member: &RowMember<'_>,
        data: &'b mut Vec<u8>,
    ) -> EventRecord<'b> {
        data.clear();
        data.extend_from_slice(self.prefix);
        data.extend_from_slice(member.payload);
        data.extend_from_slice(self.suffix);
        EventRecord {
            session: self.session,
            seq: member.seq,
            time: member.time,
            type_number: self.type_number,
            flags: member.flags,
            data,
            envelope: &[],
        }
    }
}

/// The session and member count of a row entry payload, read without decoding the rest:
/// for a reader that steps over entries of other sessions or before its range.
pub fn peek_row_entry(payload: &[u8]) -> std::result::Result<(u32, u32), RowEntryError> {
    let mut reader = Reader::new(payload);
    let session = reader.u32("row session")?;
    let _first_seq = reader.u64("row first seq")?;
    let member_count = reader.u32("row member count")?;
    Ok((session, member_count))
}

/// The varint at `at` of `column`, or the reason it is not one.
fn next_varint(
    column: &[u8],
    at: usize,
    field: &'static str,
) -> std::result::Result<(u64, usize), RowEntryError> {
    column
        .get(at..)
        .and_then(read_varint)
        .ok_or(RowEntryError(field))
}

/// Iterator over a decoded entry's members ([`RowEntry::members`]).
pub struct RowMembers<'e, 'a> {
    entry: &'e RowEntry<'a>,
    index: u32,
    time: i64,
    gap_at: usize,
    length_at: usize,
    payload_at: usize,
}

impl<'a> Iterator for RowMembers<'_, 'a> {
    type Item = RowMember<'a>;

    /// The columns were checked by [`RowEntry::decode`], so no step fails; a `None` from a
    /// failed step would end the walk early, which the caller's count check reports.
    fn next(&mut self) -> Option<RowMember<'a>> {
        let entry = self.entry;
        if self.index >= entry.member_count {
            return None;
        }
        if self.index > 0 {
            let (gap, used) = read_varint(entry.gaps.get(self.gap_at..)?)?;
            self.time = self.time.checked_add(unzigzag(gap))?;
            self.gap_at += used;
        }
        let (length, used) = read_varint(entry.lengths.get(self.length_at..)?)?;
        self.length_at += used;
        let end = self.payload_at.checked_add(usize::try_from(length).ok()?)?;
        let payload = entry.payloads.get(self.payload_at..end)?;
        self.payload_at = end;
        let member = RowMember {
            seq: entry.first_seq + u64::from(self.index),
            time: self.time,
            flags: match self.index {
                0 => entry.first_flags,
                _ => entry.member_flags,
            },
            payload,
        };
        self.index += 1;
        Some(member)
    }
}
