//! Q4_1 blocks for the shared AVX2 unsigned tile: 16 bytes of nibbles → 32 quants 0..=15,
//! plus the block minimum.

use crate::cpu::avx2_tiles::{nibbles, splat_f16, UnsignedBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q4_1;

impl UnsignedBlocks for Q4_1 {
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> (__m256, __m256, __m256i) {
        // SAFETY: the block's 20 bytes (d, m, qs[16]) are readable per the trait contract.
        unsafe { (splat_f16(p), splat_f16(p.add(2)), nibbles(p.add(4))) }
    }
}
