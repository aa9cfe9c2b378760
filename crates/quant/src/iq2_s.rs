//! IQ2_S (ggml type 22): 256-weight blocks; each 8 weights are a 10-bit index into a
//! 1024-entry magnitude grid with an explicit sign byte; 4-bit scales per 16 weights.
//! 2.5625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq2_s`, 82 bytes): `d: f16`, `qs: [u8; 64]` (32 low index
//! bytes, then 32 sign bytes), `qh: [u8; 8]` (2 high index bits per entry: entry l of group
//! ib at bits 2l of `qh[ib]`), `scales: [u8; 8]`; `x = d·(0.5 + s)·0.25 · grid[j] · sign`.
//! Dotted with Q8_K activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq2_s_q8_K_generic`) through tests/fixtures.

use crate::iq_common::{self, concat8, nibble, signed8, ScaledGrid};
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
    signed8(IQ2S_GRID[idx].to_le_bytes(), b.qs[32 + e])
}

impl ScaledGrid<16> for BlockIQ2_S {
    fn d(&self) -> [u8; 2] {
        self.d
    }

    /// Weights `16k .. 16k + 16`: two entries and their 4-bit scale (nibble `k % 2` of
    /// group `k / 2`'s scale byte).
    fn sub_block(&self, k: usize) -> ([i32; 16], u32) {
        let v = concat8(eight(self, 2 * k), eight(self, 2 * k + 1));
        (v, nibble(&self.scales, k))
    }
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ2_S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_S row length");
    iq_common::dequantize(blocks, out, |d, s| d * (0.5 + s as f32) * 0.25);
}

/// Reference dot with a Q8_K row: `0.125 · Σ_b d_w·d_a · Σ_16 (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ2_S], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_S dot length");
    0.125 * iq_common::dot(w, a)
}
