//! The lock of a local root: an operator's `flock` on the lock file
//! pauses publication, a run waits for a briefly held lock, and a catalog
//! changed while a run waits is read again. (Two publishers racing into
//! one root, on every backend, are in `matrix`.)

use crate::util::{DEADLINE, Test, assert_catalog_matches_disk, hold_root_lock};
use std::fs;
use std::time::{Duration, Instant};

fn files(tag: &str, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("{tag}/f{i:02}.txt"), format!("{tag} {i}\n")))
        .collect()
}

fn bundle(t: &Test, name: &str, tag: &str) -> std::path::PathBuf {
    t.bundle(name, &files(tag, 25))
}

#[test]
fn operator_flock_pauses_publication() {
    let t = Test::new();
    t.config(
        "agent:
  lock_timeout: 200ms
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
",
    );
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let lock = hold_root_lock(&t.join("site"));

    let start = Instant::now();
    let out = t.publish("reports", &b, &[]);
    let waited = start.elapsed();
    out.expect_code(1);
    let doc = out.json();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["stage"], "lock");
    assert!(
        doc["error"].as_str().unwrap().contains(".distributor.lock"),
        "{doc}"
    );
    assert!(
        waited >= Duration::from_millis(200),
        "it waited for the lock: {waited:?}"
    );
    let names: Vec<String> = fs::read_dir(t.join("site"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [".distributor.lock"],
        "nothing written while the lock is held"
    );

    // A dry run takes an existing lock too.
    let out = t.publish("reports", &b, &["--dry-run"]);
    out.expect_code(1);
    assert_eq!(out.json()["stage"], "lock");

    drop(lock);
    let out = t.publish("reports", &b, &[]);
    out.expect_code(0);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "a");
}

#[test]
fn a_run_waits_for_a_briefly_held_lock() {
    let t = Test::new();
    t.config(
        "agent:
  lock_timeout: 20s
pipelines:
  - id: reports
    destinations:
      - id: site
        path: ./site
",
    );
    let b = t.bundle("rep.1", &[("a.txt", "a")]);
    let lock = hold_root_lock(&t.join("site"));
    let mut run = t
        .cmd()
        .env("RUST_LOG", "info")
        .args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            "reports",
        ])
        .arg(&b)
        .start();
    run.wait_log("waiting for the lock on", DEADLINE);
    assert!(
        !t.join("site/a.txt").exists(),
        "nothing is written while the lock is held"
    );
    drop(lock);
    let out = run.finish(DEADLINE);
    out.expect_code(0);
    assert_eq!(fs::read_to_string(t.join("site/a.txt")).unwrap(), "a");
}

/// A run parses a large catalog (1 MiB and more) while it inspects the
/// bundle, before it has the root's lock. If someone changes the catalog
/// before the run gets the lock (here a maintenance-like writer that drops
/// a record and its file while the run waits), the run must plan against
/// the new catalog, not the one it read ahead: otherwise the dropped record
/// would come back, for a file that is gone.
#[test]
fn a_catalog_changed_while_a_run_waits_for_the_lock_is_read_again() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
",
    );
    // 3,000 records: a catalog of more than 1 MiB.
    let owned: Vec<(String, String)> = (0..3000)
        .map(|i| (format!("many/f{i:04}.txt"), format!("{i}\n")))
        .collect();
    let first = t.bundle("first", &owned);
    t.publish("p", &first, &[]).expect_code(0);
    let root = t.join("root");
    let catalog = root.join(".distributor.json");
    assert!(fs::metadata(&catalog).unwrap().len() > 1 << 20);

    let second = bundle(&t, "second", "second");
    let lock = hold_root_lock(&root);
    let mut run = t
        .cmd()
        .env("RUST_LOG", "info")
        .args([
            "--config",
            "config.yaml",
            "run",
            "--json",
            "--pipeline",
            "p",
        ])
        .arg(&second)
        .start();
    run.wait_log("waiting for the lock", Duration::from_secs(30));
    // What prune or reconcile-state would do under the lock: drop a file
    // and its record, writing the catalog anew (a new file).
    fs::remove_file(root.join("many/f0007.txt")).unwrap();
    let mut state: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&catalog).unwrap()).unwrap();
    let outputs = state["outputs"].as_array_mut().unwrap();
    outputs.retain(|r| r["path"] != "many/f0007.txt");
    let text = serde_json::to_string_pretty(&state).unwrap() + "\n";
    fs::write(root.join(".distributor-edit"), text).unwrap();
    fs::rename(root.join(".distributor-edit"), &catalog).unwrap();
    drop(lock);

    let out = run.finish(Duration::from_secs(60));
    out.expect_code(0);
    let records = t.recorded("root");
    assert!(
        !records.contains_key("many/f0007.txt"),
        "the record dropped while the run waited came back"
    );
    assert!(records.contains_key("second/f00.txt"));
    assert_eq!(records.len(), 3000 - 1 + 25);
    assert_catalog_matches_disk(&root);
}
