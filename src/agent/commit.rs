//! What a publication owes across a crash once it commits
//! (docs/reliability.md, "After the commit"), kept in the spool's record
//! of bundles not filed yet ([`spool::UNFILED_FILE`]):
//!
//! 1. just before the first root commits, each bundle of the publication
//!    is recorded as *committing*, with the hooks it will owe: a crash
//!    from here on makes the next start publish these bundles again as
//!    one batch (a committed batch then changes nothing a reader sees),
//!    never one by one, which would put an older bundle's content back
//!    over a newer one's;
//! 2. once every root committed, each is recorded as published (or
//!    failed), still owing its hooks: a crash from here on makes the next
//!    start run the hooks and file the bundles without publishing them
//!    again;
//! 3. the hooks run, in arrival order, and each bundle is filed right
//!    after its own, which ends what it owes (a crash between the two runs
//!    its hooks again: at least once, never zero times).
//!
//! A single bundle that owes no hook records nothing: publishing it again
//! after a crash is a `skip_same`.

use super::worker::Worker;
use crate::hooks::{self, Owed};
use crate::report::RunReport;
use crate::spool::{self, Unfiled};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The bundles of one publication, as the driver indexes them.
pub(super) type Bundles<'b> = &'b [(PathBuf, String)];

/// What step 2 left: per report, the hooks it owes, and whether the
/// record names these bundles (then [`Worker::forget_filed`] has records
/// to drop once they are filed).
pub(super) struct AfterCommit {
    pub(super) owed: Vec<Vec<Owed>>,
    pub(super) recorded: bool,
}

impl Worker {
    /// The destinations a publication of this pipeline goes to.
    pub(super) fn destinations(&self) -> Vec<&crate::config::Destination> {
        self.pipeline.destinations.iter().collect()
    }

