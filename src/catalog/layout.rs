//! Reading a catalog laid out exactly as this tool writes it, fast.
//!
//! Almost every catalog a root holds was written by this tool, byte for
//! byte as [`Catalog::write_json`] lays it out: the same keys in the same
//! order, the same indentation, strings escaped as serde_json escapes
//! them, timestamps as [`super::format_time`] formats them. Such a file is
//! read here by matching that layout directly, which is several times
//! faster than a general JSON parser, and each record's text is then known
//! to be exactly the text this tool would write for it: the next write
//! copies it instead of formatting the record again
//! ([`super::RecordTexts`]).
//!
//! Every record is checked as a record read by serde is ([`Shared`]).
//! Anything else (another layout, an escaped string, a timestamp with an
//! offset, a record that fails a check) makes this reader give up, and the
//! file is read by serde instead, which gives the same catalog or the
//! precise error. So this reader only ever answers for files that serde
//! reads to the very same catalog; a test holds it to that.

use super::{
    Catalog, Fingerprints, OutputKind, OutputRecord, RecordText, SCHEMA_VERSION, Shared,
    SourceText, finish_v4,
};
use crate::paths::RelPath;
use std::borrow::Cow;
use time::OffsetDateTime;

/// The span of each record's text in the file, in the file's order, each
/// with the record's fingerprint.
pub(super) type Spans = Vec<(u64, std::ops::Range<usize>)>;

/// The catalog in `bytes`, with the span of each record's text (and its
/// fingerprint, [`Fingerprints::key`]) when `texts`, if the file is laid
/// out exactly as this tool writes it and every record passes its checks.
pub(super) fn read(bytes: &[u8], texts: bool) -> Option<(Catalog, Spans)> {
    read_in_parts(bytes, texts, None)
}

/// [`read`], its records read in `parts` (or as many as [`parts_for`]
/// their size).
fn read_in_parts(bytes: &[u8], texts: bool, parts: Option<usize>) -> Option<(Catalog, Spans)> {
    let mut c = Cursor { b: bytes, at: 0 };
    c.lit(b"{\n  \"schema_version\": ")?;
    if c.number()? != SCHEMA_VERSION {
        return None;
    }
    let distributor_version = if c.lit(b",\n  \"distributor_version\": ").is_some() {
        Some(c.string()?.to_owned())
    } else {
        None
    };
    c.lit(b",\n  \"created_at\": ")?;
    let created_at = c.time()?;
    c.lit(b",\n  \"updated_at\": ")?;
    let updated_at = c.time()?;
    c.lit(b",\n  \"state\": {\n    \"mode\": \"catalog\"\n  },\n  \"outputs\": [")?;
    let (records, spans) = if c.lit(b"]\n}\n").is_some() {
        if c.at != bytes.len() {
            return None;
        }
        (Vec::new(), Vec::new())
    } else {
        let end = bytes
            .len()
            .checked_sub(END.len())
            .filter(|&end| end > c.at && &bytes[end..] == END)?;
        let parts = parts.unwrap_or_else(|| parts_for(end - c.at));
        records_in(bytes, c.at, end, texts, parts)?
    };
    let raw = super::RawCatalog {
        _schema_version: SCHEMA_VERSION,
        distributor_version,
        created_at,
        updated_at,
        state: super::RawMode {
            mode: "catalog".to_owned(),
        },
        outputs: super::Outputs {
            records,
            problem: None,
        },
    };
    finish_v4(raw).ok().map(|catalog| (catalog, spans))
}

/// What ends a catalog that has records.
const END: &[u8] = b"\n  ]\n}\n";

/// Where one record ends and the next begins, as this tool lays them out:
/// a closing brace indented by four spaces is only ever a record's (the
/// lines inside a record are indented further, and a string holds no line
/// break: serde_json escapes it).
const BETWEEN_RECORDS: &[u8] = b"\n    },\n    {\n      \"path\": ";

/// Records from this many bytes on are read in parts, on as many threads
/// as there are cores (up to [`MOST_PARTS`]): reading a large catalog is
/// most of a fresh process's publication into a large root.
pub(super) const PARTS_FROM: usize = 4 << 20;
const MOST_PARTS: usize = 4;

