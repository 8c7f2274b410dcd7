//! Crash at every step of a publication (debug-build crash points, see
//! src/runtime/failpoint.rs) and prove the rerun converges: the catalog matches the
//! bytes, nothing the tool wrote is unrecorded, nothing unrelated changed,
//! and a bundle ends in exactly one spool folder.

use crate::util::{Test, assert_catalog_matches_disk, bundle_names, sha256_file, shape};
use std::fs;
use std::path::Path;

use distributor::runtime::failpoint::POINTS;

/// The crash points inside a publication (the rest are the spool's).
fn publish_points() -> impl Iterator<Item = &'static str> {
    POINTS.iter().copied().filter(|p| p.starts_with("publish."))
}

fn config(workflow: &str) -> String {
    format!(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: {workflow}
        publish: {{source: true, html: true}}
"
    )
}

/// Files of the first bundle; the second drops `old.txt` and `sub/gone.md`,
/// changes `report.md` and adds `new/deep/file.txt`.
fn first(t: &Test, name: &str) -> std::path::PathBuf {
    t.bundle_at(
        name,
        "first",
        "2026-06-01T00:00:00Z",
        &[
            ("report.md", "# One\n\nfirst version\n"),
            ("old.txt", "old\n"),
            ("sub/gone.md", "# Gone\n"),
            ("keep.txt", "same in both\n"),
        ],
    )
}

fn second(t: &Test, name: &str) -> std::path::PathBuf {
    t.bundle_at(
        name,
        "second",
        "2026-06-02T00:00:00Z",
        &[
            (
                "report.md",
                "# Two\n\nsecond version, longer than the first\n",
            ),
            ("keep.txt", "same in both\n"),
            ("new/deep/file.txt", "new\n"),
        ],
    )
}

fn assert_clean(root: &Path) {
    for entry in shape(root).paths() {
        let name = entry.rsplit('/').next().unwrap_or(&entry);
        assert!(
            !name.starts_with(".distributor-tmp-") && name != ".distributor-journal.json",
            "left behind: {entry}"
        );
    }
}

/// Publishes `bundle` to pipeline `p` with `args`, crashing at `failpoint`
/// (`point` or `point:nth`); true when the run did not exit 0 (it reached
/// the crash point).
fn crash_run(t: &Test, failpoint: &str, bundle: &Path, args: &[&str]) -> bool {
    t.cmd()
        .env("DISTRIBUTOR_FAILPOINT", failpoint)
        .args(["--config", "config.yaml", "run", "--pipeline", "p"])
        .args(args)
        .arg(bundle)
        .output()
        .code
        != 0
}

/// What the kernel has waiting to be written back, as the debug build is
/// told (`DISTRIBUTOR_TEST_UNWRITTEN`): nothing, so that a small
/// publication is made durable by barriers (`syncfs`), or a lot, so that it
/// fsyncs file by file. Each crash point is tried in both.
const SYNC_MODES: [(&str, &str); 2] = [("barrier", "0"), ("file by file", "18446744073709551615")];

