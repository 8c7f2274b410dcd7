//! A local root published as releases (docs/contract.md §20.2): `path` is
//! a symbolic link that distributor owns, `<path>.releases/<release>`, and
//! each publication that changes the root builds the next release folder
//! whole (hard links to the current release's files, the new ones
//! written), makes it durable, then switches the link with one
//! `rename(2)`. A reader who resolves `path` sees one release or the next,
//! never a mix.
//!
//! The releases folder holds the lock (`.distributor.lock`), the release
//! folders, and while a publication runs a temporary folder
//! (`.distributor-tmp-build-…`) and a temporary link (`.distributor-tmp-link`).
//! Whoever next takes the lock removes what a crash left of those: a crash
//! at any instant leaves `path` naming a complete release (a release is
//! renamed to its name only once durable, and the link switched after).
//! A crash between that rename and the switch leaves a complete release
//! that never went live; it is listed like any other and goes by retention.

use crate::catalog::State;
use crate::fs::lock::{self, LOCK_FILE, RootLock};
use crate::fs::replace_file::{is_temp_name, sync_dir};
use crate::fs::storage::{Root, open_subdir};
use crate::runtime::failpoint;
use cap_std::fs::Dir;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use time::OffsetDateTime;

/// What `<path>` gets appended to name its releases folder.
pub const RELEASES_SUFFIX: &str = ".releases";

/// The temporary link that replaces `path` (a temporary name: removed by
/// the next holder of the lock when a crash leaves it).
const NEXT_LINK: &str = ".distributor-tmp-link";

/// The prefix of a release folder being built.
const BUILDING: &str = ".distributor-tmp-build-";

/// The prefix a release retention deletes under (a temporary name).
const RETIRED: &str = ".distributor-tmp-retired-";

/// `path`'s releases folder: `<path>.releases`.
pub fn folder_of(link: &Path) -> PathBuf {
    let mut name = link.as_os_str().to_owned();
    name.push(RELEASES_SUFFIX);
    PathBuf::from(name)
}

/// Whether `name` is a release folder's name: `YYYYMMDDTHHMMSSZ`, then
/// `-N` (N from 1, no leading zero) for a second release in one second.
/// Returns its sort key.
pub fn parse_name(name: &str) -> Option<(&str, u32)> {
    let (base, n) = match name.split_once('-') {
        Some((base, n)) => {
            if n.is_empty() || n.starts_with('0') || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (base, n.parse().ok()?)
        }
        None => (name, 0),
    };
    let b = base.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    (b.len() == 16 && digits(0..8) && b[8] == b'T' && digits(9..15) && b[15] == b'Z')
        .then_some((base, n))
}

/// The name of a release made at `now`: none of `taken` (every name in
/// the releases folder), and after every release of the same second, even
/// when retention deleted the first ones (a name used again would sort
/// before the releases it follows).
pub fn next_name(now: OffsetDateTime, taken: &[String]) -> String {
    let now = now.to_offset(time::UtcOffset::UTC);
    let base = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    );
    let after = taken
        .iter()
        .filter_map(|t| parse_name(t))
        .filter(|(b, _)| *b == base)
        .map(|(_, n)| n + 1)
        .max();
    match after {
        None => base,
        Some(n) => format!("{base}-{n}"),
    }
}

/// When a release was made, from its name, as RFC 3339.
pub fn created(name: &str) -> Option<String> {
    let (b, _) = parse_name(name)?;
    Some(format!(
        "{}-{}-{}T{}:{}:{}Z",
        &b[0..4],
        &b[4..6],
        &b[6..8],
        &b[9..11],
        &b[11..13],
        &b[13..15]
    ))
}

/// What `path` is when a release destination is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// Nothing yet: the first publication builds the first release.
    Nothing,
    /// A plain folder, converted by the next publication.
    Plain,
    /// The link distributor owns, to this release.
    Release(String),
    /// The link to this release, whose folder is gone (deleted or
    /// replaced by hand): only `rollback` and `releases` open it, so that
    /// the operator can point the link at a release that is there.
    Missing(String),
}

