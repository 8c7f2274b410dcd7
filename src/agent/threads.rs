//! The agent's thread pool for a batch's reading, hashing and writing, lent
//! to publishing through [`publish::Workers`]; publishing starts no thread.

use crate::publish;

/// The threads a batch's reading, hashing and writing run on: one per core,
/// at most four, taking jobs from a shared queue.
pub(super) struct Threads(pub(super) usize);

impl Threads {
    pub(super) fn per_core() -> Threads {
        Threads(
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .clamp(1, 4),
        )
    }
}

impl publish::Workers for Threads {
    fn run_all<'a>(&self, jobs: Vec<Box<dyn FnOnce() + Send + 'a>>) {
        if self.0 < 2 || jobs.len() < 2 {
            return publish::InOrder.run_all(jobs);
        }
        let queue = std::sync::Mutex::new(jobs.into_iter());
        // The bundle's progress follows its work onto the pool's threads.
        let progress = crate::progress::current();
        std::thread::scope(|scope| {
            for _ in 0..self.0 {
                let progress = progress.clone();
                scope.spawn(|| {
                    let _counted = crate::progress::enter(progress);
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
