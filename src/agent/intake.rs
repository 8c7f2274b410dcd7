//! A pipeline whose inbox is in the object store (docs/contract.md §22):
//! the lease, the standby, and the holder's loop. The holder brings one
//! bundle at a time from the bucket into its local `work/` (hashed as it
//! is read), hands it to the same processing as a local inbox's bundle
//! ([`Worker::process`]: deferral, hooks, signatures, filing), removes it
//! from this host, and hands it to the [`Filer`], which files its result
//! in the bucket and removes it from the inbox while the next bundle is
//! fetched. Before each commit the holder waits for the filings under way
//! and checks that the lease is still its own ([`Worker::fence`]).

use super::worker::Worker;
use super::{Serving, Wake};
use crate::config::Intake;
use crate::intake::lease::{self, Attempt, Held, RenewError};
use crate::intake::{self, Bucket, Probe, State};
use crate::spool::{self, Folder};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// How often the holder expires `done/` results (and once when it takes
/// the lease).
const EXPIRE_EVERY: Duration = Duration::from_secs(600);

/// The most bytes of manifests read by a look and kept for their probes
/// ([`intake::MANIFEST_KEPT`] each): a backlog of a thousand small bundles
/// fits, and a hostile inbox of many large manifests costs no more.
const MANIFESTS_KEPT: usize = 4 << 20;

/// What is logged of a name whose objects have no manifest yet.
const NO_MANIFEST_YET: &str = "waits: no manifest.json yet (upload it last)";

/// The most objects a look lists to see the inbox whole (ten LISTs).
const LOOK_MOST: usize = 10_000;

/// The holder's lease and a client for the check before each commit.
pub(super) struct Fence {
    pub(super) held: Arc<Held>,
    pub(super) bucket: Arc<Bucket>,
    /// The bundle in hand (its name in the bucket and its manifest's
    /// version), whose hooks are recorded before its commit.
    in_hand: std::sync::Mutex<Option<(String, crate::s3::ETag)>>,
    /// Whether any destination has hooks (else nothing is recorded).
    hooks: bool,
    /// Bundles finished but not filed yet (see [`Filer`]).
    filings: Filings,
}

/// The filings under way (by bundle name), which a commit waits to end:
/// a crash then leaves at most the bundle in hand published and not filed
/// (its hooks run again where it is published again), as when each bundle
/// was filed before the next was taken. A name being filed is not probed
/// until its filing ended (a delivery again under it keeps its place in
/// arrival order; the one being removed is never taken twice). Once a
/// filing was given up (a stop, a lost lease), no commit of this holder
/// follows it: the bundle stays in the inbox, and the next holder
/// processes it first.
#[derive(Default)]
struct Filings {
    names: std::sync::Mutex<Vec<String>>,
    changed: std::sync::Condvar,
    given_up: AtomicBool,
}

impl Filings {
    fn names(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&self, name: &str) {
        self.names().push(name.to_owned());
        self.changed.notify_all();
    }

    fn end(&self, name: &str) {
        let mut names = self.names();
        if let Some(at) = names.iter().position(|n| n == name) {
            names.remove(at);
        }
        self.changed.notify_all();
    }

    /// The names being filed now.
    fn under_way(&self) -> std::collections::HashSet<String> {
        self.names().iter().cloned().collect()
    }

    /// Waits up to `most` for the filing of `name` (if one is under way)
    /// to end; whether none is under way.
    fn wait_for(&self, name: &str, most: Duration) -> bool {
        let names = self.names();
        let (names, _) = self
            .changed
            .wait_timeout_while(names, most, |names| names.iter().any(|n| n == name))
            .unwrap_or_else(|e| e.into_inner());
        !names.iter().any(|n| n == name)
    }

    /// Waits until no filing is under way; false when one was given up.
    fn settled(&self) -> bool {
        let mut names = self.names();
        while !names.is_empty() {
            names = self.changed.wait(names).unwrap_or_else(|e| e.into_inner());
        }
        !self.given_up.load(Ordering::SeqCst)
    }
}

impl Fence {
    /// Records in the bucket the hooks the commit of the bundle in hand
    /// owes ([`intake::COMMITTING`]), so that the agent that publishes it
    /// again after a crash runs them.
    pub(super) fn owes(&self, hooks: Vec<crate::hooks::Owed>) -> std::io::Result<()> {
        if !self.hooks || hooks.is_empty() {
            return Ok(());
        }
        let in_hand = self
            .in_hand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some((name, etag)) = in_hand else {
            return Ok(());
        };
        let c = intake::Committing {
            name,
            manifest_etag: etag.0,
            hooks,
        };
        self.bucket.mark_committing(&c).map_err(|e| {
            std::io::Error::other(crate::publish::Fenced(format!(
                "not committed: cannot record the hooks it owes in the intake ({e})"
            )))
        })
    }

    /// The check before a commit (docs/contract.md §22.3), once the
    /// bundles finished before are filed. The lease is read in the bucket
    /// while the filing under way goes on (on the filer's thread), and
    /// counted valid on this host's clock once it is done.
    pub(super) fn check(&self) -> std::io::Result<()> {
        crate::runtime::failpoint::hit("intake.before_fence");
        let lost = |lost: lease::Lost| {
            std::io::Error::other(crate::publish::Fenced(format!(
                "not committed: {lost}; this agent no longer serves the intake, and the agent that does processes the bundle again"
            )))
        };
        self.held.check(&self.bucket.root).map_err(lost)?;
        let waiting = Instant::now();
        if !self.filings.settled() {
            return Err(std::io::Error::other(crate::publish::Fenced(
                "not committed: the result of the bundle before it could not be filed in the intake; the agent that serves the intake next processes both again, in order".to_owned(),
            )));
        }
        // A long wait (a filing tried again): the lease is read again.
        if waiting.elapsed() >= self.held.lease() / 3 {
            self.held.check(&self.bucket.root).map_err(lost)?;
        }
        self.held.valid().map_err(lost)
    }
}

/// What the holder keeps between looks at the inbox.
#[derive(Default)]
struct Inbox {
    /// Each name's manifest as the look found it (arrival order, and
    /// the bytes of a small one for its probe).
    arrivals: HashMap<String, intake::Arrival>,
    /// Incomplete bundles: what their objects looked like, since when,
    /// and when they were last probed.
    waiting: HashMap<String, (intake::Shape, Instant, Instant)>,
    /// What was last logged about each name.
    told: HashMap<String, String>,
    /// Bundles taken from the inbox, with their manifest's version and
    /// `Last-Modified` (the delivery, [`intake::same_delivery`]): a
    /// listing may show them a while longer, and the same delivery is
    /// never taken twice (a new one under that name is).
    taken: HashMap<String, Option<(crate::s3::ETag, OffsetDateTime)>>,
    /// The hooks earlier holders' publications owed, by bundle name.
    owed: HashMap<String, intake::Committing>,
    /// When the manifests of the names in `taken` were last looked for
    /// by a look at the names only (a new delivery under such a name).
    /// Some servers (SeaweedFS) list a finished bundle's emptied prefix
    /// for a while: looking for all of them before each bundle of a
    /// backlog cost a GET per finished bundle per bundle, once per
    /// listing interval costs one.
    taken_checked: Option<Instant>,
    /// When the control objects were last listed: a backlog known from
    /// the last look is worked through without listing again before each
    /// bundle, until the listing interval has passed.
    looked: Option<Instant>,
    /// Each bundle's objects, when the last look listed the inbox whole.
    listed: HashMap<String, Vec<crate::s3::Listed>>,
    /// When the inbox was last listed.
    listed_at: Option<Instant>,
    /// Until when the inbox is looked at by its names only (it held more
    /// than [`LOOK_MOST`] objects).
    names_only_until: Option<Instant>,
    /// The names whose manifest a look by names did not find, and when:
    /// read again once per lease, not at each look (an inbox of many
    /// names without one would cost a GET each, every look).
    absent: HashMap<String, Instant>,
}

