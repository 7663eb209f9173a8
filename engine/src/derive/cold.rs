//! Cold resume to DSH's derived messages without materialising the log (issue #4).
//!
//! The full cold load ([`super::restore`]) renders every stored event to its DSH line,
//! parses each line into a [`SessionEvent`], keeps them all, and then runs DSH's cold-load
//! passes over the slice. [`stream_messages`] visits the session's stored events in chunks
//! of [`READ_CHUNK_EVENTS`] ([`Store::visit_events`], borrowed: a log-only event is never
//! copied) and runs the same checks event by event as it goes,
//! keeping only the surface fold, the repair scan and the projected messages:
//!
//! - every event: known type (or `ignorable`), seq equal to its index, the surface rules of
//!   the fold (`surfaceOp` / `sourceEventSeqs`, replacements, tool-result rewrites);
//! - message-bearing events (`user/message`, `assistant/message`, `tool/result`): payload
//!   read once (a `Value` for [`stream_messages`], a skeleton for [`stream_message_texts`]),
//!   then DSH's message-shape check, the repair scan and the fold all read that one parse,
//!   and the projected message is taken out of it (no second parse at the end);
//! - other events whose payload a check reads (`turn/*`, `step/*`, `tool/call`,
//!   `request/header`, …): exactly the full load's per-event checks;
//! - same-version legacy shapes: migrated event by event as the full load migrates them
//!   ([`crate::session::migrate_next`]), except a legacy replacement result, whose rewrite
//!   needs the earlier events (it hands over);
//! - verbatim lines and packed chunk rows: rendered and decoded exactly as the full load does;
//! - then DSH's interrupted-turn closers and the in-memory `session/end-seed`, as in
//!   [`crate::session::restore_session`].
//!
//! What it skips, and why the result is still the full load's:
//! - the payload of a *log-only* event ([`is_log_only_type`]: a known type none of the
//!   cold-load checks reads, in DSH logs almost all `assistant/chunk`) is neither parsed nor
//!   re-rendered. The full load's line parse could not fail on it: writers check that
//!   `data` is valid JSON (format-spec F-02-11; `Store` refuses such an append) and every
//!   frame read back is checksummed. (A store written by a foreign writer that broke F-02-11
//!   could hold a payload the full load refuses and this path does not.)
//! - message-bearing payloads are read as *skeletons* in text form
//!   ([`stream_message_texts`]): one structural scan keeps exactly what the checks read and
//!   slices the message text out (same F-02-11 reasoning: the scan does not re-validate);
//! - a plain stored event (not verbatim, not a row) is taken from its stored fields, with
//!   the envelope rules (`seq`/`time` safe integers, envelope members) checked on the stored
//!   values instead of on a rendered line;
//! - a row entry of a run (format-spec F-06-30, lent whole by [`Store::visit_entries`]) of
//!   log-only events is admitted from its members' seqs, times and flags (and, for a DSH
//!   row, its shared prefix and each payload being one string), without building their
//!   `data`: exactly what admitting its members one by one would check
//!   (`StreamLoad::row_entry`); any other entry is taken member by member.
//!
//! Whenever the log needs what only the full load does — a removed legacy type to refuse,
//! any check that fails (whose DSH error text must be reported) — it stops and
//! returns [`Streamed::NeedsFullLoad`], and [`super::messages`] runs the full load, which
//! gives the exact result or error. `engine/tests/cold_resume.rs` checks the two agree.

use super::skeleton::{self, Skeleton};
use crate::exchange::scan::{
    decode_record, is_row_payload_token, row_gap, row_member_payload, row_member_prefix, Record,
    RowTag, MEMBER_DATA_SUFFIX, ROW_MEMBER_TYPE,
};
use crate::exchange::{event_line, row_line, Result};
use crate::session::event::{ASSISTANT_MESSAGE, END_SEED_TYPE, TOOL_RESULT, USER_MESSAGE};
use crate::session::json::{null_raw, value_lossy, MAX_SAFE_INTEGER};
use crate::session::repair::repair_observes_type;
use crate::session::surface::{projected_message, rewrite_key, rewrite_key_from};
use crate::session::{
    is_known_event_type, is_surface_eligible_type, migrate_next, parse_event_line,
    validate_seed_event, validate_seed_event_parsed, RepairScan, SeedMode, SessionEvent,
    SurfaceChange, SurfaceFold, SurfaceOp,
};
use crate::storage::frame::{
    EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START, EVENT_FLAG_ROW_VERBATIM, EVENT_FLAG_VERBATIM_LINE,
};
use crate::store::{EntryView, Event, EventView, ReadScan, RowView, Store};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::HashMap;

