//! Record framing (format-spec/02-records.md). Pure: no I/O.
//!
//! ```text
//! offset size field
//! 0      4    checksum  crc32 (IEEE) of the segment salt (8 bytes LE) then bytes 4..12+length
//! 4      4    length    payload length in bytes
//! 8      1    kind      record kind
//! 9      1    flags     bit 0 = skippable; other bits zero
//! 10     2    reserved  zero
//! 12     n    payload
//! ```

use crate::error::{Error, Result as EngineResult};
use crate::storage::coding::{
    checked_u32, u32_at, u32_to_usize, widen, Reader, ShortInput, Writer,
};

pub mod row;

pub use crate::limits::FRAME_HEADER_BYTES;
pub use crate::limits::MAX_PAYLOAD_BYTES;
use row::RowEntry;
/// Frame flag: a reader that does not know the kind skips the record (F-02-7).
pub const FLAG_SKIPPABLE: u8 = 1;

/// Event flag: the envelope field holds the complete original JSON line (F-02-11).
pub const EVENT_FLAG_VERBATIM_LINE: u8 = 1;
/// Event flag: the event starts a DSH write batch (a zstd frame in `session.jsonl.zstd`).
pub const EVENT_FLAG_BATCH_START: u8 = 1 << 1;
/// Event flag: the event starts a packed DSH chunk row.
pub const EVENT_FLAG_ROW_START: u8 = 1 << 2;
/// Event flag: the event continues the packed DSH chunk row of the event before it.
pub const EVENT_FLAG_ROW_MEMBER: u8 = 1 << 3;
/// Event flag: (with ROW_START) the envelope holds the row's original line verbatim.
pub const EVENT_FLAG_ROW_VERBATIM: u8 = 1 << 4;
/// Every event flag this version defines; others make the record invalid.
pub const KNOWN_EVENT_FLAGS: u8 = EVENT_FLAG_VERBATIM_LINE
    | EVENT_FLAG_BATCH_START
    | EVENT_FLAG_ROW_START
    | EVENT_FLAG_ROW_MEMBER
    | EVENT_FLAG_ROW_VERBATIM;
/// Session header field: no seed parent.
pub const NO_SEED_PARENT: u32 = u32::MAX;
/// Bytes of a tombstone payload: the session number (F-02-18).
pub const TOMBSTONE_PAYLOAD_BYTES: usize = 4;
pub use crate::limits::SESSION_HEADER_FIXED_BYTES;

/// Record kinds (F-02-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    SessionHeader = 1,
    TypeDefinition = 2,
    Event = 3,
    Commit = 4,
    Seal = 5,
    Tombstone = 6,
    /// A row entry (F-02-20, F-06-30): several consecutive events of one session.
    RowEntry = 7,
}

impl Kind {
    pub fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            1 => Some(Kind::SessionHeader),
            2 => Some(Kind::TypeDefinition),
            3 => Some(Kind::Event),
            4 => Some(Kind::Commit),
            5 => Some(Kind::Seal),
            6 => Some(Kind::Tombstone),
            7 => Some(Kind::RowEntry),
            _ => None,
        }
    }
}

/// Why bytes do not form a valid frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header or the payload length needs.
    Incomplete,
    /// All twelve header bytes are zero: unwritten space.
    Zero,
    /// Reserved bits set, or a length above the limit.
    BadHeader,
    /// The checksum does not match.
    BadChecksum,
    /// The payload does not match its kind's layout.
    BadPayload(&'static str),
}

/// A frame whose checksum matched.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub kind: u8,
    pub flags: u8,
    pub payload: &'a [u8],
    /// Header plus payload, in bytes.
    pub total_bytes: usize,
}

/// A decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A session's header. A fork names the session whose first `seed_length` events it
    /// shares (read from the parent, never copied); `seed_parent` is [`NO_SEED_PARENT`] else.
    SessionHeader {
        session: u32,
        seed_parent: u32,
        seed_length: u64,
        header_json: &'a [u8],
    },
    TypeDefinition {
        type_number: u32,
        name: &'a [u8],
    },
    Event(EventRecord<'a>),
    Commit {
        session: u32,
        first_seq: u64,
        event_count: u32,
        durable_offset: u64,
    },
    Seal {
        used_bytes: u64,
        durable_offset: u64,
    },
    /// The session is deleted (F-02-18): it is gone from listings and reads; its events
    /// are dropped at the next sealing except the prefix a live fork still reads.
    Tombstone {
        session: u32,
    },
    /// Consecutive events of one session as one row entry (F-02-20, F-06-30).
    Row(RowEntry<'a>),
}

/// The event record payload (F-02-10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRecord<'a> {
    pub session: u32,
    pub seq: u64,
    pub time: i64,
    pub type_number: u32,
    pub flags: u8,
    pub data: &'a [u8],
    pub envelope: &'a [u8],
}

