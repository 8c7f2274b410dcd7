//! Deleting a bundle's tree from a spool folder (`done/` retention and
//! `spool delete`), and the agent's record of the `done/` entries
//! retention could not remove.
//!
//! A bundle's tree is its producer's: it may be deep, wide, hold links, and
//! hold folders the agent may not write into (a read-only folder the
//! producer owns cannot be emptied by an unprivileged agent). So deletion
//! - never follows a symbolic link (a link is removed itself);
//! - holds a few descriptors whatever the depth or width of the tree: each
//!   folder is opened by its path relative to the spool folder's descriptor
//!   (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), emptied of
//!   its files, its subfolders' names noted, and closed before going down;
//! - goes on past what it cannot remove, and says what that is and whose;
//! - never stops retention at one entry: every expired entry is tried.

use super::{Folder, Spool, spoolfs};
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{AtFlags, FileType};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime};

/// The agent's record of the `done/` entries retention could not remove,
/// kept in the pipeline's folder (where producers have no access) and
/// read by `distributor status`.
pub const RETENTION_FILE: &str = ".distributor-retention.json";
/// Most entries named in the record (the count is of all).
const MAX_RECORDED: usize = 1000;
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// A `done/` entry retention could not remove, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Undeletable {
    /// The entry of `done/`.
    pub name: String,
    /// What could not be removed, relative to `done/`.
    pub path: String,
    /// The owner of the folder holding what could not be removed (or of
    /// what could not be opened).
    pub owner_uid: Option<u32>,
    /// That owner's user name, or the number.
    pub owner: String,
    pub error: String,
}

/// What [`RETENTION_FILE`] holds.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RetentionRecord {
    /// How many entries retention could not remove.
    pub count: usize,
    /// The first [`MAX_RECORDED`] of them, by name.
    pub entries: Vec<Undeletable>,
}

impl RetentionRecord {
    pub fn of(mut blocked: Vec<Undeletable>) -> RetentionRecord {
        blocked.sort_by(|a, b| a.name.cmp(&b.name));
        let count = blocked.len();
        blocked.truncate(MAX_RECORDED);
        RetentionRecord {
            count,
            entries: blocked,
        }
    }
}

/// The entries of `now` that `previous` did not hold in the same state
/// (same entry, same thing in the way, same owner): the ones to log. An
/// entry that stays blocked is logged once, not at every pass.
pub fn newly_blocked<'a>(
    previous: &RetentionRecord,
    now: &'a [Undeletable],
) -> Vec<&'a Undeletable> {
    let same = |a: &Undeletable, b: &Undeletable| {
        a.name == b.name && a.path == b.path && a.owner_uid == b.owner_uid
    };
    now.iter()
        .filter(|u| !previous.entries.iter().any(|p| same(p, u)))
        .collect()
}

/// The record of the last retention pass (empty when there is none or it
/// cannot be read).
pub fn retention_record(spool: &Spool) -> RetentionRecord {
    let path = spool.pipeline_folder().join(RETENTION_FILE);
    spoolfs::read_capped_at(&path, MAX_RECORD_BYTES)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Replaces the record of retention.
pub fn record_retention(spool: &Spool, record: &RetentionRecord) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    let folder = spoolfs::open_folder_io(spool.pipeline_folder())?;
    spoolfs::replace(&folder, RETENTION_FILE, &bytes, false)
}

/// What a retention pass did.
#[derive(Debug, Default)]
pub struct Expiry {
    /// Entries removed.
    pub removed: usize,
    /// Expired entries that could not be removed (all of them: one never
    /// stops the others).
    pub blocked: Vec<Undeletable>,
}

