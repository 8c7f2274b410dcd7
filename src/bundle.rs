//! Bundles (SPEC §3): the `manifest.json` model and its strict parser, the
//! digest rule, full verification of a bundle folder against its manifest,
//! and sealing a folder into a bundle for producers.
//!
//! Everything on disk is reached through an open directory handle, one path
//! segment at a time, refusing symbolic links at every step. This module must
//! never read from anything but a regular file (a FIFO, socket or device is
//! never opened for reading), never hold a whole bundle file in memory, and
//! never write anything except `manifest.json` (through a reserved temporary
//! name) when sealing. It knows nothing about spools, catalogs or
//! destinations.

use crate::hashing;
use crate::paths::{IdKind, RelPath, check_id, is_reserved_name, is_sha256_digest};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType, FileTypeExt, MetadataExt, OpenOptions, OpenOptionsExt};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::collections::{BTreeSet, HashSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

/// Name of the manifest inside a bundle folder.
pub const MANIFEST: &str = "manifest.json";
/// Largest manifest we read. A manifest listing a hundred thousand files is
/// still well below this; anything bigger is refused rather than buffered.
pub const MAX_MANIFEST_BYTES: u64 = 16 * 1024 * 1024;
/// The only `schema_version` this build understands.
pub const SCHEMA_VERSION: u64 = 1;
/// At most this many "present but not listed" warnings are reported one by
/// one; the rest are summarised in a final warning.
pub const MAX_WARNINGS: usize = 100;

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

/// One thing wrong with a bundle, with the file it concerns and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: Option<String>,
    pub message: String,
}

impl Problem {
    fn at(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            path: Some(path.into()),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Why a bundle cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The bundle folder or its `manifest.json` could not be opened or read.
    /// `message` says what happened and what to do; `io` keeps the original
    /// error when there was one.
    #[error("{}: {message}", path.display())]
    Unreadable {
        path: PathBuf,
        message: String,
        io: Option<io::Error>,
    },
    /// `manifest.json` is not valid JSON, does not follow the schema, or is
    /// inconsistent in itself (duplicate paths, wrong digest).
    #[error("{}", manifest_location(.line, .column, .message))]
    Manifest {
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// The manifest is fine but the files are not: every problem found.
    #[error("{}", invalid_summary(.problems))]
    Invalid { problems: Vec<Problem> },
}

impl BundleError {
    /// True when retrying later may succeed (a passing I/O condition such as
    /// running out of file descriptors or an I/O error), false when the
    /// bundle itself is wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            BundleError::Unreadable { io: Some(e), .. } => is_transient_io(e),
            _ => false,
        }
    }

    /// Exit code of a command that fails with this error (SPEC §9).
    pub fn exit_code(&self) -> i32 {
        1
    }

    fn manifest(message: impl Into<String>) -> BundleError {
        BundleError::Manifest {
            line: None,
            column: None,
            message: message.into(),
        }
    }

    fn manifest_at(line: usize, column: usize, message: impl Into<String>) -> BundleError {
        BundleError::Manifest {
            line: Some(line),
            column: Some(column),
            message: message.into(),
        }
    }
}

fn manifest_location(line: &Option<usize>, column: &Option<usize>, message: &str) -> String {
    match (*line, *column) {
        (Some(line), Some(column)) => format!("{MANIFEST} line {line} column {column}: {message}"),
        (Some(line), None) => format!("{MANIFEST} line {line}: {message}"),
        _ => format!("{MANIFEST}: {message}"),
    }
}

fn invalid_summary(problems: &[Problem]) -> String {
    let n = problems.len();
    let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
    format!(
        "bundle does not match {MANIFEST} ({n} problem{}): {}",
        if n == 1 { "" } else { "s" },
        list.join("; ")
    )
}

/// A bundle whose every listed file matched its size and hash when checked.
#[derive(Debug)]
pub struct VerifiedBundle {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Things worth telling the producer that do not make the bundle
    /// invalid, such as files present but not listed.
    pub warnings: Vec<String>,
}

/// Why `seal` did not write a manifest.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("invalid --id: {reason}")]
    BadId { id: String, reason: String },
    #[error("invalid --created: {reason}")]
    BadCreated { reason: String },
    #[error("{}: cannot read: {io}", path.display())]
    Unreadable { path: PathBuf, io: io::Error },
    #[error(
        "cannot seal {}: {}; only regular files can be sealed, so move these out of the folder or replace them with regular files",
        dir.display(),
        problem_list(.problems)
    )]
    Refused {
        dir: PathBuf,
        problems: Vec<Problem>,
    },
    #[error(
        "{}: nothing to seal: the folder holds no regular file besides {MANIFEST} and reserved .distributor* names",
        dir.display()
    )]
    Empty { dir: PathBuf },
    #[error("{}: cannot write {MANIFEST}: {io}", dir.display())]
    Write { dir: PathBuf, io: io::Error },
}

impl SealError {
    /// Exit code of `bundle seal` (SPEC §9, §11.14): usage errors 2, the rest 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            SealError::BadId { .. } | SealError::BadCreated { .. } => 2,
            _ => 1,
        }
    }
}

fn problem_list(problems: &[Problem]) -> String {
    let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
    list.join("; ")
}

// ---------------------------------------------------------------------------
// Digest and timestamps

