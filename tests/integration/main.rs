//! Integration tests: run the real binary in temporary folders.

mod util;

mod agent;
mod bundle_cmd;
mod config_cmd;
mod crash;
mod hostile;
mod maintain;
mod race;
mod run;
