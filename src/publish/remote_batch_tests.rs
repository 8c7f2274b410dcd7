//! The pure decisions of an s3 batch: what the planner sees at each key,
//! which writes and deletes the batch sends, and when a lost
//! compare-and-swap may be re-applied on the winner's catalog.

use std::collections::{BTreeMap, BTreeSet};

use super::super::tests::{catalog, destination, paths, record};
use super::{Merged, listing, rebase_batch, relied_on};
use crate::catalog::{Catalog, OutputKind, State, parse_time};
use crate::config::Workflow;
use crate::paths::RelPath;
use crate::plan::{Action, CatalogUpdate, Desired, Entry, Plan};
use crate::s3::{ETag, Head};

fn now() -> time::OffsetDateTime {
    parse_time("2026-01-03T00:00:00Z").unwrap()
}

/// A bundle's update of `p/web`: `upserts` as (path, body), `removes`.
fn update(upserts: &[(&str, &str)], removes: &[&str]) -> CatalogUpdate {
    CatalogUpdate {
        keep_existing: true,
        upserts: upserts
            .iter()
            .map(|(p, body)| record(p, "p/web", body))
            .collect(),
        removes: removes.iter().map(|p| (*p).to_owned()).collect(),
        now: parse_time("2026-01-02T00:00:00Z").unwrap(),
    }
}

