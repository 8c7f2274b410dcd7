//! Unit tests of maintenance: the pure prune selection and reconciliation
//! table, and every operation against real folders.

use super::list::CatalogReport;
use super::reconcile::{find_missing, find_unmanaged};
use super::selection::select_prunable;
use super::*;
use crate::backend::local::journal::JOURNAL_FILE;
use crate::catalog::{Catalog, OutputRecord, STATE_FILE, State};
use crate::catalog::{OutputKind, SourceIdentity, parse_time};
use crate::config::PrunePolicy;
use crate::config::Workflow;
use crate::fs::lock;
use crate::paths::RelPath;
use crate::plan::Entry;
use std::collections::BTreeMap;
use std::path::Path;
use time::OffsetDateTime;

const DAY: u64 = 86_400;

fn t(text: &str) -> OffsetDateTime {
    parse_time(text).unwrap()
}

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// A record of owner `p/d` for source `id` created at `created`,
/// last updated at `updated`.
fn record(path: &str, owner: (&str, &str), id: &str, created: &str, updated: &str) -> OutputRecord {
    OutputRecord {
        path: RelPath::parse(path).unwrap(),
        pipeline_id: owner.0.into(),
        destination_id: owner.1.into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: id.to_owned(),
            digest: digest('a'),
            created: t(created),
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: crate::catalog::Sha256::parse(&digest('b')).unwrap(),
        size: 0,
        created_at: t(updated),
        updated_at: t(updated),
    }
}

fn policy(days: u64, keep_latest: u32) -> PrunePolicy {
    PrunePolicy {
        max_age: Duration::from_secs(days * DAY),
        keep_latest,
    }
}

const NOW: &str = "2026-06-30T00:00:00Z";
const ME: (&str, &str) = ("reports", "site");

#[test]
fn select_prunable_table() {
    // Three sources of ours (s1 oldest .. s3 newest), one of another
    // owner; every output last updated well before the cutoff unless
    // stated otherwise.
    let records = vec![
        record(
            "s1/a",
            ME,
            "s1",
            "2026-05-01T00:00:00Z",
            "2026-05-01T00:00:00Z",
        ),
        record(
            "s1/b",
            ME,
            "s1",
            "2026-05-01T00:00:00Z",
            "2026-05-01T00:00:00Z",
        ),
        record(
            "s2/a",
            ME,
            "s2",
            "2026-05-02T00:00:00Z",
            "2026-05-02T00:00:00Z",
        ),
        record(
            "s3/a",
            ME,
            "s3",
            "2026-05-03T00:00:00Z",
            "2026-05-03T00:00:00Z",
        ),
        record(
            "other/a",
            ("reports", "mirror"),
            "s0",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z",
        ),
        record(
            "else/a",
            ("blog", "site"),
            "s0",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00Z",
        ),
    ];
    let cases: &[(&str, PrunePolicy, &[&str])] = &[
        (
            "keep 0 prunes every old output",
            policy(10, 0),
            &["s1/a", "s1/b", "s2/a", "s3/a"],
        ),
        (
            "keep 1 protects the newest source",
            policy(10, 1),
            &["s1/a", "s1/b", "s2/a"],
        ),
        (
            "keep 2 protects the two newest",
            policy(10, 2),
            &["s1/a", "s1/b"],
        ),
        ("keep more than there are", policy(10, 9), &[]),
        ("max_age larger than every age", policy(365, 0), &[]),
        // Cutoff 2026-05-02T00:00Z: s2/a is exactly max_age old, not older.
        ("boundary is not older", policy(59, 0), &["s1/a", "s1/b"]),
        (
            "huge max_age prunes nothing",
            PrunePolicy {
                max_age: Duration::MAX,
                keep_latest: 0,
            },
            &[],
        ),
    ];
    for (name, policy, want) in cases {
        let got = select_prunable(&records, ME.0, ME.1, policy, t(NOW));
        assert_eq!(got, *want, "{name}");
    }
}

