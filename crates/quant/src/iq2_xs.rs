//! IQ2_XS (ggml type 17): 256-weight blocks; each 8 weights are a u16 holding a 9-bit index
//! into a 512-entry magnitude grid and a 7-bit sign index; 4-bit scales per 16 weights.
//! 2.3125 bits per weight.
//!
//! Layout (ggml-common.h `block_iq2_xs`, 74 bytes): `d: f16`, `qs: [u16; 32]`,
//! `scales: [u8; 8]` (group ib: low nibble for its first 16 weights, high for the rest);
//! `x = d·(0.5 + s)·0.25 · grid[j] · sign`. Dotted with Q8_K activations. Tested against
//! gguf-py (dequantize) and ggml (`ggml_vec_dot_iq2_xs_q8_K_generic`) through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq_grids::{IQ2XS_GRID, KSIGNS_IQ2XS};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2_XS {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// 32 little-endian u16: grid index (low 9 bits) and sign index (high 7).
    pub qs: [u8; 64],
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2_XS>() == 74);

/// Signed grid values of the 8 weights of entry `e` (0..32).
#[inline]
fn eight(b: &BlockIQ2_XS, e: usize) -> [i32; 8] {
    let q = u16::from_le_bytes([b.qs[2 * e], b.qs[2 * e + 1]]);
    let grid = IQ2XS_GRID[(q & 511) as usize].to_le_bytes();
    let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
    std::array::from_fn(|j| {
        let g = grid[j] as i32;
        if signs & (1 << j) != 0 {
            -g
        } else {
            g
        }
    })
}

/// 4-bit scale of the 16 weights `16h .. 16h + 16` of group `ib`.
#[inline]
fn scale(b: &BlockIQ2_XS, ib: usize, h: usize) -> u32 {
    ((b.scales[ib] >> (4 * h)) & 15) as u32
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ2_XS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_XS row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (e, o8) in o.chunks_exact_mut(8).enumerate() {
            let db = d * (0.5 + scale(b, e / 4, (e % 4) / 2) as f32) * 0.25;
            for (y, g) in o8.iter_mut().zip(eight(b, e)) {
                *y = if g < 0 {
                    -(db * (-g) as f32)
                } else {
                    db * g as f32
                };
            }
        }
    }
}

/// Reference dot with a Q8_K row: `0.125 · Σ_b d_w·d_a · Σ_16 (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ2_XS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_XS dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d();
        let mut bsum = 0i32;
        for ib in 0..8 {
            for h in 0..2 {
                let mut sumi = 0i32;
                for e in 4 * ib + 2 * h..4 * ib + 2 * h + 2 {
                    for (g, &q) in eight(x, e).iter().zip(&y.qs[8 * e..8 * e + 8]) {
                        sumi += g * q as i32;
                    }
                }
                bsum += sumi * (2 * scale(x, ib, h) as i32 + 1);
            }
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}
