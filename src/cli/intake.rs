//! The spool commands and `status` on an intake pipeline (docs/contract.md
//! §22.4): what they do to a local spool, done through the intake's bucket
//! from any host with the config. The inbox, `done/`, `failed/`, the hold
//! and the lease are in the bucket, the same from every host; what the
//! holder has in hand (`work/`, a deferral) is known on its host only, and
//! shown from there.

use super::output::human_age;
use super::{Error, Outcome, told_unless};
use crate::agent::presence;
use crate::config::{Config, Intake, Pipeline, format_duration};
use crate::intake::{Bucket, DONE, FAILED, INBOX, Known, State, lease};
use crate::s3::{self, Failure};
use crate::spool::{self, Folder, ResultDoc, Spool, SpoolEntry, queue};
use crate::text::escape::inert;
use serde_json::{Value, json};
use time::OffsetDateTime;

/// `s3://bucket/path`: where the intake's objects are.
pub(super) fn url(intake: &Intake) -> String {
    let l = &intake.location;
    if l.path.is_empty() {
        format!("s3://{}", l.bucket)
    } else {
        format!("s3://{}/{}", l.bucket, l.path)
    }
}

/// `s3://bucket/path/folder/name/` (`s3://bucket/path/folder/` without a
/// name).
fn url_of(intake: &Intake, folder: &str, name: &str) -> String {
    match name {
        "" => format!("{}/{folder}/", url(intake)),
        _ => format!("{}/{folder}/{name}/", url(intake)),
    }
}

/// What went wrong with a request to the intake, naming the bucket and
/// the fix.
fn trouble(p: &Pipeline, intake: &Intake, e: &s3::Error) -> String {
    let l = &intake.location;
    let endpoint = l.endpoint.as_deref().unwrap_or("AWS S3");
    let fix = match e {
        // Its message says which variables to set.
        s3::Error::Credentials { .. } => String::new(),
        s3::Error::Store { failure, .. } => match failure {
            Failure::CredentialsRefused | Failure::Denied => format!(
                "; the key in AWS_ACCESS_KEY_ID must be one that may list, read, write and delete below {}/ in bucket {}",
                l.path, l.bucket
            ),
            Failure::BucketMissing => format!(
                "; create bucket {} at {endpoint}, or correct intake.bucket of pipeline {} in the config",
                l.bucket, p.id
            ),
            Failure::Connect | Failure::TimedOut | Failure::Broken | Failure::NotSent => format!(
                "; is {endpoint} up and reachable from this host? (the agent serving the intake defers meanwhile; nothing is lost)"
            ),
            _ => String::new(),
        },
        _ => String::new(),
    };
    match e {
        // The others name the bucket (and the endpoint) themselves.
        s3::Error::Credentials { .. } | s3::Error::Setting(_) | s3::Error::Runtime(_) => {
            format!("pipeline {}: intake {}: {e}{fix}", p.id, url(intake))
        }
        _ => format!("pipeline {}: intake {e}{fix}", p.id),
    }
}

/// A client of the intake; `single_try` for `status`, which must not wait
/// on a dead endpoint for longer than one attempt per request.
fn open(p: &Pipeline, intake: &Intake, single_try: bool) -> Result<Bucket, String> {
    let opened = if single_try {
        Bucket::open_single_try(intake)
    } else {
        Bucket::open(intake)
    };
    opened.map_err(|e| trouble(p, intake, &e))
}

/// The error of a command that could not do its work in the bucket.
fn failed(p: &Pipeline, intake: &Intake) -> impl Fn(s3::Error) -> Error {
    move |e| Error::Failed(trouble(p, intake, &e))
}

/// Whether `name` may be a bundle of the bucket; else the usage error, as
/// for a local spool.
fn check_name(name: &str, listing: &str) -> Result<(), Error> {
    if crate::paths::check_bundle_name(name).is_err() {
        return Err(Error::Usage(format!(
            "{:?} is not a bundle name; use a name shown by `distributor spool list {listing}`",
            inert(name)
        )));
    }
    Ok(())
}

