//! Property checks shared by the cargo-fuzz targets in `fuzz/` and the corpus replay test.
//! Each check takes arbitrary bytes and panics when a property fails; it never panics on
//! input that is merely invalid.

use crate::session::{fold_surface, parse_event_line_at, SurfaceFold};
use crate::storage::commit::Durability;
use crate::storage::frame::{decode_frame, EventRecord, Record};
use crate::storage::io::sim::{CrashImage, SimStorage};
use crate::storage::io::Storage;
use crate::storage::manifest::{Manifest, SegmentEntry, MANIFEST_FILE};
use crate::storage::run::{
    lay_out_entries, walk_block, BlockEntry, BlockItem, RunIndex, SessionEvents, RUN_VERSION,
};
use crate::storage::segment::{
    encode_header, segment_path, SEAL_FRAME_BYTES, SEGMENT_HEADER_BYTES, WAL_DIR,
};
use crate::store::{NewEvent, Options, SessionWriter, Store};
use std::path::Path;
use std::sync::Arc;

mod processes;
pub use processes::MODEL_PROCESSES;

/// Salt used when a check builds a segment from fuzz bytes.
pub const FUZZ_SALT: u64 = 0x5eed_5a17;
/// Segment size for fuzzed stores, in bytes.
pub const FUZZ_SEGMENT_BYTES: u64 = 8192;

/// Frame decode: any bytes decode or fail cleanly; a decoded record re-encodes identically.
pub fn check_frame_decode(bytes: &[u8]) {
    let Some((salt_bytes, frame_bytes)) = bytes.split_first_chunk::<8>() else {
        return;
    };
    let salt = u64::from_le_bytes(*salt_bytes);
    let Ok(frame) = decode_frame(frame_bytes, salt) else {
        return;
    };
    if let Ok(Some(record)) = Record::decode(&frame) {
        let mut encoded = Vec::new();
        record
            .encode(&mut encoded, salt)
            .expect("a decoded record fits a frame");
        if frame.flags == 0 {
            assert_eq!(
                encoded,
                &frame_bytes[..frame.total_bytes],
                "decoded record re-encodes differently"
            );
        }
    }
}

fn write_file(disk: &SimStorage, path: &str, bytes: &[u8]) {
    let file = disk.open(path, true).expect("sim create");
    file.write_at(bytes, 0).expect("sim write");
    file.sync_data().expect("sim sync");
}

/// Segment scan and recovery: a store whose only segment holds `bytes` after its header opens
/// or fails with a typed error, never panics; once opened, a close and a reopen give the same
/// sessions and events (recovery is idempotent).
pub fn check_segment_recovery(bytes: &[u8]) {
    // A whole segment file (its header names id and salt), or frames to put after a header.
    let (id, salt, segment) = match bytes.get(16..32) {
        Some(fields) => {
            let mut id = [0; 8];
            let mut salt = [0; 8];
            id.copy_from_slice(&fields[..8]);
            salt.copy_from_slice(&fields[8..]);
            (
                u64::from_le_bytes(id),
                u64::from_le_bytes(salt),
                bytes.to_vec(),
            )
        }
        None => {
            let mut segment = encode_header(1, FUZZ_SALT);
            segment.extend_from_slice(bytes);
            (1, FUZZ_SALT, segment)
        }
    };
    let Some(next_segment_id) = id.checked_add(1) else {
        return;
    };
    let disk = SimStorage::new();
    disk.create_dir(WAL_DIR).expect("sim dir");
    write_file(&disk, &segment_path(id), &segment);
    disk.sync_dir(WAL_DIR).expect("sim sync");
    let manifest = Manifest {
        segments: vec![SegmentEntry { id, salt }],
        runs: Vec::new(),
        next_segment_id,
    };
    manifest.write(&disk).expect("sim manifest");
    let options = Options {
        segment_bytes: FUZZ_SEGMENT_BYTES,
        ..Options::default()
    };
    let open = || Store::open_on(Arc::new(disk.clone()), options.clone(), Path::new("fuzz"));
    let Ok(store) = open() else {
        return;
    };
    let before = contents(&store);
    store.close().expect("close after recovery");
    drop(store);
    let reopened = open().expect("a recovered store reopens");
    assert_eq!(
        contents(&reopened),
        before,
        "reopen changed the recovered log"
    );
}