/// The records laid out in `bytes[from..to]` (from the line break after
/// the outputs' opening bracket to the one before their closing one),
/// with their texts' spans when `texts`.
///
/// A large run is cut at record boundaries ([`BETWEEN_RECORDS`]) into
/// parts read side by side, each checked as the whole would be. Cutting
/// changes nothing of what is read: each part must end exactly where the
/// next begins, so the parts together read each byte as one pass does; a
/// file in which such a cut lands elsewhere than between records fails to
/// read as laid out, and is read by serde.
fn records_in(
    bytes: &[u8],
    from: usize,
    to: usize,
    texts: bool,
    parts: usize,
) -> Option<(Vec<OutputRecord>, Spans)> {
    let cuts = cuts(bytes, from, to, parts);
    // A record's text is at least 300 bytes: reserving for one per 256
    // bytes never grows the vectors, and what is not used is never touched
    // (it takes address space, not memory). The first part's reserve
    // holds every record, so the others are appended to it in place (each
    // held twice only while it is appended: at most the records of the
    // parts but the first, about three quarters of them more at the peak).
    let first = |end: usize| records_between(bytes, from, end, true, texts, (to - from) / 256);
    if cuts.is_empty() {
        return first(to);
    }
    let part = move |start: usize, end: usize| {
        records_between(bytes, start, end, false, texts, (end - start) / 256)
    };
    std::thread::scope(|scope| {
        // A part whose thread cannot be started (a limit on threads) is
        // read here, after the first.
        let rest: Vec<_> = cuts
            .iter()
            .zip(cuts.iter().skip(1).chain([&to]))
            .map(|(&start, &end)| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || part(start, end))
                    .map_err(|_| (start, end))
            })
            .collect();
        let (mut records, mut spans) = first(cuts[0])?;
        for read in rest {
            let (more, more_spans) = match read {
                Ok(reading) => reading
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?,
                Err((start, end)) => part(start, end)?,
            };
            records.extend(more);
            spans.extend(more_spans);
        }
        Some((records, spans))
    })
}

/// How many parts records laid out in `len` bytes are read in.
fn parts_for(len: usize) -> usize {
    if len < PARTS_FROM {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MOST_PARTS))
    }
}

/// Where to cut `bytes[from..to]` into (up to) `parts` parts, at record
/// boundaries: the start of each part but the first.
fn cuts(bytes: &[u8], from: usize, to: usize, parts: usize) -> Vec<usize> {
    let mut cuts: Vec<usize> = Vec::new();
    for i in 1..parts {
        let aim = from + (to - from) / parts * i;
        if cuts.last().is_some_and(|&last| aim <= last) {
            continue;
        }
        if let Some(found) = memchr::memmem::find(&bytes[aim..to], BETWEEN_RECORDS) {
            // The next part starts at the separator after the brace.
            cuts.push(aim + found + b"\n    }".len());
        }
    }
    cuts
}

/// The records in `bytes[from..to]`, each after its separator (the
/// first's when `first`), ending exactly at `to`.
fn records_between(
    bytes: &[u8],
    from: usize,
    to: usize,
    first: bool,
    texts: bool,
    reserve: usize,
) -> Option<(Vec<OutputRecord>, Spans)> {
    let mut c = Cursor {
        b: &bytes[..to],
        at: from,
    };
    let mut records = Vec::with_capacity(reserve);
    let mut spans = Vec::with_capacity(if texts { reserve } else { 0 });
    let mut shared = Shared::default();
    let mut times = Times::default();
    let mut fingerprints = Fingerprints::default();
    let mut separator: &[u8] = if first { b"\n    " } else { b",\n    " };
    while c.at < to {
        c.lit(separator)?;
        separator = b",\n    ";
        let start = c.at;
        let text = c.record(&mut times)?;
        let record = shared.record(text).ok()?;
        if texts {
            spans.push((fingerprints.key(&record), start..c.at));
        }
        records.push(record);
    }
    Some((records, spans))
}

