//! Replacing one file atomically: the single place that writes a temporary
//! file next to the target, optionally fsyncs it, renames it over the target
//! and optionally fsyncs the folder. A reader sees the old file or the new
//! one, never a part of either; a failure leaves the old file as it was and
//! removes the temporary. It works on an open folder handle and one plain
//! name, never follows a symbolic link at the temporary name, and decides
//! nothing about which files to write.

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of every temporary file the tool creates.
pub const TEMP_PREFIX: &str = ".distributor-tmp-";

/// How far [`replace`] makes the new file durable before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// No fsync: the caller's later barrier (a `syncfs`) makes it durable.
    Unsynced,
    /// The new bytes are fsynced before the rename; the rename itself
    /// becomes durable with the caller's later fsync of the folder (which
    /// may cover other entries at once).
    Data,
    /// Bytes fsynced, renamed, then the folder fsynced: durable on return.
    Full,
}

/// The temporary name [`replace`] writes before renaming.
#[derive(Debug, Clone, Copy)]
pub enum Temp<'a> {
    /// A new `.distributor-tmp-<pid>-<n>` made with `O_EXCL`: never an
    /// existing entry, whatever was planted in the folder.
    Unique,
    /// This fixed name (a documented one): a leftover of an interrupted run
    /// is truncated and reused, a symbolic link there is refused.
    Named(&'a OsStr),
}

/// Replaces the entry `name` of `dir` with a new file whose content `fill`
/// writes: temporary file (mode 0644 before umask), fsync per `durability`,
/// rename over `name` relative to `dir`. Whatever sat at `name` (a file, a
/// link, a FIFO) is replaced, never written through. On any error the
/// temporary is removed and `name` keeps its old content.
///
/// Returns the new file's metadata as of its rename (which sets its change
/// time): what identifies the file written for as long as nobody else
/// writes it.
pub fn replace(
    dir: &Dir,
    name: impl AsRef<Path>,
    temp: Temp<'_>,
    durability: Durability,
    fill: &mut dyn FnMut(&mut dyn Write) -> io::Result<()>,
) -> io::Result<std::fs::Metadata> {
    let (temp, mut file) = match temp {
        Temp::Unique => {
            let (temp, file) = create_temp(dir)?;
            (OsString::from(temp), file)
        }
        Temp::Named(temp) => (temp.to_owned(), open_named(dir, temp)?),
    };
    let written = fill(&mut file).and_then(|()| match durability {
        Durability::Unsynced => Ok(()),
        Durability::Data | Durability::Full => file.sync_all(),
    });
    let old = hold(dir, name.as_ref());
    if let Err(e) = written.and_then(|()| dir.rename(&temp, dir, name.as_ref())) {
        let _ = dir.remove_file(&temp);
        return Err(e);
    }
    release_later(old);
    let written = file.metadata()?;
    drop(file);
    match durability {
        Durability::Full => sync_dir(dir)?,
        Durability::Unsynced | Durability::Data => {}
    }
    Ok(written)
}

/// [`replace`] with the content given as bytes.
pub fn replace_bytes(
    dir: &Dir,
    name: impl AsRef<Path>,
    temp: Temp<'_>,
    durability: Durability,
    bytes: &[u8],
) -> io::Result<()> {
    replace(dir, name, temp, durability, &mut |w| w.write_all(bytes)).map(drop)
}

/// A reference to whatever sits at `name` in `dir` (an `O_PATH` handle:
/// nothing is opened for reading, no device or FIFO is touched, a link is
/// not followed), taken before the entry is replaced or removed so that
/// the old file is freed when the handle is dropped, by
/// [`release_later`], instead of inside the rename or unlink.
pub fn hold(dir: &Dir, name: impl AsRef<Path>) -> Option<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(dir, name.as_ref(), flags, Mode::empty()).ok()
}

