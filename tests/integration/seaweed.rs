//! A real S3-compatible server for the s3 tests: SeaweedFS, installed by
//! `scripts/install-test-deps` into `target/seaweedfs-venv`, started once
//! per test process on free ports of 127.0.0.1, and stopped when the
//! process exits.
//!
//! - One server per test process ([`server`], a `OnceLock`); each test
//!   makes its own bucket ([`Server::root`]; the admin identity creates a
//!   bucket on its first upload).
//! - No process is left behind: the server is spawned by a thread that
//!   lives as long as the test process, with `PR_SET_PDEATHSIG` = SIGKILL
//!   (the kernel kills it when that thread, i.e. the process, goes away,
//!   however it ends), and an `atexit` hook sends SIGTERM, waits 2 s, then
//!   SIGKILL, reaps it and removes its data folder.
//! - The pinned version enforces conditional writes (4.16 did not under
//!   concurrent creates).

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use distributor::config::S3Location;
use distributor::s3::{Credentials, S3Root};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

use crate::util::sha256;

/// The SeaweedFS release the tests and CI use (scripts/install-test-deps
/// installs it).
pub const VERSION: &str = include_str!("../../scripts/seaweedfs-version").trim_ascii();
const ACCESS_KEY: &str = "distributor-test";
const SECRET_KEY: &str = "distributor-test-secret";
/// An identity that may read and list but not write (`reader_credentials`).
const READER_KEY: &str = "distributor-reader";
const READER_SECRET: &str = "distributor-reader-secret";

/// The running server.
pub struct Server {
    /// `http://127.0.0.1:PORT` of the S3 API.
    pub endpoint: String,
    /// How long the server took from spawn to its first successful write.
    #[allow(dead_code)] // printed when the server starts
    pub started_in: Duration,
}

/// The server's pid and data folder, for the exit hook.
static RUNNING: Mutex<Option<(u32, PathBuf)>> = Mutex::new(None);

/// The shared server, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    match SERVER.get_or_init(start) {
        Ok(server) => server,
        Err(e) => panic!("cannot start the SeaweedFS test server: {e}"),
    }
}

impl Server {
    /// Credentials of the server's one identity.
    pub fn credentials(&self) -> Credentials {
        credentials()
    }

    /// A location in a bucket of its own (new for every call).
    pub fn location(&self, prefix: &str) -> S3Location {
        static N: AtomicUsize = AtomicUsize::new(0);
        S3Location {
            bucket: format!(
                "t{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            path: prefix.to_owned(),
            endpoint: Some(self.endpoint.clone()),
            region: "us-east-1".to_owned(),
        }
    }

    /// A root in a fresh bucket.
    pub fn root(&self, prefix: &str) -> S3Root {
        S3Root::open_with(&self.location(prefix), self.credentials()).expect("s3 client")
    }
}

/// Credentials of the test server's one identity.
pub fn credentials() -> Credentials {
    Credentials {
        key_id: ACCESS_KEY.to_owned(),
        secret: SECRET_KEY.to_owned(),
        token: None,
    }
}

/// Credentials of an identity that may read and list every bucket but
/// write nothing: proves that a command writes nothing at all.
pub fn reader_credentials() -> Credentials {
    Credentials {
        key_id: READER_KEY.to_owned(),
        secret: READER_SECRET.to_owned(),
        token: None,
    }
}

/// A root reached through `endpoint` with unsigned requests.
pub fn unsigned_root(location: &S3Location) -> S3Root {
    let endpoint = location.endpoint.clone().expect("an endpoint");
    let store = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&location.bucket)
        .with_region(&location.region)
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_skip_signature(true)
        .build()
        .expect("s3 client");
    S3Root::with_store(
        std::sync::Arc::new(store),
        &location.path,
        location.to_string(),
        format!("{endpoint} {}", location.bucket),
    )
    .expect("runtime")
}

/// `target/` of this build (the parent of `target/tmp`).
fn target_dir() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().map(Path::to_path_buf).unwrap_or(tmp)
}

