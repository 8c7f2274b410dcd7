//! A local destination root as a [`Target`]: opened by taking its lock
//! (docs/contract.md §5) and settling any journal a crash left; written by
//! the engine in `stage` (journal, temporary files, barriers, renames,
//! catalog last); rolled back from its journal. Maintenance opens it the
//! same way, but a read-only command creates nothing (no lock file, no
//! recovery) and every state file is refused untouched unless it is a
//! catalog (docs/maintenance.md); `prune` deletes through the same engine.

use super::Options;
use super::error::Error;
use super::stage::{self, CommitFailure, Failure, StagedRoot, Step, probe};
use super::target::{Access, Change, Committed, Fault, Staged, Target, usable};
use crate::catalog::{Catalog, STATE_FILE, State};
use crate::config::{Destination, Workflow};
use crate::hashing::Hashed;
use crate::journal::{self, JOURNAL_FILE};
use crate::lock::{self, RootLock};
use crate::plan::{self, Desired, Entry, Listing};
use crate::process_state::ProcessState;
use crate::remembered::Remembered;
use crate::report::Stage;
use crate::storage::Root;
use crate::workers::{InOrder, Workers};
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
    journal::worth_reading_ahead(&root, process.remembered())
}

pub(super) struct LocalTarget {
    path: PathBuf,
    workflow: Workflow,
    /// `None` while the root does not exist.
    root: Option<Root>,
    _lock: Option<RootLock>,
    /// As opened, until taken ([`Target::take_state`],
    /// [`Target::read_catalog`]).
    state: Option<State>,
    staged: Option<StagedRoot>,
    /// Where the root's catalog is remembered.
    process: ProcessState,
}

impl LocalTarget {
    /// `d`'s root, not opened yet: no lock, nothing read.
    fn unopened(d: &Destination, process: &ProcessState) -> LocalTarget {
        LocalTarget {
            path: d.root.clone(),
            workflow: d.workflow,
            root: None,
            _lock: None,
            state: Some(State::Absent),
            staged: None,
            process: process.clone(),
        }
    }

