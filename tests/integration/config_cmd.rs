//! `distributor config check`: the summary and every kind of rejection.

use crate::util::Test;

fn check(t: &Test, yaml: &str) -> crate::util::Output {
    t.config(yaml);
    t.run(&["config", "check"])
}

#[test]
fn check_prints_the_resolved_summary() {
    let t = Test::new();
    let out = check(
        &t,
        "spool: ./spool
agent:
  lock_timeout: 5s
pipelines:
  - id: reports
    inbox: ./in/reports
    destinations:
      - id: site
        path: ./roots/site
        workflow: replacement
        prefix: \"{source_id}/\"
",
    );
    out.expect_code(0);
    let root = t.join("roots/site");
    let inbox = t.join("in/reports");
    for needle in [
        "reports",
        "site",
        "replacement",
        "{source_id}/",
        root.to_str().unwrap(),
        inbox.to_str().unwrap(),
        // Serving a root keeps the tool's files private.
        "hint: each root holds the tool's own .distributor* files",
        "docs/serving.md",
    ] {
        assert!(
            out.stdout.contains(needle),
            "summary mentions {needle}:\n{}",
            out.stdout
        );
    }

    let out = t.run(&["config", "check", "--json"]);
    out.expect_code(0);
    let doc = out.json();
    assert_eq!(doc["ok"], true);
    assert!(
        doc["hints"][0]
            .as_str()
            .unwrap()
            .contains("docs/serving.md")
    );
    assert_eq!(doc["pipelines"][0]["id"], "reports");
    assert_eq!(
        doc["pipelines"][0]["destinations"][0]["workflow"],
        "replacement"
    );
    assert_eq!(
        doc["pipelines"][0]["destinations"][0]["root"],
        root.to_str().unwrap()
    );
}

#[test]
fn config_is_found_through_the_environment() {
    let t = Test::new();
    t.write(
        "elsewhere/c.yaml",
        "pipelines:\n  - id: from-env\n    destinations:\n      - id: d\n        path: ./r\n",
    );
    let out = t
        .cmd()
        .args(["config", "check"])
        .env("DISTRIBUTOR_CONFIG", t.join("elsewhere/c.yaml"))
        .output();
    out.expect_code(0);
    assert!(out.stdout.contains("from-env"), "{}", out.stdout);
    assert!(
        out.stdout.contains(t.join("elsewhere/r").to_str().unwrap()),
        "relative to the config file: {}",
        out.stdout
    );
}

#[test]
fn unknown_key_is_rejected_with_line_and_column() {
    let t = Test::new();
    let out = check(
        &t,
        "pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
        colour: red
",
    );
    out.expect_code(2);
    let msg = out.all();
    assert!(msg.contains("colour"), "{msg}");
    assert!(msg.contains("line 6"), "{msg}");
    assert!(msg.contains("column 9"), "{msg}");
}

#[test]
fn retired_keys_point_to_workflow() {
    let yamls = [
        (
            "takeover",
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ./r\n        takeover:\n          mode: replace\n",
        ),
        (
            "state",
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ./r\n        state:\n          mode: catalog\n",
        ),
        (
            "reconciliation",
            "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ./r\n        reconciliation: strict\n",
        ),
        ("transfer", "transfer: {}\npipelines: []\n"),
    ];
    for (key, yaml) in yamls {
        let t = Test::new();
        let out = check(&t, yaml);
        out.expect_code(2);
        let msg = out.all();
        assert!(msg.contains(key), "{key}: {msg}");
        assert!(
            msg.contains("workflow"),
            "{key}: message points to workflow: {msg}"
        );
    }
}

#[test]
fn duplicate_ids_are_rejected() {
    let yamls = [
        "pipelines:\n  - id: a\n    destinations:\n      - id: d\n        path: ./x\n  - id: a\n    destinations:\n      - id: d\n        path: ./y\n",
        "pipelines:\n  - id: a\n    destinations:\n      - id: d\n        path: ./x\n      - id: d\n        path: ./y\n",
    ];
    for yaml in yamls {
        let t = Test::new();
        let out = check(&t, yaml);
        out.expect_code(2);
        assert!(
            out.all().contains("\"a\"") || out.all().contains("\"d\""),
            "{}",
            out.all()
        );
    }
    // The same destination id in two pipelines is fine.
    let t = Test::new();
    check(
        &t,
        "pipelines:\n  - id: a\n    destinations:\n      - id: d\n        path: ./x\n  - id: b\n    destinations:\n      - id: d\n        path: ./y\n",
    )
    .expect_code(0);
}

