//! The commit protocol against the in-memory store: each guarantee of
//! docs/contract.md §15.4 as a scenario, with kills and pauses simulated by stopping
//! between steps.

use std::time::Duration;

use time::OffsetDateTime;

use object_store::ObjectStoreExt as _;

use super::super::tests::memory_root;
use super::*;
use crate::catalog::{OutputKind, OutputRecord, SourceIdentity};
use crate::fs::hashing::hash_bytes;
use crate::paths::RelPath;

fn now() -> OffsetDateTime {
    time::macros::datetime!(2026-06-04 12:00 UTC)
}

fn record(path: &str, bytes: &[u8]) -> OutputRecord {
    let h = hash_bytes(bytes);
    OutputRecord {
        path: RelPath::parse(path).unwrap(),
        pipeline_id: "p".into(),
        destination_id: "d".into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: "s".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            created: now(),
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: crate::catalog::Sha256::parse(&h.sha256).unwrap(),
        size: h.size,
        created_at: now(),
        updated_at: now(),
    }
}

/// `base`'s catalog (or a new one) with `records` upserted and `removed`
/// dropped: what the engine's planner would hand over.
fn catalog_with(base: &State, records: &[OutputRecord], removed: &[&str]) -> Catalog {
    let mut c = match base {
        State::Catalog(c) => c.clone(),
        _ => Catalog::new(now()),
    };
    c.outputs.retain(|r| {
        !removed.contains(&r.path.as_str()) && !records.iter().any(|n| n.path == r.path)
    });
    c.outputs.extend(records.iter().cloned());
    c.sort();
    c
}

fn write<'a>(path: &str, bytes: &'a [u8], replaces: Option<&[u8]>) -> Write<'a> {
    Write {
        path: path.to_owned(),
        sha256: hash_bytes(bytes).sha256,
        source: Box::new(bytes),
        replaces: replaces.map(|b| hash_bytes(b).sha256),
        served: Default::default(),
    }
}

fn catalog(root: &S3Root) -> Catalog {
    match root.read_state().unwrap().state {
        State::Catalog(c) => c,
        other => panic!("no valid catalog: {other:?}"),
    }
}

fn paths(root: &S3Root) -> Vec<String> {
    root.list("").unwrap().into_iter().map(|l| l.path).collect()
}

fn never(_: &State) -> Option<Catalog> {
    None
}

/// Publishes `files` as new keys onto whatever the root holds.
/// Commits `writes` (no deletes) with the default settings, never rebasing.
fn commit_writes(
    root: &S3Root,
    base: Base,
    next: Catalog,
    writes: Vec<Write<'_>>,
) -> Result<CommittedVersion, Error> {
    commit(
        root,
        Settings::default(),
        base,
        next,
        writes,
        vec![],
        &mut never,
    )
}

fn publish(root: &S3Root, files: &[(&str, &[u8])]) -> CommittedVersion {
    let base = root.read_state().unwrap();
    let records: Vec<_> = files.iter().map(|(p, b)| record(p, b)).collect();
    let next = catalog_with(&base.state, &records, &[]);
    let writes = files.iter().map(|(p, b)| write(p, b, None)).collect();
    commit_writes(root, base, next, writes).unwrap()
}

#[test]
fn a_publication_writes_its_objects_then_the_catalog_and_leaves_no_intent() {
    let root = memory_root("site");
    let done = publish(&root, &[("a.html", b"A"), ("dir/b.txt", b"B")]);
    assert_eq!(done.rebases, 0);
    assert_eq!(paths(&root), [".distributor.json", "a.html", "dir/b.txt"]);
    let c = catalog(&root);
    assert_eq!(c.outputs.len(), 2);
    for r in &c.outputs {
        let (hashed, _) = root.get_hashed(r.path.as_str()).unwrap().unwrap();
        assert_eq!(
            (hashed.sha256.as_str(), hashed.size),
            (r.sha256.to_string().as_str(), r.size)
        );
    }
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
}

