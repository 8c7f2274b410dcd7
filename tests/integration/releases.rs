//! A local root published as releases (SPEC §20.2–20.3): `path` is a link
//! that distributor owns into `<path>.releases/`, each publication that
//! changes the root builds a whole release folder and switches the link,
//! and `rollback` switches it back. Each test asserts what an operator or
//! a reader sees: where the link points, the files and inodes of each
//! release, the catalogs, exit codes and JSON. Bad input, crashes at every
//! crash point, processes racing to switch, and a reader reading through
//! the link while releases are switched come last.

use crate::util::{
    DEADLINE, Output, Test, Tree, assert_catalog_matches_disk, names, read_state, records,
    sha256_file, shape, strings, tree, wait_for, write_file,
};
use distributor::runtime::failpoint::POINTS;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// The destination's `path`, and its releases folder.
const LINK: &str = "site";
const FOLDER: &str = "site.releases";

/// Files of a bundle: path and text.
type Files<'a> = &'a [(&'a str, &'a str)];

// ------------------------------------------------------------- fixture

/// One pipeline `p` with one local destination `d` at `./site`, with
/// `workflow`, keeping `releases` when given.
fn config(releases: Option<u32>, workflow: &str) -> String {
    let releases = releases
        .map(|n| format!("        releases: {n}\n"))
        .unwrap_or_default();
    format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./site
        workflow: {workflow}
{releases}"
    )
}

/// A test folder whose destination keeps `n` releases (additive).
fn with_releases(n: u32) -> Test {
    let t = Test::new();
    t.config(&config(Some(n), "additive"));
    t
}

/// `command --pipeline p --destination d [extra...]`.
fn cli(t: &Test, command: &str, extra: &[&str]) -> Output {
    let mut args = vec![command, "--pipeline", "p", "--destination", "d"];
    args.extend_from_slice(extra);
    t.run(&args)
}

/// Publishes `bundle`, expecting success; its `run --json` document.
#[track_caller]
fn publish(t: &Test, bundle: &Path) -> Value {
    t.publish("p", bundle, &[]).expect_code(0).json()
}

/// Publishes versions `1..=n` of `a.txt` (bundles `v1`... with
/// `same.txt` unchanged throughout); the releases made, oldest first.
fn publish_versions(t: &Test, n: u32) -> Vec<String> {
    (1..=n)
        .map(|v| {
            let text = format!("{v}\n");
            let b = t.bundle(
                &format!("v{v}"),
                &[("a.txt", text.as_str()), ("same.txt", "same\n")],
            );
            publish(t, &b);
            current(t)
        })
        .collect()
}

/// `rollback [extra...] --json`, expecting exit 0; its document.
#[track_caller]
fn rollback(t: &Test, extra: &[&str]) -> Value {
    let mut extra = extra.to_vec();
    extra.push("--json");
    cli(t, "rollback", &extra).expect_code(0).json()
}

// ------------------------------------------------- what is on disk

/// `name`'s sort key when it is a release's name (`YYYYMMDDTHHMMSSZ`, then
/// `-N` for a second one in one second), written from the contract.
fn release_key(name: &str) -> Option<(String, u32)> {
    let (base, n) = match name.split_once('-') {
        Some((_, n)) if n.starts_with('0') => return None,
        Some((base, n)) => (base, n.parse().ok()?),
        None => (name, 0),
    };
    let b = base.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    (b.len() == 16 && digits(0..8) && b[8] == b'T' && digits(9..15) && b[15] == b'Z')
        .then(|| (base.to_owned(), n))
}

/// The release folders (real folders with a release's name), newest first.
fn releases(t: &Test) -> Vec<String> {
    let folder = t.join(FOLDER);
    let mut found: Vec<String> = names(&folder)
        .into_iter()
        .filter(|n| release_key(n).is_some())
        .filter(|n| fs::symlink_metadata(folder.join(n)).is_ok_and(|m| m.is_dir()))
        .collect();
    found.sort_by_key(|n| std::cmp::Reverse(release_key(n)));
    found
}

/// The release `site` links to; fails unless `site` is a relative link to
/// `site.releases/<release name>`.
#[track_caller]
fn current(t: &Test) -> String {
    let target = fs::read_link(t.join(LINK))
        .unwrap_or_else(|e| panic!("{LINK} is not a link: {e}"))
        .to_string_lossy()
        .into_owned();
    let name = target
        .strip_prefix(&format!("{FOLDER}/"))
        .unwrap_or_else(|| panic!("{LINK} links to {target}, not into {FOLDER}/"));
    assert!(release_key(name).is_some(), "{LINK} links to {target}");
    name.to_owned()
}

/// The folder of release `name`.
fn release(t: &Test, name: &str) -> PathBuf {
    t.join(FOLDER).join(name)
}

/// When a release was made, from its name, as `releases` shows it.
fn created(name: &str) -> String {
    let b = &name[..16];
    format!(
        "{}-{}-{}T{}:{}:{}Z",
        &b[0..4],
        &b[4..6],
        &b[6..8],
        &b[9..11],
        &b[11..13],
        &b[13..15]
    )
}

/// The release name of this second (UTC).
fn name_now() -> String {
    let format = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    time::OffsetDateTime::now_utc().format(&format).unwrap()
}

/// Files below `root` (reserved names aside; `root` resolved when it is
/// the link) with their text.
fn contents(root: &Path) -> BTreeMap<String, String> {
    let root = &fs::canonicalize(root).unwrap();
    shape(root)
        .files()
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(root.join(&p)).unwrap();
            (p, text)
        })
        .collect()
}

/// `files`, then `more`, as a map to compare with [`contents`].
fn map(files: Files, more: Files) -> BTreeMap<String, String> {
    files
        .iter()
        .chain(more)
        .map(|(p, c)| ((*p).to_owned(), (*c).to_owned()))
        .collect()
}

fn ino(path: &Path) -> u64 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .ino()
}

