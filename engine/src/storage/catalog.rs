//! The in-memory catalog: sessions, interned event types, and the seq index
//! `(session, seq) → extent` (rebuilt by the recovery scan on open).
//!
//! The index is sparse: it keeps one [`Extent`] per run block or per span of write-ahead
//! frames, not one position per event, so that the catalog of a store with millions of
//! events loads from its checkpoint in milliseconds. A read finds the extent by binary
//! search and walks the frames inside it (they carry their own lengths).

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
    /// Where the events of this session's own log lie (seq minus the seed length).
    pub events: EventIndex,
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
        self.seed_length() + self.events.len()
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
        events: EventIndex,
    ) -> Result<(), String> {
        if self.sessions.contains_key(&number) {
            return Err(format!("session {number} twice"));
        }
        self.define_session(number, seed, header_json, defined_in, false)?;
        if let Some(entry) = self.sessions.get_mut(&number) {
            entry.events = events;
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
                events: EventIndex::default(),
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

    /// The number the next new type gets.
    pub fn next_type_number(&self) -> u32 {
        self.next_type
    }

    /// Forgets the types interned from number `first` on (a batch that was refused before
    /// it was queued defined them): with other processes writing, an unwritten number must
    /// stay free for them (F-08-6 step 4).
    pub fn forget_types_from(&mut self, first: u32) {
        if self.next_type <= first {
            return;
        }
        let names = Arc::make_mut(&mut self.type_names);
        for number in first..self.next_type {
            if let Some(name) = names.remove(&number) {
                self.type_by_name.remove(&name);
            }
        }
        self.next_type = first;
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

    /// Indexes a replayed write-ahead event; its seq must be the session's next. An event
    /// past the next seq is left out and the gap remembered: it is corruption unless a
    /// tombstone deletes the session later in the log ([`Catalog::check_gaps`]).
    pub fn push_event(&mut self, session: u32, seq: u64, position: Position) -> Result<(), String> {
        self.push_events(session, seq, position, 1)
    }

    /// [`Catalog::push_event`] for a frame that holds `count` events from `seq` on (a row
    /// entry of a segment, F-02-20).
    pub fn push_events(
        &mut self,
        session: u32,
        seq: u64,
        position: Position,
        count: u32,
    ) -> Result<(), String> {
        if let Some(entry) = self.next_in_line(session, seq, position)? {
            entry.events.push_frames(position, count);
        }
        Ok(())
    }

    /// Indexes a replayed run block: `extent` holds the session's events from seq `first_seq`
    /// on, with the same rules as [`Catalog::push_event`].
    pub fn push_extent(
        &mut self,
        session: u32,
        first_seq: u64,
        extent: Extent,
    ) -> Result<(), String> {
        let position = Position {
            segment: extent.file,
            offset: extent.offset,
            frame_bytes: 0,
        };
        if let Some(entry) = self.next_in_line(session, first_seq, position)? {
            entry.events.push_extent(extent);
        }
        Ok(())
    }

    /// The session if `seq` is its next event; `None` (a gap, remembered) if it lies past it.
    fn next_in_line(
        &mut self,
        session: u32,
        seq: u64,
        position: Position,
    ) -> Result<Option<&mut SessionEntry>, String> {
        let entry = self
            .sessions
            .get_mut(&session)
            .ok_or_else(|| format!("event for undefined session {session}"))?;
        let message = |entry: &SessionEntry| {
            format!(
                "session {:?} seq {seq} is not contiguous; expected {}",
                entry.id,
                entry.length()
            )
        };
        if seq > entry.length() {
            let reason = message(entry);
            self.gaps.entry(session).or_insert((position, reason));
            return Ok(None);
        }
        if seq != entry.length() {
            return Err(message(entry));
        }
        Ok(Some(entry))
    }
}

/// Frames lying back to back in one file (a run's raw stream or a segment) among which the
/// event frames of one session are its next `count` events, in seq order. Other frames
/// (commit records, type definitions, in a segment other sessions' events) may lie between
/// them; a reader skips those. In a run an extent never leaves its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// A run id or a segment id.
    pub file: u64,
    /// Where the first frame starts (a raw offset in a run, a file offset in a segment).
    pub offset: u64,
    /// The frames lie within `offset .. offset + bytes`.
    pub bytes: u64,
    pub count: u32,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.bytes
    }
}

pub use crate::limits::MAX_EXTENT_GAP_BYTES;
pub use crate::limits::MAX_SEGMENT_EXTENT_BYTES;

/// The seq index of one session's own log: its extents in seq order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventIndex {
    extents: Vec<Extent>,
    /// The index (seq minus the seed length) of each extent's first event.
    starts: Vec<u64>,
    events: u64,
}

