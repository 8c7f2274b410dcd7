//! Pages as GitHub renders them (docs/contract.md §21.5), measured by
//! GitHub's own test suite: every example of cmark-gfm's `spec.txt` and
//! `extensions.txt` (vendored in `tests/data/cmark-gfm`) goes into one
//! bundle, published with `raw_html: allow`; each page, without the
//! heading ids and self-links the renderer adds, must equal the example's
//! HTML once both are normalized by cmark-gfm's `normalize.py` (run with
//! python3), except the examples of [`DIFFERENT`], which must differ.

use crate::util::Test;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The examples whose expected HTML is not what GitHub shows, and why
/// (docs/rendering.md lists them): (file, number of the example in the
/// file, as the spec numbers it).
const DIFFERENT: &[(&str, usize, &str)] = &[
    // spec_tests.py runs each example of spec.txt with only the extensions
    // its header names: these expect the tag filter or the autolinks off.
    ("spec.txt", 140, "tag filter off: <script> is kept"),
    ("spec.txt", 141, "tag filter off: <style> is kept"),
    ("spec.txt", 142, "tag filter off: <style> is kept"),
    ("spec.txt", 145, "tag filter off: <style> is kept"),
    ("spec.txt", 147, "tag filter off: <script> is kept"),
    (
        "spec.txt",
        610,
        "autolinks off: a URL in <...> with a space",
    ),
    ("spec.txt", 614, "autolinks off: an e-mail address in <...>"),
    ("spec.txt", 616, "autolinks off: a URL in < ... >"),
    ("spec.txt", 619, "autolinks off: a bare URL"),
    ("spec.txt", 620, "autolinks off: a bare e-mail address"),
    // CommonMark 0.31 (pulldown-cmark's) changed what an HTML comment is.
    (
        "spec.txt",
        645,
        "CommonMark 0.31: `--` may be inside a comment",
    ),
    (
        "spec.txt",
        646,
        "CommonMark 0.31: `<!-->` and `<!--->` are comments",
    ),
];

/// One example of a spec file.
struct Example {
    file: &'static str,
    number: usize,
    section: String,
    markdown: String,
    html: String,
}

/// The examples of `file`, read the way cmark-gfm's `spec_tests.py` reads
/// them (a `disabled` one is numbered, not run; `→` is a tab).
fn examples(file: &'static str) -> Vec<Example> {
    let text = fs::read_to_string(data().join(file)).expect("the vendored spec");
    let fence = "`".repeat(32);
    let mut found = Vec::new();
    let (mut state, mut number) = (0, 0);
    let (mut markdown, mut html, mut section) = (String::new(), String::new(), String::new());
    let mut disabled = false;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(extensions) = trimmed
            .strip_prefix(fence.as_str())
            .and_then(|rest| rest.strip_prefix(" example"))
        {
            state = 1;
            disabled = extensions.split_whitespace().any(|e| e == "disabled");
        } else if trimmed == fence {
            state = 0;
            number += 1;
            if !disabled {
                found.push(Example {
                    file,
                    number,
                    section: section.clone(),
                    markdown: markdown.replace('→', "\t"),
                    html: html.replace('→', "\t"),
                });
            }
            markdown.clear();
            html.clear();
        } else if trimmed == "." {
            state = 2;
        } else if state == 1 {
            markdown.push_str(line);
        } else if state == 2 {
            html.push_str(line);
        } else if let Some(heading) = line
            .strip_prefix('#')
            .map(|h| h.trim_start_matches('#'))
            .and_then(|h| h.strip_prefix(' '))
        {
            section = heading.trim().to_owned();
        }
    }
    found
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/cmark-gfm")
}

