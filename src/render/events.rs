//! The event stream between the parser and the HTML writer: raw HTML
//! escaping, GFM's tag filter, link rewriting, bare-URL autolinks, heading
//! and footnote ids, the section of footnotes, and the page title, applied
//! one event at a time.
//!
//! It holds back only what one decision needs (the text run being searched
//! for URLs, one heading, one HTML block), so memory follows the largest
//! block, not the document; footnote definitions are the exception: they
//! are held to the end of the page, where GitHub puts them.

use crate::config::RawHtml;
use std::collections::{HashMap, VecDeque};

use pulldown_cmark::{CowStr, Event, HeadingLevel, LinkType, Tag, TagEnd};

use super::autolink::Autolink;
use super::html::Piece;
use super::ids::Ids;
use super::links::rewrite_destination;
use super::{RenderOptions, autolink, push_escaped};

/// A heading being collected: its events (already rewritten) and text.
struct Heading<'a> {
    level: HeadingLevel,
    classes: Vec<CowStr<'a>>,
    attrs: Vec<(CowStr<'a>, Option<CowStr<'a>>)>,
    events: Vec<Piece<'a>>,
    /// Text for the slug: what a reader sees, without image alt text.
    slug_text: String,
    /// Text for the title: the same plus image alt text.
    title_text: String,
    /// Depth of images being collected (their text is alt text).
    in_image: usize,
}

/// Iterator adapter from parser events to the writer's pieces.
pub(super) struct Rewriter<'a, 'o, I> {
    inner: I,
    options: &'o RenderOptions<'o>,
    escape: bool,
    /// Pieces ready for the writer.
    ready: VecDeque<Piece<'a>>,
    /// Consecutive plain text not yet searched for URLs: one piece in
    /// `text`, or several joined in `joined`.
    text: Option<CowStr<'a>>,
    joined: String,
    /// Source of the HTML block being collected, in escape mode.
    raw_block: Option<String>,
    heading: Option<Heading<'a>>,
    /// Depth of links and images: their text is never autolinked.
    in_link: usize,
    /// `[` of the text of the current block left open (no URL is linked
    /// inside brackets, see [`autolink`]).
    brackets: usize,
    /// Depth of raw `<a>` tags (raw HTML allowed).
    in_raw_anchor: usize,
    in_code_block: bool,
    /// The footnote definitions being collected (one inside another, if
    /// the parser ever nests them): label (lowercased) and pieces.
    definition: Vec<(String, Vec<Piece<'a>>)>,
    /// The footnote definitions seen, by lowercased label (the first of a
    /// label counts), written at the end of the page.
    definitions: HashMap<String, Vec<Piece<'a>>>,
    /// Whether the parser's events have all been read.
    done: bool,
    ids: Ids,
    /// Plain text of the first heading; `Some` once it has been seen.
    title: Option<String>,
    /// Allowed raw HTML seen before the first heading (raw HTML allowed
    /// only), looked through for a heading written in raw HTML.
    raw_before: Option<String>,
}

/// The most raw HTML before the first heading that is looked through for a
/// heading: a README's opening banner, not a document.
const RAW_TITLE_CAP: usize = 64 * 1024;

impl<'a, 'o, I: Iterator<Item = Event<'a>>> Rewriter<'a, 'o, I> {
    pub(super) fn new(inner: I, options: &'o RenderOptions<'o>) -> Self {
        Rewriter {
            inner,
            options,
            escape: options.raw_html == RawHtml::Escape,
            ready: VecDeque::new(),
            text: None,
            joined: String::new(),
            raw_block: None,
            heading: None,
            in_link: 0,
            brackets: 0,
            in_raw_anchor: 0,
            in_code_block: false,
            definition: Vec::new(),
            definitions: HashMap::new(),
            done: false,
            ids: Ids::default(),
            title: None,
            raw_before: (options.raw_html == RawHtml::Allow).then(String::new),
        }
    }

