//! `prune`, `reconcile-state`, `verify` and `catalog` against real roots
//! built with `distributor run`: one scenario, every backend. Each test
//! runs against a local root and against a root in a bucket of the
//! SeaweedFS of `seaweed::server` ([`each_backend`]) and asserts what an
//! operator sees in both the same way; where the two differ by nature
//! (folders and links exist only on disk), the scenario says so. What
//! only one backend has is at the end (lock files, links) and in
//! `s3_maintain.rs` (credentials, intents of a killed publisher).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::seaweed::{Bucket, server};
use crate::util::{Backend, Output, Test, each_backend, strings};

/// Two pipelines share one root: `reports/site` (prefix `{source_id}/`,
/// pruned after a day, keeping the newest source) and `blog/site`
/// (prefix `blog/`, no retention policy).
fn config(root: &str) -> String {
    format!(
        r#"
spool: ./spool
agent:
  lock_timeout: 20s
pipelines:
  - id: reports
    destinations:
      - id: site
        {root}
        prefix: "{{source_id}}/"
        retention:
          prune:
            max_age: 1d
            keep_latest: 1
  - id: blog
    destinations:
      - id: site
        {root}
        prefix: "blog/"
"#
    )
}

const OLD: &str = "2026-01-01T00:00:00Z";

/// A test folder whose config has the two pipelines of [`config`] on one
/// root of `backend`: `./root`, or `root/` in a bucket of its own.
struct Fixture {
    backend: Backend,
    t: Test,
    bucket: Option<Bucket>,
}

impl Fixture {
    fn new(backend: Backend) -> Fixture {
        let t = Test::new();
        let (bucket, root) = match backend {
            Backend::Local => (None, "path: ./root".to_owned()),
            Backend::S3 => {
                let bucket = Bucket::new("root");
                let root = format!(
                    "backend: s3\n        bucket: {}\n        path: root\n        endpoint: {}",
                    bucket.location.bucket,
                    server().endpoint
                );
                (Some(bucket), root)
            }
        };
        t.config(&config(&root));
        Fixture { backend, t, bucket }
    }

    /// The local root.
    fn root(&self) -> PathBuf {
        self.t.join("root")
    }

    /// How messages name the root (the start of its text).
    fn root_name(&self) -> String {
        match &self.bucket {
            None => self.root().display().to_string(),
            Some(bucket) => format!("s3://{}/root", bucket.location.bucket),
        }
    }

