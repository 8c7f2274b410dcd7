//! Publishing one claimed bundle, deferring it after transient failures,
//! and filing it into `done/` or `failed/`, counted in the tally and metrics.

use super::ticker::Ticker;
use super::worker::Worker;
use super::{FLUSH_POLL, Wake};
use crate::catalog;
use crate::publish;
use crate::report::RunReport;
use crate::spool::{self, queue};
use crossbeam_channel::{Receiver, select};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// How processing one bundle ended.
pub(super) enum Processed {
    /// Filed into done/ or failed/.
    Filed,
    /// Left in work/ (stopping, or the spool move failed).
    Left,
}

impl Worker {
    /// Publishes the bundle at `path` (in work/), deferring it after a
    /// transient failure (retried with backoff, docs/contract.md §18.1),
    /// then files it into done/ or failed/.
    pub(super) fn process(&self, path: &Path, name: &str, rx: &Receiver<Wake>) -> Processed {
        let folder = self.spool.pipeline_folder();
        // A deferral recorded before a restart keeps its age and its next try.
        let mut deferral = self.recorded_deferral(name);
        if let Some(d) = &deferral {
            log::info!(
                "pipeline={} bundle={name} deferred: {}",
                self.pipeline.id,
                d.summary()
            );
            if let Some(since) = d.since() {
                self.tally
                    .metrics
                    .still_deferred(&self.pipeline.id, since.into());
            }
            let wait = d
                .next_try()
                .map_or(Duration::ZERO, |t| until(t, OffsetDateTime::now_utc()));
            if !self.wait_for_retry(wait, rx) {
                return self.left_deferred(name);
            }
        }
        // Counted here too: a spool that cannot record counts must not
        // make the retries endless.
        let mut made = 0;
        loop {
            if let Err(e) = queue::take_flush(folder) {
                log::warn!(
                    "pipeline={}: cannot remove {}: {e}",
                    self.pipeline.id,
                    folder.join(queue::FLUSH_FILE).display()
                );
            }
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
            let bundle = [(path.to_path_buf(), name.to_owned())];
            let recorded = AtomicBool::new(false);
            let before_commit = |told: &[(usize, &RunReport)]| {
                self.fence(&bundle, told)?;
                self.record_committing(&bundle, told, &recorded)
            };
            let mut report = self.with_progress(&[(path, name)], || {
                publish::publish_recorded(
                    &self.pipeline,
                    &destinations,
                    path,
                    &self.options(),
                    Some(&before_commit),
                )
            });
            let elapsed = started.elapsed().as_millis();
            self.tally.metrics.catalog_races(&report);
            for w in &report.warnings {
                log::warn!("pipeline={} bundle={name}: {w}", self.pipeline.id);
            }
            // A stop interrupting the work is not a transient failure: the
            // attempt is given back in file_away and the bundle left in work/.
            if !report.ok && report.transient() && !self.cancel.abandoned() {
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
                let now = OffsetDateTime::now_utc();
                let since = deferral.as_ref().and_then(|d| d.since()).unwrap_or(now);
                let deferred_for = until(now, since);
                let agent = &self.config.agent;
                if let Some(pause) = queue::next_pause(attempt, deferred_for, agent) {
                    let d = self.defer(name, attempt, since, now + pause, &report);
                    log::warn!(
                        "pipeline={} bundle={name} attempt {attempt}{} failed at {}: {}; deferred since {}, next try in {} (`distributor spool flush {}` tries it now)",
                        self.pipeline.id,
                        agent
                            .max_attempts
                            .map(|m| format!("/{m}"))
                            .unwrap_or_default(),
                        report.stage_name(),
                        report.error_text(),
                        d.since,
                        crate::config::format_duration(pause),
                        self.pipeline.id
                    );
                    deferral = Some(d);
                    if !self.wait_for_retry(pause, rx) {
                        return self.left_deferred(name);
                    }
                    continue;
                }
                if let Some(error) = &mut report.error {
                    error.add_note(&format!(
                        " (tried {attempt} times, deferred since {}; the agent gave up at {}. When the cause is fixed: `distributor spool retry {} {name}`)",
                        catalog::format_time(since),
                        if agent.max_attempts.is_some_and(|m| attempt >= m) {
                            format!("max_attempts {attempt}")
                        } else {
                            format!("defer_for {}", crate::config::format_duration(agent.defer_for))
                        },
                        self.pipeline.id
                    ));
                }
            }
            if deferral.is_some() && !self.cancel.abandoned() {
                self.undefer();
            }
            // A stop that interrupted the work leaves the bundle and its
            // record as they are (see file_away); anything else is final.
            let mut in_record = false;
            if report.ok || !self.cancel.abandoned() {
                let reports = std::slice::from_ref(&report);
                let committed =
                    self.record_committed(&bundle, reports, recorded.into_inner(), false);
                in_record = committed.recorded;
                if let Some(owed) = committed.owed.first()
                    && !self.run_hooks(owed, &mut report)
                {
                    self.left_owing_hooks(name);
                    return Processed::Left;
                }
            }
            let processed = self.file_away(path, name, &report, elapsed);
            if in_record {
                self.forget_filed(&bundle);
            }
            return processed;
        }
    }

