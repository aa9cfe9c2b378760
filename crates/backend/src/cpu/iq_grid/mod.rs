//! The grid i-quants without a kernel family of their own — IQ2_XXS, IQ2_S, IQ3_XXS,
//! IQ3_S, IQ1_S, IQ1_M — dotted with Q8_K activations: each format's hooks for the shared
//! K-quant driver in `q8_k` (scalar = the quant crate's reference dot) and its AVX2
//! micro-kernel, one file per format (the driver also builds them with AVX-512VL
//! encodings). IQ2_XS has its own `cpu/iq2_xs/`.
//!
//! Every micro-kernel gathers, per 8 weights, one grid row with a scalar load (the grids
//! are 1–16 KiB tables) and meets 32 contiguous activation quants with one `maddubs`
//! (magnitudes unsigned, signs moved onto the activation with `psignb`) and one `madd`
//! that applies the group scale while summing into i32 lanes. The integer sums per block
//! are exact, as in the reference; only the f32 accumulation order differs. In the
//! AVX-512 builds the signs go through mask registers instead of ±1 bytes: IQ2_S and IQ3_S
//! store one bit per weight; IQ2_XXS and IQ3_XXS store 7-bit indices whose 8-bit masks
//! are computed for a whole block at once. Tested against
//! the quant crate's reference dots in tests/kernels_lowbit.rs.

#[cfg(target_arch = "x86_64")]
mod iq1;
#[cfg(target_arch = "x86_64")]
mod iq2_s;
#[cfg(target_arch = "x86_64")]
mod iq2_xxs;
#[cfg(target_arch = "x86_64")]
mod iq3_s;
#[cfg(target_arch = "x86_64")]
mod iq3_xxs;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{
    BlockIQ1_M, BlockIQ1_S, BlockIQ2_S, BlockIQ2_XXS, BlockIQ3_S, BlockIQ3_XXS, BlockQ8_K,
};

macro_rules! grid_format {
    ($name:ident, $bytes:expr, $dot:path, $blk:ty, $micro:ty) => {
        grid_format!($name, $bytes, $dot, $blk, $micro, $micro);
    };
    ($name:ident, $bytes:expr, $dot:path, $blk:ty, $micro:ty, $micro512:ty) => {
        pub(crate) struct $name;
        impl KFormat for $name {
            const BYTES: usize = $bytes;
            fn dot(w: &[u8], a: &[u8]) -> f32 {
                $dot(
                    bytemuck::cast_slice::<u8, $blk>(w),
                    bytemuck::cast_slice::<u8, BlockQ8_K>(a),
                )
            }
            #[cfg(target_arch = "x86_64")]
            type Micro = $micro;
            #[cfg(target_arch = "x86_64")]
            type Micro512 = $micro512;
        }
    };
    // `$micro512` uses AVX-512 VNNI (`KFormat::MICRO512_VNNI`).
    ($name:ident, $bytes:expr, $dot:path, $blk:ty, $micro:ty, $micro512:ty, vnni) => {
        pub(crate) struct $name;
        impl KFormat for $name {
            const BYTES: usize = $bytes;
            fn dot(w: &[u8], a: &[u8]) -> f32 {
                $dot(
                    bytemuck::cast_slice::<u8, $blk>(w),
                    bytemuck::cast_slice::<u8, BlockQ8_K>(a),
                )
            }
            #[cfg(target_arch = "x86_64")]
            type Micro = $micro;
            #[cfg(target_arch = "x86_64")]
            type Micro512 = $micro512;
            const MICRO512_VNNI: bool = true;
        }
    };
}

grid_format!(
    Iq2Xxs,
    66,
    neagari_quant::iq2_xxs::dot,
    BlockIQ2_XXS,
    iq2_xxs::Iq2Xxs<false>,
    iq2_xxs::Iq2Xxs<true>
);
grid_format!(
    Iq2S,
    82,
    neagari_quant::iq2_s::dot,
    BlockIQ2_S,
    iq2_s::Iq2S<false>,
    iq2_s::Iq2S<true>
);
grid_format!(
    Iq3Xxs,
    98,
    neagari_quant::iq3_xxs::dot,
    BlockIQ3_XXS,
    iq3_xxs::Iq3Xxs<false>,
    iq3_xxs::Iq3Xxs<true>
);
grid_format!(
    Iq3S,
    110,
    neagari_quant::iq3_s::dot,
    BlockIQ3_S,
    iq3_s::Iq3S<false>,
    iq3_s::Iq3S<true>
);
grid_format!(
    Iq1S,
    50,
    neagari_quant::iq1_s::dot,
    BlockIQ1_S,
    iq1::Iq1S,
    iq1::Iq1SVnni,
    vnni
);
grid_format!(
    Iq1M,
    56,
    neagari_quant::iq1_m::dot,
    BlockIQ1_M,
    iq1::Iq1M,
    iq1::Iq1MVnni,
    vnni
);

/// The kernel of grid format `F` on this CPU.
pub(crate) fn kernel<F: KFormat>(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    super::q8_k::kernel::<F>(feats, scalar_only)
}