/// Crashes the second publication at `point` (its `nth` hit), reruns it
/// and checks convergence; `unwritten` picks the way it is made durable
/// ([`SYNC_MODES`]).
fn crash_and_rerun(workflow: &str, point: &str, nth: u32, unwritten: &str) -> bool {
    let t = Test::new();
    t.config(&config(workflow));
    t.write("outside.txt", "not ours\n");
    let outside_before = sha256_file(&t.join("outside.txt"));
    let a = first(&t, "a");
    let b = second(&t, "b");
    t.publish("p", &a, &[]).expect_code(0);

    // The second bundle published, crashing at `failpoint` when given.
    let publish_b = |failpoint: Option<String>| {
        let mut cmd = t.cmd();
        if let Some(failpoint) = failpoint {
            cmd.env("DISTRIBUTOR_FAILPOINT", failpoint);
        }
        cmd.env("DISTRIBUTOR_TEST_UNWRITTEN", unwritten)
            .args([
                "--config",
                "config.yaml",
                "run",
                "--json",
                "--pipeline",
                "p",
            ])
            .arg(&b)
            .output()
    };
    let hit = publish_b(Some(format!("{point}:{nth}"))).code != 0;

    let rerun = publish_b(None);
    rerun.expect_code(0);
    let action = rerun.dest()["action"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_ne!(action, "fail_unmanaged", "{workflow} {point}:{nth}");
    let root = t.join("root");
    assert_catalog_matches_disk(&root);
    assert_clean(&root);
    assert_eq!(sha256_file(&t.join("outside.txt")), outside_before);

    let records = t.recorded("root");
    for path in ["report.md", "report.html", "keep.txt", "new/deep/file.txt"] {
        assert_eq!(
            records[path]["source"]["id"], "second",
            "{workflow} {point}:{nth}: {path}"
        );
    }
    let dropped_kept = records.contains_key("old.txt");
    assert_eq!(
        dropped_kept,
        workflow == "additive",
        "{workflow} {point}:{nth}: old.txt"
    );
    if workflow == "replacement" {
        assert!(!t.join("root/old.txt").exists());
        assert!(!t.join("root/sub").exists(), "emptied folder removed");
    }
    hit
}

/// Whether the second publication reaches `point` at least `nth` times:
/// it stages and renames four outputs, deletes three (replacement only),
/// clears nothing, and passes every other point once.
fn reached(workflow: &str, point: &str, nth: u32) -> bool {
    match point {
        "publish.after_clear" => false,
        "publish.after_stage" | "publish.after_rename" => nth <= 4,
        "publish.after_delete" => workflow == "replacement" && nth <= 3,
        _ => nth == 1,
    }
}

#[test]
fn every_publication_step_crash_converges_for_both_workflows() {
    let mut hits = 0;
    for (mode, unwritten) in SYNC_MODES {
        for workflow in ["additive", "replacement"] {
            for point in publish_points() {
                for nth in [1, 2, 5] {
                    let hit = crash_and_rerun(workflow, point, nth, unwritten);
                    assert_eq!(
                        hit,
                        reached(workflow, point, nth),
                        "{mode}: {workflow} {point}:{nth}"
                    );
                    hits += usize::from(hit);
                }
            }
        }
    }
    eprintln!("crash points: {hits} crashes mid-publication, each rerun converged");
}

/// A replacement killed once its catalog is durable, before it deleted
/// anything: the new version is in force, and the old outputs are still on
/// disk, recorded nowhere. The next run finishes the deletions from the
/// journal (a file changed since is not the old output: it stays) and
/// finds nothing left to do. A small change (staged at the top, each sync
/// mode) and a large one (staged beside its targets).
#[test]
fn a_crash_between_the_catalog_and_the_deletions_is_finished_by_the_next_run() {
    let cases = [
        ("small", 0, SYNC_MODES[0].1),
        ("small, file by file", 0, SYNC_MODES[1].1),
        ("large", 20, SYNC_MODES[0].1),
    ];
    for (what, extra, unwritten) in cases {
        let t = Test::new();
        t.config(&config("replacement"));
        let mut files: Vec<(String, String)> = [
            ("report.md", "# One\n"),
            ("old.txt", "old\n"),
            ("sub/gone.md", "# Gone\n"),
            ("keep.txt", "same\n"),
        ]
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
        files.extend((0..extra).map(|i| (format!("old/f{i:02}.txt"), format!("{i}\n"))));
        let a = t.bundle_at("a", "first", "2026-06-01T00:00:00Z", &files);
        let b = t.bundle_at(
            "b",
            "second",
            "2026-06-02T00:00:00Z",
            &[("report.md", "# Two\n"), ("keep.txt", "same\n")],
        );
        t.publish("p", &a, &[]).expect_code(0);
        let crashed = t
            .cmd()
            .env("DISTRIBUTOR_FAILPOINT", "publish.after_catalog")
            .env("DISTRIBUTOR_TEST_UNWRITTEN", unwritten)
            .args(["--config", "config.yaml", "run", "--pipeline", "p"])
            .arg(&b)
            .output();
        assert!(
            crashed.stderr.contains("reached: aborting"),
            "{what}: {}",
            crashed.stderr
        );

        // The new catalog is in force; nothing is deleted yet.
        let root = t.join("root");
        let records = t.recorded("root");
        let mut recorded: Vec<&str> = records.keys().map(String::as_str).collect();
        recorded.sort();
        assert_eq!(recorded, ["keep.txt", "report.html", "report.md"], "{what}");
        assert!(
            records.values().all(|r| r["source"]["id"] == "second"),
            "{what}"
        );
        let dropped = ["old.txt", "sub/gone.md", "sub/gone.html"];
        for path in dropped {
            assert!(
                root.join(path).exists(),
                "{what}: {path} deleted before the catalog"
            );
        }
        assert!(root.join(".distributor-journal.json").exists(), "{what}");
        // Changed by someone meanwhile: no longer the output it deletes.
        t.write("root/sub/gone.md", "# Mine now\n");

        let rerun = t.publish("p", &b, &[]);
        rerun.expect_code(0);
        assert_eq!(rerun.dest()["action"], "skip_same", "{what}");
        assert!(!root.join("old.txt").exists(), "{what}");
        assert!(!root.join("sub/gone.html").exists(), "{what}");
        assert!(!root.join("old").exists(), "{what}: emptied folder removed");
        assert_eq!(
            fs::read_to_string(root.join("sub/gone.md")).unwrap(),
            "# Mine now\n",
            "{what}: a file changed after the crash was deleted"
        );
        assert!(!t.recorded("root").contains_key("sub/gone.md"), "{what}");
        fs::remove_dir_all(root.join("sub")).unwrap();
        assert_catalog_matches_disk(&root);
        assert_clean(&root);
    }
}

#[test]
fn force_replace_crash_converges() {
    for point in [
        "publish.after_journal",
        "publish.after_clear",
        "publish.after_rename",
    ] {
        let t = Test::new();
        t.config(&config("additive"));
        t.write("root/stray/file.txt", "unmanaged\n");
        t.write("root/.distributor.json", "not json");
        let b = second(&t, "b");
        let crashed = crash_run(&t, point, &b, &["--destination", "d", "--force"]);
        assert!(crashed, "{point} was not reached");
        t.publish("p", &b, &["--destination", "d", "--force"])
            .expect_code(0);
        assert_catalog_matches_disk(&t.join("root"));
        assert_clean(&t.join("root"));
        assert!(!t.join("root/stray").exists());
        assert!(t.join("root/.distributor.lock").exists());
    }
}

/// A `--force` publication killed after it cleared a folder of recorded
/// outputs: whatever runs next settles the root, and the catalog it leaves
/// names no file below the cleared folder.
#[test]
fn force_replace_crash_after_clearing_a_folder_leaves_no_record_inside_it() {
    let t = Test::new();
    t.config(&config("additive"));
    let a = first(&t, "a");
    t.publish("p", &a, &[]).expect_code(0);
    assert!(t.recorded("root").contains_key("sub/gone.html"));
    let b = second(&t, "b");
    // `keep.txt`, `old.txt`, `report.html`, `report.md`, `sub`: crash once
    // all five are cleared.
    let crashed = crash_run(
        &t,
        "publish.after_clear:5",
        &b,
        &["--destination", "d", "--force"],
    );
    assert!(crashed, "the crash point was not reached");
    assert!(!t.join("root/sub").exists(), "sub/ was not cleared");
    let c = t.bundle_at(
        "c",
        "third",
        "2026-06-03T00:00:00Z",
        &[("other.txt", "x\n")],
    );
    t.publish("p", &c, &[]).expect_code(0);
    assert_catalog_matches_disk(&t.join("root"));
    assert_clean(&t.join("root"));
}

/// A root of an older version: legacy state (schema 1) and the files it
/// describes, two of them at paths the second bundle publishes.
const LEGACY: &str =
    r#"{"schema_version": 1, "outputs": [{"path": "report.md"}, {"path": "keep.txt"}]}"#;

/// A crash while a publication converts a legacy root: the rerun must not
/// find the files the crashed run had not reached yet unrecorded in a new
/// catalog (`fail_unmanaged`), which §7 forbids.
#[test]
fn legacy_conversion_crash_at_every_step_converges() {
    let mut hits = 0;
    for workflow in ["additive", "replacement"] {
        for point in publish_points() {
            for nth in [1, 2, 5] {
                let t = Test::new();
                t.config(&config(workflow));
                t.write("root/.distributor.json", LEGACY);
                t.write("root/report.md", "# Old\n");
                t.write("root/keep.txt", "old keep\n");
                t.write("root/new/deep/file.txt", "old new\n");
                t.write("root/left/behind.txt", "old page\n");
                let b = second(&t, "b");
                hits += usize::from(crash_run(&t, &format!("{point}:{nth}"), &b, &[]));
                let context = format!("{workflow} {point}:{nth}");
                let rerun = t.publish("p", &b, &[]);
                assert_eq!(rerun.code, 0, "{context}: {}", rerun.stdout);
                assert_eq!(
                    t.join("root/left/behind.txt").exists(),
                    workflow == "additive",
                    "{context}: legacy replacement clears the root, additive keeps the rest"
                );
                // Unmanaged from now on (§6), the one file allowed unrecorded.
                let _ = fs::remove_dir_all(t.join("root/left"));
                let root = t.join("root");
                assert_catalog_matches_disk(&root);
                assert_clean(&root);
                let records = t.recorded("root");
                let mut paths: Vec<&str> = records.keys().map(String::as_str).collect();
                paths.sort();
                assert_eq!(
                    paths,
                    ["keep.txt", "new/deep/file.txt", "report.html", "report.md"],
                    "{context}"
                );
                assert!(
                    records.values().all(|r| r["source"]["id"] == "second"),
                    "{context}"
                );
            }
        }
    }
    assert!(hits > 10, "only {hits} crash points were reached");
}

fn agent_config() -> &'static str {
    "spool: ./spool
agent: {settle: 0s}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: replacement
"
}

