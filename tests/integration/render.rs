//! `publish.html` as a reader and an operator see it: the page published
//! (ids, links, stylesheet or template), template config errors, and the
//! memory a big markdown file costs (docs/contract.md §10, §12.3, §16).

use crate::util::{BIN, Test, write_file};
use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One pipeline `p` publishing HTML (and no sources) to `./site`, with
/// `extra` added under the destination's `html:` key.
fn html_site(extra: &str) -> Test {
    html_site_in("escape", extra)
}

/// [`html_site`] with `raw_html: mode`.
fn html_site_in(mode: &str, extra: &str) -> Test {
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {{source: false, html: true}}
        html:
          raw_html: {mode}
{extra}"
    ));
    t
}

/// `(tag name, attributes)` of every start tag in `html`: a small scanner
/// for the markup the renderer writes (double-quoted values).
fn start_tags(html: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut found = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find('<') {
        rest = &rest[at + 1..];
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let end = rest.find('>').expect("tag ends");
        let inside = rest[..end].trim_end_matches('/');
        rest = &rest[end + 1..];
        let (name, mut attrs_text) = inside.split_once(' ').unwrap_or((inside, ""));
        let mut attrs = Vec::new();
        loop {
            attrs_text = attrs_text.trim_start();
            if attrs_text.is_empty() {
                break;
            }
            let name_end = attrs_text.find(['=', ' ']).unwrap_or(attrs_text.len());
            let attr = attrs_text[..name_end].to_owned();
            attrs_text = &attrs_text[name_end..];
            let value = match attrs_text.strip_prefix("=\"") {
                Some(quoted) => {
                    let close = quoted.find('"').expect("value ends");
                    attrs_text = &quoted[close + 1..];
                    quoted[..close].to_owned()
                }
                None => String::new(),
            };
            attrs.push((attr, value));
        }
        found.push((name.to_ascii_lowercase(), attrs));
    }
    found
}

fn attr_values(html: &str, attr: &str) -> Vec<String> {
    start_tags(html)
        .into_iter()
        .flat_map(|(_, attrs)| attrs)
        .filter(|(name, _)| name == attr)
        .map(|(_, value)| value)
        .collect()
}

#[test]
fn published_page_has_heading_ids_footnotes_autolinks_and_stylesheet() {
    let t = html_site("");
    let b = t.bundle(
        "b-1",
        &[(
            "README.md",
            "# My Crate\n\n[Usage](#usage) · [Notes](#notes)\n\n## Usage\n\nSee https://docs.example.org/crate. \
             Mail <dev@example.com>.[^1]\n\n## Usage\n\n## Notes\n\n[^1]: A note.\n",
        )],
    );
    t.publish("p", &b, &[]).expect_code(0);
    let html = fs::read_to_string(t.join("site/README.html")).unwrap();

    let ids = attr_values(&html, "id");
    assert_eq!(
        ids,
        ["my-crate", "usage", "fnref-1", "usage-1", "notes", "fn-1"],
        "{html}"
    );
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "ids are unique: {html}");
    let hrefs = attr_values(&html, "href");
    for wanted in [
        "#usage",
        "#notes",
        "https://docs.example.org/crate",
        "mailto:dev@example.com",
        "#fn-1",
        "#fnref-1",
        "#usage-1",
    ] {
        assert!(
            hrefs.iter().any(|h| h == wanted),
            "no href {wanted}: {html}"
        );
    }
    for fragment in hrefs.iter().filter_map(|h| h.strip_prefix('#')) {
        assert!(
            ids.iter().any(|id| id == fragment),
            "#{fragment} goes nowhere: {html}"
        );
    }
    assert!(html.contains("<style>") && html.contains("prefers-color-scheme: dark"));

    // Same input, same bytes.
    let again = t.bundle(
        "b-2",
        &[(
            "README.md",
            &fs::read_to_string(b.join("README.md")).unwrap(),
        )],
    );
    fs::remove_dir_all(t.join("site")).unwrap();
    t.publish("p", &again, &[]).expect_code(0);
    assert_eq!(
        fs::read_to_string(t.join("site/README.html")).unwrap(),
        html
    );
}

