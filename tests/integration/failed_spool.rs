//! Working the failed spool from the command line (docs/contract.md §14.2):
//! `spool retry P --all`, `spool show P NAME [--json]`, `spool delete P NAME`,
//! and `spool list --inbox` saying why each entry waits (§13.4).

use crate::util::{Test, sorted_names as names, write_file};
use std::fs;

const CONFIG: &str = "spool: spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: www
";

/// Drops a sealed bundle into the inbox by rename, as a producer should.
fn drop_bundle(t: &Test, name: &str, files: &[(&str, &str)]) {
    let b = t.bundle(name, files);
    fs::create_dir_all(t.join("spool/p/inbox")).unwrap();
    fs::rename(&b, t.join(&format!("spool/p/inbox/{name}"))).unwrap();
}

/// Same size, other bytes: complete, so claimed, and refused at verify.
fn tamper(t: &Test, name: &str) {
    let f = t.join(&format!("spool/p/inbox/{name}/a.txt"));
    let len = fs::metadata(&f).unwrap().len() as usize;
    fs::write(&f, "X".repeat(len)).unwrap();
}

/// Two failed bundles and one published one, after `agent --once`.
fn two_failed() -> Test {
    let t = Test::new();
    t.config(CONFIG);
    drop_bundle(&t, "good", &[("a.txt", "good\n")]);
    for name in ["bad1", "bad2"] {
        drop_bundle(&t, name, &[("a.txt", "bad\n")]);
        tamper(&t, name);
    }
    t.run(&["agent", "--once"]).expect_code(1);
    assert_eq!(names(&t.join("spool/p/failed")), ["bad1", "bad2"]);
    assert_eq!(names(&t.join("spool/p/done")), ["good"]);
    t
}

#[test]
fn show_prints_a_failed_or_done_bundles_result() {
    let t = two_failed();
    let out = t.run(&["spool", "show", "p", "bad1"]);
    out.expect_code(0);
    assert!(out.stdout.contains("failed at: verify"), "{}", out.stdout);
    assert!(
        out.stdout.contains("a.txt: content does not match"),
        "{}",
        out.stdout
    );

    let doc = t.run(&["spool", "show", "p", "good", "--json"]);
    doc.expect_code(0);
    let doc = doc.json();
    assert_eq!(doc["spool"], "done");
    assert_eq!(doc["result"]["ok"], true);
    assert_eq!(doc["result"]["destinations"][0]["action"], "publish_new");

    let missing = t.run(&["spool", "show", "p", "nope"]);
    missing.expect_code(2);
    assert!(missing.stderr.contains("spool list"), "{}", missing.stderr);
}

#[test]
fn retry_all_moves_every_failed_bundle_back_and_clears_its_result() {
    let t = two_failed();
    let out = t.run(&["spool", "retry", "p", "--all"]);
    out.expect_code(0);
    assert!(
        out.stdout
            .contains("2 failed bundles moved back to the inbox"),
        "{}",
        out.stdout
    );
    assert!(names(&t.join("spool/p/failed")).is_empty());
    let inbox = t.join("spool/p/inbox");
    assert_eq!(names(&inbox), ["bad1", "bad2"]);
    for name in ["bad1", "bad2"] {
        assert!(!inbox.join(name).join(".distributor-result.json").exists());
        assert!(!inbox.join(name).join(".distributor-attempts").exists());
    }
    // A name and --all together, or neither, is a usage error.
    t.run(&["spool", "retry", "p"]).expect_code(2);
    t.run(&["spool", "retry", "p", "bad1", "--all"])
        .expect_code(2);
    // Nothing left: still fine.
    let again = t.run(&["spool", "retry", "p", "--all"]);
    again.expect_code(0);
    assert!(
        again.stdout.contains("0 failed bundles"),
        "{}",
        again.stdout
    );
}

#[test]
fn delete_removes_only_the_named_failed_bundle_and_says_what_it_removed() {
    let t = two_failed();
    let out = t.run(&["spool", "delete", "p", "bad1"]);
    out.expect_code(0);
    assert!(out.stdout.starts_with("removed "), "{}", out.stdout);
    // manifest.json, a.txt and the result (a first attempt writes no
    // attempt count).
    assert!(out.stdout.contains("bad1 (3 files,"), "{}", out.stdout);
    assert_eq!(names(&t.join("spool/p/failed")), ["bad2"]);
    // Only failed bundles, only plain names.
    t.run(&["spool", "delete", "p", "good"]).expect_code(2);
    t.run(&["spool", "delete", "p", "../done/good"])
        .expect_code(2);
    assert_eq!(names(&t.join("spool/p/done")), ["good"]);
}

#[test]
fn a_link_planted_in_a_failed_bundle_is_removed_never_followed() {
    let t = two_failed();
    let victim = t.write("victim/keep.txt", "keep\n");
    std::os::unix::fs::symlink(t.join("victim"), t.join("spool/p/failed/bad1/escape")).unwrap();
    t.run(&["spool", "delete", "p", "bad1"]).expect_code(0);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep\n");
}

