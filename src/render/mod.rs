//! Markdown to HTML (docs/contract.md §10, §16): turns one CommonMark file of a bundle
//! into a complete, self-contained HTML5 document.
//!
//! This module owns the rendering rules: which markdown extensions are on,
//! the document skeleton and its default stylesheet, the optional page
//! template, the `<title>`, heading and footnote ids, bare-URL autolinks,
//! raw HTML escaping, neutralising dangerous link schemes and rewriting
//! links between generated `.md` files.
//!
//! It must never do I/O, read the clock or depend on anything but its
//! arguments: the same markdown and options always give the same bytes.
//! Events are streamed from the parser to the writer, never collected, and
//! the body goes to a writer the caller chooses ([`render_page`]), so a
//! page many times the markdown's size need not be held. The memory bound
//! of docs/contract.md §12.3 is enforced around these functions, not in
//! them: the agent runs them in a child process under a memory limit (see
//! [`crate::render::child`]).
//!
//! Decisions where the contract is silent:
//!
//! - In sanitize mode (the default) each stretch of the page that holds raw
//!   HTML is sanitized after rendering; see [`sanitize`].
//! - In escape mode an HTML *block* becomes a paragraph holding its source as
//!   text (`<p>&lt;div&gt;…</p>`), the way CommonMark renderers with raw HTML
//!   disabled show it; inline HTML becomes text where it stands. HTML
//!   comments are dropped in both modes, never shown.
//! - A neutralised link or image target (`javascript:`, `vbscript:`,
//!   `data:`) is replaced by `#`, so the link text stays visible but goes
//!   nowhere. The scheme is checked after removing every ASCII whitespace and
//!   control character, as browsers do, and case-insensitively.
//! - The `<title>` is the plain text of the first heading as a reader sees
//!   it: text, inline code and image alt text, whitespace collapsed. Raw HTML
//!   tags are left out when raw HTML is allowed (they are markup) and kept
//!   when it is escaped (they are then visible text). When sanitized or
//!   allowed, a heading written in raw HTML (`<h1 align="center">`) counts
//!   as a heading: the first one, raw or markdown, is the title.
//!   When the first heading has no text (a logo without alt text), the file
//!   name without `.md` is used, whether it is written in markdown or raw
//!   HTML; a later heading is never the title. Any Unicode white space
//!   (`&emsp;`, `&nbsp;`) collapses to one space.
//! - A relative `.md` link is rewritten only when its path is literally
//!   spelled with `.md` at the end; percent-escapes are decoded for the lookup
//!   only, and a link that climbs above the bundle root is left alone. In
//!   sanitize mode the links and images of raw HTML are rewritten the same
//!   way; allowed raw HTML passes through unchanged.
//! - Heading ids: see [`ids`]. Each heading ends with a self-link
//!   `<a class="anchor" href="#id">#</a>`, shown on hover by the default
//!   stylesheet.
//! - Footnotes are numbered in the order they are first referenced; the
//!   first reference is `id="fnref-N"`, further references to the same
//!   note `fnref-N-2`, ... Labels match case-insensitively. As on GitHub,
//!   the notes that were referenced are listed at the end of the page
//!   (`<section class="footnotes">`, items `id="fn-N"`), each with a
//!   back-link to each of its references; a note never referenced is not
//!   shown.
//! - Bare URLs, `www.` links and e-mail addresses: see [`autolink`].
//! - GFM's tag filter applies in every mode, and U+0000 becomes U+FFFD.
//!   The HTML itself: see [`html`].
//! - With a template, `{{title}}` is replaced by the escaped title and
//!   `{{content}}` by the body, each wherever it occurs, in one pass: text
//!   inserted is never searched again.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io;

use pulldown_cmark::{Options, Parser};

pub use crate::config::RawHtml;

mod autolink;
pub(crate) mod child;
mod events;
mod html;
mod ids;
mod links;
mod sanitize;
mod tags;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;

/// What to render and how.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    /// `html.raw_html` in config.
    pub raw_html: RawHtml,
    /// Manifest path of the markdown file being rendered, e.g. "docs/report.md" (clean relative path, '/'-separated).
    pub source_path: &'a str,
    /// Manifest paths of every `.md` file of the same bundle that is ALSO rendered to HTML in this publication.
    pub generated_markdown: &'a BTreeSet<String>,
    /// Text of the destination's `html.template` (checked at config load to
    /// hold `{{content}}`), or `None` for the built-in page.
    pub template: Option<&'a str>,
}

/// The built-in stylesheet, embedded in every page rendered without a
/// template.
const STYLESHEET: &str = include_str!("style.css");

/// A piece of a page: text of the skeleton (or template), or the body.
/// A template may place the body several times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    Body,
}

