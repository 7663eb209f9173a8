//! The baselines dshdb is compared with.
//!
//! - [`JsonlSession`]: DSH's JSONL backend (`compression: 'none'`, dsh-persistence.md §2 and
//!   §4.4): one file per session, a header line, then one line per event; every batch is one
//!   `write` of its lines followed by one `fdatasync` of that file.
//!   In the zstd encoding (§2.7, DSH's default) each batch is one zstd frame. Not modelled:
//!   DSH's packed chunk rows (§2.4), which make its lines shorter before compression.
//! - [`Sqlite`]: DSH's SQLite backend, schema 17 (§3): `journal_mode=WAL`, `synchronous=FULL`,
//!   STRICT tables, one IMMEDIATE transaction per batch (tail read, one row per event,
//!   revision bump), as `appendBatch` does (§3.6).
//! - [`Redb`]: an embedded Rust engine (redb 2) storing `(session, seq) → event`, one durable
//!   write transaction per batch.
//! - [`RawFile`]: the floor: `pwrite` of the same bytes at increasing offsets of a preallocated
//!   file, then `fdatasync`.

use crate::workload::GenEvent;
use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Syncs a directory (after creating an entry in it).
pub fn sync_dir(path: &Path) -> Result<()> {
    File::open(path)
        .with_context(|| format!("open dir {}", path.display()))?
        .sync_all()
        .context("fsync dir")
}

/// How [`RawFile`] preallocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prealloc {
    /// Written with zeros and fsynced: overwrites need no metadata at all (the true floor).
    Zeroed,
    /// `fallocate(2)`: unwritten extents, so the first write of each block changes metadata.
    Fallocate,
}

/// A preallocated file written at increasing offsets, each write followed by `fdatasync`.
pub struct RawFile {
    file: File,
    offset: u64,
    size: u64,
}

impl RawFile {
    pub fn create(path: &Path, size: u64, prealloc: Prealloc) -> Result<RawFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .with_context(|| format!("create {}", path.display()))?;
        match prealloc {
            Prealloc::Zeroed => {
                let zeros = vec![0u8; 1 << 20];
                let mut written = 0;
                while written < size {
                    let n = zeros.len().min((size - written) as usize);
                    file.write_all_at(&zeros[..n], written)?;
                    written += n as u64;
                }
            }
            Prealloc::Fallocate => {
                use std::os::fd::AsRawFd;
                // SAFETY: a valid open descriptor; fallocate does not touch our memory.
                let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
                if rc != 0 {
                    return Err(std::io::Error::last_os_error()).context("fallocate");
                }
            }
        }
        file.sync_all()?;
        if let Some(parent) = path.parent() {
            sync_dir(parent)?;
        }
        Ok(RawFile {
            file,
            offset: 0,
            size,
        })
    }

    /// `pwrite` + `fdatasync`. Wraps to the start when the file is full.
    pub fn append_sync(&mut self, bytes: &[u8]) -> Result<()> {
        if self.offset + bytes.len() as u64 > self.size {
            self.offset = 0;
        }
        self.file.write_all_at(bytes, self.offset)?;
        self.offset += bytes.len() as u64;
        self.file.sync_data()?;
        Ok(())
    }
}

/// DSH's physical encodings of a session file (§2.6, §2.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonlEncoding {
    /// `session.jsonl`: plain lines.
    Raw,
    /// `session.jsonl.zstd`: frame 1 = the header line, then one zstd frame (level 3, content
    /// checksum) per append batch.
    Zstd,
}

/// zstd level DSH's frames get (Node's default, libzstd's 3).
const DSH_ZSTD_LEVEL: i32 = 3;

/// One DSH JSONL session file (`<root>/_no-cwd/<id>/session.jsonl[.zstd]`).
pub struct JsonlSession {
    file: File,
    seq: u64,
    line: String,
    encoding: JsonlEncoding,
    pub path: PathBuf,
}

