//! What maintenance does on s3 roots only, run through the real binary
//! against the SeaweedFS of `seaweed::server` (the scenarios every
//! backend shares are in `maintain.rs`): a bucket that does not exist,
//! credentials missing or allowed only to read, an expired object changed
//! behind the catalog, recovery of a killed publisher's intent, and
//! publishers racing `prune`. Roots are seeded through the commit protocol
//! (each test in a bucket of its own).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output};

use distributor::catalog::{Catalog, OutputKind, OutputRecord, SourceIdentity, State};
use distributor::config::S3Location;
use distributor::paths::RelPath;
use distributor::s3::headers::HeaderRules;
use distributor::s3::protocol::{self, Settings, Write};
use distributor::s3::{Error, S3Root};
use object_store::ObjectStoreExt as _;
use serde_json::Value;

use crate::seaweed::{credentials, reader_credentials, server};
use crate::util::sha256;

const OLD: &str = "2026-01-01T00:00:00Z";

fn t(text: &str) -> time::OffsetDateTime {
    distributor::catalog::parse_time(text).unwrap()
}

/// One output to seed: path, owner pipeline (destination `site`), source
/// id, source `created`, record `updated_at`, bytes.
#[derive(Clone, Copy)]
struct Seed<'a> {
    path: &'a str,
    pipeline: &'a str,
    source: &'a str,
    created: &'a str,
    updated: &'a str,
    body: &'a str,
}

fn record(s: &Seed) -> OutputRecord {
    OutputRecord {
        path: RelPath::parse(s.path).unwrap(),
        pipeline_id: s.pipeline.into(),
        destination_id: "site".into(),
        source: std::sync::Arc::new(SourceIdentity {
            id: s.source.into(),
            digest: sha256(s.source.as_bytes()),
            created: t(s.created),
        }),
        kind: OutputKind::Source,
        source_path: None,
        transform: None,
        url: None,
        sha256: distributor::catalog::Sha256::parse(&sha256(s.body.as_bytes())).unwrap(),
        size: s.body.len() as u64,
        created_at: t(s.updated),
        updated_at: t(s.updated),
    }
}

/// `state`'s catalog with `records` upserted.
fn with(state: &State, records: &[OutputRecord]) -> Catalog {
    let mut c = match state {
        State::Catalog(c) => c.clone(),
        _ => Catalog::new(time::OffsetDateTime::now_utc()),
    };
    c.outputs
        .retain(|r| !records.iter().any(|n| n.path == r.path));
    c.outputs.extend(records.iter().cloned());
    c.updated_at = time::OffsetDateTime::now_utc();
    c.sort();
    c
}

/// Publishes `seeds` (new keys) in one commit, as a publisher would.
fn publish(root: &S3Root, seeds: &[Seed]) -> Result<(), Error> {
    let records: Vec<OutputRecord> = seeds.iter().map(record).collect();
    let base = root.read_state()?;
    let next = with(&base.state, &records);
    let writes = seeds
        .iter()
        .map(|s| Write {
            path: s.path.to_owned(),
            sha256: sha256(s.body.as_bytes()),
            source: Box::new(s.body.as_bytes()),
            replaces: None,
            served: HeaderRules::default().served(s.path),
        })
        .collect();
    let mut rebase = |latest: &State| Some(with(latest, &records));
    protocol::commit(
        root,
        Settings::default(),
        base,
        next,
        writes,
        vec![],
        &mut rebase,
    )
    .map(|_| ())
}

/// An s3 root with a config whose two pipelines share it: `reports/site`
/// (prefix `{source_id}/`, pruned after a day keeping the newest source)
/// and `blog/site` (prefix `blog/`, no policy), as in maintain.rs.
struct Fixture {
    dir: tempfile::TempDir,
    location: S3Location,
    root: S3Root,
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", self.stdout, self.stderr))
    }
    fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

