//! What fleet mode puts on the wire and in objects: tail messages, sealed run objects, and the
//! JSON records kept in KV. Normative text: `format-spec/09-fleet.md`.
//!
//! Every event travels as a checksummed record (CRC-32 of its body), so a bit flip in a NATS
//! replica or an S3 object is detected on rebuild, whatever the transport did.

use crate::error::{FleetError, FleetResult};
use dshdb::Event;
use serde::{Deserialize, Serialize};

/// First bytes of a tail message payload.
pub const TAIL_MAGIC: [u8; 4] = *b"DSHT";
/// First bytes of a sealed run object.
pub const RUN_MAGIC: [u8; 4] = *b"DSHR";
/// Magic of a group tail message: several sessions' commit batches of one shard
/// (format-spec/09-fleet.md F-09-23).
pub const TAIL_GROUP_MAGIC: [u8; 4] = *b"DSHG";
/// Most batches a group tail message may hold (a reader refuses more).
pub const MAX_GROUP_BATCHES: usize = 4096;
/// Version of both binary layouts.
pub const WIRE_VERSION: u8 = 1;
/// Largest session id, in bytes (it is part of NATS subjects and S3 keys).
pub const MAX_SESSION_ID_BYTES: usize = 200;
/// Largest record body accepted when decoding, in bytes (NATS `max_payload` is 1 MiB; runs
/// hold records of at most the same size).
pub const MAX_RECORD_BODY_BYTES: usize = 1024 * 1024;
/// Largest decompressed run object body, in bytes (bounds memory on a damaged object).
pub const MAX_RUN_BODY_BYTES: usize = 512 * 1024 * 1024;
/// zstd level of run objects.
pub const RUN_ZSTD_LEVEL: i32 = 3;
/// Fixed bytes of a record body before its three texts.
const RECORD_FIXED_BYTES: usize = 8 + 8 + 1 + 4 * 3;
/// A record's `body_len u32 | crc32 u32` before its body.
const RECORD_PREFIX_BYTES: usize = 4 + 4;

/// A tail message: one commit batch of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailBatch {
    pub session: String,
    pub epoch: u64,
    pub events: Vec<Event>,
}

/// A group tail message: commit batches of distinct sessions of one shard, written under one
/// epoch, stored as one message on the shard's group subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailGroup {
    pub shard: u32,
    pub epoch: u64,
    pub batches: Vec<TailBatch>,
}

/// A sealed run object: a session's events `first_seq..=last_seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunObject {
    pub session: String,
    pub events: Vec<Event>,
}

/// `KV DSH_SESSIONS/<key>`: where a session's history lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionManifest {
    pub format: u32,
    pub session: String,
    pub shard: u32,
    /// The session's DSH header, verbatim.
    pub header: String,
    /// The shard epoch of the last node that wrote this manifest; a node with a lower epoch
    /// may not change it (that is how a zombie's seal is fenced).
    pub epoch: u64,
    /// Events below this seq are in `runs` (0: nothing sealed).
    pub sealed_end: u64,
    /// Tail messages of this session at stream sequences below this one are sealed and may
    /// have been purged; replay starts here.
    pub tail_from_stream_seq: u64,
    pub runs: Vec<RunRef>,
    /// The last acknowledged tail position the owner recorded (at each seal, and by its
    /// heartbeat for sessions whose tail moved): a rebuild must reach it, so a replica that
    /// silently drops a session's last messages cannot shorten the history below it.
    /// Absent in manifests written before it existed (F-09-42).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_checkpoint: Option<TailCheckpoint>,
}

/// An acknowledged tail position: seqs below `end_seq` are acknowledged, the last of them
/// in the tail message at stream sequence `stream_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TailCheckpoint {
    pub end_seq: u64,
    pub stream_seq: u64,
}

/// One sealed run named by a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRef {
    pub key: String,
    pub first_seq: u64,
    pub last_seq: u64,
    pub bytes: u64,
    /// blake3 of the whole object, hex.
    pub blake3: String,
}

/// `KV DSH_SHARDS/<shard>`: who owns a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub owner: String,
    pub generation: u64,
    pub epoch: u64,
    /// Stream sequence of the owner's epoch marker: its fence token.
    pub fence_seq: u64,
}

