//! Seq-index checkpoints written while the store runs (format-spec F-06-27, F-06-28): every
//! few MiB of committed log a background thread checkpoints the catalog as of the end of
//! the last batch in the segment taking appends, so that a reopen after a crash (or a
//! process joining, F-08-4) replays only the log after it instead of every unsealed segment.
//!
//! Off the commit path: the thread takes the catalog's read lock only to check that it is
//! exactly the log up to that end and to encode it; it waits for those bytes to be written
//! and syncs them itself, so no appender waits for a checkpoint's I/O.

use super::{Store, CHECKPOINT_THREAD};
use crate::error::{Error, Result};
use crate::limits::{CHECKPOINT_LOG_BYTES_PER_CHECKPOINT_BYTE, CHECKPOINT_POLL_MILLIS};
use crate::storage::coding::widen;
use crate::storage::commit::{start_thread, Log};
use crate::storage::frame::{decode_frame, Kind};
use crate::storage::index::{
    assemble_checkpoint, encode_catalog, write_checkpoint, CoveredSegment, OpenPrefix,
    COMMIT_FRAME_BYTES, COMMIT_FRAME_LENGTH,
};
use crate::storage::manifest::RunEntry;
use crate::storage::multi::lock::{ByteLock, MAINTENANCE_LOCK};
use crate::storage::multi::LockMode;
use crate::storage::segment::{segment_path, SEGMENT_HEADER_BYTES};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Tries of one checkpoint to find the catalog with no append in flight.
const CHECKPOINT_CUT_ATTEMPTS: usize = 1000;
/// Pause between two tries: 1000 tries span about 50 ms.
const CHECKPOINT_CUT_PAUSE: Duration = Duration::from_micros(50);

/// The checkpoint thread's state, shared with the store.
#[derive(Default)]
pub(super) struct Checkpoints {
    /// Appends and deletions between taking their seqs (or queueing their tombstone) and
    /// recording them in the catalog: while any is, the catalog may lack a batch the log
    /// already holds, and no checkpoint is taken.
    in_flight: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Where the last checkpoint this process wrote ends in the log (segment, offset), and
    /// its size in bytes.
    last: Mutex<((u64, u64), u64)>,
}

/// Marks one append or deletion in flight (see [`Checkpoints::in_flight`]) until dropped.
pub(super) struct InFlight<'store> {
    counter: &'store AtomicU64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one try of [`Store::cut_catalog`] found.
enum CutAttempt {
    /// The catalog, encoded at a batch boundary.
    Taken(CatalogCut),
    /// An append is between queueing and indexing: another try soon may succeed.
    InFlight,
    /// Nothing to checkpoint (the segment taking appends holds no batch yet): no try will
    /// succeed until someone appends, so none is made.
    Nothing,
}

/// What the catalog held, under its lock, at a batch boundary of the open segment.
struct CatalogCut {
    segment: u64,
    salt: u64,
    end: u64,
    runs: Vec<RunEntry>,
    sealed: Vec<CoveredSegment>,
    catalog_bytes: Vec<u8>,
}

impl Checkpoints {
    /// Asks the thread to stop (a dropped store cannot wait for it: the thread may hold
    /// the last reference itself).
    pub(super) fn stop_without_waiting(&self) {
        *self.stop.lock() = true;
        self.wake.notify_all();
    }

    /// Whether `bytes_every` log bytes (or more, for a large checkpoint) were committed
    /// after the last checkpoint, the tail being at `tail`.
    fn due(&self, tail: (u64, u64), bytes_every: u64) -> bool {
        let ((segment, offset), checkpoint_bytes) = *self.last.lock();
        let interval = bytes_every
            .max(checkpoint_bytes.saturating_mul(CHECKPOINT_LOG_BYTES_PER_CHECKPOINT_BYTE));
        // In a later segment the segments between hold at least the rest of the old one.
        tail.0 > segment || (tail.0 == segment && tail.1.saturating_sub(offset) >= interval)
    }
}

