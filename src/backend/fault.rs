//! Why maintenance of a root could not go on ([`Fault`]), in typed
//! fields: the refused catalog, the lock, or the storage error with the
//! root and what was being done ([`StorageFault`], whose text is what an
//! operator reads). It decides no exit code: `crate::maintain` does, once.

use crate::catalog::{Catalog, State};
use crate::fs::lock::LockError;
use std::io;

/// What a maintenance command intends to do to a root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only: a local root's lock is taken only if its lock file
    /// exists, and nothing is created or written, not even a recovery.
    Read,
    /// May delete outputs or write the catalog: an interrupted publication
    /// is finished first.
    Write,
}

/// Why maintenance of a root could not go on, in the backend's words.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The catalog is invalid, from a newer tool, or legacy: maintenance
    /// changes nothing on it.
    Unusable(Refused),
    /// A local root's lock could not be taken.
    Lock(LockError),
    /// The root's storage failed: which root, doing what, and why.
    Storage(StorageFault),
}

impl Fault {
    /// Whether another publisher changed the catalog since it was read, so
    /// that reading it again and trying again may succeed.
    pub(crate) fn lost_race(&self) -> bool {
        match self {
            Fault::Storage(StorageFault {
                source: StorageError::S3(e),
                ..
            }) => matches!(**e, crate::s3::Error::Conflict { .. }),
            _ => false,
        }
    }
}

/// A root's storage failed while maintenance was working on it. Its text
/// names the root and what was being done, and says what to do.
#[derive(Debug)]
pub struct StorageFault {
    /// The root as messages name it (a folder, or `s3://bucket/path`).
    pub(crate) root: String,
    pub(crate) doing: Doing,
    pub(crate) source: StorageError,
}

/// The error a root's storage gave.
#[derive(Debug)]
pub(crate) enum StorageError {
    /// A local root's file system.
    Io(io::Error),
    /// A bucket.
    S3(Box<crate::s3::Error>),
}

/// What maintenance was doing in a root when its storage failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Doing {
    // A local root.
    OpenFolder,
    /// Reading a file: a reserved one (the catalog, the journal) or an
    /// output, by path.
    Read(String),
    FinishJournal,
    ListFolder,
    Delete(String),
    Write(String),
    /// Writing the journal and the new catalog of a pruning.
    StageDeletions,
    SyncDeletions,
    RemoveJournal,
    /// Pointing a release destination's link at this release.
    Switch(String),
    // A bucket.
    OpenBucket,
    ReadCatalog,
    Recover,
    ReadLease,
    Prune,
    ListPending,
    ReadPending,
    ListBucket,
    LookAtObject,
    ReadObject,
    WriteCatalog,
}

impl std::fmt::Display for Doing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::backend::local::journal::JOURNAL_FILE;
        use crate::catalog::STATE_FILE;
        match self {
            Doing::OpenFolder => f.write_str("cannot open the destination root"),
            Doing::Read(path) => write!(f, "cannot read {path}"),
            Doing::FinishJournal => {
                f.write_str("cannot finish the interrupted publication recorded in its journal")
            }
            Doing::ListFolder => f.write_str("cannot list the destination root"),
            Doing::Switch(release) => write!(f, "cannot point the link at release {release}"),
            Doing::Delete(path) => write!(f, "cannot delete {path}"),
            Doing::Write(path) => write!(f, "cannot write {path}"),
            Doing::StageDeletions => {
                write!(f, "cannot write {JOURNAL_FILE} and the new {STATE_FILE}")
            }
            Doing::SyncDeletions => f.write_str("cannot sync the deletions"),
            Doing::RemoveJournal => write!(f, "cannot remove {JOURNAL_FILE}"),
            Doing::OpenBucket => f.write_str("cannot open the bucket"),
            Doing::ReadCatalog => f.write_str("cannot read the catalog"),
            Doing::Recover => f.write_str("cannot recover an unfinished publication"),
            Doing::ReadLease => f.write_str("cannot read the lease setting"),
            Doing::Prune => f.write_str("cannot prune"),
            Doing::ListPending => f.write_str("cannot list the pending publications"),
            Doing::ReadPending => f.write_str("cannot read a pending publication"),
            Doing::ListBucket => f.write_str("cannot list the root"),
            Doing::LookAtObject => f.write_str("cannot look at a managed object"),
            Doing::ReadObject => f.write_str("cannot read a managed object"),
            Doing::WriteCatalog => f.write_str("cannot write the catalog"),
        }
    }
}

