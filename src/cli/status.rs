//! `distributor status [--json] [--check]`: one screen per pipeline (is an
//! agent serving it, last success and failure, spool counts, catalogs), and
//! with `--check` a monitoring verdict (docs/contract.md §14.1).
//!
//! Last success and last failure are the newest entries of `done/` and
//! `failed/` (their time is when the agent filed them there): nothing else
//! records them, so a success whose `done/` entry expired after
//! `done_retention` no longer shows, and a failed bundle retried or deleted
//! no longer counts as the last failure.
//!
//! An intake pipeline's inbox, `done/`, `failed/`, hold and lease are read
//! from its bucket (super::intake), each request tried once.

use super::output::{human_age, human_time};
use super::{Outcome, access, config_for_reading, told_unless};
use crate::agent::presence;
use crate::config::{Config, Pipeline};
use crate::spool::{self, Folder, Spool, SpoolEntry};
use crate::text::escape::inert;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use time::OffsetDateTime;

pub(super) fn status(flag: Option<&Path>, json: bool, check: bool) -> Outcome {
    let config = config_for_reading(flag)?;
    let now = OffsetDateTime::now_utc();
    let mut pipelines = Vec::new();
    let mut problems = Vec::new();
    let mut errors = Vec::new();
    for p in &config.pipelines {
        match pipeline_status(&config, p, now, &mut problems) {
            Ok(doc) => {
                // An intake that cannot be read, told like a spool that
                // cannot be (the rest of the pipeline is still shown).
                if let Some(e) = doc["intake"]["error"].as_str() {
                    errors.push(e.to_owned());
                }
                pipelines.push(doc);
            }
            Err(e) => {
                problems.push(format!("pipeline {}: {e}", p.id));
                errors.push(e);
            }
        }
    }
    // A reload the running agent refused: it serves the config it had
    // (a record an agent that is gone left says nothing any more).
    let serving = pipelines.iter().any(|p| p["agent"]["running"] == true);
    let refused = crate::config::in_force::refused(&config.spool).filter(|_| serving);
    if let Some(r) = &refused {
        problems.insert(
            0,
            format!(
                "the agent refused a reload at {} and serves the config it had: {}; fix the file, then reload it (SIGHUP)",
                r.at,
                inert(&r.error)
            ),
        );
        if !json && !check {
            println!(
                "config reload refused at {}: {} (the agent serves the config it had)",
                human_time(&r.at),
                inert(&r.error)
            );
        }
    }
    if check {
        return report_check(&config, &problems, json);
    }
    // Told here, one per pipeline, before the rest of the output.
    for e in &errors {
        eprintln!("error: {e}");
    }
    let outcome = told_unless(errors.is_empty());
    if json {
        // The agent's refused reload, told with every pipeline it serves.
        let refused = refused.map(|r| json!({"at": r.at, "error": r.error}));
        for p in &mut pipelines {
            if let Some(doc) = p.as_object_mut() {
                doc.insert("reload_refused".to_owned(), refused.clone().into());
            }
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&pipelines).unwrap_or_default()
        );
        return outcome;
    }
    if pipelines.is_empty() && errors.is_empty() {
        println!("no pipelines in {}", config.file.display());
    }
    for p in &pipelines {
        print_text(p, now);
    }
    outcome
}

