//! Lexical path handling and the checks that need the whole resolved config:
//! unique ids, and folders that must not be shared or nested. Paths are
//! compared as text, never looked up on disk.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use super::error::{ConfigError, Place};
use super::model::{Backend, Config, Pipeline};
use super::values::expand_prefix;

/// Removes `.` segments, repeated and trailing separators. `..` is kept:
/// without the file system we cannot know where it leads.
pub(super) fn normalize(path: &Path) -> PathBuf {
    path.components().collect()
}

/// A comparison key: [`normalize`] plus lexical `..` folding, so that
/// `/a/b/../c` and `/a/c` count as the same folder when looking for clashes.
pub(super) fn clash_key(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Checks that need the whole config: unique ids, and folders that must not
/// be shared or nested.
pub(super) fn check_relations(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();
    check_ids(config, &file)?;
    check_spool_folders(config, &file)?;
    check_roots(config, &file)?;
    check_metrics_file(config, &file)
}

/// Pipeline ids are unique; each pipeline's destinations have unique ids,
/// publish something, expand their prefix, and never share a root.
fn check_ids(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();
    let mut seen = HashSet::new();
    for p in &config.pipelines {
        if !seen.insert(p.id.as_str()) {
            return Err(ConfigError::DuplicatePipeline {
                file,
                id: p.id.clone(),
            });
        }
    }

    for p in &config.pipelines {
        let mut ids = HashSet::new();
        for d in &p.destinations {
            if !ids.insert(d.id.as_str()) {
                return Err(ConfigError::DuplicateDestination {
                    file,
                    pipeline: p.id.clone(),
                    id: d.id.clone(),
                });
            }
            if !d.publish_source && !d.publish_html {
                return Err(ConfigError::PublishesNothing {
                    file,
                    pipeline: p.id.clone(),
                    destination: d.id.clone(),
                });
            }
            // The template was checked with sample values; check it again
            // with the real pipeline id.
            let sample = time::macros::datetime!(2026-01-31 12:00 UTC);
            if let Err(message) = expand_prefix(&d.prefix, "sample-source", &p.id, sample) {
                return Err(ConfigError::Invalid {
                    at: Place {
                        file,
                        line_column: None,
                    },
                    message: format!("destination {:?} of pipeline {:?}: {message}", d.id, p.id),
                });
            }
        }
        for (i, a) in p.destinations.iter().enumerate() {
            for b in &p.destinations[i + 1..] {
                let same = match (&a.backend, &b.backend) {
                    (Backend::Local, Backend::Local) => clash_key(&a.root) == clash_key(&b.root),
                    (Backend::S3(x), Backend::S3(y)) => x == y,
                    _ => false,
                };
                if same {
                    return Err(ConfigError::SharedRoot {
                        file,
                        pipeline: p.id.clone(),
                        first: a.id.clone(),
                        second: b.id.clone(),
                        root: match &a.backend {
                            Backend::Local => a.root.clone(),
                            Backend::S3(l) => PathBuf::from(l.to_string()),
                        },
                    });
                }
            }
        }
    }
    Ok(())
}

/// A pipeline's inbox, for messages, and its key for overlap checks.
fn inbox(p: &Pipeline) -> (String, PathBuf) {
    (
        format!("the inbox of pipeline {:?} ({})", p.id, p.inbox.display()),
        clash_key(&p.inbox),
    )
}

/// The folders the agent moves bundles through never overlap.
fn check_spool_folders(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();
    for (i, a) in config.pipelines.iter().enumerate() {
        for b in &config.pipelines[i + 1..] {
            if clash_key(&a.inbox) == clash_key(&b.inbox) {
                return Err(ConfigError::SharedInbox {
                    file,
                    first: a.id.clone(),
                    second: b.id.clone(),
                    inbox: a.inbox.clone(),
                });
            }
            let (first, ka) = inbox(a);
            let (second, kb) = inbox(b);
            if overlaps(&ka, &kb) {
                return Err(ConfigError::Overlap {
                    file,
                    first,
                    second,
                });
            }
        }
    }
    for p in &config.pipelines {
        let (first, key) = inbox(p);
        for q in &config.pipelines {
            for stage in ["work", "done", "failed"] {
                let dir = q.spool_dir(config).join(stage);
                if overlaps(&key, &clash_key(&dir)) {
                    let second = format!(
                        "the {stage} folder of pipeline {:?} ({})",
                        q.id,
                        dir.display()
                    );
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
            }
        }
    }

    Ok(())
}

/// Destination roots stay clear of the spool and every inbox: a
/// replacement or forced publication may delete anything in its root.
fn check_roots(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();
    let spool_key = clash_key(&config.spool);
    for p in &config.pipelines {
        // An s3 root is not on this machine's file system.
        for d in p
            .destinations
            .iter()
            .filter(|d| d.backend == Backend::Local)
        {
            // A release destination's releases folder too (§20.2).
            let releases = d.releases.map(|_| crate::backend::releases_folder(&d.root));
            for folder in std::iter::once(&d.root).chain(releases.as_ref()) {
                let root_key = clash_key(folder);
                let first = format!(
                    "the root of destination {:?} of pipeline {:?} ({})",
                    d.id,
                    p.id,
                    folder.display()
                );
                if overlaps(&root_key, &spool_key) {
                    let second = format!("the spool ({})", config.spool.display());
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
                for q in &config.pipelines {
                    let (second, key) = inbox(q);
                    if overlaps(&root_key, &key) {
                        return Err(ConfigError::Overlap {
                            file,
                            first,
                            second,
                        });
                    }
                }
            }
        }
    }

    Ok(())
}

/// The metrics file is rewritten all the time: inside a root it would be
/// unmanaged content, inside a pipeline's folders a stray entry.
fn check_metrics_file(config: &Config, file: &Path) -> Result<(), ConfigError> {
    let file = file.to_path_buf();
    if let Some(metrics) = &config.agent.metrics_file {
        let metrics_key = clash_key(metrics);
        let first = format!("agent.metrics_file ({})", metrics.display());
        for p in &config.pipelines {
            let mut folders = vec![
                (
                    format!(
                        "the spool folder of pipeline {:?} ({})",
                        p.id,
                        p.spool_dir(config).display()
                    ),
                    clash_key(&p.spool_dir(config)),
                ),
                inbox(p),
            ];
            for d in p
                .destinations
                .iter()
                .filter(|d| d.backend == Backend::Local)
            {
                folders.push((
                    format!(
                        "the root of destination {:?} of pipeline {:?} ({})",
                        d.id,
                        p.id,
                        d.root.display()
                    ),
                    clash_key(&d.root),
                ));
            }
            for (second, key) in folders {
                if overlaps(&metrics_key, &key) {
                    return Err(ConfigError::Overlap {
                        file,
                        first,
                        second,
                    });
                }
            }
        }
    }
    Ok(())
}
