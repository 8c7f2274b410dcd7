//! Opening a root for one command: the lock, the state file classified
//! before anything is read or changed, an interrupted publication finished
//! (or, for reads, only looked at), the listing and the catalog write.

use super::{MaintainError, Target, io_error};
use crate::catalog::{Catalog, OutputRecord, STATE_FILE, State};
use crate::journal::{self, JOURNAL_FILE};
use crate::lock::{self, RootLock};
use crate::storage::{Entry, Root};
use std::collections::BTreeMap;
use time::OffsetDateTime;

/// What a command intends to do to the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Reads only: take the lock only if the lock file exists; create nothing.
    Read,
    /// May rewrite the catalog or delete outputs.
    Write,
}

/// An open, locked root and its catalog (`None`: no state file).
pub(super) struct Session {
    pub(super) root: Root,
    pub(super) catalog: Option<Catalog>,
    _lock: Option<RootLock>,
}

/// Refuses state that maintenance cannot work on.
pub(super) fn usable(target: &Target, state: State) -> Result<Option<Catalog>, MaintainError> {
    let file = target.state_file_text();
    match state {
        State::Absent => Ok(None),
        State::Catalog(c) => Ok(Some(c)),
        State::Invalid { reason } => Err(MaintainError::InvalidState {
            file,
            reason,
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: target.destination.id.clone(),
        }),
        State::Future { schema_version } => Err(MaintainError::FutureState {
            file,
            schema_version,
        }),
        State::Legacy { schema_version } => Err(MaintainError::LegacyState {
            file,
            schema_version,
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: target.destination.id.clone(),
        }),
    }
}

/// Opens and locks the target's root and reads its catalog.
///
/// `Ok(None)` when the root does not exist. The state file is classified
/// before anything is changed, so invalid, future and legacy state are
/// refused untouched. With [`Access::Write`] an interrupted publication is
/// finished first; with [`Access::Read`] the catalog returned is what
/// finishing it would leave, and nothing is written. A root with neither a
/// lock file nor a state file is never given a lock file.
pub(super) fn open(
    target: &Target,
    access: Access,
    now: OffsetDateTime,
) -> Result<Option<Session>, MaintainError> {
    let Some(root) = Root::open(&target.destination.root)
        .map_err(io_error(target, "cannot open the destination root"))?
    else {
        return Ok(None);
    };
    let mut lock = lock::acquire_existing(&root, target.lock_timeout)?;
    let read_state = |root: &Root| {
        journal::read_state(root).map_err(io_error(target, format!("cannot read {STATE_FILE}")))
    };
    if access == Access::Write && lock.is_none() {
        // No lock file: only take (and so create) the lock when there is
        // something to change.
        let state = read_state(&root)?;
        let journaled = root
            .entry(JOURNAL_FILE)
            .map_err(io_error(target, format!("cannot read {JOURNAL_FILE}")))?
            != Entry::Missing;
        if matches!(state, State::Absent) && !journaled {
            return Ok(Some(Session {
                root,
                catalog: None,
                _lock: None,
            }));
        }
        usable(target, state)?;
        lock = Some(lock::acquire(&root, target.lock_timeout)?);
    }
    usable(target, read_state(&root)?)?;
    let apply = access == Access::Write;
    let state = journal::recover(&root, apply, now).map_err(io_error(
        target,
        "cannot finish the interrupted publication recorded in its journal",
    ))?;
    let catalog = usable(target, state)?;
    Ok(Some(Session {
        root,
        catalog,
        _lock: lock,
    }))
}

pub(super) fn in_scope<'r>(
    target: &'r Target,
    records: &'r [OutputRecord],
    all_owners: bool,
) -> impl Iterator<Item = &'r OutputRecord> + 'r {
    records
        .iter()
        .filter(move |r| all_owners || r.owned_by(target.pipeline_id, &target.destination.id))
}

pub(super) fn listing(
    target: &Target,
    root: &Root,
) -> Result<BTreeMap<String, Entry>, MaintainError> {
    Ok(root
        .walk()
        .map_err(io_error(target, "cannot list the destination root"))?
        .into_iter()
        .collect())
}

pub(super) fn write_catalog(
    target: &Target,
    root: &Root,
    catalog: &Catalog,
) -> Result<(), MaintainError> {
    root.write_reserved(STATE_FILE, &catalog.to_json())
        .map_err(io_error(target, format!("cannot write {STATE_FILE}")))
}
