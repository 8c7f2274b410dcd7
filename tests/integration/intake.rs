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
        Intake::at(server().location("reports"), extra)
    }

    /// At `location` (its path must be `reports`).
    pub fn at(location: S3Location, extra: &str) -> Intake {
        let t = Test::new();
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
        // The hook appends the bundle each publication that changed
        // something was made from, one line each: the order of
        // publication, and that none is made twice.
        let hook = i.hook();
        i.t.write(
            "hook.sh",
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$(sed -n 's/.*\"bundle\": *\"\\([^\"]*\\)\".*/\\1/p')\" >> {}\n",
                i.t.join("published.log").display()
            ),
        );
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        i.write_config("config.yaml", "spool", extra);
        i
    }

    /// Writes a config for an agent with its own spool `spool`.
    pub fn write_config(&self, file: &str, spool: &str, extra: &str) -> PathBuf {
        let endpoint = self.location.endpoint.as_deref().expect("endpoint");
        self.t.write(
            file,
            format!(
                "spool: {spool}\nagent:\n  settle: 50ms\n  incomplete_timeout: 2s\n  retry_max_interval: 1s\npipelines:\n  - id: p\n    intake:\n      backend: s3\n      bucket: {}\n      path: reports\n      endpoint: {endpoint}\n      lease: {LEASE}\n{extra}    destinations:\n      - id: site\n        path: site\n        hooks:\n          after_publish: [\"{}\"]\n",
                self.location.bucket,
                self.hook().display()
            ),
        )
    }

    fn hook(&self) -> PathBuf {
        self.t.join("hook.sh")
    }

    /// The bundles the hook saw published, in order.
    pub fn published(&self) -> Vec<String> {
        std::fs::read_to_string(self.t.join("published.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The row of `name` in `spool list --inbox --json`.
    #[track_caller]
    pub fn inbox_row(&self, name: &str) -> serde_json::Value {
        let out = self
            .cmd("config.yaml")
            .args(["spool", "list", "--inbox", "--json"])
            .output();
        out.expect_code(0);
        let rows = out.json();
        let row = rows
            .as_array()
            .expect("an array")
            .iter()
            .find(|r| r["name"] == name)
            .cloned();
        row.unwrap_or_else(|| panic!("no {name} in {rows}"))
    }

    /// The names below `done/` (or `failed/`) in the bucket.
    pub fn filed(&self, folder: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .objects(folder)
            .keys()
            .filter_map(|k| {
                k.strip_prefix(&format!("{folder}/"))?
                    .strip_suffix("/.distributor-result.json")
                    .map(str::to_owned)
            })
            .collect();
        names.sort();
        names
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
        cmd.env("RUST_LOG", "info,distributor::agent::intake=debug")
            .arg("agent");
        crate::util::started_agent(&mut cmd)
    }

    /// A live agent on `config.yaml` with the crash point `failpoint`,
    /// once it holds the lease.
    pub fn agent_failing(&self, failpoint: &str) -> Proc {
        let mut cmd = self.cmd("config.yaml");
        cmd.env("RUST_LOG", "info")
            .env("DISTRIBUTOR_FAILPOINT", failpoint)
            .arg("agent");
        let agent = crate::util::started_agent(&mut cmd);
        assert!(wait_for(Duration::from_secs(20), || self
            .bucket
            .head(".distributor-lease")
            .unwrap()
            .is_some()));
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

/// `count` bundles `b000`, `b001`, …: each writes `seq/<n>.txt` and the
/// shared `latest.txt`, created one second apart in that order (so that
/// one published out of order would be refused as older, §22.3).
fn backlog(i: &Intake, count: usize) -> Vec<(String, PathBuf)> {
    (0..count)
        .map(|n| {
            let name = format!("b{n:03}");
            let created = format!("2026-01-01T00:{:02}:{:02}Z", n / 60, n % 60);
            let seq = format!("seq/{n}.txt");
            let text = format!("{n}\n");
            let dir = i.t.bundle_at(
                &name,
                &name,
                &created,
                &[(seq.as_str(), text.as_str()), ("latest.txt", text.as_str())],
            );
            (name, dir)
        })
        .collect()
}

/// Waits until `done/` in the bucket holds `count` results.
#[track_caller]
fn wait_done(i: &Intake, count: usize, agents: &[&Proc]) {
    let done = wait_for(Duration::from_secs(180), || i.filed("done").len() >= count);
    let logs: Vec<String> = agents.iter().map(|a| a.stderr()).collect();
    assert!(
        done,
        "done/ has {:?} of {count}\n{}",
        i.filed("done").len(),
        logs.join("\n----\n")
    );
}

/// The site after `count` bundles of [`backlog`]: every one's file, the
/// last one's `latest.txt`, every record's bytes as published.
#[track_caller]
fn assert_site(i: &Intake, count: usize) {
    for n in 0..count {
        assert_eq!(
            std::fs::read_to_string(i.t.join(&format!("site/seq/{n}.txt"))).unwrap_or_default(),
            format!("{n}\n"),
            "seq/{n}.txt"
        );
    }
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/latest.txt")).unwrap(),
        format!("{}\n", count - 1)
    );
    crate::util::assert_catalog_matches_disk(&i.t.join("site"));
}

#[test]
fn three_agents_publish_a_hundred_bundles_exactly_once_in_arrival_order() {
    let i = Intake::new();
    for (file, spool) in [
        ("a.yaml", "spool-a"),
        ("b.yaml", "spool-b"),
        ("c.yaml", "spool-c"),
    ] {
        i.write_config(file, spool, "");
    }
    let agents: Vec<Proc> = ["a.yaml", "b.yaml", "c.yaml"]
        .iter()
        .map(|f| i.agent(f))
        .collect();
    let bundles = backlog(&i, 100);
    for (name, dir) in &bundles {
        i.upload(name, dir);
    }
    wait_done(&i, 100, &agents.iter().collect::<Vec<_>>());
    let names: Vec<String> = bundles.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(i.filed("done"), names);
    assert!(i.filed("failed").is_empty(), "{:?}", i.filed("failed"));
    assert_eq!(
        i.published(),
        names,
        "each published once, in arrival order"
    );
    assert!(i.objects("inbox").is_empty());
    assert_site(&i, 100);
    // One agent held the lease; the others stood by.
    let serving: Vec<usize> = (0..3)
        .filter(|&k| {
            agents[k]
                .stderr()
                .contains("pipeline=p: holds the intake lease")
        })
        .collect();
    assert_eq!(
        serving.len(),
        1,
        "exactly one agent served:\n{}",
        agents
            .iter()
            .map(|a| a.stderr())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
    for (k, a) in agents.iter().enumerate() {
        if k != serving[0] {
            assert!(a.stderr().contains("standing by"), "{}", a.stderr());
        }
    }
    // Each taken from the bucket once: none taken again while its filing
    // was under way (a second publication would end skip_same, unseen).
    let log = agents[serving[0]].stderr();
    assert_eq!(log.matches(": fetched ").count(), 100, "{log}");
}

#[test]
fn a_holder_killed_mid_publication_is_taken_over_and_nothing_is_lost_or_doubled() {
    let i = Intake::new();
    i.write_config("b.yaml", "spool-b", "");
    // A crashes once its third bundle's catalog is durable, before it
    // files that bundle in the bucket.
    let mut a = i.agent_failing("publish.after_catalog:3");
    let b = i.agent("b.yaml");
    let bundles = backlog(&i, 10);
    // The lease versions as the server stamped them, watched meanwhile.
    let mut versions: Vec<(String, time::OffsetDateTime)> = Vec::new();
    let mut watch = || {
        if let Ok(Some(small)) = i.bucket.get_small(".distributor-lease", 4096) {
            let text = String::from_utf8_lossy(&small.bytes).into_owned();
            if versions.last().is_none_or(|(t, _)| *t != text) {
                versions.push((text, small.last_modified));
            }
        }
    };
    for (name, dir) in &bundles {
        i.upload(name, dir);
    }
    assert!(wait_for(Duration::from_secs(60), || {
        watch();
        !a.running()
    }));
    assert!(
        wait_for(Duration::from_secs(60), || {
            watch();
            b.stderr().contains("took over the intake lease")
        }),
        "{}",
        b.stderr()
    );
    wait_done(&i, 10, &[&b]);
    let names: Vec<String> = bundles.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(i.filed("done"), names, "each filed once");
    assert!(i.filed("failed").is_empty());
    assert_site(&i, 10);
    // b002 was committed by A, which died before its hook: B's
    // publication of it changed nothing, and runs the hook A owed. Every
    // bundle's hook ran once, in order.
    assert_eq!(i.published(), names);
    assert!(
        b.stderr()
            .contains("an earlier holder's publication of it owed 1 hook(s)"),
        "{}",
        b.stderr()
    );
    assert!(
        i.objects(".distributor-committing").is_empty(),
        "records of hooks owed are gone once filed"
    );
    // The takeover came within the lease and one renewal of A's last
    // renewal, as the server's clock tells (to the second).
    let epoch = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text).unwrap()["epoch"]
            .as_u64()
            .unwrap()
    };
    let first_b = versions
        .iter()
        .position(|(t, _)| epoch(t) == 2)
        .expect("B's lease version seen");
    let last_a = &versions[first_b - 1];
    let gap = versions[first_b].1 - last_a.1;
    assert!(
        gap <= time::Duration::seconds(3 + 1 + 1),
        "taken over {gap} after A's last renewal (lease 3s, renewal every 1s)"
    );
}

#[test]
fn a_holder_paused_past_its_lease_publishes_nothing_more() {
    let i = Intake::new();
    i.write_config("b.yaml", "spool-b", "");
    // A stops itself right before its first commit's lease check, holding
    // the local root's lock.
    let mut a = i.agent_failing("intake.before_fence:1:stop");
    let bundles = backlog(&i, 2);
    i.upload(&bundles[0].0, &bundles[0].1);
    assert!(
        wait_for(Duration::from_secs(30), || a.stopped()),
        "{}",
        a.stderr()
    );
    // B takes the lapsed lease over, and waits for the root A locked.
    let b = i.agent("b.yaml");
    i.upload(&bundles[1].0, &bundles[1].1);
    b.wait_log("waiting for the lock", Duration::from_secs(30));
    assert!(
        b.stderr().contains("took over the intake lease"),
        "{}",
        b.stderr()
    );
    a.signal(libc::SIGCONT);
    assert!(
        wait_for(Duration::from_secs(30), || a
            .stderr()
            .contains("not committed")),
        "A must refuse its commit once it runs again:\n{}",
        a.stderr()
    );
    wait_done(&i, 2, &[&b]);
    a.signal(libc::SIGTERM);
    a.finish(Duration::from_secs(30));
    assert_eq!(i.filed("done"), ["b000", "b001"]);
    assert!(
        i.filed("failed").is_empty(),
        "A files no failure for the bundle B published"
    );
    assert_eq!(i.published(), ["b000", "b001"]);
    assert_site(&i, 2);
    let result = i.result("done", "b000").unwrap();
    assert_eq!(result["intake"]["epoch"], 2, "{result}");
}

#[test]
fn the_intake_server_stopped_mid_backlog_defers_and_loses_nothing() {
    let mut server = crate::seaweed::OwnServer::start("intake-outage");
    let i = Intake::at(server.location("intake", "reports"), "");
    let agent = i.agent("config.yaml");
    let bundles = backlog(&i, 12);
    for (name, dir) in &bundles[..6] {
        i.upload(name, dir);
    }
    assert!(wait_for(Duration::from_secs(60), || i.filed("done").len() >= 2));
    server.stop(libc::SIGKILL);
    agent.wait_log("cannot", Duration::from_secs(60));
    server.resume();
    for (name, dir) in &bundles[6..] {
        i.upload(name, dir);
    }
    wait_done(&i, 12, &[&agent]);
    let names: Vec<String> = bundles.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(i.filed("done"), names);
    assert!(i.filed("failed").is_empty());
    // Hooks run at least once (§19.1): one whose record could not be
    // cleared during the outage runs again; never out of order.
    let mut published = i.published();
    published.dedup();
    assert_eq!(published, names);
    assert_site(&i, 12);
}

#[test]
fn a_holder_whose_lease_lapses_while_its_bundle_is_deferred_serves_again() {
    // The bundle waits for a root another process locked; meanwhile the
    // server goes away for longer than the lease. The deferral must stop
    // waiting (its commit could never pass the fence again), and the
    // agent take the lease anew once the server is back.
    let mut server = crate::seaweed::OwnServer::start("intake-lapse");
    let i = Intake::at(server.location("intake", "reports"), "");
    let config = std::fs::read_to_string(i.t.join("config.yaml")).unwrap();
    i.t.write(
        "config.yaml",
        config.replacen("agent:\n", "agent:\n  lock_timeout: 1s\n", 1),
    );
    let lock = crate::util::hold_root_lock(&i.t.join("site"));
    let mut agent = i.agent("config.yaml");
    let bundles = backlog(&i, 1);
    i.upload(&bundles[0].0, &bundles[0].1);
    agent.wait_log("deferred since", Duration::from_secs(60));
    server.stop(libc::SIGKILL);
    agent.wait_log(
        "the deferred bundle stays in the intake",
        Duration::from_secs(60),
    );
    // The bundle left this host: `status` here shows no deferral.
    agent.wait_log("deferred, it stays in the intake", Duration::from_secs(60));
    let deferral = i.t.join("spool/p/.distributor-deferred.json");
    assert!(!deferral.exists(), "{}", deferral.display());
    drop(lock);
    server.resume();
    wait_done(&i, 1, &[&agent]);
    assert_eq!(i.filed("done"), ["b000"]);
    assert_eq!(i.published(), ["b000"]);
    assert_site(&i, 1);
    let result = i.result("done", "b000").unwrap();
    assert_eq!(result["intake"]["epoch"], 2, "{result}");
    agent.signal(libc::SIGTERM);
    agent.finish(Duration::from_secs(30));
}

#[test]
fn a_delivery_again_under_the_same_name_while_one_is_processed_is_kept() {
    // The agent stops right after fetching `x`; the producer delivers `x`
    // again (same file names, other bytes); the first delivery's filing
    // must not delete the objects of the second.
    let i = Intake::new();
    let first = i.t.bundle_at(
        "x1",
        "x",
        "2026-01-01T00:00:01Z",
        &[
            ("a.txt", "1\n"),
            ("only-in-1.txt", "1\n"),
            ("same.txt", "s\n"),
        ],
    );
    // `same.txt` is the same object in both: the second needs it.
    let second = i.t.bundle_at(
        "x2",
        "x",
        "2026-01-01T00:00:02Z",
        &[("a.txt", "2\n"), ("same.txt", "s\n")],
    );
    let mut agent = i.agent_failing("intake.fetched:1:stop");
    i.upload("x", &first);
    agent.wait_log("failpoint intake.fetched reached", Duration::from_secs(60));
    i.upload("x", &second);
    agent.signal(libc::SIGCONT);
    wait_done(&i, 2, &[&agent]);
    assert_eq!(i.filed("done"), ["x", "x.1"]);
    assert_eq!(i.published(), ["x", "x"]);
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/a.txt")).unwrap(),
        "2\n"
    );
    assert!(
        wait_for(Duration::from_secs(30), || i.objects("inbox").is_empty()),
        "{:?}",
        i.objects("inbox")
    );
    let log = agent.stderr();
    assert!(
        log.contains("delivered again while it was processed"),
        "{log}"
    );
    agent.signal(libc::SIGTERM);
    agent.finish(Duration::from_secs(30));
}

#[test]
fn the_same_bytes_uploaded_again_while_processed_are_one_delivery() {
    // A retried upload of the very bundle being processed: filing removes
    // it (same size and ETag), and nothing is left in the inbox.
    let i = Intake::new();
    let x =
        i.t.bundle_at("x", "x", "2026-01-01T00:00:01Z", &[("a.txt", "1\n")]);
    let mut agent = i.agent_failing("intake.fetched:1:stop");
    i.upload("x", &x);
    agent.wait_log("failpoint intake.fetched reached", Duration::from_secs(60));
    // Uploaded again in a later second of the server's clock: only the
    // ETag says it is the same object.
    let first = i.bucket.head("inbox/x/a.txt").unwrap().unwrap();
    assert!(wait_for(Duration::from_secs(10), || i
        .bucket
        .server_now()
        .is_ok_and(|now| now > first.last_modified)));
    i.upload("x", &x);
    assert_ne!(
        i.bucket
            .head("inbox/x/a.txt")
            .unwrap()
            .unwrap()
            .last_modified,
        first.last_modified
    );
    agent.signal(libc::SIGCONT);
    wait_done(&i, 1, &[&agent]);
    assert!(
        wait_for(Duration::from_secs(30), || i.objects("inbox").is_empty()),
        "{:?}\n{}",
        i.objects("inbox"),
        agent.stderr()
    );
    assert_eq!(i.filed("done"), ["x"]);
    assert_eq!(i.published(), ["x"]);
    agent.signal(libc::SIGTERM);
    agent.finish(Duration::from_secs(30));
}

#[test]
fn hostile_uploads_fail_with_the_reason_and_touch_nothing_else() {
    let i = Intake::with("    limits:\n      max_files: 4\n");
    let agent = i.agent("config.yaml");
    // Bytes that are not the manifest's, at the declared size.
    let tampered = i.t.bundle("tampered", &[("t.txt", "good\n")]);
    std::fs::write(tampered.join("t.txt"), "evil\n").unwrap();
    i.upload("tampered", &tampered);
    // A manifest that lists a file never uploaded.
    let partial = i.t.bundle(
        "partial",
        &[("here.txt", "here\n"), ("never.txt", "never\n")],
    );
    std::fs::remove_file(partial.join("never.txt")).unwrap();
    i.upload("partial", &partial);
    // A manifest that is no manifest, and one over the pipeline's cap.
    i.put("inbox/garbled/manifest.json", b"{ not json");
    i.put("inbox/huge/manifest.json", &vec![b' '; (1 << 20) + 1]);
    // Far more objects than limits.max_files under one name.
    for n in 0..30 {
        i.put(&format!("inbox/swarm/f{n}"), b"x");
    }
    i.put("inbox/swarm/manifest.json", b"{}");
    // A name no spool may hold.
    let long = "n".repeat(256);
    let named = i.t.bundle("named", &[("n.txt", "n\n")]);
    i.upload(&long, &named);
    // And a good bundle after all of them.
    let good = i.t.bundle("good", &[("g.txt", "g\n")]);
    i.upload("good", &good);
    let failed = ["garbled", "huge", "partial", "swarm", "tampered"];
    assert!(
        wait_for(Duration::from_secs(90), || i.filed("failed").len()
            > failed.len()
            && i.filed("done").len() == 1),
        "failed {:?}, done {:?}\n{}",
        i.filed("failed"),
        i.filed("done"),
        agent.stderr()
    );
    assert_eq!(i.filed("done"), ["good"]);
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/g.txt")).unwrap(),
        "g\n"
    );
    // The long name is cut to fit a folder entry (with a hash of it).
    let fitted = i
        .filed("failed")
        .into_iter()
        .find(|n| n.starts_with("nnn"))
        .expect("the long name failed");
    assert!(fitted.len() <= 255 && fitted.contains('~'), "{fitted}");
    let mut expected: Vec<String> = failed.iter().map(|s| s.to_string()).collect();
    expected.push(fitted.clone());
    expected.sort();
    assert_eq!(i.filed("failed"), expected);
    let error = |name: &str| i.result("failed", name).unwrap()["error"].to_string();
    assert!(error("tampered").contains("t.txt"), "{}", error("tampered"));
    assert!(
        error("partial").contains("never.txt"),
        "{}",
        error("partial")
    );
    assert!(
        error("partial").contains("still incomplete"),
        "{}",
        error("partial")
    );
    assert!(
        error("garbled").contains("manifest.json"),
        "{}",
        error("garbled")
    );
    assert!(error("huge").contains("more than"), "{}", error("huge"));
    assert!(
        error("swarm").contains("more than 20 objects"),
        "{}",
        error("swarm")
    );
    assert!(
        error(&fitted).contains("longer than 255 bytes"),
        "{}",
        error(&fitted)
    );
    // A failed bundle's files are kept beside its result.
    assert!(
        i.objects("failed/tampered")
            .contains_key("failed/tampered/t.txt")
    );
    // None of them left anything in the site but the good bundle's.
    assert_eq!(crate::util::tree(&i.t.join("site")).files(), ["g.txt"]);
    // Filed, none is a bundle any more: no manifest is left in the inbox
    // (the swarm's other objects stay, and are no bundle).
    let manifests: Vec<String> = i
        .objects("inbox")
        .into_keys()
        .filter(|k| k.ends_with("/manifest.json"))
        .collect();
    assert!(manifests.is_empty(), "{manifests:?}");
}

