//! The hot tier: the node's local dshdb store, behind a small trait so that the model tests
//! can run ten thousand schedules on an in-memory tier ([`MemoryTier`]) while the node binary
//! and the engine-backed tests use the real engine ([`EngineTier`]).
//!
//! The local copy is a cache of the replicated history: a node rebuilds it from the cold store
//! and the tail whenever it is not known to match (see `node.rs`), so the tier needs only
//! create, append at a known seq, read, and replace.

use crate::error::{FleetError, FleetResult};
use dshdb::{Event, NewEvent, SessionWriter, Store};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// A local append in flight: [`LocalPending::wait`] returns once it is durable.
pub trait LocalPending: Send {
    fn wait(self: Box<Self>) -> FleetResult<()>;

    /// Whether [`LocalPending::wait`] would return at once.
    fn is_settled(&self) -> bool;

    /// Calls `call` once [`LocalPending::wait`] would return at once (now, or later on
    /// another thread): an async caller awaits that instead of blocking a thread.
    fn when_settled(&self, call: Box<dyn FnOnce() + Send>) {
        call();
    }
}

/// The node's local store.
pub trait LocalTier: Send + Sync + 'static {
    /// The session's length, or `None` when the tier does not hold it.
    fn length(&self, session: &str) -> Option<u64>;

    /// Queues `events` (their seqs must continue the session) for a durable append.
    fn submit(&self, session: &str, events: &[Event]) -> FleetResult<Box<dyn LocalPending>>;

    /// Events with seq in `from..to`.
    fn read(&self, session: &str, from: u64, to: u64) -> FleetResult<Vec<Event>>;

    /// Makes the local copy exactly `header` + `events` (seqs from 0), durably: drops any
    /// copy it had.
    fn replace(&self, session: &str, header: &str, events: &[Event]) -> FleetResult<()>;
}

fn new_event(event: &Event) -> NewEvent<'_> {
    NewEvent {
        event_type: &event.event_type,
        time: Some(event.time),
        data: &event.data,
        envelope: &event.envelope,
        flags: event.flags,
    }
}

fn diverged(session: &str, expected: u64, got: u64) -> FleetError {
    FleetError::Rebuild {
        session: session.to_string(),
        from: expected,
        reason: format!("local store gave seq {got} where {expected} was expected"),
    }
}

/// The local dshdb store, through the engine's public API.
pub struct EngineTier {
    store: Store,
    writers: Mutex<HashMap<String, SessionWriter>>,
}

struct EnginePending(dshdb::PendingReceipt);

impl LocalPending for EnginePending {
    fn wait(self: Box<Self>) -> FleetResult<()> {
        self.0.wait()?;
        Ok(())
    }

    fn is_settled(&self) -> bool {
        self.0.is_settled()
    }

    fn when_settled(&self, call: Box<dyn FnOnce() + Send>) {
        self.0.when_settled(call);
    }
}

impl EngineTier {
    pub fn new(store: Store) -> EngineTier {
        EngineTier {
            store,
            writers: Mutex::new(HashMap::new()),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl LocalTier for EngineTier {
    fn length(&self, session: &str) -> Option<u64> {
        self.store
            .session(session)
            .ok()
            .map(|summary| summary.events)
    }

    fn submit(&self, session: &str, events: &[Event]) -> FleetResult<Box<dyn LocalPending>> {
        let first = events.first().map_or(0, |event| event.seq);
        let batch: Vec<NewEvent<'_>> = events.iter().map(new_event).collect();
        let mut writers = self.writers.lock();
        if !writers.contains_key(session) {
            let writer = self.store.writer(session)?;
            writers.insert(session.to_string(), writer);
        }
        let writer = writers
            .get_mut(session)
            .ok_or_else(|| FleetError::UnknownSession {
                session: session.to_string(),
            })?;
        let pending = writer.submit_batch(&batch)?;
        if pending.first_seq() != first {
            let got = pending.first_seq();
            // Wait for it so that it is not left in flight; the caller rebuilds the session.
            let _ = pending.wait();
            return Err(diverged(session, first, got));
        }
        Ok(Box::new(EnginePending(pending)))
    }

    fn read(&self, session: &str, from: u64, to: u64) -> FleetResult<Vec<Event>> {
        Ok(self.store.read(session, from, to)?)
    }

    fn replace(&self, session: &str, header: &str, events: &[Event]) -> FleetResult<()> {
        let mut writers = self.writers.lock();
        writers.remove(session);
        if self.store.session(session).is_ok() {
            self.store.delete_session(session)?;
        }
        let batch: Vec<NewEvent<'_>> = events.iter().map(new_event).collect();
        let writer = self.store.create_session_with_events(header, &batch)?;
        writers.insert(session.to_string(), writer);
        Ok(())
    }
}

/// A session of the memory tier: its header and events.
type MemorySession = (String, Vec<Event>);

/// An in-memory tier for the model tests: every append is durable when it returns, and
/// [`MemoryTier::wipe`] models the loss of the node's disk.
#[derive(Default, Clone)]
pub struct MemoryTier {
    sessions: Arc<Mutex<HashMap<String, MemorySession>>>,
}

struct Done;

impl LocalPending for Done {
    fn wait(self: Box<Self>) -> FleetResult<()> {
        Ok(())
    }

    fn is_settled(&self) -> bool {
        true
    }
}

impl MemoryTier {
    /// Forgets everything (a node that comes back with an empty disk).
    pub fn wipe(&self) {
        self.sessions.lock().clear();
    }
}

impl LocalTier for MemoryTier {
    fn length(&self, session: &str) -> Option<u64> {
        self.sessions
            .lock()
            .get(session)
            .map(|(_, events)| events.len() as u64)
    }

    fn submit(&self, session: &str, events: &[Event]) -> FleetResult<Box<dyn LocalPending>> {
        let mut sessions = self.sessions.lock();
        let (_, stored) = sessions
            .get_mut(session)
            .ok_or_else(|| FleetError::UnknownSession {
                session: session.to_string(),
            })?;
        let expected = stored.len() as u64;
        let first = events.first().map_or(expected, |event| event.seq);
        if first != expected {
            return Err(diverged(session, first, expected));
        }
        stored.extend_from_slice(events);
        Ok(Box::new(Done))
    }

    fn read(&self, session: &str, from: u64, to: u64) -> FleetResult<Vec<Event>> {
        let sessions = self.sessions.lock();
        let (_, stored) = sessions
            .get(session)
            .ok_or_else(|| FleetError::UnknownSession {
                session: session.to_string(),
            })?;
        Ok(stored
            .iter()
            .filter(|event| event.seq >= from && event.seq < to)
            .cloned()
            .collect())
    }

    fn replace(&self, session: &str, header: &str, events: &[Event]) -> FleetResult<()> {
        self.sessions
            .lock()
            .insert(session.to_string(), (header.to_string(), events.to_vec()));
        Ok(())
    }
}
