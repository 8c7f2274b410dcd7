//! Fuzzing manifests and their verification (docs/reliability.md,
//! "Fuzzing"): [`parse_manifest`] against a reading of docs/contract.md §3
//! written here over serde_json's generic values, and [`verify`] and
//! [`inspect`] of real folders sealed and then tampered with, against
//! what each tampering must do to the verdict.

use super::manifest::Manifest;
use super::*;
use crate::fuzzing::{Tally, iterations, mutate};
use crate::paths::RelPath;
use crate::runtime::workers::InOrder;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

/// A listed file: path, sha256 and size as written.
type Listed = (String, String, u64);

/// The manifest docs/contract.md §3 describes, read from a generic JSON
/// value: `None` when the value breaks a rule.
fn reference(v: &Value) -> Option<(String, Vec<Listed>)> {
    let top = v.as_object()?;
    if top.get("schema_version")?.as_u64()? != 1 {
        return None;
    }
    let id = top.get("id")?.as_str()?;
    let id_ok = (1..=128).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    let created = top.get("created")?.as_str()?;
    let created =
        time::OffsetDateTime::parse(created, &time::format_description::well_known::Rfc3339)
            .ok()?;
    // "RFC 3339", which can say years 0000 to 9999 (in UTC too).
    let utc_year = created
        .checked_to_offset(time::UtcOffset::UTC)
        .map_or(-1, |t| t.year());
    let digest = top.get("digest")?.as_str()?;
    let hex = |s: &str| {
        s.strip_prefix("sha256:").is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    };
    let mut files = Vec::new();
    for f in top.get("files")?.as_array()? {
        let f = f.as_object()?;
        if f.keys()
            .any(|k| !["path", "sha256", "size"].contains(&k.as_str()))
        {
            return None;
        }
        let path = f.get("path")?.as_str()?;
        let sha256 = f.get("sha256")?.as_str()?;
        let size = f.get("size")?.as_u64()?;
        let clean = RelPath::parse(path).ok()?;
        if clean.is_reserved()
            || path == "manifest.json"
            || path == "manifest.json.sig"
            || !hex(sha256)
        {
            return None;
        }
        files.push((path.to_owned(), sha256.to_owned(), size));
    }
    let mut paths: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    paths.sort_unstable();
    let unique = paths.windows(2).all(|w| w[0] != w[1]);
    let no_clash = paths.iter().all(|p| {
        !paths
            .iter()
            .any(|q| q.len() > p.len() && q.starts_with(p) && q.as_bytes()[p.len()] == b'/')
    });
    let ok = id_ok
        && (0..=9999).contains(&utc_year)
        && hex(digest)
        && !files.is_empty()
        && unique
        && no_clash
        && digest == reference_digest(&files);
    ok.then(|| (id.to_owned(), files))
}