/// Puts `bytes` at the key `rel` below the intake's path as is, with an
/// unsigned HTTP request of its own (the test server lets anonymous
/// clients write): S3 takes keys that no `object_store` path can be, and
/// a hostile producer's client sends them.
fn put_raw(i: &Intake, rel: &str, bytes: &[u8]) {
    put_raw_with(i, rel, bytes, "");
}

/// [`put_raw`] with more header lines (each ending in CRLF).
fn put_raw_with(i: &Intake, rel: &str, bytes: &[u8], headers: &str) {
    use std::io::{Read as _, Write as _};
    let endpoint = i.location.endpoint.as_deref().expect("endpoint");
    let host = endpoint.trim_start_matches("http://");
    let key: String = format!("reports/{rel}")
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let mut stream = std::net::TcpStream::connect(host).expect("connect to the server");
    write!(
        stream,
        "PUT /{}/{key} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        i.location.bucket,
        bytes.len()
    )
    .unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "PUT {rel:?}: {answer}");
}

#[test]
fn keys_no_request_can_name_hold_back_no_other_bundle() {
    let i = Intake::new();
    // A bundle name with a control character: the s3 client would name
    // another key for any of its objects.
    put_raw(&i, "inbox/tab\tx/manifest.json", b"{}");
    // A good bundle with such keys beside its files.
    put_raw(&i, "inbox/mixed/stray\u{1}file", b"x");
    put_raw(&i, "inbox/mixed/folder/", b"");
    let mixed = i.t.bundle("mixed", &[("m.txt", "m\n")]);
    i.upload("mixed", &mixed);
    let good = i.t.bundle("good", &[("g.txt", "g\n")]);
    i.upload("good", &good);
    let agent = i.agent("config.yaml");
    assert!(
        wait_for(Duration::from_secs(60), || i.filed("done").len() == 2),
        "done {:?}\n{}",
        i.filed("done"),
        agent.stderr()
    );
    assert_eq!(i.filed("done"), ["good", "mixed"]);
    assert!(i.filed("failed").is_empty(), "{:?}", i.filed("failed"));
    assert_eq!(
        crate::util::tree(&i.t.join("site")).files(),
        ["g.txt", "m.txt"]
    );
    // What no request can name stays in the inbox, untouched; the rest of
    // the mixed bundle is gone.
    let left: Vec<String> = i.objects("inbox").into_keys().collect();
    assert_eq!(
        left,
        [
            "inbox/mixed/folder/",
            "inbox/mixed/stray\u{1}file",
            "inbox/tab\tx/manifest.json"
        ]
    );
    // The operator is told once, by name, with the fix.
    let told = |log: &str| {
        log.lines()
            .filter(|l| l.contains("a bundle in the inbox is skipped") && l.contains("tab\\tx"))
            .count()
    };
    assert!(
        wait_for(Duration::from_secs(20), || told(&agent.stderr()) == 1),
        "{}",
        agent.stderr()
    );
    assert!(agent.stderr().contains("delete it with an S3 client"));
    // `spool list` shows it, and why it is never claimed.
    let row = i.inbox_row("tab\tx");
    assert_eq!(row["state"], "unreadable", "{row}");
    assert!(
        row["reason"].as_str().unwrap().contains("never claimed"),
        "{row}"
    );
    // Another bundle after a look that saw them all is taken as well.
    let late = i.t.bundle("late", &[("l.txt", "l\n")]);
    i.upload("late", &late);
    assert!(
        wait_for(Duration::from_secs(60), || i.filed("done").len() == 3),
        "{}",
        agent.stderr()
    );
    assert_eq!(told(&agent.stderr()), 1, "{}", agent.stderr());
}

