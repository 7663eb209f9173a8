//! The write path: `SessionWriter`, batches handed to group commit, receipts.

use super::validate::{validate_event, validate_parsed_event};
use super::{now_millis, NewEvent, Receipt, SessionWriter, Store};
use crate::error::{Error, Result};
use crate::limits::EVENT_FRAME_ESTIMATE_BYTES;
use crate::storage::catalog::{Catalog, Position, Seed};
use crate::storage::coding::{checked_count_u32, checked_u32, widen};
use crate::storage::commit::{Durability, Log, SegmentContext};
use crate::storage::frame::{EventRecord, Record, NO_SEED_PARENT};
use crate::storage::run::rows::{encode_row_frame, row_groups};
use serde_json::value::RawValue;

impl SessionWriter {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Sets the durability of this handle's appends.
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = durability;
    }

    /// Appends one event.
    pub fn append(&mut self, event: NewEvent<'_>) -> Result<Receipt> {
        self.append_batch(&[event])
    }

    /// Appends events as one atomic batch: after a crash either all of them are there or none.
    /// Returns when the batch is as durable as this handle's durability says.
    pub fn append_batch(&mut self, events: &[NewEvent<'_>]) -> Result<Receipt> {
        let durability = self.durability;
        self.submit_with(events, durability)?.wait()
    }

    /// Queues events as one atomic batch for a durable commit without waiting for it: the
    /// committer syncs it with the next group, and [`PendingReceipt::wait`] returns once it
    /// is durable. One thread can so keep many sessions' appends in one group commit (as an
    /// async runtime would) instead of sleeping once per append. The batch is readable at
    /// once; it is acknowledged only by `wait`.
    pub fn submit_batch(&mut self, events: &[NewEvent<'_>]) -> Result<PendingReceipt> {
        self.submit_with(events, Durability::Sync)
    }

    /// [`SessionWriter::submit_batch`] with the durability `wait` is to reach
    /// (`Buffered`: written to the operating system).
    pub fn submit_batch_as(
        &mut self,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<PendingReceipt> {
        self.submit_with(events, durability)
    }

    /// [`SessionWriter::append_batch`] of events whose `data` was parsed already: the
    /// import stages millions of events it has just parsed, and parsing each `data` again
    /// was a tenth of its time. Every other check is made.
    pub(crate) fn append_parsed_batch(&mut self, batch: &ParsedBatch<'_>) -> Result<Receipt> {
        let durability = self.durability;
        self.submit_checked(&batch.events, durability, |index, event| {
            validate_parsed_event(event, batch.depths.get(index).copied().flatten())
        })?
        .wait()
    }

    fn submit_with(
        &mut self,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<PendingReceipt> {
        self.submit_checked(events, durability, |_, event| validate_event(event))
    }

    /// Checks every event with `validate` (given its index), then queues the batch.
    fn submit_checked(
        &mut self,
        events: &[NewEvent<'_>],
        durability: Durability,
        validate: impl Fn(usize, &NewEvent<'_>) -> Result<()>,
    ) -> Result<PendingReceipt> {
        if events.is_empty() {
            return Err(Error::invalid("an empty batch"));
        }
        self.store.log()?;
        for (index, event) in events.iter().enumerate() {
            validate(index, event)?;
        }
        let pending = self.store.commit_batch(self.number, events, durability)?;
        self.last_ticket = pending.ticket;
        Ok(pending)
    }
}

impl Drop for SessionWriter {
    fn drop(&mut self) {
        if self.store.is_shared() {
            // The next holder must find every batch of this one written (F-08-10).
            if let (Some(log), true) = (&self.store.inner.log, self.last_ticket > 0) {
                let _ = log.wait(self.last_ticket, false);
            }
            self.store.release_lease(&self.id);
        }
        if let Some(entry) = self
            .store
            .inner
            .catalog
            .write()
            .sessions
            .get_mut(&self.number)
        {
            entry.has_writer = false;
        }
    }
}

/// An event whose `data` is the text of a parsed JSON value (a [`RawValue`], which serde
/// only builds from valid JSON), so that [`SessionWriter::append_parsed_batch`] need not
/// parse it again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ParsedEvent<'a> {
    event: NewEvent<'a>,
    /// How deep `data` nests arrays and objects, when whoever built it knows (no scan).
    depth: Option<usize>,
}

impl<'a> ParsedEvent<'a> {
    pub(crate) fn new(
        event_type: &'a str,
        time: i64,
        data: &'a RawValue,
        envelope: &'a str,
        flags: u8,
    ) -> Self {
        Self {
            event: timed_event(event_type, time, data.get(), envelope, flags),
            depth: None,
        }
    }

    /// [`Self::new`] of a `data` text the caller built from parts it checked, so that it is
    /// one JSON value by construction, nesting arrays and objects `depth` deep (a packed
    /// row member read in one pass, `exchange::row_line`): its depth is checked without
    /// scanning it.
    pub(crate) fn built(
        event_type: &'a str,
        time: i64,
        (data, depth): (&'a str, usize),
        envelope: &'a str,
        flags: u8,
    ) -> Self {
        Self {
            event: timed_event(event_type, time, data, envelope, flags),
            depth: Some(depth),
        }
    }
}

/// [`ParsedEvent`]s as the writer takes them, the events and their depths side by side, so
/// that a caller appending batch after batch keeps one allocation ([`ParsedBatch::renewed`]).
#[derive(Debug, Default)]
pub(crate) struct ParsedBatch<'a> {
    events: Vec<NewEvent<'a>>,
    depths: Vec<Option<usize>>,
}

impl<'a> ParsedBatch<'a> {
    pub(crate) fn push(&mut self, parsed: ParsedEvent<'a>) {
        self.events.push(parsed.event);
        self.depths.push(parsed.depth);
    }

    pub(crate) fn reserve(&mut self, additional: usize) {
        self.events.reserve(additional);
        self.depths.reserve(additional);
    }

    /// The batch emptied, its room kept for events borrowed from elsewhere: the events
    /// borrow the text they were parsed from, so the next batch's cannot go in as they are.
    /// Collecting an empty iterator of the same layout reuses the allocation.
    pub(crate) fn renewed<'b>(mut self) -> ParsedBatch<'b> {
        self.events.clear();
        self.depths.clear();
        ParsedBatch {
            events: self
                .events
                .into_iter()
                .map(|_| unreachable!("the events were cleared"))
                .collect(),
            depths: self.depths,
        }
    }
}

fn timed_event<'a>(
    event_type: &'a str,
    time: i64,
    data: &'a str,
    envelope: &'a str,
    flags: u8,
) -> NewEvent<'a> {
    NewEvent {
        event_type,
        time: Some(time),
        data,
        envelope,
        flags,
    }
}

/// A batch queued by [`SessionWriter::submit_batch`] (or an append on its way).
#[must_use = "a pending batch is acknowledged only by waiting for it"]
pub struct PendingReceipt {
    store: Store,
    pub(super) ticket: u64,
    first_seq: u64,
    end_seq: u64,
    durability: Durability,
}

impl PendingReceipt {
    /// The seq of the batch's first event.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Whether [`PendingReceipt::wait`] would return at once: the batch is as durable as
    /// it was submitted, or the log failed. An async caller checks this before handing
    /// its thread to a blocking wait.
    pub fn is_settled(&self) -> bool {
        match awaited_durable(self.durability) {
            None => true,
            Some(durable) => self
                .store
                .log()
                .map_or(true, |log| log.is_settled(self.ticket, durable)),
        }
    }

    /// Calls `call` once [`PendingReceipt::wait`] would return at once ([`Self::is_settled`]):
    /// at once if it would now, else on the log's committer thread, so `call` must be short
    /// (it wakes an async task, which then calls `wait`). Lets an async caller wait for
    /// the fsync without holding a thread.
    pub fn when_settled(&self, call: impl FnOnce() + Send + 'static) {
        match (awaited_durable(self.durability), self.store.log()) {
            (Some(durable), Ok(log)) => log.when_settled(self.ticket, durable, Box::new(call)),
            _ => call(),
        }
    }

    /// Waits until the batch is as durable as it was submitted (durable for
    /// `submit_batch`). An error means it must not be taken as durable.
    pub fn wait(self) -> Result<Receipt> {
        let log = self.store.log()?;
        let durable = wait_for(log, self.ticket, self.durability)?;
        Ok(Receipt {
            first_seq: self.first_seq,
            end_seq: self.end_seq,
            durable,
        })
    }
}

/// Waits as the durability asks; returns whether the batch is durable.
pub(super) fn wait_for(log: &Log, ticket: u64, durability: Durability) -> Result<bool> {
    match awaited_durable(durability) {
        None => Ok(false),
        Some(durable) => log.wait(ticket, durable).map(|()| durable),
    }
}

/// What a batch submitted with `durability` is waited for: durable (`Some(true)`), written
/// (`Some(false)`), or nothing (`None`: `Batched` returns at once).
fn awaited_durable(durability: Durability) -> Option<bool> {
    match durability {
        Durability::Sync => Some(true),
        Durability::Buffered => Some(false),
        Durability::Batched { .. } => None,
    }
}

pub(super) fn encode_header_if_new(
    context: &mut SegmentContext,
    out: &mut Vec<u8>,
    number: u32,
    seed: Option<Seed>,
    header_json: &str,
) -> Result<()> {
    if context.define_session(number) {
        Record::SessionHeader {
            session: number,
            seed_parent: seed.map_or(NO_SEED_PARENT, |seed| seed.parent),
            seed_length: seed.map_or(0, |seed| seed.length),
            header_json: header_json.as_bytes(),
        }
        .encode(out, context.salt)?;
    }
    Ok(())
}

pub(super) fn encode_commit(
    context: &SegmentContext,
    out: &mut Vec<u8>,
    session: u32,
    first_seq: u64,
    count: u32,
) -> Result<()> {
    Record::Commit {
        session,
        first_seq,
        event_count: count,
        durable_offset: context.durable_offset,
    }
    .encode(out, context.salt)
}

/// The type number of each event, interned in `catalog`. An import's batch is mostly runs
/// of one type (a packed row's chunks), so a type repeated from the event before is not
/// hashed again.
fn type_numbers_of(catalog: &mut Catalog, events: &[NewEvent<'_>]) -> Vec<u32> {
    let mut previous: Option<(&str, u32)> = None;
    let mut numbers = Vec::with_capacity(events.len());
    for event in events {
        let number = match previous {
            Some((name, number)) if name == event.event_type => number,
            _ => catalog.intern_type(event.event_type),
        };
        previous = Some((event.event_type, number));
        numbers.push(number);
    }
    numbers
}

/// Where the frame just encoded into `out` from `start` on will lie in its segment, with
/// the events it holds.
fn framed_at(
    context: &SegmentContext,
    out: &[u8],
    start: usize,
    count: u32,
) -> Result<(Position, u32)> {
    Ok((
        Position {
            segment: context.segment,
            offset: context.base_offset + widen(start),
            frame_bytes: checked_u32(out.len() - start, "event frame")?,
        },
        count,
    ))
}

impl Store {
    /// Commits `events` (possibly none, for a new session's header) to session `number`.
    pub(super) fn commit_batch(
        &self,
        number: u32,
        events: &[NewEvent<'_>],
        durability: Durability,
    ) -> Result<PendingReceipt> {
        let inner = &self.inner;
        let log = self.log()?;
        // From before the batch is queued until its positions are in the catalog: no
        // checkpoint is cut in between (F-06-27).
        let _in_flight = self.in_flight();
        // With other processes: this process's turn at the tail, caught up, from before the
        // type numbers are taken until the batch is queued (F-08-6 step 4).
        let _turn = log.pin_tail()?;
        let now = now_millis();
        let first_new_type = self
            .is_shared()
            .then(|| inner.catalog.read().next_type_number());
        let (type_numbers, first_seq, seed, header_json) = {
            let mut catalog = inner.catalog.write();
            let type_numbers = type_numbers_of(&mut catalog, events);
            let entry = catalog
                .sessions
                .get(&number)
                .ok_or_else(|| Error::invalid("session vanished"))?;
            (
                type_numbers,
                entry.length(),
                entry.seed,
                entry.header_json.clone(),
            )
        };
        let estimated_bytes: usize = events
            .iter()
            .map(|event| EVENT_FRAME_ESTIMATE_BYTES + event.data.len() + event.envelope.len())
            .sum();
        let record_at = |index: usize, seq: u64| {
            let (event, type_number) = (&events[index], type_numbers[index]);
            EventRecord {
                session: number,
                seq,
                time: event.time.unwrap_or(now),
                type_number,
                flags: event.flags,
                data: event.data.as_bytes(),
                envelope: event.envelope.as_bytes(),
            }
        };
        // Stretches that share a row shape (a DSH row's chunks, F-06-31's rule) go to the
        // log as one row entry each (F-02-20): an import writes a row once, not once per
        // chunk with the shared text repeated. A batch of one event (a live append) has
        // none, and builds no list for it.
        let records: Vec<EventRecord<'_>> = if events.len() >= 2 {
            (0..events.len())
                .zip(first_seq..)
                .map(|(index, seq)| record_at(index, seq))
                .collect()
        } else {
            Vec::new()
        };
        let groups = row_groups(&records);
        let submitted = log.submit(durability, |context, out| {
            // One reservation instead of the buffer regrowing frame by frame.
            out.reserve(estimated_bytes);
            encode_header_if_new(context, out, number, seed, &header_json)?;
            // A batch is mostly runs of one type (a packed row's chunks): a type is looked
            // up in the segment's set once per run, not once per event.
            let mut previous_type = None;
            for (event, type_number) in events.iter().zip(&type_numbers) {
                if previous_type.replace(*type_number) == Some(*type_number) {
                    continue;
                }
                if context.define_type(*type_number) {
                    Record::TypeDefinition {
                        type_number: *type_number,
                        name: event.event_type.as_bytes(),
                    }
                    .encode(out, context.salt)?;
                }
            }
            let mut positions = Vec::with_capacity(events.len());
            let mut next = 0usize;
            let end = std::iter::once(events.len()..events.len());
            for group in groups.iter().cloned().chain(end) {
                for (index, seq) in (next..group.start).zip(first_seq + widen(next)..) {
                    let start = out.len();
                    record_at(index, seq).encode(out, context.salt)?;
                    positions.push(framed_at(context, out, start, 1)?);
                }
                if !group.is_empty() {
                    let start = out.len();
                    encode_row_frame(&records[group.clone()], out, context.salt)?;
                    let count = checked_count_u32(group.len(), "row entry", "events")?;
                    positions.push(framed_at(context, out, start, count)?);
                }
                next = group.end;
            }
            let count = checked_count_u32(events.len(), "batch", "events")?;
            encode_commit(context, out, number, first_seq, count)?;
            Ok(positions)
        });
        let (submitted, positions) = match submitted {
            Ok(submitted) => submitted,
            Err(error) => {
                if let Some(first) = first_new_type {
                    inner.catalog.write().forget_types_from(first);
                }
                return Err(error);
            }
        };
        if let Some(entry) = inner.catalog.write().sessions.get_mut(&number) {
            for (position, count) in positions {
                entry.events.push_frames(position, count);
            }
            entry.defined_in.get_or_insert(submitted.segment);
        }
        if self.is_shared() {
            // Held open from now on: another process may seal the segment and remove its
            // name before this one reads it (F-08-18); it cannot before this batch is
            // indexed (this process holds the tail until then).
            self.segment_file(submitted.segment)?;
        }
        Ok(PendingReceipt {
            store: self.clone(),
            ticket: submitted.ticket,
            first_seq,
            end_seq: first_seq + events.len() as u64,
            durability,
        })
    }
}

#[cfg(test)]
mod parsed_batch_tests {
    use super::*;

    #[test]
    fn a_renewed_batch_is_empty_and_keeps_its_room() {
        let texts: Vec<String> = (0..100).map(|number| number.to_string()).collect();
        let mut batch = ParsedBatch::default();
        for text in &texts {
            batch.push(ParsedEvent::built("t", 1, (text, 0), "", 0));
        }
        let room = batch.events.capacity();
        assert!(room >= 100);
        let renewed: ParsedBatch<'static> = batch.renewed();
        assert!(renewed.events.is_empty() && renewed.depths.is_empty());
        assert_eq!(renewed.events.capacity(), room);
    }
}