#[test]
fn template_wraps_each_page() {
    let t = html_site("          template: page.html\n");
    t.write(
        "page.html",
        "<!DOCTYPE html><html><head><title>{{title}} | Site</title></head>\
         <body><main>{{content}}</main></body></html>\n",
    );
    let b = t.bundle("b-1", &[("a.md", "# Fish & Chips\n\nText.\n")]);
    t.publish("p", &b, &[]).expect_code(0);
    let html = fs::read_to_string(t.join("site/a.html")).unwrap();
    assert!(
        html.starts_with("<!DOCTYPE html><html><head><title>Fish &amp; Chips | Site</title></head><body><main><h1 id=\"fish--chips\">"),
        "{html}"
    );
    assert!(
        html.ends_with("<p>Text.</p>\n</main></body></html>\n"),
        "{html}"
    );
    assert!(!html.contains("<style>"), "{html}");

    let check = t.run(&["config", "check"]);
    check.expect_code(0);
    assert!(check.stdout.contains("template: "), "{}", check.stdout);
}

#[test]
fn missing_or_empty_template_is_a_config_error() {
    let t = html_site("          template: templates/page.html\n");
    let b = t.bundle("b-1", &[("a.md", "# A\n")]);
    for out in [t.run(&["config", "check"]), t.publish("p", &b, &[])] {
        out.expect_code(2);
        let text = out.all();
        assert!(text.contains("config.yaml"), "{text}");
        assert!(text.contains("templates/page.html"), "{text}");
        assert!(text.contains("cannot read"), "{text}");
    }
    assert!(!t.join("site").exists());

    write_file(&t.join("templates/page.html"), b"<html>{{title}}</html>\n");
    let out = t.run(&["config", "check"]);
    out.expect_code(2);
    assert!(out.all().contains("{{content}}"), "{}", out.all());
    assert!(out.all().contains("templates/page.html"), "{}", out.all());
}

/// Peak resident memory, in bytes, of `distributor run` publishing a bundle
/// of one markdown file to HTML, read with wait4(2) for that child alone.
fn peak_rss_of_run(t: &Test, name: &str, markdown: &str) -> u64 {
    peak_rss_of_bundle(t, name, &[("page.md", markdown)])
}

/// Peak resident memory, in bytes, of `distributor run` publishing a bundle
/// of `files`.
fn peak_rss_of_bundle(t: &Test, name: &str, files: &[(&str, &str)]) -> u64 {
    peak_rss_of_publishing(t, &t.bundle(name, files))
}

/// Peak resident memory, in bytes, of `distributor run --pipeline p
/// BUNDLE`, which must succeed.
pub fn peak_rss_of_publishing(t: &Test, bundle: &Path) -> u64 {
    let args = [
        "--config".as_ref(),
        "config.yaml".as_ref(),
        "run".as_ref(),
        "--pipeline".as_ref(),
        "p".as_ref(),
        bundle.as_os_str(),
    ];
    let (peak, status) = peak_rss_of(Path::new(BIN), &args, t.path());
    assert_eq!(status, 0, "run of {} failed", bundle.display());
    peak
}

/// Set to the command a probe runs: program and arguments, each followed
/// by a unit separator (0x1f; an environment value cannot hold NUL).
const PROBE: &str = "DISTRIBUTOR_TEST_PEAK_RSS_OF";

/// The test a probe runs as (see [`peak_rss_of`]).
const PROBE_TEST: &str = "render::peak_rss_is_the_command_s_own_not_the_test_process_s";

/// Peak resident memory, in bytes, of `program` with `args` in `dir`, and
/// its exit code. A child's peak as wait4(2) reports it starts at the
/// peak of the process that spawned it (the kernel carries it over exec),
/// and this test process may hold much more than a small command: the
/// command is spawned by a probe, a fresh run of this test binary that
/// runs [`PROBE_TEST`] alone, spawns it, and prints what wait4(2) says.
pub fn peak_rss_of(program: &Path, args: &[&OsStr], dir: &Path) -> (u64, i32) {
    let mut spec = OsString::new();
    for part in std::iter::once(program.as_os_str()).chain(args.iter().copied()) {
        spec.push(part);
        spec.push("\u{1f}");
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", PROBE_TEST, "--nocapture", "--test-threads=1"])
        .env(PROBE, spec)
        .env_remove("DISTRIBUTOR_CONFIG")
        .env("RUST_LOG", "warn")
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run the probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.split_once("probe: ").map(|(_, said)| said))
        .unwrap_or_else(|| panic!("the probe said nothing: {stdout}"));
    let (peak, status) = line.split_once(' ').expect("peak and status");
    (peak.parse().expect("peak"), status.parse().expect("status"))
}

