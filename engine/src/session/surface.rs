//! The surface fold (model §3) and message derivation (§4).
//!
//! One transition serves both the incremental fold and the fold from scratch, and every
//! candidate is validated before any state changes, so a rejected event leaves the fold as
//! it was and both paths report identical errors (as DSH's `SurfaceManager` does).

use super::error::SessionError;
use super::event::{SessionEvent, SurfaceOp, ASSISTANT_MESSAGE, TOOL_RESULT, USER_MESSAGE};
use super::json::{self, json_equal};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;

/// One committed replacement, as DSH's `foldSurface` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfaceReplacement {
    pub seq: u64,
    pub start: u64,
    pub end: u64,
    pub shadowed_seqs: Vec<u64>,
}

/// What one event did to the surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SurfaceChange {
    /// A log-only event: the surface is unchanged.
    Unchanged,
    Appended,
    Replaced(SurfaceReplacement),
}

/// DSH's `SurfaceFoldResult`: the visible node seqs and every replacement in log order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SurfaceFoldResult {
    pub nodes: Vec<u64>,
    pub replacements: Vec<SurfaceReplacement>,
}

/// [`SurfaceFold`] state as plain data (see [`SurfaceFold::to_parts`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SurfaceFoldParts {
    pub next_seq: u64,
    pub replace_generation: u64,
    pub nodes: Vec<SurfaceNodeParts>,
}

/// One visible node as plain data: its seq, projected message text and rewrite key text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SurfaceNodeParts {
    pub seq: u64,
    pub message: Option<String>,
    pub rewrite_key: Option<String>,
}

/// A visible node and what later checks and derivation need from its event.
#[derive(Debug, Clone)]
struct SurfaceNode {
    seq: u64,
    /// The projected message text (§4); `None` when the event derives no message.
    message: Option<Box<RawValue>>,
}

/// Incremental surface state over a contiguous window starting at `base_seq` (§3.2, §3.6).
#[derive(Debug, Clone)]
pub struct SurfaceFold {
    next_seq: u64,
    nodes: Vec<SurfaceNode>,
    /// The rewrite key of each visible `tool/result` node, by its seq: the payload with the
    /// rewritable part nulled (§3.4). Kept beside the nodes so that forgetting one
    /// ([`Self::forget_rewrite_key`]) need not search them.
    rewrite_keys: HashMap<u64, Value>,
    replace_generation: u64,
}

impl Default for SurfaceFold {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for SurfaceFold {
    fn eq(&self, other: &Self) -> bool {
        self.next_seq == other.next_seq
            && self.replace_generation == other.replace_generation
            && self.nodes() == other.nodes()
            && texts(&self.derive_message_texts()) == texts(&other.derive_message_texts())
    }
}

impl SurfaceFold {
    /// A fold over a log starting at seq 0.
    pub fn new() -> Self {
        Self::with_base_seq(0)
    }

    /// A fold over a window whose first event has absolute seq `base_seq`. Nodes before
    /// the window are unknown, so a replace reaching them fails as "not found" (as in DSH).
    pub fn with_base_seq(base_seq: u64) -> Self {
        Self {
            next_seq: base_seq,
            nodes: Vec::new(),
            rewrite_keys: HashMap::new(),
            replace_generation: 0,
        }
    }

    /// The seqs visible to the model, in positional order (not necessarily sorted).
    pub fn nodes(&self) -> Vec<u64> {
        self.nodes.iter().map(|node| node.seq).collect()
    }

    /// Committed replaces so far; changes exactly when the surface was rewritten.
    pub fn replace_generation(&self) -> u64 {
        self.replace_generation
    }

    /// The seq the next event must carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Whether `seq` is currently a visible node.
    pub fn contains(&self, seq: u64) -> bool {
        self.nodes.iter().any(|node| node.seq == seq)
    }

    /// Validates `event` against every always-on surface rule and, if it passes, applies it.
    pub fn apply(&mut self, event: &SessionEvent) -> Result<SurfaceChange, SessionError> {
        let change = self.plan(event, None)?;
        self.commit(&change, || {
            let node = SurfaceNode {
                seq: event.seq,
                message: projected_message(event),
            };
            let key = (event.event_type == TOOL_RESULT).then(|| rewrite_key(&event.data_value()));
            (node, key)
        });
        Ok(change)
    }

