//! The `model` fuzz target's many-process mode (format-spec/08-many-processes.md): a
//! script of appends, lease hand-overs, refreshes, followers, maintenance, deletions and
//! kills across N shared-mode stores on one simulated disk (each store on its own
//! [`SimProcess`] is one process), then a power cut.
//!
//! Checked while the processes run: a lease is exclusive (a second writer is refused with
//! `SessionBusy` naming the pid exactly while another live process holds the session, and
//! granted otherwise), a refreshed process sees every acknowledged event of every process
//! and nothing but whole batches someone tried, a follower delivers seqs in order, each
//! once, and at the end every acknowledged event, and a live process never fails because
//! another one died. Checked after the power cut, on every image it leaves: every
//! acknowledged event survives, nothing unacknowledged appears except whole batches a
//! process tried, an acknowledged delete stays done, every event a follower delivered is
//! there, and the same after the recovered store seals everything.
//!
//! Script: `[MODEL_PROCESSES, cut, processes, (action, argument)*]`.

use super::FUZZ_SEGMENT_BYTES;
use crate::error::Error;
use crate::storage::commit::Durability;
use crate::storage::io::sim::{CrashImage, SimStorage};
use crate::storage::io::sim_process::SimProcess;
use crate::storage::io::Storage;
use crate::store::{NewEvent, Options, SessionWriter, Store, Subscription};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// First script byte that selects this mode of [`super::check_model`].
pub const MODEL_PROCESSES: u8 = 0xFE;
/// Processes of a script: `MIN_PROCESSES + (byte % PROCESS_CHOICES)`.
const MIN_PROCESSES: usize = 2;
const PROCESS_CHOICES: u8 = 3;
/// Steps read of one script (two bytes each); the rest is ignored, so that one input
/// stays fast (a fuzz run executes it thousands of times).
const MAX_STEPS: usize = 96;
/// A cut byte that arms no power cut: the script ends with the processes closing.
const NO_POWER_CUT: u8 = 0xFF;
/// Disk operations per unit of the cut byte (a script runs several hundred).
const CUT_OPERATIONS_PER_UNIT: u64 = 2;
/// Sessions the script writes. The first `FOLLOWED_SESSIONS` are followed and never
/// deleted; the others are deleted and created again.
const SESSIONS: usize = 4;
const FOLLOWED_SESSIONS: usize = 2;
/// Events one follow step drains at most (more than a script can append).
const MAX_FOLLOW_EVENTS: usize = 4096;
/// Script actions (`action % ACTIONS`; the process is `action / ACTIONS`); the others
/// append. The session is `argument % SESSIONS`; an append with `RELEASE_AFTER_APPEND`
/// set in its argument gives the writer (and the lease) back after the batch.
const ACTIONS: u8 = 16;
const ACTION_RELEASE: u8 = 8;
const ACTION_REFRESH: [u8; 2] = [9, 10];
const ACTION_FOLLOW: [u8; 2] = [11, 12];
const ACTION_MAINTAIN: u8 = 13;
const ACTION_DELETE: u8 = 14;
const ACTION_KILL: u8 = 15;
const RELEASE_AFTER_APPEND: u8 = 0x80;
/// Largest number of a process's operations an armed kill waits for.
const MAX_KILL_DELAY: u8 = 16;

/// One batch a process tried to append.
struct Batch {
    texts: Vec<String>,
    acknowledged: bool,
}

/// What the script knows of one session.
#[derive(Default)]
struct SessionModel {
    /// Batches tried since the session was last (acknowledged) deleted, in order.
    batches: Vec<Batch>,
    /// Acknowledged deleted and not created again.
    deleted: bool,
    /// A delete of unknown outcome (its process died): nothing is checked any more.
    unknown: bool,
    /// The process holding its writer (and so its lease).
    holder: Option<usize>,
}

/// What one subscription delivered: the session and the events, in delivery order.
struct Delivery {
    session: usize,
    events: Vec<(u64, String)>,
}

/// One live simulated process and what it holds.
struct Process {
    life: SimProcess,
    store: Store,
    writers: BTreeMap<usize, SessionWriter>,
    /// The subscription it follows with, and its index in `Model::deliveries`.
    follower: Option<(usize, Subscription)>,
}

