//! Recovery of publications that did not finish (docs/object-storage.md,
//! "Recovery"): a stale or revoked intent is fenced and cleaned up by
//! anyone; an owner undoes its own failed publication; the leftover of a
//! revoked publication is removed. Never deletes an object the catalog
//! records, and deletes an unrecorded one only if its metadata names the
//! intent being cleaned, after the catalog was fenced.

use object_store::{PutMode, UpdateVersion};

use super::intent::{
    Delete, Intent, PENDING_DIR, Session, Settings, delete_if_unrecorded_and_unchanged, intent_key,
    recorded,
};
use super::{Error, Result, S3Root};
use crate::catalog::{Catalog, State};

/// Removes the object at `path` written by intent `id`, which no longer
/// exists, if the catalog does not record it: the leftover of a publication
/// that was revoked while paused. The intent was seen missing *before* the
/// catalog is read, so a publication that committed the object (and only
/// then deleted its intent) shows in that catalog. Fences the catalog
/// first. Returns whether the object is gone.
pub(super) fn remove_orphan(root: &S3Root, path: &str, id: &str) -> Result<bool> {
    for _ in 0..8 {
        let base = root.read_state()?;
        if recorded(&base.state, path).is_some() {
            return Ok(false);
        }
        let now = root.server_now()?;
        let next = match &base.state {
            State::Catalog(c) => {
                let mut c = c.clone();
                c.updated_at = now;
                c
            }
            State::Absent => Catalog::new(now),
            _ => return Ok(false),
        };
        match root.swap(next, &base) {
            Ok(_) => {
                if let Some(head) = root.head(path)?
                    && head.intent.as_deref() == Some(id)
                {
                    root.delete(path)?;
                }
                return Ok(true);
            }
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// What recovering an intent did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Unrecorded objects the intent had created, deleted.
    pub deleted: Vec<String>,
    /// Recorded paths whose object the intent had overwritten: their
    /// records now describe the object.
    pub adopted: Vec<String>,
    /// Objects the intent's committed catalog no longer records, deleted.
    pub finished_deletes: Vec<String>,
}

/// Recovers the intent `id` if it is stale (older than the lease by the
/// server's clock) or revoked; returns `Ok(None)` while it is live or when
/// there is no such intent.
pub fn recover(root: &S3Root, settings: Settings, id: &str) -> Result<Option<Recovered>> {
    recover_if(root, id, &mut |_, modified| {
        Ok(root.server_now()? - modified >= settings.lease)
    })
}

/// Recovers, at once, every intent that an earlier agent serving the spool
/// folder `spool` on this host left behind ([`Intent::spool`]): the caller
/// serves that folder now (it holds the folder's lock), so that agent is
/// dead, and waiting for its lease would only hold up its own bundles.
/// Wrongly taking a live publisher's intent would cost it a retry, never a
/// lost update: recovery revokes and fences like any other.
pub fn recover_abandoned(root: &S3Root, spool: &str) -> Result<Vec<(String, Recovered)>> {
    let tag = super::intent::spool_tag(spool);
    let ours = super::intent::owner();
    let mut out = Vec::new();
    for id in pending_intents(root)? {
        let done = recover_if(root, &id, &mut |intent, _| {
            Ok(intent.spool.as_deref() == Some(tag.as_str()) && intent.owner != ours)
        })?;
        if let Some(done) = done {
            out.push((id, done));
        }
    }
    Ok(out)
}

/// Recovers the intent `id` when `take` says so (or it is revoked
/// already); `Ok(None)` when it does not, or there is no such intent.
fn recover_if(
    root: &S3Root,
    id: &str,
    take: &mut dyn FnMut(&Intent, time::OffsetDateTime) -> Result<bool>,
) -> Result<Option<Recovered>> {
    root.check_conformance()?;
    for _ in 0..8 {
        let Some((mut intent, etag, modified)) = root.read_intent(id)? else {
            return Ok(None);
        };
        if !intent.revoked {
            if !take(&intent, modified)? {
                return Ok(None);
            }
            intent.revoked = true;
            let bytes = serde_json::to_vec_pretty(&intent).unwrap_or_default();
            let mode = PutMode::Update(UpdateVersion {
                e_tag: Some(etag.0.clone()),
                version: None,
            });
            match root.put_json(&intent_key(id), bytes, mode) {
                Ok(_) => {}
                // Renewed or revoked meanwhile: look again.
                Err(Error::Changed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        let done = clean_up(root, &intent, true)?;
        log::warn!(
            "{}: finished or undid publication {id} of {} that another publisher left behind (it stopped renewing its intent: killed, or paused longer than the lease): deleted {} object(s) it had created, adopted {} record(s) of objects it had overwritten",
            root.label,
            intent.owner,
            done.deleted.len(),
            done.adopted.len()
        );
        return Ok(Some(done));
    }
    Err(Error::Conflict {
        root: root.label.clone(),
        key: intent_key(id),
    })
}

/// The owner undoing its own publication after a failure: revoke (so a
/// paused self cannot go on), then clean up like a recoverer.
pub(super) fn recover_owned(session: &mut Session<'_>) -> Result<Recovered> {
    let root = session.root;
    session.intent.revoked = true;
    let bytes = serde_json::to_vec_pretty(&session.intent).unwrap_or_default();
    let mode = PutMode::Update(UpdateVersion {
        e_tag: Some(session.etag.0.clone()),
        version: None,
    });
    match root.put_json(&intent_key(&session.intent.id), bytes, mode) {
        // Revoked by someone else already: they clean up.
        Ok(_) | Err(Error::Changed { .. }) => {}
        Err(e) => return Err(e),
    }
    clean_up(root, &session.intent, false)
}

/// The work of a recoverer once `intent` is revoked: fence the catalog
/// (adopting overwritten records), delete the intent's unrecorded
/// objects and the deletes its committed catalog asked for, delete the
/// intent. Idempotent: a recoverer that dies half-way is followed by
/// another that does the rest. The owner cleaning up after itself needs
/// no fence (`fence` false): it is the one that will not commit.
/// Deletes `orphans` (many at once) and records them in `out`.
fn delete_orphans(root: &S3Root, orphans: Vec<String>, out: &mut Recovered) -> Result<()> {
    let paths: Vec<&str> = orphans.iter().map(String::as_str).collect();
    root.delete_many(&paths)?;
    out.deleted.extend(orphans);
    Ok(())
}

fn clean_up(root: &S3Root, intent: &Intent, fence: bool) -> Result<Recovered> {
    let mut out = Recovered::default();
    // 1. What the intent left: for each written key, the object as it is.
    let mut rounds = 0;
    let state = loop {
        rounds += 1;
        let base = root.read_state()?;
        let mut adopt = Vec::new();
        let mut orphans = Vec::new();
        // Many at once: a batch's intent names thousands of keys.
        let paths: Vec<&str> = intent.writes.iter().map(|w| w.path.as_str()).collect();
        let heads = root.head_many(&paths)?;
        for (w, head) in intent.writes.iter().zip(heads) {
            let Some(head) = head else {
                continue;
            };
            if head.intent.as_deref() != Some(intent.id.as_str()) {
                continue; // not (or no longer) this intent's object
            }
            match recorded(&base.state, &w.path) {
                None => orphans.push(w.path.clone()),
                Some(sha) => {
                    let actual = match head.sha256 {
                        Some(s) => (s, head.size),
                        None => match root.get_hashed(&w.path)? {
                            Some((h, _)) => (h.sha256, h.size),
                            None => continue,
                        },
                    };
                    if actual.0 != sha {
                        adopt.push((w.path.clone(), actual));
                    }
                }
            }
        }
        let deletes: Vec<&Delete> = intent
            .deletes
            .iter()
            .filter(|d| recorded(&base.state, &d.path).is_none())
            .collect();
        if adopt.is_empty() && orphans.is_empty() && deletes.is_empty() {
            break base.state;
        }
        if adopt.is_empty() && !fence {
            delete_orphans(root, orphans, &mut out)?;
            for d in deletes {
                delete_if_unrecorded_and_unchanged(root, &base.state, d)?;
                out.finished_deletes.push(d.path.clone());
            }
            break base.state;
        }
        // 2. Fence: a catalog version the owner never saw, so its
        // compare-and-swap fails from now on; overwritten records adopted.
        let now = root.server_now()?;
        let next = match &base.state {
            State::Catalog(c) => {
                let mut c = c.clone();
                for (path, (sha, size)) in &adopt {
                    if let Some(r) = c.outputs.iter_mut().find(|r| r.path.as_str() == path) {
                        r.sha256 = crate::catalog::Sha256::parse(sha).unwrap_or(r.sha256);
                        r.size = *size;
                        r.updated_at = now;
                    }
                }
                c.updated_at = now;
                Some(c)
            }
            State::Absent => Some(Catalog::new(now)),
            // Legacy, future or invalid state is never rewritten by a
            // recoverer; its orphans wait for `run --force`.
            _ => None,
        };
        let Some(next) = next else {
            return Err(Error::Protocol {
                root: root.label.clone(),
                what: format!(
                    "{} left objects behind in a root whose catalog is not a valid v4 catalog; run the bundle again with --force",
                    intent_key(&intent.id)
                ),
            });
        };
        match root.swap(next, &base) {
            Ok(_) => {
                out.adopted = adopt.into_iter().map(|(p, _)| p).collect();
                // 3. Now nobody can record the orphans any more.
                delete_orphans(root, orphans, &mut out)?;
                let state = root.read_state()?.state;
                for d in deletes {
                    delete_if_unrecorded_and_unchanged(root, &state, d)?;
                    out.finished_deletes.push(d.path.clone());
                }
                break state;
            }
            Err(Error::Conflict { .. }) if rounds < 8 => continue,
            Err(e) => return Err(e),
        }
    };
    let _ = state;
    root.delete(&intent_key(&intent.id))?;
    Ok(out)
}

/// Recovers every stale intent of the root (a LIST of
/// `.distributor-pending/`: clean-up, not a commit decision), and removes
/// the conformance probes and clock objects that processes killed half-way
/// left there once they are older than the lease. Meant to run before a
/// publication plans and in `reconcile-state`; live intents are left alone.
pub fn recover_stale(root: &S3Root, settings: Settings) -> Result<Vec<(String, Recovered)>> {
    let listed = root.list(PENDING_DIR)?;
    let mut out = Vec::new();
    for id in listed.iter().filter_map(|l| intent_id(&l.path)) {
        if let Some(done) = recover(root, settings, id)? {
            out.push((id.to_owned(), done));
        }
    }
    let scratch: Vec<_> = listed.iter().filter(|l| is_scratch(&l.path)).collect();
    if !scratch.is_empty() {
        let now = root.server_now()?;
        for l in scratch {
            if now - l.last_modified >= settings.lease {
                root.delete(&l.path)?;
            }
        }
    }
    Ok(out)
}

/// The intent id of a key below the root, if it is an intent record.
fn intent_id(path: &str) -> Option<&str> {
    path.strip_prefix(PENDING_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .and_then(|n| n.strip_suffix(".json"))
}

/// Whether a key below the root is a conformance probe or a clock object
/// (`.distributor-pending/probe-*`, `.distributor-pending/clock-*`).
fn is_scratch(path: &str) -> bool {
    path.strip_prefix(PENDING_DIR)
        .and_then(|p| p.strip_prefix('/'))
        .is_some_and(|n| n.starts_with("probe-") || n.starts_with("clock-"))
}

/// Intent ids under the root's `.distributor-pending/` (a LIST: for
/// maintenance and reports only).
pub fn pending_intents(root: &S3Root) -> Result<Vec<String>> {
    Ok(root
        .list(PENDING_DIR)?
        .iter()
        .filter_map(|l| intent_id(&l.path))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::{intent_id, is_scratch};

    #[test]
    fn keys_under_the_pending_folder_by_kind() {
        let cases = [
            (".distributor-pending/abc.json", Some("abc"), false),
            (".distributor-pending/probe-12ab", None, true),
            (".distributor-pending/clock-12ab", None, true),
            (".distributor-pending/other", None, false),
            (".distributor-pendingx/abc.json", None, false),
            ("site/.distributor-pending/abc.json", None, false),
            ("probe-12ab", None, false),
        ];
        for (path, id, scratch) in cases {
            assert_eq!(intent_id(path), id, "{path}");
            assert_eq!(is_scratch(path), scratch, "{path}");
        }
    }
}
