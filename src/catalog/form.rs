//! The catalog as its file holds it: the one table of its fields.
//!
//! [`Document`], [`Mode`], [`RecordText`] and [`SourceText`] list every
//! key of a v4 catalog once, in the order the file has them, with their
//! type and whether they may be absent. Every codec is derived from these
//! serde declarations: the strict reader, whole or streamed (`read`), and
//! the document writer (`write`) are serde_json over them; the record
//! writer (`write::Laying`) and the fast reader of this tool's own layout
//! (`layout::Laid`) are small serde serializer and deserializer of that
//! one layout, which know no field by name. Adding a field is a change
//! here and in the model ([`OutputRecord`]); the compiler then asks for
//! it in the two conversions ([`RecordText::of`], [`Shared::record`]) and
//! in the fingerprint (`texts::Fingerprints::key`).
//!
//! Owns the text form and its conversion from the compact record; the
//! checks a record read must pass are the model's ([`super::model`]).
//! Nothing here does I/O.

use super::model::{OutputKind, OutputRecord, Shared, SourceIdentity};
use crate::paths::RelPath;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use time::OffsetDateTime;

/// The whole file, its records as `O`: `&[OutputRecord]` when written, the
/// records checked as they are read when read (`read`), or where they are
/// when laid out as written (`layout`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Document<'a, O> {
    /// Checked (against [`super::SCHEMA_VERSION`]) by whoever reads it.
    pub schema_version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributor_version: Option<Cow<'a, str>>,
    #[serde(with = "instant")]
    pub created_at: OffsetDateTime,
    #[serde(with = "instant")]
    pub updated_at: OffsetDateTime,
    pub state: Mode<'a>,
    pub outputs: O,
}

/// `state`: always `{"mode": "catalog"}` in schema 4.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Mode<'a> {
    pub mode: Cow<'a, str>,
}

/// An output record as the file holds it: every field its own text.
/// Records are read through this form (strictly, every check with its
/// message, [`Shared::record`]) and turned into the compact
/// [`OutputRecord`] one at a time, and written from it
/// ([`RecordText::of`]). Read from memory, its ids and digests borrow the
/// file's text (one record is checked and made compact before the next is
/// read, so no allocation is made for text the compact record does not
/// keep).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RecordText<'a> {
    #[serde(deserialize_with = "path::one")]
    pub path: Cow<'a, RelPath>,
    #[serde(borrow)]
    pub pipeline_id: Cow<'a, str>,
    #[serde(borrow)]
    pub destination_id: Cow<'a, str>,
    #[serde(borrow)]
    pub source: SourceText<'a>,
    pub kind: OutputKind,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "path::optional"
    )]
    pub source_path: Option<Cow<'a, RelPath>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub sha256: Cow<'a, str>,
    pub size: u64,
    #[serde(with = "instant")]
    pub created_at: OffsetDateTime,
    #[serde(with = "instant")]
    pub updated_at: OffsetDateTime,
}

/// [`SourceIdentity`] as the file holds it, borrowing like [`RecordText`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SourceText<'a> {
    #[serde(borrow)]
    pub id: Cow<'a, str>,
    #[serde(borrow)]
    pub digest: Cow<'a, str>,
    #[serde(with = "instant")]
    pub created: OffsetDateTime,
}

