//! A destination on a tiny file system that fills up mid-publication: the
//! bundle is retried then failed, the previous catalog stays valid and
//! matching, and no temporary file is left behind. Needs root (to mount a
//! size-limited tmpfs); skipped with a printed reason otherwise.

use crate::util::{Test, assert_catalog_matches_disk, metric};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted 1 MiB tmpfs, unmounted on drop.
struct SmallFs {
    path: PathBuf,
}

impl SmallFs {
    fn mount(at: &Path, size: &str) -> Option<SmallFs> {
        fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| SmallFs {
            path: at.to_owned(),
        })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

fn small_fs(t: &Test) -> Option<SmallFs> {
    small_fs_at(&t.join("small"))
}

/// A 1 MiB tmpfs mounted at `at`, or `None` (with the reason printed) when
/// this test cannot mount one.
fn small_fs_at(at: &Path) -> Option<SmallFs> {
    sized_fs_at(at, "1m")
}

/// A tmpfs of `size` mounted at `at` ([`small_fs_at`]).
fn sized_fs_at(at: &Path, size: &str) -> Option<SmallFs> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mounting a size-limited tmpfs needs root");
        return None;
    }
    let fs = SmallFs::mount(at, size);
    if fs.is_none() {
        eprintln!("skipped: cannot mount a tmpfs here");
    }
    fs
}

fn no_temp_files(root: &Path) {
    for entry in fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with(".distributor-tmp-") && name != ".distributor-journal.json",
            "{name} left in {}",
            root.display()
        );
        if entry.file_type().unwrap().is_dir() {
            no_temp_files(&entry.path());
        }
    }
}

const CONFIG: &str = "spool: ./spool
agent: {settle: 0s, max_attempts: 2}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./small/root
        workflow: replacement
";

#[test]
fn a_full_disk_fails_the_bundle_and_keeps_the_previous_catalog() {
    let t = Test::new();
    let Some(_fs) = small_fs(&t) else { return };
    t.config(CONFIG);
    let small = t.bundle_at("a", "a", "2026-06-01T00:00:00Z", &[("page.txt", "fits\n")]);
    t.publish("p", &small, &[]).expect_code(0);
    let before = fs::read(t.join("small/root/.distributor.json")).unwrap();

    let big_content = "x".repeat(700 * 1024);
    let big = t.bundle_at(
        "b",
        "b",
        "2026-06-02T00:00:00Z",
        &[("one.bin", &big_content), ("two.bin", &big_content)],
    );

    // Direct run: exit 1 at stage publish, nothing changed.
    let out = t.publish("p", &big, &[]);
    out.expect_code(1);
    assert_eq!(out.json()["stage"], "publish");
    let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("space"),
        "error should say the disk is full: {error}"
    );
    let root = t.join("small/root");
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
    assert!(root.join("page.txt").exists());

    // The bundle is larger than the whole file system: no retry can help,
    // and the error says so.
    assert!(
        error.contains("larger than the whole file system of the root"),
        "{error}"
    );

    // Through the agent: failed at once, not deferred.
    t.mkdir("spool/p/inbox");
    fs::rename(&big, t.join("spool/p/inbox/b")).unwrap();
    let agent = t.run(&["agent", "--once"]);
    agent.expect_code(1);
    assert!(!agent.stderr.contains("deferred"), "{}", agent.stderr);
    let failed = t.join("spool/p/failed/b");
    assert!(
        !failed.join(".distributor-attempts").exists(),
        "one attempt"
    );
    let result: serde_json::Value =
        serde_json::from_slice(&fs::read(failed.join(".distributor-result.json")).unwrap())
            .unwrap();
    assert_eq!(result["stage"], "publish");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("split the bundle"),
        "{result}"
    );
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
}

/// A large publication (its outputs staged beside their targets, the new
/// catalog staged at the top of the root at the same time) that does not
/// fit: the failure settles the root at once, the staged catalog goes with
/// the staged outputs, and the previous catalog stays in place.
#[test]
fn a_full_disk_during_a_large_publication_leaves_the_previous_catalog_and_no_staged_one() {
    let t = Test::new();
    let Some(_fs) = small_fs(&t) else { return };
    t.config(CONFIG);
    let small = t.bundle_at("a", "a", "2026-06-01T00:00:00Z", &[("page.txt", "fits\n")]);
    t.publish("p", &small, &[]).expect_code(0);
    let root = t.join("small/root");
    let before = fs::read(root.join(".distributor.json")).unwrap();

    // 20 outputs in 4 folders, 1.2 MiB in all: more than the file system.
    let body = "y".repeat(60 * 1024);
    let files: Vec<(String, &str)> = (0..20)
        .map(|i| (format!("d{}/f{i:02}.bin", i % 4), body.as_str()))
        .collect();
    let big = t.bundle_at("b", "b", "2026-06-02T00:00:00Z", &files);
    let out = t.publish("p", &big, &[]);
    out.expect_code(1);
    assert_eq!(out.json()["stage"], "publish", "{}", out.all());
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
    assert!(root.join("page.txt").exists());
    for folder in ["d0", "d1", "d2", "d3"] {
        assert!(
            !root.join(folder).exists(),
            "{folder} created by the failed run stays"
        );
    }
}

