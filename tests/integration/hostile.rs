//! Hostile local roots: destination roots holding symbolic links that
//! point outside. Nothing may be written, deleted or followed outside the
//! root. (Hostile bundles and tampered bytes, the same on every backend,
//! are in `matrix`.)

use crate::util::{Test, assert_catalog_matches_disk, strings};
use std::fs;
use std::os::unix::fs::symlink;

fn single(workflow: &str) -> Test {
    let t = Test::new();
    t.config(&format!(
        "pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
        workflow: {workflow}
"
    ));
    t
}

#[test]
fn symlinked_folder_at_a_planned_parent_is_refused() {
    let t = single("additive");
    let outside = t.mkdir("outside");
    let keep = t.bundle("rep.1", &[("keep.txt", "k")]);
    t.publish("reports", &keep, &[]).expect_code(0);
    symlink(&outside, t.join("site/sub")).unwrap();
    let b = t.bundle("rep.2", &[("sub/a.txt", "through the link?")]);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(3);
    assert_eq!(out.dest()["action"], "fail_unmanaged");
    assert_eq!(strings(&out.dest()["unmanaged"]), ["sub"]);
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside the root"
    );
    assert!(
        fs::symlink_metadata(t.join("site/sub"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Deeper: a real folder holding the link.
    fs::remove_file(t.join("site/sub")).unwrap();
    t.mkdir("site/sub");
    symlink(&outside, t.join("site/sub/deeper")).unwrap();
    let b = t.bundle("rep.3", &[("sub/deeper/a.txt", "x")]);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(3);
    assert_eq!(strings(&out.dest()["unmanaged"]), ["sub/deeper"]);
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "nothing written outside the root"
    );
}

#[test]
fn recorded_path_turned_symlink_is_overwritten_not_followed() {
    let t = single("additive");
    let target = t.write("outside/target.txt", "outside, keep me");
    let b1 = t.bundle("rep.1", &[("a.txt", "v1")]);
    let b2 = t.bundle("rep.2", &[("a.txt", "v2")]);
    t.publish("reports", &b1, &[]).expect_code(0);
    fs::remove_file(t.join("site/a.txt")).unwrap();
    symlink(&target, t.join("site/a.txt")).unwrap();
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(0);
    let meta = fs::symlink_metadata(t.join("site/a.txt")).unwrap();
    assert!(
        meta.file_type().is_file(),
        "the link is replaced by a regular file"
    );
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "v2");
    assert_eq!(fs::read_to_string(&target).unwrap(), "outside, keep me");
    assert_catalog_matches_disk(&t.join("site"));

    // Even rerunning the very same bundle: a link is not "the same file".
    fs::remove_file(t.join("site/a.txt")).unwrap();
    fs::write(&target, "v2").unwrap();
    symlink(&target, t.join("site/a.txt")).unwrap();
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(0);
    assert_ne!(out.dest()["action"], "skip_same");
    assert!(
        fs::symlink_metadata(t.join("site/a.txt"))
            .unwrap()
            .file_type()
            .is_file()
    );
    assert_eq!(fs::read_to_string(&target).unwrap(), "v2");
}

#[test]
fn replacement_removes_a_recorded_symlink_not_its_target() {
    let t = single("replacement");
    let target = t.write("outside/target.txt", "outside, keep me");
    let b1 = t.bundle("rep.1", &[("a.txt", "a"), ("gone/b.txt", "b")]);
    let b2 = t.bundle("rep.2", &[("a.txt", "a")]);
    t.publish("reports", &b1, &[]).expect_code(0);
    fs::remove_file(t.join("site/gone/b.txt")).unwrap();
    symlink(&target, t.join("site/gone/b.txt")).unwrap();
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(0);
    assert_eq!(strings(&out.dest()["deletes"]), ["gone/b.txt"]);
    assert!(
        fs::symlink_metadata(t.join("site/gone/b.txt")).is_err(),
        "the link is removed"
    );
    assert!(!t.join("site/gone").exists(), "its emptied folder too");
    assert_eq!(fs::read_to_string(&target).unwrap(), "outside, keep me");
    assert!(t.join("outside").is_dir());
    assert_eq!(t.recorded("site").keys().collect::<Vec<_>>(), ["a.txt"]);
}

#[test]
fn clearing_a_root_removes_symlinks_without_following_them() {
    let legacy = r#"{"schema_version": 2, "outputs": []}"#;
    for mode in ["legacy", "force"] {
        let t = single("replacement");
        t.write("outside/keep.txt", "keep");
        t.write("outside/dir/inner.txt", "inner");
        t.mkdir("site");
        if mode == "legacy" {
            t.write("site/.distributor.json", legacy);
        }
        symlink(t.join("outside"), t.join("site/sub")).unwrap();
        symlink(t.join("outside/keep.txt"), t.join("site/file-link")).unwrap();
        let before = t.tree("outside");
        let b = t.bundle("rep.1", &[("sub/a.txt", "a")]);
        let extra: &[&str] = if mode == "force" {
            &["--force", "--destination", "site"]
        } else {
            &[]
        };
        let out = t.publish("reports", &b, extra);
        out.expect_code(0);
        assert_eq!(t.tree("outside"), before, "{mode}: nothing outside changes");
        assert!(
            fs::symlink_metadata(t.join("site/sub")).unwrap().is_dir(),
            "{mode}"
        );
        assert!(
            fs::symlink_metadata(t.join("site/file-link")).is_err(),
            "{mode}"
        );
        assert_eq!(fs::read_to_string(t.join("site/sub/a.txt")).unwrap(), "a");
        assert_catalog_matches_disk(&t.join("site"));
    }
}

#[test]
fn symlinked_catalog_is_a_conflict_and_its_target_is_untouched() {
    let t = single("additive");
    let b1 = t.bundle("rep.1", &[("a.txt", "a")]);
    t.publish("reports", &b1, &[]).expect_code(0);
    let real = fs::read(t.join("site/.distributor.json")).unwrap();
    let target = t.write("outside/catalog.json", &real);
    fs::remove_file(t.join("site/.distributor.json")).unwrap();
    symlink(&target, t.join("site/.distributor.json")).unwrap();
    let b2 = t.bundle("rep.2", &[("b.txt", "b")]);
    let out = t.publish("reports", &b2, &[]);
    out.expect_code(3);
    assert_eq!(out.dest()["action"], "fail_conflict");
    assert_eq!(fs::read(&target).unwrap(), real);
    assert!(!t.join("site/b.txt").exists());
}

#[test]
fn a_root_that_is_a_symlink_chosen_by_the_operator_is_used() {
    let t = single("additive");
    let real = t.mkdir("real-root");
    symlink(&real, t.join("site")).unwrap();
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    t.publish("reports", &b, &[]).expect_code(0);
    assert_eq!(fs::read_to_string(real.join("a.txt")).unwrap(), "a");
    assert!(real.join(".distributor.json").is_file());
}
