//! Decode-shaped Q2_K (or Q4_K) matmul benchmark (ignored in the normal test run): one "token" is
//! the weight matrices of the 6-layer bench Llama of `bench/make_lowbit_bench_models.py`
//! (hidden 2048, FFN 5632, 16/4 heads of 128, 300-token head), each multiplied with one
//! activation row through the thread pool in the backend's decode chunking. The weights
//! are random blocks in a file under /tmp, mmap'd like a GGUF's tensors (page-cache pages,
//! which the hardware prefetchers see as 4 KiB pages).
//!
//!     NEAGARI_BENCH_THREADS=1 cargo test --release -p neagari-backend \
//!         --test bench_q8k_decode -- --ignored --nocapture
//!
//! Variants: the kernels `kernel_for` picks on this CPU with AVX-512 and with VNNI masked
//! off, and the one it picks. Prints tokens/s per variant (median of rounds; variants
//! alternate within each round, so a change in machine load hits all of them alike). One
//! thread is timed in CPU time (robust on a shared machine), more threads in wall time.
//! Other knobs: `NEAGARI_BENCH_HOT=1` (300 L2-resident rows, 100 times), `NEAGARI_BENCH_NA`
//! (activation rows, 1 = decode), `NEAGARI_BENCH_HEAP=1` (weights copied to the heap),
//! `NEAGARI_BENCH_K` (only the matrices of that width), `NEAGARI_BENCH_ROUNDS`.

