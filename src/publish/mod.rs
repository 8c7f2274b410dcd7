//! Publication: verify a bundle, lock every destination root, plan them all,
//! and only if every plan is accepted, execute them.
//!
//! One driver ([`driver`]) publishes a batch of bundles (a single
//! publication is a batch of one) to every destination as one transaction
//! per root, over any backend (`crate::backend`: a local root, an s3
//! destination, each a `PublishRoot`). Execution follows the plan exactly
//! and decides nothing new; any error rolls every root back to a state whose catalog matches
//! its bytes (see `journal` and `s3::protocol`).

use crate::bundle::{self, VerifiedBundle};
use crate::config::{Destination, Pipeline};
use crate::paths::RelPath;
use crate::plan::Plan;
use crate::report::RunReport;
use crate::runtime::interrupt::Cancel;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod content;
mod driver;
mod error;
mod precompress;
mod prepare;

pub use crate::backend::{MAX_BATCH, peek_state, recover_abandoned, root_label, state_file_label};
pub use crate::plan::Rollback;
pub use crate::runtime::workers::Workers;
pub(crate) use content::Content;
pub use error::{Error, Fenced};

use crate::runtime::process_state::ProcessState;
use driver::{Aborted, Driver, Ended};

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
    /// The caches of the process: remembered catalogs, s3 clients.
    pub process: ProcessState,
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
///
/// Runs the destinations' `after_publish` hooks once the publication is
/// committed (`distributor run`; the agent, which must remember the hooks
/// it owes across a crash, publishes with [`publish_recorded`]).
pub fn publish(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    options: &Options,
) -> RunReport {
    let mut report = publish_recorded(pipeline, destinations, bundle_dir, options, None);
    let owed = crate::hooks::owed(pipeline, destinations, &folder_name(bundle_dir), &report);
    // `run` is not asked to stop: its hooks run to their end or timeout.
    report.hooks = crate::hooks::run_owed(pipeline, destinations, &owed, &Cancel::new());
    report
}

/// Told of a publication about to commit: the index of each bundle among
/// those published and its report as the commit will leave it. What it
/// records lets the agent tell after a crash that the commit may have
/// happened (docs/reliability.md, "After the commit"); an error stops the
/// publication before anything is committed.
pub type BeforeCommit<'a> = dyn Fn(&[(usize, &RunReport)]) -> std::io::Result<()> + Sync + 'a;

/// Publishes one bundle as [`publish`] does, without running its hooks:
/// `before_commit` is told before the commit, and the caller runs what
/// the report owes ([`crate::hooks::owed`]).
pub fn publish_recorded(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    options: &Options,
    before_commit: Option<&BeforeCommit>,
) -> RunReport {
    let driver = Driver {
        pipeline,
        destinations,
        options,
        workers: &options.process.per_core(),
        // A single bundle is finished in hand: only the token its caller
        // entered on the thread (crate::runtime::interrupt) abandons its copying.
        cancel: &Cancel::new(),
        older: None,
        before_commit,
        tombstones: Default::default(),
    };
    one_report(driver.run(&[bundle_dir]))
}

/// The report of the one bundle a run took: its own, or, when the run
/// aborted, its report failed with the error, which the destination the
/// error is at tells too (and whether it lost a race for the catalog).
fn one_report(ended: Ended) -> RunReport {
    let Aborted {
        error,
        root,
        report,
    } = match ended {
        Ended::Reports(mut reports) if reports.len() == 1 => return reports.remove(0),
        Ended::Aborted(aborted) => *aborted,
        _ => unreachable!("a single bundle never waits for a catalog, and gets its report"),
    };
    let mut report = report.expect("a single bundle is prepared before its roots are opened");
    if let Some(j) = root {
        let at = &mut report.destinations[j];
        at.error = Some(error.to_string());
        at.catalog_conflict = error.lost_catalog_race();
    }
    error.fail(report)
}

/// What publishing the bundle in `bundle_dir` would roll back: every stored
/// output it would overwrite or delete whose source was created after the
/// bundle's, found by planning it as a dry run (nothing is written). Empty
/// when there is none, and when the bundle cannot be planned (an invalid
/// bundle, a root that cannot be read): publishing it then fails by itself.
pub fn rollbacks(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle_dir: &Path,
    options: &Options,
) -> Vec<Rollback> {
    let options = Options {
        dry_run: true,
        force: false,
        ..options.clone()
    };
    let older = std::sync::Mutex::new(Vec::new());
    let driver = Driver {
        pipeline,
        destinations,
        options: &options,
        workers: &options.process.per_core(),
        // A single bundle is finished in hand: only the token its caller
        // entered on the thread (crate::runtime::interrupt) abandons its copying.
        cancel: &Cancel::new(),
        older: Some(&older),
        before_commit: None,
        tombstones: Default::default(),
    };
    let report = one_report(driver.run(&[bundle_dir]));
    if !report.ok {
        log::debug!(
            "{}: not planned ({}); nothing it would roll back is known",
            bundle_dir.display(),
            report.error_text()
        );
    }
    older.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// How a batch ended.
pub enum Batch {
    /// One report per bundle, in order; a batch may have taken only the
    /// first bundles (fewer reports: the pages of the others would have
    /// held too much memory together; they were not attempted and are
    /// batched next).
    Done(Vec<RunReport>),
    /// Nothing was published: publish the first bundle alone (it sets up a
    /// root or converts its state), then batch the rest.
    OneFirst,
    /// Nothing was published: publish every bundle alone. Says why, for
    /// the log line and the fallback counter; ordinary input (nested
    /// folders, new prefixes, overlapping paths) never ends here.
    OneByOne { cause: Error },
    /// Abandoned because `cancel` was finishing; nothing was published.
    Stopped,
}

/// Publishes `bundles` (in arrival order) to every destination of the
/// pipeline as one transaction per root. Runs no hook: the caller runs
/// what the reports owe ([`crate::hooks::owed`]), once per bundle in
/// arrival order, after `before_commit` was told of the commit.
///
/// `cancel` is asked before planning, before each staged file and
/// before committing; once it is finishing (the agent is stopping), the
/// batch is abandoned before anything is committed and [`Batch::Stopped`]
/// is returned.
pub fn publish_batch(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundles: &[&Path],
    options: &Options,
    workers: &dyn Workers,
    cancel: &Cancel,
    before_commit: Option<&BeforeCommit>,
) -> Batch {
    let driver = Driver {
        pipeline,
        destinations,
        options,
        workers,
        cancel,
        older: None,
        before_commit,
        tombstones: Default::default(),
    };
    match driver.run(bundles) {
        Ended::Reports(reports) => Batch::Done(reports),
        Ended::OneFirst => Batch::OneFirst,
        Ended::Aborted(a) if a.error.is_stopped() || cancel.finishing() => Batch::Stopped,
        Ended::Aborted(a) => Batch::OneByOne { cause: a.error },
    }
}

/// The name of a bundle's folder, as hooks are told it.
pub fn folder_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Hashes every listed file not checked yet.
fn verify_rest(
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
    workers: &dyn Workers,
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
    // Unit tests may make a bundle unreadable (crate::backend::memory).
    #[cfg(test)]
    crate::backend::memory::read_bundle(&bundle.dir)?;
    bundle::verify_files(&bundle.dir, &rest, workers)?;
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
    Some(Error::Refused { refusals: refused }.fail(report.clone()))
}

#[cfg(test)]
mod driver_memory_tests;
