//! `rollback` and `releases` on a destination published as releases
//! (docs/contract.md §20.3): switching the link back under the releases
//! folder's lock, and listing what each release holds.

use super::{MaintainError, OwnedRoot, json_text};
use crate::backend::local::journal;
use crate::backend::local::releases::{self, Current, Releases};
use crate::backend::{Doing, io_fault};
use crate::config::Backend;
use crate::fs::storage::Root;
use serde::Serialize;
use std::fmt::Write as _;

/// What `rollback` did, or would do (`--json`).
#[derive(Debug, Serialize)]
pub struct RolledBack {
    pub dry_run: bool,
    pub pipeline_id: String,
    pub destination_id: String,
    /// The release `path` pointed to (`null`: none).
    pub from: Option<String>,
    pub to: String,
}

impl RolledBack {
    pub fn to_text(&self) -> String {
        let from = self.from.as_deref().unwrap_or("(no release)");
        if self.dry_run {
            format!("would roll back from {from} to {} (dry run)\n", self.to)
        } else {
            format!("rolled back from {from} to {}\n", self.to)
        }
    }

    pub fn to_json(&self) -> String {
        json_text(self)
    }
}

/// One release as `releases` lists it.
#[derive(Debug, Serialize)]
pub struct Release {
    pub release: String,
    pub current: bool,
    pub created: Option<String>,
    /// The source ids whose outputs its catalog records.
    pub sources: Vec<String>,
}

/// `releases`: newest first.
#[derive(Debug, Serialize)]
pub struct ReleaseList {
    pub releases: Vec<Release>,
}

impl ReleaseList {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        if self.releases.is_empty() {
            s.push_str("no releases yet\n");
        }
        for r in &self.releases {
            let _ = writeln!(
                s,
                "{} {}  {}  {}",
                if r.current { "*" } else { " " },
                r.release,
                r.created.as_deref().unwrap_or("-"),
                if r.sources.is_empty() {
                    "(no sources)".to_owned()
                } else {
                    r.sources.join(" ")
                }
            );
        }
        s
    }

    pub fn to_json(&self) -> String {
        json_text(self)
    }
}

/// The destination's `releases`, or why it has none.
fn kept(target: &OwnedRoot) -> Result<u32, MaintainError> {
    match (&target.destination.backend, target.destination.releases) {
        (Backend::Local, Some(keep)) => Ok(keep),
        _ => Err(MaintainError::NoReleases {
            pipeline_id: target.pipeline_id.to_owned(),
            destination_id: target.destination.id.clone(),
            root: target.root_text(),
        }),
    }
}

fn storage(target: &OwnedRoot, doing: Doing) -> impl FnOnce(std::io::Error) -> MaintainError {
    let error = io_fault(&target.destination.root, doing);
    move |e| target.error(error(e))
}

/// Opens the releases (locked when `write`); `None` when there are none.
fn open(target: &OwnedRoot, write: bool) -> Result<Option<Releases>, MaintainError> {
    let link = &target.destination.root;
    // Never create the releases folder: nothing to act on without it.
    if !releases::folder_of(link).is_dir() {
        return Ok(None);
    }
    Releases::open_to_switch(link, write, target.lock_timeout).map_err(|e| match e {
        releases::Opened::Lock(e) => MaintainError::Lock(e),
        releases::Opened::Io(e) => storage(target, Doing::OpenFolder)(e),
    })
}

/// `rollback`: points the destination's link at the release before the
/// current one, or at `to`.
pub fn rollback(
    target: &OwnedRoot,
    to: Option<&str>,
    dry_run: bool,
) -> Result<RolledBack, MaintainError> {
    kept(target)?;
    let no_earlier = |why: String| MaintainError::NoEarlierRelease {
        root: target.root_text(),
        why,
    };
    let Some(mut rel) = open(target, !dry_run)? else {
        return Err(no_earlier("it has no releases yet".to_owned()));
    };
    let names = rel.names().map_err(storage(target, Doing::ListFolder))?;
    let from = match &rel.current {
        Current::Release(name) | Current::Missing(name) => Some(name.clone()),
        Current::Plain => {
            return Err(no_earlier(
                "it is still a plain folder, which its next publication converts into the first release".to_owned(),
            ));
        }
        Current::Nothing => None,
    };
    let to = match to {
        Some(to) => {
            if !names.iter().any(|n| n == to) {
                return Err(MaintainError::NoSuchRelease {
                    release: to.to_owned(),
                    root: target.root_text(),
                    known: names.join(", "),
                });
            }
            to.to_owned()
        }
        None => {
            let Some(from) = &from else {
                return Err(no_earlier(format!(
                    "its link is missing; name the release to point it at with --to (releases: {})",
                    names.join(", ")
                )));
            };
            // Newest first: the first one older than `from` (which may be
            // gone, deleted by hand).
            let key = releases::parse_name(from);
            match names.iter().find(|n| releases::parse_name(n) < key) {
                Some(earlier) => earlier.clone(),
                None => {
                    return Err(no_earlier(format!("release {from} is the oldest it keeps")));
                }
            }
        }
    };
    if !dry_run && from.as_deref() != Some(to.as_str()) {
        rel.switch(&to)
            .map_err(storage(target, Doing::Switch(to.clone())))?;
        log::warn!(
            "{}: rolled back from release {} to release {to} by `distributor rollback`; the next publication builds on {to}",
            rel.link().display(),
            from.as_deref().unwrap_or("(none)")
        );
    }
    Ok(RolledBack {
        dry_run,
        pipeline_id: target.pipeline_id.to_owned(),
        destination_id: target.destination.id.clone(),
        from,
        to,
    })
}

/// `releases`: every release, newest first, with the sources it holds.
pub fn list(target: &OwnedRoot) -> Result<ReleaseList, MaintainError> {
    kept(target)?;
    let Some(rel) = open(target, false)? else {
        return Ok(ReleaseList {
            releases: Vec::new(),
        });
    };
    let names = rel.names().map_err(storage(target, Doing::ListFolder))?;
    let memory = target.process.catalog_cache();
    let mut releases = Vec::new();
    for name in names {
        let path = rel.path_of(&name);
        let read = |e| {
            target.error(io_fault(
                &path,
                Doing::Read(crate::catalog::STATE_FILE.to_owned()),
            )(e))
        };
        let state = match Root::open(&path).map_err(read)? {
            Some(root) => journal::read_state(&root, memory).map_err(read)?,
            None => crate::catalog::State::Absent,
        };
        releases.push(Release {
            current: rel.current == Current::Release(name.clone()),
            created: releases::created(&name),
            sources: releases::sources_in(&state),
            release: name,
        });
    }
    Ok(ReleaseList { releases })
}