fn ids(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Asserts that `dir` (resolved when it is the link) is a complete root:
/// its catalog records every file but `unmanaged` (which are there,
/// unrecorded) with their bytes. Returns the source ids its catalog holds.
#[track_caller]
fn assert_complete(dir: &Path, unmanaged: &[&str]) -> BTreeSet<String> {
    let dir = &fs::canonicalize(dir).unwrap();
    let recs = records(&read_state(dir));
    for (path, r) in &recs {
        let file = dir.join(path);
        assert!(
            fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()),
            "{}: recorded {path} is not a file there",
            dir.display()
        );
        assert_eq!(r["sha256"], sha256_file(&file), "{}: {path}", dir.display());
    }
    for path in shape(dir).files() {
        assert_eq!(
            recs.contains_key(&path),
            !unmanaged.contains(&path.as_str()),
            "{}: {path} recorded",
            dir.display()
        );
    }
    for path in unmanaged {
        assert!(dir.join(path).is_file(), "{}: {path} lost", dir.display());
    }
    recs.values()
        .map(|r| r["source"]["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Asserts that no release folder holds a lock, a journal or a temporary
/// file: the lock is the releases folder's, the rest is a publication's.
#[track_caller]
fn assert_no_bookkeeping_in_releases(t: &Test) {
    for name in releases(t) {
        for path in shape(&release(t, &name)).paths() {
            let leaf = path.rsplit('/').next().unwrap();
            assert!(
                leaf != ".distributor.lock"
                    && leaf != ".distributor-journal.json"
                    && !leaf.starts_with(".distributor-tmp-"),
                "release {name} holds {path}"
            );
        }
    }
}

/// Asserts that nothing a publication leaves while it runs is left below
/// the releases folder.
#[track_caller]
fn assert_no_temp(t: &Test, context: &str) {
    for path in shape(&t.join(FOLDER)).paths() {
        let leaf = path.rsplit('/').next().unwrap();
        assert!(
            !leaf.starts_with(".distributor-tmp-") && leaf != ".distributor-journal.json",
            "{context}: {path} left in {FOLDER}"
        );
    }
}

/// The link and everything below the test folder but the bundles and the
/// config: what a refused command must leave as it was.
fn disk(t: &Test) -> Vec<(String, Tree)> {
    names(t.path())
        .into_iter()
        .filter(|n| n != "bundles" && n != "config.yaml")
        .map(|n| {
            let tree = tree(&t.join(&n));
            (n, tree)
        })
        .collect()
}

// ------------------------------------------ publications make releases

#[test]
fn each_publication_builds_a_release_that_shares_unchanged_files() {
    let t = with_releases(3);
    let v1: Files = &[
        ("a.txt", "1\n"),
        ("keep.txt", "same\n"),
        ("sub/deep.txt", "deep\n"),
    ];
    let v2: Files = &[
        ("a.txt", "2\n"),
        ("keep.txt", "same\n"),
        ("sub/deep.txt", "deep\n"),
    ];
    let one = t.bundle("one", v1);
    let two = t.bundle("two", v2);

    let before = name_now();
    let v = publish(&t, &one);
    let after = name_now();
    assert_eq!(v["ok"], true);
    let d = &v["destinations"][0];
    assert_eq!(d["action"], "publish_new");
    assert_eq!(d["root"], t.join(LINK).display().to_string());
    assert_eq!(strings(&d["writes"]), ["a.txt", "keep.txt", "sub/deep.txt"]);
    assert_eq!(d["error"], Value::Null);
    let first = current(&t);
    assert!(
        before.as_str() <= first.as_str() && &first[..16] <= after.as_str(),
        "release {first} is not named for its time ({before}..{after})"
    );
    assert_eq!(
        crate::util::sorted_names(&t.join(FOLDER)),
        [".distributor.lock", first.as_str()],
        "the lock is the releases folder's"
    );
    assert_eq!(contents(&t.join(LINK)), map(v1, &[]));
    assert_catalog_matches_disk(&release(&t, &current(&t)));
    assert_eq!(assert_complete(&release(&t, &first), &[]), ids(&["one"]));

    let v = publish(&t, &two);
    assert_eq!(v["destinations"][0]["action"], "upsert_additive");
    let second = current(&t);
    assert_eq!(releases(&t), [second.clone(), first.clone()]);
    assert_eq!(contents(&t.join(LINK)), map(v2, &[]));
    assert_eq!(
        contents(&release(&t, &first)),
        map(v1, &[]),
        "the previous release is as it was"
    );
    assert_eq!(assert_complete(&release(&t, &first), &[]), ids(&["one"]));
    assert_eq!(assert_complete(&release(&t, &second), &[]), ids(&["two"]));
    let inode = |name: &str, path: &str| ino(&release(&t, name).join(path));
    for same in ["keep.txt", "sub/deep.txt"] {
        assert_eq!(
            inode(&first, same),
            inode(&second, same),
            "{same}: a hard link"
        );
    }
    assert_ne!(inode(&first, "a.txt"), inode(&second, "a.txt"));
    assert_ne!(
        inode(&first, "sub"),
        inode(&second, "sub"),
        "folders made anew"
    );
    assert_no_bookkeeping_in_releases(&t);

    // The same bundle again: nothing to build.
    let v = publish(&t, &two);
    assert_eq!(v["destinations"][0]["action"], "skip_same");
    assert!(strings(&v["destinations"][0]["writes"]).is_empty());
    assert_eq!(releases(&t), [second.clone(), first.clone()]);
    assert_eq!(current(&t), second);

    let v = cli(&t, "releases", &["--json"]).expect_code(0).json();
    assert_eq!(
        v,
        json!({"releases": [
            {"release": second, "current": true, "created": created(&second), "sources": ["two"]},
            {"release": first, "current": false, "created": created(&first), "sources": ["one"]},
        ]})
    );
    let text = cli(&t, "releases", &[]).expect_code(0).stdout.clone();
    assert!(
        text.lines()
            .next()
            .unwrap()
            .starts_with(&format!("* {second}")),
        "{text}"
    );
}

#[test]
fn retention_keeps_the_newest_releases_and_builds_on_a_rolled_back_one() {
    let t = with_releases(2);
    let made = publish_versions(&t, 4);
    assert_eq!(releases(&t), [made[3].clone(), made[2].clone()]);
    assert_eq!(current(&t), made[3]);

    // A rollback deletes nothing; the next publication builds on the
    // release rolled back to, and the newest two stay.
    assert_eq!(rollback(&t, &[])["to"], made[2]);
    assert_eq!(releases(&t), [made[3].clone(), made[2].clone()]);
    let five = t.bundle("v5", &[("a.txt", "5\n"), ("same.txt", "same\n")]);
    publish(&t, &five);
    let newest = current(&t);
    assert_eq!(releases(&t), [newest.clone(), made[3].clone()]);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "5\n");
    assert_eq!(assert_complete(&release(&t, &newest), &[]), ids(&["v5"]));
}

#[test]
fn retention_never_deletes_the_current_release_when_others_sort_after_it() {
    let t = with_releases(2);
    let made = publish_versions(&t, 1);
    // Two releases named after now (a clock set back since): the release
    // the next publication makes sorts third.
    let later = ["20991231T235959Z", "20991231T235958Z"];
    for name in later {
        write_file(&release(&t, name).join("a.txt"), b"from the future\n");
    }
    let two = t.bundle("v2", &[("a.txt", "2\n")]);
    publish(&t, &two);
    let now = current(&t);
    assert_ne!(now, made[0]);
    assert_eq!(releases(&t), [later[0], later[1], now.as_str()]);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "2\n");
}

#[test]
fn a_plain_root_becomes_the_first_release_with_its_unmanaged_content() {
    let t = Test::new();
    t.config(&config(None, "additive"));
    let v1: Files = &[("a.txt", "1\n"), ("keep.txt", "same\n")];
    let v2: Files = &[("a.txt", "2\n"), ("keep.txt", "same\n")];
    let unmanaged: Files = &[("notes/mine.txt", "mine\n"), ("stray.txt", "stray\n")];
    publish(&t, &t.bundle("one", v1));
    for (path, text) in unmanaged {
        t.write(&format!("{LINK}/{path}"), text);
    }
    let plain = contents(&t.join(LINK));
    assert_eq!(plain, map(v1, unmanaged));
    let plain_catalog = fs::read(t.join("site/.distributor.json")).unwrap();
    let plain_inodes: BTreeMap<String, u64> = plain
        .keys()
        .map(|p| (p.clone(), ino(&t.join(LINK).join(p))))
        .collect();

    t.config(&config(Some(3), "additive"));
    let two = t.bundle("two", v2);
    let out = t
        .agent_cmd()
        .args(["run", "--json", "--pipeline", "p"])
        .arg(&two)
        .output();
    out.expect_code(0);
    assert!(
        out.stderr.contains("converted to releases"),
        "{}",
        out.stderr
    );

    let [second, first] = <[String; 2]>::try_from(releases(&t)).unwrap();
    assert_eq!(current(&t), second);
    // The first release is the plain root as it was: its files (the same
    // inodes) and its catalog, but not its lock.
    assert_eq!(contents(&release(&t, &first)), plain);
    for (path, inode) in &plain_inodes {
        assert_eq!(ino(&release(&t, &first).join(path)), *inode, "{path}");
    }
    assert_eq!(
        fs::read(release(&t, &first).join(".distributor.json")).unwrap(),
        plain_catalog
    );
    let unmanaged_paths = ["notes/mine.txt", "stray.txt"];
    assert_eq!(
        assert_complete(&release(&t, &first), &unmanaged_paths),
        ids(&["one"])
    );
    // The second is the publication, the unmanaged content carried along.
    assert_eq!(contents(&t.join(LINK)), map(v2, unmanaged));
    assert_eq!(
        assert_complete(&release(&t, &second), &unmanaged_paths),
        ids(&["two"])
    );
    for path in unmanaged_paths {
        assert_eq!(
            ino(&release(&t, &first).join(path)),
            ino(&release(&t, &second).join(path))
        );
    }
    assert_no_bookkeeping_in_releases(&t);
}

// ------------------------------------------------------- maintenance

/// Two sources under their own prefixes, pruned after a day but the
/// newest.
const PRUNED: &str = r#"spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./site
        releases: 3
        prefix: "{source_id}/"
        retention:
          prune:
            max_age: 1d
            keep_latest: 1
"#;

/// Sets every record's `updated_at` in the catalog of `dir`, replacing
/// the file (other releases' catalogs are other files).
fn age_catalog(dir: &Path, updated_at: &str) {
    let mut state = read_state(dir);
    for r in state["outputs"].as_array_mut().unwrap() {
        r["updated_at"] = updated_at.into();
    }
    let staged = dir.join("aged.json");
    write_file(
        &staged,
        serde_json::to_string_pretty(&state).unwrap().as_bytes(),
    );
    fs::rename(staged, dir.join(".distributor.json")).unwrap();
}

#[test]
fn maintenance_commands_act_on_the_current_release_only() {
    let t = Test::new();
    t.config(PRUNED);
    let s1 = t.bundle_at("s1", "s1", "2026-01-01T00:00:00Z", &[("a.md", "one")]);
    let s2 = t.bundle_at("s2", "s2", "2026-01-02T00:00:00Z", &[("a.md", "two")]);
    publish(&t, &s1);
    let older = current(&t);
    publish(&t, &s2);
    let now = current(&t);
    age_catalog(&release(&t, &now), "2026-01-03T00:00:00Z");
    write_file(
        &release(&t, &older).join("stray.txt"),
        b"only in the older\n",
    );
    t.write("site/here.txt", "only in the current\n");
    let older_before = tree(&release(&t, &older));
    let json = |command: &str, extra: &[&str], code: i32| {
        let mut extra = extra.to_vec();
        extra.push("--json");
        cli(&t, command, &extra).expect_code(code).json()
    };

    let v = json("verify", &[], 0);
    assert_eq!(
        (v["ok"].clone(), v["checked"].clone()),
        (json!(true), json!(2))
    );
    let v = json("catalog", &[], 0);
    assert_eq!(v["root"], t.join(LINK).display().to_string());
    let paths: Vec<&str> = v["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["s1/a.md", "s2/a.md"]);
    let v = json("reconcile-state", &["--dry-run"], 0);
    assert_eq!(strings(&v["unmanaged"]), ["here.txt"]);
    assert!(strings(&v["missing"]).is_empty());

    let v = json("prune", &["--apply"], 0);
    assert_eq!(strings(&v["deletes"]), ["s1/a.md"]);
    assert!(!t.join("site/s1").exists());
    assert_eq!(
        records(&read_state(&t.join(LINK)))
            .into_keys()
            .collect::<Vec<_>>(),
        ["s2/a.md"]
    );

    fs::remove_file(t.join("site/s2/a.md")).unwrap();
    let v = json("verify", &[], 1);
    assert_eq!(strings(&v["missing"]), ["s2/a.md"]);
    let v = json("reconcile-state", &[], 0);
    assert_eq!(strings(&v["missing"]), ["s2/a.md"]);
    assert_eq!(v["removed_records"], 1);
    assert!(records(&read_state(&t.join(LINK))).is_empty());
    assert_eq!(json("verify", &[], 0)["checked"], 0);

    // The older release was never touched, and no command switched the
    // link or left a lock in a release.
    assert_eq!(tree(&release(&t, &older)), older_before);
    assert_eq!(
        assert_complete(&release(&t, &older), &["stray.txt"]),
        ids(&["s1"])
    );
    assert_eq!(current(&t), now);
    assert_eq!(releases(&t), [now, older]);
    assert_no_bookkeeping_in_releases(&t);
}

// ---------------------------------------------------------- rollback

#[test]
fn rollback_switches_to_the_release_before_or_to_the_one_named() {
    let t = with_releases(5);
    let r = publish_versions(&t, 3);
    let on_disk = disk(&t);

    let v = rollback(&t, &["--dry-run"]);
    assert_eq!(
        v,
        json!({"dry_run": true, "pipeline_id": "p", "destination_id": "d", "from": r[2], "to": r[1]})
    );
    assert_eq!(disk(&t), on_disk, "a dry run changes nothing");

    let out = cli(&t, "rollback", &["--json"]);
    out.expect_code(0);
    let keys: Vec<String> = out.json().as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["destination_id", "dry_run", "from", "pipeline_id", "to"]
    );
    assert_eq!(
        out.json(),
        json!({"dry_run": false, "pipeline_id": "p", "destination_id": "d", "from": r[2], "to": r[1]})
    );
    let warning = format!("rolled back from release {} to release {}", r[2], r[1]);
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains(&warning)),
        "{}",
        out.stderr
    );
    assert_eq!(current(&t), r[1]);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "2\n");
    // The catalog follows: each release holds its own.
    let v = cli(&t, "catalog", &["--json"]).expect_code(0).json();
    assert!(
        v["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["source"]["id"] == "v2")
    );
    assert_eq!(releases(&t), [r[2].clone(), r[1].clone(), r[0].clone()]);

    let text = cli(&t, "rollback", &[]).expect_code(0).stdout.clone();
    assert_eq!(text, format!("rolled back from {} to {}\n", r[1], r[0]));
    assert_eq!(current(&t), r[0]);

    // Nothing before the oldest.
    let out = cli(&t, "rollback", &[]);
    out.expect_code(3);
    assert!(out.all().contains("no earlier release"), "{}", out.all());
    assert_eq!(current(&t), r[0]);

    // Forward again by name; a name it does not keep is a usage error.
    let v = rollback(&t, &["--to", &r[2]]);
    assert_eq!((&v["from"], &v["to"]), (&json!(r[0]), &json!(r[2])));
    assert_eq!(current(&t), r[2]);
    let on_disk = disk(&t);
    let out = cli(&t, "rollback", &["--to", "20200101T000000Z"]);
    out.expect_code(2);
    assert!(
        out.all().contains("no release \"20200101T000000Z\""),
        "{}",
        out.all()
    );
    assert_eq!(disk(&t), on_disk);
    rollback(&t, &["--to", &r[0], "--dry-run"]);
    assert_eq!(disk(&t), on_disk);

    let v = cli(&t, "releases", &["--json"]).expect_code(0).json();
    let listed: Vec<(String, bool)> = v["releases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["release"].as_str().unwrap().to_owned(),
                r["current"] == true,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (r[2].clone(), true),
            (r[1].clone(), false),
            (r[0].clone(), false)
        ]
    );
}

