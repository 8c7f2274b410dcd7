//! Bundles (docs/contract.md §3): the `manifest.json` model and its strict parser, the
//! digest rule, full verification of a bundle folder against its manifest,
//! and, for producers, sealing a folder into a bundle and uploading a
//! bundle into an intake's inbox in a bucket.
//!
//! Everything on disk is reached through an open directory handle, one path
//! segment at a time, refusing symbolic links at every step. This module must
//! never read from anything but a regular file (a FIFO, socket or device is
//! never opened for reading), never hold a whole bundle file in memory, and
//! never write anything on disk except `manifest.json` (through a reserved
//! temporary name) when sealing. It knows nothing about spools, catalogs or
//! destinations.

mod error;
mod limits;
mod manifest;
mod open;
mod parse;
mod seal;
mod upload;
mod verify;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;

pub use error::{BundleError, Problem};
pub use limits::{
    Limits, check_limits, markdown_cpu_seconds, markdown_memory, markdown_memory_reached,
    markdown_too_big, markdown_too_dense, markdown_too_slow,
};
#[cfg(test)]
pub use manifest::compute_digest;
pub use manifest::{Manifest, ManifestFile};
pub use open::open_listed;
pub use parse::parse_manifest;
#[cfg(test)]
pub use seal::seal;
pub use seal::{SealError, seal_report, sign};
pub use upload::{InboxUrl, Uploaded, upload};
pub use verify::{
    SignaturePolicy, VerifiedBundle, inspect, mismatch_problem, read_manifest, verify, verify_files,
};

/// Name of the manifest inside a bundle folder.
pub const MANIFEST: &str = "manifest.json";
/// Largest manifest read where no limits are configured (`bundle verify`,
/// which needs no config): the cap that the default limits give.
pub const MAX_MANIFEST_BYTES: u64 = 200_000 * 256;
/// The only `schema_version` this build understands.
pub const SCHEMA_VERSION: u64 = 1;
/// At most this many "present but not listed" warnings are reported one by
/// one; the rest are summarised in a final warning.
pub const MAX_WARNINGS: usize = 100;