#[test]
fn a_folder_of_the_root_on_another_file_system_still_gets_its_outputs() {
    // A small publication stages at the top of the root and renames into
    // place; a folder that is a mount point takes a copy instead, and says so.
    let t = Test::new();
    t.config(
        "spool: ./spool
agent: {settle: 0s, metrics_file: ./metrics.prom}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
",
    );
    let first = t.sealed("first", &[("top.txt", b"top\n")]);
    t.publish("p", &first, &[]).expect_code(0);
    let Some(_mounted) = small_fs_at(&t.join("www/small")) else {
        return;
    };
    let b = t.sealed(
        "b",
        &[("small/a.txt", b"on the tmpfs\n"), ("top2.txt", b"top\n")],
    );
    let out = t.publish("p", &b, &[]);
    out.expect_code(0);
    assert!(
        out.stderr
            .contains("is on another file system than the root"),
        "{}",
        out.stderr
    );
    let www = t.join("www");
    assert_eq!(
        fs::read_to_string(www.join("small/a.txt")).unwrap(),
        "on the tmpfs\n"
    );
    assert_eq!(fs::read_to_string(www.join("top2.txt")).unwrap(), "top\n");
    no_temp_files(&www);
    assert_catalog_matches_disk(&www);

    // A large change stages beside its targets, here on the tmpfs; its
    // barriers (`syncfs`) cover that file system as well as the root's.
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("small/big/f{i:02}.txt"),
                format!("file {i}\n").into_bytes(),
            )
        })
        .collect();
    let files: Vec<(&str, &[u8])> = files.iter().map(|(p, b)| (p.as_str(), &b[..])).collect();
    let l = t.sealed("l", &files);
    let out = t
        .cmd()
        .env("RUST_LOG", "distributor=debug")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&l)
        .output();
    out.expect_code(0);
    assert!(
        out.stderr.contains(
            "www/small is on another file system than the root; each durability barrier syncs it too"
        ),
        "{}",
        out.stderr
    );
    assert_eq!(
        fs::read_to_string(www.join("small/big/f07.txt")).unwrap(),
        "file 7\n"
    );
    no_temp_files(&www.join("small/big"));
    assert_catalog_matches_disk(&www);

    // The agent counts each such copy, so that a slow path that is taken
    // shows on a dashboard and not only in the log.
    let c = t.sealed("c", &[("small/c.txt", b"agent\n")]);
    fs::create_dir_all(t.join("spool/p/inbox")).unwrap();
    fs::rename(&c, t.join("spool/p/inbox/c")).unwrap();
    t.run(&["agent", "--once"]).expect_code(0);
    assert_eq!(
        fs::read_to_string(www.join("small/c.txt")).unwrap(),
        "agent\n"
    );
    assert_eq!(metric(&t, "cross_device_copies_total"), "1");
    no_temp_files(&www);
    assert_catalog_matches_disk(&www);
}

/// Bytes free on the file system holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let st = rustix::fs::statvfs(path).unwrap();
    st.f_bavail * st.f_frsize
}

