//! A process-wide request to stop long work (docs/contract.md §12.4): set once when the
//! agent is told to stop, and checked between chunks by every loop that
//! hashes or copies a file, so a terabyte-sized file cannot keep the agent
//! from stopping. The work it interrupts fails with [`Stopped`]; the agent
//! then leaves the bundle in `work/`, to be resumed at the next start.
//!
//! Knows nothing about signals: the agent decides when to call [`request`].

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Process-wide on purpose, not in `ProcessState`: it is one request for
/// the whole process, set where a signal arrives and read by loops that
/// are handed nothing else (docs/architecture.md, "What a process keeps").
static STOP: AtomicBool = AtomicBool::new(false);

/// Asks every hashing and copying loop to give up at its next chunk.
pub fn request() {
    STOP.store(true, Ordering::SeqCst);
}

/// True once [`request`] was called.
pub fn requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// The error of work given up because a stop was requested.
#[derive(Debug, thiserror::Error)]
#[error("stopped: the agent is shutting down; the bundle is resumed at the next start")]
pub struct Stopped;

/// `Err` carrying [`Stopped`] once a stop was requested.
pub fn check() -> io::Result<()> {
    if requested() {
        Err(io::Error::new(io::ErrorKind::Interrupted, Stopped))
    } else {
        Ok(())
    }
}

/// True for the error [`check`] returns.
pub fn is_stopped(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

#[cfg(test)]
mod tests {
    #[test]
    fn stopped_errors_are_recognised() {
        let e = std::io::Error::new(std::io::ErrorKind::Interrupted, super::Stopped);
        assert!(super::is_stopped(&e));
        assert!(!super::is_stopped(&std::io::Error::from(
            std::io::ErrorKind::Interrupted
        )));
    }
}