    /// The binary with the config (and, for s3, the server's credentials).
    fn distributor(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = self.t.cmd();
        if self.backend == Backend::S3 {
            let creds = server().credentials();
            cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
                .env("AWS_SECRET_ACCESS_KEY", &creds.secret);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        cmd.args(["--config", "config.yaml"]).args(args);
        cmd.output()
    }

    /// Runs a maintenance command for `pipeline`/site with `extra` flags.
    fn maintain(&self, command: &str, pipeline: &str, extra: &[&str]) -> Output {
        let mut args = vec![command, "--pipeline", pipeline, "--destination", "site"];
        args.extend_from_slice(extra);
        self.distributor(&args, &[])
    }

    /// Like [`Fixture::maintain`] with `--json`, expecting exit `code`.
    #[track_caller]
    fn json(&self, command: &str, pipeline: &str, extra: &[&str], code: i32) -> Value {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let r = self.maintain(command, pipeline, &extra);
        assert_eq!(
            r.code,
            code,
            "{:?} {command} {extra:?}: {}",
            self.backend,
            r.all()
        );
        r.json()
    }

    /// Seals a bundle `id` created at `created` holding `files`.
    fn bundle(&self, id: &str, created: &str, files: &[(&str, &str)]) -> PathBuf {
        self.t.bundle_at(id, id, created, files)
    }

    /// Publishes a bundle through `run` and expects success.
    fn publish(&self, pipeline: &str, bundle: &Path) {
        let bundle = bundle.to_str().unwrap();
        self.distributor(&["run", "--pipeline", pipeline, bundle], &[])
            .expect_code(0);
    }

    /// The catalog as stored.
    fn state(&self) -> Value {
        let bytes = self.get(".distributor.json").expect("a catalog");
        serde_json::from_slice(&bytes).unwrap()
    }

    /// Replaces the catalog with `text`, as another tool would.
    fn write_state(&self, text: &str) {
        self.write(".distributor.json", text);
    }

    /// Paths the catalog records.
    fn recorded(&self) -> Vec<String> {
        self.state()["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["path"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Sets `updated_at` of every record whose path starts with `prefix`.
    fn age(&self, prefix: &str, updated_at: &str) {
        let mut state = self.state();
        for r in state["outputs"].as_array_mut().unwrap() {
            if r["path"].as_str().unwrap().starts_with(prefix) {
                r["updated_at"] = updated_at.into();
            }
        }
        let mut text = serde_json::to_string_pretty(&state).unwrap();
        text.push('\n');
        self.write_state(&text);
    }

    /// Every entry of the root (the tool's own files too) with its kind
    /// and bytes: below the local root, or every key of the bucket.
    fn snapshot(&self) -> BTreeMap<String, String> {
        let Some(bucket) = &self.bucket else {
            return local_snapshot(&self.root());
        };
        bucket
            .keys()
            .into_iter()
            .map(|key| {
                let bytes = bucket.get(&key).unwrap_or_default();
                (key, String::from_utf8_lossy(&bytes).into_owned())
            })
            .collect()
    }

    /// The bytes at `path` below the root.
    fn get(&self, path: &str) -> Option<Vec<u8>> {
        match &self.bucket {
            None => std::fs::read(self.root().join(path)).ok(),
            Some(bucket) => bucket.get(path),
        }
    }

    /// Writes `text` at `path` behind the tool's back.
    fn write(&self, path: &str, text: &str) {
        match &self.bucket {
            None => crate::util::write_file(&self.root().join(path), text.as_bytes()),
            Some(bucket) => {
                bucket.plant(path, text.as_bytes());
            }
        }
    }

    /// Deletes the output at `path` behind the tool's back.
    fn remove(&self, path: &str) {
        match &self.bucket {
            None => std::fs::remove_file(self.root().join(path)).unwrap(),
            Some(bucket) => bucket.root.delete(path).unwrap(),
        }
    }

    /// Whether anything is at `path`, or below it.
    fn holds(&self, path: &str) -> bool {
        let below = format!("{path}/");
        self.snapshot()
            .keys()
            .any(|k| k == path || k.starts_with(&below))
    }
}

/// Every entry below `root` with its kind and (files) bytes.
fn local_snapshot(root: &Path) -> BTreeMap<String, String> {
    use crate::util::Kind;
    crate::util::shape(root)
        .0
        .into_iter()
        .filter(|(path, _)| !path.is_empty())
        .map(|(path, node)| {
            let what = match node.kind {
                Kind::Dir => "dir".to_owned(),
                Kind::Symlink(target) => format!("link {}", target.display()),
                _ => {
                    String::from_utf8_lossy(&std::fs::read(root.join(&path)).unwrap()).into_owned()
                }
            };
            (path, what)
        })
        .collect()
}

/// Three `reports` sources (s1 oldest .. s3 newest by `created`, published
/// out of order), one `blog` source, and a stray unmanaged file; every
/// record aged so that it is past `max_age`.
fn populated(backend: Backend) -> Fixture {
    let f = Fixture::new(backend);
    let s2 = f.bundle(
        "s2",
        "2026-01-02T00:00:00Z",
        &[("a.md", "two"), ("sub/c.txt", "c2")],
    );
    let s3 = f.bundle("s3", "2026-01-03T00:00:00+01:00", &[("a.md", "three")]);
    let s1 = f.bundle(
        "s1",
        "2026-01-01T00:00:00Z",
        &[("a.md", "one"), ("sub/c.txt", "c1")],
    );
    let b1 = f.bundle("b1", "2025-12-01T00:00:00Z", &[("post.md", "post")]);
    f.publish("reports", &s2);
    f.publish("reports", &s3);
    f.publish("reports", &s1);
    f.publish("blog", &b1);
    f.write("stray.txt", "not ours");
    f.age("", OLD);
    f
}

const OLD_SOURCES: [&str; 4] = ["s1/a.md", "s1/sub/c.txt", "s2/a.md", "s2/sub/c.txt"];

#[test]
fn prune_dry_run_reports_the_selection_and_changes_nothing() {
    each_backend(|backend| {
        let f = populated(backend);
        let before = f.snapshot();
        let v = f.json("prune", "reports", &["--dry-run"], 0);
        assert_eq!(v["dry_run"], true);
        assert_eq!(v["pipeline_id"], "reports");
        assert_eq!(v["destination_id"], "site");
        assert_eq!(strings(&v["deletes"]), OLD_SOURCES, "{backend:?}");
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["deletes", "destination_id", "dry_run", "pipeline_id"]
        );
        assert_eq!(f.snapshot(), before, "{backend:?}");

        let text = f.maintain("prune", "reports", &["--dry-run"]);
        text.expect_code(0);
        assert!(text.stdout.contains("s2/sub/c.txt"), "{}", text.stdout);
        assert_eq!(f.snapshot(), before, "{backend:?}");
    });
}

#[test]
fn prune_apply_deletes_exactly_the_selection() {
    each_backend(|backend| {
        let f = populated(backend);
        let created_at = f.state()["created_at"].clone();

        let v = f.json("prune", "reports", &["--apply"], 0);
        assert_eq!(v["dry_run"], false);
        assert_eq!(strings(&v["deletes"]), OLD_SOURCES, "{backend:?}");

        // Emptied folders go too (a bucket has none).
        assert!(!f.holds("s1") && !f.holds("s2"), "{backend:?}");
        assert_eq!(f.get("s3/a.md").unwrap(), b"three");
        assert_eq!(f.get("blog/post.md").unwrap(), b"post");
        assert_eq!(f.get("stray.txt").unwrap(), b"not ours");
        assert_eq!(f.recorded(), ["blog/post.md", "s3/a.md"], "{backend:?}");
        let state = f.state();
        assert_eq!(state["created_at"], created_at);
        assert_ne!(state["updated_at"], OLD);

        // The catalog matches the root, and a second prune has nothing to do.
        let v = f.json("verify", "reports", &["--all-owners"], 0);
        assert_eq!(v["ok"], true);
        assert_eq!(v["checked"], 2);
        let v = f.json("prune", "reports", &["--apply"], 0);
        assert!(strings(&v["deletes"]).is_empty());
        let v = f.json("reconcile-state", "reports", &["--dry-run"], 0);
        assert_eq!(strings(&v["unmanaged"]), ["stray.txt"], "{backend:?}");
    });
}

#[test]
fn keep_latest_protects_the_newest_source_by_created_not_by_publication() {
    each_backend(|backend| {
        let f = Fixture::new(backend);
        // Published newest-first: the last publication is the oldest source.
        let new = f.bundle("new", "2026-03-01T00:00:00Z", &[("x.md", "new")]);
        let old = f.bundle("old", "2026-02-01T00:00:00Z", &[("x.md", "old")]);
        f.publish("reports", &new);
        f.publish("reports", &old);
        f.age("", OLD);
        let v = f.json("prune", "reports", &["--apply"], 0);
        assert_eq!(strings(&v["deletes"]), ["old/x.md"], "{backend:?}");
        assert_eq!(f.recorded(), ["new/x.md"]);
        // The only source left is the newest one: never pruned, however old.
        let v = f.json("prune", "reports", &["--apply"], 0);
        assert!(strings(&v["deletes"]).is_empty());
    });
}

#[test]
fn prune_leaves_recent_outputs_alone() {
    each_backend(|backend| {
        let f = Fixture::new(backend);
        for (id, created) in [
            ("s1", "2026-01-01T00:00:00Z"),
            ("s2", "2026-01-02T00:00:00Z"),
        ] {
            let b = f.bundle(id, created, &[("a.md", id)]);
            f.publish("reports", &b);
        }
        let before = f.snapshot();
        let v = f.json("prune", "reports", &["--apply"], 0);
        assert!(strings(&v["deletes"]).is_empty());
        assert_eq!(
            f.snapshot(),
            before,
            "{backend:?}: nothing pruned, catalog not rewritten"
        );
    });
}

#[test]
fn prune_without_a_retention_policy_exits_2() {
    each_backend(|backend| {
        let f = populated(backend);
        let before = f.snapshot();
        for flag in ["--dry-run", "--apply"] {
            let r = f.maintain("prune", "blog", &[flag]);
            r.expect_code(2);
            assert!(r.all().contains("retention"), "{}", r.all());
        }
        assert_eq!(f.snapshot(), before, "{backend:?}");
    });
}

#[test]
fn reconcile_reports_and_drops_missing_records_by_scope() {
    each_backend(|backend| {
        let f = populated(backend);
        f.remove("s2/a.md");
        f.remove("blog/post.md");
        f.write("s3/extra.txt", "stray");
        f.write("loose/only/junk.bin", "junk");
        let mut unmanaged = vec!["loose/only/junk.bin", "s3/extra.txt", "stray.txt"];
        if backend == Backend::Local {
            // An empty folder is content too, even one a deleted output
            // left behind (a bucket has no folders).
            std::fs::create_dir_all(f.root().join("empty/deeper")).unwrap();
            unmanaged.extend(["blog", "empty/deeper"]);
            unmanaged.sort();
        }

        let before = f.snapshot();
        let v = f.json("reconcile-state", "reports", &["--dry-run"], 0);
        assert_eq!(v["dry_run"], true);
        assert_eq!(strings(&v["missing"]), ["s2/a.md"], "{backend:?}");
        assert_eq!(strings(&v["unmanaged"]), unmanaged, "{backend:?}");
        assert_eq!(v["removed_records"], 0);
        let v = f.json(
            "reconcile-state",
            "reports",
            &["--dry-run", "--all-owners"],
            0,
        );
        assert_eq!(strings(&v["missing"]), ["blog/post.md", "s2/a.md"]);
        assert_eq!(f.snapshot(), before, "{backend:?}: dry runs change nothing");

        // Scoped: only this owner's record goes; the blog record stays.
        let v = f.json("reconcile-state", "reports", &[], 0);
        assert_eq!(v["dry_run"], false);
        assert_eq!(strings(&v["missing"]), ["s2/a.md"]);
        assert_eq!(v["removed_records"], 1);
        let recorded = f.recorded();
        assert!(!recorded.contains(&"s2/a.md".to_owned()));
        assert!(recorded.contains(&"blog/post.md".to_owned()));

        let v = f.json("reconcile-state", "reports", &["--all-owners"], 0);
        assert_eq!(strings(&v["missing"]), ["blog/post.md"]);
        assert_eq!(v["removed_records"], 1);
        assert_eq!(strings(&v["unmanaged"]), unmanaged);
        assert!(!f.recorded().contains(&"blog/post.md".to_owned()));

        // Nothing was deleted or adopted.
        for path in &unmanaged {
            assert!(f.holds(path), "{backend:?}: {path}");
        }
        let v = f.json("reconcile-state", "reports", &["--all-owners"], 0);
        assert!(strings(&v["missing"]).is_empty());
        assert_eq!(v["removed_records"], 0);
        assert_eq!(
            f.json("verify", "reports", &["--all-owners"], 0)["ok"],
            true
        );
    });
}

#[test]
fn verify_reports_corrupted_truncated_and_deleted_outputs() {
    each_backend(|backend| {
        let f = populated(backend);
        let clean = f.json("verify", "reports", &[], 0);
        assert_eq!(clean["ok"], true);
        assert_eq!(clean["checked"], 5);
        assert!(strings(&clean["missing"]).is_empty());
        f.maintain("verify", "reports", &["--all-owners"])
            .expect_code(0);

        f.write("s1/a.md", "ONE"); // same size, other bytes
        f.write("s2/a.md", "tw"); // truncated
        f.remove("s3/a.md");
        f.write("blog/post.md", "POST");
        let before = f.snapshot();

        let v = f.json("verify", "reports", &[], 1);
        assert_eq!(v["ok"], false);
        assert_eq!(v["checked"], 5);
        assert_eq!(strings(&v["missing"]), ["s3/a.md"], "{backend:?}");
        assert_eq!(strings(&v["mismatched"]), ["s1/a.md", "s2/a.md"]);
        let v = f.json("verify", "reports", &["--all-owners"], 1);
        assert_eq!(v["checked"], 6);
        assert_eq!(
            strings(&v["mismatched"]),
            ["blog/post.md", "s1/a.md", "s2/a.md"]
        );
        let text = f.maintain("verify", "reports", &[]);
        text.expect_code(1);
        assert!(
            text.stdout
                .contains("5 output(s) checked: 1 missing, 2 mismatched"),
            "{}",
            text.stdout
        );
        assert!(text.stdout.contains("s3/a.md"), "{}", text.stdout);
        assert_eq!(f.snapshot(), before, "{backend:?}: verify changes nothing");
        assert_eq!(f.get("s1/a.md").unwrap(), b"ONE");

        // Another owner's damage does not fail a scoped verify.
        let f = populated(backend);
        f.write("blog/post.md", "POST");
        assert_eq!(f.json("verify", "reports", &[], 0)["ok"], true);
        assert_eq!(f.json("verify", "blog", &[], 1)["ok"], false);
    });
}

#[test]
fn catalog_lists_every_record_of_the_root() {
    each_backend(|backend| {
        let f = populated(backend);
        let before = f.snapshot();
        let v = f.json("catalog", "blog", &[], 0);
        let root = match &f.bucket {
            None => f.root().display().to_string(),
            Some(bucket) => format!(
                "s3://{}/root at {}",
                bucket.location.bucket,
                server().endpoint
            ),
        };
        assert_eq!(v["root"].as_str().unwrap(), root);
        let outputs = v["outputs"].as_array().unwrap();
        let paths: Vec<&str> = outputs
            .iter()
            .map(|r| r["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "blog/post.md",
                "s1/a.md",
                "s1/sub/c.txt",
                "s2/a.md",
                "s2/sub/c.txt",
                "s3/a.md"
            ]
        );
        assert_eq!(
            v["outputs"],
            f.state()["outputs"],
            "{backend:?}: records exactly as stored"
        );
        assert_eq!(outputs[5]["source"]["created"], "2026-01-02T23:00:00Z");

        let text = f.maintain("catalog", "reports", &[]);
        text.expect_code(0);
        assert!(
            text.stdout.contains(": 6 managed outputs"),
            "{}",
            text.stdout
        );
        let lines: Vec<&str> = text.stdout.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("PATH")).unwrap();
        let column = lines[header].find("OWNER").unwrap();
        assert_eq!(
            lines[header + 1].find("blog/site"),
            Some(column),
            "{}",
            text.stdout
        );
        assert_eq!(
            lines[header + 2].find("reports/site"),
            Some(column),
            "{}",
            text.stdout
        );
        assert_eq!(f.snapshot(), before, "{backend:?}: catalog changes nothing");
    });
}

/// An invalid, future or legacy catalog stops every command with exit 3,
/// naming the root, and nothing changes: not even a journal (a local
/// root) or a stale intent (a bucket, with a lease of 0) is finished.
#[test]
fn refused_states_exit_3_for_every_command_and_stay_untouched() {
    let states = [
        ("invalid", "{\"schema_version\": 4, \"outputs\": "),
        ("future", "{\"schema_version\": 5, \"outputs\": []}\n"),
        (
            "legacy",
            "{\"schema_version\": 2, \"outputs\": [{\"path\": \"s1/a.md\"}]}\n",
        ),
    ];
    let commands: [(&str, &[&str]); 7] = [
        ("prune", &["--dry-run"]),
        ("prune", &["--apply"]),
        ("reconcile-state", &["--dry-run"]),
        ("reconcile-state", &["--all-owners"]),
        ("verify", &[]),
        ("verify", &["--all-owners"]),
        ("catalog", &[]),
    ];
    each_backend(|backend| {
        for (name, text) in states {
            let f = populated(backend);
            f.write_state(text);
            match backend {
                Backend::Local => f.write(
                    ".distributor-journal.json",
                    r#"{"writes":[],"deletes":["s3/a.md"],"created_dirs":[],"state_was_absent":false}"#,
                ),
                Backend::S3 => f.write(
                    ".distributor-pending/0123.json",
                    r#"{"id":"0123","owner":"elsewhere pid 1","renewals":0,"revoked":false,"writes":[],"deletes":[]}"#,
                ),
            }
            let before = f.snapshot();
            for (command, extra) in commands {
                for json in [false, true] {
                    let mut args = vec![command, "--pipeline", "reports"];
                    args.extend(["--destination", "site"]);
                    args.extend_from_slice(extra);
                    if json {
                        args.push("--json");
                    }
                    let r = f.distributor(&args, &[("DISTRIBUTOR_S3_LEASE_SECS", "0")]);
                    assert_eq!(
                        r.code,
                        3,
                        "{backend:?} {name} {command} {args:?}: {}",
                        r.all()
                    );
                    let message = r.all();
                    assert!(
                        message.contains(&format!("{}/.distributor.json", f.root_name())),
                        "{backend:?} {name} {command}: message names the catalog: {message}"
                    );
                    if name == "legacy" {
                        assert!(message.contains("next publication"), "{message}");
                    }
                    assert_eq!(
                        f.snapshot(),
                        before,
                        "{backend:?} {name} {command} {args:?} changed the root"
                    );
                }
            }
        }
    });
}

/// A root with content but no catalog has nothing managed: every command
/// reports that (what is there is unmanaged) and creates nothing, no
/// lock file, no catalog, no object.
#[test]
fn a_root_without_catalog_reports_nothing_managed_and_creates_nothing() {
    each_backend(|backend| {
        let f = Fixture::new(backend);
        f.write("index.html", "hand made");
        f.write("docs/a.txt", "a");
        let before = f.snapshot();
        for (command, extra) in [
            ("prune", &["--dry-run"][..]),
            ("prune", &["--apply"]),
            ("reconcile-state", &["--dry-run"]),
            ("reconcile-state", &[]),
            ("verify", &["--all-owners"]),
            ("catalog", &[]),
        ] {
            let v = f.json(command, "reports", extra, 0);
            match command {
                "prune" => assert!(strings(&v["deletes"]).is_empty()),
                "reconcile-state" => {
                    assert!(strings(&v["missing"]).is_empty());
                    let unmanaged = strings(&v["unmanaged"]);
                    assert_eq!(unmanaged, ["docs/a.txt", "index.html"], "{backend:?}");
                    assert_eq!(v["removed_records"], 0);
                }
                "verify" => assert_eq!((&v["ok"], &v["checked"]), (&true.into(), &0.into())),
                _ => assert!(v["outputs"].as_array().unwrap().is_empty()),
            }
        }
        assert_eq!(
            f.snapshot(),
            before,
            "{backend:?}: no lock file, no catalog, nothing else"
        );
    });
}

/// Publications and `prune --apply` running at once on one root, again
/// and again: every fresh output stays recorded and stored, every expired
/// one goes (a local root's lock serialises them; in a bucket a prune
/// that lost the catalog's compare-and-swap is planned again).
#[test]
fn prune_apply_racing_publications_loses_no_record() {
    each_backend(|backend| {
        for round in 0..3 {
            let f = Fixture::new(backend);
            for i in 0..3 {
                let b = f.bundle(
                    &format!("old{i}"),
                    &format!("2026-01-0{}T00:00:00Z", i + 1),
                    &[("a.md", "old"), ("deep/b.txt", "b")],
                );
                f.publish("reports", &b);
            }
            f.age("", OLD);
            let fresh: Vec<PathBuf> = (0..4)
                .map(|i| {
                    f.bundle(
                        &format!("new{i}"),
                        &format!("2026-02-0{}T00:00:00Z", i + 1),
                        &[("a.md", "new"), ("deep/b.txt", &format!("{round}-{i}"))],
                    )
                })
                .collect();

            std::thread::scope(|scope| {
                let publisher = scope.spawn(|| {
                    for b in &fresh {
                        f.publish("reports", b);
                    }
                });
                while !publisher.is_finished() {
                    f.maintain("prune", "reports", &["--apply", "--json"])
                        .expect_code(0);
                }
                publisher.join().unwrap();
            });
            f.json("prune", "reports", &["--apply"], 0);

            // Every fresh output is recorded and stored; the old ones are gone.
            let mut want: Vec<String> = (0..4)
                .flat_map(|i| [format!("new{i}/a.md"), format!("new{i}/deep/b.txt")])
                .collect();
            want.sort();
            assert_eq!(f.recorded(), want, "{backend:?} round {round}");
            for i in 0..3 {
                assert!(!f.holds(&format!("old{i}")), "{backend:?} round {round}");
            }
            let v = f.json("verify", "reports", &["--all-owners"], 0);
            assert_eq!(v["checked"], 8);
            let v = f.json(
                "reconcile-state",
                "reports",
                &["--dry-run", "--all-owners"],
                0,
            );
            assert!(strings(&v["missing"]).is_empty(), "round {round}: {v}");
            assert!(strings(&v["unmanaged"]).is_empty(), "round {round}: {v}");
        }
    });
}

/// `prune --apply` killed at any step of its commit, which is a
/// publication's (a local root's journal and engine, a bucket's intent and
/// compare-and-swap): the next command that writes settles what it left,
/// and the root ends pruned, every record matching what is stored.
#[test]
fn a_prune_killed_at_any_step_converges_at_the_next_command() {
    each_backend(|backend| {
        let points: &[&str] = match backend {
            Backend::Local => &[
                "publish.after_journal",
                "publish.after_delete:2",
                "publish.before_catalog",
                "publish.after_catalog",
            ],
            Backend::S3 => &["s3.after_upload", "s3.after_swap"],
        };
        for point in points {
            let f = populated(backend);
            let args = ["prune", "--apply", "--json", "--pipeline", "reports"];
            let args = [&args[..], &["--destination", "site"]].concat();
            let crashed = f.distributor(&args, &[("DISTRIBUTOR_FAILPOINT", point)]);
            assert!(
                crashed.stderr.contains("reached: aborting"),
                "{backend:?} {point}: not reached\n{}",
                crashed.stderr
            );
            // An s3 intent is stale at once with a lease of 0.
            f.distributor(&args, &[("DISTRIBUTOR_S3_LEASE_SECS", "0")])
                .expect_code(0);
            assert_eq!(
                f.recorded(),
                ["blog/post.md", "s3/a.md"],
                "{backend:?} {point}"
            );
            assert!(!f.holds("s1") && !f.holds("s2"), "{backend:?} {point}");
            let v = f.json("verify", "reports", &["--all-owners"], 0);
            assert_eq!(v["checked"], 2, "{backend:?} {point}");
            let v = f.json("reconcile-state", "reports", &["--dry-run"], 0);
            assert_eq!(
                strings(&v["unmanaged"]),
                ["stray.txt"],
                "{backend:?} {point}"
            );
            if let Some(bucket) = &f.bucket {
                assert_eq!(bucket.pending(), Vec::<String>::new(), "{point}");
            }
        }
    });
}

// -- a local root only ---------------------------------------------------

/// A managed file replaced by a symlink: `prune --apply` removes the link,
/// never its target. The command that wrote took the root's lock (and so
/// made its lock file).
#[test]
fn prune_apply_removes_a_link_never_its_target() {
    let f = populated(Backend::Local);
    let outside = tempfile::tempdir().unwrap();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    std::fs::remove_file(f.root().join("s1/a.md")).unwrap();
    std::os::unix::fs::symlink(&precious, f.root().join("s1/a.md")).unwrap();

    let v = f.json("prune", "reports", &["--apply"], 0);
    assert_eq!(strings(&v["deletes"]), OLD_SOURCES);
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(!f.root().join("s1").exists(), "emptied folders are removed");
    assert!(f.root().join(".distributor.lock").exists());
    assert_eq!(f.recorded(), ["blog/post.md", "s3/a.md"]);
}

/// A root folder that does not exist is reported as holding nothing, and
/// is not created.
#[test]
fn a_missing_root_folder_reports_nothing_managed_and_is_not_created() {
    let f = Fixture::new(Backend::Local);
    let v = f.json("prune", "reports", &["--apply"], 0);
    assert!(strings(&v["deletes"]).is_empty());
    let v = f.json("reconcile-state", "reports", &[], 0);
    assert!(strings(&v["missing"]).is_empty() && strings(&v["unmanaged"]).is_empty());
    let v = f.json("verify", "reports", &["--all-owners"], 0);
    assert_eq!(
        (v["ok"].clone(), v["checked"].clone()),
        (true.into(), 0.into())
    );
    assert!(
        f.json("catalog", "reports", &[], 0)["outputs"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(!f.root().exists(), "the root is not created");
}