/// Deletes the `done/` entries modified longer than `retention` ago (none
/// when it is zero), and tries again those of `earlier` (the entries an
/// earlier pass could not remove: removing what it could changed their
/// modification time). Errs only when `done/` itself cannot be read.
pub fn expire_done(
    spool: &Spool,
    retention: Duration,
    earlier: &RetentionRecord,
) -> io::Result<Expiry> {
    let mut expiry = Expiry::default();
    if retention.is_zero() {
        return Ok(expiry);
    }
    let done = match spoolfs::open_folder_io(spool.folder(Folder::Done)) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(expiry),
        Err(e) => return Err(e),
    };
    let now = SystemTime::now();
    let mut expired = Vec::new();
    for entry in done.entries()? {
        let Ok(entry) = entry else { continue };
        // Not following a link: the entry's own time.
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        let modified = modified.into_std();
        let name = entry.file_name();
        let again = earlier
            .entries
            .iter()
            .any(|u| OsStr::new(&u.name) == name.as_os_str());
        if again || now.duration_since(modified).unwrap_or_default() > retention {
            expired.push(name);
        }
    }
    expired.sort();
    for name in expired {
        let removal = remove_entry(done.as_fd(), &name);
        match removal.blocked {
            None => expiry.removed += 1,
            Some(b) => expiry.blocked.push(b.undeletable(&name)),
        }
    }
    Ok(expiry)
}

/// What [`remove_entry`] did.
#[derive(Debug, Default)]
pub(super) struct Removal {
    /// Files (anything but folders) and their bytes removed.
    pub(super) files: u64,
    pub(super) bytes: u64,
    /// The first thing that could not be removed; the entry is then still
    /// there (with whatever else could not be removed).
    pub(super) blocked: Option<Blocker>,
}

/// Something that could not be removed.
#[derive(Debug)]
pub(super) struct Blocker {
    /// Relative to the folder the entry was in.
    pub(super) path: Vec<OsString>,
    pub(super) owner: Option<u32>,
    pub(super) error: io::Error,
}

impl Blocker {
    pub(super) fn shown_path(&self) -> String {
        let parts: Vec<String> = self
            .path
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        parts.join("/")
    }

    /// "belongs to uid 60001 (name)", or nothing when unknown.
    pub(super) fn owner_text(&self) -> String {
        self.owner.map_or_else(String::new, |uid| {
            format!(
                " (its folder belongs to uid {uid}, {})",
                crate::fs::users::user_name(uid)
            )
        })
    }

    fn undeletable(self, name: &OsStr) -> Undeletable {
        Undeletable {
            name: name.to_string_lossy().into_owned(),
            path: self.shown_path(),
            owner_uid: self.owner,
            owner: self
                .owner
                .map_or_else(String::new, crate::fs::users::user_name),
            error: self.error.to_string(),
        }
    }
}

impl Removal {
    fn block(&mut self, path: Vec<OsString>, owner: Option<u32>, error: io::Error) {
        if self.blocked.is_none() {
            self.blocked = Some(Blocker { path, owner, error });
        }
    }
}

/// One folder on the way down: its name, the subfolders not yet removed.
struct Frame {
    name: OsString,
    subfolders: Vec<OsString>,
    listed: bool,
    /// Something below could not be removed, so this folder cannot be.
    failed: bool,
}

/// Removes the entry `name` of the folder `top` with everything below it,
/// links removed and never followed, holding at most three descriptors
/// besides `top` at any time. What cannot be removed is passed over (the
/// rest goes) and the first such thing is reported.
pub(super) fn remove_entry(top: BorrowedFd<'_>, name: &OsStr) -> Removal {
    let mut removal = Removal::default();
    let stat = match rustix::fs::statat(top, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(s) => s,
        Err(rustix::io::Errno::NOENT) => return removal,
        Err(e) => {
            removal.block(vec![name.to_owned()], owner_of(top), e.into());
            return removal;
        }
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        match rustix::fs::unlinkat(top, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {
                removal.files += 1;
                removal.bytes += stat.st_size as u64;
            }
            Err(e) => removal.block(vec![name.to_owned()], owner_of(top), e.into()),
        }
        return removal;
    }
    let mut frames = vec![Frame {
        name: name.to_owned(),
        subfolders: Vec::new(),
        listed: false,
        failed: false,
    }];
    while let Some(last) = frames.last() {
        if !last.listed {
            let path: Vec<&OsStr> = frames.iter().map(|f| f.name.as_os_str()).collect();
            let listed = empty_folder(top, &path, &mut removal);
            let last = frames.last_mut().expect("a frame");
            last.listed = true;
            match listed {
                // What is below still goes (its space comes back) even
                // when this folder must stay.
                Some((subfolders, failed)) => {
                    last.subfolders = subfolders;
                    last.failed = failed;
                }
                None => last.failed = true,
            }
            continue;
        }
        let depth = frames.len();
        if let Some(sub) = frames[depth - 1].subfolders.pop() {
            frames.push(Frame {
                name: sub,
                subfolders: Vec::new(),
                listed: false,
                failed: false,
            });
            continue;
        }
        let frame = frames.pop().expect("a frame");
        let mut failed = frame.failed;
        if !failed {
            let parent: Vec<&OsStr> = frames.iter().map(|f| f.name.as_os_str()).collect();
            let mut path: Vec<OsString> = parent.iter().map(|p| (*p).to_owned()).collect();
            path.push(frame.name.clone());
            let opened = if parent.is_empty() {
                None
            } else {
                match spoolfs::open_beneath(top, &parent) {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        removal.block(path.clone(), None, e);
                        failed = true;
                        None
                    }
                }
            };
            if !failed {
                let dir = opened.as_ref().map_or(top, |fd| fd.as_fd());
                match rustix::fs::unlinkat(dir, &frame.name, AtFlags::REMOVEDIR) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => {
                        removal.block(path, owner_of(dir), e.into());
                        failed = true;
                    }
                }
            }
        }
        if failed && let Some(parent) = frames.last_mut() {
            parent.failed = true;
        }
    }
    removal
}

