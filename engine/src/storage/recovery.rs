//! Open-time recovery (format-spec/05-commit-and-recovery.md, the decision table): replays
//! every committed batch of every live segment into a [`Catalog`], tells a torn tail from
//! corruption, and says where the log continues.

use crate::error::{Error, Result};
use crate::storage::catalog::{Catalog, Extent, Position, Seed};
use crate::storage::coding::checked_u32;
use crate::storage::frame::{Record, FRAME_HEADER_BYTES, NO_SEED_PARENT};
use crate::storage::index::{
    check_open_prefix, load_checkpoint, Checkpoint, CoveredSegment, OpenPrefix,
};
use crate::storage::io::{Storage, StorageFile};
use crate::storage::manifest::{Manifest, RunEntry, SegmentEntry};
use crate::storage::run::{
    run_corrupt, run_path, walk_block, BlockItem, RunIndex, RunReader, DEFINITIONS_SESSION,
};
use crate::storage::segment::{
    check_header, durable_evidence_after, has_valid_frame, nonzero_end, read_segment, scan_frames,
    scan_frames_from, scan_frames_in, segment_path, SegmentScan, SEAL_FRAME_BYTES,
    SEGMENT_HEADER_BYTES,
};
use std::collections::HashSet;
use std::sync::Arc;

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
    /// The (segment, end) of the unsealed segment's prefix the checkpoint covered
    /// (F-06-27): its batches from `end` on were replayed.
    pub checkpoint_open_prefix: Option<(u64, u64)>,
    /// Why a checkpoint was not used (F-06-22), when the store has one or has runs.
    pub checkpoint_ignored: Option<String>,
    /// A writable open found the last segment the checkpoint covers unsealed where the
    /// checkpoint says and recovered without it (F-05-12): the checkpoint is stale and the
    /// open removes it before it repairs anything.
    pub checkpoint_distrusted: bool,
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
    progress: SegmentProgress,
}

/// What the committed batches of a segment replayed so far leave: it outlives one read of
/// the segment's bytes, so a reader that reads the segment again continues from it.
#[derive(Default)]
struct SegmentProgress {
    defined_sessions: HashSet<u32>,
    defined_types: HashSet<u32>,
    committed_end: u64,
    /// Catching up from the middle of a segment (F-08-11): the records that defined its
    /// sessions and types in this segment may lie before the range, so "held in this
    /// segment" (F-05-4) is not checked; everything else is.
    mid_segment: bool,
}

/// What [`apply_published`] applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppliedRange {
    /// Offset just past the last batch applied (past the seal when `sealed`).
    pub end: u64,
    /// Whether the range ended with the segment's seal.
    pub sealed: bool,
    /// Events applied.
    pub events: u64,
}

/// Applies the committed batches of a published range of a segment to `catalog`
/// (F-08-11): `bytes` are the segment's bytes from offset `from` (a batch start) to a
/// published end (or, with `to_seal`, to its end): the new bytes only. Published bytes
/// are whole batches (F-08-5), so a range that stops inside a batch, or at an invalid
/// frame, is damage (`Error::Corrupt`), never a torn tail. With `to_seal` the range is a
/// rolled segment's rest and must end with its seal.
pub fn apply_published(
    catalog: &mut Catalog,
    bytes: &[u8],
    from: u64,
    (segment, salt): (u64, u64),
    to_seal: bool,
) -> Result<AppliedRange> {
    let mut replay = SegmentReplay {
        pending: Vec::new(),
        progress: SegmentProgress {
            committed_end: from,
            mid_segment: from > SEGMENT_HEADER_BYTES,
            ..SegmentProgress::default()
        },
    };
    let mut report = RecoveryReport::default();
    let scan = scan_frames_in(bytes, from, from, segment, salt, |offset, record| {
        replay.accept(catalog, &mut report, segment, offset, record)
    })?;
    if let Some(stop) = scan.stop {
        return Err(corrupt(segment, stop.offset, &stop.reason));
    }
    if !replay.pending.is_empty() {
        return Err(corrupt(
            segment,
            replay.progress.committed_end,
            "published range ends inside a batch",
        ));
    }
    if to_seal && !scan.sealed {
        return Err(corrupt(
            segment,
            scan.valid_end,
            "a rolled segment ends without its seal",
        ));
    }
    Ok(AppliedRange {
        end: scan.valid_end,
        sealed: scan.sealed,
        events: report.events,
    })
}