/// The releases of one destination, their folder locked.
pub struct Releases {
    link: PathBuf,
    /// The folder holding `path`, and `path`'s name in it.
    parent: Dir,
    link_name: String,
    folder: Root,
    _lock: Option<RootLock>,
    pub current: Current,
}

/// A release folder being built: its temporary name, and the name it gets.
pub struct Building {
    pub temp: String,
    pub name: String,
}

/// An error about a release destination that only the operator can fix.
fn refused(message: String) -> io::Error {
    io::Error::other(message)
}

impl Releases {
    /// Opens the releases of the destination whose `path` is `link`:
    /// with `write`, creates the releases folder if needed, takes its lock
    /// (waiting up to `timeout`) and removes what a crash left in it;
    /// without, takes the lock only if its file exists and changes
    /// nothing. `Ok(None)` without `write` when there is no releases folder
    /// yet.
    pub fn open(link: &Path, write: bool, timeout: Duration) -> Result<Option<Releases>, Opened> {
        let releases = Releases::open_to_switch(link, write, timeout)?;
        if let Some(rel) = &releases
            && let Current::Missing(name) = &rel.current
        {
            return Err(Opened::Io(refused(format!(
                "{} links to release {name}, but {} holds no such release folder: run `distributor releases` to see what is there, and `distributor rollback --to RELEASE` to point the link at one",
                rel.link.display(),
                rel.folder.path().display()
            ))));
        }
        Ok(releases)
    }

