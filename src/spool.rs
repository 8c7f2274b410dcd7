//! A pipeline's spool folders (`inbox`, `work`, `done`, `failed`) and the
//! moves between them: find complete bundles, claim, record the result,
//! file away, list, retry. Every move is a `rename` within one file system,
//! so a bundle is always in exactly one folder. No threads, no publishing.

use crate::config::{Config, Pipeline};
use crate::report::RunReport;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Result document written inside a finished bundle.
pub const RESULT_FILE: &str = ".distributor-result.json";
/// Attempt counter kept inside a bundle in `work/`.
pub const ATTEMPTS_FILE: &str = ".distributor-attempts";
/// The attempt a batch of bundles in `work/` is making, kept in `work/`
/// while the batch runs: one file for the batch instead of one per bundle.
pub const BATCH_FILE: &str = ".distributor-batch.json";
/// The manifest whose presence makes a bundle complete.
pub const MANIFEST: &str = crate::bundle::MANIFEST;

/// Which spool folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Folder {
    Inbox,
    Work,
    Done,
    Failed,
}

impl Folder {
    pub fn as_str(self) -> &'static str {
        match self {
            Folder::Inbox => "inbox",
            Folder::Work => "work",
            Folder::Done => "done",
            Folder::Failed => "failed",
        }
    }
}

/// The four folders of one pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spool {
    pub pipeline_id: String,
    pub inbox: PathBuf,
    pub work: PathBuf,
    pub done: PathBuf,
    pub failed: PathBuf,
}

impl Spool {
    pub fn of(config: &Config, pipeline: &Pipeline) -> Spool {
        let base = pipeline.spool_dir(config);
        Spool {
            pipeline_id: pipeline.id.clone(),
            inbox: pipeline.inbox.clone(),
            work: base.join("work"),
            done: base.join("done"),
            failed: base.join("failed"),
        }
    }

    pub fn folder(&self, folder: Folder) -> &Path {
        match folder {
            Folder::Inbox => &self.inbox,
            Folder::Work => &self.work,
            Folder::Done => &self.done,
            Folder::Failed => &self.failed,
        }
    }

