//! The spool agent end to end, through the real binary: `agent --once`
//! outcomes and exit codes, crash recovery from `work/`, a live agent fed by
//! renames, in-place writes and bursts, SIGTERM / SIGHUP / SIGKILL,
//! transient lock failures with retries, `spool list` / `spool retry`, and
//! `done/` retention. Every assertion is about what an operator sees: spool
//! folders, result files, catalogs, exit codes.
//!
//! The fixtures (test folder, live agent processes, signals, the root lock)
//! come from `util`; the spool checks live below.

use crate::util::{
    self, CREATED, DEADLINE, Output, Proc, Rng, Test, assert_catalog_matches_disk, hold_root_lock,
    listed, names, read_json, sha256, wait_for, write_file, write_manifest,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// How long a live agent gets to publish one small bundle.
const PUBLISH_WAIT: Duration = Duration::from_secs(15);
const RESULT: &str = ".distributor-result.json";
const ATTEMPTS: &str = ".distributor-attempts";

/// A bundle written without the binary (for the bursts: one process per
/// bundle would dominate the time): files first, then a manifest computed
/// from docs/contract.md §3.
fn write_bundle(dir: &Path, id: &str, files: &[(&str, &[u8])]) {
    let mut list = Vec::new();
    for (path, contents) in files {
        write_file(&dir.join(path), contents);
        list.push(listed(path, contents));
    }
    write_manifest(dir, id, &list);
}

/// Renames `from` to `to`, creating `to`'s parent (a producer's drop).
fn drop_into(from: &Path, to: &Path) {
    fs::create_dir_all(to.parent().unwrap()).unwrap();
    fs::rename(from, to)
        .unwrap_or_else(|e| panic!("rename {} -> {}: {e}", from.display(), to.display()));
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The `.distributor-result.json` of a spooled bundle.
#[track_caller]
fn result(bundle: &Path) -> Value {
    read_json(&bundle.join(RESULT))
}

/// The attempt count recorded in a spooled bundle.
fn attempts(bundle: &Path) -> Option<u32> {
    fs::read_to_string(bundle.join(ATTEMPTS))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Every regular file below `dir`, relative, sorted.
fn files_below(dir: &Path) -> Vec<String> {
    util::shape(dir)
        .0
        .into_iter()
        .filter(|(_, n)| matches!(n.kind, util::Kind::File { .. }))
        .map(|(p, _)| p)
        .collect()
}

/// Temporary or journal files the tool left anywhere below `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    files_below(dir)
        .into_iter()
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name.starts_with(".distributor-tmp") || name.starts_with(".distributor-journal")
        })
        .collect()
}

/// One pipeline `p` publishing to `./www` under `{source_id}/`, with the
/// given lines under `agent:` (each indented by two spaces).
fn config_p(agent: &str) -> String {
    format!(
        "spool: ./spool
agent:
{agent}pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        prefix: \"{{source_id}}/\"
"
    )
}

/// Live agent settings: only file events and the incomplete-folder poll
/// can make it notice anything (the full rescan is a minute away).
const LIVE: &str = "  settle: 0s\n  rescan_interval: 60s\n";

/// `RUST_LOG` of an agent whose scans a test follows: the agent logs each
/// look at an inbox and each periodic rescan at debug.
const SCANS: &str = "info,distributor::agent=debug";
/// The line a scan of pipeline `p`'s inbox logs.
const SCANNED: &str = "pipeline=p scanned the inbox";
/// The line the periodic rescan logs.
const RESCAN_DUE: &str = "passed: scanning every inbox";

/// A live agent on `config.yaml` logging its scans ([`SCANS`]).
fn scanning_agent(dir: &Test) -> Proc {
    dir.agent_logging(Path::new("config.yaml"), SCANS)
}

/// Waits until the agent (a [`scanning_agent`]) has looked at the whole
/// inbox after this call: two more scans, since the first may have begun
/// before. Creates and removes a dot-file in the inbox (which a scan
/// skips) before each, so that a watcher event causes them when nothing
/// else does.
#[track_caller]
fn wait_scanned_from_now(agent: &Proc, inbox: &Path) {
    let before = agent.log_count(SCANNED);
    for more in 1..=2 {
        let poke = inbox.join(".poke");
        fs::write(&poke, b"").unwrap();
        fs::remove_file(&poke).unwrap();
        assert!(
            wait_for(PUBLISH_WAIT, || agent.log_count(SCANNED) >= before + more),
            "the agent did not scan its inbox within {PUBLISH_WAIT:?}:\n{}",
            agent.stderr()
        );
    }
}

/// Waits until `done/<name>` holds a result file; fails with the log.
#[track_caller]
fn wait_done(dir: &Test, agent: &Proc, pipeline: &str, name: &str) {
    let bundle = dir.spool(pipeline, "done").join(name);
    assert!(
        wait_for(PUBLISH_WAIT, || bundle.join(RESULT).exists()),
        "{name} did not reach {pipeline}/done within {PUBLISH_WAIT:?}; inbox {:?} work {:?} failed {:?}\n{}",
        names(&dir.spool(pipeline, "inbox")),
        names(&dir.spool(pipeline, "work")),
        names(&dir.spool(pipeline, "failed")),
        agent.stderr()
    );
    assert_eq!(result(&bundle)["ok"], true, "{}", result(&bundle));
}

/// SIGTERM, then expect a clean exit 0.
#[track_caller]
fn stop(agent: Proc) -> Output {
    stop_with(agent, libc::SIGTERM)
}

/// `signal` (SIGTERM or SIGINT), then expect a clean exit 0.
#[track_caller]
fn stop_with(mut agent: Proc, signal: libc::c_int) -> Output {
    agent.signal(signal);
    let out = agent.finish(Duration::from_secs(30));
    out.expect_code(0);
    out
}

// ---------------------------------------------------------------------------
// 1. agent --once
// ---------------------------------------------------------------------------

/// The modes docs/security.md promises, under the umasks services run
/// with: the inbox 01770 whatever the umask (producers of the group drop
/// into it), work/, done/ and failed/ 0750 made stricter by the umask only.
#[test]
fn spool_folders_get_their_documented_modes_under_umask_022_and_077() {
    use std::os::unix::fs::PermissionsExt;
    for (umask, private) in [(0o022, 0o750), (0o077, 0o700)] {
        let dir = Test::new();
        dir.config(&config_p(""));
        dir.agent_cmd()
            .umask(umask)
            .args(["agent", "--once"])
            .output()
            .expect_code(0);
        let mode = |folder: &str| {
            fs::metadata(dir.spool("p", folder))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("inbox"), 0o1770, "inbox under umask {umask:03o}");
        for folder in ["work", "done", "failed"] {
            assert_eq!(mode(folder), private, "{folder} under umask {umask:03o}");
        }
    }
}

#[test]
fn once_with_an_empty_inbox_exits_0_and_creates_every_spool_folder() {
    let dir = Test::new();
    dir.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
  - id: q
    inbox: ./drop/q
    destinations:
      - id: d
        path: ./www-q
",
    );
    dir.once().expect_code(0);
    for folder in ["inbox", "work", "done", "failed"] {
        assert!(dir.spool("p", folder).is_dir(), "spool/p/{folder} missing");
    }
    for folder in ["work", "done", "failed"] {
        assert!(dir.spool("q", folder).is_dir(), "spool/q/{folder} missing");
    }
    assert!(
        dir.join("drop/q").is_dir(),
        "the configured inbox of q was not created"
    );
    assert!(
        !dir.spool("q", "inbox").exists(),
        "q has its own inbox; spool/q/inbox should not exist"
    );
    assert!(
        !dir.join("www").exists(),
        "nothing was published, so no root should exist"
    );
}