/// `KV DSH_NODES/<node>`: a live node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub addr: String,
    pub generation: u64,
    pub started_at_ms: u64,
}

/// Payload of an epoch marker on `dsh.<k>.<shard>.e`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochMarker {
    pub epoch: u64,
    pub owner: String,
    pub generation: u64,
}

/// Encodes a JSON record kept in KV or an object.
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail (no maps with non-string keys).
    serde_json::to_vec(value).unwrap_or_default()
}

/// Decodes a JSON record, naming what it was on failure.
pub fn from_json<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &'static str) -> FleetResult<T> {
    serde_json::from_slice(bytes).map_err(|error| FleetError::Corrupt {
        what,
        reason: error.to_string(),
    })
}

fn corrupt(what: &'static str, reason: impl Into<String>) -> FleetError {
    FleetError::Corrupt {
        what,
        reason: reason.into(),
    }
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&len_u32(text.len()).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// A length as the u32 the layout stores. Records are bounded far below 4 GiB by
/// [`MAX_RECORD_BODY_BYTES`] before they are encoded, so saturating never happens in practice.
fn len_u32(length: usize) -> u32 {
    u32::try_from(length).unwrap_or(u32::MAX)
}

/// Appends one record: `body_len u32 | crc32 u32 | body`. The body is written in place
/// and its length and CRC filled in after (no body buffer per event).
fn put_record(out: &mut Vec<u8>, event: &Event) {
    let start = out.len();
    out.reserve(RECORD_PREFIX_BYTES + record_body_bytes(event));
    out.extend_from_slice(&[0; RECORD_PREFIX_BYTES]);
    let body_start = out.len();
    out.extend_from_slice(&event.seq.to_le_bytes());
    out.extend_from_slice(&event.time.to_le_bytes());
    out.push(event.flags);
    put_text(out, &event.event_type);
    put_text(out, &event.data);
    put_text(out, &event.envelope);
    let body = &out[body_start..];
    let length = len_u32(body.len()).to_le_bytes();
    let crc = crc32fast::hash(body).to_le_bytes();
    out[start..start + 4].copy_from_slice(&length);
    out[start + 4..body_start].copy_from_slice(&crc);
}

/// The bytes of `event`'s record body.
fn record_body_bytes(event: &Event) -> usize {
    RECORD_FIXED_BYTES + event.event_type.len() + event.data.len() + event.envelope.len()
}

/// A cursor over bytes that fails with a typed error instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    fn take(&mut self, count: usize) -> FleetResult<&'a [u8]> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| corrupt(self.what, format!("truncated at byte {}", self.at)))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> FleetResult<[u8; N]> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> FleetResult<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> FleetResult<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> FleetResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> FleetResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> FleetResult<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn usize_from_u32(&mut self) -> FleetResult<usize> {
        usize::try_from(self.u32()?).map_err(|_| corrupt(self.what, "length exceeds usize"))
    }

    fn text(&mut self) -> FleetResult<String> {
        let length = self.usize_from_u32()?;
        let bytes = self.take(length)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| corrupt(self.what, "text is not UTF-8"))
    }

    fn done(&self) -> bool {
        self.at == self.bytes.len()
    }

    fn record(&mut self) -> FleetResult<Event> {
        let length = self.usize_from_u32()?;
        if length > MAX_RECORD_BODY_BYTES {
            return Err(corrupt(self.what, format!("record of {length} bytes")));
        }
        let crc = self.u32()?;
        let body = self.take(length)?;
        if crc32fast::hash(body) != crc {
            return Err(corrupt(self.what, "record checksum mismatch"));
        }
        let mut inner = Reader::new(body, self.what);
        let event = Event {
            seq: inner.u64()?,
            time: inner.i64()?,
            flags: inner.u8()?,
            event_type: inner.text()?,
            data: inner.text()?,
            envelope: inner.text()?,
        };
        if !inner.done() {
            return Err(corrupt(self.what, "bytes after a record's fields"));
        }
        Ok(event)
    }
}

