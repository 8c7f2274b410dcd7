//! Several hosts publishing into one s3 root (docs/contract.md §15.4, §15.6),
//! against the real SeaweedFS of `seaweed::server`. Each "host" is an agent
//! with a spool of its own and the same s3 destination; they race bundles
//! into one root (some writing one shared path, so that overlapping
//! publications conflict) while the test `kill -9`s them at points chosen
//! by what it observes (an intent of the victim in the bucket, a bundle
//! claimed, a bundle done), never by a fixed sleep. Once idle, the root must
//! hold every record of every bundle, every record must match its object,
//! nothing may be left under `.distributor-pending/`, and the objects nobody
//! manages must be untouched. A second test kills one publication in the
//! middle of a multipart upload and has another host converge the root.
//!
//! The intent lease is shortened to [`LEASE_SECS`] through
//! `DISTRIBUTOR_S3_LEASE_SECS`, so a killed publisher's leftovers become
//! recoverable within the test.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use distributor::config::S3Location;
use serde_json::Value;

use crate::seaweed::{Bucket, server};
use crate::util::{Rng, names, sha256, stopped, wait_for, write_file};

const BIN: &str = env!("CARGO_BIN_EXE_distributor");
const CREATED: &str = "2026-06-04T11:55:00Z";
/// The intent lease every process of these tests uses.
const LEASE_SECS: &str = "2";
const PIPELINE: &str = "site";
const RESULT: &str = ".distributor-result.json";
/// Longest the test waits for any one observable event before failing.
const EVENT_WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Hosts: a config and a spool each, the same s3 destination
// ---------------------------------------------------------------------------

