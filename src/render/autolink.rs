//! Bare links in text: GFM's extended autolinks (docs/contract.md §16.1,
//! §21.5), found in plain text; the caller never passes text of code, of a
//! link or of raw HTML.
//!
//! The rules are cmark-gfm's (`extensions/autolink.c`), which GitHub runs:
//!
//! - A URL is `http://`, `https://` or `ftp://` (any case; letters right
//!   before the scheme are taken as part of it, so `xhttp://` is none)
//!   followed by a character that may be in a host name, and runs to the
//!   next white space. No `_` in the last two segments of its domain.
//! - A `www.` link starts at the start of the text, after white space or
//!   after one of `*`, `_`, `~`, `(`; its domain needs a `.`, and no `_`
//!   in its last two segments. Its target is `http://` and the text.
//! - An e-mail address is letters, digits and `.+-_` before an `@`, and
//!   after it letters, digits, `-`, `_` and `.` followed by a letter or
//!   digit (one `.` at least), ending in a letter; its target is
//!   `mailto:` and the text. It is looked for between the other links.
//! - Neither is looked for inside square brackets (`[https://x.org]`), as
//!   cmark-gfm does not while a `[` is open: the caller says how many
//!   are open before the text, and learns how many are after it.
//! - A link ends before a `<`; trailing `?`, `!`, `.`, `,`, `:`, `*`, `_`,
//!   `~`, `'` and `"` are not part of it, nor a trailing `)` while it has
//!   more `)` than `(`, nor a trailing entity-like `&name;`.
//!
//! Finding them takes time linear in the text (cmark-gfm's recount of the
//! parentheses for each trailing `)` is not).

use std::ops::Range;

/// What a link found in text is, which says its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Autolink {
    /// A URL with its scheme: the text is the target.
    Url,
    /// `www.`: the target is `http://` and the text.
    Www,
    /// An e-mail address: the target is `mailto:` and the text.
    Email,
}

/// The links in `text` and their byte ranges, in order, `brackets` being
/// the number of `[` open before it (updated to the number open after).
pub(super) fn find(text: &str, brackets: &mut usize) -> Vec<(Autolink, Range<usize>)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    // URLs and `www.` links, found where a `:` or a `w` is.
    let mut at = 0;
    let mut searched = 0;
    // Brackets are counted up to here.
    let mut counted = 0;
    while let Some(offset) = memchr::memchr2(b':', b'w', &bytes[at..]) {
        let i = at + offset;
        count_brackets(&bytes[counted..i], brackets);
        counted = i;
        let link = if *brackets > 0 {
            None
        } else if bytes[i] == b':' {
            url_at(text, searched, i).map(|r| (Autolink::Url, r))
        } else {
            www_at(text, i).map(|r| (Autolink::Www, r))
        };
        match link {
            Some((kind, range)) => {
                emails(text, searched..range.start, &mut found);
                at = range.end;
                searched = range.end;
                // What a link holds opens nothing.
                counted = range.end;
                found.push((kind, range));
            }
            None => at = i + 1,
        }
    }
    count_brackets(&bytes[counted..], brackets);
    emails(text, searched..text.len(), &mut found);
    found
}

/// Adds the `[` of `bytes` to `brackets`, takes its `]` off.
fn count_brackets(bytes: &[u8], brackets: &mut usize) {
    for &b in bytes {
        match b {
            b'[' => *brackets += 1,
            b']' => *brackets = brackets.saturating_sub(1),
            _ => {}
        }
    }
}

/// cmark's white space.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// The URL whose scheme ends at the `:` at `colon` and starts no earlier
/// than `floor` (the end of the link before).
fn url_at(text: &str, floor: usize, colon: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    if bytes.len() - colon < 4 || bytes[colon + 1] != b'/' || bytes[colon + 2] != b'/' {
        return None;
    }
    let start = colon
        - bytes[floor..colon]
            .iter()
            .rev()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
    let scheme = &bytes[start..colon];
    if !["http", "https", "ftp"]
        .iter()
        .any(|s| scheme.eq_ignore_ascii_case(s.as_bytes()))
    {
        return None;
    }
    let domain = colon + 3;
    if !host_char_at(text, domain) {
        return None;
    }
    check_domain(text, domain, true)?;
    let end = run_end(bytes, domain);
    let end = trim_end(&bytes[colon..end]) + colon;
    (end > colon).then_some(start..end)
}