    /// Like [`Releases::open`], but a link to a release folder that is gone
    /// is opened too ([`Current::Missing`]): `rollback` and `releases`.
    pub fn open_to_switch(
        link: &Path,
        write: bool,
        timeout: Duration,
    ) -> Result<Option<Releases>, Opened> {
        let (parent_path, link_name) = match (link.parent(), link.file_name()) {
            (Some(p), Some(n)) => (p, n.to_string_lossy().into_owned()),
            _ => {
                return Err(Opened::Io(refused(format!(
                    "{}: a release destination's path must name a link inside a folder",
                    link.display()
                ))));
            }
        };
        let parent_path = if parent_path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent_path
        };
        let folder_path = folder_of(link);
        let current_before = current_of_path(link, &link_name)?;
        let folder = match Root::open(&folder_path)? {
            Some(folder) => folder,
            None if !write => return Ok(None),
            None => {
                if let Current::Release(_) = current_before {
                    return Err(Opened::Io(refused(format!(
                        "{} links into {}, which is missing: restore that folder from a backup, or remove the link and publish again (the next publication builds a first release)",
                        link.display(),
                        folder_path.display()
                    ))));
                }
                std::fs::create_dir_all(parent_path)?;
                match std::fs::create_dir(&folder_path) {
                    // Another process made it first: the lock decides.
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e.into()),
                    _ => {}
                }
                Root::open(&folder_path)?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?
            }
        };
        if std::fs::symlink_metadata(&folder_path)?
            .file_type()
            .is_symlink()
        {
            return Err(Opened::Io(refused(format!(
                "{} is a symbolic link; distributor keeps releases only in a real folder: replace it with the folder it points to",
                folder_path.display()
            ))));
        }
        let lock = if write {
            if !is_ours(&folder)? {
                return Err(Opened::Io(refused(format!(
                    "{} is not a releases folder distributor made (it holds other things and no {LOCK_FILE}): move it away, or give the destination another path",
                    folder_path.display()
                ))));
            }
            Some(lock::acquire(&folder, timeout)?)
        } else {
            lock::acquire_existing(&folder, timeout)?
        };
        let parent = Dir::open_ambient_dir(parent_path, cap_std::ambient_authority())?;
        let mut releases = Releases {
            link: link.to_owned(),
            parent,
            link_name,
            folder,
            _lock: lock,
            current: Current::Nothing,
        };
        if write {
            releases.sweep()?;
        }
        // Under the lock, the link is what the last switch made.
        releases.current = releases.read_current()?;
        Ok(Some(releases))
    }

    /// `path` as configured.
    pub fn link(&self) -> &Path {
        &self.link
    }

    /// The folder of release `name`.
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.folder.path().join(name)
    }

    /// The link's target for release `name`, relative to the link's folder.
    fn target_of(&self, name: &str) -> String {
        format!("{}{RELEASES_SUFFIX}/{name}", self.link_name)
    }

    fn read_current(&self) -> Result<Current, Opened> {
        let current = current_of_path(&self.link, &self.link_name)?;
        if let Current::Release(name) = &current
            && !self.is_release(name)?
        {
            return Ok(Current::Missing(name.clone()));
        }
        Ok(current)
    }

    /// Whether `name` is a release folder here (a real folder, not a link).
    fn is_release(&self, name: &str) -> io::Result<bool> {
        if parse_name(name).is_none() {
            return Ok(false);
        }
        match self.folder.dir().symlink_metadata(name) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The release folders, newest first.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in self.folder.dir().entries()? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if parse_name(name).is_some() && entry.file_type()?.is_dir() {
                names.push(name.to_owned());
            }
        }
        names.sort_by(|a, b| parse_name(b).cmp(&parse_name(a)));
        Ok(names)
    }

    /// Removes what a crash left: a release being built, a new link not
    /// switched, or a plain root replaced by the first release.
    fn sweep(&self) -> io::Result<()> {
        for entry in self.folder.dir().entries()? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if is_temp_name(name) {
                let what = if name.starts_with(RETIRED) {
                    "an old release retention was deleting"
                } else {
                    "the link was never switched to it"
                };
                log::warn!(
                    "{}/{name}: removing what an interrupted publication left ({what})",
                    self.folder.path().display()
                );
                self.folder.remove_any(name)?;
            }
        }
        Ok(())
    }

    /// Starts the next release from `from` (the current release, or the
    /// plain root), every file of it hard-linked but the reserved ones at
    /// its top; from nothing when `from` is `None`.
    pub fn build(&self, now: OffsetDateTime, from: Option<&Root>) -> io::Result<(Building, Root)> {
        let mut taken = Vec::new();
        for entry in self.folder.dir().entries()? {
            taken.push(entry?.file_name().to_string_lossy().into_owned());
        }
        let name = next_name(now, &taken);
        let temp = format!("{BUILDING}{name}");
        self.folder.dir().create_dir(&temp)?;
        let root = Root::open(&self.path_of(&temp))?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if let Some(from) = from {
            link_tree(from.dir(), root.dir(), true).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot hard-link {} into the next release ({e}); a release destination's root must be one file system with its releases folder",
                        from.path().display()
                    ),
                )
            })?;
        }
        failpoint::hit("releases.after_links");
        Ok((Building { temp, name }, root))
    }

    /// Makes the release built in `root` durable and gives it its name.
    pub fn complete(&self, building: &Building, root: &Root) -> io::Result<()> {
        root.sync()?;
        rustix::fs::renameat(
            self.folder.dir(),
            building.temp.as_str(),
            self.folder.dir(),
            building.name.as_str(),
        )?;
        sync_dir(self.folder.dir())?;
        failpoint::hit("releases.after_complete");
        Ok(())
    }

    /// Points `path` at release `name` with one rename of a new link over
    /// it (a plain folder at `path` is exchanged for the link, then
    /// removed: the first release holds its files), made durable.
    pub fn switch(&mut self, name: &str) -> io::Result<()> {
        let dir = self.folder.dir();
        match dir.remove_file(NEXT_LINK) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        rustix::fs::symlinkat(self.target_of(name).as_str(), dir, NEXT_LINK)?;
        let plain = self.current == Current::Plain;
        if plain {
            let exchanged = rustix::fs::renameat_with(
                dir,
                NEXT_LINK,
                &self.parent,
                self.link_name.as_str(),
                rustix::fs::RenameFlags::EXCHANGE,
            );
            match exchanged {
                Ok(()) => {}
                Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {
                    // The file system cannot exchange two names: the folder
                    // goes first, and `path` is missing until the link
                    // takes its place.
                    log::warn!(
                        "{}: its file system cannot exchange a folder and a link in one step (RENAME_EXCHANGE), so while it is converted to releases it is missing for an instant",
                        self.link.display()
                    );
                    dir.remove_file(NEXT_LINK)?;
                    rustix::fs::renameat(&self.parent, self.link_name.as_str(), dir, NEXT_LINK)?;
                    rustix::fs::symlinkat(
                        self.target_of(name).as_str(),
                        &self.parent,
                        self.link_name.as_str(),
                    )?;
                }
                Err(e) => return Err(e.into()),
            }
        } else {
            rustix::fs::renameat(dir, NEXT_LINK, &self.parent, self.link_name.as_str())?;
        }
        sync_dir(&self.parent)?;
        failpoint::hit("releases.after_switch");
        self.current = Current::Release(name.to_owned());
        if plain {
            log::info!(
                "{}: converted to releases: its content became the first release, and it is now a link to {}",
                self.link.display(),
                self.target_of(name)
            );
            // The plain folder, now under the temporary name: its files
            // are in the first release.
            self.folder.remove_any(NEXT_LINK)?;
        }
        Ok(())
    }

    /// Deletes the releases beyond the newest `keep`, never the current
    /// one; a failure is logged (the publication is done).
    pub fn retain(&self, keep: u32) {
        let names = match self.names() {
            Ok(names) => names,
            Err(e) => {
                log::warn!(
                    "{}: cannot list the releases to keep {keep} ({e}); older ones stay until the next publication",
                    self.folder.path().display()
                );
                return;
            }
        };
        let current = match &self.current {
            Current::Release(name) => Some(name.as_str()),
            _ => None,
        };
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        for name in names.iter().skip(keep) {
            if Some(name.as_str()) == current {
                continue;
            }
            match self.retire(name) {
                Ok(()) => log::debug!("{}: release {name} deleted", self.folder.path().display()),
                Err(e) => log::warn!(
                    "{}/{name}: cannot delete this release beyond the {keep} kept ({e}); the next publication tries again",
                    self.folder.path().display()
                ),
            }
            failpoint::hit("releases.after_retain");
        }
    }

    /// Deletes release `name`: renamed to a temporary name first, and that
    /// made durable, so that a crash while its files go never leaves part
    /// of a release under its name (listed, a rollback target); the next
    /// holder of the lock removes the rest ([`Releases::sweep`]).
    fn retire(&self, name: &str) -> io::Result<()> {
        let temp = format!("{RETIRED}{name}");
        let dir = self.folder.dir();
        rustix::fs::renameat(dir, name, dir, temp.as_str())?;
        sync_dir(dir)?;
        self.folder.remove_any(&temp)
    }

    /// Removes a release folder being built (after a failure).
    pub fn abandon(&self, building: &Building) -> io::Result<()> {
        self.folder.remove_any(&building.temp)
    }

    /// The root of release `name`, opened.
    pub fn open_release(&self, name: &str) -> io::Result<Root> {
        Root::open(&self.path_of(name))?.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
}

