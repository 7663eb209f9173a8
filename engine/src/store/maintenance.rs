//! Maintenance and sealing: rewriting sealed segments into runs, reclaiming the events of
//! deleted sessions, moving index positions, seq-index checkpoints, the background thread.
//!
//! A failed pass of the background thread is kept, never dropped: the next `maintain`,
//! `flush` or `close` returns it ([`Error::Maintenance`]) and `stats` counts it and shows the
//! last one.

use super::{io_error, Store};
use crate::error::{Error, Result};
use crate::storage::catalog::Extent;
use crate::storage::commit::{new_salt, start_thread, Log};
use crate::storage::index::{encode_checkpoint, write_checkpoint, CoveredSegment};
use crate::storage::io::Storage;
use crate::storage::manifest::{RunEntry, SegmentEntry};
use crate::storage::multi::lock::{ByteLock, MAINTENANCE_LOCK};
use crate::storage::multi::LockMode;
use crate::storage::run::{
    build_run, holds_dropped_events, rebuild_run, run_path, BuiltRun, Retained, RUNS_DIR,
};
use crate::storage::segment::{check_header, read_segment, segment_path, WAL_DIR};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Name of the background maintenance thread (`dshdb-maintenance`), as
/// [`Error::ThreadStart`] names it.
pub const MAINTENANCE_THREAD: &str = "maintenance";

/// Stops the background maintenance thread, and keeps what its passes failed with.
#[derive(Default)]
pub(super) struct MaintenanceSignal {
    pub(super) stop: Mutex<bool>,
    pub(super) wake: parking_lot::Condvar,
    pub(super) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    failures: Mutex<BackgroundFailures>,
}

/// Failed passes of the background thread.
#[derive(Default)]
struct BackgroundFailures {
    /// The oldest failure no `maintain`, `flush` or `close` has returned yet.
    unreported: Option<Arc<Error>>,
    /// Failed passes since the store was opened.
    count: u64,
    /// The most recent failure.
    last: Option<Arc<Error>>,
}

impl MaintenanceSignal {
    fn record_failure(&self, error: Error) {
        let error = Arc::new(error);
        let mut failures = self.failures.lock();
        failures.count += 1;
        failures.last = Some(error.clone());
        failures.unreported.get_or_insert(error);
    }

    /// Returns the oldest unreported failure, once.
    pub(super) fn take_unreported(&self) -> Result<()> {
        match self.failures.lock().unreported.take() {
            Some(source) => Err(Error::Maintenance { source }),
            None => Ok(()),
        }
    }

    /// How many background passes failed since open, and the last failure's message.
    pub(super) fn failure_summary(&self) -> (u64, Option<String>) {
        let failures = self.failures.lock();
        let last = failures.last.as_ref().map(|error| error.to_string());
        (failures.count, last)
    }
}

/// What one [`Store::maintain`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// Segments rewritten as runs.
    pub segments_sealed: usize,
    /// Events moved into runs.
    pub events: u64,
    /// Bytes of the frames moved (uncompressed).
    pub raw_bytes: u64,
    /// Bytes of the run files written.
    pub run_bytes: u64,
    /// Events of deleted sessions left out of the runs (F-06-24), and their frame bytes:
    /// the space reclaimed from the write-ahead log.
    pub events_dropped: u64,
    pub bytes_reclaimed: u64,
    /// Runs rewritten without the events of deleted sessions (F-06-26); their bytes
    /// reclaimed count in `bytes_reclaimed`.
    pub runs_rewritten: usize,
}

/// A file a new run takes the place of: a sealed segment or a run being rewritten.
pub(super) struct Replaced {
    file: u64,
    path: String,
    dir: &'static str,
}

/// Writes a run file whole and makes it and its directory entry durable (F-06-10 step 2).
/// On failure the file is removed again (best effort; otherwise it is an orphan, F-06-11).
pub(super) fn write_run_file(storage: &dyn Storage, id: u64, bytes: &[u8]) -> Result<()> {
    if !storage.exists(RUNS_DIR).map_err(io_error("runs list"))? {
        storage
            .create_dir(RUNS_DIR)
            .map_err(io_error("runs directory"))?;
        storage.sync_dir("").map_err(io_error("directory sync"))?;
    }
    let path = run_path(id);
    let written = storage
        .open(&path, true)
        .and_then(|file| {
            file.write_at(bytes, 0)?;
            file.sync_data()
        })
        .and_then(|()| storage.sync_dir(RUNS_DIR));
    if let Err(error) = written {
        let _ = storage.remove(&path);
        return Err(Error::io("run write", error));
    }
    Ok(())
}

