//! Reading a catalog laid out exactly as this tool writes it, fast.
//!
//! Almost every catalog a root holds was written by this tool, byte for
//! byte as [`Catalog::write_json`] lays it out: serde_json's pretty form of
//! the fields of `form`, in their order, strings escaped as serde_json
//! escapes them, timestamps as [`super::format_time`] formats them. Such a
//! file is read here by a serde deserializer of that layout alone ([`Laid`]),
//! driven by the same serde declarations as every other codec (so it knows
//! no field by name), which is several times faster than a general JSON
//! parser; and each record's text is then known to be exactly the text
//! this tool would write for it: the next write copies it instead of
//! formatting the record again ([`super::RecordTexts`]).
//!
//! Every record is checked as a record read by serde_json is ([`Shared`]).
//! Anything else (another layout or key order, an escaped string, a
//! timestamp with an offset, a record that fails a check) makes this
//! reader give up, and the file is read by serde_json instead, which gives
//! the same catalog or the precise error. So this reader only ever answers
//! for files that serde_json reads to the very same catalog; a test holds
//! it to that. Takes bytes; no I/O.

use super::SCHEMA_VERSION;
use super::form::{Document, RecordText, instant};
use super::model::{Catalog, OutputRecord, Shared};
use super::read::{Outputs, finish_v4};
use super::texts::Fingerprints;
use serde::Deserialize;
use serde::de::{self, IntoDeserializer, Visitor};
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
pub(super) fn read_in_parts(
    bytes: &[u8],
    texts: bool,
    parts: Option<usize>,
) -> Option<(Catalog, Spans)> {
    let mut times = Times::default();
    let mut laid = Laid::new(bytes, 0, &mut times);
    let head = Document::<RecordsAt>::deserialize(&mut laid).ok()?;
    laid.lit(b"\n")?;
    if laid.at != bytes.len() || head.schema_version != SCHEMA_VERSION {
        return None;
    }
    let (records, spans) = match laid.records {
        None => (Vec::new(), Vec::new()),
        Some((from, to)) => {
            let parts = parts.unwrap_or_else(|| parts_for(to - from));
            records_in(bytes, from, to, texts, parts)?
        }
    };
    let raw = Document {
        schema_version: head.schema_version,
        distributor_version: head.distributor_version,
        created_at: head.created_at,
        updated_at: head.updated_at,
        state: head.state,
        outputs: Outputs {
            records,
            problem: None,
        },
    };
    finish_v4(raw).ok().map(|catalog| (catalog, spans))
}

/// The `outputs` of a document read here: [`Laid`] keeps where its
/// records are, to be read apart, in parts ([`records_in`]).
struct RecordsAt;

/// The newtype name [`Laid`] knows the records' place by.
const RECORDS: &str = "$distributor::catalog::records";

impl<'de> Deserialize<'de> for RecordsAt {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<RecordsAt, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = RecordsAt;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the place of the records")
            }
            fn visit_unit<E>(self) -> Result<RecordsAt, E> {
                Ok(RecordsAt)
            }
        }
        d.deserialize_newtype_struct(RECORDS, Visit)
    }
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
/// first's when `first`), ending exactly at `to`. The part is checked to
/// be UTF-8 as a whole, in one pass, rather than string by string.
fn records_between(
    bytes: &[u8],
    from: usize,
    to: usize,
    first: bool,
    texts: bool,
    reserve: usize,
) -> Option<(Vec<OutputRecord>, Spans)> {
    let part = std::str::from_utf8(&bytes[from..to]).ok()?;
    let mut times = Times::default();
    let mut laid = Laid::text(part, &mut times);
    laid.depth = 2;
    let mut records = Vec::with_capacity(reserve);
    let mut spans = Vec::with_capacity(if texts { reserve } else { 0 });
    let mut shared = Shared::default();
    let mut fingerprints = Fingerprints::default();
    let mut separator: &[u8] = if first { b"\n    " } else { b",\n    " };
    while laid.at < part.len() {
        laid.lit(separator)?;
        separator = b",\n    ";
        let start = laid.at;
        let text = RecordText::deserialize(&mut laid).ok()?;
        let record = shared.record(text).ok()?;
        if texts {
            spans.push((fingerprints.key(&record), from + start..from + laid.at));
        }
        records.push(record);
    }
    Some((records, spans))
}

