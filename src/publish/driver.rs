//! The one publication driver: a batch of bundles (a single publication is
//! a batch of one) published to every destination of a pipeline as one
//! transaction per destination root, whatever its backend
//! (docs/architecture.md, "One transaction over backends").
//!
//! 1. Prepare: inspect each bundle, render its pages, compute each
//!    destination's outputs (a large local catalog is parsed meanwhile).
//!    A batch may open its roots (step 2) first ([`Policy`]).
//! 2. Open every root in path order ([`backend::open`]: a lock, or a
//!    server check and recovery), then plan each bundle in arrival order
//!    against the catalog and storage as the bundles before it leave them
//!    (the planner decides every refusal, the signature rules included).
//!    A refused or invalid bundle gets its own report and does not stop
//!    the others; a root without a valid catalog ends a batch at once
//!    ([`Ended::OneFirst`]: the first bundle goes by itself and sets the
//!    root up).
//! 3. Merge the accepted bundles' changes into one change per root, stage
//!    every root, hash what no root copied, make everything durable, and
//!    commit: roots whose commit reads the bundle (uploads) first, while
//!    the others can still be rolled back.
//!
//! Anything that goes wrong once writing started rolls every root back to
//! a state whose catalog matches its bytes, and the run ends
//! [`Ended::Aborted`]: the error, the root it is at and the report of the
//! bundle in hand. A single publication's caller turns that into the
//! bundle's failed report; a batch's caller publishes its bundles one by
//! one, where the culprit gets its own report. What differs between one
//! bundle and many is one [`Policy`] value, decided when a run starts; it
//! never changes how a run ends.

use super::error::Error;
use super::prepare::{Prepared, Ready, prepare_bundle};
use super::{Options, record_plans, verify_rest};
use crate::backend::rebase::{self, Rebase};
use crate::backend::{self, Change, PublishRoot, StagedAs, Write};
use crate::catalog::{Catalog, OutputRecord, Overlay, SourceIdentity, State};
use crate::config::{Destination, Pipeline};
use crate::paths::RelPath;
use crate::plan::{self, CatalogUpdate, Desired, Entry, Plan, PlanInput};
use crate::report::RunReport;
use crate::runtime::clock::now_millis;
use crate::runtime::interrupt::Cancel;
use crate::runtime::workers::{Workers, map_on};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use time::OffsetDateTime;

/// How a run of the driver ended, for one bundle as for many.
pub(super) enum Ended {
    /// A report for each of the first bundles (all of them, unless their
    /// pages would have held too much memory together: the others were
    /// not attempted).
    Reports(Vec<RunReport>),
    /// Nothing was published: a root has no valid catalog yet; the first
    /// bundle goes by itself, then batching resumes. Never for a single
    /// bundle ([`Policy::needs_catalogs`]).
    OneFirst,
    /// Nothing was published (every root was rolled back): why.
    Aborted(Box<Aborted>),
}

/// Why a run published nothing, and where.
pub(super) struct Aborted {
    pub(super) error: Error,
    /// The root (index among the destinations) the error is at, if one.
    pub(super) root: Option<usize>,
    /// The report of the bundle in hand (the first one, or the one being
    /// planned), as far as it got; `None` when no bundle was prepared yet
    /// (a batch that opened its roots first). A single bundle is always
    /// prepared before its roots are opened.
    pub(super) report: Option<RunReport>,
}

/// What differs between publishing one bundle and a batch, decided once
/// when a run starts ([`Policy::for_bundles`]). Nothing else does: the
/// steps, the errors and how a run ends are the same for both.
#[derive(Debug, Clone, Copy)]
struct Policy {
    /// Every root must hold a valid catalog, else nothing is published and
    /// the first bundle goes by itself ([`Ended::OneFirst`]): the bundles
    /// plan on the catalog as the ones before them leave it, which a root
    /// without one (missing, legacy, invalid) cannot give. So that a batch
    /// finds out before it renders anything, its roots are opened before
    /// the bundles are prepared unless every one has a catalog to read
    /// ahead. A single bundle may set a root up, and is prepared before any
    /// root is locked: an invalid one never waits for a lock.
    needs_catalogs: bool,
    /// The look ahead of a root reads every key the bundles plan, not only
    /// those its catalog records: a single publication's plan then refuses
    /// an unmanaged object rather than meeting it at commit. A batch looks
    /// only at the recorded keys, and its commit meets such an object
    /// (the batch then steps aside, and the bundle that planned it is
    /// refused when it goes by itself).
    every_key: bool,
    /// A root where the bundle has nothing to record lets go of its catalog
    /// (a large tree's is tens of MiB) while the bundle is hashed and the
    /// rest runs: no other bundle of the run plans on it.
    drop_unrecorded: bool,
    /// The commit records the looks of the written files
    /// (`.distributor-seen`), so that the next version of a large tree
    /// knows its unchanged files without reading them. Large trees are
    /// published one at a time; the merged writes of a batch of small
    /// bundles would replace the record with a few files.
    record_looks: bool,
    /// The stop (`Cancel::finishing`) is checked once more before the commit. A stopping agent
    /// abandons a batch there (nothing committed: the bundle in hand is
    /// published by itself, the others go back), while a single bundle is
    /// the bundle in hand, which a stop lets finish.
    stop_before_commit: bool,
    /// A commit that fails at a root is logged and wrapped in
    /// [`Error::Commit`], which names the root and the number of bundles:
    /// the roots committed before keep the batch, so the agent tries it
    /// again as a batch rather than one by one. A single bundle's report
    /// gets the backend's error as it is.
    name_the_batch: bool,
}

