//! Seals that retry: a node queues a session for sealing and a background round seals what is
//! due, backing off while a seal fails (the cold store down, a leader election) so that an
//! S3 outage delays sealing without losing anything (FLEET.md §5.7: "sealing backs off").
//!
//! A failed seal changes nothing that matters: the run is PUT under an immutable key that
//! names its range and epoch, and the manifest moves only by CAS after the run is checked, so
//! retrying the whole seal is safe. A seal refused with `Moved` naming another node is
//! dropped from the queue: the shard's new owner seals the session. One refused while the
//! shard's record names this node (it lost its lease and takes the shard back) or names
//! nobody it could read stays queued and retries with the backoff: a seal request survives
//! its node's lost lease.

use crate::backend::{ColdStore, Coordinator, TailLog};
use crate::error::FleetError;
use crate::node::Node;
use crate::triggers::SealReason;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Pause before the first retry of a failed seal.
pub const SEAL_RETRY_FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between retries (the backoff doubles up to it).
pub const SEAL_RETRY_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Most sessions a round seals (the rest wait for the next round).
pub const SEALS_PER_ROUND: usize = 64;
/// Largest number of sessions queued at once; a request beyond it is refused.
pub const MAX_QUEUED_SEALS: usize = 100_000;

#[derive(Debug, Clone, Default)]
struct Pending {
    failed_attempts: u32,
    /// Not before this time (ms of the node's clock).
    next_attempt_ms: u64,
}

/// What the queue holds, for a status answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealQueueStatus {
    pub pending: usize,
    pub completed: u64,
    pub failed_attempts: u64,
    pub dropped_moved: u64,
    /// Seals queued by the node's seal policy (FLEET.md §5.4), by trigger.
    pub triggered_by_size: u64,
    pub triggered_by_idle: u64,
    pub last_error: Option<String>,
}

/// Sessions waiting to be sealed, with their retry schedule.
#[derive(Debug, Default)]
pub struct SealQueue {
    pending: Mutex<BTreeMap<String, Pending>>,
    last_error: Mutex<Option<String>>,
    completed: AtomicU64,
    failed_attempts: AtomicU64,
    dropped_moved: AtomicU64,
    triggered_by_size: AtomicU64,
    triggered_by_idle: AtomicU64,
}

/// The queue is full ([`MAX_QUEUED_SEALS`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("seal queue full ({MAX_QUEUED_SEALS} sessions)")]
pub struct SealQueueFull;

fn backoff_ms(failed_attempts: u32) -> u64 {
    let first = u64::try_from(SEAL_RETRY_FIRST_BACKOFF.as_millis()).unwrap_or(u64::MAX);
    let max = u64::try_from(SEAL_RETRY_MAX_BACKOFF.as_millis()).unwrap_or(u64::MAX);
    let doublings = failed_attempts.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(max)
}

impl SealQueue {
    /// Queues `session` to be sealed as soon as possible (again, if it was queued).
    pub fn request(&self, session: &str) -> Result<(), SealQueueFull> {
        let mut pending = self.pending.lock();
        if pending.len() >= MAX_QUEUED_SEALS && !pending.contains_key(session) {
            return Err(SealQueueFull);
        }
        pending.insert(session.to_string(), Pending::default());
        Ok(())
    }

