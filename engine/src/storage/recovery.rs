//! Open-time recovery (format-spec/05-commit-and-recovery.md, the decision table): replays
//! every committed batch of every live segment into a [`Catalog`], tells a torn tail from
//! corruption, and says where the log continues.

use crate::error::{Error, Result};
use crate::storage::catalog::{Catalog, Extent, Position, Seed};
use crate::storage::coding::checked_u32;
use crate::storage::frame::{EventRecord, Record, FRAME_HEADER_BYTES, NO_SEED_PARENT};
use crate::storage::index::{load_checkpoint, CoveredSegment};
use crate::storage::io::Storage;
use crate::storage::manifest::{Manifest, RunEntry};
use crate::storage::run::{run_corrupt, run_path, walk_block, RunReader, DEFINITIONS_SESSION};
use crate::storage::segment::{
    check_header, durable_evidence_after, has_valid_frame, nonzero_end, read_segment, scan_frames,
    SEGMENT_HEADER_BYTES,
};
use std::collections::HashSet;

/// A torn tail found (and, when writable, wiped) at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub segment: u64,
    /// Offset where the discarded bytes start (the end of the last whole batch).
    pub offset: u64,
    /// How many bytes after it held a partial batch or a torn frame.
    pub bytes: u64,
    /// Events of incomplete batches that were dropped.
    pub dropped_events: u64,
    /// Sessions (numbers, ascending) that dropped events had: a binding reports the torn
    /// tail to them (DSH's torn marker) until they are repaired.
    pub dropped_sessions: Vec<u32>,
    pub reason: String,
}

/// What the recovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments_scanned: usize,
    pub events: u64,
    pub batches: u64,
    pub torn_tail: Option<TornTail>,
    /// Segment files the manifest does not name (a crash during a roll); removed when writable.
    pub orphan_segments: Vec<String>,
    /// Run files the manifest does not name (a crash during a seal, F-06-11).
    pub orphan_runs: Vec<String>,
    /// Sealed segments the checkpoint covered (not scanned).
    pub segments_covered: usize,
    /// Runs whose blocks were decoded because no checkpoint covered them.
    pub runs_replayed: usize,
    /// Whether a seq-index checkpoint was loaded.
    pub checkpoint_used: bool,
    /// Why a checkpoint was not used (F-06-22), when the store has one or has runs.
    pub checkpoint_ignored: Option<String>,
}

/// Where appends continue after recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTail {
    pub segment: u64,
    pub salt: u64,
    /// End of the last whole batch.
    pub offset: u64,
    /// Whether the segment ends with a seal (then a new segment must be started).
    pub sealed: bool,
    /// End of the non-zero bytes past `offset` that must be wiped before appending.
    pub wipe_end: u64,
    /// An older segment that ends in a torn tail while the log continues in a newer (empty)
    /// one: it must be sealed at its committed end before the newer one takes data.
    pub seal_earlier: Vec<TornSegment>,
}

/// A segment to seal at `committed_end`, wiping its bytes up to `wipe_end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TornSegment {
    pub segment: u64,
    pub salt: u64,
    pub committed_end: u64,
    pub wipe_end: u64,
}

/// The outcome of replaying the log.
pub struct Recovered {
    pub catalog: Catalog,
    pub report: RecoveryReport,
    pub tail: Option<LogTail>,
}

#[derive(Default)]
struct SegmentReplay<'a> {
    pending: Vec<(u64, Record<'a>)>,
    defined_sessions: HashSet<u32>,
    defined_types: HashSet<u32>,
    committed_end: u64,
}

