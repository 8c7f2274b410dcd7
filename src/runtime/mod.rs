//! What a process runs with, whatever it does: the clock, the exit codes,
//! the logger, the stop token ([`interrupt`]), the caches one process keeps
//! ([`process_state`]), the threads that share work out ([`workers`]), the
//! progress of the bundle in hand, and the failpoints of the test build.

pub(crate) mod clock;
pub(crate) mod exit;
pub mod failpoint;
pub(crate) mod interrupt;
pub mod logging;
pub(crate) mod process_state;
pub(crate) mod progress;
pub(crate) mod workers;
