//! The one way the agent and the spool commands touch anything inside a
//! spool folder or a bundle (docs/contract.md §12.1). Producers own the bundles they
//! drop and may keep descriptors open on them after the claim, so every
//! name in there is the producer's: it may be a symbolic link, a FIFO, a
//! device, a hard link to a file the producer cannot read, or a file that
//! never ends.
//!
//! Like Postfix's `postdrop`/`pickup`, this module therefore
//! - opens folders and files relative to an open folder, never following a
//!   symbolic link (`O_NOFOLLOW` for one segment, `openat2` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` for a path below a bundle or
//!   spool folder), never blocking (`O_NONBLOCK`: a FIFO or device is
//!   refused, never read);
//! - walks and deletes trees holding a few descriptors at a time, however
//!   wide or deep a producer made them ([`walk`], [`open_beneath`]);
//! - checks what it opened by its descriptor (regular file, one link, the
//!   inode it inspected), and reads at most a cap;
//! - writes its own files there only by creating a new temporary file and
//!   renaming it over the entry relative to the folder's descriptor, never
//!   by opening an existing name for writing.
//!
//! Outside this module, nothing opens a path inside a spool.

use crate::fs::replace_file::{self, Durability, Temp};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType, FileTypeExt, Metadata, MetadataExt, OpenOptions, OpenOptionsExt};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Why an entry could not be opened as the kind of thing wanted.
#[derive(Debug)]
pub enum EntryError {
    /// There is nothing by that name.
    Missing,
    /// Something else is there; the text names it ("a symbolic link").
    Kind(&'static str),
    /// A regular file with more than one name (the count of names).
    HardLink(u64),
    /// It changed between the check and the open.
    Raced,
    Io(io::Error),
}

impl EntryError {
    fn from_io(e: io::Error) -> EntryError {
        if e.kind() == io::ErrorKind::NotFound {
            EntryError::Missing
        } else if e.raw_os_error() == Some(libc::ELOOP) {
            EntryError::Kind("a symbolic link")
        } else if e.raw_os_error() == Some(libc::ENOTDIR) {
            EntryError::Kind("not a folder")
        } else {
            EntryError::Io(e)
        }
    }
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryError::Missing => f.write_str("not found"),
            EntryError::Kind(kind) => write!(f, "is {kind}"),
            EntryError::HardLink(n) => write!(
                f,
                "is a hard link ({n} names for one file); the agent never reads a file that has other names"
            ),
            EntryError::Raced => f.write_str("changed while it was being opened"),
            EntryError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A short label for a file type, links not followed ("a named pipe (FIFO)").
pub fn kind_label(ft: FileType) -> &'static str {
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a folder"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_fifo() {
        "a named pipe (FIFO)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

/// Opens the folder at `path` (a spool folder or a bundle in one). The
/// folders above the last are the operator's and may be links; the last
/// component itself is never followed.
pub fn open_folder(path: &Path) -> Result<Dir, EntryError> {
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => {
            return Dir::open_ambient_dir(path, ambient_authority()).map_err(EntryError::from_io);
        }
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent = Dir::open_ambient_dir(parent, ambient_authority()).map_err(EntryError::from_io)?;
    open_dir(&parent, name)
}

/// [`open_folder`] with the refusal as an `io::Error` naming `path`
/// (`NotFound` when there is nothing there), for callers that only pass
/// the error on.
pub fn open_folder_io(path: &Path) -> io::Result<Dir> {
    open_folder(path).map_err(|e| match e {
        EntryError::Io(e) => e,
        EntryError::Missing => io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: not found", path.display()),
        ),
        other => io::Error::other(format!("{}: {other}", path.display())),
    })
}

/// Opens the folder `name` inside `parent`, refusing a symbolic link.
pub fn open_dir(parent: &Dir, name: &OsStr) -> Result<Dir, EntryError> {
    open_entry(parent, name, true).map(Dir::from_std_file)
}

/// Opens the regular file `name` inside `parent` for reading, refusing
/// anything else: a link, FIFO, socket, device or folder, and a file with
/// more than one name (a hard link could make the agent read a file the
/// producer cannot).
pub fn open_file(parent: &Dir, name: &OsStr) -> Result<std::fs::File, EntryError> {
    open_entry(parent, name, false)
}

/// The size of the regular file `name` inside `parent`, with the checks of
/// [`open_file`] made on its metadata alone (not following a link): for a
/// look at many files that are read later, each through [`open_file`].
pub fn stat_file(parent: &Dir, name: &OsStr) -> Result<u64, EntryError> {
    let meta = parent.symlink_metadata(name).map_err(EntryError::from_io)?;
    if !meta.is_file() {
        return Err(EntryError::Kind(kind_label(meta.file_type())));
    }
    if meta.nlink() > 1 {
        return Err(EntryError::HardLink(meta.nlink()));
    }
    Ok(meta.len())
}

/// The entry is inspected without following it and refused unless it is of
/// the wanted kind, so a special file is never even opened; the open uses
/// `O_NOFOLLOW` (and `O_NONBLOCK` for files, so a FIFO swapped in cannot
/// block it), and the descriptor must be the inode inspected.
fn open_entry(parent: &Dir, name: &OsStr, dir: bool) -> Result<std::fs::File, EntryError> {
    let before = parent.symlink_metadata(name).map_err(EntryError::from_io)?;
    let wanted = |m: &cap_std::fs::Metadata| if dir { m.is_dir() } else { m.is_file() };
    if !wanted(&before) {
        return Err(EntryError::Kind(kind_label(before.file_type())));
    }
    let flags = if dir {
        libc::O_DIRECTORY | libc::O_NOFOLLOW
    } else {
        libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY
    };
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(flags);
    let file = parent
        .open_with(name, &options)
        .map_err(|e| match EntryError::from_io(e) {
            EntryError::Missing => EntryError::Raced,
            other => other,
        })?;
    let after = file.metadata().map_err(EntryError::Io)?;
    if !wanted(&after) || after.dev() != before.dev() || after.ino() != before.ino() {
        return Err(EntryError::Raced);
    }
    if !dir && after.nlink() > 1 {
        return Err(EntryError::HardLink(after.nlink()));
    }
    Ok(file.into_std())
}

/// Longest path handed to one `openat2` (`PATH_MAX` is 4096 with the NUL).
const MAX_PATH_CHUNK: usize = 4000;

/// Opens the folder at `path` below `top`: by `openat2` relative to `top`,
/// refusing a symbolic link anywhere and anything outside `top` or on
/// another file system; a path longer than one call takes is opened in
/// pieces. Where `openat2` is missing, segment by segment with
/// `O_NOFOLLOW`. At most two descriptors are open at once.
pub fn open_beneath(top: BorrowedFd<'_>, path: &[&OsStr]) -> io::Result<OwnedFd> {
    // No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a link at the end too
    // (ELOOP, where O_NOFOLLOW would make it ENOTDIR).
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    let mut current: Option<OwnedFd> = None;
    let mut rest = path;
    while !rest.is_empty() {
        let mut joined: Vec<u8> = Vec::new();
        let mut taken = 0;
        for name in rest {
            let need = name.len() + usize::from(taken > 0);
            if taken > 0 && joined.len() + need > MAX_PATH_CHUNK {
                break;
            }
            if taken > 0 {
                joined.push(b'/');
            }
            joined.extend_from_slice(name.as_bytes());
            taken += 1;
        }
        let base = current.as_ref().map_or(top, |fd| fd.as_fd());
        let opened =
            match rustix::fs::openat2(base, joined.as_slice(), flags, Mode::empty(), resolve) {
                Err(rustix::io::Errno::NOSYS) => {
                    let flags = flags | OFlags::NOFOLLOW;
                    let mut fd = rustix::fs::openat(base, rest[0], flags, Mode::empty())?;
                    for name in &rest[1..taken] {
                        fd = rustix::fs::openat(&fd, *name, flags, Mode::empty())?;
                    }
                    fd
                }
                other => other?,
            };
        current = Some(opened);
        rest = &rest[taken..];
    }
    current.ok_or_else(|| io::Error::other("an empty path"))
}

/// [`open_beneath`] as a [`Dir`], `root` itself for an empty path: the
/// folder at `segments` below `root`, reached without following a link.
/// Only the folder reached stays open, so a walk that reopens each folder
/// from the top holds two descriptors however deep it goes.
pub fn open_dir_beneath(root: &Dir, segments: &[OsString]) -> Result<Dir, EntryError> {
    if segments.is_empty() {
        return root.try_clone().map_err(EntryError::Io);
    }
    let path: Vec<&OsStr> = segments.iter().map(OsString::as_os_str).collect();
    let fd = open_beneath(root.as_fd(), &path).map_err(EntryError::from_io)?;
    Ok(Dir::from_std_file(std::fs::File::from(fd)))
}

/// What [`walk`] does after visiting an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Go on; into the entry too, when it is a folder.
    Descend,
    /// Go on, but not into this entry.
    Skip,
    /// Stop the walk.
    Stop,
}