impl Store {
    /// Starts the thread that runs a maintenance pass every `interval`; fails when the
    /// operating system cannot start it (the store must not open without it).
    pub(super) fn start_maintenance_thread(&self, interval: Duration) -> Result<()> {
        let weak = Arc::downgrade(&self.inner);
        let signal = self.inner.maintenance.clone();
        let thread_signal = signal.clone();
        let handle = start_thread(MAINTENANCE_THREAD, move || loop {
            {
                let mut stop = thread_signal.stop.lock();
                if !*stop {
                    thread_signal.wake.wait_for(&mut stop, interval);
                }
                if *stop {
                    return;
                }
            }
            let Some(inner) = weak.upgrade() else {
                return;
            };
            match (Store { inner }).maintain_pass() {
                // A close racing the pass is no failure.
                Ok(_) | Err(Error::Closed) => {}
                Err(error) => thread_signal.record_failure(error),
            }
        })?;
        *signal.thread.lock() = Some(handle);
        Ok(())
    }

    pub(super) fn stop_maintenance_thread(&self) {
        let signal = &self.inner.maintenance;
        *signal.stop.lock() = true;
        signal.wake.notify_all();
        let handle = signal.thread.lock().take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }

    /// Rewrites every sealed write-ahead segment into a run file (F-06-10), oldest first,
    /// then checkpoints the seq index. Crash-safe at every step: the segment is removed only
    /// after the run file and the manifest naming it are durable.
    ///
    /// When this pass succeeds but an earlier pass of the background thread failed, returns
    /// that failure instead ([`Error::Maintenance`], once).
    pub fn maintain(&self) -> Result<MaintenanceReport> {
        let report = self.maintain_pass()?;
        self.inner.maintenance.take_unreported()?;
        Ok(report)
    }

    /// One maintenance pass (what `maintain` and the background thread run). Damage it finds
    /// in the log makes the writable store refuse further writes (F-05-12).
    fn maintain_pass(&self) -> Result<MaintenanceReport> {
        let outcome = match (self.is_shared(), self.inner.options.shared_maintenance) {
            (true, true) => self.maintain_shared(),
            // Opt-in (`Options::shared_maintenance`): the store is only made usable.
            (true, false) => self.open_log().map(|_| MaintenanceReport::default()),
            (false, _) => self.maintain_log(),
        };
        match &outcome {
            Err(error) => self.note_damage(error),
            // Space the pass freed refills a reserve a full disk used up (F-01-9).
            Ok(_) => super::create::keep_reserve(self.inner.storage.as_ref()),
        }
        outcome
    }

    fn maintain_log(&self) -> Result<MaintenanceReport> {
        let log = self.log()?;
        let mut reclaimed_at = self.inner.maintaining.lock();
        let mut report = MaintenanceReport::default();
        // With only the segment taking appends nothing is sealed, nothing to flush for.
        if log.manifest().segments.len() >= 2 {
            // Makes the seal of every rolled segment durable (it is queued with the roll).
            log.flush()?;
            while let Some(segment) = log.oldest_sealed_segment() {
                let retained = self.inner.catalog.read().retained_prefixes();
                self.seal_segment(log, segment, &retained, &mut report)?;
            }
        }
        // Tombstones are durable before the catalog marks a session deleted, so dropping
        // its sealed events here never outruns its deletion.
        let retained = self.inner.catalog.read().retained_prefixes();
        self.reclaim_runs(log, &mut reclaimed_at, &retained, &mut report)?;
        if report.segments_sealed > 0 || report.runs_rewritten > 0 {
            // Once per maintain, not per segment: the checkpoint covers the whole catalog,
            // and an older one stays valid for the runs it names (F-06-21). Derived data
            // (F-06-22): a failure only costs the next open a replay of runs, but it is
            // reported all the same (the runs and the manifest are durable by now).
            self.write_runs_checkpoint()?;
        }
        Ok(report)
    }