#[test]
fn once_publishes_good_bundles_fails_the_tampered_one_and_exits_1() {
    let dir = Test::new();
    dir.config(&config_p(""));
    let inbox = dir.spool("p", "inbox");
    for name in ["good1", "good2", "bad"] {
        let b = dir.sealed(
            name,
            &[
                ("report.md", format!("# {name}\n").as_bytes()),
                ("data/x.csv", format!("n,{name}\n").as_bytes()),
            ],
        );
        if name == "bad" {
            // Same size, other bytes: complete, so claimed, and refused.
            fs::write(b.join("report.md"), "# BAD\n").unwrap();
        }
        drop_into(&b, &inbox.join(name));
    }

    let out = dir.once();
    out.expect_code(1);

    assert_eq!(names(&dir.spool("p", "done")), set(&["good1", "good2"]));
    assert_eq!(names(&dir.spool("p", "failed")), set(&["bad"]));
    assert!(
        names(&inbox).is_empty(),
        "inbox not drained: {:?}",
        names(&inbox)
    );
    assert!(names(&dir.spool("p", "work")).is_empty());

    let www = dir.join("www");
    for name in ["good1", "good2"] {
        let r = result(&dir.spool("p", "done").join(name));
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["stage"], Value::Null, "{r}");
        assert_eq!(r["error"], Value::Null, "{r}");
        assert_eq!(r["pipeline_id"], "p");
        assert_eq!(r["source"]["id"], name);
        let writes = &r["destinations"][0]["writes"];
        assert!(
            writes
                .as_array()
                .unwrap()
                .contains(&Value::from(format!("{name}/report.md"))),
            "{r}"
        );
        assert_eq!(
            fs::read_to_string(www.join(name).join("report.md")).unwrap(),
            format!("# {name}\n")
        );
        assert_eq!(
            fs::read_to_string(www.join(name).join("data/x.csv")).unwrap(),
            format!("n,{name}\n")
        );
    }
    let r = result(&dir.spool("p", "failed").join("bad"));
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["stage"], "verify", "{r}");
    let error = r["error"].as_str().expect("error is a string");
    assert!(
        error.contains("report.md"),
        "the error should name the file: {error}"
    );
    assert!(
        !www.join("bad").exists(),
        "the tampered bundle must not be published"
    );

    let recs = util::records(&util::read_state(&www));
    let paths: BTreeSet<_> = recs.keys().cloned().collect();
    assert_eq!(
        paths,
        set(&[
            "good1/data/x.csv",
            "good1/report.md",
            "good2/data/x.csv",
            "good2/report.md"
        ])
    );
    for r in recs.values() {
        assert_eq!(r["pipeline_id"], "p");
        assert_eq!(r["destination_id"], "d");
    }
    assert_catalog_matches_disk(&www);
    assert!(
        out.stderr.contains("bad"),
        "the failure is logged:\n{}",
        out.stderr
    );

    // The exit code reports this run: an all-good run exits 0 even though
    // failed/ still holds the earlier failure.
    let b = dir.sealed("good3", &[("report.md", b"# good3\n")]);
    drop_into(&b, &inbox.join("good3"));
    dir.once().expect_code(0);
    assert!(dir.spool("p", "done").join("good3").join(RESULT).exists());
    assert_eq!(result(&dir.spool("p", "done").join("good3"))["ok"], true);
    assert!(www.join("good3/report.md").is_file());
}

#[test]
fn once_exits_1_when_a_bundle_cannot_be_claimed_and_says_why() {
    // A spool whose file system refuses rename with RENAME_NOREPLACE (some
    // network and FUSE file systems), for one bundle: strace makes that
    // very call fail with EINVAL, as such a file system does.
    let dir = Test::new();
    dir.config(&config_p(""));
    let inbox = dir.spool("p", "inbox");
    for name in ["good", "stuck"] {
        let b = dir.sealed(name, &[("a.txt", name.as_bytes())]);
        drop_into(&b, &inbox.join(name));
    }
    let out = std::process::Command::new("strace")
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .env_remove("DISTRIBUTOR_CONFIG")
        .args(["-f", "-o", "/dev/null", "-P"])
        .arg(inbox.join("stuck"))
        .args([
            "-e",
            "trace=renameat2",
            "-e",
            "inject=renameat2:error=EINVAL",
        ])
        .arg(crate::util::BIN)
        .args(["--config", "config.yaml", "agent", "--once"])
        .output()
        .expect("strace (scripts/install-test-deps installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("1 done, 0 failed, 1 could not be claimed and stay in the inbox"),
        "{stderr}"
    );
    assert!(stderr.contains("RENAME_NOREPLACE"), "{stderr}");
    assert_eq!(names(&dir.spool("p", "done")), set(&["good"]));
    assert_eq!(names(&inbox), set(&["stuck"]));
    assert!(inbox.join("stuck/manifest.json").is_file());
}

#[test]
fn once_processes_bundles_in_manifest_modification_order_then_by_name() {
    let dir = Test::new();
    // No prefix: every bundle writes `a.txt`, so the last one processed owns it.
    dir.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
",
    );
    let base = std::time::SystemTime::now() - Duration::from_secs(3600);
    // Arrival order z, a, then b and m at the same instant (name order):
    // m is last. Name order alone would end with z, reverse name order with a.
    for (name, minutes) in [("z", 0), ("a", 1), ("m", 2), ("b", 2)] {
        let b = dir.sealed(name, &[("a.txt", name.as_bytes())]);
        fs::File::options()
            .write(true)
            .open(b.join("manifest.json"))
            .unwrap()
            .set_modified(base + Duration::from_secs(60 * minutes))
            .unwrap();
        drop_into(&b, &dir.spool("p", "inbox").join(name));
    }
    dir.once().expect_code(0);
    let www = dir.join("www");
    assert_eq!(fs::read_to_string(www.join("a.txt")).unwrap(), "m");
    assert_eq!(
        util::records(&util::read_state(&www))["a.txt"]["source"]["id"],
        "m"
    );
    assert_eq!(names(&dir.spool("p", "done")), set(&["a", "b", "m", "z"]));
}

#[test]
fn agent_with_a_broken_config_exits_2_and_says_where() {
    let dir = Test::new();
    dir.config(&config_p("  settle: 0s\n  sttle: 1s\n"));
    for args in [&["agent", "--once"][..], &["agent"][..]] {
        let out = dir.run(args);
        out.expect_code(2);
        assert!(
            out.stderr.contains("sttle") && out.stderr.contains("line 4"),
            "{args:?}: the error names the key and its line:\n{}",
            out.stderr
        );
    }
    assert!(
        !dir.join("spool").exists(),
        "nothing is created from a broken config"
    );
}

// ---------------------------------------------------------------------------
// 2. crash recovery
// ---------------------------------------------------------------------------

#[test]
fn once_finishes_a_bundle_left_in_work_before_the_inbox() {
    let dir = Test::new();
    // No prefix: both bundles write `a.txt`, so the last one processed owns it.
    dir.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
",
    );
    let interrupted = dir.sealed("interrupted", &[("a.txt", b"from work\n")]);
    fs::write(interrupted.join(ATTEMPTS), "1\n").unwrap();
    drop_into(&interrupted, &dir.spool("p", "work").join("interrupted"));
    let fresh = dir.sealed("fresh", &[("a.txt", b"from inbox\n")]);
    drop_into(&fresh, &dir.spool("p", "inbox").join("fresh"));

    let out = dir.once();
    out.expect_code(0);

    let done = dir.spool("p", "done");
    assert_eq!(
        names(&done),
        set(&["fresh", "interrupted"]),
        "each exactly once"
    );
    assert!(names(&dir.spool("p", "work")).is_empty());
    assert!(names(&dir.spool("p", "inbox")).is_empty());
    assert!(names(&dir.spool("p", "failed")).is_empty());
    assert_eq!(result(&done.join("interrupted"))["ok"], true);
    assert_eq!(
        attempts(&done.join("interrupted")),
        Some(2),
        "the attempt count survives the restart"
    );

    // work/ first: the inbox bundle was published last and owns a.txt.
    let www = dir.join("www");
    assert_eq!(
        fs::read_to_string(www.join("a.txt")).unwrap(),
        "from inbox\n"
    );
    assert_eq!(
        util::records(&util::read_state(&www))["a.txt"]["source"]["id"],
        "fresh"
    );
    assert_catalog_matches_disk(&www);
}

