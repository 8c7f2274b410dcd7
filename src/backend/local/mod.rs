//! A local destination root as a [`PublishRoot`] and a [`MaintainRoot`]:
//! opened by taking its lock
//! (docs/contract.md §5) and settling any journal a crash left; written by
//! the engine in `stage` (journal, temporary files, barriers, renames,
//! catalog last); rolled back from its journal. Maintenance opens it the
//! same way, but a read-only command creates nothing (no lock file, no
//! recovery) and every state file is refused untouched unless it is a
//! catalog (docs/maintenance.md); `prune` deletes through the same engine.

use super::{
    Access, Capabilities, Change, CommitTally, Doing, Fault, MaintainRoot, PublishRoot, StagedAs,
    io_fault, usable,
};
use crate::backend::local::catalog_cache::CatalogCache;
use crate::backend::local::hash_cache::HashCache;
use crate::catalog::Sha256;
use crate::catalog::{Catalog, STATE_FILE, State};
use crate::config::{Destination, Workflow};
use crate::fs::hashing::Hashed;
use crate::fs::lock::{self, RootLock};
use crate::fs::storage::Root;
use crate::plan::{self, Desired, Entry, Listing, Plan};
use crate::publish::{Error, Options};
use crate::report::Stage;
use crate::runtime::process_state::ProcessState;
use crate::runtime::workers::{InOrder, Workers};
use journal::JOURNAL_FILE;
use releases::{Building, Current, Opened, Releases};
use stage::{CommitFailure, Failure, StagedRoot, Step, probe};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::time::Duration;
use time::OffsetDateTime;

/// `d`'s catalog file, open, when it is large enough to be worth parsing
/// while the bundle is inspected ([`journal::worth_reading_ahead`]).
pub(super) fn worth_reading_ahead(
    d: &Destination,
    process: &ProcessState,
) -> Option<std::fs::File> {
    let root = Root::open(&d.root).ok()??;
    journal::worth_reading_ahead(&root, process.catalog_cache())
}

pub(crate) mod catalog_cache;
pub(crate) mod hash_cache;
pub(crate) mod journal;
pub(crate) mod releases;
mod stage;

pub(super) struct LocalRoot {
    path: PathBuf,
    workflow: Workflow,
    /// `None` while the root does not exist.
    root: Option<Root>,
    _lock: Option<RootLock>,
    /// As opened, until taken ([`PublishRoot::take_state`],
    /// [`MaintainRoot::read_catalog`]).
    state: Option<State>,
    staged: Option<StagedRoot>,
    /// Where the root's catalog is remembered.
    process: ProcessState,
    /// `releases`: how many to keep (docs/contract.md §20.2).
    keep: Option<u32>,
    /// The releases, their folder locked, when the destination has them
    /// (a dry run or a read-only command: once their folder exists).
    releases: Option<Releases>,
    /// The release this publication builds, once it started one; the
    /// root is then that release's folder.
    building: Option<Building>,
    /// When the root was opened (a release's name).
    opened_at: OffsetDateTime,
}

