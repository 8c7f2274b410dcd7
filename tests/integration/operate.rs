//! Operating the agent (docs/contract.md §14) through the real binary: `status` and
//! `status --check`, journald priority prefixes, systemd notifications,
//! `config check` run as an unprivileged user, `agent --once` next to a
//! serving agent, and the commands the README and `--help` show.

use crate::util::{BIN, Output, Proc, Test, wait_for, write_file};
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Generous: these waits end as soon as the condition holds.
const WAIT: Duration = Duration::from_secs(30);
/// The uid and gid of `nobody` on Debian and most Linux systems.
const NOBODY: u32 = 65534;

const CONFIG: &str = "spool: ./spool
agent:
  settle: 0s
  rescan_interval: 60s
  lock_timeout: 200ms
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        prefix: \"{source_id}/\"
";

/// A live agent whose stderr is collected; killed on drop.
struct Agent(Proc);

impl Agent {
    fn start(t: &Test, env: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(BIN);
        cmd.current_dir(t.path())
            .env_remove("DISTRIBUTOR_CONFIG")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("JOURNAL_STREAM")
            .env_remove("WATCHDOG_USEC")
            .env("RUST_LOG", "info")
            .args(["--config", "config.yaml", "agent"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Agent(Proc::new(cmd.spawn().expect("spawn agent"), "the agent"))
    }

    fn pid(&self) -> u32 {
        self.0.child.id()
    }

    fn stderr(&self) -> String {
        self.0.stderr()
    }

    /// SIGTERM, then the exit code.
    fn stop(mut self) -> i32 {
        self.0.signal(libc::SIGTERM);
        self.0.finish(WAIT).code
    }
}

fn status_json(t: &Test) -> Value {
    let out = t.run(&["status", "--json"]);
    out.expect_code(0);
    out.json()[0].clone()
}

/// Waits until `status` shows an agent serving pipeline `p`.
#[track_caller]
fn wait_served(t: &Test, agent: &Agent) -> Value {
    let mut last = Value::Null;
    // The agent takes its lock, then writes who it is: between the two,
    // status shows it running with no pid yet.
    let served = wait_for(WAIT, || {
        last = status_json(t);
        last["agent"]["running"] == true && !last["agent"]["pid"].is_null()
    });
    assert!(
        served,
        "status never showed the agent: {last}\n{}",
        agent.stderr()
    );
    last
}

/// Seals `bundles/<name>` and renames it into the inbox of `p`.
fn deliver(t: &Test, name: &str, tamper: bool) {
    let b = t.bundle(name, &[("a.txt", "sealed\n")]);
    if tamper {
        // Same size, other bytes: complete, so claimed and refused.
        fs::write(b.join("a.txt"), "SEALED\n").unwrap();
    }
    let inbox = t.mkdir("spool/p/inbox");
    fs::rename(&b, inbox.join(name)).unwrap();
}

#[test]
fn status_shows_the_serving_agent_last_success_and_failure_and_check_says_what_is_wrong() {
    let t = Test::new();
    t.config(CONFIG);

    // Nobody serves the pipeline yet.
    let doc = status_json(&t);
    assert_eq!(
        doc["agent"],
        serde_json::json!({"running": false, "pid": null, "since": null})
    );
    let out = t.run(&["status", "--check"]);
    out.expect_code(1);
    assert!(
        out.stdout.contains("pipeline p: no agent serves it"),
        "{}",
        out.all()
    );

    let agent = Agent::start(&t, &[]);
    let doc = wait_served(&t, &agent);
    assert_eq!(doc["agent"]["pid"], u64::from(agent.pid()));
    let since = doc["agent"]["since"].as_str().expect("since is a time");
    assert!(since.ends_with('Z') && since.contains('T'), "{since}");
    let out = t.run(&["status", "--check"]);
    out.expect_code(0);
    assert!(out.stdout.starts_with("ok:"), "{}", out.all());
    let out = t.run(&["status"]);
    out.expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("agent: serving (pid {}", agent.pid())),
        "{}",
        out.stdout
    );

