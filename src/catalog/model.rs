//! The catalog in memory: the compact output record, the catalog, what a
//! state file says ([`State`]), and the checks every record read must pass
//! ([`Shared::record`], with the messages an operator sees).
//!
//! Holds no text form (that is `form`) and does no I/O.

use super::form::{RecordText, SourceText};
use super::{TRANSFORMS, rfc3339};
use crate::paths::{IdKind, RelPath, check_id, is_sha256_digest};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use time::OffsetDateTime;

/// The compact identity of the bundle that produced an output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceIdentity {
    pub id: String,
    pub digest: String,
    #[serde(with = "rfc3339")]
    pub created: OffsetDateTime,
}

/// A `sha256:<64 lowercase hex>` digest, held as its 32 bytes (a record
/// of a large tree keeps one per file; the text form is three times the
/// size and a separate allocation). Written and compared as its text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

impl Sha256 {
    /// Reads `sha256:<64 lowercase hex>`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Sha256> {
        if !is_sha256_digest(text) {
            return None;
        }
        let hex = text.strip_prefix("sha256:")?.as_bytes();
        let mut bytes = [0u8; 32];
        for (b, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            let digit = |c: u8| match c {
                b'0'..=b'9' => c - b'0',
                _ => c - b'a' + 10,
            };
            *b = digit(pair[0]) << 4 | digit(pair[1]);
        }
        Some(Sha256(bytes))
    }

    /// Writes the text form into `out` (71 bytes), without allocating.
    pub(super) fn write_text<'b>(&self, out: &'b mut [u8; 71]) -> &'b str {
        // The two digits of each byte, looked up at once.
        const PAIRS: [[u8; 2]; 256] = {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let mut pairs = [[0; 2]; 256];
            let mut b = 0;
            while b < 256 {
                pairs[b] = [HEX[b >> 4], HEX[b & 15]];
                b += 1;
            }
            pairs
        };
        out[..7].copy_from_slice(b"sha256:");
        for (pair, b) in out[7..].chunks_exact_mut(2).zip(self.0) {
            pair.copy_from_slice(&PAIRS[usize::from(b)]);
        }
        // Only ASCII was written.
        std::str::from_utf8(out).unwrap_or_default()
    }
}

impl std::fmt::Display for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.write_text(&mut [0; 71]))
    }
}

impl std::fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.write_text(&mut [0; 71]))
    }
}

impl PartialEq<str> for Sha256 {
    fn eq(&self, other: &str) -> bool {
        self.write_text(&mut [0; 71]) == other
    }
}

impl PartialEq<String> for Sha256 {
    fn eq(&self, other: &String) -> bool {
        *self == *other.as_str()
    }
}

impl PartialEq<Sha256> for String {
    fn eq(&self, other: &Sha256) -> bool {
        *other == *self.as_str()
    }
}

impl Serialize for Sha256 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.write_text(&mut [0; 71]))
    }
}

impl<'de> Deserialize<'de> for Sha256 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Sha256, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Sha256::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not sha256:<64 lowercase hex>"))
        })
    }
}

/// Whether an output is a copy of a bundle file or rendered from one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    Source,
    Generated,
}

impl OutputKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Source => "source",
            OutputKind::Generated => "generated",
        }
    }
}

/// One managed file in a destination root.
///
/// Held compactly, since a large tree's catalog holds one per file and a
/// publication holds the old and the new catalog at once: the owner ids
/// and the source identity are shared between the records of one
/// publication (and between the records read from one catalog), the
/// digest is its 32 bytes, and the transform is one of the known names. It is
/// read and written exactly as the text form in the file (`RecordText`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutputRecord {
    pub path: RelPath,
    pub pipeline_id: Arc<str>,
    pub destination_id: Arc<str>,
    pub source: Arc<SourceIdentity>,
    pub kind: OutputKind,
    pub source_path: Option<RelPath>,
    /// One of [`TRANSFORMS`] when present: `markdown_to_html` for a page,
    /// `gzip` or `brotli` for a precompressed sibling.
    pub transform: Option<&'static str>,
    pub url: Option<String>,
    pub sha256: Sha256,
    pub size: u64,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// The owner ids and source identities already met while reading a
/// catalog, so that its records share them instead of each holding a copy.
/// An id or source is checked when it is first met; records that share it
/// are not checked again.
#[derive(Default)]
pub(super) struct Shared {
    ids: std::collections::HashSet<Arc<str>>,
    sources: std::collections::HashSet<Arc<SourceIdentity>>,
    /// The source of the record before (records of one bundle are
    /// usually neighbours), found without hashing.
    last_source: Option<Arc<SourceIdentity>>,
    /// The pipeline and destination ids of the record before, likewise.
    last_ids: [Option<Arc<str>>; 2],
}

impl Shared {
    fn id(&mut self, kind: IdKind, id: &str) -> Result<Arc<str>, String> {
        let last = &mut self.last_ids[usize::from(kind == IdKind::Destination)];
        if let Some(known) = last.as_ref().filter(|known| ***known == *id) {
            return Ok(known.clone());
        }
        let shared = match self.ids.get(id) {
            Some(known) => known.clone(),
            None => {
                check_id(kind, id)?;
                let id: Arc<str> = id.into();
                self.ids.insert(id.clone());
                id
            }
        };
        *last = Some(shared.clone());
        Ok(shared)
    }

