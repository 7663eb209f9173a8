//! Store creation and the start of the log: a new store's first manifest and segment,
//! orphan removal, and continuing the log where recovery left it.

use super::{io_error, Options, LOCK_FILE, RESERVE_FILE};
use crate::error::{Error, Result};
use crate::limits::{DISK_FULL_RESERVE_BYTES, PREALLOCATION_RESERVE_BYTES};
use crate::storage::coding::checked_usize;
use crate::storage::commit::SharedLog;
use crate::storage::commit::{new_salt, Log, LogOptions};
use crate::storage::frame::Record;
use crate::storage::index::{CHECKPOINT_FILE, CHECKPOINT_TEMP_FILE, INDEX_DIR};
use crate::storage::io::{Storage, StorageFile};
use crate::storage::manifest::{Manifest, SegmentEntry, MANIFEST_FILE, MANIFEST_TEMP_FILE};
use crate::storage::multi::SHARED_FILE;
use crate::storage::recovery::{LogTail, RecoveryReport, TornSegment};
use crate::storage::run::{parse_run_name, RUNS_DIR};
use crate::storage::segment::{
    create_segment, parse_segment_name, segment_path, SEGMENT_HEADER_BYTES, WAL_DIR,
};
use std::path::Path;
use std::sync::Arc;

/// The entries a directory may hold and still become a store (F-01-4).
const STORE_NAMES: [&str; 7] = [
    LOCK_FILE,
    SHARED_FILE,
    MANIFEST_TEMP_FILE,
    WAL_DIR,
    RUNS_DIR,
    INDEX_DIR,
    RESERVE_FILE,
];

/// Refuses to create a store in a directory that holds anything else (F-01-4): a foreign
/// entry makes it `NotAStore`, segments, runs or a checkpoint without a manifest a damaged
/// store. Runs before the lock (which creates `LOCK`) and again under it.
pub(super) fn check_creatable(storage: &dyn Storage, label: &Path) -> Result<()> {
    let existing = storage.list("").map_err(io_error("store list"))?;
    let foreign = existing
        .iter()
        .any(|name| !STORE_NAMES.contains(&name.as_str()));
    if foreign {
        return Err(Error::NotAStore {
            path: label.to_path_buf(),
        });
    }
    let segments_left = storage
        .list(WAL_DIR)
        .map_err(io_error("store list"))?
        .iter()
        .any(|name| parse_segment_name(name).is_some())
        || storage
            .list(RUNS_DIR)
            .map_err(io_error("store list"))?
            .iter()
            .any(|name| parse_run_name(name).is_some())
        || storage
            .exists(CHECKPOINT_FILE)
            .map_err(io_error("store list"))?;
    if segments_left {
        // Segments, runs or a checkpoint without a MANIFEST are a damaged store, never a
        // new one (F-06-11): creating a
        // manifest here would make this very open delete every segment as an orphan.
        return Err(Error::CorruptFile {
            file: MANIFEST_FILE.to_string(),
            reason: format!("missing while {} holds segments", label.display()),
        });
    }
    Ok(())
}

/// [`check_creatable`] before the lock, which races with another process creating the
/// store under its lock: that one's `MANIFEST` may appear between the caller's look for it
/// and the listing, and its first segment after it. Creation writes `MANIFEST` before any
/// entry the check refuses, so a refusal with `MANIFEST` present now means the store was
/// created meanwhile: the open goes on to the lock, which decides (F-01-4, F-08-4). Without
/// this, one of several processes creating a store at once failed with `NotAStore`.
pub(super) fn check_creatable_before_lock(storage: &dyn Storage, label: &Path) -> Result<()> {
    let refusal = match check_creatable(storage, label) {
        Ok(()) => return Ok(()),
        Err(refusal) => refusal,
    };
    let created_meanwhile = storage
        .exists(MANIFEST_FILE)
        .map_err(io_error("store list"))?;
    if created_meanwhile {
        return Ok(());
    }
    Err(refusal)
}

/// Creates the store's first files (F-01-4 steps 2-4) in a directory that
/// [`check_creatable`] accepted under the lock.
pub(super) fn create_store(storage: &dyn Storage) -> Result<Manifest> {
    storage
        .create_dir(WAL_DIR)
        .map_err(io_error("store create"))?;
    storage.sync_dir("").map_err(io_error("directory sync"))?;
    let manifest = Manifest {
        segments: Vec::new(),
        runs: Vec::new(),
        next_segment_id: 1,
    };
    manifest.write(storage)?;
    Ok(manifest)
}

