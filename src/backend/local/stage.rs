//! The one engine that writes a destination root, for a single
//! publication and for a batch of bundles alike (a single publication is a
//! batch of one): the journal, outputs and the new catalog staged as
//! temporary files, a durability barrier, the renames into place (every
//! output that is not a page, then the pages, then the catalog: the order
//! readers see, docs/contract.md §20.1), a second barrier, the deletions,
//! a third barrier, and settling from the journal after a failure. The
//! outputs and the catalog are written while staging, so a full disk stops
//! a publication before its renames (a change at the top creates its
//! folders as it renames; the record of a large publication's looks,
//! `.distributor-seen`, written after them, fails nothing).
//!
//! The shape of the change picks the layout, never a second copy of the
//! steps ([`Layout`]): a few writes are staged at the top of the root with
//! the journal and the catalog beside them, so that one wait makes all of
//! them durable; many writes (or a root to clear first) journal first,
//! then stage beside their targets on several threads, the catalog at the
//! top on a thread of its own. The barriers are
//! one `syncfs` of the root's file system, or, for a few writes while the
//! machine has much else waiting to be written, a fsync of each file and
//! folder touched ([`SyncMode`]), so that a busy neighbour on the same file
//! system does not hold a small publication up.
//!
//! The order is the crash-safety argument (docs/reliability.md): nothing
//! is renamed into place, deleted or created outside the top of the root
//! before the journal is durable, nothing is deleted before the catalog
//! that no longer records it is durable, and the journal goes only after
//! the deletions are durable. A journal found cut short therefore belongs
//! to a publication that had moved nothing yet, and one found beside the
//! catalog it names had only deletions left, which recovery finishes
//! ([`crate::backend::local::journal::recover`]).

use crate::backend::local::catalog_cache::CatalogCache;
use crate::backend::local::hash_cache::{self, HashCache, Look, SEEN_FILE};
use crate::backend::local::journal::{JOURNAL_FILE, JournalDeleteRef, JournalRef, JournalWriteRef};
use crate::backend::{Change, Write};
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{OutputRecord, RecordTexts, STATE_FILE, format_time};
use crate::fs::hashing::{self, Hashed};
use crate::fs::replace_file;
use crate::fs::storage::{self, Entry, Root, StagedFile};
use crate::paths::RelPath;
use crate::plan::Desired;
use crate::publish::Content;
use crate::runtime::failpoint;
use crate::runtime::interrupt::Cancel;
use crate::runtime::process_state::ProcessState;
use crate::runtime::workers::{PerCore, Syncable, Workers, beside, map_on_runs};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// What storage holds at each planned path and the folders above it (the
/// planner's view); `overlay` answers for paths a batch has already planned.
pub(super) fn probe(
    root: &Root,
    desired: &[Desired],
    overlay: &BTreeMap<String, Entry>,
) -> io::Result<BTreeMap<String, Entry>> {
    let mut entries = BTreeMap::new();
    // Folders first, sorted (each after the folders above it); a folder or
    // output below a folder found missing is missing too and is not looked
    // up (a new folder holds every output of a nested bundle).
    let folders: BTreeSet<&str> = desired.iter().flat_map(|d| d.path.ancestors()).collect();
    let mut missing: BTreeSet<&str> = BTreeSet::new();
    let paths = folders
        .iter()
        .copied()
        .chain(desired.iter().map(|d| d.path.as_str()));
    for path in paths {
        let entry = match overlay.get(path) {
            Some(e) => *e,
            None if parent_of(path).is_some_and(|p| missing.contains(p)) => Entry::Missing,
            None => root.entry(path)?,
        };
        if entry == Entry::Missing {
            if folders.contains(path) {
                missing.insert(path);
            }
        } else {
            entries.insert(path.to_owned(), entry);
        }
    }
    Ok(entries)
}

/// The folder holding `path`, if it is not at the top.
fn parent_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(parent, _)| parent)
}

/// Folders above the planned outputs that do not exist yet, or will not
/// once `cleared` (entries removed before the writes) is removed; the
/// publication creates them, shallowest first.
fn missing_dirs<'d>(
    root: &Root,
    writes: impl Iterator<Item = &'d Desired>,
    cleared: &[String],
) -> io::Result<Vec<String>> {
    let mut dirs = BTreeSet::new();
    for d in writes {
        dirs.extend(d.path.ancestors().map(str::to_owned));
    }
    let cleared: BTreeSet<&str> = cleared.iter().map(String::as_str).collect();
    let mut missing: Vec<String> = Vec::new();
    let mut absent: BTreeSet<String> = BTreeSet::new();
    // Sorted: a folder below one that is absent is absent too.
    for dir in dirs {
        let entry = if parent_of(&dir).is_some_and(|p| absent.contains(p))
            || cleared.contains(dir.as_str())
        {
            Entry::Missing
        } else {
            root.entry(&dir)?
        };
        if entry == Entry::Missing {
            absent.insert(dir.clone());
        }
        if entry != Entry::Dir {
            missing.push(dir);
        }
    }
    missing.sort_by_key(|d| d.matches('/').count());
    Ok(missing)
}

