//! The HTML writer: turns the rewritten event stream ([`Piece`]s) into the
//! body's HTML, the way cmark-gfm (GitHub) marks it up where the two
//! differ from pulldown-cmark's own writer, and byte for byte like
//! pulldown-cmark's writer everywhere else:
//!
//! - text and code escape `"` too (`&quot;`), as cmark does;
//! - table cells carry `align="left|center|right"`, and a table without
//!   body rows has no `<tbody>`;
//! - a GFM alert (`> [!NOTE]`) is `<div class="markdown-alert
//!   markdown-alert-note">` with a `<p class="markdown-alert-title">`;
//! - footnote references are `<sup class="footnote-ref">` links (the
//!   section of notes is assembled by [`super::events`]).
//!
//! It is push-style ([`Writer::write`]): the sanitizer (`sanitize`) writes
//! a stretch of the page into a buffer it may clean before passing it on,
//! and never holds the stretch's events. It never reads anything but the
//! pieces it is given.

use std::fmt::Write as _;
use std::io;

use pulldown_cmark::{
    Alignment, BlockQuoteKind, CodeBlockKind, CowStr, Event, LinkType, Tag, TagEnd,
};

/// What the writer is given: a parser event (rewritten), or markup the
/// renderer writes itself. Markup is never raw HTML of the document: the
/// sanitizer does not count it as such, and image alt text leaves it out.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Piece<'a> {
    Event(Event<'a>),
    /// A reference to footnote `number`, whose own id is `id`.
    FootnoteRef {
        number: usize,
        id: String,
    },
    /// Markup complete in itself (a self-link, a footnote's back-links).
    Markup(CowStr<'a>),
    /// Block markup that opens elements, closed by a later [`Piece::Close`]
    /// (the footnote section and its items).
    Open(CowStr<'a>),
    Close(CowStr<'a>),
}

impl<'a> From<Event<'a>> for Piece<'a> {
    fn from(event: Event<'a>) -> Self {
        Piece::Event(event)
    }
}

/// Writes every piece to `sink`, in 64 KiB writes.
pub(super) fn write_all<'a>(
    pieces: impl Iterator<Item = Piece<'a>>,
    sink: &mut dyn io::Write,
) -> io::Result<()> {
    const CHUNK: usize = 64 << 10;
    let mut writer = Writer::default();
    let mut buffer = String::with_capacity(CHUNK + 1024);
    for piece in pieces {
        writer.write(piece, &mut buffer);
        if buffer.len() >= CHUNK {
            sink.write_all(buffer.as_bytes())?;
            buffer.clear();
        }
    }
    sink.write_all(buffer.as_bytes())
}

/// Where a table is.
#[derive(Default, PartialEq, Eq)]
enum TableState {
    #[default]
    Head,
    /// In the body: whether `<tbody>` was written (at its first row).
    Body { opened: bool },
}

/// An image whose `alt` attribute is being written.
struct Alt {
    /// Depth of elements opened inside it.
    nest: usize,
    title: String,
}

/// The writer's state between pieces.
pub(super) struct Writer {
    /// Whether the last write ended a line.
    end_newline: bool,
    table: TableState,
    alignments: Vec<Alignment>,
    cell: usize,
    alt: Option<Alt>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer {
            end_newline: true,
            table: TableState::Head,
            alignments: Vec::new(),
            cell: 0,
            alt: None,
        }
    }
}

impl Writer {
    /// Starts a new stretch of output as if at the start of the page.
    pub(super) fn at_line_start(&mut self) {
        self.end_newline = true;
    }

    /// Appends the HTML of `piece` to `out`.
    pub(super) fn write(&mut self, piece: Piece<'_>, out: &mut String) {
        if self.alt.is_some() {
            self.alt_text(piece, out);
            return;
        }
        match piece {
            Piece::Event(event) => self.event(event, out),
            Piece::FootnoteRef { number, id } => {
                let _ = write!(
                    out,
                    "<sup class=\"footnote-ref\"><a href=\"#fn-{number}\" id=\""
                );
                escape_attribute(out, &id);
                let _ = write!(out, "\" data-footnote-ref>{number}</a></sup>");
                self.end_newline = false;
            }
            Piece::Markup(html) | Piece::Close(html) => self.raw(out, &html),
            Piece::Open(html) => {
                self.block_start(out);
                self.raw(out, &html);
            }
        }
    }