#[test]
fn select_prunable_uses_updated_at_not_source_age() {
    // An old source re-published recently is not pruned.
    let records = vec![
        record(
            "old",
            ME,
            "s1",
            "2026-01-01T00:00:00Z",
            "2026-06-29T00:00:00Z",
        ),
        record(
            "new",
            ME,
            "s2",
            "2026-02-01T00:00:00Z",
            "2026-06-29T00:00:00Z",
        ),
    ];
    assert!(select_prunable(&records, ME.0, ME.1, &policy(7, 0), t(NOW)).is_empty());
}

#[test]
fn keep_latest_compares_instants_and_distinct_identities() {
    let mut records = vec![
        // s1 written with an offset is the newer instant (09:00Z vs 08:00Z).
        record(
            "a",
            ME,
            "s1",
            "2026-05-01T11:00:00+02:00",
            "2026-05-01T00:00:00Z",
        ),
        record(
            "b",
            ME,
            "s2",
            "2026-05-01T08:00:00Z",
            "2026-05-01T00:00:00Z",
        ),
        // Same id as s2, different digest: a distinct, older identity.
        record(
            "c",
            ME,
            "s2",
            "2026-04-01T00:00:00Z",
            "2026-05-01T00:00:00Z",
        ),
    ];
    std::sync::Arc::make_mut(&mut records[2].source).digest = digest('c');
    assert_eq!(
        select_prunable(&records, ME.0, ME.1, &policy(1, 1), t(NOW)),
        ["b", "c"]
    );
    assert_eq!(
        select_prunable(&records, ME.0, ME.1, &policy(1, 2), t(NOW)),
        ["c"]
    );
}

#[test]
fn keep_latest_keeps_every_source_tied_with_the_last_kept() {
    let records = vec![
        record("x", ME, "x", "2026-05-02T00:00:00Z", "2026-05-01T00:00:00Z"),
        record("y", ME, "y", "2026-05-02T00:00:00Z", "2026-05-01T00:00:00Z"),
        record("z", ME, "z", "2026-05-01T00:00:00Z", "2026-05-01T00:00:00Z"),
    ];
    let sel = |keep| select_prunable(&records, ME.0, ME.1, &policy(1, keep), t(NOW));
    assert_eq!(sel(1), ["z"]);
    assert_eq!(sel(2), ["z"]);
    assert_eq!(sel(3), Vec::<String>::new());
    assert_eq!(sel(0), ["x", "y", "z"]);
}

#[test]
fn other_owners_are_never_selected() {
    let records = vec![
        record(
            "a",
            ("reports", "mirror"),
            "s",
            "2020-01-01T00:00:00Z",
            "2020-01-01T00:00:00Z",
        ),
        record(
            "b",
            ("blog", "site"),
            "s",
            "2020-01-01T00:00:00Z",
            "2020-01-01T00:00:00Z",
        ),
    ];
    assert!(select_prunable(&records, ME.0, ME.1, &policy(0, 0), t(NOW)).is_empty());
}

fn listing_of(entries: &[(&str, Entry)]) -> BTreeMap<String, Entry> {
    entries.iter().map(|(p, e)| ((*p).to_owned(), *e)).collect()
}

#[test]
fn missing_and_unmanaged_from_a_listing() {
    let f = Entry::File { size: 1 };
    let records = vec![
        record("a/kept", ME, "s", NOW, NOW),
        record("a/gone", ME, "s", NOW, NOW),
        record("link", ME, "s", NOW, NOW),
        record("dir", ME, "s", NOW, NOW),
        record("theirs", ("blog", "site"), "s", NOW, NOW),
    ];
    let listing = listing_of(&[
        ("a", Entry::Dir),
        ("a/kept", f),
        ("a-b", Entry::Dir),
        ("a-b/stray", f),
        ("dir", Entry::Dir),
        ("empty", Entry::Dir),
        ("empty/deeper", Entry::Dir),
        ("fifo", Entry::Other),
        ("link", Entry::Symlink),
        ("stray", f),
    ]);
    let mine: Vec<_> = records.iter().filter(|r| r.owned_by(ME.0, ME.1)).collect();
    assert_eq!(
        find_missing(mine.into_iter(), &listing),
        ["a/gone", "dir", "link"]
    );
    assert_eq!(
        find_missing(records.iter(), &listing),
        ["a/gone", "dir", "link", "theirs"]
    );
    assert_eq!(
        find_unmanaged(&records, &listing),
        ["a-b/stray", "dir", "empty/deeper", "fifo", "link", "stray"]
    );
}

