//! Fuzzing the config loader (docs/reliability.md, "Fuzzing"): any text
//! is loaded or refused with a message naming the file; a loaded config
//! is all checked (ids, absolute folders) and loads the same again; sizes
//! and durations read back as they are written.

use super::tests::SPEC_EXAMPLE;
use super::*;
use crate::fuzzing::{Tally, iterations, mutate};
use crate::paths::{IdKind, check_id};
use std::path::Component;

/// A config that uses every kind of key: an s3 destination, signatures
/// and a page template (both files beside the config), limits, hooks.
const FULL: &str = r#"
spool: spool
agent: {settle: 250ms, lock_timeout: 30s, max_attempts: 3, metrics_file: m.prom}
limits: {max_file_bytes: 1GiB, max_files: 1000, max_markdown_bytes: 4MiB}
pipelines:
  - id: p.1
    limits: {max_bundle_bytes: 2GiB}
    signatures:
      allowed_signers: signers
      namespace: distributor
      required: true
      scopes: {ci@a: [docs/, "*.html"]}
    destinations:
      - id: site
        path: ./out/site
        workflow: replacement
        prefix: "{pipeline_id}/{yyyy}/{mm}/"
        publish: {source: true, html: true}
        html: {raw_html: sanitize, template: page.html}
        links: {base_url: "https://example.org/a%20b/"}
        precompress: [gzip, br]
      - id: bucket
        backend: s3
        bucket: reports
        path: site/é
        prefix: x/{date}
"#;

fn check_config(text: &str, base: &Path, tally: &Tally) {
    let file = base.join("config.yaml");
    let loaded = parse(text, &file);
    tally.saw(loaded.is_ok());
    let config = match loaded {
        Ok(config) => config,
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains(&file.display().to_string()),
                "the message does not name the file: {message}"
            );
            return;
        }
    };
    assert!(config.spool.is_absolute(), "{:?}", config.spool);
    let mut ids = Vec::new();
    for p in &config.pipelines {
        assert!(check_id(IdKind::Pipeline, &p.id).is_ok(), "{:?}", p.id);
        assert!(!ids.contains(&&p.id), "{:?} twice", p.id);
        ids.push(&p.id);
        assert!(p.inbox.is_absolute(), "{:?}", p.inbox);
        let mut destinations = Vec::new();
        for d in &p.destinations {
            assert!(check_id(IdKind::Destination, &d.id).is_ok(), "{:?}", d.id);
            assert!(!destinations.contains(&&d.id), "{:?} twice", d.id);
            destinations.push(&d.id);
            if let Some(root) = d.local_root() {
                // Resolved lexically against the config's folder: `.`
                // dropped, `..` kept (where it leads is the disk's to say).
                assert!(root.is_absolute(), "{root:?}");
                assert!(
                    root.components().all(|c| c != Component::CurDir),
                    "{root:?}"
                );
            }
            let _ = d.to_json();
        }
    }
    let _ = (config.summary(), config.warnings());
    // The same text loads the same config again.
    let again = parse(text, &file).expect("loaded once, loads again");
    assert_eq!(format!("{again:?}"), format!("{config:?}"));
}

/// Sizes and durations as `config check` shows them read back the same.
fn check_values(text: &str) {
    if let Ok(n) = parse_size(text) {
        assert_eq!(parse_size(&format_size(n)), Ok(n), "{text:?}");
    }
    if let Ok(d) = parse_duration(text) {
        assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{text:?}");
    }
}

/// Any text is a config or a message that names the file.
#[test]
fn fuzz_config() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    std::fs::write(base.join("page.html"), "<html>{{title}}{{content}}</html>").unwrap();
    std::fs::write(
        base.join("signers"),
        "ci@a ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICOKjo6JLr7mZh3lc0pqkFlVrY+LVN7r94N4+Vkw6D6p\n",
    )
    .unwrap();
    let packaged = include_str!("../../packaging/config.yaml");
    let seeds: Vec<&[u8]> = vec![
        SPEC_EXAMPLE.as_bytes(),
        FULL.as_bytes(),
        packaged.as_bytes(),
        b"pipelines: []\n",
    ];
    let dictionary: &[&[u8]] = &[
        b"\n  - id: q\n    destinations: [{id: d, path: /srv/q}]\n",
        b"\n      - id: site\n        path: ./out/site\n",
        b"backend: s3",
        b"bucket: b",
        b"workflow: additive",
        b"state: x",
        b"takeover",
        b"prefix: \"{source_id}/{date}/..\"",
        b"inbox: ../inbox",
        b"path: /",
        b"raw_html: allow",
        b"template: page.html",
        b"allowed_signers: signers",
        b"base_url: http://x",
        b"retention: {prune: {max_age: 1d, keep_latest: 0}}",
        b"precompress: [zstd]",
        b"releases: 0",
        b"1TiB",
        b"18446744073709551615B",
        b"0ms",
        b"99999999999999999999d",
        b"1.5s",
        b"- ",
        b": ",
        b"\n",
        b"  ",
        b"{",
        b"}",
        b"[",
        b"]",
        b"&a ",
        b"*a",
        b"!!binary ",
        b"~",
        b"'",
        b"\"",
        b"#",
    ];
    let value_dictionary: &[&[u8]] = &[
        b"1",
        b"0",
        b"B",
        b"KiB",
        b"MiB",
        b"GiB",
        b"TiB",
        b"ms",
        b"s",
        b"m",
        b"h",
        b"d",
        b" ",
        b"18446744073709551615",
        b"-",
        b"+",
        b".5",
        b"1e3",
    ];
    let value_seeds: &[&[u8]] = &[b"4MiB", b"250ms", b"7d", b"16GiB", b"1h"];
    let tally = &Tally::new("config", "loaded");
    bolero::check!(name = "config")
        .with_iterations(iterations(5_000))
        .for_each(|input: &[u8]| {
            let text = String::from_utf8_lossy(input);
            check_config(&text, base, tally);
            check_values(&text);
            if let Some(edited) = mutate(input, &seeds, dictionary) {
                check_config(&String::from_utf8_lossy(&edited), base, tally);
            }
            if let Some(value) = mutate(input, value_seeds, value_dictionary) {
                check_values(&String::from_utf8_lossy(&value));
            }
        });
}

/// The seeds are configs that load: the edits start from valid ones.
#[test]
fn the_fuzzed_configs_start_from_ones_that_load() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("page.html"), "{{content}}").unwrap();
    std::fs::write(
        tmp.path().join("signers"),
        "ci@a ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICOKjo6JLr7mZh3lc0pqkFlVrY+LVN7r94N4+Vkw6D6p\n",
    )
    .unwrap();
    let file = tmp.path().join("config.yaml");
    for text in [
        SPEC_EXAMPLE,
        FULL,
        include_str!("../../packaging/config.yaml"),
    ] {
        if let Err(e) = parse(text, &file) {
            panic!("{e}\n{text}");
        }
    }
}
