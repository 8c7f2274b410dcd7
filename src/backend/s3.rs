//! An s3 destination as a [`PublishRoot`] and a [`MaintainRoot`]
//! (docs/contract.md §15): the same plan
//! as for a local root, made true in the bucket by the commit protocol of
//! [`crate::s3::protocol`] instead of a lock, staged files and renames.
//!
//! - Opening: the server's conformance check (once per process and
//!   bucket), then recovery of any stale intent another host left behind,
//!   so a publisher killed anywhere converges at the next publication; the
//!   catalog object and its ETag are read.
//! - Planning: the planner sees what a HEAD of each planned key shows (and
//!   a listing where a local root would be listed: a root without a
//!   catalog). A batch HEADs only the keys the catalog records, all at
//!   once; a key it does not record is planned as free, and its
//!   conditional create refuses an object there at commit. The listing
//!   only informs the plan: every write is conditional, so an object that
//!   appears after it is still never overwritten.
//! - Commit: one intent lists every write and delete, the outputs go to
//!   their final keys (each PUT conditional, its bytes hashed as they are
//!   sent), and one compare-and-swap of the catalog commits them all. A
//!   lost swap is rebased onto the winner's catalog when the winner left
//!   every record the change relies on as it was ([`super::rebase`]); else
//!   everything written is undone and the attempt is transient.
//!
//! Two things a local root does are refused here, because they would
//! delete objects the catalog does not record (§15.4): `--force`, and
//! replacing a catalog of an older schema (whose records are not trusted).
//!
//! Maintenance goes through the same root and commit (`s3_maintain.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::sync::Arc;

use super::rebase;
use super::{
    Capabilities, Change, CommitTally, Doing, Fault, MaintainRoot, PublishRoot, StagedAs, Write,
};
use crate::bundle;
use crate::catalog::{Catalog, OutputRecord, RecordTexts, State};
use crate::config::{Destination, S3Location, Workflow};
use crate::fs::hashing::Hashed;
use crate::plan::{self, Action, Desired, Entry, Listing, Plan};
use crate::publish::{Error, Options};
use crate::runtime::process_state::ProcessState;
use crate::runtime::workers::Workers;
use crate::s3::headers::HeaderRules;
use crate::s3::protocol::{self, Base, Delete, Settings};
use crate::s3::{self, ETag, Head, S3Root};

pub(super) struct S3Bucket {
    root: Arc<S3Root>,
    id: String,
    location: S3Location,
    workflow: Workflow,
    /// The intent lease this process uses ([`Settings::for_process`]).
    settings: Settings,
    /// [`Options::serving`].
    serving: Option<String>,
    state: State,
    /// The catalog's version the commit swaps.
    etag: Option<ETag>,
    /// The text of its records as read, for writing the next one.
    texts: Option<Arc<RecordTexts>>,
    /// What a HEAD showed at the keys looked at ([`PublishRoot::look_ahead`]).
    heads: BTreeMap<String, Head>,
    /// The destination's `headers` rules (docs/object-storage.md,
    /// "Serving the bucket").
    headers: HeaderRules,
}

impl S3Bucket {
    /// `d`'s root at `location` through `root`, nothing read yet: no
    /// catalog, not serving a spool folder.
    pub(super) fn at(
        root: Arc<S3Root>,
        d: &Destination,
        location: &S3Location,
        settings: Settings,
    ) -> S3Bucket {
        S3Bucket {
            root,
            id: d.id.clone(),
            location: location.clone(),
            workflow: d.workflow,
            settings,
            serving: None,
            state: State::Absent,
            etag: None,
            texts: None,
            heads: BTreeMap::new(),
            headers: d.headers.clone(),
        }
    }

    /// Opens the destination's bucket, checks the server and recovers stale
    /// intents (not in a dry run, which writes nothing), reads the catalog.
    pub(super) fn open(
        d: &Destination,
        location: &S3Location,
        options: &Options,
    ) -> Result<S3Bucket, Error> {
        let settings = Settings::for_process()?;
        let root = options.process.s3_root(location)?;
        if !options.dry_run {
            root.check_conformance()?;
            // Each recovery is logged where it happens (also when a
            // publication runs into a stale intent's object later on).
            protocol::recover_stale(&root, settings)?;
        }
        let base = root.read_state()?;
        Ok(S3Bucket {
            serving: options.serving.clone(),
            state: base.state,
            etag: base.etag,
            texts: base.texts,
            ..S3Bucket::at(root, d, location, settings)
        })
    }

