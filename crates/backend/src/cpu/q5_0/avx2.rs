//! Q5_0 blocks for the shared AVX2 unsigned tile: nibbles plus the 32 fifth bits of `qh` →
//! 32 quants 0..=31, offset 16 (removed exactly in the i16 pair sums, see
//! `ActConst::Offset`).

use crate::cpu::avx2_tiles::{bits_to_bytes, nibbles, splat_f16, UnsignedBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q5_0;

impl UnsignedBlocks for Q5_0 {
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;
    const OFFSET: i16 = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> (__m256, __m256, __m256i) {
        // SAFETY: the block's 22 bytes (d, qh[4], qs[16]) are readable per the trait contract.
        let (d, hi, lo) = unsafe { (splat_f16(p), bits_to_bytes(p.add(2)), nibbles(p.add(6))) };
        (
            d,
            d,
            _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(16))),
        )
    }
}