    /// With raw HTML allowed, a heading written in raw HTML before any
    /// markdown heading is the title too (docs/contract.md §16.4).
    fn look_for_raw_title(&mut self, html: &str) {
        if self.title.is_some() || self.heading.is_some() {
            return;
        }
        let Some(raw) = self.raw_before.as_mut() else {
            return;
        };
        if raw.len() + html.len() > RAW_TITLE_CAP {
            self.raw_before = None;
            return;
        }
        raw.push_str(html);
        if html.contains("</")
            && let Some(title) = super::tags::first_heading(raw)
        {
            self.title = Some(title);
            self.raw_before = None;
        }
    }

    /// The title: plain text of the first heading, white space (any
    /// Unicode white space, `&emsp;` too) collapsed, or `None` when there is
    /// no heading or it has no text. Meaningful once the stream is
    /// exhausted.
    pub(super) fn into_title(self) -> Option<String> {
        let title = self.title?;
        let collapsed = title.split_whitespace().collect::<Vec<_>>().join(" ");
        (!collapsed.is_empty()).then_some(collapsed)
    }

    /// Hands a piece on: into the heading being collected, else
    /// [`Self::put`].
    fn emit(&mut self, piece: impl Into<Piece<'a>>) {
        let piece = piece.into();
        match self.heading.as_mut() {
            Some(heading) => {
                match &piece {
                    Piece::Event(Event::Start(Tag::Image { .. })) => heading.in_image += 1,
                    Piece::Event(Event::End(TagEnd::Image)) => heading.in_image -= 1,
                    Piece::Event(Event::Text(t) | Event::Code(t)) => {
                        heading.title_text.push_str(t);
                        if heading.in_image == 0 {
                            heading.slug_text.push_str(t);
                        }
                    }
                    Piece::Event(Event::SoftBreak | Event::HardBreak) => {
                        heading.title_text.push(' ');
                        heading.slug_text.push(' ');
                    }
                    _ => {}
                }
                heading.events.push(piece);
            }
            None => self.put(piece),
        }
    }

    /// Hands a piece on: into the footnote definition being collected,
    /// else out.
    fn put(&mut self, piece: Piece<'a>) {
        match self.definition.last_mut() {
            Some((_, pieces)) => pieces.push(piece),
            None => self.ready.push_back(piece),
        }
    }

