//! Unit tests of group commit's state machine (format-spec/05, "Group commit and durability
//! modes"): how queued batches form one write per segment, and when the committer is due
//! (`Sync` at once, gathering after a busy group, `Batched { max_delay, max_bytes }` by
//! deadline or bytes, `Buffered` written without a sync, flush and close at once). `State`
//! is driven directly with explicit instants, so no test depends on thread timing.

use super::*;
use crate::storage::io::sim::SimStorage;

const SEGMENT: u64 = 1;

fn file() -> Arc<dyn StorageFile> {
    let disk = SimStorage::new();
    disk.open("segment", true).expect("sim file")
}

/// The state of a log whose active segment ends at the 64-byte header, nothing queued.
fn fresh_state() -> State {
    State::new(
        file(),
        Manifest::default(),
        SEGMENT,
        7,
        SEGMENT_HEADER_BYTES,
    )
}

/// What `Log::submit` does to the state for a batch of `bytes` bytes, submitted at `at`.
fn submit(state: &mut State, durability: Durability, bytes: usize, at: Instant) -> u64 {
    let ticket = state.next_ticket;
    let offset = state.active.context.base_offset;
    state.active.context.base_offset += bytes as u64;
    state.next_ticket += 1;
    state.queued_since.get_or_insert(at);
    state.note_durability(durability, bytes, ticket);
    let file = state.active.file.clone();
    state.enqueue(file, SEGMENT, offset, vec![b'x'; bytes], None);
    ticket
}

fn batched(max_delay: Duration, max_bytes: usize) -> Durability {
    Durability::Batched {
        max_delay,
        max_bytes,
    }
}

#[test]
fn contiguous_batches_of_one_segment_become_one_write() {
    let mut state = fresh_state();
    let now = Instant::now();
    for bytes in [10, 20, 30] {
        submit(&mut state, Durability::Buffered, bytes, now);
    }
    assert_eq!(state.queue.len(), 1, "one chunk: one pwrite for the group");
    let chunk = &state.queue[0];
    assert_eq!(chunk.offset, SEGMENT_HEADER_BYTES);
    assert_eq!(chunk.bytes.len(), 60);
    assert_eq!(state.queued_bytes, 60);
}

#[test]
fn a_seal_closes_its_chunk_and_another_segment_or_a_gap_starts_a_new_one() {
    let mut state = fresh_state();
    let file = state.active.file.clone();
    state.enqueue(file.clone(), SEGMENT, 64, vec![1; 8], None);
    // The seal of a roll ends its segment's chunk with a trim.
    state.enqueue(file.clone(), SEGMENT, 72, vec![2; 8], Some(80));
    assert_eq!(state.queue.len(), 1, "the seal joins the batch before it");
    assert_eq!(state.queue[0].trim_to, Some(80));
    // Bytes after a trimmed chunk never join it, even when contiguous.
    state.enqueue(file.clone(), SEGMENT, 80, vec![3; 8], None);
    // The next segment's bytes, and bytes after a gap, start chunks of their own.
    state.enqueue(file.clone(), SEGMENT + 1, 64, vec![4; 8], None);
    state.enqueue(file, SEGMENT + 1, 100, vec![5; 8], None);
    let starts: Vec<(u64, u64)> = state
        .queue
        .iter()
        .map(|chunk| (chunk.segment, chunk.offset))
        .collect();
    assert_eq!(
        starts,
        [
            (SEGMENT, 64),
            (SEGMENT, 80),
            (SEGMENT + 1, 64),
            (SEGMENT + 1, 100)
        ]
    );
    assert_eq!(state.queued_bytes, 40);
}

#[test]
fn nothing_queued_is_never_due_and_sleeps_without_deadline() {
    let state = fresh_state();
    assert_eq!(state.due(Instant::now()), (false, None));
}

#[test]
fn a_lone_sync_append_is_due_at_once() {
    let mut state = fresh_state();
    let now = Instant::now();
    submit(&mut state, Durability::Sync, 10, now);
    assert_eq!(state.due(now), (true, None));
}

#[test]
fn after_a_busy_group_a_sync_waits_for_the_others_at_most_the_gather_time() {
    let mut state = fresh_state();
    state.last_group_tickets = 3;
    let since = Instant::now();
    submit(&mut state, Durability::Sync, 10, since);
    let gather_end = since + MAX_GROUP_GATHER;
    assert_eq!(state.due(since), (false, Some(gather_end)));
    assert_eq!(
        state.due(gather_end),
        (true, None),
        "never longer than the gather time"
    );
    // The group is due as soon as as many appenders as last time have submitted.
    submit(&mut state, Durability::Sync, 10, since);
    assert!(!state.due(since).0);
    submit(&mut state, Durability::Buffered, 10, since);
    assert_eq!(state.due(since), (true, None));
}

#[test]
fn a_flush_or_close_ends_gathering_at_once() {
    for make_urgent in [
        (|state: &mut State| state.urgent = true) as fn(&mut State),
        |state: &mut State| state.closing = true,
    ] {
        let mut state = fresh_state();
        state.last_group_tickets = 4;
        let now = Instant::now();
        submit(&mut state, Durability::Sync, 10, now);
        assert!(!state.due(now).0);
        make_urgent(&mut state);
        assert_eq!(state.due(now), (true, None));
    }
}

