//! Opening a root for one command through its backend, reading its catalog
//! (refused untouched unless maintenance can work on it), and the records
//! in a command's scope.

use super::{MaintainError, OwnedRoot};
use crate::backend::{self, Access, MaintainRoot, Refused};
use crate::catalog::{Catalog, OutputRecord};
use std::collections::BTreeSet;
use time::OffsetDateTime;

/// An open root: locked and settled from its journal, or a bucket whose
/// stale intents were recovered (before a write), or only looked at.
pub(super) type Opened = Box<dyn MaintainRoot>;

/// Opens the target's root for a command that reads or may write
/// (`backend::open_to_maintain`). A local root that does not exist is
/// opened as an empty one and not created; one with neither a lock file
/// nor a state file is never given a lock file.
pub(super) fn open(
    target: &OwnedRoot,
    access: Access,
    now: OffsetDateTime,
) -> Result<Opened, MaintainError> {
    backend::open_to_maintain(
        target.destination,
        access,
        target.lock_timeout,
        now,
        target.process,
    )
    .map_err(|f| target.error(f))
}

/// The root's catalog as it stands (`None`: no state file), refused
/// untouched when invalid, written by a newer tool, or legacy.
pub(super) fn read(
    target: &OwnedRoot,
    root: &mut Opened,
) -> Result<Option<Catalog>, MaintainError> {
    root.read_catalog().map_err(|f| target.error(f))
}

/// Logs each publication in progress in the root (or whose publisher
/// died), which a read-only command leaves alone, and returns the outputs
/// they write.
pub(super) fn report_pending(
    target: &OwnedRoot,
    root: &Opened,
) -> Result<BTreeSet<String>, MaintainError> {
    root.in_flight(true).map_err(|f| target.error(f))
}

/// Why maintenance refuses a state file.
pub(super) fn refusal(target: &OwnedRoot, refused: Refused) -> MaintainError {
    let file = target.state_file_text();
    let pipeline_id = target.pipeline_id.to_owned();
    let destination_id = target.destination.id.clone();
    match refused {
        Refused::Invalid { reason } => MaintainError::InvalidState {
            file,
            reason,
            pipeline_id,
            destination_id,
        },
        Refused::Future { schema_version } => MaintainError::FutureState {
            file,
            schema_version,
        },
        Refused::Legacy { schema_version } => MaintainError::LegacyState {
            file,
            schema_version,
            pipeline_id,
            destination_id,
        },
    }
}

pub(super) fn in_scope<'r>(
    target: &'r OwnedRoot,
    records: &'r [OutputRecord],
    all_owners: bool,
) -> impl Iterator<Item = &'r OutputRecord> + 'r {
    records
        .iter()
        .filter(move |r| all_owners || r.owned_by(target.pipeline_id, &target.destination.id))
}
