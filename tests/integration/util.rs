//! The fixture builder every integration test uses: a temporary folder, a
//! config file written into it (relative paths resolve against it), bundles
//! built and sealed with the real binary, the binary run with a deadline or
//! kept running as a live agent ([`Proc`]), readers for catalogs and folder
//! trees, a held root lock and one seeded random generator.

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_distributor");

/// The `created` every fixture bundle gets unless a test says otherwise.
pub const CREATED: &str = "2026-06-04T11:55:00Z";

/// How long any single invocation may take before the test fails (a hang
/// on a FIFO, a lock never released) instead of blocking the suite.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The backends a scenario runs against (`each_backend`): a local root, or
/// a root in a bucket of the SeaweedFS of `seaweed::server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Local,
    S3,
}

pub const BACKENDS: [Backend; 2] = [Backend::Local, Backend::S3];

/// Runs `scenario` against every backend, naming the backend when it fails.
pub fn each_backend(scenario: impl Fn(Backend)) {
    for backend in BACKENDS {
        eprintln!("--- backend {backend:?}");
        scenario(backend);
    }
}

/// A temporary working folder holding a config, bundles and roots.
pub struct Test {
    dir: tempfile::TempDir,
}

impl Test {
    pub fn new() -> Test {
        Test {
            dir: tempfile::Builder::new()
                .prefix("distributor-it-")
                .tempdir()
                .expect("create temp dir"),
        }
    }

    /// A test folder on tmpfs when the machine has one: publication fsyncs
    /// every file, which makes the crash loop slow on a real disk. Killing
    /// a process exercises the same code paths either way.
    pub fn on_tmpfs() -> Test {
        let shm = Path::new("/dev/shm");
        let usable = fs::metadata(shm).is_ok_and(|m| m.is_dir())
            && tempfile::Builder::new().tempfile_in(shm).is_ok();
        if !usable {
            return Test::new();
        }
        Test {
            dir: tempfile::Builder::new()
                .prefix("distributor-it-")
                .tempdir_in(shm)
                .expect("create temp dir in /dev/shm"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `rel` inside the test folder.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file (creating its folders) and returns its path.
    pub fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(rel);
        write_file(&path, contents.as_ref());
        path
    }

    /// Creates a folder (and its parents) and returns its path.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let path = self.join(rel);
        fs::create_dir_all(&path).expect("create dir");
        path
    }

    /// Writes `config.yaml`; paths in it resolve against the test folder.
    pub fn config(&self, yaml: &str) -> &Test {
        self.write("config.yaml", yaml);
        self
    }

    /// Writes `bundles/<name>` with `files` (path, text; borrowed or owned)
    /// and seals it with id `name` and the fixed [`CREATED`] time.
    pub fn bundle<P: AsRef<str>, C: AsRef<str>>(&self, name: &str, files: &[(P, C)]) -> PathBuf {
        self.bundle_at(name, name, CREATED, files)
    }

    /// Like [`Test::bundle`] with an explicit id and creation time.
    pub fn bundle_at<P: AsRef<str>, C: AsRef<str>>(
        &self,
        name: &str,
        id: &str,
        created: &str,
        files: &[(P, C)],
    ) -> PathBuf {
        let files: Vec<(&str, &[u8])> = files
            .iter()
            .map(|(p, c)| (p.as_ref(), c.as_ref().as_bytes()))
            .collect();
        self.sealed_at(name, id, created, &files)
    }

    /// Like [`Test::bundle`] with contents given as bytes.
    pub fn sealed(&self, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        self.sealed_at(name, name, CREATED, files)
    }

    fn sealed_at<P: AsRef<str>, C: AsRef<[u8]>>(
        &self,
        name: &str,
        id: &str,
        created: &str,
        files: &[(P, C)],
    ) -> PathBuf {
        let dir = self.join(&format!("bundles/{name}"));
        assert!(!dir.exists(), "bundle {name} already exists");
        fs::create_dir_all(&dir).expect("create bundle dir");
        for (path, contents) in files {
            write_file(&dir.join(path.as_ref()), contents.as_ref());
        }
        self.seal(&dir, id, Some(created)).expect_code(0);
        dir
    }

    /// `distributor bundle seal DIR --id ID [--created T]`.
    pub fn seal(&self, dir: &Path, id: &str, created: Option<&str>) -> Output {
        let mut cmd = self.cmd();
        cmd.args(["bundle", "seal"]).arg(dir).args(["--id", id]);
        if let Some(created) = created {
            cmd.args(["--created", created]);
        }
        cmd.output()
    }

    /// The binary, run in the test folder, with no config selected.
    pub fn cmd(&self) -> TestCommand {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(self.path())
            .env_remove("DISTRIBUTOR_CONFIG")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        TestCommand { cmd }
    }

    /// The binary with `--config config.yaml` and `args`.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut cmd = self.cmd();
        cmd.args(["--config", "config.yaml"]).args(args);
        cmd.output()
    }

