//! When a commit that lost the catalog's compare-and-swap may be applied
//! again on the winner's catalog: for one bundle and for a batch.

use super::{onto, relied_on};
use crate::backend::rebase::Rebase;
use crate::backend::s3::tests::{catalog, paths, record, update};
use crate::catalog::{Catalog, State, parse_time};
use crate::config::Workflow;
use crate::plan::CatalogUpdate;

fn now() -> time::OffsetDateTime {
    parse_time("2026-01-03T00:00:00Z").unwrap()
}

fn the_catalog(state: &State) -> Option<&Catalog> {
    match state {
        State::Catalog(c) => Some(c),
        _ => None,
    }
}

/// What a commit of `updates` planned on `base` keeps for a lost race.
fn rebase(base: &State, updates: Vec<CatalogUpdate>, workflow: Workflow) -> Rebase {
    Rebase {
        seen: the_catalog(base).map(|b| relied_on(b, &updates, "p", "web", workflow)),
        updates,
        pipeline_id: "p".into(),
        destination_id: "web".into(),
        workflow,
        now: now(),
    }
}

/// A bundle's update of `p/web`: `upserts` as (path, body), `removes`.
fn update_of(upserts: &[(&str, &str)], removes: &[&str]) -> CatalogUpdate {
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

#[test]
fn a_lost_swap_of_one_bundle_is_reapplied_only_when_its_plan_still_holds() {
    struct Case {
        name: &'static str,
        workflow: Workflow,
        base: State,
        latest: State,
        update: CatalogUpdate,
        /// The paths of the catalog written instead, or `None`: undo.
        want: Option<&'static [&'static str]>,
    }
    let mine = record("a.txt", "p/web", "old");
    let cases = [
        Case {
            name: "another pipeline added a path of its own",
            workflow: Workflow::Additive,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[mine.clone(), record("z.txt", "q/web", "z")]),
            update: update(true, &["b.txt"], &[]),
            want: Some(&["a.txt", "b.txt", "z.txt"]),
        },
        Case {
            name: "the record of an output kept unchanged moved on",
            workflow: Workflow::Additive,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[record("a.txt", "q/web", "theirs")]),
            update: update(true, &["a.txt", "b.txt"], &[]),
            want: None,
        },
        Case {
            name: "replacement: the same destination published in between",
            workflow: Workflow::Replacement,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[mine.clone(), record("c.txt", "p/web", "c")]),
            update: update(true, &["b.txt"], &["a.txt"]),
            want: None,
        },
        Case {
            name: "replacement: only another destination published in between",
            workflow: Workflow::Replacement,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[mine.clone(), record("c.txt", "p/disk", "c")]),
            update: update(true, &["b.txt"], &["a.txt"]),
            want: Some(&["b.txt", "c.txt"]),
        },
        Case {
            name: "no catalog when planned, someone else made one",
            workflow: Workflow::Additive,
            base: State::Absent,
            latest: catalog(&[record("z.txt", "q/web", "z")]),
            update: update(false, &["b.txt"], &[]),
            want: Some(&["b.txt", "z.txt"]),
        },
        Case {
            name: "no catalog when planned, someone else wrote the same path",
            workflow: Workflow::Additive,
            base: State::Absent,
            latest: catalog(&[record("b.txt", "q/web", "z")]),
            update: update(false, &["b.txt"], &[]),
            want: None,
        },
    ];
    for case in cases {
        let r = rebase(&case.base, vec![case.update], case.workflow);
        let got = onto(&r, &case.latest);
        assert_eq!(
            got.as_ref().map(paths),
            case.want.map(<[&str]>::to_vec),
            "{}",
            case.name
        );
    }
}

#[test]
fn a_lost_swap_of_a_batch_is_reapplied_only_when_the_batch_still_holds() {
    struct Case {
        name: &'static str,
        workflow: Workflow,
        latest: State,
        /// The paths of the catalog written instead, or `None`: undo.
        want: Option<&'static [&'static str]>,
    }
    let mine = record("a.txt", "p/web", "old");
    let other = record("z.txt", "q/web", "z");
    let base = catalog(&[mine.clone(), other.clone()]);
    // Bundle 0 writes a.txt and n.txt, bundle 1 writes a.txt again and
    // drops n.txt (never recorded before the batch), bundle 2 adds m.txt.
    let updates = || {
        vec![
            update_of(&[("a.txt", "first"), ("n.txt", "n")], &[]),
            update_of(&[("a.txt", "second")], &["n.txt"]),
            update_of(&[("m.txt", "m")], &[]),
        ]
    };
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
    for case in cases {
        let r = rebase(&base, updates(), case.workflow);
        let got = onto(&r, &case.latest);
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
fn a_change_relies_on_every_record_its_bundles_change_and_nothing_else() {
    let base = catalog(&[
        record("a.txt", "p/web", "a"),
        record("gone.txt", "p/web", "g"),
        record("mine-elsewhere.txt", "p/web", "e"),
        record("theirs.txt", "q/web", "t"),
    ]);
    let base = the_catalog(&base).unwrap();
    let updates = [update_of(
        &[("a.txt", "x"), ("new.txt", "n")],
        &["gone.txt"],
    )];
    let additive = relied_on(base, &updates, "p", "web", Workflow::Additive);
    assert_eq!(paths(&additive), ["a.txt", "gone.txt"]);
    let replacement = relied_on(base, &updates, "p", "web", Workflow::Replacement);
    assert_eq!(
        paths(&replacement),
        ["a.txt", "gone.txt", "mine-elsewhere.txt"]
    );
    assert_eq!(additive.updated_at, base.updated_at);
}
