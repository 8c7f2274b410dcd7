//! The ownership catalog kept in every destination root (`.distributor.json`,
//! schema version 4): the model, strict reading, and deterministic writing.
//!
//! Reading classifies any state file as absent, a valid catalog, legacy
//! (schema 1–3), future (> 4) or invalid; it never guesses. Nothing here
//! touches the file system: callers hand in bytes and get bytes back.

use crate::paths::{IdKind, RelPath, check_id, is_sha256_digest};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

mod layout;

/// Name of the catalog file at the top of every destination root.
pub const STATE_FILE: &str = ".distributor.json";
/// The schema version this tool writes.
pub const SCHEMA_VERSION: u64 = 4;
/// The only transform there is.
pub const MARKDOWN_TO_HTML: &str = "markdown_to_html";

/// Formats an instant as RFC 3339 in UTC with a `Z` suffix; fractional
/// seconds appear only when non-zero.
pub fn format_time(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

/// Parses an RFC 3339 timestamp and normalises it to UTC.
pub fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(text, &Rfc3339)
        .map(|t| t.to_offset(time::UtcOffset::UTC))
        .map_err(|e| format!("{text:?} is not an RFC 3339 timestamp ({e})"))
}

/// Serde adapter for timestamps in the catalog and reports.
pub mod rfc3339 {
    use super::{OffsetDateTime, format_time, parse_time};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_time(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        parse_time(&text).map_err(serde::de::Error::custom)
    }
}

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
    fn write_text<'b>(&self, out: &'b mut [u8; 71]) -> &'b str {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out[..7].copy_from_slice(b"sha256:");
        for (i, b) in self.0.iter().enumerate() {
            out[7 + 2 * i] = HEX[usize::from(b >> 4)];
            out[8 + 2 * i] = HEX[usize::from(b & 15)];
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
/// digest is its 32 bytes, and the transform is the one known name. It is
/// read and written exactly as the text form in the file (`RecordText`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutputRecord {
    pub path: RelPath,
    pub pipeline_id: Arc<str>,
    pub destination_id: Arc<str>,
    pub source: Arc<SourceIdentity>,
    pub kind: OutputKind,
    pub source_path: Option<RelPath>,
    /// Always [`MARKDOWN_TO_HTML`] when present.
    pub transform: Option<&'static str>,
    pub url: Option<String>,
    pub sha256: Sha256,
    pub size: u64,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// An output record as the file holds it: every field its own text.
/// Records are read through this form (strictly, every check with its
/// message) and turned into the compact [`OutputRecord`] one at a time.
/// Read from memory, its ids and digests borrow the file's text (one
/// record is checked and made compact before the next is read, so no
/// allocation is made for text the compact record does not keep).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordText<'a> {
    path: RelPath,
    #[serde(borrow)]
    pipeline_id: Cow<'a, str>,
    #[serde(borrow)]
    destination_id: Cow<'a, str>,
    #[serde(borrow)]
    source: SourceText<'a>,
    kind: OutputKind,
    #[serde(default)]
    source_path: Option<RelPath>,
    #[serde(default)]
    transform: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(borrow)]
    sha256: Cow<'a, str>,
    size: u64,
    #[serde(with = "rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "rfc3339")]
    updated_at: OffsetDateTime,
}

/// [`SourceIdentity`] as the file holds it, borrowing like [`RecordText`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceText<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    digest: Cow<'a, str>,
    #[serde(with = "rfc3339")]
    created: OffsetDateTime,
}

/// The text form of a record, borrowed, for writing: the same fields in
/// the same order as [`RecordText`].
#[derive(Serialize)]
struct RecordOut<'a> {
    path: &'a RelPath,
    pipeline_id: &'a str,
    destination_id: &'a str,
    source: &'a SourceIdentity,
    kind: OutputKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_path: Option<&'a RelPath>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transform: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
    sha256: Sha256,
    size: u64,
    #[serde(with = "rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "rfc3339")]
    updated_at: OffsetDateTime,
}

impl Serialize for OutputRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RecordOut {
            path: &self.path,
            pipeline_id: &self.pipeline_id,
            destination_id: &self.destination_id,
            source: &self.source,
            kind: self.kind,
            source_path: self.source_path.as_ref(),
            transform: self.transform,
            url: self.url.as_deref(),
            sha256: self.sha256,
            size: self.size,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for OutputRecord {
    /// Reads and checks one record on its own (no sharing with others).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OutputRecord, D::Error> {
        let text = RecordText::deserialize(d)?;
        Shared::default()
            .record(text)
            .map_err(serde::de::Error::custom)
    }
}

/// The owner ids and source identities already met while reading a
/// catalog, so that its records share them instead of each holding a copy.
/// An id or source is checked when it is first met; records that share it
/// are not checked again.
#[derive(Default)]
struct Shared {
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
    fn record(&mut self, r: RecordText) -> Result<OutputRecord, String> {
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
            (OutputKind::Generated, Some(_), Some(MARKDOWN_TO_HTML)) => Some(MARKDOWN_TO_HTML),
            (OutputKind::Generated, Some(_), Some(t)) => {
                return Err(format!("output {path}: unknown transform {t:?}"));
            }
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
            path: r.path,
            kind: r.kind,
            source_path: r.source_path,
            transform,
            url: r.url,
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
            // The same test on bytes (a vertical tab is a control).
            !url.bytes()
                .any(|c| c.is_ascii_whitespace() || c.is_ascii_control())
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

    /// Serialises as pretty JSON with a final newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_json(&mut out);
        out
    }

    /// [`Catalog::write_json`], taking the text of each record that
    /// `before` holds (a record written before, unchanged since) instead of
    /// formatting it again, which is most of the work of writing a large
    /// catalog after a small change. Returns the text of every record, for
    /// the next write. The bytes are exactly those of `write_json`.
    pub fn write_json_reusing(
        &self,
        w: &mut dyn std::io::Write,
        before: Option<&RecordTexts>,
    ) -> std::io::Result<RecordTexts> {
        use std::io::Write;
        // The document up to the records: everything `write_json` writes
        // for a catalog without records, but its closing `[]\n}`.
        let mut head = Vec::new();
        Catalog {
            outputs: Vec::new(),
            ..self.header()
        }
        .write_json(&mut head)?;
        let cut = head
            .len()
            .checked_sub(b"[]\n}\n".len())
            .filter(|&at| &head[at..] == b"[]\n}\n")
            .ok_or_else(|| std::io::Error::other("unexpected catalog layout"))?;
        let mut w = std::io::BufWriter::with_capacity(64 * 1024, w);
        w.write_all(&head[..cut])?;
        if self.outputs.is_empty() {
            w.write_all(b"[]\n}\n")?;
            return w.flush().map(|()| RecordTexts::default());
        }
        let mut texts = Reuse::plan(&self.outputs, before);
        w.write_all(b"[")?;
        // Records that follow each other in a buffer with the separator
        // between them (the file as read, where most records did not
        // change) are written as one slice.
        let mut run: Option<Span> = None;
        for (i, r) in self.outputs.iter().enumerate() {
            let separator: &[u8] = if i == 0 { b"\n    " } else { SEPARATOR };
            let span = texts.span(i, r);
            if let Some(joined) = run.and_then(|run| texts.join(run, separator, span)) {
                run = Some(joined);
                continue;
            }
            if let Some(done) = run {
                w.write_all(texts.bytes(done))?;
            }
            w.write_all(separator)?;
            run = Some(span);
        }
        if let Some(done) = run {
            w.write_all(texts.bytes(done))?;
        }
        w.write_all(b"\n  ]\n}\n")?;
        w.flush().map(|()| texts.finish())
    }

    /// This catalog without its records.
    fn header(&self) -> Catalog {
        Catalog {
            distributor_version: self.distributor_version.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            outputs: Vec::new(),
        }
    }

    /// Streams the pretty JSON (final newline included) into `w`, without
    /// building the document in memory first.
    pub fn write_json(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        #[derive(Serialize)]
        struct Out<'a> {
            schema_version: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            distributor_version: Option<&'a str>,
            #[serde(with = "rfc3339")]
            created_at: OffsetDateTime,
            #[serde(with = "rfc3339")]
            updated_at: OffsetDateTime,
            state: RawMode,
            outputs: &'a [OutputRecord],
        }
        let out = Out {
            schema_version: SCHEMA_VERSION,
            distributor_version: self.distributor_version.as_deref(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            state: RawMode {
                mode: "catalog".to_owned(),
            },
            outputs: &self.outputs,
        };
        let mut buffered = std::io::BufWriter::with_capacity(64 * 1024, w);
        serde_json::to_writer_pretty(&mut buffered, &out).map_err(std::io::Error::from)?;
        std::io::Write::write_all(&mut buffered, b"\n")?;
        std::io::Write::flush(&mut buffered)
    }
}

