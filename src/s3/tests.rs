//! The s3 backend's storage operations against `object_store`'s in-memory
//! store, which implements the same conditional semantics as S3
//! (`If-None-Match: *`, `If-Match`). The real server is exercised by the
//! integration tests (tests/integration/s3.rs).

use std::io::Read;
use std::sync::Arc;

use object_store::memory::InMemory;

use super::upload::PART_SIZE;
use super::{Error, S3Root};
use crate::fs::hashing::hash_bytes;
use crate::report::Stage;

pub(crate) fn memory_root(prefix: &str) -> S3Root {
    S3Root::with_store(
        Arc::new(InMemory::new()),
        prefix,
        format!("s3://memory/{prefix}"),
        format!("memory {}", super::random_id()),
    )
    .expect("runtime")
}

/// `len` bytes of a repeating pattern, generated while read.
pub(crate) struct Pattern {
    pub left: u64,
    pub at: u64,
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for b in &mut buf[..n] {
            *b = (self.at % 251) as u8;
            self.at += 1;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn pattern_sha(len: u64) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut Pattern { left: len, at: 0 }, &mut HashWriter(&mut h)).unwrap();
    crate::fs::hashing::format_digest(h)
}

struct HashWriter<'a>(&'a mut sha2::Sha256);
impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_in_memory_store_passes_the_conformance_check() {
    let root = memory_root("site");
    root.probe().unwrap();
    // The probe leaves nothing behind.
    assert_eq!(root.list("").unwrap(), vec![]);
}

#[test]
fn catalog_writes_are_compare_and_swap() {
    let root = memory_root("");
    assert_eq!(root.read_catalog().unwrap(), None);
    let v1 = root.write_catalog(b"one\n".to_vec().into(), None).unwrap();
    // A second create loses: someone else created it first.
    assert!(matches!(
        root.write_catalog(b"two\n".to_vec().into(), None),
        Err(Error::Conflict { .. })
    ));
    let v2 = root
        .write_catalog(b"two\n".to_vec().into(), Some(&v1))
        .unwrap();
    assert_ne!(v1, v2);
    // Replacing a version that is no longer current loses.
    let stale = root.write_catalog(b"three\n".to_vec().into(), Some(&v1));
    assert!(matches!(stale, Err(Error::Conflict { ref key, .. }) if key == ".distributor.json"));
    assert!(stale.unwrap_err().is_transient());
    assert_eq!(
        root.read_catalog().unwrap(),
        Some((b"two\n".to_vec().into(), v2))
    );
}

#[test]
fn keys_are_below_the_prefix() {
    for (prefix, rel, key) in [
        ("", "a/b.html", "a/b.html"),
        ("site", "a/b.html", "site/a/b.html"),
        ("site/archive/", "x", "site/archive/x"),
    ] {
        assert_eq!(memory_root(prefix).key(rel).as_ref(), key, "{prefix:?}");
    }
}

#[test]
fn put_new_never_overwrites() {
    let root = memory_root("p");
    let first = root
        .put_new("a.html", &mut &b"first"[..], None, "i1")
        .unwrap();
    assert_eq!(first.sha256, hash_bytes(b"first").sha256);
    assert_eq!(first.size, 5);
    let again = root.put_new("a.html", &mut &b"second"[..], None, "i2");
    assert!(matches!(again, Err(Error::Exists { ref key, .. }) if key == "a.html"));
    let head = root.head("a.html").unwrap().unwrap();
    assert_eq!(head.sha256.as_deref(), Some(first.sha256.as_str()));
    assert_eq!(head.intent.as_deref(), Some("i1"));
    assert_eq!(head.etag, first.etag);
    assert_eq!(head.size, 5);
}

#[test]
fn put_replace_needs_the_current_version() {
    let root = memory_root("");
    let v1 = root.put_new("a", &mut &b"one"[..], None, "i").unwrap();
    let v2 = root
        .put_replace("a", &mut &b"two"[..], &v1.etag, None, "i")
        .unwrap();
    let stale = root.put_replace("a", &mut &b"three"[..], &v1.etag, None, "i");
    assert!(matches!(stale, Err(Error::Changed { .. })));
    let (hashed, etag) = root.get_hashed("a").unwrap().unwrap();
    assert_eq!(hashed, hash_bytes(b"two"));
    assert_eq!(etag, v2.etag);
    // A replacement of a key that does not exist is refused too.
    assert!(matches!(
        root.put_replace("gone", &mut &b"x"[..], &v2.etag, None, "i"),
        Err(Error::Changed { .. })
    ));
}

#[test]
fn a_wrong_digest_stores_nothing() {
    let root = memory_root("");
    let wrong = hash_bytes(b"something else").sha256;
    for len in [10u64, PART_SIZE as u64 * 2 + 5] {
        let r = root.put_new("f", &mut Pattern { left: len, at: 0 }, Some(&wrong), "i");
        assert!(matches!(r, Err(Error::HashMismatch { .. })), "{len}: {r:?}");
        assert_eq!(root.head("f").unwrap(), None, "{len}");
    }
}