/// The `weed` binary: `$DISTRIBUTOR_TEST_WEED`, else the one
/// `scripts/install-test-deps` put in `target/seaweedfs-venv`. The tests
/// install nothing themselves.
pub fn weed() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("DISTRIBUTOR_TEST_WEED") {
        return Ok(PathBuf::from(path));
    }
    let weed = target_dir().join("seaweedfs-venv/bin/weed");
    let installed = Command::new(&weed)
        .arg("version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(" {VERSION} ")));
    if installed {
        Ok(weed)
    } else {
        Err(format!(
            "SeaweedFS {VERSION} is not installed at {}; run scripts/install-test-deps once (or set DISTRIBUTOR_TEST_WEED to a weed binary)",
            weed.display()
        ))
    }
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A free port on 127.0.0.1 below the kernel's ephemeral range (which
/// outgoing connections take their ports from), so that it stays free while
/// the server that listened on it is stopped.
fn stable_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    // Spread over [low / 2, low) by process, then walk to a free one.
    let span = (low / 2).max(1);
    let start = low / 2 + (std::process::id() * 97) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low / 2 + (start - low / 2 + n) % span;
        if let Ok(port) = u16::try_from(port)
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 below {low}")
}

extern "C" fn stop_at_exit() {
    let Some((pid, dir)) = RUNNING.lock().ok().and_then(|mut r| r.take()) else {
        return;
    };
    use rustix::process::{Signal, WaitOptions, kill_process, waitpid};
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    // The server is this process's child and is not reaped before here.
    let _ = kill_process(pid, Signal::TERM);
    let reaped = crate::util::wait_for(Duration::from_secs(2), || {
        !matches!(waitpid(Some(pid), WaitOptions::NOHANG), Ok(None))
    });
    if !reaped {
        let _ = kill_process(pid, Signal::KILL);
        let _ = waitpid(Some(pid), WaitOptions::empty());
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Writes the server's identities (`s3.json`) and `master.toml` into
/// `dir` (emptied first) and returns the arguments of `weed server` on
/// fresh ports of 127.0.0.1, the S3 port first.
fn prepare(dir: &Path, port: fn() -> u16) -> Result<(u16, Vec<String>), String> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let config = dir.join("s3.json");
    fs::write(
        &config,
        format!(
            r#"{{"identities":[{{"name":"admin","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}},{{"name":"reader","credentials":[{{"accessKey":"{READER_KEY}","secretKey":"{READER_SECRET}"}}],"actions":["Read","List"]}},{{"name":"anonymous","actions":["Read","Write","List"]}}]}}"#
        ),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    // One volume per new collection (each bucket is one) instead of 7, so
    // that a bucket per test does not exhaust -volume.max (the suite makes
    // more than 100 buckets, and some grow past one 64 MB volume; volumes
    // are not preallocated). SeaweedFS reads master.toml from its working
    // folder.
    fs::write(
        dir.join("master.toml"),
        "[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n",
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let s3_port = port();
    let mut args = vec![
        "server".to_owned(),
        "-ip=127.0.0.1".to_owned(),
        "-ip.bind=127.0.0.1".to_owned(),
        format!("-dir={}", dir.join("data").display()),
        "-master.volumeSizeLimitMB=64".to_owned(),
        "-volume.max=400".to_owned(),
        "-s3".to_owned(),
        format!("-s3.port={s3_port}"),
        format!("-s3.config={}", config.display()),
        "-s3.port.iceberg=0".to_owned(),
        "-s3.port.lance=0".to_owned(),
    ];
    for flag in [
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port.grpc",
    ] {
        args.push(format!("-{flag}={}", port()));
    }
    Ok((s3_port, args))
}

fn start() -> Result<Server, String> {
    let weed = weed()?;
    let dir = target_dir()
        .join("tmp")
        .join(format!("seaweedfs-{}", std::process::id()));
    let (s3_port, args) = prepare(&dir, free_port)?;
    let log = fs::File::create(dir.join("weed.log")).map_err(|e| e.to_string())?;

    // Spawned from a thread that lives until the process exits: the
    // parent-death signal fires when the *thread* that forked ends.
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let spawn_dir = dir.clone();
    std::thread::Builder::new()
        .name("seaweedfs".into())
        .spawn(move || {
            let mut cmd = weed_command(&weed, &args, &spawn_dir, log);
            let child = cmd.spawn().map(|c| c.id());
            let _ = tx.send(child);
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| e.to_string())?;
    let pid = rx
        .recv()
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot run {}: {e}", dir.display()))?;
    *RUNNING.lock().map_err(|e| e.to_string())? = Some((pid, dir.clone()));
    static HOOKED: AtomicU32 = AtomicU32::new(0);
    if HOOKED.fetch_add(1, Ordering::Relaxed) == 0 {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(stop_at_exit) };
    }

    // Ready when a write succeeds (the S3 port answers before the volume
    // server has registered).
    let server = Server {
        endpoint: format!("http://127.0.0.1:{s3_port}"),
        started_in: Duration::ZERO,
    };
    let ready = crate::util::wait_for(Duration::from_secs(90), || {
        TcpStream::connect(("127.0.0.1", s3_port)).is_ok() && server.root("").probe().is_ok()
    });
    if !ready {
        let log = fs::read_to_string(dir.join("weed.log")).unwrap_or_default();
        let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
        return Err(format!(
            "SeaweedFS did not accept a write within 90 s; last log lines (newest first):\n{tail}"
        ));
    }
    let started_in = started.elapsed();
    eprintln!(
        "SeaweedFS {VERSION} ready at {} after {:.1} s",
        server.endpoint,
        started_in.as_secs_f64()
    );
    Ok(Server {
        started_in,
        ..server
    })
}

/// A SeaweedFS server of one test's own, apart from the shared [`server`]
/// (which other tests of the process use meanwhile): its own ports and
/// data folder, so that the test can stop it as an outage would and start
/// it again on the same ports and data (buckets and objects survive).
/// Spawned by the test's thread with `PR_SET_PDEATHSIG`, so it dies with
/// the test however the test ends; killed, reaped and its folder removed
/// on drop.
pub struct OwnServer {
    /// `http://127.0.0.1:PORT` of the S3 API (the same across restarts).
    pub endpoint: String,
    s3_port: u16,
    dir: PathBuf,
    args: Vec<String>,
    weed: PathBuf,
    child: Option<std::process::Child>,
}

impl OwnServer {
    /// Starts a server named `name` (its folder is
    /// `target/tmp/seaweedfs-<pid>-<name>`) and waits until it takes a write.
    pub fn start(name: &str) -> OwnServer {
        let weed = weed().unwrap_or_else(|e| panic!("{e}"));
        let dir = target_dir()
            .join("tmp")
            .join(format!("seaweedfs-{}-{name}", std::process::id()));
        // Ports no connection is ever given as its own (below the
        // ephemeral range): while the server is stopped, the agent's
        // retries must not take the port it comes back on.
        let (s3_port, args) = prepare(&dir, stable_port).unwrap_or_else(|e| panic!("{e}"));
        let mut server = OwnServer {
            endpoint: format!("http://127.0.0.1:{s3_port}"),
            s3_port,
            dir,
            args,
            weed,
            child: None,
        };
        server.resume();
        server
    }

    /// A location in `bucket` of this server.
    pub fn location(&self, bucket: &str, prefix: &str) -> S3Location {
        S3Location {
            bucket: bucket.to_owned(),
            path: prefix.to_owned(),
            endpoint: Some(self.endpoint.clone()),
            region: "us-east-1".to_owned(),
        }
    }

    /// Starts the stopped server again on the same ports and data folder,
    /// and waits (up to 90 s) until it takes a write again.
    #[track_caller]
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("weed.log"))
            .expect("open weed.log");
        let mut cmd = weed_command(&self.weed, &self.args, &self.dir, log);
        let started = Instant::now();
        self.child = Some(cmd.spawn().expect("spawn weed"));
        let probe = S3Root::open_with(&self.location("ready", ""), credentials()).expect("client");
        let port = self.s3_port;
        let ready = crate::util::wait_for(Duration::from_secs(90), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok() && probe.probe().is_ok()
        });
        assert!(
            ready,
            "SeaweedFS at {} did not accept a write within 90 s; last log lines:\n{}",
            self.endpoint,
            self.log_tail()
        );
        eprintln!(
            "own SeaweedFS at {} ready after {:.1} s",
            self.endpoint,
            started.elapsed().as_secs_f64()
        );
    }

    /// Sends `sig` (SIGTERM: a clean shutdown; SIGKILL: a crash) to the
    /// server and reaps it: its S3 port refuses connections from here on.
    pub fn stop(&mut self, sig: libc::c_int) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        crate::util::signal(child.id(), sig);
        if crate::util::wait_exit(&mut child, Duration::from_secs(30)).is_none() {
            eprintln!("SeaweedFS ignored signal {sig} for 30 s; killed");
        }
    }

    /// The last lines of the server's log, newest first.
    pub fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("weed.log")).unwrap_or_default();
        log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop(libc::SIGKILL);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A proxy in front of the server that strips `If-None-Match` and
