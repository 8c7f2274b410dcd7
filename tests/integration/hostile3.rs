//! The third hostile round (issue: producers are untrusted, third round):
//! a local user with no role, and a producer, each try to stop the agent
//! for everyone. Each runs as another user, with dropped privileges.

use crate::lab::{Lab, NOBODY, OTHER, PRODUCERS, can_switch_users, error_of};
use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

const ONE_ROOT: &str = "spool: ./spool
agent: {settle: 0s, max_attempts: 2}
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
";

/// `flock --nonblock <lock> true` as `uid` in group `gid`: whether that
/// user could take (and so hold) the root's lock.
fn flock_as(lock: &Path, uid: u32, gid: u32) -> std::process::Output {
    Command::new("flock")
        .args(["--nonblock", "--conflict-exit-code", "7"])
        .arg(lock)
        .arg("true")
        .uid(uid)
        .gid(gid)
        .output()
        .expect("run flock (util-linux)")
}

/// A root's lock file is the agent's user's and group's: any other local
/// user can no longer open it, so cannot hold it for ever (flock takes an
/// exclusive lock through a read-only descriptor); an operator in the
/// agent's group still can (docs/contract.md §11.3). A lock file an older
/// version left open to everyone is narrowed at the next lock.
#[test]
fn only_the_agents_user_and_group_may_hold_a_roots_lock() {
    if !can_switch_users("only_the_agents_user_and_group_may_hold_a_roots_lock") {
        return;
    }
    let lab = Lab::new(ONE_ROOT, &["reports"]);
    lab.sealed("b1", &[("a.txt", "1\n")]);
    lab.run(None, &["run", "--pipeline", "reports", "bundles/b1"])
        .expect_code(0);
    let site = lab.join("site");
    fs::set_permissions(&site, fs::Permissions::from_mode(0o755)).unwrap();
    let lock = site.join(".distributor.lock");
    let mode = || fs::metadata(&lock).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode() & 0o007,
        0,
        "created without access for others: {:o}",
        mode()
    );

    let stranger = flock_as(&lock, OTHER, PRODUCERS);
    assert_ne!(
        stranger.status.code(),
        Some(0),
        "a user with no role took the root's lock"
    );
    assert!(
        String::from_utf8_lossy(&stranger.stderr).contains("Permission denied"),
        "{}",
        String::from_utf8_lossy(&stranger.stderr)
    );
    // The agent's group (root's, here) keeps the operator's flock.
    let operator = flock_as(&lock, OTHER, 0);
    assert_eq!(operator.status.code(), Some(0), "{operator:?}");

    // As an older version left it: open to everyone, until the next lock.
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(flock_as(&lock, OTHER, PRODUCERS).status.code(), Some(0));
    let out = lab.run(None, &["run", "--pipeline", "reports", "bundles/b1"]);
    out.expect_code(0);
    assert_eq!(mode(), 0o640, "narrowed at the next lock");
    assert!(
        out.stderr
            .contains("which let any local user hold the root's lock"),
        "{}",
        out.stderr
    );
    assert_ne!(flock_as(&lock, OTHER, PRODUCERS).status.code(), Some(0));
}

