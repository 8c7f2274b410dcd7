//! Unit tests of bundles: manifest parsing, the digest, verification and
//! sealing, against real folders in temporary directories.

use super::*;
use crate::fs::hashing;
use crate::paths::RelPath;
use crate::runtime::workers::PerCore;
use serde_json::{Value, json};
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use time::format_description::well_known::Rfc3339;
use time::{OffsetDateTime, UtcOffset};

const HELLO_SHA: &str = "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
const A_MD_SHA: &str = "sha256:aa1237b773c38dbddef583c4868aaea7a44c5237ea7923aecca5513764b42d80";
const ZEROS: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn file(path: &str, sha256: &str, size: u64) -> ManifestFile {
    ManifestFile {
        path: RelPath::parse(path).unwrap(),
        sha256: sha256.to_owned(),
        size,
    }
}

fn utc(text: &str) -> OffsetDateTime {
    OffsetDateTime::parse(text, &Rfc3339).unwrap()
}

#[test]
fn digest_follows_the_documented_rule() {
    // Listed out of order on purpose: the digest sorts by path.
    let files = [
        file("notes/a.md", A_MD_SHA, 4),
        file("hello.txt", HELLO_SHA, 6),
    ];
    let text = format!("{HELLO_SHA} 6 hello.txt\n{A_MD_SHA} 4 notes/a.md\n");
    assert_eq!(
        compute_digest(&files),
        hashing::hash_bytes(text.as_bytes()).sha256
    );
    // The same value as the shell example in docs/producers.md.
    assert_eq!(
        compute_digest(&files),
        "sha256:38de40387561b41e0e3deb9d8f7a32418d9dd0750daeb326a5f6868ee1fcff37"
    );
}

#[test]
fn digest_sorts_by_path_bytes_not_by_segments() {
    // '.' (0x2e) sorts before '/' (0x2f), so "a.txt" comes before "a/x.md".
    let files = [file("a/x.md", A_MD_SHA, 4), file("a.txt", HELLO_SHA, 6)];
    let text = format!("{HELLO_SHA} 6 a.txt\n{A_MD_SHA} 4 a/x.md\n");
    assert_eq!(
        compute_digest(&files),
        hashing::hash_bytes(text.as_bytes()).sha256
    );
}

// ----- parsing -------------------------------------------------------

/// A manifest document listing `files`, with the right digest when every
/// path is clean.
fn doc(files: &[(&str, &str, u64)]) -> Value {
    let parsed: Option<Vec<ManifestFile>> = files
        .iter()
        .map(|(p, s, n)| {
            RelPath::parse(p).ok().map(|path| ManifestFile {
                path,
                sha256: (*s).to_owned(),
                size: *n,
            })
        })
        .collect();
    let digest = parsed.map_or_else(|| ZEROS.to_owned(), |f| compute_digest(&f));
    json!({
        "schema_version": 1,
        "id": "reports.example.2026-06-04",
        "created": "2026-06-04T11:55:00Z",
        "digest": digest,
        "files": files
            .iter()
            .map(|(p, s, n)| json!({"path": p, "sha256": s, "size": n}))
            .collect::<Vec<_>>(),
    })
}

fn good() -> Value {
    doc(&[("hello.txt", HELLO_SHA, 6), ("notes/a.md", A_MD_SHA, 4)])
}

fn with(mut v: Value, f: impl FnOnce(&mut Value)) -> Vec<u8> {
    f(&mut v);
    serde_json::to_vec_pretty(&v).unwrap()
}

