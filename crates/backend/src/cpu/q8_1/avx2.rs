//! The Q8_1 activation quantizer with AVX2, byte-identical to `quantize_row_q8_1_ref`
//! (tested in tests/kernels_legacy.rs against the scalar quantizer).

use crate::cpu::avx2_tiles::{available, quantize_block_q8};
use neagari_quant::float::f32_to_f16;

/// `QuantizeActFn`: `x[k]` → `out[k / 32 × 36]` Q8_1 blocks.
///
/// # Panics
/// If `k` is not a multiple of 32, `out` has the wrong size, or the CPU lacks AVX2/FMA/F16C.
pub(crate) fn quantize_act(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(32),
        "Q8_1 activation row of {} values",
        x.len()
    );
    assert_eq!(out.len(), x.len() / 32 * 36, "Q8_1 activation buffer");
    assert!(
        available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    for (xs, o) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        // SAFETY: features checked above; xs has 32 f32 and o[4..36] 32 writable bytes.
        let (d, sum) = unsafe { quantize_block_q8(xs.as_ptr(), o[4..].as_mut_ptr() as *mut i8) };
        o[..2].copy_from_slice(&f32_to_f16(d));
        o[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d));
    }
}
