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

use crate::iq_common::{self, ksigns, signed8, ScaledGrid};
use crate::iq_grids::IQ2XXS_GRID;
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

impl ScaledGrid<32> for BlockIQ2_XXS {
    fn d(&self) -> [u8; 2] {
        self.d
    }

    /// Group `ib`: four grid entries, their sign indices and the scale.
    fn sub_block(&self, ib: usize) -> ([i32; 32], u32) {
        let q = &self.qs[8 * ib..8 * ib + 8];
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let mut v = [0i32; 32];
        for (l, v8) in v.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[q[l] as usize].to_le_bytes();
            v8.copy_from_slice(&signed8(grid, ksigns(aux, l)));
        }
        (v, aux >> 28)
    }
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ2_XXS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_XXS row length");
    iq_common::dequantize(blocks, out, |d, s| d * (0.5 + s as f32) * 0.25);
}

/// Reference dot with a Q8_K row: `0.125 · Σ_b d_w·d_a · Σ_g (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ2_XXS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_XXS dot length");
    0.125 * iq_common::dot(w, a)
}
