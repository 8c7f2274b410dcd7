//! Delivery with ordinary tools (docs/contract.md §13): producers copy bundles into a
//! live agent's inbox with `rsync`, `cp -r`, `tar -x`, `scp -r`, a writer
//! that puts the manifest first, and `mv`, and every delivery ends in
//! `done/` with the published bytes equal to the sources, never in
//! `failed/`. Where a tool can expose a premature claim (the manifest lands
//! before the data), the test holds the tool still until the agent has
//! demonstrably seen the bundle incomplete, so the outcome does not depend
//! on timing. Also: the `incomplete_timeout`, `agent --once` with
//! incomplete bundles, and the inbox states `spool list --inbox` reports.
//!
//! These tests run the real tools; `rsync` and `scp` must be installed
//! (`.ci/run` installs them), and their absence fails the tests, naming the
//! fix.

use crate::util::{
    Proc, Test, assert_catalog_matches_disk, names, read_json, wait_for, write_file,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a delivery may take to reach `done/` (64 MiB in a debug build,
/// hashed by the producer side, the agent and the check).
const DELIVERY_WAIT: Duration = Duration::from_secs(120);
/// How long the agent gets to notice something in its inbox.
const NOTICE_WAIT: Duration = Duration::from_secs(30);
const RESULT: &str = ".distributor-result.json";
const MIB: usize = 1 << 20;

/// One pipeline `p` publishing to `./www` under `{source_id}/`; the agent
/// settles for 300 ms, rescans every 200 ms and fails a bundle that stays
/// incomplete without change for `incomplete_timeout`.
fn config(incomplete_timeout: &str) -> String {
    format!(
        "spool: ./spool
agent:
  settle: 300ms
  rescan_interval: 200ms
  incomplete_timeout: {incomplete_timeout}
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        prefix: \"{{source_id}}/\"
"
    )
}

/// A test folder with the config written: `incomplete_timeout` long enough
/// that no delivery here times out.
fn setup() -> Test {
    let t = Test::new();
    t.config(&config("10m"));
    t
}

fn spool(t: &Test, folder: &str) -> PathBuf {
    t.join(&format!("spool/p/{folder}"))
}

/// `n` bytes that do not compress or repeat.
fn random_bytes(n: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(n);
    fs::File::open("/dev/urandom")
        .expect("open /dev/urandom")
        .take(n as u64)
        .read_to_end(&mut bytes)
        .expect("read /dev/urandom");
    assert_eq!(bytes.len(), n);
    bytes
}

/// Writes `src/<name>` with `files` and seals it with id `name` (the files
/// are sealed where they are; the manifest is written last).
fn source(t: &Test, name: &str, files: &[(String, Vec<u8>)]) -> PathBuf {
    let dir = t.join(&format!("src/{name}"));
    for (path, bytes) in files {
        write_file(&dir.join(path), bytes);
    }
    t.seal(&dir, name, Some(crate::util::CREATED))
        .expect_code(0);
    dir
}

/// A bundle whose data file sorts after `manifest.json`, so name-ordered
/// tools (rsync, `tar --sort=name`) write the manifest first.
fn manifest_first_bundle(t: &Test, name: &str, data_bytes: usize) -> PathBuf {
    source(
        t,
        name,
        &[
            ("a.txt".to_owned(), b"first\n".to_vec()),
            ("zdata.bin".to_owned(), random_bytes(data_bytes)),
        ],
    )
}

/// The paths a sealed bundle lists.
fn listed_paths(bundle: &Path) -> Vec<String> {
    read_json(&bundle.join("manifest.json"))["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().expect("path").to_owned())
        .collect()
}

/// `name` is in `done/` and nowhere else in the spool, its result says ok,
/// nothing was ever filed under `failed/`, every listed file of `src` is
/// published under `www/<name>/` with the same bytes, and the catalog
/// matches the disk. Returns how long it waited for `done/`.
#[track_caller]
fn assert_delivered(t: &Test, agent: &Agent, name: &str, src: &Path) -> Duration {
    let done = spool(t, "done").join(name);
    let start = Instant::now();
    assert!(
        wait_for(DELIVERY_WAIT, || done.join(RESULT).exists()
            || !names(&spool(t, "failed")).is_empty()),
        "{name} did not reach done/ within {DELIVERY_WAIT:?}; inbox {:?} work {:?}\n{}",
        names(&spool(t, "inbox")),
        names(&spool(t, "work")),
        agent.log()
    );
    let waited = start.elapsed();
    assert_eq!(
        names(&spool(t, "failed")),
        BTreeSet::new(),
        "a delivery by an ordinary tool ended in failed/ (claimed before it was complete?):\n{}",
        agent.log()
    );
    assert_eq!(read_json(&done.join(RESULT))["ok"], true, "{}", agent.log());
    assert_eq!(names(&spool(t, "done")), BTreeSet::from([name.to_owned()]));
    assert!(names(&spool(t, "inbox")).is_empty());
    assert!(names(&spool(t, "work")).is_empty());
    let www = t.join("www");
    let listed = listed_paths(src);
    for path in &listed {
        let published = www.join(name).join(path);
        let same = fs::read(&published)
            .unwrap_or_else(|e| panic!("{} is not published: {e}", published.display()))
            == fs::read(src.join(path)).expect("read source");
        assert!(same, "{path}: the published bytes differ from the source");
    }
    let recorded = crate::util::records(&crate::util::read_state(&www));
    assert_eq!(
        recorded.keys().cloned().collect::<BTreeSet<_>>(),
        listed.iter().map(|p| format!("{name}/{p}")).collect(),
        "the catalog records exactly the listed files"
    );
    assert_catalog_matches_disk(&www);
    waited
}

/// The rows of `spool list --inbox --json`.
fn inbox_rows(t: &Test) -> Vec<Value> {
    let out = t.run(&["spool", "list", "--inbox", "--json"]);
    out.expect_code(0);
    out.json().as_array().expect("rows").clone()
}

/// `(state, reason)` of inbox entry `name`, if listed.
fn inbox_state(t: &Test, name: &str) -> Option<(String, String)> {
    inbox_rows(t)
        .into_iter()
        .find(|r| r["name"] == name)
        .map(|r| {
            (
                r["state"].as_str().expect("state").to_owned(),
                r["reason"].as_str().expect("reason").to_owned(),
            )
        })
}

/// Waits until `spool list --inbox` shows `name` in state `state` with a
/// reason for which `reason_ok` holds; returns the reason.
#[track_caller]
fn wait_inbox_state(t: &Test, name: &str, state: &str, reason_ok: impl Fn(&str) -> bool) -> String {
    let mut last = None;
    let ok = wait_for(NOTICE_WAIT, || {
        last = inbox_state(t, name);
        last.as_ref()
            .is_some_and(|(s, r)| s == state && reason_ok(r))
    });
    assert!(
        ok,
        "{name} was not listed as {state} with the expected reason; last seen {last:?}"
    );
    last.expect("seen").1
}

/// A live `distributor agent`, its log collected as it runs; killed on drop
/// so a failed test leaves no agent behind.
struct Agent(Proc);

impl Agent {
    /// Starts the agent on the test's config and waits until it serves:
    /// it handles its signals and its inbox exists.
    fn start(t: &Test) -> Agent {
        let mut agent = Agent(t.agent());
        let inbox = spool(t, "inbox");
        let up = wait_for(NOTICE_WAIT, || inbox.is_dir() || !agent.0.running());
        assert!(
            up && agent.0.running(),
            "the agent did not come up:\n{}",
            agent.log()
        );
        agent
    }

    fn log(&self) -> String {
        self.0.stderr()
    }

    /// The agent's log line saying that `name` waits because it is
    /// incomplete: it has a manifest (perhaps still being written), but
    /// listed files are missing or short. The agent logs this once, for
    /// whatever it saw first.
    fn incomplete_line(&self, name: &str) -> Option<String> {
        let head = format!("bundle={name} waits: ");
        self.log()
            .lines()
            .find(|l| l.contains(&head) && !l.contains("no manifest.json yet"))
            .map(str::to_owned)
    }

    /// Waits until the agent has logged that `name` is incomplete.
    #[track_caller]
    fn wait_incomplete(&self, name: &str) -> String {
        assert!(
            wait_for(NOTICE_WAIT, || self.incomplete_line(name).is_some()),
            "the agent did not log {name} as incomplete within {NOTICE_WAIT:?}:\n{}",
            self.log()
        );
        self.incomplete_line(name).expect("seen")
    }

    /// SIGTERM, then a clean exit 0; returns the whole log.
    #[track_caller]
    fn stop(mut self) -> String {
        self.0.signal(libc::SIGTERM);
        let out = self.0.finish(Duration::from_secs(30));
        assert_eq!(out.code, 0, "agent exit:\n{}", out.stderr);
        out.stderr
    }
}

/// Fails the test, naming the fix, when rsync is not installed.
fn require_rsync() {
    let found = Command::new("rsync")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "rsync is not installed, and the delivery tests run the real tool: install it \
         (scripts/install-test-deps installs it)"
    );
}

/// A producer's tool, run in the test folder in its own process group (so
/// it can be paused and interrupted as a whole).
fn tool(t: &Test, program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(t.path()).args(args).process_group(0);
    cmd
}

/// Runs a tool to completion and expects exit 0.
#[track_caller]
fn run_tool(t: &Test, program: &str, args: &[&str]) {
    let out = tool(t, program, args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends `sig` to every process of the group led by `child`.
fn signal_group(child: &Child, sig: libc::c_int) {
    crate::util::signal_group(child.id(), sig);
}

/// Waits for a spawned tool (failing the test after `DELIVERY_WAIT`).
#[track_caller]
fn wait_tool(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let mut status = None;
    crate::util::wait_for(DELIVERY_WAIT, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status.unwrap_or_else(|| {
        signal_group(child, libc::SIGKILL);
        let _ = child.wait();
        panic!("{what} did not finish within {DELIVERY_WAIT:?}");
    })
}

/// True once the copy at `dst` holds the whole `manifest.json` of `src` (a
/// tool writing it in place may show it half written first).
fn has_whole_manifest(src: &Path, dst: &Path) -> bool {
    let want = fs::metadata(src.join("manifest.json")).unwrap().len();
    fs::metadata(dst.join("manifest.json")).is_ok_and(|m| m.len() == want)
}

// ---------------------------------------------------------------------------
// rsync
// ---------------------------------------------------------------------------

/// `rsync -a src/b inbox/` with `extra` flags, a 64 MiB data file that
/// rsync writes after the manifest.
fn rsync_large(extra: &[&str], name: &str) {
    require_rsync();
    let t = setup();
    let agent = Agent::start(&t);
    let src = manifest_first_bundle(&t, name, 64 * MIB);
    let mut args = vec!["-a"];
    args.extend_from_slice(extra);
    let from = format!("src/{name}");
    args.extend([from.as_str(), "spool/p/inbox/"]);
    let start = Instant::now();
    run_tool(&t, "rsync", &args);
    let copied = start.elapsed();
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!(
        "rsync {extra:?}: copied in {copied:?}, in done/ {:?} later; the agent saw it incomplete: {}",
        waited,
        agent.incomplete_line(name).is_some()
    );
    agent.stop();
}

#[test]
fn rsync_a_of_a_large_bundle_into_a_live_inbox_ends_in_done() {
    rsync_large(&[], "rsync-plain");
}

#[test]
fn rsync_a_partial_of_a_large_bundle_into_a_live_inbox_ends_in_done() {
    rsync_large(&["--partial"], "rsync-partial");
}

#[test]
fn rsync_with_bwlimit_writes_the_manifest_first_and_the_agent_waits_for_the_data() {
    require_rsync();
    let t = setup();
    let agent = Agent::start(&t);
    let name = "rsync-slow";
    let src = manifest_first_bundle(&t, name, 8 * MIB);
    let dst = spool(&t, "inbox").join(name);
    // 8 MiB at 1 MiB/s: rsync needs about eight seconds for the data file.
    let mut rsync = tool(
        &t,
        "rsync",
        &[
            "-a",
            "--bwlimit=1024",
            &format!("src/{name}"),
            "spool/p/inbox/",
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .expect("spawn rsync");
    // Hold rsync still the moment the manifest is in place, until the agent
    // has seen the bundle incomplete: a premature claim cannot hide.
    assert!(
        wait_for(DELIVERY_WAIT, || has_whole_manifest(&src, &dst)),
        "rsync did not write {name}/manifest.json"
    );
    signal_group(&rsync, libc::SIGSTOP);
    let line = agent.wait_incomplete(name);
    assert!(line.contains("zdata.bin"), "{line}");
    let (state, reason) = inbox_state(&t, name).expect("listed");
    assert_eq!(state, "incomplete", "{reason}");
    assert!(reason.contains("zdata.bin"), "{reason}");
    signal_group(&rsync, libc::SIGCONT);
    let status = wait_tool(&mut rsync, "rsync --bwlimit");
    assert!(status.success(), "rsync: {status}");
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!("{name}: in done/ {waited:?} after the tool finished");
    agent.stop();
}

#[test]
fn rsync_partial_interrupted_leaves_a_short_file_that_waits_and_a_rerun_completes_it() {
    require_rsync();
    let t = setup();
    let agent = Agent::start(&t);
    let name = "rsync-resumed";
    let src = manifest_first_bundle(&t, name, 8 * MIB);
    let dst = spool(&t, "inbox").join(name);
    let declared = 8 * MIB as u64;
    let mut rsync = tool(
        &t,
        "rsync",
        &[
            "-a",
            "--partial",
            "--bwlimit=1024",
            &format!("src/{name}"),
            "spool/p/inbox/",
        ],
    )
    .stdin(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn rsync");
    // Interrupt it (as Ctrl-C would) once part of the data file is written
    // to rsync's temporary file.
    let temp_started = || {
        names(&dst).iter().any(|n| {
            n.starts_with(".zdata.bin.")
                && fs::metadata(dst.join(n)).is_ok_and(|m| m.len() > 0 && m.len() < declared)
        })
    };
    assert!(
        wait_for(DELIVERY_WAIT, || has_whole_manifest(&src, &dst)
            && temp_started()),
        "rsync did not start writing zdata.bin: {:?}",
        names(&dst)
    );
    signal_group(&rsync, libc::SIGINT);
    let status = wait_tool(&mut rsync, "rsync --partial (interrupted)");
    assert!(!status.success(), "rsync was interrupted: {status}");
    // --partial keeps what it had under the final name: a short zdata.bin
    // (renamed into place by rsync's receiver, which may outlive the
    // process that was waited for).
    assert!(
        wait_for(NOTICE_WAIT, || dst.join("zdata.bin").exists()),
        "rsync --partial did not keep the partial zdata.bin: {:?}",
        names(&dst)
    );
    let kept = fs::metadata(dst.join("zdata.bin"))
        .expect("rsync --partial keeps the partial zdata.bin")
        .len();
    assert!(kept < declared, "{kept} bytes");
    let reason = wait_inbox_state(&t, name, "incomplete", |r| {
        r.contains(&format!("zdata.bin ({kept} of {declared} bytes)"))
    });
    agent.wait_incomplete(name);
    assert!(reason.contains("not of the declared size"), "{reason}");
    assert!(dst.is_dir(), "the short bundle stays in the inbox");

    run_tool(
        &t,
        "rsync",
        &["-a", "--partial", &format!("src/{name}"), "spool/p/inbox/"],
    );
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!("{name}: in done/ {waited:?} after the tool finished");
    agent.stop();
}

// ---------------------------------------------------------------------------
// cp -r, tar -x, a manifest-first writer, mv
// ---------------------------------------------------------------------------

#[test]
fn cp_r_of_a_large_bundle_straight_into_a_live_inbox_ends_in_done() {
    let t = setup();
    let agent = Agent::start(&t);
    let name = "copied";
    let mut files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| {
            (
                format!("part-{:02}/file-{i:03}.txt", i % 10),
                format!("file {i}\n").repeat(i + 1).into_bytes(),
            )
        })
        .collect();
    files.push(("big.bin".to_owned(), random_bytes(64 * MIB)));
    let src = source(&t, name, &files);
    let start = Instant::now();
    run_tool(&t, "cp", &["-r", &format!("src/{name}"), "spool/p/inbox/"]);
    let copied = start.elapsed();
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!(
        "cp -r of 201 files (64 MiB): copied in {copied:?}, in done/ {:?} later; the agent saw it incomplete: {}",
        waited,
        agent.incomplete_line(name).is_some()
    );
    agent.stop();
}

#[test]
fn cp_r_of_many_bundles_at_once_is_noticed_without_waiting_for_a_rescan() {
    // cp creates each folder and fills it at once, before the watcher has
    // started watching the new folder, so the manifest may come without a
    // file event; the rescan is a minute away, and the agent must not need
    // it.
    let t = Test::new();
    t.config(&config("10m").replace("rescan_interval: 200ms", "rescan_interval: 60s"));
    let agent = Agent::start(&t);
    let names_in: Vec<String> = (0..40).map(|i| format!("burst-{i:02}")).collect();
    let mut args = vec!["-r".to_owned()];
    for name in &names_in {
        source(&t, name, &[("f.txt".to_owned(), name.as_bytes().to_vec())]);
        args.push(format!("src/{name}"));
    }
    args.push("spool/p/inbox/".to_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_tool(&t, "cp", &args);
    let done = spool(&t, "done");
    // Far less than the rescan interval: each bundle is looked at within a
    // second of its last change, events or not.
    let all = wait_for(Duration::from_secs(40), || {
        names_in.iter().all(|n| done.join(n).join(RESULT).exists())
    });
    assert!(
        all,
        "not every bundle reached done/ before the next rescan; still in the inbox: {:?}\n{}",
        names(&spool(&t, "inbox")),
        agent.log()
    );
    assert!(names(&spool(&t, "failed")).is_empty(), "{}", agent.log());
    for name in &names_in {
        assert_eq!(
            fs::read(t.join("www").join(name).join("f.txt")).unwrap(),
            name.as_bytes()
        );
    }
    assert_catalog_matches_disk(&t.join("www"));
    agent.stop();
}

#[test]
fn tar_x_into_a_live_inbox_ends_in_done_even_when_the_archive_pauses_after_the_manifest() {
    let t = setup();
    let agent = Agent::start(&t);
    let name = "untarred";
    let src = manifest_first_bundle(&t, name, 8 * MIB);
    let dst = spool(&t, "inbox").join(name);
    // The archive in name order, so manifest.json comes before zdata.bin.
    run_tool(
        &t,
        "tar",
        &["-cf", "bundle.tar", "--sort=name", "-C", "src", name],
    );
    let archive = fs::read(t.join("bundle.tar")).unwrap();
    let mut tar = tool(&t, "tar", &["-xf", "-", "-C", "spool/p/inbox"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn tar");
    let mut stdin = tar.stdin.take().expect("piped stdin");
    // Feed half the archive (the manifest and part of the data), then hold
    // back the rest until the agent has seen the bundle incomplete.
    let half = archive.len() / 2;
    stdin.write_all(&archive[..half]).unwrap();
    stdin.flush().unwrap();
    assert!(
        wait_for(DELIVERY_WAIT, || has_whole_manifest(&src, &dst)),
        "tar did not extract manifest.json"
    );
    // tar writes the manifest in place, so the agent may first have seen
    // it half written; what it waits for now is the data.
    agent.wait_incomplete(name);
    let (state, reason) = inbox_state(&t, name).expect("listed");
    assert_eq!(state, "incomplete", "{reason}");
    assert!(reason.contains("zdata.bin ("), "{reason}");
    stdin.write_all(&archive[half..]).unwrap();
    drop(stdin);
    let status = wait_tool(&mut tar, "tar -x");
    assert!(status.success(), "tar: {status}");
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!("{name}: in done/ {waited:?} after the tool finished");
    agent.stop();
}

#[test]
fn a_writer_that_puts_the_manifest_first_and_pauses_between_files_ends_in_done() {
    let t = setup();
    let agent = Agent::start(&t);
    let name = "manifest-first";
    let files = vec![
        ("one.txt".to_owned(), b"one\n".to_vec()),
        ("sub/two.csv".to_owned(), b"a,b\n1,2\n".to_vec()),
        ("three.bin".to_owned(), random_bytes(MIB)),
    ];
    let src = source(&t, name, &files);
    let dst = spool(&t, "inbox").join(name);
    fs::create_dir(&dst).unwrap();
    fs::write(
        dst.join("manifest.json"),
        fs::read(src.join("manifest.json")).unwrap(),
    )
    .unwrap();
    agent.wait_incomplete(name);
    let (state, reason) = inbox_state(&t, name).expect("listed");
    assert_eq!(state, "incomplete", "{reason}");
    assert!(reason.contains("3 of 3 listed files missing"), "{reason}");
    for (i, (path, bytes)) in files.iter().enumerate() {
        if i + 1 == files.len() {
            // The last file in two halves, with a pause between them.
            let (a, _) = bytes.split_at(bytes.len() / 2);
            write_file(&dst.join(path), a);
            let short = format!("{path} ({} of {} bytes)", a.len(), bytes.len());
            wait_inbox_state(&t, name, "incomplete", |r| r.contains(&short));
            assert!(dst.is_dir());
            fs::OpenOptions::new()
                .append(true)
                .open(dst.join(path))
                .unwrap()
                .write_all(&bytes[a.len()..])
                .unwrap();
            break;
        }
        write_file(&dst.join(path), bytes);
        // Pause until the inbox shows this file arrived and the bundle
        // still waits for the others.
        wait_inbox_state(&t, name, "incomplete", |r| !r.contains(path.as_str()));
        assert!(
            dst.is_dir(),
            "claimed while {path} was the last file written"
        );
    }
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!("{name}: in done/ {waited:?} after the tool finished");
    agent.stop();
}

/// Fails the test, naming the fix, when scp is not installed.
fn require_scp() {
    // scp has no --version; `scp` alone prints its usage and exits 1.
    let found = Command::new("scp")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "scp is not installed, and the delivery tests run the real tool: install it \
         (scripts/install-test-deps installs it)"
    );
}

#[test]
fn scp_r_into_a_live_inbox_ends_in_done() {
    require_scp();
    let t = setup();
    let agent = Agent::start(&t);
    let name = "scp-copied";
    let mut files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("page-{i:02}.txt"),
                format!("page {i}\n").into_bytes(),
            )
        })
        .collect();
    files.push(("zdata.bin".to_owned(), random_bytes(8 * MIB)));
    let src = source(&t, name, &files);
    let dst = spool(&t, "inbox").join(name);
    // The remote side of scp without an SSH server: `-S` names the program
    // scp runs instead of ssh, and this one runs the remote command (the
    // `scp -t` sink, as sshd would) locally. The legacy protocol (-O) needs
    // no sftp-server; the sink writes each file in place, in the order the
    // sender lists them.
    crate::util::write_script(
        &t.join("fake-ssh"),
        "#!/bin/sh\n\
         while [ $# -gt 0 ]; do case \"$1\" in --) shift; break;; -*) shift;; *) break;; esac; done\n\
         shift\n\
         exec sh -c \"$*\"\n",
    );
    let to = format!("localhost:{}/", spool(&t, "inbox").display());
    // -l: 16384 kbit/s, so the data file takes about four seconds.
    let mut scp = tool(
        &t,
        "scp",
        &[
            "-O",
            "-S",
            "./fake-ssh",
            "-l",
            "16384",
            "-r",
            &format!("src/{name}"),
            &to,
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .expect("spawn scp");
    // scp sends the files in the order the source folder lists them. When
    // the manifest comes before the data, hold scp still until the agent
    // has seen the bundle incomplete.
    let data_whole =
        || fs::metadata(dst.join("zdata.bin")).is_ok_and(|m| m.len() == 8 * MIB as u64);
    let arrived = wait_for(DELIVERY_WAIT, || {
        has_whole_manifest(&src, &dst) || scp.try_wait().ok().flatten().is_some()
    });
    assert!(arrived, "scp did not write {name}/manifest.json");
    let mut manifest_first = false;
    if scp.try_wait().expect("try_wait").is_none() && !data_whole() {
        signal_group(&scp, libc::SIGSTOP);
        if !data_whole() {
            manifest_first = true;
            agent.wait_incomplete(name);
        }
        signal_group(&scp, libc::SIGCONT);
    }
    let status = wait_tool(&mut scp, "scp -r");
    assert!(status.success(), "scp: {status}");
    let waited = assert_delivered(&t, &agent, name, &src);
    eprintln!(
        "scp -r: the manifest came before the data: {manifest_first}; in done/ {waited:?} after scp finished"
    );
    agent.stop();
}

#[test]
fn mv_of_a_sealed_folder_from_a_staging_place_on_the_same_file_system_ends_in_done() {
    let t = setup();
    let agent = Agent::start(&t);
    let name = "moved";
    source(
        &t,
        name,
        &[
            ("index.txt".to_owned(), b"moved in\n".to_vec()),
            ("data/z.bin".to_owned(), random_bytes(4 * MIB)),
        ],
    );
    // A copy to compare with: mv takes the source away.
    run_tool(&t, "cp", &["-r", &format!("src/{name}"), "expected"]);
    run_tool(&t, "mv", &[&format!("src/{name}"), "spool/p/inbox/"]);
    assert_delivered(&t, &agent, name, &t.join("expected"));
    assert!(
        agent.incomplete_line(name).is_none(),
        "a renamed sealed folder is never seen incomplete:\n{}",
        agent.log()
    );
    agent.stop();
}

// ---------------------------------------------------------------------------
// Incomplete bundles: the timeout, agent --once, and the inbox states
// ---------------------------------------------------------------------------

/// A bundle in the inbox whose manifest lists `a.txt` (missing) and
/// `z.bin` (4 of its 10 bytes written), and `ok.txt` (whole).
fn incomplete_in_inbox(t: &Test, name: &str) -> PathBuf {
    let src = source(
        t,
        name,
        &[
            ("a.txt".to_owned(), b"a\n".to_vec()),
            ("ok.txt".to_owned(), b"ok\n".to_vec()),
            ("z.bin".to_owned(), vec![7u8; 10]),
        ],
    );
    let dst = spool(t, "inbox").join(name);
    fs::create_dir_all(&dst).unwrap();
    write_file(&dst.join("ok.txt"), b"ok\n");
    write_file(&dst.join("z.bin"), &[7u8; 4]);
    // The manifest last and whole (written aside, renamed into place).
    fs::copy(src.join("manifest.json"), dst.join(".manifest.tmp")).unwrap();
    fs::rename(dst.join(".manifest.tmp"), dst.join("manifest.json")).unwrap();
    dst
}

#[test]
fn a_bundle_left_incomplete_fails_at_verify_after_incomplete_timeout_naming_what_is_missing() {
    let t = Test::new();
    t.config(&config("2s"));
    let agent = Agent::start(&t);
    let name = "abandoned";
    incomplete_in_inbox(&t, name);
    let line = agent.wait_incomplete(name);
    assert!(
        line.contains("a.txt") && line.contains("z.bin (4 of 10 bytes)"),
        "{line}"
    );
    let failed = spool(&t, "failed").join(name);
    assert!(
        wait_for(NOTICE_WAIT, || failed.join(RESULT).exists()),
        "{name} was not failed after incomplete_timeout (2s) without change:\n{}",
        agent.log()
    );
    let result = read_json(&failed.join(RESULT));
    assert_eq!(result["ok"], false, "{result}");
    assert_eq!(result["stage"], "verify", "{result}");
    let error = result["error"].as_str().unwrap_or_default().to_owned() + &result.to_string();
    assert!(
        error.contains("a.txt"),
        "the missing file is named: {result}"
    );
    assert!(error.contains("z.bin"), "the short file is named: {result}");
    assert!(
        !error.contains("ok.txt"),
        "the whole file is not blamed: {result}"
    );
    assert!(names(&spool(&t, "inbox")).is_empty());
    assert!(
        !t.join(&format!("www/{name}")).exists(),
        "nothing is published"
    );
    // The log says why an incomplete bundle was claimed after all (the
    // verify error alone reads like a file changed after sealing).
    let log = agent.stop();
    let gave_up = log
        .lines()
        .find(|l| l.contains(&format!("bundle={name}")) && l.contains("still incomplete after 2s"))
        .unwrap_or_else(|| panic!("no line says the agent gave up waiting:\n{log}"));
    assert!(
        gave_up.contains("a.txt") && gave_up.contains("z.bin (4 of 10 bytes)"),
        "{gave_up}"
    );
}

#[test]
fn agent_once_publishes_complete_bundles_leaves_incomplete_ones_names_them_and_exits_1() {
    let t = setup();
    source(&t, "whole", &[("w.txt".to_owned(), b"whole\n".to_vec())]);
    run_tool(&t, "mkdir", &["-p", "spool/p/inbox"]);
    run_tool(&t, "mv", &["src/whole", "spool/p/inbox/"]);
    let half = incomplete_in_inbox(&t, "half");
    write_file(&spool(&t, "inbox").join("no-manifest/x.txt"), b"x\n");
    let half_before = crate::util::tree(&half);

    let out = t
        .cmd()
        .env("RUST_LOG", "info")
        .args(["--config", "config.yaml", "agent", "--once"])
        .output();
    out.expect_code(1);
    assert_eq!(
        names(&spool(&t, "done")),
        BTreeSet::from(["whole".to_owned()])
    );
    assert!(names(&spool(&t, "failed")).is_empty(), "{}", out.all());
    assert_eq!(
        names(&spool(&t, "inbox")),
        BTreeSet::from(["half".to_owned(), "no-manifest".to_owned()])
    );
    assert_eq!(
        crate::util::tree(&half),
        half_before,
        "the incomplete bundle is left as it was"
    );
    let named = out
        .stderr
        .lines()
        .find(|l| l.contains("bundle=half") && l.contains("incomplete"))
        .unwrap_or_else(|| {
            panic!(
                "the log does not name the incomplete bundle:\n{}",
                out.stderr
            )
        });
    assert!(
        named.contains("a.txt") && named.contains("z.bin"),
        "{named}"
    );
    assert!(
        !out.stderr.contains("bundle=no-manifest: incomplete"),
        "a folder without a manifest is not an incomplete bundle:\n{}",
        out.stderr
    );
    assert_eq!(fs::read(t.join("www/whole/w.txt")).unwrap(), b"whole\n");
    assert_catalog_matches_disk(&t.join("www"));
}

#[test]
fn agent_once_with_only_a_folder_without_manifest_changes_nothing_and_exits_0() {
    let t = setup();
    write_file(&spool(&t, "inbox").join("not-yet/x.txt"), b"x\n");
    let folder = spool(&t, "inbox").join("not-yet");
    let before = crate::util::tree(&folder);
    let out = t.run(&["agent", "--once"]);
    out.expect_code(0);
    assert_eq!(crate::util::tree(&folder), before);
    assert_eq!(
        names(&spool(&t, "inbox")),
        BTreeSet::from(["not-yet".to_owned()])
    );
    assert!(names(&spool(&t, "done")).is_empty());
    assert!(names(&spool(&t, "failed")).is_empty());
    assert!(!t.join("www").exists() || names(&t.join("www")).is_empty());
}

#[test]
fn spool_list_inbox_says_why_each_entry_waits() {
    let t = setup();
    let inbox = spool(&t, "inbox");
    write_file(&inbox.join("no-manifest/x.txt"), b"x\n");
    incomplete_in_inbox(&t, "half");
    source(&t, "whole", &[("w.txt".to_owned(), b"whole\n".to_vec())]);
    fs::rename(t.join("src/whole"), inbox.join("whole")).unwrap();
    write_file(&inbox.join("stray.txt"), b"not a folder\n");
    std::os::unix::fs::symlink(t.join("src"), inbox.join("link")).unwrap();

    let rows = inbox_rows(&t);
    let by_name = |name: &str| -> (String, String) {
        let row = rows
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not listed: {rows:?}"));
        assert_eq!(row["spool"], "inbox");
        (
            row["state"].as_str().expect("state").to_owned(),
            row["reason"].as_str().expect("reason").to_owned(),
        )
    };
    let (state, reason) = by_name("no-manifest");
    assert_eq!(state, "no_manifest");
    assert!(reason.contains("manifest.json"), "{reason}");
    let (state, reason) = by_name("half");
    assert_eq!(state, "incomplete");
    assert!(
        reason.contains("1 of 3 listed files missing: a.txt"),
        "{reason}"
    );
    assert!(reason.contains("z.bin (4 of 10 bytes)"), "{reason}");
    // It says what will happen, not that it already failed.
    assert!(
        reason.contains("goes to failed/ after 10m without change"),
        "{reason}"
    );
    let (state, reason) = by_name("whole");
    assert!(state == "settling" || state == "ready", "{state}: {reason}");
    assert!(reason.starts_with("complete"), "{reason}");
    for odd in ["stray.txt", "link"] {
        let (state, reason) = by_name(odd);
        assert_eq!(state, "unreadable", "{odd}: {reason}");
        assert!(reason.contains("not a folder"), "{odd}: {reason}");
    }
    assert_eq!(rows.len(), 5, "{rows:?}");

    // The text output: one line per entry with its state and the reason.
    let text = t.run(&["spool", "list", "--inbox"]);
    text.expect_code(0);
    let line = |name: &str| -> String {
        text.stdout
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{}", text.stdout))
            .to_owned()
    };
    assert!(line("no-manifest").contains("no_manifest: no manifest.json yet"));
    let half = line("half");
    assert!(
        half.contains("incomplete: 1 of 3 listed files missing: a.txt")
            && half.contains("z.bin (4 of 10 bytes)"),
        "{half}"
    );
    let whole = line("whole");
    assert!(
        whole.contains("settling: complete") || whole.contains("ready: complete"),
        "{whole}"
    );
    for odd in ["stray.txt", "link"] {
        assert!(line(odd).contains("unreadable: is "), "{}", line(odd));
        assert!(line(odd).contains("not a folder"), "{}", line(odd));
    }
}