#[test]
fn rollback_exits_3_without_an_earlier_release_and_2_without_releases() {
    let t = with_releases(3);
    let out = cli(&t, "rollback", &[]);
    out.expect_code(3);
    assert!(out.all().contains("no releases yet"), "{}", out.all());
    assert!(
        !t.join(LINK).exists() && !t.join(FOLDER).exists(),
        "nothing created"
    );
    let v = cli(&t, "releases", &["--json"]).expect_code(0).json();
    assert_eq!(v, json!({"releases": []}));

    let r = publish_versions(&t, 1);
    for extra in [&[][..], &["--dry-run"][..]] {
        let out = cli(&t, "rollback", extra);
        out.expect_code(3);
        assert!(out.all().contains("oldest"), "{}", out.all());
        assert_eq!(current(&t), r[0]);
    }

    let plain = Test::new();
    plain.config(&config(None, "additive"));
    publish(&plain, &plain.bundle("v1", &[("a.txt", "1\n")]));
    let on_disk = disk(&plain);
    for command in ["rollback", "releases"] {
        let out = cli(&plain, command, &[]);
        out.expect_code(2);
        assert!(out.all().contains("releases"), "{command}: {}", out.all());
    }
    assert_eq!(disk(&plain), on_disk);
}

#[test]
fn the_next_publication_after_a_rollback_builds_on_the_rolled_back_release() {
    let t = with_releases(5);
    publish(
        &t,
        &t.bundle("one", &[("a.txt", "1\n"), ("one.txt", "one\n")]),
    );
    let first = current(&t);
    publish(
        &t,
        &t.bundle("two", &[("a.txt", "2\n"), ("two.txt", "two\n")]),
    );
    assert!(t.join("site/one.txt").exists(), "additive: one.txt stays");
    rollback(&t, &[]);
    assert_eq!(current(&t), first);

    publish(
        &t,
        &t.bundle("three", &[("a.txt", "3\n"), ("three.txt", "three\n")]),
    );
    let third = current(&t);
    // Built on the first release: its files and its catalog, nothing of
    // the second.
    assert_eq!(
        contents(&t.join(LINK)),
        map(
            &[
                ("a.txt", "3\n"),
                ("one.txt", "one\n"),
                ("three.txt", "three\n")
            ],
            &[]
        )
    );
    let recs = records(&read_state(&t.join(LINK)));
    assert_eq!(recs["one.txt"]["source"]["id"], "one");
    assert_eq!(recs["a.txt"]["source"]["id"], "three");
    assert!(!recs.contains_key("two.txt"));
    assert_eq!(
        ino(&release(&t, &first).join("one.txt")),
        ino(&release(&t, &third).join("one.txt"))
    );
    assert_eq!(releases(&t).first(), Some(&third), "the newest release");
}