    /// The deferral recorded for bundle `name`, if the pipeline's record
    /// names it (one left by another bundle is stale and goes).
    fn recorded_deferral(&self, name: &str) -> Option<queue::Deferral> {
        match queue::deferral(self.spool.pipeline_folder()) {
            Ok(Some(d)) if d.bundle == name => Some(d),
            Ok(None) => None,
            Ok(Some(_)) | Err(_) => {
                self.undefer();
                None
            }
        }
    }

    /// Records bundle `name` as deferred: `status`, `spool list` and the
    /// metrics show it, and a restart keeps its age.
    fn defer(
        &self,
        name: &str,
        attempts: u32,
        since: OffsetDateTime,
        next_try: OffsetDateTime,
        report: &RunReport,
    ) -> queue::Deferral {
        let d = queue::Deferral {
            bundle: name.to_owned(),
            attempts,
            since: catalog::format_time(since),
            stage: report.stage_name().to_owned(),
            last_error: report.error_text(),
            next_try: catalog::format_time(next_try),
        };
        let folder = self.spool.pipeline_folder();
        if let Err(e) = queue::defer(folder, &d) {
            log::error!(
                "pipeline={} bundle={name}: cannot record the deferral in {}: {e}; it is retried all the same, but `status` cannot show it and a restart forgets since when it is deferred. Check free space and permissions in {}",
                self.pipeline.id,
                folder.join(queue::DEFERRED_FILE).display(),
                folder.display()
            );
        }
        self.tally.metrics.deferred(&self.pipeline.id, since.into());
        d
    }

    /// The pipeline's deferred bundle is filed (or gone): its record goes.
    fn undefer(&self) {
        let folder = self.spool.pipeline_folder();
        if let Err(e) = queue::undefer(folder) {
            log::warn!(
                "pipeline={}: cannot remove {}: {e}; `status` shows a deferral that is over until the next one. Check permissions in {}",
                self.pipeline.id,
                folder.join(queue::DEFERRED_FILE).display(),
                folder.display()
            );
        }
        self.tally.metrics.not_deferred(&self.pipeline.id);
    }

    /// Stopping while a bundle is deferred: it stays in work/, its record
    /// too, and the next start resumes the deferral. An intake's bundle
    /// (stopping, or the lease lost) leaves this host: it stays in the
    /// bucket's inbox, and whichever agent serves the intake next starts
    /// its deferral afresh, so this host's record of it goes (else
    /// `status` would show a deferral on an agent that stands by).
    fn left_deferred(&self, name: &str) -> Processed {
        let left = if self.pipeline.intake.is_some() {
            self.undefer();
            "it stays in the intake for the agent that serves it next"
        } else {
            "left in work/ for the next start"
        };
        log::info!(
            "pipeline={} bundle={name}: deferred, {left}",
            self.pipeline.id
        );
        Processed::Left
    }

