//! Publishing a backlog as one transaction per destination root.
//!
//! When the agent finds several bundles waiting, it publishes them together:
//! every bundle is verified in full, the roots are locked once, each bundle
//! is planned in arrival order against the catalog and storage as the
//! bundles before it leave them, and the accepted bundles' changes are
//! merged into one change per root, which the engine a single publication
//! uses writes (`stage`: one journal, one wait for every staged file, one
//! catalog write, a second wait). Each bundle still gets its own
//! report with its own actions; a refused or invalid bundle is reported
//! alone and does not stop the others.
//!
//! A missing root or state that is not a valid catalog makes the first
//! bundle go alone (it sets the root up). An error while writing (a lock
//! timeout, a full disk, a bundle file changed after it was verified)
//! makes the batch step aside after settling the roots, with the cause,
//! and the caller publishes the bundles one by one.

use super::prepare::{Ready, prepare_bundle};
use super::stage::{self, Change, Staged, Write, probe};
use super::{Failure, Options, record_plans, verify_rest};
use crate::catalog::{Catalog, OutputRecord, Overlay, State};
use crate::clock::now_millis;
use crate::config::{Destination, Pipeline};
use crate::journal;
use crate::lock::{self, RootLock};
use crate::paths::RelPath;
use crate::plan::{self, Desired, Listing, Plan, PlanInput};
use crate::remembered;
use crate::report::{RunReport, Stage};
use crate::storage::{Entry, Root};
use crate::workers::{Workers, map_on};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

/// A planned bundle: its report so far and its plan per destination.
struct Accepted<'a> {
    index: usize,
    ready: Ready<'a>,
    plans: Vec<Plan>,
}

/// One destination root while the batch is planned.
struct RootState {
    root: Root,
    _lock: RootLock,
    /// The catalog before the batch (the journal's "old" records) and the
    /// changes of the bundles planned so far.
    records: Overlay,
    /// Storage entries as the bundles planned so far leave them; paths not
    /// here are read from disk.
    overlay: BTreeMap<String, Entry>,
}

impl RootState {
    fn listing(&self, desired: &[Desired]) -> io::Result<Listing> {
        // A batch plans over a catalog without force, which never looks at
        // the top level (plan::needs_top_level).
        Ok(Listing {
            root_exists: true,
            top_level: Vec::new(),
            entries: probe(&self.root, desired, &self.overlay)?,
            all: Vec::new(),
        })
    }

    /// Records what an accepted plan will leave on disk and in the catalog.
    fn apply(&mut self, plan: &Plan) {
        for d in plan.writes.iter() {
            for a in d.path.ancestors() {
                self.overlay.insert(a.to_owned(), Entry::Dir);
            }
            self.overlay
                .insert(d.path.as_str().to_owned(), Entry::File { size: d.size });
        }
        for gone in &plan.delete_after {
            self.overlay.insert(gone.clone(), Entry::Missing);
        }
        if let Some(update) = &plan.update {
            // Batches plan over a catalog, so updates always keep it.
            debug_assert!(update.keep_existing);
            self.records.record(&update.upserts, &update.removes);
        }
    }
}

/// How a batch ended.
pub enum Batch {
    /// One report per bundle, in order; an s3 batch may have taken only
    /// the first bundles (fewer reports: the others were not attempted
    /// and are batched next).
    Done(Vec<RunReport>),
    /// Nothing was published: publish the first bundle alone (it sets up a
    /// root or converts its state), then batch the rest.
    OneFirst,
    /// Nothing was published: publish every bundle alone. Says why, for
    /// the log line and the fallback counter; ordinary input (nested
    /// folders, new prefixes, overlapping paths) never ends here.
    OneByOne { cause: String },
    /// Abandoned because `keep_going` said stop; nothing was published.
    Stopped,
}

