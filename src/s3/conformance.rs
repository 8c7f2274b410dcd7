//! The check that a server enforces conditional writes, run once per
//! process and server+bucket before the first write (docs/contract.md §15.3). Several
//! S3-compatible servers accept `If-None-Match`/`If-Match` and ignore them;
//! on such a server the commit protocol would silently lose updates, so the
//! backend refuses it with [`Error::Nonconforming`] (stage `lock`).
//!
//! Under `<path>/.distributor-pending/probe-<random>`: create with
//! `If-None-Match: *` twice (the second must be refused), replace with a
//! wrong `If-Match` (must be refused), replace with the right one (must
//! succeed), delete. The probe key is fresh, so no other object is touched;
//! a probe left by a process killed half-way is removed by the next
//! recovery once it is older than the lease.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use object_store::{
    ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use super::{Error, Result, S3Root, random_id};

/// Servers (endpoint + bucket) that passed the check, shared by every
/// root opened through one [`crate::runtime::process_state::ProcessState`] (a root
/// opened on its own has its own).
#[derive(Clone, Default)]
pub struct Passed(Arc<Mutex<HashSet<String>>>);

impl S3Root {
    /// Runs the conformance check unless this server and bucket passed it
    /// already for the roots this one shares its [`Passed`] with.
    pub fn check_conformance(&self) -> Result<()> {
        if self
            .passed
            .0
            .lock()
            .map(|set| set.contains(&self.server))
            .unwrap_or(false)
        {
            return Ok(());
        }
        self.probe()?;
        if let Ok(mut set) = self.passed.0.lock() {
            set.insert(self.server.clone());
        }
        Ok(())
    }

    /// The probe itself, uncached.
    pub fn probe(&self) -> Result<()> {
        let rel = format!("{}/probe-{}", super::protocol::PENDING_DIR, random_id());
        let outcome = self.probe_at(&rel);
        // Try to remove the probe object whatever happened, unless the
        // server did not answer: another request would only wait as long
        // again (a probe object left behind is an empty object below
        // `.distributor-pending/` that no catalog records).
        let unanswered = matches!(
            &outcome,
            Err(Error::Store {
                failure: super::Failure::Connect
                    | super::Failure::TimedOut
                    | super::Failure::NotSent,
                ..
            })
        );
        if !unanswered {
            let key = self.key(&rel);
            let _ = self.block_on(self.store.delete(&key));
        }
        outcome
    }

    fn probe_at(&self, rel: &str) -> Result<()> {
        let key = self.key(rel);
        let put = |body: &'static [u8], mode: PutMode| {
            self.block_on(self.store.put_opts(
                &key,
                PutPayload::from_static(body),
                PutOptions {
                    mode,
                    ..PutOptions::default()
                },
            ))
        };
        let refuse = |behaviour: &str| Error::Nonconforming {
            root: self.label.clone(),
            behaviour: behaviour.to_owned(),
        };
        let update = |etag: &str| {
            PutMode::Update(UpdateVersion {
                e_tag: Some(etag.to_owned()),
                version: None,
            })
        };

        let first = put(b"probe 1\n", PutMode::Create).map_err(|e| match e {
            object_store::Error::NotImplemented { .. } => {
                refuse("it does not implement If-None-Match: * on PUT")
            }
            e => self.store_err("PUT (conformance probe)", rel, e),
        })?;
        let first_etag = self.etag_of(rel, first.e_tag)?;
        match put(b"probe 2\n", PutMode::Create) {
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Ok(_) => {
                return Err(refuse(
                    "the server accepted a second If-None-Match: * create of the same key; it ignores conditional writes",
                ));
            }
            Err(e) => return Err(self.store_err("PUT (conformance probe)", rel, e)),
        }
        match put(b"probe 3\n", update("\"distributor-wrong-etag\"")) {
            Err(object_store::Error::Precondition { .. }) => {}
            Ok(_) => {
                return Err(refuse(
                    "the server accepted a replacement with a wrong If-Match ETag; it ignores conditional writes",
                ));
            }
            Err(object_store::Error::Generic { .. }) => {
                return Err(refuse(
                    "the server rejected an If-Match replacement with an error instead of 412 Precondition Failed",
                ));
            }
            Err(e) => return Err(self.store_err("PUT (conformance probe)", rel, e)),
        }
        match put(b"probe 4\n", update(&first_etag.0)) {
            Ok(_) => {}
            Err(object_store::Error::Precondition { .. }) => {
                return Err(refuse(&format!(
                    "the server refused a replacement with the object's own ETag {first_etag} in If-Match",
                )));
            }
            Err(e) => return Err(self.store_err("PUT (conformance probe)", rel, e)),
        }
        match self.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err("DELETE (conformance probe)", rel, e)),
        }
    }
}
