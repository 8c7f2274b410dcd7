//! The object-store backend (`backend: s3`, docs/contract.md §15): a synchronous API over
//! an S3-compatible bucket, built on `object_store` with a private
//! current-thread tokio runtime. Nothing outside this module sees async.
//!
//! Invariants this module keeps (the argument is in docs/object-storage.md):
//! - Every write to a key is conditional: `If-None-Match: *` for a key that
//!   must not exist ([`S3Root::put_new`], the catalog's first version, intent
//!   records), `If-Match: <etag>` for a key whose current version the caller
//!   has seen ([`S3Root::put_replace`], [`S3Root::write_catalog`]). There is
//!   no unconditional overwrite anywhere but in a producer's upload into an
//!   inbox ([`S3Root::put_upload`]), which is no destination write.
//! - No write but a producer's upload happens before the server has passed
//!   the conformance check ([`conformance`]) in this process: a server that
//!   accepts the headers and ignores them is refused with
//!   [`Error::Nonconforming`]. Where the check
//!   found that the server verifies `x-amz-checksum-sha256`, every output
//!   PUT carries it ([`S3Root::output_store`]).
//! - Every object this module writes carries its sha256 and the id of the
//!   intent that wrote it as user metadata (`x-amz-meta-distributor-sha256`,
//!   `x-amz-meta-distributor-intent`; a producer's upload has no intent);
//!   ETags are only ever compared, never taken for a digest (multipart
//!   ETags are not MD5).
//! - Uploads stream: memory is bounded by a few parts ([`upload::PART_SIZE`])
//!   whatever the object's size, and the bytes are hashed in the same pass.
//! - LIST ([`S3Root::list`]) feeds reports and clean-up only, never a commit
//!   decision; the commit decision is always a conditional write.
//! - Ages are measured against the server's clock: [`S3Root::server_now`]
//!   writes nothing new and reads the `Last-Modified` the server stamped on an
//!   object it has just stored.

pub mod bucket;
pub mod conformance;
pub mod failure;
#[cfg(test)]
mod fuzz_tests;
pub mod headers;
mod intent;
pub mod protocol;
mod raw_list;
mod recovery;
#[cfg(test)]
pub(crate) mod tests;
pub mod upload;

use crate::report::Stage;
use std::fmt;
use std::io::Read;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, Checksum};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig, UpdateVersion,
};
use time::OffsetDateTime;

use crate::config::S3Location;
use crate::fs::hashing::Hashed;

pub use failure::Failure;
pub use upload::Written;

/// The name of the catalog object below the root's prefix.
pub const CATALOG_KEY: &str = ".distributor.json";
/// User-metadata key (without `x-amz-meta-`) holding an object's sha256.
pub const META_SHA256: &str = "distributor-sha256";
/// HEAD requests [`S3Root::head_many`] keeps in flight.
pub const HEADS_IN_FLIGHT: usize = 16;
/// User-metadata key holding the id of the intent that wrote the object.
pub const META_INTENT: &str = "distributor-intent";

/// An object's version as the server names it (an HTTP entity tag, quotes
/// included). Compared for equality only; never a digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(pub String);

/// The bytes of a catalog version, shared rather than copied: the body a
/// GET received or a PUT sends is the very buffer the client keeps as the
/// version it last saw (a 100,000-record catalog is 57 MiB, and each copy
/// of it costs time and memory; docs/object-storage.md, "Catalog scale").
#[derive(Clone, Default)]
pub struct CatalogBytes(PutPayload);

impl CatalogBytes {
    /// The payload of a PUT of these bytes (no copy).
    fn payload(&self) -> PutPayload {
        self.0.clone()
    }
}

impl From<Vec<u8>> for CatalogBytes {
    fn from(bytes: Vec<u8>) -> CatalogBytes {
        CatalogBytes(PutPayload::from(bytes))
    }
}

impl std::ops::Deref for CatalogBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // Always one piece: made from one `Vec` or one received body.
        match self.0.as_ref() {
            [] => &[],
            [one] => one,
            _ => unreachable!("a catalog's bytes are one piece"),
        }
    }
}

impl AsRef<[u8]> for CatalogBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for CatalogBytes {
    fn eq(&self, other: &CatalogBytes) -> bool {
        **self == **other
    }
}