    fn raw(&mut self, out: &mut String, s: &str) {
        out.push_str(s);
        if !s.is_empty() {
            self.end_newline = s.ends_with('\n');
        }
    }

    /// A line break before a block unless the output is at a line start.
    fn block_start(&mut self, out: &mut String) {
        if !self.end_newline {
            out.push('\n');
            self.end_newline = true;
        }
    }

    fn event(&mut self, event: Event<'_>, out: &mut String) {
        match event {
            Event::Start(tag) => self.start(tag, out),
            Event::End(tag) => self.end(tag, out),
            Event::Text(text) => {
                escape_text(out, &text);
                self.end_newline = text.ends_with('\n');
            }
            Event::Code(text) => {
                out.push_str("<code>");
                escape_text(out, &text);
                self.raw(out, "</code>");
            }
            Event::InlineMath(text) => {
                out.push_str("<span class=\"math math-inline\">");
                escape_attribute(out, &text);
                self.raw(out, "</span>");
            }
            Event::DisplayMath(text) => {
                out.push_str("<span class=\"math math-display\">");
                escape_attribute(out, &text);
                self.raw(out, "</span>");
            }
            Event::Html(html) | Event::InlineHtml(html) => self.raw(out, &html),
            Event::SoftBreak => self.raw(out, "\n"),
            Event::HardBreak => self.raw(out, "<br />\n"),
            Event::Rule => {
                self.block_start(out);
                self.raw(out, "<hr />\n");
            }
            // The rewriter numbers references ([`Piece::FootnoteRef`]);
            // one it did not is shown as written.
            Event::FootnoteReference(label) => {
                out.push_str("[^");
                escape_text(out, &label);
                self.raw(out, "]");
            }
            Event::TaskListMarker(true) => {
                self.raw(
                    out,
                    "<input disabled=\"\" type=\"checkbox\" checked=\"\"/>\n",
                );
            }
            Event::TaskListMarker(false) => {
                self.raw(out, "<input disabled=\"\" type=\"checkbox\"/>\n");
            }
        }
    }

