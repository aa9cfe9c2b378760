//! IQ2_XS weights × Q8_K activations: the format's hooks for the shared K-quant kernels in
//! `q8_k` (scalar = the quant crate's reference dot; AVX2 micro-kernel in `avx2.rs`, AVX-512VL
//! one with mask-register signs in `avx512.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{iq2_xs, BlockIQ2_XS, BlockQ8_K};

struct Format;

impl KFormat for Format {
    const BYTES: usize = 74;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        iq2_xs::dot(
            bytemuck::cast_slice::<u8, BlockIQ2_XS>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    }

    #[cfg(target_arch = "x86_64")]
    type Micro = avx2::Iq2Xs;
    #[cfg(target_arch = "x86_64")]
    type Micro512 = avx512::Iq2XsMask;
}

/// The IQ2_XS kernel for this CPU.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    super::q8_k::kernel::<Format>(feats, scalar_only)
}