    /// Emits the pending text run, with its bare URLs as links.
    fn flush_text(&mut self) {
        let text = if self.joined.is_empty() {
            match self.text.take() {
                Some(text) => text,
                None => return,
            }
        } else {
            CowStr::from(std::mem::take(&mut self.joined))
        };
        let links = autolink::find(&text, &mut self.brackets);
        if links.is_empty() {
            self.emit(Event::Text(text));
            return;
        }
        let piece = |range: std::ops::Range<usize>| -> CowStr<'a> {
            match &text {
                CowStr::Borrowed(s) => CowStr::Borrowed(&s[range]),
                other => other[range].to_owned().into(),
            }
        };
        let mut at = 0;
        let mut pieces = Vec::with_capacity(links.len() * 4 + 1);
        for (kind, range) in links {
            if range.start > at {
                pieces.push(Event::Text(piece(at..range.start)));
            }
            let dest_url = match kind {
                Autolink::Url => piece(range.clone()),
                Autolink::Www => format!("http://{}", &text[range.clone()]).into(),
                Autolink::Email => format!("mailto:{}", &text[range.clone()]).into(),
            };
            pieces.push(Event::Start(Tag::Link {
                link_type: LinkType::Inline,
                dest_url,
                title: CowStr::Borrowed(""),
                id: CowStr::Borrowed(""),
            }));
            pieces.push(Event::Text(piece(range.clone())));
            pieces.push(Event::End(TagEnd::Link));
            at = range.end;
        }
        if at < text.len() {
            pieces.push(Event::Text(piece(at..text.len())));
        }
        for event in pieces {
            self.emit(event);
        }
    }

    /// Adds plain text to the pending run. A run of several pieces is
    /// joined in `joined`, which grows by doubling (joining into the `CowStr`
    /// itself would copy the run for every piece).
    fn push_text(&mut self, more: CowStr<'a>) {
        match self.text.take() {
            None if self.joined.is_empty() => self.text = Some(more),
            None => self.joined.push_str(&more),
            Some(run) => {
                self.joined.push_str(&run);
                self.joined.push_str(&more);
            }
        }
    }

    /// Turns one parser event into writer pieces.
    fn process(&mut self, event: Event<'a>) {
        if (self.text.is_some() || !self.joined.is_empty()) && !matches!(event, Event::Text(_)) {
            self.flush_text();
        }
        // GFM's tag filter (docs/contract.md §21.5) where raw HTML passes
        // through: escaped, it is all text already; sanitized, the
        // sanitizer removes those tags (a script and a style with their
        // content: neither run nor shown).
        let allowed = self.options.raw_html == RawHtml::Allow;
        let event = match event {
            Event::Html(html) if allowed => Event::Html(tag_filter(html)),
            Event::InlineHtml(html) if allowed => Event::InlineHtml(tag_filter(html)),
            other => other,
        };
        if let Event::Start(tag) = &event
            && !is_inline(tag)
        {
            self.brackets = 0;
        }
        match event {
            Event::Start(Tag::HtmlBlock) if self.escape => self.raw_block = Some(String::new()),
            Event::End(TagEnd::HtmlBlock) if self.escape => {
                // Comments are dropped, never shown (docs/contract.md §16.4).
                let source = without_comments(&self.raw_block.take().unwrap_or_default());
                let source = source.trim_end_matches(['\n', '\r']);
                if !source.trim().is_empty() {
                    self.emit(Event::Start(Tag::Paragraph));
                    self.emit(Event::Text(source.to_owned().into()));
                    self.emit(Event::End(TagEnd::Paragraph));
                }
            }
            Event::Html(text) if self.escape => match self.raw_block.as_mut() {
                Some(source) => source.push_str(&text),
                None => self.emit(Event::Text(text)),
            },
            Event::InlineHtml(text) if self.escape && text.starts_with("<!--") => {}
            Event::InlineHtml(text) if self.escape => self.emit(Event::Text(text)),
            Event::InlineHtml(text) => {
                self.track_raw_anchor(&text);
                self.look_for_raw_title(&text);
                self.emit(Event::InlineHtml(text));
            }
            Event::Html(text) => {
                self.look_for_raw_title(&text);
                self.emit(Event::Html(text));
            }
            Event::Text(text) => {
                if self.in_link == 0 && self.in_raw_anchor == 0 && !self.in_code_block {
                    self.push_text(text);
                } else {
                    self.emit(Event::Text(text));
                }
            }
            Event::Start(Tag::CodeBlock(kind)) => {
                self.in_code_block = true;
                self.emit(Event::Start(Tag::CodeBlock(kind)));
            }
            Event::End(TagEnd::CodeBlock) => {
                self.in_code_block = false;
                self.emit(Event::End(TagEnd::CodeBlock));
            }
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                title,
                id,
            }) => {
                self.in_link += 1;
                self.emit(Event::Start(Tag::Link {
                    link_type,
                    dest_url: rewrite_destination(dest_url, link_type, self.options),
                    title,
                    id,
                }));
            }
            Event::Start(Tag::Image {
                link_type,
                dest_url,
                title,
                id,
            }) => {
                self.in_link += 1;
                self.emit(Event::Start(Tag::Image {
                    link_type,
                    dest_url: rewrite_destination(dest_url, link_type, self.options),
                    title,
                    id,
                }));
            }
            Event::End(end @ (TagEnd::Link | TagEnd::Image)) => {
                self.in_link = self.in_link.saturating_sub(1);
                self.emit(Event::End(end));
            }
            Event::Start(Tag::Heading {
                level,
                classes,
                attrs,
                ..
            }) => {
                self.heading = Some(Heading {
                    level,
                    classes,
                    attrs,
                    events: Vec::new(),
                    slug_text: String::new(),
                    title_text: String::new(),
                    in_image: 0,
                });
            }
            Event::End(TagEnd::Heading(level)) => self.finish_heading(level),
            Event::FootnoteReference(label) => {
                let (number, id) = self.ids.footnote_reference(&label);
                self.emit(Piece::FootnoteRef { number, id });
            }
            Event::Start(Tag::FootnoteDefinition(label)) => {
                self.definition.push((label.to_lowercase(), Vec::new()));
            }
            Event::End(TagEnd::FootnoteDefinition) => self.end_definition(),
            other => self.emit(other),
        }
    }

    /// Counts raw `<a ...>` and `</a>` tags, so that a bare URL inside a raw
    /// anchor is not linked a second time.
    fn track_raw_anchor(&mut self, html: &str) {
        let lower = html.trim_start().to_ascii_lowercase();
        if lower.starts_with("</a>") || lower.starts_with("</a ") {
            self.in_raw_anchor = self.in_raw_anchor.saturating_sub(1);
        } else if lower.starts_with("<a>") || lower.starts_with("<a ") {
            self.in_raw_anchor += 1;
        }
    }

    /// Writes the collected heading with its id and self-link.
    fn finish_heading(&mut self, level: HeadingLevel) {
        let Some(heading) = self.heading.take() else {
            self.emit(Event::End(TagEnd::Heading(level)));
            return;
        };
        let id = self.ids.heading(heading.slug_text.trim());
        if self.title.is_none() {
            self.title = Some(heading.title_text);
        }
        let mut anchor = String::with_capacity(id.len() * 2 + 80);
        anchor.push_str("<a class=\"anchor\" href=\"#");
        push_escaped(&mut anchor, &id);
        anchor.push_str("\" aria-label=\"Link to this section\">#</a>");
        self.put(Piece::Event(Event::Start(Tag::Heading {
            level: heading.level,
            id: Some(id.into()),
            classes: heading.classes,
            attrs: heading.attrs,
        })));
        for piece in heading.events {
            self.put(piece);
        }
        self.put(Piece::Markup(anchor.into()));
        self.put(Piece::Event(Event::End(TagEnd::Heading(level))));
    }

    /// Keeps the footnote definition just collected for the end of the
    /// page (the first one of its label).
    fn end_definition(&mut self) {
        if let Some((label, pieces)) = self.definition.pop() {
            self.definitions.entry(label).or_insert(pieces);
        }
    }

    /// The section of footnotes at the end of the page, as GitHub writes
    /// it: the definitions that were referenced, in the order of their
    /// numbers, each ending with a back-link to each of its references
    /// (inside its last paragraph when it ends with one).
    fn write_footnotes(&mut self) {
        let mut notes: Vec<(usize, Vec<Piece<'a>>)> = std::mem::take(&mut self.definitions)
            .into_iter()
            .filter_map(|(label, pieces)| Some((self.ids.footnote_number(&label)?, pieces)))
            .collect();
        if notes.is_empty() {
            return;
        }
        notes.sort_by_key(|(number, _)| *number);
        self.ready.push_back(Piece::Open(
            "<section class=\"footnotes\" data-footnotes>\n<ol>\n".into(),
        ));
        for (number, mut pieces) in notes {
            self.ready
                .push_back(Piece::Open(format!("<li id=\"fn-{number}\">\n").into()));
            let backrefs = self.backrefs(number);
            if pieces.last() == Some(&Piece::Event(Event::End(TagEnd::Paragraph))) {
                let end = pieces.pop();
                pieces.push(Piece::Markup(format!(" {backrefs}").into()));
                pieces.extend(end);
            } else {
                pieces.push(Piece::Markup(format!("{backrefs}\n").into()));
            }
            self.ready.extend(pieces);
            self.ready.push_back(Piece::Close("</li>\n".into()));
        }
        self.ready
            .push_back(Piece::Close("</ol>\n</section>\n".into()));
    }

    /// The back-links of footnote `number` to each of its references.
    fn backrefs(&self, number: usize) -> String {
        let mut html = String::new();
        for n in 1..=self.ids.references(number) {
            let (suffix, sup) = if n == 1 {
                (String::new(), String::new())
            } else {
                html.push(' ');
                (
                    format!("-{n}"),
                    format!("<sup class=\"footnote-ref\">{n}</sup>"),
                )
            };
            html.push_str(&format!(
                "<a href=\"#fnref-{number}{suffix}\" class=\"footnote-backref\" data-footnote-backref data-footnote-backref-idx=\"{number}{suffix}\" aria-label=\"Back to reference {number}{suffix}\">\u{21a9}{sup}</a>"
            ));
        }
        html
    }
}

