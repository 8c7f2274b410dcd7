//! The spool commands and `status` on an intake pipeline
//! (docs/contract.md §22.4), against the real SeaweedFS: they work
//! through the bucket, so a second config with a spool of its own (another
//! host) sees and changes the same state as the agent's.

use std::time::Duration;

use serde_json::Value;

use crate::intake::Intake;
use crate::util::{Output, wait_for};

/// How long an event of a live agent may take to show.
const WAIT: Duration = Duration::from_secs(30);

/// The second "host": the same intake, a spool of its own.
const OTHER: &str = "other.yaml";

/// An intake test with the second host's config written.
fn two_hosts() -> Intake {
    let i = Intake::new();
    i.write_config(OTHER, "spool-other", "");
    i
}

/// `distributor --config file ARGS…`.
fn run(i: &Intake, file: &str, args: &[&str]) -> Output {
    i.cmd(file).args(args).output()
}

/// The rows of `spool list ARGS… --json` on `file`.
fn rows(i: &Intake, file: &str, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["spool", "list"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run(i, file, &all);
    out.expect_code(0);
    out.json().as_array().expect("an array").clone()
}

/// The one row named `name`.
#[track_caller]
fn row<'r>(rows: &'r [Value], name: &str) -> &'r Value {
    rows.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
}

/// This machine's name, as the lease records it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// `one` published, then `two` failed at its plan: `site/b.txt` was put
/// there by hand, and two would overwrite it.
fn one_done_two_failed(i: &Intake) {
    i.upload("one", &i.t.bundle("one", &[("a.txt", "a\n")]));
    i.once().expect_code(0);
    i.t.write("site/b.txt", "not the tool's\n");
    i.upload("two", &i.t.bundle("two", &[("b.txt", "b\n")]));
    i.once().expect_code(1);
    assert!(i.result("done", "one").is_some());
    assert_eq!(
        i.result("failed", "two").expect("failed/two")["stage"],
        "plan"
    );
}

#[test]
fn list_and_show_read_done_and_failed_bundles_from_the_bucket_on_any_host() {
    let i = two_hosts();
    one_done_two_failed(&i);
    let bucket = format!("s3://{}/reports", i.location.bucket);
    for file in ["config.yaml", OTHER] {
        let all = rows(&i, file, &[]);
        assert_eq!(all.len(), 2, "{all:?}");
        let done = row(&all, "one");
        assert_eq!(done["spool"], "done");
        assert_eq!(done["bucket"], bucket.as_str());
        assert!(done["stage"].is_null() && done["error"].is_null(), "{done}");
        let failed = row(&all, "two");
        assert_eq!(failed["spool"], "failed");
        assert_eq!(failed["stage"], "plan");
        assert!(
            failed["error"].as_str().unwrap().contains("b.txt"),
            "{failed}"
        );
        // The keys of a local pipeline's row, and the bucket.
        let mut keys: Vec<&str> = failed
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "bucket",
                "error",
                "modified",
                "name",
                "pipeline_id",
                "spool",
                "stage"
            ]
        );
        assert_eq!(rows(&i, file, &["--failed"]).len(), 1);
        assert_eq!(rows(&i, file, &["--done"])[0]["name"], "one");
        assert!(rows(&i, file, &["--inbox"]).is_empty());

        let shown = run(&i, file, &["spool", "show", "p", "two"]);
        shown.expect_code(0);
        assert!(
            shown.stdout.contains("failed at: plan")
                && shown.stdout.contains(&format!("{bucket}/failed/two/")),
            "{}",
            shown.stdout
        );
        let doc = run(&i, file, &["spool", "show", "p", "one", "--json"]);
        doc.expect_code(0);
        let doc = doc.json();
        assert_eq!(doc["spool"], "done");
        assert_eq!(doc["path"], format!("{bucket}/done/one/"));
        assert_eq!(doc["result"]["ok"], true);
        assert_eq!(doc["result"]["intake"]["name"], "one");
    }
    let text = run(&i, OTHER, &["spool", "list"]);
    text.expect_code(0);
    assert!(
        text.stdout.contains("failed") && text.stdout.contains("[plan]"),
        "{}",
        text.stdout
    );
    let unknown = run(&i, OTHER, &["spool", "show", "p", "three"]);
    unknown.expect_code(2);
    assert!(unknown.stderr.contains(&bucket), "{}", unknown.stderr);
}

