//! `raw_html: sanitize` (docs/contract.md §16.4): the raw HTML of a page is
//! cleaned by `ammonia`'s allowlist sanitizer, configured after what GitHub
//! keeps of a README: layout and text elements (`div align`, `img`,
//! `picture`/`source`, `details`/`summary`, `sub`, `sup`, `kbd`, `br`,
//! tables, ...), and nothing that runs, styles or frames (`script`, `style`,
//! `iframe`, `object`, `embed`, `form`, `svg`, `math`, `base`, `meta`, `link`
//! go, so do event handlers and `style` attributes); link and image targets
//! (`srcset` candidates too) only `http`, `https`, `mailto` or relative;
//! comments dropped. In-page targets of raw HTML (`id`, `<a name>`) stay
//! with GitHub's `user-content-` prefix (the renderer's heading and
//! footnote ids keep their names), and so does a table cell's `valign`;
//! an `<input>` is only ever a disabled checkbox.
//!
//! What is sanitized is rendered HTML, not each raw fragment on its own, so
//! that the structure a README builds across markdown and HTML (a centred
//! `<div>` around markdown paragraphs) stays as a browser shows it. To keep
//! the memory of a big page bounded as elsewhere (docs/contract.md §12.3),
//! the page goes in stretches: top-level blocks are written as they come,
//! and a stretch of them is held only from a block with raw HTML to the
//! next top-level boundary where every element its raw HTML opened is
//! closed again; only elements the sanitizer keeps count, so a stray
//! `Vec<u8>` in prose (a tag to an HTML parser) holds nothing open. A
//! stretch without raw HTML is written as it is: the allowlist holds
//! everything the renderer itself writes (heading ids and self-links,
//! footnotes, code languages, task-list boxes), so a page without raw HTML
//! is the same in every mode.

use super::html::{Piece, Writer};
use super::tags::{first_heading, tag_end, tag_name};
use super::{LastByte, RenderOptions, events, links};
use pulldown_cmark::{Event, Tag};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashSet};
use std::io;

/// [`super::render_body`] in sanitize mode: returns the last byte written
/// and the title, the first heading of the page, one in raw HTML too.
pub(super) fn render_body<'a>(
    events: impl Iterator<Item = Event<'a>>,
    sink: &mut dyn io::Write,
    options: &RenderOptions<'_>,
) -> io::Result<(Option<u8>, String)> {
    let mut rewriter = events::Rewriter::new(events, options);
    let mut out = LastByte { sink, last: None };
    let own = OwnIds::default();
    let builder = builder(options, &own);
    let kept = builder.clone_tags();
    let mut writer = Writer::default();
    // The stretch being written: its HTML, and the ids of its headings.
    let mut stretch = String::new();
    let mut heading_ids: Vec<String> = Vec::new();
    let mut depth = 0usize;
    let mut open_html = 0i64;
    let mut raw = false;
    // The first heading's text when it came out of a sanitized stretch;
    // `Some(None)` when the first heading was an ordinary one.
    let mut title: Option<Option<String>> = None;
    for piece in rewriter.by_ref() {
        match &piece {
            Piece::Event(Event::Start(tag)) => {
                if let Tag::Heading { id, .. } = tag {
                    if title.is_none() && !raw {
                        title = Some(None);
                    }
                    heading_ids.extend(id.as_ref().map(ToString::to_string));
                }
                depth += 1;
            }
            Piece::Event(Event::End(_)) | Piece::Close(_) => depth = depth.saturating_sub(1),
            Piece::Open(_) => depth += 1,
            Piece::Event(Event::Html(text) | Event::InlineHtml(text)) => {
                raw = true;
                open_html += balance(text, &kept);
            }
            _ => {}
        }
        writer.write(piece, &mut stretch);
        if depth == 0 && (!raw || open_html <= 0) {
            flush(
                &builder,
                &own,
                &mut stretch,
                &mut heading_ids,
                raw,
                &mut out,
                &mut title,
            )?;
            writer.at_line_start();
            raw = false;
            open_html = 0;
        }
    }
    flush(
        &builder,
        &own,
        &mut stretch,
        &mut heading_ids,
        raw,
        &mut out,
        &mut title,
    )?;
    let from_events = rewriter.into_title();
    let title = match title {
        // The first heading was raw HTML, or inside a stretch that was.
        Some(Some(t)) => (!t.is_empty()).then_some(t),
        _ => from_events,
    }
    .unwrap_or_else(|| super::file_stem(options.source_path));
    Ok((out.last, title))
}

/// The ids the renderer itself gave in the stretch being sanitized (its
/// headings'), which keep their names; every other `id` and `<a name>`
/// comes from raw HTML and is prefixed ([`USER_CONTENT`]).
#[derive(Default, Clone)]
struct OwnIds(std::sync::Arc<std::sync::Mutex<HashSet<String>>>);