/// Whether the open will write: a writable open checks the files a checkpoint vouches for
/// before it builds on them (F-05-12); a read-only one reads a snapshot beside a possibly
/// running writer and reads a segment again before it calls what it saw damage (F-05-13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    Writable,
    /// What a writable open would decide, found by a read-only reader (`dshdb verify`):
    /// the checks of a writable open, the reads of a read-only one.
    Preview,
}

impl Access {
    /// Whether the open checks what a checkpoint vouches for (F-05-12).
    fn checks_covered_files(self) -> bool {
        self != Access::ReadOnly
    }

    /// Whether a writer may be writing beside this open (it holds no lock, F-05-13).
    fn beside_a_writer(self) -> bool {
        self != Access::Writable
    }
}

/// Reads of one segment a read-only open makes before it calls a stop damage (F-05-13): a
/// writer appending meanwhile makes each read show more; damage stays where it is.
pub const MAX_SEGMENT_READS: usize = 8;

/// The last segment a checkpoint covers does not end in a clean seal where it recorded.
struct UncleanSeal {
    segment: u64,
    recorded_end: u64,
    reason: String,
}

/// Replays the segments the manifest names.
/// With `use_checkpoint` off every run and segment is decoded and checked (what `verify`
/// wants); with it on, a matching seq-index checkpoint stands in for the files it covers.
/// A writable open checks what that checkpoint vouches for first (F-05-12).
pub fn recover(
    storage: &dyn Storage,
    manifest: &Manifest,
    use_checkpoint: bool,
    access: Access,
) -> Result<Recovered> {
    let mut report = RecoveryReport::default();
    let loaded = if use_checkpoint {
        load_checkpoint(storage, manifest)
    } else {
        Err("not used: every file is checked".to_string())
    };
    let checkpoint = match loaded {
        Ok(checkpoint) => Some(checkpoint),
        Err(reason) => {
            if !manifest.runs.is_empty() || !reason.starts_with("cannot open") {
                report.checkpoint_ignored = Some(reason);
            }
            None
        }
    };
    if let Some(prefix) = checkpoint.as_ref().and_then(|checkpoint| checkpoint.open) {
        if let Err(reason) = check_open_prefix(storage, &prefix) {
            return recover_past_stale_prefix(storage, manifest, prefix, reason, access);
        }
    }
    if let Some(checkpoint) = checkpoint
        .as_ref()
        .filter(|_| access.checks_covered_files())
    {
        check_covered_files(storage, manifest, checkpoint)?;
        // With an open prefix, its verified commit frame proves every earlier segment was
        // sealed and durable before it was written (F-05-2): there is no seal to check.
        if checkpoint.open.is_none() {
            if let Some(unclean) = unclean_last_seal(storage, checkpoint)? {
                return recover_past_unclean_seal(storage, manifest, unclean, access);
            }
        }
    }
    let mut recovered = replay(storage, manifest, checkpoint, report, access)?;
    if access == Access::Writable && !use_checkpoint {
        mark_stale_checkpoint(storage, manifest, &mut recovered);
    }
    Ok(recovered)
}

