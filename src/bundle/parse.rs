//! The strict `manifest.json` parser (docs/contract.md §3): every field checked while it
//! is read, the file list and the digest checked after. Parses bytes only; it
//! never opens a file.

use super::error::BundleError;
use super::manifest::{Manifest, ManifestFile, compute_digest, normalise_created};
use super::{MANIFEST, SCHEMA_VERSION};
use crate::paths::{IdKind, RelPath, check_id, is_sha256_digest};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::collections::{BTreeSet, HashSet};
use std::fmt;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Parses `manifest.json` strictly (docs/contract.md §3): every field is checked, the
/// file list must be non-empty, unique and free of folder/file clashes, and
/// the digest must match the list. Unknown top-level keys are ignored;
/// unknown keys inside a file entry are errors.
/// The caller caps how much it reads (see [`super::Limits::max_manifest_bytes`]).
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, BundleError> {
    if bytes.starts_with(b"\xEF\xBB\xBF") {
        return Err(BundleError::manifest_at(
            1,
            1,
            "starts with a UTF-8 byte-order mark; save the file as UTF-8 without one",
        ));
    }
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let at = e.valid_up_to();
            let before = &bytes[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = at
                - before
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1)
                + 1;
            return Err(BundleError::manifest_at(
                line,
                column,
                format!(
                    "not UTF-8 text (byte 0x{:02x} starts an invalid sequence); save the file as UTF-8",
                    bytes[at]
                ),
            ));
        }
    };
    let Object(raw) = serde_json::from_str::<Object<RawManifest>>(text).map_err(json_error)?;
    let files: Vec<ManifestFile> = raw.files.into_iter().map(ManifestFile::from).collect();
    check_file_list(&files)?;
    let computed = compute_digest(&files);
    if computed != raw.digest {
        return Err(BundleError::manifest(format!(
            "\"digest\" is {} but the listed files give {computed}; recompute it from the \"files\" list (see docs/producers.md) or re-run `distributor bundle seal`",
            raw.digest
        )));
    }
    Ok(Manifest {
        id: raw.id,
        created: raw.created,
        digest: raw.digest,
        files,
    })
}

pub(super) fn too_big(len: u64, cap: u64) -> BundleError {
    BundleError::manifest(format!(
        "is {len} bytes, more than the {cap} bytes read at most (256 bytes for each of limits.max_files); split the bundle into smaller ones"
    ))
}

/// Duplicate paths and paths that are both a file and a folder (docs/contract.md §2).
fn check_file_list(files: &[ManifestFile]) -> Result<(), BundleError> {
    let mut seen: HashSet<&str> = HashSet::with_capacity(files.len());
    let mut duplicates = BTreeSet::new();
    for f in files {
        if !seen.insert(f.path.as_str()) {
            duplicates.insert(f.path.as_str());
        }
    }
    let mut messages: Vec<String> = duplicates
        .into_iter()
        .map(|p| format!("\"{p}\" is listed more than once; list each file once"))
        .collect();
    let mut clashes = BTreeSet::new();
    for f in files {
        for folder in f.path.ancestors() {
            if seen.contains(folder) {
                clashes.insert((folder, f.path.as_str()));
            }
        }
    }
    messages.extend(clashes.into_iter().map(|(folder, inner)| {
        format!("\"{folder}\" is listed as a file but \"{inner}\" needs it to be a folder")
    }));
    if messages.is_empty() {
        Ok(())
    } else {
        Err(BundleError::manifest(messages.join("; ")))
    }
}

fn json_error(e: serde_json::Error) -> BundleError {
    let (line, column) = (e.line(), e.column());
    let text = e.to_string();
    let suffix = format!(" at line {line} column {column}");
    let bare = text.strip_suffix(&suffix).unwrap_or(&text);
    let message = match e.classify() {
        serde_json::error::Category::Syntax if bare == "recursion limit exceeded" => {
            "nested more than 128 levels deep; a manifest never needs that".to_owned()
        }
        serde_json::error::Category::Syntax => format!("not valid JSON: {bare}"),
        serde_json::error::Category::Eof => format!("not valid JSON: the text ends early ({bare})"),
        serde_json::error::Category::Data | serde_json::error::Category::Io => bare.to_owned(),
    };
    if line == 0 {
        BundleError::manifest(message)
    } else {
        BundleError::manifest_at(line, column, message)
    }
}

/// Accepts `T` only when written as a JSON object: serde's derived structs
/// would also take a positional array, which is not the manifest format.
struct Object<T>(T);

/// What an [`Object`] says it expected when it got something else.
trait Expecting {
    const EXPECTING: &'static str;
}

impl<'de, T: serde::Deserialize<'de> + Expecting> serde::Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: serde::Deserialize<'de> + Expecting> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(T::EXPECTING)
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_map(ObjectVisitor(std::marker::PhantomData))
            .map(Object)
    }
}

impl Expecting for RawManifest {
    const EXPECTING: &'static str =
        "a JSON object with \"schema_version\", \"id\", \"created\", \"digest\" and \"files\"";
}

impl Expecting for RawFile {
    const EXPECTING: &'static str =
        "a file entry: an object with \"path\", \"sha256\" and \"size\"";
}

#[derive(serde::Deserialize)]
struct RawManifest {
    #[serde(rename = "schema_version", deserialize_with = "de_schema_version")]
    _schema_version: u64,
    #[serde(deserialize_with = "de_id")]
    id: String,
    #[serde(deserialize_with = "de_created")]
    created: OffsetDateTime,
    #[serde(deserialize_with = "de_digest")]
    digest: String,
    #[serde(deserialize_with = "de_files")]
    files: Vec<RawFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(deserialize_with = "de_path")]
    path: RelPath,
    #[serde(deserialize_with = "de_file_sha256")]
    sha256: String,
    #[serde(deserialize_with = "de_size")]
    size: u64,
}

