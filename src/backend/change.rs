//! What a root is to undergo ([`Change`]: the merged writes, deletes and
//! the catalog that records them), how each write was staged
//! ([`StagedAs`]) and what a commit did that the report tells
//! ([`CommitTally`]). Data only: the backends carry a change out, the
//! driver builds it; nothing here does I/O.

use super::rebase::{self, Rebase};
use crate::bundle::VerifiedBundle;
use crate::catalog::{Catalog, OutputRecord};
use crate::config::Workflow;
use crate::plan::{CatalogUpdate, Desired};
use crate::publish::Content;
use std::collections::BTreeSet;
use time::OffsetDateTime;

/// How a staged write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StagedAs {
    /// It will be written; from the bundle, its bytes are hashed on the way.
    Written,
    /// The stored file already holds the planned bytes: left as it is.
    Unchanged,
}

/// What a commit did that the report tells.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CommitTally {
    /// Outputs copied across file systems (not renamed).
    pub(crate) copied_across: u64,
    /// Whether the files were made durable one by one.
    pub(crate) file_by_file: bool,
    /// Times the catalog's compare-and-swap lost and the change was
    /// applied again on the winner's catalog.
    pub(crate) rebases: u32,
}

/// One planned write.
#[derive(Clone, Copy)]
pub(crate) struct Write<'a> {
    pub(crate) d: &'a Desired,
    /// The bytes, when the publication holds them (rendered HTML,
    /// markdown read for rendering); else the bundle file is copied.
    pub(crate) in_memory: Option<&'a Content>,
    /// The bundle the output comes from.
    pub(crate) bundle: &'a VerifiedBundle,
}

/// Everything one root is to undergo: the planned writes (of one bundle or
/// of a batch, merged), what is removed before and after them, and the
/// catalog that records the result.
pub(crate) struct Change<'a> {
    /// Sorted by path.
    pub(crate) writes: Vec<Write<'a>>,
    /// Removed before the writes (`force_replace`, legacy replacement).
    pub(crate) clear_first: Vec<String>,
    /// Removed after the writes.
    pub(crate) deletes: Vec<String>,
    /// The catalog once the change is made.
    pub(crate) catalog: Catalog,
    /// The records the writes replace, sorted by path (for the journal,
    /// for a conditional write, and to know the outputs that already hold
    /// the bytes wanted).
    pub(crate) replaced: Vec<OutputRecord>,
    /// The records the deletes remove, sorted by path.
    pub(crate) removed: Vec<OutputRecord>,
    /// The root had no catalog before.
    pub(crate) state_was_absent: bool,
    /// Remember how the written files look (a large tree published alone),
    /// so that its next version knows the unchanged ones without reading
    /// them.
    pub(crate) record_looks: bool,
    /// What a commit that lost a race may check and re-apply on the
    /// winner's catalog ([`Rebase`]), for a root that may rebase.
    pub(crate) rebase: Option<Rebase>,
}

impl Change<'static> {
    /// The change that deletes the outputs `catalog` records at `paths`
    /// (sorted, each recorded) and drops their records, stamped `now`,
    /// as maintenance commits it (`prune`). Another publisher's commit
    /// that left those records as they were is kept: the drop is applied
    /// again on top of its catalog (on a bucket; a local root is locked).
    pub(crate) fn deleting(
        mut catalog: Catalog,
        paths: &[String],
        owner: (&str, &str),
        now: OffsetDateTime,
    ) -> Change<'static> {
        let updates = vec![CatalogUpdate {
            keep_existing: true,
            upserts: Vec::new(),
            removes: paths.to_vec(),
            now,
        }];
        // It relies on the dropped records only, whatever the workflow.
        let workflow = Workflow::Additive;
        let seen = rebase::relied_on(&catalog, &updates, owner.0, owner.1, workflow);
        let removed = seen.outputs.clone();
        let drop: BTreeSet<&str> = paths.iter().map(String::as_str).collect();
        catalog.outputs.retain(|r| !drop.contains(r.path.as_str()));
        catalog.updated_at = now;
        Change {
            writes: Vec::new(),
            clear_first: Vec::new(),
            deletes: paths.to_vec(),
            catalog,
            replaced: Vec::new(),
            removed,
            state_was_absent: false,
            record_looks: false,
            rebase: Some(Rebase {
                updates,
                seen: Some(seen),
                pipeline_id: owner.0.to_owned(),
                destination_id: owner.1.to_owned(),
                workflow,
                now,
            }),
        }
    }
}

impl Change<'_> {
    /// The record the write at `path` replaces, if any.
    pub(crate) fn replaced(&self, path: &str) -> Option<&OutputRecord> {
        find(&self.replaced, path)
    }

    /// The record the delete of `path` removes, if any.
    pub(crate) fn removed(&self, path: &str) -> Option<&OutputRecord> {
        find(&self.removed, path)
    }
}

fn find<'r>(records: &'r [OutputRecord], path: &str) -> Option<&'r OutputRecord> {
    records
        .binary_search_by(|r| r.path.as_str().cmp(path))
        .ok()
        .map(|i| &records[i])
}
