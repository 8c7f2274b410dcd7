//! The file watcher: inbox events become wake-ups of the pipeline that owns
//! the inbox. Events are hints only; it must never claim or publish anything.

use super::Wake;
use crossbeam_channel::Sender;
use notify::{RecursiveMode, Watcher};
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
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("cannot start the file watcher ({e}); relying on periodic rescans");
            return None;
        }
    };
    for (inbox, _) in &routes {
        let Err(e) = watcher.watch(inbox, RecursiveMode::Recursive) else {
            continue;
        };
        // Typically a producer's folder the agent cannot read: watch the
        // inbox itself, so that new entries are still seen at once.
        match watcher.watch(inbox, RecursiveMode::NonRecursive) {
            Ok(()) => log::warn!(
                "cannot watch everything below {} ({e}); new entries are still noticed at once, changes inside existing ones at the next rescan",
                inbox.display()
            ),
            Err(e) => log::warn!(
                "cannot watch {} ({e}); relying on periodic rescans",
                inbox.display()
            ),
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
