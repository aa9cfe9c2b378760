//! Q8_0 blocks for the shared AVX-512 VNNI tile: the 32 signed quants with their sign bit
//! flipped, i.e. `q + 128` as unsigned bytes, offset 128.

use crate::cpu::avx512_tiles::VnniBlocks;
use std::arch::x86_64::*;

pub(crate) struct Q8_0;

impl VnniBlocks for Q8_0 {
    const BYTES: usize = 34;
    const OFFSET: i32 = 128;
    const HAS_MIN: bool = false;
    // Every row count: these tiles sum in llama.cpp's order (ggml's vec_dot for one row,
    // tinyBLAS for more), the AVX2 panels do not.
    const MAX_NA: usize = usize::MAX;
    const AVX2_GEMM: crate::cpu::kernels::GemmFn =
        crate::cpu::avx2_tiles::gemm_signed::<super::avx2::Q8_0>;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn pair(p0: *const u8, p1: *const u8) -> __m512i {
        // SAFETY: both blocks' 34 bytes are readable per the trait contract.
        let v = unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(p0.add(2) as *const __m256i)),
                _mm256_loadu_si256(p1.add(2) as *const __m256i),
            )
        };
        _mm512_xor_si512(v, _mm512_set1_epi8(-128))
    }
}