/// The `www.` link starting at `at`.
fn www_at(text: &str, at: usize) -> Option<Range<usize>> {
    let bytes = text.as_bytes();
    if at > 0 && !is_space(bytes[at - 1]) && !matches!(bytes[at - 1], b'*' | b'_' | b'~' | b'(') {
        return None;
    }
    if !bytes[at..].starts_with(b"www.") {
        return None;
    }
    check_domain(text, at, false)?;
    let end = run_end(bytes, at);
    let end = trim_end(&bytes[at..end]) + at;
    (end > at).then_some(at..end)
}

/// Where the run of non-white-space from `from` ends.
fn run_end(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|&b| is_space(b))
        .map_or(bytes.len(), |n| from + n)
}

/// cmark-gfm's domain check for the domain starting at `from`: the run of
/// host characters (from the second byte on, a byte at a time, so it stops
/// inside a character of more than one byte) has no `_` in its last two
/// segments and, unless `short` is allowed, a `.`. `None` when it fails.
fn check_domain(text: &str, from: usize, short: bool) -> Option<()> {
    let bytes = &text.as_bytes()[from..];
    let (mut dots, mut last, mut current) = (0, 0, 0);
    let mut i = 1;
    while i + 1 < bytes.len() {
        match bytes[i] {
            b'_' => current += 1,
            b'.' => {
                last = current;
                current = 0;
                dots += 1;
            }
            b'-' => {}
            _ if host_char_at(text, from + i) => {}
            _ => break,
        }
        i += 1;
    }
    (last == 0 && current == 0 && (short || dots > 0)).then_some(())
}

/// Whether a character that may be in a host name starts at byte `at`: not
/// white space and not punctuation (ASCII or Unicode). A byte inside a
/// character is not one.
fn host_char_at(text: &str, at: usize) -> bool {
    if !text.is_char_boundary(at) {
        return false;
    }
    match text[at..].chars().next() {
        Some(c) if c.is_ascii() => {
            c.is_ascii_alphanumeric() || (c.is_ascii_control() && !c.is_ascii_whitespace())
        }
        Some(c) => !c.is_whitespace() && !is_unicode_punctuation(c),
        None => false,
    }
}

/// Unicode punctuation outside ASCII (general categories P*), for the
/// blocks where it is common.
fn is_unicode_punctuation(c: char) -> bool {
    matches!(c,
        '\u{a1}' | '\u{a7}' | '\u{ab}' | '\u{b6}' | '\u{b7}' | '\u{bb}' | '\u{bf}'
        | '\u{37e}' | '\u{387}'
        | '\u{55a}'..='\u{55f}' | '\u{589}' | '\u{58a}'
        | '\u{5be}' | '\u{5c0}' | '\u{5c3}' | '\u{5c6}' | '\u{5f3}' | '\u{5f4}'
        | '\u{609}' | '\u{60a}' | '\u{60c}' | '\u{60d}' | '\u{61b}' | '\u{61e}' | '\u{61f}'
        | '\u{66a}'..='\u{66d}' | '\u{6d4}'
        | '\u{964}' | '\u{965}' | '\u{970}'
        | '\u{e4f}' | '\u{e5a}' | '\u{e5b}'
        | '\u{2010}'..='\u{2027}' | '\u{2030}'..='\u{2043}' | '\u{2045}'..='\u{2051}'
        | '\u{2053}'..='\u{205e}' | '\u{207d}' | '\u{207e}' | '\u{208d}' | '\u{208e}'
        | '\u{2308}'..='\u{230b}' | '\u{2329}' | '\u{232a}' | '\u{2768}'..='\u{2775}'
        | '\u{27c5}' | '\u{27c6}' | '\u{27e6}'..='\u{27ef}' | '\u{2983}'..='\u{2998}'
        | '\u{29d8}'..='\u{29db}' | '\u{29fc}' | '\u{29fd}'
        | '\u{2cf9}'..='\u{2cfc}' | '\u{2cfe}' | '\u{2cff}' | '\u{2e00}'..='\u{2e4f}'
        | '\u{3001}'..='\u{3003}' | '\u{3008}'..='\u{3011}' | '\u{3014}'..='\u{301f}'
        | '\u{3030}' | '\u{303d}' | '\u{30a0}' | '\u{30fb}'
        | '\u{fe10}'..='\u{fe19}' | '\u{fe30}'..='\u{fe52}' | '\u{fe54}'..='\u{fe61}'
        | '\u{fe63}' | '\u{fe68}' | '\u{fe6a}' | '\u{fe6b}'
        | '\u{ff01}'..='\u{ff03}' | '\u{ff05}'..='\u{ff0a}' | '\u{ff0c}'..='\u{ff0f}'
        | '\u{ff1a}' | '\u{ff1b}' | '\u{ff1f}' | '\u{ff20}' | '\u{ff3b}'..='\u{ff3d}'
        | '\u{ff3f}' | '\u{ff5b}' | '\u{ff5d}' | '\u{ff5f}'..='\u{ff65}'
    )
}