    /// The spool's record, by bundle name. One that is damaged (not what
    /// the agent writes) is set aside, logged, and taken as empty, so that
    /// it cannot stop the pipeline; an error reading it is returned.
    pub(super) fn record(&self) -> io::Result<BTreeMap<String, Unfiled>> {
        match spool::unfiled(&self.spool) {
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let aside = spool::set_aside_unfiled(&self.spool);
                log::error!(
                    "pipeline={}: {e}; {}. The bundles it named that are still in work/ are published again one by one at the next start",
                    self.pipeline.id,
                    match &aside {
                        Ok(to) => format!("set aside as {} for you to read", to.display()),
                        Err(m) => format!("it cannot be set aside either ({m}): remove it"),
                    }
                );
                aside.map(|_| BTreeMap::new())
            }
            read => read,
        }
    }

    /// Step 1: records the bundles of `told` (index into `bundles`, the
    /// report as the commit leaves it) as committing, in their order,
    /// owing their hooks and those an earlier attempt's record owed. Sets
    /// `recorded` when it wrote anything.
    pub(super) fn record_committing(
        &self,
        bundles: Bundles,
        told: &[(usize, &RunReport)],
        recorded: &AtomicBool,
    ) -> io::Result<()> {
        let destinations = self.destinations();
        let owes = |k: usize| {
            let (i, report) = told[k];
            hooks::owed(&self.pipeline, &destinations, &bundles[i].1, report)
        };
        let mut unfiled = match self.record() {
            Ok(unfiled) => unfiled,
            // Nothing to record for a single bundle that owes no hook.
            Err(_) if told.len() == 1 && owes(0).is_empty() => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut worth = told.len() > 1;
        for (k, (i, _)) in told.iter().enumerate() {
            let (path, name) = &bundles[*i];
            let mut owed = owes(k);
            carry(&mut owed, &unfiled, path, name);
            worth |= !owed.is_empty();
            unfiled.insert(name.clone(), Unfiled::committing(path, k, owed)?);
        }
        if !worth {
            return Ok(());
        }
        spool::set_unfiled(&self.spool, &unfiled)?;
        recorded.store(true, Ordering::SeqCst);
        crate::runtime::failpoint::hit("agent.committing");
        Ok(())
    }

    /// Step 2, once the publication of `bundles` ended with `reports` (in
    /// order; fewer when a batch took only the first ones): records each
    /// bundle whose report is final as published or failed, owing its
    /// hooks: those the report owes, and those a record of an attempt
    /// whose commit may have happened owed (a failed bundle too: that
    /// commit may have changed the destination). With `retried`, a report
    /// of a transient failure is not final (the bundle is tried again
    /// alone, and its record carried to that try). Writes nothing when
    /// step 1 wrote nothing, no record names these bundles and none owes a
    /// hook.
    pub(super) fn record_committed(
        &self,
        bundles: Bundles,
        reports: &[RunReport],
        recorded: bool,
        retried: bool,
    ) -> AfterCommit {
        crate::runtime::failpoint::hit("agent.committed");
        let destinations = self.destinations();
        let (mut unfiled, readable) = match self.record() {
            Ok(unfiled) => (unfiled, true),
            Err(e) => {
                self.cannot_record(&e);
                (BTreeMap::new(), false)
            }
        };
        let named = bundles
            .iter()
            .take(reports.len())
            .any(|(_, name)| unfiled.contains_key(name));
        let mut owed_all = Vec::new();
        for ((path, name), report) in bundles.iter().zip(reports) {
            if retried && !report.ok && report.transient() {
                owed_all.push(None);
                continue;
            }
            let mut owed = hooks::owed(&self.pipeline, &destinations, name, report);
            carry(&mut owed, &unfiled, path, name);
            owed_all.push(Some(owed));
        }
        // Nothing to record for a single bundle that owes no hook and no
        // record names: its result is not even formatted (a large tree's
        // is megabytes).
        let write = recorded || named || owed_all.iter().flatten().any(|o| !o.is_empty());
        for (((path, name), report), owed) in bundles.iter().zip(reports).zip(&owed_all) {
            let Some(owed) = owed.as_ref().filter(|_| write) else {
                continue;
            };
            match Unfiled::of(path, report) {
                Ok(record) => {
                    let record = Unfiled {
                        hooks: owed.clone(),
                        pending: true,
                        ..record
                    };
                    unfiled.insert(name.clone(), record);
                }
                Err(e) => log::warn!(
                    "pipeline={} bundle={}: cannot look at its folder to record it as {} ({e})",
                    self.pipeline.id,
                    crate::text::escape::inert(name),
                    if report.ok { "published" } else { "failed" }
                ),
            }
        }
        let owed_all: Vec<Vec<Owed>> = owed_all
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        // A record that cannot be read is not written over.
        if readable
            && write
            && let Err(e) = spool::set_unfiled(&self.spool, &unfiled)
        {
            self.cannot_record(&e);
        }
        self.remember_deletions(reports);
        crate::runtime::failpoint::hit("agent.recorded");
        AfterCommit {
            owed: owed_all,
            recorded: write,
        }
    }

    /// Remembers what the committed publications of `reports` deleted, by
    /// destination and path, and forgets what they wrote again: with
    /// `signatures.refuse_older`, a bundle older than the publication that
    /// deleted an output may not write it again (docs/security.md, "What
    /// replay protection covers"). Only for a pipeline that takes signed
    /// bundles (that is where refuse_older is).
    pub(super) fn remember_deletions(&self, reports: &[RunReport]) {
        if self.pipeline.signatures.is_none() {
            return;
        }
        let folder = self.spool.pipeline_folder();
        let mut tombstones = match spool::queue::tombstones(folder) {
            Ok(t) => t,
            Err(e) => {
                log::warn!(
                    "pipeline={}: cannot read {} ({e}); what this publication deleted is not remembered, and the file is left as it is. Move it aside if it is damaged",
                    self.pipeline.id,
                    folder.join(spool::queue::TOMBSTONES_FILE).display()
                );
                return;
            }
        };
        let mut changed = false;
        for report in reports.iter().filter(|r| r.ok && !r.dry_run) {
            let Some(source) = &report.source else {
                continue;
            };
            let Ok(created) = crate::catalog::parse_time(&source.created) else {
                continue;
            };
            for d in &report.destinations {
                if d.action.as_deref().is_none_or(|a| a == "skip_same") {
                    continue;
                }
                let paths = tombstones.entry(d.destination_id.clone()).or_default();
                for w in &d.writes {
                    changed |= paths.remove(w).is_some();
                }
                for gone in &d.deletes {
                    let newer = paths.get(gone).is_none_or(|t| t.created < created);
                    if newer {
                        let t = spool::queue::Tombstone {
                            source: source.id.clone(),
                            created,
                        };
                        paths.insert(gone.clone(), t);
                        changed = true;
                    }
                }
            }
        }
        if changed && let Err(e) = spool::queue::set_tombstones(folder, &mut tombstones) {
            log::warn!(
                "pipeline={}: cannot record what a publication deleted in {} ({e}); with refuse_older, a replay of an older bundle could bring those outputs back. Check free space and permissions",
                self.pipeline.id,
                folder.join(spool::queue::TOMBSTONES_FILE).display()
            );
        }
    }

    /// Runs the hooks `owed` of one bundle and records how they ended in
    /// its `report` (docs/contract.md §19.2). False when the agent's stop
    /// came first, or killed one of them: the bundle then stays in work/,
    /// its record owing them all, and the next start runs them.
    pub(super) fn run_hooks(&self, owed: &[Owed], report: &mut RunReport) -> bool {
        if owed.is_empty() {
            return true;
        }
        if self.cancel.abandoned() {
            return false;
        }
        let ran = hooks::run_owed(&self.pipeline, &self.destinations(), owed, &self.cancel);
        let stopped = ran.iter().any(|h| h.stopped);
        report.hooks.extend(ran);
        !stopped
    }

    /// A bundle whose hooks the stop kept from running (or ended): it
    /// stays in work/, owing them.
    pub(super) fn left_owing_hooks(&self, name: &str) {
        log::info!(
            "pipeline={} bundle={}: published, but the agent is stopping before its hooks ran; left in work/, the next start runs them and files it",
            self.pipeline.id,
            crate::text::escape::inert(name)
        );
    }

    /// Step 3's end: drops the records of the bundles of `bundles` that
    /// left work/ (filed), so that each only ever stands for its folder.
    pub(super) fn forget_filed(&self, bundles: Bundles) {
        let Ok(mut unfiled) = self.record() else {
            return;
        };
        let before = unfiled.len();
        for (path, name) in bundles {
            if unfiled.get(name).is_some_and(|u| !u.is(path)) {
                unfiled.remove(name);
            }
        }
        if unfiled.len() != before
            && let Err(e) = spool::set_unfiled(&self.spool, &unfiled)
        {
            log::warn!(
                "pipeline={}: cannot update {}: {e}; it may name bundles already filed, which is harmless (a record only ever stands for its own folder)",
                self.pipeline.id,
                self.spool.work.join(spool::UNFILED_FILE).display()
            );
        }
    }

    /// Whether the spool records a commit under way for any of `bundles`
    /// (it may have happened in some roots).
    pub(super) fn commit_recorded(&self, bundles: Bundles) -> bool {
        let unfiled = self.record().unwrap_or_default();
        bundles.iter().any(|(path, name)| {
            unfiled
                .get(name)
                .is_some_and(|u| u.committing && u.is(path))
        })
    }

    fn cannot_record(&self, e: &io::Error) {
        log::error!(
            "pipeline={}: cannot record in {} that a publication committed ({e}); its hooks run now, but a crash before its bundles are filed would publish them again one by one. Check free space and permissions in work/",
            self.pipeline.id,
            self.spool.work.join(spool::UNFILED_FILE).display()
        );
    }
}

