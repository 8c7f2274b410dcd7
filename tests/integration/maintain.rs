//! `prune`, `reconcile-state`, `verify` and `catalog` against real roots
//! built with `distributor run`. Self-contained: its own small fixture.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Two pipelines share one root: `reports/site` (prefix `{source_id}/`,
/// pruned after a day, keeping the newest source) and `blog/site`
/// (prefix `blog/`, no retention policy).
const CONFIG: &str = r#"
spool: ./spool
agent:
  lock_timeout: 20s
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./root
        prefix: "{source_id}/"
        retention:
          prune:
            max_age: 1d
            keep_latest: 1
  - id: blog
    destinations:
      - id: site
        path: ./root
        prefix: "blog/"
"#;

const OLD: &str = "2026-01-01T00:00:00Z";

struct Fixture {
    dir: tempfile::TempDir,
}

/// What a command printed and how it exited.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\n{}",
                self.stdout, self.stderr
            )
        })
    }

    fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn ran(out: Output) -> Ran {
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), CONFIG).unwrap();
        Fixture { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    fn distributor(&self, args: &[&str]) -> Ran {
        let out = Command::new(env!("CARGO_BIN_EXE_distributor"))
            .arg("--config")
            .arg(self.config())
            .args(args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        ran(out)
    }

    /// Runs a maintenance command for `pipeline`/site with `extra` flags.
    fn maintain(&self, command: &str, pipeline: &str, extra: &[&str]) -> Ran {
        let mut args = vec![command, "--pipeline", pipeline, "--destination", "site"];
        args.extend_from_slice(extra);
        self.distributor(&args)
    }

    /// Like [`Fixture::maintain`] with `--json`, expecting exit `code`.
    fn json(&self, command: &str, pipeline: &str, extra: &[&str], code: i32) -> Value {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let r = self.maintain(command, pipeline, &extra);
        assert_eq!(r.code, code, "{command} {extra:?}: {}", r.both());
        r.json()
    }

    /// Seals a bundle `id` created at `created` holding `files`.
    fn bundle(&self, id: &str, created: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.dir.path().join("bundles").join(id);
        for (path, text) in files {
            let full = dir.join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, text).unwrap();
        }
        let out = Command::new(env!("CARGO_BIN_EXE_distributor"))
            .args(["bundle", "seal"])
            .arg(&dir)
            .args(["--id", id, "--created", created])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", ran(out).both());
        dir
    }

    /// Publishes a bundle through `run` and expects success.
    fn publish(&self, pipeline: &str, bundle: &Path) {
        let r = self.distributor(&["run", "--pipeline", pipeline, bundle.to_str().unwrap()]);
        assert_eq!(r.code, 0, "run {}: {}", bundle.display(), r.both());
    }

    fn state_path(&self) -> PathBuf {
        self.root().join(".distributor.json")
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.state_path()).unwrap()).unwrap()
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
        std::fs::write(self.state_path(), text).unwrap();
    }

    /// Every entry under the root with its kind and (files) bytes.
    fn snapshot(&self) -> BTreeMap<String, String> {
        fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                let path = format!("{prefix}{name}");
                let meta = std::fs::symlink_metadata(entry.path()).unwrap();
                if meta.is_dir() {
                    out.insert(path.clone(), "dir".to_owned());
                    walk(&entry.path(), &format!("{path}/"), out);
                } else if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(entry.path()).unwrap();
                    out.insert(path, format!("link {}", target.display()));
                } else {
                    let bytes = std::fs::read(entry.path()).unwrap();
                    out.insert(path, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
        let mut out = BTreeMap::new();
        if self.root().exists() {
            walk(&self.root(), "", &mut out);
        }
        out
    }

    fn write(&self, path: &str, text: &str) {
        let full = self.root().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, text).unwrap();
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Three `reports` sources (s1 oldest .. s3 newest by `created`, published
/// out of order), one `blog` source, and a stray unmanaged file; every
/// record aged so that it is past `max_age`.
fn populated() -> Fixture {
    let f = Fixture::new();
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
    let f = populated();
    let before = f.snapshot();
    let v = f.json("prune", "reports", &["--dry-run"], 0);
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["pipeline_id"], "reports");
    assert_eq!(v["destination_id"], "site");
    assert_eq!(strings(&v["deletes"]), OLD_SOURCES);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["deletes", "destination_id", "dry_run", "pipeline_id"]
    );
    assert_eq!(f.snapshot(), before);

    let text = f.maintain("prune", "reports", &["--dry-run"]);
    assert_eq!(text.code, 0, "{}", text.both());
    assert!(text.stdout.contains("s2/sub/c.txt"), "{}", text.stdout);
    assert_eq!(f.snapshot(), before);
}