    /// Queues the sessions the node's seal policy makes due (tail size, idleness) that are
    /// not queued already (a queued one keeps its backoff). Returns how many it queued.
    pub fn request_due<T: TailLog, C: Coordinator, S: ColdStore>(
        &self,
        node: &Node<T, C, S>,
    ) -> usize {
        let due = node.due_seals();
        let mut pending = self.pending.lock();
        let mut queued = 0;
        for (session, reason) in due {
            if pending.contains_key(&session) || pending.len() >= MAX_QUEUED_SEALS {
                continue;
            }
            pending.insert(session, Pending::default());
            queued += 1;
            let counter = match reason {
                SealReason::TailBytes => &self.triggered_by_size,
                SealReason::Idle => &self.triggered_by_idle,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Sessions due at `now_ms`, at most [`SEALS_PER_ROUND`].
    pub fn due(&self, now_ms: u64) -> Vec<String> {
        self.pending
            .lock()
            .iter()
            .filter(|(_, pending)| pending.next_attempt_ms <= now_ms)
            .map(|(session, _)| session.clone())
            .take(SEALS_PER_ROUND)
            .collect()
    }

    /// Records the outcome of one seal of `session` at `now_ms` on node `own_id`.
    pub fn record(
        &self,
        own_id: &str,
        session: &str,
        now_ms: u64,
        outcome: Result<(), &FleetError>,
    ) {
        let mut pending = self.pending.lock();
        match outcome {
            Ok(()) => {
                pending.remove(session);
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            Err(FleetError::Moved {
                owner: Some(owner), ..
            }) if owner != own_id => {
                pending.remove(session);
                self.dropped_moved.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.failed_attempts.fetch_add(1, Ordering::Relaxed);
                *self.last_error.lock() = Some(format!("{session}: {error}"));
                if let Some(entry) = pending.get_mut(session) {
                    entry.failed_attempts = entry.failed_attempts.saturating_add(1);
                    entry.next_attempt_ms =
                        now_ms.saturating_add(backoff_ms(entry.failed_attempts));
                }
            }
        }
    }

    pub fn status(&self) -> SealQueueStatus {
        SealQueueStatus {
            pending: self.pending.lock().len(),
            completed: self.completed.load(Ordering::Relaxed),
            failed_attempts: self.failed_attempts.load(Ordering::Relaxed),
            dropped_moved: self.dropped_moved.load(Ordering::Relaxed),
            triggered_by_size: self.triggered_by_size.load(Ordering::Relaxed),
            triggered_by_idle: self.triggered_by_idle.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }

    /// Seals the sessions due now, one after another; returns how many completed.
    pub async fn run_round<T: TailLog, C: Coordinator, S: ColdStore>(
        &self,
        node: &Node<T, C, S>,
        now_ms: impl Fn() -> u64,
    ) -> usize {
        let mut completed = 0;
        for session in self.due(now_ms()) {
            let outcome = node.seal(&session).await;
            if outcome.is_ok() {
                completed += 1;
            }
            self.record(node.id(), &session, now_ms(), outcome.as_ref().map(|_| ()));
        }
        completed
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff_ms(1), 200);
        assert_eq!(backoff_ms(2), 400);
        assert_eq!(backoff_ms(4), 1600);
        assert_eq!(backoff_ms(5), 2000);
        assert_eq!(backoff_ms(u32::MAX), 2000);
    }

    #[test]
    fn a_failure_delays_the_session_and_a_success_removes_it() {
        let queue = SealQueue::default();
        queue.request("a").unwrap();
        queue.request("b").unwrap();
        assert_eq!(queue.due(0), vec!["a".to_string(), "b".to_string()]);
        let error = FleetError::NotAcknowledged {
            reason: "s3 down".to_string(),
        };
        queue.record("n1", "a", 1000, Err(&error));
        assert_eq!(queue.due(1000), vec!["b".to_string()]);
        assert_eq!(queue.due(1200), vec!["a".to_string(), "b".to_string()]);
        queue.record("n1", "b", 1000, Ok(()));
        let moved = FleetError::Moved {
            shard: 1,
            owner: Some("n2".to_string()),
            epoch: 3,
        };
        queue.record("n1", "a", 1300, Err(&moved));
        let status = queue.status();
        assert_eq!(status.pending, 0);
        assert_eq!(status.completed, 1);
        assert_eq!(status.failed_attempts, 1);
        assert_eq!(status.dropped_moved, 1);
        assert!(status
            .last_error
            .is_some_and(|text| text.contains("s3 down")));
    }

    #[test]
    fn a_seal_refused_while_the_shard_names_this_node_stays_queued() {
        let queue = SealQueue::default();
        queue.request("a").unwrap();
        queue.request("b").unwrap();
        let moved_to = |owner: Option<&str>| FleetError::Moved {
            shard: 1,
            owner: owner.map(str::to_string),
            epoch: 3,
        };
        // The node lost its lease: the record still names it, or could not be read.
        queue.record("n1", "a", 1000, Err(&moved_to(Some("n1"))));
        queue.record("n1", "b", 1000, Err(&moved_to(None)));
        let status = queue.status();
        assert_eq!(status.pending, 2);
        assert_eq!(status.dropped_moved, 0);
        assert_eq!(status.failed_attempts, 2);
        assert!(queue.due(1000).is_empty(), "retried before the backoff");
        assert_eq!(queue.due(1200), vec!["a".to_string(), "b".to_string()]);
        // The shard is taken back: the seal completes. Another node took the other one.
        queue.record("n1", "a", 1200, Ok(()));
        queue.record("n1", "b", 1200, Err(&moved_to(Some("n2"))));
        let status = queue.status();
        assert_eq!(
            (status.pending, status.completed, status.dropped_moved),
            (0, 1, 1)
        );
    }
}
