//! What `distributor run` does with an s3 destination that a local root
//! has no counterpart for (docs/contract.md §15), against the real
//! SeaweedFS of `seaweed::server`: `--force` refused, credentials read
//! from the environment, and uploads that open few descriptors. What
//! every backend does alike (the planning actions, dry runs, tampered
//! bytes, `status`) is in `matrix`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::seaweed::{Bucket, server};
use crate::util::{Output, Test};

/// A test folder whose config has pipeline `reports` with one s3
/// destination `web` (in a bucket of its own, below `site/archive`).
struct S3Test {
    t: Test,
    bucket: Bucket,
}

impl S3Test {
    fn new(workflow: &str) -> S3Test {
        let bucket = Bucket::new("site/archive");
        let t = Test::new();
        t.config(&format!(
            "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: web
        backend: s3
        bucket: {bucket}
        path: site/archive
        endpoint: {endpoint}
        workflow: {workflow}
        publish:
          source: true
          html: true
",
            bucket = bucket.location.bucket,
            endpoint = server().endpoint,
        ));
        S3Test { t, bucket }
    }

    /// The binary with the server's credentials in its environment.
    fn run(&self, args: &[&str]) -> Output {
        let creds = server().credentials();
        let mut cmd = self.t.cmd();
        cmd.env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", "config.yaml"])
            .args(args);
        cmd.output()
    }

    fn publish(&self, bundle: &Path, extra: &[&str]) -> Output {
        let bundle = bundle.to_str().expect("utf-8 path");
        let mut args = vec!["run", "--json", "--pipeline", "reports"];
        args.extend_from_slice(extra);
        args.push(bundle);
        self.run(&args)
    }

    fn get(&self, rel: &str) -> Option<Vec<u8>> {
        self.bucket.get(rel)
    }

    fn recorded(&self) -> BTreeMap<String, Value> {
        self.bucket.recorded()
    }

    /// Every record's object holds exactly the recorded bytes, and no
    /// intent is left pending.
    fn assert_records_match_objects(&self) {
        self.bucket.assert_records_match_objects();
        let pending = self.bucket.pending();
        assert!(pending.is_empty(), "pending intents left: {pending:?}");
    }

    /// Keys of the objects that are outputs (reserved names aside).
    fn output_keys(&self) -> Vec<String> {
        self.bucket
            .keys()
            .into_iter()
            .filter(|k| !k.starts_with(".distributor"))
            .collect()
    }
}

/// `--force` (which clears a local root) is refused for an s3 root, naming
/// the command that would do it, and leaves the bucket as it was: here, a
/// catalog that is not JSON (a conflict, as in
/// `matrix::a_bad_or_future_catalog_is_a_conflict_and_left_alone`).
#[test]
fn force_is_refused_for_an_s3_root_and_leaves_the_bucket_alone() {
    let s = S3Test::new("additive");
    s.bucket.plant(".distributor.json", b"{ not json");
    let b = s.t.bundle("rep.1", &[("a.txt", "a\n")]);
    let out = s.publish(&b, &[]);
    out.expect_code(3);
    assert_eq!(out.dest()["action"], "fail_conflict");

    let out = s.publish(&b, &["--force", "--destination", "web"]);
    out.expect_code(3);
    let error = out.dest()["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        error.contains("--force is not available") && error.contains("aws s3 rm"),
        "{error}"
    );
    assert_eq!(s.get(".distributor.json").unwrap(), b"{ not json");
    assert!(s.output_keys().is_empty());
}

#[test]
fn missing_credentials_are_a_lock_failure_naming_the_variable() {
    let s = S3Test::new("additive");
    let b = s.t.bundle("rep.1", &[("a.txt", "a\n")]);
    let mut cmd = s.t.cmd();
    // Empty counts as unset.
    cmd.env("AWS_ACCESS_KEY_ID", "")
        .env("AWS_SECRET_ACCESS_KEY", "")
        .args(["--config", "config.yaml", "run", "--json", "--pipeline"])
        .arg("reports")
        .arg(&b);
    let out = cmd.output();
    out.expect_code(1);
    let error = out.json()["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("AWS_ACCESS_KEY_ID"), "{error}");
    assert!(s.bucket.keys().is_empty());
}

#[test]
fn a_bundle_of_many_files_goes_up_with_few_descriptors() {
    // 300 files under a limit of 64 open descriptors: each file is opened
    // only while it is read, not all at once for the whole commit.
    let s = S3Test::new("additive");
    let files: Vec<(String, String)> = (0..300)
        .map(|i| (format!("d{}/f{i:03}.txt", i % 7), format!("{i}\n")))
        .collect();
    let b = s.t.bundle("many", &files);
    let creds = server().credentials();
    let out = std::process::Command::new("sh")
        .current_dir(s.t.path())
        .env("AWS_ACCESS_KEY_ID", &creds.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
        .env("RUST_LOG", "warn")
        .args(["-c", "ulimit -n 64 && exec \"$0\" \"$@\""])
        .arg(crate::util::BIN)
        .args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            "reports",
        ])
        .arg(&b)
        .output()
        .expect("run under a descriptor limit");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.recorded().len(), 300);
    s.assert_records_match_objects();
}
