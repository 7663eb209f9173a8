//! A stored session as DSH's own lines, streamed: packed chunk rows come back as the rows
//! DSH wrote (rebuilt from their members, or their verbatim text), every other event as its
//! DSH line. Export and the Node provider's reads share this one walk; it holds at most one
//! row's members in memory, whatever the session's size.

use super::scan::{
    is_row_payload_token, row_gap, row_member_payload, start_row_line, MEMBER_DATA_SUFFIX,
    ROW_LINE_END,
};
use super::{unexportable, verbatim_bytes, ExchangeError, Result};
use crate::limits::EVENTS_PER_READ;
use crate::session::line::push_event_line;
use crate::storage::frame::{
    EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START, EVENT_FLAG_ROW_VERBATIM,
    EVENT_FLAG_VERBATIM_LINE,
};
use crate::store::{EntryView, ReadScan, RowView};
use crate::{EventView, Store};

/// One DSH line (without its newline), whether it starts a batch DSH wrote as one unit, and
/// whether it is a packed chunk row (a line that stands for several events).
pub struct DshLine<'a> {
    pub bytes: &'a [u8],
    pub batch_start: bool,
    pub row: bool,
}

/// What the walk holds between events: nothing, a packed row being rendered (in
/// [`Walk::row`]), or a row kept verbatim whose later members are skipped.
enum Pending {
    None,
    Row,
    Verbatim { batch_start: bool, bytes: Vec<u8> },
}

/// A packed row rendered as its members come, in buffers reused from row to row: a member
/// costs its `dt` digits and a copy of its payload, never its whole `data`.
#[derive(Default)]
struct RowLine {
    batch_start: bool,
    first_seq: u64,
    /// Members so far.
    members: u64,
    previous_time: i64,
    /// What every member's `data` starts with (its payload and `}}` follow).
    prefix: String,
    /// The line up to its `dt` entries, then the entries so far.
    head: Vec<u8>,
    /// The text between the `dt` entries and the payloads.
    middle: Vec<u8>,
    /// The payloads so far, comma-separated.
    payloads: Vec<u8>,
}

impl RowLine {
    /// Starts a row at its first member; `false` when its `data` cannot start one.
    fn start(&mut self, seq: u64, time: i64, data: &str, batch_start: bool) -> bool {
        if start_row_line(
            data,
            seq,
            time,
            &mut self.prefix,
            &mut self.head,
            &mut self.middle,
        )
        .is_none()
        {
            return false;
        }
        self.batch_start = batch_start;
        self.first_seq = seq;
        self.members = 0;
        self.previous_time = time;
        self.payloads.clear();
        true
    }

    /// Adds a member given by its payload (one JSON string token); `false` when the row
    /// decoder would not read it back (a gap that is not a safe integer, not one token).
    fn push_payload(&mut self, time: i64, payload: &[u8]) -> bool {
        if !is_row_payload_token(payload) {
            return false;
        }
        if self.members > 0 {
            let Some(gap) = row_gap(self.previous_time, time) else {
                return false;
            };
            if self.members > 1 {
                self.head.push(b',');
            }
            self.head
                .extend_from_slice(itoa::Buffer::new().format(gap).as_bytes());
            self.payloads.push(b',');
        }
        self.payloads.extend_from_slice(payload);
        self.previous_time = time;
        self.members += 1;
        true
    }

    /// Adds a member given by its whole `data`; `false` when it is not this row's prefix,
    /// one JSON string and `}}`.
    fn push_data(&mut self, time: i64, data: &str) -> bool {
        match row_member_payload(&self.prefix, data) {
            Some(payload) => self.push_payload(time, payload.as_bytes()),
            None => false,
        }
    }

    /// The finished line, in `line`.
    fn render(&self, line: &mut Vec<u8>) {
        line.clear();
        line.extend_from_slice(&self.head);
        line.extend_from_slice(&self.middle);
        line.extend_from_slice(&self.payloads);
        line.extend_from_slice(ROW_LINE_END.as_bytes());
    }
}