/// `--check`: one line per problem, exit 1 if any.
fn report_check(config: &Config, problems: &[String], json: bool) -> Outcome {
    if json {
        let doc = json!({"ok": problems.is_empty(), "problems": problems});
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else if problems.is_empty() {
        println!(
            "ok: {} pipeline(s) served, none held, no deferred or failed bundle, nothing stuck in an inbox",
            config.pipelines.len()
        );
    } else {
        for problem in problems {
            println!("{problem}");
        }
    }
    told_unless(problems.is_empty())
}

/// The JSON document of one pipeline; adds what `--check` objects to to
/// `problems`. Errs when the spool cannot be read, saying how to fix it.
fn pipeline_status(
    config: &Config,
    p: &Pipeline,
    now: OffsetDateTime,
    problems: &mut Vec<String>,
) -> Result<Value, String> {
    let spool = Spool::of(config, p);
    // An intake pipeline's inbox, done/ and failed/ are in its bucket, and
    // its work/ is this host's (docs/contract.md §22.4).
    let folders: &[Folder] = match p.intake {
        Some(_) => &[Folder::Work],
        None => &[Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed],
    };
    let mut rows = match spool::list(&spool, folders) {
        Ok(rows) => rows,
        Err(e) => match producers_inbox(&spool, &e) {
            Some(inbox) => return Ok(producer_status(p, &spool, &inbox, now, problems)),
            None => return Err(unreadable(&spool, folders, &e)),
        },
    };
    let bucket = p
        .intake
        .as_ref()
        .map(|i| super::intake::status(config, p, i, now, problems));
    if let Some(b) = &bucket {
        rows.extend(b.rows.iter().cloned());
    }
    // Where a bundle of a folder is, for the problems.
    let place = |f: Folder, name: &str| match &p.intake {
        Some(i) => super::intake::place(i, f, name),
        None if name.is_empty() => spool.folder(f).display().to_string(),
        None => spool.folder(f).join(name).display().to_string(),
    };
    let pipeline_dir = p.spool_dir(config);
    let agent = presence::read(&pipeline_dir).map_err(|e| {
        let lock = presence::lock_path(&pipeline_dir);
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                "cannot open {}: {e}; {}",
                lock.display(),
                access::read_fix(&lock)
            )
        } else {
            format!("cannot open {}: {e}", lock.display())
        }
    })?;
    let in_folder = |f: Folder| rows.iter().filter(move |r| r.spool == f.as_str());
    let count = |f: Folder| in_folder(f).count();
    let oldest_waiting = in_folder(Folder::Inbox).next().map(|r| r.modified.clone());
    // Per inbox state (docs/contract.md §13.4): how many, and the oldest with its reason.
    let inbox_states = inbox_states(in_folder(Folder::Inbox));
    // What done/ retention could not remove, as the agent recorded it, of
    // what is still there.
    let record = spool::retention_record(&spool);
    let stuck: Vec<&spool::Undeletable> = record
        .entries
        .iter()
        .filter(|u| in_folder(Folder::Done).any(|r| r.name == u.name))
        .collect();
    let stuck_count = record.count - (record.entries.len() - stuck.len());
    let last_failure = in_folder(Folder::Failed).next_back();
    let last_success = in_folder(Folder::Done).next_back();

    // An intake is served by whichever agent holds its lease (its
    // problem, when none does, is told with the bucket's).
    if !agent.running && bucket.is_none() {
        problems.push(format!(
            "pipeline {}: no agent serves it (start it: systemctl start distributor)",
            p.id
        ));
    }
    let failed = count(Folder::Failed);
    if failed > 0 {
        problems.push(format!(
            "pipeline {}: {failed} bundle(s) in {} (newest: {}); see `distributor spool list --failed --pipeline {}`",
            p.id,
            place(Folder::Failed, ""),
            inert(last_failure.map_or("", |r| r.name.as_str())),
            p.id
        ));
    }
    if stuck_count > 0 {
        problems.push(format!(
            "pipeline {}: {stuck_count} done/ entr{} past done_retention cannot be removed (first: {}); {RETENTION_FIX}",
            p.id,
            if stuck_count == 1 { "y" } else { "ies" },
            inert(stuck.first().map_or("", |u| u.name.as_str()))
        ));
    }
    let deferred: Vec<&spool::queue::Deferral> = in_folder(Folder::Work)
        .filter_map(|r| r.deferred.as_ref())
        .collect();
    for d in &deferred {
        problems.push(format!(
            "pipeline {}: {} is deferred: {}; `distributor spool flush {}` tries it now",
            p.id,
            inert(&d.bundle),
            d.summary(),
            p.id
        ));
    }
    // Published (or failed) by an earlier run but not movable out of
    // work/: the agent does not publish them again, and only a person can
    // let them go (docs/troubleshooting.md).
    let unfiled = match spool::unfiled(&spool) {
        Ok(unfiled) => unfiled,
        // A host where no agent served the intake yet has no work/.
        Err(_) if p.intake.is_some() && !spool.work.exists() => Default::default(),
        Err(e) => {
            problems.push(format!(
                "pipeline {}: cannot read {} ({e}); the agent sets a damaged one aside at its next publication. Until then a crash could publish bundles it names again",
                p.id,
                spool.work.join(spool::UNFILED_FILE).display()
            ));
            Default::default()
        }
    };
    if spool.work.join(spool::UNFILED_DAMAGED).exists() {
        problems.push(format!(
            "pipeline {}: the agent set a damaged record aside as {}; read it for the bundles it named (they may have been published again one by one), then delete it",
            p.id,
            spool.work.join(spool::UNFILED_DAMAGED).display()
        ));
    }
    for r in in_folder(Folder::Work) {
        let record = unfiled
            .get(&r.name)
            .filter(|u| !u.pending && u.is(&spool.work.join(&r.name)));
        if let Some(&spool::Unfiled { published, .. }) = record {
            problems.push(format!(
                "pipeline {}: {} was {} but cannot be moved out of work/ (its folder is not writable for the agent?); it is not published again: make the folder writable by the agent, or move it by hand to {}",
                p.id,
                inert(&spool.work.join(&r.name).display().to_string()),
                if published { "published" } else { "failed" },
                spool.folder(spool.filed_in(published)).display()
            ));
        }
    }
    let hold = match &bucket {
        Some(b) => b.hold.clone(),
        None => spool::queue::hold(spool.pipeline_folder())
            .map_err(|e| format!("cannot read the hold of pipeline {}: {e}", p.id))?,
    };
    if let Some(h) = &hold {
        problems.push(format!(
            "pipeline {}: held since {} (nothing new is claimed); `distributor spool release {}` resumes it",
            p.id, h.since, p.id
        ));
    }
    let signature_refusals = match (&p.signatures, &bucket) {
        (None, _) => BTreeMap::new(),
        (Some(_), Some(b)) => count_refusals(b.failed.iter().filter_map(|(_, doc)| doc.as_ref())),
        (Some(_), None) => signature_refusals(&spool, in_folder(Folder::Failed)),
    };
    let limit = config.agent.incomplete_timeout;
    for r in in_folder(Folder::Inbox) {
        let age = age_seconds(&r.modified, now);
        if age.is_some_and(|a| u64::try_from(a).is_ok_and(|a| a > limit.as_secs())) {
            problems.push(format!(
                "pipeline {}: {} has waited in the inbox for {} (longer than agent.incomplete_timeout {}); see `distributor spool list --inbox --pipeline {}`",
                p.id,
                inert(&place(Folder::Inbox, &r.name)),
                human_age(age.unwrap_or(0)),
                crate::config::format_duration(limit),
                p.id
            ));
        }
    }

    let mut doc = json!({
        "pipeline_id": p.id,
        "agent": agent,
        "inbox": count(Folder::Inbox),
        "work": count(Folder::Work),
        "done": count(Folder::Done),
        "failed": failed,
        "oldest_waiting": oldest_waiting,
        "inbox_states": inbox_states,
        // The bundles claimed and not filed yet: the agent's work in hand.
        "in_hand": in_folder(Folder::Work)
            .map(|r| json!({"name": r.name, "since": r.modified}))
            .collect::<Vec<_>>(),
        // docs/contract.md §18.3 and §18.5.
        "deferred": deferred.iter().map(|d| json!({
            "name": d.bundle,
            "attempts": d.attempts,
            "since": d.since,
            "stage": d.stage,
            "last_error": d.last_error,
            "next_try": d.next_try,
        })).collect::<Vec<_>>(),
        "hold": hold,
        "last_success": last_success.map(|r| json!({"name": r.name, "modified": r.modified})),
        "last_failure": last_failure.map(failure_json),
        "retention_blocked": {
            "count": stuck_count,
            "entries": stuck,
            "fix": (stuck_count > 0).then_some(RETENTION_FIX),
        },
        "destinations": p.destinations.iter().map(|d| destination_json(&p.id, d)).collect::<Vec<_>>(),
        "signature_refusals": signature_refusals,
    });
    if let Some(b) = bucket {
        if b.error.is_some() {
            // Not known: the bucket did not answer.
            for key in ["inbox", "done", "failed"] {
                doc[key] = Value::Null;
            }
        }
        doc["intake"] = b.doc;
    }
    Ok(doc)
}

