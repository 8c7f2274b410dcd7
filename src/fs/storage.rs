//! Root-bounded file operations on a destination root.
//!
//! Every path is resolved one plain segment at a time from an open handle on
//! the root, refusing symbolic links at every step, so nothing outside the
//! root is ever read, written, deleted or followed, whatever the root holds.
//! A symlink inside the root is treated as content (an entry), never as a
//! folder to descend into. This module decides nothing about plans.

use crate::catalog::Sha256;
use crate::fs::hashing::{self, Hashed};
use crate::fs::replace_file::{self, Durability, Temp};
use crate::paths::{MAX_PATH_BYTES, RelPath, is_reserved_name};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How deep below a root a folder may be nested before walking or removing
/// it is refused: no output path can be deeper (each of its at most
/// [`MAX_PATH_BYTES`] bytes is a segment or a `/`).
pub const MAX_DEPTH: usize = MAX_PATH_BYTES / 2;

pub use crate::fs::replace_file::{create_temp, is_temp_name, sync_dir};
pub use crate::plan::Entry;

/// What a file system entry is, as a plan sees it.
fn entry_of(m: &cap_std::fs::Metadata) -> Entry {
    let t = m.file_type();
    if t.is_symlink() {
        Entry::Symlink
    } else if t.is_dir() {
        Entry::Dir
    } else if t.is_file() {
        Entry::File { size: m.len() }
    } else {
        Entry::Other
    }
}

/// An open destination root.
#[derive(Debug)]
pub struct Root {
    dir: Arc<Dir>,
    path: PathBuf,
    /// Folders below the root opened by earlier calls, by path, so that
    /// the outputs of one folder are reached without walking down from the
    /// root for each (a publication of many files in few folders). Each
    /// was opened without following a link; removing any folder empties
    /// the cache.
    folders: Mutex<HashMap<String, Arc<Dir>>>,
    /// The device of the root folder.
    device: u64,
    /// A folder on each other file system met below the root (a mount
    /// point inside it), so that [`Root::sync`] covers those too.
    mounts: Mutex<Vec<(u64, Arc<Dir>)>>,
}

/// A file written at the top of a root under a temporary name, not yet
/// synced or renamed ([`Root::stage_reserved`]).
pub struct StagedFile {
    pub temp: String,
    pub file: Arc<std::fs::File>,
}

/// At most this many folders stay open per root (the cache starts over
/// when full), well below the usual limit of 1024 descriptors.
const MAX_OPEN_FOLDERS: usize = 32;

fn nofollow_dir_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW);
    o
}

/// Opens the folder `name` inside `parent` without following a symlink.
pub fn open_subdir(parent: &Dir, name: impl AsRef<Path>) -> io::Result<Dir> {
    let file = parent.open_with(name, &nofollow_dir_options())?;
    Ok(Dir::from_std_file(file.into_std()))
}

/// Creates the folder `name` inside `parent` (mode 0755 before umask) and
/// opens it without following a link. A folder that already exists (made
/// by a concurrent staging thread) is opened as is; anything else at that
/// name fails the open with `ELOOP` or `ENOTDIR`.
fn create_subdir(parent: &Dir, name: &str) -> io::Result<Dir> {
    let mut b = cap_std::fs::DirBuilder::new();
    cap_std::fs::DirBuilderExt::mode(&mut b, 0o755);
    match parent.create_dir_with(name, &b) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    open_subdir(parent, name).map_err(|e| {
        if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) {
            io::Error::new(
                e.kind(),
                format!("{name} appeared while creating it, but it is not a real folder ({e})"),
            )
        } else {
            e
        }
    })
}

fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || matches!(e.raw_os_error(), Some(libc::ENOTDIR) | Some(libc::ELOOP))
}