impl fmt::Debug for CatalogBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CatalogBytes({} bytes)", self.len())
    }
}

impl fmt::Display for ETag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a HEAD says about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub size: u64,
    pub etag: ETag,
    /// `sha256:<hex>` from the object's metadata, if this tool wrote it.
    pub sha256: Option<String>,
    /// The intent id from the object's metadata, if this tool wrote it.
    pub intent: Option<String>,
    /// The server's `Last-Modified`.
    pub last_modified: OffsetDateTime,
    /// The response headers stored with it.
    pub served: headers::Served,
}

/// One entry of [`S3Root::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The key relative to the root's prefix.
    pub path: String,
    pub size: u64,
    pub last_modified: OffsetDateTime,
    /// The version the listing gave, when the server gave one.
    pub etag: Option<String>,
}

/// What can go wrong talking to the bucket. Each variant says which stage
/// of a publication it belongs to ([`Error::stage`]) and whether a retry
/// may succeed ([`Error::is_transient`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{var} is not set; an s3 destination takes its credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), never from the config file"
    )]
    Credentials { var: &'static str },
    #[error("cannot set up the s3 client for {root}: {source}")]
    Client {
        root: String,
        #[source]
        source: Box<object_store::Error>,
    },
    /// A setting of the s3 backend in the environment is unusable.
    #[error("{0}")]
    Setting(String),
    #[error("cannot start the s3 backend's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(
        "{root}: the server does not enforce conditional writes: {behaviour}; several publishers could overwrite each other: use a server that enforces them (SeaweedFS >= 4.48, AWS S3, MinIO)"
    )]
    Nonconforming { root: String, behaviour: String },
    #[error(
        "{root}: another publisher changed the catalog {key} since it was read; nothing of this publication is recorded; retry"
    )]
    Conflict { root: String, key: String },
    #[error(
        "{root}: {key} already exists and is not recorded in the catalog; it was left untouched"
    )]
    Exists { root: String, key: String },
    #[error(
        "{root}: {key} changed since it was looked at (another publisher wrote it); it was left untouched; retry"
    )]
    Changed { root: String, key: String },
    #[error(
        "{root}: {key}: the bytes read hash to {actual}, expected {expected}; nothing was stored"
    )]
    HashMismatch {
        root: String,
        key: String,
        expected: String,
        actual: String,
    },
    #[error("{root}: reading the data for {key}: {source}")]
    Read {
        root: String,
        key: String,
        #[source]
        source: std::io::Error,
    },
    /// An object larger than the most its reader takes (a small object
    /// read whole: a manifest, a result, the lease).
    #[error("{root}: {key} holds more than {most} bytes")]
    Oversize {
        root: String,
        key: String,
        most: u64,
    },
    /// A request failed; [`Failure`] says how, without anything the
    /// server sent (no body, no header value).
    #[error("{root}: {op} {key}: {failure}")]
    Store {
        root: String,
        op: &'static str,
        key: String,
        failure: Failure,
    },
    #[error(
        "{root}: {key} holds an object of publication {id} ({owner}), which is still running or stopped less than the lease ({lease_secs}s) ago; nothing of this publication is recorded; retry: once that publication ends or its lease runs out, its leftovers are cleaned up"
    )]
    Claimed {
        root: String,
        key: String,
        id: String,
        owner: String,
        lease_secs: u64,
    },
    #[error(
        "{root}: publication {id} was paused longer than the lease ({lease_secs}s) and another publisher took over its leftovers; nothing of it is recorded; retry"
    )]
    Revoked {
        root: String,
        id: String,
        lease_secs: u64,
    },
    #[error("{root}: {what}")]
    Protocol { root: String, what: String },
}

impl Error {
    /// The step this error belongs to: a client that cannot be set up is
    /// the configuration's; the conformance check and lost compare-and-swaps
    /// stand where the local backend's lock does; an object in the way is
    /// the plan's; the rest happen while publishing.
    pub fn stage(&self) -> Stage {
        match self {
            Error::Credentials { .. }
            | Error::Client { .. }
            | Error::Runtime(_)
            | Error::Setting(_) => Stage::Config,
            Error::Nonconforming { .. }
            | Error::Conflict { .. }
            | Error::Changed { .. }
            | Error::Claimed { .. }
            | Error::Revoked { .. } => Stage::Lock,
            Error::Exists { .. } => Stage::Plan,
            Error::HashMismatch { .. }
            | Error::Read { .. }
            | Error::Store { .. }
            | Error::Oversize { .. }
            | Error::Protocol { .. } => Stage::Publish,
        }
    }