/// The rows of `spool list` for an intake pipeline: its inbox, `done/`
/// and `failed/` from the bucket, `work/` from this host (the bundle in
/// hand when this host holds the lease).
pub(super) fn list(
    config: &Config,
    p: &Pipeline,
    intake: &Intake,
    folders: &[Folder],
) -> Result<Vec<SpoolEntry>, String> {
    let spool = Spool::of(config, p);
    let bucket = open(p, intake, false)?;
    let in_bucket = |f: Folder| folders.contains(&f).then_some(f);
    let seen = look(
        &bucket,
        config,
        p,
        &spool,
        [Folder::Inbox, Folder::Done, Folder::Failed]
            .into_iter()
            .filter_map(in_bucket)
            .collect(),
        false,
    )
    .map_err(|e| trouble(p, intake, &e))?;
    let mut rows = Vec::new();
    for &f in folders {
        if f == Folder::Work {
            rows.extend(local_work(&spool)?);
        } else {
            rows.extend(seen.rows.iter().filter(|r| r.spool == f.as_str()).cloned());
        }
    }
    Ok(rows)
}

fn local_work(spool: &Spool) -> Result<Vec<SpoolEntry>, String> {
    spool::list(spool, &[Folder::Work])
        .map_err(|e| format!("cannot list {}: {e}", spool.work.display()))
}

/// What one look at the bucket found.
pub(super) struct Seen {
    /// The inbox, `done/` and `failed/` rows asked for, each folder oldest
    /// first.
    pub rows: Vec<SpoolEntry>,
    /// Since when the pipeline is held (the hold object's `Last-Modified`).
    pub hold: Option<OffsetDateTime>,
    /// The lease object: its record (when it parses) and `Last-Modified`.
    pub lease: Option<(Option<lease::Record>, OffsetDateTime)>,
    /// The result documents of `failed/`, by name.
    pub failed: Vec<(String, Option<Value>)>,
}

/// Looks at the bucket: the lease (with `with_lease`), the hold and the
/// rows of `folders`. Stops at the first request that fails.
fn look(
    bucket: &Bucket,
    config: &Config,
    p: &Pipeline,
    spool: &Spool,
    folders: Vec<Folder>,
    with_lease: bool,
) -> s3::Result<Seen> {
    let lease = if with_lease {
        lease::read(&bucket.root)?.map(|(r, _, at)| (r, at))
    } else {
        None
    };
    let hold = bucket.held(&bucket.controls()?);
    let mut seen = Seen {
        rows: Vec::new(),
        hold,
        lease,
        failed: Vec::new(),
    };
    let label = p.intake.as_ref().map(url);
    let row = |folder: Folder, name: &str, at: OffsetDateTime| SpoolEntry {
        pipeline_id: p.id.clone(),
        spool: folder.as_str(),
        name: name.to_owned(),
        modified: crate::catalog::format_time(at),
        stage: None,
        error: None,
        state: None,
        reason: None,
        deferred: None,
        bucket: label.clone(),
    };
    for folder in folders {
        match folder {
            Folder::Inbox => {
                for (at, name, state, reason) in inbox(bucket, config, p, spool, hold)? {
                    seen.rows.push(SpoolEntry {
                        state: Some(state),
                        reason: Some(reason),
                        ..row(Folder::Inbox, &name, at)
                    });
                }
            }
            Folder::Done => {
                for (name, at) in bucket.filed(DONE)? {
                    seen.rows.push(row(Folder::Done, &name, at));
                }
            }
            Folder::Failed => {
                let mut finished = bucket.results(FAILED)?;
                finished.sort_by(|a, b| (a.at, &a.name).cmp(&(b.at, &b.name)));
                for f in finished {
                    let text = |key: &str| {
                        f.result
                            .as_ref()
                            .and_then(|r| r.get(key))
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    };
                    let error = match &f.result {
                        Some(_) => text("error"),
                        None => Some(format!(
                            "no {} that parses in the bucket (being filed or deleted?)",
                            spool::RESULT_FILE
                        )),
                    };
                    let at = f.at.unwrap_or(OffsetDateTime::UNIX_EPOCH);
                    seen.rows.push(SpoolEntry {
                        stage: text("stage"),
                        error,
                        ..row(Folder::Failed, &f.name, at)
                    });
                    seen.failed.push((f.name, f.result));
                }
            }
            Folder::Work => {}
        }
    }
    Ok(seen)
}

