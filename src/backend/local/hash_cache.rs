//! What the files of a root looked like when the agent last knew their
//! bytes: `.distributor-seen`, which lets a large publication tell an
//! unchanged output without reading it again.
//!
//! One line per file: the device, inode, size and change time of the file,
//! the SHA-256 of its bytes at that moment, and its path. The kernel sets
//! a file's change time (ctime) to the current time on every write,
//! truncation, rename, chmod or time stamp change, and no call sets it to
//! another value; so a regular file that still has the device, inode, size
//! and change time of a line holds the bytes that line names. Anything
//! else (no line, another inode, a newer change time, a file of this name
//! that is unreadable or was cut short) means "read and hash the file", as
//! if this file did not exist.
//!
//! It is a cache, never the only evidence of anything: losing it, or a
//! crash while it is replaced (atomically, like the catalog), costs a
//! re-hash. Its limit of trust: someone who can both write the root and
//! set the system clock back can forge a change time; such a user can
//! rewrite the catalog too.

use crate::catalog::Sha256;
use crate::fs::storage::Root;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::io::{self, BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The reserved file at the top of a local root.
pub const SEEN_FILE: &str = ".distributor-seen";

const HEADER: &str = "distributor-seen 1";

pub use crate::fs::storage::Look;

/// The lines of a root's `.distributor-seen`, by path.
#[derive(Default)]
pub struct HashCache {
    /// A fingerprint of each line's look and SHA-256, keyed by a hash of
    /// its path (16 bytes a file, not 80: a tree's catalog is what bounds a
    /// publication's memory). Both hashes are keyed anew in each process,
    /// so no content of the file can be made to collide on purpose; by
    /// chance, two different lines share a fingerprint once in 2^64.
    ///
    /// Two paths with one key keep one line between them, which only
    /// costs a re-hash of the other; a line found for the wrong path is
    /// harmless too: it must match the file at the path asked about (its
    /// inode and change time) and the bytes wanted.
    lines: HashMap<u64, u64>,
    keys: RandomState,
    /// How many times [`HashCache::vouches`] said yes.
    vouched: AtomicUsize,
}

impl HashCache {
    fn key(&self, path: &str) -> u64 {
        self.keys.hash_one(("path", path))
    }

    fn fingerprint(&self, look: &Look, sha256: &Sha256) -> u64 {
        let l = look;
        self.keys.hash_one((
            "look",
            l.dev,
            l.ino,
            l.size,
            l.ctime,
            l.ctime_nsec,
            sha256.0,
        ))
    }

    /// Reads the root's file; empty when it is missing or not in this
    /// format (a line that does not parse is skipped).
    pub fn read(root: &Root) -> HashCache {
        let mut seen = HashCache::default();
        let file = match root.open_reserved(SEEN_FILE) {
            Ok(Some(file)) => file,
            Ok(None) => return seen,
            Err(e) => {
                log::debug!(
                    "{}/{SEEN_FILE}: not read ({e}); unchanged outputs are hashed again",
                    root.path().display()
                );
                return seen;
            }
        };
        let mut lines = io::BufReader::new(file).lines();
        if !matches!(lines.next(), Some(Ok(ref h)) if h == HEADER) {
            return seen;
        }
        for line in lines {
            let Ok(line) = line else { break };
            if let Some((path, look, sha)) = parse_line(&line) {
                let (key, fingerprint) = (seen.key(path), seen.fingerprint(&look, &sha));
                seen.lines.insert(key, fingerprint);
            }
        }
        seen
    }

    /// True when the file whose look is `now`, at `path`, is known to hold
    /// the bytes whose SHA-256 is `sha256`.
    pub fn vouches(&self, path: &str, sha256: &Sha256, now: &Look) -> bool {
        let yes = self
            .lines
            .get(&self.key(path))
            .is_some_and(|f| *f == self.fingerprint(now, sha256));
        if yes {
            self.vouched.fetch_add(1, Ordering::Relaxed);
        }
        yes
    }

    /// Vouches from now on for `path` holding `sha256` while it looks as
    /// `look` (a file known to hold those bytes by other means).
    pub fn carry(&mut self, path: &str, look: &Look, sha256: &Sha256) {
        let key = self.key(path);
        let fingerprint = self.fingerprint(look, sha256);
        self.lines.insert(key, fingerprint);
    }

    /// How many files this has vouched for so far.
    pub fn vouched(&self) -> usize {
        self.vouched.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lines.len()
    }
}

fn parse_line(line: &str) -> Option<(&str, Look, Sha256)> {
    let mut fields = line.splitn(7, ' ');
    let look = Look {
        dev: fields.next()?.parse().ok()?,
        ino: fields.next()?.parse().ok()?,
        size: fields.next()?.parse().ok()?,
        ctime: fields.next()?.parse().ok()?,
        ctime_nsec: fields.next()?.parse().ok()?,
    };
    let sha = Sha256::parse(fields.next()?)?;
    Some((fields.next()?, look, sha))
}

/// Replaces the root's file with `lines` (path, look, SHA-256), without
/// a fsync: the caller's barrier makes it durable with the catalog. The
/// lines are made as they are written; an error making one is the result.
pub fn write<'a>(
    root: &Root,
    lines: impl Iterator<Item = io::Result<(&'a str, Look, &'a Sha256)>>,
) -> io::Result<()> {
    let mut lines = lines.peekable();
    root.write_reserved_unsynced(SEEN_FILE, &mut |w| {
        let mut w = io::BufWriter::with_capacity(1 << 16, w);
        writeln!(w, "{HEADER}")?;
        for line in lines.by_ref() {
            let (path, look, sha) = line?;
            writeln!(
                w,
                "{} {} {} {} {} {sha} {path}",
                look.dev, look.ino, look.size, look.ctime, look.ctime_nsec
            )?;
        }
        w.flush()
    })
    .map(drop)
}

