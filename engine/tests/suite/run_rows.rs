//! Row entries in runs (format-spec/06-runs-and-index.md F-06-30 … F-06-33): sealing packs
//! DSH chunk rows, imported (`ROW_START` / `ROW_MEMBER`) or appended one event at a time,
//! into row entries; every read returns exactly the events that were appended, from any
//! seq; export writes the same DSH lines from them over every range; a power cut at every
//! step of sealing them loses nothing. (A retained prefix that
//! ends inside a row entry: `run_vectors::rewriting_the_rows_run_keeps_every_prefix_exactly`.)

use crate::common;

use common::*;
use dshdb::exchange::{
    export_dsh_jsonl, export_dsh_jsonl_zstd, visit_dsh_lines, write_dsh_jsonl_in_parts,
};
use dshdb::limits::MAX_ROW_ENTRY_BYTES;
use dshdb::storage::commit::Durability;
use dshdb::storage::frame::{EVENT_FLAG_BATCH_START, EVENT_FLAG_ROW_MEMBER, EVENT_FLAG_ROW_START};
use dshdb::storage::io::sim::{CrashImage, SimStorage};
use dshdb::storage::io::Storage;
use dshdb::storage::manifest::Manifest;
use dshdb::storage::run::{run_path, walk_block, BlockItem, RunReader, DEFINITIONS_SESSION};
use dshdb::store::{NewEvent, Options, Store};

const SESSIONS: usize = 2;
const TURNS: u64 = 6;

