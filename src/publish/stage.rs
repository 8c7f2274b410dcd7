//! Staging and committing one destination root: what storage holds at the
//! planned paths, the journal, outputs staged as temporary files, renamed
//! into place, the catalog written last, and settling after a failure.

use super::content::Content;
use super::prepare::Prepared;
use super::{Failure, Planned};
use crate::atomic;
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{OutputRecord, RecordTexts, STATE_FILE, format_time};
use crate::clock::now_millis;
use crate::failpoint;
use crate::hashing::{self, Hashed};
use crate::journal::{self, JOURNAL_FILE, JournalRef, JournalWriteRef};
use crate::paths::RelPath;
use crate::plan::{self, Desired};
use crate::remembered;
use crate::seen::{self, Look, SEEN_FILE, Seen};
use crate::storage::{self, Entry, Root, StagedFile};
use crate::workers::{PerCore, Syncable, Workers, map_on_runs, sync_at_once};
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
    for path in plan::probe_paths(desired) {
        let entry = match overlay.get(&path) {
            Some(e) => *e,
            None => root.entry(&path)?,
        };
        if entry != Entry::Missing {
            entries.insert(path, entry);
        }
    }
    Ok(entries)
}

/// Folders above the planned outputs that do not exist yet, shallowest first.
pub(super) fn missing_dirs(root: &Root, writes: &[Desired]) -> io::Result<Vec<String>> {
    let mut dirs = BTreeSet::new();
    for d in writes {
        dirs.extend(d.path.ancestors().map(str::to_owned));
    }
    let mut missing = Vec::new();
    for dir in dirs {
        if root.entry(&dir)? != Entry::Dir {
            missing.push(dir);
        }
    }
    missing.sort_by_key(|d| d.matches('/').count());
    Ok(missing)
}

/// What staging did for one planned write.
#[derive(Debug)]
pub(super) enum Staged {
    /// Written to this temporary file beside its target, to be renamed.
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

/// What [`stage`] leaves for [`commit`] in one root.
pub(super) struct StagedRoot {
    /// One for each planned write, in order.
    pub outputs: Vec<Staged>,
    /// The new catalog, already written and synced (with the outputs, one
    /// wait instead of two) when the publication is small enough to be
    /// made durable file by file.
    catalog: Option<StagedFile>,
    /// The text of that catalog's records, to remember with it.
    pub texts: Option<RecordTexts>,
}

impl Staged {
    pub(super) fn temp(&self) -> Option<&String> {
        match self {
            Staged::Temp(name) => Some(name),
            Staged::Unchanged(_) => None,
        }
    }
}

/// One planned write, as [`stage_one`] takes it.
pub(super) struct Job<'a> {
    pub(super) d: &'a Desired,
    /// The catalog record this write replaces, if any.
    pub(super) old: Option<&'a OutputRecord>,
    /// The bytes, when the publication holds them (rendered HTML,
    /// markdown read for rendering); else the bundle file is copied.
    pub(super) in_memory: Option<&'a Content>,
    pub(super) bundle: &'a VerifiedBundle,
    /// What the root's files looked like when their bytes were last known
    /// (read for a large publication only).
    pub(super) seen: Option<&'a Seen>,
}

/// From this many writes and deletes on, a publication makes its staged
/// files and renames durable with one barrier per file system (`syncfs`)
/// instead of a fsync per file and folder, and stages on several threads.
/// Below it, per-file fsyncs are cheaper (a few small files) and a busy
/// neighbour on the same file system cannot slow the publication down.
pub(super) const BARRIER_FROM: usize = 16;

/// Whether `plan` is made durable by barriers (see [`BARRIER_FROM`]).
pub(super) fn uses_barrier(plan: &plan::Plan) -> bool {
    plan.writes.len() + plan.delete_after.len() + plan.clear_first.len() >= BARRIER_FROM
}

/// Whether the catalog record `old` (the one a write replaces) already
/// names the bytes `d` wants.
fn records_same(old: Option<&OutputRecord>, d: &Desired) -> bool {
    old.is_some_and(|o| o.sha256 == d.sha256 && o.size == d.size)
}