    /// Whether reading a bundle file stopped because the agent is stopping.
    pub fn is_stopped(&self) -> bool {
        matches!(self, Error::Read { source, .. } if crate::runtime::interrupt::is_stopped(source))
    }

    /// Whether a later attempt may succeed without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Conflict { .. }
            | Error::Changed { .. }
            | Error::Claimed { .. }
            | Error::Revoked { .. } => true,
            Error::Store { failure, .. } => failure.is_transient(),
            // Reading a bundle file to upload it: the same rule as reading
            // it to publish it into a local root.
            Error::Read { source, .. } => crate::fs::io_class::is_transient_reading_bundle(source),
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An access key: from the environment in production (docs/contract.md §15.1).
#[derive(Clone)]
pub struct Credentials {
    pub key_id: String,
    pub secret: String,
    pub token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials({}, secret hidden)", self.key_id)
    }
}

impl Credentials {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, when set,
    /// `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<Credentials> {
        let env = |var: &'static str| std::env::var(var).ok().filter(|v| !v.is_empty());
        Ok(Credentials {
            key_id: env("AWS_ACCESS_KEY_ID").ok_or(Error::Credentials {
                var: "AWS_ACCESS_KEY_ID",
            })?,
            secret: env("AWS_SECRET_ACCESS_KEY").ok_or(Error::Credentials {
                var: "AWS_SECRET_ACCESS_KEY",
            })?,
            token: env("AWS_SESSION_TOKEN"),
        })
    }
}

/// One destination root inside a bucket: the bucket, a key prefix, and the
/// client and runtime that talk to it.
pub struct S3Root {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    /// "" or a clean relative path without a trailing slash.
    prefix: String,
    /// `s3://bucket/prefix` (and the endpoint), for messages.
    label: String,
    /// Which server and bucket the conformance check is cached for.
    server: String,
    /// The servers that passed the conformance check, shared with the
    /// other roots of a process ([`S3Root::sharing`]).
    passed: conformance::Passed,
    /// How `store` was made (`None` for a root over a given store): the
    /// conformance check builds its checksum probe from it, and
    /// [`S3Root::output_store`] the client that sends checksums.
    builder: Option<(AmazonS3Builder, ClientOptions)>,
    /// That client, once made.
    checksummed: std::sync::Mutex<Option<Arc<dyn ObjectStore>>>,
    /// The catalog version this client last read or wrote, and its bytes:
    /// the next read asks the server for the catalog only if it is no
    /// longer that version (`If-None-Match`), so a publisher that is alone
    /// does not download the catalog it has just written.
    catalog_seen: std::sync::Mutex<Option<(ETag, CatalogBytes)>>,
}

impl fmt::Debug for S3Root {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

impl S3Root {
    /// A client for `location`, with credentials from the environment
    /// ([`Credentials::from_env`]), path-style requests, and plain HTTP
    /// allowed for `http://` endpoints. Makes no request.
    pub fn open(location: &S3Location) -> Result<S3Root> {
        S3Root::open_with(location, Credentials::from_env()?)
    }

    /// This root, taking the servers that passed the conformance check
    /// from `passed` (and adding to it): the roots of one process probe a
    /// server and bucket once ([`crate::runtime::process_state::ProcessState`]).
    pub(crate) fn sharing(mut self, passed: &conformance::Passed) -> S3Root {
        self.passed = passed.clone();
        self
    }

    /// A client for `location` that tries every request once (no retry):
    /// for `status`, which reports and must not wait on a dead endpoint
    /// longer than one connection attempt or one request without progress.
    pub fn open_single_try(location: &S3Location) -> Result<S3Root> {
        S3Root::open_retrying(location, Credentials::from_env()?, Retries::None)
    }