/// Deepest folder level [`walk`] descends to. A clean relative path is at
/// most 4096 bytes (docs/producers.md), so no listed file sits deeper.
pub const MAX_WALK_DEPTH: usize = 2048;

/// Walks everything below `root` depth first, each folder's entries in
/// name order, never following a link. `visit` gets each entry's path
/// (segments below `root`) and metadata (links not followed) and says
/// whether to descend. A folder's entries are read in full and its handle
/// closed before the walk goes on, and folders are reopened from `root`
/// ([`open_dir_beneath`]), so the walk holds two descriptors at most however
/// wide or deep the tree (docs/security.md). A folder that vanished or was
/// replaced by something else since it was listed is passed over; what
/// cannot be read fails the walk with the folder's path (`.` for `root`).
pub fn walk(
    root: &Dir,
    visit: &mut dyn FnMut(&[OsString], &Metadata) -> Visit,
) -> Result<(), (String, io::Error)> {
    let top = list_sorted(root, &[])?.unwrap_or_default();
    // Each frame: a folder's path and its entries not yet visited, reversed
    // so that popping yields them in name order.
    let mut frames: Vec<(Vec<OsString>, Vec<Listed>)> = vec![(Vec::new(), top)];
    while let Some((prefix, entries)) = frames.last_mut() {
        let Some((name, meta)) = entries.pop() else {
            frames.pop();
            continue;
        };
        let mut path = prefix.clone();
        path.push(name);
        match visit(&path, &meta) {
            Visit::Stop => return Ok(()),
            Visit::Descend if meta.is_dir() && path.len() < MAX_WALK_DEPTH => {
                if let Some(entries) = list_sorted(root, &path)? {
                    frames.push((path, entries));
                }
            }
            Visit::Descend | Visit::Skip => {}
        }
    }
    Ok(())
}

