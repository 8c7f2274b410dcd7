//! Precompressed siblings (docs/contract.md §21.4): `X.gz` and `X.br`
//! beside every text output of at least 1 KiB of a local root with
//! `precompress`, recorded, written and deleted with their original,
//! checked by `verify`, and refused on s3.

use crate::order::{Seen, Watch};
use crate::util::{Test, assert_catalog_matches_disk, strings};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// One pipeline `p`, one local destination `d` at `./root` with the
/// extra keys `keys` (each line indented by 8 spaces).
fn config(keys: &str) -> String {
    format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
{keys}"
    )
}

/// `len` bytes of a stylesheet (or any text) marked `mark`.
fn text(mark: &str, len: usize) -> String {
    let line = format!(".{mark} {{ margin: 0; padding: 1px; }}\n");
    line.repeat(len / line.len() + 1)[..len].to_owned()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip stream");
    out
}

fn unbrotli(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(bytes, 4096)
        .read_to_end(&mut out)
        .expect("a brotli stream");
    out
}

/// What `./root` holds, the tool's own files aside.
fn on_disk(t: &Test) -> Vec<String> {
    (t.listing("root").into_iter())
        .filter(|p| !p.is_empty() && !p.starts_with(".distributor"))
        .collect()
}

/// Checks that `sibling` in `root` decompresses to the bytes of `original`.
#[track_caller]
fn assert_sibling_of(root: &Path, sibling: &str, original: &str) {
    let bytes = std::fs::read(root.join(sibling)).unwrap();
    let plain = if sibling.ends_with(".gz") {
        gunzip(&bytes)
    } else {
        unbrotli(&bytes)
    };
    assert_eq!(
        plain,
        std::fs::read(root.join(original)).unwrap(),
        "{sibling} is {original} compressed"
    );
}