/// The inbox of the bucket, in arrival order (the manifest's
/// `Last-Modified`, then the name), each bundle with when it last changed,
/// its state and why it waits (docs/contract.md §13.4, §22.1).
fn inbox(
    bucket: &Bucket,
    config: &Config,
    p: &Pipeline,
    spool: &Spool,
    hold: Option<OffsetDateTime>,
) -> s3::Result<Vec<(OffsetDateTime, String, &'static str, String)>> {
    use spool::Waiting;
    // What holds back the whole pipeline: the hold in the bucket, or the
    // deferral of the holder (known when it is this host).
    let behind = match (hold, queue::deferral(spool.pipeline_folder())) {
        (Some(since), _) => format!(
            "; the pipeline is held since {} (`distributor spool release {}` resumes it)",
            crate::text::wording::human_time(&crate::catalog::format_time(since)),
            p.id
        ),
        (None, Ok(Some(d))) => format!(
            "; waits behind the deferred bundle {} (next try {})",
            d.bundle,
            crate::text::wording::human_time(&d.next_try)
        ),
        _ => String::new(),
    };
    let now = OffsetDateTime::now_utc();
    let mut rows = Vec::new();
    for name in bucket.all_names()? {
        if let Some(why) = bucket.unreachable(&name) {
            rows.push((now, now, name, Waiting::Unreadable.as_str(), why));
            continue;
        }
        let probe = match bucket.probe(&name, &p.limits, spool.signed, Known::default()) {
            Ok(probe) => probe,
            // One bundle's objects the client cannot take, or the server
            // refuses: that row says so, the others are listed.
            Err(e) if crate::intake::unreadable(&e) || crate::intake::refused(&e) => {
                let why = format!("its objects cannot be listed or read ({e})");
                crate::intake::Probe {
                    signature: (Some(now), 0, 0),
                    ..crate::intake::Probe::broken(&name, why)
                }
            }
            Err(e) => return Err(e),
        };
        let Some(last) = probe.signature.0 else {
            continue; // removed since the listing
        };
        // This host's clock against the server's: a skew shifts it.
        let quiet = human_age((now - last).whole_seconds());
        let timeout = format_duration(config.agent.incomplete_timeout);
        // Objects a failure left behind (the server would not copy them
        // beside it) are not a delivery waiting for its manifest.
        let left_behind = match &probe.state {
            State::NoManifest => bucket.left_behind_by(&name, last).unwrap_or_else(|e| {
                log::debug!("{}: cannot read failed/ ({e})", bucket.label());
                None
            }),
            _ => None,
        };
        let (state, mut reason) = match &probe.state {
            State::NoManifest => (
                Waiting::NoManifest,
                match left_behind {
                    Some(filed) => format!(
                        "left behind by its failure, filed as {FAILED}/{}: the server would not copy these objects beside it (the agent's log names them); once you have them elsewhere, delete them with an S3 client (`aws s3 rm --recursive {}/{INBOX}/{}/`)",
                        inert(&filed),
                        bucket.label(),
                        inert(&name)
                    ),
                    None => format!(
                        "no {} yet (its newest object is {quiet} old); a bundle is complete once its {0} is there and every file it lists has its declared size: upload {0} last (docs/producers.md)",
                        crate::bundle::MANIFEST
                    ),
                },
            ),
            State::Incomplete(what) => (
                Waiting::Incomplete,
                format!(
                    "{what}; its newest object is {quiet} old; goes to failed/ after {timeout} without change"
                ),
            ),
            State::Broken(why) => (
                Waiting::Ready,
                format!("fails at the agent's next look: {why}"),
            ),
            State::Complete if hold.is_some() => (
                Waiting::Ready,
                "complete; claimed once the pipeline is released".to_owned(),
            ),
            State::Complete => (
                Waiting::Ready,
                "complete; claimed at the next look of the agent holding the lease".to_owned(),
            ),
        };
        reason.push_str(&behind);
        let arrival = probe.manifest.as_ref().map_or(last, |m| m.1);
        rows.push((arrival, last, name, state.as_str(), reason));
    }
    rows.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
    Ok(rows
        .into_iter()
        .map(|(_, last, name, state, reason)| (last, name, state, reason))
        .collect())
}

