//! Maintenance of one destination root: retention pruning, reconciling the
//! catalog with storage, verifying managed outputs, and listing the catalog.
//!
//! Every operation works on one root, under its lock, through the
//! root-bounded operations of `storage`. Before reading the catalog it
//! classifies the state file and refuses (changing nothing) when it is
//! invalid, written by a newer tool, or legacy; it then finishes an
//! interrupted publication when it is about to write (`journal::recover`).
//! Read-only operations (dry runs, `verify`, `catalog`) create nothing: no
//! root, no lock file, no temporary file.
//!
//! It must never delete anything but the catalog-recorded outputs selected
//! by a prune policy, never touch another owner's outputs when scoped to
//! one, never adopt unmanaged content, and never print.

use crate::catalog::{Catalog, OutputRecord, STATE_FILE, State, format_time};
use crate::config::{Destination, PrunePolicy};
use crate::journal::{self, JOURNAL_FILE, Journal};
use crate::lock::{self, LockError, RootLock};
use crate::publish::now_millis;
use crate::storage::{Entry, Root};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io;
use std::time::Duration;
use time::OffsetDateTime;

/// The destination root a maintenance command works on, and whose outputs
/// are "its own" (the owner `pipeline_id` / `destination.id`).
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub pipeline_id: &'a str,
    pub destination: &'a Destination,
    pub lock_timeout: Duration,
}

impl Target<'_> {
    fn root_text(&self) -> String {
        self.destination.root.display().to_string()
    }

    fn owner(&self) -> String {
        format!("{}/{}", self.pipeline_id, self.destination.id)
    }
}

/// Why a maintenance command did not run (or did not finish).
#[derive(Debug, thiserror::Error)]
pub enum MaintainError {
    #[error(
        "pipeline {pipeline_id:?} destination {destination_id:?} (root {root}) has no retention policy, so there is nothing to prune; add `retention: {{prune: {{max_age: 30d, keep_latest: 1}}}}` to that destination in the config to enable pruning"
    )]
    NoPrunePolicy {
        pipeline_id: String,
        destination_id: String,
        root: String,
    },
    #[error(
        "{root}/{STATE_FILE} is invalid ({reason}); nothing was changed. Restore the file from a backup, or rebuild the root with `distributor run --pipeline {pipeline_id} --destination {destination_id} --force BUNDLE` (which deletes everything in the root) after reviewing it with --dry-run"
    )]
    InvalidState {
        root: String,
        reason: String,
        pipeline_id: String,
        destination_id: String,
    },
    #[error(
        "{root}/{STATE_FILE} has schema_version {schema_version}, written by a newer distributor (this one understands up to 4); nothing was changed. Maintain this root with the newer version"
    )]
    FutureState { root: String, schema_version: u64 },
    #[error(
        "{root}/{STATE_FILE} is legacy state (schema_version {schema_version}); maintenance needs a schema 4 catalog, and nothing was changed. The next publication to this root converts it (`distributor run --pipeline {pipeline_id} --destination {destination_id} BUNDLE`); run this command again afterwards"
    )]
    LegacyState {
        root: String,
        schema_version: u64,
        pipeline_id: String,
        destination_id: String,
    },
    #[error("{0}")]
    Lock(#[from] LockError),
    #[error(
        "{root}: {doing}: {source}; check the folder's permissions and free space, then run the command again"
    )]
    Io {
        root: String,
        doing: String,
        #[source]
        source: io::Error,
    },
}

impl MaintainError {
    /// The process exit code (SPEC §9, §11.9, §11.18).
    pub fn exit_code(&self) -> u8 {
        match self {
            MaintainError::NoPrunePolicy { .. } => 2,
            MaintainError::InvalidState { .. }
            | MaintainError::FutureState { .. }
            | MaintainError::LegacyState { .. } => 3,
            MaintainError::Lock(_) | MaintainError::Io { .. } => 1,
        }
    }

