//! Every limit of the engine, in one place, each with its unit in its name or its doc; the
//! `const` assertions at the end of each section tie the related ones together, so that
//! changing one alone fails the build instead of a record or a batch at run time.
//!
//! The bottom layer: imports nothing of the crate. The modules that enforce a limit
//! re-export it where callers already name it (`storage::frame::MAX_PAYLOAD_BYTES`,
//! `store::MAX_EVENT_DATA_BYTES`, ...); the value is defined only here. Sizes fixed by the
//! on-disk format (format-spec/) that the limits are computed from are here too, marked so.

use std::time::Duration;

/// One mebibyte, in bytes.
const MIB: usize = 1024 * 1024;

// ---- records and events (format-spec/02-records.md) ----------------------------------------

/// Format: bytes of the fixed frame header (F-02-1).
pub const FRAME_HEADER_BYTES: usize = 12;
/// Largest payload one record may carry, in bytes: 16 MiB (F-02-4).
pub const MAX_PAYLOAD_BYTES: usize = 16 * MIB;
/// Format: payload bytes an event record needs besides its data and envelope (F-02-10):
/// session u32, seq u64, time i64, type u32, flags u8, data length u32.
pub const EVENT_FIXED_BYTES: usize = 4 + 8 + 8 + 4 + 1 + 4;
/// Format: payload bytes of a session header before its JSON text: session u32, seed parent
/// u32, seed length u64.
pub const SESSION_HEADER_FIXED_BYTES: usize = 4 + 4 + 8;
/// Payload bytes an event's data leaves for its envelope (`surfaceOp`, `sourceEventSeqs`,
/// `ignorable`) in one record.
pub const EVENT_ENVELOPE_RESERVE_BYTES: usize = 4096;
/// Largest `data` text of one event, in bytes: what fits in one record with its fixed fields
/// and envelope reserve (just under 16 MiB).
pub const MAX_EVENT_DATA_BYTES: usize =
    MAX_PAYLOAD_BYTES - EVENT_FIXED_BYTES - EVENT_ENVELOPE_RESERVE_BYTES;
/// Free disk space a segment's preallocation leaves untouched, in bytes (8 MiB): room for
/// the manifest, the seq-index checkpoint and the run files that `maintain` writes before it
/// frees segments, so that the commands which free space still work on a nearly full disk.
pub const PREALLOCATION_RESERVE_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes a writable store keeps in its `RESERVE` file (F-01-9): on a disk with no byte
/// free, a writable open removes it to start its log, so that `rm` and `maintain`, the
/// commands that free space, still run (1 MiB: a segment header, a manifest, tombstones and
/// the run of a small segment).
pub const DISK_FULL_RESERVE_BYTES: u64 = 1024 * 1024;
/// The nesting depth at which serde_json stops parsing (its recursion limit, in levels of
/// arrays and objects).
pub const SERDE_JSON_DEPTH_LIMIT: usize = 128;
/// Deepest nesting of arrays and objects an event's `data` may have, in levels (a scalar is
/// 0, `{}` is 1): one below serde_json's limit, because every derived view (messages,
/// surface, repair, DSH import) parses the event's line, whose own object holds `data` one
/// level down. Deeper data could be stored but never read back as a session.
pub const MAX_EVENT_DATA_DEPTH: usize = SERDE_JSON_DEPTH_LIMIT - 1;
/// Largest session header (its JSON text), in bytes: 1 MiB.
pub const MAX_HEADER_BYTES: usize = MIB;
/// Largest event type name, in bytes.
pub const MAX_TYPE_BYTES: usize = 1024;
/// Format: bytes of a type definition payload before its name (the type number, u32).
pub const TYPE_DEFINITION_FIXED_BYTES: usize = 4;

// A record's length field is a u32 counting the payload; a whole frame is read into memory.
const _: () = assert!(FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES <= u32::MAX as usize);
// The largest event, header and type name each fit one record.
const _: () = assert!(EVENT_FIXED_BYTES + MAX_EVENT_DATA_BYTES <= MAX_PAYLOAD_BYTES);
const _: () = assert!(SESSION_HEADER_FIXED_BYTES + MAX_HEADER_BYTES <= MAX_PAYLOAD_BYTES);
const _: () = assert!(TYPE_DEFINITION_FIXED_BYTES + MAX_TYPE_BYTES <= MAX_PAYLOAD_BYTES);

// ---- writing: segments, batches, group commit ----------------------------------------------