impl Policy {
    /// The policy of a run of `bundles` bundles.
    fn for_bundles(bundles: usize) -> Policy {
        let batch = bundles > 1;
        Policy {
            needs_catalogs: batch,
            every_key: !batch,
            drop_unrecorded: !batch,
            record_looks: !batch,
            stop_before_commit: batch,
            name_the_batch: batch,
        }
    }
}

/// Everything a run publishes with.
pub(super) struct Driver<'a> {
    pub(super) pipeline: &'a Pipeline,
    pub(super) destinations: &'a [&'a Destination],
    pub(super) options: &'a Options,
    pub(super) workers: &'a dyn Workers,
    /// Once finishing, the batch is given up before anything is committed.
    pub(super) cancel: &'a Cancel,
    /// When set, every planned write or delete of a record whose source
    /// was created after the bundle's is noted here
    /// ([`super::rollbacks`]).
    pub(super) older: Option<&'a std::sync::Mutex<Vec<super::Rollback>>>,
    /// Told, once every root is durable and before the first commits, the
    /// reports of the bundles about to be committed (their index among the
    /// bundles, the report as the commit leaves it): the agent records
    /// them ([`super::BeforeCommit`]). An error stops the publication
    /// before anything is committed.
    pub(super) before_commit: Option<&'a super::BeforeCommit<'a>>,
    /// What this pipeline's publications deleted, read from the agent's
    /// spool when a plan first needs it (`signatures.refuse_older`).
    pub(super) tombstones: std::sync::OnceLock<crate::spool::queue::Tombstones>,
}

/// One destination root during a run, opened through its backend.
struct OpenRoot<'d> {
    destination: &'d Destination,
    target: Box<dyn PublishRoot>,
    records: Records,
    /// What the bundles planned so far leave at the paths they write or
    /// delete (and the folders above): never read from storage again.
    touched: BTreeMap<String, Entry>,
    /// What the bundles planned so far delete, with the source of each
    /// (written again by a later one: gone): tombstones of this batch.
    retracted: BTreeMap<String, SourceIdentity>,
}

/// A root's catalog as opened, and the catalog changes of the bundles
/// planned so far.
struct Records {
    opened: State,
    /// The opened catalog with the changes recorded, built when a second
    /// bundle plans on top of the first one's changes.
    overlay: Option<Overlay>,
    updates: Vec<CatalogUpdate>,
}

impl Records {
    fn new(opened: State) -> Records {
        Records {
            opened,
            overlay: None,
            updates: Vec::new(),
        }
    }

    /// The state a bundle plans on: the catalog as opened, or (after other
    /// bundles) only the records this bundle's plan can consult.
    fn state_for(
        &mut self,
        desired: &[Desired],
        d: &Destination,
        pipeline_id: &str,
    ) -> Cow<'_, State> {
        if self.updates.is_empty() {
            return Cow::Borrowed(&self.opened);
        }
        let overlay = self.overlay.get_or_insert_with(|| {
            let State::Catalog(base) = std::mem::replace(&mut self.opened, State::Absent) else {
                unreachable!("only a root with a catalog takes several bundles")
            };
            let mut overlay = Overlay::new(base);
            for u in &self.updates {
                overlay.record(&u.upserts, &u.removes);
            }
            overlay
        });
        Cow::Owned(State::Catalog(plan::catalog_view(
            overlay,
            desired,
            d.workflow,
            pipeline_id,
            &d.id,
        )))
    }

    /// Whether the root was opened without a catalog file.
    fn was_absent(&self) -> bool {
        self.overlay.is_none() && matches!(self.opened, State::Absent)
    }

    fn record(&mut self, update: CatalogUpdate) {
        if let Some(overlay) = &mut self.overlay {
            overlay.record(&update.upserts, &update.removes);
        }
        self.updates.push(update);
    }

    /// The catalog once every recorded change is made, the records the
    /// `writes` replace and the `deletes` remove, and (for a target that
    /// may rebase) what a lost race needs.
    fn finish(
        self,
        writes: impl Iterator<Item = String>,
        deletes: &BTreeSet<&str>,
        rebase_for: Option<(&str, &Destination)>,
        now: OffsetDateTime,
    ) -> Finished {
        let Records {
            opened,
            overlay,
            mut updates,
        } = self;
        let base = match (&overlay, &opened) {
            (Some(o), _) => Some(o.base()),
            (None, State::Catalog(c)) => Some(c),
            _ => None,
        };
        let at = |paths: &mut dyn Iterator<Item = String>| -> Vec<OutputRecord> {
            paths.filter_map(|p| base?.get(&p).cloned()).collect()
        };
        let removed = at(&mut deletes.iter().map(|p| (*p).to_owned()));
        // With an overlay the writes' records are looked up; else the
        // update hands them back as it moves the catalog.
        let replaced = overlay.as_ref().map(|_| at(&mut writes.into_iter()));
        let rebase = rebase_for.map(|(pipeline_id, d)| Rebase {
            seen: base.map(|b| rebase::relied_on(b, &updates, pipeline_id, &d.id, d.workflow)),
            updates: Vec::new(),
            pipeline_id: pipeline_id.to_owned(),
            destination_id: d.id.clone(),
            workflow: d.workflow,
            now,
        });
        let (catalog, replaced, rebase) = match (overlay, replaced) {
            (Some(overlay), Some(replaced)) => {
                let rebase = rebase.map(|r| Rebase { updates, ..r });
                (overlay.into_catalog(now), replaced, rebase)
            }
            _ => {
                let current = match opened {
                    State::Catalog(c) => Some(c),
                    _ => None,
                };
                let update = updates.pop().expect("a root with a change has an update");
                match rebase {
                    // The update is kept to apply it again after a lost race.
                    Some(r) => {
                        let (catalog, replaced) = update.clone().into_catalog(current);
                        let updates = vec![update];
                        (catalog, replaced, Some(Rebase { updates, ..r }))
                    }
                    // Records moved, never copied: a large tree's are held once.
                    None => {
                        let (catalog, replaced) = update.into_catalog(current);
                        (catalog, replaced, None)
                    }
                }
            }
        };
        Finished {
            catalog,
            replaced,
            removed,
            rebase,
        }
    }
}