#[test]
fn batched_is_due_at_its_deadline_not_before() {
    let mut state = fresh_state();
    let max_delay = Duration::from_millis(5);
    let now = Instant::now();
    submit(&mut state, batched(max_delay, 1 << 20), 10, now);
    let deadline = state
        .batched_deadline
        .expect("a batched append sets a deadline");
    assert!(deadline >= now + max_delay);
    assert_eq!(state.due(now), (false, Some(deadline)));
    assert_eq!(state.due(deadline), (true, None));
    // A later batched append keeps the first deadline: max_delay bounds the oldest one.
    let later = deadline - Duration::from_millis(1);
    submit(&mut state, batched(max_delay, 1 << 20), 10, later);
    assert_eq!(state.batched_deadline, Some(deadline));
    // Batched appends wake nobody: they are not counted for gathering.
    assert_eq!(state.queued_waitable, 0);
}

#[test]
fn batched_is_due_once_max_bytes_are_queued_with_the_smallest_budget_winning() {
    let mut state = fresh_state();
    let max_delay = Duration::from_secs(60);
    let now = Instant::now();
    submit(&mut state, batched(max_delay, 100), 60, now);
    assert!(!state.due(now).0, "60 of 100 bytes: wait for the deadline");
    // A batch asking for a 80-byte budget lowers it for the whole pending group.
    submit(&mut state, batched(max_delay, 80), 20, now);
    assert_eq!(state.batched_max_bytes, 80);
    assert_eq!(
        state.due(now),
        (true, None),
        "80 bytes queued reach the budget"
    );
}

#[test]
fn buffered_wants_a_write_but_no_sync() {
    let mut state = fresh_state();
    let now = Instant::now();
    let ticket = submit(&mut state, Durability::Buffered, 10, now);
    assert_eq!(state.write_wanted, ticket);
    assert_eq!(
        state.sync_wanted, 0,
        "buffered never asks for a sync by itself"
    );
    assert_eq!(state.due(now), (true, None), "due to be written");
    // Once written, nothing more is due: its sync waits for a flush, a Sync append or close.
    state.queue.clear();
    state.written_ticket = ticket;
    state.queued_since = None;
    assert_eq!(state.due(now), (false, None));
    state.sync_wanted = ticket;
    assert_eq!(state.due(now), (true, None), "a flush makes the sync due");
}

#[test]
fn waiters_finish_on_their_kind_of_progress_or_on_poison() {
    let mut state = fresh_state();
    let now = Instant::now();
    let written = submit(&mut state, Durability::Buffered, 10, now);
    let durable = submit(&mut state, Durability::Sync, 10, now);
    assert!(state.wait_outcome(written, false).is_none());
    state.written_ticket = durable;
    assert!(matches!(state.wait_outcome(written, false), Some(Ok(()))));
    assert!(
        state.wait_outcome(durable, true).is_none(),
        "written is not durable (F-05-6)"
    );
    state.poison("sync", io::Error::from_raw_os_error(libc::EIO));
    assert!(matches!(
        state.wait_outcome(durable, true),
        Some(Err(Error::Poisoned {
            operation: "sync",
            ..
        }))
    ));
    assert!(matches!(state.check_usable(), Err(Error::Poisoned { .. })));
}

#[test]
fn the_first_failure_stays_the_cause_of_the_poison() {
    let mut state = fresh_state();
    state.poison("write", io::Error::from_raw_os_error(libc::ENOSPC));
    let later = state.poison("sync", io::Error::from_raw_os_error(libc::EIO));
    assert!(
        matches!(
            later,
            Error::Poisoned {
                operation: "write",
                ..
            }
        ),
        "{later:?}"
    );
    assert_eq!(later.io_kind(), Some(io::ErrorKind::StorageFull));
}

/// A log on a fresh simulated disk whose committer the test runs group by group.
fn stopped_log(disk: &SimStorage) -> Log {
    let salt = 7;
    disk.create_dir(crate::storage::segment::WAL_DIR)
        .expect("wal directory");
    let file = create_segment(disk, SEGMENT, salt, 1 << 20).expect("segment");
    let options = LogOptions {
        segment_bytes: 1 << 20,
        max_pending_bytes: 1 << 20,
        max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
    };
    let state = State::new(
        file,
        Manifest::default(),
        SEGMENT,
        salt,
        SEGMENT_HEADER_BYTES,
    );
    Log::without_committer(Arc::new(disk.clone()), options, state)
}

fn submit_bytes(log: &Log, bytes: usize) -> Result<u64> {
    let (submitted, ()) = log.submit(Durability::Sync, |_, out| {
        out.resize(out.len() + bytes, b'x');
        Ok(())
    })?;
    Ok(submitted.ticket)
}

/// What the committer thread does for one group.
fn run_one_group(log: &Log) {
    drop(log.shared.commit_group(log.shared.state.lock()));
}

