//! What is particular to an s3 batch (docs/object-storage.md, "Batches"),
//! against the real SeaweedFS of `seaweed::server`: a backlog far longer
//! than a local batch goes in one (each batch costs an intent and a swap
//! of the whole catalog), the bound on the pages a batch holds, and a
//! batch killed while it uploads converging at the agent's next start
//! through its intent. What every backend's batch does alike (arrival
//! order, one result per bundle, a bad or refused bundle failing alone)
//! is in `matrix`.

use std::collections::BTreeSet;
use std::fs;
use std::time::Duration;

use crate::seaweed::{Bucket, server};
use crate::util::{Output, Test, batch_sizes, names, wait_for};

/// Longest the test waits for any one observable event before failing.
const EVENT_WAIT: Duration = Duration::from_secs(60);

/// A test folder whose config has pipeline `p` with one s3 destination
/// `web` (additive) in a bucket of its own.
struct BatchTest {
    t: Test,
    bucket: Bucket,
}

impl BatchTest {
    fn new() -> BatchTest {
        BatchTest::publishing("{source: true}")
    }

    /// [`BatchTest::new`] with `publish` set to `publish` (e.g. pages too).
    fn publishing(publish: &str) -> BatchTest {
        let bucket = Bucket::new("site");
        let t = Test::new();
        t.config(&format!(
            "spool: ./spool
agent: {{settle: 0s, metrics_file: ./metrics.prom}}
pipelines:
  - id: p
    destinations:
      - id: web
        backend: s3
        bucket: {bucket}
        path: site
        endpoint: {endpoint}
        workflow: additive
        publish: {publish}
",
            bucket = bucket.location.bucket,
            endpoint = server().endpoint,
        ));
        fs::create_dir_all(t.join("spool/p/inbox")).unwrap();
        BatchTest { t, bucket }
    }

    /// `agent --once`, logging at info, with the server's credentials.
    fn once(&self) -> Output {
        let creds = server().credentials();
        let mut cmd = self.t.cmd();
        cmd.env("RUST_LOG", "info")
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", "config.yaml", "agent", "--once"]);
        cmd.output()
    }

    /// Seals bundle `name` with `files` and drops it into the inbox.
    fn drop_bundle(&self, name: &str, files: &[(&str, &str)]) {
        let b = self.t.bundle(name, files);
        fs::rename(&b, self.t.join(&format!("spool/p/inbox/{name}"))).unwrap();
    }

    /// A nested bundle `b<i>`: three files in a folder of its own.
    fn drop_nested(&self, i: usize) -> [String; 3] {
        let paths = [
            format!("r{i:03}/report.md"),
            format!("r{i:03}/page.html"),
            format!("r{i:03}/data/x.csv"),
        ];
        let contents = [
            format!("# report {i}\n"),
            format!("<p>{i}</p>\n"),
            "x,y\n".repeat(i + 1),
        ];
        let files: Vec<(&str, &str)> = paths
            .iter()
            .zip(&contents)
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        self.drop_bundle(&format!("b{i:03}"), &files);
        paths
    }

