//! The spill artifact store (format-spec/07, F-07-10..F-07-16). Owns `spill/` of a store;
//! may import `storage`, `session` and `error`.
//!
//! Oversized payloads (a tool result above DSH's 50,000-byte inline limit) are stored whole
//! as content-addressed blobs `spill/<blake3 hex>`: zstd-compressed, checksummed, written
//! once (a second put of the same bytes is a no-op). Events keep a head/tail preview and the
//! locator `dshdb-spill:<hex>`. Blobs are collected when no event refers to them.

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

mod policy;

pub use policy::{
    preview_text, spill_tool_result, SpilledResult, DSH_MAX_INLINE_BYTES, RETRIEVAL_HINT,
};

use crate::error::{Error, Result};
use crate::storage::coding::{Reader, Writer};
use crate::storage::io::{Storage, StorageFile};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::{Arc, Weak};

/// The spill directory inside the store.
pub const SPILL_DIR: &str = "spill";
/// Prefix of a blob locator inside event payloads.
pub const SPILL_LOCATOR_PREFIX: &str = "dshdb-spill:";
/// First bytes of every blob file.
pub const BLOB_MAGIC: [u8; 8] = *b"DSHDBSP1";
/// Version of the blob layout.
pub const BLOB_FORMAT_VERSION: u16 = 1;
pub use crate::limits::MAX_BLOB_BYTES;
/// zstd level of blob payloads.
pub const BLOB_ZSTD_LEVEL: i32 = 3;
/// Bytes of a blake3 digest.
const DIGEST_BYTES: usize = 32;
/// Bytes of a blob file before the compressed payload: magic, version, raw length, hash,
/// compressed length.
const BLOB_HEADER_BYTES: usize = 8 + 2 + 8 + DIGEST_BYTES + 8;
/// Suffix of a blob being written.
const TEMP_SUFFIX: &str = ".tmp";

/// A blob's name: blake3 of its uncompressed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobHash(pub [u8; DIGEST_BYTES]);

impl BlobHash {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        blake3::Hash::from(self.0).to_hex().to_string()
    }

    /// Parses 64 hex digits, or a whole locator `dshdb-spill:<hex>`.
    pub fn parse(text: &str) -> Option<Self> {
        let hex = text.strip_prefix(SPILL_LOCATOR_PREFIX).unwrap_or(text);
        if hex.len() != 2 * DIGEST_BYTES || !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
            return None;
        }
        blake3::Hash::from_hex(hex.to_ascii_lowercase())
            .ok()
            .map(|hash| Self(*hash.as_bytes()))
    }

    /// `dshdb-spill:<hex>`.
    pub fn locator(&self) -> String {
        format!("{SPILL_LOCATOR_PREFIX}{}", self.to_hex())
    }

    fn path(&self) -> String {
        format!("{SPILL_DIR}/{}", self.to_hex())
    }
}

/// Every locator in `text` (e.g. an event's data), in order of appearance.
pub fn locators_in(text: &str) -> Vec<BlobHash> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(SPILL_LOCATOR_PREFIX) {
        let after = &rest[start + SPILL_LOCATOR_PREFIX.len()..];
        if let Some(hash) = after.get(..2 * DIGEST_BYTES).and_then(BlobHash::parse) {
            found.push(hash);
        }
        rest = after;
    }
    found
}

/// A listed blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobInfo {
    pub hash: BlobHash,
    /// Uncompressed bytes.
    pub raw_bytes: u64,
    /// Bytes of the blob file.
    pub stored_bytes: u64,
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<BlobHash>,
    pub kept: usize,
    /// Leftover `.tmp` files of interrupted puts removed.
    pub temp_removed: usize,
}

/// The spill store of one store directory.
#[derive(Clone)]
pub struct SpillStore {
    storage: Arc<dyn Storage>,
    /// Blobs put by this process into this storage and not yet seen referenced: a
    /// collection running in this process keeps them (a put precedes the append that cites
    /// it). Shared by every handle on the same storage.
    pending: Arc<Mutex<HashSet<BlobHash>>>,
    /// Refuse every write (a read-only store).
    read_only: bool,
}

/// One storage's pending set; the weak handle keeps the storage's allocation (so its
/// address) from being reused while the entry exists.
type PendingEntry = (Weak<dyn Storage>, Arc<Mutex<HashSet<BlobHash>>>);

/// The pending set of each live storage in this process, by the storage's address.
type PendingRegistry = Mutex<HashMap<usize, PendingEntry>>;

fn pending_for(storage: &Arc<dyn Storage>) -> Arc<Mutex<HashSet<BlobHash>>> {
    static REGISTRY: std::sync::OnceLock<PendingRegistry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(PendingRegistry::default);
    let mut entries = registry.lock();
    // Storages no handle uses any more take their pending sets with them.
    entries.retain(|_, (weak, _)| weak.strong_count() > 0);
    let key = Arc::as_ptr(storage) as *const () as usize;
    let entry = entries
        .entry(key)
        .or_insert_with(|| (Arc::downgrade(storage), Arc::default()));
    entry.1.clone()
}

