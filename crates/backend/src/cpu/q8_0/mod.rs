//! Q8_0 weights × Q8_0 activations: kernel selection and the portable path, which is the
//! quant crate's reference dot (`neagari_quant::q8_0::dot`) row by row.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

use super::kernels::{ActFormat, CpuFeatures, MatKernel};
use super::tiles::{check, scalar_gemm};
use neagari_quant::q8_0;

/// The Q8_0 kernel for this CPU (AVX-512 VNNI for decode, else AVX2, when available and not `scalar_only`).
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    if feats.has_avx512vnni() && !scalar_only {
        return MatKernel {
            act: ActFormat::Q8_0,
            quantize_act: super::q8_0::quantize_act_avx2,
            gemm: super::avx512_tiles::gemm::<avx512::Q8_0>,
            isa: "avx512vnni",
        };
    }
    #[cfg(target_arch = "x86_64")]
    if feats.has_avx2() && !scalar_only {
        return MatKernel {
            act: ActFormat::Q8_0,
            quantize_act: super::q8_0::quantize_act_avx2,
            gemm: super::avx2_tiles::gemm_signed::<avx2::Q8_0>,
            isa: "avx2",
        };
    }
    let _ = (feats, scalar_only);
    MatKernel {
        act: ActFormat::Q8_0,
        quantize_act: super::q8_0::quantize_act_scalar,
        gemm: gemm_scalar,
        isa: "scalar",
    }
}

fn gemm_scalar(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = k / q8_0::QK;
    let s = check(k, q8_0::QK, nb * 34, nb * 34, w, nw, a, na, out, out_stride);
    scalar_gemm(s, w, nw, a, na, out, out_stride, |w, a| {
        q8_0::dot(bytemuck::cast_slice(w), bytemuck::cast_slice(a))
    });
}

/// Portable `QuantizeActFn` for Q8_0: the quant crate's `quantize_row_q8_0_ref`.
///
/// # Panics
/// If `x.len()` is not a multiple of 32 or `out` is not `x.len() / 32 * 34` bytes.
pub(crate) fn quantize_act_scalar(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [q8_0::BlockQ8_0] = bytemuck::cast_slice_mut(out);
    assert_eq!(x.len(), blocks.len() * 32, "Q8_0 activation row");
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let (d, _) = crate::cpu::q8_1::quantize_block_runtime(xs, &mut b.qs);
        b.d = neagari_quant::float::f32_to_f16(d);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::quantize_act as quantize_act_avx2;