pub use crate::limits::EVENTS_PER_READ as READ_CHUNK_EVENTS;

/// What [`stream_messages`] or [`stream_message_texts`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Streamed<T> {
    /// `deriveMessages()` after the cold load, equal to the full load's.
    Messages(Vec<T>),
    /// The log needs the full cold load (see the module doc): the event where streaming
    /// stopped and why.
    NeedsFullLoad(Fallback),
}

/// Where and why [`stream_messages`] handed over to the full cold load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    /// Seq of the event being checked (the next index when the log itself ended).
    pub seq: u64,
    pub reason: &'static str,
}

/// Whether the payload of an event of this (known) type is read by no cold-load check:
/// not a message-bearing type, not seen by the repair scan, not a legacy-migrated or
/// refused type, not a request header and not the end-seed marker.
pub fn is_log_only_type(event_type: &str) -> bool {
    // Most of a DSH log: answer it without the lookups.
    if event_type == "assistant/chunk" {
        return true;
    }
    is_known_event_type(event_type)
        && !is_surface_eligible_type(event_type)
        && !repair_observes_type(event_type)
        && !matches!(
            event_type,
            "request/header"
                | "request/header-delta"
                | "mode/set"
                | "steering/message"
                | END_SEED_TYPE
        )
}

/// Derives DSH's messages of session `id` by streaming its log (module doc), as values
/// (equal to [`super::messages_full`]). Store errors are returned as such; anything else the
/// full load would have to report or rewrite gives [`Streamed::NeedsFullLoad`].
pub fn stream_messages(store: &Store, id: &str) -> Result<Streamed<Value>> {
    stream_as(store, id, Form::Values, |kept| match kept {
        Kept::Value(value) => Some(value),
        Kept::Text(_) => None,
    })
}

/// [`stream_messages`] as the messages' exact JSON texts (equal to the full load's
/// `surface.derive_message_texts()`). Message payloads are read as skeletons
/// ([`super::skeleton`]: a structural scan, the checks read what they need, the message
/// text is sliced out) and no `Value` of a message is built.
pub fn stream_message_texts(store: &Store, id: &str) -> Result<Streamed<String>> {
    stream_as(store, id, Form::Texts, |kept| match kept {
        Kept::Text(text) => Some(text),
        Kept::Value(_) => None,
    })
}

/// Streams in `form` and unwraps the kept messages (all of that form).
fn stream_as<T>(
    store: &Store,
    id: &str,
    form: Form,
    unwrap: impl FnMut(Kept) -> Option<T>,
) -> Result<Streamed<T>> {
    Ok(match stream(store, id, form)? {
        Streamed::Messages(kept) => {
            Streamed::Messages(kept.into_iter().filter_map(unwrap).collect())
        }
        Streamed::NeedsFullLoad(fallback) => Streamed::NeedsFullLoad(fallback),
    })
}

fn stream(store: &Store, id: &str, form: Form) -> Result<Streamed<Kept>> {
    let length = store.session(id)?.events;
    let mut load = StreamLoad::new(id, form);
    let mut row: Vec<Event> = Vec::new();
    let mut stopped = None;
    let mut from = 0;
    let mut scan = ReadScan::default();
    while from < length {
        let to = length.min(from.saturating_add(READ_CHUNK_EVENTS));
        store.visit_entries_in(&mut scan, id, from, to, |entry| {
            if stopped.is_some() {
                return Ok(());
            }
            stopped = match entry {
                EntryView::Event(event) => load.viewed(event, &mut row).err(),
                EntryView::Row(view) => match load.row_entry(view, &row) {
                    Some(step) => step.err(),
                    None => {
                        let mut first_stop = None;
                        view.visit_events(|event| {
                            if first_stop.is_none() {
                                first_stop = load.viewed(event, &mut row).err();
                            }
                            Ok::<(), crate::Error>(())
                        })?;
                        first_stop
                    }
                },
            };
            Ok(())
        })?;
        if let Some(fallback) = stopped {
            return Ok(Streamed::NeedsFullLoad(fallback));
        }
        from = to;
    }
    let finished = load.flush_row(&mut row).and_then(|()| load.finish());
    Ok(match finished {
        Ok(messages) => Streamed::Messages(messages),
        Err(fallback) => Streamed::NeedsFullLoad(fallback),
    })
}

