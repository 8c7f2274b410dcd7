//! The commands whose crash states are explored, one test each: `run`
//! (a new root, additive, a replacement with deletes, a tree of 1,000
//! files), `agent --once` (claims, publishes, files into done/ and
//! failed/, and a deferral), `prune --apply`, `reconcile-state`, and
//! releases (a conversion and a switch with retention).

use super::check::{
    as_reference, catalog, outputs_are_versions, planted_kept, release_is_whole, settled,
    spool_whole, view,
};
use super::model::Op;
use super::{Ctx, Scenario, assert_no_violation, assert_no_violation_in};
use crate::util::{Test, arrive_in_order, hold_root_lock, read_state, write_file};
use std::fs;

/// `DISTRIBUTOR_TEST_UNWRITTEN` for each way a small publication is made
/// durable: one `syncfs`, or a fsync of each file and folder.
const BARRIER: &str = "0";
const FILE_BY_FILE: &str = "18446744073709551615";

fn config(workflow: &str, extra: &str, agent: &str) -> String {
    format!(
        "spool: ./spool
agent:
  settle: 0s
  lock_timeout: 5s
{agent}pipelines:
  - id: p
    destinations:
      - id: d
        path: ./root
        workflow: {workflow}
        publish: {{source: true, html: true}}
{extra}"
    )
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The checks of a root `root` written by the command: in a crash state,
/// outputs of one publication or the other, the files the test planted
/// untouched and a catalog that parses; after the restart, a settled root
/// holding what the uncrashed command left.
fn root_checks(
    root: &'static str,
    planted: &'static [&'static str],
) -> impl Fn(&Ctx) -> Vec<String> {
    move |c: &Ctx| {
        let mut found = Vec::new();
        match c.after {
            None => {
                found.extend(outputs_are_versions(c.initial, c.reference, c.state, root));
                let before = view(c.initial, root);
                found.extend(planted_kept(&before, &view(c.state, root), root, planted));
                if let Err(e) = catalog(&view(c.state, root)) {
                    found.push(format!("{root} in the crash state: {e}"));
                }
            }
            Some(after) => {
                found.extend(settled(c.initial, after, root, planted));
                found.extend(as_reference(c.reference, after, root));
            }
        }
        found
    }
}

fn first(t: &Test) {
    t.bundle_at(
        "v1",
        "first",
        "2026-06-01T00:00:00Z",
        &[
            ("report.md", "# One\n\nfirst version\n"),
            ("old.txt", "old\n"),
            ("sub/gone.md", "# Gone\n"),
            ("keep.txt", "same in both\n"),
        ],
    );
}

fn second(t: &Test) {
    t.bundle_at(
        "v2",
        "second",
        "2026-06-02T00:00:00Z",
        &[
            (
                "report.md",
                "# Two\n\nsecond version, longer than the first\n",
            ),
            ("keep.txt", "same in both\n"),
            ("sub/new.txt", "new in sub\n"),
            ("new/deep/file.txt", "new\n"),
        ],
    );
}

const PLANTED: &[&str] = &["unmanaged.txt", "sub/planted.txt"];

/// `run` of the second bundle over a root holding the first, with files
/// planted in it, made durable the way `unwritten` makes it.
fn run_scenario(name: &'static str, workflow: &str, unwritten: &str, fresh: bool) -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config(workflow, "", ""));
    t.write("outside.txt", "beside the root\n");
    first(&t);
    second(&t);
    let planted: &'static [&'static str] = if fresh {
        &[]
    } else {
        t.publish("p", &t.join("bundles/v1"), &[]).expect_code(0);
        t.write("root/unmanaged.txt", "the operator's\n");
        t.write("root/sub/planted.txt", "the operator's too\n");
        PLANTED
    };
    let run = strings(&["run", "--pipeline", "p", "bundles/v2"]);
    Scenario {
        name,
        t,
        command: run.clone(),
        env: vec![("DISTRIBUTOR_TEST_UNWRITTEN", unwritten.to_owned())],
        code: 0,
        restart: vec![(run, vec![0])],
        changes: vec!["root"],
        check: Box::new(root_checks("root", planted)),
        held: Default::default(),
    }
}

#[test]
fn run_into_a_new_root() {
    assert_no_violation(run_scenario("run-new-root", "additive", BARRIER, true));
}

