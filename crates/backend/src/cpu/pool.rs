//! A persistent thread pool for per-token work: the caller plus `n - 1` workers pull task
//! indices from one atomic counter. Workers spin briefly after a job (the next op of the
//! forward pass follows within microseconds) and then park, so an idle engine costs no CPU.
//!
//! One job runs at a time; `run` returns only after every task has finished, which is what
//! makes lending the borrowed closure to the workers sound.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How many times a worker polls for the next job before parking (~100 µs or more:
/// the next op of a forward pass follows within microseconds).
const SPIN_POLLS: u32 = 20_000;

type Job = dyn Fn(usize) + Sync + 'static;

struct Shared {
    /// Bumped once per job; workers wait for it to change.
    generation: AtomicU64,
    /// The current job, as a raw fat pointer valid while `run` is on the stack.
    job: Mutex<Option<JobPtr>>,
    next_task: AtomicUsize,
    n_tasks: AtomicUsize,
    /// Workers still inside the current job.
    active: AtomicUsize,
    shutdown: AtomicBool,
    park_lock: Mutex<()>,
    park_cv: Condvar,
}

#[derive(Clone, Copy)]
struct JobPtr(*const Job);
// SAFETY: the pointee is `Sync` and outlives every use (see `ThreadPool::run`).
unsafe impl Send for JobPtr {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job at a time.
    run_lock: Mutex<()>,
}

impl ThreadPool {
    /// A pool that runs jobs on `n_threads` threads in total (the caller included).
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            next_task: AtomicUsize::new(0),
            n_tasks: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            park_lock: Mutex::new(()),
            park_cv: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("neagari-cpu-{i}"))
                    .spawn(move || worker(s))
                    .expect("spawning a CPU worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i < n_tasks` across the pool and returns when all are done.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        if n_tasks == 1 || self.workers.is_empty() {
            for i in 0..n_tasks {
                f(i);
            }
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: erases the lifetime of `job`; it is only dereferenced by workers between
        // the generation bump below and `active` dropping to zero, and we wait for that
        // before returning (also on unwind, via `WaitGuard`).
        let job: &'static Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(job) };
        let ptr = JobPtr(job as *const Job);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(ptr);
        s.next_task.store(0, Ordering::Relaxed);
        s.n_tasks.store(n_tasks, Ordering::Relaxed);
        s.active.store(self.workers.len(), Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        {
            let _l = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.park_cv.notify_all();
        }
        let _wait = WaitGuard(s);
        run_tasks(s, job);
    }
}

/// Waits for the workers to leave the current job, even if the caller's task panicked.
struct WaitGuard<'a>(&'a Shared);

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let s = self.0;
        // Make sure no new task is claimed once we start waiting after a panic.
        s.next_task.store(usize::MAX / 2, Ordering::Relaxed);
        while s.active.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn run_tasks(s: &Shared, job: &Job) {
    let n = s.n_tasks.load(Ordering::Relaxed);
    loop {
        let i = s.next_task.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        job(i);
    }
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin, then park.
        let mut polls = 0u32;
        loop {
            if s.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = s.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if polls < SPIN_POLLS {
                polls += 1;
                std::hint::spin_loop();
                continue;
            }
            let l = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            if s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Acquire) {
                let _unused = s.park_cv.wait_timeout(l, Duration::from_millis(50));
            }
        }
        let ptr = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(JobPtr(p)) = ptr {
            // SAFETY: `run` keeps the closure alive until `active` reaches zero.
            let job = unsafe { &*p };
            // A panicking task must not kill the worker or leave `active` high.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_tasks(&s, job)));
        }
        s.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _l = self
                .shared
                .park_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.park_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that tasks of one job may share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr<T>(pub *mut T);

impl<T> SyncPtr<T> {
    /// The pointer; a method so closures capture the whole `Sync` wrapper.
    pub fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: users only write disjoint index ranges from different tasks.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SyncPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = ThreadPool::new(3);
        for n in [0usize, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn survives_a_panicking_task() {
        let pool = ThreadPool::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(64, |i| {
                if i == 5 {
                    panic!("boom");
                }
            })
        }));
        // The panic may land on the caller or a worker; either way the pool keeps working.
        let _ = r;
        let count = AtomicUsize::new(0);
        pool.run(100, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 100);
    }
}