#[test]
fn a_first_attempt_cut_short_by_a_crash_is_counted_at_the_next_start() {
    // A first attempt writes no attempt count (it costs a file per bundle);
    // the next start counts the attempt the crash interrupted.
    let dir = Test::new();
    dir.config(&config_p(""));
    let b = dir.sealed("crashed", &[("a.txt", b"a\n")]);
    drop_into(&b, &dir.spool("p", "inbox").join("crashed"));
    let out = dir
        .agent_cmd()
        .args(["agent", "--once"])
        .env("DISTRIBUTOR_FAILPOINT", "publish.after_stage")
        .output();
    assert_ne!(out.code, 0, "the failpoint aborts:\n{}", out.stderr);
    let work = dir.spool("p", "work").join("crashed");
    assert!(work.is_dir(), "the crashed bundle stays in work/");
    assert_eq!(attempts(&work), None, "a first attempt records no count");

    dir.once().expect_code(0);
    let done = dir.spool("p", "done").join("crashed");
    assert_eq!(result(&done)["ok"], true);
    assert_eq!(
        attempts(&done),
        Some(2),
        "the crashed attempt counts, the one that published is the second"
    );
    assert_eq!(
        fs::read_to_string(dir.join("www/crashed/a.txt")).unwrap(),
        "a\n"
    );
}

// ---------------------------------------------------------------------------
// 3. live agent
// ---------------------------------------------------------------------------

#[test]
fn live_agent_publishes_a_bundle_renamed_in_from_a_dot_folder() {
    let dir = Test::new();
    dir.config(&config_p("  settle: 50ms\n  rescan_interval: 60s\n"));
    let agent = dir.agent();
    let inbox = dir.spool("p", "inbox");
    let staging = inbox.join(".incoming-renamed-in");
    for (path, contents) in [("report.md", "# a\n"), ("img/logo.txt", "logo\n")] {
        write_file(&staging.join(path), contents.as_bytes());
    }
    dir.seal(&staging, "renamed-in", Some(CREATED))
        .expect_code(0);
    drop_into(&staging, &inbox.join("renamed-in"));

    wait_done(&dir, &agent, "p", "renamed-in");
    let www = dir.join("www");
    assert_eq!(
        fs::read_to_string(www.join("renamed-in/report.md")).unwrap(),
        "# a\n"
    );
    assert_eq!(
        fs::read_to_string(www.join("renamed-in/img/logo.txt")).unwrap(),
        "logo\n"
    );
    assert_catalog_matches_disk(&www);
    assert!(names(&inbox).is_empty());
    assert!(names(&dir.spool("p", "work")).is_empty());
    let out = stop(agent);
    // One log line per bundle outcome, naming the bundle and the action.
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("renamed-in") && l.contains("publish_new")),
        "no outcome line for the bundle:\n{}",
        out.stderr
    );
}

#[test]
fn live_agent_goes_idle_after_publishing() {
    // The agent's own scans open the inbox and read manifests; a watcher
    // that woke on those events would rescan forever and burn a core. Once
    // the bundle is done nothing changes, so the agent may scan only when
    // its rescan_interval says so: at most twice per interval (its worker's
    // own timer and the periodic wake-up may both fall in one), where a
    // looping one scans hundreds of times. The agent's own periodic rescan
    // lines are the clock.
    const INTERVALS: usize = 5;
    let dir = Test::new();
    dir.config(&config_p("  settle: 0s\n  rescan_interval: 100ms\n"));
    let agent = scanning_agent(&dir);
    let inbox = dir.spool("p", "inbox");
    let bundle = dir.sealed("idle", &[("a.md", b"# a\n")]);
    drop_into(&bundle, &inbox.join("idle"));
    wait_done(&dir, &agent, "p", "idle");

    let count = |log: &str, needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    let log = agent.stderr();
    let (scans, rescans) = (count(&log, SCANNED), count(&log, RESCAN_DUE));
    assert!(
        wait_for(PUBLISH_WAIT, || agent.log_count(RESCAN_DUE)
            >= rescans + INTERVALS),
        "no {INTERVALS} periodic rescans within {PUBLISH_WAIT:?}:\n{}",
        agent.stderr()
    );
    let log = agent.stderr();
    let intervals = count(&log, RESCAN_DUE) - rescans;
    let scanned = count(&log, SCANNED) - scans;
    assert!(
        scanned <= 2 * intervals + 2,
        "the idle agent scanned its inbox {scanned} times in {intervals} rescan intervals:\n{}",
        log.lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    stop(agent);
}

#[test]
fn live_agent_publishes_a_bundle_written_in_place_with_the_manifest_last() {
    let dir = Test::new();
    dir.config(&config_p(LIVE));
    let agent = scanning_agent(&dir);
    // The manifest a producer would write, computed on a copy elsewhere.
    let model = dir.sealed("b", &[("one.txt", b"one\n"), ("sub/two.txt", b"two\n")]);
    let manifest = fs::read(model.join("manifest.json")).unwrap();

    let inbox = dir.spool("p", "inbox");
    let b = inbox.join("b");
    fs::create_dir(&b).unwrap();
    agent.wait_log(
        "pipeline=p bundle=b waits: no manifest.json yet",
        PUBLISH_WAIT,
    );
    // After each step the agent looks at the folder again and leaves it.
    write_file(&b.join("one.txt"), b"one\n");
    wait_scanned_from_now(&agent, &inbox);
    assert!(b.is_dir(), "claimed with one file and no manifest");
    write_file(&b.join("sub/two.txt"), b"two\n");
    wait_scanned_from_now(&agent, &inbox);
    assert!(
        b.is_dir(),
        "the incomplete bundle must not be claimed before its manifest"
    );
    fs::write(b.join(".manifest.tmp"), &manifest).unwrap();
    fs::rename(b.join(".manifest.tmp"), b.join("manifest.json")).unwrap();

    wait_done(&dir, &agent, "p", "b");
    let www = dir.join("www");
    assert_eq!(fs::read_to_string(www.join("b/one.txt")).unwrap(), "one\n");
    assert_eq!(
        fs::read_to_string(www.join("b/sub/two.txt")).unwrap(),
        "two\n"
    );
    assert_catalog_matches_disk(&www);
    stop(agent);
}

#[test]
fn live_agent_publishes_a_folder_created_empty_then_filled() {
    let dir = Test::new();
    dir.config(&config_p(LIVE));
    let agent = dir.agent();
    let inbox = dir.spool("p", "inbox");
    // c1: files and manifest right after the mkdir (races the agent's look
    // at the new folder); c2: the folder stays empty until the agent has
    // seen it empty (and logged that it waits for a manifest).
    for (name, seen_empty) in [("c1", false), ("c2", true)] {
        let model = dir.sealed(name, &[("f.txt", name.as_bytes())]);
        let manifest = fs::read(model.join("manifest.json")).unwrap();
        let b = inbox.join(name);
        fs::create_dir(&b).unwrap();
        if seen_empty {
            agent.wait_log(
                &format!("pipeline=p bundle={name} waits: no manifest.json yet"),
                PUBLISH_WAIT,
            );
        }
        fs::write(b.join("f.txt"), name).unwrap();
        fs::write(b.join(".manifest.tmp"), &manifest).unwrap();
        fs::rename(b.join(".manifest.tmp"), b.join("manifest.json")).unwrap();
        wait_done(&dir, &agent, "p", name);
        assert_eq!(
            fs::read_to_string(dir.join("www").join(name).join("f.txt")).unwrap(),
            name
        );
    }
    assert_catalog_matches_disk(&dir.join("www"));
    assert!(names(&dir.spool("p", "failed")).is_empty());
    stop(agent);
}

#[test]
fn live_agent_ignores_a_complete_bundle_while_its_name_starts_with_a_dot() {
    let dir = Test::new();
    dir.config(&config_p(LIVE));
    let agent = scanning_agent(&dir);
    let inbox = dir.spool("p", "inbox");
    let staging = inbox.join(".e");
    write_file(&staging.join("e.txt"), b"e\n");
    dir.seal(&staging, "e", Some(CREATED)).expect_code(0);
    // Touch it again, complete as it is.
    for i in 0..5 {
        write_file(&staging.join(format!("extra-{i}.txt")), b"x");
    }
    for i in 0..5 {
        fs::remove_file(staging.join(format!("extra-{i}.txt"))).unwrap();
    }
    // Every scan after that (settle is 0s) would have claimed it.
    wait_scanned_from_now(&agent, &inbox);
    assert!(
        staging.join("manifest.json").is_file(),
        "the dot-folder was claimed"
    );
    let log = agent.stderr();
    let counted: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(SCANNED) && !l.contains("(0 entries)"))
        .collect();
    assert!(
        counted.is_empty(),
        "a scan counted the dot-folder: {counted:?}"
    );
    assert!(names(&dir.spool("p", "work")).is_empty());
    assert!(names(&dir.spool("p", "done")).is_empty());
    assert!(
        !dir.join("www").join("e").exists(),
        "a staging bundle was published"
    );

    drop_into(&staging, &inbox.join("e"));
    wait_done(&dir, &agent, "p", "e");
    assert_eq!(fs::read_to_string(dir.join("www/e/e.txt")).unwrap(), "e\n");
    stop(agent);
}