// -- operations on a real folder ---------------------------------------

fn destination(root: &Path, prune: Option<PrunePolicy>) -> Destination {
    Destination {
        backend: crate::config::Backend::Local,
        id: ME.1.to_owned(),
        root: root.to_owned(),
        releases: None,
        workflow: Workflow::Additive,
        prefix: String::new(),
        scope: None,
        publish_source: true,
        publish_html: false,
        raw_html: crate::config::RawHtml::Escape,
        html_template: None,
        base_url: None,
        prune,
        hooks: None,
        precompress: Vec::new(),
        headers: Default::default(),
    }
}

/// Writes `files` into `root` and a catalog recording them for `ME`,
/// sources created and updated on 2026-05-0N for the Nth file.
fn seed(root: &Path, files: &[&str]) {
    let mut catalog = Catalog::new(t("2026-05-01T00:00:00Z"));
    for (i, path) in files.iter().enumerate() {
        let bytes = path.as_bytes();
        let full = root.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, bytes).unwrap();
        let when = format!("2026-05-{:02}T00:00:00Z", i + 1);
        let mut r = record(path, ME, &format!("s{i}"), &when, &when);
        let h = crate::fs::hashing::hash_bytes(bytes);
        r.sha256 = crate::catalog::Sha256::parse(&h.sha256).unwrap();
        r.size = h.size;
        catalog.outputs.push(r);
    }
    catalog.sort();
    std::fs::write(root.join(STATE_FILE), catalog.to_json()).unwrap();
}

/// A target with caches of its own (a few bytes left behind per test), so
/// that no test sees what another remembered.
fn target(d: &Destination) -> OwnedRoot<'_> {
    OwnedRoot {
        pipeline_id: ME.0,
        destination: d,
        lock_timeout: Duration::from_secs(5),
        process: Box::leak(Box::default()),
    }
}

fn recorded(root: &Path) -> Vec<String> {
    let bytes = std::fs::read(root.join(STATE_FILE)).unwrap();
    let State::Catalog(c) = State::parse(&bytes) else {
        panic!("catalog expected")
    };
    c.outputs
        .iter()
        .map(|r| r.path.as_str().to_owned())
        .collect()
}

#[test]
fn prune_removes_a_symlink_not_its_target_and_leaves_a_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"x").unwrap();
    let root = tmp.path();
    seed(root, &["a/link", "b/dir", "c/file", "d/newest"]);
    std::fs::remove_file(root.join("a/link")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("precious"), root.join("a/link")).unwrap();
    std::fs::remove_file(root.join("b/dir")).unwrap();
    std::fs::create_dir(root.join("b/dir")).unwrap();
    let d = destination(root, Some(policy(1, 1)));
    let report = prune(&target(&d), true, t(NOW)).unwrap();
    assert_eq!(report.deletes, ["a/link", "c/file"]);
    assert!(outside.path().join("precious").exists());
    assert!(!root.join("a").exists(), "emptied folder removed");
    assert!(!root.join("c").exists());
    assert!(root.join("b/dir").is_dir());
    assert_eq!(recorded(root), ["b/dir", "d/newest"]);
    assert!(!root.join(JOURNAL_FILE).exists());
}

#[test]
fn prune_dry_run_and_read_commands_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    seed(root, &["a", "b"]);
    let before = std::fs::read(root.join(STATE_FILE)).unwrap();
    let d = destination(root, Some(policy(1, 0)));
    let report = prune(&target(&d), false, t(NOW)).unwrap();
    assert_eq!(report.deletes, ["a", "b"]);
    assert!(verify(&target(&d), false).unwrap().ok);
    assert_eq!(catalog(&target(&d)).unwrap().outputs.len(), 2);
    reconcile(&target(&d), false, true).unwrap();
    assert_eq!(std::fs::read(root.join(STATE_FILE)).unwrap(), before);
    assert!(!root.join(lock::LOCK_FILE).exists());
    assert!(root.join("a").exists() && root.join("b").exists());
}