/// A producer that takes a file lease on a file of its own bundle (and
/// ignores the lease-break signal) makes the agent's non-blocking open
/// fail with EWOULDBLOCK. That is the producer's doing: the bundle fails
/// at stage verify naming the file and the lease, at once, and the
/// pipeline's next bundle is published (it used to be deferred for a day,
/// holding every later bundle of the pipeline).
#[test]
fn a_producers_file_lease_fails_its_own_bundle_and_blocks_no_other() {
    if !can_switch_users("a_producers_file_lease_fails_its_own_bundle_and_blocks_no_other") {
        return;
    }
    let lab = Lab::new(ONE_ROOT, &["reports"]);
    let bundle = lab.sealed("leased", &[("a.txt", "leased\n")]);
    for entry in ["", "a.txt", "manifest.json"] {
        chown(bundle.join(entry), Some(NOBODY), Some(PRODUCERS)).unwrap();
    }
    // The lease holder: `sleep`, holding a write lease on a.txt taken as
    // the file's owner, with SIGIO (the lease break's signal) ignored.
    let file = std::ffi::CString::new(bundle.join("a.txt").to_str().unwrap()).unwrap();
    let mut holder = Command::new("sleep");
    holder
        .arg("600")
        .uid(NOBODY)
        .gid(PRODUCERS)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: open(2), fcntl(2), signal(2) and write(2) are
    // async-signal-safe; the path was allocated before the fork.
    unsafe {
        holder.pre_exec(move || {
            let fd = libc::open(file.as_ptr(), libc::O_RDONLY);
            if fd < 0 || libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signal(libc::SIGIO, libc::SIG_IGN);
            libc::write(1, b"leased\n".as_ptr().cast(), 7);
            Ok(())
        });
    }
    let mut holder = holder.spawn().expect("take the lease");
    let mut said = [0u8; 7];
    std::io::Read::read_exact(holder.stdout.as_mut().unwrap(), &mut said).unwrap();
    assert_eq!(&said, b"leased\n");
    fs::rename(&bundle, lab.spool("reports", "inbox").join("leased")).unwrap();

    let out = lab.agent_once(None);
    let _ = holder.kill();
    let _ = holder.wait();
    out.expect_code(1);
    assert!(!out.stderr.contains("deferred"), "{}", out.stderr);
    let failed = lab.spool("reports", "failed").join("leased");
    let error = error_of(&failed);
    assert!(error.contains("a.txt"), "{error}");
    assert!(error.contains("file lease"), "{error}");
    assert_eq!(crate::lab::result_of(&failed)["stage"], "verify", "{error}");
    assert!(!error.contains("tried 2 times"), "failed at once: {error}");

    lab.sealed("next", &[("b.txt", "next\n")]);
    fs::rename(
        lab.join("bundles/next"),
        lab.spool("reports", "inbox").join("next"),
    )
    .unwrap();
    lab.agent_once(None).expect_code(0);
    assert_eq!(
        fs::read_to_string(lab.join("site/b.txt")).unwrap(),
        "next\n"
    );
}

/// `spool list --inbox` and `status` look at the inbox with their caller's
/// permissions: run as root, they called "ready" a bundle the agent cannot
/// read. They show the agent's own verdict, which it records, and say
/// when it differs from what the caller sees.
#[test]
fn the_inbox_is_shown_as_the_agent_judges_it_not_as_root_sees_it() {
    if !can_switch_users("the_inbox_is_shown_as_the_agent_judges_it_not_as_root_sees_it") {
        return;
    }
    let lab = Lab::unprivileged();
    lab.sealed("private", &[("a.txt", "only mine\n")]);
    // A producer whose umask leaves the agent nothing to read.
    lab.producer(
        OTHER,
        "umask 077 && cp -r bundles/private spool/reports/inbox/.private && mv spool/reports/inbox/.private spool/reports/inbox/private",
        &[],
    )
    .expect_code(0);
    lab.agent_once(Some(NOBODY));
    assert!(lab.spool("reports", "inbox").join("private").exists());

    let listed = lab.run(None, &["spool", "list", "--inbox", "--json"]);
    listed.expect_code(0);
    let rows = listed.json();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "private")
        .unwrap_or_else(|| panic!("{rows}"));
    assert_eq!(row["state"], "unreadable", "{row}");
    let reason = row["reason"].as_str().unwrap();
    assert!(reason.contains("the agent's verdict"), "{reason}");
    assert!(
        reason.contains("with this command's permissions it looks "),
        "{reason}"
    );
    let status = lab.run(None, &["status", "--json"]);
    assert!(
        status.stdout.contains("\"unreadable\""),
        "status counts it as the agent does: {}",
        status.stdout
    );
    // Once the agent may read it, the agent claims it and the verdict goes.
    lab.producer(OTHER, "chmod -R g+rwX spool/reports/inbox/private", &[])
        .expect_code(0);
    lab.agent_once(Some(NOBODY)).expect_code(0);
    assert!(lab.spool("reports", "done").join("private").exists());
    assert!(
        !lab.spool("reports", "")
            .join(".distributor-inbox.json")
            .exists()
    );
}

/// The producers' group of the ACL recipe (docs/security.md), other than
/// the agent's.
const REPORTS_PRODUCERS: u32 = 60002;

