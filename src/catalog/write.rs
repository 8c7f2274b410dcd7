//! Writing a catalog: deterministic pretty JSON (serde_json's pretty form
//! of [`form::Document`], final newline included), every record's text
//! either formatted or taken from an earlier read or write
//! ([`RecordTexts`]) with the very same bytes.
//!
//! Writes into any `std::io::Write` it is handed; it never opens, syncs or
//! renames a file (the backends do, through `storage`).

use super::SCHEMA_VERSION;
use super::form::{self, Document, Mode, RecordText, instant};
use super::format_time;
use super::model::{Catalog, OutputRecord};
use super::texts::{RecordTexts, Reuse, SEPARATOR, Span};
use serde::Serialize;
use serde::ser::Impossible;
use std::borrow::Cow;
use time::format_description::well_known::Rfc3339;

impl Catalog {
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
        document(self, &[]).write(&mut head)?;
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

    /// Streams the pretty JSON (final newline included) into `w`, without
    /// building the document in memory first.
    pub fn write_json(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let mut buffered = std::io::BufWriter::with_capacity(64 * 1024, w);
        document(self, &self.outputs).write(&mut buffered)?;
        std::io::Write::flush(&mut buffered)
    }
}

/// The text form of `c`'s header, with `outputs` as its records.
fn document<'a>(c: &'a Catalog, outputs: &'a [OutputRecord]) -> Document<'a, &'a [OutputRecord]> {
    Document {
        schema_version: SCHEMA_VERSION,
        distributor_version: c.distributor_version.as_deref().map(Cow::Borrowed),
        created_at: c.created_at,
        updated_at: c.updated_at,
        state: Mode {
            mode: Cow::Borrowed("catalog"),
        },
        outputs,
    }
}

impl form::Document<'_, &[OutputRecord]> {
    /// serde_json's pretty form and a final newline.
    fn write(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *w, self).map_err(std::io::Error::from)?;
        w.write_all(b"\n")
    }
}

/// Appends the text of one record exactly as [`Catalog::write_json`] lays
/// it out in the document: serde_json's pretty form at the third level
/// (lines after the first indented by six spaces, the closing brace by
/// four), written by [`Laying`] from the fields of [`RecordText`]. A test
/// checks it against the record in the document. `stamps` keeps the text
/// of the timestamps laid out last, for the records that follow.
pub(super) fn push_record_text(r: &OutputRecord, out: &mut Vec<u8>, stamps: &mut Stamps) {
    // Only a struct of strings, numbers, unit variants and structs is
    // laid out; a record is nothing else.
    let _ = RecordText::of(r, &mut [0; 71]).serialize(Laying {
        out,
        stamps,
        depth: 2,
        instant: false,
    });
}

/// The last few timestamps [`Laying`] formatted, each as its packed
/// instant ([`instant::pack`]) and its quoted text, so that the many
/// records sharing them (a bundle's records have one source, and were
/// written at one instant) format each of them once.
#[derive(Default)]
pub(super) struct Stamps {
    /// Packed instant, length of the text (0: an empty place), text (a
    /// longer one than the longest RFC 3339 text is not kept).
    known: [(i128, usize, [u8; 32]); 4],
    /// Where in `known` the next new timestamp goes.
    next: usize,
}

/// A serde serializer of serde_json's pretty layout for a struct `depth`
/// levels into a document, writing each key with its line in one piece
/// (serde_json's own pretty serializer takes many small writes for it,
/// which is most of formatting a record). Strings are escaped by
/// serde_json. Knows no field by name.
struct Laying<'o> {
    out: &'o mut Vec<u8>,
    stamps: &'o mut Stamps,
    depth: usize,
    /// Inside a timestamp's newtype: not human-readable, so that the
    /// timestamp hands over its instant rather than its text.
    instant: bool,
}

/// What [`Laying`] does not lay out.
#[derive(Debug)]
struct NotLaid;

impl std::fmt::Display for NotLaid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a value a catalog holds")
    }
}

impl std::error::Error for NotLaid {}

impl serde::ser::Error for NotLaid {
    fn custom<T: std::fmt::Display>(_: T) -> NotLaid {
        NotLaid
    }
}

/// Serializer methods for what [`Laying`] does not lay out: each fails.
macro_rules! not_laid {
    ($($name:ident $(<$t:ident>)? ($($arg:ty),*) -> $ok:ty;)*) => {
        $(
            fn $name $(<$t: ?Sized + Serialize>)? (self, $(_: $arg),*) -> Result<$ok, NotLaid> {
                Err(NotLaid)
            }
        )*
    };
}

/// A comma, a line break and up to 16 levels of indentation.
const LINE: &[u8; 34] = b",\n                                ";

