//! Seeding, cold restore, `session/end-seed` and fork boundaries (model §1.6, §6, §7;
//! persistence §5.5). Pure: callers pass the clock (`now`) and own all I/O.

use super::error::SessionError;
use super::event::{
    is_known_event_type, is_surface_eligible_type, SessionEvent, END_SEED_TYPE, TURN_END,
    TURN_START,
};
use super::json::{is_lossless, raw_from_built, MAX_SAFE_INTEGER};
use super::legacy::migrate_legacy;
use super::message::{check_message_shape_with, check_request_header, is_fallback_header};
use super::repair::interrupted_turn_closers;
use super::surface::SurfaceFold;

/// Which DSH seeding path to mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedMode {
    /// `Session.create(id, seed)`: payloads must also be lossless JSON (no `-0`, no overflow).
    Snapshot,
    /// `Session.fromRestore` (cold load): the lossless walk is skipped, as in DSH.
    Restore,
}

/// Validates a seed the way `Session` does, event by event, and returns its surface.
pub fn validate_seed(events: &[SessionEvent], mode: SeedMode) -> Result<SurfaceFold, SessionError> {
    let mut fold = SurfaceFold::new();
    for (index, event) in events.iter().enumerate() {
        validate_seed_event(index, event, mode)?;
        fold.apply(event).map_err(|error| error.in_seed(index))?;
    }
    Ok(fold)
}

/// The per-event seed checks that precede the surface fold (model §1.6 steps 1-6).
pub fn validate_seed_event(
    index: usize,
    event: &SessionEvent,
    mode: SeedMode,
) -> Result<(), SessionError> {
    validate_seed_event_parsed(index, event, mode, None)
}

/// [`validate_seed_event`] with the payload already parsed (`data` =
/// [`SessionEvent::data_value`]) when the caller has it; parsed on demand otherwise.
pub fn validate_seed_event_parsed(
    index: usize,
    event: &SessionEvent,
    mode: SeedMode,
    data: Option<&serde_json::Value>,
) -> Result<(), SessionError> {
    if mode == SeedMode::Snapshot && !is_lossless(event.data.get()) {
        return Err(SessionError::NotLossless { index });
    }
    if event.event_type == "request/header-delta" {
        return Err(SessionError::SeedHeaderDelta { index });
    }
    // Only request headers and message-bearing events have payload rules: skip parsing the
    // rest.
    let is_header = event.event_type == "request/header";
    if is_header || is_surface_eligible_type(&event.event_type) {
        let parsed;
        let data = match data {
            Some(data) => data,
            None => {
                parsed = event.data_value();
                &parsed
            }
        };
        if is_header {
            check_request_header(data, index)?;
        }
        check_message_shape_with(&event.event_type, data, || {
            format!("seed {} at index {index}", event.event_type)
        })?;
        if is_fallback_header(&event.event_type, data) {
            return Err(SessionError::SeedHeaderFallback { index });
        }
    }
    if event.seq != index as u64 {
        return Err(SessionError::SeedNotContiguous {
            index,
            seq: event.seq,
        });
    }
    Ok(())
}

/// The `session/end-seed` a seeded session appends, unless the seed already ends with one.
pub fn end_seed_marker(seed: &[SessionEvent], now: i64) -> Option<SessionEvent> {
    if seed
        .last()
        .is_some_and(|last| last.event_type == END_SEED_TYPE)
    {
        return None;
    }
    Some(SessionEvent {
        event_type: END_SEED_TYPE.to_owned(),
        seq: seed.len() as u64,
        time: now,
        data: raw_from_built("{}".to_owned()),
        ignorable: false,
        surface_op: None,
        source_event_seqs: None,
    })
}

/// A cold-loaded session, as DSH's `prepareCore` leaves it.
#[derive(Debug, Clone)]
pub struct RestoredSession {
    /// Migrated stored events, then the repair closers, then the in-memory end-seed (if any).
    pub events: Vec<SessionEvent>,
    /// The closers to append durably (a suffix of `events` before the end-seed).
    pub closers: Vec<SessionEvent>,
    pub migrated_seqs: Vec<u64>,
    /// Seq of the first event this lifecycle writes (= length of the restored seed).
    pub first_live_seq: u64,
    pub surface: SurfaceFold,
}