impl OwnIds {
    fn set(&self, heading_ids: &mut Vec<String>) {
        let mut own = self.0.lock().unwrap_or_else(|e| e.into_inner());
        own.clear();
        own.extend(heading_ids.drain(..));
    }

    /// Whether `id` on `element` is the renderer's: a heading's id of the
    /// stretch on a heading, or a footnote's (`fn-N` on its item,
    /// `fnref-N` on a reference's link; no heading takes those). The same
    /// id on any other element is raw HTML's.
    fn holds(&self, element: &str, id: &str) -> bool {
        let footnote = |prefix: &str| {
            id.strip_prefix(prefix)
                .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        };
        match element {
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => self
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(id),
            "li" => footnote("fn-"),
            "a" => footnote("fnref-"),
            _ => false,
        }
    }
}

/// What GitHub puts before the ids and anchor names of raw HTML, so that an
/// element of the page cannot take the name of a global a site's own
/// script uses (DOM clobbering: `<img name="config">` is `window.config`).
/// In-page links to such a target use `#user-content-NAME`, as on GitHub.
const USER_CONTENT: &str = "user-content-";

/// Writes a stretch of the page, sanitized when it holds raw HTML.
fn flush(
    builder: &ammonia::Builder<'_>,
    own: &OwnIds,
    stretch: &mut String,
    heading_ids: &mut Vec<String>,
    raw: bool,
    out: &mut LastByte<'_>,
    title: &mut Option<Option<String>>,
) -> io::Result<()> {
    if stretch.is_empty() {
        heading_ids.clear();
        return Ok(());
    }
    if !raw {
        heading_ids.clear();
        io::Write::write_all(out, stretch.as_bytes())?;
        stretch.clear();
        return Ok(());
    }
    own.set(heading_ids);
    let clean = builder.clean(stretch).to_string();
    stretch.clear();
    if title.is_none() {
        *title = first_heading(&clean).map(Some);
    }
    io::Write::write_all(out, clean.as_bytes())
}

/// How many elements the raw HTML `text` leaves open: opening tags of the
/// elements the sanitizer keeps (`kept`) count one up, their closing tags
/// one down; void elements, self-closing tags, comments, declarations and
/// elements the sanitizer removes count nothing. A removed element leaves
/// nothing behind that could span blocks, and counting it would make a
/// Rust generic in prose (`Vec<u8>`, `Option<T>`: tags to an HTML parser,
/// never closed) hold the rest of the page in one stretch.
fn balance(text: &str, kept: &HashSet<&str>) -> i64 {
    const VOID: [&str; 14] = [
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
        "source", "track", "wbr",
    ];
    let mut n = 0;
    let mut rest = text;
    while let Some(lt) = rest.find('<') {
        rest = &rest[lt..];
        if let Some(after) = rest.strip_prefix("<!--") {
            rest = after.find("-->").map_or("", |e| &after[e + 3..]);
            continue;
        }
        let end = tag_end(rest);
        let tag = &rest[1..end];
        rest = &rest[end..];
        let (closing, name) = tag_name(tag);
        if name.is_empty() || VOID.contains(&name.as_str()) || !kept.contains(name.as_str()) {
            continue;
        }
        if closing {
            n -= 1;
        } else if !tag.trim_end_matches('>').ends_with('/') {
            n += 1;
        }
    }
    n
}