/// Default preallocated size of one write-ahead segment, in bytes: 64 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 * MIB as u64;
/// Default queued bytes above which appenders wait, in bytes: 64 MiB.
pub const DEFAULT_MAX_PENDING_BYTES: usize = 64 * MIB;
/// Default largest encoded batch, in bytes: 1 GiB. A batch is built in memory and written by
/// one write; above a segment's size it gets a segment of its own (F-03-9).
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 1 << 30;
/// Emptied batch buffers the log keeps for reuse once their group is written (2).
pub const SPARE_BATCH_BUFFERS: usize = 2;
/// Largest batch buffer the log keeps for reuse, in bytes of capacity (16 MiB): an import's
/// staged batch fits, a larger batch's buffer is freed, and the log holds at most 32 MiB of
/// spare buffers while it idles.
pub const MAX_SPARE_BUFFER_BYTES: usize = 16 * MIB;
/// Longest a commit group waits for the appenders the previous group woke to submit again.
/// Waiting lets one `fdatasync` cover them all instead of starting a sync for the first
/// arrival alone; it only happens when several appenders were active (gathering never
/// delays a lone appender).
pub const MAX_GROUP_GATHER: Duration = Duration::from_micros(100);
/// Longest a follower of another process's commits sleeps on the shared futex before it
/// looks again: bounds the cost of a missed wake-up (F-08-11).
pub const FOLLOW_POLL: Duration = Duration::from_millis(50);
/// Pause before a read tries again after following another process's seal or run rewrite
/// (F-08-18): long enough for an append of this process that holds the tail (and so keeps
/// the catch-up from running) to finish.
pub const FOLLOW_REPLACED_PAUSE: Duration = Duration::from_millis(1);
/// Tries of a read that finds files replaced by another process (F-08-18), each after a
/// [`FOLLOW_REPLACED_PAUSE`]: about one second of patience for this process's own appends
/// to leave the tail so that its catalog can follow.
pub const MAX_FOLLOW_ATTEMPTS: usize = 1000;
/// How often a follower of a store no other process writes looks for new events.
pub const FOLLOW_POLL_ALONE: Duration = Duration::from_millis(5);
/// How long a writable open keeps asking for the store's `LOCK` before it reports
/// `Error::Locked`. A `flock` belongs to an open file description, and a child process
/// this one starts shares its descriptors from the fork until its exec closes them
/// (close-on-exec): for that moment a store closed here still looks held. Waiting this
/// long hides the moment and delays only the answer to a store that really is held.
pub const STORE_LOCK_PATIENCE: Duration = Duration::from_millis(250);
/// Pause between two asks for the store's `LOCK` within [`STORE_LOCK_PATIENCE`].
pub const STORE_LOCK_RETRY: Duration = Duration::from_millis(5);
/// `Options::batched()`: longest an append waits for its group's sync.
pub const DEFAULT_BATCHED_MAX_DELAY: Duration = Duration::from_millis(5);
/// `Options::batched()`: queued bytes that start a sync before the delay is up: 1 MiB.
pub const DEFAULT_BATCHED_MAX_BYTES: usize = MIB;
/// Bytes of events per append batch on import: half the default batch limit, leaving room
/// for framing, so a session log of up to 512 MiB of events imports as one atomic batch
/// (a batch larger than a segment gets a segment of its own). A larger log is committed in
/// batches of this size.
pub const IMPORT_BATCH_BYTES: usize = 512 * MIB;

// The largest record fits a default segment, a default batch and the default queue.
const _: () = assert!((FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES) as u64 <= DEFAULT_SEGMENT_BYTES);
const _: () = assert!((FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES) as u64 <= DEFAULT_MAX_BATCH_BYTES);
const _: () = assert!(FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES <= DEFAULT_MAX_PENDING_BYTES);
// An import batch leaves at least as much again for framing under the default batch limit.
const _: () = assert!(2 * IMPORT_BATCH_BYTES as u64 <= DEFAULT_MAX_BATCH_BYTES);

// ---- the manifest, runs and the seq index (format-spec/04, 06) -----------------------------

