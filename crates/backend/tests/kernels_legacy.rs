//! Kernel harness for the unquantized and legacy block formats (F32, F16, BF16, Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0), in the manner of llama.cpp's test-backend-ops: every shape of
//! k × nw × na, fresh random weights made with the quant crate's reference quantizers, and
//! every SIMD kernel checked against the quant crate's scalar reference dot with a
//! normalized error |Δ| / Σ|w||a|. (The reference code itself is checked against gguf and
//! ggml in crates/quant/tests/reference.rs.)

use neagari_backend::cpu::kernels::{kernel_for, ActFormat, CpuFeatures, MatKernel};
use neagari_quant::{
    dequantize_row, float, q4_0, q4_1, q5_0, q5_1, q8_0, quantize_row, BlockQ8_0, BlockQ8_1,
    GgmlType,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// Largest normalized error allowed for a kernel against the reference dot (observed worst
/// cases on these seeds are 1–6.5e-7). The integer formats compute the same exact per-block
/// integer sums and the same f32 block scales as the reference, so only the order of the
/// f32 accumulation differs; Q4_1/Q5_1 add an `m · s` product per block, spread over 8
/// lanes, which rounds a little more. The float formats meet an f64-accumulated reference.
fn threshold(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 => 2e-6,
        _ => 1e-6,
    }
}

/// `n` values: uniform in ±1 with a per-32-block scale over 2^±6 and an occasional outlier,
/// so block scales and quant ranges vary the way real rows do.
fn random_row(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x = vec![0f32; n];
    for blk in x.chunks_mut(32) {
        let scale = (2f32).powf(rng.gen_range(-6.0..6.0));
        for v in blk.iter_mut() {
            *v = rng.gen_range(-1.0f32..1.0) * scale;
        }
        if rng.gen_bool(0.2) {
            let i = rng.gen_range(0..blk.len());
            blk[i] *= 8.0;
        }
    }
    x
}

/// Reference dot of one packed weight row with one activation row in the kernel's format.
fn reference_dot(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    let a_f32 = || f32s(a);
    match ty {
        GgmlType::F32 => float::dot_f32(w, &a_f32()),
        GgmlType::F16 => float::dot_f16(w, &a_f32()),
        GgmlType::BF16 => float::dot_bf16(w, &a_f32()),
        GgmlType::Q4_0 => q4_0::dot(bytemuck::cast_slice(w), q8(a)),
        GgmlType::Q5_0 => q5_0::dot(bytemuck::cast_slice(w), q8(a)),
        GgmlType::Q8_0 => q8_0::dot(bytemuck::cast_slice(w), q8(a)),
        GgmlType::Q4_1 => q4_1::dot(bytemuck::cast_slice(w), q81(a)),
        GgmlType::Q5_1 => q5_1::dot(bytemuck::cast_slice(w), q81(a)),
        other => panic!("no reference dot for {other}"),
    }
}