    /// Every key below the root where a local root would be listed (a root
    /// without a catalog, or one of an older schema to replace). Folders do
    /// not exist in a bucket, so nothing there is ever a folder or blocks one.
    fn list_keys(&self, state: &State, listing: &mut Listing) -> s3::Result<()> {
        let top = plan::needs_top_level(state, false);
        let walk = plan::needs_walk(state, self.workflow, false);
        if !top && !walk {
            return Ok(());
        }
        let reserved = |p: &str| p.starts_with(".distributor");
        let mut keys: Vec<s3::Listed> = self.root.list("")?;
        keys.retain(|l| !reserved(&l.path));
        // Keys another publication writes are its, not unmanaged: as for a
        // HEAD, they are left to the conditional create, which retries or
        // recovers them, and to the commit, which re-applies this change on
        // that publication's catalog. Read after the listing, so that every
        // key listed is either still named by the pending intent written
        // before it, or recorded by the catalog that intent's commit swapped
        // in (read last, and only when something is left).
        let mut claimed = BTreeSet::new();
        for id in protocol::pending_intents(&self.root)? {
            if let Some((intent, ..)) = self.root.read_intent(&id)? {
                claimed.extend(intent.writes.into_iter().map(|w| w.path));
            }
        }
        keys.retain(|l| !claimed.contains(&l.path));
        if !keys.is_empty() {
            let latest = self.root.read_state()?;
            if latest.etag != self.etag
                && let State::Catalog(c) = &latest.state
            {
                keys.retain(|l| c.get(&l.path).is_none());
            }
        }
        if top {
            let mut names: Vec<String> = keys
                .iter()
                .map(|l| l.path.split('/').next().unwrap_or_default().to_owned())
                .collect();
            names.dedup();
            listing.top_level = names;
        }
        if walk {
            listing.all = keys
                .into_iter()
                .map(|l| (l.path, Entry::File { size: l.size }))
                .collect();
        }
        Ok(())
    }

    /// The bundle's own verification error for the file uploaded to
    /// `key`, checked again, when that file is what is wrong (it does not
    /// match the manifest, or cannot be opened as a listed file any more).
    fn reverify(change: &Change<'_>, key: &str) -> Option<Error> {
        let w = change.writes.iter().find(|w| w.d.path.as_str() == key)?;
        let listed = w
            .bundle
            .manifest
            .files
            .iter()
            .find(|f| f.path == w.d.bundle_path)?;
        let e = bundle::verify_files(&w.bundle.dir, &[listed], &crate::runtime::workers::InOrder)
            .err()?;
        Some(Error::Bundle(e))
    }
}

/// What a bucket is: it always exists, its commit uploads (reading the
/// bundle), and a lost compare-and-swap may be rebased.
const CAPABILITIES: Capabilities = Capabilities {
    missing: false,
    reads_bundle_at_commit: true,
    may_rebase: true,
    output_noun: "object",
};

