//! What the one publication driver ([`super::driver`]) and the maintenance
//! commands (`crate::maintain`) ask of a backend: a destination root
//! opened for a publication or for maintenance (docs/architecture.md, "One
//! transaction over backends"). A local root is opened by taking its lock
//! and settling its journal; an s3 destination by checking its server and
//! recovering stale intents. Then, for every backend alike: read the
//! catalog, show the planner what storage holds, stage the merged change
//! of every bundle, make it durable, commit it, or roll it back; and for
//! maintenance, list everything stored, hash outputs, confirm that one is
//! gone, delete owned outputs through the same commit, or drop records.
//!
//! Which backend a destination has is decided in one place, `backends`
//! (with `config`): the driver, the agent and the commands see a
//! [`Target`].

use super::Options;
use super::content::Content;
use super::error::Error;
use super::rebase::{self, Rebase};
use crate::bundle::VerifiedBundle;
use crate::catalog::{Catalog, OutputRecord, State};
use crate::config::Workflow;
use crate::hashing::Hashed;
use crate::lock::LockError;
use crate::plan::{CatalogUpdate, Desired, Entry, Listing, Plan};
use crate::workers::Workers;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use time::OffsetDateTime;

/// A destination root, opened (locked, or checked and recovered) for one
/// publication of one bundle or of a batch, or for one maintenance command
/// ([`super::backends::open_to_maintain`]).
pub(crate) trait Target {
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

    /// Forgets the text of the catalog's records kept for the next
    /// catalog write (a local root's, [`crate::remembered`]): the change
    /// turned out too large for its write to copy them.
    fn drop_texts(&self) {}

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
        cancel: &crate::interrupt::Cancel,
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

    // What maintenance asks besides (docs/maintenance.md). A root opened
    // to maintain is read through these; `prune` commits through
    // [`Target::delete_owned`], the commit path of a publication.

    /// What an output is called in this root's messages: `file` or `object`.
    fn output_noun(&self) -> &'static str;

    /// The catalog as it stands now (`None`: no state file; refused as
    /// [`Fault::Unusable`] unless it is a catalog): read again from a
    /// bucket, whose version the next commit swaps; a locked root's as it
    /// was opened, settled from its journal (or, read-only, as settling it
    /// would leave it).
    fn read_catalog(&mut self) -> Result<Option<Catalog>, Fault>;

    /// The outputs that publications still in progress (or whose publisher
    /// died) are writing, which are theirs and not unmanaged; with
    /// `report`, each such publication is logged. A locked root has none.
    fn in_flight(&self, _report: bool) -> Result<BTreeSet<String>, Fault> {
        Ok(BTreeSet::new())
    }

    /// Everything the root holds, reserved names aside, by path: what a
    /// local root's walk finds (folders, links and special files too), or
    /// every key of a bucket (each a file).
    fn survey(&self) -> Result<BTreeMap<String, Entry>, Fault>;

    /// Of `paths`, which a survey did not find holding a regular file,
    /// those surely without one (in order). A locked root's survey is
    /// final; a bucket's listing only picks the keys to look at.
    fn confirm_absent(&self, paths: Vec<String>) -> Result<Vec<String>, Fault> {
        Ok(paths)
    }

    /// Hashes what each of `paths` holds, read to the end in fixed-size
    /// chunks, and hands `each` its index in `paths` with its size and
    /// SHA-256 (`None` where no regular file or no object is), in order.
    fn hash_each(
        &self,
        paths: &[&str],
        each: &mut dyn FnMut(usize, Option<Hashed>),
    ) -> Result<(), Fault>;

    /// Which of `paths` hold a folder now (never one in a bucket).
    fn folders_at(&self, _paths: &[String]) -> Result<BTreeSet<String>, Fault> {
        Ok(BTreeSet::new())
    }

    /// Deletes what `change` deletes (recorded outputs, [`Change::deleting`])
    /// and records its catalog, through the commit a publication goes
    /// through: all of it, or (settled after a failure) only the deletions
    /// made. A catalog changed since [`Target::read_catalog`] read it is
    /// [`Fault::lost_race`] when the change no longer holds on it.
    fn delete_owned(&mut self, change: Change<'_>) -> Result<(), Fault>;

    /// Writes `next`, made from what [`Target::read_catalog`] gave (a
    /// catalog updated at `read_at`), as the catalog;
    /// [`Fault::lost_race`] when the catalog was changed since it was read.
    fn swap_catalog(&mut self, next: Catalog, read_at: OffsetDateTime) -> Result<(), Fault>;
}

/// What a maintenance command intends to do to a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only: a local root's lock is taken only if its lock file
    /// exists, and nothing is created or written, not even a recovery.
    Read,
    /// May delete outputs or write the catalog: an interrupted publication
    /// is finished first.
    Write,
}

/// Why maintenance of a root could not go on, in the backend's words.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The catalog is invalid, from a newer tool, or legacy: maintenance
    /// changes nothing on it.
    Unusable(Refused),
    /// A local root's lock could not be taken.
    Lock(LockError),
    /// A local root: what was being done, and the error.
    Io { doing: String, source: io::Error },
    /// A bucket: `message` names the root, what was being done and what to
    /// do about it.
    Store {
        message: String,
        source: Box<crate::s3::Error>,
    },
}

impl Fault {
    /// Whether another publisher changed the catalog since it was read, so
    /// that reading it again and trying again may succeed.
    pub(crate) fn lost_race(&self) -> bool {
        match self {
            Fault::Store { source, .. } => matches!(**source, crate::s3::Error::Conflict { .. }),
            _ => false,
        }
    }
}

impl From<LockError> for Fault {
    fn from(e: LockError) -> Fault {
        Fault::Lock(e)
    }
}

/// A state file that maintenance refuses, changing nothing.
#[derive(Debug)]
pub(crate) enum Refused {
    Invalid { reason: String },
    Future { schema_version: u64 },
    Legacy { schema_version: u64 },
}

/// The catalog `state` holds (`None`: no state file), when maintenance
/// can work on it.
pub(super) fn usable(state: State) -> Result<Option<Catalog>, Fault> {
    match state {
        State::Absent => Ok(None),
        State::Catalog(c) => Ok(Some(c)),
        State::Invalid { reason } => Err(Fault::Unusable(Refused::Invalid { reason })),
        State::Future { schema_version } => {
            Err(Fault::Unusable(Refused::Future { schema_version }))
        }
        State::Legacy { schema_version } => {
            Err(Fault::Unusable(Refused::Legacy { schema_version }))
        }
    }
}

/// How a staged write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staged {
    /// It will be written; from the bundle, its bytes are hashed on the way.
    Written,
    /// The stored file already holds the planned bytes: left as it is.
    Unchanged,
}

/// What a commit did that the report tells.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Committed {
    /// Outputs copied across file systems (not renamed).
    pub(super) copied_across: u64,
    /// Whether the files were made durable one by one.
    pub(super) file_by_file: bool,
    /// Times the catalog's compare-and-swap lost and the change was
    /// applied again on the winner's catalog.
    pub(super) rebases: u32,
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
pub(crate) struct Change<'a> {
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