/// Checks that `events` hold contiguous seqs from `first`; names the first gap.
pub fn check_contiguous(events: &[Event], first: u64, what: &'static str) -> FleetResult<()> {
    for (offset, event) in events.iter().enumerate() {
        let expected = first + offset as u64;
        if event.seq != expected {
            return Err(corrupt(
                what,
                format!("seq {} where {expected} was expected", event.seq),
            ));
        }
    }
    Ok(())
}

/// The fixed bytes of [`put_header`]: magic, version, session length, first seq, count.
const TAIL_HEADER_BYTES: usize = 4 + 1 + 2 + 8 + 4;

fn put_header(out: &mut Vec<u8>, magic: [u8; 4], session: &str, first_seq: u64, count: usize) {
    out.extend_from_slice(&magic);
    out.push(WIRE_VERSION);
    let session_length = u16::try_from(session.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&session_length.to_le_bytes());
    out.extend_from_slice(session.as_bytes());
    out.extend_from_slice(&first_seq.to_le_bytes());
    out.extend_from_slice(&len_u32(count).to_le_bytes());
}

/// What a payload's header says: session, first seq, record count.
fn read_header(reader: &mut Reader<'_>, magic: [u8; 4]) -> FleetResult<(String, u64, usize)> {
    if reader.array::<4>()? != magic {
        return Err(corrupt(reader.what, "bad magic"));
    }
    let version = reader.u8()?;
    if version != WIRE_VERSION {
        return Err(corrupt(reader.what, format!("unknown version {version}")));
    }
    let session_length = usize::from(reader.u16()?);
    let session = String::from_utf8(reader.take(session_length)?.to_vec())
        .map_err(|_| corrupt(reader.what, "session id is not UTF-8"))?;
    let first_seq = reader.u64()?;
    let count = reader.usize_from_u32()?;
    Ok((session, first_seq, count))
}

fn read_records(reader: &mut Reader<'_>, first_seq: u64, count: usize) -> FleetResult<Vec<Event>> {
    let mut events = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        events.push(reader.record()?);
    }
    if !reader.done() {
        return Err(corrupt(reader.what, "bytes after the last record"));
    }
    check_contiguous(&events, first_seq, reader.what)?;
    Ok(events)
}

impl TailBatch {
    /// The first seq (the batch is never empty).
    pub fn first_seq(&self) -> u64 {
        self.events.first().map_or(0, |event| event.seq)
    }

    /// One past the last seq.
    pub fn end_seq(&self) -> u64 {
        self.events.last().map_or(0, |event| event.seq + 1)
    }

    /// `DSHT | version | session | first_seq | count | epoch u64 | records`.
    pub fn encode(&self) -> Vec<u8> {
        let records: usize = self
            .events
            .iter()
            .map(|event| RECORD_PREFIX_BYTES + record_body_bytes(event))
            .sum();
        let mut out = Vec::with_capacity(TAIL_HEADER_BYTES + self.session.len() + 8 + records);
        put_header(
            &mut out,
            TAIL_MAGIC,
            &self.session,
            self.first_seq(),
            self.events.len(),
        );
        out.extend_from_slice(&self.epoch.to_le_bytes());
        for event in &self.events {
            put_record(&mut out, event);
        }
        out
    }

    /// Decodes and checks a payload: magic, version, every record's CRC, contiguous seqs.
    pub fn decode(bytes: &[u8]) -> FleetResult<TailBatch> {
        let mut reader = Reader::new(bytes, "tail message");
        let (session, first_seq, count) = read_header(&mut reader, TAIL_MAGIC)?;
        let epoch = reader.u64()?;
        if count == 0 {
            return Err(corrupt("tail message", "no records"));
        }
        let events = read_records(&mut reader, first_seq, count)?;
        Ok(TailBatch {
            session,
            epoch,
            events,
        })
    }
}