fn parse_err(bytes: &[u8]) -> String {
    match parse_manifest(bytes) {
        Ok(m) => panic!("expected an error, parsed {m:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_good_manifest_parses_and_normalises_created() {
    let m = parse_manifest(&with(good(), |v| {
        v["created"] = json!("2026-06-04T13:55:00+02:00");
        v["future_key"] = json!({"anything": [1, 2, {"deep": null}]});
    }))
    .unwrap();
    assert_eq!(m.id, "reports.example.2026-06-04");
    assert_eq!(m.created, utc("2026-06-04T11:55:00Z"));
    assert_eq!(m.created.offset(), UtcOffset::UTC);
    assert_eq!(m.created_text(), "2026-06-04T11:55:00Z");
    assert_eq!(m.files.len(), 2);
    assert_eq!(m.files[0].path.as_str(), "hello.txt", "kept as listed");
}

#[test]
fn fractional_seconds_are_kept_only_when_present() {
    let m = parse_manifest(&with(good(), |v| {
        v["created"] = json!("2026-06-04T11:55:00.250-01:00");
    }))
    .unwrap();
    assert_eq!(m.created_text(), "2026-06-04T12:55:00.25Z");
}

#[test]
fn the_documented_example_parses() {
    // Kept in step with the example in docs/producers.md.
    let text = r#"{
  "schema_version": 1,
  "id": "reports.2026-06-04",
  "created": "2026-06-04T11:55:00Z",
  "digest": "sha256:38de40387561b41e0e3deb9d8f7a32418d9dd0750daeb326a5f6868ee1fcff37",
  "files": [
    {
      "path": "hello.txt",
      "sha256": "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03",
      "size": 6
    },
    {
      "path": "notes/a.md",
      "sha256": "sha256:aa1237b773c38dbddef583c4868aaea7a44c5237ea7923aecca5513764b42d80",
      "size": 4
    }
  ]
}
"#;
    let m = parse_manifest(text.as_bytes()).unwrap();
    assert_eq!(m.to_json(), text);
}

#[test]
fn manifest_json_in_a_subfolder_may_be_listed() {
    let m =
        parse_manifest(&serde_json::to_vec(&doc(&[("sub/manifest.json", HELLO_SHA, 6)])).unwrap())
            .unwrap();
    assert_eq!(m.files[0].path.as_str(), "sub/manifest.json");
}

#[test]
fn bad_manifests_are_refused_with_a_message_naming_the_rule() {
    let mut cases = bad_manifests_of_shape();
    cases.extend(bad_manifests_of_files());
    for (name, bytes, want) in cases {
        let got = parse_err(&bytes);
        assert!(
            got.contains(want),
            "{name}: {got:?} should contain {want:?}"
        );
        assert!(got.starts_with("manifest.json"), "{name}: {got:?}");
    }
}

fn bad_manifests_of_shape() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let upper = HELLO_SHA.to_uppercase().replace("SHA256:", "sha256:");
    vec![
        (
            "schema 2",
            with(good(), |v| v["schema_version"] = json!(2)),
            "\"schema_version\" 2 is not supported",
        ),
        (
            "schema text",
            with(good(), |v| v["schema_version"] = json!("1")),
            "expected a whole number for \"schema_version\"",
        ),
        (
            "schema float",
            with(good(), |v| v["schema_version"] = json!(1.0)),
            "\"schema_version\" must be a whole number",
        ),
        (
            "schema negative",
            with(good(), |v| v["schema_version"] = json!(-1)),
            "\"schema_version\" is -1; it cannot be negative",
        ),
        (
            "schema missing",
            with(good(), |v| {
                v.as_object_mut().unwrap().remove("schema_version");
            }),
            "missing field `schema_version`",
        ),
        (
            "id rule",
            with(good(), |v| v["id"] = json!(".hidden")),
            "must start with a letter or digit",
        ),
        (
            "id long",
            with(good(), |v| v["id"] = json!("s".repeat(129))),
            "longer than 128",
        ),
        (
            "id type",
            with(good(), |v| v["id"] = json!(5)),
            "expected a string for \"id\"",
        ),
        (
            "id missing",
            with(good(), |v| {
                v.as_object_mut().unwrap().remove("id");
            }),
            "missing field `id`",
        ),
        (
            "created text",
            with(good(), |v| v["created"] = json!("yesterday")),
            "\"created\" \"yesterday\" is not an RFC 3339",
        ),
        (
            "created no zone",
            with(good(), |v| v["created"] = json!("2026-06-04T11:55:00")),
            "is not an RFC 3339",
        ),
        (
            "created range",
            with(good(), |v| {
                v["created"] = json!("0000-01-01T00:00:00+01:00")
            }),
            "outside the years 0000 to 9999",
        ),
        (
            "created null",
            with(good(), |v| v["created"] = Value::Null),
            "expected a string for \"created\"",
        ),
        (
            "digest algo",
            with(good(), |v| {
                v["digest"] = json!(HELLO_SHA.replace("sha256:", "sha1:"))
            }),
            "\"digest\" \"sha1:",
        ),
        (
            "digest upper",
            with(good(), |v| v["digest"] = json!(upper)),
            "\"digest\" \"sha256:5891B5B5",
        ),
        (
            "digest wrong",
            with(good(), |v| v["digest"] = json!(ZEROS)),
            "but the listed files give sha256:",
        ),
        (
            "files empty",
            with(good(), |v| v["files"] = json!([])),
            "\"files\" is empty",
        ),
        (
            "files object",
            with(good(), |v| v["files"] = json!({})),
            "expected a list of file entries for \"files\"",
        ),
        (
            "files missing",
            with(good(), |v| {
                v.as_object_mut().unwrap().remove("files");
            }),
            "missing field `files`",
        ),
    ]
}