/// Damage steps a [`check_damaged_seal`] input holds at most (3 bytes each).
pub const MAX_SEAL_DAMAGE_STEPS: usize = 8;
/// How far from the end of the last segment a damage step lands, in bytes: the seal and the
/// end of the commit before it.
pub const SEAL_DAMAGE_WINDOW_BYTES: u64 = SEAL_FRAME_BYTES + 16;

/// A closed store of two sessions, `b` in segment 1 and `a` in segment 2, both sealed and
/// covered by the checkpoint: what [`check_damaged_seal`] damages.
fn sealed_two_session_store() -> CrashImage {
    let disk = SimStorage::new();
    let options = Options {
        segment_bytes: FUZZ_SEGMENT_BYTES,
        ..Options::default()
    };
    for id in ["b", "a"] {
        let store = Store::open_on(Arc::new(disk.clone()), options.clone(), Path::new("fuzz"))
            .expect("sim open");
        let mut writer = store.create_session_with_id(id).expect("session");
        for seq in 0..3 {
            let data = format!("{{\"session\":\"{id}\",\"seq\":{seq}}}");
            writer.append(NewEvent::new("note", &data)).expect("append");
        }
        drop(writer);
        store.close().expect("close");
    }
    disk.durable_image()
}

/// Applies one damage step (`op`, `at`, `size`) near the end of the last segment: a cut, a
/// flipped bit, or zeroed bytes.
fn damage_tail(segment: &mut Vec<u8>, op: u8, at: u8, size: u8) {
    let length = segment.len() as u64;
    if length <= SEGMENT_HEADER_BYTES {
        return;
    }
    let back = u64::from(at) % SEAL_DAMAGE_WINDOW_BYTES.min(length - SEGMENT_HEADER_BYTES);
    let position = (length - 1 - back) as usize;
    match op % 3 {
        0 => segment.truncate((length - 1 - back) as usize),
        1 => segment[position] ^= 1 << (size % 8),
        _ => {
            let end = (position + 1 + usize::from(size % 40)).min(segment.len());
            segment[position..end].fill(0);
        }
    }
}

/// What every session holds, read with or without the checkpoint; `None` if the open or a
/// read fails.
fn readable_contents(
    image: &CrashImage,
    use_checkpoint: bool,
) -> Option<Vec<(String, Vec<String>)>> {
    let options = Options {
        read_only: true,
        create_if_missing: false,
        use_checkpoint,
        ..Options::default()
    };
    let disk = SimStorage::from_image(image);
    let store = Store::open_on(Arc::new(disk), options, Path::new("fuzz")).ok()?;
    let mut sessions = Vec::new();
    for summary in store.sessions() {
        let events = store.read(&summary.id, 0, u64::MAX).ok()?;
        sessions.push((
            summary.id,
            events.into_iter().map(|event| event.data).collect(),
        ));
    }
    Some(sessions)
}

/// What the store holds if it reads whole with its checkpoint and without, alike.
fn reads_whole(image: &CrashImage) -> Option<Vec<(String, Vec<String>)>> {
    let with = readable_contents(image, true)?;
    (readable_contents(image, false)? == with).then_some(with)
}

