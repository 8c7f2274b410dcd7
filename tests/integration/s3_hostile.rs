//! s3 destinations on hostile or dead endpoints, served by tiny HTTP
//! servers on a real socket in the test: one that refuses every request
//! with 403 `SignatureDoesNotMatch` and echoes the signed request (session
//! token and key id included, as AWS does), and one that accepts
//! connections and never answers. Errors must say what happened without
//! anything the server sent, and nothing may wait on a dead endpoint longer
//! than one connection attempt or one request without progress.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::util::{Output, Test, TestCommand};

const KEY_ID: &str = "AKIAHOSTILEKEYID7Q3Z";
const SECRET: &str = "hostileSecretAccessKey/9f8e7d6c5b4a3z2y1x0w";
const TOKEN: &str = "FwoGZXIvYXdzEHostileSessionToken0123456789abcdefSECRETTOKEN";
const BUCKET: &str = "hostile-bucket";

/// Reads one HTTP request (head and a `Content-Length` body); false at the
/// end of the connection.
fn read_request(stream: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return false,
        }
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).is_ok()
}

/// A server answering every request `403 SignatureDoesNotMatch`, its body
/// echoing the canonical request with the session token and the key id,
/// and a response header carrying the token too. Returns its endpoint and
/// the number of requests it answered.
fn refusing_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let count = count.clone();
            std::thread::spawn(move || {
                while read_request(&mut stream) {
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = format!(
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>\
                         <Message>The request signature we calculated does not match the signature you provided.</Message>\
                         <AWSAccessKeyId>{KEY_ID}</AWSAccessKeyId>\
                         <CanonicalRequest>GET\n/{BUCKET}/site/.distributor.json\n\nhost:127.0.0.1\n\
                         x-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:20260604T115500Z\n\
                         x-amz-security-token:{TOKEN}\n\nhost;x-amz-content-sha256;x-amz-date;x-amz-security-token\nUNSIGNED-PAYLOAD</CanonicalRequest>\
                         <StringToSign>AWS4-HMAC-SHA256 {SECRET}</StringToSign></Error>"
                    );
                    let answer = format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nx-amz-request-id: {TOKEN}\r\nx-amz-id-2: {KEY_ID}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, answered)
}

/// A server that accepts connections and never answers (it keeps reading
/// whatever arrives). Returns its endpoint and the number of connections
/// it accepted.
fn silent_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut sink = [0u8; 8192];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            });
        }
    });
    (endpoint, accepted)
}

/// A test folder whose pipeline `reports` publishes to `BUCKET` below
/// `site` at `endpoint`, with a bundle `rep.1`.
fn s3_test(endpoint: &str) -> (Test, std::path::PathBuf) {
    let t = Test::new();
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: web
        backend: s3
        bucket: {BUCKET}
        path: site
        endpoint: {endpoint}
        workflow: additive
"
    ));
    let b = t.bundle("rep.1", &[("report.md", "# Report\n")]);
    (t, b)
}

