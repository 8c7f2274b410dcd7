//! Reusing the text of unchanged records when a catalog is written again:
//! [`RecordTexts`] (each record's text as last read or written, with a
//! fingerprint), [`Fingerprints`] and the plan of one write's reuse.
//!
//! Holds bytes already laid out by `write` or checked by `layout`; it
//! never formats a field itself (`write::push_record_text` does) and does
//! no I/O.

use super::model::{OutputRecord, SourceIdentity};
use super::write::{Stamps, push_record_text};
use crate::paths::RelPath;
use std::sync::Arc;
use time::OffsetDateTime;

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
    pub(super) buffers: Vec<Buffer>,
    /// Each record's fingerprint and text, in the catalog's order.
    pub(super) texts: Vec<(u64, Span)>,
}

/// Bytes that record texts are in: a catalog file as read (a `Vec`, or an
/// object store's body, shared with whoever holds it), or the records a
/// write formatted.
pub type Buffer = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where one record's text is: `len` bytes from `start` of a buffer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) buffer: u32,
    pub(super) len: u32,
    pub(super) start: usize,
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
        // Every field by name, without `..`: a field added to the record
        // does not compile until it is laid out here too.
        let OutputRecord {
            path,
            pipeline_id,
            destination_id,
            source,
            kind,
            source_path,
            transform,
            url,
            sha256,
            size,
            created_at,
            updated_at,
        } = r;
        let owner = match &self.owner {
            Some(o)
                if Arc::ptr_eq(&o.pipeline_id, pipeline_id)
                    && Arc::ptr_eq(&o.destination_id, destination_id)
                    && Arc::ptr_eq(&o.source, source) =>
            {
                o.key
            }
            _ => {
                let SourceIdentity {
                    id,
                    digest,
                    created,
                } = &**source;
                let scratch = &mut self.scratch;
                scratch.clear();
                lay_text(scratch, Some(pipeline_id));
                lay_text(scratch, Some(destination_id));
                lay_text(scratch, Some(id));
                lay_text(scratch, Some(digest));
                lay_instant(scratch, *created);
                let key = hash(scratch);
                self.owner = Some(Owner {
                    pipeline_id: pipeline_id.clone(),
                    destination_id: destination_id.clone(),
                    source: source.clone(),
                    key,
                });
                key
            }
        };
        let scratch = &mut self.scratch;
        scratch.clear();
        scratch.extend_from_slice(&owner.to_le_bytes());
        lay_text(scratch, Some(path.as_str()));
        lay_text(scratch, Some(kind.as_str()));
        lay_text(scratch, source_path.as_ref().map(RelPath::as_str));
        lay_text(scratch, *transform);
        lay_text(scratch, url.as_deref());
        scratch.extend_from_slice(&sha256.0);
        scratch.extend_from_slice(&size.to_le_bytes());
        lay_instant(scratch, *created_at);
        lay_instant(scratch, *updated_at);
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
    pub(super) fn read(text: Buffer, records: &[(u64, std::ops::Range<usize>)]) -> RecordTexts {
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
pub(super) fn text_path_cmp(text: &[u8], path: &str) -> Option<std::cmp::Ordering> {
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
pub(super) const SEPARATOR: &[u8] = b",\n    ";

/// One write's use of the texts known before it: which record takes its
/// text from where, and the texts it leaves for the next write.
pub(super) struct Reuse<'a> {
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
    /// The timestamps formatted last.
    stamps: Stamps,
}

impl<'a> Reuse<'a> {
    pub(super) fn plan(records: &[OutputRecord], before: Option<&'a RecordTexts>) -> Reuse<'a> {
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
            stamps: Stamps::default(),
        }
    }

    /// Where the text of record `i` (`r`) is: as known before, or
    /// formatted now.
    pub(super) fn span(&mut self, i: usize, r: &OutputRecord) -> Span {
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
                push_record_text(r, &mut self.fresh, &mut self.stamps);
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
    pub(super) fn bytes(&self, span: Span) -> &[u8] {
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
    pub(super) fn join(&self, run: Span, separator: &[u8], span: Span) -> Option<Span> {
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

    pub(super) fn finish(mut self) -> RecordTexts {
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