/// Damaged seals (format-spec F-05-12): damage steps at the tail of the last segment of a
/// closed store (a lost, torn or cut seal, flipped or zeroed bytes before it), then a
/// writable open and an append. A store that read whole before (with and without its
/// checkpoint) reads whole after, with every event it held; a refused writable open is a
/// corruption error and changes no byte.
pub fn check_damaged_seal(bytes: &[u8]) {
    let mut image = sealed_two_session_store();
    let Some(last) = image
        .file(MANIFEST_FILE)
        .and_then(|manifest| Manifest::decode(manifest).ok())
        .and_then(|manifest| manifest.segments.last().copied())
    else {
        panic!("the base store has a manifest naming a segment");
    };
    let path = segment_path(last.id);
    for step in bytes.chunks_exact(3).take(MAX_SEAL_DAMAGE_STEPS) {
        if let Some(segment) = image.file_mut(&path) {
            damage_tail(segment, step[0], step[1], step[2]);
        }
    }
    let Some(before) = reads_whole(&image) else {
        return;
    };
    let disk = SimStorage::from_image(&image);
    let untouched = disk.volatile_image();
    let options = Options {
        segment_bytes: FUZZ_SEGMENT_BYTES,
        create_if_missing: false,
        ..Options::default()
    };
    let store = match Store::open_on(Arc::new(disk.clone()), options, Path::new("fuzz")) {
        Ok(store) => store,
        Err(error) => {
            assert!(error.is_corruption(), "refused with {error}");
            let after = disk.volatile_image();
            let names: Vec<&str> = untouched.file_names().collect();
            assert_eq!(after.file_names().collect::<Vec<_>>(), names);
            for name in names {
                assert_eq!(after.file(name), untouched.file(name), "{name} changed");
            }
            return;
        }
    };
    let mut writer = store.writer("a").expect("session a");
    writer
        .append(NewEvent::new("note", "{}"))
        .expect("append after the open");
    drop(writer);
    store.close().expect("close");
    let after = reads_whole(&disk.durable_image()).expect("the store reads whole after the append");
    for ((id, held), (after_id, now)) in before.iter().zip(&after) {
        assert_eq!(id, after_id);
        assert!(now.starts_with(held), "session {id} lost events");
    }
}

fn contents(store: &Store) -> Vec<(String, Vec<String>)> {
    store
        .sessions()
        .into_iter()
        .map(|summary| {
            let lines = store
                .read(&summary.id, 0, u64::MAX)
                .expect("recovered events read back")
                .iter()
                .map(|event| event.to_json_line())
                .collect();
            (summary.id, lines)
        })
        .collect()
}

/// Surface fold: the incremental fold of the accepted prefix of the input's lines equals the
/// fold from scratch of that prefix, nodes and messages alike.
pub fn check_surface_fold(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let mut fold = SurfaceFold::new();
    let mut accepted = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let Ok(event) = parse_event_line_at(line, index) else {
            break;
        };
        if fold.apply(&event).is_err() {
            break;
        }
        accepted.push(event);
    }
    let scratch = fold_surface(&accepted).expect("an accepted prefix folds from scratch");
    assert_eq!(
        fold.nodes(),
        scratch.nodes,
        "incremental and scratch folds differ"
    );
}

/// Script byte that runs `Store::maintain` (sealing, run rewriting) instead of an append.
const MODEL_MAINTAIN: u8 = 0xFF;
/// Script bytes `≡ MODEL_DELETE (mod 32)` delete session `byte / 32 % 4` instead.
const MODEL_DELETE: u8 = 31;
/// Sessions the model scripts.
const MODEL_SESSIONS: usize = 4;
/// A model script that, uncut, fills more than a segment, seals it into a run, deletes
/// session 1 (63 ≡ 31 mod 32), rewrites the run without it, appends more and seals again:
/// a seed for the corpus replay (behind a cut byte).
pub const MODEL_SEED_SCRIPT: &[u8] = &[
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 0xFF, 63, 0xFF, 130, 129, 0xFF,
];

