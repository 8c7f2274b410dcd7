//! How a command ends when it does not succeed: what [`super::run`] says
//! about it and the exit code it maps to (docs/contract.md §9), decided
//! here once. Commands return an [`Outcome`]; none returns a number.

use crate::agent::AgentError;
use crate::bundle::SealError;
use crate::maintain::MaintainError;
use crate::report::RunError;
use crate::runtime::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::spool::FailedError;
use crate::text::escape::inert;

/// What a command returns.
pub(super) type Outcome = Result<(), Error>;

#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    /// A usage or configuration error: the command line or the config
    /// does not allow what was asked.
    #[error("{0}")]
    Usage(String),
    /// The command could not do what it was asked.
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Maintain(#[from] MaintainError),
    /// Names and messages of the failed spool come from producers.
    #[error("{}", inert(&.0.to_string()))]
    Spool(#[from] FailedError),
    #[error(transparent)]
    Seal(#[from] SealError),
    /// Logged (the agent's output is its log), not printed.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The command's own output already says what went wrong (a result
    /// document, the problems found, a line per failed item): only the
    /// exit code is left to give.
    #[error("{0:?}")]
    Told(Told),
}

/// What the output of a command that [`Error::Told`] already said.
#[derive(Debug)]
pub(super) enum Told {
    /// Failures, invalid bundles or problems found.
    Failure,
    /// A usage or configuration error.
    Usage,
    /// A publication's result, with its error.
    Run(RunError),
    /// An error already told (one of several a command went on after).
    Error(Box<Error>),
}

impl Error {
    /// The process exit code.
    pub(super) fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Told(Told::Usage) => EXIT_USAGE,
            Error::Failed(_) | Error::Told(Told::Failure) => EXIT_FAILURE,
            Error::Maintain(e) => e.exit_code(),
            Error::Spool(e) => e.exit_code(),
            Error::Seal(e) => e.exit_code(),
            Error::Agent(e) => e.exit_code(),
            Error::Told(Told::Run(e)) => e.exit_code(),
            Error::Told(Told::Error(e)) => e.exit_code(),
        }
    }

    /// Says what went wrong, unless the command's output already did.
    pub(super) fn tell(&self) {
        match self {
            Error::Told(_) => {}
            // Logged under the module that failed, not under cli: what an
            // operator filters the journal by.
            Error::Agent(e) => {
                let target = match e {
                    AgentError::Config(_) => "distributor::config",
                    AgentError::Start(_) | AgentError::Spool(_) => "distributor::agent",
                };
                log::error!(target: target, "{e}");
            }
            e => eprintln!("error: {e}"),
        }
    }
}

/// `Ok`, or the failure the output already told of.
pub(super) fn told_unless(ok: bool) -> Outcome {
    if ok {
        Ok(())
    } else {
        Err(Error::Told(Told::Failure))
    }
}