    /// Opens and locks `d`'s root (a dry run only waits for a lock file
    /// that exists, and creates nothing), settling its journal.
    pub(super) fn open(
        d: &Destination,
        options: &Options,
        now: OffsetDateTime,
        ahead: Option<journal::ReadAhead>,
    ) -> Result<LocalTarget, Error> {
        let mut target = LocalTarget::unopened(d, &options.process);
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
    ) -> Result<LocalTarget, Fault> {
        let mut target = LocalTarget::unopened(d, process);
        let memory = process.remembered();
        let Some(root) =
            Root::open(&d.root).map_err(io_fault("cannot open the destination root"))?
        else {
            return Ok(target);
        };
        let mut lock = lock::acquire_existing(&root, lock_timeout)?;
        let read_state = |root: &Root| {
            journal::read_state(root, memory).map_err(io_fault(format!("cannot read {STATE_FILE}")))
        };
        if access == Access::Write && lock.is_none() {
            // No lock file: only take (and so create) the lock when there
            // is something to change.
            let state = read_state(&root)?;
            let journaled = root
                .entry(JOURNAL_FILE)
                .map_err(io_fault(format!("cannot read {JOURNAL_FILE}")))?
                != Entry::Missing;
            if matches!(state, State::Absent) && !journaled {
                target.root = Some(root);
                return Ok(target);
            }
            usable(state)?;
            lock = Some(lock::acquire(&root, lock_timeout)?);
        }
        usable(read_state(&root)?)?;
        let state = journal::recover(&root, access == Access::Write, now, memory).map_err(
            io_fault("cannot finish the interrupted publication recorded in its journal"),
        )?;
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
        let memory = options.process.remembered();
        let lock = match &root {
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
                    Ok(crate::storage::Entry::Missing) => "cannot read destination root",
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
    if !crate::io_class::is_out_of_space(&e) {
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

impl Target for LocalTarget {
    fn label(&self) -> String {
        self.path.display().to_string()
    }

    fn drop_texts(&self) {
        if let Some(root) = &self.root {
            self.process.remembered().drop_texts(root);
        }
    }

    fn take_state(&mut self) -> State {
        self.state.take().unwrap_or(State::Absent)
    }

    fn missing(&self) -> bool {
        self.root.is_none()
    }

    fn create(&mut self, options: &Options, now: OffsetDateTime) -> Result<(), Error> {
        self.lock(options, now, None, true)
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
        cancel: &crate::interrupt::Cancel,
    ) -> Result<Vec<Staged>, Error> {
        let staged = stage::stage(self.root(), change, workers, cancel, &self.process).map_err(
            |f| match f {
                Failure::Bundle(e) => Error::Bundle(e),
                Failure::Io(e) => self.write_error(never_fits(self.root(), change, e)),
            },
        )?;
        let outcome = staged
            .outputs
            .iter()
            .map(|s| match s {
                stage::Staged::Temp(_) => Staged::Written,
                stage::Staged::Unchanged(_) => Staged::Unchanged,
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

    fn commit(&mut self, change: Change<'_>) -> Result<Committed, Error> {
        let staged = self.staged.take().expect("committed after staging");
        let file_by_file = staged.file_by_file();
        let root = self.root();
        let memory = self.process.remembered();
        let c = stage::commit(root, &change, staged, &self.process)
            .map_err(|e| self.write_error(e.source))?;
        memory.remember(root, c.catalog, change.catalog, c.texts);
        Ok(Committed {
            copied_across: c.copied_across,
            file_by_file,
            rebases: 0,
        })
    }

    fn roll_back(&self) -> Result<(), io::Error> {
        match &self.root {
            Some(root) => stage::roll_back(root, self.process.remembered()),
            None => Ok(()),
        }
    }

    fn output_noun(&self) -> &'static str {
        "file"
    }

    fn read_catalog(&mut self) -> Result<Option<Catalog>, Fault> {
        let state = match (self.state.take(), &self.root) {
            (Some(state), _) => state,
            // Under the lock, after a commit (and its journal) is done.
            (None, Some(root)) => journal::read_state(root, self.process.remembered())
                .map_err(io_fault(format!("cannot read {STATE_FILE}")))?,
            (None, None) => State::Absent,
        };
        usable(state)
    }

    fn survey(&self) -> Result<BTreeMap<String, Entry>, Fault> {
        let Some(root) = &self.root else {
            return Ok(BTreeMap::new());
        };
        Ok(root
            .walk()
            .map_err(io_fault("cannot list the destination root"))?
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
                    .map_err(io_fault(format!("cannot read {path}")))?,
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
                .map_err(io_fault(format!("cannot delete {path}")))?;
            if entry == Entry::Dir {
                folders.insert(path.clone());
            }
        }
        Ok(folders)
    }

    fn delete_owned(&mut self, change: Change<'_>) -> Result<(), Fault> {
        let root = self.root();
        let memory = self.process.remembered();
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
            .map_err(io_fault(format!("cannot write {STATE_FILE}")))
    }
}

/// Turns an I/O error into a [`Fault`] saying what was being done.
fn io_fault(doing: impl Into<String>) -> impl FnOnce(io::Error) -> Fault {
    let doing = doing.into();
    move |source| Fault::Io { doing, source }
}

/// Runs `change` (deletions only) through the engine a publication uses:
/// journaled, made durable, deleted, the catalog written last. A
/// failure says which step failed, in the words of maintenance.
fn delete_through_engine(
    root: &Root,
    change: &Change<'_>,
    process: &ProcessState,
) -> Result<stage::Committed, Fault> {
    // Staging a change without outputs writes exactly these two files.
    let staging = || {
        io_fault(format!(
            "cannot write {JOURNAL_FILE} and the new {STATE_FILE}"
        ))
    };
    let mut staged = stage::stage(
        root,
        change,
        &InOrder,
        &crate::interrupt::Cancel::new(),
        process,
    )
    .map_err(|f| match f {
        Failure::Io(e) => staging()(e),
        // Nothing is copied from a bundle.
        Failure::Bundle(e) => staging()(io::Error::other(e.to_string())),
    })?;
    stage::make_durable(root, &mut staged, process).map_err(staging())?;
    stage::commit(root, change, staged, process).map_err(|CommitFailure { step, source }| {
        let doing = match step {
            Step::Delete(path) => format!("cannot delete {path}"),
            // (Nothing is renamed into place: the change writes no output.)
            Step::Rename | Step::Catalog => format!("cannot write {STATE_FILE}"),
            Step::Barrier => "cannot sync the deletions".to_owned(),
            Step::Journal => format!("cannot remove {JOURNAL_FILE}"),
        };
        Fault::Io { doing, source }
    })
}

/// After a failed deletion: settles the root from the journal (the records
/// of the outputs deleted before the error are dropped), and says what is
/// left.
fn settle_after_deleting(root: &Root, change: &Change<'_>, memory: &Remembered) {
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
