//! Markdown to HTML (SPEC §10): turns one CommonMark file of a bundle into a
//! complete, self-contained HTML5 document.
//!
//! This module owns the rendering rules: which markdown extensions are on,
//! the document skeleton, the `<title>`, raw HTML escaping, neutralising
//! dangerous link schemes and rewriting links between generated `.md` files.
//!
//! It must never do I/O, read the clock or depend on anything but its
//! arguments: the same markdown and options always give the same bytes.
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

use std::collections::BTreeSet;

use pulldown_cmark::{CowStr, Event, LinkType, Options, Parser, Tag, TagEnd, html};

/// What to render and how.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions<'a> {
    /// `raw_html: allow` in config. false = escape (the default).
    pub allow_raw_html: bool,
    /// Manifest path of the markdown file being rendered, e.g. "docs/report.md" (clean relative path, '/'-separated).
    pub source_path: &'a str,
    /// Manifest paths of every `.md` file of the same bundle that is ALSO rendered to HTML in this publication.
    pub generated_markdown: &'a BTreeSet<String>,
}

/// Target that replaces a link or image destination with a dangerous scheme
/// in escape mode.
const NEUTRALISED_DESTINATION: &str = "#";

/// Schemes neutralised in escape mode (lowercase, with the colon).
const DANGEROUS_SCHEMES: [&str; 3] = ["javascript:", "vbscript:", "data:"];

/// Renders CommonMark to a complete UTF-8 HTML5 document. Pure and deterministic.
pub fn markdown_to_html(markdown: &str, options: &RenderOptions<'_>) -> String {
    let events: Vec<Event<'_>> = Parser::new_ext(markdown, parser_options()).collect();
    let events = transform(events, options);
    // After `transform`, so that raw HTML shown as text counts as text.
    let title = first_heading_text(&events).unwrap_or_else(|| file_stem(options.source_path));

    let mut body = String::with_capacity(markdown.len() + markdown.len() / 2);
    html::push_html(&mut body, events.into_iter());
    document(&title, &body)
}

/// The markdown extensions of SPEC §10, and nothing else.
fn parser_options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
}

/// Wraps the rendered body in the fixed HTML5 skeleton.
fn document(title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + title.len() + 200);
    out.push_str("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str("<title>");
    push_escaped(&mut out, title);
    out.push_str("</title>\n</head>\n<body>\n");
    out.push_str(body);
    if !body.is_empty() && !body.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("</body>\n</html>\n");
    out
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

/// Plain text of the first heading, or `None` when there is no heading or
/// the first one has no text.
fn first_heading_text(events: &[Event<'_>]) -> Option<String> {
    let start = events
        .iter()
        .position(|event| matches!(event, Event::Start(Tag::Heading { .. })))?;
    let mut text = String::new();
    let mut depth = 0usize;
    for event in &events[start + 1..] {
        match event {
            Event::Start(_) => depth += 1,
            Event::End(_) if depth == 0 => break,
            Event::End(_) => depth -= 1,
            Event::Text(t) | Event::Code(t) | Event::InlineMath(t) | Event::DisplayMath(t) => {
                text.push_str(t);
            }
            Event::SoftBreak | Event::HardBreak => text.push(' '),
            _ => {}
        }
    }
    let collapsed = text.split_ascii_whitespace().collect::<Vec<_>>().join(" ");
    (!collapsed.is_empty()).then_some(collapsed)
}

/// File name of `source_path` without its `.md` extension.
fn file_stem(source_path: &str) -> String {
    let name = source_path.rsplit('/').next().unwrap_or(source_path);
    match name.strip_suffix(".md") {
        Some(stem) if !stem.is_empty() => stem.to_owned(),
        _ => name.to_owned(),
    }
}

/// Applies raw HTML escaping and destination rewriting to the event stream.
fn transform<'a>(events: Vec<Event<'a>>, options: &RenderOptions<'_>) -> Vec<Event<'a>> {
    let escape = !options.allow_raw_html;
    let mut out = Vec::with_capacity(events.len());
    // Source of the HTML block being collected, in escape mode.
    let mut raw_block: Option<String> = None;
    for event in events {
        match event {
            Event::Start(Tag::HtmlBlock) if escape => raw_block = Some(String::new()),
            Event::End(TagEnd::HtmlBlock) if escape => {
                let source = raw_block.take().unwrap_or_default();
                let source = source.trim_end_matches(['\n', '\r']);
                if !source.is_empty() {
                    out.push(Event::Start(Tag::Paragraph));
                    out.push(Event::Text(source.to_owned().into()));
                    out.push(Event::End(TagEnd::Paragraph));
                }
            }
            Event::Html(text) if escape => match raw_block.as_mut() {
                Some(source) => source.push_str(&text),
                None => out.push(Event::Text(text)),
            },
            Event::InlineHtml(text) if escape => out.push(Event::Text(text)),
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                title,
                id,
            }) => out.push(Event::Start(Tag::Link {
                link_type,
                dest_url: rewrite_destination(dest_url, link_type, options),
                title,
                id,
            })),
            Event::Start(Tag::Image {
                link_type,
                dest_url,
                title,
                id,
            }) => out.push(Event::Start(Tag::Image {
                link_type,
                dest_url: rewrite_destination(dest_url, link_type, options),
                title,
                id,
            })),
            other => out.push(other),
        }
    }
    out
}

