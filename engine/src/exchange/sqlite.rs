//! Import of DSH's SQLite session store (persistence §3, schema 17).
//!
//! Every session of the database is rendered as the DSH JSONL plaintext its rows stand for
//! (header per `toHeaderLine`, one line per physical row: a scalar row as its event in
//! `Session.append` key order, a packed row (`ignorable = 0`) as the equivalent JSONL packed
//! chunk row), then scanned, validated and stored exactly as [`super::import_dsh_jsonl`]
//! does. So stored `data` is the row's exact JSON text, packed members are flagged as a row
//! and a later [`super::export_dsh_jsonl`] writes what DSH's JSONL writer would.
//!
//! All sessions are validated before any is written: an invalid session refuses the whole
//! import with DSH's text and nothing is stored.

use super::{import_scanned, scan, DroppedTail, ExchangeError, ImportReport};
use crate::session::restore_session;
use crate::store::{now_millis, Store, MAX_EVENT_DATA_BYTES};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use std::io::Read;
use std::path::Path;

/// The schema version (`user_version`) this importer reads.
pub const DSH_SQLITE_SCHEMA_VERSION: i64 = 17;
/// DSH's `application_id` ("DSHP").
pub const DSH_SQLITE_APPLICATION_ID: i64 = 0x4453_4850;
/// The SQLite file magic.
pub const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
use crate::limits::MAX_PACKED_DATA_BYTES;
use crate::limits::MAX_PACKED_ROW_MEMBERS;
use crate::limits::MIN_PACKED_ROW_MEMBERS;

/// Why a SQLite import failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteImportError {
    /// The file cannot be opened as a SQLite database.
    #[error("cannot open SQLite session store {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    /// `user_version` is not the supported schema version.
    #[error("SQLite session store {path} has schema version {found}, incompatible with this build ({expected})")]
    SchemaVersion {
        path: String,
        found: i64,
        expected: i64,
    },
    /// `application_id` is not DSH's.
    #[error("SQLite session store {path} has application id {found:#x}, expected {expected:#x}")]
    ApplicationId {
        path: String,
        found: i64,
        expected: i64,
    },
    /// A `sessions` row is not a valid DSH session row.
    #[error("SQLite session store: invalid session row {session:?}: {reason}")]
    SessionRow { session: String, reason: String },
    /// Reading the database failed.
    #[error("SQLite session store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// DSH refuses a session (its text), or storing it failed.
    #[error("{source}")]
    Session {
        session: String,
        source: ExchangeError,
    },
}

pub type Result<T, E = SqliteImportError> = std::result::Result<T, E>;

/// Whether `bytes` start with the SQLite file magic.
pub fn is_sqlite(bytes: &[u8]) -> bool {
    bytes.starts_with(SQLITE_MAGIC)
}

/// Imports every session of a DSH SQLite store (schema 17), in `sessions` rowid order.
/// Validates all sessions first (as DSH's cold load does); on a refusal nothing is written.
pub fn import_dsh_sqlite(store: &Store, path: &Path) -> Result<Vec<ImportReport>> {
    let display = path.display().to_string();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| SqliteImportError::Open {
        path: display.clone(),
        source,
    })?;
    let user_version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|source| SqliteImportError::Open {
            path: display.clone(),
            source,
        })?;
    if user_version != DSH_SQLITE_SCHEMA_VERSION {
        return Err(SqliteImportError::SchemaVersion {
            path: display,
            found: user_version,
            expected: DSH_SQLITE_SCHEMA_VERSION,
        });
    }
    let application_id: i64 = conn.query_row("PRAGMA application_id", [], |row| row.get(0))?;
    if application_id != DSH_SQLITE_APPLICATION_ID {
        return Err(SqliteImportError::ApplicationId {
            path: display,
            found: application_id,
            expected: DSH_SQLITE_APPLICATION_ID,
        });
    }
    // One read transaction, so both passes see the same snapshot.
    conn.execute_batch("BEGIN")?;
    let ids = session_ids(&conn)?;
    // Pass 1: validate every session without writing.
    for id in &ids {
        let log = session_log(&conn, id)?;
        let refused = |source: ExchangeError| SqliteImportError::Session {
            session: id.clone(),
            source,
        };
        let scanned =
            scan::scan(log.text.as_bytes()).map_err(|error| refused(log.physical_error(error)))?;
        restore_session(&scanned.session_id, &scanned.events(), now_millis())
            .map_err(|error| refused(error.into()))?;
        if store.session(&scanned.session_id).is_ok() {
            return Err(refused(ExchangeError::Refused(format!(
                "session {} already exists in the store",
                scanned.session_id
            ))));
        }
    }
    // Pass 2: store them.
    let mut reports = Vec::with_capacity(ids.len());
    for id in &ids {
        let log = session_log(&conn, id)?;
        let refused = |source: ExchangeError| SqliteImportError::Session {
            session: id.clone(),
            source,
        };
        let scanned =
            scan::scan(log.text.as_bytes()).map_err(|error| refused(log.physical_error(error)))?;
        let mut report = import_scanned(store, &scanned, &[], 0).map_err(refused)?;
        report.dropped = report.dropped.map(|tail| log.physical_tail(tail));
        reports.push(report);
    }
    conn.execute_batch("COMMIT")?;
    Ok(reports)
}

