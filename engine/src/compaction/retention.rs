//! Spill retention: a blob lives while any event of any session (forks read their parent's
//! prefix, so they count) cites its locator.

use crate::error::Result;
use crate::spill::{locators_in, BlobHash, GcReport, SpillStore};
use crate::store::Store;
use std::collections::HashSet;

use crate::limits::EVENTS_PER_READ;

/// Every blob cited by an event of any session in `store` (F-07-13).
pub fn spill_references(store: &Store) -> Result<HashSet<BlobHash>> {
    let mut referenced = HashSet::new();
    for summary in store.sessions() {
        let mut from = 0;
        while from < summary.events {
            let to = (from + EVENTS_PER_READ).min(summary.events);
            for event in store.read(&summary.id, from, to)? {
                referenced.extend(locators_in(&event.data));
                referenced.extend(locators_in(&event.envelope));
            }
            from = to;
        }
    }
    Ok(referenced)
}

/// Collects the blobs no session cites (F-07-14).
pub fn collect_spill(store: &Store, spill: &SpillStore) -> Result<GcReport> {
    if store.is_read_only() {
        return Err(crate::Error::ReadOnly);
    }
    let referenced = spill_references(store)?;
    spill.gc(&referenced)
}
