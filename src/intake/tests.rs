//! The intake's requests against `object_store`'s in-memory store: what a
//! probe reads, and what filing removes from the inbox. The agent's loop
//! and the real server are exercised by tests/integration/intake.rs.

use super::*;
use crate::s3::tests::memory_root;

fn bucket() -> Bucket {
    Bucket::over(memory_root("reports"))
}

/// Writes `rel` whether or not it exists (as a producer's upload does).
fn put(b: &Bucket, rel: &str, bytes: &[u8]) {
    match b.root.head(rel).unwrap() {
        Some(h) => b
            .root
            .put_replace(rel, &mut &bytes[..], &h.etag, None, "test"),
        None => b.root.put_new(rel, &mut &bytes[..], None, "test"),
    }
    .unwrap();
}

/// Delivers bundle `name` with `files`, its manifest last; returns the
/// manifest's bytes.
fn deliver(b: &Bucket, name: &str, files: &[(&str, &str)]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    for (path, body) in files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, body).unwrap();
        put(b, &Bucket::key(INBOX, name, path), body.as_bytes());
    }
    crate::bundle::seal(dir.path(), name, None).unwrap();
    let manifest = std::fs::read(dir.path().join(MANIFEST)).unwrap();
    put(b, &Bucket::key(INBOX, name, MANIFEST), &manifest);
    manifest
}

/// The paths left below `inbox/name/`.
fn left(b: &Bucket, name: &str) -> Vec<String> {
    let prefix = format!("{INBOX}/{name}/");
    let listed = b.root.list(&prefix).unwrap();
    listed
        .into_iter()
        .map(|o| o.path.strip_prefix(&prefix).unwrap().to_owned())
        .collect()
}

/// Files bundle `name` probed as `p` away from the inbox.
fn remove(b: &Bucket, name: &str, p: &Probe) -> usize {
    let now = b.inbox_now(name, &p.objects).unwrap();
    let version = p
        .manifest
        .as_ref()
        .map_or(ETag(String::new()), |m| m.0.clone());
    b.remove_unchanged(name, (&p.objects, &version), now.as_ref())
        .unwrap()
}

fn probe(b: &Bucket, name: &str, seen: Option<&Arrival>) -> Probe {
    b.probe(
        name,
        &Limits::default(),
        false,
        Known {
            objects: None,
            manifest: seen,
        },
    )
    .unwrap()
}

#[test]
fn a_look_keeps_small_manifests_within_its_budget() {
    let b = bucket();
    let one = deliver(&b, "one", &[("a.txt", "1\n")]);
    let two = deliver(&b, "two", &[("a.txt", "2\n")]);
    let all = b.arrivals(&["one", "none", "two"], usize::MAX).unwrap();
    let kept: Vec<Option<&Vec<u8>>> = all
        .iter()
        .map(|a| a.as_ref().and_then(|a| a.bytes.as_ref()))
        .collect();
    assert_eq!(kept, [Some(&one), None, Some(&two)]);
    // A budget for one: the first keeps its bytes, the second only its
    // version and arrival.
    let some = b.arrivals(&["one", "two"], one.len()).unwrap();
    assert_eq!(some[0].as_ref().unwrap().bytes.as_ref(), Some(&one));
    let second = some[1].as_ref().unwrap();
    assert_eq!(second.bytes, None);
    assert_eq!(second.etag, all[2].as_ref().unwrap().etag);
}

#[test]
fn a_probe_uses_the_manifest_the_look_read_only_while_the_listing_shows_it() {
    let b = bucket();
    deliver(&b, "x", &[("a.txt", "1\n")]);
    let seen = b.arrivals(&["x"], usize::MAX).unwrap()[0].clone().unwrap();
    // The same version: the bytes the look kept are the manifest (shown
    // here by keeping other bytes under its version).
    let mut other = seen.clone();
    other.bytes = Some(b"{ not a manifest".to_vec());
    assert!(matches!(
        probe(&b, "x", Some(&other)).state,
        State::Broken(_)
    ));
    assert_eq!(probe(&b, "x", Some(&seen)).state, State::Complete);
    // Delivered again since the look: the probe reads the new manifest.
    let again = deliver(&b, "x", &[("a.txt", "2\n"), ("b.txt", "2\n")]);
    let p = probe(&b, "x", Some(&other));
    assert_eq!(p.state, State::Complete);
    assert_eq!(p.manifest_bytes, again);
    assert_eq!(p.parsed.unwrap().files.len(), 2);
}

