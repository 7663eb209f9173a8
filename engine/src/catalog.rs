//! L4: the in-memory catalog: sessions, interned event types, and the seq index
//! `(session, seq) → position` (rebuilt by the recovery scan on open).

use std::collections::HashMap;
use std::sync::Arc;

/// Where one event's frame lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
    /// Header plus payload, in bytes.
    pub frame_bytes: u32,
}

impl Position {
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.frame_bytes)
    }
}

/// One session in the catalog.
#[derive(Debug, Clone)]
pub struct SessionEntry {
    pub id: String,
    pub number: u32,
    /// The header exactly as it was given (JSON text).
    /// Shared, because every append that starts a segment re-emits it.
    pub header_json: Arc<str>,
    /// The session whose first events this one shares (a fork), and how many.
    pub seed: Option<Seed>,
    /// Position of every event of this session's own log, indexed by `seq - seed length`.
    pub positions: Vec<Position>,
    /// Whether a writer handle is alive for this session.
    pub has_writer: bool,
    /// The file (segment or run id) whose records first defined the session; `None` while
    /// its header is not yet queued. The seq-index checkpoint keeps sessions by it.
    pub defined_in: Option<u64>,
    /// A durable tombstone deleted the session (F-02-18): it is no longer listed nor found
    /// by id; it stays in the catalog while a live fork still reads its prefix.
    pub deleted: bool,
}

/// A fork's shared prefix: the first `length` events are the parent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed {
    pub parent: u32,
    pub length: u64,
}

impl SessionEntry {
    /// Events in the session, the seed included.
    pub fn length(&self) -> u64 {
        self.seed_length() + self.positions.len() as u64
    }

    /// Events shared with the parent (0 for a session that is not a fork).
    pub fn seed_length(&self) -> u64 {
        self.seed.map_or(0, |seed| seed.length)
    }
}

/// Sessions and event types known to the store.
#[derive(Debug, Default)]
pub struct Catalog {
    pub sessions: HashMap<u32, SessionEntry>,
    pub by_id: HashMap<String, u32>,
    /// Shared with readers, who decode events without holding the catalog lock.
    pub type_names: Arc<HashMap<u32, String>>,
    pub type_by_name: HashMap<String, u32>,
    /// Sessions whose replayed events skipped seqs, with the first event past the gap and
    /// why: legitimate only for a session a tombstone deletes later in the log, whose
    /// events sealing dropped from earlier files (F-06-24); see [`Catalog::check_gaps`].
    pub gaps: HashMap<u32, (Position, String)>,
    next_session: u32,
    next_type: u32,
}

/// Extracts the `id` string of a session header.
pub fn header_id(header_json: &[u8]) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: String,
    }
    serde_json::from_slice::<IdOnly>(header_json)
        .map(|header| header.id)
        .map_err(|error| format!("session header has no string id: {error}"))
}

impl Catalog {
    /// Records a session header found in the log (or re-emitted in a later segment).
    /// `file` is where the header was found. `check_seed_length` is off for run files,
    /// whose definitions block precedes the parent's events (F-06-1); [`Catalog::check_seeds`]
    /// checks them once everything is loaded.
    pub fn define_session(
        &mut self,
        number: u32,
        seed: Option<Seed>,
        header_json: &[u8],
        file: u64,
        check_seed_length: bool,
    ) -> Result<(), String> {
        if let Some(existing) = self.sessions.get(&number) {
            if existing.header_json.as_bytes() != header_json || existing.seed != seed {
                return Err(format!("session {number} redefined with another header"));
            }
            return Ok(());
        }
        if let Some(seed) = seed {
            let parent = self
                .sessions
                .get(&seed.parent)
                .ok_or_else(|| format!("fork of unknown session {}", seed.parent))?;
            if check_seed_length && seed.length > parent.length() {
                return Err("fork seed longer than its parent".to_string());
            }
        }
        let text = std::str::from_utf8(header_json)
            .map_err(|_| "session header is not UTF-8".to_string())?;
        let id = header_id(header_json)?;
        if self.by_id.contains_key(&id) {
            return Err(format!("session id {id:?} defined twice"));
        }
        self.insert_session(number, id, seed, text.to_string());
        if let Some(entry) = self.sessions.get_mut(&number) {
            entry.defined_in = Some(file);
        }
        Ok(())
    }

