//! One pipeline's worker loop: the pipeline's agent lock, resuming `work/`,
//! letting inbox entries settle and claiming them into `work/` in arrival
//! order. It publishes nothing itself: bundles go to `process` and `process_claimed`.

use super::{Serving, Tally, Wake};
use crate::config::{Config, Pipeline};
use crate::runtime::interrupt::Cancel;
use crate::runtime::process_state::ProcessState;
use crate::spool::{self, Spool};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// One pipeline's loop: work/ first, then the inbox in arrival order.
pub(super) struct Worker {
    pub(super) config: Config,
    pub(super) pipeline: Pipeline,
    pub(super) spool: Spool,
    pub(super) tally: Arc<Tally>,
    /// Finishing: claim nothing more, finish the bundle in hand;
    /// abandoned: give up its copying and its hooks too.
    pub(super) cancel: Cancel,
    pub(super) once: bool,
    /// Started with the first bundle.
    pub(super) ticker: std::sync::OnceLock<super::ticker::Ticker>,
    /// The agent's caches, shared by its workers.
    process: ProcessState,
    /// An intake pipeline's lease while this agent holds it: checked
    /// before each commit (docs/contract.md §22.3).
    pub(super) fence: std::sync::Mutex<Option<Arc<super::intake::Fence>>>,
}

/// What was last logged about an inbox entry: its state, and apart from
/// it the last failure to claim it (an entry that probes as ready but
/// cannot be moved would otherwise be logged at every scan, alternating
/// between the two).
struct Told {
    note: String,
    claim: Option<String>,
}

impl Told {
    fn note(note: String) -> Told {
        Told { note, claim: None }
    }
}

/// How long a batch may go on gathering a burst's bundles that became
/// ready after its first ones were claimed: as long as an entry that
/// waits goes unprobed ([`spool::INCOMPLETE_POLL`]; docs/performance.md,
/// "Bursts").
const GATHER_FOR: Duration = spool::INCOMPLETE_POLL;

/// What the worker keeps about its inbox between probes.
struct InboxState {
    /// When each inbox entry was first seen complete (the 10 x settle cap).
    complete_since: HashMap<String, Instant>,
    /// What was last logged about each entry, so each state is logged once.
    told: HashMap<String, Told>,
    /// Folders without a manifest, not opened again until they change,
    /// and looked into again anyway every rescan_interval (in case a file
    /// system's timestamps hid a change: a remote clock behind, timestamps
    /// of whole seconds).
    unchanged: spool::Unchanged,
    unchanged_since: Instant,
    /// The entries the agent refuses and why, recorded for `status` and
    /// `spool list --inbox` ([`spool::queue::VERDICTS_FILE`]); whether a
    /// verdict came from a failed claim (kept until a claim works).
    verdicts: std::collections::BTreeMap<String, (spool::queue::Verdict, bool)>,
    /// The verdicts changed since they were recorded.
    verdicts_changed: bool,
    /// Entries the agent tried to take over ([`crate::fs::spoolfs::adopt`]), and when:
    /// each is tried again only after `rescan_interval` (a producer that
    /// takes the access away again and again gets one try a minute).
    adopted: HashMap<String, Instant>,
}

impl InboxState {
    /// Notes the agent's verdict on `name` (`None`: it does not refuse it).
    fn verdict(&mut self, name: &str, verdict: Option<(String, bool)>) {
        match verdict {
            Some((reason, claim)) => {
                if self
                    .verdicts
                    .get(name)
                    .is_some_and(|(v, _)| v.reason == reason)
                {
                    return;
                }
                let at = crate::catalog::format_time(time::OffsetDateTime::now_utc());
                let state = spool::Waiting::Unreadable.as_str().to_owned();
                let v = spool::queue::Verdict { state, reason, at };
                self.verdicts.insert(name.to_owned(), (v, claim));
            }
            None => {
                if self.verdicts.remove(name).is_none() {
                    return;
                }
            }
        }
        self.verdicts_changed = true;
    }
}

/// One probe of the inbox, decided: indices into `probes`.
struct Look {
    probes: Vec<spool::Probe>,
    /// Ready to claim, in arrival order.
    ready: Vec<usize>,
    /// When an entry that waits should be looked at again.
    next_check: Option<Duration>,
    /// Incomplete entries `agent --once` leaves in the inbox.
    left_incomplete: Vec<usize>,
    /// An entry the agent could not read or move was made readable and
    /// movable for it: look again at once.
    adopted: bool,
}