/// `spool show` of an intake pipeline: the folder, where the bundle is,
/// and its result (the agent's own: producers upload to the inbox only).
pub(super) fn result(
    p: &Pipeline,
    intake: &Intake,
    name: &str,
) -> Result<(Folder, String, Result<ResultDoc, String>), Error> {
    let unknown = || {
        Error::Usage(format!(
            "no failed or done bundle {:?} in pipeline {}'s intake {}; list them with `distributor spool list --pipeline {}`",
            inert(name),
            p.id,
            url(intake),
            p.id
        ))
    };
    if crate::paths::check_bundle_name(name).is_err() {
        return Err(unknown());
    }
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    let failed = failed(p, intake);
    for (folder, key) in [(Folder::Failed, FAILED), (Folder::Done, DONE)] {
        let at = url_of(intake, key, name);
        if let Some(doc) = bucket.result(key, name).map_err(&failed)? {
            let doc = ResultDoc {
                doc,
                unverified: false,
            };
            return Ok((folder, at, Ok(doc)));
        }
        if bucket
            .objects(key, name, 1)
            .map_err(&failed)?
            .is_none_or(|o| !o.is_empty())
        {
            let why = format!("no {} that parses in {at}", spool::RESULT_FILE);
            return Ok((folder, at, Err(why)));
        }
    }
    Err(unknown())
}

/// The most objects a failed bundle of `p` holds: what the agent copies
/// there (at most `max_files` and a few more) and its result.
fn most_objects(p: &Pipeline) -> usize {
    usize::try_from(p.limits.max_files.saturating_add(17)).unwrap_or(usize::MAX)
}

/// `spool retry P NAME` of an intake pipeline: the failed bundle's objects
/// are copied back into the inbox (its manifest last), then deleted from
/// `failed/`.
pub(super) fn retry(p: &Pipeline, intake: &Intake, name: &str, allow_older: bool) -> Outcome {
    check_name(name, "--failed")?;
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    if allow_older {
        eprintln!(
            "note: --allow-older changes nothing on an intake pipeline: the agent refuses a bundle older than the records it would overwrite there (docs/contract.md §22.3)"
        );
    }
    retry_one(p, intake, &bucket, name)
}

/// The usage error of a name that is no failed bundle.
fn no_failed(p: &Pipeline, intake: &Intake, name: &str) -> Error {
    Error::Usage(format!(
        "no failed bundle {:?} in {}; list them with `distributor spool list --failed --pipeline {}`",
        inert(name),
        url_of(intake, FAILED, ""),
        p.id
    ))
}

fn retry_one(p: &Pipeline, intake: &Intake, bucket: &Bucket, name: &str) -> Outcome {
    let there = bucket.objects(FAILED, name, 1).map_err(failed(p, intake))?;
    if there.is_some_and(|o| o.is_empty()) {
        return Err(no_failed(p, intake, name));
    }
    bucket
        .retry(name, most_objects(p))
        .map_err(|e| Error::Failed(format!("pipeline {}: {}", p.id, inert(&e))))?;
    println!(
        "copied {} back to {}; the agent holding the intake's lease claims it at its next look",
        inert(name),
        inert(&url_of(intake, INBOX, name))
    );
    Ok(())
}

