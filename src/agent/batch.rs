//! Publishing the bundles a worker just claimed: several at once as one
//! transaction per root when possible, else one by one. When stopping, the
//! claimed bundles not started yet go back to the inbox.

use super::Wake;
use super::worker::Worker;
use crate::publish;
use crate::report::RunReport;
use crate::spool::{self, queue};
use crossbeam_channel::Receiver;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

impl Worker {
    /// Publishes bundles just claimed into work/, in arrival order: several
    /// at once as one transaction per root when possible, else one by one.
    pub(super) fn process_claimed(&self, claimed: &[(PathBuf, String)], rx: &Receiver<Wake>) {
        let mut rest = claimed;
        // Whether a bundle of these was already published alone: once one
        // was, a stop sends every other one back instead of starting it.
        let mut finished_one = false;
        // Tries of a batch whose commit failed partway, and since when.
        let mut partway: Option<(u32, Instant)> = None;
        while rest.len() > 1 && !self.stopping() {
            // Bundles whose commit may have happened are the bundle in
            // hand, which a hold lets finish.
            if finished_one && self.hold_placed() && !self.commit_recorded(rest) {
                self.unclaim(rest);
                return;
            }
            match self.try_batch(rest, rx) {
                // A batch may take only the first bundles (their pages would
                // hold too much memory together): the rest are batched next.
                publish::Batch::Done(reports)
                    if reports.len() < rest.len() && !reports.is_empty() =>
                {
                    rest = &rest[reports.len()..];
                    finished_one = true;
                }
                publish::Batch::Done(_) => return,
                publish::Batch::OneFirst => {
                    let (path, name) = &rest[0];
                    self.process(path, name, rx);
                    rest = &rest[1..];
                    finished_one = true;
                }
                // Roots that committed before the failure keep the batch:
                // publishing its bundles one by one would show their
                // readers the older ones again, so the batch is tried
                // again as a batch, with the backoff of a deferred bundle
                // (a destination down, a lost catalog race), for as long
                // as a bundle is deferred.
                publish::Batch::OneByOne { cause }
                    if cause.is_transient() && self.commit_recorded(rest) =>
                {
                    let (tries, since) = partway.get_or_insert((0, Instant::now()));
                    *tries += 1;
                    let agent = &self.config.agent;
                    let Some(pause) = queue::next_pause(*tries, since.elapsed(), agent) else {
                        log::error!(
                            "pipeline={}: the batch's commit failed partway {tries} times ({cause}); publishing its {} bundles one by one, so the roots that kept the batch show older bundles' content until the newest is published again",
                            self.pipeline.id,
                            rest.len()
                        );
                        self.tally.metrics.batch_fallback(&self.pipeline.id);
                        break;
                    };
                    log::warn!(
                        "pipeline={}: the batch's commit failed partway ({cause}); trying its {} bundles again as one batch in {}",
                        self.pipeline.id,
                        rest.len(),
                        crate::config::format_duration(pause)
                    );
                    if !self.wait_for_retry(pause, rx) {
                        // Stopping: they stay in work/ (see unclaim).
                        return;
                    }
                }
                publish::Batch::OneByOne { cause } => {
                    log::warn!(
                        "pipeline={}: batch publication stepped aside, publishing {} bundles one by one: {cause}",
                        self.pipeline.id,
                        rest.len()
                    );
                    self.tally.metrics.batch_fallback(&self.pipeline.id);
                    break;
                }
                publish::Batch::Stopped => {
                    // Finish the bundle in hand alone (unless one was
                    // already finished, or the commit of these may have
                    // happened: then none goes alone); the rest go back.
                    if finished_one || self.commit_recorded(rest) {
                        self.unclaim(rest);
                    } else {
                        let (path, name) = &rest[0];
                        self.process(path, name, rx);
                        self.unclaim(&rest[1..]);
                    }
                    return;
                }
            }
        }
        for (i, (path, name)) in rest.iter().enumerate() {
            // Stopping: the first claimed bundle is the one in hand and is
            // finished (unless one was finished alone already); the others
            // go back to the inbox. So do they when `spool hold` came while
            // one was in hand (deferred, perhaps for long), but for those
            // whose commit may have happened, which are in hand too.
            let held = || self.hold_placed() && !self.commit_recorded(&rest[i..]);
            if (i > 0 || finished_one) && (self.stopping() || held()) {
                self.unclaim(&rest[i..]);
                return;
            }
            self.process(path, name, rx);
        }
    }

    /// Whether `spool hold` holds the pipeline now.
    pub(super) fn hold_placed(&self) -> bool {
        spool::queue::held(self.spool.pipeline_folder()).is_some()
    }

