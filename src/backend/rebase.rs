//! A commit that lost a race: a backend that commits by compare-and-swap
//! of the catalog (an s3 destination) may find that another publisher
//! committed first. The change still holds, and is applied again on top of
//! the winner's catalog, when the winner left every record it relies on as
//! it was ([`relied_on`]); else nothing of it is recorded and the attempt
//! is transient (docs/object-storage.md, "Several hosts").

use crate::catalog::{Catalog, OutputRecord, Overlay, State};
use crate::config::Workflow;
use crate::plan::CatalogUpdate;
use std::collections::BTreeSet;
use time::OffsetDateTime;

/// The catalog changes of a change's bundles, in order, and the records of
/// the catalog they were planned on that they rely on: if another
/// publication committed first and left all of those as they were, the
/// changes are applied again on top of its catalog.
pub(crate) struct Rebase {
    pub(crate) updates: Vec<CatalogUpdate>,
    /// The records relied on ([`relied_on`]); `None` when
    /// planned on a root without a catalog.
    pub(crate) seen: Option<Catalog>,
    pub(crate) pipeline_id: String,
    pub(crate) destination_id: String,
    pub(crate) workflow: Workflow,
    pub(crate) now: OffsetDateTime,
}

/// The records of `base` a change relies on: every path a catalog change
/// of it touches and, for a replacement, every record of the destination
/// (another publication of it changes what the change deletes).
pub(crate) fn relied_on(
    base: &Catalog,
    updates: &[CatalogUpdate],
    pipeline_id: &str,
    destination_id: &str,
    workflow: Workflow,
) -> Catalog {
    let paths: BTreeSet<&str> = updates
        .iter()
        .flat_map(|u| {
            u.upserts
                .iter()
                .map(|r| r.path.as_str())
                .chain(u.removes.iter().map(String::as_str))
        })
        .collect();
    let replacement = workflow == Workflow::Replacement;
    Catalog {
        distributor_version: base.distributor_version.clone(),
        created_at: base.created_at,
        updated_at: base.updated_at,
        outputs: base
            .outputs
            .iter()
            .filter(|r| {
                paths.contains(r.path.as_str())
                    || (replacement && r.owned_by(pipeline_id, destination_id))
            })
            .cloned()
            .collect(),
    }
}

/// The state the change was planned on, as the commit protocol compares
/// it: the records relied on, or no catalog.
pub(crate) fn seen_state(rebase: &Rebase) -> State {
    match &rebase.seen {
        Some(seen) => State::Catalog(seen.clone()),
        None => State::Absent,
    }
}

/// The catalog to write instead when another publication committed
/// `latest` after the change was planned, or `None` when the change no
/// longer holds: every bundle's catalog change applied in order on top of
/// the winner's catalog.
pub(crate) fn onto(rebase: &Rebase, latest: &State) -> Option<Catalog> {
    let State::Catalog(latest) = latest else {
        return None;
    };
    let empty = Catalog::new(rebase.now);
    let seen = rebase.seen.as_ref().unwrap_or(&empty);
    let same = |r: &OutputRecord| latest.get(r.path.as_str()) == Some(r);
    // Paths the change relies on that the base did not record must still
    // be unrecorded.
    let still_unrecorded = rebase.updates.iter().all(|u| {
        u.upserts
            .iter()
            .map(|r| r.path.as_str())
            .chain(u.removes.iter().map(String::as_str))
            .all(|p| seen.get(p).is_some() || latest.get(p).is_none())
    });
    let owned_same = rebase.workflow == Workflow::Additive || {
        let owned = |c: &Catalog| -> Vec<OutputRecord> {
            c.outputs
                .iter()
                .filter(|r| r.owned_by(&rebase.pipeline_id, &rebase.destination_id))
                .cloned()
                .collect()
        };
        owned(seen) == owned(latest)
    };
    if !(seen.outputs.iter().all(same) && still_unrecorded && owned_same) {
        return None;
    }
    let mut records = Overlay::new(latest.clone());
    for u in &rebase.updates {
        records.record(&u.upserts, &u.removes);
    }
    Some(records.into_catalog(rebase.now))
}

#[cfg(test)]
#[path = "rebase_tests.rs"]
mod tests;