fn bad_manifests_of_files() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let upper = HELLO_SHA.to_uppercase().replace("SHA256:", "sha256:");
    vec![
        (
            "entry type",
            with(good(), |v| v["files"] = json!([5])),
            "expected a file entry",
        ),
        (
            "path dotdot",
            serde_json::to_vec(&doc(&[("../x", HELLO_SHA, 6)])).unwrap(),
            "\"path\" \"../x\" is not a clean relative path: path has a '..' segment",
        ),
        (
            "path absolute",
            serde_json::to_vec(&doc(&[("/etc/x", HELLO_SHA, 6)])).unwrap(),
            "path starts with '/'",
        ),
        (
            "path backslash",
            serde_json::to_vec(&doc(&[("a\\b", HELLO_SHA, 6)])).unwrap(),
            "backslash",
        ),
        (
            "path empty",
            serde_json::to_vec(&doc(&[("", HELLO_SHA, 6)])).unwrap(),
            "path is empty",
        ),
        (
            "path type",
            with(good(), |v| v["files"][0]["path"] = json!(["a"])),
            "expected a string for \"path\"",
        ),
        (
            "path reserved",
            serde_json::to_vec(&doc(&[(".distributor.json", HELLO_SHA, 6)])).unwrap(),
            "reserved for the tool",
        ),
        (
            "path reserved deep",
            serde_json::to_vec(&doc(&[("a/.distributor-x/b", HELLO_SHA, 6)])).unwrap(),
            "reserved for the tool",
        ),
        (
            "path manifest",
            serde_json::to_vec(&doc(&[("manifest.json", HELLO_SHA, 6)])).unwrap(),
            "lists the manifest itself",
        ),
        (
            "path inside the manifest",
            serde_json::to_vec(&doc(&[("manifest.json/x", HELLO_SHA, 6)])).unwrap(),
            "puts a file in a folder named manifest.json",
        ),
        (
            "path duplicate",
            serde_json::to_vec(&doc(&[
                ("a", HELLO_SHA, 6),
                ("b", HELLO_SHA, 6),
                ("a", A_MD_SHA, 4),
            ]))
            .unwrap(),
            "\"a\" is listed more than once",
        ),
        (
            "path prefix",
            serde_json::to_vec(&doc(&[("a/b/c", HELLO_SHA, 6), ("a/b", HELLO_SHA, 6)])).unwrap(),
            "\"a/b\" is listed as a file but \"a/b/c\" needs it to be a folder",
        ),
        (
            "sha upper",
            serde_json::to_vec(&doc(&[("a", &upper, 6)])).unwrap(),
            "uses uppercase hex digits; write them in lowercase",
        ),
        (
            "sha short",
            serde_json::to_vec(&doc(&[("a", &HELLO_SHA[..70], 6)])).unwrap(),
            "is not \"sha256:\" followed by 64 lowercase hex digits",
        ),
        (
            "sha bare",
            serde_json::to_vec(&doc(&[("a", &HELLO_SHA[7..], 6)])).unwrap(),
            "\"sha256\" \"5891b5",
        ),
        (
            "size negative",
            with(good(), |v| v["files"][0]["size"] = json!(-1)),
            "\"size\" is -1; it cannot be negative",
        ),
        (
            "size float",
            with(good(), |v| v["files"][0]["size"] = json!(1.5)),
            "\"size\" must be a whole number",
        ),
        (
            "size text",
            with(good(), |v| v["files"][0]["size"] = json!("6")),
            "expected a whole number for \"size\"",
        ),
        (
            "size missing",
            with(good(), |v| {
                v["files"][0].as_object_mut().unwrap().remove("size");
            }),
            "missing field `size`",
        ),
        (
            "entry unknown key",
            with(good(), |v| v["files"][0]["sha1"] = json!("x")),
            "unknown field `sha1`, expected one of `path`, `sha256`, `size`",
        ),
        (
            "top level array",
            b"[1, 2]".to_vec(),
            "expected a JSON object with \"schema_version\"",
        ),
        (
            "not json",
            b"{\"schema_version\": 1,\n  oops}".to_vec(),
            "manifest.json line 2 column 3: not valid JSON",
        ),
        (
            "trailing comma",
            b"{\"schema_version\": 1,}".to_vec(),
            "not valid JSON",
        ),
        (
            "trailing text",
            [with(good(), |_| {}), b" x".to_vec()].concat(),
            "trailing characters",
        ),
        ("empty", Vec::new(), "ends early"),
        (
            "bom",
            [b"\xEF\xBB\xBF".to_vec(), with(good(), |_| {})].concat(),
            "byte-order mark",
        ),
        (
            "not utf8",
            b"{\n \"id\": \"a\xff\"}".to_vec(),
            "manifest.json line 2 column 10: not UTF-8 text (byte 0xff",
        ),
        (
            "duplicate key",
            b"{\"schema_version\": 1, \"schema_version\": 1}".to_vec(),
            "duplicate field `schema_version`",
        ),
    ]
}