/// The inbox as its producer sees it, when the one asking is a producer
/// of the pipeline: the agent's own folders are closed to them
/// (docs/security.md), its inbox is open.
fn producers_inbox(spool: &Spool, e: &std::io::Error) -> Option<Vec<SpoolEntry>> {
    if e.kind() != std::io::ErrorKind::PermissionDenied
        || !access::can_write(&spool.inbox).unwrap_or(false)
    {
        return None;
    }
    spool::list(spool, &[Folder::Inbox]).ok()
}

/// What a producer may see of its pipeline: its inbox, each entry with
/// why it waits, and where to turn for the rest (docs/security.md: the
/// agent's folders are not theirs to read, nor is group `distributor`).
fn producer_status(
    p: &Pipeline,
    spool: &Spool,
    rows: &[SpoolEntry],
    now: OffsetDateTime,
    problems: &mut Vec<String>,
) -> Value {
    let note = format!(
        "you can drop bundles into {} but not read the agent's folders (work/, done/, failed/), as docs/security.md sets producers up: what became of a bundle is for an operator to see (`distributor status`, `distributor spool show {} NAME`)",
        spool.inbox.display(),
        p.id
    );
    problems.push(format!("pipeline {}: {note}", p.id));
    let inbox: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "state": r.state,
                "reason": r.reason,
                "since": r.modified,
                "age_seconds": age_seconds(&r.modified, now),
            })
        })
        .collect();
    json!({
        "pipeline_id": p.id,
        "view": "producer",
        "inbox": rows.len(),
        "inbox_entries": inbox,
        "note": note,
    })
}

