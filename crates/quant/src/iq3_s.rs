//! IQ3_S (ggml type 21): 256-weight blocks; each 4 weights are a 9-bit index into a
//! 512-entry grid of 4 magnitudes, explicit sign bits, a 4-bit scale per 32 weights.
//! 3.4375 bits per weight.
//!
//! Layout (ggml-common.h `block_iq3_s`, 110 bytes): `d: f16`, `qs: [u8; 64]` (low index
//! bytes, 8 per group), `qh: [u8; 8]` (bit k of `qh[ib]` = high bit of index k of group
//! ib), `signs: [u8; 32]` (one byte per 8 weights), `scales: [u8; 4]` (group ib in nibble
//! ib % 2 of byte ib / 2); `x = d·(1 + 2s) · grid[j] · sign`. Dotted with Q8_K activations.
//! Tested against gguf-py (dequantize) and ggml (`ggml_vec_dot_iq3_s_q8_K_generic`)
//! through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq_grids::IQ3S_GRID;
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3_S {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub signs: [u8; 32],
    pub scales: [u8; 4],
}
const _: () = assert!(std::mem::size_of::<BlockIQ3_S>() == 110);

/// Signed grid values of group `ib` and its 4-bit scale.
#[inline]
fn group(b: &BlockIQ3_S, ib: usize) -> ([i32; 32], u32) {
    let mut v = [0i32; 32];
    let qh = b.qh[ib] as usize;
    for l in 0..4 {
        let i1 = b.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
        let i2 = b.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
        let (g1, g2) = (IQ3S_GRID[i1].to_le_bytes(), IQ3S_GRID[i2].to_le_bytes());
        let signs = b.signs[4 * ib + l];
        for j in 0..8 {
            let g = if j < 4 { g1[j] } else { g2[j - 4] } as i32;
            v[8 * l + j] = if signs & (1 << j) != 0 { -g } else { g };
        }
    }
    (v, ((b.scales[ib / 2] >> (4 * (ib % 2))) & 15) as u32)
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ3_S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ3_S row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            let (v, s) = group(b, ib);
            let db = d * (1 + 2 * s) as f32;
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

/// Reference dot with a Q8_K row: `Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ3_S], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ3_S dot length");
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
    sumf
}