    /// [`S3Root::open`] with the credentials given.
    pub fn open_with(location: &S3Location, credentials: Credentials) -> Result<S3Root> {
        S3Root::open_retrying(location, credentials, Retries::Some)
    }

    fn open_retrying(
        location: &S3Location,
        credentials: Credentials,
        retries: Retries,
    ) -> Result<S3Root> {
        let Credentials {
            key_id: key,
            secret,
            token,
        } = credentials;
        let label = location.to_string();
        let endpoint = location.endpoint.as_deref();
        let options = failure::client_options()
            .with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")));
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region(&location.region)
            .with_access_key_id(key)
            .with_secret_access_key(secret)
            .with_virtual_hosted_style_request(false)
            .with_retry(RetryConfig {
                max_retries: retries.max_retries(),
                retry_timeout: failure::RETRY_WINDOW,
                ..RetryConfig::default()
            })
            .with_client_options(options.clone())
            .with_http_connector(failure::GuardedConnector);
        if let Some(token) = token {
            builder = builder.with_token(token);
        }
        if let Some(endpoint) = endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        let store = builder.clone().build().map_err(|source| Error::Client {
            root: label.clone(),
            source: Box::new(source),
        })?;
        let server = format!(
            "{} {}",
            location.endpoint.as_deref().unwrap_or("aws"),
            location.bucket
        );
        let mut root = S3Root::with_store(Arc::new(store), &location.path, label, server)?;
        root.builder = Some((builder, options));
        Ok(root)
    }

    /// The client an output's PUT goes through: one that sends the SHA-256
    /// of each body (`x-amz-checksum-sha256`, computed with the payload
    /// hash that signs the request, so no second pass) when the
    /// conformance check found that the server verifies it, else the
    /// root's own.
    fn output_store(&self) -> Result<Arc<dyn ObjectStore>> {
        let builder = match &self.builder {
            Some((builder, _)) if self.verifies_checksums() => builder,
            _ => return Ok(Arc::clone(&self.store)),
        };
        let mut slot = self
            .checksummed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(store) = &*slot {
            return Ok(Arc::clone(store));
        }
        let store = builder
            .clone()
            .with_checksum_algorithm(Checksum::SHA256)
            .build()
            .map_err(|source| Error::Client {
                root: self.label.clone(),
                source: Box::new(source),
            })?;
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        *slot = Some(Arc::clone(&store));
        Ok(store)
    }