fn assert_disk_full(error: &Error, operation: &str, context: &str) {
    assert!(
        matches!(error, Error::Poisoned { operation: failed, .. } if *failed == operation),
        "{context}: {error:?}"
    );
    assert_eq!(
        error.io_kind(),
        Some(io::ErrorKind::StorageFull),
        "{context}: {error:?}"
    );
    assert!(
        error.to_string().contains("the disk is full"),
        "{context}: {error}"
    );
    let source = std::error::Error::source(error).expect("the poison keeps its cause");
    assert!(
        source.to_string().contains("No space left on device"),
        "{context}: {source}"
    );
}

/// ENOSPC on the group's write (`Write`) or on its `fdatasync` (`Sync`): every appender of
/// the group, asleep or not yet waiting, and every later append learn that the disk is full.
#[test]
fn a_full_disk_in_group_commit_reaches_every_waiter_and_later_appends() {
    for (fault, operation) in [
        (crate::storage::io::sim::FaultKind::Write, "write"),
        (crate::storage::io::sim::FaultKind::Sync, "sync"),
    ] {
        let disk = SimStorage::new();
        let log = stopped_log(&disk);
        let tickets: Vec<u64> = (0..4)
            .map(|_| submit_bytes(&log, 100).expect("queued"))
            .collect();
        disk.fail_nth_with(fault, 0, libc::ENOSPC);
        let log_ref = &log;
        std::thread::scope(|scope| {
            let sleepers: Vec<_> = tickets[..2]
                .iter()
                .map(|&ticket| scope.spawn(move || log_ref.wait(ticket, true)))
                .collect();
            while log.shared.state.lock().waiters.len() < sleepers.len() {
                std::thread::yield_now();
            }
            run_one_group(&log);
            for sleeper in sleepers {
                let outcome = sleeper.join().expect("waiter thread");
                let error = outcome.expect_err("a failed group is not durable");
                assert_disk_full(&error, operation, "asleep in the group");
            }
        });
        for &ticket in &tickets[2..] {
            let error = log.wait(ticket, true).expect_err("not durable");
            assert_disk_full(&error, operation, "waiting after the group");
        }
        let later = submit_bytes(&log, 100).expect_err("a poisoned log takes nothing");
        assert_disk_full(&later, operation, "a later append");
        let flush = log.flush().expect_err("a poisoned log flushes nothing");
        assert_disk_full(&flush, operation, "a later flush");
    }
}

/// Submits a batch that defines `session` (a header's worth of `bytes` when new) and fails
/// with `refuse` after encoding, if given. Returns whether the batch wrote the header.
fn submit_defining(log: &Log, session: u32, bytes: usize, refuse: bool) -> Result<bool> {
    let (_, wrote_header) = log.submit(Durability::Sync, |context, out| {
        let new = context.define_session(session);
        if new {
            out.resize(out.len() + bytes, b'h');
        }
        if refuse {
            return Err(Error::invalid("refused after encoding"));
        }
        Ok(new)
    })?;
    Ok(wrote_header)
}

/// A batch refused after it defined a session (by its own encoder, or by the batch size
/// limit) leaves no definition behind: the next batch of the session writes the header
/// again. Taken back from the journal, not from a copy of the sets.
#[test]
fn a_refused_batch_takes_back_the_definitions_it_made() {
    let disk = SimStorage::new();
    let log = stopped_log(&disk);
    assert!(submit_defining(&log, 3, 10, true).is_err());
    assert!(
        submit_defining(&log, 3, 10, false).expect("accepted"),
        "the header of the refused batch was taken back"
    );
    assert!(
        !submit_defining(&log, 3, 10, false).expect("accepted"),
        "an accepted definition stays"
    );
    let oversized = usize::try_from(DEFAULT_MAX_BATCH_BYTES).expect("fits") + 1;
    let refused = submit_defining(&log, 4, oversized, false).expect_err("over the limit");
    assert!(matches!(refused, Error::TooLarge { .. }), "{refused:?}");
    assert!(
        submit_defining(&log, 4, 10, false).expect("accepted"),
        "the oversized batch's header was taken back"
    );
}

/// A batch that does not fit the active segment goes to a new one, where it defines its
/// session again; the full segment keeps only the definitions of batches it holds.
#[test]
fn a_batch_moved_to_a_new_segment_defines_its_session_there() {
    let disk = SimStorage::new();
    let log = stopped_log(&disk);
    assert!(submit_defining(&log, 1, 10, false).expect("first"));
    let segment_bytes = usize::try_from(log.shared.options.segment_bytes).expect("fits");
    assert!(submit_defining(&log, 2, segment_bytes / 2, false).expect("second"));
    let before = log.shared.state.lock().active.context.segment;
    assert!(submit_defining(&log, 5, segment_bytes / 2 + 1, false).expect("rolled"));
    let state = log.shared.state.lock();
    assert_ne!(
        state.active.context.segment, before,
        "the third batch rolled"
    );
    assert!(state.active.context.defined_sessions.contains(&5));
    assert!(
        !state.active.context.defined_sessions.contains(&1),
        "a new segment starts without the old one's definitions"
    );
}
