//! Staged sessions (issue #14; format-spec/02-records.md, "Staged sessions"): a session
//! written out of sight, batch by batch, then published all at once with one durable batch.
//!
//! A stage is an ordinary session whose id starts with [`STAGE_PREFIX`]; no listing shows
//! it, and no other way of creating a session may take such an id. [`Store::publish_stage`]
//! commits the real session's header as a fork of the stage (F-02-17) seeded with every
//! staged event, in one durable batch: before that batch is durable the session does not
//! exist, after it it exists whole. Then the stage is deleted with a tombstone (F-02-18; a
//! deleted session's events stay readable through its live forks). A writable open deletes
//! every stage still there: one a crash or a failure left unpublished, or one whose
//! publication was durable but whose tombstone was not. No byte of the format changes.

use super::{now_millis, SessionWriter, Store};
use crate::error::{Error, Result};
use crate::storage::catalog::{Catalog, Seed};
use crate::storage::commit::Durability;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ids of stages start with this; other sessions may not.
pub const STAGE_PREFIX: &str = "dshdb:stage:";

/// Distinguishes the stages created in one process.
static STAGE_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether `id` names a stage.
pub fn is_stage_id(id: &str) -> bool {
    id.starts_with(STAGE_PREFIX)
}

/// Refuses a stage id for a session created any other way than [`Store::create_stage`].
pub(super) fn refuse_stage_id(id: &str) -> Result<()> {
    if is_stage_id(id) {
        return Err(Error::invalid(format!(
            "session id \"{id}\" starts with \"{STAGE_PREFIX}\", which dshdb reserves for staged imports"
        )));
    }
    Ok(())
}

impl Store {
    /// Creates a hidden stage and returns its writer, whose appends are `Buffered`: the
    /// publication's durable commit makes them durable, and a crash before it drops the
    /// stage anyway.
    pub fn create_stage(&self) -> Result<SessionWriter> {
        self.log()?;
        let count = STAGE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{STAGE_PREFIX}{}-{}-{count}",
            std::process::id(),
            now_millis()
        );
        let header = serde_json::json!({"version": 0, "id": id, "createdAt": now_millis()});
        self.create_named(id, &header.to_string(), None, &[], Durability::Buffered)
    }

    /// Publishes `stage` as the session `header_json` names (module doc): one durable batch
    /// holds its header, seeded with every staged event; then the stage is deleted. Until
    /// the publication is durable the session does not exist.
    pub fn publish_stage(&self, stage: SessionWriter, header_json: &str) -> Result<()> {
        if !is_stage_id(&stage.id) {
            return Err(Error::invalid(format!(
                "session \"{}\" is not a stage",
                stage.id
            )));
        }
        let stage_id = stage.id.clone();
        let seed = Some(Seed {
            parent: stage.number,
            length: self.session(&stage_id)?.events,
        });
        // Frees the stage's writer slot for its delete below.
        drop(stage);
        let published = self.create_with_seed(header_json, seed, &[], Durability::Sync);
        // Published or not, the stage goes (a failure here is the next writable open's).
        let deleted = self.delete_session(&stage_id);
        published?;
        deleted
    }

    /// Deletes a stage that will not be published (best effort: a stage left behind is
    /// the next writable open's).
    pub fn discard_stage(&self, stage: SessionWriter) {
        let id = stage.id.clone();
        drop(stage);
        if is_stage_id(&id) {
            let _ = self.delete_session(&id);
        }
    }

    /// Ids of the stages not deleted yet.
    pub fn stages(&self) -> Vec<String> {
        stage_ids(&self.inner.catalog.read())
    }

    /// Deletes the stages `ids` (a writable open does, with those it recovered): returns
    /// how many.
    pub(super) fn drop_stages(&self, ids: Vec<String>) -> Result<usize> {
        for id in &ids {
            self.delete_session(id)?;
        }
        Ok(ids.len())
    }
}

/// Ids of the stages `catalog` holds, sorted.
pub(super) fn stage_ids(catalog: &Catalog) -> Vec<String> {
    let mut ids: Vec<String> = catalog
        .by_id
        .keys()
        .filter(|id| is_stage_id(id))
        .cloned()
        .collect();
    ids.sort();
    ids
}