#[test]
fn text_outputs_get_siblings_that_decompress_to_them_and_are_recorded() {
    let t = Test::new();
    t.config(&config(
        "        prefix: \"www/\"
        precompress: [gzip, br]
        publish: {source: true, html: true}
        links: {base_url: \"https://x.example/\"}
",
    ));
    let css = text("a", 3000);
    let md = format!("# Guide\n\n{}", "Some words, again and again.\n".repeat(80));
    let b = t.bundle(
        "site-1",
        &[
            ("assets/site.css", css.as_str()),
            ("assets/tiny.js", "let x = 1;\n"),
            ("img/logo.png", &text("png", 4096)),
            ("guide.md", &md),
            ("data.JSON", &text("j", 1024)),
        ],
    );
    let out = t.publish("p", &b, &[]);
    out.expect_code(0);
    let root = t.join("root");
    let siblings = [
        (
            "www/assets/site.css.gz",
            "www/assets/site.css",
            "assets/site.css",
        ),
        (
            "www/assets/site.css.br",
            "www/assets/site.css",
            "assets/site.css",
        ),
        ("www/guide.md.gz", "www/guide.md", "guide.md"),
        ("www/guide.md.br", "www/guide.md", "guide.md"),
        ("www/guide.html.gz", "www/guide.html", "guide.md"),
        ("www/guide.html.br", "www/guide.html", "guide.md"),
        ("www/data.JSON.gz", "www/data.JSON", "data.JSON"),
        ("www/data.JSON.br", "www/data.JSON", "data.JSON"),
    ];
    let records = t.recorded("root");
    for (sibling, original, source_path) in siblings {
        assert_sibling_of(&root, sibling, original);
        let r = &records[sibling];
        let transform = if sibling.ends_with(".gz") {
            "gzip"
        } else {
            "brotli"
        };
        assert_eq!(r["kind"], "generated", "{sibling}: {r}");
        assert_eq!(r["source_path"], source_path, "{sibling}: {r}");
        assert_eq!(r["transform"], transform, "{sibling}: {r}");
        assert_eq!(r["url"], format!("https://x.example/{sibling}"));
        assert_eq!(
            (&r["pipeline_id"], &r["destination_id"]),
            (&Value::from("p"), &Value::from("d"))
        );
        assert_eq!(r["source"], records[original]["source"], "{sibling}");
    }
    // Small and binary outputs get none.
    for none in [
        "www/assets/tiny.js.gz",
        "www/img/logo.png.gz",
        "www/img/logo.png.br",
    ] {
        assert!(!root.join(none).exists(), "{none}");
    }
    assert_eq!(records.len(), 6 + siblings.len());
    assert_eq!(strings(&out.dest()["writes"]).len(), records.len());
    assert_catalog_matches_disk(&root);
    // A gzip sibling has no name and no time.
    let gz = std::fs::read(root.join("www/assets/site.css.gz")).unwrap();
    assert_eq!(gz[3..8], [0, 0, 0, 0, 0], "no FNAME flag, MTIME 0");
    // The same bundle again compresses to the same bytes: nothing to do.
    assert_eq!(t.publish("p", &b, &[]).dest()["action"], "skip_same");
}

#[test]
fn a_bundle_file_named_like_a_sibling_stays_the_bundles() {
    let t = Test::new();
    t.config(&config("        precompress: [gzip, br]\n"));
    let css = text("a", 2048);
    let b = t.bundle(
        "own",
        &[
            ("a.css", css.as_str()),
            ("a.css.gz", "the producer's own\n"),
        ],
    );
    t.publish("p", &b, &[]).expect_code(0);
    let root = t.join("root");
    assert_eq!(
        std::fs::read_to_string(root.join("a.css.gz")).unwrap(),
        "the producer's own\n"
    );
    let records = t.recorded("root");
    assert_eq!(records["a.css.gz"]["kind"], "source");
    assert_eq!(records["a.css.br"]["transform"], "brotli");
    assert_sibling_of(&root, "a.css.br", "a.css");
    assert_catalog_matches_disk(&root);
}

#[test]
fn replacement_deletes_siblings_with_their_original() {
    let t = Test::new();
    t.config(&config(
        "        workflow: replacement\n        precompress: [gzip, br]\n",
    ));
    let b1 = t.bundle_at(
        "v1",
        "site",
        "2026-06-01T00:00:00Z",
        &[("a.css", text("a", 2000)), ("b.css", text("b", 2000))],
    );
    t.publish("p", &b1, &[]).expect_code(0);
    let b2 = t.bundle_at(
        "v2",
        "site",
        "2026-06-02T00:00:00Z",
        &[("b.css", text("b2", 2000))],
    );
    let out = t.publish("p", &b2, &[]);
    out.expect_code(0);
    assert_eq!(
        strings(&out.dest()["deletes"]),
        ["a.css", "a.css.br", "a.css.gz"]
    );
    assert_eq!(on_disk(&t), ["b.css", "b.css.br", "b.css.gz"]);
    let root = t.join("root");
    assert_sibling_of(&root, "b.css.gz", "b.css");
    assert_sibling_of(&root, "b.css.br", "b.css");
    assert_catalog_matches_disk(&root);
}

/// In an additive root a record stays until something replaces it; a
/// sibling must still not outlive the bytes it was made from.
#[test]
fn additive_rewrite_without_a_sibling_deletes_the_stale_one() {
    let t = Test::new();
    t.config(&config("        precompress: [gzip, br]\n"));
    let root = t.join("root");
    let b1 = t.bundle_at(
        "v1",
        "site",
        "2026-06-01T00:00:00Z",
        &[("a.css", text("a", 2000)), ("keep.css", text("k", 2000))],
    );
    t.publish("p", &b1, &[]).expect_code(0);
    assert!(root.join("a.css.gz").exists() && root.join("keep.css.br").exists());

    // a.css shrinks below 1 KiB: its old siblings go.
    let b2 = t.bundle_at(
        "v2",
        "site",
        "2026-06-02T00:00:00Z",
        &[("a.css", "p { margin: 0 }\n")],
    );
    let out = t.publish("p", &b2, &[]);
    out.expect_code(0);
    assert_eq!(out.dest()["action"], "upsert_additive");
    assert_eq!(strings(&out.dest()["deletes"]), ["a.css.br", "a.css.gz"]);
    assert!(!root.join("a.css.gz").exists() && !root.join("a.css.br").exists());
    // What the bundle did not name stays, siblings included.
    assert_sibling_of(&root, "keep.css.gz", "keep.css");
    assert_catalog_matches_disk(&root);

    // precompress turned off: keep.css written again loses its siblings.
    t.config(&config(""));
    let b3 = t.bundle_at(
        "v3",
        "site",
        "2026-06-03T00:00:00Z",
        &[("keep.css", text("k3", 3000))],
    );
    let out = t.publish("p", &b3, &[]);
    out.expect_code(0);
    assert_eq!(
        strings(&out.dest()["deletes"]),
        ["keep.css.br", "keep.css.gz"]
    );
    assert_eq!(on_disk(&t), ["a.css", "keep.css"]);
    assert_catalog_matches_disk(&root);
}

#[test]
fn verify_reports_a_damaged_or_missing_sibling() {
    let t = Test::new();
    t.config(&config("        precompress: [gzip, br]\n"));
    let b = t.bundle("site", &[("a.css", text("a", 2000))]);
    t.publish("p", &b, &[]).expect_code(0);
    let verify = |code: i32| -> Value {
        let out = t.run(&["verify", "--pipeline", "p", "--destination", "d", "--json"]);
        out.expect_code(code);
        out.json()
    };
    let clean = verify(0);
    assert_eq!(clean["checked"], 3, "{clean}");
    let root = t.join("root");
    let mut gz = std::fs::read(root.join("a.css.gz")).unwrap();
    let last = gz.len() - 1;
    gz[last] ^= 1;
    std::fs::write(root.join("a.css.gz"), gz).unwrap();
    std::fs::remove_file(root.join("a.css.br")).unwrap();
    let v = verify(1);
    assert_eq!(strings(&v["mismatched"]), ["a.css.gz"], "{v}");
    assert_eq!(strings(&v["missing"]), ["a.css.br"], "{v}");
}

/// Siblings become visible with the other outputs, before any page
/// (docs/contract.md §20.1): a page's `index.html.gz` is no page.
#[test]
fn siblings_appear_before_the_pages() {
    let t = Test::new();
    t.config(&config(
        "        precompress: [gzip, br]\n        publish: {source: false, html: true}\n",
    ));
    let page = |v: &str| format!("# Home {v}\n\n{}", "A line of the page.\n".repeat(80));
    let b1 = t.bundle_at(
        "v1",
        "site",
        "2026-06-01T00:00:00Z",
        &[("index.md", page("one")), ("about.md", page("one"))],
    );
    t.publish("p", &b1, &[]).expect_code(0);
    let watch = Watch::new(&t.join("root"));
    let b2 = t.bundle_at(
        "v2",
        "site",
        "2026-06-02T00:00:00Z",
        &[("index.md", page("two")), ("about.md", page("two"))],
    );
    t.publish("p", &b2, &[]).expect_code(0);
    let appeared: Vec<String> = watch
        .events()
        .into_iter()
        .filter_map(|s| match s {
            Seen::Appeared(p) if p != ".distributor.json" => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(appeared.len(), 6, "{appeared:?}");
    let first_page = appeared.iter().position(|p| p.ends_with(".html")).unwrap();
    assert_eq!(first_page, 4, "every sibling first: {appeared:?}");
    assert_catalog_matches_disk(&t.join("root"));
}

#[test]
fn precompress_is_refused_on_s3_and_names_a_bad_encoding() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        backend: s3
        bucket: site
        path: www
        precompress: [gzip]
",
    );
    let out = t.run(&["config", "check"]);
    out.expect_code(2);
    assert!(
        out.all()
            .contains("precompress is set but the backend is s3"),
        "{}",
        out.all()
    );
    t.config(&config("        precompress: [gzip, deflate]\n"));
    let out = t.run(&["config", "check"]);
    out.expect_code(2);
    assert!(
        out.all().contains("line 7") && out.all().contains("precompress \"deflate\" is not known"),
        "{}",
        out.all()
    );
}