#[test]
fn a_replacement_overwrites_recorded_objects_and_deletes_dropped_ones_after_the_commit() {
    let root = memory_root("");
    publish(&root, &[("a", b"old a"), ("gone", b"G"), ("other", b"O")]);
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("a", b"new a")], &["gone"]);
    let deletes = vec![Delete {
        path: "gone".into(),
        sha256: hash_bytes(b"G").sha256,
    }];
    let writes = vec![write("a", b"new a", Some(b"old a"))];
    commit(
        &root,
        Settings::default(),
        base,
        next,
        writes,
        deletes,
        &mut never,
    )
    .unwrap();
    assert_eq!(paths(&root), [".distributor.json", "a", "other"]);
    let (a, _) = root.get_hashed("a").unwrap().unwrap();
    assert_eq!(a, hash_bytes(b"new a"));
    assert_eq!(catalog(&root).get("a").unwrap().sha256, a.sha256);
}

#[test]
fn every_catalog_version_has_new_bytes() {
    // The same content twice in the same instant still changes updated_at,
    // so a version (ETag) never comes back and fencing holds.
    let root = memory_root("");
    publish(&root, &[("a", b"A")]);
    let first = root.read_catalog().unwrap().unwrap();
    let base = root.read_state().unwrap();
    let same = catalog_with(&base.state, &[], &[]);
    commit_writes(&root, base, same, vec![]).unwrap();
    let second = root.read_catalog().unwrap().unwrap();
    assert_ne!(first.0, second.0);
    assert!(catalog(&root).updated_at > now());
}

#[test]
fn a_lost_compare_and_swap_is_rebased_onto_the_winner() {
    let root = memory_root("");
    publish(&root, &[("x", b"X")]);
    let base = root.read_state().unwrap(); // we read, then another host commits
    publish(&root, &[("c", b"C")]);
    let mine = record("b", b"B");
    let next = catalog_with(&base.state, std::slice::from_ref(&mine), &[]);
    let mut rebase = |latest: &State| Some(catalog_with(latest, std::slice::from_ref(&mine), &[]));
    let done = commit(
        &root,
        Settings::default(),
        base,
        next,
        vec![write("b", b"B", None)],
        vec![],
        &mut rebase,
    )
    .unwrap();
    assert_eq!(done.rebases, 1);
    let c = catalog(&root);
    let recorded: Vec<&str> = c.outputs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(recorded, ["b", "c", "x"], "no update is lost");
}

#[test]
fn a_publication_that_no_longer_fits_is_undone() {
    let root = memory_root("");
    publish(&root, &[("x", b"X")]);
    let base = root.read_state().unwrap();
    publish(&root, &[("c", b"C")]);
    let next = catalog_with(&base.state, &[record("b", b"B")], &[]);
    let r = commit_writes(&root, base, next, vec![write("b", b"B", None)]);
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(
        paths(&root),
        [".distributor.json", "c", "x"],
        "b was removed again"
    );
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
}

#[test]
fn an_unmanaged_object_is_never_overwritten() {
    let root = memory_root("");
    // Someone else's object, not recorded, written by another tool.
    let store = std::sync::Arc::clone(&root.store);
    root.block_on(store.put(&root.key("taken"), b"theirs".to_vec().into()))
        .unwrap();
    let base = root.read_state().unwrap();
    let next = catalog_with(
        &base.state,
        &[record("a", b"A"), record("taken", b"mine")],
        &[],
    );
    let writes = vec![write("a", b"A", None), write("taken", b"mine", None)];
    let r = commit_writes(&root, base, next, writes);
    assert!(
        matches!(r, Err(Error::Exists { ref key, .. }) if key == "taken"),
        "{r:?}"
    );
    assert!(!r.unwrap_err().is_transient());
    let (theirs, _) = root.get_hashed("taken").unwrap().unwrap();
    assert_eq!(theirs, hash_bytes(b"theirs"));
    assert_eq!(
        paths(&root),
        ["taken"],
        "a was undone, nothing else written"
    );
}

