//! The maintenance thread: `done/` expiry, scheduled pruning and the metrics
//! file. It must never publish, and a live agent serving no pipeline (a
//! standby) writes no metrics.

use super::{MAINTENANCE_TICK, METRICS_EVERY, SERVING};
use crate::config::{Config, Pipeline};
use crate::maintain;
use crate::metrics::Metrics;
use crate::runtime::clock;
use crate::runtime::process_state::ProcessState;
use crate::spool::{self, Spool};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The scheduled pruning and `done/` expiry thread.
pub(super) struct Maintenance {
    stop_tx: Sender<()>,
    thread: JoinHandle<()>,
}

impl Maintenance {
    pub(super) fn start(
        config: &Config,
        metrics: &Arc<Metrics>,
        process: &ProcessState,
    ) -> Maintenance {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let config = config.clone();
        let metrics = metrics.clone();
        let process = process.clone();
        let thread = std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || maintenance_loop(&config, &metrics, &stop_rx, &process))
            .expect("spawning the maintenance thread");
        Maintenance { stop_tx, thread }
    }

    pub(super) fn stop(self) {
        let _ = self.stop_tx.send(());
        let _ = self.thread.join();
    }
}

fn maintenance_loop(
    config: &Config,
    metrics: &Metrics,
    stop: &Receiver<()>,
    process: &ProcessState,
) {
    let prune_every = config.agent.prune_interval;
    let mut next_prune = Instant::now() + prune_every;
    let mut tick = if config.agent.done_retention.is_zero() {
        MAINTENANCE_TICK
    } else {
        MAINTENANCE_TICK.min(config.agent.done_retention)
    };
    if config.agent.metrics_file.is_some() {
        tick = tick.min(METRICS_EVERY);
    }
    loop {
        for p in &config.pipelines {
            expire_done(config, p);
        }
        if !prune_every.is_zero() && Instant::now() >= next_prune {
            prune_all(config, metrics, process);
            next_prune = Instant::now() + prune_every;
        }
        write_metrics(config, metrics, true);
        let mut wait = tick;
        if !prune_every.is_zero() {
            wait = wait.min(next_prune.saturating_duration_since(Instant::now()));
        }
        match stop.recv_timeout(wait.max(Duration::from_millis(10))) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => {
                write_metrics(config, metrics, true);
                return;
            }
        }
    }
}

/// Most `done/` entries retention could not remove that one pass logs by
/// name; the others are counted in one line (all are in `status`).
const MAX_LOGGED_BLOCKED: usize = 20;

/// One retention pass over `p`'s `done/`. An entry it cannot remove is
/// logged when first found (or when what stands in the way changes), not
/// at every pass, whether the agent restarted or not: what was found is
/// kept in the pipeline's folder, where `distributor status` reads it.
pub(super) fn expire_done(config: &Config, p: &Pipeline) {
    if p.intake.is_some() {
        // Its done/ is in the bucket, expired by the holder.
        return;
    }
    let spool = Spool::of(config, p);
    let previous = spool::retention_record(&spool);
    let expiry = match spool::expire_done(&spool, config.agent.done_retention, &previous) {
        Ok(e) => e,
        Err(e) => {
            log::warn!("pipeline={}: cannot expire done/ entries: {e}", p.id);
            return;
        }
    };
    if expiry.removed > 0 {
        log::info!(
            "pipeline={} removed {} done/ entries past done_retention",
            p.id,
            expiry.removed
        );
    }
    let news = spool::newly_blocked(&previous, &expiry.blocked);
    for u in news.iter().take(MAX_LOGGED_BLOCKED) {
        let owner = u
            .owner_uid
            .map(|uid| format!(" (its folder belongs to uid {uid}, {})", u.owner))
            .unwrap_or_default();
        log::warn!(
            "pipeline={}: done_retention cannot remove done/{}: done/{}: {}{owner}; every other entry still expires. It stays until its owner or root removes it, or the agent's group gets write access to it (see docs/troubleshooting.md); `distributor status` lists it",
            p.id,
            crate::text::escape::inert(&u.name),
            crate::text::escape::inert(&u.path),
            crate::text::escape::inert(&u.error),
        );
    }
    if news.len() > MAX_LOGGED_BLOCKED {
        log::warn!(
            "pipeline={}: done_retention cannot remove {} more done/ entries; `distributor status` lists them",
            p.id,
            news.len() - MAX_LOGGED_BLOCKED
        );
    }
    let record = spool::RetentionRecord::of(expiry.blocked);
    if record != previous
        && let Err(e) = spool::record_retention(&spool, &record)
    {
        log::warn!(
            "pipeline={}: cannot record which done/ entries retention could not remove in {}: {e}; `distributor status` cannot show them",
            p.id,
            spool::RETENTION_FILE
        );
    }
}

/// Counts the spool folders and writes the metrics file, if one is set.
/// A live agent that serves no pipeline (a standby) writes nothing.
pub(super) fn write_metrics(config: &Config, metrics: &Metrics, live: bool) {
    let Some(path) = &config.agent.metrics_file else {
        return;
    };
    if live && SERVING.load(Ordering::SeqCst) == 0 {
        return;
    }
    for p in &config.pipelines {
        let spool = Spool::of(config, p);
        for folder in [
            spool::Folder::Inbox,
            spool::Folder::Work,
            spool::Folder::Done,
            spool::Folder::Failed,
        ] {
            let depth = std::fs::read_dir(spool.folder(folder)).map_or(0, |d| {
                d.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            });
            metrics.set_queue_depth(&p.id, folder.as_str(), depth as u64);
        }
    }
    if let Err(e) = metrics.write_atomic(path) {
        log::warn!("cannot write the metrics file {}: {e}", path.display());
    }
}

fn prune_all(config: &Config, metrics: &Metrics, process: &ProcessState) {
    for p in &config.pipelines {
        for d in p.destinations.iter().filter(|d| d.prune.is_some()) {
            let target = maintain::OwnedRoot {
                pipeline_id: &p.id,
                destination: d,
                lock_timeout: config.agent.lock_timeout,
                process,
            };
            match maintain::prune(&target, true, clock::now_millis()) {
                Ok(r) if r.deletes.is_empty() => {}
                Ok(r) => {
                    metrics.add_prune_deletions(&p.id, &d.id, r.deletes.len() as u64);
                    log::info!(
                        "pipeline={} destination={} pruned {} output(s)",
                        p.id,
                        d.id,
                        r.deletes.len()
                    );
                }
                Err(e) => log::warn!("pipeline={} destination={} prune failed: {e}", p.id, d.id),
            }
        }
    }
}