/// The checksum of a frame: crc32 over the salt and the frame from its length field on.
pub fn checksum(salt: u64, frame_after_checksum: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&salt.to_le_bytes());
    hasher.update(frame_after_checksum);
    hasher.finalize()
}

/// A payload field past the end of its payload: the payload does not match its layout.
impl From<ShortInput> for FrameError {
    fn from(short: ShortInput) -> Self {
        FrameError::BadPayload(short.field)
    }
}

/// A header field of a frame whose header is known to be whole.
fn header_u32(bytes: &[u8], offset: usize, field: &'static str) -> Result<u32, FrameError> {
    u32_at(bytes, offset, field).map_err(|_| FrameError::Incomplete)
}

/// Decodes the frame at the start of `bytes`.
pub fn decode_frame(bytes: &[u8], salt: u64) -> Result<Frame<'_>, FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete);
    }
    if bytes[..FRAME_HEADER_BYTES].iter().all(|byte| *byte == 0) {
        return Err(FrameError::Zero);
    }
    let frame = frame_after_checksum(bytes)?;
    if checksum(salt, &bytes[4..frame.total_bytes]) != header_u32(bytes, 0, "frame checksum")? {
        return Err(FrameError::BadChecksum);
    }
    Ok(frame)
}

/// Decodes a frame inside a run block (format-spec F-06-13): its checksum field must be
/// zero and is not a checksum; the block's checksums cover the frame instead.
pub fn decode_run_frame(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete);
    }
    if header_u32(bytes, 0, "frame checksum")? != 0 {
        return Err(FrameError::BadHeader);
    }
    frame_after_checksum(bytes)
}

/// What a reader that skips frames needs of one: its length, and the session of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramePeek {
    /// Header plus payload, in bytes.
    pub total_bytes: usize,
    /// The record kind byte.
    pub kind: u8,
    /// The session an event frame names; `None` for other kinds.
    pub event_session: Option<u32>,
}

/// Reads the header of the frame at the start of `bytes` (either form) without checking a
/// checksum: for frames a reader steps over. A frame it then uses is decoded in full.
pub fn peek_frame(bytes: &[u8]) -> Result<FramePeek, FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete);
    }
    let frame = frame_after_checksum(bytes)?;
    let event_session = (frame.kind == Kind::Event as u8)
        .then(|| u32_at(frame.payload, 0, "event session").ok())
        .flatten();
    Ok(FramePeek {
        total_bytes: frame.total_bytes,
        kind: frame.kind,
        event_session,
    })
}

/// The header checks both frame forms share (length, flags, reserved bytes) and the frame
/// they delimit; the caller has checked that `bytes` holds a whole header.
fn frame_after_checksum(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    let length = u32_to_usize(header_u32(bytes, 4, "frame length")?);
    let flags = bytes[9];
    if length > MAX_PAYLOAD_BYTES
        || flags & !FLAG_SKIPPABLE != 0
        || bytes[10] != 0
        || bytes[11] != 0
    {
        return Err(FrameError::BadHeader);
    }
    let total_bytes = FRAME_HEADER_BYTES + length;
    if bytes.len() < total_bytes {
        return Err(FrameError::Incomplete);
    }
    Ok(Frame {
        kind: bytes[8],
        flags,
        payload: &bytes[FRAME_HEADER_BYTES..total_bytes],
        total_bytes,
    })
}

/// Appends one frame to `out`. A payload above [`MAX_PAYLOAD_BYTES`] is `TooLarge` and
/// appends nothing (callers check their limits first; this keeps a bug from writing a frame
/// no reader accepts).
pub fn encode_frame(
    out: &mut Vec<u8>,
    salt: u64,
    kind: u8,
    flags: u8,
    payload_parts: &[&[u8]],
) -> EngineResult<()> {
    let start = out.len();
    let length: usize = payload_parts.iter().map(|part| part.len()).sum();
    if length > MAX_PAYLOAD_BYTES {
        return Err(Error::TooLarge {
            what: "record payload",
            unit: "bytes",
            size: widen(length),
            limit: widen(MAX_PAYLOAD_BYTES),
        });
    }
    let length_field = checked_u32(length, "record payload")?;
    let mut writer = Writer::new(out);
    writer.u32(0).u32(length_field).u8(kind).u8(flags).u16(0);
    for part in payload_parts {
        writer.bytes(part);
    }
    let sum = checksum(salt, &out[start + 4..]);
    out[start..start + 4].copy_from_slice(&sum.to_le_bytes());
    Ok(())
}

pub use crate::limits::EVENT_FIXED_BYTES;

