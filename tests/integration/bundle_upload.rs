//! `distributor bundle upload DIR s3://BUCKET/PATH/inbox/NAME` against the
//! real SeaweedFS (docs/contract.md §22.1), and the `rclone copy` recipe of
//! docs/producers.md: what lands in the bucket, in which order (through a
//! proxy that records every request), and what is refused before anything
//! is sent.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::seaweed::{Bucket, Exchange, RecordingProxy, credentials, server};
use crate::signatures::keygen;
use crate::util::{CREATED, Output, Rng, Test, strings};

/// A file larger than one part of the s3 module's uploads (8 MiB), so
/// that it goes up as a multipart upload.
const BIG: usize = 9 * 1024 * 1024;

/// `distributor bundle upload DIR URL --endpoint ENDPOINT ARGS...` with
/// the test server's credentials.
fn upload(t: &Test, dir: &Path, url: &str, endpoint: &str, args: &[&str]) -> Output {
    let creds = credentials();
    t.cmd()
        .env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .args(["bundle", "upload"])
        .arg(dir)
        .arg(url)
        .args(["--endpoint", endpoint])
        .args(args)
        .output()
}

/// `bundles/<name>` with a few files, one of them [`BIG`], sealed.
fn bundle(t: &Test, name: &str) -> PathBuf {
    let mut rng = Rng::seeded(name);
    t.sealed(
        name,
        &[
            ("report.md", b"# Report\n"),
            ("charts/a.png", &rng.bytes(3000)),
            ("data/big.bin", &rng.bytes(BIG)),
            ("empty.txt", b""),
        ],
    )
}

/// The listed files of the bundle in `dir`, from its manifest.
fn listed(dir: &Path) -> Vec<String> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect()
}

/// The key a request is about, below `/<bucket>/`, without the query.
fn key_of<'a>(e: &'a Exchange, bucket: &str) -> Option<&'a str> {
    let path = e.target.split('?').next()?;
    path.strip_prefix('/')?
        .strip_prefix(bucket)?
        .strip_prefix('/')
        .filter(|key| !key.is_empty())
}

/// The prefix a LIST request asks for (`?list-type=2&prefix=...`).
fn listed_prefix(e: &Exchange) -> Option<String> {
    let query = e.target.split_once('?')?.1;
    let prefix = query.split('&').find_map(|p| p.strip_prefix("prefix="))?;
    Some(prefix.replace("%2F", "/"))
}

/// Every object below `prefix` equals the file of the same name in `dir`,
/// and there is one for each of `files` and no other.
#[track_caller]
fn assert_objects_are_the_files(bucket: &Bucket, prefix: &str, dir: &Path, files: &[String]) {
    let want: BTreeSet<String> = files.iter().map(|f| format!("{prefix}/{f}")).collect();
    assert_eq!(bucket.keys(), want, "the objects in the bucket");
    for file in files {
        let object = bucket.get(&format!("{prefix}/{file}")).unwrap();
        assert!(
            object == std::fs::read(dir.join(file)).unwrap(),
            "{prefix}/{file} holds other bytes than the file"
        );
    }
}

