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

impl Worker {
    /// The destinations a publication of this pipeline goes to.
    pub(super) fn destinations(&self) -> Vec<&crate::config::Destination> {
        self.pipeline.destinations.iter().collect()
    }

    /// Step 1: records the bundles of `told` (index into `bundles`, the
    /// report as the commit leaves it) as committing, owing their hooks
    /// and those an earlier attempt's record owed. Sets `recorded` when it
    /// wrote anything.
    pub(super) fn record_committing(
        &self,
        bundles: Bundles,
        told: &[(usize, &RunReport)],
        recorded: &AtomicBool,
    ) -> io::Result<()> {
        let destinations = self.destinations();
        let mut unfiled = match spool::unfiled(&self.spool) {
            Ok(unfiled) => unfiled,
            // Nothing to record for a single bundle that owes no hook.
            Err(_)
                if told.len() == 1
                    && hooks::owed(
                        &self.pipeline,
                        &destinations,
                        &bundles[told[0].0].1,
                        told[0].1,
                    )
                    .is_empty() =>
            {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut worth = told.len() > 1;
        for (i, report) in told {
            let (path, name) = &bundles[*i];
            let mut owed = hooks::owed(&self.pipeline, &destinations, name, report);
            carry(&mut owed, &unfiled, path, name);
            worth |= !owed.is_empty();
            unfiled.insert(name.clone(), Unfiled::committing(path, owed)?);
        }
        if !worth {
            return Ok(());
        }
        spool::set_unfiled(&self.spool, &unfiled)?;
        recorded.store(true, Ordering::SeqCst);
        crate::failpoint::hit("agent.committing");
        Ok(())
    }

    /// Step 2, once the publication of `bundles` ended with `reports` (in
    /// order; fewer when a batch took only the first ones): records each
    /// bundle whose report is final (not to be tried again) as published
    /// or failed, owing its hooks. Returns, per report, the hooks it owes
    /// (none for one to be tried again). Writes nothing when step 1 wrote
    /// nothing and no record names these bundles.
    pub(super) fn record_committed(
        &self,
        bundles: Bundles,
        reports: &[RunReport],
        recorded: bool,
    ) -> Vec<Vec<Owed>> {
        crate::failpoint::hit("agent.committed");
        let destinations = self.destinations();
        let mut unfiled = match spool::unfiled(&self.spool) {
            Ok(unfiled) => unfiled,
            Err(e) => {
                self.cannot_record(&e);
                BTreeMap::new()
            }
        };
        let named = bundles
            .iter()
            .take(reports.len())
            .any(|(_, name)| unfiled.contains_key(name));
        let mut owed_all = Vec::new();
        for ((path, name), report) in bundles.iter().zip(reports) {
            if !report.ok && report.transient {
                // Tried again: what its record owes is carried to that try.
                owed_all.push(Vec::new());
                continue;
            }
            let mut owed = hooks::owed(&self.pipeline, &destinations, name, report);
            if report.ok {
                carry(&mut owed, &unfiled, path, name);
            }
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
                    crate::inert::inert(name),
                    if report.ok { "published" } else { "failed" }
                ),
            }
            owed_all.push(owed);
        }
        if (recorded || named)
            && let Err(e) = spool::set_unfiled(&self.spool, &unfiled)
        {
            self.cannot_record(&e);
        }
        crate::failpoint::hit("agent.recorded");
        owed_all
    }

    /// Runs the hooks `owed` of one bundle and records how they ended in
    /// its `report` (docs/contract.md §19.2).
    pub(super) fn run_hooks(&self, owed: &[Owed], report: &mut RunReport) {
        if owed.is_empty() {
            return;
        }
        report
            .hooks
            .extend(hooks::run_owed(&self.pipeline, &self.destinations(), owed));
    }

    /// Step 3's end: drops the records of the bundles of `bundles` that
    /// left work/ (filed), so that each only ever stands for its folder.
    pub(super) fn forget_filed(&self, bundles: Bundles) {
        let Ok(mut unfiled) = spool::unfiled(&self.spool) else {
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
        let unfiled = spool::unfiled(&self.spool).unwrap_or_default();
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

/// Adds to `owed` the hooks that the record of bundle `name` (folder
/// `path`) still owes from an attempt whose commit may have happened, for
/// destinations `owed` does not already run.
fn carry(owed: &mut Vec<Owed>, unfiled: &BTreeMap<String, Unfiled>, path: &Path, name: &str) {
    let Some(record) = unfiled.get(name).filter(|u| u.committing && u.is(path)) else {
        return;
    };
    for o in &record.hooks {
        if !owed.iter().any(|n| n.destination_id == o.destination_id) {
            owed.push(o.clone());
        }
    }
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
            // Owed now for d1: its new document wins; d2's is carried.
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
            let mut record = Unfiled::committing(recorded_for, recorded.clone()).unwrap();
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

    #[test]
    fn hooks_run_after_a_restart_join_the_result_they_belong_to() {
        let ran = HookReport {
            destination_id: "web".into(),
            exit: Some(0),
            elapsed_ms: 3,
            output: "purged\n".into(),
            error: None,
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