impl TailGroup {
    /// `DSHG | version | shard u32 | epoch u64 | count u32 | count × (len u32 | DSHT
    /// message)`, from the batches' encoded `DSHT` messages (as published alone).
    pub fn encode_from(shard: u32, epoch: u64, encoded_batches: &[&[u8]]) -> Vec<u8> {
        let inner: usize = encoded_batches.iter().map(|batch| 4 + batch.len()).sum();
        let mut out = Vec::with_capacity(4 + 1 + 4 + 8 + 4 + inner);
        out.extend_from_slice(&TAIL_GROUP_MAGIC);
        out.push(WIRE_VERSION);
        out.extend_from_slice(&shard.to_le_bytes());
        out.extend_from_slice(&epoch.to_le_bytes());
        out.extend_from_slice(&len_u32(encoded_batches.len()).to_le_bytes());
        for batch in encoded_batches {
            out.extend_from_slice(&len_u32(batch.len()).to_le_bytes());
            out.extend_from_slice(batch);
        }
        out
    }

    /// Decodes and checks a group: magic, version, 1..=[`MAX_GROUP_BATCHES`] batches each
    /// checked as [`TailBatch::decode`] does, each of the group's epoch, no session twice,
    /// no bytes after the last batch.
    pub fn decode(bytes: &[u8]) -> FleetResult<TailGroup> {
        let what = "group tail message";
        let mut reader = Reader::new(bytes, what);
        if reader.array::<4>()? != TAIL_GROUP_MAGIC {
            return Err(corrupt(what, "bad magic"));
        }
        let version = reader.u8()?;
        if version != WIRE_VERSION {
            return Err(corrupt(what, format!("unknown version {version}")));
        }
        let shard = reader.u32()?;
        let epoch = reader.u64()?;
        let count = reader.usize_from_u32()?;
        if count == 0 || count > MAX_GROUP_BATCHES {
            return Err(corrupt(what, format!("{count} batches")));
        }
        let mut batches: Vec<TailBatch> = Vec::with_capacity(count);
        let mut sessions = std::collections::HashSet::with_capacity(count);
        for _ in 0..count {
            let length = reader.usize_from_u32()?;
            let batch = TailBatch::decode(reader.take(length)?)?;
            if batch.epoch != epoch {
                return Err(corrupt(what, "a batch of another epoch"));
            }
            if !sessions.insert(batch.session.clone()) {
                return Err(corrupt(what, format!("session {} twice", batch.session)));
            }
            batches.push(batch);
        }
        if !reader.done() {
            return Err(corrupt(what, "bytes after the last batch"));
        }
        Ok(TailGroup {
            shard,
            epoch,
            batches,
        })
    }
}

/// Decodes a tail message of either form: a single batch (`DSHT`, F-09-20) or a group
/// (`DSHG`, F-09-23). Readers accept both; a writer sends a single batch alone.
pub fn decode_tail_message(bytes: &[u8]) -> FleetResult<Vec<TailBatch>> {
    if bytes.starts_with(&TAIL_GROUP_MAGIC) {
        Ok(TailGroup::decode(bytes)?.batches)
    } else {
        Ok(vec![TailBatch::decode(bytes)?])
    }
}

impl RunObject {
    /// `DSHR | version | session | first_seq | count | zstd(records)`.
    pub fn encode(&self) -> FleetResult<Vec<u8>> {
        let mut records = Vec::new();
        for event in &self.events {
            put_record(&mut records, event);
        }
        let compressed = zstd::bulk::compress(&records, RUN_ZSTD_LEVEL)
            .map_err(|error| corrupt("run object", format!("zstd: {error}")))?;
        let first_seq = self.events.first().map_or(0, |event| event.seq);
        let mut out = Vec::with_capacity(compressed.len() + 64);
        put_header(
            &mut out,
            RUN_MAGIC,
            &self.session,
            first_seq,
            self.events.len(),
        );
        out.extend_from_slice(&len_u32(records.len()).to_le_bytes());
        out.extend_from_slice(&compressed);
        Ok(out)
    }

