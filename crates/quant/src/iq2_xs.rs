//! IQ2_XS (ggml type 17): 256-weight blocks; each 8 weights are a u16 holding a 9-bit index
//! into a 512-entry magnitude grid and a 7-bit sign index; 4-bit scales per 16 weights.
//! 2.3125 bits per weight.
//!
//! Layout (ggml-common.h `block_iq2_xs`, 74 bytes): `d: f16`, `qs: [u16; 32]`,
//! `scales: [u8; 8]` (group ib: low nibble for its first 16 weights, high for the rest);
//! `x = d·(0.5 + s)·0.25 · grid[j] · sign`. Dotted with Q8_K activations. Tested against
//! gguf-py (dequantize) and ggml (`ggml_vec_dot_iq2_xs_q8_K_generic`) through tests/fixtures.

use crate::iq_common::{self, concat8, nibble, signed8, ScaledGrid};
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
    signed8(
        IQ2XS_GRID[(q & 511) as usize].to_le_bytes(),
        KSIGNS_IQ2XS[(q >> 9) as usize],
    )
}

impl ScaledGrid<16> for BlockIQ2_XS {
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
pub fn dequantize(blocks: &[BlockIQ2_XS], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ2_XS row length");
    iq_common::dequantize(blocks, out, |d, s| d * (0.5 + s as f32) * 0.25);
}

/// Reference dot with a Q8_K row: `0.125 · Σ_b d_w·d_a · Σ_16 (2s+1)·Σ v·a`.
pub fn dot(w: &[BlockIQ2_XS], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ2_XS dot length");
    0.125 * iq_common::dot(w, a)
}
