//! Session lifecycle: create, fork (seeded children), delete (tombstones), the writer slot,
//! and listing sessions.

use super::{
    now_millis, validate::validate_event, validate::validate_header, writer::encode_commit,
    writer::encode_header_if_new, writer::PendingReceipt, Event, NewEvent, SessionSummary,
    SessionWriter, Store,
};
use crate::error::{Error, Result};
use crate::session::{validate_fork_boundary_of, ForkBoundaryEvent, END_SEED_TYPE};
use crate::storage::catalog::{Catalog, Seed, SessionEntry};
use crate::storage::commit::Durability;
use crate::storage::frame::Record;

/// Looks up session `id` and takes its writer slot: one writer handle (or one delete in
/// flight) per session; a taken slot is `SessionBusy`.
pub(super) fn claim_writer_slot<'catalog>(
    catalog: &'catalog mut Catalog,
    id: &str,
) -> Result<(u32, &'catalog mut SessionEntry)> {
    let unknown = || Error::UnknownSession { id: id.to_string() };
    let number = *catalog.by_id.get(id).ok_or_else(unknown)?;
    let entry = catalog.sessions.get_mut(&number).ok_or_else(unknown)?;
    if entry.has_writer {
        return Err(Error::SessionBusy {
            id: id.to_string(),
            pid: Some(std::process::id()),
        });
    }
    entry.has_writer = true;
    Ok((number, entry))
}

/// The store's events checked by the session model's fork rule (one rule, DSH's text).
impl ForkBoundaryEvent for Event {
    fn fork_seq(&self) -> u64 {
        self.seq
    }

    fn fork_event_type(&self) -> &str {
        &self.event_type
    }

    fn fork_data(&self) -> serde_json::Value {
        // Stored payloads are JSON (checked on append); an unreadable one has no `turn`,
        // which DSH shows as `undefined`.
        serde_json::from_str(&self.data).unwrap_or_default()
    }
}

impl Store {
    /// Creates a session from its DSH header (JSON text, kept verbatim) and returns its writer.
    pub fn create_session(&self, header_json: &str) -> Result<SessionWriter> {
        self.create_session_with(header_json, self.inner.options.durability)
    }

    /// Creates a session with a minimal DSH header `{"version":0,"id":..,"createdAt":now}`.
    pub fn create_session_with_id(&self, id: &str) -> Result<SessionWriter> {
        let header = serde_json::json!({"version": 0, "id": id, "createdAt": now_millis()});
        self.create_session(&header.to_string())
    }