#[test]
fn missing_root_or_catalog_reports_nothing_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let gone = tmp.path().join("gone");
    let d = destination(&gone, Some(policy(0, 0)));
    assert!(prune(&target(&d), true, t(NOW)).unwrap().deletes.is_empty());
    assert_eq!(
        reconcile(&target(&d), true, false).unwrap().unmanaged.len(),
        0
    );
    assert_eq!(verify(&target(&d), true).unwrap().checked, 0);
    assert!(catalog(&target(&d)).unwrap().outputs.is_empty());
    assert!(!gone.exists());

    std::fs::write(tmp.path().join("stray"), b"").unwrap();
    let d = destination(tmp.path(), Some(policy(0, 0)));
    assert!(prune(&target(&d), true, t(NOW)).unwrap().deletes.is_empty());
    let r = reconcile(&target(&d), false, false).unwrap();
    assert_eq!(r.unmanaged, ["stray"]);
    assert!(!tmp.path().join(lock::LOCK_FILE).exists());
    assert!(!tmp.path().join(STATE_FILE).exists());
}

#[test]
fn refused_states_have_exit_3_and_stay_untouched() {
    for (text, legacy) in [
        ("not json", false),
        (r#"{"schema_version": 9}"#, false),
        (r#"{"schema_version": 2, "outputs": []}"#, true),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join(STATE_FILE), text).unwrap();
        // A journal must not be "finished" over refused state.
        std::fs::write(
            tmp.path().join(JOURNAL_FILE),
            br#"{"writes":[],"deletes":[],"created_dirs":[],"state_was_absent":false}"#,
        )
        .unwrap();
        let d = destination(tmp.path(), Some(policy(0, 0)));
        let errors = [
            prune(&target(&d), true, t(NOW)).unwrap_err(),
            reconcile(&target(&d), false, false).unwrap_err(),
            verify(&target(&d), false).unwrap_err(),
            catalog(&target(&d)).unwrap_err(),
        ];
        for e in errors {
            assert_eq!(e.exit_code(), 3, "{e}");
            let message = e.to_string();
            assert!(
                message.contains(&tmp.path().display().to_string()),
                "{message}"
            );
            if legacy {
                assert!(message.contains("next publication"), "{message}");
            }
        }
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(STATE_FILE)).unwrap(),
            text
        );
        assert!(tmp.path().join(JOURNAL_FILE).exists());
    }
}

#[test]
fn prune_without_a_policy_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let d = destination(tmp.path(), None);
    let e = prune(&target(&d), false, t(NOW)).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("retention"), "{e}");
    assert!(e.to_string().contains("\"site\""), "{e}");
}

#[test]
fn verify_finds_missing_and_mismatched_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    seed(root, &["same-size", "short", "gone", "fine"]);
    std::fs::write(root.join("same-size"), b"SAME-SIZE").unwrap();
    std::fs::write(root.join("short"), b"sh").unwrap();
    std::fs::remove_file(root.join("gone")).unwrap();
    let d = destination(root, None);
    let r = verify(&target(&d), false).unwrap();
    assert!(!r.ok);
    assert_eq!(r.checked, 4);
    assert_eq!(r.missing, ["gone"]);
    assert_eq!(r.mismatched, ["same-size", "short"]);
}

#[test]
fn catalog_text_is_an_aligned_table() {
    let report = CatalogReport {
        root: "/srv/x".to_owned(),
        outputs: vec![
            record("a.html", ME, "s1", NOW, NOW),
            record("longer/path.md", ("blog", "site"), "s22", NOW, NOW),
        ],
    };
    let text = report.to_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let col = |line: &str, word: &str| line.find(word).unwrap();
    assert_eq!(col(lines[1], "OWNER"), col(lines[2], "reports/site"));
    assert_eq!(col(lines[2], "reports/site"), col(lines[3], "blog/site"));
    assert_eq!(
        col(lines[1], "UPDATED"),
        col(lines[3], "2026-06-30T00:00:00Z")
    );
}
