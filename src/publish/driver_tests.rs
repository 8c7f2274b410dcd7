//! The driver's decisions: which writes and deletes a batch sends to a
//! root, how many bundles a batch takes, and how a run that cannot commit
//! ends, for a batch and for a single bundle.

use std::collections::BTreeSet;

use super::{Driver, Merged, Taken, held_bytes};
use crate::catalog::OutputKind;
use crate::paths::RelPath;
use crate::plan::{Action, Desired, Plan};

fn desired(path: &str) -> Desired {
    Desired {
        path: RelPath::parse(path).unwrap(),
        kind: OutputKind::Source,
        bundle_path: RelPath::parse(path).unwrap(),
        transform: None,
        url: None,
        sha256: crate::catalog::Sha256::parse(
            &crate::fs::hashing::hash_bytes(path.as_bytes()).sha256,
        )
        .unwrap(),
        size: path.len() as u64,
    }
}

fn plan(writes: &[&str], delete_after: &[&str]) -> Plan {
    Plan {
        action: Action::PublishNew,
        writes: writes.iter().map(|p| desired(p)).collect(),
        clear_first: Vec::new(),
        delete_after: delete_after.iter().map(|p| (*p).to_owned()).collect(),
        deletes: Vec::new(),
        unmanaged: Vec::new(),
        error: None,
        update: None,
    }
}

#[test]
fn a_batch_sends_the_last_writer_of_each_path_and_what_is_deleted_last() {
    let none = BTreeSet::new();
    let kept: BTreeSet<String> = ["kept.txt".to_owned()].into_iter().collect();
    let p0 = plan(&["a.txt", "gone-later.txt", "kept.txt"], &["old.txt"]);
    let p1 = plan(&["a.txt", "old.txt"], &["gone-later.txt"]);
    let p2 = plan(&["kept.txt", "b.txt"], &["x.txt"]);
    // Bundle 2 found kept.txt already holding its bytes: not sent.
    let m = Merged::of(&[(&p0, &none), (&p1, &none), (&p2, &kept)]);
    let writes: Vec<(&str, usize)> = m
        .writes
        .iter()
        .map(|(i, d)| (d.path.as_str(), *i))
        .collect();
    assert_eq!(writes, [("a.txt", 1), ("b.txt", 2), ("old.txt", 1)]);
    let deletes: Vec<&str> = m.deletes.iter().copied().collect();
    assert_eq!(deletes, ["gone-later.txt", "x.txt"]);

    // The same path kept by its last writer but written by an earlier one
    // is not kept: the earlier bundle's bytes are written.
    let p3 = plan(&["kept.txt"], &[]);
    let m = Merged::of(&[(&p0, &kept), (&p3, &none)]);
    let at = |m: &Merged, path: &str| {
        m.writes
            .iter()
            .find(|(_, d)| d.path.as_str() == path)
            .map(|(k, _)| *k)
    };
    assert_eq!(at(&m, "kept.txt"), Some(1));
    // One bundle: its writes as planned, but those it found in place.
    let m = Merged::of(&[(&p2, &kept)]);
    assert_eq!(at(&m, "b.txt"), Some(0));
    assert_eq!(at(&m, "kept.txt"), None);
    assert_eq!(m.deletes.iter().copied().collect::<Vec<_>>(), ["x.txt"]);
    // Which bundle's write was found unchanged, by path.
    let m = Merged::of(&[(&p0, &none), (&p1, &none)]);
    let flags: Vec<bool> = m
        .writes
        .iter()
        .map(|(_, d)| d.path.as_str() == "a.txt")
        .collect();
    assert!(m.kept_unchanged(&flags, 1, "a.txt"));
    assert!(!m.kept_unchanged(&flags, 0, "a.txt"));
    assert!(!m.kept_unchanged(&flags, 1, "old.txt"));
}

/// Bundles `b0`..`b3` in a temporary folder, each one markdown file
/// rendered to a page; `b1` does not match its manifest. With the pipeline
/// that publishes source and HTML.
fn four_bundles() -> (
    tempfile::TempDir,
    crate::config::Config,
    Vec<std::path::PathBuf>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    for i in 0..4 {
        let dir = tmp.path().join(format!("b{i}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("a.md"),
            format!("# Page {i}\n\n{}\n", "text ".repeat(200)),
        )
        .unwrap();
        crate::bundle::seal(&dir, &format!("b-{i}"), None).unwrap();
        dirs.push(dir);
    }
    std::fs::write(dirs[1].join("a.md"), "changed after sealing\n").unwrap();
    let config = crate::config::parse(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        publish: {source: true, html: true}
",
        &tmp.path().join("config.yaml"),
    )
    .unwrap();
    (tmp, config, dirs)
}

/// How the tests publish: for real, scratch files in `tmp`.
fn options(tmp: &std::path::Path) -> super::super::Options {
    super::super::Options {
        dry_run: false,
        force: false,
        lock_timeout: std::time::Duration::from_secs(1),
        serving: None,
        scratch: tmp.to_path_buf(),
        process: crate::runtime::process_state::ProcessState::default(),
    }
}

#[test]
fn a_batch_takes_the_bundles_whose_pages_fit_in_its_memory_bound_and_at_least_one() {
    let (tmp, config, dirs) = four_bundles();
    let pipeline = &config.pipelines[0];
    let destinations = [&pipeline.destinations[0]];
    let bundles: Vec<&std::path::Path> = dirs.iter().map(|d| d.as_path()).collect();
    let options = options(tmp.path());
    let driver = Driver {
        pipeline,
        destinations: &destinations,
        options: &options,
        workers: &crate::runtime::workers::InOrder,
        cancel: &crate::runtime::interrupt::Cancel::new(),
        older: None,
        before_commit: None,
        tombstones: Default::default(),
    };
    let now = crate::runtime::clock::now_millis();
    // Unbounded: every bundle, the one that does not match its manifest
    // with its report (it holds nothing).
    let Taken { reports, ready } = driver.prepare(&bundles, u64::MAX, now);
    assert_eq!(reports.len(), 4);
    assert!(reports[1].as_ref().is_some_and(|r| !r.ok));
    let taken: Vec<usize> = ready.iter().map(|(i, _)| *i).collect();
    assert_eq!(taken, [0, 2, 3]);
    let held: Vec<u64> = ready.iter().map(|(_, r)| held_bytes(r)).collect();
    // The markdown and its page, each counted once.
    assert!(held.iter().all(|h| *h > 1000), "{held:?}");
    // Room for two ready bundles: the third waits for the next batch; the
    // invalid one between them is reported.
    let Taken { reports, ready } = driver.prepare(&bundles, held[0] + held[1], now);
    assert_eq!(reports.len(), 3);
    assert_eq!(ready.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 2]);
    // No room at all: still the first bundle, so that a backlog moves
    // (and the invalid one after it, which holds nothing).
    let Taken { reports, ready } = driver.prepare(&bundles, 1, now);
    assert_eq!(reports.len(), 2);
    assert_eq!(ready.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0]);
}

