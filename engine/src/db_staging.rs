//! Staged sessions (issue #14): a session written out of sight, batch by batch, then
//! published all at once with one durable batch.
//!
//! A staging session is an ordinary session whose id starts with [`STAGING_PREFIX`]; it is
//! left out of [`Store::sessions`]. [`Store::publish_staged`] commits the real session's
//! header as a fork (F-02-17) whose seed is every event of the staging session, in one
//! durable batch (the publication), then deletes the staging session with a tombstone
//! (F-02-18; a deleted session's events stay readable through its live forks). A writable
//! open deletes every staging session still there: one a crash left unpublished (its
//! session never existed), or one whose publication was durable but whose tombstone was
//! not (the published fork keeps its events). No byte of the format changes: this is a
//! convention over session headers, forks and tombstones.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ids of staging sessions start with this.
pub const STAGING_PREFIX: &str = "dshdb:staging:";

/// Distinguishes staging sessions created in one process.
static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Creates a hidden staging session (module doc) and returns its writer.
    pub fn create_staging_session(&self) -> Result<SessionWriter> {
        let count = STAGING_COUNTER.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{STAGING_PREFIX}{}-{}-{count}",
            std::process::id(),
            now_millis()
        );
        let header = serde_json::json!({"version": 0, "id": id, "createdAt": now_millis()});
        self.create_session(&header.to_string())
    }

    /// Publishes a staging session as the session `header_json` names: one durable batch
    /// holds its header, seeded with every staged event; then the staging session is
    /// deleted. Returns the published session's writer. Until the publication is durable
    /// the session does not exist; a crash after it leaves it whole.
    pub fn publish_staged(
        &self,
        staging: SessionWriter,
        header_json: &str,
    ) -> Result<SessionWriter> {
        if !staging.id.starts_with(STAGING_PREFIX) {
            return Err(Error::invalid(format!(
                "session \"{}\" is not a staging session",
                staging.id
            )));
        }
        let staging_id = staging.id.clone();
        let number = staging.number;
        let length = self.session(&staging_id)?.events;
        // The staged batches were written unsynced: the publication's durable commit
        // comes after them in the log, so it is durable only once they are.
        drop(staging);
        let seed = Some(Seed {
            parent: number,
            length,
        });
        let published = self.create_with_seed(header_json, seed, &[], Durability::Sync)?;
        self.delete_session(&staging_id)?;
        Ok(published)
    }

    /// Ids of the staging sessions not deleted yet.
    pub fn staged_sessions(&self) -> Vec<String> {
        let catalog = self.inner.catalog.read();
        let mut ids: Vec<String> = catalog
            .by_id
            .keys()
            .filter(|id| id.starts_with(STAGING_PREFIX))
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// Deletes every staging session (a writable open does it): returns how many.
    pub(crate) fn drop_stages(&self) -> Result<usize> {
        let stages = self.staged_sessions();
        for id in &stages {
            self.delete_session(id)?;
        }
        Ok(stages.len())
    }
}

/// Whether a session id names a staging session (left out of listings).
pub(crate) fn is_staging_id(id: &str) -> bool {
    id.starts_with(STAGING_PREFIX)
}