/// The part of an extent a read needs: skip `skip` events of it, then take `take`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentSlice {
    pub session: u32,
    pub extent: Extent,
    /// The seq of the extent's first event.
    pub first_seq: u64,
    pub skip: u32,
    pub take: u32,
}

impl EventIndex {
    /// Events indexed.
    pub fn len(&self) -> u64 {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// Indexes the next event, joining the last extent when the frame follows it in the
    /// same segment and the extent stays below [`MAX_SEGMENT_EXTENT_BYTES`].
    pub fn push_frame(&mut self, position: Position) {
        self.push_frames(position, 1);
    }

    /// Indexes the next `count` events, all held by the frame at `position` (an event
    /// frame for one, a segment's row entry for more, F-02-20), with the joining rule of
    /// [`EventIndex::push_frame`].
    pub fn push_frames(&mut self, position: Position, count: u32) {
        if let Some(last) = self.extents.last_mut() {
            let joined_end = position.end();
            if last.file == position.segment
                && position.offset >= last.end()
                && position.offset - last.end() <= MAX_EXTENT_GAP_BYTES
                && joined_end - last.offset <= MAX_SEGMENT_EXTENT_BYTES
            {
                if let Some(joined_count) = last.count.checked_add(count) {
                    last.bytes = joined_end - last.offset;
                    last.count = joined_count;
                    self.events += u64::from(count);
                    return;
                }
            }
        }
        self.push_extent(Extent {
            file: position.segment,
            offset: position.offset,
            bytes: u64::from(position.frame_bytes),
            count,
        });
    }

    /// Indexes the next `extent.count` events as one extent.
    pub fn push_extent(&mut self, extent: Extent) {
        if extent.count == 0 {
            return;
        }
        self.starts.push(self.events);
        self.extents.push(extent);
        self.events += u64::from(extent.count);
    }

    /// Keeps only the first `events` events.
    pub fn truncate(&mut self, events: u64) {
        if events >= self.events {
            return;
        }
        let kept = self.starts.partition_point(|start| *start < events);
        self.extents.truncate(kept);
        self.starts.truncate(kept);
        if let (Some(last), Some(start)) = (self.extents.last_mut(), self.starts.last()) {
            // The span stays as it was: it still holds the kept frames.
            last.count = u32::try_from(events - start).unwrap_or(last.count);
        }
        self.events = events;
    }

    /// Which extent holds event `index`.
    fn extent_of(&self, index: u64) -> Option<usize> {
        (index < self.events).then(|| self.starts.partition_point(|start| *start <= index) - 1)
    }

    /// The file that holds event `index`.
    pub fn file_of(&self, index: u64) -> Option<u64> {
        self.extent_of(index).map(|at| self.extents[at].file)
    }

    /// Appends the slices covering events `from..to` (indexes of the own log, clamped).
    fn slices(
        &self,
        session: u32,
        seed_length: u64,
        from: u64,
        to: u64,
        out: &mut Vec<ExtentSlice>,
    ) {
        let to = to.min(self.events);
        let Some(mut at) = self.extent_of(from).filter(|_| from < to) else {
            return;
        };
        while at < self.extents.len() && self.starts[at] < to {
            let (extent, start) = (self.extents[at], self.starts[at]);
            // Both lie within the extent, so they fit its u32 count.
            let count = u64::from(extent.count);
            let skip = from.saturating_sub(start).min(count);
            let take = to.min(start + count).saturating_sub(start + skip);
            out.push(ExtentSlice {
                session,
                extent,
                first_seq: seed_length + start,
                skip: u32::try_from(skip).unwrap_or(extent.count),
                take: u32::try_from(take).unwrap_or(extent.count),
            });
            at += 1;
        }
    }

    /// Replaces the extents in `file` (a run of consecutive events) by `replacement`,
    /// which must index the same events: `(first event index, extent)` in order.
    pub fn replace_file(&mut self, file: u64, replacement: &[(u64, Extent)]) -> Result<(), String> {
        let Some(first) = self.extents.iter().position(|extent| extent.file == file) else {
            return if replacement.is_empty() {
                Ok(())
            } else {
                Err(format!("no events in file {file} to replace"))
            };
        };
        let past = first
            + self.extents[first..]
                .iter()
                .take_while(|extent| extent.file == file)
                .count();
        let start = self.starts[first];
        let end = self.starts.get(past).copied().unwrap_or(self.events);
        let mut expected = start;
        for (index, extent) in replacement {
            if *index != expected {
                return Err(format!("replacement of file {file} is not contiguous"));
            }
            expected += u64::from(extent.count);
        }
        if expected != end {
            return Err(format!("replacement of file {file} holds other events"));
        }
        self.extents
            .splice(first..past, replacement.iter().map(|(_, extent)| *extent));
        self.starts
            .splice(first..past, replacement.iter().map(|(index, _)| *index));
        Ok(())
    }
}

/// The slices covering seqs `from..to` of session `number`, following a fork's seed into
/// its parent.
pub fn collect_slices(
    catalog: &Catalog,
    number: u32,
    from: u64,
    to: u64,
    out: &mut Vec<ExtentSlice>,
) {
    let Some(entry) = catalog.sessions.get(&number) else {
        return;
    };
    let end = to.min(entry.length());
    let start = from.min(end);
    let seed_length = entry.seed_length();
    if let Some(seed) = entry.seed {
        if start < seed_length {
            collect_slices(catalog, seed.parent, start, end.min(seed_length), out);
        }
    }
    let own_start = start.max(seed_length) - seed_length;
    let own_end = end.max(seed_length) - seed_length;
    entry
        .events
        .slices(number, seed_length, own_start, own_end, out);
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

#[cfg(test)]
mod index_tests {
    use super::*;

    fn frame(segment: u64, offset: u64, frame_bytes: u32) -> Position {
        Position {
            segment,
            offset,
            frame_bytes,
        }
    }

    #[test]
    fn frames_join_an_extent_only_across_small_gaps_in_one_file() {
        let mut index = EventIndex::default();
        index.push_frame(frame(1, 100, 50));
        index.push_frame(frame(1, 150, 50)); // back to back
        index.push_frame(frame(1, 230, 50)); // a commit record between
        index.push_frame(frame(1, 230 + 50 + MAX_EXTENT_GAP_BYTES + 1, 50)); // too far
        index.push_frame(frame(2, 0, 50)); // another segment
        assert_eq!(index.len(), 5);
        let counts: Vec<u32> = index.extents().iter().map(|extent| extent.count).collect();
        assert_eq!(counts, vec![3, 1, 1]);
        assert_eq!(index.extents()[0].bytes, 180);
        let mut big = EventIndex::default();
        for at in 0..3 {
            big.push_frame(frame(1, at * 30_000, 30_000));
        }
        assert_eq!(
            big.extents().len(),
            2,
            "extents stay within MAX_SEGMENT_EXTENT_BYTES"
        );
    }

    #[test]
    fn slices_cover_exactly_the_range_asked() {
        let mut index = EventIndex::default();
        for (offset, count) in [(0u64, 4u32), (1000, 3), (2000, 5)] {
            index.push_extent(Extent {
                file: 7,
                offset,
                bytes: 500,
                count,
            });
        }
        let mut out = Vec::new();
        index.slices(9, 10, 2, 9, &mut out);
        let parts: Vec<(u64, u64, u32, u32)> = out
            .iter()
            .map(|slice| (slice.extent.offset, slice.first_seq, slice.skip, slice.take))
            .collect();
        assert_eq!(
            parts,
            vec![(0, 10, 2, 2), (1000, 14, 0, 3), (2000, 17, 0, 2)]
        );
        out.clear();
        index.slices(9, 0, 12, 20, &mut out);
        assert!(out.is_empty());
        index.slices(9, 0, 11, 40, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].skip, out[0].take), (4, 1));
        assert_eq!(index.file_of(11), Some(7));
        assert_eq!(index.file_of(12), None);
    }

    #[test]
    fn truncate_and_replace_keep_the_index_contiguous() {
        let mut index = EventIndex::default();
        index.push_extent(Extent {
            file: 3,
            offset: 0,
            bytes: 100,
            count: 4,
        });
        for offset in [0, 400] {
            index.push_extent(Extent {
                file: 5,
                offset,
                bytes: 300,
                count: 3,
            });
        }
        index.truncate(8);
        assert_eq!(index.len(), 8);
        assert_eq!(index.extents().last().map(|extent| extent.count), Some(1));
        let run = |offset, count| Extent {
            file: 9,
            offset,
            bytes: 64,
            count,
        };
        assert!(
            index.replace_file(5, &[(4, run(0, 3))]).is_err(),
            "one event short"
        );
        assert!(
            index.replace_file(5, &[(5, run(0, 4))]).is_err(),
            "not from 4"
        );
        index
            .replace_file(5, &[(4, run(0, 2)), (6, run(64, 2))])
            .expect("same events");
        assert_eq!(index.len(), 8);
        assert_eq!(index.file_of(7), Some(9));
        assert_eq!(index.file_of(3), Some(3));
        index.replace_file(5, &[]).expect("nothing left in file 5");
    }
}
