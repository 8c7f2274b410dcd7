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
//!
//! The same probe finds whether the server verifies `x-amz-checksum-sha256`
//! (docs/object-storage.md, "Servers"): before the delete, a replacement
//! whose checksum is not its body's must be refused (400) and one with the
//! right checksum accepted; only then do outputs carry it. The verdict is
//! logged once per process and bucket.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use object_store::aws::Checksum;
use object_store::{
    ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use super::{Error, Failure, Result, S3Root, random_id};

/// Servers (endpoint + bucket) that passed the check, each with whether it
/// verifies checksums, shared by every root opened through one
/// [`crate::runtime::process_state::ProcessState`] (a root opened on its
/// own has its own).
#[derive(Clone, Default)]
pub struct Passed(Arc<Mutex<HashMap<String, Checksums>>>);

/// What the conformance check found of `x-amz-checksum-sha256`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksums {
    /// A wrong one was refused, the right one accepted: outputs carry it.
    Verified,
    /// A PUT whose checksum did not match its body was stored.
    Ignored,
    /// Even the right one was refused (or the server does not implement
    /// them): outputs go without.
    Refused,
    /// Not probed: a root over a store given to it (tests).
    Unknown,
}

/// The checksum the probe's wrong PUT claims: the SHA-256 of no body, which
/// no probe body has.
const WRONG_SHA256: &str = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";

impl S3Root {
    /// Runs the conformance check unless this server and bucket passed it
    /// already for the roots this one shares its [`Passed`] with.
    pub fn check_conformance(&self) -> Result<()> {
        if self.checked().is_some() {
            return Ok(());
        }
        let checksums = self.probe()?;
        match checksums {
            Checksums::Verified => log::info!(
                "{}: the server verifies x-amz-checksum-sha256: every upload carries the SHA-256 of its bytes, so a body damaged on its way is refused",
                self.label
            ),
            Checksums::Ignored => log::info!(
                "{}: the server does not verify x-amz-checksum-sha256 (it stored a body that did not match it): uploads are sent without it",
                self.label
            ),
            Checksums::Refused => log::info!(
                "{}: the server refuses x-amz-checksum-sha256 even when it matches the body: uploads are sent without it",
                self.label
            ),
            Checksums::Unknown => {}
        }
        if let Ok(mut set) = self.passed.0.lock() {
            set.insert(self.server.clone(), checksums);
        }
        Ok(())
    }

    /// What the conformance check found of this server and bucket, if it
    /// ran.
    fn checked(&self) -> Option<Checksums> {
        let set = self.passed.0.lock().ok()?;
        set.get(&self.server).copied()
    }

    /// Whether the conformance check found that the server verifies
    /// `x-amz-checksum-sha256`.
    pub fn verifies_checksums(&self) -> bool {
        self.checked() == Some(Checksums::Verified)
    }

    /// The probe itself, uncached: refuses a server that ignores
    /// conditional writes, and says what it does with checksums.
    pub fn probe(&self) -> Result<Checksums> {
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

    fn probe_at(&self, rel: &str) -> Result<Checksums> {
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
        let fourth = match put(b"probe 4\n", update(&first_etag.0)) {
            Ok(r) => self.etag_of(rel, r.e_tag)?,
            Err(object_store::Error::Precondition { .. }) => {
                return Err(refuse(&format!(
                    "the server refused a replacement with the object's own ETag {first_etag} in If-Match",
                )));
            }
            Err(e) => return Err(self.store_err("PUT (conformance probe)", rel, e)),
        };
        let checksums = self.probe_checksums(rel, &update(&fourth.0))?;
        match self.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(checksums),
            Err(e) => Err(self.store_err("DELETE (conformance probe)", rel, e)),
        }
    }

    /// Replaces the probe object (at version `at`) with a body whose
    /// `x-amz-checksum-sha256` is wrong, then with one whose checksum is
    /// right, through the client outputs then use.
    fn probe_checksums(&self, rel: &str, at: &PutMode) -> Result<Checksums> {
        let Some((builder, options)) = &self.builder else {
            return Ok(Checksums::Unknown);
        };
        let client = |checksum: Option<&'static str>| {
            let mut builder = builder.clone();
            match checksum {
                // Sent as it is, and signed like every header.
                Some(value) => {
                    let mut headers = object_store::HeaderMap::new();
                    headers.insert(
                        "x-amz-checksum-sha256",
                        object_store::HeaderValue::from_static(value),
                    );
                    builder =
                        builder.with_client_options(options.clone().with_default_headers(headers));
                }
                None => builder = builder.with_checksum_algorithm(Checksum::SHA256),
            }
            builder.build().map_err(|source| Error::Client {
                root: self.label.clone(),
                source: Box::new(source),
            })
        };
        let key = self.key(rel);
        let put = |store: &dyn object_store::ObjectStore, body: &'static [u8]| {
            let options = PutOptions {
                mode: at.clone(),
                ..PutOptions::default()
            };
            let got = self.block_on(store.put_opts(&key, PutPayload::from_static(body), options));
            got.map_err(|e| (Failure::of(&e, super::failure::last_answer()), e))
        };
        // A refusal of the body itself: 400 (`BadDigest`,
        // `XAmzContentChecksumMismatch`, `InvalidRequest`), or 501 from a
        // server that does not implement checksums.
        let refused = |f: Failure| matches!(f, Failure::Status(400 | 501) | Failure::Unsupported);
        match put(&client(Some(WRONG_SHA256))?, b"probe 5\n") {
            Ok(_) => return Ok(Checksums::Ignored),
            Err((f, _)) if refused(f) => {}
            Err((_, e)) => return Err(self.store_err("PUT (checksum probe)", rel, e)),
        }
        let checksummed = client(None)?;
        match put(&checksummed, b"probe 6\n") {
            Ok(_) => {
                // The client outputs go through ([`S3Root::output_store`]).
                let mut slot = (self.checksummed.lock()).unwrap_or_else(|p| p.into_inner());
                *slot = Some(std::sync::Arc::new(checksummed));
                Ok(Checksums::Verified)
            }
            Err((f, _)) if refused(f) => Ok(Checksums::Refused),
            Err((_, e)) => Err(self.store_err("PUT (checksum probe)", rel, e)),
        }
    }
}