/// Most segments one manifest may name (bounds what a damaged count can make us allocate).
pub const MAX_SEGMENTS: usize = 1 << 20;
/// Most runs one manifest may name (F-06-7).
pub const MAX_RUNS: usize = 1 << 20;
/// Largest raw (decompressed) size of a run's event block, in bytes, unless one frame alone
/// is larger (F-06-3): bounds what a point read decompresses (~0.5 ms for 512 KiB). Measured
/// on the DSH mix with `run_sweep` (BENCHMARKS.md): at level 12, 512 KiB blocks store 31.1
/// B/event against 31.3 for 256 KiB; 1 MiB gains only 0.2 more.
pub const RUN_BLOCK_RAW_BYTES: usize = 512 * 1024;
/// Fewest events one row entry of a run holds (F-06-31): one event alone stays an event
/// frame, which is smaller than an entry.
pub const MIN_ROW_ENTRY_MEMBERS: u32 = 2;
/// Most encoded bytes of one row entry's payload a writer puts in it (F-06-31): a row entry
/// fits an event block (F-06-3), so a point read inside it still decompresses one block.
pub const MAX_ROW_ENTRY_BYTES: usize = RUN_BLOCK_RAW_BYTES - FRAME_HEADER_BYTES;
/// Most blocks one run may have (bounds what a damaged count can make us allocate).
pub const MAX_RUN_BLOCKS: usize = 1 << 24;
/// Largest span one extent of write-ahead frames grows to, in bytes: a point read of an
/// event not yet sealed reads at most this much (or its own frame if larger).
pub const MAX_SEGMENT_EXTENT_BYTES: u64 = 64 * 1024;
/// Largest run of other frames, in bytes, an extent of write-ahead frames grows across:
/// enough for a batch's commit record and type definitions, small enough that a range read
/// of one session reads little of the sessions interleaved with it.
pub const MAX_EXTENT_GAP_BYTES: u64 = 256;
/// Largest seq-index checkpoint this build loads, in bytes: 16 GiB (bounds memory on a
/// damaged length).
pub const MAX_INDEX_CHECKPOINT_BYTES: u64 = 1 << 34;
/// Default bytes of decompressed run blocks kept in memory: 64 MiB; bounds read memory
/// whatever the store's size.
pub const DEFAULT_BLOCK_CACHE_BYTES: usize = 64 * MIB;

// Counts are u32 fields on disk; a block's raw length is a u32 field and a block holds at
// least one whole frame.
const _: () = assert!(MAX_SEGMENTS <= u32::MAX as usize && MAX_RUNS <= u32::MAX as usize);
const _: () = assert!(MAX_RUN_BLOCKS <= u32::MAX as usize);
const _: () =
    assert!(RUN_BLOCK_RAW_BYTES + FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES <= u32::MAX as usize);
// A default block cache holds at least one block of the largest frame.
const _: () = assert!(FRAME_HEADER_BYTES + MAX_PAYLOAD_BYTES <= DEFAULT_BLOCK_CACHE_BYTES);

// ---- reading in steps ----------------------------------------------------------------------

/// Most events reserved up front from a count an input announces (a dshdb-json header's
/// `events`); more grow as they arrive, so a hostile count cannot reserve memory.
pub const MAX_PREALLOCATED_EVENTS: usize = 1 << 20;

/// Events read per step by the code that walks a whole session (export, cold resume, spill
/// scans, retention, the projection cache's tail): bounds the read buffer the store fills
/// for an unsealed segment per call (about 1 MB at the DSH mix's ~225 bytes an event).
pub const EVENTS_PER_READ: u64 = 4096;

// ---- checkpoints while the store runs (format-spec F-06-27) --------------------------------

/// Log bytes committed since the last seq-index checkpoint after which a running writer
/// writes a new one covering the open segment's prefix, in bytes: 4 MiB. A reopen after a
/// crash then replays at most about this much of the log (plus what arrived while the
/// checkpoint was written).
pub const DEFAULT_CHECKPOINT_EVERY_LOG_BYTES: u64 = 4 * MIB as u64;
/// The interval grows with the checkpoint: at least this many log bytes per checkpoint
/// byte, so that checkpoints of a store with very many sessions cost at most 1/8 of the
/// log's write volume.
pub const CHECKPOINT_LOG_BYTES_PER_CHECKPOINT_BYTE: u64 = 8;
/// How often the checkpoint thread looks at the log's tail, in milliseconds.
pub const CHECKPOINT_POLL_MILLIS: u64 = 20;

// ---- derived files: projection cache and spill (format-spec/07) ----------------------------

/// Largest projection-cache checkpoint file read, in bytes: 1 GiB; a larger file is
/// discarded.
pub const MAX_CACHE_CHECKPOINT_BYTES: u64 = 1 << 30;
/// Default number of folded events after which a new projection-cache checkpoint is
/// written (DSH's web app uses 200).
pub const DEFAULT_CHECKPOINT_EVERY_EVENTS: u64 = 200;
/// Largest payload stored as one spill blob, in bytes: 1 GiB.
pub const MAX_BLOB_BYTES: u64 = 1 << 30;
/// DSH's shipped `maxInlineBytes`: plain-text tool results above it are spilled, in bytes.
pub const DSH_MAX_INLINE_BYTES: usize = 50_000;