/// A recorded object that another tool changed (no intent in its
/// metadata) is the owner's, as a file in a local root is: the next write
/// of that path replaces it, conditionally on the version found.
#[test]
fn a_recorded_object_another_tool_changed_is_written_again() {
    let root = memory_root("");
    publish(&root, &[("a", b"A")]);
    let store = std::sync::Arc::clone(&root.store);
    root.block_on(store.put(&root.key("a"), b"changed".to_vec().into()))
        .unwrap();
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("a", b"A2")], &[]);
    let r = commit_writes(&root, base, next, vec![write("a", b"A2", Some(b"A"))]);
    assert!(r.is_ok(), "{r:?}");
    let (a, _) = root.get_hashed("a").unwrap().unwrap();
    assert_eq!(a, hash_bytes(b"A2"));
    assert_eq!(catalog(&root).outputs[0].sha256, hash_bytes(b"A2").sha256);
}

/// A recorded object that another tool deleted is created again by the
/// next write of that path (`If-None-Match: *`).
#[test]
fn a_recorded_object_another_tool_deleted_is_written_again() {
    let root = memory_root("site");
    publish(&root, &[("gone.txt", b"A")]);
    root.delete("gone.txt").unwrap();
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("gone.txt", b"A")], &[]);
    let r = commit_writes(&root, base, next, vec![write("gone.txt", b"A", Some(b"A"))]);
    assert!(r.is_ok(), "{r:?}");
    let (a, _) = root.get_hashed("gone.txt").unwrap().unwrap();
    assert_eq!(a, hash_bytes(b"A"));
}

/// A recorded object that another publication overwrote (its metadata
/// names an intent) is not overwritten: the retry plans on the catalog
/// that publication leaves.
#[test]
fn a_recorded_object_another_publication_wrote_is_not_overwritten() {
    let root = memory_root("");
    publish(&root, &[("a", b"A")]);
    // Another publication's object at "a", its intent finished and gone,
    // its catalog not yet read by this one.
    root.put_replace(
        "a",
        &mut &b"theirs"[..],
        &root.head("a").unwrap().unwrap().etag,
        None,
        "0123456789abcdef0123456789abcdef",
    )
    .unwrap();
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("a", b"A2")], &[]);
    let r = commit_writes(&root, base, next, vec![write("a", b"A2", Some(b"A"))]);
    assert!(matches!(r, Err(Error::Changed { .. })), "{r:?}");
    assert!(r.unwrap_err().is_transient());
    let (a, _) = root.get_hashed("a").unwrap().unwrap();
    assert_eq!(a, hash_bytes(b"theirs"));
}

/// A publisher killed after writing an intent, a new object and an
/// overwrite, before its compare-and-swap.
fn killed_publisher(root: &S3Root) -> String {
    publish(root, &[("kept", b"K"), ("over", b"old")]);
    let intent = Intent {
        id: random_id(),
        owner: "test".into(),
        renewals: 0,
        revoked: false,
        spool: None,
        writes: vec![
            IntentWrite {
                path: "orphan".into(),
                sha256: hash_bytes(b"N").sha256,
                replaces: false,
            },
            IntentWrite {
                path: "over".into(),
                sha256: hash_bytes(b"new").sha256,
                replaces: true,
            },
        ],
        deletes: vec![],
    };
    let session = Session::begin(root, Settings::default(), intent).unwrap();
    let id = session.intent.id.clone();
    root.put_new(
        "orphan",
        &mut &b"N"[..],
        Some(&hash_bytes(b"N").sha256),
        &id,
    )
    .unwrap();
    let etag = root.head("over").unwrap().unwrap().etag;
    root.put_replace("over", &mut &b"new"[..], &etag, None, &id)
        .unwrap();
    drop(session); // killed: no compare-and-swap, no clean-up
    id
}

