//! Q8_K: the activation-side format that every K-quant weight row is dotted with.
//!
//! Layout (ggml-common.h `block_q8_K`, 292 bytes, byte-identical here): `d: f32`,
//! `qs: [i8; 256]`, `bsums: [i16; 16]` where `bsums[j] = Σ qs[16j .. 16j+16]`. The sums let
//! the K-quant dots apply per-group mins and offsets with one multiply per 16 values.
//! Value `j` is `d · qs[j]`. Tested against ggml's `quantize_row_q8_K_ref` (tests/fixtures).

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::k_common::{nearest_int, QK_K};
use crate::legacy::first_absmax;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_K {
    /// Scale, f32 little-endian.
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    /// Sums of 16 quants, i16 little-endian.
    pub bsums: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ8_K>() == 1);

impl Default for BlockQ8_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl BlockQ8_K {
    #[inline]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    /// Sum of quants `16j .. 16j + 16`.
    #[inline]
    pub fn bsum(&self, j: usize) -> i32 {
        crate::k_common::le_i16(&self.bsums, j) as i32
    }
}

/// `out[256 · blocks.len()]` ← `d · qs`.
pub fn dequantize(blocks: &[BlockQ8_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q8_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (y, &q) in o.iter_mut().zip(&b.qs) {
            *y = d * q as f32;
        }
    }
}

/// ggml's `quantize_row_q8_K_ref`: per block, `max` is the first value of largest magnitude,
/// `q = min(127, round(−127·x/max))` (so `max` maps to −127), `d = max/−127` stored as the
/// f32 reciprocal of the inverse scale. An all-zero block gets `d = 0`, zero quants and
/// zero sums. `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ8_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q8_K row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let max = first_absmax(xs);
        if max == 0.0 {
            *b = BlockQ8_K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            b.bsums[2 * j..2 * j + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

/// Quantizes a row into raw bytes (`out.len() = 292 · x.len() / 256`), the activation
/// layout the CPU kernels take.
pub fn quantize_row_bytes(x: &[f32], out: &mut [u8]) {
    quantize_row(x, bytemuck::cast_slice_mut(out));
}
