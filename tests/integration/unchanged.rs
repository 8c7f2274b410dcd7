//! Unchanged outputs are not rewritten: when a planned output's record
//! already has its SHA-256 and size, and the file there holds exactly those
//! bytes, publication leaves it alone (same inode, same modification time),
//! and still records the new owner and source.

use crate::util::{Test, assert_catalog_matches_disk, strings, wait_past};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;

/// One pipeline, one destination `./root` with `workflow: replacement`.
const REPLACEMENT: &str = "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: replacement
";

/// Inode and modification time (ns) of every file below `root`, by path.
fn stamps(root: &std::path::Path, paths: &[String]) -> BTreeMap<String, (u64, i64, i64)> {
    paths
        .iter()
        .map(|p| {
            let m = fs::symlink_metadata(root.join(p)).unwrap();
            (p.clone(), (m.ino(), m.mtime(), m.mtime_nsec()))
        })
        .collect()
}

/// `n` files in nested folders; version `v` changes every third one.
fn files(n: usize, v: u32) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let path = format!("d{}/s{}/f{i}.txt", i % 4, i % 3);
            let body = if i % 3 == 0 && v > 1 {
                format!("file {i} version {v}\n")
            } else {
                format!("file {i} original\n")
            };
            (path, body)
        })
        .collect()
}

#[test]
fn replacement_keeps_unchanged_files_and_rewrites_only_the_changed_third() {
    // Few files are fsynced one by one, many go through one barrier.
    for n in [6, 48] {
        let t = Test::new();
        t.config(REPLACEMENT);
        let v1 = files(n, 1);
        let b1 = t.bundle_at("v1", "site", "2026-06-01T00:00:00Z", &v1);
        t.publish("p", &b1, &[]).expect_code(0);
        let root = t.join("root");
        let paths: Vec<String> = v1.iter().map(|(p, _)| p.clone()).collect();
        let before = stamps(&root, &paths);

        let mut v2 = files(n, 2);
        v2.pop(); // one output dropped
        v2.push(("new/added.txt".to_owned(), "added\n".to_owned()));
        let b2 = t.bundle_at("v2", "site", "2026-06-02T00:00:00Z", &v2);
        let out = t.publish("p", &b2, &[]);
        out.expect_code(0);
        let dest = out.dest();
        assert_eq!(dest["action"], "replace_catalog");
        // `writes` lists every planned output, kept ones included.
        assert_eq!(strings(&dest["writes"]).len(), v2.len(), "n={n}");
        assert_eq!(strings(&dest["deletes"]), [v1[n - 1].0.clone()]);

        let after = stamps(&root, &paths[..n - 1]);
        for (i, (path, body)) in v2.iter().enumerate() {
            assert_eq!(
                &fs::read_to_string(root.join(path)).unwrap(),
                body,
                "{path}"
            );
            if i >= n - 1 {
                continue;
            }
            if i % 3 == 0 {
                assert_ne!(
                    after[path].0, before[path].0,
                    "n={n}: {path} changed, so rewritten"
                );
            } else {
                assert_eq!(
                    after[path], before[path],
                    "n={n}: unchanged {path} kept its inode and modification time"
                );
            }
        }
        assert!(!root.join(&v1[n - 1].0).exists());
        let records = t.recorded("root");
        assert_eq!(records.len(), v2.len());
        for r in records.values() {
            assert_eq!(r["source"]["created"], "2026-06-02T00:00:00Z", "{r}");
        }
        assert_catalog_matches_disk(&root);
        // A third run of the same bundle is a skip.
        assert_eq!(t.publish("p", &b2, &[]).dest()["action"], "skip_same");
    }
}

#[test]
fn a_recorded_file_changed_on_disk_is_rewritten_not_kept() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
",
    );
    let b1 = t.bundle_at(
        "v1",
        "s",
        "2026-06-01T00:00:00Z",
        &[("a.txt", "same\n"), ("b.txt", "1\n")],
    );
    t.publish("p", &b1, &[]).expect_code(0);
    // Same size, other bytes: the size alone must not decide.
    fs::write(t.join("root/a.txt"), "SAME\n").unwrap();
    let b2 = t.bundle_at(
        "v2",
        "s",
        "2026-06-02T00:00:00Z",
        &[("a.txt", "same\n"), ("b.txt", "2\n")],
    );
    let out = t.run(&["run", "--pipeline", "p", b2.to_str().unwrap()]);
    out.expect_code(0);
    assert_eq!(fs::read_to_string(t.join("root/a.txt")).unwrap(), "same\n");
    assert!(!out.stdout.contains("already held"), "{}", out.stdout);
    assert_catalog_matches_disk(&t.join("root"));

    // Now unchanged: the text report says the file was kept.
    let b3 = t.bundle_at(
        "v3",
        "s",
        "2026-06-03T00:00:00Z",
        &[("a.txt", "same\n"), ("b.txt", "3\n")],
    );
    let out = t.run(&["run", "--pipeline", "p", b3.to_str().unwrap()]);
    out.expect_code(0);
    assert!(
        out.stdout
            .contains("1 write already held the same bytes and kept"),
        "{}",
        out.stdout
    );
    assert_catalog_matches_disk(&t.join("root"));
}

/// The outputs of `files(n, 1)` as a bundle published at `created`.
fn publish_v1(t: &Test, name: &str, created: &str) -> crate::util::Output {
    let v1 = files(40, 1);
    let bundle = t.bundle_at(name, "site", created, &v1);
    t.cmd()
        .env("RUST_LOG", "distributor=debug")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&bundle)
        .output()
}

