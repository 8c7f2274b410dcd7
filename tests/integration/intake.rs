//! An inbox in the object store (docs/contract.md §22), against the real
//! SeaweedFS: producers upload with an S3 client, agents with separate
//! local spools compete for the pipeline's lease, results land in the
//! bucket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use distributor::config::S3Location;
use distributor::s3::S3Root;

use crate::seaweed::{credentials, server};
use crate::util::{Output, Proc, Test, TestCommand, wait_for};

/// A test with an intake pipeline `p` publishing into the local root
/// `site/`, and a client of the intake's bucket for the producer's side.
pub struct Intake {
    pub t: Test,
    pub location: S3Location,
    pub bucket: S3Root,
}

/// The lease of the tests: short, so that a takeover is seconds away.
pub const LEASE: &str = "3s";

impl Intake {
    pub fn new() -> Intake {
        Intake::with("")
    }

    /// With `extra` YAML lines added to the pipeline.
    pub fn with(extra: &str) -> Intake {
        let t = Test::new();
        let location = server().location("reports");
        let bucket = S3Root::open_with(&location, credentials()).expect("s3 client");
        // The bucket must exist before anyone lists it.
        bucket
            .put_new(".keep", &mut &b""[..], None, "test")
            .expect("create the bucket");
        let i = Intake {
            t,
            location,
            bucket,
        };
        i.write_config("config.yaml", "spool", extra);
        i
    }

    /// Writes a config for an agent with its own spool `spool`.
    pub fn write_config(&self, file: &str, spool: &str, extra: &str) -> PathBuf {
        let endpoint = self.location.endpoint.as_deref().expect("endpoint");
        self.t.write(
            file,
            format!(
                "spool: {spool}\nagent:\n  settle: 50ms\npipelines:\n  - id: p\n    intake:\n      backend: s3\n      bucket: {}\n      path: reports\n      endpoint: {endpoint}\n      lease: {LEASE}\n{extra}    destinations:\n      - id: site\n        path: site\n",
                self.location.bucket
            ),
        )
    }

    /// The binary with the intake's credentials and `--config file`.
    pub fn cmd(&self, file: &str) -> TestCommand {
        let creds = credentials();
        let mut cmd = self.t.cmd();
        cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", file]);
        cmd
    }

    /// A live agent on `file`, logging at info.
    pub fn agent(&self, file: &str) -> Proc {
        let mut cmd = self.cmd(file);
        cmd.env("RUST_LOG", "info").arg("agent");
        let mut agent = cmd.start();
        let ready = wait_for(Duration::from_secs(20), || {
            agent.catches(&[libc::SIGTERM, libc::SIGINT, libc::SIGHUP]) || !agent.running()
        });
        assert!(
            ready && agent.running(),
            "the agent did not come up:\n{}",
            agent.stderr()
        );
        agent
    }

    /// Uploads the sealed bundle `dir` as `inbox/<name>/`, the manifest
    /// last, with this test's S3 client.
    pub fn upload(&self, name: &str, dir: &Path) {
        let mut files = Vec::new();
        collect(dir, dir, &mut files);
        files.sort_by_key(|rel| (rel == "manifest.json", rel == "manifest.json.sig"));
        files.sort_by_key(|rel| match rel.as_str() {
            "manifest.json" => 2,
            "manifest.json.sig" => 1,
            _ => 0,
        });
        for rel in files {
            let bytes = std::fs::read(dir.join(&rel)).expect("read bundle file");
            self.put(&format!("inbox/{name}/{rel}"), &bytes);
        }
    }

    /// Puts `bytes` at `rel` below the intake's path (over what is there).
    pub fn put(&self, rel: &str, bytes: &[u8]) {
        let _ = self.bucket.delete(rel);
        self.bucket
            .put_new(rel, &mut &bytes[..], None, "producer")
            .unwrap_or_else(|e| panic!("upload {rel}: {e}"));
    }

    /// Every object below `rel` (relative to the intake's path), by key.
    pub fn objects(&self, rel: &str) -> BTreeMap<String, u64> {
        self.bucket
            .list(rel)
            .expect("list")
            .into_iter()
            .map(|l| (l.path, l.size))
            .collect()
    }

    /// The result object of `folder/name`, parsed.
    pub fn result(&self, folder: &str, name: &str) -> Option<serde_json::Value> {
        let got = self
            .bucket
            .get_small(
                &format!("{folder}/{name}/.distributor-result.json"),
                1 << 20,
            )
            .expect("get result")?;
        Some(serde_json::from_slice(&got.bytes).expect("result is JSON"))
    }

    /// `agent --once` on `config.yaml`.
    pub fn once(&self) -> Output {
        let mut cmd = self.cmd("config.yaml");
        cmd.env("RUST_LOG", "info").args(["agent", "--once"]);
        cmd.output()
    }
}

fn collect(base: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        let path = e.path();
        if e.file_type().expect("type").is_dir() {
            collect(base, &path, out);
        } else {
            out.push(
                path.strip_prefix(base)
                    .expect("below")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
}

#[test]
fn bundles_uploaded_to_the_intake_are_published_and_filed_in_the_bucket() {
    let i = Intake::new();
    let one =
        i.t.bundle("one", &[("index.md", "# One\n"), ("data/a.txt", "a\n")]);
    let two = i.t.bundle("two", &[("b.txt", "b\n")]);
    i.upload("one", &one);
    i.upload("two", &two);
    i.once().expect_code(0);
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/data/a.txt")).unwrap(),
        "a\n"
    );
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/b.txt")).unwrap(),
        "b\n"
    );
    let result = i.result("done", "one").expect("a result in done/");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["intake"]["name"], "one");
    assert!(i.result("done", "two").is_some());
    // Nothing left in the inbox, nothing on this host.
    assert!(i.objects("inbox").is_empty(), "{:?}", i.objects("inbox"));
    for folder in ["work", "done", "failed"] {
        let local = i.t.spool("p", folder);
        let left: Vec<_> = std::fs::read_dir(&local)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{folder}/ holds {left:?}");
    }
    assert!(
        !i.t.spool("p", "inbox").exists(),
        "an intake pipeline makes no local inbox"
    );
}