/// `spool retry P --all` of an intake pipeline: every failed bundle, oldest
/// first; one that cannot be sent back is told and the rest go on.
pub(super) fn retry_all(p: &Pipeline, intake: &Intake) -> Outcome {
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    let names = bucket.filed(FAILED).map_err(failed(p, intake))?;
    let (mut moved, mut errors) = (0usize, 0usize);
    for (name, _) in &names {
        match retry_one(p, intake, &bucket, name) {
            Ok(()) => moved += 1,
            Err(e) => {
                errors += 1;
                e.tell();
            }
        }
    }
    println!(
        "{moved} failed bundle{} sent back to the inbox{}",
        if moved == 1 { "" } else { "s" },
        if errors > 0 {
            format!(", {errors} not sent back")
        } else {
            String::new()
        }
    );
    told_unless(errors == 0)
}

/// `spool delete P NAME` of an intake pipeline: every object of
/// `failed/<name>/`, its result last.
pub(super) fn delete(p: &Pipeline, intake: &Intake, name: &str) -> Outcome {
    check_name(name, "--failed")?;
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    let objects = bucket
        .objects(FAILED, name, usize::MAX)
        .map_err(failed(p, intake))?
        .unwrap_or_default();
    let at = url_of(intake, FAILED, name);
    if objects.is_empty() {
        return Err(no_failed(p, intake, name));
    }
    bucket
        .delete_all(FAILED, name, &objects)
        .map_err(failed(p, intake))?;
    println!(
        "removed {} ({} object{}, {} bytes)",
        inert(&at),
        objects.len(),
        if objects.len() == 1 { "" } else { "s" },
        objects.iter().map(|o| o.size).sum::<u64>()
    );
    Ok(())
}

/// `spool hold P` of an intake pipeline: the hold object, which the agent
/// holding the lease reads at each look, on whichever host.
pub(super) fn hold(p: &Pipeline, intake: &Intake) -> Outcome {
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    let failed = failed(p, intake);
    let before = bucket.held(&bucket.controls().map_err(&failed)?);
    bucket.hold().map_err(&failed)?;
    let since = match before {
        Some(t) => Some(t),
        None => bucket.held(&bucket.controls().map_err(&failed)?),
    }
    .map_or_else(|| "now".to_owned(), crate::catalog::format_time);
    if before.is_some() {
        println!("pipeline {}: already held since {since}", p.id);
    } else {
        println!(
            "pipeline {}: held since {since}; the agent holding the intake's lease, on any host, claims nothing more from {} (a bundle in hand finishes) until `distributor spool release {}`",
            p.id,
            url_of(intake, INBOX, ""),
            p.id
        );
    }
    Ok(())
}

/// `spool release P` of an intake pipeline.
pub(super) fn release(p: &Pipeline, intake: &Intake) -> Outcome {
    let bucket = open(p, intake, false).map_err(Error::Failed)?;
    let failed = failed(p, intake);
    let Some(since) = bucket.held(&bucket.controls().map_err(&failed)?) else {
        println!("pipeline {}: not held", p.id);
        return Ok(());
    };
    bucket.release().map_err(&failed)?;
    println!(
        "pipeline {}: released (held since {}); the agent holding the intake's lease claims again at its next look (every {})",
        p.id,
        crate::catalog::format_time(since),
        format_duration(intake.poll_every())
    );
    Ok(())
}

/// `spool flush` of an intake pipeline: asks the agent holding the lease
/// to try its deferred bundle now, through the flush object it takes at
/// each renewal. Only the holder's host knows whether it defers one: from
/// there, "nothing deferred" is said without asking. False (told) when it
/// cannot be asked.
pub(super) fn flush(config: &Config, p: &Pipeline, intake: &Intake) -> bool {
    let asked = (|| {
        let bucket = open(p, intake, false)?;
        let lease = lease::read(&bucket.root).map_err(|e| trouble(p, intake, &e))?;
        let now = OffsetDateTime::now_utc();
        let holder = match lease.map(|(r, _, at)| Lease::judge(r, at, now, intake)) {
            Some(l) if l.serving() => l,
            other => {
                return Err(format!(
                    "pipeline {}: no agent holds the lease of its intake {}{}, so nothing can be flushed; start one with this config on any host (systemctl start distributor), or run `distributor agent --once`",
                    p.id,
                    url(intake),
                    other.map_or_else(String::new, |l| format!(" ({})", l.why_not()))
                ));
            }
        };
        let folder = p.spool_dir(config);
        if holder.is_here(&folder) && matches!(queue::deferral(&folder), Ok(None)) {
            return Ok(format!("pipeline {}: nothing deferred", p.id));
        }
        bucket.flush().map_err(|e| trouble(p, intake, &e))?;
        Ok(format!(
            "pipeline {}: asked the agent holding the intake's lease ({}) to try its deferred bundle now, if it has one; it takes the request within {} (`distributor spool list --pipeline {}` on its host shows how it ends)",
            p.id,
            holder.who(),
            format_duration(intake.renew_every()),
            p.id
        ))
    })();
    match asked {
        Ok(said) => {
            println!("{said}");
            true
        }
        Err(e) => {
            eprintln!("error: {e}");
            false
        }
    }
}