/// Whether the script goes on.
enum Flow {
    Continue,
    /// The power cut happened: every process is gone.
    Stop,
}

/// What a script did, for the test that the committed seeds exercise each part.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Tally {
    acknowledged_batches: u64,
    busy_refusals: u64,
    kills: u64,
    restarts: u64,
    delivered_events: u64,
    deletes: u64,
    images_checked: u64,
    /// Segments sealed and runs rewritten by maintenance beside other processes (F-08-16).
    segments_sealed: u64,
    runs_rewritten: u64,
}

struct Model {
    tally: Tally,
    disk: SimStorage,
    processes: Vec<Option<Process>>,
    sessions: Vec<SessionModel>,
    deliveries: Vec<Delivery>,
}

fn options() -> Options {
    Options {
        shared: true,
        shared_maintenance: true,
        segment_bytes: FUZZ_SEGMENT_BYTES,
        durability: Durability::Sync,
        // Checkpoints only at the script's maintain steps: no background thread, so that a
        // script runs the same every time.
        checkpoint_every_bytes: None,
        ..Options::default()
    }
}

fn session_id(session: usize) -> String {
    format!("p{session}")
}

fn open_store(storage: Arc<dyn Storage>, options: Options) -> crate::Result<Store> {
    Store::open_on(storage, options, Path::new("model-processes"))
}

/// Many-process model check (see the module documentation).
pub(super) fn check_model_processes(script: &[u8]) -> Tally {
    let [cut, processes, steps @ ..] = script else {
        return Tally::default();
    };
    let count = MIN_PROCESSES + usize::from(processes % PROCESS_CHOICES);
    let disk = SimStorage::new();
    let mut model = Model {
        tally: Tally::default(),
        disk: disk.clone(),
        processes: (0..count).map(|_| None).collect(),
        sessions: (0..SESSIONS).map(|_| SessionModel::default()).collect(),
        deliveries: Vec::new(),
    };
    for slot in 0..count {
        if let Flow::Stop = model.start(slot) {
            return model.tally;
        }
    }
    if *cut != NO_POWER_CUT {
        disk.crash_at(disk.operation_count() + u64::from(*cut) * CUT_OPERATIONS_PER_UNIT);
    }
    let mut ran = Flow::Continue;
    for (step, pair) in steps.chunks_exact(2).take(MAX_STEPS).enumerate() {
        ran = model.step(step, pair[0], pair[1]);
        if let Flow::Stop = ran {
            break;
        }
    }
    if let Flow::Continue = ran {
        model.finish();
    }
    model.shut_down();
    let images = match disk.take_images() {
        images if images.is_empty() => vec![disk.durable_image()],
        images => images,
    };
    for image in &images {
        model.check_image(image);
        model.tally.images_checked += 1;
    }
    model.tally
}

impl Model {
    /// Opens process `slot` (again, after a kill); joining the live ones.
    fn start(&mut self, slot: usize) -> Flow {
        let life = SimProcess::new(&self.disk);
        match open_store(Arc::new(life.clone()), options()) {
            Ok(store) => {
                self.tally.restarts += 1;
                self.processes[slot] = Some(Process {
                    life,
                    store,
                    writers: BTreeMap::new(),
                    follower: None,
                });
                Flow::Continue
            }
            Err(_) if self.disk.crashed() => Flow::Stop,
            Err(error) => panic!("process {slot} could not join the live ones: {error}"),
        }
    }

    /// Drops process `slot` as its death does: no close, its handles gone.
    fn bury(&mut self, slot: usize) {
        if let Some(mut process) = self.processes[slot].take() {
            process.life.kill();
            process.follower = None;
            process.writers.clear();
        }
        for session in &mut self.sessions {
            if session.holder == Some(slot) {
                session.holder = None;
            }
        }
    }

    /// An operation of process `slot` failed: fine when it died (it is restarted) or the
    /// power cut came; a violation when a live process fails.
    fn failed(&mut self, slot: usize, what: &str, error: &Error) -> Flow {
        if self.disk.crashed() {
            return Flow::Stop;
        }
        let dead = self.processes[slot]
            .as_ref()
            .is_none_or(|process| process.life.is_dead());
        assert!(dead, "{what} failed in live process {slot}: {error}");
        self.tally.kills += 1;
        self.bury(slot);
        self.start(slot)
    }