#[test]
fn other_bad_configs_exit_2() {
    let bad = [
        "pipelines: [\n",
        "pipelines:\n  - id: -bad\n    destinations:\n      - id: d\n        path: ./x\n",
        "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ./x\n        workflow: sometimes\n",
        "pipelines:\n  - id: p\n    destinations:\n      - id: d\n        path: ./x\n        prefix: \"../{source_id}\"\n",
        "agent:\n  settle: 5\npipelines: []\n",
        "pipelines:\n  - id: p\n    inbox: ./in\n    destinations:\n      - id: d\n        path: ./x\n  - id: q\n    inbox: ./in\n    destinations:\n      - id: d\n        path: ./y\n",
    ];
    for yaml in bad {
        let t = Test::new();
        let out = check(&t, yaml);
        assert_eq!(out.code, 2, "{yaml}\n{}", out.all());
        assert!(
            !out.stderr.trim().is_empty(),
            "an error is printed for {yaml}"
        );
    }
    let t = Test::new();
    t.cmd()
        .args(["--config", "nope.yaml", "config", "check"])
        .output()
        .expect_code(2);
}

/// An s3 destination: `config check` shows it (text and JSON) and warns
/// without credentials (publishing to it: `s3_publish.rs`).
#[test]
fn check_shows_an_s3_destination_and_warns_without_credentials() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: web
        backend: s3
        bucket: reports
        path: site/archive/
        endpoint: http://127.0.0.1:8333
",
    );
    let out = t
        .cmd()
        .args(["--config", "config.yaml", "config", "check"])
        .env("AWS_ACCESS_KEY_ID", "")
        .output();
    out.expect_code(0);
    for needle in [
        "backend: s3",
        "bucket: reports",
        "path: site/archive",
        "endpoint: http://127.0.0.1:8333",
        "region: us-east-1",
        "warning: destination \"web\" of pipeline \"reports\" publishes to s3://reports/site/archive at http://127.0.0.1:8333 but AWS_ACCESS_KEY_ID is not set",
    ] {
        assert!(out.stdout.contains(needle), "{needle}:\n{}", out.stdout);
    }
    let doc = t
        .cmd()
        .args(["--config", "config.yaml", "config", "check", "--json"])
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .output()
        .json();
    let d = &doc["pipelines"][0]["destinations"][0];
    assert_eq!(d["backend"], "s3");
    assert_eq!(d["bucket"], "reports");
    assert_eq!(d["path"], "site/archive");
    assert_eq!(d["endpoint"], "http://127.0.0.1:8333");
    assert_eq!(d["region"], "us-east-1");
    assert_eq!(doc["warnings"], serde_json::json!([]));

    assert!(!t.join("spool").exists(), "config check creates nothing");
}

/// An inbox on another file system than its spool: bundles could not be
/// moved by rename, so the agent refuses to start. `config check` says so
/// first (exit 2), and the agent's refusal is exit 2 too, which the
/// packaged unit does not restart on (`RestartPreventExitStatus=2`).
#[test]
fn an_inbox_on_another_file_system_than_its_spool_is_refused_before_start() {
    use std::os::unix::fs::MetadataExt;
    let t = Test::new();
    let shm = std::path::Path::new("/dev/shm");
    let same = std::fs::metadata(shm)
        .and_then(|a| Ok(a.dev() == std::fs::metadata(t.path())?.dev()))
        .unwrap_or(true);
    if same {
        eprintln!("skipped: no /dev/shm on another file system than the test folder");
        return;
    }
    let inbox = tempfile::Builder::new()
        .prefix("distributor-inbox-")
        .tempdir_in(shm)
        .unwrap();
    let yaml = format!(
        "spool: ./spool
pipelines:
  - id: reports
    inbox: {}
    destinations:
      - id: site
        path: ./site
",
        inbox.path().display()
    );
    let out = check(&t, &yaml);
    out.expect_code(2);
    assert!(
        out.stderr.contains("pipeline reports: its inbox")
            && out
                .stderr
                .contains("is on another file system than its spool"),
        "{}",
        out.stderr
    );
    let json = t.run(&["config", "check", "--json"]);
    json.expect_code(2);
    assert_eq!(json.json()["ok"], false);
    let agent = t.run(&["agent", "--once"]);
    agent.expect_code(2);
    assert!(
        agent.stderr.contains("different file systems"),
        "{}",
        agent.stderr
    );
}

/// Two pipelines `reports` and `docs`, destinations `www` and `site`, with
/// these keys (root and scope, each line indented by the caller's 8).
fn sharing(www: &str, site: &str) -> String {
    format!(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: www
{www}  - id: docs
    destinations:
      - id: site
{site}"
    )
}

