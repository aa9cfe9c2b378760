//! IQ4_XS (ggml type 23): 256-weight super-blocks of eight 32-weight groups, each with a
//! 6-bit scale, and IQ4_NL's 4-bit table indices; `x = d · (ls − 32) · KVALUES[idx]`.
//! 4.25 bits per weight.
//!
//! Layout (ggml-common.h `block_iq4_xs`, 136 bytes): `d: f16`, `scales_h: u16` (2 high bits
//! of group ib at bits 2ib), `scales_l: [u8; 4]` (low 4 bits, group ib in nibble ib % 2 of
//! byte ib / 2), `qs: [u8; 128]` (group ib in bytes 16ib..16ib+16: low nibbles = weights
//! 0..16, high = 16..32). Dotted with Q8_K activations. Tested against gguf-py (dequantize)
//! and ggml (`ggml_vec_dot_iq4_xs_q8_K_generic`) through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq4_nl::unpack16;
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4_XS {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// High 2 bits of the eight group scales, u16 little-endian.
    pub scales_h: [u8; 2],
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4_XS>() == 136);
const _: () = assert!(std::mem::align_of::<BlockIQ4_XS>() == 1);

impl Default for BlockIQ4_XS {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// 6-bit scale of group `ib`, minus 32.
#[inline]
pub fn group_scale(b: &BlockIQ4_XS, ib: usize) -> i32 {
    let h = u16::from_le_bytes(b.scales_h);
    let ls = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) as i32
        | ((((h >> (2 * ib)) & 3) as i32) << 4);
    ls - 32
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ4_XS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ4_XS row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            let dl = d * group_scale(b, ib) as f32;
            for (y, v) in og.iter_mut().zip(unpack16(&b.qs[16 * ib..16 * ib + 16])) {
                *y = dl * v as f32;
            }
        }
    }
}

/// Reference dot of an IQ4_XS row with a Q8_K row (same block count), per group
/// `(d_w · d_a · (ls − 32)) · Σ v·a` accumulated in f32 as ggml does.
pub fn dot(w: &[BlockIQ4_XS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ4_XS dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d4d8 = f16_to_f32(x.d) * y.d();
        for ib in 0..8 {
            let dl = d4d8 * group_scale(x, ib) as f32;
            let isum: i32 = unpack16(&x.qs[16 * ib..16 * ib + 16])
                .iter()
                .zip(&y.qs[32 * ib..32 * ib + 32])
                .map(|(&v, &q)| v as i32 * q as i32)
                .sum();
            sumf += dl * isum as f32;
        }
    }
    sumf
}
