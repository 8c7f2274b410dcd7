//! Publication: verify a bundle, lock every destination root, plan them all,
//! and only if every plan is accepted, execute them.
//!
//! Execution follows the plan exactly and decides nothing new: journal,
//! clear (force and legacy replacement only), stage every output as a
//! durable temporary file (or leave it alone when the file there already
//! holds those bytes, as its record says and a re-hash confirms), rename
//! them into place, delete, write the catalog last, drop the journal. Any error rolls the root back to a state
//! whose catalog matches its bytes (see `journal`).

use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{Catalog, OutputRecord, SourceIdentity, State};
use crate::clock::now_millis;
use crate::config::{Backend, Destination, Pipeline};
use crate::journal;
use crate::lock::{self, RootLock};
use crate::paths::RelPath;
use crate::plan::{self, Desired, Listing, Plan, PlanInput};
use crate::remembered;
use crate::report::{RunReport, Stage};
use crate::storage::{self, Root};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;
use time::OffsetDateTime;

mod batch;
mod content;
mod prepare;
mod remote;
mod stage;

pub use crate::workers::{InOrder, PerCore, Workers};
pub use batch::{Batch, publish_batch};

use prepare::{Prepared, Ready, prepare_bundle};
pub use remote::recover_abandoned;
use stage::{Staged, StagedRoot, probe, roll_back};

/// How to run a publication.
#[derive(Debug, Clone)]
pub struct Options {
    pub dry_run: bool,
    /// `--force`: plan `force_replace` for every selected destination.
    pub force: bool,
    pub lock_timeout: Duration,
    /// When an agent publishes: its pipeline's `work/` folder, which it
    /// alone serves. Tags its s3 intents so that the next agent serving
    /// the folder recovers them at once after a crash
    /// ([`recover_abandoned`]).
    pub serving: Option<String>,
    /// Folder for rendered pages too big to hold in memory, written to
    /// unnamed files (never visible, gone when closed): the agent's work
    /// folder, which it alone uses.
    pub scratch: PathBuf,
}

/// One destination once its root is locked and planned.
struct Planned {
    root: Option<Root>,
    _lock: Option<RootLock>,
    state_was_absent: bool,
    /// The record each planned write replaces (for the journal), sorted
    /// by path.
    replaced: Vec<OutputRecord>,
    /// The catalog to write last (`None`: nothing to write, or a dry run).
    catalog: Option<Catalog>,
    plan: Plan,
}

impl Planned {
    /// What the engine is to do in this root; `None` when there is
    /// nothing to write (`skip_same`, a dry run).
    fn change<'a>(
        &'a self,
        prepared: &'a Prepared<'_>,
        bundle: &'a VerifiedBundle,
    ) -> Option<stage::Change<'a>> {
        let (Some(root), Some(catalog)) = (&self.root, &self.catalog) else {
            return None;
        };
        let plan = &self.plan;
        Some(stage::Change {
            root,
            writes: plan
                .writes
                .iter()
                .map(|d| stage::Write {
                    d,
                    in_memory: prepared.in_memory.get(&d.path).map(|c| &**c),
                    bundle,
                })
                .collect(),
            clear_first: &plan.clear_first,
            deletes: plan.delete_after.iter().map(String::as_str).collect(),
            catalog,
            replaced: &self.replaced,
            state_was_absent: self.state_was_absent,
            record_looks: true,
        })
    }
}

