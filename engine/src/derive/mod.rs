//! Derived state: everything computed from a session's log and never a second source of
//! truth.
//!
//! Owns the projection units (`projection`), the checkpointed projection cache (`cache`)
//! and DSH's cold load over a store: streamed messages (`cold`, `skeleton`) and the full
//! cold load, surface, repair and resume (`resume`). May import `store`, `storage`,
//! `session`, `spill`, `exchange` (the DSH line codec) and `error`; never `compaction`.

pub mod cache;
pub mod cold;
pub mod projection;
mod resume;
mod skeleton;

pub use resume::{
    message_texts, messages, messages_full, repair, restore, resume, surface, ResumedSession,
};