/// What the model knows of one scripted session.
#[derive(Default)]
struct ModelSession {
    writer: Option<SessionWriter>,
    /// Events acknowledged since the session was (re)created.
    acknowledged: Vec<String>,
    /// Acknowledged deleted and not created again.
    deleted: bool,
    /// A delete failed (the cut): whether it is durable is unknown, so nothing is checked.
    unknown: bool,
}

/// Model check: bytes script sessions, batches, maintenance passes (sealing into runs and
/// rewriting runs), deletes and a power cut on the simulated disk; after the cut every
/// acknowledged event is present, nothing else differs from the model, an acknowledged
/// delete stays done, and the same holds after the recovered store seals everything.
///
/// A script starting with [`MODEL_PROCESSES`] runs the many-process model instead: the
/// same across several shared-mode processes with leases, refreshes, followers and kills
/// (see `fuzzing/processes.rs`).
pub fn check_model(bytes: &[u8]) {
    let Some((&cut, script)) = bytes.split_first() else {
        return;
    };
    if cut == MODEL_PROCESSES {
        processes::check_model_processes(script);
        return;
    }
    let disk = SimStorage::new();
    let options = Options {
        segment_bytes: FUZZ_SEGMENT_BYTES,
        durability: Durability::Sync,
        ..Options::default()
    };
    let open = |disk: &SimStorage| {
        Store::open_on(Arc::new(disk.clone()), options.clone(), Path::new("model"))
    };
    let Ok(store) = open(&disk) else {
        return;
    };
    disk.crash_at(disk.operation_count() + u64::from(cut));
    let mut sessions: Vec<ModelSession> = (0..MODEL_SESSIONS)
        .map(|_| ModelSession::default())
        .collect();
    for (step, &byte) in script.iter().enumerate() {
        let done = if byte == MODEL_MAINTAIN {
            store.maintain().is_ok()
        } else if byte % 32 == MODEL_DELETE {
            model_delete(
                &store,
                &mut sessions[usize::from(byte / 32) % MODEL_SESSIONS],
                byte,
            )
        } else {
            model_append(&store, &mut sessions, step, byte)
        };
        if !done {
            break;
        }
    }
    for session in &mut sessions {
        session.writer = None;
    }
    drop(store);
    let images = disk.take_images();
    let image = images
        .first()
        .cloned()
        .unwrap_or_else(|| disk.durable_image());
    let recovered = open(&SimStorage::from_image(&image)).expect("the store opens after a cut");
    check_model_state(&recovered, &sessions);
    recovered.maintain().expect("the recovered store seals");
    check_model_state(&recovered, &sessions);
}

fn model_id(session: usize) -> String {
    format!("m{session}")
}

/// Appends a batch of `byte / 64 + 1` events to session `byte % 4`, creating it if needed.
fn model_append(store: &Store, sessions: &mut [ModelSession], step: usize, byte: u8) -> bool {
    let number = usize::from(byte) % MODEL_SESSIONS;
    let session = &mut sessions[number];
    if session.writer.is_none() {
        let Ok(writer) = store.create_session_with_id(&model_id(number)) else {
            return false;
        };
        session.writer = Some(writer);
        session.acknowledged.clear();
        session.deleted = false;
    }
    let Some(writer) = session.writer.as_mut() else {
        return false;
    };
    let count = usize::from(byte / 64) + 1;
    let texts: Vec<String> = (0..count)
        .map(|index| {
            format!(
                "{{\"step\":{step},\"i\":{index},\"pad\":\"{}\"}}",
                "p".repeat(usize::from(byte))
            )
        })
        .collect();
    let events: Vec<NewEvent<'_>> = texts
        .iter()
        .map(|text| NewEvent::new("assistant/chunk", text))
        .collect();
    if writer.append_batch(&events).is_err() {
        return false;
    }
    session.acknowledged.extend(texts);
    true
}

