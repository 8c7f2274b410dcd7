//! Retention pruning of one owner's outputs in a local root: the selection
//! ([`select_prunable`]) applied, journaled first. It must never delete what
//! the policy did not select, a symlink's target, or a folder standing at a
//! selected path.

use super::selection::select_prunable;
use super::session::{Access, open, write_catalog};
use super::{MaintainError, Target, io_error, json_text};
use crate::config::Backend;
use crate::journal::{JOURNAL_FILE, Journal};
use crate::storage::{Entry, Root};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io;
use time::OffsetDateTime;

/// Result of `prune` (`prune --json`). On a dry run `deletes` is what
/// would be deleted; with `--apply` it is what was deleted (or found
/// already gone) and whose records were dropped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub dry_run: bool,
    pub pipeline_id: String,
    pub destination_id: String,
    pub deletes: Vec<String>,
}

impl PruneReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    pub fn to_text(&self) -> String {
        let owner = format!("{}/{}", self.pipeline_id, self.destination_id);
        let mut out = String::new();
        let n = self.deletes.len();
        if n == 0 {
            let _ = writeln!(out, "prune {owner}: nothing to prune");
            return out;
        }
        let outputs = if n == 1 { "output" } else { "outputs" };
        if self.dry_run {
            let _ = writeln!(out, "prune {owner} (dry run): would delete {n} {outputs}");
        } else {
            let _ = writeln!(out, "prune {owner}: deleted {n} {outputs}");
        }
        for path in &self.deletes {
            let _ = writeln!(out, "  delete  {path}");
        }
        if self.dry_run {
            let _ = writeln!(out, "nothing was changed; run again with --apply to delete");
        }
        out
    }
}

/// Retention pruning for the target's owner (docs/contract.md §9, §11.7).
///
/// A dry run (`apply` false) reports the selection and changes nothing. With
/// `apply` it deletes the selected files (a symlink now at a selected path
/// is removed, never its target; a folder now there is left alone, keeps
/// its record and is logged), drops the records of files deleted or already
/// gone, removes folders this emptied, and rewrites the catalog with
/// `updated_at = now`. The deletions are journaled first, so if the process
/// dies half-way the next holder of the lock drops the right records.
pub fn prune(
    target: &Target,
    apply: bool,
    now: OffsetDateTime,
) -> Result<PruneReport, MaintainError> {
    let d = target.destination;
    let policy = d
        .prune
        .as_ref()
        .ok_or_else(|| MaintainError::NoPrunePolicy {
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: d.id.clone(),
            root: target.root_text(),
        })?;
    let mut report = PruneReport {
        dry_run: !apply,
        pipeline_id: target.pipeline_id.to_owned(),
        destination_id: d.id.clone(),
        deletes: Vec::new(),
    };
    if let Backend::S3(location) = &d.backend {
        return super::s3::prune(target, location, policy, apply, now, report);
    }
    let access = if apply { Access::Write } else { Access::Read };
    let Some(session) = open(target, access, now)? else {
        return Ok(report);
    };
    let Some(mut catalog) = session.catalog else {
        return Ok(report);
    };
    let selected = select_prunable(&catalog.outputs, target.pipeline_id, &d.id, policy, now);
    if !apply || selected.is_empty() {
        report.deletes = selected;
        return Ok(report);
    }

    let root = &session.root;
    let journal = Journal {
        deletes: selected.clone(),
        ..Journal::default()
    };
    root.write_reserved(JOURNAL_FILE, &journal.to_json())
        .map_err(io_error(target, format!("cannot write {JOURNAL_FILE}")))?;
    let mut dropped = BTreeSet::new();
    let mut failure = None;
    for path in &selected {
        match delete_output(root, path) {
            Ok(true) => {
                dropped.insert(path.clone());
            }
            Ok(false) => log::warn!(
                "{}: prune of {}: {path} is now a folder, not the recorded file; left it and its record alone (inspect it, then run reconcile-state)",
                target.root_text(),
                target.owner()
            ),
            Err(e) => {
                failure = Some(io_error(target, format!("cannot delete {path}"))(e));
                break;
            }
        }
    }
    catalog
        .outputs
        .retain(|r| !dropped.contains(r.path.as_str()));
    catalog.updated_at = now;
    if !dropped.is_empty() {
        // The deletions reach the disk before the catalog that forgets them.
        root.sync()
            .map_err(io_error(target, "cannot sync the deletions"))?;
        // If this fails the journal stays, and whoever takes the lock next
        // drops the records of the files deleted above.
        write_catalog(target, root, &catalog)?;
    }
    root.remove_file(JOURNAL_FILE)
        .map_err(io_error(target, format!("cannot remove {JOURNAL_FILE}")))?;
    log::info!(
        "{}: pruned {} output(s) of {}",
        target.root_text(),
        dropped.len(),
        target.owner()
    );
    if let Some(e) = failure {
        if !dropped.is_empty() {
            log::warn!(
                "{}: {} output(s) were deleted and their records dropped before the error",
                target.root_text(),
                dropped.len()
            );
        }
        return Err(e);
    }
    report.deletes = dropped.into_iter().collect();
    Ok(report)
}

/// Deletes the recorded output at `path`. `Ok(true)` when it is gone (or
/// already was), `Ok(false)` when a folder sits there and was left alone.
fn delete_output(root: &Root, path: &str) -> io::Result<bool> {
    match root.entry(path)? {
        Entry::Missing => Ok(true),
        Entry::Dir => Ok(false),
        Entry::File { .. } | Entry::Symlink | Entry::Other => {
            root.remove_file(path)?;
            root.prune_empty_parents(path)?;
            Ok(true)
        }
    }
}
