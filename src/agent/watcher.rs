//! The file watcher: inbox events become wake-ups of the pipeline that owns
//! the inbox. Events are hints only; it must never claim or publish anything.
//!
//! It watches each inbox folder itself and nothing below it: one inotify
//! watch per pipeline, whatever producers drop (docs/security.md, "What a
//! producer can make the agent spend"). A recursive watch would follow the
//! producers' folders, and their links, with a watch per folder, spending
//! the agent user's inotify budget (shared by every process of that user)
//! on trees a producer chose. What happens inside an inbox entry is read by
//! the probe instead: an entry that waits (no manifest yet, incomplete,
//! settling) is probed again within [`crate::spool::INCOMPLETE_POLL`], and
//! its quiet time comes from the change times of everything in it.

use super::Wake;
use crossbeam_channel::Sender;
use notify::{Config, RecursiveMode, Watcher};
use std::path::PathBuf;

/// Watches every inbox; events are hints that wake the owning pipeline.
pub(super) fn start_watcher(
    routes: Vec<(PathBuf, Sender<Wake>)>,
) -> Option<notify::RecommendedWatcher> {
    let handler_routes = routes.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let wake_all = || {
            for (_, tx) in &handler_routes {
                let _ = tx.send(Wake::Scan);
            }
        };
        match event {
            Ok(event) if event.need_rescan() => {
                log::info!("file watcher lost events; rescanning every inbox");
                wake_all();
            }
            Ok(event) if !is_hint(event.kind) => {}
            Ok(event) => {
                for (inbox, tx) in &handler_routes {
                    if event.paths.iter().any(|p| p.starts_with(inbox)) {
                        let _ = tx.send(Wake::Scan);
                    }
                }
            }
            Err(e) => {
                log::warn!("file watcher error ({e}); rescanning every inbox");
                wake_all();
            }
        }
    };
    // Never following a link is notify's setting for recursive walks; with
    // a non-recursive watch on the operator's own inbox folder nothing is
    // walked at all, and it is set anyway.
    let config = Config::default().with_follow_symlinks(false);
    let mut watcher = match notify::RecommendedWatcher::new(handler, config) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("cannot start the file watcher ({e}); relying on periodic rescans");
            return None;
        }
    };
    for (inbox, _) in &routes {
        if let Err(e) = watcher.watch(inbox, RecursiveMode::NonRecursive) {
            log::warn!(
                "cannot watch {} ({e}); relying on periodic rescans",
                inbox.display()
            );
        }
    }
    Some(watcher)
}

/// Whether a watcher event can mean a bundle arrived or changed. Opening,
/// reading and closing without writing are not: the agent's own scans open
/// the inbox and its manifests, and waking on those would rescan forever.
pub(super) fn is_hint(kind: notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        notify::EventKind::Access(_) => false,
        _ => true,
    }
}