/// A signed bundle with a file it does not list: every listed file, then
/// the signature, then the manifest are uploaded, the manifest's PUT the
/// last request and sent only once every other object was stored; the
/// unlisted file is not uploaded, and a warning says so. No request goes
/// outside the bundle's prefix (no conformance probe).
#[test]
fn an_upload_puts_every_listed_file_then_the_signature_then_the_manifest_last() {
    let t = Test::new();
    let dir = t.mkdir("bundles/2026-06-04");
    let mut rng = Rng::seeded("an_upload_puts_every_listed_file");
    t.write("bundles/2026-06-04/report.md", "# Report\n");
    t.write("bundles/2026-06-04/charts/a.png", rng.bytes(3000));
    t.write("bundles/2026-06-04/data/big.bin", rng.bytes(BIG));
    t.write("bundles/2026-06-04/empty.txt", "");
    let key = keygen(&t, "producer", &["ed25519"], "");
    t.cmd()
        .args(["bundle", "seal"])
        .arg(&dir)
        .args(["--id", "reports.2026-06-04", "--created", CREATED, "--sign"])
        .arg(&key.private)
        .output()
        .expect_code(0);
    t.write("bundles/2026-06-04/notes.txt", "not listed");
    let signers = t.write("signers", format!("ci@example {}\n", key.public));

    let bucket = Bucket::new("");
    let name = bucket.location.bucket.clone();
    let proxy = RecordingProxy::start(&server().endpoint);
    let url = format!("s3://{name}/reports/inbox/2026-06-04");
    let signers = signers.to_str().unwrap();
    let out = upload(
        &t,
        &dir,
        &url,
        &proxy.endpoint,
        &["--json", "--signers", signers],
    );
    out.expect_code(0);
    let log = proxy.take();

    let prefix = "reports/inbox/2026-06-04";
    let mut objects = listed(&dir);
    objects.extend(["manifest.json.sig".to_owned(), "manifest.json".to_owned()]);
    assert_objects_are_the_files(&bucket, prefix, &dir, &objects);

    let doc = out.json();
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(doc["url"], url);
    assert_eq!(doc["id"], "reports.2026-06-04");
    assert_eq!(doc["signer"]["principal"], "ci@example", "{doc}");
    assert_eq!(doc["error"], serde_json::Value::Null);
    let keys: Vec<String> = doc["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = objects.iter().map(|f| format!("{prefix}/{f}")).collect();
    assert_eq!(keys, want, "the objects in the order uploaded");
    let size = |f: &str| std::fs::metadata(dir.join(f)).unwrap().len();
    let bytes: u64 = objects.iter().map(|f| size(f)).sum();
    assert_eq!(doc["bytes"], bytes, "{doc}");
    assert!(
        strings(&doc["warnings"])
            .iter()
            .any(|w| w.contains("notes.txt")),
        "{doc}"
    );

    // One listing of the bundle's prefix, then writes below it: no probe,
    // no read, nothing else.
    let (list, writes) = log.split_first().unwrap();
    assert_eq!(list.method, "GET", "{list:?}");
    assert_eq!(listed_prefix(list), Some(format!("{prefix}/")), "{list:?}");
    for e in writes {
        assert!(matches!(e.method.as_str(), "PUT" | "POST"), "{e:?}");
        let key = key_of(e, &name).unwrap_or_default();
        assert!(key.starts_with(&format!("{prefix}/")), "{e:?}");
    }
    assert!(
        log.iter().all(|e| (200..300).contains(&e.status)),
        "every request succeeded: {log:#?}"
    );
    assert!(
        log.iter()
            .any(|e| e.method == "POST" && e.target.contains("?uploads")),
        "data/big.bin went up as a multipart upload: {log:#?}"
    );
    let (manifest, signature) = (
        format!("{prefix}/manifest.json"),
        format!("{prefix}/manifest.json.sig"),
    );
    let last = log.iter().max_by_key(|e| e.started).unwrap();
    assert_eq!(
        (last.method.as_str(), key_of(last, &name)),
        ("PUT", Some(manifest.as_str())),
        "the manifest's PUT is the last request"
    );
    let manifest_puts = writes
        .iter()
        .filter(|e| key_of(e, &name) == Some(manifest.as_str()))
        .count();
    assert_eq!(manifest_puts, 1, "one request puts the manifest");
    let signature = writes
        .iter()
        .find(|e| key_of(e, &name) == Some(signature.as_str()))
        .expect("a PUT of the signature");
    for e in writes {
        if e.started < signature.started {
            continue;
        }
        let key = key_of(e, &name).unwrap();
        assert!(
            key.ends_with("/manifest.json.sig") || key.ends_with("/manifest.json"),
            "{key} was written after the signature had been sent"
        );
    }
    for e in writes.iter().filter(|e| !std::ptr::eq(*e, last)) {
        assert!(
            e.answered < last.started,
            "{:?} had not been answered when the manifest was sent",
            e.target
        );
    }

    // The text form says the same, one line per object.
    let again = Bucket::new("");
    let url = format!("s3://{}/reports/inbox/2026-06-04", again.location.bucket);
    let out = upload(&t, &dir, &url, &server().endpoint, &[]);
    out.expect_code(0);
    assert!(out.stderr.contains("notes.txt"), "{}", out.stderr);
    assert!(out.stderr.contains("not uploaded"), "{}", out.stderr);
    let puts: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("put "))
        .collect();
    assert_eq!(puts.len(), objects.len(), "{}", out.stdout);
    assert!(
        puts.last().unwrap().contains("/manifest.json ("),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("ok: bundle reports.2026-06-04"),
        "{}",
        out.stdout
    );
}