/// What staging did for one planned write.
#[derive(Debug)]
pub(super) enum StagedOutput {
    /// Written to this temporary file (beside its target, or at the top
    /// of the root for a small change), to be renamed into place.
    Temp(String),
    /// The target already holds exactly these bytes: the record it
    /// replaces has the same SHA-256 and size, and the regular file there
    /// has that size and hashes to it (or the root's `.distributor-seen`
    /// vouches for it). Nothing is written or renamed, so the file keeps its
    /// inode and modification time. With the file's look, for
    /// `.distributor-seen`, unless it was taken too soon after the file's
    /// last change to be recorded ([`Look::settled`]).
    Unchanged(Option<Look>),
}

impl StagedOutput {
    pub(super) fn temp(&self) -> Option<&String> {
        match self {
            StagedOutput::Temp(name) => Some(name),
            StagedOutput::Unchanged(_) => None,
        }
    }
}

/// Why staging stopped.
pub(super) enum Failure {
    /// A bundle file does not match its manifest.
    Bundle(bundle::BundleError),
    /// Writing to the root failed.
    Io(io::Error),
}

impl Change<'_> {
    /// A change of many files (see [`BARRIER_FROM`]).
    pub(super) fn is_large(&self) -> bool {
        self.writes.len() + self.deletes.len() + self.clear_first.len() >= BARRIER_FROM
    }

    fn layout(&self) -> Layout {
        if self.is_large() || !self.clear_first.is_empty() {
            Layout::Beside
        } else {
            Layout::Top
        }
    }

    fn journal(&self, root: &Root) -> io::Result<JournalRef<'_>> {
        Ok(JournalRef {
            writes: self
                .writes
                .iter()
                .filter_map(|w| {
                    let path = w.d.path.as_str();
                    self.catalog.get(path).map(|new| JournalWriteRef {
                        new,
                        old: self.replaced(path),
                    })
                })
                .collect(),
            deletes: self
                .clear_first
                .iter()
                .map(String::as_str)
                .chain(self.deletes.iter().map(String::as_str))
                .collect(),
            created_dirs: missing_dirs(root, self.writes.iter().map(|w| w.d), &self.clear_first)?,
            state_was_absent: self.state_was_absent,
            catalog: Some(format_time(self.catalog.updated_at)),
            deleted: self
                .deletes
                .iter()
                .map(|path| journal_delete(root, path, self.removed(path)))
                .filter_map(Result::transpose)
                .collect::<io::Result<_>>()?,
        })
    }
}

/// What the journal keeps of the deletion of `path`, which drops the record
/// `old` if any: an unrecorded file (a legacy root's) by its look, an
/// empty folder as such; nothing for a path that holds nothing to delete.
fn journal_delete<'a>(
    root: &Root,
    path: &'a str,
    old: Option<&'a OutputRecord>,
) -> io::Result<Option<JournalDeleteRef<'a>>> {
    let mut delete = JournalDeleteRef {
        path,
        old,
        look: None,
        folder: false,
    };
    if old.is_none() {
        match root.entry(path)? {
            Entry::File { .. } => delete.look = root.look(path)?.map(Into::into),
            Entry::Dir => delete.folder = true,
            _ => {}
        }
        if delete.look.is_none() && !delete.folder {
            return Ok(None);
        }
    }
    Ok(Some(delete))
}

/// From this many writes and deletes on, a change is staged beside its
/// targets on several threads, after a journal of its own, and always
/// made durable by barriers; below it, everything is staged at the top of
/// the root and one wait makes the outputs, the journal and the catalog
/// durable together.
pub(super) const BARRIER_FROM: usize = 16;

/// Whether the catalog write of a change of `changed` files into a catalog
/// of `records` copies the texts of the records known before
/// ([`crate::catalog::RecordTexts`]): always for one written at the top of
/// the root, else when it is small beside the catalog (its memory bound:
/// a large tree's update holds no texts, docs/performance.md, "Catalog
/// scale"). Before planning, the driver asks it with the outputs the
/// bundles desire, the deletions not known yet.
pub(super) fn texts_copied(changed: usize, records: usize) -> bool {
    changed < BARRIER_FROM || crate::catalog::small_beside(changed, records)
}

/// Where a change stages its outputs (see [`BARRIER_FROM`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// At the top of the root, with the journal and the catalog: a crash
    /// before the journal is durable leaves temporary files at the top
    /// only, which the next holder of the lock removes.
    Top,
    /// Beside each target, in folders created after the journal is durable.
    Beside,
}

/// How a change is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyncMode {
    /// One `syncfs` of the root's file system per barrier: one flush of
    /// the disk for every file and folder.
    Barrier,
    /// A fsync of each staged file and touched folder, all at once: for a
    /// few writes while much else waits to be written on the machine,
    /// which a barrier would wait for too.
    FileByFile,
}

/// Data waiting to be written back (machine-wide), beyond a small change's
/// own bytes, up to which one barrier is still cheaper than a fsync per
/// file: writing this much more takes about what a few fsyncs' separate
/// flushes cost (a millisecond), and it is about the error of the kernel's
/// own count. A producer's fresh bundle of a few files stays well below.
pub(super) const BARRIER_SLACK: u64 = 512 << 10;