/// The length of `link` without what GFM leaves out at its end (from a
/// `<` on, trailing punctuation, unbalanced `)`, a trailing `&name;`).
fn trim_end(link: &[u8]) -> usize {
    let mut end = memchr::memchr(b'<', link).unwrap_or(link.len());
    let opening = link[..end].iter().filter(|&&b| b == b'(').count();
    let mut closing = link[..end].iter().filter(|&&b| b == b')').count();
    while end > 0 {
        match link[end - 1] {
            b'?' | b'!' | b'.' | b',' | b':' | b'*' | b'_' | b'~' | b'\'' | b'"' => end -= 1,
            b';' => {
                let name = link[..end - 1]
                    .iter()
                    .rev()
                    .take_while(|b| b.is_ascii_alphabetic())
                    .count();
                // `&name;` goes, or else the `;` alone.
                match (end - 1).checked_sub(name + 1) {
                    Some(amp) if name > 0 && link[amp] == b'&' => end = amp,
                    _ => end -= 1,
                }
            }
            b')' if closing > opening => {
                closing -= 1;
                end -= 1;
            }
            _ => break,
        }
    }
    end
}

/// The e-mail addresses in `text[range]`, appended to `found`.
fn emails(text: &str, range: Range<usize>, found: &mut Vec<(Autolink, Range<usize>)>) {
    let bytes = &text.as_bytes()[..range.end];
    let mut from = range.start;
    while let Some(offset) = memchr::memchr(b'@', &bytes[from..]) {
        let at = from + offset;
        match email_at(bytes, from, at) {
            Some(email) => {
                from = email.end;
                found.push((Autolink::Email, email));
            }
            None => from = at + 1,
        }
    }
}

