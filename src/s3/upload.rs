//! Streaming, hashed, conditional uploads. An object that fits in one part
//! goes up in one conditional PUT; a larger one as a multipart upload whose
//! parts are read, hashed and sent in one pass, with at most
//! [`MAX_IN_FLIGHT`] parts in memory besides the one being filled.
//!
//! `object_store` completes multipart uploads without conditions, so a
//! multipart upload first *claims* the key with a conditional PUT of an
//! empty placeholder (`If-None-Match: *` for a new key, `If-Match` for a
//! replaced one) and then completes over its own placeholder: the condition
//! is checked exactly once, before any part is sent, and nobody else can
//! write the key in between (it holds an object that no catalog records
//! with a matching sha256).
//!
//! The one upload without a condition is a producer's into an inbox
//! ([`Condition::Any`], [`S3Root::put_upload`]): no claim, no placeholder.

use std::io::Read;

use object_store::{
    Attribute, Attributes, ObjectStore as _, ObjectStoreExt as _, PutMode, PutMultipartOptions,
    PutOptions, PutPayload, UpdateVersion, WriteMultipart,
};
use sha2::Digest as _;

use super::headers::Served;
use super::{ETag, Error, META_INTENT, META_SHA256, Result, S3Root};

/// Size of one multipart part, and the largest object sent in one PUT.
/// S3 allows 10,000 parts, so objects up to 80 GiB.
pub const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploading at once.
pub const MAX_IN_FLIGHT: usize = 3;

/// What an upload stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// `sha256:<hex>` of the bytes stored.
    pub sha256: String,
    pub size: u64,
    /// The new object's version.
    pub etag: ETag,
}

/// Reads until `buf` is full or the source ends; returns how much was read.
fn read_full(source: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match source.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// What an object is stored with: its response headers (`served`) and
/// the tool's metadata (no intent for a producer's upload, which belongs
/// to no publication).
fn attributes(served: &Served, sha256: Option<&str>, intent: Option<&str>) -> Attributes {
    let mut a = Attributes::new();
    for (key, value) in [
        (Attribute::ContentType, &served.content_type),
        (Attribute::CacheControl, &served.cache_control),
        (Attribute::ContentDisposition, &served.content_disposition),
    ] {
        if let Some(value) = value {
            a.insert(key, value.clone().into());
        }
    }
    if let Some(intent) = intent {
        a.insert(
            Attribute::Metadata(META_INTENT.into()),
            intent.to_owned().into(),
        );
    }
    if let Some(sha) = sha256 {
        a.insert(
            Attribute::Metadata(META_SHA256.into()),
            sha.to_owned().into(),
        );
    }
    a
}

/// What a PUT asks of the object already at its key.
#[derive(Debug, Clone, Copy)]
pub(super) enum Condition<'a> {
    /// That there is none (`If-None-Match: *`).
    Absent,
    /// That it is exactly this version (`If-Match`).
    Version(&'a ETag),
    /// Nothing: whatever is there is overwritten. Only a producer's upload
    /// into an inbox asks this ([`S3Root::put_upload`]); it is no
    /// destination write.
    Any,
}

impl<'a> From<Option<&'a ETag>> for Condition<'a> {
    /// A new key (`None`) or the replacement of a version.
    fn from(replace: Option<&'a ETag>) -> Condition<'a> {
        match replace {
            None => Condition::Absent,
            Some(etag) => Condition::Version(etag),
        }
    }
}

fn mode(condition: Condition<'_>) -> PutMode {
    match condition {
        Condition::Absent => PutMode::Create,
        Condition::Version(etag) => PutMode::Update(UpdateVersion {
            e_tag: Some(etag.0.clone()),
            version: None,
        }),
        Condition::Any => PutMode::Overwrite,
    }
}

/// The first [`PART_SIZE`] bytes of `source`, or all of it when it is
/// shorter (then the object goes up in one PUT). The buffer grows with
/// what is read, so a small object costs its size, not a part.
pub(super) fn read_first_part(root: &S3Root, rel: &str, source: &mut dyn Read) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    source
        .take(PART_SIZE as u64)
        .read_to_end(&mut buf)
        .map_err(|source| Error::Read {
            root: root.label.clone(),
            key: rel.to_owned(),
            source,
        })?;
    Ok(buf)
}

/// A source whose first part was already read ([`read_first_part`]):
/// those bytes, then the rest. The first part's buffer is freed as soon as
/// it has been read again, so a large upload holds it only once.
pub(super) struct FirstThen<'a> {
    first: Option<std::io::Cursor<Vec<u8>>>,
    rest: &'a mut dyn Read,
}

impl<'a> FirstThen<'a> {
    pub(super) fn new(first: Vec<u8>, rest: &'a mut dyn Read) -> FirstThen<'a> {
        FirstThen {
            first: Some(std::io::Cursor::new(first)),
            rest,
        }
    }
}

impl Read for FirstThen<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(first) = &mut self.first {
            let n = first.read(buf)?;
            if first.position() >= first.get_ref().len() as u64 {
                self.first = None;
            }
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
        }
        self.rest.read(buf)
    }
}

/// One PUT, under `condition`, of an object (shorter than a part, or
/// one that must go up in one request) whose bytes the caller has hashed
/// (`sha256`) and checked, stored with the headers `served`.
/// [`Error::Exists`] or [`Error::Changed`] when the condition fails.
pub(super) async fn put_one(
    root: &S3Root,
    rel: &str,
    bytes: Vec<u8>,
    sha256: String,
    condition: Condition<'_>,
    served: &Served,
    intent: Option<&str>,
) -> Result<Written> {
    let size = bytes.len() as u64;
    let put = root
        .output_store()?
        .put_opts(
            &root.key(rel),
            PutPayload::from(bytes),
            PutOptions {
                mode: mode(condition),
                attributes: attributes(served, Some(&sha256), intent),
                ..PutOptions::default()
            },
        )
        .await;
    let r = put.map_err(|e| refused(root, rel, e))?;
    Ok(Written {
        sha256,
        size,
        etag: root.etag_of(rel, r.e_tag)?,
    })
}