/// A root's records once every change of the run is made
/// ([`Records::finish`]).
struct Finished {
    catalog: Catalog,
    /// The records the writes replace.
    replaced: Vec<OutputRecord>,
    /// The records the deletes remove.
    removed: Vec<OutputRecord>,
    /// What a commit that lost a race needs, for a target that may rebase.
    rebase: Option<Rebase>,
}

/// Why a run stopped, and the root it stopped at (if one).
struct Failed {
    root: Option<usize>,
    error: Error,
}

impl Failed {
    /// `error` at root `j`.
    fn at(j: usize, error: Error) -> Failed {
        Failed {
            root: Some(j),
            error,
        }
    }

    /// `error`, at no root in particular.
    fn anywhere(error: Error) -> Failed {
        Failed { root: None, error }
    }

    /// The run's end, before any root was rolled back (none was written),
    /// with the report of the bundle in hand.
    fn aborted(self, report: Option<RunReport>) -> Ended {
        Ended::Aborted(Box::new(Aborted {
            error: self.error,
            root: self.root,
            report,
        }))
    }
}

/// The bundles a run takes ([`Driver::prepare`]): a report for each, filled
/// in for those that will not be published, and the ones ready, with their
/// index among them.
struct Taken {
    reports: Vec<Option<RunReport>>,
    ready: Vec<(usize, Ready)>,
}

/// The bundles taken and every root opened: a run ready to plan.
struct Started<'d> {
    taken: Taken,
    roots: Vec<OpenRoot<'d>>,
}

/// One bundle's plan for one root: the plan (or the backend's refusal) and
/// its writes known to hold their bytes already.
struct RootPlan {
    plan: Plan,
    kept: BTreeSet<String>,
}

/// What the commits of every root did, told once in the first report.
struct CommitTotals {
    /// Outputs copied across file systems.
    copied_across: u64,
    /// Roots made durable file by file.
    file_by_file: u64,
    /// Per root, how often its catalog's compare-and-swap was rebased.
    rebases: Vec<u32>,
}

/// A bundle whose every plan was accepted.
struct Accepted {
    index: usize,
    ready: Ready,
    plans: Vec<Plan>,
    /// Per root: planned writes known at planning to hold their bytes.
    kept: Vec<BTreeSet<String>>,
}

/// One root's writes and deletes, merged over the accepted bundles.
struct Merged<'p> {
    /// Sorted by output path: the bundle (index among the accepted ones)
    /// whose output it is, and the output (the plan's own, not a copy: a
    /// large tree's outputs are several MiB).
    writes: Vec<(usize, &'p Desired)>,
    deletes: BTreeSet<&'p str>,
    clear_first: Vec<String>,
}