/// One planned event: (type, time, flags, data).
type Planned = (&'static str, i64, u8, String);

fn session_id(session: usize) -> String {
    format!("rows{session}")
}

fn chunk_data(turn: u64, step: u64, text: &str) -> String {
    format!(
        r#"{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":{}}}}}"#,
        serde_json::to_string(text).expect("a string")
    )
}

/// A session's events: per turn a `turn/start`, an imported row (flags as the importer sets
/// them, one gap negative), a stretch of live chunks (flags 0) of the next step, a lone
/// chunk, and a `turn/end`.
fn planned(session: usize) -> Vec<Planned> {
    let mut events = Vec::new();
    let mut time = 1_700_000_000_000 + session as i64 * 7;
    for turn in 0..TURNS {
        events.push(("turn/start", time, 0, format!(r#"{{"turn":{turn}}}"#)));
        let members = 3 + (turn + session as u64) % 4;
        for member in 0..members {
            let flags = match member {
                0 => EVENT_FLAG_ROW_START | EVENT_FLAG_BATCH_START,
                _ => EVENT_FLAG_ROW_MEMBER,
            };
            time += if member == 2 { -3 } else { 5 };
            let text = format!("imported {session}.{turn}.{member} \"q\"");
            events.push(("assistant/chunk", time, flags, chunk_data(turn, 0, &text)));
        }
        for member in 0..2 + turn % 3 {
            time += 2;
            let text = format!("live {session}.{turn}.{member}\n");
            events.push(("assistant/chunk", time, 0, chunk_data(turn, 1, &text)));
        }
        time += 1;
        events.push(("assistant/chunk", time, 0, chunk_data(turn, 2, "lone")));
        events.push(("turn/end", time, 0, format!(r#"{{"turn":{turn}}}"#)));
    }
    events
}

/// Appends every planned event, sessions interleaved, one durable append each.
fn populate(store: &Store) {
    let plans: Vec<Vec<Planned>> = (0..SESSIONS).map(planned).collect();
    let mut writers: Vec<_> = (0..SESSIONS)
        .map(|session| {
            store
                .create_session_with_id(&session_id(session))
                .expect("create")
        })
        .collect();
    let longest = plans.iter().map(Vec::len).max().unwrap_or(0);
    for position in 0..longest {
        for (session, writer) in writers.iter_mut().enumerate() {
            let Some((event_type, time, flags, data)) = plans[session].get(position) else {
                continue;
            };
            writer
                .append(NewEvent {
                    event_type,
                    time: Some(*time),
                    data,
                    envelope: "",
                    flags: *flags,
                })
                .expect("append");
        }
    }
}

/// Every session reads back exactly its planned events, whole and from seqs inside rows.
fn check_contents(store: &Store) -> Result<(), String> {
    for session in 0..SESSIONS {
        let id = session_id(session);
        let plan = planned(session);
        let whole = read_planned(store, &id, 0, u64::MAX)?;
        if whole != plan {
            return Err(format!("{id}: the events read differ from those appended"));
        }
        let total = plan.len() as u64;
        for from in (0..total).step_by(3) {
            for length in [1, 2, 5] {
                let to = (from + length).min(total);
                let part = read_planned(store, &id, from, to)?;
                if part != plan[from as usize..to as usize] {
                    return Err(format!("{id}: read({from}, {to}) differs"));
                }
            }
        }
    }
    Ok(())
}

fn read_planned(store: &Store, id: &str, from: u64, to: u64) -> Result<Vec<Planned>, String> {
    let events = store
        .read(id, from, to)
        .map_err(|error| format!("read {id} {from}..{to}: {error}"))?;
    let mut read = Vec::new();
    for (offset, event) in events.into_iter().enumerate() {
        if event.seq != from + offset as u64 || !event.envelope.is_empty() {
            return Err(format!(
                "{id}: seq {} misplaced or with an envelope",
                event.seq
            ));
        }
        let event_type = match event.event_type.as_str() {
            "turn/start" => "turn/start",
            "turn/end" => "turn/end",
            "assistant/chunk" => "assistant/chunk",
            other => return Err(format!("{id}: unexpected type {other}")),
        };
        read.push((event_type, event.time, event.flags, event.data));
    }
    Ok(read)
}

/// Row entries in the runs the manifest names: (entries, events they stand for). Checks
/// that exactly the runs holding row entries are version 2 (F-06-33).
fn row_entries(disk: &SimStorage) -> (u64, u64) {
    let manifest = Manifest::read(disk).expect("manifest").expect("present");
    let (mut entries, mut members) = (0, 0);
    for entry in &manifest.runs {
        let file = disk.open_read(&run_path(entry.id)).expect("run");
        let reader = RunReader::open(file, entry).expect("run opens");
        let before = entries;
        for (index, block) in reader.index.blocks.iter().enumerate() {
            if block.session == DEFINITIONS_SESSION {
                continue;
            }
            let raw = reader.block(index, None).expect("block");
            walk_block(&raw, block, &reader.index, |_, _, item| {
                if let BlockItem::Row(row) = item {
                    entries += 1;
                    members += u64::from(row.member_count);
                }
                Ok(())
            })
            .expect("walk");
        }
        assert_eq!(
            reader.index.holds_rows(),
            entries > before,
            "run {} is version {}",
            entry.id,
            reader.index.version
        );
    }
    (entries, members)
}

/// A closed store image holding the planned sessions, not yet sealed.
fn populated_image() -> CrashImage {
    closed_image(populate)
}

#[test]
fn sealing_packs_rows_into_entries_and_every_read_is_unchanged() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    check_contents(&store).expect("contents before sealing");
    assert!(store.maintain().expect("maintain").segments_sealed > 1);
    check_contents(&store).expect("contents after sealing");
    let (entries, members) = row_entries(&disk);
    // Imported rows (3..=6 members) and live stretches (2..=4) of every turn, each whole
    // unless a segment boundary split it.
    assert!(
        entries >= (SESSIONS as u64) * TURNS && members >= 3 * entries,
        "{entries} row entries holding {members} events"
    );
    store.close().expect("close");
    for use_checkpoint in [true, false] {
        let reader = open_sim(&disk, sim_read_only(use_checkpoint)).expect("reopen");
        assert_eq!(reader.recovery_report().checkpoint_used, use_checkpoint);
        check_contents(&reader).expect("contents after reopening");
    }
}

/// Power cut at every storage operation of `maintain` over a log of rows: every image
/// opens, reads every event exactly, and seals again (F-06-10 with row entries).
#[test]
fn a_power_cut_at_every_step_of_sealing_rows_loses_nothing() {
    let (operations, images_checked) =
        every_cut_of_maintain(&populated_image(), |label, recovered, store| {
            check_contents(&store).unwrap_or_else(|violation| panic!("{label}: {violation}"));
            store.maintain().expect("maintain after recovery");
            check_contents(&store).unwrap_or_else(|violation| panic!("{label}: {violation}"));
            store.close().expect("close");
            assert!(
                row_entries(recovered).0 > 0,
                "{label}: no row entry after sealing"
            );
        });
    assert!(images_checked > operations, "{images_checked} images");
}

/// One DSH line as export's walk (`exchange::visit_dsh_lines`) lends it: its bytes, and
/// whether it starts a batch and is a packed row.
type Line = (Vec<u8>, bool, bool);

fn dsh_lines(store: &Store, id: &str, from: u64, to: u64) -> Vec<Line> {
    let mut lines = Vec::new();
    visit_dsh_lines(store, id, from, to, |line| {
        lines.push((line.bytes.to_vec(), line.batch_start, line.row));
        Ok(())
    })
    .unwrap_or_else(|error| panic!("{id} {from}..{to}: {error}"));
    lines
}

/// Every session's DSH lines over every range `from..to` of its seqs (row entries lent
/// whole or cut by the range), and its whole exports, plain and zstd-framed.
fn every_export_view(store: &Store) -> Vec<Vec<Line>> {
    let mut views = Vec::new();
    for session in 0..SESSIONS {
        let id = session_id(session);
        let total = planned(session).len() as u64;
        for from in 0..=total {
            for to in from..=total {
                views.push(dsh_lines(store, &id, from, to));
            }
        }
        let plain = export_dsh_jsonl(store, &id).expect("export");
        assert_parts_export_the_same(store, &id, &plain, 1..=total + 1);
        let framed = export_dsh_jsonl_zstd(store, &id).expect("zstd export");
        views.push(vec![(plain, false, false), (framed, false, false)]);
    }
    views
}

/// The export cut into parts of every size in `part_sizes` (rendered on several threads,
/// each cut moved to the next line start) is byte for byte the one-walk export `plain`.
fn assert_parts_export_the_same(
    store: &Store,
    id: &str,
    plain: &[u8],
    part_sizes: impl IntoIterator<Item = u64>,
) {
    for part_events in part_sizes {
        for workers in [1, 3] {
            let mut parts = Vec::new();
            let written = write_dsh_jsonl_in_parts(store, id, part_events, workers, &mut parts)
                .unwrap_or_else(|error| panic!("{id} parts of {part_events}: {error}"));
            assert_eq!(written, parts.len() as u64);
            assert!(
                parts == plain,
                "{id}: parts of {part_events} events, {workers} workers, differ"
            );
        }
    }
}

/// Export renders a sealed row entry from its stored payloads instead of its members'
/// events: over every range of seqs (a range that starts or ends inside a row or an entry
/// included) the lines are the ones the events gave before sealing, imported rows (one
/// gap negative, escaped quotes) as row lines, live chunk stretches as their event lines.
#[test]
fn export_lines_over_every_range_are_the_same_after_sealing_rows() {
    let disk = SimStorage::from_image(&populated_image());
    let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
    let before = every_export_view(&store);
    assert!(store.maintain().expect("maintain").segments_sealed > 1);
    assert!(row_entries(&disk).0 > 0, "sealing wrote no row entry");
    let after = every_export_view(&store);
    assert_eq!(after.len(), before.len());
    for (index, (sealed, logged)) in after.iter().zip(&before).enumerate() {
        assert_eq!(sealed, logged, "view {index} changed by sealing");
    }
    // Both kinds of lines were compared: packed rows, and live chunks as event lines.
    let whole = dsh_lines(&store, &session_id(0), 0, u64::MAX);
    let is_row = |line: &&Line| line.2;
    let live_chunk = |line: &&Line| !line.2 && line.0.windows(4).any(|part| part == b"live");
    assert!(whole.iter().filter(is_row).count() >= TURNS as usize);
    assert!(whole.iter().filter(live_chunk).count() >= 2 * TURNS as usize);
}

/// A packed row larger than one row entry may hold (`MAX_ROW_ENTRY_BYTES` of payloads),
/// appended one member at a time: in one segment it seals into several row entries, in
/// the tests' small segments into entries of many runs and events left in the log; either
/// way export writes it as one row line, and over ranges cut inside it as before sealing.
#[test]
fn a_row_larger_than_one_entry_exports_as_one_line_after_sealing() {
    const PAYLOAD_BYTES: usize = 40;
    const ONE_SEGMENT_BYTES: u64 = 4 << 20;
    let members = 2 * MAX_ROW_ENTRY_BYTES / PAYLOAD_BYTES + 7;
    for segment_bytes in [ONE_SEGMENT_BYTES, TEST_SEGMENT_BYTES] {
        let context = format!("{segment_bytes}-byte segments");
        let disk = SimStorage::new();
        let options = Options {
            segment_bytes,
            ..sim_options(Durability::Buffered)
        };
        let store = open_sim(&disk, options).expect("open");
        let views = append_big_row(&store, members, PAYLOAD_BYTES);
        let before = views(&store);
        assert!(store.maintain().expect("maintain").segments_sealed > 0);
        let (entries, entry_members) = row_entries(&disk);
        assert!(
            entries >= 2 && entry_members >= members as u64 / 2,
            "{context}: {entries} entries of {entry_members} members"
        );
        if segment_bytes == ONE_SEGMENT_BYTES {
            // A large segment: the row is in a few entries of the largest size (more members
            // than one entry holds), not in many small ones.
            assert!(
                entries <= 8 && entry_members > (MAX_ROW_ENTRY_BYTES / PAYLOAD_BYTES) as u64,
                "{context}: {entries} entries of {entry_members} members"
            );
        }
        assert!(
            before == views(&store),
            "{context}: sealing changed the export"
        );
        let plain = export_dsh_jsonl(&store, BIG_ROW_SESSION).expect("export");
        let cut_inside = [7, 1000, members as u64 / 3, members as u64];
        assert_parts_export_the_same(&store, BIG_ROW_SESSION, &plain, cut_inside);
        let whole = dsh_lines(&store, BIG_ROW_SESSION, 0, u64::MAX);
        assert_eq!(whole.len(), 2, "{context}: turn/start and one row line");
        assert!(whole[1].2, "{context}: the row is one packed line");
    }
}

const BIG_ROW_SESSION: &str = "big-row";

/// Appends a `turn/start` and one imported row of `members` chunk events with payloads of
/// `payload_bytes`, then enough events of another session to roll the segment; returns
/// what to compare: the row session's DSH lines over ranges cut inside the row, and its
/// export.
fn append_big_row(
    store: &Store,
    members: usize,
    payload_bytes: usize,
) -> impl Fn(&Store) -> Vec<Vec<Line>> {
    const FILLER_EVENTS: usize = 24;
    const FILLER_BYTES: usize = 64 << 10;
    let append = |writer: &mut dshdb::store::SessionWriter, event: NewEvent<'_>| {
        writer.append(event).expect("append");
    };
    let mut writer = store
        .create_session_with_id(BIG_ROW_SESSION)
        .expect("create");
    append(
        &mut writer,
        NewEvent {
            event_type: "turn/start",
            time: Some(1),
            data: r#"{"turn":0}"#,
            envelope: "",
            flags: 0,
        },
    );
    for member in 0..members {
        let flags = match member {
            0 => EVENT_FLAG_ROW_START | EVENT_FLAG_BATCH_START,
            _ => EVENT_FLAG_ROW_MEMBER,
        };
        let text = format!("{member:0>width$}", width = payload_bytes - 2);
        let data = chunk_data(0, 0, &text);
        append(
            &mut writer,
            NewEvent {
                event_type: "assistant/chunk",
                time: Some(10 + member as i64 % 7),
                data: &data,
                envelope: "",
                flags,
            },
        );
    }
    let mut filler = store.create_session_with_id("filler").expect("create");
    let filler_data = event_data(1, 0, FILLER_BYTES);
    for _ in 0..FILLER_EVENTS {
        append(
            &mut filler,
            NewEvent {
                event_type: "note",
                time: Some(1),
                data: &filler_data,
                envelope: "",
                flags: 0,
            },
        );
    }
    let total = members as u64 + 1;
    let ranges = [
        (0, total),
        (1, total),
        (5, total),
        (total / 2, total),
        (3, total - 4),
    ];
    move |store: &Store| {
        let mut views: Vec<Vec<Line>> = ranges
            .iter()
            .map(|(from, to)| dsh_lines(store, BIG_ROW_SESSION, *from, *to))
            .collect();
        let plain = export_dsh_jsonl(store, BIG_ROW_SESSION).expect("export");
        views.push(vec![(plain, false, false)]);
        views
    }
}

/// The planned events of `session` cut into batches, one per turn: each batch holds the
/// turn's imported row and live stretch, which the log stores as row entries (F-02-20).
fn planned_batches(session: usize) -> Vec<Vec<Planned>> {
    let mut batches: Vec<Vec<Planned>> = Vec::new();
    for event in planned(session) {
        if event.0 == "turn/start" || batches.is_empty() {
            batches.push(Vec::new());
        }
        if let Some(batch) = batches.last_mut() {
            batch.push(event);
        }
    }
    batches
}

/// What a batched population acknowledged: per session id, the events acknowledged
/// durable and every batch end it attempted.
#[derive(Default)]
struct BatchLedger {
    durable: std::collections::BTreeMap<String, u64>,
    attempted: std::collections::BTreeMap<String, Vec<u64>>,
}

/// Appends every session's planned events one turn per batch, sessions interleaved, each
/// batch durable before the next; stops at the first error (a power cut).
fn populate_batched(store: &Store) -> BatchLedger {
    let mut ledger = BatchLedger::default();
    let plans: Vec<Vec<Vec<Planned>>> = (0..SESSIONS).map(planned_batches).collect();
    let mut writers = Vec::new();
    for session in 0..SESSIONS {
        match store.create_session_with_id(&session_id(session)) {
            Ok(writer) => writers.push(writer),
            Err(_) => return ledger,
        }
    }
    let longest = plans.iter().map(Vec::len).max().unwrap_or(0);
    for turn in 0..longest {
        for (session, writer) in writers.iter_mut().enumerate() {
            let Some(batch) = plans[session].get(turn) else {
                continue;
            };
            let id = session_id(session);
            let length = ledger.durable.get(&id).copied().unwrap_or(0);
            let end = length + batch.len() as u64;
            ledger.attempted.entry(id.clone()).or_default().push(end);
            let events: Vec<NewEvent<'_>> = batch
                .iter()
                .map(|(event_type, time, flags, data)| NewEvent {
                    event_type,
                    time: Some(*time),
                    data,
                    envelope: "",
                    flags: *flags,
                })
                .collect();
            if writer.append_batch(&events).is_err() {
                return ledger;
            }
            ledger.durable.insert(id, end);
        }
    }
    ledger
}

#[test]
fn rows_written_to_the_log_read_back_exactly_after_reopening_and_sealing() {
    let mut ledger = BatchLedger::default();
    let disk = SimStorage::from_image(&closed_image(|store| ledger = populate_batched(store)));
    assert_eq!(ledger.durable.len(), SESSIONS, "every session written");
    // Each turn's imported row (3..=6 members) and live stretch (2..=4) is one entry.
    let (entries, members) = segment_row_entries(&disk);
    assert!(
        entries >= 2 * (SESSIONS as u64) * TURNS && members >= 2 * entries,
        "{entries} row entries in the log holding {members} events"
    );
    for use_checkpoint in [true, false] {
        let reader = open_sim(&disk, sim_read_only(use_checkpoint)).expect("reopen");
        check_contents(&reader).expect("contents of the log");
    }
    let before: Vec<Vec<Line>> = {
        let store = open_sim(&disk, sim_options(Durability::Sync)).expect("open");
        let lines = every_export_view(&store);
        assert!(store.maintain().expect("maintain").segments_sealed > 0);
        check_contents(&store).expect("contents after sealing");
        assert_eq!(every_export_view(&store), lines, "export after sealing");
        store.close().expect("close");
        lines
    };
    assert!(row_entries(&disk).0 > 0, "sealing keeps rows as entries");
    let reader = open_sim(&disk, sim_read_only(false)).expect("reopen");
    check_contents(&reader).expect("contents after sealing and reopening");
    assert_eq!(every_export_view(&reader), before, "export after reopening");
}

/// Power cut at every storage operation while batches of rows are appended (and two past
/// the last), every torn last write included: every image opens, keeps every acknowledged
/// event, ends each session at the end of a batch it attempted, and holds exactly the
/// planned events (F-02-20 with chapter 05's invariants).
#[test]
fn a_power_cut_at_every_write_of_row_entries_keeps_acknowledged_events_and_invents_nothing() {
    let reference = SimStorage::new();
    if let Ok(store) = open_sim(&reference, sim_options(Durability::Sync)) {
        populate_batched(&store);
        store.close().expect("close");
    }
    assert!(
        segment_row_entries(&reference).0 > 0,
        "the workload writes rows"
    );
    let operations = reference.operation_count();
    let mut images_checked = 0;
    for cut in 0..operations + 2 {
        let disk = SimStorage::new();
        disk.crash_at(cut);
        let ledger = match open_sim(&disk, sim_options(Durability::Sync)) {
            Ok(store) => {
                let ledger = populate_batched(&store);
                let _ = store.close();
                ledger
            }
            Err(_) => BatchLedger::default(),
        };
        for image in &disk.take_crash_images() {
            let label = format!("cut {cut}, {}", image.label);
            let recovered = SimStorage::from_image(image);
            let store = open_sim(&recovered, sim_options(Durability::Sync))
                .unwrap_or_else(|error| panic!("{label}: reopen failed: {error}"));
            for session in 0..SESSIONS {
                let id = session_id(session);
                let acknowledged = ledger.durable.get(&id).copied().unwrap_or(0);
                let Ok(summary) = store.session(&id) else {
                    assert_eq!(acknowledged, 0, "{label}: {id} lost");
                    continue;
                };
                let ends = ledger.attempted.get(&id).cloned().unwrap_or_default();
                assert!(summary.events >= acknowledged, "{label}: {id} lost events");
                assert!(
                    summary.events == 0 || ends.contains(&summary.events),
                    "{label}: {id} ends at {} inside a batch",
                    summary.events
                );
                let read = read_planned(&store, &id, 0, u64::MAX)
                    .unwrap_or_else(|violation| panic!("{label}: {violation}"));
                let plan = planned(session);
                assert_eq!(read, plan[..read.len()], "{label}: {id} differs");
            }
            images_checked += 1;
        }
    }
    assert!(
        images_checked > operations,
        "{images_checked} images checked"
    );
}