impl Look {
    fn ready(&self) -> Vec<&spool::Probe> {
        self.ready.iter().map(|&i| &self.probes[i]).collect()
    }
}

fn inert(text: &str) -> std::borrow::Cow<'_, str> {
    crate::text::escape::inert(text)
}

impl Worker {
    pub(super) fn new(
        config: &Config,
        p: &Pipeline,
        tally: Arc<Tally>,
        cancel: Cancel,
        once: bool,
        process: &ProcessState,
    ) -> Worker {
        Worker {
            config: config.clone(),
            pipeline: p.clone(),
            spool: Spool::of(config, p),
            tally,
            cancel,
            once,
            ticker: std::sync::OnceLock::new(),
            process: process.clone(),
            fence: std::sync::Mutex::new(None),
        }
    }

    /// How this worker publishes.
    pub(super) fn options(&self) -> crate::publish::Options {
        crate::publish::Options {
            dry_run: false,
            force: false,
            lock_timeout: self.config.agent.lock_timeout,
            serving: Some(self.spool.work.display().to_string()),
            scratch: self.spool.work.clone(),
            process: self.process.clone(),
        }
    }

    /// The check before a commit of an intake pipeline's holder: its
    /// lease is still its own (nothing to check for a local inbox).
    /// Before the commit of `bundles` (the reports `told`), an intake's
    /// holder also records in the bucket the hooks the commit owes.
    pub(super) fn fence(
        &self,
        bundles: super::commit::Bundles,
        told: &[(usize, &crate::report::RunReport)],
    ) -> std::io::Result<()> {
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(f) = fence else {
            return Ok(());
        };
        f.check()?;
        let destinations = self.destinations();
        let owed: Vec<_> = told
            .iter()
            .flat_map(|(i, report)| {
                crate::hooks::owed(&self.pipeline, &destinations, &bundles[*i].1, report)
            })
            .collect();
        f.owes(owed)
    }

    pub(super) fn stopping(&self) -> bool {
        self.cancel.finishing()
    }

    /// Serves the pipeline: takes its agent lock, settles what a previous
    /// agent left in work/, then claims and publishes from the inbox until
    /// stopped (or, `--once`, until nothing more can be claimed).
    pub(super) fn run(&self, rx: &Receiver<Wake>) {
        let Some(_agent_lock) = self.serve_lock(rx) else {
            return;
        };
        if let Some(intake) = &self.pipeline.intake {
            // Serving is counted while the intake's lease is held.
            self.serve_intake(intake, rx);
            return;
        }
        // Counted as serving (for metrics and systemd's STATUS=) while the
        // lock is held.
        let _serving = Serving::start();
        if self.resume_work(rx) {
            self.serve_inbox(rx);
        }
    }

    /// Settles what a previous agent left: its batch file, its s3
    /// publications, temporary files of its bookkeeping, and the bundles in
    /// work/, each resumed. False when a stop came meanwhile.
    fn resume_work(&self, rx: &Receiver<Wake>) -> bool {
        if let Err(e) = spool::settle_batch(&self.spool) {
            log::error!(
                "pipeline={}: cannot settle {} ({e}); the attempt it recorded is not counted. Check permissions in work/, and delete the file if this repeats (only an attempt count is lost)",
                self.pipeline.id,
                self.spool.work.join(spool::BATCH_FILE).display()
            );
        }
        // Publications a previous agent serving this spool left unfinished
        // in s3 destinations: it is gone (this one holds the spool's lock).
        for d in &self.pipeline.destinations {
            crate::publish::recover_abandoned(
                d,
                &self.spool.work.display().to_string(),
                &self.process,
            );
        }
        // Temporary files of the agent's own bookkeeping left by a kill: the
        // batch file's at the top of work/, the presence file's in the
        // pipeline's folder, a kept result's in its results folder. Only the
        // holder of the agent lock writes there.
        for folder in self.spool.bookkeeping_folders() {
            if let Err(e) = spool::remove_stale_temps(&folder) {
                log::warn!(
                    "pipeline={}: cannot remove leftover temporary files from {}: {e}; check permissions, then delete its .distributor-tmp-* files by hand",
                    self.pipeline.id,
                    folder.display()
                );
            }
        }
        match spool::scan(&self.spool.work) {
            Ok(spool::Scan {
                mut found,
                incomplete,
                ..
            }) => {
                for path in incomplete {
                    self.fail_without_manifest(&path);
                }
                let committing = self.file_unfiled(&mut found);
                if !found.is_empty() {
                    log::info!(
                        "pipeline={} resuming {} bundle(s) left in work/",
                        self.pipeline.id,
                        found.len()
                    );
                }
                let mut batch = Vec::new();
                for f in committing {
                    if self.stopping() {
                        return false;
                    }
                    if self.resumable(&f) {
                        batch.push((f.path, f.name));
                    }
                }
                // First, and together: what reached its commit is older
                // than anything else left in work/.
                self.process_claimed(&batch, rx);
                for f in found {
                    if self.stopping() {
                        return false;
                    }
                    if !self.resumable(&f) {
                        continue;
                    }
                    self.process(&f.path, &f.name, rx);
                }
            }
            Err(e) => log::error!(
                "pipeline={}: cannot scan {}: {e}",
                self.pipeline.id,
                self.spool.work.display()
            ),
        }
        true
    }