/// Visits the DSH lines of the events with seq in `from..to` of session `id`, in order. A
/// packed row that starts before `from` yields its members from `from` on as plain event
/// lines (a row line would carry events outside the range).
pub fn visit_dsh_lines(
    store: &Store,
    id: &str,
    from: u64,
    to: u64,
    mut visit: impl FnMut(DshLine<'_>) -> Result<()>,
) -> Result<()> {
    let mut walk = Walk::new(id);
    // A long range is a scan: its blocks are read ahead on another thread and kept out of
    // the shared cache. A short one is a read a caller may repeat: its block is cached.
    let mut scan = (to.saturating_sub(from) > EVENTS_PER_READ).then(ReadScan::default);
    walk_entries(store, scan.as_mut(), id, (from, to), |entry| {
        walk.entry(entry, &mut visit)?;
        Ok(Flow::Continue)
    })?;
    walk.flush(&mut visit)
}

/// Visits the DSH lines that *start* at a seq in `from..to` of a session of `events`
/// events: the members of a row that started before `from` are left to the part before
/// (skipped), and the members of a row still open at `to` are taken from past `to`. The
/// parts `0..a`, `a..b`, `b..events` therefore visit exactly the lines one walk of the
/// whole session visits, in the same bytes: a walk's state is reset by every event that
/// does not continue a row, which is where a part starts and stops.
pub(crate) fn visit_dsh_part(
    store: &Store,
    scan: &mut ReadScan,
    id: &str,
    (from, to): (u64, u64),
    events: u64,
    mut visit: impl FnMut(DshLine<'_>) -> Result<()>,
) -> Result<()> {
    let mut walk = Walk::new(id);
    let mut skipping = from > 0;
    walk_entries(store, Some(&mut *scan), id, (from, to), |entry| {
        if skipping {
            skipping = walk.skip_continuations(entry, &mut visit)?;
        } else {
            walk.entry(entry, &mut visit)?;
        }
        Ok(Flow::Continue)
    })?;
    if skipping {
        // The whole range continues a row that started before it: no line starts here.
        return Ok(());
    }
    let mut at = to;
    while at < events {
        let step_end = events.min(at.saturating_add(EVENTS_PER_READ));
        let stopped = walk_entries(store, Some(&mut *scan), id, (at, step_end), |entry| {
            walk.continuations(entry, &mut visit)
        })?;
        if stopped {
            break;
        }
        at = step_end;
    }
    walk.flush(&mut visit)
}

/// Whether a walk goes on after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

/// Walks the entries of `from..to` with `handle` until it says [`Flow::Stop`]; returns
/// whether it did. With a `scan`, the walk is a step of that scan (its block buffer, not
/// the shared cache).
fn walk_entries(
    store: &Store,
    scan: Option<&mut ReadScan>,
    id: &str,
    (from, to): (u64, u64),
    mut handle: impl FnMut(EntryView<'_, '_>) -> Result<Flow>,
) -> Result<bool> {
    // The store's visitor speaks the store's error type: an exchange error (a damaged row, a
    // failed write) or a stop is kept here and ends the walk through a placeholder the
    // caller never sees.
    let mut failure: Option<ExchangeError> = None;
    let mut stopped = false;
    let mut visit_entry = |entry: EntryView<'_, '_>| match handle(entry) {
        Ok(Flow::Continue) => Ok(()),
        outcome => {
            match outcome {
                Err(error) => failure = Some(error),
                _ => stopped = true,
            }
            Err(crate::Error::InvalidInput {
                reason: "visit stopped".to_owned(),
            })
        }
    };
    let walked = match scan {
        Some(scan) => store.visit_entries_in(scan, id, from, to, &mut visit_entry),
        None => store.visit_entries(id, from, to, &mut visit_entry),
    };
    if let Some(error) = failure {
        return Err(error);
    }
    if stopped {
        return Ok(true);
    }
    walked?;
    Ok(false)
}

/// Why a member-by-member pass over a row entry ended early: a failure, or a stop.
enum Halt {
    Failed(ExchangeError),
    Stop,
}

impl From<crate::Error> for Halt {
    fn from(error: crate::Error) -> Self {
        Halt::Failed(error.into())
    }
}

impl From<ExchangeError> for Halt {
    fn from(error: ExchangeError) -> Self {
        Halt::Failed(error)
    }
}

/// The walk's state between events.
struct Walk<'a> {
    id: &'a str,
    pending: Pending,
    row: RowLine,
    /// Reused buffer for one rendered event line.
    line: String,
    /// Reused buffer for one rendered row line.
    row_bytes: Vec<u8>,
}

/// Whether an event with these flags continues the packed row before it.
fn continues_row(flags: u8) -> bool {
    flags & EVENT_FLAG_ROW_MEMBER != 0 && flags & EVENT_FLAG_ROW_START == 0
}

impl<'a> Walk<'a> {
    fn new(id: &'a str) -> Self {
        Walk {
            id,
            pending: Pending::None,
            row: RowLine::default(),
            line: String::new(),
            row_bytes: Vec::new(),
        }
    }
}

impl Walk<'_> {
    /// One entry of the walk: a single event, or a row entry's members.
    fn entry(
        &mut self,
        entry: EntryView<'_, '_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<()> {
        match entry {
            EntryView::Event(event) => self.event(event, visit),
            EntryView::Row(row) => self.row_entry(row, visit),
        }
    }

    /// A part's first entries: steps over the events that continue a row (the part before
    /// renders them) and walks on from the first that does not. Returns whether it is still
    /// skipping.
    fn skip_continuations(
        &mut self,
        entry: EntryView<'_, '_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<bool> {
        let row = match entry {
            EntryView::Event(event) if continues_row(event.flags) => return Ok(true),
            EntryView::Event(event) => {
                self.event(event, visit)?;
                return Ok(false);
            }
            EntryView::Row(row) => row,
        };
        if !continues_row(row.first_flags()) {
            self.row_entry(row, visit)?;
            return Ok(false);
        }
        let mut skipping = true;
        row.visit_events(|event| {
            skipping = skipping && continues_row(event.flags);
            match skipping {
                true => Ok(()),
                false => self.event(event, visit),
            }
        })?;
        Ok(skipping)
    }

    /// Past a part's end: walks the events that continue the part's last row, and stops
    /// at the first that does not (the next part's first line).
    fn continuations(
        &mut self,
        entry: EntryView<'_, '_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<Flow> {
        let row = match entry {
            EntryView::Event(event) if continues_row(event.flags) => {
                self.event(event, visit)?;
                return Ok(Flow::Continue);
            }
            EntryView::Event(_) => return Ok(Flow::Stop),
            EntryView::Row(row) => row,
        };
        let whole = continues_row(row.first_flags())
            && (row.member_count() == 1 || continues_row(row.member_flags()));
        if whole {
            self.row_entry(row, visit)?;
            return Ok(Flow::Continue);
        }
        let walked = row.visit_events(|event| match continues_row(event.flags) {
            true => self.event(event, visit).map_err(Halt::Failed),
            false => Err(Halt::Stop),
        });
        match walked {
            Ok(()) => Ok(Flow::Continue),
            Err(Halt::Stop) => Ok(Flow::Stop),
            Err(Halt::Failed(error)) => Err(error),
        }
    }

    fn event(
        &mut self,
        event: &EventView<'_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<()> {
        let id = self.id;
        let continues_row = continues_row(event.flags);
        match &self.pending {
            Pending::Row if continues_row => {
                return match self.row.push_data(event.time, event.data) {
                    true => Ok(()),
                    false => Err(self.unpackable()),
                };
            }
            Pending::Verbatim { .. } if continues_row => return Ok(()),
            _ => self.flush(visit)?,
        }
        let batch_start = event.flags & EVENT_FLAG_BATCH_START != 0;
        if event.flags & EVENT_FLAG_ROW_START != 0 {
            return self.start_row(event, batch_start);
        }
        if event.flags & EVENT_FLAG_VERBATIM_LINE != 0 {
            let bytes = verbatim_bytes(event.envelope)
                .ok_or_else(|| unexportable(id, event.seq, "damaged verbatim line"))?;
            return visit(DshLine {
                bytes: &bytes,
                batch_start,
                row: false,
            });
        }
        // A plain event, or a row member whose row started before the walk's `from`.
        let envelope = if continues_row { "" } else { event.envelope };
        self.line.clear();
        push_event_line(
            &mut self.line,
            event.event_type,
            event.seq,
            event.time,
            event.data,
            envelope,
        );
        visit(DshLine {
            bytes: self.line.as_bytes(),
            batch_start,
            row: false,
        })
    }

    /// A row entry of a run (format-spec F-06-30) lent whole: when it is a DSH row's start
    /// or continues the row being rendered, its payloads go into the row line as they are
    /// stored (no member's `data` is built); anything else goes member by member.
    fn row_entry(
        &mut self,
        row: &RowView<'_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<()> {
        if !self.take_row_entry(row, visit)? {
            row.visit_events(|event| self.event(event, visit))?;
        }
        Ok(())
    }

    /// Renders a row entry's members into the row line; `false` (nothing taken) when the
    /// entry is not the members of a DSH row in the form the line needs, for the member by
    /// member path, which renders or refuses it as it would any events.
    fn take_row_entry(
        &mut self,
        row: &RowView<'_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<bool> {
        let first_flags = row.first_flags();
        if row.suffix != MEMBER_DATA_SUFFIX || !continues_row(row.member_flags()) {
            return Ok(false);
        }
        let mut members = row.members();
        if continues_row(first_flags) {
            let continues = matches!(self.pending, Pending::Row) && row.prefix == self.row.prefix;
            if !continues {
                return Ok(false);
            }
        } else {
            let starts = first_flags & EVENT_FLAG_ROW_START != 0
                && first_flags & (EVENT_FLAG_ROW_VERBATIM | EVENT_FLAG_VERBATIM_LINE) == 0;
            if !starts {
                return Ok(false);
            }
            self.flush(visit)?;
            let Some(first) = members.next() else {
                return Ok(false);
            };
            // The view checked every payload to be UTF-8; a failure here falls back anyway.
            let Ok(first_payload) = std::str::from_utf8(first.payload) else {
                return Ok(false);
            };
            let mut data =
                String::with_capacity(row.prefix.len() + first_payload.len() + row.suffix.len());
            data.push_str(row.prefix);
            data.push_str(first_payload);
            data.push_str(row.suffix);
            let batch_start = first_flags & EVENT_FLAG_BATCH_START != 0;
            if !self.row.start(first.seq, first.time, &data, batch_start)
                || self.row.prefix != row.prefix
            {
                return Ok(false);
            }
            self.pending = Pending::Row;
            if !self.row.push_payload(first.time, first.payload) {
                return Err(self.unpackable());
            }
        }
        for member in members {
            if !self.row.push_payload(member.time, member.payload) {
                return Err(self.unpackable());
            }
        }
        Ok(true)
    }

    /// Starts a row at its first member (`ROW_START`): verbatim, or rendered as it comes.
    fn start_row(&mut self, event: &EventView<'_>, batch_start: bool) -> Result<()> {
        if event.flags & EVENT_FLAG_ROW_VERBATIM != 0 {
            let bytes = verbatim_bytes(event.envelope)
                .ok_or_else(|| unexportable(self.id, event.seq, "damaged verbatim row"))?;
            self.pending = Pending::Verbatim { batch_start, bytes };
            return Ok(());
        }
        if !self
            .row
            .start(event.seq, event.time, event.data, batch_start)
        {
            return Err(unexportable(self.id, event.seq, "row members do not pack"));
        }
        self.pending = Pending::Row;
        match self.row.push_data(event.time, event.data) {
            true => Ok(()),
            false => Err(self.unpackable()),
        }
    }

    /// The error of a row whose members do not form a DSH row line.
    fn unpackable(&self) -> ExchangeError {
        unexportable(self.id, self.row.first_seq, "row members do not pack")
    }

    /// Visits the pending row, if any, and forgets it.
    fn flush(&mut self, visit: &mut impl FnMut(DshLine<'_>) -> Result<()>) -> Result<()> {
        match std::mem::replace(&mut self.pending, Pending::None) {
            Pending::None => Ok(()),
            Pending::Verbatim { batch_start, bytes } => visit(DshLine {
                bytes: &bytes,
                batch_start,
                row: true,
            }),
            Pending::Row => {
                self.row.render(&mut self.row_bytes);
                visit(DshLine {
                    bytes: &self.row_bytes,
                    batch_start: self.row.batch_start,
                    row: true,
                })
            }
        }
    }
}