/// The lease of an intake as `status` judges it.
pub(super) struct Lease {
    record: Option<lease::Record>,
    /// When the server stored its last version.
    renewed: OffsetDateTime,
    /// Seconds from then to this host's now (0 when the server's clock is
    /// ahead).
    age: i64,
    state: &'static str,
}

impl Lease {
    /// The lease object's record and `Last-Modified`, at `now`. A lease
    /// not renewed for longer than `lease` lapsed: measured with this
    /// host's clock against the server's, which are not the same clock
    /// (the agents never compare them; see lease.rs). A skew of a few
    /// seconds moves the verdict by as much; the renewal every third of a
    /// lease leaves that much margin.
    fn judge(
        record: Option<lease::Record>,
        renewed: OffsetDateTime,
        now: OffsetDateTime,
        intake: &Intake,
    ) -> Lease {
        let age = (now - renewed).whole_seconds().max(0);
        let lapsed = u64::try_from(age).is_ok_and(|a| a > intake.lease.as_secs());
        let state = match &record {
            Some(r) if r.released => "released",
            _ if lapsed => "lapsed",
            Some(_) => "held",
            None => "unreadable",
        };
        Lease {
            record,
            renewed,
            age,
            state,
        }
    }

    /// Some agent serves the intake: held, or renewed in time by a record
    /// this version cannot read.
    fn serving(&self) -> bool {
        matches!(self.state, "held" | "unreadable")
    }

    /// `host pid N, epoch E`.
    fn who(&self) -> String {
        self.record.as_ref().map_or_else(
            || "a record this version cannot read".to_owned(),
            |r| r.holder(),
        )
    }

    /// Whether the holder is the agent running on this host for the
    /// pipeline spool folder `folder`.
    fn is_here(&self, folder: &std::path::Path) -> bool {
        let agent = presence::read(folder).ok();
        self.record.as_ref().is_some_and(|r| {
            r.host == lease::host_name() && agent.is_some_and(|a| a.running && a.pid == Some(r.pid))
        })
    }

    /// Why no agent holds it.
    fn why_not(&self) -> String {
        match self.state {
            "released" => format!("{} gave it up at a clean stop", self.who()),
            "lapsed" => format!(
                "{} last renewed it {} ago, longer than the lease",
                self.who(),
                human_age(self.age)
            ),
            _ => format!("held by {}", self.who()),
        }
    }

    fn to_json(&self) -> Value {
        let r = self.record.as_ref();
        json!({
            "state": self.state,
            "host": r.map(|r| &r.host),
            "pid": r.map(|r| r.pid),
            "epoch": r.map(|r| r.epoch),
            "renewals": r.map(|r| r.renewals),
            "renewed": crate::catalog::format_time(self.renewed),
            "renewed_ago_seconds": self.age,
        })
    }
}

/// What `status` shows of an intake pipeline beside its local `work/`:
/// the rows of its inbox, `done/` and `failed/`, the hold, and the
/// document of its `intake` key; its problems are added to `problems`.
pub(super) struct Status {
    pub rows: Vec<SpoolEntry>,
    pub hold: Option<queue::Hold>,
    pub failed: Vec<(String, Option<Value>)>,
    pub doc: Value,
    /// The bucket could not be read: why, naming it and the fix.
    pub error: Option<String>,
}