/// The form the derived messages take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Values,
    Texts,
}

/// A projected message in its form.
enum Kept {
    Value(Value),
    Text(String),
}

/// A message-bearing payload as the caller parsed it.
enum Parsed {
    /// The whole payload (`SessionEvent::data_value`).
    Value(Value),
    Skeleton(Skeleton),
}

/// The last event admitted so far (for the closers and the end-seed marker).
#[derive(Debug, Clone, Copy)]
struct Last {
    seq: u64,
    time: i64,
    is_end_seed: bool,
}

/// The cold load's state while the log streams by.
struct StreamLoad<'a> {
    session_id: &'a str,
    form: Form,
    /// Index in the log of the next event (the seq it must carry).
    next_index: u64,
    fold: SurfaceFold,
    repair: RepairScan,
    /// Projected message of every node the fold holds that projects one, by seq.
    messages: HashMap<u64, Kept>,
    last: Option<Last>,
    /// The packed row whose members are being admitted in place ([`Self::row_member`]).
    row_in_place: Option<RowInPlace>,
}

/// What the members of a stored row after its first must match to be admitted in place.
struct RowInPlace {
    /// [`row_member_prefix`] of the row's first member.
    prefix: String,
    previous_time: i64,
}

type Step = std::result::Result<(), Fallback>;

/// [`Fallback::reason`] of a failed per-event seed check (message shape, seq, header).
const SEED_RULE: &str = "seed rule";

fn fallback(seq: u64, reason: &'static str) -> Fallback {
    Fallback { seq, reason }
}

impl<'a> StreamLoad<'a> {
    fn new(session_id: &'a str, form: Form) -> Self {
        Self {
            session_id,
            form,
            next_index: 0,
            fold: SurfaceFold::new(),
            repair: RepairScan::new(),
            messages: HashMap::new(),
            last: None,
            row_in_place: None,
        }
    }

    /// Takes the next stored event as the store lends it: a plain log-only event is admitted
    /// from the view (nothing copied), any other is taken as an owned [`Event`].
    fn viewed(&mut self, event: &EventView<'_>, row: &mut Vec<Event>) -> Step {
        if let Some(step) = self.row_member(event, row) {
            return step;
        }
        let special = EVENT_FLAG_VERBATIM_LINE | EVENT_FLAG_ROW_START | EVENT_FLAG_ROW_MEMBER;
        let plain_log_only = row.is_empty()
            && event.flags & special == 0
            && event.envelope.is_empty()
            && is_log_only_type(event.event_type)
            && event.seq <= MAX_SAFE_INTEGER
            && event.time.unsigned_abs() <= MAX_SAFE_INTEGER;
        if plain_log_only {
            // What `single` decides for such an event, without the copy.
            return self.log_only(event.seq, event.time, event.event_type == END_SEED_TYPE);
        }
        self.stored(event.to_event(), row)
    }

    /// A member of a packed row (the bulk of a DSH log) admitted from the view, without
    /// copying it, rebuilding the row's line and decoding it again: a row that packs
    /// ([`crate::exchange::scan::pack_row`]) decodes to exactly its stored members (same
    /// seq, time and `data`, type `assistant/chunk`), which are log-only events. So each
    /// member is checked to pack (the row's prefix, one string payload, a `dt` the decoder
    /// takes) and admitted as a log-only event. `None`: not such a member (a verbatim row,
    /// an envelope, another type, a row collected in `row`); the general path takes it.
    fn row_member(&mut self, event: &EventView<'_>, row: &[Event]) -> Option<Step> {
        let starts = event.flags & EVENT_FLAG_ROW_START != 0;
        if starts || event.flags & EVENT_FLAG_ROW_MEMBER == 0 {
            self.row_in_place = None;
        }
        let in_place = row.is_empty()
            && event.flags & (EVENT_FLAG_VERBATIM_LINE | EVENT_FLAG_ROW_VERBATIM) == 0
            && event.envelope.is_empty()
            && event.event_type == ROW_MEMBER_TYPE
            && event.seq <= MAX_SAFE_INTEGER
            && event.time.unsigned_abs() <= MAX_SAFE_INTEGER;
        if starts {
            if !in_place {
                return None;
            }
            let prefix = row_member_prefix(event.data)?;
            row_member_payload(&prefix, event.data)?;
            self.row_in_place = Some(RowInPlace {
                prefix,
                previous_time: event.time,
            });
            return Some(self.log_only(event.seq, event.time, false));
        }
        let current = self.row_in_place.as_mut()?;
        let packs = in_place
            && row_member_payload(&current.prefix, event.data).is_some()
            && row_gap(current.previous_time, event.time).is_some();
        if !packs {
            // The general path would fail to pack this row too and hand over.
            return Some(Err(fallback(event.seq, "row")));
        }
        current.previous_time = event.time;
        Some(self.log_only(event.seq, event.time, false))
    }