    fn process(&self, slot: usize) -> &Process {
        self.processes[slot]
            .as_ref()
            .expect("every slot holds a process while the script runs")
    }

    fn process_mut(&mut self, slot: usize) -> &mut Process {
        self.processes[slot]
            .as_mut()
            .expect("every slot holds a process while the script runs")
    }

    fn step(&mut self, step: usize, action: u8, argument: u8) -> Flow {
        let slot = usize::from(action / ACTIONS) % self.processes.len();
        let session = usize::from(argument) % SESSIONS;
        if self.process(slot).life.is_dead() {
            // An armed kill struck between steps (a writer handle's drop, say).
            self.bury(slot);
            if let Flow::Stop = self.start(slot) {
                return Flow::Stop;
            }
        }
        match action % ACTIONS {
            ACTION_RELEASE => {
                self.release(slot, session);
                Flow::Continue
            }
            kind if ACTION_REFRESH.contains(&kind) => self.refresh(slot),
            kind if ACTION_FOLLOW.contains(&kind) => self.follow(slot, session % FOLLOWED_SESSIONS),
            ACTION_MAINTAIN => self.maintain(slot),
            ACTION_DELETE => {
                let deletable = FOLLOWED_SESSIONS + session % (SESSIONS - FOLLOWED_SESSIONS);
                self.delete(slot, deletable)
            }
            ACTION_KILL => self.kill(slot, argument),
            _ => self.append(slot, session, step, argument),
        }
    }

    fn release(&mut self, slot: usize, session: usize) {
        if self.process_mut(slot).writers.remove(&session).is_some() {
            self.sessions[session].holder = None;
        }
    }

    /// Takes a writer of `session` in process `slot`, checking that the lease is exclusive.
    /// `Ok(false)`: refused as busy, as it must be.
    fn take_writer(&mut self, slot: usize, session: usize) -> Result<bool, Error> {
        let id = session_id(session);
        let store = &self.process(slot).store;
        let opened = match store.writer(&id) {
            Err(Error::UnknownSession { .. }) => store.create_session_with_id(&id),
            other => other,
        };
        let other = self.sessions[session]
            .holder
            .filter(|holder| *holder != slot);
        match (opened, other) {
            (Ok(writer), None) => {
                self.process_mut(slot).writers.insert(session, writer);
                let model = &mut self.sessions[session];
                model.holder = Some(slot);
                model.deleted = false;
                Ok(true)
            }
            (Ok(_), Some(holder)) => {
                panic!("process {slot} got a writer of {id} that process {holder} holds")
            }
            (Err(Error::SessionBusy { id: busy, pid }), Some(_)) => {
                assert_eq!(busy, id, "SessionBusy names the session");
                assert_eq!(
                    pid,
                    Some(std::process::id()),
                    "SessionBusy names the holder"
                );
                self.tally.busy_refusals += 1;
                Ok(false)
            }
            (Err(Error::SessionBusy { .. }), None) => {
                panic!("{id} is busy for process {slot} though no live process holds it")
            }
            (Err(error), _) => Err(error),
        }
    }

    fn append(&mut self, slot: usize, session: usize, step: usize, argument: u8) -> Flow {
        if !self.process(slot).writers.contains_key(&session) {
            match self.take_writer(slot, session) {
                Ok(true) => {}
                Ok(false) => return Flow::Continue,
                Err(error) => return self.failed(slot, "taking a writer", &error),
            }
        }
        let count = usize::from(argument / 4 % 3) + 1;
        let texts: Vec<String> = (0..count)
            .map(|index| {
                format!(
                    "{{\"step\":{step},\"i\":{index},\"pad\":\"{}\"}}",
                    "q".repeat(usize::from(argument))
                )
            })
            .collect();
        let events: Vec<NewEvent<'_>> = texts
            .iter()
            .map(|text| NewEvent::new("assistant/chunk", text))
            .collect();
        let outcome = self
            .process_mut(slot)
            .writers
            .get_mut(&session)
            .map(|writer| writer.append_batch(&events));
        let model = &mut self.sessions[session];
        model.batches.push(Batch {
            texts: texts.clone(),
            acknowledged: false,
        });
        match outcome {
            Some(Ok(_)) => {
                if let Some(batch) = model.batches.last_mut() {
                    batch.acknowledged = true;
                }
                self.tally.acknowledged_batches += 1;
                if argument & RELEASE_AFTER_APPEND != 0 {
                    self.release(slot, session);
                }
                Flow::Continue
            }
            Some(Err(error)) => self.failed(slot, "an append", &error),
            None => Flow::Continue,
        }
    }