impl<'o> serde::Serializer for Laying<'o> {
    type Ok = ();
    type Error = NotLaid;
    type SerializeSeq = Impossible<(), NotLaid>;
    type SerializeTuple = Impossible<(), NotLaid>;
    type SerializeTupleStruct = Impossible<(), NotLaid>;
    type SerializeTupleVariant = Impossible<(), NotLaid>;
    type SerializeMap = Impossible<(), NotLaid>;
    type SerializeStruct = Fields<'o>;
    type SerializeStructVariant = Impossible<(), NotLaid>;

    fn serialize_str(self, v: &str) -> Result<(), NotLaid> {
        // Most strings hold nothing to escape (the check is vectorised,
        // without an early exit; serde_json's escaping goes byte by byte).
        let plain = !v.as_bytes().iter().fold(false, |escape, &c| {
            escape | (c == b'"') | (c == b'\\') | (c < 0x20)
        });
        if !plain {
            return serde_json::to_writer(&mut *self.out, v).map_err(|_| NotLaid);
        }
        self.out.reserve(v.len() + 2);
        self.out.push(b'"');
        self.out.extend_from_slice(v.as_bytes());
        self.out.push(b'"');
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result<(), NotLaid> {
        serde_json::to_writer(&mut *self.out, &v).map_err(|_| NotLaid)
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
    ) -> Result<(), NotLaid> {
        self.serialize_str(name)
    }

    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<(), NotLaid> {
        v.serialize(self)
    }

    /// A timestamp ([`instant::TOKEN`]) is asked for as its packed
    /// instant, formatted here (`serialize_i128`).
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        name: &'static str,
        v: &T,
    ) -> Result<(), NotLaid> {
        let instant = name == instant::TOKEN;
        v.serialize(Laying { instant, ..self })
    }

    fn is_human_readable(&self) -> bool {
        !self.instant
    }

    /// An instant ([`instant::pack`]), as [`format_time`] writes it,
    /// through [`Stamps`].
    fn serialize_i128(self, packed: i128) -> Result<(), NotLaid> {
        if !self.instant {
            return Err(NotLaid);
        }
        let stamps = &mut *self.stamps;
        if let Some((_, len, text)) = stamps
            .known
            .iter()
            .find(|(p, len, _)| *p == packed && *len > 0)
        {
            self.out.extend_from_slice(&text[..*len]);
            return Ok(());
        }
        let t = instant::unpack(packed).map_err(|_| NotLaid)?;
        let start = self.out.len();
        self.out.push(b'"');
        if t.format_into(&mut *self.out, &Rfc3339).is_err() {
            self.out.truncate(start + 1);
            self.out.extend_from_slice(format_time(t).as_bytes());
        }
        self.out.push(b'"');
        let quoted = &self.out[start..];
        let (p, len, text) = &mut stamps.known[stamps.next];
        if let Some(place) = text.get_mut(..quoted.len()) {
            place.copy_from_slice(quoted);
            (*p, *len) = (packed, quoted.len());
            stamps.next = (stamps.next + 1) % stamps.known.len();
        }
        Ok(())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Fields<'o>, NotLaid> {
        self.out.push(b'{');
        Ok(Fields {
            out: self.out,
            stamps: self.stamps,
            depth: self.depth + 1,
            first: true,
        })
    }

    not_laid! {
        serialize_bool(bool) -> ();
        serialize_i8(i8) -> ();
        serialize_i16(i16) -> ();
        serialize_i32(i32) -> ();
        serialize_i64(i64) -> ();
        serialize_u8(u8) -> ();
        serialize_u16(u16) -> ();
        serialize_u32(u32) -> ();
        serialize_f32(f32) -> ();
        serialize_f64(f64) -> ();
        serialize_char(char) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_struct(&'static str) -> ();
        serialize_newtype_variant<T>(&'static str, u32, &'static str, &T) -> ();
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct_variant(&'static str, u32, &'static str, usize)
            -> Self::SerializeStructVariant;
    }
}

/// The fields of a struct being laid out, each on its own line.
struct Fields<'o> {
    out: &'o mut Vec<u8>,
    stamps: &'o mut Stamps,
    /// The depth of the fields (one more than the struct's).
    depth: usize,
    first: bool,
}

impl serde::ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = NotLaid;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), NotLaid> {
        // The comma after the field before, if any, and the key's line.
        let line = LINE
            .get(usize::from(self.first)..2 + 2 * self.depth)
            .ok_or(NotLaid)?;
        self.first = false;
        self.out.reserve(line.len() + key.len() + 4);
        self.out.extend_from_slice(line);
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\": ");
        v.serialize(Laying {
            out: &mut *self.out,
            stamps: &mut *self.stamps,
            depth: self.depth,
            instant: false,
        })
    }

    fn end(self) -> Result<(), NotLaid> {
        if !self.first {
            self.out
                .extend_from_slice(LINE.get(1..2 * self.depth).ok_or(NotLaid)?);
        }
        self.out.push(b'}');
        Ok(())
    }
}
