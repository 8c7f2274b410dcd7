//! "It cannot lose or leak": the reliability claims of docs/reliability.md,
//! each attacked from outside through the real binary.
//!
//! - a live agent fed continuously and SIGKILLed at random instants loses,
//!   duplicates and mismatches nothing;
//! - two live agents over one config claim and publish each bundle once, and
//!   `run`, `prune --apply` and `reconcile-state` queued on a held root lock
//!   are serialised without losing a record;
//! - a table of hostile bundles is refused quickly, naming the culprit, and
//!   writes nothing at all;
//! - symbolic links in a root (at planned paths, at their parents, at
//!   recorded paths, and a root or folder swapped for a link while `run`
//!   publishes in a loop) never lead a write, a delete or a read outside.
//!
//! Randomised tests print their seed; set `DISTRIBUTOR_IT_SEED` to replay one.

use crate::util::{
    DEADLINE, Listed, Output, Proc, Rng, Test, assert_catalog_matches_disk, bundle_names as names,
    catches, instant_of, listed, manifest_digest, mkfifo, read_json, records, sha256, signal,
    strings, tree, wait_for, wait_past, write_file, write_manifest,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, symlink};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One entry of a [`snapshot`]: file type and permissions, size, mtime, inode.
type Stat = (u32, u64, i64, i64, u64);

/// Every entry below `dir` by relative path (`""` is `dir` itself), names
/// kept as bytes (bundles here hold non-UTF-8 names), links never followed.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Stat> {
    // Not util::tree: its paths are text, and these names may not be.
    fn stat_below(base: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Stat>) {
        let path = base.join(rel);
        let Ok(m) = fs::symlink_metadata(&path) else {
            return;
        };
        out.insert(
            rel.to_owned(),
            (m.mode(), m.size(), m.mtime(), m.mtime_nsec(), m.ino()),
        );
        if m.file_type().is_dir() {
            for e in fs::read_dir(&path).expect("read dir") {
                stat_below(base, &rel.join(e.expect("dir entry").file_name()), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    stat_below(dir, Path::new(""), &mut out);
    out
}

/// Temporary files and journals anywhere below `dir`.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    snapshot(dir)
        .into_keys()
        .filter(|p| {
            let name = p.file_name().map(OsStr::as_bytes).unwrap_or_default();
            name.starts_with(b".distributor-tmp-") || name == b".distributor-journal.json"
        })
        .collect()
}

/// Writes a bundle by hand (files, then a manifest with the digest of
/// docs/contract.md §3) and gives its manifest the modification time `order` seconds
/// after a fixed instant, so arrival order is exactly `order`.
fn stage_bundle(dir: &Path, id: &str, files: &[(String, Vec<u8>)], order: u64) {
    let mut list: Vec<Listed> = Vec::new();
    for (path, bytes) in files {
        write_file(&dir.join(path), bytes);
        list.push(listed(path, bytes));
    }
    write_manifest(dir, id, &list);
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000 + order);
    File::options()
        .write(true)
        .open(dir.join("manifest.json"))
        .expect("open manifest")
        .set_modified(when)
        .expect("set manifest mtime");
}

/// A live `distributor agent` on the test's config, output discarded.
fn live_agent(t: &Test) -> Child {
    t.cmd()
        .args(["--config", "config.yaml", "agent"])
        .spawn_quiet()
}

/// SIGTERMs a live agent once it handles the signal; asserts it exits 0.
fn stop_agent(mut agent: Child, what: &str) {
    assert!(
        wait_for(Duration::from_secs(20), || catches(
            agent.id(),
            &[libc::SIGTERM]
        )),
        "{what} never installed its SIGTERM handler"
    );
    signal(agent.id(), libc::SIGTERM);
    let mut status = None;
    assert!(
        wait_for(Duration::from_secs(60), || {
            status = agent.try_wait().expect("wait for agent");
            status.is_some()
        }),
        "{what} did not stop after SIGTERM"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{what}: {status:?}");
}

// ---------------------------------------------------------------------------
// 1. A live agent, fed continuously, SIGKILLed at random instants
// ---------------------------------------------------------------------------

const KILL_ITERATIONS: usize = 50;
const FED_BUNDLES: usize = 300;

/// Bundle `i` of the kill loop. Every bundle rewrites `shared/all.txt`;
/// groups of bundles share `group<k>/g.txt` and `deep/a/b/c/d.txt`, so the
/// replacement root keeps deleting what the previous bundle had and the
/// additive root keeps overwriting paths other bundles own.
fn kill_loop_files(i: usize) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            format!("own/{i:03}.txt"),
            format!("bundle {i}\n").into_bytes(),
        ),
        (
            "shared/all.txt".to_owned(),
            format!("bundle {i} wrote this\n").into_bytes(),
        ),
    ];
    if !i.is_multiple_of(3) {
        files.push((
            format!("group{}/g.txt", i % 7),
            format!("group {} from bundle {i}\n", i % 7).into_bytes(),
        ));
    }
    if i.is_multiple_of(5) {
        files.push((
            "deep/a/b/c/d.txt".to_owned(),
            format!("{i} ").repeat(i % 40 + 1).into_bytes(),
        ));
    }
    files
}

