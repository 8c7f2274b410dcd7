//! Hooks after publication (docs/contract.md §19; docs/hooks.md): a
//! destination's `hooks.after_publish` command runs once per bundle whose
//! publication changed that destination, after its catalog is durable, and
//! reads on its standard input what changed. The publication stands
//! whatever the hook does; how it ended goes into the bundle's result.
//!
//! The command runs without a shell, in a session of its own (no
//! controlling terminal; a timeout kills its whole process group), with
//! `/` as working folder, only stdin, stdout and stderr open (every other
//! descriptor of the agent is close-on-exec), and an environment of a few
//! locale and path variables: the agent's own (object-store credentials
//! among them) are never passed on.

use crate::config::{Destination, Hooks, Pipeline};
use crate::paths::RelPath;
use crate::report::{DestinationReport, HookReport, RunReport};
use crate::runtime::interrupt::Cancel;
use serde::Serialize;
use std::io::{self, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most bytes of a hook's output (stdout and stderr together) kept.
pub const OUTPUT_KEPT: usize = 4096;
/// The variables of the agent's environment a hook gets; nothing else.
const PASSED_ON: [&str; 6] = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ"];
/// How long to wait for the rest of the output once the hook has ended (a
/// child it left behind may hold the pipe open).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);
/// How often a running hook is checked for the agent's stop.
const STOP_POLL: Duration = Duration::from_millis(100);

/// What a hook reads on its standard input (docs/contract.md §19.1).
#[derive(Serialize)]
struct Input<'a> {
    pipeline_id: &'a str,
    destination_id: &'a str,
    root: &'a str,
    bundle: &'a str,
    source: &'a crate::report::SourceReport,
    action: &'a str,
    writes: Vec<&'a str>,
    deletes: &'a [String],
    urls: Vec<String>,
}

/// A hook a publication owes: the destination whose `after_publish`
/// runs, and the exact document it reads. The agent records what it owes
/// with the commit and clears it once the hook ran, so that a crash
/// between the two runs it at the next start (at least once,
/// docs/contract.md §19.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Owed {
    pub destination_id: String,
    /// The JSON document of docs/contract.md §19.1.
    pub input: String,
    /// The bundle folder's name, for the log.
    pub bundle: String,
}

/// The hooks `report` owes: one for each destination of `report` whose
/// publication changed something and that has an `after_publish` hook, in
/// the order of the destinations. None for a failed publication or a dry
/// run. `bundle` is the bundle folder's name.
pub fn owed(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    bundle: &str,
    report: &RunReport,
) -> Vec<Owed> {
    if !report.ok || report.dry_run {
        return Vec::new();
    }
    let Some(source) = &report.source else {
        return Vec::new();
    };
    let mut owed = Vec::new();
    for d in &report.destinations {
        let Some(action) = d.action.as_deref().filter(|a| *a != "skip_same") else {
            continue;
        };
        let Some(config) = destinations.iter().find(|c| c.id == d.destination_id) else {
            continue;
        };
        if config.hooks.is_none() {
            continue;
        }
        let writes = changed(d);
        let input = Input {
            pipeline_id: &pipeline.id,
            destination_id: &d.destination_id,
            root: &d.root,
            bundle,
            source,
            action,
            urls: urls(config, &writes),
            writes,
            deletes: &d.deletes,
        };
        owed.push(Owed {
            destination_id: d.destination_id.clone(),
            input: serde_json::to_string(&input).unwrap_or_default(),
            bundle: bundle.to_owned(),
        });
    }
    owed
}

/// Runs the hooks of `owed`, in order, each with the `after_publish`
/// command and timeout its destination has now, and says how each ended.
/// A destination that no longer has a hook (or is gone from the
/// pipeline) is logged and skipped. A hook still running once `cancel`
/// is abandoned is killed, and says it was stopped.
pub fn run_owed(
    pipeline: &Pipeline,
    destinations: &[&Destination],
    owed: &[Owed],
    cancel: &Cancel,
) -> Vec<HookReport> {
    let mut ran = Vec::new();
    for o in owed {
        let hooks = destinations
            .iter()
            .find(|c| c.id == o.destination_id)
            .and_then(|c| c.hooks.as_ref());
        let Some(hooks) = hooks else {
            log::warn!(
                "pipeline={} bundle={} destination={}: a hook was owed, but the destination has no after_publish hook any more; it is not run",
                pipeline.id,
                crate::text::escape::inert(&o.bundle),
                o.destination_id
            );
            continue;
        };
        let run = run(hooks, o.input.as_bytes(), &o.destination_id, cancel);
        log_run(&pipeline.id, &o.bundle, hooks, &run);
        ran.push(run);
    }
    ran
}

