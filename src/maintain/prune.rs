//! Retention pruning of one owner's outputs: the selection
//! ([`select_prunable`]) applied through the root's commit (journaled
//! first in a local root; a compare-and-swap in a bucket, planned again
//! when another publisher changed a selected record meanwhile). It must
//! never delete what the policy did not select, a symlink's target, or a
//! folder standing at a selected path.

use super::selection::select_prunable;
use super::session::{Opened, open, read, report_pending};
use super::{MaintainError, OwnedRoot, ROUNDS, json_text};
use crate::backend::{Access, Change, Fault};
use crate::catalog::Catalog;
use serde::Serialize;
use std::fmt::Write as _;
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
/// `apply` it deletes the selected outputs (a symlink now at a selected path
/// is removed, never its target; a folder now there is left alone, keeps
/// its record and is logged), drops the records of outputs deleted or
/// already gone, removes folders this emptied, and rewrites the catalog
/// with `updated_at = now`, all through the commit a publication makes: if
/// the process dies half-way, whoever opens the root next drops the right
/// records.
pub fn prune(
    target: &OwnedRoot,
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
    let select = |c: &Catalog| select_prunable(&c.outputs, target.pipeline_id, &d.id, policy, now);
    if !apply {
        let mut root = open(target, Access::Read, now)?;
        let catalog = read(target, &mut root)?;
        report_pending(target, &root)?;
        report.deletes = catalog.as_ref().map(select).unwrap_or_default();
        return Ok(report);
    }
    let mut root = open(target, Access::Write, now)?;
    let mut round = 1;
    loop {
        let Some(catalog) = read(target, &mut root)? else {
            return Ok(report);
        };
        let selected = select(&catalog);
        if selected.is_empty() {
            return Ok(report);
        }
        match delete(target, &mut root, catalog, selected, now) {
            Ok(deleted) => {
                report.deletes = deleted;
                return Ok(report);
            }
            // A publisher changed one of the selected records since the
            // catalog was read: select again from its catalog.
            Err(fault) if fault.lost_race() && round < ROUNDS => round += 1,
            Err(fault) => return Err(target.error(fault)),
        }
    }
}

/// Deletes the `selected` outputs of `catalog` and drops their records in
/// one commit, except where a folder now stands (left alone, with its
/// record). Returns the paths whose records were dropped.
fn delete(
    target: &OwnedRoot,
    root: &mut Opened,
    catalog: Catalog,
    selected: Vec<String>,
    now: OffsetDateTime,
) -> Result<Vec<String>, Fault> {
    let folders = root.folders_at(&selected)?;
    for path in &folders {
        log::warn!(
            "{}: prune of {}: {path} is now a folder, not the recorded file; left it and its record alone (inspect it, then run reconcile-state)",
            target.root_text(),
            target.owner()
        );
    }
    let deletes: Vec<String> = selected
        .into_iter()
        .filter(|p| !folders.contains(p))
        .collect();
    if !deletes.is_empty() {
        let owner = (target.pipeline_id, target.destination.id.as_str());
        root.delete_owned(Change::deleting(catalog, &deletes, owner, now))?;
    }
    log::info!(
        "{}: pruned {} output(s) of {}",
        target.root_text(),
        deletes.len(),
        target.owner()
    );
    Ok(deletes)
}