// ------------------------------------------------------------ config

#[test]
fn releases_are_checked_in_the_config() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        backend: s3
        bucket: site-bucket
        path: site
        endpoint: http://127.0.0.1:9
        releases: 3
",
    );
    let b = t.bundle("v1", &[("a.txt", "1\n")]);
    for out in [
        t.run(&["config", "check"]),
        t.run(&["run", "--pipeline", "p", b.to_str().unwrap()]),
    ] {
        out.expect_code(2);
        assert!(
            out.all().contains("releases") && out.all().contains("s3"),
            "{}",
            out.all()
        );
    }
    for n in [1, 101] {
        t.config(&config(Some(n), "additive"));
        let out = t.run(&["config", "check"]);
        out.expect_code(2);
        assert!(out.all().contains("releases must be"), "{n}: {}", out.all());
    }
    t.config(&config(Some(5), "additive"));
    let out = t.run(&["config", "check"]);
    out.expect_code(0);
    assert!(out.stdout.contains("releases: 5"), "{}", out.stdout);
}

// -------------------------------------------------------- bad input

/// Asserts that a publication was refused before anything was planned,
/// its error naming `needle`.
#[track_caller]
fn assert_refused(out: &Output, needle: &str) {
    out.expect_code(1);
    let v = out.json();
    assert_eq!(v["stage"], "lock", "{}", out.stdout);
    let error = v["error"].as_str().unwrap();
    assert!(error.contains(needle), "{error}");
}

