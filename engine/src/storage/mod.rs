//! Storage: bytes and durability, nothing of DSH.
//!
//! Owns the files of a store: the storage abstraction (`io`, with real files and the
//! simulated disk), the one checked little-endian reader/writer and file-name parser
//! (`coding`), record framing (`frame`), write-ahead segments (`segment`), the live
//! file set (`manifest`), group commit (`commit`), open-time replay (`recovery`), sealed
//! runs (`run`), the seq-index checkpoints (`index`) and the in-memory catalog (`catalog`).
//! May import only `crate::error` (and `crate::limits`); never `session` or anything above.

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

pub mod catalog;
pub mod coding;
pub mod commit;
pub mod frame;
pub mod index;
pub mod io;
pub mod manifest;
pub mod multi;
pub mod recovery;
pub mod run;
pub mod segment;