impl Store {
    /// Marks an append or deletion in flight until the returned guard drops: it must live
    /// from before the batch takes its place in the log until the catalog records it.
    pub(super) fn in_flight(&self) -> InFlight<'_> {
        let counter = &self.inner.checkpoints.in_flight;
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight { counter }
    }

    /// Writes a seq-index checkpoint now that covers the log up to the end of the last
    /// batch queued (F-06-27): the runs, the sealed segments and the prefix of the segment
    /// taking appends. Returns where it ends (segment, offset), or `None` when no
    /// checkpoint was written: a maintenance pass or another process's checkpoint is
    /// running, an append is between its queueing and its indexing, or the segment holds
    /// no batch yet. Derived data: a crash at any point leaves the previous checkpoint or
    /// this one (F-06-20), never a wrong one.
    pub fn checkpoint(&self) -> Result<Option<(u64, u64)>> {
        let log = self.log()?;
        let Some(_maintaining) = self.inner.maintaining.try_lock() else {
            return Ok(None);
        };
        // One process at a time writes checkpoints (F-08-12); never waited for.
        let _maintenance = match &self.inner.processes {
            Some(processes) => {
                match ByteLock::try_take(&processes.file, MAINTENANCE_LOCK, LockMode::Exclusive)
                    .map_err(|error| Error::io("maintenance lock", error))?
                {
                    Some(lock) => Some(lock),
                    None => return Ok(None),
                }
            }
            None => None,
        };
        let Some(cut) = self.cut_catalog_retrying(log)? else {
            return Ok(None);
        };
        let prefix = self.make_durable(log, &cut)?;
        let mut sealed = cut.sealed;
        for segment in &mut sealed {
            segment.end = self
                .inner
                .storage
                .open_read(&segment_path(segment.id))
                .and_then(|file| file.len())
                .map_err(|error| Error::io("segment length", error))?;
        }
        let bytes = assemble_checkpoint(&cut.runs, &sealed, Some(prefix), &cut.catalog_bytes)?;
        write_checkpoint(self.inner.storage.as_ref(), &bytes)?;
        *self.inner.checkpoints.last.lock() = ((cut.segment, cut.end), widen(bytes.len()));
        Ok(Some((cut.segment, cut.end)))
    }

    /// Waits until no append or deletion of this process is between queueing and indexing,
    /// at most [`CHECKPOINT_CUT_ATTEMPTS`] times [`CHECKPOINT_CUT_PAUSE`]; returns whether
    /// that instant came. Every batch queued before the call is in the catalog after it.
    pub(super) fn wait_appends_indexed(&self) -> bool {
        for _ in 0..CHECKPOINT_CUT_ATTEMPTS {
            if self.inner.checkpoints.in_flight.load(Ordering::SeqCst) == 0 {
                return true;
            }
            std::thread::sleep(CHECKPOINT_CUT_PAUSE);
        }
        false
    }

    /// [`Self::cut_catalog`] until an instant with no append in flight, at most
    /// [`CHECKPOINT_CUT_ATTEMPTS`] times, [`CHECKPOINT_CUT_PAUSE`] apart: an appender is in
    /// flight only while it encodes and queues, so such instants come often.
    fn cut_catalog_retrying(&self, log: &Log) -> Result<Option<CatalogCut>> {
        for _ in 0..CHECKPOINT_CUT_ATTEMPTS {
            match self.cut_catalog(log)? {
                CutAttempt::Taken(cut) => return Ok(Some(cut)),
                CutAttempt::Nothing => return Ok(None),
                CutAttempt::InFlight => std::thread::sleep(CHECKPOINT_CUT_PAUSE),
            }
        }
        Ok(None)
    }

    /// Encodes the catalog as of the end of the last queued batch, if the catalog holds
    /// exactly the batches before it. The catalog's read lock keeps appenders from
    /// recording batches meanwhile; with other processes, the tail pin keeps them from
    /// publishing (the catalog is caught up to the published end, F-08-6).
    fn cut_catalog(&self, log: &Log) -> Result<CutAttempt> {
        if self.inner.checkpoints.in_flight.load(Ordering::SeqCst) != 0 {
            // Not now: taking the lock would only hold that appender up.
            return Ok(CutAttempt::InFlight);
        }
        let _turn = log.pin_tail()?;
        let catalog = self.inner.catalog.read();
        // After the lock: every batch queued before this read and recorded before the lock
        // is in the catalog; one queued but not yet recorded keeps `in_flight` above zero
        // (it was raised before the batch was queued).
        let (segment, salt, end) = log.tail_position();
        if self.inner.checkpoints.in_flight.load(Ordering::SeqCst) != 0 {
            return Ok(CutAttempt::InFlight);
        }
        if end <= SEGMENT_HEADER_BYTES {
            return Ok(CutAttempt::Nothing);
        }
        let manifest = log.manifest();
        if !self.catalog_runs_are(&manifest.runs) {
            // The log read a manifest with another process's runs (a roll re-reads it,
            // F-08-8) that the catalog does not follow yet (F-08-17): not now.
            return Ok(CutAttempt::InFlight);
        }
        let Some(index) = manifest
            .segments
            .iter()
            .position(|entry| entry.id == segment)
        else {
            return Ok(CutAttempt::InFlight);
        };
        let sealed: Vec<CoveredSegment> = manifest.segments[..index]
            .iter()
            .map(|entry| CoveredSegment {
                id: entry.id,
                salt: entry.salt,
                end: 0,
            })
            .collect();
        let catalog_bytes =
            encode_catalog(&catalog, &manifest.runs, &sealed, Some((segment, end)))?;
        Ok(CutAttempt::Taken(CatalogCut {
            segment,
            salt,
            end,
            runs: manifest.runs,
            sealed,
            catalog_bytes,
        }))
    }

    /// Waits until the cut's bytes are written, syncs them (the checkpoint may only cover
    /// durable bytes, F-06-27) and reads back the commit frame that ends there.
    fn make_durable(&self, log: &Log, cut: &CatalogCut) -> Result<OpenPrefix> {
        log.wait_written(cut.segment, cut.end)?;
        let file = self
            .inner
            .storage
            .open(&segment_path(cut.segment), false)
            .map_err(|error| Error::io("segment open", error))?;
        // `Sync` appends made them durable already; `Buffered` and `Batched` ones may not be.
        if !log.is_durable(cut.segment, cut.end) {
            file.sync_data()
                .map_err(|error| Error::io("checkpoint segment sync", error))?;
        }
        let mut frame = [0u8; COMMIT_FRAME_LENGTH];
        file.read_exact_at(&mut frame, cut.end - COMMIT_FRAME_BYTES)
            .map_err(|error| Error::io("segment read", error))?;
        let not_a_commit = || Error::Corrupt {
            segment: cut.segment,
            offset: cut.end - COMMIT_FRAME_BYTES,
            reason: "the last batch does not end with its commit frame".to_string(),
        };
        let decoded = decode_frame(&frame, cut.salt).map_err(|_| not_a_commit())?;
        if decoded.kind != Kind::Commit as u8 || decoded.total_bytes != frame.len() {
            return Err(not_a_commit());
        }
        Ok(OpenPrefix {
            id: cut.segment,
            salt: cut.salt,
            end: cut.end,
            commit_checksum: u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]),
        })
    }

    /// Starts the checkpoint thread of a writable store when its options ask for one;
    /// nothing is due before the tail where appends start now.
    pub(super) fn start_checkpoints(&self) -> Result<()> {
        let (Some(bytes_every), Some(log)) =
            (self.inner.options.checkpoint_every_bytes, &self.inner.log)
        else {
            return Ok(());
        };
        let (segment, _, end) = log.tail_position();
        *self.inner.checkpoints.last.lock() = ((segment, end), 0);
        self.start_checkpoint_thread(bytes_every)
    }

    /// Starts the thread that checkpoints every `bytes_every` bytes of committed log.
    fn start_checkpoint_thread(&self, bytes_every: u64) -> Result<()> {
        let weak = Arc::downgrade(&self.inner);
        let checkpoints = self.inner.checkpoints.clone();
        let poll = Duration::from_millis(CHECKPOINT_POLL_MILLIS);
        let handle = start_thread(CHECKPOINT_THREAD, move || loop {
            {
                let mut stop = checkpoints.stop.lock();
                if !*stop {
                    checkpoints.wake.wait_for(&mut stop, poll);
                }
                if *stop {
                    return;
                }
            }
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let store = Store { inner };
            let Ok(log) = store.log() else {
                return;
            };
            let (segment, _, end) = log.tail_position();
            if checkpoints.due((segment, end), bytes_every) {
                // Derived data (F-06-22): a failed checkpoint costs the next open a longer
                // replay, nothing else; the next poll tries again.
                let _ = store.checkpoint();
            }
        })?;
        *self.inner.checkpoints.thread.lock() = Some(handle);
        Ok(())
    }

    /// Stops the checkpoint thread and waits for it (before a close seals the log).
    pub(super) fn stop_checkpoint_thread(&self) {
        let checkpoints = &self.inner.checkpoints;
        *checkpoints.stop.lock() = true;
        checkpoints.wake.notify_all();
        let handle = checkpoints.thread.lock().take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}
