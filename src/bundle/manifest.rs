//! The `manifest.json` model ([`Manifest`], [`ManifestFile`]), its JSON form
//! as `bundle seal` writes it, the digest rule and `created` timestamps.
//! Pure data and text: nothing here touches the file system.

use super::SCHEMA_VERSION;
use crate::fs::hashing;
use crate::paths::RelPath;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

/// One file listed in a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    pub path: RelPath,
    /// `sha256:<64 lowercase hex>`.
    pub sha256: String,
    pub size: u64,
}

/// A parsed and internally consistent `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub id: String,
    /// Normalised to UTC.
    pub created: OffsetDateTime,
    pub digest: String,
    /// In the order the manifest lists them.
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// `created` as RFC 3339 in UTC with a `Z` suffix; fractional seconds
    /// appear only when they are not zero.
    pub fn created_text(&self) -> String {
        format_created(self.created)
    }

    /// The manifest as `bundle seal` writes it: pretty JSON, keys in contract
    /// order, files sorted by path, final newline.
    pub fn to_json(&self) -> String {
        let mut files: Vec<&ManifestFile> = self.files.iter().collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let doc = ManifestOut {
            schema_version: SCHEMA_VERSION,
            id: &self.id,
            created: self.created_text(),
            digest: &self.digest,
            files: files
                .into_iter()
                .map(|f| FileOut {
                    path: f.path.as_str(),
                    sha256: &f.sha256,
                    size: f.size,
                })
                .collect(),
        };
        // Only strings, integers and sequences: serialising cannot fail.
        let mut text = serde_json::to_string_pretty(&doc).expect("manifest serialises to JSON");
        text.push('\n');
        text
    }
}

#[derive(serde::Serialize)]
struct ManifestOut<'a> {
    schema_version: u64,
    id: &'a str,
    created: String,
    digest: &'a str,
    files: Vec<FileOut<'a>>,
}

#[derive(serde::Serialize)]
struct FileOut<'a> {
    path: &'a str,
    sha256: &'a str,
    size: u64,
}

// ---------------------------------------------------------------------------
// Digest and timestamps

/// The bundle digest (docs/contract.md §3): `sha256:` + SHA-256 of one line per file,
/// sorted by path bytes, each `<sha256 as written> <size> <path>\n`.
pub fn compute_digest(files: &[ManifestFile]) -> String {
    let mut sorted: Vec<&ManifestFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
    let mut text = String::new();
    for f in sorted {
        text.push_str(&f.sha256);
        text.push(' ');
        text.push_str(&f.size.to_string());
        text.push(' ');
        text.push_str(f.path.as_str());
        text.push('\n');
    }
    hashing::hash_bytes(text.as_bytes()).sha256
}

/// Converts to UTC and makes sure the result can be written as RFC 3339
/// (years 0000 to 9999).
pub(super) fn normalise_created(t: OffsetDateTime) -> Result<OffsetDateTime, String> {
    let utc = t
        .checked_to_offset(UtcOffset::UTC)
        .filter(|u| u.format(&Rfc3339).is_ok())
        .ok_or_else(|| "the time in UTC falls outside the years 0000 to 9999".to_owned())?;
    Ok(utc)
}

fn format_created(t: OffsetDateTime) -> String {
    let utc = t.checked_to_offset(UtcOffset::UTC).unwrap_or(t);
    utc.format(&Rfc3339).unwrap_or_else(|_| utc.to_string())
}