/// The pure part of a cold load (persistence §5.5 steps 3-6): legacy migration and import
/// shape checks, the vocabulary check, crash repair, restore validation, end-seed.
/// Validation failures are wrapped as DSH's `SessionPersistenceCorruptionError` text; the
/// vocabulary refusal is not (DSH never wraps `SessionFormatUnsupportedError`).
pub fn restore_session(
    session_id: &str,
    stored: &[SessionEvent],
    now: i64,
) -> Result<RestoredSession, SessionError> {
    let corrupt = |error: SessionError| SessionError::StoredValidation {
        session_id: session_id.to_owned(),
        source: Box::new(error),
    };
    let migrated = migrate_legacy(session_id, stored).map_err(corrupt)?;
    check_import_shapes(&migrated.events).map_err(corrupt)?;
    check_known_types(session_id, &migrated.events)?;
    let closers = interrupted_turn_closers(&migrated.events);
    let mut events = migrated.events;
    events.extend(closers.iter().cloned());
    let mut surface = validate_seed(&events, SeedMode::Restore).map_err(corrupt)?;
    let first_live_seq = events.len() as u64;
    if let Some(marker) = end_seed_marker(&events, now) {
        surface.apply(&marker).map_err(corrupt)?;
        events.push(marker);
    }
    Ok(RestoredSession {
        events,
        closers,
        migrated_seqs: migrated.migrated_seqs,
        first_live_seq,
        surface,
    })
}

/// `adoptStoredEvents` message-shape pass, with DSH's import subject.
fn check_import_shapes(events: &[SessionEvent]) -> Result<(), SessionError> {
    // Only the message-bearing types have a shape to check: skip parsing the rest (most of a
    // session is chunks).
    events
        .iter()
        .filter(|event| is_surface_eligible_type(&event.event_type))
        .try_for_each(|event| {
            check_message_shape_with(&event.event_type, &event.data_value(), || {
                format!("session event at seq {}", event.seq)
            })
        })
}

/// The read side refuses unknown types unless marked `ignorable` (persistence §2.9).
pub fn check_known_types(session_id: &str, events: &[SessionEvent]) -> Result<(), SessionError> {
    let unknown = events
        .iter()
        .find(|event| !event.ignorable && !is_known_event_type(&event.event_type));
    match unknown {
        Some(event) => Err(SessionError::UnknownRequiredType {
            session_id: session_id.to_owned(),
            event_type: event.event_type.clone(),
            seq: event.seq,
        }),
        None => Ok(()),
    }
}

/// What a fork-boundary check needs of an event: its seq, its type and (for a `turn/start`)
/// its payload. Implemented by [`SessionEvent`] and by the store's decoded events, so the
/// store checks its forks with this module's rule and DSH's text instead of a copy.
pub trait ForkBoundaryEvent {
    /// The event's `seq`.
    fn fork_seq(&self) -> u64;
    /// The event's `type`.
    fn fork_event_type(&self) -> &str;
    /// The event's `data`, parsed (only asked of the last turn bracket).
    fn fork_data(&self) -> serde_json::Value;
}

impl ForkBoundaryEvent for SessionEvent {
    fn fork_seq(&self) -> u64 {
        self.seq
    }

    fn fork_event_type(&self) -> &str {
        &self.event_type
    }

    fn fork_data(&self) -> serde_json::Value {
        self.data_value()
    }
}

/// Validates a fork boundary like `SessionStore.fork` (§7 steps 3-4) and returns the
/// effective boundary: `None` for the default boundary of an empty source (empty seed).
pub fn validate_fork_boundary(
    session_id: &str,
    events: &[SessionEvent],
    boundary: Option<u64>,
) -> Result<Option<u64>, SessionError> {
    validate_fork_boundary_of(session_id, events, boundary)
}