/// A writable open that did not use the checkpoint may go on writing a segment the
/// checkpoint on disk calls sealed (its seal was lost or torn): that checkpoint is stale
/// and must go before the open writes (F-05-12).
fn mark_stale_checkpoint(storage: &dyn Storage, manifest: &Manifest, recovered: &mut Recovered) {
    let Some(tail) = &recovered.tail else {
        return;
    };
    let Ok(checkpoint) = load_checkpoint(storage, manifest) else {
        return;
    };
    let stale = checkpoint
        .segments
        .iter()
        .any(|covered| continued_end(tail, covered.id).is_some());
    // Continuing the open segment is what its prefix expects, unless below the prefix.
    let prefix_lost = checkpoint.open.is_some_and(|prefix| {
        continued_end(tail, prefix.id).is_some_and(|committed| committed < prefix.end)
    });
    recovered.report.checkpoint_distrusted |= stale || prefix_lost;
}

/// F-06-28: the open prefix's commit frame is not where the checkpoint recorded it. The
/// open recovers without the checkpoint (F-06-22). The checkpoint was written once that
/// frame was durable, so a writable open that finds the segment's batches ending before
/// it has lost acknowledged batches and refuses (`Corrupt`), changing nothing; otherwise
/// the checkpoint is distrusted (removed before anything is written).
fn recover_past_stale_prefix(
    storage: &dyn Storage,
    manifest: &Manifest,
    prefix: OpenPrefix,
    reason: String,
    access: Access,
) -> Result<Recovered> {
    let mut recovered = replay(storage, manifest, None, RecoveryReport::default(), access)?;
    if access.checks_covered_files() {
        let committed_end = recovered
            .tail
            .as_ref()
            .and_then(|tail| continued_end(tail, prefix.id));
        if let Some(committed_end) = committed_end.filter(|end| *end < prefix.end) {
            return Err(corrupt(
                prefix.id,
                committed_end,
                &format!(
                    "committed batches end here, but the checkpoint recorded them durable up \
                     to offset {}: {reason}",
                    prefix.end
                ),
            ));
        }
        recovered.report.checkpoint_distrusted = true;
    }
    recovered.report.checkpoint_ignored = Some(reason);
    Ok(recovered)
}

/// F-05-12: every file the checkpoint covers exists, each covered segment's header (the
/// open prefix's segment too, F-06-28) and
/// each covered run's header and footer are sound. (The records of older covered segments
/// and the blocks of runs are checked by every read of them and by `verify`.)
fn check_covered_files(
    storage: &dyn Storage,
    manifest: &Manifest,
    checkpoint: &Checkpoint,
) -> Result<()> {
    let open = checkpoint.open.map(|prefix| (prefix.id, prefix.salt));
    let sealed = checkpoint
        .segments
        .iter()
        .map(|segment| (segment.id, segment.salt));
    for (id, salt) in sealed.chain(open) {
        let file = open_named(storage, &segment_path(id))?;
        let mut header = vec![0; crate::storage::segment::HEADER_LENGTH];
        let read = file
            .read_up_to(&mut header, 0)
            .map_err(|error| Error::io("segment read", error))?;
        header.truncate(read);
        check_header(&header, id, salt)?;
    }
    for run in &manifest.runs[..checkpoint.runs.len()] {
        let file = open_named(storage, &run_path(run.id))?;
        RunIndex::read(file.as_ref(), run)?;
    }
    Ok(())
}

/// Opens a file the manifest names; a missing one is `CorruptFile` (F-05-8 row 6).
fn open_named(storage: &dyn Storage, path: &str) -> Result<Arc<dyn StorageFile>> {
    storage
        .open_read(path)
        .map_err(|error| Error::opening_named_file("file open", path, error))
}

