//! The hostile-producer lab: a test folder others may enter, producers
//! that run as other users (uid 65534 and 60001, sharing group 65534, which
//! plays the producers' group of the install recipe), and a live agent whose
//! log goes to a file. Dropping privileges needs root; as another user the
//! tests that use it print why they skip and pass. CI runs them as root.

use crate::util::{Output, Test, catches, read_json, signal, wait_exit, wait_for, wait_output};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The producer (and, in the unprivileged-agent test, the agent).
pub(crate) const NOBODY: u32 = 65534;
/// Another producer of the same pipeline.
pub(crate) const OTHER: u32 = 60001;
/// The producers' group (also the unprivileged agent's).
pub(crate) const PRODUCERS: u32 = 65534;
/// How long the live agent gets to publish or file a small bundle.
pub(crate) const WAIT: Duration = Duration::from_secs(30);
pub(crate) const RESULT: &str = ".distributor-result.json";
pub(crate) const ATTEMPTS: &str = ".distributor-attempts";

/// True when the test can switch users; otherwise prints why it skips.
pub(crate) fn can_switch_users(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    eprintln!(
        "skipping {test}: it runs producers (and agents) as uid {NOBODY} and {OTHER}, which only root can do; CI runs it as root"
    );
    false
}

/// A test folder others may enter, with one pipeline `reports` (and
/// whatever else the config names) spooled under `./spool`.
pub(crate) struct Lab {
    pub(crate) t: Test,
}

impl Lab {
    /// Writes the config (the spool is `./spool`; roots go under the test
    /// folder) and lets the agent create the spools (`agent --once` with
    /// nothing to do), then gives the producers' group the inbox of each
    /// pipeline in `pipelines` as the install recipe does.
    pub(crate) fn new(config: &str, pipelines: &[&str]) -> Lab {
        let lab = Lab::bare(config);
        lab.agent_once(None).expect_code(0);
        for p in pipelines {
            lab.open_inbox(p);
        }
        lab
    }

    /// The folder and config only; nothing created by the agent yet.
    pub(crate) fn bare(config: &str) -> Lab {
        let t = Test::new();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
        t.config(config);
        Lab { t }
    }

    pub(crate) fn path(&self) -> &Path {
        self.t.path()
    }

    pub(crate) fn join(&self, rel: &str) -> PathBuf {
        self.t.join(rel)
    }

    /// `spool/<pipeline>/<folder>`.
    pub(crate) fn spool(&self, pipeline: &str, folder: &str) -> PathBuf {
        self.join(&format!("spool/{pipeline}/{folder}"))
    }

    /// The producers' group may pass through the pipeline's spool folder
    /// and write into its inbox, which stays sticky (the install recipe,
    /// done with group ownership instead of ACLs).
    pub(crate) fn open_inbox(&self, pipeline: &str) {
        chown(self.join("spool"), None, Some(PRODUCERS)).unwrap();
        let base = self.join(&format!("spool/{pipeline}"));
        chown(&base, None, Some(PRODUCERS)).unwrap();
        let inbox = base.join("inbox");
        chown(&inbox, None, Some(PRODUCERS)).unwrap();
        fs::set_permissions(&inbox, fs::Permissions::from_mode(0o1770)).unwrap();
    }

    /// The binary with this config and `args`, as root or as `uid`, logging
    /// at info.
    pub(crate) fn command(&self, uid: Option<u32>, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_distributor"));
        cmd.current_dir(self.path())
            .env_remove("DISTRIBUTOR_CONFIG")
            .env_remove("JOURNAL_STREAM")
            .env("RUST_LOG", "info")
            .arg("--config")
            .arg(self.join("config.yaml"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(PRODUCERS);
        }
        cmd
    }

    /// Runs the binary to completion (the test fails at util's deadline).
    pub(crate) fn run(&self, uid: Option<u32>, args: &[&str]) -> Output {
        let mut cmd = self.command(uid, args);
        let what = format!("distributor {}", args.join(" "));
        wait_output(cmd.spawn().expect("spawn distributor"), &what)
    }

    /// `agent --once`, as root or as `uid`.
    pub(crate) fn agent_once(&self, uid: Option<u32>) -> Output {
        self.run(uid, &["agent", "--once"])
    }

    /// A live agent, as root or as `uid`, its log in `agent-<n>.log`.
    pub(crate) fn agent(&self, uid: Option<u32>) -> Live {
        let n = (0..)
            .find(|n| !self.join(&format!("agent-{n}.log")).exists())
            .unwrap();
        let log = self.join(&format!("agent-{n}.log"));
        let mut cmd = self.command(uid, &["agent"]);
        cmd.stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("spawn the agent");
        let mut live = Live { child, log };
        let ready = wait_for(WAIT, || live.catches_stop() || !live.running());
        assert!(
            ready && live.running(),
            "the agent did not come up:\n{}",
            live.log()
        );
        live
    }

    /// Runs `script` with `sh -c` as `uid` (group [`PRODUCERS`]) in the test
    /// folder, with `env` set: a producer's own commands.
    pub(crate) fn producer(&self, uid: u32, script: &str, env: &[(&str, &[u8])]) -> Output {
        wait_output(self.producer_spawn(uid, script, env), script)
    }

    pub(crate) fn producer_spawn(&self, uid: u32, script: &str, env: &[(&str, &[u8])]) -> Child {
        self.spawn_producer(uid, script, env, Stdio::null())
    }

    /// Like [`Lab::producer_spawn`], with the script's standard input a pipe
    /// from the test (`read` in the script waits until the test closes it).
    pub(crate) fn producer_spawn_piped(
        &self,
        uid: u32,
        script: &str,
        env: &[(&str, &[u8])],
    ) -> Child {
        self.spawn_producer(uid, script, env, Stdio::piped())
    }

    fn spawn_producer(&self, uid: u32, script: &str, env: &[(&str, &[u8])], stdin: Stdio) -> Child {
        use std::os::unix::ffi::OsStrExt;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.path())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .uid(uid)
            .gid(PRODUCERS)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            cmd.env(key, std::ffi::OsStr::from_bytes(value));
        }
        cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot run sh as uid {uid} in {}: {e}; run the tests with TMPDIR in a folder every user may search, such as /tmp",
                self.path().display()
            )
        })
    }

    /// A producer's drop, as `uid`: copies `bundles/<name>` (built and
    /// sealed beforehand) into the inbox under a dot-name, then renames it.
    #[track_caller]
    pub(crate) fn deliver(&self, uid: u32, pipeline: &str, name: &str) {
        let inbox = format!("spool/{pipeline}/inbox");
        self.producer(
            uid,
            &format!(
                "umask 002 && cp -r bundles/{name} {inbox}/.{name} && chmod -R g+w {inbox}/.{name} && mv {inbox}/.{name} {inbox}/{name}"
            ),
            &[],
        )
        .expect_code(0);
    }

    /// A bundle sealed under `bundles/<name>` (readable by everyone).
    pub(crate) fn sealed(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        self.t.bundle(name, files)
    }

    /// A sealed bundle whose `a.txt` was then changed (same size): it fails
    /// verification (hash mismatch).
    pub(crate) fn corrupt(&self, name: &str) -> PathBuf {
        let dir = self.sealed(name, &[("a.txt", "good bytes")]);
        fs::write(dir.join("a.txt"), "evil bytes").unwrap();
        dir
    }
}

