//! The compaction layer (may import every layer below: `derive`, `exchange`, `spill`,
//! `store`, `storage`, `session`, `error`): compaction transactions, tool-pairing validation, region selection, the model-free
//! tool-result pruner and spill retention (model §5, §8; format-spec/07 F-07-15..F-07-18).
//!
//! Unlike DSH, whose three closing appends follow a separately appended `compaction/start`,
//! dshdb commits `compaction/start`, `compaction/summary`, the replacing `user/message` and
//! `compaction/end` as ONE atomic batch: after a crash the log holds all four or none, so an
//! interrupted bracket can only come from an imported DSH log (detected by the turn index).

mod live;
mod pruner;
mod region;
mod retention;

pub use crate::derive::projection::{
    estimate_message, estimate_message_text, HEURISTIC_OVERHEAD_TOKENS,
};
pub use crate::error::CompactionErrorCode;
pub use live::LiveSession;
pub use pruner::{
    measure_content, prune_content, prune_session, PruneReport, PrunedResult, PrunerConfig,
    PRUNE_MARKER,
};
pub use region::{pairing_deltas, select_compactable_range, validate_region};
pub use retention::{collect_spill, spill_references};

use crate::derive::cache::ProjectionCache;
use crate::derive::projection::TurnIndex;
use crate::error::{Error, Result};
use crate::session::{SessionEvent, SurfaceFold, SurfaceOp};
use crate::store::{NewEvent, SessionWriter};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// DSH's `CHECKPOINT_PREAMBLE` (model §5.3).
pub const CHECKPOINT_PREAMBLE: &str = "This is an automatically generated checkpoint condensing an earlier span of the conversation to free up context. Treat the captured context as established background and build on it without restating it. Continue the task directly from the messages that follow, without acknowledging this checkpoint.";
/// Opening tag of the framed summary.
pub const SUMMARY_OPEN_TAG: &str = "<compacted-summary>";
/// Closing tag of the framed summary.
pub const SUMMARY_CLOSE_TAG: &str = "</compacted-summary>";

pub(crate) fn compaction_error(code: CompactionErrorCode, message: impl Into<String>) -> Error {
    Error::Compaction {
        code,
        message: message.into(),
    }
}

/// Who owns the compaction bracket (model §5.1 `turn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionOwner {
    /// Standalone, between turns (`turn: null`); refused while a turn is open.
    Manual,
    /// Automatic, inside the open turn (`turn: N`); refused when no turn is open.
    OpenTurn,
}

/// The caller's summary (the summarizer is the caller's).
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryInput {
    /// Content blocks: text blocks are kept, reasoning is dropped, anything else is refused.
    pub blocks: Vec<Value>,
    pub provider: String,
    pub model: String,
    pub source_command_id: Option<String>,
    pub max_tokens: Option<u64>,
    pub usage: Option<Value>,
}

impl SummaryInput {
    /// A summary made of one text.
    pub fn text(text: &str, provider: &str, model: &str) -> Self {
        Self {
            blocks: vec![json!({"type": "text", "text": text})],
            provider: provider.to_owned(),
            model: model.to_owned(),
            source_command_id: None,
            max_tokens: None,
            usage: None,
        }
    }
}

/// DSH's `CompactionResult`, plus the replacement's seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionResult {
    pub compaction_id: String,
    pub start_seq: u64,
    pub summary_seq: u64,
    pub replacement_seq: u64,
    pub end_seq: u64,
    /// First and last shadowed node seqs (positional span).
    pub shadowed_range: (u64, u64),
    pub shadowed_seqs: Vec<u64>,
    pub shadowed_token_count: u64,
}

/// Compacts the surface span `start..=end` of the writer's session into `summary`
/// (F-07-15): validates like DSH (lock, owner, balanced region, smaller summary), then
/// commits the four events as one atomic batch.
pub fn compact(
    cache: &ProjectionCache,
    writer: &mut SessionWriter,
    start: u64,
    end: u64,
    owner: CompactionOwner,
    summary: &SummaryInput,
) -> Result<CompactionResult> {
    let session = writer.id().to_owned();
    let (builtins, _) = cache.read_builtins(&session)?;
    check_lock(&builtins.turns)?;
    let owner_turn = owner_turn(owner, &builtins.turns)?;
    let nodes = builtins.surface.nodes();
    let deltas = pairing_deltas(cache.store(), &session, &nodes)?;
    let (first, last) = validate_region(&nodes, &deltas, start, end)?;
    let shadowed_seqs = nodes[first..=last].to_vec();
    let shadowed_token_count: u64 = builtins
        .surface
        .node_messages()
        .skip(first)
        .take(last - first + 1)
        .map(|(_, message)| estimate_message_text(message.map(|raw| raw.get())))
        .sum();
    let plan = Plan {
        compaction_id: new_compaction_id(&session, builtins.length),
        first_seq: builtins.length,
        owner_turn,
        start,
        end,
        shadowed_seqs,
        shadowed_token_count,
    };
    let texts = plan.event_texts(summary)?;
    check_batch(&builtins.surface, &texts)?;
    let events: Vec<NewEvent<'_>> = texts.iter().map(EventText::as_new_event).collect();
    let receipt = writer.append_batch(&events)?;
    let types: Vec<&str> = texts.iter().map(|text| text.event_type).collect();
    // The cache follows the log; failing to checkpoint never fails the compaction.
    let _ = cache.note_appended(&session, &receipt, &types);
    Ok(plan.result(receipt.first_seq))
}