    /// A whole stored row entry (format-spec F-06-30) of log-only events, admitted from its
    /// members' seqs, times and flags without building their `data`, exactly as
    /// [`Self::viewed`] would admit them one by one: plain log-only events (no row flag),
    /// or the members of a DSH chunk row whose shared text is the row's prefix
    /// ([`row_member_prefix`]) and `}}` and whose payloads are one string each
    /// ([`Self::row_member`]'s checks on the payload alone). `None`, before anything is
    /// admitted: not such an entry; the caller takes its members one by one.
    fn row_entry(&mut self, view: &RowView<'_>, collected: &[Event]) -> Option<Step> {
        if !collected.is_empty() || !is_log_only_type(view.event_type) {
            return None;
        }
        let last_seq = view
            .first_seq()
            .checked_add(u64::from(view.member_count()).saturating_sub(1))?;
        let safe = last_seq <= MAX_SAFE_INTEGER
            && view
                .members()
                .all(|member| member.time.unsigned_abs() <= MAX_SAFE_INTEGER);
        if !safe {
            return None;
        }
        let special = EVENT_FLAG_VERBATIM_LINE | EVENT_FLAG_ROW_START | EVENT_FLAG_ROW_MEMBER;
        if (view.first_flags() | view.member_flags()) & special == 0 {
            self.row_in_place = None;
            let mut members = view.members();
            return Some(
                members.try_for_each(|member| self.log_only(member.seq, member.time, false)),
            );
        }
        self.dsh_row_entry(view)
    }

    /// [`Self::row_entry`] for the members of a DSH chunk row: the entry starts the row
    /// (`ROW_START`) or continues the row being admitted in place.
    fn dsh_row_entry(&mut self, view: &RowView<'_>) -> Option<Step> {
        let verbatim = EVENT_FLAG_VERBATIM_LINE | EVENT_FLAG_ROW_VERBATIM;
        let members_continue = view.member_flags() & EVENT_FLAG_ROW_MEMBER != 0
            && view.member_flags() & (EVENT_FLAG_ROW_START | verbatim) == 0;
        let starts = view.first_flags() & EVENT_FLAG_ROW_START != 0;
        let first_continues = view.first_flags() == view.member_flags();
        if view.event_type != ROW_MEMBER_TYPE
            || view.suffix != MEMBER_DATA_SUFFIX
            || !members_continue
            || view.first_flags() & verbatim != 0
            || !(starts || first_continues)
        {
            return None;
        }
        let mut members = view.members();
        if starts {
            let first = members.next()?;
            let payload = std::str::from_utf8(first.payload).ok()?;
            let first_data = format!("{}{payload}{}", view.prefix, view.suffix);
            let prefix = row_member_prefix(&first_data)?;
            if prefix != view.prefix || !is_row_payload_token(first.payload) {
                return None;
            }
            self.row_in_place = Some(RowInPlace {
                prefix,
                previous_time: first.time,
            });
            if let Err(stop) = self.log_only(first.seq, first.time, false) {
                return Some(Err(stop));
            }
        } else if self.row_in_place.as_ref()?.prefix != view.prefix {
            return None;
        }
        for member in members {
            let current = self.row_in_place.as_mut()?;
            let packs = is_row_payload_token(member.payload)
                && row_gap(current.previous_time, member.time).is_some();
            if !packs {
                return Some(Err(fallback(member.seq, "row")));
            }
            current.previous_time = member.time;
            if let Err(stop) = self.log_only(member.seq, member.time, false) {
                return Some(Err(stop));
            }
        }
        Some(Ok(()))
    }

    /// Takes the next stored event, grouping packed rows as the export does.
    fn stored(&mut self, event: Event, row: &mut Vec<Event>) -> Step {
        if !row.is_empty() {
            if event.flags & EVENT_FLAG_ROW_MEMBER != 0 {
                row.push(event);
                return Ok(());
            }
            self.flush_row(row)?;
        }
        if event.flags & EVENT_FLAG_ROW_START != 0 {
            row.push(event);
            return Ok(());
        }
        self.single(event)
    }

