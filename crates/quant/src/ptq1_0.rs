//! PTQ1_0 (PrismML type 143, Ternary Bonsai 2 `*-PTQ1_0.gguf`): the TQ1_0 trit codec on
//! 128-weight blocks; `x = (t − 1) · d`. 1.75 bits per weight.
//!
//! Layout (28 bytes): `qs: [u8; 24]`, `qh: [u8; 2]`, `d: f16` (last). Stages of 16 then 8
//! bytes (weights 0..80 and 80..120, digit outer, byte inner), then `qh` (weights
//! 120..128). Dotted with Q8_0 activations (four per block; an assumption: PrismML's CPU
//! dot is not available here, and the result only depends on the integer sums and scales).
//! No reference library here knows this type: the tests check the staged walk against
//! ggml's TQ1_0 (same codec) in tests/fixtures.

use crate::float::f16_to_f32;
use crate::q8_0::BlockQ8_0;
use crate::tq1_0::{quantize_staged, unpack_staged};
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockPTQ1_0 {
    pub qs: [u8; 24],
    pub qh: [u8; 2],
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockPTQ1_0>() == 28);
const _: () = assert!(std::mem::align_of::<BlockPTQ1_0>() == 1);

/// The block's 128 trits (0..=2) in weight order.
#[inline]
pub fn unpack(b: &BlockPTQ1_0) -> [u8; QK] {
    let mut q = [0u8; QK];
    unpack_staged(&b.qs, &b.qh, &mut q);
    q
}

/// `out[128 · blocks.len()]` ← `(t − 1) · d`.
pub fn dequantize(blocks: &[BlockPTQ1_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "PTQ1_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, q) in o.iter_mut().zip(unpack(b)) {
            *y = (q as i32 - 1) as f32 * d;
        }
    }
}

/// TQ1_0's reference quantizer on 128-weight blocks (`d = max|x|`, ternary codes; the
/// reference ignores the importance matrix, as PrismML's does).
pub fn quantize_row(x: &[f32], out: &mut [BlockPTQ1_0]) {
    assert_eq!(x.len(), out.len() * QK, "PTQ1_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        quantize_staged(xs, &mut b.qs, &mut b.qh, &mut b.d);
    }
}

/// Reference dot of a PTQ1_0 row with a Q8_0 row of the same length: per block
/// `d_w · Σ_k d_a,k · isum_k` (k < 4) in f32, the order of upstream's Q1_0/Q2_0 dots.
pub fn dot(w: &[BlockPTQ1_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len() * 4, a.len(), "PTQ1_0 dot length");
    let mut sumf = 0f32;
    for (b, ab) in w.iter().zip(a.chunks_exact(4)) {
        let t = unpack(b);
        let mut sumi = 0f32;
        for (k, y) in ab.iter().enumerate() {
            let isum: i32 = t[32 * k..32 * k + 32]
                .iter()
                .zip(&y.qs)
                .map(|(&q, &a)| (q as i32 - 1) * a as i32)
                .sum();
            sumi += f16_to_f32(y.d) * isum as f32;
        }
        sumf += f16_to_f32(b.d) * sumi;
    }
    sumf
}
