//! distributor: a file-watching spool agent that verifies bundles against
//! their manifests and publishes them into catalogued destination roots.
//!
//! The crate's documentation is for its developers: build it with
//! `cargo doc --document-private-items` (CI does, warnings denied), so a
//! public item may link to the private ones it is made of.
#![allow(rustdoc::private_intra_doc_links)]

pub mod agent;
mod backend;
pub mod bundle;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod exit;
pub mod failpoint;
pub mod hashing;
pub mod hooks;
pub mod inert;
pub mod interrupt;
pub mod io_class;
pub mod journal;
pub mod lock;
pub mod logging;
pub mod maintain;
pub mod message;
pub mod metrics;
pub mod paths;
pub mod plan;
pub mod process_state;
pub mod progress;
pub mod publish;
pub mod remembered;
pub mod render;
pub mod render_child;
pub mod replace_file;
pub mod report;
pub mod s3;
pub mod scope;
pub mod seen;
pub mod signature;
pub mod spool;
pub mod spoolfs;
pub mod storage;
pub mod users;
pub mod workers;
