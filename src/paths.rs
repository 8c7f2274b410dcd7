//! Path and identifier rules shared by manifests, catalogs, plans and config.
//!
//! A [`RelPath`] can only be built through [`RelPath::parse`], so holding one
//! proves the text is a clean relative path (docs/contract.md §2). Nothing here touches
//! the file system.

use std::fmt;

/// Longest path segment, in bytes.
pub const MAX_SEGMENT_BYTES: usize = 255;
/// Longest whole path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Every path segment starting with this is reserved for the tool.
pub const RESERVED_PREFIX: &str = ".distributor";

/// Why a text is not a clean relative path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path starts with '/'; use a path relative to the bundle or root")]
    Absolute,
    #[error("path ends with '/'")]
    TrailingSlash,
    #[error("path has an empty segment ('//')")]
    EmptySegment,
    #[error("path has a '.' segment; remove it")]
    DotSegment,
    #[error("path has a '..' segment, which would leave the folder")]
    DotDotSegment,
    #[error("path contains a backslash; separate folders with '/'")]
    Backslash,
    #[error("path contains a NUL or control character")]
    ControlCharacter,
    #[error("path segment is longer than {MAX_SEGMENT_BYTES} bytes")]
    SegmentTooLong,
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
}

/// A clean relative path: `/`-separated segments, none empty, `.` or `..`,
/// no backslash or control character, bounded lengths.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

impl RelPath {
    /// Checks `text` against the clean relative path rules.
    pub fn parse(text: &str) -> Result<RelPath, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        if text.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        if text.starts_with('/') {
            return Err(PathError::Absolute);
        }
        if text.ends_with('/') {
            return Err(PathError::TrailingSlash);
        }
        if text.contains('\\') {
            return Err(PathError::Backslash);
        }
        if text.chars().any(char::is_control) {
            return Err(PathError::ControlCharacter);
        }
        for segment in text.split('/') {
            match segment {
                "" => return Err(PathError::EmptySegment),
                "." => return Err(PathError::DotSegment),
                ".." => return Err(PathError::DotDotSegment),
                s if s.len() > MAX_SEGMENT_BYTES => return Err(PathError::SegmentTooLong),
                _ => {}
            }
        }
        Ok(RelPath(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The folder part, if the path has more than one segment.
    pub fn parent(&self) -> Option<&str> {
        self.0.rfind('/').map(|i| &self.0[..i])
    }

    /// Every proper ancestor folder, shortest first (`a`, `a/b` for `a/b/c`).
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0.match_indices('/').map(move |(i, _)| &self.0[..i])
    }

    /// True when any segment is reserved for the tool (`.distributor*`).
    pub fn is_reserved(&self) -> bool {
        self.segments().any(is_reserved_name)
    }

    /// Appends `other` below this path.
    pub fn join(&self, other: &RelPath) -> RelPath {
        RelPath(format!("{}/{}", self.0, other.0))
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RelPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl serde::Serialize for RelPath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for RelPath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        RelPath::parse(&text)
            .map_err(|e| serde::de::Error::custom(format!("invalid path {text:?}: {e}")))
    }
}

/// True for a single path segment reserved for the tool.
pub fn is_reserved_name(segment: &str) -> bool {
    segment.starts_with(RESERVED_PREFIX)
}

/// Whether the output at `path` is a page: its name ends in `.html` or
/// `.htm` (in any case). A publication makes every other new or changed
/// output visible before the pages, so that a page read meanwhile finds
/// the files it refers to (docs/contract.md §7).
pub fn is_page(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).as_bytes();
    [&b".html"[..], b".htm"].iter().any(|ext| {
        name.len() >= ext.len() && name[name.len() - ext.len()..].eq_ignore_ascii_case(ext)
    })
}

/// `items` in the order a publication makes them visible: those whose
/// path is not a page, then the pages ([`is_page`]), each in the order
/// given.
pub fn pages_last<T>(
    items: impl IntoIterator<Item = T>,
    path: impl Fn(&T) -> &str,
) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|item| !is_page(path(item)))
}

/// Which identifier rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Pipeline,
    Destination,
    Source,
}

impl IdKind {
    fn max_len(self) -> usize {
        match self {
            IdKind::Pipeline | IdKind::Destination => 64,
            IdKind::Source => 128,
        }
    }

    fn label(self) -> &'static str {
        match self {
            IdKind::Pipeline => "pipeline id",
            IdKind::Destination => "destination id",
            IdKind::Source => "source id",
        }
    }
}