#[test]
fn a_live_intent_is_left_alone_and_blocks_its_keys_transiently() {
    let root = memory_root("");
    let id = killed_publisher(&root);
    let live = id.clone();
    assert_eq!(recover(&root, Settings::default(), &id).unwrap(), None);
    // Another publisher wanting "orphan" waits (transient), it does not fail
    // the bundle as unmanaged.
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("orphan", b"mine")], &[]);
    let r = commit_writes(&root, base, next, vec![write("orphan", b"mine", None)]);
    assert!(
        matches!(r, Err(Error::Claimed { ref id, ref owner, .. }) if *id == live && owner == "test"),
        "{r:?}"
    );
    let e = r.unwrap_err();
    assert!(
        e.is_transient() && e.stage() == crate::report::Stage::Lock,
        "{e:?}"
    );
    assert!(e.to_string().contains("still running"), "{e}");
    // The same for a recorded object it overwrote.
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("over", b"mine")], &[]);
    let r = commit_writes(
        &root,
        base,
        next,
        vec![write("over", b"mine", Some(b"old"))],
    );
    assert!(
        matches!(r, Err(Error::Claimed { ref key, .. }) if key == "over"),
        "{r:?}"
    );
}

#[test]
fn a_stale_intent_is_recovered_by_anyone() {
    let root = memory_root("");
    let id = killed_publisher(&root);
    let before = catalog(&root);
    let stale = Settings {
        lease: Duration::ZERO,
        ..Settings::default()
    };
    let done = recover(&root, stale, &id).unwrap().unwrap();
    assert_eq!(done.deleted, ["orphan"]);
    assert_eq!(done.adopted, ["over"]);
    assert_eq!(paths(&root), [".distributor.json", "kept", "over"]);
    let after = catalog(&root);
    assert!(
        after.updated_at > before.updated_at,
        "the catalog was fenced"
    );
    // Every record matches its object again.
    for r in &after.outputs {
        let (h, _) = root.get_hashed(r.path.as_str()).unwrap().unwrap();
        assert_eq!(
            (h.sha256.as_str(), h.size),
            (r.sha256.to_string().as_str(), r.size),
            "{}",
            r.path
        );
    }
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
    // Recovering again finds nothing to do.
    assert_eq!(recover(&root, stale, &id).unwrap(), None);
}

#[test]
fn a_paused_publisher_cannot_commit_after_it_was_recovered() {
    let root = memory_root("");
    publish(&root, &[("kept", b"K")]);
    let base = root.read_state().unwrap();
    let intent = Intent {
        id: random_id(),
        owner: "paused".into(),
        renewals: 0,
        revoked: false,
        spool: None,
        writes: vec![IntentWrite {
            path: "late".into(),
            sha256: hash_bytes(b"L").sha256,
            replaces: false,
        }],
        deletes: vec![],
    };
    // Renews before every step, but its lease expires at once for others.
    let settings = Settings {
        lease: Duration::ZERO,
        renew_every: Duration::from_secs(3600),
    };
    let mut session = Session::begin(&root, settings, intent).unwrap();
    let id = session.intent.id.clone();
    root.put_new("late", &mut &b"L"[..], None, &id).unwrap();
    // ... the publisher is paused; another host recovers its intent.
    let done = recover(&root, settings, &id).unwrap().unwrap();
    assert_eq!(done.deleted, ["late"]);
    // It wakes up and tries to commit what it had: the fence stops it.
    let next = catalog_with(&base.state, &[record("late", b"L")], &[]);
    let r = run(&mut session, base, next, vec![], &[], &mut never);
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert!(catalog(&root).get("late").is_none());
    assert_eq!(paths(&root), [".distributor.json", "kept"]);
    // And a renewal of its lease fails too.
    session.renewed = std::time::Instant::now() - Duration::from_secs(7200);
    assert!(session.keep_alive().is_err());
}

