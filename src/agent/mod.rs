//! The spool agent: one thread per pipeline claims complete bundles from its
//! inbox and publishes them one at a time in arrival order; a watcher turns
//! file events into wake-ups (hints only: every wake-up rescans); a
//! maintenance thread prunes on schedule; signals stop or reload; under
//! systemd a notify thread reports readiness, status and the watchdog.
//!
//! The only module that knows about threads and signals. Publishing goes
//! through `publish::publish`, the same code path as `distributor run`.

use crate::config::{self, Config};
use crate::metrics::Metrics;
use crate::runtime::interrupt::Cancel;
use crate::spool::Spool;
use crossbeam_channel::{RecvTimeoutError, Sender};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

mod batch;
mod commit;
mod intake;
mod maintenance;
pub mod presence;
mod process;
mod sd_notify;
mod ticker;
mod watcher;
mod worker;

#[cfg(test)]
mod tests;

use crate::runtime::process_state::ProcessState;
use maintenance::{Maintenance, expire_done, write_metrics};
use sd_notify::Notifier;
use watcher::start_watcher;
use worker::Worker;

/// After a stop signal, how long the bundle in hand may take to finish
/// before its hashing and copying are interrupted (docs/contract.md §8: finish the
/// bundle in hand; §12.4: stop within 2 s however big it is).
const STOP_GRACE: Duration = Duration::from_millis(1000);
/// How often long work logs how far it got (docs/contract.md §14.4).
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// How often a deferred bundle's wait looks for `spool flush`, and a held
/// pipeline for `spool release` (docs/contract.md §18.4: within 1 s).
const FLUSH_POLL: Duration = Duration::from_millis(200);
/// How often the metrics file is rewritten when one is configured.
const METRICS_EVERY: Duration = Duration::from_secs(10);
/// How often `STATUS=` is refreshed for systemd when it listens.
const NOTIFY_STATUS_EVERY: Duration = Duration::from_secs(10);
/// How long start-up waits for the pipeline threads to take their locks
/// before telling systemd it is ready (a standby agent never takes them).
const READY_WAIT: Duration = Duration::from_secs(2);
/// How often the maintenance thread checks `done/` retention.
const MAINTENANCE_TICK: Duration = Duration::from_secs(60);

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Start(String),
    /// A spool folder that cannot be made or used as the config asks: the
    /// config (or the folders) must change, a restart does not help.
    #[error("{0}")]
    Spool(String),
}

impl AgentError {
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_) | AgentError::Spool(_) => crate::runtime::exit::EXIT_USAGE,
            AgentError::Start(_) => crate::runtime::exit::EXIT_FAILURE,
        }
    }
}

/// How many pipelines this process serves (holds the agent lock of). A
/// standby agent serves none and leaves the metrics file to the active one.
/// Process-wide on purpose: it counts agent locks, which belong to the
/// process (docs/architecture.md, "What a process keeps").
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
    /// `--once`: bundles left in the inbox because they are incomplete.
    incomplete: AtomicUsize,
    /// `--once`: bundles left in the inbox because they could not be
    /// claimed (moved into `work/`).
    unclaimed: AtomicUsize,
    /// Pipelines `--once` left alone because another agent serves them.
    skipped: AtomicUsize,
    /// Bundles that could not be filed and stay in `work/`.
    left: AtomicUsize,
    metrics: Arc<Metrics>,
}

/// Runs the agent. With `once`, processes `work/` and every inbox, then
/// returns whether every bundle ended in `done/`. Otherwise runs until
/// SIGTERM/SIGINT and returns `Ok(true)`.
pub fn run(config_path: &Path, once: bool, process: &ProcessState) -> Result<bool, AgentError> {
    let config = config::load(config_path)?;
    for warning in config.warnings() {
        log::warn!("{warning}");
    }
    create_spools(&config)?;
    config::in_force::remove_dead_temps(&config.spool);
    if once {
        return Ok(run_once(&config, process));
    }
    keep_in_force(&config, config_path);
    run_forever(config_path, config, process)
}

/// Keeps a copy of the config the agent now serves, for the commands
/// that read while the file does not load ([`config::in_force`]).
fn keep_in_force(config: &Config, path: &Path) {
    match std::fs::read_to_string(path) {
        Ok(text) => config::in_force::record(config, path, &text),
        Err(e) => log::warn!(
            "cannot read {} again to keep a copy of the config in force ({e})",
            path.display()
        ),
    }
}

/// Abandons `cancel` (long hashing, copying, rendering and hooks) once
/// `grace` has passed: the bundle then in hand stays in work/ and is
/// resumed at the next start.
fn abandon_after(grace: Duration, cancel: Cancel) {
    std::thread::spawn(move || {
        std::thread::sleep(grace);
        cancel.abandon();
        crate::render::child::kill_all();
    });
}

fn create_spools(config: &Config) -> Result<(), AgentError> {
    for p in &config.pipelines {
        Spool::of(config, p)
            .create()
            .map_err(|e| AgentError::Spool(e.to_string()))?;
    }
    Ok(())
}