    /// Readies a bundle left in work/ for publishing again: fails it when
    /// a folder stands at a name the agent writes inside it, counts the
    /// attempt that was interrupted and removes temporary files. False
    /// when it was filed instead.
    fn resumable(&self, f: &spool::Found) -> bool {
        if self.fail_if_bookkeeping_blocked(&f.path, &f.name) {
            return false;
        }
        if let Err(e) = spool::count_interrupted(&f.path) {
            log::error!(
                "pipeline={} bundle={}: cannot record its interrupted attempt in {}: {e}; it is retried without counting it. Check permissions in work/",
                self.pipeline.id,
                inert(&f.name),
                f.path.display()
            );
        }
        if let Err(e) = spool::remove_stale_temps(&f.path) {
            log::warn!(
                "pipeline={}: cannot remove leftover temporary files from {}: {e}; the bundle is processed anyway. Check permissions, then delete its .distributor-tmp-* files by hand",
                self.pipeline.id,
                f.path.display()
            );
        }
        true
    }

    /// Files the bundles of `found` that an earlier agent published (or
    /// failed) but did not or could not move out of work/
    /// ([`spool::UNFILED_FILE`]), running first the hooks they still owe,
    /// and takes them out of `found`: they are never published again,
    /// whether they move now or not. Returns the bundles, in arrival order,
    /// whose commit was under way when the earlier agent stopped, also
    /// taken out of `found`: they are published again as one batch
    /// (docs/reliability.md, "After the commit"). Forgets the records of
    /// folders no longer there.
    fn file_unfiled(&self, found: &mut Vec<spool::Found>) -> Vec<spool::Found> {
        let record_path = || self.spool.work.join(spool::UNFILED_FILE);
        let mut unfiled = match self.record() {
            Ok(unfiled) if unfiled.is_empty() => return Vec::new(),
            Ok(unfiled) => unfiled,
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot read {}: {e}; the bundles it records as published could be published again. Check it (bundle name -> record), or delete it if those bundles were moved by hand",
                    self.pipeline.id,
                    record_path().display()
                );
                return Vec::new();
            }
        };
        let before = unfiled.clone();
        unfiled.retain(|name, record| record.is(&self.spool.work.join(name)));
        let (mut committing, rest): (Vec<_>, Vec<_>) = std::mem::take(found)
            .into_iter()
            .partition(|f| unfiled.get(&f.name).is_some_and(|r| r.committing));
        *found = rest;
        // In the order they were committing in (a burst gathers bundles
        // that became ready later, whatever their manifests' times).
        committing.sort_by_key(|f| {
            unfiled
                .get(&f.name)
                .and_then(|r| r.order)
                .unwrap_or(u32::MAX)
        });
        if !committing.is_empty() {
            log::warn!(
                "pipeline={}: the last agent stopped while committing {} bundle(s) ({}); publishing them again as one batch, which changes nothing where the commit was made",
                self.pipeline.id,
                committing.len(),
                crate::text::wording::first_few(
                    &committing
                        .iter()
                        .map(|f| inert(&f.name))
                        .collect::<Vec<_>>(),
                    5,
                    ", "
                )
            );
        }
        let destinations = self.destinations();
        found.retain(|f| {
            let Some(mut record) = unfiled.get(&f.name).cloned() else {
                return true;
            };
            let outcome = if record.published { "published" } else { "failed" };
            if !record.hooks.is_empty() {
                log::info!(
                    "pipeline={} bundle={}: {outcome} by the last agent, which stopped before running {} hook(s) it owed; running them now",
                    self.pipeline.id,
                    inert(&f.name),
                    record.hooks.len()
                );
                let ran = crate::hooks::run_owed(
                    &self.pipeline,
                    &destinations,
                    &record.hooks,
                    &self.cancel,
                );
                record.result = record.result.map(|r| super::commit::with_hooks(&r, &ran));
                record.hooks.clear();
                unfiled.insert(f.name.clone(), record.clone());
            }
            // A kill while its result was written leaves the temporary
            // file inside it: stale, and never to be filed with it.
            if let Err(e) = spool::remove_stale_temps(&f.path) {
                log::warn!(
                    "pipeline={}: cannot remove leftover temporary files from {}: {e}; it is filed anyway. Check permissions, then delete its .distributor-tmp-* files by hand",
                    self.pipeline.id,
                    f.path.display()
                );
            }
            match spool::file_unfiled(&self.spool, &f.path, &f.name, &record) {
                Ok(to) => {
                    unfiled.remove(&f.name);
                    log::info!(
                        "pipeline={} bundle={}: {outcome} by an earlier run, which {} move it out of work/; moved to {} now, without publishing it again",
                        self.pipeline.id,
                        inert(&f.name),
                        if record.pending { "stopped before it could" } else { "could not" },
                        to.display()
                    );
                }
                Err(e) => {
                    // Counted like a bundle that could not leave work/ now.
                    self.tally.left.fetch_add(1, Ordering::Relaxed);
                    let to = self.spool.folder(self.spool.filed_in(record.published));
                    log::error!(
                        "pipeline={} bundle={}: {outcome} by an earlier run, and still cannot be moved out of work/: {e}; it is not published again and stays in {}. Make the folder writable by the agent (its owner can chmod u+w it) or move it by hand to {}",
                        self.pipeline.id,
                        inert(&f.name),
                        f.path.display(),
                        to.display()
                    );
                    // Stuck, not on its way: `status --check` names it.
                    if let Some(r) = unfiled.get_mut(&f.name) {
                        r.pending = false;
                    }
                }
            }
            false
        });
        if unfiled != before
            && let Err(e) = spool::set_unfiled(&self.spool, &unfiled)
        {
            log::warn!(
                "pipeline={}: cannot update {}: {e}; it may name bundles already moved, which is harmless (a record only ever stands for its own folder)",
                self.pipeline.id,
                record_path().display()
            );
        }
        committing
    }

    /// Forgets the records of bundles that could not be filed under the
    /// names of bundles just claimed into work/ ([`spool::UNFILED_FILE`]):
    /// such a record is of a folder that left work/ by other means, and
    /// must never stand for the new one.
    fn forget_unfiled(&self, claimed: &[(PathBuf, String)]) {
        let Ok(mut unfiled) = spool::unfiled(&self.spool) else {
            return;
        };
        let before = unfiled.len();
        for (_, name) in claimed {
            unfiled.remove(name);
        }
        if unfiled.len() != before {
            let _ = spool::set_unfiled(&self.spool, &unfiled);
        }
    }

    /// Probes the inbox, claims what is ready (in chunks of
    /// [`crate::publish::MAX_BATCH`]) and publishes it, then waits for a wake-up, a
    /// settle time or the rescan interval.
    fn serve_inbox(&self, rx: &Receiver<Wake>) {
        let timing = spool::Timing {
            once: self.once,
            ..self.spool.timing
        };
        let mut inbox = InboxState {
            complete_since: HashMap::new(),
            told: HashMap::new(),
            unchanged: spool::Unchanged::default(),
            unchanged_since: Instant::now(),
            verdicts: Default::default(),
            verdicts_changed: true,
            adopted: HashMap::new(),
        };
        let mut held = false;
        loop {
            if self.stopping() {
                return;
            }
            if self.held(&mut held) {
                if self.once {
                    return;
                }
                // Released within FLUSH_POLL; a stop at once.
                match rx.recv_timeout(super::FLUSH_POLL) {
                    Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    Ok(Wake::Scan) | Err(RecvTimeoutError::Timeout) => continue,
                }
            }
            let look = self.look(&mut inbox, &timing);
            let mut claimed_any = false;
            let ready = look.ready();
            let chunks = ready.len().div_ceil(crate::publish::MAX_BATCH);
            for (i, chunk) in ready.chunks(crate::publish::MAX_BATCH).enumerate() {
                if self.stopping() {
                    return;
                }
                // A hold placed while a chunk was published: the next
                // chunk stays in the inbox (the loop's top sees the hold).
                if i > 0 && self.hold_placed() {
                    break;
                }
                let mut claimed = self.claim(chunk, &mut inbox);
                if !claimed.is_empty() {
                    crate::runtime::failpoint::hit("agent.claimed");
                }
                // Only the last chunk gathers: what arrives now comes
                // after every bundle already ready.
                if i + 1 == chunks && !claimed.is_empty() {
                    self.gather(&mut claimed, &mut inbox, &timing);
                }
                claimed_any |= !claimed.is_empty();
                self.process_claimed(&claimed, rx);
            }
            // An entry just taken over is looked at again at once.
            if look.adopted {
                continue;
            }
            if self.once {
                if !claimed_any {
                    // Bundles whose claim failed stay in the inbox: not
                    // every bundle ended in done/ (exit 1).
                    let unclaimed = inbox.verdicts.values().filter(|(_, claim)| *claim).count();
                    self.tally.unclaimed.fetch_add(unclaimed, Ordering::Relaxed);
                    if !look.left_incomplete.is_empty() {
                        self.tally
                            .incomplete
                            .fetch_add(look.left_incomplete.len(), Ordering::Relaxed);
                        let wall = SystemTime::now();
                        for &i in &look.left_incomplete {
                            let p = &look.probes[i];
                            log::warn!(
                                "pipeline={} bundle={}: incomplete, left in the inbox: {}",
                                self.pipeline.id,
                                inert(&p.name),
                                inert(&p.reason(spool::Waiting::Incomplete, wall, &timing))
                            );
                        }
                    }
                    return;
                }
                continue;
            }
            if claimed_any {
                continue; // more may have arrived meanwhile
            }
            let mut wait = self.config.agent.rescan_interval;
            if let Some(n) = look.next_check {
                wait = wait.min(n);
            }
            match rx.recv_timeout(wait) {
                Ok(Wake::Stop) => return,
                Ok(Wake::Scan) => while rx.try_recv().is_ok() {},
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Probes the inbox once and decides about each entry (logging each
    /// entry's state once): what is ready to claim, in arrival order, when
    /// to look again, and what `agent --once` leaves incomplete.
    fn look(&self, inbox: &mut InboxState, timing: &spool::Timing) -> Look {
        if inbox.unchanged_since.elapsed() >= self.config.agent.rescan_interval {
            inbox.unchanged = spool::Unchanged::default();
            inbox.unchanged_since = Instant::now();
        }
        let probes = match spool::probe_inbox_again(
            &self.spool.inbox,
            &self.pipeline.limits,
            self.spool.signed,
            &mut inbox.unchanged,
        ) {
            Ok(p) => p,
            Err(e) => {
                let key = format!("cannot scan: {e}");
                if inbox.told.get("").is_none_or(|t| t.note != key) {
                    log::error!(
                        "pipeline={}: cannot scan {}: {e}; no bundle of this pipeline is claimed until the agent can list its inbox (check its permissions; see docs/security.md)",
                        self.pipeline.id,
                        self.spool.inbox.display()
                    );
                    inbox.told.insert(String::new(), Told::note(key));
                }
                Vec::new()
            }
        };
        log::debug!(
            "pipeline={} scanned the inbox ({} entries)",
            self.pipeline.id,
            probes.len()
        );
        let now = Instant::now();
        let wall = SystemTime::now();
        // By name, so that forgetting what left the inbox costs one
        // lookup per entry, not a pass over the inbox per entry (an
        // inbox of thousands of folders is probed every 250 ms).
        let kinds: HashMap<&str, &spool::ProbeKind> =
            probes.iter().map(|p| (p.name.as_str(), &p.kind)).collect();
        inbox
            .told
            .retain(|name, _| name.is_empty() || kinds.contains_key(name.as_str()));
        let before = inbox.verdicts.len();
        inbox
            .verdicts
            .retain(|name, _| kinds.contains_key(name.as_str()));
        inbox.verdicts_changed |= inbox.verdicts.len() != before;
        inbox
            .complete_since
            .retain(|name, _| kinds.get(name.as_str()) == Some(&&spool::ProbeKind::Complete));
        let (mut ready, mut next_check, mut left_incomplete) = (Vec::new(), None, Vec::new());
        for (i, p) in probes.iter().enumerate() {
            let complete_for = (p.kind == spool::ProbeKind::Complete).then(|| {
                now.duration_since(*inbox.complete_since.entry(p.name.clone()).or_insert(now))
            });
            let (state, verdict) = p.decide(wall, complete_for, timing);
            self.tell(p, state, wall, timing, &mut inbox.told);
            // What the probe refuses; a failed claim's verdict stands
            // until a claim works.
            if state == spool::Waiting::Unreadable {
                let reason = p.reason(state, wall, timing);
                inbox.verdict(&p.name, Some((reason, false)));
            } else if inbox.verdicts.get(&p.name).is_some_and(|(_, claim)| !claim) {
                inbox.verdict(&p.name, None);
            }
            match verdict {
                spool::Verdict::Claim => ready.push(i),
                spool::Verdict::Wait(left) => {
                    next_check = Some(next_check.map_or(left, |n: Duration| n.min(left)));
                }
                spool::Verdict::Leave => {
                    if state == spool::Waiting::Incomplete {
                        left_incomplete.push(i);
                    }
                }
            }
        }
        drop(kinds);
        let names: std::collections::HashSet<&str> =
            probes.iter().map(|p| p.name.as_str()).collect();
        inbox
            .adopted
            .retain(|name, _| names.contains(name.as_str()));
        drop(names);
        let adopted = self.adopt(&probes, inbox);
        self.record_verdicts(inbox);
        Look {
            probes,
            ready,
            next_check,
            left_incomplete,
            adopted,
        }
    }

    /// Gathers the rest of a burst into the bundles just claimed, so that
    /// it is published as one batch, each root's catalog written once
    /// (docs/performance.md, "Bursts"): probes the inbox again at once, and
    /// claims what is ready now, for as long as each probe finds more, up
    /// to [`crate::publish::MAX_BATCH`] bundles, for about [`GATHER_FOR`]
    /// (checked before each probe), and never once a stop or a hold came.
    /// It never waits: a bundle that is still settling, or that arrives
    /// after a probe found nothing new, goes in a later batch.
    fn gather(
        &self,
        claimed: &mut Vec<(PathBuf, String)>,
        inbox: &mut InboxState,
        timing: &spool::Timing,
    ) {
        let since = Instant::now();
        while claimed.len() < crate::publish::MAX_BATCH
            && since.elapsed() < GATHER_FOR
            && !self.stopping()
            && !self.hold_placed()
        {
            let look = self.look(inbox, timing);
            let ready = look.ready();
            let room = crate::publish::MAX_BATCH - claimed.len();
            let more = self.claim(&ready[..ready.len().min(room)], inbox);
            if more.is_empty() {
                return;
            }
            log::debug!(
                "pipeline={}: {} more bundles joined the batch",
                self.pipeline.id,
                more.len()
            );
            claimed.extend(more);
        }
    }

    /// Whether `spool hold` holds the pipeline (docs/contract.md §18.5);
    /// `was` is what the last call saw, so that each change is logged once.
    /// A hold that cannot be read holds: releasing is the operator's call.
    fn held(&self, was: &mut bool) -> bool {
        let since = spool::queue::held(self.spool.pipeline_folder());
        let now = since.is_some();
        if now != *was {
            if now {
                log::warn!(
                    "pipeline={}: held since {} (`distributor spool hold`); claiming nothing from {} until `distributor spool release {}`",
                    self.pipeline.id,
                    since.as_deref().unwrap_or_default(),
                    self.spool.inbox.display(),
                    self.pipeline.id
                );
            } else {
                log::info!(
                    "pipeline={}: released; claiming from the inbox again",
                    self.pipeline.id
                );
            }
            self.tally.metrics.set_held(&self.pipeline.id, now);
            *was = now;
        }
        now
    }

    /// Moves each entry of `ready` into work/ (under a name that fits, see
    /// [`spool::names`]); what is no real folder any more, or holds a folder
    /// at a bookkeeping name, is filed into failed/ at once. Returns the
    /// claimed bundles (path in work/, name). An entry that cannot be moved
    /// is logged once per reason and left.
    fn claim(&self, ready: &[&spool::Probe], inbox: &mut InboxState) -> Vec<(PathBuf, String)> {
        let mut refused = Vec::new();
        let claimed = self.claim_each(ready, inbox, &mut refused);
        for (name, verdict) in refused {
            inbox.verdict(&name, verdict);
        }
        self.record_verdicts(inbox);
        claimed
    }

    /// Takes over the entries of `probes` the agent may not read or move,
    /// when it may (`CAP_FOWNER`, [`crate::fs::spoolfs::adopt`]), each at most
    /// once a `rescan_interval`. Whether one was changed (to be looked at
    /// again at once).
    fn adopt(&self, probes: &[spool::Probe], inbox: &mut InboxState) -> bool {
        let mut any = false;
        let mut dir = None;
        for p in probes {
            let again_after = self.config.agent.rescan_interval;
            if !matches!(p.kind, spool::ProbeKind::Unreadable(_))
                || !spool::is_real_folder(&p.path)
                || inbox
                    .adopted
                    .get(&p.name)
                    .is_some_and(|at| at.elapsed() < again_after)
            {
                continue;
            }
            inbox.adopted.insert(p.name.clone(), Instant::now());
            if dir.is_none() {
                dir = crate::fs::spoolfs::open_folder_io(&self.spool.inbox).ok();
            }
            let Some(inbox_dir) = &dir else { return any };
            let most = self.pipeline.limits.max_files.saturating_add(16);
            match crate::fs::spoolfs::adopt(inbox_dir, &p.name, most) {
                Ok(0) => {}
                Ok(n) => {
                    log::info!(
                        "pipeline={} bundle={}: gave the agent's group read and write access to {n} of its folders and files (chmod g+rX, g+w on folders: under the inbox's ACL this is the mask, which the producer's copy had set from its source's mode or its umask), so that the agent can verify and claim it",
                        self.pipeline.id,
                        inert(&p.name)
                    );
                    any = true;
                }
                // Not allowed to (no CAP_FOWNER): the reason stands.
                Err(e) => log::debug!(
                    "pipeline={} bundle={}: cannot take it over ({e})",
                    self.pipeline.id,
                    inert(&p.name)
                ),
            }
        }
        any
    }

    /// Writes the agent's verdicts on the inbox when they changed.
    fn record_verdicts(&self, inbox: &mut InboxState) {
        if !inbox.verdicts_changed {
            return;
        }
        let verdicts = inbox
            .verdicts
            .iter()
            .map(|(name, (v, _))| (name.clone(), v.clone()))
            .collect();
        match spool::queue::set_verdicts(self.spool.pipeline_folder(), &verdicts) {
            Ok(()) => inbox.verdicts_changed = false,
            Err(e) => log::warn!(
                "pipeline={}: cannot record what the agent refuses in its inbox ({e}); `status` and `spool list --inbox` judge those entries with their caller's permissions",
                self.pipeline.id
            ),
        }
    }

    /// [`Worker::claim`] of each entry; `refused` gets each entry's new
    /// verdict (`None` once claimed).
    fn claim_each(
        &self,
        ready: &[&spool::Probe],
        inbox: &mut InboxState,
        refused: &mut Vec<(String, Option<(String, bool)>)>,
    ) -> Vec<(PathBuf, String)> {
        let InboxState {
            told,
            complete_since,
            ..
        } = inbox;
        let mut claimed = Vec::new();
        for p in ready {
            if let spool::ProbeKind::Incomplete(what) = &p.kind {
                log::warn!(
                    "pipeline={} bundle={}: still incomplete after {} without change ({}); claimed so that it is filed under failed/. Deliver it again, complete",
                    self.pipeline.id,
                    inert(&p.name),
                    crate::config::format_duration(self.spool.timing.incomplete_timeout),
                    inert(what)
                );
            }
            complete_since.remove(&p.name);
            match spool::move_unique(&p.path, &self.spool.work, &p.name, spool::names::NAME_MAX) {
                Ok(work_path) => {
                    told.remove(&p.name);
                    refused.push((p.name.clone(), None));
                    let name = work_path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| p.name.clone());
                    if !spool::is_real_folder(&work_path) {
                        // Swapped for a link after the probe: never
                        // followed, filed away as it is.
                        self.fail_not_a_folder(&work_path, &name);
                        continue;
                    }
                    if self.fail_if_bookkeeping_blocked(&work_path, &name) {
                        continue;
                    }
                    claimed.push((work_path, name));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    let key = format!("cannot claim: {e}");
                    let told = told
                        .entry(p.name.clone())
                        .or_insert_with(|| Told::note(String::new()));
                    if told.claim.as_ref() != Some(&key) {
                        let fix = if e.raw_os_error() == Some(libc::EPERM) {
                            "The inbox is sticky and belongs to another user, so the agent may move only its own user's entries: make the agent's user own the inbox (chown)"
                        } else if matches!(
                            e.raw_os_error(),
                            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                        ) {
                            "The spool's file system refuses rename with RENAME_NOREPLACE, which the agent needs so that a claim never replaces anything: put the spool on a local file system (ext4, xfs, btrfs, tmpfs)"
                        } else {
                            "The agent needs write access to the bundle folder to move it"
                        };
                        log::error!(
                            "pipeline={} bundle={}: cannot claim it (move {} into work/): {e}; the other bundles go on. {fix}: see docs/security.md",
                            self.pipeline.id,
                            inert(&p.name),
                            inert(&p.path.display().to_string())
                        );
                        told.claim = Some(key);
                    }
                    let why = format!(
                        "the agent cannot claim it (move it into work/): {e}; see docs/security.md"
                    );
                    refused.push((p.name.clone(), Some((why, true))));
                }
            }
        }
        // Records of bundles that could not be filed under these names
        // are stale now (docs/troubleshooting.md).
        self.forget_unfiled(&claimed);
        claimed
    }

    /// Logs what an inbox entry is waiting for, once per state (docs/contract.md §12.5):
    /// a folder without a manifest and an incomplete bundle at info, an
    /// unreadable entry at warning with the fix, and a folder that has had no
    /// manifest for `incomplete_timeout` once more at warning.
    fn tell(
        &self,
        p: &spool::Probe,
        state: spool::Waiting,
        wall: SystemTime,
        timing: &spool::Timing,
        told: &mut HashMap<String, Told>,
    ) {
        use spool::Waiting;
        let stale = state == Waiting::NoManifest && p.quiet(wall) >= timing.incomplete_timeout;
        let key = match (&p.kind, stale) {
            (spool::ProbeKind::Unreadable(why), _) => format!("unreadable {why}"),
            (_, true) => "stale".to_owned(),
            _ => state.as_str().to_owned(),
        };
        let told = told
            .entry(p.name.clone())
            .or_insert_with(|| Told::note(String::new()));
        if told.note == key {
            return;
        }
        told.note = key;
        let (id, name) = (&self.pipeline.id, inert(&p.name));
        let reason = p.reason(state, wall, timing);
        let reason = inert(&reason);
        match state {
            Waiting::Unreadable => log::warn!("pipeline={id} inbox entry {name}: {reason}"),
            Waiting::NoManifest if stale => log::warn!(
                "pipeline={id} inbox folder {name}: still no {} after {}; a producer may have forgotten the last step (write the manifest, or rename the finished folder in)",
                spool::MANIFEST,
                crate::config::format_duration(timing.incomplete_timeout)
            ),
            Waiting::NoManifest | Waiting::Incomplete => {
                log::info!("pipeline={id} bundle={name} waits: {reason}")
            }
            Waiting::Settling | Waiting::Ready => {
                log::debug!("pipeline={id} bundle={name}: {reason}")
            }
        }
    }

    /// Takes the pipeline's agent lock (`<spool>/<pipeline>/.distributor-agent.lock`)
    /// so two agents never serve one pipeline, and records this process in
    /// `.distributor-agent.json` for `status`. A live agent waits on
    /// standby; `--once` gives up after `lock_timeout` and counts the
    /// pipeline as skipped.
    fn serve_lock(&self, rx: &Receiver<Wake>) -> Option<std::fs::File> {
        let folder = self.spool.work.parent().unwrap_or(&self.spool.work);
        let path = super::presence::lock_path(folder);
        // Never through a link planted at the name; the lock file itself is
        // never replaced (the lock lives on its inode).
        let opened = crate::fs::spoolfs::open_folder_io(folder)
            .and_then(|dir| crate::fs::spoolfs::open_lock(&dir, super::presence::LOCK_FILE));
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot open {}: {e}; not serving this pipeline. The agent's user must be able to create files in {}",
                    self.pipeline.id,
                    path.display(),
                    folder.display()
                );
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let started = Instant::now();
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    if let Err(e) = super::presence::announce(folder) {
                        log::warn!(
                            "pipeline={}: cannot write {}: {e}; the pipeline is served, but `distributor status` cannot show this agent's pid",
                            self.pipeline.id,
                            folder.join(super::presence::INFO_FILE).display()
                        );
                    }
                    return Some(file);
                }
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    log::error!(
                        "pipeline={}: cannot lock {}: {e}",
                        self.pipeline.id,
                        path.display()
                    );
                    self.tally.failed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
            if self.once && started.elapsed() >= self.config.agent.lock_timeout {
                log::warn!(
                    "pipeline={}: another agent is serving it (it holds {}); --once skipped the pipeline and left its inbox to that agent",
                    self.pipeline.id,
                    path.display()
                );
                self.tally.skipped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            if !told {
                if self.once {
                    log::info!(
                        "pipeline={}: another agent is serving it (it holds {}); waiting up to {} for it",
                        self.pipeline.id,
                        path.display(),
                        crate::config::format_duration(self.config.agent.lock_timeout)
                    );
                } else {
                    log::info!(
                        "pipeline={}: another agent is serving it (it holds {}); standing by",
                        self.pipeline.id,
                        path.display()
                    );
                }
                told = true;
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) if !self.once => return None,
                _ if self.stopping() => return None,
                _ => {}
            }
        }
    }
}
