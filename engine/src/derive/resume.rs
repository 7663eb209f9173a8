//! DSH's cold load over a store: the full restore, derived messages and surface, and the
//! resume that repairs a session for writing.

use super::cold;
use crate::exchange::{plain_event, session_events, OwnedEvent, Result};
use crate::session::{fold_surface, restore_session, KeyOrder, RestoredSession, SessionEvent};
use crate::storage::frame::EVENT_FLAG_BATCH_START;
use crate::store::{now_millis, NewEvent, Receipt, SessionWriter, Store};
use serde_json::Value;

/// The session cold-loaded as DSH does (migration, repair closers in memory, end-seed).
pub fn restore(store: &Store, id: &str) -> Result<RestoredSession> {
    let events = session_events(store, id)?;
    Ok(restore_session(id, &events, now_millis())?)
}

/// DSH's `deriveMessages()` after a cold load. Streams the log ([`cold::stream_messages`]) and
/// falls back to the full cold load ([`messages_full`]) when the log needs what only that
/// does (legacy migration, a refusal to report); the result is identical either way.
pub fn messages(store: &Store, id: &str) -> Result<Vec<Value>> {
    match cold::stream_messages(store, id)? {
        cold::Streamed::Messages(messages) => Ok(messages),
        cold::Streamed::NeedsFullLoad(_) => messages_full(store, id),
    }
}

/// DSH's `deriveMessages()` after a cold load, as the messages' exact JSON texts (what
/// [`SurfaceFold::derive_message_texts`](crate::session::SurfaceFold::derive_message_texts)
/// gives after the full load). Streams the log like [`messages`], building no `Value` of
/// any message; falls back to the full cold load like it.
pub fn message_texts(store: &Store, id: &str) -> Result<Vec<String>> {
    match cold::stream_message_texts(store, id)? {
        cold::Streamed::Messages(texts) => Ok(texts),
        cold::Streamed::NeedsFullLoad(_) => Ok(restore(store, id)?
            .surface
            .derive_message_texts()
            .into_iter()
            .map(|text| text.get().to_owned())
            .collect()),
    }
}

/// DSH's `deriveMessages()` after the full cold load ([`restore`]): every event materialised
/// and validated, then the surface derived. The reference [`messages`] is tested against.
pub fn messages_full(store: &Store, id: &str) -> Result<Vec<Value>> {
    Ok(restore(store, id)?.surface.derive_messages())
}

/// The surface after a cold load: `{nodes, replaceGeneration, foldSurface:{nodes, replacements}}`.
pub fn surface(store: &Store, id: &str) -> Result<Value> {
    let restored = restore(store, id)?;
    let fold = fold_surface(&restored.events)?;
    let replacements: Vec<Value> = fold
        .replacements
        .iter()
        .map(|replacement| {
            serde_json::json!({
                "seq": replacement.seq,
                "start": replacement.start,
                "end": replacement.end,
                "shadowedSeqs": replacement.shadowed_seqs,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "nodes": restored.surface.nodes(),
        "replaceGeneration": restored.surface.replace_generation(),
        "foldSurface": {"nodes": fold.nodes, "replacements": replacements},
    }))
}

/// Appends DSH's interrupted-turn closers (in DSH's repair key order, as one batch) and
/// returns how many were appended.
pub fn repair(store: &Store, id: &str) -> Result<usize> {
    Ok(resume(store, id)?.closers_appended())
}

/// Events as DSH's writer renders them, the first flagged as the start of a DSH batch.
fn rendered_batch(events: &[SessionEvent], order: KeyOrder) -> Vec<OwnedEvent> {
    let mut owned = Vec::with_capacity(events.len());
    for (position, event) in events.iter().enumerate() {
        let line = event.to_json_line(order);
        let mut stored = plain_event(event, line.as_bytes());
        if position == 0 {
            stored.flags |= EVENT_FLAG_BATCH_START;
        }
        owned.push(stored);
    }
    owned
}

/// A session cold-loaded for writing, as DSH's `prepare` leaves it: the crash-repair closers
/// of a trailing open turn are already durable (one atomic batch, where DSH needs two
/// fsynced steps), and the `session/end-seed` marker of this lifecycle waits in memory until
/// the first live batch, with which it is written atomically (a lifecycle that writes
/// nothing leaves no marker, as in DSH).
pub struct ResumedSession {
    writer: SessionWriter,
    restored: RestoredSession,
    pending_end_seed: Option<OwnedEvent>,
    closers_appended: usize,
}

impl ResumedSession {
    /// The cold-loaded session: stored events, closers, the in-memory end-seed, surface.
    pub fn restored(&self) -> &RestoredSession {
        &self.restored
    }

    /// How many closers the resume appended.
    pub fn closers_appended(&self) -> usize {
        self.closers_appended
    }

    /// Seq of the first event this lifecycle writes (after the end-seed marker, if any).
    pub fn next_seq(&self) -> u64 {
        self.restored.events.len() as u64
    }

    /// Appends a batch of live events atomically, preceded by the pending end-seed marker.
    pub fn append_batch(&mut self, events: &[NewEvent<'_>]) -> Result<Receipt> {
        let receipt = match &self.pending_end_seed {
            Some(marker) => {
                let mut batch = Vec::with_capacity(events.len() + 1);
                batch.push(marker.as_new());
                batch.extend_from_slice(events);
                self.writer.append_batch(&batch)?
            }
            None => self.writer.append_batch(events)?,
        };
        self.pending_end_seed = None;
        Ok(receipt)
    }

    /// Gives up the end-seed bookkeeping and returns the raw writer.
    pub fn into_writer(self) -> SessionWriter {
        self.writer
    }
}

/// Cold-loads a session for writing (DSH's `prepare`): takes the session's writer, validates
/// the stored log as DSH's cold load does, and durably appends DSH's interrupted-turn
/// closers, so a session a crash left mid-turn resumes closed. Fails, writing nothing, when
/// the log does not pass DSH's cold-load validation or another writer holds the session.
pub fn resume(store: &Store, id: &str) -> Result<ResumedSession> {
    let mut writer = store.writer(id)?;
    let restored = restore(store, id)?;
    let closers_appended = restored.closers.len();
    if closers_appended > 0 {
        let owned = rendered_batch(&restored.closers, KeyOrder::RepairCloser);
        let batch: Vec<NewEvent<'_>> = owned.iter().map(OwnedEvent::as_new).collect();
        writer.append_batch(&batch)?;
    }
    let pending_end_seed = restored
        .events
        .get(usize::try_from(restored.first_live_seq).unwrap_or(usize::MAX))
        .map(|marker| rendered_batch(std::slice::from_ref(marker), KeyOrder::LiveAppend))
        .and_then(|mut batch| batch.pop());
    Ok(ResumedSession {
        writer,
        restored,
        pending_end_seed,
        closers_appended,
    })
}
