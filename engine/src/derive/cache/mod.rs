//! The checkpointed projection cache (format-spec/07-cache-and-spill.md, F-07-1..F-07-9).
//!
//! The log leads, the cache follows: a checkpoint `{unit, state version, seq, state}` is
//! written only for durable events, and a cold read loads the newest valid checkpoint of
//! each unit and folds only the tail of the log. A checkpoint that is missing, of another
//! state version, of another session (identity), ahead of the log, not anchored on the
//! log's event before its seq, or damaged anywhere (checksum) is discarded and the state is
//! rebuilt from the log: the cache is never a second source of truth and never stops the
//! store from opening or a read from answering.

// Format code: a value that does not fit its field is a typed error, never a silent `as`
// narrowing (the lossless widenings live in `storage::coding`). Unit tests may index their
// own buffers with `as`.
#![cfg_attr(
    not(test),
    deny(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )
)]

mod file;

pub use file::{
    checkpoint_file_name, decode_checkpoint, encode_checkpoint, session_cache_dir, Checkpoint,
    CACHE_DIR, CHECKPOINT_FORMAT_VERSION, CHECKPOINT_MAGIC, MAX_CHECKPOINT_BYTES,
};

use crate::derive::projection::{
    session_event, MessagesState, MessagesUnit, ProjectionUnit, SessionStats, StatsUnit,
    SurfaceUnit, TokenMeterState, TokenMeterUnit, TurnIndex, TurnIndexUnit,
};
use crate::error::{Error, Result};
use crate::session::{SessionEvent, SurfaceFold};
use crate::store::{Event, Receipt, Store};
use file::{anchor_of, identity_of};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::limits::EVENTS_PER_READ;

pub use crate::limits::DEFAULT_CHECKPOINT_EVERY_EVENTS;

/// How the cache writes checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// Write a checkpoint once this many events were folded past the last one (and at
    /// every `turn/end` seen live).
    pub every_events: u64,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            every_events: DEFAULT_CHECKPOINT_EVERY_EVENTS,
        }
    }
}

/// What a cold read did, per unit, for tests and tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Per unit: the seq of the checkpoint it started from (`None`: folded from seq 0).
    pub started_from: Vec<(String, Option<u64>)>,
    /// Checkpoint files found unusable and discarded.
    pub discarded: usize,
    /// Events folded from the log.
    pub folded_events: u64,
    /// Whether fresh checkpoints were written back.
    pub written: bool,
}

/// A unit, its state and how far it has folded: the cache's view of one unit.
trait Cell {
    fn name(&self) -> String;
    fn state_version(&self) -> u32;
    fn next_seq(&self) -> u64;
    fn restore(&mut self, seq: u64, state: &[u8]) -> Result<()>;
    fn reset(&mut self);
    fn apply(&mut self, event: &SessionEvent) -> Result<()>;
    fn encode(&self) -> Result<Vec<u8>>;
    /// The anchor recorded by the checkpoint the cell was restored from.
    fn anchor_hint(&self) -> Option<[u8; 32]>;
    fn set_anchor_hint(&mut self, anchor: [u8; 32]);
}

struct UnitCell<'unit, U: ProjectionUnit> {
    unit: &'unit U,
    state: U::State,
    next_seq: u64,
    anchor: Option<[u8; 32]>,
}

impl<'unit, U: ProjectionUnit> UnitCell<'unit, U> {
    fn new(unit: &'unit U) -> Self {
        Self {
            unit,
            state: unit.init(),
            next_seq: 0,
            anchor: None,
        }
    }
}

impl<U: ProjectionUnit> Cell for UnitCell<'_, U> {
    fn name(&self) -> String {
        self.unit.name()
    }
    fn state_version(&self) -> u32 {
        self.unit.state_version()
    }
    fn next_seq(&self) -> u64 {
        self.next_seq
    }
    fn restore(&mut self, seq: u64, state: &[u8]) -> Result<()> {
        self.state = self.unit.decode(state)?;
        self.next_seq = seq;
        Ok(())
    }
    fn reset(&mut self) {
        self.state = self.unit.init();
        self.next_seq = 0;
        self.anchor = None;
    }
    fn apply(&mut self, event: &SessionEvent) -> Result<()> {
        self.unit.apply(&mut self.state, event)?;
        self.next_seq = event.seq + 1;
        Ok(())
    }
    fn encode(&self) -> Result<Vec<u8>> {
        self.unit.encode(&self.state)
    }
    fn anchor_hint(&self) -> Option<[u8; 32]> {
        self.anchor
    }
    fn set_anchor_hint(&mut self, anchor: [u8; 32]) {
        self.anchor = Some(anchor);
    }
}