fn ran(out: Output) -> Ran {
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

impl Fixture {
    fn new() -> Fixture {
        let s = server();
        let location = s.location("site");
        let dir = tempfile::tempdir().unwrap();
        let destination = |prefix: &str, retention: &str| {
            format!(
                "      - id: site\n        backend: s3\n        bucket: {}\n        path: site\n        endpoint: {}\n        prefix: \"{prefix}\"\n{retention}",
                location.bucket, s.endpoint
            )
        };
        let config = format!(
            "spool: ./spool\npipelines:\n  - id: reports\n    destinations:\n{}  - id: blog\n    destinations:\n{}",
            destination(
                "{source_id}/",
                "        retention:\n          prune:\n            max_age: 1d\n            keep_latest: 1\n"
            ),
            destination("blog/", "")
        );
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let root = S3Root::open_with(&location, s.credentials()).unwrap();
        Fixture {
            dir,
            location,
            root,
        }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    fn distributor(&self, args: &[&str], env: &[(&str, &str)]) -> Ran {
        let c = credentials();
        let out = Command::new(env!("CARGO_BIN_EXE_distributor"))
            .arg("--config")
            .arg(self.config())
            .args(args)
            .env("RUST_LOG", "warn")
            .env("AWS_ACCESS_KEY_ID", c.key_id)
            .env("AWS_SECRET_ACCESS_KEY", c.secret)
            .env_remove("AWS_SESSION_TOKEN")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        ran(out)
    }

    fn maintain(&self, command: &str, pipeline: &str, extra: &[&str]) -> Ran {
        self.maintain_env(command, pipeline, extra, &[])
    }

    fn maintain_env(
        &self,
        command: &str,
        pipeline: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Ran {
        let mut args = vec![command, "--pipeline", pipeline, "--destination", "site"];
        args.extend_from_slice(extra);
        self.distributor(&args, env)
    }

    fn json(&self, command: &str, pipeline: &str, extra: &[&str], code: i32) -> Value {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let r = self.maintain(command, pipeline, &extra);
        assert_eq!(r.code, code, "{command} {extra:?}: {}", r.both());
        r.json()
    }

    fn catalog(&self) -> Catalog {
        match self.root.read_state().unwrap().state {
            State::Catalog(c) => c,
            other => panic!("no catalog: {other:?}"),
        }
    }

    fn recorded(&self) -> Vec<String> {
        self.catalog()
            .outputs
            .iter()
            .map(|r| r.path.as_str().to_owned())
            .collect()
    }

    /// Every object of the root with its bytes (the catalog's as-is).
    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.root
            .list("")
            .unwrap()
            .into_iter()
            .map(|l| {
                let bytes = self.get(&l.path).unwrap_or_default();
                (l.path, bytes)
            })
            .collect()
    }

    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        let store = self.raw_store();
        let key = self.root.key(rel);
        tokio_block(async {
            match store.get(&key).await {
                Ok(r) => Some(r.bytes().await.unwrap().to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("GET {rel}: {e}"),
            }
        })
    }

    /// An unconditional PUT behind the tool's back (an operator or
    /// another program changing the bucket).
    fn put_behind(&self, rel: &str, bytes: &str) {
        let store = self.raw_store();
        let key = self.root.key(rel);
        tokio_block(async {
            store
                .put(&key, bytes.as_bytes().to_vec().into())
                .await
                .unwrap()
        });
    }

    fn raw_store(&self) -> object_store::aws::AmazonS3 {
        let c = credentials();
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&self.location.bucket)
            .with_region(&self.location.region)
            .with_endpoint(self.location.endpoint.clone().unwrap())
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_access_key_id(c.key_id)
            .with_secret_access_key(c.secret)
            .build()
            .unwrap()
    }

    fn pending(&self) -> Vec<String> {
        protocol::pending_intents(&self.root).unwrap()
    }
}

fn tokio_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn seed<'a>(
    path: &'a str,
    pipeline: &'a str,
    source: &'a str,
    created: &'a str,
    body: &'a str,
) -> Seed<'a> {
    Seed {
        path,
        pipeline,
        source,
        created,
        updated: OLD,
        body,
    }
}