/// Spawns the command of [`PROBE`], waits for it and prints its peak
/// resident memory in bytes and its exit code (-1: killed).
fn probe(spec: &OsStr) {
    use std::os::unix::ffi::OsStrExt;
    let mut parts = spec
        .as_bytes()
        .split(|&b| b == 0x1f)
        .filter(|part| !part.is_empty())
        .map(OsStr::from_bytes);
    let program = parts.next().expect("a program");
    #[allow(clippy::zombie_processes)] // reaped by wait4 below
    let child = Command::new(program)
        .args(parts)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the command");
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; status and usage are valid for writes.
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    // Reaped by wait4 above; this only drops the handle.
    drop(child);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let peak = u64::try_from(usage.ru_maxrss).expect("maxrss") * 1024;
    println!("probe: {peak} {code}");
}

#[test]
fn peak_rss_is_the_command_s_own_not_the_test_process_s() {
    if let Some(spec) = std::env::var_os(PROBE) {
        probe(&spec);
        return;
    }
    // This process holds 256 MiB; a small command measured from here
    // directly would show at least as much.
    let held = vec![1u8; 256 << 20];
    let t = Test::new();
    let (peak, status) = peak_rss_of(Path::new(BIN), &["--version".as_ref()], t.path());
    assert_eq!(status, 0);
    assert!(
        peak < 64 << 20,
        "`distributor --version` measured {} MiB",
        peak >> 20
    );
    assert_eq!(
        held.iter().map(|&b| usize::from(b)).sum::<usize>(),
        256 << 20
    );
}

/// Publishes `markdown` (built up to the default limits.max_markdown_bytes,
/// 4 MiB) and asserts that rendering it took at most 32 times its size on top
/// of the process's base (docs/contract.md §12.3).
fn assert_renders_within_32_times(piece: impl Fn(u64) -> String, start: &str) {
    assert_renders_within_32_times_in("escape", piece, start);
}

/// [`assert_renders_within_32_times`] with `raw_html: mode`.
fn assert_renders_within_32_times_in(mode: &str, piece: impl Fn(u64) -> String, start: &str) {
    let t = html_site_in(mode, "");
    let base = peak_rss_of_run(&t, "small", "# Small\n\n| a | b |\n|---|---|\n| 1 | 2 |\n");
    let mut markdown = String::from(start);
    let mut n = 0u64;
    loop {
        let next = piece(n);
        if markdown.len() + next.len() > 4 << 20 {
            break;
        }
        markdown.push_str(&next);
        n += 1;
    }
    let peak = peak_rss_of_run(&t, "big", &markdown);
    let input = markdown.len() as u64;
    assert!(
        fs::metadata(t.join("site/page.html")).unwrap().len() > input,
        "the markdown was rendered"
    );
    assert!(
        peak.saturating_sub(base) <= 32 * input,
        "rendering {input} bytes took {} MiB over a base of {} MiB ({}x)",
        (peak - base) >> 20,
        base >> 20,
        (peak - base) / input
    );
}

#[test]
fn rendering_a_big_markdown_table_stays_within_32_times_its_size() {
    assert_renders_within_32_times(
        |row| format!("| {row} | x | y | z |\n"),
        "| id | name | value | note |\n|---|---|---|---|\n",
    );
}

#[test]
fn rendering_big_documents_of_headings_lists_and_prose_stays_within_32_times_its_size() {
    assert_renders_within_32_times(
        |n| {
            format!(
                "## Part {n}\n\nSome *text* with a [link](https://example.com/{n}) and `code`.\n\n- one\n- two\n  - nested\n\n"
            )
        },
        "# Big\n\n",
    );
}

/// A Rust generic written in prose (`Vec<u8>`) is an HTML tag that never
/// closes. The sanitizer drops it, but it used to keep the stretch it
/// opened going to the end of the page, so a big README with one in its
/// first paragraph was sanitized whole and refused as too big to render
/// (docs/contract.md §16.4).
#[test]
fn a_big_readme_with_a_generic_in_its_prose_renders_within_32_times_its_size_when_sanitized() {
    assert_renders_within_32_times_in(
        "sanitize",
        |n| {
            format!(
                "## Part {n}\n\nSome *text* with a [link](https://example.com/{n}) and `code`.\n\n- one\n- two\n\n"
            )
        },
        "# Big\n\nParsing gives a Vec<u8> or an Option<T>.\n\n",
    );
}