/// A live agent whose log goes to a file; killed on drop.
pub(crate) struct Live {
    child: Child,
    log: PathBuf,
}

impl Live {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// One field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
    pub(crate) fn status_kib(&self, field: &str) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/<pid>/status"))
    }

    /// Bytes the agent has read so far (`rchar` of `/proc/<pid>/io`).
    pub(crate) fn bytes_read(&self) -> u64 {
        fs::read_to_string(format!("/proc/{}/io", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("rchar:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// True once the agent handles SIGTERM (a signal sent earlier would kill
    /// it with the default action).
    pub(crate) fn catches_stop(&self) -> bool {
        catches(self.pid(), &[libc::SIGTERM])
    }

    /// Sends SIGTERM and waits up to `deadline` for the exit: the exit code
    /// (minus the signal when killed) and how long it took.
    #[track_caller]
    pub(crate) fn terminate(&mut self, deadline: Duration) -> (i32, Duration) {
        signal(self.pid(), libc::SIGTERM);
        let sent = Instant::now();
        let Some(status) = wait_exit(&mut self.child, deadline) else {
            panic!(
                "the agent did not exit within {deadline:?} of SIGTERM:\n{}",
                self.log()
            );
        };
        let code = status
            .code()
            .unwrap_or_else(|| -status.signal().unwrap_or(0));
        (code, sent.elapsed())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The result document of a filed bundle, which must be a regular file
/// (a planted link or FIFO replaced, never written through).
#[track_caller]
pub(crate) fn result_of(bundle: &Path) -> Value {
    let path = bundle.join(RESULT);
    let meta = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(meta.is_file(), "{} is not a regular file", path.display());
    read_json(&path)
}

/// The `error` text of a filed bundle's result.
#[track_caller]
pub(crate) fn error_of(bundle: &Path) -> String {
    result_of(bundle)["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A file's bytes and mode, to show it did not change.
pub(crate) fn snapshot(path: &Path) -> (Vec<u8>, u32, i64) {
    let meta = fs::symlink_metadata(path).unwrap();
    (fs::read(path).unwrap(), meta.mode(), meta.mtime())
}

pub(crate) const UNPRIVILEGED: &str = "spool: ./spool
agent:
  settle: 100ms
  rescan_interval: 200ms
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
";

impl Lab {
    /// One pipeline served by an agent running as uid 65534 (rescanning
    /// every 200 ms): as the operator's set-up, the agent's user owns the
    /// spool and the root, and the producer (uid 60001) shares its group;
    /// the agent creates the spool folders and the group may write into
    /// the sticky inbox.
    pub(crate) fn unprivileged() -> Lab {
        Lab::unprivileged_with(UNPRIVILEGED)
    }

    /// [`Lab::unprivileged`] with another config (one pipeline `reports`
    /// spooled under `./spool`, roots under `./site`).
    pub(crate) fn unprivileged_with(config: &str) -> Lab {
        let lab = Lab::bare(config);
        for folder in ["spool", "site"] {
            let path = lab.t.mkdir(folder);
            chown(&path, Some(NOBODY), Some(PRODUCERS)).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).unwrap();
        }
        lab.agent_once(Some(NOBODY)).expect_code(0);
        let inbox = lab.spool("reports", "inbox");
        assert_eq!(fs::metadata(&inbox).unwrap().uid(), NOBODY);
        fs::set_permissions(&inbox, fs::Permissions::from_mode(0o1770)).unwrap();
        lab
    }
}