/// The headers of an upload encrypted with a key of the producer's own
/// (SSE-C): no read without that key.
const SSE_C: &str = "x-amz-server-side-encryption-customer-algorithm: AES256\r\n\
    x-amz-server-side-encryption-customer-key: a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=\r\n\
    x-amz-server-side-encryption-customer-key-MD5: mT2HRsMGJ5IX5C+0rreZ8Q==\r\n";

#[test]
fn an_object_the_server_refuses_for_good_fails_its_bundle_and_no_other() {
    let i = Intake::new();
    // A file encrypted with the producer's own key (SSE-C): listed with
    // its size, but no read without that key.
    let sealed = i.t.bundle("sealed", &[("s.txt", "secret\n")]);
    for rel in ["s.txt", "manifest.json"] {
        let bytes = std::fs::read(sealed.join(rel)).unwrap();
        if rel == "s.txt" {
            put_raw_with(&i, "inbox/sealed/s.txt", &bytes, SSE_C);
        } else {
            i.put(&format!("inbox/sealed/{rel}"), &bytes);
        }
    }
    // A manifest so encrypted, in a bundle of more files than a probe
    // lists beside a manifest.
    let files: Vec<(String, String)> = (0..20)
        .map(|n| (format!("l{n}.txt"), format!("{n}\n")))
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let locked = i.t.bundle("locked", &files);
    for (path, content) in &files {
        i.put(&format!("inbox/locked/{path}"), content.as_bytes());
    }
    put_raw_with(
        &i,
        "inbox/locked/manifest.json",
        &std::fs::read(locked.join("manifest.json")).unwrap(),
        SSE_C,
    );
    // A bundle of that manifest alone: nothing of it can be copied.
    put_raw_with(
        &i,
        "inbox/bare/manifest.json",
        &std::fs::read(locked.join("manifest.json")).unwrap(),
        SSE_C,
    );
    let good = i.t.bundle("good", &[("g.txt", "g\n")]);
    i.upload("good", &good);
    let out = i.once();
    // A failed bundle: exit 1, as for a local inbox.
    out.expect_code(1);
    assert_eq!(i.filed("done"), ["good"], "{}", out.stderr);
    assert_eq!(
        i.filed("failed"),
        ["bare", "locked", "sealed"],
        "{}",
        out.stderr
    );
    let error = i.result("failed", "locked").unwrap()["error"].to_string();
    assert!(
        error.contains("refuses to give its manifest.json"),
        "{error}"
    );
    let error = i.result("failed", "sealed").unwrap()["error"].to_string();
    assert!(
        error.contains("refuses to give an object") && error.contains("SSE-C"),
        "{error}"
    );
    assert_eq!(crate::util::tree(&i.t.join("site")).files(), ["g.txt"]);
    // What the server would not copy beside the failure stays in the
    // inbox; its manifest went with the bundle's failure.
    assert_eq!(
        i.objects("inbox").into_keys().collect::<Vec<_>>(),
        [
            "inbox/bare/manifest.json",
            "inbox/locked/manifest.json",
            "inbox/sealed/s.txt"
        ]
    );
    assert!(
        i.objects("failed/sealed")
            .contains_key("failed/sealed/manifest.json")
    );
    // The operator is told what the object left in the inbox is, and how
    // to remove it; not that it waits for its manifest.
    let sealed = i.inbox_row("sealed");
    assert_eq!(sealed["state"], "no_manifest", "{sealed}");
    let reason = sealed["reason"].as_str().unwrap();
    assert!(
        reason.contains("left behind by its failure, filed as failed/sealed")
            && reason.contains("aws s3 rm --recursive s3://"),
        "{reason}"
    );
    // An object uploaded under that name since (by the server's clock):
    // a delivery under way, waiting for its manifest.
    let written = |rel: &str| i.bucket.head(rel).unwrap().unwrap().last_modified;
    let failed_at = written("failed/sealed/.distributor-result.json");
    assert!(wait_for(Duration::from_secs(10), || {
        i.put("inbox/sealed/again.txt", b"again\n");
        written("inbox/sealed/again.txt").unix_timestamp() > failed_at.unix_timestamp()
    }));
    let again = i.inbox_row("sealed");
    assert!(
        again["reason"]
            .as_str()
            .unwrap()
            .contains("no manifest.json yet"),
        "{again}"
    );
}