/// Deletes the session (its writer dropped first); a session never created is skipped.
fn model_delete(store: &Store, session: &mut ModelSession, byte: u8) -> bool {
    if session.writer.take().is_none() {
        return true;
    }
    let number = usize::from(byte / 32) % MODEL_SESSIONS;
    match store.delete_session(&model_id(number)) {
        Ok(()) => {
            session.acknowledged.clear();
            session.deleted = true;
            true
        }
        Err(_) => {
            session.unknown = true;
            false
        }
    }
}

fn check_model_state(store: &Store, sessions: &[ModelSession]) {
    for (number, session) in sessions.iter().enumerate() {
        let id = model_id(number);
        if session.unknown {
            continue;
        }
        if session.deleted {
            assert!(
                matches!(store.session(&id), Err(crate::Error::UnknownSession { .. })),
                "an acknowledged delete was undone"
            );
            continue;
        }
        let events = store.read(&id, 0, u64::MAX).unwrap_or_default();
        assert!(
            events.len() >= session.acknowledged.len(),
            "acknowledged events lost"
        );
        for (event, text) in events.iter().zip(&session.acknowledged) {
            assert_eq!(&event.data, text, "recovered event differs");
        }
    }
}

/// Lines per zstd frame when [`check_dsh_import`] frames fuzz plaintext itself.
const FUZZ_LINES_PER_FRAME: usize = 3;

fn fuzz_store() -> Store {
    let options = Options {
        durability: Durability::Buffered,
        segment_bytes: FUZZ_SEGMENT_BYTES,
        ..Options::default()
    };
    Store::open_on(Arc::new(SimStorage::new()), options, Path::new("fuzz"))
        .expect("a fresh simulated store opens")
}

/// `plain` as DSH frames it: frame 1 the header line, then `FUZZ_LINES_PER_FRAME` lines a frame.
fn dsh_frames(plain: &[u8]) -> Option<Vec<u8>> {
    let mut lines = plain.split_inclusive(|&byte| byte == b'\n');
    let mut out = zstd_frame(lines.next()?)?;
    let rest: Vec<&[u8]> = lines.collect();
    for group in rest.chunks(FUZZ_LINES_PER_FRAME) {
        out.extend(zstd_frame(&group.concat())?);
    }
    Some(out)
}

fn zstd_frame(plain: &[u8]) -> Option<Vec<u8>> {
    let mut compressor = zstd::bulk::Compressor::new(3).ok()?;
    compressor
        .set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
        .ok()?;
    compressor.compress(plain).ok()
}

/// DSH import: the first byte picks the encoding. Plain JSONL (even first byte) and
/// well-framed zstd of the fuzz plaintext (first byte 1 mod 4): an accepted import exports
/// exactly the accepted plaintext (everything before a dropped torn tail). Raw bytes as a zstd
/// file (3 mod 4): import fails cleanly or succeeds, never panics.
pub fn check_dsh_import(bytes: &[u8]) {
    let Some((&mode, input)) = bytes.split_first() else {
        return;
    };
    let store = fuzz_store();
    match mode % 4 {
        0 | 2 => {
            let Ok(report) = crate::exchange::import_dsh_jsonl(&store, input) else {
                return;
            };
            let exported = crate::exchange::export_dsh_jsonl(&store, &report.session_id)
                .expect("an imported session exports");
            assert_eq!(
                exported,
                accepted_prefix(input, &report),
                "plain export differs"
            );
        }
        1 => {
            let Some(file) = dsh_frames(input) else {
                return;
            };
            let Ok(report) = crate::exchange::import_dsh_jsonl_zstd(&store, &file) else {
                return;
            };
            let exported = crate::exchange::export_dsh_jsonl_zstd(&store, &report.session_id)
                .expect("an imported session exports");
            let plain = zstd::stream::decode_all(exported.as_slice()).expect("export decodes");
            assert_eq!(
                plain,
                accepted_prefix(input, &report),
                "zstd export differs"
            );
        }
        _ => check_bounded_zstd_import(&store, input),
    }
}