/// `If-Match` from every request: a server that accepts the conditional
/// headers and ignores them, as several do. Returns its endpoint. The
/// headers are signed, so clients of the proxy send unsigned requests
/// ([`unsigned_root`]; the server lets anonymous users read and write).
pub fn header_stripping_proxy(upstream: &str) -> String {
    let upstream = upstream
        .strip_prefix("http://")
        .expect("an http endpoint")
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let port = listener.local_addr().expect("proxy address").port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    return;
                };
                let (Ok(mut client_back), Ok(mut server_back)) =
                    (client.try_clone(), server.try_clone())
                else {
                    return;
                };
                // Responses go back untouched.
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut server_back, &mut client_back);
                    let _ = client_back.shutdown(std::net::Shutdown::Both);
                });
                let _ = forward_requests(client, server);
            });
        }
    });
    format!("http://127.0.0.1:{port}")
}

/// Copies HTTP/1.1 requests from `client` to `server`, dropping the
/// conditional headers; bodies are copied by `Content-Length`.
fn forward_requests(mut client: TcpStream, mut server: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        // Read one request head.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = client.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut length = 0usize;
        let mut out = String::new();
        for line in head.split("\r\n") {
            let lower = line.to_ascii_lowercase();
            if lower.starts_with("if-none-match:") || lower.starts_with("if-match:") {
                continue;
            }
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            out.push_str(line);
            out.push_str("\r\n");
        }
        // `head` ended with an empty line; split kept two empty pieces.
        let out = out.trim_end_matches("\r\n").to_owned() + "\r\n\r\n";
        server.write_all(out.as_bytes())?;
        buf.drain(..head_end);
        // The body.
        let mut left = length;
        let take = left.min(buf.len());
        server.write_all(&buf[..take])?;
        buf.drain(..take);
        left -= take;
        while left > 0 {
            let n = client.read(&mut chunk[..left.min(64 * 1024)])?;
            if n == 0 {
                return Ok(());
            }
            server.write_all(&chunk[..n])?;
            left -= n;
        }
    }
}

