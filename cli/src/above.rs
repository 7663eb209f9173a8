//! Commands above the log: projections, spill blobs, compaction and pruning.

use crate::open_existing;
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use dshdb::compaction::{
    collect_spill, compact, prune_session, CompactionOwner, PrunerConfig, SummaryInput,
};
use dshdb::derive::cache::{BuiltinUnits, CacheOptions, ProjectionCache};
use dshdb::derive::projection::{TokenEncoding, TokenMeterUnit};
use dshdb::spill::{BlobHash, SpillStore};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum AboveCommand {
    /// Spill blobs: oversized payloads stored outside the log (`dshdb-spill:<hash>`).
    Spill {
        #[command(subcommand)]
        action: SpillCommand,
    },
    /// Compact the surface span --start..=--end of SESSION into the summary text in
    /// --summary-file (one atomic batch of compaction/start, summary, checkpoint, end).
    Compact {
        /// Store directory.
        store: PathBuf,
        /// Session to compact.
        session: String,
        /// First surface seq of the span: the seq of a visible surface node (see
        /// `dshdb surface`), inclusive.
        #[arg(long, value_name = "SEQ")]
        start: u64,
        /// Last surface seq of the span, inclusive.
        #[arg(long, value_name = "SEQ")]
        end: u64,
        /// File holding the summary text (trailing whitespace is trimmed).
        #[arg(long, value_name = "F")]
        summary_file: PathBuf,
        /// Provider recorded in compaction/summary.
        #[arg(long, default_value = "manual")]
        provider: String,
        /// Model recorded in compaction/summary.
        #[arg(long, default_value = "manual")]
        model: String,
    },
    /// Prune oversized tool results of SESSION (DSH defaults 8192/4096/1024 code points),
    /// spilling their full text.
    Prune {
        /// Store directory.
        store: PathBuf,
        /// Session to prune.
        session: String,
        /// Do not keep the full text as a spill blob.
        #[arg(long)]
        no_spill: bool,
    },
    /// Print SESSION's projections from the cache (surface size, tokens, stats, turns).
    Project {
        /// Store directory.
        store: PathBuf,
        /// Session to project.
        session: String,
        /// Token encoding of the meter.
        #[arg(long, default_value = "o200k_base", value_parser = ["o200k_base", "cl100k_base"])]
        encoding: String,
    },
}

