//! Q8_1, the activation format of Q4_1 and Q5_1 weights: its quantizers (no weight kernel;
//! ggml has no Q8_1 weights either).

#[cfg(target_arch = "x86_64")]
mod avx2;

use neagari_quant::float::f32_to_f16;
use neagari_quant::q8_1;

/// Portable `QuantizeActFn` for Q8_1: the quant crate's `quantize_row_q8_1_ref`.
///
/// # Panics
/// If `x.len()` is not a multiple of 32 or `out` is not `x.len() / 32 * 36` bytes.
pub(crate) fn quantize_act_scalar(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [q8_1::BlockQ8_1] = bytemuck::cast_slice_mut(out);
    assert_eq!(x.len(), blocks.len() * 32, "Q8_1 activation row");
    for (b, xs) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let (d, sum) = quantize_block_runtime(xs, &mut b.qs);
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(sum as f32 * d);
    }
}

/// One block of 32 activations quantized as llama.cpp does at run time on x86
/// (quantize_row_q8_0/q8_1 in ggml-cpu/arch/x86/quants.c): multiplier 127 / amax, round to
/// nearest even. (The quant crate's `quantize_row` is ggml's `_ref`: 1 / d and roundf.)
/// Returns d and the sum of the quants.
pub(crate) fn quantize_block_runtime(xs: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(xs) {
        let i = (v * id).round_ties_even() as i8;
        *q = i;
        sum += i as i32;
    }
    (d, sum)
}

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::quantize_act as quantize_act_avx2;