#[test]
fn live_agent_claims_a_bundle_that_keeps_changing_after_ten_times_settle() {
    let dir = Test::new();
    dir.config(&config_p("  settle: 300ms\n  rescan_interval: 60s\n"));
    // When (10 x settle, and not before settle) is the claim rule's, table-
    // tested in spool::inbox; here: the live agent lets a bundle that keeps
    // changing settle, and still claims it while it changes.
    let agent = scanning_agent(&dir);
    let b = dir.sealed("busy", &[("a.txt", b"a\n")]);
    let inbox = dir.spool("p", "inbox");
    let bundle = inbox.join("busy");
    drop_into(&b, &bundle);
    // Keep the bundle's top level changing (a file created and removed at
    // every look, far more often than settle) until the agent takes it away.
    let mut i = 0;
    let claimed = wait_for(PUBLISH_WAIT, || {
        let churn = bundle.join(format!("churn-{i}"));
        if fs::write(&churn, b"x").is_ok() {
            let _ = fs::remove_file(&churn);
        }
        i += 1;
        !bundle.is_dir()
    });
    assert!(
        claimed,
        "a bundle that keeps changing must still be claimed (after 10 x settle):\n{}",
        agent.stderr()
    );
    wait_done(&dir, &agent, "p", "busy");
    let out = stop(agent);
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("pipeline=p bundle=busy: complete, changed")
                && l.contains("claimed once nothing changes for 300ms")),
        "the agent did not let the changing bundle settle first:\n{}",
        out.stderr
    );
}

#[test]
fn a_second_agent_stands_by_until_the_first_exits() {
    let dir = Test::new();
    dir.config(&config_p(
        "  settle: 0s\n  rescan_interval: 60s\n  lock_timeout: 200ms\n",
    ));
    let first = dir.agent();
    let second = dir.agent();
    second.wait_log("standing by", Duration::from_secs(10));
    let inbox = dir.spool("p", "inbox");

    let b = dir.sealed("first-only", &[("a.txt", b"1\n")]);
    drop_into(&b, &inbox.join("first-only"));
    wait_done(&dir, &first, "p", "first-only");
    // An --once run finds the pipeline served and gives up after lock_timeout.
    dir.once().expect_code(1);

    stop(first);
    let b = dir.sealed("two", &[("a.txt", b"2\n")]);
    drop_into(&b, &inbox.join("two"));
    wait_done(&dir, &second, "p", "two");
    assert_eq!(names(&dir.spool("p", "done")), set(&["first-only", "two"]));
    let out = stop(second);
    assert_eq!(
        out.stderr
            .lines()
            .filter(|l| l.contains("first-only"))
            .count(),
        0,
        "the standing-by agent must not have handled bundle first-only:\n{}",
        out.stderr
    );
}

#[test]
fn a_standby_agent_writes_no_metrics_until_it_serves() {
    // Two agents on one spool, each with its own metrics file: only the one
    // serving the pipeline may report, or a standby would publish zeros
    // next to the real figures.
    let dir = Test::new();
    let config = |metrics: &str| {
        config_p(&format!(
            "  settle: 0s\n  rescan_interval: 60s\n  metrics_file: ./{metrics}\n"
        ))
    };
    dir.config(&config("first.prom"));
    write_file(&dir.join("standby.yaml"), config("standby.prom").as_bytes());
    let first = dir.agent();
    let b = dir.sealed("counted", &[("a.txt", b"1\n")]);
    drop_into(&b, &dir.spool("p", "inbox").join("counted"));
    wait_done(&dir, &first, "p", "counted");
    let second = dir.agent_with(&dir.join("standby.yaml"));
    second.wait_log("standing by", Duration::from_secs(10));
    // The maintenance threads report at start and then every 10 s; the
    // serving agent's first report may come before it took the pipeline,
    // so wait for one that counts the bundle (by then the standby has had
    // its start report and usually a periodic one too).
    let counted = || {
        fs::read_to_string(dir.join("first.prom"))
            .unwrap_or_default()
            .contains("distributor_bundles_done_total{pipeline=\"p\"}")
    };
    assert!(
        wait_for(Duration::from_secs(30), counted),
        "the serving agent reports:\n{}",
        fs::read_to_string(dir.join("first.prom")).unwrap_or_default()
    );
    assert!(
        !dir.join("standby.prom").exists(),
        "a standby agent wrote metrics:\n{}",
        fs::read_to_string(dir.join("standby.prom")).unwrap_or_default()
    );

    stop(first);
    // Serving now, the second agent reports at its next tick.
    let standby = dir.join("standby.prom");
    assert!(
        wait_for(Duration::from_secs(20), || fs::read_to_string(&standby)
            .is_ok_and(|t| t.contains(
                "distributor_spool_bundles{pipeline=\"p\",spool=\"done\"} 1"
            ))),
        "the agent that took over wrote no metrics:\n{}",
        second.stderr()
    );
    stop(second);
}

/// Burst size (`DISTRIBUTOR_IT_BURST` overrides it). A backlog is published
/// in batches, so 2000 takes about 5 s in a debug build on two cores.
const BURST: usize = 2000;

