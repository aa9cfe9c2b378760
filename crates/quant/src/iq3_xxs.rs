//! IQ3_XXS (ggml type 18): 256-weight blocks; each 4 weights are one byte indexing a
//! 256-entry grid of 4 magnitudes, signs by 7-bit index per 8 weights, a 4-bit scale per
//! 32. 3.0625 bits per weight.
//!
//! Layout (ggml-common.h `block_iq3_xxs`, 98 bytes): `d: f16`, `qs: [u8; 96]`: bytes
//! 0..64 grid indices (8 per group), bytes 64 + 4ib.. the u32 of group ib (sign indices
//! `>> 7l`, scale `>> 28`); `x = d·(0.5 + s)·0.5 · grid[j] · sign`. Dotted with Q8_K
//! activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq3_xxs_q8_K_generic`) through tests/fixtures.

use crate::iq_common::{self, grid_pair, ksigns, signed8, ScaledGrid};
use crate::iq_grids::IQ3XXS_GRID;
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

impl ScaledGrid<32> for BlockIQ3_XXS {
    fn d(&self) -> [u8; 2] {
        self.d
    }

    /// Group `ib`: eight grid entries, four sign indices and the scale.
    fn sub_block(&self, ib: usize) -> ([i32; 32], u32) {
        let s = &self.qs[64 + 4 * ib..68 + 4 * ib];
        let aux = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let q = &self.qs[8 * ib..8 * ib + 8];
        let mut v = [0i32; 32];
        for (l, v8) in v.chunks_exact_mut(8).enumerate() {
            let grid = grid_pair(
                IQ3XXS_GRID[q[2 * l] as usize],
                IQ3XXS_GRID[q[2 * l + 1] as usize],
            );
            v8.copy_from_slice(&signed8(grid, ksigns(aux, l)));
        }
        (v, aux >> 28)
    }
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ3_XXS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ3_XXS row length");
    iq_common::dequantize(blocks, out, |d, s| d * (0.5 + s as f32) * 0.5);
}

/// Reference dot with a Q8_K row: `0.25 · Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ3_XXS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ3_XXS dot length");
    0.25 * iq_common::dot(w, a)
}