#[test]
fn filing_removes_what_the_probe_saw_and_leaves_a_new_delivery_whole() {
    // (what happened meanwhile, what is left, how many the filing left)
    type Meanwhile = fn(&Bucket);
    let cases: [(&str, Meanwhile, &[&str], usize); 4] = [
        ("nothing", |_| {}, &[], 0),
        (
            "a file replaced, the manifest not yet",
            |b| put(b, &Bucket::key(INBOX, "x", "a.txt"), b"new\n"),
            &["a.txt"],
            1,
        ),
        (
            "delivered again, a file the same in both",
            |b| {
                deliver(b, "x", &[("a.txt", "new\n"), ("same.txt", "s\n")]);
            },
            &["a.txt", "manifest.json", "only.txt", "same.txt"],
            4,
        ),
        (
            "a file deleted by someone else",
            |b| b.root.delete(&Bucket::key(INBOX, "x", "only.txt")).unwrap(),
            &[],
            0,
        ),
    ];
    for (what, meanwhile, want, kept) in cases {
        let b = bucket();
        let files = [("a.txt", "1\n"), ("only.txt", "1\n"), ("same.txt", "s\n")];
        deliver(&b, "x", &files);
        let p = probe(&b, "x", None);
        assert_eq!(p.state, State::Complete, "{what}");
        meanwhile(&b);
        assert_eq!(remove(&b, "x", &p), kept, "{what}");
        assert_eq!(left(&b, "x"), want, "{what}");
    }
}

#[test]
fn filing_leaves_a_new_delivery_of_more_objects_than_a_listing_page_whole() {
    let b = bucket();
    deliver(&b, "x", &[("a.txt", "1\n"), ("b.txt", "1\n")]);
    let p = probe(&b, "x", None);
    // Delivered again with more files than one listing page shows.
    let dir = tempfile::tempdir().unwrap();
    for n in 0..DELETES_A_REQUEST {
        let path = format!("f{n:04}.txt");
        std::fs::write(dir.path().join(&path), "n\n").unwrap();
        put(&b, &Bucket::key(INBOX, "x", &path), b"n\n");
    }
    std::fs::write(dir.path().join("a.txt"), "1\n").unwrap();
    crate::bundle::seal(dir.path(), "x", None).unwrap();
    let manifest = std::fs::read(dir.path().join(MANIFEST)).unwrap();
    put(&b, &Bucket::key(INBOX, "x", MANIFEST), &manifest);
    assert_eq!(b.inbox_now("x", &p.objects).unwrap(), None);
    assert_eq!(remove(&b, "x", &p), 3);
    let after = probe(&b, "x", None);
    assert_eq!(after.manifest_bytes, manifest);
    assert_eq!(after.objects.len(), DELETES_A_REQUEST + 3);
    // Not delivered again: its manifest goes (it is no bundle any more),
    // what else the listing cannot tell apart stays.
    let b = bucket();
    deliver(&b, "y", &[("a.txt", "1\n")]);
    let p = probe(&b, "y", None);
    for n in 0..DELETES_A_REQUEST {
        put(
            &b,
            &Bucket::key(INBOX, "y", &format!("f{n:04}.txt")),
            b"n\n",
        );
    }
    assert_eq!(remove(&b, "y", &p), 1);
    assert!(!left(&b, "y").contains(&MANIFEST.to_owned()));
    assert!(left(&b, "y").contains(&"a.txt".to_owned()));
}

#[test]
fn filing_a_bundle_failed_before_it_was_listed_removes_its_manifest() {
    let b = bucket();
    deliver(&b, "x", &[("a.txt", "1\n")]);
    let failed = Probe {
        objects: Vec::new(),
        manifest: None,
        ..probe(&b, "x", None)
    };
    assert_eq!(remove(&b, "x", &failed), 0);
    assert_eq!(left(&b, "x"), ["a.txt"]);
}

#[test]
fn a_look_lists_a_small_inbox_whole_and_a_large_one_by_its_names() {
    let b = bucket();
    deliver(&b, "one", &[("a.txt", "1\n"), ("sub/b.txt", "2\n")]);
    put(
        &b,
        &Bucket::key(INBOX, "two", "a.txt"),
        b"no manifest yet\n",
    );
    put(&b, &Bucket::key(INBOX, ".hidden", "a.txt"), b"ignored\n");
    put(&b, &format!("{INBOX}/stray.txt"), b"no bundle's\n");
    let Look::Whole(all) = b.look(6).unwrap() else {
        panic!("6 objects are listed whole")
    };
    let paths = |name: &str| -> Vec<String> { all[name].iter().map(|o| o.path.clone()).collect() };
    assert_eq!(all.keys().collect::<Vec<_>>(), ["one", "two"]);
    assert_eq!(paths("one"), ["a.txt", "manifest.json", "sub/b.txt"]);
    assert_eq!(paths("two"), ["a.txt"]);
    // What the look listed is what the probe would have.
    let listed = probe(&b, "one", None);
    let known = Known {
        objects: Some(&all["one"]),
        manifest: None,
    };
    let from_look = b.probe("one", &Limits::default(), false, known).unwrap();
    assert_eq!(from_look.state, State::Complete);
    assert_eq!(from_look.objects, listed.objects);
    assert_eq!(from_look.manifest_bytes, listed.manifest_bytes);
    let Look::Names(names) = b.look(5).unwrap() else {
        panic!("more than 5 objects are not listed whole")
    };
    assert_eq!(names, ["one", "two"]);
}

