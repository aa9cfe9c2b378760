//! Kernel harness for the low-bit formats (1-bit, ternary, 2-bit group formats, i-quants):
//! every SIMD GEMM this CPU has, against the scalar kernel (the quant crate's reference
//! dots, themselves tested against ggml in the quant crate), on fresh random weights and
//! activations over a grid of shapes; normalized error |Δ| / Σ|w·a| below a threshold.

mod common;
use common::{dequant_rows, gauss, quantize_acts, simd_kernels};
use neagari_backend::cpu::kernels::{kernel_for, ActFormat, CpuFeatures, MatKernel};
use neagari_quant::{quantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The low-bit types with a CPU kernel so far.
const TYPES: [GgmlType; 15] = [
    GgmlType::Q1_0,
    GgmlType::TQ2_0,
    GgmlType::Q2_0,
    GgmlType::PQ2_0,
    GgmlType::IQ4_NL,
    GgmlType::PTQ1_0,
    GgmlType::TQ1_0,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// Both paths compute the same exact integer sums per activation block; only the f32
/// accumulation order differs, so a few ulps of Σ|w·a| is the budget.
const THRESHOLD: f64 = 2e-6;

/// Offset of the f16 scale `d` inside one block.
fn scale_offset(ty: GgmlType) -> usize {
    match ty {
        GgmlType::TQ1_0 => 52,
        GgmlType::TQ2_0 => 64,
        GgmlType::PTQ1_0 => 26,
        _ => 0,
    }
}

/// `nw` weight rows of `k` values: even rows from the reference quantizer on Gaussian data
/// (where the type has one), the others random bytes with a sane f16 scale (every code
/// reachable; IQ1_M's scale lives in the top nibbles of its scale words).
fn random_weights(ty: GgmlType, k: usize, nw: usize, rng: &mut StdRng) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("whole blocks");
    let bb = ty.info().bytes;
    let mut w = vec![0u8; nw * rb];
    for (j, row) in w.chunks_exact_mut(rb).enumerate() {
        let x: Vec<f32> = (0..k).map(|_| gauss(rng) * 0.05).collect();
        if j % 2 == 0 && quantize_row(ty, &x, row).is_ok() {
            continue;
        }
        rng.fill(row);
        let d = scale_offset(ty);
        for blk in row.chunks_exact_mut(bb) {
            let v =
                half::f16::from_f32(rng.gen_range(1e-4..2e-2) * if rng.gen() { 1.0 } else { -1.0 });
            if ty == GgmlType::IQ1_M {
                // The f16 scale is spread over the top nibbles of the four u16 scale words.
                let bits = v.to_bits();
                for i in 0..4 {
                    let at = 48 + 2 * i;
                    let sc = u16::from_le_bytes([blk[at], blk[at + 1]]);
                    let sc = (sc & 0x0fff) | ((bits >> (4 * i)) & 15) << 12;
                    blk[at..at + 2].copy_from_slice(&sc.to_le_bytes());
                }
                continue;
            }
            blk[d..d + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    w
}

/// `na` activation rows of `k` values with varied scales per row (and a zero block).
fn random_acts(k: usize, na: usize, rng: &mut StdRng) -> Vec<f32> {
    let mut a = vec![0f32; na * k];
    for (i, row) in a.chunks_exact_mut(k).enumerate() {
        let s = [1.0f32, 30.0, 1e-3][i % 3];
        for v in row.iter_mut() {
            *v = gauss(rng) * s;
        }
        if i == 1 {
            row[..32].fill(0.0);
        }
    }
    a
}

fn act_type(act: ActFormat) -> GgmlType {
    match act {
        ActFormat::Q8_0 => GgmlType::Q8_0,
        ActFormat::Q8K => GgmlType::Q8_K,
        other => panic!("unexpected activation format {other:?}"),
    }
}

#[test]
fn lowbit_gemm_matches_reference() {
    let feats = CpuFeatures::detect();
    let mut rng = StdRng::seed_from_u64(0x0001_0b17);
    for ty in TYPES {
        let scalar = kernel_for(ty, &feats, true).expect("scalar kernel");
        assert_eq!(scalar.isa, "scalar");
        for simd in simd_kernels(ty) {
            assert_eq!(simd.act, scalar.act, "{ty}: activation formats differ");
            check_against_reference(ty, &scalar, &simd, &mut rng);
        }
    }
}

/// One SIMD kernel against the scalar one over the shape grid.
fn check_against_reference(ty: GgmlType, scalar: &MatKernel, simd: &MatKernel, rng: &mut StdRng) {
    let block = ty.info().block.max(if scalar.act == ActFormat::Q8K {
        256
    } else {
        32
    });
    let mut shapes = vec![];
    for k in [block, 2 * block, 5 * block, 9 * block, 4096] {
        for nw in [1, 3, 17] {
            for na in [1, 2, 5] {
                shapes.push((k, nw, na, nw));
            }
        }
    }
    // A strided output and more activation rows than one prefill tile.
    shapes.push((2 * block, 5, 3, 9));
    shapes.push((block, 3, 70, 3));
    let mut worst = 0f64;
    for (k, nw, na, stride) in shapes {
        let w = random_weights(ty, k, nw, rng);
        let x = random_acts(k, na, rng);
        let a = quantize_acts(scalar, &x, k);
        let mut want = vec![f32::NAN; (na - 1) * stride + nw];
        let mut got = vec![f32::NAN; (na - 1) * stride + nw];
        (scalar.gemm)(k, &w, nw, &a, na, &mut want, stride);
        (simd.gemm)(k, &w, nw, &a, na, &mut got, stride);
        let wf = dequant_rows(ty, &w, k);
        let af = dequant_rows(act_type(scalar.act), &a, k);
        for i in 0..na {
            for j in 0..nw {
                let mag: f64 = wf[j * k..(j + 1) * k]
                    .iter()
                    .zip(&af[i * k..(i + 1) * k])
                    .map(|(p, q)| (*p as f64 * *q as f64).abs())
                    .sum();
                let (g, r) = (got[i * stride + j], want[i * stride + j]);
                let err = (g as f64 - r as f64).abs() / mag.max(f64::MIN_POSITIVE);
                assert!(
                    err <= THRESHOLD || (g == r),
                    "{ty} {} k={k} nw={nw} na={na} out[{i},{j}]: simd {g} ref {r} (normalized error {err:e})",
                    simd.isa
                );
                worst = worst.max(if g == r { 0.0 } else { err });
            }
        }
        for i in 0..na.saturating_sub(1) {
            for j in nw..stride {
                assert!(
                    got[i * stride + j].is_nan(),
                    "{ty}: wrote outside the output rows"
                );
            }
        }
    }
    eprintln!(
        "{ty} {}: worst normalized error {worst:e} (threshold {THRESHOLD:e})",
        simd.isa
    );
}

/// Every low-bit type with a kernel has one on every path, with the activation format
/// ggml dots it with.
#[test]
fn lowbit_kernels_are_complete() {
    let feats = CpuFeatures::detect();
    for ty in TYPES {
        for scalar_only in [true, false] {
            let k = kernel_for(ty, &feats, scalar_only).expect("a CPU kernel");
            let want = if ty.info().block == 256 {
                ActFormat::Q8K
            } else {
                ActFormat::Q8_0
            };
            assert_eq!(k.act, want, "{ty}");
        }
    }
}

/// Single-thread decode throughput of each SIMD kernel, printed (not asserted):
/// `cargo test --release -p neagari-backend --test kernels_lowbit -- --ignored --nocapture`.
/// Streams a weight matrix larger than L3 (GB/s of weight bytes, and weights per second).
#[test]
#[ignore]
fn bench_lowbit_gemv() {
    use std::time::Instant;
    let mut rng = StdRng::seed_from_u64(1);
    let types: Vec<GgmlType> = match std::env::var("NEAGARI_BENCH_TYPES") {
        Ok(s) => TYPES
            .iter()
            .copied()
            .chain([GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::Q8_0])
            .filter(|t| s.split(',').any(|n| n.eq_ignore_ascii_case(t.name())))
            .collect(),
        Err(_) => TYPES.to_vec(),
    };
    let k = 2048;
    for ty in types {
        for kern in simd_kernels(ty) {
            let rb = ty.row_bytes(k).expect("rows");
            let hot_rows = (512 * 1024 / rb).max(1);
            let hot = random_weights(ty, k, hot_rows, &mut rng);
            let big_rows = (96 << 20) / rb / hot_rows * hot_rows;
            let big: Vec<u8> = hot.iter().copied().cycle().take(big_rows * rb).collect();
            let x = random_acts(k, 1, &mut rng);
            let a = quantize_acts(&kern, &x, k);
            let mut out = vec![0f32; big_rows];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                (kern.gemm)(k, &big, big_rows, &a, 1, &mut out, big_rows);
                best = best.min(t.elapsed().as_secs_f64());
            }
            let mut hot_best = f64::MAX;
            for _ in 0..100 {
                let t = Instant::now();
                (kern.gemm)(k, &hot, hot_rows, &a, 1, &mut out, hot_rows);
                hot_best = hot_best.min(t.elapsed().as_secs_f64());
            }
            eprintln!(
                "{ty} {} k={k}: decode {:.1} GB/s = {:.1} G weights/s ({:.0} MB); hot (L2) {:.1} G weights/s",
                kern.isa,
                (big_rows * rb) as f64 / best / 1e9,
                (big_rows * k) as f64 / best / 1e9,
                (big_rows * rb) as f64 / 1e6,
                (hot_rows * k) as f64 / hot_best / 1e9,
            );
        }
    }
}
