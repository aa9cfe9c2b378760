//! PQ2_0 (PrismML type 142, `*-PQ2_0.gguf`; also the layout of the legacy group-128 data
//! older ternary Bonsai files store under id 42): the Q2_0 codec at group 128.
//! `x = (code − 1) · d`, codes meaning −1, 0, +1, +2. 2.125 bits per weight.
//!
//! Layout (PrismML ggml-common.h, 34 bytes): `d: f16`, `qs: [u8; 32]`; weight `j` is
//! `(qs[j / 4] >> 2(j % 4)) & 3`. Dotted with Q8_0 activations, four per block, in the
//! order of upstream's Q2_0 dot. No reference library here knows this type: the tests
//! check it against ggml's Q2_0 on the same codes (a PQ2_0 block is two Q2_0 blocks with
//! one shared scale), see tests/fixtures and scripts/quant_reference_lowbit.py.

use crate::float::f16_to_f32;
use crate::q2_0::{codes_isum, dequantize_codes, quantize_codes};
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockPQ2_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// 2-bit codes, four per byte, LSB first.
    pub qs: [u8; QK / 4],
}
const _: () = assert!(std::mem::size_of::<BlockPQ2_0>() == 34);
const _: () = assert!(std::mem::align_of::<BlockPQ2_0>() == 1);

impl Default for BlockPQ2_0 {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// `out[128 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockPQ2_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "PQ2_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        dequantize_codes(b.d, &b.qs, o);
    }
}

/// Upstream Q2_0's reference quantizer at group 128 (`d = max|x|`, ternary codes). PrismML's
/// own quantizer is not available here; this one makes valid blocks of the same codec.
pub fn quantize_row(x: &[f32], out: &mut [BlockPQ2_0]) {
    assert_eq!(x.len(), out.len() * QK, "PQ2_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        quantize_codes(xs, &mut b.d, &mut b.qs);
    }
}

/// Reference dot of a PQ2_0 row with a Q8_0 row of the same length: per block
/// `d_w · Σ_k d_a,k · isum_k` (k < 4) in f32.
pub fn dot(w: &[BlockPQ2_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len() * 4, a.len(), "PQ2_0 dot length");
    let mut sumf = 0f32;
    for (b, ab) in w.iter().zip(a.chunks_exact(4)) {
        let mut sumi = 0f32;
        for (k, y) in ab.iter().enumerate() {
            sumi += f16_to_f32(y.d) * codes_isum(&b.qs, k, &y.qs) as f32;
        }
        sumf += f16_to_f32(b.d) * sumi;
    }
    sumf
}