/// Checks an identifier: 1..=max characters from `[A-Za-z0-9._-]`, starting
/// with a letter or digit. The error text names the rule that failed.
pub fn check_id(kind: IdKind, id: &str) -> Result<(), String> {
    let label = kind.label();
    let max = kind.max_len();
    if id.is_empty() {
        return Err(format!("{label} is empty"));
    }
    if id.len() > max {
        return Err(format!("{label} {id:?} is longer than {max} characters"));
    }
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!("{label} {id:?} must start with a letter or digit"));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{label} {id:?} contains {bad:?}; use only letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Checks the name of a bundle in an inbox: a folder of a local inbox, or
/// the `<name>` of an intake's `<path>/inbox/<name>/` (docs/contract.md
/// §3, §22.1). One clean path segment (§2: no `/`, `\`, control
/// character, `.` or `..`; at most 255 bytes) that does not start with
/// `.`, which marks staging that the agent ignores. The error text names
/// the rule that failed and the fix.
pub fn check_bundle_name(name: &str) -> Result<(), String> {
    let why = match RelPath::parse(name) {
        _ if name.contains('/') => "contains '/' (the bundle's files go below its name)",
        Err(PathError::Empty) => "is empty",
        Err(PathError::Backslash) => "contains a backslash",
        Err(PathError::ControlCharacter) => "contains a NUL or control character",
        Err(PathError::SegmentTooLong | PathError::TooLong) => "is longer than 255 bytes",
        Err(_) => "is '.' or '..'",
        Ok(_) if name.starts_with('.') => {
            "starts with '.', which marks a bundle being staged: the agent ignores it"
        }
        Ok(_) => return Ok(()),
    };
    Err(format!(
        "bundle name {name:?} {why}; a bundle name is one path segment of up to {MAX_SEGMENT_BYTES} bytes without control characters or '\\', not starting with '.'"
    ))
}

