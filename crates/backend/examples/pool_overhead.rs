//! Dispatch overhead of the CPU thread pool: many small jobs, as a decode step issues.
use std::hint::black_box;
use std::time::Instant;

use neagari_backend::cpu::pool::ThreadPool;

fn work(n: usize) -> f32 {
    let mut s = 0f32;
    for i in 0..n {
        s += (i as f32).sqrt();
    }
    s
}

fn main() {
    raw_scaling();
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads);
        for per_task in [0usize, 2000, 20000] {
            let jobs = 5000;
            let t = Instant::now();
            for _ in 0..jobs {
                pool.run(8, |_| {
                    black_box(work(per_task));
                });
            }
            let dt = t.elapsed().as_secs_f64() / jobs as f64;
            println!(
                "threads {threads} work/task {per_task:>6}: {:.2} µs per job",
                dt * 1e6
            );
        }
    }
}

#[allow(dead_code)]
fn raw_scaling() {
    for threads in [1usize, 2] {
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| black_box(work(20_000_000 / threads)));
            }
        });
        println!(
            "raw {threads} threads: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
}