#[test]
fn agent_crash_at_every_step_files_each_bundle_exactly_once() {
    // Every crash point: the publication's and the spool's (an intake's
    // are in intake.rs).
    for &point in POINTS.iter().filter(|p| !p.starts_with("intake.")) {
        let t = Test::new();
        t.config(agent_config());
        t.mkdir("spool/p/inbox");
        let a = first(&t, "a");
        let b = second(&t, "b");
        fs::rename(&a, t.join("spool/p/inbox/a")).unwrap();
        fs::rename(&b, t.join("spool/p/inbox/b")).unwrap();

        t.cmd()
            .env("DISTRIBUTOR_FAILPOINT", format!("{point}:1"))
            .args(["--config", "config.yaml", "agent", "--once"])
            .output();
        let drained = t.run(&["agent", "--once"]);
        drained.expect_code(0);
        assert_eq!(bundle_names(&t.join("spool/p/done")), ["a", "b"], "{point}");
        for folder in ["inbox", "work", "failed"] {
            assert!(
                bundle_names(&t.join(&format!("spool/p/{folder}"))).is_empty(),
                "{point}: {folder} not empty"
            );
        }
        let root = t.join("root");
        assert_catalog_matches_disk(&root);
        assert_clean(&root);
        let records = t.recorded("root");
        assert!(
            records.values().all(|r| r["source"]["id"] == "second"),
            "{point}: the newest bundle owns every output"
        );
    }
}

