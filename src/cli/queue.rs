//! `spool flush [P]`, `spool hold P` and `spool release P`: the operator's
//! say over a pipeline's queue (docs/contract.md §18.4, §18.5). Each writes
//! or removes a small file in the pipeline's spool folder that the agent
//! looks at ([`crate::spool::queue`]); on an intake pipeline, an object in
//! its bucket (super::intake).

use super::{Error, Outcome, config_or_usage, told_unless};
use crate::agent::presence;
use crate::config::{Config, Pipeline};
use crate::spool::{Spool, queue};
use crate::text::escape::inert;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// How long `spool flush` waits to see the agent take the request before
/// saying it is asked but not started yet (an attempt in progress, such as
/// a wait for a root lock, finishes first).
const FLUSH_ACK: Duration = Duration::from_secs(3);

/// The pipelines a command names, or a usage error.
fn selected<'c>(config: &'c Config, pipeline: Option<&str>) -> Result<Vec<&'c Pipeline>, Error> {
    match pipeline {
        Some(id) => match config.pipeline(id) {
            Some(p) => Ok(vec![p]),
            None => Err(Error::Usage(format!(
                "no pipeline {id:?} in {}",
                config.file.display()
            ))),
        },
        None => Ok(config.pipelines.iter().collect()),
    }
}

/// The pipeline named `id` and its spool, or the error of why not.
fn one(flag: Option<&Path>, id: &str) -> Result<(Pipeline, Spool), Error> {
    let config = config_or_usage(flag)?;
    let p = selected(&config, Some(id))?[0].clone();
    let spool = Spool::of(&config, &p);
    Ok((p, spool))
}

/// `spool flush [P]`.
pub(super) fn flush(flag: Option<&Path>, pipeline: Option<&str>) -> Outcome {
    let config = config_or_usage(flag)?;
    let pipelines = selected(&config, pipeline)?;
    // Each pipeline's error is told as it comes; the others go on.
    let mut ok = true;
    for p in pipelines {
        if let Some(intake) = &p.intake {
            ok &= super::intake::flush(&config, p, intake);
            continue;
        }
        let spool = Spool::of(&config, p);
        let folder = spool.pipeline_folder();
        match presence::read(folder) {
            Ok(a) if a.running => {}
            Ok(_) => {
                eprintln!(
                    "error: pipeline {}: no agent is running, so nothing can be flushed; start it (systemctl start distributor), or run `distributor agent --once`",
                    p.id
                );
                ok = false;
                continue;
            }
            Err(e) => {
                eprintln!(
                    "error: pipeline {}: cannot tell whether an agent serves it ({}: {e})",
                    p.id,
                    presence::lock_path(folder).display()
                );
                ok = false;
                continue;
            }
        }
        let deferred = match queue::deferral(folder) {
            Ok(Some(d)) => d,
            Ok(None) => {
                println!("pipeline {}: nothing deferred", p.id);
                continue;
            }
            Err(e) => {
                eprintln!("error: pipeline {}: {e}", p.id);
                ok = false;
                continue;
            }
        };
        if let Err(e) = queue::request_flush(folder, OffsetDateTime::now_utc()) {
            eprintln!(
                "error: pipeline {}: cannot write {}: {e}; {}",
                p.id,
                folder.join(queue::FLUSH_FILE).display(),
                write_fix(folder, &format!("spool flush {}", p.id))
            );
            ok = false;
            continue;
        }
        let name = inert(&deferred.bundle);
        if taken(folder) {
            println!(
                "pipeline {}: the agent is trying {name} now (it had made {} attempt(s)); `distributor spool list --pipeline {}` shows how it ends",
                p.id, deferred.attempts, p.id
            );
        } else {
            println!(
                "pipeline {}: asked the agent to try {name} now; it starts as soon as the attempt in progress ends",
                p.id
            );
        }
    }
    told_unless(ok)
}

/// Whether the agent took the flush request within [`FLUSH_ACK`].
fn taken(folder: &Path) -> bool {
    let deadline = Instant::now() + FLUSH_ACK;
    while Instant::now() < deadline {
        if !queue::flush_requested(folder) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !queue::flush_requested(folder)
}

/// `spool hold P`.
pub(super) fn hold(flag: Option<&Path>, pipeline: &str) -> Outcome {
    let (p, spool) = one(flag, pipeline)?;
    if let Some(intake) = &p.intake {
        return super::intake::hold(&p, intake);
    }
    let folder = spool.pipeline_folder();
    let before = queue::hold(folder).ok().flatten();
    let h = queue::put_hold(folder, OffsetDateTime::now_utc()).map_err(|e| {
        Error::Failed(format!(
            "pipeline {}: cannot write {}: {e}; {}",
            p.id,
            folder.join(queue::HOLD_FILE).display(),
            write_fix(folder, &format!("spool hold {}", p.id))
        ))
    })?;
    if before.is_some() {
        println!("pipeline {}: already held since {}", p.id, h.since);
    } else {
        println!(
            "pipeline {}: held since {}; the agent claims nothing more from {} (a bundle in hand finishes), across restarts, until `distributor spool release {}`",
            p.id,
            h.since,
            spool.inbox.display(),
            p.id
        );
    }
    Ok(())
}

/// `spool release P`.
pub(super) fn release(flag: Option<&Path>, pipeline: &str) -> Outcome {
    let (p, spool) = one(flag, pipeline)?;
    if let Some(intake) = &p.intake {
        return super::intake::release(&p, intake);
    }
    let folder = spool.pipeline_folder().to_owned();
    let was = queue::hold(&folder).ok().flatten();
    let released = queue::release(&folder).map_err(|e| {
        Error::Failed(format!(
            "pipeline {}: cannot remove {}: {e}; {}",
            p.id,
            folder.join(queue::HOLD_FILE).display(),
            write_fix(&folder, &format!("spool release {}", p.id))
        ))
    })?;
    if released {
        println!(
            "pipeline {}: released{}; the agent claims from the inbox again within a second",
            p.id,
            was.map(|h| format!(" (held since {})", h.since))
                .unwrap_or_default()
        );
    } else {
        println!("pipeline {}: not held", p.id);
    }
    Ok(())
}

/// How to get write access to a pipeline's spool folder: run the command
/// as its owner, the agent's user.
fn write_fix(folder: &Path, command: &str) -> String {
    match std::fs::metadata(folder) {
        Ok(m) => {
            let owner = super::access::user_name(m.uid());
            format!(
                "the pipeline's spool folder belongs to {owner}: run `sudo -u {owner} distributor {command}`"
            )
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => format!(
            "{} does not exist yet: start the agent once, which creates it",
            folder.display()
        ),
        Err(e) => format!("cannot look at {}: {e}", folder.display()),
    }
}
