//! DSH SQLite (schema 17) import: a database built from fixture logs imports to the same
//! events as the JSONL import of those logs; a foreign schema version is refused with
//! nothing written.

use crate::common;
use crate::common::dsh_fixtures;

use common::*;
use dshdb::exchange::sqlite::{import_dsh_sqlite, is_sqlite, SqliteImportError};
use dshdb::exchange::{export_dsh_jsonl, import_dsh_jsonl};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{Event, Options, Store};
use rusqlite::{params, Connection};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

const CASES: &[&str] = &[
    "syn-packed-chunks",
    "syn-compaction-replace",
    "code-mode-round.session",
    "fresh-round-trip.session",
];

const SCHEMA: &str = dshdb::exchange::sqlite::DSH_SCHEMA_17_DDL;

fn new_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(&SimStorage::new(), options).expect("open sim store")
}

fn temp_db(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dshdb-sqlite-import-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    let _ = fs::remove_file(&path);
    path
}

fn fixture(name: &str) -> Vec<u8> {
    dsh_fixtures::input(name)
}

fn create_db(path: &Path, user_version: i64) -> Connection {
    let conn = Connection::open(path).expect("open db");
    conn.execute_batch(SCHEMA).expect("schema");
    conn.execute(
        "INSERT INTO persistence_state (singleton, store_id) VALUES (1, ?1)",
        params!["00000000-0000-4000-8000-000000000000"],
    )
    .expect("state row");
    conn.execute_batch(&format!(
        "PRAGMA application_id = 1146308688; PRAGMA user_version = {user_version};"
    ))
    .expect("pragmas");
    conn
}

type Members = HashMap<String, Box<RawValue>>;

fn raw<'m>(members: &'m Members, key: &str) -> Option<&'m str> {
    members.get(key).map(|value| value.get())
}

/// Row data as DSH stores it: TEXT under 4 KiB (here also for any text when `compress` is
/// off), else zstd level 3 as a BLOB when strictly smaller.
fn data_value(text: &str, compress: bool) -> rusqlite::types::Value {
    if compress && text.len() >= 64 {
        let packed = zstd::encode_all(text.as_bytes(), 3).expect("zstd");
        if packed.len() < text.len() {
            return rusqlite::types::Value::Blob(packed);
        }
    }
    rusqlite::types::Value::Text(text.to_owned())
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn encode_seqs(seqs: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, seq) in seqs.iter().enumerate() {
        if index == 0 {
            varint(*seq, &mut out);
        } else {
            let delta = *seq as i64 - seqs[index - 1] as i64;
            let zigzag = if delta >= 0 {
                2 * delta as u64
            } else {
                2 * delta.unsigned_abs() - 1
            };
            varint(zigzag, &mut out);
        }
    }
    out
}

