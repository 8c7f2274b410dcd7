//! Classifying I/O errors: the one place that decides whether an operating
//! system error is worth retrying later (transient) or fails the bundle
//! (permanent). Writing roots and the spool, reading bundles and the s3
//! backend's reads of a bundle all ask here; it does no I/O itself.
//!
//! Two readings differ, each for a stated reason:
//! - [`is_transient`], for what the agent writes or reads of its own (a
//!   root, the spool, its scratch files): anything this machine's operator
//!   may fix without touching the bundle (a full disk, a permission) is
//!   worth waiting for;
//! - [`is_transient_reading_bundle`], for the bytes of a bundle: a file the
//!   agent may not read is its producer's doing, who has no access to
//!   `work/` once it is claimed, so waiting changes nothing (docs/producers.md).

use std::io;

/// True for I/O errors that may go away by themselves (full disk, quota,
/// permissions being fixed, a busy or flaky device), so the bundle is worth
/// retrying later. Errors about the shape of the tree (not a folder, a
/// symlink loop) and our own messages are permanent.
pub fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSPC
                | libc::EDQUOT
                | libc::EIO
                | libc::EACCES
                | libc::EPERM
                | libc::EROFS
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOMEM
                | libc::ENOBUFS
                | libc::EAGAIN
                | libc::EINTR
                | libc::EBUSY
                | libc::ESTALE
                | libc::ETIMEDOUT
        )
    )
}

/// [`is_transient`] for an error met reading a bundle's own files: a file
/// the agent may not read (`EACCES`, `EPERM`) stays so and fails the
/// bundle, naming the fix; an interruption, a timeout or a refused
/// allocation, however it was made, may pass.
pub fn is_transient_reading_bundle(e: &io::Error) -> bool {
    // EWOULDBLOCK (EAGAIN) on a bundle's file opened without blocking is
    // a lease or lock its producer holds, and takes again whenever it
    // breaks: the producer's doing, which must not hold the pipeline
    // (docs/contract.md §12.5).
    let forbidden = matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EWOULDBLOCK)
    );
    // Given up by the agent's stop (crate::runtime::interrupt): read again at the
    // next start.
    (is_transient(e) && !forbidden)
        || crate::runtime::interrupt::is_stopped(e)
        || matches!(
            e.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::TimedOut | io::ErrorKind::OutOfMemory
        )
}

/// Whether `e` says the file system is out of space or quota: the one
/// failure that keeps a finished bundle in `work/` rather than filing it
/// without its result (`spool::finish`).
pub fn is_out_of_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (error, is_transient, is_transient_reading_bundle, is_out_of_space)
    fn table() -> Vec<(io::Error, bool, bool, bool)> {
        let os = io::Error::from_raw_os_error;
        vec![
            (os(libc::ENOSPC), true, true, true),
            (os(libc::EDQUOT), true, true, true),
            (os(libc::EACCES), true, false, false),
            (os(libc::EPERM), true, false, false),
            // A producer's file lease: transient for the agent's own files,
            // the producer's doing in a bundle.
            (os(libc::EWOULDBLOCK), true, false, false),
            (os(libc::EMFILE), true, true, false),
            (os(libc::EIO), true, true, false),
            (os(libc::EINTR), true, true, false),
            (os(libc::ETIMEDOUT), true, true, false),
            (os(libc::ENOTDIR), false, false, false),
            (os(libc::ELOOP), false, false, false),
            (os(libc::EEXIST), false, false, false),
            (os(libc::ENOENT), false, false, false),
            (io::Error::other("our own message"), false, false, false),
            (crate::runtime::interrupt::stopped(), false, true, false),
            (io::ErrorKind::Interrupted.into(), false, true, false),
            (io::ErrorKind::TimedOut.into(), false, true, false),
            (io::ErrorKind::OutOfMemory.into(), false, true, false),
            (io::ErrorKind::PermissionDenied.into(), false, false, false),
            (io::ErrorKind::StorageFull.into(), false, false, true),
        ]
    }

    #[test]
    fn each_reading_classifies_as_its_table_row_says() {
        for (e, transient, reading_bundle, out_of_space) in table() {
            assert_eq!(is_transient(&e), transient, "is_transient({e})");
            assert_eq!(
                is_transient_reading_bundle(&e),
                reading_bundle,
                "is_transient_reading_bundle({e})"
            );
            assert_eq!(is_out_of_space(&e), out_of_space, "is_out_of_space({e})");
        }
    }
}