/// `distributor run --json` of a bundle of one `page.md` (publishing HTML,
/// `limits` under the pipeline when given): its output and its peak
/// resident memory over that of a small page's run.
fn refused_run(markdown: &str, limits: &str) -> (crate::util::Output, u64, Test) {
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: p
{limits}    destinations:
      - id: site
        path: ./site
        publish: {{source: false, html: true}}
"
    ));
    let base = peak_rss_of_bundle(&t, "small", &[("small.md", "# Small\n")]);
    let b = t.bundle("dense", &[("page.md", markdown)]);
    let args = [
        "--config".as_ref(),
        "config.yaml".as_ref(),
        "run".as_ref(),
        "--pipeline".as_ref(),
        "p".as_ref(),
        b.as_os_str(),
    ];
    let (peak, status) = peak_rss_of(Path::new(BIN), &args, t.path());
    assert_eq!(status, 1, "the run of a refused page exits 1");
    let out = t.run(&["run", "--json", "--pipeline", "p", b.to_str().unwrap()]);
    (out, peak.saturating_sub(base), t)
}

/// 4 MiB (the default limits.max_markdown_bytes) of `piece` after `start`.
fn four_mib(piece: &str, start: &str) -> String {
    let mut markdown = String::from(start);
    while markdown.len() + piece.len() <= 4 << 20 {
        markdown.push_str(piece);
    }
    markdown
}

/// Text of tiny pieces of syntax (table cells, emphasis, empty headings,
/// one-word list items, a word of `a*`) makes pulldown-cmark's tree about
/// 50 times the file. At 4 MiB that is more than a rendering may take (32
/// times limits.max_markdown_bytes, 128 MiB, kernel-enforced on the child
/// process that renders it), and the file is refused like a file over
/// `limits.max_markdown_bytes`: exit 1, stage `verify`, nothing published,
/// an error naming the file, the limit and the fix (docs/contract.md
/// §12.3, §21.6).
#[test]
fn a_document_that_needs_more_memory_than_a_rendering_may_take_is_refused() {
    let shapes = [
        four_mib(
            "|1|2|3|4|5|6|7|8|\n",
            "|a|b|c|d|e|f|g|h|\n|-|-|-|-|-|-|-|-|\n",
        ),
        four_mib("*a* **b** ", "# Emphasis\n\n"),
        four_mib("#\n", ""),
        four_mib("- [ ] a\n", ""),
        four_mib("a*", ""),
    ];
    let mut stage = None;
    for markdown in &shapes {
        let head = &markdown[..20];
        let (out, peak, t) = refused_run(markdown, "");
        out.expect_code(1);
        let r = out.json();
        assert_eq!(r["stage"], "verify", "{head:?}: {r}");
        let error = r["error"].as_str().expect("an error");
        for part in [
            "page.md",
            "needs more memory to render to HTML than a rendering may take",
            "the limit is 128MiB, 32 times limits.max_markdown_bytes (4MiB)",
            "split it into smaller pages, raise limits.max_markdown_bytes",
            "publish.html off",
        ] {
            assert!(error.contains(part), "{head:?}: {part:?} not in {error}");
        }
        assert!(!t.join("site/page.html").exists(), "nothing is published");
        assert!(
            peak <= 32 * markdown.len() as u64,
            "{head:?}: refusing took {} MiB",
            peak >> 20
        );
        stage = Some(r["stage"].clone());
    }
    // The same stage and exit code as a file over the size limit.
    let (over, _, _) = refused_run(
        "# Small\n\ntext\n",
        "    limits: {max_markdown_bytes: 10B}\n",
    );
    over.expect_code(1);
    assert_eq!(Some(over.json()["stage"].clone()), stage);
}

/// The agent files a bundle whose markdown needs more memory than a
/// rendering may take in failed/ with the reason, publishes nothing of it,
/// and goes on with the next bundle.
#[test]
fn the_agent_fails_a_bundle_too_big_to_render_and_publishes_the_next() {
    let t = html_site("");
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    let dense = t.bundle(
        "a-dense",
        &[("page.md", &four_mib("|1|2|3|\n", "|a|b|c|\n|-|-|-|\n"))],
    );
    fs::rename(&dense, inbox.join("a-dense")).unwrap();
    let fine = t.bundle("b-fine", &[("fine.md", "# Fine\n\ntext\n")]);
    fs::rename(&fine, inbox.join("b-fine")).unwrap();

    t.once().expect_code(1);

    assert!(
        t.spool("p", "failed").join("a-dense").is_dir(),
        "a-dense is failed"
    );
    assert!(
        t.spool("p", "done").join("b-fine").is_dir(),
        "b-fine is done"
    );
    assert!(
        !t.join("site/page.html").exists(),
        "nothing of a-dense is published"
    );
    let page = fs::read_to_string(t.join("site/fine.html")).unwrap();
    assert_eq!(page, rendered("# Fine\n\ntext\n", "fine.md", None));
    let error = verify_error(&t, "a-dense");
    assert!(
        error.contains("page.md") && error.contains("needs more memory"),
        "{error}"
    );
}