#[test]
fn a_large_publication_knows_unchanged_files_by_their_look_and_rereads_any_touched_since() {
    let t = Test::new();
    t.config(REPLACEMENT);
    let root = t.join("root");
    publish_v1(&t, "v1", "2026-06-01T00:00:00Z").expect_code(0);
    // Looks are recorded only once the files' change times are more than
    // 50 ms old (a coarse clock tick; see `seen::Look::settled`): wait until
    // they are, as they are between real publications.
    let paths: Vec<String> = files(40, 1).into_iter().map(|(p, _)| p).collect();
    let newest = paths
        .iter()
        .map(|p| fs::symlink_metadata(root.join(p)).unwrap())
        .map(|m| {
            std::time::UNIX_EPOCH
                + std::time::Duration::new(m.ctime() as u64, m.ctime_nsec() as u32)
        })
        .max()
        .unwrap();
    wait_past(newest, std::time::Duration::from_millis(50));
    // The same bytes again: every file is kept (read and hashed, or known
    // by its look), and now every look is recorded.
    publish_v1(&t, "v2", "2026-06-02T00:00:00Z").expect_code(0);
    let seen = fs::read_to_string(root.join(".distributor-seen")).unwrap();
    assert_eq!(seen.lines().count(), 1 + 40, "{seen}");

    // Rewrite one file with other bytes of the same size, then put its
    // modification time back: size and mtime look unchanged, the change
    // time does not.
    let touched = root.join(&files(40, 1)[5].0);
    let mtime = fs::metadata(&touched).unwrap().modified().unwrap();
    let original = fs::read(&touched).unwrap();
    let mut other = original.clone();
    other[0] ^= 0x20;
    fs::write(&touched, &other).unwrap();
    fs::File::options()
        .write(true)
        .open(&touched)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(fs::metadata(&touched).unwrap().modified().unwrap(), mtime);
    let before = stamps(&root, &paths);

    let out = publish_v1(&t, "v3", "2026-06-03T00:00:00Z");
    out.expect_code(0);
    assert!(
        out.stderr.contains(
            "39 of 40 outputs recorded with the bytes wanted were known unchanged by their look"
        ),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout
            .contains("39 writes already held the same bytes and kept"),
        "{}",
        out.stdout
    );
    // The touched file got its bytes back, in a new file; the rest stayed.
    assert_eq!(fs::read(&touched).unwrap(), original);
    let after = stamps(&root, &paths);
    for (path, stamp) in &before {
        if root.join(path) == touched {
            assert_ne!(after[path].0, stamp.0, "{path} rewritten");
        } else {
            assert_eq!(&after[path], stamp, "{path} kept");
        }
    }
    assert_catalog_matches_disk(&root);

    // A damaged .distributor-seen only costs a re-read.
    fs::write(
        root.join(".distributor-seen"),
        "distributor-seen 1\ngarbage\n",
    )
    .unwrap();
    let out = publish_v1(&t, "v4", "2026-06-04T00:00:00Z");
    out.expect_code(0);
    assert!(
        out.stderr.contains("0 of 40 outputs recorded"),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout
            .contains("40 writes already held the same bytes and kept"),
        "{}",
        out.stdout
    );
    assert_catalog_matches_disk(&root);
}

/// A large tree's publication holds what its plan needs, not the tree
/// several times over: publishing 20,000 files into an empty root, then
/// the next version (a third changed, `workflow: replacement`), each peaks
/// at most 3 times the catalog above a one-file publication's footprint
/// (holding the journal or the catalog's text whole, or copying records,
/// takes it to 7 to 9 times).
#[test]
fn a_large_tree_is_published_within_three_times_its_catalog_in_memory() {
    let t = Test::new();
    t.config(REPLACEMENT);
    let peak = |dir: &std::path::Path| crate::render::peak_rss_of_publishing(&t, dir);
    let tree = |name: &str, v: u32| {
        let dir = t.mkdir(&format!("bundles/{name}"));
        for i in 0..20_000usize {
            let body = format!(
                "{i} {}{}\n",
                "x".repeat(400 + (i * 37) % 3000),
                if i % 3 == 0 { v } else { 1 }
            );
            crate::util::write_file(
                &dir.join(format!("d{}/s{}/f{i:05}.txt", i % 40, i % 25)),
                body.as_bytes(),
            );
        }
        t.seal(&dir, "tree", None).expect_code(0);
        dir
    };
    let small = t.bundle("small", &[("one.txt", "one\n")]);
    t.config(&REPLACEMENT.replace("./root", "./base"));
    let base = peak(&small);
    t.config(REPLACEMENT);
    let v1 = tree("v1", 1);
    let fresh = peak(&v1);
    let catalog = fs::metadata(t.join("root/.distributor.json"))
        .unwrap()
        .len();
    let v2 = tree("v2", 2);
    let update = peak(&v2);
    eprintln!(
        "catalog {} KiB; peak RSS: one file {} KiB, 20,000 files {} KiB, their update {} KiB",
        catalog >> 10,
        base >> 10,
        fresh >> 10,
        update >> 10
    );
    for (what, peak) in [("into an empty root", fresh), ("the update", update)] {
        let held = peak.saturating_sub(base);
        assert!(
            held <= 3 * catalog,
            "{what} held {} KiB above a one-file publication, more than 3 times the {} KiB catalog",
            held >> 10,
            catalog >> 10
        );
    }
    assert_eq!(t.recorded("root").len(), 20_000);
    assert_catalog_matches_disk(&t.join("root"));
}
