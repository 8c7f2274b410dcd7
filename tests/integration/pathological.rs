//! Big and odd documents render (docs/contract.md §21.6): every input of
//! cmark-gfm's pathological suite (`tests/data/cmark-gfm/
//! pathological_tests.py`), at that suite's sizes, is published with the
//! output that suite expects, under the default limits and their memory
//! bound (32 × `limits.max_markdown_bytes`); and a document that really
//! needs more memory than the bound still fails at verify, naming it.
//! Their times and peak memory at 1× and 4× are in bench/pathological.sh.

use crate::gfm_spec::without_heading_ids;
use crate::render::peak_rss_of_publishing;
use crate::util::Test;
use std::fs;

/// An input of the suite: its name, markdown, and the page's body the
/// suite expects (`Expect`).
struct Input {
    name: &'static str,
    markdown: String,
    expect: Expect,
}

/// What the suite's regular expression asks of the page's body.
enum Expect {
    /// It contains this.
    Contains(String),
    /// It is `<p>`, then only these characters, then `</p>\n`.
    ParagraphOf(&'static str),
    /// Either of these, whole (the suite's `tables`: a table, or setext
    /// headings as CommonMark allows; no text lost either way).
    Either(String, String),
}

/// The inputs of `pathological_tests.py`, with what each must give.
fn inputs() -> Vec<Input> {
    let r = |s: &str, n: usize| s.repeat(n);
    let input = |name, markdown: String, expect| Input {
        name,
        markdown,
        expect,
    };
    use Expect::{Contains, Either, ParagraphOf};
    let (collisions, bad_key) = hash_collisions(50_000);
    vec![
        input(
            "nested strong emph",
            r("*a **a ", 65000) + "b" + &r(" a** a*", 65000),
            Contains(r("<em>a <strong>a ", 65000) + "b" + &r(" a</strong> a</em>", 65000)),
        ),
        input(
            "many emph closers with no openers",
            r("a_ ", 65000),
            Contains(r("a_ ", 64999) + "a_"),
        ),
        input(
            "many emph openers with no closers",
            r("_a ", 65000),
            Contains(r("_a ", 64999) + "_a"),
        ),
        input(
            "many link closers with no openers",
            r("a]", 65000),
            Contains(r("a]", 65000)),
        ),
        input(
            "many link openers with no closers",
            r("[a", 65000),
            Contains(r("[a", 65000)),
        ),
        input(
            "mismatched openers and closers",
            r("*a_ ", 50000),
            Contains(r("*a_ ", 49999) + "*a_"),
        ),
        input(
            "openers and closers multiple of 3",
            "a**b".to_owned() + &r("c* ", 50000),
            Contains("a**b".to_owned() + &r("c* ", 49999) + "c*"),
        ),
        input(
            "link openers and emph closers",
            r("[ a_", 50000),
            Contains(r("[ a_", 50000)),
        ),
        input(
            "pattern [ (]( repeated",
            r("[ (](", 80000),
            Contains(r("[ (](", 80000)),
        ),
        input(
            "hard link/emph case",
            "**x [a*b**c*](d)".to_owned(),
            Contains("**x <a href=\"d\">a<em>b**c</em></a>".to_owned()),
        ),
        input(
            "nested brackets",
            r("[", 50000) + "a" + &r("]", 50000),
            Contains(r("[", 50000) + "a" + &r("]", 50000)),
        ),
        input(
            "nested block quotes",
            r("> ", 50000) + "a",
            Contains(r("<blockquote>\n", 50000)),
        ),
        input(
            "deeply nested lists",
            (0..1000).map(|x| r("  ", x) + "* a\n").collect(),
            Contains(
                "<ul>\n".to_owned()
                    + &r("<li>a\n<ul>\n", 999)
                    + "<li>a</li>\n</ul>\n"
                    + &r("</li>\n</ul>\n", 999),
            ),
        ),
        input(
            "U+0000 in input",
            "abc\u{0}de\u{0}".to_owned(),
            Contains("abc\u{fffd}de\u{fffd}".to_owned()),
        ),
        input(
            "unclosed links A",
            r("[a](<b", 30000),
            Contains(r("[a](&lt;b", 30000)),
        ),
        input(
            "unclosed links B",
            r("[a](b", 30000),
            Contains(r("[a](b", 30000)),
        ),
        input(
            "tables",
            r("aaa\rbbb\n-\u{b}\n", 30000),
            Either(
                "<p>aaa</p>\n<table><thead><tr><th>bbb</th></tr></thead><tbody>\n".to_owned()
                    + &r(
                        "<tr><td>aaa</td></tr>\n<tr><td>bbb</td></tr>\n<tr><td>-\u{b}</td></tr>\n",
                        29999,
                    )
                    + "</tbody></table>\n",
                r("<h2>aaa\nbbb</h2>\n", 30000),
            ),
        ),
        input(
            "reference collisions",
            collisions,
            Contains(r(&format!("<p>[{bad_key}]</p>\n"), 50000 - 1)),
        ),
        input(
            "backticks",
            (1..5000).map(|x| "e".to_owned() + &r("`", x)).collect(),
            ParagraphOf("e`"),
        ),
    ]
}

/// The suite's `reference collisions`: `count - 1` link reference
/// definitions whose labels collide in a 16-bucket hash table with the
/// one label referenced after each, and that label.
fn hash_collisions(count: usize) -> (String, String) {
    let bad = |key: &str| {
        let mut h: u32 = 0;
        for c in key.bytes() {
            h = u32::from(c)
                .wrapping_add(h << 6)
                .wrapping_add(h << 16)
                .wrapping_sub(h);
        }
        h.is_multiple_of(16)
    };
    let mut keys = (0..).map(|i| format!("x{i}")).filter(|k| bad(k));
    let bad_key = keys.next().expect("a key");
    let markdown = keys
        .take(count - 1)
        .map(|key| format!("[{key}]: /url\n\n[{bad_key}]\n\n"))
        .collect();
    (markdown, bad_key)
}

/// A file name for an input.
fn file_name(input: &Input) -> String {
    let name: String = input
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{name}.md")
}

/// The page's body, without heading ids and self-links.
fn body(page: &str) -> String {
    let start = page.find("<body>\n").expect("a body") + 7;
    let end = page.rfind("</body>").expect("the body's end");
    without_heading_ids(&page[start..end])
}

fn check(input: &Input, page: &str) {
    let body = body(page);
    let ok = match &input.expect {
        Expect::Contains(part) => body.contains(part.as_str()),
        Expect::ParagraphOf(chars) => body
            .strip_prefix("<p>")
            .and_then(|b| b.strip_suffix("</p>\n"))
            .is_some_and(|inner| inner.chars().all(|c| chars.contains(c))),
        Expect::Either(one, other) => body == *one || body == *other,
    };
    assert!(
        ok,
        "{}: the page is not what cmark-gfm's suite expects: {}...",
        input.name,
        &body[..body.len().min(300)]
    );
}

fn site(limits: &str) -> Test {
    let t = Test::on_tmpfs();
    t.config(&format!(
        "spool: ./spool
{limits}pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {{source: false, html: true}}
"
    ));
    t
}

/// All the inputs render, in one bundle, with the output the suite
/// expects: the 18 of at most 4 MiB under the default limits, within the
/// bound of 32 × 4 MiB; `backticks` (12 MB) once `limits.max_markdown_bytes`
/// lets a file that big be rendered.
#[test]
fn cmark_gfm_s_pathological_inputs_render_as_that_suite_expects() {
    let (big, inputs): (Vec<Input>, Vec<Input>) = inputs()
        .into_iter()
        .partition(|i| i.markdown.len() > 4 << 20);
    assert_eq!(inputs.len(), 18);

    let t = site("");
    let base = peak_rss_of_publishing(&t, &t.bundle("small", &[("small.md", "# Small\n")]));
    let files: Vec<(String, &str)> = inputs
        .iter()
        .map(|i| (file_name(i), i.markdown.as_str()))
        .collect();
    let peak = peak_rss_of_publishing(&t, &t.bundle("pathological", &files));
    for input in &inputs {
        let page = fs::read_to_string(
            t.join("site")
                .join(file_name(input).replace(".md", ".html")),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", input.name));
        check(input, &page);
    }
    assert!(
        peak.saturating_sub(base) <= 128 << 20,
        "rendering them took {} MiB over a base of {} MiB",
        (peak - base) >> 20,
        base >> 20
    );

    let t = site("limits: {max_markdown_bytes: 16MiB}\n");
    let files: Vec<(String, &str)> = big
        .iter()
        .map(|i| (file_name(i), i.markdown.as_str()))
        .collect();
    let bundle = t.bundle("big", &files);
    t.run(&["run", "--pipeline", "p", bundle.to_str().unwrap()])
        .expect_code(0);
    for input in &big {
        let page = fs::read_to_string(
            t.join("site")
                .join(file_name(input).replace(".md", ".html")),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", input.name));
        check(input, &page);
    }
}
