//! Crash points for the reliability tests.
//!
//! In debug builds (the ones `cargo test` runs), setting
//! `DISTRIBUTOR_FAILPOINT=<name>[:<n>]` makes the process abort, with no
//! cleanup at all, the `n`-th time (default: first) it reaches the point
//! `name`; `<name>:<n>:stop` makes it stop itself there instead (SIGSTOP),
//! so that a test can act while it waits at that point and then let it go
//! on (SIGCONT). Release builds compile every call to nothing. The names are
//! listed in [`POINTS`]; docs/reliability.md explains each.

/// Every crash point: the agent's claim, then a local root's in the order
/// a publication reaches them (a release destination's last), then the driver's (every backend), then an
/// s3 destination's, then the agent's record of a commit, then the
/// spool's.
pub const POINTS: &[&str] = &[
    "agent.claimed",
    "publish.after_journal",
    "publish.after_clear",
    "publish.after_stage",
    "publish.after_rename",
    "publish.before_catalog",
    "publish.after_catalog",
    "publish.after_delete",
    "releases.after_links",
    "releases.after_complete",
    "releases.after_switch",
    "releases.after_retain",
    "publish.staged",
    "publish.committed",
    "s3.after_upload",
    "s3.after_swap",
    "agent.committing",
    "agent.committed",
    "agent.recorded",
    "spool.after_result",
    "spool.after_move",
    "intake.held",
    "intake.probed",
    "intake.fetched",
    "intake.before_fence",
    "intake.result_written",
    "intake.renew",
];

/// Aborts the process here if the environment asks for it.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Test hooks that abort the whole process, read from its environment:
    // process-wide on purpose (docs/architecture.md, "What a process
    // keeps").
    static TARGET: Mutex<Option<Option<(String, u64, bool)>>> = Mutex::new(None);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut target = TARGET.lock().unwrap_or_else(|e| e.into_inner());
    let wanted = target.get_or_insert_with(|| {
        let spec = std::env::var("DISTRIBUTOR_FAILPOINT").ok()?;
        let (spec, stop) = match spec.strip_suffix(":stop") {
            Some(spec) => (spec.to_owned(), true),
            None => (spec, false),
        };
        let (point, n) = match spec.split_once(':') {
            Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some((point, n, stop))
    });
    if let Some((point, n, stop)) = wanted
        && point == name
        && COUNT.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        if *stop {
            eprintln!("failpoint {name} reached: stopping until SIGCONT");
            // SIGSTOP to this very thread, not to the process: a signal
            // sent to the process is taken by another thread (the main
            // one), and this thread would go on, even past the point, until
            // that one had stopped the others; sent to itself, this thread
            // stops before it returns from the call (and the whole process
            // with it, as a stop always does).
            // SAFETY: pthread_self() is the calling thread, alive here.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGSTOP) };
            return;
        }
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// Release builds: nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) {}