#[test]
fn sigkill_loop_against_a_fed_live_agent_loses_duplicates_and_mismatches_nothing() {
    let t = Test::on_tmpfs();
    t.config(
        "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 1s
  done_retention: 0s
  prune_interval: 0s
pipelines:
  - id: p
    destinations:
      - id: add
        path: ./roots/add
        workflow: additive
      - id: rep
        path: ./roots/rep
        workflow: replacement
",
    );
    let inbox = t.mkdir("spool/p/inbox");
    let work = t.join("spool/p/work");
    let done = t.join("spool/p/done");
    let failed = t.join("spool/p/failed");
    let staging = t.mkdir("staging");
    let all_files: Vec<Vec<(String, Vec<u8>)>> = (0..FED_BUNDLES).map(kill_loop_files).collect();
    for (i, files) in all_files.iter().enumerate() {
        stage_bundle(
            &staging.join(format!("b{i:03}")),
            &format!("b{i:03}"),
            files,
            i as u64,
        );
    }

    let mut rng = Rng::seeded("sigkill loop");
    let fed = Arc::new(Mutex::new(Vec::<String>::new()));
    let feeder = {
        let (fed, inbox, staging) = (fed.clone(), inbox.clone(), staging.clone());
        let mut rng = rng.split();
        std::thread::spawn(move || {
            // Bursts of one to three bundles, the next burst once an agent
            // has claimed the last: bundles arrive while agents live, start
            // and die.
            let mut i = 0;
            while i < FED_BUNDLES {
                for _ in 0..(1 + rng.below(3)).min((FED_BUNDLES - i) as u64) {
                    let name = format!("b{i:03}");
                    fs::rename(staging.join(&name), inbox.join(&name)).expect("drop a bundle");
                    fed.lock().expect("fed list").push(name);
                    i += 1;
                }
                wait_for(Duration::from_secs(20), || names(&inbox).is_empty());
            }
        })
    };

    let started = Instant::now();
    let (mut iterations, mut left_in_work, mut mid_publication) = (0usize, 0usize, 0usize);
    while iterations < KILL_ITERATIONS || !feeder.is_finished() {
        assert!(iterations < 2000, "the feeder never finished");
        let mut agent = live_agent(&t);
        sleep(rng.millis(5, 250));
        agent.kill().expect("SIGKILL the agent");
        let status = agent.wait().expect("reap the agent");
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "iteration {iterations}: the agent exited on its own: {status}"
        );
        iterations += 1;
        left_in_work += usize::from(!names(&work).is_empty());
        mid_publication += usize::from(
            ["roots/add", "roots/rep"]
                .iter()
                .any(|r| t.join(r).join(".distributor-journal.json").exists()),
        );
    }
    feeder.join().expect("feeder");
    let fed: Vec<String> = fed.lock().expect("fed list").clone();
    let in_done_before_drain = names(&done).len();

    let drain = t.run(&["agent", "--once"]);

    // Count before asserting, so a failure prints the whole picture.
    let done_names: BTreeSet<String> = names(&done).into_iter().collect();
    let fed_set: BTreeSet<String> = fed.iter().cloned().collect();
    let missing: Vec<&String> = fed.iter().filter(|n| !done_names.contains(*n)).collect();
    let extra: Vec<&String> = done_names.difference(&fed_set).collect();
    let stuck: Vec<String> = [&inbox, &work, &failed]
        .iter()
        .flat_map(|d| {
            names(d)
                .into_iter()
                .map(move |n| format!("{}/{n}", d.display()))
        })
        .collect();
    let lost = missing.len() + extra.len() + stuck.len();

    // What each root must hold: additive, every path as its last writer
    // left it; replacement, exactly the last bundle.
    let mut expect_add: BTreeMap<String, (String, Vec<u8>)> = BTreeMap::new();
    for (i, files) in all_files.iter().enumerate() {
        for (path, bytes) in files {
            expect_add.insert(path.clone(), (format!("b{i:03}"), bytes.clone()));
        }
    }
    let last = FED_BUNDLES - 1;
    let expect_rep: BTreeMap<String, (String, Vec<u8>)> = all_files[last]
        .iter()
        .map(|(p, b)| (p.clone(), (format!("b{last:03}"), b.clone())))
        .collect();
    let mut mismatched = Vec::new();
    for (root, expect) in [("roots/add", &expect_add), ("roots/rep", &expect_rep)] {
        let recs = if t.join(root).join(".distributor.json").exists() {
            t.recorded(root)
        } else {
            BTreeMap::new()
        };
        let recorded: BTreeSet<&String> = recs.keys().collect();
        let expected: BTreeSet<&String> = expect.keys().collect();
        for path in recorded.symmetric_difference(&expected) {
            mismatched.push(format!("{root}/{path}: recorded or expected, not both"));
        }
        for (path, (owner, bytes)) in expect {
            let Some(r) = recs.get(path) else { continue };
            let on_disk = fs::read(t.join(root).join(path)).unwrap_or_default();
            if r["source"]["id"] != owner.as_str()
                || on_disk != *bytes
                || r["sha256"] != sha256(&on_disk).as_str()
                || r["size"] != on_disk.len()
            {
                mismatched.push(format!(
                    "{root}/{path}: recorded {} {}, expected {owner}",
                    r["source"]["id"], r["sha256"]
                ));
            }
        }
    }
    eprintln!(
        "sigkill loop: {iterations} SIGKILLs in {:?}, {} bundles fed, {in_done_before_drain} in done/ before the drain, {left_in_work} kills left bundles in work/, {mid_publication} left a root journal; lost {lost}, mismatched {}",
        started.elapsed(),
        fed.len(),
        mismatched.len()
    );

    drain.expect_code(0);
    assert_eq!(fed.len(), FED_BUNDLES);
    assert!(iterations >= KILL_ITERATIONS);
    assert_eq!(
        lost, 0,
        "missing from done/: {missing:?}; unexpected in done/: {extra:?}; left in the spool: {stuck:?}"
    );
    assert!(mismatched.is_empty(), "mismatched: {mismatched:#?}");
    assert!(
        left_in_work > 0,
        "no SIGKILL landed while a bundle was in hand: the loop proves nothing"
    );
    for name in &fed {
        let r = read_json(&done.join(name).join(".distributor-result.json"));
        assert_eq!(r["ok"], true, "{name}: {r}");
        assert_eq!(r["source"]["id"], name.as_str(), "{name}");
    }
    assert_catalog_matches_disk(&t.join("roots/add"));
    assert_catalog_matches_disk(&t.join("roots/rep"));
    for dir in ["roots", "spool"] {
        assert_eq!(leftovers(&t.join(dir)), Vec::<PathBuf>::new(), "{dir}");
    }
}

// ---------------------------------------------------------------------------
// 2. Concurrency: two agents, and commands queued on a held root lock
// ---------------------------------------------------------------------------

