//! How far the bundle in hand has got: files and bytes read so far (docs/contract.md
//! §14.4). Hashing and copying count into the [`Progress`] entered on their
//! thread; the agent enters one around each publication (and hands it to the
//! threads it lends to publishing) and logs it while the work takes long.
//! Nothing is counted when no progress is entered (the `run` command).
//!
//! Knows nothing about threads beyond its thread-local slot.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Files and bytes read so far by one piece of work.
#[derive(Debug, Default)]
pub struct Progress {
    bytes: AtomicU64,
    files: AtomicU64,
}

impl Progress {
    /// (files, bytes) read so far.
    pub fn done(&self) -> (u64, u64) {
        (
            self.files.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

thread_local! {
    /// The progress entered on this thread ([`Progress`]). Per thread on
    /// purpose: the hashing and copying loops count into it without being
    /// handed it (docs/architecture.md, "What a process keeps").
    static CURRENT: RefCell<Option<Arc<Progress>>> = const { RefCell::new(None) };
}

/// Counts this thread's reading into `progress` until the guard is dropped.
pub fn enter(progress: Option<Arc<Progress>>) -> Entered {
    let before = CURRENT.with(|c| c.replace(progress));
    Entered { before }
}

/// Restores the thread's previous progress when dropped.
pub struct Entered {
    before: Option<Arc<Progress>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let before = self.before.take();
        CURRENT.with(|c| *c.borrow_mut() = before);
    }
}

/// The progress entered on this thread, to hand to another thread.
pub fn current() -> Option<Arc<Progress>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// `n` more bytes were read.
pub fn add_bytes(n: u64) {
    CURRENT.with(|c| {
        if let Some(p) = c.borrow().as_ref() {
            p.bytes.fetch_add(n, Ordering::Relaxed);
        }
    });
}

/// One more file was read to its end.
pub fn file_done() {
    CURRENT.with(|c| {
        if let Some(p) = c.borrow().as_ref() {
            p.files.fetch_add(1, Ordering::Relaxed);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_go_to_the_entered_progress_and_stop_when_left() {
        add_bytes(5); // nothing entered: not counted anywhere
        let p = Arc::new(Progress::default());
        {
            let _in = enter(Some(p.clone()));
            add_bytes(10);
            file_done();
            let inner = Arc::new(Progress::default());
            {
                let _nested = enter(Some(inner.clone()));
                add_bytes(1);
            }
            assert_eq!(inner.done(), (0, 1));
            add_bytes(2);
            let handed = current().unwrap();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let _t = enter(Some(handed));
                    add_bytes(100);
                });
            });
        }
        add_bytes(1000);
        assert_eq!(p.done(), (1, 112));
    }
}