    /// Waits `pause` before the next attempt of a deferred bundle, or less
    /// when `spool flush` asks for it (seen within [`FLUSH_POLL`]). False
    /// when a stop came meanwhile, or when this agent lost the lease of
    /// the intake it serves (the bundle is the new holder's).
    pub(super) fn wait_for_retry(&self, pause: Duration, rx: &Receiver<Wake>) -> bool {
        let folder = self.spool.pipeline_folder();
        let deadline = Instant::now() + pause;
        loop {
            if self.stopping() || self.lease_lost() {
                return false;
            }
            if queue::flush_requested(folder) {
                log::info!(
                    "pipeline={}: flushed (`distributor spool flush`); trying the deferred bundle now",
                    self.pipeline.id
                );
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            let stop = select! {
                recv(rx) -> msg => matches!(msg, Ok(Wake::Stop) | Err(_)),
                default(left.min(FLUSH_POLL)) => false,
            };
            if stop {
                return false;
            }
        }
    }

    /// A folder in work/ whose manifest vanished cannot be published; it
    /// goes to failed/ with the reason rather than sitting in work/ forever.
    pub(super) fn fail_without_manifest(&self, path: &Path) {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let e = publish::Error::Folder {
            path: path.to_path_buf(),
            why: format!(
                "no {} in the bundle; restore it or re-seal the bundle, then `distributor spool retry {} {name}`",
                spool::MANIFEST,
                self.pipeline.id
            ),
        };
        let report = e.fail(RunReport::new(&self.pipeline.id, false));
        self.file_away(path, &name, &report, 0);
    }

    /// Runs `work` (publishing the bundles `bundles`) while counting what it
    /// reads; when it takes longer than [`super::PROGRESS_EVERY`], logs how far it
    /// got every [`super::PROGRESS_EVERY`] (docs/contract.md §14.4).
    pub(super) fn with_progress<T>(
        &self,
        bundles: &[(&Path, &str)],
        work: impl FnOnce() -> T,
    ) -> T {
        let progress = std::sync::Arc::new(crate::runtime::progress::Progress::default());
        let ticker = self
            .ticker
            .get_or_init(|| Ticker::start(self.pipeline.id.clone()));
        let _ticking = ticker.begin(bundles, progress.clone());
        let _counted = crate::runtime::progress::enter(Some(progress));
        // The hashing and copying loops stop at this worker's stop.
        let _cancel = self.cancel.enter();
        work()
    }

    /// A claimed entry that is not a real folder (a link swapped in after
    /// the probe) is filed into failed/ as it is: nothing is read through
    /// it and nothing is written into it.
    pub(super) fn fail_not_a_folder(&self, path: &Path, name: &str) {
        let e = publish::Error::Folder {
            path: path.to_path_buf(),
            why: "not a real folder when it was claimed (a symbolic link?); links are never followed. Drop the bundle folder itself".to_owned(),
        };
        let report = e.fail(RunReport::new(&self.pipeline.id, false));
        self.file_away(path, name, &report, 0);
    }

    /// A bundle holding a folder at a name the agent writes inside it
    /// (see `spool::bookkeeping_blocked`) fails at stage verify before
    /// anything is counted or published. Returns whether it did.
    pub(super) fn fail_if_bookkeeping_blocked(&self, path: &Path, name: &str) -> bool {
        let Some(why) = spool::bookkeeping_blocked(path) else {
            return false;
        };
        let e = publish::Error::Folder {
            path: path.to_path_buf(),
            why,
        };
        let report = e.fail(RunReport::new(&self.pipeline.id, false));
        self.file_away(path, name, &report, 0);
        true
    }

    pub(super) fn file_away(
        &self,
        path: &Path,
        name: &str,
        report: &RunReport,
        elapsed: u128,
    ) -> Processed {
        if !report.ok && self.cancel.abandoned() {
            // Interrupted by the stop (or failing while stopping): resumed
            // at the next start rather than filed as a failure.
            let _ = spool::uncount_attempt(path);
            log::info!(
                "pipeline={} bundle={}: stopped before it finished; left in work/ for the next start",
                self.pipeline.id,
                crate::text::escape::inert(name)
            );
            return Processed::Left;
        }
        let actions = report.actions();
        match spool::finish(&self.spool, path, name, report) {
            Ok(to) => {
                let metrics = &self.tally.metrics;
                metrics.add_cross_device_copies(&self.pipeline.id, report.copied_across);
                metrics.add_file_by_file_syncs(&self.pipeline.id, report.synced_file_by_file);
                for h in report.hooks.iter().filter(|h| h.error.is_some()) {
                    metrics.hook_failed(&self.pipeline.id, &h.destination_id);
                }
                if let Some(reason) = report.signature_refused {
                    metrics.signature_refused(&self.pipeline.id, reason);
                }
                // The principal the bundle was published or refused as.
                let signer = report.signer.as_ref().map_or_else(String::new, |s| {
                    format!(
                        " signer={} key={}",
                        crate::text::escape::inert(&s.principal),
                        s.key
                    )
                });
                if report.ok {
                    self.tally.done.fetch_add(1, Ordering::Relaxed);
                    metrics.bundle_done(&self.pipeline.id);
                    metrics.add_published_bytes(&self.pipeline.id, report.bytes_published);
                    let now = std::time::SystemTime::now();
                    for d in &report.destinations {
                        metrics.destination_succeeded(&self.pipeline.id, &d.destination_id, now);
                    }
                    log::info!(
                        "pipeline={} bundle={name}{signer} done {actions} elapsed_ms={elapsed}",
                        self.pipeline.id
                    );
                } else {
                    self.tally.failed.fetch_add(1, Ordering::Relaxed);
                    metrics.bundle_failed(&self.pipeline.id);
                    log::error!(
                        "pipeline={} bundle={name}{signer} failed at {} {actions} elapsed_ms={elapsed}: {} (see {})",
                        self.pipeline.id,
                        report.stage_name(),
                        report.error_text(),
                        to.display()
                    );
                }
                Processed::Filed
            }
            Err(e) => {
                self.tally.left.fetch_add(1, Ordering::Relaxed);
                // Recorded, so that the next start files it rather than
                // publishing it again over what came after it (a spool too
                // full for its result is likely too full for the record).
                let recorded = spool::unfiled(&self.spool).and_then(|mut unfiled| {
                    unfiled.insert(name.to_owned(), spool::Unfiled::of(path, report)?);
                    spool::set_unfiled(&self.spool, &unfiled)
                });
                let next = match recorded {
                    Ok(()) => "the next start moves it without publishing it again".to_owned(),
                    Err(r) => format!(
                        "it could not be recorded in {} either ({r}), so the next start processes it again, over anything published meanwhile: fix this before restarting the agent",
                        self.spool.work.join(spool::UNFILED_FILE).display()
                    ),
                };
                log::error!(
                    "pipeline={} bundle={name}: {} but cannot be moved out of work/: {e}; it stays in {} and {next}. Check that the agent may write to work/, {} and {} and to the bundle folder itself (a producer that owns the folder can take that away: chmod u+w it, or move it by hand)",
                    self.pipeline.id,
                    if report.ok { "published" } else { "failed" },
                    path.display(),
                    self.spool.done.display(),
                    self.spool.failed.display()
                );
                Processed::Left
            }
        }
    }
}

/// How long from `from` to `to`, zero when `to` is not later.
fn until(to: OffsetDateTime, from: OffsetDateTime) -> Duration {
    (to - from).try_into().unwrap_or_default()
}
