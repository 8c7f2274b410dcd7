//! Publishing to an s3 destination (docs/contract.md §15): the same plan as for a
//! local root, made true in the bucket by the commit protocol of
//! [`crate::s3::protocol`] instead of a lock, staged files and renames.
//!
//! - "Lock": the server's conformance check (once per process and
//!   bucket), then recovery of any stale intent another host left behind,
//!   so a publisher killed anywhere converges at the next publication.
//! - Plan: the catalog object and its ETag are read; the planner sees what
//!   a HEAD of each output key shows (and a listing where a local root
//!   would be listed: a root without a catalog). The listing only informs
//!   the plan: every write is conditional, so an object that appears after
//!   the listing is still never overwritten.
//! - Commit: outputs at their final keys, the catalog swapped on its ETag;
//!   a lost swap is rebased onto the winner's catalog when the winner
//!   touched none of this plan's paths, else everything written is undone
//!   and the publication fails as transient (the agent retries it).
//!
//! A backlog waiting for a pipeline of s3 destinations only is published
//! as one commit per destination by [`batch`] (`remote_batch.rs`).
//!
//! Two things the local backend does are refused here, because they would
//! delete objects the catalog does not record (§15.4): `--force`, and
//! replacing a catalog of an older schema (whose records are not trusted).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::sync::Arc;

use time::OffsetDateTime;

use super::prepare::Prepared;
use super::{Options, PublishError};
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{Catalog, OutputRecord, SourceIdentity, State};
use crate::config::{Destination, S3Location, Workflow};
use crate::plan::{self, Action, CatalogUpdate, Entry, Listing, Plan, PlanInput};
use crate::report::Stage;
use crate::s3::protocol::{self, Base, Delete, Settings, Write};
use crate::s3::{self, Head, S3Root};

/// One s3 destination, planned.
pub(super) struct Planned {
    root: Arc<S3Root>,
    pipeline_id: String,
    base: Base,
    pub(super) plan: Plan,
    /// The catalog change, kept to re-apply it on a newer catalog.
    update: Option<CatalogUpdate>,
    /// Planned outputs whose object already holds exactly the planned
    /// bytes (its record and its metadata agree): not uploaded again.
    pub(super) unchanged: BTreeSet<String>,
    /// The intent lease this process uses ([`Settings::for_process`]).
    settings: Settings,
    /// [`Options::serving`].
    serving: Option<String>,
}

impl Planned {
    /// What the report says once the commit succeeded: the outputs kept
    /// as they were, and the bytes uploaded.
    pub(super) fn outcome(&self) -> (Vec<String>, u64) {
        super::batch::split_writes(&self.plan, |path| self.unchanged.contains(path))
    }

    /// Bundle files this destination uploads from the bundle (not from
    /// memory): their bytes are hashed while they go up.
    pub(super) fn uploads_from_bundle<'a>(
        &'a self,
        prepared: &'a Prepared<'_>,
    ) -> impl Iterator<Item = &'a crate::paths::RelPath> + 'a {
        self.plan
            .writes
            .iter()
            .filter(|d| !self.unchanged.contains(d.path.as_str()))
            .filter(|d| !prepared.in_memory.contains_key(&d.path))
            .map(|d| &d.bundle_path)
    }
}

fn s3_error(e: s3::Error) -> PublishError {
    let stage = match e.stage() {
        "lock" | "config" => Stage::Lock,
        "plan" => Stage::Plan,
        _ => Stage::Publish,
    };
    let stopped =
        matches!(&e, s3::Error::Read { source, .. } if crate::interrupt::is_stopped(source));
    PublishError {
        stage,
        transient: stopped || e.is_transient(),
        message: e.to_string(),
    }
}