/// The error of the failed bundle `name`, which failed at stage verify.
fn verify_error(t: &Test, name: &str) -> String {
    let result = t
        .spool("p", "failed")
        .join(format!("{name}/.distributor-result.json"));
    let r: serde_json::Value = serde_json::from_slice(&fs::read(result).unwrap()).unwrap();
    assert_eq!(r["stage"], "verify", "{r}");
    r["error"].as_str().expect("an error").to_owned()
}

/// At least `len` bytes of markdown: sections with a small table each,
/// which render to about three times their size.
fn big_markdown(len: usize) -> String {
    let mut markdown = String::from("# Big\n\n");
    let mut n = 0;
    while markdown.len() < len {
        markdown.push_str(&format!(
            "## Part {}\n\n| a | b |\n|---|---|\n| {n} | *x* |\n\n",
            n % 7
        ));
        n += 1;
    }
    markdown
}

/// The page the renderer makes of `markdown` at `source_path` (its only
/// generated markdown file), in escape mode.
fn rendered(markdown: &str, source_path: &str, template: Option<&str>) -> String {
    let generated = BTreeSet::from([source_path.to_owned()]);
    distributor::render::markdown_to_html(
        markdown,
        &distributor::render::RenderOptions {
            raw_html: distributor::config::RawHtml::Escape,
            source_path,
            generated_markdown: &generated,
            template,
        },
    )
}

/// A page too big to hold in memory (its body goes to an unnamed temporary
/// file in the spool's `work/` folder while it is published) reaches every
/// destination whole: the same bytes as rendering in memory, with the
/// built-in skeleton and with a template that places the body twice, and
/// the catalog records those bytes' sha256. Nothing is left in `work/`.
#[test]
fn the_agent_publishes_a_page_too_big_to_hold_whole_to_every_destination() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: false, html: true}
      - id: themed
        path: ./themed
        publish: {source: true, html: true}
        html:
          template: page.html
",
    );
    let template = "<main>{{content}}</main><nav>{{title}}</nav><aside>{{content}}</aside>\n";
    t.write("page.html", template);
    // A page of several MiB, past the 1 MiB a body may take in memory.
    let markdown = big_markdown(1_500_000);
    let bundle = t.bundle("big", &[("doc/page.md", &markdown)]);
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    fs::rename(&bundle, inbox.join("big")).unwrap();

    t.once().expect_code(0);

    for (root, template) in [("site", None), ("themed", Some(template))] {
        let expected = rendered(&markdown, "doc/page.md", template);
        assert!(expected.len() > 2 << 20, "the page is past 1 MiB");
        let page = fs::read(t.join(&format!("{root}/doc/page.html"))).unwrap();
        assert!(
            page == expected.as_bytes(),
            "{root}: published {} bytes, rendering gives {} bytes",
            page.len(),
            expected.len()
        );
        let record = &t.recorded(root)["doc/page.html"];
        assert_eq!(record["sha256"], crate::util::sha256(&page), "{root}");
        assert_eq!(record["size"], page.len() as u64, "{root}");
    }
    assert_eq!(
        fs::read(t.join("themed/doc/page.md")).unwrap(),
        markdown.as_bytes()
    );
    assert!(crate::util::names(&t.spool("p", "work")).is_empty());
    assert!(crate::util::names(&t.spool("p", "done")).contains("big"));
}

