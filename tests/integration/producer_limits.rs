//! What a producer's folder may cost the agent: inotify watches and file
//! descriptors (docs/security.md, "What a producer can make the agent
//! spend"). A producer decides how wide and deep its folders are and where
//! its links point; the agent's watches stay one per pipeline and its
//! descriptors a small number, whatever it drops.

use crate::lab::*;
use crate::util::{Test, read_state, records, wait_for};
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The inodes every inotify watch of process `pid` is on.
fn watched_inodes(pid: u32) -> Vec<u64> {
    let mut inodes = Vec::new();
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let is_inotify = fs::read_link(fd.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:inotify");
        if !is_inotify {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        for line in info.lines().filter(|l| l.starts_with("inotify wd:")) {
            let ino = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("ino:"))
                .unwrap_or_else(|| panic!("no ino: in {line:?}"));
            inodes.push(u64::from_str_radix(ino, 16).unwrap());
        }
    }
    inodes
}

/// The inodes of the spool folders the agent owns (the spool, each
/// pipeline's folder and its inbox, work/, done/ and failed/).
fn spool_inodes(lab: &Lab, pipelines: &[&str]) -> BTreeSet<u64> {
    let mut folders = vec![lab.join("spool")];
    for p in pipelines {
        folders.push(lab.join(&format!("spool/{p}")));
        for f in ["inbox", "work", "done", "failed"] {
            folders.push(lab.spool(p, f));
        }
    }
    folders
        .iter()
        .map(|f| fs::metadata(f).unwrap().ino())
        .collect()
}

const TWO_PIPELINES: &str = "spool: ./spool
agent:
  settle: 100ms
  rescan_interval: 300ms
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
  - id: other
    destinations:
      - id: site
        path: ./other-site
";

/// A folder holding a link to `/usr`, a link to `/` at the top of the
/// inbox, a tree 60 folders deep and 5,000 folders without a manifest: a
/// live agent watches each inbox and nothing else (two watches for two
/// pipelines), never a folder outside the spool, and still publishes the
/// bundle dropped after them.
#[test]
fn links_deep_trees_and_thousands_of_folders_in_the_inbox_add_no_watch() {
    if !can_switch_users("links_deep_trees_and_thousands_of_folders_in_the_inbox_add_no_watch") {
        return;
    }
    let lab = Lab::new(TWO_PIPELINES, &["reports", "other"]);
    let agent = lab.agent(None);
    let before = watched_inodes(agent.pid());
    lab.producer(
        NOBODY,
        "set -e
        cd spool/reports/inbox
        mkdir .linked && ln -s /usr .linked/usr && mv .linked linked
        ln -s / root-link
        mkdir -p deep/$(seq 1 60 | sed 's/.*/d/' | tr '\\n' '/')
        seq 1 5000 | sed 's/^/empty-/' | xargs mkdir",
        &[],
    )
    .expect_code(0);
    lab.sealed("good", &[("a.txt", "published after the hostile entries")]);
    lab.deliver(NOBODY, "reports", "good");
    let done = lab.spool("reports", "done").join("good");
    assert!(
        wait_for(WAIT, || done.exists()),
        "the good bundle was not published:\n{}",
        agent.log()
    );
    let watched = watched_inodes(agent.pid());
    let spool = spool_inodes(&lab, &["reports", "other"]);
    let outside: Vec<&u64> = watched.iter().filter(|i| !spool.contains(i)).collect();
    assert!(
        outside.is_empty(),
        "{} of the agent's {} watches are on folders outside the spool (links followed or folders below the inbox watched)",
        outside.len(),
        watched.len()
    );
    assert!(
        watched.len() <= 2,
        "the agent holds {} inotify watches for two pipelines (before the producer's entries: {})",
        watched.len(),
        before.len()
    );
}

const WIDE_AND_DEEP: &str = "spool: ./spool
pipelines:
  - id: wide
    destinations:
      - id: site
        path: ./wide-site
  - id: deep
    destinations:
      - id: site
        path: ./deep-site
  - id: small
    destinations:
      - id: site
        path: ./small-site
";

/// How many folders wide the wide bundle is, and how deep the deep one.
const WIDE: usize = 5000;
const DEEP: usize = 200;
/// The descriptor limit the agent runs under.
const NOFILE: u64 = 256;

/// A bundle whose folder tree is the shape of a hostile producer's, built
/// as `bundles/<name>`: `files` (path, contents) pairs, sealed.
fn shaped(t: &Test, name: &str, files: impl Iterator<Item = (String, String)>) -> usize {
    let dir = t.join(&format!("bundles/{name}"));
    let mut count = 0;
    for (path, contents) in files {
        let path = dir.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
        count += 1;
    }
    t.seal(&dir, name, None).expect_code(0);
    count
}

fn drop_into(t: &Test, name: &str, pipeline: &str) {
    fs::rename(
        t.join(&format!("bundles/{name}")),
        t.join(&format!("spool/{pipeline}/inbox/{name}")),
    )
    .unwrap();
}

/// 5,000 sibling folders in one bundle and 200 nested folders in another,
/// beside a small bundle of a third pipeline, under a limit of 256 open
/// descriptors: probing, verifying and publishing each hold a few at a
/// time, so every bundle is published whole (`agent --once` exits 0, every
/// file and record is there), and `verify` re-hashes the wide root under
/// the same limit.
#[test]
fn bundles_thousands_of_folders_wide_or_hundreds_deep_publish_under_256_descriptors() {
    let t = Test::new();
    t.config(WIDE_AND_DEEP);
    t.once().expect_code(0);
    let wide = shaped(
        &t,
        "wide",
        (0..WIDE).map(|i| (format!("f{i:04}/page.txt"), format!("folder {i}\n"))),
    );
    let deep = shaped(
        &t,
        "deep",
        (1..=DEEP).map(|depth| {
            let folders = "d/".repeat(depth);
            (format!("{folders}level.txt"), format!("level {depth}\n"))
        }),
    );
    let small = shaped(&t, "small", std::iter::once(("a.txt".into(), "a\n".into())));
    for (name, pipeline) in [("wide", "wide"), ("deep", "deep"), ("small", "small")] {
        drop_into(&t, name, pipeline);
    }

    let out = t
        .agent_cmd()
        .args(["agent", "--once"])
        .nofile(NOFILE)
        .output();
    out.expect_code(0);
    for (pipeline, root, files) in [
        ("wide", "wide-site", wide),
        ("deep", "deep-site", deep),
        ("small", "small-site", small),
    ] {
        assert!(
            t.join(&format!("spool/{pipeline}/done/{pipeline}"))
                .is_dir(),
            "{pipeline} was not published under {NOFILE} descriptors:\n{}",
            out.all()
        );
        assert_eq!(
            records(&read_state(&t.join(root))).len(),
            files,
            "{pipeline}: records in {root}"
        );
        assert_eq!(
            t.tree(root).files().len(),
            files,
            "{pipeline}: files in {root}"
        );
    }
    let deepest = format!("deep-site/{}level.txt", "d/".repeat(DEEP));
    assert_eq!(
        fs::read_to_string(t.join(&deepest)).unwrap(),
        format!("level {DEEP}\n")
    );

    let verified = t
        .cmd()
        .args(["--config", "config.yaml"])
        .args([
            "verify",
            "--pipeline",
            "wide",
            "--destination",
            "site",
            "--json",
        ])
        .nofile(NOFILE)
        .output();
    verified.expect_code(0);
    assert_eq!(verified.json()["checked"], WIDE);
    assert!(Path::new(&t.join("wide-site/f4999/page.txt")).is_file());
}