    /// [`Self::apply`] for a caller that parsed the event's payload itself and keeps the
    /// projected messages itself: `rewrite_key` is the event's rewrite key when it is a
    /// `tool/result` ([`rewrite_key`] or [`rewrite_key_from`] of its parsed payload), and the
    /// node's message text is not kept, so [`Self::derive_message_texts`],
    /// [`Self::derive_messages`], [`Self::node_messages`] and [`Self::to_parts`] of this fold
    /// no longer describe it. Every rule is checked exactly as by [`Self::apply`].
    pub(crate) fn apply_keeping_no_message(
        &mut self,
        event: &SessionEvent,
        rewrite_key: Option<Value>,
    ) -> Result<SurfaceChange, SessionError> {
        let change = self.plan(event, rewrite_key.as_ref())?;
        self.commit(&change, || {
            let node = SurfaceNode {
                seq: event.seq,
                message: None,
            };
            (
                node,
                rewrite_key.filter(|_| event.event_type == TOOL_RESULT),
            )
        });
        Ok(change)
    }

    /// Forgets the rewrite key of node `seq`, if it is still visible: a later rewrite of that
    /// `tool/result` is then refused (`ToolResultRewriteWrongTarget`), so a caller that
    /// forgets keys to bound its memory must treat that refusal as undecided.
    pub(crate) fn forget_rewrite_key(&mut self, seq: u64) {
        self.rewrite_keys.remove(&seq);
    }

    /// Applies a log-only event known only by its seq: the caller guarantees that its type
    /// is not one of the three surface types and that it carries neither `surfaceOp` nor
    /// `sourceEventSeqs`, so the one rule left to check is seq contiguity.
    pub fn apply_log_only(&mut self, seq: u64) -> Result<(), SessionError> {
        if seq != self.next_seq {
            return Err(SessionError::SeqNotContiguous {
                seq,
                expected: self.next_seq,
            });
        }
        self.next_seq += 1;
        Ok(())
    }

    /// Validates `event` without changing anything (DSH `validateNext`).
    pub fn validate_next(&self, event: &SessionEvent) -> Result<(), SessionError> {
        self.plan(event, None).map(|_| ())
    }

    /// `candidate_key`: the event's rewrite key if the caller has it (else computed on demand).
    fn plan(
        &self,
        event: &SessionEvent,
        candidate_key: Option<&Value>,
    ) -> Result<SurfaceChange, SessionError> {
        if event.seq != self.next_seq {
            return Err(SessionError::SeqNotContiguous {
                seq: event.seq,
                expected: self.next_seq,
            });
        }
        match surface_op_of(event)? {
            None => Ok(SurfaceChange::Unchanged),
            Some(SurfaceOp::Append) => {
                check_provenance(event, &[])?;
                Ok(SurfaceChange::Appended)
            }
            Some(SurfaceOp::Replace { start, end }) => {
                self.plan_replace(event, start, end, candidate_key)
            }
        }
    }

    fn plan_replace(
        &self,
        event: &SessionEvent,
        start: u64,
        end: u64,
        candidate_key: Option<&Value>,
    ) -> Result<SurfaceChange, SessionError> {
        let (start_index, end_index) = self.replacement_range(start, end)?;
        let shadowed_seqs: Vec<u64> = self.nodes[start_index..=end_index]
            .iter()
            .map(|node| node.seq)
            .collect();
        check_provenance(event, &shadowed_seqs)?;
        if event.event_type == TOOL_RESULT {
            self.check_tool_result_rewrite(event, start_index, end_index, candidate_key)?;
        }
        Ok(SurfaceChange::Replaced(SurfaceReplacement {
            seq: event.seq,
            start,
            end,
            shadowed_seqs,
        }))
    }

    fn replacement_range(&self, start: u64, end: u64) -> Result<(usize, usize), SessionError> {
        let position = |seq: u64| self.nodes.iter().position(|node| node.seq == seq);
        let start_index = position(start).ok_or(SessionError::ReplaceStartNotFound { start })?;
        let end_index = position(end).ok_or(SessionError::ReplaceEndNotFound { end })?;
        if start_index > end_index {
            return Err(SessionError::ReplaceReversed {
                start,
                start_index,
                end,
                end_index,
            });
        }
        Ok((start_index, end_index))
    }