#[test]
fn a_committed_publication_killed_before_its_deletes_is_finished() {
    let root = memory_root("");
    publish(&root, &[("stay", b"S"), ("drop", b"D")]);
    let base = root.read_state().unwrap();
    let intent = Intent {
        id: random_id(),
        owner: "t".into(),
        renewals: 0,
        revoked: false,
        spool: None,
        writes: vec![],
        deletes: vec![Delete {
            path: "drop".into(),
            sha256: hash_bytes(b"D").sha256,
        }],
    };
    let session = Session::begin(&root, Settings::default(), intent).unwrap();
    let id = session.intent.id.clone();
    // The compare-and-swap happened, then the kill.
    root.swap(catalog_with(&base.state, &[], &["drop"]), &base)
        .unwrap();
    drop(session);
    let stale = Settings {
        lease: Duration::ZERO,
        ..Settings::default()
    };
    let done = recover(&root, stale, &id).unwrap().unwrap();
    assert_eq!(done.finished_deletes, ["drop"]);
    assert_eq!(paths(&root), [".distributor.json", "stay"]);
}

#[test]
fn a_rebase_is_refused_when_the_winner_touched_our_paths() {
    let root = memory_root("");
    publish(&root, &[("a", b"A")]);
    let base = root.read_state().unwrap();
    // The winner replaces "a" after we planned our own replacement of it.
    {
        let b2 = root.read_state().unwrap();
        let next = catalog_with(&b2.state, &[record("a", b"A by winner")], &[]);
        let w = vec![write("a", b"A by winner", Some(b"A"))];
        commit(&root, Settings::default(), b2, next, w, vec![], &mut never).unwrap();
    }
    // We had planned to drop "a" and add "b" (a replacement).
    let mine = record("b", b"B");
    let next = catalog_with(&base.state, std::slice::from_ref(&mine), &["a"]);
    let mut rebase =
        |latest: &State| Some(catalog_with(latest, std::slice::from_ref(&mine), &["a"]));
    let deletes = vec![Delete {
        path: "a".into(),
        sha256: hash_bytes(b"A").sha256,
    }];
    let r = commit(
        &root,
        Settings::default(),
        base,
        next,
        vec![write("b", b"B", None)],
        deletes,
        &mut rebase,
    );
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    // The winner's "a" stays recorded and in place; our "b" was undone.
    assert_eq!(paths(&root), [".distributor.json", "a"]);
    let c = catalog(&root);
    assert_eq!(
        c.get("a").unwrap().sha256,
        hash_bytes(b"A by winner").sha256
    );
    let (a, _) = root.get_hashed("a").unwrap().unwrap();
    assert_eq!(a, hash_bytes(b"A by winner"));
}

#[test]
fn rebase_is_allowed_only_for_untouched_paths() {
    let base = State::Catalog(catalog_with(&State::Absent, &[record("a", b"A")], &[]));
    let other = State::Catalog(catalog_with(&base, &[record("b", b"B")], &[]));
    let changed_a = State::Catalog(catalog_with(&base, &[record("a", b"A2")], &[]));
    let dropped_a = State::Catalog(catalog_with(&base, &[], &["a"]));
    for (latest, paths, allowed) in [
        (&other, vec!["a", "c"], true),
        (&changed_a, vec!["a"], false),
        (&changed_a, vec!["c"], true),
        (&dropped_a, vec!["a"], false),
        (&State::Absent, vec!["c"], false),
        (&State::Invalid { reason: "x".into() }, vec!["c"], false),
    ] {
        assert_eq!(rebase_allowed(&base, latest, &paths), allowed, "{paths:?}");
    }
    assert!(rebase_allowed(&State::Absent, &other, &["c"]));
}

#[test]
fn stale_intents_are_found_and_recovered_in_one_call() {
    let root = memory_root("");
    let id = killed_publisher(&root);
    assert_eq!(pending_intents(&root).unwrap(), std::slice::from_ref(&id));
    assert!(
        recover_stale(&root, Settings::default())
            .unwrap()
            .is_empty(),
        "still live"
    );
    let stale = Settings {
        lease: Duration::ZERO,
        ..Settings::default()
    };
    let done = recover_stale(&root, stale).unwrap();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, id);
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
}

