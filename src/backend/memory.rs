//! An in-memory destination root for the driver's unit tests, in the
//! manner of object_store's `memory.rs`: a map of paths to bytes plus a
//! catalog, failures injected per call, and a log of calls, so that the
//! driver's rules (rollback order, commit order, batch isolation, rebase)
//! are table tests over it. Disks and servers test what only they can show.
//!
//! A test registers a root by its destination's path ([`Memory::register`]);
//! [`super::open`] then opens that destination as this root instead of its
//! configured backend. A commit makes its writes visible one by one, then
//! the catalog, then its deletions (the order an s3 commit follows), each
//! step logged; a commit whose catalog version moved since the root was
//! opened lost a race to another writer ([`Memory::lose_race_to`]) and is
//! re-applied on the winner's catalog when the root may rebase and the
//! change still holds there. Test-only: it never touches the disk but to
//! read the bundle's files.
//!
//! A bundle may be made unreadable too ([`fail_reading`]): the driver's
//! reads of it (preparing it, hashing it before anything is written) then
//! fail, as a flaky disk under the spool would make them.

use super::{Capabilities, Change, CommitTally, PublishRoot, StagedAs, rebase};
use crate::bundle::BundleError;
use crate::catalog::{Catalog, STATE_FILE, State};
use crate::config::{Destination, Workflow};
use crate::plan::{self, Desired, Entry, Listing, Plan};
use crate::publish::{Error, Options};
use crate::runtime::workers::Workers;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use time::OffsetDateTime;

/// The calls made to a root that a failure can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Op {
    Listing,
    Stage,
    MakeDurable,
    Commit,
}

/// An injected failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A full disk (a flaky one, reading a bundle): tried again later.
    Transient,
    /// An error no retry helps.
    Permanent,
}

impl Failure {
    /// The error of a failed call: `transient` when transient.
    fn error(self, transient: i32) -> io::Error {
        match self {
            Failure::Transient => io::Error::from_raw_os_error(transient),
            Failure::Permanent => io::Error::other("injected permanent failure"),
        }
    }
}

/// What a root holds: its files by path, and its catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) files: BTreeMap<String, Vec<u8>>,
    pub(crate) catalog: Option<Catalog>,
}

/// The calls of every root of a test, in order, each `<label>: <call>`.
pub(crate) type Log = Arc<Mutex<Vec<String>>>;

struct Store {
    label: String,
    capabilities: Capabilities,
    stored: Stored,
    /// Bumped by every catalog write.
    version: u64,
    /// Fail the `n`-th call (from 1, since the root was registered) of
    /// an op.
    faults: Vec<(Op, usize, Failure)>,
    calls: BTreeMap<Op, usize>,
    /// What another writer commits just before the next commit.
    race: Option<Stored>,
    log: Log,
}

impl Store {
    fn log(&self, call: impl std::fmt::Display) {
        lock(&self.log).push(format!("{}: {call}", self.label));
    }

    /// Counts a call of `op`, and fails it when asked to.
    fn call(&mut self, op: Op) -> Result<(), Error> {
        let n = self.calls.entry(op).or_default();
        *n += 1;
        let n = *n;
        let Some(&(_, _, failure)) = self.faults.iter().find(|f| f.0 == op && f.1 == n) else {
            return Ok(());
        };
        self.log(format_args!("{op:?} fails"));
        Err(Error::Write {
            path: PathBuf::from(&self.label),
            source: failure.error(libc::ENOSPC),
        })
    }
}

/// A registered memory root, shared by the test and the driver.
#[derive(Clone)]
pub(crate) struct Memory(Arc<Mutex<Store>>);