#[test]
fn prune_apply_deletes_exactly_the_selection() {
    let f = populated();
    let outside = tempfile::tempdir().unwrap();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    // A managed file replaced by a symlink: the link goes, never its target.
    std::fs::remove_file(f.root().join("s1/a.md")).unwrap();
    std::os::unix::fs::symlink(&precious, f.root().join("s1/a.md")).unwrap();
    let created_at = f.state()["created_at"].clone();

    let v = f.json("prune", "reports", &["--apply"], 0);
    assert_eq!(v["dry_run"], false);
    assert_eq!(strings(&v["deletes"]), OLD_SOURCES);

    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(!f.root().join("s1").exists(), "emptied folders are removed");
    assert!(!f.root().join("s2").exists());
    assert_eq!(
        std::fs::read_to_string(f.root().join("s3/a.md")).unwrap(),
        "three"
    );
    assert_eq!(
        std::fs::read_to_string(f.root().join("blog/post.md")).unwrap(),
        "post"
    );
    assert_eq!(
        std::fs::read_to_string(f.root().join("stray.txt")).unwrap(),
        "not ours"
    );
    assert!(f.root().join(".distributor.lock").exists());
    assert_eq!(f.recorded(), ["blog/post.md", "s3/a.md"]);
    let state = f.state();
    assert_eq!(state["created_at"], created_at);
    assert_ne!(state["updated_at"], OLD);

    // The catalog matches the disk, and a second prune has nothing to do.
    let v = f.json("verify", "reports", &["--all-owners"], 0);
    assert_eq!(v["ok"], true);
    assert_eq!(v["checked"], 2);
    let v = f.json("prune", "reports", &["--apply"], 0);
    assert!(strings(&v["deletes"]).is_empty());
}

#[test]
fn keep_latest_protects_the_newest_source_by_created_not_by_publication() {
    let f = Fixture::new();
    // Published newest-first: the last publication is the oldest source.
    let new = f.bundle("new", "2026-03-01T00:00:00Z", &[("x.md", "new")]);
    let old = f.bundle("old", "2026-02-01T00:00:00Z", &[("x.md", "old")]);
    f.publish("reports", &new);
    f.publish("reports", &old);
    f.age("", OLD);
    let v = f.json("prune", "reports", &["--apply"], 0);
    assert_eq!(strings(&v["deletes"]), ["old/x.md"]);
    assert_eq!(f.recorded(), ["new/x.md"]);
    // The only source left is the newest one: never pruned, however old.
    let v = f.json("prune", "reports", &["--apply"], 0);
    assert!(strings(&v["deletes"]).is_empty());
}

#[test]
fn prune_leaves_recent_outputs_alone() {
    let f = Fixture::new();
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
        "nothing pruned, catalog not rewritten"
    );
}

#[test]
fn prune_without_a_retention_policy_exits_2() {
    let f = populated();
    let before = f.snapshot();
    for flag in ["--dry-run", "--apply"] {
        let r = f.maintain("prune", "blog", &[flag]);
        assert_eq!(r.code, 2, "{}", r.both());
        assert!(r.both().contains("retention"), "{}", r.both());
    }
    assert_eq!(f.snapshot(), before);
}

#[test]
fn reconcile_reports_and_drops_missing_records_by_scope() {
    let f = populated();
    std::fs::remove_file(f.root().join("s2/a.md")).unwrap();
    std::fs::remove_file(f.root().join("blog/post.md")).unwrap();
    f.write("s3/extra.txt", "stray");
    f.write("loose/only/junk.bin", "junk");
    std::fs::create_dir_all(f.root().join("empty/deeper")).unwrap();
    // An empty folder is content too, even one a deleted output left behind.
    let unmanaged = [
        "blog",
        "empty/deeper",
        "loose/only/junk.bin",
        "s3/extra.txt",
        "stray.txt",
    ];

    let before = f.snapshot();
    let v = f.json("reconcile-state", "reports", &["--dry-run"], 0);
    assert_eq!(v["dry_run"], true);
    assert_eq!(strings(&v["missing"]), ["s2/a.md"]);
    assert_eq!(strings(&v["unmanaged"]), unmanaged);
    assert_eq!(v["removed_records"], 0);
    let v = f.json(
        "reconcile-state",
        "reports",
        &["--dry-run", "--all-owners"],
        0,
    );
    assert_eq!(strings(&v["missing"]), ["blog/post.md", "s2/a.md"]);
    assert_eq!(f.snapshot(), before, "dry runs change nothing");

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
    for path in unmanaged {
        assert!(f.root().join(path).exists(), "{path}");
    }
    let v = f.json("reconcile-state", "reports", &["--all-owners"], 0);
    assert!(strings(&v["missing"]).is_empty());
    assert_eq!(v["removed_records"], 0);
    assert_eq!(
        f.json("verify", "reports", &["--all-owners"], 0)["ok"],
        true
    );
}