#[test]
fn the_leftover_of_a_revoked_publication_is_removed_not_reported_as_unmanaged() {
    let root = memory_root("");
    publish(&root, &[("kept", b"K")]);
    // Written by a publication whose intent no longer exists (it was
    // recovered while paused, then wrote once more and died).
    root.put_new("late", &mut &b"L"[..], None, "gone-intent")
        .unwrap();
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[record("late", b"mine")], &[]);
    let r = commit_writes(&root, base, next, vec![write("late", b"mine", None)]);
    assert!(matches!(r, Err(Error::Changed { .. })), "transient: {r:?}");
    assert_eq!(
        paths(&root),
        [".distributor.json", "kept"],
        "the leftover is gone"
    );
    // The retry succeeds.
    publish(&root, &[("late", b"mine")]);
    assert!(catalog(&root).get("late").is_some());
}

#[test]
fn a_new_key_another_publication_created_and_committed_first_is_a_transient_conflict() {
    let root = memory_root("");
    publish(&root, &[("kept", b"K")]);
    // Planned while "both" was unrecorded; another host creates and
    // commits it first (its intent is gone, its catalog records the key).
    let base = root.read_state().unwrap();
    publish(&root, &[("both", b"theirs")]);
    let next = catalog_with(&base.state, &[record("both", b"mine")], &[]);
    let r = commit_writes(&root, base, next, vec![write("both", b"mine", None)]);
    assert!(
        matches!(r, Err(Error::Changed { ref key, .. }) if key == "both"),
        "not an unmanaged object: a retry plans on the new catalog: {r:?}"
    );
    let (theirs, _) = root.get_hashed("both").unwrap().unwrap();
    assert_eq!(theirs, hash_bytes(b"theirs"), "the winner's object stays");
    assert!(catalog(&root).get("both").is_some());
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
}

#[test]
fn a_stale_intent_met_on_a_new_key_is_recovered_then_the_retry_succeeds() {
    let root = memory_root("");
    let id = killed_publisher(&root);
    let stale = Settings {
        lease: Duration::ZERO,
        ..Settings::default()
    };
    let base = root.read_state().unwrap();
    let mine = record("orphan", b"mine");
    let next = catalog_with(&base.state, std::slice::from_ref(&mine), &[]);
    let r = commit(
        &root,
        stale,
        base,
        next,
        vec![write("orphan", b"mine", None)],
        vec![],
        &mut never,
    );
    assert!(matches!(r, Err(Error::Changed { .. })), "{r:?}");
    assert!(
        root.read_intent(&id).unwrap().is_none(),
        "recovered on the way"
    );
    publish(&root, &[("orphan", b"mine")]);
    let (h, _) = root.get_hashed("orphan").unwrap().unwrap();
    assert_eq!(h, hash_bytes(b"mine"));
}

/// A source that, once the first part has been read, lets "another host"
/// recover every intent as if its lease had run out.
struct RecoveredMidway {
    inner: super::super::tests::Pattern,
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    done: bool,
}

impl std::io::Read for RecoveredMidway {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.done && self.inner.at >= super::super::upload::PART_SIZE as u64 {
            self.done = true;
            let store = std::sync::Arc::clone(&self.store);
            // Another process: its own client and runtime, on its own thread.
            std::thread::spawn(move || {
                let other = S3Root::with_store(store, "", "other".into(), "other".into()).unwrap();
                let stale = Settings {
                    lease: Duration::ZERO,
                    ..Settings::default()
                };
                recover_stale(&other, stale).unwrap()
            })
            .join()
            .unwrap();
        }
        self.inner.read(buf)
    }
}