    /// Admits the members of a collected packed row, decoded from its DSH line.
    fn flush_row(&mut self, row: &mut Vec<Event>) -> Step {
        if row.is_empty() {
            return Ok(());
        }
        let seq = row[0].seq;
        let line = row_line(self.session_id, row).map_err(|_| fallback(seq, "row"))?;
        row.clear();
        self.decoded_line(&line, seq)
    }

    /// Decodes a rendered DSH line as the full load does and admits its events.
    fn decoded_line(&mut self, line: &[u8], seq: u64) -> Step {
        match decode_record(line) {
            Ok(Record::Event(event)) => self.admit(&event, None, false),
            Ok(Record::Row { members, .. }) => members
                .iter()
                .try_for_each(|member| self.admit(member, None, false)),
            Err(()) => Err(fallback(seq, "unparsable line")),
        }
    }

    /// A stored event outside any packed row.
    fn single(&mut self, event: Event) -> Step {
        let seq = event.seq;
        // A verbatim line, or a type the line decoder reads as a packed row: decode the line.
        if event.flags & EVENT_FLAG_VERBATIM_LINE != 0
            || RowTag::from_tag(&event.event_type).is_some()
        {
            let line = event_line(self.session_id, &event).map_err(|_| fallback(seq, "line"))?;
            return self.decoded_line(&line, seq);
        }
        // The envelope rules of the line parser on the stored values.
        let safe_time = event.time.unsigned_abs() <= MAX_SAFE_INTEGER;
        if seq > MAX_SAFE_INTEGER || !safe_time || event.event_type == "request/header-delta" {
            return Err(fallback(seq, "envelope"));
        }
        if event.envelope.is_empty() && is_log_only_type(&event.event_type) {
            return self.log_only(seq, event.time, event.event_type == END_SEED_TYPE);
        }
        let (head, data) = plain_parts(event)?;
        if is_surface_eligible_type(&head.event_type) {
            // The store validated the payload as JSON when it was appended (as a `RawValue`,
            // like the line parser), so one parse here serves every check.
            let parsed = match self.form {
                Form::Values => value_lossy(&data).ok().map(Parsed::Value),
                Form::Texts => skeleton::scan(&head.event_type, &data)
                    .or_else(|| skeleton::parse(&head.event_type, &data))
                    .map(Parsed::Skeleton),
            };
            if parsed.is_some() {
                match self.admit(&head, parsed, false) {
                    // A failed shape check changed nothing: the event may be a legacy shape,
                    // which the path below migrates.
                    Err(Fallback {
                        reason: SEED_RULE, ..
                    }) => {}
                    done => return done,
                }
            }
        }
        let event = SessionEvent {
            data: RawValue::from_string(data).map_err(|_| fallback(seq, "payload"))?,
            ..head
        };
        self.admit(&event, None, false)
    }

    /// A log-only event: nothing reads its payload; only its seq and type matter.
    fn log_only(&mut self, seq: u64, time: i64, is_end_seed: bool) -> Step {
        if seq != self.next_index {
            return Err(fallback(seq, "seq"));
        }
        self.fold
            .apply_log_only(seq)
            .map_err(|_| fallback(seq, "surface"))?;
        self.advance(seq, time, is_end_seed);
        Ok(())
    }

    fn advance(&mut self, seq: u64, time: i64, is_end_seed: bool) {
        self.next_index += 1;
        self.last = Some(Last {
            seq,
            time,
            is_end_seed,
        });
    }

    /// Runs the cold load's per-event checks on `event` and folds it. `parsed`: the payload
    /// of a message-bearing event when the caller parsed it (then `event.data` is not read).
    /// Closers (`closer`) are not observed by the repair scan, as in DSH.
    fn admit(&mut self, event: &SessionEvent, parsed: Option<Parsed>, closer: bool) -> Step {
        // A same-version legacy shape is migrated as the full load does. (A parsed message
        // event reaches here only in current shape, which migration leaves as it is, and
        // closers are written in current shape.)
        if parsed.is_none() && !closer {
            match migrate_next(self.session_id, event) {
                Some(Ok(Some(migrated))) => return self.admit_current(&migrated, None, closer),
                Some(Ok(None)) => {}
                None | Some(Err(_)) => return Err(fallback(event.seq, "legacy")),
            }
        }
        self.admit_current(event, parsed, closer)
    }