/// Scans the last segment the checkpoint covers, the one a writable open builds on
/// (F-05-12): `Some` when it does not end in a clean seal (F-05-8 rows 13–15) at the end
/// the checkpoint recorded. Damage that is corruption wherever it lies (rows 10, 11) is the
/// error.
fn unclean_last_seal(
    storage: &dyn Storage,
    checkpoint: &Checkpoint,
) -> Result<Option<UncleanSeal>> {
    let Some(last) = checkpoint.segments.last() else {
        return Ok(None);
    };
    let bytes = read_segment(storage, last.id)?;
    let mut uncommitted = false;
    let mut seal_at_itself = true;
    let scan = scan_frames(&bytes, last.id, last.salt, |offset, record| {
        match record {
            Record::Commit { .. } => uncommitted = false,
            Record::Seal { used_bytes, .. } => seal_at_itself = used_bytes == offset,
            _ => uncommitted = true,
        }
        Ok(())
    })?;
    let reason = if !scan.sealed {
        let stop = scan.stop.map_or_else(
            || "no seal".to_string(),
            |stop| format!("{} at offset {}", stop.reason, stop.offset),
        );
        format!("its data ends at offset {} ({stop})", scan.valid_end)
    } else if scan.valid_end != last.end {
        format!("its seal ends at offset {}", scan.valid_end)
    } else if !seal_at_itself || uncommitted {
        "its seal does not close its last batch".to_string()
    } else {
        return Ok(None);
    };
    Ok(Some(UncleanSeal {
        segment: last.id,
        recorded_end: last.end,
        reason,
    }))
}

/// F-05-12: the checkpoint's last segment lost its seal (or the seal is torn). Recovery
/// runs as if there were no checkpoint, so a torn seal is repaired exactly as after a crash;
/// but the checkpoint still proves that every batch before that seal was durable, so a
/// segment that lost any of them is corruption, never a torn tail.
fn recover_past_unclean_seal(
    storage: &dyn Storage,
    manifest: &Manifest,
    unclean: UncleanSeal,
    access: Access,
) -> Result<Recovered> {
    let mut recovered = replay(storage, manifest, None, RecoveryReport::default(), access)?;
    let recorded_committed_end = unclean.recorded_end.saturating_sub(SEAL_FRAME_BYTES);
    let committed_end = recovered
        .tail
        .as_ref()
        .and_then(|tail| continued_end(tail, unclean.segment));
    if committed_end != Some(recorded_committed_end) {
        return Err(corrupt(
            unclean.segment,
            committed_end.unwrap_or(recorded_committed_end),
            &format!(
                "committed batches end here, but the checkpoint recorded them durable up to \
                 a seal at offset {recorded_committed_end}: {}",
                unclean.reason
            ),
        ));
    }
    recovered.report.checkpoint_ignored = Some(format!(
        "segment {} is not sealed where the checkpoint recorded: {}; recovered as after a crash",
        unclean.segment, unclean.reason
    ));
    recovered.report.checkpoint_distrusted = true;
    Ok(recovered)
}

/// Where appends (or the seal a writable open writes) continue in `segment`, if recovery
/// found it unsealed.
fn continued_end(tail: &LogTail, segment: u64) -> Option<u64> {
    if tail.segment == segment && !tail.sealed {
        return Some(tail.offset);
    }
    tail.seal_earlier
        .iter()
        .find(|torn| torn.segment == segment)
        .map(|torn| torn.committed_end)
}

/// How the replay of one segment ended.
enum SegmentEnd {
    Sealed {
        end: u64,
    },
    /// Unsealed: a clean end or a torn tail (rows 18, 19).
    Open {
        committed_end: u64,
        wipe_end: u64,
        torn_tail: Option<TornTail>,
    },
}