#[test]
fn a_name_delivered_over_a_thousand_times_is_filed_without_reading_each_result() {
    let proxy = crate::seaweed::RecordingProxy::start(&server().endpoint);
    let mut location = server().location("reports");
    location.endpoint = Some(proxy.endpoint.clone());
    let i = Intake::at(location, "");
    // The results of 1,200 earlier deliveries of `daily`, one of them
    // (`daily.7`) since deleted by done_retention, and another bundle's
    // whose name starts alike.
    let result = |n: u32| match n {
        0 => "done/daily/.distributor-result.json".to_owned(),
        n => format!("done/daily.{n}/.distributor-result.json"),
    };
    let doc = br#"{"ok": true, "intake": {"name": "daily", "manifest_etag": "\"0\""}}"#;
    std::thread::scope(|scope| {
        for part in 0..4u32 {
            let (i, result) = (&i, &result);
            scope.spawn(move || {
                for n in (0..1200u32).filter(|n| n % 4 == part && *n != 7) {
                    i.bucket
                        .put_new(&result(n), &mut &doc[..], None, "test")
                        .unwrap();
                }
            });
        }
    });
    i.put("done/daily-other/.distributor-result.json", doc);
    // Delivered two seconds after the last of them by the server's clock
    // (a result written a second before a delivery may be its own).
    let clock = || {
        i.put("clock", b"");
        i.bucket.head("clock").unwrap().unwrap().last_modified
    };
    let two_seconds_later = || {
        let last = clock();
        assert!(wait_for(Duration::from_secs(10), || clock()
            >= last + time::Duration::seconds(2)));
    };
    two_seconds_later();
    let daily = i.t.bundle("daily", &[("d.txt", "d\n")]);
    i.upload("daily", &daily);
    proxy.take();
    let out = i.once();
    out.expect_code(0);
    let log = proxy.take();
    // Filed under the first name free, as a local spool names it.
    assert_eq!(
        i.result("done", "daily.7").unwrap()["intake"]["name"],
        "daily"
    );
    let to_done = |log: &[crate::seaweed::Exchange], method: &str| {
        log.iter()
            .filter(|e| e.method == method && e.target.contains("/done/daily"))
            .count()
    };
    // The name taken (a PUT), one listing from it (two pages), the PUT of
    // the result; no result read.
    assert_eq!(to_done(&log, "PUT"), 2, "{log:#?}");
    assert_eq!(to_done(&log, "GET"), 0, "{log:#?}");
    let lists = log
        .iter()
        .filter(|e| e.method == "GET" && e.target.contains("start-after="))
        .count();
    assert_eq!(lists, 2, "{log:#?}");
    // Delivered again: past every name taken, still without a read.
    let again = i.t.bundle("again", &[("d.txt", "e\n")]);
    two_seconds_later();
    i.upload("daily", &again);
    proxy.take();
    i.once().expect_code(0);
    let log = proxy.take();
    assert_eq!(to_done(&log, "GET"), 0, "{log:#?}");
    assert_eq!(
        i.result("done", "daily.1200").unwrap()["intake"]["name"],
        "daily"
    );
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/d.txt")).unwrap(),
        "e\n"
    );
}

