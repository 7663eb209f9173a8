//! Session leases (F-08-10): one writer process per session at a time, released by the
//! kernel when the holder dies. The lease is an exclusive lock on one byte of `SHARED`
//! derived from a 64-bit hash of the session id; beside it a record slot keeps the holder's
//! pid, because `F_OFD_GETLK` reports none for open-file-description locks.

use super::lock::ByteLock;
use super::tail::TailIndex;
use super::{LockMode, SharedFile};
use std::io;
use std::sync::Arc;

/// First lock byte of the lease space (F-08-3): 2³².
pub const LEASE_LOCK_BASE: u64 = 1 << 32;

/// `h` of F-08-10: the first 8 bytes of `BLAKE3(id)`, little-endian.
pub fn session_hash(id: &str) -> u64 {
    let digest = blake3::hash(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The lock byte of the session whose id hashes to `hash`: `2³² + (h >> 2)`, below 2⁶³
/// (the largest `off_t`).
pub fn lease_lock_offset(hash: u64) -> u64 {
    LEASE_LOCK_BASE + (hash >> 2)
}

const _: () = assert!(LEASE_LOCK_BASE + (u64::MAX >> 2) < i64::MAX as u64);

/// A held session lease; dropping it releases the session.
pub struct Lease {
    _lock: ByteLock,
    hash: u64,
}

impl Lease {
    /// The session hash it holds.
    pub fn hash(&self) -> u64 {
        self.hash
    }
}

/// Why a lease was not granted.
#[derive(Debug)]
pub enum LeaseRefused {
    /// Another process holds it; its pid when the record names it.
    Busy { pid: Option<u32> },
    /// The lock call itself failed.
    Io(io::Error),
}

/// Tries to take the lease of session `id` for process `pid` (no waiting).
pub fn try_lease(
    file: &Arc<dyn SharedFile>,
    tail: &TailIndex,
    id: &str,
    pid: u32,
) -> Result<Lease, LeaseRefused> {
    let hash = session_hash(id);
    match ByteLock::try_take(file, lease_lock_offset(hash), LockMode::Exclusive) {
        Ok(Some(lock)) => {
            tail.write_lease_record(hash, pid);
            Ok(Lease { _lock: lock, hash })
        }
        Ok(None) => Err(LeaseRefused::Busy {
            pid: tail.lease_holder(hash),
        }),
        Err(error) => Err(LeaseRefused::Io(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::io::sim::SimStorage;
    use crate::storage::io::Storage;

    fn owners() -> (Arc<dyn SharedFile>, Arc<dyn SharedFile>) {
        let disk = SimStorage::new();
        let first = disk
            .open_shared(crate::storage::multi::SHARED_FILE)
            .expect("shared");
        let second = disk
            .open_shared(crate::storage::multi::SHARED_FILE)
            .expect("shared");
        (first, second)
    }

    #[test]
    fn the_hash_is_blake3s_first_eight_bytes_little_endian() {
        // BLAKE3("") = af1349b9f5f9a1a6...: its first 8 bytes read little-endian.
        assert_eq!(session_hash(""), 0xa6a1_f9f5_b949_13af);
        assert_ne!(session_hash("a"), session_hash("b"));
        let offset = lease_lock_offset(u64::MAX);
        assert!(offset >= LEASE_LOCK_BASE && offset < i64::MAX as u64);
    }

    #[test]
    fn a_held_lease_is_busy_for_another_owner_and_names_the_holder() {
        let (first, second) = owners();
        let (first_tail, second_tail) = (
            TailIndex::new(first.clone()),
            TailIndex::new(second.clone()),
        );
        let held = try_lease(&first, &first_tail, "chat-1", 4242).expect("free");
        match try_lease(&second, &second_tail, "chat-1", 7) {
            Err(LeaseRefused::Busy { pid }) => assert_eq!(pid, Some(4242)),
            other => panic!("expected busy, got {:?}", other.map(|lease| lease.hash())),
        }
        // Other sessions are independent.
        let other = try_lease(&second, &second_tail, "chat-2", 7).expect("free");
        drop(held);
        let taken = try_lease(&second, &second_tail, "chat-1", 7).expect("free again");
        assert_eq!(taken.hash(), session_hash("chat-1"));
        drop(other);
    }

    #[test]
    fn a_dead_holders_lease_is_free_at_once() {
        let (first, second) = owners();
        let second_tail = TailIndex::new(second.clone());
        assert!(first
            .lock(
                lease_lock_offset(session_hash("s")),
                LockMode::Exclusive,
                false
            )
            .expect("lock"));
        assert!(matches!(
            try_lease(&second, &second_tail, "s", 9),
            Err(LeaseRefused::Busy { .. })
        ));
        drop(first); // the process dies: its locks go with it
        assert!(try_lease(&second, &second_tail, "s", 9).is_ok());
    }

    #[test]
    fn a_colliding_record_slot_reports_no_pid_rather_than_a_wrong_one() {
        let (first, second) = owners();
        let (first_tail, second_tail) = (
            TailIndex::new(first.clone()),
            TailIndex::new(second.clone()),
        );
        let _held = try_lease(&first, &first_tail, "x", 11).expect("free");
        // Another session whose record shares the slot overwrote it.
        let hash = session_hash("x");
        first_tail.write_lease_record(hash ^ (1 << 40), 99);
        match try_lease(&second, &second_tail, "x", 7) {
            Err(LeaseRefused::Busy { pid }) => assert_eq!(pid, None),
            other => panic!("expected busy, got {:?}", other.map(|lease| lease.hash())),
        }
    }
}
