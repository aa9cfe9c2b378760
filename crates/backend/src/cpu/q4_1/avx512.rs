//! Q4_1 blocks for the shared AVX-512 VNNI tile: nibbles → quants 0..=15, plus the block
//! minimum.

use crate::cpu::avx512_tiles::{nibbles_pair, VnniBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q4_1;

impl VnniBlocks for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: i32 = 0;
    const HAS_MIN: bool = true;
    const MAX_NA: usize = 1;
    const AVX2_GEMM: crate::cpu::kernels::GemmFn =
        crate::cpu::avx2_tiles::gemm_unsigned::<super::avx2::Q4_1>;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: both blocks' 20 bytes are readable per the trait contract.
        unsafe { nibbles_pair(p0.add(4), p1.add(4)) }
    }
}