    /// Stopping: claimed bundles not started yet go back to the inbox,
    /// except those whose commit may have happened (a batch resumed after
    /// a crash, see `commit`): they stay in work/ and are published again
    /// together at the next start.
    fn unclaim(&self, claimed: &[(PathBuf, String)]) {
        let unfiled = self.record().unwrap_or_default();
        for (path, name) in claimed {
            if unfiled
                .get(name)
                .is_some_and(|u| u.committing && u.is(path))
            {
                continue;
            }
            if let Err(e) =
                spool::move_unique(path, &self.spool.inbox, name, spool::names::NAME_MAX)
            {
                log::warn!(
                    "pipeline={} bundle={name}: cannot move it back to the inbox ({e}); it stays in work/ and is processed first at the next start",
                    self.pipeline.id
                );
            }
        }
    }

    /// Publishes several claimed bundles as one transaction per root and
    /// files each away (a transient failure is retried alone).
    fn try_batch(&self, claimed: &[(PathBuf, String)], rx: &Receiver<Wake>) -> publish::Batch {
        // One file records the attempt of the whole batch; a bundle gets its
        // own counter only when it is retried alone.
        let attempts: Vec<(String, u32)> = claimed
            .iter()
            .map(|(path, name)| (name.clone(), spool::attempts(path) + 1))
            .collect();
        if let Err(e) = spool::begin_batch(&self.spool, &attempts) {
            log::error!(
                "pipeline={}: cannot record the batch's attempt in {}: {e}; publishing goes ahead, but a crash now would not count this attempt. Check free space and permissions in work/",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        let started = Instant::now();
        let dirs: Vec<&Path> = claimed.iter().map(|(p, _)| p.as_path()).collect();
        let destinations: Vec<_> = self.pipeline.destinations.iter().collect();
        let options = self.options();
        let named: Vec<(&Path, &str)> = claimed
            .iter()
            .map(|(p, n)| (p.as_path(), n.as_str()))
            .collect();
        let recorded = AtomicBool::new(false);
        let before_commit = |told: &[(usize, &RunReport)]| {
            self.fence(claimed, told)?;
            self.record_committing(claimed, told, &recorded)
        };
        let mut outcome = self.with_progress(&named, || {
            publish::publish_batch(
                &self.pipeline,
                &destinations,
                &dirs,
                &options,
                &options.process.per_core(),
                &self.cancel,
                Some(&before_commit),
            )
        });
        match &mut outcome {
            publish::Batch::Done(reports) => {
                let recorded = recorded.load(Ordering::SeqCst);
                let committed = self.record_committed(claimed, reports, recorded, true);
                let elapsed = started.elapsed().as_millis();
                for report in reports.iter() {
                    self.tally.metrics.catalog_races(report);
                }
                let failed = reports.iter().filter(|r| !r.ok).count();
                let published = reports.len() - failed;
                log::info!(
                    "pipeline={} published a batch of {published} bundle{}{} elapsed_ms={elapsed}",
                    self.pipeline.id,
                    if published == 1 { "" } else { "s" },
                    if failed > 0 {
                        format!(" ({failed} more failed or wait to be tried again)")
                    } else {
                        String::new()
                    }
                );
                for ((((path, name), report), (_, attempt)), owed) in claimed
                    .iter()
                    .zip(reports)
                    .zip(&attempts)
                    .zip(committed.owed)
                {
                    for w in &report.warnings {
                        log::warn!("pipeline={} bundle={name}: {w}", self.pipeline.id);
                    }
                    if !report.ok && report.transient() {
                        // Retried alone, with backoff, counting the batch's attempt.
                        if let Err(e) = spool::set_attempts(path, *attempt) {
                            log::error!(
                                "pipeline={} bundle={name}: cannot record the attempt count: {e}",
                                self.pipeline.id
                            );
                        }
                        self.process(path, name, rx);
                    } else {
                        // A bundle that counts its attempts (an earlier one
                        // was interrupted) counts the batch's too.
                        if spool::recorded_attempts(path).is_some()
                            && let Err(e) = spool::set_attempts(path, *attempt)
                        {
                            log::warn!(
                                "pipeline={} bundle={name}: cannot record the attempt count: {e}",
                                self.pipeline.id
                            );
                        }
                        // Its hooks, then it is filed: in arrival order,
                        // each bundle's once the whole batch is durable.
                        if !self.run_hooks(&owed, report) {
                            self.left_owing_hooks(name);
                            continue;
                        }
                        self.file_away(path, name, report, elapsed);
                    }
                }
                if committed.recorded {
                    self.forget_filed(claimed);
                }
            }
            // Nothing was attempted: the batch file goes, no counter changed.
            publish::Batch::OneFirst
            | publish::Batch::OneByOne { .. }
            | publish::Batch::Stopped => {}
        }
        if let Err(e) = spool::end_batch(&self.spool) {
            log::warn!(
                "pipeline={}: cannot remove {}: {e}; the next start folds it into per-bundle counters. Check permissions in work/",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        outcome
    }
}