/// One entry of a folder and its metadata, links not followed.
type Listed = (OsString, Metadata);

/// The entries of the folder at `segments` below `root` with their
/// metadata, sorted by name and reversed; `None` when that folder is gone
/// or no longer a folder.
fn list_sorted(
    root: &Dir,
    segments: &[OsString],
) -> Result<Option<Vec<Listed>>, (String, io::Error)> {
    let shown = || {
        if segments.is_empty() {
            ".".to_owned()
        } else {
            let parts: Vec<_> = segments.iter().map(|s| s.to_string_lossy()).collect();
            parts.join("/")
        }
    };
    let dir = match open_dir_beneath(root, segments) {
        Ok(dir) => dir,
        Err(EntryError::Io(e)) => return Err((shown(), e)),
        Err(_) if !segments.is_empty() => return Ok(None),
        Err(e) => return Err((shown(), io::Error::other(e.to_string()))),
    };
    let mut entries = Vec::new();
    for entry in dir.entries().map_err(|e| (shown(), e))? {
        let entry = entry.map_err(|e| (shown(), e))?;
        match entry.metadata() {
            Ok(meta) => entries.push((entry.file_name(), meta)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err((shown(), e)),
        }
    }
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(Some(entries))
}

/// Why a capped read failed.
#[derive(Debug)]
pub enum ReadError {
    Entry(EntryError),
    /// The file is larger than the cap (its size, the cap).
    TooBig(u64, u64),
}

impl ReadError {
    pub fn is_missing(&self) -> bool {
        matches!(self, ReadError::Entry(EntryError::Missing))
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Entry(e) => e.fmt(f),
            ReadError::TooBig(len, cap) => {
                write!(f, "is {len} bytes, more than the {cap} bytes read at most")
            }
        }
    }
}