use neagari_backend::cpu::kernels::{kernel_for, CpuFeatures, GemmFn};
use neagari_backend::cpu::pool::ThreadPool;
use neagari_quant::GgmlType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Seconds this thread has spent on a CPU (`CLOCK_THREAD_CPUTIME_ID`): one-thread runs
/// are timed in CPU time, so preemption by other jobs on the shared machine drops out.
fn cpu_secs() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    let rc = unsafe { clock_gettime(3, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

struct Out(*mut f32);
// SAFETY: tasks write disjoint output ranges.
unsafe impl Sync for Out {}

fn chunk_rows(n_out: usize, threads: usize, na: usize) -> usize {
    let c = n_out.div_ceil(threads * if na > 1 { 8 } else { 4 });
    c.div_ceil(4).max(1) * 4
}

#[test]
#[ignore]
fn bench_q2k_decode() {
    // `NEAGARI_BENCH_TYPE=Q4_K` benches Q4_K instead (f16 d, dmin at the block's start).
    let (ty, bytes, f16_at) = match std::env::var("NEAGARI_BENCH_TYPE").as_deref() {
        Ok("Q4_K") => (GgmlType::Q4_K, 144usize, [0usize, 2]),
        _ => (GgmlType::Q2_K, 84, [80, 82]),
    };
    let threads: usize = std::env::var("NEAGARI_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let rounds: usize = std::env::var("NEAGARI_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let hot = std::env::var("NEAGARI_BENCH_HOT").is_ok();
    let mut shapes = vec![];
    for _ in 0..if hot { 0 } else { 6 } {
        shapes.extend([
            (2048, 2048),
            (512, 2048),
            (512, 2048),
            (2048, 2048),
            (5632, 2048),
            (5632, 2048),
            (2048, 5632),
        ]);
    }
    shapes.push((300, 2048));
    if let Ok(k) = std::env::var("NEAGARI_BENCH_K") {
        let k: usize = k.parse().expect("k");
        shapes.retain(|s| s.1 == k);
    }
    let mut total: usize = shapes.iter().map(|&(n, k)| n * k / 256 * bytes).sum();
    if hot {
        // L2-resident: the same 300 rows (200 KB) 100 times.
        shapes = vec![(300, 2048); 100];
        total = 300 * 8 * bytes;
    }
    let mut rng = StdRng::seed_from_u64(5);
    let mut data = vec![0u8; total];
    rng.fill(&mut data[..]);
    for blk in data.chunks_exact_mut(bytes) {
        for o in f16_at {
            let v = half::f16::from_f32(rng.gen_range(1e-4f32..2e-2));
            blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    let path = std::env::temp_dir().join(format!(
        "neagari_{}_decode_{}.bin",
        ty.name(),
        std::process::id()
    ));
    std::fs::write(&path, &data).expect("write bench file");
    drop(data);
    let file = std::fs::File::open(&path).expect("open");
    // SAFETY: the file is ours and not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.expect("mmap");
    let _ = std::fs::remove_file(&path);
    let heap: Vec<u8>;
    let map: &[u8] = if std::env::var("NEAGARI_BENCH_HEAP").is_ok() {
        heap = map.to_vec();
        &heap
    } else {
        &map
    };

    let feats = CpuFeatures::detect();
    let kern = kernel_for(ty, &feats, false).expect("kernel");
    // Activation rows per matmul: 1 = decode; more = a prefill batch.
    let na: usize = std::env::var("NEAGARI_BENCH_NA")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mk_act = |k: usize, rng: &mut StdRng| {
        let rb = kern.act.row_bytes(k);
        let mut a = vec![0u8; na * rb]; // [na, rb]
        for row in a.chunks_exact_mut(rb) {
            let x: Vec<f32> = (0..k).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            (kern.quantize_act)(&x, row);
        }
        a
    };
    let a2048 = mk_act(2048, &mut rng);
    let a5632 = mk_act(5632, &mut rng);
    let pool = ThreadPool::new(threads);
    let mut out = vec![0f32; 5632 * na]; // [na, n] per matmul
                                         // The kernels `kernel_for` picks with the wider instruction sets masked off, first.
    let no_vnni = CpuFeatures {
        avx512vnni: false,
        ..feats
    };
    let no_avx512 = CpuFeatures {
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        ..no_vnni
    };
    let mut variants: Vec<(&str, GemmFn)> = vec![];
    for f in [no_avx512, no_vnni, feats] {
        let k = kernel_for(ty, &f, false).expect("kernel");
        if k.isa != "scalar" && !variants.iter().any(|v| v.0 == k.isa) {
            variants.push((k.isa, k.gemm));
        }
    }
    let token = |gemm: GemmFn, out: &mut [f32]| {
        let mut off = 0;
        for &(n, k) in &shapes {
            let rb = k / 256 * bytes;
            if off + n * rb > map.len() {
                off = 0;
            }
            let w = &map[off..off + n * rb];
            off += n * rb;
            let a = if k == 2048 { &a2048 } else { &a5632 };
            let chunk = chunk_rows(n, threads, na);
            let op = Out(out.as_mut_ptr());
            let olen = out.len();
            pool.run(n.div_ceil(chunk), |c| {
                let j0 = c * chunk;
                let nw = chunk.min(n - j0);
                let op = &op;
                // SAFETY: chunk c writes only out[j0..j0 + nw].
                let dst = unsafe { std::slice::from_raw_parts_mut(op.0.add(j0), olen - j0) };
                gemm(k, &w[j0 * rb..(j0 + nw) * rb], nw, a, na, dst, n);
            });
        }
    };
    // Same results from every variant (last matrix).
    let mut refo = vec![0f32; 5632 * na];
    token(variants[0].1, &mut refo);
    for &(name, g) in &variants[1..] {
        token(g, &mut out);
        let worst = refo[..300 * na]
            .iter()
            .zip(&out[..300 * na])
            .map(|(a, b)| ((a - b).abs() / a.abs().max(1e-3)) as f64)
            .fold(0f64, f64::max);
        eprintln!(
            "{name}: worst relative difference to {} {worst:.2e}",
            variants[0].0
        );
        assert!(worst < 1e-3);
    }
    let per_round = 8;
    let mut times: Vec<Vec<f64>> = vec![vec![]; variants.len()];
    for r in 0..rounds {
        for vi in 0..variants.len() {
            let v = (vi + r) % variants.len();
            token(variants[v].1, &mut out);
            let (t, c) = (Instant::now(), cpu_secs());
            for _ in 0..per_round {
                token(variants[v].1, &mut out);
            }
            let s = if threads == 1 {
                cpu_secs() - c
            } else {
                t.elapsed().as_secs_f64()
            };
            times[v].push(s / per_round as f64);
        }
    }
    let base = {
        let mut t = times[0].clone();
        t.sort_by(|a, b| a.total_cmp(b));
        t[t.len() / 2]
    };
    for (v, t) in variants.iter().zip(&mut times) {
        t.sort_by(|a, b| a.total_cmp(b));
        let med = t[t.len() / 2];
        eprintln!(
            "{:>10}: {:6.1} tok/s median ({:6.1} best), {:.1} GB/s, x{:.3} vs {}",
            v.0,
            1.0 / med,
            1.0 / t[0],
            (if hot { total * 100 } else { total }) as f64 / med / 1e9,
            base / med,
            variants[0].0
        );
    }
}
