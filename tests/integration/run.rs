//! `distributor run` into a local root: the planning actions, reports and
//! options as an operator sees them (files on disk, catalog records, exit
//! code and the `--json` document). The scenarios every backend shares
//! (publish, skip, replace, refuse, dry run) are in `matrix`; what stays
//! here is about a local root or not yet run on s3.

use crate::util::{Kind, Test, assert_catalog_matches_disk, is_reserved, sha256, strings};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// One pipeline `reports` with one destination `site` at `./site`.
fn single(workflow: &str) -> Test {
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
        workflow: {workflow}
        links:
          base_url: https://example.com/archive
"
    ));
    t
}

#[test]
fn fail_unmanaged_for_a_stray_file_where_a_folder_must_go() {
    let t = single("additive");
    let b1 = t.bundle("rep.1", &[("a.txt", "a")]);
    let b2 = t.bundle("rep.2", &[("sub/b.txt", "b")]);
    t.publish("reports", &b1, &[]).expect_code(0);
    t.write("site/sub", "a file, not a folder");
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(3);
    assert_eq!(out.dest()["action"], "fail_unmanaged");
    assert_eq!(strings(&out.dest()["unmanaged"]), ["sub"]);
    assert_eq!(
        fs::read_to_string(t.join("site/sub")).unwrap(),
        "a file, not a folder"
    );
}

#[test]
fn force_replace_clears_unmanaged_content_but_keeps_the_lock_file() {
    let t = single("additive");
    t.write("site/junk/deep/x.txt", "junk");
    t.write("site/y.txt", "stray");
    t.write("site/.distributor.json", "garbage");
    t.write("site/.distributor.lock", "");
    let lock_ino = fs::metadata(t.join("site/.distributor.lock"))
        .unwrap()
        .ino();
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let out = t.publish("reports", &b, &["--force", "--destination", "site"]);
    out.expect_code(0);
    let d = out.dest();
    assert_eq!(d["action"], "force_replace");
    assert_eq!(strings(&d["writes"]), ["a.txt"]);
    assert_eq!(strings(&d["deletes"]), ["junk/deep/x.txt", "y.txt"]);
    let lock = fs::metadata(t.join("site/.distributor.lock")).expect("lock file kept");
    assert_eq!(lock.ino(), lock_ino, "the lock file is never replaced");
    let files: Vec<String> = t
        .listing("site")
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    assert_eq!(files, [".distributor.json", ".distributor.lock", "a.txt"]);
    assert_eq!(t.recorded("site").keys().collect::<Vec<_>>(), ["a.txt"]);
    assert_catalog_matches_disk(&t.join("site"));
}

#[test]
fn force_without_destination_is_a_usage_error() {
    let t = single("additive");
    t.write("site/stray.txt", "stray");
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let out = t.publish("reports", &b, &["--force"]);
    out.expect_code(2);
    assert_eq!(out.json()["stage"], "config");
    assert_eq!(
        fs::read_to_string(t.join("site/stray.txt")).unwrap(),
        "stray"
    );
    assert!(!t.join("site/a.txt").exists());
}

const LEGACY: &str = r#"{
  "schema_version": 1,
  "pipeline_id": "reports",
  "destination_id": "site",
  "outputs": [{"path": "report.md", "kind": "source", "sha256": "sha256:...", "size": 3}]
}
"#;

#[test]
fn legacy_state_additive_overwrites_planned_paths_and_keeps_the_rest_unrecorded() {
    let t = single("additive");
    t.write("site/.distributor.json", LEGACY);
    t.write("site/report.md", "old");
    t.write("site/old/page.html", "left behind");
    let b = t.bundle("rep.1", &[("report.md", "new report"), ("extra.txt", "e")]);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(0);
    assert_eq!(out.dest()["action"], "upsert_additive");
    assert_eq!(
        fs::read_to_string(t.join("site/report.md")).unwrap(),
        "new report"
    );
    assert_eq!(
        fs::read_to_string(t.join("site/old/page.html")).unwrap(),
        "left behind"
    );
    let state = t.state("site");
    assert_eq!(state["schema_version"], 4);
    assert_eq!(
        t.recorded("site").keys().collect::<Vec<_>>(),
        ["extra.txt", "report.md"]
    );
}