    fn source(&mut self, source: SourceText) -> Result<Arc<SourceIdentity>, String> {
        if let Some(last) = &self.last_source
            && last.id == source.id
            && last.digest == source.digest
            && last.created == source.created
        {
            return Ok(last.clone());
        }
        let source = SourceIdentity {
            id: source.id.into_owned(),
            digest: source.digest.into_owned(),
            created: source.created,
        };
        let shared = match self.sources.get(&source) {
            Some(known) => known.clone(),
            None => {
                check_id(IdKind::Source, &source.id)?;
                if !is_sha256_digest(&source.digest) {
                    return Err(format!(
                        "source.digest {:?} is not sha256:<64 lowercase hex>",
                        source.digest
                    ));
                }
                let source = Arc::new(source);
                self.sources.insert(source.clone());
                source
            }
        };
        self.last_source = Some(shared.clone());
        Ok(shared)
    }

    /// Checks a record read from the file and makes it compact.
    pub(super) fn record(&mut self, r: RecordText) -> Result<OutputRecord, String> {
        let path = &r.path;
        if path.is_reserved() {
            return Err(format!(
                "output {path}: path uses a reserved .distributor name"
            ));
        }
        let in_output = |e: String| format!("output {path}: {e}");
        let pipeline_id = self
            .id(IdKind::Pipeline, &r.pipeline_id)
            .map_err(in_output)?;
        let destination_id = self
            .id(IdKind::Destination, &r.destination_id)
            .map_err(in_output)?;
        let source = self.source(r.source).map_err(in_output)?;
        let Some(sha256) = Sha256::parse(&r.sha256) else {
            return Err(format!(
                "output {path}: sha256 {:?} is not sha256:<64 lowercase hex>",
                r.sha256
            ));
        };
        let transform = match (r.kind, &r.source_path, r.transform.as_deref()) {
            (OutputKind::Source, None, None) => None,
            (OutputKind::Source, _, _) => {
                return Err(format!(
                    "output {path}: a source output may not have source_path or transform"
                ));
            }
            (OutputKind::Generated, Some(_), Some(t)) => match TRANSFORMS.iter().find(|k| **k == t)
            {
                Some(known) => Some(*known),
                None => return Err(format!("output {path}: unknown transform {t:?}")),
            },
            (OutputKind::Generated, _, _) => {
                return Err(format!(
                    "output {path}: a generated output needs both source_path and transform"
                ));
            }
        };
        if let Some(url) = &r.url
            && !is_http_url(url)
        {
            return Err(format!(
                "output {path}: url {url:?} is not an absolute http(s) URL"
            ));
        }
        Ok(OutputRecord {
            pipeline_id,
            destination_id,
            source,
            path: r.path.into_owned(),
            kind: r.kind,
            source_path: r.source_path.map(Cow::into_owned),
            transform,
            url: r.url.map(Cow::into_owned),
            sha256,
            size: r.size,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

impl OutputRecord {
    /// True when this record belongs to the given owner.
    pub fn owned_by(&self, pipeline_id: &str, destination_id: &str) -> bool {
        *self.pipeline_id == *pipeline_id && *self.destination_id == *destination_id
    }
}

fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
        && if url.is_ascii() {
            // The same test on bytes: ASCII whitespace and controls are
            // the bytes up to a space and DEL (a vertical tab is a
            // control). Without an early exit, so that it is vectorised.
            !url.bytes()
                .fold(false, |bad, c| bad | (c <= b' ') | (c == 0x7f))
        } else {
            !url.chars().any(|c| c.is_whitespace() || c.is_control())
        }
}

/// A valid schema-4 catalog. `outputs` is kept sorted by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    pub distributor_version: Option<String>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub outputs: Vec<OutputRecord>,
}

impl Catalog {
    /// An empty catalog created at `now`.
    pub fn new(now: OffsetDateTime) -> Catalog {
        Catalog {
            distributor_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            created_at: now,
            updated_at: now,
            outputs: Vec::new(),
        }
    }

    /// The record at `path`, if any (binary search: outputs are sorted).
    pub fn get(&self, path: &str) -> Option<&OutputRecord> {
        self.outputs
            .binary_search_by(|r| r.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.outputs[i])
    }

    /// Index of the first record whose path is `key` or after it.
    pub fn first_index_from(&self, key: &str) -> usize {
        self.outputs.partition_point(|r| r.path.as_str() < key)
    }

    /// Sorts outputs by path ([`sort_by_path`]); a catalog read from its
    /// file is already sorted.
    pub fn sort(&mut self) {
        sort_by_path(&mut self.outputs);
    }
}

/// What a root's state file says.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// No `.distributor.json`.
    Absent,
    /// A valid schema-4 catalog.
    Catalog(Catalog),
    /// A JSON object with `schema_version` 1, 2 or 3 (superseded, never written).
    Legacy { schema_version: u64 },
    /// A `schema_version` above 4: written by a newer tool.
    Future { schema_version: u64 },
    /// Anything else; `reason` says what is wrong.
    Invalid { reason: String },
}

/// Sorts records by path (byte order of the UTF-8 text), in place and
/// only when they are not sorted already: paths are unique, so an
/// unstable sort gives the one order there is without the scratch buffer
/// (half the records) a stable sort takes.
pub fn sort_by_path(records: &mut [OutputRecord]) {
    let by_path = |a: &OutputRecord, b: &OutputRecord| a.path.as_str().cmp(b.path.as_str());
    if !records.is_sorted_by(|a, b| by_path(a, b).is_le()) {
        records.sort_unstable_by(by_path);
    }
}
