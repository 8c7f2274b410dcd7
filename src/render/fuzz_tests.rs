//! Fuzzing markdown to HTML (docs/reliability.md, "Fuzzing"), with four
//! oracles on every page rendered in `sanitize` and `escape` mode (and the
//! first in `allow` mode too):
//!
//! 1. rendering never panics;
//! 2. the page is well formed: the fixed skeleton around a body whose tags
//!    balance, every `<` in it starts a tag of a known element, every `&`
//!    an entity, every attribute is quoted;
//! 3. nothing outside the sanitizer's allowlist (docs/contract.md §16.4),
//!    written out here from that text and ammonia's documented defaults:
//!    no element, attribute or class it does not keep, no link or image
//!    target with a scheme §10 neutralises (`javascript:`, `vbscript:`,
//!    `data:`), read as a browser reads it;
//! 4. linear work. Wall-clock time is noise on a shared machine, so the
//!    work is counted instead, by the allocator of the renderer's thread
//!    ([`crate::fuzzing::allocated`]): its calls, one for every node
//!    built, string copied or stretch held and sanitized again, and its
//!    bytes. The input, at most 200 bytes, is rendered repeated 8, 16 and
//!    32 times: linear work makes the second doubling cost as many calls
//!    as the first, work quadratic in the input four times as many; more
//!    than three times fails, and so do bytes growing more than eightfold
//!    (linear: fourfold, with steps as buffers double). What it cannot see
//!    is a loop that rescans without allocating (html5ever matching an end
//!    tag against every open element: the cost docs/rendering.md lets the
//!    renderer's CPU limit bound).

use super::*;
use crate::fuzzing::{Tally, allocated, iterations, mutate};

/// Elements the page may hold: ammonia's default allowlist, what
/// `sanitize` adds (`picture`, `source`, `input`, `section`), and the
/// skeleton's own.
const ELEMENTS: &[&str] = &[
    "a",
    "abbr",
    "acronym",
    "area",
    "article",
    "aside",
    "b",
    "bdi",
    "bdo",
    "blockquote",
    "br",
    "caption",
    "center",
    "cite",
    "code",
    "col",
    "colgroup",
    "data",
    "dd",
    "del",
    "details",
    "dfn",
    "div",
    "dl",
    "dt",
    "em",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "hr",
    "i",
    "img",
    "ins",
    "kbd",
    "li",
    "map",
    "mark",
    "nav",
    "ol",
    "p",
    "pre",
    "q",
    "rp",
    "rt",
    "rtc",
    "ruby",
    "s",
    "samp",
    "small",
    "span",
    "strike",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "tbody",
    "td",
    "th",
    "thead",
    "time",
    "tr",
    "tt",
    "u",
    "ul",
    "var",
    "wbr",
    "picture",
    "source",
    "input",
    "section",
    "tfoot",
];

/// Elements without an end tag.
const VOID: &[&str] = &["area", "br", "col", "hr", "img", "input", "source", "wbr"];

/// Attributes any element may have.
const GENERIC: &[&str] = &["lang", "title", "id", "align"];

/// Attributes of one element.
fn attributes_of(element: &str) -> &'static [&'static str] {
    match element {
        "a" => &[
            "href",
            "hreflang",
            "aria-label",
            "name",
            "class",
            "data-footnote-ref",
            "data-footnote-backref",
            "data-footnote-backref-idx",
        ],
        "bdo" => &["dir"],
        "blockquote" | "q" => &["cite"],
        "col" | "colgroup" => &["char", "charoff", "span"],
        "del" | "ins" => &["cite", "datetime"],
        "hr" => &["size", "width"],
        "img" => &["alt", "height", "src", "width", "srcset"],
        "ol" => &["start"],
        "table" => &["char", "charoff", "summary"],
        "tbody" | "tfoot" | "thead" => &["char", "charoff"],
        "td" => &["char", "charoff", "colspan", "headers", "rowspan", "valign"],
        "th" => &[
            "char", "charoff", "colspan", "headers", "rowspan", "scope", "valign",
        ],
        "tr" => &["char", "charoff", "valign"],
        "source" => &["srcset", "media", "type", "width", "height"],
        "input" => &["checked", "type", "disabled"],
        "details" => &["open"],
        "section" => &["class", "data-footnotes"],
        "sup" | "div" | "p" | "code" => &["class"],
        _ => &[],
    }
}