/// Runs `script` (sh) in the lab's folder as producer `OTHER` of group
/// [`REPORTS_PRODUCERS`].
fn as_producer(lab: &Lab, script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(lab.path())
        .uid(OTHER)
        .gid(REPORTS_PRODUCERS)
        .output()
        .expect("run the producer's script");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}); scripts/install-test-deps installs it")
        });
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The install recipe of docs/security.md (a sticky inbox of the
/// producers' group, an ACL for the agent's user, inherited), with the
/// packaged agent's user and its one capability (CAP_FOWNER, through
/// setpriv as the unit's AmbientCapabilities gives it): every delivery
/// recipe the docs give works as written, `cp -r`, `rsync -a`, `tar -x`
/// and the CI deploy-key recipe (`umask 077`, then `rsync -a`). They set
/// new folders' modes from their source's (or the umask), which sets the
/// ACL's mask: the agent could neither read nor move such a bundle, which
/// waited as `unreadable` for good. Without the capability, the reason
/// says so and names the fix.
#[test]
fn every_delivery_recipe_works_under_the_documented_producer_setup() {
    if !can_switch_users("every_delivery_recipe_works_under_the_documented_producer_setup") {
        return;
    }
    let lab = Lab::bare(ONE_ROOT);
    for folder in ["spool", "site"] {
        let path = lab.t.mkdir(folder);
        chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).unwrap();
    }
    lab.agent_once(Some(NOBODY)).expect_code(0);
    let spool = lab.join("spool");
    let inbox = lab.spool("reports", "inbox");
    let group = format!("g:{REPORTS_PRODUCERS}:x");
    run(
        "setfacl",
        &[
            "-m",
            &group,
            spool.to_str().unwrap(),
            spool.join("reports").to_str().unwrap(),
        ],
    );
    chown(&inbox, None, Some(REPORTS_PRODUCERS)).unwrap();
    fs::set_permissions(&inbox, fs::Permissions::from_mode(0o1770)).unwrap();
    let agent = format!("u:{NOBODY}:rwx");
    run(
        "setfacl",
        &["-m", &agent, "-d", "-m", &agent, inbox.to_str().unwrap()],
    );

    for name in ["cp", "rsync", "tar", "ci"] {
        lab.sealed(
            name,
            &[
                ("index.html", &format!("{name}\n")),
                ("sub/page.html", "deep\n"),
            ],
        );
    }
    run(
        "tar",
        &[
            "-C",
            lab.join("bundles").to_str().unwrap(),
            "-cf",
            lab.join("tar.tar").to_str().unwrap(),
            "tar",
        ],
    );
    let stage = lab.t.mkdir("ci-stage");
    chown(&stage, Some(OTHER), Some(REPORTS_PRODUCERS)).unwrap();
    let i = "spool/reports/inbox";
    as_producer(
        &lab,
        &format!("cp -r bundles/cp {i}/.cp && mv {i}/.cp {i}/cp"),
    );
    as_producer(&lab, &format!("rsync -a bundles/rsync/ {i}/rsync/"));
    as_producer(&lab, &format!("tar -C {i} -xf tar.tar"));
    as_producer(
        &lab,
        &format!("umask 077 && cp -r bundles/ci ci-stage/ci && rsync -a ci-stage/ci/ {i}/ci/"),
    );

    // Without the capability: each waits, and says why and what to do.
    lab.agent_once(Some(NOBODY));
    let listed = lab
        .run(Some(NOBODY), &["spool", "list", "--inbox", "--json"])
        .json();
    for row in listed.as_array().unwrap() {
        assert_eq!(row["state"], "unreadable", "{row}");
        let reason = row["reason"].as_str().unwrap();
        assert!(reason.contains("CAP_FOWNER"), "{reason}");
    }

    // As the packaged unit runs it: the agent's user, with CAP_FOWNER.
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "--inh-caps=+fowner",
            "--ambient-caps=+fowner",
            env!("CARGO_BIN_EXE_distributor"),
            "--config",
            lab.join("config.yaml").to_str().unwrap(),
            "agent",
            "--once",
        ])
        .current_dir(lab.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for name in ["cp", "rsync", "tar", "ci"] {
        assert!(
            lab.spool("reports", "done").join(name).is_dir(),
            "{name} was not published:\n{stderr}"
        );
    }
    assert!(stderr.contains("gave the agent's group read"), "{stderr}");
    assert_eq!(
        fs::read_to_string(lab.join("site/sub/page.html")).unwrap(),
        "deep\n"
    );
}