#[test]
fn live_agent_publishes_every_bundle_of_a_burst() {
    let n: usize = std::env::var("DISTRIBUTOR_IT_BURST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(BURST);
    let dir = Test::on_tmpfs();
    dir.config(
        "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 60s
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
",
    );
    let stage = dir.join("stage");
    let all: Vec<String> = (0..n).map(|i| format!("b{i:05}")).collect();
    for name in &all {
        write_bundle(
            &stage.join(name),
            name,
            &[(&format!("{name}.txt"), format!("burst {name}\n").as_bytes())],
        );
    }
    let agent = dir.agent();
    let inbox = dir.spool("p", "inbox");
    let start = Instant::now();
    for name in &all {
        fs::rename(stage.join(name), inbox.join(name)).unwrap();
    }
    let dropped = start.elapsed();
    let done = dir.spool("p", "done");
    // Generous: a loaded machine must not fail a correct agent, but a stuck
    // one must not hang the suite.
    let limit = Duration::from_secs(60 + (n * n / 20_000) as u64);
    let finished = wait_for(limit, || {
        let d = names(&done);
        d.len() >= n && d.iter().all(|name| done.join(name).join(RESULT).exists())
    });
    let elapsed = start.elapsed();
    eprintln!(
        "burst: {n} bundles dropped in {dropped:?}, all in done/ after {:.1} s ({:.1} ms per bundle)",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / n as f64
    );
    assert!(
        finished,
        "after {limit:?} only {} of {n} bundles are in done/ (inbox {}, work {:?}, failed {:?})",
        names(&done).len(),
        names(&inbox).len(),
        names(&dir.spool("p", "work")),
        names(&dir.spool("p", "failed"))
    );
    stop(agent);

    let expected: BTreeSet<String> = all.iter().cloned().collect();
    assert_eq!(names(&done), expected);
    assert!(names(&inbox).is_empty());
    assert!(names(&dir.spool("p", "work")).is_empty());
    assert!(names(&dir.spool("p", "failed")).is_empty());
    let www = dir.join("www");
    let recs = util::records(&util::read_state(&www));
    assert_eq!(recs.len(), n, "one catalog record per bundle");
    for name in &all {
        let r = &recs[&format!("{name}.txt")];
        assert_eq!(r["source"]["id"], name.as_str());
        assert_eq!(
            r["sha256"],
            sha256(format!("burst {name}\n").as_bytes()).as_str()
        );
    }
    assert_catalog_matches_disk(&www);
    assert!(leftovers(&www).is_empty(), "{:?}", leftovers(&www));
}

#[test]
fn a_backlog_over_a_big_catalog_is_still_published_in_batches() {
    let dir = Test::on_tmpfs();
    dir.config(&config_p(""));
    let inbox = dir.spool("p", "inbox");
    // One bundle of 3300 files gives the root a catalog of 3300 records.
    let contents: Vec<(String, Vec<u8>)> = (0..3300)
        .map(|i| (format!("f{i:05}.txt"), format!("{i}\n").into_bytes()))
        .collect();
    let files: Vec<(&str, &[u8])> = contents
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_slice()))
        .collect();
    write_bundle(&inbox.join("big"), "big", &files);
    dir.once().expect_code(0);
    assert_eq!(
        util::records(&util::read_state(&dir.join("www"))).len(),
        3300
    );

    let n = 300;
    for i in 0..n {
        let name = format!("late{i:03}");
        write_bundle(&inbox.join(&name), &name, &[("x.txt", name.as_bytes())]);
    }
    let out = dir.once();
    out.expect_code(0);
    assert_eq!(
        util::records(&util::read_state(&dir.join("www"))).len(),
        3300 + n
    );
    // The agent says how it published them: in batches, not one by one.
    let batched: usize = out
        .stderr
        .lines()
        .filter_map(|l| l.split("published a batch of ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert_eq!(
        batched, n,
        "every late bundle should go through a batch:\n{}",
        out.stderr
    );
}

/// Drops a sealed bundle `name` holding `report.md` into the live agent's
/// inbox and waits for it in done/.
fn publish_live(dir: &Test, agent: &Proc, name: &str, body: &str) {
    let staging = dir.join(&format!("staging-{name}"));
    write_file(&staging.join("report.md"), body.as_bytes());
    dir.seal(&staging, name, Some(CREATED)).expect_code(0);
    drop_into(&staging, &dir.spool("p", "inbox").join(name));
    wait_done(dir, agent, "p", name);
}

#[test]
fn live_agent_rereads_a_catalog_changed_by_anyone_else_between_its_bundles() {
    // The agent keeps the catalog it last wrote in memory; it must notice
    // every other writer: another process's publication (a new file) and
    // an edit in place that keeps the file's size and inode.
    let dir = Test::new();
    dir.config(&config_p(
        "  settle: 50ms
  rescan_interval: 60s
",
    ));
    let agent = dir.agent();
    let www = dir.join("www");
    publish_live(&dir, &agent, "first", "# first\n");

    let other = dir.sealed("other", &[("report.md", b"# other\n")]);
    dir.publish("p", &other, &[]).expect_code(0);
    publish_live(&dir, &agent, "second", "# second\n");
    assert_eq!(
        util::records(&util::read_state(&www))
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        ["first/report.md", "other/report.md", "second/report.md"],
        "the record of the run between two agent publications was lost"
    );

    // An operator edits a record's time stamp in place, under the lock:
    // same size, same inode.
    let catalog = www.join(".distributor.json");
    let text = fs::read_to_string(&catalog).unwrap();
    let stamp = util::records(&util::read_state(&www))["first/report.md"]["created_at"]
        .as_str()
        .unwrap()
        .to_owned();
    let edited_stamp = stamp.replacen("20", "19", 1);
    // The record's created_at is the first time stamp after its path.
    let record = text.find("\"path\": \"first/report.md\"").unwrap();
    let at = record + text[record..].find(&stamp).unwrap();
    let edited = format!("{}{edited_stamp}{}", &text[..at], &text[at + stamp.len()..]);
    assert_eq!(edited.len(), text.len());
    {
        use std::io::{Seek, Write};
        let _lock = hold_root_lock(&www);
        let inode = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&catalog).unwrap());
        let mut f = fs::OpenOptions::new().write(true).open(&catalog).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(edited.as_bytes()).unwrap();
        drop(f);
        let after = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&catalog).unwrap());
        assert_eq!(inode, after);
    }
    publish_live(&dir, &agent, "third", "# third\n");
    let records = util::records(&util::read_state(&www));
    assert_eq!(
        records["first/report.md"]["created_at"], edited_stamp,
        "the agent wrote back the catalog it remembered over the edited one"
    );
    assert_eq!(records.len(), 4);
    assert_catalog_matches_disk(&www);
    stop(agent);
}

// ---------------------------------------------------------------------------
// 4. SIGTERM while busy
// ---------------------------------------------------------------------------

#[test]
fn sigterm_while_busy_finishes_the_bundle_in_hand_and_exits_0() {
    sigterm_mid_run(false);
}

#[test]
fn sigterm_during_once_finishes_the_bundle_in_hand_and_exits_0() {
    sigterm_mid_run(true);
}