/// Opens the destination's bucket, checks the server and recovers stale
/// intents (not in a dry run, which writes nothing), reads the catalog and
/// plans.
pub(super) fn plan_destination(
    prepared: &Prepared<'_>,
    location: &S3Location,
    pipeline_id: &str,
    source: &SourceIdentity,
    options: &Options,
    now: OffsetDateTime,
) -> Result<Planned, PublishError> {
    let d = prepared.destination;
    let settings = Settings::for_process().map_err(s3_error)?;
    let root = S3Root::shared(location).map_err(s3_error)?;
    if !options.dry_run {
        root.check_conformance().map_err(s3_error)?;
        // Each recovery is logged where it happens (also when a publication
        // runs into a stale intent's object later on).
        protocol::recover_stale(&root, settings).map_err(s3_error)?;
    }
    let base = root.read_state().map_err(s3_error)?;
    let (mut plan, heads) = if options.force {
        let plan = Plan::refused(
            Action::FailConflict,
            Vec::new(),
            format!(
                "--force is not available for the s3 destination {}: it would delete objects the catalog does not record, which distributor never does in a bucket; delete what must go with your S3 tool (e.g. `aws s3 rm --recursive s3://{}/{}`), then publish again without --force",
                d.id, location.bucket, location.path
            ),
        );
        (plan, BTreeMap::new())
    } else {
        let (listing, heads) = list(&root, prepared, &base.state).map_err(s3_error)?;
        let plan = plan::plan(&PlanInput {
            pipeline_id,
            destination_id: &d.id,
            workflow: d.workflow,
            force: false,
            source,
            desired: &prepared.desired,
            state: &base.state,
            listing: &listing,
            now,
        });
        match unrecorded_deletes(&plan, &base.state, d) {
            Some(refused) => (refused, heads),
            None => (plan, heads),
        }
    };
    // Refusals have no update and no writes.
    let update = plan.update.take();
    let unchanged = plan
        .writes
        .iter()
        .filter(|w| already_there(&base.state, heads.get(w.path.as_str()), w))
        .map(|w| w.path.as_str().to_owned())
        .collect();
    Ok(Planned {
        root,
        pipeline_id: pipeline_id.to_owned(),
        base,
        plan,
        update,
        unchanged,
        settings,
        serving: options.serving.clone(),
    })
}

/// A refusal when the plan would delete an object the catalog does not
/// record (replacing a catalog of an older schema, whose records are not
/// trusted): in a bucket only recorded objects are ever deleted.
fn unrecorded_deletes(plan: &Plan, state: &State, d: &Destination) -> Option<Plan> {
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
            "publishing to the s3 destination {} would delete {n} object{} that {} does not record (first: {:?}); distributor never deletes such objects in a bucket. Move them away with your S3 tool, or publish with workflow: additive",
            d.id,
            if n == 1 { "" } else { "s" },
            crate::catalog::STATE_FILE,
            unrecorded[0]
        ),
    ))
}

fn record<'s>(state: &'s State, path: &str) -> Option<&'s OutputRecord> {
    match state {
        State::Catalog(c) => c.get(path),
        _ => None,
    }
}

/// What the planner sees of the bucket: a HEAD of every planned output
/// key (returned alongside, by path, for the unchanged check), and
/// every key below the root where a local root would be listed. Folders do
/// not exist in a bucket, so nothing there is ever a folder or blocks one.
fn list(
    root: &S3Root,
    prepared: &Prepared<'_>,
    state: &State,
) -> s3::Result<(Listing, BTreeMap<String, Head>)> {
    let mut listing = Listing {
        root_exists: true,
        ..Listing::default()
    };
    let workflow = prepared.destination.workflow;
    if plan::needs_top_level(state, false) || plan::needs_walk(state, workflow, false) {
        let reserved = |p: &str| p.starts_with(".distributor");
        // Keys a publication in progress (or killed, not recovered yet)
        // writes are its, not unmanaged: as for a HEAD below, they are
        // left to the conditional create, which retries or recovers them.
        let mut claimed = BTreeSet::new();
        for id in protocol::pending_intents(root)? {
            if let Some((intent, ..)) = root.read_intent(&id)? {
                claimed.extend(intent.writes.into_iter().map(|w| w.path));
            }
        }
        let keys: Vec<s3::Listed> = root
            .list("")?
            .into_iter()
            .filter(|l| !reserved(&l.path) && !claimed.contains(&l.path))
            .collect();
        if plan::needs_top_level(state, false) {
            let mut top: Vec<String> = keys
                .iter()
                .map(|l| l.path.split('/').next().unwrap_or_default().to_owned())
                .collect();
            top.dedup();
            listing.top_level = top;
        }
        if plan::needs_walk(state, workflow, false) {
            listing.all = keys
                .into_iter()
                .map(|l| (l.path, Entry::File { size: l.size }))
                .collect();
        }
    }
    let paths: Vec<&str> = prepared.desired.iter().map(|d| d.path.as_str()).collect();
    let mut heads = BTreeMap::new();
    for (path, head) in paths.iter().zip(root.head_many(&paths)?) {
        if let Some(h) = head {
            // An unrecorded object that names a publication's intent is that
            // publication's (in progress, or killed and not yet recovered),
            // not an unmanaged one: planned as absent, so that the commit's
            // conditional create meets it and makes the attempt transient
            // (or recovers it) instead of a `fail_unmanaged` refusal.
            if !is_claimed(state, path, &h) {
                listing
                    .entries
                    .insert((*path).to_owned(), Entry::File { size: h.size });
            }
            heads.insert((*path).to_owned(), h);
        }
    }
    Ok((listing, heads))
}

