//! dshdb: an embedded storage engine for AI-agent session logs.
//!
//! Layers, bottom to top (a layer imports only from layers below it):
//! `io` (L0) → `frame` (L1) → `segment` (L2) → `commit` (L3) → `index` (L4) →
//! `spill` (L6) → `session` (L7, the DSH session model) → `db` (the `Store` handle that wires
//! them); above the store: `projection` and `cache` (L8), `compaction` (L9).
//! The on-disk format is specified normatively in `format-spec/`.

pub mod cache;
pub mod catalog;
pub mod commit;
pub mod compaction;
pub mod db;
pub mod error;
pub mod exchange;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod index;
pub mod io;
pub mod manifest;
pub mod projection;
pub mod recovery;
pub mod run;
pub mod segment;
pub mod session;
pub mod spill;

pub use commit::Durability;
pub use db::{Event, NewEvent, Options, SessionWriter, Store};
pub use error::{Error, Result};