fn io_error(operation: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |error| Error::io(operation, error)
}

fn blob_error(hash: &BlobHash, reason: impl Into<String>) -> Error {
    Error::Spill {
        hash: hash.to_hex(),
        reason: reason.into(),
    }
}

impl SpillStore {
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        let pending = pending_for(&storage);
        Self {
            storage,
            pending,
            read_only: false,
        }
    }

    /// A handle that reads blobs and refuses to write ([`Error::ReadOnly`]).
    pub fn new_read_only(storage: Arc<dyn Storage>) -> Self {
        Self {
            read_only: true,
            ..Self::new(storage)
        }
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Stores `bytes` (F-07-11): returns once the blob is durable (temp file, fsync, rename,
    /// directory fsync). An existing valid blob with the same hash is reused.
    pub fn put(&self, bytes: &[u8]) -> Result<BlobHash> {
        self.check_writable()?;
        let hash = BlobHash::of(bytes);
        let size = bytes.len() as u64;
        if size > MAX_BLOB_BYTES {
            return Err(Error::TooLarge {
                what: "spill blob",
                unit: "bytes",
                size,
                limit: MAX_BLOB_BYTES,
            });
        }
        self.pending.lock().insert(hash);
        if self.verify(&hash).is_ok() {
            return Ok(hash);
        }
        let encoded = encode_blob(&hash, bytes)?;
        let storage = self.storage.as_ref();
        storage
            .create_dir(SPILL_DIR)
            .map_err(io_error("spill dir create"))?;
        let temp = format!("{}{TEMP_SUFFIX}", hash.path());
        let file = storage.open(&temp, true).map_err(io_error("spill write"))?;
        file.set_len(0).map_err(io_error("spill write"))?;
        file.write_at(&encoded, 0)
            .map_err(io_error("spill write"))?;
        file.sync_data().map_err(io_error("spill sync"))?;
        drop(file);
        storage
            .rename(&temp, &hash.path())
            .map_err(io_error("spill rename"))?;
        storage
            .sync_dir(SPILL_DIR)
            .map_err(io_error("spill dir sync"))?;
        Ok(hash)
    }

    fn read_file(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        let file = self
            .storage
            .open_read(&hash.path())
            .map_err(|_| blob_error(hash, "no such blob"))?;
        let length = file.len().map_err(io_error("spill read"))?;
        if length > MAX_BLOB_BYTES + BLOB_HEADER_BYTES as u64 + DIGEST_BYTES as u64 {
            return Err(blob_error(hash, "blob file larger than any blob"));
        }
        file.read_all().map_err(io_error("spill read"))
    }

    /// Checks a blob's checksum and header without decompressing it.
    pub fn verify(&self, hash: &BlobHash) -> Result<BlobInfo> {
        let bytes = self.read_file(hash)?;
        let blob = decode_blob(hash, &bytes)?;
        Ok(BlobInfo {
            hash: *hash,
            raw_bytes: blob.raw_bytes,
            stored_bytes: bytes.len() as u64,
        })
    }

    /// The whole payload; its blake3 is checked against the name.
    pub fn get(&self, hash: &BlobHash) -> Result<Vec<u8>> {
        let bytes = self.read_file(hash)?;
        let blob = decode_blob(hash, &bytes)?;
        let raw = zstd::stream::decode_all(blob.compressed)
            .map_err(|error| blob_error(hash, format!("zstd: {error}")))?;
        if raw.len() as u64 != blob.raw_bytes || BlobHash::of(&raw) != *hash {
            return Err(blob_error(hash, "content does not match its hash"));
        }
        Ok(raw)
    }

    /// `length` bytes from `offset` (clamped to the payload), decompressing only up to them.
    pub fn get_range(&self, hash: &BlobHash, offset: u64, length: u64) -> Result<Vec<u8>> {
        let bytes = self.read_file(hash)?;
        let blob = decode_blob(hash, &bytes)?;
        let start = offset.min(blob.raw_bytes);
        let end = start.saturating_add(length).min(blob.raw_bytes);
        let mut decoder = zstd::stream::read::Decoder::new(blob.compressed)
            .map_err(|error| blob_error(hash, format!("zstd: {error}")))?;
        let zstd_error = |error: std::io::Error| blob_error(hash, format!("zstd: {error}"));
        std::io::copy(&mut (&mut decoder).take(start), &mut std::io::sink()).map_err(zstd_error)?;
        let mut out = Vec::new();
        decoder
            .take(end - start)
            .read_to_end(&mut out)
            .map_err(zstd_error)?;
        if out.len() as u64 != end - start {
            return Err(blob_error(hash, "payload shorter than its header says"));
        }
        Ok(out)
    }

    /// Every blob, by hash. Damaged blobs are listed with what their file holds.
    pub fn list(&self) -> Result<Vec<BlobInfo>> {
        let mut blobs = Vec::new();
        for name in self
            .storage
            .list(SPILL_DIR)
            .map_err(io_error("spill list"))?
        {
            let Some(hash) = BlobHash::parse(&name) else {
                continue;
            };
            match self.verify(&hash) {
                Ok(info) => blobs.push(info),
                Err(_) => blobs.push(BlobInfo {
                    hash,
                    raw_bytes: 0,
                    stored_bytes: self.file_length(&hash),
                }),
            }
        }
        blobs.sort_by_key(|blob| blob.hash);
        Ok(blobs)
    }

    fn file_length(&self, hash: &BlobHash) -> u64 {
        let file = self.storage.open_read(&hash.path());
        file.and_then(|file: Arc<dyn StorageFile>| file.len())
            .unwrap_or(0)
    }

    /// Removes blobs the caller knows nothing cites (best effort, e.g. a refused import).
    pub fn remove_uncited(&self, hashes: &[BlobHash]) {
        if self.read_only {
            return;
        }
        for hash in hashes {
            let _ = self.storage.remove(&hash.path());
        }
        if !hashes.is_empty() {
            let _ = self.storage.sync_dir(SPILL_DIR);
        }
    }

    /// Removes every blob not in `referenced` (and not put by this process since its last
    /// collection) and every leftover temp file (F-07-14). Removal is idempotent, so a crash
    /// mid-way leaves only blobs a later collection removes.
    pub fn gc(&self, referenced: &HashSet<BlobHash>) -> Result<GcReport> {
        self.check_writable()?;
        let mut report = GcReport::default();
        let mut pending = self.pending.lock();
        pending.retain(|hash| !referenced.contains(hash));
        for name in self
            .storage
            .list(SPILL_DIR)
            .map_err(io_error("spill list"))?
        {
            let path = format!("{SPILL_DIR}/{name}");
            if name.ends_with(TEMP_SUFFIX) {
                self.storage
                    .remove(&path)
                    .map_err(io_error("spill remove"))?;
                report.temp_removed += 1;
                continue;
            }
            let Some(hash) = BlobHash::parse(&name) else {
                continue;
            };
            if referenced.contains(&hash) || pending.contains(&hash) {
                report.kept += 1;
                continue;
            }
            self.storage
                .remove(&path)
                .map_err(io_error("spill remove"))?;
            report.removed.push(hash);
        }
        if !report.removed.is_empty() || report.temp_removed > 0 {
            self.storage
                .sync_dir(SPILL_DIR)
                .map_err(io_error("spill dir sync"))?;
        }
        Ok(report)
    }
}

struct DecodedBlob<'bytes> {
    raw_bytes: u64,
    compressed: &'bytes [u8],
}