/// Replays the runs and segments the checkpoint (if any) does not cover.
fn replay(
    storage: &dyn Storage,
    manifest: &Manifest,
    checkpoint: Option<Checkpoint>,
    mut report: RecoveryReport,
    access: Access,
) -> Result<Recovered> {
    let (mut catalog, covered_runs, covered_segments, open) = match checkpoint {
        Some(checkpoint) => {
            report.checkpoint_used = true;
            (
                checkpoint.catalog,
                checkpoint.runs.len(),
                checkpoint.segments,
                checkpoint.open,
            )
        }
        None => (Catalog::default(), 0, Vec::new(), None),
    };
    report.checkpoint_open_prefix = open.map(|prefix| (prefix.id, prefix.end));
    for run in &manifest.runs[covered_runs..] {
        report.events += replay_run(storage, run, &mut catalog)?;
        report.runs_replayed += 1;
    }
    report.segments_covered = covered_segments.len();
    let mut tail = covered_segments.last().map(sealed_tail);
    let segments = &manifest.segments;
    for index in covered_segments.len()..segments.len() {
        let entry = segments[index];
        report.segments_scanned += 1;
        // The open prefix's segment follows the covered sealed ones (F-06-21): resumed there.
        let resume = open
            .filter(|prefix| prefix.id == entry.id)
            .map(|prefix| prefix.end);
        let replayed = replay_segment(
            storage,
            (segments, index, resume),
            &mut catalog,
            &mut report,
            access,
        )?;
        let (committed_end, wipe_end) = match replayed {
            SegmentEnd::Sealed { end } => {
                tail = Some(LogTail {
                    segment: entry.id,
                    salt: entry.salt,
                    offset: end,
                    sealed: true,
                    wipe_end: end,
                    seal_earlier: Vec::new(),
                });
                continue;
            }
            SegmentEnd::Open {
                committed_end,
                wipe_end,
                torn_tail,
            } => {
                report.torn_tail = torn_tail;
                (committed_end, wipe_end)
            }
        };
        tail = Some(LogTail {
            segment: entry.id,
            salt: entry.salt,
            offset: committed_end,
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
                committed_end,
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

/// Replays segment `segments[index]` into the catalog and says how it ends (F-05-8 rows
/// 10–19). A read-only open that would call a stop damage reads the segment again first and
/// continues from its committed end (F-05-13): a writer may have been writing it meanwhile.
fn replay_segment(
    storage: &dyn Storage,
    (segments, index, resume): (&[SegmentEntry], usize, Option<u64>),
    catalog: &mut Catalog,
    report: &mut RecoveryReport,
    access: Access,
) -> Result<SegmentEnd> {
    let entry = segments[index];
    let read = || match resume {
        Some(from) => read_segment_from(storage, entry.id, from),
        None => read_segment(storage, entry.id),
    };
    let mut bytes = read()?;
    check_header(&bytes, entry.id, entry.salt)?;
    // From an open prefix (F-06-27) the records that defined its sessions and types in
    // this segment lie before it: "held in this segment" (F-05-4) is not checked, as in a
    // catch-up (F-08-11).
    let mut progress = SegmentProgress {
        committed_end: resume.unwrap_or(SEGMENT_HEADER_BYTES),
        mid_segment: resume.is_some(),
        ..SegmentProgress::default()
    };
    let mut reads = 1;
    loop {
        let mut replay = SegmentReplay {
            pending: Vec::new(),
            progress,
        };
        let from = replay.progress.committed_end;
        let scan = scan_frames_from(&bytes, from, entry.id, entry.salt, |offset, record| {
            replay.accept(catalog, report, entry.id, offset, record)
        })?;
        if scan.sealed {
            if !replay.pending.is_empty() {
                return Err(corrupt(
                    entry.id,
                    scan.valid_end,
                    "records after the last commit before the seal",
                ));
            }
            return Ok(SegmentEnd::Sealed {
                end: scan.valid_end,
            });
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
        if !evidence {
            return Ok(replay.open_end(&bytes, entry.id, scan));
        }
        let reason = scan
            .stop
            .map(|stop| stop.reason)
            .unwrap_or_else(|| "segment ends without a seal before later data".to_string());
        let committed_end = replay.progress.committed_end;
        progress = replay.progress;
        if access.beside_a_writer() && reads < MAX_SEGMENT_READS {
            let fresh = read()?;
            fn after(segment: &[u8], offset: u64) -> Option<&[u8]> {
                usize::try_from(offset)
                    .ok()
                    .and_then(|end| segment.get(end..))
            }
            let unchanged = after(&fresh, committed_end) == after(&bytes, committed_end);
            if !unchanged {
                bytes = fresh;
                reads += 1;
                continue;
            }
        }
        return Err(corrupt(entry.id, stop_offset, &reason));
    }
}

/// A segment's bytes as [`read_segment`] reads them, but with only the header and the bytes
/// from `from` on read: the prefix a checkpoint covers (F-06-27) is left zero, unread. The
/// zeroed buffer costs no reading (the allocator maps zero pages).
fn read_segment_from(storage: &dyn Storage, id: u64, from: u64) -> Result<Vec<u8>> {
    use crate::storage::coding::{checked_usize, widen};
    let file = open_named(storage, &segment_path(id))?;
    let io = |error| Error::io("segment read", error);
    // Past the last data region the file reads as zeros (the preallocated rest): those
    // bytes are left out, which no scan can tell from reading them (every rule reads
    // zeros there as "nothing written", F-03-4), and they cost no reading.
    let length = checked_usize(file.data_end(from).map_err(io)?, "segment length")?;
    let header_end = checked_usize(SEGMENT_HEADER_BYTES, "segment header")?.min(length);
    let from = checked_usize(from, "open prefix end")?.clamp(header_end, length);
    let mut bytes = vec![0u8; length];
    let header_read = file.read_up_to(&mut bytes[..header_end], 0).map_err(io)?;
    if header_read < header_end {
        // Too short for a header: check_header says so.
        bytes.truncate(header_read);
        return Ok(bytes);
    }
    let read = file
        .read_up_to(&mut bytes[from..], widen(from))
        .map_err(io)?;
    // A file that shrank meanwhile (a writer trimming it, F-05-13) ends where it ends.
    bytes.truncate(from + read);
    Ok(bytes)
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
    let file = open_named(storage, &run_path(entry.id))?;
    let reader = RunReader::open(file, entry)?;
    let run = entry.id;
    let mut events = 0;
    for (index, block) in reader.index.blocks.iter().enumerate() {
        let raw = reader.block(index, None)?;
        let mut next_seq = block.first_seq;
        walk_block(&raw, block, &reader.index, |offset, _frame_bytes, item| {
            let bad = |reason: &str| run_corrupt(run, offset, reason);
            let record = match item {
                BlockItem::Row(row)
                    if row.session == block.session && block.session != DEFINITIONS_SESSION =>
                {
                    if row.first_seq != next_seq
                        || !catalog.type_names.contains_key(&row.type_number)
                    {
                        return Err(bad("row entry seq or type does not match its block"));
                    }
                    next_seq = next_seq
                        .checked_add(u64::from(row.member_count))
                        .ok_or_else(|| bad("row entry seqs overflow"))?;
                    return Ok(());
                }
                BlockItem::Row(_) => return Err(bad("row entry does not belong in this block")),
                BlockItem::Record(record) => record,
            };
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

/// What a batch's checks need of an event frame or of a row entry's first member.
struct RecordShape {
    session: u32,
    seq: u64,
    type_number: u32,
}

/// A frame of a batch that holds events: the first one's shape, the payload's size and
/// how many events it holds (1 for an event frame, the members of a row entry).
struct FrameEvents {
    first: RecordShape,
    payload_bytes: usize,
    count: u32,
}

impl<'a> SegmentReplay<'a> {
    /// The end of a segment whose scan stopped without evidence of damage: a clean end, or
    /// a torn tail of the bytes from the committed end to the last non-zero byte.
    fn open_end(&self, bytes: &[u8], segment: u64, scan: SegmentScan) -> SegmentEnd {
        let committed_end = self.progress.committed_end;
        let wipe_end = nonzero_end(bytes, committed_end);
        let dropped_events = self
            .pending
            .iter()
            .map(|(_, record)| match record {
                Record::Event(_) => 1,
                Record::Row(row) => u64::from(row.member_count),
                _ => 0,
            })
            .sum();
        let mut dropped_sessions: Vec<u32> = self
            .pending
            .iter()
            .filter_map(|(_, record)| match record {
                Record::Event(event) => Some(event.session),
                Record::Row(row) => Some(row.session),
                _ => None,
            })
            .collect();
        dropped_sessions.sort_unstable();
        dropped_sessions.dedup();
        let torn_tail = (wipe_end > committed_end).then(|| TornTail {
            segment,
            offset: committed_end,
            bytes: wipe_end - committed_end,
            dropped_events,
            dropped_sessions,
            reason: scan
                .stop
                .map(|stop| stop.reason)
                .unwrap_or_else(|| "incomplete batch".to_string()),
        });
        SegmentEnd::Open {
            committed_end,
            wipe_end,
            torn_tail,
        }
    }

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
                self.progress.committed_end = offset + COMMIT_FRAME_BYTES;
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
                    self.progress.defined_sessions.insert(number);
                }
                Record::TypeDefinition { type_number, name } => {
                    catalog
                        .define_type(type_number, name)
                        .map_err(|reason| corrupt(segment, offset, &reason))?;
                    self.progress.defined_types.insert(type_number);
                }
                Record::Row(row) => {
                    let frame = FrameEvents {
                        first: RecordShape {
                            session: row.session,
                            seq: row.first_seq,
                            type_number: row.type_number,
                        },
                        payload_bytes: row.payload_bytes(),
                        count: row.member_count,
                    };
                    next_seq =
                        self.index_events(catalog, (segment, offset), session, next_seq, frame)?;
                }
                Record::Event(event) => {
                    let frame = FrameEvents {
                        first: RecordShape {
                            session: event.session,
                            seq: event.seq,
                            type_number: event.type_number,
                        },
                        payload_bytes: event.payload_bytes(),
                        count: 1,
                    };
                    next_seq =
                        self.index_events(catalog, (segment, offset), session, next_seq, frame)?;
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
        if !self.progress.mid_segment && !self.progress.defined_sessions.contains(&session) {
            return Err(corrupt(
                segment,
                commit_offset,
                "commit names a session this segment does not define",
            ));
        }
        Ok(())
    }

    /// Checks a frame of the batch of `session` that holds `frame.count` events from
    /// `next_seq` on (an event frame, or a row entry, F-02-20) and indexes them at
    /// `(segment, offset)`; returns the seq after them.
    fn index_events(
        &self,
        catalog: &mut Catalog,
        (segment, offset): (u64, u64),
        session: u32,
        next_seq: u64,
        frame: FrameEvents,
    ) -> Result<u64> {
        self.check_event(&frame.first, session, next_seq)
            .map_err(|reason| corrupt(segment, offset, reason))?;
        let position = Position {
            segment,
            offset,
            frame_bytes: checked_u32(FRAME_HEADER_BYTES + frame.payload_bytes, "event frame")?,
        };
        catalog
            .push_events(session, next_seq, position, frame.count)
            .map_err(|reason| corrupt(segment, offset, &reason))?;
        next_seq
            .checked_add(u64::from(frame.count))
            .ok_or_else(|| corrupt(segment, offset, "event seqs overflow"))
    }

    fn check_event(
        &self,
        event: &RecordShape,
        session: u32,
        expected_seq: u64,
    ) -> std::result::Result<(), &'static str> {
        if event.session != session {
            return Err("event of another session inside a batch");
        }
        if event.seq != expected_seq {
            return Err("event seq is not the next in its batch");
        }
        if self.progress.mid_segment {
            return Ok(());
        }
        if !self.progress.defined_sessions.contains(&event.session) {
            return Err("event before its session header in this segment");
        }
        if !self.progress.defined_types.contains(&event.type_number) {
            return Err("event before its type definition in this segment");
        }
        Ok(())
    }
}