    /// Refreshes process `slot` and checks that it sees every acknowledged event.
    fn refresh(&mut self, slot: usize) -> Flow {
        if let Err(error) = self.process(slot).store.refresh() {
            return self.failed(slot, "a refresh", &error);
        }
        for session in 0..SESSIONS {
            let read = read_session(&self.process(slot).store, session);
            match read {
                Ok(events) => {
                    if let Err(violation) = self.check_session(session, events.as_deref()) {
                        panic!("process {slot} after a refresh: {violation}");
                    }
                }
                Err(error) => return self.failed(slot, "a read", &error),
            }
        }
        Flow::Continue
    }

    /// Drains process `slot`'s follower of `session` (starting one from seq 0 if needed).
    fn follow(&mut self, slot: usize, session: usize) -> Flow {
        let following = self
            .process(slot)
            .follower
            .as_ref()
            .is_some_and(|(index, _)| self.deliveries[*index].session == session);
        if !following {
            match self.process(slot).store.subscribe(&session_id(session), 0) {
                Ok(subscription) => {
                    self.deliveries.push(Delivery {
                        session,
                        events: Vec::new(),
                    });
                    let index = self.deliveries.len() - 1;
                    self.process_mut(slot).follower = Some((index, subscription));
                }
                Err(error) => return self.failed(slot, "a subscribe", &error),
            }
        }
        match self.drain(slot) {
            Ok(()) => Flow::Continue,
            Err(error) => self.failed(slot, "a follow", &error),
        }
    }

    /// Takes what process `slot`'s follower delivers now; each seq once, in order.
    fn drain(&mut self, slot: usize) -> Result<(), Error> {
        let Some(Some(Process {
            follower: Some((index, subscription)),
            ..
        })) = self.processes.get_mut(slot)
        else {
            return Ok(());
        };
        let delivery = &mut self.deliveries[*index];
        for _ in 0..MAX_FOLLOW_EVENTS {
            match subscription.next_timeout(Duration::ZERO)? {
                Some(event) => {
                    let expected = delivery.events.len() as u64;
                    assert_eq!(
                        event.seq, expected,
                        "a follower of {} delivered seq {} where {expected} was next",
                        delivery.session, event.seq
                    );
                    delivery.events.push((event.seq, event.data));
                    self.tally.delivered_events += 1;
                }
                None => return Ok(()),
            }
        }
        panic!("a follower delivered more than {MAX_FOLLOW_EVENTS} events in one step")
    }

    fn maintain(&mut self, slot: usize) -> Flow {
        let store = &self.process(slot).store;
        match store
            .maintain()
            .and_then(|report| Ok((report, store.checkpoint()?)))
        {
            Ok((report, _)) => {
                self.tally.segments_sealed += report.segments_sealed as u64;
                self.tally.runs_rewritten += report.runs_rewritten as u64;
                Flow::Continue
            }
            Err(error) => self.failed(slot, "maintenance", &error),
        }
    }

    fn delete(&mut self, slot: usize, session: usize) -> Flow {
        self.release(slot, session);
        let id = session_id(session);
        let other = self.sessions[session].holder;
        let outcome = self.process(slot).store.delete_session(&id);
        let model = &mut self.sessions[session];
        match (outcome, other) {
            (Ok(()), None) => {
                model.batches.clear();
                model.deleted = true;
                self.tally.deletes += 1;
                Flow::Continue
            }
            (Ok(()), Some(holder)) => {
                panic!("process {slot} deleted {id} while process {holder} writes it")
            }
            (Err(Error::SessionBusy { .. }), Some(_)) => Flow::Continue,
            (Err(Error::SessionBusy { .. }), None) => {
                panic!("deleting {id} is busy though no live process holds it")
            }
            (Err(Error::UnknownSession { .. }), _) => {
                assert!(
                    model.unknown || !model.batches.iter().any(|batch| batch.acknowledged),
                    "process {slot} does not know {id}, which holds acknowledged events"
                );
                Flow::Continue
            }
            (Err(error), _) => {
                model.unknown = true;
                self.failed(slot, "a delete", &error)
            }
        }
    }