/// Where the bytes of one planned write come from.
fn source<'a>(
    prepared: &'a Prepared<'_>,
    bundle: &'a VerifiedBundle,
    d: &plan::Desired,
) -> Box<dyn Read + 'a> {
    if let Some(content) = prepared.in_memory.get(&d.path) {
        return Box::new(content.reader());
    }
    Box::new(Upload {
        dir: &bundle.dir,
        path: d.bundle_path.clone(),
        file: None,
        ended: false,
    })
}

/// A bundle file on its way up. Opened at its first read, so that a commit
/// of many files holds one descriptor at a time rather than one per file.
/// Gives up at its next read once the agent is told to stop (docs/contract.md §12.4),
/// so a large upload does not hold the agent, and counts into the bundle's
/// progress like a local copy.
struct Upload<'a> {
    dir: &'a std::path::Path,
    path: crate::paths::RelPath,
    file: Option<std::fs::File>,
    ended: bool,
}

impl Read for Upload<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if crate::interrupt::requested() {
            return Err(io::Error::other(crate::interrupt::Stopped));
        }
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
            crate::progress::file_done();
        }
        crate::progress::add_bytes(n as u64);
        Ok(n)
    }
}

/// Makes the plan true in the bucket (see the module doc), or says why
/// nothing of it is recorded.
pub(super) fn commit(
    p: Planned,
    prepared: &Prepared<'_>,
    bundle: &VerifiedBundle,
) -> Result<(), PublishError> {
    let Planned {
        root,
        pipeline_id,
        base,
        plan,
        update,
        unchanged,
        settings,
        serving,
    } = p;
    let Some(update) = &update else {
        return Ok(());
    };
    let mut writes = Vec::new();
    for d in plan.writes.iter() {
        if unchanged.contains(d.path.as_str()) {
            continue;
        }
        writes.push(Write {
            path: d.path.as_str().to_owned(),
            sha256: d.sha256.to_string(),
            source: source(prepared, bundle, d),
            replaces: record(&base.state, d.path.as_str()).map(|r| r.sha256.to_string()),
        });
    }
    let deletes: Vec<Delete> = plan
        .delete_after
        .iter()
        .filter_map(|path| {
            record(&base.state, path).map(|r| Delete {
                path: path.clone(),
                sha256: r.sha256.to_string(),
            })
        })
        .collect();
    let next = apply(update, &base.state);
    // The rebase consults only these records of the base; the base itself
    // goes to the protocol (no second copy of a large catalog).
    let seen = view(&base.state, &unchanged, &pipeline_id, prepared.destination);
    let mut rebase = |latest: &State| {
        rebase_onto(
            update,
            &seen,
            latest,
            &unchanged,
            &pipeline_id,
            prepared.destination,
        )
    };
    let committed = protocol::commit_for(
        &root,
        settings,
        serving.as_deref(),
        base,
        next,
        writes,
        deletes,
        &mut rebase,
    );
    match committed {
        Ok(c) => {
            log_rebases(&root, c.rebases, "publication");
            Ok(())
        }
        Err(s3::Error::HashMismatch { key, .. }) => Err(reverify(bundle, &plan, &key)
            .unwrap_or_else(|| PublishError {
                stage: Stage::Verify,
                message: format!(
                    "{}: the bytes uploaded to {key} did not match the manifest; nothing of the bundle is recorded there; publish the bundle again",
                    root.label()
                ),
                transient: true,
            })),
        Err(e) => {
            // A bundle file that could not be read (not while stopping):
            // say what is wrong with it, as verification would.
            let bad_file = match &e {
                s3::Error::Read { key, source, .. } if !crate::interrupt::is_stopped(source) => {
                    reverify(bundle, &plan, key)
                }
                _ => None,
            };
            Err(bad_file.unwrap_or_else(|| s3_error(e)))
        }
    }
}

/// Recovers at once what an earlier agent serving the spool folder
/// `serving` left unfinished in destination `d` (if it is an s3
/// destination; see [`protocol::recover_abandoned`]). Failures are logged:
/// the lease recovers the same intents later.
pub fn recover_abandoned(d: &Destination, serving: &str) {
    let crate::config::Backend::S3(location) = &d.backend else {
        return;
    };
    // Each recovery is logged where it happens.
    let recovered =
        S3Root::shared(location).and_then(|root| protocol::recover_abandoned(&root, serving));
    if let Err(e) = recovered {
        log::warn!(
            "destination {}: cannot recover the publications the previous agent serving {serving} left unfinished ({e}); they are recovered once their lease runs out",
            d.id
        );
    }
}