/// The paths a publication wrote that did not already hold those bytes
/// (a set lookup each: a large tree keeps tens of thousands unchanged).
fn changed(d: &DestinationReport) -> Vec<&str> {
    let unchanged: std::collections::HashSet<&str> =
        d.unchanged.iter().map(String::as_str).collect();
    d.writes
        .iter()
        .map(String::as_str)
        .filter(|w| !unchanged.contains(w))
        .collect()
}

/// The URL of each of `writes`, when the destination has a `base_url`.
fn urls(config: &Destination, writes: &[&str]) -> Vec<String> {
    let Some(base) = &config.base_url else {
        return Vec::new();
    };
    writes
        .iter()
        .filter_map(|p| RelPath::parse(p).ok())
        .map(|p| crate::plan::output_url(base, &p))
        .collect()
}

fn log_run(pipeline: &str, bundle: &str, hooks: &Hooks, run: &HookReport) {
    let program = crate::text::escape::inert(&hooks.after_publish[0]);
    let bundle = crate::text::escape::inert(bundle);
    match &run.error {
        None => log::info!(
            "pipeline={pipeline} bundle={bundle} destination={}: hook {program} exited 0 in {} ms",
            run.destination_id,
            run.elapsed_ms
        ),
        Some(e) => log::warn!(
            "pipeline={pipeline} bundle={bundle} destination={}: hook {program} {e} after {} ms (the publication stands){}",
            run.destination_id,
            run.elapsed_ms,
            first_line(&run.output)
                .map(|l| format!("; its output begins: {}", crate::text::escape::inert(l)))
                .unwrap_or_default()
        ),
    }
}

fn first_line(output: &str) -> Option<&str> {
    output.lines().find(|l| !l.trim().is_empty())
}

/// Runs one hook with `input` on its standard input.
fn run(hooks: &Hooks, input: &[u8], destination_id: &str, cancel: &Cancel) -> HookReport {
    let started = Instant::now();
    let outcome = spawn_and_wait(hooks, input, cancel);
    let (exit, output, error, stopped) = match outcome {
        Ok(ended) => ended,
        Err(e) => (
            None,
            Vec::new(),
            Some(format!("could not start: {e}")),
            false,
        ),
    };
    HookReport {
        destination_id: destination_id.to_owned(),
        exit,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        output: String::from_utf8_lossy(&output).into_owned(),
        error,
        stopped,
    }
}

/// The exit status, the output kept and why the run failed, if it did.
type Ended = (Option<i32>, Vec<u8>, Option<String>, bool);

