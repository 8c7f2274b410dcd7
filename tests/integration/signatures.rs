//! Signed bundles (docs/contract.md §17.3–17.5) with the real `ssh-keygen`
//! both ways: it signs and we verify, we sign and it verifies; every
//! reason a signature is refused; hostile signature files; replays of
//! older signed bundles; `allowed_signers` re-read on SIGHUP.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::util::{Output, Test, mkfifo, names, read_json, records, wait_exit};

/// A key pair made by `ssh-keygen` in the test folder.
pub struct Key {
    pub private: PathBuf,
    /// The public key line (`type base64 comment`).
    pub public: String,
}

/// `ssh-keygen -t <kind> -N <passphrase>` into `keys/<name>`.
pub fn keygen(t: &Test, name: &str, kind: &[&str], passphrase: &str) -> Key {
    let dir = t.mkdir("keys");
    let private = dir.join(name);
    let status = Command::new("ssh-keygen")
        .args(["-q", "-N", passphrase, "-C", name, "-t"])
        .args(kind)
        .arg("-f")
        .arg(&private)
        .status()
        .expect("ssh-keygen runs (scripts/install-test-deps installs it)");
    assert!(status.success(), "ssh-keygen -t {kind:?}");
    let public = fs::read_to_string(private.with_extension("pub"))
        .unwrap()
        .trim()
        .to_owned();
    Key { private, public }
}