#[test]
fn size_that_does_not_fit_in_u64_is_refused() {
    let text = String::from_utf8(with(good(), |v| v["files"][0]["size"] = json!(7))).unwrap();
    let huge = text.replace("\"size\": 7", "\"size\": 18446744073709551616");
    assert_ne!(text, huge);
    assert!(
        parse_err(huge.as_bytes())
            .contains("is too large; it must fit in an unsigned 64-bit integer")
    );
    let exp = text.replace("\"size\": 7", "\"size\": 6e0");
    assert!(parse_err(exp.as_bytes()).contains("without a decimal point or exponent"));
    let max = text.replace("\"size\": 7", &format!("\"size\": {}", u64::MAX));
    // u64::MAX itself is a valid size; only the digest is then wrong.
    assert!(parse_err(max.as_bytes()).contains("\"digest\""));
}

#[test]
fn errors_carry_line_and_column() {
    let bytes = with(good(), |v| v["files"][1]["size"] = json!(-4));
    match parse_manifest(&bytes) {
        Err(BundleError::Manifest {
            line: Some(line),
            column: Some(column),
            ..
        }) => {
            assert!(line > 1 && column > 1, "{line}:{column}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn deep_nesting_is_a_clean_error() {
    let open = "[".repeat(100_000);
    let close = "]".repeat(100_000);
    for (name, text, want) in [
        (
            "ignored key",
            format!("{{\"x\": {open}{close}}}"),
            "missing field `schema_version`",
        ),
        ("unclosed", format!("{{\"x\": {open}"), "not valid JSON"),
        (
            "top level",
            format!("{open}{close}"),
            "expected a JSON object",
        ),
        (
            "files",
            format!("{{\"files\": [{open}{close}]}}"),
            "expected a file entry",
        ),
        (
            "object values",
            format!(
                "{{\"x\": {}1{}}}",
                "{\"a\":".repeat(100_000),
                "}".repeat(100_000)
            ),
            "missing field",
        ),
    ] {
        let got = within_time(move || parse_err(text.as_bytes()));
        assert!(got.contains(want), "{name}: {got}");
    }
}

#[test]
fn oversized_manifest_is_refused_before_it_is_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let limits = Limits {
        max_files: 10,
        ..Limits::default()
    };
    let cap = limits.max_manifest_bytes();
    std::fs::write(
        dir.join(MANIFEST),
        vec![b' '; usize::try_from(cap).unwrap() + 1],
    )
    .unwrap();
    let e = verify(dir, &limits, None, &PerCore::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("more than the {cap} bytes read at most")),
        "{e}"
    );
}

#[test]
fn limits_are_checked_against_the_manifest_and_name_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("a.bin"), vec![0u8; 100]).unwrap();
    std::fs::write(dir.join("b.md"), vec![b'x'; 60]).unwrap();
    seal(dir, "lim", None).unwrap();
    let cases: &[(Limits, Option<&str>)] = &[
        (Limits::default(), None),
        (
            Limits {
                max_files: 1,
                ..Limits::default()
            },
            Some("lists 2 files, more than limits.max_files (1)"),
        ),
        (
            Limits {
                max_file_bytes: 99,
                ..Limits::default()
            },
            Some("a.bin: declared size 100 bytes is more than limits.max_file_bytes (99 bytes)"),
        ),
        (
            Limits {
                max_bundle_bytes: 159,
                ..Limits::default()
            },
            Some("add up to 160 bytes, more than limits.max_bundle_bytes (159 bytes)"),
        ),
    ];
    for (limits, want) in cases {
        let got = verify(dir, limits, None, &PerCore::new());
        match want {
            None => assert!(got.is_ok(), "{limits:?}: {:?}", got.err()),
            Some(want) => {
                let e = got.unwrap_err().to_string();
                assert!(e.contains(want), "{limits:?}: {e}");
            }
        }
    }
    let l = Limits {
        max_markdown_bytes: 59,
        ..Limits::default()
    };
    let p = markdown_too_big("b.md", 60, &l).unwrap().to_string();
    assert!(
        p.starts_with("b.md: is 60 bytes, more than limits.max_markdown_bytes (59 bytes)"),
        "{p}"
    );
    assert!(markdown_too_big("b.md", 59, &l).is_none());
}