/// Stages one planned write: nothing when the target already holds the
/// bytes ([`Staged::Unchanged`]), else a temporary file, not fsynced: at
/// the top of the root with the file going to `to_sync` when that is
/// given, else in the target folder (created as needed) and covered by
/// the caller's barrier. A copied file is hashed as it streams and must
/// match the manifest.
pub(super) fn stage_one(
    root: &Root,
    job: &Job<'_>,
    to_sync: Option<&mut Vec<std::fs::File>>,
) -> Result<Staged, Failure> {
    let d = job.d;
    if records_same(job.old, d) {
        let path = d.path.as_str();
        let before = SystemTime::now();
        if let Some(seen) = job.seen
            && let Some(look) = root.look(path).map_err(Failure::Io)?
            && look.size == d.size
            && seen.vouches(path, &d.sha256, &look)
        {
            return Ok(Staged::Unchanged(look.settled(before)));
        }
        if let Some(look) = root.holds(path, &d.sha256, d.size).map_err(Failure::Io)? {
            return Ok(Staged::Unchanged(look.settled(before)));
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
                "{}: the bytes staged ({} bytes, sha256 {}) are not those planned ({} bytes, sha256 {}): the temporary file holding the rendered page changed; check the disk of the spool's work folder",
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
    Ok(Staged::Temp(temp))
}

/// Writes the journal and stages every output of `p` (see [`stage_one`]),
/// hashing copies as they stream. Returns what was staged, in the order of
/// `p.plan.writes`. Renames nothing. Every staged byte is on disk before
/// this returns: fsynced one by one, or, for a large plan, staged on
/// `workers` and covered by one barrier.
pub(super) fn stage(
    p: &Planned,
    prepared: &Prepared<'_>,
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
    workers: &dyn Workers,
) -> Result<StagedRoot, Failure> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        // skip_same: nothing to do
        return Ok(StagedRoot {
            outputs: Vec::new(),
            catalog: None,
            texts: None,
        });
    };
    let journal = JournalRef {
        writes: plan
            .writes
            .iter()
            .filter_map(|d| {
                catalog.get(d.path.as_str()).map(|new| JournalWriteRef {
                    new,
                    old: p.replaced(d.path.as_str()),
                })
            })
            .collect(),
        deletes: plan
            .clear_first
            .iter()
            .chain(&plan.delete_after)
            .map(String::as_str)
            .collect(),
        created_dirs: missing_dirs(root, &plan.writes).map_err(Failure::Io)?,
        state_was_absent: p.state_was_absent,
    };
    // A small publication stages at the top of the root first, and writes
    // its journal (and catalog) while it does: one wait for all their
    // fsyncs. Nothing outside the top is touched until the journal is
    // durable, and whatever temporary files a crash leaves at the top, the
    // next holder of the lock removes. A large one, or one that must clear
    // paths first, journals first.
    let journal_first = uses_barrier(plan) || !plan.clear_first.is_empty();
    let mut journal = Some(journal);
    if journal_first {
        root.write_reserved_with(JOURNAL_FILE, &mut |w| {
            journal.as_ref().map_or(Ok(()), |j| j.write_json(w))
        })
        .map_err(Failure::Io)?;
        journal = None;
        failpoint::hit("publish.after_journal");
        clear_first(root, plan)?;
    }
    // Outputs the catalog records with the bytes wanted are checked on
    // disk; for many, the root's record of their looks spares reading them.
    let recorded_same = plan
        .writes
        .iter()
        .filter(|d| records_same(p.replaced(d.path.as_str()), d))
        .count();
    let seen = (recorded_same >= BARRIER_FROM).then(|| Seen::read(root));
    let jobs: Vec<Job> = plan
        .writes
        .iter()
        .map(|d| Job {
            d,
            old: p.replaced(d.path.as_str()),
            in_memory: prepared.in_memory.get(&d.path).map(|c| &**c),
            bundle,
            seen: seen.as_ref(),
        })
        .collect();
    let (staged, state, texts) = if uses_barrier(plan) {
        make_folders(root, plan.writes.iter()).map_err(Failure::Io)?;
        let same_folder = |a: &Job, b: &Job| a.d.path.parent() == b.d.path.parent();
        let staged = map_on_runs(workers, &jobs, same_folder, |job| {
            stage_one(root, job, None)
        })
        .into_iter()
        .collect::<Result<Vec<Staged>, Failure>>()?;
        root.sync().map_err(Failure::Io)?;
        (staged, None, None)
    } else {
        let mut files = Vec::new();
        let staged = jobs
            .iter()
            .map(|job| stage_one(root, job, Some(&mut files)))
            .collect::<Result<Vec<Staged>, Failure>>()?;
        // The new catalog is known: written now, it is synced with the
        // outputs, and only renamed into place after them.
        let before = remembered::texts(root);
        let mut texts = None;
        let state = root
            .stage_reserved(&mut |w| {
                texts = Some(catalog.write_json_reusing(w, before.as_deref())?);
                Ok(())
            })
            .map_err(Failure::Io)?;
        let journal = match &journal {
            Some(j) => Some(
                root.stage_reserved(&mut |w| j.write_json(w))
                    .map_err(Failure::Io)?,
            ),
            None => None,
        };
        let mut handles: Vec<Syncable> =
            files.into_iter().map(|f| Box::new(f) as Syncable).collect();
        handles.push(Box::new(state.file.clone()));
        if let Some(j) = &journal {
            handles.push(Box::new(j.file.clone()));
        }
        sync_at_once(handles).map_err(Failure::Io)?;
        if let Some(j) = &journal {
            root.place_reserved(j, JOURNAL_FILE).map_err(Failure::Io)?;
            storage::sync_dir(root.dir()).map_err(Failure::Io)?;
            failpoint::hit("publish.after_journal");
        }
        (staged, Some(state), texts)
    };
    if let Some(seen) = &seen {
        log::debug!(
            "{}: {} of {recorded_same} outputs recorded with the bytes wanted were known unchanged by their look in {SEEN_FILE}; the others were read and hashed",
            root.path().display(),
            seen.vouched()
        );
    }
    for (job, s) in jobs.iter().zip(&staged) {
        if job.in_memory.is_none() && matches!(s, Staged::Temp(_)) {
            verified.insert(job.d.bundle_path.clone());
        }
    }
    Ok(StagedRoot {
        outputs: staged,
        catalog: state,
        texts,
    })
}

