//! The commit protocol of an s3 root (docs/object-storage.md has the full
//! argument). Storage-level only: the engine plans, this module makes the
//! plan true in the bucket or leaves a record that lets anyone finish or
//! undo it.
//!
//! One publication = one *intent*:
//! 1. create `<path>/.distributor-pending/<id>.json` with `If-None-Match: *`,
//!    listing every key it will write (with the sha256 it will hold) and
//!    every recorded object it will delete;
//! 2. write each output at its final key: a key without a catalog record
//!    with `If-None-Match: *`, a recorded one with `If-Match` of the ETag
//!    a HEAD showed right before, after checking the object still holds
//!    the sha256 the catalog records (metadata, or a re-hash); every
//!    output that is not a page first, the pages once all of those are
//!    stored ([`crate::paths::pages_last`]);
//! 3. compare-and-swap the catalog on the ETag it was read with (on
//!    conflict: re-read, let the caller rebase, try again);
//! 4. delete the objects the new catalog no longer records;
//! 5. delete the intent.
//!
//! The intent is a lease: its owner renews it (a conditional replace) every
//! `renew_every` while it works. An intent older than `lease` by the
//! server's clock is stale; anyone may *recover* it: revoke it (a
//! conditional replace, so one recoverer wins and the owner's renewal
//! fails), fence the catalog (a compare-and-swap that changes its bytes, so
//! the owner's own compare-and-swap can never succeed any more), adopt
//! what the owner overwrote, delete what it created, delete the intent
//! (in `recovery`, re-exported here).
//!
//! Invariants: nothing here writes without a condition; an unrecorded
//! object is deleted only if its metadata names the intent being cleaned
//! and only after a fence; the catalog's `updated_at` strictly increases
//! with every compare-and-swap, so its bytes (and ETag) never repeat.

use std::io::Read;
use std::time::Instant;

use object_store::{ObjectStore as _, PutMode, PutOptions, PutPayload};
use time::OffsetDateTime;

use super::{ETag, Error, Result, S3Root, Written, random_id};
use crate::catalog::{Catalog, RecordTexts, State};
use std::sync::Arc;

pub use super::intent::{
    Delete, Intent, IntentWrite, LEASE_ENV, PENDING_DIR, Settings, later_than, monotonic, spool_tag,
};
pub(super) use super::intent::{
    Session, delete_if_unrecorded_and_unchanged, intent_key, owner, recorded,
};
pub use super::recovery::{Recovered, pending_intents, recover, recover_abandoned, recover_stale};
use super::recovery::{recover_owned, remove_orphan};

/// One output to store.
pub struct Write<'a> {
    /// Path relative to the root.
    pub path: String,
    /// `sha256:<hex>` the bytes must have (checked while uploading).
    pub sha256: String,
    pub source: Box<dyn Read + 'a>,
    /// The sha256 the catalog records at `path` (a replacement), or `None`
    /// for a path the catalog does not record (a new key).
    pub replaces: Option<String>,
    /// The response headers to store it with.
    pub served: super::headers::Served,
}

/// What the catalog looked like when the plan was made.
#[derive(Debug, Clone)]
pub struct Base {
    pub state: State,
    /// `None` when there was no catalog object.
    pub etag: Option<ETag>,
    /// The text of the catalog's records as read, for writing the next
    /// catalog without formatting the records that did not change.
    pub texts: Option<Arc<RecordTexts>>,
}

/// What a successful commit did: the catalog version it swapped in, what
/// it wrote, and how often it was rebased to get there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedVersion {
    pub etag: ETag,
    /// Each written path with what was stored.
    pub written: Vec<(String, Written)>,
    /// How many times the catalog had to be rebased on a newer one.
    pub rebases: u32,
}

impl S3Root {
    pub(super) fn put_json(&self, rel: &str, bytes: Vec<u8>, mode: PutMode) -> Result<ETag> {
        let key = self.key(rel);
        let put = self.block_on(self.store.put_opts(
            &key,
            PutPayload::from(bytes),
            PutOptions {
                mode,
                ..PutOptions::default()
            },
        ));
        match put {
            Ok(r) => self.etag_of(rel, r.e_tag),
            Err(object_store::Error::AlreadyExists { .. }) => Err(Error::Exists {
                root: self.label.clone(),
                key: rel.to_owned(),
            }),
            Err(object_store::Error::Precondition { .. }) => Err(Error::Changed {
                root: self.label.clone(),
                key: rel.to_owned(),
            }),
            Err(e) => Err(self.store_err("PUT", rel, e)),
        }
    }

