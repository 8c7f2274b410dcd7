//! Maintenance of one destination root: retention pruning, reconciling the
//! catalog with storage, verifying managed outputs, and listing the catalog.
//!
//! Written once for every backend: a root is opened through the
//! maintenance trait of the backends (`backend::MaintainRoot`, opened by
//! `backend::open_to_maintain`), which locks a local root and settles its
//! journal, or recovers a bucket's stale intents, before a command writes.
//! Before reading the catalog each command refuses (changing nothing) state
//! that is invalid, written by a newer tool, or legacy. Read-only
//! operations (dry runs, `verify`, `catalog`) create nothing: no root, no
//! lock file, no temporary file, no object. `prune` deletes through the
//! commit a publication makes; a bucket's commit that lost a race to
//! another publisher is planned again from the catalog it left.
//!
//! It must never delete anything but the catalog-recorded outputs selected
//! by a prune policy, never touch another owner's outputs when scoped to
//! one, never adopt unmanaged content, and never print.

use crate::backend::{Fault, StorageFault};
use crate::config::Destination;
use crate::fs::lock::LockError;
use crate::publish;
use crate::runtime::process_state::ProcessState;
use serde::Serialize;
use std::time::Duration;

mod list;
mod prune;
mod reconcile;
mod releases;
mod selection;
mod session;
mod verify;

#[cfg(test)]
mod tests;

pub use list::catalog;
pub use prune::prune;
pub use reconcile::reconcile;
pub use releases::{list as releases, rollback};
pub use verify::verify;

/// How often a command plans again after another publisher changed the
/// catalog of an s3 root under it (a compare-and-swap lost).
const ROUNDS: usize = 8;

/// The destination root a maintenance command works on, and whose outputs
/// are "its own" (the owner `pipeline_id` / `destination.id`).
#[derive(Debug, Clone, Copy)]
pub struct OwnedRoot<'a> {
    pub pipeline_id: &'a str,
    pub destination: &'a Destination,
    pub lock_timeout: Duration,
    /// The process's caches (remembered catalogs, s3 clients).
    pub process: &'a ProcessState,
}

impl OwnedRoot<'_> {
    /// The root for messages: a folder, or `s3://bucket/path at endpoint`.
    fn root_text(&self) -> String {
        publish::root_label(self.destination)
    }

    /// The root's catalog for messages: `<root>/.distributor.json`, or
    /// `s3://bucket/path/.distributor.json at endpoint`.
    fn state_file_text(&self) -> String {
        publish::state_file_label(self.destination)
    }

    fn owner(&self) -> String {
        format!("{}/{}", self.pipeline_id, self.destination.id)
    }

    /// Why the command stops, from what the root's backend met.
    fn error(&self, fault: Fault) -> MaintainError {
        match fault {
            Fault::Unusable(state) => session::refusal(self, state),
            Fault::Lock(e) => MaintainError::Lock(e),
            Fault::Storage(fault) => MaintainError::Storage(fault),
        }
    }
}

/// Why a maintenance command did not run (or did not finish).
#[derive(Debug, thiserror::Error)]
pub enum MaintainError {
    #[error(
        "pipeline {pipeline_id:?} destination {destination_id:?} (root {root}) has no retention policy, so there is nothing to prune; add `retention: {{prune: {{max_age: 30d, keep_latest: 1}}}}` to that destination in the config to enable pruning"
    )]
    NoPrunePolicy {
        pipeline_id: String,
        destination_id: String,
        root: String,
    },
    #[error(
        "{file} is invalid ({reason}); nothing was changed. Restore the file from a backup, or rebuild the root with `distributor run --pipeline {pipeline_id} --destination {destination_id} --force BUNDLE` (which deletes everything in the root) after reviewing it with --dry-run"
    )]
    InvalidState {
        file: String,
        reason: String,
        pipeline_id: String,
        destination_id: String,
    },
    #[error(
        "{file} has schema_version {schema_version}, written by a newer distributor (this one understands up to 4); nothing was changed. Maintain this root with the newer version"
    )]
    FutureState { file: String, schema_version: u64 },
    #[error(
        "{file} is legacy state (schema_version {schema_version}); maintenance needs a schema 4 catalog, and nothing was changed. The next publication to this root converts it (`distributor run --pipeline {pipeline_id} --destination {destination_id} BUNDLE`); run this command again afterwards"
    )]
    LegacyState {
        file: String,
        schema_version: u64,
        pipeline_id: String,
        destination_id: String,
    },
    #[error(
        "pipeline {pipeline_id:?} destination {destination_id:?} (root {root}) is not published as releases, so there is no release to roll back to or list; add `releases: 5` to that destination (a local root) to keep the current release and the 4 before it"
    )]
    NoReleases {
        pipeline_id: String,
        destination_id: String,
        root: String,
    },
    #[error("{root} has no earlier release to roll back to: {why}")]
    NoEarlierRelease { root: String, why: String },
    #[error(
        "{root} has no release {release:?}; its releases are: {known} (see `distributor releases`)"
    )]
    NoSuchRelease {
        release: String,
        root: String,
        known: String,
    },
    #[error("{0}")]
    Lock(#[from] LockError),
    /// The root's storage failed (a folder, or a bucket): the text names
    /// the root, what was being done, and what to do.
    #[error(transparent)]
    Storage(StorageFault),
}

impl MaintainError {
    /// The process exit code (docs/contract.md §9, §11.9, §11.18).
    pub fn exit_code(&self) -> u8 {
        use crate::runtime::exit::{EXIT_FAILURE, EXIT_REFUSED, EXIT_USAGE};
        match self {
            MaintainError::NoPrunePolicy { .. }
            | MaintainError::NoReleases { .. }
            | MaintainError::NoSuchRelease { .. } => EXIT_USAGE,
            MaintainError::NoEarlierRelease { .. } => EXIT_REFUSED,
            MaintainError::InvalidState { .. }
            | MaintainError::FutureState { .. }
            | MaintainError::LegacyState { .. } => EXIT_REFUSED,
            // Missing credentials or a bad client setup: configuration.
            MaintainError::Storage(fault) if fault.is_config() => EXIT_USAGE,
            MaintainError::Lock(_) | MaintainError::Storage(_) => EXIT_FAILURE,
        }
    }
}

fn json_text<T: Serialize>(value: &T) -> String {
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}
