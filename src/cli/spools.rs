//! The spool commands: `spool list` and `spool retry`.

use super::output::human_age;
use super::{Error, Outcome, config_for_reading, config_or_usage};
use crate::runtime::process_state::ProcessState;
use crate::spool::{self, Folder, Spool};
use crate::text::escape::inert;
use std::path::Path;

pub(super) fn spool_list(
    flag: Option<&Path>,
    pipeline: Option<&str>,
    folders: &[Folder],
    json: bool,
) -> Outcome {
    let config = config_for_reading(flag)?;
    if let Some(id) = pipeline
        && config.pipeline(id).is_none()
    {
        return Err(Error::Usage(format!(
            "no pipeline {id:?} in {}",
            config.file.display()
        )));
    }
    let mut rows = Vec::new();
    for p in config
        .pipelines
        .iter()
        .filter(|p| pipeline.is_none_or(|id| id == p.id))
    {
        if let Some(intake) = &p.intake {
            rows.extend(super::intake::list(&config, p, intake, folders).map_err(Error::Failed)?);
            continue;
        }
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
                return Err(Error::Failed(format!(
                    "cannot list the spool of pipeline {}: {e}",
                    p.id
                )));
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(());
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
    Ok(())
}

pub(super) fn spool_retry(
    flag: Option<&Path>,
    pipeline: &str,
    name: &str,
    allow_older: bool,
    process: &ProcessState,
) -> Outcome {
    let config = config_or_usage(flag)?;
    let Some(p) = config.pipeline(pipeline) else {
        return Err(Error::Usage(format!(
            "no pipeline {pipeline:?} in {}",
            config.file.display()
        )));
    };
    if let Some(intake) = &p.intake {
        return super::intake::retry(p, intake, name, allow_older);
    }
    let spool = Spool::of(&config, p);
    if !allow_older
        && let Some(refusal) = super::failed::rolls_back(&config, p, &spool, name, process)
    {
        return Err(Error::Failed(refusal));
    }
    let to = spool::retry(&spool, name)?;
    println!(
        "moved {} back to {}",
        inert(name),
        inert(&to.display().to_string())
    );
    Ok(())
}
