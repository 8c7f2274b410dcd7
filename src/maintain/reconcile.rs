//! Reconciling the catalog with storage: records whose file or object is
//! gone, and entries no record covers. It drops records only; it never
//! deletes a file or an object, or adopts unmanaged content.

use super::session::{in_scope, open, read};
use super::{MaintainError, OwnedRoot, ROUNDS, json_text};
use crate::backend::Access;
use crate::catalog::OutputRecord;
use crate::plan::Entry;
use crate::runtime::clock::now_millis;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Result of `reconcile-state` (`reconcile-state --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub dry_run: bool,
    /// Records in scope with no regular file at their path.
    pub missing: Vec<String>,
    /// Storage entries the catalog does not record (files, symlinks,
    /// special files, and empty folders).
    pub unmanaged: Vec<String>,
    /// Records actually dropped (always 0 on a dry run).
    pub removed_records: usize,
}

impl ReconcileReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let verb = if self.dry_run {
            "reconcile-state (dry run)"
        } else {
            "reconcile-state"
        };
        let _ = writeln!(
            out,
            "{verb}: {} missing, {} unmanaged",
            self.missing.len(),
            self.unmanaged.len()
        );
        for path in &self.missing {
            let _ = writeln!(out, "  missing    {}", crate::text::escape::inert(path));
        }
        for path in &self.unmanaged {
            let _ = writeln!(out, "  unmanaged  {}", crate::text::escape::inert(path));
        }
        if self.dry_run {
            if !self.missing.is_empty() {
                let _ = writeln!(
                    out,
                    "nothing was changed; run again without --dry-run to drop {} record(s)",
                    self.missing.len()
                );
            }
        } else {
            let _ = writeln!(out, "removed {} record(s)", self.removed_records);
        }
        out
    }
}

/// The records in scope whose path holds no regular file, given a listing
/// of the root (`MaintainRoot::survey`). Anything that is not a regular
/// file at the recorded path (a symlink, folder, special file, or nothing)
/// is missing.
pub(super) fn find_missing<'r>(
    records: impl Iterator<Item = &'r OutputRecord>,
    listing: &BTreeMap<String, Entry>,
) -> Vec<String> {
    let mut out: Vec<String> = records
        .filter(|r| !matches!(listing.get(r.path.as_str()), Some(Entry::File { .. })))
        .map(|r| r.path.as_str().to_owned())
        .collect();
    out.sort();
    out
}

/// The entries of a listing that the catalog does not record: every file,
/// symlink or special file that is not a regular file at a recorded path,
/// and every empty folder. A folder holding anything is not listed itself;
/// its unmanaged contents are.
pub(super) fn find_unmanaged(
    records: &[OutputRecord],
    listing: &BTreeMap<String, Entry>,
) -> Vec<String> {
    let recorded: BTreeSet<&str> = records.iter().map(|r| r.path.as_str()).collect();
    let non_empty: BTreeSet<&str> = listing
        .keys()
        .filter_map(|p| p.rfind('/').map(|i| &p[..i]))
        .collect();
    listing
        .iter()
        .filter(|(path, entry)| match entry {
            Entry::Missing => false,
            Entry::File { .. } => !recorded.contains(path.as_str()),
            Entry::Symlink | Entry::Other => true,
            Entry::Dir => !non_empty.contains(path.as_str()),
        })
        .map(|(path, _)| path.clone())
        .collect()
}

/// Compares the catalog with storage (docs/maintenance.md,
/// `reconcile-state`).
///
/// Reports the records in scope (the target's owner, or every record with
/// `all_owners`) whose path holds no regular file or object, and every
/// unmanaged entry of the root (outputs a publication in progress writes
/// are its own, not unmanaged). Without `dry_run` it drops the missing
/// records and rewrites the catalog (only when one was dropped). It deletes
/// nothing, adopts nothing and checks no digest.
pub fn reconcile(
    target: &OwnedRoot,
    all_owners: bool,
    dry_run: bool,
) -> Result<ReconcileReport, MaintainError> {
    let now = now_millis();
    let mut report = ReconcileReport {
        dry_run,
        missing: Vec::new(),
        unmanaged: Vec::new(),
        removed_records: 0,
    };
    let access = if dry_run { Access::Read } else { Access::Write };
    let mut root = open(target, access, now)?;
    let error = |f| target.error(f);
    let in_flight = root.in_flight(dry_run).map_err(error)?;
    let mut round = 1;
    loop {
        let catalog = read(target, &mut root)?;
        let listing = root.survey().map_err(error)?;
        let records = catalog.as_ref().map_or(&[][..], |c| &c.outputs);
        report.unmanaged = find_unmanaged(records, &listing);
        report.unmanaged.retain(|p| !in_flight.contains(p));
        // The listing only picks candidates; the root confirms each.
        let candidates = find_missing(in_scope(target, records, all_owners), &listing);
        report.missing = root.confirm_absent(candidates).map_err(error)?;
        let Some(mut catalog) = catalog else {
            return Ok(report);
        };
        if dry_run || report.missing.is_empty() {
            return Ok(report);
        }
        let missing: BTreeSet<&str> = report.missing.iter().map(String::as_str).collect();
        let before = catalog.outputs.len();
        let read_at = catalog.updated_at;
        catalog
            .outputs
            .retain(|r| !missing.contains(r.path.as_str()));
        catalog.updated_at = now;
        let removed = before - catalog.outputs.len();
        match root.swap_catalog(catalog, read_at) {
            Ok(()) => {
                report.removed_records = removed;
                log::info!(
                    "{}: dropped {} record(s) whose {} is gone",
                    target.root_text(),
                    report.removed_records,
                    root.capabilities().output_noun
                );
                return Ok(report);
            }
            // Someone committed since the catalog was read: look again.
            Err(fault) if fault.lost_race() && round < ROUNDS => round += 1,
            Err(fault) => return Err(error(fault)),
        }
    }
}
