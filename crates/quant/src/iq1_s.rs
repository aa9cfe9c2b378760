//! IQ1_S (ggml type 19): 256-weight blocks; each 8 weights are an 11-bit index into a
//! 2048-entry grid of values in {−1, 0, 1}, shifted by ±1/8 per 32 weights, with a 3-bit
//! scale per 32. 1.5625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq1_s`, 50 bytes): `d: f16`, `qs: [u8; 32]` (low index
//! bytes), `qh: [u16; 8]` (group ib: high index bits `(H >> 3l) & 7`, scale `(H >> 12) & 7`,
//! delta sign bit 15); `x = d·(2s + 1) · (grid[j] + delta)`. Dotted with Q8_K activations.
//! Tested against gguf-py (dequantize) and ggml (`ggml_vec_dot_iq1_s_q8_K_generic`)
//! through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq_grids::IQ1S_GRID;
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

/// ggml's `IQ1S_DELTA` (also `IQ1M_DELTA`).
pub const DELTA: f32 = 0.125;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1_S {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; 32],
    /// Eight little-endian u16.
    pub qh: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockIQ1_S>() == 50);

/// The 8 grid values (−1, 0, 1) of entry `idx`.
#[inline]
pub(crate) fn grid8(idx: usize) -> [i8; 8] {
    IQ1S_GRID[idx].to_le_bytes().map(|v| v as i8)
}

#[inline]
fn qh(b: &BlockIQ1_S, ib: usize) -> u32 {
    u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]) as u32
}

#[inline]
fn index(b: &BlockIQ1_S, ib: usize, l: usize) -> usize {
    b.qs[4 * ib + l] as usize | ((((qh(b, ib) >> (3 * l)) & 7) as usize) << 8)
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ1_S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ1_S row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            let h = qh(b, ib);
            let dl = d * (2 * ((h >> 12) & 7) + 1) as f32;
            let delta = if h & 0x8000 != 0 { -DELTA } else { DELTA };
            for (l, o8) in og.chunks_exact_mut(8).enumerate() {
                for (y, g) in o8.iter_mut().zip(grid8(index(b, ib, l))) {
                    *y = dl * (g as f32 + delta);
                }
            }
        }
    }
}

/// Reference dot with a Q8_K row, as ggml: `Σ_b d_w·d_a·(Σ ls·Σ g·a + δ·Σ ls·±Σa)`.
pub fn dot(w: &[BlockIQ1_S], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ1_S dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for ib in 0..8 {
            let h = qh(x, ib);
            let ls = 2 * ((h >> 12) & 7) as i32 + 1;
            let delta = if h & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                for (g, &q) in grid8(index(x, ib, l)).iter().zip(&y.qs[32 * ib + 8 * l..]) {
                    lsum += *g as i32 * q as i32;
                }
            }
            sumi += ls * lsum;
            sumi1 += ls * delta * (y.bsum(2 * ib) + y.bsum(2 * ib + 1));
        }
        sumf += f16_to_f32(x.d) * y.d() * (sumi as f32 + DELTA * sumi1 as f32);
    }
    sumf
}
