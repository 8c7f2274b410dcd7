//! Reaching entries below a bundle folder through open directory handles, one
//! segment at a time, never following a link: opening listed files and walking
//! the tree. Nothing but a regular file is ever opened for reading.

use super::MANIFEST;
use super::error::{BundleError, Problem};
use crate::paths::{RelPath, is_reserved_name};
use crate::signature::SIGNATURE_FILE;
use cap_std::ambient_authority;
use cap_std::fs::{Dir, FileType};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;

pub(super) use crate::fs::spoolfs::{EntryError, kind_label};

/// Opens the folder `name` inside `parent`, refusing a symbolic link.
fn open_dir_nofollow(parent: &Dir, name: &OsStr) -> Result<Dir, EntryError> {
    crate::fs::spoolfs::open_dir(parent, name)
}

/// Opens the regular file `name` inside `parent` for reading, refusing
/// anything else (link, FIFO, socket, device, folder, hard link).
pub(super) fn open_file_nofollow(parent: &Dir, name: &OsStr) -> Result<std::fs::File, EntryError> {
    crate::fs::spoolfs::open_file(parent, name)
}

/// A listed file could not be opened; `io` is set for plain I/O failures so
/// the caller can tell a passing condition from a bad bundle.
pub(super) struct UnopenedFile {
    pub(super) problem: Problem,
    pub(super) io: Option<io::Error>,
}

/// The folder the last open walked to, kept so that the files of one
/// folder, listed one after the other, are opened without walking from the
/// bundle's top again. The handle was opened without following a link, so
/// it stays the folder that was checked whatever happens to its name.
#[derive(Default)]
pub(super) struct LastFolder(Option<(String, Dir)>);

pub(super) fn open_checked(root: &Dir, path: &RelPath) -> Result<std::fs::File, UnopenedFile> {
    open_checked_in(root, path, &mut LastFolder::default())
}

/// [`open_checked`], reusing the folder in `last` when `path` is in it and
/// keeping the folder walked to there.
pub(super) fn open_checked_in(
    root: &Dir,
    path: &RelPath,
    last: &mut LastFolder,
) -> Result<std::fs::File, UnopenedFile> {
    let parent = folder_of(root, path, last)?;
    open_file_nofollow(parent, OsStr::new(path.file_name())).map_err(|e| refuse_file(path, e))
}

/// The size of a listed file, with every check of [`open_checked_in`]
/// made on its metadata, without opening it (for a look at sizes only;
/// reading it later opens it with the checks again).
pub(super) fn size_checked_in(
    root: &Dir,
    path: &RelPath,
    last: &mut LastFolder,
) -> Result<u64, UnopenedFile> {
    let parent = folder_of(root, path, last)?;
    crate::fs::spoolfs::stat_file(parent, OsStr::new(path.file_name()))
        .map_err(|e| refuse_file(path, e))
}

/// The folder holding the listed `path`, from `last` or walked to (and
/// kept in `last`).
fn folder_of<'a>(
    root: &'a Dir,
    path: &RelPath,
    last: &'a mut LastFolder,
) -> Result<&'a Dir, UnopenedFile> {
    let Some(folder) = path.parent() else {
        return Ok(root);
    };
    if last.0.as_ref().is_none_or(|(walked, _)| walked != folder) {
        last.0 = None;
        let dir = walk_to(root, folder).map_err(|(walked, e)| refuse_folder(path, &walked, e))?;
        last.0 = Some((folder.to_owned(), dir));
    }
    Ok(&last.0.as_ref().expect("walked above").1)
}

fn refuse(path: &RelPath, message: String, io: Option<io::Error>) -> UnopenedFile {
    UnopenedFile {
        problem: Problem::at(path.as_str(), message),
        io,
    }
}