#[test]
fn a_signed_intake_takes_bundles_uploaded_with_bundle_upload_and_refuses_others() {
    let i = Intake::with("    signatures:\n      allowed_signers: signers\n");
    let key = crate::signatures::keygen(&i.t, "alice", &["ed25519"], "");
    i.t.write("signers", format!("alice {}\n", key.public));
    let signed = i.t.bundle("signed", &[("s.txt", "signed\n")]);
    crate::signatures::ssh_sign(&key.private, &signed.join("manifest.json"), "distributor");
    let unsigned = i.t.bundle("unsigned", &[("u.txt", "unsigned\n")]);
    // The producer's side: the bundle command uploads in the right order.
    let endpoint = i.location.endpoint.clone().unwrap();
    for (name, dir) in [("signed", &signed), ("unsigned", &unsigned)] {
        let url = format!("s3://{}/reports/inbox/{name}", i.location.bucket);
        i.cmd("config.yaml")
            .args(["bundle", "upload"])
            .arg(dir)
            .args([url.as_str(), "--endpoint", endpoint.as_str()])
            .output()
            .expect_code(0);
    }
    let agent = i.agent("config.yaml");
    // Published as its signer; the unsigned one waits for a signature,
    // then fails after incomplete_timeout.
    assert!(
        wait_for(Duration::from_secs(60), || i.filed("done") == ["signed"]
            && i.filed("failed") == ["unsigned"]),
        "done {:?} failed {:?}\n{}",
        i.filed("done"),
        i.filed("failed"),
        agent.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/s.txt")).unwrap(),
        "signed\n"
    );
    assert!(!i.t.join("site/u.txt").exists());
    let done = i.result("done", "signed").unwrap();
    assert_eq!(done["signer"]["principal"], "alice", "{done}");
    let failed = i.result("failed", "unsigned").unwrap();
    assert!(
        failed["error"].to_string().contains("manifest.json.sig"),
        "{failed}"
    );
}