impl Inbox {
    /// Forgets the names a look no longer found.
    fn forget_all_but(&mut self, present: impl Fn(&str) -> bool) {
        self.arrivals.retain(|n, _| present(n));
        self.waiting.retain(|n, _| present(n));
        self.told.retain(|n, _| n.is_empty() || present(n));
        self.taken.retain(|n, _| present(n));
        self.absent.retain(|n, _| present(n));
    }
}

/// What to do with the bundle a look picked.
enum Pick {
    /// Complete: fetch and process it.
    Complete(Box<Probe>),
    /// Waiting cannot make it valid, or it stayed incomplete for
    /// `incomplete_timeout`: fail it with the reason.
    Fail(Box<Probe>, String),
}

impl Worker {
    /// Serves an intake pipeline: stands by until this agent holds the
    /// lease, then holds it until stopped or until it is lost (and stands
    /// by again). `--once` gives up on standby after `lock_timeout`.
    pub(super) fn serve_intake(&self, intake: &Intake, rx: &Receiver<Wake>) {
        let id = &self.pipeline.id;
        let bucket = match Bucket::open(intake) {
            Ok(b) => Arc::new(b),
            Err(e) => {
                log::error!("pipeline={id}: cannot use the intake: {e}; not serving this pipeline");
                self.tally.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let started = Instant::now();
        let mut watch = lease::Watch::default();
        let mut told = String::new();
        loop {
            if self.stopping() {
                return;
            }
            let note = match watch.attempt(&bucket.root, intake.lease) {
                Ok(Attempt::Taken(held)) => {
                    let held = Arc::new(held);
                    match &held.took_over {
                        Some(r) => log::warn!(
                            "pipeline={id}: took over the intake lease of {} {} (epoch {}), which was not renewed for {}; serving {} from here",
                            r.host,
                            r.pid,
                            r.epoch,
                            crate::config::format_duration(intake.lease),
                            bucket.label()
                        ),
                        None => log::info!(
                            "pipeline={id}: holds the intake lease (epoch {}); serving {}",
                            held.epoch(),
                            bucket.label()
                        ),
                    }
                    told.clear();
                    self.hold_intake(intake, &bucket, held, rx);
                    if self.once {
                        return;
                    }
                    continue;
                }
                Ok(Attempt::HeldBy(r)) => format!(
                    "another agent holds the intake lease ({}); standing by",
                    r.map_or_else(|| "unreadable record".to_owned(), |r| r.holder())
                ),
                Err(e) => format!(
                    "cannot reach the intake to take its lease ({e}); trying again every {}",
                    crate::config::format_duration(intake.renew_every())
                ),
            };
            if note != told {
                log::info!("pipeline={id}: {note}");
                told = note;
            }
            if self.once && started.elapsed() >= self.config.agent.lock_timeout {
                log::warn!(
                    "pipeline={id}: {told}; --once skipped the pipeline and left the intake to that agent"
                );
                self.tally.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            match rx.recv_timeout(intake.renew_every().min(self.config.agent.lock_timeout)) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                _ => {}
            }
        }
    }

    /// Serves the intake while this agent holds its lease.
    fn hold_intake(
        &self,
        intake: &Intake,
        bucket: &Arc<Bucket>,
        held: Arc<Held>,
        rx: &Receiver<Wake>,
    ) {
        let id = &self.pipeline.id;
        let _serving = Serving::start();
        let stop_renewing = Arc::new(AtomicBool::new(false));
        let renewer = self.start_renewing(intake, &held, &stop_renewing);
        let hooks = self.pipeline.destinations.iter().any(|d| d.hooks.is_some());
        let fence = Arc::new(Fence {
            held: held.clone(),
            bucket: bucket.clone(),
            in_hand: std::sync::Mutex::new(None),
            hooks,
            filings: Filings::default(),
        });
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = Some(fence.clone());
        let most = self.config.agent.retry_max_interval;
        let mut filer = Filer::start(id, intake, &fence, most, &self.cancel);
        self.discard_leftovers();
        // The hooks earlier holders' publications owed: carried into the
        // next publication of their bundle (docs/contract.md §22.2).
        let mut owed = HashMap::new();
        if hooks {
            match bucket.committing() {
                Ok(c) => owed = c,
                Err(e) => log::warn!(
                    "pipeline={id}: cannot read the hooks earlier holders owed ({e}); a bundle they committed and publish again runs none"
                ),
            }
        }
        let mut inbox = Inbox {
            owed,
            ..Inbox::default()
        };
        let mut held_since = None;
        let mut expired = None;
        crate::runtime::failpoint::hit("intake.held");
        // Looks in a row that the bucket did not answer: the wait doubles
        // with each, up to `retry_max_interval`.
        let mut unanswered = 0u32;
        loop {
            if self.stopping() {
                break;
            }
            if let Err(lost) = held.valid() {
                log::warn!("pipeline={id}: {lost}; standing by");
                break;
            }
            if expired.is_none_or(|at: Instant| at.elapsed() >= EXPIRE_EVERY) {
                expired = Some(Instant::now());
                self.expire_intake(bucket, &held);
            }
            let mut wait = intake.poll_every();
            match self.intake_step(bucket, &mut inbox, &mut held_since, wait, &filer, rx) {
                Step::Processed => {
                    unanswered = 0;
                    continue;
                }
                Step::Idle if self.once => break,
                // `--once` does not wait an outage out (the client tried
                // each request again for up to half a minute already):
                // what is in the intake stays for the next run, which
                // exits 1 meanwhile.
                Step::Unreachable if self.once => {
                    log::warn!(
                        "pipeline={id}: the intake did not answer; --once leaves it, and what it holds stays there for the next run"
                    );
                    self.tally.unclaimed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Step::Idle | Step::Changing => unanswered = 0,
                Step::Unreachable => {
                    unanswered = unanswered.saturating_add(1);
                    wait = backoff(wait, unanswered, self.config.agent.retry_max_interval);
                }
            }
            match rx.recv_timeout(wait) {
                Ok(Wake::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                _ => {}
            }
        }
        // `--once`: what waits to be complete stays in the inbox (and the
        // run exits 1, as for a local inbox).
        if self.once {
            self.tally
                .incomplete
                .fetch_add(inbox.waiting.len(), Ordering::Relaxed);
        }
        // What is finished is filed while the lease is still renewed.
        filer.finish();
        // `--once`: a bundle whose filing was given up stays in the intake
        // (processed again next run, ending skip_same): the run exits 1.
        if self.once && fence.filings.given_up.load(Ordering::SeqCst) {
            self.tally.unclaimed.fetch_add(1, Ordering::Relaxed);
        }
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = None;
        stop_renewing.store(true, Ordering::SeqCst);
        if let Some(t) = renewer {
            let _ = t.join();
        }
        if self.stopping() || self.once {
            held.release(&bucket.root);
        }
    }

    /// Renews the lease every third of it on a thread of its own (with a
    /// client of its own), and turns a `spool flush` in the bucket into
    /// the local flush the deferral's wait looks for.
    fn start_renewing(
        &self,
        intake: &Intake,
        held: &Arc<Held>,
        stop: &Arc<AtomicBool>,
    ) -> Option<std::thread::JoinHandle<()>> {
        let bucket = match Bucket::open(intake) {
            Ok(b) => b,
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot open a client to renew the intake lease ({e}); it lapses",
                    self.pipeline.id
                );
                return None;
            }
        };
        let (held, stop) = (held.clone(), stop.clone());
        let (id, every) = (self.pipeline.id.clone(), intake.renew_every());
        let folder = self.spool.pipeline_folder().to_path_buf();
        let spawned = std::thread::Builder::new()
            .name(format!("lease-{id}"))
            .spawn(move || {
                let mut next = Instant::now() + every;
                let mut failing = false;
                while !stop.load(Ordering::SeqCst) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(50).min(every));
                        continue;
                    }
                    next = Instant::now() + every;
                    crate::runtime::failpoint::hit("intake.renew");
                    match held.renew(&bucket.root) {
                        Ok(()) => {
                            if failing {
                                log::info!("pipeline={id}: renewed the intake lease again");
                                failing = false;
                            }
                        }
                        Err(RenewError::Lost(lost)) => {
                            log::warn!("pipeline={id}: {lost}");
                            return;
                        }
                        Err(RenewError::Failed(e)) => {
                            if !failing {
                                log::warn!("pipeline={id}: cannot renew the intake lease ({e}); trying again every {}", crate::config::format_duration(every));
                                failing = true;
                            }
                            next = Instant::now() + every / 3;
                        }
                    }
                    // Only a deferred bundle waits for a flush (and the
                    // holder's loop is in its wait then, not looking).
                    let deferred = spool::queue::deferral(&folder).is_ok_and(|d| d.is_some());
                    if deferred
                        && let Ok(controls) = bucket.controls()
                        && bucket.take_flush(&controls).unwrap_or(false)
                    {
                        let _ = spool::queue::request_flush(&folder, OffsetDateTime::now_utc());
                    }
                }
            });
        match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                log::error!(
                    "pipeline={}: cannot start the lease thread ({e}); the lease lapses",
                    self.pipeline.id
                );
                None
            }
        }
    }

    /// Whether this agent serves an intake whose lease it lost (a deferred
    /// bundle then stops waiting: it is the new holder's).
    pub(super) fn lease_lost(&self) -> bool {
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(Err(lost)) = fence.map(|f| f.held.valid()) else {
            return false;
        };
        log::warn!(
            "pipeline={}: {lost}; the deferred bundle stays in the intake for the agent that serves it now",
            self.pipeline.id
        );
        true
    }

    /// Deletes the results below `done/` past `done_retention`.
    fn expire_intake(&self, bucket: &Bucket, held: &Held) {
        // Only while the lease is this agent's in the bucket: a holder
        // paused past its lease must not delete a result a new holder
        // just wrote under a name that expired meanwhile.
        if let Err(lost) = held.check(&bucket.root) {
            log::info!(
                "pipeline={}: done/ results not expired: {lost}",
                self.pipeline.id
            );
            return;
        }
        match bucket.expire_done(self.config.agent.done_retention) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "pipeline={} removed {n} done/ results past done_retention from {}",
                self.pipeline.id,
                bucket.label()
            ),
            Err(e) => log::warn!(
                "pipeline={}: cannot expire done/ results in {} ({e}); tried again later",
                self.pipeline.id,
                bucket.label()
            ),
        }
    }

    /// What an earlier holder on this host left in `work/`, `done/` and
    /// `failed/` goes: the bucket is the record of what is finished, and a
    /// bundle still in its inbox is processed again from its start.
    fn discard_leftovers(&self) {
        // Hooks a publication owed are in the bucket (intake::COMMITTING),
        // carried into its next publication by whichever agent makes it.
        let _ = std::fs::remove_file(self.spool.work.join(spool::UNFILED_FILE));
        for folder in [Folder::Work, Folder::Done, Folder::Failed] {
            let dir = self.spool.folder(folder);
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    log::info!(
                        "pipeline={}: removing {} left by an earlier holder on this host; the bucket's inbox still has it if it was not finished",
                        self.pipeline.id,
                        path.display()
                    );
                    let _ = std::fs::remove_dir_all(&path);
                } else if folder == Folder::Work {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let _ = std::fs::remove_dir_all(self.spool.pipeline_folder().join(spool::RESULTS_DIR));
    }

    /// One look at the intake: the next bundle in arrival order, fetched,
    /// processed and filed in the bucket.
    fn intake_step(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        held_since: &mut Option<OffsetDateTime>,
        every: Duration,
        filer: &Filer,
        rx: &Receiver<Wake>,
    ) -> Step {
        let id = &self.pipeline.id;
        // A backlog known from the last listing is worked through without
        // looking again before each bundle: the control objects (a hold, a
        // flush) are looked at once per listing interval, and the inbox
        // too while no bundle it showed is ready; while one is, once per
        // lease (what arrives meanwhile comes after the backlog).
        let look = inbox.arrivals.is_empty() || inbox.looked.is_none_or(|at| at.elapsed() >= every);
        let ready = inbox
            .arrivals
            .keys()
            .any(|n| !inbox.waiting.contains_key(n));
        let look_at_inbox =
            look && (!ready || inbox.listed_at.is_none_or(|at| at.elapsed() >= every * 6));
        if look {
            let controls = match bucket.controls() {
                Ok(c) => c,
                Err(e) => return self.unreachable(inbox, &e),
            };
            inbox.looked = Some(Instant::now());
            // A flush asked for while no bundle waits in its deferral (this
            // loop runs only between bundles) finds nothing to flush.
            if controls.contains_key(intake::FLUSH_KEY) && bucket.take_flush(&controls).is_ok() {
                log::info!("pipeline={id}: `spool flush` asked, but no bundle is deferred");
            }
            let hold = bucket.held(&controls);
            if hold.is_some() != held_since.is_some() {
                match hold {
                    Some(since) => log::warn!(
                        "pipeline={id}: held since {} (`distributor spool hold`); claiming nothing from {} until `distributor spool release {id}`",
                        crate::catalog::format_time(since),
                        bucket.label()
                    ),
                    None => log::info!("pipeline={id}: released; claiming from the intake again"),
                }
                self.tally.metrics.set_held(id, hold.is_some());
                *held_since = hold;
            }
        }
        if held_since.is_some() {
            return Step::Idle;
        }
        let pick = match self.pick(bucket, inbox, every, look_at_inbox) {
            Ok(p) => p,
            Err(e) => return self.unreachable(inbox, &e),
        };
        inbox.told.remove("");
        let Some(pick) = pick else {
            return Step::Idle;
        };
        let (probe, fail) = match pick {
            Pick::Complete(p) => (p, None),
            Pick::Fail(p, why) => (p, Some(why)),
        };
        let arrival = inbox.arrivals.remove(&probe.name);
        inbox.waiting.remove(&probe.name);
        inbox.told.remove(&probe.name);
        let version = match &probe.manifest {
            Some(v) => Some(v.clone()),
            None => arrival.as_ref().map(|a| (a.etag.clone(), a.at)),
        };
        let owed = inbox.owed.remove(&probe.name);
        let carried = owed.clone().filter(|c| {
            version.as_ref().is_some_and(|v| {
                intake::same_version(&v.0, &crate::s3::ETag(c.manifest_etag.clone()))
            })
        });
        inbox.taken.insert(probe.name.clone(), version.clone());
        let taken = (&*probe, version);
        let again = match self.take_in(bucket, taken, fail, carried, filer, rx) {
            Taken::Processed => return Step::Processed,
            // `--once` ends there: the bundle stays first for the next run
            // (and the run exits 1, as for a bundle it could not claim).
            Taken::Again(_) if self.once => {
                self.tally.unclaimed.fetch_add(1, Ordering::Relaxed);
                Step::Idle
            }
            Taken::Again(again) => again,
        };
        // Not taken after all: it stays first in arrival order, and is
        // listed again before it is fetched again.
        inbox.taken.remove(&probe.name);
        inbox.listed.remove(&probe.name);
        if let Some(a) = arrival {
            inbox.arrivals.insert(probe.name.clone(), a);
        }
        if let Some(c) = owed {
            inbox.owed.insert(probe.name.clone(), c);
        }
        again
    }

    fn unreachable(&self, inbox: &mut Inbox, e: &crate::s3::Error) -> Step {
        let note = e.to_string();
        if inbox.told.get("") != Some(&note) {
            log::warn!(
                "pipeline={}: cannot look at the intake ({note}); trying again (an outage of the bucket defers, nothing is lost)",
                self.pipeline.id
            );
            inbox.told.insert(String::new(), note);
        }
        Step::Unreachable
    }

    /// The first bundle in arrival order that is complete, or that must be
    /// failed; `None` when every bundle waits. With `look`, the inbox is
    /// listed first for new arrivals; else the arrivals known are probed.
    fn pick(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        every: Duration,
        look: bool,
    ) -> crate::s3::Result<Option<Pick>> {
        if look {
            self.look_at_inbox(bucket, inbox, every)?;
        }
        let mut order: Vec<(&String, &intake::Arrival)> = inbox.arrivals.iter().collect();
        order.sort_by(|a, b| (a.1.at, a.0).cmp(&(b.1.at, b.0)));
        let order: Vec<String> = order.into_iter().map(|(n, _)| n.clone()).collect();
        let signed = self.spool.signed;
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for name in order {
            // A delivery again under a name still being filed keeps its
            // place: it is probed (listed anew) once that filing ended,
            // and nothing after it is taken meanwhile. A filing tried
            // again (a stop or a lost lease ends it) is waited for a lease
            // at a time; nothing is taken once the holder stops or its
            // lease is lost meanwhile, and `--once` leaves it for the next
            // run.
            if let Some(f) = &fence {
                let filed = f.filings.wait_for(&name, every * 6);
                if !filed && self.once {
                    log::info!(
                        "pipeline={} bundle={}: delivered again while its filing is tried again; --once leaves it for the next run",
                        self.pipeline.id,
                        crate::text::escape::inert(&name)
                    );
                    self.tally.unclaimed.fetch_add(1, Ordering::Relaxed);
                }
                if !filed || self.stopping() || f.held.valid().is_err() {
                    return Ok(None);
                }
            }
            // An incomplete bundle is probed again once per listing
            // interval, not before each bundle of a backlog behind it.
            if inbox
                .waiting
                .get(&name)
                .is_some_and(|w| w.2.elapsed() < every)
            {
                continue;
            }
            // What the look listed serves a probe within the listing
            // interval, and within a lease when it gave every object's
            // version: the fetch then reads each object only as listed (one
            // replaced or gone since is not read, and the bundle is looked
            // at again). Later, and for a bundle that waits to be complete,
            // the bundle is listed anew.
            let versioned = inbox
                .listed
                .get(&name)
                .is_some_and(|l| l.iter().all(|o| o.etag.is_some()));
            let serves = if versioned && !inbox.waiting.contains_key(&name) {
                every * 6
            } else {
                every
            };
            let fresh = inbox.listed_at.is_some_and(|at| at.elapsed() < serves);
            let known = intake::Known {
                objects: fresh
                    .then(|| inbox.listed.get(&name).map(Vec::as_slice))
                    .flatten(),
                manifest: inbox.arrivals.get(&name),
            };
            let probe = match bucket.probe(&name, &self.pipeline.limits, signed, known) {
                Ok(probe) => probe,
                // Its objects cannot be read (a key the client cannot
                // take): it fails, and the bundles after it go on.
                Err(e) if intake::unreadable(&e) => {
                    let why = format!(
                        "its objects cannot be listed or read ({e}); delete inbox/{}/ in the bucket with an S3 client (`aws s3 rm --recursive`) and deliver it again with valid names",
                        crate::text::escape::inert(&name)
                    );
                    let probe = intake::Probe::broken(&name, why.clone());
                    return Ok(Some(Pick::Fail(Box::new(probe), why)));
                }
                Err(e) => return Err(e),
            };
            log::debug!(
                "pipeline={} bundle={}: {:?}",
                self.pipeline.id,
                crate::text::escape::inert(&name),
                probe.state
            );
            match &probe.state {
                State::Complete => return Ok(Some(Pick::Complete(Box::new(probe)))),
                State::Broken(why) => {
                    let why = why.clone();
                    return Ok(Some(Pick::Fail(Box::new(probe), why)));
                }
                State::NoManifest => {
                    inbox.arrivals.remove(&name);
                }
                State::Incomplete(what) => {
                    let now = Instant::now();
                    let entry =
                        inbox
                            .waiting
                            .entry(name.clone())
                            .or_insert((probe.signature, now, now));
                    entry.2 = now;
                    if entry.0 != probe.signature {
                        *entry = (probe.signature, now, now);
                    }
                    let timeout = self.config.agent.incomplete_timeout;
                    if entry.1.elapsed() >= timeout {
                        let why = format!(
                            "still incomplete after {} without change ({what}); deliver it again, complete, with manifest.json last",
                            crate::config::format_duration(timeout)
                        );
                        return Ok(Some(Pick::Fail(Box::new(probe), why)));
                    }
                    let what = what.clone();
                    self.tell_intake(inbox, &name, &format!("waits: incomplete ({what})"));
                }
            }
        }
        Ok(None)
    }

    /// Looks at the inbox: forgets what left it, and learns the arrival
    /// of each new name (and of a new delivery under a name taken before).
    /// An inbox of at most [`LOOK_MOST`] objects is listed whole, which
    /// tells every manifest's version and arrival, and every bundle's
    /// objects for its probe; a larger one by its names, each new name's
    /// manifest then read by a GET.
    fn look_at_inbox(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        every: Duration,
    ) -> crate::s3::Result<()> {
        inbox.listed.clear();
        inbox.listed_at = Some(Instant::now());
        let filing = self.filings_under_way();
        let whole = inbox.names_only_until.is_none_or(|at| Instant::now() >= at);
        let look = if whole {
            bucket.look(LOOK_MOST)?
        } else {
            intake::Look::Names(bucket.names()?)
        };
        let names = match look {
            intake::Look::Whole(all) => {
                inbox.names_only_until = None;
                return self.look_at_whole_inbox(bucket, inbox, all, &filing);
            }
            intake::Look::Names(names) => names,
        };
        // Too many objects to list whole: not tried again for a lease.
        if whole {
            inbox.names_only_until = Some(Instant::now() + every * 6);
        }
        let present: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        inbox.forget_all_but(|n| present.contains(n));
        // While a backlog is known, names already taken are looked at
        // again once per lease, not once per listing interval: on servers
        // that list an emptied prefix for a while, a new delivery under a
        // name just finished waits that long behind the backlog.
        let recheck_every = if inbox.arrivals.is_empty() {
            every
        } else {
            every * 6
        };
        let recheck = inbox
            .taken_checked
            .is_none_or(|at| at.elapsed() >= recheck_every);
        if recheck {
            inbox.taken_checked = Some(Instant::now());
        }
        let unknown: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !inbox.arrivals.contains_key(*n))
            .filter(|n| recheck || !inbox.taken.contains_key(*n))
            // A name taken is asked again at each recheck, above.
            .filter(|n| {
                inbox.taken.contains_key(*n)
                    || inbox
                        .absent
                        .get(*n)
                        .is_none_or(|at| at.elapsed() >= every * 6)
            })
            .collect();
        self.learn_arrivals(bucket, inbox, &unknown)
    }

    /// The names whose filing is under way: their listings are not kept
    /// (a look may show a delivery while it is being removed).
    fn filings_under_way(&self) -> std::collections::HashSet<String> {
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        fence.map(|f| f.filings.under_way()).unwrap_or_default()
    }

    /// [`Worker::look_at_inbox`] of an inbox listed whole: no request for
    /// each name, and none for a name whose objects are gone.
    fn look_at_whole_inbox(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        all: std::collections::BTreeMap<String, Vec<crate::s3::Listed>>,
        filing: &std::collections::HashSet<String>,
    ) -> crate::s3::Result<()> {
        // A name being filed is still what this holder took (`taken`).
        inbox.forget_all_but(|n| all.contains_key(n));
        // A server that lists objects without their versions: each new
        // name's manifest is read.
        let mut unknown = Vec::new();
        // New arrivals, with their manifests' sizes.
        let mut new = Vec::new();
        // A name being filed: what is listed of it may be the delivery
        // being removed (the same delivery, never taken twice), or a new
        // delivery, an arrival like any other.
        for (name, objects) in &all {
            let manifest = objects.iter().find(|o| o.path == crate::bundle::MANIFEST);
            let taken = inbox.taken.get(name);
            match manifest.map(|m| (m.etag.as_ref(), m.last_modified)) {
                Some((Some(etag), at)) => {
                    let etag = crate::s3::ETag(etag.clone());
                    let same = |v: Option<(&crate::s3::ETag, OffsetDateTime)>| {
                        v.is_some_and(|v| intake::same_delivery(v, (&etag, at)))
                    };
                    let known = inbox.arrivals.get(name).map(|a| (&a.etag, a.at));
                    let taken = taken.and_then(Option::as_ref).map(|(e, at)| (e, *at));
                    if !same(known) && !same(taken) {
                        let a = intake::Arrival {
                            etag,
                            at,
                            bytes: None,
                        };
                        inbox.arrivals.insert(name.clone(), a);
                        new.push((name.as_str(), manifest.map_or(0, |m| m.size), at));
                    }
                }
                Some((None, _)) if !inbox.arrivals.contains_key(name) => {
                    unknown.push(name.as_str());
                }
                Some((None, _)) => {}
                None => {
                    inbox.arrivals.remove(name);
                    inbox.waiting.remove(name);
                    if taken.is_none() {
                        self.tell_intake(inbox, name, NO_MANIFEST_YET);
                    }
                }
            }
        }
        self.learn_arrivals(bucket, inbox, &unknown)?;
        // Read ahead only: a manifest that cannot be read now is read by
        // its probe, which says why.
        if let Err(e) = self.read_manifests(bucket, inbox, new) {
            log::debug!(
                "pipeline={}: manifests not read ahead ({e})",
                self.pipeline.id
            );
        }
        inbox.listed = all
            .into_iter()
            .filter(|(n, _)| !filing.contains(n))
            .collect();
        Ok(())
    }

    /// Reads the manifests of `new` arrivals (name, the manifest's listed
    /// size, and its arrival) that a listing showed with their versions,
    /// in arrival order, as many as [`MANIFESTS_KEPT`] keeps,
    /// [`crate::s3::HEADS_IN_FLIGHT`] at a time: their probes then read
    /// nothing more. The same GET a bundle as a probe makes, but side by
    /// side rather than one before each bundle; once each.
    fn read_manifests(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        mut new: Vec<(&str, u64, OffsetDateTime)>,
    ) -> crate::s3::Result<()> {
        new.sort_by(|a, b| (a.2, a.0).cmp(&(b.2, b.0)));
        let kept: u64 = inbox
            .arrivals
            .values()
            .filter_map(|a| a.bytes.as_ref().map(|b| b.len() as u64))
            .sum();
        let budget = (MANIFESTS_KEPT as u64).saturating_sub(kept);
        let mut room = budget;
        let mut names = Vec::new();
        for (name, size, _) in new {
            if size > intake::MANIFEST_KEPT || size > room {
                break;
            }
            room -= size;
            names.push(name);
        }
        if names.is_empty() {
            return Ok(());
        }
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let names: Vec<String> = names.into_iter().map(str::to_owned).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        for (name, read) in names.iter().zip(bucket.arrivals(&refs, budget)?) {
            // Kept only while it is the version the listing showed (the
            // probe compares them again).
            if let (Some(read), Some(a)) = (read, inbox.arrivals.get_mut(name))
                && intake::same_version(&read.etag, &a.etag)
            {
                a.bytes = read.bytes;
            }
        }
        Ok(())
    }

    /// Reads the manifests of `names` (new to this holder): each becomes
    /// an arrival, unless it is the delivery already taken.
    fn learn_arrivals(
        &self,
        bucket: &Bucket,
        inbox: &mut Inbox,
        names: &[&str],
    ) -> crate::s3::Result<()> {
        let kept: usize = inbox
            .arrivals
            .values()
            .filter_map(|a| a.bytes.as_ref().map(Vec::len))
            .sum();
        let budget = MANIFESTS_KEPT.saturating_sub(kept);
        for (name, arrival) in names.iter().zip(bucket.arrivals(names, budget)?) {
            match &arrival {
                Some(_) => inbox.absent.remove(*name),
                None => inbox.absent.insert((*name).to_owned(), Instant::now()),
            };
            let taken = inbox.taken.get(*name);
            match arrival {
                Some(a)
                    if taken.and_then(Option::as_ref).is_some_and(|(e, at)| {
                        intake::same_delivery((e, *at), (&a.etag, a.at))
                    }) => {}
                Some(a) => {
                    inbox.arrivals.insert((*name).to_owned(), a);
                }
                None if taken.is_some() => {}
                None => self.tell_intake(inbox, name, NO_MANIFEST_YET),
            }
        }
        Ok(())
    }

    fn tell_intake(&self, inbox: &mut Inbox, name: &str, note: &str) {
        if inbox.told.get(name).is_some_and(|t| t == note) {
            return;
        }
        log::info!(
            "pipeline={} bundle={} {note}",
            self.pipeline.id,
            crate::text::escape::inert(name)
        );
        inbox.told.insert(name.to_owned(), note.to_owned());
    }

    /// Brings `probe` into `work/`, processes it (or fails it with `fail`),
    /// and files its result in the bucket.
    fn take_in(
        &self,
        bucket: &Bucket,
        (probe, version): (&Probe, Option<(crate::s3::ETag, OffsetDateTime)>),
        fail: Option<String>,
        carried: Option<intake::Committing>,
        filer: &Filer,
        rx: &Receiver<Wake>,
    ) -> Taken {
        let id = &self.pipeline.id;
        let name = &local_name(&probe.name);
        let shown = crate::text::escape::inert(&probe.name);
        let work = self.spool.work.join(name);
        if work.exists() {
            let _ = std::fs::remove_dir_all(&work);
        }
        let mut fail = fail;
        let read = match &fail {
            Some(_) => None,
            None => {
                crate::runtime::failpoint::hit("intake.probed");
                match bucket.fetch(probe, &work) {
                    // A path this host cannot hold: the bundle fails, the
                    // ones after it go on.
                    Err(intake::FetchError::Local(e)) => match unholdable(&e) {
                        Some(why) => {
                            let _ = std::fs::remove_dir_all(&work);
                            fail = Some(why);
                            None
                        }
                        None => Some(Err(intake::FetchError::Local(e))),
                    },
                    // One object the server refuses for good, while it
                    // answers this agent otherwise (a read of the lease):
                    // that object's fault, not an outage's or the
                    // credentials'; the bundle fails, the ones after it
                    // go on.
                    // (An object deleted meanwhile is the bundle sent
                    // again: S3 may answer 403 for it.)
                    Err(intake::FetchError::Bucket(e))
                        if bucket.refuses(&e)
                            && bucket.still_listed(
                                &probe.name,
                                &probe.objects,
                                intake::most_objects(&self.pipeline.limits),
                            ) =>
                    {
                        let _ = std::fs::remove_dir_all(&work);
                        fail = Some(format!(
                            "the intake bucket refuses to give an object of it ({e}) while it answers this agent otherwise: an object encrypted with a key of the producer's (SSE-C), archived, or denied to this agent by a policy; upload it again as a plain object, readable by the agent"
                        ));
                        None
                    }
                    read => Some(read),
                }
            }
        };
        // A bundle failed before it was read gets an empty folder to file.
        let fetched = match read {
            Some(read) => read.map(Some),
            None => std::fs::create_dir(&work)
                .map(|()| None)
                .map_err(intake::FetchError::Local),
        };
        crate::runtime::failpoint::hit("intake.fetched");
        match fetched {
            Ok(Some(f)) => {
                for m in &f.mismatches {
                    log::warn!("pipeline={id} bundle={shown}: {m}");
                }
                log::info!(
                    "pipeline={id} bundle={shown}: fetched {} bytes from {}",
                    f.bytes,
                    bucket.label()
                );
                self.hand_over(probe, &work, name, carried);
                self.process(&work, name, rx);
            }
            Ok(None) => {
                let why = fail.unwrap_or_default();
                let e = crate::publish::Error::Folder {
                    path: Path::new(intake::INBOX).join(name),
                    why,
                };
                let report = e.fail(crate::report::RunReport::new(id, false));
                self.file_away(&work, name, &report, 0);
            }
            Err(e) if e.changed() => {
                log::info!(
                    "pipeline={id} bundle={shown}: uploaded again while it was fetched ({e}); looked at again"
                );
                let _ = std::fs::remove_dir_all(&work);
                return Taken::Again(Step::Changing);
            }
            Err(e) => {
                // An outage while reading (or a local folder that cannot
                // take it): the bundle stays in the inbox, first in order.
                log::warn!(
                    "pipeline={id} bundle={shown}: cannot fetch it ({e}); it stays in the intake and is tried again"
                );
                let _ = std::fs::remove_dir_all(&work);
                return Taken::Again(Step::Unreachable);
            }
        }
        if self.file_in_bucket(filer, (probe, version), name) {
            Taken::Processed
        } else {
            Taken::Again(Step::Unreachable)
        }
    }

    /// Before processing `probe` (fetched into `work`, local name `name`):
    /// the fence learns which bundle is in hand, and the hooks an earlier
    /// holder's publication of this very delivery owed are recorded as a
    /// commit under way ([`spool::UNFILED_FILE`]), which the publication
    /// carries into the hooks it runs (as after a crash on this host).
    fn hand_over(
        &self,
        probe: &Probe,
        work: &Path,
        name: &str,
        carried: Option<intake::Committing>,
    ) {
        let fence = self.fence.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(f), Some((etag, _))) = (&fence, &probe.manifest) {
            *f.in_hand.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((probe.name.clone(), etag.clone()));
        }
        let Some(c) = carried.filter(|c| !c.hooks.is_empty()) else {
            return;
        };
        log::info!(
            "pipeline={} bundle={}: an earlier holder's publication of it owed {} hook(s); they run after this one",
            self.pipeline.id,
            crate::text::escape::inert(&probe.name),
            c.hooks.len()
        );
        let recorded = spool::unfiled(&self.spool).and_then(|mut unfiled| {
            unfiled.insert(
                name.to_owned(),
                spool::Unfiled::committing(work, 0, c.hooks)?,
            );
            spool::set_unfiled(&self.spool, &unfiled)
        });
        if let Err(e) = recorded {
            log::warn!(
                "pipeline={} bundle={}: cannot record the hooks an earlier holder owed ({e}); they do not run",
                self.pipeline.id,
                crate::text::escape::inert(&probe.name)
            );
        }
    }

    /// Files the result of the bundle just processed in the bucket (by
    /// the [`Filer`]): the result, a failed bundle's files beside it, then
    /// its removal from the inbox; and forgets it on this host.
    fn file_in_bucket(
        &self,
        filer: &Filer,
        (probe, version): (&Probe, Option<(crate::s3::ETag, OffsetDateTime)>),
        local_name: &str,
    ) -> bool {
        let id = &self.pipeline.id;
        let shown = crate::text::escape::inert(&probe.name);
        let (folder, local) = if self.spool.done.join(local_name).is_dir() {
            (Folder::Done, self.spool.done.join(local_name))
        } else if self.spool.failed.join(local_name).is_dir() {
            (Folder::Failed, self.spool.failed.join(local_name))
        } else {
            // Left in work/ (a stop, or a spool that cannot file it): it
            // stays in the inbox, first in order, and is processed again
            // (its publication then ends skip_same).
            log::info!("pipeline={id} bundle={shown}: not finished; it stays in the intake");
            let _ = std::fs::remove_dir_all(self.spool.work.join(local_name));
            return false;
        };
        let doc = match spool::read_result(&self.spool, folder, local_name) {
            Ok(r) => r.doc,
            Err(e) => serde_json::json!({ "ok": folder == Folder::Done, "error": e }),
        };
        let _ = std::fs::remove_dir_all(&local);
        let _ = std::fs::remove_dir_all(self.spool.pipeline_folder().join(spool::RESULTS_DIR));
        // A bundle failed before its manifest was read has the version
        // the look saw (its filing removes that manifest only), if any.
        let (etag, at) = match probe.manifest.clone().or(version) {
            Some((etag, at)) => (etag, Some(at)),
            None => (crate::s3::ETag(String::new()), None),
        };
        filer.file(Filing {
            name: probe.name.clone(),
            objects: probe.objects.clone(),
            etag,
            at,
            folder,
            doc,
        });
        true
    }
}