/// True when `digest` is `sha256:` followed by 64 lowercase hex digits.
pub fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod fuzz_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_names_are_one_clean_segment_not_starting_with_a_dot() {
        for ok in [
            "2026-06-04",
            "r",
            "build 4711",
            "café",
            "a.b",
            "a..b",
            &"x".repeat(255),
        ] {
            assert_eq!(check_bundle_name(ok), Ok(()), "{ok:?}");
        }
        // (name, what the message says)
        let cases = [
            ("", "is empty"),
            ("a/b", "contains '/'"),
            ("a/", "contains '/'"),
            (".staging-1", "starts with '.'"),
            (".distributor-x", "starts with '.'"),
            (".", "is '.' or '..'"),
            ("..", "is '.' or '..'"),
            ("a\\b", "backslash"),
            ("a\nb", "control character"),
            ("a\0b", "control character"),
        ];
        for (name, says) in cases {
            let e = check_bundle_name(name).expect_err(name);
            assert!(e.contains(says), "{name:?}: {e}");
            assert!(e.contains("one path segment"), "{name:?}: {e}");
        }
        let long = "x".repeat(256);
        assert!(
            check_bundle_name(&long)
                .unwrap_err()
                .contains("longer than 255 bytes")
        );
    }

    #[test]
    fn pages_are_html_and_htm_outputs_and_go_last() {
        // (path, a page)
        let cases = [
            ("index.html", true),
            ("docs/guide.htm", true),
            ("a/b/INDEX.HTML", true),
            ("Page.Htm", true),
            (".html", true),
            ("style.css", false),
            ("app.js", false),
            ("index.html.gz", false),
            ("index.htmlx", false),
            ("page.xhtml", false),
            ("html", false),
            ("htm/logo.png", false),
            ("report.md", false),
            ("x.html/inside.txt", false),
        ];
        for (path, page) in cases {
            assert_eq!(is_page(path), page, "{path}");
        }
        // Every other output first, then the pages, each in the order given.
        let (first, last) = pages_last(
            [
                "b.html",
                "a.css",
                "index.htm",
                "z/app.js",
                "a/x.html",
                "img.png",
            ],
            |p| p,
        );
        assert_eq!(first, ["a.css", "z/app.js", "img.png"]);
        assert_eq!(last, ["b.html", "index.htm", "a/x.html"]);
    }

    #[test]
    fn clean_paths_are_accepted() {
        for ok in [
            "a",
            "a/b",
            "a.b/c-d_e",
            "é/ü.md",
            ".hidden",
            "a/..b",
            "x/.../y",
        ] {
            assert!(RelPath::parse(ok).is_ok(), "{ok} should be clean");
        }
    }

    #[test]
    fn unclean_paths_are_rejected_with_the_rule() {
        let long_segment = "x".repeat(256);
        let long_path = vec!["abcdefgh"; 600].join("/");
        let cases: &[(&str, PathError)] = &[
            ("", PathError::Empty),
            ("/a", PathError::Absolute),
            ("a/", PathError::TrailingSlash),
            ("a//b", PathError::EmptySegment),
            ("./a", PathError::DotSegment),
            ("a/./b", PathError::DotSegment),
            ("../a", PathError::DotDotSegment),
            ("a/../b", PathError::DotDotSegment),
            ("..", PathError::DotDotSegment),
            ("a\\b", PathError::Backslash),
            ("a\0b", PathError::ControlCharacter),
            ("a\nb", PathError::ControlCharacter),
            ("a\u{7f}b", PathError::ControlCharacter),
            (&long_segment, PathError::SegmentTooLong),
            (&long_path, PathError::TooLong),
        ];
        for (text, want) in cases {
            assert_eq!(RelPath::parse(text).as_ref(), Err(want), "{text:?}");
        }
    }

    #[test]
    fn segment_of_exactly_255_bytes_is_allowed() {
        assert!(RelPath::parse(&"y".repeat(255)).is_ok());
    }

    #[test]
    fn ancestors_and_parent() {
        let p = RelPath::parse("a/b/c.md").unwrap();
        assert_eq!(p.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(p.parent(), Some("a/b"));
        assert_eq!(p.file_name(), "c.md");
        let top = RelPath::parse("c").unwrap();
        assert_eq!(top.ancestors().count(), 0);
        assert_eq!(top.parent(), None);
    }

    #[test]
    fn reserved_segments_anywhere() {
        for (text, reserved) in [
            (".distributor.json", true),
            ("a/.distributor-tmp", true),
            (".distributorx/b", true),
            ("a/distributor.json", false),
            (".distribute", false),
        ] {
            assert_eq!(
                RelPath::parse(text).unwrap().is_reserved(),
                reserved,
                "{text}"
            );
        }
    }

    #[test]
    fn id_rules() {
        let cases = [
            (IdKind::Pipeline, "reports", true),
            (IdKind::Pipeline, "a.b_c-d9", true),
            (IdKind::Pipeline, "9lives", true),
            (IdKind::Pipeline, "", false),
            (IdKind::Pipeline, ".hidden", false),
            (IdKind::Pipeline, "-dash", false),
            (IdKind::Pipeline, "has space", false),
            (IdKind::Pipeline, "slash/no", false),
            (IdKind::Pipeline, &"p".repeat(64), true),
            (IdKind::Pipeline, &"p".repeat(65), false),
            (IdKind::Source, &"s".repeat(128), true),
            (IdKind::Source, &"s".repeat(129), false),
            (IdKind::Destination, "é", false),
        ];
        for (kind, id, ok) in cases {
            assert_eq!(check_id(kind, id).is_ok(), ok, "{kind:?} {id:?}");
        }
    }

    #[test]
    fn digest_format() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(is_sha256_digest(&format!("sha256:{hex}")));
        assert!(!is_sha256_digest(&format!("sha256:{}", hex.to_uppercase())));
        assert!(!is_sha256_digest(&format!("sha1:{hex}")));
        assert!(!is_sha256_digest(&format!("sha256:{}", &hex[1..])));
        assert!(!is_sha256_digest(&hex));
    }

    proptest::proptest! {
        #[test]
        fn accepted_paths_never_escape(text in "\\PC{0,40}") {
            if let Ok(p) = RelPath::parse(&text) {
                proptest::prop_assert!(!p.as_str().starts_with('/'));
                proptest::prop_assert!(p.segments().all(|s| !s.is_empty() && s != "." && s != ".."));
            }
        }

        #[test]
        fn accepted_segment_joins_round_trip(segs in proptest::collection::vec("[a-z0-9._-]{1,12}", 1..6)) {
            let text = segs.join("/");
            let ok = segs.iter().all(|s| s != "." && s != "..");
            proptest::prop_assert_eq!(RelPath::parse(&text).is_ok(), ok);
        }
    }
}