/// `html` without the ids of headings and their self-links (what the
/// renderer adds to what GitHub's cmark-gfm writes).
pub fn without_heading_ids(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let is_heading = rest.len() > 3
            && rest.as_bytes()[1] == b'h'
            && (b'1'..=b'6').contains(&rest.as_bytes()[2])
            && rest.as_bytes()[3] == b' ';
        if is_heading && rest[4..].starts_with("id=\"") {
            let end = rest[8..].find('"').expect("the id ends") + 9;
            out.push_str(&rest[..3]);
            rest = &rest[end..];
        } else if rest.starts_with("<a class=\"anchor\" href=\"#") {
            let end = rest.find("</a>").expect("the self-link ends") + 4;
            rest = &rest[end..];
        } else {
            out.push('<');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Our footnote markup, which is GitHub's and later cmark-gfm's
/// (`fn-1`, `data-footnote-*`, an `aria-label` on each back-link), as
/// the vendored cmark-gfm wrote it (`fn1`, neither).
fn as_vendored_footnotes(html: &str) -> String {
    let mut out = html
        .replace(" data-footnote-ref>", ">")
        .replace(" data-footnotes>", ">")
        .replace("#fn-", "#fn")
        .replace("id=\"fn-", "id=\"fn")
        .replace("#fnref-", "#fnref")
        .replace("id=\"fnref-", "id=\"fnref");
    while let Some(at) = out.find(" data-footnote-backref data-footnote-backref-idx=\"") {
        let label = out[at..].find("aria-label=\"").expect("a label") + at;
        let end = out[label + 12..].find('"').expect("the label ends") + label + 13;
        out.replace_range(at..end, "");
    }
    out
}

/// `pages` normalized by the vendored `normalize.py`. It imports `cgi`,
/// which Python 3.8 to 3.12 no longer fully have and 3.13 has not: its one
/// use (`cgi.escape`) is given to it as Python 3.7 defined it.
fn normalized(pages: &[&str]) -> Vec<String> {
    const DRIVER: &str = r#"
import html, json, sys, types
def escape(s, quote=False):
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace('"', "&quot;") if quote else s
sys.modules["cgi"] = types.SimpleNamespace(escape=escape)
sys.path.insert(0, sys.argv[1])
from normalize import normalize_html
sys.stdout.write(json.dumps([normalize_html(page) for page in json.load(sys.stdin)]))
"#;
    let mut python = Command::new("python3")
        .args(["-W", "ignore", "-c", DRIVER])
        .arg(data())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3, to run cmark-gfm's normalize.py (apt-get install python3)");
    let input = serde_json::to_vec(pages).unwrap();
    python.stdin.take().unwrap().write_all(&input).unwrap();
    let output = python.wait_with_output().unwrap();
    assert!(output.status.success(), "normalize.py failed");
    serde_json::from_slice(&output.stdout).expect("normalize.py's JSON")
}

#[test]
fn the_examples_of_github_s_spec_render_as_github_renders_them() {
    let mut all = examples("spec.txt");
    all.extend(examples("extensions.txt"));
    assert_eq!(all.len(), 699, "the examples cmark-gfm runs");
    let t = Test::on_tmpfs();
    t.write("page.html", "{{content}}");
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: false, html: true}
        html: {raw_html: allow, template: page.html}
",
    );
    let name = |e: &Example| format!("{}-{:03}", e.file.trim_end_matches(".txt"), e.number);
    let files: Vec<(String, &str)> = all
        .iter()
        .map(|e| (format!("{}.md", name(e)), e.markdown.as_str()))
        .collect();
    let bundle = t.bundle("spec", &files);
    t.run(&["run", "--pipeline", "p", bundle.to_str().unwrap()])
        .expect_code(0);

    let pages: Vec<String> = all
        .iter()
        .map(|e| {
            let page = fs::read_to_string(t.join(&format!("site/{}.html", name(e))))
                .unwrap_or_else(|err| panic!("{}: {err}", name(e)));
            let page = without_heading_ids(&page);
            if e.section == "Footnotes" {
                as_vendored_footnotes(&page)
            } else {
                page
            }
        })
        .collect();
    let mut both: Vec<&str> = pages.iter().map(String::as_str).collect();
    both.extend(all.iter().map(|e| e.html.as_str()));
    let normal = normalized(&both);
    let (got, expected) = normal.split_at(all.len());

    let mut unexpected = Vec::new();
    let mut matching = 0;
    for (i, e) in all.iter().enumerate() {
        let same = e.html.trim() == "<IGNORE>" || got[i] == expected[i];
        matching += usize::from(same);
        let listed = DIFFERENT
            .iter()
            .any(|&(file, number, _)| file == e.file && number == e.number);
        if same == listed {
            unexpected.push(format!(
                "{} example {} ({}){}:\n{}--- expected\n{}--- got\n{}",
                e.file,
                e.number,
                e.section,
                if listed {
                    " is listed as different but matches"
                } else {
                    ""
                },
                e.markdown,
                e.html,
                pages[i]
            ));
        }
    }
    assert!(
        unexpected.is_empty(),
        "{} of {} examples match; not as listed:\n\n{}",
        matching,
        all.len(),
        unexpected.join("\n")
    );
    assert_eq!(matching, all.len() - DIFFERENT.len());
}
