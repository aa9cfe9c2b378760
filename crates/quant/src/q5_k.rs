//! Q5_K: Q4_K with a fifth bit per weight; `x = d·sc_j·q − dmin·m_j` with `q` in 0..=31.
//! 5.5 bits per weight.
//!
//! Layout (ggml-common.h `block_q5_K`, 176 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]`
//! (as Q4_K), `qh: [u8; 32]`, `qs: [u8; 128]`. Low 4 bits as Q4_K; the high bit of weight
//! `32j + l` (sub-block j) is bit j of `qh[l]`. Dotted with Q8_K activations.
//! Tested against the `gguf` package (dequantize) and ggml (`quantize_row_q5_K_ref`,
//! `ggml_vec_dot_q5_K_q8_K_generic`) through tests/fixtures.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::k_common::{dequantize_scale_min_k4, dot_d_dmin, isums_scale_min_k4, Qkx2, QK_K};
use crate::q4_k::quantize_scale_min_block;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    /// High bits: bit j of `qh[l]` belongs to weight `32j + l`.
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_K>() == 176);
const _: () = assert!(std::mem::align_of::<BlockQ5_K>() == 1);

impl Default for BlockQ5_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The block's 256 quants (0..=31) in weight order.
#[inline]
pub fn unpack(b: &BlockQ5_K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let h = b.qh[l];
            q[64 * c + l] = (b.qs[32 * c + l] & 0xf) | (((h >> (2 * c)) & 1) << 4);
            q[64 * c + 32 + l] = (b.qs[32 * c + l] >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← the blocks' values, `(d·sc)·q − (dmin·m)` in f32.
pub fn dequantize(blocks: &[BlockQ5_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q5_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        dequantize_scale_min_k4(b.d, b.dmin, &b.scales, &unpack(b), o);
    }
}

/// ggml's `quantize_row_q5_K_ref` (no importance weights): as Q4_K with `nmax = 31` and a
/// narrower search grid. `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ5_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q5_K row length");
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let l = quantize_scale_min_block(&p, xs, &mut b.d, &mut b.dmin, &mut b.scales);
        b.qh = [0; 32];
        for c in 0..4 {
            for i in 0..32 {
                let (lo, hi) = (l[64 * c + i], l[64 * c + 32 + i]);
                b.qh[i] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
                b.qs[32 * c + i] = (lo & 0xf) | ((hi & 0xf) << 4);
            }
        }
    }
}

/// Integer parts of one block's dot with a Q8_K block: `(Σ_j sc_j·Σ q·a, Σ_j m_j·Σ a)`.
#[inline]
pub fn block_isums(b: &BlockQ5_K, a: &BlockQ8_K) -> (i32, i32) {
    isums_scale_min_k4(&b.scales, &unpack(b), a)
}

/// Reference dot of a Q5_K weight row with a Q8_K activation row (same block count).
pub fn dot(w: &[BlockQ5_K], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q5_K dot length");
    dot_d_dmin(w, a, |x| (x.d, x.dmin), block_isums)
}