/// `before_commit` is told, once every root is durable, each bundle about
/// to be committed with its report as the commit leaves it; an error from
/// it stops the publication with nothing committed, and the batch steps
/// aside with that error (the agent defers it: its spool is at fault).
#[test]
fn before_commit_hears_each_bundle_the_commit_takes_and_can_stop_it() {
    let (tmp, config, dirs) = four_bundles();
    let pipeline = &config.pipelines[0];
    let destinations = [&pipeline.destinations[0]];
    let bundles: Vec<&std::path::Path> = dirs.iter().map(|d| d.as_path()).collect();
    let options = options(tmp.path());
    let root = tmp.path().join("www");
    // A catalog first (a batch needs one): b0 alone.
    let first = super::super::publish(pipeline, &destinations, &dirs[0], &options);
    assert!(first.ok, "{first:?}");
    let catalog = std::fs::read(root.join(".distributor.json")).unwrap();

    let refuse = |_: &[(usize, &crate::report::RunReport)]| -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
    };
    let driver = Driver {
        pipeline,
        destinations: &destinations,
        options: &options,
        workers: &crate::runtime::workers::InOrder,
        cancel: &crate::runtime::interrupt::Cancel::new(),
        older: None,
        before_commit: Some(&refuse),
        tombstones: Default::default(),
    };
    match driver.run(&bundles[2..]) {
        super::Ended::Aborted(aborted) => {
            let error = aborted.error;
            assert!(matches!(error, super::Error::Record { .. }), "{error}");
            assert!(error.is_transient());
        }
        _ => panic!("the batch went on past a refused record"),
    }
    assert_eq!(
        std::fs::read(root.join(".distributor.json")).unwrap(),
        catalog,
        "nothing was committed"
    );

    let told = std::sync::Mutex::new(Vec::new());
    let listen = |reports: &[(usize, &crate::report::RunReport)]| -> std::io::Result<()> {
        let mut told = told.lock().unwrap();
        for (i, r) in reports {
            // Still the catalog of b0: nothing committed yet.
            assert_eq!(
                std::fs::read(root.join(".distributor.json")).unwrap(),
                catalog
            );
            told.push((*i, r.ok, r.destinations[0].writes.clone()));
        }
        Ok(())
    };
    let driver = Driver {
        before_commit: Some(&listen),
        ..driver
    };
    let super::Ended::Reports(reports) = driver.run(&bundles[1..]) else {
        panic!("the batch was not published");
    };
    assert_eq!(reports.len(), 3);
    assert!(!reports[0].ok, "b1 does not match its manifest");
    // b1 is not committed, b2 and b3 are, with their writes.
    let told = told.into_inner().unwrap();
    let pages = vec!["a.html".to_owned(), "a.md".to_owned()];
    assert_eq!(told, [(1, true, pages.clone()), (2, true, pages)]);
    assert_ne!(
        std::fs::read(root.join(".distributor.json")).unwrap(),
        catalog
    );
}

/// A single publication ends like a batch (`Ended::Aborted`), and its
/// caller turns that into the bundle's failed report: the error, transient
/// here, and nothing committed.
#[test]
fn a_single_bundle_stopped_before_its_commit_gets_a_failed_report() {
    let (tmp, config, dirs) = four_bundles();
    let pipeline = &config.pipelines[0];
    let destinations = [&pipeline.destinations[0]];
    let options = options(tmp.path());
    let root = tmp.path().join("www");
    let first = super::super::publish(pipeline, &destinations, &dirs[0], &options);
    assert!(first.ok, "{first:?}");
    let catalog = std::fs::read(root.join(".distributor.json")).unwrap();
    let refuse = |_: &[(usize, &crate::report::RunReport)]| -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
    };
    let report =
        super::super::publish_recorded(pipeline, &destinations, &dirs[2], &options, Some(&refuse));
    assert!(!report.ok && report.transient(), "{report:?}");
    assert_eq!(
        report.source.as_ref().map(|s| s.id.as_str()),
        Some("b-2"),
        "the bundle's own report"
    );
    assert!(report.error.is_some(), "{report:?}");
    assert_eq!(
        std::fs::read(root.join(".distributor.json")).unwrap(),
        catalog,
        "nothing was committed"
    );
}