// A result just under DSH's inline limit is stored inline, in one event.
const _: () = assert!(DSH_MAX_INLINE_BYTES < MAX_EVENT_DATA_BYTES);

// ---- DSH imports (exchange) ----------------------------------------------------------------

/// Room for a line's envelope around the largest event payload, in bytes: `type`, `seq`,
/// `time`, `surfaceOp`, `sourceEventSeqs` and the JSON punctuation around `data`.
pub const IMPORT_LINE_ENVELOPE_BYTES: usize = 64 * 1024;
/// Longest DSH JSONL line (header or record, without its `\n`) an import reads, in bytes.
pub const MAX_IMPORT_LINE_BYTES: usize = MAX_PAYLOAD_BYTES + IMPORT_LINE_ENVELOPE_BYTES;
/// Largest decoded plaintext of one imported DSH log, in bytes: 4 GiB. The import keeps
/// the plaintext and its parsed events in memory while it validates the whole session.
pub const MAX_IMPORT_PLAINTEXT_BYTES: u64 = 4 << 30;
/// Bytes of stored events per batch a streaming import stages (8 MiB): with the line being
/// read, this bounds the memory of an import whatever the session's size.
pub const STAGE_BATCH_BYTES: usize = 8 * MIB;
/// Bytes a streaming import reads from its input at a time (1 MiB); also how often, in
/// input bytes, it reports progress.
pub const STREAM_READ_BYTES: usize = MIB;
/// Bytes of `tool/result` payloads whose rewrite keys a streaming import's cold-load check
/// keeps (16 MiB, the most recent results): a rewrite of an older result hands the log over
/// to the in-memory import.
pub const STREAM_CHECK_KEY_BYTES: usize = 16 * MIB;
/// An event frame's bytes beyond its data and envelope (frame header, seq, time, type and
/// flags, lengths), rounded up: what a batch reserves, or counts toward its size, per event.
pub(crate) const EVENT_FRAME_ESTIMATE_BYTES: usize = 64;
/// Bytes of plaintext a streaming import decompresses at a time from a zstd log (128 KiB).
pub const STREAM_DECODE_BYTES: usize = 128 * 1024;
/// Plaintext bytes a streaming import's decompressing thread hands over at a time (1 MiB).
pub const DECODE_AHEAD_CHUNK_BYTES: usize = MIB;
/// Chunks of [`DECODE_AHEAD_CHUNK_BYTES`] the decompressing thread may be ahead of the
/// reader by: with the one being read, this bounds what decompression holds (4 MiB).
pub const DECODE_AHEAD_CHUNKS: usize = 2;
/// Bytes a zstd frame is decompressed by per step before the bounds are checked again.
pub const IMPORT_DECODE_STEP_BYTES: usize = 64 * 1024;
/// Uncompressed size limit of a packed SQLite chunk row's data, in bytes (DSH §3.5).
pub const MAX_PACKED_DATA_BYTES: u64 = 1_048_576;
/// Fewest members of a packed SQLite chunk row (DSH §3.5).
pub const MIN_PACKED_ROW_MEMBERS: usize = 3;
/// Most members of a packed SQLite chunk row (DSH §3.5).
pub const MAX_PACKED_ROW_MEMBERS: usize = 1024;
/// Longest project slug kept by DSH's `projectKey` (sessions directory layout), in UTF-16
/// code units, before the `--` wrapping.
pub const PROJECT_SLUG_MAX_UNITS: usize = 251;

// Every line a record can hold can be imported; a decode step never exceeds a line.
const _: () = assert!(MAX_IMPORT_LINE_BYTES > MAX_PAYLOAD_BYTES);
const _: () = assert!(IMPORT_DECODE_STEP_BYTES <= MAX_IMPORT_LINE_BYTES);
const _: () = assert!(MAX_IMPORT_LINE_BYTES as u64 <= MAX_IMPORT_PLAINTEXT_BYTES);
// A packed row's data fits one event; its member bounds are a range.
const _: () = assert!(MAX_PACKED_DATA_BYTES <= MAX_EVENT_DATA_BYTES as u64);
const _: () = assert!(MIN_PACKED_ROW_MEMBERS <= MAX_PACKED_ROW_MEMBERS);
