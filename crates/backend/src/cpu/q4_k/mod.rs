//! Q4_K weights × Q8_K activations: the format's hooks for the shared K-quant kernels in
//! `q8_k` (scalar = the quant crate's reference dot; AVX2 micro-kernel in `avx2.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{q4_k, BlockQ4_K, BlockQ8_K};

struct Format;

impl KFormat for Format {
    const BYTES: usize = 144;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        q4_k::dot(
            bytemuck::cast_slice::<u8, BlockQ4_K>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    }

    #[cfg(target_arch = "x86_64")]
    type Micro = avx2::Q4K;
    #[cfg(target_arch = "x86_64")]
    type Micro512 = avx512::Q4KVnni;
    const MICRO512_VNNI: bool = true;
}

/// The Q4_K kernel for this CPU.
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    super::q8_k::kernel::<Format>(feats, scalar_only)
}
