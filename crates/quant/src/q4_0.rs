//! Q4_0: 32 weights per block, one f16 scale, 4-bit quants stored as offset-by-8 nibbles;
//! `x = (q − 8) · d`.
//!
//! Layout (ggml-common.h `block_q4_0`, 18 bytes): `d: f16`, `qs: [u8; 16]`. Weight `j < 16`
//! is the low nibble of `qs[j]`, weight `j ≥ 16` the high nibble of `qs[j − 16]`.
//! Dotted with Q8_0 activations. Tested against the `gguf` Python package (dequantize,
//! quantize) and ggml's `ggml_vec_dot_q4_0_q8_0` (tests/fixtures).

use crate::float::f32_to_f16;
use crate::legacy::{self, first_absmax, nibbles, pack_nibbles};
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 1);

/// The block's 32 quants, in weight order, after removing the offset: −8..=7.
#[inline]
pub fn unpack(b: &BlockQ4_0) -> [i8; QK] {
    nibbles(&b.qs).map(|q| q as i8 - 8)
}

/// `out[32 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockQ4_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q4_0 row length");
    legacy::dequantize_scaled(blocks, out, |b| (b.d, unpack(b)));
}

/// ggml's `quantize_row_q4_0_ref`: `d = max / −8` where `max` is the first value of largest
/// magnitude (so it maps to quant 0), `q = min(15, trunc(x/d + 8.5))`.
/// `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q4_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let d = first_absmax(xs) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        // `as i8` truncates toward zero like the C cast; the argument is ≥ 0.5 here.
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        b.qs = pack_nibbles(&std::array::from_fn(|j| q(xs[j])));
    }
}

/// Reference dot of a Q4_0 weight row with a Q8_0 activation row (same block count):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q4_0 dot length");
    legacy::dot_q8_0(w, a, |x| (x.d, unpack(x)))
}
