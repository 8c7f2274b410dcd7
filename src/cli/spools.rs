//! The spool commands: `spool list` and `spool retry`.

use super::output::human_age;
use super::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE, config_for_reading, config_or_usage};
use crate::inert::inert;
use crate::process_state::ProcessState;
use crate::spool::{self, Folder, Spool};
use std::path::Path;

pub(super) fn spool_list(
    flag: Option<&Path>,
    pipeline: Option<&str>,
    folders: &[Folder],
    json: bool,
) -> u8 {
    let config = match config_for_reading(flag) {
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
        let spool = Spool::of(&config, p);
        match spool::list(&spool, folders) {
            Ok(r) => rows.extend(r),
            // A producer sees its inbox, as `status` shows it to them.
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && folders.contains(&Folder::Inbox)
                    && super::access::can_write(&spool.inbox).unwrap_or(false)
                    && let Ok(r) = spool::list(&spool, &[Folder::Inbox]) =>
            {
                eprintln!(
                    "note: pipeline {}: only its inbox is listed; work/, done/ and failed/ are the agent's and its operators' (docs/security.md)",
                    p.id
                );
                rows.extend(r);
            }
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
    } else {
        println!(
            "{:<8} {:<20} {:<40} {:>10}  DETAILS",
            "SPOOL", "PIPELINE", "NAME", "AGE"
        );
    }
    let now = time::OffsetDateTime::now_utc();
    for r in &rows {
        let age = crate::catalog::parse_time(&r.modified)
            .map(|t| human_age((now - t).whole_seconds()))
            .unwrap_or_default();
        // Names, stages, errors and reasons come from producers: inert.
        let mut line = format!(
            "{:<8} {:<20} {:<40} {age:>6} ago",
            r.spool,
            r.pipeline_id,
            inert(&r.name)
        );
        if let (Some(state), Some(reason)) = (r.state, &r.reason) {
            line.push_str(&format!("  {state}: {}", inert(reason)));
        }
        if let (Some(stage), Some(error)) = (&r.stage, &r.error) {
            line.push_str(&format!("  [{}] {}", inert(stage), inert(error)));
        } else if let Some(error) = &r.error {
            line.push_str(&format!("  {}", inert(error)));
        }
        if let Some(d) = &r.deferred {
            line.push_str(&format!("  deferred: {}", d.summary()));
        }
        println!("{line}");
    }
    EXIT_OK
}

pub(super) fn spool_retry(
    flag: Option<&Path>,
    pipeline: &str,
    name: &str,
    allow_older: bool,
    process: &ProcessState,
) -> u8 {
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
    let spool = Spool::of(&config, p);
    if !allow_older
        && let Some(refusal) = super::failed::rolls_back(&config, p, &spool, name, process)
    {
        eprintln!("error: {refusal}");
        return EXIT_FAILURE;
    }
    match spool::retry(&spool, name) {
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
            e.exit_code()
        }
    }
}