/// Plaintext limit of the bounded mode of [`check_dsh_import`]: small, so that a decoding
/// bomb (a few bytes of zstd that expand to gigabytes) reaches it in microseconds.
pub const FUZZ_IMPORT_PLAINTEXT_BYTES: u64 = 64 * 1024;

/// The import limits of the bounded mode: a line may be the whole plaintext.
fn fuzz_import_limits() -> crate::exchange::ImportLimits {
    crate::exchange::ImportLimits {
        max_line_bytes: FUZZ_IMPORT_LINE_BYTES,
        max_plaintext_bytes: FUZZ_IMPORT_PLAINTEXT_BYTES,
    }
}

/// [`FUZZ_IMPORT_PLAINTEXT_BYTES`] as a line length.
const FUZZ_IMPORT_LINE_BYTES: usize = 64 * 1024;
const _: () = assert!(FUZZ_IMPORT_LINE_BYTES as u64 == FUZZ_IMPORT_PLAINTEXT_BYTES);

/// Any bytes as a `.jsonl.zstd` under a small plaintext limit: a bomb or an oversized frame is
/// a typed `TooLarge` refusal that stores nothing, never an abort or unbounded memory.
fn check_bounded_zstd_import(store: &Store, input: &[u8]) {
    let sessions_before = store.sessions().len();
    match crate::exchange::import_dsh_jsonl_zstd_limited(store, input, &fuzz_import_limits()) {
        Ok(report) => {
            let exported = crate::exchange::export_dsh_jsonl(store, &report.session_id)
                .expect("an imported session exports");
            assert!(
                exported.len() as u64 <= FUZZ_IMPORT_PLAINTEXT_BYTES,
                "imported more plaintext than the limit"
            );
        }
        Err(crate::exchange::ExchangeError::TooLarge { .. }) => assert_eq!(
            store.sessions().len(),
            sessions_before,
            "a refused import stored a session"
        ),
        Err(_) => {}
    }
}

fn accepted_prefix<'input>(
    input: &'input [u8],
    report: &crate::exchange::ImportReport,
) -> &'input [u8] {
    let end = report
        .dropped
        .as_ref()
        .and_then(|dropped| usize::try_from(dropped.offset).ok())
        .unwrap_or(input.len());
    &input[..end.min(input.len())]
}

/// An event as a run entry walk yields it, its texts owned: (session, seq, time, type,
/// flags, data, envelope).
pub type WalkedEvent = (u32, u64, i64, u32, u8, Vec<u8>, Vec<u8>);

/// The events of a decompressed event block of a version-2 run, or `None` when it is not a
/// valid one. Each row entry must yield exactly its `member_count` members.
fn walked_events(raw: &[u8]) -> Option<Vec<WalkedEvent>> {
    let index = RunIndex {
        id: 1,
        version: RUN_VERSION,
        salt: FUZZ_SALT,
        source_segment: 0,
        blocks: Vec::new(),
    };
    let block = BlockEntry {
        session: 0,
        event_count: 0,
        first_seq: 0,
        raw_offset: 0,
        raw_bytes: u32::try_from(raw.len()).ok()?,
        stored_checksum: 0,
        file_offset: 0,
        stored_bytes: 0,
    };
    let mut events = Vec::new();
    let mut data = Vec::new();
    let walked = walk_block(raw, &block, &index, |_, _, item| {
        match item {
            BlockItem::Row(row) => {
                let before = events.len();
                for member in row.members() {
                    let event = row.member_event(&member, &mut data);
                    events.push(walked_event(&event));
                }
                assert_eq!(
                    u32::try_from(events.len() - before).ok(),
                    Some(row.member_count),
                    "a decoded row entry yields another number of members"
                );
            }
            BlockItem::Record(Record::Event(event)) => events.push(walked_event(&event)),
            BlockItem::Record(_) => {}
        }
        Ok(())
    });
    walked.ok().map(|()| events)
}

