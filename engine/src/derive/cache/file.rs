//! Checkpoint files: names, byte layout, checksum (format-spec/07, F-07-1..F-07-5).

use crate::error::{Error, Result};
use crate::storage::coding::{checked_u16, Reader, Writer};
use crate::storage::io::Storage;
use crate::store::Event;

/// The cache directory inside the store.
pub const CACHE_DIR: &str = "cache";
/// First bytes of every checkpoint file.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"DSHDBPC1";
/// Version of the checkpoint layout (not of a unit's state).
pub const CHECKPOINT_FORMAT_VERSION: u16 = 1;
pub use crate::limits::MAX_CACHE_CHECKPOINT_BYTES as MAX_CHECKPOINT_BYTES;
/// Bytes of a blake3 digest (identity, anchor, checksum).
const DIGEST_BYTES: usize = 32;
/// Checkpoint file suffix.
const CHECKPOINT_SUFFIX: &str = ".ckpt";
/// Suffix of a checkpoint being written.
const TEMP_SUFFIX: &str = ".tmp";

/// One decoded checkpoint, borrowing the file's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint<'bytes> {
    pub unit: &'bytes str,
    pub state_version: u32,
    /// Events folded into the state: the next seq to fold.
    pub seq: u64,
    /// blake3 of the session id and its header (F-07-3).
    pub identity: [u8; DIGEST_BYTES],
    /// blake3 of the last folded event (seq − 1), all zeros when `seq` is 0 (F-07-4).
    pub anchor: [u8; DIGEST_BYTES],
    pub state: &'bytes [u8],
}

/// `cache/<first 32 hex digits of blake3(session id)>` (F-07-1).
pub fn session_cache_dir(session: &str) -> String {
    let digest = blake3::hash(session.as_bytes()).to_hex();
    format!("{CACHE_DIR}/{}", &digest[..32])
}

/// `<unit>-v<state version>-<seq, 20 digits>.ckpt` (F-07-1).
pub fn checkpoint_file_name(unit: &str, state_version: u32, seq: u64) -> String {
    format!("{unit}-v{state_version}-{seq:020}{CHECKPOINT_SUFFIX}")
}

/// Parses [`checkpoint_file_name`]; `None` for any other name.
pub(crate) fn parse_file_name(name: &str) -> Option<(String, u32, u64)> {
    let stem = name.strip_suffix(CHECKPOINT_SUFFIX)?;
    let (rest, seq) = stem.rsplit_once('-')?;
    let (unit, version) = rest.rsplit_once("-v")?;
    if seq.len() != 20 {
        return None;
    }
    Some((unit.to_owned(), version.parse().ok()?, seq.parse().ok()?))
}

/// blake3 over the session id, a zero byte and the header JSON text.
pub(crate) fn identity_of(session: &str, header_json: &str) -> [u8; DIGEST_BYTES] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(session.as_bytes());
    hasher.update(&[0]);
    hasher.update(header_json.as_bytes());
    *hasher.finalize().as_bytes()
}

/// blake3 over an event's seq, time, type, data, envelope and flags.
pub(crate) fn anchor_of(event: &Event) -> [u8; DIGEST_BYTES] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&event.seq.to_le_bytes());
    hasher.update(&event.time.to_le_bytes());
    for field in [&event.event_type, &event.data, &event.envelope] {
        hasher.update(&(field.len() as u64).to_le_bytes());
        hasher.update(field.as_bytes());
    }
    hasher.update(&[event.flags]);
    *hasher.finalize().as_bytes()
}

pub(crate) fn cache_error(path: &str, reason: &str) -> Error {
    Error::CorruptFile {
        file: path.to_owned(),
        reason: reason.to_owned(),
    }
}