// ----- sealing and verifying ------------------------------------------

fn mkfifo(path: &Path) {
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        path,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

/// Runs `f` on another thread and fails the test instead of hanging.
fn within_time<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("finished without blocking")
}

/// A sealed bundle with hello.txt, notes/a.md and a dot-file.
fn sealed() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    fs::create_dir_all(dir.join("notes")).unwrap();
    fs::write(dir.join("hello.txt"), "hello\n").unwrap();
    fs::write(dir.join("notes/a.md"), "# A\n").unwrap();
    fs::write(dir.join(".meta"), "m").unwrap();
    seal(
        &dir,
        "reports.example.2026-06-04",
        Some(utc("2026-06-04T13:55:00+02:00")),
    )
    .unwrap();
    (tmp, dir)
}

fn problems(dir: &Path) -> Vec<Problem> {
    let dir = dir.to_path_buf();
    match within_time(move || verify(&dir, &Limits::default(), None, &PerCore::new())) {
        Err(BundleError::Invalid { problems }) => problems,
        other => panic!("expected problems, got {other:?}"),
    }
}

fn one_problem(dir: &Path, path: &str, want: &str) {
    let got = problems(dir);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].path.as_deref(), Some(path));
    assert!(
        got[0].message.contains(want),
        "{:?} should contain {want:?}",
        got[0].message
    );
}

#[test]
fn a_sealed_bundle_verifies() {
    let (_tmp, dir) = sealed();
    let v = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap();
    assert_eq!(v.dir, dir);
    assert_eq!(v.warnings, Vec::<String>::new());
    let paths: Vec<&str> = v.manifest.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, [".meta", "hello.txt", "notes/a.md"]);
    assert_eq!(v.manifest.files[1].sha256, HELLO_SHA);
    assert_eq!(v.manifest.files[1].size, 6);
}

#[test]
fn seal_output_is_pretty_ordered_and_round_trips() {
    let (_tmp, dir) = sealed();
    let text = fs::read_to_string(dir.join(MANIFEST)).unwrap();
    assert!(text.ends_with("}\n"));
    let keys = [
        "\"schema_version\": 1",
        "\"id\"",
        "\"created\": \"2026-06-04T11:55:00Z\"",
        "\"digest\"",
        "\"files\"",
    ];
    let at: Vec<usize> = keys
        .iter()
        .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} in {text}")))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "key order in {text}");
    let entry = ["\"path\": \"hello.txt\"", "\"sha256\"", "\"size\": 6"];
    let start = text.find(entry[0]).unwrap();
    let at: Vec<usize> = entry
        .iter()
        .map(|k| start + text[start..].find(k).unwrap())
        .collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "entry key order in {text}"
    );
    let parsed = parse_manifest(text.as_bytes()).unwrap();
    assert_eq!(parsed, read_manifest(&dir).unwrap());
    assert_eq!(parsed.to_json(), text);
    assert!(
        !fs::read_dir(&dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("tmp"))
    );
}

#[test]
fn seal_defaults_created_to_now_in_whole_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("x"), "x").unwrap();
    let before = OffsetDateTime::now_utc().truncate_to_second();
    let m = seal(tmp.path(), "x1", None).unwrap();
    assert_eq!(m.created.nanosecond(), 0);
    assert_eq!(m.created.offset(), UtcOffset::UTC);
    assert!(m.created >= before);
    assert!(!m.created_text().contains('.'));
}

