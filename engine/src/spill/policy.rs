//! DSH's spill policy (`dsh-spill-policy`, persistence §7) over a `tool/result` payload.

use super::{BlobHash, SpillStore};
use crate::error::Result;
use serde_json::Value;

pub use crate::limits::DSH_MAX_INLINE_BYTES;

/// How the model can read a spilled blob (DSH's `retrievalHint` slot).
pub const RETRIEVAL_HINT: &str =
    "Read it with `dshdb spill get <store> <locator> [--offset N] [--length N]` (whole or a byte range).";

/// A spilled tool result: the rewritten payload and the blob that holds the full text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpilledResult {
    /// The `tool/result` data with the inner content replaced by preview and notice.
    pub data: String,
    pub hash: BlobHash,
    /// UTF-8 bytes of the full text.
    pub total_bytes: u64,
    /// Bytes kept in the preview.
    pub kept_bytes: u64,
}

/// The notice DSH appends: `(Omitted N bytes. Full formatted result stored at: L. H)`.
fn notice(omitted: usize, locator: &str) -> String {
    format!(
        "(Omitted {omitted} bytes. Full formatted result stored at: {locator}. {RETRIEVAL_HINT})"
    )
}

/// The largest char boundary at or below `index`.
fn floor_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The smallest char boundary at or above `index`.
fn ceil_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

/// DSH's replacement text: head/tail preview sized from the byte budget left after the
/// notice priced at the full total (reserve = notice + 2), head `ceil(budget/2)` and tail
/// `floor(budget/2)` bytes trimmed to UTF-8 boundaries, then `\n\n` and the notice priced at
/// the omitted bytes. `None` when it would still exceed `max_inline`.
pub fn preview_text(full: &str, locator: &str, max_inline: usize) -> Option<(String, usize)> {
    let total = full.len();
    let reserve = notice(total, locator).len() + 2;
    let budget = max_inline.saturating_sub(reserve);
    let head_end = floor_boundary(full, budget.div_ceil(2));
    let tail_start = ceil_boundary(full, total.saturating_sub(budget / 2)).max(head_end);
    let kept = head_end + (total - tail_start);
    let preview = format!("{}{}", &full[..head_end], &full[tail_start..]);
    let omitted = notice(total - kept, locator);
    let text = if preview.is_empty() {
        omitted
    } else {
        format!("{preview}\n\n{omitted}")
    };
    (text.len() <= max_inline).then_some((text, kept))
}

/// The plain text of a `tool/result` payload: `message.content[0]` is a `tool-result` block
/// whose inner content is text blocks only; `None` otherwise (images, nested values).
fn plain_text(data: &Value) -> Option<String> {
    let block = data.pointer("/message/content/0")?;
    if block.get("type").and_then(Value::as_str) != Some("tool-result") {
        return None;
    }
    let inner = block.get("content")?.as_array()?;
    let mut text = String::new();
    for item in inner {
        if item.get("type").and_then(Value::as_str) != Some("text") {
            return None;
        }
        text.push_str(item.get("text")?.as_str()?);
    }
    Some(text)
}

/// Applies DSH's spill policy to a `tool/result` payload (F-07-12): a plain-text result whose
/// UTF-8 size exceeds `max_inline` is stored whole in `spill` and the returned payload keeps
/// only the preview, locator and retrieval hint. `None`: nothing to spill (small, not plain
/// text, not JSON the rewriter can hold, or the preview would not fit).
pub fn spill_tool_result(
    spill: &SpillStore,
    data_text: &str,
    max_inline: usize,
) -> Result<Option<SpilledResult>> {
    let Ok(mut data) = serde_json::from_str::<Value>(data_text) else {
        return Ok(None);
    };
    let Some(full) = plain_text(&data) else {
        return Ok(None);
    };
    if full.len() <= max_inline {
        return Ok(None);
    }
    let hash = spill.put(full.as_bytes())?;
    let Some((text, kept)) = preview_text(&full, &hash.locator(), max_inline) else {
        return Ok(None);
    };
    if let Some(inner) = data.pointer_mut("/message/content/0/content") {
        *inner = serde_json::json!([{"type": "text", "text": text}]);
    }
    Ok(Some(SpilledResult {
        data: data.to_string(),
        hash,
        total_bytes: full.len() as u64,
        kept_bytes: kept as u64,
    }))
}
