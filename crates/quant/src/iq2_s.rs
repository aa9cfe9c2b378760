//! IQ2_S (ggml type 22): 256-weight blocks; each 8 weights are a 10-bit index into a
//! 1024-entry magnitude grid with an explicit sign byte; 4-bit scales per 16 weights.
//! 2.5625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq2_s`, 82 bytes): `d: f16`, `qs: [u8; 64]` (32 low index
//! bytes, then 32 sign bytes), `qh: [u8; 8]` (2 high index bits per entry: entry l of group
//! ib at bits 2l of `qh[ib]`), `scales: [u8; 8]`; `x = d·(0.5 + s)·0.25 · grid[j] · sign`.
//! Dotted with Q8_K activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq2_s_q8_K_generic`) through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq_grids::IQ2S_GRID;
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2_S {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; 64],
    pub qh: [u8; 8],
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIQ2_S>() == 82);

/// Signed grid values of the 8 weights of entry `e` (0..32).
#[inline]
fn eight(b: &BlockIQ2_S, e: usize) -> [i32; 8] {
    let (ib, l) = (e / 4, e % 4);
    let idx = b.qs[e] as usize | (((b.qh[ib] as usize) << (8 - 2 * l)) & 0x300);
    let grid = IQ2S_GRID[idx].to_le_bytes();
    let signs = b.qs[32 + e];
    std::array::from_fn(|j| {
        let g = grid[j] as i32;
        if signs & (1 << j) != 0 {
            -g
        } else {
            g
        }
    })
}

#[inline]
fn scale(b: &BlockIQ2_S, ib: usize, h: usize) -> u32 {
    ((b.scales[ib] >> (4 * h)) & 15) as u32
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ2_S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_S row length");
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
pub fn dot(w: &[BlockIQ2_S], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_S dot length");
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