impl<'p> Merged<'p> {
    /// One root's writes and deletes of the accepted bundles' `plans` (each
    /// with its writes kept as they are), in arrival order: the last writer of a path wins, a later delete drops an
    /// earlier write, and a path whose last writer found it holding its
    /// bytes already is not written.
    fn of(plans: &[(&'p Plan, &BTreeSet<String>)]) -> Merged<'p> {
        let kept = |k: usize, d: &Desired| plans[k].1.contains(d.path.as_str());
        if let [(plan, _)] = plans {
            // One bundle: its plan's writes as they are (sorted by path).
            return Merged {
                writes: plan
                    .writes
                    .iter()
                    .filter(|d| !kept(0, d))
                    .map(|d| (0, d))
                    .collect(),
                deletes: plan.delete_after.iter().map(String::as_str).collect(),
                clear_first: plan.clear_first.clone(),
            };
        }
        let mut writes = BTreeMap::new();
        let mut deletes = BTreeSet::new();
        let mut clear_first = Vec::new();
        for (k, (plan, _)) in plans.iter().enumerate() {
            clear_first.extend(plan.clear_first.iter().cloned());
            for d in plan.writes.iter() {
                writes.insert(d.path.as_str(), (k, d));
                deletes.remove(d.path.as_str());
            }
            for gone in &plan.delete_after {
                writes.remove(gone.as_str());
                deletes.insert(gone.as_str());
            }
        }
        Merged {
            writes: writes.into_values().filter(|(k, d)| !kept(*k, d)).collect(),
            deletes,
            clear_first,
        }
    }

    /// Whether the write at `path` is bundle `k`'s and was found holding
    /// its bytes already (`unchanged`: one flag per write).
    fn kept_unchanged(&self, unchanged: &[bool], k: usize, path: &str) -> bool {
        self.writes
            .binary_search_by(|(_, d)| d.path.as_str().cmp(path))
            .is_ok_and(|i| self.writes[i].0 == k && unchanged.get(i) == Some(&true))
    }
}

/// Pages and markdown the bundles of one batch may hold in memory
/// together, in bytes. Past it the batch takes the bundles prepared so far
/// (at least one) and the caller batches the others next: each bundle may
/// hold up to 4 MiB (`content::HOLD_AT_MOST`). One budget per batch, so
/// per pipeline: a burst of 1024 bundles of 280 KiB of markdown peaked at
/// 422 MiB of RSS with 256 MiB (docs/performance.md, "Bursts").
const HELD_AT_MOST: u64 = 64 << 20;

/// What the manifests of `bundles` take, to size a publication before it
/// is prepared (a hint only: a manifest that cannot be looked at counts as
/// large, a link as its own size; preparing the bundle says what is wrong
/// with either).
fn manifest_bytes(bundles: &[&Path]) -> u64 {
    (bundles.iter())
        .map(|b| {
            let manifest = b.join(crate::bundle::MANIFEST);
            std::fs::symlink_metadata(manifest).map_or(u64::MAX, |m| m.len())
        })
        .fold(0, u64::saturating_add)
}

/// Whether every root opened holds a valid catalog: a batch needs one in
/// each (a root without sends the batch one bundle at a time, the first
/// creating or converting it).
fn all_catalogs(roots: &[OpenRoot]) -> bool {
    roots
        .iter()
        .all(|r| matches!(r.records.opened, State::Catalog(_)))
}

/// Bundles prepared at once (on every core), at most.
const PREPARE_AT_ONCE: usize = 256;
/// Bundles prepared at once, at least (a few per core).
const PREPARE_AT_LEAST: usize = 8;

/// [`HELD_AT_MOST`]; debug builds (the ones the tests run) take another
/// bound from `DISTRIBUTOR_TEST_BATCH_HELD`, so that a test can make a
/// backlog of small pages go in several batches.
fn held_at_most() -> u64 {
    #[cfg(debug_assertions)]
    if let Some(bytes) = std::env::var("DISTRIBUTOR_TEST_BATCH_HELD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return bytes;
    }
    HELD_AT_MOST
}

impl<'a> Driver<'a> {
    /// Publishes `bundles` (in arrival order).
    pub(super) fn run(&self, bundles: &[&Path]) -> Ended {
        let policy = Policy::for_bundles(bundles.len());
        let now = now_millis();
        let Started { taken, mut roots } = match self.open_and_prepare(bundles, policy, now) {
            Ok(started) => started,
            Err(ended) => return ended,
        };
        let Taken { mut reports, ready } = taken;
        let first_report = || Some(ready[0].1.report.clone());
        if self.cancel.finishing() {
            return self.abort(first_report(), Failed::anywhere(Error::Stopped), &roots);
        }
        for (j, root) in roots.iter_mut().enumerate() {
            let desired: Vec<&[Desired]> =
                ready.iter().map(|(_, r)| &*r.prepared[j].desired).collect();
            if let Err(e) = root
                .target
                .look_ahead(&root.records.opened, &desired, policy.every_key)
            {
                return self.abort(first_report(), Failed::at(j, e), &roots);
            }
        }

        // Plan each bundle against what the bundles before it leave.
        let last = ready.last().map_or(0, |(i, _)| *i);
        let sources: Vec<SourceIdentity> = ready.iter().map(|(_, r)| r.source.clone()).collect();
        let mut accepted: Vec<Accepted> = Vec::new();
        for (k, (index, mut r)) in ready.into_iter().enumerate() {
            let later = &sources[k + 1..];
            let planned = roots
                .iter_mut()
                .zip(&r.prepared)
                .enumerate()
                .map(|(j, (root, prepared))| self.plan(j, root, prepared, &r, now, later))
                .collect::<Result<Vec<RootPlan>, Failed>>();
            let (plans, kept): (Vec<Plan>, Vec<BTreeSet<String>>) = match planned {
                Ok(planned) => planned.into_iter().map(|p| (p.plan, p.kept)).unzip(),
                Err(failed) => return self.abort(Some(r.report), failed, &roots),
            };
            if policy.drop_unrecorded {
                // Nothing to record in a root: its catalog (a large tree's
                // is tens of MiB) is not held while the bundle is hashed
                // and the rest runs.
                for (root, plan) in roots.iter_mut().zip(&plans) {
                    if plan.update.is_none() && !root.target.capabilities().missing {
                        root.records = Records::new(State::Absent);
                    }
                }
            }
            if let Some(refused) = refusal(&mut r, &plans, self.workers) {
                reports[index] = Some(refused);
                continue;
            }
            // A dry run, a root to create or clear, or a bundle that writes
            // nothing: every byte of the bundle is checked before anything
            // is created, deleted or written (an invalid bundle is reported
            // as such and leaves no trace).
            let creates = roots.iter().any(|root| root.target.capabilities().missing);
            let hash_first = self.options.dry_run
                || creates
                || plans.iter().all(|p| p.writes.is_empty())
                || plans.iter().any(|p| !p.clear_first.is_empty());
            if hash_first && let Err(e) = verify_rest(&r.bundle, &mut r.verified, self.workers) {
                let failed = Error::Bundle(e).fail(r.report);
                let transient = failed.transient();
                reports[index] = Some(failed);
                if transient {
                    // Tried again later: nothing newer goes before it.
                    reports.truncate(index + 1);
                    break;
                }
                continue;
            }
            if self.options.dry_run {
                reports[index] = Some(r.report);
                continue;
            }
            let mut a = Accepted {
                index,
                ready: r,
                plans,
                kept,
            };
            // A root that does not exist yet is created (and locked) only
            // now that every plan is accepted, then planned again.
            if creates {
                match self.create_missing(&mut roots, &mut a, now, later) {
                    Ok(None) => {}
                    Ok(Some(refused)) => {
                        reports[index] = Some(refused);
                        continue;
                    }
                    Err(failed) => return self.abort(Some(a.ready.report), failed, &roots),
                }
            }
            // What it leaves matters only to bundles planned after it.
            let more = index < last;
            for (j, root) in roots.iter_mut().enumerate() {
                root.apply(&mut a.plans[j], more, &a.ready.source);
            }
            accepted.push(a);
        }
        if accepted.is_empty() {
            return all_reported(reports);
        }
        self.write(roots, accepted, reports, policy, now)
    }

    /// Prepares `bundles` and opens every root, in the order that suits
    /// them: a large local catalog is parsed on a thread of its own while
    /// the bundles are prepared, before any root is locked (so that an
    /// invalid single bundle never waits for a lock), and a batch without
    /// one opens its roots first ([`Policy::needs_catalogs`]). A batch into
    /// a root without a valid catalog ends at once ([`Ended::OneFirst`]).
    /// A batch prepares its bundles
    /// while reading ahead only when every root has a large catalog file to
    /// read, so it prepares them for nothing only when one turns out not to
    /// be a catalog, once per such file
    /// ([`crate::backend::local::catalog_cache::CatalogCache::not_read_ahead`]).
    /// The outcome instead when there is nothing to publish, or it cannot
    /// start.
    fn open_and_prepare(
        &self,
        bundles: &[&Path],
        policy: Policy,
        now: OffsetDateTime,
    ) -> Result<Started<'a>, Ended> {
        let worth = self.worth_reading_ahead();
        // A root with no large file to read ahead may hold no catalog (it
        // is missing, small, legacy, or not readable by this version): the
        // batch finds out before it prepares anything.
        if policy.needs_catalogs && worth.len() < self.destinations.len() {
            let roots = self
                .open_all(now, self.read_ahead(worth, bundles))
                .map_err(|failed| failed.aborted(None))?;
            if !all_catalogs(&roots) {
                return Err(Ended::OneFirst);
            }
            let taken = self.prepare(bundles, held_at_most(), now);
            if taken.ready.is_empty() {
                return Err(all_reported(taken.reports));
            }
            return Ok(Started { taken, roots });
        }
        let mut ahead: Vec<Option<crate::backend::local::journal::ReadAhead>> = Vec::new();
        let taken = if worth.is_empty() {
            self.prepare(bundles, held_at_most(), now)
        } else {
            // Texts a catalog write will not copy are dropped once the
            // roots are open (Driver::run), for one bundle as for a batch.
            let (read, prepared) = crate::runtime::workers::beside(
                || self.read_ahead(worth, bundles),
                || self.prepare(bundles, held_at_most(), now),
            );
            ahead = read;
            prepared
        };
        let Some((_, first)) = taken.ready.first() else {
            return Err(all_reported(taken.reports));
        };
        match self.open_all(now, ahead) {
            Ok(roots) if !policy.needs_catalogs || all_catalogs(&roots) => {
                Ok(Started { taken, roots })
            }
            Ok(_) => Err(Ended::OneFirst),
            Err(failed) => Err(failed.aborted(Some(first.report.clone()))),
        }
    }

    /// The catalog file of each root worth reading before its lock
    /// ([`backend::worth_reading_ahead`]), by destination.
    fn worth_reading_ahead(&self) -> Vec<(usize, std::fs::File)> {
        (self.destinations.iter().enumerate())
            .filter_map(|(j, d)| Some((j, backend::worth_reading_ahead(d, &self.options.process)?)))
            .collect()
    }

    /// Reads the catalogs `worth` reading ahead, by destination
    /// ([`crate::backend::local::journal::read_ahead`]; with their texts when the manifests
    /// of `bundles` are small beside them). Nothing, not even a manifest
    /// looked at, when no catalog is worth it.
    fn read_ahead(
        &self,
        worth: Vec<(usize, std::fs::File)>,
        bundles: &[&Path],
    ) -> Vec<Option<crate::backend::local::journal::ReadAhead>> {
        if worth.is_empty() {
            return Vec::new();
        }
        let manifest_bytes = manifest_bytes(bundles);
        let memory = self.options.process.catalog_cache();
        let mut read = Vec::new();
        read.resize_with(self.destinations.len(), || None);
        for (j, file) in worth {
            read[j] = crate::backend::local::journal::read_ahead(file, manifest_bytes, memory);
        }
        read
    }

    /// Opens every root in path order (no deadlock between processes),
    /// with the catalogs read ahead (by destination), if any.
    fn open_all(
        &self,
        now: OffsetDateTime,
        mut ahead: Vec<Option<crate::backend::local::journal::ReadAhead>>,
    ) -> Result<Vec<OpenRoot<'a>>, Failed> {
        ahead.resize_with(self.destinations.len(), || None);
        let mut order: Vec<usize> = (0..self.destinations.len()).collect();
        order.sort_by(|a, b| self.destinations[*a].root.cmp(&self.destinations[*b].root));
        let mut opened: Vec<Option<OpenRoot>> =
            (0..self.destinations.len()).map(|_| None).collect();
        for j in order {
            let d = self.destinations[j];
            let mut target = backend::open(d, self.options, now, ahead[j].take())
                .map_err(|e| Failed::at(j, e))?;
            let state = target.take_state();
            opened[j] = Some(OpenRoot {
                destination: d,
                target,
                records: Records::new(state),
                touched: BTreeMap::new(),
                retracted: BTreeMap::new(),
            });
        }
        Ok(opened.into_iter().flatten().collect())
    }

    /// Prepares the first `bundles` whose pages and markdown held in
    /// memory stay within `bound` bytes ([`held_at_most`]; at least the
    /// first):
    /// the ready ones (with their index), and the finished report of each
    /// that is not, at its index.
    fn prepare(&self, bundles: &[&Path], bound: u64, now: OffsetDateTime) -> Taken {
        let mut reports = Vec::new();
        let mut ready = Vec::new();
        let mut held = 0;
        let mut rest = bundles;
        while !rest.is_empty() {
            // As many at once as could still fit were each to hold all it
            // may: the bundles prepared together are held together, so
            // the batch never holds more than twice its bound, and at most
            // one such slice is prepared for nothing (a burst of 1024
            // bundles of 280 KiB of markdown, prepared 256 at a time, held
            // 256 pages and rendered most of them twice).
            let fit = bound.saturating_sub(held) / super::content::HOLD_AT_MOST as u64;
            let at_once = usize::try_from(fit)
                .unwrap_or(usize::MAX)
                .clamp(PREPARE_AT_LEAST, PREPARE_AT_ONCE);
            let (slice, after) = rest.split_at(at_once.min(rest.len()));
            rest = after;
            let prepared = map_on(self.workers, slice, |dir| {
                prepare_bundle(
                    self.pipeline,
                    self.destinations,
                    dir,
                    self.options.dry_run,
                    &self.options.scratch,
                    &self.options.process,
                    now,
                )
            });
            for result in prepared {
                let index = reports.len();
                match result {
                    Ok(r) => {
                        held += held_bytes(&r);
                        if index > 0 && held > bound {
                            return Taken { reports, ready };
                        }
                        reports.push(None);
                        ready.push((index, r));
                    }
                    // A bundle that fails for a passing reason is tried
                    // again later, by itself: the batch ends before it, so
                    // that nothing newer is published first (a failed one
                    // is never published, and does not stop the batch).
                    Err(report) if report.transient() => {
                        reports.push(Some(*report));
                        return Taken { reports, ready };
                    }
                    Err(report) => reports.push(Some(*report)),
                }
            }
        }
        Taken { reports, ready }
    }

    /// Plans one bundle for one root. `later`: the
    /// sources of the bundles planned after it in this batch, whose records
    /// it may overwrite without rolling anything back (the merged change
    /// puts theirs on top; a batch published again after a crash during
    /// its commit meets them in the roots the commit reached).
    fn plan(
        &self,
        j: usize,
        root: &mut OpenRoot,
        prepared: &Prepared,
        r: &Ready,
        now: OffsetDateTime,
        later: &[SourceIdentity],
    ) -> Result<RootPlan, Failed> {
        let d = root.destination;
        let state = root
            .records
            .state_for(&prepared.desired, d, &self.pipeline.id);
        let listing = root
            .target
            .listing(&prepared.desired, &state, &root.touched, self.options.force)
            .map_err(|e| Failed::at(j, e))?;
        let refuse_older = self.pipeline.refuses_older();
        let replay = (refuse_older || self.older.is_some()).then(|| plan::Replay {
            refuse: refuse_older,
            later,
            retracted: &root.retracted,
            tombstones: self.tombstones().get(&d.id),
        });
        let decision = plan::decide(&PlanInput {
            pipeline_id: &self.pipeline.id,
            destination_id: &d.id,
            workflow: d.workflow,
            force: self.options.force,
            source: &r.source,
            desired: &prepared.desired,
            state: &state,
            listing: &listing,
            rewrite: &root.target.rewrite(&prepared.desired, &root.touched),
            now,
            delete_within: r.delete_within.as_deref(),
            replay,
        });
        if let Some(older) = self.older {
            (older.lock().unwrap_or_else(|e| e.into_inner())).extend(decision.rollbacks);
        }
        let plan = (root.target)
            .refusal(&decision.plan, &state, self.options.force)
            .unwrap_or(decision.plan);
        let kept = root.target.kept(&plan, &state, &root.touched);
        Ok(RootPlan { plan, kept })
    }

    /// What this pipeline's publications deleted, by destination, read from
    /// the agent's spool when a plan first needs it (none outside the
    /// agent).
    fn tombstones(&self) -> &crate::spool::queue::Tombstones {
        self.tombstones.get_or_init(|| {
            let folder = self
                .options
                .serving
                .as_deref()
                .and_then(|work| Path::new(work).parent());
            match folder.map(crate::spool::queue::tombstones) {
                Some(Ok(t)) => t,
                None => Default::default(),
                Some(Err(e)) => {
                    log::warn!(
                        "pipeline={}: cannot read what its publications deleted ({e}); refuse_older protects records only until it can",
                        self.pipeline.id
                    );
                    Default::default()
                }
            }
        })
    }

    /// Creates the roots that do not exist yet and plans the bundle again
    /// under their lock: the report of a refusal then, if any.
    fn create_missing(
        &self,
        roots: &mut [OpenRoot],
        a: &mut Accepted,
        now: OffsetDateTime,
        later: &[SourceIdentity],
    ) -> Result<Option<RunReport>, Failed> {
        for (j, root) in roots.iter_mut().enumerate() {
            if !root.target.capabilities().missing {
                continue;
            }
            (root.target.create(self.options, now)).map_err(|e| Failed::at(j, e))?;
            root.records.opened = root.target.take_state();
            let planned = self.plan(j, root, &a.ready.prepared[j], &a.ready, now, later)?;
            a.plans[j] = planned.plan;
            a.kept[j] = planned.kept;
        }
        Ok(refusal(&mut a.ready, &a.plans, self.workers))
    }

    /// Writes the accepted bundles' merged changes into every root.
    fn write(
        &self,
        mut roots: Vec<OpenRoot>,
        mut accepted: Vec<Accepted>,
        mut reports: Vec<Option<RunReport>>,
        policy: Policy,
        now: OffsetDateTime,
    ) -> Ended {
        // Which bundle files were hashed, apart from the bundles (which the
        // changes borrow).
        let mut verified: Vec<BTreeSet<RelPath>> = accepted
            .iter_mut()
            .map(|a| std::mem::take(&mut a.ready.verified))
            .collect();
        let merged: Vec<Merged> = (0..roots.len())
            .map(|j| {
                let plans: Vec<_> = accepted.iter().map(|a| (&a.plans[j], &a.kept[j])).collect();
                Merged::of(&plans)
            })
            .collect();
        let changes = self.changes(&mut roots, &merged, &accepted, policy.record_looks, now);
        let written = self
            .stage_all(&mut roots, &changes, &merged, &accepted, &mut verified)
            .and_then(|unchanged| {
                for (a, verified) in accepted.iter().zip(&mut verified) {
                    verify_rest(&a.ready.bundle, verified, self.workers)
                        .map_err(|e| Failed::anywhere(e.into()))?;
                }
                for (j, root) in roots.iter_mut().enumerate() {
                    if changes[j].is_some() {
                        root.target.make_durable().map_err(|e| Failed::at(j, e))?;
                    }
                }
                crate::runtime::failpoint::hit("publish.staged");
                if policy.stop_before_commit && self.cancel.finishing() {
                    return Err(Failed::anywhere(Error::Stopped));
                }
                let outcomes = outcomes(&accepted, &merged, &unchanged);
                if let Some(before_commit) = self.before_commit {
                    // The reports as the commit will leave them, so that
                    // the caller can remember it across a crash.
                    let reports: Vec<RunReport> = (accepted.iter().zip(&outcomes))
                        .map(|(a, outcome)| outcome.apply(a.ready.report.clone()))
                        .collect();
                    let told: Vec<(usize, &RunReport)> =
                        accepted.iter().map(|a| a.index).zip(&reports).collect();
                    before_commit(&told)
                        .map_err(|source| Failed::anywhere(Error::Record { source }))?;
                }
                let totals = self.commit_all(&mut roots, changes, accepted.len(), policy)?;
                Ok((outcomes, totals))
            });
        let (outcomes, totals) = match written {
            Ok(written) => written,
            Err(failed) => {
                return self.abort(Some(accepted[0].ready.report.clone()), failed, &roots);
            }
        };
        drop(merged);
        for ((k, a), outcome) in accepted.into_iter().enumerate().zip(outcomes) {
            let mut report = outcome.apply(a.ready.report);
            // What the roots did as a whole is told once, by the first bundle.
            if k == 0 {
                report.copied_across = totals.copied_across;
                report.synced_file_by_file = totals.file_by_file;
                for (r, n) in report.destinations.iter_mut().zip(&totals.rebases) {
                    r.catalog_rebases = *n;
                }
            }
            reports[a.index] = Some(report);
        }
        all_reported(reports)
    }

    /// Each root's change (`None`: nothing to record there), built from
    /// its records and its merged writes and deletes
    /// ([`Policy::record_looks`]: whether it records the looks of its writes).
    fn changes<'c>(
        &self,
        roots: &mut [OpenRoot],
        merged: &'c [Merged],
        accepted: &'c [Accepted],
        record_looks: bool,
        now: OffsetDateTime,
    ) -> Vec<Option<Change<'c>>> {
        let mut changes = Vec::new();
        for ((root, m), j) in roots.iter_mut().zip(merged).zip(0..) {
            let records = std::mem::replace(&mut root.records, Records::new(State::Absent));
            if records.updates.is_empty() {
                changes.push(None);
                continue;
            }
            let was_absent = records.was_absent();
            let rebase_for = root
                .target
                .capabilities()
                .may_rebase
                .then_some((self.pipeline.id.as_str(), root.destination));
            let finished = records.finish(
                m.writes.iter().map(|(_, d)| d.path.as_str().to_owned()),
                &m.deletes,
                rebase_for,
                now,
            );
            changes.push(Some(Change {
                writes: m
                    .writes
                    .iter()
                    .map(|(k, d)| Write {
                        d,
                        in_memory: accepted[*k].ready.prepared[j]
                            .in_memory
                            .get(&d.path)
                            .map(|c| &**c),
                        bundle: &accepted[*k].ready.bundle,
                    })
                    .collect(),
                clear_first: m.clear_first.clone(),
                deletes: m.deletes.iter().map(|p| (*p).to_owned()).collect(),
                catalog: finished.catalog,
                replaced: finished.replaced,
                removed: finished.removed,
                state_was_absent: was_absent,
                record_looks,
                rebase: finished.rebase,
            }));
        }
        changes
    }

    /// Stages every root's change: per root, whether each merged write was
    /// found to hold its bytes already. Bundle files
    /// whose bytes a root checks while writing them are added to
    /// `verified`.
    fn stage_all(
        &self,
        roots: &mut [OpenRoot],
        changes: &[Option<Change>],
        merged: &[Merged],
        accepted: &[Accepted],
        verified: &mut [BTreeSet<RelPath>],
    ) -> Result<Vec<Vec<bool>>, Failed> {
        let mut unchanged = vec![Vec::new(); roots.len()];
        for (j, (root, change)) in roots.iter_mut().zip(changes).enumerate() {
            let Some(change) = change else { continue };
            let staged = root
                .target
                .stage(change, self.workers, self.cancel)
                .map_err(|e| Failed::at(j, e))?;
            for ((k, d), s) in merged[j].writes.iter().zip(&staged) {
                let from_bundle = !accepted[*k].ready.prepared[j]
                    .in_memory
                    .contains_key(&d.path);
                if *s == StagedAs::Written && from_bundle {
                    verified[*k].insert(d.bundle_path.clone());
                }
            }
            unchanged[j] = staged.iter().map(|s| *s == StagedAs::Unchanged).collect();
        }
        Ok(unchanged)
    }

    /// Commits every root's change, roots whose commit reads the bundle
    /// first (a failure there can still roll the others back): the outputs
    /// copied across file systems, the roots made durable file by file, and
    /// per root how often its catalog's compare-and-swap was rebased. A
    /// failure names the batch of `bundles` ([`Policy::name_the_batch`]).
    fn commit_all(
        &self,
        roots: &mut [OpenRoot],
        mut changes: Vec<Option<Change>>,
        bundles: usize,
        policy: Policy,
    ) -> Result<CommitTotals, Failed> {
        let mut order: Vec<usize> = (0..roots.len()).filter(|j| changes[*j].is_some()).collect();
        order.sort_by_key(|j| !roots[*j].target.capabilities().reads_bundle_at_commit);
        let mut copied_across = 0;
        let mut file_by_file = 0;
        let mut rebases = vec![0; roots.len()];
        for j in order {
            let change = changes[j].take().expect("only roots with a change");
            match roots[j].target.commit(change) {
                Ok(c) => {
                    crate::runtime::failpoint::hit("publish.committed");
                    copied_across += c.copied_across;
                    file_by_file += u64::from(c.file_by_file);
                    rebases[j] = c.rebases;
                }
                // Roots committed before keep their change: publishing
                // those bundles again is a skip there.
                Err(e) if !policy.name_the_batch => return Err(Failed::at(j, e)),
                Err(e) => {
                    let root = roots[j].target.label();
                    log::error!(
                        "{root}: batch publication failed while committing ({e}); what it wrote there was undone"
                    );
                    let source = Box::new(e);
                    let e = Error::Commit {
                        root,
                        bundles,
                        source,
                    };
                    return Err(Failed::at(j, e));
                }
            }
        }
        Ok(CommitTotals {
            copied_across,
            file_by_file,
            rebases,
        })
    }

    /// Stops the run as `failed` says: every root is rolled back, and the
    /// run ends with the error, where it is, and `report`, the report of
    /// the bundle in hand.
    fn abort(&self, report: Option<RunReport>, failed: Failed, roots: &[OpenRoot]) -> Ended {
        let Failed { root: j, mut error } = failed;
        for (i, root) in roots.iter().enumerate() {
            if let Err(settle) = root.target.roll_back() {
                log::error!(
                    "{}: could not settle after a failed publication ({settle}); the journal stays and the next process to lock the root finishes it",
                    root.target.label()
                );
                if j == Some(i) {
                    error = error.unsettled(settle);
                }
            }
        }
        Ended::Aborted(Box::new(Aborted {
            error,
            root: j,
            report,
        }))
    }
}

