//! L9: compaction transactions, tool-pairing validation, region selection, the pruner and
//! spill retention.

mod retention;

pub use retention::{collect_spill, spill_references};

/// DSH's manual-compaction error codes (model §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompactionErrorCode {
    /// A compaction is in progress, or (manual) a turn is open.
    Busy,
    /// The region or summary is invalid.
    Summary,
    /// The surface changed under the compaction.
    Changed,
    /// The atomic commit failed.
    Commit,
}