/// A page too big to hold goes up to an s3 destination whole too (past
/// one 8 MiB part, so as a multipart upload), read from its temporary file
/// like the local copy made in the same run.
#[test]
fn a_page_too_big_to_hold_goes_up_to_a_bucket_whole() {
    let bucket = crate::seaweed::Bucket::new("pages");
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: web
        backend: s3
        bucket: {bucket}
        path: pages
        endpoint: {endpoint}
        publish: {{source: false, html: true}}
      - id: site
        path: ./site
        publish: {{source: false, html: true}}
",
        bucket = bucket.location.bucket,
        endpoint = crate::seaweed::server().endpoint,
    ));
    let markdown = big_markdown(3_500_000);
    let bundle = t.bundle("big", &[("page.md", &markdown)]);
    let creds = crate::seaweed::server().credentials();
    let mut cmd = t.cmd();
    cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&bundle);
    cmd.output().expect_code(0);

    let expected = rendered(&markdown, "page.md", None);
    assert!(expected.len() > 8 << 20, "the page is past one part");
    let local = fs::read(t.join("site/page.html")).unwrap();
    let uploaded = bucket.get("page.html").expect("the page is in the bucket");
    assert!(local == expected.as_bytes(), "the local page differs");
    assert!(uploaded == expected.as_bytes(), "the uploaded page differs");
    bucket.assert_records_match_objects();
}

/// A bundle of many pages holds a bounded part of them in memory: the rest
/// of the pages wait in the scratch file and the markdown sources are read
/// again from the bundle when copied. 60 files of 200 KB make pages of
/// about 36 MB; before, all of them and all the markdown (12 MB) were held
/// until the publication was staged (105 MiB over the base, now 7 MiB).
#[test]
fn a_bundle_of_many_pages_does_not_hold_them_all() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: true, html: true}
",
    );
    let base = peak_rss_of_bundle(&t, "small", &[("page.md", "# Small\n")]);
    let markdown = big_markdown(200_000);
    let names: Vec<String> = (0..60).map(|i| format!("docs/p{i:02}.md")).collect();
    let files: Vec<(&str, &str)> = names
        .iter()
        .map(|n| (n.as_str(), markdown.as_str()))
        .collect();
    let peak = peak_rss_of_bundle(&t, "many", &files);
    let total = (markdown.len() * files.len()) as u64;
    assert!(
        peak.saturating_sub(base) < total,
        "publishing {} MiB of markdown took {} MiB over a base of {} MiB",
        total >> 20,
        (peak - base) >> 20,
        base >> 20
    );
    for (i, name) in names.iter().enumerate() {
        let source = fs::read(t.join(&format!("site/{name}"))).unwrap();
        assert!(source == markdown.as_bytes(), "{name} was copied whole");
        let html = name.replace(".md", ".html");
        let page = fs::read(t.join(&format!("site/{html}"))).unwrap();
        let record = &t.recorded("site")[&html];
        assert_eq!(record["sha256"], crate::util::sha256(&page), "{html} ({i})");
    }
}

/// `size` bytes (about) of a table of tiny cells: about 50 times its size
/// to parse.
fn dense_table(size: usize) -> String {
    let mut markdown = String::from("|a|b|c|\n|-|-|-|\n");
    while markdown.len() < size {
        markdown.push_str("|1|2|3|\n");
    }
    markdown
}

/// The pids of the renderer processes that `log` (at debug for
/// `distributor::render::child`) says were started.
fn renderers_started(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|line| {
            line.split_once("renderer process ")?
                .1
                .split_once(" started")
        })
        .map(|(pid, _)| pid.to_owned())
        .collect()
}