fn session_ids(conn: &Connection) -> Result<Vec<String>> {
    let mut statement = conn.prepare("SELECT id FROM sessions ORDER BY rowid")?;
    let rows = statement.query_map([], |row| row.get::<_, String>(0))?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// A session rendered as DSH JSONL plaintext.
struct SessionLog {
    text: String,
    /// Physical first seq of each record line (line 1 is the first after the header).
    line_seqs: Vec<i64>,
}

impl SessionLog {
    /// Restates a dropped tail of the rendered plaintext as the physical rows it stands for:
    /// DSH's `scanRows` drops every row from the first bad one after the last `turn/end`
    /// (§5.4), and the user should learn which rows and why.
    fn physical_tail(&self, tail: DroppedTail) -> DroppedTail {
        // A tail offset past the text (or past memory) has no line before it in the text.
        let lines_before = usize::try_from(tail.offset)
            .ok()
            .and_then(|offset| self.text.as_bytes().get(..offset))
            .map_or(0, |head| head.iter().filter(|&&byte| byte == b'\n').count());
        // The header is the first line; record lines follow it.
        let first_row = lines_before.saturating_sub(1);
        let rows = self.line_seqs.len().saturating_sub(first_row);
        let reason = match self.line_seqs.get(first_row) {
            Some(seq) => format!(
                "{rows} physical rows from seq {seq} dropped (torn tail): {}",
                tail.reason
            ),
            None => tail.reason.clone(),
        };
        DroppedTail { reason, ..tail }
    }

    /// Rewrites a scan refusal naming a line into scanRows' physical-row text (§5.4).
    fn physical_error(&self, error: ExchangeError) -> ExchangeError {
        let ExchangeError::Refused(text) = &error else {
            return error;
        };
        let line = [
            "corrupt session log: unparsable committed event at line ",
            "corrupt session log: seq gap in committed region at line ",
        ]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|number| number.parse::<usize>().ok());
        match line.and_then(|line| self.line_seqs.get(line.checked_sub(1)?)) {
            Some(seq) => ExchangeError::Refused(format!(
                "corrupt session log: invalid committed physical row at seq {seq}"
            )),
            None => error,
        }
    }
}

fn json_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// The header line (`toHeaderLine` key order, §2.3) of a `sessions` row.
fn header_line(conn: &Connection, id: &str) -> Result<String> {
    let invalid = |reason: &str| SqliteImportError::SessionRow {
        session: id.to_owned(),
        reason: reason.to_owned(),
    };
    conn.query_row(
        "SELECT version, created_at, cwd, parent_session, seed_length, origin, \
         delegation_depth, agent_preset FROM sessions WHERE id = ?1",
        [id],
        |row| {
            let version: i64 = row.get(0)?;
            let created_at: i64 = row.get(1)?;
            let cwd: Option<String> = row.get(2)?;
            let parent: Option<String> = row.get(3)?;
            let seed_length: Option<i64> = row.get(4)?;
            let origin: Option<String> = row.get(5)?;
            let depth: Option<i64> = row.get(6)?;
            let preset: Option<String> = row.get(7)?;
            let mut line = format!(
                "{{\"type\":\"session\",\"version\":{version},\"id\":{},\"createdAt\":{created_at}",
                json_string(id)
            );
            if let Some(cwd) = cwd {
                line.push_str(&format!(",\"cwd\":{}", json_string(&cwd)));
            }
            if let Some(parent) = parent {
                line.push_str(&format!(",\"parentSession\":{}", json_string(&parent)));
            }
            if let Some(seed_length) = seed_length {
                line.push_str(&format!(",\"seedLength\":{seed_length}"));
            }
            if let Some(origin) = origin {
                line.push_str(&format!(",\"origin\":{}", json_string(&origin)));
            }
            line.push_str(&format!(",\"delegationDepth\":{}", depth.unwrap_or(0)));
            if let Some(preset) = preset {
                line.push_str(&format!(",\"agentPreset\":{}", json_string(&preset)));
            }
            line.push('}');
            Ok(line)
        },
    )
    .map_err(|error| match error {
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..) => {
            invalid(&error.to_string())
        }
        other => SqliteImportError::Sqlite(other),
    })
}

