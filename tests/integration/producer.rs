//! Playing the hostile producer for real (docs/contract.md §12): bundles are
//! dropped, and bookkeeping files planted, by other users than the agent.
//! The producer-side steps run as ordinary commands (`mkdir`, `cp`, `ln -s`,
//! `mkfifo`, `mv`, `rm`, `truncate`) under uid 65534 (and 60001 for "another
//! producer"), sharing group 65534 with each other, which plays the
//! producers' group of the install recipe: the inbox belongs to that group
//! and is group-writable and sticky. The agent runs as root (the worst case:
//! root follows any link and reads any file) except where the point is what
//! an unprivileged agent cannot do.
//!
//! Dropping privileges needs root; as another user these tests print why
//! they skip and pass. CI runs them as root.
//!
//! One test (or a few) per way in, each asserting what an
//! operator cares about: nothing outside the root changed, the good bundle
//! behind the hostile one was published, where each bundle was filed and
//! why, the exit code, the agent stopping, memory, and inert output.

use crate::lab::*;
use crate::util::{listed, sha256, wait_for, wait_output, write_manifest};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::PathBuf;
use std::time::Duration;

const ONE_PIPELINE: &str = "spool: ./spool
agent:
  settle: 100ms
  rescan_interval: 300ms
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
";

// ---------------------------------------------------------------------------
// 1. Bookkeeping names planted as links or FIFOs
// ---------------------------------------------------------------------------

/// `.distributor-result.json` and `.distributor-attempts`
/// planted by the producer as symbolic links to files outside (another
/// site's page) are replaced, never written through, whether the bundle
/// fails or succeeds.
#[test]
fn planted_result_and_attempt_links_never_write_outside() {
    if !can_switch_users("planted_result_and_attempt_links_never_write_outside") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    let victims: Vec<PathBuf> = ["result", "attempts"]
        .iter()
        .map(|v| {
            lab.t.write(
                &format!("other-site/{v}.html"),
                format!("<p>{v}, keep me</p>\n"),
            )
        })
        .collect();
    let before: Vec<_> = victims.iter().map(|v| snapshot(v)).collect();
    lab.sealed("good", &[("a.txt", "published")]);
    lab.corrupt("bad");
    for name in ["bad", "good"] {
        let staged = format!("spool/reports/inbox/.{name}");
        lab.producer(
            NOBODY,
            &format!(
                "cp -r bundles/{name} {staged} && ln -s {} {staged}/{RESULT} && ln -s {} {staged}/{ATTEMPTS} && mv {staged} spool/reports/inbox/{name}",
                victims[0].display(),
                victims[1].display()
            ),
            &[],
        )
        .expect_code(0);
    }

    lab.agent_once(None).expect_code(1);

    for (victim, before) in victims.iter().zip(&before) {
        assert_eq!(&snapshot(victim), before, "{} changed", victim.display());
    }
    let good = lab.spool("reports", "done").join("good");
    let bad = lab.spool("reports", "failed").join("bad");
    assert_eq!(result_of(&good)["ok"], true);
    assert_eq!(result_of(&bad)["stage"], "verify");
    assert!(error_of(&bad).contains("a.txt"), "{}", error_of(&bad));
    for bundle in [&good, &bad] {
        let attempts = fs::symlink_metadata(bundle.join(ATTEMPTS)).unwrap();
        assert!(
            attempts.is_file(),
            "{}: the attempt link was replaced",
            bundle.display()
        );
    }
    assert_eq!(
        fs::read_to_string(lab.join("site/a.txt")).unwrap(),
        "published"
    );
}

