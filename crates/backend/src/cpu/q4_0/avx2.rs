//! Q4_0 blocks for the shared AVX2 unsigned tile: 16 bytes of nibbles → 32 quants 0..=15,
//! offset 8 (removed exactly in the i16 pair sums, see `ActConst::Offset`).

use crate::cpu::avx2_tiles::{nibbles, splat_f16, UnsignedBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q4_0;

impl UnsignedBlocks for Q4_0 {
    const BYTES: usize = 18;
    const HAS_MIN: bool = false;
    const OFFSET: i16 = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> (__m256, __m256, __m256i) {
        // SAFETY: the block's 18 bytes are readable per the trait contract.
        let (d, q) = unsafe { (splat_f16(p), nibbles(p.add(2))) };
        (d, d, q)
    }
}