#[test]
fn two_live_agents_claim_and_publish_every_bundle_once() {
    const PER_PIPELINE: usize = 60;
    let t = Test::on_tmpfs();
    // Two pipelines sharing a root, so two agents (one serving each
    // pipeline) really publish into one root at the same time.
    t.config(
        "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 1s
  done_retention: 0s
  prune_interval: 0s
pipelines:
  - id: p1
    destinations:
      - id: d
        path: ./shared
      - id: latest
        path: ./latest1
        workflow: replacement
  - id: p2
    destinations:
      - id: d
        path: ./shared
",
    );
    let staging = t.mkdir("staging");
    let mut order = Vec::new();
    for i in 0..PER_PIPELINE {
        for (pipeline, tag) in [("p1", "x"), ("p2", "y")] {
            let name = format!("{tag}{i:03}");
            let files = vec![
                (
                    format!("{pipeline}/{i:03}.txt"),
                    format!("{name}\n").into_bytes(),
                ),
                (
                    format!("{pipeline}/latest.txt"),
                    format!("{name} latest\n").into_bytes(),
                ),
            ];
            stage_bundle(&staging.join(&name), &name, &files, order.len() as u64);
            order.push((pipeline, name));
        }
    }
    t.mkdir("spool/p1/inbox");
    t.mkdir("spool/p2/inbox");

    let mut rng = Rng::seeded("two agents");
    let started = Instant::now();
    let mut agents = [live_agent(&t), live_agent(&t)];
    let mut interrupted = BTreeSet::new();
    let mut kills = 0;
    for (k, (pipeline, name)) in order.iter().enumerate() {
        fs::rename(
            staging.join(name),
            t.join(&format!("spool/{pipeline}/inbox/{name}")),
        )
        .expect("drop a bundle");
        // Bursts: most drops follow each other at once; after the others
        // the agents claim what arrived so far first.
        if rng.below(3) == 0 {
            assert!(
                wait_for(Duration::from_secs(20), || ["p1", "p2"]
                    .iter()
                    .all(|p| names(&t.join(&format!("spool/{p}/inbox"))).is_empty())),
                "the agents claimed nothing within 20 s"
            );
        }
        if k % 16 == 15 {
            // SIGKILL one agent mid-stream (each in turn): the other takes
            // its pipelines over. The other is frozen meanwhile so work/
            // can be read as the kill left it: only bundles found there may
            // be published twice.
            let (victim, other) = (kills % 2, 1 - kills % 2);
            signal(agents[other].id(), libc::SIGSTOP);
            agents[victim].kill().expect("SIGKILL an agent");
            agents[victim].wait().expect("reap");
            for pipeline in ["p1", "p2"] {
                interrupted.extend(names(&t.join(&format!("spool/{pipeline}/work"))));
            }
            signal(agents[other].id(), libc::SIGCONT);
            agents[victim] = live_agent(&t);
            kills += 1;
        }
    }
    let all_done = wait_for(Duration::from_secs(60), || {
        names(&t.join("spool/p1/done")).len() + names(&t.join("spool/p2/done")).len() >= order.len()
    });
    let took = started.elapsed();
    let [first, second] = agents;
    stop_agent(first, "first agent");
    stop_agent(second, "second agent");
    assert!(all_done, "not every bundle reached done/ within 60 s");
    let mut republished = BTreeSet::new();

    for (pipeline, tag) in [("p1", "x"), ("p2", "y")] {
        let expected: BTreeSet<String> =
            (0..PER_PIPELINE).map(|i| format!("{tag}{i:03}")).collect();
        let done = t.join(&format!("spool/{pipeline}/done"));
        assert_eq!(
            names(&done).into_iter().collect::<BTreeSet<_>>(),
            expected,
            "{pipeline}: each bundle in done/ once"
        );
        for folder in ["inbox", "work", "failed"] {
            let left = names(&t.join(&format!("spool/{pipeline}/{folder}")));
            assert!(left.is_empty(), "{pipeline}/{folder}: {left:?}");
        }
        for name in &expected {
            let r = read_json(&done.join(name).join(".distributor-result.json"));
            assert_eq!(r["ok"], true, "{name}: {r}");
            // No counter: published by a batch in its one attempt.
            let attempts = fs::read_to_string(done.join(name).join(".distributor-attempts"))
                .unwrap_or_else(|_| "1".to_owned());
            if attempts.trim() != "1" {
                republished.insert(name.clone());
            }
        }
    }
    eprintln!(
        "two agents: {} bundles in {took:?}, {kills} SIGKILLs mid-stream with {} bundle(s) in work/; {} published more than once",
        order.len(),
        interrupted.len(),
        republished.len()
    );
    assert!(
        republished.is_subset(&interrupted),
        "published more than once without being interrupted: {:?}",
        republished.difference(&interrupted).collect::<Vec<_>>()
    );
    let shared = t.recorded("shared");
    for (pipeline, name) in &order {
        let i = &name[1..];
        let r = &shared[&format!("{pipeline}/{i}.txt")];
        assert_eq!(r["pipeline_id"], *pipeline);
        assert_eq!(r["source"]["id"], name.as_str());
    }
    for pipeline in ["p1", "p2"] {
        let last = order.iter().rev().find(|(p, _)| *p == pipeline).unwrap();
        assert_eq!(
            shared[&format!("{pipeline}/latest.txt")]["source"]["id"],
            last.1.as_str(),
            "{pipeline}: the last arrival owns latest.txt"
        );
    }
    let latest = t.recorded("latest1");
    assert_eq!(
        latest.keys().cloned().collect::<Vec<_>>(),
        [
            format!("p1/{:03}.txt", PER_PIPELINE - 1),
            "p1/latest.txt".to_owned()
        ],
        "replacement holds exactly the last p1 bundle"
    );
    assert_catalog_matches_disk(&t.join("shared"));
    assert_catalog_matches_disk(&t.join("latest1"));
    for dir in ["shared", "latest1", "spool"] {
        assert_eq!(leftovers(&t.join(dir)), Vec::<PathBuf>::new(), "{dir}");
    }
}

const SHARED_ROOT_CONFIG: &str = "spool: ./spool
pipelines:
  - id: a
    destinations:
      - id: site
        path: ./site
        retention:
          prune: {max_age: 1ms, keep_latest: 1}
  - id: b
    destinations:
      - id: site
        path: ./site
";

/// Waits until every record of `site` is older than the `max_age` (1 ms)
/// of [`SHARED_ROOT_CONFIG`].
fn older_than_max_age(t: &Test) {
    let newest = t
        .recorded("site")
        .values()
        .map(|r| instant_of(&r["updated_at"]))
        .max()
        .expect("a record");
    wait_past(newest, Duration::from_millis(1));
}

/// `run`, `prune --apply` and `reconcile-state` on one root, all started at
/// once, logging at info. Returns them in that order: run a, run b, prune,
/// reconcile.
fn start_four(t: &Test, a: &Path, b: &Path) -> Vec<Proc> {
    let base = ["--config", "config.yaml"];
    let run = |pipeline: &str, bundle: &Path| {
        t.cmd()
            .env("RUST_LOG", "info")
            .args(base)
            .args(["run", "--json", "--pipeline", pipeline])
            .arg(bundle)
            .start()
    };
    vec![
        run("a", a),
        run("b", b),
        t.cmd()
            .env("RUST_LOG", "info")
            .args(base)
            .args([
                "prune",
                "--json",
                "--apply",
                "--pipeline",
                "a",
                "--destination",
                "site",
            ])
            .start(),
        t.cmd()
            .env("RUST_LOG", "info")
            .args(base)
            .args([
                "reconcile-state",
                "--json",
                "--pipeline",
                "b",
                "--destination",
                "site",
            ])
            .start(),
    ]
}

fn bundle_created(t: &Test, name: &str, day: u32, files: &[(&str, &str)]) -> PathBuf {
    t.bundle_at(name, name, &format!("2026-05-{day:02}T00:00:00Z"), files)
}