/// Whether `class` may stand on `element`.
fn class_allowed(element: &str, class: &str) -> bool {
    match element {
        "a" => ["anchor", "footnote-backref"].contains(&class),
        "sup" => class == "footnote-ref",
        "section" => class == "footnotes",
        "p" => class == "markdown-alert-title",
        "div" => {
            class == "markdown-alert"
                || ["note", "tip", "important", "warning", "caution"]
                    .iter()
                    .any(|k| class.strip_prefix("markdown-alert-") == Some(k))
        }
        // The info string's first word, whatever it holds (CommonMark's
        // `language-;`); the sanitizer keeps only tame ones, but a class
        // is one word either way.
        "code" => class
            .strip_prefix("language-")
            .is_some_and(|l| !l.is_empty()),
        _ => false,
    }
}

/// The text of an attribute value as a browser reads it: named entities
/// a serializer writes and every numeric one decoded.
fn unescape(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail.find(';').unwrap_or(0);
        let entity = &tail[1..end.max(1)];
        let decoded = match entity {
            "quot" => Some('"'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "nbsp" => Some('\u{a0}'),
            _ => entity
                .strip_prefix("#x")
                .or(entity.strip_prefix("#X"))
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) if end > 0 => {
                out.push(c);
                rest = &tail[end + 1..];
            }
            _ => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether a link or image target is free of the schemes docs/contract.md
/// §10 neutralises (`javascript:`, `vbscript:`, `data:`; raw HTML's
/// allowlist keeps fewer, markdown's own links may use others), read as a
/// browser's URL parser reads it (entities decoded, C0 controls and spaces trimmed, tabs and line
/// breaks dropped, a scheme being a letter then letters, digits, `+`, `-`
/// or `.` before a `:`, in any case).
fn target_allowed(value: &str) -> bool {
    let decoded = unescape(value);
    let plain: String = decoded
        .trim_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let Some((scheme, _)) = plain.split_once(':') else {
        return true;
    };
    let is_scheme = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    !is_scheme
        || !["javascript", "vbscript", "data"].contains(&scheme.to_ascii_lowercase().as_str())
}

/// A well-formedness or allowlist violation in a rendered body.
fn check_body(body: &str) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find(['<', '&']) {
        let tail = &rest[at..];
        if let Some(entity) = tail.strip_prefix('&') {
            let end = entity.find(';').ok_or("an & starts no entity")?;
            let name = &entity[..end];
            let ok = !name.is_empty()
                && name.len() <= 32
                && (name.chars().all(|c| c.is_ascii_alphanumeric())
                    || name
                        .strip_prefix('#')
                        .is_some_and(|n| n.chars().all(|c| c.is_ascii_hexdigit() || c == 'x')));
            if !ok {
                return Err(format!(
                    "an & starts no entity: {:?}",
                    &tail[..tail.len().min(40)]
                ));
            }
            rest = &entity[end + 1..];
            continue;
        }
        let (closing, after) = match tail[1..].strip_prefix('/') {
            Some(after) => (true, after),
            None => (false, &tail[1..]),
        };
        let name_len = after
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(after.len());
        let name = &after[..name_len];
        if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(format!(
                "a raw < starts no tag: {:?}",
                &tail[..tail.len().min(40)]
            ));
        }
        if !ELEMENTS.contains(&name) {
            return Err(format!("<{name}> is not allowed"));
        }
        let mut attrs = &after[name_len..];
        // Attributes: ` name="value"`, then `>` or ` />`.
        loop {
            if let Some(end) = attrs.strip_prefix('>') {
                rest = end;
                break;
            }
            if let Some(end) = attrs.strip_prefix(" />").or(attrs.strip_prefix("/>")) {
                if !VOID.contains(&name) {
                    return Err(format!("<{name}/> closes itself"));
                }
                rest = end;
                break;
            }
            let a = attrs.strip_prefix(' ').ok_or_else(|| {
                format!("<{name}> has an unquoted or unseparated attribute: {attrs:.40}")
            })?;
            let name_end = a
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(a.len());
            let attribute = &a[..name_end];
            if attribute.is_empty() {
                return Err(format!("<{name}>: {a:.40}"));
            }
            // A value in double quotes, or none (`<a data-footnote-ref>`).
            let (value, after_value) = match a[name_end..].strip_prefix("=\"") {
                Some(quoted) => {
                    let end = quoted
                        .find('"')
                        .ok_or_else(|| format!("<{name}> has an unterminated value"))?;
                    (&quoted[..end], &quoted[end + 1..])
                }
                None => ("", &a[name_end..]),
            };
            if closing {
                return Err(format!("</{name}> has attributes"));
            }
            if !GENERIC.contains(&attribute) && !attributes_of(name).contains(&attribute) {
                return Err(format!("<{name} {attribute}> is not allowed"));
            }
            if attribute == "class" {
                for class in value.split_ascii_whitespace() {
                    if !class_allowed(name, class) {
                        return Err(format!("<{name} class={class:?}> is not allowed"));
                    }
                }
            }
            if matches!(attribute, "href" | "src") && !target_allowed(value) {
                return Err(format!(
                    "<{name} {attribute}={value:?}> has a scheme not allowed"
                ));
            }
            if attribute == "srcset"
                && !value
                    .split(|c: char| c == ',' || c.is_ascii_whitespace())
                    .all(target_allowed)
            {
                return Err(format!(
                    "<{name} srcset={value:?}> has a scheme not allowed"
                ));
            }
            if name == "input" && attribute == "type" && value != "checkbox" {
                return Err(format!("<input type={value:?}>"));
            }
            attrs = after_value;
        }
        if VOID.contains(&name) {
            if closing {
                return Err(format!("</{name}> closes a void element"));
            }
        } else if closing {
            match open.pop() {
                Some(top) if top == name => {}
                top => return Err(format!("</{name}> closes {top:?}")),
            }
        } else {
            open.push(name.to_owned());
        }
    }
    match open.last() {
        Some(unclosed) => Err(format!("<{unclosed}> is never closed")),
        None => Ok(()),
    }
}

