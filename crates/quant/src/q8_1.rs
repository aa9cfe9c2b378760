//! Q8_1: the activation format that Q4_1 and Q5_1 weights are dotted with. Like Q8_0, plus
//! `s = d · Σ qs` so the weight's offset `m` can be applied once per block.
//!
//! Layout (ggml-common.h `block_q8_1`, 36 bytes): `d: f16`, `s: f16`, `qs: [i8; 32]`.
//! (gguf-py's size table says 40 bytes; the C struct, which is what matters here, is 36.)
//! The `gguf` package has no Q8_1 quantizer; tested against ggml's `quantize_row_q8_1_ref`
//! (libggml-base from llama-cpp-python, scripts/quant_reference.py).

use crate::float::{f16_to_f32, f32_to_f16};
use bytemuck::{Pod, Zeroable};

/// Values per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// `d · Σ qs`, f16 little-endian (d taken before rounding to f16).
    pub s: [u8; 2],
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 1);

/// `out[32 · blocks.len()]` ← `qs[j] · d` (`s` is redundant for the values).
pub fn dequantize(blocks: &[BlockQ8_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q8_1 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, &q) in o.iter_mut().zip(&b.qs) {
            *y = q as f32 * d;
        }
    }
}

/// ggml's `quantize_row_q8_1_ref`: quants as Q8_0, then `s = f16(Σq · d)` with the f32 `d`.
/// `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), out.len() * QK, "Q8_1 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        b.s = f32_to_f16(sum as f32 * d);
    }
}