/// The refusal of the listed file `path` itself.
fn refuse_file(path: &RelPath, e: EntryError) -> UnopenedFile {
    match e {
        EntryError::Missing => refuse(path, format!("listed in {MANIFEST} but not found"), None),
        EntryError::Kind("a symbolic link") => refuse(
            path,
            "is a symbolic link; links are never followed, so put the file itself in the bundle"
                .to_owned(),
            None,
        ),
        EntryError::Kind(kind) => refuse(
            path,
            format!("is {kind}, not a regular file; only regular files can be listed"),
            None,
        ),
        EntryError::HardLink(n) => refuse(
            path,
            format!(
                "is a hard link ({n} names for one file); the agent never reads a file that has other names, so copy the file into the bundle instead of linking it"
            ),
            None,
        ),
        EntryError::Raced => refuse(path, raced_message(), None),
        EntryError::Io(e) if e.kind() == io::ErrorKind::PermissionDenied => refuse(
            path,
            format!(
                "cannot open: {e}: the agent's user may not read it. The producer makes its files readable by the agent's group (chmod g+r, and a group-readable umask such as 027 when writing them); see docs/install.md, \"Permissions\""
            ),
            Some(e),
        ),
        EntryError::Io(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => refuse(
            path,
            format!(
                "cannot open: {e}: another process holds a file lease (or lock) on it that keeps the agent from reading it; the bundle's producer must let go of its files before it delivers them (and deliver the bundle again)"
            ),
            Some(e),
        ),
        EntryError::Io(e) => refuse(path, format!("cannot open: {e}"), Some(e)),
    }
}

/// Opens the folder `folder` (a clean relative path) below `root` one
/// segment at a time, never following a link; on failure, the part walked
/// so far and why.
fn walk_to(root: &Dir, folder: &str) -> Result<Dir, (String, EntryError)> {
    let mut dir: Option<Dir> = None;
    for (i, segment) in folder.split('/').enumerate() {
        let next = open_dir_nofollow(dir.as_ref().unwrap_or(root), OsStr::new(segment));
        let walked = || folder.split('/').take(i + 1).collect::<Vec<_>>().join("/");
        dir = Some(next.map_err(|e| (walked(), e))?);
    }
    Ok(dir.expect("a folder path has a segment"))
}

/// The refusal of the listed file `path` whose folder `walked` could not
/// be opened.
fn refuse_folder(path: &RelPath, walked: &str, e: EntryError) -> UnopenedFile {
    match e {
        EntryError::Missing => refuse(
            path,
            format!("listed in {MANIFEST} but not found (there is no folder \"{walked}\")"),
            None,
        ),
        EntryError::Kind("a symbolic link") => refuse(
            path,
            format!(
                "folder \"{walked}\" is a symbolic link; listed files must sit in real folders of the bundle, never behind a link"
            ),
            None,
        ),
        EntryError::Kind(kind) => {
            refuse(path, format!("\"{walked}\" is {kind}, not a folder"), None)
        }
        EntryError::Raced | EntryError::HardLink(_) => refuse(path, raced_message(), None),
        EntryError::Io(e) => refuse(
            path,
            format!("cannot open folder \"{walked}\": {e}"),
            Some(e),
        ),
    }
}

pub(super) fn raced_message() -> String {
    format!(
        "changed while it was being checked; leave a bundle untouched once its {MANIFEST} is written"
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
/// either). Never blocks on a FIFO. A passing I/O failure (out of
/// descriptors, a flaky disk) is [`BundleError::Unreadable`], which is
/// transient; anything wrong with the bundle itself is
/// [`BundleError::Invalid`].
pub fn open_listed(dir: &Path, path: &RelPath) -> Result<std::fs::File, BundleError> {
    let root = open_bundle_dir(dir)?;
    open_listed_at(&root, dir, path)
}

/// [`open_listed`] for a bundle folder `dir` that is already open.
pub fn open_listed_at(
    root: &Dir,
    dir: &Path,
    path: &RelPath,
) -> Result<std::fs::File, BundleError> {
    open_checked(root, path).map_err(|r| r.into_error(dir, path))
}

impl UnopenedFile {
    /// The error of the listed file `path` of the bundle at `dir`.
    pub(super) fn into_error(self, dir: &Path, path: &RelPath) -> BundleError {
        match self.io {
            Some(e) if crate::fs::io_class::is_transient_reading_bundle(&e) => {
                BundleError::Unreadable {
                    path: dir.join(path.as_str()),
                    message: format!("{}; try again later", self.problem.message),
                    io: Some(e),
                }
            }
            _ => BundleError::Invalid {
                problems: vec![self.problem],
            },
        }
    }
}

pub(super) fn display_segments(segments: &[OsString]) -> String {
    let parts: Vec<String> = segments
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// Walks everything below `root` depth first, each folder's entries in name
/// order, without following links ([`crate::fs::spoolfs::walk`]: a few
/// descriptors at a time, however wide or deep the tree). Skips the
/// top-level manifest and its signature and every reserved `.distributor*`
/// name (without
/// descending into it). `visit` gets each entry's path segments and type;
/// for a folder it returns whether to descend.
pub(super) fn walk(
    root: &Dir,
    visit: &mut dyn FnMut(&[OsString], FileType) -> bool,
) -> Result<(), (String, io::Error)> {
    use crate::fs::spoolfs::Visit;
    crate::fs::spoolfs::walk(root, &mut |path, meta| {
        let name = path.last().map(OsString::as_os_str).unwrap_or_default();
        let manifest = path.len() == 1 && (name == MANIFEST || name == SIGNATURE_FILE);
        if manifest || is_reserved_name(&name.to_string_lossy()) {
            return Visit::Skip;
        }
        if visit(path, meta.file_type()) {
            Visit::Descend
        } else {
            Visit::Skip
        }
    })
}