/// One request that went through a [`RecordingProxy`]: its method and
/// target (path and query), the status of its response, and two numbers
/// from one counter shared by every connection: `started` once the request
/// head arrived (before it is passed on), `answered` once the whole
/// response came back from the server (before the client gets its last
/// byte). A request a client sends only after another's response therefore
/// has a `started` above that one's `answered`.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub method: String,
    pub target: String,
    /// The keys a multi-object delete (`POST ?delete`) names.
    pub deletes: Vec<String>,
    /// The request's `x-amz-checksum-sha256` header, if it has one.
    pub checksum: Option<String>,
    pub status: u16,
    pub started: u64,
    pub answered: u64,
}

/// A proxy in front of a server that passes every request and response on
/// unchanged (so signed requests stay valid) and records each exchange.
pub struct RecordingProxy {
    /// `http://127.0.0.1:PORT` to give clients.
    pub endpoint: String,
    log: std::sync::Arc<Mutex<Vec<Exchange>>>,
    hold: std::sync::Arc<(Mutex<Hold>, std::sync::Condvar)>,
}

/// The requests a [`RecordingProxy`] keeps from the server for now: of
/// `rule`'s method, with its text in their target.
#[derive(Default)]
struct Hold {
    rule: Option<(String, String)>,
    held: usize,
}