/// Creates the folders `writes` go into, one after the other, before they
/// are staged on several threads: creating a folder holds its parent's
/// lock while the file system looks for a free inode, and workers creating
/// sibling folders at once spent a fifth of a nested backlog's CPU
/// waiting for each other.
pub(super) fn make_folders<'d>(
    root: &Root,
    writes: impl Iterator<Item = &'d Desired>,
) -> io::Result<()> {
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

/// Removes what `plan` clears before its writes, durably. The journal must
/// be durable first.
fn clear_first(root: &Root, plan: &plan::Plan) -> Result<(), Failure> {
    for entry in &plan.clear_first {
        root.remove_any(entry).map_err(Failure::Io)?;
        failpoint::hit("publish.after_clear");
    }
    if !plan.clear_first.is_empty() {
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
            let source = bundle::open_listed(bundle_dir, &d.bundle_path)
                .map_err(|p| Failure::Bundle(bundle::BundleError::Invalid { problems: vec![p] }))?;
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

/// What [`commit`] did.
pub(super) struct Committed {
    /// The look of the catalog file written, if any.
    pub catalog: Option<Look>,
    /// See [`Moved::copied_across`].
    pub copied_across: u64,
}

/// Renames the staged outputs of `p` into place, deletes, writes the
/// catalog and drops the journal.
pub(super) fn commit(p: &Planned, staged_root: &StagedRoot) -> io::Result<Committed> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        return Ok(Committed {
            catalog: None,
            copied_across: 0,
        });
    };
    let staged = &staged_root.outputs;
    let Moved {
        touched,
        copied_across,
    } = move_into_place(
        root,
        plan.writes
            .iter()
            .map(|d| &d.path)
            .zip(staged)
            .filter_map(|(path, s)| Some((path, s.temp()?))),
        if uses_barrier(plan) {
            StagedAt::Beside
        } else {
            StagedAt::Top
        },
        &plan.delete_after,
        uses_barrier(plan).then_some(&PerCore::for_io() as &dyn Workers),
    )?;
    failpoint::hit("publish.before_catalog");
    let written = if uses_barrier(plan) {
        record_looks(root, &plan.writes, staged)?;
        // One barrier makes the renames, the deletions and the catalog
        // durable together, however many folders they touched.
        let written = root.write_reserved_unsynced(STATE_FILE, &mut |w| catalog.write_json(w))?;
        root.sync()?;
        written
    } else {
        let written = match &staged_root.catalog {
            Some(state) => root.place_reserved(state, STATE_FILE)?,
            None => root.write_reserved_data(STATE_FILE, &mut |w| catalog.write_json(w))?,
        };
        // One fsync per folder, all at once, makes the renames, the
        // deletions and the catalog's own rename durable together; until
        // then the journal (already durable) lets the next process settle
        // whatever a crash leaves.
        let mut folders: Vec<Syncable> = Vec::new();
        for folder in &touched {
            if let Some(dir) = root.folder_if_any(folder)? {
                folders.push(Box::new(dir));
            }
        }
        sync_at_once(folders)?;
        written
    };
    log::debug!(
        "{}: catalog written at {}",
        root.path().display(),
        format_time(catalog.updated_at)
    );
    failpoint::hit("publish.after_catalog");
    root.remove_file(JOURNAL_FILE)?;
    Ok(Committed {
        catalog: Some(written),
        copied_across,
    })
}

/// Replaces the root's `.distributor-seen` with the look of every output
/// of a large publication, now that the written ones are in place (a
/// rename gives a file a new change time), so that its next publication
/// knows the unchanged ones without reading them.
fn record_looks(root: &Root, writes: &[Desired], staged: &[Staged]) -> io::Result<()> {
    let looks = writes.iter().zip(staged).filter_map(|(d, s)| {
        let look = match s {
            Staged::Unchanged(look) => Ok(*look),
            Staged::Temp(_) => {
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
    seen::write(root, looks)
}

/// Where [`move_into_place`] finds the staged files.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum StagedAt {
    /// Beside their targets.
    Beside,
    /// At the top of the root; the targets' folders are created as needed.
    Top,
}

/// What [`move_into_place`] did.
pub(super) struct Moved {
    /// Every folder touched, the root always included (the catalog is
    /// renamed there), for the caller's fsyncs.
    pub touched: BTreeSet<String>,
    /// Outputs copied into a folder on another file system than the root
    /// (the slow path of outputs staged at the top; logged each time).
    pub copied_across: u64,
}

/// Renames staged temporary files over their targets, then deletes (and
/// prunes emptied folders). Renames run on `parallel` when given.
pub(super) fn move_into_place<'p>(
    root: &Root,
    staged: impl Iterator<Item = (&'p RelPath, &'p String)>,
    at: StagedAt,
    deletes: impl IntoIterator<Item = &'p String>,
    parallel: Option<&dyn Workers>,
) -> io::Result<Moved> {
    let copied_across = AtomicU64::new(0);
    let mut touched = BTreeSet::from([String::new()]);
    let mut touch = |path: &str| {
        let mut above = path;
        while let Some(i) = above.rfind('/') {
            above = &above[..i];
            touched.insert(above.to_owned());
        }
    };
    let staged: Vec<(&RelPath, &String)> = staged.collect();
    for (path, _) in &staged {
        touch(path.as_str());
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
        let held = atomic::hold(&dir, path.file_name());
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
        atomic::release_later(held);
        failpoint::hit("publish.after_rename");
        Ok(())
    };
    let same_folder =
        |a: &(&RelPath, &String), b: &(&RelPath, &String)| a.0.parent() == b.0.parent();
    match parallel {
        // Renaming over an existing file waits for the old one's blocks to
        // be freed (and, with `discard`, trimmed): a few of those waits at
        // once go faster than one after the other. Order does not matter,
        // the journal covers every path, and the catalog comes after all.
        Some(workers) => map_on_runs(workers, &staged, same_folder, rename)
            .into_iter()
            .collect::<io::Result<Vec<()>>>()
            .map(drop)?,
        None => staged.iter().try_for_each(rename)?,
    }
    for path in deletes {
        root.remove_any(path)?;
        root.prune_empty_parents(path)?;
        failpoint::hit("publish.after_delete");
        touch(path);
    }
    Ok(Moved {
        touched,
        copied_across: copied_across.into_inner(),
    })
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
/// is on disk. The original error is what gets reported.
pub(super) fn roll_back(p: &Planned) {
    let Some(root) = &p.root else { return };
    if let Err(again) = journal::recover(root, true, now_millis()) {
        log::error!(
            "{}: could not settle after a failed publication ({again}); the journal stays and the next run will finish it",
            root.path().display()
        );
    }
}
