//! Q8_0 with AVX2: weight blocks for the shared signed tile (32 i8 as they are), and the
//! Q8_0 activation quantizer, byte-identical to `quantize_row_q8_0_ref` (tested in
//! tests/kernels_legacy.rs against the scalar quantizer).

use crate::cpu::avx2_tiles::{available, quantize_block_q8, splat_f16, SignedBlocks};
use std::arch::x86_64::*;

pub(crate) struct Q8_0;

impl SignedBlocks for Q8_0 {
    const BYTES: usize = 34;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> (__m256, __m256i) {
        // SAFETY: the block's 34 bytes are readable per the trait contract.
        unsafe { (splat_f16(p), _mm256_loadu_si256(p.add(2) as *const __m256i)) }
    }
}

/// `QuantizeActFn`: `x[k]` → `out[k / 32 × 34]` Q8_0 blocks.
///
/// # Panics
/// If `k` is not a multiple of 32, `out` has the wrong size, or the CPU lacks AVX2/FMA/F16C.
pub(crate) fn quantize_act(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(32),
        "Q8_0 activation row of {} values",
        x.len()
    );
    assert_eq!(out.len(), x.len() / 32 * 34, "Q8_0 activation buffer");
    assert!(
        available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    for (xs, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        // SAFETY: features checked above; xs has 32 f32 and o[2..34] 32 writable bytes.
        let (d, _) = unsafe { quantize_block_q8(xs.as_ptr(), o[2..].as_mut_ptr() as *mut i8) };
        o[..2].copy_from_slice(&neagari_quant::float::f32_to_f16(d));
    }
}
