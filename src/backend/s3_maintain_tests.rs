//! An s3 root opened for maintenance, against `object_store`'s in-memory
//! store, which has the same conditional semantics as S3: `prune`'s
//! commit racing a publisher that committed after the catalog was read,
//! the catalog swap of `reconcile-state` losing such a race, and the
//! parallel re-hashing `verify` uses.

use std::sync::Arc;

use object_store::memory::InMemory;

use super::{open_on, reserved};
use crate::backend::s3::S3Bucket;
use crate::backend::{Access, Change, MaintainRoot};
use crate::catalog::{Catalog, OutputKind, OutputRecord, SourceIdentity, State, parse_time};
use crate::config::{S3Location, Workflow};
use crate::fs::hashing::hash_bytes;
use crate::paths::RelPath;
use crate::s3::S3Root;
use crate::s3::protocol::{self, Settings, Write};

fn memory_root() -> Arc<S3Root> {
    Arc::new(
        S3Root::with_store(
            Arc::new(InMemory::new()),
            "site",
            "s3://memory/site".into(),
            format!("memory {}", crate::s3::random_id()),
        )
        .expect("runtime"),
    )
}

/// `root` opened for a maintenance command.
fn opened(root: &Arc<S3Root>, access: Access) -> S3Bucket {
    let location = S3Location {
        bucket: "memory".into(),
        path: "site".into(),
        endpoint: None,
        region: "us-east-1".into(),
    };
    let d = crate::backend::s3::tests::destination(Workflow::Additive);
    open_on(&d, &location, root.clone(), access).unwrap()
}

fn record(path: &str, body: &str) -> OutputRecord {
    let when = parse_time("2026-01-01T00:00:00Z").unwrap();
    let h = hash_bytes(body.as_bytes());
    OutputRecord {
        path: RelPath::parse(path).unwrap(),
        pipeline_id: "p".into(),
        destination_id: "d".into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: "s".into(),
            digest: h.sha256.clone(),
            created: when,
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: crate::catalog::Sha256::parse(&h.sha256).unwrap(),
        size: h.size,
        created_at: when,
        updated_at: when,
    }
}

fn with(state: &State, r: &OutputRecord) -> Catalog {
    let mut c = match state {
        State::Catalog(c) => c.clone(),
        _ => Catalog::new(parse_time("2026-01-01T00:00:00Z").unwrap()),
    };
    c.outputs.retain(|o| o.path != r.path);
    c.outputs.push(r.clone());
    c.sort();
    c
}

/// Publishes `body` at `path` (a replacement when it is recorded).
fn publish(root: &S3Root, path: &str, body: &'static str) {
    let base = root.read_state().unwrap();
    let r = record(path, body);
    let replaces = match &base.state {
        State::Catalog(c) => c.get(path).map(|r| r.sha256.to_string()),
        _ => None,
    };
    let write = Write {
        path: path.to_owned(),
        sha256: r.sha256.to_string(),
        source: Box::new(body.as_bytes()),
        replaces,
        served: Default::default(),
    };
    let next = with(&base.state, &r);
    protocol::commit(
        root,
        Settings::default(),
        base,
        next,
        vec![write],
        vec![],
        &mut |latest| Some(with(latest, &r)),
    )
    .unwrap();
}

fn catalog(root: &S3Root) -> Catalog {
    match root.read_state().unwrap().state {
        State::Catalog(c) => c,
        other => panic!("{other:?}"),
    }
}

fn paths(root: &S3Root) -> Vec<String> {
    catalog(root)
        .outputs
        .iter()
        .map(|r| r.path.as_str().to_owned())
        .collect()
}

fn now() -> time::OffsetDateTime {
    parse_time("2026-06-01T00:00:00Z").unwrap()
}

/// The change that prunes `paths` of the catalog `target` reads.
fn pruning(target: &mut S3Bucket, paths: &[&str]) -> Change<'static> {
    let read = target.read_catalog().unwrap().expect("a catalog");
    let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
    Change::deleting(read, &paths, ("p", "d"), now())
}