impl LocalRoot {
    /// `d`'s root, not opened yet: no lock, nothing read.
    fn unopened(d: &Destination, process: &ProcessState) -> LocalRoot {
        LocalRoot {
            path: d.root.clone(),
            workflow: d.workflow,
            root: None,
            _lock: None,
            state: Some(State::Absent),
            staged: None,
            process: process.clone(),
            keep: d.releases,
            releases: None,
            building: None,
            opened_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    /// Opens the releases of a destination that has them (creating their
    /// folder and taking its lock when `write`), and aims at the current
    /// release; a plain root or none stays at `path`.
    fn open_releases(&mut self, write: bool, timeout: Duration) -> Result<(), Opened> {
        if self.keep.is_none() {
            refuse_release_link(&self.path)?;
            return Ok(());
        }
        self.releases = Releases::open(&self.path, write, timeout)?;
        let Some(rel) = &self.releases else {
            return Ok(());
        };
        match &rel.current {
            Current::Release(name) => self.path = rel.path_of(name),
            Current::Nothing => {
                // Built from nothing, the next release would drop every
                // output the missing link's release held.
                if let Some(newest) = rel.names()?.first() {
                    return Err(Opened::Io(io::Error::other(format!(
                        "{} is missing, but {} holds releases: point the link at one with `distributor rollback --to {newest}` (the newest), then publish again",
                        self.path.display(),
                        releases::folder_of(&self.path).display()
                    ))));
                }
            }
            // (`Releases::open` refuses a link to a missing release.)
            Current::Plain | Current::Missing(_) => {}
        }
        Ok(())
    }

    /// Whether the root is a release, whose lock is the releases folder's.
    fn in_release(&self) -> bool {
        self.releases
            .as_ref()
            .is_some_and(|r| matches!(r.current, Current::Release(_)))
    }

    /// Starts the next release from the current root (converting a plain
    /// root first: its content as it is becomes a release of its own), and
    /// aims the root at it.
    fn start_release(&mut self) -> io::Result<()> {
        let Some(rel) = &self.releases else {
            return Ok(());
        };
        let mut from = self.root.take();
        if rel.current == Current::Plain {
            let (first, built) = rel.build(self.opened_at, from.as_ref())?;
            rel.complete(&first, &built)?;
            from = Some(rel.open_release(&first.name)?);
        }
        let (building, root) = rel.build(self.opened_at, from.as_ref())?;
        self.path = root.path().to_owned();
        self.root = Some(root);
        self.building = Some(building);
        Ok(())
    }
}

/// The planned writes of `change` whose files in `current` (the release
/// the next one is linked from) the record of looks there vouches for:
/// read before linking gives every file a new change time. Their indexes.
fn vouched_before_linking(current: &Root, change: &Change<'_>) -> Vec<usize> {
    let same = |w: &&crate::backend::Write<'_>| {
        stage::records_same(change.replaced(w.d.path.as_str()), w.d)
    };
    if change.writes.iter().filter(same).count() < stage::BARRIER_FROM {
        return Vec::new();
    }
    let seen = HashCache::read(current);
    (change.writes.iter().enumerate())
        .filter(|(_, w)| same(w))
        .filter(|(_, w)| {
            matches!(current.look(w.d.path.as_str()), Ok(Some(look))
                if look.size == w.d.size && seen.vouches(w.d.path.as_str(), &w.d.sha256, &look))
        })
        .map(|(i, _)| i)
        .collect()
}

/// A record of looks for the new release `root` that vouches for the
/// `vouched` writes of `change` as their hard links look now.
fn carry_looks(root: &Root, change: &Change<'_>, vouched: &[usize]) -> HashCache {
    let mut carried = HashCache::default();
    for &i in vouched {
        let d = change.writes[i].d;
        if let Ok(Some(look)) = root.look(d.path.as_str()) {
            carried.carry(d.path.as_str(), &look, &d.sha256);
        }
    }
    carried
}

/// Records the looks of a release's `outputs` (path, size, SHA-256) in its
/// `.distributor-seen`, once their last change of time is settled, so that
/// the next release knows them without reading them. A cache: a failure is
/// logged.
fn record_release_looks(root: &Root, outputs: &[(String, u64, Sha256)]) {
    std::thread::sleep(crate::fs::storage::SETTLE);
    let before = std::time::SystemTime::now();
    let lines = outputs
        .iter()
        .filter_map(|(path, size, sha256)| match root.look(path) {
            Ok(look) => look
                .and_then(|l| l.settled(before))
                .filter(|l| l.size == *size)
                .map(|l| Ok((path.as_str(), l, sha256))),
            Err(e) => Some(Err(e)),
        });
    if let Err(e) = hash_cache::write(root, lines) {
        log::warn!(
            "{}: cannot record the looks of the release's outputs ({e}); the next release reads and hashes them again",
            root.path().display()
        );
    }
}

/// Refuses a root without `releases` whose `path` is the link of a release
/// destination: publishing through it would change a release in place.
fn refuse_release_link(path: &std::path::Path) -> Result<(), Opened> {
    let Ok(target) = std::fs::read_link(path) else {
        return Ok(());
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let releases = format!("{name}{}/", releases::RELEASES_SUFFIX);
    if target.to_string_lossy().starts_with(&releases) {
        return Err(Opened::Io(io::Error::other(format!(
            "{} is the link of a destination published as releases (it points to {}); set `releases` on this destination again, or replace the link with a copy of the release to publish in place",
            path.display(),
            target.display()
        ))));
    }
    Ok(())
}

impl LocalRoot {
    /// Opens and locks `d`'s root (a dry run only waits for a lock file
    /// that exists, and creates nothing), settling its journal.
    pub(super) fn open(
        d: &Destination,
        options: &Options,
        now: OffsetDateTime,
        ahead: Option<journal::ReadAhead>,
    ) -> Result<LocalRoot, Error> {
        let mut target = LocalRoot::unopened(d, &options.process);
        target.opened_at = now;
        target
            .open_releases(!options.dry_run, options.lock_timeout)
            .map_err(|e| match e {
                Opened::Lock(e) => Error::Lock(e),
                Opened::Io(source) => Error::Root {
                    stage: Stage::Lock,
                    what: "cannot open the releases of destination root",
                    path: d.root.clone(),
                    source,
                },
            })?;
        target.lock(options, now, ahead, false)?;
        Ok(target)
    }

    /// Opens `d`'s root for a maintenance command: locked (for
    /// [`Access::Read`] only if its lock file exists; for
    /// [`Access::Write`] only if it has a catalog or a journal, so that a
    /// root without either is given no lock file), its state file refused
    /// untouched unless it is a catalog, then settled from its journal
    /// (read-only: only looked at). A root that does not exist is opened
    /// as an empty one, and not created.
    pub(super) fn open_to_maintain(
        d: &Destination,
        access: Access,
        lock_timeout: Duration,
        now: OffsetDateTime,
        process: &ProcessState,
    ) -> Result<LocalRoot, Fault> {
        let mut target = LocalRoot::unopened(d, process);
        target.opened_at = now;
        let memory = process.catalog_cache();
        let write = access == Access::Write
            && d.releases.is_some()
            && releases::folder_of(&d.root).is_dir();
        target
            .open_releases(write, lock_timeout)
            .map_err(|e| match e {
                Opened::Lock(e) => Fault::from(e),
                Opened::Io(e) => io_fault(&d.root, Doing::OpenFolder)(e),
            })?;
        let Some(root) =
            Root::open(&target.path).map_err(io_fault(&target.path, Doing::OpenFolder))?
        else {
            return Ok(target);
        };
        if target.in_release() {
            // The releases folder's lock is held: a release has none.
            let state = journal::recover(&root, access == Access::Write, now, memory)
                .map_err(io_fault(&target.path, Doing::FinishJournal))?;
            target.state = Some(usable(state)?.map_or(State::Absent, State::Catalog));
            target.root = Some(root);
            return Ok(target);
        }
        let mut lock = lock::acquire_existing(&root, lock_timeout)?;
        let read_state = |root: &Root| {
            journal::read_state(root, memory)
                .map_err(io_fault(&d.root, Doing::Read(STATE_FILE.to_owned())))
        };
        if access == Access::Write && lock.is_none() {
            // No lock file: only take (and so create) the lock when there
            // is something to change.
            let state = read_state(&root)?;
            let journaled = root
                .entry(JOURNAL_FILE)
                .map_err(io_fault(&d.root, Doing::Read(JOURNAL_FILE.to_owned())))?
                != Entry::Missing;
            if matches!(state, State::Absent) && !journaled {
                target.root = Some(root);
                return Ok(target);
            }
            usable(state)?;
            lock = Some(lock::acquire(&root, lock_timeout)?);
        }
        usable(read_state(&root)?)?;
        let state = journal::recover(&root, access == Access::Write, now, memory)
            .map_err(io_fault(&d.root, Doing::FinishJournal))?;
        target.state = Some(usable(state)?.map_or(State::Absent, State::Catalog));
        target.root = Some(root);
        target._lock = lock;
        Ok(target)
    }

    fn lock(
        &mut self,
        options: &Options,
        now: OffsetDateTime,
        ahead: Option<journal::ReadAhead>,
        create: bool,
    ) -> Result<(), Error> {
        let at = |stage: Stage, what: &'static str| {
            let path = self.path.clone();
            move |source: io::Error| Error::Root {
                stage,
                what,
                path,
                source,
            }
        };
        let root = if create {
            Some(
                Root::create(&self.path)
                    .map_err(at(Stage::Lock, "cannot create destination root"))?,
            )
        } else {
            Root::open(&self.path).map_err(at(Stage::Lock, "cannot open destination root"))?
        };
        let memory = options.process.catalog_cache();
        let lock = match &root {
            // The releases folder's lock is held: a release has none.
            Some(_) if self.in_release() => None,
            Some(root) if options.dry_run => lock::acquire_existing(root, options.lock_timeout)?,
            Some(root) => Some(lock::acquire(root, options.lock_timeout)?),
            None => None,
        };
        self.state = Some(match &root {
            None => State::Absent,
            Some(root) => journal::recover_with(root, !options.dry_run, now, ahead, memory).map_err(|e| {
                // A journal is an unfinished publication to settle first:
                // when that fails (a full disk), say so, not that the root
                // cannot be read.
                let what = match root.entry(journal::JOURNAL_FILE) {
                    Ok(crate::fs::storage::Entry::Missing) => "cannot read destination root",
                    _ => {
                        "cannot settle the unfinished publication its journal records in destination root"
                    }
                };
                at(Stage::Plan, what)(e)
            })?,
        });
        self.root = root;
        self._lock = lock;
        Ok(())
    }

    fn root(&self) -> &Root {
        self.root
            .as_ref()
            .expect("a missing root is created before anything is staged")
    }

    fn write_error(&self, source: io::Error) -> Error {
        Error::Write {
            path: self.path.clone(),
            source,
        }
    }
}

/// `e` as it is, unless it says the root's file system is full and the
/// change's outputs are larger than that whole file system: then an error
/// that says so, which no retry can help (so it is not transient: the
/// bundle fails at once instead of being deferred for a day).
fn never_fits(root: &Root, change: &Change<'_>, e: io::Error) -> io::Error {
    if !crate::fs::io_class::is_out_of_space(&e) {
        return e;
    }
    let needed: u64 = change.writes.iter().map(|w| w.d.size).sum();
    let Ok(fs) = rustix::fs::fstatvfs(root.dir()) else {
        return e;
    };
    let whole = fs.f_blocks.saturating_mul(fs.f_frsize);
    if needed <= whole {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{e}: the outputs to write ({needed} bytes) are larger than the whole file system of the root ({whole} bytes), so no retry can make them fit, whatever is freed; publish to a larger file system, or split the bundle"
        ),
    )
}