/// A bundle that does not match its manifest (a file changed after
/// sealing, another removed) is refused with every problem named, exit 1,
/// before a single request.
#[test]
fn a_broken_bundle_uploads_nothing() {
    let t = Test::new();
    let dir = bundle(&t, "broken");
    t.write("bundles/broken/report.md", "# Tampered\n");
    std::fs::remove_file(dir.join("charts/a.png")).unwrap();
    let bucket = Bucket::new("");
    let proxy = RecordingProxy::start(&server().endpoint);
    let url = format!("s3://{}/reports/inbox/broken", bucket.location.bucket);

    let out = upload(&t, &dir, &url, &proxy.endpoint, &[]);
    out.expect_code(1);
    assert!(out.stdout.contains("invalid bundle"), "{}", out.all());
    for named in ["report.md: ", "charts/a.png: ", "re-seal"] {
        assert!(out.stdout.contains(named), "names {named}:\n{}", out.all());
    }
    assert!(
        out.stderr.contains("nothing was uploaded"),
        "{}",
        out.stderr
    );

    let out = upload(&t, &dir, &url, &proxy.endpoint, &["--json"]);
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["ok"], false);
    assert_eq!(strings(&doc["problems"]).len(), 2, "{doc}");
    assert_eq!(doc["objects"], serde_json::json!([]));

    let log = proxy.take();
    assert!(log.is_empty(), "no request at all: {log:#?}");
    assert_eq!(bucket.keys(), BTreeSet::new());
}

/// A signature that the `--signers` file does not allow is refused before
/// anything is sent, as the agent would refuse it.
#[test]
fn a_signature_the_signers_refuse_uploads_nothing() {
    let t = Test::new();
    let dir = t.mkdir("bundles/signed");
    t.write("bundles/signed/report.md", "# Report\n");
    let used = keygen(&t, "used", &["ed25519"], "");
    let allowed = keygen(&t, "allowed", &["ed25519"], "");
    t.cmd()
        .args(["bundle", "seal"])
        .arg(&dir)
        .args(["--id", "signed", "--sign"])
        .arg(&used.private)
        .output()
        .expect_code(0);
    let signers = t.write("signers", format!("ci@example {}\n", allowed.public));
    let proxy = RecordingProxy::start(&server().endpoint);

    let args = ["--json", "--signers", signers.to_str().unwrap()];
    let out = upload(&t, &dir, "s3://b-x/r/inbox/signed", &proxy.endpoint, &args);
    out.expect_code(1);
    assert_eq!(
        out.json()["signature_refused"],
        "unknown_key",
        "{}",
        out.stdout
    );
    assert!(proxy.take().is_empty(), "no request at all");
}

/// An inbox that holds the bundle's manifest already (delivered, waiting
/// for the agent) is refused, exit 1, naming the fix; nothing is written,
/// not even the other objects.
#[test]
fn an_existing_manifest_is_refused_and_nothing_is_overwritten() {
    let t = Test::new();
    let dir = bundle(&t, "2026-06-04");
    let bucket = Bucket::new("");
    let prefix = "reports/inbox/2026-06-04";
    let planted = [
        (
            format!("{prefix}/manifest.json"),
            &b"{\"the\": \"delivered one\"}"[..],
        ),
        (format!("{prefix}/report.md"), &b"# Delivered\n"[..]),
    ];
    for (key, bytes) in &planted {
        bucket.plant(key, bytes);
    }
    let proxy = RecordingProxy::start(&server().endpoint);
    let url = format!("s3://{}/{prefix}", bucket.location.bucket);

    let out = upload(&t, &dir, &url, &proxy.endpoint, &[]);
    out.expect_code(1);
    for said in [
        "manifest.json already exists",
        "Choose another name",
        "distributor spool delete",
        "nothing was uploaded",
    ] {
        assert!(out.stderr.contains(said), "says {said:?}:\n{}", out.stderr);
    }
    let log = proxy.take();
    assert!(
        log.iter().all(|e| listed_prefix(e).is_some()),
        "the bundle's prefix was listed, nothing written: {log:#?}"
    );
    let keys: BTreeSet<String> = planted.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(bucket.keys(), keys);
    for (key, bytes) in &planted {
        assert_eq!(
            bucket.get(key).as_deref(),
            Some(*bytes),
            "{key} is unchanged"
        );
    }
}

/// What an interrupted upload left (files, no manifest) is overwritten by
/// the same command run again.
#[test]
fn a_retry_overwrites_what_an_interrupted_upload_left() {
    let t = Test::new();
    let dir = bundle(&t, "retried");
    let bucket = Bucket::new("");
    let prefix = "intake-path/inbox/retried";
    bucket.plant(&format!("{prefix}/report.md"), b"# cut short");
    bucket.plant(&format!("{prefix}/data/big.bin"), b"cut short");
    let url = format!("s3://{}/{prefix}", bucket.location.bucket);

    upload(&t, &dir, &url, &server().endpoint, &[]).expect_code(0);
    let mut files = listed(&dir);
    files.push("manifest.json".to_owned());
    assert_objects_are_the_files(&bucket, prefix, &dir, &files);
}

