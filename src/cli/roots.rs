//! Running a maintenance command (`prune`, `reconcile-state`, `verify`,
//! `catalog`) on the one destination root that `--pipeline` and
//! `--destination` select, and printing its result.

use super::{Error, Outcome, TargetArgs, load_config, told_unless};
use crate::maintain::{MaintainError, OwnedRoot};
use crate::runtime::process_state::ProcessState;
use std::path::Path;

/// Loads the config, resolves `--pipeline`/`--destination`, runs `op` and
/// prints its text or JSON; `op` also says whether what it found is fine
/// (`verify` finds problems).
pub(super) fn with_target(
    flag: Option<&Path>,
    args: &TargetArgs,
    op: impl FnOnce(&OwnedRoot<'_>) -> Result<(String, String, bool), MaintainError>,
    json: bool,
    reading: bool,
    process: &ProcessState,
) -> Outcome {
    // These commands work on s3 destinations too (docs/contract.md §15.5), so the
    // config is not checked for backends that others cannot use yet.
    // verify and catalog only read: after a refused reload they work on
    // the config the agent serves (super::config_for_reading).
    let config = if reading {
        super::config_for_reading(flag)?
    } else {
        load_config(flag).map_err(Error::Usage)?
    };
    let Some(pipeline) = config.pipeline(&args.pipeline) else {
        return Err(Error::Usage(format!(
            "no pipeline {:?} in {}; see `distributor config check`",
            args.pipeline,
            config.file.display()
        )));
    };
    let Some(destination) = pipeline.destination(&args.destination) else {
        return Err(Error::Usage(format!(
            "pipeline {:?} has no destination {:?}; see `distributor config check`",
            pipeline.id, args.destination
        )));
    };
    let target = OwnedRoot {
        pipeline_id: &pipeline.id,
        destination,
        lock_timeout: config.agent.lock_timeout,
        process,
    };
    let (text, json_text, fine) = op(&target)?;
    print!("{}", if json { json_text } else { text });
    told_unless(fine)
}