/// How a change staged at the top of the root with `own` bytes is made
/// durable, given how much the kernel has waiting to be written back
/// (`None`: unknown). A change staged beside its targets always uses
/// barriers: a fsync per file costs more than any neighbour's data.
pub(super) fn sync_mode(own: u64, unwritten: Option<u64>) -> SyncMode {
    match unwritten {
        Some(unwritten) if unwritten <= own.saturating_add(BARRIER_SLACK) => SyncMode::Barrier,
        _ => SyncMode::FileByFile,
    }
}

/// What the kernel has waiting to be written back, for [`sync_mode`]. In
/// debug builds `DISTRIBUTOR_TEST_UNWRITTEN` (bytes) stands in for it, so
/// that the tests exercise both modes whatever else the machine is doing.
fn unwritten() -> Option<u64> {
    #[cfg(debug_assertions)]
    if let Ok(bytes) = std::env::var("DISTRIBUTOR_TEST_UNWRITTEN") {
        return bytes.parse().ok();
    }
    storage::unwritten_bytes()
}

/// What [`stage`] leaves for [`make_durable`] and [`commit`] in one root.
pub(super) struct StagedRoot {
    /// One for each planned write, in order.
    pub(super) outputs: Vec<StagedOutput>,
    layout: Layout,
    /// The new catalog, at a temporary name at the top of the root.
    catalog: StagedFile,
    /// The text of the catalog's records, when known (to remember with it).
    texts: Option<RecordTexts>,
    /// Files written at the top of the root ([`Layout::Top`]).
    top: Option<TopFiles>,
    /// Decided by [`make_durable`].
    sync: SyncMode,
}

/// What a change staged at the top of the root writes besides its outputs.
struct TopFiles {
    /// The staged outputs, to fsync file by file if need be.
    outputs: Vec<std::fs::File>,
    /// The journal, at its own name (not renamed into place: a crash
    /// before it is durable leaves it cut short, see the module comment);
    /// taken by a fsync file by file.
    journal: Option<std::fs::File>,
    /// Bytes of the outputs, the catalog and the journal.
    bytes: u64,
}

impl StagedRoot {
    /// Whether the change was made durable file by file.
    pub(super) fn file_by_file(&self) -> bool {
        self.sync == SyncMode::FileByFile
    }
}

/// Stages `change`: journals it, writes every output that does not
/// already hold its bytes to a temporary file (a copy hashed as it
/// streams, checked against the manifest), and the new catalog to one at
/// the top of the root (beside the outputs, on a thread of its own, when
/// they are staged beside their targets). Renames nothing into place, and
/// syncs nothing but the journal of a [`Layout::Beside`] change:
/// [`make_durable`] follows. `cancel` is asked before each output and
/// before each piece of the catalog ([`Stoppable`]); once it is
/// finishing, staging ends with an error, the catalog's thread as soon as the
/// outputs' (a stop never waits for a large catalog to be written out).
pub(super) fn stage<'a>(
    root: &Root,
    change: &Change<'a>,
    workers: &dyn Workers,
    cancel: &Cancel,
    process: &ProcessState,
    carried: Option<HashCache>,
) -> Result<StagedRoot, Failure> {
    let layout = change.layout();
    if layout == Layout::Beside {
        // Durable before any folder is made or any file staged below the
        // top: a crash from here on is settled from it.
        let journal = change.journal(root).map_err(Failure::Io)?;
        let file = root
            .create_reserved(JOURNAL_FILE, &mut |w| journal.write_json(w))
            .map_err(Failure::Io)?;
        process
            .syncs()
            .sync_at_once(vec![Box::new(file), Box::new(root.shared_dir())])
            .map_err(Failure::Io)?;
        failpoint::hit("publish.after_journal");
        clear_first(root, &change.clear_first)?;
        make_folders(root, change.writes.iter().map(|w| w.d)).map_err(Failure::Io)?;
    }
    // Outputs the catalog records with the bytes wanted are checked on
    // disk; for many, the root's record of their looks spares reading them.
    let recorded_same = change
        .writes
        .iter()
        .filter(|w| records_same(change.replaced(w.d.path.as_str()), w.d))
        .count();
    // (A new release's outputs are vouched for by the looks they had in
    // the release they are linked from: `carried`.)
    let seen = carried.or_else(|| (recorded_same >= BARRIER_FROM).then(|| HashCache::read(root)));
    // Made as each write is staged: a large tree's jobs are not held.
    let job = |w: &Write<'a>| Job {
        d: w.d,
        old: change.replaced(w.d.path.as_str()),
        in_memory: w.in_memory,
        bundle: w.bundle,
        seen: seen.as_ref(),
    };
    let stop = crate::runtime::interrupt::stopped;
    let (outputs, (catalog, texts), top) = match layout {
        Layout::Beside => {
            let same_folder = |a: &Write, b: &Write| a.d.path.parent() == b.d.path.parent();
            // The new catalog is known: written while the outputs are
            // staged, it is made durable by the same barrier, and renamed
            // into place after them. A temporary file left by a failure is
            // removed when the root is settled.
            let (catalog, outputs) = beside(
                || stage_catalog(root, change, layout, cancel, process),
                || {
                    map_on_runs(workers, &change.writes, same_folder, |w| {
                        if cancel.finishing() {
                            return Err(Failure::Io(stop()));
                        }
                        stage_one(root, &job(w), None)
                    })
                },
            );
            let outputs = outputs
                .into_iter()
                .collect::<Result<Vec<StagedOutput>, Failure>>()?;
            (outputs, catalog.map_err(Failure::Io)?, None)
        }
        Layout::Top => {
            let mut files = Vec::new();
            let mut outputs = Vec::with_capacity(change.writes.len());
            let mut bytes = 0;
            for w in &change.writes {
                if cancel.finishing() {
                    return Err(Failure::Io(stop()));
                }
                let staged = stage_one(root, &job(w), Some(&mut files))?;
                if matches!(staged, StagedOutput::Temp(_)) {
                    bytes += w.d.size;
                }
                outputs.push(staged);
            }
            // The new catalog is known: written now, it is made durable
            // with the outputs, and renamed into place after them.
            let (catalog, texts) =
                stage_catalog(root, change, layout, cancel, process).map_err(Failure::Io)?;
            let journal = change.journal(root).map_err(Failure::Io)?;
            let journal = root
                .create_reserved(JOURNAL_FILE, &mut |w| journal.write_json(w))
                .map_err(Failure::Io)?;
            bytes += catalog.file.metadata().map_err(Failure::Io)?.len();
            bytes += journal.metadata().map_err(Failure::Io)?.len();
            (
                outputs,
                (catalog, texts),
                Some(TopFiles {
                    outputs: files,
                    journal: Some(journal),
                    bytes,
                }),
            )
        }
    };
    if let Some(seen) = &seen {
        log::debug!(
            "{}: {} of {recorded_same} outputs recorded with the bytes wanted were known unchanged by their look in {SEEN_FILE}; the others were read and hashed",
            root.path().display(),
            seen.vouched()
        );
    }
    Ok(StagedRoot {
        outputs,
        layout,
        catalog,
        texts,
        top,
        sync: SyncMode::Barrier,
    })
}