/// Looks at the intake of `p` for `status`: each request tried once, and
/// the first that fails ends the look (a dead endpoint holds `status` for
/// one connection attempt).
pub(super) fn status(
    config: &Config,
    p: &Pipeline,
    intake: &Intake,
    now: OffsetDateTime,
    problems: &mut Vec<String>,
) -> Status {
    let spool = Spool::of(config, p);
    let mut doc = json!({
        "bucket": url(intake),
        "endpoint": intake.location.endpoint,
        "lease_seconds": intake.lease.as_secs(),
        "lease": null,
        "error": null,
    });
    let folders = vec![Folder::Inbox, Folder::Done, Folder::Failed];
    let seen = open(p, intake, true).and_then(|bucket| {
        look(&bucket, config, p, &spool, folders, true).map_err(|e| trouble(p, intake, &e))
    });
    let seen = match seen {
        Ok(seen) => seen,
        Err(e) => {
            problems.push(e.clone());
            doc["error"] = e.clone().into();
            return Status {
                rows: Vec::new(),
                hold: None,
                failed: Vec::new(),
                doc,
                error: Some(e),
            };
        }
    };
    let lease = seen
        .lease
        .map(|(record, at)| Lease::judge(record, at, now, intake));
    if let Some(l) = &lease {
        doc["lease"] = l.to_json();
    }
    if !lease.as_ref().is_some_and(Lease::serving) {
        problems.push(format!(
            "pipeline {}: no agent holds the lease of its intake {} ({}); start one with this config on any host (systemctl start distributor)",
            p.id,
            url(intake),
            lease
                .as_ref()
                .map_or_else(|| "no agent ever took it".to_owned(), Lease::why_not)
        ));
    }
    Status {
        rows: seen.rows,
        hold: seen.hold.map(|t| queue::Hold {
            since: crate::catalog::format_time(t),
        }),
        failed: seen.failed,
        doc,
        error: None,
    }
}

/// Where status names a bundle of folder `folder` of an intake.
pub(super) fn place(intake: &Intake, folder: Folder, name: &str) -> String {
    let key = match folder {
        Folder::Inbox => INBOX,
        Folder::Done => DONE,
        _ => FAILED,
    };
    url_of(intake, key, name)
}

/// The lines `status` prints about an intake: the bucket and who holds
/// its lease.
pub(super) fn print_status(p: &Value) {
    let i = &p["intake"];
    let bucket = i["bucket"].as_str().unwrap_or_default();
    if i["error"].is_string() {
        println!("  intake {bucket}: cannot be read (the error says why)");
        return;
    }
    let l = &i["lease"];
    let who = format!(
        "{} pid {}, epoch {}",
        inert(l["host"].as_str().unwrap_or("?")),
        l["pid"],
        l["epoch"]
    );
    let ago = human_age(l["renewed_ago_seconds"].as_i64().unwrap_or(0));
    let lease = format_duration(std::time::Duration::from_secs(
        i["lease_seconds"].as_u64().unwrap_or(0),
    ));
    let holder = match l["state"].as_str() {
        None => "no agent holds its lease (none ever took it)".to_owned(),
        Some("held") => format!("held by {who}, renewed {ago} ago (lease {lease})"),
        Some("unreadable") => format!(
            "held (a lease record this version cannot read), renewed {ago} ago (lease {lease})"
        ),
        Some("released") => format!("no agent holds its lease ({who} gave it up at a clean stop)"),
        Some(_) => format!(
            "no agent holds its lease ({who} last renewed it {ago} ago, longer than the lease {lease}; a standby takes over)"
        ),
    };
    println!("  intake {bucket}: {holder}");
}

/// The `intake` of `p` for `config check --json`, or null.
pub(super) fn config_json(p: &Pipeline) -> Value {
    p.intake.as_ref().map_or(Value::Null, |i| {
        json!({
            "backend": "s3",
            "bucket": i.location.bucket,
            "path": i.location.path,
            "endpoint": i.location.endpoint,
            "region": i.location.region,
            "lease": format_duration(i.lease),
        })
    })
}