/// A link that stood in for a bundle when it was claimed (a producer's
/// race) is filed in failed/ like a bundle: `spool show` finds it, `spool
/// retry` says there is nothing to retry and how to remove it, and `spool
/// delete` removes the link itself, never what it points to.
#[test]
fn a_link_filed_in_failed_can_be_shown_and_deleted_but_not_retried() {
    let t = two_failed();
    let victim = t.write("victim/keep.txt", "keep\n");
    let link = t.join("spool/p/failed/race");
    std::os::unix::fs::symlink(t.join("victim"), &link).unwrap();

    let shown = t.run(&["spool", "show", "p", "race", "--json"]);
    assert_eq!(shown.json()["spool"], "failed", "{}", shown.all());
    let retry = t.run(&["spool", "retry", "p", "race"]);
    retry.expect_code(2);
    assert!(
        retry.stderr.contains("is not a folder")
            && retry.stderr.contains("distributor spool delete p race"),
        "{}",
        retry.stderr
    );
    assert!(fs::symlink_metadata(&link).is_ok());

    let deleted = t.run(&["spool", "delete", "p", "race"]);
    deleted.expect_code(0);
    assert!(fs::symlink_metadata(&link).is_err());
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep\n");
    assert_eq!(names(&t.join("spool/p/failed")), ["bad1", "bad2"]);
}

#[test]
fn spool_list_inbox_says_why_each_entry_waits() {
    let t = Test::new();
    t.config(CONFIG);
    let inbox = t.join("spool/p/inbox");
    drop_bundle(&t, "ready", &[("a.txt", "a\n")]);
    drop_bundle(&t, "partial", &[("a.txt", "a\n"), ("b.bin", "0123456789")]);
    fs::remove_file(inbox.join("partial/a.txt")).unwrap();
    fs::write(inbox.join("partial/b.bin"), "0123").unwrap();
    fs::create_dir_all(inbox.join("no-manifest-yet")).unwrap();
    write_file(&inbox.join("no-manifest-yet/x"), b"x");
    write_file(&inbox.join("stray.txt"), b"not a folder");

    let out = t.run(&["spool", "list", "--inbox", "--json"]);
    out.expect_code(0);
    let rows = out.json();
    let rows = rows.as_array().unwrap();
    let by_name = |name: &str| {
        rows.iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {rows:?}"))
            .clone()
    };
    let partial = by_name("partial");
    assert_eq!(partial["state"], "incomplete");
    let reason = partial["reason"].as_str().unwrap();
    assert!(
        reason.contains("1 of 2 listed files missing: a.txt")
            && reason.contains("b.bin (4 of 10 bytes)"),
        "{reason}"
    );
    assert_eq!(by_name("no-manifest-yet")["state"], "no_manifest");
    assert_eq!(by_name("stray.txt")["state"], "unreadable");
    let ready = by_name("ready")["state"].as_str().unwrap().to_owned();
    assert!(ready == "ready" || ready == "settling", "{ready}");
    for r in rows {
        assert_eq!(r["spool"], "inbox");
        assert!(r["reason"].as_str().is_some_and(|s| !s.is_empty()), "{r}");
    }

    let text = t.run(&["spool", "list", "--inbox"]);
    text.expect_code(0);
    let header: Vec<&str> = text
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["SPOOL", "PIPELINE", "NAME", "AGE", "DETAILS"],
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("incomplete: 1 of 2 listed files missing"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("no_manifest: no manifest.json yet"),
        "{}",
        text.stdout
    );

    // --once publishes the complete one, leaves the rest, exits 1 for the
    // incomplete one, and a folder without a manifest changes nothing.
    let once = t.run(&["agent", "--once"]);
    once.expect_code(1);
    assert!(
        once.stderr
            .contains("partial: incomplete, left in the inbox"),
        "{}",
        once.stderr
    );
    assert_eq!(names(&t.join("spool/p/done")), ["ready"]);
    assert_eq!(names(&inbox), ["no-manifest-yet", "partial", "stray.txt"]);
}

#[test]
fn a_producer_rewriting_its_failed_bundles_result_does_not_change_what_operators_see() {
    let t = two_failed();
    let inside = t.join("spool/p/failed/bad1/.distributor-result.json");
    // The producer still owns its folder and rewrites the agent's record.
    fs::remove_file(&inside).unwrap();
    fs::write(
        &inside,
        r#"{"ok": false, "stage": "lock", "error": "all fine, nothing to see"}"#,
    )
    .unwrap();
    let rows = t.run(&["spool", "list", "--failed", "--json"]);
    rows.expect_code(0);
    let rows = rows.json();
    let bad1 = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "bad1")
        .unwrap()
        .clone();
    assert_eq!(bad1["stage"], "verify", "{bad1}");
    assert!(
        bad1["error"]
            .as_str()
            .unwrap()
            .contains("content does not match"),
        "{bad1}"
    );
    let shown = t.run(&["spool", "show", "p", "bad1"]);
    assert!(
        shown.stdout.contains("failed at: verify"),
        "{}",
        shown.stdout
    );
    // Retry and delete drop the agent's copy with the bundle.
    t.run(&["spool", "retry", "p", "bad1"]).expect_code(0);
    t.run(&["spool", "delete", "p", "bad2"]).expect_code(0);
    assert!(names(&t.join("spool/p/.distributor-results")).is_empty());
}

