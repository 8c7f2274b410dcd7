//! Unit tests of the renderer: output shape, escaping, links, ids.

use super::links::{has_dangerous_scheme, percent_decode};
use super::*;

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| (*p).to_owned()).collect()
}

fn render_with(markdown: &str, source: &str, generated: &[&str], allow: bool) -> String {
    let generated = set(generated);
    markdown_to_html(
        markdown,
        &RenderOptions {
            raw_html: if allow {
                RawHtml::Allow
            } else {
                RawHtml::Escape
            },
            source_path: source,
            generated_markdown: &generated,
            template: None,
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

/// The self-link written at the end of a heading with this id.
fn anchor(id: &str) -> String {
    format!("<a class=\"anchor\" href=\"#{id}\" aria-label=\"Link to this section\">#</a>")
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
        format!(
            "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>Hello</title>\n<style>\n{STYLESHEET}</style>\n</head>\n<body>\n\
             <h1 id=\"hello\">Hello{}</h1>\n<p>World.</p>\n\
             </body>\n</html>\n",
            anchor("hello")
        )
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
        body(&html).contains(&format!(
            "<h1 id=\"a-bold-claim\">A <b>bold</b> claim{}</h1>",
            anchor("a-bold-claim")
        )),
        "{html}"
    );
}

#[test]
fn a_heading_written_in_raw_html_is_the_title_when_raw_html_is_allowed() {
    let cases: &[(&str, &str)] = &[
        // (markdown, title)
        (
            "<div align=\"center\">\n<h1>Project <img alt=\"logo\" src=\"l.png\"></h1>\n</div>\n\n## Features\n",
            "Project logo",
        ),
        (
            "<h1 align=\"center\">\n  <code>tool</code>\n</h1>\n\n# Later\n",
            "tool",
        ),
        ("# First\n\n<h1>Raw later</h1>\n", "First"),
        // A first heading without text gives the file name, never a later one.
        ("<h1><img src=\"logo.png\"></h1>\n\n# Second\n", "report"),
        ("<p>no heading</p>\n\n## Markdown one\n", "Markdown one"),
        // An unterminated tag ending in a multi-byte character.
        ("<h1>x</h1 \u{202e}\n\n# Later\n", "x"),
        ("</*yip<\u{202e}\n\n# Title\n", "Title"),
    ];
    for (markdown, expected) in cases {
        let html = render_with(markdown, "docs/report.md", &[], true);
        assert_eq!(title(&html), *expected, "markdown {markdown:?}");
    }
}

#[test]
fn raw_html_is_escaped_in_escape_mode() {
    let cases: &[(&str, &str)] = &[
        (
            "<script>alert(1)</script>\n",
            "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>\n",
        ),
        (
            "<div class=\"x\">\nhi\n</div>\n",
            "<p>&lt;div class=&quot;x&quot;&gt;\nhi\n&lt;/div&gt;</p>\n",
        ),
        // Comments are dropped, never shown.
        ("<!-- note -->\n", ""),
        (
            "<!--introduced_in=v0.10.0-->\n# fs\n",
            "<h1 id=\"fs\">fs<a class=\"anchor\" href=\"#fs\" aria-label=\"Link to this section\">#</a></h1>\n",
        ),
        ("a <!-- inline --> b\n", "<p>a  b</p>\n"),
        (
            "a <b onclick=\"x()\">b</b> c\n",
            "<p>a &lt;b onclick=&quot;x()&quot;&gt;b&lt;/b&gt; c</p>\n",
        ),
    ];
    for (markdown, expected) in cases {
        assert_eq!(body(&render(markdown)), *expected, "markdown {markdown:?}");
    }
}

fn render_sanitized(markdown: &str) -> String {
    render_sanitized_with(markdown, "docs/report.md", &[])
}

fn render_sanitized_with(markdown: &str, source: &str, generated: &[&str]) -> String {
    let generated = set(generated);
    markdown_to_html(
        markdown,
        &RenderOptions {
            raw_html: RawHtml::Sanitize,
            source_path: source,
            generated_markdown: &generated,
            template: None,
        },
    )
}

/// Markup that must never come out live, tried in both safe modes: each
/// is (markdown, what must not appear in the body, lowercased).
const XSS: &[(&str, &str)] = &[
    ("<script>alert(1)</script>\n", "<script"),
    ("<img src=x onerror=alert(1)>\n", "onerror"),
    ("a <b onclick=\"x()\">b</b> c\n", "onclick"),
    ("<iframe src=\"https://evil\"></iframe>\n", "<iframe"),
    ("<object data=x></object>\n", "<object"),
    ("<embed src=x>\n", "<embed"),
    ("<form action=x><input name=p></form>\n", "<form"),
    ("<svg><script>alert(1)</script></svg>\n", "<svg"),
    ("<math><mtext></mtext></math>\n", "<math"),
    ("<base href=\"https://evil/\">\n", "<base"),
    (
        "<meta http-equiv=refresh content=\"0;url=https://evil\">\n",
        "<meta",
    ),
    ("<link rel=stylesheet href=https://evil>\n", "<link"),
    ("<style>body{display:none}</style>\n", "<style"),
    ("<p style=\"position:fixed\">x</p>\n", "style="),
    ("<a href=\"javascript:alert(1)\">x</a>\n", "javascript:"),
    ("<a href=\"JaVaScRiPt:alert(1)\">x</a>\n", "javascript:"),
    ("<a href=\"java&#x09;script:alert(1)\">x</a>\n", "script:"),
    (
        "<img src=\"data:image/svg+xml,<svg onload=alert(1)>\">\n",
        "data:",
    ),
    ("<a href=\"vbscript:x\">x</a>\n", "vbscript:"),
    ("[x](javascript:alert(1))\n", "javascript:"),
    ("![x](data:text/html,x)\n", "data:"),
    (
        "<details open ontoggle=alert(1)><summary>s</summary></details>\n",
        "ontoggle",
    ),
    ("<!-- <script>alert(1)</script> -->\n", "<script"),
    ("<scr<!-- -->ipt>alert(1)</script>\n", "<script"),
    (
        "<noscript><p title=\"</noscript><img src=x onerror=alert(1)>\">\n",
        "onerror",
    ),
    (
        "<img srcset=\"data:image/svg+xml,<svg onload=alert(1)> 1x\" src=\"a.png\">\n",
        "data:",
    ),
    (
        "<picture><source srcset=\"javascript:alert(1)\"><img src=\"a.png\"></picture>\n",
        "javascript:",
    ),
    (
        "<img srcset=\"a.png 1x, JavaScript:alert(1) 2x\">\n",
        "javascript:",
    ),
];

/// The inside of every tag of `html` (between `<` and `>`), lowercased:
/// the live markup, as opposed to text.
fn live_tags(html: &str) -> Vec<String> {
    html.split('<')
        .skip(1)
        .filter_map(|t| t.split_once('>').map(|(tag, _)| tag.to_ascii_lowercase()))
        .collect()
}

#[test]
fn no_markup_of_the_xss_list_comes_out_live_when_sanitized_or_escaped() {
    for (markdown, never) in XSS {
        for (mode, html) in [
            ("escape", render(markdown)),
            ("sanitize", render_sanitized(markdown)),
        ] {
            let tags = live_tags(body(&html));
            let live = match never.strip_prefix('<') {
                // An element: no tag of that name.
                Some(name) => tags.iter().any(|t| t.starts_with(name)),
                // An attribute or a scheme: in no tag.
                None => tags.iter().any(|t| t.contains(never)),
            };
            assert!(!live, "{mode}: {markdown:?} left {never} live: {tags:?}");
        }
    }
}

#[test]
fn sanitize_keeps_what_readmes_use_and_drops_comments() {
    let readme = "<!-- badges -->\n<div align=\"center\">\n  <img src=\"logo.png\" alt=\"Logo\" width=\"120\">\n  <h1>Project Name</h1>\n  <p><sub>fast</sub> <sup>1</sup> <kbd>Ctrl</kbd><br>next</p>\n</div>\n\n<details><summary>More</summary>\n\nHidden **text**.\n\n</details>\n\n<picture><source srcset=\"dark.png\" media=\"(prefers-color-scheme: dark)\"><img src=\"light.png\" alt=\"Shot\"></picture>\n\n## Usage\n\n- [x] done\n\n```rust\nfn main() {}\n```\n";
    let html = render_sanitized(readme);
    let content = body(&html);
    for kept in [
        "<div align=\"center\">",
        "<img src=\"logo.png\" alt=\"Logo\" width=\"120\">",
        "<h1>Project Name</h1>",
        "<sub>fast</sub>",
        "<sup>1</sup>",
        "<kbd>Ctrl</kbd><br>",
        "<details><summary>More</summary>",
        "<strong>text</strong>",
        "<source srcset=\"dark.png\" media=\"(prefers-color-scheme: dark)\">",
        "<h2 id=\"usage\">Usage<a class=\"anchor\" href=\"#usage\" aria-label=\"Link to this section\">#</a></h2>",
        "type=\"checkbox\" checked=\"\"",
        "<code class=\"language-rust\">",
    ] {
        assert!(content.contains(kept), "{kept} missing from {content}");
    }
    assert!(
        !content.contains("badges"),
        "a comment was shown: {content}"
    );
    // What the renderer writes survives the sanitizer too.
    let inside = render_sanitized(
        "<div>\n\n# Head\n\n- [x] done\n\nNote[^1] `x`\n\n[^1]: n\n\n```rust\nfn main() {}\n```\n\n</div>\n",
    );
    for kept in [
        "<h1 id=\"head\">Head<a class=\"anchor\" href=\"#head\" aria-label=\"Link to this section\">#</a></h1>",
        "type=\"checkbox\"",
        "<sup class=\"footnote-ref\"><a href=\"#fn-1\" id=\"fnref-1\"",
        "<section class=\"footnotes\" data-footnotes>",
        "<li id=\"fn-1\">",
        "class=\"footnote-backref\"",
        "<code class=\"language-rust\">",
    ] {
        assert!(body(&inside).contains(kept), "{kept} missing from {inside}");
    }
    // A note with raw HTML: the section is sanitized, and keeps all that;
    // the script is removed, neither run nor shown.
    let note = render_sanitized(
        "Note[^1] and a [![b](b.png)](https://x.org).\n\n[^1]: A <kbd onclick=\"y()\">key</kbd><script>x()</script>.\n\n> [!NOTE]\n> <b>Bold</b>\n",
    );
    for kept in [
        "<sup class=\"footnote-ref\"><a href=\"#fn-1\" id=\"fnref-1\" data-footnote-ref>1</a></sup>",
        "<div class=\"markdown-alert markdown-alert-note\">\n<p class=\"markdown-alert-title\">Note</p>\n<p><b>Bold</b></p>\n</div>",
        "<section class=\"footnotes\" data-footnotes=\"\">\n<ol>\n<li id=\"fn-1\">\n<p>A <kbd>key</kbd>. <a href=\"#fnref-1\" class=\"footnote-backref\" data-footnote-backref=\"\" data-footnote-backref-idx=\"1\" aria-label=\"Back to reference 1\">\u{21a9}</a></p>\n</li>\n</ol>\n</section>",
    ] {
        assert!(body(&note).contains(kept), "{kept} missing from {note}");
    }
    assert!(inside.contains("<title>Head</title>"), "{inside}");
    assert!(!content.contains("&lt;"), "markup shown as text: {content}");
    // The title is the first heading, inside raw HTML.
    assert!(html.contains("<title>Project Name</title>"), "{html}");
}

#[test]
fn sanitize_keeps_named_anchors_and_cell_alignment() {
    // portable-atomic's README links to `<a name>` targets; Node's
    // CHANGELOG.md tops the cells of its version table with `valign`.
    let html = render_sanitized(
        "## <a name=\"optional-features\"></a>Optional features\n\nSee [the features](#optional-features).\n\n<table>\n<tr>\n<td valign=\"top\">\n<a href=\"#v20\">20.20.2</a><br/>\n</td>\n</tr>\n</table>\n",
    );
    let content = body(&html);
    for kept in [
        // The raw anchor gets GitHub's prefix; the link still lands, on
        // the heading's own id.
        "<h2 id=\"optional-features\"><a name=\"user-content-optional-features\"></a>Optional features",
        "<a href=\"#optional-features\">the features</a>",
        "<td valign=\"top\">",
    ] {
        assert!(content.contains(kept), "{kept} missing from {content}");
    }
}

/// An `<input>` of raw HTML is only ever a disabled checkbox, as on
/// GitHub: no text, password, file or hidden field reaches the site.
#[test]
fn sanitize_keeps_only_disabled_checkboxes_of_raw_inputs() {
    // (raw HTML, whether the checkbox it becomes is checked)
    let cases = [
        ("<input type=\"text\" name=\"q\" value=\"x\">", false),
        ("<input type=\"password\">", false),
        ("<input type=\"file\">", false),
        ("<input type=\"hidden\" value=\"secret\">", false),
        ("<input>", false),
        ("<input type=\"checkbox\">", false),
        ("<input type=\"checkbox\" checked>", true),
    ];
    for (raw, checked) in cases {
        let content = body(&render_sanitized(&format!("<p>{raw}</p>\n"))).to_owned();
        let input = input_tag(&content);
        let mut attributes: Vec<&str> = input
            .trim_start_matches("<input")
            .trim_end_matches('>')
            .split_whitespace()
            .collect();
        attributes.sort_unstable();
        let mut expected = vec!["disabled=\"\"", "type=\"checkbox\""];
        if checked {
            expected.insert(0, "checked=\"\"");
        }
        assert_eq!(attributes, expected, "{raw}: {content}");
        for never in ["text", "password", "file", "hidden", "secret", "name="] {
            assert!(
                !content.contains(never),
                "{raw}: {never} reached the page: {content}"
            );
        }
    }
    // The task lists of markdown stay as they were.
    let tasks = render_sanitized("<div>\n\n- [x] done\n- [ ] todo\n\n</div>\n");
    assert!(input_tag(body(&tasks)).contains("checked=\"\""), "{tasks}");
}

/// The first `<input ...>` tag of `html`.
fn input_tag(html: &str) -> &str {
    let start = html
        .find("<input")
        .unwrap_or_else(|| panic!("no input in {html}"));
    let end = start + html[start..].find('>').unwrap() + 1;
    &html[start..end]
}

/// Raw HTML's in-page targets get GitHub's `user-content-` prefix, so that
/// an element cannot take the name of a global of the site's own script
/// (DOM clobbering); the renderer's heading and footnote ids, and their
/// links, keep their names.
#[test]
fn sanitize_prefixes_the_ids_and_names_of_raw_html_only() {
    let html = render_sanitized(
        "<div id=\"config\"><a name=\"settings\" href=\"#usage\">s</a><img name=\"x\" src=\"a.png\"></div>\n\n<div>\n\n## Usage\n\nNote[^1].\n\n[^1]: n\n\n</div>\n\n<p id=\"user-content-kept\">k</p>\n",
    );
    let content = body(&html);
    for kept in [
        "<div id=\"user-content-config\">",
        "<a name=\"user-content-settings\" href=\"#usage\">",
        "<h2 id=\"usage\">Usage<a class=\"anchor\" href=\"#usage\"",
        "id=\"fnref-1\"",
        "id=\"fn-1\"",
        "<p id=\"user-content-kept\">",
    ] {
        assert!(content.contains(kept), "{kept} missing from {content}");
    }
    for never in [
        "id=\"config\"",
        "name=\"settings\"",
        "name=\"x\"",
        "user-content-user-content",
    ] {
        assert!(!content.contains(never), "{never} in {content}");
    }
    // A raw element that takes a heading's (or a footnote's) id is raw
    // HTML's all the same.
    let taken = body(&render_sanitized(
        "<div>\n\n# config\n\n<a id=\"config\" name=\"config\" href=\"https://x.example/\">x</a><p id=\"fn-1\">f</p>\n\n</div>\n",
    ))
    .to_owned();
    assert!(taken.contains("<h1 id=\"config\">"), "{taken}");
    assert!(
        taken.contains("<a id=\"user-content-config\" name=\"user-content-config\""),
        "{taken}"
    );
    assert!(taken.contains("<p id=\"user-content-fn-1\">"), "{taken}");
}

#[test]
fn srcset_keeps_http_and_relative_candidates_only() {
    // (srcset, kept)
    let cases = [
        ("dark.png", true),
        ("a.png 1x, https://x.example/b.png 2x", true),
        ("./w.png 480w,../x/y.png 800w", true),
        ("http://x.example/a,b.png 1x", true),
        ("a.png 1x, data:image/png;base64,AAAA 2x", false),
        ("java\tscript:alert(1)", false),
        ("  javascript:alert(1) 1x", false),
        ("ftp://x.example/a.png", false),
    ];
    for (srcset, kept) in cases {
        let markdown = format!("<img srcset=\"{srcset}\" src=\"a.png\">\n");
        let content = body(&render_sanitized(&markdown)).to_owned();
        assert_eq!(content.contains("srcset="), kept, "{srcset:?}: {content}");
    }
}

#[test]
fn raw_html_links_to_generated_pages_are_rewritten_when_sanitized() {
    // Node's CHANGELOG.md links each version's page from an HTML table and
    // from a markdown list: both must reach the generated page.
    let markdown = "<table><tr><td><a href=\"changelogs/V20.md#20.20.2\">20.20.2</a></td></tr></table>\n\n\
                    * [Node.js 20](changelogs/V20.md)\n\n\
                    <a href=\"missing.md\">m</a> <a href=\"https://x.example/y.md\">y</a> <a href=\"/abs.md\">a</a>\n";
    let generated = ["docs/changelogs/V20.md"];
    let html = render_sanitized_with(markdown, "docs/report.md", &generated);
    let content = body(&html);
    for href in [
        "href=\"changelogs/V20.html#20.20.2\"",
        "href=\"changelogs/V20.html\"",
        "href=\"missing.md\"",
        "href=\"https://x.example/y.md\"",
        "href=\"/abs.md\"",
    ] {
        assert!(content.contains(href), "{href} missing from {content}");
    }
    // Allowed raw HTML passes through unchanged (docs/contract.md §10).
    let allowed = render_with(markdown, "docs/report.md", &generated, true);
    assert!(
        allowed.contains("href=\"changelogs/V20.md#20.20.2\""),
        "{allowed}"
    );
}

#[test]
fn a_first_heading_without_text_gives_the_file_name_in_every_mode() {
    // quinn's README opens with a centred logo as its only `<h1>`.
    let raw = "<h1 align=\"center\"><img width=\"500\" src=\"logo.svg\"></h1>\n\n## Features\n";
    assert_eq!(title(&render_sanitized(raw)), "report");
    let markdown = "# ![](logo.svg)\n\n## Features\n";
    assert_eq!(title(&render(markdown)), "report");
    assert_eq!(title(&render_allow(markdown)), "report");
    assert_eq!(title(&render_sanitized(markdown)), "report");
    // A raw heading with text is the title, as before.
    let named = "<h1 align=\"center\"><img src=\"logo.svg\" alt=\"quinn\"></h1>\n\n## Features\n";
    assert_eq!(title(&render_sanitized(named)), "quinn");
}

#[test]
fn the_title_collapses_every_kind_of_whitespace() {
    // serde's README: `# Serde &emsp; [![Build Status]][actions] ...`.
    let markdown = "# Serde &emsp; [![Build Status](b.svg)](https://x.example)\n";
    for html in [
        render(markdown),
        render_allow(markdown),
        render_sanitized(markdown),
    ] {
        assert_eq!(title(&html), "Serde Build Status");
    }
    let raw = "<h1>Serde&emsp;&nbsp;Norway</h1>\n";
    assert_eq!(title(&render_sanitized(raw)), "Serde Norway");
}

#[test]
fn a_page_without_raw_html_is_the_same_in_every_mode() {
    let markdown = "# Title\n\nText with [a link](other.md) and `code`[^1].\n\n[^1]: A note.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n";
    assert_eq!(render_sanitized(markdown), render(markdown));
    assert_eq!(render_sanitized(markdown), render_allow(markdown));
}

/// Allowed raw HTML is written as it is, except for the tags of GFM's
/// tag filter, which show as text (docs/contract.md §21.5).
#[test]
fn raw_html_passes_through_when_allowed_but_for_the_tag_filter() {
    let cases: &[(&str, &str)] = &[
        ("<div onclick=\"x()\">\n", "<div onclick=\"x()\">\n"),
        ("a <b>b</b> c\n", "<p>a <b>b</b> c</p>\n"),
        (
            "<script>alert(1)</script>\n",
            "&lt;script>alert(1)&lt;/script>\n",
        ),
        (
            "a <TITLE>t</title\t> <xmp/> <iframe src=x> <plaintext> <noembed><noframes><textarea></style> b\n",
            "<p>a &lt;TITLE>t&lt;/title\t> &lt;xmp/> &lt;iframe src=x> &lt;plaintext> &lt;noembed>&lt;noframes>&lt;textarea>&lt;/style> b</p>\n",
        ),
        // Only those names, as whole names.
        (
            "<titles> <scripts> <styled> <xmp-x>\n",
            "<p><titles> <scripts> <styled> <xmp-x></p>\n",
        ),
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
            "<sup class=\"footnote-ref\"><a href=\"#fn-1\" id=\"fnref-1\" data-footnote-ref>1</a></sup>",
        ),
        (
            "Note[^1].\n\n[^1]: The note.\n",
            "<section class=\"footnotes\" data-footnotes>\n<ol>\n<li id=\"fn-1\">\n<p>The note. <a href=\"#fnref-1\" class=\"footnote-backref\" data-footnote-backref data-footnote-backref-idx=\"1\" aria-label=\"Back to reference 1\">\u{21a9}</a></p>\n</li>\n</ol>\n</section>\n",
        ),
        (
            "> [!TIP]\n> Try it.\n",
            "<div class=\"markdown-alert markdown-alert-tip\">\n<p class=\"markdown-alert-title\">Tip</p>\n<p>Try it.</p>\n</div>\n",
        ),
        ("| a |\n|:-:|\n| 1 |\n", "<td align=\"center\">1</td>"),
        (
            "see www.x.org\n",
            "<a href=\"http://www.x.org\">www.x.org</a>",
        ),
        ("to a@x.org\n", "<a href=\"mailto:a@x.org\">a@x.org</a>"),
        ("a\0b\n", "<p>a\u{fffd}b</p>"),
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
        ("# Title {#id}\n", "<h1 id=\"title-id\">Title {#id}<a "),
        // Smart punctuation is off.
        ("\"quoted\" -- x\n", "<p>&quot;quoted&quot; -- x</p>"),
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
        raw_html: RawHtml::Escape,
        source_path: "a.md",
        generated_markdown: &generated,
        template: None,
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

/// A start tag found by [`tags`]: its name and attributes (entities in
/// values left as written).
#[derive(Debug)]
struct StartTag {
    name: String,
    attrs: Vec<(String, String)>,
}

impl StartTag {
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every start tag of `html`, in order: a small scanner for the markup this
/// renderer writes (quoted attribute values, no comments in the body).
fn tags(html: &str) -> Vec<StartTag> {
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        rest = &rest[at + 1..];
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let end = rest.find('>').unwrap_or(rest.len());
        let inside = rest[..end].trim_end_matches('/');
        rest = rest.get(end + 1..).unwrap_or_default();
        let name_end = inside
            .find(|c: char| c.is_whitespace())
            .unwrap_or(inside.len());
        let mut tag = StartTag {
            name: inside[..name_end].to_ascii_lowercase(),
            attrs: Vec::new(),
        };
        let mut attrs = inside[name_end..].trim_start();
        while !attrs.is_empty() {
            let name_end = attrs
                .find(|c: char| c == '=' || c.is_whitespace())
                .unwrap_or(attrs.len());
            let name = attrs[..name_end].to_ascii_lowercase();
            attrs = &attrs[name_end..];
            let value = if let Some(quoted) = attrs.strip_prefix("=\"") {
                let close = quoted.find('"').unwrap_or(quoted.len());
                attrs = quoted.get(close + 1..).unwrap_or_default();
                quoted[..close].to_owned()
            } else if let Some(bare) = attrs.strip_prefix('=') {
                // Unquoted (raw HTML passed through when allowed).
                let end = bare.find(char::is_whitespace).unwrap_or(bare.len());
                attrs = &bare[end..];
                bare[..end].to_owned()
            } else {
                if name_end == 0 {
                    // Not an attribute; step over one character.
                    let step = attrs.chars().next().map_or(0, char::len_utf8);
                    attrs = &attrs[step..];
                }
                String::new()
            };
            tag.attrs.push((name, value));
            attrs = attrs.trim_start();
        }
        found.push(tag);
    }
    found
}

/// Every `id` of the page body, in order.
fn ids(html: &str) -> Vec<String> {
    tags(body(html))
        .iter()
        .filter_map(|t| t.attr("id").map(str::to_owned))
        .collect()
}

/// Every `href` of the page body, in order.
fn hrefs(html: &str) -> Vec<String> {
    tags(body(html))
        .iter()
        .filter(|t| t.name == "a")
        .filter_map(|t| t.attr("href").map(str::to_owned))
        .collect()
}

fn assert_unique(ids: &[String], html: &str) {
    let mut seen = BTreeSet::new();
    for id in ids {
        assert!(seen.insert(id), "id {id:?} twice in {html}");
    }
}

#[test]
fn headings_get_github_style_ids_and_self_links() {
    let markdown = "# Getting Started\n\n## Usage\n\n## Usage\n\n### What's new? (v1.2)\n\n\
                    ## `cargo` *install*\n\nSetext\n------\n\n## Ünïcode Straße\n\n#\n\n## Usage 1\n";
    let html = render(markdown);
    let expected = [
        "getting-started",
        "usage",
        "usage-1",
        "whats-new-v12",
        "cargo-install",
        "setext",
        "ünïcode-straße",
        "section",
        "usage-1-1",
    ];
    assert_eq!(ids(&html), expected, "{html}");
    let headings: Vec<StartTag> = tags(body(&html))
        .into_iter()
        .filter(|t| t.name.len() == 2 && t.name.starts_with('h'))
        .collect();
    assert_eq!(headings.len(), expected.len());
    let self_links: Vec<String> = hrefs(&html);
    let wanted: Vec<String> = expected.iter().map(|id| format!("#{id}")).collect();
    assert_eq!(self_links, wanted, "each heading links to itself: {html}");
}

#[test]
fn heading_ids_leave_out_markup_and_image_text() {
    let cases: &[(&str, &str, bool)] = &[
        ("# A <b>bold</b> claim\n", "a-bold-claim", true),
        // Escaped raw HTML is text a reader sees, so it counts.
        ("# A <b>bold</b> claim\n", "a-bboldb-claim", false),
        ("# ![logo](l.png) Name\n", "name", false),
        ("# [Link](https://x.org) text\n", "link-text", false),
        ("# Fish & chips\n", "fish--chips", false),
    ];
    for (markdown, id, allow) in cases {
        let html = render_with(markdown, "a.md", &[], *allow);
        assert_eq!(
            ids(&html),
            [*id],
            "markdown {markdown:?} gave {}",
            body(&html)
        );
    }
}

/// Footnotes as GitHub lists them: at the end of the page, in the order
/// of their first reference, each with a back-link to each reference; a
/// note never referenced is left out.
#[test]
fn footnote_ids_are_prefixed_and_unique() {
    let markdown = "# Notes\n\nOne[^b] two[^a] again[^B].\n\n## fn 1\n\n## fn-1\n\n\
                    [^a]: First note.\n\n[^b]: Second note.\n\n[^never]: Unreferenced.\n";
    let html = render(markdown);
    let all = ids(&html);
    assert_unique(&all, &html);
    assert_eq!(
        all,
        [
            "notes",
            "fnref-1",
            "fnref-2",
            "fnref-1-2",
            "h-fn-1",
            "h-fn-1-1",
            "fn-1",
            "fn-2",
        ],
        "{html}"
    );
    assert!(!html.contains("Unreferenced"), "{html}");
    let links = hrefs(&html);
    for id in ["#fn-1", "#fn-2", "#fnref-1", "#fnref-2", "#fnref-1-2"] {
        assert!(links.iter().any(|h| h == id), "no link to {id}: {html}");
    }
    // Every in-page link points at an id of the page.
    for href in links.iter().filter_map(|h| h.strip_prefix('#')) {
        assert!(all.iter().any(|id| id == href), "dangling #{href}: {html}");
    }
    assert!(
        body(&html).ends_with(
            "<li id=\"fn-1\">\n<p>Second note. <a href=\"#fnref-1\" class=\"footnote-backref\" data-footnote-backref data-footnote-backref-idx=\"1\" aria-label=\"Back to reference 1\">\u{21a9}</a> \
             <a href=\"#fnref-1-2\" class=\"footnote-backref\" data-footnote-backref data-footnote-backref-idx=\"1-2\" aria-label=\"Back to reference 1-2\">\u{21a9}<sup class=\"footnote-ref\">2</sup></a></p>\n</li>\n\
             <li id=\"fn-2\">\n<p>First note. <a href=\"#fnref-2\" class=\"footnote-backref\" data-footnote-backref data-footnote-backref-idx=\"2\" aria-label=\"Back to reference 2\">\u{21a9}</a></p>\n</li>\n</ol>\n</section>\n"
        ),
        "{html}"
    );
    assert!(
        !html.contains("id=\"a\"") && !html.contains("id=\"1\""),
        "{html}"
    );
}

#[test]
fn bare_urls_become_links_outside_code_and_links() {
    let cases: &[(&str, &[&str])] = &[
        ("See https://example.com/a.\n", &["https://example.com/a"]),
        (
            "(http://x.org/wiki/A_(b)) and https://y.org/q?a=1&b=2, done\n",
            &["http://x.org/wiki/A_(b)", "https://y.org/q?a=1&amp;b=2"],
        ),
        ("*https://x.org/em*\n", &["https://x.org/em"]),
        ("a https://x.org/a_b_c z\n", &["https://x.org/a_b_c"]),
        ("a https://x.org/a\\_b z\n", &["https://x.org/a_b"]),
        (
            "# Docs at https://x.org\n",
            &["https://x.org", "#docs-at-httpsxorg"],
        ),
        ("| h |\n|---|\n| https://x.org/t |\n", &["https://x.org/t"]),
        ("`https://x.org/code`\n", &[]),
        ("```\nhttps://x.org/block\n```\n", &[]),
        ("    https://x.org/indented\n", &[]),
        (
            "[text https://x.org/in](https://x.org/out)\n",
            &["https://x.org/out"],
        ),
        ("<https://x.org/auto>\n", &["https://x.org/auto"]),
        ("![https://x.org/alt](i.png)\n", &[]),
        ("xhttps://x.org\n", &[]),
        ("ftp://x.org\n", &["ftp://x.org"]),
        ("www.x.org/a\n", &["http://www.x.org/a"]),
        ("a.b@x.org\n", &["mailto:a.b@x.org"]),
        ("`www.x.org a@x.org`\n", &[]),
    ];
    for (markdown, expected) in cases {
        let html = render(markdown);
        assert_eq!(
            hrefs(&html),
            *expected,
            "markdown {markdown:?} gave {}",
            body(&html)
        );
    }
    let html = render("Go to https://example.com/a now.\n");
    assert!(
        body(&html).contains(
            "<p>Go to <a href=\"https://example.com/a\">https://example.com/a</a> now.</p>"
        ),
        "{html}"
    );
}

#[test]
fn bare_urls_in_raw_html_are_left_alone() {
    // Escaped, the tags are text a reader sees: the URL inside the tag is
    // not at a word start, the one between the tags is plain text.
    let escaped = render("<a href=\"https://x.org/h\">https://x.org/t</a>\n");
    assert_eq!(hrefs(&escaped), ["https://x.org/t"], "{}", body(&escaped));
    let block = render("<div>\nhttps://x.org/in-block\n</div>\n");
    assert_eq!(hrefs(&block), Vec::<String>::new(), "{}", body(&block));
    let allowed = render_allow("x <a href=\"https://x.org/h\">https://x.org/t</a> y\n");
    assert_eq!(hrefs(&allowed), ["https://x.org/h"], "{}", body(&allowed));
}

#[test]
fn email_autolinks_are_mailto_links_in_both_modes() {
    for allow in [false, true] {
        for markdown in [
            "<user@example.com>\n",
            "Write to <user@example.com>.\n",
            "- <first.last+tag@sub.example.org>\n",
            "# Contact <user@example.com>\n",
            "| who |\n|---|\n| <user@example.com> |\n",
        ] {
            let html = render_with(markdown, "a.md", &[], allow);
            let mailto: Vec<String> = hrefs(&html)
                .into_iter()
                .filter(|h| h.starts_with("mailto:"))
                .collect();
            assert_eq!(
                mailto.len(),
                1,
                "allow {allow} markdown {markdown:?} gave {}",
                body(&html)
            );
            assert!(!body(&html).contains("&lt;"), "{html}");
        }
    }
}

#[test]
fn template_gets_title_and_content() {
    let generated = set(&[]);
    let options = RenderOptions {
        raw_html: RawHtml::Escape,
        source_path: "a.md",
        generated_markdown: &generated,
        template: Some(
            "<html><title>{{title}}</title>{{ x }}<main>{{content}}</main><footer>{{title}}</footer>",
        ),
    };
    let html = markdown_to_html("# Fish & {{content}}\n\nBody {{title}}.\n", &options);
    assert_eq!(
        html,
        format!(
            "<html><title>Fish &amp; {{{{content}}}}</title>{{{{ x }}}}<main><h1 id=\"fish--content\">Fish &amp; {{{{content}}}}{}</h1>\n<p>Body {{{{title}}}}.</p>\n</main><footer>Fish &amp; {{{{content}}}}</footer>",
            anchor("fish--content")
        )
    );
    assert!(
        !html.contains("<style>"),
        "no built-in stylesheet with a template"
    );
}

#[test]
fn the_hidden_self_link_takes_no_room_beside_its_heading() {
    // The invisible `#` after a heading's text pushed a centred heading
    // (`<div align="center">` around a markdown heading, as serde_norway's
    // README has) off centre by half its width.
    let rule = STYLESHEET
        .lines()
        .find(|line| line.starts_with(".anchor {"))
        .expect("an .anchor rule");
    assert!(rule.contains("position: absolute"), "{rule}");
}

#[test]
fn default_page_has_the_stylesheet() {
    let html = render("text\n");
    assert!(html.contains("<style>\n"));
    assert!(STYLESHEET.contains("prefers-color-scheme: dark"));
    assert!(STYLESHEET.contains("max-width"));
    assert!(STYLESHEET.contains("table"));
    assert!(STYLESHEET.contains("pre"));
    for class in ["note", "tip", "important", "warning", "caution"] {
        assert!(STYLESHEET.contains(&format!(".markdown-alert-{class} {{")));
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of markdown that exercise every rule of the renderer, glued
    /// together at random with arbitrary text.
    const PIECES: &[&str] = &[
        "# ",
        "## ",
        "\n",
        "\n\n",
        " ",
        "text",
        "Usage",
        "fn 1",
        "fnref-1",
        "*",
        "_",
        "~~",
        "`",
        "```\n",
        "    ",
        "> ",
        "- ",
        "1. ",
        "- [ ] ",
        "|",
        "|---|",
        "[^1]",
        "[^a]: note\n",
        "[^1]: one\n",
        "[x](",
        ")",
        "](",
        "![",
        "<",
        ">",
        "</",
        "<script>",
        "</script>",
        "<img src=x onerror=alert(1)>",
        "<a href=\"javascript:alert(1)\">",
        "<div onclick=x>",
        "javascript:alert(1)",
        "JaVaScRiPt:",
        "java\tscript:",
        "&#106;avascript:",
        "data:text/html,",
        "vbscript:",
        "https://example.com/a_(b)",
        "http://x.org.",
        "https://",
        "www.x.org",
        "<user@example.com>",
        "<https://x.org>",
        "other.md",
        "../a.md#s",
        "{{title}}",
        "{{content}}",
        "&amp;",
        "&",
        "\"",
        "'",
        "\\",
        "é",
        "\u{202e}",
        "\u{200b}",
        "=",
        "===\n",
        "---\n",
        "[r]: javascript:x\n",
        "[r]",
    ];

    fn markdown() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(PIECES).prop_map(str::to_owned),
                1 => "[ -~]{0,12}",
                1 => any::<String>().prop_map(|s| s.chars().take(6).collect()),
            ],
            0..60,
        )
        .prop_map(|pieces| pieces.concat())
    }

    fn render_mode(markdown: &str, allow: bool) -> String {
        let generated = set(&["other.md", "a.md"]);
        markdown_to_html(
            markdown,
            &RenderOptions {
                raw_html: if allow {
                    RawHtml::Allow
                } else {
                    RawHtml::Escape
                },
                source_path: "docs/page.md",
                generated_markdown: &generated,
                template: None,
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn rendering_is_safe_deterministic_and_ids_are_unique(markdown in markdown()) {
            for allow in [false, true] {
                let first = render_mode(&markdown, allow);
                let second = render_mode(&markdown, allow);
                prop_assert_eq!(&first, &second);
                let page = body(&first);
                let all_ids: Vec<String> = tags(page)
                    .iter()
                    .filter_map(|t| t.attr("id").map(str::to_owned))
                    .collect();
                let unique: BTreeSet<&String> = all_ids.iter().collect();
                if !allow {
                    prop_assert_eq!(unique.len(), all_ids.len(), "ids {:?} in {}", all_ids, page);
                }
                if allow {
                    continue;
                }
                prop_assert!(!page.to_ascii_lowercase().contains("<script"), "{}", page);
                for tag in tags(page) {
                    for (name, value) in &tag.attrs {
                        prop_assert!(!name.starts_with("on"), "attribute {} in {}", name, page);
                        if name == "href" || name == "src" {
                            let squeezed: String = value
                                .chars()
                                .filter(|c| !c.is_ascii_whitespace() && !c.is_ascii_control())
                                .collect::<String>()
                                .to_ascii_lowercase();
                            for scheme in ["javascript:", "vbscript:", "data:"] {
                                prop_assert!(!squeezed.starts_with(scheme), "{}={} in {}", name, value, page);
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_url_ending_in_a_semicolon_after_punctuation_does_not_panic() {
    // Found by the property test: the entity check computed `0 - 1`.
    let html = render("# # # *https://;<");
    assert!(body(&html).contains("https://;"), "{html}");
}

mod parts {
    use super::*;

    fn join(parts: &[Part], body: &[u8]) -> String {
        let body = std::str::from_utf8(body).unwrap();
        parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::Body => body,
            })
            .collect()
    }

    #[test]
    fn a_page_in_parts_is_the_page() {
        let generated = set(&[]);
        let templates = [
            None,
            Some("<main>{{content}}</main><p>{{title}}</p><aside>{{content}}</aside>"),
            Some("{{content}}"),
            Some("no body here: {{title}}"),
        ];
        for template in templates {
            let options = RenderOptions {
                raw_html: RawHtml::Escape,
                source_path: "a.md",
                generated_markdown: &generated,
                template,
            };
            for markdown in ["", "# T\n\ntext", "x\n\n<b>y</b>", "a\n"] {
                let mut body = Vec::new();
                let parts = render_page(markdown, &options, &mut body).unwrap();
                assert_eq!(
                    join(&parts, &body),
                    markdown_to_html(markdown, &options),
                    "template {template:?}, markdown {markdown:?}"
                );
            }
        }
    }
}

/// Found by fuzzing (docs/reliability.md): a fenced code block's info
/// string was cut at the first space only, so ```` ```rust<TAB>anchor ````
/// gave `<code class="language-rust<TAB>anchor">`, two classes to a
/// browser (which splits classes at any ASCII white space): markdown could
/// put any class of the site's stylesheet or scripts on an element, in
/// every mode, outside the sanitizer's allowlist. The language is now the
/// info string's first word, cut as CommonMark and cmark-gfm cut it.
#[test]
fn a_code_blocks_language_is_one_class() {
    for info in ["rust\tanchor", "rust\u{c}anchor", "rust anchor", "rust"] {
        let markdown = format!("```{info}\nfn main() {{}}\n```\n");
        for page in [
            render(&markdown),
            render_allow(&markdown),
            render_sanitized(&markdown),
        ] {
            assert_eq!(
                body(&page),
                "<pre><code class=\"language-rust\">fn main() {}\n</code></pre>\n",
                "{info:?}"
            );
        }
    }
}
