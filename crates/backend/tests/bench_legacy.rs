//! Micro benchmark of the legacy-format GEMMs on one thread, for tuning only (ignored in the
//! normal test run):
//!
//!     cargo test --release -p neagari-backend --test bench_legacy -- --ignored \
//!         --nocapture --test-threads 1 [bench_q4_0]
//!
//! Times are on-CPU time of the benchmark thread (see `now_secs`). Prints, per type, the
//! decode GEMV (k = 4096, nw = 4096, one activation row) as GB/s of weight bytes streamed;
//! the same over only as many rows as fit in 512 KB (L2-resident: the kernel's own ceiling);
//! and small prefill batches (8 and 32 activation rows) as weight-GB/s × rows, i.e. how far
//! each loaded weight byte is reused.

use neagari_backend::cpu::kernels::{kernel_for, CpuFeatures};
use neagari_quant::{quantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

const K: usize = 4096;
const NW: usize = 4096;

/// Seconds this thread has spent on a CPU (`CLOCK_THREAD_CPUTIME_ID`, Linux), else
/// wall-clock seconds. On-CPU time keeps the numbers usable on a machine shared with other
/// jobs, where a run of a few ms is usually preempted part-way.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn now_secs() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (two 64-bit fields on 64-bit Linux) to a
    // valid pointer.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.sec as f64 + ts.nsec as f64 * 1e-9
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn now_secs() -> f64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64()
}

fn median_secs(mut f: impl FnMut(), min_runs: usize, budget_s: f64) -> f64 {
    f(); // warm caches and page in
    let mut t = Vec::new();
    let start = Instant::now();
    while t.len() < min_runs || (start.elapsed().as_secs_f64() < budget_s && t.len() < 200) {
        let s = now_secs();
        f();
        t.push(now_secs() - s);
    }
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn bench(ty: GgmlType) {
    let feats = CpuFeatures::detect();
    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..K * NW).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let acts: Vec<f32> = (0..32 * K).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    {
        let wrb = ty.row_bytes(K).unwrap();
        let mut w = vec![0u8; NW * wrb]; // [NW × wrb]
        for (row, xs) in w.chunks_exact_mut(wrb).zip(x.chunks_exact(K)) {
            quantize_row(ty, xs, row).unwrap();
        }
        // The scalar path is ~20x slower; time it only for the record with a short budget.
        for scalar_only in [false, true] {
            let kern = kernel_for(ty, &feats, scalar_only).unwrap();
            if !scalar_only && kern.isa == "scalar" {
                println!("{ty}: no AVX2 on this CPU");
                continue;
            }
            let arb = kern.act.row_bytes(K);
            let mut a = vec![0u8; 32 * arb]; // [32 × arb]
            for (row, xs) in a.chunks_exact_mut(arb).zip(acts.chunks_exact(K)) {
                (kern.quantize_act)(xs, row);
            }
            let mut out = vec![0f32; 32 * NW]; // [32 × NW]
            let gb = (NW * wrb) as f64 / 1e9;
            let t1 = median_secs(|| (kern.gemm)(K, &w, NW, &a, 1, &mut out, NW), 5, 1.0);
            if scalar_only {
                println!("{ty:>5} {:>6}: decode {:6.2} GB/s", kern.isa, gb / t1);
                continue;
            }
            // The first rows only, few enough to stay in L2 between calls: the kernel's own
            // ceiling, without the memory system (and other jobs' traffic) in the way.
            let nw_l2 = (512 * 1024 / wrb).min(NW);
            let gb_l2 = (nw_l2 * wrb) as f64 / 1e9;
            let tl2 = median_secs(|| (kern.gemm)(K, &w, nw_l2, &a, 1, &mut out, NW), 20, 0.5);
            let t8 = median_secs(|| (kern.gemm)(K, &w, NW, &a, 8, &mut out, NW), 3, 1.0);
            let t32 = median_secs(|| (kern.gemm)(K, &w, NW, &a, 32, &mut out, NW), 3, 1.5);
            let tq = median_secs(|| (kern.quantize_act)(&acts[..K], &mut a[..arb]), 50, 0.1);
            println!(
                "{ty:>5} {:>6}: decode {:6.2} GB/s ({:7.1} µs), L2-resident {:6.2} GB/s | \
                 8 rows {:6.2} | 32 rows {:6.2} GB/s·rows | quantize_act {:.2} µs",
                kern.isa,
                gb / t1,
                t1 * 1e6,
                gb_l2 / tl2,
                8.0 * gb / t8,
                32.0 * gb / t32,
                tq * 1e6
            );
        }
    }
}

macro_rules! bench_types {
    ($($name:ident => $ty:ident),*) => {$(
        #[test]
        #[ignore = "benchmark; run with --release -- --ignored --nocapture"]
        fn $name() {
            bench(GgmlType::$ty);
        }
    )*};
}

bench_types!(
    bench_f32 => F32, bench_f16 => F16, bench_bf16 => BF16, bench_q4_0 => Q4_0,
    bench_q4_1 => Q4_1, bench_q5_0 => Q5_0, bench_q5_1 => Q5_1, bench_q8_0 => Q8_0
);

