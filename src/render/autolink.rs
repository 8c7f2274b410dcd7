//! Bare `http://` and `https://` URLs in text (the GFM autolink extension,
//! docs/contract.md §16.1), found in plain text; the caller never passes text of code,
//! of a link or of raw HTML.
//!
//! The rules, after the GFM spec and cmark-gfm:
//!
//! - A URL starts at the beginning of the text or after whitespace or one
//!   of `*`, `_`, `~`, `(`; the scheme is matched case-insensitively.
//! - A domain follows: segments of letters, digits, `_` and `-` separated by
//!   `.` (a single segment such as `localhost` is accepted, as cmark-gfm
//!   does for URLs with a scheme); no `_` in the last two segments.
//! - The URL runs to the next whitespace or `<`.
//! - Trailing `?`, `!`, `.`, `,`, `:`, `*`, `_`, `~`, `'` and `"` are not
//!   part of it; a trailing `)` is dropped while the URL has more `)` than
//!   `(`; a trailing entity-like `&name;` is dropped.

use std::ops::Range;

/// Byte ranges of the URLs in `text`, in order.
pub(super) fn find_urls(text: &str) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(offset) = text[from..].find("://") {
        let colon = from + offset;
        from = colon + 3;
        let Some(start) = scheme_start(bytes, colon) else {
            continue;
        };
        if !at_boundary(text, start) {
            continue;
        }
        let Some(end) = url_end(text, colon + 3) else {
            continue;
        };
        found.push(start..end);
        from = end;
    }
    found
}

/// Where the `http` or `https` scheme ending at `colon` starts.
fn scheme_start(bytes: &[u8], colon: usize) -> Option<usize> {
    ["https", "http"].iter().find_map(|scheme| {
        let start = colon.checked_sub(scheme.len())?;
        bytes[start..colon]
            .eq_ignore_ascii_case(scheme.as_bytes())
            .then_some(start)
    })
}

/// Whether a URL may start at `start`.
fn at_boundary(text: &str, start: usize) -> bool {
    text[..start]
        .chars()
        .next_back()
        .is_none_or(|c| c.is_whitespace() || matches!(c, '*' | '_' | '~' | '('))
}

/// End of the URL whose domain starts at `domain`, or `None` when there is
/// no valid domain.
fn url_end(text: &str, domain: usize) -> Option<usize> {
    let rest = &text[domain..];
    let run = rest
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(rest.len());
    let url = trim_trailing(&rest[..run]);
    let domain_len = url
        .find(|c: char| !(c.is_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(url.len());
    valid_domain(&url[..domain_len]).then_some(domain + url.len())
}

fn valid_domain(domain: &str) -> bool {
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() || domain.starts_with('.') || domain.contains("..") {
        return false;
    }
    let segments: Vec<&str> = domain.split('.').collect();
    segments.iter().rev().take(2).all(|s| !s.contains('_'))
}

/// The URL without the trailing characters GFM leaves out.
fn trim_trailing(mut url: &str) -> &str {
    loop {
        let Some(last) = url.chars().next_back() else {
            return url;
        };
        match last {
            '?' | '!' | '.' | ',' | ':' | '*' | '_' | '~' | '\'' | '"' => {
                url = &url[..url.len() - 1];
            }
            ')' if url.matches(')').count() > url.matches('(').count() => {
                url = &url[..url.len() - 1];
            }
            ';' => match entity_start(url) {
                Some(at) => url = &url[..at],
                None => return url,
            },
            _ => return url,
        }
    }
}

/// Start of a trailing `&name;` in `url`, which ends with `;`.
fn entity_start(url: &str) -> Option<usize> {
    let body = &url[..url.len() - 1];
    let name_start = body
        .rfind(|c: char| !c.is_ascii_alphanumeric())
        .map_or(0, |i| i + 1);
    (name_start > 0 && name_start < body.len() && body.as_bytes()[name_start - 1] == b'&')
        .then(|| name_start - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(text: &str) -> Vec<&str> {
        find_urls(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn a_semicolon_right_after_the_scheme_is_not_an_entity() {
        // Found by the rendering property test: `then_some` computed the
        // entity's start before checking there was one, and underflowed.
        assert_eq!(urls("# https://;_0_*"), Vec::<&str>::new());
        assert_eq!(urls("see https://x.org/;"), ["https://x.org/;"]);
    }

    #[test]
    fn finds_urls_like_gfm() {
        let cases: &[(&str, &[&str])] = &[
            ("see https://example.com now", &["https://example.com"]),
            ("http://a.b/c?d=e&f=g#h", &["http://a.b/c?d=e&f=g#h"]),
            ("HTTPS://EXAMPLE.COM", &["HTTPS://EXAMPLE.COM"]),
            ("end https://example.com.", &["https://example.com"]),
            ("https://example.com/a?!,.:*_~", &["https://example.com/a"]),
            ("(https://example.com/a)", &["https://example.com/a"]),
            (
                "https://en.wikipedia.org/wiki/Rust_(language)",
                &["https://en.wikipedia.org/wiki/Rust_(language)"],
            ),
            ("(https://x.org/wiki/A_(b))", &["https://x.org/wiki/A_(b)"]),
            ("https://x.org/a))", &["https://x.org/a"]),
            ("https://x.org/q&hl;", &["https://x.org/q"]),
            ("https://x.org/q;", &["https://x.org/q;"]),
            ("https://x.org/a<b", &["https://x.org/a"]),
            ("*https://x.org*", &["https://x.org"]),
            (
                "two http://a.org and https://b.org",
                &["http://a.org", "https://b.org"],
            ),
            ("http://localhost:8080/x", &["http://localhost:8080/x"]),
            ("\"https://x.org\"", &[]),
            ("xhttps://x.org", &[]),
            ("ftp://x.org", &[]),
            ("https://", &[]),
            ("https://.org", &[]),
            ("https://a_b.c_d.org", &[]),
            ("https://a_b.c.org/x", &["https://a_b.c.org/x"]),
            ("mailto://x.org", &[]),
            ("https://ünï.example/päth", &["https://ünï.example/päth"]),
        ];
        for (text, expected) in cases {
            assert_eq!(urls(text), *expected, "text {text:?}");
        }
    }
}
