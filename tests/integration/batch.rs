//! Batches into a local root: a crash at each step of the journal
//! converges, staging into new folders, files that already hold the
//! planned bytes, a broken catalog file, and how a live agent gathers a
//! burst. What every backend's batch does alike (arrival order, one
//! result per bundle, a bad or refused bundle failing alone) is in
//! `matrix`.

use crate::util::{
    DEADLINE, Test, assert_catalog_matches_disk, metric, sorted_names as names, wait_for,
};
use serde_json::Value;
use std::fs;

fn config(workflow: &str) -> String {
    format!(
        "spool: ./spool
agent: {{settle: 0s}}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: {workflow}
"
    )
}

/// Seals `files` as bundle `name` and drops it into the inbox with a
/// manifest modification time of `order` seconds after a fixed instant, so
/// arrival order is exactly the order given.
fn drop_bundle(t: &Test, name: &str, order: u64, files: &[(&str, &str)]) {
    let dir = t.bundle_at(name, name, "2026-06-04T00:00:00Z", files);
    crate::util::arrive_in_order(&dir, order);
    fs::create_dir_all(t.join("spool/p/inbox")).unwrap();
    fs::rename(&dir, t.join(&format!("spool/p/inbox/{name}"))).unwrap();
}

fn result(t: &Test, folder: &str, name: &str) -> Value {
    let path = t.join(&format!("spool/p/{folder}/{name}/.distributor-result.json"));
    serde_json::from_slice(&fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap()
}

/// `agent --once` with its info log (which says how bundles were batched).
fn agent_once_logged(t: &Test) -> crate::util::Output {
    t.cmd()
        .env("RUST_LOG", "info")
        .args(["--config", "config.yaml", "agent", "--once"])
        .output()
}

fn batched(stderr: &str) -> bool {
    stderr.contains("published a batch of")
}

#[test]
fn a_crash_in_the_middle_of_a_batch_converges() {
    for point in [
        "publish.after_journal",
        "publish.after_stage:2",
        "publish.after_rename:2",
        "publish.before_catalog",
        "publish.after_catalog",
    ] {
        let t = Test::new();
        t.config(&config("replacement"));
        drop_bundle(&t, "first", 0, &[("keep.txt", "0\n")]);
        t.run(&["agent", "--once"]).expect_code(0);
        for i in 1..6u64 {
            let c = format!("{i}\n");
            let name = format!("n{i}.txt");
            drop_bundle(&t, &format!("b{i}"), i, &[("keep.txt", &c), (&name, &c)]);
        }
        let crashed = t
            .cmd()
            .env("DISTRIBUTOR_FAILPOINT", point)
            .args(["--config", "config.yaml", "agent", "--once"])
            .output();
        assert_ne!(crashed.code, 0, "{point} was not reached");
        assert!(
            t.join("spool/p/work/.distributor-batch.json").exists(),
            "{point}: the batch's attempt is recorded"
        );
        t.run(&["agent", "--once"]).expect_code(0);
        for i in 1..6 {
            let counter = t.join(&format!("spool/p/done/b{i}/.distributor-attempts"));
            assert_eq!(
                fs::read_to_string(&counter).ok().as_deref(),
                Some("2\n"),
                "{point}: the crashed batch's attempt and the resumed one are counted"
            );
        }
        assert!(!t.join("spool/p/work/.distributor-batch.json").exists());
        assert_eq!(
            names(&t.join("spool/p/done")),
            ["b1", "b2", "b3", "b4", "b5", "first"],
            "{point}"
        );
        assert!(names(&t.join("spool/p/work")).is_empty());
        assert_eq!(
            fs::read_to_string(t.join("root/keep.txt")).unwrap(),
            "5\n",
            "{point}"
        );
        let recorded: Vec<String> = t.recorded("root").keys().cloned().collect();
        assert_eq!(recorded, ["keep.txt", "n5.txt"], "{point}");
        assert_catalog_matches_disk(&t.join("root"));
        for leftover in fs::read_dir(t.join("root")).unwrap() {
            let name = leftover.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !name.starts_with(".distributor-tmp-") && name != ".distributor-journal.json",
                "{point}: {name} left behind"
            );
        }
    }
}