/// Writes the new catalog of `change` to a temporary file at the top of
/// the root, neither synced nor renamed ([`Root::stage_reserved`]), with the
/// text of its records when they are known: copied from the catalog
/// remembered before when the change is small beside it
/// ([`texts_copied`]); a large change into a large catalog formats every
/// record and holds no texts.
fn stage_catalog(
    root: &Root,
    change: &Change<'_>,
    layout: Layout,
    cancel: &Cancel,
    process: &ProcessState,
) -> io::Result<(StagedFile, Option<RecordTexts>)> {
    let changed = change.writes.len() + change.deletes.len();
    let before = texts_copied(changed, change.catalog.outputs.len())
        .then(|| process.catalog_cache().texts(root))
        .flatten();
    // At the top, the texts are kept even with none to copy.
    let keep = layout == Layout::Top || before.is_some();
    let mut texts = None;
    let file = root.stage_reserved(&mut |w| {
        let w = &mut Stoppable { inner: w, cancel };
        match keep {
            true => {
                texts = Some(change.catalog.write_json_reusing(w, before.as_deref())?);
                Ok(())
            }
            false => change.catalog.write_json(w),
        }
    })?;
    Ok((file, texts))
}

/// A writer that asks `cancel` before each piece it passes on, and
/// passes on at most [`STOPPABLE_PIECE`] bytes at a time: a catalog of a
/// million records (about 500 MB) stops within one piece. Its stop is
/// [`crate::runtime::interrupt::stopped`], never `Interrupted`, which `write_all`
/// would retry for ever.
struct Stoppable<'w> {
    inner: &'w mut dyn io::Write,
    cancel: &'w Cancel,
}

/// The most [`Stoppable`] writes between two questions: a few
/// milliseconds of copying into the page cache.
const STOPPABLE_PIECE: usize = 4 << 20;

impl io::Write for Stoppable<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.cancel.finishing() {
            return Err(crate::runtime::interrupt::stopped());
        }
        self.inner.write(&buf[..buf.len().min(STOPPABLE_PIECE)])
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The first barrier: every staged byte, the journal and the catalog
/// reach the disk. Nothing outside the top of the root changes before.
pub(super) fn make_durable(
    root: &Root,
    staged: &mut StagedRoot,
    process: &ProcessState,
) -> io::Result<()> {
    let Some(top) = staged.top.as_mut() else {
        return root.sync();
    };
    staged.sync = sync_mode(top.bytes, unwritten());
    match staged.sync {
        SyncMode::Barrier => root.sync()?,
        SyncMode::FileByFile => {
            log::debug!(
                "{}: much else waits to be written back on this machine; fsyncing the publication's files one by one rather than waiting for all of it",
                root.path().display()
            );
            let mut handles: Vec<Syncable> = std::mem::take(&mut top.outputs)
                .into_iter()
                .map(|f| Box::new(f) as Syncable)
                .collect();
            handles.push(Box::new(staged.catalog.file.clone()));
            handles.extend(top.journal.take().map(|j| Box::new(j) as Syncable));
            // The root's entries: the journal's, and the staged files'.
            handles.push(Box::new(root.shared_dir()));
            process.syncs().sync_at_once(handles)?;
        }
    }
    failpoint::hit("publish.after_journal");
    Ok(())
}