/// Little-endian f32 bytes → values (the bytes need not be aligned).
fn f32s(a: &[u8]) -> Vec<f32> {
    a.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn q8(a: &[u8]) -> &[BlockQ8_0] {
    bytemuck::cast_slice(a)
}

fn q81(a: &[u8]) -> &[BlockQ8_1] {
    bytemuck::cast_slice(a)
}

/// Σ|w||a| over the dequantized operands: the scale rounding error is measured against.
fn abs_dot(ty: GgmlType, act: ActFormat, w: &[u8], a: &[u8], k: usize) -> f64 {
    let mut wf = vec![0f32; k];
    dequantize_row(ty, w, &mut wf).unwrap();
    let af: Vec<f32> = match act {
        ActFormat::F32 => f32s(a),
        ActFormat::Q8_0 => deq(GgmlType::Q8_0, a, k),
        ActFormat::Q8_1 => deq(GgmlType::Q8_1, a, k),
        ActFormat::Q8K => panic!("not a legacy activation format"),
    };
    wf.iter()
        .zip(&af)
        .map(|(x, y)| (*x as f64 * *y as f64).abs())
        .sum()
}

fn deq(ty: GgmlType, a: &[u8], k: usize) -> Vec<f32> {
    let mut v = vec![0f32; k];
    dequantize_row(ty, a, &mut v).unwrap();
    v
}

/// One case: checks `kern`'s quantize_act against the portable one and its gemm against
/// the reference dot; returns the worst normalized error.
fn check_case(
    ty: GgmlType,
    kern: &MatKernel,
    portable: &MatKernel,
    k: usize,
    nw: usize,
    na: usize,
    rng: &mut StdRng,
) -> f64 {
    let wrb = ty.row_bytes(k).unwrap();
    let mut w = vec![0u8; nw * wrb]; // [nw × wrb] packed weight rows
    for row in w.chunks_exact_mut(wrb) {
        quantize_row(ty, &random_row(rng, k), row).unwrap();
    }
    let arb = kern.act.row_bytes(k);
    let mut a = vec![0u8; na * arb]; // [na × arb] activation rows in kern.act
    let mut a_portable = vec![0u8; arb];
    for row in a.chunks_exact_mut(arb) {
        let x = random_row(rng, k);
        (kern.quantize_act)(&x, row);
        (portable.quantize_act)(&x, &mut a_portable);
        // The SIMD activation quantizers round exactly like ggml's roundf: no ±1 slack.
        assert_eq!(
            row,
            &a_portable[..],
            "{ty} {}: quantize_act differs, k={k}",
            kern.isa
        );
    }
    // Padding between output rows must survive: out[na × stride], stride > nw.
    let stride = nw + 3;
    let mut out = vec![f32::NAN; na * stride];
    (kern.gemm)(k, &w, nw, &a, na, &mut out, stride);
    let mut worst = 0f64;
    for i in 0..na {
        for j in 0..stride {
            let got = out[i * stride + j];
            if j >= nw {
                assert!(
                    got.is_nan(),
                    "{ty} {}: wrote padding out[{i}][{j}]",
                    kern.isa
                );
                continue;
            }
            let (wr, ar) = (&w[j * wrb..(j + 1) * wrb], &a[i * arb..(i + 1) * arb]);
            let want = reference_dot(ty, wr, ar);
            let scale = abs_dot(ty, kern.act, wr, ar, k).max(f64::MIN_POSITIVE);
            let err = (got as f64 - want as f64).abs() / scale;
            assert!(
                err <= threshold(ty),
                "{ty} {}: k={k} nw={nw} na={na} out[{i}][{j}] = {got}, reference {want}, \
                 normalized error {err:e}",
                kern.isa
            );
            worst = worst.max(err);
        }
    }
    worst
}

fn run_type(ty: GgmlType, extra_k: &[usize]) {
    let feats = CpuFeatures::detect();
    let portable = kernel_for(ty, &feats, true).expect("portable kernel");
    assert_eq!(portable.isa, "scalar");
    let mut kernels = vec![portable];
    // The AVX2 kernels, also on a CPU that would pick AVX-512 for this type.
    let avx2_only = CpuFeatures {
        avx512f: false,
        avx512vnni: false,
        ..feats
    };
    match kernel_for(ty, &avx2_only, false) {
        Some(k) if k.isa == "avx2" => kernels.push(k),
        Some(k) if k.isa == "scalar" => {
            eprintln!("note: {ty}: CPU lacks AVX2/FMA/F16C, only the portable kernel is tested")
        }
        Some(k) => panic!("{ty}: unexpected kernel {}", k.isa),
        None => panic!("{ty}: no kernel"),
    }
    match kernel_for(ty, &feats, false) {
        Some(k) if k.isa == "avx512vnni" => kernels.push(k),
        Some(k) if is_integer_legacy(ty) => eprintln!(
            "note: {ty}: CPU lacks AVX-512 F/BW/VL/VNNI ({} picked), the VNNI kernel is not \
             tested here",
            k.isa
        ),
        Some(_) => {}
        None => panic!("{ty}: no kernel"),
    }
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ty.id() as u64);
    for kern in &kernels {
        let mut worst = 0f64;
        for &k in [32, 64, 96, 4096, 4128].iter().chain(extra_k) {
            for nw in [1, 3, 17] {
                for na in [1, 2, 5] {
                    worst = worst.max(check_case(ty, kern, &portable, k, nw, na, &mut rng));
                }
            }
        }
        // 64 activation rows and more cross the driver's activation panels.
        worst = worst.max(check_case(ty, kern, &portable, 64, 5, 70, &mut rng));
        // Row counts around the AVX2 prefill panels: 8-row weight panels unpacked 64 at a
        // time (70 = 64 + a ragged 6), 4-row activation tiles (every tail), and both sides
        // of each format's switch from row-major tiles to panels (2 and 8 rows).
        for na in [3, 4, 7, 8, 9] {
            worst = worst.max(check_case(ty, kern, &portable, 640, 70, na, &mut rng));
        }
        // Decode at Gemma 3 270M's k = 640 (20 blocks: a full and a partial 16-block scale
        // group of the VNNI tile), with every 4-row weight tile tail and 1..=5 activation
        // rows (both sides of the VNNI kernels' switch back to AVX2).
        for nw in [1, 7, 70, 4096] {
            for na in 1..=5 {
                worst = worst.max(check_case(ty, kern, &portable, 640, nw, na, &mut rng));
            }
        }
        // Odd block counts (a lone last block) and exactly one full scale group.
        for k in [160, 512, 544, 608] {
            worst = worst.max(check_case(ty, kern, &portable, k, 9, 1, &mut rng));
        }
        eprintln!("{ty} {}: worst normalized error {worst:e}", kern.isa);
    }
}

