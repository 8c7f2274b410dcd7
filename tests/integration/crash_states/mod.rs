//! Crash states of the local backend (docs/reliability.md, "Crash
//! states"): a command is recorded with strace ([`trace`]), turned into
//! operations on a model of the test folder ([`model`]), and every state a
//! power cut could leave, within the bounds, is written back into the test
//! folder; then what a restart runs is run on it and the invariants are
//! checked ([`check`]). The scenarios are in [`scenarios`].
//!
//! `cargo test --test integration crash_states` checks a sample of each
//! scenario's states; `DISTRIBUTOR_CRASH_STATES=full` lifts the bounds
//! (bench/crash-states).

pub mod check;
mod lazyfs;
pub mod model;
mod scenarios;
pub mod trace;

use crate::util::{BIN, Output, Test, wait_output};
use model::{Bounds, Image, Shown};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

pub type Listing = BTreeMap<String, Shown>;

/// The agent's record of its own presence (its pid and start), which
/// every start rewrites.
const PRESENCE: &str = "/.distributor-agent.json";

/// What a restart sees: the test folder before the command, after it
/// ran uncrashed, in the crash state, and after the restart.
pub struct Ctx<'a> {
    pub initial: &'a Listing,
    pub reference: &'a Listing,
    pub state: &'a Listing,
    /// After the restart's commands (`None` while checking the state).
    pub after: Option<&'a Listing>,
}

/// The invariants of a scenario: the violations found in a crash state
/// (`after` `None`) or after the restart.
pub type Check = Box<dyn Fn(&Ctx) -> Vec<String>>;

/// One recorded command and how to check its crash states.
pub struct Scenario {
    pub name: &'static str,
    pub t: Test,
    /// Arguments after `--config config.yaml`.
    pub command: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// The exit code of the command run uncrashed.
    pub code: i32,
    /// What a restart runs, in order, with the exit codes allowed.
    pub restart: Vec<(Vec<String>, Vec<i32>)>,
    /// Top-level entries of the test folder the commands may change;
    /// everything else must stay as it was (the config, bundles run from
    /// outside the spool, files planted beside the roots).
    pub changes: Vec<&'static str>,
    /// The invariants of a crash state, and of the tree after the restart.
    pub check: Check,
    /// A lock the test holds while the command is recorded, released
    /// before any restart.
    pub held: std::cell::RefCell<Option<std::fs::File>>,
}

/// What an exploration found.
#[derive(Debug, Default)]
pub struct Report {
    pub ops: usize,
    pub points: usize,
    pub enumerated: usize,
    pub distinct: usize,
    pub checked: usize,
    pub violations: Vec<String>,
    pub secs: f64,
}

/// The bounds of this run: the sample, everything with
/// `DISTRIBUTOR_CRASH_STATES=full`, or everything counted and none
/// checked with `DISTRIBUTOR_CRASH_STATES=count`.
pub fn bounds() -> Bounds {
    match std::env::var("DISTRIBUTOR_CRASH_STATES").as_deref() {
        Ok("full") => Bounds::FULL,
        Ok("count") => Bounds {
            max_states: 0,
            ..Bounds::FULL
        },
        _ => Bounds::SAMPLE,
    }
}

/// The binary run in `dir` with the scenario's config and environment.
pub fn command_in(s: &Scenario, dir: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir)
        .env_remove("DISTRIBUTOR_CONFIG")
        .env_remove("DISTRIBUTOR_FAILPOINT")
        .env("RUST_LOG", "warn")
        .args(["--config", "config.yaml"])
        .args(args);
    for (k, v) in &s.env {
        cmd.env(k, v);
    }
    cmd
}