#[derive(Subcommand)]
pub enum SpillCommand {
    /// Write a blob (whole, or --length bytes from --offset) to stdout or -o FILE.
    Get {
        /// Store directory.
        store: PathBuf,
        /// `dshdb-spill:<hash>` or the 64-digit hash.
        locator: String,
        /// First byte of the blob to write.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to write (default: to the end of the blob).
        #[arg(long)]
        length: Option<u64>,
        /// Write to FILE instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List blobs: locator, raw bytes, stored bytes.
    Ls {
        /// Store directory.
        store: PathBuf,
    },
    /// Remove blobs no event cites.
    Gc {
        /// Store directory.
        store: PathBuf,
    },
}

pub fn run(command: AboveCommand, out: &mut impl Write) -> Result<()> {
    match command {
        AboveCommand::Spill { action } => spill(action, out),
        AboveCommand::Compact {
            store,
            session,
            start,
            end,
            summary_file,
            provider,
            model,
        } => {
            let text = std::fs::read_to_string(&summary_file)
                .with_context(|| format!("cannot read {}", summary_file.display()))?;
            let summary = SummaryInput::text(text.trim_end(), &provider, &model);
            let store = open_existing(&store, false)?;
            let cache = ProjectionCache::new(&store, CacheOptions::default());
            let mut writer = store.writer(&session)?;
            let result = compact(
                &cache,
                &mut writer,
                start,
                end,
                CompactionOwner::Manual,
                &summary,
            )?;
            drop(writer);
            store.close()?;
            let report = json!({"compactionId": result.compaction_id, "startSeq": result.start_seq,
                "summarySeq": result.summary_seq, "replacementSeq": result.replacement_seq,
                "endSeq": result.end_seq, "shadowedSeqs": result.shadowed_seqs,
                "shadowedTokenCount": result.shadowed_token_count});
            writeln!(out, "{report}")?;
            Ok(())
        }
        AboveCommand::Prune {
            store,
            session,
            no_spill,
        } => {
            let store = open_existing(&store, false)?;
            let cache = ProjectionCache::new(&store, CacheOptions::default());
            let spill = SpillStore::new(store.storage());
            let mut writer = store.writer(&session)?;
            let spill = (!no_spill).then_some(&spill);
            let report = prune_session(&cache, &mut writer, spill, &PrunerConfig::default())?;
            drop(writer);
            store.close()?;
            for pruned in &report.pruned {
                let locator = pruned.spilled.map(|hash| hash.locator());
                let line = json!({"originalSeq": pruned.original_seq,
                    "replacementSeq": pruned.replacement_seq, "callId": pruned.call_id,
                    "charsBefore": pruned.chars_before, "charsAfter": pruned.chars_after,
                    "spilled": locator});
                writeln!(out, "{line}")?;
            }
            writeln!(out, "{}", json!({"charsRemoved": report.chars_removed}))?;
            Ok(())
        }
        AboveCommand::Project {
            store,
            session,
            encoding,
        } => {
            let Some(encoding) = TokenEncoding::from_name(&encoding) else {
                bail!("unknown token encoding {encoding:?} (o200k_base or cl100k_base)");
            };
            // Read-only: a projection needs no writer lock (the cache is not written then).
            let store = open_existing(&store, true)?;
            let units = BuiltinUnits {
                tokens: TokenMeterUnit::new(encoding),
                ..BuiltinUnits::default()
            };
            let cache = ProjectionCache::with_units(&store, CacheOptions::default(), units);
            let (builtins, report) = cache.read_builtins(&session)?;
            store.close()?;
            let turns = &builtins.turns;
            let line = json!({"events": builtins.length,
                "surfaceNodes": builtins.surface.nodes().len(),
                "replaceGeneration": builtins.surface.replace_generation(),
                "messages": builtins.messages.message_texts().len(),
                "tokens": {"encoding": cache.units().tokens.encoding().name(), "total": builtins.tokens.total},
                "byType": builtins.stats.by_type, "usage": builtins.stats.usage,
                "turns": turns.turns.len(), "openTurn": turns.open_turn(),
                "liveCompactionStart": turns.live_compaction_start(),
                "staleCompactionStart": turns.stale_compaction_start(),
                "cache": {"foldedEvents": report.folded_events, "discarded": report.discarded,
                          "written": report.written}});
            writeln!(out, "{line}")?;
            Ok(())
        }
    }
}

/// Refuses an output file inside the store directory: writing there could overwrite the
/// manifest, a segment or a blob (`spill get -o STORE/MANIFEST`).
pub(crate) fn refuse_output_inside_store(store: &Path, output: &Path) -> Result<()> {
    let Ok(store) = store.canonicalize() else {
        // No such store: opening it fails with its own error.
        return Ok(());
    };
    // The output may not exist yet: resolve its folder, then add the name back.
    let folder = match output.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Ok(folder) = folder.canonicalize() else {
        return Ok(());
    };
    let resolved = match output.file_name() {
        Some(name) => folder.join(name),
        None => folder,
    };
    let resolved = resolved.canonicalize().unwrap_or(resolved);
    if resolved.starts_with(&store) {
        bail!(
            "refusing to write {} inside the store directory {}; choose a path outside it",
            output.display(),
            store.display()
        );
    }
    Ok(())
}

fn spill(action: SpillCommand, out: &mut impl Write) -> Result<()> {
    match action {
        SpillCommand::Get {
            store,
            locator,
            offset,
            length,
            output,
        } => {
            let Some(hash) = BlobHash::parse(&locator) else {
                bail!("not a spill locator or hash: {locator:?}");
            };
            if let Some(path) = &output {
                refuse_output_inside_store(&store, path)?;
            }
            let store = open_existing(&store, true)?;
            let spill = SpillStore::new_read_only(store.storage());
            let bytes = match length {
                None if offset == 0 => spill.get(&hash)?,
                length => {
                    let size = spill.verify(&hash)?.raw_bytes;
                    if offset >= size && size > 0 {
                        bail!(
                            "--offset {offset} is past the end of blob {} ({size} bytes; \
                             offsets run from 0 to {})",
                            hash.locator(),
                            size - 1
                        );
                    }
                    spill.get_range(&hash, offset, length.unwrap_or(u64::MAX))?
                }
            };
            match output {
                Some(path) => std::fs::write(&path, &bytes)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => out.write_all(&bytes)?,
            }
            Ok(())
        }
        SpillCommand::Ls { store } => {
            let store_handle = open_existing(&store, true)?;
            let blobs = SpillStore::new_read_only(store_handle.storage()).list()?;
            if blobs.is_empty() {
                eprintln!("dshdb: no spill blobs in {}", store.display());
            }
            for blob in blobs {
                let locator = blob.hash.locator();
                writeln!(out, "{locator}\t{}\t{}", blob.raw_bytes, blob.stored_bytes)?;
            }
            Ok(())
        }
        SpillCommand::Gc { store } => {
            let store = open_existing(&store, false)?;
            let report = collect_spill(&store, &SpillStore::new(store.storage()))?;
            store.close()?;
            let removed: Vec<String> = report.removed.iter().map(BlobHash::locator).collect();
            let line = json!({"removed": removed, "kept": report.kept,
                "tempRemoved": report.temp_removed});
            writeln!(out, "{line}")?;
            Ok(())
        }
    }
}