#[test]
fn runs_prune_and_reconcile_queued_on_a_held_root_lock_lose_no_record() {
    let t = Test::new();
    t.config(SHARED_ROOT_CONFIG);
    let a0 = bundle_created(&t, "a0", 1, &[("a0.txt", "a0"), ("a-common.txt", "a0")]);
    let a1 = bundle_created(&t, "a1", 2, &[("a1.txt", "a1"), ("a-common.txt", "a1")]);
    let a2 = bundle_created(&t, "a2", 3, &[("a2.txt", "a2")]);
    let b0 = bundle_created(&t, "b0", 1, &[("b0.txt", "b0"), ("b-gone.txt", "gone")]);
    let b1 = bundle_created(&t, "b1", 2, &[("b1.txt", "b1")]);
    for (p, b) in [("a", &a0), ("a", &a1), ("b", &b0)] {
        t.publish(p, b, &[]).expect_code(0);
    }
    fs::remove_file(t.join("site/b-gone.txt")).unwrap();
    older_than_max_age(&t);

    let site = t.join("site");
    let lock = crate::util::hold_root_lock(&site);
    let before = tree(&site);
    let mut children = start_four(&t, &a2, &b1);
    for c in &mut children {
        c.wait_log("waiting for the lock on", DEADLINE);
        assert!(c.running(), "a command did not wait for the held lock");
    }
    assert_eq!(tree(&site), before, "something changed under a held lock");
    drop(lock);
    let outs: Vec<Output> = children
        .into_iter()
        .map(|mut c| c.finish(DEADLINE))
        .collect();
    for o in &outs {
        o.expect_code(0);
    }
    assert!(strings(&outs[2].json()["deletes"]).contains(&"a0.txt".to_owned()));
    assert_eq!(strings(&outs[3].json()["missing"]), ["b-gone.txt"]);

    let recs = t.recorded("site");
    for (path, owner) in [("a2.txt", "a2"), ("b0.txt", "b0"), ("b1.txt", "b1")] {
        assert_eq!(recs[path]["source"]["id"], owner, "{path}");
    }
    assert!(!recs.contains_key("a0.txt"), "pruned");
    assert!(!recs.contains_key("b-gone.txt"), "reconciled");
    assert_catalog_matches_disk(&site);
    eprintln!(
        "held lock: 4 commands queued and serialised; prune deleted {:?}",
        strings(&outs[2].json()["deletes"])
    );
}

#[test]
fn runs_prune_and_reconcile_racing_on_one_root_lose_no_record() {
    const ROUNDS: u32 = 8;
    let t = Test::on_tmpfs();
    t.config(SHARED_ROOT_CONFIG);
    let a0 = bundle_created(&t, "a-0", 1, &[("a/0.txt", "a0")]);
    let b0 = bundle_created(&t, "b-0", 1, &[("b/0.txt", "b0"), ("b/gone-0.txt", "g")]);
    t.publish("a", &a0, &[]).expect_code(0);
    t.publish("b", &b0, &[]).expect_code(0);
    let site = t.join("site");
    for n in 1..=ROUNDS {
        fs::remove_file(site.join(format!("b/gone-{}.txt", n - 1))).unwrap();
        let (ta, tb) = (format!("a{n}"), format!("b{n}"));
        let a = bundle_created(
            &t,
            &format!("a-{n}"),
            n + 1,
            &[(&format!("a/{n}.txt"), &ta)],
        );
        let b = bundle_created(
            &t,
            &format!("b-{n}"),
            n + 1,
            &[
                (&format!("b/{n}.txt"), &tb),
                (&format!("b/gone-{n}.txt"), "g"),
            ],
        );
        older_than_max_age(&t);
        let outs: Vec<Output> = start_four(&t, &a, &b)
            .into_iter()
            .map(|mut c| c.finish(DEADLINE))
            .collect();
        for o in &outs {
            o.expect_code(0);
        }
        let recs = t.recorded("site");
        assert_eq!(
            recs[&format!("a/{n}.txt")]["source"]["id"],
            format!("a-{n}")
        );
        for k in 0..n.saturating_sub(1) {
            assert!(
                !recs.contains_key(&format!("a/{k}.txt")),
                "round {n}: a/{k}"
            );
        }
        for k in 0..=n {
            assert_eq!(
                recs[&format!("b/{k}.txt")]["source"]["id"],
                format!("b-{k}"),
                "round {n}: b/{k}.txt lost"
            );
        }
        assert!(
            !recs.contains_key(&format!("b/gone-{}.txt", n - 1)),
            "round {n}"
        );
        assert_catalog_matches_disk(&site);
    }
    eprintln!("racing commands: {ROUNDS} rounds of run+run+prune+reconcile, no record lost");
}

// ---------------------------------------------------------------------------
// 3. Hostile bundles
// ---------------------------------------------------------------------------

/// A manifest document for `files`, with the correct digest.
fn manifest_doc(id: &str, files: &[Listed]) -> Value {
    json!({
        "schema_version": 1,
        "id": id,
        "created": crate::util::CREATED,
        "digest": manifest_digest(files),
        "files": files
            .iter()
            .map(|(p, s, n)| json!({"path": p, "sha256": s, "size": n}))
            .collect::<Vec<_>>(),
    })
}

struct Hostile {
    what: &'static str,
    dir: PathBuf,
    /// Each must appear in the error of `run --json` and in the output of
    /// `bundle verify`.
    needles: Vec<String>,
}

