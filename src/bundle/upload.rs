//! Uploading a checked bundle into an intake's inbox in a bucket, for
//! producers without another S3 tool (`distributor bundle upload`,
//! docs/contract.md §22.1): every listed file to
//! `<path>/inbox/<name>/<file>`, then `manifest.json.sig` when there is one,
//! then `manifest.json`, last and in one request, so that the agent never
//! sees a manifest before the files it lists.
//!
//! The bundle folder is read as verification reads it (no link followed,
//! nothing but regular files opened) and each file is hashed against the
//! manifest while it is sent, so a file changed since it was checked never
//! becomes visible. Nothing is written on disk. Files the manifest does not
//! list are not uploaded.

use super::error::BundleError;
use super::open::{open_bundle_dir, open_listed_at};
use super::parse::parse_manifest;
use super::verify::{VerifiedBundle, read_manifest_bytes, read_signature};
use super::{MANIFEST, MAX_MANIFEST_BYTES};
use crate::s3::{self, S3Root};
use crate::signature::SIGNATURE_FILE;
use std::fmt;

/// The longest object key S3 takes, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Where a bundle is uploaded: `s3://BUCKET/PATH/inbox/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxUrl {
    pub bucket: String,
    /// The intake's `path`: "" (the bucket's top) or a clean relative path.
    pub path: String,
    /// The bundle's name in the inbox.
    pub name: String,
}

/// The form an [`InboxUrl`] is written in, for messages.
pub const INBOX_URL_FORM: &str = "s3://BUCKET/PATH/inbox/NAME";

impl InboxUrl {
    /// Parses `s3://BUCKET/PATH/inbox/NAME` (PATH may be empty: then
    /// `s3://BUCKET/inbox/NAME`; one trailing `/` is allowed). The error
    /// names the expected form, or the name rule that failed.
    pub fn parse(text: &str) -> Result<InboxUrl, String> {
        let wrong = |why: &str| {
            format!(
                "{text:?} {why}; give {INBOX_URL_FORM}, where PATH is the intake's path (the pipeline's intake.path) and NAME the bundle's name"
            )
        };
        let rest = text
            .strip_prefix("s3://")
            .ok_or_else(|| wrong("is not an s3:// URL"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (bucket, key) = rest
            .split_once('/')
            .ok_or_else(|| wrong("names no key below the bucket"))?;
        if bucket.is_empty() {
            return Err(wrong("names no bucket"));
        }
        let (before, name) = key
            .rsplit_once('/')
            .ok_or_else(|| wrong("does not end with /inbox/NAME"))?;
        let path = match before.strip_suffix("/inbox") {
            Some(path) => path,
            None if before == "inbox" => "",
            None => return Err(wrong("does not end with /inbox/NAME")),
        };
        if !path.is_empty() {
            crate::paths::RelPath::parse(path)
                .map_err(|e| wrong(&format!("has a PATH that is not a clean key prefix ({e})")))?;
        }
        crate::paths::check_bundle_name(name)?;
        Ok(InboxUrl {
            bucket: bucket.to_owned(),
            path: path.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The key prefix of the bundle's objects: `PATH/inbox/NAME`.
    pub fn prefix(&self) -> String {
        match self.path.is_empty() {
            true => format!("inbox/{}", self.name),
            false => format!("{}/inbox/{}", self.path, self.name),
        }
    }

    /// The key of the bundle's file `rel`.
    pub fn key(&self, rel: &str) -> String {
        format!("{}/{rel}", self.prefix())
    }
}

impl fmt::Display for InboxUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix())
    }
}

/// One object uploaded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Uploaded {
    /// The object's key in the bucket.
    pub key: String,
    pub size: u64,
}

/// Why an upload stopped. Only [`UploadError::Delivered`] and
/// [`UploadError::KeyTooLong`] come before the first object is sent.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(
        "{url}/{MANIFEST} already exists: a bundle of that name was delivered and waits for the agent (or is in its hands). Choose another name, or have the operator remove the waiting bundle (`distributor spool delete`)"
    )]
    Delivered { url: String },
    #[error(
        "{key} would be {len} bytes long, and S3 keys are at most {MAX_KEY_BYTES}: shorten the file's path, the bundle's name or the intake's path"
    )]
    KeyTooLong { key: String, len: usize },
    #[error(
        "{MANIFEST} changed since the bundle was checked; finish the bundle (seal it last), then run the upload again"
    )]
    Changed,
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    S3(#[from] s3::Error),
}