/// What [`commit`] did.
pub(super) struct CommittedRoot {
    /// The look of the catalog file written.
    pub(super) catalog: Look,
    /// The text of its records, when known (to remember with it).
    pub(super) texts: Option<RecordTexts>,
    /// See [`Moved::copied_across`].
    pub(super) copied_across: u64,
}

/// The step of [`commit`] that failed (a publication reports the error
/// alone; maintenance names the step).
#[derive(Debug)]
pub(super) enum Step {
    /// Renaming a staged output into place.
    Rename,
    /// Deleting the output at this path (or the folders it left empty).
    Delete(String),
    /// Renaming the catalog into place.
    Catalog,
    /// Making the renames and the catalog durable, or the deletions.
    Barrier,
    /// Removing the journal, once the catalog is durable.
    Journal,
}

/// Why [`commit`] stopped: the step, and the error.
#[derive(Debug)]
pub(super) struct CommitFailure {
    pub(super) step: Step,
    pub(super) source: io::Error,
}

/// Tags an error of [`commit`] with its step.
fn failed_at(step: Step) -> impl FnOnce(io::Error) -> CommitFailure {
    move |source| CommitFailure { step, source }
}

/// Renames the staged outputs of `change` into place (the pages last),
/// renames the staged catalog into place, makes all of it durable (the
/// second barrier), then deletes what the change drops, makes that durable
/// (a third barrier, when anything is deleted) and drops the journal.
/// Called once [`make_durable`] has returned.
pub(super) fn commit(
    root: &Root,
    change: &Change<'_>,
    staged: StagedRoot,
    process: &ProcessState,
) -> Result<CommittedRoot, CommitFailure> {
    let Moved {
        touched,
        copied_across,
    } = move_into_place(
        root,
        change
            .writes
            .iter()
            .map(|w| &w.d.path)
            .zip(&staged.outputs)
            .filter_map(|(path, s)| Some((path, s.temp()?))),
        match staged.layout {
            Layout::Top => StagedAt::Top,
            Layout::Beside => StagedAt::Beside,
        },
        (staged.layout == Layout::Beside).then_some(&PerCore::for_io() as &dyn Workers),
    )?;
    failpoint::hit("publish.before_catalog");
    // The record of the outputs' looks only spares reading them again: a
    // failure to write it (a full disk) fails nothing, and the file it
    // leaves names looks the renamed files no longer have.
    if change.record_looks
        && change.is_large()
        && let Err(e) = record_looks(root, &change.writes, &staged.outputs)
    {
        log::warn!(
            "{}: cannot record the looks of the outputs in {SEEN_FILE} ({e}); the next large publication reads and hashes them again",
            root.path().display()
        );
    }
    let written = root
        .place_reserved(&staged.catalog, STATE_FILE)
        .map_err(failed_at(Step::Catalog))?;
    // The renames and the catalog's own rename become durable together;
    // until then the journal (durable) lets the next process settle
    // whatever a crash leaves.
    second_barrier(root, staged.sync, &touched, process).map_err(failed_at(Step::Barrier))?;
    log::debug!(
        "{}: catalog written at {}",
        root.path().display(),
        format_time(change.catalog.updated_at)
    );
    failpoint::hit("publish.after_catalog");
    // The catalog in force no longer records what goes now: a crash from
    // here on leaves files that the journal's recovery deletes.
    if !change.deletes.is_empty() {
        let touched = delete_after_catalog(root, &change.deletes)?;
        second_barrier(root, staged.sync, &touched, process).map_err(failed_at(Step::Barrier))?;
    }
    root.remove_file(JOURNAL_FILE)
        .map_err(failed_at(Step::Journal))?;
    // Every temporary file at the top was renamed into place or removed.
    process.catalog_cache().top_left_clean(root);
    Ok(CommittedRoot {
        catalog: written,
        texts: staged.texts,
        copied_across,
    })
}

/// Makes what [`commit`] renamed and wrote, or deleted, durable: one
/// barrier, or a fsync of every folder `touched` (that still exists).
fn second_barrier(
    root: &Root,
    sync: SyncMode,
    touched: &BTreeSet<String>,
    process: &ProcessState,
) -> io::Result<()> {
    match sync {
        SyncMode::Barrier => root.sync(),
        SyncMode::FileByFile => {
            let mut folders: Vec<Syncable> = Vec::new();
            for folder in touched {
                if let Some(dir) = root.folder_if_any(folder)? {
                    folders.push(Box::new(dir));
                }
            }
            process.syncs().sync_at_once(folders)
        }
    }
}

/// One planned write, as [`stage_one`] takes it.
struct Job<'a> {
    d: &'a Desired,
    /// The catalog record this write replaces, if any.
    old: Option<&'a OutputRecord>,
    /// The bytes, when the publication holds them (rendered HTML,
    /// markdown read for rendering); else the bundle file is copied.
    in_memory: Option<&'a Content>,
    bundle: &'a VerifiedBundle,
    /// What the root's files looked like when their bytes were last known
    /// (read for a large publication only).
    seen: Option<&'a HashCache>,
}

/// Whether the catalog record `old` (the one a write replaces) already
/// names the bytes `d` wants.
pub(super) fn records_same(old: Option<&OutputRecord>, d: &Desired) -> bool {
    old.is_some_and(|o| o.sha256 == d.sha256 && o.size == d.size)
}