/// Takes back a store creation whose open failed after it (say, the first segment did not
/// fit on the disk): the manifest (and its temporary), `wal/` and its segments, and `LOCK`. Best effort:
/// what stays is at worst an empty store, which the next open takes as it is.
pub(super) fn undo_create(storage: &dyn Storage) {
    // Only segment files: the creation made no other kind, and anything else stays.
    for name in storage.list(WAL_DIR).unwrap_or_default() {
        if parse_segment_name(&name).is_some() {
            let _ = storage.remove(&format!("{WAL_DIR}/{name}"));
        }
    }
    let _ = storage.sync_dir(WAL_DIR);
    // The manifest goes (durably) before `wal/`: a power cut in between leaves a folder
    // without a manifest, which the next open creates again, never a manifest without the
    // `wal/` it needs.
    let _ = storage.remove(MANIFEST_FILE);
    let _ = storage.remove(MANIFEST_TEMP_FILE);
    let _ = storage.remove(RESERVE_FILE);
    let _ = storage.sync_dir("");
    let _ = storage.remove_dir(WAL_DIR);
    // The lock guard still holds the file open; removing the name is harmless on POSIX, and
    // there is no store left for another writer to race for.
    let _ = storage.remove(LOCK_FILE);
    let _ = storage.sync_dir("");
}

pub(super) fn remove_orphans(
    storage: &dyn Storage,
    manifest: &Manifest,
    report: &mut RecoveryReport,
) -> Result<()> {
    let mut removed = false;
    for name in storage.list(WAL_DIR).map_err(io_error("wal list"))? {
        let named = parse_segment_name(&name)
            .is_some_and(|id| manifest.segments.iter().any(|entry| entry.id == id));
        if !named && parse_segment_name(&name).is_some() {
            storage
                .remove(&format!("{WAL_DIR}/{name}"))
                .map_err(io_error("orphan remove"))?;
            report.orphan_segments.push(name);
            removed = true;
        }
    }
    if removed {
        storage
            .sync_dir(WAL_DIR)
            .map_err(io_error("directory sync"))?;
    }
    let mut removed_runs = false;
    for name in storage.list(RUNS_DIR).map_err(io_error("runs list"))? {
        let named = parse_run_name(&name)
            .is_some_and(|id| manifest.runs.iter().any(|entry| entry.id == id));
        if !named && parse_run_name(&name).is_some() {
            storage
                .remove(&format!("{RUNS_DIR}/{name}"))
                .map_err(io_error("orphan remove"))?;
            report.orphan_runs.push(name);
            removed_runs = true;
        }
    }
    if removed_runs {
        storage
            .sync_dir(RUNS_DIR)
            .map_err(io_error("directory sync"))?;
    }
    for temporary in [MANIFEST_TEMP_FILE, CHECKPOINT_TEMP_FILE] {
        if storage.exists(temporary).map_err(io_error("store list"))? {
            storage.remove(temporary).map_err(io_error("temp remove"))?;
        }
    }
    Ok(())
}

/// Removes a checkpoint that recovery found stale (F-05-12) and makes the removal durable,
/// before the open writes anything: otherwise a later open would trust it for a segment
/// this one goes on writing.
pub(super) fn discard_checkpoint(storage: &dyn Storage) -> Result<()> {
    if storage
        .exists(CHECKPOINT_FILE)
        .map_err(io_error("checkpoint lookup"))?
    {
        storage
            .remove(CHECKPOINT_FILE)
            .map_err(io_error("checkpoint remove"))?;
        storage
            .sync_dir(INDEX_DIR)
            .map_err(io_error("directory sync"))?;
    }
    Ok(())
}