/// `event` with its texts copied: for comparing events decoded by different readers.
pub fn walked_event(event: &EventRecord<'_>) -> WalkedEvent {
    (
        event.session,
        event.seq,
        event.time,
        event.type_number,
        event.flags,
        event.data.to_vec(),
        event.envelope.to_vec(),
    )
}

/// Run entries (format-spec F-06-30 … F-06-32): any bytes walked as a decompressed event
/// block of a version-2 run decode or fail cleanly, never panic; every row entry yields its
/// members; and the events of a valid block that are consecutive seqs of one session, laid
/// out as run entries again (the writer's row grouping), walk back to the same events.
pub fn check_run_entries(bytes: &[u8]) {
    let Some(events) = walked_events(bytes) else {
        return;
    };
    let Some(first) = events.first() else {
        return;
    };
    let consecutive = events.iter().enumerate().all(|(position, event)| {
        let seq = u64::try_from(position)
            .ok()
            .and_then(|position| first.1.checked_add(position));
        event.0 == first.0 && Some(event.1) == seq
    });
    if !consecutive {
        return;
    }
    let records: Vec<EventRecord<'_>> = events
        .iter()
        .map(
            |(session, seq, time, type_number, flags, data, envelope)| EventRecord {
                session: *session,
                seq: *seq,
                time: *time,
                type_number: *type_number,
                flags: *flags,
                data,
                envelope,
            },
        )
        .collect();
    let session = SessionEvents {
        session: first.0,
        first_seq: first.1,
        events: records,
    };
    let Ok(laid_out) = lay_out_entries(&session, FUZZ_SALT) else {
        return;
    };
    let again = walked_events(&laid_out.raw).expect("the writer's entries walk");
    assert_eq!(again, events, "events laid out again read back differently");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed bomb seed (16 MiB of zeros in 624 bytes of zstd) is what the bounded mode
    /// claims to cover: refused as too large, nothing stored.
    #[test]
    fn the_bomb_seed_is_refused_under_the_fuzz_limit() {
        let seed = include_bytes!("../../fuzz/seeds/dsh_import/bomb-16mib-of-zeros.bin");
        let (&mode, input) = seed.split_first().expect("a mode byte");
        assert_eq!(mode % 4, 3, "the seed selects the bounded mode");
        let store = fuzz_store();
        let refused =
            crate::exchange::import_dsh_jsonl_zstd_limited(&store, input, &fuzz_import_limits());
        assert!(
            matches!(
                refused,
                Err(crate::exchange::ExchangeError::TooLarge { .. })
            ),
            "{:?}",
            refused.map(|report| report.session_id)
        );
        assert!(store.sessions().is_empty());
        check_dsh_import(seed);
    }

    /// [`MODEL_SEED_SCRIPT`] does seal, delete and rewrite a run when no cut stops it: the
    /// replayed model exercises what it claims to.
    #[test]
    fn the_replay_seed_script_reaches_a_run_rewrite() {
        let disk = SimStorage::new();
        let options = Options {
            segment_bytes: FUZZ_SEGMENT_BYTES,
            durability: Durability::Sync,
            ..Options::default()
        };
        let store =
            Store::open_on(Arc::new(disk.clone()), options, Path::new("model")).expect("open");
        let mut sessions: Vec<ModelSession> = (0..MODEL_SESSIONS)
            .map(|_| ModelSession::default())
            .collect();
        let mut rewritten = 0;
        for (step, &byte) in MODEL_SEED_SCRIPT.iter().enumerate() {
            if byte == MODEL_MAINTAIN {
                rewritten += store.maintain().expect("maintain").runs_rewritten;
            } else if byte % 32 == MODEL_DELETE {
                assert!(model_delete(&store, &mut sessions[1], byte));
            } else {
                assert!(model_append(&store, &mut sessions, step, byte));
            }
        }
        assert!(rewritten > 0);
        check_model_state(&store, &sessions);
    }
}
