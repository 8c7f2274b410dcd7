//! The exit codes of every command: the one table of docs/contract.md §9.
//! Each error type says which row it is; the numbers live only here.

/// Success.
pub const EXIT_OK: u8 = 0;
/// Runtime failures, invalid bundles and problems found.
pub const EXIT_FAILURE: u8 = 1;
/// Usage and configuration errors.
pub const EXIT_USAGE: u8 = 2;
/// A publication refused by planning, and state maintenance refuses.
pub const EXIT_REFUSED: u8 = 3;
/// The agent cut short by a second stop signal (docs/operations.md, the
/// exit codes of `agent`): 128 + `SIGINT`, as a shell reports a process an
/// interrupt ended.
pub const EXIT_INTERRUPTED: u8 = 130;
