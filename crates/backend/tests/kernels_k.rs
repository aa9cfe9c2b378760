//! Kernel harness for the K-quants (in the manner of llama.cpp's test-backend-ops): every
//! SIMD GEMM this CPU has, against the scalar kernel (the quant crate's reference dots), on
//! fresh random weights and activations over a grid of shapes; normalized error
//! |Δ| / Σ|w·a| below a per-format threshold. Also the SIMD Q8_K quantizer against the
//! scalar one, byte for byte.

mod common;
use common::{dequant_rows, gauss, quantize_acts, simd_kernels};
use neagari_backend::cpu::kernels::{kernel_for, ActFormat, CpuFeatures, MatKernel};
use neagari_quant::{quantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Normalized-error ceiling per format. Both paths compute the same exact integer sums per
/// block; only the f32 accumulation order differs, so a few ulps of Σ|w·a| is the budget.
fn threshold(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => 2e-6,
        _ => unreachable!(),
    }
}

/// Offsets of the f16 scale fields inside one block: (d, optional dmin).
fn scale_fields(ty: GgmlType) -> (usize, Option<usize>) {
    match ty {
        GgmlType::Q2_K => (80, Some(82)),
        GgmlType::Q3_K => (108, None),
        GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
        GgmlType::Q6_K => (208, None),
        _ => unreachable!(),
    }
}

/// `nw` weight rows of `k` values: even rows from the reference quantizer on Gaussian data,
/// odd rows random bytes with sane f16 scales (every quant and scale value reachable).
fn random_weights(ty: GgmlType, k: usize, nw: usize, rng: &mut StdRng) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("whole blocks");
    let bb = ty.info().bytes;
    let mut w = vec![0u8; nw * rb];
    for (j, row) in w.chunks_exact_mut(rb).enumerate() {
        if j % 2 == 0 {
            let x: Vec<f32> = (0..k).map(|_| gauss(rng) * 0.05).collect();
            quantize_row(ty, &x, row).expect("quantize");
        } else {
            rng.fill(row);
            let (d, dmin) = scale_fields(ty);
            for blk in row.chunks_exact_mut(bb) {
                let v = half::f16::from_f32(
                    rng.gen_range(1e-4..2e-2) * if rng.gen() { 1.0 } else { -1.0 },
                );
                blk[d..d + 2].copy_from_slice(&v.to_le_bytes());
                if let Some(m) = dmin {
                    let v = half::f16::from_f32(rng.gen_range(1e-4..2e-2));
                    blk[m..m + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
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
            row[..256].fill(0.0);
        }
    }
    a
}

#[test]
fn k_quant_gemm_matches_reference() {
    let feats = CpuFeatures::detect();
    let mut rng = StdRng::seed_from_u64(0x005e_ed4b);
    for ty in TYPES {
        let scalar = kernel_for(ty, &feats, true).expect("scalar kernel");
        assert_eq!(scalar.isa, "scalar");
        assert_eq!(scalar.act, ActFormat::Q8K);
        for simd in simd_kernels(ty) {
            check_against_reference(ty, &scalar, &simd, &mut rng);
        }
    }
}

/// One SIMD kernel against the scalar one over the shape grid.
fn check_against_reference(ty: GgmlType, scalar: &MatKernel, simd: &MatKernel, rng: &mut StdRng) {
    let mut shapes = vec![];
    for k in [256, 512, 2304, 4096] {
        for nw in [1, 3, 17] {
            for na in [1, 2, 5] {
                shapes.push((k, nw, na, nw));
            }
        }
    }
    // A strided output, more activation rows than one panel, every prefill tile width.
    shapes.push((512, 5, 3, 9));
    shapes.push((256, 3, 70, 3));
    shapes.push((1024, 4, 15, 4));
    let mut worst = 0f64;
    for (k, nw, na, stride) in shapes {
        let w = random_weights(ty, k, nw, rng);
        let x = random_acts(k, na, rng);
        let a = quantize_acts(scalar, &x, k);
        let mut want = vec![f32::NAN; (na - 1) * stride + nw];
        let mut got = vec![f32::NAN; (na - 1) * stride + nw];
        (scalar.gemm)(k, &w, nw, &a, na, &mut want, stride);
        (simd.gemm)(k, &w, nw, &a, na, &mut got, stride);
        // Σ|w·a| per output, from the dequantized operands.
        let wf = dequant_rows(ty, &w, k);
        let af = dequant_rows(GgmlType::Q8_K, &a, k);
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
                    err <= threshold(ty) || (g == r),
                    "{ty} {} k={k} nw={nw} na={na} out[{i},{j}]: simd {g} ref {r} (normalized error {err:e})",
                    simd.isa
                );
                worst = worst.max(if g == r { 0.0 } else { err });
            }
        }
        // Cells between rows of a strided output stay untouched.
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
        "{ty} {}: worst normalized error {worst:e} (threshold {:e})",
        simd.isa,
        threshold(ty)
    );
}

