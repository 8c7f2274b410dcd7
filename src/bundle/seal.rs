//! Sealing a folder into a bundle for producers: [`seal`] and [`SealError`].
//! It must never write anything but `manifest.json`, through a reserved
//! temporary name.

use super::MANIFEST;
use super::error::Problem;
use super::manifest::{Manifest, ManifestFile, compute_digest, normalise_created};
use super::open::{display_segments, kind_label, open_checked, walk};
use crate::hashing;
use crate::paths::{IdKind, RelPath, check_id};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use time::OffsetDateTime;

/// Why `seal` did not write a manifest.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("invalid --id: {reason}")]
    BadId { id: String, reason: String },
    #[error("invalid --created: {reason}")]
    BadCreated { reason: String },
    #[error("{}: cannot read: {io}", path.display())]
    Unreadable { path: PathBuf, io: io::Error },
    #[error(
        "cannot seal {}: {}; only regular files can be sealed, so move these out of the folder or replace them with regular files",
        dir.display(),
        problem_list(.problems)
    )]
    Refused {
        dir: PathBuf,
        problems: Vec<Problem>,
    },
    #[error(
        "{}: nothing to seal: the folder holds no regular file besides {MANIFEST} and reserved .distributor* names",
        dir.display()
    )]
    Empty { dir: PathBuf },
    #[error("{}: cannot write {MANIFEST}: {io}", dir.display())]
    Write { dir: PathBuf, io: io::Error },
}

impl SealError {
    /// Exit code of `bundle seal` (SPEC §9, §11.14): usage errors 2, the rest 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            SealError::BadId { .. } | SealError::BadCreated { .. } => 2,
            _ => 1,
        }
    }
}

fn problem_list(problems: &[Problem]) -> String {
    let list: Vec<String> = problems.iter().map(Problem::to_string).collect();
    list.join("; ")
}

/// Temporary name used while writing `manifest.json`. It is reserved
/// (`.distributor*`), so a leftover from an interrupted seal is never sealed
/// into the bundle or published.
fn temp_manifest_name() -> String {
    format!(".distributor-manifest.json.tmp-{}", std::process::id())
}

/// Turns `dir` into a bundle: hashes every regular file below it (dot-files
/// included; the top-level `manifest.json` and reserved `.distributor*` names
/// excluded) and writes `dir/manifest.json` atomically. Refuses links and
/// special files anywhere in the tree. `created` defaults to now (UTC, whole
/// seconds).
pub fn seal(dir: &Path, id: &str, created: Option<OffsetDateTime>) -> Result<Manifest, SealError> {
    check_id(IdKind::Source, id).map_err(|reason| SealError::BadId {
        id: id.to_owned(),
        reason,
    })?;
    let created = match created {
        Some(t) => normalise_created(t).map_err(|reason| SealError::BadCreated { reason })?,
        None => OffsetDateTime::now_utc().truncate_to_second(),
    };
    let root =
        Dir::open_ambient_dir(dir, ambient_authority()).map_err(|io| SealError::Unreadable {
            path: dir.to_path_buf(),
            io,
        })?;

    let mut found: Vec<RelPath> = Vec::new();
    let mut problems: Vec<Problem> = Vec::new();
    walk(&root, &mut |segments, ft| {
        let shown = display_segments(segments);
        let last = segments.last().map(OsString::as_os_str).unwrap_or_default();
        let Some(name) = last.to_str() else {
            problems.push(Problem::at(
                shown,
                "name is not valid UTF-8; rename it (bundle paths are UTF-8)",
            ));
            return false;
        };
        if let Err(e) = RelPath::parse(name) {
            problems.push(Problem::at(shown, format!("name cannot be used: {e}")));
            return false;
        }
        if ft.is_dir() {
            return true;
        }
        if !ft.is_file() {
            problems.push(Problem::at(shown, format!("is {}", kind_label(ft))));
            return false;
        }
        match RelPath::parse(&shown) {
            Ok(path) => found.push(path),
            Err(e) => problems.push(Problem::at(shown, format!("path cannot be used: {e}"))),
        }
        false
    })
    .map_err(|(path, io)| SealError::Unreadable {
        path: dir.join(path),
        io,
    })?;
    if !problems.is_empty() {
        return Err(SealError::Refused {
            dir: dir.to_path_buf(),
            problems,
        });
    }
    if found.is_empty() {
        return Err(SealError::Empty {
            dir: dir.to_path_buf(),
        });
    }
    found.sort();

    let mut files = Vec::with_capacity(found.len());
    for path in found {
        let mut file = open_checked(&root, &path).map_err(|r| match r.io {
            Some(io) => SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            },
            None => SealError::Refused {
                dir: dir.to_path_buf(),
                problems: vec![r.problem],
            },
        })?;
        let hashed =
            hashing::copy_hashed(&mut file, None, None).map_err(|io| SealError::Unreadable {
                path: dir.join(path.as_str()),
                io,
            })?;
        files.push(ManifestFile {
            path,
            sha256: hashed.sha256,
            size: hashed.size,
        });
    }
    let manifest = Manifest {
        id: id.to_owned(),
        created,
        digest: compute_digest(&files),
        files,
    };
    write_manifest(&root, &manifest.to_json()).map_err(|io| SealError::Write {
        dir: dir.to_path_buf(),
        io,
    })?;
    Ok(manifest)
}

/// Writes `manifest.json` in `root`: temporary reserved name, `sync_all`,
/// rename over the final name, then sync the folder.
fn write_manifest(root: &Dir, text: &str) -> io::Result<()> {
    let temp = temp_manifest_name();
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW);
    let written = (|| {
        let mut file = root.open_with(&temp, &options)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        root.rename(&temp, root, MANIFEST)
    })();
    if let Err(e) = written {
        let _ = root.remove_file(&temp);
        return Err(e);
    }
    let mut folder = OpenOptions::new();
    folder.read(true).custom_flags(libc::O_DIRECTORY);
    root.open_with(".", &folder)?.sync_all()
}