/// Queues bundles big enough to keep a debug build busy, sends SIGTERM
/// while one is in `work/`, and checks that it was finished, that nothing
/// else was claimed, and that the catalog agrees with the spool.
fn sigterm_mid_run(once: bool) {
    let dir = Test::new();
    dir.config(&config_p(LIVE));
    let size = 4 << 20;
    let all: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
    let stage = dir.join("stage");
    let content = |name: &str| {
        let mut bytes = vec![b'.'; size];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        bytes
    };
    for name in &all {
        write_bundle(&stage.join(name), name, &[("big.bin", &content(name))]);
    }
    let inbox = dir.spool("p", "inbox");
    let work = dir.spool("p", "work");
    fs::create_dir_all(&inbox).unwrap();
    let drop_all = || {
        for name in &all {
            fs::rename(stage.join(name), inbox.join(name)).unwrap();
        }
    };
    let agent = if once {
        drop_all();
        dir.agent_cmd().args(["agent", "--once"]).start()
    } else {
        let agent = dir.agent();
        drop_all();
        agent
    };
    let mut in_hand = None;
    assert!(
        wait_for(PUBLISH_WAIT, || {
            // A bundle, not the batch's attempt file.
            in_hand = names(&work).into_iter().find(|n| !n.starts_with('.'));
            in_hand.is_some() && agent.catches(&[libc::SIGTERM])
        }),
        "the agent never claimed a bundle:\n{}",
        agent.stderr()
    );
    let in_hand = in_hand.unwrap();
    let stderr = stop(agent).stderr;

    let done = names(&dir.spool("p", "done"));
    let waiting = names(&inbox);
    // The bundle in hand (or the batch in hand) is finished, unless it was
    // still hashing or copying when the stop grace ran out (docs/contract.md §12.4);
    // then it is left whole in work/ and resumed by the next start.
    let left: BTreeSet<String> = names(&work)
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect();
    if !left.is_empty() {
        assert!(
            stderr.contains("left in work/ for the next start"),
            "{stderr}"
        );
        for name in &left {
            assert!(!work.join(name).join(RESULT).exists(), "{name}");
        }
    }
    assert!(names(&dir.spool("p", "failed")).is_empty());
    assert!(
        done.contains(&in_hand) || left.contains(&in_hand),
        "the bundle in hand ({in_hand}) was neither finished nor kept: done {done:?}, work {left:?}"
    );
    assert!(!waiting.is_empty(), "the agent kept claiming after SIGTERM");
    assert!(done.is_disjoint(&waiting) && done.is_disjoint(&left) && left.is_disjoint(&waiting));
    let union: BTreeSet<String> = done.union(&waiting).chain(&left).cloned().collect();
    assert_eq!(union, all.iter().cloned().collect::<BTreeSet<_>>());

    let www = dir.join("www");
    let recs = if www.join(".distributor.json").exists() {
        util::records(&util::read_state(&www))
    } else {
        BTreeMap::new()
    };
    for name in &done {
        assert_eq!(result(&dir.spool("p", "done").join(name))["ok"], true);
        let r = recs
            .get(&format!("{name}/big.bin"))
            .unwrap_or_else(|| panic!("{name} is in done/ but not in the catalog"));
        assert_eq!(r["sha256"], sha256(&content(name)).as_str());
    }
    for name in waiting.iter().chain(&left) {
        assert!(!www.join(name).exists(), "unfinished {name} has outputs");
        assert!(!inbox.join(name).join(RESULT).exists());
    }
    assert_eq!(recs.len(), done.len());
    if !done.is_empty() {
        assert_catalog_matches_disk(&www);
    }
    if www.exists() {
        assert!(leftovers(&www).is_empty(), "{:?}", leftovers(&www));
    }

    // The rest is picked up by the next run.
    dir.once().expect_code(0);
    assert_eq!(names(&dir.spool("p", "done")).len(), all.len());
    assert_eq!(util::records(&util::read_state(&www)).len(), all.len());
}

// ---------------------------------------------------------------------------
// 5. SIGHUP
// ---------------------------------------------------------------------------

#[test]
fn sighup_keeps_the_old_config_when_the_new_one_is_broken_and_adds_new_pipelines() {
    let dir = Test::new();
    dir.config(&config_p(LIVE));
    let mut agent = dir.agent();
    let inbox = dir.spool("p", "inbox");

    // An edit gone wrong (the spool line kept).
    dir.config("spool: ./spool\npipelines: [ this is : not yaml\n  - {{{\n");
    let logged = agent.stderr().len();
    agent.signal(libc::SIGHUP);
    // The log says why: the file, line and column of the mistake.
    assert!(
        wait_for(Duration::from_secs(10), || agent.stderr()[logged..]
            .contains("config.yaml line 3")),
        "the reload error is not logged with its place:\n{}",
        agent.stderr()
    );
    assert!(
        agent.running(),
        "a broken config on SIGHUP must not stop the agent"
    );
    // The agent can still be inspected: the commands that read show the
    // config it serves, with a warning naming the file's error, and
    // status says the reload was refused.
    let status = dir.run(&["status"]);
    status.expect_code(0);
    assert!(
        status.stderr.contains("config.yaml line 3"),
        "{}",
        status.stderr
    );
    assert!(
        status
            .stderr
            .contains("showing the config the agent last accepted"),
        "{}",
        status.stderr
    );
    assert!(
        status.stdout.contains("config reload refused at "),
        "{}",
        status.stdout
    );
    assert!(status.stdout.contains("pipeline p:"), "{}", status.stdout);
    let check = dir.run(&["status", "--check"]);
    check.expect_code(1);
    assert!(
        check.stdout.contains("the agent refused a reload at "),
        "{}",
        check.stdout
    );
    let json = dir.run(&["status", "--json"]).json();
    assert!(
        json[0]["reload_refused"]["error"]
            .as_str()
            .unwrap()
            .contains("line 3"),
        "{json}"
    );
    dir.run(&["spool", "list"]).expect_code(0);
    dir.run(&["catalog", "--pipeline", "p", "--destination", "d"])
        .expect_code(0);
    // A command that changes something still refuses the broken file.
    dir.run(&["spool", "hold", "p"]).expect_code(2);
    let b = dir.sealed("after-broken", &[("x.txt", b"x\n")]);
    drop_into(&b, &inbox.join("after-broken"));
    wait_done(&dir, &agent, "p", "after-broken");
    assert!(dir.join("www/after-broken/x.txt").is_file());

    dir.config(&format!(
        "{}  - id: q
    destinations:
      - id: d
        path: ./www-q
",
        config_p(LIVE)
    ));
    agent.signal(libc::SIGHUP);
    assert!(
        wait_for(Duration::from_secs(10), || [
            "inbox", "work", "done", "failed"
        ]
        .iter()
        .all(|f| dir.spool("q", f).is_dir())),
        "the new pipeline's spool folders were not created on reload:\n{}",
        agent.stderr()
    );
    let b = dir.sealed("for-q", &[("q.txt", b"q\n")]);
    drop_into(&b, &dir.spool("q", "inbox").join("for-q"));
    wait_done(&dir, &agent, "q", "for-q");
    let recs = util::records(&util::read_state(&dir.join("www-q")));
    assert_eq!(recs["q.txt"]["pipeline_id"], "q");
    // The old pipeline is still served after the reload.
    let b = dir.sealed("after-reload", &[("y.txt", b"y\n")]);
    drop_into(&b, &inbox.join("after-reload"));
    wait_done(&dir, &agent, "p", "after-reload");
    // The reload worked: nothing refused any more.
    let json = dir.run(&["status", "--json"]).json();
    assert!(json[0]["reload_refused"].is_null(), "{json}");
    stop(agent);
}

// ---------------------------------------------------------------------------
// 6. SIGKILL loop
// ---------------------------------------------------------------------------