impl<'a> Record<'a> {
    /// Decodes a frame's payload by kind. `Ok(None)` for an unknown kind.
    pub fn decode(frame: &Frame<'a>) -> Result<Option<Record<'a>>, FrameError> {
        let payload = frame.payload;
        let mut reader = Reader::new(payload);
        let Some(kind) = Kind::from_byte(frame.kind) else {
            return Ok(None);
        };
        let need = |bytes: usize, what: &'static str| {
            if payload.len() < bytes {
                Err(FrameError::BadPayload(what))
            } else {
                Ok(())
            }
        };
        let exact = |bytes: usize, what: &'static str| {
            if payload.len() != bytes {
                Err(FrameError::BadPayload(what))
            } else {
                Ok(())
            }
        };
        let record = match kind {
            Kind::SessionHeader => {
                need(
                    SESSION_HEADER_FIXED_BYTES,
                    "session header shorter than its fixed fields",
                )?;
                Record::SessionHeader {
                    session: reader.u32("session header session")?,
                    seed_parent: reader.u32("session header seed parent")?,
                    seed_length: reader.u64("session header seed length")?,
                    header_json: reader.rest(),
                }
            }
            Kind::TypeDefinition => {
                need(4, "type definition shorter than 4 bytes")?;
                Record::TypeDefinition {
                    type_number: reader.u32("type definition number")?,
                    name: reader.rest(),
                }
            }
            Kind::Event => Record::Event(decode_event(payload)?),
            Kind::Commit => {
                exact(24, "commit payload is not 24 bytes")?;
                Record::Commit {
                    session: reader.u32("commit session")?,
                    first_seq: reader.u64("commit first seq")?,
                    event_count: reader.u32("commit event count")?,
                    durable_offset: reader.u64("commit durable offset")?,
                }
            }
            Kind::Seal => {
                exact(16, "seal payload is not 16 bytes")?;
                Record::Seal {
                    used_bytes: reader.u64("seal used bytes")?,
                    durable_offset: reader.u64("seal durable offset")?,
                }
            }
            Kind::Tombstone => {
                exact(TOMBSTONE_PAYLOAD_BYTES, "tombstone payload is not 4 bytes")?;
                Record::Tombstone {
                    session: reader.u32("tombstone session")?,
                }
            }
            Kind::RowEntry => Record::Row(
                RowEntry::decode(payload).map_err(|error| FrameError::BadPayload(error.0))?,
            ),
        };
        Ok(Some(record))
    }

    /// Appends this record as one frame (`TooLarge` if it does not fit one).
    pub fn encode(&self, out: &mut Vec<u8>, salt: u64) -> EngineResult<()> {
        match self {
            Record::SessionHeader {
                session,
                seed_parent,
                seed_length,
                header_json,
            } => encode_frame(
                out,
                salt,
                Kind::SessionHeader as u8,
                0,
                &[
                    &session.to_le_bytes(),
                    &seed_parent.to_le_bytes(),
                    &seed_length.to_le_bytes(),
                    header_json,
                ],
            ),
            Record::TypeDefinition { type_number, name } => encode_frame(
                out,
                salt,
                Kind::TypeDefinition as u8,
                0,
                &[&type_number.to_le_bytes(), name],
            ),
            Record::Event(event) => event.encode(out, salt),
            Record::Commit {
                session,
                first_seq,
                event_count,
                durable_offset,
            } => encode_frame(
                out,
                salt,
                Kind::Commit as u8,
                0,
                &[
                    &session.to_le_bytes(),
                    &first_seq.to_le_bytes(),
                    &event_count.to_le_bytes(),
                    &durable_offset.to_le_bytes(),
                ],
            ),
            Record::Seal {
                used_bytes,
                durable_offset,
            } => encode_frame(
                out,
                salt,
                Kind::Seal as u8,
                0,
                &[&used_bytes.to_le_bytes(), &durable_offset.to_le_bytes()],
            ),
            Record::Tombstone { session } => encode_frame(
                out,
                salt,
                Kind::Tombstone as u8,
                0,
                &[&session.to_le_bytes()],
            ),
            Record::Row(entry) => entry.encode(out, salt),
        }
    }
}

fn decode_event(payload: &[u8]) -> Result<EventRecord<'_>, FrameError> {
    if payload.len() < EVENT_FIXED_BYTES {
        return Err(FrameError::BadPayload(
            "event shorter than its fixed fields",
        ));
    }
    let mut reader = Reader::new(payload);
    let session = reader.u32("event session")?;
    let seq = reader.u64("event seq")?;
    let time = reader.i64("event time")?;
    let type_number = reader.u32("event type number")?;
    let flags = reader.u8("event flags")?;
    if flags & !KNOWN_EVENT_FLAGS != 0 {
        return Err(FrameError::BadPayload("unknown event flags"));
    }
    let data_length = u32_to_usize(reader.u32("event data length")?);
    let data = reader
        .bytes(data_length, "event data")
        .map_err(|_| FrameError::BadPayload("event data length past the payload"))?;
    Ok(EventRecord {
        session,
        seq,
        time,
        type_number,
        flags,
        data,
        envelope: reader.rest(),
    })
}

