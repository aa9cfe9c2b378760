//! Q8_0: 32 weights per block, one f16 scale, 32 signed bytes; `x[j] = qs[j] · d`.
//!
//! Layout (ggml-common.h `block_q8_0`, 34 bytes): `d: f16`, `qs: [i8; 32]`.
//! Q8_0 is both a weight format and the activation format that Q4_0, Q5_0 and Q8_0 weights
//! are dotted with. Tested against the `gguf` Python package (dequantize, quantize) and
//! ggml's `ggml_vec_dot_q8_0_q8_0` (tests/fixtures, scripts/quant_reference.py).

use crate::float::f32_to_f16;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 1);

/// `out[32 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q8_0 row length");
    crate::legacy::dequantize_scaled(blocks, out, |b| (b.d, b.qs));
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)` (half away from zero,
/// computed as `x · (1/d)`). `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q8_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}

/// Reference dot of a Q8_0 weight row with a Q8_0 activation row (same length):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j`, accumulated in f32 block by block as ggml does.
pub fn dot(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q8_0 dot length");
    crate::legacy::dot_q8_0(w, a, |x| (x.d, x.qs))
}