/// Adds to `owed` what the record of bundle `name` (folder `path`) still
/// owes from an attempt whose commit may have happened: its hook of a
/// destination `owed` does not run, and for one it runs, the paths only
/// the recorded document names (that commit wrote or deleted them; the
/// new publication finds them unchanged and would not say so).
fn carry(owed: &mut Vec<Owed>, unfiled: &BTreeMap<String, Unfiled>, path: &Path, name: &str) {
    let Some(record) = unfiled.get(name).filter(|u| u.committing && u.is(path)) else {
        return;
    };
    for o in &record.hooks {
        match owed
            .iter_mut()
            .find(|n| n.destination_id == o.destination_id)
        {
            Some(n) => n.input = joined(&n.input, &o.input),
            None => owed.push(o.clone()),
        }
    }
}

/// Hook document `new` with the paths (and URLs) `old` names besides its
/// own, after them; `new` as it is when either is not a document.
fn joined(new: &str, old: &str) -> String {
    use serde_json::Value;
    let (Ok(mut doc), Ok(old)) = (
        serde_json::from_str::<Value>(new),
        serde_json::from_str::<Value>(old),
    ) else {
        return new.to_owned();
    };
    for key in ["writes", "deletes", "urls"] {
        let (Some(list), Some(more)) = (
            doc.get_mut(key).and_then(Value::as_array_mut),
            old.get(key).and_then(Value::as_array),
        ) else {
            continue;
        };
        let seen: std::collections::HashSet<String> = list
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        list.extend(
            more.iter()
                .filter(|v| v.as_str().is_some_and(|p| !seen.contains(p)))
                .cloned(),
        );
    }
    serde_json::to_string(&doc).unwrap_or_else(|_| new.to_owned())
}