/// DSH's lock check (§5.2 step 3): a live orphan `compaction/start` blocks compaction.
fn check_lock(turns: &TurnIndex) -> Result<()> {
    if turns.live_compaction_start().is_some() {
        return Err(compaction_error(
            CompactionErrorCode::Busy,
            "compaction: compaction already in progress; the session compaction lock is already active",
        ));
    }
    Ok(())
}

fn owner_turn(owner: CompactionOwner, turns: &TurnIndex) -> Result<Option<u64>> {
    match (owner, turns.open_turn()) {
        (CompactionOwner::Manual, None) => Ok(None),
        (CompactionOwner::Manual, Some(_)) => Err(compaction_error(
            CompactionErrorCode::Busy,
            "manual compaction: the session already has an open turn",
        )),
        (CompactionOwner::OpenTurn, Some(turn)) => Ok(Some(turn)),
        (CompactionOwner::OpenTurn, None) => Err(compaction_error(
            CompactionErrorCode::Busy,
            "compactRegion: no open turn — automatic compaction events must be enclosed in a turn",
        )),
    }
}

/// A UUID-shaped id, unique per process and session position.
fn new_compaction_id(session: &str, length: u64) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = blake3::Hasher::new();
    hasher.update(session.as_bytes());
    hasher.update(&length.to_le_bytes());
    hasher.update(&crate::store::now_millis().to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let hex = hasher.finalize().to_hex();
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The summary's safe projection: text blocks kept, reasoning dropped, others refused.
fn safe_summary(blocks: &[Value]) -> Result<Vec<Value>> {
    let mut kept = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") if block.get("text").is_some_and(Value::is_string) => {
                kept.push(block.clone())
            }
            Some("reasoning") => {}
            other => {
                return Err(compaction_error(
                    CompactionErrorCode::Summary,
                    format!("summary block of type {other:?} is not text"),
                ))
            }
        }
    }
    if kept.is_empty() {
        return Err(compaction_error(
            CompactionErrorCode::Summary,
            "summary has no text",
        ));
    }
    Ok(kept)
}

/// One event of the batch as texts.
struct EventText {
    event_type: &'static str,
    data: String,
    envelope: String,
}

impl EventText {
    fn as_new_event(&self) -> NewEvent<'_> {
        NewEvent {
            event_type: self.event_type,
            time: None,
            data: &self.data,
            envelope: &self.envelope,
            flags: 0,
        }
    }
}

/// Everything decided before the batch is built.
struct Plan {
    compaction_id: String,
    first_seq: u64,
    owner_turn: Option<u64>,
    start: u64,
    end: u64,
    shadowed_seqs: Vec<u64>,
    shadowed_token_count: u64,
}

impl Plan {
    /// `{compactionId, sourceCommandId?}` in DSH's key order.
    fn bracket(&self, summary: &SummaryInput) -> Map<String, Value> {
        let mut data = Map::new();
        data.insert("compactionId".into(), self.compaction_id.clone().into());
        if let Some(command) = &summary.source_command_id {
            data.insert("sourceCommandId".into(), command.clone().into());
        }
        data
    }

    fn marker(&self, summary: &SummaryInput) -> String {
        let mut data = self.bracket(summary);
        data.insert(
            "turn".into(),
            self.owner_turn.map_or(Value::Null, Value::from),
        );
        Value::Object(data).to_string()
    }

