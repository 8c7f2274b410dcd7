//! The driver's rules as tables over memory roots (`crate::backend::memory`):
//! rollback order, commit order, isolation of a refused bundle in a batch,
//! a root's failure (which stops a batch), a bundle that cannot be read for
//! a while (which ends a batch before the bundles after it), and rebase
//! after a lost race. Each row asserts what every root holds afterwards
//! (files and catalog) and the calls logged.

use super::Options;
use super::driver::{Driver, Ended};
use crate::backend::Capabilities;
use crate::backend::memory::{self, Failure, Log, Memory, Op, Stored};
use crate::config::{Config, Destination};
use crate::report::RunReport;
use crate::runtime::workers::InOrder;
use std::path::{Path, PathBuf};
use time::OffsetDateTime;

/// A local root's capabilities.
const LOCAL: Capabilities = Capabilities {
    missing: false,
    reads_bundle_at_commit: false,
    may_rebase: false,
    output_noun: "file",
};

/// A bucket's capabilities.
const BUCKET: Capabilities = Capabilities {
    missing: false,
    reads_bundle_at_commit: true,
    may_rebase: true,
    output_noun: "object",
};

/// A pipeline `p` publishing the source files of its bundles to memory
/// roots `a` and `b` (folders of a temporary directory that are never
/// created), and bundles sealed in it.
struct World {
    tmp: tempfile::TempDir,
    config: Config,
    log: Log,
    roots: Vec<Memory>,
}

impl World {
    /// Roots `a` and `b`, with these capabilities, in the additive
    /// workflow.
    fn new(a: Capabilities, b: Capabilities) -> World {
        World::with_workflow(a, b, "additive")
    }

    fn with_workflow(a: Capabilities, b: Capabilities, workflow: &str) -> World {
        let tmp = tempfile::tempdir().unwrap();
        let config = crate::config::parse(
            &format!(
                "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: a
        path: ./a
        workflow: {workflow}
      - id: b
        path: ./b
        workflow: {workflow}
"
            ),
            &tmp.path().join("config.yaml"),
        )
        .unwrap();
        let log = Log::default();
        let ds = &config.pipelines[0].destinations;
        let roots = vec![
            Memory::register(&ds[0], "a", a, &log),
            Memory::register(&ds[1], "b", b, &log),
        ];
        World {
            tmp,
            config,
            log,
            roots,
        }
    }

    /// A bundle of source `id`, created `at` seconds into the test, holding
    /// `files` (path, text).
    fn bundle(&self, name: &str, id: &str, at: i64, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        for (path, text) in files {
            std::fs::write(dir.join(path), text).unwrap();
        }
        let created = OffsetDateTime::from_unix_timestamp(1_700_000_000 + at).unwrap();
        crate::bundle::seal(&dir, id, Some(created)).unwrap();
        dir
    }

    /// Runs the driver over `bundles`, every root opened as its memory
    /// root.
    fn run(&self, bundles: &[&Path]) -> Ended {
        let pipeline = &self.config.pipelines[0];
        let destinations: Vec<&Destination> = pipeline.destinations.iter().collect();
        let options = Options {
            dry_run: false,
            force: false,
            lock_timeout: std::time::Duration::from_secs(1),
            serving: None,
            scratch: self.tmp.path().to_path_buf(),
            process: crate::runtime::process_state::ProcessState::default(),
        };
        let driver = Driver {
            pipeline,
            destinations: &destinations,
            options: &options,
            workers: &InOrder,
            cancel: &crate::runtime::interrupt::Cancel::new(),
            older: None,
            before_commit: None,
            tombstones: Default::default(),
        };
        driver.run(bundles)
    }

    /// The reports of a run that ended with one per bundle.
    fn reports(&self, bundles: &[&Path]) -> Vec<RunReport> {
        match self.run(bundles) {
            Ended::Reports(reports) => reports,
            Ended::OneFirst => panic!("the batch sent its first bundle alone"),
            Ended::Aborted(a) if bundles.len() == 1 => {
                vec![super::one_report(Ended::Aborted(a))]
            }
            Ended::Aborted(a) => panic!("the batch was aborted: {}", a.error),
        }
    }

    /// Publishes `b0` (`base.txt`) alone, so that every root has a
    /// catalog, then forgets the calls.
    fn seeded(self) -> (World, Vec<Stored>) {
        let b0 = self.bundle("b0", "s0", 0, &[("base.txt", "base\n")]);
        let reports = self.reports(&[&b0]);
        assert!(reports[0].ok, "{reports:?}");
        self.log.lock().unwrap().clear();
        let before = self.stored();
        (self, before)
    }

    fn stored(&self) -> Vec<Stored> {
        self.roots.iter().map(Memory::stored).collect()
    }

