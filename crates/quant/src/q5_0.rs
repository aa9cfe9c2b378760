//! Q5_0: 32 weights per block, one f16 scale, 5-bit quants offset by 16; `x = (q − 16) · d`.
//!
//! Layout (ggml-common.h `block_q5_0`, 22 bytes): `d: f16`, `qh: [u8; 4]`, `qs: [u8; 16]`.
//! The low 4 bits are nibbles ordered as Q4_0; bit 4 of weight `j` is bit `j` of the
//! little-endian u32 `qh`. Dotted with Q8_0 activations. Tested against the `gguf` Python
//! package (dequantize, quantize) and ggml's `ggml_vec_dot_q5_0_q8_0` (tests/fixtures).

use crate::float::f32_to_f16;
use crate::legacy::{self, first_absmax, fives, pack_fives};
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Fifth bits, one per weight: a little-endian u32, bit `j` for weight `j`.
    pub qh: [u8; 4],
    /// Low 4 bits: low nibble = weights 0..16, high nibble = weights 16..32.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::align_of::<BlockQ5_0>() == 1);

/// The block's 32 quants in weight order after removing the offset: −16..=15.
#[inline]
pub fn unpack(b: &BlockQ5_0) -> [i8; QK] {
    fives(&b.qs, b.qh).map(|q| q as i8 - 16)
}

/// `out[32 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockQ5_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q5_0 row length");
    legacy::dequantize_scaled(blocks, out, |b| (b.d, unpack(b)));
}

/// ggml's `quantize_row_q5_0_ref`: `d = max / −16` (`max` the first value of largest
/// magnitude), `q = min(31, trunc(x/d + 16.5))`. `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ5_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q5_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let d = first_absmax(xs) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
        (b.qs, b.qh) = pack_fives(&std::array::from_fn(|j| q(xs[j])));
    }
}

/// Reference dot of a Q5_0 weight row with a Q8_0 activation row (same block count):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q5_0 dot length");
    legacy::dot_q8_0(w, a, |x| (x.d, unpack(x)))
}