    fn check_tool_result_rewrite(
        &self,
        event: &SessionEvent,
        start_index: usize,
        end_index: usize,
        candidate_key: Option<&Value>,
    ) -> Result<(), SessionError> {
        if start_index != end_index {
            return Err(SessionError::ToolResultRewriteNotSingle);
        }
        let Some(original) = self.rewrite_keys.get(&self.nodes[start_index].seq) else {
            return Err(SessionError::ToolResultRewriteWrongTarget);
        };
        let computed;
        let candidate = match candidate_key {
            Some(key) => key,
            None => {
                computed = rewrite_key(&event.data_value());
                &computed
            }
        };
        if !json_equal(original, candidate) {
            return Err(SessionError::ToolResultRewriteChangedMore);
        }
        Ok(())
    }

    /// Commits a planned change; `node` builds the event's node and its rewrite key (called
    /// only if it joins).
    fn commit(
        &mut self,
        change: &SurfaceChange,
        node: impl FnOnce() -> (SurfaceNode, Option<Value>),
    ) {
        self.next_seq += 1;
        let joined = match change {
            SurfaceChange::Unchanged => None,
            SurfaceChange::Appended => {
                let (node, key) = node();
                let seq = node.seq;
                self.nodes.push(node);
                Some((seq, key))
            }
            SurfaceChange::Replaced(replacement) => {
                let position = |seq| self.nodes.iter().position(|node| node.seq == seq);
                match (position(replacement.start), position(replacement.end)) {
                    (Some(first), Some(last)) => {
                        let (node, key) = node();
                        let seq = node.seq;
                        let removed = self.nodes.splice(first..=last, [node]);
                        for gone in removed {
                            self.rewrite_keys.remove(&gone.seq);
                        }
                        self.replace_generation += 1;
                        Some((seq, key))
                    }
                    _ => None,
                }
            }
        };
        if let Some((seq, Some(key))) = joined {
            self.rewrite_keys.insert(seq, key);
        }
    }

    /// The fold's whole state as plain parts (projection checkpoints, `cache/`).
    pub fn to_parts(&self) -> SurfaceFoldParts {
        let nodes = self.nodes.iter().map(|node| SurfaceNodeParts {
            seq: node.seq,
            message: node.message.as_ref().map(|raw| raw.get().to_owned()),
            rewrite_key: self.rewrite_keys.get(&node.seq).map(Value::to_string),
        });
        SurfaceFoldParts {
            next_seq: self.next_seq,
            replace_generation: self.replace_generation,
            nodes: nodes.collect(),
        }
    }

    /// Rebuilds a fold from [`Self::to_parts`]; `None` when a text is not JSON.
    pub fn from_parts(parts: SurfaceFoldParts) -> Option<Self> {
        let mut nodes = Vec::with_capacity(parts.nodes.len());
        let mut rewrite_keys = HashMap::new();
        for node in parts.nodes {
            let message = match node.message {
                Some(text) => Some(RawValue::from_string(text).ok()?),
                None => None,
            };
            if let Some(text) = node.rewrite_key {
                rewrite_keys.insert(node.seq, serde_json::from_str(&text).ok()?);
            }
            nodes.push(SurfaceNode {
                seq: node.seq,
                message,
            });
        }
        Some(Self {
            next_seq: parts.next_seq,
            nodes,
            rewrite_keys,
            replace_generation: parts.replace_generation,
        })
    }

    /// The projected message text of each visible node, in positional order (`None` for a
    /// node that derives no message).
    pub fn node_messages(&self) -> impl Iterator<Item = (u64, Option<&RawValue>)> {
        self.nodes
            .iter()
            .map(|node| (node.seq, node.message.as_deref()))
    }

    /// `deriveMessages()`: the message of every visible node in order, exact JSON text.
    pub fn derive_message_texts(&self) -> Vec<&RawValue> {
        self.nodes
            .iter()
            .filter_map(|node| node.message.as_deref())
            .collect()
    }