/// Checks the page's skeleton and its body.
fn check_page(page: &str) -> Result<(), String> {
    let head_end = page.find("<body>\n").ok_or("no <body>")? + "<body>\n".len();
    let head = &page[..head_end];
    if !head.starts_with("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n") {
        return Err("the skeleton does not start the page".to_owned());
    }
    let title_start = head.find("<title>").ok_or("no <title>")? + "<title>".len();
    let title_len = head[title_start..].find("</title>").ok_or("no </title>")?;
    if head[title_start..title_start + title_len].contains('<') {
        return Err("a raw < in the title".to_owned());
    }
    let body = page[head_end..]
        .strip_suffix("</body>\n</html>\n")
        .ok_or("the skeleton does not end the page")?;
    check_body(body)
}

/// Renders `markdown` in `mode`, with `notes.md` among the pages made.
fn render(markdown: &str, mode: RawHtml) -> String {
    let generated = BTreeSet::from(["docs/notes.md".to_owned(), "docs/page.md".to_owned()]);
    let options = RenderOptions {
        raw_html: mode,
        source_path: "docs/page.md",
        generated_markdown: &generated,
        template: None,
    };
    markdown_to_html(markdown, &options)
}

/// The work of rendering `unit` repeated 8, 16 and 32 times in `mode`:
/// allocator calls (one a node, string or buffer made) may grow at most
/// three times as much over the second doubling as over the first; bytes,
/// which grow in steps as buffers double, at most eightfold over both.
fn check_linear(unit: &str, mode: RawHtml) {
    let work = |times: usize| {
        let text = unit.repeat(times);
        allocated(|| render(&text, mode)).1
    };
    let (w8, w16, w32) = (work(8), work(16), work(32));
    let first = w16.calls.saturating_sub(w8.calls);
    let second = w32.calls.saturating_sub(w16.calls);
    assert!(
        second <= 3 * first + 64 && w32.bytes <= 8 * w8.bytes + 64 * 1024,
        "{mode:?}: work {w8:?}, {w16:?}, {w32:?} for {unit:?} repeated 8, 16, 32 times"
    );
}

fn check_markdown(markdown: &str, tally: &Tally) {
    tally.saw(markdown.contains('<'));
    for mode in [RawHtml::Sanitize, RawHtml::Escape] {
        let page = render(markdown, mode);
        if let Err(e) = check_page(&page) {
            panic!("{mode:?}: {e}\nmarkdown: {markdown:?}\npage body: {page}");
        }
    }
    let _ = render(markdown, RawHtml::Allow);
    let mut cut = markdown.len().min(200);
    while !markdown.is_char_boundary(cut) {
        cut -= 1;
    }
    if cut > 0 {
        check_linear(&markdown[..cut], RawHtml::Sanitize);
    }
}