/// "`sha256:` + hex SHA-256 of the text made of one line per file, files
/// sorted by path (byte order), each line `<sha256 field as written>
/// <size in decimal> <path>` followed by `\n`."
fn reference_digest(files: &[Listed]) -> String {
    use sha2::Digest as _;
    let mut sorted: Vec<&Listed> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = sha2::Sha256::new();
    for (path, sha, size) in sorted {
        h.update(format!("{sha} {size} {path}\n"));
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The value with its digest made right for the files it lists, when
/// they can be read at all: what a mutation past the digest needs.
fn with_digest(mut v: Value) -> Option<Vec<u8>> {
    let files: Vec<Listed> = v
        .get("files")?
        .as_array()?
        .iter()
        .map(|f| {
            Some((
                f.get("path")?.as_str()?.to_owned(),
                f.get("sha256")?.as_str()?.to_owned(),
                f.get("size")?.as_u64()?,
            ))
        })
        .collect::<Option<_>>()?;
    *v.get_mut("digest")? = Value::String(reference_digest(&files));
    serde_json::to_vec_pretty(&v).ok()
}

/// Values that sit on either side of a rule of §3.
fn interesting(pick: u8) -> Value {
    use serde_json::json;
    let long = "s".repeat(256);
    let values = [
        json!("a"),
        json!("a/b.md"),
        json!("a/./b"),
        json!("a/../b"),
        json!("manifest.json"),
        json!("manifest.json.sig"),
        json!("x/.distributor-tmp"),
        json!("é/😀"),
        json!("a\\b"),
        json!("a\u{1}b"),
        json!(""),
        json!("/a"),
        json!("a/"),
        json!(long),
        json!("x"),
        json!("-x"),
        json!("a".repeat(129)),
        json!("2026-06-04T11:55:00Z"),
        json!("2026-06-04T11:55:00.5-23:59"),
        json!("0000-01-01T00:30:00+01:00"),
        json!("9999-12-31T23:30:00-01:00"),
        json!("2026-02-30T00:00:00Z"),
        json!(format!("sha256:{}", "AB".repeat(32))),
        json!(format!("sha256:{}", "ab".repeat(31))),
        json!(0),
        json!(1),
        json!(2),
        json!(u64::MAX),
        json!(-1),
        json!(1.5),
        json!(1.0),
        json!("1"),
        json!(null),
        json!([]),
        json!({}),
    ];
    values[usize::from(pick) % values.len()].clone()
}

/// `seed` edited field by field as `bytes` say (three bytes an edit:
/// which field, which file, which value), its digest made right after.
fn edit_fields(seed: &[u8], bytes: &[u8]) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(seed).ok()?;
    for edit in bytes.chunks(3).take(4) {
        let [what, which, pick] = [0, 1, 2].map(|i| edit.get(i).copied().unwrap_or(0));
        let files = v["files"].as_array_mut()?;
        let n = usize::from(which) % files.len().max(1);
        match what % 10 {
            0 => v["schema_version"] = interesting(pick),
            1 => v["id"] = interesting(pick),
            2 => v["created"] = interesting(pick),
            3 => v[format!("unknown{pick}")] = interesting(pick),
            4 if !files.is_empty() => files[n]["path"] = interesting(pick),
            5 if !files.is_empty() => files[n]["sha256"] = interesting(pick),
            6 if !files.is_empty() => files[n]["size"] = interesting(pick),
            7 if !files.is_empty() => {
                let copy = files[n].clone();
                files.push(copy);
            }
            8 if !files.is_empty() => {
                files.remove(n);
            }
            _ if !files.is_empty() => files[n][format!("k{pick}")] = interesting(pick),
            _ => {}
        }
    }
    with_digest(v)
}

/// Parses `bytes` and holds the result to the reference.
fn check_manifest(bytes: &[u8], tally: &Tally) {
    let parsed = parse_manifest(bytes);
    tally.saw(parsed.is_ok());
    let value: Option<Value> = serde_json::from_slice(bytes).ok();
    let Ok(m) = parsed else {
        // Refused: the reference refuses it too, unless the text says
        // something JSON values cannot hold (a key written twice), which
        // the same value written out again does not.
        if let Some(v) = value.filter(|v| reference(v).is_some()) {
            let again = serde_json::to_vec(&v).unwrap();
            assert!(
                parse_manifest(&again).is_ok(),
                "refused although the contract allows it: {}",
                String::from_utf8_lossy(&again)
            );
        }
        return;
    };
    let v = value.expect("an accepted manifest is JSON");
    let (id, files) = reference(&v).unwrap_or_else(|| {
        panic!(
            "accepted although the contract refuses it: {}",
            String::from_utf8_lossy(bytes)
        )
    });
    assert_eq!(m.id, id);
    let listed: Vec<Listed> = m
        .files
        .iter()
        .map(|f| (f.path.as_str().to_owned(), f.sha256.clone(), f.size))
        .collect();
    assert_eq!(listed, files, "files in the order listed");
    assert_eq!(m.created.offset(), time::UtcOffset::UTC);
    // Written out as `bundle seal` writes it, it reads back the same.
    let json = m.to_json();
    let again = parse_manifest(json.as_bytes()).expect("a manifest written back reads");
    let mut sorted = m.clone();
    sorted.files.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(again, sorted);
    assert_eq!(again.to_json(), json);
}

/// Any bytes are parsed or refused as docs/contract.md §3 says, and an
/// accepted manifest is written back to the same manifest.
#[test]
fn fuzz_manifest() {
    let good = |files: &[(&str, u64)]| -> Vec<u8> {
        let listed: Vec<Value> = files
            .iter()
            .map(|(p, n)| serde_json::json!({"path": p, "sha256": format!("sha256:{}", "ab".repeat(32)), "size": n}))
            .collect();
        let v = serde_json::json!({
            "schema_version": 1,
            "id": "reports.example.2026-06-04",
            "created": "2026-06-04T13:55:00.25+02:00",
            "digest": "",
            "files": listed,
        });
        with_digest(v).unwrap()
    };
    let one = good(&[("report.md", 1234)]);
    let many = good(&[
        ("a/b.txt", 0),
        ("a.txt", 7),
        ("é/😀 x.md", u64::MAX),
        (".hidden", 1),
    ]);
    let seeds: Vec<&[u8]> = vec![&one, &many];
    let dictionary: &[&[u8]] = &[
        b"\"path\": \"",
        b"\"size\": ",
        b"\"sha256\": \"sha256:",
        b"\"schema_version\": 1,",
        b"\"id\": \"x\",",
        b"\"files\": [],",
        b"{\"path\": \"a\", \"sha256\": \"sha256:0000000000000000000000000000000000000000000000000000000000000000\", \"size\": 1}, ",
        b"manifest.json",
        b".distributor",
        b"/",
        b"..",
        b"\\u0000",
        b"\\ud800",
        b"1e3",
        b"-1",
        b"18446744073709551616",
        b"0.5",
        b"null",
        b"[",
        b"]",
        b"{",
        b"}",
        b",",
        b"9999-12-31T23:59:59-01:00",
        b"0000-01-01T00:00:00+01:00",
        b"\xef\xbb\xbf",
    ];
    let tally = &Tally::new("manifest", "accepted");
    bolero::check!(name = "manifest")
        .with_iterations(iterations(10_000))
        .for_each(|input: &[u8]| {
            check_manifest(input, tally);
            let Some(edited) = mutate(input, &seeds, dictionary) else {
                return;
            };
            check_manifest(&edited, tally);
            if let Some(fixed) = serde_json::from_slice(&edited).ok().and_then(with_digest) {
                check_manifest(&fixed, tally);
            }
            let seed = seeds[usize::from(input[0]) % seeds.len()];
            if let Some(fields) = edit_fields(seed, &input[1..]) {
                check_manifest(&fields, tally);
            }
        });
}

/// What is done to a sealed bundle before it is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tamper {
    Nothing,
    /// One byte of a listed file changed, its size kept.
    Flip,
    Append,
    Truncate,
    Remove,
    /// A file that the manifest does not list.
    Unlisted,
    /// A listed file replaced by a symbolic link to a copy of it.
    Symlink,
    /// A listed file replaced by a folder.
    Folder,
    /// A second name for a listed file.
    HardLink,
    /// A listed file replaced by a FIFO (never opened for reading).
    Fifo,
    /// The manifest replaced by a symbolic link to a copy of it.
    ManifestLink,
}

