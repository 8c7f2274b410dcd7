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

    // Through the agent: retried (transient), then failed.
    t.mkdir("spool/p/inbox");
    fs::rename(&big, t.join("spool/p/inbox/b")).unwrap();
    t.run(&["agent", "--once"]).expect_code(1);
    let failed = t.join("spool/p/failed/b");
    let attempts = fs::read_to_string(failed.join(".distributor-attempts")).unwrap();
    assert_eq!(attempts.trim(), "2", "retried up to max_attempts");
    let result: serde_json::Value =
        serde_json::from_slice(&fs::read(failed.join(".distributor-result.json")).unwrap())
            .unwrap();
    assert_eq!(result["stage"], "publish");
    assert_eq!(fs::read(root.join(".distributor.json")).unwrap(), before);
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
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

/// A disk that fills up once a publication's outputs are in place, so
/// that neither its catalog nor the settling of its journal can be
/// written: the result says what is true (the journal stays, and the next
/// process that locks the root finishes it), a run while the disk is still
/// full names that cause, and once space is freed the next run settles the
/// root and publishes.
#[test]
fn a_full_disk_that_also_stops_settling_says_the_journal_stays() {
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
    let many: Vec<(&str, &str)> = many.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
    let a = t.bundle_at("a", "a", "2026-06-01T00:00:00Z", &many);
    t.publish("p", &a, &[]).expect_code(0);
    let root = t.join("small/root");
    let catalog = fs::metadata(root.join(".distributor.json")).unwrap().len();
    assert!(catalog > 350 << 10, "catalog {catalog} bytes");

    // 20 new small files (a change staged beside its targets, journaled
    // first): they and the journal fit, the new catalog does not, and
    // neither does the catalog that settling the journal would write.
    let few: Vec<(String, String)> = (0..20)
        .map(|i| (format!("new/f{i:02}.txt"), format!("{i}\n")))
        .collect();
    let few: Vec<(&str, &str)> = few.iter().map(|(p, c)| (p.as_str(), c.as_str())).collect();
    let b = t.bundle_at("b", "b", "2026-06-02T00:00:00Z", &few);
    let room = 20 * 4096 + (64 << 10) + catalog / 2;
    let filler = t.join("small/filler");
    let free = free_bytes(&root);
    assert!(free > room, "{free} bytes free");
    fs::write(&filler, vec![0u8; (free - room) as usize]).unwrap();

    let out = t.publish("p", &b, &[]);
    out.expect_code(1);
    let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("space"), "{error}");
    assert!(
        error.contains("settling the root from its journal failed too")
            && error.contains("the journal stays"),
        "{error}"
    );
    assert!(!error.contains("left consistent"), "{error}");
    assert!(root.join(".distributor-journal.json").exists());

    // Still full: the next run says it cannot settle the journal, not that
    // it cannot read the root.
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

    // Space freed: settled and published.
    fs::remove_file(&filler).unwrap();
    t.publish("p", &b, &[]).expect_code(0);
    assert!(!root.join(".distributor-journal.json").exists());
    assert_catalog_matches_disk(&root);
    no_temp_files(&root);
    assert_eq!(t.records("small/root").len(), 820);
}
