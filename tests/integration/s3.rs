//! The s3 backend against a real server (SeaweedFS, started by
//! `seaweed::server`): the conformance check, its refusal of a server that
//! ignores conditional headers, the catalog's compare-and-swap under a
//! race, conditional and multipart uploads, and the commit protocol.

use std::io::Read;
use std::process::Command;
use std::time::Instant;

use distributor::catalog::{Catalog, OutputKind, OutputRecord, SourceIdentity, State};
use distributor::config::S3Location;
use distributor::paths::RelPath;
use distributor::s3::headers::HeaderRules;
use distributor::s3::protocol::{self, Base, Settings, Write};
use distributor::s3::{Error, S3Root};

use crate::seaweed::{header_stripping_proxy, server};
use crate::util::sha256_of;

/// `left` bytes of a pattern, generated while read (nothing stored).
struct Pattern {
    left: u64,
    at: u64,
}

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for b in &mut buf[..n] {
            *b = (self.at.wrapping_mul(2_654_435_761) >> 13) as u8;
            self.at += 1;
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[test]
fn seaweedfs_passes_the_conformance_check() {
    let root = server().root("site");
    root.probe().expect("SeaweedFS enforces conditional writes");
    assert_eq!(
        root.list("").unwrap(),
        vec![],
        "the probe leaves nothing behind"
    );
}

#[test]
fn a_server_that_ignores_conditional_headers_is_refused() {
    let s = server();
    // A bucket with one object in it, made through the server directly.
    let bucket = s.location("");
    S3Root::open_with(&bucket, s.credentials())
        .unwrap()
        .put_new("other", &mut &b"x"[..], None, "i")
        .unwrap();
    let location = S3Location {
        endpoint: Some(header_stripping_proxy(&s.endpoint)),
        ..bucket.clone()
    };
    let root = crate::seaweed::unsigned_root(&location);
    // Plain writes work through the proxy ...
    root.check_conformance()
        .expect_err("the check refuses before the first write");
    let e = root
        .put_new("a.html", &mut &b"x"[..], None, "i")
        .unwrap_err();
    // ... but the backend refuses to write, naming what the server did.
    let text = e.to_string();
    assert!(matches!(e, Error::Nonconforming { .. }), "{e:?}");
    assert_eq!(e.stage(), distributor::report::Stage::Lock);
    assert!(!e.is_transient());
    for want in [
        "accepted a second If-None-Match: * create of the same key",
        "ignores conditional writes",
        "SeaweedFS >= 4.48",
    ] {
        assert!(text.contains(want), "{want:?} missing from: {text}");
    }
    // Nothing was written but the probes, which were removed again.
    let direct = S3Root::open_with(&bucket, s.credentials()).unwrap();
    let keys: Vec<String> = direct
        .list("")
        .unwrap()
        .into_iter()
        .map(|l| l.path)
        .collect();
    assert_eq!(keys, ["other"]);
}

#[test]
fn the_catalog_compare_and_swap_loses_no_update_under_a_race() {
    const THREADS: usize = 8;
    const EACH: usize = 10;
    let s = server();
    let location = s.location("race");
    S3Root::open_with(&location, s.credentials())
        .unwrap()
        .write_catalog(b"0\n".to_vec().into(), None)
        .unwrap();
    let won: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let location = location.clone();
                scope.spawn(move || {
                    let root = S3Root::open_with(&location, s.credentials()).unwrap();
                    let mut won = 0;
                    let mut lost = 0;
                    while won < EACH {
                        let (bytes, etag) = root.read_catalog().unwrap().unwrap();
                        let n: usize = String::from_utf8(bytes.to_vec())
                            .unwrap()
                            .trim()
                            .parse()
                            .unwrap();
                        match root
                            .write_catalog(format!("{}\n", n + 1).into_bytes().into(), Some(&etag))
                        {
                            Ok(_) => won += 1,
                            Err(Error::Conflict { .. }) => lost += 1,
                            Err(e) => panic!("{e}"),
                        }
                        assert!(lost < 10_000, "no progress");
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let root = S3Root::open_with(&location, s.credentials()).unwrap();
    let (bytes, _) = root.read_catalog().unwrap().unwrap();
    assert_eq!(won, THREADS * EACH);
    assert_eq!(
        String::from_utf8(bytes.to_vec()).unwrap().trim(),
        (THREADS * EACH).to_string(),
        "every successful compare-and-swap is in the final value"
    );
}

#[test]
fn put_new_refuses_an_existing_key_and_put_replace_a_changed_one() {
    let root = server().root("p");
    let first = root
        .put_new("a.html", &mut &b"first"[..], None, "i1")
        .unwrap();
    let again = root.put_new("a.html", &mut &b"second"[..], None, "i2");
    assert!(matches!(again, Err(Error::Exists { .. })), "{again:?}");
    let head = root.head("a.html").unwrap().unwrap();
    assert_eq!(head.etag, first.etag);
    assert_eq!(head.sha256.as_deref(), Some(first.sha256.as_str()));
    assert_eq!(head.intent.as_deref(), Some("i1"));

    let second = root
        .put_replace("a.html", &mut &b"second"[..], &first.etag, None, "i2")
        .unwrap();
    let stale = root.put_replace("a.html", &mut &b"third"[..], &first.etag, None, "i3");
    assert!(matches!(stale, Err(Error::Changed { .. })), "{stale:?}");
    let (hashed, etag) = root.get_hashed("a.html").unwrap().unwrap();
    assert_eq!((hashed.sha256, etag), (second.sha256, second.etag));
}

/// Runs `s3::large_upload_child` in a child process (so its peak RSS is
/// its own) and checks the bound: memory must not grow with the object.
#[test]
fn a_large_object_goes_up_in_parts_hashed_in_one_pass_with_bounded_memory() {
    let s = server();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "s3::large_upload_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DISTRIBUTOR_S3_CHILD_ENDPOINT", &s.endpoint)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let value = |key: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.split_once(key).map(|(_, v)| v))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {key} in:\n{stdout}"))
    };
    let (baseline, peak) = (value("baseline_rss_kib="), value("peak_rss_kib="));
    eprintln!(
        "200 MiB upload: baseline {} MiB, peak {} MiB, {} MiB/s",
        baseline / 1024,
        peak / 1024,
        value("mib_per_s=")
    );
    assert!(
        peak.saturating_sub(baseline) <= 64 * 1024,
        "memory grew by {} KiB during a 200 MiB upload (bound 64 MiB)",
        peak - baseline
    );
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
#[ignore = "run in a child process by a_large_object_goes_up_in_parts_hashed_in_one_pass_with_bounded_memory"]
fn large_upload_child() {
    let Ok(endpoint) = std::env::var("DISTRIBUTOR_S3_CHILD_ENDPOINT") else {
        return;
    };
    const LEN: u64 = 200 * 1024 * 1024;
    let location = S3Location {
        bucket: format!("big{}", std::process::id()),
        path: "big".into(),
        endpoint: Some(endpoint),
        region: "us-east-1".into(),
    };
    let root = S3Root::open_with(&location, crate::seaweed::credentials()).unwrap();
    root.check_conformance().unwrap();
    let expected = sha256_of(Pattern { left: LEN, at: 0 });
    let baseline = status_kib("VmRSS:");
    let started = Instant::now();
    let written = root
        .put_new(
            "large.bin",
            &mut Pattern { left: LEN, at: 0 },
            Some(&expected),
            "big",
        )
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:");
    assert_eq!(
        (written.sha256.as_str(), written.size),
        (expected.as_str(), LEN)
    );
    // A multipart ETag is not an MD5 of the bytes; the sha256 is what counts.
    let (hashed, etag) = root.get_hashed("large.bin").unwrap().unwrap();
    assert_eq!(
        (hashed.sha256.as_str(), hashed.size),
        (expected.as_str(), LEN)
    );
    assert_eq!(etag, written.etag);
    let head = root.head("large.bin").unwrap().unwrap();
    assert_eq!(head.sha256.as_deref(), Some(expected.as_str()));
    root.delete("large.bin").unwrap();
    println!("baseline_rss_kib={baseline}");
    println!("peak_rss_kib={peak}");
    println!("mib_per_s={}", (LEN as f64 / 1048576.0 / secs) as u64);
}

fn record(path: &str, bytes: &[u8]) -> OutputRecord {
    let now = time::OffsetDateTime::now_utc();
    OutputRecord {
        path: RelPath::parse(path).unwrap(),
        pipeline_id: "p".into(),
        destination_id: "d".into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: "s".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            created: now,
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: distributor::catalog::Sha256::parse(&sha256_of(bytes)).unwrap(),
        size: bytes.len() as u64,
        created_at: now,
        updated_at: now,
    }
}

fn with(state: &State, records: &[OutputRecord]) -> Catalog {
    let mut c = match state {
        State::Catalog(c) => c.clone(),
        _ => Catalog::new(time::OffsetDateTime::now_utc()),
    };
    c.outputs
        .retain(|r| !records.iter().any(|n| n.path == r.path));
    c.outputs.extend(records.iter().cloned());
    c.sort();
    c
}

/// Two publishers commit onto one root at the same time; the one that
/// loses the compare-and-swap rebases and neither update is lost.
#[test]
fn concurrent_commits_on_the_server_both_land() {
    let s = server();
    let location = s.location("site");
    let publish = |path: &'static str, body: &'static [u8], base: Base| {
        let root = S3Root::open_with(&location, s.credentials()).unwrap();
        let mine = record(path, body);
        let next = with(&base.state, std::slice::from_ref(&mine));
        let mut rebase = |latest: &State| Some(with(latest, std::slice::from_ref(&mine)));
        let w = Write {
            path: path.to_owned(),
            sha256: mine.sha256.to_string(),
            source: Box::new(body),
            replaces: None,
            served: HeaderRules::default().served(path),
        };
        protocol::commit(
            &root,
            Settings::default(),
            base,
            next,
            vec![w],
            vec![],
            &mut rebase,
        )
        .unwrap()
    };
    let root = S3Root::open_with(&location, s.credentials()).unwrap();
    // Both read the same (absent) catalog before either commits.
    let (a, b) = (root.read_state().unwrap(), root.read_state().unwrap());
    let first = publish("a.html", b"A", a);
    let second = publish("b.html", b"B", b);
    assert_eq!((first.rebases, second.rebases), (0, 1));
    let State::Catalog(c) = root.read_state().unwrap().state else {
        panic!("no catalog")
    };
    let paths: Vec<&str> = c.outputs.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["a.html", "b.html"]);
    let keys: Vec<String> = root.list("").unwrap().into_iter().map(|l| l.path).collect();
    assert_eq!(
        keys,
        [".distributor.json", "a.html", "b.html"],
        "no intent is left"
    );
}