/// One zstd frame of `plain` as DSH writes it.
pub fn dsh_frame(plain: &[u8]) -> Result<Vec<u8>> {
    let mut compressor = zstd::bulk::Compressor::new(DSH_ZSTD_LEVEL)?;
    compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    Ok(compressor.compress(plain)?)
}

impl JsonlSession {
    /// Materializes the session: directory, header line. With `durable`, the file and its
    /// directory are fsynced (DSH's first-append protocol minus the temp file and link).
    pub fn create(root: &Path, id: &str, durable: bool) -> Result<JsonlSession> {
        Self::create_encoded(root, id, durable, JsonlEncoding::Raw)
    }

    /// [`JsonlSession::create`] in either of DSH's encodings.
    pub fn create_encoded(
        root: &Path,
        id: &str,
        durable: bool,
        encoding: JsonlEncoding,
    ) -> Result<JsonlSession> {
        let dir = root.join("_no-cwd").join(id);
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let path = dir.join(match encoding {
            JsonlEncoding::Raw => "session.jsonl",
            JsonlEncoding::Zstd => "session.jsonl.zstd",
        });
        let mut file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        let header = format!(
            "{{\"type\":\"session\",\"version\":0,\"id\":\"{id}\",\"createdAt\":{},\"delegationDepth\":0}}\n",
            dshdb::store::now_millis()
        );
        match encoding {
            JsonlEncoding::Raw => file.write_all(header.as_bytes())?,
            JsonlEncoding::Zstd => file.write_all(&dsh_frame(header.as_bytes())?)?,
        }
        if durable {
            file.sync_all()?;
            sync_dir(&dir)?;
        }
        Ok(JsonlSession {
            file,
            seq: 0,
            line: String::new(),
            encoding,
            path,
        })
    }