/// The last timestamp read, so that the many records sharing one (a
/// bundle's records were all written at one instant) parse it once.
#[derive(Default)]
struct Times<'a> {
    last: Option<(&'a str, OffsetDateTime)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Steps over `text` if it comes next.
    fn lit(&mut self, text: &[u8]) -> Option<()> {
        self.b[self.at..].starts_with(text).then(|| {
            self.at += text.len();
        })
    }

    /// A JSON string that holds nothing serde_json escapes (a quote, a
    /// backslash, a control character), so that its text is exactly what
    /// serde_json writes for it.
    fn string(&mut self) -> Option<&'a str> {
        self.lit(b"\"")?;
        let rest = &self.b[self.at..];
        let end = memchr::memchr2(b'"', b'\\', rest)?;
        if rest[end] != b'"' {
            return None;
        }
        // Without an early exit, so that the loop is vectorised.
        if rest[..end]
            .iter()
            .fold(false, |control, &c| control | (c < 0x20))
        {
            return None;
        }
        let text = std::str::from_utf8(&rest[..end]).ok()?;
        self.at += end + 1;
        Some(text)
    }

    /// A number as serde_json writes a u64: digits, no leading zero.
    fn number(&mut self) -> Option<u64> {
        let digits = self.b[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let text = &self.b[self.at..self.at + digits];
        if digits == 0 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        let mut n: u64 = 0;
        for &d in text {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        }
        self.at += digits;
        Some(n)
    }

    fn time(&mut self) -> Option<OffsetDateTime> {
        canonical_time(self.string()?)
    }

    /// A timestamp, through `times`.
    fn time_in(&mut self, times: &mut Times<'a>) -> Option<OffsetDateTime> {
        let text = self.string()?;
        if let Some((last, t)) = times.last
            && last == text
        {
            return Some(t);
        }
        let t = canonical_time(text)?;
        times.last = Some((text, t));
        Some(t)
    }

    /// One record, as `push_record_text` lays it out.
    fn record(&mut self, times: &mut Times<'a>) -> Option<RecordText<'a>> {
        self.lit(b"{\n      \"path\": ")?;
        let path = RelPath::parse(self.string()?).ok()?;
        self.lit(b",\n      \"pipeline_id\": ")?;
        let pipeline_id = self.string()?;
        self.lit(b",\n      \"destination_id\": ")?;
        let destination_id = self.string()?;
        self.lit(b",\n      \"source\": {\n        \"id\": ")?;
        let id = self.string()?;
        self.lit(b",\n        \"digest\": ")?;
        let digest = self.string()?;
        self.lit(b",\n        \"created\": ")?;
        let created = self.time_in(times)?;
        self.lit(b"\n      },\n      \"kind\": ")?;
        let kind = match self.string()? {
            "source" => OutputKind::Source,
            "generated" => OutputKind::Generated,
            _ => return None,
        };
        let optional = |cursor: &mut Cursor<'a>, key: &[u8]| match cursor.lit(key) {
            Some(()) => cursor.string().map(Some),
            None => Some(None),
        };
        let source_path = match optional(self, b",\n      \"source_path\": ")? {
            Some(text) => Some(RelPath::parse(text).ok()?),
            None => None,
        };
        let transform = optional(self, b",\n      \"transform\": ")?.map(str::to_owned);
        let url = optional(self, b",\n      \"url\": ")?.map(str::to_owned);
        self.lit(b",\n      \"sha256\": ")?;
        let sha256 = self.string()?;
        self.lit(b",\n      \"size\": ")?;
        let size = self.number()?;
        self.lit(b",\n      \"created_at\": ")?;
        let created_at = self.time_in(times)?;
        self.lit(b",\n      \"updated_at\": ")?;
        let updated_at = self.time_in(times)?;
        self.lit(b"\n    }")?;
        Some(RecordText {
            path,
            pipeline_id: Cow::Borrowed(pipeline_id),
            destination_id: Cow::Borrowed(destination_id),
            source: SourceText {
                id: Cow::Borrowed(id),
                digest: Cow::Borrowed(digest),
                created,
            },
            kind,
            source_path,
            transform,
            url,
            sha256: Cow::Borrowed(sha256),
            size,
            created_at,
            updated_at,
        })
    }
}