/// Replays the segments the manifest names.
/// With `use_checkpoint` off every run and segment is decoded and checked (what `verify`
/// wants); with it on, a matching seq-index checkpoint stands in for the files it covers.
pub fn recover(
    storage: &dyn Storage,
    manifest: &Manifest,
    use_checkpoint: bool,
) -> Result<Recovered> {
    let mut report = RecoveryReport::default();
    let checkpoint = if use_checkpoint {
        load_checkpoint(storage, manifest)
    } else {
        Err("not used: every file is checked".to_string())
    };
    let (mut catalog, covered_runs, covered_segments) = match checkpoint {
        Ok(checkpoint) => {
            report.checkpoint_used = true;
            (
                checkpoint.catalog,
                checkpoint.runs.len(),
                checkpoint.segments,
            )
        }
        Err(reason) => {
            if !manifest.runs.is_empty() || !reason.starts_with("cannot open") {
                report.checkpoint_ignored = Some(reason);
            }
            (Catalog::default(), 0, Vec::new())
        }
    };
    for run in &manifest.runs[covered_runs..] {
        report.events += replay_run(storage, run, &mut catalog)?;
        report.runs_replayed += 1;
    }
    report.segments_covered = covered_segments.len();
    let mut tail = covered_segments.last().map(sealed_tail);
    let segments = &manifest.segments;
    let mut index = covered_segments.len();
    while index < segments.len() {
        let entry = segments[index];
        let bytes = read_segment(storage, entry.id)?;
        check_header(&bytes, entry.id, entry.salt)?;
        report.segments_scanned += 1;
        let mut replay = SegmentReplay {
            committed_end: SEGMENT_HEADER_BYTES,
            ..SegmentReplay::default()
        };
        let scan = scan_frames(&bytes, entry.id, entry.salt, |offset, record| {
            replay.accept(&mut catalog, &mut report, entry.id, offset, record)
        })?;
        if scan.sealed {
            if !replay.pending.is_empty() {
                return Err(corrupt(
                    entry.id,
                    scan.valid_end,
                    "records after the last commit before the seal",
                ));
            }
            tail = Some(LogTail {
                segment: entry.id,
                salt: entry.salt,
                offset: scan.valid_end,
                sealed: true,
                wipe_end: scan.valid_end,
                seal_earlier: Vec::new(),
            });
            index += 1;
            continue;
        }
        // The scan ended before a seal: at unwritten space, a torn write, or damage.
        let stop_offset = scan
            .stop
            .as_ref()
            .map_or(scan.valid_end, |stop| stop.offset);
        let later_data = segments[index + 1..]
            .iter()
            .try_fold(false, |found, later| {
                if found {
                    return Ok(true);
                }
                let later_bytes = read_segment(storage, later.id)?;
                check_header(&later_bytes, later.id, later.salt)?;
                Ok::<bool, Error>(has_valid_frame(&later_bytes, later.salt))
            })?;
        let evidence = later_data || durable_evidence_after(&bytes, entry.salt, stop_offset);
        if evidence {
            let reason = scan
                .stop
                .map(|stop| stop.reason)
                .unwrap_or_else(|| "segment ends without a seal before later data".to_string());
            return Err(corrupt(entry.id, stop_offset, &reason));
        }
        let wipe_end = nonzero_end(&bytes, replay.committed_end);
        let dropped_events = replay
            .pending
            .iter()
            .filter(|(_, record)| matches!(record, Record::Event(_)))
            .count() as u64;
        let mut dropped_sessions: Vec<u32> = replay
            .pending
            .iter()
            .filter_map(|(_, record)| match record {
                Record::Event(event) => Some(event.session),
                _ => None,
            })
            .collect();
        dropped_sessions.sort_unstable();
        dropped_sessions.dedup();
        if wipe_end > replay.committed_end {
            report.torn_tail = Some(TornTail {
                segment: entry.id,
                offset: replay.committed_end,
                bytes: wipe_end - replay.committed_end,
                dropped_events,
                dropped_sessions,
                reason: scan
                    .stop
                    .map(|stop| stop.reason)
                    .unwrap_or_else(|| "incomplete batch".to_string()),
            });
        }
        tail = Some(LogTail {
            segment: entry.id,
            salt: entry.salt,
            offset: replay.committed_end,
            sealed: false,
            wipe_end,
            seal_earlier: Vec::new(),
        });
        // Later segments hold no valid frame; appends continue in the last one named, and
        // every segment before it must be sealed first (the torn one and empty ones).
        if let Some((last, between)) = segments[index + 1..].split_last() {
            let mut seal_earlier = vec![TornSegment {
                segment: entry.id,
                salt: entry.salt,
                committed_end: replay.committed_end,
                wipe_end,
            }];
            seal_earlier.extend(between.iter().map(|empty| TornSegment {
                segment: empty.id,
                salt: empty.salt,
                committed_end: SEGMENT_HEADER_BYTES,
                wipe_end: SEGMENT_HEADER_BYTES,
            }));
            report.segments_scanned += between.len() + 1;
            tail = Some(LogTail {
                segment: last.id,
                salt: last.salt,
                offset: SEGMENT_HEADER_BYTES,
                sealed: false,
                wipe_end: SEGMENT_HEADER_BYTES,
                seal_earlier,
            });
        }
        break;
    }
    catalog
        .check_gaps()
        .map_err(|(position, reason)| corrupt(position.segment, position.offset, &reason))?;
    catalog.gaps.clear();
    catalog
        .check_seeds()
        .map_err(|reason| corrupt(0, 0, &reason))?;
    Ok(Recovered {
        catalog,
        report,
        tail,
    })
}

