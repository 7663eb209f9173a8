//! Figures of a store or of one session (`Store::stats`).

use super::{io_error, Store};
use crate::error::{Error, Result};
use crate::storage::index::CHECKPOINT_FILE;
use crate::storage::manifest::MANIFEST_FILE;
use crate::storage::run::{parse_run_name, RUNS_DIR};
use crate::storage::segment::{parse_segment_name, WAL_DIR};
use std::collections::HashMap;

/// Figures of [`Store::stats`], for the whole store or one session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Sessions counted (1 for one session).
    pub sessions: u64,
    /// Events, a fork's seed included for one session, every stored event for the store.
    pub events: u64,
    /// Events stored in runs, and in write-ahead segments.
    pub events_in_runs: u64,
    pub events_in_segments: u64,
    /// Run files (holding the session's events, for one session).
    pub runs: u64,
    /// Write-ahead segments (holding the session's events, for one session).
    pub segments: u64,
    /// Bytes on disk: every file of the store, or the session's run blocks and frames.
    pub bytes_on_disk: u64,
    /// Frame bytes of the events counted, uncompressed (the spans of their index extents:
    /// in write-ahead segments this includes the commit records between batches).
    pub raw_bytes: u64,
    /// Uncompressed over compressed bytes of the run blocks counted (0 without runs).
    pub run_compression_ratio: f64,
    /// Passes of this handle's background maintenance thread that failed since the store was
    /// opened (the whole store's figure, also for one session; 0 without the thread).
    pub maintenance_failures: u64,
    /// The message of the last of them.
    pub last_maintenance_failure: Option<String>,
}

impl Store {
    /// Events, files and compression of the store, or of one session (`dshdb stats`).
    pub fn stats(&self, session: Option<&str>) -> Result<Stats> {
        let _positions_stay_valid = self.inner.read_gate.read();
        let run_ids: Vec<u64> = self.inner.run_entries.read().keys().copied().collect();
        let mut readers = HashMap::new();
        for id in run_ids {
            if let Some(reader) = self.run_reader(id)? {
                readers.insert(id, reader);
            }
        }
        let catalog = self.inner.catalog.read();
        let mut stats = Stats::default();
        (stats.maintenance_failures, stats.last_maintenance_failure) =
            self.inner.maintenance.failure_summary();
        let mut runs_seen = std::collections::HashSet::new();
        let mut segments_seen = std::collections::HashSet::new();
        let numbers: Vec<u32> = match session {
            Some(id) => {
                let number = *catalog
                    .by_id
                    .get(id)
                    .ok_or_else(|| Error::UnknownSession { id: id.to_string() })?;
                if let Some(entry) = catalog.sessions.get(&number) {
                    stats.events = entry.length();
                }
                vec![number]
            }
            None => catalog.sessions.keys().copied().collect(),
        };
        for number in &numbers {
            let Some(entry) = catalog.sessions.get(number) else {
                continue;
            };
            stats.sessions += u64::from(!entry.deleted);
            for extent in entry.events.extents() {
                stats.raw_bytes += extent.bytes;
                if readers.contains_key(&extent.file) {
                    stats.events_in_runs += u64::from(extent.count);
                    runs_seen.insert(extent.file);
                } else {
                    stats.events_in_segments += u64::from(extent.count);
                    segments_seen.insert(extent.file);
                }
            }
        }
        let (mut run_raw, mut run_stored) = (0u64, 0u64);
        for (id, reader) in &readers {
            for block in &reader.index.blocks {
                if session.is_none() || numbers.contains(&block.session) {
                    run_raw += u64::from(block.raw_bytes);
                    run_stored += u64::from(block.stored_bytes);
                }
            }
            if session.is_none() {
                runs_seen.insert(*id);
            }
        }
        if run_stored > 0 {
            stats.run_compression_ratio = run_raw as f64 / run_stored as f64;
        }
        stats.runs = runs_seen.len() as u64;
        match session {
            Some(_) => {
                stats.segments = segments_seen.len() as u64;
                let wal_bytes = stats.raw_bytes - run_raw.min(stats.raw_bytes);
                stats.bytes_on_disk = run_stored + wal_bytes;
            }
            None => {
                stats.events = stats.events_in_runs + stats.events_in_segments;
                stats.segments = self.store_file_bytes(&mut stats.bytes_on_disk)?;
            }
        }
        Ok(stats)
    }

    /// Adds the length of every store file to `bytes`; returns how many segments there are.
    pub(super) fn store_file_bytes(&self, bytes: &mut u64) -> Result<u64> {
        let storage = self.inner.storage.as_ref();
        let length = |path: &str| {
            storage
                .open_read(path)
                .and_then(|file| file.len())
                .map_err(io_error("stats"))
        };
        let mut segments = 0;
        for (dir, is_store_file) in [
            (WAL_DIR, parse_segment_name as fn(&str) -> Option<u64>),
            (RUNS_DIR, parse_run_name),
        ] {
            for name in storage.list(dir).map_err(io_error("stats"))? {
                if is_store_file(&name).is_some() {
                    *bytes += length(&format!("{dir}/{name}"))?;
                    if dir == WAL_DIR {
                        segments += 1;
                    }
                }
            }
        }
        for file in [MANIFEST_FILE, CHECKPOINT_FILE] {
            if storage.exists(file).map_err(io_error("stats"))? {
                *bytes += length(file)?;
            }
        }
        Ok(segments)
    }
}
