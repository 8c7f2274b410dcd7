//! Crash safety (docs/contract.md §7): `run` killed with SIGKILL at any instant, then
//! rerun, leaves a root whose catalog matches its bytes, with nothing the
//! tool wrote left unrecorded and nothing unrelated touched.

use crate::util::{Rng, Test, assert_catalog_matches_disk, sha256_file, shape};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MIN_ITERATIONS: usize = 30;
const MAX_ITERATIONS: usize = 60;

/// Writes and seals a bundle of ~350 small files and one large one (a
/// single publication large enough to be made durable by barriers).
/// `variant` changes contents, sizes and part of the path set; 40 files are
/// the same in every variant.
fn big_bundle(t: &Test, name: &str, variant: u64) -> (PathBuf, BTreeSet<String>) {
    let dir = t.mkdir(&format!("bundles/{name}"));
    let mut paths = BTreeSet::new();
    for i in 0..280u64 {
        let path = format!("d{}/f{i:03}.txt", i % 12);
        let body = format!(
            "{name} file {i} {}\n",
            "x".repeat(((i * 7 + variant * 13) % 200) as usize)
        );
        crate::util::write_file(&dir.join(&path), body.as_bytes());
        paths.insert(path);
    }
    for i in 0..30u64 {
        let path = format!("only-{name}/g{i}.txt");
        crate::util::write_file(&dir.join(&path), format!("{name} {i}").as_bytes());
        paths.insert(path);
    }
    // The same bytes in every variant: a rerun keeps these files in place.
    for i in 0..40u64 {
        let path = format!("same/s{i:02}.txt");
        crate::util::write_file(&dir.join(&path), format!("shared {i}\n").as_bytes());
        paths.insert(path);
    }
    crate::util::write_file(
        &dir.join("blob.bin"),
        &Rng::new(0x9e37_79b9 + variant).bytes(1_000_000),
    );
    paths.insert("blob.bin".to_owned());
    t.seal(&dir, name, Some("2026-06-04T11:55:00Z"))
        .expect_code(0);
    (dir, paths)
}

/// Temporary files and journals left anywhere in a root.
fn reserved_leftovers(root: &Path) -> Vec<String> {
    shape(root)
        .paths()
        .into_iter()
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            name.starts_with(".distributor-tmp-") || name == ".distributor-journal.json"
        })
        .collect()
}

#[test]
fn killed_runs_always_recover_on_rerun() {
    let t = Test::on_tmpfs();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: add
        path: ./roots/add
        workflow: additive
      - id: rep
        path: ./roots/rep
        workflow: replacement
      - id: probe
        path: ./roots/probe
",
    );
    let sentinel = t.write("roots/unrelated.txt", "not managed by anyone");
    let sentinel_hash = sha256_file(&sentinel);
    let bundles = [big_bundle(&t, "alpha", 1), big_bundle(&t, "beta", 2)];

    // How long an uninterrupted publication takes here: the quickest of a
    // few (each one really writes: the bundles alternate).
    let mut duration = Duration::MAX;
    for round in 0..4 {
        let (dir, _) = &bundles[round % 2];
        let start = Instant::now();
        t.publish("p", dir, &["--destination", "probe"])
            .expect_code(0);
        duration = duration.min(start.elapsed());
    }

    let mut mid_publication = 0;
    let mut finished_first = 0;
    let mut i = 0;
    // At least MIN_ITERATIONS kills spread over the whole run; then, on a
    // machine slow enough that too few landed mid-publication, more kills
    // in the second half of the run (bounded).
    while i < MIN_ITERATIONS || (mid_publication < 3 && i < MAX_ITERATIONS) {
        let (dest, workflow) = if i % 2 == 0 {
            ("add", "additive")
        } else {
            ("rep", "replacement")
        };
        let (bundle, paths) = &bundles[(i / 2) % 2];
        let root = t.join(&format!("roots/{dest}"));
        // Shuffled kill instants from 0 to a little past the run's length,
        // denser towards the end, where publication happens.
        let frac = if i < MIN_ITERATIONS {
            ((i * 13) % MIN_ITERATIONS) as f64 / MIN_ITERATIONS as f64
        } else {
            0.5 + ((i * 7) % 10) as f64 / 20.0
        };
        let delay = duration.mul_f64(frac.sqrt());

        let mut child = t
            .cmd()
            .args([
                "--config",
                "config.yaml",
                "run",
                "--pipeline",
                "p",
                "--destination",
                dest,
            ])
            .arg(bundle)
            .spawn_quiet();
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().expect("wait for killed run");
        if status.code().is_some() {
            // The run was quicker than measured: aim earlier from now on.
            finished_first += 1;
            duration = duration.mul_f64(0.85);
        }
        if root.join(".distributor-journal.json").exists() {
            mid_publication += 1;
        }

        let out = t.publish("p", bundle, &["--destination", dest]);
        let context = format!("iteration {i} ({workflow}, kill after {delay:?})");
        assert_eq!(out.code, 0, "{context}: rerun failed\n{}", out.all());
        let action = out.dest()["action"].as_str().unwrap_or_default().to_owned();
        assert!(
            !action.starts_with("fail_"),
            "{context}: a partly written publication must never be refused ({action})"
        );
        assert_catalog_matches_disk(&root);
        assert_eq!(
            reserved_leftovers(&root),
            Vec::<String>::new(),
            "{context}: leftovers"
        );
        let recs = t.recorded(&format!("roots/{dest}"));
        let bundle_id = bundle.file_name().unwrap().to_str().unwrap();
        for path in paths {
            assert_eq!(
                recs[path]["source"]["id"], bundle_id,
                "{context}: {path} is this bundle's"
            );
        }
        if workflow == "replacement" {
            let recorded: BTreeSet<String> = recs.keys().cloned().collect();
            assert_eq!(
                &recorded, paths,
                "{context}: replacement holds exactly this bundle"
            );
        }
        assert_eq!(
            sha256_file(&sentinel),
            sentinel_hash,
            "{context}: unrelated file touched"
        );
        i += 1;
    }
    println!(
        "crash: {i} kills over a {duration:?} run: {mid_publication} mid-publication (journal present), {finished_first} after the run had finished"
    );
    assert!(
        mid_publication >= 3,
        "only {mid_publication} kills landed mid-publication"
    );
}

