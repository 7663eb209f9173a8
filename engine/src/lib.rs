//! dshdb: an embedded storage engine for AI-agent session logs.
//!
//! Layers, bottom to top (a layer imports only from layers below it; `layers.rs`, a unit test,
//! fails on an import against this order):
//!
//! - `limits`: every limit of the engine, each with its unit; `const` asserts tie them.
//! - `session`: the DSH session model, pure (no I/O, nothing else of the crate).
//! - `error`: the crate's typed [`Error`].
//! - `storage`: bytes and durability, nothing of DSH: `io` (with `io::shared`, the memory-mapped
//!   `SHARED` file of many processes), `coding`, `frame`, `segment`, `multi` (locks, leases and
//!   the shared tail index of many processes, format-spec/08), `manifest`, `commit`, `recovery`,
//!   `run`, `index`, `catalog`.
//! - `store`: [`Store`] and [`SessionWriter`], the only place that wires storage and session.
//! - `spill`: the content-addressed artifact store.
//! - `exchange`: DSH files in and out (JSONL, JSONL-zstd, SQLite, canonical JSON).
//! - `derive`: projections, the projection cache, cold resume (messages, surface, repair).
//! - `compaction`: compaction transactions, region selection, the pruner, retention.
//!
//! The on-disk format is specified normatively in `format-spec/`.
//!
//! The root re-exports the API an embedder needs ([`Store`], [`Options`], [`Durability`],
//! [`NewEvent`], [`Event`], [`Error`] and the writer and receipt types); the layers stay
//! public for tools.
//!
//! Cargo features (none by default, so an embedder builds neither):
//!
//! - `sqlite`: the DSH SQLite import, `exchange::sqlite` (a bundled SQLite through rusqlite);
//!   the CLI enables it.
//! - `testing`: test support compiled into the library, for this crate's tests, `fuzz/`, the
//!   benches and the other suites: the simulated disk `storage::io::sim`, the fuzz property
//!   checks `fuzzing`, the synthetic session generator `derive::projection::synthetic`, and
//!   fault hooks such as `storage::commit::thread_start_faults`.

// Unit tests may unwrap; the library may not (the workspace denies `clippy::unwrap_used`).
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod compaction;
pub mod derive;
pub mod error;
pub mod exchange;
#[cfg(any(test, feature = "testing"))]
pub mod fuzzing;
#[cfg(test)]
mod layers;
pub mod limits;
pub mod session;
pub mod spill;
pub mod storage;
pub mod store;

pub use error::{Error, Result};
pub use storage::commit::Durability;
pub use store::{
    Event, EventView, NewEvent, Options, PendingReceipt, Receipt, SessionSummary, SessionWriter,
    Store, Subscription,
};
