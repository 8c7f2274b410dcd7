//! The spool agent: one thread per pipeline claims complete bundles from its
//! inbox and publishes them one at a time in arrival order; a watcher turns
//! file events into wake-ups (hints only: every wake-up rescans); a
//! maintenance thread prunes on schedule; signals stop or reload.
//!
//! The only module that knows about threads and signals. Publishing goes
//! through `publish::publish`, the same code path as `distributor run`.

use crate::config::{self, Config, Pipeline};
use crate::maintain;
use crate::metrics::Metrics;
use crate::publish::{self, Options};
use crate::report::RunReport;
use crate::spool::{self, Spool};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, select};
use notify::{RecursiveMode, Watcher};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often folders that have no manifest yet are looked at again, in
/// case their manifest event was missed.
const INCOMPLETE_POLL: Duration = Duration::from_millis(250);
/// How long a manifest that does not parse yet is given to be completed
/// before the bundle is claimed anyway (and fails with the parse error).
const MANIFEST_GRACE: Duration = Duration::from_secs(2);
/// Longest pause between two attempts of a transiently failing bundle.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Most bundles published together as one transaction per root.
const MAX_BATCH: usize = 256;
/// How often the metrics file is rewritten when one is configured.
const METRICS_EVERY: Duration = Duration::from_secs(10);
/// How often the maintenance thread checks `done/` retention.
const MAINTENANCE_TICK: Duration = Duration::from_secs(60);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Start(String),
}

impl AgentError {
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_) => 2,
            AgentError::Start(_) => 1,
        }
    }
}

/// How many pipelines this process serves (holds the agent lock of). A
/// standby agent serves none and leaves the metrics file to the active one.
static SERVING: AtomicUsize = AtomicUsize::new(0);

/// Counts this thread as serving its pipeline until dropped.
struct Serving;