/// Prefill at the shapes Gemma 3 270M multiplies (k = 640; nw = 256 for attn_k/v, 1024 for
/// attn_q, 2048 for ffn_gate/up) for its two prefill weight types, one thread: GB/s·rows of
/// weight bytes (see the module doc) and µs per call, plus `na = 1` (decode) as GB/s.
#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn bench_prefill_shapes() {
    const K: usize = 640;
    let feats = CpuFeatures::detect();
    let mut rng = StdRng::seed_from_u64(11);
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0] {
        let kern = kernel_for(ty, &feats, false).unwrap();
        let wrb = ty.row_bytes(K).unwrap();
        let arb = kern.act.row_bytes(K);
        let acts: Vec<f32> = (0..512 * K).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut a = vec![0u8; 512 * arb]; // [512 × arb]
        for (row, xs) in a.chunks_exact_mut(arb).zip(acts.chunks_exact(K)) {
            (kern.quantize_act)(xs, row);
        }
        for nw in [256usize, 1024, 2048] {
            let x: Vec<f32> = (0..K * nw).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let mut w = vec![0u8; nw * wrb]; // [nw × wrb]
            for (row, xs) in w.chunks_exact_mut(wrb).zip(x.chunks_exact(K)) {
                quantize_row(ty, xs, row).unwrap();
            }
            let mut out = vec![0f32; 512 * nw]; // [512 × nw]
            let gb = (nw * wrb) as f64 / 1e9;
            let mut line = format!("{ty:>5} {} k={K} nw={nw:>4}:", kern.isa);
            for na in [1usize, 2, 4, 8, 64, 512] {
                let t = median_secs(|| (kern.gemm)(K, &w, nw, &a, na, &mut out, nw), 5, 0.5);
                line += &format!(
                    " | na={na:<3} {:6.2} GB/s·rows {:8.1} µs",
                    na as f64 * gb / t,
                    t * 1e6
                );
            }
            println!("{line}");
        }
    }
}

/// Decode GEMV at the shape of Gemma 3 270M's tied output head (k = 640, 262 144 rows;
/// 178 MB of Q8_0, far beyond the L3), one thread, for every integer legacy type: weight
/// GB/s from DRAM for the AVX2 kernel and the AVX-512 VNNI one (when the CPU has it), with
/// 1 to 4 activation rows (GB/s·rows above one).
#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn bench_decode_head() {
    const K: usize = 640;
    const NW: usize = 262_144;
    let feats = CpuFeatures::detect();
    let avx2_only = CpuFeatures {
        avx512f: false,
        avx512vnni: false,
        ..feats
    };
    let mut rng = StdRng::seed_from_u64(13);
    // NEAGARI_BENCH_TYPES=Q8_0,Q5_0 picks types (default: all five).
    let pick = std::env::var("NEAGARI_BENCH_TYPES").unwrap_or_default();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
    ] {
        if !pick.is_empty() && !pick.split(',').any(|p| p == ty.to_string()) {
            continue;
        }
        let wrb = ty.row_bytes(K).unwrap();
        let mut w = vec![0u8; NW * wrb]; // [NW × wrb]
        let mut x = vec![0f32; K];
        for row in w.chunks_exact_mut(wrb) {
            x.iter_mut().for_each(|v| *v = rng.gen_range(-1.0f32..1.0));
            quantize_row(ty, &x, row).unwrap();
        }
        let acts: Vec<f32> = (0..4 * K).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut out = vec![0f32; 4 * NW]; // [4 × NW]
        let gb = (NW * wrb) as f64 / 1e9;
        // What one thread streams from DRAM with no compute: the ceiling of the lines below.
        let words: &[u64] = bytemuck::cast_slice(&w[..w.len() / 8 * 8]);
        let t = median_secs(
            || {
                std::hint::black_box(words.iter().fold(0u64, |s, &v| s.wrapping_add(v)));
            },
            5,
            1.0,
        );
        println!("{ty:>5} plain read of the same bytes: {:6.2} GB/s", gb / t);
        for f in [avx2_only, feats] {
            let kern = kernel_for(ty, &f, false).unwrap();
            if f.avx512vnni && kern.isa != "avx512vnni" {
                println!("{ty}: no AVX-512 VNNI kernel on this CPU");
                continue;
            }
            let arb = kern.act.row_bytes(K);
            let mut a = vec![0u8; 4 * arb]; // [4 × arb]
            for (row, xs) in a.chunks_exact_mut(arb).zip(acts.chunks_exact(K)) {
                (kern.quantize_act)(xs, row);
            }
            let mut line = format!("{ty:>5} {:>10} k={K} nw={NW} ({gb:.3} GB):", kern.isa);
            for na in 1..=4usize {
                let t = median_secs(|| (kern.gemm)(K, &w, NW, &a, na, &mut out, NW), 5, 1.0);
                line += &format!(
                    " | na={na} {:6.2} GB/s {:7.2} ms",
                    na as f64 * gb / t,
                    t * 1e3
                );
            }
            // The first rows only, few enough to stay in L2: the kernel's own ceiling.
            let nw_l2 = 512 * 1024 / wrb;
            let t = median_secs(|| (kern.gemm)(K, &w, nw_l2, &a, 1, &mut out, NW), 20, 0.5);
            line += &format!(
                " | L2-resident na=1 {:6.2} GB/s",
                (nw_l2 * wrb) as f64 / 1e9 / t
            );
            println!("{line}");
        }
    }
}