/// The destination to write for a link or image.
fn rewrite_destination<'a>(
    dest: CowStr<'a>,
    link_type: LinkType,
    options: &RenderOptions<'_>,
) -> CowStr<'a> {
    // The writer prefixes e-mail autolinks with `mailto:`; they are neither
    // dangerous nor paths.
    if link_type == LinkType::Email {
        return dest;
    }
    if !options.allow_raw_html && has_dangerous_scheme(&dest) {
        return CowStr::Borrowed(NEUTRALISED_DESTINATION);
    }
    match rewrite_markdown_link(&dest, options.source_path, options.generated_markdown) {
        Some(rewritten) => rewritten.into(),
        None => dest,
    }
}

/// Whether `dest` starts with a scheme that can run code or smuggle content,
/// ignoring ASCII whitespace and control characters anywhere (browsers drop
/// them) and case.
fn has_dangerous_scheme(dest: &str) -> bool {
    let squeezed: String = dest
        .chars()
        .filter(|c| !(c.is_ascii_control() || *c == ' '))
        .take(16)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    DANGEROUS_SCHEMES
        .iter()
        .any(|scheme| squeezed.starts_with(scheme))
}

/// Whether `dest` starts with a URL scheme (`ALPHA *(ALPHA / DIGIT / + / - / .) :`).
fn has_scheme(dest: &str) -> bool {
    let Some((scheme, _)) = dest.split_once(':') else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The `.html` form of a relative link to a generated `.md` file of the
/// bundle, or `None` when the link must stay as written.
fn rewrite_markdown_link(
    dest: &str,
    source_path: &str,
    generated: &BTreeSet<String>,
) -> Option<String> {
    if dest.starts_with(['/', '#', '?']) || has_scheme(dest) {
        return None;
    }
    let path_end = dest.find(['?', '#']).unwrap_or(dest.len());
    let (path, suffix) = dest.split_at(path_end);
    let stem = path.strip_suffix(".md")?;
    let target = resolve(source_path, path)?;
    if !generated.contains(&target) {
        return None;
    }
    Some(format!("{stem}.html{suffix}"))
}

/// Resolves the link path `path` against the folder of `source_path` into a
/// bundle path, decoding percent-escapes. `None` when it climbs above the
/// bundle root or does not decode to UTF-8.
fn resolve(source_path: &str, path: &str) -> Option<String> {
    let mut segments: Vec<String> = match source_path.rsplit_once('/') {
        Some((dir, _)) => dir.split('/').map(str::to_owned).collect(),
        None => Vec::new(),
    };
    for raw in path.split('/') {
        let segment = percent_decode(raw)?;
        match segment.as_str() {
            "." => {}
            ".." => {
                segments.pop()?;
            }
            _ => segments.push(segment),
        }
    }
    Some(segments.join("/"))
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as is.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex_value(hi).zip(hex_value(lo)),
            _ => None,
        };
        match decoded {
            Some((hi, lo)) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn hex_value(byte: u8) -> Option<u8> {
    char::from(byte)
        .to_digit(16)
        .and_then(|digit| u8::try_from(digit).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(paths: &[&str]) -> BTreeSet<String> {
        paths.iter().map(|p| (*p).to_owned()).collect()
    }

    fn render_with(markdown: &str, source: &str, generated: &[&str], allow: bool) -> String {
        let generated = set(generated);
        markdown_to_html(
            markdown,
            &RenderOptions {
                allow_raw_html: allow,
                source_path: source,
                generated_markdown: &generated,
            },
        )
    }

    fn render(markdown: &str) -> String {
        render_with(markdown, "docs/report.md", &[], false)
    }

    fn render_allow(markdown: &str) -> String {
        render_with(markdown, "docs/report.md", &[], true)
    }

    /// The text between `<body>\n` and `</body>`.
    fn body(html: &str) -> &str {
        let start = html.find("<body>\n").expect("body start") + "<body>\n".len();
        let end = html.find("</body>").expect("body end");
        &html[start..end]
    }

    fn title(html: &str) -> &str {
        let start = html.find("<title>").expect("title start") + "<title>".len();
        let end = html.find("</title>").expect("title end");
        &html[start..end]
    }

    #[test]
    fn document_skeleton_is_fixed() {
        let html = render("# Hello\n\nWorld.\n");
        assert_eq!(
            html,
            "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>Hello</title>\n</head>\n<body>\n\
             <h1>Hello</h1>\n<p>World.</p>\n\
             </body>\n</html>\n"
        );
    }

    #[test]
    fn empty_markdown_still_gives_a_document() {
        let html = render("");
        assert!(html.starts_with("<!DOCTYPE html>\n"));
        assert!(html.contains("<body>\n</body>\n"));
        assert!(html.ends_with("</html>\n"));
        assert_eq!(title(&html), "report");
    }

    #[test]
    fn title_cases() {
        let cases: &[(&str, &str, &str)] = &[
            // (markdown, source path, expected title)
            ("# Plain\n", "a.md", "Plain"),
            (
                "text\n\n## Second level\n\n# Later\n",
                "a.md",
                "Second level",
            ),
            (
                "# Use `cargo` *now* and **here**\n",
                "a.md",
                "Use cargo now and here",
            ),
            ("# [Linked](x.md) ~~old~~\n", "a.md", "Linked old"),
            ("# ![logo](l.png) Name\n", "a.md", "logo Name"),
            ("Setext\n======\n", "a.md", "Setext"),
            // Escape mode shows raw HTML as text, so the title keeps it.
            (
                "# A <b>bold</b> claim\n",
                "a.md",
                "A &lt;b&gt;bold&lt;/b&gt; claim",
            ),
            ("# Fish & <chips>\n", "a.md", "Fish &amp; &lt;chips&gt;"),
            (
                "# `a<b>` & \"q\"\n",
                "a.md",
                "a&lt;b&gt; &amp; &quot;q&quot;",
            ),
            ("no heading at all\n", "docs/report.md", "report"),
            ("#\n\n# Second\n", "docs/report.md", "report"),
            ("no heading\n", "top.md", "top"),
            ("no heading\n", "a/b/c.d.md", "c.d"),
            ("no heading\n", "a/x <y>.md", "x &lt;y&gt;"),
        ];
        for (markdown, source, expected) in cases {
            let html = render_with(markdown, source, &[], false);
            assert_eq!(title(&html), *expected, "markdown {markdown:?}");
        }
    }

    #[test]
    fn title_leaves_out_raw_html_when_allowed() {
        let html = render_with("# A <b>bold</b> claim\n", "a.md", &[], true);
        assert_eq!(title(&html), "A bold claim");
        assert!(
            body(&html).contains("<h1>A <b>bold</b> claim</h1>"),
            "{html}"
        );
    }

    #[test]
    fn raw_html_is_escaped_by_default() {
        let cases: &[(&str, &str)] = &[
            (
                "<script>alert(1)</script>\n",
                "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n",
            ),
            (
                "<div class=\"x\">\nhi\n</div>\n",
                "<p>&lt;div class=\"x\"&gt;\nhi\n&lt;/div&gt;</p>\n",
            ),
            ("<!-- note -->\n", "<p>&lt;!-- note --&gt;</p>\n"),
            (
                "a <b onclick=\"x()\">b</b> c\n",
                "<p>a &lt;b onclick=\"x()\"&gt;b&lt;/b&gt; c</p>\n",
            ),
        ];
        for (markdown, expected) in cases {
            assert_eq!(body(&render(markdown)), *expected, "markdown {markdown:?}");
        }
    }

    #[test]
    fn raw_html_passes_through_when_allowed() {
        let cases: &[(&str, &str)] = &[
            ("<script>alert(1)</script>\n", "<script>alert(1)</script>\n"),
            ("a <b>b</b> c\n", "<p>a <b>b</b> c</p>\n"),
        ];
        for (markdown, expected) in cases {
            assert_eq!(
                body(&render_allow(markdown)),
                *expected,
                "markdown {markdown:?}"
            );
        }
    }

    #[test]
    fn escaped_raw_html_never_leaves_a_live_tag() {
        let html = render("x\n\n<script>evil()</script>\n\n<img src=x onerror=y>\n");
        let content = body(&html);
        assert!(!content.contains("<script"), "{content}");
        assert!(!content.contains("<img"), "{content}");
        assert!(content.contains("&lt;script&gt;evil()&lt;/script&gt;"));
    }

    #[test]
    fn dangerous_schemes_are_neutralised_in_escape_mode() {
        let cases: &[&str] = &[
            "[x](javascript:alert(1))",
            "[x](JavaScript:alert(1))",
            "[x](<  javascript:alert(1)>)",
            "[x](java&#9;script:alert(1))",
            "[x](<java\tscript:alert(1)>)",
            "[x](&#x0A;javascript:alert(1))",
            "[x](VBScript:msgbox)",
            "[x](data:text/html;base64,PHNjcmlwdD4=)",
            "[x](DATA:text/html,hi)",
            "[x](&#106;avascript:alert(1))",
            "<javascript:alert(1)>",
            "[x][ref]\n\n[ref]: javascript:alert(1)",
        ];
        for markdown in cases {
            let html = render(markdown);
            assert!(
                body(&html).contains("<a href=\"#\">"),
                "markdown {markdown:?} gave {html}"
            );
            assert_eq!(
                body(&html).matches("href=\"").count(),
                body(&html).matches("href=\"#\"").count(),
                "markdown {markdown:?} gave {html}"
            );
        }
        let image = render("![alt](javascript:alert(1))");
        assert!(
            body(&image).contains("<img src=\"#\" alt=\"alt\""),
            "{image}"
        );
        let data_image = render("![alt](data:image/png;base64,AAAA)");
        assert!(body(&data_image).contains("<img src=\"#\""), "{data_image}");
    }

    #[test]
    fn dangerous_schemes_are_kept_in_allow_mode() {
        let html = render_allow("[x](javascript:alert(1)) ![i](data:image/png;base64,AAAA)");
        assert!(
            body(&html).contains("href=\"javascript:alert(1)\""),
            "{html}"
        );
        assert!(
            body(&html).contains("src=\"data:image/png;base64,AAAA\""),
            "{html}"
        );
    }

    #[test]
    fn safe_schemes_are_not_neutralised() {
        let cases: &[(&str, &str)] = &[
            (
                "[x](https://example.com/a)",
                "href=\"https://example.com/a\"",
            ),
            ("[x](mailto:a@b.c)", "href=\"mailto:a@b.c\""),
            ("<a@b.c>", "href=\"mailto:a@b.c\""),
            ("[x](javascript.md)", "href=\"javascript.md\""),
            ("[x](notes/data:x)", "href=\"notes/data:x\""),
        ];
        for (markdown, expected) in cases {
            let html = render(markdown);
            assert!(
                body(&html).contains(expected),
                "markdown {markdown:?} gave {html}"
            );
        }
    }

    #[test]
    fn markdown_links_are_rewritten_to_generated_html() {
        let generated = [
            "a/index.md",
            "a/other.md",
            "a/sub/deep.md",
            "b/x.md",
            "top.md",
            "a/my file.md",
        ];
        let cases: &[(&str, &str)] = &[
            // (link in a/index.md, expected href)
            ("other.md", "other.html"),
            ("./other.md", "./other.html"),
            ("sub/deep.md", "sub/deep.html"),
            ("../b/x.md", "../b/x.html"),
            ("../b/x.md#top", "../b/x.html#top"),
            ("other.md?v=1#s", "other.html?v=1#s"),
            ("../top.md", "../top.html"),
            ("sub/../other.md", "sub/../other.html"),
            ("my%20file.md", "my%20file.html"),
            ("index.md", "index.html"),
            // left alone
            ("missing.md", "missing.md"),
            ("../a/sub.md", "../a/sub.md"),
            ("../../top.md", "../../top.md"),
            ("../../../a/other.md", "../../../a/other.md"),
            ("https://x/y.md", "https://x/y.md"),
            ("//x/y.md", "//x/y.md"),
            ("/a/other.md", "/a/other.md"),
            ("#anchor", "#anchor"),
            ("other.md/", "other.md/"),
            ("other.markdown", "other.markdown"),
            ("other.MD", "other.MD"),
            ("other.html", "other.html"),
            ("?q=other.md", "?q=other.md"),
        ];
        for (link, expected) in cases {
            let markdown = format!("[t]({link})\n");
            let html = render_with(&markdown, "a/index.md", &generated, false);
            let wanted = format!("<a href=\"{expected}\">t</a>");
            assert!(body(&html).contains(&wanted), "link {link:?} gave {html}");
        }
    }

    #[test]
    fn angle_bracket_link_with_space_is_rewritten() {
        let html = render_with(
            "[t](<my file.md#x>)\n",
            "a/index.md",
            &["a/my file.md"],
            false,
        );
        assert!(
            body(&html).contains("<a href=\"my%20file.html#x\">"),
            "{html}"
        );
    }

    #[test]
    fn rewriting_uses_the_source_folder() {
        let generated = ["x.md", "docs/x.md"];
        let at_top = render_with("[t](x.md)", "index.md", &generated, false);
        assert!(body(&at_top).contains("href=\"x.html\""), "{at_top}");
        let in_docs = render_with("[t](../x.md)", "docs/index.md", &["x.md"], false);
        assert!(body(&in_docs).contains("href=\"../x.html\""), "{in_docs}");
        let climbing = render_with("[t](../x.md)", "index.md", &generated, false);
        assert!(body(&climbing).contains("href=\"../x.md\""), "{climbing}");
    }

    #[test]
    fn images_and_reference_links_are_rewritten_too() {
        let html = render_with(
            "![pic](other.md) [r][1]\n\n[1]: other.md#s\n",
            "index.md",
            &["other.md"],
            true,
        );
        assert!(
            body(&html).contains("<img src=\"other.html\" alt=\"pic\""),
            "{html}"
        );
        assert!(
            body(&html).contains("<a href=\"other.html#s\">r</a>"),
            "{html}"
        );
    }

    #[test]
    fn extensions_are_on() {
        let cases: &[(&str, &str)] = &[
            ("| a | b |\n|---|---|\n| 1 | 2 |\n", "<table>"),
            ("| a | b |\n|---|---|\n| 1 | 2 |\n", "<td>1</td>"),
            (
                "Note[^1].\n\n[^1]: The note.\n",
                "class=\"footnote-reference\"",
            ),
            (
                "Note[^1].\n\n[^1]: The note.\n",
                "class=\"footnote-definition\"",
            ),
            ("~~gone~~\n", "<del>gone</del>"),
            ("- [x] done\n- [ ] todo\n", "type=\"checkbox\" checked=\"\""),
            ("- [ ] todo\n", "<input disabled=\"\" type=\"checkbox\"/>"),
        ];
        for (markdown, expected) in cases {
            let html = render(markdown);
            assert!(
                body(&html).contains(expected),
                "markdown {markdown:?} gave {html}"
            );
        }
    }

    #[test]
    fn other_extensions_stay_off() {
        let cases: &[(&str, &str)] = &[
            // Heading attributes are off: the braces stay text.
            ("# Title {#id}\n", "<h1>Title {#id}</h1>"),
            // Smart punctuation is off.
            ("\"quoted\" -- x\n", "<p>\"quoted\" -- x</p>"),
            // Math is off.
            ("$x$\n", "<p>$x$</p>"),
        ];
        for (markdown, expected) in cases {
            let html = render(markdown);
            assert!(
                body(&html).contains(expected),
                "markdown {markdown:?} gave {html}"
            );
        }
    }

    #[test]
    fn rendering_is_deterministic() {
        let markdown = "# T\n\nA[^n] and [b](b.md) <i>x</i>\n\n[^n]: note\n\n| a |\n|---|\n| 1 |\n";
        let generated = set(&["b.md"]);
        let options = RenderOptions {
            allow_raw_html: false,
            source_path: "a.md",
            generated_markdown: &generated,
        };
        let first = markdown_to_html(markdown, &options);
        let second = markdown_to_html(markdown, &options);
        assert_eq!(first.as_bytes(), second.as_bytes());
        assert!(first.contains("href=\"b.html\""));
    }

    #[test]
    fn dangerous_scheme_detection() {
        let cases: &[(&str, bool)] = &[
            ("javascript:x", true),
            ("JAVASCRIPT:x", true),
            ("\u{1}\u{7f} java\n\tscript:x", true),
            ("vbscript:x", true),
            ("data:,x", true),
            ("https://x", false),
            ("javascript", false),
            ("./javascript:x", false),
            ("java%73cript:x", false),
            ("", false),
        ];
        for (dest, expected) in cases {
            assert_eq!(has_dangerous_scheme(dest), *expected, "dest {dest:?}");
        }
    }

    #[test]
    fn percent_decoding() {
        let cases: &[(&str, Option<&str>)] = &[
            ("plain", Some("plain")),
            ("a%20b", Some("a b")),
            ("%C3%A9", Some("é")),
            ("%c3%a9", Some("é")),
            ("100%", Some("100%")),
            ("%zz", Some("%zz")),
            ("%FF", None),
        ];
        for (text, expected) in cases {
            assert_eq!(percent_decode(text).as_deref(), *expected, "text {text:?}");
        }
    }
}