/// The memory roots by destination path.
static ROOTS: Mutex<BTreeMap<PathBuf, Memory>> = Mutex::new(BTreeMap::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Memory {
    /// Makes `d` (by its path, which no other test uses) open as an empty
    /// memory root named `label`, with `capabilities` (`missing` is never
    /// set: a memory root exists), logging into `log`.
    pub(crate) fn register(
        d: &Destination,
        label: &str,
        capabilities: Capabilities,
        log: &Log,
    ) -> Memory {
        let memory = Memory(Arc::new(Mutex::new(Store {
            label: label.to_owned(),
            capabilities: Capabilities {
                missing: false,
                ..capabilities
            },
            stored: Stored::default(),
            version: 0,
            faults: Vec::new(),
            calls: BTreeMap::new(),
            race: None,
            log: log.clone(),
        })));
        lock(&ROOTS).insert(d.root.clone(), memory.clone());
        memory
    }

    /// Fails the `nth` call (from 1) of `op` from now on with `failure`.
    pub(crate) fn fail(&self, op: Op, nth: usize, failure: Failure) {
        let mut store = lock(&self.0);
        let made = store.calls.get(&op).copied().unwrap_or(0);
        store.faults.push((op, made + nth, failure));
    }

    /// Has another writer commit `winner` just before the next commit,
    /// after this root was opened: that commit loses the compare-and-swap.
    pub(crate) fn lose_race_to(&self, winner: Stored) {
        lock(&self.0).race = Some(winner);
    }

    /// What the root holds now.
    pub(crate) fn stored(&self) -> Stored {
        lock(&self.0).stored.clone()
    }

    /// Sets what the root holds (a catalog version of its own).
    pub(crate) fn hold(&self, stored: Stored) {
        let mut store = lock(&self.0);
        store.stored = stored;
        store.version += 1;
    }
}

/// A bundle made unreadable ([`fail_reading`]): the reads the driver made
/// of it, and the one that fails.
struct Unreadable {
    label: String,
    reads: usize,
    fails: (usize, Failure),
    log: Log,
}

/// The unreadable bundles by folder.
static UNREADABLE: Mutex<BTreeMap<PathBuf, Unreadable>> = Mutex::new(BTreeMap::new());

/// Makes the `nth` read (from 1) the driver makes of the bundle in `dir`
/// fail with `failure` (`EIO` when transient). Every read is logged into
/// `log` as `<label>: read`, the failing one as `<label>: read fails`.
pub(crate) fn fail_reading(dir: &Path, label: &str, nth: usize, failure: Failure, log: &Log) {
    let unreadable = Unreadable {
        label: label.to_owned(),
        reads: 0,
        fails: (nth, failure),
        log: log.clone(),
    };
    lock(&UNREADABLE).insert(dir.to_path_buf(), unreadable);
}

/// Counts a read of the bundle in `dir` by the driver (`publish` calls it
/// in unit tests before it reads a bundle), failing it when asked to
/// ([`fail_reading`]).
pub(crate) fn read_bundle(dir: &Path) -> Result<(), BundleError> {
    let mut all = lock(&UNREADABLE);
    let Some(bundle) = all.get_mut(dir) else {
        return Ok(());
    };
    bundle.reads += 1;
    let (nth, failure) = bundle.fails;
    let failed = bundle.reads == nth;
    let call = if failed { "read fails" } else { "read" };
    lock(&bundle.log).push(format!("{}: {call}", bundle.label));
    if !failed {
        return Ok(());
    }
    let e = failure.error(libc::EIO);
    Err(BundleError::Unreadable {
        path: dir.to_path_buf(),
        message: format!("cannot read: {e}"),
        io: Some(e),
    })
}

/// Whether `d` is a registered memory root.
pub(super) fn registered(d: &Destination) -> bool {
    lock(&ROOTS).contains_key(&d.root)
}

/// `d` opened as its memory root, when it is one.
pub(super) fn open(d: &Destination) -> Option<Result<Box<dyn PublishRoot>, Error>> {
    let memory = lock(&ROOTS).get(&d.root)?.clone();
    let (state, version) = {
        let store = lock(&memory.0);
        store.log("open");
        let state = match &store.stored.catalog {
            Some(c) => State::Catalog(c.clone()),
            None => State::Absent,
        };
        (state, store.version)
    };
    Some(Ok(Box::new(MemoryRoot {
        memory,
        workflow: d.workflow,
        state: Some(state),
        read_version: version,
        staged: Vec::new(),
    })))
}

/// A memory root opened for one publication.
struct MemoryRoot {
    memory: Memory,
    workflow: Workflow,
    state: Option<State>,
    /// The catalog version the commit swaps.
    read_version: u64,
    /// The bytes of each write of the staged change, in its order.
    staged: Vec<Vec<u8>>,
}

impl MemoryRoot {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.memory.0)
    }
}

/// The bytes of one planned write: held by the publication, or the bundle
/// file, which must match its manifest (else the bundle's own error).
fn bytes_of(w: &super::Write<'_>) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    if let Some(content) = w.in_memory {
        content
            .reader()
            .read_to_end(&mut bytes)
            .map_err(Error::Prepare)?;
        return Ok(bytes);
    }
    let read = crate::bundle::open_listed(&w.bundle.dir, &w.d.bundle_path)
        .map_err(Error::Bundle)
        .and_then(|mut f| f.read_to_end(&mut bytes).map_err(Error::Prepare));
    let matches = read.is_ok()
        && w.d.sha256 == crate::fs::hashing::hash_bytes(&bytes).sha256
        && bytes.len() as u64 == w.d.size;
    if matches {
        return Ok(bytes);
    }
    let listed = (w.bundle.manifest.files.iter())
        .find(|f| f.path == w.d.bundle_path)
        .expect("a write from the bundle is listed");
    match crate::bundle::verify_files(&w.bundle.dir, &[listed], &crate::runtime::workers::InOrder) {
        Err(e) => Err(Error::Bundle(e)),
        Ok(()) => read.map(|_| bytes),
    }
}

impl PublishRoot for MemoryRoot {
    fn label(&self) -> String {
        self.store().label.clone()
    }

    fn capabilities(&self) -> Capabilities {
        self.store().capabilities
    }