impl OpenRoot<'_> {
    /// Records what an accepted plan leaves in the catalog and, when
    /// `more` bundles are planned after it, in storage.
    fn apply(&mut self, plan: &mut Plan, more: bool, source: &SourceIdentity) {
        if let Some(update) = plan.update.take() {
            self.records.record(update);
        }
        if !more {
            return;
        }
        for d in plan.writes.iter() {
            self.retracted.remove(d.path.as_str());
        }
        for gone in &plan.delete_after {
            self.retracted.insert(gone.clone(), source.clone());
        }
        for d in plan.writes.iter() {
            for a in d.path.ancestors() {
                self.touched.insert(a.to_owned(), Entry::Dir);
            }
            self.touched
                .insert(d.path.as_str().to_owned(), Entry::File { size: d.size });
        }
        for gone in &plan.delete_after {
            self.touched.insert(gone.clone(), Entry::Missing);
        }
    }
}

/// Bytes of the outputs a prepared bundle holds (each held content counted
/// once, however many destinations share it). Pages it spilled to its
/// scratch file count too: an overestimate, on the safe side.
fn held_bytes(ready: &Ready) -> u64 {
    let mut seen = std::collections::HashSet::new();
    ready
        .prepared
        .iter()
        .flat_map(|p| {
            p.desired
                .iter()
                .filter_map(|d| p.in_memory.get(&d.path).map(|c| (Arc::as_ptr(c), d.size)))
        })
        .filter(|(content, _)| seen.insert(*content))
        .map(|(_, size)| size)
        .sum()
}

