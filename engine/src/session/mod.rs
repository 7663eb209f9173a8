//! The DSH session model (validation, surface fold, messages, repair, seeds, forks).
//!
//! The bottom layer: pure code, no I/O; imports nothing else of the crate. Mirrors DeepSeek Harness at commit `b150a551b8` (see
//! `reference/dsh-session-model.md`): every error's `Display` is DSH's exact text.
//!
//! - [`event`]: `SessionEvent` (payload kept as exact JSON text) and the line parser.
//! - [`surface`]: the always-on surface rules, incremental/windowed fold, `deriveMessages`.
//! - [`seed`]: seed/restore validation, the cold-load pipeline, end-seed, fork boundaries.
//! - [`legacy`]: read-side same-version migrations (never rewrite stored bytes).
//! - [`repair`]: crash-repair closers with DSH's exact text and key order.
//! - [`relational`]: the optional companions (turn/step invariant, tool pairing).
//! - [`plain_json`]: serde-free readings of JSON texts in the plain form DSH writes.

pub mod error;
pub mod event;
pub mod json;
pub mod legacy;
pub mod line;
pub mod message;
pub mod plain_json;
pub mod relational;
pub mod repair;
pub mod seed;
pub mod surface;

pub use error::{ForkErrorCode, MessageProblem, SessionError};
pub use event::{
    is_known_event_type, is_surface_eligible_type, parse_event_line, parse_event_line_at, KeyOrder,
    SessionEvent, SurfaceOp, END_SEED_TYPE, ENVELOPE_KEYS, KNOWN_EVENT_TYPES,
    OPTIONAL_ENVELOPE_KEYS, TURN_END, TURN_START,
};
pub use json::MAX_SAFE_INTEGER;
pub use legacy::{migrate_legacy, migrate_next, needs_migration, MigratedLog};
pub use relational::{InvariantTracker, ToolPairing};
pub use repair::{interrupted_turn_closers, RepairScan};
pub use seed::{
    check_known_types, end_seed_marker, fork_seed, restore_session, validate_fork_boundary,
    validate_fork_boundary_of, validate_seed, validate_seed_event, validate_seed_event_parsed,
    ForkBoundaryEvent, RestoreCheck, RestoreUndecided, RestoredSession, SeedMode,
};
pub use surface::{
    fold_surface, SurfaceChange, SurfaceFold, SurfaceFoldParts, SurfaceFoldResult,
    SurfaceNodeParts, SurfaceReplacement,
};

#[cfg(test)]
mod tests;