    /// Worth trying again later without anyone changing anything (a lock
    /// held elsewhere, an I/O error); the scheduled pruning uses this.
    pub fn is_transient(&self) -> bool {
        matches!(self, MaintainError::Lock(_) | MaintainError::Io { .. })
    }
}

fn io_error(target: &Target, doing: impl Into<String>) -> impl FnOnce(io::Error) -> MaintainError {
    let root = target.root_text();
    let doing = doing.into();
    move |source| MaintainError::Io {
        root,
        doing,
        source,
    }
}

// ---------------------------------------------------------------------------
// Reports

fn json_text<T: Serialize>(value: &T) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

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
            let _ = writeln!(out, "  missing    {path}");
        }
        for path in &self.unmanaged {
            let _ = writeln!(out, "  unmanaged  {path}");
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

/// Result of `verify` (`verify --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub ok: bool,
    pub checked: usize,
    pub missing: Vec<String>,
    pub mismatched: Vec<String>,
}

impl VerifyReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.ok {
            let _ = writeln!(out, "verify: {} output(s) checked: ok", self.checked);
        } else {
            let _ = writeln!(
                out,
                "verify: {} output(s) checked: {} missing, {} mismatched",
                self.checked,
                self.missing.len(),
                self.mismatched.len()
            );
        }
        for path in &self.missing {
            let _ = writeln!(out, "  missing     {path}");
        }
        for path in &self.mismatched {
            let _ = writeln!(out, "  mismatched  {path}");
        }
        out
    }
}

/// Result of `catalog` (`catalog --json`): every record of the root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatalogReport {
    pub root: String,
    pub outputs: Vec<OutputRecord>,
}