/// Publishes `bundles` (in arrival order) to every destination of the
/// pipeline as one transaction per root.
///
/// `keep_going` is asked before planning and before each staged file; when
/// it answers false (the agent is stopping), the batch is abandoned before
/// anything is renamed into a root and [`Batch::Stopped`] is returned.
pub fn publish_batch(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundles: &[&Path],
    options: &Options,
    workers: &dyn Workers,
    keep_going: &(dyn Fn() -> bool + Sync),
) -> Batch {
    // A pipeline of s3 destinations only has its own batch (one intent and
    // one compare-and-swap per destination); one that mixes both kinds
    // publishes bundle by bundle (the agent never batches it).
    let is_s3 = |d: &Destination| matches!(d.backend, crate::config::Backend::S3(_));
    if !destinations.is_empty() && destinations.iter().all(|d| is_s3(d)) {
        return super::remote::publish_batch(
            pipeline,
            destinations,
            bundles,
            options,
            workers,
            keep_going,
        );
    }
    if let Some(d) = destinations.iter().find(|d| is_s3(d)) {
        return Batch::OneByOne {
            cause: format!(
                "destination {} is an s3 destination and the pipeline also has local roots; such a pipeline commits bundle by bundle",
                d.id
            ),
        };
    }
    // Lock every root once, in path order; step aside unless each holds a
    // valid catalog.
    let now = now_millis();
    let mut order: Vec<usize> = (0..destinations.len()).collect();
    order.sort_by(|a, b| destinations[*a].root.cmp(&destinations[*b].root));
    let mut roots: Vec<Option<RootState>> = (0..destinations.len()).map(|_| None).collect();
    for j in order {
        let d = destinations[j];
        // A missing root or state that is not a valid catalog: the first
        // bundle alone sets the root up, then batching can resume.
        let Ok(Some(root)) = Root::open(&d.root) else {
            return Batch::OneFirst;
        };
        let lock = match lock::acquire(&root, options.lock_timeout) {
            Ok(lock) => lock,
            Err(e) => {
                return Batch::OneByOne {
                    cause: e.to_string(),
                };
            }
        };
        let Ok(State::Catalog(catalog)) = journal::recover(&root, true, now) else {
            return Batch::OneFirst;
        };
        roots[j] = Some(RootState {
            root,
            _lock: lock,
            records: Overlay::new(catalog),
            overlay: BTreeMap::new(),
        });
    }
    let Some(mut roots) = roots.into_iter().collect::<Option<Vec<RootState>>>() else {
        return Batch::OneByOne {
            cause: "a destination root was not locked".to_owned(),
        };
    };

    let (mut reports, ready) = prepare_all(pipeline, destinations, bundles, options, workers);

    if !keep_going() {
        return Batch::Stopped;
    }
    // Plan each bundle against the state the previous ones leave.
    let mut accepted: Vec<Accepted> = Vec::new();
    for (index, mut r) in ready {
        let mut plans = Vec::new();
        for (j, prepared) in r.prepared.iter().enumerate() {
            // Only the records this plan can consult, not the whole catalog.
            let d = prepared.destination;
            let view = plan::catalog_view(
                &roots[j].records,
                &prepared.desired,
                d.workflow,
                &pipeline.id,
                &d.id,
            );
            let state = State::Catalog(view);
            let listing = match roots[j].listing(&prepared.desired) {
                Ok(listing) => listing,
                Err(e) => {
                    return Batch::OneByOne {
                        cause: format!(
                            "cannot read destination root {}: {e}",
                            roots[j].root.path().display()
                        ),
                    };
                }
            };
            plans.push(plan::plan(&PlanInput {
                pipeline_id: &pipeline.id,
                destination_id: &d.id,
                workflow: d.workflow,
                force: false,
                source: &r.source,
                desired: &prepared.desired,
                state: &state,
                listing: &listing,
                now,
            }));
        }
        if let Some(refused) = refusal(&mut r, &plans) {
            reports[index] = Some(refused);
            continue;
        }
        for (j, plan) in plans.iter().enumerate() {
            roots[j].apply(plan);
        }
        accepted.push(Accepted {
            index,
            ready: r,
            plans,
        });
    }

    // Write each root once, merged writes and deletes, through the engine
    // a single publication uses. Copies are hashed as they stream (a
    // mismatch makes the batch step aside, and the bundles, published one
    // by one, find the culprit).
    let mut merged: Vec<Merged> = Vec::new();
    for (j, state) in roots.iter_mut().enumerate() {
        let mut writes: BTreeMap<String, (usize, Desired)> = BTreeMap::new();
        let mut deletes: BTreeSet<String> = BTreeSet::new();
        for (k, a) in accepted.iter().enumerate() {
            for d in a.plans[j].writes.iter() {
                writes.insert(d.path.as_str().to_owned(), (k, d.clone()));
                deletes.remove(d.path.as_str());
            }
            for gone in &a.plans[j].delete_after {
                writes.remove(gone);
                deletes.insert(gone.clone());
            }
        }
        if writes.is_empty() && deletes.is_empty() {
            continue;
        }
        // Sorted by path, as the writes are.
        let replaced = writes
            .keys()
            .filter_map(|path| state.records.base().get(path).cloned())
            .collect();
        let records = std::mem::replace(&mut state.records, Overlay::new(Catalog::new(now)));
        merged.push(Merged {
            j,
            writes,
            deletes,
            catalog: records.into_catalog(now),
            replaced,
        });
    }
    // Which bundle files were hashed, apart from the bundles (which the
    // changes below borrow).
    let mut verified: Vec<BTreeSet<RelPath>> = accepted
        .iter_mut()
        .map(|a| std::mem::take(&mut a.ready.verified))
        .collect();
    let changes: Vec<Change> = merged
        .iter()
        .map(|m| Change {
            root: &roots[m.j].root,
            writes: m
                .writes
                .values()
                .map(|(k, d)| Write {
                    d,
                    in_memory: accepted[*k].ready.prepared[m.j]
                        .in_memory
                        .get(&d.path)
                        .map(|c| &**c),
                    bundle: &accepted[*k].ready.bundle,
                })
                .collect(),
            clear_first: &[],
            deletes: m.deletes.iter().map(String::as_str).collect(),
            catalog: &m.catalog,
            replaced: &m.replaced,
            state_was_absent: false,
            // `.distributor-seen` is for large trees, published alone.
            record_looks: false,
        })
        .collect();
    let mut staged_roots = Vec::new();
    // Per root: the paths left unchanged, and the bundle whose write it was.
    let mut unchanged: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new(); roots.len()];
    for (m, change) in merged.iter().zip(&changes) {
        let root = &roots[m.j].root;
        match stage::stage(change, workers, keep_going) {
            Ok(staged) => {
                let writes = m.writes.values().zip(&change.writes);
                for (((k, d), w), s) in writes.zip(&staged.outputs) {
                    match s {
                        Staged::Temp(_) if w.in_memory.is_none() => {
                            verified[*k].insert(d.bundle_path.clone());
                        }
                        Staged::Temp(_) => {}
                        Staged::Unchanged(_) => {
                            unchanged[m.j].insert(d.path.as_str().to_owned(), *k);
                        }
                    }
                }
                staged_roots.push(staged);
            }
            Err(Failure::Io(e)) if e.kind() == io::ErrorKind::Interrupted => {
                roll_back_all(&roots);
                return Batch::Stopped;
            }
            Err(f) => {
                roll_back_all(&roots);
                return Batch::OneByOne {
                    cause: format!(
                        "staging into {} failed: {}",
                        root.path().display(),
                        failure_text(f)
                    ),
                };
            }
        }
    }
    for (a, verified) in accepted.iter().zip(&mut verified) {
        if let Err(e) = verify_rest(&a.ready.bundle, verified) {
            roll_back_all(&roots);
            return Batch::OneByOne {
                cause: format!("a bundle does not match its manifest: {e}"),
            };
        }
    }
    for (change, staged) in changes.iter().zip(&mut staged_roots) {
        if let Err(e) = stage::make_durable(change.root, staged) {
            roll_back_all(&roots);
            return Batch::OneByOne {
                cause: format!("syncing {} failed: {e}", change.root.path().display()),
            };
        }
    }
    let mut copied_across = 0;
    let mut file_by_file = 0;
    let mut committed = Vec::new();
    for (change, staged) in changes.iter().zip(staged_roots) {
        file_by_file += u64::from(staged.file_by_file());
        match stage::commit(change, staged) {
            Ok(c) => {
                copied_across += c.copied_across;
                committed.push((c.catalog, c.texts));
            }
            Err(e) => {
                log::error!(
                    "{}: batch publication failed while committing ({e}); settling the root from its journal",
                    change.root.path().display()
                );
                roll_back_all(&roots);
                // Bundles whose roots were committed before are published;
                // publishing them again one by one is a skip.
                return Batch::OneByOne {
                    cause: format!(
                        "committing into {} failed: {e}",
                        change.root.path().display()
                    ),
                };
            }
        }
    }
    drop(changes);
    for (m, (look, texts)) in merged.into_iter().zip(committed) {
        remembered::remember(&roots[m.j].root, look, m.catalog, texts);
    }

    for (k, a) in accepted.into_iter().enumerate() {
        let mut report = finish_report(a.ready.report, &a.plans, |j, path| {
            unchanged[j].get(path) == Some(&k)
        });
        // What the roots did as a whole is told once, by the first bundle.
        if k == 0 {
            report.copied_across = copied_across;
            report.synced_file_by_file = file_by_file;
        }
        reports[a.index] = Some(report);
    }
    all_reported(reports)
}