    fn calls(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

/// The paths of a root's files, and those its catalog records.
fn paths(stored: &Stored) -> (Vec<&str>, Vec<&str>) {
    let files = stored.files.keys().map(String::as_str).collect();
    let records = (stored.catalog.iter())
        .flat_map(|c| c.outputs.iter().map(|r| r.path.as_str()))
        .collect();
    (files, records)
}

/// Every call a publication of one bundle writing `b1.txt` makes, in
/// order, when nothing fails, over roots that commit in path order.
const PUBLISHED: &[&str] = &[
    "a: open",
    "b: open",
    "a: stage",
    "b: stage",
    "a: make durable",
    "b: make durable",
    "a: commit",
    "a: put b1.txt",
    "a: catalog",
    "b: commit",
    "b: put b1.txt",
    "b: catalog",
];

/// A failure at any step of any root rolls every root back, in order;
/// nothing is left of the publication but in the roots committed before
/// the failure (a root's commit is all or nothing).
#[test]
fn a_failure_at_each_step_of_each_root_rolls_every_root_back() {
    // The step, the root (0: a, 1: b), the call the failure follows (none
    // for a listing, which is not logged), and the roots committed before.
    let rows: &[(Op, usize, Option<&str>, &[usize])] = &[
        (Op::Listing, 0, None, &[]),
        (Op::Listing, 1, None, &[]),
        (Op::Stage, 0, Some("a: stage"), &[]),
        (Op::Stage, 1, Some("b: stage"), &[]),
        (Op::MakeDurable, 0, Some("a: make durable"), &[]),
        (Op::MakeDurable, 1, Some("b: make durable"), &[]),
        (Op::Commit, 0, Some("a: commit"), &[]),
        (Op::Commit, 1, Some("b: commit"), &[0]),
    ];
    for &(op, at, after, committed) in rows {
        for failure in [Failure::Transient, Failure::Permanent] {
            let row = format!("{op:?} of root {at}, {failure:?}");
            let (w, before) = World::new(LOCAL, LOCAL).seeded();
            let b1 = w.bundle("b1", "s1", 1, &[("b1.txt", "one\n")]);
            w.roots[at].fail(op, 1, failure);
            let reports = w.reports(&[&b1]);
            let report = &reports[0];
            assert!(!report.ok, "{row}");
            assert_eq!(report.transient(), failure == Failure::Transient, "{row}");
            assert!(report.destinations[at].error.is_some(), "{row}");

            let name = ["a", "b"][at];
            let mut expected: Vec<String> = match after {
                Some(call) => {
                    let end = PUBLISHED.iter().position(|c| *c == call).unwrap();
                    PUBLISHED[..=end].iter().map(|c| c.to_string()).collect()
                }
                None => PUBLISHED[..2].iter().map(|c| c.to_string()).collect(),
            };
            expected.push(format!("{name}: {op:?} fails"));
            expected.extend(["a: roll back".to_owned(), "b: roll back".to_owned()]);
            assert_eq!(w.calls(), expected, "{row}");

            let after = w.stored();
            for (j, root) in after.iter().enumerate() {
                if committed.contains(&j) {
                    let (files, records) = paths(root);
                    assert_eq!(files, ["b1.txt", "base.txt"], "{row}");
                    assert_eq!(records, ["b1.txt", "base.txt"], "{row}");
                } else {
                    assert_eq!(*root, before[j], "{row}: root {j} is as it was");
                }
            }
        }
    }
}

/// Roots whose commit reads the bundle commit first, whatever their path
/// order; within a root, the outputs become visible before the catalog
/// that records them, and deletions only after the catalog dropped them.
#[test]
fn roots_whose_commit_reads_the_bundle_commit_first_and_the_catalog_between_writes_and_deletes() {
    // Capabilities of a and b, and the order of their commits.
    let rows: &[(Capabilities, Capabilities, [&str; 2])] = &[
        (LOCAL, LOCAL, ["a", "b"]),
        (LOCAL, BUCKET, ["b", "a"]),
        (BUCKET, LOCAL, ["a", "b"]),
        (BUCKET, BUCKET, ["a", "b"]),
    ];
    for &(a, b, order) in rows {
        let row = format!("a {a:?}, b {b:?}");
        let (w, _) = World::with_workflow(a, b, "replacement").seeded();
        // A later bundle replaces the root: base.txt is gone, two new files.
        let next = w.bundle(
            "b1",
            "s1",
            1,
            &[("new-2.txt", "two\n"), ("new-1.txt", "one\n")],
        );
        let reports = w.reports(&[&next]);
        assert!(reports[0].ok, "{row}: {reports:?}");
        let commits: Vec<String> = w
            .calls()
            .into_iter()
            .skip_while(|c| !c.ends_with(": commit"))
            .collect();
        let mut expected = Vec::new();
        for root in order {
            for call in [
                "commit",
                "put new-1.txt",
                "put new-2.txt",
                "catalog",
                "delete base.txt",
            ] {
                expected.push(format!("{root}: {call}"));
            }
        }
        assert_eq!(commits, expected, "{row}");
        for root in w.stored() {
            let (files, records) = paths(&root);
            assert_eq!(files, ["new-1.txt", "new-2.txt"], "{row}");
            assert_eq!(records, ["new-1.txt", "new-2.txt"], "{row}");
        }
    }
}

/// A bundle of a batch that is refused (its plan, or its bytes) is
/// reported alone; the others are published together, in every root.
#[test]
fn a_refused_bundle_in_a_batch_leaves_the_others_published() {
    // Why the middle bundle is refused, and what the roots hold besides.
    let rows: &[(&str, bool)] = &[
        // It does not match its manifest.
        ("changed after sealing", false),
        // It would overwrite a file the catalog does not record.
        ("an unmanaged file in its way", true),
    ];
    for &(row, unmanaged) in rows {
        let (w, _) = World::new(LOCAL, LOCAL).seeded();
        let b1 = w.bundle("b1", "s1", 1, &[("b1.txt", "one\n")]);
        let b2 = w.bundle("b2", "s2", 2, &[("b2.txt", "two\n")]);
        let b3 = w.bundle("b3", "s3", 3, &[("b3.txt", "three\n")]);
        if unmanaged {
            for root in &w.roots {
                let mut stored = root.stored();
                stored.files.insert("b2.txt".into(), b"theirs\n".to_vec());
                root.hold(stored);
            }
        } else {
            std::fs::write(b2.join("b2.txt"), "changed\n").unwrap();
        }
        let reports = w.reports(&[&b1, &b2, &b3]);
        let ok: Vec<bool> = reports.iter().map(|r| r.ok).collect();
        assert_eq!(ok, [true, false, true], "{row}: {reports:?}");
        assert!(!reports[1].transient(), "{row}");
        for root in w.stored() {
            let (files, records) = paths(&root);
            let mut expected = vec!["b1.txt", "b3.txt", "base.txt"];
            if unmanaged {
                expected.insert(1, "b2.txt");
                assert_eq!(root.files["b2.txt"], b"theirs\n", "{row}");
            }
            assert_eq!(files, expected, "{row}");
            assert_eq!(records, ["b1.txt", "b3.txt", "base.txt"], "{row}");
        }
        // One change per root: staged, made durable and committed once.
        let commits = w.calls().iter().filter(|c| c.ends_with(": commit")).count();
        assert_eq!(commits, 2, "{row}");
    }
}

/// A failure of a root while a batch is written stops the whole batch: no
/// bundle of it is reported or published anywhere, every root is rolled
/// back, and the error says whether a retry may pass (the caller then
/// publishes the bundles one by one, in order).
#[test]
fn a_failing_root_stops_the_whole_batch_and_says_whether_it_may_pass() {
    let rows: &[(Op, usize, Failure)] = &[
        (Op::Stage, 1, Failure::Transient),
        (Op::MakeDurable, 0, Failure::Transient),
        (Op::Commit, 0, Failure::Permanent),
        (Op::Listing, 1, Failure::Permanent),
    ];
    for &(op, at, failure) in rows {
        let row = format!("{op:?} of root {at}, {failure:?}");
        let (w, before) = World::new(LOCAL, LOCAL).seeded();
        let b1 = w.bundle("b1", "s1", 1, &[("b1.txt", "one\n")]);
        let b2 = w.bundle("b2", "s2", 2, &[("b2.txt", "two\n")]);
        w.roots[at].fail(op, 1, failure);
        match w.run(&[&b1, &b2]) {
            Ended::Aborted(a) => {
                let e = a.error;
                assert_eq!(
                    e.is_transient(),
                    failure == Failure::Transient,
                    "{row}: {e}"
                )
            }
            _ => panic!("{row}: the batch went on"),
        }
        assert_eq!(w.stored(), before, "{row}: nothing was published");
        let calls = w.calls();
        assert_eq!(
            calls[calls.len() - 2..],
            ["a: roll back", "b: roll back"],
            "{row}"
        );
        assert!(!calls.iter().any(|c| c.ends_with(": catalog")), "{row}");
    }
}

/// A bundle of a batch that cannot be read for a passing reason (a flaky
/// disk under the spool) ends the batch there, whether it is met while the
/// bundles are prepared or when it is hashed before anything is written:
/// the bundles before it are published, it is reported failed and tried
/// again later, and the bundles after it are not attempted (no report: the
/// caller batches them next), so that nothing newer goes before it. One
/// that cannot be read for good is reported alone, and the others are
/// published. (A root's failure stops the whole batch instead:
/// `a_failing_root_stops_the_whole_batch_and_says_whether_it_may_pass`.)
#[test]
fn a_bundle_unreadable_for_a_while_ends_the_batch_before_the_bundles_after_it() {
    // The read of b2 that fails (1: preparing it; 2: hashing it before
    // anything is written, which a bundle that writes nothing gets), and
    // how.
    let rows: &[(usize, Failure)] = &[
        (1, Failure::Transient),
        (2, Failure::Transient),
        (1, Failure::Permanent),
        (2, Failure::Permanent),
    ];
    for &(nth, failure) in rows {
        let row = format!("read {nth} of b2, {failure:?}");
        let transient = failure == Failure::Transient;
        let (w, _) = World::new(LOCAL, LOCAL).seeded();
        let b1 = w.bundle("b1", "s1", 1, &[("b1.txt", "one\n")]);
        // b0 again: everything it holds is published already (skip_same).
        let b2 = w.bundle("b2", "s0", 0, &[("base.txt", "base\n")]);
        let b3 = w.bundle("b3", "s3", 3, &[("b3.txt", "three\n")]);
        memory::fail_reading(&b2, "b2", nth, failure, &w.log);
        let reports = w.reports(&[&b1, &b2, &b3]);

        let ok: Vec<bool> = reports.iter().map(|r| r.ok).collect();
        let (expected_ok, published): (&[bool], &[&str]) = if transient {
            (&[true, false], &["b1.txt"])
        } else {
            (&[true, false, true], &["b1.txt", "b3.txt"])
        };
        assert_eq!(ok, expected_ok, "{row}: {reports:?}");
        assert_eq!(reports[1].transient(), transient, "{row}");
        assert!(
            reports[1].error_text().contains("cannot read"),
            "{row}: {reports:?}"
        );
        for root in w.stored() {
            let (files, records) = paths(&root);
            let mut expected = published.to_vec();
            expected.push("base.txt");
            assert_eq!(files, expected, "{row}");
            assert_eq!(records, expected, "{row}");
        }

        let mut expected = vec!["a: open".to_owned(), "b: open".to_owned()];
        if nth == 2 {
            expected.push("b2: read".to_owned());
        }
        expected.push("b2: read fails".to_owned());
        for call in ["stage", "make durable"] {
            expected.extend(["a", "b"].map(|root| format!("{root}: {call}")));
        }
        for root in ["a", "b"] {
            expected.push(format!("{root}: commit"));
            expected.extend(published.iter().map(|p| format!("{root}: put {p}")));
            expected.push(format!("{root}: catalog"));
        }
        assert_eq!(w.calls(), expected, "{row}");
    }
}

/// A commit that lost the catalog's compare-and-swap to another writer is
/// re-applied on the winner's catalog when the winner left every record it
/// relies on as it was (keeping the winner's records and files); else
/// nothing of it is recorded, and the root holds what the winner left.
#[test]
fn a_commit_that_lost_a_race_is_rebased_on_the_winner_when_it_still_holds() {
    // What the winner writes, whether the root may rebase, and whether the
    // publication is then recorded.
    let rows: &[(&str, Capabilities, bool)] = &[
        ("other.txt", BUCKET, true),
        ("b1.txt", BUCKET, false),
        ("other.txt", LOCAL, false),
    ];
    for &(theirs, capabilities, rebased) in rows {
        let row = format!("winner writes {theirs}, {capabilities:?}");
        let (w, before) = World::new(capabilities, capabilities).seeded();
        // The winner: root b's twin, where another source published first.
        let winner = w.bundle("w", "winner", 1, &[(theirs, "theirs\n")]);
        let reports = w.reports(&[&winner]);
        assert!(reports[0].ok, "{row}");
        let won = w.roots[1].stored();
        for (root, before) in w.roots.iter().zip(&before) {
            root.hold(before.clone());
        }
        w.roots[1].lose_race_to(won.clone());
        w.log.lock().unwrap().clear();

        let b1 = w.bundle("b1", "s1", 2, &[("b1.txt", "one\n")]);
        let report = &w.reports(&[&b1])[0];
        assert_eq!(report.ok, rebased, "{row}: {report:?}");
        let b = &report.destinations[1];
        let calls = w.calls();
        if rebased {
            assert_eq!(b.catalog_rebases, 1, "{row}");
            let stored = w.roots[1].stored();
            let (files, records) = paths(&stored);
            let mut expected = vec!["b1.txt", "base.txt", theirs];
            expected.sort();
            assert_eq!(files, expected, "{row}");
            assert_eq!(records, expected, "{row}");
            assert!(calls.contains(&"b: rebased".to_owned()), "{row}");
        } else {
            assert!(b.catalog_conflict, "{row}: {b:?}");
            assert!(report.transient(), "{row}");
            assert_eq!(w.roots[1].stored(), won, "{row}: the winner's, untouched");
            assert!(calls.contains(&"b: lost the race".to_owned()), "{row}");
        }
    }
}