/// The e-mail address around the `@` at `at`, starting no earlier than
/// `from`.
fn email_at(bytes: &[u8], from: usize, at: usize) -> Option<Range<usize>> {
    let local = bytes[from..at]
        .iter()
        .rev()
        .take_while(|&&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_'))
        .count();
    if local == 0 || (at - local > from && bytes[at - local - 1] == b'/') {
        return None;
    }
    let rest = &bytes[at..];
    let mut end = 0;
    let mut dots = 0;
    while end < rest.len() {
        match rest[end] {
            b if b.is_ascii_alphanumeric() => {}
            // A second `@`: no address (and its own search starts there).
            b'@' if end > 0 => return None,
            b'@' => {}
            b'.' if rest.get(end + 1).is_some_and(u8::is_ascii_alphanumeric) => dots += 1,
            b'-' | b'_' => {}
            _ => break,
        }
        end += 1;
    }
    if end < 2 || dots == 0 || !(rest[end - 1].is_ascii_alphabetic() || rest[end - 1] == b'.') {
        return None;
    }
    let end = trim_end(&rest[..end]);
    (end > 0).then_some(at - local..at + end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(text: &str) -> Vec<(Autolink, &str)> {
        find(text, &mut 0)
            .into_iter()
            .map(|(k, r)| (k, &text[r]))
            .collect()
    }

    fn urls(text: &str) -> Vec<&str> {
        links(text).into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn a_semicolon_right_after_the_scheme_is_not_an_entity() {
        // Found by the rendering property test: `then_some` computed the
        // entity's start before checking there was one, and underflowed.
        assert_eq!(urls("# https://;_0_*"), Vec::<&str>::new());
        assert_eq!(urls("see https://x.org/;"), ["https://x.org/"]);
        assert_eq!(urls("https://x;"), ["https://x"]);
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
            ("https://x.org/q;", &["https://x.org/q"]),
            ("https://x.org/q;a", &["https://x.org/q;a"]),
            ("https://x.org/a<b", &["https://x.org/a"]),
            ("*https://x.org*", &["https://x.org"]),
            (
                "two http://a.org and https://b.org",
                &["http://a.org", "https://b.org"],
            ),
            ("http://localhost:8080/x", &["http://localhost:8080/x"]),
            // As cmark-gfm (and GitHub): quotes around a URL stay outside.
            ("\"https://x.org\"", &["https://x.org"]),
            ("xhttps://x.org", &[]),
            ("ftp://x.org", &["ftp://x.org"]),
            ("sftp://x.org", &[]),
            ("https://", &[]),
            ("https://.org", &[]),
            ("https://a_b.c_d.org", &[]),
            ("https://a_b.c.org/x", &["https://a_b.c.org/x"]),
            ("mailto://x.org", &[]),
            ("https://ünï.example/päth", &["https://ünï.example/päth"]),
            (
                "http://🍄.ga/ http://x🍄.ga/",
                &["http://🍄.ga/", "http://x🍄.ga/"],
            ),
            ("https://x.org/a)b)c)", &["https://x.org/a)b)c"]),
        ];
        for (text, expected) in cases {
            assert_eq!(urls(text), *expected, "text {text:?}");
        }
    }

    #[test]
    fn finds_www_links_like_gfm() {
        let cases: &[(&str, &[&str])] = &[
            ("www.commonmark.org", &["www.commonmark.org"]),
            (
                "Visit www.commonmark.org/help now",
                &["www.commonmark.org/help"],
            ),
            ("Visit www.commonmark.org.", &["www.commonmark.org"]),
            ("www.commonmark.org/a.b.", &["www.commonmark.org/a.b"]),
            ("(www.x.org/a_(b))", &["www.x.org/a_(b)"]),
            (
                "www.google.com/search?q=(business))+ok",
                &["www.google.com/search?q=(business))+ok"],
            ),
            ("www.x.org/he<lp", &["www.x.org/he"]),
            ("~www.x.org~", &["www.x.org"]),
            ("awww.x.org", &[]),
            ("www.", &[]),
            ("www.x", &["www.x"]),
            ("www.x_y.z_w.org", &[]),
            ("WWW.x.org", &[]),
        ];
        for (text, expected) in cases {
            assert_eq!(urls(text), *expected, "text {text:?}");
            for (kind, _) in links(text) {
                assert_eq!(kind, Autolink::Www);
            }
        }
    }

    #[test]
    fn finds_email_addresses_like_gfm() {
        let cases: &[(&str, &[&str])] = &[
            ("foo@bar.baz", &["foo@bar.baz"]),
            (
                "hello@mail+xyz.example isn't valid, but hello+xyz@mail.example is.",
                &["hello+xyz@mail.example"],
            ),
            ("a.b-c_d@a.b", &["a.b-c_d@a.b"]),
            ("a.b-c_d@a.b.", &["a.b-c_d@a.b"]),
            ("a.b-c_d@a.b-", &[]),
            ("a.b-c_d@a.b_", &[]),
            ("path/user@x.org", &[]),
            ("@x.org", &[]),
            ("a@b@c.org", &["b@c.org"]),
            ("a@b", &[]),
            ("x a@b.c y d@e.fg", &["a@b.c", "d@e.fg"]),
        ];
        for (text, expected) in cases {
            assert_eq!(urls(text), *expected, "text {text:?}");
            for (kind, _) in links(text) {
                assert_eq!(kind, Autolink::Email);
            }
        }
        // Beside a URL: the address outside it is one, one inside is not.
        assert_eq!(
            links("me@x.org at http://a@b.org/"),
            [
                (Autolink::Email, "me@x.org"),
                (Autolink::Url, "http://a@b.org/")
            ]
        );
    }

    /// Text that a search going back over the whole link for each `)`,
    /// or forward to the end of the run for each `@`, would take minutes
    /// over: found in linear time.
    #[test]
    fn long_runs_of_closers_and_at_signs_are_searched_once() {
        let closers = format!("http://x.org/{}", ")".repeat(400_000));
        assert_eq!(urls(&closers), ["http://x.org/"]);
        assert!(find(&"a@".repeat(200_000), &mut 0).is_empty());
        assert!(find(&"a@b.".repeat(100_000), &mut 0).is_empty());
        assert_eq!(find(&"(www.x".repeat(80_000), &mut 0).len(), 1);
    }

    #[test]
    fn no_url_is_looked_for_inside_brackets() {
        let cases: &[(&str, &[&str])] = &[
            ("[https://x.org/pull/22]. More", &[]),
            ("[see www.x.org] and https://y.org", &["https://y.org"]),
            ("[a] https://x.org [b]", &["https://x.org"]),
            (
                "https://x.org/a[1] www.y.org",
                &["https://x.org/a[1]", "www.y.org"],
            ),
            // E-mail addresses are: cmark-gfm finds them after parsing.
            ("[write a@x.org]", &["a@x.org"]),
        ];
        for (text, expected) in cases {
            assert_eq!(urls(text), *expected, "text {text:?}");
        }
        // Brackets left open carry over to the next text, and close there.
        let mut open = 0;
        assert!(find("[a ", &mut open).is_empty());
        assert_eq!(open, 1);
        assert!(find("https://x.org] ", &mut open).is_empty());
        assert_eq!(open, 0);
        assert_eq!(find("https://x.org", &mut open).len(), 1);
    }
}