    /// A maintenance pass beside other writer processes (F-08-16): one process at a time,
    /// the one that takes `MAINTENANCE` without waiting (the others skip the pass). It
    /// catches up to the published end under `WRITE` first, so that every event of the
    /// segments before the published tail is in its catalog and every tombstone before it
    /// is known; then it seals those segments oldest first (their seals are durable: a roll
    /// syncs the seal before it publishes the next segment, F-08-8), rewrites the runs
    /// that hold deleted sessions' events, and checkpoints the runs.
    fn maintain_shared(&self) -> Result<MaintenanceReport> {
        let log = self.log()?;
        let Some(processes) = &self.inner.processes else {
            return Ok(MaintenanceReport::default());
        };
        let mut reclaimed_at = self.inner.maintaining.lock();
        let Some(_maintenance) =
            ByteLock::try_take(&processes.file, MAINTENANCE_LOCK, LockMode::Exclusive)
                .map_err(io_error("maintenance lock"))?
        else {
            return Ok(MaintenanceReport::default());
        };
        let published_segment = {
            let _turn = log.pin_tail()?;
            processes.tail.read().segment
        };
        // A batch of this process queued before that read and not yet in the catalog would
        // fail the check that every moved event is indexed in its segment.
        if !self.wait_appends_indexed() || self.behind_replacements()? {
            // This process has not followed another's seal yet (it keeps the tail busy):
            // the next pass, after its next catch-up, does the work.
            return Ok(MaintenanceReport::default());
        }
        // The catch-up applied other processes' tombstones that are published but maybe
        // not durable yet: made durable before any event they delete is dropped, or a power
        // cut could take the tombstone back and leave its session without those events.
        // Tombstones applied after this point are not used by this pass.
        let retained = self.inner.catalog.read().retained_prefixes();
        log.sync_published()?;
        let mut report = MaintenanceReport::default();
        loop {
            let manifest = log.manifest_in_force()?;
            let Some(oldest) = manifest.segments.first().copied() else {
                break;
            };
            // Never the segment taking appends, nor one a roll is creating (F-08-8).
            if oldest.id >= published_segment {
                break;
            }
            self.seal_segment(log, oldest, &retained, &mut report)?;
        }
        self.reclaim_runs(log, &mut reclaimed_at, &retained, &mut report)?;
        if report.segments_sealed > 0 || report.runs_rewritten > 0 {
            self.write_runs_checkpoint()?;
        }
        Ok(report)
    }

    pub(super) fn seal_segment(
        &self,
        log: &Log,
        segment: SegmentEntry,
        retained: &Retained,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        let storage = self.inner.storage.as_ref();
        let bytes = read_segment(storage, segment.id)?;
        check_header(&bytes, segment.id, segment.salt)?;
        let run_id = log.allocate_file_id()?;
        let built = build_run(
            &bytes,
            segment.id,
            segment.salt,
            run_id,
            new_salt(),
            retained,
        )?;
        // A segment without any record (a clean reopen's fresh segment, closed unused)
        // needs no run: it is dropped from the manifest (F-06-14).
        let run = (built.raw_bytes > 0).then_some(built.entry);
        let replaced = Replaced {
            file: segment.id,
            path: segment_path(segment.id),
            dir: WAL_DIR,
        };
        self.put_run_in_place_of(replaced, run, &built, retained, || {
            log.replace_segment_with_run(segment.id, run, |manifest| {
                self.adopt_own_manifest(manifest.clone());
            })
        })?;
        report.segments_sealed += 1;
        report.events += built.events;
        report.raw_bytes += built.raw_bytes;
        report.run_bytes += run.map_or(0, |run| run.file_bytes);
        report.events_dropped += built.dropped_events;
        report.bytes_reclaimed += built.dropped_bytes;
        Ok(())
    }

    /// Rewrites every run that holds events of deleted sessions no live fork reads
    /// (F-06-26): the new run durable, then the manifest naming it in the old one's place,
    /// then the old file removed. A crash leaves one of the two an orphan (F-06-11).
    pub(super) fn reclaim_runs(
        &self,
        log: &Log,
        reclaimed_at: &mut Option<usize>,
        retained: &Retained,
        report: &mut MaintenanceReport,
    ) -> Result<()> {
        if retained.is_empty() || *reclaimed_at == Some(retained.len()) {
            return Ok(());
        }
        for old in log.manifest_in_force()?.runs {
            let Some(reader) = self.run_reader(old.id)? else {
                continue;
            };
            if !holds_dropped_events(&reader.index, retained) {
                continue;
            }
            let run_id = log.allocate_file_id()?;
            let built = rebuild_run(&reader, run_id, new_salt(), retained)?;
            drop(reader);
            let replaced = Replaced {
                file: old.id,
                path: run_path(old.id),
                dir: RUNS_DIR,
            };
            self.put_run_in_place_of(replaced, Some(built.entry), &built, retained, || {
                log.replace_run(old.id, built.entry, |manifest| {
                    self.adopt_own_manifest(manifest.clone());
                })
            })?;
            report.runs_rewritten += 1;
            report.events_dropped += built.dropped_events;
            report.bytes_reclaimed += old.file_bytes.saturating_sub(built.entry.file_bytes);
        }
        *reclaimed_at = Some(retained.len());
        Ok(())
    }

