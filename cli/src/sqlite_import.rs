//! `dshdb import` of a DSH SQLite session store (detected by the SQLite magic header).

use anyhow::{Context, Result};
use dshdb::exchange::sqlite::{import_dsh_sqlite, is_sqlite, SQLITE_MAGIC};
use dshdb::Store;
use std::io::{Read, Write};
use std::path::Path;

/// Imports every session of `path` when it is a SQLite database; `None` when it is not.
pub fn try_import(store: &Store, path: &Path, out: &mut impl Write) -> Option<Result<()>> {
    let mut magic = [0u8; SQLITE_MAGIC.len()];
    let mut file = std::fs::File::open(path).ok()?;
    file.read_exact(&mut magic).ok()?;
    if !is_sqlite(&magic) {
        return None;
    }
    Some(import(store, path, out))
}

fn import(store: &Store, path: &Path, out: &mut impl Write) -> Result<()> {
    let reports = import_dsh_sqlite(store, path)
        .with_context(|| format!("cannot import {}", path.display()))?;
    for report in &reports {
        writeln!(
            out,
            "imported {}: {} events ({} rows, {} packed rows) from {}",
            report.session_id,
            report.events,
            report.lines,
            report.rows,
            path.display()
        )?;
        if let Some(tail) = &report.dropped {
            crate::exchange::print_dropped_tail(tail, out)?;
        }
    }
    Ok(())
}