/// Three `reports` sources (s1 oldest .. s3 newest by `created`), one
/// `blog` source, all aged past `max_age`, and a stray unmanaged object.
fn populated() -> Fixture {
    let f = Fixture::new();
    let c1 = "2026-01-01T00:00:00Z";
    let c2 = "2026-01-02T00:00:00Z";
    let c3 = "2026-01-03T00:00:00+01:00";
    publish(
        &f.root,
        &[
            seed("s2/a.md", "reports", "s2", c2, "two"),
            seed("s2/sub/c.txt", "reports", "s2", c2, "c2"),
        ],
    )
    .unwrap();
    publish(&f.root, &[seed("s3/a.md", "reports", "s3", c3, "three")]).unwrap();
    publish(
        &f.root,
        &[
            seed("s1/a.md", "reports", "s1", c1, "one"),
            seed("s1/sub/c.txt", "reports", "s1", c1, "c1"),
        ],
    )
    .unwrap();
    publish(
        &f.root,
        &[seed(
            "blog/post.md",
            "blog",
            "b1",
            "2025-12-01T00:00:00Z",
            "post",
        )],
    )
    .unwrap();
    f.put_behind("stray.txt", "not ours");
    f
}

const OLD_SOURCES: [&str; 4] = ["s1/a.md", "s1/sub/c.txt", "s2/a.md", "s2/sub/c.txt"];
/// A root with nothing in it (an object outside it in the same bucket)
/// has nothing managed and gets nothing created; a bucket that does not
/// exist is a mistake, not an empty root.
#[test]
fn s3_an_empty_root_reports_nothing_and_a_missing_bucket_is_an_error() {
    let empty = Fixture::new();
    let store = empty.raw_store();
    tokio_block(store.put(&"elsewhere/x".into(), b"x".to_vec().into())).unwrap();
    for (command, extra) in [
        ("catalog", &[][..]),
        ("verify", &[][..]),
        ("prune", &["--dry-run"][..]),
        ("prune", &["--apply"][..]),
        ("reconcile-state", &["--dry-run"][..]),
        ("reconcile-state", &[][..]),
    ] {
        let r = empty.maintain(command, "reports", extra);
        assert_eq!(r.code, 0, "{command} {extra:?}: {}", r.both());
    }
    assert_eq!(empty.snapshot(), BTreeMap::new(), "nothing was created");

    let missing = Fixture::new();
    for command in ["catalog", "verify", "reconcile-state"] {
        let r = missing.maintain(command, "reports", &[]);
        assert_eq!(r.code, 1, "{command}: {}", r.both());
        for want in [
            &format!("s3://{}/site at ", missing.location.bucket),
            "the bucket does not exist",
        ] {
            assert!(r.stderr.contains(want), "{want:?} not in: {}", r.stderr);
        }
    }
}

/// An expired output changed behind the catalog loses its record but keeps
/// its bytes: in a bucket only the recorded bytes are ever deleted.
#[test]
fn s3_prune_keeps_an_expired_object_changed_behind_the_catalog() {
    let f = populated();
    f.put_behind("s2/sub/c.txt", "someone else's now");
    let applied = f.json("prune", "reports", &["--apply"], 0);
    assert_eq!(strings(&applied["deletes"]), OLD_SOURCES);
    assert_eq!(f.recorded(), ["blog/post.md", "s3/a.md"]);
    let keys: Vec<String> = f.snapshot().into_keys().collect();
    assert_eq!(
        keys,
        [
            ".distributor.json",
            "blog/post.md",
            "s2/sub/c.txt",
            "s3/a.md",
            "stray.txt"
        ],
        "pruned objects deleted; unmanaged, other owners' and the newest source kept; no intent left"
    );
    assert_eq!(f.get("stray.txt").unwrap(), b"not ours");
    assert_eq!(f.get("s2/sub/c.txt").unwrap(), b"someone else's now");
}