/// The built-in projections of one session at one cut.
#[derive(Debug, Clone)]
pub struct Builtins {
    /// Events folded: the session's length at the cut.
    pub length: u64,
    pub surface: SurfaceFold,
    pub messages: MessagesState,
    pub tokens: TokenMeterState,
    pub stats: SessionStats,
    pub turns: TurnIndex,
}

/// The built-in units, configured (the token meter's encoding).
#[derive(Debug, Clone, Default)]
pub struct BuiltinUnits {
    pub surface: SurfaceUnit,
    pub messages: MessagesUnit,
    pub tokens: TokenMeterUnit,
    pub stats: StatsUnit,
    pub turns: TurnIndexUnit,
}

/// The projection cache of one store.
#[derive(Clone)]
pub struct ProjectionCache {
    store: Store,
    options: CacheOptions,
    units: BuiltinUnits,
    /// Live write policy per session: seq covered by the last checkpoint written here and
    /// whether a `turn/end` was appended since.
    live: Arc<Mutex<HashMap<String, LiveMark>>>,
    /// Serializes checkpoint writes of this cache (they share temp file names).
    write_lock: Arc<Mutex<()>>,
}

#[derive(Debug, Clone, Copy, Default)]
struct LiveMark {
    checkpoint_seq: u64,
    turn_end_pending: bool,
}

/// After a `turn/end` a live session's checkpoints are written (F-07-8).
use crate::session::TURN_END;

impl ProjectionCache {
    pub fn new(store: &Store, options: CacheOptions) -> Self {
        Self::with_units(store, options, BuiltinUnits::default())
    }

    /// A cache whose built-in units are configured by the caller (e.g. the token encoding).
    pub fn with_units(store: &Store, options: CacheOptions, units: BuiltinUnits) -> Self {
        Self {
            store: store.clone(),
            options,
            units,
            live: Arc::default(),
            write_lock: Arc::default(),
        }
    }

    /// The live write policy (F-07-8): call after each append to `session` with its receipt
    /// and the appended event types. Once the appended events are durable and a `turn/end`
    /// was appended or `every_events` events accumulated since the last checkpoint, the
    /// built-in units are brought up to date (folding only the tail) and checkpointed.
    /// Returns whether checkpoints were written.
    pub fn note_appended(
        &self,
        session: &str,
        receipt: &Receipt,
        appended_types: &[&str],
    ) -> Result<bool> {
        let due = {
            let mut live = self.live.lock();
            let mark = live.entry(session.to_owned()).or_default();
            mark.turn_end_pending |= appended_types.contains(&TURN_END);
            let accumulated = receipt.end_seq.saturating_sub(mark.checkpoint_seq);
            receipt.durable
                && (mark.turn_end_pending || accumulated >= self.options.every_events.max(1))
        };
        if !due {
            return Ok(false);
        }
        let (_, report) = self.read_builtins_with(session, true)?;
        let mut live = self.live.lock();
        let mark = live.entry(session.to_owned()).or_default();
        mark.checkpoint_seq = receipt.end_seq;
        mark.turn_end_pending = false;
        Ok(report.written)
    }

