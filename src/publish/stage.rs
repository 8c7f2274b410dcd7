//! Staging and committing one destination root: what storage holds at the
//! planned paths, the journal, outputs staged as temporary files, renamed
//! into place, the catalog written last, and settling after a failure.

use super::prepare::Prepared;
use super::{Failure, Planned, now_millis};
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{STATE_FILE, format_time};
use crate::failpoint;
use crate::hashing::{self, Hashed};
use crate::journal::{self, JOURNAL_FILE, Journal, JournalWrite};
use crate::paths::RelPath;
use crate::plan::{self, Desired};
use crate::storage::{self, Entry, Root};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

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

/// Writes the journal and every output of `p` as a fsynced temporary file,
/// hashing copies as they stream. Returns the temporary names, in the order
/// of `p.plan.writes`. Renames nothing.
pub(super) fn stage(
    p: &Planned,
    prepared: &Prepared<'_>,
    bundle: &VerifiedBundle,
    verified: &mut BTreeSet<RelPath>,
) -> Result<Vec<String>, Failure> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        return Ok(Vec::new()); // skip_same: nothing to do
    };
    let journal = Journal {
        writes: plan
            .writes
            .iter()
            .filter_map(|d| {
                catalog.get(d.path.as_str()).map(|new| JournalWrite {
                    new: new.clone(),
                    old: p.replaced.get(d.path.as_str()).cloned(),
                })
            })
            .collect(),
        deletes: plan
            .clear_first
            .iter()
            .chain(&plan.delete_after)
            .cloned()
            .collect(),
        created_dirs: missing_dirs(root, &plan.writes).map_err(Failure::Io)?,
        state_was_absent: p.state_was_absent,
    };
    root.write_reserved(JOURNAL_FILE, &journal.to_json())
        .map_err(Failure::Io)?;
    failpoint::hit("publish.after_journal");
    for entry in &plan.clear_first {
        root.remove_any(entry).map_err(Failure::Io)?;
        failpoint::hit("publish.after_clear");
    }
    if !plan.clear_first.is_empty() {
        storage::sync_dir(root.dir()).map_err(Failure::Io)?;
    }
    let mut staged = Vec::with_capacity(plan.writes.len());
    for d in &plan.writes {
        let (temp, file, copied) =
            stage_output(root, d, prepared.in_memory.get(&d.path), &bundle.dir)?;
        staged.push(temp);
        if let Some(got) = copied {
            if got.sha256 != d.sha256 || got.size != d.size {
                let listed = bundle
                    .manifest
                    .files
                    .iter()
                    .find(|f| f.path == d.bundle_path)
                    .expect("copied outputs come from listed files");
                return Err(Failure::Bundle(bundle::BundleError::Invalid {
                    problems: vec![bundle::mismatch_problem(listed, &got)],
                }));
            }
            verified.insert(d.bundle_path.clone());
        }
        // Every staged byte is on disk before anything is renamed into
        // place (the journal already is). Per-file fsync, not syncfs: a
        // busy neighbour on the same file system must not slow us down.
        file.sync_all().map_err(Failure::Io)?;
        failpoint::hit("publish.after_stage");
    }
    Ok(staged)
}

/// Writes one output to a new temporary file in its target folder (created
/// as needed): bytes already in memory, or the bundle file copied as it is
/// hashed. Returns the temporary name, the open file (not fsynced) and,
/// for a copy, the hash of the bytes copied, for the caller to check.
pub(super) fn stage_output(
    root: &Root,
    d: &Desired,
    in_memory: Option<&Vec<u8>>,
    bundle_dir: &Path,
) -> Result<(String, std::fs::File, Option<Hashed>), Failure> {
    let dir = root.parent_dir(&d.path, true).map_err(Failure::Io)?;
    let (temp, mut file) = storage::create_temp(&dir).map_err(Failure::Io)?;
    let copied = match in_memory {
        Some(bytes) => {
            io::Write::write_all(&mut file, bytes).map_err(Failure::Io)?;
            None
        }
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

/// Renames the staged outputs of `p` into place, deletes, writes the
/// catalog and drops the journal.
pub(super) fn commit(p: &Planned, staged: &[String]) -> io::Result<()> {
    let plan = &p.plan;
    let (Some(root), Some(catalog)) = (&p.root, &p.catalog) else {
        return Ok(());
    };
    let touched = move_into_place(
        root,
        plan.writes.iter().map(|d| &d.path).zip(staged),
        &plan.delete_after,
    )?;
    failpoint::hit("publish.before_catalog");
    root.write_reserved_data(STATE_FILE, &mut |w| catalog.write_json(w))?;
    // One fsync per folder makes the renames, the deletions and the
    // catalog's own rename durable together; until then the journal (already
    // durable) lets the next process settle whatever a crash leaves.
    for folder in &touched {
        root.sync_folder(folder)?;
    }
    log::debug!(
        "{}: catalog written at {}",
        root.path().display(),
        format_time(catalog.updated_at)
    );
    failpoint::hit("publish.after_catalog");
    root.remove_file(JOURNAL_FILE)?;
    Ok(())
}

/// Renames staged temporary files over their targets, then deletes (and
/// prunes emptied folders). Returns every folder touched, the root always
/// included (the catalog is renamed there), for the caller's fsyncs.
pub(super) fn move_into_place<'p>(
    root: &Root,
    staged: impl Iterator<Item = (&'p RelPath, &'p String)>,
    deletes: impl IntoIterator<Item = &'p String>,
) -> io::Result<BTreeSet<String>> {
    let mut touched = BTreeSet::from([String::new()]);
    let mut touch = |path: &str| {
        let mut above = path;
        while let Some(i) = above.rfind('/') {
            above = &above[..i];
            touched.insert(above.to_owned());
        }
    };
    for (path, temp) in staged {
        let dir = root.parent_dir(path, false)?;
        dir.rename(temp, &dir, path.file_name())?;
        failpoint::hit("publish.after_rename");
        touch(path.as_str());
    }
    for path in deletes {
        root.remove_any(path)?;
        root.prune_empty_parents(path)?;
        failpoint::hit("publish.after_delete");
        touch(path);
    }
    Ok(touched)
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