#[test]
fn s3_missing_credentials_exit_2_naming_the_variables() {
    let f = Fixture::new();
    let r = f.maintain_env("catalog", "reports", &[], &[("AWS_ACCESS_KEY_ID", "")]);
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("AWS_ACCESS_KEY_ID is not set"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains(&f.location.bucket),
        "names the root: {}",
        r.stderr
    );
}

/// The read-only commands write nothing at all, not even a probe or a
/// clock object: they work with credentials that may only read and list,
/// also with a stale intent in the root. `prune --apply` with those
/// credentials fails, naming the root and what to check.
#[test]
fn s3_read_only_commands_need_no_write_permission() {
    let f = populated();
    let intent = protocol::Intent {
        id: "4567".into(),
        owner: "elsewhere pid 1".into(),
        renewals: 0,
        revoked: false,
        spool: None,
        writes: vec![],
        deletes: vec![],
    };
    f.put_behind(
        ".distributor-pending/4567.json",
        &serde_json::to_string(&intent).unwrap(),
    );
    let before = f.snapshot();
    let reader = reader_credentials();
    let env = [
        ("AWS_ACCESS_KEY_ID", reader.key_id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", reader.secret.as_str()),
        ("DISTRIBUTOR_S3_LEASE_SECS", "0"),
    ];
    for (command, extra) in [
        ("catalog", &["--json"][..]),
        ("verify", &["--all-owners", "--json"][..]),
        ("prune", &["--dry-run", "--json"][..]),
        ("reconcile-state", &["--dry-run", "--json"][..]),
    ] {
        let r = f.maintain_env(command, "reports", extra, &env);
        assert_eq!(r.code, 0, "{command}: {}", r.both());
        assert!(
            r.stderr
                .contains("publication 4567 by elsewhere pid 1 has not finished"),
            "{command} reports the pending intent: {}",
            r.stderr
        );
    }
    assert_eq!(f.snapshot(), before, "nothing changed");
    let r = f.maintain_env("prune", "reports", &["--apply"], &env);
    assert_eq!(r.code, 1, "{}", r.both());
    for want in [
        &format!("s3://{}/site at ", f.location.bucket),
        "access denied (HTTP 403)",
        "the bucket's permissions",
    ] {
        assert!(r.stderr.contains(want), "{want:?} not in: {}", r.stderr);
    }
    assert_eq!(f.snapshot(), before, "nothing changed");
}

/// A reader that kills its process (no clean-up at all) once it has given
/// one part's worth of bytes: the publisher dies in the middle of a
/// multipart upload, after the smaller objects queued before it were sent.
struct Die {
    given: usize,
}

impl Read for Die {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.given >= distributor::s3::upload::PART_SIZE {
            std::process::abort()
        }
        let n = buf
            .len()
            .min(distributor::s3::upload::PART_SIZE - self.given);
        buf[..n].fill(b'z');
        self.given += n;
        Ok(n)
    }
}