/// What to do about `done/` entries retention cannot remove.
const RETENTION_FIX: &str = "the agent may not write into folders their producer owns: the producer or root must remove them (docs/troubleshooting.md), and producers should hand over group-writable bundles as docs/install.md sets up";

fn failure_json(r: &SpoolEntry) -> Value {
    json!({"name": r.name, "modified": r.modified, "stage": r.stage, "error": r.error})
}

/// Why a spool could not be listed, naming the folder and the fix.
fn unreadable(spool: &Spool, folders: &[Folder], e: &std::io::Error) -> String {
    let blocked = folders
        .iter()
        .map(|&f| spool.folder(f))
        .find(|dir| matches!(access::can_read(dir), Ok(false)));
    match blocked {
        Some(dir) if e.kind() == std::io::ErrorKind::PermissionDenied => format!(
            "cannot list {}: {e}; {}",
            dir.display(),
            access::read_fix(dir)
        ),
        Some(dir) => format!("cannot list {}: {e}", dir.display()),
        None => format!(
            "cannot list the spool of pipeline {}: {e}",
            spool.pipeline_id
        ),
    }
}

/// A destination's root as `status` shows it: its catalog's state, how
/// many outputs the root records (`outputs`) and how many of them are this
/// destination's own (`owned`: a root may be shared by several pipelines).
fn destination_json(pipeline_id: &str, d: &crate::config::Destination) -> Value {
    use crate::catalog::State;
    let state = crate::publish::peek_state(d);
    let owned = match &state {
        Ok(Some(State::Catalog(c))) => Some(
            c.outputs
                .iter()
                .filter(|r| r.owned_by(pipeline_id, &d.id))
                .count(),
        ),
        _ => None,
    };
    let (state_text, outputs) = match &state {
        Err(e) => (format!("catalog unreadable: {e}"), None),
        Ok(None) | Ok(Some(State::Absent)) => ("no catalog".to_owned(), None),
        Ok(Some(State::Catalog(c))) => ("catalog".to_owned(), Some(c.outputs.len())),
        Ok(Some(State::Legacy { schema_version })) => {
            (format!("legacy (schema {schema_version})"), None)
        }
        Ok(Some(State::Future { schema_version })) => {
            (format!("future (schema {schema_version})"), None)
        }
        Ok(Some(State::Invalid { .. })) => ("invalid".to_owned(), None),
    };
    json!({
        "destination_id": d.id,
        "root": d.root_label(),
        "workflow": d.workflow.as_str(),
        "state": state_text,
        "outputs": outputs,
        "owned": owned,
    })
}

fn age_seconds(time: &str, now: OffsetDateTime) -> Option<i64> {
    crate::catalog::parse_time(time)
        .ok()
        .map(|t| (now - t).whole_seconds())
}