    fn take_state(&mut self) -> State {
        self.state.take().unwrap_or(State::Absent)
    }

    fn create(&mut self, _options: &Options, _now: OffsetDateTime) -> Result<(), Error> {
        Ok(())
    }

    fn look_ahead(
        &mut self,
        _state: &State,
        _bundles: &[&[Desired]],
        _every_key: bool,
    ) -> Result<(), Error> {
        Ok(())
    }

    fn listing(
        &self,
        desired: &[Desired],
        state: &State,
        touched: &BTreeMap<String, Entry>,
        force: bool,
    ) -> Result<Listing, Error> {
        let mut store = self.store();
        store.call(Op::Listing)?;
        let files = &store.stored.files;
        let entries = desired
            .iter()
            .filter_map(|d| {
                let path = d.path.as_str();
                let entry = match touched.get(path) {
                    Some(e) => *e,
                    None => Entry::File {
                        size: files.get(path)?.len() as u64,
                    },
                };
                Some((path.to_owned(), entry))
            })
            .collect();
        let mut top_level: Vec<String> = Vec::new();
        if plan::needs_top_level(state, force) {
            top_level = files
                .keys()
                .map(|p| p.split('/').next().unwrap_or_default().to_owned())
                .collect();
            top_level.dedup();
        }
        let all = if plan::needs_walk(state, self.workflow, force) {
            (files.iter())
                .map(|(p, b)| {
                    let size = b.len() as u64;
                    (p.clone(), Entry::File { size })
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Listing {
            root_exists: true,
            top_level,
            entries,
            all,
        })
    }

    fn rewrite(
        &self,
        _desired: &[Desired],
        _touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn refusal(&self, _plan: &Plan, _state: &State, _force: bool) -> Option<Plan> {
        None
    }

    fn kept(
        &self,
        _plan: &Plan,
        _state: &State,
        _touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn stage(
        &mut self,
        change: &Change<'_>,
        _workers: &dyn Workers,
        _cancel: &crate::runtime::interrupt::Cancel,
    ) -> Result<Vec<StagedAs>, Error> {
        {
            let mut store = self.store();
            store.log("stage");
            store.call(Op::Stage)?;
        }
        let staged = change
            .writes
            .iter()
            .map(bytes_of)
            .collect::<Result<Vec<_>, _>>()?;
        let store = self.store();
        let found = (change.writes.iter().zip(&staged))
            .map(|(w, bytes)| {
                let same = store.stored.files.get(w.d.path.as_str()) == Some(bytes);
                if same && change.clear_first.is_empty() {
                    StagedAs::Unchanged
                } else {
                    StagedAs::Written
                }
            })
            .collect();
        drop(store);
        self.staged = staged;
        Ok(found)
    }

    fn make_durable(&mut self) -> Result<(), Error> {
        let mut store = self.store();
        store.log("make durable");
        store.call(Op::MakeDurable)
    }

    fn commit(&mut self, change: Change<'_>) -> Result<CommitTally, Error> {
        let staged = std::mem::take(&mut self.staged);
        let read_version = self.read_version;
        let mut store = self.store();
        store.log("commit");
        store.call(Op::Commit)?;
        if let Some(winner) = store.race.take() {
            store.log("another writer commits");
            store.stored = winner;
            store.version += 1;
        }
        let mut catalog = change.catalog;
        let mut rebases = 0;
        if store.version != read_version {
            let latest = match &store.stored.catalog {
                Some(c) => State::Catalog(c.clone()),
                None => State::Absent,
            };
            let rebased = (change.rebase.as_ref())
                .filter(|_| store.capabilities.may_rebase)
                .and_then(|r| rebase::onto(r, &latest));
            let Some(rebased) = rebased else {
                store.log("lost the race");
                return Err(Error::Store(crate::s3::Error::Conflict {
                    root: store.label.clone(),
                    key: STATE_FILE.to_owned(),
                }));
            };
            store.log("rebased");
            catalog = rebased;
            rebases = 1;
        }
        for gone in &change.clear_first {
            store.log(format_args!("clear {gone}"));
            let below = format!("{gone}/");
            (store.stored.files).retain(|p, _| p != gone && !p.starts_with(&below));
        }
        for (w, bytes) in change.writes.iter().zip(staged) {
            let path = w.d.path.as_str();
            if store.stored.files.get(path) != Some(&bytes) {
                store.log(format_args!("put {path}"));
                store.stored.files.insert(path.to_owned(), bytes);
            }
        }
        store.log("catalog");
        store.stored.catalog = Some(catalog);
        store.version += 1;
        for gone in &change.deletes {
            store.log(format_args!("delete {gone}"));
            store.stored.files.remove(gone);
        }
        Ok(CommitTally {
            rebases,
            ..CommitTally::default()
        })
    }

    fn roll_back(&self) -> Result<(), io::Error> {
        self.store().log("roll back");
        Ok(())
    }
}
