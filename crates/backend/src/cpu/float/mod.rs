//! F32, F16 and BF16 weights × f32 activations (`ActFormat::F32`): kernel selection, the
//! activation "quantizer" (a copy to little-endian bytes) and the portable path, which is the
//! quant crate's reference dots (`neagari_quant::float::dot_*`, f64 accumulation).

#[cfg(target_arch = "x86_64")]
mod avx2;

use super::kernels::{ActFormat, CpuFeatures, MatKernel};
use super::tiles::{check, scalar_gemm};
use neagari_quant::{float, GgmlType};

/// The kernel for float weights of type `ty` (F32, F16 or BF16; `None` for any other type).
pub(crate) fn kernel(ty: GgmlType, feats: &CpuFeatures, scalar_only: bool) -> Option<MatKernel> {
    #[cfg(target_arch = "x86_64")]
    if feats.has_avx2() && !scalar_only {
        let gemm: super::kernels::GemmFn = match ty {
            GgmlType::F32 => avx2::gemm::<avx2::F32>,
            GgmlType::F16 => avx2::gemm::<avx2::F16>,
            GgmlType::BF16 => avx2::gemm::<avx2::BF16>,
            _ => return None,
        };
        return Some(MatKernel {
            act: ActFormat::F32,
            quantize_act,
            gemm,
            isa: "avx2",
        });
    }
    let _ = (feats, scalar_only);
    let gemm: super::kernels::GemmFn = match ty {
        GgmlType::F32 => gemm_scalar_f32,
        GgmlType::F16 => gemm_scalar_f16,
        GgmlType::BF16 => gemm_scalar_bf16,
        _ => return None,
    };
    Some(MatKernel {
        act: ActFormat::F32,
        quantize_act,
        gemm,
        isa: "scalar",
    })
}

/// `QuantizeActFn` for `ActFormat::F32`: `x[k]` → `out[4k]` little-endian bytes.
///
/// # Panics
/// If `out.len() != 4 * x.len()`.
fn quantize_act(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), 4 * x.len(), "F32 activation buffer");
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// f32 activation row bytes → f32 values (the bytes may be unaligned).
fn act_f32(a: &[u8]) -> Vec<f32> {
    a.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn gemm_scalar(
    elt: usize,
    dot: fn(&[u8], &[f32]) -> f32,
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = check(k, 1, k * elt, k * 4, w, nw, a, na, out, out_stride);
    scalar_gemm(s, w, nw, a, na, out, out_stride, |w, a| dot(w, &act_f32(a)));
}

fn gemm_scalar_f32(k: usize, w: &[u8], nw: usize, a: &[u8], na: usize, out: &mut [f32], os: usize) {
    gemm_scalar(4, float::dot_f32, k, w, nw, a, na, out, os)
}

fn gemm_scalar_f16(k: usize, w: &[u8], nw: usize, a: &[u8], na: usize, out: &mut [f32], os: usize) {
    gemm_scalar(2, float::dot_f16, k, w, nw, a, na, out, os)
}

fn gemm_scalar_bf16(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    os: usize,
) {
    gemm_scalar(2, float::dot_bf16, k, w, nw, a, na, out, os)
}