    /// [`Self::admit`] of an event in current shape.
    fn admit_current(
        &mut self,
        event: &SessionEvent,
        parsed: Option<Parsed>,
        closer: bool,
    ) -> Step {
        let seq = event.seq;
        if !event.ignorable && !is_known_event_type(&event.event_type) {
            return Err(fallback(seq, "unknown type"));
        }
        let index = usize::try_from(self.next_index).map_err(|_| fallback(seq, "seq"))?;
        if is_surface_eligible_type(&event.event_type) {
            self.admit_message(event, parsed, index, closer)?;
        } else {
            validate_seed_event(index, event, SeedMode::Restore)
                .map_err(|_| fallback(seq, "seed rule"))?;
            if !closer {
                self.repair.observe(event);
            }
            self.fold
                .apply(event)
                .map_err(|_| fallback(seq, "surface"))?;
        }
        self.advance(seq, event.time, event.event_type == END_SEED_TYPE);
        Ok(())
    }

    /// A message-bearing event: one parse of its payload serves every check and the message.
    /// (When its shape passes, legacy migration leaves it as it is.)
    fn admit_message(
        &mut self,
        event: &SessionEvent,
        parsed: Option<Parsed>,
        index: usize,
        closer: bool,
    ) -> Step {
        let seq = event.seq;
        let (data, message_text) = match parsed {
            Some(Parsed::Value(data)) => (data, None),
            Some(Parsed::Skeleton(skeleton)) => (skeleton.value, Some(skeleton.message)),
            None => {
                let data = value_lossy(event.data.get()).map_err(|_| fallback(seq, "payload"))?;
                (data, None)
            }
        };
        // Checked before anything changes (a caller may retry the event as a legacy shape).
        validate_seed_event_parsed(index, event, SeedMode::Restore, Some(&data))
            .map_err(|_| fallback(seq, SEED_RULE))?;
        if !closer {
            self.repair
                .observe_parsed(&event.event_type, event.seq, &data);
        }
        // The rewrite key of a tool result; in text form its payload is not needed after it.
        let (rewrite_key, data) = match (event.event_type.as_str(), self.form) {
            (TOOL_RESULT, Form::Texts) => (Some(rewrite_key_from(data)), Value::Null),
            (TOOL_RESULT, Form::Values) => (Some(rewrite_key(&data)), data),
            _ => (None, data),
        };
        let change = self
            .fold
            .apply_keeping_no_message(event, rewrite_key)
            .map_err(|_| fallback(seq, "surface"))?;
        let shadowed: &[u64] = match &change {
            SurfaceChange::Unchanged => return Ok(()),
            SurfaceChange::Appended => &[],
            SurfaceChange::Replaced(replacement) => &replacement.shadowed_seqs,
        };
        for seq in shadowed {
            self.messages.remove(seq);
        }
        let kept = match (self.form, message_text) {
            (Form::Values, _) => projected_value(&event.event_type, data).map(Kept::Value),
            (Form::Texts, Some(text)) => {
                projected_text(&event.event_type, &data, text).map(Kept::Text)
            }
            (Form::Texts, None) => {
                projected_message(event).map(|text| Kept::Text(text.get().to_owned()))
            }
        };
        if let Some(kept) = kept {
            self.messages.insert(seq, kept);
        }
        Ok(())
    }

    /// Closes a trailing open turn, adds the in-memory end-seed, and derives the messages.
    fn finish(mut self) -> std::result::Result<Vec<Kept>, Fallback> {
        if let Some(last) = self.last {
            for closer in self.repair.closers(last.seq, last.time) {
                self.admit(&closer, None, true)?;
            }
        }
        if !self.last.is_some_and(|last| last.is_end_seed) {
            let seq = self.next_index;
            self.fold
                .apply_log_only(seq)
                .map_err(|_| fallback(seq, "surface"))?;
        }
        let nodes = self.fold.nodes();
        Ok(nodes
            .iter()
            .filter_map(|seq| self.messages.remove(seq))
            .collect())
    }
}