/// Reads a session's rows and renders its JSONL plaintext. A row that does not decode
/// becomes an unparsable line, so DSH's committed-region rule decides its fate.
fn session_log(conn: &Connection, id: &str) -> Result<SessionLog> {
    let mut text = header_line(conn, id)?;
    text.push('\n');
    let mut line_seqs = Vec::new();
    let mut statement = conn.prepare_cached(
        "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable \
         FROM events WHERE session_id = ?1 ORDER BY seq",
    )?;
    let mut rows = statement.query([id])?;
    while let Some(row) = rows.next()? {
        let seq = row.get_ref(0)?.as_i64().unwrap_or(-1);
        line_seqs.push(seq);
        match row_line(row) {
            // A raw newline inside the JSON text would split the line; such a row is
            // treated as undecodable.
            Some(line) if !line.contains('\n') => text.push_str(&line),
            _ => text.push('{'),
        }
        text.push('\n');
        if text.len() as u64 > super::MAX_IMPORT_PLAINTEXT_BYTES {
            return Err(SqliteImportError::Session {
                session: id.to_owned(),
                source: ExchangeError::TooLarge {
                    reason: format!(
                        "the session's rows exceed the import limit of {} bytes",
                        super::MAX_IMPORT_PLAINTEXT_BYTES
                    ),
                },
            });
        }
    }
    Ok(SessionLog { text, line_seqs })
}

/// One physical row as the JSONL line it stands for, or `None` when it does not decode.
fn row_line(row: &rusqlite::Row<'_>) -> Option<String> {
    let seq = row.get_ref(0).ok()?.as_i64().ok()?;
    let event_type = row.get_ref(1).ok()?.as_str().ok()?;
    let time = row.get_ref(2).ok()?.as_i64().ok()?;
    let data = row.get_ref(3).ok()?;
    let sources = row.get_ref(4).ok()?;
    let surface = row.get_ref(5).ok()?;
    let ignorable = row.get_ref(6).ok()?;
    if seq < 0 || event_type.is_empty() {
        return None;
    }
    if let ValueRef::Integer(0) = ignorable {
        // Packed row (§3.4): chunk tag, no surface columns, bounded data.
        if super::scan::RowTag::from_tag(event_type).is_none()
            || !matches!(sources, ValueRef::Null)
            || !matches!(surface, ValueRef::Null)
        {
            return None;
        }
        let data = data_text(data, MAX_PACKED_DATA_BYTES)?;
        if data.len() as u64 > MAX_PACKED_DATA_BYTES || !packed_size_ok(&data) {
            return None;
        }
        return Some(format!(
            "{{\"type\":{},\"seq0\":{seq},\"time0\":{time},\"data\":{data}}}",
            json_string(event_type)
        ));
    }
    // A scalar row holds one event: its data is bounded like every stored event's.
    let data = data_text(data, MAX_EVENT_DATA_BYTES as u64)?;
    let mut line = format!(
        "{{\"type\":{},\"seq\":{seq},\"time\":{time},\"data\":{data}",
        json_string(event_type)
    );
    match sources {
        ValueRef::Null => {}
        ValueRef::Blob(bytes) => {
            let seqs = decode_seqs(bytes)?;
            let items: Vec<String> = seqs.iter().map(u64::to_string).collect();
            line.push_str(&format!(",\"sourceEventSeqs\":[{}]", items.join(",")));
        }
        _ => return None,
    }
    match surface {
        ValueRef::Null => {}
        ValueRef::Text(bytes) => {
            line.push_str(",\"surfaceOp\":");
            line.push_str(std::str::from_utf8(bytes).ok()?);
        }
        _ => return None,
    }
    match ignorable {
        ValueRef::Null => {}
        ValueRef::Integer(1) => line.push_str(",\"ignorable\":true"),
        _ => return None,
    }
    line.push('}');
    Some(line)
}