#[test]
fn a_link_distributor_does_not_own_is_refused_untouched() {
    let t = with_releases(3);
    t.write("elsewhere/index.html", "not ours\n");
    std::os::unix::fs::symlink("elsewhere", t.join(LINK)).unwrap();
    let on_disk = disk(&t);
    let b = t.bundle("v1", &[("a.txt", "1\n")]);
    assert_refused(&t.publish("p", &b, &[]), "which distributor did not make");
    assert_eq!(disk(&t), on_disk);
    assert!(!t.join(FOLDER).exists());
}

#[test]
fn a_file_at_path_is_refused_untouched() {
    let t = with_releases(3);
    t.write(LINK, "a file\n");
    let on_disk = disk(&t);
    let b = t.bundle("v1", &[("a.txt", "1\n")]);
    assert_refused(&t.publish("p", &b, &[]), "is a file");
    assert_eq!(disk(&t), on_disk);
}

#[test]
fn a_foreign_releases_folder_is_refused_untouched() {
    let t = with_releases(3);
    t.write(&format!("{FOLDER}/notes.txt"), "someone else's\n");
    let on_disk = disk(&t);
    let b = t.bundle("v1", &[("a.txt", "1\n")]);
    assert_refused(
        &t.publish("p", &b, &[]),
        "not a releases folder distributor made",
    );
    assert_eq!(disk(&t), on_disk, "no lock file, no link");
}

#[test]
fn a_link_to_a_release_deleted_by_hand_is_refused_until_rolled_back() {
    let t = with_releases(3);
    let r = publish_versions(&t, 2);
    fs::remove_dir_all(release(&t, &r[1])).unwrap();
    let on_disk = disk(&t);
    let b = t.bundle("v3", &[("a.txt", "3\n")]);
    assert_refused(&t.publish("p", &b, &[]), "holds no such release folder");
    let out = cli(&t, "verify", &[]);
    out.expect_code(1);
    assert!(
        out.all().contains("holds no such release folder"),
        "{}",
        out.all()
    );
    assert_eq!(disk(&t), on_disk);

    // What the error advises works: list, then switch to one that is there.
    let v = cli(&t, "releases", &["--json"]).expect_code(0).json();
    assert_eq!(v["releases"].as_array().unwrap().len(), 1);
    assert_eq!(v["releases"][0]["release"], r[0]);
    assert_eq!(v["releases"][0]["current"], false);
    let v = rollback(&t, &[]);
    assert_eq!((&v["from"], &v["to"]), (&json!(r[1]), &json!(r[0])));
    assert_eq!(current(&t), r[0]);
    publish(&t, &b);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "3\n");
    assert_catalog_matches_disk(&release(&t, &current(&t)));
}

#[test]
fn a_link_whose_releases_folder_is_gone_is_refused_untouched() {
    let t = with_releases(3);
    publish_versions(&t, 1);
    fs::remove_dir_all(t.join(FOLDER)).unwrap();
    let on_disk = disk(&t);
    let b = t.bundle("v2", &[("a.txt", "2\n")]);
    assert_refused(&t.publish("p", &b, &[]), "which is missing");
    assert_eq!(disk(&t), on_disk, "the releases folder is not made anew");
}

#[test]
fn a_link_deleted_by_hand_is_refused_until_rolled_back_to_a_release() {
    let t = with_releases(3);
    let b1 = t.bundle("v1", &[("a.txt", "1\n"), ("keep.txt", "kept\n")]);
    publish(&t, &b1);
    let newest = current(&t);
    fs::remove_file(t.join(LINK)).unwrap();
    let on_disk = disk(&t);
    // Built from nothing, the next release would lose keep.txt.
    let b2 = t.bundle("v2", &[("a.txt", "2\n")]);
    assert_refused(
        &t.publish("p", &b2, &[]),
        &format!("rollback --to {newest}"),
    );
    assert_eq!(disk(&t), on_disk, "nothing is built");
    rollback(&t, &["--to", &newest]);
    publish(&t, &b2);
    assert_eq!(
        fs::read_to_string(t.join("site/keep.txt")).unwrap(),
        "kept\n"
    );
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "2\n");
}

#[test]
fn a_release_damaged_by_hand_is_repaired_in_the_next_release() {
    let t = with_releases(3);
    let files: Files = &[("a.txt", "aaa\n"), ("b.txt", "bbb\n"), ("c.txt", "ccc\n")];
    let b = t.bundle("v1", files);
    publish(&t, &b);
    let damaged = current(&t);
    fs::remove_file(t.join("site/a.txt")).unwrap();
    fs::write(t.join("site/b.txt"), "changed by hand\n").unwrap();
    let v = cli(&t, "verify", &["--json"]).expect_code(1).json();
    assert_eq!(strings(&v["missing"]), ["a.txt"]);
    assert_eq!(strings(&v["mismatched"]), ["b.txt"]);

    let v = publish(&t, &b);
    assert_eq!(v["destinations"][0]["action"], "upsert_additive");
    let repaired = current(&t);
    assert_ne!(repaired, damaged);
    assert_eq!(contents(&t.join(LINK)), map(files, &[]));
    assert_catalog_matches_disk(&release(&t, &current(&t)));
    assert_eq!(
        cli(&t, "verify", &["--json"]).expect_code(0).json()["ok"],
        true
    );
}

