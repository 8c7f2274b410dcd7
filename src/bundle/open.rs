//! Reaching entries below a bundle folder through open directory handles, one
//! segment at a time, never following a link: opening listed files and walking
//! the tree. Nothing but a regular file is ever opened for reading.

use super::MANIFEST;
use super::error::{BundleError, Problem};
use crate::paths::{RelPath, is_reserved_name};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType, FileTypeExt, MetadataExt, OpenOptions, OpenOptionsExt};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;

/// Why one entry could not be opened as the kind of thing we need.
pub(super) enum EntryError {
    Missing,
    /// Found something else; the text names it ("a symbolic link").
    Kind(&'static str),
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
        } else {
            EntryError::Io(e)
        }
    }
}

pub(super) fn kind_label(ft: FileType) -> &'static str {
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

/// Opens the folder `name` inside `parent`, refusing a symbolic link.
fn open_dir_nofollow(parent: &Dir, name: &OsStr) -> Result<Dir, EntryError> {
    open_nofollow(parent, name, true).map(Dir::from_std_file)
}

/// Opens the regular file `name` inside `parent` for reading, refusing
/// anything else (link, FIFO, socket, device, folder).
pub(super) fn open_file_nofollow(parent: &Dir, name: &OsStr) -> Result<std::fs::File, EntryError> {
    open_nofollow(parent, name, false)
}

