//! Q5_0 blocks for the shared AVX-512 VNNI tile: nibbles plus the 32 fifth bits of `qh` →
//! quants 0..=31, offset 16.

use crate::cpu::avx512_tiles::{fifth_bits, nibbles_pair, VnniBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q5_0;

impl VnniBlocks for Q5_0 {
    const BYTES: usize = 22;
    const OFFSET: i32 = 16;
    const HAS_MIN: bool = false;
    const MAX_NA: usize = 1;
    const AVX2_GEMM: crate::cpu::kernels::GemmFn =
        crate::cpu::avx2_tiles::gemm_unsigned::<super::avx2::Q5_0>;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair(p: *const u8) -> __m512i {
        let p1 = p.wrapping_add(Self::BYTES);
        // SAFETY: both blocks' 44 bytes (d, qh[4], qs[16] each) are readable per the
        // trait contract.
        unsafe { fifth_bits(nibbles_pair(p.add(6), p1.add(6)), p.add(2), p1.add(2)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn single(p: *const u8) -> __m512i {
        // SAFETY: the block's 22 bytes are readable per the trait contract.
        unsafe { fifth_bits(nibbles_pair(p.add(6), p.add(6)), p.add(2), p.add(2)) }
    }
}
