//! The hostile producer against the spool's own bookkeeping: folders at
//! the names the agent writes inside a bundle, bundle names as long as a
//! name can be, and `done/` entries the agent may not delete. Producers
//! run as other users (see `lab`); the agent as root, or as uid 65534
//! where the point is what an unprivileged agent cannot do.
//!
//! Dropping privileges needs root; as another user these tests print why
//! they skip and pass. CI runs them as root.

use crate::lab::*;
use crate::util::{bundle_names, sorted_names as names, wait_output};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::Path;
use std::process::{Command, Stdio};

const ONE_PIPELINE: &str = "spool: ./spool
agent:
  settle: 100ms
  rescan_interval: 300ms
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
";

/// `spool show reports NAME --json`.
fn show(lab: &Lab, name: &str) -> Value {
    let out = lab.run(None, &["spool", "show", "reports", name, "--json"]);
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", out.stdout, out.stderr))
}

// ---------------------------------------------------------------------------
// Folders at the names the agent writes inside a bundle
// ---------------------------------------------------------------------------

/// A bundle holding a folder (read-only, with a file in it) named
/// `.distributor-result.json`, one holding a folder `.distributor-attempts`,
/// and one found in work/ at start with such a folder: each fails at stage
/// verify with an error naming the reserved name, nothing of theirs is
/// published, work/ ends empty, `agent --once` exits 1, and the next
/// `agent --once` has nothing left to do (exit 0). A good bundle beside
/// them is published.
#[test]
fn folders_at_bookkeeping_names_fail_at_verify_and_never_stay_in_work() {
    if !can_switch_users("folders_at_bookkeeping_names_fail_at_verify_and_never_stay_in_work") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    for name in ["res-dir", "att-dir", "resumed", "good"] {
        lab.sealed(name, &[(&format!("{name}.txt"), name)]);
    }
    let inbox = "spool/reports/inbox";
    lab.producer(
        NOBODY,
        &format!(
            "cp -r bundles/res-dir {inbox}/.r && mkdir -p {inbox}/.r/{RESULT}/sub && echo x > {inbox}/.r/{RESULT}/sub/f && chmod 0555 {inbox}/.r/{RESULT}/sub {inbox}/.r/{RESULT} && mv {inbox}/.r {inbox}/res-dir && \
             cp -r bundles/att-dir {inbox}/.a && mkdir {inbox}/.a/{ATTEMPTS} && mv {inbox}/.a {inbox}/att-dir"
        ),
        &[],
    )
    .expect_code(0);
    lab.deliver(NOBODY, "reports", "good");
    // Left in work/ by an earlier agent (as the old code did for good).
    let work = lab.spool("reports", "work");
    let status = Command::new("cp")
        .arg("-r")
        .arg(lab.join("bundles/resumed"))
        .arg(work.join("resumed"))
        .status()
        .unwrap();
    assert!(status.success());
    fs::create_dir(work.join("resumed").join(RESULT)).unwrap();

    let out = lab.agent_once(None);
    out.expect_code(1);

    assert_eq!(bundle_names(&work), Vec::<String>::new(), "{}", out.stderr);
    let failed = lab.spool("reports", "failed");
    for (name, reserved) in [
        ("res-dir", RESULT),
        ("att-dir", ATTEMPTS),
        ("resumed", RESULT),
    ] {
        assert!(failed.join(name).is_dir(), "{name}: {}", out.stderr);
        let doc = show(&lab, name);
        assert_eq!(doc["result"]["stage"], "verify", "{name}: {doc:#}");
        let error = doc["result"]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(reserved) && error.contains("folder"),
            "{name}: {error}"
        );
        assert!(
            !lab.join(&format!("site/{name}.txt")).exists(),
            "{name} was published"
        );
    }
    // Where the agent could write its result, it did.
    assert_eq!(result_of(&failed.join("att-dir"))["stage"], "verify");
    assert!(failed.join("res-dir").join(RESULT).join("sub/f").is_file());
    assert_eq!(
        fs::read_to_string(lab.join("site/good.txt")).unwrap(),
        "good"
    );

    let again = lab.agent_once(None);
    again.expect_code(0);
    for name in ["res-dir", "att-dir", "resumed"] {
        assert!(!again.stderr.contains(name), "{}", again.stderr);
    }
}

