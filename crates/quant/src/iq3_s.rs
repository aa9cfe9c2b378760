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

use crate::iq_common::{self, grid_pair, nibble, signed8, ScaledGrid};
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

impl ScaledGrid<32> for BlockIQ3_S {
    fn d(&self) -> [u8; 2] {
        self.d
    }

    /// Group `ib`: eight 9-bit grid indices, four sign bytes and the scale.
    fn sub_block(&self, ib: usize) -> ([i32; 32], u32) {
        let qh = self.qh[ib] as usize;
        let mut v = [0i32; 32];
        for (l, v8) in v.chunks_exact_mut(8).enumerate() {
            let i1 = self.qs[8 * ib + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = self.qs[8 * ib + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
            let grid = grid_pair(IQ3S_GRID[i1], IQ3S_GRID[i2]);
            v8.copy_from_slice(&signed8(grid, self.signs[4 * ib + l]));
        }
        (v, nibble(&self.scales, ib))
    }
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ3_S], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ3_S row length");
    iq_common::dequantize(blocks, out, |d, s| d * (1 + 2 * s) as f32);
}

/// Reference dot with a Q8_K row: `Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ3_S], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ3_S dot length");
    iq_common::dot(w, a)
}