/// `ssh-keygen -Y sign -n <namespace>` of `file` (writes `file.sig`).
pub fn ssh_sign(key: &Path, file: &Path, namespace: &str) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", namespace, "-f"])
        .arg(key)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ssh-keygen -Y sign: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ssh-keygen -Y verify` of `dir/manifest.json` against `allowed` as
/// `principal`: whether it accepts the signature.
fn ssh_verifies(dir: &Path, allowed: &Path, principal: &str) -> bool {
    ssh_verifies_in(dir, allowed, principal, "distributor")
}

/// A test folder with pipeline `docs` publishing into `./site`, taking
/// bundles signed as `docs.signers` allows; `signatures` adds keys to the
/// pipeline's `signatures` (indented as they are).
fn site(signers: &str, signatures: &str) -> Test {
    let t = Test::new();
    t.write("docs.signers", signers);
    t.config(&format!(
        "spool: ./spool
pipelines:
  - id: docs
    signatures:
      allowed_signers: docs.signers
{signatures}    destinations:
      - id: web
        path: ./site
"
    ));
    t
}

/// A sealed bundle `bundles/<name>` holding `index.html` with `text`,
/// created at `created`.
fn sealed(t: &Test, name: &str, created: &str, text: &str) -> PathBuf {
    t.bundle_at(name, name, created, &[("index.html", text)])
}

fn publish(t: &Test, bundle: &Path) -> Output {
    t.publish("docs", bundle, &[])
}

/// `run --json` refused the bundle at verify for `reason`, and nothing
/// reached the root.
#[track_caller]
fn refused_for(t: &Test, bundle: &Path, reason: &str) -> Value {
    let out = publish(t, bundle);
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["stage"], "verify", "{doc}");
    assert_eq!(doc["signature_refused"], reason, "{doc}");
    assert!(doc["signer"].is_null(), "{doc}");
    assert!(
        doc["error"].as_str().unwrap().contains("manifest.json.sig"),
        "{doc}"
    );
    assert!(
        !t.join("site").exists(),
        "{reason}: the root was written: {:?}",
        names(&t.join("site"))
    );
    doc
}

#[test]
fn ssh_keygen_signs_and_we_verify_for_every_key_type() {
    for (kind, bits) in [
        ("ed25519", None),
        ("ecdsa", Some("256")),
        ("ecdsa", Some("384")),
        ("rsa", Some("3072")),
    ] {
        let t = Test::new();
        let mut args = vec!["-t", kind];
        if let Some(bits) = bits {
            args.extend(["-b", bits]);
        }
        let key = keygen(&t, "ci", &args[1..], "");
        let t = {
            let site = site(&format!("ci@project {}\n", key.public), "");
            fs::create_dir_all(site.join("keys")).unwrap();
            fs::copy(&key.private, site.join("keys/ci")).unwrap();
            site
        };
        let bundle = sealed(&t, "b1", "2026-06-04T11:55:00Z", "<h1>one</h1>");
        ssh_sign(
            &t.join("keys/ci"),
            &bundle.join("manifest.json"),
            "distributor",
        );

        // `bundle verify --signers` accepts it as the agent would.
        let mut cmd = t.cmd();
        cmd.args(["bundle", "verify", "--json", "--signers", "docs.signers"])
            .arg(&bundle);
        let out = cmd.output();
        out.expect_code(0);
        let doc = out.json();
        assert_eq!(doc["signer"]["principal"], "ci@project", "{kind}: {doc}");

        let out = publish(&t, &bundle);
        out.expect_code(0);
        let doc = out.json();
        assert_eq!(doc["signer"]["principal"], "ci@project", "{kind}: {doc}");
        let fingerprint = doc["signer"]["key"].as_str().unwrap().to_owned();
        let listed = Command::new("ssh-keygen")
            .arg("-lf")
            .arg(key.private.with_extension("pub"))
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains(&fingerprint),
            "{kind}: the fingerprint {fingerprint} is not what ssh-keygen -l prints"
        );
        assert_eq!(
            fs::read_to_string(t.join("site/index.html")).unwrap(),
            "<h1>one</h1>"
        );
        // Never published.
        assert!(!t.join("site/manifest.json.sig").exists());
        assert!(
            !records(&read_json(&t.join("site/.distributor.json")))
                .contains_key("manifest.json.sig")
        );
    }
}

#[test]
fn we_sign_and_ssh_keygen_verifies_and_a_reseal_drops_the_stale_signature() {
    let t = Test::new();
    let ed = keygen(&t, "ed", &["ed25519"], "");
    let ec = keygen(&t, "ec", &["ecdsa", "-b", "256"], "");
    t.write(
        "allowed",
        format!("ci@ed {}\nci@ec {}\n", ed.public, ec.public),
    );
    for (key, principal) in [(&ed, "ci@ed"), (&ec, "ci@ec")] {
        let dir = t.mkdir(&format!("b-{principal}"));
        fs::write(dir.join("a.txt"), "a").unwrap();
        let mut cmd = t.cmd();
        cmd.args(["bundle", "seal"])
            .arg(&dir)
            .args(["--id", "b", "--sign"])
            .arg(&key.private);
        let out = cmd.output();
        out.expect_code(0);
        assert!(out.stdout.contains("signed"), "{}", out.stdout);
        assert!(ssh_verifies(&dir, &t.join("allowed"), principal));
        // The signature is never listed.
        let manifest = fs::read_to_string(dir.join("manifest.json")).unwrap();
        assert!(!manifest.contains("manifest.json.sig"), "{manifest}");

        // Sealing again (a new manifest) removes the old signature, and
        // signing again makes a valid one.
        fs::write(dir.join("b.txt"), "b").unwrap();
        t.seal(&dir, "b", Some("2026-06-05T00:00:00Z"))
            .expect_code(0);
        assert!(!dir.join("manifest.json.sig").exists());
        let mut cmd = t.cmd();
        cmd.args(["bundle", "seal"])
            .arg(&dir)
            .args(["--id", "b", "--sign"])
            .arg(&key.private);
        cmd.output().expect_code(0);
        assert!(ssh_verifies(&dir, &t.join("allowed"), principal));
    }
}

#[test]
fn an_encrypted_key_is_signed_by_ssh_keygen_with_its_passphrase() {
    let t = Test::new();
    let key = keygen(&t, "locked", &["ed25519"], "correct horse");
    t.write("allowed", format!("ci@locked {}\n", key.public));
    let askpass =
        crate::util::write_script(&t.join("askpass.sh"), "#!/bin/sh\necho 'correct horse'\n");
    let dir = t.mkdir("b");
    fs::write(dir.join("a.txt"), "a").unwrap();
    // `bundle seal --sign` with the passphrase coming from SSH_ASKPASS.
    let seal_signed = || {
        let mut cmd = t.cmd();
        cmd.env("SSH_ASKPASS", &askpass)
            .env("SSH_ASKPASS_REQUIRE", "force")
            .env("DISPLAY", ":0")
            .args(["bundle", "seal"])
            .arg(&dir)
            .args(["--id", "b", "--sign"])
            .arg(&key.private);
        cmd.output()
    };
    seal_signed().expect_code(0);
    assert!(ssh_verifies(&dir, &t.join("allowed"), "ci@locked"));

    // A wrong passphrase: not signed, no signature left, exit 1.
    crate::util::write_script(&askpass, "#!/bin/sh\necho wrong\n");
    t.seal(&dir, "b", None).expect_code(0);
    let out = seal_signed();
    out.expect_code(1);
    assert!(
        out.stderr.contains("sealed, but not signed"),
        "{}",
        out.stderr
    );
    assert!(!dir.join("manifest.json.sig").exists());
}

#[test]
fn each_reason_a_signature_is_refused_is_named_and_nothing_is_written() {
    let probe = Test::new();
    let ci = keygen(&probe, "ci", &["ed25519"], "");
    let stranger = keygen(&probe, "stranger", &["ed25519"], "");
    let sign = |bundle: &Path, key: &Key, ns: &str| {
        ssh_sign(&key.private, &bundle.join("manifest.json"), ns);
    };
    let line = |options: &str| format!("ci@project {options}{}\n", ci.public);
    let cases: Vec<(&str, String, &str)> = vec![
        ("missing", line(""), "missing"),
        ("unknown key", line(""), "unknown_key"),
        ("namespace git", line(""), "wrong_namespace"),
        (
            "line for git only",
            line("namespaces=\"git\" "),
            "wrong_namespace",
        ),
        (
            "not yet valid",
            line("valid-after=\"29990101Z\" "),
            "not_yet_valid",
        ),
        (
            "no longer valid",
            line("valid-before=\"20200101Z\" "),
            "no_longer_valid",
        ),
        ("manifest changed after signing", line(""), "bad_signature"),
    ];
    for (name, signers, reason) in cases {
        let t = site(&signers, "");
        let bundle = sealed(&t, "b", "2026-06-04T11:55:00Z", "x");
        match name {
            "missing" => {}
            "unknown key" => sign(&bundle, &stranger, "distributor"),
            "namespace git" => sign(&bundle, &ci, "git"),
            "manifest changed after signing" => {
                sign(&bundle, &ci, "distributor");
                let manifest = bundle.join("manifest.json");
                let mut text = fs::read(&manifest).unwrap();
                text.push(b'\n');
                fs::write(&manifest, text).unwrap();
            }
            _ => sign(&bundle, &ci, "distributor"),
        }
        let doc = refused_for(&t, &bundle, reason);
        let error = doc["error"].as_str().unwrap();
        assert!(!error.is_empty(), "{name}: {doc}");
    }
}

#[test]
fn hostile_signature_files_are_refused_unread_and_never_block() {
    let probe = Test::new();
    let ci = keygen(&probe, "ci", &["ed25519"], "");
    let real = {
        let t = site(&format!("ci@p {}\n", ci.public), "");
        let b = sealed(&t, "b", "2026-06-04T11:55:00Z", "x");
        ssh_sign(&ci.private, &b.join("manifest.json"), "distributor");
        fs::read_to_string(b.join("manifest.json.sig")).unwrap()
    };
    // (case, what puts it at the signature's name)
    type Make = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Make)> = vec![
        ("empty", Box::new(|p: &Path| fs::write(p, b"").unwrap())),
        (
            "10 MiB",
            Box::new(|p: &Path| fs::write(p, vec![b'A'; 10 << 20]).unwrap()),
        ),
        ("a FIFO", Box::new(|p: &Path| mkfifo(p))),
        (
            "a symlink to a good signature",
            Box::new({
                let real = real.clone();
                move |p: &Path| {
                    let elsewhere = p.with_file_name("../good.sig");
                    fs::write(&elsewhere, &real).unwrap();
                    std::os::unix::fs::symlink(&elsewhere, p).unwrap();
                }
            }),
        ),
        (
            "random bytes",
            Box::new(|p: &Path| {
                let bytes: Vec<u8> = (0..600u32).map(|i| (i * 7919 % 251) as u8).collect();
                fs::write(p, bytes).unwrap()
            }),
        ),
        (
            "truncated base64",
            Box::new({
                let real = real.clone();
                move |p: &Path| fs::write(p, &real[..real.len() * 2 / 3]).unwrap()
            }),
        ),
        ("a folder", Box::new(|p: &Path| fs::create_dir(p).unwrap())),
    ];
    for (name, make) in cases {
        let t = site(&format!("ci@p {}\n", ci.public), "");
        let bundle = sealed(&t, "b", "2026-06-04T11:55:00Z", "x");
        make(&bundle.join("manifest.json.sig"));
        // Run with a deadline: a FIFO opened for reading would block.
        let mut cmd = t.cmd();
        cmd.args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            "docs",
        ])
        .arg(&bundle);
        let mut child = cmd.spawn();
        let status = wait_exit(&mut child, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{name}: run did not finish"));
        let mut stdout = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
        assert_eq!(status.code(), Some(1), "{name}: {stdout}");
        let doc: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(doc["signature_refused"], "malformed", "{name}: {doc}");
        assert!(!t.join("site").exists(), "{name}");
    }
}

#[test]
fn an_older_signed_bundle_dropped_again_cannot_roll_the_site_back() {
    let probe = Test::new();
    let ci = keygen(&probe, "ci", &["ed25519"], "");
    for refuse_older in [true, false] {
        let t = site(
            &format!("ci@p {}\n", ci.public),
            &format!("      refuse_older: {refuse_older}\n"),
        );
        let old = sealed(&t, "v1", "2026-06-01T00:00:00Z", "version 1");
        let new = sealed(&t, "v2", "2026-06-02T00:00:00Z", "version 2");
        for b in [&old, &new] {
            ssh_sign(&ci.private, &b.join("manifest.json"), "distributor");
        }
        publish(&t, &old).expect_code(0);
        publish(&t, &new).expect_code(0);
        // The same bundle again changes nothing and is accepted.
        publish(&t, &new).expect_code(0);
        let out = publish(&t, &old);
        let page = fs::read_to_string(t.join("site/index.html")).unwrap();
        if refuse_older {
            out.expect_code(3);
            let doc = out.json();
            assert_eq!(doc["destinations"][0]["action"], "fail_conflict", "{doc}");
            let error = doc["error"].as_str().unwrap_or_default().to_owned()
                + doc["destinations"][0]["error"].as_str().unwrap_or_default();
            for needed in [
                "index.html",
                "v2",
                "2026-06-02T00:00:00Z",
                "2026-06-01T00:00:00Z",
            ] {
                assert!(error.contains(needed), "{needed} not in {error}");
            }
            assert_eq!(page, "version 2");
            // A bundle from the future would lock its paths: refused at verify.
            let future = sealed(&t, "v9", "2999-01-01T00:00:00Z", "version 9");
            ssh_sign(&ci.private, &future.join("manifest.json"), "distributor");
            let out = publish(&t, &future);
            out.expect_code(1);
            assert!(
                out.all().contains("ahead of this machine's clock"),
                "{}",
                out.all()
            );
            assert_eq!(
                fs::read_to_string(t.join("site/index.html")).unwrap(),
                "version 2"
            );
            let records = records(&read_json(&t.join("site/.distributor.json")));
            assert_eq!(records["index.html"]["source"]["id"], "v2");
        } else {
            out.expect_code(0);
            assert_eq!(page, "version 1");
        }
    }
}

#[test]
fn allowed_signers_is_checked_at_load_and_reread_on_sighup() {
    let probe = Test::new();
    let a = keygen(&probe, "a", &["ed25519"], "");
    let b = keygen(&probe, "b", &["ed25519"], "");

    // Bad files are config errors naming the line.
    for (text, needed) in [
        (
            format!("ci@a cert-authority {}\n", a.public),
            "cert-authority",
        ),
        ("ci@a ssh-ed25519 AAAA!!\n".to_owned(), "line 1"),
        ("# nobody\n".to_owned(), "lists no signer"),
    ] {
        let t = site(&text, "");
        let out = t.run(&["config", "check"]);
        out.expect_code(2);
        assert!(out.stderr.contains(needed), "{needed}: {}", out.stderr);
        assert!(out.stderr.contains("docs.signers"), "{}", out.stderr);
    }

    let t = site(&format!("ci@a {}\n", a.public), "");
    let inbox = t.spool("docs", "inbox");
    let mut agent = t.agent();
    let drop_signed = |name: &str, key: &Key| {
        let staged = sealed(&t, name, "2026-06-04T11:55:00Z", name);
        ssh_sign(&key.private, &staged.join("manifest.json"), "distributor");
        fs::rename(&staged, inbox.join(name)).unwrap();
    };
    let filed = |name: &str| {
        let done = t.spool("docs", "done").join(name);
        let failed = t.spool("docs", "failed").join(name);
        crate::util::wait_for(Duration::from_secs(30), || done.exists() || failed.exists());
        if done.exists() {
            "done"
        } else if failed.exists() {
            "failed"
        } else {
            "neither"
        }
    };
    drop_signed("by-b-1", &b);
    assert_eq!(filed("by-b-1"), "failed");
    drop_signed("by-a", &a);
    assert_eq!(filed("by-a"), "done");
    agent.wait_log(
        "bundle=by-a signer=ci@a key=SHA256:",
        Duration::from_secs(10),
    );

    // b is added; a reload re-reads the file.
    t.write(
        "docs.signers",
        format!("ci@a {}\nci@b {}\n", a.public, b.public),
    );
    agent.signal(libc::SIGHUP);
    agent.wait_log("config reloaded", Duration::from_secs(30));
    drop_signed("by-b-2", &b);
    assert_eq!(filed("by-b-2"), "done");

    // A broken file is refused and the old list stays in force.
    t.write("docs.signers", "ci@b cert-authority ssh-ed25519 AAAA\n");
    agent.signal(libc::SIGHUP);
    agent.wait_log("config reload refused", Duration::from_secs(30));
    assert!(
        agent.stderr().contains("cert-authority"),
        "{}",
        agent.stderr()
    );
    drop_signed("by-b-3", &b);
    assert_eq!(filed("by-b-3"), "done");

    // status counts the refusal by its reason.
    t.write("docs.signers", format!("ci@a {}\n", a.public));
    let out = t.run(&["status", "--json"]);
    let doc = out.json();
    let p = &doc[0];
    assert_eq!(p["signature_refusals"]["unknown_key"], 1, "{p}");
    let out = t.run(&["status"]);
    assert!(out.stdout.contains("1 unknown key"), "{}", out.stdout);
    agent.signal(libc::SIGTERM);
    let stopped = agent.finish(Duration::from_secs(30));
    assert_eq!(stopped.code, 0, "{}", stopped.stderr);
}

#[test]
fn each_principal_publishes_only_inside_its_scopes() {
    let probe = Test::new();
    let a = keygen(&probe, "a", &["ed25519"], "");
    let both = keygen(&probe, "both", &["ed25519"], "");
    let c = keygen(&probe, "c", &["ed25519"], "");
    let signers = format!(
        "ci@a {}\nci@a,ci@b {}\nci@c {}\n",
        a.public, both.public, c.public
    );
    let t = site(
        &signers,
        "      scopes:\n        ci@a: [\"project-a/\"]\n        ci@b: [\"project-b/\", \"index.html\"]\n",
    );
    let bundle = |name: &str, path: &str, key: &Key| {
        let b = t.bundle(name, &[(path, name)]);
        ssh_sign(&key.private, &b.join("manifest.json"), "distributor");
        b
    };
    let out = publish(&t, &bundle("a-in", "project-a/index.html", &a));
    out.expect_code(0);
    assert_eq!(out.json()["signer"]["principal"], "ci@a");

    // Outside its scope: refused at verify, the signer named, nothing written.
    let before = fs::read_to_string(t.join("site/.distributor.json")).unwrap();
    let out = publish(&t, &bundle("a-out", "project-b/index.html", &a));
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["stage"], "verify", "{doc}");
    assert_eq!(doc["signature_refused"], "outside_scope", "{doc}");
    assert_eq!(doc["signer"]["principal"], "ci@a", "{doc}");
    let error = doc["error"].as_str().unwrap();
    assert!(error.contains("\"project-b/index.html\""), "{error}");
    assert!(error.contains("ci@a [\"project-a/\"]"), "{error}");
    assert!(!t.join("site/project-b").exists());
    assert_eq!(
        fs::read_to_string(t.join("site/.distributor.json")).unwrap(),
        before
    );

    // A key listed for two principals may publish into either scope, and is
    // reported as the principal whose scope holds the outputs.
    let out = publish(&t, &bundle("both", "index.html", &both));
    out.expect_code(0);
    assert_eq!(out.json()["signer"]["principal"], "ci@b");

    // A principal without an entry in scopes may publish nothing.
    let out = publish(&t, &bundle("c", "project-a/c.html", &c));
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["signature_refused"], "outside_scope", "{doc}");
    assert!(
        doc["error"]
            .as_str()
            .unwrap()
            .contains("ci@c may publish nothing"),
        "{doc}"
    );

    // A principal no line lists, and scopes that required: false lets an
    // unsigned bundle pass by, are named by config check.
    let t2 = site(
        &signers,
        "      required: false\n      scopes:\n        ci@typo: [\"x/\"]\n",
    );
    let out = t2.run(&["config", "check"]);
    out.expect_code(0);
    assert!(
        out.all().contains("\"ci@typo\", which no line"),
        "{}",
        out.all()
    );
    assert!(out.all().contains("required: false"), "{}", out.all());

    // A bad entry is a config error naming the principal.
    let t = site(&signers, "      scopes:\n        ci@a: [\"../up/\"]\n");
    let out = t.run(&["config", "check"]);
    out.expect_code(2);
    assert!(
        out.stderr.contains("signatures.scopes of \"ci@a\""),
        "{}",
        out.stderr
    );
}

/// A hostile producer of a signed pipeline, as another user, against a
/// live agent: a signature that is a FIFO (which would block a reader), a
/// link to a valid signature of another bundle, and a signature of the
/// producer's own key that allowed_signers does not list. Each is refused
/// for its reason, the agent never blocks, and a properly signed bundle
/// delivered after them is published.
#[test]
fn a_hostile_producer_cannot_pass_or_stall_the_signature_check() {
    use crate::lab::{Lab, NOBODY, WAIT, can_switch_users, result_of};
    if !can_switch_users("a_hostile_producer_cannot_pass_or_stall_the_signature_check") {
        return;
    }
    let lab = Lab::bare("");
    let ci = keygen(&lab.t, "ci", &["ed25519"], "");
    let own = keygen(&lab.t, "own", &["ed25519"], "");
    lab.t
        .write("docs.signers", format!("ci@docs {}\n", ci.public));
    lab.t.config(
        "spool: ./spool
pipelines:
  - id: docs
    signatures:
      allowed_signers: docs.signers
    destinations:
      - id: web
        path: ./site
",
    );
    lab.agent_once(None).expect_code(0);
    lab.open_inbox("docs");
    for name in ["fifo", "link", "own", "good"] {
        let b = lab.sealed(name, &[("index.html", name)]);
        let key = if name == "own" { &own } else { &ci };
        ssh_sign(&key.private, &b.join("manifest.json"), "distributor");
    }
    let mut agent = lab.agent(None);
    let inbox = "spool/docs/inbox";
    lab.producer(
        NOBODY,
        &format!(
            "umask 002 && \
             cp -r bundles/fifo {inbox}/.fifo && rm {inbox}/.fifo/manifest.json.sig && mkfifo {inbox}/.fifo/manifest.json.sig && mv {inbox}/.fifo {inbox}/fifo && \
             cp -r bundles/link {inbox}/.link && rm {inbox}/.link/manifest.json.sig && ln -s \"$PWD/bundles/good/manifest.json.sig\" {inbox}/.link/manifest.json.sig && mv {inbox}/.link {inbox}/link && \
             cp -r bundles/own {inbox}/.own && mv {inbox}/.own {inbox}/own"
        ),
        &[],
    )
    .expect_code(0);
    let failed = lab.spool("docs", "failed");
    let filed = |name: &str| failed.join(name).join(crate::lab::RESULT).exists();
    assert!(
        crate::util::wait_for(WAIT, || ["fifo", "link", "own"].iter().all(|n| filed(n))),
        "not all refused:\n{}",
        lab.t.listing("spool").join("\n")
    );
    for (name, reason) in [
        ("fifo", "malformed"),
        ("link", "malformed"),
        ("own", "unknown_key"),
    ] {
        let result = result_of(&failed.join(name));
        assert_eq!(result["signature_refused"], reason, "{name}: {result}");
    }
    lab.deliver(NOBODY, "docs", "good");
    let done = lab.spool("docs", "done").join("good");
    assert!(
        crate::util::wait_for(WAIT, || done.join(crate::lab::RESULT).exists()),
        "{}",
        agent.log()
    );
    assert_eq!(result_of(&done)["signer"]["principal"], "ci@docs");
    assert_eq!(
        fs::read_to_string(lab.join("site/index.html")).unwrap(),
        "good"
    );
    assert!(agent.running());
    let (code, _) = agent.terminate(WAIT);
    assert_eq!(code, 0, "{}", agent.log());
}

/// Two principals share one replacement destination, each in its own
/// scope: a replacement by one deletes only its own earlier outputs,
/// never what the other published (docs/contract.md §17.4).
#[test]
fn a_replacement_by_one_principal_never_deletes_another_principals_outputs() {
    let t = Test::new();
    let a = keygen(&t, "a", &["ed25519"], "");
    let b = keygen(&t, "b", &["ed25519"], "");
    t.write(
        "docs.signers",
        format!("ci@a {}\nci@b {}\n", a.public, b.public),
    );
    t.config(
        "spool: ./spool
pipelines:
  - id: docs
    signatures:
      allowed_signers: docs.signers
      scopes:
        ci@a: [\"a/\"]
        ci@b: [\"b/\"]
    destinations:
      - id: web
        path: ./site
        workflow: replacement
",
    );
    let signed = |name: &str, created: &str, path: &str, key: &Key| {
        let dir = t.bundle_at(name, name, created, &[(path, name)]);
        ssh_sign(&key.private, &dir.join("manifest.json"), "distributor");
        publish(&t, &dir).expect_code(0);
    };
    signed("a1", "2026-06-01T00:00:00Z", "a/one.html", &a);
    signed("b1", "2026-06-02T00:00:00Z", "b/one.html", &b);
    signed("a2", "2026-06-03T00:00:00Z", "a/two.html", &a);
    assert!(
        !t.join("site/a/one.html").exists(),
        "a's own old output stays"
    );
    assert_eq!(fs::read_to_string(t.join("site/a/two.html")).unwrap(), "a2");
    assert_eq!(fs::read_to_string(t.join("site/b/one.html")).unwrap(), "b1");
    let recorded: Vec<String> = records(&read_json(&t.join("site/.distributor.json")))
        .into_keys()
        .collect();
    assert_eq!(recorded, ["a/two.html", "b/one.html"]);
}

/// A pipeline may require a namespace of its own
/// (`signatures.namespace`): a key listed for two pipelines then signs for
/// one of them at a time. A bundle signed by `ssh-keygen -Y sign -n` in
/// that namespace is published; the same bundle signed in `distributor`
/// (valid wherever the key is listed with the default namespace) is
/// refused as `wrong_namespace`, naming both. `bundle seal --sign` and
/// `bundle verify --signers` take `--namespace`, and a namespace that is
/// not a plain name is a config error.
#[test]
fn a_pipeline_with_a_namespace_of_its_own_takes_only_signatures_made_in_it() {
    let probe = Test::new();
    let ci = keygen(&probe, "ci", &["ed25519"], "");
    let t = site(
        &format!("ci@p {}\n", ci.public),
        "      namespace: docs@example.org\n",
    );
    let other = sealed(&t, "other", "2026-06-01T00:00:00Z", "for another pipeline");
    ssh_sign(&ci.private, &other.join("manifest.json"), "distributor");
    let doc = refused_for(&t, &other, "wrong_namespace");
    let error = doc["error"].as_str().unwrap();
    assert!(error.contains("\"distributor\""), "{error}");
    assert!(error.contains("docs@example.org"), "{error}");

    let ours = sealed(&t, "ours", "2026-06-02T00:00:00Z", "docs");
    ssh_sign(&ci.private, &ours.join("manifest.json"), "docs@example.org");
    let out = publish(&t, &ours);
    out.expect_code(0);
    assert_eq!(out.json()["signer"]["principal"], "ci@p");
    assert_eq!(
        fs::read_to_string(t.join("site/index.html")).unwrap(),
        "docs"
    );

    // The producer's helpers sign and check in it too.
    let dir = t.write("sealed/index.html", "sealed and signed");
    let dir = dir.parent().unwrap();
    let key = ci.private.to_str().unwrap();
    let folder = dir.to_str().unwrap();
    t.run(&[
        "bundle",
        "seal",
        folder,
        "--id",
        "s",
        "--sign",
        key,
        "--namespace",
        "docs@example.org",
    ])
    .expect_code(0);
    assert!(ssh_verifies_in(
        dir,
        &t.join("docs.signers"),
        "ci@p",
        "docs@example.org"
    ));
    let signers = t.join("docs.signers");
    let signers = signers.to_str().unwrap();
    t.run(&[
        "bundle",
        "verify",
        folder,
        "--signers",
        signers,
        "--namespace",
        "docs@example.org",
    ])
    .expect_code(0);
    let wrong = t.run(&["bundle", "verify", folder, "--signers", signers]);
    wrong.expect_code(1);
    assert!(wrong.all().contains("namespace"), "{}", wrong.all());

    let bad = site(
        &format!("ci@p {}\n", ci.public),
        "      namespace: \"a b\"\n",
    );
    let out = bad.run(&["config", "check"]);
    out.expect_code(2);
    assert!(out.all().contains("namespace"), "{}", out.all());
}

/// `ssh-keygen -Y verify -n <namespace>` of `dir/manifest.json`.
fn ssh_verifies_in(dir: &Path, allowed: &Path, principal: &str, namespace: &str) -> bool {
    let manifest = fs::File::open(dir.join("manifest.json")).unwrap();
    Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", namespace, "-f"])
        .arg(allowed)
        .args(["-I", principal, "-s"])
        .arg(dir.join("manifest.json.sig"))
        .stdin(manifest)
        .output()
        .unwrap()
        .status
        .success()
}

/// `refuse_older` protected records, not paths: a replacement that deleted
/// a page left no record of it, so replaying the old signed bundle that
/// wrote it brought the retracted page back. The agent remembers what
/// each publication deleted (a tombstone with the deleting source's
/// `created`, in the pipeline's spool) and refuses an older bundle that
/// writes such a path again; a newer one may (and the tombstone goes).
#[test]
fn a_replayed_bundle_cannot_bring_back_a_page_a_later_publication_deleted() {
    let probe = Test::new();
    let a = keygen(&probe, "a", &["ed25519"], "");
    let b = keygen(&probe, "b", &["ed25519"], "");
    let t = Test::new();
    t.write(
        "docs.signers",
        format!("ci@a {}\nci@b {}\n", a.public, b.public),
    );
    t.config(
        "spool: ./spool
agent: {settle: 0s}
pipelines:
  - id: docs
    signatures:
      allowed_signers: docs.signers
      scopes:
        ci@a: [\"docs/\"]
        ci@b: [\"docs/\", \"news/\"]
    destinations:
      - id: web
        path: ./site
        workflow: replacement
",
    );
    let deliver = |name: &str, key: &Path, created: &str, files: &[(&str, &str)]| {
        let dir = t.bundle_at(name, name, created, files);
        ssh_sign(key, &dir.join("manifest.json"), "distributor");
        fs::create_dir_all(t.join("spool/docs/inbox")).unwrap();
        fs::rename(&dir, t.join(&format!("spool/docs/inbox/{name}"))).unwrap();
        t.run(&["agent", "--once"])
    };
    deliver(
        "a1",
        &a.private,
        "2026-06-01T00:00:00Z",
        &[("docs/old.html", "old page")],
    )
    .expect_code(0);
    let kept = t.join("a1-copy");
    copy_folder(&t.join("spool/docs/done/a1"), &kept);
    // B's replacement (its scope holds docs/) retracts the page.
    deliver(
        "b2",
        &b.private,
        "2026-06-02T00:00:00Z",
        &[("news/n.html", "news")],
    )
    .expect_code(0);
    assert!(!t.join("site/docs/old.html").exists(), "retracted");

    // The same signed bundle, dropped again.
    let _ = fs::remove_file(kept.join(".distributor-result.json"));
    let _ = fs::remove_file(kept.join(".distributor-attempts"));
    fs::rename(&kept, t.join("spool/docs/inbox/replay")).unwrap();
    t.run(&["agent", "--once"]).expect_code(1);
    assert!(
        !t.join("site/docs/old.html").exists(),
        "the retracted page came back"
    );
    let result = read_json(&t.join("spool/docs/failed/replay/.distributor-result.json"));
    assert_eq!(
        result["destinations"][0]["action"], "fail_conflict",
        "{result}"
    );
    let error = result["error"].as_str().unwrap();
    for needed in [
        "docs/old.html",
        "b2, which deleted it",
        "2026-06-02T00:00:00Z",
    ] {
        assert!(error.contains(needed), "{needed} not in {error}");
    }

    // Newer content may take the path again; the tombstone goes with it.
    deliver(
        "a3",
        &a.private,
        "2026-06-03T00:00:00Z",
        &[("docs/old.html", "back, newer")],
    )
    .expect_code(0);
    assert_eq!(
        fs::read_to_string(t.join("site/docs/old.html")).unwrap(),
        "back, newer"
    );
    let tombstones =
        fs::read_to_string(t.join("spool/docs/.distributor-tombstones.json")).unwrap_or_default();
    assert!(!tombstones.contains("docs/old.html"), "{tombstones}");

    // In one burst: B retracts the page again, and the replay of a3 right
    // behind it is published in the same batch; the batch's own deletion
    // refuses it.
    let replay = t.join("a3-copy");
    copy_folder(&t.join("spool/docs/done/a3"), &replay);
    let _ = fs::remove_file(replay.join(".distributor-result.json"));
    let b5 = t.bundle_at(
        "b5",
        "b5",
        "2026-06-05T00:00:00Z",
        &[("news/n.html", "news again")],
    );
    ssh_sign(&b.private, &b5.join("manifest.json"), "distributor");
    crate::util::arrive_in_order(&b5, 100);
    crate::util::arrive_in_order(&replay, 101);
    fs::rename(&b5, t.join("spool/docs/inbox/b5")).unwrap();
    fs::rename(&replay, t.join("spool/docs/inbox/a3-again")).unwrap();
    let out = t
        .cmd()
        .env("RUST_LOG", "info")
        .args(["--config", "config.yaml", "agent", "--once"])
        .output();
    out.expect_code(1);
    assert!(
        out.stderr.contains("published a batch of"),
        "{}",
        out.stderr
    );
    assert!(t.join("spool/docs/done/b5").is_dir());
    assert!(
        !t.join("site/docs/old.html").exists(),
        "the retracted page came back"
    );
    let result = read_json(&t.join("spool/docs/failed/a3-again/.distributor-result.json"));
    let error = result["error"].as_str().unwrap();
    assert!(error.contains("b5, which deleted it"), "{error}");
}

/// `cp -a FROM TO`: a filed bundle, copied as a producer would drop it
/// again (its signature with it).
fn copy_folder(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        copied.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}