impl PublishRoot for S3Bucket {
    fn label(&self) -> String {
        self.root.label().to_owned()
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn create(&mut self, _options: &Options, _now: time::OffsetDateTime) -> Result<(), Error> {
        // A bucket is never missing.
        Ok(())
    }

    fn take_state(&mut self) -> State {
        std::mem::replace(&mut self.state, State::Absent)
    }

    fn look_ahead(
        &mut self,
        state: &State,
        bundles: &[&[Desired]],
        every_key: bool,
    ) -> Result<(), Error> {
        let keys: BTreeSet<&str> = bundles
            .iter()
            .flat_map(|desired| desired.iter())
            .map(|d| d.path.as_str())
            .filter(|k| every_key || record(state, k).is_some())
            .collect();
        let keys: Vec<&str> = keys.into_iter().collect();
        let heads = self.root.head_many(&keys)?;
        self.heads = keys
            .iter()
            .zip(heads)
            .filter_map(|(k, h)| Some(((*k).to_owned(), h?)))
            .collect();
        Ok(())
    }

    fn listing(
        &self,
        desired: &[Desired],
        state: &State,
        touched: &BTreeMap<String, Entry>,
        force: bool,
    ) -> Result<Listing, Error> {
        let mut listing = Listing {
            root_exists: true,
            ..Listing::default()
        };
        if force {
            // Refused ([`PublishRoot::refusal`]): nothing to look at.
            return Ok(listing);
        }
        self.list_keys(state, &mut listing)?;
        for d in desired {
            let path = d.path.as_str();
            if let Some(size) = size_at(path, touched, &self.heads, state) {
                listing
                    .entries
                    .insert(path.to_owned(), Entry::File { size });
            }
        }
        Ok(listing)
    }

    fn rewrite(&self, desired: &[Desired], touched: &BTreeMap<String, Entry>) -> BTreeSet<String> {
        desired
            .iter()
            .map(|d| d.path.as_str())
            .filter(|path| !touched.contains_key(*path))
            .filter(|path| {
                (self.heads.get(*path)).is_some_and(|h| h.served != self.headers.served(path))
            })
            .map(str::to_owned)
            .collect()
    }

    fn refusal(&self, plan: &Plan, state: &State, force: bool) -> Option<Plan> {
        if force {
            return Some(Plan::refused(
                Action::FailConflict,
                Vec::new(),
                format!(
                    "--force is not available for the s3 destination {}: it would delete objects the catalog does not record, which distributor never does in a bucket; delete what must go with your S3 tool (e.g. `aws s3 rm --recursive s3://{}/{}`), then publish again without --force",
                    self.id, self.location.bucket, self.location.path
                ),
            ));
        }
        unrecorded_deletes(plan, state, &self.id)
    }

    fn kept(
        &self,
        plan: &Plan,
        state: &State,
        touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        plan.writes
            .iter()
            .filter(|w| {
                let path = w.path.as_str();
                !touched.contains_key(path)
                    && already_there(state, self.heads.get(path), w, &self.headers)
            })
            .map(|w| w.path.as_str().to_owned())
            .collect()
    }

    fn stage(
        &mut self,
        change: &Change<'_>,
        _workers: &dyn Workers,
        _cancel: &crate::runtime::interrupt::Cancel,
    ) -> Result<Vec<StagedAs>, Error> {
        // Nothing is staged in a bucket: every write goes to its final key
        // at commit, hashed as it is sent.
        Ok(vec![StagedAs::Written; change.writes.len()])
    }

    fn make_durable(&mut self) -> Result<(), Error> {
        // Each upload is durable once the server answered it.
        Ok(())
    }

    fn commit(&mut self, mut change: Change<'_>) -> Result<CommitTally, Error> {
        match self.commit_change(&mut change) {
            Ok(c) => {
                if c.rebases > 0 {
                    log::info!(
                        "{}: another publisher committed first; this publication touched none of its records and was applied on top of its catalog ({} rebase{})",
                        self.root.label(),
                        c.rebases,
                        if c.rebases == 1 { "" } else { "s" }
                    );
                }
                Ok(CommitTally {
                    rebases: c.rebases,
                    ..CommitTally::default()
                })
            }
            Err(s3::Error::HashMismatch { key, .. }) => Err(Self::reverify(&change, &key)
                .unwrap_or_else(|| Error::Uploaded {
                    root: self.root.label().to_owned(),
                    key,
                })),
            // A bundle file that could not be read (not while stopping):
            // say what is wrong with it, as verification would.
            Err(e @ s3::Error::Read { .. }) if !e.is_stopped() => {
                let s3::Error::Read { key, .. } = &e else {
                    unreachable!()
                };
                Err(Self::reverify(&change, key).unwrap_or(Error::Store(e)))
            }
            Err(e) => Err(Error::Store(e)),
        }
    }

    fn roll_back(&self) -> Result<(), io::Error> {
        // Nothing to settle: a commit that failed undid what it wrote, and
        // what it could not undo is its intent's, recovered by the lease.
        Ok(())
    }
}

impl MaintainRoot for S3Bucket {
    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn read_catalog(&mut self) -> Result<Option<Catalog>, Fault> {
        maintenance::read_catalog(self)
    }

    fn in_flight(&self, report: bool) -> Result<BTreeSet<String>, Fault> {
        maintenance::in_flight(self, report)
    }

    fn survey(&self) -> Result<BTreeMap<String, Entry>, Fault> {
        maintenance::survey(self)
    }

    fn confirm_absent(&self, paths: Vec<String>) -> Result<Vec<String>, Fault> {
        maintenance::confirm_absent(self, paths)
    }