impl EventRecord<'_> {
    /// Payload size of this event in bytes.
    pub fn payload_bytes(&self) -> usize {
        EVENT_FIXED_BYTES + self.data.len() + self.envelope.len()
    }

    /// Appends this event as one frame (`TooLarge` if it does not fit one).
    pub fn encode(&self, out: &mut Vec<u8>, salt: u64) -> EngineResult<()> {
        let data_length = checked_u32(self.data.len(), "event data")?;
        encode_frame(
            out,
            salt,
            Kind::Event as u8,
            0,
            &[
                &self.session.to_le_bytes(),
                &self.seq.to_le_bytes(),
                &self.time.to_le_bytes(),
                &self.type_number.to_le_bytes(),
                &[self.flags],
                &data_length.to_le_bytes(),
                self.data,
                self.envelope,
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_event() -> EventRecord<'static> {
        EventRecord {
            session: 7,
            seq: 42,
            time: -5,
            type_number: 3,
            flags: 0,
            data: br#"{"text":"hi"}"#,
            envelope: br#""surfaceOp":"append""#,
        }
    }

    #[test]
    fn every_record_kind_round_trips() {
        let records = [
            Record::SessionHeader {
                session: 1,
                seed_parent: NO_SEED_PARENT,
                seed_length: 0,
                header_json: br#"{"version":0,"id":"a","createdAt":1}"#,
            },
            Record::TypeDefinition {
                type_number: 9,
                name: b"assistant/chunk",
            },
            Record::Event(sample_event()),
            Record::Commit {
                session: 1,
                first_seq: 10,
                event_count: 3,
                durable_offset: 4096,
            },
            Record::Seal {
                used_bytes: 100,
                durable_offset: 100,
            },
            Record::Tombstone { session: 12 },
        ];
        for record in records {
            let mut bytes = Vec::new();
            record.encode(&mut bytes, 99).expect("encode");
            let frame = decode_frame(&bytes, 99).expect("valid frame");
            assert_eq!(frame.total_bytes, bytes.len());
            let decoded = Record::decode(&frame).expect("valid payload");
            assert_eq!(decoded, Some(record));
        }
    }

    #[test]
    fn a_frame_checked_with_another_salt_fails() {
        let mut bytes = Vec::new();
        Record::Event(sample_event())
            .encode(&mut bytes, 1)
            .expect("encode");
        assert_eq!(
            decode_frame(&bytes, 2).map(|frame| frame.total_bytes),
            Err(FrameError::BadChecksum)
        );
    }

    #[test]
    fn every_single_byte_flip_is_detected() {
        let mut bytes = Vec::new();
        Record::Event(sample_event())
            .encode(&mut bytes, 5)
            .expect("encode");
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x40;
            let outcome = decode_frame(&damaged, 5);
            assert!(outcome.is_err(), "flip at {index} went unnoticed");
        }
    }

    #[test]
    fn a_payload_above_the_limit_is_too_large_and_appends_nothing() {
        let mut out = vec![7u8];
        let data = vec![b'x'; MAX_PAYLOAD_BYTES];
        let event = EventRecord {
            data: &data,
            ..sample_event()
        };
        let outcome = Record::Event(event).encode(&mut out, 1);
        assert!(
            matches!(
                outcome,
                Err(Error::TooLarge { what: "record payload", unit: "bytes", size, limit })
                    if size == (MAX_PAYLOAD_BYTES + EVENT_FIXED_BYTES + event.envelope.len()) as u64
                        && limit == MAX_PAYLOAD_BYTES as u64
            ),
            "{outcome:?}"
        );
        assert_eq!(out, [7], "nothing appended");
        let at_limit = vec![b'x'; MAX_PAYLOAD_BYTES];
        encode_frame(&mut out, 1, Kind::Event as u8, 0, &[&at_limit]).expect("at the limit");
        assert_eq!(out.len(), 1 + FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES);
    }

    #[test]
    fn zero_and_short_inputs_are_told_apart() {
        assert_eq!(
            decode_frame(&[0; 12], 0).map(|frame| frame.kind),
            Err(FrameError::Zero)
        );
        assert_eq!(
            decode_frame(&[1; 5], 0).map(|frame| frame.kind),
            Err(FrameError::Incomplete)
        );
    }
}
