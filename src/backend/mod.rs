//! The backends: what the one publication driver (`crate::publish`) and
//! the maintenance commands (`crate::maintain`) ask of a destination root,
//! and the one place that opens one (docs/architecture.md, "One
//! transaction over backends"). A local root ([`local`]) is opened by
//! taking its lock and settling its journal; an s3 destination ([`s3`]) by
//! checking its server and recovering stale intents.
//!
//! Two small traits, each the primitives of one use:
//! - [`PublishRoot`]: read the catalog as opened, show the planner what
//!   storage holds, stage the merged change of every bundle, make it
//!   durable, commit it, or roll it back;
//! - [`MaintainRoot`]: read the catalog as it stands, list everything
//!   stored, hash outputs, confirm that one is gone, delete owned outputs
//!   through the same commit, or swap the catalog.
//!
//! What differs by backend and is data, not behaviour, is one value,
//! [`Capabilities`]; no method is a hook that one backend overrides. A
//! backend never plans, never reports, and never decides what a bundle
//! becomes: it carries a [`Change`] out, or says why not.

use crate::backend::local::journal;
use crate::catalog::{Catalog, STATE_FILE, State};
use crate::config::{Backend, Destination};
use crate::fs::hashing::Hashed;
use crate::plan::{Desired, Entry, Listing, Plan};
use crate::publish::{Error, Options};
use crate::runtime::process_state::ProcessState;
use crate::runtime::workers::Workers;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use time::OffsetDateTime;

mod change;
mod fault;
pub(crate) mod local;
pub(crate) mod rebase;
mod s3;

pub(crate) use change::{Change, CommitTally, StagedAs, Write};
pub use fault::StorageFault;
pub(crate) use fault::{Access, Doing, Fault, Refused, io_fault, s3_fault, usable};

/// What differs by backend and is known once a root is opened: data the
/// driver and maintenance read, instead of hooks one backend overrides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// The root does not exist yet: it is created once every plan is
    /// accepted ([`PublishRoot::create`]); never a bucket.
    pub(crate) missing: bool,
    /// Its commit reads the bundle (an upload hashes what it sends): such
    /// roots commit first, while the others can still be rolled back.
    pub(crate) reads_bundle_at_commit: bool,
    /// A commit that lost a race to another publisher may be re-applied on
    /// the winner's catalog: the driver gives it a [`Change::rebase`].
    pub(crate) may_rebase: bool,
    /// What an output is called in the root's messages: `file` or `object`.
    pub(crate) output_noun: &'static str,
}

/// A destination root opened (locked, or checked and recovered) for one
/// publication of one bundle or of a batch ([`open`]).
pub(crate) trait PublishRoot {
    /// The root as messages name it (a folder, or `s3://bucket/path`).
    fn label(&self) -> String;

    /// What differs by backend, as the root stands now (`missing` turns
    /// false once [`PublishRoot::create`] made it).
    fn capabilities(&self) -> Capabilities;

    /// The root's state as opened (a catalog, none, or one not to trust),
    /// taken out: the driver keeps the catalog from here on.
    fn take_state(&mut self) -> State;

    /// Creates the root when [`Capabilities::missing`], locks it and reads
    /// its state again; nothing when it exists.
    fn create(&mut self, options: &Options, now: OffsetDateTime) -> Result<(), Error>;

    /// Gets ready for the planning of `bundles` (each its desired outputs,
    /// in order) on `state`: reads at once what it will ask of storage, or
    /// lets go of what a catalog write will not use. `every_key` when a key
    /// the catalog does not record must be looked at too (a single
    /// publication, whose plan refuses an unmanaged object rather than
    /// meeting it at commit).
    fn look_ahead(
        &mut self,
        state: &State,
        bundles: &[&[Desired]],
        every_key: bool,
    ) -> Result<(), Error>;

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

    /// Of the paths of `desired`, those whose stored entry holds the
    /// recorded bytes but must be written again all the same (an object
    /// stored with other response headers than the destination's rules
    /// give now, docs/object-storage.md, "Serving the bucket"); `touched`
    /// as for [`PublishRoot::listing`]. A root that stores bytes only (a
    /// local root: its web server sets the headers) has none.
    fn rewrite(&self, desired: &[Desired], touched: &BTreeMap<String, Entry>) -> BTreeSet<String>;

    /// The plan to use instead when this backend cannot carry `plan` out
    /// (a bucket deletes only what the catalog records, and has no
    /// `--force`); `None` when it can.
    fn refusal(&self, plan: &Plan, state: &State, force: bool) -> Option<Plan>;