#[test]
fn a_crash_between_the_result_and_the_inbox_removal_files_nothing_twice() {
    // The second bundle's result is written (a failed one for `bad`),
    // then the holder dies before the inbox objects go.
    for (point, bad) in [
        ("intake.result_written:2", false),
        ("intake.result_written:1", true),
    ] {
        let i = Intake::new();
        let one = i.t.bundle("one", &[("one.txt", "1\n")]);
        let two = i.t.bundle("two", &[("two.txt", "2\n")]);
        if bad {
            std::fs::write(one.join("one.txt"), "X\n").unwrap();
        }
        i.upload("one", &one);
        i.upload("two", &two);
        let mut cmd = i.cmd("config.yaml");
        let crashed = cmd
            .env("DISTRIBUTOR_FAILPOINT", point)
            .args(["agent", "--once"])
            .output();
        assert_ne!(
            crashed.code, 0,
            "{point}: the failpoint fired\n{}",
            crashed.stderr
        );
        // The next agent (a released lease is not; it waits out the lease).
        i.once().expect_code(if bad { 1 } else { 0 });
        let (done, failed): (&[&str], &[&str]) = if bad {
            (&["two"], &["one"])
        } else {
            (&["one", "two"], &[])
        };
        assert_eq!(i.filed("done"), done, "{point}");
        assert_eq!(i.filed("failed"), failed, "{point}");
        assert!(
            i.objects("inbox").is_empty(),
            "{point}: {:?}",
            i.objects("inbox")
        );
        if bad {
            // Its files once beside its result, not twice.
            assert_eq!(
                i.objects("failed/one")
                    .keys()
                    .filter(|k| k.ends_with("one.txt"))
                    .count(),
                1
            );
        }
        assert_eq!(
            i.published(),
            ["one", "two"][usize::from(bad)..].to_vec(),
            "{point}"
        );
    }
}

#[test]
fn a_bundle_uploaded_again_between_its_probe_and_its_fetch_is_not_failed() {
    let i = Intake::new();
    let first = i.t.bundle("x", &[("a.txt", "1\n"), ("b.txt", "b\n")]);
    i.upload("x", &first);
    // The holder found it complete, and stops before reading its objects.
    let mut a = i.agent_failing("intake.probed:1:stop");
    assert!(
        wait_for(Duration::from_secs(30), || a.stopped()),
        "{}",
        a.stderr()
    );
    // Meanwhile the producer sends it again, with another a.txt.
    let again = i.t.bundle_at(
        "x2",
        "x",
        "2026-06-05T00:00:00Z",
        &[("a.txt", "2\n"), ("b.txt", "b\n")],
    );
    i.upload("x", &again);
    a.signal(libc::SIGCONT);
    wait_done(&i, 1, &[&a]);
    // Its objects changed under the fetch: looked at again, not failed,
    // and the delivery now in the inbox is the one published.
    assert!(
        wait_for(Duration::from_secs(30), || i.objects("inbox").is_empty()),
        "{:?}",
        i.objects("inbox")
    );
    a.signal(libc::SIGTERM);
    let log = a.finish(Duration::from_secs(30)).stderr;
    assert!(log.contains("uploaded again while it was fetched"), "{log}");
    assert_eq!(i.filed("done"), ["x"], "{log}");
    assert!(i.filed("failed").is_empty(), "{log}");
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/a.txt")).unwrap(),
        "2\n"
    );
    assert_eq!(i.published(), ["x"]);
}

