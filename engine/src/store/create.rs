//! Store creation and the start of the log: a new store's first manifest and segment,
//! orphan removal, and continuing the log where recovery left it.

use super::{io_error, Options, LOCK_FILE};
use crate::error::{Error, Result};
use crate::storage::commit::{new_salt, Log, LogOptions};
use crate::storage::frame::Record;
use crate::storage::index::{CHECKPOINT_FILE, CHECKPOINT_TEMP_FILE, INDEX_DIR};
use crate::storage::io::Storage;
use crate::storage::manifest::{Manifest, SegmentEntry, MANIFEST_FILE, MANIFEST_TEMP_FILE};
use crate::storage::recovery::{LogTail, RecoveryReport, TornSegment};
use crate::storage::run::{parse_run_name, RUNS_DIR};
use crate::storage::segment::{
    create_segment, parse_segment_name, segment_path, SEGMENT_HEADER_BYTES, WAL_DIR,
};
use std::path::Path;
use std::sync::Arc;

pub(super) fn create_store(storage: &dyn Storage, label: &Path) -> Result<Manifest> {
    let existing = storage.list("").map_err(io_error("store list"))?;
    let store_names = [LOCK_FILE, MANIFEST_TEMP_FILE, WAL_DIR, RUNS_DIR, INDEX_DIR];
    let foreign = existing
        .iter()
        .any(|name| !store_names.contains(&name.as_str()));
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
            let zeros = vec![0; (tail.wipe_end - tail.offset) as usize];
            file.write_at(&zeros, tail.offset)
                .map_err(io_error("torn tail wipe"))?;
        }
        // The previous process may have left Buffered or Batched writes unsynced: make what
        // recovery kept durable before new commits claim it as their durable offset.
        file.sync_data().map_err(io_error("tail sync"))?;
        for torn in &tail.seal_earlier {
            seal_torn_segment(storage.as_ref(), torn)?;
        }
        return Ok(Log::start(
            storage.clone(),
            log_options,
            manifest,
            file,
            tail.segment,
            tail.salt,
            tail.offset,
        ));
    }
    let id = manifest.next_segment_id;
    let salt = new_salt();
    let file = create_segment(storage.as_ref(), id, salt, options.segment_bytes)?;
    manifest.segments.push(SegmentEntry { id, salt });
    manifest.next_segment_id = id + 1;
    if let Err(failure) = manifest.write_reporting_stage(storage.as_ref()) {
        // After the rename the new manifest may be durable: then the file must stay.
        if !failure.after_rename {
            let _ = storage.remove(&segment_path(id));
        }
        return Err(failure.error);
    }
    Ok(Log::start(
        storage.clone(),
        log_options,
        manifest,
        file,
        id,
        salt,
        SEGMENT_HEADER_BYTES,
    ))
}

/// Recovery found the tail in an older segment than the newest one (a crash right after a
/// roll). Seal that older segment at its committed end so that the newest can take data.
pub(super) fn seal_torn_segment(storage: &dyn Storage, torn: &TornSegment) -> Result<()> {
    let mut patch = Vec::new();
    Record::Seal {
        used_bytes: torn.committed_end,
        durable_offset: torn.committed_end,
    }
    .encode(&mut patch, torn.salt);
    let wiped = torn.wipe_end.saturating_sub(torn.committed_end);
    if (patch.len() as u64) < wiped {
        patch.resize(wiped as usize, 0);
    }
    let file = storage
        .open(&segment_path(torn.segment), false)
        .map_err(io_error("segment open"))?;
    file.write_at(&patch, torn.committed_end)
        .map_err(io_error("seal write"))?;
    file.sync_data().map_err(io_error("seal sync"))
}