fn print_text(p: &Value, now: OffsetDateTime) {
    if p["view"] == "producer" {
        print_producer_view(p);
        return;
    }
    let age = |t: &Value| {
        t.as_str()
            .and_then(|t| age_seconds(t, now))
            .map(human_age)
            .unwrap_or_default()
    };
    // An intake's counts are unknown when its bucket did not answer.
    let count = |key: &str| match &p[key] {
        Value::Null => "?".to_owned(),
        n => n.to_string(),
    };
    println!(
        "pipeline {}: inbox {}  work {}  done {}  failed {}",
        p["pipeline_id"].as_str().unwrap_or_default(),
        count("inbox"),
        count("work"),
        count("done"),
        count("failed")
    );
    // An intake is served by the agent holding its lease, on any host.
    let intake = p["intake"].is_object();
    if intake {
        super::intake::print_status(p);
    }
    let label = if intake {
        "agent on this host"
    } else {
        "agent"
    };
    let agent = &p["agent"];
    if agent["running"].as_bool() == Some(true) && intake {
        println!(
            "  {label}: running (pid {})",
            agent["pid"].as_u64().unwrap_or_default()
        );
    } else if agent["running"].as_bool() == Some(true) {
        let pid = agent["pid"]
            .as_u64()
            .map_or_else(|| "unknown pid".to_owned(), |n| format!("pid {n}"));
        let since = agent["since"]
            .as_str()
            .map(|s| format!(", since {} ({} ago)", human_time(s), age(&agent["since"])))
            .unwrap_or_default();
        println!("  agent: serving ({pid}{since})");
    } else {
        println!("  {label}: none serving this pipeline");
    }
    match p["last_success"].as_object() {
        Some(s) => println!(
            "  last success: {} ({} ago)",
            inert(s["name"].as_str().unwrap_or_default()),
            age(&s["modified"])
        ),
        None => println!("  last success: none in done/"),
    }
    if !p["oldest_waiting"].is_null() {
        println!("  oldest waiting bundle: {} ago", age(&p["oldest_waiting"]));
    }
    for b in p["in_hand"].as_array().into_iter().flatten() {
        println!(
            "  in hand: {} (its folder in work/ last changed {} ago)",
            inert(b["name"].as_str().unwrap_or_default()),
            age(&b["since"])
        );
    }
    if let Some(h) = p["hold"].as_object() {
        println!(
            "  held since {} ({} ago): nothing new is claimed; `distributor spool release {}` resumes it",
            human_time(h["since"].as_str().unwrap_or_default()),
            age(&h["since"]),
            p["pipeline_id"].as_str().unwrap_or_default()
        );
    }
    for d in p["deferred"].as_array().into_iter().flatten() {
        println!(
            "  deferred: {} ({} attempt(s) since {}, {} ago; next try {}) [{}] {}",
            inert(d["name"].as_str().unwrap_or_default()),
            d["attempts"],
            human_time(d["since"].as_str().unwrap_or_default()),
            age(&d["since"]),
            human_time(d["next_try"].as_str().unwrap_or_default()),
            inert(d["stage"].as_str().unwrap_or("?")),
            inert(d["last_error"].as_str().unwrap_or_default())
        );
    }
    if let Some(states) = p["inbox_states"].as_object() {
        for (state, s) in states {
            let oldest = &s["oldest"];
            println!(
                "  inbox {state}: {} (oldest {}, {} ago: {})",
                s["count"],
                inert(oldest["name"].as_str().unwrap_or_default()),
                age(&oldest["since"]),
                inert(oldest["reason"].as_str().unwrap_or_default())
            );
        }
    }
    if let Some(refusals) = p["signature_refusals"].as_object()
        && !refusals.is_empty()
    {
        let counts: Vec<String> = refusals
            .iter()
            .map(|(reason, n)| format!("{n} {}", reason.replace('_', " ")))
            .collect();
        println!(
            "  refused for their signature (in failed/): {}",
            counts.join(", ")
        );
    }
    print_retention_blocked(&p["retention_blocked"]);
    if let Some(f) = p["last_failure"].as_object() {
        println!(
            "  last failure: {} ({} ago) [{}] {}",
            inert(f["name"].as_str().unwrap_or_default()),
            age(&f["modified"]),
            inert(f["stage"].as_str().unwrap_or("?")),
            inert(f["error"].as_str().unwrap_or_default())
        );
    }
    for d in p["destinations"].as_array().into_iter().flatten() {
        let plural = |n: u64| if n == 1 { "" } else { "s" };
        let outputs = match (d["owned"].as_u64(), d["outputs"].as_u64()) {
            (Some(own), Some(all)) if own != all => {
                format!(
                    ", {own} output{} of its own ({all} in the root)",
                    plural(own)
                )
            }
            (_, Some(all)) => format!(", {all} output{}", plural(all)),
            _ => String::new(),
        };
        println!(
            "  destination {} ({}) {}: {}{outputs}",
            d["destination_id"].as_str().unwrap_or_default(),
            d["workflow"].as_str().unwrap_or_default(),
            d["root"].as_str().unwrap_or_default(),
            d["state"].as_str().unwrap_or_default(),
        );
    }
}