/// `bundles/<name>` as if claimed into work/ and then made read-only by
/// its producer (uid [`OTHER`], which owns it): an agent that is not root
/// may not move it to another parent. Returns its path in work/.
fn claimed_then_locked(lab: &Lab, name: &str) -> std::path::PathBuf {
    let bundle = lab.spool("reports", "work").join(name);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(lab.join(&format!("bundles/{name}")))
        .arg(&bundle)
        .status()
        .unwrap();
    assert!(copied.success());
    for entry in fs::read_dir(&bundle).unwrap() {
        chown(entry.unwrap().path(), Some(OTHER), Some(PRODUCERS)).unwrap();
    }
    chown(&bundle, Some(OTHER), Some(PRODUCERS)).unwrap();
    fs::set_permissions(&bundle, fs::Permissions::from_mode(0o555)).unwrap();
    bundle
}

/// A bundle in work/ that the unprivileged agent cannot move (its
/// producer made the bundle folder read-only, so its `..` cannot change)
/// and cannot write its result into: `agent --once` says it stays in
/// work/ and exits 1, never 0.
#[test]
fn agent_once_exits_1_when_a_bundle_cannot_leave_work() {
    if !can_switch_users("agent_once_exits_1_when_a_bundle_cannot_leave_work") {
        return;
    }
    let lab = Lab::unprivileged();
    lab.sealed("locked", &[("locked.txt", "locked")]);
    let bundle = claimed_then_locked(&lab, "locked");

    let out = lab.agent_once(Some(NOBODY));
    out.expect_code(1);
    assert!(bundle.is_dir());
    assert!(
        out.stderr.contains("could not be filed and stay in work/"),
        "{}",
        out.stderr
    );
}

/// A bundle its producer made immovable once it was claimed (a folder the
/// producer owns, `chmod 0555`: an agent that is not root may not move it
/// to another parent) is published once, and the agent records that it
/// could not file it. Later starts do not publish it again, which would
/// put its older content back over what was published since; once the
/// folder is writable again, the next start files it in done/.
#[test]
fn a_bundle_that_cannot_leave_work_is_never_published_again() {
    if !can_switch_users("a_bundle_that_cannot_leave_work_is_never_published_again") {
        return;
    }
    let lab = Lab::unprivileged();
    lab.sealed("old", &[("page.txt", "old\n")]);
    lab.sealed("newer", &[("page.txt", "newer\n")]);
    let work = lab.spool("reports", "work");
    let bundle = claimed_then_locked(&lab, "old");
    let page = lab.join("site/page.txt");

    let first = lab.agent_once(Some(NOBODY));
    first.expect_code(1);
    assert_eq!(fs::read_to_string(&page).unwrap(), "old\n");
    assert!(
        first
            .stderr
            .contains("bundle=old: published but cannot be moved out of work/")
            && first
                .stderr
                .contains("the next start moves it without publishing it again"),
        "{}",
        first.stderr
    );

    lab.deliver(OTHER, "reports", "newer");
    let second = lab.agent_once(Some(NOBODY));
    second.expect_code(1);
    assert!(
        second.stderr.contains(
            "bundle=old: published by an earlier run, and still cannot be moved out of work/"
        ),
        "{}",
        second.stderr
    );
    assert_eq!(fs::read_to_string(&page).unwrap(), "newer\n");
    // A start with nothing new does not put the old page back.
    lab.agent_once(Some(NOBODY)).expect_code(1);
    assert_eq!(fs::read_to_string(&page).unwrap(), "newer\n");
    let status = lab.run(Some(NOBODY), &["status", "--check"]);
    status.expect_code(1);
    assert!(
        status
            .all()
            .contains("old was published but cannot be moved out of work/"),
        "{}",
        status.all()
    );
    let catalog: Value =
        serde_json::from_slice(&fs::read(lab.join("site/.distributor.json")).unwrap()).unwrap();
    assert_eq!(catalog["outputs"][0]["source"]["id"], "newer", "{catalog}");

    // Writable by the group again (its owner's chmod): filed, still not
    // published again.
    fs::set_permissions(&bundle, fs::Permissions::from_mode(0o775)).unwrap();
    let last = lab.agent_once(Some(NOBODY));
    last.expect_code(0);
    assert!(
        last.stderr.contains("bundle=old: published by an earlier run, which could not move it out of work/; moved to"),
        "{}",
        last.stderr
    );
    assert_eq!(
        bundle_names(&lab.spool("reports", "done")),
        ["newer", "old"]
    );
    assert!(bundle_names(&work).is_empty());
    assert!(!work.join(".distributor-unfiled.json").exists());
    assert_eq!(fs::read_to_string(&page).unwrap(), "newer\n");
}

