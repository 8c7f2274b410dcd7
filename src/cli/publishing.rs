//! The commands that publish: `run` (one bundle folder in place) and `agent`
//! (the spool agent). Both call the library and report what it returns.

use super::output::print_report;
use super::{Error, Outcome, RunArgs, Told, load_config, told_unless};
use crate::config::{self, Config, Pipeline};
use crate::publish::{self, Options};
use crate::report::RunReport;
use crate::runtime::process_state::ProcessState;
use std::path::{Path, PathBuf};

pub(super) fn run_bundle(
    config_flag: Option<&Path>,
    args: &RunArgs,
    process: &ProcessState,
) -> Outcome {
    let fail_config = |message: String| {
        if !args.json {
            return Err(Error::Usage(message));
        }
        let report =
            publish::Error::Usage(message).fail(RunReport::new(&args.pipeline, args.dry_run));
        print_report(&report, true, false, std::time::Duration::ZERO);
        told(report)
    };
    if args.force && args.destinations.is_empty() {
        return fail_config(
            "--force replaces everything in a destination root, so it must name the destination: add --destination D".to_owned(),
        );
    }
    let config = match load_config(config_flag) {
        Ok(c) => c,
        Err(e) => return fail_config(e),
    };
    let Some(pipeline) = config.pipeline(&args.pipeline) else {
        let known: Vec<&str> = config.pipelines.iter().map(|p| p.id.as_str()).collect();
        return fail_config(format!(
            "no pipeline {:?} in {}; configured pipelines: {}",
            args.pipeline,
            config.file.display(),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ));
    };
    let mut destinations = Vec::new();
    if args.destinations.is_empty() {
        destinations.extend(pipeline.destinations.iter());
    } else {
        for id in &args.destinations {
            match pipeline.destination(id) {
                Some(d)
                    if !destinations
                        .iter()
                        .any(|x: &&config::Destination| x.id == d.id) =>
                {
                    destinations.push(d)
                }
                Some(_) => {}
                None => {
                    let known: Vec<&str> = pipeline
                        .destinations
                        .iter()
                        .map(|d| d.id.as_str())
                        .collect();
                    return fail_config(format!(
                        "pipeline {:?} has no destination {id:?}; its destinations: {}",
                        pipeline.id,
                        known.join(", ")
                    ));
                }
            }
        }
    }
    let options = Options {
        dry_run: args.dry_run,
        force: args.force,
        lock_timeout: config.agent.lock_timeout,
        serving: None,
        scratch: scratch_folder(&config, pipeline),
        process: process.clone(),
    };
    let started = std::time::Instant::now();
    let report = publish::publish(pipeline, &destinations, &args.bundle_dir, &options);
    // The markdown renderers' processes end with the run.
    process.renderers().stop_idle();
    for w in &report.warnings {
        log::warn!("{}: {w}", args.bundle_dir.display());
    }
    log::info!(
        "pipeline={} bundle={} {} elapsed_ms={}",
        pipeline.id,
        args.bundle_dir.display(),
        report.actions(),
        started.elapsed().as_millis()
    );
    print_report(&report, args.json, args.verbose, started.elapsed());
    told(report)
}

/// The outcome of a publication whose result was printed.
fn told(report: RunReport) -> Outcome {
    match report.error {
        None => Ok(()),
        Some(e) => Err(Error::Told(Told::Run(e))),
    }
}

pub(super) fn agent(flag: Option<&Path>, once: bool, process: &ProcessState) -> Outcome {
    let path = config::resolve_config_path(flag);
    let ran = crate::agent::run(&path, once, process);
    // The markdown renderers' processes end with the agent.
    process.renderers().stop_idle();
    // `--once` logged what did not end in done/.
    told_unless(ran?)
}

/// Where `run` puts rendered pages too big to hold: the pipeline's spool
/// work folder when it exists (on disk, and the agent's own), else the
/// system's temporary folder.
pub(super) fn scratch_folder(config: &Config, pipeline: &Pipeline) -> PathBuf {
    let work = crate::spool::Spool::of(config, pipeline).work;
    if work.is_dir() {
        work
    } else {
        std::env::temp_dir()
    }
}
