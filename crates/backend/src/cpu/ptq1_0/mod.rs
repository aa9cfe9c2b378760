//! PTQ1_0 weights (PrismML: TQ1_0's trit codec on 128-weight blocks, one f16 scale) ×
//! Q8_0 activations: the format's hooks for the wide-block driver in `q8_0_wide` (scalar =
//! the quant crate's reference dot; the AVX2 micro-kernel in `avx2.rs`, also compiled with
//! AVX-512 encodings for the driver's VNNI slot).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_0_wide::{Perm, WideFormat};
use neagari_quant::{ptq1_0, BlockPTQ1_0, BlockQ8_0};

pub(crate) struct Format;

impl WideFormat for Format {
    const BLOCK: usize = 128;
    const BYTES: usize = 28;
    const PERM: Perm = Perm::Identity;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        ptq1_0::dot(
            bytemuck::cast_slice::<u8, BlockPTQ1_0>(w),
            bytemuck::cast_slice::<u8, BlockQ8_0>(a),
        )
    }
}

/// The PTQ1_0 kernel for this CPU: the AVX2 micro-kernel (in the AVX-512 driver where
/// present), else scalar.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    {
        super::q8_0_wide::kernel::<Format, avx2::Ptq1_0, avx2::Ptq1_0>(feats, scalar_only)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (feats, scalar_only);
        super::q8_0_wide::scalar_kernel::<Format>()
    }
}