impl Serving {
    fn start() -> Serving {
        SERVING.fetch_add(1, Ordering::SeqCst);
        Serving
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        SERVING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a pipeline thread hears.
#[derive(Debug, Clone, Copy)]
enum Wake {
    /// Something may have changed in the inbox: rescan.
    Scan,
    /// Finish the bundle in hand and return.
    Stop,
}

/// Counts of how bundles ended, and the metrics every thread feeds.
#[derive(Debug, Default)]
struct Tally {
    done: AtomicUsize,
    failed: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// Runs the agent. With `once`, processes `work/` and every inbox, then
/// returns whether every bundle ended in `done/`. Otherwise runs until
/// SIGTERM/SIGINT and returns `Ok(true)`.
pub fn run(config_path: &Path, once: bool) -> Result<bool, AgentError> {
    let config = config::load(config_path)?;
    for warning in config.warnings() {
        log::warn!("{warning}");
    }
    create_spools(&config)?;
    if once {
        return Ok(run_once(&config));
    }
    run_forever(config_path, config)
}

fn create_spools(config: &Config) -> Result<(), AgentError> {
    for p in &config.pipelines {
        Spool::of(config, p)
            .create()
            .map_err(|e| AgentError::Start(e.to_string()))?;
    }
    Ok(())
}

fn run_once(config: &Config) -> bool {
    let tally = Arc::new(Tally::default());
    tally.metrics.configure(config);
    let stop = Arc::new(AtomicBool::new(false));
    // First SIGTERM/SIGINT: finish the bundles in hand and stop; second: exit.
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let registered =
            signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
                .and_then(|_| signal_hook::flag::register(signal, stop.clone()));
        if let Err(e) = registered {
            log::warn!("cannot install a handler for signal {signal}: {e}");
        }
    }
    // The senders outlive the workers: nobody wakes a --once worker, but a
    // disconnected channel would read as "stop" during a retry backoff.
    let mut senders = Vec::new();
    std::thread::scope(|scope| {
        for p in &config.pipelines {
            let worker = Worker::new(config, p, tally.clone(), stop.clone(), true);
            let (tx, rx) = crossbeam_channel::unbounded::<Wake>();
            senders.push(tx);
            scope.spawn(move || worker.run(&rx));
        }
    });
    drop(senders);
    for p in &config.pipelines {
        expire_done(config, p);
    }
    write_metrics(config, &tally.metrics, false);
    let failed = tally.failed.load(Ordering::Relaxed);
    log::info!(
        "agent --once finished: {} done, {failed} failed",
        tally.done.load(Ordering::Relaxed)
    );
    failed == 0
}

/// A running set of pipeline threads plus their watcher.
struct Running {
    senders: Vec<Sender<Wake>>,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Running {
    fn start(config: &Config, metrics: &Arc<Metrics>) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        metrics.configure(config);
        let tally = Arc::new(Tally {
            metrics: metrics.clone(),
            ..Tally::default()
        });
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        let mut routes = Vec::new();
        for p in &config.pipelines {
            let (tx, rx) = crossbeam_channel::unbounded();
            let worker = Worker::new(config, p, tally.clone(), stop.clone(), false);
            let name = format!("pipeline-{}", p.id);
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker.run(&rx))
                .expect("spawning a pipeline thread");
            routes.push((p.inbox.clone(), tx.clone()));
            senders.push(tx);
            threads.push(thread);
        }
        let watcher = start_watcher(routes);
        Running {
            senders,
            threads,
            stop,
            _watcher: watcher,
        }
    }

    fn wake_all(&self) {
        for tx in &self.senders {
            let _ = tx.send(Wake::Scan);
        }
    }

    /// Stops claiming, lets each pipeline finish its bundle, joins.
    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for tx in &self.senders {
            let _ = tx.send(Wake::Stop);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Watches every inbox; events are hints that wake the owning pipeline.
fn start_watcher(routes: Vec<(PathBuf, Sender<Wake>)>) -> Option<notify::RecommendedWatcher> {
    let handler_routes = routes.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let wake_all = || {
            for (_, tx) in &handler_routes {
                let _ = tx.send(Wake::Scan);
            }
        };
        match event {
            Ok(event) if event.need_rescan() => {
                log::info!("file watcher lost events; rescanning every inbox");
                wake_all();
            }
            Ok(event) if !is_hint(event.kind) => {}
            Ok(event) => {
                for (inbox, tx) in &handler_routes {
                    if event.paths.iter().any(|p| p.starts_with(inbox)) {
                        let _ = tx.send(Wake::Scan);
                    }
                }
            }
            Err(e) => {
                log::warn!("file watcher error ({e}); rescanning every inbox");
                wake_all();
            }
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("cannot start the file watcher ({e}); relying on periodic rescans");
            return None;
        }
    };
    for (inbox, _) in &routes {
        if let Err(e) = watcher.watch(inbox, RecursiveMode::Recursive) {
            log::warn!(
                "cannot watch {} ({e}); relying on periodic rescans",
                inbox.display()
            );
        }
    }
    Some(watcher)
}

/// Whether a watcher event can mean a bundle arrived or changed. Opening,
/// reading and closing without writing are not: the agent's own scans open
/// the inbox and its manifests, and waking on those would rescan forever.
fn is_hint(kind: notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}

/// What the main thread hears.
enum Control {
    Terminate,
    Reload,
}

fn run_forever(config_path: &Path, mut config: Config) -> Result<bool, AgentError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| AgentError::Start(format!("cannot install signal handlers: {e}")))?;
    let (control_tx, control_rx) = crossbeam_channel::unbounded();
    let terminating = Arc::new(AtomicBool::new(false));
    {
        let terminating = terminating.clone();
        std::thread::spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    let _ = control_tx.send(Control::Reload);
                } else if terminating.swap(true, Ordering::SeqCst) {
                    log::warn!("second stop signal: exiting at once");
                    std::process::exit(130);
                } else {
                    let _ = control_tx.send(Control::Terminate);
                }
            }
        });
    }
    log::info!(
        "agent started: {} pipeline(s), config {}",
        config.pipelines.len(),
        config_path.display()
    );
    let metrics = Arc::new(Metrics::new());
    let mut running = Running::start(&config, &metrics);
    let mut maintenance = Maintenance::start(&config, &metrics);
    let rescan = |config: &Config| config.agent.rescan_interval;
    loop {
        match control_rx.recv_timeout(rescan(&config)) {
            Ok(Control::Terminate) => {
                log::info!("stop requested: finishing the bundles in hand");
                maintenance.stop();
                running.stop();
                log::info!("agent stopped");
                return Ok(true);
            }
            Ok(Control::Reload) => match config::load(config_path) {
                Ok(new) => {
                    log::info!("reloading config {}", config_path.display());
                    if let Err(e) = create_spools(&new) {
                        log::error!("config reload refused, keeping the old config: {e}");
                        continue;
                    }
                    maintenance.stop();
                    running.stop();
                    config = new;
                    running = Running::start(&config, &metrics);
                    maintenance = Maintenance::start(&config, &metrics);
                }
                Err(e) => {
                    log::error!("config reload refused, keeping the old config: {e}");
                }
            },
            Err(RecvTimeoutError::Timeout) => running.wake_all(),
            Err(RecvTimeoutError::Disconnected) => return Ok(true),
        }
    }
}