/// Run by `killed_publisher_then` in a child process: creates `new.html`, overwrites the recorded
/// `kept.html`, then dies uploading `z.html`.
#[test]
#[ignore = "run in a child process by killed_publisher_then"]
fn s3_killed_publisher_child() {
    let Ok(bucket) = std::env::var("DISTRIBUTOR_S3_CHILD_BUCKET") else {
        return;
    };
    let location = S3Location {
        bucket,
        path: "site".into(),
        endpoint: std::env::var("DISTRIBUTOR_S3_CHILD_ENDPOINT").ok(),
        region: "us-east-1".into(),
    };
    let root = S3Root::open_with(&location, credentials()).unwrap();
    let base = root.read_state().unwrap();
    let kept_old = sha256(b"old");
    let created = "2026-02-01T00:00:00Z";
    let seeds = [
        seed("new.html", "reports", "s9", created, "new"),
        seed("kept.html", "reports", "s9", created, "replaced"),
        seed("z.html", "reports", "s9", created, "never"),
    ];
    let records: Vec<OutputRecord> = seeds.iter().map(record).collect();
    let next = with(&base.state, &records);
    let writes = vec![
        Write {
            path: "new.html".into(),
            sha256: sha256(b"new"),
            source: Box::new(&b"new"[..]),
            replaces: None,
            served: HeaderRules::default().served("new.html"),
        },
        Write {
            path: "kept.html".into(),
            sha256: sha256(b"replaced"),
            source: Box::new(&b"replaced"[..]),
            replaces: Some(kept_old),
            served: HeaderRules::default().served("kept.html"),
        },
        Write {
            path: "z.html".into(),
            sha256: sha256(b"never"),
            source: Box::new(Die { given: 0 }),
            replaces: None,
            served: HeaderRules::default().served("z.html"),
        },
    ];
    let _ = protocol::commit(
        &root,
        Settings::default(),
        base,
        next,
        writes,
        vec![],
        &mut |_| None,
    );
    unreachable!("the publisher dies uploading z.html");
}

#[test]
fn s3_a_killed_publishers_intent_is_recovered_by_reconcile_state() {
    killed_publisher_then(&["reconcile-state"]);
}

#[test]
fn s3_a_killed_publishers_intent_is_recovered_by_prune_apply() {
    killed_publisher_then(&["prune", "--apply"]);
}

/// A publisher dies half-way; read-only commands report its intent and
/// change nothing; once the lease is over, `recover_with` recovers it.
fn killed_publisher_then(recover_with: &[&str]) {
    let f = Fixture::new();
    publish(&f.root, &[seed("kept.html", "reports", "s8", OLD, "old")]).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "s3_maintain::s3_killed_publisher_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("DISTRIBUTOR_S3_CHILD_BUCKET", &f.location.bucket)
        .env(
            "DISTRIBUTOR_S3_CHILD_ENDPOINT",
            f.location.endpoint.as_deref().unwrap(),
        )
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child publisher was killed");
    let intents = f.pending();
    assert_eq!(intents.len(), 1, "the killed publisher left its intent");
    assert_eq!(f.get("new.html").unwrap(), b"new");
    assert_eq!(f.get("kept.html").unwrap(), b"replaced");
    let before = f.snapshot();

    // Read-only commands report the pending publication and touch nothing.
    let verify = f.maintain("verify", "reports", &["--json"]);
    assert_eq!(verify.code, 1, "{}", verify.both());
    assert_eq!(strings(&verify.json()["mismatched"]), ["kept.html"]);
    assert!(
        verify.stderr.contains(&intents[0]) && verify.stderr.contains("has not finished"),
        "the pending intent is reported: {}",
        verify.stderr
    );
    let dry = f.json("reconcile-state", "reports", &["--dry-run"], 0);
    assert_eq!(
        strings(&dry["unmanaged"]),
        Vec::<String>::new(),
        "objects of a pending publication are not unmanaged"
    );
    f.json("prune", "reports", &["--dry-run"], 0);
    f.json("catalog", "reports", &[], 0);
    // A live intent (lease not over) is left alone by commands that write.
    f.json("reconcile-state", "reports", &[], 0);
    assert_eq!(f.snapshot(), before, "nothing changed");

    // Once the lease is over, the next command that writes recovers it.
    let r = f.maintain_env(
        recover_with[0],
        "reports",
        &recover_with[1..],
        &[("DISTRIBUTOR_S3_LEASE_SECS", "0"), ("RUST_LOG", "info")],
    );
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stderr.contains("recovered the unfinished publication"),
        "{}",
        r.stderr
    );
    assert_eq!(f.pending(), Vec::<String>::new());
    assert_eq!(f.get("new.html"), None, "its unrecorded object is deleted");
    assert_eq!(f.recorded(), ["kept.html"]);
    let kept = f.catalog().outputs[0].clone();
    assert_eq!(
        (kept.sha256.to_string(), kept.size),
        (sha256(b"replaced"), 8),
        "the record follows the object it overwrote"
    );
    let verify = f.json("verify", "reports", &[], 0);
    assert_eq!(verify["ok"], true);
}

