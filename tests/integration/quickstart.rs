//! The s3 quick start of docs/object-storage.md, run as written: its
//! commands, from a shell, against the SeaweedFS the tests install (step 1,
//! the install itself, is the one step left out: `~/seaweedfs` is that
//! install, through a `HOME` of the test's own).

use crate::util::Test;
use std::fs;
use std::process::Command;

/// The `sh` blocks of the section of `doc` headed `heading`, in order.
fn shell_blocks(doc: &str, heading: &str) -> Vec<String> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    let section = &doc[start..];
    let end = section[heading.len()..]
        .find("\n## ")
        .map_or(section.len(), |e| e + heading.len());
    let mut blocks = Vec::new();
    let mut rest = &section[..end];
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("\n```").expect("a closed block");
        blocks.push(body[..close].to_owned());
        rest = &body[close..];
    }
    blocks
}

#[test]
fn the_s3_quick_start_works_as_written() {
    let weed = crate::seaweed::weed().unwrap_or_else(|e| panic!("{e}"));
    let doc = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/object-storage.md"
    ))
    .unwrap();
    let blocks = shell_blocks(&doc, "## Quick start: a local server");
    assert_eq!(blocks.len(), 2, "the start, then the stop: {blocks:?}");
    let (start, stop) = (&blocks[0], &blocks[1]);
    let install = "python3 -m venv ~/seaweedfs && ~/seaweedfs/bin/pip install";
    assert!(
        start.contains(install),
        "step 1 installs into ~/seaweedfs:\n{start}"
    );
    let script: String = start
        .lines()
        .filter(|l| !l.starts_with(install))
        .chain(stop.lines())
        .map(|l| format!("{l}\n"))
        .collect();

    let t = Test::new();
    let home = t.mkdir("home");
    let bin = t.mkdir("home/seaweedfs/bin");
    std::os::unix::fs::symlink(&weed, bin.join("weed")).unwrap();
    let path = crate::util::path_with_binary();
    // Its own process group, which is killed whatever happened: a server
    // the script left running would hold the quick start's ports.
    let mut shell = Command::new("bash");
    std::os::unix::process::CommandExt::process_group(&mut shell, 0);
    let child = shell
        .args(["-e", "-c", &script])
        .current_dir(t.path())
        .env("HOME", &home)
        .env("PATH", path)
        .env_remove("DISTRIBUTOR_CONFIG")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let group = child.id();
    let out = child.wait_with_output().unwrap();
    // Whatever is left of the group (nothing, when the stop step ran).
    let _ = rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(group as i32).expect("a pid"),
        rustix::process::Signal::KILL,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the quick start failed:\n{stdout}\n{stderr}"
    );
    // What the doc says each step prints.
    assert!(stdout.contains("ok"), "{stdout}");
    assert!(
        stdout.contains("index.html") && stdout.contains("index.md"),
        "{stdout}"
    );
    assert!(
        stdout.contains("s3://reports/site at http://127.0.0.1:8333"),
        "{stdout}"
    );
    assert!(
        stdout.contains("verify: 2 output(s) checked: ok"),
        "{stdout}"
    );
    assert!(
        !t.join("s3-try").exists(),
        "the stop step removes its folder"
    );
}
