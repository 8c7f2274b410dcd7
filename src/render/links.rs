//! Link and image destinations: neutralising dangerous schemes in escape
//! mode and rewriting relative links between generated `.md` files to
//! `.html`. Pure text functions.

use crate::config::RawHtml;
use std::collections::BTreeSet;

use pulldown_cmark::{CowStr, LinkType};

use super::RenderOptions;

/// Target that replaces a link or image destination with a dangerous scheme
/// in escape mode.
const NEUTRALISED_DESTINATION: &str = "#";

/// Schemes neutralised in escape mode (lowercase, with the colon).
const DANGEROUS_SCHEMES: [&str; 3] = ["javascript:", "vbscript:", "data:"];

/// The destination to write for a link or image.
pub(super) fn rewrite_destination<'a>(
    dest: CowStr<'a>,
    link_type: LinkType,
    options: &RenderOptions<'_>,
) -> CowStr<'a> {
    // The writer prefixes e-mail autolinks with `mailto:`; they are neither
    // dangerous nor paths.
    if link_type == LinkType::Email {
        return dest;
    }
    if options.raw_html != RawHtml::Allow && has_dangerous_scheme(&dest) {
        return CowStr::Borrowed(NEUTRALISED_DESTINATION);
    }
    match rewrite_markdown_link(&dest, options.source_path, options.generated_markdown) {
        Some(rewritten) => rewritten.into(),
        None => dest,
    }
}

/// Whether `dest` starts with a scheme that can run code or smuggle content,
/// ignoring ASCII whitespace and control characters anywhere (browsers drop
/// them) and case.
pub(super) fn has_dangerous_scheme(dest: &str) -> bool {
    let squeezed: String = dest
        .chars()
        .filter(|c| !(c.is_ascii_control() || *c == ' '))
        .take(16)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    DANGEROUS_SCHEMES
        .iter()
        .any(|scheme| squeezed.starts_with(scheme))
}

/// Whether `dest` starts with a URL scheme (`ALPHA *(ALPHA / DIGIT / + / - / .) :`).
pub(super) fn has_scheme(dest: &str) -> bool {
    let Some((scheme, _)) = dest.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The `.html` form of a relative link to a generated `.md` file of the
/// bundle, or `None` when the link must stay as written.
pub(super) fn rewrite_markdown_link(
    dest: &str,
    source_path: &str,
    generated: &BTreeSet<String>,
) -> Option<String> {
    if dest.starts_with(['/', '#', '?']) || has_scheme(dest) {
        return None;
    }
    let path_end = dest.find(['?', '#']).unwrap_or(dest.len());
    let (path, suffix) = dest.split_at(path_end);
    let stem = path.strip_suffix(".md")?;
    let target = resolve(source_path, path)?;
    if !generated.contains(&target) {
        return None;
    }
    Some(format!("{stem}.html{suffix}"))
}

/// Resolves the link path `path` against the folder of `source_path` into a
/// bundle path, decoding percent-escapes. `None` when it climbs above the
/// bundle root or does not decode to UTF-8.
fn resolve(source_path: &str, path: &str) -> Option<String> {
    let mut segments: Vec<String> = match source_path.rsplit_once('/') {
        Some((dir, _)) => dir.split('/').map(str::to_owned).collect(),
        None => Vec::new(),
    };
    for raw in path.split('/') {
        let segment = percent_decode(raw)?;
        match segment.as_str() {
            "." => {}
            ".." => {
                segments.pop()?;
            }
            _ => segments.push(segment),
        }
    }
    Some(segments.join("/"))
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as is.
pub(super) fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex_value(hi).zip(hex_value(lo)),
            _ => None,
        };
        match decoded {
            Some((hi, lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}