impl Root {
    /// Opens the root at `path`; `Ok(None)` when it does not exist. The
    /// configured path itself may be a symlink (the operator chose it);
    /// nothing below it is followed.
    pub fn open(path: &Path) -> io::Result<Option<Root>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags_std(libc::O_DIRECTORY)
            .open(path);
        match file {
            Ok(file) => Ok(Some(Root {
                device: rustix::fs::fstat(&file)?.st_dev,
                dir: Arc::new(Dir::from_std_file(file)),
                path: path.to_owned(),
                folders: Mutex::default(),
                mounts: Mutex::default(),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the root, creating it (and its parents) when missing, durably
    /// ([`crate::fs::replace_file::create_dir_all_durable`]): a publication
    /// makes the root's content durable, never the root's own entry.
    pub fn create(path: &Path) -> io::Result<Root> {
        if let Some(root) = Root::open(path)? {
            return Ok(root);
        }
        crate::fs::replace_file::create_dir_all_durable(path, 0o777)?;
        Root::open(path)?.ok_or_else(|| io::Error::other("root vanished after creation"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The handle on the root folder itself.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The handle on the root folder, shared (for fsyncing it alongside
    /// other handles).
    pub fn shared_dir(&self) -> Arc<Dir> {
        self.dir.clone()
    }

    /// Walks to the folder holding `path`'s last segment. `Ok(None)` when a
    /// folder on the way is missing or is not a real folder.
    fn parent_of(&self, path: &str) -> io::Result<Option<(Arc<Dir>, String)>> {
        let (folder, name) = path.rsplit_once('/').unwrap_or(("", path));
        match self.folder(folder, false) {
            Ok(dir) => Ok(Some((dir, name.to_owned()))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The folder at `path` ("" for the root), every folder on the way
    /// opened without following a link, and created when missing if
    /// `create` is set. From the cache when an earlier call opened it (or
    /// one of its ancestors, walking on from there).
    fn folder(&self, path: &str, create: bool) -> io::Result<Arc<Dir>> {
        if path.is_empty() {
            return Ok(self.dir.clone());
        }
        let cached = |p: &str| {
            let folders = self.folders.lock().unwrap_or_else(|e| e.into_inner());
            folders.get(p).cloned()
        };
        if let Some(dir) = cached(path) {
            return Ok(dir);
        }
        let (mut dir, mut at) = path
            .rmatch_indices('/')
            .find_map(|(i, _)| cached(&path[..i]).map(|d| (d, i + 1)))
            .unwrap_or_else(|| (self.dir.clone(), 0));
        loop {
            let end = path[at..].find('/').map_or(path.len(), |j| at + j);
            let segment = &path[at..end];
            let next = match open_subdir(&dir, segment) {
                Ok(d) => d,
                Err(e) if create && e.kind() == io::ErrorKind::NotFound => {
                    create_subdir(&dir, segment)?
                }
                Err(e) => return Err(e),
            };
            dir = Arc::new(next);
            self.note_device(&path[..end], &dir)?;
            let mut folders = self.folders.lock().unwrap_or_else(|e| e.into_inner());
            if folders.len() >= MAX_OPEN_FOLDERS {
                folders.clear();
            }
            folders.insert(path[..end].to_owned(), dir.clone());
            drop(folders);
            if end == path.len() {
                return Ok(dir);
            }
            at = end + 1;
        }
    }

    /// Remembers `dir` (at `path`) when it is on another file system than
    /// the root: the first folder met on each.
    fn note_device(&self, path: &str, dir: &Arc<Dir>) -> io::Result<()> {
        let device = rustix::fs::fstat(&**dir)?.st_dev;
        if device == self.device {
            return Ok(());
        }
        let mut mounts = self.mounts.lock().unwrap_or_else(|e| e.into_inner());
        if !mounts.iter().any(|(d, _)| *d == device) {
            log::debug!(
                "{}/{path} is on another file system than the root; each durability barrier syncs it too",
                self.path.display()
            );
            mounts.push((device, dir.clone()));
        }
        Ok(())
    }

    /// Forgets every folder opened so far: one may be about to be removed
    /// (and a new one made at its name).
    fn forget_folders(&self) {
        self.folders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// What sits at `path` (never following a symlink on the way).
    pub fn entry(&self, path: &str) -> io::Result<Entry> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(Entry::Missing);
        };
        match dir.symlink_metadata(&name) {
            Ok(m) => Ok(entry_of(&m)),
            Err(e) if is_not_found(&e) => Ok(Entry::Missing),
            Err(e) => Err(e),
        }
    }

    /// Names at the top of the root, reserved names aside, sorted.
    pub fn top_level(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in self.dir.entries()? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if !is_reserved_name(&name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    /// Every name (reserved ones included) in the folder `path` ("" for
    /// the root itself); empty when the folder is missing or not a folder.
    pub fn list_names(&self, path: &str) -> io::Result<Vec<String>> {
        let dir = if path.is_empty() {
            self.dir.try_clone()?
        } else {
            let Some((parent, name)) = self.parent_of(path)? else {
                return Ok(Vec::new());
            };
            match open_subdir(&parent, &name) {
                Ok(d) => d,
                Err(e) if is_not_found(&e) => return Ok(Vec::new()),
                Err(e) => return Err(e),
            }
        };
        let mut names = Vec::new();
        for entry in dir.entries()? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Every entry below the root (folders included, reserved names
    /// skipped), without descending into symlinks, sorted by path.
    ///
    /// Iterative: one folder is open at a time, whatever the depth, and a
    /// tree nested deeper than [`MAX_DEPTH`] is refused with an error.
    pub fn walk(&self) -> io::Result<Vec<(String, Entry)>> {
        let mut out = Vec::new();
        let mut pending = vec![String::new()];
        let mut last = None;
        while let Some(folder) = pending.pop() {
            let dir = self.open_folder(&folder, &mut last)?;
            for entry in dir.entries()? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if is_reserved_name(&name) {
                    continue;
                }
                let path = join(&folder, &name);
                let kind = entry_of(&dir.symlink_metadata(&name)?);
                if kind == Entry::Dir {
                    self.check_depth(&path)?;
                    pending.push(path.clone());
                }
                out.push((path, kind));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Opens the folder at `path` ("" for the root) without following a
    /// link anywhere on the way. `last` is the folder opened before: when
    /// it is `path`'s parent (the usual case in a depth-first walk), one
    /// `openat` from it does, instead of walking down from the root again.
    /// On return `last` holds the folder just opened.
    fn open_folder(&self, path: &str, last: &mut Option<(String, Dir)>) -> io::Result<Dir> {
        let (parent_path, name) = path.rsplit_once('/').unwrap_or(("", path));
        let dir = match last {
            _ if path.is_empty() => self.dir.try_clone()?,
            Some((p, parent)) if p == parent_path => open_subdir(parent, name)?,
            _ => self.open_folder_from_root(path)?,
        };
        *last = Some((path.to_owned(), dir.try_clone()?));
        Ok(dir)
    }

    fn open_folder_from_root(&self, path: &str) -> io::Result<Dir> {
        let Some((parent, name)) = self.parent_of(path)? else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}/{path} vanished while it was being read",
                    self.path.display()
                ),
            ));
        };
        open_subdir(&parent, &name)
    }

    /// Refuses a folder deeper than [`MAX_DEPTH`] below the root.
    fn check_depth(&self, path: &str) -> io::Result<()> {
        if path.split('/').count() > MAX_DEPTH {
            return Err(io::Error::other(format!(
                "{}/{}...: folders are nested more than {MAX_DEPTH} deep, deeper than any output path can be ({MAX_PATH_BYTES} bytes at most), so distributor did not write them; move that folder out of the root, then rerun",
                self.path.display(),
                &path[..path.len().min(200)]
            )));
        }
        Ok(())
    }

    /// Reads a reserved file at the top of the root; `Ok(None)` when absent.
    /// A symlink or special file there is an error.
    pub fn read_reserved(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        let Some(mut file) = self.open_reserved(name)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut file, &mut bytes)?;
        Ok(Some(bytes))
    }

    /// Opens a reserved file at the top of the root for reading, with the
    /// checks of [`Root::read_reserved`], for a caller that streams it.
    pub fn open_reserved(&self, name: &str) -> io::Result<Option<std::fs::File>> {
        let mut o = OpenOptions::new();
        o.read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = match self.dir.open_with(name, &o) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(io::Error::other(format!(
                    "{name} is a symbolic link; remove it"
                )));
            }
            Err(e) => return Err(e),
        };
        let file = file.into_std();
        if !file.metadata()?.is_file() {
            return Err(io::Error::other(format!("{name} is not a regular file")));
        }
        Ok(Some(file))
    }

    /// Hashes the regular file at `path`, streaming. `Ok(None)` when there
    /// is no regular file there (missing, symlink, folder, special file).
    pub fn hash_file(&self, path: &str) -> io::Result<Option<Hashed>> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(None);
        };
        let mut o = OpenOptions::new();
        o.read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = match dir.open_with(&name, &o) {
            Ok(f) => f.into_std(),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !file.metadata()?.is_file() {
            return Ok(None);
        }
        hashing::copy_hashed(&mut &file, None, None).map(Some)
    }

    /// When `path` is a regular file (reached without following a link) of
    /// exactly `size` bytes whose SHA-256 is `sha256`: its look as it was
    /// opened. The size is checked on the open handle first, so a file of
    /// another size is never read; otherwise the file is read and hashed in
    /// full.
    pub fn holds(&self, path: &str, sha256: &Sha256, size: u64) -> io::Result<Option<Look>> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(None);
        };
        let mut o = OpenOptions::new();
        o.read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        let file = match dir.open_with(&name, &o) {
            Ok(f) => f.into_std(),
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() != size {
            return Ok(None);
        }
        let got = hashing::copy_hashed(&mut io::Read::take(&file, size + 1), None, Some(size))?;
        let holds = got.size == size && Sha256::parse(&got.sha256).as_ref() == Some(sha256);
        Ok(holds.then(|| Look::of(&meta)))
    }

    /// The look of the regular file at `path` (not following a link
    /// anywhere); `Ok(None)` when there is no regular file there.
    pub fn look(&self, path: &str) -> io::Result<Option<Look>> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(None);
        };
        match rustix::fs::statat(&*dir, name.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st)
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::RegularFile =>
            {
                Ok(Some(Look {
                    dev: st.st_dev,
                    ino: st.st_ino,
                    size: st.st_size as u64,
                    ctime: st.st_ctime,
                    ctime_nsec: st.st_ctime_nsec as i64,
                }))
            }
            Ok(_) => Ok(None),
            Err(e) => {
                let e = io::Error::from(e);
                if is_not_found(&e) { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Opens every folder above `path` and returns the innermost one,
    /// creating missing folders when `create` is true.
    ///
    /// Creation is idempotent, so several threads may stage outputs into
    /// the same new folder at once: when another thread created the folder
    /// first (`EEXIST`), what exists is opened without following a link
    /// and must be a real folder; a symlink, file or anything else there
    /// is still an error. Folders a publication may create are recorded
    /// once, in its journal, before staging starts (not here).
    pub fn parent_dir(&self, path: &RelPath, create: bool) -> io::Result<Arc<Dir>> {
        self.folder(path.parent().unwrap_or(""), create)
    }

    /// Writes `bytes` to a reserved file at the top of the root atomically
    /// and durably: temporary file, fsync, rename, fsync of the root.
    pub fn write_reserved(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.write_reserved_with(name, &mut |w| w.write_all(bytes))
    }

    /// [`Root::write_reserved`] with the content streamed by `fill`.
    pub fn write_reserved_with(
        &self,
        name: &str,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        replace_file::replace(&self.dir, name, Temp::Unique, Durability::Full, fill).map(drop)
    }

    /// [`Root::write_reserved_with`] without any fsync: the caller's next
    /// [`Root::sync`] makes it durable. Returns the look of the file
    /// written.
    pub fn write_reserved_unsynced(
        &self,
        name: &str,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<Look> {
        replace_file::replace(&self.dir, name, Temp::Unique, Durability::Unsynced, fill)
            .map(|meta| Look::of(&meta))
    }

    /// Writes what `fill` writes to a new temporary file at the top of the
    /// root, neither synced nor renamed: the first half of a reserved
    /// file's replacement, for a caller that fsyncs it together with other
    /// files, then calls [`Root::place_reserved`]. A crash in between
    /// leaves a temporary file at the top, which the next holder of the
    /// lock removes.
    pub fn stage_reserved(
        &self,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<StagedFile> {
        let (temp, mut file) = replace_file::create_temp(&self.dir)?;
        if let Err(e) = fill(&mut file) {
            let _ = self.dir.remove_file(&temp);
            return Err(e);
        }
        Ok(StagedFile {
            temp,
            file: Arc::new(file),
        })
    }

    /// Creates the reserved file `name` at the top of the root and writes
    /// what `fill` writes, neither synced nor renamed: for a file whose
    /// readers tell a complete one from one cut short by a crash (the
    /// journal), which spares the rename and the wait that makes it
    /// durable. Fails if `name` exists; never follows a link there.
    pub fn create_reserved(
        &self,
        name: &str,
        fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<std::fs::File> {
        let mut o = OpenOptions::new();
        o.write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW);
        let mut file = self.dir.open_with(name, &o)?.into_std();
        if let Err(e) = fill(&mut file) {
            let _ = self.dir.remove_file(name);
            return Err(e);
        }
        Ok(file)
    }

    /// Renames `staged` (from [`Root::stage_reserved`], synced by the
    /// caller) over the reserved file `name`; the rename is durable once
    /// the root folder is synced. Returns the look of the file placed.
    pub fn place_reserved(&self, staged: &StagedFile, name: &str) -> io::Result<Look> {
        let old = replace_file::hold(&self.dir, name);
        self.dir.rename(&staged.temp, &self.dir, name)?;
        replace_file::release_later(old);
        Ok(Look::of(&staged.file.metadata()?))
    }

    /// The folder at `path` ("" for the root), open, or `None` when there
    /// is none: for fsyncing it.
    pub fn folder_if_any(&self, path: &str) -> io::Result<Option<Arc<Dir>>> {
        match self.folder(path, false) {
            Ok(dir) => Ok(Some(dir)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A durability barrier: every change made so far to the file system
    /// holding the root (data, renames, deletions) reaches the disk, and
    /// to each other file system mounted inside it that this root has
    /// reached. Mutations in this module do not sync one by one; callers
    /// order them around barriers.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::syncfs(&*self.dir)?;
        let mounts: Vec<Arc<Dir>> = self
            .mounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, dir)| dir.clone())
            .collect();
        for dir in mounts {
            rustix::fs::syncfs(&*dir)?;
        }
        Ok(())
    }

    /// Removes a file or symlink at `path`; `Ok(false)` when already gone.
    pub fn remove_file(&self, path: &str) -> io::Result<bool> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(false);
        };
        let held = replace_file::hold(&dir, &name);
        match dir.remove_file(&name) {
            Ok(()) => {
                replace_file::release_later(held);
                Ok(true)
            }
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes `path` whatever it is: a file, a symlink (not its target),
    /// or a folder with everything in it (never following symlinks).
    pub fn remove_any(&self, path: &str) -> io::Result<()> {
        self.remove_entry(path, true).map(drop)
    }

    /// Removes what a publication deletes at `path`: a file, a symlink (not
    /// its target) or an empty folder. `Ok(false)` when a folder with
    /// something in it is there: it is left whole.
    pub fn remove_output(&self, path: &str) -> io::Result<bool> {
        self.remove_entry(path, false)
    }

    /// Removes the entry at `path` with one look at it; a folder with
    /// everything in it when `whole_folders`, else only an empty one
    /// (`Ok(false)` when it is not). Gone already counts as removed.
    fn remove_entry(&self, path: &str, whole_folders: bool) -> io::Result<bool> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(true);
        };
        let result = match dir.symlink_metadata(&name) {
            Ok(m) if m.file_type().is_dir() && whole_folders => {
                drop(dir);
                self.remove_tree(path)
            }
            Ok(m) if m.file_type().is_dir() => {
                self.forget_folders();
                match dir.remove_dir(&name) {
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {
                        return Ok(false);
                    }
                    other => other,
                }
            }
            Ok(_) => dir.remove_file(&name),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Removes the folder at `path` and everything in it, without
    /// following a link. Iterative: one folder is open at a time, whatever
    /// the depth, and a tree nested deeper than [`MAX_DEPTH`] is refused
    /// (files met before the refusal are gone already; a publication's
    /// journal settles that).
    fn remove_tree(&self, path: &str) -> io::Result<()> {
        self.forget_folders();
        let removed = self.remove_tree_in(path);
        // Walking the tree opened folders that are gone now.
        self.forget_folders();
        removed
    }

    fn remove_tree_in(&self, path: &str) -> io::Result<()> {
        // (folder, emptied): a folder is removed once what it held is gone.
        let mut pending = vec![(path.to_owned(), false)];
        let mut last = None;
        while let Some((folder, emptied)) = pending.pop() {
            if emptied {
                let Some((parent, name)) = self.parent_of(&folder)? else {
                    continue;
                };
                match parent.remove_dir(&name) {
                    Ok(()) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            self.check_depth(&folder)?;
            let dir = self.open_folder(&folder, &mut last)?;
            pending.push((folder.clone(), true));
            for entry in dir.entries()? {
                let name = entry?.file_name();
                if dir.symlink_metadata(&name)?.file_type().is_dir() {
                    pending.push((join(&folder, &name.to_string_lossy()), false));
                } else {
                    dir.remove_file(&name)?;
                }
            }
        }
        Ok(())
    }

    /// Removes the folders above `path` that are now empty, deepest first,
    /// never the root itself.
    pub fn prune_empty_parents(&self, path: &str) -> io::Result<()> {
        let mut current = path;
        while let Some(i) = current.rfind('/') {
            current = &current[..i];
            match self.remove_dir_if_empty(current) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Removes the folder at `path` when it is empty; `Ok(false)` otherwise.
    pub fn remove_dir_if_empty(&self, path: &str) -> io::Result<bool> {
        let Some((dir, name)) = self.parent_of(path)? else {
            return Ok(false);
        };
        self.forget_folders();
        match dir.remove_dir(&name) {
            Ok(()) => Ok(true),
            Err(e)
                if is_not_found(&e)
                    || matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// `folder/name`, or `name` at the root.
fn join(folder: &str, name: &str) -> String {
    if folder.is_empty() {
        name.to_owned()
    } else {
        format!("{folder}/{name}")
    }
}

/// Bytes the kernel has yet to write back to disk, machine-wide: `Dirty`
/// plus `Writeback` in `/proc/meminfo`. `None` when that cannot be read.
pub fn unwritten_bytes() -> Option<u64> {
    parse_unwritten(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// [`unwritten_bytes`] of the text of `/proc/meminfo`.
fn parse_unwritten(meminfo: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kib.checked_mul(1024)
    };
    field("Dirty:")?.checked_add(field("Writeback:")?)
}

/// A writer that starts writeback of what it has written every
/// [`WRITE_BEHIND_CHUNK`] bytes (`sync_file_range`), so the final fsync of a
/// large file has little left to do: disk writes overlap with hashing.
pub struct WriteBehind<'a> {
    file: &'a mut std::fs::File,
    written: u64,
    started: u64,
}

/// How many bytes accumulate before writeback is started.
pub const WRITE_BEHIND_CHUNK: u64 = 8 << 20;

impl<'a> WriteBehind<'a> {
    pub fn new(file: &'a mut std::fs::File) -> WriteBehind<'a> {
        WriteBehind {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITE_BEHIND_CHUNK {
            use std::os::fd::AsRawFd;
            // A hint: errors surface at the fsync that follows anyway.
            // SAFETY: the descriptor is open; the range lies within the file.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    self.started as libc::off64_t,
                    (self.written - self.started) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

trait StdOpenExt {
    fn custom_flags_std(&mut self, flags: i32) -> &mut Self;
}

impl StdOpenExt for std::fs::OpenOptions {
    fn custom_flags_std(&mut self, flags: i32) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::custom_flags(self, flags)
    }
}

/// What identifies one state of a regular file: a write, a truncation or
/// a rename gives it a newer change time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Look {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub ctime: i64,
    pub ctime_nsec: i64,
}

/// How long before it was taken a look's change time must be for the
/// look to be recorded. A file's change time comes from a coarse clock (a
/// tick of up to 10 ms on older kernels): a file changed again within the
/// tick of its last change keeps its change time, so a look taken that
/// close to the change could miss a later write. Such a look is simply not
/// recorded (the file is hashed next time); git's index treats "racily
/// clean" files the same way.
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(50);

impl Look {
    /// This look, if it can be recorded: taken (by a stat that started no
    /// earlier than `stat_from`) long enough after the file's last change.
    pub fn settled(self, stat_from: std::time::SystemTime) -> Option<Look> {
        let changed = std::time::UNIX_EPOCH
            + std::time::Duration::new(
                u64::try_from(self.ctime).ok()?,
                u32::try_from(self.ctime_nsec).ok()?,
            );
        (changed + SETTLE < stat_from).then_some(self)
    }

    /// The look of an open or stat-ed regular file.
    pub fn of(meta: &std::fs::Metadata) -> Look {
        use std::os::unix::fs::MetadataExt;
        Look {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, Root) {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root::open(tmp.path()).unwrap().unwrap();
        (tmp, root)
    }

    #[test]
    fn unwritten_bytes_are_dirty_plus_writeback_of_meminfo() {
        let meminfo = "MemTotal:       24576000 kB\nDirty:              1200 kB\nWriteback:            24 kB\nWritebackTmp:         0 kB\n";
        let cases = [
            (meminfo, Some((1200 + 24) * 1024)),
            ("Dirty: 0 kB\nWriteback: 0 kB\n", Some(0)),
            // A field missing or unreadable: unknown, never zero.
            ("Dirty: 5 kB\n", None),
            ("Dirty: many kB\nWriteback: 0 kB\n", None),
            ("Dirty: 5\nWriteback: 0 kB\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_unwritten(text), want, "{text:?}");
        }
        // This machine's own file reads.
        assert!(unwritten_bytes().is_some());
    }

    #[test]
    fn entries_are_classified_without_following_links() {
        let (tmp, root) = root();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"abc").unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("out")).unwrap();
        std::os::unix::fs::symlink("d", tmp.path().join("in")).unwrap();
        assert_eq!(root.entry("d").unwrap(), Entry::Dir);
        assert_eq!(root.entry("d/f").unwrap(), Entry::File { size: 3 });
        assert_eq!(root.entry("out").unwrap(), Entry::Symlink);
        assert_eq!(root.entry("out/passwd").unwrap(), Entry::Missing);
        assert_eq!(root.entry("in/f").unwrap(), Entry::Missing);
        assert_eq!(root.entry("d/f/x").unwrap(), Entry::Missing);
        assert_eq!(root.hash_file("in/f").unwrap(), None);
        assert_eq!(root.hash_file("d/f").unwrap().unwrap().size, 3);
        let sha = |bytes: &[u8]| Sha256::parse(&hashing::hash_bytes(bytes).sha256).unwrap();
        let abc = sha(b"abc");
        let cases = [
            ("d/f", 3, true),
            ("d/f", 4, false),
            ("in/f", 3, false),
            ("d", 3, false),
            ("x", 3, false),
        ];
        for (path, size, holds) in cases {
            assert_eq!(
                root.holds(path, &abc, size).unwrap().is_some(),
                holds,
                "{path} {size}"
            );
        }
        assert_eq!(root.holds("d/f", &sha(b"abd"), 3).unwrap(), None);
        // The look of a file that holds the bytes is the one a stat gives,
        // and only a regular file has one.
        let look = root.holds("d/f", &abc, 3).unwrap().unwrap();
        assert_eq!(root.look("d/f").unwrap(), Some(look));
        assert_eq!(look.size, 3);
        for other in ["d", "in/f", "out", "x", "d/f/x"] {
            assert_eq!(root.look(other).unwrap(), None, "{other}");
        }
        // Writing the file gives it another look.
        std::fs::write(tmp.path().join("d/f"), b"abcd").unwrap();
        assert_ne!(root.look("d/f").unwrap(), Some(look));
    }

    #[test]
    fn parent_dir_refuses_to_walk_through_a_symlink() {
        let (tmp, root) = root();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("a")).unwrap();
        let p = RelPath::parse("a/b/c.html").unwrap();
        assert!(root.parent_dir(&p, true).is_err());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    #[test]
    fn threads_creating_the_same_new_folders_all_succeed() {
        let (tmp, root) = root();
        let root = &root;
        for round in 0..20 {
            let paths: Vec<RelPath> = (0..8)
                .map(|i| RelPath::parse(&format!("r{round}/s/t/f{i}")).unwrap())
                .collect();
            let barrier = std::sync::Barrier::new(paths.len());
            std::thread::scope(|scope| {
                for p in &paths {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        barrier.wait();
                        root.parent_dir(p, true)
                            .unwrap_or_else(|e| panic!("{p}: {e}"));
                    });
                }
            });
            assert!(tmp.path().join(format!("r{round}/s/t")).is_dir());
        }
    }

    #[test]
    fn an_existing_name_is_accepted_only_when_it_is_a_real_folder() {
        let (tmp, root) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("dir")).unwrap();
        std::fs::write(tmp.path().join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
        std::os::unix::fs::symlink("dir", tmp.path().join("inner")).unwrap();
        let cases = [
            ("dir", true),
            ("new", true),
            ("file", false),
            ("link", false),
            ("inner", false),
        ];
        for (name, ok) in cases {
            assert_eq!(create_subdir(root.dir(), name).is_ok(), ok, "{name}");
        }
        assert!(tmp.path().join("new").is_dir());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }

    /// Makes `a/a/.../a` (`depth` folders) with a file at the bottom,
    /// one level at a time (the whole path may exceed PATH_MAX).
    fn nest(root: &Root, depth: usize) {
        let mut dir = root.dir().try_clone().unwrap();
        for _ in 0..depth {
            dir.create_dir("a").unwrap();
            dir = dir.open_dir("a").unwrap();
        }
        dir.write("f", b"x").unwrap();
    }

    #[test]
    fn deep_trees_are_walked_and_removed_and_too_deep_ones_refused() {
        let (tmp, root) = root();
        nest(&root, 300);
        let walked = root.walk().unwrap();
        assert_eq!(walked.len(), 301);
        assert_eq!(walked.last().unwrap().1, Entry::File { size: 1 });
        root.remove_any("a").unwrap();
        assert!(!tmp.path().join("a").exists());

        nest(&root, MAX_DEPTH + 1);
        let e = root.walk().unwrap_err().to_string();
        assert!(e.contains(&format!("more than {MAX_DEPTH} deep")), "{e}");
        let e = root.remove_any("a").unwrap_err().to_string();
        assert!(e.contains("move that folder out of the root"), "{e}");
    }

    #[test]
    fn remove_any_deletes_links_not_targets() {
        let (tmp, root) = root();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("d/link")).unwrap();
        root.remove_any("d").unwrap();
        assert!(!tmp.path().join("d").exists());
        assert!(outside.path().join("keep").exists());
    }

    #[test]
    fn walk_skips_reserved_names_and_does_not_descend_links() {
        let (tmp, root) = root();
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        std::fs::write(tmp.path().join("a/b/f"), b"").unwrap();
        std::fs::write(tmp.path().join(".distributor.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("/", tmp.path().join("l")).unwrap();
        let names: Vec<_> = root.walk().unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(names, ["a", "a/b", "a/b/f", "l"]);
        assert_eq!(root.top_level().unwrap(), ["a", "l"]);
    }

    #[test]
    fn prune_empty_parents_stops_at_content_and_never_removes_the_root() {
        let (tmp, root) = root();
        std::fs::create_dir_all(tmp.path().join("a/b/c")).unwrap();
        std::fs::write(tmp.path().join("a/keep"), b"").unwrap();
        root.prune_empty_parents("a/b/c/gone.html").unwrap();
        assert!(!tmp.path().join("a/b").exists());
        assert!(tmp.path().join("a/keep").exists());
        root.prune_empty_parents("top.html").unwrap();
        assert!(tmp.path().exists());
    }
}
