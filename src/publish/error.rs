//! Why a publication stopped: one type for every backend and every step,
//! with the step it stopped at, whether retrying later may help, and the
//! report it gives. Transient or permanent is decided here, once, on the
//! type (I/O errors by [`crate::fs::io_class`], the only errno rule).

use crate::bundle::BundleError;
use crate::fs::io_class;
use crate::fs::lock::LockError;
use crate::report::{self, RunReport, Stage};
use crate::s3;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What `run` was asked cannot be done with this configuration (it
    /// does not load, or names no such pipeline or destination), or the
    /// command line is incomplete; nothing was read.
    #[error("{0}")]
    Usage(String),
    /// The bundle does not match its manifest, or cannot be read.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The claimed bundle folder cannot be used as one: not a real folder,
    /// no manifest, or a folder at a name the agent writes inside it.
    #[error("{}: {why}", path.display())]
    Folder { path: PathBuf, why: String },
    /// The bundle's `created` is more than the allowed skew ahead of this
    /// machine's clock, on a pipeline with `signatures.refuse_older`.
    #[error("{0}")]
    FromTheFuture(String),
    /// The bundle's outputs do not fit one destination (a path outside its
    /// scope, or one its outputs would both write).
    #[error("bundle is invalid for destination {destination}: {why}")]
    Invalid { destination: String, why: String },
    /// A valid signature whose principal may not write some of the
    /// bundle's outputs (docs/contract.md §17.4).
    #[error(transparent)]
    Scope(crate::signature::SignatureRefusal),
    /// Reading the bundle or rendering its pages failed for a reason of
    /// this machine (a scratch file, memory), not of the bundle.
    #[error("{0}")]
    Prepare(#[source] io::Error),
    /// The process that renders markdown could not be started or talked
    /// to (this machine's trouble, not the document's).
    #[error(
        "{path}: could not be rendered to HTML: {why}; the bundle is tried again. If this repeats, check that the agent's user can run its own binary and has memory and processes to spare (systemd: TasksMax=, MemoryMax=), and the log for `renderer process` lines"
    )]
    Renderer { path: String, why: String },
    /// A local root's lock could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A destination root could not be opened, created or read before
    /// anything was written (`stage` says which step).
    #[error("{what} {}: {source}", path.display())]
    Root {
        stage: Stage,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing into a local root failed; the root was settled from its
    /// journal (docs/reliability.md).
    #[error(
        "publishing to {} failed: {source}; the root was left consistent (its catalog matches its files), {}",
        path.display(),
        if io_class::is_transient(source) {
            "the agent defers the bundle and tries it again with backoff (`distributor status` shows when); free space or fix permissions on the root, then `distributor spool flush` tries it at once"
        } else {
            "fix the cause, then publish the bundle again"
        }
    )]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing into a local root failed, and settling it from its journal
    /// failed too: the journal stays, and whoever locks the root next
    /// finishes it.
    #[error(
        "publishing to {} failed: {source}; settling the root from its journal failed too ({settle}), so the journal stays and the next process that locks the root finishes it (until then its catalog may not match its files); free space or fix permissions on the root",
        path.display()
    )]
    Unsettled {
        path: PathBuf,
        #[source]
        source: io::Error,
        settle: io::Error,
    },
    /// An s3 destination's server or protocol.
    #[error(transparent)]
    Store(#[from] s3::Error),
    /// What went up to an s3 key did not match the manifest, and the file
    /// in the bundle does now (it changed while being read).
    #[error(
        "{root}: the bytes uploaded to {key} did not match the manifest; nothing of the bundle is recorded there; publish the bundle again"
    )]
    Uploaded { root: String, key: String },
    /// A batch's commit into one root failed; what it wrote there was
    /// undone (roots committed before keep the batch).
    #[error(
        "committing {bundles} bundles into {root} failed, what was written there was undone: {source}"
    )]
    Commit {
        root: String,
        bundles: usize,
        #[source]
        source: Box<Error>,
    },
    /// Planning refused the publication (`fail_unmanaged`,
    /// `fail_conflict`): each refusal is `destination: why`; nothing was
    /// written anywhere.
    #[error("publication refused, nothing was written: {}", .refusals.join("; "))]
    Refused { refusals: Vec<String> },
    /// The agent could not record the commit it was about to make in its
    /// spool (docs/reliability.md, "After the commit"); nothing was
    /// committed anywhere.
    #[error("{}", record_message(source))]
    Record {
        #[source]
        source: io::Error,
    },
    /// The agent is stopping; nothing was renamed into any root.
    #[error(
        "the agent is stopping; nothing was written, the bundle is published at the next start"
    )]
    Stopped,
}

