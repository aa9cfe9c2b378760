//! Q6_K weights × Q8_K activations: the scalar kernel (the quant crate's reference dot)
//! and the AVX2 one.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use super::kernels::{ActFormat, CpuFeatures, GemmFn, MatKernel};
use super::q8_k::tiles::{check, scalar_gemm};
use neagari_quant::{q6_k, BlockQ6_K, BlockQ8_K};

const BYTES: usize = 210;

fn gemm_scalar(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = check(k, BYTES, w, nw, a, na, out, out_stride);
    scalar_gemm(r, w, nw, a, na, out, out_stride, |w, a| {
        q6_k::dot(
            bytemuck::cast_slice::<u8, BlockQ6_K>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    });
}

#[cfg(target_arch = "x86_64")]
fn gemm_avx2(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = check(k, BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: handed out by `kernel` only after AVX2/FMA/F16C were detected; `r` was
    // checked against these buffers.
    unsafe { super::q8_k::avx2::gemm_avx2::<avx2::Q6K>(r, w, nw, a, na, out, out_stride) }
}

#[cfg(target_arch = "x86_64")]
fn gemm_avx512vl(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = check(k, BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: handed out by `kernel` only after AVX2/FMA/F16C and AVX-512F/BW/VL were
    // detected; `r` was checked against these buffers.
    unsafe { super::q8_k::avx2::gemm_avx512vl::<avx2::Q6K>(r, w, nw, a, na, out, out_stride) }
}

/// The Q6_K kernel for this CPU: the AVX-512VL build of the AVX2 kernel where available,
/// else AVX2, else scalar.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    let (quantize_act, isa) = super::q8_k::quantize_act(feats, scalar_only);
    let mk = |gemm: GemmFn, isa| MatKernel {
        act: ActFormat::Q8K,
        quantize_act,
        gemm,
        isa,
    };
    #[cfg(target_arch = "x86_64")]
    if isa == "avx2" {
        return if feats.has_avx512vl() {
            mk(gemm_avx512vl, "avx512vl")
        } else {
            mk(gemm_avx2, isa)
        };
    }
    mk(gemm_scalar, isa)
}