/// A plain stored event (not verbatim, not a packed row) as its line parser would see it:
/// the event with a `null` placeholder payload, and the payload text. The envelope members
/// are parsed from the line with `null` for the payload (the envelope is small, the payload
/// may not be) unless they repeat a field of the line.
fn plain_parts(event: Event) -> std::result::Result<(SessionEvent, String), Fallback> {
    let Event {
        seq,
        time,
        event_type,
        data,
        envelope,
        ..
    } = event;
    let known = match envelope.is_empty() {
        true => Some((None, None)),
        false => common_envelope(&envelope)
            .map(|(surface_op, source_event_seqs)| (Some(surface_op), source_event_seqs)),
    };
    if let Some((surface_op, source_event_seqs)) = known {
        let head = SessionEvent {
            event_type,
            seq,
            time,
            data: null_raw(),
            ignorable: false,
            surface_op,
            source_event_seqs,
        };
        return Ok((head, data));
    }
    let repeats_field = ["\"type\"", "\"seq\"", "\"time\"", "\"data\""]
        .iter()
        .any(|key| envelope.contains(key));
    if repeats_field {
        return Err(fallback(seq, "envelope"));
    }
    let line = Event {
        seq,
        time,
        event_type,
        data: "null".to_owned(),
        envelope,
        flags: 0,
    }
    .to_json_line();
    let head = parse_event_line(&line).map_err(|_| fallback(seq, "envelope"))?;
    Ok((head, data))
}

/// The envelope as DSH's live append writes it for a surface event, read without a JSON
/// parser: `["sourceEventSeqs":[n,…],]"surfaceOp":"append"` or `…"surfaceOp":{"op":"replace",
/// "start":n,"end":m}` with plain decimal numbers below 10^15 (safe integers). `None` for
/// any other text, which the line parser then reads. Gives what that parser gives.
fn common_envelope(envelope: &str) -> Option<(SurfaceOp, Option<Vec<u64>>)> {
    let (sources, rest) = match envelope.strip_prefix("\"sourceEventSeqs\":[") {
        Some(after) => {
            let (list, rest) = after.split_once("],")?;
            let seqs = if list.is_empty() {
                Vec::new()
            } else {
                list.split(',').map(plain_number).collect::<Option<_>>()?
            };
            (Some(seqs), rest)
        }
        None => (None, envelope),
    };
    let marker = rest.strip_prefix("\"surfaceOp\":")?;
    if marker == "\"append\"" {
        return Some((SurfaceOp::Append, sources));
    }
    let bounds = marker
        .strip_prefix("{\"op\":\"replace\",\"start\":")?
        .strip_suffix('}')?;
    let (start, end) = bounds.split_once(",\"end\":")?;
    let replace = SurfaceOp::Replace {
        start: plain_number(start)?,
        end: plain_number(end)?,
    };
    Some((replace, sources))
}

/// Longest plain number [`common_envelope`] reads: 15 digits stay below 2^53.
const PLAIN_NUMBER_MAX_DIGITS: usize = 15;