/// The bundle digest (SPEC §3): `sha256:` + SHA-256 of one line per file,
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
fn normalise_created(t: OffsetDateTime) -> Result<OffsetDateTime, String> {
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

// ---------------------------------------------------------------------------
// Parsing

/// Parses `manifest.json` strictly (SPEC §3): every field is checked, the
/// file list must be non-empty, unique and free of folder/file clashes, and
/// the digest must match the list. Unknown top-level keys are ignored;
/// unknown keys inside a file entry are errors.
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest, BundleError> {
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
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

fn too_big(len: u64) -> BundleError {
    BundleError::manifest(format!(
        "is {len} bytes, more than the {MAX_MANIFEST_BYTES}-byte limit; split the bundle into smaller ones"
    ))
}

/// Duplicate paths and paths that are both a file and a folder (SPEC §2).
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

// ---------------------------------------------------------------------------
// Opening entries without following links

/// Why one entry could not be opened as the kind of thing we need.
enum EntryError {
    Missing,
    /// Found something else; the text names it ("a symbolic link").
    Kind(&'static str),
    /// It changed between the check and the open.
    Raced,
    Io(io::Error),
}

impl EntryError {
    fn from_io(e: io::Error) -> EntryError {
        if e.kind() == io::ErrorKind::NotFound {
            EntryError::Missing
        } else if e.raw_os_error() == Some(libc::ELOOP) {
            EntryError::Kind("a symbolic link")
        } else {
            EntryError::Io(e)
        }
    }
}

fn kind_label(ft: FileType) -> &'static str {
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a folder"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_fifo() {
        "a named pipe (FIFO)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

/// Opens the folder `name` inside `parent`, refusing a symbolic link.
fn open_dir_nofollow(parent: &Dir, name: &OsStr) -> Result<Dir, EntryError> {
    open_nofollow(parent, name, true).map(Dir::from_std_file)
}

/// Opens the regular file `name` inside `parent` for reading, refusing
/// anything else (link, FIFO, socket, device, folder).
fn open_file_nofollow(parent: &Dir, name: &OsStr) -> Result<std::fs::File, EntryError> {
    open_nofollow(parent, name, false)
}

/// Opens a folder (`dir`) or regular file inside `parent`. The entry is
/// inspected first without following it and refused unless it is of the
/// wanted kind; the open itself uses `O_NOFOLLOW` (and `O_NONBLOCK` for
/// files, so it never blocks on a FIFO swapped in) and the handle must be
/// the same inode, so a swap between check and open is caught and a link
/// is never followed even where `openat2` is unavailable.
fn open_nofollow(parent: &Dir, name: &OsStr, dir: bool) -> Result<std::fs::File, EntryError> {
    let before = parent.symlink_metadata(name).map_err(EntryError::from_io)?;
    let wanted = |m: &cap_std::fs::Metadata| if dir { m.is_dir() } else { m.is_file() };
    if !wanted(&before) {
        return Err(EntryError::Kind(kind_label(before.file_type())));
    }
    let flags = if dir {
        libc::O_DIRECTORY | libc::O_NOFOLLOW
    } else {
        libc::O_NOFOLLOW | libc::O_NONBLOCK
    };
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(flags);
    let file = parent
        .open_with(name, &options)
        .map_err(|e| match EntryError::from_io(e) {
            EntryError::Missing => EntryError::Raced,
            other => other,
        })?;
    let after = file.metadata().map_err(EntryError::Io)?;
    if !wanted(&after) || after.dev() != before.dev() || after.ino() != before.ino() {
        return Err(EntryError::Raced);
    }
    Ok(file.into_std())
}

fn open_dir_path(root: &Dir, segments: &[OsString]) -> Result<Dir, EntryError> {
    let mut current = root.try_clone().map_err(EntryError::Io)?;
    for segment in segments {
        current = open_dir_nofollow(&current, segment)?;
    }
    Ok(current)
}

/// A listed file could not be opened; `io` is set for plain I/O failures so
/// the caller can tell a passing condition from a bad bundle.
struct Refusal {
    problem: Problem,
    io: Option<io::Error>,
}

fn open_checked(root: &Dir, path: &RelPath) -> Result<std::fs::File, Refusal> {
    let refuse = |message: String, io: Option<io::Error>| Refusal {
        problem: Problem::at(path.as_str(), message),
        io,
    };
    let mut segments: Vec<&str> = path.segments().collect();
    let name = segments.pop().unwrap_or(path.as_str());
    let mut folder: Option<Dir> = None;
    let mut walked = String::new();
    for segment in segments {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(segment);
        let parent = folder.as_ref().unwrap_or(root);
        let next = open_dir_nofollow(parent, OsStr::new(segment)).map_err(|e| match e {
            EntryError::Missing => refuse(
                format!("listed in {MANIFEST} but not found (there is no folder \"{walked}\")"),
                None,
            ),
            EntryError::Kind("a symbolic link") => refuse(
                format!(
                    "folder \"{walked}\" is a symbolic link; listed files must sit in real folders of the bundle, never behind a link"
                ),
                None,
            ),
            EntryError::Kind(kind) => refuse(format!("\"{walked}\" is {kind}, not a folder"), None),
            EntryError::Raced => refuse(raced_message(), None),
            EntryError::Io(e) => refuse(format!("cannot open folder \"{walked}\": {e}"), Some(e)),
        })?;
        folder = Some(next);
    }
    let parent = folder.as_ref().unwrap_or(root);
    open_file_nofollow(parent, OsStr::new(name)).map_err(|e| match e {
        EntryError::Missing => refuse(format!("listed in {MANIFEST} but not found"), None),
        EntryError::Kind("a symbolic link") => refuse(
            "is a symbolic link; links are never followed, so put the file itself in the bundle"
                .to_owned(),
            None,
        ),
        EntryError::Kind(kind) => refuse(
            format!("is {kind}, not a regular file; only regular files can be listed"),
            None,
        ),
        EntryError::Raced => refuse(raced_message(), None),
        EntryError::Io(e) => refuse(format!("cannot open: {e}"), Some(e)),
    })
}

fn raced_message() -> String {
    format!(
        "changed while it was being checked; leave a bundle untouched once its {MANIFEST} is written"
    )
}

fn is_transient_io(e: &io::Error) -> bool {
    crate::storage::is_transient(e)
        || matches!(
            e.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::TimedOut | io::ErrorKind::OutOfMemory
        )
}

fn open_bundle_dir(dir: &Path) -> Result<Dir, BundleError> {
    Dir::open_ambient_dir(dir, ambient_authority()).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::NotFound => "check the path",
            io::ErrorKind::PermissionDenied => "check its permissions",
            _ if e.raw_os_error() == Some(libc::ENOTDIR) => "a bundle is a folder",
            _ => "check that it is a readable folder",
        };
        BundleError::Unreadable {
            path: dir.to_path_buf(),
            message: format!("cannot open the bundle folder: {e}; {hint}"),
            io: Some(e),
        }
    })
}

/// Opens a listed file for reading, refusing anything but a regular file
/// reached without following a symlink (no intermediate symlinked folder
/// either). Never blocks on a FIFO.
pub fn open_listed(dir: &Path, path: &RelPath) -> Result<std::fs::File, Problem> {
    let root = open_bundle_dir(dir).map_err(|e| Problem {
        path: None,
        message: e.to_string(),
    })?;
    open_listed_at(&root, path)
}

/// [`open_listed`] for a bundle folder that is already open.
pub fn open_listed_at(root: &Dir, path: &RelPath) -> Result<std::fs::File, Problem> {
    open_checked(root, path).map_err(|r| r.problem)
}

// ---------------------------------------------------------------------------
// Reading and verifying

/// Reads and parses `dir/manifest.json`, which must be a regular file (not a
/// link) of at most [`MAX_MANIFEST_BYTES`].
pub fn read_manifest(dir: &Path) -> Result<Manifest, BundleError> {
    let root = open_bundle_dir(dir)?;
    read_manifest_at(&root, dir)
}

/// [`read_manifest`] for a bundle folder that is already open; `dir` is only
/// used in messages.
pub fn read_manifest_at(root: &Dir, dir: &Path) -> Result<Manifest, BundleError> {
    let path = dir.join(MANIFEST);
    let unreadable = |message: String, io: Option<io::Error>| BundleError::Unreadable {
        path: path.clone(),
        message,
        io,
    };
    let mut file = open_file_nofollow(root, OsStr::new(MANIFEST)).map_err(|e| match e {
        EntryError::Missing => unreadable(
            "not found; a bundle is complete only once its manifest.json exists (write it last, or run `distributor bundle seal`)".to_owned(),
            None,
        ),
        EntryError::Kind(kind) => unreadable(
            format!("is {kind}; the manifest must be a regular file, never a link or special file"),
            None,
        ),
        EntryError::Raced => unreadable(raced_message(), None),
        EntryError::Io(e) => unreadable(format!("cannot open: {e}"), Some(e)),
    })?;
    let len = file
        .metadata()
        .map_err(|e| unreadable(format!("cannot inspect: {e}"), Some(e)))?
        .len();
    if len > MAX_MANIFEST_BYTES {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    (&mut file)
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(format!("cannot read: {e}"), Some(e)))?;
    parse_manifest(&bytes)
}