#[test]
fn seal_skips_manifest_and_reserved_names_and_reseals() {
    let (_tmp, dir) = sealed();
    fs::write(dir.join(".distributor-result.json"), "{}").unwrap();
    fs::create_dir(dir.join(".distributor-tmp")).unwrap();
    fs::write(dir.join(".distributor-tmp/x"), "x").unwrap();
    fs::write(dir.join("notes/.distributor.lock"), "").unwrap();
    let again = seal(&dir, "second", None).unwrap();
    assert_eq!(again.files.len(), 3);
    assert!(
        again
            .files
            .iter()
            .all(|f| !f.path.is_reserved() && f.path.as_str() != MANIFEST)
    );
    assert_eq!(
        verify(&dir, &Limits::default(), None, &PerCore::new())
            .unwrap()
            .warnings,
        Vec::<String>::new()
    );
}

#[test]
fn seal_refuses_a_bad_id_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("x"), "x").unwrap();
    let e = seal(tmp.path(), "-bad", None).unwrap_err();
    assert!(matches!(e, SealError::BadId { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("must start with a letter or digit"));
    assert!(!tmp.path().join(MANIFEST).exists());
}

#[test]
fn seal_refuses_an_empty_folder() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("empty-sub")).unwrap();
    let e = seal(tmp.path(), "x", None).unwrap_err();
    assert!(matches!(e, SealError::Empty { .. }), "{e:?}");
    assert_eq!(e.exit_code(), 1);
}

#[test]
fn seal_refuses_symlinks_and_fifos_naming_each() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::write(dir.join("ok.txt"), "ok").unwrap();
    fs::write(tmp.path().join("outside"), "secret").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("outside"), dir.join("link")).unwrap();
    std::os::unix::fs::symlink(tmp.path(), dir.join("sub/dirlink")).unwrap();
    mkfifo(&dir.join("sub/pipe"));
    let d = dir.clone();
    let e = within_time(move || seal(&d, "x", None)).unwrap_err();
    let SealError::Refused { problems, .. } = &e else {
        panic!("{e:?}");
    };
    let shown: Vec<String> = problems.iter().map(Problem::to_string).collect();
    assert_eq!(
        shown,
        [
            "link: is a symbolic link",
            "sub/dirlink: is a symbolic link",
            "sub/pipe: is a named pipe (FIFO)"
        ]
    );
    assert_eq!(e.exit_code(), 1);
    assert!(!dir.join(MANIFEST).exists());
}

#[test]
fn seal_refuses_names_that_are_not_clean() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("back\\slash"), "x").unwrap();
    fs::write(tmp.path().join(OsStr::from_bytes(b"bad\xff")), "x").unwrap();
    let e = seal(tmp.path(), "x", None).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("back\\slash: name cannot be used: path contains a backslash"),
        "{text}"
    );
    assert!(text.contains("not valid UTF-8"), "{text}");
}

#[test]
fn tampered_content_is_a_hash_problem() {
    let (_tmp, dir) = sealed();
    fs::write(dir.join("hello.txt"), "jello\n").unwrap();
    one_problem(
        &dir,
        "hello.txt",
        &format!("manifest.json says {HELLO_SHA}, the file hashes to sha256:"),
    );
}

#[test]
fn truncated_and_grown_files_are_size_problems() {
    let (_tmp, dir) = sealed();
    fs::write(dir.join("hello.txt"), "hel").unwrap();
    one_problem(
        &dir,
        "hello.txt",
        "size is 3 bytes but manifest.json says 6",
    );
    fs::write(dir.join("hello.txt"), "hello, world\n").unwrap();
    one_problem(
        &dir,
        "hello.txt",
        "size is 13 bytes but manifest.json says 6",
    );
}

#[test]
fn missing_file_is_reported() {
    let (_tmp, dir) = sealed();
    fs::remove_file(dir.join("notes/a.md")).unwrap();
    one_problem(&dir, "notes/a.md", "listed in manifest.json but not found");
    fs::remove_dir(dir.join("notes")).unwrap();
    one_problem(
        &dir,
        "notes/a.md",
        "not found (there is no folder \"notes\")",
    );
}

#[test]
fn symlink_to_a_file_is_refused() {
    let (tmp, dir) = sealed();
    fs::write(tmp.path().join("copy"), "hello\n").unwrap();
    fs::remove_file(dir.join("hello.txt")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("copy"), dir.join("hello.txt")).unwrap();
    one_problem(&dir, "hello.txt", "is a symbolic link");
    let e = open_listed(&dir, &RelPath::parse("hello.txt").unwrap()).unwrap_err();
    assert!(e.to_string().contains("symbolic link"));
}