/// A JSON non-negative integer written plainly (`0` or digits without a leading zero).
fn plain_number(text: &str) -> Option<u64> {
    let plain = !text.is_empty()
        && text.len() <= PLAIN_NUMBER_MAX_DIGITS
        && text.bytes().all(|byte| byte.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    plain.then(|| text.parse().ok()).flatten()
}

/// `deriveEventMessage` over the parsed payload of an event whose message shape passed:
/// `user/message` projects its payload, `tool/result` its `message`, `assistant/message` its
/// `message` unless the content is empty.
fn projected_value(event_type: &str, data: Value) -> Option<Value> {
    match event_type {
        USER_MESSAGE => Some(data).filter(|data| !data.is_null()),
        TOOL_RESULT => take_member(data, "message"),
        ASSISTANT_MESSAGE => {
            let message = take_member(data, "message")?;
            has_content(&message).then_some(message)
        }
        _ => None,
    }
}

/// [`projected_value`] as text: `message_text` is the skeleton's message text (the payload
/// itself for `user/message`), `skeleton` the payload's skeleton.
fn projected_text(
    event_type: &str,
    skeleton: &Value,
    message_text: Option<String>,
) -> Option<String> {
    match event_type {
        USER_MESSAGE => message_text.filter(|_| !skeleton.is_null()),
        TOOL_RESULT => message_text,
        ASSISTANT_MESSAGE => {
            let has = skeleton.get("message").is_some_and(has_content);
            message_text.filter(|_| has)
        }
        _ => None,
    }
}

fn has_content(message: &Value) -> bool {
    message
        .get("content")
        .and_then(Value::as_array)
        .is_some_and(|content| !content.is_empty())
}

fn take_member(data: Value, key: &str) -> Option<Value> {
    match data {
        Value::Object(mut members) => members.remove(key),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{interrupted_turn_closers, needs_migration};

    /// A payload that every payload-reading check would notice if it read it.
    const TRAP_DATA: &str =
        r#"{"trigger":{"kind":"x"},"reason":"fallback","content":[],"callId":"c","turn":1}"#;

    #[test]
    fn log_only_types_are_read_by_no_cold_load_check() {
        let log_only: Vec<&str> = crate::session::KNOWN_EVENT_TYPES
            .iter()
            .copied()
            .filter(|event_type| is_log_only_type(event_type))
            .collect();
        assert!(log_only.contains(&"assistant/chunk"));
        assert!(!log_only.contains(&"tool/call"));
        assert!(!log_only.contains(&"request/header"));
        for event_type in log_only {
            let event = SessionEvent::new(event_type, 0, 0, TRAP_DATA).expect("JSON");
            assert!(
                matches!(needs_migration("s", &event), Ok(false)),
                "{event_type}"
            );
            assert!(
                validate_seed_event(0, &event, SeedMode::Restore).is_ok(),
                "{event_type}"
            );
            let mut fold = SurfaceFold::new();
            assert!(
                matches!(fold.apply(&event), Ok(SurfaceChange::Unchanged)),
                "{event_type}"
            );
            let open = SessionEvent::new("turn/start", 0, 0, r#"{"turn":1}"#).expect("JSON");
            let mut log_only_last = event.clone();
            log_only_last.seq = 1;
            assert_eq!(
                interrupted_turn_closers(&[open.clone(), log_only_last]).len(),
                interrupted_turn_closers(&[open]).len(),
                "{event_type}"
            );
        }
    }

    #[test]
    fn common_envelopes_read_as_the_line_parser_reads_them() {
        let envelopes = [
            r#""surfaceOp":"append""#,
            r#""sourceEventSeqs":[3],"surfaceOp":"append""#,
            r#""sourceEventSeqs":[0,12,7],"surfaceOp":"append""#,
            r#""sourceEventSeqs":[],"surfaceOp":"append""#,
            r#""sourceEventSeqs":[1,2],"surfaceOp":{"op":"replace","start":1,"end":2}"#,
            r#""surfaceOp":{"op":"replace","start":10,"end":4}"#,
        ];
        for envelope in envelopes {
            let line =
                format!(r#"{{"type":"tool/result","seq":20,"time":5,"data":null,{envelope}}}"#);
            let parsed = parse_event_line(&line).expect("a valid line");
            let fast = common_envelope(envelope).expect("a common envelope");
            assert_eq!(
                (parsed.surface_op, parsed.source_event_seqs),
                (Some(fast.0), fast.1),
                "{envelope}"
            );
        }
        for other in [
            r#""surfaceOp":"append","sourceEventSeqs":[1]"#,
            r#""sourceEventSeqs":[01],"surfaceOp":"append""#,
            r#""sourceEventSeqs":[1.0],"surfaceOp":"append""#,
            r#""sourceEventSeqs":[9007199254740993],"surfaceOp":"append""#,
            r#""surfaceOp":"append","ignorable":true"#,
            r#""surfaceOp":{"start":1,"op":"replace","end":2}"#,
            r#""surfaceOp": "append""#,
        ] {
            assert_eq!(common_envelope(other), None, "{other}");
        }
    }

    #[test]
    fn rewrite_key_in_place_equals_the_copy() {
        for data in [
            r#"{"turn":1,"message":{"content":[{"type":"tool-result","content":[1],"isError":true},{"x":1}],"id":"r"},"error":{}}"#,
            r#"{"message":{"content":[{"type":"tool-result"}]}}"#,
            r#"{"message":{"content":[7,8]}}"#,
            r#"{"message":{"content":[]}}"#,
            r#"{"message":{"content":{"0":1}}}"#,
            r#"{"message":"text"}"#,
            r#"[1]"#,
        ] {
            let value: Value = serde_json::from_str(data).expect("JSON");
            assert_eq!(
                rewrite_key_from(value.clone()),
                rewrite_key(&value),
                "{data}"
            );
        }
    }

    #[test]
    fn projection_matches_the_fold() {
        let message = r#"{"id":"a","role":"assistant","content":[],"source":{"kind":"model","provider":"p","model":"m"}}"#;
        let data: Value =
            serde_json::from_str(&format!(r#"{{"turn":1,"step":1,"message":{message}}}"#))
                .expect("JSON");
        assert_eq!(projected_value("assistant/message", data), None);
        let user: Value = serde_json::from_str(
            r#"{"id":"u","role":"user","content":[],"source":{"kind":"user"}}"#,
        )
        .expect("JSON");
        assert_eq!(projected_value("user/message", user.clone()), Some(user));
    }
}