/// The last few timestamps read, each as its text in the file and its
/// packed instant ([`instant::pack`]), so that the many records sharing
/// them (a bundle's records have one source, and were written at one
/// instant) read each of them once: a timestamp whose quoted text is one
/// of these is stepped over without being read as a string again.
#[derive(Default)]
struct Times<'a> {
    known: [Option<(&'a [u8], i128)>; 4],
    /// Where in `known` the next new timestamp goes.
    next: usize,
}

/// A serde deserializer of serde_json's pretty layout as this tool writes
/// it, and of nothing else: the fields of a struct in the order it
/// declares them (an absent optional field is left out, never `null`),
/// each on its own line at its depth's indentation, strings without
/// escapes, numbers as serde_json writes a `u64`, timestamps in the form
/// `format_time` writes ([`instant::TOKEN`]). Any other text is an error
/// ([`NotLaidOut`]): the file is then read by serde_json.
struct Laid<'a, 't> {
    b: &'a [u8],
    /// `b` as text, when it is known to be UTF-8 as a whole: its strings
    /// are then not checked one by one.
    text: Option<&'a str>,
    at: usize,
    /// How many objects and arrays the value at `at` is in.
    depth: usize,
    times: &'t mut Times<'a>,
    /// Where the records are, once the document's `outputs` is met
    /// ([`RecordsAt`]).
    records: Option<(usize, usize)>,
}

/// The text is not laid out as this tool writes it (or fails a check).
#[derive(Debug)]
struct NotLaidOut;

impl std::fmt::Display for NotLaidOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not laid out as written")
    }
}

impl std::error::Error for NotLaidOut {}

impl de::Error for NotLaidOut {
    fn custom<T: std::fmt::Display>(_: T) -> NotLaidOut {
        NotLaidOut
    }
}

/// Turns `None` into [`NotLaidOut`].
fn must<T>(found: Option<T>) -> Result<T, NotLaidOut> {
    found.ok_or(NotLaidOut)
}

impl<'a, 't> Laid<'a, 't> {
    fn new(b: &'a [u8], at: usize, times: &'t mut Times<'a>) -> Laid<'a, 't> {
        Laid {
            b,
            text: None,
            at,
            depth: 0,
            times,
            records: None,
        }
    }

    /// [`Laid::new`] at the start of `text`, which is known to be UTF-8.
    fn text(text: &'a str, times: &'t mut Times<'a>) -> Laid<'a, 't> {
        Laid {
            text: Some(text),
            ..Laid::new(text.as_bytes(), 0, times)
        }
    }

    /// Steps over `text` if it comes next.
    fn lit(&mut self, text: &[u8]) -> Option<()> {
        let next = self.b.get(self.at..self.at + text.len())?;
        same(next, text).then(|| {
            self.at += text.len();
        })
    }