#[test]
fn legacy_state_replacement_clears_the_root() {
    let t = single("replacement");
    t.write("site/.distributor.json", LEGACY);
    t.write("site/report.md", "old");
    t.write("site/old/page.html", "old page");
    t.mkdir("site/empty");
    let b = t.bundle("rep.1", &[("report.md", "new report")]);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(0);
    assert_eq!(out.dest()["action"], "replace_catalog");
    let left: Vec<String> = t
        .listing("site")
        .into_iter()
        .filter(|p| !is_reserved(p) && !p.is_empty())
        .collect();
    assert_eq!(left, ["report.md"]);
    assert_eq!(
        fs::read_to_string(t.join("site/report.md")).unwrap(),
        "new report"
    );
    assert_eq!(t.state("site")["schema_version"], 4);
    assert_eq!(t.recorded("site").keys().collect::<Vec<_>>(), ["report.md"]);
}

/// Clearing a root is a deletion, and §7 allows none before the bundle is
/// known good: a tampered file, found only while copying, must not leave a
/// cleared root behind (force over any root, replacement over legacy state).
#[test]
fn a_tampered_bundle_clears_nothing_before_it_is_refused() {
    for (workflow, legacy, args) in [
        ("additive", false, &["--force", "--destination", "site"][..]),
        ("replacement", true, &[][..]),
    ] {
        let t = single(workflow);
        if legacy {
            t.write("site/.distributor.json", LEGACY);
            // Planning takes the lock; only its file is created (as the
            // agent makes it: no access for others, or the lock narrows it).
            t.write("site/.distributor.lock", "");
            fs::set_permissions(
                t.join("site/.distributor.lock"),
                std::os::unix::fs::PermissionsExt::from_mode(0o640),
            )
            .unwrap();
            // A folder where a planned file goes is cleared first.
            t.write("site/b.txt/inner.txt", "in the way");
        } else {
            let b0 = t.bundle("rep.0", &[("kept.txt", "kept")]);
            t.publish("reports", &b0, &[]).expect_code(0);
        }
        t.write("site/report.md", "old");
        t.write("site/old/page.html", "old page");
        let before = t.tree("site");
        let b = t.bundle("rep.1", &[("report.md", "new report"), ("b.txt", "bbbb")]);
        // The same size: found only by hashing.
        fs::write(b.join("b.txt"), "xxxx").unwrap();
        let out = t.publish("reports", &b, args);
        out.expect_code(1);
        assert_eq!(out.json()["stage"], "verify", "{workflow}");
        assert_eq!(t.tree("site"), before, "{workflow}: the root changed");
    }
}

/// Replacement deletes the files its owner no longer publishes; a folder
/// someone put where one of them was is theirs, and stays whole.
#[test]
fn replacement_leaves_a_folder_put_where_a_recorded_file_was() {
    let t = single("replacement");
    let b1 = t.bundle("rep.1", &[("a.txt", "a"), ("b.txt", "b")]);
    t.publish("reports", &b1, &[]).expect_code(0);
    fs::remove_file(t.join("site/b.txt")).unwrap();
    t.write("site/b.txt/mine.txt", "someone else's");
    let b2 = t.bundle("rep.2", &[("a.txt", "a2")]);
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(0);
    assert_eq!(strings(&out.dest()["deletes"]), ["b.txt"]);
    assert!(
        out.stderr.contains("b.txt: a folder with content"),
        "{}",
        out.stderr
    );
    assert_eq!(
        fs::read_to_string(t.join("site/b.txt/mine.txt")).unwrap(),
        "someone else's"
    );
    assert_eq!(t.recorded("site").keys().collect::<Vec<_>>(), ["a.txt"]);
}