/// Inserts a fixture log as DSH's SQLite backend would hold it.
fn insert_log(conn: &Connection, log: &[u8], compress: bool) -> String {
    let text = std::str::from_utf8(log).expect("utf-8 fixture");
    let mut lines = text.lines();
    let header: Members = serde_json::from_str(lines.next().expect("header")).expect("header");
    let string = |key: &str| -> Option<String> {
        raw(&header, key).map(|text| serde_json::from_str(text).expect("string field"))
    };
    let int = |key: &str| -> Option<i64> { raw(&header, key).map(|t| t.parse().expect("int")) };
    let id = string("id").expect("id");
    conn.execute(
        "INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, \
         origin, delegation_depth, agent_preset, incarnation, revision) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1)",
        params![
            id,
            int("version"),
            int("createdAt"),
            string("cwd"),
            string("parentSession"),
            int("seedLength"),
            string("origin"),
            int("delegationDepth"),
            string("agentPreset"),
            "00000000-0000-4000-8000-000000000001"
        ],
    )
    .expect("session row");
    let mut insert = conn
        .prepare(
            "INSERT INTO events (session_id, seq, type, time, data, source_event_seqs, \
             surface_op, ignorable) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .expect("prepare");
    for line in lines {
        let record: Members = serde_json::from_str(line).expect("record");
        let kind: String = serde_json::from_str(raw(&record, "type").expect("type")).expect("type");
        let data = raw(&record, "data").expect("data");
        if let Some(seq0) = raw(&record, "seq0") {
            let time0 = raw(&record, "time0").expect("time0");
            let row: Members = serde_json::from_str(data).expect("row data");
            let payloads: Vec<Box<RawValue>> =
                serde_json::from_str(raw(&row, "texts").or(raw(&row, "args")).expect("payloads"))
                    .expect("payloads");
            if payloads.len() < 3 {
                // DSH's SQLite codec packs only 3…1024 members; shorter runs are scalars.
                insert_members(&mut insert, &id, &kind, seq0, time0, &row, &payloads);
                continue;
            }
            insert
                .execute(params![
                    id,
                    seq0.parse::<i64>().expect("seq0"),
                    kind,
                    time0.parse::<i64>().expect("time0"),
                    data_value(data, compress),
                    None::<Vec<u8>>,
                    None::<String>,
                    0
                ])
                .expect("packed row");
            continue;
        }
        let sources = raw(&record, "sourceEventSeqs")
            .map(|text| encode_seqs(&serde_json::from_str::<Vec<u64>>(text).expect("seqs")));
        let ignorable = raw(&record, "ignorable").map(|_| 1);
        insert
            .execute(params![
                id,
                raw(&record, "seq")
                    .expect("seq")
                    .parse::<i64>()
                    .expect("seq"),
                kind,
                raw(&record, "time")
                    .expect("time")
                    .parse::<i64>()
                    .expect("time"),
                data_value(data, compress),
                sources,
                raw(&record, "surfaceOp"),
                ignorable
            ])
            .expect("scalar row");
    }
    id
}

/// The member events of a JSONL packed row, as scalar rows.
fn insert_members(
    insert: &mut rusqlite::Statement<'_>,
    id: &str,
    kind: &str,
    seq0: &str,
    time0: &str,
    row: &Members,
    payloads: &[Box<RawValue>],
) {
    let field = |key: &str| raw(row, key).expect("row field");
    let gaps: Vec<i64> = serde_json::from_str(field("dt")).expect("dt");
    let mut time: i64 = time0.parse().expect("time0");
    let seq0: i64 = seq0.parse().expect("seq0");
    for (offset, payload) in payloads.iter().enumerate() {
        if offset > 0 {
            time += gaps[offset - 1];
        }
        let chunk =
            match kind {
                "tool-call-chunks" => format!(
                "{{\"type\":\"tool-call-delta\",\"index\":{},\"id\":{}{},\"argumentsDelta\":{}}}",
                field("index"),
                field("id"),
                raw(row, "name").map(|name| format!(",\"name\":{name}")).unwrap_or_default(),
                payload.get()
            ),
                _ => format!(
                    "{{\"type\":\"{}\",\"index\":{},\"text\":{}}}",
                    if kind == "text-chunks" {
                        "text-delta"
                    } else {
                        "reasoning-delta"
                    },
                    field("index"),
                    payload.get()
                ),
            };
        let data = format!(
            "{{\"turn\":{},\"step\":{},\"chunk\":{chunk}}}",
            field("turn"),
            field("step")
        );
        insert
            .execute(params![
                id,
                seq0 + offset as i64,
                "assistant/chunk",
                time,
                data,
                None::<Vec<u8>>,
                None::<String>,
                None::<i64>
            ])
            .expect("member row");
    }
}

fn events(store: &Store, id: &str) -> Vec<(String, u64, i64, String)> {
    let summary = store.session(id).expect("session");
    store
        .read(id, 0, summary.events)
        .expect("read")
        .into_iter()
        .map(
            |Event {
                 event_type,
                 seq,
                 time,
                 data,
                 ..
             }| (event_type, seq, time, data),
        )
        .collect()
}

fn check_import(compress: bool) {
    if !dsh_fixtures::present() {
        return;
    }
    let path = temp_db(&format!("fixtures-{compress}.sqlite"));
    let conn = create_db(&path, 17);
    let ids: Vec<String> = CASES
        .iter()
        .map(|name| insert_log(&conn, &fixture(name), compress))
        .collect();
    drop(conn);
    assert!(is_sqlite(&fs::read(&path).expect("read db")));

    let store = new_store();
    let reports = import_dsh_sqlite(&store, &path).expect("import");
    assert_eq!(reports.len(), CASES.len());
    for ((name, id), report) in CASES.iter().zip(&ids).zip(&reports) {
        assert_eq!(&report.session_id, id);
        let reference = new_store();
        import_dsh_jsonl(&reference, &fixture(name)).expect("jsonl import");
        assert_eq!(events(&store, id), events(&reference, id), "{name}");
        if *name == "syn-packed-chunks" {
            assert!(report.rows > 0, "packed rows decoded");
            // Export packs the SQLite rows as DSH's JSONL writer would, and reads back the same.
            let exported = export_dsh_jsonl(&store, id).expect("export");
            let text = String::from_utf8(exported.clone()).expect("utf-8");
            assert!(text.contains("-chunks\",\"seq0\":"), "{text}");
            let again = new_store();
            import_dsh_jsonl(&again, &exported).expect("re-import");
            assert_eq!(events(&again, id), events(&store, id));
        }
    }
    let _ = fs::remove_file(&path);
}

#[test]
fn imports_fixture_sessions_as_text() {
    check_import(false);
}

#[test]
fn imports_fixture_sessions_compressed() {
    check_import(true);
}

#[test]
fn refuses_other_schema_version_and_writes_nothing() {
    if !dsh_fixtures::present() {
        return;
    }
    let path = temp_db("v16.sqlite");
    let conn = create_db(&path, 16);
    insert_log(&conn, &fixture("syn-packed-chunks"), false);
    drop(conn);
    let store = new_store();
    match import_dsh_sqlite(&store, &path) {
        Err(SqliteImportError::SchemaVersion {
            found, expected, ..
        }) => {
            assert_eq!((found, expected), (16, 17));
        }
        other => panic!("expected a schema refusal, got {other:?}"),
    }
    assert!(store.sessions().is_empty());
    let _ = fs::remove_file(&path);
}

#[test]
fn refuses_invalid_session_and_writes_nothing() {
    if !dsh_fixtures::present() {
        return;
    }
    let path = temp_db("invalid.sqlite");
    let conn = create_db(&path, 17);
    insert_log(&conn, &fixture("fresh-round-trip.session"), false);
    let id = insert_log(&conn, &fixture("syn-packed-chunks"), false);
    // A non-chunk tag with the packed discriminator in the committed region.
    conn.execute(
        "UPDATE events SET ignorable = 0 WHERE session_id = ?1 AND seq = 0",
        params![id],
    )
    .expect("corrupt row");
    drop(conn);
    let store = new_store();
    let error = import_dsh_sqlite(&store, &path).expect_err("refused");
    assert_eq!(
        error.to_string(),
        "corrupt session log: invalid committed physical row at seq 0"
    );
    assert!(store.sessions().is_empty());
    let _ = fs::remove_file(&path);
}

/// F-13 defect 7: a seq gap after the last `turn/end` is a tail DSH's `scanRows` drops; the
/// import drops it too and reports the rows, where they start and why (never silently).
#[test]
fn a_gap_tail_is_dropped_and_reported() {
    let log = concat!(
        r#"{"type":"session","version":0,"id":"gap","createdAt":1,"cwd":"/x","delegationDepth":0}"#,
        "\n",
        r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
        "\n",
        r#"{"type":"turn/end","seq":1,"time":2,"data":{"turn":1}}"#,
        "\n",
        r#"{"type":"turn/start","seq":3,"time":3,"data":{"turn":2}}"#,
        "\n",
        r#"{"type":"turn/end","seq":4,"time":4,"data":{"turn":2}}"#,
        "\n",
    );
    let path = temp_db("gap-tail.sqlite");
    let conn = create_db(&path, 17);
    insert_log(&conn, log.as_bytes(), false);
    drop(conn);
    let store = new_store();
    let reports = import_dsh_sqlite(&store, &path).expect("a gap tail is tolerated");
    let tail = reports[0]
        .dropped
        .as_ref()
        .expect("the dropped tail is reported");
    assert!(tail.bytes > 0, "{tail:?}");
    assert!(
        tail.reason.contains("2 physical rows from seq 3 dropped"),
        "{}",
        tail.reason
    );
    assert_eq!(store.session("gap").expect("gap").events, 2);
    let _ = fs::remove_file(&path);
}