    /// Steps over a line break and the indentation of `depth`.
    fn line(&mut self, depth: usize) -> Option<()> {
        const LINE: &[u8; 33] = b"\n                                ";
        self.lit(LINE.get(..1 + 2 * depth)?)
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
        let text = match self.text {
            Some(all) => all.get(self.at..self.at + end)?,
            None => std::str::from_utf8(&rest[..end]).ok()?,
        };
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

    /// A timestamp in the form `format_time` writes, packed
    /// ([`instant::pack`]), through `times`.
    fn time(&mut self) -> Option<i128> {
        // A text known holds no quote: the quote after it ends the string.
        let rest = &self.b[self.at..];
        for (text, packed) in self.times.known.iter().flatten() {
            let n = text.len();
            if rest.get(n + 1) == Some(&b'"') && rest[0] == b'"' && rest[1..=n] == **text {
                self.at += n + 2;
                return Some(*packed);
            }
        }
        let text = self.string()?;
        let packed = instant::pack(canonical_time(text)?);
        let times = &mut *self.times;
        times.known[times.next] = Some((text.as_bytes(), packed));
        times.next = (times.next + 1) % times.known.len();
        Some(packed)
    }

    /// The `outputs` array of the document: `[]`, or records up to
    /// [`END`], which are not read here but kept as a place.
    fn records(&mut self) -> Option<()> {
        self.lit(b"[")?;
        if self.lit(b"]").is_some() {
            return Some(());
        }
        let end = self
            .b
            .len()
            .checked_sub(END.len())
            .filter(|&end| end > self.at && &self.b[end..] == END)?;
        self.records = Some((self.at, end));
        self.at = end;
        self.line(1)?;
        self.lit(b"]")
    }
}

impl<'de> de::Deserializer<'de> for &mut Laid<'de, '_> {
    type Error = NotLaidOut;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, NotLaidOut> {
        Err(NotLaidOut)
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, NotLaidOut> {
        v.visit_borrowed_str(must(self.string())?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, NotLaidOut> {
        self.deserialize_str(v)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, NotLaidOut> {
        self.deserialize_str(v)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, NotLaidOut> {
        v.visit_u64(must(self.number())?)
    }

    /// Present: an absent field is left out, never written `null`.
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, NotLaidOut> {
        v.visit_some(self)
    }

    /// A unit variant, as its name.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, NotLaidOut> {
        v.visit_enum(must(self.string())?.into_deserializer())
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, NotLaidOut> {
        match name {
            instant::TOKEN => v.visit_i128(must(self.time())?),
            RECORDS if self.depth == 1 => {
                must(self.records())?;
                v.visit_unit()
            }
            _ => v.visit_newtype_struct(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, NotLaidOut> {
        must(self.lit(b"{"))?;
        let depth = self.depth;
        self.depth += 1;
        let value = v.visit_map(Fields {
            laid: &mut *self,
            fields,
            next: 0,
            first: true,
        })?;
        self.depth = depth;
        must(self.line(depth))?;
        must(self.lit(b"}"))?;
        Ok(value)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u128 f32 f64 char bytes byte_buf
        unit unit_struct seq tuple tuple_struct map ignored_any
    }
}

/// The fields of a struct, each on its own line, in the order `fields`
/// lists them (any of them may be left out).
struct Fields<'x, 'a, 't> {
    laid: &'x mut Laid<'a, 't>,
    fields: &'static [&'static str],
    /// The index in `fields` of the first key that may come next.
    next: usize,
    first: bool,
}

impl<'de> de::MapAccess<'de> for Fields<'_, 'de, '_> {
    type Error = NotLaidOut;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, NotLaidOut> {
        let laid = &mut *self.laid;
        if !self.first {
            // After the last field: the line of the closing brace.
            if laid.b[laid.at..].starts_with(b"\n") {
                return Ok(None);
            }
            must(laid.lit(b","))?;
        }
        self.first = false;
        must(laid.line(laid.depth))?;
        // Keys in the declared order: each one after the one before. It
        // is handed over as its index in `fields`, which serde's derived
        // field visitors take without comparing names again.
        let rest = &laid.b[laid.at..];
        let found = self.fields[self.next..].iter().position(|f| {
            let f = f.as_bytes();
            rest.get(1..1 + f.len()).is_some_and(|key| same(key, f))
                && rest.starts_with(b"\"")
                && rest[1 + f.len()..].starts_with(b"\": ")
        });
        let at = self.next + must(found)?;
        laid.at += self.fields[at].len() + b"\"\": ".len();
        self.next = at + 1;
        seed.deserialize((at as u64).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, NotLaidOut> {
        seed.deserialize(&mut *self.laid)
    }
}

/// `a == b`, for the short texts of a layout (keys, indentation) without
/// a call to `memcmp`: two overlapping words each.
fn same(a: &[u8], b: &[u8]) -> bool {
    fn word<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
        s.get(at..at + N)
            .and_then(|w| w.try_into().ok())
            .unwrap_or([0; N])
    }
    let n = a.len();
    n == b.len()
        && match n {
            0..4 => a.iter().zip(b).all(|(x, y)| x == y),
            4..8 => {
                word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4)
            }
            8..=16 => {
                word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8)
            }
            _ => a == b,
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
    use crate::paths::RelPath;

    #[test]
    fn short_texts_compare_as_slices_do() {
        let texts: Vec<&[u8]> = vec![
            b"",
            b"a",
            b"ab",
            b"abc",
            b"abcd",
            b"abce",
            b"abcdefg",
            b"abcdefh",
            b"abcdefgh",
            b"xbcdefgh",
            b"abcdefghijklmnop",
            b"abcdefghijklmnoq",
            b"abcdefghijklmnopq",
            b"abcdefghijklmnopr",
            b"\n      ",
        ];
        for a in &texts {
            for b in &texts {
                assert_eq!(same(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

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
                    super::super::write::push_record_text(r, &mut own, &mut Default::default());
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
    fn timestamps_records_share_are_each_records_own_read_and_written() {
        // More instants than the readers and writers keep (four), met in
        // turn and again, two of them a fraction apart.
        let instants: Vec<OffsetDateTime> = [
            "2026-06-04T12:00:00Z",
            "2026-06-04T12:00:00.5Z",
            "2026-06-04T14:00:00.25+02:00",
            "1999-12-31T23:59:59.123456789Z",
            "2026-06-05T00:00:00Z",
            "2026-06-05T00:00:01Z",
        ]
        .iter()
        .map(|t| parse_time(t).unwrap())
        .collect();
        let mut c = seed();
        let template = c.outputs[0].clone();
        c.outputs = (0..14)
            .map(|i| {
                let mut r = template.clone();
                r.path = RelPath::parse(&format!("d/{i:02}.html")).unwrap();
                let mut source = (*r.source).clone();
                source.created = instants[i / 3 % 6];
                r.source = std::sync::Arc::new(source);
                r.created_at = instants[i % 6];
                r.updated_at = instants[(i * 5 + 1) % 6];
                r
            })
            .collect();
        let written = c.to_json();
        let mut formatted = Vec::new();
        c.write_json_reusing(&mut formatted, None).unwrap();
        assert_eq!(
            String::from_utf8(formatted).unwrap(),
            String::from_utf8(written.clone()).unwrap()
        );
        assert!(agrees(std::str::from_utf8(&written).unwrap()));
        let (read, _) = read(&written, false).unwrap();
        assert_eq!(read, c);
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