/// A disk too full for a publication's new catalog. The catalog is staged
/// with the outputs, before anything moves into place, so the publication
/// fails while its root can still be settled: the journal goes and the
/// catalog stands as it was. A publication killed once its outputs are in
/// place, with the disk then too full for the catalog that settling its
/// journal writes, keeps the journal: a run while the disk is still full
/// names that cause, and once space is freed the next run settles the
/// root and publishes.
#[test]
fn a_full_disk_fails_before_anything_moves_and_a_journal_it_cannot_settle_stays() {
    let t = Test::new();
    let Some(_fs) = sized_fs_at(&t.join("small"), "8m") else {
        return;
    };
    t.config(&CONFIG.replace("workflow: replacement", "workflow: additive"));
    // A catalog of some 400 KiB: 800 records with long paths.
    let long = "n".repeat(180);
    let many: Vec<(String, String)> = (0..800)
        .map(|i| {
            (
                format!("d{:02}/{long}-{i:03}.txt", i % 40),
                format!("{i}\n"),
            )
        })
        .collect();
    let a = t.bundle_at("a", "a", "2026-06-01T00:00:00Z", &many);
    t.publish("p", &a, &[]).expect_code(0);
    let root = t.join("small/root");
    let before = fs::read(root.join(".distributor.json")).unwrap();
    let catalog = before.len() as u64;
    assert!(catalog > 350 << 10, "catalog {catalog} bytes");

    // 20 new small files (a change staged beside its targets, journaled
    // first): they and the journal fit, the new catalog does not.
    let few: Vec<(String, String)> = (0..20)
        .map(|i| (format!("new/f{i:02}.txt"), format!("{i}\n")))
        .collect();
    let b = t.bundle_at("b", "b", "2026-06-02T00:00:00Z", &few);
    let filler = t.join("small/filler");
    let fill_to = |room: u64| {
        let _ = fs::remove_file(&filler);
        let free = free_bytes(&root);
        assert!(free > room, "{free} bytes free");
        fs::write(&filler, vec![0u8; (free - room) as usize]).unwrap();
    };
    fill_to(20 * 4096 + (64 << 10) + catalog / 2);
    let out = t.publish("p", &b, &[]);
    out.expect_code(1);
    let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("space"), "{error}");
    assert!(error.contains("left consistent"), "{error}");
    assert!(!root.join(".distributor-journal.json").exists());
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
    assert!(!root.join("new").exists());

    // Killed once its outputs are in place, before its catalog is.
    fs::remove_file(&filler).unwrap();
    let killed = t
        .cmd()
        .env("DISTRIBUTOR_FAILPOINT", "publish.before_catalog")
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(&b)
        .output();
    assert_ne!(killed.code, 0, "{}", killed.all());
    assert!(root.join(".distributor-journal.json").exists());
    assert!(root.join("new/f00.txt").exists());
    // The killed run's staged catalog is what the next run sweeps away
    // first; swept here already, so that the disk can be filled beyond the
    // room the catalog of the settled journal needs.
    let mut staged = 0;
    for entry in fs::read_dir(&root).unwrap() {
        let entry = entry.unwrap();
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(".distributor-tmp-")
        {
            fs::remove_file(entry.path()).unwrap();
            staged += 1;
        }
    }
    assert_eq!(staged, 1, "the killed run staged its catalog at the top");
    fill_to(catalog / 2);
    let again = t.publish("p", &b, &[]);
    again.expect_code(1);
    let error = again.json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        error.contains("cannot settle the unfinished publication"),
        "{error}"
    );
    assert!(root.join(".distributor-journal.json").exists());

    // Space freed: settled and published.
    fs::remove_file(&filler).unwrap();
    t.publish("p", &b, &[]).expect_code(0);
    assert!(!root.join(".distributor-journal.json").exists());
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
    assert_eq!(t.recorded("small/root").len(), 820);
}

/// A prune of many outputs (journaled, the new catalog staged beside the
/// deletions) on a disk with no room left: it fails before it deletes
/// anything, names the two files it could not write and the cause, and
/// leaves the root as it was; once space is freed, the same prune
/// deletes them all.
#[test]
fn a_prune_on_a_full_disk_deletes_nothing_and_says_what_it_could_not_write() {
    let t = Test::new();
    let Some(_fs) = small_fs(&t) else { return };
    t.config(&CONFIG.replace(
        "workflow: replacement",
        "workflow: additive\n        prefix: \"{source_id}/\"\n        retention:\n          prune:\n            max_age: 1d\n            keep_latest: 1",
    ));
    let files: Vec<(String, String)> = (0..20)
        .map(|i| (format!("f{i:02}.txt"), format!("{i}\n")))
        .collect();
    let old = t.bundle_at("old", "old", "2026-01-01T00:00:00Z", &files);
    t.publish("p", &old, &[]).expect_code(0);
    let new = t.bundle_at(
        "new",
        "new",
        "2026-06-02T00:00:00Z",
        &[("page.txt", "new\n")],
    );
    t.publish("p", &new, &[]).expect_code(0);
    let root = t.join("small/root");
    // Published long ago (retention goes by the last update).
    let mut state: serde_json::Value =
        serde_json::from_slice(&fs::read(root.join(".distributor.json")).unwrap()).unwrap();
    for r in state["outputs"].as_array_mut().unwrap() {
        if r["path"].as_str().unwrap().starts_with("old/") {
            r["updated_at"] = "2026-01-01T00:00:00Z".into();
        }
    }
    let before = format!("{}\n", serde_json::to_string_pretty(&state).unwrap()).into_bytes();
    fs::write(root.join(".distributor.json"), &before).unwrap();

    let filler = t.join("small/filler");
    let mut fill = fs::File::create(&filler).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut fill, &block).is_ok() {}
    drop(fill);
    let prune = ["prune", "--pipeline", "p", "--destination", "d", "--apply"];
    let out = t.run(&prune);
    out.expect_code(1);
    let said = out.all();
    assert!(
        said.contains("cannot write .distributor-journal.json and the new .distributor.json"),
        "{said}"
    );
    assert!(said.contains("space"), "{said}");
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_eq!(fs::read_dir(root.join("old")).unwrap().count(), 20);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);

    fs::remove_file(&filler).unwrap();
    t.run(&prune).expect_code(0);
    assert!(!root.join("old").exists());
    assert!(root.join("new/page.txt").exists());
    assert_eq!(t.recorded("small/root").len(), 1);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
}
