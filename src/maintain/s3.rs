//! The maintenance commands on an s3 root (docs/contract.md §15.5): the same reports
//! as for a local root, with the bucket's conditional writes standing in
//! for the lock and the journal (docs/object-storage.md).
//!
//! - Commands that write (`prune --apply`, `reconcile-state`) first
//!   recover stale intents (`protocol::recover_stale`, ages by the server's
//!   clock), so a publisher that died on any host converges. Read-only
//!   ones (`verify`, `catalog`, every dry run) write nothing, not even the
//!   conformance probe: they log each pending intent instead.
//! - `prune` drops records and deletes objects through `protocol::commit`
//!   with no writes: the catalog change is a compare-and-swap (rebased on
//!   a concurrent publisher's commit when that touched none of the pruned
//!   paths, planned again otherwise), and an object is deleted only after
//!   the catalog that drops it is in force, and only while it holds the
//!   recorded sha256.
//! - `reconcile-state` drops a record only when a HEAD finds no object;
//!   the LIST it also makes feeds the report (unmanaged objects) and picks
//!   which records to HEAD, never a commit decision.

use std::collections::BTreeSet;

use super::selection::select_prunable;
use super::session::{in_scope, usable};
use super::{CatalogReport, MaintainError, PruneReport, ReconcileReport, Target, VerifyReport};
use crate::catalog::{Catalog, State, format_time};
use crate::config::{PrunePolicy, S3Location};
use crate::paths::is_reserved_name;
use crate::s3::protocol::{self, Base, Delete, Intent, Settings};
use crate::s3::{self, S3Root};
use time::OffsetDateTime;

/// GETs in flight while `verify` re-hashes objects.
const VERIFY_CONCURRENCY: usize = 8;
/// How often a command plans again after losing a compare-and-swap.
const ROUNDS: usize = 8;

/// The commit protocol's timing: the lease from the environment
/// (`DISTRIBUTOR_S3_LEASE_SECS`), as publishers use it.
fn settings(target: &Target) -> Result<Settings, MaintainError> {
    Settings::for_process().map_err(s3_error(target, "cannot read the lease setting"))
}

/// Turns an error of the bucket into one that names the root, what the
/// command was doing, and what to do about it.
fn s3_error<'a>(
    target: &'a Target,
    doing: &'a str,
) -> impl FnOnce(s3::Error) -> MaintainError + 'a {
    move |source| {
        let root = target.root_text();
        let text = source.to_string();
        let text = text
            .strip_prefix(&format!("{root}: "))
            .unwrap_or(&text)
            .to_owned();
        // The failure's own text already says what to correct for refused
        // credentials, denied access and a missing bucket.
        let hint = match &source {
            s3::Error::Store {
                failure:
                    s3::Failure::CredentialsRefused | s3::Failure::Denied | s3::Failure::BucketMissing,
                ..
            } => "",
            s3::Error::Store { .. } => {
                "; check the endpoint, the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the publisher's bucket permissions, then run the command again"
            }
            s3::Error::Conflict { .. } | s3::Error::Changed { .. } => {
                " (other publishers kept changing the root; run the command again)"
            }
            _ => "",
        };
        MaintainError::S3 {
            message: format!("{root}: {doing}: {text}{hint}"),
            source: Box::new(source),
        }
    }
}

/// The process's client for the bucket (shared with publication, so the
/// agent's scheduled pruning reuses its connections and its conformance
/// check).
fn open(target: &Target, location: &S3Location) -> Result<std::sync::Arc<S3Root>, MaintainError> {
    S3Root::shared(location).map_err(s3_error(target, "cannot open the bucket"))
}

/// The catalog (`None`: no catalog object) and its version; refuses
/// invalid, future and legacy state as for a local root.
fn read(target: &Target, root: &S3Root) -> Result<(Base, Option<Catalog>), MaintainError> {
    let base = root
        .read_state()
        .map_err(s3_error(target, "cannot read the catalog"))?;
    let catalog = usable(target, base.state.clone())?;
    Ok((base, catalog))
}

/// The intents under `.distributor-pending/` (a LIST: for reports), each
/// with the time the server last stamped it. An intent that finished
/// meanwhile is skipped; one that cannot be read is logged and skipped.
fn pending(
    target: &Target,
    root: &S3Root,
) -> Result<Vec<(String, Intent, OffsetDateTime)>, MaintainError> {
    let ids = protocol::pending_intents(root)
        .map_err(s3_error(target, "cannot list the pending publications"))?;
    let mut out = Vec::new();
    for id in ids {
        match root.read_intent(&id) {
            Ok(Some((intent, _, stamped))) => out.push((id, intent, stamped)),
            Ok(None) => {}
            Err(e @ s3::Error::Protocol { .. }) => log::warn!("{e}"),
            Err(e) => return Err(s3_error(target, "cannot read a pending publication")(e)),
        }
    }
    Ok(out)
}

