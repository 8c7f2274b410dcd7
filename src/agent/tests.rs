//! Unit tests of the agent: the thread pool and which watcher
//! events are hints.

use super::watcher::is_hint;
use super::*;
use crate::publish;

#[test]
fn threads_run_every_job_exactly_once() {
    use publish::Workers;
    let runs: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
    for threads in [
        crate::runtime::workers::PerCore(1),
        crate::runtime::workers::PerCore(4),
    ] {
        let jobs = runs
            .iter()
            .map(|r| {
                Box::new(move || {
                    r.fetch_add(1, Ordering::SeqCst);
                }) as Box<dyn FnOnce() + Send + '_>
            })
            .collect();
        threads.run_all(jobs);
    }
    assert!(runs.iter().all(|r| r.load(Ordering::SeqCst) == 2));
}

#[test]
fn only_changes_are_hints() {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode};
    let cases = [
        (EventKind::Access(AccessKind::Open(AccessMode::Any)), false),
        (EventKind::Access(AccessKind::Read), false),
        (
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            false,
        ),
        (
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            true,
        ),
        (EventKind::Create(CreateKind::Folder), true),
        (EventKind::Modify(ModifyKind::Name(RenameMode::To)), true),
        (EventKind::Remove(notify::event::RemoveKind::Any), true),
        (EventKind::Any, true),
        (EventKind::Other, true),
    ];
    for (kind, expected) in cases {
        assert_eq!(is_hint(kind), expected, "{kind:?}");
    }
}

#[test]
fn the_once_summary_names_skipped_pipelines_only_when_there_are_any() {
    for (done, failed, skipped, want) in [
        (2, 0, 0, "agent --once finished: 2 done, 0 failed"),
        (0, 1, 0, "agent --once finished: 0 done, 1 failed"),
        (
            0,
            0,
            1,
            "agent --once finished: 0 done, 0 failed, 1 pipeline skipped (another agent serves it)",
        ),
        (
            3,
            0,
            2,
            "agent --once finished: 3 done, 0 failed, 2 pipelines skipped (another agent serves them)",
        ),
    ] {
        assert_eq!(
            once_summary(done, failed, 2, 0, skipped, 0),
            want.replacen(" failed", " failed, 2 incomplete left in the inbox", 1)
        );
        assert_eq!(
            once_summary(done, failed, 0, 3, skipped, 0),
            want.replacen(
                " failed",
                " failed, 3 could not be claimed and stay in the inbox (the log says why)",
                1
            )
        );
        assert_eq!(once_summary(done, failed, 0, 0, skipped, 0), want);
        assert_eq!(
            once_summary(done, failed, 0, 0, skipped, 1),
            want.replacen(
                " failed",
                " failed, 1 could not be filed and stay in work/",
                1
            )
        );
    }
}