/// A row's `data` text: TEXT as is, a BLOB zstd-decompressed (bounded by `limit` bytes);
/// strict UTF-8.
fn data_text(data: ValueRef<'_>, limit: u64) -> Option<String> {
    let bytes = match data {
        ValueRef::Text(bytes) => bytes.to_vec(),
        ValueRef::Blob(compressed) => {
            let decoder = zstd::stream::read::Decoder::new(compressed).ok()?;
            let mut out = Vec::new();
            decoder.take(limit + 1).read_to_end(&mut out).ok()?;
            if out.len() as u64 > limit {
                return None;
            }
            out
        }
        _ => return None,
    };
    String::from_utf8(bytes).ok()
}

/// The packed payload has 3…1024 members (the SQLite codec's bound; JSONL has none).
fn packed_size_ok(data: &str) -> bool {
    let Some(members) = crate::session::json::object_members(data) else {
        return false;
    };
    members
        .iter()
        .find(|(key, _)| key == "texts" || key == "args")
        .and_then(|(_, value)| {
            serde_json::from_str::<Vec<Box<serde_json::value::RawValue>>>(value.get()).ok()
        })
        .is_some_and(|payloads| {
            (MIN_PACKED_ROW_MEMBERS..=MAX_PACKED_ROW_MEMBERS).contains(&payloads.len())
        })
}

/// Decodes `source_event_seqs` (§3.4): a varint, then zigzag varint deltas.
fn decode_seqs(bytes: &[u8]) -> Option<Vec<u64>> {
    let mut at = 0;
    let mut seqs = Vec::new();
    while at < bytes.len() {
        let (value, used) = varint(&bytes[at..])?;
        at += used;
        let next = match seqs.last() {
            None => value,
            Some(&previous) => {
                let delta = if value % 2 == 0 {
                    i128::from(value / 2)
                } else {
                    -i128::from(value.div_ceil(2))
                };
                u64::try_from(i128::from(previous) + delta).ok()?
            }
        };
        if next > crate::session::json::MAX_SAFE_INTEGER {
            return None;
        }
        seqs.push(next);
    }
    Some(seqs)
}

/// One canonical unsigned LEB128 varint (no shifts over 56 bits, no `0x80 0x00`).
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for (index, byte) in bytes.iter().enumerate() {
        let shift = u32::try_from(7 * index).ok().filter(|shift| *shift <= 56)?;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            if index > 0 && *byte == 0 {
                return None;
            }
            return Some((value, index + 1));
        }
    }
    None
}

/// DSH's SQLite schema 17 tables (dsh-persistence.md §3.3): what this importer reads, and
/// what tests and benchmarks create to stand in for a DSH store.
pub const DSH_SCHEMA_17_DDL: &str = "
CREATE TABLE persistence_state (
  singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
  store_id TEXT NOT NULL
) STRICT;
CREATE TABLE sessions (
  id TEXT PRIMARY KEY,
  version INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  cwd TEXT,
  parent_session TEXT,
  seed_length INTEGER,
  origin TEXT,
  delegation_depth INTEGER,
  agent_preset TEXT,
  incarnation TEXT NOT NULL,
  revision INTEGER NOT NULL
) STRICT;
CREATE TABLE events (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  type TEXT NOT NULL,
  time INTEGER NOT NULL,
  data ANY NOT NULL,
  source_event_seqs ANY,
  surface_op TEXT,
  ignorable INTEGER CHECK (ignorable IS NULL OR ignorable IN (0, 1)),
  PRIMARY KEY (session_id, seq)
) STRICT;
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqs_decode() {
        // 5, then +2 (4), then -3 (5), then 0.
        assert_eq!(decode_seqs(&[5, 4, 5, 0]), Some(vec![5, 7, 4, 4]));
        assert_eq!(decode_seqs(&[]), Some(vec![]));
        assert_eq!(decode_seqs(&[0x80, 0x00]), None);
        assert_eq!(decode_seqs(&[0x80]), None);
        assert_eq!(decode_seqs(&[0xac, 0x02]), Some(vec![300]));
    }
}