/// A finished bundle's result, to be filed in the bucket.
struct Filing {
    /// Its name in the inbox.
    name: String,
    /// Its objects there, as probed.
    objects: Vec<crate::s3::Listed>,
    /// Its manifest's version and `Last-Modified` (the delivery).
    etag: crate::s3::ETag,
    at: Option<OffsetDateTime>,
    folder: Folder,
    /// Its result, as filed locally.
    doc: serde_json::Value,
}

/// Files finished bundles in the bucket on a thread of its own (with a
/// client of its own) while the holder goes on with the next bundle: a
/// filing is several requests that fetching the next bundle need not wait
/// for. The next commit does ([`Filings`]). A bundle stays in the inbox
/// until it is filed, and the holder does not take it again meanwhile; a
/// filing that fails is tried again (commits wait) until it is filed, the
/// lease is lost or the holder stops: processing it again instead would
/// put it after the bundles committed meanwhile.
struct Filer {
    id: String,
    fence: Arc<Fence>,
    sender: Option<crossbeam_channel::Sender<Filing>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Set when the holder stops: a filing that failed is not tried
    /// again (it stays in the inbox, and is processed again).
    stopping: Arc<AtomicBool>,
    /// The worker's: a stop asked while a commit waits for a filing.
    cancel: crate::runtime::interrupt::Cancel,
    /// The first wait before a failed filing is tried again, and the
    /// longest.
    waits: (Duration, Duration),
}