    /// The binary with `--config config.yaml`, logging at info like an
    /// operator's agent (agent tests read its log).
    pub fn agent_cmd(&self) -> TestCommand {
        let mut cmd = self.cmd();
        cmd.env("RUST_LOG", "info")
            .args(["--config", "config.yaml"]);
        cmd
    }

    /// `agent --once`, logging at info.
    pub fn once(&self) -> Output {
        self.agent_cmd().args(["agent", "--once"]).output()
    }

    /// Starts a live agent on `config.yaml`; see [`Test::agent_with`].
    pub fn agent(&self) -> Proc {
        self.agent_with(Path::new("config.yaml"))
    }

    /// Starts a live agent on `config` (logging at info) and waits until it
    /// handles SIGTERM, SIGINT and SIGHUP (a signal sent earlier would kill
    /// it with the default action).
    pub fn agent_with(&self, config: &Path) -> Proc {
        self.agent_logging(config, "info")
    }

    /// Like [`Test::agent_with`], logging what `filter` (a `RUST_LOG`
    /// value) selects.
    pub fn agent_logging(&self, config: &Path, filter: &str) -> Proc {
        let mut cmd = self.cmd();
        cmd.env("RUST_LOG", filter)
            .arg("--config")
            .arg(config)
            .arg("agent");
        started_agent(&mut cmd)
    }

    /// `spool/<pipeline>/<folder>`.
    pub fn spool(&self, pipeline: &str, folder: &str) -> PathBuf {
        self.join(&format!("spool/{pipeline}/{folder}"))
    }

    /// `run --json --pipeline P [extra...] BUNDLE`.
    pub fn publish(&self, pipeline: &str, bundle: &Path, extra: &[&str]) -> Output {
        let mut cmd = self.cmd();
        cmd.args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            pipeline,
        ])
        .args(extra)
        .arg(bundle);
        cmd.output()
    }

    /// The catalog of the root at `rel`.
    pub fn state(&self, rel: &str) -> Value {
        read_state(&self.join(rel))
    }

    /// The catalog's records of the root at `rel`, by path.
    pub fn recorded(&self, rel: &str) -> BTreeMap<String, Value> {
        records(&self.state(rel))
    }

    /// Every entry below `rel`, sorted.
    pub fn tree(&self, rel: &str) -> Tree {
        tree(&self.join(rel))
    }

    /// Paths of every entry below `rel` (folders included), sorted.
    pub fn listing(&self, rel: &str) -> Vec<String> {
        self.tree(rel).0.into_keys().collect()
    }
}

/// A command to run with a deadline.
pub struct TestCommand {
    cmd: Command,
}