/// Why [`Releases::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Opened {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Lock(#[from] crate::fs::lock::LockError),
}

/// What `link` is now, judged from itself alone.
fn current_of_path(link: &Path, link_name: &str) -> Result<Current, Opened> {
    let meta = match std::fs::symlink_metadata(link) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Current::Nothing),
        Err(e) => return Err(e.into()),
    };
    if meta.is_dir() {
        return Ok(Current::Plain);
    }
    if !meta.file_type().is_symlink() {
        return Err(Opened::Io(refused(format!(
            "{} is a file, not a folder or a link to a release: move it away, or give the destination another path",
            link.display()
        ))));
    }
    let target = std::fs::read_link(link)?;
    let prefix = format!("{link_name}{RELEASES_SUFFIX}/");
    let release = target
        .as_os_str()
        .as_bytes()
        .strip_prefix(prefix.as_bytes())
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .filter(|rest| parse_name(rest).is_some());
    match release {
        Some(name) => Ok(Current::Release(name.to_owned())),
        None => Err(Opened::Io(refused(format!(
            "{} is a symbolic link to {}, which distributor did not make (a release destination's link points to {prefix}RELEASE): remove the link, or set the destination's path to the folder it points to",
            link.display(),
            target.display()
        )))),
    }
}

/// Whether the releases folder is one distributor made: it holds the lock
/// file, or nothing but releases and temporary names.
fn is_ours(folder: &Root) -> io::Result<bool> {
    let mut only_releases = true;
    for entry in folder.dir().entries()? {
        let name = entry?.file_name();
        if name == OsStr::new(LOCK_FILE) {
            return Ok(true);
        }
        let name = name.to_str().unwrap_or_default();
        only_releases &= parse_name(name).is_some() || is_temp_name(name);
    }
    Ok(only_releases)
}