#[test]
fn a_release_replaced_by_a_symlink_is_never_followed() {
    let t = with_releases(2);
    t.write("outside/a.txt", "precious\n");
    let r = publish_versions(&t, 2);
    // The older release replaced by a link to a folder elsewhere: not a
    // release, never listed, switched to, or deleted through.
    fs::remove_dir_all(release(&t, &r[0])).unwrap();
    std::os::unix::fs::symlink("../outside", release(&t, &r[0])).unwrap();
    let outside = tree(&t.join("outside"));
    let v = cli(&t, "releases", &["--json"]).expect_code(0).json();
    assert_eq!(v["releases"].as_array().unwrap().len(), 1);
    cli(&t, "rollback", &["--to", &r[0]]).expect_code(2);
    assert_eq!(current(&t), r[1]);
    for v in 3..=5 {
        let text = format!("{v}\n");
        publish(&t, &t.bundle(&format!("v{v}"), &[("a.txt", text.as_str())]));
    }
    assert_eq!(tree(&t.join("outside")), outside);
    assert!(
        fs::symlink_metadata(release(&t, &r[0]))
            .unwrap()
            .is_symlink()
    );

    // The current release replaced so: refused, nothing followed.
    let now = current(&t);
    fs::rename(release(&t, &now), t.join("moved")).unwrap();
    std::os::unix::fs::symlink("../moved", release(&t, &now)).unwrap();
    let on_disk = disk(&t);
    let b = t.bundle("v6", &[("a.txt", "6\n")]);
    assert_refused(&t.publish("p", &b, &[]), "holds no such release folder");
    assert_eq!(disk(&t), on_disk);
}

#[test]
fn a_destination_without_releases_refuses_a_release_link() {
    let t = with_releases(3);
    publish_versions(&t, 1);
    t.config(&config(None, "additive"));
    let on_disk = disk(&t);
    let b = t.bundle("v2", &[("a.txt", "2\n")]);
    assert_refused(&t.publish("p", &b, &[]), "published as releases");
    let out = cli(&t, "verify", &[]);
    out.expect_code(1);
    assert!(out.all().contains("published as releases"), "{}", out.all());
    assert_eq!(disk(&t), on_disk);
}

// ------------------------------------------------------------ crashes

/// The versions the crash tests publish with `workflow: replacement`: the
/// third changes `a.txt` and the page, keeps `keep.txt`, adds
/// `new/deep.txt` and drops `gone/old.txt`.
const V1: Files = &[
    ("a.txt", "one\n"),
    ("gone/old.txt", "old\n"),
    ("index.html", "<p>one</p>\n"),
    ("keep.txt", "same\n"),
];
const V2: Files = &[
    ("a.txt", "two\n"),
    ("gone/old.txt", "old\n"),
    ("index.html", "<p>two</p>\n"),
    ("keep.txt", "same\n"),
];
const V3: Files = &[
    ("a.txt", "three\n"),
    ("index.html", "<p>three</p>\n"),
    ("keep.txt", "same\n"),
    ("new/deep.txt", "new\n"),
];

/// The crash points a replacing release publication passes: every
/// `publish.*` and `releases.*` one but `publish.after_clear` (only
/// `--force` and a legacy root clear a root).
fn release_points() -> Vec<&'static str> {
    let points: Vec<&str> = POINTS
        .iter()
        .copied()
        .filter(|p| p.starts_with("publish.") || p.starts_with("releases."))
        .filter(|p| *p != "publish.after_clear")
        .collect();
    for named in [
        "publish.after_journal",
        "publish.after_stage",
        "publish.after_rename",
        "publish.before_catalog",
        "publish.after_catalog",
        "releases.after_links",
        "releases.after_complete",
        "releases.after_switch",
        "releases.after_retain",
    ] {
        assert!(points.contains(&named), "{named} is not in {points:?}");
    }
    points
}

/// Publishes `bundle` with `DISTRIBUTOR_FAILPOINT=failpoint`: true when
/// it aborted there, false when it finished without reaching it.
fn crashed(t: &Test, failpoint: &str, bundle: &Path) -> bool {
    let out = t
        .cmd()
        .env("DISTRIBUTOR_FAILPOINT", failpoint)
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .arg(bundle)
        .output();
    assert!(
        out.code == 0 || out.code == -libc::SIGABRT,
        "{failpoint}: {}",
        out.all()
    );
    out.code != 0
}

/// The version `site` shows: it links to a complete release whose files
/// are exactly those of one of `versions` plus `unmanaged`, all recorded
/// by that version; never a mix.
#[track_caller]
fn version_shown(t: &Test, versions: &[(&str, Files)], unmanaged: Files, context: &str) -> String {
    let dir = release(t, &current(t));
    let paths: Vec<&str> = unmanaged.iter().map(|(p, _)| *p).collect();
    let sources = assert_complete(&dir, &paths);
    let files = contents(&dir);
    for (id, v) in versions {
        if files == map(v, unmanaged) {
            assert_eq!(sources, ids(&[*id]), "{context}");
            return (*id).to_owned();
        }
    }
    panic!("{context}: {LINK} shows none of the versions: {files:?}");
}

/// Crashes the publication of `bundle` into a fresh fixture (`prepare`)
/// at each hit of each of `points`, checks what it left (`check`) and
/// that a rerun converges to `bundle`'s version `want` (with
/// `unmanaged` carried along); how many times each point was hit.
fn crash_everywhere<'p>(
    points: Vec<&'p str>,
    bundle: &Path,
    want: (&str, Files),
    unmanaged: Files,
    prepare: impl Fn(&Test),
    check: impl Fn(&Test, &str),
) -> BTreeMap<&'p str, u32> {
    let mut crashes = BTreeMap::new();
    for point in points {
        for nth in 1.. {
            let context = format!("{point}:{nth}");
            let t = Test::on_tmpfs();
            prepare(&t);
            if !crashed(&t, &context, bundle) {
                assert!(nth > 1, "{point} is never reached");
                break;
            }
            assert!(nth < 20, "{point} is reached again and again");
            crashes.insert(point, nth);
            check(&t, &context);
            t.publish("p", bundle, &[]).expect_code(0);
            assert_no_temp(&t, &context);
            assert_eq!(version_shown(&t, &[want], unmanaged, &context), want.0);
            assert_no_bookkeeping_in_releases(&t);
            check(&t, &context);
        }
    }
    crashes
}