// ---------------------------------------------------------------------------
// Bundle names as long as a name can be
// ---------------------------------------------------------------------------

/// 255 bytes, ending in two-byte characters (a cut must not split one).
fn longest_name() -> String {
    let name = format!("r{}", "é".repeat(127));
    assert_eq!(name.len(), 255);
    name
}

/// Has the producer drop `bundles/<bundle>` into the inbox as `name`.
fn deliver_as(lab: &Lab, bundle: &str, name: &str) {
    let inbox = "spool/reports/inbox";
    lab.producer(
        NOBODY,
        &format!("cp -r bundles/{bundle} {inbox}/.s && mv {inbox}/.s \"{inbox}/$NAME\""),
        &[("NAME", name.as_bytes())],
    )
    .expect_code(0);
}

/// Two failing bundles with the same 255-byte name are both filed into
/// failed/ (under names short enough for the agent's copy of their result,
/// cut on a character boundary, distinct), work/ ends empty and each has
/// the agent's copy of its result. The producer then forges the result
/// inside each bundle: `spool show` and `status` print the agent's copy.
/// Without the agent's copy they mark the bundle's own copy unverified and
/// never print the forged stage as the agent's.
#[test]
fn a_255_byte_name_is_filed_twice_and_show_and_status_print_the_agents_result() {
    if !can_switch_users(
        "a_255_byte_name_is_filed_twice_and_show_and_status_print_the_agents_result",
    ) {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    let name = longest_name();
    lab.corrupt("bad");
    let failed = lab.spool("reports", "failed");
    let work = lab.spool("reports", "work");
    for round in 1..=2 {
        deliver_as(&lab, "bad", &name);
        let out = lab.agent_once(None);
        out.expect_code(1);
        assert_eq!(bundle_names(&work), Vec::<String>::new(), "{}", out.stderr);
        assert_eq!(bundle_names(&failed).len(), round, "{}", out.stderr);
    }
    let filed = bundle_names(&failed);
    let kept_dir = lab.join("spool/reports/.distributor-results");
    let kept = names(&kept_dir);
    assert_eq!(kept.len(), 2, "{kept:?}");
    for f in &filed {
        assert!(f.len() <= 250, "{} bytes: {f}", f.len());
        assert!(f.starts_with("réé"), "{f}");
        assert!(kept.contains(&format!("{f}.json")), "{f}: {kept:?}");
    }

    // The producer rewrites the result inside its bundles (it may hold a
    // descriptor on them; root plays it here).
    let forged = r#"{"ok": false, "stage": "publish", "error": "FORGED by the producer"}"#;
    for f in &filed {
        let result = failed.join(f).join(RESULT);
        fs::remove_file(&result).unwrap();
        fs::write(&result, forged).unwrap();
    }
    for f in &filed {
        let doc = show(&lab, f);
        assert_eq!(doc["result"]["stage"], "verify", "{doc:#}");
        let text = lab.run(None, &["spool", "show", "reports", f]);
        text.expect_code(0);
        assert!(text.stdout.contains("failed at: verify"), "{}", text.stdout);
        assert!(!text.stdout.contains("FORGED"), "{}", text.stdout);
    }
    let status = lab.run(None, &["status", "--json"]).json();
    assert_eq!(status[0]["last_failure"]["stage"], "verify", "{status:#}");
    let text = lab.run(None, &["status"]);
    assert!(!text.stdout.contains("FORGED"), "{}", text.stdout);

    // Without the agent's copies, the bundle's own is marked unverified.
    for k in &kept {
        fs::remove_file(kept_dir.join(k)).unwrap();
    }
    let f = &filed[0];
    let doc = show(&lab, f);
    assert!(doc["result"].is_null(), "{doc:#}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap_or_default()
            .contains("unverified"),
        "{doc:#}"
    );
    let text = lab.run(None, &["spool", "show", "reports", f]);
    text.expect_code(1);
    assert!(text.stdout.contains("UNVERIFIED"), "{}", text.stdout);
    assert!(
        !text.stdout.contains("failed at: publish"),
        "{}",
        text.stdout
    );
    let status = lab.run(None, &["status", "--json"]).json();
    let last = &status[0]["last_failure"];
    assert!(last["stage"].is_null(), "{status:#}");
    let error = last["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("unverified") && !error.contains("FORGED"),
        "{status:#}"
    );
    let text = lab.run(None, &["status"]);
    assert!(!text.stdout.contains("FORGED"), "{}", text.stdout);
    assert!(!text.stdout.contains("[publish]"), "{}", text.stdout);
}

// ---------------------------------------------------------------------------
// done/ retention
// ---------------------------------------------------------------------------

const RETAINED: &str = "spool: ./spool
agent:
  settle: 100ms
  rescan_interval: 200ms
  done_retention: 1d
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
";

/// Sets the modification time of `path` itself (not following a link) to
/// the start of 2000: long past any `done_retention`.
fn make_old(path: &Path) {
    let status = Command::new("touch")
        .args(["-h", "-d", "2000-01-01T00:00:00Z"])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "touch {}", path.display());
}