/// Renders CommonMark to a complete UTF-8 HTML5 document. Pure and deterministic.
pub fn markdown_to_html(markdown: &str, options: &RenderOptions<'_>) -> String {
    // Sized for typical output so the buffer rarely grows (each growth
    // briefly holds the old and the new buffer).
    let mut body = Vec::with_capacity(markdown.len().saturating_mul(2) + 4096);
    let parts = match render_page(markdown, options, &mut body) {
        Ok(parts) => parts,
        Err(e) => panic!("writing into memory cannot fail: {e}"),
    };
    let body = String::from_utf8(body).expect("the HTML writer writes text");
    let len = parts
        .iter()
        .map(|p| match p {
            Part::Text(text) => text.len(),
            Part::Body => body.len(),
        })
        .sum();
    let mut page = String::with_capacity(len);
    for part in &parts {
        match part {
            Part::Text(text) => page.push_str(text),
            Part::Body => page.push_str(&body),
        }
    }
    page
}

/// Renders the body of `markdown`'s page into `sink` and returns the whole
/// page as parts, in order; [`Part::Body`] stands for what `sink` holds.
/// The same bytes as [`markdown_to_html`], without holding the page.
pub fn render_page(
    markdown: &str,
    options: &RenderOptions<'_>,
    sink: &mut dyn io::Write,
) -> io::Result<Vec<Part>> {
    // CommonMark: U+0000 is replaced by U+FFFD.
    let markdown = match memchr::memchr(0, markdown.as_bytes()) {
        Some(_) => Cow::Owned(markdown.replace('\0', "\u{fffd}")),
        None => Cow::Borrowed(markdown),
    };
    let parser = Parser::new_ext(&markdown, parser_options());
    let (last, title) = if options.raw_html == RawHtml::Sanitize {
        sanitize::render_body(parser, sink, options)?
    } else {
        render_body(parser, sink, options)?
    };
    Ok(layout(&title, last, options))
}

/// Writes the HTML of a parser's events to `sink`; returns the last byte
/// written (`None`: nothing) and the title.
fn render_body<'a>(
    events: impl Iterator<Item = pulldown_cmark::Event<'a>>,
    sink: &mut dyn io::Write,
    options: &RenderOptions<'_>,
) -> io::Result<(Option<u8>, String)> {
    let mut rewriter = events::Rewriter::new(events, options);
    let mut out = LastByte { sink, last: None };
    html::write_all(&mut rewriter, &mut out)?;
    let title = rewriter
        .into_title()
        .unwrap_or_else(|| file_stem(options.source_path));
    Ok((out.last, title))
}

/// A writer that remembers the last byte written through it.
pub(super) struct LastByte<'s> {
    sink: &'s mut dyn io::Write,
    last: Option<u8>,
}

impl io::Write for LastByte<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.sink.write(buf)?;
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }
}

/// The parts of the page around a body whose last byte is `last`.
fn layout(title: &str, last: Option<u8>, options: &RenderOptions<'_>) -> Vec<Part> {
    match options.template {
        Some(template) => template_parts(template, title),
        None => document(title, last),
    }
}

/// The markdown extensions of docs/contract.md §10 and §21.5 (GFM's
/// alerts), and nothing else.
fn parser_options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM
}

/// The fixed HTML5 skeleton around a body whose last byte is `last`.
fn document(title: &str, last: Option<u8>) -> Vec<Part> {
    let mut head = String::with_capacity(STYLESHEET.len() + title.len() + 300);
    head.push_str("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n");
    head.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    head.push_str("<title>");
    push_escaped(&mut head, title);
    head.push_str("</title>\n<style>\n");
    head.push_str(STYLESHEET);
    head.push_str("</style>\n</head>\n<body>\n");
    let mut tail = String::new();
    if last.is_some_and(|b| b != b'\n') {
        tail.push('\n');
    }
    tail.push_str("</body>\n</html>\n");
    vec![Part::Text(head), Part::Body, Part::Text(tail)]
}

/// A page template's parts: every `{{title}}` becomes the escaped title and
/// every `{{content}}` the body, in one pass over the template.
fn template_parts(template: &str, title: &str) -> Vec<Part> {
    const TITLE: &str = "{{title}}";
    const CONTENT: &str = "{{content}}";
    let mut parts = Vec::new();
    let mut text = String::with_capacity(template.len() + title.len());
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        text.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix(TITLE) {
            push_escaped(&mut text, title);
            rest = after;
        } else if let Some(after) = tail.strip_prefix(CONTENT) {
            parts.push(Part::Text(std::mem::take(&mut text)));
            parts.push(Part::Body);
            rest = after;
        } else {
            text.push_str("{{");
            rest = &tail[2..];
        }
    }
    text.push_str(rest);
    parts.push(Part::Text(text));
    parts
}

/// Appends `text` with the HTML special characters escaped.
fn push_escaped(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
}

/// File name of `source_path` without its `.md` extension.
pub(super) fn file_stem(source_path: &str) -> String {
    let name = source_path.rsplit('/').next().unwrap_or(source_path);
    match name.strip_suffix(".md") {
        Some(stem) if !stem.is_empty() => stem.to_owned(),
        _ => name.to_owned(),
    }
}