#[test]
fn dry_run_creates_no_root_and_no_lock_file() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./deep/site
",
    );
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let out = t.publish("reports", &b, &["--dry-run"]);
    out.expect_code(0);
    assert_eq!(out.dest()["action"], "publish_new");
    assert_eq!(strings(&out.dest()["writes"]), ["a.txt"]);
    assert!(
        !t.join("deep").exists(),
        "no root (nor its parent) is created"
    );

    t.mkdir("deep/site");
    let before = t.tree("deep");
    t.publish("reports", &b, &["--dry-run"]).expect_code(0);
    assert_eq!(t.tree("deep"), before, "no lock file, no temporary file");
    assert!(!t.join("deep/site/.distributor.lock").exists());
}

#[test]
fn usage_and_config_errors_exit_2() {
    let t = single("additive");
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let out = t.publish("nope", &b, &[]);
    out.expect_code(2);
    assert_eq!(out.json()["stage"], "config");
    let out = t.publish("reports", &b, &["--destination", "nope"]);
    out.expect_code(2);
    assert_eq!(out.json()["stage"], "config");
    assert!(!t.join("site").exists());

    t.config("pipelines:\n  - id: reports\n    destinations:\n      - id: site\n        path: ./site\n        colour: red\n");
    let out = t.publish("reports", &b, &[]);
    out.expect_code(2);
    assert_eq!(out.json()["stage"], "config");
    assert!(out.json()["error"].as_str().unwrap().contains("colour"));
    assert!(!t.join("site").exists());

    let out = t
        .cmd()
        .args(["--config", "missing.yaml", "run", "--pipeline", "reports"])
        .arg(&b)
        .output();
    out.expect_code(2);
    let out = t.cmd().args(["run", "--pipeline"]).output();
    out.expect_code(2);
}

#[test]
fn json_for_an_unreadable_manifest_has_null_source_and_stage_verify() {
    let t = single("additive");
    t.write("bundles/broken/a.txt", "a");
    t.write("bundles/broken/manifest.json", "{ not json");
    let out = t.publish("reports", &t.join("bundles/broken"), &[]);
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["source"], Value::Null);
    assert_eq!(doc["stage"], "verify");
    assert!(doc["error"].as_str().unwrap().contains("manifest.json"));
    assert!(!t.join("site").exists());

    // No bundle folder at all.
    let out = t.publish("reports", &t.join("bundles/absent"), &[]);
    out.expect_code(1);
    assert_eq!(out.json()["source"], Value::Null);
    assert_eq!(out.json()["stage"], "verify");

    // Readable manifest, bad file: the source is reported.
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    fs::write(b.join("a.txt"), "b").unwrap();
    let doc = t.publish("reports", &b, &[]).json();
    assert_eq!(doc["stage"], "verify");
    assert_eq!(doc["source"]["id"], "rep.1");
    assert!(doc["error"].as_str().unwrap().contains("a.txt"));
}

#[test]
fn outputs_are_0644_and_folders_0755() {
    let t = single("additive");
    let b = t.bundle("rep.1", &[("a.txt", "a"), ("sub/deeper/b.txt", "b")]);
    for p in ["a.txt", "sub/deeper/b.txt"] {
        fs::set_permissions(b.join(p), fs::Permissions::from_mode(0o600)).unwrap();
    }
    let out = t
        .cmd()
        .umask(0o022)
        .args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            "reports",
        ])
        .arg(&b)
        .output();
    out.expect_code(0);
    let tree = t.tree("site");
    for (path, mode) in [
        ("a.txt", 0o644),
        ("sub/deeper/b.txt", 0o644),
        ("sub", 0o755),
        ("sub/deeper", 0o755),
    ] {
        assert_eq!(
            tree.0[path].mode, mode,
            "mode of {path}: {:o}",
            tree.0[path].mode
        );
    }
    assert!(matches!(tree.0["a.txt"].kind, Kind::File { .. }));
}

