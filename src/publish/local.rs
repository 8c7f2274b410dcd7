//! A local destination root as a [`Target`]: opened by taking its lock
//! (docs/contract.md §5) and settling any journal a crash left; written by
//! the engine in `stage` (journal, temporary files, barriers, renames,
//! catalog last); rolled back from its journal.

use super::Options;
use super::error::Error;
use super::stage::{self, Failure, StagedRoot, probe};
use super::target::{Change, Committed, Staged, Target};
use crate::catalog::State;
use crate::config::{Destination, Workflow};
use crate::journal;
use crate::lock::{self, RootLock};
use crate::plan::{self, Desired, Entry, Listing};
use crate::remembered;
use crate::report::Stage;
use crate::storage::Root;
use crate::workers::Workers;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use time::OffsetDateTime;

/// Most bundles published together into local roots.
pub(super) const MAX_BATCH: usize = 256;

/// `d`'s catalog file, open, when it is large enough to be worth parsing
/// while the bundle is inspected ([`journal::worth_reading_ahead`]).
pub(super) fn worth_reading_ahead(d: &Destination) -> Option<std::fs::File> {
    let root = Root::open(&d.root).ok()??;
    journal::worth_reading_ahead(&root)
}

pub(super) struct LocalTarget {
    path: PathBuf,
    workflow: Workflow,
    /// `None` while the root does not exist.
    root: Option<Root>,
    _lock: Option<RootLock>,
    state: State,
    staged: Option<StagedRoot>,
}

impl LocalTarget {
    /// Opens and locks `d`'s root (a dry run only waits for a lock file
    /// that exists, and creates nothing), settling its journal.
    pub(super) fn open(
        d: &Destination,
        options: &Options,
        now: OffsetDateTime,
        ahead: Option<journal::ReadAhead>,
    ) -> Result<LocalTarget, Error> {
        let mut target = LocalTarget {
            path: d.root.clone(),
            workflow: d.workflow,
            root: None,
            _lock: None,
            state: State::Absent,
            staged: None,
        };
        target.lock(options, now, ahead, false)?;
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
        let lock = match &root {
            Some(root) if options.dry_run => lock::acquire_existing(root, options.lock_timeout)?,
            Some(root) => Some(lock::acquire(root, options.lock_timeout)?),
            None => None,
        };
        self.state = match &root {
            None => State::Absent,
            Some(root) => journal::recover_with(root, !options.dry_run, now, ahead).map_err(|e| {
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
        };
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

impl Target for LocalTarget {
    fn label(&self) -> String {
        self.path.display().to_string()
    }

    fn take_state(&mut self) -> State {
        std::mem::replace(&mut self.state, State::Absent)
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
        keep_going: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Staged>, Error> {
        let staged =
            stage::stage(self.root(), change, workers, keep_going).map_err(|f| match f {
                Failure::Bundle(e) => Error::Bundle(e),
                Failure::Io(e) => self.write_error(e),
            })?;
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
        stage::make_durable(root, staged).map_err(|e| self.write_error(e))
    }

    fn commit(&mut self, change: Change<'_>) -> Result<Committed, Error> {
        let staged = self.staged.take().expect("committed after staging");
        let file_by_file = staged.file_by_file();
        let root = self.root();
        let c = stage::commit(root, &change, staged).map_err(|e| self.write_error(e))?;
        remembered::remember(root, c.catalog, change.catalog, c.texts);
        Ok(Committed {
            copied_across: c.copied_across,
            file_by_file,
        })
    }

    fn roll_back(&self) -> Result<(), io::Error> {
        match &self.root {
            Some(root) => stage::roll_back(root),
            None => Ok(()),
        }
    }
}