/// `cmd` with the test's credentials in its environment.
fn with_credentials(cmd: &mut TestCommand) -> &mut TestCommand {
    cmd.env("AWS_ACCESS_KEY_ID", KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_SESSION_TOKEN", TOKEN)
}

fn run(t: &Test, args: &[&str]) -> TestCommand {
    let mut cmd = t.cmd();
    with_credentials(&mut cmd)
        .args(["--config", "config.yaml"])
        .args(args);
    cmd
}

#[track_caller]
fn assert_no_credentials(what: &str, text: &str) {
    for secret in [KEY_ID, SECRET, TOKEN] {
        assert!(!text.contains(secret), "{what} reveals {secret:?}:\n{text}");
    }
}

#[track_caller]
fn assert_names(what: &str, text: &str, endpoint: &str, words: &[&str]) {
    for want in [endpoint, BUCKET].iter().chain(words) {
        assert!(text.contains(want), "{what}: no {want:?} in:\n{text}");
    }
}

/// Every text a failed bundle's folder holds.
fn folder_text(dir: &Path) -> String {
    let mut out = String::new();
    for entry in fs::read_dir(dir).expect("read bundle folder") {
        let path = entry.unwrap().path();
        if path.is_file() {
            out.push_str(&String::from_utf8_lossy(&fs::read(&path).unwrap()));
        }
    }
    out
}

/// A server that refuses the credentials and echoes them back: `run
/// --json`, `agent --once` (its log and the result file in `failed/`) and
/// `status` (text and JSON) say "access denied (HTTP 403)" naming the
/// endpoint, bucket and operation, and none of them shows the key id, the
/// secret or the session token. The bundle fails at once, without retries.
#[test]
fn s3_errors_never_reveal_the_credentials_a_server_echoes() {
    let (endpoint, answered) = refusing_server();
    let (t, b) = s3_test(&endpoint);

    let out = run(&t, &["run", "--json", "--pipeline", "reports"])
        .arg(&b)
        .output();
    assert_ne!(out.code, 0, "{}", out.all());
    assert_no_credentials("run --json", &out.all());
    let dest = out.dest();
    let message = dest["error"].as_str().unwrap_or_default().to_owned();
    assert_names(
        "run --json error",
        &format!("{message}\n{}", out.all()),
        &endpoint,
        &["access denied (HTTP 403)", "PUT"],
    );
    assert!(!message.contains('\n'), "one line: {message}");

    // The agent: the bundle fails at once (a refusal is not retried).
    let inbox = t.spool("reports", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    fs::rename(&b, inbox.join("rep.1")).unwrap();
    let before = answered.load(Ordering::SeqCst);
    let mut once = t.agent_cmd();
    let once: Output = with_credentials(&mut once)
        .args(["agent", "--once"])
        .output();
    assert_no_credentials("agent log", &once.all());
    assert_names("agent log", &once.stderr, &endpoint, &["access denied"]);
    assert!(
        !once.stderr.contains("retrying"),
        "a refusal is not retried:\n{}",
        once.stderr
    );
    let failed = t.spool("reports", "failed").join("rep.1");
    assert!(failed.is_dir(), "rep.1 failed at once:\n{}", once.stderr);
    assert!(!failed.join(".distributor-attempts").exists());
    let result = fs::read_to_string(failed.join(".distributor-result.json"))
        .expect("result file in failed/");
    assert_no_credentials("the result file", &result);
    assert_names("the result file", &result, &endpoint, &["access denied"]);
    assert_no_credentials("the failed bundle's folder", &folder_text(&failed));
    assert!(
        answered.load(Ordering::SeqCst) - before <= 3,
        "one refused request ends the attempt"
    );

    for args in [&["status"][..], &["status", "--json"][..]] {
        let out = run(&t, args).output();
        assert_no_credentials(&format!("{args:?}"), &out.all());
        assert_names(
            &format!("{args:?}"),
            &out.all(),
            &endpoint,
            &["access denied", "GET .distributor.json"],
        );
    }
}

/// An endpoint that accepts connections and never answers: `status`, a
/// `run` of a bundle and a stopping agent, started side by side, each give
/// up after one request without progress (60 s), say "timed out" naming
/// the endpoint, bucket and operation, and exit well before a retry or a
/// longer timeout could have run. Takes about 60 s (the no-progress bound).
#[test]
fn a_silent_s3_endpoint_holds_status_run_and_stop_for_one_timeout_at_most() {
    let (endpoint, accepted) = silent_server();
    let (t, b) = s3_test(&endpoint);
    let (agent_t, agent_b) = s3_test(&endpoint);
    let inbox = agent_t.spool("reports", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    fs::rename(&agent_b, inbox.join("rep.1")).unwrap();

    let mut status = run(&t, &["status"]).start();
    let mut publish = run(&t, &["run", "--json", "--pipeline", "reports"])
        .arg(&b)
        .start();
    let mut agent = agent_t.agent_cmd();
    let mut agent = with_credentials(&mut agent).arg("agent").start();
    // Every process is waiting on the server once it holds three
    // connections; then the agent is told to stop.
    let busy = crate::util::wait_for(Duration::from_secs(30), || {
        accepted.load(Ordering::SeqCst) >= 3
    });
    assert!(
        busy,
        "the agent did not reach the server:\n{}",
        agent.stderr()
    );
    agent.signal(libc::SIGTERM);

    // The deadlines: 60 s without progress, plus start-up and a loaded
    // machine; a longer timeout or a retry would exceed them.
    let status = status.finish(Duration::from_secs(90));
    let publish = publish.finish(Duration::from_secs(90));
    let stopped = agent.finish(Duration::from_secs(90));
    // Each gave up after its one request: no retry reached the server
    // (a longer timeout would have failed `finish` above).
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "the server saw a retry\n{}",
        stopped.stderr
    );

    assert_names(
        "status",
        &status.all(),
        &endpoint,
        &["timed out", "GET .distributor.json"],
    );
    assert_ne!(publish.code, 0, "{}", publish.all());
    assert_names("run", &publish.all(), &endpoint, &["timed out", "PUT"]);
    // The agent was told to stop during its first request (the clean-up
    // of its own unfinished publications, at start).
    assert_eq!(stopped.code, 0, "{}", stopped.stderr);
    assert_names(
        "the agent's log",
        &stopped.stderr,
        &endpoint,
        &["timed out"],
    );
    let kept = ["inbox", "work"]
        .iter()
        .any(|f| agent_t.spool("reports", f).join("rep.1").is_dir());
    assert!(
        kept,
        "the bundle is kept for the next start:\n{}",
        stopped.stderr
    );
    for out in [&status, &publish, &stopped] {
        assert_no_credentials("output", &out.all());
    }
}
