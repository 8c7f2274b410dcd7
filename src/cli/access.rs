//! Who may do what to a folder, asked as the user running the command:
//! `access(2)` with the effective ids, the nearest existing parent of a
//! folder that does not exist yet, owner and group names, and the text of
//! the fix to print. Looks only; changes nothing.

use rustix::fs::{Access, AtFlags, CWD, accessat};
use rustix::io::Errno;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// True when the effective user may create entries in `dir` (write and
/// search permission, `faccessat(.., W_OK | X_OK, AT_EACCESS)`).
pub(super) fn can_write(dir: &Path) -> io::Result<bool> {
    check(dir, Access::WRITE_OK | Access::EXEC_OK)
}

/// True when the effective user may list `dir` and enter it.
pub(super) fn can_read(dir: &Path) -> io::Result<bool> {
    check(dir, Access::READ_OK | Access::EXEC_OK)
}

fn check(path: &Path, mode: Access) -> io::Result<bool> {
    match accessat(CWD, path, mode, AtFlags::EACCESS) {
        Ok(()) => Ok(true),
        Err(Errno::ACCESS | Errno::ROFS | Errno::PERM) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `path` itself when it exists, else its nearest existing ancestor.
pub(super) fn nearest_existing(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .find(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_ok())
        .map(Path::to_path_buf)
}

/// The first folder on the way from `/` to `path` that the effective user
/// cannot enter and list (the one to fix), if any.
pub(super) fn first_unreadable(path: &Path) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .filter(|p| !p.as_os_str().is_empty())
        .find(|p| matches!(can_read(p), Ok(false)))
        .map(Path::to_path_buf)
}

/// The name of the effective user, or its number.
pub(super) fn current_user() -> String {
    user_name(rustix::process::geteuid().as_raw())
}

pub(super) use crate::fs::users::{group_name, user_name};

/// The effective user's primary group name.
pub(super) fn current_group() -> String {
    group_name(rustix::process::getegid().as_raw())
}

/// "owned by USER:GROUP, mode 0750" for a message, or "" when it cannot be read.
pub(super) fn describe(path: &Path) -> String {
    match std::fs::symlink_metadata(path) {
        Ok(m) => format!(
            "owned by {}:{}, mode {:04o}",
            user_name(m.uid()),
            group_name(m.gid()),
            m.mode() & 0o7777
        ),
        Err(_) => String::new(),
    }
}

/// What to tell someone who cannot read `path` (a spool folder): which
/// folder blocks them and how to get in.
pub(super) fn read_fix(path: &Path) -> String {
    let blocked = first_unreadable(path).unwrap_or_else(|| path.to_path_buf());
    match std::fs::symlink_metadata(&blocked) {
        Ok(m) => {
            let owner = user_name(m.uid());
            let group = group_name(m.gid());
            let run_as = if owner == "root" {
                "run the command with sudo".to_owned()
            } else {
                format!("run the command as {owner} (`sudo -u {owner} distributor ...`)")
            };
            format!(
                "{} is {}; join group {group} (`sudo adduser {} {group}`, then log in again) or {run_as}; see install.md, Permissions",
                blocked.display(),
                describe(&blocked),
                current_user()
            )
        }
        Err(_) => format!(
            "{} cannot be read; run the command as the agent's user (see install.md, Permissions)",
            blocked.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_existing_walks_up_to_a_folder_that_exists() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        assert_eq!(nearest_existing(&deep).unwrap(), tmp.path());
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        assert_eq!(nearest_existing(&deep).unwrap(), tmp.path().join("a/b"));
        assert_eq!(nearest_existing(Path::new("no-such-folder/x")), None);
    }

    #[test]
    fn names_of_ids_fall_back_to_numbers() {
        assert_eq!(user_name(0), "root");
        assert_eq!(group_name(0), "root");
        assert_eq!(user_name(4_000_000_000), "4000000000");
    }
}

/// A folder the agent will need to write and the user running the command
/// cannot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(super) struct NotWritable {
    /// What the folder is for ("spool of pipeline p", "root of destination d ...").
    pub what: String,
    /// The configured folder.
    pub path: String,
    /// The folder that was checked: `path`, or its nearest existing parent.
    pub checked: String,
    /// The command that fixes it.
    pub fix: String,
}

impl NotWritable {
    /// One `warning:` line for `config check`.
    pub(super) fn to_text(&self) -> String {
        let detail = describe(Path::new(&self.checked));
        let place = if self.checked == self.path {
            self.path.clone()
        } else {
            format!(
                "{} (it does not exist yet, and its parent {} is not writable)",
                self.path, self.checked
            )
        };
        format!(
            "{} {place} is not writable by user {} ({detail}); fix, as root: {}",
            self.what,
            current_user(),
            self.fix
        )
    }
}

/// Every spool folder and destination root of `config` that the effective
/// user could not create or write, with the `install -d` that fixes it.
pub(super) fn not_writable(config: &crate::config::Config) -> Vec<NotWritable> {
    let mut wanted: Vec<(String, PathBuf, &str)> = Vec::new();
    for p in &config.pipelines {
        let spool = p.spool_dir(config);
        wanted.push((format!("spool of pipeline {}", p.id), spool.clone(), "0750"));
        if !p.inbox.starts_with(&spool) {
            // An inbox below the pipeline's spool is created by the agent.
            wanted.push((
                format!("inbox of pipeline {}", p.id),
                p.inbox.clone(),
                "0750",
            ));
        }
        for folder in ["work", "done", "failed"] {
            let dir = spool.join(folder);
            if dir.exists() {
                wanted.push((format!("{folder}/ of pipeline {}", p.id), dir, "0750"));
            }
        }
        // An s3 root is not a folder here; its access shows at the first write.
        for d in &p.destinations {
            let Some(root) = d.local_root() else { continue };
            wanted.push((
                format!("root of destination {} (pipeline {})", d.id, p.id),
                root.to_path_buf(),
                "0755",
            ));
        }
    }
    let (user, group) = (current_user(), current_group());
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (what, path, mode) in wanted {
        if !seen.insert(path.clone()) {
            continue;
        }
        let Some(checked) = nearest_existing(&path) else {
            continue;
        };
        if !matches!(can_write(&checked), Ok(false)) {
            continue;
        }
        out.push(NotWritable {
            what,
            path: path.display().to_string(),
            checked: checked.display().to_string(),
            fix: format!(
                "install -d -o {user} -g {group} -m {mode} {}",
                shell_word(&path.display().to_string())
            ),
        });
    }
    out
}

/// `text` quoted for a POSIX shell when it needs it.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@%=".contains(&b));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod shell_tests {
    use super::shell_word;

    #[test]
    fn paths_are_quoted_only_when_needed() {
        for (text, want) in [
            ("/srv/www/site", "/srv/www/site"),
            ("/srv/my site", "'/srv/my site'"),
            ("/srv/it's", r"'/srv/it'\''s'"),
            ("", "''"),
        ] {
            assert_eq!(shell_word(text), want);
        }
    }
}