impl Hold {
    fn holds(&self, method: &str, target: &str) -> bool {
        self.rule
            .as_ref()
            .is_some_and(|(m, part)| m == method && target.contains(part.as_str()))
    }
}

impl RecordingProxy {
    /// A proxy to `upstream` (`http://HOST:PORT`).
    pub fn start(upstream: &str) -> RecordingProxy {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("an http endpoint")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let clock = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let hold = std::sync::Arc::new((Mutex::new(Hold::default()), std::sync::Condvar::new()));
        let (kept, held) = (log.clone(), hold.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, log, clock) = (upstream.clone(), kept.clone(), clock.clone());
                let hold = held.clone();
                std::thread::spawn(move || {
                    if let Ok(server) = TcpStream::connect(&upstream) {
                        let _ = relay(client, server, &log, &clock, &hold);
                    }
                });
            }
        });
        RecordingProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            log,
            hold,
        }
    }

    /// Keeps every request of `method` whose target holds `part` from the
    /// server until [`RecordingProxy::release`].
    pub fn hold(&self, method: &str, part: &str) {
        let mut h = self.hold.0.lock().unwrap();
        h.rule = Some((method.to_owned(), part.to_owned()));
        h.held = 0;
    }

    /// Waits up to `most` for a request to be held; whether one was.
    pub fn wait_held(&self, most: std::time::Duration) -> bool {
        let (lock, changed) = &*self.hold;
        let h = lock.lock().unwrap();
        let (h, _) = changed
            .wait_timeout_while(h, most, |h| h.held == 0)
            .unwrap();
        h.held > 0
    }

    /// Passes the requests held on, and holds no more.
    pub fn release(&self) {
        let (lock, changed) = &*self.hold;
        lock.lock().unwrap().rule = None;
        changed.notify_all();
    }

    /// Every exchange recorded since the last call, in the order they were
    /// answered.
    pub fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// How the body of an HTTP/1.1 message ends.
enum Body {
    None,
    Length(u64),
    Chunked,
    ToEof,
}

/// Reads one message head (through its empty line); `None` at the end of
/// the stream before it.
fn read_head(from: &mut impl std::io::BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let n = from.read_until(b'\n', &mut head)?;
        if n == 0 {
            return match head.is_empty() {
                true => Ok(None),
                false => Err(std::io::ErrorKind::UnexpectedEof.into()),
            };
        }
        if head.ends_with(b"\r\n\r\n") || head == b"\r\n" {
            return Ok(Some(head));
        }
    }
}

/// The body that follows `head`: by `Content-Length`, chunked, or (a
/// response with neither) to the end of the stream.
fn body_of(head: &[u8], response: bool) -> Body {
    let text = String::from_utf8_lossy(head).to_ascii_lowercase();
    for line in text.split("\r\n") {
        if let Some(v) = line.strip_prefix("transfer-encoding:")
            && v.contains("chunked")
        {
            return Body::Chunked;
        }
        if let Some(v) = line.strip_prefix("content-length:") {
            return Body::Length(v.trim().parse().unwrap_or(0));
        }
    }
    if response { Body::ToEof } else { Body::None }
}

