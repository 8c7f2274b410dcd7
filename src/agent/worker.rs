//! One pipeline's worker loop: the pipeline's agent lock, resuming `work/`,
//! letting inbox entries settle and claiming them into `work/` in arrival
//! order. It publishes nothing itself: bundles go to `process` and `process_claimed`.

use super::{INCOMPLETE_POLL, MANIFEST_GRACE, MAX_BATCH, Serving, Tally, Wake};
use crate::config::{Config, Pipeline};
use crate::spool::{self, Spool};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One pipeline's loop: work/ first, then the inbox in arrival order.
pub(super) struct Worker {
    pub(super) config: Config,
    pub(super) pipeline: Pipeline,
    pub(super) spool: Spool,
    pub(super) tally: Arc<Tally>,
    pub(super) stop: Arc<AtomicBool>,
    once: bool,
}

/// Settle bookkeeping for one inbox entry.
struct Seen {
    first: Instant,
    changed: Instant,
    fingerprint: (std::time::SystemTime, u64, std::time::SystemTime),
}

impl Worker {
    pub(super) fn new(
        config: &Config,
        p: &Pipeline,
        tally: Arc<Tally>,
        stop: Arc<AtomicBool>,
        once: bool,
    ) -> Worker {
        Worker {
            config: config.clone(),
            pipeline: p.clone(),
            spool: Spool::of(config, p),
            tally,
            stop,
            once,
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(super) fn run(&self, rx: &Receiver<Wake>) {
        let Some(_agent_lock) = self.serve_lock(rx) else {
            return;
        };
        let _serving = Serving::start();
        if let Err(e) = spool::settle_batch(&self.spool) {
            log::error!(
                "pipeline={}: cannot settle {} ({e}); the attempt it recorded is not counted. Check permissions in work/, and delete the file if this repeats (only an attempt count is lost)",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        match spool::scan(&self.spool.work) {
            Ok(spool::Scan {
                found, incomplete, ..
            }) => {
                for path in incomplete {
                    self.fail_without_manifest(&path);
                }
                if !found.is_empty() {
                    log::info!(
                        "pipeline={} resuming {} bundle(s) left in work/",
                        self.pipeline.id,
                        found.len()
                    );
                }
                for f in found {
                    if self.stopping() {
                        return;
                    }
                    if let Err(e) = spool::remove_stale_temps(&f.path) {
                        log::warn!(
                            "pipeline={}: cannot remove leftover temporary files from {}: {e}; the bundle is processed anyway. Check permissions, then delete its .distributor-tmp-* files by hand",
                            self.pipeline.id,
                            f.path.display()
                        );
                    }
                    self.process(&f.path, &f.name, rx);
                }
            }
            Err(e) => log::error!(
                "pipeline={}: cannot scan {}: {e}",
                self.pipeline.id,
                self.spool.work.display()
            ),
        }
        let settle = self.config.agent.settle;
        let mut seen: HashMap<String, Seen> = HashMap::new();
        let mut warned: HashSet<String> = HashSet::new();
        loop {
            if self.stopping() {
                return;
            }
            let spool::Scan {
                found,
                incomplete,
                strays,
            } = match spool::scan(&self.spool.inbox) {
                Ok(x) => x,
                Err(e) => {
                    log::error!(
                        "pipeline={}: cannot scan {}: {e}",
                        self.pipeline.id,
                        self.spool.inbox.display()
                    );
                    spool::Scan::default()
                }
            };
            for name in strays {
                if warned.insert(name.clone()) {
                    log::warn!(
                        "pipeline={}: {} is not a folder, so it is not a bundle; producers drop folders holding a manifest.json. Move it away",
                        self.pipeline.id,
                        self.spool.inbox.join(&name).display()
                    );
                }
            }
            let now = Instant::now();
            let mut next_check: Option<Duration> = None;
            let mut claimed_any = false;
            let mut ready = Vec::new();
            seen.retain(|name, _| found.iter().any(|f| &f.name == name));
            for f in &found {
                if self.stopping() {
                    return;
                }
                if !self.once {
                    let s = seen.entry(f.name.clone()).or_insert(Seen {
                        first: now,
                        changed: now,
                        fingerprint: f.fingerprint,
                    });
                    if s.fingerprint != f.fingerprint {
                        s.fingerprint = f.fingerprint;
                        s.changed = now;
                    }
                    let quiet = now.duration_since(s.changed);
                    let waited = now.duration_since(s.first);
                    let wait_more = if quiet < settle && waited < settle * 10 {
                        Some((settle - quiet).min(settle * 10 - waited))
                    } else if waited < MANIFEST_GRACE.max(settle * 10)
                        && !manifest_is_complete_json(&f.path)
                    {
                        // Written in place and not closed yet: wait for the
                        // closing brace rather than fail the bundle.
                        Some(INCOMPLETE_POLL)
                    } else {
                        None
                    };
                    if let Some(left) = wait_more {
                        next_check = Some(next_check.map_or(left, |n| n.min(left)));
                        continue;
                    }
                }
                seen.remove(&f.name);
                ready.push(f);
            }
            for chunk in ready.chunks(MAX_BATCH) {
                if self.stopping() {
                    return;
                }
                let mut claimed = Vec::new();
                for f in chunk {
                    match spool::move_unique(&f.path, &self.spool.work, &f.name) {
                        Ok(work_path) => {
                            let name = work_path
                                .file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_else(|| f.name.clone());
                            claimed.push((work_path, name));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => log::error!(
                            "pipeline={}: cannot claim {}: {e}",
                            self.pipeline.id,
                            f.path.display()
                        ),
                    }
                }
                claimed_any |= !claimed.is_empty();
                self.process_claimed(&claimed, rx);
            }
            if self.once {
                if !claimed_any {
                    return;
                }
                continue;
            }
            if claimed_any {
                continue; // more may have arrived meanwhile
            }
            let mut wait = self.config.agent.rescan_interval;
            if let Some(n) = next_check {
                wait = wait.min(n);
            }
            if !incomplete.is_empty() {
                wait = wait.min(INCOMPLETE_POLL);
            }
            match rx.recv_timeout(wait) {
                Ok(Wake::Stop) => return,
                Ok(Wake::Scan) => while rx.try_recv().is_ok() {},
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Takes the pipeline's agent lock (`<spool>/<pipeline>/.distributor-agent.lock`)
    /// so two agents never serve one pipeline, and records this process in
    /// `.distributor-agent.json` for `status`. A live agent waits on
    /// standby; `--once` gives up after `lock_timeout` and counts the
    /// pipeline as skipped.
    fn serve_lock(&self, rx: &Receiver<Wake>) -> Option<std::fs::File> {
        let folder = self.spool.work.parent().unwrap_or(&self.spool.work);
        let path = super::presence::lock_path(folder);
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot open {}: {e}; not serving this pipeline. The agent's user must be able to create files in {}",
                    self.pipeline.id,
                    path.display(),
                    folder.display()
                );
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let started = Instant::now();
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    if let Err(e) = super::presence::announce(folder) {
                        log::warn!(
                            "pipeline={}: cannot write {}: {e}; the pipeline is served, but `distributor status` cannot show this agent's pid",
                            self.pipeline.id,
                            folder.join(super::presence::INFO_FILE).display()
                        );
                    }
                    return Some(file);
                }
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    log::error!(
                        "pipeline={}: cannot lock {}: {e}",
                        self.pipeline.id,
                        path.display()
                    );
                    self.tally.failed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
            if self.once && started.elapsed() >= self.config.agent.lock_timeout {
                log::warn!(
                    "pipeline={}: another agent is serving it (it holds {}); --once skipped the pipeline and left its inbox to that agent",
                    self.pipeline.id,
                    path.display()
                );
                self.tally.skipped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if !told {
                if self.once {
                    log::info!(
                        "pipeline={}: another agent is serving it (it holds {}); waiting up to {} for it",
                        self.pipeline.id,
                        path.display(),
                        crate::config::format_duration(self.config.agent.lock_timeout)
                    );
                } else {
                    log::info!(
                        "pipeline={}: another agent is serving it (it holds {}); standing by",
                        self.pipeline.id,
                        path.display()
                    );
                }
                told = true;
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) if !self.once => return None,
                _ if self.stopping() => return None,
                _ => {}
            }
        }
    }
}

/// True when the bundle's manifest.json parses as JSON: a producer writing
/// it in place (against the advice to rename it in) has finished.
fn manifest_is_complete_json(bundle: &Path) -> bool {
    std::fs::read(bundle.join(spool::MANIFEST))
        .is_ok_and(|bytes| serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok())
}