/// Continues the log where recovery left it: wipes a torn tail, seals a torn segment that is
/// no longer the last, or starts a fresh segment after a clean close.
pub(super) fn start_log(
    storage: &Arc<dyn Storage>,
    options: &Options,
    mut manifest: Manifest,
    tail: Option<LogTail>,
    multi: Option<SharedLog>,
) -> Result<Log> {
    let log_options = LogOptions {
        segment_bytes: options.segment_bytes,
        max_pending_bytes: options.max_pending_bytes,
        max_batch_bytes: options.max_batch_bytes,
    };
    if let Some(tail) = tail.filter(|tail| !tail.sealed) {
        let file = storage
            .open(&segment_path(tail.segment), false)
            .map_err(io_error("segment open"))?;
        if tail.wipe_end > tail.offset {
            let zeros = vec![0; checked_usize(tail.wipe_end - tail.offset, "torn tail length")?];
            file.write_at(&zeros, tail.offset)
                .map_err(io_error("torn tail wipe"))?;
        }
        // The previous process may have left Buffered or Batched writes unsynced: make what
        // recovery kept durable before new commits claim it as their durable offset.
        file.sync_data().map_err(io_error("tail sync"))?;
        for torn in &tail.seal_earlier {
            seal_torn_segment(storage.as_ref(), torn)?;
        }
        return Log::start_with(
            storage.clone(),
            log_options,
            manifest,
            (file, tail.segment, tail.salt, tail.offset),
            multi,
        );
    }
    let (file, SegmentEntry { id, salt }) =
        match start_segment(storage.as_ref(), options, &mut manifest) {
            Err(Error::DiskFull { .. }) if release_reserve(storage.as_ref())? => {
                // The disk was full: the reserve's space lets the log start (F-01-9).
                start_segment(storage.as_ref(), options, &mut manifest)?
            }
            started => started?,
        };
    Log::start_with(
        storage.clone(),
        log_options,
        manifest,
        (file, id, salt, SEGMENT_HEADER_BYTES),
        multi,
    )
}

/// Creates the next segment and the manifest naming it, and returns the segment; on
/// failure nothing of it stays (unless the new manifest may already be durable) and
/// `manifest` is unchanged.
fn start_segment(
    storage: &dyn Storage,
    options: &Options,
    manifest: &mut Manifest,
) -> Result<(Arc<dyn StorageFile>, SegmentEntry)> {
    let id = manifest.next_segment_id;
    let salt = new_salt();
    let file = create_segment(storage, id, salt, options.segment_bytes)?;
    let mut next = manifest.clone();
    next.segments.push(SegmentEntry { id, salt });
    next.next_segment_id = id + 1;
    if let Err(failure) = next.write_reporting_stage(storage) {
        // After the rename the new manifest may be durable: then the file must stay.
        if !failure.after_rename {
            let _ = storage.remove(&segment_path(id));
        }
        return Err(failure.error);
    }
    *manifest = next;
    Ok((file, SegmentEntry { id, salt }))
}

/// Removes the `RESERVE` file, durably, to give its space to the log (F-01-9). Returns
/// whether there was one.
fn release_reserve(storage: &dyn Storage) -> Result<bool> {
    if !storage
        .exists(RESERVE_FILE)
        .map_err(io_error("store list"))?
    {
        return Ok(false);
    }
    storage
        .remove(RESERVE_FILE)
        .map_err(io_error("reserve remove"))?;
    storage.sync_dir("").map_err(io_error("directory sync"))?;
    Ok(true)
}

/// Writes the `RESERVE` file when it is missing and the disk reports room for it beyond the
/// preallocation reserve (F-01-9). Best effort: without it only a disk with no byte free
/// stops a writable open, so a failure here is not the caller's.
pub(super) fn keep_reserve(storage: &dyn Storage) {
    if storage.exists(RESERVE_FILE).unwrap_or(true) {
        return;
    }
    // Only where the storage reports its free space: one that cannot tell (the simulated
    // disk without a capacity) has no full disk to keep space for.
    let room = DISK_FULL_RESERVE_BYTES + PREALLOCATION_RESERVE_BYTES;
    if !matches!(storage.available_bytes(), Ok(Some(free)) if free >= room) {
        return;
    }
    let written = usize::try_from(DISK_FULL_RESERVE_BYTES)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        .and_then(|length| {
            let file = storage.open(RESERVE_FILE, true)?;
            // Real bytes, not a sparse hole: the space must be the store's.
            file.write_at(&vec![0; length], 0)?;
            file.sync_data()?;
            storage.sync_dir("")
        });
    if written.is_err() {
        let _ = storage.remove(RESERVE_FILE);
    }
}

/// Recovery found the tail in an older segment than the newest one (a crash right after a
/// roll). Seal that older segment at its committed end so that the newest can take data.
pub(super) fn seal_torn_segment(storage: &dyn Storage, torn: &TornSegment) -> Result<()> {
    let mut patch = Vec::new();
    Record::Seal {
        used_bytes: torn.committed_end,
        durable_offset: torn.committed_end,
    }
    .encode(&mut patch, torn.salt)?;
    let wiped = torn.wipe_end.saturating_sub(torn.committed_end);
    if (patch.len() as u64) < wiped {
        patch.resize(checked_usize(wiped, "torn segment wipe length")?, 0);
    }
    let file = storage
        .open(&segment_path(torn.segment), false)
        .map_err(io_error("segment open"))?;
    file.write_at(&patch, torn.committed_end)
        .map_err(io_error("seal write"))?;
    file.sync_data().map_err(io_error("seal sync"))
}