/// Blob file layout (F-07-10): magic, version u16, raw length u64, blake3 of the raw bytes,
/// compressed length u64, zstd frame, blake3 of every preceding byte.
fn encode_blob(hash: &BlobHash, bytes: &[u8]) -> Result<Vec<u8>> {
    let compressed = zstd::bulk::compress(bytes, BLOB_ZSTD_LEVEL)
        .map_err(|error| blob_error(hash, format!("zstd: {error}")))?;
    let mut out = Vec::with_capacity(compressed.len() + BLOB_HEADER_BYTES + DIGEST_BYTES);
    Writer::new(&mut out)
        .bytes(&BLOB_MAGIC)
        .u16(BLOB_FORMAT_VERSION)
        .u64_length(bytes.len())
        .bytes(&hash.0)
        .u64_length(compressed.len())
        .bytes(&compressed);
    let checksum = blake3::hash(&out);
    out.extend_from_slice(checksum.as_bytes());
    Ok(out)
}

fn decode_blob<'bytes>(hash: &BlobHash, bytes: &'bytes [u8]) -> Result<DecodedBlob<'bytes>> {
    let damaged = |reason: &str| blob_error(hash, reason);
    let body_length = bytes
        .len()
        .checked_sub(DIGEST_BYTES)
        .filter(|length| *length >= BLOB_HEADER_BYTES)
        .ok_or_else(|| damaged("blob truncated"))?;
    let (body, checksum) = bytes.split_at(body_length);
    if blake3::hash(body).as_bytes() != checksum {
        return Err(damaged("blob checksum mismatch"));
    }
    let truncated = |_| damaged("blob truncated");
    let mut reader = Reader::new(body);
    let magic = reader.array::<8>("blob magic").map_err(truncated)?;
    let version = reader.u16("blob layout version").map_err(truncated)?;
    if magic != BLOB_MAGIC || version != BLOB_FORMAT_VERSION {
        return Err(damaged("not a blob of this layout version"));
    }
    let raw_bytes = reader.u64("blob raw length").map_err(truncated)?;
    if reader.bytes(DIGEST_BYTES, "blob hash").map_err(truncated)? != hash.0 {
        return Err(damaged("blob names another hash"));
    }
    let compressed_length =
        usize::try_from(reader.u64("blob compressed length").map_err(truncated)?)
            .map_err(|_| damaged("compressed length out of range"))?;
    if compressed_length != reader.remaining() {
        return Err(damaged("compressed length does not match the file"));
    }
    Ok(DecodedBlob {
        raw_bytes,
        compressed: reader.rest(),
    })
}