/// A URL of another form, a bundle name the inbox would not take, an
/// endpoint that is no server URL and missing credentials are usage
/// errors (exit 2), told before any request.
#[test]
fn a_bad_url_name_endpoint_or_missing_credentials_is_a_usage_error() {
    let t = Test::new();
    let dir = t.bundle("b", &[("a.txt", "a")]);
    let endpoint = "http://127.0.0.1:9";
    // (url, what the message says)
    let cases = [
        ("s3://intake/reports/b", "s3://BUCKET/PATH/inbox/NAME"),
        ("s3://intake/reports/inbox", "s3://BUCKET/PATH/inbox/NAME"),
        (
            "https://intake/reports/inbox/b",
            "s3://BUCKET/PATH/inbox/NAME",
        ),
        ("intake/reports/inbox/b", "s3://BUCKET/PATH/inbox/NAME"),
        ("s3://intake/reports/inbox/.staging-b", "starts with '.'"),
        (
            "s3://intake/reports/inbox/b/c",
            "s3://BUCKET/PATH/inbox/NAME",
        ),
    ];
    for (url, says) in cases {
        let out = upload(&t, &dir, url, endpoint, &[]);
        out.expect_code(2);
        assert!(out.stderr.contains(says), "{url}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{url}: {}", out.stdout);
    }
    let url = "s3://intake/reports/inbox/b";
    let out = upload(&t, &dir, url, "ftp://127.0.0.1:21", &[]);
    out.expect_code(2);
    assert!(out.stderr.contains("--endpoint"), "{}", out.stderr);

    let out = t
        .cmd()
        .env("AWS_ACCESS_KEY_ID", "")
        .env("AWS_SECRET_ACCESS_KEY", "")
        .args(["bundle", "upload"])
        .arg(&dir)
        .args([url, "--endpoint", endpoint])
        .output();
    out.expect_code(2);
    assert!(out.stderr.contains("AWS_ACCESS_KEY_ID"), "{}", out.stderr);
}

/// The `rclone copy` recipe of docs/producers.md, run as written: every
/// file but the manifest, then the manifest. The bucket holds the whole
/// bundle, and the manifest's PUT was sent after every other object was
/// stored.
#[test]
fn the_rclone_recipe_delivers_the_bundle_with_the_manifest_last() {
    let rclone = which_rclone();
    let t = Test::new();
    let dir = bundle(&t, "2026-06-04");
    let key = keygen(&t, "producer", &["ed25519"], "");
    crate::signatures::ssh_sign(&key.private, &dir.join("manifest.json"), "distributor");
    let bucket = Bucket::new("");
    let name = bucket.location.bucket.clone();
    let proxy = RecordingProxy::start(&server().endpoint);
    let creds = credentials();
    // The remote of docs/producers.md, for a server other than AWS.
    let config = t.write(
        "rclone.conf",
        format!(
            "[intake]\ntype = s3\nprovider = Other\nendpoint = {}\nenv_auth = true\nno_check_bucket = true\nno_head = true\n",
            proxy.endpoint
        ),
    );
    let dest = format!("intake:{name}/reports/inbox/2026-06-04");
    let rclone_copy = |filter: &[&str]| {
        let out = Command::new(&rclone)
            .current_dir(t.join("bundles"))
            .env("RCLONE_CONFIG", &config)
            // rclone 1.60 fails on any AWS_CA_BUNDLE ("unsupported
            // transport"); the test server speaks plain HTTP anyway.
            .env_remove("AWS_CA_BUNDLE")
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .arg("copy")
            .args(filter)
            .arg("2026-06-04")
            .arg(&dest)
            .output()
            .expect("run rclone");
        assert!(
            out.status.success(),
            "rclone copy {filter:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    rclone_copy(&["--exclude", "/manifest.json"]);
    rclone_copy(&["--include", "/manifest.json"]);

    let prefix = "reports/inbox/2026-06-04";
    let mut files = listed(&dir);
    files.extend(["manifest.json.sig".to_owned(), "manifest.json".to_owned()]);
    assert_objects_are_the_files(&bucket, prefix, &dir, &files);
    let log = proxy.take();
    let manifest = format!("{prefix}/manifest.json");
    let writes: Vec<&Exchange> = log
        .iter()
        .filter(|e| matches!(e.method.as_str(), "PUT" | "POST"))
        .filter(|e| key_of(e, &name).is_some())
        .collect();
    let last = writes
        .iter()
        .find(|e| key_of(e, &name) == Some(manifest.as_str()))
        .expect("a PUT of the manifest");
    for e in writes.iter().filter(|e| !std::ptr::eq(**e, *last)) {
        assert!(
            e.answered < last.started,
            "{} had not been stored when the manifest was sent",
            e.target
        );
    }
}

/// rclone, or a failure naming the fix.
fn which_rclone() -> PathBuf {
    let found = Command::new("rclone")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "rclone is not installed, and the recipe test runs the real tool: install it (scripts/install-test-deps does)"
    );
    PathBuf::from("rclone")
}