#[test]
fn list_inbox_says_why_each_uploaded_bundle_waits() {
    let i = two_hosts();
    let partial = i.t.bundle("partial", &[("a.txt", "a\n"), ("b.txt", "b\n")]);
    std::fs::remove_file(partial.join("b.txt")).unwrap();
    i.upload("partial", &partial);
    i.put("inbox/early/a.txt", b"a\n");
    i.upload("ready", &i.t.bundle("ready", &[("a.txt", "a\n")]));
    let inbox = rows(&i, OTHER, &["--inbox"]);
    assert_eq!(inbox.len(), 3, "{inbox:?}");
    let partial = row(&inbox, "partial");
    assert_eq!(partial["state"], "incomplete");
    assert!(
        partial["reason"]
            .as_str()
            .unwrap()
            .contains("b.txt is missing"),
        "{partial}"
    );
    assert_eq!(row(&inbox, "early")["state"], "no_manifest");
    let ready = row(&inbox, "ready");
    assert_eq!(ready["state"], "ready");
    assert_eq!(ready["spool"], "inbox");
}

#[test]
fn retry_sends_a_failed_bundle_back_and_the_next_agent_publishes_it() {
    let i = two_hosts();
    one_done_two_failed(&i);
    // The cause fixed, from the other host.
    std::fs::remove_file(i.t.join("site/b.txt")).unwrap();
    let out = run(&i, OTHER, &["spool", "retry", "p", "two"]);
    out.expect_code(0);
    assert!(out.stdout.contains("inbox/two/"), "{}", out.stdout);
    assert!(
        i.objects("failed/two").is_empty(),
        "{:?}",
        i.objects("failed")
    );
    let inbox = rows(&i, "config.yaml", &["--inbox"]);
    assert_eq!(row(&inbox, "two")["state"], "ready");

    i.once().expect_code(0);
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/b.txt")).unwrap(),
        "b\n"
    );
    assert_eq!(i.result("done", "two").expect("done/two")["ok"], true);
    assert!(i.objects("inbox").is_empty(), "{:?}", i.objects("inbox"));
    // Nothing left to retry.
    run(&i, OTHER, &["spool", "retry", "p", "two"]).expect_code(2);
    run(&i, OTHER, &["spool", "retry", "p", "--all"]).expect_code(0);
}

#[test]
fn delete_removes_a_failed_bundle_from_the_bucket_and_only_that() {
    let i = two_hosts();
    i.upload("one", &i.t.bundle("one", &[("a.txt", "a\n")]));
    i.upload("bad", &i.t.bundle("bad", &[("a.txt", "bad\n")]));
    // Same size, other bytes: complete, and refused when it is hashed.
    i.put("inbox/bad/a.txt", b"BAD\n");
    i.once().expect_code(1);
    let files = i.objects("failed/bad");
    assert!(files.contains_key("failed/bad/a.txt"), "{files:?}");

    let out = run(&i, OTHER, &["spool", "delete", "p", "bad"]);
    out.expect_code(0);
    assert!(
        out.stdout.contains("failed/bad/ (3 objects,"),
        "{}",
        out.stdout
    );
    assert!(i.objects("failed").is_empty(), "{:?}", i.objects("failed"));
    // Only failed bundles, only plain names; a done one stays.
    run(&i, OTHER, &["spool", "delete", "p", "bad"]).expect_code(2);
    run(&i, OTHER, &["spool", "delete", "p", "one"]).expect_code(2);
    run(&i, OTHER, &["spool", "delete", "p", "../done/one"]).expect_code(2);
    assert!(i.result("done", "one").is_some());
}

