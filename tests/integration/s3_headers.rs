//! What browsers and caches get from an s3 destination
//! (docs/object-storage.md, "Serving the bucket"), against the real
//! SeaweedFS of `seaweed::server`: each object's `Content-Type` from the
//! MIME database, the `headers` rules' `Cache-Control`, `Content-Type` and
//! `Content-Disposition` as an anonymous reader's HEAD shows them, a
//! header-only change found by `verify` and rewritten by the next
//! publication, and the rules a config may not hold.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use crate::seaweed::{Bucket, RecordingProxy, server};
use crate::util::{Output, Test, strings};

/// A test folder whose config has pipeline `p` with the s3 destination
/// `web` (below `site` in a bucket of its own, reached through a proxy
/// that records every request).
struct Site {
    t: Test,
    bucket: Bucket,
    proxy: RecordingProxy,
}

impl Site {
    fn new(headers: &str) -> Site {
        let site = Site {
            t: Test::new(),
            bucket: Bucket::new("site"),
            proxy: RecordingProxy::start(&server().endpoint),
        };
        site.set_headers(headers);
        site
    }

    /// Writes the config with `headers` (YAML lines under `headers:`, or
    /// "" for none).
    fn set_headers(&self, headers: &str) {
        let mut yaml = format!(
            "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: web
        backend: s3
        bucket: {bucket}
        path: site
        endpoint: {endpoint}
",
            bucket = self.bucket.location.bucket,
            endpoint = self.proxy.endpoint,
        );
        if !headers.is_empty() {
            yaml.push_str("        headers:\n");
            yaml.push_str(headers);
        }
        self.t.config(&yaml);
    }

    /// The binary with the server's credentials in its environment.
    fn run(&self, args: &[&str]) -> Output {
        let creds = server().credentials();
        let mut cmd = self.t.cmd();
        cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", "config.yaml"])
            .args(args);
        cmd.output()
    }

    fn publish(&self, bundle: &Path) -> Output {
        let bundle = bundle.to_str().expect("utf-8 path");
        self.run(&["run", "--json", "--pipeline", "p", bundle])
    }

    fn verify(&self) -> Output {
        self.run(&[
            "verify",
            "--json",
            "--pipeline",
            "p",
            "--destination",
            "web",
        ])
    }

    /// The outputs the requests since the last call PUT (successfully).
    fn put_since(&self) -> BTreeSet<String> {
        let prefix = format!("/{}/site/", self.bucket.location.bucket);
        self.proxy
            .take()
            .into_iter()
            .filter(|e| e.method == "PUT" && (200..300).contains(&e.status))
            .filter_map(|e| {
                let path = e.target.split('?').next()?.strip_prefix(&prefix)?;
                (!path.starts_with(".distributor")).then(|| path.to_owned())
            })
            .collect()
    }

    /// What an anonymous reader's `HEAD` of output `rel` answers: the
    /// status and the headers this test looks at.
    fn served(&self, rel: &str) -> (u16, BTreeMap<&'static str, String>) {
        let endpoint = &server().endpoint;
        let host = endpoint.strip_prefix("http://").expect("an http endpoint");
        let mut stream = TcpStream::connect(host).expect("connect to SeaweedFS");
        write!(
            stream,
            "HEAD /{}/site/{rel} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n",
            self.bucket.location.bucket
        )
        .expect("send a HEAD");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read the answer");
        let mut lines = answer.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {answer}"));
        let mut headers = BTreeMap::new();
        for line in lines.take_while(|l| !l.is_empty()) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            for wanted in ["content-type", "cache-control", "content-disposition"] {
                if name.trim().eq_ignore_ascii_case(wanted) {
                    headers.insert(wanted, value.trim().to_owned());
                }
            }
        }
        (status, headers)
    }
}