/// The same names planted as FIFOs make `agent --once`
/// neither hang nor fail: it finishes with both bundles filed.
#[test]
fn planted_result_and_attempt_fifos_do_not_hang_agent_once() {
    if !can_switch_users("planted_result_and_attempt_fifos_do_not_hang_agent_once") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    lab.sealed("good", &[("a.txt", "published")]);
    lab.corrupt("bad");
    for name in ["bad", "good"] {
        let staged = format!("spool/reports/inbox/.{name}");
        lab.producer(
            NOBODY,
            &format!(
                "cp -r bundles/{name} {staged} && mkfifo {staged}/{RESULT} {staged}/{ATTEMPTS} && mv {staged} spool/reports/inbox/{name}"
            ),
            &[],
        )
        .expect_code(0);
    }

    // util's deadline (60 s) fails the test if it hangs on a FIFO.
    let out = lab.agent_once(None);
    out.expect_code(1);

    let good = lab.spool("reports", "done").join("good");
    let bad = lab.spool("reports", "failed").join("bad");
    assert_eq!(result_of(&good)["ok"], true, "{}", out.stderr);
    assert_eq!(result_of(&bad)["stage"], "verify");
    assert_eq!(
        fs::read_to_string(lab.join("site/a.txt")).unwrap(),
        "published"
    );
}

// ---------------------------------------------------------------------------
// 2. Hard links to files the producer cannot read
// ---------------------------------------------------------------------------

