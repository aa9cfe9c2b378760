//! Q5_0 blocks for the shared AVX-512 VNNI tile: nibbles plus the 32 fifth bits of `qh` →
//! quants 0..=31, offset 16.

use crate::cpu::avx512_tiles::{fifth_bits, nibbles_pair, VnniBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q5_0;

impl VnniBlocks for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: i32 = 16;
    const HAS_MIN: bool = false;
    // Every row count: these tiles sum in llama.cpp's order (ggml's vec_dot for one row,
    // tinyBLAS for more), the AVX2 panels do not.
    const MAX_NA: usize = usize::MAX;
    const AVX2_GEMM: crate::cpu::kernels::GemmFn =
        crate::cpu::avx2_tiles::gemm_unsigned::<super::avx2::Q5_0>;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: both blocks' 22 bytes (d, qh[4], qs[16]) are readable per the trait
        // contract.
        unsafe { fifth_bits(nibbles_pair(p0.add(6), p1.add(6)), p0.add(2), p1.add(2)) }
    }
}