/// The formats with AVX-512 VNNI decode kernels (Q4_0's measured slower than its AVX2 one,
/// see docs/BENCHMARKS.md).
fn is_integer_legacy(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

#[test]
fn f32_kernels() {
    // Float rows have no block structure: ragged k exercises the scalar tails.
    run_type(GgmlType::F32, &[1, 7, 15, 33, 100]);
}

#[test]
fn f16_kernels() {
    run_type(GgmlType::F16, &[1, 7, 15, 33, 100]);
}

#[test]
fn bf16_kernels() {
    run_type(GgmlType::BF16, &[1, 7, 15, 33, 100]);
}

#[test]
fn q4_0_kernels() {
    run_type(GgmlType::Q4_0, &[]);
}

#[test]
fn q4_1_kernels() {
    run_type(GgmlType::Q4_1, &[]);
}

#[test]
fn q5_0_kernels() {
    run_type(GgmlType::Q5_0, &[]);
}

#[test]
fn q5_1_kernels() {
    run_type(GgmlType::Q5_1, &[]);
}

#[test]
fn q8_0_kernels() {
    run_type(GgmlType::Q8_0, &[]);
}

#[test]
fn every_legacy_type_has_a_kernel_and_a_matching_activation_format() {
    let feats = CpuFeatures::detect();
    for ty in TYPES {
        for scalar_only in [true, false] {
            let k = kernel_for(ty, &feats, scalar_only).expect("kernel");
            let want = match ty {
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActFormat::F32,
                GgmlType::Q4_1 | GgmlType::Q5_1 => ActFormat::Q8_1,
                _ => ActFormat::Q8_0,
            };
            assert_eq!(k.act, want, "{ty}");
        }
    }
}

#[test]
fn activation_quantizers_round_half_to_even() {
    // Values that land exactly on .5 after scaling by 127/amax: ties round to even in both
    // quantizers, as llama.cpp's run-time x86 quantize_row_q8_0/q8_1 do (_mm256_round_ps
    // with _MM_ROUND_NEAREST), unlike ggml's `_ref` (roundf).
    let feats = CpuFeatures::detect();
    let mut x = vec![0f32; 64];
    x[..5].copy_from_slice(&[127.0, 2.5, -0.5, 0.5, -2.5]);
    x[32..37].copy_from_slice(&[-127.0, 1.5, -1.5, 126.5, -126.5]);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
        for scalar_only in [true, false] {
            let k = kernel_for(ty, &feats, scalar_only).unwrap();
            let mut out = vec![0u8; k.act.row_bytes(64)];
            (k.quantize_act)(&x, &mut out);
            let vals = deq(
                if k.act == ActFormat::Q8_0 {
                    GgmlType::Q8_0
                } else {
                    GgmlType::Q8_1
                },
                &out,
                64,
            );
            // amax = 127 in both blocks → d = 1 exactly, so x itself is rounded. roundf
            // would give 3, −1, 1, −3 and 127, −127 here.
            let want = [127.0, 2.0, -0.0, 0.0, -2.0];
            assert_eq!(vals[..5], want, "{ty} {}", k.isa);
            assert_eq!(
                vals[32..37],
                [-127.0, 2.0, -2.0, 126.0, -126.0],
                "{ty} {}",
                k.isa
            );
        }
    }
}

#[test]
#[should_panic(expected = "gemm")]
fn gemm_rejects_a_short_output() {
    let feats = CpuFeatures::detect();
    let k = kernel_for(GgmlType::Q4_0, &feats, false).unwrap();
    let w = vec![0u8; 2 * 18];
    let a = vec![0u8; 34];
    let mut out = vec![0f32; 1];
    (k.gemm)(32, &w, 2, &a, 1, &mut out, 2);
}