/// With the agent running as its own user, a producer's read-only folder
/// (`sub/`, mode 0555, holding a file) in an expired done/ entry cannot be
/// removed: every other expired entry still is, a fresh one stays, the
/// entry is logged once with its owner's uid (a second run logs nothing
/// more), and `status` (text and JSON) lists it with the fix. Once root
/// removes it, status shows none.
#[test]
fn retention_removes_all_it_can_and_reports_what_it_cannot_once() {
    if !can_switch_users("retention_removes_all_it_can_and_reports_what_it_cannot_once") {
        return;
    }
    let lab = Lab::unprivileged_with(RETAINED);
    let names_ = ["a-old", "locked", "m-old", "z-old", "fresh"];
    for name in names_ {
        lab.sealed(name, &[("sub/f.txt", name), (&format!("{name}.txt"), name)]);
        lab.deliver(OTHER, "reports", name);
    }
    lab.agent_once(Some(NOBODY)).expect_code(0);
    let done = lab.spool("reports", "done");
    assert_eq!(
        bundle_names(&done),
        ["a-old", "fresh", "locked", "m-old", "z-old"]
    );
    let sub = done.join("locked/sub");
    assert_eq!(fs::metadata(&sub).unwrap().uid(), OTHER);
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o555)).unwrap();
    for name in ["a-old", "locked", "m-old", "z-old"] {
        make_old(&done.join(name));
    }

    let first = lab.agent_once(Some(NOBODY));
    first.expect_code(0);
    assert_eq!(bundle_names(&done), ["fresh", "locked"], "{}", first.stderr);
    let told: Vec<&str> = first
        .stderr
        .lines()
        .filter(|l| l.contains("done/locked"))
        .collect();
    assert_eq!(told.len(), 1, "{}", first.stderr);
    assert!(
        told[0].contains("uid 60001") && told[0].contains("done/locked/sub/f.txt"),
        "{}",
        told[0]
    );

    let second = lab.agent_once(Some(NOBODY));
    second.expect_code(0);
    assert!(!second.stderr.contains("done/locked"), "{}", second.stderr);
    let doc = lab.run(None, &["status", "--json"]).json();
    let blocked = &doc[0]["retention_blocked"];
    assert_eq!(blocked["count"], 1, "{doc:#}");
    assert_eq!(blocked["entries"][0]["name"], "locked", "{doc:#}");
    assert_eq!(blocked["entries"][0]["owner_uid"], OTHER, "{doc:#}");
    assert!(blocked["fix"].as_str().unwrap_or_default().contains("root"));
    let text = lab.run(None, &["status"]);
    let line = text
        .stdout
        .lines()
        .find(|l| l.contains("retention cannot remove"))
        .unwrap_or_else(|| panic!("{}", text.stdout));
    assert!(line.contains("locked") && line.contains("60001"), "{line}");
    let check = lab.run(None, &["status", "--check"]);
    assert!(
        check
            .stdout
            .lines()
            .any(|l| l.contains("past done_retention")),
        "{}",
        check.stdout
    );

    // Root removes it: nothing is reported any more.
    fs::set_permissions(&sub, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_dir_all(done.join("locked")).unwrap();
    lab.agent_once(Some(NOBODY)).expect_code(0);
    let doc = lab.run(None, &["status", "--json"]).json();
    assert_eq!(doc[0]["retention_blocked"]["count"], 0, "{doc:#}");
}