    /// `deriveMessages()` as values (lone surrogates become U+FFFD; use the texts for bytes).
    pub fn derive_messages(&self) -> Vec<Value> {
        let texts = self.derive_message_texts().into_iter();
        texts
            .map(|text| json::value_lossy(text.get()).unwrap_or(Value::Null))
            .collect()
    }
}

fn texts<'fold>(raws: &[&'fold RawValue]) -> Vec<&'fold str> {
    raws.iter().map(|raw| raw.get()).collect()
}

/// DSH `foldSurface`: folds a log from seq 0 and reports every replacement.
pub fn fold_surface(events: &[SessionEvent]) -> Result<SurfaceFoldResult, SessionError> {
    let mut fold = SurfaceFold::new();
    let mut replacements = Vec::new();
    for event in events {
        if let SurfaceChange::Replaced(replacement) = fold.apply(event)? {
            replacements.push(replacement);
        }
    }
    Ok(SurfaceFoldResult {
        nodes: fold.nodes(),
        replacements,
    })
}

/// `surfaceOpOf` (§3.3 a): the marker of a surface event, `None` for a log-only event.
fn surface_op_of(event: &SessionEvent) -> Result<Option<SurfaceOp>, SessionError> {
    let event_type = || event.event_type.clone();
    if !super::event::is_surface_eligible_type(&event.event_type) {
        if event.surface_op.is_some() {
            return Err(SessionError::SurfaceOpOnIneligible {
                event_type: event_type(),
            });
        }
        if event.source_event_seqs.is_some() {
            return Err(SessionError::SourcesOnIneligible {
                event_type: event_type(),
            });
        }
        return Ok(None);
    }
    match event.surface_op {
        None => Err(SessionError::MissingSurfaceOp {
            event_type: event_type(),
        }),
        some => Ok(some),
    }
}

/// `assertProvenance` (§3.3 b); `shadowed` is empty for an append.
fn check_provenance(event: &SessionEvent, shadowed: &[u64]) -> Result<(), SessionError> {
    let sources: &[u64] = event.source_event_seqs.as_deref().unwrap_or(&[]);
    if event.source_event_seqs.is_some()
        && sources.is_empty()
        && event.event_type != ASSISTANT_MESSAGE
    {
        return Err(SessionError::SourcesEmpty);
    }
    // A compaction's replacement names every event it shadows: thousands of sources in a
    // long session, so membership goes through a set, not a scan per shadowed event.
    // Sources in ascending order (as DSH writes them) are distinct as they stand and are
    // searched by bisection: no set to build for every message.
    let ascending = sources.windows(2).all(|pair| pair[0] < pair[1]);
    let mut distinct = std::collections::HashSet::new();
    if !ascending {
        distinct.reserve(sources.len());
        if !sources.iter().all(|seq| distinct.insert(*seq)) {
            return Err(SessionError::SourcesDuplicate);
        }
    }
    if let Some(offender) = sources.iter().find(|source| **source >= event.seq) {
        return Err(SessionError::SourcesNotEarlier {
            offender: *offender,
            seq: event.seq,
        });
    }
    let cited = |seq: &u64| match ascending {
        true => sources.binary_search(seq).is_ok(),
        false => distinct.contains(seq),
    };
    let missing: Vec<u64> = shadowed.iter().copied().filter(|seq| !cited(seq)).collect();
    if !missing.is_empty() {
        return Err(SessionError::ReplaceMissingShadowed { missing });
    }
    Ok(())
}

/// `deriveEventMessage` (§4): the raw text of the event's message, if it projects one.
pub(crate) fn projected_message(event: &SessionEvent) -> Option<Box<RawValue>> {
    let data = event.data.get();
    match event.event_type.as_str() {
        USER_MESSAGE => Some(event.data.clone()).filter(|_| data.trim() != "null"),
        TOOL_RESULT => json::member(data, "message").map(ToOwned::to_owned),
        ASSISTANT_MESSAGE => {
            let message = json::member(data, "message")?;
            let content = json::member(message.get(), "content")?;
            let content: Vec<&RawValue> = serde_json::from_str(content.get()).ok()?;
            (!content.is_empty()).then(|| message.to_owned())
        }
        _ => None,
    }
}

