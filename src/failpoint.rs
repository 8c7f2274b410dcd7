//! Crash points for the reliability tests.
//!
//! In debug builds (the ones `cargo test` runs), setting
//! `DISTRIBUTOR_FAILPOINT=<name>[:<n>]` makes the process abort, with no
//! cleanup at all, the `n`-th time (default: first) it reaches the point
//! `name`. Release builds compile every call to nothing. The names are
//! listed in [`POINTS`]; docs/reliability.md explains each.

/// Every crash point: a local root's in the order a publication reaches
/// them, then the driver's (every backend), then an s3 destination's.
pub const POINTS: &[&str] = &[
    "publish.after_journal",
    "publish.after_clear",
    "publish.after_stage",
    "publish.after_rename",
    "publish.after_delete",
    "publish.before_catalog",
    "publish.after_catalog",
    "publish.staged",
    "publish.committed",
    "s3.after_upload",
    "s3.after_swap",
    "spool.after_result",
    "spool.after_move",
];

/// Aborts the process here if the environment asks for it.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    static TARGET: Mutex<Option<Option<(String, u64)>>> = Mutex::new(None);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut target = TARGET.lock().unwrap_or_else(|e| e.into_inner());
    let wanted = target.get_or_insert_with(|| {
        let spec = std::env::var("DISTRIBUTOR_FAILPOINT").ok()?;
        let (point, n) = match spec.split_once(':') {
            Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        Some((point, n))
    });
    if let Some((point, n)) = wanted
        && point == name
        && COUNT.fetch_add(1, Ordering::SeqCst) + 1 == *n
    {
        eprintln!("failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// Release builds: nothing.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn hit(_name: &str) {}
