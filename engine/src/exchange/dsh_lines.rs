//! A stored session as DSH's own lines, streamed: packed chunk rows come back as the rows
//! DSH wrote (rebuilt from their members, or their verbatim text), every other event as its
//! DSH line. Export and the Node provider's reads share this one walk; it holds at most one
//! row's members in memory, whatever the session's size.

use super::scan::pack_row;
use super::{unexportable, verbatim_bytes, ExchangeError, Result};
use crate::session::line::push_event_line;
use crate::storage::frame::{
    EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START, EVENT_FLAG_ROW_VERBATIM,
    EVENT_FLAG_VERBATIM_LINE,
};
use crate::{EventView, Store};

/// One DSH line (without its newline), whether it starts a batch DSH wrote as one unit, and
/// whether it is a packed chunk row (a line that stands for several events).
pub struct DshLine<'a> {
    pub bytes: &'a [u8],
    pub batch_start: bool,
    pub row: bool,
}

/// The row being gathered: its members (seq, time and the span of their data in one
/// buffer, so a member costs no allocation), or its verbatim text.
enum PendingRow {
    None,
    Members {
        batch_start: bool,
        data: String,
        members: Vec<(u64, i64, std::ops::Range<usize>)>,
    },
    Verbatim {
        batch_start: bool,
        bytes: Vec<u8>,
    },
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
    let mut walk = Walk {
        id,
        pending: PendingRow::None,
        line: String::new(),
    };
    // The store's visitor speaks the store's error type: an exchange error (a damaged row, a
    // failed write) is kept here and stops the walk through a placeholder the caller never
    // sees.
    let mut failure: Option<ExchangeError> = None;
    let walked = store.visit_events(id, from, to, |event| {
        walk.event(event, &mut visit).map_err(|error| {
            failure = Some(error);
            crate::Error::InvalidInput {
                reason: "visit stopped".to_owned(),
            }
        })
    });
    if let Some(error) = failure {
        return Err(error);
    }
    walked?;
    flush_row(id, &mut walk.pending, &mut visit)
}

/// The walk's state between events.
struct Walk<'a> {
    id: &'a str,
    pending: PendingRow,
    /// Reused buffer for one rendered event line.
    line: String,
}

impl Walk<'_> {
    fn event(
        &mut self,
        event: &EventView<'_>,
        visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
    ) -> Result<()> {
        let id = self.id;
        let continues_row =
            event.flags & EVENT_FLAG_ROW_MEMBER != 0 && event.flags & EVENT_FLAG_ROW_START == 0;
        match &mut self.pending {
            PendingRow::Members { data, members, .. } if continues_row => {
                members.push((event.seq, event.time, push_span(data, event.data)));
                return Ok(());
            }
            PendingRow::Verbatim { .. } if continues_row => return Ok(()),
            _ => flush_row(id, &mut self.pending, visit)?,
        }
        let batch_start = event.flags & EVENT_FLAG_BATCH_START != 0;
        if event.flags & EVENT_FLAG_ROW_START != 0 {
            self.pending = start_row(id, event, batch_start)?;
            return Ok(());
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
}

fn start_row(id: &str, event: &EventView<'_>, batch_start: bool) -> Result<PendingRow> {
    if event.flags & EVENT_FLAG_ROW_VERBATIM != 0 {
        let bytes = verbatim_bytes(event.envelope)
            .ok_or_else(|| unexportable(id, event.seq, "damaged verbatim row"))?;
        return Ok(PendingRow::Verbatim { batch_start, bytes });
    }
    let mut data = String::new();
    let span = push_span(&mut data, event.data);
    Ok(PendingRow::Members {
        batch_start,
        data,
        members: vec![(event.seq, event.time, span)],
    })
}

/// Appends `text` to `buffer` and returns where it is.
fn push_span(buffer: &mut String, text: &str) -> std::ops::Range<usize> {
    let start = buffer.len();
    buffer.push_str(text);
    start..buffer.len()
}

/// Visits the gathered row, if any, and forgets it.
fn flush_row(
    id: &str,
    pending: &mut PendingRow,
    visit: &mut impl FnMut(DshLine<'_>) -> Result<()>,
) -> Result<()> {
    match std::mem::replace(pending, PendingRow::None) {
        PendingRow::None => Ok(()),
        PendingRow::Verbatim { batch_start, bytes } => visit(DshLine {
            bytes: &bytes,
            batch_start,
            row: true,
        }),
        PendingRow::Members {
            batch_start,
            data,
            members,
        } => {
            let borrowed: Vec<(u64, i64, &str)> = members
                .iter()
                .map(|(seq, time, span)| (*seq, *time, &data[span.clone()]))
                .collect();
            let first_seq = members.first().map_or(0, |member| member.0);
            let row = pack_row(&borrowed)
                .ok_or_else(|| unexportable(id, first_seq, "row members do not pack"))?;
            visit(DshLine {
                bytes: row.as_bytes(),
                batch_start,
                row: true,
            })
        }
    }
}