/// A file holding `input`, read from its start: a hook's standard input.
/// It is whole before the hook starts, so a hook never reads a part of
/// its document (an agent killed while feeding a pipe left the hook an
/// empty or cut one), and a hook that reads nothing blocks nobody.
fn input_file(input: &[u8]) -> io::Result<std::fs::File> {
    use rustix::fs::{MemfdFlags, SeekFrom, memfd_create, seek};
    let fd = memfd_create("distributor-hook-input", MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(input)?;
    seek(&file, SeekFrom::Start(0))?;
    Ok(file)
}

fn spawn_and_wait(hooks: &Hooks, input: &[u8], cancel: &Cancel) -> io::Result<Ended> {
    let argv = &hooks.after_publish;
    let stdin = input_file(input)?;
    let (mut reader, writer) = io::pipe()?;
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(
            PASSED_ON
                .iter()
                .filter_map(|k| Some((k, std::env::var_os(k)?))),
        )
        .current_dir("/")
        .stdin(Stdio::from(stdin))
        .stdout(writer.try_clone()?)
        .stderr(writer);
    if std::env::var_os("PATH").is_none() {
        command.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    }
    // SAFETY: setsid(2), close_range(2) and fcntl(2) are async-signal-safe
    // and touch no memory of the parent. setsid makes the hook a session
    // and process group leader without a controlling terminal, so the
    // timeout can kill everything it started; marking every descriptor
    // above stderr close-on-exec also drops those the agent itself
    // inherited without it (rustix has no close_range).
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid().map_err(io::Error::from)?;
            // Close-on-exec rather than closed now: std reports a failed
            // exec through a descriptor of its own until the exec.
            if libc::close_range(
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            ) != 0
            {
                for fd in 3..1024 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    // The parent's copies of the output pipe's write end go with `command`,
    // so the reader sees the end of the output when the hook's copies close.
    drop(command);
    let pid = rustix::process::Pid::from_child(&child);

    // The output on a thread of its own: a hook that writes much cannot
    // block the agent.
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    {
        let kept = Arc::clone(&kept);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                        let room = OUTPUT_KEPT.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done_tx.send(());
        });
    }

    let deadline = Instant::now() + hooks.timeout;
    let mut error = None;
    let mut stopped = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        let now = Instant::now();
        let why = if now >= deadline {
            Some(format!(
                "was still running after its timeout of {} and was killed",
                crate::config::format_duration(hooks.timeout)
            ))
        } else if cancel.abandoned() {
            stopped = true;
            Some("was killed because the agent was stopping".to_owned())
        } else {
            None
        };
        if let Some(why) = why {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            let _ = child.wait();
            error = Some(why);
            break None;
        }
        // Wakes at once when the hook ends and closes its output, else at
        // the next check.
        let _ = done_rx.recv_timeout(deadline.saturating_duration_since(now).min(STOP_POLL));
    };
    let _ = done_rx.recv_timeout(OUTPUT_GRACE);
    let output = kept.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let exit = status.and_then(|s| s.code());
    if error.is_none() {
        error = match (exit, status) {
            (Some(0), _) => None,
            (Some(code), _) => Some(format!("exited with status {code}")),
            (None, Some(s)) => Some(format!(
                "was killed by signal {}",
                std::os::unix::process::ExitStatusExt::signal(&s).unwrap_or(0)
            )),
            (None, None) => Some("ended without a status".to_owned()),
        };
    }
    Ok((exit, output, error, stopped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A hook script in a new folder. Its final bytes are written by a
    /// child process (`install`), never through a descriptor of this
    /// process: another test thread forking meanwhile would inherit it
    /// until its child execs, and running the hook would then fail with
    /// "Text file busy".
    fn hooks(script: &str, timeout: Duration) -> (tempfile::TempDir, Hooks) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hook");
        let staged = dir.path().join("hook.staged");
        std::fs::write(&staged, format!("#!/bin/sh\n{script}\n")).unwrap();
        let installed = std::process::Command::new("install")
            .args(["-m", "755"])
            .arg(&staged)
            .arg(&path)
            .status()
            .unwrap();
        assert!(installed.success());
        let h = Hooks {
            after_publish: vec![path.display().to_string()],
            timeout,
        };
        (dir, h)
    }

    #[test]
    fn a_hook_reads_its_input_and_its_output_is_kept_up_to_4_kib() {
        let (_dir, h) = hooks(
            "cat; printf 'on stderr' >&2; head -c 10000 /dev/zero | tr '\\0' x",
            Duration::from_secs(30),
        );
        let r = run(&h, b"{\"writes\":[\"a\"]}", "site", &Cancel::new());
        assert_eq!(r.exit, Some(0), "{r:?}");
        assert_eq!(r.error, None);
        assert_eq!(r.output.len(), OUTPUT_KEPT);
        assert!(
            r.output.starts_with("{\"writes\":[\"a\"]}on stderr"),
            "{r:?}"
        );
    }

    /// The document is whole in a file before the hook starts: larger
    /// than a pipe holds, and not a pipe at all.
    #[test]
    fn a_hook_reads_its_whole_input_from_a_file_filled_before_it_starts() {
        let (_dir, h) = hooks(
            "[ -p /dev/stdin ] && echo pipe || echo file; wc -c",
            Duration::from_secs(30),
        );
        let input = vec![b'x'; 1 << 20];
        let r = run(&h, &input, "site", &Cancel::new());
        assert_eq!(r.exit, Some(0), "{r:?}");
        let lines: Vec<&str> = r.output.lines().map(str::trim).collect();
        assert_eq!(lines, ["file", "1048576"], "{r:?}");
    }

    /// A hook that leaves a child holding its standard input, unread, and
    /// exits: its run ends with the hook (the child still running), and
    /// nothing of the agent waits for the child. The input is larger than a
    /// pipe holds: fed through a pipe, a thread of the agent stayed stuck
    /// writing it until the child exited.
    #[test]
    fn a_child_holding_the_hooks_input_keeps_nothing_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child-pid");
        let (_d, h) = hooks(
            &format!(
                "exec 3<&0; sleep 600 <&3 3<&- >/dev/null 2>&1 & echo $! > {}; exit 0",
                marker.display()
            ),
            Duration::from_secs(30),
        );
        let r = run(&h, &vec![b'x'; 4 << 20], "site", &Cancel::new());
        assert_eq!(r.exit, Some(0), "{r:?}");
        let child: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        assert!(
            stat.split_whitespace().nth(2).is_some_and(|s| s != "Z"),
            "the child {child} still runs, holding the input: {stat}"
        );
        let fd0 = std::fs::read_link(format!("/proc/{child}/fd/0")).unwrap();
        assert!(
            fd0.to_string_lossy()
                .contains("memfd:distributor-hook-input"),
            "{fd0:?}"
        );
        unsafe { libc::kill(child, libc::SIGKILL) };
    }

    /// (action, the destination has a hook, the report ok) -> whether a
    /// hook is owed, and the document it reads.
    #[test]
    fn a_hook_is_owed_for_each_destination_a_publication_changed() {
        let config = crate::config::parse(
            "pipelines:\n  - id: p\n    destinations:\n      - id: site\n        path: /srv/site\n        links:\n          base_url: https://x.example/\n        hooks:\n          after_publish: [\"/bin/true\"]\n      - id: plain\n        path: /srv/plain\n",
            Path::new("/etc/distributor/config.yaml"),
        )
        .unwrap();
        let pipeline = &config.pipelines[0];
        let destinations: Vec<&Destination> = pipeline.destinations.iter().collect();
        let table = [
            ("upsert_additive", "site", true, true),
            ("skip_same", "site", true, false),
            ("upsert_additive", "plain", true, false),
            ("upsert_additive", "site", false, false),
        ];
        for (action, destination, ok, expected) in table {
            let mut report = RunReport::new("p", false);
            report.ok = ok;
            report.source = Some(crate::report::SourceReport {
                id: "s".into(),
                digest: "sha256:00".into(),
                created: "2026-06-04T00:00:00Z".into(),
            });
            report.destinations.push(DestinationReport {
                action: Some(action.into()),
                writes: vec!["a b.html".into(), "same.html".into()],
                unchanged: vec!["same.html".into()],
                deletes: vec!["old.html".into()],
                ..DestinationReport::new(destination, format!("/srv/{destination}"), "additive")
            });
            let owed = owed(pipeline, &destinations, "b1", &report);
            assert_eq!(
                owed.len(),
                usize::from(expected),
                "{action} {destination} {ok}"
            );
            if let Some(o) = owed.first() {
                let doc: serde_json::Value = serde_json::from_str(&o.input).unwrap();
                assert_eq!(o.destination_id, "site");
                assert_eq!(doc["bundle"], "b1");
                assert_eq!(doc["writes"], serde_json::json!(["a b.html"]));
                assert_eq!(
                    doc["urls"],
                    serde_json::json!(["https://x.example/a%20b.html"])
                );
                assert_eq!(doc["deletes"], serde_json::json!(["old.html"]));
                assert_eq!(doc["source"]["id"], "s");
            }
        }
    }

    #[test]
    fn a_hook_hears_only_the_writes_that_changed_bytes() {
        let d = DestinationReport {
            action: Some("upsert_additive".into()),
            writes: vec!["a.html".into(), "b.html".into(), "c d.html".into()],
            unchanged: vec!["b.html".into()],
            ..DestinationReport::new("site", "/srv/site".into(), "additive")
        };
        let writes = changed(&d);
        assert_eq!(writes, ["a.html", "c d.html"]);
        let mut config = crate::config::parse(
            "pipelines:\n  - id: p\n    destinations:\n      - id: site\n        path: /srv/site\n        links:\n          base_url: https://x.example/docs\n",
            Path::new("/etc/distributor/config.yaml"),
        )
        .unwrap();
        let dest = config.pipelines.remove(0).destinations.remove(0);
        assert_eq!(
            urls(&dest, &writes),
            [
                "https://x.example/docs/a.html",
                "https://x.example/docs/c%20d.html"
            ]
        );
    }

    #[test]
    fn a_failing_or_missing_hook_is_reported_not_raised() {
        let (_dir, h) = hooks("echo nope; exit 3", Duration::from_secs(30));
        let r = run(&h, b"{}", "site", &Cancel::new());
        assert_eq!(r.exit, Some(3));
        assert_eq!(r.error.as_deref(), Some("exited with status 3"));
        assert_eq!(r.output, "nope\n");

        let (dir, mut h) = hooks("", Duration::from_secs(30));
        std::fs::remove_file(dir.path().join("hook")).unwrap();
        h.after_publish[0] = dir.path().join("hook").display().to_string();
        let r = run(&h, b"{}", "site", &Cancel::new());
        assert_eq!(r.exit, None);
        assert!(
            r.error.as_deref().unwrap().starts_with("could not start"),
            "{r:?}"
        );
    }

    #[test]
    fn a_hook_past_its_timeout_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("child-pid");
        // The hook starts a child that would outlive it, then hangs.
        let (_d, h) = hooks(
            &format!(
                "sleep 600 & echo $! > {}; echo started; sleep 600",
                marker.display()
            ),
            // Long enough for the shell to start its child on a busy machine.
            Duration::from_secs(3),
        );
        let r = run(&h, b"{}", "site", &Cancel::new());
        assert_eq!(r.exit, None);
        assert!(
            r.error.as_deref().unwrap().contains("timeout of 3s"),
            "{r:?}"
        );
        assert_eq!(r.output, "started\n");
        let child: i32 = std::fs::read_to_string(&marker)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Killed with the group: SIGKILL is delivered as the process next
        // runs, so wait for it to end (gone, or a zombie until init reaps
        // it); a child left alive would sleep on for ten minutes.
        let stat = format!("/proc/{child}/stat");
        let ended = || {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            state.is_empty() || matches!(state.split_whitespace().nth(2), Some("Z" | "X"))
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ended() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            ended(),
            "the hook's child {child} survived: {}",
            std::fs::read_to_string(&stat).unwrap_or_default()
        );
    }

    #[test]
    fn a_hook_gets_only_the_passed_on_variables_no_terminal_and_no_other_descriptor() {
        let (_dir, h) = hooks(
            "env | sort | cut -d= -f1 | tr '\\n' ' '; echo; ls /proc/self/fd | tr '\\n' ' '; echo; ps -o tty= -p $$ 2>/dev/null || cat /proc/self/stat | cut -d' ' -f7",
            Duration::from_secs(30),
        );
        let r = run(&h, b"{}", "site", &Cancel::new());
        assert_eq!(r.exit, Some(0), "{r:?}");
        let names: Vec<&str> = r
            .output
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        assert!(
            names
                .iter()
                .all(|n| PASSED_ON.contains(n) || *n == "PWD" || *n == "SHLVL" || *n == "_"),
            "only the passed-on variables (and the shell's own): {names:?}"
        );
        let fds: Vec<&str> = r
            .output
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect();
        // 0, 1, 2 and the descriptor `ls` opens for the folder itself.
        assert!(fds.len() <= 4, "descriptors: {fds:?}");
        assert!(fds.starts_with(&["0", "1", "2"]), "descriptors: {fds:?}");
        let tty = r.output.lines().nth(2).unwrap().trim();
        assert!(tty == "?" || tty == "0", "controlling terminal: {tty}");
    }
}
