//! Portable kernels for the low-bit formats that have no SIMD micro-kernel yet (PTQ1_0):
//! the quant crate's reference dot row by row, with
//! the activation format ggml dots the type with. Correct everywhere, slow; a format moves
//! off this list when it gets its own `cpu/<fmt>/` kernels.

use super::kernels::{ActFormat, CpuFeatures, MatKernel};
use super::tiles::{check, scalar_gemm};
use neagari_quant::*;

/// One weight type as the reference kernel needs it.
pub(crate) trait RefDot {
    /// Weights and bytes per block.
    const BLOCK: usize;
    const BYTES: usize;
    /// Q8_0 or Q8_K.
    const ACT: ActFormat;
    /// The quant crate's reference dot of one weight row with one activation row.
    fn dot(w: &[u8], a: &[u8]) -> f32;
}

fn gemm<F: RefDot>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = check(
        k,
        F::BLOCK.max(if F::ACT == ActFormat::Q8K { 256 } else { 32 }),
        k / F::BLOCK * F::BYTES,
        F::ACT.row_bytes(k),
        w,
        nw,
        a,
        na,
        out,
        out_stride,
    );
    scalar_gemm(s, w, nw, a, na, out, out_stride, F::dot);
}

/// The reference kernel of `F`, with the fastest activation quantizer this CPU has.
pub(crate) fn kernel<F: RefDot>(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    let quantize_act = match F::ACT {
        ActFormat::Q8K => super::q8_k::quantize_act(feats, scalar_only).0,
        _ => {
            #[cfg(target_arch = "x86_64")]
            if feats.has_avx2() && !scalar_only {
                super::q8_0::quantize_act_avx2
            } else {
                super::q8_0::quantize_act_scalar
            }
            #[cfg(not(target_arch = "x86_64"))]
            super::q8_0::quantize_act_scalar
        }
    };
    MatKernel {
        act: F::ACT,
        quantize_act,
        gemm: gemm::<F>,
        isa: "scalar",
    }
}

macro_rules! ref_format {
    ($name:ident, $block:expr, $bytes:expr, $act:expr, $dot:path, $blk:ty, $ablk:ty) => {
        pub(crate) struct $name;
        impl RefDot for $name {
            const BLOCK: usize = $block;
            const BYTES: usize = $bytes;
            const ACT: ActFormat = $act;
            fn dot(w: &[u8], a: &[u8]) -> f32 {
                $dot(
                    bytemuck::cast_slice::<u8, $blk>(w),
                    bytemuck::cast_slice::<u8, $ablk>(a),
                )
            }
        }
    };
}

ref_format!(
    Ptq1_0,
    128,
    28,
    ActFormat::Q8_0,
    ptq1_0::dot,
    BlockPTQ1_0,
    BlockQ8_0
);