#[test]
fn run_additive_file_by_file() {
    assert_no_violation(run_scenario(
        "run-additive",
        "additive",
        FILE_BY_FILE,
        false,
    ));
}

#[test]
fn run_replacement_with_deletes_one_barrier() {
    assert_no_violation(run_scenario(
        "run-replacement-barrier",
        "replacement",
        BARRIER,
        false,
    ));
}

#[test]
fn run_replacement_with_deletes_file_by_file() {
    assert_no_violation(run_scenario(
        "run-replacement-fsync",
        "replacement",
        FILE_BY_FILE,
        false,
    ));
}

/// A tree of 1,000 files replaced by one where every tenth changed, 25
/// are gone and 25 are new.
#[test]
fn run_a_tree_of_a_thousand_files() {
    let t = Test::on_tmpfs();
    t.config(&config("replacement", "", ""));
    let file = |i: usize| format!("d{:02}/f{i:04}.txt", i % 20);
    let v1: Vec<(String, String)> = (0..1000).map(|i| (file(i), format!("{i} one\n"))).collect();
    let v2: Vec<(String, String)> = (25..1025)
        .map(|i| {
            let text = if i % 10 == 0 {
                format!("{i} two\n")
            } else {
                format!("{i} one\n")
            };
            (file(i), text)
        })
        .collect();
    t.bundle_at("v1", "tree", "2026-06-01T00:00:00Z", &v1);
    t.bundle_at("v2", "tree", "2026-06-02T00:00:00Z", &v2);
    t.publish("p", &t.join("bundles/v1"), &[]).expect_code(0);
    t.write("root/d03/planted.txt", "the operator's\n");
    let run = strings(&["run", "--pipeline", "p", "bundles/v2"]);
    // About a second a state (three runs over 1,000 files): a smaller sample.
    assert_no_violation_in(
        Scenario {
            name: "run-tree-1000",
            t,
            command: run.clone(),
            env: vec![],
            code: 0,
            restart: vec![(run, vec![0])],
            changes: vec!["root"],
            check: Box::new(root_checks("root", &["d03/planted.txt"])),
            held: Default::default(),
        },
        16,
    );
}

/// Seals `name` in bundles/ and moves it into the inbox, arriving `order`th.
fn into_inbox(t: &Test, name: &str, id: &str, created: &str, files: &[(&str, &str)], order: u64) {
    let dir = t.bundle_at(name, id, created, files);
    arrive_in_order(&dir, order);
    let inbox = t.spool("p", "inbox");
    fs::create_dir_all(&inbox).unwrap();
    fs::rename(&dir, inbox.join(name)).unwrap();
}

/// What follows a crash of the agent: its next start, then the next
/// command that takes the root's lock. The agent settles a root's journal
/// only when it publishes there again: a power cut can keep a bundle's
/// filing in done/ and lose the removal of its root's journal (neither
/// is fsynced), a journal whose catalog is in place, which the next
/// holder of the lock removes.
fn agent_restart(codes: &[i32]) -> Vec<(Vec<String>, Vec<i32>)> {
    vec![
        (strings(&["agent", "--once"]), codes.to_vec()),
        (
            strings(&["reconcile-state", "--pipeline", "p", "--destination", "d"]),
            vec![0],
        ),
    ]
}

/// Spool checks: in a crash state and after the restart, every bundle in
/// exactly one folder, whole; after the restart, each where the
/// uncrashed run left it (unless `placed` says otherwise).
fn spool_checks(c: &Ctx, placed: &dyn Fn(&str, &str) -> bool) -> Vec<String> {
    let now = c.after.unwrap_or(c.state);
    let (mut found, place) = spool_whole(c.initial, now, "p");
    if c.after.is_some() {
        let (_, want) = spool_whole(c.initial, c.reference, "p");
        for (id, folder) in &place {
            let expected = want.get(id).map(String::as_str).unwrap_or("?");
            if !placed(id, folder) && folder != expected {
                found.push(format!("bundle {id} ended in {folder}/, not {expected}/"));
            }
        }
    }
    found
}

/// `agent --once` on an inbox of three bundles, the second tampered with:
/// claimed, published (the good ones as a batch), filed in done/ and
/// failed/.
#[test]
fn agent_once_claims_publishes_and_files() {
    assert_no_violation(agent_once());
}