/// A version of a 24-file tree (enough for one barrier instead of per-file
/// fsyncs): every other file differs between versions, the rest are the
/// same bytes (left in place by the second publication).
fn large(t: &Test, name: &str, version: u32) -> std::path::PathBuf {
    let files: Vec<(String, String)> = (0..24)
        .map(|i| {
            let body = if i % 2 == 0 {
                format!("file {i} version {version}\n")
            } else {
                format!("file {i} the same in every version\n")
            };
            (format!("d{}/f{i:02}.txt", i % 3), body)
        })
        .collect();
    let created = format!("2026-06-0{version}T00:00:00Z");
    t.bundle_at(name, &format!("v{version}"), &created, &files)
}

#[test]
fn large_publication_crash_at_every_step_converges() {
    let mut hits = 0;
    for workflow in ["additive", "replacement"] {
        for point in publish_points() {
            for nth in [1, 5, 12] {
                let t = Test::new();
                t.config(&config(workflow));
                let a = large(&t, "a", 1);
                let b = large(&t, "b", 2);
                t.publish("p", &a, &[]).expect_code(0);
                let crashed = crash_run(&t, &format!("{point}:{nth}"), &b, &[]);
                hits += usize::from(crashed);
                let rerun = t.publish("p", &b, &[]);
                rerun.expect_code(0);
                let context = format!("{workflow} {point}:{nth}");
                assert_ne!(rerun.dest()["action"], "fail_unmanaged", "{context}");
                let root = t.join("root");
                assert_catalog_matches_disk(&root);
                assert_clean(&root);
                let records = t.recorded("root");
                assert_eq!(records.len(), 24, "{context}");
                assert!(
                    records.values().all(|r| r["source"]["id"] == "v2"),
                    "{context}: the second version owns every output"
                );
                // Twelve files changed: staging and renames reach the 12th hit.
                let expected = match point {
                    "publish.after_clear" | "publish.after_delete" => false,
                    "publish.after_stage" | "publish.after_rename" => true,
                    _ => nth == 1,
                };
                assert_eq!(crashed, expected, "{context}");
            }
        }
    }
    eprintln!("large publication: {hits} crashes mid-publication, each rerun converged");
}