impl<'a, I: Iterator<Item = Event<'a>>> Iterator for Rewriter<'a, '_, I> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        loop {
            if let Some(piece) = self.ready.pop_front() {
                return Some(piece);
            }
            if self.done {
                return None;
            }
            match self.inner.next() {
                Some(event) => self.process(event),
                None => {
                    self.done = true;
                    self.flush_text();
                    if let Some(heading) = self.heading.as_ref() {
                        // A heading the parser never closed: close it.
                        let level = heading.level;
                        self.finish_heading(level);
                    }
                    while !self.definition.is_empty() {
                        self.end_definition();
                    }
                    self.write_footnotes();
                }
            }
        }
    }
}

/// Whether `tag` is an inline one (inside the text of a block).
fn is_inline(tag: &Tag<'_>) -> bool {
    matches!(
        tag,
        Tag::Emphasis
            | Tag::Strong
            | Tag::Strikethrough
            | Tag::Superscript
            | Tag::Subscript
            | Tag::Link { .. }
            | Tag::Image { .. }
    )
}

/// GFM's tag filter: the `<` of each tag of `title`, `textarea`, `style`,
/// `xmp`, `iframe`, `noembed`, `noframes`, `script` and `plaintext`
/// (opening or closing, any case) becomes `&lt;`, so that the tag shows as
/// text (cmark-gfm's `tagfilter` extension).
pub(super) fn tag_filter(html: CowStr<'_>) -> CowStr<'_> {
    const FILTERED: [&str; 9] = [
        "title",
        "textarea",
        "style",
        "xmp",
        "iframe",
        "noembed",
        "noframes",
        "script",
        "plaintext",
    ];
    let is_filtered = |tag: &[u8]| {
        let name = tag.strip_prefix(b"/").unwrap_or(tag);
        FILTERED.iter().any(|f| {
            name.len() > f.len()
                && name[..f.len()].eq_ignore_ascii_case(f.as_bytes())
                && match name[f.len()] {
                    b'>' | b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r' => true,
                    b'/' => name.get(f.len() + 1) == Some(&b'>'),
                    _ => false,
                }
        })
    };
    let bytes = html.as_bytes();
    let mut lts = memchr::memchr_iter(b'<', bytes).filter(|&i| is_filtered(&bytes[i + 1..]));
    let Some(first) = lts.next() else {
        return html;
    };
    let mut out = String::with_capacity(html.len() + 16);
    let mut from = 0;
    for at in std::iter::once(first).chain(lts) {
        out.push_str(&html[from..at]);
        out.push_str("&lt;");
        from = at + 1;
    }
    out.push_str(&html[from..]);
    out.into()
}

/// `source` without its HTML comments (`<!--` to the next `-->`, or to the
/// end when none follows).
pub(super) fn without_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        rest = match rest[start + 4..].find("-->") {
            Some(end) => &rest[start + 4 + end + 3..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}