fn run_in(s: &Scenario, dir: &Path, args: &[String]) -> Output {
    let child = command_in(s, dir, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn distributor");
    wait_output(child, &args.join(" "))
}

/// What the folder `dir` holds.
pub fn listing_of(s: &Scenario, dir: &Path) -> Listing {
    Image::read(dir)
        .and_then(|i| i.listing().map_err(std::io::Error::other))
        .unwrap_or_else(|e| panic!("{}: cannot read {}: {e}", s.name, dir.display()))
}

/// Paths outside `changes` that differ from the initial tree.
fn untouched(s: &Scenario, initial: &Listing, now: &Listing) -> Vec<String> {
    let outside = |p: &String| {
        !s.changes
            .iter()
            .any(|c| p == c || p.starts_with(&format!("{c}/")))
    };
    let a: Listing = initial
        .iter()
        .filter(|(p, _)| outside(p))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect();
    let b: Listing = now
        .iter()
        .filter(|(p, _)| outside(p))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect();
    model::differ(&a, &b)
        .map(|d| vec![format!("a path nothing may change changed: {d}")])
        .unwrap_or_default()
}

/// A scenario's command, recorded: its model, and the test folder
/// before and after it.
pub struct Recorded {
    pub model: model::Model,
    pub initial: Listing,
    pub reference: Listing,
}

/// Runs the scenario's command under strace and models it; fails when
/// the model does not end where the command did.
pub fn record(s: &Scenario) -> Recorded {
    let root = model::canonical(s.t.path());
    let initial_image = Image::read(&root).expect("read the initial tree");
    let initial = initial_image.listing().expect("initial listing");
    let scratch = tempfile::tempdir().expect("scratch folder");
    let record = scratch.path().join("strace.txt");
    let code = trace::record(&mut command_in(s, &root, &s.command), &record);
    drop(s.held.borrow_mut().take());
    let text = std::fs::read_to_string(&record).expect("read the record");
    if let Ok(keep) = std::env::var("DISTRIBUTOR_CRASH_STATES_RECORDS") {
        let _ = std::fs::write(
            std::path::Path::new(&keep).join(format!("{}.strace", s.name)),
            &text,
        );
    }
    assert_eq!(
        code,
        s.code,
        "{}: the traced command exited {code}\n{}",
        s.name,
        text.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
    let calls = trace::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", s.name));
    let m = model::from_calls(&root, initial_image, &calls, model::umask())
        .unwrap_or_else(|e| panic!("{}: {e}", s.name));
    let reference = listing_of(s, &root);
    // The model must end where the command did, or its states mean nothing.
    let modelled = m.last().listing().expect("final listing");
    if let Some(d) = model::differ(&modelled, &reference) {
        panic!(
            "{}: the modelled tree differs from the real one after the command (model vs real): {d}",
            s.name
        );
    }
    Recorded {
        model: m,
        initial,
        reference,
    }
}

/// Records the scenario's command, explores its crash states within
/// `bounds`, and reports.
pub fn explore(s: &Scenario, bounds: &Bounds) -> Report {
    explore_with(s, bounds.max_states, |m| m.crashes(bounds))
}

/// Records the scenario's command, checks at most `max_states` of the
/// distinct crash states `pick` makes of its model, and reports.
pub fn explore_with(
    s: &Scenario,
    max_states: usize,
    pick: impl Fn(&model::Model) -> Vec<model::Crash>,
) -> Report {
    let start = Instant::now();
    let root = model::canonical(s.t.path());
    let Recorded {
        model: m,
        initial,
        reference,
    } = record(s);
    let mut report = Report {
        ops: m.ops.len(),
        points: m.points().len(),
        ..Report::default()
    };
    let crashes = pick(&m);
    report.enumerated = crashes.len();
    // Only the crash is kept of each distinct state: its tree is built
    // again when checked (trees of large publications take megabytes).
    let mut seen = HashSet::new();
    let mut distinct = Vec::new();
    for crash in crashes {
        let digest = m
            .build(&crash)
            .digest()
            .unwrap_or_else(|e| panic!("{}: {}: {e}", s.name, crash.label));
        if seen.insert(digest) {
            distinct.push(crash);
        }
    }
    report.distinct = distinct.len();
    for i in model::spread(distinct.len(), max_states) {
        let crash = &distinct[i];
        report.checked += 1;
        let image = m.build(crash);
        let mut found = check_state(s, &root, &image, &initial, &reference);
        if !found.is_empty() {
            found.truncate(5);
            report.violations.push(format!(
                "{}: {}:\n    {}",
                s.name,
                crash.label,
                found.join("\n    ")
            ));
        }
    }
    report.secs = start.elapsed().as_secs_f64();
    eprintln!(
        "crash-states {}: {} ops, {} crash points, {} states enumerated, {} distinct, {} checked, {} violations, {:.1}s",
        s.name,
        report.ops,
        report.points,
        report.enumerated,
        report.distinct,
        report.checked,
        report.violations.len(),
        report.secs
    );
    report
}

/// Writes one crash state, checks it, runs the restart twice and checks
/// what it leaves; returns the violations.
fn check_state(
    s: &Scenario,
    root: &Path,
    image: &Image,
    initial: &Listing,
    reference: &Listing,
) -> Vec<String> {
    image
        .write(root)
        .unwrap_or_else(|e| panic!("{}: cannot write a crash state: {e}", s.name));
    let state = image.listing().expect("state listing");
    restart_and_check(s, root, initial, reference, &state)
}

/// Checks the crash state `state` that folder `dir` holds, runs the
/// restart on it twice and checks what it leaves; returns the violations.
pub fn restart_and_check(
    s: &Scenario,
    dir: &Path,
    initial: &Listing,
    reference: &Listing,
    state: &Listing,
) -> Vec<String> {
    let mut found = untouched(s, initial, state);
    found.extend((s.check)(&Ctx {
        initial,
        reference,
        state,
        after: None,
    }));
    let restart = |found: &mut Vec<String>| {
        for (args, codes) in &s.restart {
            let out = run_in(s, dir, args);
            if !codes.contains(&out.code) {
                found.push(format!(
                    "the restart's `{}` exited {}:\n{}",
                    args.join(" "),
                    out.code,
                    out.stderr.lines().take(6).collect::<Vec<_>>().join("\n")
                ));
            }
        }
    };
    restart(&mut found);
    let after = listing_of(s, dir);
    found.extend(untouched(s, initial, &after));
    found.extend((s.check)(&Ctx {
        initial,
        reference,
        state,
        after: Some(&after),
    }));
    // The restart converged: running it again changes nothing.
    restart(&mut found);
    let again = listing_of(s, dir);
    let lasting = |l: &Listing| -> Listing {
        l.iter()
            .filter(|(p, _)| !p.ends_with(PRESENCE))
            .map(|(p, v)| (p.clone(), v.clone()))
            .collect()
    };
    if let Some(d) = model::differ(&lasting(&after), &lasting(&again)) {
        found.push(format!(
            "a second restart changed the tree (first vs second): {d}"
        ));
    }
    found
}

/// Runs `s` with the bounds of this run and fails on any violation.
pub fn assert_no_violation(s: Scenario) {
    assert_no_violation_in(s, usize::MAX);
}

/// [`assert_no_violation`], checking at most `sample` states when this
/// run checks a sample (a scenario whose every state costs seconds).
pub fn assert_no_violation_in(s: Scenario, sample: usize) {
    let mut bounds = bounds();
    if bounds.max_states == Bounds::SAMPLE.max_states {
        bounds.max_states = bounds.max_states.min(sample);
    }
    let report = explore(&s, &bounds);
    assert!(
        report.checked > 0 || bounds.max_states == 0,
        "{}: no crash state checked",
        s.name
    );
    assert!(
        report.violations.is_empty(),
        "{} of {} crash states checked break an invariant; the first:\n{}",
        report.violations.len(),
        report.checked,
        report
            .violations
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