/// Whether a name at the top of a root is the root's own bookkeeping,
/// never carried into the next release: its lock, journal, temporary
/// files and record of looks (every look changes with a new link).
fn not_carried(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    name == LOCK_FILE
        || name == super::journal::JOURNAL_FILE
        || name == super::hash_cache::SEEN_FILE
        || is_temp_name(name)
}

/// Hard-links everything in `from` into the empty folder `to`, folders made
/// anew with their modes (never following a link: a link is linked
/// itself).
fn link_tree(from: &Dir, to: &Dir, top: bool) -> io::Result<()> {
    use rustix::fs::{AtFlags, Mode};
    for entry in from.entries()? {
        let entry = entry?;
        let name = entry.file_name();
        if top && not_carried(&name) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            let mode = {
                use cap_std::fs::PermissionsExt;
                entry.metadata()?.permissions().mode() & 0o7777
            };
            rustix::fs::mkdirat(to, &*name, Mode::from_raw_mode(0o700))?;
            let sub_to = open_subdir(to, &name)?;
            link_tree(&open_subdir(from, &name)?, &sub_to, false)?;
            rustix::fs::fchmod(&sub_to, Mode::from_raw_mode(mode))?;
        } else {
            rustix::fs::linkat(from, &*name, to, &*name, AtFlags::empty())?;
        }
    }
    Ok(())
}

/// The source ids whose records release `root`'s catalog holds, sorted.
pub fn sources_in(state: &State) -> Vec<String> {
    let mut ids: Vec<String> = match state {
        State::Catalog(c) => c.outputs.iter().map(|r| r.source.id.clone()).collect(),
        _ => Vec::new(),
    };
    ids.sort();
    ids.dedup();
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_names_are_utc_seconds_then_a_count() {
        let cases = [
            ("20261207T033000Z", Some(("20261207T033000Z", 0))),
            ("20261207T033000Z-1", Some(("20261207T033000Z", 1))),
            ("20261207T033000Z-12", Some(("20261207T033000Z", 12))),
            ("20261207T033000Z-0", None),
            ("20261207T033000Z-01", None),
            ("20261207T033000Z-", None),
            ("20261207T033000", None),
            ("2026120XT033000Z", None),
            (".distributor-tmp-build-20261207T033000Z", None),
            ("current", None),
        ];
        for (name, want) in cases {
            assert_eq!(parse_name(name), want, "{name}");
        }
    }

    #[test]
    fn a_second_release_in_one_second_is_numbered_and_sorts_after() {
        let now = time::macros::datetime!(2026-12-07 03:30:00.750 UTC);
        assert_eq!(next_name(now, &[]), "20261207T033000Z");
        let taken = ["20261207T033000Z".to_owned()];
        assert_eq!(next_name(now, &taken), "20261207T033000Z-1");
        let many: Vec<String> = std::iter::once("20261207T033000Z".to_owned())
            .chain((1..=10).map(|n| format!("20261207T033000Z-{n}")))
            .collect();
        assert_eq!(next_name(now, &many), "20261207T033000Z-11");
        // The first ones deleted by retention: never named again.
        let kept = ["20261207T033000Z-2".to_owned()];
        assert_eq!(next_name(now, &kept), "20261207T033000Z-3");
        let mut sorted = many.clone();
        sorted.sort_by(|a, b| parse_name(b).cmp(&parse_name(a)));
        assert_eq!(sorted[0], "20261207T033000Z-10");
        assert_eq!(sorted[10], "20261207T033000Z");
        assert_eq!(
            created("20261207T033000Z-3").unwrap(),
            "2026-12-07T03:30:00Z"
        );
    }
}
