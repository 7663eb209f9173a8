//! DSH exchange commands: import, export, messages, surface, repair, fork, info.

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use dshdb::db::{Options, Store};
use dshdb::exchange::{self, ImportReport};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Export formats.
#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// DSH `session.jsonl`.
    DshJsonl,
    /// DSH `session.jsonl.zstd` (one zstd frame per recorded batch).
    DshJsonlZstd,
}

fn open_writable(path: &Path) -> Result<Store> {
    Store::open(path, Options::default())
        .with_context(|| format!("cannot open store {}", path.display()))
}

fn is_session_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name == "session.jsonl" || name == "session.jsonl.zstd")
}

/// DSH session files under a sessions directory (`<root>/--project--/<id>/session.jsonl[.zstd]`).
fn session_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read directory {}", dir.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            session_files(&path, out)?;
        } else if is_session_file(&path) {
            out.push(path);
        }
    }
    Ok(())
}

fn import_file(store: &Store, path: &Path) -> Result<ImportReport> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let zstd = path.extension().is_some_and(|ext| ext == "zstd");
    let report = if zstd {
        exchange::import_dsh_jsonl_zstd(store, &bytes)
    } else {
        exchange::import_dsh_jsonl(store, &bytes)
    };
    report.with_context(|| format!("cannot import {}", path.display()))
}

pub fn import(store_path: &Path, paths: &[PathBuf], out: &mut impl Write) -> Result<()> {
    let store = open_writable(store_path)?;
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            session_files(path, &mut files)?;
        } else {
            files.push(path.clone());
        }
    }
    if files.is_empty() {
        bail!("no DSH session files found");
    }
    let mut failures = 0;
    for path in &files {
        if let Some(result) = crate::sqlite_import::try_import(&store, path, out) {
            if let Err(error) = result {
                failures += 1;
                eprintln!("dshdb: {error:#}");
            }
            continue;
        }
        match import_file(&store, path) {
            Ok(report) => {
                write!(
                    out,
                    "imported {}: {} events ({} lines, {} packed rows, {} verbatim",
                    report.session_id, report.events, report.lines, report.rows, report.verbatim
                )?;
                if report.frames > 0 {
                    write!(out, ", {} zstd frames", report.frames)?;
                }
                writeln!(out, ") from {}", path.display())?;
                if let Some(tail) = &report.dropped {
                    writeln!(
                        out,
                        "  dropped tail: {} bytes at offset {}: {}",
                        tail.bytes, tail.offset, tail.reason
                    )?;
                }
            }
            Err(error) => {
                failures += 1;
                eprintln!("dshdb: {error:#}");
            }
        }
    }
    store.close()?;
    if failures > 0 {
        bail!("{failures} of {} files were not imported", files.len());
    }
    Ok(())
}

pub fn export(
    store_path: &Path,
    session: &str,
    format: ExportFormat,
    output: Option<&Path>,
    out: &mut impl Write,
) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let bytes = match format {
        ExportFormat::DshJsonl => exchange::export_dsh_jsonl(&store, session)?,
        ExportFormat::DshJsonlZstd => exchange::export_dsh_jsonl_zstd(&store, session)?,
    };
    match output {
        Some(path) => std::fs::write(path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => out.write_all(&bytes)?,
    }
    Ok(())
}

pub fn messages(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let messages = exchange::messages(&store, session)?;
    writeln!(out, "{}", serde_json::to_string(&Value::Array(messages))?)?;
    Ok(())
}

pub fn surface(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let surface = exchange::surface(&store, session)?;
    writeln!(out, "{}", serde_json::to_string(&surface)?)?;
    Ok(())
}

pub fn repair(store_path: &Path, session: Option<&str>, out: &mut impl Write) -> Result<()> {
    let store = open_writable(store_path)?;
    let ids: Vec<String> = match session {
        Some(id) => vec![id.to_owned()],
        None => store
            .sessions()
            .into_iter()
            .map(|summary| summary.id)
            .collect(),
    };
    let mut failures = 0;
    for id in &ids {
        match exchange::repair(&store, id) {
            Ok(count) => writeln!(out, "{id}: appended {count} closers")?,
            Err(error) => {
                failures += 1;
                eprintln!("dshdb: {id}: {error}");
            }
        }
    }
    store.close()?;
    if failures > 0 {
        bail!("{failures} sessions could not be repaired");
    }
    Ok(())
}

pub fn fork(
    store_path: &Path,
    parent: &str,
    child: &str,
    at: u64,
    out: &mut impl Write,
) -> Result<()> {
    let store = open_writable(store_path)?;
    drop(store.fork(parent, at, child)?);
    let events = store.session(child)?.events;
    store.close()?;
    writeln!(
        out,
        "forked {child} from {parent} at seq {at} ({events} events)"
    )?;
    Ok(())
}

pub fn info(store_path: &Path, session: &str, out: &mut impl Write) -> Result<()> {
    let store = super::open_read_only(store_path)?;
    let summary = store.session(session)?;
    let events = store.read(session, 0, summary.events)?;
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for event in &events {
        *counts.entry(event.event_type.as_str()).or_default() += 1;
    }
    let header: Value = serde_json::from_str(&summary.header_json).unwrap_or(Value::Null);
    let mut lineage = Vec::new();
    let mut current = header.clone();
    while let Some(parent) = current.get("parentSession").and_then(Value::as_str) {
        let seed = current.get("seedLength").cloned().unwrap_or(Value::Null);
        lineage.push(serde_json::json!({"parent": parent, "seedLength": seed}));
        if lineage.len() > 1000 {
            break;
        }
        current = match store.session(parent) {
            Ok(parent) => serde_json::from_str(&parent.header_json).unwrap_or(Value::Null),
            Err(_) => break,
        };
    }
    let children: Vec<String> = store
        .sessions()
        .into_iter()
        .filter(|other| {
            serde_json::from_str::<Value>(&other.header_json)
                .ok()
                .and_then(|header| header.get("parentSession").cloned())
                .is_some_and(|parent| parent == session)
        })
        .map(|other| other.id)
        .collect();
    let info = serde_json::json!({
        "id": summary.id,
        "header": header,
        "events": summary.events,
        "types": counts,
        "lineage": lineage,
        "children": children,
    });
    writeln!(out, "{}", serde_json::to_string_pretty(&info)?)?;
    Ok(())
}