/// Fully checks the bundle in `dir`: parses the manifest (digest included),
/// then opens and hashes every listed file, streaming. Every problem found is
/// reported, not only the first. Unlisted files become warnings.
pub fn verify(dir: &Path) -> Result<VerifiedBundle, BundleError> {
    check(dir, true)
}

/// Checks everything [`verify`] does except the file hashes: the manifest,
/// and that every listed file is a regular file (reached without a symlink)
/// of the declared size. Publication uses it to read each file only once,
/// hashing while it copies, and calls [`verify_files`] for the rest.
pub fn inspect(dir: &Path) -> Result<VerifiedBundle, BundleError> {
    check(dir, false)
}

/// Hashes the given listed files and checks them against the manifest;
/// every problem is reported.
pub fn verify_files(dir: &Path, files: &[&ManifestFile]) -> Result<(), BundleError> {
    let root = open_bundle_dir(dir)?;
    let mut problems = Vec::new();
    for file in files {
        if let Some(problem) = check_listed(&root, dir, file, true)? {
            problems.push(problem);
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BundleError::Invalid { problems })
    }
}

/// The problem reported when a file's bytes do not hash to the manifest's.
pub fn mismatch_problem(listed: &ManifestFile, actual: &hashing::Hashed) -> Problem {
    let message = if actual.size != listed.size {
        format!(
            "size is {} bytes but {MANIFEST} says {}; the file changed after the manifest was written (fix the file or re-seal the bundle)",
            actual.size, listed.size
        )
    } else {
        format!(
            "content does not match: {MANIFEST} says {}, the file hashes to {}; fix the file or re-seal the bundle",
            listed.sha256, actual.sha256
        )
    };
    Problem::at(listed.path.as_str(), message)
}

fn check(dir: &Path, hash: bool) -> Result<VerifiedBundle, BundleError> {
    let root = open_bundle_dir(dir)?;
    let manifest = read_manifest_at(&root, dir)?;
    let mut problems = Vec::new();
    for file in &manifest.files {
        if let Some(problem) = check_listed(&root, dir, file, hash)? {
            problems.push(problem);
        }
    }
    if !problems.is_empty() {
        return Err(BundleError::Invalid { problems });
    }
    let warnings = unlisted_warnings(&root, &manifest);
    Ok(VerifiedBundle {
        dir: dir.to_path_buf(),
        manifest,
        warnings,
    })
}

/// Checks one listed file. `Ok(Some(..))` is a problem with the bundle;
/// `Err` is a passing I/O failure that makes the whole check unreliable.
fn check_listed(
    root: &Dir,
    dir: &Path,
    listed: &ManifestFile,
    hash: bool,
) -> Result<Option<Problem>, BundleError> {
    let transient = |problem: Problem, e: io::Error| BundleError::Unreadable {
        path: dir.join(listed.path.as_str()),
        message: format!("{}; try again later", problem.message),
        io: Some(e),
    };
    let mut file = match open_checked(root, &listed.path) {
        Ok(file) => file,
        Err(Refusal {
            problem,
            io: Some(e),
        }) if is_transient_io(&e) => return Err(transient(problem, e)),
        Err(refusal) => return Ok(Some(refusal.problem)),
    };
    let declared = listed.size;
    if !hash {
        let size = file.metadata().map(|m| m.len()).map_err(|e| {
            transient(
                Problem::at(listed.path.as_str(), format!("cannot inspect: {e}")),
                e,
            )
        })?;
        return Ok((size != declared).then(|| {
            Problem::at(
                listed.path.as_str(),
                format!(
                    "size is {size} bytes but {MANIFEST} says {declared}; the file changed after the manifest was written (fix the file or re-seal the bundle)"
                ),
            )
        }));
    }
    let hashed = match hashing::copy_hashed(&mut file, None, Some(declared)) {
        Ok(hashed) => hashed,
        Err(e) => {
            let problem = Problem::at(listed.path.as_str(), format!("cannot read: {e}"));
            if is_transient_io(&e) {
                return Err(transient(problem, e));
            }
            return Ok(Some(problem));
        }
    };
    let problem = if hashed.size != declared {
        let (actual, more) = if hashed.size > declared {
            match file.metadata().map(|m| m.len()) {
                Ok(len) if len > declared => (len, ""),
                _ => (hashed.size, "at least "),
            }
        } else {
            (hashed.size, "")
        };
        Some(format!(
            "size is {more}{actual} bytes but {MANIFEST} says {declared}; the file changed after the manifest was written (fix the file or re-seal the bundle)"
        ))
    } else if hashed.sha256 != listed.sha256 {
        Some(format!(
            "content does not match: {MANIFEST} says {}, the file hashes to {}; fix the file or re-seal the bundle",
            listed.sha256, hashed.sha256
        ))
    } else {
        None
    };
    Ok(problem.map(|message| Problem::at(listed.path.as_str(), message)))
}

fn unlisted_warnings(root: &Dir, manifest: &Manifest) -> Vec<String> {
    let listed: HashSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    let mut warnings = Vec::new();
    let mut unlisted = 0usize;
    let result = walk(root, &mut |segments, ft| {
        if ft.is_dir() {
            return true;
        }
        let shown = display_segments(segments);
        if listed.contains(shown.as_str()) {
            return false;
        }
        unlisted += 1;
        if warnings.len() < MAX_WARNINGS {
            warnings.push(if ft.is_file() {
                format!("{shown}: present but not listed in {MANIFEST}; ignored")
            } else {
                format!(
                    "{shown}: {} present but not listed in {MANIFEST}; ignored",
                    kind_label(ft)
                )
            });
        }
        false
    });
    if unlisted > warnings.len() {
        warnings.push(format!(
            "{} more entries present but not listed in {MANIFEST}; ignored",
            unlisted - warnings.len()
        ));
    }
    if let Err((path, e)) = result {
        warnings.push(format!(
            "{path}: could not be listed while looking for unlisted files: {e}"
        ));
    }
    warnings
}