    fn summary_data(&self, summary: &SummaryInput, blocks: &[Value]) -> String {
        let mut data = self.bracket(summary);
        data.insert("summary".into(), Value::Array(blocks.to_vec()));
        let (first, last) = self.range();
        data.insert("shadowedRange".into(), json!({"start": first, "end": last}));
        data.insert("shadowedSeqs".into(), json!(self.shadowed_seqs));
        data.insert(
            "shadowedTokenCount".into(),
            self.shadowed_token_count.into(),
        );
        data.insert("provider".into(), summary.provider.clone().into());
        data.insert("model".into(), summary.model.clone().into());
        if let Some(max_tokens) = summary.max_tokens {
            data.insert("maxTokens".into(), max_tokens.into());
        }
        if let Some(usage) = &summary.usage {
            data.insert("usage".into(), usage.clone());
        }
        Value::Object(data).to_string()
    }

    /// The `<compacted-summary>`-framed checkpoint message (§5.3).
    fn checkpoint_message(&self, summary: &SummaryInput, blocks: &[Value]) -> Value {
        let mut content = vec![json!({"type": "text",
            "text": format!("{CHECKPOINT_PREAMBLE}\n\n{SUMMARY_OPEN_TAG}")})];
        content.extend(blocks.iter().cloned());
        content.push(json!({"type": "text", "text": SUMMARY_CLOSE_TAG}));
        let mut source = Map::new();
        source.insert("kind".into(), "plugin".into());
        source.insert("plugin".into(), "compact".into());
        source.extend(self.bracket(summary));
        json!({"content": content, "source": source, "role": "user",
               "id": format!("checkpoint-{}", self.compaction_id)})
    }

    fn range(&self) -> (u64, u64) {
        let first = self.shadowed_seqs.first().copied().unwrap_or(self.start);
        let last = self.shadowed_seqs.last().copied().unwrap_or(self.end);
        (first, last)
    }

    fn event_texts(&self, summary: &SummaryInput) -> Result<Vec<EventText>> {
        let blocks = safe_summary(&summary.blocks)?;
        let checkpoint = self.checkpoint_message(summary, &blocks);
        let framed = estimate_message(&checkpoint);
        if framed >= self.shadowed_token_count {
            return Err(compaction_error(
                CompactionErrorCode::Summary,
                format!("summary is not smaller than the shadowed content ({framed} estimated framed tokens >= {})", self.shadowed_token_count),
            ));
        }
        let mut sources = vec![self.first_seq, self.first_seq + 1];
        sources.extend(&self.shadowed_seqs);
        let sources: Vec<String> = sources.iter().map(u64::to_string).collect();
        let surface_op = SurfaceOp::Replace {
            start: self.start,
            end: self.end,
        };
        let text = |event_type, data, envelope| EventText {
            event_type,
            data,
            envelope,
        };
        Ok(vec![
            text("compaction/start", self.marker(summary), String::new()),
            text(
                "compaction/summary",
                self.summary_data(summary, &blocks),
                String::new(),
            ),
            text(
                crate::session::event::USER_MESSAGE,
                checkpoint.to_string(),
                format!(
                    "\"sourceEventSeqs\":[{}],\"surfaceOp\":{}",
                    sources.join(","),
                    surface_op.to_json()
                ),
            ),
            text("compaction/end", self.marker(summary), String::new()),
        ])
    }

    fn result(&self, first_seq: u64) -> CompactionResult {
        CompactionResult {
            compaction_id: self.compaction_id.clone(),
            start_seq: first_seq,
            summary_seq: first_seq + 1,
            replacement_seq: first_seq + 2,
            end_seq: first_seq + 3,
            shadowed_range: self.range(),
            shadowed_seqs: self.shadowed_seqs.clone(),
            shadowed_token_count: self.shadowed_token_count,
        }
    }
}

/// Folds the batch into a copy of the surface: a batch the session model would refuse is
/// never committed.
fn check_batch(surface: &SurfaceFold, texts: &[EventText]) -> Result<()> {
    let mut fold = surface.clone();
    for (offset, text) in texts.iter().enumerate() {
        let seq = fold.next_seq();
        let line = NewEvent::new(text.event_type, &text.data);
        let event = parsed_event(seq, &line, &text.envelope)?;
        fold.apply(&event).map_err(|source| Error::SessionModel {
            id: format!("compaction batch event {offset}"),
            source,
        })?;
    }
    Ok(())
}

/// A batch event as the session model sees it.
pub(crate) fn parsed_event(seq: u64, event: &NewEvent<'_>, envelope: &str) -> Result<SessionEvent> {
    let mut line = format!(
        "{{\"type\":{},\"seq\":{seq},\"time\":0,\"data\":{}",
        Value::String(event.event_type.to_owned()),
        event.data
    );
    if !envelope.is_empty() {
        line.push(',');
        line.push_str(envelope);
    }
    line.push('}');
    crate::session::parse_event_line(&line).map_err(|source| Error::SessionModel {
        id: String::new(),
        source,
    })
}