fn desired(path: &str) -> Desired {
    Desired {
        path: RelPath::parse(path).unwrap(),
        kind: OutputKind::Source,
        bundle_path: RelPath::parse(path).unwrap(),
        url: None,
        sha256: crate::catalog::Sha256::parse(&crate::hashing::hash_bytes(path.as_bytes()).sha256)
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

fn head(size: u64, intent: Option<&str>) -> Head {
    Head {
        size,
        etag: ETag("\"e\"".into()),
        sha256: None,
        intent: intent.map(str::to_owned),
        last_modified: now(),
    }
}

fn the_catalog(state: State) -> Catalog {
    match state {
        State::Catalog(c) => c,
        _ => unreachable!(),
    }
}

#[test]
fn a_key_is_seen_as_the_bundles_before_leave_it_else_as_its_head() {
    let heads: BTreeMap<String, Head> = [
        ("theirs.txt", head(5, None)),
        ("written.txt", head(7, None)),
        ("deleted.txt", head(9, None)),
        ("in-flight.txt", head(3, Some("other"))),
        ("recorded.txt", head(4, Some("old"))),
    ]
    .into_iter()
    .map(|(k, h)| (k.to_owned(), h))
    .collect();
    let touched: BTreeMap<String, Option<u64>> = [
        ("written.txt".to_owned(), Some(70)),
        ("deleted.txt".to_owned(), None),
        ("new-by-earlier.txt".to_owned(), Some(1)),
    ]
    .into_iter()
    .collect();
    let state = catalog(&[record("recorded.txt", "p/web", "r")]);
    let all = [
        "theirs.txt",
        "written.txt",
        "deleted.txt",
        "in-flight.txt",
        "recorded.txt",
        "new-by-earlier.txt",
        "absent.txt",
    ];
    let wanted: Vec<Desired> = all.iter().map(|p| desired(p)).collect();
    let got = listing(&heads, &touched, &state, &wanted);
    let want: BTreeMap<String, Entry> = [
        // An object nobody records: the planner refuses over it.
        ("theirs.txt", 5),
        // An earlier bundle of the batch writes it: its size, not the HEAD's.
        ("written.txt", 70),
        ("new-by-earlier.txt", 1),
        // Recorded: seen even though a publication wrote it.
        ("recorded.txt", 4),
    ]
    .into_iter()
    .map(|(k, size)| (k.to_owned(), Entry::File { size }))
    .collect();
    // Deleted by an earlier bundle, absent, or an unrecorded object of a
    // publication in flight (left to the conditional create): not there.
    assert_eq!(got.entries, want);
    assert!(got.root_exists);
}

#[test]
fn the_batch_sends_the_last_writer_of_each_key_and_what_is_deleted_last() {
    let none = BTreeSet::new();
    let kept: BTreeSet<String> = ["kept.txt".to_owned()].into_iter().collect();
    let p0 = plan(&["a.txt", "gone-later.txt", "kept.txt"], &["old.txt"]);
    let p1 = plan(&["a.txt", "old.txt"], &["gone-later.txt"]);
    let p2 = plan(&["kept.txt", "b.txt"], &["x.txt"]);
    // Bundle 2 found kept.txt already holding its bytes: not sent.
    let m = Merged::of(3, &[(&p0, &none), (&p1, &none), (&p2, &kept)]);
    assert_eq!(m.destination, 3);
    let writes: Vec<(&str, usize)> = m
        .writes
        .iter()
        .map(|(k, (i, d))| {
            assert_eq!(k, d.path.as_str());
            (k.as_str(), *i)
        })
        .collect();
    assert_eq!(writes, [("a.txt", 1), ("b.txt", 2), ("old.txt", 1)]);
    let deletes: Vec<&str> = m.deletes.iter().map(String::as_str).collect();
    assert_eq!(deletes, ["gone-later.txt", "x.txt"]);

    // The same key kept by its last writer but written by an earlier one
    // is not kept: the earlier bundle's bytes go up.
    let p3 = plan(&["kept.txt"], &[]);
    let m = Merged::of(0, &[(&p0, &kept), (&p3, &none)]);
    assert_eq!(m.writes["kept.txt"].0, 1);
}

#[test]
fn a_lost_swap_is_reapplied_only_when_the_batch_still_holds() {
    struct Case {
        name: &'static str,
        workflow: Workflow,
        latest: State,
        /// The paths of the catalog written instead, or `None`: undo.
        want: Option<&'static [&'static str]>,
    }
    let mine = record("a.txt", "p/web", "old");
    let other = record("z.txt", "q/web", "z");
    let base = the_catalog(catalog(&[mine.clone(), other.clone()]));
    // Bundle 0 writes a.txt and n.txt, bundle 1 writes a.txt again and
    // drops n.txt (never recorded before the batch), bundle 2 adds m.txt.
    let updates = [
        update(&[("a.txt", "first"), ("n.txt", "n")], &[]),
        update(&[("a.txt", "second")], &["n.txt"]),
        update(&[("m.txt", "m")], &[]),
    ];
    let cases = [
        Case {
            name: "another pipeline added a path of its own",
            workflow: Workflow::Additive,
            latest: catalog(&[mine.clone(), other.clone(), record("y.txt", "q/web", "y")]),
            want: Some(&["a.txt", "m.txt", "y.txt", "z.txt"]),
        },
        Case {
            name: "the winner changed a key a bundle of the batch wrote",
            workflow: Workflow::Additive,
            latest: catalog(&[record("a.txt", "q/web", "theirs"), other.clone()]),
            want: None,
        },
        Case {
            name: "the winner recorded a key the batch wrote and dropped again",
            workflow: Workflow::Additive,
            latest: catalog(&[mine.clone(), other.clone(), record("n.txt", "q/web", "n")]),
            want: None,
        },
        Case {
            name: "replacement: the same destination published in between",
            workflow: Workflow::Replacement,
            latest: catalog(&[mine.clone(), other.clone(), record("c.txt", "p/web", "c")]),
            want: None,
        },
        Case {
            name: "replacement: only another destination published in between",
            workflow: Workflow::Replacement,
            latest: catalog(&[mine.clone(), other.clone(), record("c.txt", "p/disk", "c")]),
            want: Some(&["a.txt", "c.txt", "m.txt", "z.txt"]),
        },
        Case {
            name: "the catalog is gone",
            workflow: Workflow::Additive,
            latest: State::Absent,
            want: None,
        },
    ];
    let refs: Vec<&CatalogUpdate> = updates.iter().collect();
    for case in cases {
        let d = destination(case.workflow);
        let seen = relied_on(&base, &refs, "p", &d);
        let got = rebase_batch(&refs, &seen, &case.latest, "p", &d, now());
        assert_eq!(
            got.as_ref().map(paths),
            case.want.map(<[&str]>::to_vec),
            "{}",
            case.name
        );
        if let Some(c) = got {
            // The last bundle's bytes win, the winner's records stay.
            assert_eq!(
                c.get("a.txt").unwrap().sha256,
                record("a.txt", "p/web", "second").sha256,
                "{}",
                case.name
            );
            assert_eq!(c.updated_at, now());
        }
    }
}

#[test]
fn the_batch_relies_on_every_record_its_bundles_change_and_nothing_else() {
    let base = the_catalog(catalog(&[
        record("a.txt", "p/web", "a"),
        record("gone.txt", "p/web", "g"),
        record("mine-elsewhere.txt", "p/web", "e"),
        record("theirs.txt", "q/web", "t"),
    ]));
    let updates = [update(&[("a.txt", "x"), ("new.txt", "n")], &["gone.txt"])];
    let refs: Vec<&CatalogUpdate> = updates.iter().collect();
    let additive = relied_on(&base, &refs, "p", &destination(Workflow::Additive));
    assert_eq!(paths(&additive), ["a.txt", "gone.txt"]);
    let replacement = relied_on(&base, &refs, "p", &destination(Workflow::Replacement));
    assert_eq!(
        paths(&replacement),
        ["a.txt", "gone.txt", "mine-elsewhere.txt"]
    );
    assert_eq!(additive.updated_at, base.updated_at);
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

#[test]
fn a_batch_takes_the_bundles_whose_pages_fit_in_its_memory_bound_and_at_least_one() {
    let (tmp, config, dirs) = four_bundles();
    let pipeline = &config.pipelines[0];
    let destinations = [&pipeline.destinations[0]];
    let bundles: Vec<&std::path::Path> = dirs.iter().map(|d| d.as_path()).collect();
    let options = super::super::Options {
        dry_run: false,
        force: false,
        lock_timeout: std::time::Duration::from_secs(1),
        serving: None,
        scratch: tmp.path().to_path_buf(),
    };
    let workers = crate::publish::InOrder;
    let prepare = |budget| {
        super::prepare_within(
            pipeline,
            &destinations,
            &bundles,
            &options,
            &workers,
            budget,
        )
    };
    // Unbounded: every bundle, the one that does not match its manifest
    // with its report (it holds nothing).
    let (reports, ready) = prepare(u64::MAX);
    assert_eq!(reports.len(), 4);
    assert!(reports[1].as_ref().is_some_and(|r| !r.ok));
    let taken: Vec<usize> = ready.iter().map(|(i, _)| *i).collect();
    assert_eq!(taken, [0, 2, 3]);
    let held: Vec<u64> = ready.iter().map(|(_, r)| super::held_bytes(r)).collect();
    // The markdown and its page, each counted once.
    assert!(held.iter().all(|h| *h > 1000), "{held:?}");
    // Room for two ready bundles: the third waits for the next batch; the
    // invalid one between them is reported.
    let (reports, ready) = prepare(held[0] + held[1]);
    assert_eq!(reports.len(), 3);
    assert_eq!(ready.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 2]);
    // No room at all: still the first bundle, so that a backlog moves
    // (and the invalid one after it, which holds nothing).
    let (reports, ready) = prepare(1);
    assert_eq!(reports.len(), 2);
    assert_eq!(ready.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0]);
}