/// Drops `held` (from [`hold`]) on a background thread. Freeing a file's
/// blocks, which the last reference to a replaced or removed file does,
/// waits for the disk on a file system mounted with `discard` (about as
/// long as a fsync): a publication need not wait for it. At most
/// [`RELEASE_QUEUE`] handles wait at a time; beyond, the caller waits.
pub fn release_later(held: Option<OwnedFd>) {
    let Some(held) = held else { return };
    // Still process-wide (not yet in `ProcessState`): every writer of a
    // file through `storage` and `replace` reaches it, most with nothing
    // else of the process in hand (docs/architecture.md, "What a process
    // keeps").
    static QUEUE: OnceLock<Option<crossbeam_channel::Sender<OwnedFd>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::bounded::<OwnedFd>(RELEASE_QUEUE);
        for i in 0..RELEASE_THREADS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("release-{i}"))
                .spawn(move || rx.iter().for_each(drop));
            if spawned.is_err() {
                return None;
            }
        }
        Some(tx)
    });
    if let Some(Err(e)) = queue.as_ref().map(|tx| tx.send(held)) {
        drop(e.into_inner());
    }
}

/// Handles [`release_later`] lets wait, and the threads that drop them.
const RELEASE_QUEUE: usize = 64;
const RELEASE_THREADS: usize = 4;

/// Fsyncs a folder so renames and deletions inside it are durable. The
/// folder is opened again for reading through the handle, since a handle
/// opened only as a path (`O_PATH`, as `cap_std` opens folders) cannot be
/// fsynced.
pub fn sync_dir(dir: &Dir) -> io::Result<()> {
    let mut o = OpenOptions::new();
    o.read(true).custom_flags(libc::O_DIRECTORY);
    dir.open_with(".", &o)?.sync_all()
}