    /// The shared steps of sealing and of rewriting a run (F-06-10, F-06-26): the new run
    /// durable, then the manifest naming it (`swap_manifest`), then the catalog pointed at
    /// it, then the replaced file removed. A failure before the manifest leaves the new run
    /// an orphan, removed here or at the next open (F-06-11).
    pub(super) fn put_run_in_place_of(
        &self,
        replaced: Replaced,
        run: Option<RunEntry>,
        built: &BuiltRun,
        retained: &Retained,
        swap_manifest: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let storage = self.inner.storage.as_ref();
        self.check_moves(replaced.file, &built.moved)?;
        if let Some(run) = run {
            write_run_file(storage, run.id, &built.bytes)?;
        }
        if let Err(error) = swap_manifest() {
            let poisoned = self.log().map_or(true, |log| log.poisoned().is_some());
            if let (false, Some(run)) = (poisoned, run) {
                // The old manifest is in force: the run file is an orphan either way.
                let _ = storage.remove(&run_path(run.id));
            }
            return Err(error);
        }
        self.move_positions(replaced.file, run, &built.moved, retained)?;
        storage
            .remove(&replaced.path)
            .map_err(io_error("sealed file remove"))?;
        storage
            .sync_dir(replaced.dir)
            .map_err(io_error("directory sync"))
    }

    /// Every event of the run must be indexed in the segment it came from.
    pub(super) fn check_moves(&self, segment: u64, moved: &[(u32, u64, Extent)]) -> Result<()> {
        let catalog = self.inner.catalog.read();
        for (session, first_seq, extent) in moved {
            let indexed_here = catalog.sessions.get(session).is_some_and(|entry| {
                first_seq
                    .checked_sub(entry.seed_length())
                    .is_some_and(|first| {
                        (first..first + u64::from(extent.count))
                            .all(|index| entry.events.file_of(index) == Some(segment))
                    })
            });
            if !indexed_here {
                return Err(Error::Corrupt {
                    segment,
                    offset: 0,
                    reason: format!(
                        "events from {first_seq} of session {session} are not indexed here"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Points the catalog at the run instead of the segment or the run it replaces (under
    /// the read gate, so no reader holds extents of the old file any more when it is
    /// removed).
    /// Deleted sessions lose the events past what they retain: those events were left
    /// out of the run (F-06-24) and nothing reads them any more.
    pub(super) fn move_positions(
        &self,
        segment: u64,
        run: Option<RunEntry>,
        moved: &[(u32, u64, Extent)],
        retained: &Retained,
    ) -> Result<()> {
        let inner = &self.inner;
        let _no_readers = inner.read_gate.write();
        let mut catalog = inner.catalog.write();
        for (number, kept) in retained {
            if let Some(entry) = catalog.sessions.get_mut(number) {
                let own_kept = kept.saturating_sub(entry.seed_length());
                entry.events.truncate(own_kept);
            }
        }
        let mut by_session: HashMap<u32, Vec<(u64, Extent)>> = HashMap::new();
        for (session, first_seq, extent) in moved {
            by_session
                .entry(*session)
                .or_default()
                .push((*first_seq, *extent));
        }
        for entry in catalog.sessions.values_mut() {
            let mut replacement = by_session.remove(&entry.number).unwrap_or_default();
            for (first, _) in &mut replacement {
                *first -= entry.seed_length();
            }
            entry
                .events
                .replace_file(segment, &replacement)
                .map_err(|reason| Error::Corrupt {
                    segment,
                    offset: 0,
                    reason,
                })?;
        }
        if let Some(run) = run {
            for entry in catalog.sessions.values_mut() {
                if entry.defined_in == Some(segment) {
                    entry.defined_in = Some(run.id);
                }
            }
            inner.run_entries.write().insert(run.id, run);
        }
        inner.files.lock().remove(&segment);
        inner.salts.write().remove(&segment);
        inner.run_entries.write().remove(&segment);
        inner.run_readers.lock().remove(&segment);
        Ok(())
    }

    /// Checkpoints the seq index as of the runs (F-06-20).
    pub(super) fn write_runs_checkpoint(&self) -> Result<()> {
        let Some(log) = &self.inner.log else {
            return Ok(());
        };
        let manifest = log.manifest();
        let bytes = encode_checkpoint(&self.inner.catalog.read(), &manifest.runs, &[], None)?;
        write_checkpoint(self.inner.storage.as_ref(), &bytes)
    }

    /// Checkpoints the seq index as of every run and segment, after a clean close sealed
    /// them all (F-06-20).
    pub(super) fn write_closing_checkpoint(&self, log: &Log) -> Result<()> {
        let manifest = log.manifest();
        let mut covered = Vec::with_capacity(manifest.segments.len());
        for segment in &manifest.segments {
            let end = self
                .inner
                .storage
                .open_read(&segment_path(segment.id))
                .and_then(|file| file.len())
                .map_err(io_error("segment length"))?;
            covered.push(CoveredSegment {
                id: segment.id,
                salt: segment.salt,
                end,
            });
        }
        let bytes = encode_checkpoint(&self.inner.catalog.read(), &manifest.runs, &covered, None)?;
        write_checkpoint(self.inner.storage.as_ref(), &bytes)
    }
}