#[test]
fn a_long_upload_renews_its_lease_and_stops_when_it_was_taken_over() {
    let root = memory_root("");
    let len = 3 * super::super::upload::PART_SIZE as u64;
    let source = RecoveredMidway {
        inner: super::super::tests::Pattern { left: len, at: 0 },
        store: std::sync::Arc::clone(&root.store),
        done: false,
    };
    let mut big = record("big", b"");
    big.size = len;
    let w = Write {
        path: "big".into(),
        sha256: "sha256:unused-the-upload-stops-first".into(),
        source: Box::new(source),
        replaces: None,
        served: Default::default(),
    };
    let base = root.read_state().unwrap();
    let next = catalog_with(&base.state, &[big], &[]);
    let settings = Settings {
        lease: Duration::from_secs(300),
        renew_every: Duration::ZERO, // renew before every part
    };
    let r = commit(&root, settings, base, next, vec![w], vec![], &mut never);
    let e = r.unwrap_err();
    assert!(
        e.to_string().contains("paused longer than the lease"),
        "{e}"
    );
    assert!(
        e.is_transient() && e.stage() == crate::report::Stage::Lock,
        "retried, as a lost lock would be: {e:?}"
    );
    // Nothing of it is left: the recoverer removed the claimed key.
    assert_eq!(paths(&root), [".distributor.json"]);
    assert!(catalog(&root).outputs.is_empty());
}

#[test]
fn small_objects_go_up_together_around_a_large_one_and_stay_in_order() {
    // More small objects than go up at once, with a multipart one between
    // them: everything stored, hashes checked, reported in write order.
    let root = memory_root("site");
    let large: Vec<u8> = (0..super::super::upload::PART_SIZE + 3)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut files: Vec<(String, Vec<u8>)> = (0..2 * SMALL_IN_FLIGHT + 3)
        .map(|i| (format!("s/{i:02}.txt"), format!("small {i}").into_bytes()))
        .collect();
    files.insert(5, ("big.bin".to_owned(), large));
    let base = root.read_state().unwrap();
    let records: Vec<_> = files.iter().map(|(p, b)| record(p, b)).collect();
    let next = catalog_with(&base.state, &records, &[]);
    let writes = files.iter().map(|(p, b)| write(p, b, None)).collect();
    let done = commit_writes(&root, base, next, writes).unwrap();
    let order: Vec<&str> = done.written.iter().map(|(p, _)| p.as_str()).collect();
    let expected: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(order, expected);
    for (path, bytes) in &files {
        let (stored, _) = root.get_hashed(path).unwrap().unwrap();
        assert_eq!(stored, hash_bytes(bytes), "{path}");
    }
    assert_eq!(pending_intents(&root).unwrap(), Vec::<String>::new());
}

#[test]
fn a_small_object_whose_bytes_do_not_match_stores_nothing() {
    let root = memory_root("");
    let base = root.read_state().unwrap();
    let next = catalog_with(
        &base.state,
        &[record("a", b"A"), record("b", b"B"), record("c", b"C")],
        &[],
    );
    let mut bad = write("c", b"not C", None);
    bad.sha256 = hash_bytes(b"C").sha256;
    let writes = vec![write("a", b"A", None), write("b", b"B", None), bad];
    let r = commit_writes(&root, base, next, writes);
    assert!(
        matches!(r, Err(Error::HashMismatch { ref key, .. }) if key == "c"),
        "{r:?}"
    );
    assert_eq!(paths(&root), Vec::<String>::new(), "nothing stored");
}

#[test]
fn a_catalog_another_client_wrote_is_read_not_the_copy_kept() {
    // Two publishers (clients) on one bucket: each keeps the version it
    // last saw, and still reads the other's newer one.
    let one = memory_root("");
    let other = S3Root::with_store(
        std::sync::Arc::clone(&one.store),
        "",
        "s3://memory/other".into(),
        one.server.clone(),
    )
    .unwrap();
    publish(&one, &[("a", b"A")]);
    assert_eq!(catalog(&one).outputs.len(), 1, "its own write, kept");
    publish(&other, &[("b", b"B")]);
    let seen: Vec<String> = catalog(&one)
        .outputs
        .iter()
        .map(|r| r.path.as_str().to_owned())
        .collect();
    assert_eq!(seen, ["a", "b"]);
    assert_eq!(
        one.read_catalog().unwrap(),
        other.read_catalog().unwrap(),
        "same bytes and version"
    );
    // Gone altogether: read as gone, not as the kept copy.
    one.block_on(one.store.delete(&one.key(crate::s3::CATALOG_KEY)))
        .unwrap();
    assert_eq!(other.read_catalog().unwrap(), None);
}