    fn metric(&self, name: &str) -> String {
        let text = fs::read_to_string(self.t.join("metrics.prom")).unwrap();
        let prefix = format!("distributor_{name}{{pipeline=\"p\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .to_owned()
    }

    /// The root holds exactly the recorded objects (each with its recorded
    /// bytes), the catalog, and `also`; no intent is pending.
    #[track_caller]
    fn assert_converged(&self, also: &[&str]) -> BTreeSet<String> {
        let records = self.bucket.assert_records_match_objects();
        assert!(
            self.bucket.reserved().is_empty(),
            "left under .distributor-pending/: {:?}",
            self.bucket.reserved()
        );
        let expected: BTreeSet<String> = records
            .keys()
            .cloned()
            .chain([".distributor.json".to_owned()])
            .chain(also.iter().map(|k| (*k).to_owned()))
            .collect();
        assert_eq!(self.bucket.keys(), expected);
        records.into_keys().collect()
    }
}

#[test]
fn a_backlog_goes_up_in_one_s3_batch() {
    // Each batch costs an intent, a swap of the whole catalog and a pause
    // of the uploads: 300 waiting bundles go in one.
    let s = BatchTest::new();
    s.drop_nested(0);
    s.once().expect_code(0);
    let n = 300;
    for i in 1..=n {
        s.drop_nested(i);
    }
    let out = s.once();
    out.expect_code(0);
    assert_eq!(
        batch_sizes(&out.stderr),
        [n],
        "not one batch:\n{}",
        out.stderr
    );
    assert_eq!(s.metric("batch_fallbacks_total"), "0");
    assert_eq!(names(&s.t.join("spool/p/done")).len(), n + 1);
    let records = s.assert_converged(&[]);
    assert_eq!(records.len(), (n + 1) * 3);
}

#[test]
fn a_batch_whose_pages_reach_its_memory_bound_leaves_the_rest_to_the_next_batch() {
    let s = BatchTest::publishing("{source: true, html: true}");
    s.drop_nested(0);
    s.once().expect_code(0);
    let n = 5;
    for i in 1..=n {
        s.drop_nested(i);
    }
    // A bound below one page: each batch takes one bundle (at least one),
    // the agent batches the rest next, the last one goes alone.
    let creds = server().credentials();
    let out =
        s.t.cmd()
            .env("RUST_LOG", "info")
            .env("DISTRIBUTOR_TEST_BATCH_HELD", "1")
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", "config.yaml", "agent", "--once"])
            .output();
    out.expect_code(0);
    assert_eq!(batch_sizes(&out.stderr), [1; 4], "{}", out.stderr);
    assert!(!out.stderr.contains("stepped aside"), "{}", out.stderr);
    assert_eq!(
        names(&s.t.join("spool/p/done")).len(),
        n + 1,
        "{}",
        out.stderr
    );
    assert!(names(&s.t.join("spool/p/work")).is_empty());
    let records = s.assert_converged(&[]);
    // Each bundle's three files and the page of its markdown.
    assert_eq!(records.len(), (n + 1) * 4);
    assert!(records.contains("r005/report.html"), "{records:?}");
}

#[test]
fn a_batch_killed_while_it_uploads_converges_at_the_next_start() {
    const BIG: &str = "zz/big.bin";
    let s = BatchTest::new();
    s.drop_nested(0);
    s.once().expect_code(0);
    for i in 1..=8 {
        s.drop_nested(i);
    }
    // The last key of the batch goes up in parts: the agent is killed once
    // its empty placeholder is there, after every small object went up.
    let big: Vec<u8> = (0..20 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let b = s.t.sealed("big", &[(BIG, &big)]);
    fs::rename(&b, s.t.join("spool/p/inbox/big")).unwrap();
    let creds = server().credentials();
    let mut child =
        s.t.cmd()
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .args(["--config", "config.yaml", "agent"])
            .spawn_quiet();
    let in_flight = wait_for(EVENT_WAIT, || {
        s.bucket
            .root
            .head(BIG)
            .expect("HEAD")
            .is_some_and(|h| h.size == 0 && h.intent.is_some())
            || child.try_wait().expect("wait").is_some()
    });
    assert!(in_flight, "the upload of {BIG} never started");
    assert!(
        child.try_wait().expect("wait").is_none(),
        "it finished first"
    );
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    // Killed mid-batch: one intent listing every bundle's writes, objects
    // of many bundles up, none recorded.
    let pending = s.bucket.pending();
    assert_eq!(pending.len(), 1, "{pending:?}");
    let (intent, ..) = s.bucket.root.read_intent(&pending[0]).unwrap().unwrap();
    assert_eq!(intent.writes.len(), 8 * 3 + 1);
    assert!(s.bucket.get("r004/report.md").is_some());
    assert!(!s.bucket.recorded().contains_key("r004/report.md"));

    // The next start recovers the killed agent's batch at once (it serves
    // the same spool) and publishes the bundles it resumes from work/.
    let out = s.once();
    out.expect_code(0);
    assert!(
        names(&s.t.join("spool/p/failed")).is_empty(),
        "{}",
        out.stderr
    );
    assert_eq!(names(&s.t.join("spool/p/done")).len(), 10, "{}", out.stderr);
    assert!(
        out.stderr.contains("that another publisher left behind"),
        "{}",
        out.stderr
    );
    let records = s.assert_converged(&[]);
    assert_eq!(records.len(), 9 * 3 + 1);
    assert_eq!(s.bucket.get(BIG).unwrap().len(), big.len());
}