impl From<RawFile> for ManifestFile {
    fn from(raw: RawFile) -> ManifestFile {
        ManifestFile {
            path: raw.path,
            sha256: raw.sha256,
            size: raw.size,
        }
    }
}

/// A JSON string, with the field name in the "expected" part of type errors.
struct Text(&'static str);

impl Visitor<'_> for Text {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string for \"{}\"", self.0)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
}

fn de_text<'de, D: Deserializer<'de>>(d: D, field: &'static str) -> Result<String, D::Error> {
    d.deserialize_str(Text(field))
}

fn de_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let id = de_text(d, "id")?;
    check_id(IdKind::Source, &id).map_err(|e| de::Error::custom(format!("\"id\": {e}")))?;
    Ok(id)
}

fn de_created<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
    let text = de_text(d, "created")?;
    let parsed = OffsetDateTime::parse(&text, &Rfc3339).map_err(|e| {
        de::Error::custom(format!(
            "\"created\" {text:?} is not an RFC 3339 timestamp such as 2026-06-04T11:55:00Z ({e})"
        ))
    })?;
    normalise_created(parsed)
        .map_err(|e| de::Error::custom(format!("\"created\" {text:?} cannot be used: {e}")))
}

/// Checks a `sha256:<hex>` value, telling uppercase hex apart from other
/// mistakes because it is the common one.
fn check_sha256(field: &str, value: &str) -> Result<(), String> {
    if is_sha256_digest(value) {
        return Ok(());
    }
    let uppercase = value.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
            && hex.bytes().any(|b| b.is_ascii_uppercase())
    });
    if uppercase {
        Err(format!(
            "\"{field}\" {value:?} uses uppercase hex digits; write them in lowercase"
        ))
    } else {
        Err(format!(
            "\"{field}\" {value:?} is not \"sha256:\" followed by 64 lowercase hex digits"
        ))
    }
}

fn de_digest<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let value = de_text(d, "digest")?;
    check_sha256("digest", &value).map_err(de::Error::custom)?;
    Ok(value)
}

fn de_file_sha256<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let value = de_text(d, "sha256")?;
    check_sha256("sha256", &value).map_err(de::Error::custom)?;
    Ok(value)
}

fn de_path<'de, D: Deserializer<'de>>(d: D) -> Result<RelPath, D::Error> {
    let text = de_text(d, "path")?;
    let path = RelPath::parse(&text).map_err(|e| {
        de::Error::custom(format!(
            "\"path\" {text:?} is not a clean relative path: {e}"
        ))
    })?;
    if path.is_reserved() {
        return Err(de::Error::custom(format!(
            "\"path\" {text:?} uses a name starting with .distributor, which is reserved for the tool; rename the file"
        )));
    }
    if path.as_str() == MANIFEST {
        return Err(de::Error::custom(format!(
            "\"path\" {text:?} lists the manifest itself; remove this entry"
        )));
    }
    // No bundle can hold it: manifest.json is a file, not a folder.
    if path.segments().next() == Some(MANIFEST) {
        return Err(de::Error::custom(format!(
            "\"path\" {text:?} puts a file in a folder named {MANIFEST}, the name of the bundle's manifest; rename that folder"
        )));
    }
    if path.as_str() == crate::signature::SIGNATURE_FILE {
        return Err(de::Error::custom(format!(
            "\"path\" {text:?} lists the manifest's signature, which is never listed nor published; remove this entry"
        )));
    }
    Ok(path)
}

/// Shared number handling for `schema_version` and `size`: serde_json hands
/// integers that do not fit in 64 bits over as floats.
struct Whole(&'static str);

impl Whole {
    fn float<E: de::Error>(&self, v: f64) -> E {
        let field = self.0;
        if v < 0.0 {
            E::custom(format!("\"{field}\" is {v}; it cannot be negative"))
        } else if v.fract() == 0.0 && v >= 18_446_744_073_709_551_616.0 {
            E::custom(format!(
                "\"{field}\" {v} is too large; it must fit in an unsigned 64-bit integer"
            ))
        } else {
            E::custom(format!(
                "\"{field}\" must be a whole number written without a decimal point or exponent, not {v}"
            ))
        }
    }
}

impl Visitor<'_> for Whole {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number for \"{}\"", self.0)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v)
            .map_err(|_| E::custom(format!("\"{}\" is {v}; it cannot be negative", self.0)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Err(self.float(v))
    }
}

fn de_schema_version<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = d.deserialize_u64(Whole("schema_version"))?;
    if v != SCHEMA_VERSION {
        return Err(de::Error::custom(format!(
            "\"schema_version\" {v} is not supported; this version of distributor reads schema_version {SCHEMA_VERSION}"
        )));
    }
    Ok(v)
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_u64(Whole("size"))
}

struct FileList;

impl<'de> Visitor<'de> for FileList {
    type Value = Vec<RawFile>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of file entries for \"files\"")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<RawFile>, A::Error> {
        let mut files = Vec::new();
        while let Some(Object(file)) = seq.next_element::<Object<RawFile>>()? {
            files.push(file);
        }
        if files.is_empty() {
            return Err(de::Error::custom(
                "\"files\" is empty; a bundle lists at least one file",
            ));
        }
        Ok(files)
    }
}

fn de_files<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RawFile>, D::Error> {
    d.deserialize_seq(FileList)
}