/// Creates the folder `path` and every missing folder above it (with
/// `mode`, before the umask), then fsyncs the folder holding each one
/// created, shallowest first: the new entries are durable before anything
/// is moved into them. Without that, a power cut could keep a bundle
/// renamed into a new spool folder, or an output written into a new root,
/// and lose the folder's own entry: both would be gone.
pub fn create_dir_all_durable(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut at = path;
    while !at.as_os_str().is_empty() {
        match std::fs::symlink_metadata(at) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(at),
            Err(e) => return Err(e),
        }
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Makes temporary names unique within the process (with its id): one
/// counter per process is the point, so not in `ProcessState`
/// (docs/architecture.md, "What a process keeps").
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Creates a new temporary file (mode 0644 before umask) in `dir`.
pub fn create_temp(dir: &Dir) -> io::Result<(String, std::fs::File)> {
    loop {
        let n = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("{TEMP_PREFIX}{}-{n}", std::process::id());
        let mut o = OpenOptions::new();
        o.write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW);
        match dir.open_with(&name, &o) {
            Ok(f) => return Ok((name, f.into_std())),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Names a temporary file the way [`create_temp`] does, for journaling.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Opens the fixed temporary name `temp` for writing from the start,
/// creating it (mode 0644 before umask) or truncating a leftover; a link
/// there is refused (`ELOOP`), never followed.
fn open_named(dir: &Dir, temp: &OsStr) -> io::Result<std::fs::File> {
    let mut o = OpenOptions::new();
    o.write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW);
    Ok(dir.open_with(temp, &o)?.into_std())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cap_std::ambient_authority;
    use std::fs;

    fn folder() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open_ambient_dir(tmp.path(), ambient_authority()).unwrap();
        (tmp, dir)
    }

    #[test]
    fn folders_are_created_with_their_parents_and_existing_ones_kept() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        create_dir_all_durable(&deep, 0o750).unwrap();
        for p in ["a", "a/b", "a/b/c"] {
            let meta = fs::metadata(tmp.path().join(p)).unwrap();
            assert!(meta.is_dir(), "{p}");
            assert_eq!(meta.permissions().mode() & 0o077 & !0o050, 0, "{p}");
        }
        fs::write(deep.join("kept"), b"x").unwrap();
        create_dir_all_durable(&deep, 0o750).unwrap();
        assert_eq!(fs::read(deep.join("kept")).unwrap(), b"x");
        // A file in the way is an error, not a folder made beside it.
        fs::write(tmp.path().join("file"), b"x").unwrap();
        assert!(create_dir_all_durable(&tmp.path().join("file/sub"), 0o750).is_err());
    }

    fn names(path: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    const NAMED: &str = ".f.tmp";

    fn temps() -> [Temp<'static>; 2] {
        [Temp::Unique, Temp::Named(OsStr::new(NAMED))]
    }

    const DURABILITIES: [Durability; 3] =
        [Durability::Unsynced, Durability::Data, Durability::Full];

    #[test]
    fn the_file_is_replaced_whole_and_no_temporary_is_left() {
        for temp in temps() {
            for durability in DURABILITIES {
                let (tmp, dir) = folder();
                fs::write(tmp.path().join("f"), "an old and longer content\n").unwrap();
                replace_bytes(&dir, "f", temp, durability, b"new\n").unwrap();
                let case = format!("{temp:?} {durability:?}");
                assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"new\n", "{case}");
                assert_eq!(names(tmp.path()), ["f"], "{case}");
                let mode = fs::metadata(tmp.path().join("f")).unwrap().permissions();
                assert_eq!(
                    std::os::unix::fs::PermissionsExt::mode(&mode) & 0o600,
                    0o600,
                    "{case}"
                );
            }
        }
    }

    #[test]
    fn a_missing_file_is_created() {
        let (tmp, dir) = folder();
        replace_bytes(&dir, "new", Temp::Unique, Durability::Full, b"x").unwrap();
        assert_eq!(fs::read(tmp.path().join("new")).unwrap(), b"x");
        assert_eq!(names(tmp.path()), ["new"]);
    }

    /// A crash before the rename is simulated by a write that fails half
    /// way: the old content stays and the temporary is removed.
    #[test]
    fn a_failed_write_keeps_the_old_content_and_removes_the_temporary() {
        for temp in temps() {
            for durability in DURABILITIES {
                let (tmp, dir) = folder();
                fs::write(tmp.path().join("f"), "old\n").unwrap();
                let e = replace(&dir, "f", temp, durability, &mut |w| {
                    w.write_all(b"half of the ")?;
                    Err(io::Error::other("disk gone"))
                })
                .unwrap_err();
                let case = format!("{temp:?} {durability:?}");
                assert_eq!(e.to_string(), "disk gone", "{case}");
                assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"old\n", "{case}");
                assert_eq!(names(tmp.path()), ["f"], "{case}");
            }
        }
    }

    #[test]
    fn a_failed_rename_removes_the_temporary() {
        for temp in temps() {
            let (tmp, dir) = folder();
            fs::create_dir(tmp.path().join("d")).unwrap();
            fs::write(tmp.path().join("d/inside"), "keep").unwrap();
            assert!(replace_bytes(&dir, "d", temp, Durability::Full, b"x").is_err());
            assert_eq!(names(tmp.path()), ["d"], "{temp:?}");
            assert_eq!(fs::read(tmp.path().join("d/inside")).unwrap(), b"keep");
        }
    }

    #[test]
    fn a_link_at_the_name_is_replaced_not_written_through() {
        for temp in temps() {
            let (tmp, dir) = folder();
            fs::write(tmp.path().join("target"), "keep").unwrap();
            std::os::unix::fs::symlink("target", tmp.path().join("f")).unwrap();
            replace_bytes(&dir, "f", temp, Durability::Data, b"new").unwrap();
            assert_eq!(fs::read(tmp.path().join("target")).unwrap(), b"keep");
            let meta = fs::symlink_metadata(tmp.path().join("f")).unwrap();
            assert!(meta.file_type().is_file(), "{temp:?}");
        }
    }

    #[test]
    fn a_named_temporary_reuses_a_leftover_but_never_follows_a_link() {
        let (tmp, dir) = folder();
        fs::write(tmp.path().join(NAMED), "a leftover longer than the content").unwrap();
        replace_bytes(&dir, "f", temps()[1], Durability::Full, b"new").unwrap();
        assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"new");
        assert_eq!(names(tmp.path()), ["f"]);

        fs::write(tmp.path().join("target"), "keep").unwrap();
        std::os::unix::fs::symlink("target", tmp.path().join(NAMED)).unwrap();
        assert!(replace_bytes(&dir, "f", temps()[1], Durability::Full, b"x").is_err());
        assert_eq!(fs::read(tmp.path().join("target")).unwrap(), b"keep");
        assert_eq!(fs::read(tmp.path().join("f")).unwrap(), b"new");
    }
}