/// The scheduled pruning and `done/` expiry thread.
struct Maintenance {
    stop_tx: Sender<()>,
    thread: JoinHandle<()>,
}

impl Maintenance {
    fn start(config: &Config, metrics: &Arc<Metrics>) -> Maintenance {
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let config = config.clone();
        let metrics = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("maintenance".into())
            .spawn(move || maintenance_loop(&config, &metrics, &stop_rx))
            .expect("spawning the maintenance thread");
        Maintenance { stop_tx, thread }
    }

    fn stop(self) {
        let _ = self.stop_tx.send(());
        let _ = self.thread.join();
    }
}

fn maintenance_loop(config: &Config, metrics: &Metrics, stop: &Receiver<()>) {
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
            prune_all(config, metrics);
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

fn expire_done(config: &Config, p: &Pipeline) {
    let spool = Spool::of(config, p);
    match spool::expire_done(&spool, config.agent.done_retention) {
        Ok(0) => {}
        Ok(n) => log::info!(
            "pipeline={} removed {n} done/ entries past done_retention",
            p.id
        ),
        Err(e) => log::warn!("pipeline={}: cannot expire done/ entries: {e}", p.id),
    }
}

/// Counts the spool folders and writes the metrics file, if one is set.
/// A live agent that serves no pipeline (a standby) writes nothing.
fn write_metrics(config: &Config, metrics: &Metrics, live: bool) {
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

fn prune_all(config: &Config, metrics: &Metrics) {
    for p in &config.pipelines {
        for d in p.destinations.iter().filter(|d| d.prune.is_some()) {
            let target = maintain::Target {
                pipeline_id: &p.id,
                destination: d,
                lock_timeout: config.agent.lock_timeout,
            };
            match maintain::prune(&target, true, publish::now_millis()) {
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

/// One pipeline's loop: work/ first, then the inbox in arrival order.
struct Worker {
    config: Config,
    pipeline: Pipeline,
    spool: Spool,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    once: bool,
}

/// How processing one bundle ended.
enum Outcome {
    Finished,
    /// Left in work/ (stopping, or the spool move failed).
    Left,
}

/// Settle bookkeeping for one inbox entry.
struct Seen {
    first: Instant,
    changed: Instant,
    fingerprint: (std::time::SystemTime, u64, std::time::SystemTime),
}

impl Worker {
    fn new(
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

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn run(&self, rx: &Receiver<Wake>) {
        let Some(_agent_lock) = self.serve_lock(rx) else {
            return;
        };
        let _serving = Serving::start();
        if let Err(e) = spool::settle_batch(&self.spool) {
            log::error!(
                "pipeline={}: cannot settle {} ({e}); the attempt it recorded is not counted",
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
                            "pipeline={}: cannot clean {}: {e}",
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
    /// so two agents never serve one pipeline. A live agent waits on
    /// standby; `--once` gives up after `lock_timeout` and counts a failure.
    fn serve_lock(&self, rx: &Receiver<Wake>) -> Option<std::fs::File> {
        let path = self
            .spool
            .work
            .parent()
            .unwrap_or(&self.spool.work)
            .join(".distributor-agent.lock");
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot open {}: {e}; not serving this pipeline",
                    self.pipeline.id,
                    path.display()
                );
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let started = Instant::now();
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => return Some(file),
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
                log::error!(
                    "pipeline={}: another agent is serving it (it holds {}); --once skipped the pipeline",
                    self.pipeline.id,
                    path.display()
                );
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if !told {
                log::info!(
                    "pipeline={}: another agent is serving it (it holds {}); standing by",
                    self.pipeline.id,
                    path.display()
                );
                told = true;
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) if !self.once => return None,
                _ if self.stopping() => return None,
                _ => {}
            }
        }
    }

    /// Publishes bundles just claimed into work/, in arrival order: several
    /// at once as one transaction per root when possible, else one by one.
    fn process_claimed(&self, claimed: &[(PathBuf, String)], rx: &Receiver<Wake>) {
        let mut rest = claimed;
        while rest.len() > 1 && !self.stopping() {
            match self.try_batch(rest, rx) {
                publish::Batch::Done(_) => return,
                publish::Batch::OneFirst => {
                    let (path, name) = &rest[0];
                    self.process(path, name, rx);
                    rest = &rest[1..];
                }
                publish::Batch::OneByOne => break,
                publish::Batch::Stopped => {
                    // Finish the bundle in hand alone; the rest go back.
                    let (path, name) = &rest[0];
                    self.process(path, name, rx);
                    self.unclaim(&rest[1..]);
                    return;
                }
            }
        }
        for (i, (path, name)) in rest.iter().enumerate() {
            // Stopping: the first claimed bundle is the one in hand and is
            // finished; the others go back to the inbox.
            if i > 0 && self.stopping() {
                self.unclaim(&rest[i..]);
                return;
            }
            self.process(path, name, rx);
        }
    }

    /// Stopping: claimed bundles not started yet go back to the inbox.
    fn unclaim(&self, claimed: &[(PathBuf, String)]) {
        for (path, name) in claimed {
            if let Err(e) = spool::move_unique(path, &self.spool.inbox, name) {
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
                "pipeline={}: cannot record the batch's attempt in {}: {e}",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        let started = Instant::now();
        let dirs: Vec<&Path> = claimed.iter().map(|(p, _)| p.as_path()).collect();
        let destinations: Vec<_> = self.pipeline.destinations.iter().collect();
        let options = Options {
            dry_run: false,
            force: false,
            lock_timeout: self.config.agent.lock_timeout,
        };
        let keep_going = || !self.stop.load(Ordering::SeqCst);
        let outcome = publish::publish_batch(
            &self.pipeline,
            &destinations,
            &dirs,
            &options,
            &Threads::per_core(),
            &keep_going,
        );
        match &outcome {
            publish::Batch::Done(reports) => {
                let elapsed = started.elapsed().as_millis();
                log::info!(
                    "pipeline={} published a batch of {} bundles elapsed_ms={elapsed}",
                    self.pipeline.id,
                    reports.len()
                );
                for (((path, name), report), (_, attempt)) in
                    claimed.iter().zip(reports).zip(&attempts)
                {
                    for w in &report.warnings {
                        log::warn!("pipeline={} bundle={name}: {w}", self.pipeline.id);
                    }
                    if !report.ok && report.transient {
                        // Retried alone, with backoff, counting the batch's attempt.
                        if let Err(e) = spool::set_attempts(path, *attempt) {
                            log::error!(
                                "pipeline={} bundle={name}: cannot record the attempt count: {e}",
                                self.pipeline.id
                            );
                        }
                        self.process(path, name, rx);
                    } else {
                        self.file_away(path, name, report, elapsed);
                    }
                }
            }
            // Nothing was attempted: the batch file goes, no counter changed.
            publish::Batch::OneFirst | publish::Batch::OneByOne | publish::Batch::Stopped => {}
        }
        if let Err(e) = spool::end_batch(&self.spool) {
            log::warn!(
                "pipeline={}: cannot remove {}: {e}",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        outcome
    }

    /// Publishes the bundle at `path` (in work/), retrying transient
    /// failures with backoff, then files it into done/ or failed/.
    fn process(&self, path: &Path, name: &str, rx: &Receiver<Wake>) -> Outcome {
        let max = self.config.agent.max_attempts.max(1);
        loop {
            let attempt = spool::attempts(path) + 1;
            if let Err(e) = spool::set_attempts(path, attempt) {
                log::error!(
                    "pipeline={} bundle={name}: cannot record the attempt count in {}: {e}",
                    self.pipeline.id,
                    path.display()
                );
            }
            let started = Instant::now();
            let destinations: Vec<_> = self.pipeline.destinations.iter().collect();
            let report = publish::publish(
                &self.pipeline,
                &destinations,
                path,
                &Options {
                    dry_run: false,
                    force: false,
                    lock_timeout: self.config.agent.lock_timeout,
                },
            );
            let elapsed = started.elapsed().as_millis();
            for w in &report.warnings {
                log::warn!("pipeline={} bundle={name}: {w}", self.pipeline.id);
            }
            if !report.ok && report.transient && attempt < max {
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
    fn fail_without_manifest(&self, path: &Path) {
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

    fn file_away(&self, path: &Path, name: &str, report: &RunReport, elapsed: u128) -> Outcome {
        let actions = report.actions();
        match spool::finish(&self.spool, path, name, report) {
            Ok(to) => {
                let metrics = &self.tally.metrics;
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
                log::error!(
                    "pipeline={} bundle={name}: cannot move it out of work/: {e}; it stays in {} and is retried on the next start",
                    self.pipeline.id,
                    path.display()
                );
                Outcome::Left
            }
        }
    }
}

/// The threads a batch's reading, hashing and writing run on: one per core,
/// at most four, taking jobs from a shared queue.
struct Threads(usize);

impl Threads {
    fn per_core() -> Threads {
        Threads(
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, 4),
        )
    }
}

impl publish::Workers for Threads {
    fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        if self.0 < 2 || jobs.len() < 2 {
            return publish::InOrder.run_all(jobs);
        }
        let queue = std::sync::Mutex::new(jobs.into_iter());
        std::thread::scope(|scope| {
            for _ in 0..self.0 {
                scope.spawn(|| {
                    loop {
                        let job = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                        match job {
                            Some(job) => job(),
                            None => break,
                        }
                    }
                });
            }
        });
    }
}

/// True when the bundle's manifest.json parses as JSON: a producer writing
/// it in place (against the advice to rename it in) has finished.
fn manifest_is_complete_json(bundle: &Path) -> bool {
    std::fs::read(bundle.join(spool::MANIFEST))
        .is_ok_and(|bytes| serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok())
}

/// Exponential backoff: 1 s, 2 s, 4 s, … capped at five minutes.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(16)).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn threads_run_every_job_exactly_once() {
        use publish::Workers;
        let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        for threads in [Threads(1), Threads(4)] {
            let jobs = runs
                .iter()
                .map(|r| {
                    Box::new(move || {
                        r.fetch_add(1, Ordering::SeqCst);
                    }) as Box<dyn FnOnce() + Send + '_>
                })
                .collect();
            threads.run_all(jobs);
        }
        assert!(runs.iter().all(|r| r.load(Ordering::SeqCst) == 2));
    }

    #[test]
    fn only_changes_are_hints() {
        use notify::EventKind;
        use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode};
        let cases = [
            (EventKind::Access(AccessKind::Open(AccessMode::Any)), false),
            (EventKind::Access(AccessKind::Read), false),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                false,
            ),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                true,
            ),
            (EventKind::Create(CreateKind::Folder), true),
            (EventKind::Modify(ModifyKind::Name(RenameMode::To)), true),
            (EventKind::Remove(notify::event::RemoveKind::Any), true),
            (EventKind::Any, true),
            (EventKind::Other, true),
        ];
        for (kind, expected) in cases {
            assert_eq!(is_hint(kind), expected, "{kind:?}");
        }
    }
}