    /// Kills process `slot` now and restarts it, or arms its death at one of its next
    /// operations (whose failure then restarts it).
    fn kill(&mut self, slot: usize, argument: u8) -> Flow {
        if argument.is_multiple_of(2) {
            self.tally.kills += 1;
            self.bury(slot);
            return self.start(slot);
        }
        let after = u64::from((argument >> 1) % MAX_KILL_DELAY);
        let landed_sectors = u64::from(argument >> 5);
        self.process(slot).life.kill_at(after, landed_sectors);
        Flow::Continue
    }

    /// The script ran to its end: every process sees everything, every follower delivered
    /// every acknowledged event, and the processes close.
    fn finish(&mut self) {
        for slot in 0..self.processes.len() {
            if self.process(slot).life.is_dead() {
                self.bury(slot);
                if let Flow::Stop = self.start(slot) {
                    return;
                }
            }
            if let Flow::Stop = self.refresh(slot) {
                return;
            }
            let following = self.process(slot).follower.is_some();
            if following {
                if let Err(error) = self.drain(slot) {
                    if let Flow::Stop = self.failed(slot, "a follow", &error) {
                        return;
                    }
                    continue;
                }
                self.check_follower_caught_up(slot);
            }
        }
        for slot in 0..self.processes.len() {
            let Some(mut process) = self.processes[slot].take() else {
                continue;
            };
            process.follower = None;
            process.writers.clear();
            let closed = process.store.close();
            if let Err(error) = closed {
                assert!(
                    self.disk.crashed() || process.life.is_dead(),
                    "closing live process {slot} failed: {error}"
                );
            }
        }
    }

    /// A follower that drained after the last append delivered every acknowledged event
    /// of its session (they are durable: every append is `Sync`).
    fn check_follower_caught_up(&self, slot: usize) {
        let Some((index, _)) = &self.process(slot).follower else {
            return;
        };
        let delivery = &self.deliveries[*index];
        let acknowledged: usize = self.sessions[delivery.session]
            .batches
            .iter()
            .filter(|batch| batch.acknowledged)
            .map(|batch| batch.texts.len())
            .sum();
        assert!(
            delivery.events.len() >= acknowledged,
            "process {slot}'s follower of {} delivered {} events, {acknowledged} acknowledged",
            session_id(delivery.session),
            delivery.events.len()
        );
    }

    /// Drops every process without a close (the power cut, or after `finish`).
    fn shut_down(&mut self) {
        for slot in 0..self.processes.len() {
            self.bury(slot);
        }
    }

    /// Events of `session` as read: every batch present whole or not at all, in order;
    /// every acknowledged batch present; nothing else. `None`: the session is unknown.
    fn check_session(
        &self,
        session: usize,
        events: Option<&[(u64, String)]>,
    ) -> Result<(), String> {
        let model = &self.sessions[session];
        let id = session_id(session);
        if model.unknown {
            return Ok(());
        }
        let events = events.unwrap_or_default();
        if model.deleted && model.batches.is_empty() && !events.is_empty() {
            return Err(format!(
                "{id} was deleted, yet holds {} events",
                events.len()
            ));
        }
        for (index, (seq, _)) in events.iter().enumerate() {
            if *seq != index as u64 {
                return Err(format!("{id} holds seq {seq} at position {index}"));
            }
        }
        let mut at = 0;
        for (number, batch) in model.batches.iter().enumerate() {
            let present = events
                .get(at)
                .is_some_and(|(_, text)| *text == batch.texts[0]);
            if present {
                for text in &batch.texts {
                    if events.get(at).map(|(_, read)| read) != Some(text) {
                        return Err(format!("{id}: batch {number} is there only in part"));
                    }
                    at += 1;
                }
            } else if batch.acknowledged {
                return Err(format!("{id}: acknowledged batch {number} is lost"));
            }
        }
        if at != events.len() {
            return Err(format!(
                "{id}: {} events after {at} that no batch wrote there",
                events.len() - at
            ));
        }
        Ok(())
    }