/// The checkpoint's bytes (F-07-2): magic, layout version u16, unit name (u16 length),
/// state version u32, seq u64, identity, anchor, state (u64 length), then blake3 of all
/// preceding bytes. Integers little-endian.
pub fn encode_checkpoint(checkpoint: &Checkpoint<'_>) -> Result<Vec<u8>> {
    let unit_length = checked_u16(checkpoint.unit.len(), "projection unit name")?;
    let mut out = Vec::with_capacity(checkpoint.state.len() + 160);
    Writer::new(&mut out)
        .bytes(&CHECKPOINT_MAGIC)
        .u16(CHECKPOINT_FORMAT_VERSION)
        .u16(unit_length)
        .bytes(checkpoint.unit.as_bytes())
        .u32(checkpoint.state_version)
        .u64(checkpoint.seq)
        .bytes(&checkpoint.identity)
        .bytes(&checkpoint.anchor)
        .u64_length(checkpoint.state.len())
        .bytes(checkpoint.state);
    let checksum = blake3::hash(&out);
    out.extend_from_slice(checksum.as_bytes());
    Ok(out)
}

/// Decodes and verifies a checkpoint (F-07-2); any damage is a typed error.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<Checkpoint<'_>> {
    let body_length = bytes
        .len()
        .checked_sub(DIGEST_BYTES)
        .ok_or_else(|| cache_error(CACHE_DIR, "checkpoint truncated"))?;
    let (body, checksum) = bytes.split_at(body_length);
    if blake3::hash(body).as_bytes() != checksum {
        return Err(cache_error(CACHE_DIR, "checkpoint checksum mismatch"));
    }
    let truncated = |_| cache_error(CACHE_DIR, "checkpoint truncated");
    let mut reader = Reader::new(body);
    if reader.array::<8>("magic").map_err(truncated)? != CHECKPOINT_MAGIC {
        return Err(cache_error(CACHE_DIR, "not a checkpoint"));
    }
    if reader.u16("layout version").map_err(truncated)? != CHECKPOINT_FORMAT_VERSION {
        return Err(cache_error(CACHE_DIR, "unknown checkpoint layout version"));
    }
    let unit_length = usize::from(reader.u16("unit name length").map_err(truncated)?);
    let unit = std::str::from_utf8(reader.bytes(unit_length, "unit name").map_err(truncated)?)
        .map_err(|_| cache_error(CACHE_DIR, "unit name is not UTF-8"))?;
    let state_version = reader.u32("state version").map_err(truncated)?;
    let seq = reader.u64("seq").map_err(truncated)?;
    let identity = reader.array("identity").map_err(truncated)?;
    let anchor = reader.array("anchor").map_err(truncated)?;
    let state_length = usize::try_from(reader.u64("state length").map_err(truncated)?)
        .map_err(|_| cache_error(CACHE_DIR, "state length out of range"))?;
    let state = reader.bytes(state_length, "state").map_err(truncated)?;
    if !reader.is_at_end() {
        return Err(cache_error(CACHE_DIR, "trailing bytes after the state"));
    }
    Ok(Checkpoint {
        unit,
        state_version,
        seq,
        identity,
        anchor,
        state,
    })
}

/// Writes a checkpoint: temp file, fsync, rename (F-07-5); then removes the unit's older
/// checkpoints. The directory is not fsynced: a lost rename only costs a refold.
pub(crate) fn write_checkpoint(
    storage: &dyn Storage,
    session: &str,
    checkpoint: &Checkpoint<'_>,
) -> Result<()> {
    let io = |operation| move |error| Error::io(operation, error);
    let dir = session_cache_dir(session);
    storage.create_dir(&dir).map_err(io("cache dir create"))?;
    let name = checkpoint_file_name(checkpoint.unit, checkpoint.state_version, checkpoint.seq);
    let final_path = format!("{dir}/{name}");
    let temp_path = format!("{final_path}{TEMP_SUFFIX}");
    let bytes = encode_checkpoint(checkpoint)?;
    let file = storage.open(&temp_path, true).map_err(io("cache write"))?;
    file.set_len(0).map_err(io("cache write"))?;
    file.write_at(&bytes, 0).map_err(io("cache write"))?;
    file.sync_data().map_err(io("cache sync"))?;
    storage
        .rename(&temp_path, &final_path)
        .map_err(io("cache rename"))?;
    for old in storage.list(&dir).map_err(io("cache list"))? {
        let older = parse_file_name(&old)
            .is_some_and(|(unit, _, seq)| unit == checkpoint.unit && seq != checkpoint.seq);
        if older || old.ends_with(TEMP_SUFFIX) {
            let _ = storage.remove(&format!("{dir}/{old}"));
        }
    }
    Ok(())
}
