//! One scenario, every backend: each test here runs the same steps against
//! a local root and against an s3 root (the real SeaweedFS of
//! `seaweed::server`), and asserts what an operator sees in both the same
//! way: the outputs at their paths (on disk, or as raw keys a second
//! client lists and a browser GETs), the catalog, `verify`, the exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use serde_json::Value;

use crate::seaweed::{Bucket, server};
use crate::util::{
    Backend, DEADLINE, Output, Test, TestCommand, each_backend, instant_of, is_reserved,
    read_state, records, strings, wait_past,
};

/// A test folder whose config has pipeline `reports` with one destination
/// `web` on `backend` (a local root `./site`, or `site/` in a bucket of its
/// own), rendering markdown too.
struct Site {
    backend: Backend,
    t: Test,
    bucket: Option<Bucket>,
    /// The keys that place a destination in this root (for more pipelines).
    root: String,
}

impl Site {
    fn new(backend: Backend, workflow: &str) -> Site {
        Site::with(backend, workflow, "")
    }

    /// [`Site::new`] with `extra` (more keys of the destination, indented
    /// as they are) in the destination.
    fn with(backend: Backend, workflow: &str, extra: &str) -> Site {
        Site::after(backend, workflow, "", extra)
    }

    /// [`Site::with`], the pipeline listing the destinations `before` (YAML
    /// list items, indented as they are) ahead of `web`.
    fn after(backend: Backend, workflow: &str, before: &str, extra: &str) -> Site {
        let t = Test::new();
        let (bucket, root) = match backend {
            Backend::Local => (None, "path: ./site".to_owned()),
            Backend::S3 => {
                let bucket = Bucket::new("site");
                let root = format!(
                    "backend: s3\n        bucket: {}\n        path: site\n        endpoint: {}",
                    bucket.location.bucket,
                    server().endpoint
                );
                (Some(bucket), root)
            }
        };
        t.config(&format!(
            "spool: ./spool
pipelines:
  - id: reports
    destinations:
{before}      - id: web
        {root}
        workflow: {workflow}
        publish:
          source: true
          html: true
{extra}"
        ));
        Site {
            backend,
            t,
            bucket,
            root,
        }
    }

    /// Adds pipeline `id`, whose destination `web` is this root (sources
    /// only, under `workflow`).
    fn add_pipeline(&self, id: &str, workflow: &str) {
        let config = fs::read_to_string(self.t.join("config.yaml")).unwrap();
        self.t.config(&format!(
            "{config}  - id: {id}\n    destinations:\n      - id: web\n        {}\n        workflow: {workflow}\n",
            self.root
        ));
    }

    /// The binary with the config (and, for s3, the server's credentials).
    fn run(&self, args: &[&str]) -> Output {
        self.command(args, &[]).output()
    }

    /// [`Site::run`], not started yet, with more environment.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> TestCommand {
        let creds = server().credentials();
        let mut cmd = self.t.cmd();
        if self.backend == Backend::S3 {
            cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
                .env("AWS_SECRET_ACCESS_KEY", &creds.secret);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        cmd.args(["--config", "config.yaml"]).args(args);
        cmd
    }

    fn publish(&self, bundle: &Path) -> Output {
        self.publish_with("reports", bundle, &[])
    }

    /// `run --json --pipeline PIPELINE [extra...] BUNDLE`.
    fn publish_with(&self, pipeline: &str, bundle: &Path, extra: &[&str]) -> Output {
        let bundle = bundle.to_str().expect("utf-8 path");
        let mut args = vec!["run", "--json", "--pipeline", pipeline];
        args.extend_from_slice(extra);
        args.push(bundle);
        self.run(&args)
    }

    /// What identifies the stored copy of output `rel`: its inode and
    /// modification time, or its ETag. The same when it was not written.
    fn identity(&self, rel: &str) -> String {
        match &self.bucket {
            None => {
                let node = &self.t.tree("site").0[rel];
                format!("{} {}", node.ino, node.mtime_ns)
            }
            Some(bucket) => bucket.etag(rel).expect("an object"),
        }
    }

    fn verify(&self) -> Output {
        self.run(&[
            "verify",
            "--json",
            "--pipeline",
            "reports",
            "--destination",
            "web",
        ])
    }

    /// The catalog's records by path.
    fn recorded(&self) -> BTreeMap<String, Value> {
        match &self.bucket {
            None => records(&read_state(&self.t.join("site"))),
            Some(bucket) => bucket.recorded(),
        }
    }

    /// The bytes at output path `rel`, as the root holds them.
    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        match &self.bucket {
            None => fs::read(self.t.join("site").join(rel)).ok(),
            Some(bucket) => bucket.get(rel),
        }
    }

    /// Every output path the root holds (reserved names aside): the files
    /// below the local root, or the raw keys a plain S3 LIST returns.
    fn paths(&self) -> BTreeSet<String> {
        let all: BTreeSet<String> = match &self.bucket {
            None => self.t.tree("site").files().into_iter().collect(),
            Some(bucket) => bucket.keys(),
        };
        all.into_iter().filter(|p| !is_reserved(p)).collect()
    }

    /// What a reader gets for output path `rel`: the file a web server
    /// would serve, or the body of an anonymous `GET` of the object's URL
    /// (each segment percent-encoded, as a browser sends it).
    fn served(&self, rel: &str) -> Option<Vec<u8>> {
        match &self.bucket {
            None => self.get(rel),
            Some(bucket) => {
                let url_path = format!("/{}/site/{}", bucket.location.bucket, url_encode(rel));
                http_get(&server().endpoint, &url_path)
            }
        }
    }

    /// Replaces output `rel` with `bytes` as another tool would.
    fn change_behind_the_back(&self, rel: &str, bytes: &[u8]) {
        match &self.bucket {
            None => crate::util::write_file(&self.t.join("site").join(rel), bytes),
            Some(bucket) => {
                bucket.plant(rel, bytes);
            }
        }
    }

    /// Deletes output `rel` as another tool would.
    fn delete_behind_the_back(&self, rel: &str) {
        match &self.bucket {
            None => fs::remove_file(self.t.join("site").join(rel)).unwrap(),
            Some(bucket) => bucket.root.delete(rel).unwrap(),
        }
    }

    /// Everything the root holds, reserved names included, as a text to
    /// compare: every entry below the local root with its bytes' hash,
    /// mode, time and inode (the root folder's own times aside: a
    /// temporary file made and removed there moves them); or every key
    /// below the s3 root with its ETag.
    fn snapshot(&self) -> String {
        match &self.bucket {
            None => {
                let mut tree = self.t.tree("site");
                tree.0.remove("");
                format!("{tree:#?}")
            }
            Some(bucket) => bucket
                .keys()
                .into_iter()
                .map(|k| format!("{k} {:?}\n", bucket.etag(&k)))
                .collect(),
        }
    }

    /// Everything the root holds but its reserved names, as a text to
    /// compare (see [`Site::snapshot`]).
    fn outputs_snapshot(&self) -> String {
        match &self.bucket {
            None => {
                let mut tree = self.t.tree("site");
                tree.0
                    .retain(|path, _| !path.is_empty() && !is_reserved(path));
                format!("{tree:#?}")
            }
            Some(bucket) => bucket
                .keys()
                .into_iter()
                .filter(|k| !is_reserved(k))
                .map(|k| format!("{k} {:?}\n", bucket.etag(&k)))
                .collect(),
        }
    }

    /// Nothing is left under `.distributor-pending/` of an s3 root: no
    /// intent, probe or clock.
    #[track_caller]
    fn assert_nothing_pending(&self) {
        if let Some(bucket) = &self.bucket {
            assert!(bucket.reserved().is_empty(), "{:?}", bucket.reserved());
        }
    }

    /// Every record's bytes are at its path, every output path is
    /// recorded, and no s3 intent is left pending.
    #[track_caller]
    fn assert_consistent(&self) {
        self.assert_consistent_but(&[]);
    }

    /// [`Site::assert_consistent`], `unmanaged` (paths someone else put
    /// there) aside.
    #[track_caller]
    fn assert_consistent_but(&self, unmanaged: &[&str]) {
        if let Some(bucket) = &self.bucket {
            let pending = bucket.pending();
            assert!(pending.is_empty(), "pending intents left: {pending:?}");
        }
        let records = self.recorded();
        for (path, r) in &records {
            let bytes = self
                .get(path)
                .unwrap_or_else(|| panic!("{:?}: {path} is recorded but absent", self.backend));
            assert_eq!(r["sha256"], crate::util::sha256(&bytes), "{path}: {r}");
        }
        let recorded: BTreeSet<String> = records.keys().cloned().collect();
        let mut paths = self.paths();
        for path in unmanaged {
            assert!(paths.remove(*path), "{:?}: {path} is gone", self.backend);
        }
        assert_eq!(paths, recorded, "{:?}: outputs vs records", self.backend);
    }
}

/// Each segment percent-encoded except `A-Z a-z 0-9 - . _ ~`.
fn url_encode(path: &str) -> String {
    path.split('/')
        .map(|segment| {
            segment
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// An anonymous HTTP/1.1 `GET` of `path` (already encoded) at `endpoint`:
/// the body on 200, `None` on 404.
fn http_get(endpoint: &str, path: &str) -> Option<Vec<u8>> {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).expect("connect to the server");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    match status.as_str() {
        "200" => {
            let body = response[split + 4..].to_vec();
            if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked")
            {
                Some(dechunk(&body))
            } else {
                Some(body)
            }
        }
        "404" => None,
        other => panic!("GET {path}: HTTP {other}\n{head}"),
    }
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).unwrap(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[line_end + 2..line_end + 2 + size]);
        body = &body[line_end + 2 + size + 2..];
    }
}

/// Names with every kind of character a clean path allows, in any
/// language: each output lands at exactly its path, is recorded under it,
/// and is served under it (for s3: the raw key a second client lists, and
/// what an anonymous GET of the percent-encoded URL returns).
#[test]
fn outputs_land_at_exactly_their_paths_whatever_the_characters() {
    let names = [
        "café.txt",
        "😀.txt",
        "hash#frag.txt",
        "per%20cent.txt",
        "q?m*t~.txt",
        "[b]{c}.txt",
        "sp ace+&=';(x).txt",
        "ドキュメント/説明.md",
        "Ελληνικά/κείμενο.txt",
        "עברית.txt",
    ];
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let files: Vec<(String, String)> = names
            .iter()
            .map(|n| (n.to_string(), format!("# {n}\n\nbytes of {n}\n")))
            .collect();
        let b = site.t.bundle("names", &files);
        let out = site.publish(&b);
        out.expect_code(0);
        let mut expected: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        expected.insert("ドキュメント/説明.html".to_owned());
        assert_eq!(site.paths(), expected, "{backend:?}: paths as stored");
        assert_eq!(
            site.recorded().keys().cloned().collect::<BTreeSet<_>>(),
            expected,
            "{backend:?}: recorded paths"
        );
        for (name, text) in &files {
            assert_eq!(
                site.served(name).as_deref(),
                Some(text.as_bytes()),
                "{backend:?}: {name} is not served at its path"
            );
        }
        let html = String::from_utf8(site.served("ドキュメント/説明.html").unwrap()).unwrap();
        assert!(html.contains("ドキュメント/説明.md"), "{backend:?}: {html}");
        let verified = site.verify();
        verified.expect_code(0);
        assert_eq!(verified.json()["checked"], expected.len());
        site.assert_consistent();
    });
}

/// An output changed, and one deleted, by another tool: `verify` reports
/// them (`mismatched`, `missing`, exit 1); publishing the bundle again
/// writes both back (the catalog records them, so they are the owner's);
/// then `verify` is clean. The same on both backends.
#[test]
fn outputs_changed_or_deleted_behind_the_tools_back_are_reported_then_repaired() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let b = site.t.bundle(
            "v1",
            &[
                ("kept.txt", "kept\n"),
                ("changed.txt", "as published\n"),
                ("deleted.txt", "to be deleted\n"),
            ],
        );
        site.publish(&b).expect_code(0);
        site.change_behind_the_back("changed.txt", b"edited by hand, longer than before\n");
        site.delete_behind_the_back("deleted.txt");

        let verified = site.verify();
        verified.expect_code(1);
        let report = verified.json();
        assert_eq!(
            strings(&report["mismatched"]),
            ["changed.txt"],
            "{backend:?}"
        );
        assert_eq!(strings(&report["missing"]), ["deleted.txt"], "{backend:?}");

        let again = site.publish(&b);
        again.expect_code(0);
        let d = again.dest();
        assert_eq!(d["action"], "upsert_additive", "{backend:?}: {d}");
        assert_eq!(
            site.get("changed.txt").as_deref(),
            Some(&b"as published\n"[..]),
            "{backend:?}"
        );
        assert_eq!(
            site.get("deleted.txt").as_deref(),
            Some(&b"to be deleted\n"[..]),
            "{backend:?}"
        );
        site.verify().expect_code(0);
        site.assert_consistent();
    });
}

