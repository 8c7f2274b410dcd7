//! What the spool commands see and do: list the bundles of a spool, read a
//! finished bundle's result, move failed bundles back to the inbox, delete
//! them, and expire old `done/` entries. Every result file is read through
//! [`crate::fs::spoolfs`]: a producer may have replaced it with a FIFO, a link
//! to `/dev/zero` or a hard link, and none of that may hang or leak.

use super::inbox::probe_inbox;
use super::{ATTEMPTS_FILE, Folder, MAX_RESULT_BYTES, RESULT_FILE, Spool, is_ignored_name};
use crate::fs::spoolfs;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

/// One line of `spool list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpoolEntry {
    pub pipeline_id: String,
    pub spool: &'static str,
    pub name: String,
    pub modified: String,
    pub stage: Option<String>,
    pub error: Option<String>,
    /// Inbox entries: why the entry waits (docs/contract.md §13.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `work/` entries the agent defers (docs/contract.md §18.3): attempts,
    /// since when, the last error and the next try.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deferred: Option<super::queue::Deferral>,
    /// Entries of an intake pipeline that are in its bucket
    /// (docs/contract.md §22.4): `s3://bucket/path`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
}

/// Lists the entries of `folders`, oldest first. Inbox entries carry their
/// state and the reason they wait.
pub fn list(spool: &Spool, folders: &[Folder]) -> io::Result<Vec<SpoolEntry>> {
    let mut out = Vec::new();
    for &folder in folders {
        if folder == Folder::Inbox {
            out.extend(list_inbox(spool)?);
            continue;
        }
        let dir = spool.folder(folder);
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // The agent's own record, not the bundle's: its producer cannot
        // change what is shown.
        let deferral = if folder == Folder::Work {
            super::queue::deferral(spool.pipeline_folder())
                .ok()
                .flatten()
        } else {
            None
        };
        let mut rows = Vec::new();
        for entry in entries {
            let entry = entry?;
            let raw = entry.file_name();
            // The exact name (JSON escapes it); text printers make it inert.
            // A name that is not UTF-8 can only be shown escaped.
            let name = raw
                .to_str()
                .map_or_else(|| crate::text::escape::inert_os(&raw), str::to_owned);
            if is_ignored_name(&name) {
                continue;
            }
            let entry_name = name.clone();
            // lstat: a name is listed, never followed.
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let (stage, error) = if folder == Folder::Failed {
                match raw
                    .to_str()
                    .ok_or_else(|| "its name is not UTF-8".to_owned())
                    .and_then(|raw| read_result(spool, folder, raw))
                {
                    Ok(read) if read.unverified => (None, Some(UNVERIFIED.to_owned())),
                    Ok(read) => {
                        let text = |key: &str| {
                            read.doc
                                .get(key)
                                .and_then(|v| v.as_str())
                                .map(str::to_owned)
                        };
                        (text("stage"), text("error"))
                    }
                    Err(e) => (None, Some(e)),
                }
            } else {
                (None, None)
            };
            rows.push((
                modified,
                SpoolEntry {
                    pipeline_id: spool.pipeline_id.clone(),
                    spool: folder.as_str(),
                    name,
                    modified: format_time(modified),
                    stage,
                    error,
                    state: None,
                    reason: None,
                    deferred: deferral.clone().filter(|d| d.bundle == entry_name),
                    bucket: None,
                },
            ));
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        out.extend(rows.into_iter().map(|(_, e)| e));
    }
    Ok(out)
}

fn format_time(t: SystemTime) -> String {
    crate::catalog::format_time(time::OffsetDateTime::from(t))
}

/// The inbox, each entry with its state (docs/contract.md §13.4), oldest first.
fn list_inbox(spool: &Spool) -> io::Result<Vec<SpoolEntry>> {
    let now = SystemTime::now();
    // What holds back the whole pipeline (docs/contract.md §18.2, §18.5).
    let folder = spool.pipeline_folder();
    let hold = super::queue::hold(folder);
    let held = matches!(hold, Ok(Some(_)));
    let behind = match (hold, super::queue::deferral(folder)) {
        (Ok(Some(h)), _) => format!(
            "; the pipeline is held since {} (`distributor spool release {}` resumes it)",
            crate::text::wording::human_time(&h.since),
            spool.pipeline_id
        ),
        (_, Ok(Some(d))) => format!(
            "; waits behind the deferred bundle {} (next try {})",
            d.bundle,
            crate::text::wording::human_time(&d.next_try)
        ),
        _ => String::new(),
    };
    // The agent judges the inbox with its own permissions, which may not
    // be the caller's (root sees what the agent may not read as ready):
    // what it refuses is shown as it decided.
    let verdicts = super::queue::verdicts(folder);
    let mut rows: Vec<(SystemTime, SpoolEntry)> =
        probe_inbox(&spool.inbox, &spool.limits, spool.signed)?
            .into_iter()
            .map(|p| {
                let (seen, _) = p.decide(now, None, &spool.timing.for_listing());
                let mut state = seen.as_str();
                let mut reason = p.reason(seen, now, &spool.timing);
                if held && seen == super::Waiting::Ready {
                    // Not at the next scan: once released (said below).
                    reason = "complete; claimed once the pipeline is released".to_owned();
                }
                if let Some(v) = verdicts.get(&p.name) {
                    if v.state != state {
                        reason = format!(
                            "{} (the agent's verdict, at {}; with this command's permissions it looks {state}: {reason})",
                            v.reason,
                            crate::text::wording::human_time(&v.at)
                        );
                    } else {
                        reason = v.reason.clone();
                    }
                    // The agent records only what it refuses.
                    state = super::Waiting::Unreadable.as_str();
                }
                reason.push_str(&behind);
                // The last change of anything in the entry: a producer cannot
                // set it (modification times can be, and rsync copies them).
                let since = p.last_change;
                (
                    since,
                    SpoolEntry {
                        pipeline_id: spool.pipeline_id.clone(),
                        spool: Folder::Inbox.as_str(),
                        name: p.name.clone(),
                        modified: format_time(since),
                        stage: None,
                        error: None,
                        state: Some(state),
                        reason: Some(reason),
                        deferred: None,
                        bucket: None,
                    },
                )
            })
            .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    Ok(rows.into_iter().map(|(_, e)| e).collect())
}

/// A finished bundle's result document.
#[derive(Debug, Clone)]
pub struct ResultDoc {
    pub doc: serde_json::Value,
    /// A failed bundle of which the agent kept no copy (one filed by an
    /// older version, or the copy could not be written): `doc` is then the
    /// `.distributor-result.json` inside the bundle, which its producer can
    /// change, and must not be shown as the agent's result.
    pub unverified: bool,
}

/// What `spool list` and `status` say instead of an unverified result's
/// stage and error.
pub const UNVERIFIED: &str = "result unverified: the agent kept no copy of it, and the bundle's own .distributor-result.json can be changed by its producer; `distributor spool show` prints that copy, marked unverified";

/// Reads the result of the finished bundle `folder/name`: for a failed
/// bundle the agent's own copy, else (or when there is none, then marked
/// unverified) the `.distributor-result.json` inside it, refusing (with
/// the reason as text) anything but a small regular file of JSON.
pub fn read_result(spool: &Spool, folder: Folder, name: &str) -> Result<ResultDoc, String> {
    if folder == Folder::Failed {
        let (kept, file) = spool.kept_result(name);
        if let Ok(bytes) = spoolfs::read_capped_at(&kept.join(file), MAX_RESULT_BYTES)
            && let Ok(doc) = serde_json::from_slice(&bytes)
        {
            return Ok(ResultDoc {
                doc,
                unverified: false,
            });
        }
    }
    let path = spool.folder(folder).join(name).join(RESULT_FILE);
    let bytes = spoolfs::read_capped_at(&path, MAX_RESULT_BYTES).map_err(|e| {
        if e.is_missing() {
            format!("no {RESULT_FILE} in the bundle")
        } else {
            format!("{RESULT_FILE} {e}; not read")
        }
    })?;
    let doc =
        serde_json::from_slice(&bytes).map_err(|_| format!("{RESULT_FILE} is not valid JSON"))?;
    Ok(ResultDoc {
        doc,
        unverified: folder == Folder::Failed,
    })
}

/// Why [`retry`] or [`delete`] did nothing for the bundle named, or
/// stopped part way.
#[derive(Debug, thiserror::Error)]
pub enum FailedError {
    /// The name is not a bundle name, or names no bundle of `failed/`;
    /// the message says which and how to list them.
    #[error("{0}")]
    Unknown(String),
    /// Reading, moving or removing the bundle failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl FailedError {
    /// Exit code of the command (docs/contract.md §9): a wrong name is a
    /// usage error.
    pub fn exit_code(&self) -> u8 {
        match self {
            FailedError::Unknown(_) => crate::runtime::exit::EXIT_USAGE,
            FailedError::Io(_) => crate::runtime::exit::EXIT_FAILURE,
        }
    }
}

/// Checks that `name` is a plain entry name, with the hint to list them.
fn check_name(name: &str, listing: &str) -> Result<(), FailedError> {
    if name.contains('/') || name.starts_with('.') || name.is_empty() || name.contains('\0') {
        return Err(FailedError::Unknown(format!(
            "{:?} is not a bundle name; use a name shown by `distributor spool list {listing}`",
            crate::text::escape::inert(name)
        )));
    }
    Ok(())
}

/// The real folder `folder/name`, or why there is none, with the hint.
fn existing(spool: &Spool, folder: Folder, name: &str) -> Result<PathBuf, FailedError> {
    let path = entry(spool, folder, name)?;
    if !super::is_real_folder(&path) {
        // A link or file that stood in for a bundle when it was claimed
        // is filed as failed like one (it was never read through).
        return Err(FailedError::Unknown(format!(
            "{} is not a folder (a symbolic link or a file stood in for the bundle when it was claimed), so there is nothing to retry; remove it with `distributor spool delete {} {}`",
            path.display(),
            crate::text::escape::inert(&spool.pipeline_id),
            crate::text::escape::inert(name)
        )));
    }
    Ok(path)
}

/// The entry `folder/name`, whatever it is (never followed), or why there
/// is none, with the hint.
fn entry(spool: &Spool, folder: Folder, name: &str) -> Result<PathBuf, FailedError> {
    let listing = format!("--{}", folder.as_str());
    check_name(name, &listing)?;
    let path = spool.folder(folder).join(name);
    if fs::symlink_metadata(&path).is_err() {
        return Err(FailedError::Unknown(format!(
            "no {} bundle {:?} in {}; list them with `distributor spool list {listing}`",
            folder.as_str(),
            crate::text::escape::inert(name),
            spool.folder(folder).display()
        )));
    }
    Ok(path)
}

/// Moves `failed/<name>` back into the inbox, clearing its result file and
/// attempt count. Returns the new path.
pub fn retry(spool: &Spool, name: &str) -> Result<PathBuf, FailedError> {
    let from = existing(spool, Folder::Failed, name)?;
    let dir = spoolfs::open_folder_io(&from)?;
    for file in [RESULT_FILE, ATTEMPTS_FILE] {
        spoolfs::remove(&dir, file)?;
    }
    let to = super::move_unique(&from, &spool.inbox, name, super::names::NAME_MAX)?;
    super::forget_result(spool, name)?;
    Ok(to)
}

/// What [`delete`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub path: PathBuf,
    pub files: u64,
    pub bytes: u64,
}