fn agent_once() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config(
        "additive",
        "        prefix: \"{source_id}/\"\n",
        "",
    ));
    t.write("outside.txt", "beside the spool\n");
    t.bundle_at(
        "b0",
        "zero",
        "2026-05-01T00:00:00Z",
        &[("a.md", "# Zero\n")],
    );
    t.publish("p", &t.join("bundles/b0"), &[]).expect_code(0);
    t.write("root/unmanaged.txt", "the operator's\n");
    into_inbox(
        &t,
        "b1",
        "one",
        "2026-06-01T00:00:00Z",
        &[("a.md", "# A\n"), ("x.txt", "x\n")],
        1,
    );
    let bad = t.bundle_at("b2", "two", "2026-06-01T00:00:01Z", &[("y.txt", "y\n")]);
    write_file(&bad.join("y.txt"), b"tampered\n");
    arrive_in_order(&bad, 2);
    fs::rename(&bad, t.spool("p", "inbox").join("b2")).unwrap();
    into_inbox(
        &t,
        "b3",
        "three",
        "2026-06-01T00:00:02Z",
        &[("z.txt", "z\n")],
        3,
    );
    let roots = root_checks("root", &["unmanaged.txt"]);
    Scenario {
        name: "agent-once",
        t,
        command: strings(&["agent", "--once"]),
        env: vec![],
        code: 1,
        restart: agent_restart(&[0, 1]),
        changes: vec!["root", "spool"],
        check: Box::new(move |c| {
            let mut found = spool_checks(c, &|_, _| false);
            found.extend(roots(c));
            found
        }),
        held: Default::default(),
    }
}

/// `agent --once` on a fresh spool and a root that does not exist yet,
/// published file by file: the spool's folders and the root are created
/// by this start.
fn fresh_agent() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config("additive", "", ""));
    into_inbox(
        &t,
        "b1",
        "one",
        "2026-06-01T00:00:00Z",
        &[("a.txt", "a\n")],
        1,
    );
    let roots = root_checks("root", &[]);
    Scenario {
        name: "agent-fresh",
        t,
        command: strings(&["agent", "--once"]),
        env: vec![("DISTRIBUTOR_TEST_UNWRITTEN", FILE_BY_FILE.to_owned())],
        code: 0,
        restart: agent_restart(&[0]),
        changes: vec!["root", "spool"],
        check: Box::new(move |c| {
            let mut found = spool_checks(c, &|_, _| false);
            found.extend(roots(c));
            found
        }),
        held: Default::default(),
    }
}

#[test]
fn agent_once_on_a_fresh_spool_and_root() {
    assert_no_violation(fresh_agent());
}

/// The scenarios the LazyFS check runs ([`super::lazyfs`]): those of a
/// root made durable file by file. LazyFS's FUSE layer makes nothing
/// durable on `syncfs` (the barrier of large publications, of releases
/// and of a small one on an idle machine), and refuses `renameat2` flags
/// (the spool's claim, `RENAME_NOREPLACE`), so the agent cannot run there.
pub fn for_lazyfs() -> Vec<Scenario> {
    vec![
        run_scenario("run-additive", "additive", FILE_BY_FILE, false),
        run_scenario("run-replacement-fsync", "replacement", FILE_BY_FILE, false),
        prune(),
        reconcile(),
    ]
}

/// Regression: the agent created `work/`, `done/` and `failed/` and
/// renamed bundles into them without ever fsyncing the pipeline's folder,
/// and a publication into a root it created made the root's content
/// durable but not the root's own entry. A power cut could keep the
/// claim or the filing and lose the folder: a bundle in no spool folder,
/// or in done/ with its root gone. Each folder made must be durable
/// before anything is moved into it, and the root before its bundle is
/// filed.
#[test]
fn new_spool_folders_and_roots_are_durable_before_a_bundle_moves_in() {
    let s = fresh_agent();
    let m = super::record(&s).model;
    let find = |want: &dyn Fn(&str) -> bool| -> usize {
        m.ops
            .iter()
            .position(|op| matches!(op, Op::Entry { what, .. } if want(what)))
            .unwrap_or_else(|| panic!("no such operation in the record: {:#?}", m.ops))
    };
    let claim = find(&|w| w.starts_with("rename") && w.contains("/spool/p/work/b1"));
    let filing = find(&|w| w.starts_with("rename") && w.contains("/spool/p/done/b1"));
    for (folder, before) in [
        ("/spool/p/work", claim),
        ("/spool/p/done", filing),
        ("/root", filing),
    ] {
        let made = find(&|w| w.starts_with("mkdir") && w.ends_with(folder));
        assert!(
            m.durable_at[made] < before,
            "{folder} (op {made}) is durable at op {}, after op {before} moved a bundle",
            m.durable_at[made]
        );
    }
}