    deliver(&t, "good", false);
    assert!(
        wait_for(WAIT, || status_json(&t)["last_success"]["name"] == "good"),
        "{}",
        agent.stderr()
    );
    deliver(&t, "bad", true);
    assert!(
        wait_for(WAIT, || status_json(&t)["last_failure"]["name"] == "bad"),
        "{}",
        agent.stderr()
    );
    let doc = status_json(&t);
    assert_eq!(
        (doc["done"].as_u64(), doc["failed"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(doc["last_success"]["modified"].is_string(), "{doc}");
    let out = t.run(&["status", "--check"]);
    out.expect_code(1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line per problem: {}", out.stdout);
    assert!(
        lines[0].starts_with("pipeline p: 1 bundle(s) in") && lines[0].contains("bad"),
        "{}",
        out.stdout
    );
    let out = t.run(&["status", "--check", "--json"]);
    out.expect_code(1);
    assert_eq!(out.json()["ok"], false);

    assert_eq!(agent.stop(), 0);
    assert_eq!(status_json(&t)["agent"]["running"], false);
}

#[test]
fn status_check_reports_an_inbox_entry_older_than_incomplete_timeout() {
    let t = Test::new();
    t.config(&CONFIG.replace("agent:\n", "agent:\n  incomplete_timeout: 3s\n"));
    // Served by nobody, so "no agent" is a problem too; look for the others.
    // An entry's age is the time since anything in it changed (its change
    // time, which neither a producer nor rsync can set back), so "stuck" is
    // made old by waiting until status says so.
    let stuck = t.mkdir("spool/p/inbox/stuck");
    assert!(
        wait_for(Duration::from_secs(60), || t
            .run(&["status", "--check"])
            .stdout
            .contains("has waited in the inbox")),
        "stuck never reported"
    );
    let fresh = t.mkdir("spool/p/inbox/fresh");
    assert!(fresh.is_dir());
    let out = t.run(&["status", "--check"]);
    out.expect_code(1);
    let waiting: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("has waited in the inbox"))
        .collect();
    assert_eq!(waiting.len(), 1, "{}", out.stdout);
    assert!(
        waiting[0].contains(stuck.to_str().unwrap())
            && waiting[0].contains("incomplete_timeout 3s"),
        "{}",
        out.stdout
    );
}

/// Runs the binary with `args` as uid/gid 65534 (needs root).
fn as_nobody(t: &Test, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(t.path())
        .env_remove("DISTRIBUTOR_CONFIG")
        .env("RUST_LOG", "warn")
        .args(["--config", "config.yaml"])
        .args(args)
        .stdin(Stdio::null())
        .uid(NOBODY)
        .gid(NOBODY);
    let out = cmd.output().expect("run as nobody");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn config_check_as_the_service_user_warns_about_folders_it_cannot_write() {
    if !is_root() {
        eprintln!("skipped: needs root to run config check as uid {NOBODY}");
        return;
    }
    let t = Test::new();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: site
        path: ./srv/www/site
      - id: mine
        path: ./mine
",
    );
    fs::create_dir(t.join("srv")).unwrap(); // root's, 0755
    let mine = t.mkdir("mine");
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();

    let out = as_nobody(&t, &["config", "check"]);
    out.expect_code(0);
    let warnings: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.contains("is not writable"))
        .collect();
    let site = t.join("srv/www/site");
    let site_line = warnings
        .iter()
        .find(|l| l.contains("root of destination site"))
        .unwrap_or_else(|| panic!("no warning for the site root:\n{}", out.stdout));
    assert!(
        site_line.contains(&format!(
            "its parent {} is not writable",
            t.join("srv").display()
        )) && site_line.contains(&format!("-m 0755 {}", site.display()))
            && site_line.contains("install -d -o "),
        "{site_line}"
    );
    assert!(
        warnings
            .iter()
            .any(|l| l.starts_with("warning: spool of pipeline p")),
        "{}",
        out.stdout
    );
    assert!(
        !warnings.iter().any(|l| l.contains("destination mine")),
        "a root the user owns is writable:\n{}",
        out.stdout
    );

    let out = as_nobody(&t, &["config", "check", "--strict"]);
    out.expect_code(2);
    let out = as_nobody(&t, &["config", "check", "--json"]);
    out.expect_code(0);
    let doc = out.json();
    let fixes: Vec<String> = doc["not_writable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["fix"].as_str().unwrap().to_owned())
        .collect();
    let user = fixes[0].split_whitespace().nth(3).unwrap().to_owned();
    assert!(user == "nobody" || user == NOBODY.to_string(), "{fixes:?}");
    assert!(
        fixes.contains(&format!(
            "install -d -o {user} -g {} -m 0755 {}",
            fixes[0].split_whitespace().nth(5).unwrap(),
            site.display()
        )),
        "{fixes:?}"
    );

    // As root everything is writable: no warning.
    let out = t.run(&["config", "check"]);
    out.expect_code(0);
    assert!(!out.stdout.contains("is not writable"), "{}", out.stdout);
}

#[test]
fn status_as_a_user_outside_the_group_names_the_folder_and_the_fix() {
    if !is_root() {
        eprintln!("skipped: needs root to run status as uid {NOBODY}");
        return;
    }
    let t = Test::new();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    t.config(CONFIG);
    let spool = t.mkdir("spool/p/inbox");
    fs::set_permissions(t.join("spool"), fs::Permissions::from_mode(0o750)).unwrap();
    assert!(spool.exists());

    let out = as_nobody(&t, &["status"]);
    out.expect_code(1);
    let text = out.all();
    for want in [
        t.join("spool").to_str().unwrap(),
        "Permission denied",
        "mode 0750",
        "join group root",
        "install.md",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    let out = as_nobody(&t, &["status", "--check"]);
    out.expect_code(1);
    assert!(out.stdout.contains("Permission denied"), "{}", out.all());
}

/// A producer (who may write the inbox, not read the agent's folders, and
/// must not join group `distributor`, docs/security.md) gets the
/// producer's view from `status` and `spool list`: its inbox, each entry
/// with why it waits, and where the rest is, not a fix that makes it an
/// operator.
#[test]
fn status_and_spool_list_as_a_producer_show_the_inbox() {
    if !is_root() {
        eprintln!("skipped: needs root to run status as uid {NOBODY}");
        return;
    }
    let t = Test::new();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    t.config(CONFIG);
    // As the agent sets it up (root here, the agent's user in a real
    // install): the pipeline folders passable, the inbox the producers'
    // group's (nogroup here), the rest closed.
    t.run(&["agent", "--once"]).expect_code(0);
    for folder in ["spool", "spool/p"] {
        fs::set_permissions(t.join(folder), fs::Permissions::from_mode(0o711)).unwrap();
    }
    let inbox = t.join("spool/p/inbox");
    std::os::unix::fs::chown(&inbox, None, Some(NOBODY)).unwrap();
    fs::set_permissions(&inbox, fs::Permissions::from_mode(0o1770)).unwrap();
    fs::create_dir(inbox.join("half")).unwrap();
    std::os::unix::fs::chown(inbox.join("half"), Some(NOBODY), Some(NOBODY)).unwrap();

    let out = as_nobody(&t, &["status"]);
    out.expect_code(0);
    for want in [
        "pipeline p: inbox 1",
        "half (",
        "no_manifest",
        "note: you can drop bundles into",
    ] {
        assert!(out.stdout.contains(want), "{want:?} in:\n{}", out.all());
    }
    assert!(!out.all().contains("join group"), "{}", out.all());
    let json = as_nobody(&t, &["status", "--json"]);
    json.expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(doc[0]["view"], "producer", "{doc}");
    assert_eq!(doc[0]["inbox_entries"][0]["name"], "half", "{doc}");

    let list = as_nobody(&t, &["spool", "list"]);
    list.expect_code(0);
    assert!(list.stdout.contains("half"), "{}", list.all());
    assert!(
        list.stderr.contains("only its inbox is listed"),
        "{}",
        list.all()
    );
}

#[test]
fn under_journald_every_line_has_a_priority_and_no_timestamp() {
    let t = Test::new();
    t.config(CONFIG);
    deliver(&t, "good", false);
    deliver(&t, "bad", true);
    let mut cmd = t.cmd();
    cmd.args(["--config", "config.yaml", "agent", "--once"])
        .env("RUST_LOG", "info")
        .env("JOURNAL_STREAM", "8:12345");
    let out = cmd.output();
    out.expect_code(1);
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let prio = line.get(..3).unwrap_or_default();
        assert!(
            ["<3>", "<4>", "<6>", "<7>"].contains(&prio),
            "no priority prefix: {line}\n{}",
            out.stderr
        );
        assert!(!line.contains("[20"), "a timestamp of its own: {line}");
    }
    let failed = lines
        .iter()
        .find(|l| l.contains("bundle=bad failed"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(
        failed.starts_with("<3>agent::process: pipeline=p bundle=bad failed at verify"),
        "{failed}"
    );
    assert!(!failed.contains("  "), "no empty field: {failed}");
    let done = lines
        .iter()
        .find(|l| l.contains("bundle=good done"))
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(done.starts_with("<6>agent::process: "), "{done}");
}

#[test]
fn under_systemd_the_agent_says_ready_keeps_the_watchdog_fed_and_says_stopping() {
    let t = Test::new();
    t.config(CONFIG);
    let path = t.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let agent = Agent::start(
        &t,
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut seen = Vec::new();
    let recv = |until: &str, seen: &mut Vec<String>| {
        let mut buf = [0u8; 4096];
        while !seen.iter().any(|m: &String| m.lines().any(|l| l == until)) {
            let n = socket
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {until} ({e}); got {seen:?}\n{}", agent.stderr()));
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    };
    recv("READY=1", &mut seen);
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=serving ") && l.contains("of 1 pipeline(s)")),
        "{ready:?}"
    );
    recv("WATCHDOG=1", &mut seen);
    assert_eq!(status_json(&t)["agent"]["running"], true);

    agent.0.signal(libc::SIGTERM);
    recv("STOPPING=1", &mut seen);
    drop(agent);
}

/// A reload systemd can follow: `RELOADING=1` (with `MONOTONIC_USEC=`) when
/// SIGHUP comes, `READY=1` when it is over. A refused one says so in
/// `STATUS=` (and keeps saying it) until a reload succeeds, and the
/// metrics file says it too.
#[test]
fn under_systemd_a_refused_reload_is_reported_until_one_succeeds() {
    let t = Test::new();
    let config = CONFIG.replace(
        "  lock_timeout: 200ms\n",
        "  lock_timeout: 200ms\n  metrics_file: ./metrics.prom\n",
    );
    t.config(&config);
    let path = t.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let agent = Agent::start(&t, &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    // The next message with `line` among its lines.
    let next_with = |line: &str, seen: &mut Vec<String>| -> String {
        let mut buf = [0u8; 4096];
        loop {
            let n = socket
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no {line} ({e}); got {seen:?}\n{}", agent.stderr()));
            let message = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.push(message.clone());
            if message.lines().any(|l| l == line) {
                return message;
            }
        }
    };
    let mut seen = Vec::new();
    next_with("READY=1", &mut seen);

    t.config("pipelines: [{id: p}\n");
    agent.0.signal(libc::SIGHUP);
    let reloading = next_with("RELOADING=1", &mut seen);
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{reloading:?}"
    );
    let refused = next_with("READY=1", &mut seen);
    assert!(
        refused
            .lines()
            .any(|l| l.starts_with("STATUS=config reload refused, serving the old config (")),
        "{refused:?}"
    );
    let metrics = |t: &Test| fs::read_to_string(t.join("metrics.prom")).unwrap_or_default();
    assert!(
        crate::util::wait_for(WAIT, || {
            metrics(&t).contains("\ndistributor_config_last_reload_successful 0\n")
        }),
        "{}",
        metrics(&t)
    );

    t.config(&config);
    agent.0.signal(libc::SIGHUP);
    next_with("RELOADING=1", &mut seen);
    let ready = next_with("READY=1", &mut seen);
    assert!(
        ready.lines().any(|l| l.starts_with("STATUS=serving ")),
        "{ready:?}"
    );
    assert!(
        crate::util::wait_for(WAIT, || {
            metrics(&t).contains("\ndistributor_config_last_reload_successful 1\n")
        }),
        "{}",
        metrics(&t)
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn once_next_to_a_serving_agent_says_the_pipeline_was_skipped_and_exits_1() {
    let t = Test::new();
    t.config(CONFIG);
    let agent = Agent::start(&t, &[]);
    wait_served(&t, &agent);
    let mut cmd = t.cmd();
    cmd.args(["--config", "config.yaml", "agent", "--once"])
        .env("RUST_LOG", "info");
    let out = cmd.output();
    out.expect_code(1);
    assert!(
        out.stderr
            .contains("0 done, 0 failed, 1 pipeline skipped (another agent serves it)"),
        "{}",
        out.stderr
    );
    assert_eq!(agent.stop(), 0);
}

#[test]
fn agent_start_config_errors_are_logged_under_the_config_target() {
    let t = Test::new();
    t.config("agent:\n  settle: soon\n");
    let mut cmd = t.cmd();
    cmd.args(["--config", "config.yaml", "agent", "--once"]);
    let out = cmd.output();
    out.expect_code(2);
    assert!(
        out.stderr.contains("distributor::config]"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("cli::publishing"), "{}", out.stderr);
}

/// Copies the checkout's `spool-example/` (without `var/`) into `to`.
fn copy_example(to: &Path) {
    fn copy(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name == "var" {
                continue;
            }
            let (src, dst) = (e.path(), to.join(&name));
            if e.file_type().unwrap().is_dir() {
                copy(&src, &dst);
            } else {
                fs::copy(&src, &dst).unwrap();
            }
        }
    }
    copy(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("spool-example"),
        &to.join("spool-example"),
    );
    let bin = to.join("target/debug/distributor");
    fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(BIN, bin).unwrap();
}

#[test]
fn the_help_example_names_files_that_exist_and_runs() {
    let t = Test::new();
    let out = t.run(&["--help"]);
    out.expect_code(0);
    let example = out
        .stdout
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with("distributor --config spool-example/")
        })
        .unwrap_or_else(|| panic!("no example in --help:\n{}", out.stdout));
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let args: Vec<&str> = example.split_whitespace().skip(1).collect();
    for path in args.iter().filter(|a| a.starts_with("spool-example/")) {
        assert!(
            repo.join(path).exists(),
            "--help names {path}, which does not exist"
        );
    }
    copy_example(t.path());
    let mut cmd = t.cmd();
    cmd.args(&args);
    cmd.output().expect_code(0);
}

#[test]
fn the_readme_commands_for_a_running_agent_work_as_written() {
    let readme =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme
        .find("To leave the agent running on the example")
        .expect("README section");
    let block = readme[start..]
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap();
    assert!(
        block.contains("agent &") && block.contains("kill %1"),
        "{block}"
    );
    let t = Test::new();
    copy_example(t.path());
    // `cargo build` is what the test binary already did; the file that is
    // "published a moment later" is waited for rather than read at once.
    let script: String = block
        .lines()
        .map(|l| {
            if l.starts_with("cargo build") {
                ":".to_owned()
            } else if l.starts_with("cat ") {
                let file = l.split_whitespace().nth(1).unwrap();
                format!("for _ in $(seq 300); do [ -e {file} ] && break; sleep 0.1; done; {l}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    write_file(
        &t.join("readme.sh"),
        format!("set -e\ntrap 'kill %1 2>/dev/null || true' EXIT\n{script}\nwait %1\n").as_bytes(),
    );
    let mut cmd = Command::new("bash");
    cmd.arg("readme.sh")
        .current_dir(t.path())
        .env("RUST_LOG", "warn");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        script,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Everything is fine."), "{stdout}");
    assert!(stdout.contains("agent: serving"), "{stdout}");
}

#[test]
fn the_config_docs_examples_differ_exactly_in_the_values_they_say_are_not_defaults() {
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md")).unwrap();
    let blocks: Vec<&str> = doc
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    let t = Test::new();
    let summary = |name: &str, yaml: &str| {
        t.write(name, yaml);
        let mut cmd = t.cmd();
        let out = cmd.args(["--config", name, "config", "check"]).output();
        out.expect_code(0);
        out.stdout
            .lines()
            .filter(|l| !l.starts_with("config file:"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (full, small) = (
        summary("full.yaml", blocks[0]),
        summary("small.yaml", blocks[1]),
    );
    assert_eq!(full.len(), small.len(), "{full:?}\n{small:?}");
    let differing: Vec<String> = full
        .iter()
        .zip(&small)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.trim().split(':').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        differing,
        ["inbox", "prefix", "base_url", "prune"],
        "{full:?}"
    );
    // ... and the text names exactly those.
    let para = doc
        .split("\n\n")
        .find(|p| p.contains("are not defaults"))
        .expect("the paragraph after the example");
    for key in [
        "`inbox`",
        "`prefix`",
        "`links.base_url`",
        "`retention.prune`",
    ] {
        assert!(para.contains(key), "{key} in {para}");
    }
}

#[test]
fn a_bundle_that_takes_long_logs_its_progress_every_10s() {
    // The root's lock is held by "an operator" for longer than 10 s, so the
    // bundle in hand is still unfinished when the first progress line is
    // due; then the lock goes and the bundle is published.
    let t = Test::new();
    t.config(&CONFIG.replace("lock_timeout: 200ms", "lock_timeout: 60s"));
    let www = t.mkdir("www");
    let lock = fs::File::create(www.join(".distributor.lock")).unwrap();
    lock.lock().unwrap();
    let agent = Agent::start(&t, &[]);
    let b = t.bundle("slow", &[("a.txt", "0123456789")]);
    let inbox = t.mkdir("spool/p/inbox");
    fs::rename(&b, inbox.join("slow")).unwrap();
    assert!(
        wait_for(Duration::from_secs(60), || agent.stderr().contains(
            "bundle=slow still working after 10s: 0 of 1 files and 0 bytes of 10 bytes read"
        )),
        "no progress line:\n{}",
        agent.stderr()
    );
    // status shows the bundle in hand.
    let status = status_json(&t);
    assert_eq!(status["in_hand"][0]["name"], "slow", "{status}");
    let text = t.run(&["status"]);
    assert!(
        text.stdout
            .contains("  in hand: slow (its folder in work/ last changed "),
        "{}",
        text.stdout
    );
    lock.unlock().unwrap();
    assert!(
        wait_for(WAIT, || t.join("spool/p/done/slow").is_dir()),
        "{}",
        agent.stderr()
    );
    assert_eq!(agent.stop(), 0);
}

/// Commands whose reader has gone (`distributor status | true`, `spool
/// list | head`) end as Unix tools do, killed by SIGPIPE, with no panic or
/// backtrace. Standard output here is a pipe whose reading end is closed
/// before the command starts, so every write meets it closed.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let t = Test::new();
    t.config(CONFIG);
    t.run(&["agent", "--once"]).expect_code(0);
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["spool", "list"],
        &["config", "check", "--json"],
    ] {
        let (read, write) = std::io::pipe().expect("a pipe");
        drop(read);
        let out = Command::new(BIN)
            .current_dir(t.path())
            .env_remove("DISTRIBUTOR_CONFIG")
            .env("RUST_BACKTRACE", "1")
            .args(["--config", "config.yaml"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped())
            .output()
            .expect("run distributor");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?} did not end by SIGPIPE ({:?}):\n{stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "{args:?} said:\n{stderr}");
    }
}

/// Two pipelines share a root: each destination's line in `status` says
/// how many of the root's outputs are its own, not the whole root's count
/// as if they were.
#[test]
fn status_counts_each_destinations_own_outputs_in_a_shared_root() {
    let t = Test::new();
    t.config(
        "spool: ./spool
pipelines:
  - id: p
    destinations:
      - id: d
        path: ./www
        scope: [\"p/\"]
  - id: q
    destinations:
      - id: d
        path: ./www
        scope: [\"q/\"]
",
    );
    let a = t.bundle("a", &[("p/one.txt", "1\n")]);
    t.publish("p", &a, &[]).expect_code(0);
    let b = t.bundle("b", &[("q/one.txt", "1\n"), ("q/two.txt", "2\n")]);
    t.publish("q", &b, &[]).expect_code(0);
    let json = t.run(&["status", "--json"]).json();
    let p = &json[0]["destinations"][0];
    assert_eq!(
        (p["owned"].as_u64(), p["outputs"].as_u64()),
        (Some(1), Some(3)),
        "{json}"
    );
    let text = t.run(&["status"]).stdout;
    assert!(
        text.contains("1 output of its own (3 in the root)"),
        "{text}"
    );
    assert!(
        text.contains("2 outputs of its own (3 in the root)"),
        "{text}"
    );
}
