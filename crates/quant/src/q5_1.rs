//! Q5_1: 32 weights per block, f16 scale and f16 minimum, 5-bit unsigned quants;
//! `x = q · d + m`.
//!
//! Layout (ggml-common.h `block_q5_1`, 24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`,
//! `qs: [u8; 16]`, bits ordered as Q5_0. Dotted with Q8_1 activations. Tested against the
//! `gguf` Python package (dequantize, quantize) and ggml's `ggml_vec_dot_q5_1_q8_1`
//! (tests/fixtures).

use crate::float::f32_to_f16;
use crate::legacy::{self, fives, min_max, pack_fives};
use crate::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Fifth bits, one per weight: a little-endian u32, bit `j` for weight `j`.
    pub qh: [u8; 4],
    /// Low 4 bits: low nibble = weights 0..16, high nibble = weights 16..32.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 1);

/// The block's 32 quants in weight order: 0..=31.
#[inline]
pub fn unpack(b: &BlockQ5_1) -> [u8; QK] {
    fives(&b.qs, b.qh)
}

/// `out[32 · blocks.len()]` ← the blocks' values (`q · d + m`, two roundings, as gguf-py).
pub fn dequantize(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q5_1 row length");
    legacy::dequantize_offset(blocks, out, |b| (b.d, b.m, unpack(b)));
}

/// ggml's `quantize_row_q5_1_ref`: `d = (max − min) / 31`, `m = min`,
/// `q = trunc((x − min)/d + 0.5)` (clamped to 31 as gguf-py does; ggml's values never
/// exceed it). `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), out.len() * QK, "Q5_1 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (min, max) = min_max(xs);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(31);
        (b.qs, b.qh) = pack_fives(&std::array::from_fn(|j| q(xs[j])));
    }
}

/// Reference dot of a Q5_1 weight row with a Q8_1 activation row (same block count):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j + m_w · s_a`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q5_1 dot length");
    legacy::dot_q8_1(w, a, |x| (x.d, x.m, unpack(x)))
}