impl<'a> RecordText<'a> {
    /// The text form of `r`, borrowed; its digest's text is written into
    /// `digest` (no allocation).
    pub fn of(r: &'a OutputRecord, digest: &'a mut [u8; 71]) -> RecordText<'a> {
        RecordText {
            path: Cow::Borrowed(&r.path),
            pipeline_id: Cow::Borrowed(&r.pipeline_id),
            destination_id: Cow::Borrowed(&r.destination_id),
            source: SourceText::of(&r.source),
            kind: r.kind,
            source_path: r.source_path.as_ref().map(Cow::Borrowed),
            transform: r.transform.map(Cow::Borrowed),
            url: r.url.as_deref().map(Cow::Borrowed),
            sha256: Cow::Borrowed(r.sha256.write_text(digest)),
            size: r.size,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

impl<'a> SourceText<'a> {
    fn of(s: &'a SourceIdentity) -> SourceText<'a> {
        SourceText {
            id: Cow::Borrowed(&s.id),
            digest: Cow::Borrowed(&s.digest),
            created: s.created,
        }
    }
}

impl Serialize for OutputRecord {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RecordText::of(self, &mut [0; 71]).serialize(s)
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

/// Timestamps of the file: RFC 3339 text, as [`super::rfc3339`] (the same
/// text, the same errors), formatted without allocating. Each is a
/// newtype named [`instant::TOKEN`], which serde_json sees through; the
/// record writer (`write::Laying`) and the fast reader (`layout`) know
/// it, and pass the instant itself, its fields packed into an `i128`
/// ([`instant::pack`]): the writer formats it straight into its buffer,
/// the reader hands over one it has read and checked itself.
pub(super) mod instant {
    use super::super::{format_time, parse_time};
    use serde::{Deserializer, Serializer, de};
    use std::borrow::Cow;
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;

    /// The newtype name the fast reader knows a timestamp by.
    pub const TOKEN: &str = "$distributor::catalog::instant";

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_struct(TOKEN, &Stamp(*t))
    }

    /// An instant as serde_json writes it (its text, as `format_time`), or
    /// packed ([`pack`]) for a serializer that is not human-readable: the
    /// record writer (`write::Laying`), which formats it itself.
    struct Stamp(OffsetDateTime);

    impl serde::Serialize for Stamp {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            if !s.is_human_readable() {
                return s.serialize_i128(pack(self.0));
            }
            let mut text = Text::default();
            let utc = self.0.to_offset(time::UtcOffset::UTC);
            if utc.format_into(&mut text, &Rfc3339).is_err() {
                // As format_time: the seconds when RFC 3339 cannot say it.
                return s.serialize_str(&format_time(self.0));
            }
            s.serialize_str(std::str::from_utf8(&text.bytes[..text.len]).unwrap_or_default())
        }
    }

    /// A timestamp's text, on the stack (the count `format_into` returns
    /// is not the length for every fraction: this keeps its own).
    struct Text {
        bytes: [u8; 64],
        len: usize,
    }

    impl Default for Text {
        fn default() -> Text {
            Text {
                bytes: [0; 64],
                len: 0,
            }
        }
    }

    impl std::io::Write for Text {
        fn write(&mut self, more: &[u8]) -> std::io::Result<usize> {
            self.write_all(more).map(|()| more.len())
        }

        fn write_all(&mut self, more: &[u8]) -> std::io::Result<()> {
            let end = self.len + more.len();
            let room = self.bytes.get_mut(self.len..end);
            room.ok_or_else(|| std::io::Error::other("too long"))?
                .copy_from_slice(more);
            self.len = end;
            Ok(())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        d.deserialize_newtype_struct(TOKEN, Visit)
    }

    struct Visit;

    impl<'de> de::Visitor<'de> for Visit {
        type Value = OffsetDateTime;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an RFC 3339 timestamp")
        }

        fn visit_newtype_struct<D: Deserializer<'de>>(
            self,
            d: D,
        ) -> Result<OffsetDateTime, D::Error> {
            let text = <Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
            parse_time(&text).map_err(de::Error::custom)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<OffsetDateTime, E> {
            parse_time(text).map_err(E::custom)
        }

        fn visit_i128<E: de::Error>(self, packed: i128) -> Result<OffsetDateTime, E> {
            unpack(packed).map_err(E::custom)
        }
    }

    /// A UTC instant's fields in one number (no division either way, as
    /// there would be through nanoseconds since the epoch).
    pub fn pack(t: OffsetDateTime) -> i128 {
        let t = t.to_offset(time::UtcOffset::UTC);
        (i128::from(t.year()) << 80)
            | (i128::from(t.ordinal()) << 64)
            | (i128::from(t.hour()) << 48)
            | (i128::from(t.minute()) << 40)
            | (i128::from(t.second()) << 32)
            | i128::from(t.nanosecond())
    }

    pub fn unpack(packed: i128) -> Result<OffsetDateTime, time::error::ComponentRange> {
        let field = |shift: u32, bits: u32| (packed >> shift) & ((1 << bits) - 1);
        let date = time::Date::from_ordinal_date((packed >> 80) as i32, field(64, 16) as u16)?;
        let time = time::Time::from_hms_nano(
            field(48, 8) as u8,
            field(40, 8) as u8,
            field(32, 8) as u8,
            field(0, 32) as u32,
        )?;
        Ok(time::PrimitiveDateTime::new(date, time).assume_utc())
    }
}

/// Paths of the file: [`RelPath`]'s own text and errors, read from the
/// text as the deserializer lends it (`RelPath`'s own deserializer first
/// makes a `String` of it, then copies it).
mod path {
    use crate::paths::RelPath;
    use serde::{Deserialize, Deserializer, de};
    use std::borrow::Cow;

    pub fn one<'de, 'a, D: Deserializer<'de>>(d: D) -> Result<Cow<'a, RelPath>, D::Error> {
        Parsed::deserialize(d).map(|p| Cow::Owned(p.0))
    }

    pub fn optional<'de, 'a, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Cow<'a, RelPath>>, D::Error> {
        Option::<Parsed>::deserialize(d).map(|p| p.map(|p| Cow::Owned(p.0)))
    }

    struct Parsed(RelPath);

    impl<'de> Deserialize<'de> for Parsed {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Parsed, D::Error> {
            d.deserialize_str(Visit)
        }
    }

    struct Visit;

    impl de::Visitor<'_> for Visit {
        type Value = Parsed;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Parsed, E> {
            RelPath::parse(text)
                .map(Parsed)
                .map_err(|e| E::custom(format!("invalid path {text:?}: {e}")))
        }
    }
}