/// Retention deletes a tree 300 folders deep with the agent limited to 64
/// descriptors (removing one descriptor per level would run out), and
/// removes the symbolic links in it without following them: the folder
/// they point to keeps its file.
#[test]
fn retention_deletes_a_deep_tree_with_few_descriptors_and_follows_no_link() {
    if !can_switch_users("retention_deletes_a_deep_tree_with_few_descriptors_and_follows_no_link") {
        return;
    }
    let lab = Lab::new(RETAINED, &["reports"]);
    let keep = lab.t.write("outside/keep/file", "keep");
    let done = lab.spool("reports", "done");
    let mut deep = done.join("deep");
    for _ in 0..300 {
        deep.push("d");
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("f"), "bottom").unwrap();
    std::os::unix::fs::symlink(lab.join("outside/keep"), deep.join("link")).unwrap();
    std::os::unix::fs::symlink(lab.join("outside"), done.join("deep/link")).unwrap();
    lab.t.write("spool/reports/done/plain/f", "x");
    for name in ["deep", "plain"] {
        make_old(&done.join(name));
    }

    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_distributor"))
        .arg("--config")
        .arg(lab.join("config.yaml"))
        .args(["agent", "--once"])
        .current_dir(lab.path())
        .env_remove("DISTRIBUTOR_CONFIG")
        .env_remove("JOURNAL_STREAM")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_output(cmd.spawn().unwrap(), "agent --once with 64 descriptors");
    out.expect_code(0);
    assert_eq!(bundle_names(&done), Vec::<String>::new(), "{}", out.stderr);
    assert_eq!(fs::read_to_string(&keep).unwrap(), "keep");
}

// ---------------------------------------------------------------------------
// Bundles that cannot become valid fail at once, saying why
// ---------------------------------------------------------------------------

/// A listed file longer than its manifest declares cannot become complete
/// (the manifest is written last): it is failed at `verify` at once, not
/// left waiting for `incomplete_timeout`. A listed file the agent's user may
/// not read fails naming the permission problem and the fix.
#[test]
fn hopeless_and_unreadable_bundles_fail_at_once_saying_what_to_do() {
    if !can_switch_users("hopeless_and_unreadable_bundles_fail_at_once_saying_what_to_do") {
        return;
    }
    let lab = Lab::unprivileged();
    lab.sealed("longer", &[("a.txt", "declared")]);
    fs::write(lab.join("bundles/longer/a.txt"), "longer than declared").unwrap();
    lab.sealed("private", &[("secret.txt", "only mine")]);
    lab.deliver(OTHER, "reports", "longer");
    lab.deliver(OTHER, "reports", "private");
    // The producer's own file, readable by nobody else.
    let secret = lab.spool("reports", "inbox").join("private/secret.txt");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();

    // --once leaves incomplete bundles in the inbox; these two are claimed.
    let out = lab.agent_once(Some(NOBODY));
    out.expect_code(1);
    assert_eq!(
        bundle_names(&lab.spool("reports", "inbox")),
        Vec::<String>::new()
    );
    let failed = lab.spool("reports", "failed");
    assert_eq!(
        bundle_names(&failed),
        ["longer", "private"],
        "{}",
        out.stderr
    );
    let longer = &show(&lab, "longer")["result"];
    assert_eq!(longer["stage"], "verify", "{longer}");
    let error = longer["error"].as_str().unwrap();
    assert!(
        error.contains("a.txt: size is 20 bytes but manifest.json says 8"),
        "{error}"
    );
    let private = &show(&lab, "private")["result"];
    assert_eq!(private["stage"], "verify", "{private}");
    let error = private["error"].as_str().unwrap();
    assert!(
        error.contains("secret.txt: cannot open")
            && error.contains("may not read it")
            && error.contains("chmod g+r"),
        "{error}"
    );
    assert_eq!(
        bundle_names(&lab.join("site")),
        Vec::<String>::new(),
        "nothing published"
    );
    assert!(!lab.join("site/.distributor.json").exists());
}