    /// Every delivered event is in the recovered store: a follower never saw what a
    /// crash took back.
    fn check_deliveries(&self, store: &Store, label: &str) {
        for delivery in &self.deliveries {
            let events = read_session(store, delivery.session)
                .unwrap_or_else(|error| panic!("{label}: read: {error}"))
                .unwrap_or_default();
            for (seq, text) in &delivery.events {
                let stored = usize::try_from(*seq)
                    .ok()
                    .and_then(|index| events.get(index));
                assert!(
                    stored.is_some_and(|(_, stored)| stored == text),
                    "{label}: {} seq {seq} a follower delivered is lost",
                    session_id(delivery.session)
                );
            }
        }
    }

    fn check_sessions(&self, store: &Store, label: &str) {
        for session in 0..SESSIONS {
            let events = read_session(store, session)
                .unwrap_or_else(|error| panic!("{label}: read: {error}"));
            if let Err(violation) = self.check_session(session, events.as_deref()) {
                panic!("{label}: {violation}");
            }
        }
    }

    /// One image the power cut left: opened by a first process alone (recovery with its
    /// repairs), checked, closed, then opened exclusively, sealed into runs and checked.
    fn check_image(&self, image: &CrashImage) {
        let label = &image.label;
        let disk = SimStorage::from_image(image);
        let store = open_store(Arc::new(disk.clone()), options())
            .unwrap_or_else(|error| panic!("{label}: the store opens after the cut: {error}"));
        self.check_sessions(&store, label);
        self.check_deliveries(&store, label);
        store
            .close()
            .unwrap_or_else(|error| panic!("{label}: close: {error}"));
        drop(store);
        let exclusive = Options {
            shared: false,
            ..options()
        };
        let store = open_store(Arc::new(disk), exclusive)
            .unwrap_or_else(|error| panic!("{label}: exclusive reopen: {error}"));
        store
            .maintain()
            .unwrap_or_else(|error| panic!("{label}: the recovered store seals: {error}"));
        self.check_sessions(&store, label);
    }
}

/// The events of `session` as (seq, data); `None` when the store does not know it.
fn read_session(store: &Store, session: usize) -> Result<Option<Vec<(u64, String)>>, Error> {
    match store.read(&session_id(session), 0, u64::MAX) {
        Ok(events) => Ok(Some(
            events
                .into_iter()
                .map(|event| (event.seq, event.data))
                .collect(),
        )),
        Err(Error::UnknownSession { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed_seed(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/model")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    /// The committed many-process seeds do what the model claims to check: acknowledged
    /// appends, busy leases, kills and restarts, followers, deletes, and crash images.
    #[test]
    fn the_committed_process_seeds_exercise_every_action() {
        let mut total = Tally::default();
        for number in 0..8 {
            let seed = committed_seed(&format!("processes-{number:02}.bin"));
            let started = std::time::Instant::now();
            let tally = check_model_processes(&seed[1..]);
            eprintln!(
                "processes-{number:02}: {tally:?} in {:?}",
                started.elapsed()
            );
            total.acknowledged_batches += tally.acknowledged_batches;
            total.busy_refusals += tally.busy_refusals;
            total.kills += tally.kills;
            total.restarts += tally.restarts;
            total.delivered_events += tally.delivered_events;
            total.deletes += tally.deletes;
            total.images_checked += tally.images_checked;
            total.segments_sealed += tally.segments_sealed;
            total.runs_rewritten += tally.runs_rewritten;
        }
        assert!(total.acknowledged_batches > 100, "{total:?}");
        assert!(total.busy_refusals > 0, "{total:?}");
        assert!(total.kills >= 8, "{total:?}");
        assert!(total.delivered_events > 0, "{total:?}");
        assert!(total.deletes > 0, "{total:?}");
        assert!(total.images_checked > 8, "{total:?}");
        assert!(total.segments_sealed > 0, "{total:?}");
    }
}
