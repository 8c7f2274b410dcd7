//! The ownership catalog kept in every destination root (`.distributor.json`,
//! schema version 4): the model, strict reading, and deterministic writing.
//!
//! - `model`: the records and the catalog in memory, what a state file
//!   says, and the checks every record read must pass;
//! - `form`: the file's fields, listed once; every codec below is derived
//!   from these serde declarations;
//! - `read`: classifying a state file (absent, a valid catalog, legacy
//!   schema 1–3, future > 4, or invalid; it never guesses), by serde_json,
//!   whole or streamed, or by `layout`, the fast reader of this tool's own
//!   layout;
//! - `write`: the deterministic writer;
//! - `texts`: reusing the text of unchanged records in the next write;
//! - `overlay`: changes not merged into a catalog yet.
//!
//! Never opens, creates, syncs or renames a file: callers hand in bytes,
//! a reader, or a file they opened (`read`), and get bytes back.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

mod form;
mod layout;
mod model;
mod overlay;
mod read;
mod texts;
mod write;

pub use model::{Catalog, OutputKind, OutputRecord, Sha256, SourceIdentity, State, sort_by_path};
pub use overlay::{Overlay, merge_by_path};
pub use texts::{Buffer, RecordTexts, SMALL_CHANGE, small_beside};

/// Name of the catalog file at the top of every destination root.
pub const STATE_FILE: &str = ".distributor.json";
/// The schema version this tool writes.
pub const SCHEMA_VERSION: u64 = 4;
/// The transform of a page rendered from markdown.
pub const MARKDOWN_TO_HTML: &str = "markdown_to_html";
/// The transform of a gzip sibling of an output (docs/contract.md §21.4).
pub const GZIP: &str = "gzip";
/// The transform of a brotli sibling of an output.
pub const BROTLI: &str = "brotli";
/// Every transform a record may name.
pub const TRANSFORMS: [&str; 3] = [MARKDOWN_TO_HTML, GZIP, BROTLI];

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

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
pub(crate) mod tests;