/// Publishes the bundle in `bundle_dir` to `destinations` of `pipeline`.
///
/// Every byte is read once where possible: the bundle is inspected (manifest,
/// file types and sizes) up front, and each copied file is hashed while it
/// is staged. Nothing is renamed into any root until every staged copy, and
/// every file no destination copies, has matched the manifest. When the run
/// will not write (a dry run, a refusal, a skip), creates a root or clears
/// one (`force_replace`, replacement over legacy state), the whole bundle is
/// hashed before anything else, so an invalid bundle is always reported as
/// such and never leaves a trace.
pub fn publish(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    options: &Options,
) -> RunReport {
    // A large catalog is parsed while the bundle is inspected (before the
    // lock; used under it only if the file is still the one read).
    let worth: Vec<(usize, std::fs::File)> = destinations
        .iter()
        .enumerate()
        .filter(|(_, d)| matches!(d.backend, Backend::Local))
        .filter_map(|(i, d)| {
            let root = Root::open(&d.root).ok()??;
            Some((i, journal::worth_reading_ahead(&root)?))
        })
        .collect();
    let (ready, mut ahead) = std::thread::scope(|s| {
        let reading = (!worth.is_empty()).then(|| {
            s.spawn(|| {
                worth
                    .into_iter()
                    .filter_map(|(i, file)| Some((i, journal::read_ahead(file)?)))
                    .collect::<Vec<_>>()
            })
        });
        let ready = prepare_bundle(
            pipeline,
            destinations,
            bundle_dir,
            options.dry_run,
            &options.scratch,
        );
        let ahead = reading.and_then(|r| r.join().ok()).unwrap_or_default();
        (ready, ahead)
    });
    let Ready {
        mut report,
        bundle,
        source,
        prepared,
        mut verified,
    } = match ready {
        Ok(ready) => ready,
        Err(report) => return *report,
    };

    // Lock roots in path order (no deadlock between processes), then plan.
    let now = now_millis();
    let mut order: Vec<usize> = (0..prepared.len()).collect();
    order.sort_by(|a, b| {
        prepared[*a]
            .destination
            .root
            .cmp(&prepared[*b].destination.root)
    });
    let mut planned: Vec<(usize, Planned)> = Vec::new();
    // s3 destinations take no lock: their commit is a compare-and-swap.
    let mut remote: Vec<(usize, remote::Planned)> = Vec::new();
    for i in order {
        let outcome = match &prepared[i].destination.backend {
            Backend::Local => {
                let read = ahead
                    .iter()
                    .position(|(j, _)| *j == i)
                    .map(|at| ahead.swap_remove(at).1);
                lock_and_plan(
                    &prepared[i],
                    &pipeline.id,
                    &source,
                    options,
                    now,
                    false,
                    read,
                )
                .map(|done| planned.push((i, done)))
            }
            Backend::S3(location) => remote::plan_destination(
                &prepared[i],
                location,
                &pipeline.id,
                &source,
                options,
                now,
            )
            .map(|done| remote.push((i, done))),
        };
        if let Err(e) = outcome {
            report.destinations[i].error = Some(e.message.clone());
            return e.fail(report);
        }
    }
    let refused = record_plans(&mut report, all_plans(&planned, &remote).into_iter());
    let writes_anything = all_plans(&planned, &remote)
        .iter()
        .any(|(_, p)| !p.writes.is_empty());
    let creates_root = planned.iter().any(|(_, p)| p.root.is_none());
    // Clearing a root deletes before anything is staged, and nothing may
    // be deleted for a bundle that turns out not to match its manifest.
    let clears = planned.iter().any(|(_, p)| !p.plan.clear_first.is_empty());
    let hash_first =
        refused.is_some() || options.dry_run || !writes_anything || creates_root || clears;
    if hash_first && let Err(e) = verify_rest(&bundle, &mut verified) {
        return report.fail(Stage::Verify, e.to_string(), e.is_transient());
    }
    if let Some(refused) = refused {
        return refused;
    }
    if options.dry_run {
        return report;
    }
    // Roots that do not exist yet are created (and locked) only now that
    // every plan is accepted, then planned again under their lock.
    for (i, p) in planned.iter_mut().filter(|(_, p)| p.root.is_none()) {
        match lock_and_plan(
            &prepared[*i],
            &pipeline.id,
            &source,
            options,
            now,
            true,
            None,
        ) {
            Ok(again) => *p = again,
            Err(e) => {
                report.destinations[*i].error = Some(e.message.clone());
                return e.fail(report);
            }
        }
    }
    if let Some(refused) = record_plans(&mut report, all_plans(&planned, &remote).into_iter()) {
        return refused;
    }
    planned.sort_by_key(|(i, _)| *i);
    remote.sort_by_key(|(i, _)| *i);

    // Stage every destination (journal, temporary files hashed as they are
    // copied); check what no destination copied; make the staged files
    // durable; only then commit.
    let changes: Vec<(usize, stage::Change)> = planned
        .iter()
        .filter_map(|(i, p)| Some((*i, p.change(&prepared[*i], &bundle)?)))
        .collect();
    let mut staged: Vec<StagedRoot> = Vec::new();
    let mut failure = None;
    for (i, change) in &changes {
        match stage::stage(change, &PerCore::new(), &|| true) {
            Ok(s) => {
                for (w, out) in change.writes.iter().zip(&s.outputs) {
                    if w.in_memory.is_none() && matches!(out, Staged::Temp(_)) {
                        verified.insert(w.d.bundle_path.clone());
                    }
                }
                staged.push(s);
            }
            Err(f) => {
                failure = Some((*i, f));
                break;
            }
        }
    }
    // What an s3 destination uploads from the bundle is hashed on its way
    // up (a mismatch undoes that destination's publication), so it is not
    // read a second time here.
    for (i, p) in &remote {
        verified.extend(p.uploads_from_bundle(&prepared[*i]).cloned());
    }
    if failure.is_none()
        && let Err(e) = verify_rest(&bundle, &mut verified)
    {
        failure = Some((usize::MAX, Failure::Bundle(e)));
    }
    if failure.is_none() {
        for ((i, change), s) in changes.iter().zip(&mut staged) {
            if let Err(e) = stage::make_durable(change.root, s) {
                failure = Some((*i, Failure::Io(e)));
                break;
            }
        }
    }
    let roll_back_local = || {
        for (_, p) in &planned {
            if let Some(root) = &p.root {
                roll_back(root);
            }
        }
    };
    if let Some((i, f)) = failure {
        roll_back_local();
        return match f {
            Failure::Bundle(e) => report.fail(Stage::Verify, e.to_string(), e.is_transient()),
            Failure::Io(e) => write_failed(report, i, prepared[i].destination, &e),
            Failure::Stopped(e) => e.fail(report),
        };
    }
    // s3 destinations commit first: their uploads are the last reads of
    // the bundle, and a failure there can still roll the local roots back.
    for (i, p) in remote {
        let (unchanged, bytes) = p.outcome();
        if let Err(e) = remote::commit(p, &prepared[i], &bundle) {
            roll_back_local();
            report.destinations[i].error = Some(e.message.clone());
            return e.fail(report);
        }
        report.destinations[i].unchanged.extend(unchanged);
        report.bytes_published += bytes;
    }
    let mut committed = Vec::new();
    for ((i, change), s) in changes.iter().zip(staged) {
        for (w, out) in change.writes.iter().zip(&s.outputs) {
            match out {
                Staged::Temp(_) => report.bytes_published += w.d.size,
                Staged::Unchanged(_) => report.destinations[*i]
                    .unchanged
                    .push(w.d.path.as_str().to_owned()),
            }
        }
        report.synced_file_by_file += u64::from(s.file_by_file());
        match stage::commit(change, s) {
            Ok(c) => {
                report.copied_across += c.copied_across;
                committed.push((*i, c));
            }
            Err(e) => {
                roll_back_local();
                return write_failed(report, *i, prepared[*i].destination, &e);
            }
        }
    }
    drop(changes);
    for (i, c) in committed {
        let p = &mut planned
            .iter_mut()
            .find(|(j, _)| *j == i)
            .expect("committed destinations are planned")
            .1;
        if let (Some(root), Some(catalog)) = (&p.root, p.catalog.take()) {
            remembered::remember(root, c.catalog, catalog, c.texts);
        }
    }
    report
}