/// Regression: staging threads raced to create the same new folder
/// (`EEXIST`) and the whole batch fell back to one-by-one publication.
#[test]
fn nested_bundles_in_new_folders_are_published_in_one_batch_without_falling_back() {
    let t = Test::new();
    t.config(
        "spool: ./spool
agent: {settle: 0s, metrics_file: ./metrics.prom}
pipelines:
  - id: p
    destinations:
      - id: flat
        path: ./root
      - id: per-source
        path: ./by-source
        prefix: \"{source_id}/\"
",
    );
    // Both roots exist with a catalog, as after a first publication.
    drop_bundle(&t, "first", 0, &[("first.txt", "1\n")]);
    t.run(&["agent", "--once"]).expect_code(0);
    let data = "d".repeat(64 * 1024);
    let n = 40u64;
    for i in 1..=n {
        let folder = format!("r{i:05}");
        let report = format!("# report {i}\n");
        let page = format!("<p>{i}</p>\n");
        drop_bundle(
            &t,
            &format!("b{i:03}"),
            i,
            &[
                (&format!("{folder}/report.md"), &report),
                (&format!("{folder}/page.html"), &page),
                (&format!("{folder}/data.bin"), &data),
            ],
        );
    }
    let out = agent_once_logged(&t);
    out.expect_code(0);
    assert!(
        out.stderr
            .contains(&format!("published a batch of {n} bundles")),
        "not one batch:\n{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("stepped aside"),
        "the batch fell back:\n{}",
        out.stderr
    );
    assert_eq!(metric(&t, "batch_fallbacks_total"), "0");
    assert_eq!(names(&t.join("spool/p/done")).len(), n as usize + 1);
    for i in 1..=n {
        let report = format!("# report {i}\n");
        let flat = t.join(&format!("root/r{i:05}/report.md"));
        assert_eq!(fs::read_to_string(flat).unwrap(), report);
        let nested = t.join(&format!("by-source/b{i:03}/r{i:05}/report.md"));
        assert_eq!(fs::read_to_string(nested).unwrap(), report);
    }
    assert_eq!(t.recorded("by-source").len(), 3 * n as usize + 1);
    assert_catalog_matches_disk(&t.join("root"));
    assert_catalog_matches_disk(&t.join("by-source"));
}

#[test]
fn a_batch_keeps_files_that_already_hold_the_planned_bytes() {
    use std::os::unix::fs::MetadataExt;
    let t = Test::new();
    t.config(&config("additive"));
    drop_bundle(
        &t,
        "first",
        0,
        &[("a/same.txt", "same\n"), ("a/old.txt", "1\n")],
    );
    t.run(&["agent", "--once"]).expect_code(0);
    let stamp = |p: &str| {
        let m = fs::metadata(t.join(&format!("root/{p}"))).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec())
    };
    let same = stamp("a/same.txt");
    let old = stamp("a/old.txt");
    drop_bundle(&t, "x", 1, &[("x.txt", "x\n")]);
    drop_bundle(
        &t,
        "y",
        2,
        &[("a/same.txt", "same\n"), ("a/old.txt", "2\n")],
    );
    let out = agent_once_logged(&t);
    out.expect_code(0);
    assert!(batched(&out.stderr), "no batch was used:\n{}", out.stderr);
    assert_eq!(stamp("a/same.txt"), same, "kept as it was");
    assert_ne!(stamp("a/old.txt").0, old.0, "rewritten");
    assert_eq!(fs::read_to_string(t.join("root/a/old.txt")).unwrap(), "2\n");
    let y = result(&t, "done", "y");
    assert_eq!(
        y["destinations"][0]["writes"],
        serde_json::json!(["a/old.txt", "a/same.txt"])
    );
    assert_eq!(t.recorded("root")["a/same.txt"]["source"]["id"], "y");
    assert_catalog_matches_disk(&t.join("root"));
}

