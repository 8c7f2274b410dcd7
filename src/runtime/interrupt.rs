//! The one request to stop (docs/contract.md §12.4, docs/operations.md): a
//! [`Cancel`] token with the two levels the agent has. *Finish*: claim
//! nothing more, finish the bundle in hand (a batch not committed yet is
//! given back). *Abandon*: give up the hashing, copying, rendering or hook
//! in hand; the bundle stays in `work/`, to be resumed at the next start.
//! Work given up fails with the one marker [`Stopped`] (never EINTR,
//! which means "read again"), which every layer recognises through
//! [`is_stopped`].
//!
//! The agent makes the token and passes it down; the loops that hash or
//! copy a file are reached through many callers that are handed nothing
//! else, so they read the token the agent entered on their thread
//! ([`Cancel::enter`], handed on to the threads it lends, like
//! `progress`). Knows nothing about signals: the agent decides when to
//! call [`Cancel::finish`] and [`Cancel::abandon`].

use std::cell::RefCell;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A request to stop, cheap to clone (clones share it). A new one asks
/// nothing; a test makes its own.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    /// Finish the bundle in hand: this token's own.
    finish: Arc<AtomicBool>,
    /// Abandon the copy in hand: shared with the token this one was made
    /// from ([`Cancel::child`]).
    abandon: Arc<AtomicBool>,
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A token for part of the work (the pipeline threads of one config):
    /// finished on its own, abandoned with this one.
    pub fn child(&self) -> Cancel {
        Cancel {
            finish: Arc::new(AtomicBool::new(false)),
            abandon: Arc::clone(&self.abandon),
        }
    }

    /// Claim nothing more; finish the bundle in hand.
    pub fn finish(&self) {
        self.finish.store(true, Ordering::SeqCst);
    }

    /// Give up the copy in hand too.
    pub fn abandon(&self) {
        self.abandon.store(true, Ordering::SeqCst);
    }

    /// True once asked to finish (or to abandon).
    pub fn finishing(&self) -> bool {
        self.finish.load(Ordering::SeqCst) || self.abandoned()
    }

    /// True once asked to abandon.
    pub fn abandoned(&self) -> bool {
        self.abandon.load(Ordering::Relaxed)
    }

    /// `Err` carrying [`Stopped`] once asked to abandon.
    pub fn check(&self) -> io::Result<()> {
        if self.abandoned() {
            Err(stopped())
        } else {
            Ok(())
        }
    }

    /// The flag [`Cancel::finish`] sets, for a signal handler to set
    /// (it can only store into an atomic).
    pub fn finish_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.finish)
    }

    /// Makes this the token the loops on this thread check, until the
    /// guard is dropped.
    pub fn enter(&self) -> Entered {
        let before = ENTERED.with(|c| c.replace(Some(self.clone())));
        Entered { before }
    }
}

thread_local! {
    /// The token entered on this thread ([`Cancel::enter`]). Per thread on
    /// purpose: the hashing and copying loops check it without being
    /// handed it (docs/architecture.md, "What a process keeps").
    static ENTERED: RefCell<Option<Cancel>> = const { RefCell::new(None) };
}

/// Restores the thread's previous token when dropped.
pub struct Entered {
    before: Option<Cancel>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let before = self.before.take();
        ENTERED.with(|c| *c.borrow_mut() = before);
    }
}

/// The token entered on this thread, to hand to another thread.
pub fn entered() -> Option<Cancel> {
    ENTERED.with(|c| c.borrow().clone())
}

/// [`Cancel::check`] of the token entered on this thread (`Ok` when none
/// is: nothing asks the work to stop).
pub fn check_entered() -> io::Result<()> {
    ENTERED.with(|c| c.borrow().as_ref().map_or(Ok(()), Cancel::check))
}

/// [`Cancel::abandoned`] of the token entered on this thread.
pub fn entered_abandoned() -> bool {
    ENTERED.with(|c| c.borrow().as_ref().is_some_and(Cancel::abandoned))
}

/// The error of work given up because a stop was requested.
#[derive(Debug, thiserror::Error)]
#[error("stopped: the agent is shutting down; the bundle is resumed at the next start")]
pub struct Stopped;

/// The I/O error of work given up: kind `Other` carrying [`Stopped`], never
/// `Interrupted`, which `read` loops and `write_all` retry.
pub fn stopped() -> io::Error {
    io::Error::other(Stopped)
}

/// True for the error [`stopped`] makes.
pub fn is_stopped(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Stopped>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopped_errors_are_recognised_and_eintr_is_not_one() {
        assert!(is_stopped(&stopped()));
        assert_ne!(stopped().kind(), io::ErrorKind::Interrupted);
        assert!(!is_stopped(&io::Error::from(io::ErrorKind::Interrupted)));
    }

    #[test]
    fn a_child_finishes_alone_and_is_abandoned_with_its_parent() {
        let parent = Cancel::new();
        let (a, b) = (parent.child(), parent.child());
        a.finish();
        assert!(a.finishing() && !a.abandoned());
        assert!(!b.finishing() && !parent.finishing());
        assert!(a.check().is_ok());
        parent.abandon();
        for c in [&a, &b, &parent] {
            assert!(c.finishing() && c.abandoned());
            assert!(is_stopped(&c.check().unwrap_err()));
        }
    }

    #[test]
    fn the_loops_check_the_token_entered_on_their_thread() {
        let cancel = Cancel::new();
        assert!(check_entered().is_ok());
        {
            let _entered = cancel.enter();
            assert!(check_entered().is_ok());
            cancel.abandon();
            assert!(entered_abandoned());
            assert!(is_stopped(&check_entered().unwrap_err()));
            // Another thread has its own (none here).
            std::thread::scope(|s| {
                s.spawn(|| assert!(check_entered().is_ok()));
            });
        }
        assert!(check_entered().is_ok() && entered().is_none());
    }
}