/// One root's writes and deletes, merged over the batch's bundles, and
/// the catalog and replaced records the engine needs for them.
struct Merged {
    /// The root's index among the destinations.
    j: usize,
    /// By output path: the bundle (index among the accepted ones) and the
    /// output it writes there.
    writes: BTreeMap<String, (usize, Desired)>,
    deletes: BTreeSet<String>,
    catalog: Catalog,
    replaced: Vec<OutputRecord>,
}

/// A staging failure as the cause of stepping aside.
fn failure_text(f: Failure) -> String {
    match f {
        Failure::Io(e) => e.to_string(),
        Failure::Bundle(e) => format!("a bundle file changed after it was verified: {e}"),
        Failure::Stopped(e) => e.message,
    }
}

/// Prepares `bundles` on `workers`: the bundles ready to plan (with their
/// index in `bundles`), and the finished report of each that is not, at its
/// index (`None` for the ready ones, to be filled as they are committed).
pub(super) fn prepare_all<'a>(
    pipeline: &Pipeline,
    destinations: &[&'a Destination],
    bundles: &[&Path],
    options: &Options,
    workers: &dyn Workers,
) -> (Vec<Option<RunReport>>, Vec<(usize, Ready<'a>)>) {
    let mut reports: Vec<Option<RunReport>> = vec![None; bundles.len()];
    let mut ready = Vec::new();
    let prepared = map_on(workers, bundles, |dir| {
        prepare_bundle(pipeline, destinations, dir, false, &options.scratch)
    });
    for (index, result) in prepared.into_iter().enumerate() {
        match result {
            Ok(r) => ready.push((index, r)),
            Err(report) => reports[index] = Some(*report),
        }
    }
    (reports, ready)
}

/// A committed bundle's report: each planned write of destination `j`
/// listed as unchanged when `unchanged(j, path)`, else counted as bytes
/// published.
pub(super) fn finish_report(
    mut report: RunReport,
    plans: &[Plan],
    unchanged: impl Fn(usize, &str) -> bool,
) -> RunReport {
    for (j, plan) in plans.iter().enumerate() {
        let (kept, sent) = split_writes(plan, |path| unchanged(j, path));
        report.destinations[j].unchanged.extend(kept);
        report.bytes_published += sent;
    }
    report
}

/// A committed plan's writes as its report gives them: the paths kept as
/// they were (`unchanged`), and the bytes of the others.
pub(super) fn split_writes(plan: &Plan, unchanged: impl Fn(&str) -> bool) -> (Vec<String>, u64) {
    let mut kept = Vec::new();
    let mut sent = 0;
    for d in plan.writes.iter() {
        if unchanged(d.path.as_str()) {
            kept.push(d.path.as_str().to_owned());
        } else {
            sent += d.size;
        }
    }
    (kept, sent)
}

/// The batch's outcome once every bundle should have its report.
pub(super) fn all_reported(reports: Vec<Option<RunReport>>) -> Batch {
    match reports.into_iter().collect() {
        Some(reports) => Batch::Done(reports),
        None => Batch::OneByOne {
            cause: "a bundle of the batch got no report".to_owned(),
        },
    }
}

fn roll_back_all(roots: &[RootState]) {
    for state in roots {
        if let Err(e) = journal::recover(&state.root, true, now_millis()) {
            log::error!(
                "{}: could not settle after a failed batch ({e}); the journal stays and the next run will finish it",
                state.root.path().display()
            );
        }
    }
}

/// The finished report of a batched bundle when one of its `plans` is a
/// refusal (nothing of it may be written anywhere): an invalid bundle is
/// reported as such, not as a refusal. `None` when every plan is accepted.
pub(super) fn refusal(r: &mut Ready<'_>, plans: &[Plan]) -> Option<RunReport> {
    let refused = record_plans(&mut r.report, plans.iter().enumerate())?;
    Some(match verify_rest(&r.bundle, &mut r.verified) {
        Ok(()) => refused,
        Err(e) => {
            let transient = e.is_transient();
            r.report
                .clone()
                .fail(Stage::Verify, e.to_string(), transient)
        }
    })
}
