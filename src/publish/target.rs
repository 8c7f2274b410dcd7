//! What the one publication driver ([`super::driver`]) asks of a backend:
//! a destination root opened for a publication (docs/architecture.md,
//! "One transaction over backends"). A local root is opened by taking its
//! lock and settling its journal; an s3 destination by checking its server
//! and recovering stale intents. Then, for every backend alike: read the
//! catalog, show the planner what storage holds, stage the merged change
//! of every bundle, make it durable, commit it, or roll it back.
//!
//! Which backend a destination has is decided in one place, `backends`
//! (with `config`): the driver, the agent and the commands see a
//! [`Target`].

use super::Options;
use super::content::Content;
use super::error::Error;
use crate::bundle::VerifiedBundle;
use crate::catalog::{Catalog, OutputRecord, State};
use crate::plan::{Desired, Entry, Listing, Plan};
use crate::workers::Workers;
use std::collections::{BTreeMap, BTreeSet};
use time::OffsetDateTime;

/// A destination root, opened (locked, or checked and recovered) for one
/// publication of one bundle or of a batch.
pub(super) trait Target {
    /// The root as messages name it (a folder, or `s3://bucket/path`).
    fn label(&self) -> String;

    /// The root's state as opened (a catalog, none, or one not to trust),
    /// taken out: the driver keeps the catalog from here on.
    fn take_state(&mut self) -> State;

    /// Whether the root does not exist yet and is created once every plan
    /// is accepted ([`Target::create`]); never for a bucket.
    fn missing(&self) -> bool {
        false
    }

    /// Creates the missing root, locks it and reads its state again.
    fn create(&mut self, _options: &Options, _now: OffsetDateTime) -> Result<(), Error> {
        Ok(())
    }

    /// Reads at once what planning `bundles` (each its desired outputs,
    /// in order) will ask of storage; `every_key` when a key the catalog
    /// does not record must be looked at too (a single publication, whose
    /// plan refuses an unmanaged object rather than meeting it at commit).
    fn look_ahead(
        &mut self,
        _state: &State,
        _bundles: &[&[Desired]],
        _every_key: bool,
    ) -> Result<(), Error> {
        Ok(())
    }

    /// What the planner sees of storage at the paths of `desired`, where
    /// `touched` holds what the bundles planned before leave (a path there
    /// is never read from storage).
    fn listing(
        &self,
        desired: &[Desired],
        state: &State,
        touched: &BTreeMap<String, Entry>,
        force: bool,
    ) -> Result<Listing, Error>;

    /// The plan to use instead when this backend cannot carry `plan` out
    /// (a bucket deletes only what the catalog records, and has no
    /// `--force`).
    fn refusal(&self, _plan: &Plan, _state: &State, _force: bool) -> Option<Plan> {
        None
    }

    /// The planned writes whose stored bytes are known, at planning, to be
    /// the planned ones already (never sent; a local root finds its own
    /// while staging).
    fn kept(
        &self,
        _plan: &Plan,
        _state: &State,
        _touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        BTreeSet::new()
    }

    /// Whether its commit reads the bundle (an upload hashes what it
    /// sends): such roots commit first, while the others can still be
    /// rolled back.
    fn reads_bundle_at_commit(&self) -> bool {
        false
    }

    /// Stages `change`: every write either staged (its bytes checked when
    /// they come from the bundle, by the time the commit succeeds) or
    /// found to hold the planned bytes already. Nothing is in place yet.
    fn stage(
        &mut self,
        change: &Change<'_>,
        workers: &dyn Workers,
        keep_going: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Staged>, Error>;

    /// Makes what was staged durable.
    fn make_durable(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Whether a commit that lost a race to another publisher may be
    /// re-applied on the winner's catalog (it needs [`Change::rebase`]).
    fn may_rebase(&self) -> bool {
        false
    }

    /// Puts the change in place and records it in the catalog, or leaves
    /// nothing of it recorded.
    fn commit(&mut self, change: Change<'_>) -> Result<Committed, Error>;

    /// Settles the root after a failure (from its journal); says why when
    /// it cannot (the journal then stays for the next holder of the lock).
    fn roll_back(&self) -> Result<(), std::io::Error> {
        Ok(())
    }
}

/// How a staged write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Staged {
    /// It will be written; from the bundle, its bytes are hashed on the way.
    Written,
    /// The stored file already holds the planned bytes: left as it is.
    Unchanged,
}

/// What a commit did that the report tells.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Committed {
    /// Outputs copied across file systems (not renamed).
    pub(super) copied_across: u64,
    /// Whether the files were made durable one by one.
    pub(super) file_by_file: bool,
}

/// One planned write.
#[derive(Clone, Copy)]
pub(super) struct Write<'a> {
    pub(super) d: &'a Desired,
    /// The bytes, when the publication holds them (rendered HTML,
    /// markdown read for rendering); else the bundle file is copied.
    pub(super) in_memory: Option<&'a Content>,
    /// The bundle the output comes from.
    pub(super) bundle: &'a VerifiedBundle,
}

/// Everything one root is to undergo: the planned writes (of one bundle or
/// of a batch, merged), what is removed before and after them, and the
/// catalog that records the result.
pub(super) struct Change<'a> {
    /// Sorted by path.
    pub(super) writes: Vec<Write<'a>>,
    /// Removed before the writes (`force_replace`, legacy replacement).
    pub(super) clear_first: Vec<String>,
    /// Removed after the writes.
    pub(super) deletes: Vec<String>,
    /// The catalog once the change is made.
    pub(super) catalog: Catalog,
    /// The records the writes replace, sorted by path (for the journal,
    /// for a conditional write, and to know the outputs that already hold
    /// the bytes wanted).
    pub(super) replaced: Vec<OutputRecord>,
    /// The records the deletes remove, sorted by path.
    pub(super) removed: Vec<OutputRecord>,
    /// The root had no catalog before.
    pub(super) state_was_absent: bool,
    /// Remember how the written files look (a large tree published alone),
    /// so that its next version knows the unchanged ones without reading
    /// them.
    pub(super) record_looks: bool,
    /// What a commit that lost a race may check and re-apply on the
    /// winner's catalog ([`Rebase`]), for a target that may rebase.
    pub(super) rebase: Option<Rebase>,
}

/// The catalog changes of a change's bundles, in order, and the records of
/// the catalog they were planned on that they rely on: if another
/// publication committed first and left all of those as they were, the
/// changes are applied again on top of its catalog.
pub(super) struct Rebase {
    pub(super) updates: Vec<crate::plan::CatalogUpdate>,
    /// The records relied on ([`super::rebase::relied_on`]); `None` when
    /// planned on a root without a catalog.
    pub(super) seen: Option<Catalog>,
    pub(super) pipeline_id: String,
    pub(super) destination_id: String,
    pub(super) workflow: crate::config::Workflow,
    pub(super) now: OffsetDateTime,
}

impl Change<'_> {
    /// The record the write at `path` replaces, if any.
    pub(super) fn replaced(&self, path: &str) -> Option<&OutputRecord> {
        find(&self.replaced, path)
    }

    /// The record the delete of `path` removes, if any.
    pub(super) fn removed(&self, path: &str) -> Option<&OutputRecord> {
        find(&self.removed, path)
    }
}

fn find<'r>(records: &'r [OutputRecord], path: &str) -> Option<&'r OutputRecord> {
    records
        .binary_search_by(|r| r.path.as_str().cmp(path))
        .ok()
        .map(|i| &records[i])
}