/// Builds every hostile bundle below `bundles/`.
fn hostile_bundles(t: &Test) -> Vec<Hostile> {
    let mut cases = Vec::new();
    let mut add = |what: &'static str, dir: PathBuf, needles: &[&str]| {
        cases.push(Hostile {
            what,
            dir,
            needles: needles.iter().map(|s| (*s).to_owned()).collect(),
        });
    };
    let ok = listed("ok.txt", b"fine\n");
    // A bundle holding ok.txt, whose manifest (correct digest) lists it and
    // `extra`; whatever else the case needs on disk the caller puts there.
    let listing = |name: &str, extra: Vec<Listed>| -> PathBuf {
        let dir = t.mkdir(&format!("bundles/{name}"));
        write_file(&dir.join("ok.txt"), b"fine\n");
        let mut files = vec![ok.clone()];
        files.extend(extra);
        write_manifest(&dir, name, &files);
        dir
    };
    // A bundle whose manifest is `doc` (edited), holding ok.txt.
    let raw = |name: &str, edit: &dyn Fn(&mut Value)| -> PathBuf {
        let dir = t.mkdir(&format!("bundles/{name}"));
        write_file(&dir.join("ok.txt"), b"fine\n");
        let mut doc = manifest_doc(name, std::slice::from_ref(&ok));
        edit(&mut doc);
        write_file(
            &dir.join("manifest.json"),
            serde_json::to_string_pretty(&doc).unwrap().as_bytes(),
        );
        dir
    };
    // A bundle with bytes written verbatim as its manifest.
    let verbatim = |name: &str, bytes: &[u8]| -> PathBuf {
        let dir = t.mkdir(&format!("bundles/{name}"));
        write_file(&dir.join("ok.txt"), b"fine\n");
        write_file(&dir.join("manifest.json"), bytes);
        dir
    };

    t.write("bundles/outside.txt", "x");
    add(
        "dot-dot",
        listing("dotdot", vec![listed("../outside.txt", b"x")]),
        &["../outside.txt", "'..'"],
    );
    let abs = t.join("bundles/outside.txt").to_str().unwrap().to_owned();
    add(
        "absolute",
        listing("absolute", vec![listed(&abs, b"x")]),
        &[&abs, "starts with '/'"],
    );
    t.write("bundles/dot/a/b.txt", "b");
    add(
        "dot segment",
        listing("dot", vec![listed("a/./b.txt", b"b")]),
        &["a/./b.txt", "'.' segment"],
    );
    add(
        "backslash",
        listing("backslash", vec![listed("a\\b.txt", b"b")]),
        &["\"path\"", "backslash"],
    );
    add(
        "NUL",
        listing("nul", vec![listed("a\0b.txt", b"b")]),
        &["\"path\"", "control character"],
    );
    add(
        "control character",
        listing("control", vec![listed("a\x1bb.txt", b"b")]),
        &["\"path\"", "control character"],
    );
    let long_segment = "s".repeat(256);
    add(
        "256-byte segment",
        listing("long-segment", vec![listed(&long_segment, b"b")]),
        &[&long_segment, "longer than 255 bytes"],
    );
    let long_path = vec!["p".repeat(200); 21].join("/");
    add(
        "path over 4096 bytes",
        listing("long-path", vec![listed(&long_path, b"b")]),
        &["\"path\"", "longer than 4096 bytes"],
    );
    add(
        "duplicate path",
        listing("duplicate", vec![ok.clone()]),
        &["ok.txt", "more than once"],
    );
    t.write("bundles/file-and-folder/a/b", "b");
    add(
        "a and a/b",
        listing(
            "file-and-folder",
            vec![listed("a", b"a"), listed("a/b", b"b")],
        ),
        &["\"a\"", "\"a/b\"", "folder"],
    );
    t.write("bundles/reserved-state/.distributor.json", "{}");
    add(
        "reserved .distributor.json",
        listing("reserved-state", vec![listed(".distributor.json", b"{}")]),
        &[".distributor.json", "reserved"],
    );
    t.write("bundles/reserved-tmp/x/.distributor-tmp", "t");
    add(
        "reserved x/.distributor-tmp",
        listing("reserved-tmp", vec![listed("x/.distributor-tmp", b"t")]),
        &["x/.distributor-tmp", "reserved"],
    );
    add(
        "manifest.json listed",
        listing("lists-manifest", vec![listed("manifest.json", b"{}")]),
        &["manifest.json", "manifest itself"],
    );

    // Files that are not what the manifest says they are.
    let same = t.write("same-bytes.txt", "link\n");
    let dir = listing("file-symlink", vec![listed("link.txt", b"link\n")]);
    symlink(&same, dir.join("link.txt")).unwrap();
    add("symlink to a file", dir, &["link.txt", "symbolic link"]);
    t.write("elsewhere/in.txt", "in\n");
    let dir = listing("folder-symlink", vec![listed("sub/in.txt", b"in\n")]);
    symlink(t.join("elsewhere"), dir.join("sub")).unwrap();
    add(
        "symlinked folder in the path",
        dir,
        &["sub", "symbolic link"],
    );
    let dir = listing("fifo", vec![listed("pipe.txt", b"")]);
    mkfifo(&dir.join("pipe.txt"));
    add("FIFO", dir, &["pipe.txt", "FIFO"]);
    let dir = listing("socket", vec![listed("sock", b"")]);
    let listener = std::os::unix::net::UnixListener::bind(dir.join("sock")).expect("bind socket");
    drop(listener);
    add("unix socket", dir, &["sock", "socket"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let dir = listing("device", vec![listed("null", b"")]);
        let c = CString::new(dir.join("null").as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
        if rc == 0 {
            add("character device", dir, &["null", "character device"]);
        } else {
            eprintln!(
                "hostile bundles: skipped the device row: mknod: {}",
                std::io::Error::last_os_error()
            );
        }
    } else {
        eprintln!("hostile bundles: skipped the device row: mknod needs root");
    }
    let dir = listing("grows", vec![listed("grows.txt", b"short\n")]);
    write_file(&dir.join("grows.txt"), b"short\nand then some more\n");
    add("file grown after sealing", dir, &["grows.txt", "size is"]);
    let dir = listing("tampered", vec![listed("t.txt", b"tttt\n")]);
    write_file(&dir.join("t.txt"), b"TTTT\n");
    add("content changed", dir, &["t.txt", "does not match"]);
    add(
        "listed file missing",
        listing("missing", vec![listed("missing.txt", b"m")]),
        &["missing.txt", "not found"],
    );

    // Manifests that are too big, too deep or not UTF-8.
    let mut big = b"{\"schema_version\": 1, \"pad\": \"".to_vec();
    big.resize(50 << 20, b'x');
    big.extend_from_slice(b"\"}");
    add(
        "50 MB manifest",
        verbatim("huge-manifest", &big),
        &["manifest.json", "more than the 51200000 bytes read at most"],
    );
    // Deep nesting: skipped iteratively under an unknown key (no stack
    // overflow, reported where the text ends), refused at once elsewhere.
    let mut deep = b"{\"schema_version\": 1, \"x\": ".to_vec();
    deep.resize(deep.len() + 100_000, b'[');
    add(
        "100k nested arrays never closed",
        verbatim("deep", &deep),
        &["manifest.json", "ends early"],
    );
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let dir = listing("deep-path", Vec::new());
    let text = fs::read_to_string(dir.join("manifest.json")).unwrap();
    fs::write(
        dir.join("manifest.json"),
        text.replace("\"ok.txt\"", &nested),
    )
    .unwrap();
    add(
        "100k nested arrays as a path",
        dir,
        &["\"path\"", "invalid type"],
    );
    add(
        "100k nested arrays at the top",
        verbatim("deep-top", &vec![b'['; 100_000]),
        &["manifest.json", "JSON object"],
    );
    let mut doc =
        serde_json::to_string(&manifest_doc("raw-latin1", std::slice::from_ref(&ok))).unwrap();
    doc = doc.replace("ok.txt", "caf\u{e9}.txt");
    let bytes = doc.replace('\u{e9}', "\u{1}").into_bytes();
    let bytes: Vec<u8> = bytes
        .into_iter()
        .map(|b| if b == 1 { 0xe9 } else { b })
        .collect();
    add(
        "non-UTF-8 bytes in the manifest",
        verbatim("raw-latin1", &bytes),
        &["manifest.json", "not UTF-8"],
    );
    let dir = listing("lone-surrogate", Vec::new());
    let text = fs::read_to_string(dir.join("manifest.json")).unwrap();
    fs::write(
        dir.join("manifest.json"),
        text.replace("\"ok.txt\"", "\"\\udce9.txt\""),
    )
    .unwrap();
    add(
        "non-UTF-8 name escaped in the manifest",
        dir,
        &["manifest.json", "surrogate"],
    );
    let dir = listing("latin1-name", vec![listed("caf\u{e9}.txt", b"c")]);
    write_file(&dir.join(OsStr::from_bytes(b"caf\xe9.txt")), b"c");
    add(
        "non-UTF-8 name present, UTF-8 name listed",
        dir,
        &["caf\u{e9}.txt", "not found"],
    );

    // Wrong shapes and values, digest recomputed unless the case is about it.
    add(
        "size as a string",
        raw("size-string", &|d| d["files"][0]["size"] = json!("5")),
        &["\"size\"", "invalid type"],
    );
    add(
        "files as an object",
        raw("files-object", &|d| d["files"] = json!({"ok.txt": 5})),
        &["\"files\"", "invalid type"],
    );
    add(
        "negative size",
        raw("negative-size", &|d| d["files"][0]["size"] = json!(-5)),
        &["\"size\"", "negative"],
    );
    let dir = raw("huge-size", &|_| {});
    let text = fs::read_to_string(dir.join("manifest.json")).unwrap();
    fs::write(
        dir.join("manifest.json"),
        text.replace("\"size\": 5", "\"size\": 18446744073709551616"),
    )
    .unwrap();
    add("size over u64", dir, &["\"size\"", "too large"]);
    add(
        "uppercase hex",
        raw("uppercase", &|d| {
            let upper = d["files"][0]["sha256"]
                .as_str()
                .unwrap()
                .replace("sha256:", "");
            d["files"][0]["sha256"] = json!(format!("sha256:{}", upper.to_uppercase()));
        }),
        &["\"sha256\"", "uppercase"],
    );
    add(
        "missing digest",
        raw("no-digest", &|d| {
            d.as_object_mut().unwrap().remove("digest");
        }),
        &["digest", "missing field"],
    );
    add(
        "wrong digest",
        raw("wrong-digest", &|d| {
            d["digest"] = json!(format!("sha256:{}", "0".repeat(64)))
        }),
        &["\"digest\"", "listed files give"],
    );
    add(
        "empty files list",
        raw("no-files", &|d| d["files"] = json!([])),
        &["\"files\" is empty"],
    );
    add(
        "schema_version 2",
        raw("schema-2", &|d| d["schema_version"] = json!(2)),
        &["\"schema_version\" 2"],
    );
    cases
}

#[test]
fn hostile_bundles_are_refused_naming_the_culprit_and_write_nothing() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        publish: {source: true, html: true}
",
    );
    let cases = hostile_bundles(&t);
    let outside_bundles = |snap: BTreeMap<PathBuf, Stat>| -> BTreeMap<PathBuf, Stat> {
        snap.into_iter()
            .filter(|(p, _)| !p.starts_with("bundles") && !p.as_os_str().is_empty())
            .collect()
    };
    let before = outside_bundles(snapshot(t.path()));
    let mut slowest = Duration::ZERO;
    for case in &cases {
        let what = case.what;
        let bundle_before = snapshot(&case.dir);

        let start = Instant::now();
        let out = t.publish("p", &case.dir, &[]);
        let took = start.elapsed();
        slowest = slowest.max(took);
        assert_eq!(out.code, 1, "{what}: run\n{}", out.all());
        let doc = out.json();
        assert_eq!(doc["ok"], false, "{what}");
        assert_eq!(doc["stage"], "verify", "{what}: {doc}");
        let error = doc["error"].as_str().unwrap_or_default();
        for needle in &case.needles {
            assert!(
                error.contains(needle.as_str()),
                "{what}: run error lacks {needle:?}: {error}"
            );
        }
        assert!(!t.join("site").exists(), "{what}: the root was created");

        let start = Instant::now();
        let out = t.cmd().args(["bundle", "verify"]).arg(&case.dir).output();
        let took = start.elapsed();
        slowest = slowest.max(took);
        assert_eq!(out.code, 1, "{what}: bundle verify\n{}", out.all());
        for needle in &case.needles {
            assert!(
                out.all().contains(needle.as_str()),
                "{what}: bundle verify lacks {needle:?}: {}",
                out.all()
            );
        }
        assert_eq!(
            snapshot(&case.dir),
            bundle_before,
            "{what}: the bundle changed"
        );
    }
    assert_eq!(
        outside_bundles(snapshot(t.path())),
        before,
        "something was written outside the bundles"
    );
    eprintln!(
        "hostile bundles: {} cases refused by run and bundle verify, slowest {slowest:?}, nothing written",
        cases.len()
    );
    assert!(cases.len() >= 25);
}