#[test]
fn text_output_is_a_summary_and_lists_files_only_when_verbose() {
    let t = single("additive");
    let b = t.bundle(
        "rep.1",
        &[("a.txt", "a"), ("b.txt", "bb"), ("c/d.txt", "ddd")],
    );
    let out = t.run(&["run", "--pipeline", "reports", b.to_str().unwrap()]);
    out.expect_code(0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert!(
        lines[0].starts_with("run of pipeline reports: rep.1 created "),
        "{}",
        out.stdout
    );
    assert!(
        lines[1].contains("site (additive, ")
            && lines[1].ends_with("): publish_new, 3 writes, 0 deletes"),
        "{}",
        out.stdout
    );
    assert!(
        lines[2].starts_with("wrote 3 files (6 bytes), deleted 0 files in "),
        "{}",
        out.stdout
    );
    assert_eq!(lines[3], "ok");
    assert!(!out.stdout.contains("a.txt"), "{}", out.stdout);

    // Same bundle again, listing every file.
    let out = t.run(&[
        "run",
        "--verbose",
        "--pipeline",
        "reports",
        b.to_str().unwrap(),
    ]);
    out.expect_code(0);
    assert!(
        out.stdout.contains(": skip_same, 0 writes, 0 deletes"),
        "{}",
        out.stdout
    );
    let b2 = t.bundle("rep.2", &[("a.txt", "new")]);
    let out = t.run(&[
        "run",
        "--verbose",
        "--pipeline",
        "reports",
        b2.to_str().unwrap(),
    ]);
    out.expect_code(0);
    assert!(out.stdout.contains("    write   a.txt\n"), "{}", out.stdout);
    assert!(
        out.stdout.contains("wrote 1 file (3 bytes)"),
        "{}",
        out.stdout
    );
}

#[test]
fn json_output_is_the_same_with_verbose() {
    let t = single("additive");
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let dry = |extra: &[&str]| {
        let mut args = vec!["run", "--json", "--dry-run", "--pipeline", "reports"];
        args.extend_from_slice(extra);
        args.push(b.to_str().unwrap());
        let out = t.run(&args);
        out.expect_code(0);
        out.stdout
    };
    assert_eq!(dry(&[]), dry(&["--verbose"]));
}

#[test]
fn source_and_html_together_give_two_outputs_per_markdown_file() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
        publish:
          source: true
          html: true
      - id: trusting
        path: ./trusting
        publish:
          source: false
          html: true
        html:
          raw_html: allow
",
    );
    let md = "# T\n\n[bad](javascript:alert(1)) <span class=\"k\">raw</span>\n";
    let b = t.bundle("rep.1", &[("x.md", md), ("img.png", "png")]);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(0);
    assert_eq!(
        strings(&out.dest()["writes"]),
        ["img.png", "x.html", "x.md"]
    );
    let recs = t.recorded("site");
    assert_eq!(recs["x.md"]["kind"], "source");
    assert_eq!(recs["x.html"]["kind"], "generated");
    assert_eq!(fs::read_to_string(t.join("site/x.md")).unwrap(), md);
    let escaped = fs::read_to_string(t.join("site/x.html")).unwrap();
    assert!(
        !escaped.contains("javascript:"),
        "neutralised in sanitize mode: {escaped}"
    );
    assert!(
        escaped.contains("<span>raw</span>"),
        "sanitized: the element kept, its class dropped: {escaped}"
    );
    let allowed = fs::read_to_string(t.join("trusting/x.html")).unwrap();
    assert!(
        allowed.contains("<span class=\"k\">raw</span>"),
        "passed through with allow: {allowed}"
    );
    // Rendering is deterministic: the same input gives the same bytes.
    assert_eq!(recs["x.html"]["sha256"], sha256(escaped.as_bytes()));
    let again = t.bundle("rep.2", &[("x.md", md), ("img.png", "png")]);
    t.publish("reports", &again, &[]).expect_code(0);
    assert_eq!(fs::read_to_string(t.join("site/x.html")).unwrap(), escaped);
}