/// Appends the text of one record exactly as [`Catalog::write_json`] lays
/// it out in the document (serde_json's pretty form at the third level:
/// lines after the first indented by six spaces, the closing brace by
/// four), written field by field: without a formatter, and with the
/// timestamps formatted in place rather than each into a new string. A
/// test checks it against the serde form.
fn push_record_text(r: &OutputRecord, out: &mut Vec<u8>) {
    fn string(out: &mut Vec<u8>, text: &str) {
        // Writing into a Vec cannot fail; escaping is serde_json's own.
        let _ = serde_json::to_writer(&mut *out, text);
    }
    fn time(out: &mut Vec<u8>, t: OffsetDateTime) {
        out.push(b'"');
        let start = out.len();
        if t.to_offset(time::UtcOffset::UTC)
            .format_into(&mut *out, &Rfc3339)
            .is_err()
        {
            // As format_time: the seconds when RFC 3339 cannot say it.
            out.truncate(start);
            out.extend_from_slice(t.unix_timestamp().to_string().as_bytes());
        }
        out.push(b'"');
    }
    out.extend_from_slice(b"{\n      \"path\": ");
    string(out, r.path.as_str());
    out.extend_from_slice(b",\n      \"pipeline_id\": ");
    string(out, &r.pipeline_id);
    out.extend_from_slice(b",\n      \"destination_id\": ");
    string(out, &r.destination_id);
    out.extend_from_slice(b",\n      \"source\": {\n        \"id\": ");
    string(out, &r.source.id);
    out.extend_from_slice(b",\n        \"digest\": ");
    string(out, &r.source.digest);
    out.extend_from_slice(b",\n        \"created\": ");
    time(out, r.source.created);
    out.extend_from_slice(b"\n      },\n      \"kind\": \"");
    out.extend_from_slice(r.kind.as_str().as_bytes());
    out.push(b'"');
    if let Some(source_path) = &r.source_path {
        out.extend_from_slice(b",\n      \"source_path\": ");
        string(out, source_path.as_str());
    }
    if let Some(transform) = r.transform {
        out.extend_from_slice(b",\n      \"transform\": ");
        string(out, transform);
    }
    if let Some(url) = &r.url {
        out.extend_from_slice(b",\n      \"url\": ");
        string(out, url);
    }
    out.extend_from_slice(b",\n      \"sha256\": \"");
    out.extend_from_slice(r.sha256.write_text(&mut [0; 71]).as_bytes());
    out.extend_from_slice(b"\",\n      \"size\": ");
    out.extend_from_slice(r.size.to_string().as_bytes());
    out.extend_from_slice(b",\n      \"created_at\": ");
    time(out, r.created_at);
    out.extend_from_slice(b",\n      \"updated_at\": ");
    time(out, r.updated_at);
    out.extend_from_slice(b"\n    }");
}

/// The text of each record of a catalog as it was last read or written,
/// with a fingerprint of the record, in the catalog's order (by path): a
/// record equal to one read or written before gets the same text. The
/// next write walks its records and these texts side by side, matching
/// them by path, and takes a text only when the fingerprints are equal.
/// Fingerprints are keyed anew in each process, so nothing a producer
/// controls can make two records collide on purpose; by chance, once in
/// 2^64.
///
/// The texts live in shared buffers: the catalog file as read (its records
/// are taken as they are when the file is laid out exactly as this tool
/// writes it, see `layout`), and the records each write formatted. A write
/// keeps a buffer that at least half of its bytes are still records of,
/// and copies the few records left in any other, so the texts never take
/// more than twice the catalog's records.
#[derive(Default)]
pub struct RecordTexts {
    buffers: Vec<Buffer>,
    /// Each record's fingerprint and text, in the catalog's order.
    texts: Vec<(u64, Span)>,
}

/// Bytes that record texts are in: a catalog file as read (a `Vec`, or an
/// object store's body, shared with whoever holds it), or the records a
/// write formatted.
pub type Buffer = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where one record's text is: `len` bytes from `start` of a buffer.
#[derive(Clone, Copy, Debug)]
struct Span {
    buffer: u32,
    len: u32,
    start: usize,
}

impl std::fmt::Debug for RecordTexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RecordTexts({} records in {} buffers)",
            self.texts.len(),
            self.buffers.len()
        )
    }
}

/// Fingerprints records for [`RecordTexts`]: a keyed hash (SipHash) of
/// every field a record's text depends on, laid out in one buffer first so
/// that it is hashed in one call rather than in dozens of small ones.
///
/// The owner ids and the source identity (about half of a record's text)
/// are hashed once for a run of records that share them (the records of
/// one bundle are neighbours, and share the same `Arc`s): their own
/// fingerprint stands for them in the record's. The `Arc`s are held, so
/// the same address is the same, unchanged, value.
#[derive(Default)]
pub(crate) struct Fingerprints {
    scratch: Vec<u8>,
    owner: Option<Owner>,
}

/// The owner ids and source of the record fingerprinted last, with their
/// fingerprint.
struct Owner {
    pipeline_id: Arc<str>,
    destination_id: Arc<str>,
    source: Arc<SourceIdentity>,
    key: u64,
}

impl Fingerprints {
    /// The fingerprint of `r`.
    pub(crate) fn key(&mut self, r: &OutputRecord) -> u64 {
        let owner = match &self.owner {
            Some(o)
                if Arc::ptr_eq(&o.pipeline_id, &r.pipeline_id)
                    && Arc::ptr_eq(&o.destination_id, &r.destination_id)
                    && Arc::ptr_eq(&o.source, &r.source) =>
            {
                o.key
            }
            _ => {
                let scratch = &mut self.scratch;
                scratch.clear();
                lay_text(scratch, Some(&r.pipeline_id));
                lay_text(scratch, Some(&r.destination_id));
                lay_text(scratch, Some(&r.source.id));
                lay_text(scratch, Some(&r.source.digest));
                lay_instant(scratch, r.source.created);
                let key = hash(scratch);
                self.owner = Some(Owner {
                    pipeline_id: r.pipeline_id.clone(),
                    destination_id: r.destination_id.clone(),
                    source: r.source.clone(),
                    key,
                });
                key
            }
        };
        let scratch = &mut self.scratch;
        scratch.clear();
        scratch.extend_from_slice(&owner.to_le_bytes());
        lay_text(scratch, Some(r.path.as_str()));
        lay_text(scratch, Some(r.kind.as_str()));
        lay_text(scratch, r.source_path.as_ref().map(RelPath::as_str));
        lay_text(scratch, r.transform);
        lay_text(scratch, r.url.as_deref());
        scratch.extend_from_slice(&r.sha256.0);
        scratch.extend_from_slice(&r.size.to_le_bytes());
        lay_instant(scratch, r.created_at);
        lay_instant(scratch, r.updated_at);
        hash(scratch)
    }
}

/// Lays out a text with its length first, an absent one as a length no
/// text has: no two sequences of texts lay out alike.
fn lay_text(scratch: &mut Vec<u8>, t: Option<&str>) {
    match t {
        Some(t) => {
            scratch.extend_from_slice(&(t.len() as u64).to_le_bytes());
            scratch.extend_from_slice(t.as_bytes());
        }
        None => scratch.extend_from_slice(&u64::MAX.to_le_bytes()),
    }
}

/// Lays out an instant as the text shows it: in UTC, whatever its offset.
fn lay_instant(scratch: &mut Vec<u8>, t: OffsetDateTime) {
    scratch.extend_from_slice(&t.unix_timestamp_nanos().to_le_bytes());
}

/// The keyed hash of `bytes`. One key for the process: a fingerprint is
/// compared with ones made by any other catalog of the process, so it is
/// process-wide on purpose (docs/architecture.md, "What a process keeps").
fn hash(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static KEYS: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEYS.get_or_init(std::hash::RandomState::new)
        .hash_one(bytes)
}

impl RecordTexts {
    /// The texts of `records`, each `text[span]` of the catalog `text`
    /// as read.
    fn read(text: Buffer, records: &[(u64, std::ops::Range<usize>)]) -> RecordTexts {
        let texts = records
            .iter()
            .filter_map(|(key, range)| {
                let len = u32::try_from(range.len()).ok()?;
                Some((
                    *key,
                    Span {
                        buffer: 0,
                        len,
                        start: range.start,
                    },
                ))
            })
            .collect();
        RecordTexts {
            buffers: vec![text],
            texts,
        }
    }

    /// The text of `r` (whose fingerprint is `key`), if known: the text at
    /// or after `*at` with `r`'s path, if its fingerprint is `key`. Texts
    /// of paths before `r`'s are passed (records gone since), so a walk
    /// over a catalog's records in order with one `at` reads each text
    /// once.
    fn find(&self, at: &mut usize, r: &OutputRecord, key: u64) -> Option<Span> {
        // Most records did not change: the text at `at` is the record's
        // own. The fingerprint covers the path, so an equal one is taken
        // without reading the text (its bytes are read once, when written).
        if let Some(&(k, span)) = self.texts.get(*at)
            && k == key
        {
            *at += 1;
            return Some(span);
        }
        while let Some(&(k, span)) = self.texts.get(*at) {
            match text_path_cmp(self.bytes(span), r.path.as_str()) {
                Some(std::cmp::Ordering::Less) => *at += 1,
                Some(std::cmp::Ordering::Equal) => {
                    *at += 1;
                    return (k == key).then_some(span);
                }
                Some(std::cmp::Ordering::Greater) => return None,
                // Not a record's text as written: never taken.
                None => *at += 1,
            }
        }
        None
    }

    fn bytes(&self, span: Span) -> &[u8] {
        &(*self.buffers[span.buffer as usize]).as_ref()[span.start..span.start + span.len as usize]
    }