    /// Checks that every fork's seed is no longer than its parent (after a load that
    /// deferred the check).
    pub fn check_seeds(&self) -> Result<(), String> {
        // A deleted fork's parent may have lost events it no longer needs (F-06-24).
        for entry in self.sessions.values().filter(|entry| !entry.deleted) {
            if let Some(seed) = entry.seed {
                let parent_length = self.sessions.get(&seed.parent).map(SessionEntry::length);
                if parent_length.is_none_or(|length| seed.length > length) {
                    return Err(format!(
                        "fork {:?} has a seed longer than its parent",
                        entry.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Restores a session from a seq-index checkpoint.
    pub fn restore_session(
        &mut self,
        number: u32,
        seed: Option<Seed>,
        header_json: &[u8],
        defined_in: u64,
        positions: Vec<Position>,
    ) -> Result<(), String> {
        if self.sessions.contains_key(&number) {
            return Err(format!("session {number} twice"));
        }
        self.define_session(number, seed, header_json, defined_in, false)?;
        if let Some(entry) = self.sessions.get_mut(&number) {
            entry.positions = positions;
        }
        Ok(())
    }

    fn insert_session(&mut self, number: u32, id: String, seed: Option<Seed>, header_json: String) {
        self.by_id.insert(id.clone(), number);
        self.sessions.insert(
            number,
            SessionEntry {
                id,
                number,
                header_json: header_json.into(),
                seed,
                positions: Vec::new(),
                has_writer: false,
                defined_in: None,
                deleted: false,
            },
        );
        self.next_session = self.next_session.max(number.saturating_add(1));
    }

    /// Reserves a number for a new session (before its header is committed).
    pub fn reserve_session(&mut self, id: String, seed: Option<Seed>, header_json: String) -> u32 {
        let number = self.next_session;
        self.insert_session(number, id, seed, header_json);
        number
    }

    /// Forgets a reserved session whose header could not be committed.
    pub fn unreserve_session(&mut self, number: u32) {
        if let Some(entry) = self.sessions.remove(&number) {
            self.by_id.remove(&entry.id);
        }
    }

    /// Applies a tombstone (F-02-18): the session leaves the listing and its id may be
    /// reused. Applying it twice is harmless (a checkpoint and the log may both carry it).
    pub fn delete_session(&mut self, number: u32) -> Result<(), String> {
        let entry = self
            .sessions
            .get_mut(&number)
            .ok_or_else(|| format!("tombstone of undefined session {number}"))?;
        entry.deleted = true;
        if self.by_id.get(&entry.id) == Some(&number) {
            self.by_id.remove(&entry.id);
        }
        Ok(())
    }

    /// For every deleted session, how many of its first events sealing must keep (F-06-24):
    /// the longest seed a live fork reads from it, directly or through deleted forks.
    pub fn retained_prefixes(&self) -> HashMap<u32, u64> {
        let mut retained: HashMap<u32, u64> = self
            .sessions
            .values()
            .filter(|entry| entry.deleted)
            .map(|entry| (entry.number, 0))
            .collect();
        for live in self.sessions.values().filter(|entry| !entry.deleted) {
            let mut needed = u64::MAX;
            let mut seed = live.seed;
            // Walk up the fork chain: each ancestor must keep what the descendant reads.
            while let Some(link) = seed {
                needed = needed.min(link.length);
                if let Some(kept) = retained.get_mut(&link.parent) {
                    *kept = (*kept).max(needed);
                }
                seed = self
                    .sessions
                    .get(&link.parent)
                    .and_then(|parent| parent.seed);
            }
        }
        retained
    }

    /// After a replay: a seq gap in a session that is not deleted is corruption, reported
    /// at the first event past the gap.
    pub fn check_gaps(&self) -> Result<(), (Position, String)> {
        let live_gap = self
            .gaps
            .iter()
            .find(|(number, _)| self.sessions.get(number).is_none_or(|entry| !entry.deleted));
        match live_gap {
            Some((_, (position, reason))) => Err((*position, reason.clone())),
            None => Ok(()),
        }
    }

    /// Records a type definition found in the log.
    pub fn define_type(&mut self, number: u32, name: &[u8]) -> Result<(), String> {
        let name = std::str::from_utf8(name).map_err(|_| "type name is not UTF-8".to_string())?;
        if let Some(existing) = self.type_names.get(&number) {
            if existing != name {
                return Err(format!("type {number} redefined as {name:?}"));
            }
            return Ok(());
        }
        if self.type_by_name.contains_key(name) {
            return Err(format!("type {name:?} defined twice"));
        }
        Arc::make_mut(&mut self.type_names).insert(number, name.to_string());
        self.type_by_name.insert(name.to_string(), number);
        self.next_type = self.next_type.max(number.saturating_add(1));
        Ok(())
    }

    /// The number of an event type, interning it when new.
    pub fn intern_type(&mut self, name: &str) -> u32 {
        if let Some(number) = self.type_by_name.get(name) {
            return *number;
        }
        let number = self.next_type;
        self.next_type += 1;
        Arc::make_mut(&mut self.type_names).insert(number, name.to_string());
        self.type_by_name.insert(name.to_string(), number);
        number
    }

    /// Indexes a replayed event; its seq must be the session's next. An event past the next
    /// seq is left out and the gap remembered: it is corruption unless a tombstone deletes
    /// the session later in the log ([`Catalog::check_gaps`]).
    pub fn push_event(&mut self, session: u32, seq: u64, position: Position) -> Result<(), String> {
        let entry = self
            .sessions
            .get_mut(&session)
            .ok_or_else(|| format!("event for undefined session {session}"))?;
        if seq > entry.length() {
            let reason = format!(
                "session {:?} seq {seq} is not contiguous; expected {}",
                entry.id,
                entry.length()
            );
            self.gaps.entry(session).or_insert((position, reason));
            return Ok(());
        }
        if seq != entry.length() {
            return Err(format!(
                "session {:?} seq {seq} is not contiguous; expected {}",
                entry.id,
                entry.length()
            ));
        }
        entry.positions.push(position);
        Ok(())
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;

    fn header(id: &str) -> Vec<u8> {
        format!(r#"{{"version":0,"id":"{id}","createdAt":1}}"#).into_bytes()
    }

    fn position(offset: u64) -> Position {
        Position {
            segment: 1,
            offset,
            frame_bytes: 10,
        }
    }

    fn with_events(catalog: &mut Catalog, number: u32, seed: Option<Seed>, count: u64) {
        let id = format!("s{number}");
        catalog
            .define_session(number, seed, &header(&id), 1, false)
            .expect("define");
        let first = seed.map_or(0, |seed| seed.length);
        for seq in first..first + count {
            catalog
                .push_event(number, seq, position(seq))
                .expect("push");
        }
    }

    #[test]
    fn a_seq_gap_is_corruption_unless_the_session_is_deleted() {
        let mut catalog = Catalog::default();
        with_events(&mut catalog, 0, None, 3);
        catalog.push_event(0, 7, position(70)).expect("gap held");
        assert_eq!(catalog.sessions[&0].length(), 3);
        assert!(catalog.push_event(0, 1, position(10)).is_err());
        let outcome = catalog.check_gaps();
        assert!(matches!(outcome, Err((position, _)) if position.offset == 70));
        catalog.delete_session(0).expect("delete");
        assert!(catalog.check_gaps().is_ok());
        assert!(!catalog.by_id.contains_key("s0"));
    }

    #[test]
    fn retained_prefixes_follow_live_forks_through_deleted_ones() {
        let mut catalog = Catalog::default();
        with_events(&mut catalog, 0, None, 40);
        let child_seed = Seed {
            parent: 0,
            length: 20,
        };
        with_events(&mut catalog, 1, Some(child_seed), 11);
        let grandchild_seed = Seed {
            parent: 1,
            length: 25,
        };
        with_events(&mut catalog, 2, Some(grandchild_seed), 1);
        with_events(&mut catalog, 3, None, 5);
        catalog.delete_session(0).expect("delete");
        catalog.delete_session(1).expect("delete");
        catalog.delete_session(3).expect("delete");
        let retained = catalog.retained_prefixes();
        assert_eq!(retained.get(&0), Some(&20));
        assert_eq!(retained.get(&1), Some(&25));
        assert_eq!(retained.get(&3), Some(&0));
        assert_eq!(retained.get(&2), None);
        catalog.delete_session(2).expect("delete");
        let retained = catalog.retained_prefixes();
        assert_eq!(retained.get(&0), Some(&0));
        assert_eq!(retained.get(&1), Some(&0));
    }
}
