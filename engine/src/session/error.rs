//! Typed session-model errors. Every `Display` text is DSH's exact message (commit `b150a551b8`),
//! so callers can surface them unchanged and conformance tests can compare them byte for byte.

use std::fmt;

/// Why a message-bearing event fails DSH's `assertMessageEventShape`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageProblem {
    /// The message is not an object with a non-empty string `id`.
    Unidentified,
    /// `role` is not the one the event type requires (`"assistant"` or `"user"`).
    WrongRole(&'static str),
    /// `source` is not an object with a non-empty string `kind`.
    InvalidSource,
    /// `content` is not an array.
    InvalidContent,
    /// An assistant message whose source is not a model with provider and model.
    NotModelSource,
    /// A tool result whose source is not a tool with a call id.
    NotToolSource,
    /// A tool result whose content is not exactly one `tool-result` block with array content.
    NotOneToolResultBlock,
    /// The block's `toolCallId` differs from `source.callId`.
    MismatchedToolCallIds,
}

impl fmt::Display for MessageProblem {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unidentified => formatter.write_str("lacks an identified message"),
            Self::WrongRole(role) => write!(formatter, "message must have role \"{role}\""),
            Self::InvalidSource => formatter.write_str("message has invalid source"),
            Self::InvalidContent => formatter.write_str("message has invalid content"),
            Self::NotModelSource => formatter.write_str("message must have model source"),
            Self::NotToolSource => formatter.write_str("message must have tool source"),
            Self::NotOneToolResultBlock => {
                formatter.write_str("message must contain one tool-result block")
            }
            Self::MismatchedToolCallIds => {
                formatter.write_str("message has mismatched tool call ids")
            }
        }
    }
}

/// Machine-readable code of a fork failure (DSH `SessionForkError.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkErrorCode {
    /// The boundary is not a valid seq of the source.
    InvalidBoundary,
    /// The boundary falls inside an open turn.
    OpenTurn,
}

