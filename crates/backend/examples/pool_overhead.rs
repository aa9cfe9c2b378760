//! Dispatch overhead of the CPU thread pool against rayon: many small jobs of 8 tasks, as a
//! decode step issues (~130 matmuls per token), and the raw two-thread scaling of the
//! machine for reference.
//!
//!     cargo run --release -p neagari-backend --example pool_overhead
use std::hint::black_box;
use std::time::Instant;

use neagari_backend::cpu::pool::ThreadPool;
use rayon::prelude::*;

fn work(n: usize) -> f32 {
    let mut s = 0f32;
    for i in 0..n {
        s += (i as f32).sqrt();
    }
    s
}

fn raw_scaling() {
    for threads in [1usize, 2] {
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| black_box(work(20_000_000 / threads)));
            }
        });
        println!(
            "raw scaling, {threads} threads: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}

fn main() {
    raw_scaling();
    let jobs = 5000;
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads);
        let rpool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("rayon pool");
        for per_task in [0usize, 2000, 20000] {
            let t = Instant::now();
            for _ in 0..jobs {
                pool.run(8, |_| {
                    black_box(work(per_task));
                });
            }
            let ours = t.elapsed().as_secs_f64() / jobs as f64;
            let t = Instant::now();
            for _ in 0..jobs {
                rpool.install(|| {
                    (0..8).into_par_iter().for_each(|_| {
                        black_box(work(per_task));
                    })
                });
            }
            let theirs = t.elapsed().as_secs_f64() / jobs as f64;
            println!(
                "threads {threads}, work/task {per_task:>6}: neagari pool {:8.2} µs/job, rayon {:8.2} µs/job",
                ours * 1e6,
                theirs * 1e6
            );
        }
    }
}