/// For read-only commands: logs each publication in progress (or whose
/// publisher died) without touching it.
fn report_pending(target: &Target, root: &S3Root) -> Result<BTreeSet<String>, MaintainError> {
    let lease = settings(target)?.lease.as_secs();
    let mut writes = BTreeSet::new();
    for (id, intent, stamped) in pending(target, root)? {
        log::warn!(
            "{}: publication {id} by {} has not finished (last renewed {}; {} output(s) to write, {} to delete): it is in progress, or its publisher died. This command changes nothing; `prune --apply`, `reconcile-state` or the next publication recovers it once it has not been renewed for {lease}s. Until then the outputs it writes may differ from their records",
            target.root_text(),
            intent.owner,
            format_time(stamped),
            intent.writes.len(),
            intent.deletes.len(),
        );
        writes.extend(intent.writes.into_iter().map(|w| w.path));
    }
    Ok(writes)
}

/// For commands that write: refuses state maintenance cannot work on
/// (before changing anything, as for a local root), then recovers every
/// stale intent.
fn recover(target: &Target, root: &S3Root) -> Result<(), MaintainError> {
    read(target, root)?;
    let recovered = protocol::recover_stale(root, settings(target)?)
        .map_err(s3_error(target, "cannot recover an unfinished publication"))?;
    for (id, done) in recovered {
        log::info!(
            "{}: recovered the unfinished publication {id}: {} unrecorded object(s) it created deleted, {} record(s) it overwrote adopted, {} deletion(s) it committed finished",
            target.root_text(),
            done.deleted.len(),
            done.adopted.len(),
            done.finished_deletes.len()
        );
    }
    Ok(())
}

/// `catalog` on an s3 root.
pub(super) fn catalog(
    target: &Target,
    location: &S3Location,
) -> Result<CatalogReport, MaintainError> {
    let root = open(target, location)?;
    let (_, catalog) = read(target, &root)?;
    report_pending(target, &root)?;
    Ok(CatalogReport {
        root: target.root_text(),
        outputs: catalog.map(|c| c.outputs).unwrap_or_default(),
    })
}

/// `verify` on an s3 root: GETs and re-hashes every object in scope.
pub(super) fn verify(
    target: &Target,
    location: &S3Location,
    all_owners: bool,
) -> Result<VerifyReport, MaintainError> {
    let root = open(target, location)?;
    let (_, catalog) = read(target, &root)?;
    report_pending(target, &root)?;
    let records = catalog.as_ref().map_or(&[][..], |c| &c.outputs);
    let records: Vec<_> = in_scope(target, records, all_owners).collect();
    let paths: Vec<&str> = records.iter().map(|r| r.path.as_str()).collect();
    let hashed = root
        .get_hashed_all(&paths, VERIFY_CONCURRENCY)
        .map_err(s3_error(target, "cannot read a managed object"))?;
    let mut report = VerifyReport {
        ok: true,
        checked: records.len(),
        missing: Vec::new(),
        mismatched: Vec::new(),
    };
    for (r, got) in records.iter().zip(hashed) {
        match got {
            None => report.missing.push(r.path.as_str().to_owned()),
            Some((h, _)) if h.size != r.size || h.sha256 != r.sha256 => {
                report.mismatched.push(r.path.as_str().to_owned())
            }
            Some(_) => {}
        }
    }
    report.ok = report.missing.is_empty() && report.mismatched.is_empty();
    Ok(report)
}

/// `catalog` without the records at `paths`, stamped `now`.
fn without(catalog: &Catalog, paths: &BTreeSet<&str>, now: OffsetDateTime) -> Catalog {
    let mut next = catalog.clone();
    next.outputs.retain(|r| !paths.contains(r.path.as_str()));
    next.updated_at = now;
    next
}

/// `prune` on an s3 root; `report` comes in empty.
pub(super) fn prune(
    target: &Target,
    location: &S3Location,
    policy: &PrunePolicy,
    apply: bool,
    now: OffsetDateTime,
    mut report: PruneReport,
) -> Result<PruneReport, MaintainError> {
    let root = open(target, location)?;
    let d = target.destination;
    if !apply {
        let (_, catalog) = read(target, &root)?;
        report_pending(target, &root)?;
        if let Some(c) = catalog {
            report.deletes = select_prunable(&c.outputs, target.pipeline_id, &d.id, policy, now);
        }
        return Ok(report);
    }
    recover(target, &root)?;
    let settings = settings(target)?;
    for _ in 0..ROUNDS {
        let (base, catalog) = read(target, &root)?;
        let Some(catalog) = catalog else {
            return Ok(report);
        };
        let selected = select_prunable(&catalog.outputs, target.pipeline_id, &d.id, policy, now);
        if selected.is_empty() {
            return Ok(report);
        }
        match prune_once(&root, settings, base, &catalog, &selected, now) {
            Ok(()) => {
                log::info!(
                    "{}: pruned {} output(s) of {}",
                    target.root_text(),
                    selected.len(),
                    target.owner()
                );
                report.deletes = selected;
                return Ok(report);
            }
            // A publisher changed one of the selected records since the
            // catalog was read: select again from its catalog.
            Err(s3::Error::Conflict { .. }) => continue,
            Err(e) => return Err(s3_error(target, "cannot prune")(e)),
        }
    }
    Err(s3_error(target, "cannot prune")(s3::Error::Conflict {
        root: target.root_text(),
        key: crate::catalog::STATE_FILE.to_owned(),
    }))
}