/// `agent --once` stopped at `failpoint`, the server killed meanwhile,
/// then let go on: what the run ended with.
fn once_losing_the_server(
    i: &Intake,
    server: &mut crate::seaweed::OwnServer,
    failpoint: &str,
) -> Output {
    let mut run = once_stopped_at(i, failpoint);
    server.stop(libc::SIGKILL);
    run.signal(libc::SIGCONT);
    run.finish(Duration::from_secs(120))
}

/// `agent --once` stopped (SIGSTOP) at `failpoint`, waiting for SIGCONT.
fn once_stopped_at(i: &Intake, failpoint: &str) -> Proc {
    let mut cmd = i.cmd("config.yaml");
    cmd.env("RUST_LOG", "info")
        .env("DISTRIBUTOR_FAILPOINT", failpoint)
        .args(["agent", "--once"]);
    let run = cmd.start();
    assert!(
        wait_for(Duration::from_secs(30), || run.stopped()),
        "{}",
        run.stderr()
    );
    run
}

#[test]
fn agent_once_ends_when_the_intake_stops_answering() {
    let mut server = crate::seaweed::OwnServer::start("intake-once-outage");
    let i = Intake::at(server.location("intake", "reports"), "");
    let bundles = backlog(&i, 2);
    for (name, dir) in &bundles {
        i.upload(name, dir);
    }
    // The run publishes the first bundle and writes its result; then the
    // server goes away.
    let out = once_losing_the_server(&i, &mut server, "intake.result_written:1:stop");
    // It ends, and exits 1: what it did not file stays in the intake.
    assert_eq!(out.code, 1, "{}", out.stderr);
    // The next run files what is left, nothing twice, in order.
    server.resume();
    i.once().expect_code(0);
    let names: Vec<String> = bundles.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(i.filed("done"), names);
    assert!(i.objects("inbox").is_empty(), "{:?}", i.objects("inbox"));
    assert_site(&i, 2);
    let mut published = i.published();
    published.dedup();
    assert_eq!(published, names);
}

#[test]
fn agent_once_ends_when_its_look_is_not_answered() {
    let mut server = crate::seaweed::OwnServer::start("intake-once-look");
    let i = Intake::at(server.location("intake", "reports"), "");
    let one = i.t.bundle("one", &[("one.txt", "1\n")]);
    i.upload("one", &one);
    // The run holds the lease; the server goes away before its first look.
    let out = once_losing_the_server(&i, &mut server, "intake.held:1:stop");
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("--once leaves it"), "{}", out.stderr);
    server.resume();
    i.once().expect_code(0);
    assert_eq!(i.filed("done"), ["one"]);
    assert_eq!(i.published(), ["one"]);
}

#[test]
fn a_bundle_whose_fetch_meets_an_outage_is_taken_again_first() {
    let mut server = crate::seaweed::OwnServer::start("intake-fetch-outage");
    let i = Intake::at(server.location("intake", "reports"), "");
    let bundles = backlog(&i, 2);
    for (name, dir) in &bundles {
        i.upload(name, dir);
    }
    // The holder found b000 complete; the server stops before it is read.
    let a = i.agent_failing("intake.probed:1:stop");
    assert!(
        wait_for(Duration::from_secs(30), || a.stopped()),
        "{}",
        a.stderr()
    );
    server.stop(libc::SIGKILL);
    a.signal(libc::SIGCONT);
    a.wait_log("cannot fetch it", Duration::from_secs(120));
    server.resume();
    // It stays first: taken again once the server answers, before b001.
    wait_done(&i, 2, &[&a]);
    let names: Vec<String> = bundles.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(i.filed("done"), names, "{}", a.stderr());
    assert!(i.filed("failed").is_empty(), "{}", a.stderr());
    assert_eq!(i.published(), names);
    assert_site(&i, 2);
}

#[test]
fn agent_once_exits_1_while_an_intake_bundle_stays_incomplete() {
    let i = Intake::new();
    let partial = i.t.bundle("partial", &[("a.txt", "a\n"), ("b.txt", "b\n")]);
    std::fs::remove_file(partial.join("b.txt")).unwrap();
    i.upload("partial", &partial);
    i.upload("ready", &i.t.bundle("ready", &[("r.txt", "r\n")]));
    let out = i.once();
    out.expect_code(1);
    assert!(
        out.stderr
            .contains("1 done, 0 failed, 1 incomplete left in the inbox"),
        "{}",
        out.stderr
    );
    assert_eq!(i.filed("done"), ["ready"]);
    assert!(
        i.objects("inbox")
            .contains_key("inbox/partial/manifest.json")
    );
}

#[test]
fn folder_markers_a_console_makes_are_no_bundles_and_hold_nothing_back() {
    let i = Intake::new();
    // "Create folder" in a bucket console: an empty object whose key ends
    // in a slash, for the inbox, a bundle's folder, and a folder left
    // empty.
    put_raw(&i, "inbox/", b"");
    put_raw(&i, "inbox/good/", b"");
    i.upload("good", &i.t.bundle("good", &[("g.txt", "g\n")]));
    put_raw(&i, "inbox/empty/", b"");
    let out = i.once();
    out.expect_code(0);
    assert_eq!(i.filed("done"), ["good"], "{}", out.stderr);
    assert_eq!(i.published(), ["good"]);
    assert_eq!(crate::util::tree(&i.t.join("site")).files(), ["g.txt"]);
    // The markers stay (no request can name them), and nothing is shown
    // waiting: an operator sees an empty inbox.
    assert_eq!(i.objects("inbox").len(), 3, "{:?}", i.objects("inbox"));
    let out = i
        .cmd("config.yaml")
        .args(["spool", "list", "--inbox", "--json"])
        .output();
    out.expect_code(0);
    assert_eq!(out.json(), serde_json::json!([]), "{}", out.stdout);
    let out = i.cmd("config.yaml").args(["status"]).output();
    assert!(out.stdout.contains("inbox 0 "), "{}", out.stdout);
}

