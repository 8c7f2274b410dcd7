//! Whether an agent serves a pipeline, for `distributor status`.
//!
//! The serving agent holds an exclusive `flock(2)` on
//! `<spool>/<pipeline>/.distributor-agent.lock` and, once it holds it, writes
//! `<spool>/<pipeline>/.distributor-agent.json` (`{"pid", "since"}`) next to
//! it, atomically. Readers trust that file only while the lock is held: a
//! killed agent leaves its file behind, but its lock goes with it. Both
//! files live in the agent's own folder, not in a producer's inbox; the
//! file is still read without following links and with a size cap.

use std::fs::TryLockError;
use std::io;
use std::path::{Path, PathBuf};

/// The lock file a serving agent holds, in the pipeline's spool folder.
pub const LOCK_FILE: &str = ".distributor-agent.lock";
/// What the serving agent says about itself, next to the lock file.
pub const INFO_FILE: &str = ".distributor-agent.json";
/// The most of [`INFO_FILE`] that is read.
const INFO_CAP: u64 = 4096;

/// What `status` shows under `agent`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Presence {
    pub running: bool,
    pub pid: Option<u32>,
    /// RFC 3339 time since which this agent serves the pipeline.
    pub since: Option<String>,
}

/// `<pipeline spool>/.distributor-agent.lock`.
pub fn lock_path(pipeline_spool: &Path) -> PathBuf {
    pipeline_spool.join(LOCK_FILE)
}

/// Whether an agent holds the lock of the pipeline whose spool folder is
/// `pipeline_spool`, and (when it does) its pid and start time. No lock
/// file means no agent ever served it. Errors are those of opening the
/// lock file (most often: permission denied).
pub fn read(pipeline_spool: &Path) -> io::Result<Presence> {
    let absent = Presence {
        running: false,
        pid: None,
        since: None,
    };
    let dir = match crate::fs::spoolfs::open_folder_io(pipeline_spool) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(absent),
        Err(e) => return Err(e),
    };
    let lock = match crate::fs::spoolfs::open_file(&dir, std::ffi::OsStr::new(LOCK_FILE)) {
        Ok(f) => f,
        Err(crate::fs::spoolfs::EntryError::Missing) => return Ok(absent),
        Err(crate::fs::spoolfs::EntryError::Io(e)) => return Err(e),
        Err(e) => {
            return Err(io::Error::other(format!(
                "{}: {e}",
                lock_path(pipeline_spool).display()
            )));
        }
    };
    match lock.try_lock_shared() {
        // Nobody holds it; dropping `lock` releases our shared lock at once.
        Ok(()) => return Ok(absent),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let info = read_info(&pipeline_spool.join(INFO_FILE)).unwrap_or_default();
    Ok(Presence {
        running: true,
        pid: info.pid,
        since: info.since,
    })
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
struct Info {
    pid: Option<u32>,
    since: Option<String>,
}

fn read_info(path: &Path) -> Option<Info> {
    let bytes = crate::fs::spoolfs::read_capped_at(path, INFO_CAP).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Called by the agent right after it took the lock: records this process
/// as the one serving the pipeline. Keeps the earlier `since` when the file
/// already names this process (a config reload re-takes the lock).
pub fn announce(pipeline_spool: &Path) -> io::Result<()> {
    let path = pipeline_spool.join(INFO_FILE);
    let pid = std::process::id();
    let since = read_info(&path)
        .filter(|i| i.pid == Some(pid))
        .and_then(|i| i.since)
        .unwrap_or_else(|| crate::catalog::format_time(time::OffsetDateTime::now_utc()));
    let body = serde_json::to_vec(&Info {
        pid: Some(pid),
        since: Some(since),
    })
    .map_err(io::Error::other)?;
    let dir = crate::fs::spoolfs::open_folder_io(pipeline_spool)?;
    crate::fs::spoolfs::replace(&dir, INFO_FILE, &body, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_info_file_counts_only_while_the_lock_is_held() {
        let tmp = tempfile::tempdir().unwrap();
        let none = read(tmp.path()).unwrap();
        assert!(!none.running && none.pid.is_none() && none.since.is_none());

        let dir = crate::fs::spoolfs::open_folder_io(tmp.path()).unwrap();
        let lock = crate::fs::spoolfs::open_lock(&dir, LOCK_FILE).unwrap();
        lock.lock().unwrap();
        announce(tmp.path()).unwrap();
        let held = read(tmp.path()).unwrap();
        assert!(held.running);
        assert_eq!(held.pid, Some(std::process::id()));
        let since = held.since.clone().unwrap();
        assert!(crate::catalog::parse_time(&since).is_ok(), "{since}");

        // Announcing again from the same process keeps the earlier time; a
        // file left by another process is replaced.
        let old = r#"{"pid": PID, "since": "2020-01-01T00:00:00Z"}"#;
        let pid = std::process::id();
        std::fs::write(
            tmp.path().join(INFO_FILE),
            old.replace("PID", &pid.to_string()),
        )
        .unwrap();
        announce(tmp.path()).unwrap();
        assert_eq!(
            read(tmp.path()).unwrap().since.as_deref(),
            Some("2020-01-01T00:00:00Z")
        );
        std::fs::write(
            tmp.path().join(INFO_FILE),
            old.replace("PID", &(pid + 1).to_string()),
        )
        .unwrap();
        announce(tmp.path()).unwrap();
        let replaced = read(tmp.path()).unwrap();
        assert_eq!(replaced.pid, Some(pid));
        assert_ne!(replaced.since.as_deref(), Some("2020-01-01T00:00:00Z"));

        // A dead agent's file stays, but without the lock it means nothing.
        drop(lock);
        let gone = read(tmp.path()).unwrap();
        assert_eq!(
            gone,
            Presence {
                running: false,
                pid: None,
                since: None
            }
        );
    }

    #[test]
    fn an_oversized_or_linked_info_file_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let big = format!("{{\"pid\": 1, \"since\": \"{}\"}}", "x".repeat(5000));
        std::fs::write(tmp.path().join("big"), big).unwrap();
        assert!(read_info(&tmp.path().join("big")).is_none());
        std::fs::write(tmp.path().join("real"), r#"{"pid": 7}"#).unwrap();
        std::os::unix::fs::symlink("real", tmp.path().join(INFO_FILE)).unwrap();
        assert!(read_info(&tmp.path().join(INFO_FILE)).is_none());
        assert_eq!(read_info(&tmp.path().join("real")).unwrap().pid, Some(7));
    }
}
