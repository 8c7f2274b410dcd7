//! Publishing one claimed bundle, retrying transient failures with backoff,
//! and filing it into `done/` or `failed/`, counted in the tally and metrics.

use super::ticker::Ticker;
use super::worker::Worker;
use super::{MAX_BACKOFF, Wake};
use crate::publish;
use crate::report::RunReport;
use crate::spool;
use crossbeam_channel::{Receiver, select};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How processing one bundle ended.
pub(super) enum Outcome {
    Finished,
    /// Left in work/ (stopping, or the spool move failed).
    Left,
}

impl Worker {
    /// Publishes the bundle at `path` (in work/), retrying transient
    /// failures with backoff, then files it into done/ or failed/.
    pub(super) fn process(&self, path: &Path, name: &str, rx: &Receiver<Wake>) -> Outcome {
        let max = self.config.agent.max_attempts.max(1);
        // Counted here too: a spool that cannot record counts must not
        // make the retries endless.
        let mut made = 0;
        loop {
            let counted = spool::count_attempt(path).unwrap_or_else(|e| {
                log::error!(
                    "pipeline={} bundle={name}: cannot record the attempt count in {}: {e}",
                    self.pipeline.id,
                    path.display()
                );
                spool::attempts(path) + 1
            });
            let attempt = counted.max(made + 1);
            made = attempt;
            let started = Instant::now();
            let destinations: Vec<_> = self.pipeline.destinations.iter().collect();
            let report = self.with_progress(&[(path, name)], || {
                publish::publish(&self.pipeline, &destinations, path, &self.options())
            });
            let elapsed = started.elapsed().as_millis();
            for w in &report.warnings {
                log::warn!("pipeline={} bundle={name}: {w}", self.pipeline.id);
            }
            // A stop interrupting the work is not a transient failure: the
            // attempt is given back in file_away and the bundle left in work/.
            if !report.ok && report.transient && attempt < max && !crate::interrupt::requested() {
                // A first attempt records no count (see spool::count_attempt):
                // it does now that there is another.
                if attempt == 1
                    && let Err(e) = spool::set_attempts(path, attempt)
                {
                    log::error!(
                        "pipeline={} bundle={name}: cannot record the attempt count in {}: {e}",
                        self.pipeline.id,
                        path.display()
                    );
                }
                let backoff = backoff(attempt);
                log::warn!(
                    "pipeline={} bundle={name} attempt {attempt}/{max} failed at {}: {}; retrying in {backoff:?}",
                    self.pipeline.id,
                    report.stage_name(),
                    report.error.as_deref().unwrap_or_default()
                );
                let deadline = Instant::now() + backoff;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let stop = self.stopping()
                        || select! {
                            recv(rx) -> msg => matches!(msg, Ok(Wake::Stop) | Err(_)),
                            default(left.min(Duration::from_millis(200))) => false,
                        };
                    if stop {
                        log::info!(
                            "pipeline={} bundle={name}: left in work/ for the next start",
                            self.pipeline.id
                        );
                        return Outcome::Left;
                    }
                }
                continue;
            }
            return self.file_away(path, name, &report, elapsed);
        }
    }

    /// A folder in work/ whose manifest vanished cannot be published; it
    /// goes to failed/ with the reason rather than sitting in work/ forever.
    pub(super) fn fail_without_manifest(&self, path: &Path) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let report = RunReport::new(&self.pipeline.id, false).fail(
            crate::report::Stage::Verify,
            format!(
                "{}: no {} in the bundle; restore it or re-seal the bundle, then `distributor spool retry {} {name}`",
                path.display(),
                spool::MANIFEST,
                self.pipeline.id
            ),
            false,
        );
        self.file_away(path, &name, &report, 0);
    }

    /// Runs `work` (publishing the bundles `bundles`) while counting what it
    /// reads; when it takes longer than [`PROGRESS_EVERY`], logs how far it
    /// got every [`PROGRESS_EVERY`] (docs/contract.md §14.4).
    pub(super) fn with_progress<T>(
        &self,
        bundles: &[(&Path, &str)],
        work: impl FnOnce() -> T,
    ) -> T {
        let progress = std::sync::Arc::new(crate::progress::Progress::default());
        let ticker = self
            .ticker
            .get_or_init(|| Ticker::start(self.pipeline.id.clone()));
        let _ticking = ticker.begin(bundles, progress.clone());
        let _counted = crate::progress::enter(Some(progress));
        work()
    }

    /// A claimed entry that is not a real folder (a link swapped in after
    /// the probe) is filed into failed/ as it is: nothing is read through
    /// it and nothing is written into it.
    pub(super) fn fail_not_a_folder(&self, path: &Path, name: &str) {
        let report = RunReport::new(&self.pipeline.id, false).fail(
            crate::report::Stage::Verify,
            format!(
                "{}: not a real folder when it was claimed (a symbolic link?); links are never followed. Drop the bundle folder itself",
                path.display()
            ),
            false,
        );
        self.file_away(path, name, &report, 0);
    }

    /// A bundle holding a folder at a name the agent writes inside it
    /// (see `spool::bookkeeping_blocked`) fails at stage verify before
    /// anything is counted or published. Returns whether it did.
    pub(super) fn fail_if_bookkeeping_blocked(&self, path: &Path, name: &str) -> bool {
        let Some(why) = spool::bookkeeping_blocked(path) else {
            return false;
        };
        let report = RunReport::new(&self.pipeline.id, false).fail(
            crate::report::Stage::Verify,
            format!("{}: {why}", path.display()),
            false,
        );
        self.file_away(path, name, &report, 0);
        true
    }

    pub(super) fn file_away(
        &self,
        path: &Path,
        name: &str,
        report: &RunReport,
        elapsed: u128,
    ) -> Outcome {
        if !report.ok && crate::interrupt::requested() {
            // Interrupted by the stop (or failing while stopping): resumed
            // at the next start rather than filed as a failure.
            let _ = spool::uncount_attempt(path);
            log::info!(
                "pipeline={} bundle={}: stopped before it finished; left in work/ for the next start",
                self.pipeline.id,
                crate::inert::inert(name)
            );
            return Outcome::Left;
        }
        let actions = report.actions();
        match spool::finish(&self.spool, path, name, report) {
            Ok(to) => {
                let metrics = &self.tally.metrics;
                metrics.add_cross_device_copies(&self.pipeline.id, report.copied_across);
                metrics.add_file_by_file_syncs(&self.pipeline.id, report.synced_file_by_file);
                if report.ok {
                    self.tally.done.fetch_add(1, Ordering::Relaxed);
                    metrics.bundle_done(&self.pipeline.id);
                    metrics.add_published_bytes(&self.pipeline.id, report.bytes_published);
                    let now = std::time::SystemTime::now();
                    for d in &report.destinations {
                        metrics.destination_succeeded(&self.pipeline.id, &d.destination_id, now);
                    }
                    log::info!(
                        "pipeline={} bundle={name} done {actions} elapsed_ms={elapsed}",
                        self.pipeline.id
                    );
                } else {
                    self.tally.failed.fetch_add(1, Ordering::Relaxed);
                    metrics.bundle_failed(&self.pipeline.id);
                    log::error!(
                        "pipeline={} bundle={name} failed at {} {actions} elapsed_ms={elapsed}: {} (see {})",
                        self.pipeline.id,
                        report.stage_name(),
                        report.error.as_deref().unwrap_or_default(),
                        to.display()
                    );
                }
                Outcome::Finished
            }
            Err(e) => {
                self.tally.left.fetch_add(1, Ordering::Relaxed);
                log::error!(
                    "pipeline={} bundle={name}: cannot move it out of work/: {e}; it stays in {} and is processed again at the next start. Check that the agent may write to work/, {} and {} and to the bundle folder itself",
                    self.pipeline.id,
                    path.display(),
                    self.spool.done.display(),
                    self.spool.failed.display()
                );
                Outcome::Left
            }
        }
    }
}

/// Exponential backoff: 1 s, 2 s, 4 s, … capped at five minutes.
pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}