const TAMPERS: [Tamper; 11] = [
    Tamper::Nothing,
    Tamper::Flip,
    Tamper::Append,
    Tamper::Truncate,
    Tamper::Remove,
    Tamper::Unlisted,
    Tamper::Symlink,
    Tamper::Folder,
    Tamper::HardLink,
    Tamper::Fifo,
    Tamper::ManifestLink,
];

/// Folder and file names of the bundles made here.
const NAMES: [&str; 8] = ["a", "b.md", "é", "x y", ".h", "d", "Ω.txt", "#?%"];

/// Makes a bundle from `input`: up to 6 files whose paths and contents
/// the bytes choose, sealed; `None` when the bytes ask for no file.
fn bundle_from(input: &[u8], dir: &Path) -> Option<Manifest> {
    let mut bytes = input.iter().copied();
    let count = usize::from(bytes.next()? % 6) + 1;
    for _ in 0..count {
        let depth = usize::from(bytes.next().unwrap_or(0) % 3) + 1;
        let segments: Vec<&str> = (0..depth)
            .map(|_| NAMES[usize::from(bytes.next().unwrap_or(0)) % NAMES.len()])
            .collect();
        let len = usize::from(bytes.next().unwrap_or(0) % 40);
        let content: Vec<u8> = bytes.by_ref().take(len).collect();
        let path = dir.join(segments.join("/"));
        // A name already a file or a folder: that file is not made.
        if fs::create_dir_all(path.parent().unwrap()).is_err() || path.exists() {
            continue;
        }
        fs::write(&path, &content).unwrap();
    }
    let created = time::macros::datetime!(2026-06-04 11:55 UTC);
    seal(dir, "fuzz.1", Some(created)).ok()
}