#[test]
fn prune_keeps_a_publication_committed_after_it_read_the_catalog() {
    let root = memory_root();
    publish(&root, "old.md", "old");
    let mut target = opened(&root, Access::Write);
    let change = pruning(&mut target, &["old.md"]);
    // Another host commits between prune's read and its compare-and-swap.
    publish(&root, "new.md", "new");
    target.delete_owned(change).unwrap();
    assert_eq!(paths(&root), ["new.md"], "the publication is kept");
    assert!(
        root.head("old.md").unwrap().is_none(),
        "pruned object deleted"
    );
    assert!(root.head("new.md").unwrap().is_some());
    assert_eq!(
        protocol::pending_intents(&root).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn prune_gives_up_when_a_publisher_changed_a_selected_record() {
    let root = memory_root();
    publish(&root, "old.md", "old");
    let mut target = opened(&root, Access::Write);
    let change = pruning(&mut target, &["old.md"]);
    // The selected output is published again meanwhile: it is new now.
    publish(&root, "old.md", "fresh");
    let e = target.delete_owned(change).unwrap_err();
    assert!(e.lost_race(), "{e:?}");
    let c = catalog(&root);
    assert_eq!(paths(&root), ["old.md"], "the new record stays");
    assert_eq!(c.outputs[0].sha256, hash_bytes(b"fresh").sha256);
    let (h, _) = root.get_hashed("old.md").unwrap().unwrap();
    assert_eq!(h.sha256, c.outputs[0].sha256, "its object stays");
    assert_eq!(
        protocol::pending_intents(&root).unwrap(),
        Vec::<String>::new()
    );
    // Read again, the record is selected again, and goes.
    let change = pruning(&mut target, &["old.md"]);
    target.delete_owned(change).unwrap();
    assert!(paths(&root).is_empty());
    assert!(root.head("old.md").unwrap().is_none());
}

#[test]
fn a_catalog_swap_loses_to_a_publication_committed_after_it_was_read() {
    let root = memory_root();
    publish(&root, "gone.md", "gone");
    let mut target = opened(&root, Access::Write);
    let mut read = target.read_catalog().unwrap().expect("a catalog");
    let read_at = read.updated_at;
    publish(&root, "new.md", "new");
    read.outputs.clear();
    read.updated_at = now();
    let e = target.swap_catalog(read.clone(), read_at).unwrap_err();
    assert!(e.lost_race(), "{e:?}");
    assert_eq!(paths(&root), ["gone.md", "new.md"], "nothing was dropped");
    // On the catalog read again, the swap goes through.
    let mut read = target.read_catalog().unwrap().expect("a catalog");
    let read_at = read.updated_at;
    read.outputs.retain(|r| r.path.as_str() != "gone.md");
    read.updated_at = read_at;
    target.swap_catalog(read, read_at).unwrap();
    assert_eq!(paths(&root), ["new.md"]);
    assert!(
        catalog(&root).updated_at > read_at,
        "a swapped catalog is always newer than the one it replaces"
    );
}

#[test]
fn a_read_only_opening_writes_nothing_and_reports_what_is_in_flight() {
    let root = memory_root();
    publish(&root, "a.md", "a");
    let before = root.list("").unwrap().len();
    let mut target = opened(&root, Access::Read);
    assert!(target.read_catalog().unwrap().is_some());
    assert!(target.in_flight(true).unwrap().is_empty());
    let survey = target.survey().unwrap();
    assert_eq!(
        survey.keys().collect::<Vec<_>>(),
        ["a.md"],
        "the catalog is not an output"
    );
    let absent = target
        .confirm_absent(vec!["a.md".into(), "b.md".into()])
        .unwrap();
    assert_eq!(absent, ["b.md"]);
    assert_eq!(root.list("").unwrap().len(), before);
}

#[test]
fn reserved_keys_are_the_tools_own_at_any_depth() {
    for (key, want) in [
        (".distributor.json", true),
        (".distributor-pending/abc.json", true),
        (".distributor-clock-1", true),
        ("a/.distributor.json", true),
        ("a/b.html", false),
        ("distributor.json", false),
        (".hidden", false),
    ] {
        assert_eq!(reserved(key), want, "{key}");
    }
}

#[test]
fn get_hashed_all_keeps_the_order_and_reports_missing_objects() {
    let root = memory_root();
    for (path, body) in [("a", "A"), ("b", "BB"), ("c", "CCC")] {
        root.put_new(path, &mut body.as_bytes(), None, "i").unwrap();
    }
    let got = root
        .get_hashed_all(&["c", "gone", "a", "b", "c"], 2)
        .unwrap();
    let got: Vec<Option<(String, u64)>> = got
        .into_iter()
        .map(|g| g.map(|(h, _)| (h.sha256, h.size)))
        .collect();
    let h = |b: &[u8]| Some((hash_bytes(b).sha256, b.len() as u64));
    assert_eq!(got, [h(b"CCC"), None, h(b"A"), h(b"BB"), h(b"CCC")]);
    assert_eq!(root.get_hashed_all(&[], 8).unwrap().len(), 0);
}