/// Every destination's plan, local and s3, with its index.
fn all_plans<'p>(
    planned: &'p [(usize, Planned)],
    remote: &'p [(usize, remote::Planned)],
) -> Vec<(usize, &'p Plan)> {
    let local = planned.iter().map(|(i, p)| (*i, &p.plan));
    local
        .chain(remote.iter().map(|(i, p)| (*i, &p.plan)))
        .collect()
}

/// The report of a write that failed in destination `i` (after its root
/// was settled from the journal).
fn write_failed(mut report: RunReport, i: usize, d: &Destination, e: &io::Error) -> RunReport {
    let transient = storage::is_transient(e);
    let next = if transient {
        "the agent retries it with backoff; if it persists, free space or fix permissions on the root, then `distributor spool retry`"
    } else {
        "fix the cause, then publish the bundle again"
    };
    let message = format!(
        "publishing to {} failed: {e}; the root was left consistent (its catalog matches its files), {next}",
        d.root.display()
    );
    report.destinations[i].error = Some(message.clone());
    report.fail(Stage::Publish, message, transient)
}

/// Why preparing or staging a publication stopped.
enum Failure {
    /// The bundle does not match its manifest.
    Bundle(bundle::BundleError),
    /// Writing to a destination failed.
    Io(io::Error),
    /// Anything else, already classified and phrased for the operator.
    Stopped(PublishError),
}

/// Why a publication stopped before writing: the step, what to tell the
/// operator (what happened and what to do), and whether retrying later may
/// help. Transient or permanent is decided once, where the error is made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
struct PublishError {
    stage: Stage,
    message: String,
    transient: bool,
}

impl PublishError {
    /// A failure that publishing the bundle again cannot fix by itself.
    fn permanent(stage: Stage, message: String) -> PublishError {
        PublishError {
            stage,
            message,
            transient: false,
        }
    }

    /// An I/O failure while doing `what`; transient when the error may go
    /// away by itself ([`storage::is_transient`]).
    fn io(stage: Stage, what: impl std::fmt::Display, e: &io::Error) -> PublishError {
        PublishError {
            stage,
            message: format!("{what}: {e}"),
            transient: storage::is_transient(e),
        }
    }

    /// `report`, failed with this error.
    fn fail(self, report: RunReport) -> RunReport {
        report.fail(self.stage, self.message, self.transient)
    }
}

