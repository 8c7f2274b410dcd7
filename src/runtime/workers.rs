//! Running independent jobs on a few threads, keeping the order of their
//! results: the hashing, copying and renaming of a large bundle or a batch,
//! and the check of a long list of bundle files.

use std::io;
use std::os::fd::AsFd;
use std::sync::{Mutex, OnceLock};

/// Runs independent jobs, possibly several at once. The agent lends its
/// threads through this for a batch's reading, hashing and writing. The
/// only threads publishing starts itself are scoped ones ([`PerCore`]):
/// for staging a large single bundle, and for renames, which mostly wait
/// on the disk; none outlives the call that started it.
pub trait Workers: Sync {
    /// Runs every job once and returns when all have finished.
    fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>);
}

/// Runs the jobs one after the other on the calling thread.
pub struct InOrder;

impl Workers for InOrder {
    fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        for job in jobs {
            job();
        }
    }
}

/// Runs the jobs on one thread per core (at most four), taking them from
/// a shared queue; the agent's batches and `distributor run` use it alike.
/// Threads live only as long as one [`Workers::run_all`].
pub struct PerCore(pub usize);

impl PerCore {
    pub fn new() -> PerCore {
        // The answer reads several cgroup files: a process asks once, in
        // its `ProcessState::per_core`.
        PerCore(
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, 4),
        )
    }
}

impl PerCore {
    /// Threads for work that mostly waits on the disk (renames over
    /// existing files), where more threads than cores still help.
    pub fn for_io() -> PerCore {
        PerCore(8)
    }
}

impl Default for PerCore {
    fn default() -> PerCore {
        PerCore::new()
    }
}

impl Workers for PerCore {
    fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        if self.0 < 2 || jobs.len() < 2 {
            return InOrder.run_all(jobs);
        }
        let queue = Mutex::new(jobs.into_iter());
        // What the jobs read counts towards the caller's progress, and
        // stops at the caller's stop.
        let progress = crate::runtime::progress::current();
        let cancel = crate::runtime::interrupt::entered();
        std::thread::scope(|scope| {
            for _ in 0..self.0 {
                let progress = progress.clone();
                let cancel = cancel.clone();
                scope.spawn(|| {
                    let _counted = crate::runtime::progress::enter(progress);
                    let _cancel = cancel.map(|c| c.enter());
                    loop {
                        let job = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                        match job {
                            Some(job) => job(),
                            None => break,
                        }
                    }
                });
            }
        });
    }
}

/// Maps `f` over `items` as one job per item on `workers`, keeping the
/// order of the results. Used for the reading, hashing and writing of a
/// batch or a large bundle, which would otherwise leave the other cores
/// idle.
pub fn map_on<T: Sync, R: Send>(
    workers: &dyn Workers,
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let f = &f;
    let jobs = items
        .iter()
        .zip(&slots)
        .map(|(item, slot)| {
            Box::new(move || {
                let result = f(item);
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            }) as Box<dyn FnOnce() + Send + '_>
        })
        .collect();
    workers.run_all(jobs);
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("Workers::run_all ran every job")
        })
        .collect()
}

/// Runs `there` on a thread of its own while `here` runs on the calling
/// thread, and returns both results: for two independent pieces of work
/// of one step (the halves of a large read, a catalog written while the
/// outputs are staged). When no thread can be started (a limit on
/// threads), `there` runs on the calling thread after `here`.
pub fn beside<A: Send, B>(there: impl FnOnce() -> A + Send, here: impl FnOnce() -> B) -> (A, B) {
    // Taken back when the thread cannot be started.
    let there = Mutex::new(Some(there));
    let take = || there.lock().unwrap_or_else(|e| e.into_inner()).take();
    // `there` stops at the caller's stop.
    let cancel = crate::runtime::interrupt::entered();
    std::thread::scope(|scope| {
        let started = std::thread::Builder::new()
            .spawn_scoped(scope, || {
                let _cancel = cancel
                    .as_ref()
                    .map(crate::runtime::interrupt::Cancel::enter);
                take().map(|f| f())
            })
            .ok();
        let b = here();
        let a = match started {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                .expect("a thread that started took it"),
            None => take().expect("not started, so still here")(),
        };
        (a, b)
    })
}

/// Something to fsync: an open file or folder.
pub type Syncable = Box<dyn AsFd + Send>;

/// Threads that fsync for [`SyncPool::sync_at_once`]. They live as long
/// as the process's pool: a small publication fsyncs a few files and
/// folders at a time, many times a second, and starting threads for each
/// would cost more than the waits they overlap.
const SYNC_THREADS: usize = 4;

type SyncJob = (Syncable, crossbeam_channel::Sender<io::Result<()>>);

/// The long-lived threads [`SyncPool::sync_at_once`] hands fsyncs to,
/// started on first use and ended when the pool is dropped. A process has
/// one, in its [`crate::runtime::process_state::ProcessState`].
#[derive(Default)]
pub struct SyncPool {
    jobs: OnceLock<Option<crossbeam_channel::Sender<SyncJob>>>,
}

impl SyncPool {
    /// Fsyncs every handle at the same time (the calling thread takes one,
    /// [`SYNC_THREADS`] long-lived threads the others), so that the disk
    /// serves the flushes together instead of one after the other. Returns
    /// once all are done: the first error, if any.
    pub fn sync_at_once(&self, handles: Vec<Syncable>) -> io::Result<()> {
        sync_at_once(self.jobs.get_or_init(start_sync_threads).as_ref(), handles)
    }
}

