//! Fuzzing the clean-path rules (docs/reliability.md, "Fuzzing") against a
//! second reading of them, written here from the contract's text alone
//! (docs/contract.md §2) and sharing no code with [`RelPath::parse`].

use super::*;
use crate::fuzzing::{iterations, mutate};

/// A rule of docs/contract.md §2 that a text breaks, in the contract's
/// words: "A *clean relative path* is ... valid UTF-8, segments separated
/// by `/`, no `/` at the start or the end, no segment that is empty, `.`
/// or `..`, no `\`, no NUL and no other control character, at most 255
/// bytes in any segment and at most 4096 bytes in all."
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    /// "no segment that is empty" (the empty text is one empty segment).
    Empty,
    SlashAtStart,
    SlashAtEnd,
    EmptySegment,
    Dot,
    DotDot,
    Backslash,
    /// "no NUL and no other control character": Unicode's control
    /// characters (general category Cc: U+0000 to U+001F, U+007F to U+009F).
    Control,
    LongSegment,
    Long,
}

/// Every rule of the contract that `text` breaks.
fn broken(text: &str) -> Vec<Broken> {
    let mut out = Vec::new();
    if text.is_empty() {
        out.push(Broken::Empty);
    }
    if text.starts_with('/') {
        out.push(Broken::SlashAtStart);
    }
    if text.ends_with('/') {
        out.push(Broken::SlashAtEnd);
    }
    let segments: Vec<&str> = text.split('/').collect();
    if !text.is_empty() && segments.contains(&"") {
        out.push(Broken::EmptySegment);
    }
    if segments.contains(&".") {
        out.push(Broken::Dot);
    }
    if segments.contains(&"..") {
        out.push(Broken::DotDot);
    }
    if text.contains('\\') {
        out.push(Broken::Backslash);
    }
    if text
        .chars()
        .any(|c| u32::from(c) < 0x20 || (0x7f..=0x9f).contains(&u32::from(c)))
    {
        out.push(Broken::Control);
    }
    if segments.iter().any(|s| s.len() > 255) {
        out.push(Broken::LongSegment);
    }
    if text.len() > 4096 {
        out.push(Broken::Long);
    }
    out
}

/// The contract's rule that `error` names.
fn rule_of(error: &PathError) -> Broken {
    match error {
        PathError::Empty => Broken::Empty,
        PathError::Absolute => Broken::SlashAtStart,
        PathError::TrailingSlash => Broken::SlashAtEnd,
        PathError::EmptySegment => Broken::EmptySegment,
        PathError::DotSegment => Broken::Dot,
        PathError::DotDotSegment => Broken::DotDot,
        PathError::Backslash => Broken::Backslash,
        PathError::ControlCharacter => Broken::Control,
        PathError::SegmentTooLong => Broken::LongSegment,
        PathError::TooLong => Broken::Long,
    }
}

/// "a path segment that begins with `.distributor` belongs to the tool".
fn reserved(text: &str) -> bool {
    text.split('/').any(|s| s.starts_with(".distributor"))
}

/// The identifier rule of §2: 1 to `max` characters from `[A-Za-z0-9._-]`,
/// the first a letter or a digit.
fn id_ok(id: &str, max: usize) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    id.chars().count() <= max
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().all(allowed)
}

/// Checks every path rule against the reference for `text`.
fn check_text(text: &str) {
    let breaks = broken(text);
    match RelPath::parse(text) {
        Ok(path) => {
            assert!(breaks.is_empty(), "{text:?} accepted, breaks {breaks:?}");
            assert_eq!(path.as_str(), text);
            let segments: Vec<&str> = text.split('/').collect();
            assert_eq!(path.segments().collect::<Vec<_>>(), segments);
            assert_eq!(path.file_name(), *segments.last().unwrap());
            let parent = segments[..segments.len() - 1].join("/");
            assert_eq!(path.parent(), (segments.len() > 1).then_some(&parent[..]));
            let ancestors: Vec<String> = (1..segments.len())
                .map(|n| segments[..n].join("/"))
                .collect();
            assert_eq!(path.ancestors().collect::<Vec<_>>(), ancestors);
            assert_eq!(path.is_reserved(), reserved(text), "{text:?}");
        }
        Err(e) => assert!(
            breaks.contains(&rule_of(&e)),
            "{text:?} refused for {e:?}, breaks only {breaks:?}"
        ),
    }
    for (kind, max) in [
        (IdKind::Pipeline, 64),
        (IdKind::Destination, 64),
        (IdKind::Source, 128),
    ] {
        assert_eq!(
            check_id(kind, text).is_ok(),
            id_ok(text, max),
            "{kind:?} {text:?}"
        );
    }
    // An expanded prefix (docs/contract.md §4) is a clean path, never
    // reserved, without its one trailing slash.
    let created = time::macros::datetime!(2026-06-04 11:55 UTC);
    if let Ok(prefix) = crate::config::expand_prefix(text, "src.1", "pipe", created) {
        assert!(prefix.is_empty() || broken(&prefix).is_empty(), "{text:?}");
        assert!(!reserved(&prefix), "{text:?} expands to {prefix:?}");
        if !text.contains('{') {
            assert_eq!(prefix, text.strip_suffix('/').unwrap_or(text));
        }
    }
}

/// Clean paths (RelPath::parse) and ids (check_id) decide as the contract
/// reads, on any text and on clean paths edited near the rules' edges.
#[test]
fn fuzz_clean_paths() {
    let long_segment = "s".repeat(255);
    let long_path = format!("{}/x", vec!["abcdefg"; 511].join("/"));
    let seeds: Vec<&[u8]> = vec![
        b"a/b/c.md",
        b"docs/report.html",
        b".hidden/..x/y",
        long_segment.as_bytes(),
        long_path.as_bytes(),
        "é/😀/\u{2028}.txt".as_bytes(),
        b"{source_id}/{date}/",
        b"reports-{yyyy}.{mm}.{dd}",
    ];
    let dictionary: &[&[u8]] = &[
        b"/",
        b".",
        b"..",
        b"\\",
        b"//",
        b".distributor",
        b"\x00",
        b"\x1f",
        "\u{80}".as_bytes(),
        "\u{9f}".as_bytes(),
        "\u{a0}".as_bytes(),
        b"x",
        b"{pipeline_id}",
        b"{",
        b"}",
        b"-",
        b"_",
    ];
    bolero::check!(name = "clean_paths")
        .with_iterations(iterations(10_000))
        .for_each(|input: &[u8]| {
            if let Ok(text) = std::str::from_utf8(input) {
                check_text(text);
            }
            if let Some(edited) = mutate(input, &seeds, dictionary) {
                check_text(&String::from_utf8_lossy(&edited));
            }
        });
}

#[test]
fn the_reference_reads_the_contracts_examples() {
    assert!(broken("a/b").is_empty());
    assert!(broken("é/ü.md").is_empty());
    assert_eq!(broken(""), [Broken::Empty]);
    assert_eq!(
        broken("/a/"),
        [
            Broken::SlashAtStart,
            Broken::SlashAtEnd,
            Broken::EmptySegment
        ]
    );
    assert_eq!(broken("a/./../b"), [Broken::Dot, Broken::DotDot]);
    assert_eq!(broken("a\u{85}b"), [Broken::Control]);
    assert!(broken("a\u{a0}b").is_empty());
    assert!(reserved("x/.distributor-tmp"));
    assert!(id_ok("a.b_c-9", 64) && !id_ok("-a", 64) && !id_ok("é", 64));
}