    /// Reads the intent `id`: the record, its version and its age by the
    /// server's clock (`None` when there is no such intent).
    pub fn read_intent(&self, id: &str) -> Result<Option<(Intent, ETag, OffsetDateTime)>> {
        let rel = intent_key(id);
        let key = self.key(&rel);
        let got = self.block_on(async {
            match self.store.get_opts(&key, Default::default()).await {
                Ok(r) => {
                    let meta = r.meta.clone();
                    r.bytes().await.map(|b| Some((b, meta)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        let Some((bytes, meta)) = got.map_err(|e| self.store_err("GET", &rel, e))? else {
            return Ok(None);
        };
        let intent: Intent = serde_json::from_slice(&bytes).map_err(|e| Error::Protocol {
            root: self.label.clone(),
            what: format!(
                "{rel} is not an intent record ({e}); remove it by hand once no publisher runs"
            ),
        })?;
        Ok(Some((
            intent,
            self.etag_of(&rel, meta.e_tag)?,
            super::to_time(meta.last_modified),
        )))
    }

    /// Reads and classifies the catalog.
    pub fn read_state(&self) -> Result<Base> {
        Ok(match self.read_catalog()? {
            None => Base {
                state: State::Absent,
                etag: None,
                texts: None,
            },
            Some((bytes, etag)) => {
                let (state, texts) = State::parse_with_texts(Arc::new(bytes));
                Base {
                    state,
                    etag: Some(etag),
                    texts: texts.map(Arc::new),
                }
            }
        })
    }

    /// Compare-and-swap of a catalog built from `base`.
    pub(super) fn swap(&self, next: Catalog, base: &Base) -> Result<ETag> {
        let next = monotonic(next, &base.state);
        let mut bytes = Vec::new();
        // Writing into memory fails only when the catalog's own layout is
        // not the one this build writes (a defect): formatted whole then,
        // never sent cut short.
        if let Err(e) = next.write_json_reusing(&mut bytes, base.texts.as_deref()) {
            log::warn!(
                "{}: the catalog could not be written from the text of its records ({e}); formatting every record instead",
                self.label
            );
            bytes = next.to_json();
        }
        let expected = base.etag.as_ref();
        let swapped = self.write_catalog(bytes.into(), expected);
        log::debug!(
            "{}: catalog swap from version {}: {}",
            self.label,
            expected.map_or("(none)", |e| e.0.as_str()),
            match &swapped {
                Ok(etag) => format!("now version {}", etag.0),
                Err(e) => e.to_string(),
            }
        );
        swapped
    }
}

/// Publishes `writes` and `deletes` and swaps the catalog from `base` to
/// `next` (see the module doc for the steps). On a lost compare-and-swap
/// the latest catalog is passed to `rebase`, which returns the catalog to
/// write instead, or `None` when the publication no longer fits (then
/// everything this call wrote is undone and [`Error::Conflict`] returned).
pub fn commit(
    root: &S3Root,
    settings: Settings,
    base: Base,
    next: Catalog,
    writes: Vec<Write<'_>>,
    deletes: Vec<Delete>,
    rebase: &mut dyn FnMut(&State) -> Option<Catalog>,
) -> Result<CommittedVersion> {
    commit_for(root, settings, None, base, next, writes, deletes, rebase)
}

/// [`commit`] for an agent serving the spool folder `spool` (see
/// [`Intent::spool`]; `None` for any other publisher).
#[allow(clippy::too_many_arguments)]
pub fn commit_for(
    root: &S3Root,
    settings: Settings,
    spool: Option<&str>,
    base: Base,
    next: Catalog,
    writes: Vec<Write<'_>>,
    deletes: Vec<Delete>,
    rebase: &mut dyn FnMut(&State) -> Option<Catalog>,
) -> Result<CommittedVersion> {
    root.check_conformance()?;
    let intent = Intent {
        id: random_id(),
        owner: owner(),
        renewals: 0,
        revoked: false,
        spool: spool.map(spool_tag),
        writes: writes
            .iter()
            .map(|w| IntentWrite {
                path: w.path.clone(),
                sha256: w.sha256.clone(),
                replaces: w.replaces.is_some(),
            })
            .collect(),
        deletes: deletes.clone(),
    };
    let mut session = Session::begin(root, settings, intent)?;
    match run(&mut session, base, next, writes, &deletes, rebase) {
        Ok(committed) => {
            crate::runtime::failpoint::hit("s3.after_swap");
            // The catalog is in force: the publication succeeded. What is
            // left is tidying; if it fails, the intent stays and recovery
            // finishes it.
            // (The catalog is read again only when there is something to
            // delete.)
            let tidied = (|| {
                if !deletes.is_empty() {
                    let state = committed_state(root)?;
                    for d in &deletes {
                        delete_if_unrecorded_and_unchanged(root, &state, d)?;
                    }
                }
                root.delete(&intent_key(&session.intent.id))
            })();
            if let Err(e) = tidied {
                log::warn!(
                    "{}: the publication is committed, but tidying up failed: {e}; {} stays and the next publisher finishes it after {}s",
                    root.label,
                    intent_key(&session.intent.id),
                    settings.lease.as_secs()
                );
            }
            Ok(committed)
        }
        Err(e) => {
            // Undo what this publication wrote, as a recoverer would.
            if let Err(cleanup) = recover_owned(&mut session) {
                log::warn!(
                    "{}: cleaning up after a failed publication: {cleanup}; the intent {} stays and the next publisher cleans up after {}s",
                    root.label,
                    intent_key(&session.intent.id),
                    settings.lease.as_secs()
                );
            }
            Err(e)
        }
    }
}

fn committed_state(root: &S3Root) -> Result<State> {
    Ok(root.read_state()?.state)
}

/// The record of `path` in `state`, if any.
fn record_of<'s>(state: &'s State, path: &str) -> Option<&'s crate::catalog::OutputRecord> {
    match state {
        State::Catalog(c) => c.get(path),
        _ => None,
    }
}

/// Whether a publication planned on `base` may be rebased onto `latest`:
/// nobody committed a change to any path it writes or deletes in between,
/// and the state is still a valid catalog (or still absent) as it was.
pub fn rebase_allowed(base: &State, latest: &State, paths: &[&str]) -> bool {
    let same_kind = matches!(
        (base, latest),
        (State::Catalog(_), State::Catalog(_)) | (State::Absent, State::Catalog(_))
    );
    same_kind
        && paths
            .iter()
            .all(|p| record_of(base, p) == record_of(latest, p))
}

fn run(
    session: &mut Session<'_>,
    base: Base,
    next: Catalog,
    writes: Vec<Write<'_>>,
    deletes: &[Delete],
    rebase: &mut dyn FnMut(&State) -> Option<Catalog>,
) -> Result<CommittedVersion> {
    let root = session.root;
    let id = session.intent.id.clone();
    let started = Instant::now();
    let touched: Vec<String> = writes
        .iter()
        .map(|w| w.path.clone())
        .chain(deletes.iter().map(|d| d.path.clone()))
        .collect();
    let touched: Vec<&str> = touched.iter().map(String::as_str).collect();
    let mut written = Vec::with_capacity(writes.len());
    // Every PUT this publication started has finished (stored or refused)
    // before an error is returned, so the caller's clean-up sees every
    // object it stored. The pages go up only once every other output is
    // stored: a reader who loads a new page finds what it refers to.
    let (others, pages) = crate::paths::pages_last(writes, |w| w.path.as_str());
    for group in [others, pages] {
        let mut window = Window::default();
        let sent = upload(session, group, &id, &mut window, &mut written);
        let landed = window.land_all(root, session.settings, &mut written);
        sent?;
        landed?;
    }
    crate::runtime::failpoint::hit("s3.after_upload");
    // In the order of the writes (small objects land in any order).
    let order: std::collections::HashMap<&str, usize> =
        touched.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    written.sort_by_key(|(path, _)| order.get(path.as_str()).copied());
    log::debug!(
        "{}: intent {id}: {} objects stored in {} ms",
        root.label,
        written.len(),
        started.elapsed().as_millis()
    );
    let mut base = base;
    let mut next = next;
    let mut rebases = 0;
    loop {
        session.keep_alive()?;
        match root.swap(next, &base) {
            Ok(etag) => {
                return Ok(CommittedVersion {
                    etag,
                    written,
                    rebases,
                });
            }
            Err(Error::Conflict { .. }) if rebases < 8 => {
                let latest = root.read_state()?;
                rebases += 1;
                let conflict = || Error::Conflict {
                    root: root.label.clone(),
                    key: super::CATALOG_KEY.to_owned(),
                };
                // Another publication committed first. Ours still holds if
                // it touched none of our paths; then the caller re-applies
                // its changes to the winner's catalog.
                if !rebase_allowed(&base.state, &latest.state, &touched) {
                    return Err(conflict());
                }
                next = rebase(&latest.state).ok_or_else(conflict)?;
                base = latest;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Small objects a commit has in flight at once, and the bytes they may
/// hold in memory together (besides the one being read): memory stays
/// within a few parts, as for a multipart upload.
const SMALL_IN_FLIGHT: usize = 16;
const SMALL_QUEUE_BYTES: usize = 3 * super::upload::PART_SIZE;

/// Uploads `writes` in order: objects shorter than a part are read,
/// checked and put into `window` (sent while the next ones are read);
/// larger ones go up alone as multipart uploads once the window landed.
/// Stops at the first error; the caller lands the window either way.
fn upload<'r: 'f, 'f>(
    session: &mut Session<'r>,
    writes: Vec<Write<'_>>,
    id: &'f str,
    window: &mut Window<'f>,
    written: &mut Vec<(String, Written)>,
) -> Result<()> {
    let root: &'f S3Root = session.root;
    for mut w in writes {
        session.keep_alive()?;
        let replace = match &w.replaces {
            None => None,
            Some(recorded_sha) => current_version(root, session.settings, &w.path, recorded_sha)?,
        };
        let first = super::upload::read_first_part(root, &w.path, &mut w.source)?;
        if first.len() < super::upload::PART_SIZE {
            let sha256 = crate::fs::hashing::hash_bytes(&first).sha256;
            if sha256 != w.sha256 {
                return Err(Error::HashMismatch {
                    root: root.label.clone(),
                    key: w.path,
                    expected: w.sha256,
                    actual: sha256,
                });
            }
            while !window.is_empty()
                && (window.flying.len() >= SMALL_IN_FLIGHT
                    || window.bytes + first.len() > SMALL_QUEUE_BYTES)
            {
                window.land_one(root, written);
            }
            if window.failed.is_some() {
                return Ok(());
            }
            let len = first.len();
            let (path, served) = (w.path, w.served);
            window.bytes += len;
            window.flying.push(Box::pin(async move {
                let replace = replace.as_ref();
                let stored = super::upload::put_one(
                    root,
                    &path,
                    first,
                    sha256,
                    replace.into(),
                    &served,
                    Some(id),
                )
                .await;
                (path, len, stored)
            }));
            continue;
        }
        window.land_all(root, session.settings, written)?;
        let mut source = super::upload::FirstThen::new(first, &mut w.source);
        let stored = super::upload::put(
            root,
            &w.path,
            &mut source,
            replace.as_ref().into(),
            Some(&w.sha256),
            &w.served,
            Some(id),
            &mut || session.keep_alive(),
        );
        let stored = match stored {
            Err(Error::Exists { key, .. }) => {
                return Err(explain_existing(root, session.settings, &key)?);
            }
            other => other?,
        };
        written.push((w.path, stored));
    }
    Ok(())
}

/// One small object's conditional PUT: its path, its length and what was
/// stored.
type Landing = (String, usize, Result<Written>);

/// Conditional PUTs of small objects in flight, each sent as soon as its
/// bytes were read and checked.
#[derive(Default)]
struct Window<'f> {
    flying: futures_util::stream::FuturesUnordered<
        std::pin::Pin<Box<dyn std::future::Future<Output = Landing> + 'f>>,
    >,
    /// Bytes the PUTs in flight hold.
    bytes: usize,
    /// The first refusal or failure; nothing more is sent after it.
    failed: Option<Error>,
}

impl Window<'_> {
    fn is_empty(&self) -> bool {
        self.flying.is_empty()
    }

    /// Waits for one PUT to finish and records it in `written` (in the
    /// order they finish).
    fn land_one(&mut self, root: &S3Root, written: &mut Vec<(String, Written)>) {
        use futures_util::StreamExt as _;
        let Some((path, len, stored)) = root.block_on(self.flying.next()) else {
            return;
        };
        self.bytes -= len;
        match stored {
            Ok(stored) => written.push((path, stored)),
            Err(e) => {
                self.failed.get_or_insert(e);
            }
        }
    }

    /// Waits for every PUT in flight; the first refusal or failure, a
    /// refused create explained ([`explain_existing`]).
    fn land_all(
        &mut self,
        root: &S3Root,
        settings: Settings,
        written: &mut Vec<(String, Written)>,
    ) -> Result<()> {
        while !self.is_empty() {
            self.land_one(root, written);
        }
        match self.failed.take() {
            None => Ok(()),
            Some(Error::Exists { key, .. }) => Err(explain_existing(root, settings, &key)?),
            Some(e) => Err(e),
        }
    }
}

/// The version of the recorded object at `path` that a write may replace:
/// `Some(etag)` for `If-Match`, `None` for a create (`If-None-Match: *`).
///
/// The catalog records `path`, so its object is the owner's to overwrite
/// (docs/maintenance.md, "Changed behind distributor's back"): when it holds
/// `recorded_sha`, the write replaces that version; when it is gone, or was
/// changed by something other than a publication (its metadata names no
/// intent), the write replaces what is there now, as a local root's file
/// is overwritten, and says so in the log. An object another publication
/// wrote (its metadata names an intent) is [`Error::Claimed`] while that
/// publication is live (recovered on the spot when stale), else
/// [`Error::Changed`]: the retry plans on the catalog that publication
/// left.
fn current_version(
    root: &S3Root,
    settings: Settings,
    path: &str,
    recorded_sha: &str,
) -> Result<Option<ETag>> {
    let changed = || Error::Changed {
        root: root.label.clone(),
        key: path.to_owned(),
    };
    let behind_the_back = |what: &str| {
        log::warn!(
            "{}: {path} {what} outside distributor since it was published; this publication writes it again",
            root.label
        );
    };
    let Some(head) = root.head(path)? else {
        behind_the_back("was deleted");
        return Ok(None);
    };
    let holds_recorded = match head.sha256.as_deref() {
        Some(sha) => sha == recorded_sha,
        // Written without the metadata (a multipart upload whose digest
        // was not known in advance, or another tool): re-hash; the GET's
        // ETag is the version whose bytes were hashed.
        None => match root.get_hashed(path)? {
            Some((hashed, etag)) if hashed.sha256 == recorded_sha => return Ok(Some(etag)),
            Some(_) => false,
            None => {
                behind_the_back("was deleted");
                return Ok(None);
            }
        },
    };
    if holds_recorded {
        return Ok(Some(head.etag));
    }
    let Some(id) = &head.intent else {
        behind_the_back("was changed");
        return Ok(Some(head.etag));
    };
    // Overwritten by a publication whose intent is still there: recovered
    // on the spot when stale (the retry then sees the adopted record), else
    // say whose it is.
    if let Some((intent, _, _)) = root.read_intent(id)?
        && recover(root, settings, id)?.is_none()
    {
        return Err(claimed(root, settings, path, intent));
    }
    Err(changed())
}

/// Why a new key could not be created. An object written by a
/// publication (its metadata names an intent) makes the conflict
/// transient: that publication is in progress (its intent is live), or is
/// recovered here (stale), or committed it since this one planned (the
/// catalog records it now), or left its object behind after it was revoked
/// (no intent any more: the object is removed here). Anything else is
/// unmanaged (`fail_unmanaged`).
fn explain_existing(root: &S3Root, settings: Settings, path: &str) -> Result<Error> {
    let changed = || Error::Changed {
        root: root.label.clone(),
        key: path.to_owned(),
    };
    let Some(head) = root.head(path)? else {
        // Gone again: someone cleaned it up; a retry may succeed.
        return Ok(changed());
    };
    let Some(id) = head.intent else {
        return Ok(Error::Exists {
            root: root.label.clone(),
            key: path.to_owned(),
        });
    };
    if let Some((intent, _, _)) = root.read_intent(&id)? {
        if recover(root, settings, &id)?.is_none() {
            return Ok(claimed(root, settings, path, intent));
        }
        return Ok(changed());
    }
    if remove_orphan(root, path, &id)? {
        return Ok(changed());
    }
    if recorded(&root.read_state()?.state, path).is_some() {
        // Its publication committed after this one planned: a retry plans
        // on the new catalog.
        return Ok(changed());
    }
    Ok(Error::Exists {
        root: root.label.clone(),
        key: path.to_owned(),
    })
}

/// The error for `path` holding an object of the live `intent`.
fn claimed(root: &S3Root, settings: Settings, path: &str, intent: Intent) -> Error {
    Error::Claimed {
        root: root.label.clone(),
        key: path.to_owned(),
        id: intent.id,
        owner: intent.owner,
        lease_secs: settings.lease.as_secs(),
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
