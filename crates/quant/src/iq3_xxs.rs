//! IQ3_XXS (ggml type 18): 256-weight blocks; each 4 weights are one byte indexing a
//! 256-entry grid of 4 magnitudes, signs by 7-bit index per 8 weights, a 4-bit scale per
//! 32. 3.0625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq3_xxs`, 98 bytes): `d: f16`, `qs: [u8; 96]`: bytes
//! 0..64 grid indices (8 per group), bytes 64 + 4ib.. the u32 of group ib (sign indices
//! `>> 7l`, scale `>> 28`); `x = d·(0.5 + s)·0.5 · grid[j] · sign`. Dotted with Q8_K
//! activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq3_xxs_q8_K_generic`) through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq_grids::{IQ3XXS_GRID, KSIGNS_IQ2XS};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3_XXS {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; 96],
}
const _: () = assert!(std::mem::size_of::<BlockIQ3_XXS>() == 98);

/// Signed grid values of group `ib` and its 4-bit scale.
#[inline]
fn group(b: &BlockIQ3_XXS, ib: usize) -> ([i32; 32], u32) {
    let s = &b.qs[64 + 4 * ib..68 + 4 * ib];
    let aux = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let mut v = [0i32; 32];
    for l in 0..4 {
        let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
        let g1 = IQ3XXS_GRID[b.qs[8 * ib + 2 * l] as usize].to_le_bytes();
        let g2 = IQ3XXS_GRID[b.qs[8 * ib + 2 * l + 1] as usize].to_le_bytes();
        for j in 0..8 {
            let g = if j < 4 { g1[j] } else { g2[j - 4] } as i32;
            v[8 * l + j] = if signs & (1 << j) != 0 { -g } else { g };
        }
    }
    (v, aux >> 28)
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ3_XXS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ3_XXS row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            let (v, s) = group(b, ib);
            let db = d * (0.5 + s as f32) * 0.5;
            for (y, g) in og.iter_mut().zip(v) {
                *y = if g < 0 {
                    -(db * (-g) as f32)
                } else {
                    db * g as f32
                };
            }
        }
    }
}

/// Reference dot with a Q8_K row: `0.25 · Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ3_XXS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ3_XXS dot length");
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
    0.25 * sumf
}