/// `agent --once` with the root's lock held: the bundle is deferred once
/// (its attempts and the deferral recorded), then fails at
/// `max_attempts`. The restart finds the lock free: the bundle is
/// published unless the crash left it in failed/.
#[test]
fn agent_once_defers_then_fails() {
    let t = Test::on_tmpfs();
    t.config(
        &config("additive", "", "  max_attempts: 2\n")
            .replace("lock_timeout: 5s", "lock_timeout: 100ms"),
    );
    into_inbox(
        &t,
        "b1",
        "one",
        "2026-06-01T00:00:00Z",
        &[("a.txt", "a\n")],
        1,
    );
    let lock = hold_root_lock(&t.join("root"));
    let once = strings(&["agent", "--once"]);
    assert_no_violation(Scenario {
        name: "agent-deferral",
        t,
        command: once,
        env: vec![],
        code: 1,
        restart: agent_restart(&[0, 1]),
        changes: vec!["root", "spool"],
        check: Box::new(|c| {
            let now = c.after.unwrap_or(c.state);
            let (mut found, place) = spool_whole(c.initial, now, "p");
            let Some(after) = c.after else {
                return found;
            };
            found.extend(settled(c.initial, after, "root", &[]));
            let published = read_outputs(after).contains_key("a.txt");
            match place.get("one").map(String::as_str) {
                Some("done") if !published => {
                    found.push("bundle one is in done/ but not published".into())
                }
                Some("failed") if published => {
                    found.push("bundle one is in failed/ but published".into())
                }
                Some("done" | "failed") | None => {}
                Some(other) => found.push(format!("bundle one was left in {other}/")),
            }
            found
        }),
        held: std::cell::RefCell::new(Some(lock)),
    });
}

fn read_outputs(l: &super::Listing) -> std::collections::BTreeMap<String, std::sync::Arc<Vec<u8>>> {
    super::check::outputs(&view(l, "root"))
}

/// Three sources published, their records aged: `prune --apply` deletes
/// the outputs of the two older ones.
#[test]
fn prune_apply() {
    assert_no_violation(prune());
}

fn prune() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config(
        "additive",
        "        prefix: \"{source_id}/\"\n        retention:\n          prune:\n            max_age: 1d\n            keep_latest: 1\n",
        "",
    ));
    for (i, id) in ["s1", "s2", "s3"].iter().enumerate() {
        let created = format!("2026-06-0{}T00:00:00Z", i + 1);
        t.bundle_at(id, id, &created, &[("a.md", "# A\n"), ("sub/c.txt", id)]);
        t.publish("p", &t.join(&format!("bundles/{id}")), &[])
            .expect_code(0);
    }
    t.write("root/s1/planted.txt", "the operator's\n");
    age(&t, "root");
    let prune = strings(&["prune", "--pipeline", "p", "--destination", "d", "--apply"]);
    Scenario {
        name: "prune-apply",
        t,
        command: prune.clone(),
        env: vec![],
        code: 0,
        restart: vec![(prune, vec![0])],
        changes: vec!["root"],
        check: Box::new(root_checks("root", &["s1/planted.txt"])),
        held: Default::default(),
    }
}

/// Sets every record's `updated_at` far in the past.
fn age(t: &Test, root: &str) {
    let mut state = read_state(&t.join(root));
    for r in state["outputs"].as_array_mut().unwrap() {
        r["updated_at"] = "2026-01-01T00:00:00Z".into();
    }
    t.write(
        &format!("{root}/.distributor.json"),
        serde_json::to_string_pretty(&state).unwrap(),
    );
}

/// Two of three recorded files deleted by hand: `reconcile-state` drops
/// their records.
#[test]
fn reconcile_state() {
    assert_no_violation(reconcile());
}

