//! The per-root advisory lock: an exclusive `flock(2)` on
//! `<root>/.distributor.lock`, held through an RAII guard.
//!
//! The lock file is created once and never replaced or deleted, so every
//! process (and an operator's `flock` command) locks the same inode.

use crate::fs::storage::Root;
use std::fs::{File, TryLockError};
use std::io;
use std::time::{Duration, Instant};

/// Name of the lock file at the top of every destination root.
pub const LOCK_FILE: &str = ".distributor.lock";

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "timed out after {} waiting for the lock on {root}/{LOCK_FILE}: another distributor process or an operator's flock holds it; if it persists, find the holder with `fuser {root}/{LOCK_FILE}`",
        seconds(*waited)
    )]
    Timeout { root: String, waited: Duration },
    #[error(
        "cannot open lock file {root}/{LOCK_FILE}: {source}; the agent's user must be able to create and read it (it is the agent's, mode 0640), and it must be a regular file (not a link)"
    )]
    Io {
        root: String,
        #[source]
        source: io::Error,
    },
}

/// A wait for people: tenths of a second (`2.0s`, `0.1s`), never nanoseconds.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct RootLock {
    _file: File,
}

/// The mode a lock file is created with, and the most it keeps: the
/// agent's user and group only. `flock(2)` takes an exclusive lock through
/// any descriptor, a read-only one too, so a lock file others may read is
/// one any local user can hold for ever, stopping every publication to
/// the root (docs/security.md, "Who may hold a root's lock").
const LOCK_MODE: u32 = 0o640;

/// Opens the lock file read-only (all `flock` needs; an operator in the
/// agent's group may open it too), creating it with [`LOCK_MODE`] when
/// `create`, without following a link or blocking on a FIFO. A lock file
/// that others may open (an older version created them 0644) loses those
/// bits here.
fn open_lock_file(root: &Root, create: bool) -> io::Result<Option<File>> {
    use rustix::fs::{Mode, OFlags, fchmod, fstat, openat};
    let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    if create {
        flags |= OFlags::CREATE;
    }
    let fd = match openat(root.dir(), LOCK_FILE, flags, Mode::from_raw_mode(LOCK_MODE)) {
        Ok(fd) => fd,
        Err(e) if !create && e == rustix::io::Errno::NOENT => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let stat = fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::other("it is not a regular file"));
    }
    let mode = stat.st_mode & 0o7777;
    // Only a lock file of its own (a dry run, which changes nothing, and
    // one an operator's flock created, which narrowing could lock this
    // process out of, are only warned about).
    let own = stat.st_uid == rustix::process::geteuid().as_raw();
    if mode & 0o007 != 0 && !(create && own) {
        log::warn!(
            "{}/{LOCK_FILE} is mode {mode:o}: any local user can hold it and stop publication to the root; its owner (or root) should `chmod o= {}/{LOCK_FILE}`",
            root.path().display(),
            root.path().display()
        );
    } else if mode & 0o007 != 0 {
        let narrowed = mode & 0o770;
        match fchmod(&fd, Mode::from_raw_mode(narrowed)) {
            Ok(()) => log::info!(
                "{}/{LOCK_FILE}: was mode {mode:o}, which let any local user hold the root's lock; now {narrowed:o}",
                root.path().display()
            ),
            Err(e) => log::warn!(
                "{}/{LOCK_FILE} is mode {mode:o}: any local user can hold it and stop publication to the root, and this process may not change that ({e}); its owner (or root) should `chmod o= {}/{LOCK_FILE}`",
                root.path().display(),
                root.path().display()
            ),
        }
    }
    Ok(Some(File::from(fd)))
}

/// Takes the lock, creating the lock file if needed, waiting up to
/// `timeout`. Logs once when it has to wait.
pub fn acquire(root: &Root, timeout: Duration) -> Result<RootLock, LockError> {
    let file = open_lock_file(root, true)
        .map_err(|source| LockError::Io {
            root: root.path().display().to_string(),
            source,
        })?
        .ok_or_else(|| LockError::Io {
            root: root.path().display().to_string(),
            source: io::Error::from(io::ErrorKind::NotFound),
        })?;
    wait_for(file, root, timeout)
}

/// Takes the lock only if the lock file already exists (dry runs create
/// nothing). `Ok(None)` when there is no lock file.
pub fn acquire_existing(root: &Root, timeout: Duration) -> Result<Option<RootLock>, LockError> {
    let file = open_lock_file(root, false).map_err(|source| LockError::Io {
        root: root.path().display().to_string(),
        source,
    })?;
    match file {
        Some(file) => wait_for(file, root, timeout).map(Some),
        None => Ok(None),
    }
}

fn wait_for(file: File, root: &Root, timeout: Duration) -> Result<RootLock, LockError> {
    let start = Instant::now();
    let mut logged = false;
    let mut pause = Duration::from_millis(2);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(RootLock { _file: file }),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => {
                return Err(LockError::Io {
                    root: root.path().display().to_string(),
                    source,
                });
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(LockError::Timeout {
                root: root.path().display().to_string(),
                waited,
            });
        }
        if !logged {
            log::info!(
                "waiting for the lock on {}/{LOCK_FILE} (up to {})",
                root.path().display(),
                seconds(timeout)
            );
            logged = true;
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_times_out_until_the_first_drops() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap().unwrap();
        let held = acquire(&root, Duration::from_secs(1)).unwrap();
        let err = acquire(&root, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        drop(held);
        assert!(acquire(&root, Duration::from_millis(50)).is_ok());
    }

    #[test]
    fn waits_are_shown_in_tenths_of_a_second() {
        for (d, want) in [
            (Duration::from_nanos(2_000_134_976), "2.0s"),
            (Duration::from_millis(100), "0.1s"),
            (Duration::from_millis(30_049), "30.0s"),
            (Duration::ZERO, "0.0s"),
        ] {
            assert_eq!(seconds(d), want);
        }
        let e = LockError::Timeout {
            root: "/srv/x".into(),
            waited: Duration::from_nanos(2_000_134_976),
        };
        let text = e.to_string();
        assert!(text.contains("timed out after 2.0s waiting"), "{text}");
        assert!(!text.contains("retries"), "{text}");
    }

    #[test]
    fn acquire_existing_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap().unwrap();
        assert!(acquire_existing(&root, Duration::ZERO).unwrap().is_none());
        assert!(!tmp.path().join(LOCK_FILE).exists());
    }
}