/// Deletes `failed/<name>` with everything in it (links are removed, never
/// followed, `failed/<name>` itself too when it is one; a few descriptors
/// held however deep the tree). Returns what was removed; when something
/// cannot be removed, the rest is and the error names what stays and
/// whose it is.
pub fn delete(spool: &Spool, name: &str) -> Result<Removed, FailedError> {
    use rustix::fd::AsFd;
    let path = entry(spool, Folder::Failed, name)?;
    let failed = spoolfs::open_folder_io(&spool.failed)?;
    let removal = super::expire::remove_entry(failed.as_fd(), std::ffi::OsStr::new(name));
    if let Some(b) = &removal.blocked {
        return Err(FailedError::Io(io::Error::new(
            b.error.kind(),
            format!(
                "cannot remove {}: {}{}; the rest was removed ({} files). Its producer or root must remove it",
                spool.failed.join(b.shown_path()).display(),
                b.error,
                b.owner_text(),
                removal.files
            ),
        )));
    }
    super::forget_result(spool, name)?;
    Ok(Removed {
        path,
        files: removal.files,
        bytes: removal.bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn result_files_that_are_fifos_links_or_huge_are_refused_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool {
            intake: false,
            pipeline_id: "p".into(),
            inbox: tmp.path().join("inbox"),
            work: tmp.path().join("work"),
            done: tmp.path().join("done"),
            failed: tmp.path().join("failed"),
            limits: crate::bundle::Limits::default(),
            signed: false,
            timing: super::super::Timing {
                settle: std::time::Duration::from_millis(250),
                incomplete_timeout: std::time::Duration::from_secs(600),
                once: false,
            },
        };
        let b = spool.failed.join("b");
        fs::create_dir_all(&b).unwrap();
        type Make<'a> = &'a dyn Fn(&Path);
        let cases: &[(&str, Make, &str)] = &[
            (
                "fifo",
                &|p| {
                    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                    // SAFETY: valid NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
                },
                "is a named pipe (FIFO); not read",
            ),
            (
                "zero",
                &|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
                "is a symbolic link; not read",
            ),
            ("none", &|_| {}, "no .distributor-result.json in the bundle"),
            (
                "junk",
                &|p| fs::write(p, b"{").unwrap(),
                "is not valid JSON",
            ),
        ];
        for (what, make, want) in cases {
            let _ = fs::remove_file(b.join(RESULT_FILE));
            make(&b.join(RESULT_FILE));
            let got = read_result(&spool, Folder::Failed, "b").unwrap_err();
            assert!(got.ends_with(want), "{what}: {got}");
        }
    }
}