/// [`validate_fork_boundary`] over any event representation (the store's, for one).
pub fn validate_fork_boundary_of<E: ForkBoundaryEvent>(
    session_id: &str,
    events: &[E],
    boundary: Option<u64>,
) -> Result<Option<u64>, SessionError> {
    let Some(boundary) = boundary.or_else(|| events.last().map(ForkBoundaryEvent::fork_seq)) else {
        return Ok(None);
    };
    if boundary > MAX_SAFE_INTEGER {
        let boundary = boundary.to_string();
        return Err(SessionError::ForkBoundaryNotSafeInteger {
            session_id: session_id.to_owned(),
            boundary,
        });
    }
    let index = usize::try_from(boundary).ok();
    let Some((index, event)) = index.and_then(|index| Some((index, events.get(index)?))) else {
        let last_seq = events.last().map(ForkBoundaryEvent::fork_seq);
        return Err(SessionError::ForkBoundaryMissing {
            session_id: session_id.to_owned(),
            boundary,
            last_seq,
        });
    };
    if event.fork_seq() != boundary {
        return Err(SessionError::ForkBoundaryNotContiguous {
            session_id: session_id.to_owned(),
            boundary,
        });
    }
    let last_bracket = events[..=index]
        .iter()
        .rev()
        .find(|event| matches!(event.fork_event_type(), TURN_START | TURN_END));
    if let Some(open) = last_bracket.filter(|event| event.fork_event_type() == TURN_START) {
        let turn = open
            .fork_data()
            .get("turn")
            .map_or_else(|| "undefined".to_owned(), turn_text);
        return Err(SessionError::ForkOpenTurn {
            session_id: session_id.to_owned(),
            boundary,
            turn,
        });
    }
    Ok(Some(boundary))
}