fn reconcile() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config("additive", "", ""));
    t.bundle_at(
        "s1",
        "s1",
        "2026-06-01T00:00:00Z",
        &[("a.txt", "a\n"), ("sub/b.txt", "b\n"), ("c.txt", "c\n")],
    );
    t.publish("p", &t.join("bundles/s1"), &[]).expect_code(0);
    fs::remove_file(t.join("root/a.txt")).unwrap();
    fs::remove_file(t.join("root/sub/b.txt")).unwrap();
    t.write("root/unmanaged.txt", "the operator's\n");
    let reconcile = strings(&["reconcile-state", "--pipeline", "p", "--destination", "d"]);
    Scenario {
        name: "reconcile-state",
        t,
        command: reconcile.clone(),
        env: vec![],
        code: 0,
        restart: vec![(reconcile, vec![0])],
        changes: vec!["root"],
        check: Box::new(root_checks("root", &["unmanaged.txt"])),
        held: Default::default(),
    }
}

/// The checks of a release root: in a crash state, the link shows one
/// whole release; after the restart, no temporary name in the releases
/// folder, every release settled, and the current one holding what the
/// uncrashed run left.
fn release_checks(c: &Ctx) -> Vec<String> {
    let Some(after) = c.after else {
        return release_is_whole(c.initial, c.reference, c.state, "root");
    };
    let mut found = Vec::new();
    for (path, _) in after.range("root.releases/".to_owned()..) {
        let Some(rest) = path.strip_prefix("root.releases/") else {
            break;
        };
        if rest.contains('/') {
            continue;
        }
        if rest.starts_with(".distributor-tmp-") {
            found.push(format!("root.releases/{rest} is left over"));
        } else if rest != ".distributor.lock" {
            found.extend(settled(
                c.initial,
                after,
                &format!("root.releases/{rest}"),
                &[],
            ));
        }
    }
    found.extend(settled(c.initial, after, "root", &[]));
    found.extend(as_reference(c.reference, after, "root"));
    found
}

fn release_scenario(name: &'static str, t: Test) -> Scenario {
    let run = strings(&["run", "--pipeline", "p", "bundles/next"]);
    Scenario {
        name,
        t,
        command: run.clone(),
        env: vec![],
        code: 0,
        restart: vec![(run, vec![0])],
        changes: vec!["root", "root.releases"],
        check: Box::new(release_checks),
        held: Default::default(),
    }
}

const RELEASES: &str = "        releases: 3\n";

/// A plain root converted by its first publication with `releases`: its
/// content becomes the first release, the publication builds the second,
/// and the folder is exchanged for the link (`RENAME_EXCHANGE`).
#[test]
fn releases_conversion() {
    assert_no_violation(conversion());
}

fn conversion() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config("additive", "", ""));
    first(&t);
    t.publish("p", &t.join("bundles/v1"), &[]).expect_code(0);
    t.config(&config("additive", RELEASES, ""));
    t.bundle_at(
        "next",
        "second",
        "2026-06-02T00:00:00Z",
        &[("report.md", "# Two\n"), ("keep.txt", "changed\n")],
    );
    release_scenario("releases-conversion", t)
}

/// A fourth release switched in, retention deleting the oldest.
#[test]
fn releases_switch_and_retention() {
    assert_no_violation(switch());
}

fn switch() -> Scenario {
    let t = Test::on_tmpfs();
    t.config(&config("additive", RELEASES, ""));
    for v in 1..=3 {
        let text = format!("{v}\n");
        let created = format!("2026-06-0{v}T00:00:00Z");
        t.bundle_at(
            &format!("v{v}"),
            "site",
            &created,
            &[("a.txt", text.as_str()), ("same.txt", "same\n")],
        );
        t.publish("p", &t.join(&format!("bundles/v{v}")), &[])
            .expect_code(0);
    }
    t.bundle_at(
        "next",
        "site",
        "2026-06-04T00:00:00Z",
        &[
            ("a.txt", "4\n"),
            ("same.txt", "same\n"),
            ("b/new.md", "# New\n"),
        ],
    );
    release_scenario("releases-switch", t)
}

/// Regression: retention deleted an old release file by file under its
/// own name, the catalog in any order among them, so a process killed
/// meanwhile (or a power cut keeping some of the deletions) left a
/// release with a name, listed and a rollback target, holding part of
/// its files and perhaps no catalog; nothing removed it. Killed after any
/// operation of the publication, nothing is left half.
#[test]
fn a_release_retention_killed_at_any_instant_leaves_no_half_release() {
    let report = super::explore_with(&switch(), usize::MAX, |m| m.kills());
    assert!(report.checked > 0);
    assert!(
        report.violations.is_empty(),
        "{}",
        report.violations.join("\n")
    );
}
