//! The config a running agent serves, kept where commands find it when
//! the file has changed since (docs/operations.md, "Reloading"): after a
//! reload the agent refused, every command would otherwise stop at the
//! file's error (exit 2), and the running agent could not be inspected.
//!
//! The agent writes `<spool>/.distributor-config.json` (the file's path,
//! its text, when it was accepted) at start and after each reload it
//! accepts, and `<spool>/.distributor-reload-refused.json` (when, and why)
//! when it refuses one. Commands that only read (`status`, `spool list`,
//! `spool show`, `catalog`, `verify`) use the kept text when the file does
//! not load, with a warning naming the file's error.

use super::{Config, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The kept copy of the config in force, in the spool.
pub const IN_FORCE_FILE: &str = ".distributor-config.json";
/// The last reload the agent refused, in the spool (gone once one works).
pub const REFUSED_FILE: &str = ".distributor-reload-refused.json";
/// The most read of either.
const CAP: u64 = 4 << 20;

/// The config the agent serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InForce {
    /// The config file it was read from.
    pub path: PathBuf,
    pub text: String,
    /// When the agent accepted it (RFC 3339).
    pub at: String,
}

/// A reload the agent refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Refused {
    pub at: String,
    pub error: String,
}

fn now() -> String {
    crate::catalog::format_time(time::OffsetDateTime::now_utc())
}

fn write<T: Serialize>(spool: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let dir = crate::fs::spoolfs::open_folder_io(spool)?;
    crate::fs::spoolfs::replace(&dir, name, &bytes, false)
}

/// Removes from the top of `spool` the temporary files that agents killed
/// while writing there left (`.distributor-tmp-<pid>-<n>` of a pid no
/// longer running); an agent still running may be writing its own.
pub fn remove_dead_temps(spool: &Path) {
    let Ok(dir) = crate::fs::spoolfs::open_folder_io(spool) else {
        return;
    };
    let Ok(entries) = dir.entries() else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = name
            .strip_prefix(crate::fs::replace_file::TEMP_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        let dead = matches!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        );
        if dead && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = crate::fs::spoolfs::remove(&dir, name);
        }
    }
}

fn read<T: for<'de> Deserialize<'de>>(spool: &Path, name: &str) -> Option<T> {
    let dir = crate::fs::spoolfs::open_folder_io(spool).ok()?;
    let bytes = crate::fs::spoolfs::read_capped(&dir, name, CAP).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The agent: `config` (read from `path` as `text`) is in force; a
/// refused reload is over.
pub fn record(config: &Config, path: &Path, text: &str) {
    let kept = InForce {
        path: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        text: text.to_owned(),
        at: now(),
    };
    if let Err(e) = write(&config.spool, IN_FORCE_FILE, &kept) {
        log::warn!(
            "cannot keep a copy of the config in force in {} ({e}); after a reload that is refused, `status` cannot show this agent",
            config.spool.join(IN_FORCE_FILE).display()
        );
    }
    if let Ok(dir) = crate::fs::spoolfs::open_folder_io(&config.spool) {
        let _ = crate::fs::spoolfs::remove(&dir, REFUSED_FILE);
    }
}

/// The agent: a reload was refused for `error`; `config` stays in force.
pub fn record_refusal(config: &Config, error: &str) {
    let refused = Refused {
        at: now(),
        error: error.to_owned(),
    };
    if let Err(e) = write(&config.spool, REFUSED_FILE, &refused) {
        log::warn!(
            "cannot record the refused reload in {} ({e})",
            config.spool.join(REFUSED_FILE).display()
        );
    }
}

/// The last refused reload recorded in `spool`, if the agent has not
/// accepted one since.
pub fn refused(spool: &Path) -> Option<Refused> {
    read(spool, REFUSED_FILE)
}

/// Reads the config at `path` like [`super::load`]; when it does not load,
/// the copy the running agent keeps of the config it serves (found in the
/// spool the file names, else the default one), if it was read from this
/// same file. `Ok((config, None))` for the file itself; `Ok((config,
/// Some(warning)))` for the kept copy; the file's error when there is
/// none.
pub fn load_for_reading(path: &Path) -> Result<(Config, Option<String>), ConfigError> {
    let error = match super::load(path) {
        Ok(config) => return Ok((config, None)),
        Err(e) => e,
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let spool = spool_named(&text, path);
    let file = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Some(kept) = read::<InForce>(&spool, IN_FORCE_FILE).filter(|k| k.path == file) else {
        return Err(error);
    };
    match super::parse(&kept.text, path) {
        Ok(config) => {
            let warning = format!(
                "{error}\nwarning: showing the config the agent last accepted, at {} (kept in {}), not the file: fix the file, then reload the agent (SIGHUP)",
                kept.at,
                spool.join(IN_FORCE_FILE).display()
            );
            Ok((config, Some(warning)))
        }
        Err(_) => Err(error),
    }
}

/// The spool a config text names (its top-level `spool`, relative to
/// the file's folder; in text that is not YAML any more, a line that
/// starts with `spool:`), or the default one when it names none.
fn spool_named(text: &str, path: &Path) -> PathBuf {
    let named = match serde_norway::from_str::<serde_norway::Value>(text) {
        Ok(v) => v.get("spool").and_then(|s| s.as_str()).map(PathBuf::from),
        Err(_) => text.lines().find_map(|line| {
            let value = line.strip_prefix("spool:")?;
            let value = value.split(" #").next()?.trim().trim_matches(['"', '\'']);
            (!value.is_empty()).then(|| PathBuf::from(value))
        }),
    };
    match named {
        Some(p) if p.is_relative() => path.parent().unwrap_or(Path::new(".")).join(p),
        Some(p) => p,
        None => PathBuf::from(super::DEFAULT_SPOOL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_killed_agents_left_goes_and_nothing_of_a_live_one() {
        let spool = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let prefix = crate::fs::replace_file::TEMP_PREFIX;
        let left = format!("{prefix}{dead}-0");
        let live = format!("{prefix}{}-7", std::process::id());
        for name in [&left, &live, &format!("{prefix}odd")] {
            std::fs::write(spool.path().join(name), b"partial").unwrap();
        }
        remove_dead_temps(spool.path());
        let mut names: Vec<String> = std::fs::read_dir(spool.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [live, format!("{prefix}odd")]);
    }

    /// (config text, the spool it names) for a file at /etc/d/config.yaml.
    #[test]
    fn the_spool_is_found_in_a_config_that_does_not_load() {
        let cases = [
            ("spool: /srv/spool\npipelines: [\n", "/srv/spool"),
            ("spool: ./spool # here\npipelines: {{{\n", "/etc/d/./spool"),
            ("spool: \"/q s\"\nbogus: 1\n", "/q s"),
            ("pipelines: []\nbogus: 1\n", DEFAULT_SPOOL_FOR_TEST),
            ("not: [ yaml\n", DEFAULT_SPOOL_FOR_TEST),
        ];
        for (text, spool) in cases {
            assert_eq!(
                spool_named(text, Path::new("/etc/d/config.yaml")),
                PathBuf::from(spool),
                "{text:?}"
            );
        }
    }

    const DEFAULT_SPOOL_FOR_TEST: &str = super::super::DEFAULT_SPOOL;
}