#[test]
fn a_crash_at_any_point_leaves_the_link_at_a_complete_release() {
    let bundles = Test::on_tmpfs();
    let [v1, v2, v3] = [("v1", V1), ("v2", V2), ("v3", V3)].map(|(id, f)| bundles.bundle(id, f));
    let crashes = crash_everywhere(
        release_points(),
        &v3,
        ("v3", V3),
        &[],
        |t| {
            // Two releases kept: the third publication deletes the first.
            t.config(&config(Some(2), "replacement"));
            publish(t, &v1);
            publish(t, &v2);
        },
        |t, context| {
            version_shown(t, &[("v2", V2), ("v3", V3)], &[], context);
        },
    );
    eprintln!("crashes (point: hits), each left a whole release behind the link: {crashes:?}");
}

#[test]
fn a_crash_while_converting_a_plain_root_never_loses_its_content() {
    let bundles = Test::on_tmpfs();
    let v1 = bundles.bundle("v1", V1);
    let v3 = bundles.bundle("v3", V3);
    let unmanaged: Files = &[("notes/mine.txt", "mine\n")];
    let plain = map(V1, unmanaged);
    // Two releases made and none deleted: retention passes no crash point.
    let points = release_points()
        .into_iter()
        .filter(|p| *p != "releases.after_retain")
        .collect();
    let crashes = crash_everywhere(
        points,
        &v3,
        ("v3", V3),
        unmanaged,
        |t| {
            t.config(&config(None, "replacement"));
            publish(t, &v1);
            t.write("site/notes/mine.txt", "mine\n");
            t.config(&config(Some(3), "replacement"));
        },
        |t, context| {
            // `site` is still the plain root, or links to a whole release;
            // either way the plain content is there, whole, somewhere.
            let site = t.join(LINK);
            if fs::symlink_metadata(&site).unwrap().is_dir() {
                assert_eq!(contents(&site), plain, "{context}");
                assert_eq!(assert_complete(&site, &["notes/mine.txt"]), ids(&["v1"]));
            } else {
                version_shown(t, &[("v1", V1), ("v3", V3)], unmanaged, context);
                assert!(
                    releases(t)
                        .iter()
                        .any(|r| contents(&release(t, r)) == plain),
                    "{context}: the plain root's content is in no release"
                );
            }
        },
    );
    eprintln!("crashes (point: hits) while converting, the plain content never lost: {crashes:?}");
}

// -------------------------------------------------------------- races

/// `rollback --json` with `RUST_LOG=info` (to see it wait for the lock),
/// crashing or stopping at `failpoint` when given.
fn rollback_proc(t: &Test, failpoint: Option<&str>) -> crate::util::Proc {
    let mut cmd = t.agent_cmd();
    if let Some(failpoint) = failpoint {
        cmd.env("DISTRIBUTOR_FAILPOINT", failpoint);
    }
    cmd.args([
        "rollback",
        "--pipeline",
        "p",
        "--destination",
        "d",
        "--json",
    ])
    .start()
}