impl TestCommand {
    pub fn arg(&mut self, arg: impl AsRef<std::ffi::OsStr>) -> &mut TestCommand {
        self.cmd.arg(arg);
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut TestCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn env(&mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> &mut TestCommand {
        self.cmd.env(key, value);
        self
    }

    /// Runs the child with this umask.
    pub fn umask(&mut self, mask: u32) -> &mut TestCommand {
        // SAFETY: umask(2) is async-signal-safe and touches no memory.
        unsafe {
            self.cmd.pre_exec(move || {
                libc::umask(mask as libc::mode_t);
                Ok(())
            });
        }
        self
    }

    /// Runs the child with at most `limit` open file descriptors
    /// (`RLIMIT_NOFILE`, soft and hard).
    pub fn nofile(&mut self, limit: u64) -> &mut TestCommand {
        // SAFETY: setrlimit(2) is async-signal-safe and allocates nothing.
        unsafe {
            self.cmd.pre_exec(move || {
                let l = rustix::process::Rlimit {
                    current: Some(limit),
                    maximum: Some(limit),
                };
                rustix::process::setrlimit(rustix::process::Resource::Nofile, l)?;
                Ok(())
            });
        }
        self
    }

    /// Starts the child with its output discarded (for kill tests).
    pub fn spawn_quiet(&mut self) -> Child {
        self.cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn distributor")
    }

    /// Starts the child capturing its output; finish with [`wait_output`].
    pub fn spawn(&mut self) -> Child {
        self.cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn distributor")
    }

    /// Starts the child as a [`Proc`] whose output is collected as it runs.
    pub fn start(&mut self) -> Proc {
        let what = format!("{:?}", self.cmd);
        Proc::new(self.spawn(), &what)
    }

    /// Starts the child as a [`Proc`] with its output discarded.
    pub fn start_quiet(&mut self) -> Proc {
        let what = format!("{:?}", self.cmd);
        Proc::new(self.spawn_quiet(), &what)
    }

    /// Runs to completion (or fails the test at the deadline).
    pub fn output(&mut self) -> Output {
        self.start().finish(DEADLINE)
    }
}

/// Waits for a child started with [`TestCommand::spawn`], killing it and
/// failing the test if it outlives the deadline.
pub fn wait_output(child: Child, what: &str) -> Output {
    Proc::new(child, what).finish(DEADLINE)
}

/// A child process whose piped output is collected as it runs; killed on
/// drop, so no failed test leaves an agent behind.
pub struct Proc {
    pub child: Child,
    what: String,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Takes over `child` (named `what` in failures), reading whichever of
    /// its stdout and stderr are piped.
    pub fn new(mut child: Child, what: &str) -> Proc {
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(pipe) = child.stdout.take() {
            readers.push(collect(pipe, stdout.clone()));
        }
        if let Some(pipe) = child.stderr.take() {
            readers.push(collect(pipe, stderr.clone()));
        }
        Proc {
            child,
            what: what.to_owned(),
            stdout,
            stderr,
            readers,
        }
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: libc::c_int) {
        signal(self.child.id(), sig);
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// True when the process has handlers installed for every one of
    /// `signals`.
    pub fn catches(&self, signals: &[libc::c_int]) -> bool {
        catches(self.child.id(), signals)
    }

    /// Whether it is stopped (at a `<name>:<n>:stop` failpoint).
    pub fn stopped(&self) -> bool {
        stopped(self.child.id())
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits until its stderr holds `needle`; fails with the log at `timeout`.
    #[track_caller]
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        assert!(
            wait_for(timeout, || self.stderr().contains(needle)),
            "no {needle:?} in the log within {timeout:?}:\n{}",
            self.stderr()
        );
    }

    /// How many lines of its stderr so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.stderr().lines().filter(|l| l.contains(needle)).count()
    }

    /// Waits for the exit (killing the child and failing at `timeout`).
    #[track_caller]
    pub fn finish(&mut self, timeout: Duration) -> Output {
        let Some(status) = wait_exit(&mut self.child, timeout) else {
            panic!(
                "{} did not exit within {timeout:?}:\n{}",
                self.what,
                self.stderr()
            );
        };
        for r in std::mem::take(&mut self.readers) {
            r.join().expect("output reader");
        }
        Output {
            code: status
                .code()
                .unwrap_or_else(|| -status.signal().unwrap_or(0)),
            stdout: String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn collect(mut pipe: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    })
}

/// Sends `sig` to the process `pid` (a child not yet reaped).
pub fn signal(pid: u32, sig: libc::c_int) {
    kill(pid, sig, rustix::process::kill_process);
}

/// Sends `sig` to every process of the group led by `pid`.
pub fn signal_group(pid: u32, sig: libc::c_int) {
    kill(pid, sig, rustix::process::kill_process_group);
}

fn kill(
    pid: u32,
    sig: libc::c_int,
    send: fn(rustix::process::Pid, rustix::process::Signal) -> rustix::io::Result<()>,
) {
    let target = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .expect("a child's pid");
    let signal = rustix::process::Signal::from_named_raw(sig).expect("a named signal");
    send(target, signal).unwrap_or_else(|e| panic!("kill({pid}, {sig}): {e}"));
}

/// Whether process `pid` is stopped (`T` in /proc/<pid>/stat), as a
/// `<name>:<n>:stop` failpoint leaves it.
pub fn stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

/// True when the process `pid` has handlers installed for every one of
/// `signals` (the `SigCgt` mask of `/proc/<pid>/status`).
pub fn catches(pid: u32, signals: &[libc::c_int]) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    signals.iter().all(|&s| mask & (1u64 << (s - 1)) != 0)
}

/// Creates `<root>/.distributor.lock` (and the root) and holds an
/// exclusive lock on it, as an operator pausing publication would, until
/// the returned file is dropped.
#[track_caller]
pub fn hold_root_lock(root: &Path) -> fs::File {
    fs::create_dir_all(root).expect("create root");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".distributor.lock"))
        .expect("open the lock file");
    file.try_lock().expect("take the root lock");
    file
}