/// Stages one planned write: nothing when the target already holds the
/// bytes ([`StagedOutput::Unchanged`]), else a temporary file, not fsynced: at
/// the top of the root with the file going to `to_sync` when that is
/// given, else in the target folder (created as needed) and covered by
/// the caller's barrier. A copied file is hashed as it streams and must
/// match the manifest.
fn stage_one(
    root: &Root,
    job: &Job<'_>,
    to_sync: Option<&mut Vec<std::fs::File>>,
) -> Result<StagedOutput, Failure> {
    let d = job.d;
    if records_same(job.old, d) {
        let path = d.path.as_str();
        let before = SystemTime::now();
        if let Some(seen) = job.seen
            && let Some(look) = root.look(path).map_err(Failure::Io)?
            && look.size == d.size
            && seen.vouches(path, &d.sha256, &look)
        {
            return Ok(StagedOutput::Unchanged(look.settled(before)));
        }
        if let Some(look) = root.holds(path, &d.sha256, d.size).map_err(Failure::Io)? {
            return Ok(StagedOutput::Unchanged(look.settled(before)));
        }
    }
    // A small publication stages at the top of the root, before its
    // journal exists (see `stage`); a large one beside each target.
    let at_top = to_sync.is_some();
    let (temp, file, copied) = stage_output(root, d, job.in_memory, &job.bundle.dir, at_top)?;
    if let Some(got) = copied
        && (got.sha256 != d.sha256 || got.size != d.size)
    {
        if job.in_memory.is_some() {
            return Err(Failure::Io(io::Error::other(format!(
                "{}: the bytes staged ({} bytes, sha256 {}) are not those planned ({} bytes, sha256 {}): the temporary file holding the rendered page or precompressed sibling changed; check the disk of the spool's work folder",
                d.path, got.size, got.sha256, d.size, d.sha256
            ))));
        }
        let listed = job
            .bundle
            .manifest
            .files
            .iter()
            .find(|f| f.path == d.bundle_path)
            .expect("copied outputs come from listed files");
        return Err(Failure::Bundle(bundle::BundleError::Invalid {
            problems: vec![bundle::mismatch_problem(listed, &got)],
        }));
    }
    if let Some(to_sync) = to_sync {
        to_sync.push(file);
    }
    failpoint::hit("publish.after_stage");
    Ok(StagedOutput::Temp(temp))
}

/// Creates the folders `writes` go into, one after the other, before they
/// are staged on several threads: creating a folder holds its parent's
/// lock while the file system looks for a free inode, and workers creating
/// sibling folders at once spent a fifth of a nested backlog's CPU
/// waiting for each other.
fn make_folders<'d>(root: &Root, writes: impl Iterator<Item = &'d Desired>) -> io::Result<()> {
    let mut last: Option<&str> = None;
    for d in writes {
        let parent = d.path.parent();
        if parent.is_some() && parent != last {
            root.parent_dir(&d.path, true)?;
        }
        last = parent;
    }
    Ok(())
}

/// Removes what a change deletes after its catalog: a file, a link (never
/// its target) or an empty folder. A folder with something in it, where
/// the catalog recorded a file, is someone else's (only clearing, for
/// `force_replace` or a path a planned file needs, removes a whole tree):
/// it stays, with a warning, and the new catalog no longer records it.
fn remove_deleted(root: &Root, path: &str) -> io::Result<()> {
    if !root.remove_output(path)? {
        log::warn!(
            "{}/{path}: a folder with content now sits where this destination's output was; distributor left it as it is and dropped its record. Move or delete that folder by hand if it should not be published",
            root.path().display()
        );
    }
    Ok(())
}

/// Removes what a change clears before its writes, durably. The journal
/// must be durable first.
fn clear_first(root: &Root, clear: &[String]) -> Result<(), Failure> {
    for entry in clear {
        root.remove_any(entry).map_err(Failure::Io)?;
        failpoint::hit("publish.after_clear");
    }
    if !clear.is_empty() {
        storage::sync_dir(root.dir()).map_err(Failure::Io)?;
    }
    Ok(())
}

/// Writes one output to a new temporary file at the top of the root when
/// `at_top`, else in its target folder (created as needed): bytes the
/// publication holds, or the bundle file. Returns the
/// temporary name, the open file (not fsynced) and, for bytes read from a
/// file (the bundle's, or a rendered page's scratch file), their hash as
/// they were copied, for the caller to check.
fn stage_output(
    root: &Root,
    d: &Desired,
    in_memory: Option<&Content>,
    bundle_dir: &Path,
    at_top: bool,
) -> Result<(String, std::fs::File, Option<Hashed>), Failure> {
    let beside;
    let dir: &cap_std::fs::Dir = if at_top {
        root.dir()
    } else {
        beside = root.parent_dir(&d.path, true).map_err(Failure::Io)?;
        &beside
    };
    let (temp, mut file) = storage::create_temp(dir).map_err(Failure::Io)?;
    let copied = match in_memory {
        // Bytes in memory were hashed when they were made; a page read back
        // from its temporary file is hashed again on the way.
        Some(content) if !content.is_spilled() => {
            io::copy(&mut content.reader(), &mut file).map_err(Failure::Io)?;
            None
        }
        Some(content) => Some(
            hashing::copy_hashed(
                &mut content.reader(),
                Some(&mut storage::WriteBehind::new(&mut file)),
                None,
            )
            .map_err(Failure::Io)?,
        ),
        None => {
            let source =
                bundle::open_listed(bundle_dir, &d.bundle_path).map_err(Failure::Bundle)?;
            let got = hashing::copy_hashed(
                &mut (&source),
                Some(&mut storage::WriteBehind::new(&mut file)),
                Some(d.size),
            )
            .map_err(Failure::Io)?;
            Some(got)
        }
    };
    Ok((temp, file, copied))
}