/// Opens a folder (`dir`) or regular file inside `parent`. The entry is
/// inspected first without following it and refused unless it is of the
/// wanted kind; the open itself uses `O_NOFOLLOW` (and `O_NONBLOCK` for
/// files, so it never blocks on a FIFO swapped in) and the handle must be
/// the same inode, so a swap between check and open is caught and a link
/// is never followed even where `openat2` is unavailable.
fn open_nofollow(parent: &Dir, name: &OsStr, dir: bool) -> Result<std::fs::File, EntryError> {
    let before = parent.symlink_metadata(name).map_err(EntryError::from_io)?;
    let wanted = |m: &cap_std::fs::Metadata| if dir { m.is_dir() } else { m.is_file() };
    if !wanted(&before) {
        return Err(EntryError::Kind(kind_label(before.file_type())));
    }
    let flags = if dir {
        libc::O_DIRECTORY | libc::O_NOFOLLOW
    } else {
        libc::O_NOFOLLOW | libc::O_NONBLOCK
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
    Ok(file.into_std())
}

fn open_dir_path(root: &Dir, segments: &[OsString]) -> Result<Dir, EntryError> {
    let mut current = root.try_clone().map_err(EntryError::Io)?;
    for segment in segments {
        current = open_dir_nofollow(&current, segment)?;
    }
    Ok(current)
}

/// A listed file could not be opened; `io` is set for plain I/O failures so
/// the caller can tell a passing condition from a bad bundle.
pub(super) struct Refusal {
    pub(super) problem: Problem,
    pub(super) io: Option<io::Error>,
}

pub(super) fn open_checked(root: &Dir, path: &RelPath) -> Result<std::fs::File, Refusal> {
    let refuse = |message: String, io: Option<io::Error>| Refusal {
        problem: Problem::at(path.as_str(), message),
        io,
    };
    let mut segments: Vec<&str> = path.segments().collect();
    let name = segments.pop().unwrap_or(path.as_str());
    let mut folder: Option<Dir> = None;
    let mut walked = String::new();
    for segment in segments {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(segment);
        let parent = folder.as_ref().unwrap_or(root);
        let next = open_dir_nofollow(parent, OsStr::new(segment)).map_err(|e| match e {
            EntryError::Missing => refuse(
                format!("listed in {MANIFEST} but not found (there is no folder \"{walked}\")"),
                None,
            ),
            EntryError::Kind("a symbolic link") => refuse(
                format!(
                    "folder \"{walked}\" is a symbolic link; listed files must sit in real folders of the bundle, never behind a link"
                ),
                None,
            ),
            EntryError::Kind(kind) => refuse(format!("\"{walked}\" is {kind}, not a folder"), None),
            EntryError::Raced => refuse(raced_message(), None),
            EntryError::Io(e) => refuse(format!("cannot open folder \"{walked}\": {e}"), Some(e)),
        })?;
        folder = Some(next);
    }
    let parent = folder.as_ref().unwrap_or(root);
    open_file_nofollow(parent, OsStr::new(name)).map_err(|e| match e {
        EntryError::Missing => refuse(format!("listed in {MANIFEST} but not found"), None),
        EntryError::Kind("a symbolic link") => refuse(
            "is a symbolic link; links are never followed, so put the file itself in the bundle"
                .to_owned(),
            None,
        ),
        EntryError::Kind(kind) => refuse(
            format!("is {kind}, not a regular file; only regular files can be listed"),
            None,
        ),
        EntryError::Raced => refuse(raced_message(), None),
        EntryError::Io(e) => refuse(format!("cannot open: {e}"), Some(e)),
    })
}

pub(super) fn raced_message() -> String {
    format!(
        "changed while it was being checked; leave a bundle untouched once its {MANIFEST} is written"
    )
}

pub(super) fn is_transient_io(e: &io::Error) -> bool {
    crate::storage::is_transient(e)
        || matches!(
            e.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::TimedOut | io::ErrorKind::OutOfMemory
        )
}

pub(super) fn open_bundle_dir(dir: &Path) -> Result<Dir, BundleError> {
    Dir::open_ambient_dir(dir, ambient_authority()).map_err(|e| {
        let hint = match e.kind() {
            io::ErrorKind::NotFound => "check the path",
            io::ErrorKind::PermissionDenied => "check its permissions",
            _ if e.raw_os_error() == Some(libc::ENOTDIR) => "a bundle is a folder",
            _ => "check that it is a readable folder",
        };
        BundleError::Unreadable {
            path: dir.to_path_buf(),
            message: format!("cannot open the bundle folder: {e}; {hint}"),
            io: Some(e),
        }
    })
}

/// Opens a listed file for reading, refusing anything but a regular file
/// reached without following a symlink (no intermediate symlinked folder
/// either). Never blocks on a FIFO.
pub fn open_listed(dir: &Path, path: &RelPath) -> Result<std::fs::File, Problem> {
    let root = open_bundle_dir(dir).map_err(|e| Problem {
        path: None,
        message: e.to_string(),
    })?;
    open_listed_at(&root, path)
}

/// [`open_listed`] for a bundle folder that is already open.
pub fn open_listed_at(root: &Dir, path: &RelPath) -> Result<std::fs::File, Problem> {
    open_checked(root, path).map_err(|r| r.problem)
}

pub(super) fn display_segments(segments: &[OsString]) -> String {
    let parts: Vec<String> = segments
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// Walks everything below `root` depth first, each folder's entries in name
/// order, without following links. Skips the top-level manifest and every
/// reserved `.distributor*` name (without descending into it). `visit` gets
/// each entry's path segments and type; for a folder it returns whether to
/// descend. A folder's entries are read in full and its handle closed before
/// descending, and folders are reopened from `root` segment by segment, so
/// the number of open descriptors stays small however deep the tree is.
pub(super) fn walk(
    root: &Dir,
    visit: &mut dyn FnMut(&[OsString], FileType) -> bool,
) -> Result<(), (String, io::Error)> {
    // Each frame: a folder's path and its entries not yet visited, reversed
    // so that popping yields them in name order.
    let mut frames: Vec<(Vec<OsString>, Vec<Listed>)> = vec![(Vec::new(), list_folder(root, &[])?)];
    while let Some((prefix, entries)) = frames.last_mut() {
        let Some((name, file_type)) = entries.pop() else {
            frames.pop();
            continue;
        };
        if prefix.is_empty() && name == MANIFEST {
            continue;
        }
        if is_reserved_name(&name.to_string_lossy()) {
            continue;
        }
        let mut path = prefix.clone();
        path.push(name);
        if visit(&path, file_type) && file_type.is_dir() {
            let entries = list_folder(root, &path)?;
            frames.push((path, entries));
        }
    }
    Ok(())
}

/// One folder entry: its name and type (links not followed).
type Listed = (OsString, FileType);

/// The entries of the folder at `segments`, sorted by name, reversed.
fn list_folder(root: &Dir, segments: &[OsString]) -> Result<Vec<Listed>, (String, io::Error)> {
    let shown = || {
        if segments.is_empty() {
            ".".to_owned()
        } else {
            display_segments(segments)
        }
    };
    let dir = open_dir_path(root, segments).map_err(|e| {
        let e = match e {
            EntryError::Io(e) => e,
            EntryError::Missing => io::Error::from(io::ErrorKind::NotFound),
            EntryError::Kind(kind) => io::Error::other(format!("it is now {kind}")),
            EntryError::Raced => io::Error::other("it changed while being listed"),
        };
        (shown(), e)
    })?;
    let mut entries = Vec::new();
    for entry in dir.entries().map_err(|e| (shown(), e))? {
        let entry = entry.map_err(|e| (shown(), e))?;
        let file_type = entry.file_type().map_err(|e| (shown(), e))?;
        entries.push((entry.file_name(), file_type));
    }
    entries.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(entries)
}