/// Pipelines that share a destination root (docs/contract.md §17.2):
/// `config check` names both destinations with their roots and the fix,
/// exits 0, and 1 with `--strict`; `--json` lists the pair.
#[test]
fn pipelines_sharing_a_root_without_disjoint_scopes_are_warned_about() {
    // (www's keys, site's keys, site's root below the test folder, where
    // site's root lies in www's)
    let cases = [
        (
            "        path: ./www\n",
            "        path: ./www\n",
            "www",
            None,
        ),
        (
            "        path: ./www\n",
            "        path: ./www/docs\n",
            "www/docs",
            Some("docs"),
        ),
        (
            "        path: ./www\n        scope: [\"docs/\"]\n",
            "        path: ./www/docs\n        scope: [\"a/\"]\n",
            "www/docs",
            Some("docs"),
        ),
        (
            "        path: ./www\n        scope: [\"reports/\", \"index.html\"]\n",
            "        path: ./www\n        scope: [\"docs/\", \"index.html\"]\n",
            "www",
            None,
        ),
    ];
    for (www, site, site_root, inside) in cases {
        let t = Test::new();
        let out = check(&t, &sharing(www, site));
        out.expect_code(0);
        let www_root = t.join("www");
        let site_root = t.join(site_root);
        let warning = out
            .stdout
            .lines()
            .find(|l| l.contains("and their scopes overlap"))
            .unwrap_or_else(|| panic!("{www}{site}: no warning:\n{}", out.stdout));
        for want in [
            "warning: destination \"www\" of pipeline \"reports\"".to_owned(),
            format!("(root {})", www_root.display()),
            "destination \"site\" of pipeline \"docs\"".to_owned(),
            format!("(root {})", site_root.display()),
            "give each destination a scope".to_owned(),
        ] {
            assert!(warning.contains(&want), "{want:?} not in {warning}");
        }
        let harm = match inside {
            None => "each pipeline can overwrite and take over the other's outputs",
            Some(_) => "lie one inside the other",
        };
        assert!(warning.contains(harm), "{warning}");

        let strict = t.run(&["config", "check", "--strict"]);
        strict.expect_code(1);
        assert!(
            strict
                .stderr
                .contains("--strict: 1 pair(s) of destinations"),
            "{}",
            strict.stderr
        );

        let json = t.run(&["config", "check", "--json"]);
        json.expect_code(0);
        let doc = json.json();
        assert_eq!(doc["ok"], true);
        let shared = &doc["shared_roots"][0];
        assert_eq!(shared["outer"]["pipeline_id"], "reports", "{shared}");
        assert_eq!(shared["outer"]["destination_id"], "www", "{shared}");
        assert_eq!(shared["inner"]["pipeline_id"], "docs", "{shared}");
        assert_eq!(shared["inner"]["root"], site_root.to_str().unwrap());
        assert_eq!(shared["inside"].as_str(), inside, "{shared}");
        assert!(
            doc["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str() == Some(&warning["warning: ".len()..])),
            "{doc}"
        );
        let json = t.run(&["config", "check", "--json", "--strict"]);
        json.expect_code(1);
        assert_eq!(json.json()["ok"], false);
    }
}

/// Roots that are apart, or shared with scopes that cannot meet, are not
/// warned about, and `--strict` passes.
#[test]
fn disjoint_scopes_on_a_shared_root_pass_the_check() {
    let cases = [
        (
            "        path: ./www\n        scope: [\"reports/\", \"index.html\"]\n",
            "        path: ./www\n        scope: [\"docs/\"]\n",
        ),
        (
            "        path: ./www\n        scope: [\"reports/\"]\n",
            "        path: ./www/docs\n",
        ),
        (
            "        path: ./www\n        scope: [\"docs/b/\"]\n",
            "        path: ./www/docs\n        scope: [\"a/\"]\n",
        ),
        ("        path: ./www\n", "        path: ./www2\n"),
    ];
    for (www, site) in cases {
        let t = Test::new();
        let out = check(&t, &sharing(www, site));
        out.expect_code(0);
        assert!(
            !out.stdout.contains("warning:"),
            "{www}{site}\n{}",
            out.stdout
        );
        t.run(&["config", "check", "--strict"]).expect_code(0);
        let doc = t.run(&["config", "check", "--json"]).json();
        assert_eq!(doc["shared_roots"], serde_json::json!([]));
        assert_eq!(doc["warnings"], serde_json::json!([]));
    }
}

/// `scope` shows in the summary; a bad entry is a configuration error
/// (exit 2) naming the entry, its line and what a valid one looks like.
#[test]
fn scope_is_shown_and_a_bad_one_is_a_config_error() {
    let t = Test::new();
    let out = check(
        &t,
        &sharing(
            "        path: ./www\n        scope: [\"reports/\", \"index.html\"]\n",
            "        path: ./site\n",
        ),
    );
    out.expect_code(0);
    assert!(
        out.stdout
            .contains("      scope: [\"reports/\", \"index.html\"]\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("      scope: (none; the whole root)\n"),
        "{}",
        out.stdout
    );
    let doc = t.run(&["config", "check", "--json"]).json();
    assert_eq!(
        doc["pipelines"][0]["destinations"][0]["scope"],
        serde_json::json!(["reports/", "index.html"])
    );

    let out = check(
        &t,
        &sharing(
            "        path: ./www\n        scope: [\"reports/\", \"../up/\"]\n",
            "        path: ./site\n",
        ),
    );
    out.expect_code(2);
    for want in ["line 7", "scope entry \"../up/\"", "such as \"reports/\""] {
        assert!(out.stderr.contains(want), "{want}: {}", out.stderr);
    }
}
