//! IQ4_NL weights (32 weights, f16 scale, 4-bit indices into ggml's `kvalues_iq4nl`) ×
//! Q8_0 activations, as hooks for the wide-block driver in `q8_0_wide` (scalar = the quant
//! crate's reference dot; micro-kernels in `avx2.rs` and `avx512.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_0_wide::{Perm, WideFormat};
use neagari_quant::{iq4_nl, BlockIQ4_NL, BlockQ8_0};

pub(crate) struct Format;

impl WideFormat for Format {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const PERM: Perm = Perm::Identity;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        iq4_nl::dot(
            bytemuck::cast_slice::<u8, BlockIQ4_NL>(w),
            bytemuck::cast_slice::<u8, BlockQ8_0>(a),
        )
    }
}

/// The IQ4_NL kernel for this CPU: AVX-512 VNNI, else AVX2, else scalar.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    #[cfg(target_arch = "x86_64")]
    {
        super::q8_0_wide::kernel::<Format, avx2::Iq4Nl, avx512::Iq4Nl>(feats, scalar_only)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (feats, scalar_only);
        super::q8_0_wide::scalar_kernel::<Format>()
    }
}