/// Any markdown renders to a well-formed page inside the allowlist, with
/// work linear in its size.
#[test]
fn fuzz_markdown() {
    let seeds: &[&[u8]] = &[
        b"# Title\n\nSome *emph* and **strong**, `code`, [a link](notes.md#x) and ![img](a.png \"t\").\n\n- [ ] task\n- [x] done\n\n| a | b |\n|:-|-:|\n| 1 | 2 |\n\n> [!NOTE]\n> note\n\nText[^1].\n\n[^1]: The note.\n",
        b"<div align=\"center\">\n<img src=\"logo.png\" alt=\"Logo\" width=\"100\">\n<h1>Name</h1>\n</div>\n\n<details><summary>More</summary>\n\n```rust\nfn main() {}\n```\n\n</details>\n",
        b"<a href=\"javascript:alert(1)\" onclick=\"x()\">x</a> <script>bad()</script> <img src=x onerror=y srcset=\"javascript:z 1x, a.png 2x\"> <style>p{}</style> <iframe src=a></iframe> <input type=text> <svg><a xlink:href=javascript:1>s</a></svg>",
        b"Vec<u8> and Option<T>, <!-- comment --> a < b > c & d &amp; &#x41; &bogus; www.example.org https://x.org/a_(b) user@example.org\n\n***\n\nSetext\n===\n",
        b"[ref]: http://example.org \"title\"\n\n[ref] [ref][] [x][ref] <http://a.b> <mailto:a@b.c> [\\[x\\]](<a b>)\n\n1. one\n   2. two\n      * three\n",
    ];
    let dictionary: &[&[u8]] = &[
        b"<div>",
        b"</div>",
        b"<b>",
        b"</b>",
        b"<table>",
        b"<tr>",
        b"<td>",
        b"</td>",
        b"<p>",
        b"</p>",
        b"<a href=\"",
        b"javascript:",
        b"<img src=",
        b"<!--",
        b"-->",
        b"<![CDATA[",
        b"<?",
        b"<textarea>",
        b"<plaintext>",
        b"<noscript>",
        b"<template>",
        b"<math>",
        b"<select><option>",
        b"<h1>",
        b"*",
        b"_",
        b"`",
        b"```",
        b"~~",
        b"[",
        b"]",
        b"(",
        b")",
        b"![",
        b"[^",
        b"]:",
        b"\n",
        b"\n\n",
        b"> ",
        b"- ",
        b"1. ",
        b"#",
        b"|",
        b"\\",
        b"&",
        b"<",
        b">",
        b"\"",
        b"'",
        b"    ",
        b"\t",
        b"- [ ] ",
        b"[!WARNING]",
        b"www.",
        b"https://",
        b"@",
        b"%",
        b"\r\n",
        b"\0",
    ];
    let tally = &Tally::new("markdown", "with raw HTML");
    bolero::check!(name = "markdown")
        .with_iterations(iterations(400))
        .for_each(|input: &[u8]| {
            check_markdown(&String::from_utf8_lossy(input), tally);
            if let Some(edited) = mutate(input, seeds, dictionary) {
                check_markdown(&String::from_utf8_lossy(&edited), tally);
            }
        });
}

#[test]
fn the_page_checker_refuses_what_the_allowlist_does_not_hold() {
    for (body, ok) in [
        ("<p>a &amp; b</p>\n", true),
        ("<p><a href=\"https://x\" class=\"anchor\">#</a></p>", true),
        ("<img src=\"a.png\" alt=\"x\">", true),
        ("<p>a < b</p>", false),
        ("<p>a & b</p>", false),
        ("<script>x</script>", false),
        ("<p onclick=\"x\">a</p>", false),
        ("<a href=\"javascript:x\">a</a>", false),
        ("<a href=\"JaVa&#9;script:x\">a</a>", false),
        ("<a href=\"a.html#x:y\">a</a>", true),
        ("<a href=\"ftp://x\">a</a>", true),
        ("<img src=\" DATA:x\">", false),
        ("<a href=\"&lt;p&gt;javascript:x\">a</a>", true),
        ("<a href=\" javascript:x\">a</a>", false),
        ("<div class=\"evil\">a</div>", false),
        ("<p>a", false),
        ("<p>a</div>", false),
        ("<input type=\"text\">", false),
    ] {
        assert_eq!(
            check_body(body).is_ok(),
            ok,
            "{body}: {:?}",
            check_body(body)
        );
    }
}
