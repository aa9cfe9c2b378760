//! Q4_1: 32 weights per block, f16 scale and f16 minimum, 4-bit unsigned quants;
//! `x = q · d + m`.
//!
//! Layout (ggml-common.h `block_q4_1`, 20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]`, nibbles
//! ordered as Q4_0. Dotted with Q8_1 activations (whose `s` carries the `m` term).
//! Tested against the `gguf` Python package (dequantize, quantize) and ggml's
//! `ggml_vec_dot_q4_1_q8_1` (tests/fixtures).

use crate::float::f32_to_f16;
use crate::legacy::{self, min_max, nibbles, pack_nibbles};
use crate::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Nibbles: low = weights 0..16, high = weights 16..32.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 1);

/// The block's 32 quants in weight order: 0..=15.
#[inline]
pub fn unpack(b: &BlockQ4_1) -> [u8; QK] {
    nibbles(&b.qs)
}

/// `out[32 · blocks.len()]` ← the blocks' values (`q · d + m`, two roundings, as gguf-py).
pub fn dequantize(blocks: &[BlockQ4_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q4_1 row length");
    legacy::dequantize_offset(blocks, out, |b| (b.d, b.m, unpack(b)));
}

/// ggml's `quantize_row_q4_1_ref`: `d = (max − min) / 15`, `m = min`,
/// `q = min(15, trunc((x − min)/d + 0.5))`. `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ4_1]) {
    assert_eq!(x.len(), out.len() * QK, "Q4_1 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        b.qs = pack_nibbles(&std::array::from_fn(|j| q(xs[j])));
    }
}

/// Reference dot of a Q4_1 weight row with a Q8_1 activation row (same block count):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j + m_w · s_a`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q4_1 dot length");
    legacy::dot_q8_1(w, a, |x| (x.d, x.m, unpack(x)))
}
