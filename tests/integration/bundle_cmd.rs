//! `distributor bundle seal` and `bundle verify`: the producer helpers.

use crate::util::{Listed, Test, listed, manifest_digest, mkfifo, sha256_file, write_manifest};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn seal_writes_a_manifest_whose_digest_follows_the_contract() {
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/report.md", "# r\n");
    t.write("b/.hidden", "dot-files are files too");
    t.write("b/z/deep/data.bin", [0u8, 1, 2, 255].as_slice());
    t.write("b/B.txt", "upper case sorts first");
    t.write("b/.distributor-result.json", "{}");
    t.write("b/sub/.distributor.lock", "");
    t.seal(
        &dir,
        "reports.2026-06-04",
        Some("2026-06-04T13:55:00+02:00"),
    )
    .expect_code(0);

    let m = manifest(&dir);
    assert_eq!(m["schema_version"], 1);
    assert_eq!(m["id"], "reports.2026-06-04");
    assert_eq!(
        m["created"], "2026-06-04T11:55:00Z",
        "created is written in UTC"
    );
    let files: Vec<Listed> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["sha256"].as_str().unwrap().to_owned(),
                f["size"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut paths: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    paths.sort();
    assert_eq!(paths, [".hidden", "B.txt", "report.md", "z/deep/data.bin"]);
    for (path, sha, size) in &files {
        assert_eq!(*sha, sha256_file(&dir.join(path)), "hash of {path}");
        assert_eq!(
            *size,
            fs::metadata(dir.join(path)).unwrap().len(),
            "size of {path}"
        );
    }
    assert_eq!(m["digest"].as_str().unwrap(), manifest_digest(&files));

    t.cmd()
        .args(["bundle", "verify"])
        .arg(&dir)
        .output()
        .expect_code(0);
}

#[test]
fn seal_defaults_created_to_now() {
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/a.txt", "a");
    t.seal(&dir, "x", None).expect_code(0);
    let created = manifest(&dir)["created"].as_str().unwrap().to_owned();
    assert!(created.ends_with('Z'), "{created}");
    let year: i32 = created[..4].parse().unwrap();
    assert!(year >= 2025, "{created}");
}

#[test]
fn seal_refuses_symlinks_and_fifos() {
    let t = Test::new();
    let outside = t.write("outside.txt", "secret");
    let with_link = t.mkdir("link");
    t.write("link/a.txt", "a");
    symlink(&outside, with_link.join("b.txt")).unwrap();
    let with_fifo = t.mkdir("fifo");
    t.write("fifo/a.txt", "a");
    mkfifo(&with_fifo.join("pipe"));
    for (dir, name) in [(&with_link, "b.txt"), (&with_fifo, "pipe")] {
        let out = t.seal(dir, "x", None);
        assert_ne!(out.code, 0, "{}", out.all());
        assert!(
            out.all().contains(name),
            "the message names {name}: {}",
            out.all()
        );
        assert!(
            !dir.join("manifest.json").exists(),
            "no manifest is written"
        );
    }
}

#[test]
fn seal_with_a_bad_id_is_a_usage_error() {
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/a.txt", "a");
    let long = "a".repeat(129);
    for id in [
        "",
        "-starts-with-dash",
        "has space",
        "slash/id",
        "tilde~",
        long.as_str(),
    ] {
        t.seal(&dir, id, None).expect_code(2);
        assert!(!dir.join("manifest.json").exists(), "{id:?}");
    }
    t.seal(&dir, &"a".repeat(128), None).expect_code(0);
}

#[test]
fn verify_accepts_a_good_bundle_and_warns_about_unlisted_files() {
    let t = Test::new();
    let b = t.bundle("good", &[("a.txt", "a"), ("sub/b.txt", "b")]);
    let out = t.cmd().args(["bundle", "verify"]).arg(&b).output();
    out.expect_code(0);
    t.write("bundles/good/extra.txt", "not listed");
    let out = t
        .cmd()
        .args(["bundle", "verify", "--json"])
        .arg(&b)
        .output();
    out.expect_code(0);
    assert_eq!(out.json()["ok"], true);
    assert!(
        out.all().contains("extra.txt"),
        "unlisted files are warned about: {}",
        out.all()
    );
}

/// Each way a bundle can be broken, with the name the report must give.
fn broken_bundles(t: &Test) -> Vec<(&'static str, std::path::PathBuf, String)> {
    let mut cases = Vec::new();
    let files = [("a.txt", "alpha"), ("sub/b.txt", "bravo")];

    let b = t.bundle("missing", &files);
    fs::remove_file(b.join("a.txt")).unwrap();
    cases.push(("missing file", b, "a.txt".to_owned()));

    let b = t.bundle("size", &files);
    fs::write(b.join("sub/b.txt"), "bravo!").unwrap();
    cases.push(("size", b, "sub/b.txt".to_owned()));

    let b = t.bundle("hash", &files);
    fs::write(b.join("a.txt"), "ALPHA").unwrap();
    cases.push(("hash", b, "a.txt".to_owned()));

    let b = t.bundle("digest", &files);
    let mut m = manifest(&b);
    m["digest"] = format!("sha256:{}", "0".repeat(64)).into();
    fs::write(b.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    cases.push(("digest", b, "digest".to_owned()));

    let b = t.mkdir("bundles/dotdot/inner");
    t.write("bundles/dotdot/outside.txt", "x");
    t.write("bundles/dotdot/inner/a.txt", "a");
    write_manifest(
        &b,
        "dotdot",
        &[listed("a.txt", b"a"), listed("../outside.txt", b"x")],
    );
    cases.push(("dot-dot path", b, "../outside.txt".to_owned()));

    let b = t.mkdir("bundles/absolute");
    let target = t.write("abs-target.txt", "x");
    t.write("bundles/absolute/a.txt", "a");
    let abs = target.to_str().unwrap().to_owned();
    write_manifest(&b, "absolute", &[listed("a.txt", b"a"), listed(&abs, b"x")]);
    cases.push(("absolute path", b, abs));

    let b = t.bundle("symlink", &files);
    let same = t.write("same-bytes.txt", "alpha");
    fs::remove_file(b.join("a.txt")).unwrap();
    symlink(&same, b.join("a.txt")).unwrap();
    cases.push(("symlink", b, "a.txt".to_owned()));

    let b = t.bundle("fifo", &files);
    fs::remove_file(b.join("a.txt")).unwrap();
    mkfifo(&b.join("a.txt"));
    cases.push(("fifo", b, "a.txt".to_owned()));

    let b = t.bundle("malformed", &files);
    fs::write(
        b.join("manifest.json"),
        "{\"schema_version\": 1,\n  \"id\": \"x\",\n  oops\n}",
    )
    .unwrap();
    cases.push(("malformed JSON", b, "manifest.json".to_owned()));

    let b = t.mkdir("bundles/reserved");
    t.write("bundles/reserved/a.txt", "a");
    t.write("bundles/reserved/.distributor.json", "{}");
    write_manifest(
        &b,
        "reserved",
        &[listed("a.txt", b"a"), listed(".distributor.json", b"{}")],
    );
    cases.push(("reserved name", b, ".distributor.json".to_owned()));

    cases
}

#[test]
fn verify_reports_each_problem_by_name_and_exits_1() {
    let t = Test::new();
    for (what, dir, name) in broken_bundles(&t) {
        let out = t.cmd().args(["bundle", "verify"]).arg(&dir).output();
        assert_eq!(out.code, 1, "{what}: {}", out.all());
        assert!(
            out.all().contains(&name),
            "{what}: output names {name}: {}",
            out.all()
        );
        let out = t
            .cmd()
            .args(["bundle", "verify", "--json"])
            .arg(&dir)
            .output();
        assert_eq!(out.code, 1, "{what}");
        assert_eq!(out.json()["ok"], false, "{what}");
    }
    assert_eq!(
        fs::read_to_string(t.join("same-bytes.txt")).unwrap(),
        "alpha"
    );
}

/// Used by `hostile`: the same broken bundles, published.
pub fn hostile_bundles(t: &Test) -> Vec<(&'static str, std::path::PathBuf, String)> {
    let mut cases = broken_bundles(t);
    // A listed file reached through a symlinked folder.
    let b = t.bundle("linked-folder", &[("a.txt", "a"), ("sub/b.txt", "bravo")]);
    let real = t.mkdir("elsewhere");
    t.write("elsewhere/b.txt", "bravo");
    fs::remove_dir_all(b.join("sub")).unwrap();
    symlink(&real, b.join("sub")).unwrap();
    cases.push(("symlinked folder", b, "sub".to_owned()));
    cases
}

#[test]
fn seal_lists_one_problem_per_line_with_a_count() {
    let t = Test::new();
    let outside = t.write("outside.txt", "secret");
    let dir = t.mkdir("b");
    t.write("b/a.txt", "a");
    for i in 0..78 {
        symlink(&outside, dir.join(format!("link-{i:02}.txt"))).unwrap();
    }
    let out = t.seal(&dir, "x", None);
    out.expect_code(1);
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert!(
        lines[0].starts_with("error: cannot seal ")
            && lines[0].ends_with(": 78 problems, nothing was written:"),
        "{}",
        out.stderr
    );
    for i in 0..78 {
        assert_eq!(
            lines[1 + i],
            format!("  link-{i:02}.txt: is a symbolic link")
        );
    }
    assert!(
        lines[79].starts_with("only regular files can be sealed"),
        "{}",
        out.stderr
    );
    assert_eq!(lines.len(), 80, "{}", out.stderr);
    assert!(lines.iter().all(|l| l.len() < 200), "{}", out.stderr);
    assert!(!dir.join("manifest.json").exists());
}

#[test]
fn seal_says_which_reserved_files_it_left_out() {
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/a.txt", "a");
    t.write(
        "b/.distributor-notes.txt",
        "the producer meant to ship this",
    );
    t.write("b/sub/.distributor.lock", "");
    t.write("b/sub/kept.txt", "k");
    let out = t.seal(&dir, "x", None);
    out.expect_code(0);
    assert!(out.stdout.contains("(2 files, sha256:"), "{}", out.stdout);
    assert!(
        out.stderr.contains("warning: left out 2 reserved entries"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("\n  .distributor-notes.txt\n"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("\n  sub/.distributor.lock\n"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("reserved for distributor"),
        "{}",
        out.stderr
    );

    let one = t.mkdir("one");
    t.write("one/a.txt", "a");
    let out = t.seal(&one, "y", None);
    out.expect_code(0);
    assert!(out.stdout.contains("(1 file, sha256:"), "{}", out.stdout);
    assert_eq!(out.stderr, "", "nothing skipped, nothing said");
    let out = t.cmd().args(["bundle", "verify"]).arg(&one).output();
    out.expect_code(0);
    assert!(
        out.stdout.contains("is bundle y (1 file, sha256:"),
        "{}",
        out.stdout
    );
}

#[test]
fn seal_shows_bad_names_escaped_with_the_rename_hint() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/a.txt", "a");
    fs::write(dir.join(OsStr::from_bytes(b"bad\xff\xfe.txt")), "x").unwrap();
    fs::write(dir.join("new\nline.txt"), "x").unwrap();
    fs::write(dir.join("back\\slash.txt"), "x").unwrap();
    let out = t.seal(&dir, "x", None);
    out.expect_code(1);
    let err = &out.stderr;
    assert!(
        err.contains("  bad\\xff\\xfe.txt: name is not valid UTF-8"),
        "{err}"
    );
    assert!(
        err.contains("  new\\nline.txt: name cannot be used"),
        "{err}"
    );
    assert!(
        err.contains("  back\\slash.txt: name cannot be used"),
        "{err}"
    );
    assert!(!err.contains('\u{fffd}'), "no lossy replacement: {err}");
    assert!(
        err.contains("rename the entries whose names cannot be used"),
        "{err}"
    );
    assert!(
        !err.contains("only regular files can be sealed"),
        "these are regular files: {err}"
    );
    assert_eq!(err.lines().count(), 5, "{err}");
}

#[test]
fn seal_warns_about_deceptive_names_but_seals() {
    let t = Test::new();
    let dir = t.mkdir("b");
    t.write("b/caf\u{e9}.txt", "composed");
    t.write("b/cafe\u{301}.txt", "decomposed");
    t.write("b/invoice\u{202e}fdp.exe", "bidi");
    t.write("b/pay\u{200b}pal.txt", "zero width");
    t.write("b/plain.txt", "plain");
    let out = t.seal(&dir, "x", None);
    out.expect_code(0);
    assert_eq!(manifest(&dir)["files"].as_array().unwrap().len(), 5);
    let err = &out.stderr;
    assert!(
        err.contains(
            "caf\\u{e9}.txt and cafe\\u{301}.txt are the same name after Unicode NFC normalisation"
        ) || err.contains(
            "cafe\\u{301}.txt and caf\\u{e9}.txt are the same name after Unicode NFC normalisation"
        ),
        "{err}"
    );
    assert!(err.contains("U+202E"), "{err}");
    assert!(err.contains("bidirectional"), "{err}");
    assert!(
        err.contains("pay\\u{200b}pal.txt") || err.contains("U+200B"),
        "{err}"
    );
    assert!(
        !err.contains('\u{202e}'),
        "the override itself is not printed: {err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("warning: ")).count(),
        3,
        "{err}"
    );
}