/// Filings queued at most: the holder waits for the filer beyond that.
const FILINGS_QUEUED: usize = 64;

impl Filer {
    fn start(
        id: &str,
        intake: &Intake,
        fence: &Arc<Fence>,
        most: Duration,
        cancel: &crate::runtime::interrupt::Cancel,
    ) -> Filer {
        let mut filer = Filer {
            id: id.to_owned(),
            fence: fence.clone(),
            sender: None,
            thread: None,
            stopping: Arc::default(),
            cancel: cancel.clone(),
            waits: (intake.poll_every(), most),
        };
        let bucket = match Bucket::open(intake) {
            Ok(b) => b,
            Err(e) => {
                log::warn!(
                    "pipeline={id}: cannot open a second client to file results ({e}); filing each before the next bundle"
                );
                return filer;
            }
        };
        let (tx, rx) = crossbeam_channel::bounded::<Filing>(FILINGS_QUEUED);
        let (id2, fence2, waits) = (filer.id.clone(), fence.clone(), filer.waits);
        let stop = (filer.stopping.clone(), filer.cancel.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("filer-{id}"))
            .spawn(move || {
                for f in rx {
                    file_until_done(&id2, &bucket, &fence2, &f, waits, (&stop.0, &stop.1));
                    fence2.filings.end(&f.name);
                }
            });
        match spawned {
            Ok(t) => {
                filer.sender = Some(tx);
                filer.thread = Some(t);
            }
            Err(e) => log::warn!(
                "pipeline={id}: cannot start a thread to file results ({e}); filing each before the next bundle"
            ),
        }
        filer
    }