    fn start(&mut self, tag: Tag<'_>, out: &mut String) {
        match tag {
            Tag::HtmlBlock | Tag::MetadataBlock(_) => {}
            Tag::Paragraph => self.open_block(out, "<p>"),
            Tag::Heading {
                level,
                id,
                classes,
                attrs,
            } => {
                self.block_start(out);
                let _ = write!(out, "<{level}");
                if let Some(id) = id {
                    out.push_str(" id=\"");
                    escape_attribute(out, &id);
                    out.push('"');
                }
                if !classes.is_empty() {
                    out.push_str(" class=\"");
                    for (i, class) in classes.iter().enumerate() {
                        if i > 0 {
                            out.push(' ');
                        }
                        escape_attribute(out, class);
                    }
                    out.push('"');
                }
                for (attr, value) in attrs {
                    out.push(' ');
                    escape_attribute(out, &attr);
                    out.push_str("=\"");
                    escape_attribute(out, value.as_deref().unwrap_or(""));
                    out.push('"');
                }
                self.raw(out, ">");
            }
            Tag::Table(alignments) => {
                self.alignments = alignments;
                self.raw(out, "<table>");
            }
            Tag::TableHead => {
                self.table = TableState::Head;
                self.cell = 0;
                self.raw(out, "<thead><tr>");
            }
            Tag::TableRow => {
                self.cell = 0;
                if self.table == (TableState::Body { opened: false }) {
                    self.table = TableState::Body { opened: true };
                    out.push_str("<tbody>\n");
                }
                self.raw(out, "<tr>");
            }
            Tag::TableCell => {
                out.push_str(if self.table == TableState::Head {
                    "<th"
                } else {
                    "<td"
                });
                out.push_str(match self.alignments.get(self.cell) {
                    Some(Alignment::Left) => " align=\"left\"",
                    Some(Alignment::Center) => " align=\"center\"",
                    Some(Alignment::Right) => " align=\"right\"",
                    _ => "",
                });
                self.raw(out, ">");
            }
            Tag::BlockQuote(None) => self.open_block(out, "<blockquote>\n"),
            Tag::BlockQuote(Some(kind)) => {
                let (class, title) = alert(kind);
                self.block_start(out);
                let _ = write!(
                    out,
                    "<div class=\"markdown-alert markdown-alert-{class}\">\n<p class=\"markdown-alert-title\">{title}</p>\n"
                );
                self.end_newline = true;
            }
            Tag::CodeBlock(info) => {
                self.block_start(out);
                match info {
                    CodeBlockKind::Fenced(info) => {
                        // The first word, cut at any ASCII white space as
                        // CommonMark does: a browser splits the class
                        // there, so a tab would add a class of its own.
                        let lang = info
                            .split(|c: char| c.is_ascii_whitespace())
                            .next()
                            .unwrap_or_default();
                        if lang.is_empty() {
                            self.raw(out, "<pre><code>");
                        } else {
                            out.push_str("<pre><code class=\"language-");
                            escape_attribute(out, lang);
                            self.raw(out, "\">");
                        }
                    }
                    CodeBlockKind::Indented => self.raw(out, "<pre><code>"),
                }
            }
            Tag::List(Some(1)) => self.open_block(out, "<ol>\n"),
            Tag::List(Some(start)) => {
                self.block_start(out);
                let _ = writeln!(out, "<ol start=\"{start}\">");
                self.end_newline = true;
            }
            Tag::List(None) => self.open_block(out, "<ul>\n"),
            Tag::Item => self.open_block(out, "<li>"),
            Tag::DefinitionList => self.open_block(out, "<dl>\n"),
            Tag::DefinitionListTitle => self.open_block(out, "<dt>"),
            Tag::DefinitionListDefinition => self.open_block(out, "<dd>"),
            Tag::Subscript => self.raw(out, "<sub>"),
            Tag::Superscript => self.raw(out, "<sup>"),
            Tag::Emphasis => self.raw(out, "<em>"),
            Tag::Strong => self.raw(out, "<strong>"),
            Tag::Strikethrough => self.raw(out, "<del>"),
            Tag::Link {
                link_type,
                dest_url,
                title,
                ..
            } => {
                out.push_str("<a href=\"");
                if link_type == LinkType::Email {
                    out.push_str("mailto:");
                }
                escape_href(out, &dest_url);
                if !title.is_empty() {
                    out.push_str("\" title=\"");
                    escape_attribute(out, &title);
                }
                self.raw(out, "\">");
            }
            Tag::Image {
                dest_url, title, ..
            } => {
                out.push_str("<img src=\"");
                escape_href(out, &dest_url);
                self.raw(out, "\" alt=\"");
                self.alt = Some(Alt {
                    nest: 0,
                    title: title.into_string(),
                });
            }
            // The rewriter moves footnote definitions into the section of
            // notes and never passes these on.
            Tag::FootnoteDefinition(_) => {}
        }
    }

    /// Opens a block: on a line of its own.
    fn open_block(&mut self, out: &mut String, html: &str) {
        self.block_start(out);
        self.raw(out, html);
    }

    fn end(&mut self, tag: TagEnd, out: &mut String) {
        let html = match tag {
            TagEnd::HtmlBlock
            | TagEnd::MetadataBlock(_)
            | TagEnd::Image
            | TagEnd::FootnoteDefinition => return,
            TagEnd::Paragraph => "</p>\n",
            TagEnd::Heading(level) => {
                let _ = writeln!(out, "</{level}>");
                self.end_newline = true;
                return;
            }
            TagEnd::Table => {
                let opened = self.table == TableState::Body { opened: true };
                self.table = TableState::Head;
                if opened {
                    "</tbody></table>\n"
                } else {
                    "</table>\n"
                }
            }
            TagEnd::TableHead => {
                self.table = TableState::Body { opened: false };
                "</tr></thead>"
            }
            TagEnd::TableRow => "</tr>\n",
            TagEnd::TableCell => {
                self.cell += 1;
                if self.table == TableState::Head {
                    "</th>"
                } else {
                    "</td>"
                }
            }
            TagEnd::BlockQuote(None) => "</blockquote>\n",
            TagEnd::BlockQuote(Some(_)) => "</div>\n",
            TagEnd::CodeBlock => "</code></pre>\n",
            TagEnd::List(true) => "</ol>\n",
            TagEnd::List(false) => "</ul>\n",
            TagEnd::Item => "</li>\n",
            TagEnd::DefinitionList => "</dl>\n",
            TagEnd::DefinitionListTitle => "</dt>\n",
            TagEnd::DefinitionListDefinition => "</dd>\n",
            TagEnd::Emphasis => "</em>",
            TagEnd::Superscript => "</sup>",
            TagEnd::Subscript => "</sub>",
            TagEnd::Strong => "</strong>",
            TagEnd::Strikethrough => "</del>",
            TagEnd::Link => "</a>",
        };
        self.raw(out, html);
    }