/// Starts the threads of a [`SyncPool`]: `None` if one cannot be started
/// (every fsync is then made on the calling thread).
fn start_sync_threads() -> Option<crossbeam_channel::Sender<SyncJob>> {
    let (tx, rx) = crossbeam_channel::unbounded::<SyncJob>();
    for i in 0..SYNC_THREADS {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fsync-{i}"))
            .spawn(move || {
                for (handle, done) in rx {
                    let _ = done.send(rustix::fs::fsync(&handle).map_err(io::Error::from));
                }
            });
        if spawned.is_err() {
            return None;
        }
    }
    Some(tx)
}

/// [`SyncPool::sync_at_once`] on the threads that take jobs from `pool`.
fn sync_at_once(
    pool: Option<&crossbeam_channel::Sender<SyncJob>>,
    mut handles: Vec<Syncable>,
) -> io::Result<()> {
    let Some(own) = handles.pop() else {
        return Ok(());
    };
    let (done, results) = crossbeam_channel::bounded(handles.len());
    let mut waiting = 0;
    let mut first_error = None;
    for handle in handles {
        match pool {
            Some(pool) => match pool.send((handle, done.clone())) {
                Ok(()) => waiting += 1,
                Err(returned) => {
                    let (handle, _) = returned.into_inner();
                    if let Err(e) = rustix::fs::fsync(&handle) {
                        first_error.get_or_insert(io::Error::from(e));
                    }
                }
            },
            None => {
                if let Err(e) = rustix::fs::fsync(&handle) {
                    first_error.get_or_insert(io::Error::from(e));
                }
            }
        }
    }
    if let Err(e) = rustix::fs::fsync(&own) {
        first_error.get_or_insert(io::Error::from(e));
    }
    for _ in 0..waiting {
        match results.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(io::Error::other("an fsync thread stopped"));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// [`map_on`] for items in path order: neighbours for which `together`
/// holds (outputs of one folder) run one after the other on one worker, in
/// runs of at most [`RUN`] items, so that workers do not take turns at one
/// folder's lock (creating or renaming a file in a folder holds it).
pub fn map_on_runs<T: Sync, R: Send>(
    workers: &dyn Workers,
    items: &[T],
    together: impl Fn(&T, &T) -> bool,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let mut runs: Vec<&[T]> = Vec::new();
    let mut start = 0;
    for i in 1..=items.len() {
        if i == items.len() || i - start == RUN || !together(&items[i - 1], &items[i]) {
            runs.push(&items[start..i]);
            start = i;
        }
    }
    map_on(workers, &runs, |run| run.iter().map(&f).collect::<Vec<R>>())
        .into_iter()
        .flatten()
        .collect()
}

/// The longest run of [`map_on_runs`]: long enough that one folder's
/// outputs mostly go to one worker, short enough to share a big folder.
const RUN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the jobs last first, as a pool might finish them.
    struct Backwards;

    impl Workers for Backwards {
        fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>) {
            for job in jobs.into_iter().rev() {
                job();
            }
        }
    }

    #[test]
    fn sync_at_once_syncs_every_handle_and_reports_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let handles = |n: usize| -> Vec<Syncable> {
            (0..n)
                .map(|i| {
                    let file = std::fs::File::create(tmp.path().join(format!("f{i}"))).unwrap();
                    Box::new(file) as Syncable
                })
                .collect()
        };
        let pool = SyncPool::default();
        for n in [0, 1, 3, 9] {
            pool.sync_at_once(handles(n)).unwrap();
        }
        // A pipe cannot be fsynced (EINVAL): its error comes back, from the
        // calling thread or from the pool, and the others are still synced.
        for at in [0, 2] {
            let (reader, _writer) = std::io::pipe().unwrap();
            let mut mixed = handles(3);
            mixed.insert(at, Box::new(reader));
            let e = pool.sync_at_once(mixed).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        }
    }

    #[test]
    fn map_on_keeps_the_order_of_the_items_whatever_order_jobs_run_in() {
        let items: Vec<u32> = (0..50).collect();
        let expected: Vec<u32> = items.iter().map(|i| i * 3).collect();
        assert_eq!(map_on(&InOrder, &items, |i| i * 3), expected);
        assert_eq!(map_on(&Backwards, &items, |i| i * 3), expected);
        assert!(map_on(&Backwards, &[] as &[u32], |i| *i).is_empty());
    }

    #[test]
    fn map_on_runs_keeps_the_order_and_groups_neighbours() {
        // (folder, index): 20 folders of 10 items, then one of 100.
        let items: Vec<(u32, u32)> = (0..300)
            .map(|i| (if i < 200 { i / 10 } else { 100 }, i))
            .collect();
        let together = |a: &(u32, u32), b: &(u32, u32)| a.0 == b.0;
        let expected: Vec<u32> = (0..300).map(|i| i * 3).collect();
        // The runs: each folder of 10, then the big one in 64 + 36.
        let mut runs: Vec<Vec<u32>> = (0..20).map(|f| (f * 10..f * 10 + 10).collect()).collect();
        runs.push((200..264).collect());
        runs.push((264..300).collect());
        let in_order: Vec<u32> = runs.concat();
        let backwards: Vec<u32> = runs.iter().rev().flatten().copied().collect();
        for (workers, order) in [
            (&InOrder as &dyn Workers, in_order),
            (&Backwards, backwards),
        ] {
            let seen = Mutex::new(Vec::new());
            let got = map_on_runs(workers, &items, together, |(_, i)| {
                seen.lock().unwrap().push(*i);
                i * 3
            });
            assert_eq!(got, expected);
            // Whatever order the jobs run in, a run's items go one after
            // the other on one job.
            assert_eq!(seen.into_inner().unwrap(), order);
        }
        assert!(map_on_runs(&InOrder, &[] as &[u32], |_, _| true, |i| *i).is_empty());
    }
}