/// A timestamp in exactly the form [`super::format_time`] writes
/// (`YYYY-MM-DDTHH:MM:SS`, a fraction of 1 to 9 digits without trailing
/// zeros when not whole, `Z`), so that formatting it again gives the same
/// text; `None` for any other text, valid or not.
fn canonical_time(text: &str) -> Option<OffsetDateTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        b[range].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let separators = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')];
    if separators.iter().any(|&(at, c)| b[at] != c) {
        return None;
    }
    let nanos = match &b[19..b.len() - 1] {
        [] => 0,
        [b'.', fraction @ ..]
            if (1..=9).contains(&fraction.len()) && fraction.last() != Some(&b'0') =>
        {
            let n = digits(20..b.len() - 1)?;
            n * 10u32.pow(9 - fraction.len() as u32)
        }
        _ => return None,
    };
    let year = i32::try_from(digits(0..4)?).ok()?;
    let month = time::Month::try_from(u8::try_from(digits(5..7)?).ok()?).ok()?;
    let date =
        time::Date::from_calendar_date(year, month, u8::try_from(digits(8..10)?).ok()?).ok()?;
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    // A leap second (60) is read by the RFC 3339 parser as another instant.
    if second > 59 {
        return None;
    }
    let time = time::Time::from_hms_nano(
        u8::try_from(hour).ok()?,
        u8::try_from(minute).ok()?,
        u8::try_from(second).ok()?,
        nanos,
    )
    .ok()?;
    Some(time::PrimitiveDateTime::new(date, time).assume_utc())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{State, format_time, parse_time};

    #[test]
    fn a_timestamp_is_read_here_only_in_the_form_it_is_written() {
        for text in [
            "2026-06-04T12:00:00Z",
            "2026-06-04T12:00:00.5Z",
            "2026-06-04T12:00:00.123456789Z",
            "2026-06-04T12:00:00.001Z",
            "0000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999999Z",
            "2024-02-29T00:00:00Z",
        ] {
            let t = canonical_time(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(Ok(t), parse_time(text), "{text}");
            assert_eq!(format_time(t), text);
        }
        for text in [
            // Valid RFC 3339, but not as written: the general reader's.
            "2026-06-04T12:00:00.50Z",
            "2026-06-04T12:00:00.0Z",
            "2026-06-04T12:00:00+00:00",
            "2026-06-04T12:00:00z",
            "2026-06-04t12:00:00Z",
            "2026-06-04T12:00:00.1234567891Z",
            "2026-06-04T23:59:60Z",
            // Not a timestamp at all.
            "2026-02-30T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-06-04T24:00:00Z",
            "2026-06-04T12:60:00Z",
            "2026-06-04T12:00:0Z",
            "+2026-06-04T12:00:00Z",
            "2026-06-04T12:00:00.Z",
            "2026-06-04 12:00:00Z",
            "",
        ] {
            assert_eq!(canonical_time(text), None, "{text}");
        }
    }

    /// The catalog of the crate's seed text.
    fn seed() -> Catalog {
        let State::Catalog(c) = State::classify(super::super::tests::SEED_V4.as_bytes()) else {
            panic!("seed must be a valid catalog");
        };
        c
    }

    /// Reads `text` both ways: this reader (when it answers) and serde
    /// must give the same catalog.
    fn agrees(text: &str) -> bool {
        let fast = read(text.as_bytes(), true);
        // Read in any number of parts, the same answer.
        for parts in 1..=4 {
            assert_eq!(
                read_in_parts(text.as_bytes(), true, Some(parts)),
                fast,
                "{parts} parts: {text}"
            );
        }
        let slow = State::classify(text.as_bytes());
        match fast {
            Some((catalog, spans)) => {
                assert_eq!(slow, State::Catalog(catalog.clone()), "{text}");
                // Each span is the record's text as this tool writes it.
                let mut written = Vec::new();
                catalog.write_json(&mut written).unwrap();
                assert_eq!(written, text.as_bytes());
                for (r, (key, span)) in catalog.outputs.iter().zip(&spans) {
                    assert_eq!(*key, Fingerprints::default().key(r));
                    let mut own = Vec::new();
                    super::super::push_record_text(r, &mut own);
                    assert_eq!(&text.as_bytes()[span.clone()], &own[..]);
                }
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_catalog_as_written_is_read_here_and_anything_else_by_serde() {
        let c = seed();
        let written = String::from_utf8(c.to_json()).unwrap();
        assert!(agrees(&written), "as written");
        let empty = String::from_utf8(Catalog::new(c.created_at).to_json()).unwrap();
        assert!(agrees(&empty), "empty");
        let mut no_version = c.clone();
        no_version.distributor_version = None;
        assert!(agrees(&String::from_utf8(no_version.to_json()).unwrap()));
        // Each of these is another layout or fails a check: serde reads it.
        for (what, from, to) in [
            ("escaped path", "\"path\": \"", "\"path\": \"\\u0061"),
            ("compact", ",\n      \"pipeline_id\"", ",\"pipeline_id\""),
            (
                "offset",
                "Z\",\n      \"updated_at\"",
                "+00:00\",\n      \"updated_at\"",
            ),
            ("trailing space", "}\n", "} \n"),
            ("no final newline", "]\n}\n", "]\n}"),
            ("leading zero", "\"size\": ", "\"size\": 0"),
            ("unknown kind", "\"kind\": \"", "\"kind\": \"x"),
            ("reserved path", "\"path\": \"", "\"path\": \".distributor-"),
            (
                "bad digest",
                "\"sha256\": \"sha256:",
                "\"sha256\": \"sha256:X",
            ),
            ("mode", "\"mode\": \"catalog\"", "\"mode\": \"other\""),
            ("schema", "\"schema_version\": 4", "\"schema_version\": 5"),
        ] {
            assert!(written.contains(from), "{what}");
            let edited = written.replacen(from, to, 1);
            assert!(!agrees(&edited), "{what}: read here");
        }
    }

    #[test]
    fn a_catalog_read_in_parts_is_read_as_whole() {
        let mut c = seed();
        let template = c.outputs[0].clone();
        c.outputs = (0..12)
            .map(|i| {
                let mut r = template.clone();
                r.path = RelPath::parse(&format!("d/{i:02}.html")).unwrap();
                r
            })
            .collect();
        let written = String::from_utf8(c.to_json()).unwrap();
        let between = std::str::from_utf8(BETWEEN_RECORDS).unwrap();
        assert_eq!(written.matches(between).count(), 11);
        assert!(agrees(&written));
        let (whole, _) = read_in_parts(written.as_bytes(), false, Some(1)).unwrap();
        let (parts, _) = read_in_parts(written.as_bytes(), false, Some(4)).unwrap();
        assert_eq!(parts, whole);
        assert_eq!(cuts(written.as_bytes(), 0, written.len(), 4).len(), 3);
        // Another layout where a part would start or end: serde reads it,
        // however many parts.
        for (what, to) in [
            ("brace indented", "\n     },\n    {\n      \"path\": "),
            ("space before comma", "\n    } ,\n    {\n      \"path\": "),
            ("record on one line", "\n    },\n    {\"path\": "),
        ] {
            for n in [1, 5, 6, 10] {
                let at = written.match_indices(between).nth(n).unwrap().0;
                let edited = format!("{}{to}{}", &written[..at], &written[at + between.len()..]);
                assert!(!agrees(&edited), "{what} at boundary {n}: read here");
            }
        }
    }

    #[test]
    fn records_written_twice_are_refused_as_by_serde() {
        let mut c = seed();
        let first = c.outputs[0].clone();
        c.outputs.push(first);
        let text = String::from_utf8(c.to_json()).unwrap();
        assert!(read(text.as_bytes(), true).is_none());
        assert!(matches!(
            State::parse(text.as_bytes()),
            State::Invalid { .. }
        ));
    }

    proptest::proptest! {
        /// Any catalog this tool writes (paths and urls with any character
        /// the contract allows, timestamps with any fraction) is read the
        /// same here as by serde, when read here at all.
        #[test]
        fn any_catalog_reads_the_same_here_as_by_serde(
            parts in proptest::collection::vec(
                ("[a-z\"\\ é😀\t\u{7f}\u{2028}#%?]{1,12}", 0u64..u64::MAX, 0u32..1_000_000_000, proptest::bool::ANY),
                0..6,
            ),
        ) {
            let mut c = seed();
            let template = c.outputs[0].clone();
            c.outputs.clear();
            for (i, (name, size, nanos, url)) in parts.into_iter().enumerate() {
                let Ok(path) = RelPath::parse(&format!("d{i}/{name}")) else {
                    continue;
                };
                let mut r = template.clone();
                // Quotes and backslashes are escaped: read by serde alone.
                r.url = url.then(|| format!("https://example.org/{i}?q=\"{}\"", size % 7));
                r.path = path;
                r.size = size;
                r.updated_at = r.updated_at.replace_nanosecond(nanos).unwrap();
                c.outputs.push(r);
            }
            c.sort();
            let text = String::from_utf8(c.to_json()).unwrap();
            agrees(&text);
            assert_eq!(State::classify(text.as_bytes()), State::Catalog(c));
        }
    }
}