/// Reads the regular file `name` in `dir` whole, refusing it (without
/// reading) when it is over `cap` bytes, and never reading more than `cap`
/// even if it grows meanwhile.
pub fn read_capped(dir: &Dir, name: &str, cap: u64) -> Result<Vec<u8>, ReadError> {
    let file = open_file(dir, OsStr::new(name)).map_err(ReadError::Entry)?;
    read_open_capped(file, cap)
}

/// [`read_capped`] for a file already opened with [`open_file`].
pub fn read_open_capped(file: std::fs::File, cap: u64) -> Result<Vec<u8>, ReadError> {
    let len = file
        .metadata()
        .map_err(|e| ReadError::Entry(EntryError::Io(e)))?
        .len();
    if len > cap {
        return Err(ReadError::TooBig(len, cap));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Entry(EntryError::Io(e)))?;
    if bytes.len() as u64 > cap {
        return Err(ReadError::TooBig(bytes.len() as u64, cap));
    }
    Ok(bytes)
}

/// [`read_capped`] of the file at `path`, whose folder is opened first
/// with [`open_folder`].
pub fn read_capped_at(path: &Path, cap: u64) -> Result<Vec<u8>, ReadError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(ReadError::Entry(EntryError::Kind("not a file name")));
    };
    let dir = open_folder(parent).map_err(ReadError::Entry)?;
    let file = open_file(&dir, name).map_err(ReadError::Entry)?;
    read_open_capped(file, cap)
}

/// Replaces the entry `name` in `dir` with a new file holding `bytes`: a
/// new temporary file is created (`O_EXCL`, never through an existing name),
/// filled, optionally fsynced, and renamed over `name` relative to `dir`. A
/// symbolic link, FIFO or hard link planted at `name` is replaced, never
/// written through.
pub fn replace(dir: &Dir, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let durability = if durable {
        Durability::Data
    } else {
        Durability::Unsynced
    };
    replace_file::replace_bytes(dir, name, Temp::Unique, durability, bytes)
}

/// Opens the lock file `name` in `dir` for locking, creating it when
/// missing: relative to the folder's descriptor, never through a link
/// (`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`), never
/// truncating, and refused unless it is a regular file with one name. A
/// lock lives on its inode, so the file is never replaced.
pub fn open_lock(dir: &Dir, name: &str) -> io::Result<std::fs::File> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = dir.open_with(name, &options)?;
    let meta = file.metadata()?;
    let refused = if !meta.is_file() {
        Some(EntryError::Kind(kind_label(meta.file_type())))
    } else if meta.nlink() > 1 {
        Some(EntryError::HardLink(meta.nlink()))
    } else {
        None
    };
    match refused {
        Some(e) => Err(io::Error::other(format!(
            "{name} {e}; remove it, the agent creates a new one"
        ))),
        None => Ok(file.into_std()),
    }
}

