//! IQ2_XXS (ggml type 16): 256-weight blocks of eight 32-weight groups; each 8 weights are
//! one entry of a 256-entry grid of magnitudes with 7-bit sign patterns, each group has a
//! 4-bit scale. 2.0625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq2_xxs`, 66 bytes): `d: f16`, `qs: [u16; 32]`. Group ib
//! reads 8 bytes at `2 + 8ib`: bytes 0..4 are grid indices, the u32 of bytes 4..8 holds
//! four 7-bit sign indices (`>> 7l`) and the scale `>> 28`;
//! `x = d·(0.5 + s)·0.25 · grid[j] · sign`. Dotted with Q8_K activations. Tested against
//! gguf-py (dequantize) and ggml (`ggml_vec_dot_iq2_xxs_q8_K_generic`) through
//! tests/fixtures made by scripts/quant_reference_lowbit.py.

use crate::float::f16_to_f32;
use crate::iq_grids::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2_XXS {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2_XXS>() == 66);

/// Signed grid values (magnitude · sign) of group `ib` and its 4-bit scale.
#[inline]
fn group(b: &BlockIQ2_XXS, ib: usize) -> ([i32; 32], u32) {
    let q = &b.qs[8 * ib..8 * ib + 8];
    let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
    let mut v = [0i32; 32];
    for l in 0..4 {
        let grid = IQ2XXS_GRID[q[l] as usize].to_le_bytes();
        let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
        for j in 0..8 {
            let g = grid[j] as i32;
            v[8 * l + j] = if signs & (1 << j) != 0 { -g } else { g };
        }
    }
    (v, aux >> 28)
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ2_XXS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_XXS row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            let (v, s) = group(b, ib);
            let db = d * (0.5 + s as f32) * 0.25;
            for (y, g) in og.iter_mut().zip(v) {
                // db · |g| then the sign, as ggml does (the sign flip is exact).
                *y = if g < 0 {
                    -(db * (-g) as f32)
                } else {
                    db * g as f32
                };
            }
        }
    }
}

/// Reference dot with a Q8_K row: `0.125 · Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ2_XXS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_XXS dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d();
        let mut bsum = 0i32;
        for ib in 0..8 {
            let (v, s) = group(x, ib);
            let sumi: i32 = v
                .iter()
                .zip(&y.qs[32 * ib..])
                .map(|(&g, &q)| g * q as i32)
                .sum();
            bsum += sumi * (2 * s as i32 + 1);
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
