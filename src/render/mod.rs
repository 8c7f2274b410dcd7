//! Markdown to HTML (SPEC §10, §16): turns one CommonMark file of a bundle
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
//! Memory stays proportional to the input: events are streamed from the
//! parser to the writer, never collected (SPEC §12.3).
//!
//! Decisions where the contract is silent:
//!
//! - In escape mode an HTML *block* becomes a paragraph holding its source as
//!   text (`<p>&lt;div&gt;…</p>`), the way CommonMark renderers with raw HTML
//!   disabled show it; inline HTML becomes text where it stands.
//! - A neutralised link or image target (`javascript:`, `vbscript:`,
//!   `data:`) is replaced by `#`, so the link text stays visible but goes
//!   nowhere. The scheme is checked after removing every ASCII whitespace and
//!   control character, as browsers do, and case-insensitively.
//! - The `<title>` is the plain text of the first heading as a reader sees
//!   it: text, inline code and image alt text, whitespace collapsed. Raw HTML
//!   tags are left out when raw HTML is allowed (they are markup) and kept
//!   when it is escaped (they are then visible text).
//!   When the first heading has no text, the file name without `.md` is used.
//! - A relative `.md` link is rewritten only when its path is literally
//!   spelled with `.md` at the end; percent-escapes are decoded for the lookup
//!   only, and a link that climbs above the bundle root is left alone.
//! - Heading ids: see [`ids`]. Each heading ends with a self-link
//!   `<a class="anchor" href="#id">#</a>`, shown on hover by the default
//!   stylesheet.
//! - Footnotes are numbered in the order they are first referenced (or
//!   defined); the definition is `id="fn-N"`, the first reference
//!   `id="fnref-N"`, further references to the same note `fnref-N-2`, ...
//!   Labels match case-insensitively. A definition that was referenced
//!   before it ends with a back-link to the first reference.
//! - Bare URLs: see [`autolink`].
//! - With a template, `{{title}}` is replaced by the escaped title and
//!   `{{content}}` by the body, each wherever it occurs, in one pass: text
//!   inserted is never searched again.

use std::collections::BTreeSet;

use pulldown_cmark::{Options, Parser, html};

mod autolink;
mod events;
mod ids;
mod links;
mod split;

#[cfg(test)]
mod tests;

/// What to render and how.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    /// `raw_html: allow` in config. false = escape (the default).
    pub allow_raw_html: bool,
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

/// Renders CommonMark to a complete UTF-8 HTML5 document. Pure and deterministic.
pub fn markdown_to_html(markdown: &str, options: &RenderOptions<'_>) -> String {
    render(markdown, options, &split::Settings::DEFAULT).0
}

/// [`markdown_to_html`] with the sizes that decide how a big document is
/// parsed in pieces (see [`split`]); the bytes come out the same whatever
/// they are. Also says how many pieces were parsed on their own.
fn render(
    markdown: &str,
    options: &RenderOptions<'_>,
    settings: &split::Settings,
) -> (String, usize) {
    let mut cuts = split::find_cuts(markdown, settings);
    // Each round drops the pieces whose token came out somewhere it does not
    // mean the same thing; rarely more than one is needed.
    for _ in 0..4 {
        if cuts.is_empty() {
            break;
        }
        let plan = split::Plan::new(markdown, cuts, settings);
        let mut splicer = split::Splicer::new(&plan, parser_options());
        let (body, title) = render_body(&mut splicer, markdown.len(), options);
        let failed = splicer.failed();
        if failed.is_empty() {
            return (page(body, title, options), plan.pieces());
        }
        drop(body);
        cuts = plan.into_cuts_without(&failed);
    }
    let parser = Parser::new_ext(markdown, parser_options());
    let (body, title) = render_body(parser, markdown.len(), options);
    (page(body, title, options), 0)
}

/// The HTML of a parser's events, and the title.
fn render_body<'a>(
    events: impl Iterator<Item = pulldown_cmark::Event<'a>>,
    markdown_len: usize,
    options: &RenderOptions<'_>,
) -> (String, String) {
    let mut rewriter = events::Rewriter::new(events, options);
    // Sized for typical output so the buffer rarely grows (each growth
    // briefly holds the old and the new buffer).
    let mut body = String::with_capacity(markdown_len.saturating_mul(2) + 4096);
    html::push_html(&mut body, &mut rewriter);
    let title = rewriter
        .into_title()
        .unwrap_or_else(|| file_stem(options.source_path));
    (body, title)
}

/// The complete page around a rendered body.
fn page(body: String, title: String, options: &RenderOptions<'_>) -> String {
    match options.template {
        Some(template) => apply_template(template, &title, body),
        None => document(&title, body),
    }
}

/// The markdown extensions of SPEC §10, and nothing else.
fn parser_options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
}

/// Wraps the rendered body in the fixed HTML5 skeleton, reusing the body's
/// buffer.
fn document(title: &str, mut body: String) -> String {
    let mut head = String::with_capacity(STYLESHEET.len() + title.len() + 300);
    head.push_str("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n");
    head.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    head.push_str("<title>");
    push_escaped(&mut head, title);
    head.push_str("</title>\n<style>\n");
    head.push_str(STYLESHEET);
    head.push_str("</style>\n</head>\n<body>\n");
    if !body.is_empty() && !body.ends_with('\n') {
        body.push('\n');
    }
    body.reserve(head.len() + 20);
    body.insert_str(0, &head);
    body.push_str("</body>\n</html>\n");
    body
}

/// Fills a page template: every `{{title}}` becomes the escaped title and
/// every `{{content}}` the body, in one pass over the template.
fn apply_template(template: &str, title: &str, body: String) -> String {
    const TITLE: &str = "{{title}}";
    const CONTENT: &str = "{{content}}";
    let mut escaped_title = String::with_capacity(title.len());
    push_escaped(&mut escaped_title, title);
    // The template text with its placeholders filled, except the first
    // `{{content}}`, which is where `body`'s own buffer goes.
    let fill = |text: &str, out: &mut String| {
        let mut rest = text;
        while let Some(at) = rest.find("{{") {
            out.push_str(&rest[..at]);
            let tail = &rest[at..];
            if let Some(after) = tail.strip_prefix(TITLE) {
                out.push_str(&escaped_title);
                rest = after;
            } else if let Some(after) = tail.strip_prefix(CONTENT) {
                out.push_str(&body);
                rest = after;
            } else {
                out.push_str("{{");
                rest = &tail[2..];
            }
        }
        out.push_str(rest);
    };
    let Some(at) = template.find(CONTENT) else {
        // Config loading refuses such templates; render the template alone.
        let mut out = String::new();
        fill(template, &mut out);
        return out;
    };
    let mut before = String::with_capacity(at + title.len());
    fill(&template[..at], &mut before);
    let mut after = String::new();
    fill(&template[at + CONTENT.len()..], &mut after);
    let mut page = body;
    page.reserve(before.len() + after.len());
    page.insert_str(0, &before);
    page.push_str(&after);
    page
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
fn file_stem(source_path: &str) -> String {
    let name = source_path.rsplit('/').next().unwrap_or(source_path);
    match name.strip_suffix(".md") {
        Some(stem) if !stem.is_empty() => stem.to_owned(),
        _ => name.to_owned(),
    }
}
