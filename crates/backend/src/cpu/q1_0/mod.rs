//! Q1_0 weights (128 sign bits + one f16 scale per block) × Q8_0 activations: the format's
//! hooks for the wide-block driver in `q8_0_wide` (scalar = the quant crate's reference
//! dot; micro-kernels in `avx2.rs` and `avx512.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_0_wide::{Perm, WideFormat};
use neagari_quant::{q1_0, BlockQ1_0, BlockQ8_0};

pub(crate) struct Format;

impl WideFormat for Format {
    const BLOCK: usize = 128;
    const BYTES: usize = 18;
    const PERM: Perm = Perm::Halves16;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        q1_0::dot(
            bytemuck::cast_slice::<u8, BlockQ1_0>(w),
            bytemuck::cast_slice::<u8, BlockQ8_0>(a),
        )
    }
}

/// The Q1_0 kernel for this CPU: AVX-512 VNNI, else AVX2, else scalar.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    {
        super::q8_0_wide::kernel::<Format, avx2::Q1_0, avx512::Q1_0>(feats, scalar_only)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (feats, scalar_only);
        super::q8_0_wide::scalar_kernel::<Format>()
    }
}