/// The log tail when the last segment is covered by the checkpoint (it was sealed).
fn sealed_tail(segment: &CoveredSegment) -> LogTail {
    LogTail {
        segment: segment.id,
        salt: segment.salt,
        offset: segment.end,
        sealed: true,
        wipe_end: segment.end,
        seal_earlier: Vec::new(),
    }
}

/// Loads one run's sessions, types and event positions into the catalog (F-06-1, F-06-6);
/// returns how many events it holds.
fn replay_run(storage: &dyn Storage, entry: &RunEntry, catalog: &mut Catalog) -> Result<u64> {
    let file = storage.open_read(&run_path(entry.id)).map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            Error::CorruptFile {
                file: run_path(entry.id),
                reason: "named by the manifest but missing".to_string(),
            }
        } else {
            Error::io("run open", error)
        }
    })?;
    let reader = RunReader::open(file, entry)?;
    let run = entry.id;
    let mut events = 0;
    for (index, block) in reader.index.blocks.iter().enumerate() {
        let raw = reader.block(index, None)?;
        let mut next_seq = block.first_seq;
        walk_block(&raw, block, run, |offset, _frame_bytes, record| {
            let bad = |reason: &str| run_corrupt(run, offset, reason);
            match record {
                Record::SessionHeader {
                    session,
                    seed_parent,
                    seed_length,
                    header_json,
                } if block.session == DEFINITIONS_SESSION => {
                    let seed = (seed_parent != NO_SEED_PARENT).then_some(Seed {
                        parent: seed_parent,
                        length: seed_length,
                    });
                    catalog
                        .define_session(session, seed, header_json, run, false)
                        .map_err(|reason| bad(&reason))
                }
                Record::TypeDefinition { type_number, name }
                    if block.session == DEFINITIONS_SESSION =>
                {
                    catalog
                        .define_type(type_number, name)
                        .map_err(|reason| bad(&reason))
                }
                Record::Tombstone { session } if block.session == DEFINITIONS_SESSION => catalog
                    .delete_session(session)
                    .map_err(|reason| bad(&reason)),
                Record::Event(event) if event.session == block.session => {
                    if event.seq != next_seq || !catalog.type_names.contains_key(&event.type_number)
                    {
                        return Err(bad("event seq or type does not match its block"));
                    }
                    next_seq += 1;
                    Ok(())
                }
                _ => Err(bad("record does not belong in this block")),
            }
        })?;
        if next_seq - block.first_seq != u64::from(block.event_count) {
            return Err(run_corrupt(
                run,
                block.raw_offset,
                "block holds another event count",
            ));
        }
        if block.session != DEFINITIONS_SESSION {
            let extent = Extent {
                file: run,
                offset: block.raw_offset,
                bytes: u64::from(block.raw_bytes),
                count: block.event_count,
            };
            catalog
                .push_extent(block.session, block.first_seq, extent)
                .map_err(|reason| run_corrupt(run, block.raw_offset, &reason))?;
        }
        events += u64::from(block.event_count);
    }
    Ok(events)
}

