//! Classifying I/O errors: the one place that decides whether an operating
//! system error is worth retrying later (transient) or fails the bundle
//! (permanent). Both reading bundles and writing roots use it; it does no
//! I/O itself.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_that_can_go_away_are_transient() {
        let table = [
            (io::Error::from_raw_os_error(libc::ENOSPC), true),
            (io::Error::from_raw_os_error(libc::EDQUOT), true),
            (io::Error::from_raw_os_error(libc::EACCES), true),
            (io::Error::from_raw_os_error(libc::EMFILE), true),
            (io::Error::from_raw_os_error(libc::EIO), true),
            (io::Error::from_raw_os_error(libc::ENOTDIR), false),
            (io::Error::from_raw_os_error(libc::ELOOP), false),
            (io::Error::from_raw_os_error(libc::EEXIST), false),
            (io::Error::from_raw_os_error(libc::ENOENT), false),
            (io::Error::other("our own message"), false),
        ];
        for (e, transient) in table {
            assert_eq!(is_transient(&e), transient, "{e}");
        }
    }
}