#[test]
fn created_is_reported_in_utc_with_fractions_kept() {
    let t = single("additive");
    let b = t.bundle_at(
        "rep",
        "rep.1",
        "2026-06-04T13:55:00.250+02:00",
        &[("a.txt", "a")],
    );
    let doc = t.publish("reports", &b, &[]).json();
    let created = doc["source"]["created"].as_str().unwrap();
    assert!(
        created.starts_with("2026-06-04T11:55:00.25") && created.ends_with('Z'),
        "{created}"
    );
    assert_eq!(t.recorded("site")["a.txt"]["source"]["created"], created);
}

#[test]
fn a_stricter_umask_is_respected() {
    let t = single("additive");
    let b = t.bundle("rep.1", &[("sub/a.txt", "a")]);
    t.cmd()
        .umask(0o077)
        .args(["--config", "config.yaml", "run", "--pipeline", "reports"])
        .arg(&b)
        .output()
        .expect_code(0);
    let tree = t.tree("site");
    assert_eq!(tree.0["sub/a.txt"].mode, 0o600);
    assert_eq!(tree.0["sub"].mode, 0o700);
}

/// `run` prints its report and, beside it, only warnings and errors; `-v`
/// (or `RUST_LOG`) shows what it does on the way.
#[test]
fn run_logs_only_warnings_unless_verbose() {
    let t = single("additive");
    let quiet = |args: &[&str]| {
        let out = std::process::Command::new(crate::util::BIN)
            .current_dir(t.path())
            .env_remove("RUST_LOG")
            .env_remove("DISTRIBUTOR_CONFIG")
            .args(["--config", "config.yaml", "run", "--pipeline", "reports"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let b = t.bundle("rep.1", &[("a.txt", "a\n")]);
    let stderr = quiet(&[b.to_str().unwrap()]);
    assert!(!stderr.contains(" INFO "), "{stderr}");
    let b2 = t.bundle("rep.2", &[("b.txt", "b\n")]);
    let stderr = quiet(&["-v", b2.to_str().unwrap()]);
    assert!(stderr.contains(" INFO "), "-v shows info lines: {stderr}");
}

/// A publication of 20 files (staged beside their targets) into a root
/// whose catalog holds 2,500 records copies the text of every record it
/// leaves alone rather than formatting it again, and the catalog it
/// writes holds exactly the records it held before plus the new ones.
#[test]
fn a_small_change_into_a_large_catalog_copies_the_records_it_leaves() {
    let t = single("additive");
    let big: Vec<(String, String)> = (0..2500)
        .map(|i| (format!("old/{:02}/f{i:04}.txt", i % 50), format!("{i}\n")))
        .collect();
    let b = t.bundle("big", &big);
    t.publish("reports", &b, &[]).expect_code(0);
    let before = t.recorded("site");
    assert_eq!(before.len(), 2500);
    let catalog = fs::metadata(t.join("site/.distributor.json"))
        .unwrap()
        .len();
    assert!(catalog >= 1 << 20, "the catalog is read ahead: {catalog}");

    let small: Vec<(String, String)> = (0..20)
        .map(|i| (format!("new/n{i:02}.txt"), format!("new {i}\n")))
        .collect();
    let b = t.bundle("small", &small);
    let mut cmd = t.cmd();
    cmd.env("RUST_LOG", "distributor::catalog=debug")
        .args(["--config", "config.yaml", "run", "--pipeline", "reports"])
        .arg(&b);
    let out = cmd.output();
    out.expect_code(0);
    assert!(
        out.stderr
            .contains("catalog written: 20 of 2520 records formatted"),
        "{}",
        out.stderr
    );
    let after = t.recorded("site");
    assert_eq!(after.len(), 2520);
    for (path, record) in &before {
        assert_eq!(after.get(path), Some(record), "{path}");
    }
    for (path, body) in &small {
        assert_eq!(after[path]["sha256"], sha256(body.as_bytes()), "{path}");
    }
    assert_catalog_matches_disk(&t.join("site"));
}