/// A listed file that is a hard link to a root-only file
/// fails the bundle at stage verify, naming the file and saying "hard link",
/// publishes nothing, and tells nothing about the secret (neither its size
/// nor its hash), whether the manifest guesses or knows them.
#[test]
fn a_hard_link_to_a_root_only_file_is_refused_without_leaking_it() {
    if !can_switch_users("a_hard_link_to_a_root_only_file_is_refused_without_leaking_it") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    let secret_bytes = "root-only secret ".repeat(250); // 4250 bytes
    let secret = lab.t.write("private/secret", &secret_bytes);
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(lab.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    let real_size = secret_bytes.len().to_string();
    let real_hash = sha256(secret_bytes.as_bytes());
    // The producer cannot read the secret; root writes both manifests: one
    // guessing (size 7, a made-up hash), one knowing the real values.
    let guess = ("leak.txt".to_owned(), sha256(b"guess"), 7);
    write_manifest(&lab.join("bundles/leak-guess"), "leak-guess", &[guess]);
    let exact = listed("leak.txt", secret_bytes.as_bytes());
    write_manifest(&lab.join("bundles/leak-exact"), "leak-exact", &[exact]);
    for name in ["leak-guess", "leak-exact"] {
        let staged = format!("spool/reports/inbox/.{name}");
        lab.producer(
            NOBODY,
            &format!("mkdir {staged} && cp bundles/{name}/manifest.json {staged}/"),
            &[],
        )
        .expect_code(0);
        // An unprivileged producer can make this link only where
        // fs.protected_hardlinks=0 (not the default); root makes it here.
        fs::hard_link(&secret, lab.join(&format!("{staged}/leak.txt"))).unwrap();
        lab.producer(
            NOBODY,
            &format!("mv {staged} spool/reports/inbox/{name}"),
            &[],
        )
        .expect_code(0);
    }

    let out = lab.agent_once(None);
    out.expect_code(1);

    for name in ["leak-guess", "leak-exact"] {
        let bundle = lab.spool("reports", "failed").join(name);
        let doc = result_of(&bundle);
        assert_eq!(doc["stage"], "verify", "{name}: {doc}");
        let error = error_of(&bundle);
        assert!(
            error.contains("leak.txt") && error.contains("hard link"),
            "{name}: {error}"
        );
        assert!(
            !error.contains(&real_hash),
            "{name} leaks the hash: {error}"
        );
        if name == "leak-guess" {
            assert!(
                !error.contains(&real_size),
                "{name} leaks the size: {error}"
            );
        }
    }
    assert!(!lab.join("site").exists(), "nothing was published");
    assert!(!out.stderr.contains(&real_hash), "{}", out.stderr);
    assert!(!out.stderr.contains("root-only secret"), "{}", out.stderr);
}

// ---------------------------------------------------------------------------
// 3. Special manifests in front of a live agent
// ---------------------------------------------------------------------------

/// A live agent with a FIFO `manifest.json` and a
/// `manifest.json -> /dev/zero` in its inbox files both into failed/ with
/// the reason, publishes the good bundle behind them, keeps its memory
/// bounded, and stops on SIGTERM with exit 0.
#[test]
fn fifo_and_dev_zero_manifests_neither_block_nor_bloat_the_live_agent() {
    if !can_switch_users("fifo_and_dev_zero_manifests_neither_block_nor_bloat_the_live_agent") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    lab.sealed("good", &[("a.txt", "published")]);
    let mut agent = lab.agent(None);
    let inbox = "spool/reports/inbox";
    lab.producer(
        NOBODY,
        &format!(
            "mkdir {inbox}/.fifo && mkfifo {inbox}/.fifo/manifest.json && mv {inbox}/.fifo {inbox}/fifo && \
             mkdir {inbox}/.zero && ln -s /dev/zero {inbox}/.zero/manifest.json && mv {inbox}/.zero {inbox}/zero"
        ),
        &[],
    )
    .expect_code(0);
    lab.deliver(NOBODY, "reports", "good");

    let done = lab.spool("reports", "done").join("good");
    let failed = lab.spool("reports", "failed");
    let filed = wait_for(WAIT, || {
        done.join(RESULT).is_file()
            && failed.join("fifo").join(RESULT).is_file()
            && failed.join("zero").join(RESULT).is_file()
    });
    assert!(filed, "not every bundle was filed:\n{}", agent.log());
    assert_eq!(
        fs::read_to_string(lab.join("site/a.txt")).unwrap(),
        "published"
    );
    for (name, reason) in [("fifo", "named pipe (FIFO)"), ("zero", "symbolic link")] {
        let bundle = failed.join(name);
        assert_eq!(result_of(&bundle)["stage"], "verify", "{name}");
        let error = error_of(&bundle);
        assert!(
            error.contains("manifest.json") && error.contains(reason),
            "{name}: {error}"
        );
    }
    let peak_kib = agent.status_kib("VmHWM");
    eprintln!("agent peak RSS (VmHWM): {peak_kib} KiB");
    assert!(peak_kib < 200 * 1024, "peak RSS {peak_kib} KiB");

    let (code, took) = agent.terminate(Duration::from_secs(10));
    eprintln!("agent exit after SIGTERM: {took:?}");
    assert_eq!(code, 0, "{}", agent.log());
}

// ---------------------------------------------------------------------------
// 4. Entries an unprivileged agent cannot search or move
// ---------------------------------------------------------------------------

/// The names of the entries of item 4 that the agent cannot use.
const UNUSABLE: [&str; 3] = ["no-search-0700", "no-search-0000", "no-write"];

/// With the agent running as its own (unprivileged) user,
/// inbox folders it cannot search (0700 and 0000, owned by the producer)
/// and one it can read but not move block nothing: the good bundles behind
/// them are published, each bad entry is logged once (by `agent --once` and
/// by a live agent over several scans), and `spool list --inbox` shows each
/// as `unreadable` with its reason.
#[test]
fn entries_the_agent_cannot_search_or_move_block_nothing_and_are_logged_once() {
    if !can_switch_users(
        "entries_the_agent_cannot_search_or_move_block_nothing_and_are_logged_once",
    ) {
        return;
    }
    let lab = Lab::unprivileged();

    for name in UNUSABLE
        .iter()
        .chain(&["good-1", "good-2", "good-3", "good-4"])
    {
        lab.sealed(name, &[(&format!("{name}.txt"), name)]);
    }
    let inbox = "spool/reports/inbox";
    lab.producer(
        OTHER,
        &format!(
            "cp -r bundles/no-search-0700 {inbox}/.a && chmod 0700 {inbox}/.a && mv {inbox}/.a {inbox}/no-search-0700 && \
             cp -r bundles/no-search-0000 {inbox}/.b && chmod 0000 {inbox}/.b && mv {inbox}/.b {inbox}/no-search-0000 && \
             cp -r bundles/no-write {inbox}/.c && chmod 0755 {inbox}/.c && mv {inbox}/.c {inbox}/no-write"
        ),
        &[],
    )
    .expect_code(0);
    lab.deliver(OTHER, "reports", "good-1");

    let once = lab.agent_once(Some(NOBODY));
    once.expect_code(0);
    let done = lab.spool("reports", "done");
    assert!(done.join("good-1").is_dir(), "{}", once.stderr);
    assert_eq!(
        fs::read_to_string(lab.join("site/good-1.txt")).unwrap(),
        "good-1"
    );
    for name in UNUSABLE {
        let lines = once.stderr.lines().filter(|l| l.contains(name)).count();
        assert_eq!(lines, 1, "agent --once logs {name} once:\n{}", once.stderr);
        assert!(
            lab.join(&format!("{inbox}/{name}")).exists(),
            "{name} is left in the inbox"
        );
    }

    let listing = lab.run(Some(NOBODY), &["spool", "list", "--inbox", "--json"]);
    listing.expect_code(0);
    let rows = listing.json();
    for name in UNUSABLE {
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {rows:#}"));
        assert_eq!(row["state"], "unreadable", "{row:#}");
        let reason = row["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("cannot"), "{name}: {reason}");
    }

    // A live agent scans every 200 ms; each good bundle dropped and
    // published means at least one more scan past the bad entries.
    let mut agent = lab.agent(Some(NOBODY));
    for name in ["good-2", "good-3", "good-4"] {
        lab.deliver(OTHER, "reports", name);
        let published = wait_for(WAIT, || done.join(name).join(RESULT).is_file());
        assert!(published, "{name} was not published:\n{}", agent.log());
    }
    let (code, _) = agent.terminate(Duration::from_secs(10));
    assert_eq!(code, 0);
    let log = agent.log();
    for name in UNUSABLE {
        // The watcher may say once that it cannot watch inside a folder it
        // cannot read; the entry itself is reported once.
        let (watcher, worker): (Vec<&str>, Vec<&str>) = log
            .lines()
            .filter(|l| l.contains(name))
            .partition(|l| l.contains("agent::watcher"));
        assert_eq!(worker.len(), 1, "the live agent logs {name} once:\n{log}");
        assert!(watcher.len() <= 1, "{log}");
    }
}

/// A bundle that looks ready but whose claim keeps
/// failing is logged once, not at every scan. Here the inbox belongs to
/// another user than the agent's (an operator made it by hand), so the
/// sticky bit lets the agent move only the entries of its own user: the
/// other producer's bundle cannot be claimed, the agent's own go through.
#[test]
fn a_claim_that_keeps_failing_is_logged_once_not_at_every_scan() {
    if !can_switch_users("a_claim_that_keeps_failing_is_logged_once_not_at_every_scan") {
        return;
    }
    let lab = Lab::unprivileged();
    let inbox = lab.spool("reports", "inbox");
    chown(&inbox, Some(0), Some(PRODUCERS)).unwrap();
    fs::set_permissions(&inbox, fs::Permissions::from_mode(0o1770)).unwrap();
    for name in ["stuck", "own-1", "own-2", "own-3"] {
        lab.sealed(name, &[(&format!("{name}.txt"), name)]);
    }
    let mut agent = lab.agent(Some(NOBODY));
    lab.deliver(OTHER, "reports", "stuck");
    let done = lab.spool("reports", "done");
    // Each bundle published means at least one more scan past "stuck".
    for name in ["own-1", "own-2", "own-3"] {
        lab.deliver(NOBODY, "reports", name);
        let published = wait_for(WAIT, || done.join(name).join(RESULT).is_file());
        assert!(published, "{name} was not published:\n{}", agent.log());
    }
    let (code, _) = agent.terminate(Duration::from_secs(10));
    assert_eq!(code, 0);
    let log = agent.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("stuck")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("cannot claim") && lines[0].contains("own the inbox"),
        "{log}"
    );
    assert!(inbox.join("stuck").is_dir());
}

// ---------------------------------------------------------------------------
// 5. Huge sparse files
// ---------------------------------------------------------------------------

/// Has the producer drop `name` holding one sparse `big.bin` of `size`
/// bytes, listed with a wrong hash (root writes the manifest).
fn drop_sparse(lab: &Lab, name: &str, size: u64) {
    let entry = ("big.bin".to_owned(), sha256(b"not what is in it"), size);
    write_manifest(&lab.join(&format!("bundles/{name}")), name, &[entry]);
    let staged = format!("spool/reports/inbox/.{name}");
    lab.producer(
        NOBODY,
        &format!(
            "mkdir {staged} && truncate -s {size} {staged}/big.bin && cp bundles/{name}/manifest.json {staged}/ && mv {staged} spool/reports/inbox/{name}"
        ),
        &[],
    )
    .expect_code(0);
}

/// A 1 TiB sparse file (4 KiB of the producer's disk)
/// declared with a wrong hash fails at verify on `limits.max_file_bytes`
/// without being read.
#[test]
fn a_sparse_terabyte_fails_on_the_file_limit_without_being_read() {
    if !can_switch_users("a_sparse_terabyte_fails_on_the_file_limit_without_being_read") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    drop_sparse(&lab, "huge", 1 << 40);

    // Hashing 1 TiB would take hours: a run that read it would not end
    // before the deadline of `agent_once`, which fails the test.
    let out = lab.agent_once(None);
    out.expect_code(1);
    let bundle = lab.spool("reports", "failed").join("huge");
    assert_eq!(result_of(&bundle)["stage"], "verify");
    let error = error_of(&bundle);
    assert!(
        error.contains("big.bin") && error.contains("limits.max_file_bytes"),
        "{error}"
    );
    assert!(!lab.join("site").exists());
}

/// With the limits raised, SIGTERM while the agent hashes
/// a 50 GiB sparse file stops it promptly with exit 0; the bundle stays in
/// work/ with its attempt count unchanged and is resumed by the next start.
#[test]
fn sigterm_while_hashing_a_huge_file_stops_the_agent_and_the_bundle_resumes() {
    if !can_switch_users("sigterm_while_hashing_a_huge_file_stops_the_agent_and_the_bundle_resumes")
    {
        return;
    }
    let lab = Lab::new(
        "spool: ./spool
agent:
  settle: 100ms
limits:
  max_file_bytes: 64GiB
  max_bundle_bytes: 64GiB
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
",
        &["reports"],
    );
    let mut agent = lab.agent(None);
    let before = agent.bytes_read();
    drop_sparse(&lab, "huge", 50 << 30);
    let work = lab.spool("reports", "work").join("huge");
    // Hashing is under way once the bundle is in work/ and the agent has
    // read a good many of its zeros.
    let hashing = wait_for(Duration::from_secs(60), || {
        work.is_dir() && agent.bytes_read() > before + (64 << 20)
    });
    assert!(hashing, "the agent did not start hashing:\n{}", agent.log());

    let (code, took) = agent.terminate(Duration::from_secs(10));
    eprintln!("agent exit after SIGTERM during hashing: {took:?}");
    assert_eq!(code, 0, "{}", agent.log());
    assert!(work.is_dir(), "the bundle stays in work/:\n{}", agent.log());
    let attempts = fs::read_to_string(work.join(ATTEMPTS)).unwrap_or_default();
    assert_eq!(
        attempts.trim().parse::<u32>().unwrap_or(0),
        0,
        "an interrupted attempt is not counted"
    );
    assert!(!lab.spool("reports", "failed").join("huge").exists());
    assert!(!lab.join("site/big.bin").exists());

    // The next start resumes it from work/ (made small and sealed again,
    // so this test does not hash 50 GiB).
    fs::write(work.join("big.bin"), "small now").unwrap();
    lab.t
        .seal(&work, "huge", Some(crate::util::CREATED))
        .expect_code(0);
    let out = lab.agent_once(None);
    out.expect_code(0);
    assert!(out.stderr.contains("resuming 1 bundle"), "{}", out.stderr);
    assert!(lab.spool("reports", "done").join("huge").is_dir());
    assert_eq!(
        fs::read_to_string(lab.join("site/big.bin")).unwrap(),
        "small now"
    );
}

// ---------------------------------------------------------------------------
// 6. Huge markdown
// ---------------------------------------------------------------------------

/// A markdown file over `limits.max_markdown_bytes` for a
/// destination that renders HTML fails at verify naming the key; a smaller
/// one behind it is rendered.
#[test]
fn markdown_over_the_limit_fails_at_verify_naming_the_key() {
    if !can_switch_users("markdown_over_the_limit_fails_at_verify_naming_the_key") {
        return;
    }
    let lab = Lab::new(
        "spool: ./spool
limits:
  max_markdown_bytes: 1KiB
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
        publish: {source: false, html: true}
",
        &["reports"],
    );
    let table = format!("|a|b|\n|-|-|\n{}", "|x|y|\n".repeat(400));
    lab.sealed("big-md", &[("page.md", &table)]);
    lab.sealed("small-md", &[("small.md", "# Small\n")]);
    lab.deliver(NOBODY, "reports", "big-md");
    lab.deliver(NOBODY, "reports", "small-md");

    lab.agent_once(None).expect_code(1);

    let bundle = lab.spool("reports", "failed").join("big-md");
    assert_eq!(result_of(&bundle)["stage"], "verify");
    let error = error_of(&bundle);
    assert!(
        error.contains("page.md") && error.contains("limits.max_markdown_bytes"),
        "{error}"
    );
    assert!(!lab.join("site/page.html").exists());
    assert!(lab.join("site/small.html").is_file());
}

// ---------------------------------------------------------------------------
// 7. Result files replaced after the bundle was filed
// ---------------------------------------------------------------------------

/// A producer who kept its bundle folder open (here as
/// its working directory) replaces the `.distributor-result.json` of its
/// failed bundle by a FIFO or a link to `/dev/zero`, although failed/ is
/// closed to it. `spool list` and `status` still answer at once, exit 0 and
/// say why they did not read it.
#[test]
fn spool_list_and_status_survive_result_files_swapped_for_fifos_and_dev_zero() {
    if !can_switch_users(
        "spool_list_and_status_survive_result_files_swapped_for_fifos_and_dev_zero",
    ) {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    let swaps = [
        ("swapped-fifo", "mkfifo"),
        ("swapped-zero", "ln -s /dev/zero"),
    ];
    let mut producers = Vec::new();
    for (name, make) in swaps {
        lab.corrupt(name);
        lab.deliver(NOBODY, "reports", name);
        // It swaps the file once the test closes its standard input.
        let mut child = lab.producer_spawn_piped(
            NOBODY,
            &format!(
                "cd spool/reports/inbox/{name} || exit 1; echo in; \
                 read go; rm -f {RESULT} && {make} {RESULT}"
            ),
            &[],
        );
        // Wait for the `cd`: from then on the producer holds the folder.
        let mut line = [0u8; 3];
        use std::io::Read;
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .unwrap();
        assert_eq!(&line, b"in\n");
        producers.push(child);
    }
    lab.agent_once(None).expect_code(1);
    for mut child in producers {
        drop(child.stdin.take());
        wait_output(child, "producer").expect_code(0);
    }
    let failed = lab.spool("reports", "failed");
    assert!(
        fs::symlink_metadata(failed.join("swapped-zero").join(RESULT))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the producer replaced its result file inside failed/"
    );
    // The agent keeps its own copy of each failed result, which the
    // producer cannot reach (tested in failed_spool); without it (a bundle
    // failed by an older version) the commands read the file in the bundle.
    for (name, _) in swaps {
        let kept = lab.join(&format!("spool/reports/.distributor-results/{name}.json"));
        fs::remove_file(&kept).unwrap();
    }

    for args in [
        &["spool", "list"][..],
        &["spool", "list", "--failed", "--json"],
        &["status"],
        &["status", "--json"],
    ] {
        // A command that opened the FIFO would block on it until the
        // deadline of `lab.run`, which fails the test.
        let out = lab.run(None, args);
        out.expect_code(0);
        let reason = |name: &str, text: &str| {
            let kind = if name == "swapped-fifo" {
                "named pipe (FIFO)"
            } else {
                "symbolic link"
            };
            text.contains(kind) && text.contains("not read")
        };
        if args.len() == 2 && args[0] == "spool" {
            for (name, _) in swaps {
                let line = out
                    .stdout
                    .lines()
                    .find(|l| l.contains(name))
                    .unwrap_or_else(|| panic!("{name} not listed:\n{}", out.stdout));
                assert!(reason(name, line), "{line}");
            }
        } else if args == ["spool", "list", "--failed", "--json"] {
            let rows = out.json();
            for (name, _) in swaps {
                let row = rows
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["name"] == name)
                    .unwrap_or_else(|| panic!("{name} not listed: {rows:#}"));
                let error = row["error"].as_str().unwrap_or_default();
                assert!(reason(name, error), "{row:#}");
            }
        } else if args == ["status"] {
            assert!(out.stdout.contains("failed 2"), "{}", out.stdout);
            let line = out
                .stdout
                .lines()
                .find(|l| l.contains("last failure"))
                .unwrap_or_else(|| panic!("no last failure:\n{}", out.stdout));
            assert!(swaps.iter().any(|(n, _)| reason(n, line)), "{line}");
        } else {
            let doc = out.json();
            assert_eq!(doc[0]["failed"], 2, "{doc:#}");
            let error = doc[0]["last_failure"]["error"].as_str().unwrap_or_default();
            assert!(swaps.iter().any(|(n, _)| reason(n, error)), "{doc:#}");
        }
    }
}

// ---------------------------------------------------------------------------
// 8. Spool permissions
// ---------------------------------------------------------------------------

/// The agent creates work/, done/ and failed/ without
/// access for others and a sticky inbox; a producer who can enter another
/// pipeline's spool folder still cannot list or read its bundles, and
/// cannot rename or delete another producer's inbox entry, only its own.
#[test]
fn spool_modes_keep_producers_out_of_other_pipelines_and_off_each_others_entries() {
    if !can_switch_users(
        "spool_modes_keep_producers_out_of_other_pipelines_and_off_each_others_entries",
    ) {
        return;
    }
    let lab = Lab::bare(
        "spool: ./spool
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
  - id: other
    destinations:
      - id: site
        path: ./other-site
",
    );
    lab.agent_once(None).expect_code(0);
    for p in ["reports", "other"] {
        for folder in ["work", "done", "failed"] {
            let mode = fs::metadata(lab.spool(p, folder)).unwrap().mode() & 0o7777;
            assert_eq!(mode & 0o027, 0, "{p}/{folder} has mode {mode:04o}");
        }
        let mode = fs::metadata(lab.spool(p, "inbox")).unwrap().mode() & 0o7777;
        assert_ne!(mode & 0o1000, 0, "{p}/inbox has mode {mode:04o}");
        lab.open_inbox(p);
    }
    lab.sealed("theirs", &[("a.txt", "theirs, private")]);
    lab.corrupt("their-failure");
    lab.deliver(OTHER, "other", "theirs");
    lab.deliver(OTHER, "other", "their-failure");
    lab.agent_once(None).expect_code(1);
    assert!(lab.spool("other", "done").join("theirs").is_dir());
    assert!(lab.spool("other", "failed").join("their-failure").is_dir());
    fs::create_dir(lab.spool("other", "work").join("in-hand")).unwrap();

    // The producer of `reports` gets into `spool/other` (the group may pass
    // through), but no further.
    lab.producer(NOBODY, "ls spool/other", &[]).expect_code(0);
    for cmd in [
        "ls spool/other/work",
        "ls spool/other/done",
        "ls spool/other/failed",
        "cat spool/other/done/theirs/a.txt",
        "cat spool/other/failed/their-failure/a.txt",
    ] {
        let out = lab.producer(NOBODY, cmd, &[]);
        assert_ne!(out.code, 0, "{cmd} succeeded: {}", out.stdout);
        assert!(
            out.stderr.contains("Permission denied"),
            "{cmd}: {}",
            out.stderr
        );
        assert!(!out.stdout.contains("theirs"), "{cmd}: {}", out.stdout);
    }

    // Sticky inbox: an entry everyone could write into is still only its
    // owner's (and the agent's) to rename or delete.
    let inbox = "spool/reports/inbox";
    lab.producer(
        NOBODY,
        &format!("mkdir {inbox}/mine && chmod 0777 {inbox}/mine"),
        &[],
    )
    .expect_code(0);
    for cmd in [
        format!("mv {inbox}/mine {inbox}/stolen"),
        format!("rmdir {inbox}/mine"),
    ] {
        let out = lab.producer(OTHER, &cmd, &[]);
        assert_ne!(out.code, 0, "{cmd} succeeded");
        assert!(
            out.stderr.contains("Operation not permitted"),
            "{cmd}: {}",
            out.stderr
        );
    }
    assert!(lab.join(&format!("{inbox}/mine")).is_dir());
    lab.producer(
        OTHER,
        &format!(
            "mkdir {inbox}/yours && mv {inbox}/yours {inbox}/renamed && rmdir {inbox}/renamed"
        ),
        &[],
    )
    .expect_code(0);
    lab.producer(NOBODY, &format!("rmdir {inbox}/mine"), &[])
        .expect_code(0);
}

// ---------------------------------------------------------------------------
// 9. Control characters in names
// ---------------------------------------------------------------------------

/// True when `text` holds a control character other than a line feed.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(|c| c.is_control() && c != '\n')
}

/// Bundles named with ESC, CR and BEL (failed, published
/// and waiting) are shown escaped by `spool list` and `status` and in the
/// agent's log, and exactly as named by `--json`.
#[test]
fn names_with_escape_sequences_are_printed_inert() {
    if !can_switch_users("names_with_escape_sequences_are_printed_inert") {
        return;
    }
    let lab = Lab::new(ONE_PIPELINE, &["reports"]);
    let failed_name = "evil\x1b[2J\rname\x07";
    let done_name = "fine\x1b]0;owned\x07";
    let waiting_name = "wait\x1b[31m\r";
    lab.corrupt("bad");
    lab.sealed("good", &[("a.txt", "published")]);
    let inbox = "spool/reports/inbox";
    for (from, name) in [("bad", failed_name), ("good", done_name)] {
        lab.producer(
            NOBODY,
            &format!("cp -r bundles/{from} {inbox}/.x && mv {inbox}/.x \"{inbox}/$NAME\""),
            &[("NAME", name.as_bytes())],
        )
        .expect_code(0);
    }
    lab.producer(
        NOBODY,
        &format!("mkdir \"{inbox}/$NAME\""),
        &[("NAME", waiting_name.as_bytes())],
    )
    .expect_code(0);

    let out = lab.agent_once(None);
    out.expect_code(1);
    assert!(lab.spool("reports", "failed").join(failed_name).is_dir());
    assert!(lab.spool("reports", "done").join(done_name).is_dir());
    assert!(
        !has_raw_controls(&out.stderr),
        "agent log: {:?}",
        out.stderr
    );

    for args in [&["spool", "list"][..], &["status"]] {
        let out = lab.run(None, args);
        out.expect_code(0);
        assert!(!has_raw_controls(&out.all()), "{args:?}: {:?}", out.all());
        assert!(
            out.stdout.contains("evil\\x1b[2J\\rname\\x07"),
            "{args:?}: {}",
            out.stdout
        );
    }
    // --json is plain JSON with the exact names (JSON escapes control
    // characters itself).
    let listing = lab.run(None, &["spool", "list", "--json"]);
    listing.expect_code(0);
    let mut names: Vec<String> = listing
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    let mut want: Vec<String> = [failed_name, done_name, waiting_name]
        .iter()
        .map(|n| n.to_string())
        .collect();
    want.sort();
    assert_eq!(names, want, "--json lists every bundle by its exact name");
    let status = lab.run(None, &["status", "--json"]);
    status.expect_code(0);
    let last = status.json()[0]["last_failure"]["name"].clone();
    assert_eq!(last.as_str().unwrap(), failed_name);
}