#[test]
fn k_quant_kernels_are_complete() {
    let feats = CpuFeatures::detect();
    for ty in TYPES {
        for scalar_only in [true, false] {
            let k = kernel_for(ty, &feats, scalar_only).expect("every K-quant has a CPU kernel");
            assert_eq!(k.act, ActFormat::Q8K);
            assert_eq!(k.act.row_bytes(512), 2 * 292);
        }
    }
}

#[test]
fn simd_q8_k_quantizer_is_bit_identical() {
    let Some(simd) = simd_kernels(GgmlType::Q4_K).into_iter().next() else {
        return;
    };
    let scalar = kernel_for(GgmlType::Q4_K, &CpuFeatures::detect(), true).expect("scalar kernel");
    let mut rng = StdRng::seed_from_u64(7);
    for case in 0..40 {
        let k = 256 * (1 + case % 5);
        let mut x: Vec<f32> = (0..k)
            .map(|_| gauss(&mut rng) * [1.0, 1e-6, 1e4, 0.3][case % 4])
            .collect();
        match case % 8 {
            1 => x[..256].fill(0.0),
            2 => {
                // equal magnitudes of both signs: the first must win
                x[3] = -50.0;
                x[200] = 50.0;
            }
            3 => x.iter_mut().for_each(|v| *v = v.abs()),
            4 => x.iter_mut().for_each(|v| *v = (*v * 4.0).round() * 0.25), // many ties at .5 steps
            5 => x[17] = f32::MIN_POSITIVE,
            _ => {}
        }
        let want = quantize_acts(&scalar, &x, k);
        let got = quantize_acts(&simd, &x, k);
        for (b, (g, w)) in got.chunks(292).zip(want.chunks(292)).enumerate() {
            assert_eq!(
                g, w,
                "case {case}: Q8_K block {b} differs between {} and scalar",
                simd.isa
            );
        }
    }
}

/// Single-thread throughput of each SIMD kernel this CPU can run, printed (not asserted):
/// `cargo test --release -p neagari-backend --test kernels_k -- --ignored --nocapture`.
/// Decode (one activation row) streams a weight matrix larger than L3 and reports GB/s of
/// weight bytes; "hot" repeats a matrix that fits in L2 (the kernel's own ceiling);
/// prefill runs 64 activation rows and reports weight·activation products per second.
#[test]
#[ignore]
fn bench_k_quant_gemm() {
    use std::time::Instant;
    let mut rng = StdRng::seed_from_u64(1);
    let types: Vec<GgmlType> = match std::env::var("NEAGARI_BENCH_TYPES") {
        Ok(s) => TYPES
            .into_iter()
            .filter(|t| s.split(',').any(|n| n.eq_ignore_ascii_case(t.name())))
            .collect(),
        Err(_) => TYPES.to_vec(),
    };
    for ty in types {
        for kern in simd_kernels(ty) {
            for k in [1024usize, 2048] {
                let rb = ty.row_bytes(k).expect("rows");
                // Build one L2-sized block of rows and tile it to the big matrix (quantizing
                // 100 MB with the reference quantizer would take minutes).
                let hot_rows = (512 * 1024 / rb).max(1);
                let hot = random_weights(ty, k, hot_rows, &mut rng);
                let big_rows = (96 << 20) / rb / hot_rows * hot_rows;
                let big: Vec<u8> = hot.iter().copied().cycle().take(big_rows * rb).collect();
                let x = random_acts(k, 64, &mut rng);
                let a = quantize_acts(&kern, &x, k);
                let arb = kern.act.row_bytes(k);
                let mut out = vec![0f32; 64 * big_rows.max(hot_rows)];
                let time = |w: &[u8], nw: usize, na: usize, reps: usize, out: &mut [f32]| {
                    let mut best = f64::MAX;
                    for _ in 0..reps {
                        let t = Instant::now();
                        (kern.gemm)(k, w, nw, &a[..na * arb], na, out, nw);
                        best = best.min(t.elapsed().as_secs_f64());
                    }
                    best
                };
                let t_big = time(&big, big_rows, 1, 5, &mut out);
                // The machine's plain streaming read of the same bytes, for scale.
                let mut t_stream = f64::MAX;
                for _ in 0..5 {
                    let t = Instant::now();
                    let s = big.chunks_exact(32).fold([0u64; 4], |mut acc, c| {
                        for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
                            *a = a.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
                        }
                        acc
                    });
                    std::hint::black_box(s);
                    t_stream = t_stream.min(t.elapsed().as_secs_f64());
                }
                let t_hot = time(&hot, hot_rows, 1, 200, &mut out);
                let t_pre = time(&hot, hot_rows, 64, 10, &mut out);
                eprintln!(
                "{ty} {} k={k}: decode {:.1} GB/s ({big_rows} rows, {:.0} MB; plain read {:.1} GB/s), hot {:.1} GB/s, prefill(64 rows) {:.1} G mul-add/s",
                kern.isa,
                (big_rows * rb) as f64 / t_big / 1e9,
                (big_rows * rb) as f64 / 1e6,
                (big_rows * rb) as f64 / t_stream / 1e9,
                (hot_rows * rb) as f64 / t_hot / 1e9,
                (hot_rows * k * 64) as f64 / t_pre / 1e9,
            );
            }
        }
    }
}