#[test]
fn verify_reports_corrupted_truncated_and_deleted_outputs() {
    let f = populated();
    let clean = f.json("verify", "reports", &[], 0);
    assert_eq!(clean["ok"], true);
    assert_eq!(clean["checked"], 5);
    assert!(strings(&clean["missing"]).is_empty());
    let text = f.maintain("verify", "reports", &["--all-owners"]);
    assert_eq!(text.code, 0, "{}", text.both());

    f.write("s1/a.md", "ONE"); // same size, other bytes
    f.write("s2/a.md", "tw"); // truncated
    std::fs::remove_file(f.root().join("s3/a.md")).unwrap();
    f.write("blog/post.md", "POST");
    let before = f.snapshot();

    let v = f.json("verify", "reports", &[], 1);
    assert_eq!(v["ok"], false);
    assert_eq!(v["checked"], 5);
    assert_eq!(strings(&v["missing"]), ["s3/a.md"]);
    assert_eq!(strings(&v["mismatched"]), ["s1/a.md", "s2/a.md"]);
    let v = f.json("verify", "reports", &["--all-owners"], 1);
    assert_eq!(v["checked"], 6);
    assert_eq!(
        strings(&v["mismatched"]),
        ["blog/post.md", "s1/a.md", "s2/a.md"]
    );
    let text = f.maintain("verify", "reports", &[]);
    assert_eq!(text.code, 1, "{}", text.both());
    assert!(text.stdout.contains("s3/a.md"), "{}", text.stdout);
    assert_eq!(f.snapshot(), before, "verify changes nothing");

    // Another owner's damage does not fail a scoped verify.
    let f = populated();
    f.write("blog/post.md", "POST");
    assert_eq!(f.json("verify", "reports", &[], 0)["ok"], true);
    assert_eq!(f.json("verify", "blog", &[], 1)["ok"], false);
}

#[test]
fn catalog_lists_every_record_of_the_root() {
    let f = populated();
    let v = f.json("catalog", "blog", &[], 0);
    assert_eq!(v["root"].as_str().unwrap(), f.root().display().to_string());
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
        outputs[0],
        f.state()["outputs"][0],
        "records exactly as stored"
    );
    assert_eq!(outputs[5]["source"]["created"], "2026-01-02T23:00:00Z");

    let text = f.maintain("catalog", "reports", &[]);
    assert_eq!(text.code, 0, "{}", text.both());
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
}

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
    for (name, text) in states {
        let f = populated();
        std::fs::write(f.state_path(), text).unwrap();
        let before = f.snapshot();
        let commands: [(&str, &[&str]); 7] = [
            ("prune", &["--dry-run"]),
            ("prune", &["--apply"]),
            ("reconcile-state", &["--dry-run"]),
            ("reconcile-state", &["--all-owners"]),
            ("verify", &[]),
            ("verify", &["--all-owners"]),
            ("catalog", &[]),
        ];
        for (command, extra) in commands {
            for json in [false, true] {
                let mut args = extra.to_vec();
                if json {
                    args.push("--json");
                }
                let r = f.maintain(command, "reports", &args);
                assert_eq!(r.code, 3, "{name} {command} {args:?}: {}", r.both());
                let message = r.both();
                assert!(
                    message.contains(&f.root().display().to_string()),
                    "{name} {command}: message names the root: {message}"
                );
                if name == "legacy" {
                    assert!(message.contains("next publication"), "{message}");
                }
                assert_eq!(
                    f.snapshot(),
                    before,
                    "{name} {command} {args:?} changed the root"
                );
            }
        }
    }
}

#[test]
fn a_root_without_catalog_reports_nothing_managed_and_creates_nothing() {
    // No root at all.
    let f = Fixture::new();
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

    // A root with content but no catalog and no lock file.
    f.write("index.html", "hand made");
    f.write("docs/a.txt", "a");
    let before = f.snapshot();
    for (command, extra) in [
        ("prune", &["--dry-run"][..]),
        ("prune", &["--apply"]),
        ("reconcile-state", &["--dry-run"]),
        ("reconcile-state", &[]),
        ("verify", &[]),
        ("catalog", &[]),
    ] {
        let v = f.json(command, "reports", extra, 0);
        if command == "reconcile-state" {
            assert_eq!(strings(&v["unmanaged"]), ["docs/a.txt", "index.html"]);
            assert_eq!(v["removed_records"], 0);
        }
    }
    assert_eq!(
        f.snapshot(),
        before,
        "no lock file, no catalog, nothing else"
    );
}

#[test]
fn prune_apply_racing_publications_loses_no_record() {
    for round in 0..3 {
        let f = Fixture::new();
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
                let r = f.maintain("prune", "reports", &["--apply", "--json"]);
                assert_eq!(r.code, 0, "{}", r.both());
            }
            publisher.join().unwrap();
        });
        f.json("prune", "reports", &["--apply"], 0);

        // Every fresh output is recorded and on disk; the old ones are gone.
        let mut want: Vec<String> = (0..4)
            .flat_map(|i| [format!("new{i}/a.md"), format!("new{i}/deep/b.txt")])
            .collect();
        want.sort();
        assert_eq!(f.recorded(), want, "round {round}");
        for i in 0..3 {
            assert!(!f.root().join(format!("old{i}")).exists(), "round {round}");
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
}
