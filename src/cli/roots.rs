//! Running a maintenance command (`prune`, `reconcile-state`, `verify`,
//! `catalog`) on the one destination root that `--pipeline` and
//! `--destination` select, and printing its result.

use super::{EXIT_USAGE, TargetArgs, load_config};
use crate::maintain::{MaintainError, OwnedRoot};
use crate::process_state::ProcessState;
use std::path::Path;

/// Loads the config, resolves `--pipeline`/`--destination`, runs `op` and
/// prints its text or JSON.
pub(super) fn with_target(
    flag: Option<&Path>,
    args: &TargetArgs,
    op: impl FnOnce(&OwnedRoot<'_>) -> Result<(String, String, u8), MaintainError>,
    json: bool,
    reading: bool,
    process: &ProcessState,
) -> u8 {
    // These commands work on s3 destinations too (docs/contract.md §15.5), so the
    // config is not checked for backends that others cannot use yet.
    // verify and catalog only read: after a refused reload they work on
    // the config the agent serves (super::config_for_reading).
    let config = if reading {
        match super::config_for_reading(flag) {
            Ok(c) => c,
            Err(code) => return code,
        }
    } else {
        match load_config(flag) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_USAGE;
            }
        }
    };
    let Some(pipeline) = config.pipeline(&args.pipeline) else {
        eprintln!(
            "error: no pipeline {:?} in {}; see `distributor config check`",
            args.pipeline,
            config.file.display()
        );
        return EXIT_USAGE;
    };
    let Some(destination) = pipeline.destination(&args.destination) else {
        eprintln!(
            "error: pipeline {:?} has no destination {:?}; see `distributor config check`",
            pipeline.id, args.destination
        );
        return EXIT_USAGE;
    };
    let target = OwnedRoot {
        pipeline_id: &pipeline.id,
        destination,
        lock_timeout: config.agent.lock_timeout,
        process,
    };
    match op(&target) {
        Ok((text, json_text, code)) => {
            print!("{}", if json { json_text } else { text });
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}