    /// The planned writes whose stored bytes are known, at planning, to be
    /// the planned ones already (never sent; a local root finds its own
    /// while staging, and knows none here).
    fn kept(
        &self,
        plan: &Plan,
        state: &State,
        touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String>;

    /// Stages `change`: every write either staged (its bytes checked when
    /// they come from the bundle, by the time the commit succeeds) or
    /// found to hold the planned bytes already. Nothing is in place yet.
    fn stage(
        &mut self,
        change: &Change<'_>,
        workers: &dyn Workers,
        cancel: &crate::runtime::interrupt::Cancel,
    ) -> Result<Vec<StagedAs>, Error>;

    /// Makes what was staged durable (nothing to do where nothing is
    /// staged).
    fn make_durable(&mut self) -> Result<(), Error>;

    /// Puts the change in place and records it in the catalog, or leaves
    /// nothing of it recorded.
    fn commit(&mut self, change: Change<'_>) -> Result<CommitTally, Error>;

    /// Settles the root after a failure (from its journal); says why when
    /// it cannot (the journal then stays for the next holder of the lock).
    fn roll_back(&self) -> Result<(), std::io::Error>;
}

/// A destination root opened for one maintenance command
/// ([`open_to_maintain`], docs/maintenance.md). `prune` commits through
/// [`MaintainRoot::delete_owned`], the commit path of a publication.
pub(crate) trait MaintainRoot {
    /// What differs by backend (see [`Capabilities`]).
    fn capabilities(&self) -> Capabilities;

    /// The catalog as it stands now (`None`: no state file; refused as
    /// [`Fault::Unusable`] unless it is a catalog): read again from a
    /// bucket, whose version the next commit swaps; a locked root's as it
    /// was opened, settled from its journal (or, read-only, as settling it
    /// would leave it).
    fn read_catalog(&mut self) -> Result<Option<Catalog>, Fault>;

    /// The outputs that publications still in progress (or whose publisher
    /// died) are writing, which are theirs and not unmanaged; with
    /// `report`, each such publication is logged. A locked root has none.
    fn in_flight(&self, report: bool) -> Result<BTreeSet<String>, Fault>;

    /// Everything the root holds, reserved names aside, by path: what a
    /// local root's walk finds (folders, links and special files too), or
    /// every key of a bucket (each a file).
    fn survey(&self) -> Result<BTreeMap<String, Entry>, Fault>;

    /// Of `paths`, which a survey did not find holding a regular file,
    /// those surely without one (in order). A locked root's survey is
    /// final (all of them); a bucket's listing only picks the keys to look
    /// at.
    fn confirm_absent(&self, paths: Vec<String>) -> Result<Vec<String>, Fault>;

    /// Hashes what each of `paths` holds, read to the end in fixed-size
    /// chunks, and hands `each` its index in `paths` with its size and
    /// SHA-256 (`None` where no regular file or no object is), in order.
    fn hash_each(
        &self,
        paths: &[&str],
        each: &mut dyn FnMut(usize, Option<Hashed>),
    ) -> Result<(), Fault>;

    /// Which of `paths` hold a folder now (never one in a bucket).
    fn folders_at(&self, paths: &[String]) -> Result<BTreeSet<String>, Fault>;

    /// Of `paths`, those whose object is stored with other response
    /// headers than the destination's `headers` rules give it now (in
    /// order; docs/object-storage.md, "Serving the bucket"). A root on a
    /// file system stores no headers (its web server sets them): none
    /// there.
    fn headers_differ(&self, paths: &[&str]) -> Result<Vec<String>, Fault>;

    /// Deletes what `change` deletes (recorded outputs, [`Change::deleting`])
    /// and records its catalog, through the commit a publication goes
    /// through: all of it, or (settled after a failure) only the deletions
    /// made. A catalog changed since [`MaintainRoot::read_catalog`] read it
    /// is [`Fault::lost_race`] when the change no longer holds on it.
    fn delete_owned(&mut self, change: Change<'_>) -> Result<(), Fault>;

    /// Writes `next`, made from what [`MaintainRoot::read_catalog`] gave (a
    /// catalog updated at `read_at`), as the catalog;
    /// [`Fault::lost_race`] when the catalog was changed since it was read.
    fn swap_catalog(&mut self, next: Catalog, read_at: OffsetDateTime) -> Result<(), Fault>;
}

/// A catalog file worth parsing while the bundle is prepared, before the
/// root's lock is taken ([`journal::read_ahead`]): a local root's large one.
pub(crate) fn worth_reading_ahead(
    d: &Destination,
    process: &ProcessState,
) -> Option<std::fs::File> {
    #[cfg(test)]
    if memory::registered(d) {
        return None;
    }
    match &d.backend {
        Backend::Local => local::worth_reading_ahead(d, process),
        Backend::S3(_) => None,
    }
}

/// Opens `d` for a publication: a local root locked (created later, when
/// missing), an s3 destination checked and recovered. (In unit tests, a
/// root registered with `memory::Memory::register` opens as that memory
/// root.)
pub(crate) fn open(
    d: &Destination,
    options: &Options,
    now: OffsetDateTime,
    ahead: Option<journal::ReadAhead>,
) -> Result<Box<dyn PublishRoot>, Error> {
    #[cfg(test)]
    if let Some(root) = memory::open(d) {
        return root;
    }
    Ok(match &d.backend {
        Backend::Local => Box::new(local::LocalRoot::open(d, options, now, ahead)?),
        Backend::S3(location) => Box::new(s3::S3Bucket::open(d, location, options)?),
    })
}

/// Opens `d` for a maintenance command that reads (`Access::Read`) or may
/// write (`Access::Write`): a local root locked and settled from its
/// journal (a missing one opened as empty, not created), an s3 destination
/// through the process's client, its stale intents recovered before a
/// write (docs/maintenance.md).
pub(crate) fn open_to_maintain(
    d: &Destination,
    access: Access,
    lock_timeout: Duration,
    now: OffsetDateTime,
    process: &ProcessState,
) -> Result<Box<dyn MaintainRoot>, Fault> {
    Ok(match &d.backend {
        Backend::Local => Box::new(local::LocalRoot::open_to_maintain(
            d,
            access,
            lock_timeout,
            now,
            process,
        )?),
        Backend::S3(location) => Box::new(s3::open_to_maintain(d, location, access, process)?),
    })
}

/// The folder of a release destination's releases: `<path>.releases`.
pub fn releases_folder(link: &std::path::Path) -> std::path::PathBuf {
    local::releases::folder_of(link)
}

/// `d`'s root as messages name it: a folder, or `s3://bucket/path at
/// endpoint`.
pub fn root_label(d: &Destination) -> String {
    match &d.backend {
        Backend::S3(location) => location.to_string(),
        Backend::Local => d.root.display().to_string(),
    }
}

/// `d`'s catalog as messages name it: `<root>/.distributor.json`, or
/// `s3://bucket/path/.distributor.json at endpoint`.
pub fn state_file_label(d: &Destination) -> String {
    match &d.backend {
        Backend::S3(l) => {
            let mut text = format!("s3://{}/", l.bucket);
            if !l.path.is_empty() {
                text.push_str(&l.path);
                text.push('/');
            }
            text.push_str(STATE_FILE);
            if let Some(endpoint) = &l.endpoint {
                text.push_str(" at ");
                text.push_str(endpoint);
            }
            text
        }
        Backend::Local => format!("{}/{STATE_FILE}", root_label(d)),
    }
}

/// Most bundles published together. Each batch pays fixed costs per
/// root whatever its size: a local root two file-system syncs and a write
/// of its whole catalog (tens of MiB for a large one), an s3 destination an
/// intent, a compare-and-swap of the whole catalog and a pause of the
/// uploads; so a backlog goes in few, large batches (a batch takes fewer
/// when their pages would hold too much memory).
pub const MAX_BATCH: usize = 1024;

/// The state of `d`'s catalog as it stands (`None`: the root does not
/// exist), read without writing anything and tried once: read like every
/// other command reads a root's catalog (no link followed, no FIFO opened,
/// so a tampered root cannot hang `status`), and a dead s3 endpoint holds
/// the caller for one connection attempt or one request without progress
/// at most (docs/object-storage.md).
pub fn peek_state(d: &Destination) -> Result<Option<State>, String> {
    match &d.backend {
        Backend::Local => crate::fs::storage::Root::open(&d.root)
            .and_then(|root| match root {
                Some(root) => root.read_reserved(crate::catalog::STATE_FILE),
                None => Ok(None),
            })
            .map(|bytes| bytes.map(|b| State::parse(&b)))
            .map_err(|e| e.to_string()),
        Backend::S3(location) => crate::s3::S3Root::open_single_try(location)
            .and_then(|root| root.read_state())
            .map(|base| Some(base.state))
            .map_err(|e| e.to_string()),
    }
}

/// Recovers at once what an earlier agent serving the spool folder
/// `serving` left unfinished in destination `d` (an s3 destination; a
/// local root is settled from its journal under its lock).
pub fn recover_abandoned(d: &Destination, serving: &str, process: &ProcessState) {
    if let Backend::S3(location) = &d.backend {
        s3::recover_abandoned(d, location, serving, process);
    }
}

#[cfg(test)]
pub(crate) mod memory;