/// Replacement deletes the outputs the new version no longer has, additive
/// keeps them, a rerun is `skip_same`, and an unrecorded file at a planned
/// path refuses the publication (`fail_unmanaged`, exit 3) and is left as
/// it is.
#[test]
fn publish_replace_skip_and_refuse_alike_on_every_backend() {
    each_backend(|backend| {
        for workflow in ["additive", "replacement"] {
            let site = Site::new(backend, workflow);
            let v1 = site.t.bundle_at(
                "v1",
                "docs",
                "2026-06-01T00:00:00Z",
                &[("a.txt", "a1\n"), ("b.txt", "b1\n")],
            );
            let v2 = site.t.bundle_at(
                "v2",
                "docs",
                "2026-06-02T00:00:00Z",
                &[("a.txt", "a2\n"), ("c.txt", "c2\n")],
            );
            assert_eq!(site.publish(&v1).dest()["action"], "publish_new");
            assert_eq!(site.publish(&v1).dest()["action"], "skip_same");
            let out = site.publish(&v2);
            out.expect_code(0);
            let want: &[&str] = if workflow == "additive" {
                &["a.txt", "b.txt", "c.txt"]
            } else {
                &["a.txt", "c.txt"]
            };
            let paths: Vec<String> = site.paths().into_iter().collect();
            assert_eq!(paths, want, "{backend:?} {workflow}");
            assert_eq!(site.get("a.txt").as_deref(), Some(&b"a2\n"[..]));
            site.assert_consistent();

            site.change_behind_the_back("d.txt", b"someone else's\n");
            let v3 = site
                .t
                .bundle_at("v3", "docs", "2026-06-03T00:00:00Z", &[("d.txt", "d3\n")]);
            let refused = site.publish(&v3);
            refused.expect_code(3);
            assert_eq!(refused.dest()["action"], "fail_unmanaged", "{backend:?}");
            assert_eq!(
                site.get("d.txt").as_deref(),
                Some(&b"someone else's\n"[..]),
                "{backend:?} {workflow}: an unrecorded file was touched"
            );
        }
    });
}

/// Signed bundles alike on every backend (docs/contract.md §17.3–17.5): a
/// backlog of a signed version, an older signed version dropped again, an
/// unsigned bundle and one signed by an unlisted key, published by
/// `agent --once` as one batch. Only the first is published (its signer in
/// the result); the replay is refused (`fail_conflict`) and the others at
/// verify, and the root holds exactly the first one's outputs.
#[test]
fn signed_bundles_replays_and_strangers_alike_on_every_backend() {
    each_backend(|backend| {
        let site = Site::with(
            backend,
            "replacement",
            "    signatures:\n      allowed_signers: docs.signers\n",
        );
        let ci = crate::signatures::keygen(&site.t, "ci", &["ed25519"], "");
        let stranger = crate::signatures::keygen(&site.t, "stranger", &["ed25519"], "");
        site.t
            .write("docs.signers", format!("ci@docs {}\n", ci.public));
        let sign = |b: &Path, key: &crate::signatures::Key| {
            crate::signatures::ssh_sign(&key.private, &b.join("manifest.json"), "distributor")
        };
        // v1 is published first, alone.
        let v1 = site
            .t
            .bundle_at("v1", "docs", "2026-06-01T00:00:00Z", &[("a.txt", "a1\n")]);
        sign(&v1, &ci);
        assert_eq!(site.publish(&v1).json()["signer"]["principal"], "ci@docs");
        let v0 = site
            .t
            .bundle_at("v0", "docs", "2026-05-01T00:00:00Z", &[("a.txt", "a0\n")]);
        sign(&v0, &ci);
        let v2 = site.t.bundle_at(
            "v2",
            "docs",
            "2026-06-02T00:00:00Z",
            &[("a.txt", "a2\n"), ("b.txt", "b2\n")],
        );
        sign(&v2, &ci);
        let unsigned = site.t.bundle_at(
            "unsigned",
            "docs",
            "2026-06-03T00:00:00Z",
            &[("x.txt", "x\n")],
        );
        let foreign = site.t.bundle_at(
            "foreign",
            "docs",
            "2026-06-04T00:00:00Z",
            &[("y.txt", "y\n")],
        );
        sign(&foreign, &stranger);
        let inbox = site.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        for b in [&v2, &v0, &unsigned, &foreign] {
            fs::rename(b, inbox.join(b.file_name().unwrap())).unwrap();
        }
        // The unsigned bundle waits in the inbox for its signature (until
        // incomplete_timeout, then it fails as `missing`); --once leaves it.
        site.run(&["agent", "--once"]).expect_code(1);
        let spool = |folder: &str| -> BTreeSet<String> {
            fs::read_dir(site.t.join("spool/reports").join(folder))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        };
        assert_eq!(
            spool("done"),
            BTreeSet::from(["v2".to_owned()]),
            "{backend:?}"
        );
        assert_eq!(
            spool("failed"),
            BTreeSet::from(["v0", "foreign"].map(String::from)),
            "{backend:?}"
        );
        assert_eq!(spool("inbox"), BTreeSet::from(["unsigned".to_owned()]));
        let result = |name: &str| {
            crate::util::read_json(
                &site
                    .t
                    .join("spool/reports/failed")
                    .join(name)
                    .join(".distributor-result.json"),
            )
        };
        assert_eq!(result("v0")["destinations"][0]["action"], "fail_conflict");
        assert_eq!(result("foreign")["signature_refused"], "unknown_key");
        let done = crate::util::read_json(
            &site
                .t
                .join("spool/reports/done/v2/.distributor-result.json"),
        );
        assert_eq!(done["signer"]["principal"], "ci@docs", "{done}");
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["a.txt", "b.txt"], "{backend:?}");
        assert_eq!(
            site.get("a.txt").as_deref(),
            Some(&b"a2\n"[..]),
            "{backend:?}"
        );
        site.assert_consistent();
    });
}

/// A backlog of three versions of one source, published by `agent --once`
/// (one batch): they go in arrival order, so the root ends at the last
/// version, replacement having deleted what the later versions dropped,
/// and every bundle is filed in `done/`.
#[test]
fn a_backlog_goes_in_arrival_order_and_ends_at_the_last_version() {
    each_backend(|backend| {
        let site = Site::new(backend, "replacement");
        let inbox = site.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        let versions: [(&str, &[(&str, &str)]); 3] = [
            ("v1", &[("a.txt", "a1\n"), ("old.txt", "only in v1\n")]),
            ("v2", &[("a.txt", "a2\n"), ("b.txt", "b2\n")]),
            ("v3", &[("a.txt", "a3\n"), ("c.txt", "c3\n")]),
        ];
        for (i, (name, files)) in versions.iter().enumerate() {
            let created = format!("2026-06-0{}T00:00:00Z", i + 1);
            let b = site.t.bundle_at(name, "docs", &created, files);
            fs::rename(&b, inbox.join(name)).unwrap();
        }
        site.run(&["agent", "--once"]).expect_code(0);
        let done: BTreeSet<String> = fs::read_dir(site.t.join("spool/reports/done"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(done, BTreeSet::from(["v1", "v2", "v3"].map(String::from)));
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["a.txt", "c.txt"], "{backend:?}");
        assert_eq!(
            site.get("a.txt").as_deref(),
            Some(&b"a3\n"[..]),
            "{backend:?}"
        );
        site.assert_consistent();
    });
}

/// Maintenance alike on every backend: `prune --apply` deletes the outputs
/// of the older source (keep_latest 1) and nothing else; after an output
/// is deleted behind the tool's back, `reconcile-state` drops its record,
/// and `verify` is clean again.
#[test]
fn prune_and_reconcile_alike_on_every_backend() {
    let retention = "        retention:\n          prune:\n            max_age: 1ms\n            keep_latest: 1\n";
    each_backend(|backend| {
        let site = Site::with(backend, "additive", retention);
        let old = site.t.bundle_at(
            "old",
            "docs.1",
            "2026-06-01T00:00:00Z",
            &[("a1.txt", "1\n")],
        );
        let new = site.t.bundle_at(
            "new",
            "docs.2",
            "2026-06-02T00:00:00Z",
            &[("a2.txt", "2\n")],
        );
        site.publish(&old).expect_code(0);
        site.publish(&new).expect_code(0);
        let records = site.recorded();
        wait_past(
            instant_of(&records["a2.txt"]["updated_at"]),
            std::time::Duration::from_millis(1),
        );
        let maintain = |command: &str, extra: &[&str]| {
            let mut args = vec![
                command,
                "--json",
                "--pipeline",
                "reports",
                "--destination",
                "web",
            ];
            args.extend_from_slice(extra);
            site.run(&args)
        };
        let pruned = maintain("prune", &["--apply"]);
        pruned.expect_code(0);
        assert_eq!(
            strings(&pruned.json()["deletes"]),
            ["a1.txt"],
            "{backend:?}"
        );
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["a2.txt"], "{backend:?}");
        site.assert_consistent();

        site.delete_behind_the_back("a2.txt");
        let reconciled = maintain("reconcile-state", &[]);
        reconciled.expect_code(0);
        let report = reconciled.json();
        assert_eq!(strings(&report["missing"]), ["a2.txt"], "{backend:?}");
        assert_eq!(report["removed_records"], 1, "{backend:?}");
        assert!(site.recorded().is_empty(), "{backend:?}");
        let verified = site.verify();
        verified.expect_code(0);
        assert_eq!(verified.json()["checked"], 0);
    });
}