/// `(from, to)` of a `rollback --json` document.
fn switched(out: &Output) -> (String, String) {
    let v = out.expect_code(0).json();
    (
        v["from"].as_str().unwrap().to_owned(),
        v["to"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_second_switch_waits_for_the_lock_of_the_first() {
    let t = with_releases(5);
    let r = publish_versions(&t, 3);
    let pair = |a: &String, b: &String| (a.clone(), b.clone());

    // A rollback stopped right after its switch, still holding the lock.
    let mut first = rollback_proc(&t, Some("releases.after_switch:1:stop"));
    assert!(wait_for(DEADLINE, || first.stopped()), "{}", first.stderr());
    assert_eq!(current(&t), r[1]);
    let mut second = rollback_proc(&t, None);
    second.wait_log("waiting for the lock on", DEADLINE);
    first.signal(libc::SIGCONT);
    assert_eq!(switched(&first.finish(DEADLINE)), pair(&r[2], &r[1]));
    assert_eq!(switched(&second.finish(DEADLINE)), pair(&r[1], &r[0]));
    assert_eq!(current(&t), r[0]);

    // A publication stopped while it builds its release: the rollback
    // waits, then rolls back from the release the publication made.
    rollback(&t, &["--to", &r[2]]);
    let four = t.bundle("v4", &[("a.txt", "4\n"), ("same.txt", "same\n")]);
    let mut publication = t
        .agent_cmd()
        .env("DISTRIBUTOR_FAILPOINT", "releases.after_links:1:stop")
        .args(["run", "--json", "--pipeline", "p"])
        .arg(&four)
        .start();
    assert!(
        wait_for(DEADLINE, || publication.stopped()),
        "{}",
        publication.stderr()
    );
    let mut back = rollback_proc(&t, None);
    back.wait_log("waiting for the lock on", DEADLINE);
    publication.signal(libc::SIGCONT);
    publication.finish(DEADLINE).expect_code(0);
    let newest = releases(&t)[0].clone();
    assert_eq!(switched(&back.finish(DEADLINE)), pair(&newest, &r[2]));
    assert_eq!(current(&t), r[2]);
    assert_catalog_matches_disk(&release(&t, &current(&t)));
}

#[test]
fn switches_started_together_all_finish_at_a_complete_release() {
    let t = with_releases(10);
    let r = publish_versions(&t, 3);
    for round in 0..5 {
        // Two rollbacks at once: one takes the lock first, the other then
        // goes one further back.
        let (mut a, mut b) = (rollback_proc(&t, None), rollback_proc(&t, None));
        let steps: BTreeSet<(String, String)> =
            [switched(&a.finish(DEADLINE)), switched(&b.finish(DEADLINE))].into();
        let want = [(r[2].clone(), r[1].clone()), (r[1].clone(), r[0].clone())];
        assert_eq!(steps, want.into(), "round {round}");
        assert_eq!(current(&t), r[0]);
        rollback(&t, &["--to", &r[2]]);

        // A rollback and a publication at once: either order ends at a
        // whole release.
        let text = format!("round {round}\n");
        let b = t.bundle(
            &format!("round{round}"),
            &[("a.txt", text.as_str()), ("same.txt", "same\n")],
        );
        let mut back = rollback_proc(&t, None);
        let mut publication = t
            .cmd()
            .args([
                "--config",
                "config.yaml",
                "run",
                "--json",
                "--pipeline",
                "p",
            ])
            .arg(&b)
            .start();
        publication.finish(DEADLINE).expect_code(0);
        back.finish(DEADLINE).expect_code(0);
        let shown = assert_complete(&t.join(LINK), &[]);
        assert_eq!(shown.len(), 1, "round {round}: {shown:?}");
        assert_no_temp(&t, &format!("round {round}"));
        rollback(&t, &["--to", &r[2]]);
    }
}

// ------------------------------------------------ readers see no mix

/// Version `v` of a 2,000-file site: `a.txt` and `z.txt` hold `v`, every
/// hundredth other file changes with it, the rest never change.
fn big_version(t: &Test, v: u32) -> PathBuf {
    let mut files = vec![
        ("a.txt".to_owned(), format!("{v}\n")),
        ("z.txt".to_owned(), format!("{v}\n")),
    ];
    for i in 0..1998 {
        let body = if i % 100 == 0 {
            format!("file {i} of version {v}\n")
        } else {
            format!("file {i}\n")
        };
        files.push((format!("f/{:02}/{i:04}.txt", i % 20), body));
    }
    t.bundle(&format!("v{v}"), &files)
}

/// Opens `link` as a folder (one resolution of the link) and reads
/// `a.txt` and `z.txt` through that descriptor.
fn read_pair(link: &Path) -> io::Result<(String, String)> {
    use rustix::fs::{Mode, OFlags};
    let dir = rustix::fs::open(
        link,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let read = |name: &str| -> io::Result<String> {
        let fd = rustix::fs::openat(&dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        let mut text = String::new();
        fs::File::from(fd).read_to_string(&mut text)?;
        Ok(text)
    };
    Ok((read("a.txt")?, read("z.txt")?))
}

/// Sets a flag when dropped: the reader stops even when the test fails.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What the reader saw.
#[derive(Default)]
struct Seen {
    pairs: u64,
    versions: BTreeSet<u32>,
    mixes: Vec<(String, String)>,
    errors: Vec<String>,
}

/// Publishes six versions of a 2,000-file site into `<folder>/site` of
/// `t`'s folder while a reader keeps reading `a.txt` and `z.txt` through
/// one open of the link; each switch waits until the reader has seen the
/// version before, and the reader stops when the publisher is done.
fn reader_never_sees_a_mix(t: &Test, folder: &str) {
    t.config(&config(Some(10), "additive").replace("./site", &format!("./{folder}/site")));
    let versions: Vec<PathBuf> = (1..=6).map(|v| big_version(t, v)).collect();
    publish(t, &versions[0]);
    let link = t.join(folder).join(LINK);
    let done = Done(Arc::new(AtomicBool::new(false)));
    let latest = Arc::new(AtomicU32::new(0));
    let reader = {
        let (done, latest, link) = (done.0.clone(), latest.clone(), link.clone());
        std::thread::spawn(move || {
            let mut seen = Seen::default();
            while !done.load(Ordering::SeqCst) {
                match read_pair(&link) {
                    Ok((a, z)) if a != z => seen.mixes.push((a, z)),
                    Ok((a, _)) => match a.trim().parse() {
                        Ok(v) => {
                            seen.versions.insert(v);
                            latest.store(v, Ordering::SeqCst);
                        }
                        Err(_) => seen.errors.push(format!("a.txt holds {a:?}")),
                    },
                    Err(e) => seen.errors.push(e.to_string()),
                }
                seen.pairs += 1;
            }
            seen
        })
    };
    for (v, bundle) in (1..).zip(&versions) {
        if v > 1 {
            publish(t, bundle);
        }
        assert!(
            wait_for(DEADLINE, || latest.load(Ordering::SeqCst) == v),
            "the reader never saw version {v}"
        );
    }
    drop(done);
    let seen = reader.join().unwrap();
    assert!(seen.mixes.is_empty(), "mixed reads: {:?}", seen.mixes);
    assert!(seen.errors.is_empty(), "failed reads: {:?}", seen.errors);
    assert_eq!(seen.versions, (1..=6).collect());
    eprintln!(
        "{}: {} read pairs across 5 switches of a 2,000-file release, none mixed",
        link.display(),
        seen.pairs
    );
}

/// The type of the file system holding `path` (`statfs`'s `f_type`).
fn fs_type(path: &Path) -> rustix::fs::FsWord {
    rustix::fs::statfs(path).unwrap().f_type
}

const TMPFS_MAGIC: rustix::fs::FsWord = 0x0102_1994;
const EXT4_MAGIC: rustix::fs::FsWord = 0xEF53;

#[test]
fn a_reader_never_sees_a_mix_in_the_temp_dir() {
    let t = Test::new();
    eprintln!("file system type {:#x}", fs_type(t.path()));
    reader_never_sees_a_mix(&t, ".");
}

#[test]
fn a_reader_never_sees_a_mix_on_tmpfs() {
    let t = Test::on_tmpfs();
    if fs_type(t.path()) != TMPFS_MAGIC {
        eprintln!("skipped: no usable tmpfs at /dev/shm");
        return;
    }
    reader_never_sees_a_mix(&t, ".");
}

/// An ext4 file system in an image file, loop-mounted; unmounted on drop.
struct Ext4 {
    at: PathBuf,
}

impl Ext4 {
    /// Makes and mounts one at `t`'s `ext4/`, or says why not (`None`).
    fn mount(t: &Test) -> Option<Ext4> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: loop-mounting an ext4 image needs root");
            return None;
        }
        let image = t.join("ext4.img");
        fs::File::create(&image)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-N", "32768"])
            .arg(&image)
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfs.ext4 is missing or failed");
            return None;
        }
        let at = t.mkdir("ext4");
        let mounted = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&at)
            .status();
        if !mounted.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot loop-mount an ext4 image here");
            return None;
        }
        Some(Ext4 { at })
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

#[test]
fn a_reader_never_sees_a_mix_on_ext4() {
    let t = Test::new();
    let Some(ext4) = Ext4::mount(&t) else { return };
    assert_eq!(fs_type(&ext4.at), EXT4_MAGIC);
    reader_never_sees_a_mix(&t, "ext4");
}
