//! When a session is due for sealing (FLEET.md §5.4): its unsealed tail has reached
//! [`SealPolicy::tail_bytes`], or it has had something unsealed and no append for
//! [`SealPolicy::idle_ms`]. The node notes each acknowledged append's tail bytes and each
//! completed seal here; its seal queue asks for the due sessions each round.
//!
//! What this node counts is what it appended since the last seal it made or saw: after a
//! takeover, a session's tail appended by the previous owner counts from the new owner's
//! first append (or seal) of it. A session nobody touches after a takeover is not sealed by
//! a trigger (the new owner does not list a shard's sessions); it stays whole in the tail.

use parking_lot::Mutex;
use std::collections::HashMap;

/// Default [`SealPolicy::tail_bytes`]: 4 MiB of tail payload (FLEET.md §5.4).
pub const DEFAULT_SEAL_TAIL_BYTES: u64 = 4 * 1024 * 1024;
/// Default [`SealPolicy::idle_ms`]: 5 minutes without an append (FLEET.md §5.4).
pub const DEFAULT_SEAL_IDLE_MS: u64 = 5 * 60 * 1000;
/// Most due sessions one scan returns (the rest are due again at the next scan).
pub const MAX_DUE_PER_SCAN: usize = 1024;

/// When a session's tail is sealed without being asked (`None`: that trigger is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealPolicy {
    /// Unsealed tail payload bytes, as this node appended them, that make a session due.
    pub tail_bytes: Option<u64>,
    /// Milliseconds without an append after which a session with something unsealed is due.
    pub idle_ms: Option<u64>,
}

impl Default for SealPolicy {
    fn default() -> Self {
        SealPolicy {
            tail_bytes: Some(DEFAULT_SEAL_TAIL_BYTES),
            idle_ms: Some(DEFAULT_SEAL_IDLE_MS),
        }
    }
}

/// Why a session is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealReason {
    TailBytes,
    Idle,
}

/// What a session holds unsealed, as far as this node appended it.
#[derive(Debug, Clone, Copy)]
struct Unsealed {
    bytes: u64,
    last_append_ms: u64,
}

/// Per session, the unsealed tail this node appended and when it last appended.
#[derive(Debug, Default)]
pub struct SealTriggers {
    unsealed: Mutex<HashMap<String, Unsealed>>,
}

impl SealTriggers {
    /// An append of `bytes` of tail payload to `session` was acknowledged at `now_ms`.
    pub fn appended(&self, session: &str, bytes: u64, now_ms: u64) {
        let mut unsealed = self.unsealed.lock();
        // Every append passes here: the session's name is copied only on its first one.
        match unsealed.get_mut(session) {
            Some(held) => {
                held.bytes = held.bytes.saturating_add(bytes);
                held.last_append_ms = held.last_append_ms.max(now_ms);
            }
            None => {
                let held = Unsealed {
                    bytes,
                    last_append_ms: now_ms,
                };
                unsealed.insert(session.to_string(), held);
            }
        }
    }

    /// Everything `session` held was sealed (or it has nothing unsealed), or another node
    /// owns it now: nothing is due for it until its next append here.
    pub fn settled(&self, session: &str) {
        self.unsealed.lock().remove(session);
    }

    /// Sessions with something unsealed that this node noted.
    pub fn tracked(&self) -> usize {
        self.unsealed.lock().len()
    }

    /// The sessions due at `now_ms` under `policy`, in name order, at most
    /// [`MAX_DUE_PER_SCAN`].
    pub fn due(&self, policy: SealPolicy, now_ms: u64) -> Vec<(String, SealReason)> {
        let unsealed = self.unsealed.lock();
        let mut due: Vec<(String, SealReason)> = unsealed
            .iter()
            .filter_map(|(session, held)| {
                reason(policy, *held, now_ms).map(|reason| (session.clone(), reason))
            })
            .collect();
        due.sort_by(|left, right| left.0.cmp(&right.0));
        due.truncate(MAX_DUE_PER_SCAN);
        due
    }
}

/// Why `held` is due at `now_ms` under `policy`, if it is.
fn reason(policy: SealPolicy, held: Unsealed, now_ms: u64) -> Option<SealReason> {
    if policy.tail_bytes.is_some_and(|limit| held.bytes >= limit) {
        return Some(SealReason::TailBytes);
    }
    let idle_for = now_ms.saturating_sub(held.last_append_ms);
    if policy.idle_ms.is_some_and(|limit| idle_for >= limit) {
        return Some(SealReason::Idle);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: SealPolicy = SealPolicy {
        tail_bytes: Some(1000),
        idle_ms: Some(60_000),
    };

    #[test]
    fn a_session_is_due_by_size_or_by_idleness_until_it_is_settled() {
        let triggers = SealTriggers::default();
        triggers.appended("a", 600, 0);
        triggers.appended("b", 10, 0);
        assert!(triggers.due(POLICY, 1_000).is_empty());
        triggers.appended("a", 400, 2_000);
        assert_eq!(
            triggers.due(POLICY, 2_000),
            vec![("a".to_string(), SealReason::TailBytes)]
        );
        // b's last append was at 0, a's at 2 s.
        assert_eq!(
            triggers.due(POLICY, 60_000),
            vec![
                ("a".to_string(), SealReason::TailBytes),
                ("b".to_string(), SealReason::Idle)
            ]
        );
        triggers.settled("a");
        triggers.settled("b");
        assert!(triggers.due(POLICY, 10_000_000).is_empty());
        assert_eq!(triggers.tracked(), 0);
    }

    #[test]
    fn triggers_that_are_off_never_fire() {
        let triggers = SealTriggers::default();
        triggers.appended("a", u64::MAX, 0);
        let off = SealPolicy {
            tail_bytes: None,
            idle_ms: None,
        };
        assert!(triggers.due(off, u64::MAX).is_empty());
        let idle_only = SealPolicy {
            tail_bytes: None,
            idle_ms: Some(5),
        };
        assert_eq!(
            triggers.due(idle_only, 5),
            vec![("a".to_string(), SealReason::Idle)]
        );
    }
}
