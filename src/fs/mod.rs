//! The file-system layer: every operation on a destination root
//! ([`storage`], beneath an open handle, never following a link), on a
//! spool folder or a bundle ([`spoolfs`]), the one atomic replace of a file
//! ([`replace_file`]), the root lock ([`lock`]), streaming hashes
//! ([`hashing`]) and the one rule that tells a transient I/O error from a
//! permanent one ([`io_class`]). Nothing here decides what to publish.

pub mod hashing;
pub(crate) mod io_class;
pub(crate) mod lock;
pub(crate) mod replace_file;
pub(crate) mod spoolfs;
pub(crate) mod storage;
pub(crate) mod users;