fn corrupt(segment: u64, offset: u64, reason: &str) -> Error {
    Error::Corrupt {
        segment,
        offset,
        reason: reason.to_string(),
    }
}

/// Bytes of a commit frame.
const COMMIT_FRAME_BYTES: u64 = FRAME_HEADER_BYTES as u64 + 24;

impl<'a> SegmentReplay<'a> {
    fn accept(
        &mut self,
        catalog: &mut Catalog,
        report: &mut RecoveryReport,
        segment: u64,
        offset: u64,
        record: Record<'a>,
    ) -> Result<()> {
        match record {
            Record::Commit {
                session,
                first_seq,
                event_count,
                ..
            } => {
                self.apply_batch(catalog, segment, offset, session, first_seq, event_count)?;
                report.batches += 1;
                report.events += u64::from(event_count);
                self.committed_end = offset + COMMIT_FRAME_BYTES;
            }
            Record::Seal { used_bytes, .. } => {
                if used_bytes != offset {
                    return Err(corrupt(segment, offset, "seal names another offset"));
                }
            }
            other => self.pending.push((offset, other)),
        }
        Ok(())
    }

    fn apply_batch(
        &mut self,
        catalog: &mut Catalog,
        segment: u64,
        commit_offset: u64,
        session: u32,
        first_seq: u64,
        event_count: u32,
    ) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let mut next_seq = first_seq;
        for (offset, record) in pending {
            match record {
                Record::SessionHeader {
                    session: number,
                    seed_parent,
                    seed_length,
                    header_json,
                } => {
                    let seed = (seed_parent != NO_SEED_PARENT).then_some(Seed {
                        parent: seed_parent,
                        length: seed_length,
                    });
                    catalog
                        .define_session(number, seed, header_json, segment, true)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                    self.defined_sessions.insert(number);
                }
                Record::TypeDefinition { type_number, name } => {
                    catalog
                        .define_type(type_number, name)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                    self.defined_types.insert(type_number);
                }
                Record::Event(event) => {
                    self.check_event(&event, session, next_seq)
                        .map_err(|reason| corrupt(segment, offset, reason))?;
                    let position = Position {
                        segment,
                        offset,
                        frame_bytes: checked_u32(
                            FRAME_HEADER_BYTES + event.payload_bytes(),
                            "event frame",
                        )?,
                    };
                    catalog
                        .push_event(session, next_seq, position)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                    next_seq += 1;
                }
                Record::Tombstone { session: number } => {
                    if number != session {
                        return Err(corrupt(segment, offset, "tombstone of another session"));
                    }
                    catalog
                        .delete_session(number)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                }
                Record::Commit { .. } | Record::Seal { .. } => {}
            }
        }
        // A deleted session's earlier events may have been dropped at sealing (F-06-24), so
        // its length no longer says where its tombstone's commit stood.
        let deleted = catalog
            .sessions
            .get(&session)
            .is_some_and(|entry| entry.deleted);
        if event_count == 0 && !deleted {
            let length = catalog.sessions.get(&session).map(|entry| entry.length());
            if length != Some(first_seq) {
                return Err(corrupt(
                    segment,
                    commit_offset,
                    "empty commit names another seq",
                ));
            }
        }
        if next_seq - first_seq != u64::from(event_count) {
            return Err(corrupt(
                segment,
                commit_offset,
                "commit count differs from its events",
            ));
        }
        if !self.defined_sessions.contains(&session) {
            return Err(corrupt(
                segment,
                commit_offset,
                "commit names a session this segment does not define",
            ));
        }
        Ok(())
    }

    fn check_event(
        &self,
        event: &EventRecord<'_>,
        session: u32,
        expected_seq: u64,
    ) -> std::result::Result<(), &'static str> {
        if event.session != session {
            return Err("event of another session inside a batch");
        }
        if event.seq != expected_seq {
            return Err("event seq is not the next in its batch");
        }
        if !self.defined_sessions.contains(&event.session) {
            return Err("event before its session header in this segment");
        }
        if !self.defined_types.contains(&event.type_number) {
            return Err("event before its type definition in this segment");
        }
        Ok(())
    }
}
