//! Fuzzing object keys (docs/reliability.md, "Fuzzing"): every clean
//! output path is stored under exactly `<prefix>/<path>`, every character
//! as it is (docs/contract.md §15.2), and read back, headed and listed
//! under the same name; its URL (`base_url` + percent-encoded path,
//! §11.15) decodes back to it.

use super::S3Root;
use crate::fuzzing::{iterations, mutate};
use crate::paths::RelPath;
use object_store::memory::InMemory;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The root's prefix: a clean path with characters object stores and
/// URLs find awkward.
const PREFIX: &str = "sites/é %41#?{x}";

/// Decodes `%XX` escapes, refusing anything else that is not one of the
/// characters RFC 3986 leaves unreserved.
fn decode(url_path: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut bytes = url_path.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                if hex.to_ascii_uppercase() != hex {
                    return None;
                }
                out.push(u8::from_str_radix(hex, 16).ok()?);
            }
            b'/' | b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b)
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// Stores `rel` (under the fresh folder `folder`) and checks every way of
/// naming it.
fn check_key(root: &S3Root, raw: &S3Root, folder: &str, rel: &RelPath) {
    let path = format!("{folder}/{rel}");
    let full = format!("{PREFIX}/{path}");
    assert_eq!(root.key(&path).as_ref(), full);
    assert_eq!(raw.key(&full).as_ref(), full);
    let body = rel.as_str().as_bytes();
    let written = root
        .put_new(&path, &mut &body[..], None, "fuzz")
        .unwrap_or_else(|e| panic!("{path:?}: {e}"));
    assert_eq!(written.size, body.len() as u64);
    let listed: Vec<String> = root
        .list(folder)
        .unwrap()
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(listed, std::slice::from_ref(&path), "listed under the root");
    let stored: Vec<String> = raw
        .list(&format!("{PREFIX}/{folder}"))
        .unwrap()
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(stored, std::slice::from_ref(&full), "the key in the store");
    let head = root.head(&path).unwrap().expect("headed by its name");
    assert_eq!(head.size, body.len() as u64);
    let (hashed, _) = raw.get_hashed(&full).unwrap().expect("read by its key");
    assert_eq!(hashed.sha256, written.sha256);
    check_url(rel);
}

fn check_url(rel: &RelPath) {
    let base = "https://example.org/site/";
    let url = crate::plan::output_url(base, rel);
    let encoded = url.strip_prefix(base).expect("the base comes first");
    assert_eq!(decode(encoded).as_deref(), Some(rel.as_str()), "{url}");
    assert_eq!(
        crate::plan::output_url("https://example.org/site", rel),
        url,
        "a base without its slash gets one"
    );
}

/// Any clean path is an object key as it is, read back by that key.
#[test]
fn fuzz_s3_keys() {
    let store = Arc::new(InMemory::new());
    let root = S3Root::with_store(
        store.clone(),
        &format!("/{PREFIX}/"),
        "s3://fuzz".to_owned(),
        "fuzz".to_owned(),
    )
    .unwrap();
    let raw = S3Root::with_store(store, "", "s3://fuzz".to_owned(), "fuzz".to_owned()).unwrap();
    let seeds: &[&[u8]] = &[
        b"index.html",
        "café/notes (draft) #1.md".as_bytes(),
        b"a/b/c/%41%zz+&=;,@$!'()*[]",
        "日本語/😀/\u{a0}\u{2028}\u{feff}.txt".as_bytes(),
        b".well-known/a?b#c{d}|e^f`g\"h<i>",
    ];
    let dictionary: &[&[u8]] = &[
        b"/",
        b"%",
        b"%2F",
        b"#",
        b"?",
        b" ",
        b"+",
        b"~",
        b"..",
        b".",
        b"*",
        b"\xc3\xa9",
    ];
    let folders = &AtomicUsize::new(0);
    // A failed check ends the test: nothing is used after a panic.
    let roots = &std::panic::AssertUnwindSafe((root, raw));
    bolero::check!(name = "s3_keys")
        .with_iterations(iterations(10_000))
        .for_each(move |input: &[u8]| {
            let (root, raw) = &**roots;
            let texts = [
                String::from_utf8_lossy(input).into_owned(),
                mutate(input, seeds, dictionary)
                    .map(|m| String::from_utf8_lossy(&m).into_owned())
                    .unwrap_or_default(),
            ];
            for text in texts {
                let Ok(rel) = RelPath::parse(&text) else {
                    continue;
                };
                let folder = format!("n{}", folders.fetch_add(1, Ordering::Relaxed));
                check_key(root, raw, &folder, &rel);
            }
        });
}

#[test]
fn the_url_decoder_takes_only_encoded_text() {
    assert_eq!(decode("a%C3%A9/b").as_deref(), Some("aé/b"));
    assert_eq!(decode("a%c3%a9"), None);
    assert_eq!(decode("a b"), None);
    assert_eq!(decode("%4"), None);
}
