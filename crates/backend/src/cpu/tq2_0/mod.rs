//! TQ2_0 weights × Q8_K activations: the format's hooks for the shared K-quant kernels in
//! `q8_k` (scalar = the quant crate's reference dot; AVX2 micro-kernel in `avx2.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{tq2_0, BlockQ8_K, BlockTQ2_0};

struct Format;

impl KFormat for Format {
    const BYTES: usize = 66;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        tq2_0::dot(
            bytemuck::cast_slice::<u8, BlockTQ2_0>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    }

    #[cfg(target_arch = "x86_64")]
    type Micro = avx2::TQ2_0;
    #[cfg(target_arch = "x86_64")]
    type Micro512 = avx2::TQ2_0;
}

/// The TQ2_0 kernel for this CPU.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    super::q8_k::kernel::<Format>(feats, scalar_only)
}
