//! Q5_1 blocks for the shared AVX2 unsigned tile: nibbles plus the 32 fifth bits of `qh` →
//! 32 quants 0..=31, plus the block minimum.

use crate::cpu::avx2_tiles::{bits_to_bytes, nibbles, splat_f16, UnsignedBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q5_1;

impl UnsignedBlocks for Q5_1 {
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> (__m256, __m256, __m256i) {
        // SAFETY: the block's 24 bytes (d, m, qh[4], qs[16]) are readable per the contract.
        let (d, m, hi, lo) = unsafe {
            (
                splat_f16(p),
                splat_f16(p.add(2)),
                bits_to_bytes(p.add(4)),
                nibbles(p.add(8)),
            )
        };
        (
            d,
            m,
            _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(16))),
        )
    }
}
