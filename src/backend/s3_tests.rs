//! The pure decisions of publishing to an s3 destination: what the planner
//! sees at each key, and which plans a bucket refuses because they would
//! delete unrecorded objects.

use std::collections::BTreeMap;

use super::{already_there, size_at, unrecorded_deletes};
use crate::catalog::{Catalog, OutputKind, OutputRecord, SourceIdentity, State, parse_time};
use crate::config::{Backend, Destination, S3Location, Workflow};
use crate::paths::RelPath;
use crate::plan::{Action, CatalogUpdate, Entry, Plan};
use crate::s3::{ETag, Head};

const WHEN: &str = "2026-01-01T00:00:00Z";

pub(in crate::backend) fn destination(workflow: Workflow) -> Destination {
    Destination {
        backend: Backend::S3(S3Location {
            bucket: "b".into(),
            path: "site".into(),
            endpoint: None,
            region: "us-east-1".into(),
        }),
        id: "web".into(),
        root: Default::default(),
        releases: None,
        workflow,
        prefix: String::new(),
        scope: None,
        publish_source: true,
        publish_html: false,
        raw_html: crate::config::RawHtml::Escape,
        html_template: None,
        base_url: None,
        prune: None,
        hooks: None,
        precompress: Vec::new(),
        headers: Default::default(),
    }
}

/// A record of `owner` (`pipeline/destination`) at `path` holding `body`.
pub(in crate::backend) fn record(path: &str, owner: &str, body: &str) -> OutputRecord {
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
        sha256: crate::catalog::Sha256::parse(
            &crate::fs::hashing::hash_bytes(body.as_bytes()).sha256,
        )
        .unwrap(),
        size: body.len() as u64,
        created_at: when,
        updated_at: when,
    }
}

pub(in crate::backend) fn catalog(records: &[OutputRecord]) -> State {
    let mut c = Catalog::new(parse_time(WHEN).unwrap());
    c.outputs = records.to_vec();
    c.outputs
        .sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    State::Catalog(c)
}

pub(in crate::backend) fn paths(c: &Catalog) -> Vec<&str> {
    c.outputs.iter().map(|r| r.path.as_str()).collect()
}

/// An update of `p/web` writing `upserts` and dropping `removes`.
pub(in crate::backend) fn update(
    keep_existing: bool,
    upserts: &[&str],
    removes: &[&str],
) -> CatalogUpdate {
    CatalogUpdate {
        keep_existing,
        upserts: upserts.iter().map(|p| record(p, "p/web", "new")).collect(),
        removes: removes.iter().map(|p| (*p).to_owned()).collect(),
        now: parse_time("2026-01-02T00:00:00Z").unwrap(),
    }
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
    assert!(unrecorded_deletes(&plan(&["old.txt"], &[]), &recorded, &d.id).is_none());

    let refused = unrecorded_deletes(&plan(&["old.txt", "stray.txt"], &[]), &recorded, &d.id)
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
    let refused = unrecorded_deletes(&plan(&["a"], &["b"]), &legacy, &d.id).expect("a refusal");
    assert_eq!(refused.unmanaged, ["a", "b"]);
}

fn head(size: u64, intent: Option<&str>) -> Head {
    Head {
        size,
        etag: ETag("\"e\"".into()),
        sha256: None,
        intent: intent.map(str::to_owned),
        last_modified: parse_time(WHEN).unwrap(),
        served: Default::default(),
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
        ("folder", head(2, None)),
    ]
    .into_iter()
    .map(|(k, h)| (k.to_owned(), h))
    .collect();
    let touched: BTreeMap<String, Entry> = [
        ("written.txt", Entry::File { size: 70 }),
        ("deleted.txt", Entry::Missing),
        ("new-by-earlier.txt", Entry::File { size: 1 }),
        ("folder", Entry::Dir),
    ]
    .into_iter()
    .map(|(k, e)| (k.to_owned(), e))
    .collect();
    let state = catalog(&[record("recorded.txt", "p/web", "r")]);
    let cases = [
        // An object nobody records: the planner refuses over it.
        ("theirs.txt", Some(5)),
        // An earlier bundle writes it: its size, not the HEAD's.
        ("written.txt", Some(70)),
        ("new-by-earlier.txt", Some(1)),
        // Recorded: seen even though a publication wrote it.
        ("recorded.txt", Some(4)),
        // A folder of an earlier bundle's output is no object: the HEAD.
        ("folder", Some(2)),
        // Deleted by an earlier bundle, absent, or an unrecorded object of
        // a publication in flight (left to the conditional create).
        ("deleted.txt", None),
        ("absent.txt", None),
        ("in-flight.txt", None),
    ];
    for (path, want) in cases {
        assert_eq!(size_at(path, &touched, &heads, &state), want, "{path}");
    }
}

#[test]
fn an_object_is_kept_only_with_its_bytes_and_the_headers_the_rules_give() {
    use crate::plan::Desired;
    use crate::s3::headers::{HeaderRule, HeaderRules, Served};
    let body = "<p>hi</p>";
    let r = record("a/index.html", "p/web", body);
    let state = catalog(std::slice::from_ref(&r));
    let desired = Desired {
        path: r.path.clone(),
        kind: OutputKind::Source,
        bundle_path: r.path.clone(),
        transform: None,
        url: None,
        sha256: r.sha256,
        size: r.size,
    };
    let rules = HeaderRules::new(vec![
        HeaderRule::new("**/*.html", Some("no-cache".into()), None, None).unwrap(),
    ])
    .unwrap();
    let served = |ct: &str, cc: Option<&str>| Served {
        content_type: Some(ct.to_owned()),
        cache_control: cc.map(str::to_owned),
        content_disposition: None,
    };
    let stored = |size: u64, sha: Option<&str>, served: Served| Head {
        sha256: sha.map(str::to_owned),
        served,
        ..head(size, None)
    };
    let sha = r.sha256.to_string();
    let html = "text/html; charset=utf-8";
    let cases = [
        (
            "as the rules give",
            stored(r.size, Some(&sha), served(html, Some("no-cache"))),
            &rules,
            true,
        ),
        (
            "without rules now",
            stored(r.size, Some(&sha), served(html, None)),
            &HeaderRules::default(),
            true,
        ),
        (
            "a rule added since",
            stored(r.size, Some(&sha), served(html, None)),
            &rules,
            false,
        ),
        (
            "a rule changed since",
            stored(r.size, Some(&sha), served(html, Some("max-age=60"))),
            &rules,
            false,
        ),
        (
            "an older type",
            stored(r.size, Some(&sha), served("text/html", Some("no-cache"))),
            &rules,
            false,
        ),
        (
            "a disposition nobody set",
            stored(
                r.size,
                Some(&sha),
                Served {
                    content_disposition: Some("attachment".into()),
                    ..served(html, Some("no-cache"))
                },
            ),
            &rules,
            false,
        ),
        (
            "other bytes",
            stored(r.size, Some("sha256:other"), served(html, Some("no-cache"))),
            &rules,
            false,
        ),
        (
            "no sha256 metadata",
            stored(r.size, None, served(html, Some("no-cache"))),
            &rules,
            false,
        ),
    ];
    for (what, h, rules, kept) in cases {
        assert_eq!(
            already_there(&state, Some(&h), &desired, rules),
            kept,
            "{what}"
        );
    }
    assert!(!already_there(&state, None, &desired, &rules), "no object");
    let unrecorded = catalog(&[]);
    let h = stored(r.size, Some(&sha), served(html, Some("no-cache")));
    assert!(
        !already_there(&unrecorded, Some(&h), &desired, &rules),
        "no record"
    );
}