/// Copies one body from `from` to `to`.
fn copy_body(
    from: &mut impl std::io::BufRead,
    to: &mut impl Write,
    body: Body,
) -> std::io::Result<()> {
    match body {
        Body::None => Ok(()),
        Body::Length(n) => {
            let copied = std::io::copy(&mut from.take(n), to)?;
            match copied == n {
                true => Ok(()),
                false => Err(std::io::ErrorKind::UnexpectedEof.into()),
            }
        }
        Body::ToEof => std::io::copy(from, to).map(drop),
        Body::Chunked => loop {
            let mut line = Vec::new();
            from.read_until(b'\n', &mut line)?;
            to.write_all(&line)?;
            let size = String::from_utf8_lossy(&line);
            let size = size.trim().split(';').next().unwrap_or_default();
            let size = u64::from_str_radix(size, 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
            if size == 0 {
                // Trailers, through the empty line.
                loop {
                    let mut trailer = Vec::new();
                    from.read_until(b'\n', &mut trailer)?;
                    to.write_all(&trailer)?;
                    if trailer == b"\r\n" || trailer.is_empty() {
                        return Ok(());
                    }
                }
            }
            copy_body(from, to, Body::Length(size + 2))?;
        },
    }
}

/// Relays the exchanges of one client connection, one at a time (an
/// HTTP/1.1 client sends its next request after the response), recording
/// each.
fn relay(
    client: TcpStream,
    mut server: TcpStream,
    log: &Mutex<Vec<Exchange>>,
    clock: &std::sync::atomic::AtomicU64,
    hold: &(Mutex<Hold>, std::sync::Condvar),
) -> std::io::Result<()> {
    let mut to_client = client.try_clone()?;
    let mut from_client = std::io::BufReader::new(client);
    let mut from_server = std::io::BufReader::new(server.try_clone()?);
    while let Some(head) = read_head(&mut from_client)? {
        let started = clock.fetch_add(1, Ordering::SeqCst);
        let line = String::from_utf8_lossy(&head).into_owned();
        let mut words = line.split_whitespace();
        let method = words.next().unwrap_or_default().to_owned();
        let target = words.next().unwrap_or_default().to_owned();
        let checksum = line.split("\r\n").find_map(|h| {
            let (name, value) = h.split_once(':')?;
            name.eq_ignore_ascii_case("x-amz-checksum-sha256")
                .then(|| value.trim().to_owned())
        });
        let mut body = Vec::new();
        copy_body(&mut from_client, &mut body, body_of(&head, false))?;
        {
            let (lock, changed) = hold;
            let mut h = lock.lock().unwrap();
            if h.holds(&method, &target) {
                h.held += 1;
                changed.notify_all();
                let _h = changed
                    .wait_while(h, |h| h.holds(&method, &target))
                    .unwrap();
            }
        }
        server.write_all(&head)?;
        server.write_all(&body)?;
        let mut deletes = Vec::new();
        if method == "POST" && target.contains("?delete") {
            let body = String::from_utf8_lossy(&body);
            for piece in body.split("<Key>").skip(1) {
                deletes.push(piece.split("</Key>").next().unwrap_or_default().to_owned());
            }
        }
        let mut response = Vec::new();
        let status = loop {
            let head = read_head(&mut from_server)?
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
            let status: u16 = String::from_utf8_lossy(&head)
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            response.extend_from_slice(&head);
            if status != 100 {
                let body = match (method.as_str(), status) {
                    ("HEAD", _) | (_, 204 | 304) => Body::None,
                    _ => body_of(&head, true),
                };
                copy_body(&mut from_server, &mut response, body)?;
                break status;
            }
        };
        let answered = clock.fetch_add(1, Ordering::SeqCst);
        log.lock().unwrap().push(Exchange {
            method,
            target,
            deletes,
            checksum,
            status,
            started,
            answered,
        });
        to_client.write_all(&response)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The bucket, seen through a plain client
// ---------------------------------------------------------------------------

/// One root in a bucket of its own, read and written behind the tool's back.
pub struct Bucket {
    pub location: S3Location,
    pub root: S3Root,
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
}

impl Bucket {
    pub fn new(prefix: &str) -> Bucket {
        Bucket::at(server().location(prefix))
    }

    /// The root at `location`, on the server its endpoint names (the
    /// shared one or an [`OwnServer`]); its bucket is made if need be.
    pub fn at(location: S3Location) -> Bucket {
        let endpoint = location.endpoint.clone().expect("an endpoint");
        let root = S3Root::open_with(&location, credentials()).expect("s3 client");
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region("us-east-1")
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .build()
            .expect("client");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        // The server makes the bucket on its first upload.
        let probe = ".bucket-made";
        root.put_new(probe, &mut &b""[..], None, "test")
            .expect("make the bucket");
        root.delete(probe).expect("delete the probe");
        Bucket {
            location,
            root,
            store,
            rt,
        }
    }

    pub fn get(&self, rel: &str) -> Option<Vec<u8>> {
        use object_store::ObjectStoreExt as _;
        self.rt.block_on(async {
            match self.store.get(&self.root.key(rel)).await {
                Ok(r) => Some(r.bytes().await.expect("body").to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("GET {rel}: {e}"),
            }
        })
    }

    /// Writes `rel` unconditionally, as another tool would; returns its ETag.
    pub fn plant(&self, rel: &str, bytes: &[u8]) -> String {
        use object_store::ObjectStoreExt as _;
        self.rt
            .block_on(self.store.put(&self.root.key(rel), bytes.to_vec().into()))
            .expect("plant an object");
        self.etag(rel).expect("the planted object")
    }

    pub fn etag(&self, rel: &str) -> Option<String> {
        self.root.head(rel).expect("HEAD").map(|h| h.etag.0)
    }

    /// Every key below the root, relative.
    pub fn keys(&self) -> BTreeSet<String> {
        self.root
            .list("")
            .expect("LIST")
            .into_iter()
            .map(|l| l.path)
            .collect()
    }

    /// Ids of the intents under `.distributor-pending/`.
    pub fn pending(&self) -> Vec<String> {
        distributor::s3::protocol::pending_intents(&self.root).expect("LIST pending")
    }

    /// Every key under `.distributor-pending/` (intents, probes, clocks).
    pub fn reserved(&self) -> Vec<String> {
        let listed = self.root.list(".distributor-pending").expect("LIST");
        listed.into_iter().map(|l| l.path).collect()
    }

    /// The catalog object's records by path.
    pub fn recorded(&self) -> BTreeMap<String, Value> {
        let bytes = self.get(".distributor.json").expect("a catalog object");
        let doc: Value = serde_json::from_slice(&bytes).expect("catalog JSON");
        assert_eq!(doc["schema_version"], 4, "{doc}");
        crate::util::records(&doc)
    }

    /// Every record's object holds exactly the recorded bytes.
    #[track_caller]
    pub fn assert_records_match_objects(&self) -> BTreeMap<String, Value> {
        let records = self.recorded();
        for (path, r) in &records {
            let bytes = self
                .get(path)
                .unwrap_or_else(|| panic!("{path} is recorded but has no object"));
            assert_eq!(r["sha256"], sha256(&bytes), "{path}: record {r}");
            assert_eq!(r["size"], bytes.len() as u64, "{path}: record {r}");
        }
        records
    }
}

/// `weed ARGS` in `dir`, its output into `log`, killed by the kernel when
/// the thread that spawns it goes away (`PR_SET_PDEATHSIG`).
fn weed_command(weed: &Path, args: &[String], dir: &Path, log: fs::File) -> Command {
    let mut cmd = Command::new(weed);
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map(Stdio::from).unwrap_or(Stdio::null()))
        .stderr(Stdio::from(log));
    // SAFETY: prctl is async-signal-safe; nothing else runs here.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}
