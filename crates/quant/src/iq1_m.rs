//! IQ1_M (ggml type 29): 256-weight blocks; each 8 weights are an 11-bit index into the
//! IQ1_S grid ({−1, 0, 1}) with their own ±1/8 shift; 3-bit scales per 16 weights and an
//! f16 super-scale spread over the top nibbles of the scales. 1.75 bits per weight.
//!
//! Layout (ggml-common.h `block_iq1_m`, 56 bytes): `qs: [u8; 32]` (low index bytes),
//! `qh: [u8; 16]` (per 8 weights a nibble: high index bits 0..3, delta sign bit 3),
//! `scales: [u8; 8]` (four u16: 3-bit scales at `6(ib%2) + 3h` of u16 ib/2, the f16 scale
//! from the top nibbles of all four); `x = d·(2s + 1) · (grid[j] + delta)`. Dotted with
//! Q8_K activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq1_m_q8_K_generic`) through tests/fixtures.

use crate::float::f16_to_f32;
use crate::iq1_s::{grid8, DELTA};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1_M {
    pub qs: [u8; 32],
    pub qh: [u8; 16],
    /// Four little-endian u16.
    pub scales: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockIQ1_M>() == 56);

#[inline]
fn sc(b: &BlockIQ1_M, i: usize) -> u16 {
    u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]])
}

/// The f16 block scale assembled from the top nibbles of the four scale words.
#[inline]
fn super_scale(b: &BlockIQ1_M) -> f32 {
    let u = (sc(b, 0) >> 12)
        | ((sc(b, 1) >> 8) & 0x00f0)
        | ((sc(b, 2) >> 4) & 0x0f00)
        | (sc(b, 3) & 0xf000);
    f16_to_f32(u.to_le_bytes())
}

/// 3-bit scale of weights `16h .. 16h + 16` of group `ib`.
#[inline]
fn scale(b: &BlockIQ1_M, ib: usize, h: usize) -> i32 {
    ((sc(b, ib / 2) >> (6 * (ib % 2) + 3 * h)) & 7) as i32
}

/// Grid index and delta sign (true = negative) of entry `l` (0..4) of group `ib`.
#[inline]
fn entry(b: &BlockIQ1_M, ib: usize, l: usize) -> (usize, bool) {
    let q = b.qh[2 * ib + l / 2] as usize;
    let nib = if l.is_multiple_of(2) { q & 15 } else { q >> 4 };
    (b.qs[4 * ib + l] as usize | ((nib & 7) << 8), nib & 8 != 0)
}

/// `out[256 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockIQ1_M], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "IQ1_M row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = super_scale(b);
        for (ib, og) in o.chunks_exact_mut(32).enumerate() {
            for (l, o8) in og.chunks_exact_mut(8).enumerate() {
                let dl = d * (2 * scale(b, ib, l / 2) + 1) as f32;
                let (idx, neg) = entry(b, ib, l);
                let delta = if neg { -DELTA } else { DELTA };
                for (y, g) in o8.iter_mut().zip(grid8(idx)) {
                    *y = dl * (g as f32 + delta);
                }
            }
        }
    }
}

/// Reference dot with a Q8_K row, as ggml: `Σ_b d·d_a·(Σ ls·Σ g·a + δ·Σ ls·±Σa)`.
pub fn dot(w: &[BlockIQ1_M], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ1_M dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for ib in 0..8 {
            let (mut s1, mut s2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let (idx, neg) = entry(x, ib, l);
                let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                let lsum1: i32 = grid8(idx)
                    .iter()
                    .zip(q8)
                    .map(|(&g, &q)| g as i32 * q as i32)
                    .sum();
                let lsum2: i32 = q8.iter().map(|&q| q as i32).sum();
                s1[l / 2] += lsum1;
                s2[l / 2] += if neg { -lsum2 } else { lsum2 };
            }
            let (ls1, ls2) = (2 * scale(x, ib, 0) + 1, 2 * scale(x, ib, 1) + 1);
            sumi1 += s1[0] * ls1 + s1[1] * ls2;
            sumi2 += s2[0] * ls1 + s2[1] * ls2;
        }
        sumf += super_scale(x) * y.d() * (sumi1 as f32 + DELTA * sumi2 as f32);
    }
    sumf
}