#[test]
fn a_delivery_again_under_a_name_being_filed_keeps_its_place_in_arrival_order() {
    let proxy = crate::seaweed::RecordingProxy::start(&server().endpoint);
    let mut location = server().location("reports");
    location.endpoint = Some(proxy.endpoint.clone());
    let i = Intake::at(location, "");
    i.upload("a", &i.t.bundle("a1", &[("a.txt", "one\n")]));
    let mut run = once_stopped_at(&i, "intake.fetched:1:stop");
    // While `a` is processed: `a` delivered again, then `b`, a second
    // later by the server's clock.
    i.upload("a", &i.t.bundle("a2", &[("a.txt", "two\n")]));
    let written = |rel: &str| i.bucket.head(rel).unwrap().unwrap().last_modified;
    let again = written("inbox/a/manifest.json");
    assert!(wait_for(Duration::from_secs(10), || {
        i.put("clock", b"");
        written("clock").unix_timestamp() > again.unix_timestamp()
    }));
    i.upload("b", &i.t.bundle("b", &[("b.txt", "b\n")]));
    // The first `a` is filed slowly: its result's PUT waits, and the
    // agent looks at the inbox meanwhile.
    proxy.hold("PUT", "done/a/.distributor-result.json");
    proxy.take();
    run.signal(libc::SIGCONT);
    assert!(proxy.wait_held(Duration::from_secs(30)), "{}", run.stderr());
    let looked = |log: &[crate::seaweed::Exchange]| {
        log.iter().any(|e| {
            e.method == "GET"
                && e.target.contains("list-type=2")
                && e.target.ends_with("prefix=reports%2Finbox%2F")
        })
    };
    let mut log = Vec::new();
    assert!(
        wait_for(Duration::from_secs(30), || {
            log.extend(proxy.take());
            looked(&log)
        }),
        "{log:#?}"
    );
    proxy.release();
    let out = run.finish(Duration::from_secs(120));
    assert_eq!(out.code, 0, "{}", out.stderr);
    // `a` again came before `b`, as its manifest did.
    assert_eq!(i.published(), ["a", "a", "b"], "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(i.t.join("site/a.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(i.filed("done"), ["a", "a.1", "b"]);
}

#[test]
fn an_inbox_too_large_to_list_whole_reads_a_missing_manifest_once_a_lease() {
    let proxy = crate::seaweed::RecordingProxy::start(&server().endpoint);
    let mut location = server().location("reports");
    // Objects put straight to the server, not through the proxy.
    let direct = S3Root::open_with(&location, credentials()).expect("s3 client");
    location.endpoint = Some(proxy.endpoint.clone());
    let i = Intake::at(location, "");
    // A lease of 12 s: a look every 2 s.
    let config = std::fs::read_to_string(i.t.join("config.yaml"))
        .unwrap()
        .replace(&format!("lease: {LEASE}"), "lease: 12s");
    i.t.write("config.yaml", config);
    // 100 names without a manifest, of 101 objects each: more objects
    // than a look lists whole, so the inbox is looked at by its names.
    std::thread::scope(|scope| {
        for part in 0..16 {
            let direct = &direct;
            scope.spawn(move || {
                for n in (0..100).filter(|n| n % 16 == part) {
                    for k in 0..101 {
                        let rel = format!("inbox/h{n:03}/f{k}");
                        direct.put_new(&rel, &mut &b"x"[..], None, "test").unwrap();
                    }
                }
            });
        }
    });
    i.upload("good", &i.t.bundle("good", &[("g.txt", "g\n")]));
    proxy.take();
    let mut agent = i.agent("config.yaml");
    let looks = |log: &[crate::seaweed::Exchange]| {
        log.iter()
            .filter(|e| {
                e.method == "GET"
                    && e.target.contains("delimiter=%2F")
                    && e.target.ends_with("prefix=reports%2Finbox%2F")
            })
            .count()
    };
    let mut log = Vec::new();
    assert!(
        wait_for(Duration::from_secs(90), || {
            log.extend(proxy.take());
            looks(&log) >= 6 && i.filed("done") == ["good"]
        }),
        "{} looks\n{}",
        looks(&log),
        agent.stderr()
    );
    // Each name's missing manifest was asked for once a lease, not at
    // every look (six looks take about half a lease).
    for n in 0..100 {
        let key = format!("inbox/h{n:03}/manifest.json");
        let reads = log
            .iter()
            .filter(|e| e.method == "GET" && e.target.ends_with(&key))
            .count();
        assert!(
            2 * reads <= looks(&log),
            "{key}: {reads} reads in {} looks",
            looks(&log)
        );
    }
    agent.signal(libc::SIGTERM);
    agent.finish(Duration::from_secs(30));
}

#[test]
fn a_manifest_replaced_by_one_over_the_cap_after_a_look_fails_its_bundle_only() {
    let i = Intake::with("    limits:\n      max_files: 4\n");
    // A lease long enough that the first look's listing serves every
    // probe of this run.
    let config = std::fs::read_to_string(i.t.join("config.yaml"))
        .unwrap()
        .replace(&format!("lease: {LEASE}"), "lease: 60s");
    i.t.write("config.yaml", config);
    let upload_at = |name: &str, content: &str| {
        let b = i.t.bundle(name, &[("f.txt", content)]);
        i.upload(name, &b);
        b
    };
    upload_at("w", "w\n");
    // A manifest too large to be read ahead by the look (padded with a
    // key the manifest may carry), within the pipeline's cap.
    let x = i.t.bundle("x", &[("x.txt", "x\n")]);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(x.join("manifest.json")).unwrap()).unwrap();
    manifest["padding"] = serde_json::json!("p".repeat(100 << 10));
    std::fs::write(
        x.join("manifest.json"),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    i.upload("x", &x);
    upload_at("y", "y\n");
    let mut run = once_stopped_at(&i, "intake.fetched:1:stop");
    // Looked at, and `w` fetched: `x`'s manifest is then replaced by one
    // over the cap (1 MiB at max_files 4).
    i.put("inbox/x/manifest.json", &vec![b' '; (1 << 20) + 1]);
    run.signal(libc::SIGCONT);
    let out = run.finish(Duration::from_secs(120));
    // The others are published; `x` fails, saying why.
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert_eq!(i.filed("done"), ["w", "y"], "{}", out.stderr);
    assert_eq!(i.filed("failed"), ["x"], "{}", out.stderr);
    let error = i.result("failed", "x").unwrap()["error"].to_string();
    assert!(error.contains("more than the 1048576 bytes"), "{error}");
}
