//! The spool commands: `spool list`, `spool retry`, and `status` (one
//! screen per pipeline: spool counts, waiting and failed bundles, catalogs).

use super::output::human_age;
use super::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE, config_or_usage};
use crate::inert::inert;
use crate::spool::{self, Folder, Spool};
use std::path::Path;

pub(super) fn spool_list(
    flag: Option<&Path>,
    pipeline: Option<&str>,
    folders: &[Folder],
    json: bool,
) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(id) = pipeline
        && config.pipeline(id).is_none()
    {
        eprintln!("error: no pipeline {id:?} in {}", config.file.display());
        return EXIT_USAGE;
    }
    let mut rows = Vec::new();
    for p in config
        .pipelines
        .iter()
        .filter(|p| pipeline.is_none_or(|id| id == p.id))
    {
        match spool::list(&Spool::of(&config, p), folders) {
            Ok(r) => rows.extend(r),
            Err(e) => {
                eprintln!("error: cannot list the spool of pipeline {}: {e}", p.id);
                return EXIT_FAILURE;
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return EXIT_OK;
    }
    if rows.is_empty() {
        println!("no bundles");
    }
    let now = time::OffsetDateTime::now_utc();
    for r in &rows {
        let age = crate::catalog::parse_time(&r.modified)
            .map(|t| human_age((now - t).whole_seconds()))
            .unwrap_or_default();
        // Names are inert already; stage, error and reason come from files
        // a producer can write, so they are made inert here.
        let mut line = format!(
            "{:<8} {:<20} {:<40} {age:>6} ago",
            r.spool, r.pipeline_id, r.name
        );
        if let (Some(state), Some(reason)) = (r.state, &r.reason) {
            line.push_str(&format!("  {state}: {}", inert(reason)));
        }
        if let (Some(stage), Some(error)) = (&r.stage, &r.error) {
            line.push_str(&format!("  [{}] {}", inert(stage), inert(error)));
        } else if let Some(error) = &r.error {
            line.push_str(&format!("  {}", inert(error)));
        }
        println!("{line}");
    }
    EXIT_OK
}

pub(super) fn spool_retry(flag: Option<&Path>, pipeline: &str, name: &str) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(p) = config.pipeline(pipeline) else {
        eprintln!(
            "error: no pipeline {pipeline:?} in {}",
            config.file.display()
        );
        return EXIT_USAGE;
    };
    match spool::retry(&Spool::of(&config, p), name) {
        Ok(to) => {
            println!(
                "moved {} back to {}",
                inert(name),
                inert(&to.display().to_string())
            );
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {}", inert(&e.to_string()));
            if e.kind() == std::io::ErrorKind::InvalidInput
                || e.kind() == std::io::ErrorKind::NotFound
            {
                EXIT_USAGE
            } else {
                EXIT_FAILURE
            }
        }
    }
}

pub(super) fn status(flag: Option<&Path>, json: bool) -> u8 {
    let config = match config_or_usage(flag) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let now = time::OffsetDateTime::now_utc();
    let mut pipelines = Vec::new();
    for p in &config.pipelines {
        let spool = Spool::of(&config, p);
        let rows = match spool::list(
            &spool,
            &[Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed],
        ) {
            Ok(rows) => rows,
            Err(e) => {
                eprintln!("error: cannot list the spool of pipeline {}: {e}", p.id);
                return EXIT_FAILURE;
            }
        };
        let count = |folder: Folder| rows.iter().filter(|r| r.spool == folder.as_str()).count();
        let oldest_waiting = rows
            .iter()
            .find(|r| r.spool == "inbox")
            .map(|r| r.modified.clone());
        let last_failure = rows.iter().rfind(|r| r.spool == "failed");
        let destinations: Vec<serde_json::Value> = p
            .destinations
            .iter()
            .map(|d| {
                let state = std::fs::read(d.root.join(crate::catalog::STATE_FILE))
                    .ok()
                    .map(|b| crate::catalog::State::parse(&b));
                let (state_text, outputs) = match &state {
                    None => ("no catalog".to_owned(), None),
                    Some(crate::catalog::State::Catalog(c)) => {
                        ("catalog".to_owned(), Some(c.outputs.len()))
                    }
                    Some(crate::catalog::State::Legacy { schema_version }) => {
                        (format!("legacy (schema {schema_version})"), None)
                    }
                    Some(crate::catalog::State::Future { schema_version }) => {
                        (format!("future (schema {schema_version})"), None)
                    }
                    Some(crate::catalog::State::Invalid { .. }) => ("invalid".to_owned(), None),
                    Some(crate::catalog::State::Absent) => ("no catalog".to_owned(), None),
                };
                serde_json::json!({
                    "destination_id": d.id,
                    "root": d.root.display().to_string(),
                    "workflow": d.workflow.as_str(),
                    "state": state_text,
                    "outputs": outputs,
                })
            })
            .collect();
        pipelines.push(serde_json::json!({
            "pipeline_id": p.id,
            "inbox": count(Folder::Inbox),
            "work": count(Folder::Work),
            "done": count(Folder::Done),
            "failed": count(Folder::Failed),
            "oldest_waiting": oldest_waiting,
            "last_failure": last_failure.map(|r| serde_json::json!({
                "name": r.name, "modified": r.modified, "stage": r.stage, "error": r.error,
            })),
            "destinations": destinations,
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&pipelines).unwrap_or_default()
        );
        return EXIT_OK;
    }
    if pipelines.is_empty() {
        println!("no pipelines in {}", config.file.display());
    }
    let age = |t: &serde_json::Value| {
        t.as_str()
            .and_then(|t| crate::catalog::parse_time(t).ok())
            .map(|t| human_age((now - t).whole_seconds()))
            .unwrap_or_default()
    };
    for p in &pipelines {
        println!(
            "pipeline {}: inbox {}  work {}  done {}  failed {}",
            p["pipeline_id"].as_str().unwrap_or_default(),
            p["inbox"],
            p["work"],
            p["done"],
            p["failed"]
        );
        if !p["oldest_waiting"].is_null() {
            println!("  oldest waiting bundle: {} ago", age(&p["oldest_waiting"]));
        }
        if let Some(f) = p["last_failure"].as_object() {
            println!(
                "  last failure: {} ({} ago) [{}] {}",
                f["name"].as_str().unwrap_or_default(),
                age(&f["modified"]),
                f["stage"].as_str().unwrap_or("?"),
                f["error"].as_str().unwrap_or_default()
            );
        }
        for d in p["destinations"].as_array().into_iter().flatten() {
            let outputs = d["outputs"]
                .as_u64()
                .map(|n| format!(", {n} outputs"))
                .unwrap_or_default();
            println!(
                "  destination {} ({}) {}: {}{outputs}",
                d["destination_id"].as_str().unwrap_or_default(),
                d["workflow"].as_str().unwrap_or_default(),
                d["root"].as_str().unwrap_or_default(),
                d["state"].as_str().unwrap_or_default(),
            );
        }
    }
    EXIT_OK
}