    /// A piece inside an image: its text goes into the `alt` attribute,
    /// up to the image's end, which closes the tag.
    fn alt_text(&mut self, piece: Piece<'_>, out: &mut String) {
        let Some(alt) = self.alt.as_mut() else {
            return;
        };
        let event = match piece {
            Piece::Event(event) => event,
            Piece::FootnoteRef { number, .. } => {
                let _ = write!(out, "[{number}]");
                return;
            }
            Piece::Markup(_) | Piece::Open(_) | Piece::Close(_) => return,
        };
        match event {
            Event::Start(_) => alt.nest += 1,
            Event::End(_) if alt.nest > 0 => alt.nest -= 1,
            Event::End(_) => {
                if !alt.title.is_empty() {
                    out.push_str("\" title=\"");
                    escape_attribute(out, &alt.title);
                }
                self.alt = None;
                self.raw(out, "\" />");
            }
            Event::Html(_) => {}
            Event::InlineHtml(text) | Event::Code(text) | Event::Text(text) => {
                escape_attribute(out, &text);
            }
            Event::InlineMath(text) => {
                out.push('$');
                escape_attribute(out, &text);
                out.push('$');
            }
            Event::DisplayMath(text) => {
                out.push_str("$$");
                escape_attribute(out, &text);
                out.push_str("$$");
            }
            Event::SoftBreak | Event::HardBreak | Event::Rule => out.push(' '),
            Event::FootnoteReference(label) => {
                out.push_str("[^");
                escape_attribute(out, &label);
                out.push(']');
            }
            Event::TaskListMarker(true) => out.push_str("[x]"),
            Event::TaskListMarker(false) => out.push_str("[ ]"),
        }
    }
}

/// The class suffix and title of a GFM alert, as GitHub writes them.
fn alert(kind: BlockQuoteKind) -> (&'static str, &'static str) {
    match kind {
        BlockQuoteKind::Note => ("note", "Note"),
        BlockQuoteKind::Tip => ("tip", "Tip"),
        BlockQuoteKind::Important => ("important", "Important"),
        BlockQuoteKind::Warning => ("warning", "Warning"),
        BlockQuoteKind::Caution => ("caution", "Caution"),
    }
}

/// Appends text with `&`, `<`, `>` and `"` escaped (cmark's text escaping).
fn escape_text(out: &mut String, text: &str) {
    escape(out, text, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' => Some("&quot;"),
        _ => None,
    });
}

/// Appends an attribute value with `&`, `<`, `>`, `"` and `'` escaped.
pub(super) fn escape_attribute(out: &mut String, text: &str) {
    escape(out, text, |b| match b {
        b'&' => Some("&amp;"),
        b'<' => Some("&lt;"),
        b'>' => Some("&gt;"),
        b'"' => Some("&quot;"),
        b'\'' => Some("&#39;"),
        _ => None,
    });
}

/// Appends `text`, each ASCII byte that `replace` maps replaced.
fn escape(out: &mut String, text: &str, replace: impl Fn(u8) -> Option<&'static str>) {
    let mut from = 0;
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if let Some(with) = replace(b) {
            out.push_str(&text[from..i]);
            out.push_str(with);
            from = i + 1;
        }
    }
    out.push_str(&text[from..]);
}

