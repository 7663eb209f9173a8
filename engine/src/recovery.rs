//! Open-time recovery (format-spec/05-commit-and-recovery.md, the decision table): replays
//! every committed batch of every live segment into a [`Catalog`], tells a torn tail from
//! corruption, and says where the log continues.

use crate::catalog::{Catalog, Position, Seed};
use crate::error::{Error, Result};
use crate::frame::{EventRecord, Record, FRAME_HEADER_BYTES, NO_SEED_PARENT};
use crate::io::Storage;
use crate::manifest::Manifest;
use crate::segment::{
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
pub fn recover(storage: &dyn Storage, manifest: &Manifest) -> Result<Recovered> {
    let mut catalog = Catalog::default();
    let mut report = RecoveryReport::default();
    let mut tail = None;
    let segments = &manifest.segments;
    let mut index = 0;
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
        if wipe_end > replay.committed_end {
            report.torn_tail = Some(TornTail {
                segment: entry.id,
                offset: replay.committed_end,
                bytes: wipe_end - replay.committed_end,
                dropped_events,
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
    Ok(Recovered {
        catalog,
        report,
        tail,
    })
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
                        .define_session(number, seed, header_json)
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
                        frame_bytes: (FRAME_HEADER_BYTES + event.payload_bytes()) as u32,
                    };
                    catalog
                        .push_event(session, next_seq, position)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                    next_seq += 1;
                }
                Record::Commit { .. } | Record::Seal { .. } => {}
            }
        }
        if event_count == 0 {
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