// ---------------------------------------------------------------------------
// 4. Hostile roots
// ---------------------------------------------------------------------------

/// Symlinks planted in a root at a planned path or at a planned path's
/// parent, pointing inside or outside: refused as unmanaged, and nothing
/// changes anywhere (the root, the link targets, the outside folder).
#[test]
fn symlinks_at_planned_paths_or_their_parents_are_refused_and_nothing_is_written() {
    // (what, link path in the root, target relative to the test folder,
    //  the path the bundle lists, the unmanaged path reported)
    let rows: &[(&str, &str, &str, &str, &str)] = &[
        (
            "unrecorded file link to outside",
            "a.txt",
            "outside/target.txt",
            "a.txt",
            "a.txt",
        ),
        (
            "unrecorded folder link to outside",
            "a.txt",
            "outside/dir",
            "a.txt",
            "a.txt",
        ),
        (
            "parent link to outside",
            "sub",
            "outside/dir",
            "sub/a.txt",
            "sub",
        ),
        (
            "parent link inside the root",
            "sub",
            "site/real",
            "sub/a.txt",
            "sub",
        ),
        (
            "deeper parent link inside the root",
            "real/deeper",
            "site/real",
            "real/deeper/a.txt",
            "real/deeper",
        ),
        (
            "deeper parent link to outside",
            "real/deeper",
            "outside/dir",
            "real/deeper/a.txt",
            "real/deeper",
        ),
    ];
    let mut refused = 0;
    for workflow in ["additive", "replacement"] {
        for (what, link, target, planned, unmanaged) in rows {
            let t = Test::new();
            t.config(&format!(
                "pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        workflow: {workflow}
"
            ));
            t.write("outside/target.txt", "outside, keep me\n");
            t.write("outside/dir/inner.txt", "inner\n");
            let seed = t.bundle("seed", &[("real/keep.txt", "k\n")]);
            t.publish("p", &seed, &[]).expect_code(0);
            symlink(t.join(target), t.join("site").join(link)).unwrap();
            let b = t.bundle("hostile", &[(*planned, "through the link?\n")]);
            let before = tree(t.path());

            let out = t.publish("p", &b, &[]);
            let ctx = format!("{workflow}, {what}");
            out.expect_code(3);
            assert_eq!(out.dest()["action"], "fail_unmanaged", "{ctx}");
            assert_eq!(strings(&out.dest()["unmanaged"]), [*unmanaged], "{ctx}");
            assert_eq!(tree(t.path()), before, "{ctx}: something changed");
            refused += 1;
        }
    }
    eprintln!("planted links: {refused} publications refused, nothing written anywhere");
}