    /// A root over any store (tests use `object_store::memory::InMemory`).
    /// `server` names the server and bucket for the conformance cache.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        label: String,
        server: String,
    ) -> Result<S3Root> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;
        Ok(S3Root {
            runtime,
            store,
            prefix: prefix.trim_matches('/').to_owned(),
            label,
            server,
            passed: conformance::Passed::default(),
            builder: None,
            checksummed: std::sync::Mutex::new(None),
            catalog_seen: std::sync::Mutex::new(None),
        })
    }

    fn catalog_seen(&self) -> std::sync::MutexGuard<'_, Option<(ETag, CatalogBytes)>> {
        self.catalog_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `s3://bucket/prefix`, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The full key of `rel` (a path relative to the root): exactly
    /// `<prefix>/<rel>`, every character as it is (docs/contract.md §15.2:
    /// output `p` is the object `<path>/p`, so the bucket can be served as
    /// it is).
    pub fn key(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            object_path(rel)
        } else {
            object_path(&format!("{}/{rel}", self.prefix))
        }
    }

    /// Whether a request of this client reaches the object `rel` itself:
    /// its key is a path the client takes as it is (no control character,
    /// no empty, `.` or `..` segment, no slash at its end). A producer can
    /// upload any other key, which the client would change into another.
    pub fn addresses(&self, rel: &str) -> bool {
        let full = if self.prefix.is_empty() {
            rel.to_owned()
        } else {
            format!("{}/{rel}", self.prefix)
        };
        Path::parse(&full).is_ok_and(|p| p.as_ref() == full)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        failure::block_on(&self.runtime, f)
    }

    /// The error of a failed request, described by [`Failure`] (never by
    /// the store's error text, which carries the server's answer).
    fn store_err(&self, op: &'static str, rel: &str, source: object_store::Error) -> Error {
        self.store_failed(op, rel, &source, failure::last_answer())
    }

    /// [`S3Root::store_err`] with the status of the request's last error
    /// answer (from [`failure::answered`]), for requests running side by
    /// side.
    fn store_failed(
        &self,
        op: &'static str,
        rel: &str,
        source: &object_store::Error,
        answer: Option<u16>,
    ) -> Error {
        Error::Store {
            root: self.label.clone(),
            op,
            key: rel.to_owned(),
            failure: Failure::of(source, answer),
        }
    }

    /// The catalog's bytes and version, or `None` when there is none.
    /// A version this client has seen is not downloaded again: the GET
    /// carries `If-None-Match` with its ETag, and on `304 Not Modified`
    /// the bytes kept from that version are returned (the server has said
    /// that its current version is that one).
    pub fn read_catalog(&self) -> Result<Option<(CatalogBytes, ETag)>> {
        let key = self.key(CATALOG_KEY);
        let seen = self.catalog_seen().as_ref().map(|(etag, _)| etag.clone());
        // The catalog's bytes and ETag; `None` when there is none.
        let get = |options: GetOptions| async {
            match self.store.get_opts(&key, options).await {
                Ok(r) => {
                    let etag = r.meta.e_tag.clone();
                    let body = r.bytes().await?;
                    Ok(Some((CatalogBytes(PutPayload::from(body)), etag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let got = self.block_on(async {
            let options = GetOptions {
                if_none_match: seen.as_ref().map(|etag| etag.0.clone()),
                ..GetOptions::default()
            };
            match get(options).await {
                Err(object_store::Error::NotModified { .. }) if seen.is_some() => {
                    let kept = self.catalog_seen().clone();
                    match kept {
                        Some((etag, bytes)) if Some(&etag) == seen.as_ref() => {
                            Ok(Some((bytes, Some(etag.0))))
                        }
                        // Replaced meanwhile by this process: read it again.
                        _ => get(GetOptions::default()).await,
                    }
                }
                other => other,
            }
        });
        match got.map_err(|e| self.store_err("GET", CATALOG_KEY, e))? {
            None => Ok(None),
            Some((bytes, Some(etag))) => {
                let etag = ETag(etag);
                *self.catalog_seen() = Some((etag.clone(), bytes.clone()));
                Ok(Some((bytes, etag)))
            }
            Some((_, None)) => Err(Error::Protocol {
                root: self.label.clone(),
                what: format!(
                    "the server sent {CATALOG_KEY} without an ETag; compare-and-swap is impossible without one"
                ),
            }),
        }
    }

    /// Compare-and-swap of the catalog: creates it when `expected` is
    /// `None` (`If-None-Match: *`), else replaces exactly that version
    /// (`If-Match`). [`Error::Conflict`] when another writer got there
    /// first. Returns the new version.
    pub fn write_catalog(&self, bytes: CatalogBytes, expected: Option<&ETag>) -> Result<ETag> {
        self.check_conformance()?;
        let mode = match expected {
            None => PutMode::Create,
            Some(etag) => PutMode::Update(UpdateVersion {
                e_tag: Some(etag.0.clone()),
                version: None,
            }),
        };
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::ContentType, "application/json".into());
        let key = self.key(CATALOG_KEY);
        let payload = bytes.payload();
        let put = self.block_on(self.store.put_opts(
            &key,
            payload,
            PutOptions {
                mode,
                attributes,
                ..PutOptions::default()
            },
        ));
        match put {
            Ok(r) => {
                let etag = self.etag_of(CATALOG_KEY, r.e_tag)?;
                *self.catalog_seen() = Some((etag.clone(), bytes));
                Ok(etag)
            }
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Err(Error::Conflict {
                root: self.label.clone(),
                key: CATALOG_KEY.to_owned(),
            }),
            Err(e) => Err(self.store_err("PUT", CATALOG_KEY, e)),
        }
    }

    fn etag_of(&self, rel: &str, etag: Option<String>) -> Result<ETag> {
        etag.map(ETag).ok_or_else(|| Error::Protocol {
            root: self.label.clone(),
            what: format!("the server stored {rel} but sent no ETag"),
        })
    }

    /// Uploads `source` to `rel`, which must not exist (`If-None-Match: *`):
    /// never overwrites an object, even one that appeared a moment ago.
    /// `sha256` (when the caller knows it) is checked before the object
    /// becomes visible; `intent` is recorded in the object's metadata. The
    /// object gets its MIME type and no other header (the commit protocol
    /// stores outputs with their destination's header rules).
    pub fn put_new(
        &self,
        rel: &str,
        source: &mut dyn Read,
        sha256: Option<&str>,
        intent: &str,
    ) -> Result<Written> {
        self.check_conformance()?;
        let served = headers::HeaderRules::default().served(rel);
        upload::put(
            self,
            rel,
            source,
            upload::Condition::Absent,
            sha256,
            &served,
            Some(intent),
            &mut || Ok(()),
        )
    }

    /// Uploads `source` over `rel` only if the object is still at version
    /// `etag` (`If-Match`); [`Error::Changed`] otherwise.
    pub fn put_replace(
        &self,
        rel: &str,
        source: &mut dyn Read,
        etag: &ETag,
        sha256: Option<&str>,
        intent: &str,
    ) -> Result<Written> {
        self.check_conformance()?;
        let served = headers::HeaderRules::default().served(rel);
        upload::put(
            self,
            rel,
            source,
            upload::Condition::Version(etag),
            sha256,
            &served,
            Some(intent),
            &mut || Ok(()),
        )
    }

    /// Uploads `source` to `rel` over whatever is there: a producer's
    /// upload into an intake's inbox (`distributor bundle upload`,
    /// docs/contract.md §22.1), the one unconditional write of this module.
    /// It is no destination write: no catalog records an inbox key and no
    /// publisher writes one. What it may overwrite is the rest of an
    /// earlier, interrupted upload under the same bundle name, which a
    /// retry must replace; the caller has checked before its first upload
    /// that the bundle's `manifest.json` is not there (the bundle was not
    /// delivered), and puts that last with [`S3Root::put_upload_new`].
    ///
    /// No conformance check: it writes probe objects under the root's
    /// parent prefix, where a producer's credentials usually may not write
    /// (docs/producers.md, "Bucket policies"), and this upload relies on no
    /// condition. `sha256`, when given, is checked before the object
    /// becomes visible and stored in its metadata; there is no intent.
    pub fn put_upload(
        &self,
        rel: &str,
        source: &mut dyn Read,
        sha256: Option<&str>,
    ) -> Result<Written> {
        let served = headers::HeaderRules::default().served(rel);
        upload::put(
            self,
            rel,
            source,
            upload::Condition::Any,
            sha256,
            &served,
            None,
            &mut || Ok(()),
        )
    }

    /// The PUT that completes a producer's upload ([`S3Root::put_upload`]):
    /// `bytes` (a bundle's `manifest.json`) to `rel` in one request, never
    /// a multipart upload (whose placeholder would be an empty manifest
    /// for a moment), and only where no object is (`If-None-Match: *`;
    /// [`Error::Exists`] otherwise). No conformance check, as for
    /// `put_upload`: on a server that ignores the condition this is an
    /// overwrite, which the caller's `HEAD` before its first upload
    /// guards against.
    pub fn put_upload_new(&self, rel: &str, bytes: Vec<u8>) -> Result<Written> {
        let served = headers::HeaderRules::default().served(rel);
        let sha256 = crate::fs::hashing::hash_bytes(&bytes).sha256;
        self.block_on(upload::put_one(
            self,
            rel,
            bytes,
            sha256,
            upload::Condition::Absent,
            &served,
            None,
        ))
    }

    /// What the server says about `rel`, or `None` when it does not exist.
    pub fn head(&self, rel: &str) -> Result<Option<Head>> {
        self.block_on(self.head_async(rel))
    }

    /// [`S3Root::head`] of every path in `rels` (in that order), with up to
    /// [`HEADS_IN_FLIGHT`] requests at once: planning a bundle of many
    /// files waits for the slowest round trips, not for their sum.
    pub fn head_many(&self, rels: &[&str]) -> Result<Vec<Option<Head>>> {
        use futures_util::StreamExt as _;
        self.block_on(
            futures_util::stream::iter(rels.iter().map(|rel| self.head_async(rel)))
                .buffered(HEADS_IN_FLIGHT)
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .collect()
    }

    async fn head_async(&self, rel: &str) -> Result<Option<Head>> {
        let key = self.key(rel);
        let options = GetOptions {
            head: true,
            ..GetOptions::default()
        };
        let (got, answer) = failure::answered(self.store.get_opts(&key, options)).await;
        let r = match got {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.store_failed("HEAD", rel, &e, answer)),
        };
        let attribute = |a: Attribute| r.attributes.get(&a).map(|v| v.as_ref().to_owned());
        let meta = |name: &'static str| attribute(Attribute::Metadata(name.into()));
        Ok(Some(Head {
            size: r.meta.size,
            etag: self.etag_of(rel, r.meta.e_tag.clone())?,
            sha256: meta(META_SHA256),
            intent: meta(META_INTENT),
            last_modified: to_time(r.meta.last_modified),
            served: headers::Served {
                content_type: attribute(Attribute::ContentType),
                cache_control: attribute(Attribute::CacheControl),
                content_disposition: attribute(Attribute::ContentDisposition),
            },
        }))
    }

    /// Streams `rel` through sha256 (for `verify`), with the version that
    /// was read; `None` when it does not exist. Memory stays at one chunk.
    pub fn get_hashed(&self, rel: &str) -> Result<Option<(Hashed, ETag)>> {
        use futures_util::StreamExt as _;
        use sha2::Digest as _;
        let key = self.key(rel);
        let got: Result<Option<(Hashed, Option<String>)>, object_store::Error> =
            self.block_on(async {
                let r = match self.store.get_opts(&key, GetOptions::default()).await {
                    Ok(r) => r,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(e),
                };
                let etag = r.meta.e_tag.clone();
                let mut hasher = sha2::Sha256::new();
                let mut size = 0u64;
                let mut stream = r.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    size += chunk.len() as u64;
                    hasher.update(&chunk);
                }
                let sha256 = crate::fs::hashing::format_digest(hasher);
                Ok(Some((Hashed { sha256, size }, etag)))
            });
        match got.map_err(|e| self.store_err("GET", rel, e))? {
            None => Ok(None),
            Some((hashed, etag)) => Ok(Some((hashed, self.etag_of(rel, etag)?))),
        }
    }

    /// [`S3Root::get_hashed`] of every path in `rels`, up to `concurrency`
    /// GETs in flight (for `verify` of many objects: the time goes into
    /// round trips, not bytes). Results in the order of `rels`; the first
    /// error ends the call. Memory stays at one chunk per GET in flight.
    pub fn get_hashed_all(
        &self,
        rels: &[&str],
        concurrency: usize,
    ) -> Result<Vec<Option<(Hashed, ETag)>>> {
        use futures_util::StreamExt as _;
        let one = |rel: &str| {
            let rel = rel.to_owned();
            async move {
                use sha2::Digest as _;
                let key = self.key(&rel);
                let (got, answer) =
                    failure::answered(self.store.get_opts(&key, GetOptions::default())).await;
                let r = match got {
                    Ok(r) => r,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(self.store_failed("GET", &rel, &e, answer)),
                };
                let etag = r.meta.e_tag.clone();
                let mut hasher = sha2::Sha256::new();
                let mut size = 0u64;
                let mut stream = r.into_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| self.store_failed("GET", &rel, &e, None))?;
                    size += chunk.len() as u64;
                    hasher.update(&chunk);
                }
                let sha256 = crate::fs::hashing::format_digest(hasher);
                Ok(Some((Hashed { sha256, size }, self.etag_of(&rel, etag)?)))
            }
        };
        self.block_on(async {
            let mut results = futures_util::stream::iter(rels.iter().map(|rel| one(rel)))
                .buffered(concurrency.max(1));
            let mut out = Vec::with_capacity(rels.len());
            while let Some(r) = results.next().await {
                out.push(r?);
            }
            Ok(out)
        })
    }

    /// Deletes `rel`; a missing object is not an error. S3's DELETE takes
    /// no `If-Match` on most servers (and `object_store` sends none), so the
    /// caller decides with [`S3Root::head`] right before: see
    /// docs/object-storage.md for why that window is harmless.
    pub fn delete(&self, rel: &str) -> Result<()> {
        self.check_conformance()?;
        let key = self.key(rel);
        match self.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err("DELETE", rel, e)),
        }
    }

    /// [`S3Root::delete`] of every path in `rels`, a thousand to a request
    /// (S3's `DeleteObjects`; one by one, up to 20 at once, on a server
    /// configured without it): undoing a batch of thousands of objects,
    /// or removing a finished bundle from an intake, is one round trip,
    /// not one per object. Every delete is attempted; the first error is
    /// returned.
    pub fn delete_many(&self, rels: &[&str]) -> Result<()> {
        use futures_util::StreamExt as _;
        self.check_conformance()?;
        if rels.is_empty() {
            return Ok(());
        }
        let keys: Vec<object_store::Result<object_store::path::Path>> =
            rels.iter().map(|rel| Ok(self.key(rel))).collect();
        let (results, answer): (Vec<object_store::Result<_>>, _) =
            self.block_on(failure::answered(
                self.store
                    .delete_stream(futures_util::stream::iter(keys).boxed())
                    .collect(),
            ));
        let what = match rels {
            [one] => (*one).to_owned(),
            [first, rest @ ..] => format!("{first} and {} more", rest.len()),
            [] => String::new(),
        };
        for r in results {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.store_failed("DELETE", &what, &e, answer)),
            }
        }
        Ok(())
    }

    /// Every object under `rel_prefix` ("" = the whole root), keys relative
    /// to the root, sorted. For reports and clean-up only: a listing may be
    /// stale, so no commit decision rests on it.
    pub fn list(&self, rel_prefix: &str) -> Result<Vec<Listed>> {
        Ok(self
            .list_at_most(rel_prefix, usize::MAX)?
            .unwrap_or_default())
    }

    /// The server's clock: the `Last-Modified` it stamps on a tiny object
    /// this call creates under a fresh `.distributor-pending/clock-<random>` key and
    /// deletes again. S3 does not expose the `Date` header through
    /// `object_store`; `Last-Modified` is the same clock, to the second.
    pub fn server_now(&self) -> Result<OffsetDateTime> {
        let rel = format!("{}/clock-{}", protocol::PENDING_DIR, random_id());
        self.check_conformance()?;
        let key = self.key(&rel);
        let put = self.block_on(self.store.put_opts(
            &key,
            PutPayload::from_static(b""),
            PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            },
        ));
        put.map_err(|e| self.store_err("PUT", &rel, e))?;
        let head = self.head(&rel);
        let deleted = self.delete(&rel);
        let head = head?.ok_or_else(|| Error::Protocol {
            root: self.label.clone(),
            what: format!("{rel} vanished right after it was written"),
        })?;
        deleted?;
        Ok(head.last_modified)
    }
}