impl CatalogReport {
    /// Pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        json_text(self)
    }

    /// A table with aligned columns, one row per record.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.outputs.is_empty() {
            let _ = writeln!(out, "{}: no managed outputs", self.root);
            return out;
        }
        let n = self.outputs.len();
        let _ = writeln!(
            out,
            "{}: {n} managed output{}",
            self.root,
            if n == 1 { "" } else { "s" }
        );
        let header = ["PATH", "OWNER", "SOURCE", "KIND", "SIZE", "UPDATED"];
        let rows: Vec<[String; 6]> = self
            .outputs
            .iter()
            .map(|r| {
                [
                    r.path.as_str().to_owned(),
                    format!("{}/{}", r.pipeline_id, r.destination_id),
                    r.source.id.clone(),
                    r.kind.as_str().to_owned(),
                    r.size.to_string(),
                    format_time(r.updated_at),
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut line = |cells: [&str; 6]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i == 4 {
                    // Sizes are right-aligned.
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else if i == cells.len() - 1 {
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                }
                if i + 1 < cells.len() {
                    text.push_str("  ");
                }
            }
            let _ = writeln!(out, "{}", text.trim_end());
        };
        line(header);
        for row in &rows {
            line(row.each_ref().map(String::as_str));
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Pure decisions

/// The paths of the owner's records that `policy` prunes at `now`, sorted.
///
/// A record is prunable when its `updated_at` is strictly older than
/// `now - max_age` and its source is not among the owner's `keep_latest`
/// newest distinct sources (`id`, `digest`, `created`), newest by
/// `source.created` as an instant. Sources tied with the last kept one are
/// kept too: pruning never deletes a source as new as one it keeps.
/// Records of other owners are never selected.
pub fn select_prunable(
    records: &[OutputRecord],
    pipeline_id: &str,
    destination_id: &str,
    policy: &PrunePolicy,
    now: OffsetDateTime,
) -> Vec<String> {
    let owned: Vec<&OutputRecord> = records
        .iter()
        .filter(|r| r.owned_by(pipeline_id, destination_id))
        .collect();
    // A max_age too large to subtract means nothing is old enough.
    let Some(cutoff) = time::Duration::try_from(policy.max_age)
        .ok()
        .and_then(|age| now.checked_sub(age))
    else {
        return Vec::new();
    };

    let mut created: Vec<OffsetDateTime> = owned
        .iter()
        .map(|r| (&r.source.id, &r.source.digest, r.source.created))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|(_, _, c)| c)
        .collect();
    created.sort_by(|a, b| b.cmp(a));
    let keep_from = match usize::try_from(policy.keep_latest) {
        Ok(0) => None,
        Ok(n) => Some(created.get(n - 1).or(created.last()).copied()),
        Err(_) => Some(created.last().copied()),
    }
    .flatten();

    let mut out: Vec<String> = owned
        .into_iter()
        .filter(|r| r.updated_at < cutoff)
        .filter(|r| keep_from.is_none_or(|newest_kept| r.source.created < newest_kept))
        .map(|r| r.path.as_str().to_owned())
        .collect();
    out.sort();
    out
}

/// The records in scope whose path holds no regular file, given a listing
/// of the root (`Root::walk`). Anything that is not a regular file at the
/// recorded path (a symlink, folder, special file, or nothing) is missing.
fn find_missing<'r>(
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
fn find_unmanaged(records: &[OutputRecord], listing: &BTreeMap<String, Entry>) -> Vec<String> {
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

// ---------------------------------------------------------------------------
// Opening a root

/// What a command intends to do to the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Reads only: take the lock only if the lock file exists; create nothing.
    Read,
    /// May rewrite the catalog or delete outputs.
    Write,
}

/// An open, locked root and its catalog (`None`: no state file).
struct Session {
    root: Root,
    catalog: Option<Catalog>,
    _lock: Option<RootLock>,
}

/// Refuses state that maintenance cannot work on.
fn usable(target: &Target, state: State) -> Result<Option<Catalog>, MaintainError> {
    let root = target.root_text();
    match state {
        State::Absent => Ok(None),
        State::Catalog(c) => Ok(Some(c)),
        State::Invalid { reason } => Err(MaintainError::InvalidState {
            root,
            reason,
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: target.destination.id.clone(),
        }),
        State::Future { schema_version } => Err(MaintainError::FutureState {
            root,
            schema_version,
        }),
        State::Legacy { schema_version } => Err(MaintainError::LegacyState {
            root,
            schema_version,
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: target.destination.id.clone(),
        }),
    }
}

/// Opens and locks the target's root and reads its catalog.
///
/// `Ok(None)` when the root does not exist. The state file is classified
/// before anything is changed, so invalid, future and legacy state are
/// refused untouched. With [`Access::Write`] an interrupted publication is
/// finished first; with [`Access::Read`] the catalog returned is what
/// finishing it would leave, and nothing is written. A root with neither a
/// lock file nor a state file is never given a lock file.
fn open(
    target: &Target,
    access: Access,
    now: OffsetDateTime,
) -> Result<Option<Session>, MaintainError> {
    let Some(root) = Root::open(&target.destination.root)
        .map_err(io_error(target, "cannot open the destination root"))?
    else {
        return Ok(None);
    };
    let mut lock = lock::acquire_existing(&root, target.lock_timeout)?;
    let read_state = |root: &Root| {
        journal::read_state(root).map_err(io_error(target, format!("cannot read {STATE_FILE}")))
    };
    if access == Access::Write && lock.is_none() {
        // No lock file: only take (and so create) the lock when there is
        // something to change.
        let state = read_state(&root)?;
        let journaled = root
            .entry(JOURNAL_FILE)
            .map_err(io_error(target, format!("cannot read {JOURNAL_FILE}")))?
            != Entry::Missing;
        if matches!(state, State::Absent) && !journaled {
            return Ok(Some(Session {
                root,
                catalog: None,
                _lock: None,
            }));
        }
        usable(target, state)?;
        lock = Some(lock::acquire(&root, target.lock_timeout)?);
    }
    usable(target, read_state(&root)?)?;
    let apply = access == Access::Write;
    let state = journal::recover(&root, apply, now).map_err(io_error(
        target,
        "cannot finish the interrupted publication recorded in its journal",
    ))?;
    let catalog = usable(target, state)?;
    Ok(Some(Session {
        root,
        catalog,
        _lock: lock,
    }))
}

fn in_scope<'r>(
    target: &'r Target,
    records: &'r [OutputRecord],
    all_owners: bool,
) -> impl Iterator<Item = &'r OutputRecord> + 'r {
    records
        .iter()
        .filter(move |r| all_owners || r.owned_by(target.pipeline_id, &target.destination.id))
}

fn listing(target: &Target, root: &Root) -> Result<BTreeMap<String, Entry>, MaintainError> {
    Ok(root
        .walk()
        .map_err(io_error(target, "cannot list the destination root"))?
        .into_iter()
        .collect())
}

fn write_catalog(target: &Target, root: &Root, catalog: &Catalog) -> Result<(), MaintainError> {
    root.write_reserved(STATE_FILE, &catalog.to_json())
        .map_err(io_error(target, format!("cannot write {STATE_FILE}")))
}

// ---------------------------------------------------------------------------
// The operations

/// Retention pruning for the target's owner (SPEC §9, §11.7).
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

/// Compares the catalog with storage (seed "Repair Semantics").
///
/// Reports the records in scope (the target's owner, or every record with
/// `all_owners`) whose path holds no regular file, and every unmanaged
/// entry of the root. Without `dry_run` it drops the missing records and
/// rewrites the catalog (only when one was dropped). It deletes no file,
/// adopts nothing and checks no digest.
pub fn reconcile(
    target: &Target,
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
    let Some(session) = open(target, access, now)? else {
        return Ok(report);
    };
    let listing = listing(target, &session.root)?;
    let records = session.catalog.as_ref().map_or(&[][..], |c| &c.outputs);
    report.missing = find_missing(in_scope(target, records, all_owners), &listing);
    report.unmanaged = find_unmanaged(records, &listing);
    if dry_run || report.missing.is_empty() {
        return Ok(report);
    }
    if let Some(mut catalog) = session.catalog {
        let missing: BTreeSet<&str> = report.missing.iter().map(String::as_str).collect();
        let before = catalog.outputs.len();
        catalog
            .outputs
            .retain(|r| !missing.contains(r.path.as_str()));
        catalog.updated_at = now;
        write_catalog(target, &session.root, &catalog)?;
        report.removed_records = before - catalog.outputs.len();
        log::info!(
            "{}: dropped {} record(s) whose file is gone",
            target.root_text(),
            report.removed_records
        );
    }
    Ok(report)
}

/// Re-hashes every managed output in scope, streaming, and reports the
/// missing ones (no regular file at the path) and the mismatched ones (size
/// or SHA-256 differs from the record). Changes nothing, not even an
/// interrupted publication's journal: it checks what the catalog would say
/// once that is finished.
pub fn verify(target: &Target, all_owners: bool) -> Result<VerifyReport, MaintainError> {
    let mut report = VerifyReport {
        ok: true,
        checked: 0,
        missing: Vec::new(),
        mismatched: Vec::new(),
    };
    let Some(session) = open(target, Access::Read, now_millis())? else {
        return Ok(report);
    };
    let records = session.catalog.as_ref().map_or(&[][..], |c| &c.outputs);
    for r in in_scope(target, records, all_owners) {
        report.checked += 1;
        let path = r.path.as_str();
        let hashed = session
            .root
            .hash_file(path)
            .map_err(io_error(target, format!("cannot read {path}")))?;
        match hashed {
            None => report.missing.push(path.to_owned()),
            Some(h) if h.size != r.size || h.sha256 != r.sha256 => {
                report.mismatched.push(path.to_owned())
            }
            Some(_) => {}
        }
    }
    report.ok = report.missing.is_empty() && report.mismatched.is_empty();
    Ok(report)
}

/// Lists every record of the target's root (all owners).
pub fn catalog(target: &Target) -> Result<CatalogReport, MaintainError> {
    let mut report = CatalogReport {
        root: target.root_text(),
        outputs: Vec::new(),
    };
    if let Some(Session {
        catalog: Some(c), ..
    }) = open(target, Access::Read, now_millis())?
    {
        report.outputs = c.outputs;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{OutputKind, SourceIdentity, parse_time};
    use crate::config::Workflow;
    use crate::paths::RelPath;
    use std::path::Path;

    const DAY: u64 = 86_400;

    fn t(text: &str) -> OffsetDateTime {
        parse_time(text).unwrap()
    }

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    /// A record of owner `p/d` for source `id` created at `created`,
    /// last updated at `updated`.
    fn record(
        path: &str,
        owner: (&str, &str),
        id: &str,
        created: &str,
        updated: &str,
    ) -> OutputRecord {
        OutputRecord {
            path: RelPath::parse(path).unwrap(),
            pipeline_id: owner.0.to_owned(),
            destination_id: owner.1.to_owned(),
            source: SourceIdentity {
                id: id.to_owned(),
                digest: digest('a'),
                created: t(created),
            },
            kind: OutputKind::Source,
            source_path: None,
            transform: None,
            url: None,
            sha256: digest('b'),
            size: 0,
            created_at: t(updated),
            updated_at: t(updated),
        }
    }

    fn policy(days: u64, keep_latest: u32) -> PrunePolicy {
        PrunePolicy {
            max_age: Duration::from_secs(days * DAY),
            keep_latest,
        }
    }

    const NOW: &str = "2026-06-30T00:00:00Z";
    const ME: (&str, &str) = ("reports", "site");

    #[test]
    fn select_prunable_table() {
        // Three sources of ours (s1 oldest .. s3 newest), one of another
        // owner; every output last updated well before the cutoff unless
        // stated otherwise.
        let records = vec![
            record(
                "s1/a",
                ME,
                "s1",
                "2026-05-01T00:00:00Z",
                "2026-05-01T00:00:00Z",
            ),
            record(
                "s1/b",
                ME,
                "s1",
                "2026-05-01T00:00:00Z",
                "2026-05-01T00:00:00Z",
            ),
            record(
                "s2/a",
                ME,
                "s2",
                "2026-05-02T00:00:00Z",
                "2026-05-02T00:00:00Z",
            ),
            record(
                "s3/a",
                ME,
                "s3",
                "2026-05-03T00:00:00Z",
                "2026-05-03T00:00:00Z",
            ),
            record(
                "other/a",
                ("reports", "mirror"),
                "s0",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:00:00Z",
            ),
            record(
                "else/a",
                ("blog", "site"),
                "s0",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:00:00Z",
            ),
        ];
        let cases: &[(&str, PrunePolicy, &[&str])] = &[
            (
                "keep 0 prunes every old output",
                policy(10, 0),
                &["s1/a", "s1/b", "s2/a", "s3/a"],
            ),
            (
                "keep 1 protects the newest source",
                policy(10, 1),
                &["s1/a", "s1/b", "s2/a"],
            ),
            (
                "keep 2 protects the two newest",
                policy(10, 2),
                &["s1/a", "s1/b"],
            ),
            ("keep more than there are", policy(10, 9), &[]),
            ("max_age larger than every age", policy(365, 0), &[]),
            // Cutoff 2026-05-02T00:00Z: s2/a is exactly max_age old, not older.
            ("boundary is not older", policy(59, 0), &["s1/a", "s1/b"]),
            (
                "huge max_age prunes nothing",
                PrunePolicy {
                    max_age: Duration::MAX,
                    keep_latest: 0,
                },
                &[],
            ),
        ];
        for (name, policy, want) in cases {
            let got = select_prunable(&records, ME.0, ME.1, policy, t(NOW));
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn select_prunable_uses_updated_at_not_source_age() {
        // An old source re-published recently is not pruned.
        let records = vec![
            record(
                "old",
                ME,
                "s1",
                "2026-01-01T00:00:00Z",
                "2026-06-29T00:00:00Z",
            ),
            record(
                "new",
                ME,
                "s2",
                "2026-02-01T00:00:00Z",
                "2026-06-29T00:00:00Z",
            ),
        ];
        assert!(select_prunable(&records, ME.0, ME.1, &policy(7, 0), t(NOW)).is_empty());
    }

    #[test]
    fn keep_latest_compares_instants_and_distinct_identities() {
        let mut records = vec![
            // s1 written with an offset is the newer instant (09:00Z vs 08:00Z).
            record(
                "a",
                ME,
                "s1",
                "2026-05-01T11:00:00+02:00",
                "2026-05-01T00:00:00Z",
            ),
            record(
                "b",
                ME,
                "s2",
                "2026-05-01T08:00:00Z",
                "2026-05-01T00:00:00Z",
            ),
            // Same id as s2, different digest: a distinct, older identity.
            record(
                "c",
                ME,
                "s2",
                "2026-04-01T00:00:00Z",
                "2026-05-01T00:00:00Z",
            ),
        ];
        records[2].source.digest = digest('c');
        assert_eq!(
            select_prunable(&records, ME.0, ME.1, &policy(1, 1), t(NOW)),
            ["b", "c"]
        );
        assert_eq!(
            select_prunable(&records, ME.0, ME.1, &policy(1, 2), t(NOW)),
            ["c"]
        );
    }

    #[test]
    fn keep_latest_keeps_every_source_tied_with_the_last_kept() {
        let records = vec![
            record("x", ME, "x", "2026-05-02T00:00:00Z", "2026-05-01T00:00:00Z"),
            record("y", ME, "y", "2026-05-02T00:00:00Z", "2026-05-01T00:00:00Z"),
            record("z", ME, "z", "2026-05-01T00:00:00Z", "2026-05-01T00:00:00Z"),
        ];
        let sel = |keep| select_prunable(&records, ME.0, ME.1, &policy(1, keep), t(NOW));
        assert_eq!(sel(1), ["z"]);
        assert_eq!(sel(2), ["z"]);
        assert_eq!(sel(3), Vec::<String>::new());
        assert_eq!(sel(0), ["x", "y", "z"]);
    }

    #[test]
    fn other_owners_are_never_selected() {
        let records = vec![
            record(
                "a",
                ("reports", "mirror"),
                "s",
                "2020-01-01T00:00:00Z",
                "2020-01-01T00:00:00Z",
            ),
            record(
                "b",
                ("blog", "site"),
                "s",
                "2020-01-01T00:00:00Z",
                "2020-01-01T00:00:00Z",
            ),
        ];
        assert!(select_prunable(&records, ME.0, ME.1, &policy(0, 0), t(NOW)).is_empty());
    }

    fn listing_of(entries: &[(&str, Entry)]) -> BTreeMap<String, Entry> {
        entries.iter().map(|(p, e)| ((*p).to_owned(), *e)).collect()
    }

    #[test]
    fn missing_and_unmanaged_from_a_listing() {
        let f = Entry::File { size: 1 };
        let records = vec![
            record("a/kept", ME, "s", NOW, NOW),
            record("a/gone", ME, "s", NOW, NOW),
            record("link", ME, "s", NOW, NOW),
            record("dir", ME, "s", NOW, NOW),
            record("theirs", ("blog", "site"), "s", NOW, NOW),
        ];
        let listing = listing_of(&[
            ("a", Entry::Dir),
            ("a/kept", f),
            ("a-b", Entry::Dir),
            ("a-b/stray", f),
            ("dir", Entry::Dir),
            ("empty", Entry::Dir),
            ("empty/deeper", Entry::Dir),
            ("fifo", Entry::Other),
            ("link", Entry::Symlink),
            ("stray", f),
        ]);
        let mine: Vec<_> = records.iter().filter(|r| r.owned_by(ME.0, ME.1)).collect();
        assert_eq!(
            find_missing(mine.into_iter(), &listing),
            ["a/gone", "dir", "link"]
        );
        assert_eq!(
            find_missing(records.iter(), &listing),
            ["a/gone", "dir", "link", "theirs"]
        );
        assert_eq!(
            find_unmanaged(&records, &listing),
            ["a-b/stray", "dir", "empty/deeper", "fifo", "link", "stray"]
        );
    }

    // -- operations on a real folder ---------------------------------------

    fn destination(root: &Path, prune: Option<PrunePolicy>) -> Destination {
        Destination {
            id: ME.1.to_owned(),
            root: root.to_owned(),
            workflow: Workflow::Additive,
            prefix: String::new(),
            publish_source: true,
            publish_html: false,
            allow_raw_html: false,
            base_url: None,
            prune,
        }
    }

    /// Writes `files` into `root` and a catalog recording them for `ME`,
    /// sources created and updated on 2026-05-0N for the Nth file.
    fn seed(root: &Path, files: &[&str]) {
        let mut catalog = Catalog::new(t("2026-05-01T00:00:00Z"));
        for (i, path) in files.iter().enumerate() {
            let bytes = path.as_bytes();
            let full = root.join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, bytes).unwrap();
            let when = format!("2026-05-{:02}T00:00:00Z", i + 1);
            let mut r = record(path, ME, &format!("s{i}"), &when, &when);
            let h = crate::hashing::hash_bytes(bytes);
            r.sha256 = h.sha256;
            r.size = h.size;
            catalog.outputs.push(r);
        }
        catalog.sort();
        std::fs::write(root.join(STATE_FILE), catalog.to_json()).unwrap();
    }

    fn target(d: &Destination) -> Target<'_> {
        Target {
            pipeline_id: ME.0,
            destination: d,
            lock_timeout: Duration::from_secs(5),
        }
    }

    fn recorded(root: &Path) -> Vec<String> {
        let bytes = std::fs::read(root.join(STATE_FILE)).unwrap();
        let State::Catalog(c) = State::parse(&bytes) else {
            panic!("catalog expected")
        };
        c.outputs
            .iter()
            .map(|r| r.path.as_str().to_owned())
            .collect()
    }

    #[test]
    fn prune_removes_a_symlink_not_its_target_and_leaves_a_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), b"x").unwrap();
        let root = tmp.path();
        seed(root, &["a/link", "b/dir", "c/file", "d/newest"]);
        std::fs::remove_file(root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("precious"), root.join("a/link")).unwrap();
        std::fs::remove_file(root.join("b/dir")).unwrap();
        std::fs::create_dir(root.join("b/dir")).unwrap();
        let d = destination(root, Some(policy(1, 1)));
        let report = prune(&target(&d), true, t(NOW)).unwrap();
        assert_eq!(report.deletes, ["a/link", "c/file"]);
        assert!(outside.path().join("precious").exists());
        assert!(!root.join("a").exists(), "emptied folder removed");
        assert!(!root.join("c").exists());
        assert!(root.join("b/dir").is_dir());
        assert_eq!(recorded(root), ["b/dir", "d/newest"]);
        assert!(!root.join(JOURNAL_FILE).exists());
    }

    #[test]
    fn prune_dry_run_and_read_commands_create_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        seed(root, &["a", "b"]);
        let before = std::fs::read(root.join(STATE_FILE)).unwrap();
        let d = destination(root, Some(policy(1, 0)));
        let report = prune(&target(&d), false, t(NOW)).unwrap();
        assert_eq!(report.deletes, ["a", "b"]);
        assert!(verify(&target(&d), false).unwrap().ok);
        assert_eq!(catalog(&target(&d)).unwrap().outputs.len(), 2);
        reconcile(&target(&d), false, true).unwrap();
        assert_eq!(std::fs::read(root.join(STATE_FILE)).unwrap(), before);
        assert!(!root.join(lock::LOCK_FILE).exists());
        assert!(root.join("a").exists() && root.join("b").exists());
    }

    #[test]
    fn missing_root_or_catalog_reports_nothing_and_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("gone");
        let d = destination(&gone, Some(policy(0, 0)));
        assert!(prune(&target(&d), true, t(NOW)).unwrap().deletes.is_empty());
        assert_eq!(
            reconcile(&target(&d), true, false).unwrap().unmanaged.len(),
            0
        );
        assert_eq!(verify(&target(&d), true).unwrap().checked, 0);
        assert!(catalog(&target(&d)).unwrap().outputs.is_empty());
        assert!(!gone.exists());

        std::fs::write(tmp.path().join("stray"), b"").unwrap();
        let d = destination(tmp.path(), Some(policy(0, 0)));
        assert!(prune(&target(&d), true, t(NOW)).unwrap().deletes.is_empty());
        let r = reconcile(&target(&d), false, false).unwrap();
        assert_eq!(r.unmanaged, ["stray"]);
        assert!(!tmp.path().join(lock::LOCK_FILE).exists());
        assert!(!tmp.path().join(STATE_FILE).exists());
    }

    #[test]
    fn refused_states_have_exit_3_and_stay_untouched() {
        for (text, legacy) in [
            ("not json", false),
            (r#"{"schema_version": 9}"#, false),
            (r#"{"schema_version": 2, "outputs": []}"#, true),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            std::fs::write(tmp.path().join(STATE_FILE), text).unwrap();
            // A journal must not be "finished" over refused state.
            std::fs::write(
                tmp.path().join(JOURNAL_FILE),
                br#"{"writes":[],"deletes":[],"created_dirs":[],"state_was_absent":false}"#,
            )
            .unwrap();
            let d = destination(tmp.path(), Some(policy(0, 0)));
            let errors = [
                prune(&target(&d), true, t(NOW)).unwrap_err(),
                reconcile(&target(&d), false, false).unwrap_err(),
                verify(&target(&d), false).unwrap_err(),
                catalog(&target(&d)).unwrap_err(),
            ];
            for e in errors {
                assert_eq!(e.exit_code(), 3, "{e}");
                let message = e.to_string();
                assert!(
                    message.contains(&tmp.path().display().to_string()),
                    "{message}"
                );
                if legacy {
                    assert!(message.contains("next publication"), "{message}");
                }
            }
            assert_eq!(
                std::fs::read_to_string(tmp.path().join(STATE_FILE)).unwrap(),
                text
            );
            assert!(tmp.path().join(JOURNAL_FILE).exists());
        }
    }

    #[test]
    fn prune_without_a_policy_is_a_configuration_error() {
        let tmp = tempfile::tempdir().unwrap();
        let d = destination(tmp.path(), None);
        let e = prune(&target(&d), false, t(NOW)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("retention"), "{e}");
        assert!(e.to_string().contains("\"site\""), "{e}");
    }

    #[test]
    fn verify_finds_missing_and_mismatched_outputs() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        seed(root, &["same-size", "short", "gone", "fine"]);
        std::fs::write(root.join("same-size"), b"SAME-SIZE").unwrap();
        std::fs::write(root.join("short"), b"sh").unwrap();
        std::fs::remove_file(root.join("gone")).unwrap();
        let d = destination(root, None);
        let r = verify(&target(&d), false).unwrap();
        assert!(!r.ok);
        assert_eq!(r.checked, 4);
        assert_eq!(r.missing, ["gone"]);
        assert_eq!(r.mismatched, ["same-size", "short"]);
    }

    #[test]
    fn catalog_text_is_an_aligned_table() {
        let report = CatalogReport {
            root: "/srv/x".to_owned(),
            outputs: vec![
                record("a.html", ME, "s1", NOW, NOW),
                record("longer/path.md", ("blog", "site"), "s22", NOW, NOW),
            ],
        };
        let text = report.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let col = |line: &str, word: &str| line.find(word).unwrap();
        assert_eq!(col(lines[1], "OWNER"), col(lines[2], "reports/site"));
        assert_eq!(col(lines[2], "reports/site"), col(lines[3], "blog/site"));
        assert_eq!(
            col(lines[1], "UPDATED"),
            col(lines[3], "2026-06-30T00:00:00Z")
        );
    }
}
