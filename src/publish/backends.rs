//! The one place that knows which backends there are: a destination's
//! [`Target`] for a publication or for maintenance, and what else differs
//! by backend before a root is opened (docs/architecture.md, "One
//! transaction over backends").

use super::Options;
use super::error::Error;
use super::target::{Access, Fault, Target};
use super::{local, remote};
use crate::catalog::{STATE_FILE, State};
use crate::config::{Backend, Destination};
use crate::journal;
use crate::process_state::ProcessState;
use std::time::Duration;
use time::OffsetDateTime;

/// A catalog file worth parsing while the bundle is prepared, before the
/// root's lock is taken ([`journal::read_ahead`]): a local root's large one.
pub(super) fn worth_reading_ahead(
    d: &Destination,
    process: &ProcessState,
) -> Option<std::fs::File> {
    match &d.backend {
        Backend::Local => local::worth_reading_ahead(d, process),
        Backend::S3(_) => None,
    }
}

/// Opens `d` for a publication: a local root locked (created later, when
/// missing), an s3 destination checked and recovered.
pub(super) fn open(
    d: &Destination,
    options: &Options,
    now: OffsetDateTime,
    ahead: Option<journal::ReadAhead>,
) -> Result<Box<dyn Target>, Error> {
    Ok(match &d.backend {
        Backend::Local => Box::new(local::LocalTarget::open(d, options, now, ahead)?),
        Backend::S3(location) => Box::new(remote::S3Target::open(d, location, options)?),
    })
}

/// Opens `d` for a maintenance command that reads (`Access::Read`) or may
/// write (`Access::Write`): a local root locked and settled from its
/// journal (a missing one opened as empty, not created), an s3 destination
/// through the process's client, its stale intents recovered before a
/// write (docs/maintenance.md).
pub(crate) fn open_to_maintain(
    d: &Destination,
    access: Access,
    lock_timeout: Duration,
    now: OffsetDateTime,
    process: &ProcessState,
) -> Result<Box<dyn Target>, Fault> {
    Ok(match &d.backend {
        Backend::Local => Box::new(local::LocalTarget::open_to_maintain(
            d,
            access,
            lock_timeout,
            now,
            process,
        )?),
        Backend::S3(location) => Box::new(remote::open_to_maintain(d, location, access, process)?),
    })
}

/// `d`'s root as messages name it: a folder, or `s3://bucket/path at
/// endpoint`.
pub fn root_label(d: &Destination) -> String {
    match &d.backend {
        Backend::S3(location) => location.to_string(),
        Backend::Local => d.root.display().to_string(),
    }
}

/// `d`'s catalog as messages name it: `<root>/.distributor.json`, or
/// `s3://bucket/path/.distributor.json at endpoint`.
pub fn state_file_label(d: &Destination) -> String {
    match &d.backend {
        Backend::S3(l) => {
            let mut text = format!("s3://{}/", l.bucket);
            if !l.path.is_empty() {
                text.push_str(&l.path);
                text.push('/');
            }
            text.push_str(STATE_FILE);
            if let Some(endpoint) = &l.endpoint {
                text.push_str(" at ");
                text.push_str(endpoint);
            }
            text
        }
        Backend::Local => format!("{}/{STATE_FILE}", root_label(d)),
    }
}

/// Most bundles published together. Each batch pays fixed costs per
/// root whatever its size: a local root two file-system syncs and a write
/// of its whole catalog (tens of MiB for a large one), an s3 destination an
/// intent, a compare-and-swap of the whole catalog and a pause of the
/// uploads; so a backlog goes in few, large batches (a batch takes fewer
/// when their pages would hold too much memory).
pub const MAX_BATCH: usize = 1024;

/// The state of `d`'s catalog as it stands (`None`: the root does not
/// exist), read without writing anything and tried once: read like every
/// other command reads a root's catalog (no link followed, no FIFO opened,
/// so a tampered root cannot hang `status`), and a dead s3 endpoint holds
/// the caller for one connection attempt or one request without progress
/// at most (docs/object-storage.md).
pub fn peek_state(d: &Destination) -> Result<Option<State>, String> {
    match &d.backend {
        Backend::Local => crate::storage::Root::open(&d.root)
            .and_then(|root| match root {
                Some(root) => root.read_reserved(crate::catalog::STATE_FILE),
                None => Ok(None),
            })
            .map(|bytes| bytes.map(|b| State::parse(&b)))
            .map_err(|e| e.to_string()),
        Backend::S3(location) => crate::s3::S3Root::open_single_try(location)
            .and_then(|root| root.read_state())
            .map(|base| Some(base.state))
            .map_err(|e| e.to_string()),
    }
}

/// Recovers at once what an earlier agent serving the spool folder
/// `serving` left unfinished in destination `d` (an s3 destination; a
/// local root is settled from its journal under its lock).
pub fn recover_abandoned(d: &Destination, serving: &str, process: &ProcessState) {
    if let Backend::S3(location) = &d.backend {
        remote::recover_abandoned(d, location, serving, process);
    }
}
