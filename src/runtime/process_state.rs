//! What one process keeps across the publications and commands it runs:
//! the catalogs and root tops it remembers, its S3 clients and the servers
//! that passed the conformance check, the count of cores, the threads
//! that fsync and the markdown renderers' child processes. One
//! [`ProcessState`] is made where the process starts (the cli's entry,
//! which the agent runs under) and passed down by reference to whatever
//! reaches them; a test makes its own, so that no test sees another's
//! caches (docs/architecture.md, "What a process keeps").
//!
//! Still process-wide on purpose, and so not here: the counters that make
//! names unique (`replace_file`, `s3`), the agent's count of spool folders
//! served (`agent`), the failpoint hooks of the test build (`failpoint`),
//! the catalog's fingerprint keys (`catalog`) and the per-thread state of
//! `progress`, `interrupt` (the stop the agent entered) and `s3::failure`.
//! The agent makes its stop (`interrupt::Cancel`) and passes it down. Held outside it as well: the threads that
//! close replaced files (`replace_file`), which every write through
//! `storage` reaches.

use crate::backend::local::catalog_cache::CatalogCache;
use crate::config::S3Location;
use crate::render::child;
use crate::runtime::workers::{PerCore, SyncPool};
use crate::s3::{self, S3Root, conformance};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// The caches of one process. Cloning it is cheap and shares them (an
/// agent's worker threads and the destinations they open each keep one);
/// [`ProcessState::default`] makes a new, empty one.
#[derive(Clone, Default)]
pub struct ProcessState(Arc<Held>);

#[derive(Default)]
struct Held {
    catalog_cache: CatalogCache,
    /// The threads that fsync many files at once.
    syncs: SyncPool,
    /// The renderer child processes.
    renderers: child::Pool,
    /// The cores work may run on, asked once ([`PerCore::new`]).
    cores: OnceLock<usize>,
    /// One client per s3 location (and region), opened on first use.
    s3_roots: Mutex<HashMap<String, Arc<S3Root>>>,
    passed: conformance::Passed,
}

impl fmt::Debug for ProcessState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProcessState")
    }
}

impl ProcessState {
    /// The catalogs and root tops of the local roots this process
    /// published into.
    pub fn catalog_cache(&self) -> &CatalogCache {
        &self.0.catalog_cache
    }

    /// One thread per core (at most four) for each batch of work: the
    /// cores are counted once per process (the answer reads several
    /// cgroup files).
    pub fn per_core(&self) -> PerCore {
        PerCore(*self.0.cores.get_or_init(|| PerCore::new().0))
    }

    /// The threads that fsync many files at once (started on first use).
    pub fn syncs(&self) -> &SyncPool {
        &self.0.syncs
    }

    /// The markdown renderers' child processes (started on first use;
    /// [`child::Pool::stop_idle`] ends the idle ones).
    pub fn renderers(&self) -> &child::Pool {
        &self.0.renderers
    }

    /// The process's one client for `location` (opened on first use, with
    /// credentials from the environment), so that a long-running agent
    /// keeps its connections and its runtime across publications instead
    /// of setting them up for every bundle; every client shares the
    /// servers that passed the conformance check.
    pub fn s3_root(&self, location: &S3Location) -> s3::Result<Arc<S3Root>> {
        let key = format!("{location} {}", location.region);
        let mut open = self
            .0
            .s3_roots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(root) = open.get(&key) {
            return Ok(Arc::clone(root));
        }
        let root = Arc::new(S3Root::open(location)?.sharing(&self.0.passed));
        open.insert(key, Arc::clone(&root));
        Ok(root)
    }
}