/// Renderer processes (`distributor __render`) running in `dir` (they
/// inherit the agent's working folder).
fn renderers_in(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let is_renderer = cmdline.split(|&b| b == 0).any(|arg| arg == b"__render");
        if is_renderer && fs::read_link(entry.path().join("cwd")).ok().as_deref() == Some(&*dir) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// Markdown files are rendered one after another by long-lived renderer
/// processes, each document with the same room, 32 times
/// limits.max_markdown_bytes, whatever its own size (docs/contract.md
/// §12.3, §21.6): after a big document, a renderer renders a small one
/// that needs 50 times its size. With a limit of 1 MiB, the same document
/// is refused, naming the 32 MiB a rendering may take then.
#[test]
fn every_document_gets_the_memory_a_rendering_may_take_whatever_its_size() {
    let t = html_site("");
    let big = big_markdown(3 << 20);
    let dense = dense_table(1 << 20);
    let b = t.bundle("b", &[("a-big.md", big.as_str()), ("b-dense.md", &dense)]);
    let out = t
        .cmd()
        .env("RUST_LOG", "warn,distributor::render::child=debug")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&b)
        .output();
    out.expect_code(0);
    // One renderer rendered both, and still ran until the run ended.
    assert_eq!(renderers_started(&out.stderr).len(), 1, "{}", out.stderr);
    assert!(!out.stderr.contains(" ended"), "{}", out.stderr);
    assert_eq!(
        fs::read_to_string(t.join("site/b-dense.html")).unwrap(),
        rendered(&dense, "b-dense.md", None)
    );
    assert!(t.join("site/a-big.html").is_file());
    // The run waited for its renderer to end.
    assert_eq!(renderers_in(t.path()), Vec::<String>::new());

    let t = Test::new();
    t.config(
        "spool: ./spool
limits: {max_markdown_bytes: 1MiB}
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: false, html: true}
",
    );
    let b = t.bundle("b", &[("b-dense.md", &dense_table((1 << 20) - 100))]);
    let out = t.run(&["run", "--json", "--pipeline", "p", b.to_str().unwrap()]);
    out.expect_code(1);
    let r = out.json();
    assert_eq!(r["stage"], "verify", "{r}");
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("b-dense.md: needs more memory")
            && error.contains("the limit is 32MiB, 32 times limits.max_markdown_bytes (1MiB)"),
        "{error}"
    );
    assert!(!t.join("site/b-dense.html").exists());
}

/// A renderer killed by its limit is never used again: in one agent pass,
/// a bundle whose second document is refused fails with that reason, and
/// the documents of the bundle after it are published byte for byte as
/// rendering them in process makes them, by fresh renderers.
#[test]
fn a_renderer_killed_by_its_limit_is_replaced_and_the_next_bundle_is_published() {
    let t = html_site("");
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    let page = |n: usize| {
        format!(
            "# Page {n}\n\nSome *text* and a [link](https://example.com/{n}).\n\n| a | b |\n|---|---|\n| {n} | x |\n"
        )
    };
    let dense = four_mib("|1|2|3|\n", "|a|b|c|\n|-|-|-|\n");
    let mixed = t.bundle(
        "a-mixed",
        &[
            ("a1.md", page(1).as_str()),
            ("a2-dense.md", &dense),
            ("a3.md", &page(3)),
        ],
    );
    fs::rename(&mixed, inbox.join("a-mixed")).unwrap();
    let next: Vec<(String, String)> = (1..=6).map(|n| (format!("b{n}.md"), page(n))).collect();
    let fine = t.bundle("b-next", &next);
    fs::rename(&fine, inbox.join("b-next")).unwrap();

    let out = t
        .agent_cmd()
        .env("RUST_LOG", "info,distributor::render::child=debug")
        .args(["agent", "--once"])
        .output();
    out.expect_code(1);

    assert!(t.spool("p", "failed").join("a-mixed").is_dir());
    assert!(
        t.spool("p", "done").join("b-next").is_dir(),
        "{}",
        out.stderr
    );
    let result = t
        .spool("p", "failed")
        .join("a-mixed/.distributor-result.json");
    let r: serde_json::Value = serde_json::from_slice(&fs::read(result).unwrap()).unwrap();
    assert_eq!(r["stage"], "verify", "{r}");
    let error = r["error"].as_str().expect("an error");
    assert!(
        error.contains("a2-dense.md") && error.contains("needs more memory to render"),
        "{error}"
    );
    for name in ["a1.html", "a2-dense.html", "a3.html"] {
        assert!(!t.join("site").join(name).exists(), "{name} is published");
    }
    for (name, markdown) in &next {
        let html = fs::read_to_string(t.join("site").join(name.replace(".md", ".html"))).unwrap();
        assert_eq!(html, rendered(markdown, name, None), "{name}");
    }
    // The killed renderer ended; every document after it went to another.
    let ended: Vec<&str> = out
        .stderr
        .lines()
        .filter(|line| line.contains("renderer process") && line.contains(" ended"))
        .collect();
    assert_eq!(ended.len(), 1, "{}", out.stderr);
    assert!(renderers_started(&out.stderr).len() >= 2, "{}", out.stderr);
    // The agent waited for its idle renderers to end.
    assert_eq!(renderers_in(t.path()), Vec::<String>::new());
}