/// Opens the folder at `path` (below `top`), removes everything in it but
/// folders, and returns the names of its folders and whether something in
/// it could not be removed (the reason then in `removal`); `None` when it
/// cannot be opened or read.
fn empty_folder(
    top: BorrowedFd<'_>,
    path: &[&OsStr],
    removal: &mut Removal,
) -> Option<(Vec<OsString>, bool)> {
    let owned_path = |name: Option<&OsStr>| {
        let mut p: Vec<OsString> = path.iter().map(|p| (*p).to_owned()).collect();
        p.extend(name.map(OsStr::to_owned));
        p
    };
    let fd = match spoolfs::open_beneath(top, path) {
        Ok(fd) => fd,
        Err(e) => {
            removal.block(owned_path(None), owner_at(top, path), e);
            return None;
        }
    };
    let owner = owner_of(fd.as_fd());
    let mut dir = match rustix::fs::Dir::new(fd) {
        Ok(d) => d,
        Err(e) => {
            removal.block(owned_path(None), owner, e.into());
            return None;
        }
    };
    // The names are read in full before anything is removed.
    let mut entries = Vec::new();
    for entry in dir.by_ref() {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => {
                removal.block(owned_path(None), owner, e.into());
                return None;
            }
        };
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        entries.push((name.to_owned(), entry.file_type()));
    }
    let fd = dir.fd().ok()?;
    let mut subfolders = Vec::new();
    let mut failed = false;
    for (name, file_type) in entries {
        let stat = match rustix::fs::statat(fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => {
                removal.block(owned_path(Some(&name)), owner, e.into());
                failed = true;
                continue;
            }
        };
        let file_type = match file_type {
            FileType::Unknown => FileType::from_raw_mode(stat.st_mode),
            known => known,
        };
        if file_type == FileType::Directory {
            subfolders.push(name);
            continue;
        }
        match rustix::fs::unlinkat(fd, &name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {
                removal.files += 1;
                removal.bytes += stat.st_size as u64;
            }
            Err(e) => {
                removal.block(owned_path(Some(&name)), owner, e.into());
                failed = true;
            }
        }
    }
    // Popped from the end: name order.
    subfolders.sort_by(|a, b| b.cmp(a));
    Some((subfolders, failed))
}

fn owner_of(fd: BorrowedFd<'_>) -> Option<u32> {
    rustix::fs::fstat(fd).ok().map(|s| s.st_uid)
}