#[test]
fn a_hold_in_the_bucket_stops_a_live_agent_until_it_is_released() {
    let i = two_hosts();
    let out = run(&i, OTHER, &["spool", "hold", "p"]);
    out.expect_code(0);
    assert!(out.stdout.contains("held since"), "{}", out.stdout);
    i.upload("one", &i.t.bundle("one", &[("a.txt", "a\n")]));
    let agent = i.agent("config.yaml");
    // Its first look finds the hold, with the bundle complete in the inbox.
    agent.wait_log("held since", WAIT);
    assert!(i.result("done", "one").is_none());
    assert!(!i.t.join("site/a.txt").exists());
    let inbox = rows(&i, OTHER, &["--inbox"]);
    let reason = row(&inbox, "one")["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("held since"), "{reason}");
    let status = run(&i, OTHER, &["status", "--json"]);
    status.expect_code(0);
    assert!(
        status.json()[0]["hold"]["since"].is_string(),
        "{}",
        status.stdout
    );

    run(&i, OTHER, &["spool", "release", "p"]).expect_code(0);
    assert!(
        wait_for(WAIT, || i.result("done", "one").is_some()),
        "not published after the release:\n{}",
        agent.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/a.txt")).unwrap(),
        "a\n"
    );
    let again = run(&i, OTHER, &["spool", "release", "p"]);
    again.expect_code(0);
    assert!(again.stdout.contains("not held"), "{}", again.stdout);
}

#[test]
fn status_names_the_lease_holder_while_an_agent_runs_and_none_after() {
    let i = two_hosts();
    // No agent yet: nothing to flush.
    let flush = run(&i, OTHER, &["spool", "flush", "p"]);
    flush.expect_code(1);
    assert!(
        flush.stderr.contains("no agent holds the lease"),
        "{}",
        flush.stderr
    );
    let mut agent = i.agent("config.yaml");
    agent.wait_log("holds the intake lease (epoch 1)", WAIT);
    let pid = u64::from(agent.child.id());
    let lease = |file: &str| {
        let out = run(&i, file, &["status", "--json"]);
        out.json()[0]["intake"]["lease"].clone()
    };
    // Renewed every second; held as long as it is renewed in time.
    assert!(
        wait_for(WAIT, || lease(OTHER)["state"] == "held"),
        "{}",
        lease(OTHER)
    );
    for file in ["config.yaml", OTHER] {
        let l = lease(file);
        assert_eq!(l["pid"], pid, "{l}");
        assert_eq!(l["epoch"], 1, "{l}");
        assert_eq!(l["host"], host().as_str(), "{l}");
    }
    let text = run(&i, OTHER, &["status"]);
    assert!(
        text.stdout
            .contains(&format!("held by {} pid {pid}, epoch 1", host())),
        "{}",
        text.stdout
    );
    // On the holder's host, the flush knows nothing is deferred; from the
    // other, it is asked through the bucket and taken by the holder.
    let here = run(&i, "config.yaml", &["spool", "flush", "p"]);
    here.expect_code(0);
    assert!(here.stdout.contains("nothing deferred"), "{}", here.stdout);
    let there = run(&i, OTHER, &["spool", "flush", "p"]);
    there.expect_code(0);
    assert!(
        there.stdout.contains(&format!("pid {pid}, epoch 1")),
        "{}",
        there.stdout
    );
    assert!(
        wait_for(WAIT, || !i.objects("").contains_key(".distributor-flush")),
        "the holder did not take the flush"
    );

    agent.signal(libc::SIGTERM);
    agent.finish(WAIT).expect_code(0);
    assert_eq!(lease(OTHER)["state"], "released");
    let text = run(&i, OTHER, &["status"]);
    text.expect_code(0);
    assert!(
        text.stdout.contains("no agent holds its lease"),
        "{}",
        text.stdout
    );
    let check = run(&i, OTHER, &["status", "--check"]);
    check.expect_code(1);
    assert!(
        check
            .stdout
            .contains("no agent holds the lease of its intake")
            && !check.stdout.contains("unfiled"),
        "{}",
        check.stdout
    );
}

#[test]
fn status_reports_an_intake_it_cannot_reach_and_goes_on() {
    let i = Intake::new();
    // Nothing listens on port 9 of this host: refused at once.
    let yaml = std::fs::read_to_string(i.t.join("config.yaml"))
        .unwrap()
        .replace(
            i.location.endpoint.as_deref().unwrap(),
            "http://127.0.0.1:9",
        );
    i.t.write("dead.yaml", yaml);
    let out = run(&i, "dead.yaml", &["status", "--json"]);
    out.expect_code(1);
    let doc = out.json();
    let error = doc[0]["intake"]["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains(&i.location.bucket) && error.contains("reachable"),
        "{error}"
    );
    assert!(doc[0]["inbox"].is_null(), "{doc}");
    let check = run(&i, "dead.yaml", &["status", "--check"]);
    check.expect_code(1);
    assert!(
        check.stdout.contains(&i.location.bucket),
        "{}",
        check.stdout
    );
    let list = run(&i, "dead.yaml", &["spool", "list"]);
    list.expect_code(1);
    assert!(list.stderr.contains("127.0.0.1:9"), "{}", list.stderr);
    // Credentials come from the environment only.
    let bare =
        i.t.cmd()
            .args(["--config", "config.yaml", "spool", "list"])
            .env("AWS_ACCESS_KEY_ID", "")
            .output();
    bare.expect_code(1);
    assert!(bare.stderr.contains("AWS_ACCESS_KEY_ID"), "{}", bare.stderr);
}

#[test]
fn config_check_prints_the_intake() {
    let i = Intake::new();
    let out = run(&i, "config.yaml", &["config", "check"]);
    out.expect_code(0);
    assert!(
        out.stdout.contains(&format!(
            "intake: s3 bucket {}, path reports",
            i.location.bucket
        )),
        "{}",
        out.stdout
    );
    let doc = run(&i, "config.yaml", &["config", "check", "--json"]);
    doc.expect_code(0);
    let p = &doc.json()["pipelines"][0];
    assert_eq!(p["intake"]["bucket"], i.location.bucket.as_str());
    assert_eq!(p["intake"]["lease"], "3s");
    assert!(p["inbox"].is_null(), "{p}");
}