/// `(name, value)` pairs as a HEAD's headers.
fn headers(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

const RULES: &str = r#"          - match: "assets/**"
            cache_control: "public, max-age=31536000, immutable"
          - match: "**/*.html"
            cache_control: no-cache
          - match: "downloads/*.pdf"
            content_disposition: attachment
          - match: "**/*.md"
            content_type: "text/plain; charset=utf-8"
"#;

#[test]
fn objects_are_stored_with_their_mime_type_and_the_first_matching_rule() {
    let site = Site::new(RULES);
    let files = [
        ("index.html", "<p>home</p>"),
        ("2026/06/index.html", "<p>june</p>"),
        ("assets/app.js", "let a = 1;"),
        ("assets/img/logo.svg", "<svg/>"),
        ("assets/page.html", "<p>an asset</p>"),
        ("app.wasm", "\0asm"),
        ("favicon.ico", "ico"),
        ("site.webmanifest", "{}"),
        ("downloads/report.pdf", "%PDF"),
        ("downloads/old/report.pdf", "%PDF old"),
        ("notes/README.md", "# notes"),
        ("data", "no extension"),
    ];
    let b = site.t.bundle("b1", &files);
    site.publish(&b).expect_code(0);
    let js = "text/javascript; charset=utf-8";
    let html = "text/html; charset=utf-8";
    let immutable = "public, max-age=31536000, immutable";
    let cases = [
        (
            "index.html",
            headers(&[("content-type", html), ("cache-control", "no-cache")]),
        ),
        (
            "2026/06/index.html",
            headers(&[("content-type", html), ("cache-control", "no-cache")]),
        ),
        (
            "assets/app.js",
            headers(&[("content-type", js), ("cache-control", immutable)]),
        ),
        (
            "assets/img/logo.svg",
            headers(&[
                ("content-type", "image/svg+xml; charset=utf-8"),
                ("cache-control", immutable),
            ]),
        ),
        // The first rule that matches wins.
        (
            "assets/page.html",
            headers(&[("content-type", html), ("cache-control", immutable)]),
        ),
        ("app.wasm", headers(&[("content-type", "application/wasm")])),
        ("favicon.ico", headers(&[("content-type", "image/x-icon")])),
        (
            "site.webmanifest",
            headers(&[("content-type", "application/manifest+json; charset=utf-8")]),
        ),
        (
            "downloads/report.pdf",
            headers(&[
                ("content-type", "application/pdf"),
                ("content-disposition", "attachment"),
            ]),
        ),
        // `*` stays within one segment.
        (
            "downloads/old/report.pdf",
            headers(&[("content-type", "application/pdf")]),
        ),
        (
            "notes/README.md",
            headers(&[("content-type", "text/plain; charset=utf-8")]),
        ),
        (
            "data",
            headers(&[("content-type", "application/octet-stream")]),
        ),
    ];
    for (rel, want) in cases {
        assert_eq!(site.served(rel), (200, want), "{rel}");
    }
    let v = site.verify();
    v.expect_code(0);
    assert_eq!(strings(&v.json()["headers_differ"]), Vec::<String>::new());
}

#[test]
fn a_header_only_change_is_found_by_verify_and_rewritten_by_the_next_publication() {
    let site =
        Site::new("          - match: \"assets/**\"\n            cache_control: \"max-age=60\"\n");
    let files = [
        ("index.html", "<p>home</p>"),
        ("assets/app.js", "let a = 1;"),
        ("assets/app.css", "p {}"),
        ("notes.txt", "text"),
    ];
    let b = site.t.bundle("b1", &files);
    site.publish(&b).expect_code(0);
    let all: BTreeSet<String> = files.iter().map(|(p, _)| (*p).to_owned()).collect();
    assert_eq!(site.put_since(), all);
    let catalog = site.bucket.get(".distributor.json").expect("a catalog");

    // Publishing the same bundle again sends nothing.
    site.publish(&b).expect_code(0);
    assert_eq!(site.put_since(), BTreeSet::new());

    // The rules change: a longer max-age for assets, and pages no-cache.
    site.set_headers(
        "          - match: \"assets/*.js\"\n            cache_control: \"max-age=3600\"\n          - match: \"**/*.html\"\n            cache_control: no-cache\n          - match: \"assets/**\"\n            cache_control: \"max-age=60\"\n",
    );
    let v = site.verify();
    v.expect_code(1);
    let report = v.json();
    assert_eq!(report["ok"], false);
    assert_eq!(
        strings(&report["headers_differ"]),
        ["assets/app.js", "index.html"]
    );
    assert_eq!(strings(&report["missing"]), Vec::<String>::new());
    assert_eq!(strings(&report["mismatched"]), Vec::<String>::new());
    let text = site.run(&["verify", "--pipeline", "p", "--destination", "web"]);
    text.expect_code(1);
    assert!(
        text.stdout.contains("2 with other headers")
            && text.stdout.contains("headers     index.html"),
        "{}",
        text.stdout
    );

    // The same bundle again: the two objects whose headers changed are
    // written again, bytes unchanged; the others are left alone.
    let out = site.publish(&b);
    out.expect_code(0);
    assert_eq!(
        site.put_since(),
        ["assets/app.js", "index.html"].map(str::to_owned).into(),
    );
    assert_eq!(
        site.served("assets/app.js").1["cache-control"],
        "max-age=3600"
    );
    assert_eq!(site.served("index.html").1["cache-control"], "no-cache");
    assert_eq!(
        site.served("assets/app.css").1["cache-control"],
        "max-age=60"
    );
    assert!(!site.served("notes.txt").1.contains_key("cache-control"));
    let records = site.bucket.assert_records_match_objects();
    assert_eq!(records.len(), files.len());
    let before: serde_json::Value = serde_json::from_slice(&catalog).unwrap();
    for (path, r) in crate::util::records(&before) {
        assert_eq!(
            records[&path]["sha256"], r["sha256"],
            "{path}: same bytes recorded"
        );
    }
    site.verify().expect_code(0);

    // Rules removed: every header they set goes at the next publication.
    site.set_headers("");
    let v = site.verify();
    v.expect_code(1);
    assert_eq!(
        strings(&v.json()["headers_differ"]),
        ["assets/app.css", "assets/app.js", "index.html"]
    );
    site.publish(&b).expect_code(0);
    assert_eq!(
        site.served("assets/app.js").1,
        headers(&[("content-type", "text/javascript; charset=utf-8")])
    );
    site.verify().expect_code(0);
}

#[test]
fn header_rules_that_cannot_work_are_config_errors() {
    let t = Test::new();
    let s3 = |rules: &str| {
        format!(
            "pipelines:\n  - id: p\n    destinations:\n      - id: web\n        backend: s3\n        bucket: reports\n        path: site\n        headers:\n{rules}"
        )
    };
    let cases = [
        (
            s3("          - match: \"assets/[a-\"\n"),
            vec!["line 9", "is not a valid glob", "assets/**"],
        ),
        (
            s3("          - match: \"**\"\n            cache-control: no-cache\n"),
            vec!["line 10", "unknown key `cache-control`", "cache_control"],
        ),
        (
            s3("          - cache_control: no-cache\n"),
            vec!["line 9", "missing required key `match`"],
        ),
        (
            s3("          - match: \"**\"\n            content_type: \"text/html\\r\\nSet-Cookie: a=b\"\n"),
            vec!["line 10", "control character"],
        ),
        (
            "pipelines:\n  - id: p\n    destinations:\n      - id: web\n        path: ./www\n        headers:\n          - match: \"**\"\n            cache_control: no-cache\n".to_owned(),
            vec!["destination \"web\"", "backend is local", "web server", "docs/serving.md"],
        ),
    ];
    for (yaml, wants) in cases {
        t.config(&yaml);
        for args in [
            &["config", "check"][..],
            &["run", "--pipeline", "p", "./nothing"][..],
        ] {
            let out = t.run(args);
            out.expect_code(2);
            for want in &wants {
                assert!(
                    out.stderr.contains(want),
                    "{want:?} missing ({args:?}):\n{}",
                    out.stderr
                );
            }
        }
    }
}
