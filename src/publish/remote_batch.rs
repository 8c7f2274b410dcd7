//! Publishing a backlog into s3 destinations as one commit per destination
//! (docs/object-storage.md, "Batches").
//!
//! The bundles are planned in arrival order against the catalog plus the
//! changes of the bundles before them (the view the local batch plans on),
//! with one HEAD of every planned key the catalog records, for the whole
//! batch; a key it does not record is planned as free. Then, per
//! destination, one intent lists every write and delete of the batch, the
//! outputs of all bundles go up (each PUT conditional, as for one bundle),
//! and one compare-and-swap of the catalog commits them all. A lost swap is
//! rebased when the winner changed none of the records the batch changes
//! or relies on; else the batch is undone.
//!
//! A batch takes the bundles it is given, up to a bound on the pages and
//! markdown they hold in memory together; the agent batches the rest next.
//!
//! A bundle refused at planning (for example a replacement that would
//! delete an unrecorded object) is reported alone, as when published
//! alone, and does not stop the others. Anything that goes wrong once
//! writing started (an object at a key the catalog does not record, a
//! changed recorded object, a bundle file that no longer matches its
//! manifest, a lost swap that cannot be rebased, a failing server) undoes
//! the batch's writes through its intent and makes the batch step aside:
//! the caller publishes the bundles one by one, and the culprit gets the
//! report it gets when published alone (an unmanaged object: its HEAD there
//! makes it `fail_unmanaged`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use super::super::batch::{Batch, all_reported, finish_report, prepare_all, refusal};
use super::super::prepare::Ready;
use super::super::{Options, verify_rest};
use super::{already_there, is_claimed, log_rebases, s3_error, source, unrecorded_deletes};
use crate::catalog::{Catalog, OutputRecord, Overlay, State};
use crate::clock::now_millis;
use crate::config::{Backend, Destination, Pipeline, Workflow};
use crate::plan::{self, CatalogUpdate, Entry, Listing, Plan, PlanInput};
use crate::s3::protocol::{self, Base, Delete, Settings, Write};
use crate::s3::{Head, S3Root};
use crate::workers::Workers;

/// One s3 destination while the batch is planned.
struct Dest {
    root: Arc<S3Root>,
    settings: Settings,
    /// The catalog's version the batch commits on.
    etag: Option<crate::s3::ETag>,
    /// The catalog before the batch and the changes of the bundles planned
    /// so far.
    records: Overlay,
    /// Keys the bundles planned so far write (their size) or delete
    /// (`None`): what the bucket will hold there is no longer what the
    /// HEADs showed.
    touched: BTreeMap<String, Option<u64>>,
    /// What a HEAD showed at every key some bundle of the batch plans.
    heads: BTreeMap<String, Head>,
}

/// A planned bundle: its report so far, and per destination its plan, its
/// catalog change and its outputs kept as they are.
struct Accepted<'a> {
    index: usize,
    ready: Ready<'a>,
    plans: Vec<Plan>,
    updates: Vec<Option<CatalogUpdate>>,
    unchanged: Vec<BTreeSet<String>>,
}

