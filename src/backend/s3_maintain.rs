//! An s3 destination opened for maintenance (docs/contract.md §15.5): what
//! [`MaintainRoot`](crate::backend::MaintainRoot) asks of it for `prune`, `reconcile-state`,
//! `verify` and `catalog`, with the bucket's conditional writes standing
//! in for a local root's lock and journal (docs/object-storage.md).
//!
//! - Commands that write (`prune --apply`, `reconcile-state`) first
//!   recover stale intents (`protocol::recover_stale`, ages by the server's
//!   clock), so a publisher that died on any host converges. Read-only
//!   ones (`verify`, `catalog`, every dry run) write nothing, not even the
//!   conformance probe: they log each pending intent instead.
//! - `prune` commits through the protocol like a publication with no
//!   writes (`S3Bucket::commit_change`): the catalog change is a
//!   compare-and-swap (rebased on a concurrent publisher's commit when that
//!   touched none of the pruned paths, planned again otherwise), and an
//!   object is deleted only after the catalog that drops it is in force,
//!   and only while it holds the recorded sha256.
//! - `reconcile-state` drops a record only when a HEAD finds no object;
//!   the LIST it also makes feeds the report (unmanaged objects) and picks
//!   which records to HEAD, never a commit decision.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::S3Bucket;
use crate::backend::{Access, Doing, Fault, s3_fault, usable};
use crate::catalog::{Catalog, format_time};
use crate::config::{Destination, S3Location};
use crate::fs::hashing::Hashed;
use crate::paths::is_reserved_name;
use crate::plan::Entry;
use crate::runtime::process_state::ProcessState;
use crate::s3::protocol::{self, Intent, Settings};
use crate::s3::{self, S3Root};
use time::OffsetDateTime;

/// GETs in flight while `verify` re-hashes objects.
const VERIFY_CONCURRENCY: usize = 8;

/// Opens `d`'s bucket through the process's client (shared with
/// publication, so the agent's scheduled pruning reuses its connections
/// and its conformance check). For [`Access::Write`] the catalog is first
/// refused unless maintenance can work on it (changing nothing, as for a
/// local root), then every stale intent is recovered.
pub(super) fn open(
    d: &Destination,
    location: &S3Location,
    access: Access,
    process: &ProcessState,
) -> Result<S3Bucket, Fault> {
    let label = location.to_string();
    let root = process
        .s3_root(location)
        .map_err(s3_fault(&label, Doing::OpenBucket))?;
    open_on(d, location, root, access)
}

/// [`open`] through the client `root`.
fn open_on(
    d: &Destination,
    location: &S3Location,
    root: Arc<S3Root>,
    access: Access,
) -> Result<S3Bucket, Fault> {
    let settings = match access {
        Access::Write => {
            recover(&root)?;
            lease(root.label())?
        }
        // A read-only command commits nothing: the lease only dates what
        // it reports ([`in_flight`]).
        Access::Read => Settings::default(),
    };
    Ok(S3Bucket::at(root, d, location, settings))
}

/// Refuses a catalog maintenance cannot work on, then recovers every stale
/// intent.
fn recover(root: &Arc<S3Root>) -> Result<(), Fault> {
    let label = root.label();
    let base = root
        .read_state()
        .map_err(s3_fault(label, Doing::ReadCatalog))?;
    usable(base.state)?;
    let recovered =
        protocol::recover_stale(root, lease(label)?).map_err(s3_fault(label, Doing::Recover))?;
    for (id, done) in recovered {
        log::info!(
            "{label}: recovered the unfinished publication {id}: {} unrecorded object(s) it created deleted, {} record(s) it overwrote adopted, {} deletion(s) it committed finished",
            done.deleted.len(),
            done.adopted.len(),
            done.finished_deletes.len()
        );
    }
    Ok(())
}

/// The commit protocol's timing: the lease from the environment
/// (`DISTRIBUTOR_S3_LEASE_SECS`), as publishers use it.
fn lease(label: &str) -> Result<Settings, Fault> {
    Settings::for_process().map_err(s3_fault(label, Doing::ReadLease))
}

/// [`s3_fault`] for `target`'s bucket.
pub(super) fn fault(target: &S3Bucket, doing: Doing) -> impl FnOnce(s3::Error) -> Fault {
    s3_fault(target.root.label(), doing)
}

/// [`MaintainRoot::read_catalog`](crate::backend::MaintainRoot::read_catalog): the catalog
/// object and its version, which the next swap or commit is conditional on.
pub(super) fn read_catalog(target: &mut S3Bucket) -> Result<Option<Catalog>, Fault> {
    let base = target
        .root
        .read_state()
        .map_err(fault(target, Doing::ReadCatalog))?;
    target.etag = base.etag;
    usable(base.state)
}