/// The catalog to write instead when another publication committed
/// `latest` after this one planned on `base`, or `None` when this plan no
/// longer holds. The protocol already checked the paths written and
/// deleted; this also needs the outputs kept unchanged (their records are
/// written again) and, for a replacement, the destination's whole set of
/// records (another publication of the same destination changes what this
/// one must delete).
fn rebase_onto(
    update: &CatalogUpdate,
    base: &State,
    latest: &State,
    unchanged: &BTreeSet<String>,
    pipeline_id: &str,
    destination: &Destination,
) -> Option<Catalog> {
    let kept_same = unchanged
        .iter()
        .all(|path| record(base, path) == record(latest, path));
    let owned = |state: &'_ State| -> Vec<OutputRecord> {
        match state {
            State::Catalog(c) => c
                .outputs
                .iter()
                .filter(|r| r.owned_by(pipeline_id, &destination.id))
                .cloned()
                .collect(),
            _ => Vec::new(),
        }
    };
    let same_destination =
        destination.workflow == Workflow::Additive || owned(base) == owned(latest);
    (kept_same && same_destination).then(|| apply(update, latest))
}

/// The records of `base` that [`rebase_onto`] looks at: those of the
/// outputs kept unchanged and, for a replacement, every record of the
/// destination. Deciding on this view decides as on the whole catalog.
fn view(
    base: &State,
    unchanged: &BTreeSet<String>,
    pipeline_id: &str,
    destination: &Destination,
) -> State {
    let State::Catalog(c) = base else {
        return base.clone();
    };
    let replacement = destination.workflow == Workflow::Replacement;
    State::Catalog(Catalog {
        distributor_version: c.distributor_version.clone(),
        created_at: c.created_at,
        updated_at: c.updated_at,
        outputs: c
            .outputs
            .iter()
            .filter(|r| {
                unchanged.contains(r.path.as_str())
                    || (replacement && r.owned_by(pipeline_id, &destination.id))
            })
            .cloned()
            .collect(),
    })
}

/// `update` applied to `state`'s catalog (kept as it is when the plan
/// started from one; when it started from none and someone created one in
/// the meantime, on top of theirs).
fn apply(update: &CatalogUpdate, state: &State) -> Catalog {
    match state {
        State::Catalog(c) => {
            let mut update = update.clone();
            update.keep_existing = true;
            update.into_catalog(Some(c.clone())).0
        }
        _ => update.clone().into_catalog(None).0,
    }
}

/// The bundle's own verification error for the file uploaded to `key`,
/// checked again, when that file is what is wrong (it does not match the
/// manifest, or cannot be opened as a listed file any more).
fn reverify(bundle: &VerifiedBundle, plan: &Plan, key: &str) -> Option<PublishError> {
    let d = plan.writes.iter().find(|d| d.path.as_str() == key)?;
    let listed = bundle
        .manifest
        .files
        .iter()
        .find(|f| f.path == d.bundle_path)?;
    let e = bundle::verify_files(&bundle.dir, &[listed]).err()?;
    Some(PublishError::permanent(Stage::Verify, e.to_string()))
}

#[path = "remote_batch.rs"]
mod batch;
pub(super) use batch::publish_batch;

#[cfg(test)]
#[path = "remote_tests.rs"]
mod tests;

/// Says, when a commit had to be applied on top of another publisher's
/// catalog, how many times (`what`: "publication" or "batch").
pub(super) fn log_rebases(root: &S3Root, rebases: u32, what: &str) {
    if rebases > 0 {
        log::info!(
            "{}: another publisher committed first; this {what} touched none of its paths and was applied on top of its catalog ({rebases} rebase{})",
            root.label(),
            if rebases == 1 { "" } else { "s" }
        );
    }
}

/// Whether the object at a planned output's key already holds what the
/// plan would write: the catalog records those bytes there, and the
/// object's HEAD (size, sha256 metadata) says so too.
pub(super) fn already_there(state: &State, head: Option<&Head>, w: &plan::Desired) -> bool {
    record(state, w.path.as_str()).is_some_and(|r| r.sha256 == w.sha256 && r.size == w.size)
        && head
            .is_some_and(|h| h.size == w.size && h.sha256.as_ref().is_some_and(|s| w.sha256 == *s))
}

/// Whether an object the catalog does not record at `path` belongs to a
/// publication in progress (or killed and not yet recovered): it names an
/// intent. Such an object is planned as absent, not as unmanaged.
pub(super) fn is_claimed(state: &State, path: &str, head: &Head) -> bool {
    head.intent.is_some() && record(state, path).is_none()
}