/// What a finished command printed.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    #[track_caller]
    fn expect(&self, code: i32) -> &Out {
        assert_eq!(
            self.code, code,
            "expected exit code {code}, got {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }
}

/// A live agent; killed on drop so a failing test leaves none behind.
struct Agent {
    child: Child,
    reader: Option<JoinHandle<Vec<u8>>>,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9`, then reap it.
    fn kill9(mut self) {
        let pid = self.child.id();
        self.child
            .kill()
            .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
        self.child.wait().expect("reap the agent");
        if let Some(r) = self.reader.take() {
            r.join().expect("log reader");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One publishing host: `config-<name>.yaml` with `spool: ./spool-<name>`.
struct Host {
    name: String,
    dir: PathBuf,
    /// Everything its agents logged, across restarts.
    log: Arc<Mutex<Vec<u8>>>,
}

impl Host {
    fn new(dir: &Path, name: &str, location: &S3Location, max_attempts: u32) -> Host {
        write_file(
            &dir.join(format!("config-{name}.yaml")),
            format!(
                "spool: ./spool-{name}
agent:
  settle: 0s
  rescan_interval: 1s
  max_attempts: {max_attempts}
pipelines:
  - id: {PIPELINE}
    destinations:
      - id: web
        backend: s3
        bucket: {bucket}
        path: {path}
        endpoint: {endpoint}
        workflow: additive
",
                bucket = location.bucket,
                path = location.path,
                endpoint = server().endpoint,
            )
            .as_bytes(),
        );
        let host = Host {
            name: name.to_owned(),
            dir: dir.to_owned(),
            log: Arc::default(),
        };
        for folder in ["inbox", "work", "done", "failed"] {
            fs::create_dir_all(host.spool(folder)).expect("spool folder");
        }
        host
    }

    /// `spool-<name>/site/<folder>`.
    fn spool(&self, folder: &str) -> PathBuf {
        self.dir
            .join(format!("spool-{}/{PIPELINE}/{folder}", self.name))
    }

    /// The binary with this host's config, the server's credentials and
    /// the short lease.
    fn cmd(&self, args: &[&str]) -> Command {
        let creds = server().credentials();
        let mut cmd = Command::new(BIN);
        cmd.current_dir(&self.dir)
            .env_remove("DISTRIBUTOR_CONFIG")
            .env("RUST_LOG", "info")
            .env("AWS_ACCESS_KEY_ID", &creds.key_id)
            .env("AWS_SECRET_ACCESS_KEY", &creds.secret)
            .env("DISTRIBUTOR_S3_LEASE_SECS", LEASE_SECS)
            .arg("--config")
            .arg(format!("config-{}.yaml", self.name))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the binary to completion (failing the test after a minute).
    fn run(&self, args: &[&str]) -> Out {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distributor");
        let out = collect(child.stdout.take().expect("stdout"), Arc::default());
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let err = collect(child.stderr.take().expect("stderr"), err_buf.clone());
        let mut status = None;
        wait_for(EVENT_WAIT, || {
            status = child.try_wait().expect("wait");
            status.is_some()
        });
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{args:?} on host {} did not finish within {EVENT_WAIT:?}:\n{}",
                self.name,
                String::from_utf8_lossy(&err_buf.lock().unwrap())
            );
        };
        let stdout = out.join().expect("stdout reader");
        err.join().expect("stderr reader");
        let stderr = String::from_utf8_lossy(&err_buf.lock().unwrap()).into_owned();
        self.log
            .lock()
            .unwrap()
            .extend_from_slice(stderr.as_bytes());
        Out {
            code: status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr,
        }
    }

    /// Starts a live agent (`agent` without `--once`).
    fn agent(&self) -> Agent {
        let mut child = self
            .cmd(&["agent"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the agent");
        let reader = collect(child.stderr.take().expect("stderr"), self.log.clone());
        Agent {
            child,
            reader: Some(reader),
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    /// Drops the sealed bundle `staged` into the inbox (a producer's rename).
    fn feed(&self, staged: &Path) {
        let name = staged.file_name().expect("bundle name");
        fs::rename(staged, self.spool("inbox").join(name)).expect("drop into the inbox");
    }

    /// Nothing waiting in inbox/ or work/.
    fn idle(&self) -> bool {
        names(&self.spool("inbox")).is_empty() && names(&self.spool("work")).is_empty()
    }
}

/// Reads `pipe` into `buf` until it closes.
fn collect(mut pipe: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        let mut all = Vec::new();
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            all.extend_from_slice(&chunk[..n]);
        }
        all
    })
}

/// The bundle an output path belongs to: `hA/b003/f0.txt` is `hA-b003`'s.
fn bundle_of(path: &str) -> Option<String> {
    let mut parts = path.split('/');
    let (host, n) = (parts.next()?, parts.next()?);
    (host.starts_with('h') && n.starts_with('b')).then(|| format!("{host}-{n}"))
}

// ---------------------------------------------------------------------------
// Bundles
// ---------------------------------------------------------------------------

/// A sealed bundle written without the binary (one process per bundle
/// would dominate the time): the files, then a manifest (docs/contract.md §3) renamed
/// into place.
fn write_bundle(dir: &Path, id: &str, files: &[(String, Vec<u8>)]) {
    let mut listed: Vec<(String, String, usize)> = Vec::new();
    for (path, contents) in files {
        write_file(&dir.join(path), contents);
        listed.push((path.clone(), sha256(contents), contents.len()));
    }
    listed.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let text: String = listed
        .iter()
        .map(|(p, s, n)| format!("{s} {n} {p}\n"))
        .collect();
    let doc = serde_json::json!({
        "schema_version": 1,
        "id": id,
        "created": CREATED,
        "digest": sha256(text.as_bytes()),
        "files": listed
            .iter()
            .map(|(p, s, n)| serde_json::json!({"path": p, "sha256": s, "size": n}))
            .collect::<Vec<_>>(),
    });
    let temp = dir.join(".manifest.json.tmp");
    fs::write(&temp, serde_json::to_vec_pretty(&doc).expect("json")).expect("manifest");
    fs::rename(&temp, dir.join("manifest.json")).expect("manifest");
}

/// The path every host's bundles sometimes write: catalog conflicts whose
/// loser must be retried, not lost.
const SHARED: &str = "shared/s.txt";

/// What the race fed: per host and bundle, the outputs it must leave.
#[derive(Default)]
struct Fed {
    /// Bundle names per host.
    bundles: BTreeMap<String, BTreeSet<String>>,
    /// Paths written by exactly one bundle, with their bytes.
    unique: BTreeMap<String, Vec<u8>>,
    /// Every version of [`SHARED`] some bundle wrote.
    shared: BTreeSet<String>,
}

impl Fed {
    /// Seals bundle `n` of `host` under `stage/` and returns its folder:
    /// `small` small files and a 48 KiB one of its own, and with `shared`
    /// also [`SHARED`].
    fn bundle(&mut self, stage: &Path, host: &str, n: u32, small: u32, shared: bool) -> PathBuf {
        let name = format!("h{host}-b{n:03}");
        let mut files: Vec<(String, Vec<u8>)> = (0..small)
            .map(|i| {
                (
                    format!("h{host}/b{n:03}/f{i}.txt"),
                    format!("{name} file {i}\n").into_bytes(),
                )
            })
            .collect();
        let seed = u64::from(n) * 131 + u64::from(host.as_bytes()[0]);
        files.push((
            format!("h{host}/b{n:03}/blob.bin"),
            Rng::new(seed | 1).bytes(48 * 1024),
        ));
        if shared {
            let bytes = format!("{name} wrote the shared file\n").into_bytes();
            self.shared.insert(sha256(&bytes));
            files.push((SHARED.to_owned(), bytes));
        }
        for (path, bytes) in &files {
            if path != SHARED {
                self.unique.insert(path.clone(), bytes.clone());
            }
        }
        let dir = stage.join(&name);
        write_bundle(&dir, &name, &files);
        self.bundles
            .entry(host.to_owned())
            .or_default()
            .insert(name);
        dir
    }
}

// ---------------------------------------------------------------------------
// The race
// ---------------------------------------------------------------------------

/// Where in the victim's work the next `kill -9` lands. Each bundle is
/// hit by a mid-publication or just-claimed kill at most once, so that no
/// bundle runs out of attempts (every kill mid-publication costs its
/// bundle an attempt or two until the lease runs out).
#[derive(Debug, Clone, Copy)]
enum Trigger {
    /// As soon as an intent it wrote for a bundle not hit before is in the
    /// bucket (mid-publication).
    Intent,
    /// As soon as it claimed a bundle not hit before into work/.
    Claimed,
    /// As soon as one more of its bundles reached done/.
    Done,
}

/// A bucket root of its own (below `name`) and a temporary folder for the
/// hosts' spools and bundles.
fn scene(name: &str) -> (Bucket, tempfile::TempDir) {
    let bucket = Bucket::new(name);
    let tmp = tempfile::Builder::new()
        .prefix(&format!("distributor-s3{name}-"))
        .tempdir()
        .expect("temp dir");
    (bucket, tmp)
}

#[test]
fn agents_on_separate_hosts_racing_into_one_root_under_kill_9_lose_nothing() {
    const MIN_ROUNDS: u32 = 10;
    const MAX_ROUNDS: u32 = 24;
    const MIN_MID_PUBLICATION: u32 = 3;
    const PER_ROUND: u32 = 2;
    let started = Instant::now();
    let (bucket, tmp) = scene("race");
    let dir = tmp.path();
    let stage = dir.join("stage");
    let hosts = [
        // A kill in the middle of a batch costs each of its bundles an
        // attempt: more attempts than one-by-one publication would need.
        Host::new(dir, "A", &bucket.location, 16),
        Host::new(dir, "B", &bucket.location, 16),
    ];

    // The root is managed (a catalog exists) before anything else lands in
    // it: a root without a catalog that holds objects is refused.
    let seed = stage.join("seed");
    write_bundle(
        &seed,
        "seed",
        &[("seed/index.txt".to_owned(), b"seed\n".to_vec())],
    );
    hosts[0]
        .run(&[
            "run",
            "--json",
            "--pipeline",
            PIPELINE,
            seed.to_str().expect("utf-8"),
        ])
        .expect(0);
    // Objects nobody manages, at paths no bundle uses.
    let planted: BTreeMap<String, (Vec<u8>, String)> = [
        ("unmanaged/notes.txt", b"written by hand\n".to_vec()),
        ("hA/unmanaged.bin", Rng::new(7 | 1).bytes(5000)),
        ("zz-last.html", b"<p>theirs</p>".to_vec()),
    ]
    .into_iter()
    .map(|(path, bytes)| {
        let etag = bucket.plant(path, &bytes);
        (path.to_owned(), (bytes, etag))
    })
    .collect();

    let mut fed = Fed::default();
    let mut rng = Rng::seeded("s3 race");
    let mut next = 0u32;
    // Contention first: both hosts publish bundles that all write SHARED
    // at once; when two overlap, the later compare-and-swap finds that the
    // other changed its path, is undone and retried (never lost). They
    // wait in the inboxes before the agents start, so each agent claims
    // them together and publishes them as a batch (one intent, one swap).
    for _ in 0..4 {
        for host in &hosts {
            let b = fed.bundle(&stage, &host.name, next, 20, true);
            next += 1;
            host.feed(&b);
        }
    }
    let mut agents: Vec<Option<Agent>> = hosts.iter().map(|h| Some(h.agent())).collect();
    let settled = wait_for(EVENT_WAIT, || hosts.iter().all(Host::idle));
    assert!(
        settled,
        "the contention bundles were not all published within {EVENT_WAIT:?}\n{}\n{}",
        hosts[0].log(),
        hosts[1].log()
    );
    let (mut kills, mut mid_publication, mut left_in_work) = (0u32, 0u32, 0u32);
    let mut round = 0;
    // Bundles a kill already landed on.
    let mut hit = BTreeSet::new();
    while round < MIN_ROUNDS || (mid_publication < MIN_MID_PUBLICATION && round < MAX_ROUNDS) {
        for host in &hosts {
            for _ in 0..PER_ROUND {
                let b = fed.bundle(
                    &stage,
                    &host.name,
                    next,
                    3 + next % 4,
                    next.is_multiple_of(3),
                );
                next += 1;
                host.feed(&b);
            }
        }
        let v = (round % 2) as usize;
        let victim = &hosts[v];
        let agent = agents[v].take().expect("a running agent");
        let pid = agent.pid();
        let trigger = match rng.below(3) {
            0 => Trigger::Intent,
            1 => Trigger::Claimed,
            _ => Trigger::Done,
        };
        let done_before = names(&victim.spool("done")).len();
        let fresh = |bundles: BTreeSet<String>| -> Option<String> {
            bundles.into_iter().find(|b| !hit.contains(b))
        };
        let mut target = None;
        let fired = wait_for(EVENT_WAIT, || {
            target = match trigger {
                Trigger::Intent => fresh(publishing(&bucket, pid)),
                Trigger::Claimed => fresh(names(&victim.spool("work"))),
                Trigger::Done => (names(&victim.spool("done")).len() > done_before)
                    .then(|| "(between bundles)".to_owned()),
            };
            // An agent that got through everything is killed idle.
            target.is_some() || victim.idle()
        });
        assert!(
            fired,
            "round {round}: host {} neither reached {trigger:?} nor went idle within {EVENT_WAIT:?}\n{}",
            victim.name,
            victim.log()
        );
        agent.kill9();
        kills += 1;
        if !publishing(&bucket, pid).is_empty() {
            mid_publication += 1;
        }
        hit.extend(target);
        if !names(&victim.spool("work")).is_empty() {
            left_in_work += 1;
        }
        agents[v] = Some(victim.agent());
        round += 1;
    }
    // The last kills: both agents at once, wherever they are.
    for a in &mut agents {
        a.take().expect("a running agent").kill9();
        kills += 1;
    }
    let racing = started.elapsed();

    // Every host finishes what it holds, one `agent --once` after another
    // until inbox/ and work/ are empty (each retries transient failures).
    for pass in 0..3 {
        for host in &hosts {
            if !host.idle() {
                host.run(&["agent", "--once"]).expect(0);
            }
        }
        if hosts.iter().all(Host::idle) {
            break;
        }
        assert!(pass < 2, "a spool still holds bundles after 3 passes");
    }
    // Stale intents left by the kills are recovered before any publication
    // plans: re-publishing the seed (nothing to write) does it once they
    // are older than the lease.
    let recovered = wait_for(Duration::from_secs(30), || {
        if bucket.reserved().is_empty() {
            return true;
        }
        hosts[1]
            .run(&[
                "run",
                "--json",
                "--pipeline",
                PIPELINE,
                seed.to_str().expect("utf-8"),
            ])
            .expect(0);
        bucket.reserved().is_empty()
    });
    assert!(
        recovered,
        "left under .distributor-pending/: {:?}",
        bucket.reserved()
    );

    // 0 lost bundles: every one in done/ of its own host, none failed.
    for host in &hosts {
        let log = host.log();
        assert_eq!(
            names(&host.spool("failed")),
            BTreeSet::new(),
            "host {} failed bundles\n{log}",
            host.name
        );
        assert_eq!(
            names(&host.spool("done")),
            fed.bundles[&host.name],
            "host {}\n{log}",
            host.name
        );
        for name in &fed.bundles[&host.name] {
            let result: Value = serde_json::from_slice(
                &fs::read(host.spool("done").join(name).join(RESULT)).expect("result file"),
            )
            .expect("result JSON");
            assert_eq!(result["ok"], true, "{name}: {result}");
        }
    }

    // 0 lost records, 0 objects differing from their record.
    let records = bucket.assert_records_match_objects();
    for (path, bytes) in &fed.unique {
        let r = records
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not recorded (a lost record)"));
        assert_eq!(r["sha256"], sha256(bytes), "{path}");
    }
    let shared = records.get(SHARED).expect("the shared path is recorded");
    assert!(
        fed.shared
            .contains(shared["sha256"].as_str().expect("sha256")),
        "{SHARED} holds bytes no bundle wrote: {shared}"
    );
    assert_eq!(
        records.len(),
        fed.unique.len() + 2,
        "every record is a bundle's output, the shared file or the seed"
    );

    // 0 unmanaged objects touched, and nothing else in the bucket.
    for (path, (bytes, etag)) in &planted {
        assert_eq!(bucket.get(path).as_ref(), Some(bytes), "{path} was changed");
        assert_eq!(
            bucket.etag(path).as_ref(),
            Some(etag),
            "{path} was rewritten"
        );
    }
    let expected: BTreeSet<String> = records
        .keys()
        .chain(planted.keys())
        .cloned()
        .chain([".distributor.json".to_owned()])
        .collect();
    assert_eq!(
        bucket.keys(),
        expected,
        "objects besides outputs, catalog and planted ones"
    );

    let bundles: usize = fed.bundles.values().map(BTreeSet::len).sum();
    let logged =
        |needle: &str| -> usize { hosts.iter().map(|h| h.log().matches(needle).count()).sum() };
    eprintln!(
        "s3 race: {} batch(es) published, {} stepped aside; {round} rounds, {kills} kill -9s ({mid_publication} with the victim's intent pending, {left_in_work} leaving a bundle in work/), {bundles} bundles on 2 hosts, {} records; logged: {} rebased commits, {} lost races for {SHARED} or the catalog (undone, retried), {} transient retries in all, {} recovered intents; {:.1}s racing, {:.1}s in all",
        logged("published a batch of"),
        logged("stepped aside"),
        records.len(),
        logged("applied on top of its catalog"),
        logged(&format!("{SHARED} changed since")) + logged("changed the catalog"),
        logged("; retrying in"),
        logged("that another publisher left behind"),
        racing.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        mid_publication >= 1,
        "no kill landed while the victim's intent was pending: the race did not test a killed publication"
    );
    // Bundles piled up (before the agents started, and while a victim was
    // down): the agents published batches, not only single bundles.
    assert!(
        logged("published a batch of") >= 2,
        "the agents never published a batch:\n{}\n{}",
        hosts[0].log(),
        hosts[1].log()
    );
}

// ---------------------------------------------------------------------------
// One publication killed mid-upload, converged from another host
// ---------------------------------------------------------------------------

#[test]
fn a_run_killed_mid_upload_is_cleaned_up_by_the_next_publication_from_another_host() {
    const BIG: &str = "zz-big.bin";
    let (bucket, tmp) = scene("killed");
    let dir = tmp.path();
    let stage = dir.join("stage");
    let (a, b) = (
        Host::new(dir, "A", &bucket.location, 6),
        Host::new(dir, "B", &bucket.location, 6),
    );
    let path = |p: &Path| p.to_str().expect("utf-8").to_owned();

    let seed = stage.join("seed");
    write_bundle(
        &seed,
        "seed",
        &[("common.txt".to_owned(), b"v0\n".to_vec())],
    );
    a.run(&["run", "--json", "--pipeline", PIPELINE, &path(&seed)])
        .expect(0);
    let planted = bucket.plant("theirs/readme.txt", b"not managed\n");

    // Host A's bundle, written in path order: a replacement of a recorded
    // object, 20 new small objects, then one large enough for a multipart
    // upload (the key is claimed by an empty placeholder first).
    let mut files = vec![("common.txt".to_owned(), b"vA\n".to_vec())];
    for i in 0..20 {
        files.push((format!("x/f{i:02}.txt"), format!("A {i}\n").into_bytes()));
    }
    files.push((BIG.to_owned(), Rng::new(42 | 1).bytes(20 * 1024 * 1024)));
    let bundle_a = stage.join("from-a");
    write_bundle(&bundle_a, "from-a", &files);

    // The kill lands while the large object uploads.
    kill_during_upload(
        a.cmd(&["run", "--json", "--pipeline", PIPELINE, &path(&bundle_a)]),
        &bucket,
        BIG,
    );

    // What the kill left: an intent, a recorded object that no longer
    // matches its record, unrecorded new objects and the placeholder.
    assert_eq!(bucket.pending().len(), 1, "the killed publication's intent");
    assert_eq!(bucket.get("common.txt").as_deref(), Some(&b"vA\n"[..]));
    assert_eq!(
        bucket.recorded()["common.txt"]["sha256"],
        sha256(b"v0\n"),
        "not committed"
    );
    let leftovers: Vec<String> = bucket
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("x/") || k == BIG)
        .collect();
    assert_eq!(leftovers.len(), 21, "{leftovers:?}");

    // Host B publishes right away onto the same paths: refused while the
    // intent is live (transient, retried by its agent), then it recovers the
    // intent once stale, and publishes.
    let bundle_b = stage.join("from-b");
    write_bundle(
        &bundle_b,
        "from-b",
        &[
            ("common.txt".to_owned(), b"vB\n".to_vec()),
            ("x/f00.txt".to_owned(), b"B 0\n".to_vec()),
            ("y/g.txt".to_owned(), b"B g\n".to_vec()),
        ],
    );
    b.feed(&bundle_b);
    let out = b.run(&["agent", "--once"]);
    out.expect(0);
    assert!(
        out.stderr.contains("that another publisher left behind")
            && out.stderr.contains(
                "deleted 21 object(s) it had created, adopted 1 record(s) of objects it had overwritten"
            ),
        "{}",
        out.stderr
    );
    assert_eq!(
        names(&b.spool("done")),
        BTreeSet::from(["from-b".to_owned()])
    );
    let records = bucket.assert_records_match_objects();
    assert_eq!(
        records.keys().collect::<Vec<_>>(),
        ["common.txt", "x/f00.txt", "y/g.txt"]
    );
    assert_eq!(bucket.get("common.txt").as_deref(), Some(&b"vB\n"[..]));
    assert_eq!(
        bucket.keys(),
        [
            ".distributor.json",
            "common.txt",
            "theirs/readme.txt",
            "x/f00.txt",
            "y/g.txt"
        ]
        .map(str::to_owned)
        .into(),
        "the killed publication's other objects and its placeholder are gone"
    );
    assert!(bucket.reserved().is_empty(), "{:?}", bucket.reserved());

    // Host A publishes its bundle again: everything lands.
    a.run(&["run", "--json", "--pipeline", PIPELINE, &path(&bundle_a)])
        .expect(0);
    let records = bucket.assert_records_match_objects();
    assert_eq!(records.len(), 23, "{:?}", records.keys());
    assert_eq!(records[BIG]["size"], 20 * 1024 * 1024);
    assert_eq!(records["y/g.txt"]["source"]["id"], "from-b");
    assert_eq!(bucket.etag("theirs/readme.txt"), Some(planted));
    assert_eq!(
        bucket.get("theirs/readme.txt").as_deref(),
        Some(&b"not managed\n"[..])
    );
    assert!(bucket.reserved().is_empty(), "{:?}", bucket.reserved());
}

/// An agent killed while its bundle uploads, restarted with the default
/// lease (5 minutes): it recovers its own unfinished publication at once
/// (it serves the same spool, so the killed agent is gone) and publishes
/// the bundle it resumes from work/, instead of retrying it against its own
/// leftovers until it lands in failed/.
#[test]
fn an_agent_killed_mid_upload_finishes_its_own_bundle_at_restart_without_waiting_for_the_lease() {
    const BIG: &str = "zz-big.bin";
    let (bucket, tmp) = scene("own");
    let dir = tmp.path();
    let host = Host::new(dir, "A", &bucket.location, 3);
    let default_lease = |args: &[&str]| {
        let mut cmd = host.cmd(args);
        cmd.env_remove("DISTRIBUTOR_S3_LEASE_SECS");
        cmd
    };

    let mut files: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("x/f{i}.txt"), format!("{i}\n").into_bytes()))
        .collect();
    files.push((BIG.to_owned(), Rng::new(7 | 1).bytes(20 * 1024 * 1024)));
    let staged = dir.join("stage/rep");
    write_bundle(&staged, "rep", &files);
    host.feed(&staged);
    kill_during_upload(default_lease(&["agent"]), &bucket, BIG);
    assert_eq!(bucket.pending().len(), 1, "the killed publication's intent");
    assert_eq!(
        names(&host.spool("work")),
        BTreeSet::from(["rep".to_owned()])
    );

    let out = default_lease(&["agent", "--once"])
        .output()
        .expect("run agent --once");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert_eq!(
        names(&host.spool("done")),
        BTreeSet::from(["rep".to_owned()]),
        "{log}"
    );
    assert!(names(&host.spool("failed")).is_empty(), "{log}");
    assert!(bucket.pending().is_empty(), "{:?}", bucket.pending());
    let records = bucket.assert_records_match_objects();
    assert_eq!(records.len(), 6, "{:?}", records.keys());
    assert_eq!(records[BIG]["size"], 20 * 1024 * 1024);
}

/// The first publication into an empty root is killed mid-upload: its
/// objects are a publication's, not unmanaged ones, so another host
/// publishing other paths there meanwhile is not refused, and once the
/// killed publication's lease is over nothing of it is left.
#[test]
fn a_killed_first_publication_does_not_make_the_root_look_unmanaged() {
    const BIG: &str = "zz-big.bin";
    let (bucket, tmp) = scene("first");
    let dir = tmp.path();
    let (a, b) = (
        Host::new(dir, "A", &bucket.location, 3),
        Host::new(dir, "B", &bucket.location, 3),
    );
    let path = |p: &Path| p.to_str().expect("utf-8").to_owned();
    let bundle_a = dir.join("stage/from-a");
    write_bundle(
        &bundle_a,
        "from-a",
        &[
            ("a/one.txt".to_owned(), b"1\n".to_vec()),
            (BIG.to_owned(), Rng::new(3 | 1).bytes(20 * 1024 * 1024)),
        ],
    );
    kill_during_upload(
        a.cmd(&["run", "--json", "--pipeline", PIPELINE, &path(&bundle_a)]),
        &bucket,
        BIG,
    );
    assert!(bucket.get(".distributor.json").is_none(), "no catalog yet");

    let bundle_b = dir.join("stage/from-b");
    write_bundle(
        &bundle_b,
        "from-b",
        &[("b.txt".to_owned(), b"B\n".to_vec())],
    );
    let mut refusals = 0;
    let published = wait_for(EVENT_WAIT, || {
        let out = b.run(&["run", "--json", "--pipeline", PIPELINE, &path(&bundle_b)]);
        assert_ne!(out.code, 3, "refused as unmanaged:\n{}", out.stdout);
        refusals += usize::from(out.code != 0);
        out.code == 0
    });
    assert!(published, "host B never published:\n{}", b.log());
    // Once the killed publication's lease is over, the next publication
    // (here the same bundle again: skip_same) recovers it.
    let recovered = wait_for(EVENT_WAIT, || {
        b.run(&["run", "--json", "--pipeline", PIPELINE, &path(&bundle_b)])
            .expect(0);
        bucket.pending().is_empty()
    });
    assert!(recovered, "the killed publication was never recovered");
    let records = bucket.assert_records_match_objects();
    assert_eq!(records.keys().collect::<Vec<_>>(), ["b.txt"]);
    assert_eq!(
        bucket.keys(),
        [".distributor.json", "b.txt"].map(str::to_owned).into(),
        "the killed publication's objects are gone ({refusals} transient refusal(s) first)"
    );
}

/// Spawns `cmd` and kills it (`kill -9`) while it uploads `key` in parts:
/// once the key's empty placeholder, which claims it before any part is
/// sent, is in the bucket.
fn kill_during_upload(mut cmd: Command, bucket: &Bucket, key: &str) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn distributor");
    let in_flight = wait_for(EVENT_WAIT, || {
        bucket
            .root
            .head(key)
            .expect("HEAD")
            .is_some_and(|h| h.size == 0 && h.intent.is_some())
            || child.try_wait().expect("wait").is_some()
    });
    assert!(in_flight, "the upload of {key} never started");
    assert!(
        child.try_wait().expect("wait").is_none(),
        "it finished before the upload could be interrupted"
    );
    Agent {
        child,
        reader: None,
    }
    .kill9();
}

/// The bundles (`h<host>-b<n>`) whose outputs the intents process
/// `pid` wrote are publishing: empty when it has no intent pending.
fn publishing(bucket: &Bucket, pid: u32) -> BTreeSet<String> {
    let owner = format!(" pid {pid}");
    let mut out = BTreeSet::new();
    for id in bucket.pending() {
        let Ok(Some((intent, _, _))) = bucket.root.read_intent(&id) else {
            continue;
        };
        if intent.owner.ends_with(&owner) {
            out.extend(intent.writes.iter().filter_map(|w| bundle_of(&w.path)));
        }
    }
    out
}

/// A publication whose catalog compare-and-swap loses to another host is
/// applied again on top of the winner's catalog when the winner changed
/// none of the records it relies on, and undone and tried again when it
/// did (a replacement relies on every record of its destination); the
/// agent counts each in `distributor_catalog_rebases_total` and
/// `distributor_catalog_conflicts_total` (docs/object-storage.md, "Several
/// hosts"). The agent is held between its uploads and its swap by a
/// failpoint that stops it (SIGSTOP) while the other host commits, then
/// let go (SIGCONT): no timing is guessed.
#[test]
fn a_lost_catalog_swap_is_counted_as_a_rebase_or_a_conflict() {
    let (bucket, tmp) = scene("cas");
    let dir = tmp.path();
    let a = Host::new(dir, "A", &bucket.location, 5);
    let b = Host::new(dir, "B", &bucket.location, 5);
    let publish_b = |id: &str, path: &str| {
        let staged = dir.join("stage").join(id);
        write_bundle(&staged, id, &[(path.to_owned(), id.as_bytes().to_vec())]);
        let bundle = staged.to_str().expect("utf-8 path");
        let mut cmd = b.cmd(&["run", "--pipeline", PIPELINE, bundle]);
        let out = cmd
            .env_remove("DISTRIBUTOR_S3_LEASE_SECS")
            .env("RUST_LOG", "info,distributor::s3=debug")
            .output()
            .expect("run");
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{log}");
        eprintln!("host B published {id}:\n{log}");
    };
    publish_b("b0", "b0.html");

    for (workflow, counter) in [
        ("additive", "distributor_catalog_rebases_total"),
        ("replacement", "distributor_catalog_conflicts_total"),
    ] {
        let config = dir.join("config-A.yaml");
        let text = fs::read_to_string(&config).expect("config");
        let text = text
            .replace("agent:\n", "agent:\n  metrics_file: ./metrics-A.prom\n")
            .replace("workflow: additive", &format!("workflow: {workflow}"));
        write_file(&config, text.as_bytes());
        let mut cmd = a.cmd(&["agent"]);
        cmd.env_remove("DISTRIBUTOR_S3_LEASE_SECS")
            .env("RUST_LOG", "info,distributor::s3=debug")
            .env("DISTRIBUTOR_FAILPOINT", "s3.after_upload:1:stop")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn the agent");
        let reader = collect(child.stderr.take().expect("stderr"), a.log.clone());
        let pid = child.id();
        let id = format!("a-{workflow}");
        let staged = dir.join("stage").join(&id);
        write_bundle(
            &staged,
            &id,
            &[(format!("{id}.html"), id.clone().into_bytes())],
        );
        a.feed(&staged);
        // Held after its uploads, before its compare-and-swap.
        assert!(
            wait_for(EVENT_WAIT, || stopped(pid)),
            "the agent never reached the failpoint:\n{}",
            a.log()
        );
        publish_b(&format!("b-{workflow}"), &format!("b-{workflow}.html"));
        // SAFETY: plain kill(2) of the child this test spawned.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        assert!(
            wait_for(EVENT_WAIT, || a.spool("done").join(&id).exists()),
            "{id} was not published:\n{}",
            a.log()
        );
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        child.wait().expect("reap the agent");
        reader.join().expect("log reader");
        let metrics = fs::read_to_string(dir.join("metrics-A.prom")).expect("metrics file");
        let line = format!("{counter}{{pipeline=\"{PIPELINE}\",destination=\"web\"}} 1");
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}\n{}",
            a.log()
        );
        let other = if workflow == "additive" {
            "distributor_catalog_conflicts_total"
        } else {
            "distributor_catalog_rebases_total"
        };
        let zero = format!("{other}{{pipeline=\"{PIPELINE}\",destination=\"web\"}} 0");
        assert!(
            metrics.lines().any(|l| l == zero),
            "{zero} not in\n{metrics}"
        );
        if workflow == "additive" {
            // Both commits kept: the rebased one did not drop the winner's.
            let records = bucket.assert_records_match_objects();
            for path in ["b-additive.html", "a-additive.html"] {
                assert!(records.contains_key(path), "{path} lost: {records:?}");
            }
        }
        let config = fs::read_to_string(dir.join("config-A.yaml")).expect("config");
        let config = config
            .replace("  metrics_file: ./metrics-A.prom\n", "")
            .replace(&format!("workflow: {workflow}"), "workflow: additive");
        write_file(&dir.join("config-A.yaml"), config.as_bytes());
    }
    // Nothing lost: every bundle's record is there (the replacement
    // dropped B's earlier records of the destination, as it should).
    let records = bucket.assert_records_match_objects();
    assert!(records.contains_key("a-replacement.html"), "{records:?}");
    assert!(bucket.pending().is_empty(), "{:?}", bucket.pending());
}