/// How a client retries a failed request.
#[derive(Debug, Clone, Copy)]
enum Retries {
    /// Up to [`failure::MAX_RETRIES`] times, within [`failure::RETRY_WINDOW`].
    Some,
    /// Never.
    None,
}

impl Retries {
    fn max_retries(self) -> usize {
        match self {
            Retries::Some => failure::MAX_RETRIES,
            Retries::None => 0,
        }
    }
}

/// The object key `key` as it is. `Path::from` would percent-encode
/// characters object_store finds awkward (`é`, `%`, `#`, `?`, `{`, ...) into
/// the key itself, so `café.txt` would be stored as `caf%C3%A9.txt` and a
/// browser asking the bucket for `café.txt` would get a 404. Every key here
/// is a clean relative path (docs/contract.md §2: no empty, `.` or `..`
/// segment, no control character), which `Path::parse` takes unchanged;
/// anything else is a bug, logged, and gets object_store's encoding.
fn object_path(key: &str) -> Path {
    Path::parse(key).unwrap_or_else(|e| {
        log::error!("object key {key:?} is not a clean relative path ({e}); it is encoded");
        Path::from(key)
    })
}

fn to_time(t: chrono::DateTime<chrono::Utc>) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(t.timestamp())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
        .replace_nanosecond(t.timestamp_subsec_nanos())
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// 128 random bits as 32 hex digits, for probe keys and intent ids.
pub fn random_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    // One counter per process, so that two ids made in the same instant
    // differ: process-wide on purpose (docs/architecture.md, "What a
    // process keeps").
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::with_capacity(32);
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