/// A recorded output replaced by a link to a file outside holding the very
/// same bytes: `verify` reports it missing (had it followed the link it
/// would have found the bytes matching), `reconcile-state --dry-run` too,
/// `prune --apply` and replacement delete the link and never the target,
/// and a rerun writes a regular file over it.
#[test]
fn recorded_paths_turned_symlinks_are_never_followed_by_maintenance_or_publication() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: site
        path: ./site
        retention:
          prune: {max_age: 1ms, keep_latest: 1}
      - id: rep
        path: ./rep
        workflow: replacement
",
    );
    let b1 = bundle_created(&t, "one", 1, &[("old.txt", "old\n"), ("keep.txt", "k\n")]);
    let b2 = bundle_created(&t, "two", 2, &[("keep.txt", "k\n"), ("new.txt", "new\n")]);
    t.publish("p", &b1, &[]).expect_code(0);
    t.write("outside/old.txt", "old\n");
    t.write("outside/new.txt", "new\n");
    let outside = tree(&t.join("outside"));
    let untouched = |step: &str| {
        assert_eq!(tree(&t.join("outside")), outside, "{step}: outside changed");
    };
    for root in ["site", "rep"] {
        fs::remove_file(t.join(root).join("old.txt")).unwrap();
        symlink(t.join("outside/old.txt"), t.join(root).join("old.txt")).unwrap();
    }
    let is_link =
        |p: &str| fs::symlink_metadata(t.join(p)).is_ok_and(|m| m.file_type().is_symlink());

    for dest in ["site", "rep"] {
        let out = t.run(&["verify", "--json", "--pipeline", "p", "--destination", dest]);
        out.expect_code(1);
        let doc = out.json();
        assert_eq!(strings(&doc["missing"]), ["old.txt"], "{dest}: {doc}");
        assert_eq!(strings(&doc["mismatched"]), Vec::<String>::new(), "{dest}");
        let out = t.run(&[
            "reconcile-state",
            "--dry-run",
            "--json",
            "--pipeline",
            "p",
            "--destination",
            dest,
        ]);
        out.expect_code(0);
        assert_eq!(strings(&out.json()["missing"]), ["old.txt"], "{dest}");
    }
    untouched("verify and reconcile-state");

    let out = t.publish("p", &b2, &[]);
    out.expect_code(0);
    let doc = out.json();
    let rep = &doc["destinations"][1];
    assert_eq!(rep["action"], "replace_catalog");
    assert_eq!(strings(&rep["deletes"]), ["old.txt"]);
    assert!(
        fs::symlink_metadata(t.join("rep/old.txt")).is_err(),
        "link removed"
    );
    assert!(
        is_link("site/old.txt"),
        "additive leaves the recorded link alone"
    );
    untouched("replacement");

    let out = t.run(&[
        "prune",
        "--json",
        "--apply",
        "--pipeline",
        "p",
        "--destination",
        "site",
    ]);
    out.expect_code(0);
    assert_eq!(strings(&out.json()["deletes"]), ["old.txt"]);
    assert!(
        fs::symlink_metadata(t.join("site/old.txt")).is_err(),
        "link pruned"
    );
    untouched("prune --apply");

    fs::remove_file(t.join("site/new.txt")).unwrap();
    symlink(t.join("outside/new.txt"), t.join("site/new.txt")).unwrap();
    let out = t.publish("p", &b2, &[]);
    out.expect_code(0);
    assert_ne!(
        out.dest()["action"],
        "skip_same",
        "a link is not the same file"
    );
    assert!(
        fs::symlink_metadata(t.join("site/new.txt"))
            .unwrap()
            .is_file()
    );
    untouched("rerun over a link");
    assert_catalog_matches_disk(&t.join("site"));
    assert_catalog_matches_disk(&t.join("rep"));
}

/// `renameat2(RENAME_EXCHANGE)`: swaps two names atomically.
fn exchange(a: &Path, b: &Path) {
    let a = CString::new(a.as_os_str().as_bytes()).unwrap();
    let b = CString::new(b.as_os_str().as_bytes()).unwrap();
    // SAFETY: both are valid NUL-terminated paths for the duration of the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(rc, 0, "exchange: {}", std::io::Error::last_os_error());
}

/// Swaps `folder` (a real folder) with a symlink to `outside` over and over
/// while `run` publishes in a loop.
/// What one [`swap_race`] saw.
struct SwapRace {
    runs: usize,
    swaps: usize,
    published: usize,
    refused: usize,
    failed: usize,
    /// Files in the root, at the end, that the catalog does not record.
    unrecorded: usize,
    /// Temporary files left in the root at the end.
    stranded: usize,
}