#[test]
fn uploads_round_trip_at_every_size() {
    let root = memory_root("big");
    let part = PART_SIZE as u64;
    for len in [0, 1, part - 1, part, part + 1, 3 * part + 17] {
        let rel = format!("f{len}");
        let sha = pattern_sha(len);
        let w = root
            .put_new(&rel, &mut Pattern { left: len, at: 0 }, Some(&sha), "i")
            .unwrap();
        assert_eq!((w.sha256.as_str(), w.size), (sha.as_str(), len), "{len}");
        let (hashed, etag) = root.get_hashed(&rel).unwrap().unwrap();
        assert_eq!(
            (hashed.sha256, hashed.size, etag),
            (sha.clone(), len, w.etag),
            "{len}"
        );
        let head = root.head(&rel).unwrap().unwrap();
        assert_eq!(
            head.sha256,
            Some(sha),
            "{len}: the digest is in the metadata"
        );
    }
}

#[test]
fn a_large_new_key_is_claimed_before_its_parts_go_up() {
    let root = memory_root("");
    root.put_new("taken", &mut &b"not ours"[..], None, "other")
        .unwrap();
    let len = PART_SIZE as u64 + 1;
    let r = root.put_new("taken", &mut Pattern { left: len, at: 0 }, None, "me");
    assert!(matches!(r, Err(Error::Exists { .. })));
    let (hashed, _) = root.get_hashed("taken").unwrap().unwrap();
    assert_eq!(hashed, hash_bytes(b"not ours"));
}

#[test]
fn list_is_relative_to_the_root_and_sorted() {
    let root = memory_root("site");
    for rel in ["b", "a/x", ".distributor.json"] {
        root.put_new(rel, &mut &b"x"[..], None, "i").unwrap();
    }
    let other = S3Root::with_store(
        Arc::clone(&root.store),
        "sitemap",
        "other".into(),
        "other".into(),
    )
    .unwrap();
    other.put_new("c", &mut &b"x"[..], None, "i").unwrap();
    let paths: Vec<String> = root.list("").unwrap().into_iter().map(|l| l.path).collect();
    assert_eq!(paths, [".distributor.json", "a/x", "b"]);
    let paths: Vec<String> = root
        .list("a")
        .unwrap()
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(paths, ["a/x"]);
}

#[test]
fn delete_and_server_time() {
    let root = memory_root("");
    root.put_new("a", &mut &b"x"[..], None, "i").unwrap();
    root.delete("a").unwrap();
    root.delete("a").unwrap(); // already gone: fine
    assert_eq!(root.head("a").unwrap(), None);
    let before = time::OffsetDateTime::now_utc() - std::time::Duration::from_secs(5);
    assert!(root.server_now().unwrap() > before);
    assert_eq!(
        root.list("").unwrap(),
        vec![],
        "the clock object is removed"
    );
}

#[test]
fn errors_map_to_stages() {
    let root = || "r".to_owned();
    let key = || "k".to_owned();
    for (e, stage, transient) in [
        (
            Error::Nonconforming {
                root: root(),
                behaviour: "b".into(),
            },
            Stage::Lock,
            false,
        ),
        (
            Error::Conflict {
                root: root(),
                key: key(),
            },
            Stage::Lock,
            true,
        ),
        (
            Error::Changed {
                root: root(),
                key: key(),
            },
            Stage::Lock,
            true,
        ),
        (
            Error::Claimed {
                root: root(),
                key: key(),
                id: "i".into(),
                owner: "o".into(),
                lease_secs: 300,
            },
            Stage::Lock,
            true,
        ),
        (
            Error::Revoked {
                root: root(),
                id: "i".into(),
                lease_secs: 300,
            },
            Stage::Lock,
            true,
        ),
        (
            Error::Exists {
                root: root(),
                key: key(),
            },
            Stage::Plan,
            false,
        ),
        (
            Error::Credentials {
                var: "AWS_ACCESS_KEY_ID",
            },
            Stage::Config,
            false,
        ),
    ] {
        assert_eq!((e.stage(), e.is_transient()), (stage, transient), "{e}");
    }
}

#[test]
fn a_large_replacement_is_conditional_too() {
    let root = memory_root("");
    let v1 = root.put_new("f", &mut &b"small"[..], None, "i1").unwrap();
    let len = 2 * PART_SIZE as u64 + 3;
    let sha = pattern_sha(len);
    let v2 = root
        .put_replace(
            "f",
            &mut Pattern { left: len, at: 0 },
            &v1.etag,
            Some(&sha),
            "i2",
        )
        .unwrap();
    assert_eq!((v2.sha256.as_str(), v2.size), (sha.as_str(), len));
    // The old version is gone: a replacement based on it is refused before
    // a single part goes up, and the object stays as it is.
    let stale = root.put_replace("f", &mut Pattern { left: len, at: 7 }, &v1.etag, None, "i3");
    assert!(matches!(stale, Err(Error::Changed { .. })), "{stale:?}");
    let (hashed, etag) = root.get_hashed("f").unwrap().unwrap();
    assert_eq!((hashed.sha256, etag), (sha, v2.etag));
    let head = root.head("f").unwrap().unwrap();
    assert_eq!(head.intent.as_deref(), Some("i2"));
}