/// A pipeline with a local root and an s3 destination batches like any
/// other: the first bundle sets both roots up alone, the rest of the
/// backlog goes as one batch (one transaction per root), and both roots end
/// at the last version with catalogs that match what they hold, which
/// `status` reads alike (the catalog object like a local catalog).
#[test]
fn a_pipeline_of_a_local_root_and_an_s3_destination_publishes_a_backlog_as_one_batch() {
    let t = Test::new();
    let bucket = Bucket::new("site");
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: disk
        path: ./site
        workflow: replacement
      - id: web
        backend: s3
        bucket: {}
        path: site
        endpoint: {}
        workflow: replacement
",
        bucket.location.bucket,
        server().endpoint
    ));
    let inbox = t.join("spool/reports/inbox");
    fs::create_dir_all(&inbox).unwrap();
    let versions: [(&str, &[(&str, &str)]); 4] = [
        ("v1", &[("a.txt", "a1\n"), ("old.txt", "only in v1\n")]),
        ("v2", &[("a.txt", "a2\n"), ("b.txt", "b2\n")]),
        ("v3", &[("a.txt", "a3\n"), ("sub/c.txt", "c3\n")]),
        ("v4", &[("a.txt", "a4\n"), ("sub/c.txt", "c3\n")]),
    ];
    for (i, (name, files)) in versions.iter().enumerate() {
        let created = format!("2026-06-0{}T00:00:00Z", i + 1);
        let b = t.bundle_at(name, "docs", &created, files);
        fs::rename(&b, inbox.join(name)).unwrap();
    }
    let creds = server().credentials();
    let out = t
        .cmd()
        .env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .env("RUST_LOG", "info")
        .args(["--config", "config.yaml", "agent", "--once"])
        .output();
    out.expect_code(0);
    let batches: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("published a batch of"))
        .collect();
    assert_eq!(batches.len(), 1, "{}", out.stderr);
    assert!(batches[0].contains("batch of 3 bundles"), "{}", batches[0]);
    assert!(!out.stderr.contains("stepped aside"), "{}", out.stderr);
    let done: BTreeSet<String> = fs::read_dir(t.join("spool/reports/done"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(done.len(), 4, "{done:?}");
    let want = ["a.txt", "sub/c.txt"];
    let on_disk: Vec<String> = t
        .tree("site")
        .files()
        .into_iter()
        .filter(|p| !is_reserved(p))
        .collect();
    assert_eq!(on_disk, want);
    let keys: Vec<String> = bucket
        .keys()
        .into_iter()
        .filter(|k| !is_reserved(k))
        .collect();
    assert_eq!(keys, want);
    assert_eq!(fs::read(t.join("site/a.txt")).unwrap(), b"a4\n");
    assert_eq!(bucket.get("a.txt").unwrap(), b"a4\n");
    let local: BTreeSet<String> = records(&read_state(&t.join("site"))).into_keys().collect();
    let remote: BTreeSet<String> = bucket.recorded().into_keys().collect();
    assert_eq!(local, BTreeSet::from(want.map(String::from)));
    assert_eq!(remote, local);
    let report: Value = serde_json::from_slice(
        &fs::read(t.join("spool/reports/done/v4/.distributor-result.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["destinations"].as_array().unwrap().len(), 2);

    // `status` reads the catalog object like a local catalog.
    let status = t
        .cmd()
        .env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .args(["--config", "config.yaml", "status", "--json"])
        .output();
    status.expect_code(0);
    let doc = status.json();
    let destinations = doc[0]["destinations"].as_array().expect("destinations");
    for (id, root) in [
        ("disk", None),
        ("web", Some(format!("s3://{}/site", bucket.location.bucket))),
    ] {
        let d = destinations
            .iter()
            .find(|d| d["destination_id"] == id)
            .unwrap_or_else(|| panic!("no destination {id} in {doc}"));
        assert_eq!(d["state"], "catalog", "{d}");
        assert_eq!(d["outputs"], want.len(), "{d}");
        if let Some(root) = root {
            assert_eq!(d["root"], root, "{d}");
        }
    }
}

/// A publication killed at any step, on any backend, converges at the next
/// run: the journal (a local root) or the intent (an s3 destination) lets
/// it settle, the rerun publishes the bundle, and the root holds exactly
/// the new version, recorded.
#[test]
fn a_publication_killed_at_any_step_converges_at_the_next_run() {
    each_backend(|backend| {
        let points: &[&str] = match backend {
            Backend::Local => &[
                "publish.after_journal",
                "publish.after_rename:2",
                "publish.after_delete",
                "publish.before_catalog",
                "publish.staged",
                "publish.committed",
            ],
            Backend::S3 => &[
                "publish.staged",
                "s3.after_upload",
                "s3.after_swap",
                "publish.committed",
            ],
        };
        for point in points {
            let site = Site::new(backend, "replacement");
            let v1 = site.t.bundle_at(
                "v1",
                "docs",
                "2026-06-01T00:00:00Z",
                &[
                    ("a.txt", "a1\n"),
                    ("old.txt", "old\n"),
                    ("page.md", "# One\n"),
                ],
            );
            let v2 = site.t.bundle_at(
                "v2",
                "docs",
                "2026-06-02T00:00:00Z",
                &[("a.txt", "a2\n"), ("b.txt", "b2\n"), ("page.md", "# Two\n")],
            );
            site.publish(&v1).expect_code(0);
            let v2 = v2.to_str().unwrap();
            let args = ["run", "--pipeline", "reports", v2];
            let crashed = site
                .command(&args, &[("DISTRIBUTOR_FAILPOINT", point)])
                .output();
            assert!(
                crashed.stderr.contains("reached: aborting"),
                "{backend:?} {point}: not reached\n{}",
                crashed.stderr
            );
            // The next run finds what the killed one left (an s3 intent is
            // stale at once with a lease of 0), settles it, and publishes.
            site.command(&args, &[("DISTRIBUTOR_S3_LEASE_SECS", "0")])
                .output()
                .expect_code(0);
            let paths: Vec<String> = site.paths().into_iter().collect();
            assert_eq!(
                paths,
                ["a.txt", "b.txt", "page.html", "page.md"],
                "{backend:?} {point}"
            );
            assert_eq!(site.get("a.txt").as_deref(), Some(&b"a2\n"[..]));
            site.assert_consistent();
            site.verify().expect_code(0);
        }
    });
}

/// Two processes publishing into one root at the same moment, on any
/// backend, from two pipelines or two bundles of one pipeline: both
/// succeed (a local root's lock makes one wait; on s3 the loser of the
/// catalog's compare-and-swap is re-applied on the winner's catalog; on a
/// local root one of them went first: `publish_new`, then
/// `upsert_additive`), and the root holds and records every output of
/// both, each with its owner.
#[test]
fn two_publishers_racing_into_one_root_both_land() {
    let files = |tag: &str| -> Vec<(String, String)> {
        (0..25)
            .map(|i| (format!("{tag}/f{i:02}.txt"), format!("{tag} {i}\n")))
            .collect()
    };
    each_backend(|backend| {
        for round in 0..4 {
            let what = format!("{backend:?} round {round}");
            let site = Site::new(backend, "additive");
            site.add_pipeline("other", "additive");
            // Even rounds: two pipelines; odd rounds: one pipeline.
            let (p1, p2) = if round % 2 == 0 {
                ("reports", "other")
            } else {
                ("reports", "reports")
            };
            let first = site.t.bundle("first", &files("first"));
            let second = site.t.bundle("second", &files("second"));
            let racers: Vec<_> = [(p1, &first), (p2, &second)]
                .iter()
                .map(|(pipeline, bundle)| {
                    let bundle = bundle.to_str().unwrap();
                    site.command(&["run", "--json", "--pipeline", pipeline, bundle], &[])
                        .start()
                })
                .collect();
            let mut actions = Vec::new();
            for mut racer in racers {
                let out = racer.finish(DEADLINE);
                out.expect_code(0);
                actions.push(out.dest()["action"].as_str().unwrap().to_owned());
            }
            actions.sort();
            match backend {
                // The lock made one wait: it planned on the other's catalog.
                Backend::Local => assert_eq!(
                    actions,
                    ["publish_new", "upsert_additive"],
                    "{what}: one went first"
                ),
                // Both may plan on the empty root; the loser's commit is
                // re-applied on the winner's catalog, and its report keeps
                // the action it planned.
                Backend::S3 => assert!(
                    actions
                        .iter()
                        .all(|a| a == "publish_new" || a == "upsert_additive"),
                    "{what}: {actions:?}"
                ),
            }
            let recs = site.recorded();
            assert_eq!(recs.len(), 50, "{what}: every record of both runs");
            for (tag, pipeline) in [("first", p1), ("second", p2)] {
                for (path, _) in files(tag) {
                    let r = &recs[&path];
                    assert_eq!(r["source"]["id"], tag, "{what}: {path}");
                    assert_eq!(r["pipeline_id"], pipeline, "{what}: {path}");
                }
            }
            site.assert_consistent();
        }
    });
}

/// A hook script in the test folder that appends what it reads on its
/// standard input, one JSON document per line, to `hooks.log`, then runs
/// `then` (shell). Returns the destination keys that install it.
fn hook(site: &Site, then: &str, timeout: &str) -> String {
    let script = site.t.join("hook.sh");
    let log = site.t.join("hooks.log");
    crate::util::write_script(
        &script,
        &format!(
            "#!/bin/sh\n{{ cat; echo; }} >> '{}'\n{then}\n",
            log.display()
        ),
    );
    format!(
        "        links:\n          base_url: https://docs.example/\n        hooks:\n          after_publish: [\"{}\", \"--zone\", \"docs\"]\n          timeout: {timeout}\n",
        script.display()
    )
}

/// Every document the hook has read so far.
fn hook_calls(site: &Site) -> Vec<Value> {
    fs::read_to_string(site.t.join("hooks.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A site whose destination runs the hook of [`hook`].
fn hooked_site(backend: Backend, workflow: &str, then: &str, timeout: &str) -> Site {
    let site = Site::new(backend, workflow);
    let extra = hook(&site, then, timeout);
    let config = fs::read_to_string(site.t.join("config.yaml")).unwrap();
    site.t.config(&format!("{config}{extra}"));
    site
}

/// After each publication that changed the root, on every backend, the
/// hook reads exactly what changed: the paths written (the rendered page
/// too), the paths deleted under replacement, their URLs, the source, the
/// action and the bundle; nothing runs for `skip_same` or a dry run; the
/// result records how the hook ended.
#[test]
fn a_hook_hears_what_changed_after_each_publication_and_nothing_else() {
    each_backend(|backend| {
        let site = hooked_site(backend, "replacement", "echo purged", "30s");
        let v1 = site.t.bundle_at(
            "v1",
            "docs",
            "2026-06-01T00:00:00Z",
            &[("a.md", "# A\n"), ("b.txt", "b1\n")],
        );
        let out = site.publish(&v1);
        out.expect_code(0);
        let result = out.json();
        assert_eq!(result["hooks"][0]["destination_id"], "web", "{result}");
        assert_eq!(result["hooks"][0]["exit"], 0, "{result}");
        assert_eq!(result["hooks"][0]["output"], "purged\n", "{result}");
        let calls = hook_calls(&site);
        assert_eq!(calls.len(), 1, "{backend:?}: {calls:?}");
        let first = &calls[0];
        assert_eq!(first["pipeline_id"], "reports");
        assert_eq!(first["destination_id"], "web");
        assert_eq!(first["bundle"], "v1");
        assert_eq!(first["action"], "publish_new");
        assert_eq!(first["source"]["id"], "docs");
        assert_eq!(first["source"]["created"], "2026-06-01T00:00:00Z");
        assert_eq!(first["source"]["digest"], result["source"]["digest"]);
        assert_eq!(first["root"], result["destinations"][0]["root"]);
        let mut writes = strings(&first["writes"]);
        writes.sort();
        assert_eq!(writes, ["a.html", "a.md", "b.txt"], "{backend:?}");
        assert_eq!(strings(&first["deletes"]), Vec::<String>::new());
        let mut urls = strings(&first["urls"]);
        urls.sort();
        assert_eq!(
            urls,
            [
                "https://docs.example/a.html",
                "https://docs.example/a.md",
                "https://docs.example/b.txt"
            ]
        );

        // The same bundle again changes nothing: no call.
        assert_eq!(site.publish(&v1).dest()["action"], "skip_same");
        let v2 = site.t.bundle_at(
            "v2",
            "docs",
            "2026-06-02T00:00:00Z",
            &[("a.md", "# A, again\n")],
        );
        // A dry run publishes nothing: no call.
        let v2s = v2.to_str().unwrap();
        site.run(&["run", "--dry-run", "--pipeline", "reports", v2s])
            .expect_code(0);
        assert_eq!(
            hook_calls(&site).len(),
            1,
            "{backend:?}: skip_same and dry runs call nothing"
        );

        site.publish(&v2).expect_code(0);
        let calls = hook_calls(&site);
        assert_eq!(calls.len(), 2, "{backend:?}");
        let mut writes = strings(&calls[1]["writes"]);
        writes.sort();
        assert_eq!(writes, ["a.html", "a.md"]);
        assert_eq!(strings(&calls[1]["deletes"]), ["b.txt"], "{backend:?}");
        assert_eq!(calls[1]["action"], "replace_catalog");
        site.assert_consistent();
    });
}

/// A backlog the agent publishes (the first bundle alone into the empty
/// root, the rest as one batch) calls the hook once per bundle, in arrival
/// order, on every backend.
#[test]
fn hooks_of_a_batch_run_once_per_bundle_in_arrival_order() {
    each_backend(|backend| {
        let site = hooked_site(backend, "additive", "", "30s");
        let inbox = site.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        for (i, name) in ["b1", "b2", "b3"].iter().enumerate() {
            let created = format!("2026-06-0{}T00:00:00Z", i + 1);
            let b = site.t.bundle_at(
                name,
                &format!("s{i}"),
                &created,
                &[(&format!("{name}.txt"), "x\n")],
            );
            fs::rename(&b, inbox.join(name)).unwrap();
        }
        let out = site
            .command(&["agent", "--once"], &[("RUST_LOG", "info")])
            .output();
        out.expect_code(0);
        assert!(
            out.stderr.contains("published a batch of"),
            "{}",
            out.stderr
        );
        let bundles: Vec<String> = hook_calls(&site)
            .iter()
            .map(|c| c["bundle"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(bundles, ["b1", "b2", "b3"], "{backend:?}");
        let result: Value = serde_json::from_str(
            &fs::read_to_string(
                site.t
                    .join("spool/reports/done/b2/.distributor-result.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(result["hooks"][0]["exit"], 0, "{result}");
    });
}

/// A hook that fails, hangs past its timeout, or leaves a child running
/// behind it never undoes or holds up the publication: the bundle is in
/// `done/`, the root holds it, the result says how the hook ended, and the
/// metrics count the failures.
#[test]
fn a_failing_hanging_or_forking_hook_leaves_the_publication_standing() {
    // (what the hook does after reading, its timeout, what the result says)
    let pidfile = "\"$(dirname \"$0\")/child.pid\"";
    let cases = [
        (
            "echo no such zone >&2; exit 3".to_owned(),
            "30s",
            Some("exited with status 3"),
        ),
        (
            "echo hanging; sleep 600".to_owned(),
            "1s",
            Some("still running after its timeout of 1s"),
        ),
        (
            format!("sleep 600 > /dev/null 2>&1 & echo $! > {pidfile}; echo forked"),
            "30s",
            None,
        ),
    ];
    for (then, timeout, error) in cases {
        let site = hooked_site(Backend::Local, "additive", &then, timeout);
        site.t.config(
            &fs::read_to_string(site.t.join("config.yaml"))
                .unwrap()
                .replace(
                    "spool: ./spool\n",
                    "spool: ./spool\nagent: {metrics_file: ./metrics.prom}\n",
                ),
        );
        let inbox = site.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        let b = site
            .t
            .bundle_at("b", "docs", "2026-06-01T00:00:00Z", &[("a.txt", "a\n")]);
        fs::rename(&b, inbox.join("b")).unwrap();
        let mut agent = site.command(&["agent", "--once"], &[]).start();
        let out = agent.finish(std::time::Duration::from_secs(120));
        out.expect_code(0);
        let result: Value = serde_json::from_str(
            &fs::read_to_string(site.t.join("spool/reports/done/b/.distributor-result.json"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(result["ok"], true, "{then}: {result}");
        assert_eq!(site.get("a.txt").as_deref(), Some(&b"a\n"[..]), "{then}");
        site.assert_consistent();
        let h = &result["hooks"][0];
        let metrics = fs::read_to_string(site.t.join("metrics.prom")).unwrap();
        match error {
            Some(want) => {
                assert!(
                    h["error"].as_str().unwrap_or_default().contains(want),
                    "{then}: {h}"
                );
                assert!(
                    out.stderr.contains("the publication stands"),
                    "{}",
                    out.stderr
                );
                assert!(
                    metrics.contains(
                        "distributor_hook_failures_total{pipeline=\"reports\",destination=\"web\"} 1\n"
                    ),
                    "{metrics}"
                );
            }
            None => {
                assert_eq!(h["exit"], 0, "{then}: {h}");
                assert_eq!(h["output"], "forked\n", "{h}");
                // The child it left behind still runs; the agent did not
                // wait for it. Tidy up.
                let pid: i32 = fs::read_to_string(site.t.join("child.pid"))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap();
                assert!(
                    Path::new(&format!("/proc/{pid}")).exists(),
                    "the child was not waited for"
                );
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if then.contains("exit 3") {
            assert_eq!(h["exit"], 3, "{h}");
            assert_eq!(h["output"], "no such zone\n", "{h}");
        }
        if timeout == "1s" {
            assert_eq!(h["exit"], Value::Null, "{h}");
            assert_eq!(h["output"], "hanging\n", "{h}");
        }
    }
}

/// `hooks.after_publish` that is not an absolute path to an executable is
/// a config error: exit 2 naming the line and the fix.
#[test]
fn a_hook_that_cannot_run_is_a_config_error() {
    let site = Site::new(Backend::Local, "additive");
    let config = fs::read_to_string(site.t.join("config.yaml")).unwrap();
    site.t.config(&format!(
        "{config}        hooks:\n          after_publish: [\"purge-cdn\"]\n"
    ));
    let out = site.run(&["config", "check"]);
    out.expect_code(2);
    assert!(
        out.stderr.contains("must start with an absolute path"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("command -v purge-cdn"),
        "{}",
        out.stderr
    );
}

/// A scope (docs/contract.md §17.1) on every backend: a bundle with an
/// output outside it fails at stage `verify` (exit 1, from `run` and from
/// the agent, which files it in `failed/` with the message), and no root
/// of the pipeline changes, not even that of a destination listed before
/// it whose scope would allow the bundle; a bundle inside the scope
/// publishes to both.
#[test]
fn an_output_outside_the_scope_fails_at_verify_and_no_root_changes() {
    let mirror = "      - id: mirror\n        path: ./mirror\n";
    let scope = "        scope: [\"reports/\", \"index.html\"]\n";
    each_backend(|backend| {
        let site = Site::after(backend, "replacement", mirror, scope);
        let roots = || (site.snapshot(), format!("{:#?}", site.t.tree("mirror")));
        let outside = site.t.bundle_at(
            "outside",
            "docs",
            "2026-06-02T00:00:00Z",
            &[
                ("reports/a.md", "# A\n"),
                ("secret/x.html", "<p>mine now</p>\n"),
            ],
        );
        let message = "output \"secret/x.html\" is outside destination web's scope [\"reports/\", \"index.html\"]";

        // Into empty roots: nothing is made, not even a root or a catalog.
        let out = site.publish(&outside);
        out.expect_code(1);
        let doc = out.json();
        assert_eq!(doc["ok"], false, "{doc}");
        assert_eq!(doc["stage"], "verify", "{doc}");
        let error = doc["error"].as_str().unwrap();
        assert!(error.contains(message), "{backend:?}: {error}");
        assert!(
            doc["destinations"][1]["error"]
                .as_str()
                .unwrap()
                .contains(message),
            "{doc}"
        );
        assert!(site.paths().is_empty(), "{backend:?}: {:?}", site.paths());
        assert!(!site.t.join("mirror").exists(), "{backend:?}: mirror made");
        if let Some(bucket) = &site.bucket {
            assert!(bucket.keys().is_empty(), "{:?}", bucket.keys());
        }

        // Inside the scope: both roots get it.
        let inside = site.t.bundle_at(
            "inside",
            "docs",
            "2026-06-01T00:00:00Z",
            &[("reports/a.md", "# A\n"), ("index.html", "<p>home</p>\n")],
        );
        site.publish(&inside).expect_code(0);
        let want = ["index.html", "reports/a.html", "reports/a.md"];
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, want, "{backend:?}");
        assert_eq!(
            site.t.tree("mirror").files(),
            ["index.html", "reports/a.md"]
        );
        site.assert_consistent();

        // Over roots that hold it, through the agent: the bundle is filed
        // in failed/ with the message, and neither root changed (files,
        // catalogs, reserved files, times).
        let before = roots();
        let inbox = site.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        fs::rename(&outside, inbox.join("outside")).unwrap();
        site.run(&["agent", "--once"]).expect_code(1);
        let result: Value = serde_json::from_slice(
            &fs::read(
                site.t
                    .join("spool/reports/failed/outside/.distributor-result.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(result["stage"], "verify", "{result}");
        assert!(
            result["error"].as_str().unwrap().contains(message),
            "{result}"
        );
        assert_eq!(roots(), before, "{backend:?}: a root changed");
        site.verify().expect_code(0);
    });
}

/// A scope is matched after the prefix, with the source id filled in: a
/// `prefix: "{source_id}/"` destination scoped to one source's folder
/// publishes that source and refuses another, on every backend.
#[test]
fn a_scope_applies_to_output_paths_after_the_prefix() {
    let extra = "        prefix: \"{source_id}/\"\n        scope: [\"docs.1/\"]\n";
    each_backend(|backend| {
        let site = Site::with(backend, "additive", extra);
        let own = site
            .t
            .bundle_at("own", "docs.1", "2026-06-01T00:00:00Z", &[("a.txt", "1\n")]);
        site.publish(&own).expect_code(0);
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["docs.1/a.txt"], "{backend:?}");

        let other = site.t.bundle_at(
            "other",
            "docs.2",
            "2026-06-01T00:00:00Z",
            &[("a.txt", "2\n")],
        );
        let out = site.publish(&other);
        out.expect_code(1);
        let error = out.json()["error"].as_str().unwrap().to_owned();
        assert!(
            error.contains(
                "output \"docs.2/a.txt\" is outside destination web's scope [\"docs.1/\"]"
            ) && error.contains("the prefix docs.2/"),
            "{backend:?}: {error}"
        );
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["docs.1/a.txt"], "{backend:?}");
        site.assert_consistent();
    });
}

/// A crash after a publication's commit: the version readers see of
/// `s/f.txt` in every root (the local root `first`, and `web` on the
/// backend), and what the hooks of both were told.
struct Versions {
    site: Site,
    /// The key each bundle is signed with, when the pipeline takes signed
    /// bundles only (with `refuse_older`, its default).
    key: Option<std::path::PathBuf>,
}

impl Versions {
    /// Pipeline `reports` publishing into `first` (a local root) and `web`
    /// (on `backend`), both additive, each with a hook that logs, with
    /// the document it read, the version of `s/f.txt` each root shows at
    /// that moment; a hook whose destination `kill_at` names kills its
    /// agent (SIGKILL) once. `b0` (version 0) is published.
    fn new(backend: Backend) -> Versions {
        Versions::with(backend, false)
    }

    /// [`Versions::new`], the pipeline taking only bundles signed with a
    /// key of its own (`refuse_older` on, as by default), when `signed`.
    fn with(backend: Backend, signed: bool) -> Versions {
        let site = Site::new(backend, "additive");
        let t = &site.t;
        let script = t.join("hook.sh");
        let web = match &site.bucket {
            None => format!("cat '{}'", t.join("site/s/f.txt").display()),
            Some(bucket) => format!(
                "curl -s '{}/{}/site/s/f.txt'",
                server().endpoint,
                bucket.location.bucket
            ),
        };
        crate::util::write_script(
            &script,
            &format!(
                "#!/bin/sh\ninput=$(cat)\nfirst=$(cat '{first}' 2>/dev/null)\nweb=$({web} 2>/dev/null)\nprintf '%s %s\\t%s\\n' \"$first\" \"$web\" \"$input\" >> '{log}'\nif [ -e '{kill}'-\"$1\" ]; then rm '{kill}'-\"$1\"; kill -9 $PPID; sleep 30; fi\n",
                first = t.join("first/s/f.txt").display(),
                log = t.join("hooks-seen.log").display(),
                kill = t.join("kill-at").display(),
            ),
        );
        let hooks = |id: &str| {
            format!(
                "        hooks:\n          after_publish: [\"{}\", \"{id}\"]\n",
                script.display()
            )
        };
        let config = fs::read_to_string(t.join("config.yaml")).unwrap();
        let config = config.replace(
            "    destinations:\n",
            &format!(
                "    destinations:\n      - id: first\n        path: ./first\n{}",
                hooks("first")
            ),
        );
        let mut config = format!("{config}{}", hooks("web"));
        let mut key = None;
        if signed {
            let k = crate::signatures::keygen(t, "producer", &["ed25519"], "");
            t.write("signers", format!("producer {}\n", k.public));
            config = config.replace(
                "    destinations:\n",
                "    signatures:\n      allowed_signers: signers\n    destinations:\n",
            );
            key = Some(k.private);
        }
        t.config(&config);
        let v = Versions { site, key };
        v.drop_version(0);
        v.site.run(&["agent", "--once"]).expect_code(0);
        // What b0's hooks saw is not the crash's.
        v.site.t.write("hooks-seen.log", "");
        v
    }

    /// The next hook of `destination` kills its agent.
    fn kill_at(&self, destination: &str) {
        self.site.t.write(&format!("kill-at-{destination}"), "");
    }

    /// Drops bundle `b<n>` of source `s`, created on day `n`, writing
    /// `s/f.txt` as `v<n>`, arriving `n` seconds after b0.
    fn drop_version(&self, n: u64) {
        let t = &self.site.t;
        let name = format!("b{n}");
        let created = format!("2026-06-{:02}T00:00:00Z", n + 1);
        let dir = t.bundle_at(&name, "s", &created, &[("s/f.txt", &format!("v{n}"))]);
        if let Some(key) = &self.key {
            crate::signatures::ssh_sign(key, &dir.join("manifest.json"), "distributor");
        }
        crate::util::arrive_in_order(&dir, n);
        let inbox = t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        fs::rename(&dir, inbox.join(&name)).unwrap();
    }

    /// The version each root shows now (`first`, `web`): n of `v<n>`.
    fn shown(&self) -> Shown {
        let first = fs::read(self.site.t.join("first/s/f.txt")).ok();
        (
            version(first.as_deref()),
            version(self.site.served("s/f.txt").as_deref()),
        )
    }

    /// Every hook call so far: the versions the roots showed, and the
    /// document the hook read (parsed: a hook always reads a whole one).
    fn calls(&self) -> Vec<(Shown, Value)> {
        fs::read_to_string(self.site.t.join("hooks-seen.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let (seen, input) = l.split_once('\t').expect("versions, then the document");
                let (first, web) = seen.split_once(' ').unwrap_or((seen, ""));
                let doc: Value = serde_json::from_str(input)
                    .unwrap_or_else(|e| panic!("a hook read a cut document ({e}): {input:?}"));
                let shown = (
                    version(Some(first.as_bytes())),
                    version(Some(web.as_bytes())),
                );
                (shown, doc)
            })
            .collect()
    }

    /// Runs `agent --once` while a thread reads what both roots show
    /// (every few milliseconds); returns its output and every change of
    /// what they showed, in order, from before it started to after it
    /// ended.
    fn agent_watched(&self, env: &[(&str, &str)]) -> (Output, Vec<Shown>) {
        let done = std::sync::atomic::AtomicBool::new(false);
        let seen = std::sync::Mutex::new(vec![self.shown()]);
        let out = std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    let now = self.shown();
                    let mut seen = seen.lock().unwrap();
                    if seen.last() != Some(&now) {
                        seen.push(now);
                    }
                    drop(seen);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            });
            let mut env = env.to_vec();
            env.push(("RUST_LOG", "info"));
            let out = self.site.command(&["agent", "--once"], &env).output();
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            out
        });
        let mut seen = seen.into_inner().unwrap();
        seen.push(self.shown());
        (out, seen)
    }

    /// The bundles in spool folder `folder` (the agent's own files aside).
    fn bundles(&self, folder: &str) -> Vec<String> {
        crate::util::bundle_names(&self.site.t.join(&format!("spool/reports/{folder}")))
            .into_iter()
            .collect()
    }

    fn result(&self, name: &str) -> Value {
        crate::util::read_json(&self.site.t.join(&format!(
            "spool/reports/done/{name}/.distributor-result.json"
        )))
    }
}

/// The versions of `s/f.txt` the roots `first` and `web` show.
type Shown = (Option<u64>, Option<u64>);

/// n of the text `v<n>`.
fn version(bytes: Option<&[u8]>) -> Option<u64> {
    std::str::from_utf8(bytes?)
        .ok()?
        .trim()
        .strip_prefix('v')?
        .parse()
        .ok()
}

/// No root ever shows an older version than it showed before, in
/// `shown` (in the order seen).
#[track_caller]
fn assert_never_older(shown: &[Shown], what: &str) {
    for (root, name) in ["first", "web"].iter().enumerate() {
        let versions: Vec<u64> = shown
            .iter()
            .filter_map(|(first, web)| if root == 0 { *first } else { *web })
            .collect();
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{what}: root {name} went back to an older version: {versions:?}"
        );
    }
}

/// Per destination, the bundles whose hook ran, in order.
fn hooked(calls: &[(Shown, Value)], destination: &str) -> Vec<String> {
    calls
        .iter()
        .filter(|(_, doc)| doc["destination_id"] == destination)
        .map(|(_, doc)| doc["bundle"].as_str().unwrap().to_owned())
        .collect()
}

/// Everything a run and a restart showed, in order: what the watcher saw
/// during the run, then what the hooks saw (during the run and the
/// restart, in their order), then what the watcher saw during the restart.
/// Each is checked on its own too: together they only add the order
/// across the crash.
#[track_caller]
fn assert_never_rolled_back(
    crashed: &[Shown],
    calls: &[(Shown, Value)],
    restarted: &[Shown],
    what: &str,
) {
    let hooks: Vec<Shown> = calls.iter().map(|(s, _)| *s).collect();
    assert_never_older(crashed, &format!("{what}, while it ran"));
    assert_never_older(&hooks, &format!("{what}, as its hooks saw it"));
    assert_never_older(restarted, &format!("{what}, after the restart"));
    let all: Vec<Shown> = crashed.iter().chain(restarted).copied().collect();
    assert_never_older(&all, what);
}

/// A batch of two versions of one source (b1 older, b2 newer) is
/// committed, and the first hook kills its agent (SIGKILL) before any
/// bundle is filed. The next start never shows readers b1's version again
/// (it used to publish the two one by one, b1 over b2), files both, and
/// runs every hook the crash left owed, each with its whole document; on
/// every backend.
#[test]
fn a_batch_whose_agent_dies_after_its_commit_never_rolls_readers_back() {
    each_backend(|backend| {
        let v = Versions::new(backend);
        v.drop_version(1);
        v.drop_version(2);
        v.kill_at("first");
        let (crashed, during) = v.agent_watched(&[]);
        assert_eq!(
            crashed.code, -9,
            "{backend:?}: the hook killed its agent\n{}",
            crashed.stderr
        );
        assert_eq!(
            v.shown(),
            (Some(2), Some(2)),
            "{backend:?}: the batch was committed"
        );
        assert_eq!(v.bundles("work"), ["b1", "b2"], "{backend:?}");

        let (restarted, after) = v.agent_watched(&[]);
        restarted.expect_code(0);
        let calls = v.calls();
        assert_never_rolled_back(&during, &calls, &after, &format!("{backend:?}"));
        assert!(
            !restarted.stderr.contains("bundle=b1 done"),
            "{backend:?}: b1 was published again:\n{}",
            restarted.stderr
        );
        assert_eq!(v.shown(), (Some(2), Some(2)));
        assert_eq!(v.bundles("done"), ["b0", "b1", "b2"]);
        assert!(v.bundles("work").is_empty(), "{backend:?}");
        // Every hook owed ran, at least once: first's for b1 twice (it
        // died in the first), web's for b1 and b2 after the restart.
        assert_eq!(hooked(&calls, "first"), ["b1", "b1", "b2"], "{backend:?}");
        assert_eq!(hooked(&calls, "web"), ["b1", "b2"], "{backend:?}");
        for name in ["b1", "b2"] {
            let hooks = &v.result(name)["hooks"];
            let ran: Vec<&str> = hooks
                .as_array()
                .unwrap_or_else(|| panic!("{name}: no hooks in its result"))
                .iter()
                .map(|h| h["destination_id"].as_str().unwrap())
                .collect();
            assert_eq!(ran, ["first", "web"], "{backend:?} {name}");
        }
        for (_, doc) in &calls {
            assert_eq!(doc["writes"], serde_json::json!(["s/f.txt"]), "{doc}");
        }
        site_consistent(&v);
    });
}

/// A single bundle into two destinations: the first's hook kills the
/// agent after both catalogs are durable. The next start runs the hook
/// the second was owed (it used to find both `skip_same` and run none),
/// and the result in done/ records it; on every backend.
#[test]
fn a_hook_owed_when_the_agent_died_runs_at_the_next_start() {
    each_backend(|backend| {
        let v = Versions::new(backend);
        v.drop_version(1);
        v.kill_at("first");
        let (crashed, _) = v.agent_watched(&[]);
        assert_eq!(crashed.code, -9, "{}", crashed.stderr);
        assert_eq!(hooked(&v.calls(), "web"), Vec::<String>::new());
        let (restarted, _) = v.agent_watched(&[]);
        restarted.expect_code(0);
        assert!(
            restarted
                .stderr
                .contains("stopped before running 2 hook(s) it owed"),
            "{backend:?}: the start says what it runs:\n{}",
            restarted.stderr
        );
        let calls = v.calls();
        assert_eq!(hooked(&calls, "first"), ["b1", "b1"], "{backend:?}");
        assert_eq!(hooked(&calls, "web"), ["b1"], "{backend:?}");
        let (seen, doc) = calls.last().unwrap();
        assert_eq!(*seen, (Some(1), Some(1)));
        assert_eq!(doc["action"], "upsert_additive", "{doc}");
        assert_eq!(doc["source"]["id"], "s", "{doc}");
        let result = v.result("b1");
        assert_eq!(result["ok"], true);
        assert_eq!(result["hooks"][1]["destination_id"], "web", "{result}");
        assert_eq!(result["hooks"][1]["exit"], 0, "{result}");
        assert!(v.bundles("work").is_empty());
        site_consistent(&v);
    });
}

/// A batch of three versions of one source, crashed (abort, no cleanup)
/// at every point between its commit and its filing, then restarted:
/// neither root ever shows an older version than it showed (checked
/// while the crashed run goes, at each hook, and through the restart),
/// every bundle ends in done/, and each destination's hook ran for each
/// bundle at least once, with its whole document; on every backend.
#[test]
fn a_crash_anywhere_between_commit_and_filing_never_rolls_readers_back() {
    each_backend(|backend| {
        for point in [
            "agent.committing",
            "publish.committed:1",
            "publish.committed:2",
            "agent.committed",
            "agent.recorded",
            "spool.after_result:1",
            "spool.after_move:1",
            "spool.after_result:3",
            "spool.after_move:3",
        ] {
            let what = format!("{backend:?} {point}");
            let v = Versions::new(backend);
            for n in 1..=3 {
                v.drop_version(n);
            }
            let (crashed, during) = v.agent_watched(&[("DISTRIBUTOR_FAILPOINT", point)]);
            assert!(
                crashed.stderr.contains(&format!(
                    "failpoint {} reached",
                    point.split(':').next().unwrap()
                )),
                "{what}: not reached\n{}",
                crashed.stderr
            );
            let (first, web) = v.shown();
            for shown in [first, web] {
                assert!(
                    matches!(shown, Some(0 | 3)),
                    "{what}: a root shows {shown:?} after the crash (neither before nor after the batch)"
                );
            }
            let (restarted, after) = v.agent_watched(&[]);
            restarted.expect_code(0);
            let calls = v.calls();
            assert_never_rolled_back(&during, &calls, &after, &what);
            assert_eq!(v.shown(), (Some(3), Some(3)), "{what}");
            assert_eq!(v.bundles("done"), ["b0", "b1", "b2", "b3"], "{what}");
            assert!(
                v.bundles("work").is_empty(),
                "{what}: {:?}",
                v.bundles("work")
            );
            for destination in ["first", "web"] {
                let mut ran = hooked(&calls, destination);
                ran.dedup();
                assert_eq!(ran, ["b1", "b2", "b3"], "{what}: {destination}'s hooks");
            }
            site_consistent(&v);
        }
    });
}

/// A bundle the last agent published, recorded and was killed while
/// writing its result into is filed by the next start without the
/// temporary file that write left inside it (a SIGKILL loop found
/// `done/<bundle>/.distributor-tmp-*`: the record's bundles were filed
/// without the sweep a resumed bundle gets).
#[test]
fn a_recorded_bundle_is_filed_without_the_temporary_file_of_a_killed_write() {
    let v = Versions::new(Backend::Local);
    v.drop_version(1);
    let (crashed, _) = v.agent_watched(&[("DISTRIBUTOR_FAILPOINT", "agent.recorded")]);
    assert!(
        crashed.stderr.contains("failpoint agent.recorded reached"),
        "{}",
        crashed.stderr
    );
    assert_eq!(v.bundles("work"), ["b1"]);
    // What a kill between the temporary file's write and its rename leaves.
    let stale = v
        .site
        .t
        .join("spool/reports/work/b1/.distributor-tmp-4242-1");
    std::fs::write(&stale, "{\"cut short").unwrap();
    let (restarted, _) = v.agent_watched(&[]);
    restarted.expect_code(0);
    assert_eq!(v.bundles("done"), ["b0", "b1"]);
    let filed = v.site.t.join("spool/reports/done/b1");
    assert_eq!(
        crate::util::sorted_names(&filed)
            .into_iter()
            .filter(|n| n.starts_with(".distributor-tmp-"))
            .collect::<Vec<_>>(),
        Vec::<String>::new()
    );
    assert_eq!(v.result("b1")["ok"], true);
}

/// A signed pipeline refuses a bundle older than what it would overwrite
/// (`refuse_older`). A batch of three versions crashed after its commit
/// reached one root is published again as a batch: its older bundles
/// meet the newest one's records there, which the batch itself puts back
/// on top, so they are not refused (they used to fail with fail_conflict,
/// and the other root never got them); on every backend.
#[test]
fn a_signed_batch_published_again_after_a_partial_commit_is_not_refused_as_a_replay() {
    each_backend(|backend| {
        let v = Versions::with(backend, true);
        for n in 1..=3 {
            v.drop_version(n);
        }
        let (crashed, _) = v.agent_watched(&[("DISTRIBUTOR_FAILPOINT", "publish.committed:1")]);
        assert!(
            crashed
                .stderr
                .contains("failpoint publish.committed reached"),
            "{}",
            crashed.stderr
        );
        let (restarted, after) = v.agent_watched(&[]);
        restarted.expect_code(0);
        assert_never_older(&after, &format!("{backend:?}"));
        assert_eq!(v.shown(), (Some(3), Some(3)), "{backend:?}");
        assert_eq!(v.bundles("done"), ["b0", "b1", "b2", "b3"], "{backend:?}");
        assert!(
            v.bundles("failed").is_empty(),
            "{backend:?}: {}",
            restarted.stderr
        );
        // `spool show` says who signed it and how its hooks ended.
        let shown = v.site.run(&["spool", "show", "reports", "b3"]);
        shown.expect_code(0);
        for line in [
            "  signer: producer (key SHA256:",
            "  hook of first: exited 0 in ",
            "  hook of web: exited 0 in ",
        ] {
            assert!(
                shown.stdout.contains(line),
                "{line} missing:\n{}",
                shown.stdout
            );
        }
        // A replay of an older bundle alone is still refused.
        let t = &v.site.t;
        let again = t.bundle_at("again", "s", "2026-06-02T00:00:00Z", &[("s/f.txt", "v1")]);
        crate::signatures::ssh_sign(
            v.key.as_ref().unwrap(),
            &again.join("manifest.json"),
            "distributor",
        );
        fs::rename(&again, t.join("spool/reports/inbox/again")).unwrap();
        v.site.run(&["agent", "--once"]).expect_code(1);
        assert_eq!(v.bundles("failed"), ["again"], "{backend:?}");
        assert_eq!(v.shown(), (Some(3), Some(3)));
        site_consistent(&v);
    });
}

/// Both roots' catalogs match what they hold, and the spool keeps no
/// record of a commit any more.
#[track_caller]
fn site_consistent(v: &Versions) {
    let record = v
        .site
        .t
        .join("spool/reports/work/.distributor-unfiled.json");
    assert!(
        !record.exists(),
        "{}",
        fs::read_to_string(&record).unwrap_or_default()
    );
    v.site.assert_consistent();
    crate::util::assert_catalog_matches_disk(&v.site.t.join("first"));
}

// ---------------------------------------------------------------------------
// One publication: what `run` does to a root, on every backend
// ---------------------------------------------------------------------------

/// A first publication puts every output (the rendered page too) at its
/// path with its bytes, and records each with its owner, source, hash,
/// size and URL; the `--json` document says what it did; the catalog is
/// v4, pretty JSON with a final newline.
#[test]
fn publish_new_puts_every_output_at_its_path_and_records_it() {
    let links = "        links:\n          base_url: https://example.com/archive\n";
    each_backend(|backend| {
        let site = Site::with(backend, "additive", links);
        let b = site.t.bundle(
            "rep.1",
            &[("report.md", "# Report\n"), ("data/a b.csv", "x,y\n1,2\n")],
        );
        let out = site.publish(&b);
        out.expect_code(0);
        let doc = out.json();
        assert_eq!(doc["ok"], true, "{doc}");
        assert_eq!(doc["stage"], Value::Null, "{doc}");
        assert_eq!(doc["error"], Value::Null, "{doc}");
        let d = out.dest();
        assert_eq!(d["action"], "publish_new", "{backend:?}: {d}");
        if let Some(bucket) = &site.bucket {
            assert_eq!(d["root"], format!("s3://{}/site", bucket.location.bucket));
        }
        let all = ["data/a b.csv", "report.html", "report.md"];
        assert_eq!(strings(&d["writes"]), all, "{backend:?}");
        assert_eq!(strings(&d["deletes"]), Vec::<String>::new());
        assert_eq!(strings(&d["unmanaged"]), Vec::<String>::new());
        assert_eq!(site.get("report.md").as_deref(), Some(&b"# Report\n"[..]));
        assert_eq!(
            site.get("data/a b.csv").as_deref(),
            Some(&b"x,y\n1,2\n"[..])
        );
        let html = String::from_utf8(site.get("report.html").unwrap()).unwrap();
        assert!(html.contains("<h1"), "{backend:?}: {html}");
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, all, "{backend:?}: nothing but the outputs");

        let manifest = crate::util::read_json(&b.join("manifest.json"));
        let catalog = site.get(".distributor.json").expect("a catalog");
        assert!(catalog.ends_with(b"}\n"), "{backend:?}: pretty JSON");
        let state: Value = serde_json::from_slice(&catalog).unwrap();
        assert_eq!(state["schema_version"], 4);
        assert_eq!(state["state"]["mode"], "catalog");
        let recs = site.recorded();
        assert_eq!(recs.keys().collect::<Vec<_>>(), all, "{backend:?}");
        let r = &recs["report.md"];
        assert_eq!(r["pipeline_id"], "reports");
        assert_eq!(r["destination_id"], "web");
        assert_eq!(r["kind"], "source");
        assert_eq!(r["source"]["id"], "rep.1");
        assert_eq!(r["source"]["digest"], manifest["digest"]);
        assert_eq!(r["source"]["created"], crate::util::CREATED);
        assert_eq!(r["sha256"], crate::util::sha256(b"# Report\n"));
        assert_eq!(r["size"], 9);
        assert_eq!(r["url"], "https://example.com/archive/report.md");
        assert!(r.get("source_path").is_none() && r.get("transform").is_none());
        assert_eq!(recs["report.html"]["kind"], "generated");
        assert_eq!(
            recs["data/a b.csv"]["url"],
            "https://example.com/archive/data/a%20b.csv"
        );
        site.assert_consistent();
    });
}

/// The same bundle again is `skip_same` and touches nothing, the catalog
/// included (mtimes and inodes, or ETags). A changed version writes only
/// what changed: an output with the same bytes is left as it is, while
/// its record moves to the new source; a rewritten output keeps its
/// `created_at` and moves its `updated_at`. A bundle of another source
/// adds its paths and leaves the earlier records as they were.
#[test]
fn a_rerun_is_skip_same_and_a_changed_bundle_writes_only_what_changed() {
    each_backend(|backend| {
        for workflow in ["additive", "replacement"] {
            let site = Site::new(backend, workflow);
            let v1 = site.t.bundle_at(
                "v1",
                "rep",
                "2026-01-01T00:00:00Z",
                &[("a.txt", "same\n"), ("sub/b.txt", "old\n")],
            );
            site.publish(&v1).expect_code(0);
            let before = site.snapshot();
            let again = site.publish(&v1);
            again.expect_code(0);
            let d = again.dest();
            assert_eq!(d["action"], "skip_same", "{backend:?} {workflow}");
            assert_eq!(strings(&d["writes"]), Vec::<String>::new());
            assert_eq!(strings(&d["deletes"]), Vec::<String>::new());
            assert_eq!(
                site.snapshot(),
                before,
                "{backend:?} {workflow}: skip_same touched the root"
            );
        }

        let site = Site::new(backend, "additive");
        let v1 = site.t.bundle_at(
            "v1",
            "rep",
            "2026-01-01T00:00:00Z",
            &[("a.txt", "same\n"), ("sub/b.txt", "old\n")],
        );
        site.publish(&v1).expect_code(0);
        let kept = site.identity("a.txt");
        let first = site.recorded();
        wait_past(
            instant_of(&first["sub/b.txt"]["updated_at"]),
            std::time::Duration::from_millis(1),
        );
        let v2 = site.t.bundle_at(
            "v2",
            "rep",
            "2026-01-02T00:00:00Z",
            &[("a.txt", "same\n"), ("sub/b.txt", "new, longer\n")],
        );
        let out = site.publish(&v2);
        out.expect_code(0);
        assert_eq!(out.dest()["action"], "upsert_additive", "{backend:?}");
        assert_eq!(
            site.get("sub/b.txt").as_deref(),
            Some(&b"new, longer\n"[..])
        );
        assert_eq!(
            site.identity("a.txt"),
            kept,
            "{backend:?}: an unchanged output was written again"
        );
        let recs = site.recorded();
        assert_eq!(recs["a.txt"]["source"]["created"], "2026-01-02T00:00:00Z");
        let b = &recs["sub/b.txt"];
        assert_eq!(b["created_at"], first["sub/b.txt"]["created_at"]);
        assert_ne!(b["updated_at"], first["sub/b.txt"]["updated_at"]);
        assert_eq!(b["size"], 12);

        let other = site.t.bundle("other", &[("c.txt", "two")]);
        let out = site.publish(&other);
        out.expect_code(0);
        assert_eq!(out.dest()["action"], "upsert_additive");
        assert_eq!(strings(&out.dest()["writes"]), ["c.txt"], "{backend:?}");
        let now = site.recorded();
        assert_eq!(now["a.txt"], recs["a.txt"], "{backend:?}: record kept");
        assert_eq!(now["sub/b.txt"], recs["sub/b.txt"]);
        assert_eq!(now["c.txt"]["source"]["id"], "other");
        site.assert_consistent();
    });
}

/// Replacement deletes the outputs its owner no longer publishes (and a
/// local root's emptied folders), and nothing else: another pipeline's
/// outputs and a file someone else put there stay.
#[test]
fn replacement_deletes_what_the_owner_no_longer_publishes_and_nothing_else() {
    each_backend(|backend| {
        let site = Site::new(backend, "replacement");
        site.add_pipeline("other", "additive");
        let theirs = site.t.bundle("other.1", &[("theirs/keep.txt", "not ours")]);
        site.publish_with("other", &theirs, &[]).expect_code(0);
        let v1 = site.t.bundle_at(
            "v1",
            "rep",
            "2026-01-01T00:00:00Z",
            &[("a.txt", "a1"), ("deep/er/b.txt", "b1")],
        );
        site.publish(&v1).expect_code(0);
        site.change_behind_the_back("stray.txt", b"not ours either\n");
        let v2 = site
            .t
            .bundle_at("v2", "rep", "2026-01-02T00:00:00Z", &[("a.txt", "a2")]);
        let out = site.publish(&v2);
        out.expect_code(0);
        let d = out.dest();
        assert_eq!(d["action"], "replace_catalog", "{backend:?}: {d}");
        assert_eq!(strings(&d["writes"]), ["a.txt"]);
        assert_eq!(strings(&d["deletes"]), ["deep/er/b.txt"], "{backend:?}");
        if backend == Backend::Local {
            assert!(!site.t.join("site/deep").exists(), "emptied folders go");
            assert!(site.t.join("site").is_dir(), "the root itself stays");
        }
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(
            paths,
            ["a.txt", "stray.txt", "theirs/keep.txt"],
            "{backend:?}"
        );
        assert_eq!(site.get("a.txt").as_deref(), Some(&b"a2"[..]));
        assert_eq!(
            site.get("theirs/keep.txt").as_deref(),
            Some(&b"not ours"[..])
        );
        assert_eq!(
            site.get("stray.txt").as_deref(),
            Some(&b"not ours either\n"[..])
        );
        let recs = site.recorded();
        assert_eq!(
            recs.keys().collect::<Vec<_>>(),
            ["a.txt", "theirs/keep.txt"]
        );
        assert_eq!(recs["theirs/keep.txt"]["pipeline_id"], "other");
        site.assert_consistent_but(&["stray.txt"]);
    });
}

/// Files the catalog does not record are never overwritten: a root
/// without a catalog that holds anything (for a local root, an empty
/// folder too) refuses the publication (`fail_unmanaged`, exit 3, stage
/// plan) listing them, and no catalog is made; a stray file at a planned
/// path of a catalogued root refuses it too, and the catalog is left as
/// it was.
#[test]
fn unrecorded_outputs_are_never_overwritten() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        site.change_behind_the_back("stray.txt", b"someone else's");
        let mut unmanaged = vec!["stray.txt"];
        if backend == Backend::Local {
            site.t.mkdir("site/empty-folder");
            unmanaged.insert(0, "empty-folder");
        }
        let b = site.t.bundle("rep.1", &[("a.txt", "a")]);
        let before = site.outputs_snapshot();
        let out = site.publish(&b);
        out.expect_code(3);
        let doc = out.json();
        assert_eq!(doc["ok"], false, "{doc}");
        assert_eq!(doc["stage"], "plan", "{doc}");
        assert!(doc["error"].is_string(), "{doc}");
        let d = out.dest();
        assert_eq!(d["action"], "fail_unmanaged", "{backend:?}: {d}");
        assert_eq!(strings(&d["unmanaged"]), unmanaged, "{backend:?}");
        assert!(
            unmanaged
                .iter()
                .any(|p| d["error"].as_str().unwrap().contains(p)),
            "{d}"
        );
        assert_eq!(strings(&d["writes"]), Vec::<String>::new());
        assert!(site.get(".distributor.json").is_none(), "{backend:?}");
        assert_eq!(
            site.outputs_snapshot(),
            before,
            "{backend:?}: the root changed"
        );
        if backend == Backend::Local {
            assert!(site.t.join("site/empty-folder").is_dir());
        }

        let site = Site::new(backend, "additive");
        let b1 = site.t.bundle("v1", &[("a.txt", "a\n")]);
        site.publish(&b1).expect_code(0);
        site.change_behind_the_back("b.txt", b"theirs\n");
        let catalog = site.get(".distributor.json");
        let b2 = site
            .t
            .bundle("v2", &[("a.txt", "a\n"), ("b.txt", "ours\n")]);
        let out = site.publish(&b2);
        out.expect_code(3);
        assert_eq!(out.json()["stage"], "plan");
        assert_eq!(out.dest()["action"], "fail_unmanaged", "{backend:?}");
        assert_eq!(strings(&out.dest()["unmanaged"]), ["b.txt"]);
        assert_eq!(site.get("b.txt").as_deref(), Some(&b"theirs\n"[..]));
        assert_eq!(site.get(".distributor.json"), catalog, "{backend:?}");
        assert_eq!(site.recorded().keys().collect::<Vec<_>>(), ["a.txt"]);
        site.assert_consistent_but(&["b.txt"]);
    });
}

/// A catalog that is not JSON, of a future or an unknown version, or not
/// a valid v4 document, is a conflict (`fail_conflict`, exit 3, stage
/// plan): the catalog is left byte for byte and nothing is written.
#[test]
fn a_bad_or_future_catalog_is_a_conflict_and_left_alone() {
    let cases: [(&str, &[u8]); 4] = [
        ("garbage", b"this is not json {"),
        ("future", br#"{"schema_version": 5, "outputs": []}"#),
        ("zero", br#"{"schema_version": 0}"#),
        ("invalid v4", br#"{"schema_version": 4, "outputs": "nope"}"#),
    ];
    each_backend(|backend| {
        for (name, bytes) in cases {
            let site = Site::new(backend, "additive");
            site.change_behind_the_back(".distributor.json", bytes);
            let b = site.t.bundle("rep.1", &[("a.txt", "a")]);
            let out = site.publish(&b);
            out.expect_code(3);
            assert_eq!(out.json()["stage"], "plan", "{backend:?} {name}");
            assert_eq!(out.dest()["action"], "fail_conflict", "{backend:?} {name}");
            assert_eq!(
                site.get(".distributor.json").as_deref(),
                Some(bytes),
                "{backend:?} {name}"
            );
            assert!(site.paths().is_empty(), "{backend:?} {name}");
        }
    });
}

/// A dry run exits as the real run would (0, 3 for a refusal, 1 for an
/// invalid bundle), reports the plan, and changes nothing: into an empty
/// root it makes nothing at all, and a root that exists is left as it was
/// (mtimes and inodes, or ETags).
#[test]
fn a_dry_run_exits_like_the_real_run_and_changes_nothing() {
    each_backend(|backend| {
        let site = Site::new(backend, "replacement");
        let b1 = site
            .t
            .bundle("rep.1", &[("a.txt", "a"), ("sub/b.txt", "b")]);
        let out = site.publish_with("reports", &b1, &["--dry-run"]);
        out.expect_code(0);
        assert_eq!(out.dest()["action"], "publish_new", "{backend:?}");
        assert_eq!(strings(&out.dest()["writes"]), ["a.txt", "sub/b.txt"]);
        match &site.bucket {
            None => assert!(!site.t.join("site").exists(), "a root was made"),
            Some(bucket) => assert!(bucket.keys().is_empty(), "{:?}", bucket.keys()),
        }

        site.publish(&b1).expect_code(0);
        // Would succeed: 0, with the plan reported and nothing done.
        let b2 = site.t.bundle("rep.2", &[("a.txt", "changed")]);
        let before = site.snapshot();
        let out = site.publish_with("reports", &b2, &["--dry-run"]);
        out.expect_code(0);
        assert_eq!(out.json()["dry_run"], true);
        assert_eq!(out.dest()["action"], "replace_catalog", "{backend:?}");
        assert_eq!(strings(&out.dest()["deletes"]), ["sub/b.txt"]);
        assert_eq!(site.snapshot(), before, "{backend:?}: a dry run wrote");

        // Would be refused: 3.
        site.change_behind_the_back("stray.txt", b"x");
        let before = site.snapshot();
        let b3 = site.t.bundle("rep.3", &[("stray.txt", "y")]);
        let out = site.publish_with("reports", &b3, &["--dry-run"]);
        out.expect_code(3);
        assert_eq!(out.dest()["action"], "fail_unmanaged", "{backend:?}");
        assert_eq!(site.snapshot(), before, "{backend:?}");

        // Invalid bundle: 1.
        fs::write(b2.join("a.txt"), "tampered").unwrap();
        let out = site.publish_with("reports", &b2, &["--dry-run"]);
        out.expect_code(1);
        assert_eq!(out.json()["stage"], "verify");
        assert_eq!(site.snapshot(), before, "{backend:?}");
    });
}

/// Bytes that differ from the manifest (same size: only hashing can tell)
/// are never published. Into empty roots nothing is made (no output, no
/// catalog, no pending intent); into catalogued roots (the one on the
/// backend, and a local mirror listed before it), copies are hashed while
/// they stream, and a mismatch fails the bundle at stage verify and leaves
/// every entry of both roots as it was, no temporary file included.
#[test]
fn bytes_that_differ_from_the_manifest_are_never_published() {
    each_backend(|backend| {
        for workflow in ["additive", "replacement"] {
            let what = format!("{backend:?} {workflow}");
            let mirror = format!(
                "      - id: mirror\n        path: ./mirror\n        workflow: {workflow}\n"
            );
            let site = Site::after(backend, workflow, &mirror, "");
            let mirror = || {
                let mut tree = site.t.tree("mirror");
                tree.0.remove("");
                tree
            };
            let zero = site.t.bundle_at(
                "zero",
                "zero",
                "2026-05-01T00:00:00Z",
                &[("a.txt", "good\n"), ("b.txt", "fine\n")],
            );
            fs::write(zero.join("b.txt"), "evil\n").unwrap();
            let out = site.publish(&zero);
            out.expect_code(1);
            assert_eq!(out.json()["stage"], "verify", "{what}");
            let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
            assert!(error.contains("b.txt"), "{what}: {error}");
            assert!(site.paths().is_empty(), "{what}: {:?}", site.paths());
            assert!(site.get(".distributor.json").is_none(), "{what}");
            site.assert_nothing_pending();
            assert!(mirror().files().is_empty(), "{what}: {:?}", mirror());

            let first = site.t.bundle_at(
                "one",
                "one",
                "2026-06-01T00:00:00Z",
                &[("a.txt", "first\n")],
            );
            site.publish(&first).expect_code(0);
            let second = site.t.bundle_at(
                "two",
                "two",
                "2026-06-02T00:00:00Z",
                &[("a.txt", "second\n"), ("b.md", "# B\n"), ("c.bin", "cccc")],
            );
            fs::write(second.join("c.bin"), "CCCC").unwrap();
            let (web, mirrored) = (site.snapshot(), mirror());
            let out = site.publish(&second);
            out.expect_code(1);
            assert_eq!(out.json()["stage"], "verify", "{what}");
            let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
            assert!(error.contains("c.bin"), "{what}: {error}");
            assert_eq!(site.snapshot(), web, "{what}: web changed");
            assert_eq!(mirror(), mirrored, "{what}: mirror changed");
            site.assert_consistent();
            crate::util::assert_catalog_matches_disk(&site.t.join("mirror"));
        }
    });
}

/// Broken or malicious bundles (from `bundle_cmd::hostile_bundles`) fail
/// at stage verify naming the culprit, for a run and a dry run alike, and
/// no root is even made; nothing outside the bundles changes.
#[test]
fn bad_bundles_fail_verification_and_touch_no_root() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let cases = crate::bundle_cmd::hostile_bundles(&site.t);
        let before = site.t.tree("");
        for (what, dir, name) in cases {
            let out = site.publish(&dir);
            assert_eq!(out.code, 1, "{backend:?} {what}: {}", out.all());
            let doc = out.json();
            assert_eq!(doc["ok"], false, "{what}");
            assert_eq!(doc["stage"], "verify", "{backend:?} {what}");
            assert!(
                doc["error"].as_str().unwrap().contains(&name),
                "{what}: error names {name}: {doc}"
            );
            match &site.bucket {
                None => assert!(!site.t.join("site").exists(), "{what}: a root was made"),
                Some(bucket) => assert!(bucket.keys().is_empty(), "{what}: {:?}", bucket.keys()),
            }
            let out = site.publish_with("reports", &dir, &["--dry-run"]);
            assert_eq!(out.code, 1, "{backend:?} {what} (dry run)");
        }
        let after = site.t.tree("");
        for (path, node) in &before.0 {
            if path.starts_with("bundles") || path.is_empty() {
                continue;
            }
            assert_eq!(
                after.0.get(path),
                Some(node),
                "{backend:?}: {path} outside the bundles changed"
            );
        }
    });
}

/// Plans are all made before any write: when one destination of the
/// pipeline refuses the bundle (a stray file at a planned path of `web`),
/// the destination listed before it, which accepted it, gets nothing
/// either, not even a catalog (exit 3, stage plan).
#[test]
fn one_refused_destination_stops_every_destination() {
    each_backend(|backend| {
        let site = Site::after(
            backend,
            "additive",
            "      - id: a\n        path: ./a-root\n",
            "",
        );
        site.change_behind_the_back("x.txt", b"stray");
        let b = site.t.bundle("rep.1", &[("x.txt", "x")]);
        let out = site.publish(&b);
        out.expect_code(3);
        let doc = out.json();
        assert_eq!(doc["stage"], "plan", "{doc}");
        let actions: Vec<&str> = doc["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["action"].as_str().unwrap_or("null"))
            .collect();
        assert_eq!(actions, ["publish_new", "fail_unmanaged"], "{backend:?}");
        let written: Vec<String> = site
            .t
            .listing("a-root")
            .into_iter()
            .filter(|p| !p.is_empty() && !is_reserved(p))
            .collect();
        assert_eq!(written, Vec::<String>::new(), "{backend:?}: a-root written");
        assert!(!site.t.join("a-root/.distributor.json").exists());
        assert_eq!(site.get("x.txt").as_deref(), Some(&b"stray"[..]));
        assert!(site.get(".distributor.json").is_none(), "{backend:?}");
    });
}

/// A destination's `prefix` places the outputs under a folder made from
/// the source id, the pipeline id, and the date of `created` in UTC (23:30
/// at UTC-2 is the next day); `created` is reported in UTC.
#[test]
fn prefix_templates_place_outputs_in_folders() {
    let cases = [
        ("{source_id}/", "rep.2026-06-04/a.txt"),
        ("{pipeline_id}/{date}", "reports/2026-06-05/a.txt"),
        ("{yyyy}/{mm}/{dd}/", "2026/06/05/a.txt"),
    ];
    each_backend(|backend| {
        for (prefix, path) in cases {
            let site = Site::with(
                backend,
                "additive",
                &format!("        prefix: \"{prefix}\"\n"),
            );
            let b = site.t.bundle_at(
                "rep",
                "rep.2026-06-04",
                "2026-06-04T23:30:00-02:00",
                &[("a.txt", "a")],
            );
            let out = site.publish(&b);
            out.expect_code(0);
            assert_eq!(
                strings(&out.dest()["writes"]),
                [path],
                "{backend:?} {prefix}"
            );
            assert_eq!(site.get(path).as_deref(), Some(&b"a"[..]), "{backend:?}");
            assert_eq!(
                out.json()["source"]["created"],
                "2026-06-05T01:30:00Z",
                "created is normalised to UTC"
            );
            site.assert_consistent();
        }
    });
}

/// Replacement with a `{source_id}/` prefix swaps whole folders: the next
/// source deletes everything below the previous source's folder.
#[test]
fn replacement_with_a_source_id_prefix_swaps_whole_folders() {
    each_backend(|backend| {
        let site = Site::with(backend, "replacement", "        prefix: \"{source_id}/\"\n");
        let b1 = site
            .t
            .bundle("day.1", &[("index.md", "1"), ("img/a.png", "a")]);
        let b2 = site.t.bundle("day.2", &[("index.md", "2")]);
        site.publish(&b1).expect_code(0);
        let out = site.publish(&b2);
        out.expect_code(0);
        assert_eq!(
            strings(&out.dest()["deletes"]),
            ["day.1/img/a.png", "day.1/index.html", "day.1/index.md"],
            "{backend:?}"
        );
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["day.2/index.html", "day.2/index.md"], "{backend:?}");
        if backend == Backend::Local {
            assert!(!site.t.join("site/day.1").exists(), "emptied folder");
        }
        site.assert_consistent();
    });
}

/// Publishing another owner's recorded path takes it over: the record's
/// owner and source change, its `created_at` stays, and the previous
/// owner's replacement no longer counts it as its own (deletes nothing).
#[test]
fn overwriting_another_owners_output_takes_it_over() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        site.add_pipeline("other", "replacement");
        let theirs = site
            .t
            .bundle("other.1", &[("shared.txt", "theirs"), ("own.txt", "o")]);
        let ours = site.t.bundle("rep.1", &[("shared.txt", "ours")]);
        site.publish_with("other", &theirs, &[]).expect_code(0);
        let before = site.recorded()["shared.txt"].clone();
        site.publish(&ours).expect_code(0);
        let r = &site.recorded()["shared.txt"];
        assert_eq!(r["pipeline_id"], "reports", "{backend:?}");
        assert_eq!(r["source"]["id"], "rep.1");
        assert_eq!(r["created_at"], before["created_at"]);
        let theirs2 = site.t.bundle("other.2", &[("own.txt", "o2")]);
        let out = site.publish_with("other", &theirs2, &[]);
        out.expect_code(0);
        assert_eq!(strings(&out.dest()["deletes"]), Vec::<String>::new());
        assert_eq!(site.get("shared.txt").as_deref(), Some(&b"ours"[..]));
        site.assert_consistent();
    });
}

/// Two outputs at one path (`x.md` rendered to `x.html` beside a listed
/// `x.html`) make the bundle invalid for the destination: exit 1, the
/// path named, nothing written, no catalog.
#[test]
fn colliding_outputs_make_the_bundle_invalid_for_the_destination() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let b = site.t.bundle(
            "rep.1",
            &[("x.md", "# X\n"), ("x.html", "<p>hand made</p>")],
        );
        let out = site.publish(&b);
        out.expect_code(1);
        let doc = out.json();
        assert_eq!(doc["ok"], false);
        assert!(doc["error"].as_str().unwrap().contains("x.html"), "{doc}");
        assert!(site.paths().is_empty(), "{backend:?}: {:?}", site.paths());
        assert!(site.get(".distributor.json").is_none(), "{backend:?}");
    });
}

/// A file in the bundle folder that the manifest does not list is not
/// published.
#[test]
fn unlisted_bundle_files_are_not_published() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let b = site.t.bundle("rep.1", &[("a.txt", "a")]);
        site.t
            .write("bundles/rep.1/later.txt", "not in the manifest");
        let out = site.publish(&b);
        out.expect_code(0);
        assert_eq!(strings(&out.dest()["writes"]), ["a.txt"], "{backend:?}");
        assert!(site.get("later.txt").is_none(), "{backend:?}");
        site.assert_consistent();
    });
}