    /// Queues `f` (files it here when there is no filer thread).
    fn file(&self, f: Filing) {
        let f = match &self.sender {
            Some(tx) => {
                self.fence.filings.start(&f.name);
                match tx.send(f) {
                    Ok(()) => return,
                    Err(crossbeam_channel::SendError(f)) => {
                        self.fence.filings.end(&f.name);
                        f
                    }
                }
            }
            None => f,
        };
        let stop = (&*self.stopping, &self.cancel);
        file_until_done(
            &self.id,
            &self.fence.bucket,
            &self.fence,
            &f,
            self.waits,
            stop,
        );
    }

    /// Files what is queued (a filing that fails is not tried again),
    /// then stops the thread.
    fn finish(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.sender = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Filer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Files `f`, trying again after a failure (the wait doubling from
/// `waits.0` up to `waits.1`) until it is filed, the lease is lost (the
/// new holder processes the bundle again) or the holder stops (`stop`:
/// its filer's flag, the worker's token); a filing given up is recorded
/// in [`Filings`].
fn file_until_done(
    id: &str,
    bucket: &Bucket,
    fence: &Fence,
    f: &Filing,
    waits: (Duration, Duration),
    stop: (&AtomicBool, &crate::runtime::interrupt::Cancel),
) {
    let stopping = || stop.0.load(Ordering::SeqCst) || stop.1.finishing();
    let mut failures = 0u32;
    loop {
        // A panic is a filing that failed: the commit waiting for it must
        // not wait for ever.
        let filed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            file_one(id, bucket, fence, f)
        }));
        if filed.unwrap_or(false) {
            return;
        }
        if fence.held.valid().is_err() || stopping() {
            log::info!(
                "pipeline={id} bundle={}: not filed; it stays in the intake and is processed again (its publication ends skip_same)",
                crate::text::escape::inert(&f.name)
            );
            fence.filings.given_up.store(true, Ordering::SeqCst);
            return;
        }
        failures = failures.saturating_add(1);
        let until = Instant::now() + backoff(waits.0, failures, waits.1);
        while Instant::now() < until && !stopping() && fence.held.valid().is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Files `f` in the bucket: its result, a failed bundle's files beside
/// it, then its removal from the inbox. Nothing of it when the lease was
/// lost meanwhile (the new holder processes it again). Whether it was
/// filed.
fn file_one(id: &str, bucket: &Bucket, fence: &Fence, f: &Filing) -> bool {
    let name = &f.name;
    let shown = crate::text::escape::inert(name);
    // Known lost here: nothing is written. The lease is read in the
    // bucket again before the inbox loses anything (below).
    if let Err(lost) = fence.held.valid() {
        log::warn!(
            "pipeline={id} bundle={shown}: {lost}; its result is not filed in the bucket by this agent"
        );
        return false;
    }
    let mut doc = f.doc.clone();
    if let Some(obj) = doc.as_object_mut() {
        obj.insert(
            "intake".to_owned(),
            serde_json::json!({
                "bucket": bucket.label(),
                "name": name,
                "manifest_etag": f.etag.0,
                "manifest_last_modified": f.at.map(crate::catalog::format_time),
                "host": lease::host_name(),
                "epoch": fence.held.epoch(),
            }),
        );
    }
    // Its hooks ran (a publication left owing them is not filed): the
    // record of what it owed goes before its result is written (a crash
    // between the two would run them again), once the lease was read in
    // the bucket (a stale holder must not remove a new holder's record).
    if fence.hooks {
        if let Err(lost) = fence.held.check(&bucket.root) {
            log::warn!(
                "pipeline={id} bundle={shown}: {lost}; its result is not filed in the bucket by this agent"
            );
            return false;
        }
        if let Err(e) = bucket.unmark_committing(name) {
            log::warn!(
                "pipeline={id} bundle={shown}: cannot forget the hooks it owed ({e}); the next publication of it runs them again (hooks run at least once)"
            );
        }
    }
    let to = match f.folder {
        Folder::Done => intake::DONE,
        _ => intake::FAILED,
    };
    // Before the inbox loses anything, the lease is read in the bucket
    // (a host paused past its lease, whose clock did not count the pause,
    // finds out here) and the inbox listed, to see what changed since the
    // probe; both while the result is written, a done bundle's at least
    // (a failed one's files are copied first, and listed after).
    let before_removal = || {
        std::thread::scope(|scope| {
            let lease = std::thread::Builder::new()
                .name(format!("filer-lease-{id}"))
                .spawn_scoped(scope, || fence.held.check(&bucket.root));
            // A bundle failed before it was listed has nothing to list
            // (its prefix may not even be listable): only its manifest
            // goes.
            let now = if f.objects.is_empty() {
                Ok(None)
            } else {
                bucket.inbox_now(name, &f.objects)
            };
            let lease = match lease {
                Ok(lease) => lease.join().unwrap_or_else(|_| {
                    Err(lease::Lost("reading the intake lease panicked".to_owned()))
                }),
                Err(_) => fence.held.check(&bucket.root),
            };
            (now, lease)
        })
    };
    let done = f.folder == Folder::Done;
    let (filed, checked) = std::thread::scope(|scope| {
        let early = if done {
            std::thread::Builder::new()
                .name(format!("filer-list-{id}"))
                .spawn_scoped(scope, before_removal)
                .ok()
        } else {
            None
        };
        let filed = bucket
            .put_result(to, name, &doc, (&f.etag, f.at))
            .and_then(|filed| {
                crate::runtime::failpoint::hit("intake.result_written");
                let refused = if done {
                    Vec::new()
                } else {
                    bucket.copy_to_failed(name, &filed.name, &f.objects)?
                };
                Ok((filed, refused))
            });
        let checked = match early {
            Some(early) => early.join().ok(),
            None => None,
        };
        (filed, checked)
    });
    let filed = filed.and_then(|(filed, refused)| {
        // What could not be copied beside the failure stays in the inbox.
        for (path, e) in &refused {
            log::warn!(
                "pipeline={id} bundle={shown}: {} could not be copied beside its failure ({e}); it stays in the inbox (delete it with an S3 client once you have it)",
                crate::text::escape::inert(path)
            );
        }
        let objects: Vec<crate::s3::Listed> = f
            .objects
            .iter()
            .filter(|o| !refused.iter().any(|(p, _)| *p == o.path))
            .cloned()
            .collect();
        // Nothing it may remove (its every object stays): not a bundle
        // failed before it was listed, whose manifest alone goes.
        if objects.is_empty() && !f.objects.is_empty() {
            return Ok((filed, Some(0)));
        }
        let (now, lease) = checked.unwrap_or_else(before_removal);
        if let Err(lost) = lease.and_then(|()| fence.held.valid()) {
            log::warn!(
                "pipeline={id} bundle={shown}: {lost}; its result is written, and it stays in the inbox until this agent reads its lease again (or the agent that serves the intake next removes it)"
            );
            return Ok((filed, None));
        }
        let left = bucket.remove_unchanged(name, (&objects, &f.etag), now?.as_ref())?;
        Ok((filed, Some(left)))
    });
    match filed {
        Ok((_, None)) => false,
        Ok((filed, Some(left))) => {
            if left > 0 {
                log::info!(
                    "pipeline={id} bundle={shown}: delivered again while it was processed; the {left} object(s) of the new delivery stay in the inbox, and it is processed next"
                );
            }
            log::info!(
                "pipeline={id} bundle={shown}: filed as {}/{}/{} in {}",
                to,
                crate::text::escape::inert(&filed.name),
                intake::RESULT,
                bucket.label()
            );
            true
        }
        Err(e) => {
            log::warn!(
                "pipeline={id} bundle={shown}: cannot file its result in the bucket ({e}); trying again (the next commit waits for it). Filing needs PutObject, GetObject, DeleteObject and ListBucket on the intake's path (docs/object-storage.md, \"Bucket permissions\")"
            );
            false
        }
    }
}

/// Why a bundle's paths cannot be written into this host's `work/`, when
/// `e` (met writing them) is the bundle's fault rather than the host's: a
/// path longer than the file system takes, or a file where another path
/// needs a folder (S3 holds `manifest.json.sig` and `manifest.json.sig/x`
/// side by side).
fn unholdable(e: &std::io::Error) -> Option<String> {
    use std::io::ErrorKind as K;
    if e.raw_os_error() == Some(libc::ENAMETOOLONG) {
        return Some(format!(
            "a path of it is too long for this host's work/ ({e}); shorten its paths and deliver it again"
        ));
    }
    matches!(e.kind(), K::AlreadyExists | K::NotADirectory | K::IsADirectory).then(|| {
        format!(
            "two of its paths cannot both be written into this host's work/ ({e}): one names a folder the other needs as a file, or they differ only in case on a file system that ignores case; rename one and deliver it again"
        )
    })
}

/// The wait after `unanswered` looks in a row found the bucket
/// unreachable: `poll` doubled for each, at most `most` (never less than
/// `poll`).
fn backoff(poll: Duration, unanswered: u32, most: Duration) -> Duration {
    let doubled = poll.saturating_mul(1u32 << unanswered.min(16));
    doubled.min(most).max(poll)
}

/// The name of bundle `name` in the local spool: its own when it is a
/// valid bundle name, else one that is (it is failed for its name).
fn local_name(name: &str) -> String {
    match crate::paths::check_bundle_name(name) {
        Ok(()) => name.to_owned(),
        Err(_) => {
            use sha2::Digest as _;
            let digest = sha2::Sha256::digest(name.as_bytes());
            let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
            format!("invalid-name~{tag}")
        }
    }
}

/// How one look at the intake ended.
/// What became of a bundle [`Worker::take_in`] was given.
enum Taken {
    /// Processed (or failed), and handed to the filer.
    Processed,
    /// Not fetched: it stays in the inbox, and the holder's loop goes on
    /// as this step says.
    Again(Step),
}

enum Step {
    /// A bundle was processed: look again at once.
    Processed,
    /// Nothing to claim now.
    Idle,
    /// The bucket did not answer.
    Unreachable,
    /// The bundle taken was being uploaded again: looked at again after
    /// a listing interval (`--once` too).
    Changing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_bucket_is_looked_at_less_and_less_often() {
        let poll = Duration::from_secs(5);
        let most = Duration::from_secs(600);
        let table = [(1, 10), (2, 20), (3, 40), (6, 320), (7, 600), (40, 600)];
        for (unanswered, secs) in table {
            assert_eq!(
                backoff(poll, unanswered, most),
                Duration::from_secs(secs),
                "{unanswered}"
            );
        }
        // A maximum below the poll interval never makes it poll faster.
        assert_eq!(backoff(poll, 3, Duration::from_secs(1)), poll);
    }

    #[test]
    fn a_path_the_bundle_makes_unholdable_fails_it_and_a_host_fault_does_not() {
        use std::io::{Error, ErrorKind as K};
        for (e, theirs) in [
            (
                Error::from_raw_os_error(libc::ENAMETOOLONG),
                Some("too long"),
            ),
            (
                Error::from_raw_os_error(libc::EEXIST),
                Some("cannot both be written"),
            ),
            (
                Error::from_raw_os_error(libc::ENOTDIR),
                Some("cannot both be written"),
            ),
            (
                Error::from_raw_os_error(libc::EISDIR),
                Some("cannot both be written"),
            ),
            (Error::from_raw_os_error(libc::ENOSPC), None),
            (Error::from_raw_os_error(libc::EACCES), None),
            (Error::from(K::Interrupted), None),
        ] {
            let got = unholdable(&e);
            match theirs {
                Some(why) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(why)),
                    "{e}: {got:?}"
                ),
                None => assert_eq!(got, None, "{e}"),
            }
        }
    }

    #[test]
    fn an_invalid_name_gets_a_local_name_that_is_valid() {
        assert_eq!(local_name("report-1"), "report-1");
        for bad in ["n".repeat(256), "a\nb".to_owned(), "..".to_owned()] {
            let local = local_name(&bad);
            assert!(local.starts_with("invalid-name~"), "{local}");
            assert!(crate::paths::check_bundle_name(&local).is_ok());
            assert_ne!(local_name(&bad), local_name("other"));
        }
    }
}