    fn hash_each(
        &self,
        paths: &[&str],
        each: &mut dyn FnMut(usize, Option<Hashed>),
    ) -> Result<(), Fault> {
        maintenance::hash_each(self, paths, each)
    }

    fn folders_at(&self, _paths: &[String]) -> Result<BTreeSet<String>, Fault> {
        // A bucket has no folders.
        Ok(BTreeSet::new())
    }

    fn headers_differ(&self, paths: &[&str]) -> Result<Vec<String>, Fault> {
        maintenance::headers_differ(self, paths)
    }

    fn delete_owned(&mut self, mut change: Change<'_>) -> Result<(), Fault> {
        self.commit_change(&mut change)
            .map(drop)
            .map_err(maintenance::fault(self, Doing::Prune))
    }

    fn swap_catalog(&mut self, next: Catalog, read_at: time::OffsetDateTime) -> Result<(), Fault> {
        maintenance::swap_catalog(self, next, read_at)
    }
}

impl S3Bucket {
    /// Commits `change` through the protocol: one intent, conditional
    /// PUTs, the catalog swapped (re-applied on a winner's catalog when
    /// the change still holds, [`rebase::onto`]), then the deletions. The
    /// catalog to write is taken out of `change`, not copied (a large
    /// catalog's records are many allocations; docs/object-storage.md,
    /// "Catalog scale").
    fn commit_change(&self, change: &mut Change<'_>) -> s3::Result<protocol::CommittedVersion> {
        let writes: Vec<protocol::Write> = change
            .writes
            .iter()
            .map(|w| protocol::Write {
                path: w.d.path.as_str().to_owned(),
                sha256: w.d.sha256.to_string(),
                source: source(w),
                replaces: change
                    .replaced(w.d.path.as_str())
                    .map(|r| r.sha256.to_string()),
                served: self.headers.served(w.d.path.as_str()),
            })
            .collect();
        // Only recorded objects are ever deleted in a bucket.
        let deletes: Vec<Delete> = change
            .deletes
            .iter()
            .filter_map(|path| {
                change.removed(path).map(|r| Delete {
                    path: path.clone(),
                    sha256: r.sha256.to_string(),
                })
            })
            .collect();
        let updated_at = change.catalog.updated_at;
        let next = std::mem::replace(&mut change.catalog, Catalog::new(updated_at));
        let rebase = change
            .rebase
            .as_ref()
            .expect("the driver gives a rebase to a target that may rebase");
        let base = Base {
            state: rebase::seen_state(rebase),
            etag: self.etag.clone(),
            texts: self.texts.clone(),
        };
        protocol::commit_for(
            &self.root,
            self.settings,
            self.serving.as_deref(),
            base,
            next,
            writes,
            deletes,
            &mut |latest: &State| rebase::onto(rebase, latest),
        )
    }
}

/// A refusal when the plan would delete an object the catalog does not
/// record (replacing a catalog of an older schema, whose records are not
/// trusted): in a bucket only recorded objects are ever deleted.
pub(super) fn unrecorded_deletes(plan: &Plan, state: &State, id: &str) -> Option<Plan> {
    let mut unrecorded: Vec<String> = plan
        .clear_first
        .iter()
        .chain(&plan.delete_after)
        .filter(|p| record(state, p).is_none())
        .cloned()
        .collect();
    if unrecorded.is_empty() {
        return None;
    }
    unrecorded.sort();
    unrecorded.dedup();
    let n = unrecorded.len();
    Some(Plan::refused(
        Action::FailUnmanaged,
        unrecorded.clone(),
        format!(
            "publishing to the s3 destination {id} would delete {n} object{} that {} does not record (first: {:?}); distributor never deletes such objects in a bucket. Move them away with your S3 tool, or publish with workflow: additive",
            if n == 1 { "" } else { "s" },
            crate::catalog::STATE_FILE,
            unrecorded[0]
        ),
    ))
}

/// What the planner sees at `path`: what the bundles before this one leave
/// there (`touched`), else what its HEAD showed. An unrecorded object that
/// names a publication's intent is that publication's (in progress, or
/// killed and not yet recovered), not an unmanaged one: seen as absent, so
/// that the commit's conditional create meets it and makes the attempt
/// transient (or recovers it) instead of a `fail_unmanaged` refusal.
fn size_at(
    path: &str,
    touched: &BTreeMap<String, Entry>,
    heads: &BTreeMap<String, Head>,
    state: &State,
) -> Option<u64> {
    match touched.get(path) {
        Some(Entry::File { size }) => Some(*size),
        Some(Entry::Missing) => None,
        // Not touched, or a folder of an earlier bundle's output (in a
        // bucket, a key of its own).
        _ => heads
            .get(path)
            .filter(|h| !is_claimed(state, path, h))
            .map(|h| h.size),
    }
}

fn record<'s>(state: &'s State, path: &str) -> Option<&'s OutputRecord> {
    match state {
        State::Catalog(c) => c.get(path),
        _ => None,
    }
}

