//! The model-free tool-result pruner (`compaction-tool-result-pruner`, model §8): keeps the
//! head and tail of oversized tool-result text, spills the full text, and commits every
//! `compaction/prune` + replacing `tool/result` pair of one pass as one atomic batch.

use super::{parsed_event, HEURISTIC_OVERHEAD_TOKENS};
use crate::derive::cache::ProjectionCache;
use crate::derive::projection::estimate_message;
use crate::derive::projection::session_event;
use crate::error::{Error, Result};
use crate::session::event::TOOL_RESULT;
use crate::session::SurfaceOp;
use crate::spill::{BlobHash, SpillStore};
use crate::store::{NewEvent, SessionWriter};
use serde_json::{json, Value};

/// DSH's `PRUNE_MARKER` (39 code points).
pub const PRUNE_MARKER: &str = "\n\n[... tool result middle pruned ...]\n\n";

/// DSH's pruner configuration; all sizes in Unicode code points of text blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrunerConfig {
    /// Results whose text exceeds this are pruned (DSH default 8192, at least 1).
    pub threshold_chars: usize,
    /// Code points kept from the start (DSH default 4096).
    pub head_chars: usize,
    /// Code points kept from the end (DSH default 1024).
    pub tail_chars: usize,
}

impl Default for PrunerConfig {
    fn default() -> Self {
        Self {
            threshold_chars: 8192,
            head_chars: 4096,
            tail_chars: 1024,
        }
    }
}

impl PrunerConfig {
    /// DSH's checks: threshold ≥ 1 and head + marker + tail ≤ threshold.
    pub fn validate(&self) -> Result<()> {
        let marker = PRUNE_MARKER.chars().count();
        let fits = self
            .head_chars
            .checked_add(marker)
            .and_then(|sum| sum.checked_add(self.tail_chars))
            .is_some_and(|sum| sum <= self.threshold_chars);
        if self.threshold_chars == 0 || !fits {
            return Err(Error::InvalidInput {
                reason: "pruner: headChars + 39 + tailChars must not exceed thresholdChars (≥ 1)"
                    .to_owned(),
            });
        }
        Ok(())
    }
}

/// DSH's `measureContent`: code points of the text blocks.
pub fn measure_content(blocks: &[Value]) -> usize {
    blocks
        .iter()
        .map(|block| text_of(block).chars().count())
        .sum()
}

fn text_of(block: &Value) -> &str {
    if block.get("type").and_then(Value::as_str) != Some("text") {
        return "";
    }
    block.get("text").and_then(Value::as_str).unwrap_or("")
}

/// DSH's `pruneContent`: removes code points `[head, total − tail)` of the text stream;
/// the first text block meeting the removed span gets the marker; text blocks emptied by
/// the cut are dropped; other blocks stay in place. `None` when within the threshold.
pub fn prune_content(blocks: &[Value], config: &PrunerConfig) -> Option<Vec<Value>> {
    let total = measure_content(blocks);
    if total <= config.threshold_chars {
        return None;
    }
    let cut_start = config.head_chars;
    let cut_end = total - config.tail_chars;
    let mut position = 0;
    let mut marked = false;
    let mut out = Vec::with_capacity(blocks.len());
    for block in blocks {
        if block.get("type").and_then(Value::as_str) != Some("text") {
            out.push(block.clone());
            continue;
        }
        let chars: Vec<char> = text_of(block).chars().collect();
        let (block_start, block_end) = (position, position + chars.len());
        position = block_end;
        let keep_head = cut_start.clamp(block_start, block_end) - block_start;
        let keep_tail_from = cut_end.clamp(block_start, block_end) - block_start;
        let intersects = block_start < cut_end && cut_start < block_end;
        let mut text: String = chars[..keep_head].iter().collect();
        if intersects && !marked {
            text.push_str(PRUNE_MARKER);
            marked = true;
        }
        text.extend(&chars[keep_tail_from.max(keep_head)..]);
        if text.is_empty() && !chars.is_empty() {
            continue;
        }
        let mut kept = block.clone();
        kept["text"] = Value::String(text);
        out.push(kept);
    }
    Some(out)
}

/// One pruned result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedResult {
    pub original_seq: u64,
    pub replacement_seq: u64,
    pub call_id: String,
    pub chars_before: usize,
    pub chars_after: usize,
    /// The blob holding the full text, when a spill store was given.
    pub spilled: Option<BlobHash>,
}

/// What a pass did (DSH's `{pruned, charsRemoved}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub pruned: Vec<PrunedResult>,
    pub chars_removed: usize,
}

/// The two events of one pruned node, as texts.
struct PrunePair {
    prune_data: String,
    replacement_data: String,
    envelope: String,
    result: PrunedResult,
}