/// A v4 catalog of `n` records owned by another pipeline, at paths no
/// bundle here writes: about 430 bytes a record.
fn catalog_of_others(n: usize) -> String {
    let outputs: Vec<Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "path": format!("others/{:03}/file-{i:06}.html", i / 1000),
                "pipeline_id": "other",
                "destination_id": "site",
                "source": {"id": format!("src-{:05}", i / 10),
                           "digest": format!("sha256:{}", "ab".repeat(32)),
                           "created": "2026-01-01T00:00:00Z"},
                "kind": "source",
                "sha256": format!("sha256:{}", "cd".repeat(32)),
                "size": 1234,
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:00Z",
            })
        })
        .collect();
    let doc = serde_json::json!({
        "schema_version": 4,
        "distributor_version": "test",
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "state": {"mode": "catalog"},
        "outputs": outputs,
    });
    serde_json::to_string_pretty(&doc).unwrap() + "\n"
}

/// A backlog into a root whose large catalog file is cut short: every
/// bundle fails alone, naming the catalog, and the file is left as it is.
/// Once an operator restores it, the next backlog goes as one batch.
#[test]
fn a_backlog_into_a_large_broken_catalog_fails_each_bundle_and_a_restored_one_takes_a_batch() {
    let t = Test::new();
    t.config(&config("additive"));
    let whole = catalog_of_others(3000);
    assert!(whole.len() > 1 << 20, "{} bytes: read ahead", whole.len());
    let broken = &whole[..whole.len() - 100];
    t.write("root/.distributor.json", broken);
    for i in 0..4u64 {
        let c = format!("{i}\n");
        drop_bundle(&t, &format!("b{i}"), i, &[(&format!("n{i}.txt"), &c)]);
    }
    let out = t.run(&["agent", "--once"]);
    assert_eq!(out.code, 1, "{}", out.all());
    for i in 0..4 {
        let r = result(&t, "failed", &format!("b{i}"));
        assert_eq!(r["ok"], false, "{r}");
        let error = r.to_string();
        assert!(error.contains(".distributor.json"), "b{i}: {error}");
    }
    assert_eq!(
        fs::read_to_string(t.join("root/.distributor.json")).unwrap(),
        broken,
        "the broken catalog is left as it is"
    );
    for i in 0..4 {
        assert!(!t.join(&format!("root/n{i}.txt")).exists());
    }

    t.write("root/.distributor.json", &whole);
    for i in 4..7u64 {
        let c = format!("{i}\n");
        drop_bundle(&t, &format!("b{i}"), i, &[(&format!("n{i}.txt"), &c)]);
    }
    let out = agent_once_logged(&t);
    out.expect_code(0);
    assert!(batched(&out.stderr), "no batch was used:\n{}", out.stderr);
    let records = t.recorded("root");
    assert_eq!(records.len(), 3003);
    for i in 4..7 {
        assert_eq!(
            records[&format!("n{i}.txt")]["source"]["id"],
            format!("b{i}")
        );
        assert_eq!(
            fs::read_to_string(t.join(&format!("root/n{i}.txt"))).unwrap(),
            format!("{i}\n")
        );
    }
}

/// A live agent stopped (SIGSTOP, at the `agent.claimed` failpoint) right
/// after claiming `b0`, the first bundle of a burst, into a root that has
/// a catalog (into a root without one, a batch's first bundle goes alone).
fn stopped_after_claiming_the_first_of_a_burst(t: &Test) -> crate::util::Proc {
    t.config(&config("additive"));
    drop_bundle(t, "warm", 0, &[("warm.txt", "warm\n")]);
    t.once().expect_code(0);
    let agent = t
        .agent_cmd()
        .env("DISTRIBUTOR_FAILPOINT", "agent.claimed:1:stop")
        .arg("agent")
        .start();
    drop_bundle(
        t,
        "b0",
        0,
        &[("page.html", "version 0\n"), ("b0.txt", "0\n")],
    );
    assert!(
        wait_for(DEADLINE, || agent.stopped()),
        "the agent never claimed b0:\n{}",
        agent.stderr()
    );
    assert_eq!(names(&t.join("spool/p/work")), ["b0"]);
    agent
}

/// The rest of the burst, b1 to b3, each writing `page.html` and a file
/// of its own.
fn drop_the_rest_of_the_burst(t: &Test) {
    for i in 1..4u64 {
        let content = format!("version {i}\n");
        let only = format!("b{i}.txt");
        drop_bundle(
            t,
            &format!("b{i}"),
            i,
            &[("page.html", &content), (&only, "x\n")],
        );
    }
}