/// xorshift64: no dependency, and a printed seed replays a run.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `DISTRIBUTOR_IT_SEED` or the clock; prints the seed
    /// with `what` so a failing run can be replayed.
    pub fn seeded(what: &str) -> Rng {
        let seed = std::env::var("DISTRIBUTOR_IT_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock after 1970")
                    .as_nanos() as u64
            })
            | 1;
        eprintln!("{what}: seed {seed} (replay with DISTRIBUTOR_IT_SEED={seed})");
        Rng(seed)
    }

    /// A fixed sequence (`seed` must not be 0).
    pub fn new(seed: u64) -> Rng {
        assert_ne!(seed, 0, "xorshift never leaves 0");
        Rng(seed)
    }

    /// A generator of its own for another thread, drawn from this one.
    pub fn split(&mut self) -> Rng {
        Rng(self.next_u64() | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }

    /// `len` bytes of the sequence.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// Starts `cmd` (an `agent` command) and waits until it handles SIGTERM,
/// SIGINT and SIGHUP (a signal sent earlier would kill it with the
/// default action).
#[track_caller]
pub fn started_agent(cmd: &mut TestCommand) -> Proc {
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

/// What a finished command produced.
#[derive(Debug)]
pub struct Output {
    /// The exit code, or minus the number of the signal that killed it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Fails the test, showing the whole output, unless the code is `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Output {
        assert_eq!(
            self.code, code,
            "expected exit code {code}, got {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// Stdout parsed as JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e})\n--- stdout\n{}\n--- stderr\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// The first (or only) destination of a `run --json` document.
    #[track_caller]
    pub fn dest(&self) -> Value {
        self.json()["destinations"][0].clone()
    }

    /// Stdout and stderr together, for "the message names X" checks.
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Strings of a JSON array (panics on anything else).
#[track_caller]
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_owned()
        })
        .collect()
}

/// Writes an executable script at `path`. Its final bytes are written by
/// a child process (`install`), never through a descriptor of this
/// process: a test thread forking meanwhile would inherit such a
/// descriptor until its child execs, and running the script then fails
/// with "Text file busy".
pub fn write_script(path: &Path, text: &str) -> PathBuf {
    let staged = path.with_extension("staged");
    write_file(&staged, text.as_bytes());
    let status = Command::new("install")
        .args(["-m", "755"])
        .arg(&staged)
        .arg(path)
        .status()
        .expect("run install");
    assert!(status.success(), "install {}", path.display());
    fs::remove_file(&staged).unwrap();
    path.to_path_buf()
}

pub fn write_file(path: &Path, contents: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent dir");
    }
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Reads a JSON file, failing the test with its path.
#[track_caller]
pub fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Reads `<root>/.distributor.json`.
#[track_caller]
pub fn read_state(root: &Path) -> Value {
    read_json(&root.join(".distributor.json"))
}

/// Entry names of a folder (empty when it does not exist).
pub fn names(dir: &Path) -> BTreeSet<String> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// [`names`] as a sorted list, to compare with an array.
pub fn sorted_names(dir: &Path) -> Vec<String> {
    names(dir).into_iter().collect()
}

/// The bundles in a spool folder, sorted: its entry names, the agent's
/// own dot-files (`.distributor-unfiled.json`, temporary files) aside.
pub fn bundle_names(dir: &Path) -> Vec<String> {
    names(dir)
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect()
}

/// Waits up to `timeout` for `child` to exit; `None` (the child killed
/// and reaped) when it did not.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let mut status = None;
    wait_for(timeout, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// Polls `cond` until it holds (every 2 ms at first, then less often, at
/// most every 10 ms); false after `timeout`. The one place a test sleeps
/// while it waits for something to happen.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Waits until the system clock is more than `by` past `since` (a time a
/// file or a catalog recorded), so that a rule about "older than" holds
/// for whatever the next step does. Fails the test after [`DEADLINE`].
#[track_caller]
pub fn wait_past(since: std::time::SystemTime, by: Duration) {
    assert!(
        wait_for(DEADLINE, || std::time::SystemTime::now()
            .duration_since(since)
            .is_ok_and(|d| d > by)),
        "the clock did not pass {since:?} + {by:?}"
    );
}

/// The instant an RFC 3339 time stamp (a catalog's `updated_at`) names.
#[track_caller]
pub fn instant_of(stamp: &Value) -> std::time::SystemTime {
    let text = stamp
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {stamp}"));
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    std::time::SystemTime::from(t)
}

/// A catalog's records by path.
pub fn records(state: &Value) -> BTreeMap<String, Value> {
    state["outputs"]
        .as_array()
        .expect("outputs array")
        .iter()
        .map(|r| (r["path"].as_str().expect("path").to_owned(), r.clone()))
        .collect()
}

/// `sha256:<hex>` of a file.
pub fn sha256_file(path: &Path) -> String {
    let file = fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    sha256_of(file)
}

/// `sha256:<hex>` of everything `r` yields, read in 1 MiB chunks (memory
/// never scales with the length).
pub fn sha256_of(mut r: impl Read) -> String {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex_digest(h)
}

/// `sha256:<hex>` of some bytes, computed independently of the product.
pub fn sha256(bytes: &[u8]) -> String {
    hex_digest(Sha256::new_with_prefix(bytes))
}

fn hex_digest(h: Sha256) -> String {
    let mut out = String::from("sha256:");
    for b in h.finalize().iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// One manifest entry: path, `sha256:` hash, size.
pub type Listed = (String, String, u64);

/// The digest rule of docs/contract.md §3, written from the contract.
pub fn manifest_digest(files: &[Listed]) -> String {
    let mut sorted: Vec<&Listed> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut text = String::new();
    for (path, sha, size) in sorted {
        text.push_str(&format!("{sha} {size} {path}\n"));
    }
    sha256(text.as_bytes())
}

/// The entry of a file as a manifest lists it (following no link: the
/// bytes are passed in).
pub fn listed(path: &str, contents: &[u8]) -> Listed {
    (path.to_owned(), sha256(contents), contents.len() as u64)
}

/// Writes `dir/manifest.json` by hand, with a correct digest for `files`.
pub fn write_manifest(dir: &Path, id: &str, files: &[Listed]) {
    let entries: Vec<Value> = files
        .iter()
        .map(|(p, s, n)| serde_json::json!({"path": p, "sha256": s, "size": n}))
        .collect();
    let doc = serde_json::json!({
        "schema_version": 1,
        "id": id,
        "created": CREATED,
        "digest": manifest_digest(files),
        "files": entries,
    });
    write_file(
        &dir.join("manifest.json"),
        serde_json::to_string_pretty(&doc).expect("json").as_bytes(),
    );
}

/// Creates a FIFO.
pub fn mkfifo(path: &Path) {
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        path,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

/// What sits at one path of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File { sha256: String, size: u64 },
    Dir,
    Symlink(PathBuf),
    Other,
}

/// One entry: its kind, permission bits, modification time and inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub mtime_ns: i128,
    pub ino: u64,
}

/// Every entry below a folder by relative path; `""` is the folder itself.
/// Symlinks are recorded, never followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree(pub BTreeMap<String, Node>);

impl Tree {
    /// Paths of regular files, reserved `.distributor*` names aside.
    pub fn files(&self) -> Vec<String> {
        self.0
            .iter()
            .filter(|(p, n)| matches!(n.kind, Kind::File { .. }) && !is_reserved(p))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Every path, the folder itself aside.
    pub fn paths(&self) -> Vec<String> {
        self.0.keys().filter(|p| !p.is_empty()).cloned().collect()
    }
}

/// True when any segment starts with `.distributor`.
pub fn is_reserved(path: &str) -> bool {
    path.split('/').any(|s| s.starts_with(".distributor"))
}

/// Reads a folder tree (an empty tree when the folder is missing).
pub fn tree(dir: &Path) -> Tree {
    let mut out = BTreeMap::new();
    if fs::symlink_metadata(dir).is_ok() {
        walk(dir, "", true, &mut out);
    }
    Tree(out)
}

/// Like [`tree`] without hashing file contents (their `sha256` is empty):
/// cheaper when only the shape matters.
pub fn shape(dir: &Path) -> Tree {
    let mut out = BTreeMap::new();
    if fs::symlink_metadata(dir).is_ok() {
        walk(dir, "", false, &mut out);
    }
    Tree(out)
}

fn walk(path: &Path, rel: &str, hash: bool, out: &mut BTreeMap<String, Node>) {
    let meta =
        fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        Kind::Symlink(fs::read_link(path).expect("read link"))
    } else if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File {
            sha256: if hash {
                sha256_file(path)
            } else {
                String::new()
            },
            size: meta.len(),
        }
    } else {
        Kind::Other
    };
    out.insert(
        rel.to_owned(),
        Node {
            kind: kind.clone(),
            mode: meta.permissions().mode() & 0o7777,
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ino: meta.ino(),
        },
    );
    if kind == Kind::Dir {
        let mut names: Vec<_> = fs::read_dir(path)
            .expect("read dir")
            .map(|e| e.expect("dir entry").file_name())
            .collect();
        names.sort();
        for name in names {
            let name = name.to_string_lossy().into_owned();
            let child = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            walk(&path.join(&name), &child, hash, out);
        }
    }
}

/// The value of the metric `distributor_<name>` of pipeline `p` in the
/// test's `metrics.prom`.
pub fn metric(t: &Test, name: &str) -> String {
    let text = fs::read_to_string(t.join("metrics.prom")).unwrap();
    let prefix = format!("distributor_{name}{{pipeline=\"p\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .to_owned()
}

/// Asserts that every record of a catalog matches the bytes on disk and
/// that every regular file of the root (reserved names aside) is recorded.
#[track_caller]
pub fn assert_catalog_matches_disk(root: &Path) {
    let recs = records(&read_state(root));
    for (path, r) in &recs {
        let file = root.join(path);
        let meta = fs::symlink_metadata(&file)
            .unwrap_or_else(|e| panic!("recorded output {path} is not on disk: {e}"));
        assert!(
            meta.file_type().is_file(),
            "recorded output {path} is not a regular file"
        );
        assert_eq!(r["size"].as_u64(), Some(meta.len()), "size of {path}");
        assert_eq!(
            r["sha256"].as_str(),
            Some(sha256_file(&file).as_str()),
            "sha256 of {path}"
        );
    }
    for path in shape(root).files() {
        assert!(
            recs.contains_key(&path),
            "{path} is on disk but not recorded"
        );
    }
}

/// Gives the manifest of bundle folder `dir` a modification time of
/// `order` seconds after a fixed instant, so that bundles arrive (are
/// claimed and batched) exactly in the order given.
pub fn arrive_in_order(dir: &Path, order: u64) {
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000 + order);
    fs::File::options()
        .write(true)
        .open(dir.join("manifest.json"))
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// The sizes of the batches an agent's log says it published ("published
/// a batch of N bundles"), in order.
pub fn batch_sizes(log: &str) -> Vec<usize> {
    log.lines()
        .filter_map(|l| l.split("published a batch of ").nth(1))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// `$PATH` with the folder of the binary under test in front: for shells
/// and scripts that run `distributor` by name, as users do.
pub fn path_with_binary() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_distributor"))
        .parent()
        .expect("the binary's folder");
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