    /// Creates a session and commits its header together with `events` as one atomic batch:
    /// after a crash either the session exists with all of them or not at all.
    pub fn create_session_with_events(
        &self,
        header_json: &str,
        events: &[NewEvent<'_>],
    ) -> Result<SessionWriter> {
        self.create_with_seed(header_json, None, events, self.inner.options.durability)
    }

    pub(super) fn create_session_with(
        &self,
        header_json: &str,
        durability: Durability,
    ) -> Result<SessionWriter> {
        self.create_with_seed(header_json, None, &[], durability)
    }

    /// Creates a session (optionally a fork sharing `seed`) and commits its header together
    /// with `initial` events as one batch.
    pub(super) fn create_with_seed(
        &self,
        header_json: &str,
        seed: Option<Seed>,
        initial: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<SessionWriter> {
        self.log()?;
        let id = validate_header(header_json)?;
        super::staging::refuse_stage_id(&id)?;
        self.create_named(id, header_json, seed, initial, durability)
    }

    /// [`Self::create_with_seed`] once the header is validated as naming `id`; also how a
    /// stage (whose id no other creation may take) is created.
    pub(super) fn create_named(
        &self,
        id: String,
        header_json: &str,
        seed: Option<Seed>,
        initial: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<SessionWriter> {
        let (writer, pending) = self.submit_named(id, header_json, seed, initial, durability)?;
        let number = writer.number;
        if let Err(error) = pending.wait() {
            self.forget_if_refused(number, &error);
            return Err(error);
        }
        Ok(writer)
    }

    /// Validates `events`, takes the session's lease (another process may be creating the
    /// same id: its lease decides, F-08-10) and queues the header with `events`, without
    /// waiting; the lease is given back if nothing was queued.
    fn submit_named(
        &self,
        id: String,
        header_json: &str,
        seed: Option<Seed>,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<(SessionWriter, PendingReceipt)> {
        for event in events {
            validate_event(event)?;
        }
        let leased = self.lease_and_refresh(&id)?;
        match self.reserve_and_commit(&id, seed, header_json, events, durability) {
            Ok((number, pending)) => {
                let writer = SessionWriter {
                    store: self.clone(),
                    number,
                    id,
                    durability,
                    last_ticket: pending.ticket,
                };
                Ok((writer, pending))
            }
            Err(error) => {
                if leased {
                    self.release_lease(&id);
                }
                Err(error)
            }
        }
    }

    /// Reserves a new session and queues its first batch, on this process's turn at the
    /// tail so that no other process takes the same session number (F-08-6 step 4).
    fn reserve_and_commit(
        &self,
        id: &str,
        seed: Option<Seed>,
        header_json: &str,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<(u32, PendingReceipt)> {
        let log = self.log()?;
        let _turn = log.pin_tail()?;
        let number = self.reserve(id, seed, header_json)?;
        match self.commit_batch(number, events, durability) {
            Ok(pending) => Ok((number, pending)),
            Err(error) => {
                self.forget_if_refused(number, &error);
                Err(error)
            }
        }
    }

    /// Creates a session like [`Store::create_session_with_events`] (header and `events` in
    /// one atomic batch, `events` not empty) without waiting for the commit: the returned
    /// receipt's [`PendingReceipt::wait`] returns once the batch is as durable as
    /// `durability` says, so many sessions' first batches can share one group commit. The
    /// session is readable at once. If the wait fails, the session stays reserved in this
    /// handle (the log is poisoned; the next open decides whether it exists).
    pub fn submit_session_with_events(
        &self,
        header_json: &str,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<(SessionWriter, PendingReceipt)> {
        if events.is_empty() {
            return Err(Error::invalid("an empty batch"));
        }
        self.log()?;
        let id = validate_header(header_json)?;
        super::staging::refuse_stage_id(&id)?;
        self.submit_named(id, header_json, None, events, durability)
    }

    /// Reserves session `id` in the catalog with its writer slot taken.
    pub(super) fn reserve(&self, id: &str, seed: Option<Seed>, header_json: &str) -> Result<u32> {
        let mut catalog = self.inner.catalog.write();
        if catalog.by_id.contains_key(id) {
            return Err(Error::DuplicateSession { id: id.to_string() });
        }
        let number = catalog.reserve_session(id.to_string(), seed, header_json.to_string());
        if let Some(entry) = catalog.sessions.get_mut(&number) {
            entry.has_writer = true;
        }
        Ok(number)
    }

    /// Forgets a new session's reservation when its first commit was refused before
    /// anything was queued. Otherwise (a poisoned log) the outcome is unknown and the next
    /// open decides.
    pub(super) fn forget_if_refused(&self, number: u32, error: &Error) {
        if matches!(
            error,
            Error::TooLarge { .. }
                | Error::DiskFull { .. }
                | Error::ReadOnlyFileSystem { .. }
                | Error::Closed
                | Error::Io { .. }
        ) {
            self.inner.catalog.write().unreserve_session(number);
        }
    }

    /// Forks `parent` after seq `at` (inclusive) into a new session `child` (DSH `fork`): the
    /// child's header names the parent and `seedLength = at + 1`; its first events are read
    /// from the parent, never copied; a `session/end-seed` event follows them.
    pub fn fork(&self, parent: &str, at: u64, child: &str) -> Result<SessionWriter> {
        self.log()?;
        if self.session(child).is_ok() {
            return Err(Error::DuplicateSession {
                id: child.to_string(),
            });
        }
        let parent_summary = self.session(parent)?;
        // Enough events to check the boundary: all of `0..=at`, or the whole log when `at`
        // is past its end (DSH's text then names the last seq).
        let seed_events = self.read(parent, 0, at.saturating_add(1))?;
        validate_fork_boundary_of(parent, &seed_events, Some(at))
            .map_err(|source| Error::Fork { source })?;
        let parent_number = self.with_session(parent, |entry| entry.number)?;
        let mut header = serde_json::Map::new();
        header.insert("version".into(), 0.into());
        header.insert("id".into(), child.into());
        header.insert("createdAt".into(), now_millis().into());
        let parent_header: serde_json::Value =
            serde_json::from_str(&parent_summary.header_json).unwrap_or_default();
        if let Some(cwd) = parent_header.get("cwd") {
            header.insert("cwd".into(), cwd.clone());
        }
        header.insert("parentSession".into(), parent.into());
        header.insert("seedLength".into(), (at + 1).into());
        let header_json = serde_json::Value::Object(header).to_string();
        let seed = Some(Seed {
            parent: parent_number,
            length: at + 1,
        });
        let ends_with_marker = seed_events
            .last()
            .is_some_and(|event| event.event_type == END_SEED_TYPE);
        let marker = NewEvent::new(END_SEED_TYPE, "{}");
        let initial: &[NewEvent<'_>] = if ends_with_marker { &[] } else { &[marker] };
        self.create_with_seed(&header_json, seed, initial, self.inner.options.durability)
    }

    /// Deletes session `id` (F-02-18): logs a tombstone and returns once it is durable.
    /// Afterwards the session is gone from [`Store::sessions`], reads and [`Store::writer`]
    /// (`UnknownSession`) and its id may name a new session. Its events are dropped at the
    /// next sealing, except the prefix a live fork reads as its seed (F-06-24).
    /// A session whose writer handle is alive is refused (`SessionBusy`), changing nothing.
    pub fn delete_session(&self, id: &str) -> Result<()> {
        let log = self.log()?;
        let leased = self.lease_and_refresh(id)?;
        let outcome = self.delete_leased(log, id);
        if leased {
            self.release_lease(id);
        }
        outcome
    }

    fn delete_leased(&self, log: &crate::storage::commit::Log, id: &str) -> Result<()> {
        // Until the catalog records the deletion, a checkpoint would resurrect the session.
        let _in_flight = self.in_flight();
        let (number, header_json, seed, length) = {
            let mut catalog = self.inner.catalog.write();
            // Holds off writers and a second delete while the tombstone is on its way.
            let (number, entry) = claim_writer_slot(&mut catalog, id)?;
            (
                number,
                entry.header_json.clone(),
                entry.seed,
                entry.length(),
            )
        };
        let durable = log
            .submit(Durability::Sync, |context, out| {
                // A batch's commit must name a session its segment defines (F-05-1).
                encode_header_if_new(context, out, number, seed, &header_json)?;
                Record::Tombstone { session: number }.encode(out, context.salt)?;
                encode_commit(context, out, number, length, 0)?;
                Ok(())
            })
            .and_then(|(submitted, ())| log.wait(submitted.ticket, true));
        let mut catalog = self.inner.catalog.write();
        match durable {
            Ok(()) => catalog.delete_session(number).map_err(Error::invalid),
            Err(error) => {
                // Not acknowledged: the session stays (the next open decides if the
                // tombstone made it to disk).
                if let Some(entry) = catalog.sessions.get_mut(&number) {
                    entry.has_writer = false;
                }
                Err(error)
            }
        }
    }

    /// Takes the writer handle of an existing session.
    /// With other processes, the session's lease is taken first (`SessionBusy` naming the
    /// holder's pid while another process writes it) and the catalog catches up, so that
    /// appends continue after every event the previous holder committed (F-08-10).
    pub fn writer(&self, id: &str) -> Result<SessionWriter> {
        self.log()?;
        let leased = self.lease_and_refresh(id)?;
        let claimed =
            claim_writer_slot(&mut self.inner.catalog.write(), id).map(|(number, _)| number);
        match claimed {
            Ok(number) => Ok(SessionWriter {
                store: self.clone(),
                number,
                id: id.to_string(),
                durability: self.inner.options.durability,
                last_ticket: 0,
            }),
            Err(error) => {
                if leased {
                    self.release_lease(id);
                }
                Err(error)
            }
        }
    }

    /// Every session, ordered by id.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let catalog = self.inner.catalog.read();
        let mut list: Vec<SessionSummary> = catalog
            .sessions
            .values()
            .filter(|entry| !entry.deleted && !super::staging::is_stage_id(&entry.id))
            .map(|entry| SessionSummary {
                id: entry.id.clone(),
                header_json: entry.header_json.to_string(),
                events: entry.length(),
            })
            .collect();
        list.sort_by(|left, right| left.id.cmp(&right.id));
        list
    }

    /// One session's summary.
    pub fn session(&self, id: &str) -> Result<SessionSummary> {
        self.with_session(id, |entry| SessionSummary {
            id: entry.id.clone(),
            header_json: entry.header_json.to_string(),
            events: entry.length(),
        })
    }

    pub(super) fn with_session<T>(
        &self,
        id: &str,
        read: impl FnOnce(&SessionEntry) -> T,
    ) -> Result<T> {
        let catalog = self.inner.catalog.read();
        let number = catalog
            .by_id
            .get(id)
            .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
        let entry = catalog
            .sessions
            .get(number)
            .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
        Ok(read(entry))
    }
}