impl Error {
    /// The step of docs/contract.md §9 the publication stopped at.
    pub fn stage(&self) -> Stage {
        match self {
            Error::Bundle(_)
            | Error::Folder { .. }
            | Error::FromTheFuture(_)
            | Error::Invalid { .. }
            | Error::Scope(_)
            | Error::Prepare(_)
            | Error::Renderer { .. }
            | Error::Uploaded { .. } => Stage::Verify,
            Error::Usage(_) => Stage::Config,
            Error::Lock(_) => Stage::Lock,
            Error::Refused { .. } => Stage::Plan,
            Error::Root { stage, .. } => *stage,
            Error::Write { .. } | Error::Unsettled { .. } | Error::Stopped => Stage::Publish,
            Error::Record { .. } => Stage::Spool,
            Error::Commit { source, .. } => source.stage(),
            // A publication meets a client that cannot be set up when it
            // opens the root, and reports it there.
            Error::Store(e) => match e.stage() {
                Stage::Config => Stage::Lock,
                stage => stage,
            },
        }
    }

    /// Whether publishing the same bundle again later may succeed without
    /// anyone changing anything.
    pub fn is_transient(&self) -> bool {
        // Given up by a stop: published at the next start.
        if self.is_stopped() {
            return true;
        }
        match self {
            Error::Bundle(e) => e.is_transient(),
            Error::Prepare(e)
            | Error::Root { source: e, .. }
            | Error::Write { source: e, .. }
            | Error::Unsettled { source: e, .. } => io_class::is_transient(e),
            // The agent's own spool: this machine's trouble, never the bundle's.
            Error::Record { .. } => true,
            Error::Lock(LockError::Timeout { .. }) => true,
            Error::Lock(LockError::Io { source, .. }) => io_class::is_transient(source),
            Error::Store(e) => e.is_transient() || e.is_stopped(),
            Error::Uploaded { .. } | Error::Renderer { .. } | Error::Stopped => true,
            Error::Commit { source, .. } => source.is_transient(),
            Error::Usage(_)
            | Error::Folder { .. }
            | Error::FromTheFuture(_)
            | Error::Invalid { .. }
            | Error::Scope(_)
            | Error::Refused { .. } => false,
        }
    }

    /// Whether an s3 root's catalog compare-and-swap lost to another
    /// publisher and the change could not be applied on top of the
    /// winner's catalog (docs/object-storage.md, "Several hosts").
    pub fn lost_catalog_race(&self) -> bool {
        match self {
            Error::Store(s3::Error::Conflict { .. }) => true,
            Error::Commit { source, .. } => source.lost_catalog_race(),
            _ => false,
        }
    }

    /// Whether the agent's stop caused it.
    pub fn is_stopped(&self) -> bool {
        match self {
            Error::Stopped => true,
            Error::Write { source, .. } | Error::Prepare(source) => {
                crate::runtime::interrupt::is_stopped(source)
            }
            Error::Store(e) => e.is_stopped(),
            Error::Commit { source, .. } => source.is_stopped(),
            _ => false,
        }
    }

    /// This error, for a root that could not be settled after it
    /// (`settle`): a write error then says the journal stays.
    pub(super) fn unsettled(self, settle: io::Error) -> Error {
        match self {
            Error::Write { path, source } => Error::Unsettled {
                path,
                source,
                settle,
            },
            e => e,
        }
    }

    /// `report`, failed with this error (which gives its stage, whether it
    /// is transient and its exit code), and the reason of a refused
    /// signature.
    pub fn fail(self, mut report: RunReport) -> RunReport {
        if let Error::Bundle(BundleError::Signature(refusal)) | Error::Scope(refusal) = &self {
            report.signature_refused = Some(refusal.reason.as_str());
        }
        report.fail(self)
    }
}

impl report::Failure for Error {
    fn stage(&self) -> Stage {
        Error::stage(self)
    }

    fn is_transient(&self) -> bool {
        Error::is_transient(self)
    }

    fn is_refused(&self) -> bool {
        matches!(self, Error::Refused { .. })
    }
}

/// Why an intake's holder may not commit (its lease, its records in the
/// bucket), carried in the `io::Error` its check before the commit returns:
/// told as it is, without the spool's advice.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fenced(pub String);

fn record_message(source: &io::Error) -> String {
    match source.get_ref().and_then(|e| e.downcast_ref::<Fenced>()) {
        Some(fenced) => format!("{fenced}; the bundle is tried again"),
        None => format!(
            "cannot record the publication in the spool before committing it ({source}); nothing was committed, the bundle is tried again. Check free space and permissions in the pipeline's work/ folder"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_an_intake_fenced_is_told_without_the_spools_advice() {
        let spool = Error::Record {
            source: io::Error::other("No space left on device"),
        };
        assert!(spool.to_string().contains("Check free space"), "{spool}");
        let fenced = Error::Record {
            source: io::Error::other(Fenced("not committed: the lease was lost".to_owned())),
        };
        assert_eq!(
            fenced.to_string(),
            "not committed: the lease was lost; the bundle is tried again"
        );
    }
}