/// Waits until a change made now gives a file a newer change time than
/// `path` has: change times come from a coarse clock, and two changes
/// within one of its ticks get the same one. For tests that change a file
/// and need the change to show.
#[cfg(test)]
pub(crate) fn wait_for_a_newer_change_time(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let stamp = |m: &std::fs::Metadata| (m.ctime(), m.ctime_nsec());
    let old = stamp(&std::fs::symlink_metadata(path).unwrap());
    let mut probe = tempfile::tempfile().unwrap();
    loop {
        probe.write_all(b"x").unwrap();
        if stamp(&probe.metadata().unwrap()) > old {
            return;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(ino: u64, ctime_nsec: i64) -> Look {
        Look {
            dev: 2049,
            ino,
            size: 10,
            ctime: 1_764_547_200,
            ctime_nsec,
        }
    }

    #[test]
    fn lines_written_are_read_back_and_vouch_only_for_the_same_look_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap().unwrap();
        let a = Sha256([1; 32]);
        let b = Sha256([2; 32]);
        write(
            &root,
            [("x/a b.html", look(7, 5), &a), ("y", look(8, 6), &b)]
                .into_iter()
                .map(Ok),
        )
        .unwrap();
        let seen = HashCache::read(&root);
        assert_eq!(seen.len(), 2);
        assert!(seen.vouches("x/a b.html", &a, &look(7, 5)));
        assert!(seen.vouches("y", &b, &look(8, 6)));
        // Other bytes wanted, a newer change time, another inode, another
        // size, another path: hash again.
        assert!(!seen.vouches("x/a b.html", &b, &look(7, 5)));
        assert!(!seen.vouches("x/a b.html", &a, &look(7, 6)));
        assert!(!seen.vouches("x/a b.html", &a, &look(9, 5)));
        assert!(!seen.vouches(
            "x/a b.html",
            &a,
            &Look {
                size: 11,
                ..look(7, 5)
            }
        ));
        assert!(!seen.vouches("x/a", &a, &look(7, 5)));
    }

    #[test]
    fn a_look_taken_soon_after_a_change_is_not_recorded() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |secs: u64, millis: u64| UNIX_EPOCH + Duration::from_millis(secs * 1000 + millis);
        let l = look(7, 500_000_000); // changed at 1764547200.5
        assert_eq!(l.settled(at(1_764_547_200, 600)), Some(l));
        assert_eq!(l.settled(at(1_764_547_200, 549)), None);
        assert_eq!(l.settled(at(1_764_547_200, 400)), None);
        assert_eq!(Look { ctime: -1, ..l }.settled(at(1_764_547_201, 0)), None);
    }

    #[test]
    fn a_missing_foreign_or_damaged_file_vouches_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap().unwrap();
        assert_eq!(HashCache::read(&root).len(), 0);
        let sha = Sha256([3; 32]);
        let good = format!("1 7 10 1764547200 5 {sha} a");
        for text in [
            format!("distributor-seen 2\n{good}\n"),
            format!("{good}\n"),
            "distributor-seen 1\n1 7 x 1764547200 5 sha256:00 a\n1 7\n".to_owned(),
        ] {
            std::fs::write(dir.path().join(SEEN_FILE), text).unwrap();
            assert_eq!(HashCache::read(&root).len(), 0);
        }
        // A line cut short is skipped, the others still count.
        std::fs::write(
            dir.path().join(SEEN_FILE),
            format!("{HEADER}\n{good}\n1 8 10 1764547200 5 {sha}"),
        )
        .unwrap();
        let seen = HashCache::read(&root);
        assert_eq!(seen.len(), 1);
        // A symlink is never followed.
        std::fs::remove_file(dir.path().join(SEEN_FILE)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(SEEN_FILE)).unwrap();
        assert_eq!(HashCache::read(&root).len(), 0);
    }
}