fn turn_text(turn: &serde_json::Value) -> String {
    match turn {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The child's seed for a fork: the source's events `0..=boundary`, copied verbatim. The
/// child session appends its own end-seed (see [`end_seed_marker`]).
pub fn fork_seed(
    session_id: &str,
    events: &[SessionEvent],
    boundary: Option<u64>,
) -> Result<Vec<SessionEvent>, SessionError> {
    let boundary = validate_fork_boundary(session_id, events, boundary)?;
    Ok(boundary.map_or_else(Vec::new, |boundary| events[..=boundary as usize].to_vec()))
}

/// [`restore_session`]'s checks over a log read as a stream, event by event, in the memory of
/// the surface fold (without its messages) and the repair scan: whether the cold load would
/// accept the log, not why it would not. A log it does not accept ([`RestoreUndecided`]) is
/// one [`restore_session`] over the whole log must decide, with DSH's exact text; on a log it
/// accepts, [`restore_session`] accepts too.
///
/// Why the checks agree: migration is per event ([`migrate_next`]; the one rewrite that needs
/// earlier events is undecided here), the import shape check is the shape check the seed
/// validation repeats on the same migrated event, the vocabulary check is per event, and the
/// closers and the end-seed marker depend only on the repair scan and the last event.
///
/// Memory: the fold keeps a rewrite key (the payload, nearly whole) for every visible
/// `tool/result`; the check keeps those of the most recent results only, up to a budget of
/// payload bytes, and forgets older ones. A rewrite of a result whose key it forgot is
/// undecided (never accepted), so the outcome stays exact.
pub struct RestoreCheck {
    session_id: String,
    fold: SurfaceFold,
    repair: super::repair::RepairScan,
    /// Seq, time and type of the last event admitted.
    last: Option<(u64, i64, bool)>,
    /// The `tool/result` nodes whose key the fold keeps, oldest first, with their payload
    /// bytes; their sum, and the budget it may not pass.
    kept_keys: std::collections::VecDeque<(u64, usize)>,
    kept_key_bytes: usize,
    key_budget: usize,
}

/// The streaming checks cannot accept the log: [`restore_session`] over the whole log decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreUndecided {
    /// Seq of the event the checks stopped at.
    pub seq: u64,
}

impl RestoreCheck {
    /// The check with rewrite keys kept for at most `key_budget` bytes of payloads.
    pub fn new(session_id: &str, key_budget: usize) -> Self {
        Self {
            session_id: session_id.to_owned(),
            fold: SurfaceFold::new(),
            repair: super::repair::RepairScan::new(),
            last: None,
            kept_keys: std::collections::VecDeque::new(),
            kept_key_bytes: 0,
            key_budget,
        }
    }

    /// The session the log belongs to.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Accounts for the key of `tool/result` `seq` just kept; forgets the oldest past the
    /// budget.
    fn keep_key(&mut self, seq: u64, bytes: usize) {
        self.kept_keys.push_back((seq, bytes));
        self.kept_key_bytes += bytes;
        while self.kept_key_bytes > self.key_budget {
            let Some((oldest, oldest_bytes)) = self.kept_keys.pop_front() else {
                break;
            };
            self.kept_key_bytes -= oldest_bytes;
            self.fold.forget_rewrite_key(oldest);
        }
    }

    /// Checks the next stored event of the log (seqs from 0, contiguous).
    pub fn admit(&mut self, stored: &SessionEvent) -> Result<(), RestoreUndecided> {
        let undecided = RestoreUndecided { seq: stored.seq };
        let migrated = match super::legacy::migrate_next(&self.session_id, stored) {
            Some(Ok(Some(migrated))) => Some(migrated),
            Some(Ok(None)) => None,
            None | Some(Err(_)) => return Err(undecided),
        };
        let event = migrated.as_ref().unwrap_or(stored);
        if !event.ignorable && !is_known_event_type(&event.event_type) {
            return Err(undecided);
        }
        // A message-bearing event's payload is parsed once for the repair scan and the
        // seed rules: for these types `RepairScan::observe` reads the same parse.
        let parsed = is_surface_eligible_type(&event.event_type).then(|| event.data_value());
        match &parsed {
            Some(data) => self
                .repair
                .observe_parsed(&event.event_type, event.seq, data),
            None => self.repair.observe(event),
        }
        self.seed_event(event, parsed).map_err(|_| undecided)?;
        self.last = Some((event.seq, event.time, event.event_type == END_SEED_TYPE));
        Ok(())
    }

    /// [`Self::admit`] of a packed row's `members` `assistant/chunk` events, seqs from
    /// `seq0`, the last at `last_time`, none ignorable and none with `surfaceOp` or
    /// `sourceEventSeqs` (what a row decodes to), without building them.
    ///
    /// What [`Self::admit`] does with such an event depends on its seq alone: the type is
    /// known, neither removed nor migrated; the repair scan does not look at chunks; the
    /// seed rules of a log-only type are the seq check; and the surface fold applies it as
    /// log-only ([`SurfaceFold::apply_log_only`]). So the members are admitted seq by seq.
    pub fn admit_chunk_row(
        &mut self,
        seq0: u64,
        members: u64,
        last_time: i64,
    ) -> Result<(), RestoreUndecided> {
        for seq in (0..members).map(|offset| seq0.saturating_add(offset)) {
            let undecided = RestoreUndecided { seq };
            usize::try_from(seq).map_err(|_| undecided)?;
            self.fold.apply_log_only(seq).map_err(|_| undecided)?;
        }
        if let Some(last_offset) = members.checked_sub(1) {
            self.last = Some((seq0.saturating_add(last_offset), last_time, false));
        }
        Ok(())
    }

    /// The seed validation of one event (index = seq) and its surface fold; `parsed` is
    /// the event's payload ([`SessionEvent::data_value`]) when the caller parsed it.
    fn seed_event(
        &mut self,
        event: &SessionEvent,
        parsed: Option<serde_json::Value>,
    ) -> Result<(), SessionError> {
        let index = usize::try_from(event.seq).map_err(|_| SessionError::SeedNotContiguous {
            index: usize::MAX,
            seq: event.seq,
        })?;
        if is_surface_eligible_type(&event.event_type) {
            // One parse serves the seed rules and the surface's rewrite key.
            let data = parsed.unwrap_or_else(|| event.data_value());
            validate_seed_event_parsed(index, event, SeedMode::Restore, Some(&data))?;
            let is_result = event.event_type == super::event::TOOL_RESULT;
            let rewrite_key = is_result.then(|| super::surface::rewrite_key_from(data));
            self.fold.apply_keeping_no_message(event, rewrite_key)?;
            if is_result {
                self.keep_key(event.seq, event.data.get().len());
            }
        } else {
            validate_seed_event(index, event, SeedMode::Restore)?;
            self.fold.apply_keeping_no_message(event, None)?;
        }
        Ok(())
    }

    /// After the last event: the repair closers and the end-seed marker, checked like the
    /// rest. `now` is the marker's time (it does not change the outcome).
    pub fn finish(mut self, now: i64) -> Result<(), RestoreUndecided> {
        let Some((last_seq, last_time, _)) = self.last else {
            // An empty log: the marker at seq 0 alone.
            return self.marker(0, now);
        };
        let closers = self.repair.closers(last_seq, last_time);
        for closer in &closers {
            self.seed_event(closer, None)
                .map_err(|_| RestoreUndecided { seq: closer.seq })?;
            self.last = Some((closer.seq, closer.time, closer.event_type == END_SEED_TYPE));
        }
        match self.last {
            Some((_, _, true)) => Ok(()),
            Some((seq, _, false)) => self.marker(seq + 1, now),
            None => self.marker(0, now),
        }
    }

    fn marker(&mut self, seq: u64, now: i64) -> Result<(), RestoreUndecided> {
        let marker = SessionEvent {
            event_type: END_SEED_TYPE.to_owned(),
            seq,
            time: now,
            data: raw_from_built("{}".to_owned()),
            ignorable: false,
            surface_op: None,
            source_event_seqs: None,
        };
        self.fold
            .apply_keeping_no_message(&marker, None)
            .map(drop)
            .map_err(|_| RestoreUndecided { seq })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: &str, seq: u64, time: i64, data: &str) -> SessionEvent {
        SessionEvent::with_data_text(event_type, seq, time, data.to_owned()).expect("JSON data")
    }

    fn chunk(seq: u64, time: i64) -> SessionEvent {
        let data = r#"{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"a"}}"#;
        event("assistant/chunk", seq, time, data)
    }

    /// The state [`RestoreCheck::admit`] leaves: what the later checks and `finish` read.
    fn state(check: &RestoreCheck) -> (Option<(u64, i64, bool)>, u64, Vec<u64>) {
        (check.last, check.fold.next_seq(), check.fold.nodes())
    }

    /// A row admitted as a whole leaves the check as its members admitted one by one do,
    /// whatever comes after it (an open turn the closers finish, a wrong seq).
    #[test]
    fn a_row_admitted_whole_is_its_members_admitted_one_by_one() {
        let opening = [
            event("turn/start", 0, 10, r#"{"turn":1}"#),
            event("step/start", 1, 11, r#"{"turn":1,"step":1}"#),
        ];
        // Times of a row with a negative gap; rows of one and of several members.
        for times in [vec![12], vec![12, 15, 13, 40]] {
            let members = u64::try_from(times.len()).expect("a few members");
            let (mut whole, mut one_by_one) =
                (RestoreCheck::new("s", 1024), RestoreCheck::new("s", 1024));
            for opened in &opening {
                whole.admit(opened).expect("admitted");
                one_by_one.admit(opened).expect("admitted");
            }
            whole
                .admit_chunk_row(2, members, *times.last().expect("a member"))
                .expect("admitted whole");
            for (seq, time) in (2..).zip(&times) {
                one_by_one.admit(&chunk(seq, *time)).expect("admitted");
            }
            assert_eq!(state(&whole), state(&one_by_one));
            let next = 2 + members;
            let wrong = event("step/end", next + 1, 50, r#"{"turn":1,"step":1}"#);
            assert!(whole.admit(&wrong).is_err() && one_by_one.admit(&wrong).is_err());
            let step_end = event("step/end", next, 50, r#"{"turn":1,"step":1}"#);
            assert!(whole.admit(&step_end).is_ok() && one_by_one.admit(&step_end).is_ok());
            assert_eq!(state(&whole), state(&one_by_one));
            assert!(whole.finish(99).is_ok() && one_by_one.finish(99).is_ok());
        }
        let mut misplaced = RestoreCheck::new("s", 1024);
        assert_eq!(
            misplaced.admit_chunk_row(3, 2, 0),
            Err(RestoreUndecided { seq: 3 })
        );
    }
}