fn swap_race(swapped: &str, rng: &mut Rng) -> SwapRace {
    const RUNS: usize = 40;
    let t = Test::on_tmpfs();
    t.config(
        "agent: {lock_timeout: 20s}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: replacement
",
    );
    let victim = t.write("outside/victim.txt", "not distributor's\n");
    let outside = t.join("outside");
    let bundle = |tag: &str| {
        let owned: Vec<(String, String)> = (0..30)
            .map(|i| {
                (
                    format!("sub/d{}/{tag}{i}.txt", i % 4),
                    format!("{tag} {i}\n"),
                )
            })
            .chain([(format!("top-{tag}.txt"), tag.to_owned())])
            .collect();
        t.bundle(tag, &owned)
    };
    let bundles = [bundle("a"), bundle("b")];
    t.publish("p", &bundles[0], &[]).expect_code(0);

    // The folder that gets swapped, and the symlink it is swapped with
    // (next to it, so the real folder stays where it was, under a new name).
    let target = t.join(swapped);
    let partner = PathBuf::from(format!("{}-swap", target.display()));
    symlink(&outside, &partner).unwrap();
    let allowed_in_outside: &[&str] = if swapped == "root" {
        // Whoever opens the configured root while it is the link uses the
        // link's target as its root (docs: the configured path may be a
        // symlink); it finds unmanaged content there and refuses, leaving
        // only its lock file.
        &["victim.txt", ".distributor.lock"]
    } else {
        &["victim.txt"]
    };

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, target, partner) = (stop.clone(), target.clone(), partner.clone());
        let mut rng = rng.split();
        std::thread::spawn(move || {
            let mut swaps = 0usize;
            while !stop.load(Ordering::SeqCst) {
                exchange(&target, &partner);
                swaps += 1;
                sleep(Duration::from_micros(rng.below(3000)));
            }
            if swaps % 2 == 1 {
                exchange(&target, &partner);
                swaps += 1;
            }
            swaps
        })
    };

    let (mut published, mut refused, mut failed) = (0, 0, 0);
    let mut escapes = Vec::new();
    for i in 0..RUNS {
        let out = t.publish("p", &bundles[i % 2], &[]);
        match out.code {
            0 => published += 1,
            3 => {
                let action = out.dest()["action"].as_str().unwrap_or_default().to_owned();
                assert!(action.starts_with("fail_"), "run {i}: {}", out.stdout);
                refused += 1;
            }
            1 => {
                let doc = out.json();
                assert!(doc["stage"].is_string(), "run {i}: {doc}");
                assert!(
                    !doc["error"].as_str().unwrap_or_default().is_empty(),
                    "run {i}"
                );
                failed += 1;
            }
            code => panic!("run {i} ended with {code}:\n{}", out.all()),
        }
        for entry in fs::read_dir(&outside).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let expected = allowed_in_outside.contains(&name.as_str())
                && (name != ".distributor.lock" || entry.metadata().unwrap().len() == 0);
            if !expected {
                escapes.push(format!("run {i}: outside/{name}"));
            }
        }
        if fs::read(&victim).unwrap() != b"not distributor's\n" {
            escapes.push(format!("run {i}: outside/victim.txt changed"));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let swaps = swapper.join().expect("swapper");
    assert!(
        fs::symlink_metadata(&target).unwrap().is_dir(),
        "{swapped} is the real folder again"
    );
    assert_eq!(
        escapes,
        Vec::<String>::new(),
        "{swapped}: written outside the root"
    );

    // Quiet again. Swapping the root itself changes nothing for a run that
    // has opened it: the next run converges. A folder inside the root
    // swapped by a process that ignores the root lock, while a publication
    // or its recovery is walking it, can still leave outputs unrecorded
    // (never anything outside the root); the deterministic case, a swap
    // between a crash and the recovery, is fixed and pinned by
    // `recovery_with_a_journaled_folder_swapped_for_a_symlink_keeps_the_journal`.
    // Here those are only counted, and what the catalog records must match.
    let root = t.join("root");
    let last = t.publish("p", &bundles[0], &[]);
    let recs = records(&crate::util::read_state(&root));
    for (path, r) in &recs {
        let bytes = fs::read(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(r["sha256"], sha256(&bytes).as_str(), "{swapped}: {path}");
    }
    let unrecorded = crate::util::shape(&root)
        .files()
        .into_iter()
        .filter(|p| !recs.contains_key(p))
        .count();
    let stranded = leftovers(&root).len();
    if swapped == "root" {
        last.expect_code(0);
        assert_catalog_matches_disk(&root);
        assert_eq!(leftovers(&root), Vec::<PathBuf>::new(), "{swapped}");
        assert!(published > 0, "{swapped}: no run ever published");
    } else {
        assert!(matches!(last.code, 0 | 3), "{}", last.all());
    }
    SwapRace {
        runs: RUNS,
        swaps,
        published,
        refused,
        failed,
        unrecorded,
        stranded,
    }
}

#[test]
fn a_root_or_folder_swapped_for_a_symlink_while_publishing_never_leaks_outside() {
    let mut rng = Rng::seeded("swap race");
    for swapped in ["root", "root/sub"] {
        let r = swap_race(swapped, &mut rng);
        eprintln!(
            "swap race ({swapped} <-> link to outside): {} runs, {} swaps: {} published, {} refused, {} failed cleanly, 0 escapes; at the end {} unrecorded files, {} stranded temporary files",
            r.runs, r.swaps, r.published, r.refused, r.failed, r.unrecorded, r.stranded
        );
    }
}

/// Found by the swap race above, made deterministic with a crash point: a
/// publication dies after its first rename, then a folder holding its
/// outputs is replaced by a symlink before anyone settles the journal.
/// Recovery cannot see through the link (correctly: it never follows one)
/// but concludes the journaled outputs under it are *gone* and drops their
/// records, removing the journal. Once the folder is back, files the tool
/// wrote sit in the root unrecorded, and every rerun is refused with
/// `fail_unmanaged` (docs/contract.md §7: "no file the tool wrote is left unrecorded",
/// "a partly written publication must never turn into fail_unmanaged").
/// Nothing leaks outside; the loss is of ownership records.
#[test]
fn recovery_with_a_journaled_folder_swapped_for_a_symlink_keeps_the_journal() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: replacement
",
    );
    t.write("outside/victim.txt", "not ours\n");
    let a = t.bundle("a", &[("sub/a.txt", "a\n"), ("top.txt", "a\n")]);
    let b = t.bundle("b", &[("sub/b1.txt", "b1\n"), ("sub/b2.txt", "b2\n")]);
    t.publish("p", &a, &[]).expect_code(0);
    let crashed = t
        .cmd()
        .env("DISTRIBUTOR_FAILPOINT", "publish.after_rename:1")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&b)
        .output();
    assert_ne!(crashed.code, 0, "the crash point was not reached");
    assert!(t.join("root/.distributor-journal.json").exists());

    // Someone with write access to the root swaps `sub` for a link.
    fs::rename(t.join("root/sub"), t.join("sub-aside")).unwrap();
    symlink(t.join("outside"), t.join("root/sub")).unwrap();
    let outside = tree(&t.join("outside"));
    let during = t.publish("p", &b, &[]);
    assert_ne!(
        during.code,
        0,
        "published through a link?\n{}",
        during.all()
    );
    assert_eq!(
        tree(&t.join("outside")),
        outside,
        "written outside the root"
    );

    // The folder comes back: the rerun must converge.
    fs::remove_file(t.join("root/sub")).unwrap();
    fs::rename(t.join("sub-aside"), t.join("root/sub")).unwrap();
    let after = t.publish("p", &b, &[]);
    after.expect_code(0);
    assert_catalog_matches_disk(&t.join("root"));
    assert_eq!(
        leftovers(&t.join("root")),
        Vec::<PathBuf>::new(),
        "stranded temporary files"
    );
    assert_eq!(
        t.recorded("root").keys().cloned().collect::<Vec<_>>(),
        ["sub/b1.txt", "sub/b2.txt"]
    );
}