fn run_once(config: &Config, process: &ProcessState) -> bool {
    let tally = Arc::new(Tally::default());
    tally.metrics.configure(config);
    let cancel = Cancel::new();
    // First SIGTERM/SIGINT: finish the bundles in hand and stop; second: exit.
    let finish = cancel.finish_flag();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let registered = signal_hook::flag::register_conditional_shutdown(
            signal,
            crate::runtime::exit::EXIT_INTERRUPTED.into(),
            finish.clone(),
        )
        .and_then(|_| signal_hook::flag::register(signal, finish.clone()));
        if let Err(e) = registered {
            log::warn!("cannot install a handler for signal {signal}: {e}");
        }
    }
    {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            while !cancel.finishing() {
                std::thread::sleep(Duration::from_millis(50));
            }
            abandon_after(STOP_GRACE, cancel);
        });
    }
    // The senders outlive the workers: nobody wakes a --once worker, but a
    // disconnected channel would read as "stop" during a retry backoff.
    let mut senders = Vec::new();
    std::thread::scope(|scope| {
        for p in &config.pipelines {
            let worker = Worker::new(config, p, tally.clone(), cancel.clone(), true, process);
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
    let incomplete = tally.incomplete.load(Ordering::Relaxed);
    let unclaimed = tally.unclaimed.load(Ordering::Relaxed);
    let skipped = tally.skipped.load(Ordering::Relaxed);
    let left = tally.left.load(Ordering::Relaxed);
    let summary = once_summary(
        tally.done.load(Ordering::Relaxed),
        failed,
        incomplete,
        unclaimed,
        skipped,
        left,
    );
    let ok = failed == 0 && skipped == 0 && incomplete == 0 && unclaimed == 0 && left == 0;
    if ok {
        log::info!("{summary}");
    } else {
        log::warn!("{summary}");
    }
    ok
}

/// The last line of `agent --once`.
fn once_summary(
    done: usize,
    failed: usize,
    incomplete: usize,
    unclaimed: usize,
    skipped: usize,
    left: usize,
) -> String {
    let mut s = format!("agent --once finished: {done} done, {failed} failed");
    if left > 0 {
        s.push_str(&format!(", {left} could not be filed and stay in work/"));
    }
    if incomplete > 0 {
        s.push_str(&format!(", {incomplete} incomplete left in the inbox"));
    }
    if unclaimed > 0 {
        s.push_str(&format!(
            ", {unclaimed} could not be claimed and stay in the inbox (the log says why)"
        ));
    }
    if skipped > 0 {
        let pipelines = if skipped == 1 {
            "pipeline"
        } else {
            "pipelines"
        };
        let it = if skipped == 1 { "it" } else { "them" };
        s.push_str(&format!(
            ", {skipped} {pipelines} skipped (another agent serves {it})"
        ));
    }
    s
}

/// A running set of pipeline threads plus their watcher.
struct Running {
    senders: Vec<Sender<Wake>>,
    threads: Vec<JoinHandle<()>>,
    /// Of these threads: finished when they stop (a reload, or the end),
    /// abandoned with the agent's.
    cancel: Cancel,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl Running {
    fn start(
        config: &Config,
        metrics: &Arc<Metrics>,
        cancel: Cancel,
        process: &ProcessState,
    ) -> Running {
        metrics.configure(config);
        let tally = Arc::new(Tally {
            metrics: metrics.clone(),
            ..Tally::default()
        });
        let channels: Vec<_> = config
            .pipelines
            .iter()
            .map(|_| crossbeam_channel::unbounded())
            .collect();
        // The watch comes before each pipeline's first scan: a bundle that
        // arrives before the watch is in place is found by that scan, and
        // one that arrives after it wakes the pipeline.
        let routes = config
            .pipelines
            .iter()
            .zip(&channels)
            .filter(|(p, _)| p.intake.is_none())
            .map(|(p, (tx, _))| (p.inbox.clone(), tx.clone()))
            .collect();
        let watcher = start_watcher(routes);
        let mut senders = Vec::new();
        let mut threads = Vec::new();
        for (p, (tx, rx)) in config.pipelines.iter().zip(channels) {
            let worker = Worker::new(config, p, tally.clone(), cancel.clone(), false, process);
            let name = format!("pipeline-{}", p.id);
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || worker.run(&rx))
                .expect("spawning a pipeline thread");
            senders.push(tx);
            threads.push(thread);
        }
        Running {
            senders,
            threads,
            cancel,
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
        self.cancel.finish();
        for tx in &self.senders {
            let _ = tx.send(Wake::Stop);
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// What the main thread hears.
enum Control {
    Terminate,
    Reload,
}

fn run_forever(
    config_path: &Path,
    mut config: Config,
    process: &ProcessState,
) -> Result<bool, AgentError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| AgentError::Start(format!("cannot install signal handlers: {e}")))?;
    let (control_tx, control_rx) = crossbeam_channel::unbounded();
    // The agent's stop; each set of pipeline threads finishes on a child
    // of its own (a reload finishes one set and starts another).
    let cancel = Cancel::new();
    {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    let _ = control_tx.send(Control::Reload);
                } else if cancel.finishing() {
                    log::warn!("second stop signal: exiting at once");
                    std::process::exit(crate::runtime::exit::EXIT_INTERRUPTED.into());
                } else {
                    cancel.finish();
                    abandon_after(STOP_GRACE, cancel.clone());
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
    let mut running = Running::start(&config, &metrics, cancel.child(), process);
    let mut maintenance = Maintenance::start(&config, &metrics, process);
    let notifier = Arc::new(Notifier::from_env());
    let configured = Arc::new(AtomicUsize::new(config.pipelines.len()));
    tell_ready(&notifier, &metrics, &configured);
    start_notify_thread(&notifier, &metrics, &configured);
    let rescan = |config: &Config| config.agent.rescan_interval;
    loop {
        match control_rx.recv_timeout(rescan(&config)) {
            Ok(Control::Terminate) => {
                log::info!("stop requested: finishing the bundles in hand");
                notifier.send("STOPPING=1\nSTATUS=stopping: finishing the bundles in hand");
                maintenance.stop();
                running.stop();
                log::info!("agent stopped");
                return Ok(true);
            }
            Ok(Control::Reload) => {
                // systemd (Type=notify-reload, or `systemctl status`) sees
                // the reload start and end, refused or not.
                notifier.send(&format!(
                    "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the config",
                    sd_notify::monotonic_usec()
                ));
                let loaded = config::load(config_path).map_err(|e| e.to_string());
                let new = loaded.and_then(|new| {
                    create_spools(&new).map_err(|e| e.to_string())?;
                    Ok(new)
                });
                match new {
                    Ok(new) => {
                        log::info!("reloading config {}", config_path.display());
                        maintenance.stop();
                        running.stop();
                        config = new;
                        running = Running::start(&config, &metrics, cancel.child(), process);
                        maintenance = Maintenance::start(&config, &metrics, process);
                        configured.store(config.pipelines.len(), Ordering::SeqCst);
                        metrics.set_reload_refused(None);
                        keep_in_force(&config, config_path);
                        tell_ready(&notifier, &metrics, &configured);
                        log::info!("config reloaded: {} pipeline(s)", config.pipelines.len());
                    }
                    Err(e) => {
                        log::error!("config reload refused, keeping the old config: {e}");
                        config::in_force::record_refusal(&config, &e);
                        metrics.set_reload_refused(Some(e));
                        tell_ready(&notifier, &metrics, &configured);
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                log::debug!(
                    "rescan_interval ({}) passed: scanning every inbox",
                    config::format_duration(rescan(&config))
                );
                running.wake_all();
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(true),
        }
    }
}

/// The `STATUS=` text of this moment.
fn notify_status(metrics: &Metrics, configured: &AtomicUsize) -> String {
    let (done, failed) = metrics.bundle_totals();
    let line = sd_notify::status_line(
        SERVING.load(Ordering::SeqCst),
        configured.load(Ordering::SeqCst),
        done,
        failed,
    );
    match metrics.reload_refused() {
        // Until a reload succeeds, `systemctl status` says the running
        // config is not the file's.
        Some(why) => format!("config reload refused, serving the old config ({why}); {line}"),
        None => line,
    }
}

/// Tells systemd the agent serves, after giving the pipeline threads a
/// moment to take their locks (so the first `STATUS=` counts them).
fn tell_ready(notifier: &Notifier, metrics: &Metrics, configured: &AtomicUsize) {
    if !notifier.enabled() {
        return;
    }
    let started = std::time::Instant::now();
    while SERVING.load(Ordering::SeqCst) < configured.load(Ordering::SeqCst)
        && started.elapsed() < READY_WAIT
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    notifier.send(&format!(
        "READY=1\nSTATUS={}",
        notify_status(metrics, configured)
    ));
}

/// Sends `WATCHDOG=1` every half `WATCHDOG_USEC` and refreshes `STATUS=`
/// when it changed, for as long as the process lives.
fn start_notify_thread(
    notifier: &Arc<Notifier>,
    metrics: &Arc<Metrics>,
    configured: &Arc<AtomicUsize>,
) {
    if !notifier.enabled() {
        return;
    }
    let tick = notifier
        .watchdog()
        .map_or(NOTIFY_STATUS_EVERY, |w| w.min(NOTIFY_STATUS_EVERY));
    let (notifier, metrics, configured) = (notifier.clone(), metrics.clone(), configured.clone());
    let spawned = std::thread::Builder::new()
        .name("notify".into())
        .spawn(move || {
            let mut last = notify_status(&metrics, &configured);
            loop {
                std::thread::sleep(tick);
                if notifier.watchdog().is_some() {
                    notifier.send("WATCHDOG=1");
                }
                let now = notify_status(&metrics, &configured);
                if now != last {
                    notifier.send(&format!("STATUS={now}"));
                    last = now;
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the systemd notification thread: {e}");
    }
}