/// Removes the entry `name` from `dir` if it is not a folder (a link is
/// removed itself, never its target). `Ok(false)` when there was none.
pub fn remove(dir: &Dir, name: &str) -> io::Result<bool> {
    match dir.remove_file(name) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the group class of the bundle folder `name` in `inbox`, and of
/// everything below it, what the agent needs to take it over: read,
/// write and search on folders (moving a folder into work/ needs write
/// access to the folder itself), read on regular files. Under an ACL the
/// group class is the ACL's mask, so this restores what a producer's mode
/// took from the agent's named entry (`cp -r`, `rsync -a` and `tar -x`
/// give new folders their source's mode, which sets the mask; a umask of
/// 077 leaves it empty); without one it is the producers' group, which
/// the install recipe's agent belongs to.
///
/// Only an agent that may change the modes of files it does not own does
/// anything (`CAP_FOWNER`, which the packaged unit gives it): the first
/// change it may not make ends the walk with `EPERM`. Nothing is followed
/// or opened for reading to do it (each entry is opened `O_PATH |
/// O_NOFOLLOW`, checked through its descriptor, and changed through
/// `/proc/self/fd`): a link is left as it is, and so is a file with more
/// than one name (the bundle fails for it anyway) and anything that is
/// neither a folder nor a regular file. Returns how many modes changed; at
/// most `max_entries` entries are looked at, [`ADOPT_DEPTH`] folders deep
/// (two descriptors each). Only entries of the bundle folder's owner, on
/// its device, are changed.
pub fn adopt(inbox: &Dir, name: &str, max_entries: u64) -> io::Result<u64> {
    let mut changed = 0;
    let mut seen = 0;
    let mut walk = Adopt {
        changed: &mut changed,
        seen: &mut seen,
        max: max_entries,
        owner: None,
    };
    walk.entry(inbox, OsStr::new(name), 0)?;
    Ok(changed)
}

/// How deep [`adopt`] goes.
const ADOPT_DEPTH: usize = 64;

/// One [`adopt`] walk: what it changed and looked at, and the bundle
/// folder's owner and device, which every entry it changes must share (a
/// file of another user moved into the bundle, a mount inside it, are left
/// as they are).
struct Adopt<'a> {
    changed: &'a mut u64,
    seen: &'a mut u64,
    max: u64,
    owner: Option<(u32, u64)>,
}