/// A live agent renders the markdown of one bundle after another on the
/// same renderer process, keeps it idle in between, and ends it when it
/// stops.
#[test]
fn a_live_agent_keeps_its_renderer_between_bundles_and_ends_it_when_stopped() {
    let t = Test::new();
    t.config(
        "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 60s
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: false, html: true}
",
    );
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    let mut agent = t.agent_logging(
        Path::new("config.yaml"),
        "info,distributor::render::child=debug",
    );
    for n in 1..=3 {
        let name = format!("b-{n}");
        let markdown = format!("# Page {n}\n\ntext\n");
        let b = t.bundle(&name, &[("page.md", markdown.as_str())]);
        fs::rename(&b, inbox.join(&name)).unwrap();
        let done = t.spool("p", "done").join(&name);
        assert!(
            crate::util::wait_for(Duration::from_secs(15), || done.is_dir()),
            "{name} is not done:\n{}",
            agent.stderr()
        );
        let page = fs::read_to_string(t.join("site/page.html")).unwrap();
        assert_eq!(page, rendered(&markdown, "page.md", None));
    }
    let started = renderers_started(&agent.stderr());
    assert_eq!(started.len(), 1, "{}", agent.stderr());
    assert_eq!(renderers_in(t.path()), started, "the renderer waits, idle");

    agent.signal(libc::SIGTERM);
    agent.finish(Duration::from_secs(30)).expect_code(0);
    assert_eq!(renderers_in(t.path()), Vec::<String>::new());
}

/// Raw HTML nested 40,000 deep and then 200,000 end tags that match
/// nothing: 1.2 MB, and quadratic for the sanitizer's parser (each end tag
/// is matched against every open element): about a minute of CPU time in
/// a release build, against the 10 s a file of its size may take.
fn slow_markdown() -> String {
    format!("{}{}x\n", "<div>".repeat(40_000), "</li>".repeat(200_000))
}

/// A document that takes more CPU time to render than its size allows
/// (docs/rendering.md) is refused like one too big for memory, naming
/// the file, its limit and the fix; the next bundle is published, and no
/// renderer is left running.
#[test]
fn the_agent_fails_a_bundle_too_slow_to_render_and_publishes_the_next() {
    let t = html_site_in("sanitize", "");
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    let slow = t.bundle("a-slow", &[("page.md", &slow_markdown())]);
    fs::rename(&slow, inbox.join("a-slow")).unwrap();
    let fine = t.bundle("b-fine", &[("fine.md", "# Fine\n\ntext\n")]);
    fs::rename(&fine, inbox.join("b-fine")).unwrap();

    t.once().expect_code(1);

    assert!(t.spool("p", "failed").join("a-slow").is_dir());
    assert!(t.spool("p", "done").join("b-fine").is_dir());
    assert!(!t.join("site/page.html").exists());
    assert!(t.join("site/fine.html").exists());
    let error = verify_error(&t, "a-slow");
    assert!(
        error.contains("page.md: took more than 10 s of CPU time to render")
            && error.contains("publish.html off"),
        "{error}"
    );
    assert!(renderers_in(t.path()).is_empty());
    assert!(!t.join("core").exists(), "a renderer left a core file");
}

/// A stop while a document renders ends the renderer 1 s after the
/// signal (it ignores SIGTERM itself), like any interrupted work: the
/// agent exits 0 and leaves the bundle in work/ for the next start, which
/// renders it again and refuses it.
#[test]
fn a_stop_ends_a_slow_rendering_and_leaves_its_bundle_in_work() {
    let t = html_site_in("sanitize", "agent:\n  settle: 0s\n");
    let slow = t.bundle("slow", &[("page.md", &slow_markdown())]);
    let mut agent = t.agent_logging(
        Path::new("config.yaml"),
        "info,distributor::render::child=debug",
    );
    fs::rename(&slow, t.spool("p", "inbox").join("slow")).unwrap();
    agent.wait_log("renderer process ", Duration::from_secs(60));
    agent.signal(libc::SIGTERM);
    let out = agent.finish(Duration::from_secs(60));
    out.expect_code(0);
    assert!(
        out.stderr
            .contains("bundle=slow: stopped before it finished; left in work/"),
        "{}",
        out.stderr
    );
    // Ended by the stop, not by its own CPU time limit (SIGXCPU).
    assert!(
        out.stderr.contains(" ended: signal: 9 (SIGKILL)"),
        "{}",
        out.stderr
    );
    assert!(t.spool("p", "work").join("slow").is_dir());
    assert!(!t.spool("p", "failed").join("slow").exists());
    assert!(renderers_in(t.path()).is_empty());

    t.once().expect_code(1);
    assert!(t.spool("p", "failed").join("slow").is_dir());
}