    /// Decodes and checks an object: magic, version, every record's CRC, contiguous seqs.
    pub fn decode(bytes: &[u8]) -> FleetResult<RunObject> {
        let mut reader = Reader::new(bytes, "run object");
        let (session, first_seq, count) = read_header(&mut reader, RUN_MAGIC)?;
        let raw_length = reader.usize_from_u32()?;
        if raw_length > MAX_RUN_BODY_BYTES {
            return Err(corrupt("run object", format!("body of {raw_length} bytes")));
        }
        let compressed = reader.take(bytes.len() - reader.at)?;
        let records = zstd::bulk::decompress(compressed, raw_length)
            .map_err(|error| corrupt("run object", format!("zstd: {error}")))?;
        if records.len() != raw_length {
            return Err(corrupt("run object", "body length mismatch"));
        }
        let mut inner = Reader::new(&records, "run object");
        let events = read_records(&mut inner, first_seq, count)?;
        Ok(RunObject { session, events })
    }
}

/// blake3 of `bytes`, hex.
pub fn blake3_hex(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, data: &str) -> Event {
        Event {
            seq,
            time: 1_700_000_000_000 + seq as i64,
            event_type: "user/message".to_string(),
            data: data.to_string(),
            envelope: "\"surfaceOp\":\"append\"".to_string(),
            flags: 0,
        }
    }

    #[test]
    fn tail_batch_round_trips_and_detects_every_flipped_byte() {
        let batch = TailBatch {
            session: "s-1".to_string(),
            epoch: 7,
            events: vec![event(4, "{\"a\":1}"), event(5, "[1e+21]")],
        };
        let bytes = batch.encode();
        assert_eq!(TailBatch::decode(&bytes).ok(), Some(batch.clone()));
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x40;
            let decoded = TailBatch::decode(&damaged);
            // A flip in the header may still decode (the session id or epoch changes), but it
            // never yields the original batch, and record damage is always an error.
            assert_ne!(decoded.ok(), Some(batch.clone()), "flip at byte {index}");
        }
        for cut in 0..bytes.len() {
            assert!(TailBatch::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn tail_group_round_trips_and_detects_every_flipped_byte() {
        let batches = vec![
            TailBatch {
                session: "s-1".to_string(),
                epoch: 3,
                events: vec![event(4, "{\"a\":1}"), event(5, "[]")],
            },
            TailBatch {
                session: "s-2".to_string(),
                epoch: 3,
                events: vec![event(0, "{}")],
            },
        ];
        let encoded: Vec<Vec<u8>> = batches.iter().map(TailBatch::encode).collect();
        let slices: Vec<&[u8]> = encoded.iter().map(Vec::as_slice).collect();
        let bytes = TailGroup::encode_from(9, 3, &slices);
        let group = TailGroup {
            shard: 9,
            epoch: 3,
            batches: batches.clone(),
        };
        assert_eq!(TailGroup::decode(&bytes).ok(), Some(group.clone()));
        assert_eq!(decode_tail_message(&bytes).ok(), Some(batches.clone()));
        // The single form still decodes through the same entry point.
        assert_eq!(
            decode_tail_message(&encoded[0]).ok(),
            Some(vec![batches[0].clone()])
        );
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x40;
            assert_ne!(
                TailGroup::decode(&damaged).ok(),
                Some(group.clone()),
                "flip at byte {index}"
            );
        }
        for cut in 0..bytes.len() {
            assert!(TailGroup::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let twice = TailGroup::encode_from(9, 3, &[slices[0], slices[0]]);
        assert!(matches!(
            TailGroup::decode(&twice),
            Err(FleetError::Corrupt { .. })
        ));
        let other_epoch = TailGroup::encode_from(9, 4, &slices);
        assert!(matches!(
            TailGroup::decode(&other_epoch),
            Err(FleetError::Corrupt { .. })
        ));
    }

    #[test]
    fn run_object_round_trips_and_rejects_gaps() {
        let run = RunObject {
            session: "s-2".to_string(),
            events: (0..50).map(|seq| event(seq, "{}")).collect(),
        };
        let bytes = run.encode().expect("encodes");
        assert_eq!(RunObject::decode(&bytes).ok(), Some(run.clone()));
        let gap = RunObject {
            session: "s-2".to_string(),
            events: vec![event(0, "{}"), event(2, "{}")],
        };
        let gap_bytes = gap.encode().expect("encodes");
        assert!(matches!(
            RunObject::decode(&gap_bytes),
            Err(FleetError::Corrupt { .. })
        ));
    }
}