impl Adopt<'_> {
    fn entry(&mut self, parent: &Dir, name: &OsStr, depth: usize) -> io::Result<()> {
        use rustix::fs::{FileType, Mode, OFlags, fstat, openat};
        *self.seen += 1;
        if *self.seen > self.max || depth > ADOPT_DEPTH {
            return Ok(());
        }
        let fd = openat(
            parent,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stat = fstat(&fd)?;
        let here = (stat.st_uid, stat.st_dev);
        if *self.owner.get_or_insert(here) != here {
            return Ok(());
        }
        let (needed, is_dir) = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => (0o070, true),
            FileType::RegularFile if stat.st_nlink == 1 => (0o040, false),
            _ => return Ok(()),
        };
        let mode = stat.st_mode & 0o7777;
        if mode & needed != needed {
            let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
            rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(mode | needed))?;
            *self.changed += 1;
        }
        if !is_dir {
            return Ok(());
        }
        // Readable now: its entries, each the same way, through the
        // descriptor that was checked (never the name again).
        let dir = openat(
            &fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        drop(fd);
        let dir = Dir::from_std_file(std::fs::File::from(dir));
        for entry in dir.entries()? {
            if *self.seen > self.max {
                break;
            }
            self.entry(&dir, &entry?.file_name(), depth + 1)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dir(path: &Path) -> Dir {
        Dir::open_ambient_dir(path, ambient_authority()).unwrap()
    }

    fn mkfifo(path: &Path) {
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            path,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
    }

    #[test]
    fn reads_refuse_links_fifos_devices_hard_links_and_big_files() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::write(t.join("plain"), b"12345").unwrap();
        std::fs::write(t.join("secret"), b"secret").unwrap();
        symlink(t.join("secret"), t.join("link")).unwrap();
        symlink("/dev/zero", t.join("zero")).unwrap();
        std::fs::hard_link(t.join("secret"), t.join("hard")).unwrap();
        mkfifo(&t.join("fifo"));
        std::fs::create_dir(t.join("folder")).unwrap();
        let d = dir(t);
        assert_eq!(read_capped(&d, "plain", 5).unwrap(), b"12345");
        let cases: &[(&str, u64, &str)] = &[
            ("plain", 4, "is 5 bytes, more than the 4 bytes read at most"),
            ("link", 100, "is a symbolic link"),
            ("zero", 100, "is a symbolic link"),
            ("fifo", 100, "is a named pipe (FIFO)"),
            ("folder", 100, "is a folder"),
            ("missing", 100, "not found"),
        ];
        for (name, cap, want) in cases {
            let err = read_capped(&d, name, *cap).unwrap_err();
            assert_eq!(err.to_string(), *want, "{name}");
        }
        let err = read_capped(&d, "hard", 100).unwrap_err().to_string();
        assert!(err.contains("hard link (2 names"), "{err}");
        let dev = dir(Path::new("/dev"));
        assert_eq!(
            read_capped(&dev, "null", 100).unwrap_err().to_string(),
            "is a character device"
        );
    }

    #[test]
    fn replace_never_writes_through_a_planted_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let victim = t.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::create_dir(t.join("b")).unwrap();
        symlink(&victim, t.join("b/result")).unwrap();
        std::fs::hard_link(&victim, t.join("b/hard")).unwrap();
        mkfifo(&t.join("b/fifo"));
        let d = open_folder(&t.join("b")).unwrap();
        for name in ["result", "hard", "fifo", "new"] {
            replace(&d, name, b"{}", false).unwrap();
            assert_eq!(std::fs::read(t.join("b").join(name)).unwrap(), b"{}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let leftovers: Vec<_> = std::fs::read_dir(t.join("b"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| crate::fs::storage::is_temp_name(n))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_lock_is_created_kept_and_never_opened_through_a_planted_entry() {
        use std::os::unix::fs::MetadataExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let victim = t.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::fs::create_dir(t.join("b")).unwrap();
        symlink(&victim, t.join("b/link")).unwrap();
        std::fs::hard_link(&victim, t.join("b/hard")).unwrap();
        mkfifo(&t.join("b/fifo"));
        let d = open_folder(&t.join("b")).unwrap();
        for name in ["link", "hard", "fifo"] {
            let e = open_lock(&d, name).expect_err(name);
            assert!(e.to_string().contains(name), "{e}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let first = open_lock(&d, "lock").unwrap();
        let again = open_lock(&d, "lock").unwrap();
        assert_eq!(
            first.metadata().unwrap().ino(),
            again.metadata().unwrap().ino()
        );
    }

    #[test]
    fn open_folder_never_follows_its_last_component() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::create_dir(t.join("real")).unwrap();
        symlink(t.join("real"), t.join("alias")).unwrap();
        assert!(open_folder(&t.join("real")).is_ok());
        let err = open_folder(&t.join("alias")).unwrap_err();
        assert_eq!(err.to_string(), "is a symbolic link");
    }

    #[test]
    fn walk_lists_every_entry_in_name_order_and_never_enters_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let outside = t.join("outside");
        std::fs::create_dir_all(outside.join("secret")).unwrap();
        let b = t.join("bundle");
        std::fs::create_dir_all(b.join("a/deep/er")).unwrap();
        std::fs::write(b.join("a/deep/er/f"), "x").unwrap();
        std::fs::write(b.join("b.txt"), "y").unwrap();
        symlink(&outside, b.join("a/link")).unwrap();
        let mut seen = Vec::new();
        walk(&dir(&b), &mut |path, meta| {
            let shown: Vec<_> = path.iter().map(|s| s.to_string_lossy()).collect();
            seen.push((shown.join("/"), kind_label(meta.file_type())));
            Visit::Descend
        })
        .unwrap();
        let expected = [
            ("a", "a folder"),
            ("a/deep", "a folder"),
            ("a/deep/er", "a folder"),
            ("a/deep/er/f", "a regular file"),
            ("a/link", "a symbolic link"),
            ("b.txt", "a regular file"),
        ];
        let seen: Vec<(&str, &str)> = seen.iter().map(|(p, k)| (p.as_str(), *k)).collect();
        assert_eq!(seen, expected);

        // Skip and Stop.
        let mut visited = 0;
        walk(&dir(&b), &mut |path, _| {
            visited += 1;
            match path.len() {
                1 if path[0] == "a" => Visit::Skip,
                _ => Visit::Stop,
            }
        })
        .unwrap();
        assert_eq!(visited, 2, "a (skipped), then b.txt stops the walk");
    }

    #[test]
    fn open_dir_beneath_refuses_a_link_on_the_way_and_at_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::create_dir_all(t.join("b/real/inner")).unwrap();
        std::fs::create_dir_all(t.join("elsewhere/inner")).unwrap();
        symlink(t.join("elsewhere"), t.join("b/alias")).unwrap();
        let root = dir(&t.join("b"));
        let path = |p: &str| p.split('/').map(OsString::from).collect::<Vec<_>>();
        assert!(open_dir_beneath(&root, &path("real/inner")).is_ok());
        for through_link in ["alias", "alias/inner"] {
            let e = open_dir_beneath(&root, &path(through_link)).unwrap_err();
            assert_eq!(e.to_string(), "is a symbolic link", "{through_link}");
        }
        assert!(matches!(
            open_dir_beneath(&root, &path("real/missing")),
            Err(EntryError::Missing)
        ));
    }

    /// What adopt changes: folders get g+rwx, regular files g+r; a link
    /// is not followed (its target keeps its mode), and a file with more
    /// than one name is left alone.
    #[test]
    fn adopt_opens_the_group_class_below_a_bundle_and_follows_no_link() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let inbox = tmp.path().join("inbox");
        let bundle = inbox.join("b");
        std::fs::create_dir_all(bundle.join("sub")).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::fs::write(bundle.join("sub/page.html"), "p").unwrap();
        std::fs::write(bundle.join("linked"), "l").unwrap();
        std::fs::hard_link(bundle.join("linked"), tmp.path().join("other-name")).unwrap();
        std::os::unix::fs::symlink(&outside, bundle.join("link")).unwrap();
        // Another user's file moved into the bundle is not the bundle's.
        let foreign = bundle.join("sub/foreign");
        std::fs::write(&foreign, "f").unwrap();
        std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        for (p, m) in [
            (&outside, 0o600),
            (&bundle.join("sub/page.html"), 0o600),
            (&bundle.join("linked"), 0o600),
            (&foreign, 0o600),
        ] {
            set(p, m);
        }
        for p in [&bundle.join("sub"), &bundle] {
            set(p, 0o700);
        }
        let dir = open_folder_io(&inbox).unwrap();
        let changed = adopt(&dir, "b", 100).unwrap();
        assert_eq!(changed, 3, "two folders and one file");
        assert_eq!(mode(&bundle), 0o770);
        assert_eq!(mode(&bundle.join("sub")), 0o770);
        assert_eq!(mode(&bundle.join("sub/page.html")), 0o640);
        assert_eq!(mode(&bundle.join("linked")), 0o600, "a file with two names");
        assert_eq!(mode(&outside), 0o600, "a link is never followed");
        assert_eq!(mode(&foreign), 0o600, "another owner's file");
        assert_eq!(adopt(&dir, "b", 100).unwrap(), 0, "nothing left to change");
    }
}