    /// Appends a batch as one write (one zstd frame in the zstd encoding), then `fdatasync`.
    pub fn append_batch(&mut self, events: &[GenEvent], durable: bool) -> Result<()> {
        self.line.clear();
        let time = dshdb::store::now_millis();
        for event in events {
            self.line.push_str(&event.jsonl_line(self.seq, time));
            self.seq += 1;
        }
        match self.encoding {
            JsonlEncoding::Raw => self.file.write_all(self.line.as_bytes())?,
            JsonlEncoding::Zstd => self.file.write_all(&dsh_frame(self.line.as_bytes())?)?,
        }
        if durable {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

/// DSH schema 17 (dsh-persistence.md §3.3), shared with the engine's importer tests.
pub const SQLITE_SCHEMA: &str = dshdb::exchange::sqlite::DSH_SCHEMA_17_DDL;

/// A DSH SQLite store: one connection.
pub struct Sqlite {
    conn: Connection,
    pub path: PathBuf,
}

impl Sqlite {
    /// Opens a new database with DSH's pragmas (§3.2) and schema.
    pub fn create(path: &Path) -> Result<Sqlite> {
        let conn = Connection::open(path).with_context(|| format!("open {}", path.display()))?;
        conn.execute_batch(
            "PRAGMA trusted_schema = OFF; PRAGMA mmap_size = 0; PRAGMA foreign_keys = ON;",
        )?;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        conn.execute_batch(SQLITE_SCHEMA)?;
        conn.execute(
            "INSERT INTO persistence_state (singleton, store_id) VALUES (1, ?1)",
            params!["00000000-0000-4000-8000-000000000000"],
        )?;
        conn.execute_batch(
            "PRAGMA application_id = 1146308688; PRAGMA user_version = 17; COMMIT;",
        )?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "journal_mode {mode}");
        conn.execute_batch("PRAGMA synchronous = FULL")?;
        let sync: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
        anyhow::ensure!(sync == 2, "synchronous {sync}");
        Ok(Sqlite {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Inserts session rows (untimed setup; DSH does this in the first append's transaction).
    pub fn create_sessions(&mut self, ids: &[String]) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, \
                 origin, delegation_depth, agent_preset, incarnation, revision) \
                 VALUES (?1, 0, ?2, NULL, NULL, NULL, NULL, 0, NULL, ?3, 0)",
            )?;
            for id in ids {
                insert.execute(params![
                    id,
                    dshdb::store::now_millis(),
                    "00000000-0000-4000-8000-000000000001"
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// One IMMEDIATE transaction: read the two tail rows, check the seq, insert one row per
    /// event, bump the revision, commit (one WAL `fsync` under `synchronous=FULL`).
    pub fn append_batch(&mut self, session: &str, events: &[GenEvent]) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let last: Option<i64> = tx
            .prepare_cached(
                "SELECT seq, type, time, data, source_event_seqs, surface_op, ignorable \
                 FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 2",
            )?
            .query_row(params![session], |row| row.get(0))
            .optional()?;
        let mut seq = last.map_or(0, |last| last + 1);
        let time = dshdb::store::now_millis();
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, \
                 surface_op, ignorable) VALUES (?1, ?2, ?3, ?4, ?5, NULL, NULL, NULL)",
            )?;
            for event in events {
                insert.execute(params![session, seq, event.event_type, time, event.data])?;
                seq += 1;
            }
        }
        tx.prepare_cached("UPDATE sessions SET revision = revision + 1 WHERE id = ?1")?
            .execute(params![session])?;
        tx.commit()?;
        Ok(())
    }

    /// Turns `synchronous` off: for measuring bytes on disk only (the rows are the same).
    pub fn unsynced(&self) -> Result<()> {
        self.conn.execute_batch("PRAGMA synchronous = OFF")?;
        Ok(())
    }

    /// Closes the connection (checkpoints and removes the WAL).
    pub fn close(self) -> Result<()> {
        self.conn.close().map_err(|(_, error)| error)?;
        Ok(())
    }
}

/// redb's table of events: (session id, seq) → the event as its DSH JSONL line.
const REDB_EVENTS: redb::TableDefinition<(&str, u64), &[u8]> = redb::TableDefinition::new("events");

/// An embedded Rust B-tree engine (redb 2) storing `(session, seq) → event`: one write
/// transaction per batch, committed with redb's default durability (`Immediate`: fsync'd
/// before `commit` returns). redb has one writer at a time, so concurrent appenders queue for it.
pub struct Redb {
    db: redb::Database,
}

impl Redb {
    pub fn create(path: &Path) -> Result<Redb> {
        let db =
            redb::Database::create(path).with_context(|| format!("open {}", path.display()))?;
        let setup = db.begin_write()?;
        setup.open_table(REDB_EVENTS)?;
        setup.commit()?;
        Ok(Redb { db })
    }

    /// Appends `events` to `session` from `first_seq` in one durable write transaction.
    pub fn append_batch(&self, session: &str, first_seq: u64, events: &[GenEvent]) -> Result<()> {
        self.write_batch(session, first_seq, events, redb::Durability::Immediate)
    }

    /// As [`Redb::append_batch`], without the fsync: for measuring bytes on disk only.
    pub fn append_batch_unsynced(
        &self,
        session: &str,
        first_seq: u64,
        events: &[GenEvent],
    ) -> Result<()> {
        self.write_batch(session, first_seq, events, redb::Durability::None)
    }

    fn write_batch(
        &self,
        session: &str,
        first_seq: u64,
        events: &[GenEvent],
        durability: redb::Durability,
    ) -> Result<()> {
        let mut transaction = self.db.begin_write()?;
        transaction.set_durability(durability);
        {
            let mut table = transaction.open_table(REDB_EVENTS)?;
            let time = dshdb::store::now_millis();
            for (seq, event) in (first_seq..).zip(events) {
                table.insert((session, seq), event.jsonl_line(seq, time).as_bytes())?;
            }
        }
        transaction.commit()?;
        Ok(())
    }

    /// Makes everything durable (a final durable, empty transaction) and closes.
    pub fn close(self) -> Result<()> {
        let transaction = self.db.begin_write()?;
        transaction.commit()?;
        Ok(())
    }
}
