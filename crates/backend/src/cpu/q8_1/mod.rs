//! Q8_1, the activation format of Q4_1 and Q5_1 weights: its quantizers (no weight kernel;
//! ggml has no Q8_1 weights either).

#[cfg(target_arch = "x86_64")]
mod avx2;

use neagari_quant::q8_1;

/// Portable `QuantizeActFn` for Q8_1: the quant crate's `quantize_row_q8_1_ref`.
///
/// # Panics
/// If `x.len()` is not a multiple of 32 or `out` is not `x.len() / 32 * 36` bytes.
pub(crate) fn quantize_act_scalar(x: &[f32], out: &mut [u8]) {
    q8_1::quantize_row(x, bytemuck::cast_slice_mut(out));
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::quantize_act as quantize_act_avx2;