#[test]
fn symlinked_intermediate_folder_is_refused() {
    let (tmp, dir) = sealed();
    fs::rename(dir.join("notes"), tmp.path().join("real-notes")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("real-notes"), dir.join("notes")).unwrap();
    one_problem(&dir, "notes/a.md", "folder \"notes\" is a symbolic link");
}

#[test]
fn fifo_socket_and_folder_are_refused_without_blocking() {
    let (_tmp, dir) = sealed();
    fs::remove_file(dir.join("hello.txt")).unwrap();
    mkfifo(&dir.join("hello.txt"));
    one_problem(
        &dir,
        "hello.txt",
        "is a named pipe (FIFO), not a regular file",
    );
    let d = dir.clone();
    let opened = within_time(move || open_listed(&d, &RelPath::parse("hello.txt").unwrap()));
    assert!(opened.unwrap_err().to_string().contains("FIFO"));

    fs::remove_file(dir.join("hello.txt")).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(dir.join("hello.txt")).unwrap();
    one_problem(&dir, "hello.txt", "is a socket");

    fs::remove_file(dir.join("hello.txt")).unwrap();
    fs::create_dir(dir.join("hello.txt")).unwrap();
    one_problem(&dir, "hello.txt", "is a folder, not a regular file");
}

#[test]
fn file_where_a_folder_should_be_is_refused() {
    let (_tmp, dir) = sealed();
    fs::remove_dir_all(dir.join("notes")).unwrap();
    fs::write(dir.join("notes"), "x").unwrap();
    one_problem(
        &dir,
        "notes/a.md",
        "\"notes\" is a regular file, not a folder",
    );
}

#[test]
fn every_problem_is_reported() {
    let (_tmp, dir) = sealed();
    fs::write(dir.join("hello.txt"), "jello\n").unwrap();
    fs::remove_file(dir.join("notes/a.md")).unwrap();
    mkfifo(&dir.join("notes/a.md"));
    fs::write(dir.join(".meta"), "").unwrap();
    let got: Vec<String> = problems(&dir).iter().map(Problem::to_string).collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].starts_with(".meta: size is 0 bytes"), "{got:?}");
    assert!(
        got[1].starts_with("hello.txt: content does not match"),
        "{got:?}"
    );
    assert!(got[2].starts_with("notes/a.md: is a named pipe"), "{got:?}");
    let e = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap_err();
    assert!(!e.is_transient());
    assert!(
        e.to_string()
            .starts_with("bundle does not match manifest.json (3 problems): .meta: ")
    );
}

#[test]
fn unlisted_entries_are_warnings() {
    let (_tmp, dir) = sealed();
    fs::write(dir.join("extra.txt"), "x").unwrap();
    fs::create_dir_all(dir.join("deeper/still")).unwrap();
    fs::write(dir.join("deeper/still/more"), "x").unwrap();
    std::os::unix::fs::symlink("hello.txt", dir.join("notes/link")).unwrap();
    fs::write(dir.join(".distributor-result.json"), "{}").unwrap();
    fs::write(dir.join("notes/.distributor-tmp-1"), "").unwrap();
    let v = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap();
    assert_eq!(
        v.warnings,
        [
            "deeper/still/more: present but not listed in manifest.json; ignored",
            "extra.txt: present but not listed in manifest.json; ignored",
            "notes/link: a symbolic link present but not listed in manifest.json; ignored",
        ]
    );
}

#[test]
fn many_unlisted_files_are_summarised() {
    let (_tmp, dir) = sealed();
    for i in 0..MAX_WARNINGS + 5 {
        fs::write(dir.join(format!("u{i:04}")), "").unwrap();
    }
    let v = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap();
    assert_eq!(v.warnings.len(), MAX_WARNINGS + 1);
    assert!(v.warnings[MAX_WARNINGS].starts_with("5 more entries"));
}