#[test]
fn a_burst_that_arrives_while_its_first_bundle_is_claimed_goes_out_as_one_batch() {
    let t = Test::new();
    // The first bundle of the burst is claimed alone; the rest arrives
    // while the agent is stopped right after that claim.
    let mut agent = stopped_after_claiming_the_first_of_a_burst(&t);
    drop_the_rest_of_the_burst(&t);
    agent.signal(libc::SIGCONT);
    let done = t.join("spool/p/done");
    assert!(
        wait_for(DEADLINE, || names(&done).len() == 5),
        "the burst was not published:\n{}",
        agent.stderr()
    );
    agent.signal(libc::SIGTERM);
    let out = agent.finish(DEADLINE);
    // One transaction, so one catalog written, for the whole burst.
    assert!(
        out.stderr.contains("published a batch of 4 bundles"),
        "the burst was not one batch:\n{}",
        out.stderr
    );
    for i in 0..4 {
        assert_eq!(result(&t, "done", &format!("b{i}"))["ok"], true);
    }
    assert_eq!(
        fs::read_to_string(t.join("root/page.html")).unwrap(),
        "version 3\n",
        "arrival order holds inside the batch"
    );
    let records = t.recorded("root");
    assert_eq!(records["page.html"]["source"]["id"], "b3");
    assert!((0..4).all(|i| records.contains_key(&format!("b{i}.txt"))));
    assert_catalog_matches_disk(&t.join("root"));
}

#[test]
fn a_stop_while_a_burst_is_gathered_loses_nothing() {
    let t = Test::new();
    let mut agent = stopped_after_claiming_the_first_of_a_burst(&t);
    drop_the_rest_of_the_burst(&t);
    // Delivered when the agent goes on: it may gather the rest before it
    // sees the stop, or not; either way b0 is finished and nothing else
    // is started.
    agent.signal(libc::SIGTERM);
    agent.signal(libc::SIGCONT);
    let out = agent.finish(DEADLINE);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(result(&t, "done", "b0")["ok"], true);
    assert!(names(&t.join("spool/p/work")).is_empty(), "{}", out.stderr);
    assert!(
        names(&t.join("spool/p/failed")).is_empty(),
        "{}",
        out.stderr
    );
    let inbox = names(&t.join("spool/p/inbox"));
    let done = names(&t.join("spool/p/done"));
    for b in ["b1", "b2", "b3"] {
        assert!(
            inbox.contains(&b.to_owned()) != done.contains(&b.to_owned()),
            "{b} is in exactly one of inbox/ {inbox:?} and done/ {done:?}:\n{}",
            out.stderr
        );
    }
    assert_catalog_matches_disk(&t.join("root"));
    // What went back is published by the next run, in order.
    t.once().expect_code(0);
    assert_eq!(names(&t.join("spool/p/done")).len(), 5);
    assert_eq!(
        fs::read_to_string(t.join("root/page.html")).unwrap(),
        "version 3\n"
    );
}

#[test]
fn a_hold_placed_while_a_burst_is_gathered_leaves_the_rest_in_the_inbox() {
    let t = Test::new();
    let agent = stopped_after_claiming_the_first_of_a_burst(&t);
    t.run(&["spool", "hold", "p"]).expect_code(0);
    drop_the_rest_of_the_burst(&t);
    agent.signal(libc::SIGCONT);
    // The bundle in hand is finished; nothing more is claimed.
    agent.wait_log("held since", DEADLINE);
    assert_eq!(result(&t, "done", "b0")["ok"], true);
    assert_eq!(names(&t.join("spool/p/inbox")), ["b1", "b2", "b3"]);
    assert!(names(&t.join("spool/p/work")).is_empty());
    assert_eq!(
        fs::read_to_string(t.join("root/page.html")).unwrap(),
        "version 0\n"
    );
    t.run(&["spool", "release", "p"]).expect_code(0);
    assert!(
        wait_for(DEADLINE, || names(&t.join("spool/p/done")).len() == 5),
        "the rest was not published after the release:\n{}",
        agent.stderr()
    );
    assert_eq!(
        fs::read_to_string(t.join("root/page.html")).unwrap(),
        "version 3\n"
    );
}