/// DSH's `pruneSession` (F-07-17): prunes every oversized tool result on the surface; with
/// `spill`, the full text is stored first and the replacement ends with its locator. All
/// pairs are committed as one atomic batch; a second pass prunes nothing.
pub fn prune_session(
    cache: &ProjectionCache,
    writer: &mut SessionWriter,
    spill: Option<&SpillStore>,
    config: &PrunerConfig,
) -> Result<PruneReport> {
    config.validate()?;
    let session = writer.id().to_owned();
    let (builtins, _) = cache.read_builtins(&session)?;
    let mut fold = builtins.surface.clone();
    let mut pairs = Vec::new();
    for seq in builtins.surface.nodes() {
        let event = session_event(&session, &cache.store().get(&session, seq)?)?;
        if event.event_type != TOOL_RESULT {
            continue;
        }
        let next = builtins.length + 2 * pairs.len() as u64;
        let Some(pair) = prune_pair(&event.data_value(), seq, next, spill, config)? else {
            continue;
        };
        // A pair the session model would refuse (e.g. a payload whose rewrite changes more
        // than content) is left alone.
        let mut candidate = fold.clone();
        if apply_pair(&mut candidate, &pair).is_ok() {
            fold = candidate;
            pairs.push(pair);
        }
    }
    if pairs.is_empty() {
        return Ok(PruneReport::default());
    }
    let mut events = Vec::with_capacity(2 * pairs.len());
    for pair in &pairs {
        events.push(NewEvent::new("compaction/prune", &pair.prune_data));
        events.push(NewEvent {
            envelope: &pair.envelope,
            ..NewEvent::new(TOOL_RESULT, &pair.replacement_data)
        });
    }
    let receipt = writer.append_batch(&events)?;
    let types: Vec<&str> = events.iter().map(|event| event.event_type).collect();
    let _ = cache.note_appended(&session, &receipt, &types);
    let pruned: Vec<PrunedResult> = pairs.into_iter().map(|pair| pair.result).collect();
    let chars_removed = pruned
        .iter()
        .map(|result| result.chars_before - result.chars_after)
        .sum();
    Ok(PruneReport {
        pruned,
        chars_removed,
    })
}

fn apply_pair(fold: &mut crate::session::SurfaceFold, pair: &PrunePair) -> Result<()> {
    let seq = fold.next_seq();
    let prune = parsed_event(
        seq,
        &NewEvent::new("compaction/prune", &pair.prune_data),
        "",
    )?;
    let replacement = parsed_event(
        seq + 1,
        &NewEvent::new(TOOL_RESULT, &pair.replacement_data),
        &pair.envelope,
    )?;
    for event in [prune, replacement] {
        fold.apply(&event).map_err(|source| Error::SessionModel {
            id: String::new(),
            source,
        })?;
    }
    Ok(())
}

/// The prune/replacement pair for the tool result `data` at `seq`, if it prunes.
fn prune_pair(
    data: &Value,
    seq: u64,
    prune_seq: u64,
    spill: Option<&SpillStore>,
    config: &PrunerConfig,
) -> Result<Option<PrunePair>> {
    let Some(inner) = data
        .pointer("/message/content/0/content")
        .and_then(Value::as_array)
    else {
        return Ok(None);
    };
    let Some(mut pruned) = prune_content(inner, config) else {
        return Ok(None);
    };
    let spilled = match spill {
        Some(spill) => {
            let full: String = inner.iter().map(text_of).collect();
            let hash = spill.put(full.as_bytes())?;
            let note = format!("[full text: {}]", hash.locator());
            if measure_content(&pruned) + note.chars().count() <= config.threshold_chars {
                pruned.push(json!({"type": "text", "text": note}));
            }
            Some(hash)
        }
        None => None,
    };
    let shadowed_token_count = data
        .get("message")
        .map_or(HEURISTIC_OVERHEAD_TOKENS, estimate_message);
    let prune_data = json!({"shadowedRange": {"start": seq, "end": seq},
        "shadowedSeqs": [seq], "shadowedTokenCount": shadowed_token_count});
    let chars_after = measure_content(&pruned);
    let mut replacement = data.clone();
    if let Some(content) = replacement.pointer_mut("/message/content/0/content") {
        *content = Value::Array(pruned);
    }
    let call_id = data
        .pointer("/message/source/callId")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let surface_op = SurfaceOp::Replace {
        start: seq,
        end: seq,
    };
    Ok(Some(PrunePair {
        prune_data: prune_data.to_string(),
        replacement_data: replacement.to_string(),
        envelope: format!(
            "\"sourceEventSeqs\":[{seq}],\"surfaceOp\":{}",
            surface_op.to_json()
        ),
        result: PrunedResult {
            original_seq: seq,
            replacement_seq: prune_seq + 1,
            call_id,
            chars_before: measure_content(inner),
            chars_after,
            spilled,
        },
    }))
}