/// Writes the result of `name` as probed in `p` below `folder`, as the
/// holder's filing does.
fn file_result(b: &Bucket, folder: &str, name: &str, p: &Probe) -> Filed {
    let (etag, at) = p.manifest.clone().unwrap();
    let doc = serde_json::json!({
        "ok": folder == DONE,
        "intake": {
            "name": name,
            "manifest_etag": etag.0,
            "manifest_last_modified": crate::catalog::format_time(at),
        },
    });
    b.put_result(folder, name, &doc, (&etag, Some(at))).unwrap()
}

#[test]
fn a_result_is_known_as_its_delivery_by_version_and_second() {
    let b = bucket();
    deliver(&b, "x", &[("a.txt", "1\n")]);
    let p = probe(&b, "x", None);
    let (etag, at) = p.manifest.clone().unwrap();
    assert!(file_result(&b, DONE, "x", &p).written);
    let other = ETag("\"0123\"".to_owned());
    let later = at + time::Duration::seconds(5);
    // (delivery, whether the result is its)
    let cases = [
        ((&etag, Some(at)), true),
        ((&etag, None), true),
        ((&etag, Some(later)), false),
        ((&other, Some(at)), false),
    ];
    for (delivery, is) in cases {
        assert_eq!(
            b.filed_for((DONE, "x"), "x", delivery).unwrap(),
            is,
            "{delivery:?}"
        );
    }
    // Another bundle's (a name whose manifest has the same bytes).
    assert!(!b.filed_for((DONE, "x"), "y", (&etag, Some(at))).unwrap());
    // Filed again for the same delivery: found, not written twice; for the
    // same bytes uploaded again later: a result of its own.
    assert_eq!(
        b.put_result(DONE, "x", &serde_json::json!({}), (&etag, Some(at)))
            .unwrap(),
        Filed {
            name: "x".to_owned(),
            written: false
        }
    );
    let again = b
        .put_result(DONE, "x", &serde_json::json!({}), (&etag, Some(later)))
        .unwrap();
    assert_eq!((again.name.as_str(), again.written), ("x.1", true));
    // A result written before results recorded the second: by version.
    put(
        &b,
        &Bucket::key(DONE, "old", RESULT),
        serde_json::json!({ "intake": { "manifest_etag": etag.0 } })
            .to_string()
            .as_bytes(),
    );
    assert!(
        b.filed_for((DONE, "old"), "old", (&etag, Some(later)))
            .unwrap()
    );
}

#[test]
fn a_fetch_reads_each_object_only_as_its_probe_listed_it() {
    // (what happens between the probe and the fetch, whether the fetch
    // reports the bundle changed)
    type Meanwhile = fn(&Bucket);
    let cases: [(&str, Meanwhile, bool); 3] = [
        ("nothing", |_| {}, false),
        (
            "a file uploaded again",
            |b| put(b, &Bucket::key(INBOX, "x", "a.txt"), b"2\n"),
            true,
        ),
        (
            "a file deleted",
            |b| b.root.delete(&Bucket::key(INBOX, "x", "a.txt")).unwrap(),
            true,
        ),
    ];
    for (what, meanwhile, changed) in cases {
        let b = bucket();
        deliver(&b, "x", &[("a.txt", "1\n"), ("b.txt", "b\n")]);
        let p = probe(&b, "x", None);
        meanwhile(&b);
        let work = tempfile::tempdir().unwrap();
        let into = work.path().join("x");
        match b.fetch(&p, &into) {
            Ok(f) => {
                assert!(!changed, "{what}: fetched");
                assert!(f.mismatches.is_empty(), "{what}: {:?}", f.mismatches);
                assert_eq!(std::fs::read(into.join("a.txt")).unwrap(), b"1\n");
            }
            Err(e) => assert!(changed && e.changed(), "{what}: {e}"),
        }
    }
}

#[test]
fn an_object_refused_for_good_is_told_apart_from_an_outage() {
    use s3::Failure;
    let cases = [
        (Failure::Denied, true),
        (Failure::Status(400), true),
        (Failure::Status(429), false),
        (Failure::Status(503), false),
        (Failure::ServerError, false),
        (Failure::Connect, false),
        (Failure::CredentialsRefused, false),
        (Failure::BucketMissing, false),
    ];
    for (failure, is) in cases {
        let e = s3::Error::Store {
            root: "s3://b/p".to_owned(),
            op: "GET",
            key: "inbox/x/a.txt".to_owned(),
            failure,
        };
        assert_eq!(refused(&e), is, "{failure:?}");
    }
}