/// The owner of what is at `path` below `top` (not following it).
fn owner_at(top: BorrowedFd<'_>, path: &[&OsStr]) -> Option<u32> {
    let (last, parent) = path.split_last()?;
    let stat = if parent.is_empty() {
        rustix::fs::statat(top, *last, AtFlags::SYMLINK_NOFOLLOW)
    } else {
        let fd = spoolfs::open_beneath(top, parent).ok()?;
        rustix::fs::statat(&fd, *last, AtFlags::SYMLINK_NOFOLLOW)
    };
    stat.ok().map(|s| s.st_uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{Mode, OFlags};
    use std::fs;
    use std::path::Path;

    fn blocked(name: &str, path: &str, uid: u32) -> Undeletable {
        Undeletable {
            name: name.into(),
            path: path.into(),
            owner_uid: Some(uid),
            owner: uid.to_string(),
            error: "Permission denied (os error 13)".into(),
        }
    }

    #[test]
    fn an_entry_is_logged_when_it_is_first_blocked_or_blocked_otherwise() {
        let a = blocked("a", "a/sub/f", 60001);
        let b = blocked("b", "b/x", 60001);
        let other_path = blocked("a", "a/other", 60001);
        let other_owner = blocked("a", "a/sub/f", 60002);
        let cases: Vec<(Vec<&Undeletable>, Vec<&Undeletable>, &[&str])> = vec![
            (vec![], vec![], &[]),
            (vec![], vec![&a], &["a"]),
            (vec![&a], vec![&a], &[]),
            (vec![&a], vec![&a, &b], &["b"]),
            (vec![&a, &b], vec![&b], &[]),
            (vec![&a], vec![&other_path], &["a"]),
            (vec![&a], vec![&other_owner], &["a"]),
        ];
        for (before, now, want) in cases {
            let previous = RetentionRecord::of(before.into_iter().cloned().collect());
            let now: Vec<Undeletable> = now.into_iter().cloned().collect();
            let got: Vec<&str> = newly_blocked(&previous, &now)
                .iter()
                .map(|u| u.name.as_str())
                .collect();
            assert_eq!(got, want, "{previous:?} then {now:?}");
        }
    }

    #[test]
    fn the_record_counts_every_entry_and_names_the_first_thousand() {
        let many: Vec<Undeletable> = (0..1500)
            .rev()
            .map(|n| blocked(&format!("b{n:04}"), "x", 1))
            .collect();
        let record = RetentionRecord::of(many);
        assert_eq!(record.count, 1500);
        assert_eq!(record.entries.len(), MAX_RECORDED);
        assert_eq!(record.entries[0].name, "b0000");
    }

    fn open(path: &Path) -> rustix::fd::OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_deep_tree_goes_and_no_link_in_it_is_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        fs::create_dir_all(t.join("outside/keep")).unwrap();
        fs::write(t.join("outside/keep/file"), b"keep").unwrap();
        fs::create_dir(t.join("done")).unwrap();
        fs::create_dir(t.join("done/b")).unwrap();
        fs::write(t.join("done/b/top"), b"123").unwrap();
        std::os::unix::fs::symlink(t.join("outside"), t.join("done/b/link")).unwrap();
        // Deeper than one openat2 path takes (4000 bytes), made folder by
        // folder (the whole path is longer than a path may be).
        let mut fd = open(&t.join("done/b"));
        for n in 0..300 {
            let name = format!("level-{n:03}-of-a-deep-tree");
            rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
            fd = rustix::fs::openat(
                &fd,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            )
            .unwrap();
        }
        let file = rustix::fs::openat(
            &fd,
            "f",
            OFlags::WRONLY | OFlags::CREATE,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&file, b"12345").unwrap();
        rustix::fs::symlinkat(t.join("outside/keep"), &fd, "link").unwrap();
        drop((file, fd));
        let done = open(&t.join("done"));
        let removal = remove_entry(done.as_fd(), OsStr::new("b"));
        assert!(removal.blocked.is_none(), "{:?}", removal.blocked);
        assert_eq!(removal.files, 4);
        assert!(removal.bytes >= 8);
        assert!(!t.join("done/b").exists());
        assert_eq!(fs::read(t.join("outside/keep/file")).unwrap(), b"keep");
        // A plain file, and nothing at all.
        fs::write(t.join("done/f"), b"x").unwrap();
        assert_eq!(remove_entry(done.as_fd(), OsStr::new("f")).files, 1);
        assert!(
            remove_entry(done.as_fd(), OsStr::new("f"))
                .blocked
                .is_none()
        );
    }
}