fn display_segments(segments: &[OsString]) -> String {
    let parts: Vec<String> = segments
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// Walks everything below `root` depth first, each folder's entries in name
/// order, without following links. Skips the top-level manifest and every
/// reserved `.distributor*` name (without descending into it). `visit` gets
/// each entry's path segments and type; for a folder it returns whether to
/// descend. A folder's entries are read in full and its handle closed before
/// descending, and folders are reopened from `root` segment by segment, so
/// the number of open descriptors stays small however deep the tree is.
fn walk(
    root: &Dir,
    visit: &mut dyn FnMut(&[OsString], FileType) -> bool,
) -> Result<(), (String, io::Error)> {
    // Each frame: a folder's path and its entries not yet visited, reversed
    // so that popping yields them in name order.
    let mut frames: Vec<(Vec<OsString>, Vec<Listed>)> = vec![(Vec::new(), list_folder(root, &[])?)];
    while let Some((prefix, entries)) = frames.last_mut() {
        let Some((name, file_type)) = entries.pop() else {
            frames.pop();
            continue;
        };
        if prefix.is_empty() && name == MANIFEST {
            continue;
        }
        if is_reserved_name(&name.to_string_lossy()) {
            continue;
        }
        let mut path = prefix.clone();
        path.push(name);
        if visit(&path, file_type) && file_type.is_dir() {
            let entries = list_folder(root, &path)?;
            frames.push((path, entries));
        }
    }
    Ok(())
}

/// One folder entry: its name and type (links not followed).
type Listed = (OsString, FileType);

/// The entries of the folder at `segments`, sorted by name, reversed.
fn list_folder(root: &Dir, segments: &[OsString]) -> Result<Vec<Listed>, (String, io::Error)> {
    let shown = || {
        if segments.is_empty() {
            ".".to_owned()
        } else {
            display_segments(segments)
        }
    };
    let dir = open_dir_path(root, segments).map_err(|e| {
        let e = match e {
            EntryError::Io(e) => e,
            EntryError::Missing => io::Error::from(io::ErrorKind::NotFound),
            EntryError::Kind(kind) => io::Error::other(format!("it is now {kind}")),
            EntryError::Raced => io::Error::other("it changed while being listed"),
        };
        (shown(), e)
    })?;
    let mut entries = Vec::new();
    for entry in dir.entries().map_err(|e| (shown(), e))? {
        let entry = entry.map_err(|e| (shown(), e))?;
        let file_type = entry.file_type().map_err(|e| (shown(), e))?;
        entries.push((entry.file_name(), file_type));
    }
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(entries)
}

// ---------------------------------------------------------------------------
// Sealing

/// Temporary name used while writing `manifest.json`. It is reserved
/// (`.distributor*`), so a leftover from an interrupted seal is never sealed
/// into the bundle or published.
fn temp_manifest_name() -> String {
    format!(".distributor-manifest.json.tmp-{}", std::process::id())
}

/// Turns `dir` into a bundle: hashes every regular file below it (dot-files
/// included; the top-level `manifest.json` and reserved `.distributor*` names
/// excluded) and writes `dir/manifest.json` atomically. Refuses links and
/// special files anywhere in the tree. `created` defaults to now (UTC, whole
/// seconds).
pub fn seal(dir: &Path, id: &str, created: Option<OffsetDateTime>) -> Result<Manifest, SealError> {
    check_id(IdKind::Source, id).map_err(|reason| SealError::BadId {
        id: id.to_owned(),
        reason,
    })?;
    let created = match created {
        Some(t) => normalise_created(t).map_err(|reason| SealError::BadCreated { reason })?,
        None => OffsetDateTime::now_utc().truncate_to_second(),
    };
    let root =
        Dir::open_ambient_dir(dir, ambient_authority()).map_err(|io| SealError::Unreadable {
            path: dir.to_path_buf(),
            io,
        })?;

    let mut found: Vec<RelPath> = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    walk(&root, &mut |segments, ft| {
        let shown = display_segments(segments);
        let last = segments.last().map(OsString::as_os_str).unwrap_or_default();
        let Some(name) = last.to_str() else {
            problems.push(Problem::at(
                shown,
                "name is not valid UTF-8; rename it (bundle paths are UTF-8)",
            ));
            return false;
        };
        if let Err(e) = RelPath::parse(name) {
            problems.push(Problem::at(shown, format!("name cannot be used: {e}")));
            return false;
        }
        if ft.is_dir() {
            return true;
        }
        if !ft.is_file() {
            problems.push(Problem::at(shown, format!("is {}", kind_label(ft))));
            return false;
        }
        match RelPath::parse(&shown) {
            Ok(path) => found.push(path),
            Err(e) => problems.push(Problem::at(shown, format!("path cannot be used: {e}"))),
        }
        false
    })
    .map_err(|(path, io)| SealError::Unreadable {
        path: dir.join(path),
        io,
    })?;
    if !problems.is_empty() {
        return Err(SealError::Refused {
            dir: dir.to_path_buf(),
            problems,
        });
    }
    if found.is_empty() {
        return Err(SealError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    found.sort();

    let mut files = Vec::with_capacity(found.len());
    for path in found {
        let mut file = open_checked(&root, &path).map_err(|r| match r.io {
            Some(io) => SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            },
            None => SealError::Refused {
                dir: dir.to_path_buf(),
                problems: vec![r.problem],
            },
        })?;
        let hashed =
            hashing::copy_hashed(&mut file, None, None).map_err(|io| SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            })?;
        files.push(ManifestFile {
            path,
            sha256: hashed.sha256,
            size: hashed.size,
        });
    }
    let manifest = Manifest {
        id: id.to_owned(),
        created,
        digest: compute_digest(&files),
        files,
    };
    write_manifest(&root, &manifest.to_json()).map_err(|io| SealError::Write {
        dir: dir.to_path_buf(),
        io,
    })?;
    Ok(manifest)
}

/// Writes `manifest.json` in `root`: temporary reserved name, `sync_all`,
/// rename over the final name, then sync the folder.
fn write_manifest(root: &Dir, text: &str) -> io::Result<()> {
    let temp = temp_manifest_name();
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW);
    let written = (|| {
        let mut file = root.open_with(&temp, &options)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        root.rename(&temp, root, MANIFEST)
    })();
    if let Err(e) = written {
        let _ = root.remove_file(&temp);
        return Err(e);
    }
    let mut folder = OpenOptions::new();
    folder.read(true).custom_flags(libc::O_DIRECTORY);
    root.open_with(".", &folder)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::fs;
    use std::os::unix::ffi::OsStrExt;
    use std::time::Duration;

    const HELLO_SHA: &str =
        "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
    const A_MD_SHA: &str =
        "sha256:aa1237b773c38dbddef583c4868aaea7a44c5237ea7923aecca5513764b42d80";
    const ZEROS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    fn file(path: &str, sha256: &str, size: u64) -> ManifestFile {
        ManifestFile {
            path: RelPath::parse(path).unwrap(),
            sha256: sha256.to_owned(),
            size,
        }
    }

    fn utc(text: &str) -> OffsetDateTime {
        OffsetDateTime::parse(text, &Rfc3339).unwrap()
    }

    #[test]
    fn digest_follows_the_documented_rule() {
        // Listed out of order on purpose: the digest sorts by path.
        let files = [
            file("notes/a.md", A_MD_SHA, 4),
            file("hello.txt", HELLO_SHA, 6),
        ];
        let text = format!("{HELLO_SHA} 6 hello.txt\n{A_MD_SHA} 4 notes/a.md\n");
        assert_eq!(
            compute_digest(&files),
            hashing::hash_bytes(text.as_bytes()).sha256
        );
        // The same value as the shell example in docs/producers.md.
        assert_eq!(
            compute_digest(&files),
            "sha256:38de40387561b41e0e3deb9d8f7a32418d9dd0750daeb326a5f6868ee1fcff37"
        );
    }

    #[test]
    fn digest_sorts_by_path_bytes_not_by_segments() {
        // '.' (0x2e) sorts before '/' (0x2f), so "a.txt" comes before "a/x.md".
        let files = [file("a/x.md", A_MD_SHA, 4), file("a.txt", HELLO_SHA, 6)];
        let text = format!("{HELLO_SHA} 6 a.txt\n{A_MD_SHA} 4 a/x.md\n");
        assert_eq!(
            compute_digest(&files),
            hashing::hash_bytes(text.as_bytes()).sha256
        );
    }

    // ----- parsing -------------------------------------------------------

    /// A manifest document listing `files`, with the right digest when every
    /// path is clean.
    fn doc(files: &[(&str, &str, u64)]) -> Value {
        let parsed: Option<Vec<ManifestFile>> = files
            .iter()
            .map(|(p, s, n)| {
                RelPath::parse(p).ok().map(|path| ManifestFile {
                    path,
                    sha256: (*s).to_owned(),
                    size: *n,
                })
            })
            .collect();
        let digest = parsed.map_or_else(|| ZEROS.to_owned(), |f| compute_digest(&f));
        json!({
            "schema_version": 1,
            "id": "reports.example.2026-06-04",
            "created": "2026-06-04T11:55:00Z",
            "digest": digest,
            "files": files
                .iter()
                .map(|(p, s, n)| json!({"path": p, "sha256": s, "size": n}))
                .collect::<Vec<_>>(),
        })
    }

    fn good() -> Value {
        doc(&[("hello.txt", HELLO_SHA, 6), ("notes/a.md", A_MD_SHA, 4)])
    }

    fn with(mut v: Value, f: impl FnOnce(&mut Value)) -> Vec<u8> {
        f(&mut v);
        serde_json::to_vec_pretty(&v).unwrap()
    }

    fn parse_err(bytes: &[u8]) -> String {
        match parse_manifest(bytes) {
            Ok(m) => panic!("expected an error, parsed {m:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_good_manifest_parses_and_normalises_created() {
        let m = parse_manifest(&with(good(), |v| {
            v["created"] = json!("2026-06-04T13:55:00+02:00");
            v["future_key"] = json!({"anything": [1, 2, {"deep": null}]});
        }))
        .unwrap();
        assert_eq!(m.id, "reports.example.2026-06-04");
        assert_eq!(m.created, utc("2026-06-04T11:55:00Z"));
        assert_eq!(m.created.offset(), UtcOffset::UTC);
        assert_eq!(m.created_text(), "2026-06-04T11:55:00Z");
        assert_eq!(m.files.len(), 2);
        assert_eq!(m.files[0].path.as_str(), "hello.txt", "kept as listed");
    }

    #[test]
    fn fractional_seconds_are_kept_only_when_present() {
        let m = parse_manifest(&with(good(), |v| {
            v["created"] = json!("2026-06-04T11:55:00.250-01:00");
        }))
        .unwrap();
        assert_eq!(m.created_text(), "2026-06-04T12:55:00.25Z");
    }

    #[test]
    fn the_documented_example_parses() {
        // Kept in step with the example in docs/producers.md.
        let text = r#"{
  "schema_version": 1,
  "id": "reports.2026-06-04",
  "created": "2026-06-04T11:55:00Z",
  "digest": "sha256:38de40387561b41e0e3deb9d8f7a32418d9dd0750daeb326a5f6868ee1fcff37",
  "files": [
    {
      "path": "hello.txt",
      "sha256": "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
      "size": 6
    },
    {
      "path": "notes/a.md",
      "sha256": "sha256:aa1237b773c38dbddef583c4868aaea7a44c5237ea7923aecca5513764b42d80",
      "size": 4
    }
  ]
}
"#;
        let m = parse_manifest(text.as_bytes()).unwrap();
        assert_eq!(m.to_json(), text);
    }

    #[test]
    fn manifest_json_in_a_subfolder_may_be_listed() {
        let m = parse_manifest(
            &serde_json::to_vec(&doc(&[("sub/manifest.json", HELLO_SHA, 6)])).unwrap(),
        )
        .unwrap();
        assert_eq!(m.files[0].path.as_str(), "sub/manifest.json");
    }

    #[test]
    fn bad_manifests_are_refused_with_a_message_naming_the_rule() {
        let upper = HELLO_SHA.to_uppercase().replace("SHA256:", "sha256:");
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "schema 2",
                with(good(), |v| v["schema_version"] = json!(2)),
                "\"schema_version\" 2 is not supported",
            ),
            (
                "schema text",
                with(good(), |v| v["schema_version"] = json!("1")),
                "expected a whole number for \"schema_version\"",
            ),
            (
                "schema float",
                with(good(), |v| v["schema_version"] = json!(1.0)),
                "\"schema_version\" must be a whole number",
            ),
            (
                "schema negative",
                with(good(), |v| v["schema_version"] = json!(-1)),
                "\"schema_version\" is -1; it cannot be negative",
            ),
            (
                "schema missing",
                with(good(), |v| {
                    v.as_object_mut().unwrap().remove("schema_version");
                }),
                "missing field `schema_version`",
            ),
            (
                "id rule",
                with(good(), |v| v["id"] = json!(".hidden")),
                "must start with a letter or digit",
            ),
            (
                "id long",
                with(good(), |v| v["id"] = json!("s".repeat(129))),
                "longer than 128",
            ),
            (
                "id type",
                with(good(), |v| v["id"] = json!(5)),
                "expected a string for \"id\"",
            ),
            (
                "id missing",
                with(good(), |v| {
                    v.as_object_mut().unwrap().remove("id");
                }),
                "missing field `id`",
            ),
            (
                "created text",
                with(good(), |v| v["created"] = json!("yesterday")),
                "\"created\" \"yesterday\" is not an RFC 3339",
            ),
            (
                "created no zone",
                with(good(), |v| v["created"] = json!("2026-06-04T11:55:00")),
                "is not an RFC 3339",
            ),
            (
                "created range",
                with(good(), |v| {
                    v["created"] = json!("0000-01-01T00:00:00+01:00")
                }),
                "outside the years 0000 to 9999",
            ),
            (
                "created null",
                with(good(), |v| v["created"] = Value::Null),
                "expected a string for \"created\"",
            ),
            (
                "digest algo",
                with(good(), |v| {
                    v["digest"] = json!(HELLO_SHA.replace("sha256:", "sha1:"))
                }),
                "\"digest\" \"sha1:",
            ),
            (
                "digest upper",
                with(good(), |v| v["digest"] = json!(upper)),
                "\"digest\" \"sha256:5891B5B5",
            ),
            (
                "digest wrong",
                with(good(), |v| v["digest"] = json!(ZEROS)),
                "but the listed files give sha256:",
            ),
            (
                "files empty",
                with(good(), |v| v["files"] = json!([])),
                "\"files\" is empty",
            ),
            (
                "files object",
                with(good(), |v| v["files"] = json!({})),
                "expected a list of file entries for \"files\"",
            ),
            (
                "files missing",
                with(good(), |v| {
                    v.as_object_mut().unwrap().remove("files");
                }),
                "missing field `files`",
            ),
            (
                "entry type",
                with(good(), |v| v["files"] = json!([5])),
                "expected a file entry",
            ),
            (
                "path dotdot",
                serde_json::to_vec(&doc(&[("../x", HELLO_SHA, 6)])).unwrap(),
                "\"path\" \"../x\" is not a clean relative path: path has a '..' segment",
            ),
            (
                "path absolute",
                serde_json::to_vec(&doc(&[("/etc/x", HELLO_SHA, 6)])).unwrap(),
                "path starts with '/'",
            ),
            (
                "path backslash",
                serde_json::to_vec(&doc(&[("a\\b", HELLO_SHA, 6)])).unwrap(),
                "backslash",
            ),
            (
                "path empty",
                serde_json::to_vec(&doc(&[("", HELLO_SHA, 6)])).unwrap(),
                "path is empty",
            ),
            (
                "path type",
                with(good(), |v| v["files"][0]["path"] = json!(["a"])),
                "expected a string for \"path\"",
            ),
            (
                "path reserved",
                serde_json::to_vec(&doc(&[(".distributor.json", HELLO_SHA, 6)])).unwrap(),
                "reserved for the tool",
            ),
            (
                "path reserved deep",
                serde_json::to_vec(&doc(&[("a/.distributor-x/b", HELLO_SHA, 6)])).unwrap(),
                "reserved for the tool",
            ),
            (
                "path manifest",
                serde_json::to_vec(&doc(&[("manifest.json", HELLO_SHA, 6)])).unwrap(),
                "lists the manifest itself",
            ),
            (
                "path duplicate",
                serde_json::to_vec(&doc(&[
                    ("a", HELLO_SHA, 6),
                    ("b", HELLO_SHA, 6),
                    ("a", A_MD_SHA, 4),
                ]))
                .unwrap(),
                "\"a\" is listed more than once",
            ),
            (
                "path prefix",
                serde_json::to_vec(&doc(&[("a/b/c", HELLO_SHA, 6), ("a/b", HELLO_SHA, 6)]))
                    .unwrap(),
                "\"a/b\" is listed as a file but \"a/b/c\" needs it to be a folder",
            ),
            (
                "sha upper",
                serde_json::to_vec(&doc(&[("a", &upper, 6)])).unwrap(),
                "uses uppercase hex digits; write them in lowercase",
            ),
            (
                "sha short",
                serde_json::to_vec(&doc(&[("a", &HELLO_SHA[..70], 6)])).unwrap(),
                "is not \"sha256:\" followed by 64 lowercase hex digits",
            ),
            (
                "sha bare",
                serde_json::to_vec(&doc(&[("a", &HELLO_SHA[7..], 6)])).unwrap(),
                "\"sha256\" \"5891b5",
            ),
            (
                "size negative",
                with(good(), |v| v["files"][0]["size"] = json!(-1)),
                "\"size\" is -1; it cannot be negative",
            ),
            (
                "size float",
                with(good(), |v| v["files"][0]["size"] = json!(1.5)),
                "\"size\" must be a whole number",
            ),
            (
                "size text",
                with(good(), |v| v["files"][0]["size"] = json!("6")),
                "expected a whole number for \"size\"",
            ),
            (
                "size missing",
                with(good(), |v| {
                    v["files"][0].as_object_mut().unwrap().remove("size");
                }),
                "missing field `size`",
            ),
            (
                "entry unknown key",
                with(good(), |v| v["files"][0]["sha1"] = json!("x")),
                "unknown field `sha1`, expected one of `path`, `sha256`, `size`",
            ),
            (
                "top level array",
                b"[1, 2]".to_vec(),
                "expected a JSON object with \"schema_version\"",
            ),
            (
                "not json",
                b"{\"schema_version\": 1,\n  oops}".to_vec(),
                "manifest.json line 2 column 3: not valid JSON",
            ),
            (
                "trailing comma",
                b"{\"schema_version\": 1,}".to_vec(),
                "not valid JSON",
            ),
            (
                "trailing text",
                [with(good(), |_| {}), b" x".to_vec()].concat(),
                "trailing characters",
            ),
            ("empty", Vec::new(), "ends early"),
            (
                "bom",
                [b"\xEF\xBB\xBF".to_vec(), with(good(), |_| {})].concat(),
                "byte-order mark",
            ),
            (
                "not utf8",
                b"{\n \"id\": \"a\xff\"}".to_vec(),
                "manifest.json line 2 column 10: not UTF-8 text (byte 0xff",
            ),
            (
                "duplicate key",
                b"{\"schema_version\": 1, \"schema_version\": 1}".to_vec(),
                "duplicate field `schema_version`",
            ),
        ];
        for (name, bytes, want) in cases {
            let got = parse_err(&bytes);
            assert!(
                got.contains(want),
                "{name}: {got:?} should contain {want:?}"
            );
            assert!(got.starts_with("manifest.json"), "{name}: {got:?}");
        }
    }

    #[test]
    fn size_that_does_not_fit_in_u64_is_refused() {
        let text = String::from_utf8(with(good(), |v| v["files"][0]["size"] = json!(7))).unwrap();
        let huge = text.replace("\"size\": 7", "\"size\": 18446744073709551616");
        assert_ne!(text, huge);
        assert!(
            parse_err(huge.as_bytes())
                .contains("is too large; it must fit in an unsigned 64-bit integer")
        );
        let exp = text.replace("\"size\": 7", "\"size\": 6e0");
        assert!(parse_err(exp.as_bytes()).contains("without a decimal point or exponent"));
        let max = text.replace("\"size\": 7", &format!("\"size\": {}", u64::MAX));
        // u64::MAX itself is a valid size; only the digest is then wrong.
        assert!(parse_err(max.as_bytes()).contains("\"digest\""));
    }

    #[test]
    fn errors_carry_line_and_column() {
        let bytes = with(good(), |v| v["files"][1]["size"] = json!(-4));
        match parse_manifest(&bytes) {
            Err(BundleError::Manifest {
                line: Some(line),
                column: Some(column),
                ..
            }) => {
                assert!(line > 1 && column > 1, "{line}:{column}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_a_clean_error() {
        let open = "[".repeat(100_000);
        let close = "]".repeat(100_000);
        for (name, text, want) in [
            (
                "ignored key",
                format!("{{\"x\": {open}{close}}}"),
                "missing field `schema_version`",
            ),
            ("unclosed", format!("{{\"x\": {open}"), "not valid JSON"),
            (
                "top level",
                format!("{open}{close}"),
                "expected a JSON object",
            ),
            (
                "files",
                format!("{{\"files\": [{open}{close}]}}"),
                "expected a file entry",
            ),
            (
                "object values",
                format!(
                    "{{\"x\": {}1{}}}",
                    "{\"a\":".repeat(100_000),
                    "}".repeat(100_000)
                ),
                "missing field",
            ),
        ] {
            let got = within_time(move || parse_err(text.as_bytes()));
            assert!(got.contains(want), "{name}: {got}");
        }
    }

    #[test]
    fn oversized_manifest_is_refused() {
        let big = vec![b' '; usize::try_from(MAX_MANIFEST_BYTES).unwrap() + 1];
        assert!(parse_err(&big).contains("more than the 16777216-byte limit"));
    }

    // ----- sealing and verifying ------------------------------------------

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    }

    /// Runs `f` on another thread and fails the test instead of hanging.
    fn within_time<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("finished without blocking")
    }

    /// A sealed bundle with hello.txt, notes/a.md and a dot-file.
    fn sealed() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        fs::create_dir_all(dir.join("notes")).unwrap();
        fs::write(dir.join("hello.txt"), "hello\n").unwrap();
        fs::write(dir.join("notes/a.md"), "# A\n").unwrap();
        fs::write(dir.join(".meta"), "m").unwrap();
        seal(
            &dir,
            "reports.example.2026-06-04",
            Some(utc("2026-06-04T13:55:00+02:00")),
        )
        .unwrap();
        (tmp, dir)
    }

    fn problems(dir: &Path) -> Vec<Problem> {
        let dir = dir.to_path_buf();
        match within_time(move || verify(&dir)) {
            Err(BundleError::Invalid { problems }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    fn one_problem(dir: &Path, path: &str, want: &str) {
        let got = problems(dir);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].path.as_deref(), Some(path));
        assert!(
            got[0].message.contains(want),
            "{:?} should contain {want:?}",
            got[0].message
        );
    }

    #[test]
    fn a_sealed_bundle_verifies() {
        let (_tmp, dir) = sealed();
        let v = verify(&dir).unwrap();
        assert_eq!(v.dir, dir);
        assert_eq!(v.warnings, Vec::<String>::new());
        let paths: Vec<&str> = v.manifest.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, [".meta", "hello.txt", "notes/a.md"]);
        assert_eq!(v.manifest.files[1].sha256, HELLO_SHA);
        assert_eq!(v.manifest.files[1].size, 6);
    }

    #[test]
    fn seal_output_is_pretty_ordered_and_round_trips() {
        let (_tmp, dir) = sealed();
        let text = fs::read_to_string(dir.join(MANIFEST)).unwrap();
        assert!(text.ends_with("}\n"));
        let keys = [
            "\"schema_version\": 1",
            "\"id\"",
            "\"created\": \"2026-06-04T11:55:00Z\"",
            "\"digest\"",
            "\"files\"",
        ];
        let at: Vec<usize> = keys
            .iter()
            .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} in {text}")))
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "key order in {text}");
        let entry = ["\"path\": \"hello.txt\"", "\"sha256\"", "\"size\": 6"];
        let start = text.find(entry[0]).unwrap();
        let at: Vec<usize> = entry
            .iter()
            .map(|k| start + text[start..].find(k).unwrap())
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "entry key order in {text}"
        );
        let parsed = parse_manifest(text.as_bytes()).unwrap();
        assert_eq!(parsed, read_manifest(&dir).unwrap());
        assert_eq!(parsed.to_json(), text);
        assert!(
            !fs::read_dir(&dir).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("tmp"))
        );
    }

    #[test]
    fn seal_defaults_created_to_now_in_whole_seconds() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("x"), "x").unwrap();
        let before = OffsetDateTime::now_utc().truncate_to_second();
        let m = seal(tmp.path(), "x1", None).unwrap();
        assert_eq!(m.created.nanosecond(), 0);
        assert_eq!(m.created.offset(), UtcOffset::UTC);
        assert!(m.created >= before);
        assert!(!m.created_text().contains('.'));
    }

    #[test]
    fn seal_skips_manifest_and_reserved_names_and_reseals() {
        let (_tmp, dir) = sealed();
        fs::write(dir.join(".distributor-result.json"), "{}").unwrap();
        fs::create_dir(dir.join(".distributor-tmp")).unwrap();
        fs::write(dir.join(".distributor-tmp/x"), "x").unwrap();
        fs::write(dir.join("notes/.distributor.lock"), "").unwrap();
        let again = seal(&dir, "second", None).unwrap();
        assert_eq!(again.files.len(), 3);
        assert!(
            again
                .files
                .iter()
                .all(|f| !f.path.is_reserved() && f.path.as_str() != MANIFEST)
        );
        assert_eq!(verify(&dir).unwrap().warnings, Vec::<String>::new());
    }

    #[test]
    fn seal_refuses_a_bad_id_with_exit_2() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("x"), "x").unwrap();
        let e = seal(tmp.path(), "-bad", None).unwrap_err();
        assert!(matches!(e, SealError::BadId { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("must start with a letter or digit"));
        assert!(!tmp.path().join(MANIFEST).exists());
    }

    #[test]
    fn seal_refuses_an_empty_folder() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("empty-sub")).unwrap();
        let e = seal(tmp.path(), "x", None).unwrap_err();
        assert!(matches!(e, SealError::Empty { .. }), "{e:?}");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn seal_refuses_symlinks_and_fifos_naming_each() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("b");
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("ok.txt"), "ok").unwrap();
        fs::write(tmp.path().join("outside"), "secret").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("outside"), dir.join("link")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), dir.join("sub/dirlink")).unwrap();
        mkfifo(&dir.join("sub/pipe"));
        let d = dir.clone();
        let e = within_time(move || seal(&d, "x", None)).unwrap_err();
        let SealError::Refused { problems, .. } = &e else {
            panic!("{e:?}");
        };
        let shown: Vec<String> = problems.iter().map(Problem::to_string).collect();
        assert_eq!(
            shown,
            [
                "link: is a symbolic link",
                "sub/dirlink: is a symbolic link",
                "sub/pipe: is a named pipe (FIFO)"
            ]
        );
        assert_eq!(e.exit_code(), 1);
        assert!(!dir.join(MANIFEST).exists());
    }

    #[test]
    fn seal_refuses_names_that_are_not_clean() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("back\\slash"), "x").unwrap();
        fs::write(tmp.path().join(OsStr::from_bytes(b"bad\xff")), "x").unwrap();
        let e = seal(tmp.path(), "x", None).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("back\\slash: name cannot be used: path contains a backslash"),
            "{text}"
        );
        assert!(text.contains("not valid UTF-8"), "{text}");
    }

    #[test]
    fn tampered_content_is_a_hash_problem() {
        let (_tmp, dir) = sealed();
        fs::write(dir.join("hello.txt"), "jello\n").unwrap();
        one_problem(
            &dir,
            "hello.txt",
            &format!("manifest.json says {HELLO_SHA}, the file hashes to sha256:"),
        );
    }

    #[test]
    fn truncated_and_grown_files_are_size_problems() {
        let (_tmp, dir) = sealed();
        fs::write(dir.join("hello.txt"), "hel").unwrap();
        one_problem(
            &dir,
            "hello.txt",
            "size is 3 bytes but manifest.json says 6",
        );
        fs::write(dir.join("hello.txt"), "hello, world\n").unwrap();
        one_problem(
            &dir,
            "hello.txt",
            "size is 13 bytes but manifest.json says 6",
        );
    }

    #[test]
    fn missing_file_is_reported() {
        let (_tmp, dir) = sealed();
        fs::remove_file(dir.join("notes/a.md")).unwrap();
        one_problem(&dir, "notes/a.md", "listed in manifest.json but not found");
        fs::remove_dir(dir.join("notes")).unwrap();
        one_problem(
            &dir,
            "notes/a.md",
            "not found (there is no folder \"notes\")",
        );
    }

    #[test]
    fn symlink_to_a_file_is_refused() {
        let (tmp, dir) = sealed();
        fs::write(tmp.path().join("copy"), "hello\n").unwrap();
        fs::remove_file(dir.join("hello.txt")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("copy"), dir.join("hello.txt")).unwrap();
        one_problem(&dir, "hello.txt", "is a symbolic link");
        let e = open_listed(&dir, &RelPath::parse("hello.txt").unwrap()).unwrap_err();
        assert!(e.message.contains("symbolic link"));
    }

    #[test]
    fn symlinked_intermediate_folder_is_refused() {
        let (tmp, dir) = sealed();
        fs::rename(dir.join("notes"), tmp.path().join("real-notes")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real-notes"), dir.join("notes")).unwrap();
        one_problem(&dir, "notes/a.md", "folder \"notes\" is a symbolic link");
    }

    #[test]
    fn fifo_socket_and_folder_are_refused_without_blocking() {
        let (_tmp, dir) = sealed();
        fs::remove_file(dir.join("hello.txt")).unwrap();
        mkfifo(&dir.join("hello.txt"));
        one_problem(
            &dir,
            "hello.txt",
            "is a named pipe (FIFO), not a regular file",
        );
        let d = dir.clone();
        let opened = within_time(move || open_listed(&d, &RelPath::parse("hello.txt").unwrap()));
        assert!(opened.unwrap_err().message.contains("FIFO"));

        fs::remove_file(dir.join("hello.txt")).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(dir.join("hello.txt")).unwrap();
        one_problem(&dir, "hello.txt", "is a socket");

        fs::remove_file(dir.join("hello.txt")).unwrap();
        fs::create_dir(dir.join("hello.txt")).unwrap();
        one_problem(&dir, "hello.txt", "is a folder, not a regular file");
    }

    #[test]
    fn file_where_a_folder_should_be_is_refused() {
        let (_tmp, dir) = sealed();
        fs::remove_dir_all(dir.join("notes")).unwrap();
        fs::write(dir.join("notes"), "x").unwrap();
        one_problem(
            &dir,
            "notes/a.md",
            "\"notes\" is a regular file, not a folder",
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let (_tmp, dir) = sealed();
        fs::write(dir.join("hello.txt"), "jello\n").unwrap();
        fs::remove_file(dir.join("notes/a.md")).unwrap();
        mkfifo(&dir.join("notes/a.md"));
        fs::write(dir.join(".meta"), "").unwrap();
        let got: Vec<String> = problems(&dir).iter().map(Problem::to_string).collect();
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with(".meta: size is 0 bytes"), "{got:?}");
        assert!(
            got[1].starts_with("hello.txt: content does not match"),
            "{got:?}"
        );
        assert!(got[2].starts_with("notes/a.md: is a named pipe"), "{got:?}");
        let e = verify(&dir).unwrap_err();
        assert!(!e.is_transient());
        assert!(
            e.to_string()
                .starts_with("bundle does not match manifest.json (3 problems): .meta: ")
        );
    }

    #[test]
    fn unlisted_entries_are_warnings() {
        let (_tmp, dir) = sealed();
        fs::write(dir.join("extra.txt"), "x").unwrap();
        fs::create_dir_all(dir.join("deeper/still")).unwrap();
        fs::write(dir.join("deeper/still/more"), "x").unwrap();
        std::os::unix::fs::symlink("hello.txt", dir.join("notes/link")).unwrap();
        fs::write(dir.join(".distributor-result.json"), "{}").unwrap();
        fs::write(dir.join("notes/.distributor-tmp-1"), "").unwrap();
        let v = verify(&dir).unwrap();
        assert_eq!(
            v.warnings,
            [
                "deeper/still/more: present but not listed in manifest.json; ignored",
                "extra.txt: present but not listed in manifest.json; ignored",
                "notes/link: a symbolic link present but not listed in manifest.json; ignored",
            ]
        );
    }

    #[test]
    fn many_unlisted_files_are_summarised() {
        let (_tmp, dir) = sealed();
        for i in 0..MAX_WARNINGS + 5 {
            fs::write(dir.join(format!("u{i:04}")), "").unwrap();
        }
        let v = verify(&dir).unwrap();
        assert_eq!(v.warnings.len(), MAX_WARNINGS + 1);
        assert!(v.warnings[MAX_WARNINGS].starts_with("5 more entries"));
    }

    #[test]
    fn manifest_must_be_a_regular_file() {
        let (tmp, dir) = sealed();
        fs::rename(dir.join(MANIFEST), tmp.path().join("m.json")).unwrap();
        let e = verify(&dir).unwrap_err();
        assert!(matches!(e, BundleError::Unreadable { .. }), "{e:?}");
        assert!(e.to_string().contains("manifest.json: not found"), "{e}");
        assert!(!e.is_transient());

        std::os::unix::fs::symlink(tmp.path().join("m.json"), dir.join(MANIFEST)).unwrap();
        let e = verify(&dir).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");

        fs::remove_file(dir.join(MANIFEST)).unwrap();
        mkfifo(&dir.join(MANIFEST));
        let d = dir.clone();
        let e = within_time(move || read_manifest(&d)).unwrap_err();
        assert!(e.to_string().contains("is a named pipe (FIFO)"), "{e}");
    }

    #[test]
    fn missing_bundle_folder_is_unreadable() {
        let tmp = tempfile::tempdir().unwrap();
        let e = verify(&tmp.path().join("nope")).unwrap_err();
        assert!(matches!(e, BundleError::Unreadable { .. }));
        assert!(
            e.to_string().contains("cannot open the bundle folder"),
            "{e}"
        );
    }

    #[test]
    fn open_listed_reads_a_good_file() {
        let (_tmp, dir) = sealed();
        let mut f = open_listed(&dir, &RelPath::parse("notes/a.md").unwrap()).unwrap();
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        assert_eq!(text, "# A\n");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics_on_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = parse_manifest(&bytes);
        }

        #[test]
        fn parse_never_panics_on_json_like_text(text in "[\\[\\]{}\",:0-9a-z_. \\-\\n]{0,300}") {
            let _ = parse_manifest(text.as_bytes());
        }

        #[test]
        fn parse_never_panics_on_near_manifests(
            version in "1|2|-1|1.0|\"1\"|null|18446744073709551616",
            id in "[a-z.\\-]{0,10}|\"x\"",
            created in "\"2026-06-04T11:55:00Z\"|\"9999-12-31T23:59:59-01:00\"|\"x\"|0",
            path in "\"[a-z./\\\\]{0,8}\"|1|null",
            size in "0|-0|6|1e3|-5|\"6\"|99999999999999999999999",
            extra in "|, \"z\": 1",
        ) {
            let text = format!(
                "{{\"schema_version\": {version}, \"id\": \"{id}\", \"created\": {created}, \"digest\": \"{ZEROS}\", \"files\": [{{\"path\": {path}, \"sha256\": \"{HELLO_SHA}\", \"size\": {size}{extra}}}]}}"
            );
            let _ = parse_manifest(text.as_bytes());
        }
    }
}