/// Replaces the root's `.distributor-seen` with the look of every output
/// of a large publication, now that the written ones are in place (a
/// rename gives a file a new change time), so that its next publication
/// knows the unchanged ones without reading them.
fn record_looks(root: &Root, writes: &[Write<'_>], staged: &[StagedOutput]) -> io::Result<()> {
    let looks = writes.iter().zip(staged).filter_map(|(w, s)| {
        let d = w.d;
        let look = match s {
            StagedOutput::Unchanged(look) => Ok(*look),
            StagedOutput::Temp(_) => {
                let before = SystemTime::now();
                root.look(d.path.as_str())
                    .map(|l| l.and_then(|l| l.settled(before)))
            }
        };
        // A written file of another size was changed since: leave it out.
        look.map(|l| l.filter(|l| l.size == d.size))
            .transpose()
            .map(|l| l.map(|l| (d.path.as_str(), l, &d.sha256)))
    });
    hash_cache::write(root, looks)
}

/// Where [`move_into_place`] finds the staged files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StagedAt {
    /// Beside their targets.
    Beside,
    /// At the top of the root; the targets' folders are created as needed.
    Top,
}

/// What [`move_into_place`] did.
struct Moved {
    /// Every folder touched, the root always included (the catalog is
    /// renamed there), for the caller's fsyncs.
    touched: BTreeSet<String>,
    /// Outputs copied into a folder on another file system than the root
    /// (the slow path of outputs staged at the top; logged each time).
    copied_across: u64,
}

/// The folders above `path` (the root, "", is always among those touched).
fn touch_above(touched: &mut BTreeSet<String>, path: &str) {
    let mut above = path;
    while let Some(i) = above.rfind('/') {
        above = &above[..i];
        touched.insert(above.to_owned());
    }
}

/// Renames staged temporary files over their targets: every output that is
/// not a page first, then the pages ([`crate::paths::pages_last`]), so that
/// a page never appears before a file it may refer to. Each group's renames
/// run on `parallel` when given; the pages start once every other rename
/// is done.
fn move_into_place<'p>(
    root: &Root,
    staged: impl Iterator<Item = (&'p RelPath, &'p String)>,
    at: StagedAt,
    parallel: Option<&dyn Workers>,
) -> Result<Moved, CommitFailure> {
    let copied_across = AtomicU64::new(0);
    let mut touched = BTreeSet::from([String::new()]);
    let (others, pages) = crate::paths::pages_last(staged, |(path, _)| path.as_str());
    for (path, _) in others.iter().chain(&pages) {
        touch_above(&mut touched, path.as_str());
    }
    let rename = |(path, temp): &(&RelPath, &String)| -> io::Result<()> {
        let dir = root.parent_dir(path, at == StagedAt::Top)?;
        let from: &cap_std::fs::Dir = match at {
            StagedAt::Top => root.dir(),
            StagedAt::Beside => &dir,
        };
        // Both names are single segments in their folders (a temporary
        // name and a checked path's last segment): nothing to resolve.
        // The file replaced, if any, is freed off this path.
        let held = replace_file::hold(&dir, path.file_name());
        match rustix::fs::renameat(from, temp.as_str(), &*dir, path.file_name()) {
            Ok(()) => {}
            Err(rustix::io::Errno::XDEV) => {
                let beside = copy_across(root, temp, &dir)?;
                copied_across.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "{}: the folder of {path} is on another file system than the root; its output was copied across (a root is best one file system: outputs are staged at its top)",
                    root.path().display()
                );
                rustix::fs::renameat(&*dir, beside.as_str(), &*dir, path.file_name())?;
            }
            Err(e) => return Err(e.into()),
        }
        replace_file::release_later(held);
        failpoint::hit("publish.after_rename");
        Ok(())
    };
    let same_folder =
        |a: &(&RelPath, &String), b: &(&RelPath, &String)| a.0.parent() == b.0.parent();
    for group in [&others, &pages] {
        match parallel {
            // Renaming over an existing file waits for the old one's blocks
            // to be freed (and, with `discard`, trimmed): a few of those
            // waits at once go faster than one after the other. Order
            // within a group does not matter: the journal covers every
            // path, and the catalog comes after all.
            Some(workers) => map_on_runs(workers, group, same_folder, rename)
                .into_iter()
                .collect::<io::Result<Vec<()>>>()
                .map(drop),
            None => group.iter().try_for_each(rename),
        }
        .map_err(failed_at(Step::Rename))?;
    }
    Ok(Moved {
        touched,
        copied_across: copied_across.into_inner(),
    })
}

