//! A persistent thread pool for per-token work: the caller plus `n - 1` workers claim task
//! indices from one atomic counter. Workers spin briefly after a job (the next op of the
//! forward pass follows within microseconds) and then park, so an idle engine costs no CPU.
//!
//! One job runs at a time; `run` returns once every task has *finished* — it never waits
//! for a worker that has not claimed a task. That matters on a busy machine: a worker that
//! the OS has not scheduled yet is simply left out of the job instead of stalling the caller
//! for a whole time slice. A claim carries the job's generation, so a worker that wakes late
//! can never claim (and so never dereference) a job that has already returned.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How many times a worker polls for the next job before parking (~100 µs or more:
/// the next op of a forward pass follows within microseconds).
const SPIN_POLLS: u32 = 20_000;
/// Polls between `yield_now` calls while spinning: on an idle machine a yield returns at
/// once; on an oversubscribed one it hands the core to a thread that has real work.
const POLLS_PER_YIELD: u32 = 256;

type Job = dyn Fn(usize) + Sync + 'static;

struct Shared {
    /// Bumped once per job; workers wait for it to change.
    generation: AtomicU64,
    /// The current job: its generation, a raw fat pointer valid while `run` is on the
    /// stack, and its task count.
    job: Mutex<Option<(u64, JobPtr, usize)>>,
    /// `(generation as u32) << 32 | next task index`: a claim succeeds only for the
    /// generation it names.
    claim: AtomicU64,
    /// Tasks of the current job that have finished (or unwound).
    done: AtomicUsize,
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
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
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
        let n_tasks = n_tasks.min(u32::MAX as usize - 1);
        let _guard = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        let job: &(dyn Fn(usize) + Sync + '_) = &f;
        // SAFETY: erases the lifetime of `job`; it is only dereferenced by a thread holding
        // a successful claim of this generation, and we return only after every claimed
        // task has finished (also on unwind, via `WaitGuard`).
        let job: &'static Job =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync + '_), &'static Job>(job) };
        let gen = s.generation.load(Ordering::Relaxed).wrapping_add(1);
        s.done.store(0, Ordering::Relaxed);
        s.claim.store(tag(gen) << 32, Ordering::Release);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((gen, JobPtr(job as *const Job), n_tasks));
        s.generation.store(gen, Ordering::Release);
        {
            let _l = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.park_cv.notify_all();
        }
        let wait = WaitGuard { s, gen, n_tasks };
        run_tasks(s, gen, JobPtr(job as *const Job), n_tasks);
        wait.wait_for(n_tasks);
        std::mem::forget(wait);
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn tag(gen: u64) -> u64 {
    gen & 0xffff_ffff
}

/// On unwind out of the caller's own task: stops further claims and waits for the tasks
/// other threads already claimed.
struct WaitGuard<'a> {
    s: &'a Shared,
    gen: u64,
    n_tasks: usize,
}

impl WaitGuard<'_> {
    fn wait_for(&self, n: usize) {
        let mut polls = 0u32;
        while self.s.done.load(Ordering::Acquire) < n {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(POLLS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        // Close the job: push the index past every task so no new claim succeeds.
        let old = self
            .s
            .claim
            .swap(tag(self.gen) << 32 | u32::MAX as u64, Ordering::AcqRel);
        let claimed = ((old & 0xffff_ffff) as usize).min(self.n_tasks);
        self.wait_for(claimed);
        *self.s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Counts a task as done when it returns or unwinds.
struct DoneGuard<'a>(&'a AtomicUsize);

impl Drop for DoneGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Claims and runs tasks of generation `gen` until none are left (or the job moved on).
fn run_tasks(s: &Shared, gen: u64, job: JobPtr, n_tasks: usize) {
    let hi = tag(gen) << 32;
    let mut cur = s.claim.load(Ordering::Acquire);
    loop {
        if cur & !0xffff_ffff != hi || (cur & 0xffff_ffff) as usize >= n_tasks {
            return;
        }
        match s
            .claim
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                let _done = DoneGuard(&s.done);
                // SAFETY: we hold a claim of generation `gen`, so `run` of that generation
                // is still on the stack and keeps the closure alive until this task is done.
                let f = unsafe { &*job.0 };
                f((cur & 0xffff_ffff) as usize);
                cur = s.claim.load(Ordering::Acquire);
            }
            Err(now) => cur = now,
        }
    }
}

fn worker(s: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Wait for a new generation: spin (yielding now and then), then park.
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
                if polls.is_multiple_of(POLLS_PER_YIELD) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            let l = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            if s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Acquire) {
                let _unused = s.park_cv.wait_timeout(l, Duration::from_millis(50));
            }
        }
        let slot = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((gen, job, n_tasks)) = slot {
            seen = seen.max(gen);
            // A panicking task must not kill the worker; `DoneGuard` still counts it.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_tasks(&s, gen, job, n_tasks)
            }));
        }
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

    /// Late workers (more threads than cores, jobs of a few tasks back to back) must never
    /// run a task of a job that has moved on, nor run one twice.
    #[test]
    fn short_jobs_with_more_threads_than_cores() {
        let pool = ThreadPool::new(8);
        for j in 0..20_000usize {
            let n = 2 + j % 5;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "job {j}"
            );
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