/// Replacement whose old output someone already deleted: the publication
/// goes on (`replace_catalog`) and the record is gone.
#[test]
fn replacement_tolerates_an_output_already_deleted_by_hand() {
    each_backend(|backend| {
        let site = Site::new(backend, "replacement");
        let b1 = site.t.bundle("rep.1", &[("a.txt", "a"), ("b.txt", "b")]);
        let b2 = site.t.bundle("rep.2", &[("a.txt", "a")]);
        site.publish(&b1).expect_code(0);
        site.delete_behind_the_back("b.txt");
        let out = site.publish(&b2);
        out.expect_code(0);
        assert_eq!(out.dest()["action"], "replace_catalog", "{backend:?}");
        assert_eq!(site.recorded().keys().collect::<Vec<_>>(), ["a.txt"]);
        site.assert_consistent();
    });
}

/// The `--json` document of `run` has exactly the keys of the contract,
/// at the top, in `source` and in each destination, whatever the root;
/// `root` names it (the local folder, or `s3://bucket/prefix`).
#[test]
fn json_document_has_exactly_the_contract_keys() {
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object().expect("object").keys().cloned().collect()
    };
    let set = |k: &[&str]| -> BTreeSet<String> { k.iter().map(|s| s.to_string()).collect() };
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let b = site.t.bundle("rep.1", &[("a.txt", "a")]);
        let doc = site.publish(&b).json();
        assert_eq!(
            keys(&doc),
            set(&[
                "ok",
                "dry_run",
                "pipeline_id",
                "source",
                "destinations",
                "stage",
                "error",
                "signer"
            ]),
            "{backend:?}"
        );
        assert_eq!(doc["ok"], true);
        // A pipeline without `signatures` (docs/contract.md §17.4).
        assert!(doc["signer"].is_null(), "{doc}");
        assert_eq!(doc["dry_run"], false);
        assert_eq!(doc["pipeline_id"], "reports");
        assert_eq!(keys(&doc["source"]), set(&["id", "digest", "created"]));
        assert_eq!(doc["source"]["id"], "rep.1");
        assert!(
            doc["source"]["digest"]
                .as_str()
                .unwrap()
                .starts_with("sha256:")
        );
        let dests = doc["destinations"].as_array().unwrap();
        assert_eq!(dests.len(), 1);
        assert_eq!(
            keys(&dests[0]),
            set(&[
                "destination_id",
                "root",
                "workflow",
                "action",
                "writes",
                "deletes",
                "unmanaged",
                "error"
            ]),
            "{backend:?}"
        );
        assert_eq!(dests[0]["destination_id"], "web");
        assert_eq!(dests[0]["workflow"], "additive");
        let root = dests[0]["root"].as_str().unwrap();
        match &site.bucket {
            None => assert_eq!(
                fs::canonicalize(root).unwrap(),
                fs::canonicalize(site.t.join("site")).unwrap()
            ),
            Some(bucket) => assert_eq!(root, format!("s3://{}/site", bucket.location.bucket)),
        }
        assert_eq!(dests[0]["error"], Value::Null);
    });
}

