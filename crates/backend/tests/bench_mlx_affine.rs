//! Micro benchmark of the MLX affine GEMV through the backend on one thread, beside Q4_K,
//! for tuning only (ignored in the normal test run):
//!
//!     cargo test --release -p neagari-backend --test bench_mlx_affine -- --ignored --nocapture
//!
//! Prints, per bit width (and for GGUF Q1_0 and Q4_K), the decode GEMV (k = 4096, 4096 rows, one activation row) time
//! and the weight bytes streamed per second (codes + scales + biases).

use std::time::Instant;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{AffineTensor, Backend, HostTensor, SharedBytes, WeightData, WeightDesc};
use neagari_quant::mlx_affine::{AffineLayout, ScaleType};
use neagari_quant::GgmlType;
use rand::{Rng, SeedableRng};

const K: usize = 4096;
const NW: usize = 4096;

fn median(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..30)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

#[test]
#[ignore]
fn bench_mlx_affine_gemv() {
    let be = CpuBackend::new(&CpuOptions {
        threads: 1,
        scalar_only: false,
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..K).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let mut xb = be.buf(1, K).unwrap();
    be.write(&mut xb, &x, 1, K).unwrap();
    let mut out = be.buf(1, NW).unwrap();
    // (bits, symmetric): the 1-bit pack both as mlx-lm writes it (bias ≠ −scale/2) and in
    // Bonsai's form (bias = −scale/2: no bias term).
    for (bits, sym) in [
        (1u32, true),
        (1, false),
        (2, false),
        (3, false),
        (4, false),
        (8, false),
    ] {
        let l = AffineLayout::new(bits, 128).unwrap();
        let codes: Vec<u8> = (0..NW * l.row_code_bytes(K)).map(|_| rng.gen()).collect();
        // f16 0.0625 (0x2c00) scales; biases the same, or −0.03125 (0xa800).
        let sb: Vec<u8> = (0..NW * K / 128 * 2)
            .map(|i| if i % 2 == 1 { 0x2c } else { 0 })
            .collect();
        let bb: Vec<u8> = (0..NW * K / 128 * 2)
            .map(|i| match (i % 2, sym) {
                (0, _) => 0,
                (_, true) => 0xa8,
                _ => 0x2c,
            })
            .collect();
        let w = WeightDesc {
            name: "w".into(),
            shape: vec![NW, K],
            data: WeightData::MlxAffine(AffineTensor {
                layout: l,
                scale_type: ScaleType::F16,
                codes: SharedBytes::from_vec(codes),
                scales: SharedBytes::from_vec(sb),
                biases: SharedBytes::from_vec(bb),
            }),
            rotation: None,
        };
        let m = be.load_weight(&w).unwrap();
        let t = median(|| be.matmul(&m, &xb, &mut out).unwrap());
        let bytes = be.mat_bytes(&m) as f64;
        println!(
            "mlx affine {bits}-bit g128{} [{}]: {:.3} ms, {:.1} GB/s",
            if sym { " sym" } else { "" },
            m.isa(),
            t * 1e3,
            bytes / t / 1e9
        );
    }
    // GGUF Q1_0 (f16 scale + 128 sign bits per block) on random bits.
    let row = GgmlType::Q1_0.row_bytes(K).unwrap();
    let q: Vec<u8> = (0..NW * row)
        .map(|i| match i % 18 {
            0 => 0,
            1 => 0x2c,
            _ => rng.gen(),
        })
        .collect();
    let m = be
        .load_mat(&HostTensor {
            name: "q1_0".into(),
            ty: GgmlType::Q1_0,
            shape: vec![NW, K],
            bytes: SharedBytes::from_vec(q),
        })
        .unwrap();
    let t = median(|| be.matmul(&m, &xb, &mut out).unwrap());
    println!(
        "Q1_0 [{}]: {:.3} ms, {:.1} GB/s",
        m.isa(),
        t * 1e3,
        be.mat_bytes(&m) as f64 / t / 1e9
    );
    let wf: Vec<f32> = (0..NW * K).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let row = GgmlType::Q4_K.row_bytes(K).unwrap();
    let mut q = vec![0u8; NW * row];
    for (r, dst) in q.chunks_exact_mut(row).enumerate() {
        neagari_quant::k_common::quantize_row_k(GgmlType::Q4_K, &wf[r * K..(r + 1) * K], dst)
            .unwrap()
            .unwrap();
    }
    let m = be
        .load_mat(&HostTensor {
            name: "q4k".into(),
            ty: GgmlType::Q4_K,
            shape: vec![NW, K],
            bytes: SharedBytes::from_vec(q),
        })
        .unwrap();
    let t = median(|| be.matmul(&m, &xb, &mut out).unwrap());
    println!(
        "Q4_K [{}]: {:.3} ms, {:.1} GB/s",
        m.isa(),
        t * 1e3,
        be.mat_bytes(&m) as f64 / t / 1e9
    );
}