    /// The store the cache follows.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn units(&self) -> &BuiltinUnits {
        &self.units
    }

    /// Cold read of one unit: newest valid checkpoint + fold of the tail.
    pub fn read<U: ProjectionUnit>(
        &self,
        session: &str,
        unit: &U,
    ) -> Result<(U::State, ReadReport)> {
        let mut cell = UnitCell::new(unit);
        let report = self.cold_read(session, false, &mut [&mut cell])?;
        Ok((cell.state, report))
    }

    /// Cold read of what a resume needs first: the surface and its token count.
    pub fn read_surface_and_tokens(
        &self,
        session: &str,
    ) -> Result<(SurfaceFold, TokenMeterState, ReadReport)> {
        let mut surface = UnitCell::new(&self.units.surface);
        let mut tokens = UnitCell::new(&self.units.tokens);
        let report = self.cold_read(session, false, &mut [&mut surface, &mut tokens])?;
        Ok((surface.state, tokens.state, report))
    }

    /// Cold read of every built-in unit with one read of the tail.
    pub fn read_builtins(&self, session: &str) -> Result<(Builtins, ReadReport)> {
        self.read_builtins_with(session, false)
    }

    fn read_builtins_with(&self, session: &str, force: bool) -> Result<(Builtins, ReadReport)> {
        let units = &self.units;
        let mut surface = UnitCell::new(&units.surface);
        let mut messages = UnitCell::new(&units.messages);
        let mut tokens = UnitCell::new(&units.tokens);
        let mut stats = UnitCell::new(&units.stats);
        let mut turns = UnitCell::new(&units.turns);
        let report = self.cold_read(
            session,
            force,
            &mut [
                &mut surface,
                &mut messages,
                &mut tokens,
                &mut stats,
                &mut turns,
            ],
        )?;
        let builtins = Builtins {
            length: stats.next_seq,
            surface: surface.state,
            messages: messages.state,
            tokens: tokens.state,
            stats: stats.state,
            turns: turns.state,
        };
        Ok((builtins, report))
    }

    fn cold_read(
        &self,
        session: &str,
        force: bool,
        cells: &mut [&mut dyn Cell],
    ) -> Result<ReadReport> {
        let summary = self.store.session(session)?;
        let identity = identity_of(session, &summary.header_json);
        let length = summary.events;
        let mut report = ReadReport::default();
        for cell in cells.iter_mut() {
            self.load_newest(session, &identity, length, &mut **cell, &mut report)?;
        }
        self.check_anchors(session, cells, &mut report)?;
        report.started_from = cells
            .iter()
            .map(|cell| (cell.name(), Some(cell.next_seq()).filter(|seq| *seq > 0)))
            .collect();
        let floor = floor_of(cells);
        report.folded_events = length - floor;
        let mut last = None;
        let mut from = floor;
        while from < length {
            // Bounded chunks: a long tail is never held in memory at once.
            let to = length.min(from + EVENTS_PER_READ);
            let events = self.store.read(session, from, to)?;
            fold_tail(session, cells, &events)?;
            last = events.last().cloned().or(last);
            from = to;
        }
        if self.should_write(force, report.folded_events, report.discarded) {
            report.written = self.write_all(session, &identity, cells, last.as_ref())?;
        }
        Ok(report)
    }

    fn should_write(&self, force: bool, folded: u64, discarded: usize) -> bool {
        !self.store.is_read_only()
            && folded > 0
            && (force || folded >= self.options.every_events.max(1) || discarded > 0)
    }

    /// Restores `cell` from its newest usable checkpoint; discards unusable ones.
    fn load_newest(
        &self,
        session: &str,
        identity: &[u8; 32],
        length: u64,
        cell: &mut dyn Cell,
        report: &mut ReadReport,
    ) -> Result<()> {
        let storage = self.store.storage();
        let dir = session_cache_dir(session);
        let names = storage.list(&dir).unwrap_or_default();
        let mut candidates: Vec<(u64, String)> = names
            .into_iter()
            .filter_map(|name| {
                let (unit, version, seq) = file::parse_file_name(&name)?;
                let current = unit == cell.name() && version == cell.state_version();
                if unit == cell.name() && !current {
                    // Another state version of this unit: stale, never migrated.
                    self.discard(&dir, &name, report);
                    return None;
                }
                current.then_some((seq, name))
            })
            .collect();
        candidates.sort_by_key(|candidate| std::cmp::Reverse(candidate.0));
        for (seq, name) in candidates {
            let usable = seq <= length
                && self
                    .load_candidate(&dir, &name, identity, seq, cell)
                    .is_ok();
            if usable {
                return Ok(());
            }
            cell.reset();
            self.discard(&dir, &name, report);
        }
        Ok(())
    }

    fn load_candidate(
        &self,
        dir: &str,
        name: &str,
        identity: &[u8; 32],
        seq: u64,
        cell: &mut dyn Cell,
    ) -> Result<()> {
        let storage = self.store.storage();
        let path = format!("{dir}/{name}");
        let file = storage
            .open_read(&path)
            .map_err(|error| Error::io("cache read", error))?;
        let bytes = read_bounded(file.as_ref())?;
        let checkpoint = decode_checkpoint(&bytes)?;
        let matches = checkpoint.unit == cell.name()
            && checkpoint.state_version == cell.state_version()
            && checkpoint.seq == seq
            && checkpoint.identity == *identity;
        if !matches {
            return Err(file::cache_error(
                &path,
                "names another unit, version or session",
            ));
        }
        cell.restore(checkpoint.seq, checkpoint.state)?;
        cell.set_anchor_hint(checkpoint.anchor);
        Ok(())
    }

    fn discard(&self, dir: &str, name: &str, report: &mut ReadReport) {
        report.discarded += 1;
        if !self.store.is_read_only() {
            // Best effort: a file that cannot be removed is ignored again next time.
            let _ = self.store.storage().remove(&format!("{dir}/{name}"));
        }
    }

    /// Resets every cell whose checkpoint is not anchored on the log's event before its
    /// seq (F-07-4).
    fn check_anchors(
        &self,
        session: &str,
        cells: &mut [&mut dyn Cell],
        report: &mut ReadReport,
    ) -> Result<()> {
        let mut anchors: HashMap<u64, [u8; 32]> = HashMap::new();
        for cell in cells.iter_mut() {
            let Some(anchor_seq) = cell.next_seq().checked_sub(1) else {
                continue;
            };
            let anchor = match anchors.get(&anchor_seq) {
                Some(anchor) => *anchor,
                None => {
                    let anchor = anchor_of(&self.store.get(session, anchor_seq)?);
                    anchors.insert(anchor_seq, anchor);
                    anchor
                }
            };
            if cell.anchor_hint() != Some(anchor) {
                cell.reset();
                report.discarded += 1;
            }
        }
        Ok(())
    }

    fn write_all(
        &self,
        session: &str,
        identity: &[u8; 32],
        cells: &[&mut dyn Cell],
        last: Option<&Event>,
    ) -> Result<bool> {
        let Some(last) = last else {
            return Ok(false);
        };
        let _writing = self.write_lock.lock();
        // The log leads: only durable events may be covered by a checkpoint.
        if self.store.flush().is_err() {
            return Ok(false);
        }
        let anchor = anchor_of(last);
        for cell in cells {
            let state = cell.encode()?;
            let checkpoint = Checkpoint {
                unit: &cell.name(),
                state_version: cell.state_version(),
                seq: last.seq + 1,
                identity: *identity,
                anchor,
                state: &state,
            };
            // Fail-soft: a cache that cannot be written is rebuilt next time.
            if file::write_checkpoint(self.store.storage().as_ref(), session, &checkpoint).is_err()
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

fn floor_of(cells: &[&mut dyn Cell]) -> u64 {
    cells.iter().map(|cell| cell.next_seq()).min().unwrap_or(0)
}

/// Folds each event into every cell that has not seen it yet.
fn fold_tail(session: &str, cells: &mut [&mut dyn Cell], events: &[Event]) -> Result<()> {
    let floor = floor_of(cells);
    for event in events.iter().filter(|event| event.seq >= floor) {
        let parsed = session_event(session, event)?;
        for cell in cells.iter_mut() {
            if cell.next_seq() == event.seq {
                cell.apply(&parsed)
                    .map_err(|error| relabel(session, error))?;
            }
        }
    }
    Ok(())
}

/// Names the session in session-model errors raised inside units.
fn relabel(session: &str, error: Error) -> Error {
    match error {
        Error::SessionModel { source, .. } => Error::SessionModel {
            id: session.to_owned(),
            source,
        },
        other => other,
    }
}

fn read_bounded(file: &dyn crate::storage::io::StorageFile) -> Result<Vec<u8>> {
    let length = file.len().map_err(|error| Error::io("cache read", error))?;
    if length > MAX_CHECKPOINT_BYTES {
        return Err(Error::TooLarge {
            what: "projection checkpoint",
            unit: "bytes",
            size: length,
            limit: MAX_CHECKPOINT_BYTES,
        });
    }
    file.read_all()
        .map_err(|error| Error::io("cache read", error))
}