/// [`super::super::publish_batch`] for a pipeline whose destinations are
/// all s3 destinations.
pub(in crate::publish) fn publish_batch(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundles: &[&Path],
    options: &Options,
    workers: &dyn Workers,
    keep_going: &(dyn Fn() -> bool + Sync),
) -> Batch {
    let now = now_millis();
    let started = std::time::Instant::now();
    let mut phases: Vec<(&str, u128)> = Vec::new();
    let mut phase = |name: &'static str| phases.push((name, started.elapsed().as_millis()));
    // Check each server, recover stale intents, read each catalog once.
    let mut dests = Vec::new();
    for d in destinations {
        let Backend::S3(location) = &d.backend else {
            return Batch::OneByOne {
                cause: format!(
                    "destination {} is not an s3 destination; a batch publishes to s3 destinations only or to local roots only",
                    d.id
                ),
            };
        };
        let opened = (|| {
            let settings = Settings::for_process()?;
            let root = S3Root::shared(location)?;
            root.check_conformance()?;
            protocol::recover_stale(&root, settings)?;
            let base = root.read_state()?;
            Ok::<_, crate::s3::Error>((settings, root, base))
        })();
        let (settings, root, base) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                return Batch::OneByOne {
                    cause: format!("destination {}: {}", d.id, s3_error(e).message),
                };
            }
        };
        // No catalog yet (or not a valid one): the first bundle alone sets
        // it up, then batching resumes.
        let State::Catalog(catalog) = base.state else {
            return Batch::OneFirst;
        };
        dests.push(Dest {
            root,
            settings,
            etag: base.etag,
            records: Overlay::new(catalog),
            touched: BTreeMap::new(),
            heads: BTreeMap::new(),
        });
    }

    let (mut reports, ready) = prepare_within(
        pipeline,
        destinations,
        bundles,
        options,
        workers,
        held_at_most(),
    );
    if !keep_going() {
        return Batch::Stopped;
    }
    phase("prepared");

    // One HEAD of every key the batch plans that the catalog records, many
    // at once. A key it does not record is planned as free: its create is
    // conditional, so an object there (unmanaged, or another publication's)
    // refuses it, the batch steps aside, and the bundle published alone
    // gets the report it gets today (see the module doc).
    for (j, dest) in dests.iter_mut().enumerate() {
        let keys: BTreeSet<&str> = ready
            .iter()
            .flat_map(|(_, r): &(usize, Ready)| r.prepared[j].desired.iter())
            .map(|d| d.path.as_str())
            .filter(|k| dest.records.base().get(k).is_some())
            .collect();
        let keys: Vec<&str> = keys.into_iter().collect();
        match dest.root.head_many(&keys) {
            Ok(heads) => {
                dest.heads = keys
                    .iter()
                    .zip(heads)
                    .filter_map(|(k, h)| Some(((*k).to_owned(), h?)))
                    .collect();
            }
            Err(e) => {
                return Batch::OneByOne {
                    cause: format!(
                        "destination {}: {}",
                        destinations[j].id,
                        s3_error(e).message
                    ),
                };
            }
        }
    }

    phase("heads");
    // Plan each bundle against what the bundles before it leave.
    let mut accepted: Vec<Accepted> = Vec::new();
    for (index, mut r) in ready {
        let mut plans = Vec::new();
        let mut updates = Vec::new();
        let mut unchanged = Vec::new();
        for (j, prepared) in r.prepared.iter().enumerate() {
            let d = prepared.destination;
            let (plan, update, kept) = plan_one(
                &dests[j],
                &prepared.desired,
                d,
                &pipeline.id,
                &r.source,
                now,
            );
            plans.push(plan);
            updates.push(update);
            unchanged.push(kept);
        }
        if let Some(refused) = refusal(&mut r, &plans) {
            reports[index] = Some(refused);
            continue;
        }
        for (j, dest) in dests.iter_mut().enumerate() {
            dest.apply(&plans[j], updates[j].as_ref());
        }
        accepted.push(Accepted {
            index,
            ready: r,
            plans,
            updates,
            unchanged,
        });
    }
    if !keep_going() {
        return Batch::Stopped;
    }

    phase("planned");
    // Per destination: the batch's writes (the last bundle writing a key
    // wins) and deletes.
    let merged: Vec<Merged> = (0..dests.len())
        .map(|j| {
            let plans: Vec<(&Plan, &BTreeSet<String>)> = accepted
                .iter()
                .map(|a| (&a.plans[j], &a.unchanged[j]))
                .collect();
            Merged::of(j, &plans)
        })
        .collect();
    // What goes up from a bundle is hashed on its way; the rest of each
    // bundle is hashed now, before anything is written.
    for m in &merged {
        for (k, d) in m.writes.values() {
            let a = &mut accepted[*k];
            let j = m.destination;
            if !a.ready.prepared[j].in_memory.contains_key(&d.path) {
                a.ready.verified.insert(d.bundle_path.clone());
            }
        }
    }
    for a in &mut accepted {
        if let Err(e) = verify_rest(&a.ready.bundle, &mut a.ready.verified) {
            return Batch::OneByOne {
                cause: format!("a bundle does not match its manifest: {e}"),
            };
        }
    }

    phase("verified");
    for (m, dest) in merged.iter().zip(dests) {
        let j = m.destination;
        let d = destinations[j];
        let updates: Vec<&CatalogUpdate> = accepted
            .iter()
            .filter_map(|a| a.updates[j].as_ref())
            .collect();
        if updates.is_empty() {
            continue;
        }
        let Dest {
            root,
            settings,
            etag,
            records,
            ..
        } = dest;
        let base_catalog = records.base();
        let writes: Vec<Write> = m
            .writes
            .iter()
            .map(|(path, (k, desired))| {
                let a = &accepted[*k];
                Write {
                    path: path.clone(),
                    sha256: desired.sha256.to_string(),
                    source: source(&a.ready.prepared[j], &a.ready.bundle, desired),
                    replaces: base_catalog.get(path).map(|r| r.sha256.to_string()),
                }
            })
            .collect();
        let deletes: Vec<Delete> = m
            .deletes
            .iter()
            .filter_map(|path| {
                base_catalog.get(path).map(|r| Delete {
                    path: path.clone(),
                    sha256: r.sha256.to_string(),
                })
            })
            .collect();
        let seen = relied_on(base_catalog, &updates, &pipeline.id, d);
        let base = Base {
            state: State::Catalog(seen.clone()),
            etag,
        };
        let next = records.into_catalog(now);
        let mut rebase =
            |latest: &State| rebase_batch(&updates, &seen, latest, &pipeline.id, d, now);
        let committed = protocol::commit_for(
            &root,
            settings,
            options.serving.as_deref(),
            base,
            next,
            writes,
            deletes,
            &mut rebase,
        );
        match committed {
            Ok(c) => {
                log_rebases(&root, c.rebases, "batch");
            }
            Err(e) => {
                // The commit undid what it wrote (or left its intent for
                // recovery); nothing of this destination is recorded.
                if !keep_going() || crate::interrupt::requested() {
                    return Batch::Stopped;
                }
                return Batch::OneByOne {
                    cause: format!(
                        "publishing {} bundles into {} failed, its writes were undone: {}",
                        accepted.len(),
                        root.label(),
                        s3_error(e).message
                    ),
                };
            }
        }
    }

    phase("committed");
    log::debug!(
        "s3 batch of {} bundles, ms since start: {phases:?}",
        reports.len()
    );
    for a in accepted {
        let unchanged = &a.unchanged;
        let report = finish_report(a.ready.report, &a.plans, |j, path| {
            unchanged[j].contains(path)
        });
        reports[a.index] = Some(report);
    }
    all_reported(reports)
}