/// The intents under `.distributor-pending/` (a LIST: for reports), each
/// with the time the server last stamped it. An intent that finished
/// meanwhile is skipped; one that cannot be read is logged and skipped.
fn pending(target: &S3Bucket) -> Result<Vec<(String, Intent, OffsetDateTime)>, Fault> {
    let root = &target.root;
    let ids = protocol::pending_intents(root).map_err(fault(target, Doing::ListPending))?;
    let mut out = Vec::new();
    for id in ids {
        match root.read_intent(&id) {
            Ok(Some((intent, _, stamped))) => out.push((id, intent, stamped)),
            Ok(None) => {}
            Err(e @ s3::Error::Protocol { .. }) => log::warn!("{e}"),
            Err(e) => return Err(fault(target, Doing::ReadPending)(e)),
        }
    }
    Ok(out)
}

/// [`MaintainRoot::in_flight`](crate::backend::MaintainRoot::in_flight): the outputs pending
/// intents write; with `report`, each publication in progress (or whose
/// publisher died) is logged, and left alone.
pub(super) fn in_flight(target: &S3Bucket, report: bool) -> Result<BTreeSet<String>, Fault> {
    let label = target.root.label();
    let lease_secs = if report {
        Some(lease(label)?.lease.as_secs())
    } else {
        None
    };
    let mut writes = BTreeSet::new();
    for (id, intent, stamped) in pending(target)? {
        if let Some(lease) = lease_secs {
            log::warn!(
                "{label}: publication {id} by {} has not finished (last renewed {}; {} output(s) to write, {} to delete): it is in progress, or its publisher died. This command changes nothing; `prune --apply`, `reconcile-state` or the next publication recovers it once it has not been renewed for {lease}s. Until then the outputs it writes may differ from their records",
                intent.owner,
                format_time(stamped),
                intent.writes.len(),
                intent.deletes.len(),
            );
        }
        writes.extend(intent.writes.into_iter().map(|w| w.path));
    }
    Ok(writes)
}

/// Whether a listed key is one of the tool's own (a segment starting with
/// `.distributor`), as a local root's walk skips them on disk.
fn reserved(key: &str) -> bool {
    key.split('/').any(is_reserved_name)
}

/// [`MaintainRoot::survey`](crate::backend::MaintainRoot::survey): every key of the root (a
/// LIST), the tool's own aside; a bucket has no folders.
pub(super) fn survey(target: &S3Bucket) -> Result<BTreeMap<String, Entry>, Fault> {
    Ok(target
        .root
        .list("")
        .map_err(fault(target, Doing::ListBucket))?
        .into_iter()
        .filter(|l| !reserved(&l.path))
        .map(|l| (l.path, Entry::File { size: l.size }))
        .collect())
}

/// [`MaintainRoot::confirm_absent`](crate::backend::MaintainRoot::confirm_absent): a HEAD of
/// each key decides.
pub(super) fn confirm_absent(target: &S3Bucket, paths: Vec<String>) -> Result<Vec<String>, Fault> {
    let mut absent = Vec::new();
    for path in paths {
        let head = target
            .root
            .head(&path)
            .map_err(fault(target, Doing::LookAtObject))?;
        if head.is_none() {
            absent.push(path);
        }
    }
    Ok(absent)
}

/// [`MaintainRoot::hash_each`](crate::backend::MaintainRoot::hash_each): GETs, several at
/// once, each hashed as it streams.
pub(super) fn hash_each(
    target: &S3Bucket,
    paths: &[&str],
    each: &mut dyn FnMut(usize, Option<Hashed>),
) -> Result<(), Fault> {
    let hashed = target
        .root
        .get_hashed_all(paths, VERIFY_CONCURRENCY)
        .map_err(fault(target, Doing::ReadObject))?;
    for (i, got) in hashed.into_iter().enumerate() {
        each(i, got.map(|(hashed, _)| hashed));
    }
    Ok(())
}

/// [`MaintainRoot::headers_differ`](crate::backend::MaintainRoot::headers_differ):
/// a HEAD of each object (several at once) shows the headers stored with
/// it; a missing object has none to differ.
pub(super) fn headers_differ(target: &S3Bucket, paths: &[&str]) -> Result<Vec<String>, Fault> {
    let heads = target
        .root
        .head_many(paths)
        .map_err(fault(target, Doing::LookAtObject))?;
    Ok(paths
        .iter()
        .zip(heads)
        .filter(|(path, head)| {
            head.as_ref()
                .is_some_and(|h| h.served != target.headers.served(path))
        })
        .map(|(path, _)| (*path).to_owned())
        .collect())
}

/// [`MaintainRoot::swap_catalog`](crate::backend::MaintainRoot::swap_catalog): a
/// compare-and-swap on the version [`read_catalog`] read (its `updated_at`
/// moved past the one read, so that no two versions have the same bytes).
pub(super) fn swap_catalog(
    target: &mut S3Bucket,
    next: Catalog,
    read_at: OffsetDateTime,
) -> Result<(), Fault> {
    let next = protocol::later_than(next, read_at);
    let etag = target
        .root
        .write_catalog(next.to_json().into(), target.etag.as_ref())
        .map_err(fault(target, Doing::WriteCatalog))?;
    target.etag = Some(etag);
    Ok(())
}

#[cfg(test)]
#[path = "s3_maintain_tests.rs"]
mod tests;