/// The allowlist: ammonia's defaults (close to GitHub's), plus what READMEs
/// and the renderer use, minus every scheme but `http`, `https` and `mailto`.
/// A relative link or image to a generated `.md` page of the bundle is
/// rewritten to its `.html` page, as in markdown (docs/contract.md §10).
fn builder<'o>(options: &RenderOptions<'o>, own: &OwnIds) -> ammonia::Builder<'o> {
    let mut b = ammonia::Builder::default();
    b.add_tags(["picture", "source", "input", "section"])
        .add_generic_attributes(["id", "align"])
        // `name` is the target of in-page links (`<a name="usage">`).
        .add_tag_attributes("a", ["aria-label", "name"])
        // GitHub keeps a table cell's vertical alignment.
        .add_tag_attributes("td", ["valign"])
        .add_tag_attributes("th", ["valign"])
        .add_tag_attributes("tr", ["valign"])
        .add_tag_attributes("img", ["srcset"])
        .add_tag_attributes("source", ["srcset", "media", "type", "width", "height"])
        // Only disabled checkboxes (task lists), as on GitHub: whatever
        // the raw HTML says, an input is a checkbox nobody can change (a
        // text, password, file or hidden field never reaches the site).
        .add_tag_attributes("input", ["checked"])
        .set_tag_attribute_value("input", "type", "checkbox")
        .set_tag_attribute_value("input", "disabled", "")
        .add_tag_attributes("details", ["open"])
        // What the renderer writes: self-links, footnotes, alerts.
        .add_allowed_classes("a", ["anchor", "footnote-backref"])
        .add_allowed_classes("sup", ["footnote-ref"])
        .add_allowed_classes("section", ["footnotes"])
        .add_tag_attributes("section", ["data-footnotes"])
        .add_tag_attributes(
            "a",
            [
                "data-footnote-ref",
                "data-footnote-backref",
                "data-footnote-backref-idx",
            ],
        )
        .add_allowed_classes(
            "div",
            [
                "markdown-alert",
                "markdown-alert-note",
                "markdown-alert-tip",
                "markdown-alert-important",
                "markdown-alert-warning",
                "markdown-alert-caution",
            ],
        )
        .add_allowed_classes("p", ["markdown-alert-title"])
        .url_schemes(HashSet::from(["http", "https", "mailto"]))
        // Links keep the attributes the page gives them; none opens a new
        // window (`target` is not allowed), so no `rel` is needed.
        .link_rel(None)
        .strip_comments(true);
    b.url_relative(ammonia::UrlRelative::Custom(Box::new(MarkdownLinks {
        source_path: options.source_path,
        generated: options.generated_markdown,
    })));
    let own = own.clone();
    b.attribute_filter(move |element, attribute, value| {
        // Raw HTML's in-page targets get GitHub's prefix; the renderer's
        // (heading slugs, footnotes) keep theirs, with their links.
        if attribute == "id" || (element == "a" && attribute == "name") {
            if value.starts_with(USER_CONTENT) || own.holds(element, value) {
                return Some(value.into());
            }
            return Some(format!("{USER_CONTENT}{value}").into());
        }
        // Code blocks say their language as `language-NAME`.
        if element == "code" && attribute == "class" {
            let ok = value
                .strip_prefix("language-")
                .is_some_and(|l| !l.is_empty() && l.chars().all(is_language_char));
            return ok.then(|| value.into());
        }
        // ammonia checks the schemes of `src` and `href`, not `srcset`.
        if attribute == "srcset" {
            return srcset_is_safe(value).then(|| value.into());
        }
        Some(value.into())
    });
    b.add_tag_attributes("code", ["class"]);
    b
}

/// Rewrites the relative URLs of raw HTML that lead to a generated `.md`
/// page, and passes the others through.
struct MarkdownLinks<'o> {
    source_path: &'o str,
    generated: &'o BTreeSet<String>,
}

impl<'o> ammonia::UrlRelativeEvaluate<'o> for MarkdownLinks<'o> {
    fn evaluate<'url>(&self, url: &'url str) -> Option<Cow<'url, str>> {
        Some(
            match links::rewrite_markdown_link(url, self.source_path, self.generated) {
                Some(rewritten) => Cow::Owned(rewritten),
                None => Cow::Borrowed(url),
            },
        )
    }
}

/// Whether every image candidate of a `srcset` is `http`, `https` or
/// relative. Every piece between commas and white space is judged as if it
/// were a URL (descriptors such as `2x` have no scheme), so a URL holding a
/// comma or a tab is judged by its pieces: a stricter reading than the
/// browser's, never a looser one.
fn srcset_is_safe(srcset: &str) -> bool {
    srcset
        .split(|c: char| c == ',' || c.is_ascii_whitespace())
        .all(|piece| {
            let piece: String = piece
                .chars()
                .filter(|c| !c.is_ascii_control())
                .collect::<String>()
                .to_ascii_lowercase();
            !links::has_scheme(&piece) || piece.starts_with("http:") || piece.starts_with("https:")
        })
}

fn is_language_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+' | '#' | '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balance_counts_the_elements_raw_html_leaves_open() {
        // (raw HTML, elements left open)
        let cases = [
            ("<div align=\"center\">\n", 1),
            ("</div>\n", -1),
            ("<div><p>x</p></div>", 0),
            ("<img src=\"a.png\"><br><hr/>", 0),
            ("<span/>", 0),
            ("<!-- <div> -->", 0),
            ("<!-- unterminated <div>", 0),
            ("<details><summary>More</summary>\n", 1),
            ("<a title=\"x > y\" href=\"#\">", 1),
            ("<DIV>", 1),
            ("<picture><source srcset=\"d.png\">", 1),
            // Rust generics in prose are tags the sanitizer drops: they
            // hold nothing open (a page with `Vec<u8>` in its first
            // paragraph was sanitized whole, past its memory limit).
            ("<u8>", 0),
            ("<T>", 0),
            ("<String>", 0),
            ("<dyn Send>", 0),
            ("<textarea>", 0),
        ];
        let generated = std::collections::BTreeSet::new();
        let options = RenderOptions {
            raw_html: crate::config::RawHtml::Sanitize,
            source_path: "a.md",
            generated_markdown: &generated,
            template: None,
        };
        let kept = builder(&options, &OwnIds::default()).clone_tags();
        for (raw, open) in cases {
            assert_eq!(balance(raw, &kept), open, "{raw:?}");
        }
    }
}