#[test]
fn manifest_must_be_a_regular_file() {
    let (tmp, dir) = sealed();
    fs::rename(dir.join(MANIFEST), tmp.path().join("m.json")).unwrap();
    let e = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap_err();
    assert!(matches!(e, BundleError::Unreadable { .. }), "{e:?}");
    assert!(e.to_string().contains("manifest.json: not found"), "{e}");
    assert!(!e.is_transient());

    std::os::unix::fs::symlink(tmp.path().join("m.json"), dir.join(MANIFEST)).unwrap();
    let e = verify(&dir, &Limits::default(), None, &PerCore::new()).unwrap_err();
    assert!(e.to_string().contains("is a symbolic link"), "{e}");

    fs::remove_file(dir.join(MANIFEST)).unwrap();
    mkfifo(&dir.join(MANIFEST));
    let d = dir.clone();
    let e = within_time(move || read_manifest(&d)).unwrap_err();
    assert!(e.to_string().contains("is a named pipe (FIFO)"), "{e}");
}

#[test]
fn missing_bundle_folder_is_unreadable() {
    let tmp = tempfile::tempdir().unwrap();
    let e = verify(
        &tmp.path().join("nope"),
        &Limits::default(),
        None,
        &PerCore::new(),
    )
    .unwrap_err();
    assert!(matches!(e, BundleError::Unreadable { .. }));
    assert!(
        e.to_string().contains("cannot open the bundle folder"),
        "{e}"
    );
}

#[test]
fn open_listed_reads_a_good_file() {
    let (_tmp, dir) = sealed();
    let mut f = open_listed(&dir, &RelPath::parse("notes/a.md").unwrap()).unwrap();
    let mut text = String::new();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "# A\n");
}

proptest::proptest! {
    #[test]
    fn parse_never_panics_on_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = parse_manifest(&bytes);
    }

    #[test]
    fn parse_never_panics_on_json_like_text(text in "[\\[\\]{}\",:0-9a-z_. \\-\\n]{0,300}") {
        let _ = parse_manifest(text.as_bytes());
    }

    #[test]
    fn parse_never_panics_on_near_manifests(
        version in "1|2|-1|1.0|\"1\"|null|18446744073709551616",
        id in "[a-z.\\-]{0,10}|\"x\"",
        created in "\"2026-06-04T11:55:00Z\"|\"9999-12-31T23:59:59-01:00\"|\"x\"|0",
        path in "\"[a-z./\\\\]{0,8}\"|1|null",
        size in "0|-0|6|1e3|-5|\"6\"|99999999999999999999999",
        extra in "|, \"z\": 1",
    ) {
        let text = format!(
            "{{\"schema_version\": {version}, \"id\": \"{id}\", \"created\": {created}, \"digest\": \"{ZEROS}\", \"files\": [{{\"path\": {path}, \"sha256\": \"{HELLO_SHA}\", \"size\": {size}{extra}}}]}}"
        );
        let _ = parse_manifest(text.as_bytes());
    }
}

proptest::proptest! {
    /// Manifests with hostile paths but a correct digest: whatever parses
    /// names only clean, unreserved, non-clashing paths inside the bundle.
    #[test]
    fn whatever_parses_stays_inside_the_bundle(
        paths in proptest::collection::vec(
            "(\\.\\.|\\.|a|b|\\.distributor-x|manifest\\.json|c\\\\d|\u{1b}|é|/){1,4}",
            1..5,
        ),
    ) {
        let files: Vec<serde_json::Value> = paths
            .iter()
            .map(|p| json!({"path": p, "sha256": HELLO_SHA, "size": 6}))
            .collect();
        let mut digest_text = String::new();
        let mut sorted: Vec<&String> = paths.iter().collect();
        sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for p in sorted {
            digest_text.push_str(&format!("{HELLO_SHA} 6 {p}\n"));
        }
        let digest = hashing::hash_bytes(digest_text.as_bytes()).sha256;
        let doc = json!({
            "schema_version": 1, "id": "x", "created": "2026-06-04T11:55:00Z",
            "digest": digest, "files": files,
        });
        if let Ok(m) = parse_manifest(doc.to_string().as_bytes()) {
            for f in &m.files {
                let p = f.path.as_str();
                proptest::prop_assert!(RelPath::parse(p).is_ok(), "{p:?}");
                proptest::prop_assert!(p != MANIFEST, "{p:?}");
                proptest::prop_assert!(
                    p.split('/').all(|s| !s.starts_with(".distributor") && s != ".." && s != "."),
                    "{p:?}"
                );
                proptest::prop_assert!(!p.chars().any(char::is_control), "{p:?}");
                for g in &m.files {
                    proptest::prop_assert!(!g.path.as_str().starts_with(&format!("{p}/")), "{p:?} is a folder of {:?}", g.path);
                }
            }
            proptest::prop_assert_eq!(compute_digest(&m.files), m.digest);
        }
    }
}
