//! distributor: a file-watching spool agent that verifies bundles against
//! their manifests and publishes them into catalogued destination roots.
//!
//! The crate's documentation is for its developers: build it with
//! `cargo doc --document-private-items` (CI does, warnings denied), so a
//! public item may link to the private ones it is made of.
#![allow(rustdoc::private_intra_doc_links)]

// The layers, from the bottom: `text`, `runtime` and `fs`; the model
// (`paths`, `catalog`, `config`, `scope`, `plan`, `report`); the
// backends (`backend`, `s3`); the engine (`bundle`, `signature`,
// `render`, `publish`, `hooks`, `maintain`); the agent (`spool`,
// `agent`, `metrics`); and `cli` on top. Public only what the binary,
// the examples and the integration tests use.
mod agent;
mod backend;
mod bundle;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod fs;
mod hooks;
mod intake;
mod maintain;
mod metrics;
pub mod paths;
mod plan;
mod publish;
pub mod render;
pub mod report;
pub mod runtime;
pub mod s3;
mod scope;
pub mod signature;
mod spool;
mod text;

#[cfg(test)]
mod fuzzing;