/// Hashes every listed file not checked yet.
fn verify_rest(
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
) -> Result<(), bundle::BundleError> {
    let rest: Vec<&bundle::ManifestFile> = bundle
        .manifest
        .files
        .iter()
        .filter(|f| !verified.contains(&f.path))
        .collect();
    if rest.is_empty() {
        return Ok(());
    }
    bundle::verify_files(&bundle.dir, &rest)?;
    verified.extend(rest.into_iter().map(|f| f.path.clone()));
    Ok(())
}

/// Copies each plan into the report; returns the failed report when any
/// plan is a refusal (then nothing may be written anywhere).
fn record_plans<'p>(
    report: &mut RunReport,
    plans: impl Iterator<Item = (usize, &'p Plan)>,
) -> Option<RunReport> {
    let mut refused = Vec::new();
    for (i, plan) in plans {
        let r = &mut report.destinations[i];
        r.action = Some(plan.action.as_str().to_owned());
        r.writes = plan
            .writes
            .iter()
            .map(|d| d.path.as_str().to_owned())
            .collect();
        r.deletes = plan.deletes.clone();
        r.unmanaged = plan.unmanaged.clone();
        r.error = plan.error.clone();
        if plan.action.is_refusal() {
            refused.push(format!(
                "{}: {}",
                r.destination_id,
                r.error.clone().unwrap_or_default()
            ));
        }
    }
    if refused.is_empty() {
        return None;
    }
    let mut failed = report.clone();
    failed.refused = true;
    Some(failed.fail(
        Stage::Plan,
        format!(
            "publication refused, nothing was written: {}",
            refused.join("; ")
        ),
        false,
    ))
}

fn lock_and_plan(
    prepared: &Prepared<'_>,
    pipeline_id: &str,
    source: &SourceIdentity,
    options: &Options,
    now: OffsetDateTime,
    create: bool,
    ahead: Option<journal::ReadAhead>,
) -> Result<Planned, PublishError> {
    let d = prepared.destination;
    let shown = d.root.display();
    let io_err =
        |what: &str, e: io::Error| PublishError::io(Stage::Lock, format!("{what} {shown}"), &e);
    let root = if create {
        Some(Root::create(&d.root).map_err(|e| io_err("cannot create destination root", e))?)
    } else {
        Root::open(&d.root).map_err(|e| io_err("cannot open destination root", e))?
    };
    let lock = match &root {
        Some(root) if options.dry_run => lock::acquire_existing(root, options.lock_timeout),
        Some(root) => lock::acquire(root, options.lock_timeout).map(Some),
        None => Ok(None),
    }
    .map_err(|e| {
        let transient = match &e {
            lock::LockError::Timeout { .. } => true,
            lock::LockError::Io { source, .. } => storage::is_transient(source),
        };
        PublishError {
            stage: Stage::Lock,
            message: e.to_string(),
            transient,
        }
    })?;

    let plan_err = |e: io::Error| {
        PublishError::io(
            Stage::Plan,
            format!("cannot read destination root {shown}"),
            &e,
        )
    };
    let (state, listing) = match &root {
        None => (State::Absent, Listing::default()),
        Some(root) => {
            let state =
                journal::recover_with(root, !options.dry_run, now, ahead).map_err(plan_err)?;
            let listing =
                list(root, &prepared.desired, &state, d, options.force).map_err(plan_err)?;
            (state, listing)
        }
    };
    let mut plan = plan::plan(&PlanInput {
        pipeline_id,
        destination_id: &d.id,
        workflow: d.workflow,
        force: options.force,
        source,
        desired: &prepared.desired,
        state: &state,
        listing: &listing,
        now,
    });
    let state_was_absent = matches!(state, State::Absent);
    // The listing has served its purpose; a large tree's is several MiB.
    drop(listing);
    // Turn the old catalog into the new one in place, keeping aside the
    // records the planned writes replace, for the journal (dry runs never
    // write, so never build it). Records are moved, never copied.
    let current = match state {
        State::Catalog(old) => Some(old),
        _ => None,
    };
    let (catalog, replaced) = match plan.update.take() {
        Some(update) if !options.dry_run => {
            let (catalog, replaced) = update.into_catalog(current);
            (Some(catalog), replaced)
        }
        _ => (None, Vec::new()),
    };
    Ok(Planned {
        root,
        _lock: lock,
        state_was_absent,
        replaced,
        catalog,
        plan,
    })
}

fn list(
    root: &Root,
    desired: &[Desired],
    state: &State,
    d: &Destination,
    force: bool,
) -> io::Result<Listing> {
    Ok(Listing {
        root_exists: true,
        top_level: if plan::needs_top_level(state, force) {
            root.top_level()?
        } else {
            Vec::new()
        },
        entries: probe(root, desired, &BTreeMap::new())?,
        all: if plan::needs_walk(state, d.workflow, force) {
            root.walk()?
        } else {
            Vec::new()
        },
    })
}