/// The tool-result payload with `message.content` reduced to its first block whose inner
/// `content` is nulled: everything else must survive a rewrite unchanged (§3.4). Built
/// member by member so that the (possibly large) result content is never copied.
pub(crate) fn rewrite_key(data: &Value) -> Value {
    let Value::Object(members) = data else {
        return data.clone();
    };
    let Some(Value::Object(message)) = members.get("message") else {
        return data.clone();
    };
    let Some(block) = message.get("content").and_then(|content| content.get(0)) else {
        return data.clone();
    };
    let reduced_block = match block {
        Value::Object(block_members) => {
            Value::Object(with_member(block_members, "content", || Value::Null))
        }
        other => other.clone(),
    };
    let message = with_member(message, "content", || reduced_block);
    Value::Object(with_member(members, "message", || Value::Object(message)))
}

/// [`rewrite_key`] of a payload the caller gives up: made in place, nothing copied.
pub(crate) fn rewrite_key_from(mut data: Value) -> Value {
    let content = data
        .get_mut("message")
        .and_then(|message| message.get_mut("content"));
    if let Some(content) = content {
        if let Some(mut block) = content.get_mut(0).map(std::mem::take) {
            if let Some(block_members) = block.as_object_mut() {
                block_members.insert("content".to_owned(), Value::Null);
            }
            *content = block;
        }
    }
    data
}

/// A copy of `members` whose member `key` is `value()` instead (in its place, or appended
/// when absent, as `Map::insert` does); the replaced member's value is not copied.
fn with_member(
    members: &serde_json::Map<String, Value>,
    key: &str,
    value: impl FnOnce() -> Value,
) -> serde_json::Map<String, Value> {
    let mut value = Some(value);
    let mut out = serde_json::Map::with_capacity(members.len() + 1);
    for (name, member) in members {
        let replaced = if name == key {
            value.take().map(|make| make())
        } else {
            None
        };
        out.insert(name.clone(), replaced.unwrap_or_else(|| member.clone()));
    }
    if let Some(make) = value {
        out.insert(key.to_owned(), make());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `assertProvenance` as it stood before the ascending-order reading: every list
    /// through a set.
    fn provenance_through_a_set(event: &SessionEvent, shadowed: &[u64]) -> String {
        let sources: &[u64] = event.source_event_seqs.as_deref().unwrap_or(&[]);
        if event.source_event_seqs.is_some()
            && sources.is_empty()
            && event.event_type != ASSISTANT_MESSAGE
        {
            return format!("{:?}", SessionError::SourcesEmpty);
        }
        let mut distinct = std::collections::HashSet::new();
        if !sources.iter().all(|seq| distinct.insert(*seq)) {
            return format!("{:?}", SessionError::SourcesDuplicate);
        }
        if let Some(offender) = sources.iter().find(|source| **source >= event.seq) {
            let error = SessionError::SourcesNotEarlier {
                offender: *offender,
                seq: event.seq,
            };
            return format!("{error:?}");
        }
        let missing: Vec<u64> = shadowed
            .iter()
            .copied()
            .filter(|seq| !distinct.contains(seq))
            .collect();
        match missing.is_empty() {
            true => "Ok(())".to_owned(),
            false => format!("{:?}", SessionError::ReplaceMissingShadowed { missing }),
        }
    }

    /// Ascending, unordered, repeated, late and missing sources give the same verdict
    /// (and the same first error) as the reading through a set.
    #[test]
    fn provenance_in_ascending_order_is_checked_as_through_a_set() {
        let lists: [&[u64]; 9] = [
            &[],
            &[1, 2, 3],
            &[3, 1, 2],
            &[1, 1, 2],
            &[2, 1, 1],
            &[1, 2, 9],
            &[9, 2],
            &[0, 4, 5, 6],
            &[5, 4, 6, 0],
        ];
        let shadowed: [&[u64]; 4] = [&[], &[1, 2], &[4, 6], &[3]];
        let mut event = SessionEvent::new(TOOL_RESULT, 7, 1, "{}").expect("valid data");
        for sources in lists {
            for shadows in shadowed {
                event.source_event_seqs = Some(sources.to_vec());
                let verdict = match check_provenance(&event, shadows) {
                    Ok(()) => "Ok(())".to_owned(),
                    Err(error) => format!("{error:?}"),
                };
                let expected = provenance_through_a_set(&event, shadows);
                assert_eq!(verdict, expected, "{sources:?} shadowing {shadows:?}");
            }
        }
    }
}