/// A run killed between creating the journal's temporary file and renaming
/// it leaves `.distributor-tmp-<pid>-<n>` at the top of the root with no
/// journal pointing at it. The next run holds the lock, so any temporary
/// file there is stale and should go.
#[test]
fn stale_temporary_file_at_the_top_of_a_root_is_removed() {
    let t = Test::new();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
",
    );
    let b1 = t.bundle("one", &[("a.txt", "a")]);
    let b2 = t.bundle("two", &[("b.txt", "b")]);
    t.publish("p", &b1, &[]).expect_code(0);
    // What the killed run left: a half-written journal under a temporary name.
    t.write("root/.distributor-tmp-4242-0", "{\"writes\":[{\"new\":");
    let out = t.publish("p", &b2, &[]);
    out.expect_code(0);
    assert_eq!(out.dest()["action"], "upsert_additive");
    assert_eq!(
        reserved_leftovers_all(&t.join("root")),
        Vec::<String>::new()
    );
}

fn reserved_leftovers_all(root: &Path) -> Vec<String> {
    shape(root)
        .paths()
        .into_iter()
        .filter(|p| {
            p.rsplit('/')
                .next()
                .unwrap_or(p)
                .starts_with(".distributor-tmp-")
        })
        .collect()
}

/// After a kill mid-publication, a dry run reports what the rerun would do
/// and still changes nothing; the real rerun then finishes the job.
#[test]
fn dry_run_over_an_interrupted_publication_changes_nothing() {
    let t = Test::on_tmpfs();
    t.config(
        "pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: replacement
",
    );
    let (bundle, paths) = big_bundle(&t, "alpha", 3);
    let root = t.join("root");
    let start = Instant::now();
    t.publish("p", &bundle, &[]).expect_code(0);
    let duration = start.elapsed();
    let (bundle2, paths2) = big_bundle(&t, "beta", 4);

    let mut interrupted = false;
    for attempt in 0..40u32 {
        let delay = duration.mul_f64(0.4 + f64::from(attempt % 12) * 0.05);
        let mut child = t
            .cmd()
            .args(["--config", "config.yaml", "run", "--pipeline", "p"])
            .arg(&bundle2)
            .spawn_quiet();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        if root.join(".distributor-journal.json").exists() {
            interrupted = true;
            break;
        }
        // Put the root back to the first bundle and try another instant.
        t.publish("p", &bundle, &[]).expect_code(0);
    }
    assert!(interrupted, "no kill landed mid-publication in 40 attempts");

    let before = crate::util::tree(&root);
    let out = t.publish("p", &bundle2, &["--dry-run"]);
    out.expect_code(0);
    assert!(
        !out.dest()["action"].as_str().unwrap().starts_with("fail_"),
        "{}",
        out.stdout
    );
    assert_eq!(
        crate::util::tree(&root),
        before,
        "the dry run changed the interrupted root"
    );

    let out = t.publish("p", &bundle2, &[]);
    out.expect_code(0);
    assert_catalog_matches_disk(&root);
    assert!(!root.join(".distributor-journal.json").exists());
    let recorded: BTreeSet<String> = t.recorded("root").into_keys().collect();
    assert_ne!(recorded, paths);
    assert_eq!(recorded, paths2, "the second bundle replaced the first");
}