/// What a committed bundle's report adds: per root, the writes that kept
/// the bytes they held; the bytes it published.
struct Published {
    kept: Vec<Vec<String>>,
    sent: u64,
}

impl Published {
    fn apply(&self, mut report: RunReport) -> RunReport {
        for (r, same) in report.destinations.iter_mut().zip(&self.kept) {
            r.unchanged.extend(same.iter().cloned());
        }
        report.bytes_published += self.sent;
        report
    }
}

/// Per accepted bundle, what its report adds once `merged` is committed
/// (`unchanged`: per root, one flag per merged write).
fn outcomes(accepted: &[Accepted], merged: &[Merged], unchanged: &[Vec<bool>]) -> Vec<Published> {
    (accepted.iter().enumerate())
        .map(|(k, a)| {
            let mut sent = 0;
            let kept = (a.plans.iter().zip(&a.kept).zip(merged).zip(unchanged))
                .map(|(((plan, kept), m), unchanged)| {
                    let mut same = Vec::new();
                    for d in plan.writes.iter() {
                        let path = d.path.as_str();
                        if kept.contains(path) || m.kept_unchanged(unchanged, k, path) {
                            same.push(path.to_owned());
                        } else {
                            sent += d.size;
                        }
                    }
                    same
                })
                .collect();
            Published { kept, sent }
        })
        .collect()
}

/// The finished report of a bundle when one of its `plans` is a refusal
/// (nothing of it may be written anywhere): an invalid bundle is reported
/// as such, not as a refusal. `None` when every plan is accepted.
fn refusal(r: &mut Ready, plans: &[Plan], workers: &dyn Workers) -> Option<RunReport> {
    let refused = record_plans(&mut r.report, plans.iter().enumerate())?;
    Some(match verify_rest(&r.bundle, &mut r.verified, workers) {
        Ok(()) => refused,
        Err(e) => Error::Bundle(e).fail(r.report.clone()),
    })
}

/// The outcome once every bundle taken should have its report.
fn all_reported(reports: Vec<Option<RunReport>>) -> Ended {
    Ended::Reports(
        reports
            .into_iter()
            .map(|r| r.expect("every bundle taken is reported"))
            .collect(),
    )
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