/// Deletes what `change` drops (and prunes the folders left empty), once
/// its catalog is durable. Returns the folders touched, for the caller's
/// fsyncs.
fn delete_after_catalog(
    root: &Root,
    deletes: &[String],
) -> Result<BTreeSet<String>, CommitFailure> {
    let mut touched = BTreeSet::from([String::new()]);
    for path in deletes {
        remove_deleted(root, path)
            .and_then(|()| root.prune_empty_parents(path))
            .map_err(failed_at(Step::Delete(path.clone())))?;
        failpoint::hit("publish.after_delete");
        touch_above(&mut touched, path);
    }
    Ok(touched)
}

/// Copies the staged file `temp` at the top of `root` to a new temporary
/// file in `dir` (a folder on another file system), fsynced, and removes
/// `temp`. Returns the new temporary name.
fn copy_across(root: &Root, temp: &str, dir: &cap_std::fs::Dir) -> io::Result<String> {
    let mut from = root.dir().open(temp)?;
    let (beside, mut to) = storage::create_temp(dir)?;
    io::copy(&mut from, &mut to)?;
    to.sync_all()?;
    root.dir().remove_file(temp)?;
    Ok(beside)
}

/// After a failure, settles the root from its journal (if one was written):
/// temporary files and new folders go, and the catalog records exactly what
/// is on disk. The original error is what gets reported; when settling
/// fails too, why (the journal stays, and the next holder of the lock
/// finishes it).
pub(super) fn roll_back(root: &Root, memory: &CatalogCache) -> io::Result<()> {
    crate::backend::local::journal::recover(root, true, crate::runtime::clock::now_millis(), memory)
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_change_waits_on_one_barrier_unless_much_else_waits_to_be_written() {
        const MIB: u64 = 1 << 20;
        // (own bytes, what the kernel has waiting, mode)
        let cases = [
            (0, Some(0), SyncMode::Barrier),
            (4096, Some(4096), SyncMode::Barrier),
            // Some of the machine's other data, up to the slack.
            (4096, Some(4096 + BARRIER_SLACK), SyncMode::Barrier),
            (4096, Some(4096 + BARRIER_SLACK + 1), SyncMode::FileByFile),
            // A big output of its own is no reason to fsync file by file.
            (
                512 * MIB,
                Some(512 * MIB + BARRIER_SLACK / 2),
                SyncMode::Barrier,
            ),
            (MIB, Some(200 * MIB), SyncMode::FileByFile),
            // Not knowing is taken for a busy machine.
            (0, None, SyncMode::FileByFile),
            (u64::MAX, Some(u64::MAX), SyncMode::Barrier),
        ];
        for (own, unwritten, want) in cases {
            assert_eq!(sync_mode(own, unwritten), want, "{own} {unwritten:?}");
        }
    }

    /// Records the size of each write it is given; asks `cancel` to
    /// finish once it took `stop_after` of them.
    #[derive(Default)]
    struct Pieces {
        bytes: Vec<u8>,
        sizes: Vec<usize>,
        stop_after: Option<(usize, Cancel)>,
    }

    impl io::Write for Pieces {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.bytes.extend_from_slice(buf);
            self.sizes.push(buf.len());
            if let Some((n, cancel)) = &self.stop_after
                && self.sizes.len() >= *n
            {
                cancel.finish();
            }
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_catalog_write_passes_on_bounded_pieces_and_stops_within_one() {
        use std::io::Write as _;
        let data: Vec<u8> = (0..10 * STOPPABLE_PIECE + 17).map(|i| i as u8).collect();
        // (pieces passed on before the stop, bytes that get through)
        let cases = [
            (usize::MAX, data.len()),
            (0, 0),
            (1, STOPPABLE_PIECE),
            (3, 3 * STOPPABLE_PIECE),
        ];
        for (go_on, through) in cases {
            let cancel = Cancel::new();
            if go_on == 0 {
                cancel.finish();
            }
            let mut out = Pieces {
                stop_after: Some((go_on, cancel.clone())),
                ..Pieces::default()
            };
            let result = Stoppable {
                inner: &mut out,
                cancel: &cancel,
            }
            .write_all(&data);
            assert_eq!(out.bytes.len(), through, "{go_on}");
            assert_eq!(out.bytes, data[..through], "{go_on}");
            assert!(out.sizes.iter().all(|&n| n <= STOPPABLE_PIECE), "{go_on}");
            match result {
                Ok(()) => assert_eq!(through, data.len()),
                Err(e) => assert!(crate::runtime::interrupt::is_stopped(&e), "{go_on}: {e}"),
            }
        }
        // Through serde too, the stop is the error that comes out.
        let catalog = crate::catalog::Catalog::new(time::OffsetDateTime::UNIX_EPOCH);
        let stopping = Cancel::new();
        stopping.finish();
        let mut out = Pieces::default();
        let e = catalog
            .write_json(&mut Stoppable {
                inner: &mut out,
                cancel: &stopping,
            })
            .unwrap_err();
        assert!(crate::runtime::interrupt::is_stopped(&e), "{e}");
        assert!(out.bytes.is_empty());
    }
}
