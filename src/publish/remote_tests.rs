//! The pure decisions of publishing to an s3 destination: when a lost
//! compare-and-swap may be re-applied on the winner's catalog, and which
//! plans a bucket refuses because they would delete unrecorded objects.

use std::collections::BTreeSet;

use super::{apply, rebase_onto, unrecorded_deletes, view};
use crate::catalog::{Catalog, OutputKind, OutputRecord, SourceIdentity, State, parse_time};
use crate::config::{Backend, Destination, S3Location, Workflow};
use crate::paths::RelPath;
use crate::plan::{Action, CatalogUpdate, Plan};

const WHEN: &str = "2026-01-01T00:00:00Z";

pub(super) fn destination(workflow: Workflow) -> Destination {
    Destination {
        backend: Backend::S3(S3Location {
            bucket: "b".into(),
            path: "site".into(),
            endpoint: None,
            region: "us-east-1".into(),
        }),
        id: "web".into(),
        root: Default::default(),
        workflow,
        prefix: String::new(),
        publish_source: true,
        publish_html: false,
        allow_raw_html: false,
        html_template: None,
        base_url: None,
        prune: None,
    }
}

/// A record of `owner` (`pipeline/destination`) at `path` holding `body`.
pub(super) fn record(path: &str, owner: &str, body: &str) -> OutputRecord {
    let (pipeline, destination) = owner.split_once('/').unwrap();
    let when = parse_time(WHEN).unwrap();
    OutputRecord {
        path: RelPath::parse(path).unwrap(),
        pipeline_id: pipeline.into(),
        destination_id: destination.into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: "src".into(),
            digest: format!("sha256:{:0>64}", 0),
            created: when,
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: crate::catalog::Sha256::parse(&crate::hashing::hash_bytes(body.as_bytes()).sha256)
            .unwrap(),
        size: body.len() as u64,
        created_at: when,
        updated_at: when,
    }
}

pub(super) fn catalog(records: &[OutputRecord]) -> State {
    let mut c = Catalog::new(parse_time(WHEN).unwrap());
    c.outputs = records.to_vec();
    c.outputs
        .sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    State::Catalog(c)
}

pub(super) fn paths(c: &Catalog) -> Vec<&str> {
    c.outputs.iter().map(|r| r.path.as_str()).collect()
}

/// An update of `p/web` writing `upserts` and dropping `removes`.
fn update(keep_existing: bool, upserts: &[&str], removes: &[&str]) -> CatalogUpdate {
    CatalogUpdate {
        keep_existing,
        upserts: upserts.iter().map(|p| record(p, "p/web", "new")).collect(),
        removes: removes.iter().map(|p| (*p).to_owned()).collect(),
        now: parse_time("2026-01-02T00:00:00Z").unwrap(),
    }
}

#[test]
fn a_lost_swap_is_reapplied_only_when_this_plan_still_holds() {
    struct Case {
        name: &'static str,
        workflow: Workflow,
        base: State,
        latest: State,
        unchanged: &'static [&'static str],
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
            unchanged: &[],
            update: update(true, &["b.txt"], &[]),
            want: Some(&["a.txt", "b.txt", "z.txt"]),
        },
        Case {
            name: "the record of an output kept unchanged moved on",
            workflow: Workflow::Additive,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[record("a.txt", "q/web", "theirs")]),
            unchanged: &["a.txt"],
            update: update(true, &["a.txt", "b.txt"], &[]),
            want: None,
        },
        Case {
            name: "replacement: the same destination published in between",
            workflow: Workflow::Replacement,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[mine.clone(), record("c.txt", "p/web", "c")]),
            unchanged: &[],
            update: update(true, &["b.txt"], &["a.txt"]),
            want: None,
        },
        Case {
            name: "replacement: only another destination published in between",
            workflow: Workflow::Replacement,
            base: catalog(std::slice::from_ref(&mine)),
            latest: catalog(&[mine.clone(), record("c.txt", "p/disk", "c")]),
            unchanged: &[],
            update: update(true, &["b.txt"], &["a.txt"]),
            want: Some(&["b.txt", "c.txt"]),
        },
        Case {
            name: "no catalog when planned, someone else made one",
            workflow: Workflow::Additive,
            base: State::Absent,
            latest: catalog(&[record("z.txt", "q/web", "z")]),
            unchanged: &[],
            update: update(false, &["b.txt"], &[]),
            want: Some(&["b.txt", "z.txt"]),
        },
    ];
    for case in cases {
        let unchanged: BTreeSet<String> = case.unchanged.iter().map(|p| (*p).into()).collect();
        let got = rebase_onto(
            &case.update,
            &case.base,
            &case.latest,
            &unchanged,
            "p",
            &destination(case.workflow),
        );
        assert_eq!(
            got.as_ref().map(paths),
            case.want.map(<[&str]>::to_vec),
            "{}",
            case.name
        );
        // The commit decides on the few records it keeps of the base.
        let d = destination(case.workflow);
        let seen = view(&case.base, &unchanged, "p", &d);
        let on_view = rebase_onto(&case.update, &seen, &case.latest, &unchanged, "p", &d);
        assert_eq!(on_view, got, "{} (on the view)", case.name);
    }
}

#[test]
fn applying_an_update_keeps_everything_else_of_the_catalog() {
    let state = catalog(&[record("a.txt", "p/web", "a"), record("b.txt", "q/web", "b")]);
    let c = apply(&update(true, &["a.txt", "n.txt"], &[]), &state);
    assert_eq!(paths(&c), ["a.txt", "b.txt", "n.txt"]);
    assert_eq!(
        c.get("a.txt").unwrap().sha256,
        record("x", "p/web", "new").sha256
    );
    let fresh = apply(&update(false, &["n.txt"], &[]), &State::Absent);
    assert_eq!(paths(&fresh), ["n.txt"]);
}

#[test]
fn a_bucket_refuses_deleting_what_the_catalog_does_not_record() {
    let plan = |delete_after: &[&str], clear_first: &[&str]| Plan {
        action: Action::ReplaceCatalog,
        writes: Vec::new().into(),
        clear_first: clear_first.iter().map(|p| (*p).into()).collect(),
        delete_after: delete_after.iter().map(|p| (*p).into()).collect(),
        deletes: Vec::new(),
        unmanaged: Vec::new(),
        error: None,
        update: None,
    };
    let d = destination(Workflow::Replacement);
    let recorded = catalog(&[record("old.txt", "p/web", "o")]);
    assert!(unrecorded_deletes(&plan(&["old.txt"], &[]), &recorded, &d).is_none());

    let refused = unrecorded_deletes(&plan(&["old.txt", "stray.txt"], &[]), &recorded, &d)
        .expect("a refusal");
    assert_eq!(refused.action, Action::FailUnmanaged);
    assert_eq!(refused.unmanaged, ["stray.txt"]);
    assert!(refused.writes.is_empty() && refused.update.is_none());
    let error = refused.error.unwrap();
    assert!(
        error.contains("stray.txt") && error.contains("workflow: additive"),
        "{error}"
    );

    // A catalog of an older schema: nothing is recorded, nothing may go.
    let legacy = State::Legacy { schema_version: 3 };
    let refused = unrecorded_deletes(&plan(&["a"], &["b"]), &legacy, &d).expect("a refusal");
    assert_eq!(refused.unmanaged, ["a", "b"]);
}
