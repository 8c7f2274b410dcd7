//! distributor: a file-watching spool agent that verifies bundles against
//! their manifests and publishes them into catalogued destination roots.

pub mod bundle;
pub mod catalog;
pub mod config;
pub mod hashing;
pub mod lock;
pub mod paths;
pub mod plan;
pub mod render;
pub mod storage;