impl std::fmt::Display for StorageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let StorageFault {
            root,
            doing,
            source,
        } = self;
        match source {
            StorageError::Io(e) => write!(
                f,
                "{root}: {doing}: {e}; check the folder's permissions and free space, then run the command again"
            ),
            StorageError::S3(e) => {
                use crate::s3::{Error, Failure};
                let text = e.to_string();
                let text = text.strip_prefix(&format!("{root}: ")).unwrap_or(&text);
                // The failure's own text already says what to correct for
                // refused credentials, denied access and a missing bucket.
                let hint = match &**e {
                    Error::Store {
                        failure:
                            Failure::CredentialsRefused | Failure::Denied | Failure::BucketMissing,
                        ..
                    } => "",
                    Error::Store { .. } => {
                        "; check the endpoint, the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the publisher's bucket permissions, then run the command again"
                    }
                    Error::Conflict { .. } | Error::Changed { .. } => {
                        " (other publishers kept changing the root; run the command again)"
                    }
                    _ => "",
                };
                write!(f, "{root}: {doing}: {text}{hint}")
            }
        }
    }
}

impl std::error::Error for StorageFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.source {
            StorageError::Io(e) => Some(e),
            StorageError::S3(e) => Some(&**e),
        }
    }
}

impl StorageFault {
    /// Whether the bucket's client could not be set up (missing
    /// credentials, a bad setting): a configuration error.
    pub(crate) fn is_config(&self) -> bool {
        matches!(&self.source, StorageError::S3(e) if e.stage() == crate::report::Stage::Config)
    }
}

/// Turns an I/O error of the local root at `root` into a [`Fault`] saying
/// what was being done.
pub(crate) fn io_fault(root: &std::path::Path, doing: Doing) -> impl FnOnce(io::Error) -> Fault {
    let root = root.display().to_string();
    move |e| {
        Fault::Storage(StorageFault {
            root,
            doing,
            source: StorageError::Io(e),
        })
    }
}

/// Turns an error of the bucket `root` (its label) into a [`Fault`] saying
/// what was being done.
pub(crate) fn s3_fault(root: &str, doing: Doing) -> impl FnOnce(crate::s3::Error) -> Fault {
    let root = root.to_owned();
    move |e| {
        Fault::Storage(StorageFault {
            root,
            doing,
            source: StorageError::S3(Box::new(e)),
        })
    }
}

impl From<LockError> for Fault {
    fn from(e: LockError) -> Fault {
        Fault::Lock(e)
    }
}

/// A state file that maintenance refuses, changing nothing.
#[derive(Debug)]
pub(crate) enum Refused {
    Invalid { reason: String },
    Future { schema_version: u64 },
    Legacy { schema_version: u64 },
}

/// The catalog `state` holds (`None`: no state file), when maintenance
/// can work on it.
pub(crate) fn usable(state: State) -> Result<Option<Catalog>, Fault> {
    match state {
        State::Absent => Ok(None),
        State::Catalog(c) => Ok(Some(c)),
        State::Invalid { reason } => Err(Fault::Unusable(Refused::Invalid { reason })),
        State::Future { schema_version } => {
            Err(Fault::Unusable(Refused::Future { schema_version }))
        }
        State::Legacy { schema_version } => {
            Err(Fault::Unusable(Refused::Legacy { schema_version }))
        }
    }
}