/// Bundles prepared at once (on every core).
const PREPARE_AT_ONCE: usize = 256;

/// Bytes of pages and markdown the bundles of one batch may hold in memory
/// together. Past it the batch takes the bundles prepared so far (at least
/// one) and the agent batches the others next: an s3 batch takes up to
/// 1024 bundles, and each may hold up to 4 MiB (`content::HOLD_AT_MOST`).
const HELD_AT_MOST: u64 = 256 << 20;

/// [`HELD_AT_MOST`]; debug builds (the ones the tests run) take another
/// bound from `DISTRIBUTOR_TEST_S3_BATCH_HELD`, so that a test can make a
/// backlog of small pages go in several batches.
fn held_at_most() -> u64 {
    #[cfg(debug_assertions)]
    if let Some(bytes) = std::env::var("DISTRIBUTOR_TEST_S3_BATCH_HELD")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return bytes;
    }
    HELD_AT_MOST
}

/// [`prepare_all`] of the first bundles of `bundles` whose pages and
/// markdown held in memory stay within `held_at_most` bytes
/// ([`HELD_AT_MOST`]; at least the first bundle is taken): one report or
/// ready bundle for each bundle taken.
fn prepare_within<'a>(
    pipeline: &Pipeline,
    destinations: &[&'a Destination],
    bundles: &[&Path],
    options: &Options,
    workers: &dyn Workers,
    held_at_most: u64,
) -> (
    Vec<Option<crate::report::RunReport>>,
    Vec<(usize, Ready<'a>)>,
) {
    let mut reports = Vec::new();
    let mut taken = Vec::new();
    let mut held = 0;
    for slice in bundles.chunks(PREPARE_AT_ONCE) {
        let (slice_reports, ready) = prepare_all(pipeline, destinations, slice, options, workers);
        let mut ready = ready.into_iter().peekable();
        for (k, report) in slice_reports.into_iter().enumerate() {
            let index = reports.len();
            match ready.next_if(|(i, _)| *i == k) {
                Some((_, r)) => {
                    held += held_bytes(&r);
                    if index > 0 && held > held_at_most {
                        return (reports, taken);
                    }
                    reports.push(None);
                    taken.push((index, r));
                }
                None => reports.push(report),
            }
        }
    }
    (reports, taken)
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

impl Dest {
    /// Records what an accepted plan leaves in the bucket and the catalog.
    fn apply(&mut self, plan: &Plan, update: Option<&CatalogUpdate>) {
        for d in plan.writes.iter() {
            self.touched
                .insert(d.path.as_str().to_owned(), Some(d.size));
        }
        for gone in &plan.delete_after {
            self.touched.insert(gone.clone(), None);
        }
        if let Some(update) = update {
            self.records.record(&update.upserts, &update.removes);
        }
    }
}

/// Plans one bundle for one destination of the batch: the plan (a
/// refusal when it would delete unrecorded objects), its catalog change,
/// and its outputs whose object already holds the planned bytes.
fn plan_one(
    dest: &Dest,
    desired: &std::sync::Arc<[plan::Desired]>,
    d: &Destination,
    pipeline_id: &str,
    source: &crate::catalog::SourceIdentity,
    now: time::OffsetDateTime,
) -> (Plan, Option<CatalogUpdate>, BTreeSet<String>) {
    // Only the records this plan can consult, not the whole catalog.
    let view = plan::catalog_view(&dest.records, desired, d.workflow, pipeline_id, &d.id);
    let state = State::Catalog(view);
    let listing = listing(&dest.heads, &dest.touched, &state, desired);
    let mut plan = plan::plan(&PlanInput {
        pipeline_id,
        destination_id: &d.id,
        workflow: d.workflow,
        force: false,
        source,
        desired,
        state: &state,
        listing: &listing,
        now,
    });
    if let Some(refused) = unrecorded_deletes(&plan, &state, d) {
        plan = refused;
    }
    let update = plan.update.take();
    let unchanged = plan
        .writes
        .iter()
        .filter(|w| {
            let path = w.path.as_str();
            !dest.touched.contains_key(path) && already_there(&state, dest.heads.get(path), w)
        })
        .map(|w| w.path.as_str().to_owned())
        .collect();
    (plan, update, unchanged)
}

/// What the planner sees at each planned key: what the bundles before
/// this one leave there, else what the HEAD showed (an unrecorded object
/// of a publication's intent is that publication's and seen as absent,
/// exactly as for one bundle, see [`super::list`]).
fn listing(
    heads: &BTreeMap<String, Head>,
    touched: &BTreeMap<String, Option<u64>>,
    state: &State,
    desired: &[plan::Desired],
) -> Listing {
    let mut listing = Listing {
        root_exists: true,
        ..Listing::default()
    };
    for d in desired {
        let path = d.path.as_str();
        let entry = match touched.get(path) {
            Some(Some(size)) => Some(*size),
            Some(None) => None,
            None => heads
                .get(path)
                .filter(|h| !is_claimed(state, path, h))
                .map(|h| h.size),
        };
        if let Some(size) = entry {
            listing
                .entries
                .insert(path.to_owned(), Entry::File { size });
        }
    }
    listing
}

/// The batch's writes and deletes in one destination.
struct Merged {
    destination: usize,
    /// Key → (the bundle whose output it is, the output).
    writes: BTreeMap<String, (usize, plan::Desired)>,
    deletes: BTreeSet<String>,
}

impl Merged {
    /// Destination `j`'s writes and deletes of the bundles planned in
    /// `plans` (each with its outputs kept as they are), in arrival order.
    fn of(j: usize, plans: &[(&Plan, &BTreeSet<String>)]) -> Merged {
        let mut writes = BTreeMap::new();
        let mut deletes = BTreeSet::new();
        for (k, (plan, _)) in plans.iter().enumerate() {
            for d in plan.writes.iter() {
                writes.insert(d.path.as_str().to_owned(), (k, d.clone()));
                deletes.remove(d.path.as_str());
            }
            for gone in &plan.delete_after {
                writes.remove(gone);
                deletes.insert(gone.clone());
            }
        }
        // A key whose last writer found the object holding its bytes
        // already is not sent again.
        writes.retain(|path, (k, _)| !plans[*k].1.contains(path));
        Merged {
            destination: j,
            writes,
            deletes,
        }
    }
}

/// The records of `base` the batch relies on: every path a bundle's
/// catalog change touches and, for a replacement, every record of the
/// destination (another publication of it changes what the batch
/// deletes). A lost swap may be rebased only if the winner left all of
/// them as they were.
fn relied_on(
    base: &Catalog,
    updates: &[&CatalogUpdate],
    pipeline_id: &str,
    d: &Destination,
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
    let replacement = d.workflow == Workflow::Replacement;
    Catalog {
        distributor_version: base.distributor_version.clone(),
        created_at: base.created_at,
        updated_at: base.updated_at,
        outputs: base
            .outputs
            .iter()
            .filter(|r| {
                paths.contains(r.path.as_str()) || (replacement && r.owned_by(pipeline_id, &d.id))
            })
            .cloned()
            .collect(),
    }
}

/// The catalog to write instead when another publication committed
/// `latest` after the batch planned on `seen` ([`relied_on`]), or `None`
/// when the batch no longer holds: every bundle's change applied in
/// order on top of the winner's catalog.
fn rebase_batch(
    updates: &[&CatalogUpdate],
    seen: &Catalog,
    latest: &State,
    pipeline_id: &str,
    d: &Destination,
    now: time::OffsetDateTime,
) -> Option<Catalog> {
    let State::Catalog(latest) = latest else {
        return None;
    };
    let same = |r: &OutputRecord| latest.get(r.path.as_str()) == Some(r);
    // Paths the batch relies on that the base did not record must still
    // be unrecorded.
    let still_unrecorded = updates.iter().all(|u| {
        u.upserts
            .iter()
            .map(|r| r.path.as_str())
            .chain(u.removes.iter().map(String::as_str))
            .all(|p| seen.get(p).is_some() || latest.get(p).is_none())
    });
    let owned_same = d.workflow == Workflow::Additive || {
        let owned = |c: &Catalog| -> Vec<OutputRecord> {
            c.outputs
                .iter()
                .filter(|r| r.owned_by(pipeline_id, &d.id))
                .cloned()
                .collect()
        };
        owned(seen) == owned(latest)
    };
    if !(seen.outputs.iter().all(same) && still_unrecorded && owned_same) {
        return None;
    }
    let mut records = Overlay::new(latest.clone());
    for u in updates {
        records.record(&u.upserts, &u.removes);
    }
    Some(records.into_catalog(now))
}

#[cfg(test)]
#[path = "remote_batch_tests.rs"]
mod tests;