/// Each recorded URL is the base URL, then each segment of the output
/// path percent-encoded (`A-Z a-z 0-9 - . _ ~` kept).
#[test]
fn urls_percent_encode_each_segment() {
    let extra = "        prefix: \"{source_id}\"\n        links:\n          base_url: https://example.com/x\n";
    each_backend(|backend| {
        let site = Site::with(backend, "additive", extra);
        let b = site.t.bundle(
            "r_1.x",
            &[
                ("dir with space/ü&a+b%.txt", "x"),
                ("plain-file.v1_~.txt", "y"),
            ],
        );
        site.publish(&b).expect_code(0);
        let recs = site.recorded();
        assert_eq!(
            recs["r_1.x/dir with space/ü&a+b%.txt"]["url"],
            "https://example.com/x/r_1.x/dir%20with%20space/%C3%BC%26a%2Bb%25.txt",
            "{backend:?}"
        );
        assert_eq!(
            recs["r_1.x/plain-file.v1_~.txt"]["url"],
            "https://example.com/x/r_1.x/plain-file.v1_~.txt"
        );
        site.assert_consistent();
    });
}

/// A recorded file where a later bundle needs a folder is a conflict
/// (`fail_conflict`, exit 3), and the file stays.
#[test]
fn fail_conflict_when_a_managed_file_sits_where_a_folder_must_go() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let b1 = site.t.bundle("rep.1", &[("a", "a file")]);
        let b2 = site.t.bundle("rep.2", &[("a/b.txt", "b")]);
        site.publish(&b1).expect_code(0);
        let out = site.publish(&b2);
        out.expect_code(3);
        assert_eq!(out.dest()["action"], "fail_conflict", "{backend:?}");
        assert_eq!(site.get("a").as_deref(), Some(&b"a file"[..]));
        assert!(site.get("a/b.txt").is_none(), "{backend:?}");
        site.assert_consistent();
    });
}

