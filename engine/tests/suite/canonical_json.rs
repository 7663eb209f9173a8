//! Canonical JSONL (`dshdb-json` v1): every accepted DSH fixture survives DSH import →
//! canonical export → canonical import into another store with a byte-identical DSH export,
//! the canonical export is stable, and bad files are refused with nothing written.

use crate::common;
use crate::common::dsh_fixtures;

use common::*;
use dshdb::exchange::{
    export_canonical, export_dsh_jsonl, import_canonical, import_dsh_jsonl, is_canonical,
    CanonicalError,
};
use dshdb::storage::commit::Durability;
use dshdb::storage::io::sim::SimStorage;
use dshdb::store::{NewEvent, Options, Store};
use std::fs;

fn new_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        ..Options::default()
    };
    open_sim(&SimStorage::new(), options).expect("open sim store")
}

fn fixture_inputs() -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = fs::read_dir(dsh_fixtures::directory())
        .expect("fixture directory is readable")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|file| file.ends_with(".input.jsonl"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let bytes =
                fs::read(dsh_fixtures::directory().join(&name)).expect("fixture is readable");
            (name, bytes)
        })
        .collect()
}

/// Canonical export → import into a fresh store; checks DSH export and canonical stability.
fn assert_round_trip(label: &str, store: &Store, id: &str) {
    let dsh = export_dsh_jsonl(store, id).expect("DSH export");
    let canonical = export_canonical(store, id).expect("canonical export");
    let first_line = canonical.split(|&b| b == b'\n').next().unwrap_or_default();
    assert!(is_canonical(first_line), "{label}: first line is canonical");
    let second = new_store();
    let report = import_canonical(&second, &canonical)
        .unwrap_or_else(|error| panic!("{label}: canonical import failed: {error}"));
    assert_eq!(report.session_id, id, "{label}");
    assert_eq!(
        report.events,
        store.session(id).expect("session").events,
        "{label}"
    );
    assert_eq!(
        second.session(id).expect("session").header_json,
        store.session(id).expect("session").header_json,
        "{label}: header"
    );
    let dsh_again = export_dsh_jsonl(&second, id).expect("DSH export of the re-import");
    assert!(
        dsh_again == dsh,
        "{label}: DSH export differs after round trip"
    );
    let canonical_again = export_canonical(&second, id).expect("second canonical export");
    assert!(
        canonical_again == canonical,
        "{label}: canonical export is not stable"
    );
}

#[test]
fn every_accepted_fixture_round_trips() {
    if !dsh_fixtures::present() {
        return;
    }
    let mut accepted = 0;
    for (name, bytes) in fixture_inputs() {
        let store = new_store();
        let Ok(report) = import_dsh_jsonl(&store, &bytes) else {
            continue;
        };
        accepted += 1;
        assert_round_trip(&name, &store, &report.session_id);
    }
    assert!(accepted > 0, "no fixture was accepted");
}