/// A result document (`run --json`) with `ran`, the hooks run for it
/// after a restart, added to its `hooks`; as it was when it is not one.
pub(super) fn with_hooks(result: &str, ran: &[crate::report::HookReport]) -> String {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(result) else {
        return result.to_owned();
    };
    let Some(object) = doc.as_object_mut() else {
        return result.to_owned();
    };
    let hooks = object
        .entry("hooks")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let Some(list) = hooks.as_array_mut() {
        list.extend(ran.iter().filter_map(|h| serde_json::to_value(h).ok()));
    }
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| result.to_owned());
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::HookReport;

    fn owed(destination: &str, input: &str) -> Owed {
        Owed {
            destination_id: destination.to_owned(),
            input: input.to_owned(),
            bundle: "b".to_owned(),
        }
    }

    /// (record: committing?, the same folder?, hooks owed now) -> hooks
    /// owed once the record's are carried.
    #[test]
    fn a_committing_record_of_the_same_folder_carries_the_hooks_not_owed_now() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("b");
        std::fs::create_dir(&folder).unwrap();
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let recorded = vec![owed("d1", "old d1"), owed("d2", "old d2")];
        let table: [(bool, &Path, Vec<Owed>, Vec<Owed>); 5] = [
            // Owed now for d1: its new document stands (the recorded one is
            // not a document to join); d2's is carried.
            (
                true,
                &folder,
                vec![owed("d1", "new d1")],
                vec![owed("d1", "new d1"), owed("d2", "old d2")],
            ),
            // Nothing owed now (skip_same): both carried.
            (true, &folder, vec![], recorded.clone()),
            // A record of a published bundle owes through its own entry.
            (false, &folder, vec![], vec![]),
            // A record of another folder under the same name stands for
            // nothing here.
            (true, &other, vec![], vec![]),
            (
                true,
                &other,
                vec![owed("d1", "new d1")],
                vec![owed("d1", "new d1")],
            ),
        ];
        for (committing, recorded_for, now, expected) in table {
            let mut record = Unfiled::committing(recorded_for, 0, recorded.clone()).unwrap();
            record.committing = committing;
            let unfiled = BTreeMap::from([("b".to_owned(), record)]);
            let mut owed = now.clone();
            carry(&mut owed, &unfiled, &folder, "b");
            assert_eq!(
                owed, expected,
                "committing {committing}, {recorded_for:?}, now {now:?}"
            );
        }
    }

    /// A hook owed for a destination both times reads the new document,
    /// with what only the recorded one named after its own paths.
    #[test]
    fn a_carried_document_adds_the_paths_only_it_names() {
        let new = r#"{"action":"upsert_additive","writes":["shared.html"],"deletes":[],"urls":["https://x/shared.html"]}"#;
        let old = r#"{"action":"upsert_additive","writes":["own.html","shared.html"],"deletes":["gone.html"],"urls":["https://x/own.html","https://x/shared.html"]}"#;
        let doc: serde_json::Value = serde_json::from_str(&joined(new, old)).unwrap();
        assert_eq!(
            doc["writes"],
            serde_json::json!(["shared.html", "own.html"])
        );
        assert_eq!(doc["deletes"], serde_json::json!(["gone.html"]));
        assert_eq!(
            doc["urls"],
            serde_json::json!(["https://x/shared.html", "https://x/own.html"])
        );
        assert_eq!(doc["action"], "upsert_additive");
        assert_eq!(joined(new, "not a document"), new);
    }

    #[test]
    fn hooks_run_after_a_restart_join_the_result_they_belong_to() {
        let ran = HookReport {
            destination_id: "web".into(),
            exit: Some(0),
            elapsed_ms: 3,
            output: "purged\n".into(),
            error: None,
            stopped: false,
        };
        let mut report = RunReport::new("p", false);
        let before: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert!(before.get("hooks").is_none());
        let after: serde_json::Value =
            serde_json::from_str(&with_hooks(&report.to_json(), std::slice::from_ref(&ran)))
                .unwrap();
        assert_eq!(after["hooks"][0]["destination_id"], "web");
        assert_eq!(after["pipeline_id"], "p");
        // Added after those that ran before the crash.
        report.hooks.push(HookReport {
            destination_id: "first".into(),
            ..ran.clone()
        });
        let after: serde_json::Value =
            serde_json::from_str(&with_hooks(&report.to_json(), &[ran])).unwrap();
        let ids: Vec<&str> = after["hooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["destination_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["first", "web"]);
        // What is not a result is left as it is.
        assert_eq!(with_hooks("not json", &[]), "not json");
    }
}