/// Markdown is rendered to a whole HTML page (its title from the first
/// heading, or the file name), sanitized (a script is neither run nor
/// shown), with links to other markdown files of the bundle rewritten to
/// their pages and external links kept; with `publish.source` off, only
/// the pages are stored, each recorded as generated from its source.
#[test]
fn markdown_is_rendered_to_sanitized_html_with_rewritten_links() {
    each_backend(|backend| {
        let site = Site::new(backend, "additive");
        let config = fs::read_to_string(site.t.join("config.yaml")).unwrap();
        site.t
            .config(&config.replace("source: true", "source: false"));
        let b = site.t.bundle(
            "rep.1",
            &[
                ("report.md", "# Quarterly *figures*\n\nSee [the notes](notes.md) and [x](https://e.com/y.md).\n\n<script>alert(1)</script>\n"),
                ("notes.md", "no heading here\n"),
            ],
        );
        let out = site.publish(&b);
        out.expect_code(0);
        assert_eq!(
            strings(&out.dest()["writes"]),
            ["notes.html", "report.html"],
            "{backend:?}"
        );
        let html = String::from_utf8(site.get("report.html").unwrap()).unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
        assert!(html.contains("<title>Quarterly figures</title>"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("&lt;script&gt;"), "{html}");
        assert!(html.contains("href=\"notes.html\""), "{html}");
        assert!(
            html.contains("href=\"https://e.com/y.md\""),
            "external links stay: {html}"
        );
        let notes = String::from_utf8(site.get("notes.html").unwrap()).unwrap();
        assert!(
            notes.contains("<title>notes</title>"),
            "title falls back to the file name: {notes}"
        );
        assert!(site.get("report.md").is_none(), "publish.source is off");
        let r = &site.recorded()["report.html"];
        assert_eq!(r["kind"], "generated");
        assert_eq!(r["source_path"], "report.md");
        assert_eq!(r["transform"], "markdown_to_html");
        assert_eq!(r["sha256"], crate::util::sha256(html.as_bytes()));
        site.assert_consistent();
    });
}

// ---------------------------------------------------------------------------
// A backlog: what the agent publishes as one batch, on every backend
// ---------------------------------------------------------------------------

/// What the batch scenarios add to a [`Site`].
impl Site {
    /// [`Site::new`] for the agent: no settling time, and metrics in
    /// `metrics.prom`.
    fn batching(backend: Backend, workflow: &str) -> Site {
        let site = Site::new(backend, workflow);
        let config = fs::read_to_string(site.t.join("config.yaml")).unwrap();
        site.t.config(&config.replace(
            "spool: ./spool\n",
            "spool: ./spool\nagent: {settle: 0s, metrics_file: ./metrics.prom}\n",
        ));
        site
    }

    /// Seals bundle `name` (its id too) with `files` and drops it into the
    /// inbox of `reports`, arriving `order` seconds after a fixed instant.
    fn drop_bundle(&self, name: &str, order: u64, files: &[(&str, &str)]) {
        let dir = self.t.bundle_at(name, name, "2026-06-04T00:00:00Z", files);
        crate::util::arrive_in_order(&dir, order);
        let inbox = self.t.join("spool/reports/inbox");
        fs::create_dir_all(&inbox).unwrap();
        fs::rename(&dir, inbox.join(name)).unwrap();
    }

    /// `agent --once`, logging at info (which says how bundles were
    /// batched).
    fn once(&self) -> Output {
        self.command(&["agent", "--once"], &[("RUST_LOG", "info")])
            .output()
    }

    /// The result of bundle `name` filed in spool folder `folder`.
    fn result(&self, folder: &str, name: &str) -> Value {
        crate::util::read_json(&self.t.join(&format!(
            "spool/reports/{folder}/{name}/.distributor-result.json"
        )))
    }

    /// The bundles in spool folder `folder` of `reports`.
    fn bundles(&self, folder: &str) -> Vec<String> {
        crate::util::bundle_names(&self.t.join(&format!("spool/reports/{folder}")))
    }

    /// The value of metric `distributor_<name>` of `reports`.
    fn metric(&self, name: &str) -> String {
        let text = fs::read_to_string(self.t.join("metrics.prom")).unwrap();
        let prefix = format!("distributor_{name}{{pipeline=\"reports\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .to_owned()
    }
}

/// A backlog behind a first bundle (which makes the catalog, alone) goes
/// as one batch (no fallback): in arrival order, so the last arrival owns
/// the path all of them write; with one result per bundle that reports
/// its own writes; in one commit (every record it wrote carries the same
/// update time); and leaving no record of the batch's attempt in `work/`.
#[test]
fn a_backlog_goes_as_one_batch_in_arrival_order_with_one_result_per_bundle() {
    each_backend(|backend| {
        let site = Site::batching(backend, "additive");
        site.drop_bundle("b00", 0, &[("first.txt", "first\n")]);
        site.once().expect_code(0);
        let first_catalog = site.get(".distributor.json").expect("a catalog");
        let n = 10;
        for i in 1..=n {
            let content = format!("version {i}\n");
            let only = format!("only-{i}.txt");
            let files = [("page.html", content.as_str()), (only.as_str(), "x\n")];
            site.drop_bundle(&format!("b{i:02}"), i as u64, &files);
        }
        let out = site.once();
        out.expect_code(0);
        assert_eq!(
            crate::util::batch_sizes(&out.stderr),
            [n],
            "{backend:?}: not one batch:\n{}",
            out.stderr
        );
        assert!(
            !out.stderr.contains("stepped aside"),
            "{backend:?}: the batch fell back:\n{}",
            out.stderr
        );
        assert_eq!(site.metric("batch_fallbacks_total"), "0");
        assert_eq!(site.bundles("done").len(), n + 1, "{}", out.stderr);
        for i in 1..=n {
            let name = format!("b{i:02}");
            let r = site.result("done", &name);
            assert_eq!(r["ok"], true, "{r}");
            assert_eq!(r["source"]["id"], name.as_str());
            assert_eq!(r["destinations"][0]["action"], "upsert_additive", "{r}");
            let writes = r["destinations"][0]["writes"].as_array().unwrap().len();
            assert_eq!(writes, 2, "{backend:?}: {name} reports its own writes");
        }
        assert_eq!(
            site.get("page.html").as_deref(),
            Some(format!("version {n}\n").as_bytes())
        );
        let records = site.recorded();
        assert_eq!(
            records["page.html"]["source"]["id"],
            format!("b{n:02}"),
            "{backend:?}: the last arrival owns it"
        );
        for i in 1..=n {
            assert!(records.contains_key(&format!("only-{i}.txt")));
        }
        let times: BTreeSet<&str> = records
            .iter()
            .filter(|(path, _)| *path != "first.txt")
            .map(|(_, r)| r["updated_at"].as_str().unwrap())
            .collect();
        assert_eq!(times.len(), 1, "{backend:?}: not one commit: {times:?}");
        assert_ne!(site.get(".distributor.json").unwrap(), first_catalog);
        assert!(site.bundles("work").is_empty(), "{backend:?}");
        assert!(
            !site
                .t
                .join("spool/reports/work/.distributor-batch.json")
                .exists()
        );
        site.assert_nothing_pending();
        site.assert_consistent();
    });
}

/// Replacement in a batch: a later bundle's version deletes what it
/// omits (and a local root's emptied folders), and what the first bundle
/// published is gone too.
#[test]
fn replacement_in_a_batch_deletes_what_a_later_bundle_omits() {
    each_backend(|backend| {
        let site = Site::batching(backend, "replacement");
        site.drop_bundle("seed", 0, &[("seed.txt", "s\n")]);
        site.drop_bundle("a", 1, &[("x.txt", "a\n"), ("y/deep.txt", "a\n")]);
        site.drop_bundle("b", 2, &[("x.txt", "b\n")]);
        let out = site.once();
        out.expect_code(0);
        assert!(
            !crate::util::batch_sizes(&out.stderr).is_empty(),
            "{backend:?}: no batch was used:\n{}",
            out.stderr
        );
        let b = site.result("done", "b");
        assert_eq!(b["destinations"][0]["action"], "replace_catalog", "{b}");
        assert_eq!(strings(&b["destinations"][0]["deletes"]), ["y/deep.txt"]);
        if backend == Backend::Local {
            assert!(!site.t.join("site/y").exists(), "emptied folder removed");
        }
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(paths, ["x.txt"], "{backend:?}");
        assert_eq!(site.get("x.txt").as_deref(), Some(&b"b\n"[..]));
        assert_eq!(site.recorded().keys().collect::<Vec<_>>(), ["x.txt"]);
        site.assert_consistent();
    });
}

/// A bundle changed after sealing (same size) in a backlog: only its copy,
/// hashed as it streams, sees it, once other outputs of the batch were
/// written. The batch steps aside (a warning naming the pipeline and the
/// file, counted in `batch_fallbacks_total`), its writes are undone, and
/// the bundles go one by one: the bad one fails alone at stage verify,
/// the others are published, and nothing of the bad one is in the root.
#[test]
fn a_bad_file_met_while_copying_steps_the_batch_aside_and_fails_alone() {
    each_backend(|backend| {
        let site = Site::batching(backend, "additive");
        site.drop_bundle("first", 0, &[("first.txt", "1\n")]);
        site.once().expect_code(0);
        site.drop_bundle("a", 1, &[("a.txt", "a\n")]);
        site.drop_bundle("b", 2, &[("b.txt", "b\n")]);
        site.drop_bundle("tampered", 3, &[("zz/t.txt", "tttt\n")]);
        fs::write(
            site.t.join("spool/reports/inbox/tampered/zz/t.txt"),
            "TTTT\n",
        )
        .unwrap();
        site.drop_bundle("c", 4, &[("c.txt", "c\n")]);
        let out = site.once();
        out.expect_code(1);
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("stepped aside"))
            .unwrap_or_else(|| panic!("{backend:?}: no fallback logged:\n{}", out.stderr));
        assert!(line.contains("WARN"), "{line}");
        assert!(line.contains("pipeline=reports"), "{line}");
        assert!(line.contains("zz/t.txt"), "the cause is named: {line}");
        if backend == Backend::S3 {
            assert!(line.contains("undone"), "{line}");
        }
        assert!(
            crate::util::batch_sizes(&out.stderr).is_empty(),
            "{}",
            out.stderr
        );
        assert_eq!(site.metric("batch_fallbacks_total"), "1");
        assert_eq!(
            site.bundles("done"),
            ["a", "b", "c", "first"],
            "{backend:?}"
        );
        assert_eq!(site.bundles("failed"), ["tampered"], "{backend:?}");
        let r = site.result("failed", "tampered");
        assert_eq!(r["stage"], "verify", "{r}");
        assert!(
            r["error"].as_str().unwrap_or_default().contains("zz/t.txt"),
            "{r}"
        );
        let paths: Vec<String> = site.paths().into_iter().collect();
        assert_eq!(
            paths,
            ["a.txt", "b.txt", "c.txt", "first.txt"],
            "{backend:?}"
        );
        site.assert_nothing_pending();
        site.assert_consistent();
    });
}

/// Someone else's file at a path one bundle of a backlog needs, which the
/// catalog does not record: that bundle alone is refused (stage plan,
/// `fail_unmanaged`, the path named), exactly as when it is published
/// alone; the rest of the backlog is published; the file is left as it
/// was (inode and time, or ETag) and not recorded. A local root's batch
/// sees the file when it plans; an s3 batch does not HEAD it, so its
/// conditional create is refused and the batch steps aside, naming it.
#[test]
fn an_unmanaged_file_refuses_only_the_bundle_that_needs_its_path() {
    each_backend(|backend| {
        let site = Site::batching(backend, "additive");
        site.drop_bundle("first", 0, &[("first.txt", "1\n")]);
        site.once().expect_code(0);
        site.change_behind_the_back("r3/page.html", b"<p>theirs</p>");
        let planted = site.identity("r3/page.html");
        for i in 1..=6u64 {
            let page = format!("<p>{i}</p>\n");
            let files = [
                (format!("r{i}/page.html"), page),
                (format!("r{i}/data.csv"), "x,y\n".repeat(i as usize)),
            ];
            let files: Vec<(&str, &str)> = files
                .iter()
                .map(|(p, c)| (p.as_str(), c.as_str()))
                .collect();
            site.drop_bundle(&format!("b{i}"), i, &files);
        }
        let out = site.once();
        out.expect_code(1);
        match backend {
            Backend::Local => assert!(
                !crate::util::batch_sizes(&out.stderr).is_empty(),
                "no batch was used:\n{}",
                out.stderr
            ),
            Backend::S3 => {
                let line = out
                    .stderr
                    .lines()
                    .find(|l| l.contains("stepped aside"))
                    .unwrap_or_else(|| panic!("no fallback logged:\n{}", out.stderr));
                assert!(line.contains("r3/page.html"), "the cause is named: {line}");
                assert_eq!(site.metric("batch_fallbacks_total"), "1");
            }
        }
        assert_eq!(site.bundles("failed"), ["b3"], "{backend:?}");
        assert_eq!(
            site.bundles("done"),
            ["b1", "b2", "b4", "b5", "b6", "first"],
            "{backend:?}"
        );
        let r = site.result("failed", "b3");
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["stage"], "plan", "{r}");
        assert_eq!(r["destinations"][0]["action"], "fail_unmanaged", "{r}");
        assert_eq!(
            strings(&r["destinations"][0]["unmanaged"]),
            ["r3/page.html"]
        );
        assert_eq!(
            site.get("r3/page.html").as_deref(),
            Some(&b"<p>theirs</p>"[..])
        );
        assert_eq!(site.identity("r3/page.html"), planted, "{backend:?}");
        let records = site.recorded();
        assert!(
            records.keys().all(|k| !k.starts_with("r3/")),
            "{backend:?}: {records:?}"
        );
        assert_eq!(records.len(), 5 * 2 + 1, "{backend:?}");
        site.assert_nothing_pending();
        site.assert_consistent_but(&["r3/page.html"]);
    });
}