/// Uploads the bundle `bundle` (as [`super::verify()`] found it) through
/// `root`, the client of the bucket whose prefix is `url`'s
/// ([`InboxUrl::prefix`]): refused with [`UploadError::Delivered`],
/// before anything is sent, when a listing of `url` shows a
/// `manifest.json`;
/// otherwise every listed file (over whatever a retry finds there), the
/// signature, and the manifest last. `sent` hears of each object once it
/// is stored.
pub fn upload(
    bundle: &VerifiedBundle,
    root: &S3Root,
    url: &InboxUrl,
    sent: &mut dyn FnMut(&Uploaded),
) -> Result<(), UploadError> {
    let dir = bundle.dir.as_path();
    let folder = open_bundle_dir(dir)?;
    // The manifest sent is the one read now; it must be the one checked.
    let manifest_bytes = read_manifest_bytes(&folder, dir, MAX_MANIFEST_BYTES)?;
    let manifest = parse_manifest(&manifest_bytes)?;
    if manifest != bundle.manifest {
        return Err(UploadError::Changed);
    }
    let signature = read_signature(&folder, dir)?;

    let rels = manifest.files.iter().map(|f| f.path.as_str());
    for rel in rels.chain([SIGNATURE_FILE]) {
        let key = url.key(rel);
        if key.len() > MAX_KEY_BYTES {
            return Err(UploadError::KeyTooLong {
                len: key.len(),
                key,
            });
        }
    }
    // A LIST of the bundle's prefix, not a HEAD of its manifest: a
    // producer limited to its own prefix may list it, but a HEAD of a
    // missing key is refused (403) to whoever may not list the whole
    // bucket (docs/producers.md, "Bucket policies").
    if root.list("")?.iter().any(|o| o.path == MANIFEST) {
        return Err(UploadError::Delivered {
            url: url.to_string(),
        });
    }

    let mut tell = |rel: &str, written: &s3::Written| {
        sent(&Uploaded {
            key: url.key(rel),
            size: written.size,
        });
    };
    for listed in &manifest.files {
        let rel = listed.path.as_str();
        let mut file = open_listed_at(&folder, dir, &listed.path)?;
        let written = root.put_upload(rel, &mut file, Some(&listed.sha256))?;
        tell(rel, &written);
    }
    if let Some(signature) = signature {
        let written = root.put_upload(SIGNATURE_FILE, &mut signature.as_slice(), None)?;
        tell(SIGNATURE_FILE, &written);
    }
    let sha256 = crate::fs::hashing::hash_bytes(&manifest_bytes).sha256;
    let written = match root.put_upload_new(MANIFEST, manifest_bytes) {
        Err(s3::Error::Exists { .. }) => {
            // Ours after all, when its first answer was lost and the client
            // sent it again; or another upload's at that moment (or one that
            // this producer may not look at).
            match root.head(MANIFEST) {
                Ok(Some(head)) if head.sha256.as_deref() == Some(sha256.as_str()) => s3::Written {
                    sha256,
                    size: head.size,
                    etag: head.etag,
                },
                _ => {
                    return Err(UploadError::Delivered {
                        url: url.to_string(),
                    });
                }
            }
        }
        other => other?,
    };
    tell(MANIFEST, &written);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_urls_name_a_bucket_a_path_and_a_bundle() {
        // (url, bucket, path, name)
        let cases = [
            (
                "s3://intake/reports/inbox/2026-06-04",
                "intake",
                "reports",
                "2026-06-04",
            ),
            (
                "s3://intake/reports/inbox/2026-06-04/",
                "intake",
                "reports",
                "2026-06-04",
            ),
            ("s3://intake/a/b/inbox/r", "intake", "a/b", "r"),
            ("s3://intake/inbox/r", "intake", "", "r"),
            ("s3://intake/inbox/inbox/inbox", "intake", "inbox", "inbox"),
        ];
        for (text, bucket, path, name) in cases {
            let url = InboxUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(
                (url.bucket.as_str(), url.path.as_str(), url.name.as_str()),
                (bucket, path, name),
                "{text}"
            );
            assert_eq!(url.to_string(), text.trim_end_matches('/'));
        }
        assert_eq!(
            InboxUrl::parse("s3://intake/reports/inbox/r")
                .unwrap()
                .key("a/b.md"),
            "reports/inbox/r/a/b.md"
        );
    }

    #[test]
    fn other_urls_are_refused_naming_the_form_or_the_name_rule() {
        // (url, what the message says)
        let cases = [
            ("intake/reports/inbox/r", "not an s3:// URL"),
            ("https://intake/reports/inbox/r", "not an s3:// URL"),
            ("s3://intake", "no key below the bucket"),
            ("s3:///reports/inbox/r", "no bucket"),
            ("s3://intake/reports/r", "does not end with /inbox/NAME"),
            ("s3://intake/reports/inbox", "does not end with /inbox/NAME"),
            (
                "s3://intake/reports/inbox/",
                "does not end with /inbox/NAME",
            ),
            (
                "s3://intake/reports/outbox/r",
                "does not end with /inbox/NAME",
            ),
            (
                "s3://intake/reports/inbox/r/x",
                "does not end with /inbox/NAME",
            ),
            ("s3://intake/reports/inbox//", "is empty"),
            ("s3://intake/a//b/inbox/r", "not a clean key prefix"),
            ("s3://intake/../inbox/r", "not a clean key prefix"),
            ("s3://intake/reports/inbox/.staging", "starts with '.'"),
            ("s3://intake/reports/inbox/..", "is '.' or '..'"),
        ];
        for (text, says) in cases {
            let e = InboxUrl::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
        let e = InboxUrl::parse("s3://intake/reports/r").unwrap_err();
        assert!(e.contains(INBOX_URL_FORM), "{e}");
    }
}
