//! Q2_0 (group 64) and PQ2_0 (group 128) weights × Q8_0 activations: the same 2-bit codec
//! (`x = (code − 1)·d`) at two block sizes, as hooks for the wide-block driver in
//! `q8_0_wide`. The micro-kernels take the block's 32-weight sub-block count as a const
//! parameter (2 for Q2_0, 4 for PQ2_0). Scalar = the quant crate's reference dots.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_0_wide::{Perm, WideFormat};
use neagari_quant::{pq2_0, q2_0, BlockPQ2_0, BlockQ2_0, BlockQ8_0};

pub(crate) struct Q2_0;
pub(crate) struct PQ2_0;

impl WideFormat for Q2_0 {
    const BLOCK: usize = 64;
    const BYTES: usize = 18;
    const PERM: Perm = Perm::Stride4;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        q2_0::dot(
            bytemuck::cast_slice::<u8, BlockQ2_0>(w),
            bytemuck::cast_slice::<u8, BlockQ8_0>(a),
        )
    }
}

impl WideFormat for PQ2_0 {
    const BLOCK: usize = 128;
    const BYTES: usize = 34;
    const PERM: Perm = Perm::Stride4;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        pq2_0::dot(
            bytemuck::cast_slice::<u8, BlockPQ2_0>(w),
            bytemuck::cast_slice::<u8, BlockQ8_0>(a),
        )
    }
}

/// The Q2_0 kernel for this CPU: AVX-512 VNNI, else AVX2, else scalar.
pub(crate) fn kernel_q2_0(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    {
        super::q8_0_wide::kernel::<Q2_0, avx2::Codes2<2>, avx512::Codes2<2>>(feats, scalar_only)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (feats, scalar_only);
        super::q8_0_wide::scalar_kernel::<Q2_0>()
    }
}

/// The PQ2_0 kernel for this CPU: AVX-512 VNNI, else AVX2, else scalar.
pub(crate) fn kernel_pq2_0(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    {
        super::q8_0_wide::kernel::<PQ2_0, avx2::Codes2<4>, avx512::Codes2<4>>(feats, scalar_only)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (feats, scalar_only);
        super::q8_0_wide::scalar_kernel::<PQ2_0>()
    }
}