/// Publishers commit new outputs while `prune --apply` runs again and
/// again on the same root: every committed record survives, every expired
/// one goes, with its object, and the unmanaged object stays.
#[test]
fn s3_prune_racing_publishers_loses_no_record() {
    const ROUNDS: usize = 4;
    const OLD_PER_ROUND: usize = 12;
    const PUBLISHERS: usize = 2;
    const EACH: usize = 12;
    let f = Fixture::new();
    f.put_behind("stray.txt", "not ours");
    let newest = "2026-06-01T00:00:00Z";
    publish(
        &f.root,
        &[Seed {
            updated: newest,
            ..seed("keep/newest.md", "reports", "newest", newest, "newest")
        }],
    )
    .unwrap();
    let old_paths: Vec<String> = (0..ROUNDS)
        .flat_map(|r| (0..OLD_PER_ROUND).map(move |i| format!("old{r}/{i}.md")))
        .collect();
    let committed = std::thread::scope(|scope| {
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| {
                let location = f.location.clone();
                scope.spawn(move || {
                    let root = S3Root::open_with(&location, credentials()).unwrap();
                    let mut committed = Vec::new();
                    let now = distributor::catalog::format_time(time::OffsetDateTime::now_utc());
                    for i in 0..EACH {
                        let path = format!("new/{p}-{i}.md");
                        let s = Seed {
                            updated: &now,
                            ..seed(&path, "reports", "newest", newest, &path)
                        };
                        // Transient conflicts are retried, as the agent does.
                        for attempt in 0.. {
                            match publish(&root, &[s]) {
                                Ok(()) => break,
                                Err(e) if e.is_transient() && attempt < 50 => continue,
                                Err(e) => panic!("publisher {p}: {e}"),
                            }
                        }
                        committed.push(path);
                    }
                    committed
                })
            })
            .collect();
        for r in 0..ROUNDS {
            let seeds: Vec<String> = (0..OLD_PER_ROUND)
                .map(|i| format!("old{r}/{i}.md"))
                .collect();
            let seeds: Vec<Seed> = seeds
                .iter()
                .map(|p| seed(p, "reports", "ancient", OLD, p))
                .collect();
            for attempt in 0.. {
                match publish(&f.root, &seeds) {
                    Ok(()) => break,
                    Err(e) if e.is_transient() && attempt < 50 => continue,
                    Err(e) => panic!("seeding: {e}"),
                }
            }
            let r = f.maintain("prune", "reports", &["--apply", "--json"]);
            assert_eq!(r.code, 0, "{}", r.both());
        }
        publishers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    // A last prune once the publishers are idle.
    f.json("prune", "reports", &["--apply"], 0);
    let recorded = f.recorded();
    for path in &committed {
        assert!(recorded.contains(path), "{path} was committed and is lost");
    }
    assert!(recorded.contains(&"keep/newest.md".to_owned()));
    for path in &old_paths {
        assert!(!recorded.contains(path), "{path} expired and is recorded");
        assert_eq!(f.get(path), None, "{path} was pruned but its object stays");
    }
    assert_eq!(recorded.len(), committed.len() + 1);
    let verify = f.json("verify", "reports", &[], 0);
    assert_eq!(verify["checked"], recorded.len());
    assert_eq!(f.get("stray.txt").unwrap(), b"not ours");
    assert_eq!(f.pending(), Vec::<String>::new(), "no intent left");
}
