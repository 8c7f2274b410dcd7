//! The event stream between the parser and the HTML writer: raw HTML
//! escaping, link rewriting, bare-URL autolinks, heading and footnote ids,
//! and the page title, applied one event at a time.
//!
//! It holds back only what one decision needs (the text run being searched
//! for URLs, one heading, one HTML block), so memory follows the largest
//! block, not the document.

use crate::config::RawHtml;
use std::collections::VecDeque;

use pulldown_cmark::{CowStr, Event, HeadingLevel, LinkType, Tag, TagEnd};

use super::ids::Ids;
use super::links::rewrite_destination;
use super::{RenderOptions, autolink, push_escaped};

/// A heading being collected: its events (already rewritten) and text.
struct Heading<'a> {
    level: HeadingLevel,
    classes: Vec<CowStr<'a>>,
    attrs: Vec<(CowStr<'a>, Option<CowStr<'a>>)>,
    events: Vec<Event<'a>>,
    /// Text for the slug: what a reader sees, without image alt text.
    slug_text: String,
    /// Text for the title: the same plus image alt text.
    title_text: String,
    /// Depth of images being collected (their text is alt text).
    in_image: usize,
}

/// Iterator adapter from parser events to writer events.
pub(super) struct Rewriter<'a, 'o, I> {
    inner: I,
    options: &'o RenderOptions<'o>,
    escape: bool,
    /// Events ready for the writer.
    ready: VecDeque<Event<'a>>,
    /// Consecutive plain text not yet searched for URLs: one piece in
    /// `text`, or several joined in `joined`.
    text: Option<CowStr<'a>>,
    joined: String,
    /// Source of the HTML block being collected, in escape mode.
    raw_block: Option<String>,
    heading: Option<Heading<'a>>,
    /// Depth of links and images: their text is never autolinked.
    in_link: usize,
    /// Depth of raw `<a>` tags (raw HTML allowed).
    in_raw_anchor: usize,
    in_code_block: bool,
    /// Open footnote definitions: their number, for the back-link.
    definitions: Vec<usize>,
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
            in_raw_anchor: 0,
            in_code_block: false,
            definitions: Vec::new(),
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

    /// Hands an event on: into the heading being collected, else out.
    fn emit(&mut self, event: Event<'a>) {
        match self.heading.as_mut() {
            Some(heading) => {
                match &event {
                    Event::Start(Tag::Image { .. }) => heading.in_image += 1,
                    Event::End(TagEnd::Image) => heading.in_image -= 1,
                    Event::Text(t) | Event::Code(t) => {
                        heading.title_text.push_str(t);
                        if heading.in_image == 0 {
                            heading.slug_text.push_str(t);
                        }
                    }
                    Event::SoftBreak | Event::HardBreak => {
                        heading.title_text.push(' ');
                        heading.slug_text.push(' ');
                    }
                    _ => {}
                }
                heading.events.push(event);
            }
            None => self.ready.push_back(event),
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
        let urls = autolink::find_urls(&text);
        if urls.is_empty() {
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
        let mut pieces = Vec::with_capacity(urls.len() * 4 + 1);
        for url in urls {
            if url.start > at {
                pieces.push(Event::Text(piece(at..url.start)));
            }
            pieces.push(Event::Start(Tag::Link {
                link_type: LinkType::Inline,
                dest_url: piece(url.clone()),
                title: CowStr::Borrowed(""),
                id: CowStr::Borrowed(""),
            }));
            pieces.push(Event::Text(piece(url.clone())));
            pieces.push(Event::End(TagEnd::Link));
            at = url.end;
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

    /// Turns one parser event into writer events.
    fn process(&mut self, event: Event<'a>) {
        if (self.text.is_some() || !self.joined.is_empty()) && !matches!(event, Event::Text(_)) {
            self.flush_text();
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
                let html = format!(
                    "<sup class=\"footnote-reference\" id=\"{id}\"><a href=\"#fn-{number}\">{number}</a></sup>"
                );
                self.emit(Event::InlineHtml(html.into()));
            }
            Event::Start(Tag::FootnoteDefinition(label)) => {
                let (number, id) = self.ids.footnote_definition(&label);
                self.definitions.push(number);
                let id = id.map(|id| format!(" id=\"{id}\"")).unwrap_or_default();
                let html = format!(
                    "<div class=\"footnote-definition\"{id}><sup class=\"footnote-definition-label\">{number}</sup>"
                );
                self.emit(Event::Html(html.into()));
            }
            Event::End(TagEnd::FootnoteDefinition) => {
                let number = self.definitions.pop().unwrap_or_default();
                let html = if self.ids.is_referenced(number) {
                    format!(
                        "<a href=\"#fnref-{number}\" class=\"footnote-backref\" aria-label=\"Back to reference {number}\">\u{21a9}</a></div>\n"
                    )
                } else {
                    "</div>\n".to_owned()
                };
                self.emit(Event::Html(html.into()));
            }
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
        self.ready.push_back(Event::Start(Tag::Heading {
            level: heading.level,
            id: Some(id.into()),
            classes: heading.classes,
            attrs: heading.attrs,
        }));
        self.ready.extend(heading.events);
        self.ready.push_back(Event::InlineHtml(anchor.into()));
        self.ready.push_back(Event::End(TagEnd::Heading(level)));
    }
}

impl<'a, I: Iterator<Item = Event<'a>>> Iterator for Rewriter<'a, '_, I> {
    type Item = Event<'a>;

    fn next(&mut self) -> Option<Event<'a>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            match self.inner.next() {
                Some(event) => self.process(event),
                None => {
                    self.flush_text();
                    if let Some(heading) = self.heading.as_ref() {
                        // A heading the parser never closed: close it.
                        let level = heading.level;
                        self.finish_heading(level);
                    }
                    return self.ready.pop_front();
                }
            }
        }
    }
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
