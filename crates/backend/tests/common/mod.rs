//! Helpers shared by the kernel-vs-reference tests: random data and the reference side of
//! a comparison (activation quantization through the kernel's own quantizer, dequantized
//! weight rows).

use neagari_backend::cpu::kernels::{kernel_for, CpuFeatures, MatKernel};
use neagari_quant::{dequantize_row, GgmlType};
use rand::rngs::StdRng;
use rand::Rng;

pub fn gauss(rng: &mut StdRng) -> f32 {
    // Box–Muller; rand 0.8 alone has no normal distribution.
    let u1: f32 = rng.gen_range(f32::EPSILON..1.0);
    let u2: f32 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

pub fn quantize_acts(kern: &MatKernel, x: &[f32], k: usize) -> Vec<u8> {
    let rb = kern.act.row_bytes(k);
    let mut out = vec![0u8; x.len() / k * rb];
    for (xr, orow) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        (kern.quantize_act)(xr, orow);
    }
    out
}

pub fn dequant_rows(ty: GgmlType, bytes: &[u8], k: usize) -> Vec<f32> {
    let rb = ty.row_bytes(k).expect("whole blocks");
    let mut out = vec![0f32; bytes.len() / rb * k];
    for (src, o) in bytes.chunks_exact(rb).zip(out.chunks_exact_mut(k)) {
        dequantize_row(ty, src, o).expect("dequantize");
    }
    out
}

/// Every SIMD kernel this CPU can run for `ty`: the one `kernel_for` picks, and the ones it
/// would pick with the wider instruction sets masked off.
pub fn simd_kernels(ty: GgmlType) -> Vec<MatKernel> {
    let detected = CpuFeatures::detect();
    // AVX-512 without VNNI: the VL build of the AVX2 micro-kernel where a format's own
    // AVX-512 kernel needs VNNI (Q2_K).
    let no_vnni = CpuFeatures {
        avx512vnni: false,
        ..detected
    };
    let no_avx512 = CpuFeatures {
        avx512f: false,
        avx512bw: false,
        avx512vl: false,
        avx512vnni: false,
        ..detected
    };
    let mut out: Vec<MatKernel> = Vec::new();
    for feats in [detected, no_vnni, no_avx512] {
        let k = kernel_for(ty, &feats, false).expect("kernel");
        if k.isa != "scalar" && !out.iter().any(|o| o.isa == k.isa) {
            out.push(k);
        }
    }
    if out.is_empty() {
        eprintln!("{ty}: no SIMD kernel (for this type or on this CPU): SIMD checks skipped");
    }
    out
}