#[test]
fn status_does_not_hang_on_a_catalog_that_is_a_fifo() {
    let t = Test::new();
    t.config(CONFIG);
    t.mkdir("www");
    crate::util::mkfifo(&t.join("www/.distributor.json"));
    let out = t.run(&["status"]);
    out.expect_code(0);
    assert!(
        out.stdout
            .contains("catalog unreadable: .distributor.json is not a regular file"),
        "{}",
        out.stdout
    );
}

/// `spool retry` never rolls a destination back by surprise
/// (docs/contract.md §18.7): a failed bundle whose source is older than what
/// its paths now hold is planned as a dry run and left in failed/, with the
/// paths and both times named; `--allow-older` retries it anyway.
#[test]
fn retry_refuses_a_bundle_that_would_roll_newer_outputs_back() {
    let t = Test::new();
    t.config(&CONFIG.replace("spool: spool\n", "spool: spool\nagent: {max_attempts: 1}\n"));
    // The root is a file: v1 fails (permanently) at the lock.
    fs::write(t.join("www"), "not a folder\n").unwrap();
    let v1 = t.bundle_at("v1", "docs", "2026-06-01T00:00:00Z", &[("a.txt", "one\n")]);
    fs::create_dir_all(t.join("spool/p/inbox")).unwrap();
    fs::rename(&v1, t.join("spool/p/inbox/v1")).unwrap();
    t.run(&["agent", "--once"]).expect_code(1);
    assert_eq!(names(&t.join("spool/p/failed")), ["v1"]);

    // Fixed, and a newer version of the source published meanwhile.
    fs::remove_file(t.join("www")).unwrap();
    let v2 = t.bundle_at("v2", "docs", "2026-06-02T00:00:00Z", &[("a.txt", "two\n")]);
    t.publish("p", &v2, &[]).expect_code(0);

    let out = t.run(&["spool", "retry", "p", "v1"]);
    out.expect_code(1);
    for needle in [
        "not retried",
        "a.txt",
        "2026-06-02T00:00:00Z",
        "2026-06-01T00:00:00Z",
        "--allow-older",
    ] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    assert_eq!(names(&t.join("spool/p/failed")), ["v1"]);
    let all = t.run(&["spool", "retry", "p", "--all"]);
    all.expect_code(1);
    assert!(
        all.stdout
            .contains("0 failed bundles moved back to the inbox, 1 not moved"),
        "{}",
        all.stdout
    );
    assert_eq!(names(&t.join("spool/p/failed")), ["v1"]);
    assert_eq!(fs::read_to_string(t.join("www/a.txt")).unwrap(), "two\n");

    t.run(&["spool", "retry", "p", "v1", "--allow-older"])
        .expect_code(0);
    assert_eq!(names(&t.join("spool/p/inbox")), ["v1"]);
    assert!(names(&t.join("spool/p/failed")).is_empty());
}

/// `spool retry --all` without a pipeline retries the failed bundles of
/// every pipeline.
#[test]
fn retry_all_without_a_pipeline_covers_every_pipeline() {
    let t = two_failed();
    t.config(&format!(
        "{CONFIG}  - id: q\n    destinations:\n      - id: site\n        path: www-q\n"
    ));
    let b = t.bundle("qbad", &[("a.txt", "bad\n")]);
    fs::create_dir_all(t.join("spool/q/inbox")).unwrap();
    fs::rename(&b, t.join("spool/q/inbox/qbad")).unwrap();
    fs::write(t.join("spool/q/inbox/qbad/a.txt"), "XXXX").unwrap();
    t.run(&["agent", "--once"]).expect_code(1);
    assert_eq!(names(&t.join("spool/q/failed")), ["qbad"]);

    let out = t.run(&["spool", "retry", "--all"]);
    out.expect_code(0);
    assert!(out.stdout.contains("pipeline p:") && out.stdout.contains("pipeline q:"));
    assert_eq!(names(&t.join("spool/p/failed")), Vec::<String>::new());
    assert_eq!(names(&t.join("spool/q/failed")), Vec::<String>::new());
    assert_eq!(names(&t.join("spool/p/inbox")), ["bad1", "bad2"]);
    assert_eq!(names(&t.join("spool/q/inbox")), ["qbad"]);
    // One pipeline and no name still needs --all.
    t.run(&["spool", "retry", "p"]).expect_code(2);
}
