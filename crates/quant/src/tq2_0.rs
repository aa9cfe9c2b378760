//! TQ2_0 (ggml type 35): ternary weights, 256 per block, 2-bit codes and one f16 scale;
//! `x = (code − 1) · d`. 2.0625 bits per weight.
//!
//! Layout (ggml-common.h `block_tq2_0`, 66 bytes): `qs: [u8; 64]`, then `d: f16` (last).
//! Weight `128c + 32l + m` (c < 2, l < 4, m < 32) is `(qs[32c + m] >> 2l) & 3`. Dotted with
//! Q8_K activations. Tested against gguf-py (dequantize, quantize) and ggml
//! (`quantize_row_tq2_0_ref`, `ggml_vec_dot_tq2_0_q8_K_generic`) through tests/fixtures made
//! by scripts/quant_reference_lowbit.py.

use crate::float::{f16_to_f32, f32_to_f16};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockTQ2_0>() == 66);
const _: () = assert!(std::mem::align_of::<BlockTQ2_0>() == 1);

impl Default for BlockTQ2_0 {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The block's 256 codes (0..=2; 3 is never written but decodes to +2) in weight order.
#[inline]
pub fn unpack(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                q[128 * c + 32 * l + m] = (b.qs[32 * c + m] >> (2 * l)) & 3;
            }
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← `(code − 1) · d`.
pub fn dequantize(blocks: &[BlockTQ2_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "TQ2_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (y, q) in o.iter_mut().zip(unpack(b)) {
            *y = (q as i32 - 1) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_tq2_0_ref`: `d = max|x|`, `code = round(x / d) + 1` (half away from
/// zero, `x · (1/d)`). `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockTQ2_0]) {
    assert_eq!(x.len(), out.len() * QK_K, "TQ2_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        b.d = f32_to_f16(amax);
        for c in 0..2 {
            for m in 0..32 {
                let mut q = 0u8;
                for l in 0..4 {
                    // Clamped so subnormal scales and non-finite inputs cannot overflow.
                    let xi = (xs[128 * c + 32 * l + m] * id).round().clamp(-1.0, 1.0) as i32 + 1;
                    q += ((xi & 3) as u8) << (2 * l);
                }
                b.qs[32 * c + m] = q;
            }
        }
    }
}

/// `Σ (code − 1) · a` of one block with one Q8_K block.
#[inline]
pub fn block_isum(b: &BlockTQ2_0, a: &BlockQ8_K) -> i32 {
    unpack(b)
        .iter()
        .zip(&a.qs)
        .map(|(&q, &y)| (q as i32 - 1) * y as i32)
        .sum()
}

/// Reference dot of a TQ2_0 row with a Q8_K row (same block count): `Σ isum · (d_a · d_w)`.
pub fn dot(w: &[BlockTQ2_0], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "TQ2_0 dot length");
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += block_isum(x, y) as f32 * (y.d() * f16_to_f32(x.d));
    }
    sum
}