#[test]
fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    const ITERATIONS: usize = 40;
    const MAX_FED: usize = 300;
    let dir = Test::on_tmpfs();
    dir.config(
        "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 60s
pipelines:
  - id: p
    destinations:
      - id: all
        path: ./www-all
        prefix: \"{source_id}/\"
      - id: latest
        path: ./www-latest
        workflow: replacement
",
    );
    let inbox = dir.spool("p", "inbox");
    let work = dir.spool("p", "work");
    fs::create_dir_all(&inbox).unwrap();
    let stage = dir.join("stage");
    let body = |name: &str| format!("# {name}\n\n{}\n", "text ".repeat(200));

    let stop_feeding = Arc::new(AtomicBool::new(false));
    let fed = Arc::new(Mutex::new(Vec::<String>::new()));
    let feeder = {
        let (stop_feeding, fed, inbox, stage) = (
            stop_feeding.clone(),
            fed.clone(),
            inbox.clone(),
            stage.clone(),
        );
        std::thread::spawn(move || {
            for i in 0..MAX_FED {
                if stop_feeding.load(Ordering::SeqCst) {
                    break;
                }
                let name = format!("k{i:04}");
                let b = stage.join(&name);
                // Every bundle replaces the previous one in `latest`; `n`
                // makes some of them drop a file the previous one had.
                let (index, n) = (body(&name), format!("{i}\n"));
                let mut files: Vec<(&str, &[u8])> = vec![("index.md", index.as_bytes())];
                if !i.is_multiple_of(3) {
                    files.push(("data/n.txt", n.as_bytes()));
                }
                write_bundle(&b, &name, &files);
                fs::rename(&b, inbox.join(&name)).unwrap();
                fed.lock().unwrap().push(name);
                // The next one once an agent has claimed this one: bundles
                // arrive while agents live, start and die.
                wait_for(PUBLISH_WAIT, || {
                    names(&inbox).is_empty() || stop_feeding.load(Ordering::SeqCst)
                });
            }
        })
    };

    let mut rng = Rng::seeded("kill loop");
    let mut kills_mid_bundle = 0;
    for _ in 0..ITERATIONS {
        let mut agent = dir.agent_cmd().arg("agent").start_quiet();
        sleep(Duration::from_millis(rng.below(300)));
        agent.signal(libc::SIGKILL);
        let out = agent.finish(Duration::from_secs(30));
        assert_eq!(out.code, -libc::SIGKILL, "the agent exited on its own");
        if !names(&work).is_empty() {
            kills_mid_bundle += 1;
        }
    }
    stop_feeding.store(true, Ordering::SeqCst);
    feeder.join().unwrap();
    let fed: BTreeSet<String> = fed.lock().unwrap().iter().cloned().collect();
    eprintln!(
        "kill loop: {ITERATIONS} SIGKILLs, {} bundles fed, {kills_mid_bundle} kills left a bundle in work/",
        fed.len()
    );

    let out = dir.once();
    out.expect_code(0);

    let done = names(&dir.spool("p", "done"));
    let failed = names(&dir.spool("p", "failed"));
    assert!(failed.is_empty(), "failed: {failed:?}");
    assert!(names(&inbox).is_empty(), "inbox: {:?}", names(&inbox));
    assert!(names(&work).is_empty(), "work: {:?}", names(&work));
    assert_eq!(done.len(), fed.len(), "duplicates or losses in done/");
    assert_eq!(
        done, fed,
        "every fed bundle in done/ exactly once, under its own name"
    );
    for name in &done {
        let r = result(&dir.spool("p", "done").join(name));
        assert_eq!(r["ok"], true, "{name}: {r}");
    }

    let all = dir.join("www-all");
    let recs = util::records(&util::read_state(&all));
    for name in &fed {
        let r = recs
            .get(&format!("{name}/index.md"))
            .unwrap_or_else(|| panic!("{name}/index.md not recorded"));
        assert_eq!(r["sha256"], sha256(body(name).as_bytes()).as_str());
    }
    assert_catalog_matches_disk(&all);
    let latest = dir.join("www-latest");
    assert_catalog_matches_disk(&latest);
    let owners: BTreeSet<_> = util::records(&util::read_state(&latest))
        .values()
        .map(|r| r["source"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        owners.len(),
        1,
        "replacement keeps one bundle's outputs: {owners:?}"
    );
    assert!(fed.is_superset(&owners));
    for place in [&all, &latest] {
        assert!(
            leftovers(place).is_empty(),
            "left behind in {}: {:?}",
            place.display(),
            leftovers(place)
        );
    }
    // A SIGKILL between creating and renaming a result or attempts file
    // leaves the dead process's temporary file inside the bundle; it must
    // not travel on into done/.
    let spool_left = leftovers(&dir.join("spool"));
    assert!(
        spool_left.is_empty(),
        "left behind in the spool: {spool_left:?}"
    );
}

/// Regression: the SIGKILL loop once found
/// `done/k0016/.distributor-tmp-20609-.distributor-result.json`.
#[test]
fn temporary_files_of_a_killed_agent_do_not_end_up_in_done() {
    let dir = Test::new();
    dir.config(&config_p(""));
    let b = dir.sealed("killed", &[("a.txt", b"a\n")]);
    // What a SIGKILL between creating and renaming these files leaves.
    fs::write(b.join(ATTEMPTS), "1\n").unwrap();
    fs::write(
        b.join(".distributor-tmp-999999-.distributor-attempts"),
        "2\n",
    )
    .unwrap();
    fs::write(
        b.join(".distributor-tmp-999999-.distributor-result.json"),
        "{\"ok\": tr",
    )
    .unwrap();
    drop_into(&b, &dir.spool("p", "work").join("killed"));
    dir.once().expect_code(0);
    let done = dir.spool("p", "done").join("killed");
    assert_eq!(result(&done)["ok"], true);
    assert_eq!(leftovers(&done), Vec::<String>::new());
}

// ---------------------------------------------------------------------------
// 7. transient failures
// ---------------------------------------------------------------------------

const LOCKED: &str = "  lock_timeout: 100ms\n  max_attempts: 3\n";

#[test]
fn a_held_root_lock_is_retried_with_backoff_then_fails_at_stage_lock() {
    let dir = Test::new();
    dir.config(&config_p(LOCKED));
    let www = dir.join("www");
    let _lock = hold_root_lock(&www);
    let b = dir.sealed("locked", &[("a.txt", b"a\n")]);
    drop_into(&b, &dir.spool("p", "inbox").join("locked"));

    let start = Instant::now();
    let out = dir.once();
    let elapsed = start.elapsed();
    out.expect_code(1);
    assert!(
        elapsed >= Duration::from_millis(2900),
        "three attempts with 1 s and 2 s of backoff cannot take {elapsed:?}"
    );
    let failed = dir.spool("p", "failed").join("locked");
    let r = result(&failed);
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["stage"], "lock", "{r}");
    assert!(r["error"].is_string(), "{r}");
    assert_eq!(attempts(&failed), Some(3), "max_attempts attempts are made");
    assert!(names(&dir.spool("p", "done")).is_empty());
    assert!(names(&dir.spool("p", "work")).is_empty());
    assert_eq!(
        files_below(&www),
        [".distributor.lock"],
        "nothing written under a held lock"
    );
}

#[test]
fn a_root_lock_released_between_attempts_lets_the_bundle_publish() {
    let dir = Test::new();
    dir.config(&config_p(LOCKED));
    let www = dir.join("www");
    let lock = hold_root_lock(&www);
    let b = dir.sealed("waits", &[("a.txt", b"a\n")]);
    drop_into(&b, &dir.spool("p", "inbox").join("waits"));

    let mut once = dir.agent_cmd().args(["agent", "--once"]).start();
    // Release the lock once the first attempt has failed (logged), during
    // the 1 s backoff, so the second attempt finds it free.
    once.wait_log("attempt 1/3", Duration::from_secs(20));
    drop(lock);
    let out = once.finish(DEADLINE);
    out.expect_code(0);

    let done = dir.spool("p", "done").join("waits");
    assert_eq!(result(&done)["ok"], true);
    assert_eq!(attempts(&done), Some(2));
    assert_eq!(fs::read_to_string(www.join("waits/a.txt")).unwrap(), "a\n");
    assert_catalog_matches_disk(&www);
    assert!(names(&dir.spool("p", "failed")).is_empty());
}

// ---------------------------------------------------------------------------
// 8. spool list / spool retry
// ---------------------------------------------------------------------------