/// A conditional PUT's error: [`Error::Exists`] when `If-None-Match: *`
/// found an object, [`Error::Changed`] when `If-Match` found another
/// version, else the store's error.
fn refused(root: &S3Root, rel: &str, e: object_store::Error) -> Error {
    match e {
        object_store::Error::AlreadyExists { .. } => Error::Exists {
            root: root.label.clone(),
            key: rel.to_owned(),
        },
        object_store::Error::Precondition { .. } => Error::Changed {
            root: root.label.clone(),
            key: rel.to_owned(),
        },
        e => root.store_err("PUT", rel, e),
    }
}

/// The upload behind `put_new` ([`Condition::Absent`]), `put_replace`
/// ([`Condition::Version`]) and `put_upload` ([`Condition::Any`]),
/// stored with the headers `served`. `tick` runs before each further
/// part of a multipart upload (the commit protocol renews its lease
/// there); an error from it aborts the upload.
#[allow(clippy::too_many_arguments)]
pub(super) fn put(
    root: &S3Root,
    rel: &str,
    source: &mut dyn Read,
    condition: Condition<'_>,
    expected: Option<&str>,
    served: &Served,
    intent: Option<&str>,
    tick: &mut dyn FnMut() -> Result<()>,
) -> Result<Written> {
    let read_err = |source| Error::Read {
        root: root.label.clone(),
        key: rel.to_owned(),
        source,
    };
    let refused = |e: object_store::Error| refused(root, rel, e);
    let check = |actual: &str| match expected {
        Some(exp) if exp != actual => Err(Error::HashMismatch {
            root: root.label.clone(),
            key: rel.to_owned(),
            expected: exp.to_owned(),
            actual: actual.to_owned(),
        }),
        _ => Ok(()),
    };
    let key = root.key(rel);
    let store = root.output_store()?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = read_first_part(root, rel, source)?;
    let n = buf.len();
    hasher.update(&buf);

    if n < PART_SIZE {
        // One conditional PUT: atomic, the condition checked by the server.
        let sha256 = crate::fs::hashing::format_digest(hasher);
        check(&sha256)?;
        return root.block_on(put_one(root, rel, buf, sha256, condition, served, intent));
    }
    buf.resize(PART_SIZE, 0);

    // Claim the key: the one conditional write of a multipart upload (an
    // upload under no condition has nothing to claim).
    if !matches!(condition, Condition::Any) {
        let claim = root.block_on(store.put_opts(
            &key,
            PutPayload::from_static(b""),
            PutOptions {
                mode: mode(condition),
                attributes: attributes(served, None, intent),
                ..PutOptions::default()
            },
        ));
        claim.map_err(refused)?;
    }

    // The upload is driven step by step: reading the source and `tick`
    // (which may talk to the store itself) happen outside the runtime;
    // parts upload while the runtime runs (waiting for capacity, finishing).
    let size_and_result = (|| -> Result<(u64, String, Option<String>)> {
        let upload = root
            .block_on(store.put_multipart_opts(
                &key,
                PutMultipartOptions {
                    attributes: attributes(served, expected, intent),
                    ..PutMultipartOptions::default()
                },
            ))
            .map_err(|e| root.store_err("PUT (multipart start)", rel, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut size = n as u64;
        {
            // Writing a full chunk spawns its upload on the runtime.
            let _in_runtime = root.runtime.enter();
            writer.write(&buf[..n]);
        }
        let mut part = buf;
        let outcome = (|| -> Result<()> {
            loop {
                root.block_on(writer.wait_for_capacity(MAX_IN_FLIGHT))
                    .map_err(|e| root.store_err("PUT (part)", rel, e))?;
                tick()?;
                let n = read_full(source, &mut part).map_err(read_err)?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&part[..n]);
                size += n as u64;
                let _in_runtime = root.runtime.enter();
                writer.write(&part[..n]);
            }
        })();
        let sha256 = crate::fs::hashing::format_digest(hasher.clone());
        match outcome.and_then(|()| check(&sha256)) {
            Ok(()) => {
                let r = root
                    .block_on(writer.finish())
                    .map_err(|e| root.store_err("PUT (multipart complete)", rel, e))?;
                Ok((size, sha256, r.e_tag))
            }
            Err(e) => {
                // Best effort: an abandoned upload is invisible and the
                // bucket's lifecycle rule (docs/object-storage.md) ends it.
                let _ = root.block_on(writer.abort());
                Err(e)
            }
        }
    })();
    let (size, sha256, etag) = match size_and_result {
        Ok(done) => done,
        Err(e) => {
            // A claimed new key holds this upload's empty placeholder: take
            // it away again (only if it is still ours). A replaced key keeps
            // the placeholder; see docs/object-storage.md, "Large objects".
            if matches!(condition, Condition::Absent)
                && intent.is_some()
                && let Ok(Some(head)) = root.head(rel)
                && head.intent.as_deref() == intent
                && head.size == 0
            {
                let _ = root.block_on(root.store.delete(&key));
            }
            return Err(e);
        }
    };
    Ok(Written {
        sha256,
        size,
        etag: root.etag_of(rel, etag)?,
    })
}
