//! Micro benchmark of prefill attention through the backend, for tuning only (ignored in the
//! normal test run):
//!
//!     cargo test --release -p neagari-backend --test bench_attention -- --ignored --nocapture
//!
//! Gemma 3 270M's attention shape (4 query heads, 1 kv head, head_dim 256, f16 cache): one
//! 512-row prefill chunk whose first row sits at position `pos0`, for a global layer and a
//! 512-token sliding-window layer. Prints wall time and CPU time of the process (the machine
//! is shared; CPU time is the steadier figure) and query-key pairs per CPU second.

use std::time::Instant;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{Attn, Backend, KvShape, KvType};
use rand::{Rng, SeedableRng};

/// utime + stime of this process in seconds (from /proc/self/stat).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

#[test]
#[ignore]
fn bench_prefill_attention() {
    let threads: usize = std::env::var("NEAGARI_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let be = CpuBackend::new(&CpuOptions {
        threads,
        scalar_only: false,
    });
    let (nh, nkv, hd, rows) = (4usize, 1usize, 256usize, 512usize);
    let n_ctx = 28 * 1024;
    let mut kv = be
        .kv_alloc(&KvShape {
            n_layers: 1,
            n_ctx,
            n_kv_heads: nkv,
            head_dim: hd,
            ty: KvType::F16,
        })
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut mk = |r: usize, c: usize| {
        let d: Vec<f32> = (0..r * c).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut b = be.buf(r, c).unwrap();
        be.write(&mut b, &d, r, c).unwrap();
        b
    };
    let (q, k, v) = (mk(rows, nh * hd), mk(rows, nkv * hd), mk(rows, nkv * hd));
    let mut out = be.buf(rows, nh * hd).unwrap();
    let attn = |window| Attn {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / 16.0,
        window,
        softcap: None,
    };
    // Fill the cache cheaply (a one-position window) up to the largest pos0.
    let last0 = n_ctx - rows;
    for pos0 in (0..last0).step_by(rows) {
        be.attention(&mut kv, 0, pos0, &q, &k, &v, &attn(Some(1)), &mut out)
            .unwrap();
    }
    for pos0 in [0usize, 3584, 15872, last0] {
        for window in [None, Some(512)] {
            let a = attn(window);
            let (t, c) = (Instant::now(), cpu_seconds());
            be.attention(&mut kv, 0, pos0, &q, &k, &v, &a, &mut out)
                .unwrap();
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            let pairs: usize = (pos0..pos0 + rows)
                .map(|p| p + 1 - window.map_or(0, |w| (p + 1).saturating_sub(w)))
                .sum::<usize>()
                * nh;
            println!(
                "pos0 {pos0:>5} window {window:>9?}: {:8.1} ms wall, {:8.1} ms cpu, {:6.1} M pairs/cpu-s",
                wall * 1e3,
                cpu * 1e3,
                pairs as f64 / cpu.max(1e-3) / 1e6
            );
        }
    }
    // Decode: one row at the end of the filled cache, a global layer.
    let (q1, k1, v1) = (mk(1, nh * hd), mk(1, nkv * hd), mk(1, nkv * hd));
    let mut out1 = be.buf(1, nh * hd).unwrap();
    let a = attn(None);
    let n = 50;
    let (t, c) = (Instant::now(), cpu_seconds());
    for _ in 0..n {
        be.attention(&mut kv, 0, n_ctx - 1, &q1, &k1, &v1, &a, &mut out1)
            .unwrap();
    }
    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
    println!(
        "decode at {}: {:.3} ms wall, {:.3} ms cpu per call ({threads} threads)",
        n_ctx - 1,
        wall * 1e3 / n as f64,
        cpu * 1e3 / n as f64
    );
}

/// Decode (one query row) through the backend at several depths, Gemma 3 270M's shape,
/// a global and a 512-token sliding-window layer; f16 cache, or q8_0 with
/// `NEAGARI_BENCH_KV=q8_0`. Positions up to 2,048 of an f16 cache take ggml's order.
///
///     NEAGARI_BENCH_THREADS=2 cargo test --release -p neagari-backend --test bench_attention \
///         bench_decode_attention -- --ignored --nocapture
#[test]
#[ignore]
fn bench_decode_attention() {
    let threads: usize = std::env::var("NEAGARI_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let ty = match std::env::var("NEAGARI_BENCH_KV").as_deref() {
        Ok("q8_0") => KvType::Q8_0,
        _ => KvType::F16,
    };
    let be = CpuBackend::new(&CpuOptions {
        threads,
        scalar_only: false,
    });
    let (nh, nkv, hd) = (4usize, 1usize, 256usize);
    let n_ctx = 28 * 1024;
    let mut kv = be
        .kv_alloc(&KvShape {
            n_layers: 1,
            n_ctx,
            n_kv_heads: nkv,
            head_dim: hd,
            ty,
        })
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut mk = |r: usize, c: usize| {
        let d: Vec<f32> = (0..r * c).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut b = be.buf(r, c).unwrap();
        be.write(&mut b, &d, r, c).unwrap();
        b
    };
    let attn = |window| Attn {
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        scale: 1.0 / 16.0,
        window,
        softcap: None,
    };
    // Fill the cache cheaply (a one-position window).
    let rows = 512;
    let (q, k, v) = (mk(rows, nh * hd), mk(rows, nkv * hd), mk(rows, nkv * hd));
    let mut out = be.buf(rows, nh * hd).unwrap();
    for pos0 in (0..n_ctx).step_by(rows) {
        be.attention(&mut kv, 0, pos0, &q, &k, &v, &attn(Some(1)), &mut out)
            .unwrap();
    }
    let (q1, k1, v1) = (mk(1, nh * hd), mk(1, nkv * hd), mk(1, nkv * hd));
    let mut out1 = be.buf(1, nh * hd).unwrap();
    for pos in [511usize, 2047, 4095, 16383, n_ctx - 1] {
        for window in [None, Some(512)] {
            let a = attn(window);
            let n = (200_000 / (pos + 1)).clamp(20, 400);
            let (t, c) = (Instant::now(), cpu_seconds());
            for _ in 0..n {
                be.attention(&mut kv, 0, pos, &q1, &k1, &v1, &a, &mut out1)
                    .unwrap();
            }
            let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - c);
            println!(
                "decode {ty:?} at {pos:>5} window {window:>9?}: {:7.3} ms wall, {:7.3} ms cpu per call ({threads} threads)",
                wall * 1e3 / n as f64,
                cpu * 1e3 / n as f64
            );
        }
    }
}