/// What a producer sees of its pipeline: its inbox (docs/security.md).
fn print_producer_view(p: &Value) {
    println!(
        "pipeline {}: inbox {}",
        p["pipeline_id"].as_str().unwrap_or_default(),
        p["inbox"]
    );
    for e in p["inbox_entries"].as_array().into_iter().flatten() {
        println!(
            "  {} ({} ago): {}: {}",
            inert(e["name"].as_str().unwrap_or_default()),
            human_age(e["age_seconds"].as_i64().unwrap_or(0)),
            e["state"].as_str().unwrap_or_default(),
            inert(e["reason"].as_str().unwrap_or_default())
        );
    }
    println!("  note: {}", p["note"].as_str().unwrap_or_default());
}

/// The `done/` entries retention could not remove, if any.
fn print_retention_blocked(blocked: &Value) {
    if blocked["count"].as_u64().unwrap_or(0) > 0 {
        let names: Vec<String> = blocked["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| {
                let owner = u["owner_uid"]
                    .as_u64()
                    .map(|uid| {
                        format!(
                            ", its folder belongs to uid {uid} ({})",
                            u["owner"].as_str().unwrap_or_default()
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{}: done/{}: {}{owner}",
                    inert(u["name"].as_str().unwrap_or_default()),
                    inert(u["path"].as_str().unwrap_or_default()),
                    inert(u["error"].as_str().unwrap_or_default())
                )
            })
            .collect();
        let more = blocked["count"].as_u64().unwrap_or(0) as usize;
        let shown = names.len().min(10);
        let rest = if more > shown {
            format!("; and {} more", more - shown)
        } else {
            String::new()
        };
        println!(
            "  done/ entries retention cannot remove: {} ({}{rest}); {}",
            blocked["count"],
            names[..shown].join("; "),
            blocked["fix"].as_str().unwrap_or_default()
        );
    }
}

/// Bundles refused for their signature, by reason, among those still in
/// failed/ (docs/contract.md §17.4), from the agent's own kept results.
fn signature_refusals<'r>(
    spool: &Spool,
    failed: impl Iterator<Item = &'r SpoolEntry>,
) -> BTreeMap<String, u64> {
    let kept: Vec<Value> = failed
        .filter_map(|r| spool::read_result(spool, Folder::Failed, &r.name).ok())
        .filter(|result| !result.unverified)
        .map(|result| result.doc)
        .collect();
    count_refusals(kept.iter())
}

/// Results refused for their signature, by reason.
fn count_refusals<'d>(results: impl Iterator<Item = &'d Value>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for doc in results {
        if let Some(reason) = doc["signature_refused"].as_str()
            && crate::signature::Reason::parse(reason).is_some()
        {
            *counts.entry(reason.to_owned()).or_default() += 1;
        }
    }
    counts
}

/// How many inbox entries wait in each state, and the oldest of each with
/// its reason (docs/contract.md §13.4).
fn inbox_states<'r>(
    inbox: impl Iterator<Item = &'r SpoolEntry> + Clone,
) -> serde_json::Map<String, Value> {
    let mut inbox_states = serde_json::Map::new();
    for state in spool::Waiting::ALL {
        let mut rows = inbox.clone().filter(|r| r.state == Some(state.as_str()));
        if let Some(oldest) = rows.next() {
            inbox_states.insert(
                state.as_str().to_owned(),
                json!({
                    "count": 1 + rows.count(),
                    "oldest": {"name": oldest.name, "since": oldest.modified, "reason": oldest.reason},
                }),
            );
        }
    }
    inbox_states
}