    /// Creates the four folders and checks they share one file system, so
    /// every move is an atomic rename.
    pub fn create(&self) -> io::Result<()> {
        let mut device = None;
        for folder in [Folder::Inbox, Folder::Work, Folder::Done, Folder::Failed] {
            let path = self.folder(folder);
            fs::create_dir_all(path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create spool folder {}: {e}", path.display()),
                )
            })?;
            let dev = fs::metadata(path)?.dev();
            match device {
                None => device = Some((dev, path.to_owned())),
                Some((d, ref first)) if d != dev => {
                    return Err(io::Error::other(format!(
                        "spool folders {} and {} of pipeline {} are on different file systems; bundles move between them by rename, so put the inbox on the same file system as the spool",
                        first.display(),
                        path.display(),
                        self.pipeline_id
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// A bundle folder found in a spool folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub path: PathBuf,
    /// Modification time of `manifest.json` (arrival order).
    pub manifest_modified: SystemTime,
    /// A cheap fingerprint of the bundle's top level for the settle rule.
    pub fingerprint: (SystemTime, u64, SystemTime),
}

/// True when the inbox entry name is staging (ignored).
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
}

/// What a spool folder holds.
#[derive(Debug, Default)]
pub struct Scan {
    /// Complete bundles, in arrival order (manifest modification time, then
    /// name). A manifest that is not a regular file (a symlink, a folder)
    /// counts as present: verification then fails the bundle with the reason.
    pub found: Vec<Found>,
    /// Folders without a manifest yet.
    pub incomplete: Vec<PathBuf>,
    /// Names that are not folders (files, symlinks): never bundles.
    pub strays: Vec<String>,
}

/// Scans a spool folder for bundles.
pub fn scan(dir: &Path) -> io::Result<Scan> {
    let mut found = Vec::new();
    let mut incomplete = Vec::new();
    let mut strays = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scan::default()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            log::warn!(
                "{}: ignoring an entry whose name is not UTF-8; rename it",
                dir.display()
            );
            continue;
        };
        if is_ignored_name(&name) {
            continue;
        }
        if !entry.file_type()?.is_dir() {
            strays.push(name);
            continue;
        }
        let path = entry.path();
        match fs::symlink_metadata(path.join(MANIFEST)) {
            Ok(m) => {
                let dir_meta = fs::symlink_metadata(&path)?;
                let modified = m.modified()?;
                found.push(Found {
                    name,
                    fingerprint: (modified, m.len(), dir_meta.modified()?),
                    manifest_modified: modified,
                    path,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => incomplete.push(path),
            Err(e) => return Err(e),
        }
    }
    found.sort_by(|a, b| {
        a.manifest_modified
            .cmp(&b.manifest_modified)
            .then_with(|| a.name.cmp(&b.name))
    });
    strays.sort();
    Ok(Scan {
        found,
        incomplete,
        strays,
    })
}

/// Moves `from` into folder `to` under its name, adding `.1`, `.2`, … when
/// the name is taken. Returns the new path.
pub fn move_unique(from: &Path, to: &Path, name: &str) -> io::Result<PathBuf> {
    for n in 0u32.. {
        let candidate = if n == 0 {
            to.join(name)
        } else {
            to.join(format!("{name}.{n}"))
        };
        if fs::symlink_metadata(&candidate).is_ok() {
            continue;
        }
        match rename_noreplace(from, &candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    unreachable!("u32 names exhausted")
}

/// `rename(2)` that refuses to replace an existing target.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from_c = CString::new(from.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let to_c = CString::new(to.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: both are valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes a small bookkeeping file inside a bundle, in place and without
/// fsync. Both such files are rewritten whole whenever the bundle is
/// processed again, and a power cut that loses them only makes the agent
/// redo a bundle, which is idempotent (`skip_same`). Skipping a temporary
/// file and rename saves two inodes per bundle on a busy spool.
fn write_in_place(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    fs::write(dir.join(name), bytes)
}

/// Removes temporary files that a killed agent left at the top of a bundle
/// in work/ (half-written result or attempt files of older versions, which
/// wrote them through a temporary file). Only this pipeline's worker touches
/// a bundle in work/, so any found there is stale.
pub fn remove_stale_temps(bundle: &Path) -> io::Result<()> {
    for entry in fs::read_dir(bundle)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(crate::storage::is_temp_name)
            && entry.file_type()?.is_file()
        {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Attempts already made on a bundle (0 when never tried).
pub fn attempts(bundle: &Path) -> u32 {
    fs::read_to_string(bundle.join(ATTEMPTS_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Records the number of attempts made (kept across restarts).
pub fn set_attempts(bundle: &Path, n: u32) -> io::Result<()> {
    write_in_place(bundle, ATTEMPTS_FILE, format!("{n}\n").as_bytes())
}

/// Records that the bundles of `attempts` (name in work/, attempt number)
/// start that attempt together. Like the per-bundle counter it is written
/// in place without fsync.
pub fn begin_batch(spool: &Spool, attempts: &[(String, u32)]) -> io::Result<()> {
    let doc: std::collections::BTreeMap<&str, u32> = attempts
        .iter()
        .map(|(name, n)| (name.as_str(), *n))
        .collect();
    let bytes = serde_json::to_vec(&doc).map_err(io::Error::other)?;
    write_in_place(&spool.work, BATCH_FILE, &bytes)
}

/// The batch is over; its bundles carry their own counters from here on.
pub fn end_batch(spool: &Spool) -> io::Result<()> {
    match fs::remove_file(spool.work.join(BATCH_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// After a crash during a batch: each bundle of the batch still in work/
/// gets the attempt the batch had started as its own counter, then the
/// batch file goes. A torn batch file (power cut) only loses that attempt.
pub fn settle_batch(spool: &Spool) -> io::Result<()> {
    let bytes = match fs::read(spool.work.join(BATCH_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let doc: std::collections::BTreeMap<String, u32> =
        serde_json::from_slice(&bytes).unwrap_or_default();
    for (name, n) in doc {
        if name.contains('/') || name == "." || name == ".." || is_ignored_name(&name) {
            continue;
        }
        let bundle = spool.work.join(&name);
        if bundle.is_dir() && attempts(&bundle) < n {
            set_attempts(&bundle, n)?;
        }
    }
    end_batch(spool)
}

/// Writes the result document into the bundle, then files it into `done/`
/// or `failed/`. Returns where it went.
pub fn finish(spool: &Spool, bundle: &Path, name: &str, report: &RunReport) -> io::Result<PathBuf> {
    write_in_place(bundle, RESULT_FILE, report.to_json().as_bytes())?;
    crate::failpoint::hit("spool.after_result");
    let to = if report.ok {
        &spool.done
    } else {
        &spool.failed
    };
    let moved = move_unique(bundle, to, name)?;
    crate::failpoint::hit("spool.after_move");
    Ok(moved)
}

/// One line of `spool list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    pub pipeline_id: String,
    pub spool: &'static str,
    pub name: String,
    pub modified: String,
    pub stage: Option<String>,
    pub error: Option<String>,
}

/// Lists the bundles of `folders`, oldest first.
pub fn list(spool: &Spool, folders: &[Folder]) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for &folder in folders {
        let dir = spool.folder(folder);
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let mut rows = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_ignored_name(&name) {
                continue;
            }
            let modified = entry.metadata()?.modified()?;
            let (stage, error) = if folder == Folder::Failed {
                read_failure(&entry.path())
            } else {
                (None, None)
            };
            rows.push((
                modified,
                Entry {
                    pipeline_id: spool.pipeline_id.clone(),
                    spool: folder.as_str(),
                    name,
                    modified: crate::catalog::format_time(time::OffsetDateTime::from(modified)),
                    stage,
                    error,
                },
            ));
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        out.extend(rows.into_iter().map(|(_, e)| e));
    }
    Ok(out)
}

fn read_failure(bundle: &Path) -> (Option<String>, Option<String>) {
    let Ok(bytes) = fs::read(bundle.join(RESULT_FILE)) else {
        return (None, Some(format!("no {RESULT_FILE} in the bundle")));
    };
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return (None, Some(format!("{RESULT_FILE} is not valid JSON")));
    };
    let text = |key: &str| doc.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    (text("stage"), text("error"))
}

/// Moves `failed/<name>` back into the inbox, clearing its result file and
/// attempt count. Returns the new path.
pub fn retry(spool: &Spool, name: &str) -> io::Result<PathBuf> {
    if name.contains('/') || name.starts_with('.') || name.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a bundle name; use a name shown by `distributor spool list --failed`"
            ),
        ));
    }
    let from = spool.failed.join(name);
    if !fs::symlink_metadata(&from).is_ok_and(|m| m.is_dir()) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no failed bundle {name:?} in {}; list them with `distributor spool list --failed`",
                spool.failed.display()
            ),
        ));
    }
    for file in [RESULT_FILE, ATTEMPTS_FILE] {
        match fs::remove_file(from.join(file)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    move_unique(&from, &spool.inbox, name)
}

/// Deletes `done/` entries modified longer than `retention` ago. Returns
/// how many were removed.
pub fn expire_done(spool: &Spool, retention: std::time::Duration) -> io::Result<usize> {
    if retention.is_zero() {
        return Ok(0);
    }
    let now = SystemTime::now();
    let mut removed = 0;
    let entries = match fs::read_dir(&spool.done) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let meta = entry.metadata()?;
        let age = now.duration_since(meta.modified()?).unwrap_or_default();
        if age > retention {
            let path = entry.path();
            if meta.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool(tmp: &Path) -> Spool {
        let s = Spool {
            pipeline_id: "p".into(),
            inbox: tmp.join("inbox"),
            work: tmp.join("work"),
            done: tmp.join("done"),
            failed: tmp.join("failed"),
        };
        s.create().unwrap();
        s
    }

    #[test]
    fn scan_finds_complete_bundles_in_arrival_order_and_ignores_staging() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for (name, manifest) in [("b", true), ("a", true), (".staging", true), ("c", false)] {
            fs::create_dir(s.inbox.join(name)).unwrap();
            if manifest {
                fs::write(s.inbox.join(name).join(MANIFEST), b"{}").unwrap();
            }
        }
        let old = SystemTime::now() - std::time::Duration::from_secs(60);
        fs::File::options()
            .write(true)
            .open(s.inbox.join("b").join(MANIFEST))
            .unwrap()
            .set_modified(old)
            .unwrap();
        fs::write(s.inbox.join("stray-file"), b"").unwrap();
        let scan = scan(&s.inbox).unwrap();
        let names: Vec<_> = scan.found.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(scan.incomplete, [s.inbox.join("c")]);
        assert_eq!(scan.strays, ["stray-file"]);
    }

    #[test]
    fn move_unique_never_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for _ in 0..3 {
            fs::create_dir(s.work.join("x")).unwrap();
            fs::write(s.work.join("x/f"), b"1").unwrap();
            move_unique(&s.work.join("x"), &s.done, "x").unwrap();
        }
        let mut names: Vec<_> = fs::read_dir(&s.done)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["x", "x.1", "x.2"]);
    }

    #[test]
    fn a_batch_left_by_a_crash_becomes_per_bundle_counters() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        for name in ["fresh", "retried", "gone-to-done"] {
            fs::create_dir(s.work.join(name)).unwrap();
        }
        set_attempts(&s.work.join("retried"), 4).unwrap();
        fs::rename(s.work.join("gone-to-done"), s.done.join("gone-to-done")).unwrap();
        fs::create_dir(tmp.path().join("outside")).unwrap();
        let batch: Vec<(String, u32)> = [
            ("fresh", 1),
            ("retried", 3),
            ("gone-to-done", 1),
            ("../outside", 1),
        ]
        .iter()
        .map(|(n, a)| (n.to_string(), *a))
        .collect();
        begin_batch(&s, &batch).unwrap();

        settle_batch(&s).unwrap();
        assert_eq!(
            attempts(&s.work.join("fresh")),
            1,
            "the batch's attempt counts"
        );
        assert_eq!(
            attempts(&s.work.join("retried")),
            4,
            "a higher count is kept"
        );
        assert_eq!(
            attempts(&s.done.join("gone-to-done")),
            0,
            "only work/ is touched"
        );
        assert_eq!(
            attempts(&tmp.path().join("outside")),
            0,
            "names stay in work/"
        );
        assert!(!s.work.join(BATCH_FILE).exists());
        // Nothing to settle, or a torn file: no error, and the file goes.
        settle_batch(&s).unwrap();
        fs::write(s.work.join(BATCH_FILE), b"{\"fre").unwrap();
        settle_batch(&s).unwrap();
        assert!(!s.work.join(BATCH_FILE).exists());
    }

    #[test]
    fn retry_clears_result_and_attempts() {
        let tmp = tempfile::tempdir().unwrap();
        let s = spool(tmp.path());
        let b = s.failed.join("bad");
        fs::create_dir(&b).unwrap();
        fs::write(b.join(RESULT_FILE), br#"{"stage":"verify","error":"x"}"#).unwrap();
        set_attempts(&b, 3).unwrap();
        let rows = list(&s, &[Folder::Failed]).unwrap();
        assert_eq!(rows[0].stage.as_deref(), Some("verify"));
        let back = retry(&s, "bad").unwrap();
        assert_eq!(back, s.inbox.join("bad"));
        assert!(!back.join(RESULT_FILE).exists());
        assert_eq!(attempts(&back), 0);
        assert!(retry(&s, "../etc").is_err());
        assert!(retry(&s, "missing").is_err());
    }
}