/// Appends a link target: percent-encoded where a URL may not hold the
/// byte as it is, `&` and `'` as entities (pulldown-cmark's rules).
fn escape_href(out: &mut String, href: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut from = 0;
    for (i, &b) in href.as_bytes().iter().enumerate() {
        let safe = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b'-'
                    | b'.'
                    | b'/'
                    | b':'
                    | b';'
                    | b'='
                    | b'?'
                    | b'@'
                    | b'^'
                    | b'_'
                    | b'~'
            );
        if safe {
            continue;
        }
        // Every byte of a character of several bytes is escaped, so `from`
        // is inside one only while `i` is too, and then `from == i`.
        if from < i {
            out.push_str(&href[from..i]);
        }
        match b {
            b'&' => out.push_str("&amp;"),
            b'\'' => out.push_str("&#x27;"),
            _ => {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xf)]));
            }
        }
        from = i + 1;
    }
    out.push_str(&href[from..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulldown_cmark::{Options, Parser};

    fn write(markdown: &str) -> String {
        let mut out = Vec::new();
        let options = Options::ENABLE_TABLES
            | Options::ENABLE_STRIKETHROUGH
            | Options::ENABLE_TASKLISTS
            | Options::ENABLE_GFM;
        write_all(
            Parser::new_ext(markdown, options).map(Piece::Event),
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn tables_say_their_alignment_with_align_and_have_no_empty_body() {
        assert_eq!(
            write("| a | b | c | d |\n|:--|:-:|--:|---|\n| 1 | 2 | 3 | 4 |\n"),
            "<table><thead><tr><th align=\"left\">a</th><th align=\"center\">b</th><th align=\"right\">c</th><th>d</th></tr></thead><tbody>\n<tr><td align=\"left\">1</td><td align=\"center\">2</td><td align=\"right\">3</td><td>4</td></tr>\n</tbody></table>\n"
        );
        assert_eq!(
            write("| a |\n|---|\n"),
            "<table><thead><tr><th>a</th></tr></thead></table>\n"
        );
    }

    #[test]
    fn alerts_are_marked_up_as_on_github() {
        let cases = [
            ("NOTE", "note", "Note"),
            ("TIP", "tip", "Tip"),
            ("IMPORTANT", "important", "Important"),
            ("WARNING", "warning", "Warning"),
            ("CAUTION", "caution", "Caution"),
        ];
        for (marker, class, title) in cases {
            assert_eq!(
                write(&format!("> [!{marker}]\n> Text.\n")),
                format!(
                    "<div class=\"markdown-alert markdown-alert-{class}\">\n<p class=\"markdown-alert-title\">{title}</p>\n<p>Text.</p>\n</div>\n"
                )
            );
        }
        assert_eq!(
            write("> [!OTHER]\n> Text.\n"),
            "<blockquote>\n<p>[!OTHER]\nText.</p>\n</blockquote>\n"
        );
    }

    #[test]
    fn text_escapes_quotes_attributes_escape_apostrophes_too() {
        assert_eq!(
            write("\"a\" & 'b' 1 < 2 > 0 `\"d\"`\n"),
            "<p>&quot;a&quot; &amp; 'b' 1 &lt; 2 &gt; 0 <code>&quot;d&quot;</code></p>\n"
        );
        assert_eq!(
            write("![a \"b\" 'c'](x.png \"t 'u'\")\n"),
            "<p><img src=\"x.png\" alt=\"a &quot;b&quot; &#39;c&#39;\" title=\"t &#39;u&#39;\" /></p>\n"
        );
    }

    #[test]
    fn link_targets_are_percent_encoded_like_pulldown_cmark_does() {
        assert_eq!(
            write("[a](</x y?a=1&b='2'#ü[]>)\n"),
            "<p><a href=\"/x%20y?a=1&amp;b=&#x27;2&#x27;#%C3%BC%5B%5D\">a</a></p>\n"
        );
        assert_eq!(
            write("[a](/φου) [b](/ü)\n"),
            "<p><a href=\"/%CF%86%CE%BF%CF%85\">a</a> <a href=\"/%C3%BC\">b</a></p>\n"
        );
    }
}