/// One attempt: commits the catalog without `selected` (planned on
/// `base`), then deletes their objects if they still hold the recorded
/// bytes. A concurrent commit that touched none of `selected` is kept (the
/// drop is re-applied to its catalog); one that touched any of them makes
/// this fail with [`s3::Error::Conflict`], having deleted nothing.
fn prune_once(
    root: &S3Root,
    settings: Settings,
    base: Base,
    catalog: &Catalog,
    selected: &[String],
    now: OffsetDateTime,
) -> s3::Result<()> {
    let drop: BTreeSet<&str> = selected.iter().map(String::as_str).collect();
    let deletes: Vec<Delete> = catalog
        .outputs
        .iter()
        .filter(|r| drop.contains(r.path.as_str()))
        .map(|r| Delete {
            path: r.path.as_str().to_owned(),
            sha256: r.sha256.to_string(),
        })
        .collect();
    let next = without(catalog, &drop, now);
    let mut rebase = |latest: &State| match latest {
        State::Catalog(c) => Some(without(c, &drop, now)),
        _ => None,
    };
    protocol::commit(root, settings, base, next, Vec::new(), deletes, &mut rebase).map(|_| ())
}

/// Whether a listed key is one of the tool's own (a segment starting with
/// `.distributor`), as `Root::walk` skips them on disk.
fn reserved(key: &str) -> bool {
    key.split('/').any(is_reserved_name)
}

/// `reconcile-state` on an s3 root.
pub(super) fn reconcile(
    target: &Target,
    location: &S3Location,
    all_owners: bool,
    dry_run: bool,
    now: OffsetDateTime,
) -> Result<ReconcileReport, MaintainError> {
    let root = open(target, location)?;
    let mut report = ReconcileReport {
        dry_run,
        missing: Vec::new(),
        unmanaged: Vec::new(),
        removed_records: 0,
    };
    let in_flight: BTreeSet<String> = if dry_run {
        report_pending(target, &root)?
    } else {
        recover(target, &root)?;
        pending(target, &root)?
            .into_iter()
            .flat_map(|(_, intent, _)| intent.writes.into_iter().map(|w| w.path))
            .collect()
    };
    for _ in 0..ROUNDS {
        let (base, catalog) = read(target, &root)?;
        let listed: BTreeSet<String> = root
            .list("")
            .map_err(s3_error(target, "cannot list the root"))?
            .into_iter()
            .map(|l| l.path)
            .filter(|p| !reserved(p))
            .collect();
        let records = catalog.as_ref().map_or(&[][..], |c| &c.outputs);
        let recorded: BTreeSet<&str> = records.iter().map(|r| r.path.as_str()).collect();
        // Objects a live publication is writing are its own, not unmanaged.
        report.unmanaged = listed
            .iter()
            .filter(|p| !recorded.contains(p.as_str()) && !in_flight.contains(*p))
            .cloned()
            .collect();
        // The listing only picks candidates; a HEAD decides.
        let mut missing = Vec::new();
        for r in in_scope(target, records, all_owners) {
            let path = r.path.as_str();
            if listed.contains(path) {
                continue;
            }
            let head = root
                .head(path)
                .map_err(s3_error(target, "cannot look at a managed object"))?;
            if head.is_none() {
                missing.push(path.to_owned());
            }
        }
        missing.sort();
        report.missing = missing;
        let Some(catalog) = catalog else {
            return Ok(report);
        };
        if dry_run || report.missing.is_empty() {
            return Ok(report);
        }
        let drop: BTreeSet<&str> = report.missing.iter().map(String::as_str).collect();
        let next = protocol::monotonic(without(&catalog, &drop, now), &base.state);
        match root.write_catalog(&next.to_json(), base.etag.as_ref()) {
            Ok(_) => {
                report.removed_records = catalog.outputs.len() - next.outputs.len();
                log::info!(
                    "{}: dropped {} record(s) whose object is gone",
                    target.root_text(),
                    report.removed_records
                );
                return Ok(report);
            }
            // Someone committed since the catalog was read: look again.
            Err(s3::Error::Conflict { .. }) => continue,
            Err(e) => return Err(s3_error(target, "cannot write the catalog")(e)),
        }
    }
    Err(s3_error(target, "cannot write the catalog")(
        s3::Error::Conflict {
            root: target.root_text(),
            key: crate::catalog::STATE_FILE.to_owned(),
        },
    ))
}

#[cfg(test)]
#[path = "s3_tests.rs"]
mod tests;