/// Whether a verified bundle may pass after `tamper` (with `inspect`,
/// which reads sizes, not contents, when `sizes_only`).
fn passes(tamper: Tamper, sizes_only: bool) -> bool {
    match tamper {
        Tamper::Nothing | Tamper::Unlisted => true,
        Tamper::Flip => sizes_only,
        _ => false,
    }
}

/// Verifies the bundle sealed from the input, tampered with as it says.
fn check_bundle(input: &[u8], tally: &Tally) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bundle");
    fs::create_dir(&dir).unwrap();
    let Some(manifest) = bundle_from(input.get(1..).unwrap_or_default(), &dir) else {
        return;
    };
    let tamper = TAMPERS[usize::from(input[0]) % TAMPERS.len()];
    tally.saw(passes(tamper, false));
    let victim = &manifest.files[usize::from(input[0] / 16) % manifest.files.len()];
    let path = dir.join(victim.path.as_str());
    let aside = tmp.path().join("aside");
    match tamper {
        Tamper::Nothing => {}
        Tamper::Flip => {
            let mut bytes = fs::read(&path).unwrap();
            match bytes.first_mut() {
                Some(b) => *b ^= 1,
                // An empty file cannot be changed in place: grow it.
                None => bytes.push(0),
            }
            fs::write(&path, &bytes).unwrap();
            if victim.size == 0 {
                return check_verdict(&dir, Tamper::Append, victim);
            }
        }
        Tamper::Append => {
            let mut bytes = fs::read(&path).unwrap();
            bytes.push(b'!');
            fs::write(&path, &bytes).unwrap();
        }
        Tamper::Truncate => {
            if victim.size == 0 {
                return;
            }
            let bytes = fs::read(&path).unwrap();
            fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        }
        Tamper::Remove => fs::remove_file(&path).unwrap(),
        Tamper::Unlisted => {
            let unlisted = dir.join(format!("{}.unlisted", victim.path.as_str()));
            fs::write(unlisted, b"?").unwrap();
        }
        Tamper::Symlink => {
            fs::rename(&path, &aside).unwrap();
            symlink(&aside, &path).unwrap();
        }
        Tamper::Folder => {
            fs::remove_file(&path).unwrap();
            fs::create_dir(&path).unwrap();
        }
        Tamper::HardLink => fs::hard_link(&path, tmp.path().join("second")).unwrap(),
        Tamper::Fifo => {
            fs::remove_file(&path).unwrap();
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        Tamper::ManifestLink => {
            let m = dir.join(MANIFEST);
            fs::rename(&m, &aside).unwrap();
            symlink(&aside, &m).unwrap();
        }
    }
    check_verdict(&dir, tamper, victim);
}

fn check_verdict(dir: &Path, tamper: Tamper, victim: &ManifestFile) {
    for sizes_only in [false, true] {
        let result = if sizes_only {
            inspect(dir, &Limits::default(), None, &InOrder)
        } else {
            verify(dir, &Limits::default(), None, &InOrder)
        };
        match (result, passes(tamper, sizes_only)) {
            (Ok(v), true) => {
                let unlisted = v.warnings.iter().any(|w| w.contains(".unlisted"));
                assert_eq!(unlisted, tamper == Tamper::Unlisted, "{:?}", v.warnings);
            }
            (Err(e), false) => {
                let named = match tamper {
                    Tamper::ManifestLink => MANIFEST,
                    _ => victim.path.as_str(),
                };
                assert!(!e.is_transient(), "{tamper:?}: {e}");
                assert!(e.to_string().contains(named), "{tamper:?}: {e}");
            }
            (result, _) => panic!(
                "{tamper:?} of {} (sizes only: {sizes_only}): {result:?}",
                victim.path
            ),
        }
    }
}

/// A sealed bundle verifies; every way of changing a listed file after
/// sealing fails verification naming the file; an unlisted file is a
/// warning.
#[test]
fn fuzz_bundle_verify() {
    let tally = &Tally::new("bundle_verify", "verified (the others tampered with)");
    bolero::check!(name = "bundle_verify")
        .with_iterations(iterations(400))
        .for_each(|input: &[u8]| {
            if !input.is_empty() {
                check_bundle(input, tally);
            }
        });
}