/// Whether the object at a planned output's key already holds what the
/// plan would write: the catalog records those bytes there, and the
/// object's HEAD says so too (size, sha256 metadata), with the response
/// headers the destination's `rules` give it now. An object whose stored
/// headers differ is written again, bytes unchanged (docs/object-storage.md,
/// "Serving the bucket"): the HEAD the plan makes anyway is the one place
/// that knows them, so the catalog records none.
pub(super) fn already_there(
    state: &State,
    head: Option<&Head>,
    w: &Desired,
    rules: &HeaderRules,
) -> bool {
    record(state, w.path.as_str()).is_some_and(|r| r.sha256 == w.sha256 && r.size == w.size)
        && head.is_some_and(|h| {
            h.size == w.size
                && h.sha256.as_ref().is_some_and(|s| w.sha256 == *s)
                && h.served == rules.served(w.path.as_str())
        })
}

/// Whether an object the catalog does not record at `path` belongs to a
/// publication in progress (or killed and not yet recovered): it names an
/// intent. Such an object is planned as absent, not as unmanaged.
pub(super) fn is_claimed(state: &State, path: &str, head: &Head) -> bool {
    head.intent.is_some() && record(state, path).is_none()
}

/// Where the bytes of one planned write come from.
fn source<'a>(w: &Write<'a>) -> Box<dyn Read + 'a> {
    if let Some(content) = w.in_memory {
        return Box::new(content.reader());
    }
    Box::new(Upload {
        dir: &w.bundle.dir,
        path: w.d.bundle_path.clone(),
        file: None,
        ended: false,
    })
}

/// A bundle file on its way up. Opened at its first read, so that a commit
/// of many files holds one descriptor at a time rather than one per file.
/// Gives up at its next read once the agent is told to stop
/// (docs/contract.md §12.4), so a large upload does not hold the agent, and
/// counts into the bundle's progress like a local copy.
struct Upload<'a> {
    dir: &'a std::path::Path,
    path: crate::paths::RelPath,
    file: Option<std::fs::File>,
    ended: bool,
}

impl Read for Upload<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        crate::runtime::interrupt::check_entered()?;
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                let opened = bundle::open_listed(self.dir, &self.path).map_err(|e| match e {
                    bundle::BundleError::Unreadable { io: Some(io), .. } => io,
                    e => io::Error::other(e.to_string()),
                })?;
                self.file.insert(opened)
            }
        };
        let n = file.read(buf)?;
        if n == 0 && !buf.is_empty() && !self.ended {
            self.ended = true;
            crate::runtime::progress::file_done();
        }
        crate::runtime::progress::add_bytes(n as u64);
        Ok(n)
    }
}

/// Opens the s3 destination `d` for a maintenance command (see
/// `s3_maintain.rs`).
pub(super) fn open_to_maintain(
    d: &Destination,
    location: &S3Location,
    access: super::Access,
    process: &ProcessState,
) -> Result<S3Bucket, Fault> {
    maintenance::open(d, location, access, process)
}

/// Recovers at once what an earlier agent serving the spool folder
/// `serving` left unfinished in destination `d` (see
/// [`protocol::recover_abandoned`]). Failures are logged: the lease
/// recovers the same intents later.
pub(super) fn recover_abandoned(
    d: &Destination,
    location: &S3Location,
    serving: &str,
    process: &ProcessState,
) {
    // Each recovery is logged where it happens.
    let recovered = process
        .s3_root(location)
        .and_then(|root| protocol::recover_abandoned(&root, serving));
    if let Err(e) = recovered {
        log::warn!(
            "destination {}: cannot recover the publications the previous agent serving {serving} left unfinished ({e}); they are recovered once their lease runs out",
            d.id
        );
    }
}

#[path = "s3_maintain.rs"]
mod maintenance;

#[cfg(test)]
#[path = "s3_tests.rs"]
pub(super) mod tests;