#[test]
fn forks_export_their_seed_materialized() {
    let store = new_store();
    let mut parent = store.create_session_with_id("parent").expect("create");
    for index in 0..5 {
        let data = format!(r#"{{"n":{index},"big":123456789012345678901234567890,"s":"\u00e9"}}"#);
        parent.append(NewEvent::new("note", &data)).expect("append");
    }
    drop(parent);
    drop(store.fork("parent", 2, "child").expect("fork"));
    let child_events = store.session("child").expect("child").events;
    let canonical = export_canonical(&store, "child").expect("export");
    let text = String::from_utf8(canonical).expect("utf-8");
    assert_eq!(text.lines().count() as u64, child_events + 1);
    assert!(text.lines().next().is_some_and(
        |line| line.contains(r#""lineage":{"parentSession":"parent","seedLength":3}"#)
    ));
    assert!(text.contains("123456789012345678901234567890"));
    assert!(text.contains(r#"\u00e9"#));
    assert_round_trip("fork", &store, "child");
    assert_round_trip("parent", &store, "parent");
}

#[test]
fn whitespace_around_data_and_header_is_kept() {
    let store = new_store();
    let header = r#" {"version":0,"id":"ws","createdAt":1} "#;
    let events = [NewEvent::new("note", " {\"a\": 1.50} ")];
    drop(
        store
            .create_session_with_events(header, &events)
            .expect("create"),
    );
    let canonical = export_canonical(&store, "ws").expect("export");
    let second = new_store();
    import_canonical(&second, &canonical).expect("import");
    assert_eq!(second.session("ws").expect("ws").header_json, header);
    assert_eq!(
        second.read("ws", 0, 1).expect("read")[0].data,
        " {\"a\": 1.50} "
    );
    assert!(export_canonical(&second, "ws").expect("export") == canonical);
}

fn sample_canonical() -> Vec<u8> {
    let store = new_store();
    let mut writer = store.create_session_with_id("sample").expect("create");
    writer
        .append(NewEvent::new("note", r#"{"x":1}"#))
        .expect("append");
    writer
        .append(NewEvent::new("note", r#"{"x":2}"#))
        .expect("append");
    drop(writer);
    export_canonical(&store, "sample").expect("export")
}

fn refuse(bytes: &[u8]) -> CanonicalError {
    let store = new_store();
    let error = import_canonical(&store, bytes).expect_err("refused");
    assert!(store.sessions().is_empty(), "nothing written: {error}");
    error
}

#[test]
fn bad_files_are_refused_and_nothing_is_written() {
    let good = String::from_utf8(sample_canonical()).expect("utf-8");
    let (first, rest) = good.split_once('\n').expect("two parts");

    let other_format = format!(
        "{}\n{rest}",
        first.replace("\"dshdb-json\"", "\"something-else\"")
    );
    assert!(matches!(
        refuse(other_format.as_bytes()),
        CanonicalError::UnknownFormat { .. }
    ));
    assert!(matches!(
        refuse(b"{\"type\":\"session\",\"version\":0}\n"),
        CanonicalError::UnknownFormat { .. }
    ));

    let other_version = format!(
        "{}\n{rest}",
        first.replace("\"version\":1,", "\"version\":2,")
    );
    assert!(matches!(
        refuse(other_version.as_bytes()),
        CanonicalError::UnsupportedVersion { .. }
    ));

    // The last event line is broken: the first one must not be written either.
    let mut lines: Vec<&str> = good.lines().collect();
    let broken_last = format!("{}\n{}\n{{\"seq\":1,\"time\":", lines[0], lines[1]);
    assert!(matches!(
        refuse(format!("{broken_last}\n").as_bytes()),
        CanonicalError::Malformed { line: 3, .. }
    ));
    assert!(matches!(
        refuse(broken_last.as_bytes()),
        CanonicalError::Malformed { .. }
    ));

    let bad_data = good.replace(r#""data":{"x":2}"#, r#""data":{"x":2}, "extra":1"#);
    assert!(matches!(
        refuse(bad_data.as_bytes()),
        CanonicalError::Malformed { line: 3, .. }
    ));

    let bad_flags = good.replacen("\"flags\":0", "\"flags\":128", 1);
    assert!(matches!(
        refuse(bad_flags.as_bytes()),
        CanonicalError::Malformed { line: 2, .. }
    ));

    let wrong_seq = good.replace("\"seq\":1,", "\"seq\":7,");
    assert!(matches!(
        refuse(wrong_seq.as_bytes()),
        CanonicalError::Malformed { line: 3, .. }
    ));

    lines.pop();
    let missing_event = format!("{}\n", lines.join("\n"));
    assert!(matches!(
        refuse(missing_event.as_bytes()),
        CanonicalError::Malformed { line: 1, .. }
    ));

    let not_utf8 = [good.as_bytes(), b"\xff\n"].concat();
    assert!(matches!(
        refuse(&not_utf8),
        CanonicalError::Malformed { .. }
    ));

    // The good file itself imports.
    import_canonical(&new_store(), good.as_bytes()).expect("good file imports");
}

#[test]
fn duplicate_session_is_a_store_error() {
    let canonical = sample_canonical();
    let store = new_store();
    import_canonical(&store, &canonical).expect("first import");
    assert!(matches!(
        import_canonical(&store, &canonical),
        Err(CanonicalError::Store(dshdb::Error::DuplicateSession { .. }))
    ));
    assert_eq!(store.session("sample").expect("sample").events, 2);
}

/// A session imported from a DSH log whose second line is not canonical (spaces), so it is
/// stored verbatim; its canonical export.
fn verbatim_canonical() -> String {
    let log = concat!(
        r#"{"type":"session","version":0,"id":"verb","createdAt":1,"cwd":"/x","delegationDepth":0}"#,
        "\n",
        r#"{"type":"turn/start", "seq":0, "time":5, "data":{"turn":1}}"#,
        "\n",
    );
    let store = new_store();
    let report = import_dsh_jsonl(&store, log.as_bytes()).expect("import");
    assert_eq!(report.verbatim, 1, "the line is kept verbatim");
    String::from_utf8(export_canonical(&store, "verb").expect("export")).expect("utf-8")
}

/// The canonical file with the verbatim line (inside the envelope string) edited.
fn with_verbatim_line(canonical: &str, from: &str, to: &str) -> String {
    let mut lines: Vec<String> = canonical.lines().map(str::to_owned).collect();
    let mut event: serde_json::Value = serde_json::from_str(&lines[1]).expect("event line");
    let envelope = event["envelope"]
        .as_str()
        .expect("verbatim envelope")
        .to_owned();
    assert!(envelope.contains(from), "{envelope}");
    event["envelope"] = serde_json::Value::String(envelope.replace(from, to));
    lines[1] = event.to_string();
    format!("{}\n", lines.join("\n"))
}

#[test]
fn a_verbatim_line_that_contradicts_its_event_is_refused() {
    let good = verbatim_canonical();
    import_canonical(&new_store(), good.as_bytes()).expect("the untouched file imports");
    for (from, to, field) in [
        (r#""type":"turn/start""#, r#""type":"other""#, "type"),
        (r#""time":5"#, r#""time":6"#, "time"),
        (r#""seq":0"#, r#""seq":3"#, "seq"),
        (r#"{"turn":1}"#, r#"{"turn":2}"#, "data"),
    ] {
        let crafted = with_verbatim_line(&good, from, to);
        match refuse(crafted.as_bytes()) {
            CanonicalError::Malformed { line: 2, reason } => {
                assert!(reason.contains(field), "{field}: {reason}");
            }
            other => panic!("{field}: {other}"),
        }
    }
    let not_an_event = with_verbatim_line(&good, r#""type":"turn/start", "#, "");
    assert!(matches!(
        refuse(not_an_event.as_bytes()),
        CanonicalError::Malformed { line: 2, .. }
    ));
}

#[test]
fn a_file_whose_spill_lines_are_missing_is_refused() {
    use dshdb::exchange::spill_lines::{import_canonical_with_spill, write_spill_lines};
    use dshdb::spill::SpillStore;
    let store = new_store();
    let locator = SpillStore::new(store.storage())
        .put(b"the full tool output")
        .expect("put")
        .locator();
    let mut writer = store.create_session_with_id("cites").expect("create");
    let data = format!("{{\"see\":\"{locator}\"}}");
    writer.append(NewEvent::new("note", &data)).expect("append");
    drop(writer);
    let mut whole = export_canonical(&store, "cites").expect("export");
    let events_only = whole.clone();
    assert_eq!(
        write_spill_lines(&store, "cites", &mut whole).expect("spill lines"),
        1
    );
    // With its spill line the file imports into an empty store; without, it is refused.
    let complete = new_store();
    import_canonical_with_spill(&complete, &whole, &mut |_, _| {}).expect("complete file");
    let bare = new_store();
    match import_canonical_with_spill(&bare, &events_only, &mut |_, _| {}) {
        Err(CanonicalError::Malformed { line: 2, reason }) => {
            assert!(reason.contains(&locator), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(bare.sessions().is_empty());
    // A store that holds the blob already takes the bare file.
    import_canonical_with_spill(
        &store_with_session_removed(&store),
        &events_only,
        &mut |_, _| {},
    )
    .expect("the store has the blob");
}

/// `store` with session `cites` deleted (its blob stays until a spill gc).
fn store_with_session_removed(store: &Store) -> Store {
    store.delete_session("cites").expect("delete");
    store.clone()
}