impl LocalRoot {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            missing: self.root.is_none(),
            reads_bundle_at_commit: false,
            may_rebase: false,
            output_noun: "file",
        }
    }
}

impl PublishRoot for LocalRoot {
    fn label(&self) -> String {
        match &self.releases {
            Some(rel) => rel.link().display().to_string(),
            None => self.path.display().to_string(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        LocalRoot::capabilities(self)
    }

    fn take_state(&mut self) -> State {
        self.state.take().unwrap_or(State::Absent)
    }

    fn create(&mut self, options: &Options, now: OffsetDateTime) -> Result<(), Error> {
        if self.root.is_some() {
            return Ok(());
        }
        if self.releases.is_some() {
            // The first release, built from nothing.
            self.start_release().map_err(|e| self.write_error(e))?;
            self.state = Some(State::Absent);
            return Ok(());
        }
        self.lock(options, now, None, true)
    }

    /// Storage is read while planning, path by path; here only the text of
    /// the catalog's records kept for the next catalog write is let go
    /// when the change will be too large for that write to copy them
    /// ([`stage::texts_copied`]), so that it is not held through the
    /// publication.
    fn look_ahead(
        &mut self,
        state: &State,
        bundles: &[&[Desired]],
        _every_key: bool,
    ) -> Result<(), Error> {
        if let (State::Catalog(c), Some(root)) = (state, &self.root) {
            let planned = bundles.iter().map(|d| d.len()).sum();
            if !stage::texts_copied(planned, c.outputs.len()) {
                self.process.catalog_cache().drop_texts(root);
            }
        }
        Ok(())
    }

    fn refusal(&self, _plan: &Plan, _state: &State, _force: bool) -> Option<Plan> {
        // A locked root carries out every plan.
        None
    }

    fn rewrite(
        &self,
        _desired: &[Desired],
        _touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        // Bytes only: the web server sets the headers.
        BTreeSet::new()
    }

    fn kept(
        &self,
        _plan: &Plan,
        _state: &State,
        _touched: &BTreeMap<String, Entry>,
    ) -> BTreeSet<String> {
        // Found while staging instead ([`StagedAs::Unchanged`]).
        BTreeSet::new()
    }

    fn listing(
        &self,
        desired: &[Desired],
        state: &State,
        touched: &BTreeMap<String, Entry>,
        force: bool,
    ) -> Result<Listing, Error> {
        let Some(root) = &self.root else {
            return Ok(Listing::default());
        };
        let read = |source| Error::Root {
            stage: Stage::Plan,
            what: "cannot read destination root",
            path: self.path.clone(),
            source,
        };
        Ok(Listing {
            root_exists: true,
            top_level: if plan::needs_top_level(state, force) {
                root.top_level().map_err(read)?
            } else {
                Vec::new()
            },
            entries: probe(root, desired, touched).map_err(read)?,
            all: if plan::needs_walk(state, self.workflow, force) {
                root.walk().map_err(read)?
            } else {
                Vec::new()
            },
        })
    }

    fn stage(
        &mut self,
        change: &Change<'_>,
        workers: &dyn Workers,
        cancel: &crate::runtime::interrupt::Cancel,
    ) -> Result<Vec<StagedAs>, Error> {
        let mut carried = None;
        if self.releases.is_some() && self.building.is_none() {
            let vouched = match &self.root {
                Some(current) => vouched_before_linking(current, change),
                None => Vec::new(),
            };
            self.start_release().map_err(|e| self.write_error(e))?;
            carried = Some(carry_looks(self.root(), change, &vouched));
        }
        let staged = stage::stage(self.root(), change, workers, cancel, &self.process, carried)
            .map_err(|f| match f {
                Failure::Bundle(e) => Error::Bundle(e),
                Failure::Io(e) => self.write_error(never_fits(self.root(), change, e)),
            })?;
        let outcome = staged
            .outputs
            .iter()
            .map(|s| match s {
                stage::StagedOutput::Temp(_) => StagedAs::Written,
                stage::StagedOutput::Unchanged(_) => StagedAs::Unchanged,
            })
            .collect();
        self.staged = Some(staged);
        Ok(outcome)
    }

    fn make_durable(&mut self) -> Result<(), Error> {
        let Some(staged) = self.staged.as_mut() else {
            return Ok(());
        };
        let root = self.root.as_ref().expect("staged, so it exists");
        stage::make_durable(root, staged, &self.process).map_err(|e| self.write_error(e))
    }

    fn commit(&mut self, mut change: Change<'_>) -> Result<CommitTally, Error> {
        // A release records the looks of its outputs once every link and
        // unlink of the publication is done (each gives a new change time).
        let looks: Vec<(String, u64, Sha256)> =
            if self.building.is_some() && change.record_looks && change.is_large() {
                change.record_looks = false;
                (change.writes.iter())
                    .map(|w| (w.d.path.as_str().to_owned(), w.d.size, w.d.sha256))
                    .collect()
            } else {
                Vec::new()
            };
        let staged = self.staged.take().expect("committed after staging");
        let file_by_file = staged.file_by_file();
        let root = self.root();
        let memory = self.process.catalog_cache();
        let c = stage::commit(root, &change, staged, &self.process)
            .map_err(|e| self.write_error(e.source))?;
        memory.remember(root, c.catalog, change.catalog, c.texts);
        if let (Some(rel), Some(building)) = (&mut self.releases, &self.building) {
            let root = self.root.as_ref().expect("staged, so it exists");
            rel.complete(building, root).map_err(|e| Error::Write {
                path: self.path.clone(),
                source: e,
            })?;
            let name = building.name.clone();
            self.building = None;
            rel.switch(&name).map_err(|e| Error::Write {
                path: rel.link().to_owned(),
                source: e,
            })?;
            rel.retain(self.keep.unwrap_or(u32::MAX));
            if !looks.is_empty() {
                record_release_looks(self.root(), &looks);
            }
        }
        Ok(CommitTally {
            copied_across: c.copied_across,
            file_by_file,
            rebases: 0,
        })
    }

    fn roll_back(&self) -> Result<(), io::Error> {
        if let (Some(rel), Some(building)) = (&self.releases, &self.building) {
            // The current release was never touched.
            return rel.abandon(building);
        }
        match &self.root {
            Some(root) => stage::roll_back(root, self.process.catalog_cache()),
            None => Ok(()),
        }
    }
}

impl MaintainRoot for LocalRoot {
    fn headers_differ(&self, _paths: &[&str]) -> Result<Vec<String>, Fault> {
        // A file stores no headers: its web server sets them.
        Ok(Vec::new())
    }

    fn capabilities(&self) -> Capabilities {
        LocalRoot::capabilities(self)
    }

    fn read_catalog(&mut self) -> Result<Option<Catalog>, Fault> {
        let state = match (self.state.take(), &self.root) {
            (Some(state), _) => state,
            // Under the lock, after a commit (and its journal) is done.
            (None, Some(root)) => journal::read_state(root, self.process.catalog_cache())
                .map_err(io_fault(&self.path, Doing::Read(STATE_FILE.to_owned())))?,
            (None, None) => State::Absent,
        };
        usable(state)
    }

    fn in_flight(&self, _report: bool) -> Result<BTreeSet<String>, Fault> {
        // The lock is held: no publication is in progress.
        Ok(BTreeSet::new())
    }

    fn confirm_absent(&self, paths: Vec<String>) -> Result<Vec<String>, Fault> {
        // The walk under the lock is final.
        Ok(paths)
    }

    fn survey(&self) -> Result<BTreeMap<String, Entry>, Fault> {
        let Some(root) = &self.root else {
            return Ok(BTreeMap::new());
        };
        Ok(root
            .walk()
            .map_err(io_fault(&self.path, Doing::ListFolder))?
            .into_iter()
            .collect())
    }

    fn hash_each(
        &self,
        paths: &[&str],
        each: &mut dyn FnMut(usize, Option<Hashed>),
    ) -> Result<(), Fault> {
        for (i, path) in paths.iter().enumerate() {
            let hashed = match &self.root {
                Some(root) => root
                    .hash_file(path)
                    .map_err(io_fault(&self.path, Doing::Read((*path).to_owned())))?,
                None => None,
            };
            each(i, hashed);
        }
        Ok(())
    }

    fn folders_at(&self, paths: &[String]) -> Result<BTreeSet<String>, Fault> {
        let Some(root) = &self.root else {
            return Ok(BTreeSet::new());
        };
        let mut folders = BTreeSet::new();
        for path in paths {
            let entry = root
                .entry(path)
                .map_err(io_fault(&self.path, Doing::Delete(path.clone())))?;
            if entry == Entry::Dir {
                folders.insert(path.clone());
            }
        }
        Ok(folders)
    }

    fn delete_owned(&mut self, change: Change<'_>) -> Result<(), Fault> {
        let root = self.root();
        let memory = self.process.catalog_cache();
        let deleted = delete_through_engine(root, &change, &self.process);
        match deleted {
            Ok(c) => {
                memory.remember(root, c.catalog, change.catalog, c.texts);
                Ok(())
            }
            Err(fault) => {
                settle_after_deleting(root, &change, memory);
                Err(fault)
            }
        }
    }

    fn swap_catalog(&mut self, next: Catalog, _read_at: OffsetDateTime) -> Result<(), Fault> {
        let Some(root) = &self.root else {
            return Ok(());
        };
        root.write_reserved(STATE_FILE, &next.to_json())
            .map_err(io_fault(&self.path, Doing::Write(STATE_FILE.to_owned())))
    }
}

/// Runs `change` (deletions only) through the engine a publication uses:
/// journaled, made durable, the catalog written, then deleted. A
/// failure says which step failed, in the words of maintenance.
fn delete_through_engine(
    root: &Root,
    change: &Change<'_>,
    process: &ProcessState,
) -> Result<stage::CommittedRoot, Fault> {
    // Staging a change without outputs writes exactly these two files.
    let staging = || io_fault(root.path(), Doing::StageDeletions);
    let cancel = crate::runtime::interrupt::Cancel::new();
    let mut staged =
        stage::stage(root, change, &InOrder, &cancel, process, None).map_err(|f| match f {
            Failure::Io(e) => staging()(e),
            // Nothing is copied from a bundle.
            Failure::Bundle(e) => staging()(io::Error::other(e.to_string())),
        })?;
    stage::make_durable(root, &mut staged, process).map_err(staging())?;
    stage::commit(root, change, staged, process).map_err(|CommitFailure { step, source }| {
        let doing = match step {
            Step::Delete(path) => Doing::Delete(path),
            // (Nothing is renamed into place: the change writes no output.)
            Step::Rename | Step::Catalog => Doing::Write(STATE_FILE.to_owned()),
            Step::Barrier => Doing::SyncDeletions,
            Step::Journal => Doing::RemoveJournal,
        };
        io_fault(root.path(), doing)(source)
    })
}

/// After a failed deletion: settles the root from the journal (the records
/// of the outputs deleted before the error are dropped), and says what is
/// left.
fn settle_after_deleting(root: &Root, change: &Change<'_>, memory: &CatalogCache) {
    match journal::recover(root, true, change.catalog.updated_at, memory) {
        Ok(state) => {
            let deleted = change
                .deletes
                .iter()
                .filter(|p| !matches!(&state, State::Catalog(c) if c.get(p).is_some()))
                .count();
            if deleted > 0 {
                log::warn!(
                    "{}: {deleted} output(s) were deleted and their records dropped before the error",
                    root.path().display()
                );
            }
        }
        Err(e) => log::warn!(
            "{}: settling the root from its journal failed too ({e}); the journal stays and the next process that locks the root finishes it",
            root.path().display()
        ),
    }
}
