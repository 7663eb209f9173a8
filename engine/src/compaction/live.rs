//! A live session above the log: appends that apply DSH's spill policy and keep the
//! projection cache's checkpoints following, plus compaction and pruning on the same handle.

use super::{
    compact, pairing_deltas, prune_session, select_compactable_range, CompactionOwner,
    CompactionResult, PruneReport, PrunerConfig, SummaryInput,
};
use crate::derive::cache::{Builtins, ProjectionCache};
use crate::error::Result;
use crate::session::event::TOOL_RESULT;
use crate::spill::{spill_tool_result, BlobHash, SpillStore, DSH_MAX_INLINE_BYTES};
use crate::store::{NewEvent, Receipt, SessionWriter};

/// The writer of one session with its cache and spill store.
pub struct LiveSession {
    writer: SessionWriter,
    cache: ProjectionCache,
    spill: SpillStore,
    /// Plain-text tool results above this many UTF-8 bytes are spilled (DSH: 50,000).
    max_inline_bytes: usize,
}

impl LiveSession {
    /// Wraps `writer`; the spill store lives in the cache's store directory.
    pub fn new(writer: SessionWriter, cache: ProjectionCache) -> Self {
        let spill = SpillStore::new(cache.store().storage());
        Self {
            writer,
            cache,
            spill,
            max_inline_bytes: DSH_MAX_INLINE_BYTES,
        }
    }

    /// Sets the spill threshold in bytes (`usize::MAX` turns spilling off).
    pub fn with_max_inline_bytes(mut self, bytes: usize) -> Self {
        self.max_inline_bytes = bytes;
        self
    }

    pub fn id(&self) -> &str {
        self.writer.id()
    }

    pub fn spill(&self) -> &SpillStore {
        &self.spill
    }

    /// Appends `events` as one atomic batch. Each appended `tool/result` above the spill
    /// threshold is stored whole as a blob first (durable before the batch) and appended
    /// with DSH's preview and locator instead. Returns the receipt and, per event, the blob
    /// it was spilled to. Checkpoints follow (at `turn/end` and every N durable events).
    pub fn append_batch(
        &mut self,
        events: &[NewEvent<'_>],
    ) -> Result<(Receipt, Vec<Option<BlobHash>>)> {
        let mut rewritten: Vec<Option<String>> = Vec::with_capacity(events.len());
        let mut blobs = Vec::with_capacity(events.len());
        for event in events {
            let spilled = if event.event_type == TOOL_RESULT {
                spill_tool_result(&self.spill, event.data, self.max_inline_bytes)?
            } else {
                None
            };
            blobs.push(spilled.as_ref().map(|spilled| spilled.hash));
            rewritten.push(spilled.map(|spilled| spilled.data));
        }
        let batch: Vec<NewEvent<'_>> = events
            .iter()
            .zip(&rewritten)
            .map(|(event, data)| match data {
                Some(data) => NewEvent { data, ..*event },
                None => *event,
            })
            .collect();
        let receipt = self.writer.append_batch(&batch)?;
        let types: Vec<&str> = events.iter().map(|event| event.event_type).collect();
        // The cache follows the log; a failed checkpoint never fails the append.
        let _ = self.cache.note_appended(self.writer.id(), &receipt, &types);
        Ok((receipt, blobs))
    }

    /// The built-in projections now (newest checkpoints plus the tail).
    pub fn projections(&self) -> Result<Builtins> {
        Ok(self.cache.read_builtins(self.writer.id())?.0)
    }

    /// [`compact`] on this session.
    pub fn compact(
        &mut self,
        start: u64,
        end: u64,
        owner: CompactionOwner,
        summary: &SummaryInput,
    ) -> Result<CompactionResult> {
        compact(&self.cache, &mut self.writer, start, end, owner, summary)
    }

    /// Compacts the head-anchored span that leaves about `retain_tokens` tokens of the newest
    /// surface (DSH's `selectCompactableRange`); `None` when there is nothing to compact.
    /// `summarize` gets the derived messages (JSON texts) of the span.
    pub fn compact_to_budget(
        &mut self,
        retain_tokens: u64,
        owner: CompactionOwner,
        summarize: impl FnOnce(&[&str]) -> SummaryInput,
    ) -> Result<Option<CompactionResult>> {
        let builtins = self.projections()?;
        let nodes = builtins.surface.nodes();
        let deltas = pairing_deltas(self.cache.store(), self.writer.id(), &nodes)?;
        let prices = &builtins.tokens.nodes;
        let Some((start, end)) = select_compactable_range(&nodes, prices, &deltas, retain_tokens)?
        else {
            return Ok(None);
        };
        let span: Vec<&str> = builtins
            .surface
            .node_messages()
            .skip_while(|(seq, _)| *seq != start)
            .scan(false, |done, (seq, message)| {
                let item = (!*done).then_some(message);
                *done = *done || seq == end;
                item
            })
            .flatten()
            .map(|raw| raw.get())
            .collect();
        let summary = summarize(&span);
        self.compact(start, end, owner, &summary).map(Some)
    }

    /// DSH's tool-result pruner on this session, spilling the full texts.
    pub fn prune(&mut self, config: &PrunerConfig) -> Result<PruneReport> {
        prune_session(&self.cache, &mut self.writer, Some(&self.spill), config)
    }

    /// The wrapped writer back.
    pub fn into_writer(self) -> SessionWriter {
        self.writer
    }
}