    /// How many records have a text (for tests and benchmarks).
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether no record has a text.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The bytes of the buffers the texts are in.
    pub fn held_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .map(|b| (**b).as_ref().len() as u64)
            .sum()
    }
}

/// How the path a record's text (as [`push_record_text`] lays it out)
/// starts with compares to `path`; `None` when `text` is not such a text.
/// Compared as the text has it when the string holds no escape (its
/// bytes up to the closing quote are the path), decoded otherwise.
fn text_path_cmp(text: &[u8], path: &str) -> Option<std::cmp::Ordering> {
    let quoted = text.strip_prefix(b"{\n      \"path\": ")?;
    let body = quoted.strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', body)?;
    if body[end] == b'"' {
        return Some(body[..end].cmp(path.as_bytes()));
    }
    let decoded: String = serde_json::Deserializer::from_slice(quoted)
        .into_iter::<String>()
        .next()?
        .ok()?;
    Some(decoded.as_str().cmp(path))
}

/// What comes between two records in the document; also put before each
/// text in a buffer of texts formatted or copied by a write, so that texts
/// that follow each other there are written as one slice, as they are from
/// the file as read.
const SEPARATOR: &[u8] = b",\n    ";

/// One write's use of the texts known before it: which record takes its
/// text from where, and the texts it leaves for the next write.
struct Reuse<'a> {
    before: Option<&'a RecordTexts>,
    /// Per record to write: its fingerprint and its text known before.
    found: Vec<(u64, Option<Span>)>,
    /// Index, in the new texts, of each buffer kept from before.
    kept: Vec<Option<u32>>,
    next: RecordTexts,
    /// Records formatted now, and texts copied from buffers not kept.
    fresh: Vec<u8>,
    /// How many records were formatted now.
    formatted: usize,
}

impl<'a> Reuse<'a> {
    fn plan(records: &[OutputRecord], before: Option<&'a RecordTexts>) -> Reuse<'a> {
        let mut at = 0;
        let mut fingerprints = Fingerprints::default();
        let found: Vec<(u64, Option<Span>)> = records
            .iter()
            .map(|r| {
                let key = fingerprints.key(r);
                (key, before.and_then(|b| b.find(&mut at, r, key)))
            })
            .collect();
        let mut next = RecordTexts {
            buffers: Vec::new(),
            texts: Vec::with_capacity(records.len()),
        };
        let mut kept = Vec::new();
        if let Some(before) = before {
            let mut live = vec![0usize; before.buffers.len()];
            for span in found.iter().filter_map(|(_, s)| *s) {
                live[span.buffer as usize] += span.len as usize;
            }
            for (buffer, live) in before.buffers.iter().zip(live) {
                let size = (**buffer).as_ref().len();
                kept.push((live > 0 && live * 2 >= size).then(|| {
                    next.buffers.push(buffer.clone());
                    (next.buffers.len() - 1) as u32
                }));
            }
        }
        Reuse {
            before,
            found,
            kept,
            next,
            fresh: Vec::new(),
            formatted: 0,
        }
    }

    /// Where the text of record `i` (`r`) is: as known before, or
    /// formatted now.
    fn span(&mut self, i: usize, r: &OutputRecord) -> Span {
        let (key, span) = self.found[i];
        let fresh = self.fresh_buffer();
        let span = match (span, self.before) {
            (Some(span), Some(before)) => match self.kept[span.buffer as usize] {
                Some(buffer) => Span { buffer, ..span },
                None => {
                    self.fresh.extend_from_slice(SEPARATOR);
                    let start = self.fresh.len();
                    self.fresh.extend_from_slice(before.bytes(span));
                    Span {
                        buffer: fresh,
                        start,
                        ..span
                    }
                }
            },
            _ => {
                self.formatted += 1;
                self.fresh.extend_from_slice(SEPARATOR);
                let start = self.fresh.len();
                push_record_text(r, &mut self.fresh);
                Span {
                    buffer: fresh,
                    start,
                    len: u32::try_from(self.fresh.len() - start).unwrap_or(u32::MAX),
                }
            }
        };
        self.next.texts.push((key, span));
        span
    }

    /// The index the buffer of records formatted now will have.
    fn fresh_buffer(&self) -> u32 {
        self.next.buffers.len() as u32
    }

    /// The bytes of `span`, in a kept buffer or the fresh one.
    fn bytes(&self, span: Span) -> &[u8] {
        if span.buffer == self.fresh_buffer() {
            &self.fresh[span.start..span.start + span.len as usize]
        } else {
            self.next.bytes(span)
        }
    }

    /// `run` and `span` as one span, when `span` follows `run` in its
    /// buffer with `separator` between them. Every text in a buffer is
    /// preceded by [`SEPARATOR`] (a file as read is checked to be laid out
    /// so, and a write puts it before each text it adds), but the first
    /// record of a file, which no other text ends just before; so a text
    /// that starts a separator's length after another's end is its
    /// neighbour, and the bytes between are not read.
    fn join(&self, run: Span, separator: &[u8], span: Span) -> Option<Span> {
        let end = run.start + run.len as usize;
        let follows = run.buffer == span.buffer && span.start == end + separator.len();
        if !follows {
            return None;
        }
        debug_assert_eq!(
            self.bytes(Span {
                start: end,
                len: separator.len() as u32,
                ..run
            }),
            separator
        );
        let len = u32::try_from(span.start + span.len as usize - run.start).ok()?;
        Some(Span { len, ..run })
    }

    fn finish(mut self) -> RecordTexts {
        log::debug!(
            "catalog written: {} of {} records formatted, the others' texts copied",
            self.formatted,
            self.next.texts.len()
        );
        if !self.fresh.is_empty() {
            self.fresh.shrink_to_fit();
            self.next.buffers.push(Arc::new(self.fresh));
        }
        self.next
    }
}

/// A change of at most one record in this many is small beside its
/// catalog: merged where the records are (see `plan`), and its catalog
/// written copying the texts of the records it leaves alone
/// ([`RecordTexts`]) however many files it has.
pub const SMALL_CHANGE: usize = 8;

/// Whether a change of `changed` records is small beside a catalog of
/// `records` ([`SMALL_CHANGE`]).
pub fn small_beside(changed: usize, records: usize) -> bool {
    changed.saturating_mul(SMALL_CHANGE) <= records
}

/// A catalog plus changes not merged into it yet: what a batch plans
/// against. Recording a bundle's changes costs O(changes · log), not a pass
/// over every record, and the merge happens once at the end.
#[derive(Debug)]
pub struct Overlay {
    base: Catalog,
    /// Upserted records (`Some`) and removed paths (`None`), by path.
    changes: BTreeMap<String, Option<OutputRecord>>,
}

impl Overlay {
    pub fn new(base: Catalog) -> Overlay {
        Overlay {
            base,
            changes: BTreeMap::new(),
        }
    }

    /// The catalog before any change was recorded.
    pub fn base(&self) -> &Catalog {
        &self.base
    }

    /// The record at `path` with the changes applied.
    pub fn get(&self, path: &str) -> Option<&OutputRecord> {
        match self.changes.get(path) {
            Some(change) => change.as_ref(),
            None => self.base.get(path),
        }
    }

    /// The first record (changes applied) whose path is `key` or after it.
    pub fn first_from(&self, key: &str) -> Option<&OutputRecord> {
        let from_base = self.base.outputs[self.base.first_index_from(key)..]
            .iter()
            .find(|r| !matches!(self.changes.get(r.path.as_str()), Some(None)));
        let from_changes = self
            .changes
            .range::<str, _>((std::ops::Bound::Included(key), std::ops::Bound::Unbounded))
            .find_map(|(_, change)| change.as_ref());
        match (from_base, from_changes) {
            (Some(b), Some(c)) if c.path.as_str() <= b.path.as_str() => Some(c),
            (Some(b), _) => Some(b),
            (None, c) => c,
        }
    }

    /// Every record (changes applied), sorted by path.
    pub fn iter(&self) -> impl Iterator<Item = &OutputRecord> {
        let mut base = self.base.outputs.iter().peekable();
        let mut changes = self.changes.iter().peekable();
        std::iter::from_fn(move || {
            loop {
                let take_change = match (base.peek(), changes.peek()) {
                    (None, None) => return None,
                    (Some(_), None) => false,
                    (None, Some(_)) => true,
                    (Some(b), Some((path, _))) => path.as_str() <= b.path.as_str(),
                };
                if !take_change {
                    return base.next();
                }
                let (path, change) = changes.next()?;
                if base
                    .peek()
                    .is_some_and(|b| b.path.as_str() == path.as_str())
                {
                    base.next();
                }
                if let Some(record) = change {
                    return Some(record);
                }
            }
        })
    }

    /// Records upserts (each replacing any record at its path) and removals.
    pub fn record(&mut self, upserts: &[OutputRecord], removes: &[String]) {
        for path in removes {
            self.changes.insert(path.clone(), None);
        }
        for r in upserts {
            self.changes
                .insert(r.path.as_str().to_owned(), Some(r.clone()));
        }
    }

    /// Merges the changes in one pass; `now` becomes `updated_at`.
    pub fn into_catalog(self, now: OffsetDateTime) -> Catalog {
        self.merge(now)
    }