#[test]
fn spool_list_and_retry_bring_a_fixed_bundle_back_through_the_agent() {
    let dir = Test::new();
    dir.config(&config_p(""));
    let inbox = dir.spool("p", "inbox");
    let ok = dir.sealed("fine", &[("a.txt", b"fine\n")]);
    drop_into(&ok, &inbox.join("fine"));
    let bad = dir.sealed("broken", &[("a.txt", b"as sealed\n")]);
    fs::write(bad.join("a.txt"), "AS SEALED\n").unwrap();
    drop_into(&bad, &inbox.join("broken"));
    dir.once().expect_code(1);

    let rows = dir.run(&["spool", "list", "--json"]).expect_code(0).json();
    let rows = rows.as_array().expect("spool list --json prints an array");
    assert_eq!(rows.len(), 2, "{rows:?}");
    let keys = set(&["pipeline_id", "spool", "name", "modified", "stage", "error"]);
    for row in rows {
        let got: BTreeSet<String> = row.as_object().unwrap().keys().cloned().collect();
        assert_eq!(got, keys, "{row}");
        assert_eq!(row["pipeline_id"], "p");
        let modified = row["modified"].as_str().unwrap();
        assert!(
            modified.contains('T') && modified.ends_with('Z'),
            "modified is RFC 3339 UTC: {modified}"
        );
    }
    let by_name: BTreeMap<&str, &Value> = rows
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r))
        .collect();
    assert_eq!(by_name["fine"]["spool"], "done");
    assert_eq!(by_name["fine"]["stage"], Value::Null);
    assert_eq!(by_name["fine"]["error"], Value::Null);
    assert_eq!(by_name["broken"]["spool"], "failed");
    assert_eq!(by_name["broken"]["stage"], "verify");
    assert!(
        by_name["broken"]["error"]
            .as_str()
            .unwrap()
            .contains("a.txt")
    );

    let failed_only = dir
        .run(&["spool", "list", "--failed", "--json"])
        .expect_code(0)
        .json();
    let failed_names: Vec<_> = failed_only
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(failed_names, ["broken"]);
    let done_only = dir
        .run(&["spool", "list", "--pipeline", "p", "--done", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(done_only.as_array().unwrap().len(), 1);
    assert_eq!(done_only[0]["name"], "fine");
    let text = dir
        .run(&["spool", "list", "--failed"])
        .expect_code(0)
        .stdout
        .clone();
    assert!(text.contains("broken") && !text.contains("fine"), "{text}");

    dir.run(&["spool", "retry", "p", "broken"]).expect_code(0);
    let back = inbox.join("broken");
    assert!(back.join("manifest.json").is_file());
    assert!(
        !back.join(RESULT).exists(),
        "retry keeps the old result file"
    );
    assert!(
        !back.join(ATTEMPTS).exists(),
        "retry keeps the attempt count"
    );
    assert!(names(&dir.spool("p", "failed")).is_empty());
    let listed = dir
        .run(&["spool", "list", "--inbox", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(listed[0]["name"], "broken");
    assert_eq!(listed[0]["spool"], "inbox");

    dir.seal(&back, "broken", Some(CREATED)).expect_code(0);
    dir.once().expect_code(0);
    let done = dir.spool("p", "done").join("broken");
    assert_eq!(result(&done)["ok"], true);
    assert_eq!(
        fs::read_to_string(dir.join("www/broken/a.txt")).unwrap(),
        "AS SEALED\n"
    );
    assert_catalog_matches_disk(&dir.join("www"));

    let missing = dir.run(&["spool", "retry", "p", "no-such-bundle"]);
    missing.expect_code(2);
    assert!(
        missing.stderr.contains("no-such-bundle"),
        "{}",
        missing.stderr
    );
    dir.run(&["spool", "retry", "p", "../done/fine"])
        .expect_code(2);
    dir.run(&["spool", "retry", "nope", "broken"])
        .expect_code(2);
    assert!(dir.spool("p", "done").join("fine").is_dir());
}

// ---------------------------------------------------------------------------
// 9. done/ retention
// ---------------------------------------------------------------------------

#[test]
fn a_live_agent_deletes_done_entries_older_than_done_retention() {
    let dir = Test::new();
    dir.config(&config_p(
        "  settle: 0s\n  rescan_interval: 60s\n  done_retention: 1s\n",
    ));
    let agent = dir.agent();
    let b = dir.sealed("old", &[("a.txt", b"a\n")]);
    drop_into(&b, &dir.spool("p", "inbox").join("old"));
    wait_done(&dir, &agent, "p", "old");
    let seen = Instant::now();
    let entry = dir.spool("p", "done").join("old");
    assert!(
        wait_for(DEADLINE, || !entry.exists()),
        "done/old still there {:?} after it appeared:\n{}",
        seen.elapsed(),
        agent.stderr()
    );
    let age = seen.elapsed();
    assert!(
        age >= Duration::from_millis(500),
        "removed after {age:?}, before it was 1 s old"
    );
    assert!(
        dir.join("www/old/a.txt").is_file(),
        "retention must not touch published outputs"
    );
    // SIGINT stops the agent like SIGTERM.
    stop_with(agent, libc::SIGINT);
}

/// A kill while the agent replaces one of its own bookkeeping files leaves
/// its temporary file: the batch file's in work/, the presence file's in
/// the pipeline's folder, a kept result's in `.distributor-results/`. The
/// next agent to take the pipeline removes them, and nothing else there.
#[test]
fn temporary_files_left_in_the_agents_own_folders_by_a_kill_are_removed_at_start() {
    let dir = Test::new();
    dir.config(&config_p(""));
    let work = dir.spool("p", "work");
    let pipeline = work.parent().unwrap().to_owned();
    let results = pipeline.join(".distributor-results");
    fs::create_dir_all(&work).unwrap();
    fs::create_dir_all(&results).unwrap();
    let temps = [
        work.join(".distributor-tmp-4242-7"),
        pipeline.join(".distributor-tmp-4242-0"),
        results.join(".distributor-tmp-4242-1"),
    ];
    for temp in &temps {
        fs::write(temp, "{\"partial\":").unwrap();
    }
    let kept = results.join("old.json");
    fs::write(&kept, "{}").unwrap();
    dir.once().expect_code(0);
    for temp in &temps {
        assert!(!temp.exists(), "{} is still there", temp.display());
    }
    assert!(
        leftovers(&pipeline).is_empty(),
        "{:?}",
        leftovers(&pipeline)
    );
    assert!(kept.is_file(), "a kept result was removed");
    assert!(
        pipeline.join(".distributor-agent.json").is_file(),
        "the presence file is missing"
    );
}

/// A live agent does not list the top of a root it left clean at every
/// publication (a root with thousands of `{source_id}/` folders), but a
/// temporary file anyone else leaves there (a killed `distributor run`)
/// changes the folder, and the agent's next publication removes it.
#[test]
fn live_agent_sweeps_a_temporary_file_left_at_the_top_of_its_root_by_another_process() {
    let dir = Test::new();
    dir.config(&config_p(
        "  settle: 50ms
  rescan_interval: 60s
",
    ));
    let agent = dir.agent();
    let www = dir.join("www");
    publish_live(&dir, &agent, "first", "# first\n");
    publish_live(&dir, &agent, "second", "# second\n");
    // What a run killed while staging leaves: a temporary file at the top.
    {
        let _lock = hold_root_lock(&www);
        fs::write(
            www.join(".distributor-tmp-4242-0"),
            "staged by a killed run",
        )
        .unwrap();
    }
    publish_live(&dir, &agent, "third", "# third\n");
    assert!(
        !www.join(".distributor-tmp-4242-0").exists(),
        "the agent's publication kept another process's stale temporary file"
    );
    assert_eq!(util::records(&util::read_state(&www)).len(), 3);
    assert_catalog_matches_disk(&www);
    stop(agent);
}