/// Every failure of the session model, with DSH's message text as `Display`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    // ---- JSON and envelope -------------------------------------------------------------
    /// The line is not a JSON object (DSH's scanner calls this an unparsable event).
    #[error("event line is not a JSON object: {reason}")]
    UnparsableLine { reason: String },
    /// An envelope field is missing, mistyped or unknown. DSH always knows the seed index;
    /// a caller parsing a lone line without one gets the neutral wording.
    #[error("{}", envelope_text(*.index))]
    InvalidEnvelope { index: Option<usize> },
    #[error("seed event at index {index} is not losslessly JSON-serializable")]
    NotLossless { index: usize },
    #[error("session event \"{event_type}\" carries non-JSON-serializable data")]
    NonJsonData { event_type: String },
    #[error("seed event at index {index} uses unsupported legacy request/header-delta format")]
    SeedHeaderDelta { index: usize },
    #[error(
        "seed event at index {index} uses unsupported legacy request/header reason \"fallback\""
    )]
    SeedHeaderFallback { index: usize },
    #[error("session event \"{event_type}\" uses unsupported legacy request/header-delta format")]
    AppendHeaderDelta { event_type: String },
    #[error(
        "session event \"{event_type}\" uses unsupported legacy request/header reason \"fallback\""
    )]
    AppendHeaderFallback { event_type: String },
    #[error("seed request/header at index {index} lacks provider/model")]
    HeaderLacksProviderModel { index: usize },
    #[error("seed request/header at index {index} has an invalid reasoningEffort")]
    HeaderInvalidReasoningEffort { index: usize },
    #[error("seed request/header at index {index} has invalid adapterDefaults")]
    HeaderInvalidAdapterDefaults { index: usize },
    /// `subject` is `seed <type> at index <i>` (seed/restore) or `session event at seq <n>` (import).
    #[error("{subject} {problem}")]
    MessageShape {
        subject: String,
        problem: MessageProblem,
    },
    #[error("seed event at index {index} has seq {seq} (expected {index}); seed must be contiguous from 0")]
    SeedNotContiguous { index: usize, seq: u64 },
    /// A surface failure during seeding, wrapped the way `Session` re-throws it.
    #[error("invalid seed event at index {index}: {source}")]
    InvalidSeedEvent {
        index: usize,
        source: Box<SessionError>,
    },

    // ---- surface (§3.3, §3.4) ------------------------------------------------------------
    #[error("session event seq {seq} is not contiguous; expected {expected}")]
    SeqNotContiguous { seq: u64, expected: u64 },
    #[error("session event \"{event_type}\" is not surface-eligible and cannot carry surfaceOp")]
    SurfaceOpOnIneligible { event_type: String },
    #[error(
        "session event \"{event_type}\" is not surface-eligible and cannot carry sourceEventSeqs"
    )]
    SourcesOnIneligible { event_type: String },
    #[error("session event \"{event_type}\" is surface-eligible and requires a surfaceOp marker")]
    MissingSurfaceOp { event_type: String },
    #[error("session event \"{event_type}\" carries an invalid surfaceOp")]
    InvalidSurfaceOp { event_type: String },
    #[error("session event \"{event_type}\" carries an invalid replace surfaceOp")]
    InvalidReplaceSurfaceOp { event_type: String },
    /// DSH names the event by its seq here; a lone line whose seq is unreadable reports none.
    #[error("sourceEventSeqs on event at seq {seq} must be an array when present")]
    SourcesNotArray { seq: String },
    #[error("sourceEventSeqs must not be empty except on assistant/message")]
    SourcesEmpty,
    #[error("session event \"{event_type}\" sourceEventSeqs must densely contain non-negative safe integers")]
    SourcesNotDense { event_type: String },
    #[error("sourceEventSeqs must not contain duplicates")]
    SourcesDuplicate,
    #[error("sourceEventSeqs must reference earlier events: {offender} >= current seq {seq}")]
    SourcesNotEarlier { offender: u64, seq: u64 },
    #[error("surface replace: sourceEventSeqs must include every shadowed surface node; missing {}", join_seqs(.missing))]
    ReplaceMissingShadowed { missing: Vec<u64> },
    #[error("surface replace: start seq {start} not found in surface")]
    ReplaceStartNotFound { start: u64 },
    #[error("surface replace: end seq {end} not found in surface")]
    ReplaceEndNotFound { end: u64 },
    #[error("surface replace: start seq {start} (index {start_index}) is after end seq {end} (index {end_index})")]
    ReplaceReversed {
        start: u64,
        start_index: usize,
        end: u64,
        end_index: usize,
    },
    #[error("tool/result surface replacement must rewrite exactly one current node")]
    ToolResultRewriteNotSingle,
    #[error("tool/result surface replacement must target a current tool/result")]
    ToolResultRewriteWrongTarget,
    #[error("tool/result surface replacement may change only content")]
    ToolResultRewriteChangedMore,

    // ---- persistence read path (dsh-persistence §2.9, §2.10, §5.5) -----------------------
    #[error(
        "session \"{session_id}\" contains unsupported legacy {event_type} event at seq {seq}"
    )]
    LegacyUnsupportedType {
        session_id: String,
        event_type: String,
        seq: u64,
    },
    #[error("session \"{session_id}\" contains unsupported legacy request/header reason \"fallback\" at seq {seq}")]
    LegacyFallbackReason { session_id: String, seq: u64 },
    /// A pre-current shape that cannot be migrated (`malformed pre-react-loop turn/start`, …).
    #[error("malformed pre-react-loop {event_type}")]
    MalformedLegacy { event_type: String },
    /// DSH `SessionFormatUnsupportedError` (the backend may append ` (raw log: <path>)`).
    #[error("session \"{session_id}\" contains event type \"{event_type}\" (seq {seq}) unknown to this harness and not marked ignorable; refusing to interpret the log — it was likely written by a newer harness")]
    UnknownRequiredType {
        session_id: String,
        event_type: String,
        seq: u64,
    },
    /// DSH `SessionPersistenceCorruptionError`: `String(err)` of a JS `Error` prefixes `Error: `.
    #[error("stored session \"{session_id}\" failed validation: Error: {source}")]
    StoredValidation {
        session_id: String,
        source: Box<SessionError>,
    },

    // ---- fork (§7) -------------------------------------------------------------------------
    #[error("fork boundary for session \"{session_id}\" must be a non-negative safe integer, got {boundary}")]
    ForkBoundaryNotSafeInteger {
        session_id: String,
        boundary: String,
    },
    #[error("fork boundary {boundary} does not exist in session \"{session_id}\" (last seq: {})", last_seq_text(*.last_seq))]
    ForkBoundaryMissing {
        session_id: String,
        boundary: u64,
        last_seq: Option<u64>,
    },
    #[error("fork boundary {boundary} does not match a contiguous event seq in session \"{session_id}\"")]
    ForkBoundaryNotContiguous { session_id: String, boundary: u64 },
    #[error("fork boundary {boundary} in session \"{session_id}\" ends inside open turn {turn}")]
    ForkOpenTurn {
        session_id: String,
        boundary: u64,
        turn: String,
    },

    // ---- optional relational companions (§3.7, §5.6) -------------------------------------
    /// A session-invariant or tool-pairing violation; the text is DSH's, built at the check.
    #[error("{message}")]
    Invariant { message: String },
}

impl SessionError {
    /// The DSH `SessionForkError.code` for fork failures, `None` for every other error.
    pub fn fork_error_code(&self) -> Option<ForkErrorCode> {
        match self {
            Self::ForkBoundaryNotSafeInteger { .. }
            | Self::ForkBoundaryMissing { .. }
            | Self::ForkBoundaryNotContiguous { .. } => Some(ForkErrorCode::InvalidBoundary),
            Self::ForkOpenTurn { .. } => Some(ForkErrorCode::OpenTurn),
            _ => None,
        }
    }

    /// Wraps a surface failure met while seeding, as `Session.create`/`fromRestore` do.
    pub(crate) fn in_seed(self, index: usize) -> Self {
        Self::InvalidSeedEvent {
            index,
            source: Box::new(self),
        }
    }

    pub(crate) fn invariant(message: String) -> Self {
        Self::Invariant { message }
    }
}

fn envelope_text(index: Option<usize>) -> String {
    match index {
        Some(index) => format!("seed event at index {index} has an invalid event envelope"),
        None => "session event line has an invalid event envelope".to_owned(),
    }
}

fn join_seqs(seqs: &[u64]) -> String {
    seqs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn last_seq_text(last_seq: Option<u64>) -> String {
    last_seq.map_or_else(|| "none".to_owned(), |seq| seq.to_string())
}