    fn merge(self, now: OffsetDateTime) -> Catalog {
        let Overlay { mut base, changes } = self;
        // In place: replaced records swapped, removed ones dropped in one
        // pass, new ones merged in (merge_by_path). A large tree's catalog
        // is tens of MiB and never held twice; a small change into it
        // moves few records.
        let records = &mut base.outputs;
        let mut added = Vec::new();
        let mut gone = Vec::new();
        for (path, change) in changes {
            let at = records.binary_search_by(|r| r.path.as_str().cmp(path.as_str()));
            match (at, change) {
                (Ok(i), Some(r)) => records[i] = r,
                (Ok(i), None) => gone.push(i),
                (Err(_), Some(r)) => added.push(r),
                (Err(_), None) => {}
            }
        }
        if !gone.is_empty() {
            let mut gone = gone.into_iter().peekable();
            let mut i = 0;
            records.retain(|_| {
                let keep = gone.next_if_eq(&i).is_none();
                i += 1;
                keep
            });
        }
        merge_by_path(records, added);
        base.updated_at = now;
        base.distributor_version = Some(env!("CARGO_PKG_VERSION").to_owned());
        base
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

/// Merges `added` into `records`, both sorted by path (no path in both),
/// in place: from the last added record back, the old records after its
/// place move right by the number of added records still to place, each
/// old record at most once (none before the first added one's place), and
/// no second array of records is made (a small change into a large
/// catalog moves a few records, or none; a large one never holds the
/// records twice).
pub fn merge_by_path(records: &mut Vec<OutputRecord>, added: Vec<OutputRecord>) {
    debug_assert!(added.is_sorted_by(|a, b| a.path.as_str() < b.path.as_str()));
    let Some(first) = added.first() else {
        return;
    };
    // All after the last record (or none there): appended, nothing moves.
    if records
        .last()
        .is_none_or(|last| last.path.as_str() < first.path.as_str())
    {
        records.extend(added);
        return;
    }
    let filler = first.clone();
    let n = records.len();
    records.reserve_exact(added.len());
    // Places for the added records, at the end; `records[i..i + holes]`
    // are the places still free, `records[..i]` the old records not moved.
    records.resize(n + added.len(), filler);
    let mut i = n;
    for (holes, a) in added.into_iter().enumerate().map(|(j, a)| (j + 1, a)).rev() {
        let at = records[..i].partition_point(|r| r.path.as_str() < a.path.as_str());
        for old in (at..i).rev() {
            records.swap(old, old + holes);
        }
        records[at + holes - 1] = a;
        i = at;
    }
}

/// The `len` bytes of `file`, read in two halves at once; `None` when the
/// file no longer has `len` bytes.
fn read_in_halves(file: &std::fs::File, len: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let size = usize::try_from(len).map_err(std::io::Error::other)?;
    // Zeroed by the system as it is first written (a fresh mapping).
    let mut bytes = vec![0u8; size];
    let (first, second) = bytes.split_at_mut(size / 2);
    let at = first.len() as u64;
    let (other, read) = crate::runtime::workers::beside(
        || file.read_exact_at(second, at),
        || file.read_exact_at(first, 0),
    );
    match read.and(other) {
        Ok(()) if file.read_at(&mut [0], len)? == 0 => Ok(Some(bytes)),
        Ok(()) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// A v4 catalog led by `schema_version` (as written), parsed in one pass
/// and checked; an error when the text is not that (the caller then
/// classifies it whole with [`State::parse`]).
fn read_v4<'de, R: serde_json::de::Read<'de>>(
    de: &mut serde_json::Deserializer<R>,
) -> serde_json::Result<State> {
    let Streamed(raw) = Streamed::deserialize(&mut *de)?;
    de.end()?;
    Ok(match finish_v4(raw) {
        Ok(c) => State::Catalog(c),
        Err(reason) => State::Invalid { reason },
    })
}

/// Catalogs up to this size (about 1.7 million records) are read into
/// memory whole and parsed there; bigger ones are parsed from the file as
/// a stream. Parsing from memory is about twice as fast, and the text,
/// dropped once parsed, costs once the file's size while the records are
/// built (the catalog's memory bound is three times the file).
const READ_WHOLE_UP_TO: u64 = 1 << 30;

impl State {
    /// Reads and classifies a state file. A catalog as this tool writes it
    /// is read in one pass (from a stream, its text never held whole, when
    /// it is over [`READ_WHOLE_UP_TO`]); anything else (legacy, future or
    /// invalid state, or a catalog edited into another key order) is
    /// classified by [`State::parse`], with the same result.
    pub fn read<F: std::io::Read + std::io::Seek>(file: &mut F) -> std::io::Result<State> {
        State::read_whole_up_to(file, READ_WHOLE_UP_TO, false).map(|(state, _)| state)
    }

    /// [`State::read`] of an open file, with the text of each record when
    /// `texts` and the file is laid out exactly as this tool writes it
    /// (almost always), so that writing the next catalog copies the records
    /// that did not change ([`Catalog::write_json_reusing`]); the texts
    /// keep the file's bytes. A large file is read in two
    /// halves at once, on two threads (copying it out of the page cache is
    /// a good part of reading it); one that changed size meanwhile is read
    /// again from the start, as one.
    pub fn read_file(
        file: &std::fs::File,
        texts: bool,
    ) -> std::io::Result<(State, Option<RecordTexts>)> {
        let len = file.metadata()?.len();
        if (layout::PARTS_FROM as u64..=READ_WHOLE_UP_TO).contains(&len)
            && let Some(bytes) = read_in_halves(file, len)?
        {
            return Ok(State::parse_whole(bytes, texts));
        }
        State::read_whole_up_to(&mut &*file, READ_WHOLE_UP_TO, texts)
    }

    /// The state in `bytes`, a whole file, with its texts when `texts`.
    fn parse_whole(bytes: Vec<u8>, texts: bool) -> (State, Option<RecordTexts>) {
        match texts {
            true => State::parse_with_texts(Arc::new(bytes)),
            false => (State::parse(&bytes), None),
        }
    }

    /// [`State::read_file`] of any reader (with the texts only when `texts`:
    /// their fingerprints cost a pass over every record), reading files up to
    /// `whole_up_to` bytes whole.
    fn read_whole_up_to<F: std::io::Read + std::io::Seek>(
        file: &mut F,
        whole_up_to: u64,
        texts: bool,
    ) -> std::io::Result<(State, Option<RecordTexts>)> {
        // A catalog is read whole: parsing from memory is several times
        // faster than from a reader, and ids and digests are then borrowed
        // from the text instead of copied. Only a huge one is streamed.
        let len = std::io::Seek::seek(file, std::io::SeekFrom::End(0))?;
        std::io::Seek::seek(file, std::io::SeekFrom::Start(0))?;
        if len <= whole_up_to {
            let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            std::io::Read::read_to_end(file, &mut bytes)?;
            return Ok(State::parse_whole(bytes, texts));
        }
        let reader = std::io::BufReader::with_capacity(64 * 1024, &mut *file);
        match read_v4(&mut serde_json::Deserializer::from_reader(reader)) {
            Ok(state) => return Ok((state, None)),
            Err(e) if e.is_io() => return Err(e.into()),
            Err(_) => {}
        }
        std::io::Seek::seek(file, std::io::SeekFrom::Start(0))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(file, &mut bytes)?;
        Ok((State::classify(&bytes), None))
    }

    /// [`State::parse`], with the text of each record when the bytes are
    /// laid out exactly as this tool writes them ([`State::read_file`]);
    /// the texts keep `bytes`.
    pub fn parse_with_texts(bytes: Buffer) -> (State, Option<RecordTexts>) {
        let text = (*bytes).as_ref();
        if let Some((catalog, spans)) = layout::read(text, true) {
            let texts = RecordTexts::read(bytes.clone(), &spans);
            return (State::Catalog(catalog), Some(texts));
        }
        (State::parse_general(text), None)
    }

    /// Classifies the bytes of a state file (a catalog as this tool writes
    /// it, fast: see `layout`).
    pub fn parse(bytes: &[u8]) -> State {
        match layout::read(bytes, false) {
            Some((catalog, _)) => State::Catalog(catalog),
            None => State::parse_general(bytes),
        }
    }

    /// [`State::parse`] of any layout: one pass for a catalog led by its
    /// version, else [`State::classify`].
    fn parse_general(bytes: &[u8]) -> State {
        read_v4(&mut serde_json::Deserializer::from_slice(bytes))
            .unwrap_or_else(|_| State::classify(bytes))
    }

    /// [`State::parse`] by serde alone, whatever the layout.
    fn classify(bytes: &[u8]) -> State {
        /// Only `schema_version` is looked at; every other field is skipped
        /// without being built, so classifying a big catalog costs little.
        #[derive(Deserialize)]
        struct Head {
            schema_version: Option<serde_json::Value>,
        }
        let head: Head = match serde_json::from_slice(bytes) {
            Ok(head) => head,
            Err(e) if e.classify() == serde_json::error::Category::Data => {
                return State::Invalid {
                    reason: "state is not a JSON object".to_owned(),
                };
            }
            Err(e) => {
                return State::Invalid {
                    reason: format!("state is not valid JSON ({e})"),
                };
            }
        };
        let version = match head.schema_version {
            Some(serde_json::Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or(0),
            Some(other) => {
                return State::Invalid {
                    reason: format!("schema_version {other} is not a positive integer"),
                };
            }
            None => {
                return State::Invalid {
                    reason: "state has no schema_version".to_owned(),
                };
            }
        };
        match version {
            1..=3 => State::Legacy {
                schema_version: version,
            },
            SCHEMA_VERSION => match parse_v4(bytes) {
                Ok(c) => State::Catalog(c),
                Err(reason) => State::Invalid { reason },
            },
            v if v > SCHEMA_VERSION => State::Future { schema_version: v },
            v => State::Invalid {
                reason: format!("schema_version {v} is not a known version"),
            },
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMode {
    mode: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    /// Checked by [`State::parse`] before this struct is read.
    #[serde(rename = "schema_version")]
    _schema_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    distributor_version: Option<String>,
    #[serde(with = "rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "rfc3339")]
    updated_at: OffsetDateTime,
    state: RawMode,
    outputs: Outputs,
}

/// A schema-4 catalog read in one pass from a stream, as this tool writes
/// it: `schema_version` 4 first, then the other fields of [`RawCatalog`]
/// in any order. Any other document fails here and is read whole instead
/// (see [`State::read`]), so nothing is classified differently.
struct Streamed(RawCatalog);

impl<'de> Deserialize<'de> for Streamed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Streamed, D::Error> {
        #[derive(Deserialize, PartialEq)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Key {
            SchemaVersion,
            DistributorVersion,
            CreatedAt,
            UpdatedAt,
            State,
            Outputs,
        }
        #[derive(Deserialize)]
        struct Time(#[serde(with = "rfc3339")] OffsetDateTime);
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Streamed;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a schema 4 catalog")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Streamed, A::Error> {
                use serde::de::Error;
                if map.next_key::<Key>()? != Some(Key::SchemaVersion)
                    || map.next_value::<u64>()? != SCHEMA_VERSION
                {
                    return Err(A::Error::custom(
                        "not a schema 4 catalog led by its version",
                    ));
                }
                let mut distributor_version = None;
                let (mut created_at, mut updated_at, mut state, mut outputs) =
                    (None, None, None, None);
                while let Some(key) = map.next_key::<Key>()? {
                    let duplicate = match key {
                        Key::SchemaVersion => true,
                        Key::DistributorVersion => distributor_version
                            .replace(map.next_value::<Option<String>>()?)
                            .is_some(),
                        Key::CreatedAt => created_at.replace(map.next_value::<Time>()?.0).is_some(),
                        Key::UpdatedAt => updated_at.replace(map.next_value::<Time>()?.0).is_some(),
                        Key::State => state.replace(map.next_value::<RawMode>()?).is_some(),
                        Key::Outputs => outputs.replace(map.next_value::<Outputs>()?).is_some(),
                    };
                    if duplicate {
                        return Err(A::Error::custom("a field is given twice"));
                    }
                }
                let missing = |field| A::Error::missing_field(field);
                Ok(Streamed(RawCatalog {
                    _schema_version: SCHEMA_VERSION,
                    distributor_version: distributor_version.flatten(),
                    created_at: created_at.ok_or_else(|| missing("created_at"))?,
                    updated_at: updated_at.ok_or_else(|| missing("updated_at"))?,
                    state: state.ok_or_else(|| missing("state"))?,
                    outputs: outputs.ok_or_else(|| missing("outputs"))?,
                }))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The `outputs` array, each record checked and made compact as it is
/// read (the text form of every record is never held at once). The first
/// record that fails its checks is kept as `problem`; the rest of the
/// array is then only parsed, so that a malformed document still reports
/// its syntax error first.
#[derive(Default)]
struct Outputs {
    records: Vec<OutputRecord>,
    problem: Option<String>,
}

impl<'de> Deserialize<'de> for Outputs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Outputs, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Outputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of output records")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Outputs, A::Error> {
                let mut out = Outputs::default();
                let mut shared = Shared::default();
                while out.problem.is_none() {
                    let Some(text) = seq.next_element::<RecordText>()? else {
                        return Ok(out);
                    };
                    match shared.record(text) {
                        Ok(r) => out.records.push(r),
                        Err(problem) => out.problem = Some(problem),
                    }
                }
                while seq.next_element::<RecordText>()?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_seq(Visit)
    }
}

fn parse_v4(bytes: &[u8]) -> Result<Catalog, String> {
    let raw: RawCatalog =
        serde_json::from_slice(bytes).map_err(|e| format!("invalid schema 4 state: {e}"))?;
    finish_v4(raw)
}

/// The checks of a schema-4 catalog once its JSON has been read.
fn finish_v4(raw: RawCatalog) -> Result<Catalog, String> {
    if raw.state.mode != "catalog" {
        return Err(format!(
            "state.mode is {:?}; schema 4 requires \"catalog\"",
            raw.state.mode
        ));
    }
    if let Some(problem) = raw.outputs.problem {
        return Err(problem);
    }
    let mut catalog = Catalog {
        distributor_version: raw.distributor_version,
        created_at: raw.created_at,
        updated_at: raw.updated_at,
        outputs: raw.outputs.records,
    };
    catalog.sort();
    if let Some(pair) = catalog.outputs.windows(2).find(|p| p[0].path == p[1].path) {
        return Err(format!("output {} is recorded twice", pair[0].path));
    }
    Ok(catalog)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A writer on a full disk.
    struct Full;

    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(28))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A full disk while the catalog is written keeps its errno, so that
    /// the agent defers the bundle (`io_class`) instead of failing it.
    #[test]
    fn a_full_disk_while_writing_a_catalog_keeps_its_errno() {
        let mut catalog = Catalog::new(parse_time("2026-06-04T12:00:00Z").unwrap());
        let State::Catalog(seed) = State::parse(SEED_V4.as_bytes()) else {
            panic!("the seed parses")
        };
        // Large enough not to fit the writer's buffer.
        for i in 0..2000 {
            let mut r = seed.outputs[0].clone();
            r.path = crate::paths::RelPath::parse(&format!("p/{i:05}.html")).unwrap();
            catalog.outputs.push(r);
        }
        let whole = catalog.write_json(&mut Full).unwrap_err();
        assert_eq!(whole.raw_os_error(), Some(28), "{whole}");
        let Err(reusing) = catalog.write_json_reusing(&mut Full, None) else {
            panic!("written on a full disk")
        };
        assert_eq!(reusing.raw_os_error(), Some(28), "{reusing}");
        assert!(crate::fs::io_class::is_transient(&reusing));
    }

    /// The v4 example from the destination state contract, verbatim.
    pub const SEED_V4: &str = r#"{
  "schema_version": 4,
  "distributor_version": "dev",
  "created_at": "2026-06-04T12:00:00Z",
  "updated_at": "2026-06-04T12:10:00Z",
  "state": {
    "mode": "catalog"
  },
  "outputs": [
    {
      "path": "report.html",
      "pipeline_id": "reports",
      "destination_id": "static-site",
      "source": {
        "id": "reports.example.2026-06-04",
        "digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "created": "2026-06-04T11:55:00Z"
      },
      "kind": "generated",
      "source_path": "report.md",
      "transform": "markdown_to_html",
      "url": "https://reports.example.com/archive/report.html",
      "sha256": "sha256:abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd",
      "size": 2345,
      "created_at": "2026-06-04T12:00:00Z",
      "updated_at": "2026-06-04T12:10:00Z"
    }
  ]
}
"#;

    /// The schema 1 example from the superseded contract.
    const SEED_V1: &str = r#"{
  "schema_version": 1,
  "distributor_version": "dev",
  "pipeline_id": "reports",
  "destination_id": "archive",
  "published_at": "2026-06-04T12:00:00Z",
  "source": {"manifest": {"schema_version": 1, "id": "reports.example.2026-06-04",
     "digest": "sha256:...", "created": "2026-06-04T11:55:00Z",
     "files": [{"path": "report.md", "sha256": "sha256:...", "size": 1234}]}},
  "links": {"primary_url": "https://reports.example.com/archive/report.html"},
  "outputs": [{"path": "report.html", "kind": "generated", "source_path": "report.md",
     "transform": "markdown_to_html", "url": "https://reports.example.com/archive/report.html",
     "sha256": "sha256:...", "size": 2345}]
}"#;

    fn seed_value() -> serde_json::Value {
        serde_json::from_str(SEED_V4).unwrap()
    }

    fn parse_value(v: &serde_json::Value) -> State {
        both(&serde_json::to_vec(v).unwrap())
    }

    /// Classifies `bytes` every way, by serde from a stream and whole, and
    /// by the reader of this tool's own layout where it answers, and checks
    /// that they all agree (the streamed read falls back to the whole one
    /// for anything but a catalog led by its version).
    fn both(bytes: &[u8]) -> State {
        let whole = State::classify(bytes);
        assert_eq!(
            State::parse(bytes),
            whole,
            "{}",
            String::from_utf8_lossy(bytes)
        );
        let read = State::read(&mut std::io::Cursor::new(bytes)).unwrap();
        assert_eq!(read, whole, "{}", String::from_utf8_lossy(bytes));
        let (streamed, _) =
            State::read_whole_up_to(&mut std::io::Cursor::new(bytes), 0, true).unwrap();
        assert_eq!(streamed, whole, "{}", String::from_utf8_lossy(bytes));
        whole
    }

    #[test]
    fn a_catalog_reads_the_same_streamed_in_any_key_order() {
        let State::Catalog(c) = both(SEED_V4.as_bytes()) else {
            panic!("seed must be a valid catalog");
        };
        // serde_json's map orders keys by name: schema_version is not first.
        let reordered = serde_json::to_vec(&seed_value()).unwrap();
        assert!(!reordered.starts_with(b"{\"schema_version\""));
        assert_eq!(both(&reordered), State::Catalog(c.clone()));
        let text = SEED_V4.replace(
            "\"distributor_version\": \"dev\",",
            "\"distributor_version\": null,",
        );
        let State::Catalog(none) = both(text.as_bytes()) else {
            panic!("a null distributor_version is no version");
        };
        assert_eq!(none.distributor_version, None);
        for tail in ["x", "{}", "]"] {
            assert!(matches!(
                both(format!("{SEED_V4}{tail}").as_bytes()),
                State::Invalid { .. }
            ));
        }
        for (from, to) in [
            (
                "\"state\": {",
                "\"state\": {\"mode\": \"catalog\"}, \"state\": {",
            ),
            (
                "\"created_at\": \"2026-06-04T12:00:00Z\",\n  \"updated",
                "\"updated",
            ),
            (
                "\"schema_version\": 4,",
                "\"schema_version\": 4, \"schema_version\": 4,",
            ),
            ("\"schema_version\": 4,", "\"schema_version\": 4.0,"),
        ] {
            let text = SEED_V4.replacen(from, to, 1);
            assert_ne!(text, SEED_V4);
            assert!(
                matches!(both(text.as_bytes()), State::Invalid { .. }),
                "{text}"
            );
        }
    }

    #[test]
    fn seed_v4_reads_and_writes_back_byte_for_byte() {
        let State::Catalog(c) = State::parse(SEED_V4.as_bytes()) else {
            panic!("seed must be a valid catalog");
        };
        assert_eq!(c.outputs.len(), 1);
        let r = &c.outputs[0];
        assert_eq!(r.path.as_str(), "report.html");
        assert_eq!(r.kind, OutputKind::Generated);
        assert_eq!(r.size, 2345);
        assert_eq!(String::from_utf8(c.to_json()).unwrap(), SEED_V4);
    }

    #[test]
    fn digests_read_and_write_back_as_the_same_text() {
        let hex = "0123456789abcdef".repeat(4);
        for text in [
            format!("sha256:{hex}"),
            format!("sha256:{}", "0".repeat(64)),
            format!("sha256:{}", "f".repeat(64)),
        ] {
            let d = Sha256::parse(&text).unwrap();
            assert_eq!(d.to_string(), text);
            assert!(d == text && text.clone() == d);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{text}\""));
            assert_eq!(
                serde_json::from_str::<Sha256>(&format!("\"{text}\"")).unwrap(),
                d
            );
        }
        assert_eq!(
            Sha256::parse(&format!("sha256:{hex}")).unwrap().0[..2],
            [0x01, 0x23]
        );
        for bad in [
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[1..]),
            format!("sha256:{hex}0"),
            format!("md5:{hex}"),
            hex.clone(),
            format!("sha256:{}", "g".repeat(64)),
        ] {
            assert_eq!(Sha256::parse(&bad), None, "{bad}");
            assert!(serde_json::from_str::<Sha256>(&format!("\"{bad}\"")).is_err());
        }
    }

    /// Compact records write back exactly the bytes they were read from,
    /// for every shape of record (source and generated, with and without
    /// url, several owners and sources), in the catalog and one by one.
    #[test]
    fn compact_records_write_back_byte_for_byte() {
        let record = |i: usize| {
            let generated = if i.is_multiple_of(2) {
                concat!(
                    "      \"kind\": \"generated\",\n",
                    "      \"source_path\": \"report.md\",\n",
                    "      \"transform\": \"markdown_to_html\",\n",
                    "      \"url\": \"https://reports.example.com/a%20b/r.html\",\n",
                )
            } else {
                "      \"kind\": \"source\",\n"
            };
            format!(
                concat!(
                    "    {{\n",
                    "      \"path\": \"d{}/p{}.html\",\n",
                    "      \"pipeline_id\": \"pipe{}\",\n",
                    "      \"destination_id\": \"static-site\",\n",
                    "      \"source\": {{\n",
                    "        \"id\": \"src.{}\",\n",
                    "        \"digest\": \"sha256:{:064x}\",\n",
                    "        \"created\": \"2026-06-04T11:55:00.5Z\"\n",
                    "      }},\n",
                    "{}",
                    "      \"sha256\": \"sha256:{:064x}\",\n",
                    "      \"size\": {},\n",
                    "      \"created_at\": \"2026-06-04T12:00:00Z\",\n",
                    "      \"updated_at\": \"2026-06-04T12:10:00.125Z\"\n",
                    "    }}"
                ),
                i % 3,
                i,
                i % 2,
                i % 3,
                i % 3 + 1,
                generated,
                i * 7919,
                i * 1000
            )
        };
        // Sorted by path: d0/p0, d0/p3, d1/p1, d1/p4, d2/p2, d2/p5.
        let records: Vec<String> = [0, 3, 1, 4, 2, 5].into_iter().map(record).collect();
        let head = SEED_V4.split("\"outputs\"").next().unwrap();
        let text = format!("{head}\"outputs\": [\n{}\n  ]\n}}\n", records.join(",\n"));
        let State::Catalog(c) = both(text.as_bytes()) else {
            panic!("a valid catalog: {:?}", State::parse(text.as_bytes()));
        };
        assert_eq!(String::from_utf8(c.to_json()).unwrap(), text);
        // Records of one owner and one source share them.
        let (a, b) = (&c.outputs[0], &c.outputs[4]);
        assert_eq!((&*a.pipeline_id, &*b.pipeline_id), ("pipe0", "pipe0"));
        assert!(Arc::ptr_eq(&a.pipeline_id, &b.pipeline_id));
        assert!(Arc::ptr_eq(&a.destination_id, &c.outputs[1].destination_id));
        assert!(Arc::ptr_eq(&c.outputs[0].source, &c.outputs[1].source));
        // One by one (as the journal writes them), compactly.
        for r in &c.outputs {
            let one = serde_json::to_string(r).unwrap();
            let again: OutputRecord = serde_json::from_str(&one).unwrap();
            assert_eq!(&again, r);
            assert_eq!(serde_json::to_string(&again).unwrap(), one);
        }
    }

    #[test]
    fn legacy_and_future_versions_are_recognised() {
        assert_eq!(
            both(SEED_V1.as_bytes()),
            State::Legacy { schema_version: 1 }
        );
        for v in [2, 3] {
            let text = format!(r#"{{"schema_version": {v}, "anything": [1]}}"#);
            assert_eq!(
                State::parse(text.as_bytes()),
                State::Legacy { schema_version: v }
            );
        }
        assert_eq!(
            both(br#"{"schema_version": 5}"#),
            State::Future { schema_version: 5 }
        );
    }

    /// Every way a state file can be invalid, each from the contract.
    #[test]
    fn invalid_states_are_rejected() {
        type Edit = fn(&mut serde_json::Value);
        let cases: &[(&str, Edit)] = &[
            ("unknown top-level field", |v| v["extra"] = 1.into()),
            ("unknown output field", |v| {
                v["outputs"][0]["extra"] = 1.into()
            }),
            ("unknown source field", |v| {
                v["outputs"][0]["source"]["x"] = 1.into()
            }),
            ("unknown state field", |v| v["state"]["x"] = 1.into()),
            ("wrong mode", |v| v["state"]["mode"] = "single_owner".into()),
            ("missing outputs", |v| {
                v.as_object_mut().unwrap().remove("outputs");
            }),
            ("missing created_at", |v| {
                v.as_object_mut().unwrap().remove("created_at");
            }),
            ("bad timestamp", |v| v["updated_at"] = "yesterday".into()),
            ("size as string", |v| v["outputs"][0]["size"] = "12".into()),
            ("negative size", |v| v["outputs"][0]["size"] = (-1).into()),
            ("uppercase sha", |v| {
                v["outputs"][0]["sha256"] = format!("sha256:{}", "AB".repeat(32)).into()
            }),
            ("short sha", |v| {
                v["outputs"][0]["sha256"] = "sha256:abc".into()
            }),
            ("bad source digest", |v| {
                v["outputs"][0]["source"]["digest"] = "md5:x".into()
            }),
            ("dotdot path", |v| {
                v["outputs"][0]["path"] = "../x.html".into()
            }),
            ("absolute path", |v| {
                v["outputs"][0]["path"] = "/x.html".into()
            }),
            ("reserved path", |v| {
                v["outputs"][0]["path"] = ".distributor.lock".into()
            }),
            ("bad pipeline id", |v| {
                v["outputs"][0]["pipeline_id"] = "-x".into()
            }),
            ("bad destination id", |v| {
                v["outputs"][0]["destination_id"] = "a b".into()
            }),
            ("bad source id", |v| {
                v["outputs"][0]["source"]["id"] = "".into()
            }),
            ("bad kind", |v| v["outputs"][0]["kind"] = "copy".into()),
            ("generated without transform", |v| {
                v["outputs"][0].as_object_mut().unwrap().remove("transform");
            }),
            ("generated without source_path", |v| {
                v["outputs"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("source_path");
            }),
            ("source with source_path", |v| {
                v["outputs"][0]["kind"] = "source".into()
            }),
            ("unknown transform", |v| {
                v["outputs"][0]["transform"] = "gzip".into()
            }),
            ("bad url", |v| v["outputs"][0]["url"] = "ftp://x/y".into()),
            ("duplicate path", |v| {
                let first = v["outputs"][0].clone();
                v["outputs"].as_array_mut().unwrap().push(first);
            }),
            ("schema_version as string", |v| {
                v["schema_version"] = "4".into()
            }),
            ("schema_version zero", |v| v["schema_version"] = 0.into()),
            ("schema_version negative", |v| {
                v["schema_version"] = (-4).into()
            }),
            ("schema_version float", |v| v["schema_version"] = 4.5.into()),
            ("no schema_version", |v| {
                v.as_object_mut().unwrap().remove("schema_version");
            }),
        ];
        for (name, edit) in cases {
            let mut v = seed_value();
            edit(&mut v);
            assert!(
                matches!(parse_value(&v), State::Invalid { .. }),
                "{name}: {:?}",
                parse_value(&v)
            );
        }
        for junk in [
            &b"not json"[..],
            b"[]",
            b"4",
            b"",
            b"{\"schema_version\": 4",
        ] {
            assert!(matches!(both(junk), State::Invalid { .. }));
        }
    }

    #[test]
    fn writes_are_sorted_and_normalised_to_utc() {
        let mut v = seed_value();
        let mut second = v["outputs"][0].clone();
        second["path"] = "a/first.html".into();
        second["created_at"] = "2026-06-04T14:00:00.250+02:00".into();
        v["outputs"].as_array_mut().unwrap().push(second);
        let State::Catalog(c) = parse_value(&v) else {
            panic!()
        };
        let text = String::from_utf8(c.to_json()).unwrap();
        let a = text.find("a/first.html").unwrap();
        let b = text.find("report.html\"").unwrap();
        assert!(a < b, "outputs sorted by path");
        assert!(text.contains("\"created_at\": \"2026-06-04T12:00:00.25Z\""));
        assert!(text.ends_with("}\n"));
        assert_eq!(both(text.as_bytes()), State::Catalog(c));
    }

    #[test]
    fn timestamps_compare_as_instants() {
        assert_eq!(
            parse_time("2026-06-04T13:55:00+02:00").unwrap(),
            parse_time("2026-06-04T11:55:00Z").unwrap()
        );
        assert_eq!(
            format_time(parse_time("2026-06-04T13:55:00.5+02:00").unwrap()),
            "2026-06-04T11:55:00.5Z"
        );
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = both(&bytes);
        }
    }

    fn record_at(path: &str, size: u64) -> OutputRecord {
        let State::Catalog(c) = State::parse(SEED_V4.as_bytes()) else {
            panic!("seed must be a valid catalog");
        };
        let mut r = c.outputs[0].clone();
        r.path = RelPath::parse(path).unwrap();
        r.size = size;
        r
    }

    #[test]
    fn a_large_catalog_file_read_in_halves_is_the_file_read_as_one() {
        let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
        c.outputs = (0..9000)
            .map(|i| record_at(&format!("d{:02}/f{i:05}.html", i % 40), i))
            .collect();
        c.sort();
        let text = c.to_json();
        assert!(text.len() >= layout::PARTS_FROM, "{}", text.len());
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &text).unwrap();
        let len = text.len() as u64;
        assert_eq!(read_in_halves(&file, len).unwrap(), Some(text.clone()));
        // A file that changed size since it was measured is not taken.
        assert_eq!(read_in_halves(&file, len + 1).unwrap(), None);
        assert_eq!(read_in_halves(&file, len - 1).unwrap(), None);
        for texts in [false, true] {
            let (state, kept) = State::read_file(&file, texts).unwrap();
            assert_eq!(state, State::Catalog(c.clone()));
            assert_eq!(kept.map(|t| t.len()), texts.then_some(9000));
        }
    }

    #[test]
    fn merging_added_records_keeps_the_path_order() {
        // (records there, records added): the sorted union, however many
        // are added and wherever they go.
        type Paths = &'static [&'static str];
        let cases: [(Paths, Paths); 10] = [
            (&[], &[]),
            (&[], &["a", "b"]),
            (&["b", "d", "f"], &["a", "c", "e", "g"]),
            (&["c", "d"], &["a", "b", "e", "f"]),
            (&["b"], &[]),
            (&["b", "d", "f"], &["a"]),
            (&["b", "d", "f"], &["g"]),
            (&["b", "d", "f", "h", "j", "l", "n", "p"], &["a", "c", "e"]),
            (&["b", "d", "f", "h", "j", "l", "n", "p"], &["c", "i", "q"]),
            (&["b", "d"], &["a", "c", "e", "f", "g"]),
        ];
        for (there, added) in cases {
            let mut records: Vec<OutputRecord> = there.iter().map(|p| record_at(p, 1)).collect();
            let added: Vec<OutputRecord> = added.iter().map(|p| record_at(p, 2)).collect();
            let mut want: Vec<(String, u64)> = records
                .iter()
                .chain(&added)
                .map(|r| (r.path.to_string(), r.size))
                .collect();
            want.sort();
            merge_by_path(&mut records, added);
            let got: Vec<(String, u64)> = records
                .iter()
                .map(|r| (r.path.to_string(), r.size))
                .collect();
            assert_eq!(got, want, "{there:?}");
        }
    }

    #[test]
    fn a_record_written_field_by_field_is_serdes_pretty_form() {
        let seed = record_at("a/b.html", 2345);
        let mut copied = record_at("plain", 0);
        copied.kind = OutputKind::Source;
        copied.source_path = None;
        copied.transform = None;
        copied.url = None;
        let mut odd = record_at("q/\"quoted\" path \u{e9}", u64::MAX);
        odd.url = Some("https://example.org/a?b=\"c\"&d=\u{2028}".to_owned());
        odd.source = Arc::new(SourceIdentity {
            id: "src.\\\u{7f}\u{1F600}\t".to_owned(),
            digest: odd.source.digest.clone(),
            created: parse_time("2026-06-04T12:00:00.123456789+02:00").unwrap(),
        });
        odd.created_at = parse_time("1999-12-31T23:59:59.5Z").unwrap();
        odd.updated_at = parse_time("2026-06-04T12:00:00.001Z").unwrap();
        for r in [seed, copied, odd] {
            let mut pretty = Vec::new();
            serde_json::to_writer_pretty(&mut pretty, &r).unwrap();
            let expected = String::from_utf8(pretty).unwrap().replace('\n', "\n    ");
            let mut out = Vec::new();
            push_record_text(&r, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn writing_with_the_texts_of_an_earlier_catalog_gives_the_same_bytes() {
        let written = |c: &Catalog, before: Option<&RecordTexts>| {
            let mut out = Vec::new();
            let texts = c.write_json_reusing(&mut out, before).unwrap();
            (out, texts)
        };
        let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
        // Empty, then growing, changing and shrinking; with and without
        // the texts of the catalog before, and of an unrelated one.
        let (out, mut texts) = written(&c, None);
        assert_eq!(out, c.to_json());
        let unrelated = {
            let mut u = c.clone();
            u.outputs = vec![record_at("zz", 9)];
            written(&u, None).1
        };
        let mut quoted = record_at("q/\"quoted\" path é", 3);
        quoted.url = Some("https://example.org/a?b=\"c\"".to_owned());
        let steps: [(&[&str], &[&str]); 5] = [
            (&["a/x", "a/y", "b"], &[]),
            (&["c/z"], &[]),
            (&["a/y"], &["b"]),
            (&[], &["a/x", "a/y", "c/z"]),
            (&["d"], &[]),
        ];
        for (n, (upserts, removes)) in steps.iter().enumerate() {
            c.outputs.retain(|r| !removes.contains(&r.path.as_str()));
            for p in upserts.iter() {
                c.outputs.retain(|r| r.path.as_str() != *p);
                c.outputs.push(record_at(p, n as u64 + 1));
            }
            if n == 1 {
                c.outputs.push(quoted.clone());
            }
            c.sort();
            c.updated_at += time::Duration::seconds(1);
            let expected = c.to_json();
            for before in [None, Some(&texts), Some(&unrelated)] {
                assert_eq!(
                    String::from_utf8(written(&c, before).0).unwrap(),
                    String::from_utf8(expected.clone()).unwrap(),
                    "step {n}"
                );
            }
            let reused = written(&c, Some(&texts));
            texts = reused.1;
        }
        // A record's text is taken only for an equal record.
        let one = record_at("a", 1);
        let mut other = one.clone();
        other.updated_at += time::Duration::milliseconds(1);
        let mut c1 = c.clone();
        c1.outputs = vec![one];
        let (_, t1) = written(&c1, None);
        let mut c2 = c.clone();
        c2.outputs = vec![other];
        assert_eq!(written(&c2, Some(&t1)).0, c2.to_json());
    }

    #[test]
    fn a_fingerprint_changes_with_every_field_the_text_shows() {
        let seed = record_at("a/b.html", 10);
        let key = |r: &OutputRecord| Fingerprints::default().key(r);
        assert_eq!(key(&seed), key(&seed.clone()));
        type Change = (&'static str, fn(&mut OutputRecord));
        let changes: [Change; 14] = [
            ("path", |r| r.path = RelPath::parse("a/b.htm").unwrap()),
            ("pipeline", |r| r.pipeline_id = "other".into()),
            ("destination", |r| r.destination_id = "other".into()),
            ("source id", |r| Arc::make_mut(&mut r.source).id.push('x')),
            ("source digest", |r| {
                Arc::make_mut(&mut r.source).digest.push('0')
            }),
            ("source created", |r| {
                Arc::make_mut(&mut r.source).created += time::Duration::SECOND
            }),
            ("kind", |r| r.kind = OutputKind::Source),
            ("source path", |r| r.source_path = None),
            ("transform", |r| r.transform = None),
            ("url", |r| r.url = Some("https://example.org/".to_owned())),
            ("sha256", |r| r.sha256.0[31] ^= 1),
            ("size", |r| r.size += 1),
            ("created", |r| r.created_at += time::Duration::NANOSECOND),
            ("updated", |r| r.updated_at += time::Duration::NANOSECOND),
        ];
        // One walk over all of them, as a write makes (reusing the owner's
        // fingerprint from one record to the next), gives each the
        // fingerprint it has on its own.
        let mut walk = Fingerprints::default();
        assert_eq!(walk.key(&seed), key(&seed));
        for (field, change) in changes {
            let mut r = seed.clone();
            change(&mut r);
            assert_ne!(r, seed, "{field}: the change must change the record");
            assert_ne!(key(&r), key(&seed), "{field}");
            assert_eq!(walk.key(&r), key(&r), "{field}");
            assert_eq!(walk.key(&seed), key(&seed), "{field}");
        }
        // Texts are in UTC: the same instant at another offset is the same
        // text, and the same fingerprint.
        let mut shifted = seed.clone();
        shifted.created_at = seed.created_at.to_offset(time::macros::offset!(+2));
        assert_eq!(key(&shifted), key(&seed));
    }

    #[test]
    fn a_records_text_compares_by_its_path() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        // (path in the text, path compared with, order of the text's)
        let cases = [
            ("a/b", "a/b", Equal),
            ("a/b", "a/c", Less),
            ("a/b", "a/b/c", Less),
            ("a/b/c", "a/b", Greater),
            ("a/\"q\"", "a/\"q\"", Equal),
            ("a/\"q\"", "a/b", Less),
            ("a/\"q\"", "a/", Greater),
            ("a/\"", "a/\"q", Less),
            ("a", "a\"", Less),
            ("a", "a\" b", Less),
            ("a\" b", "a", Greater),
            ("é", "e", Greater),
        ];
        for (texts, path, want) in cases {
            let mut text = Vec::new();
            push_record_text(&record_at(texts, 1), &mut text);
            assert_eq!(text_path_cmp(&text, path), Some(want), "{texts} vs {path}");
            assert_eq!(texts.cmp(path), want, "the order of the paths themselves");
        }
        assert_eq!(text_path_cmp(b"{\"size\": 1}", "a"), None);
    }

    #[test]
    fn a_write_takes_the_text_of_every_unchanged_record_around_the_changes() {
        let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
        // Paths with escapes among them: texts are matched by path.
        c.outputs = (0..60)
            .map(|i| match i % 7 {
                0 => record_at(&format!("f/{i:03} \"q\""), i),
                1 => record_at(&format!("f/{i:03} é"), i),
                _ => record_at(&format!("f/{i:03}"), i),
            })
            .collect();
        c.sort();
        let texts = c.write_json_reusing(&mut Vec::new(), None).unwrap();
        // (records removed, changed, added) at the start, middle and end.
        let cases: [(&[usize], &[usize], &[&str]); 4] = [
            (&[], &[], &[]),
            (&[0, 1, 2, 30, 59], &[], &[]),
            (&[], &[0, 29, 59], &["a", "f/030a", "z"]),
            (
                &[3, 4, 5, 6, 7, 8, 9, 10],
                &[11, 40],
                &["f/000", "f/025 \"new\""],
            ),
        ];
        for (removed, changed, added) in cases {
            let mut next = c.clone();
            for &i in changed {
                next.outputs[i].size += 1000;
            }
            let mut kept = Vec::new();
            for (i, r) in next.outputs.drain(..).enumerate() {
                if !removed.contains(&i) {
                    kept.push(r);
                }
            }
            next.outputs = kept;
            next.outputs.extend(added.iter().map(|p| record_at(p, 7)));
            next.sort();
            let mut out = Vec::new();
            let after = next.write_json_reusing(&mut out, Some(&texts)).unwrap();
            assert_eq!(out, next.to_json(), "{removed:?} {changed:?} {added:?}");
            // Formatted now: the changed and added records, nothing else.
            let formatted = after
                .texts
                .iter()
                .filter(|(_, s)| {
                    let buffer = &after.buffers[s.buffer as usize];
                    !texts.buffers.iter().any(|b| Arc::ptr_eq(b, buffer))
                })
                .count();
            let expected = changed.len() + added.len();
            assert_eq!(formatted, expected, "{removed:?} {changed:?} {added:?}");
        }
    }

    #[test]
    fn texts_read_from_the_file_are_reused_and_never_outgrow_twice_the_records() {
        let mut c = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
        c.outputs = (0..300)
            .map(|i| record_at(&format!("f/{i:04}"), i))
            .collect();
        let file = c.to_json();
        let (state, texts) = State::parse_with_texts(Arc::new(file.clone()));
        assert_eq!(state, State::Catalog(c.clone()));
        let mut texts = texts.expect("a catalog as written is read with its texts");
        assert_eq!(texts.len(), 300);
        assert_eq!(texts.buffers.len(), 1, "the file itself");
        // Round after round a third of the records change: every write
        // gives the bytes of a fresh one, and the buffers behind the texts
        // stay within twice the records' own text.
        for round in 1..=6u64 {
            for r in c.outputs.iter_mut().skip(round as usize % 3).step_by(3) {
                r.size += 1000 * round;
            }
            let mut out = Vec::new();
            let next = c.write_json_reusing(&mut out, Some(&texts)).unwrap();
            assert_eq!(out, c.to_json(), "round {round}");
            let live: usize = next.texts.iter().map(|(_, s)| s.len as usize).sum();
            let held = next.held_bytes() as usize;
            assert!(
                held <= 2 * live,
                "round {round}: {held} bytes held for {live}"
            );
            assert!(next.buffers.len() <= 3, "round {round}");
            texts = next;
        }
        // Unchanged, everything comes from the buffers as they are.
        let mut out = Vec::new();
        let same = c.write_json_reusing(&mut out, Some(&texts)).unwrap();
        assert_eq!(out, c.to_json());
        assert_eq!(same.buffers.len(), texts.buffers.len());
    }

    #[test]
    fn overlay_reads_like_the_merged_catalog_and_merges_once() {
        let now = parse_time("2026-07-01T00:00:00Z").unwrap();
        let mut base = Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap());
        base.outputs = ["a/x", "a/y", "b", "c/z", "d"]
            .iter()
            .map(|p| record_at(p, 1))
            .collect();
        let mut overlay = Overlay::new(base.clone());
        // Reference: a plain map with each step applied in order.
        let mut reference: BTreeMap<String, OutputRecord> = base
            .outputs
            .iter()
            .map(|r| (r.path.as_str().to_owned(), r.clone()))
            .collect();
        let steps: [(&[&str], &[&str]); 4] = [
            (&["a/w", "b"], &[]),
            (&[], &["a/x", "c/z"]),
            (&["c/z", "e/f"], &["d"]),
            (&["0"], &["a/w"]),
        ];
        for (n, (upserts, removes)) in steps.iter().enumerate() {
            let size = n as u64 + 2;
            let upserts: Vec<OutputRecord> = upserts.iter().map(|p| record_at(p, size)).collect();
            let removes: Vec<String> = removes.iter().map(|p| p.to_string()).collect();
            overlay.record(&upserts, &removes);
            for p in &removes {
                reference.remove(p);
            }
            for r in upserts {
                reference.insert(r.path.as_str().to_owned(), r);
            }
            let merged: Vec<&OutputRecord> = reference.values().collect();
            let seen: Vec<&OutputRecord> = overlay.iter().collect();
            assert_eq!(seen, merged, "step {n}: iter");
            for key in [
                "", "0", "a", "a/", "a/x", "a/y", "b", "b/", "c/", "c/z", "d", "e", "f",
            ] {
                assert_eq!(
                    overlay.get(key),
                    reference.get(key),
                    "step {n}: get {key:?}"
                );
                let first = reference
                    .range::<str, _>((std::ops::Bound::Included(key), std::ops::Bound::Unbounded))
                    .next()
                    .map(|(_, r)| r);
                assert_eq!(
                    overlay.first_from(key),
                    first,
                    "step {n}: first_from {key:?}"
                );
            }
        }
        assert_eq!(overlay.base(), &base);
        let merged = overlay.into_catalog(now);
        let expected: Vec<OutputRecord> = reference.into_values().collect();
        assert_eq!(merged.outputs, expected);
        assert_eq!(merged.updated_at, now);
        assert_eq!(merged.created_at, base.created_at);
    }
}
