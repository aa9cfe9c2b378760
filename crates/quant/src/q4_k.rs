//! Q4_K: 256-weight super-blocks of eight 32-weight sub-blocks, each with a 6-bit scale and
//! a 6-bit min; `x = d·sc_j·q − dmin·m_j` with 4-bit `q`. 4.5 bits per weight.
//!
//! Layout (ggml-common.h `block_q4_K`, 144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]`
//! (packed as in [`scale_min_k4`]), `qs: [u8; 128]`. Weights `64c .. 64c+32` are the low
//! nibbles of `qs[32c .. 32c+32]` (sub-block 2c), weights `64c+32 .. 64c+64` the high
//! nibbles (sub-block 2c+1). Dotted with Q8_K activations.
//! Tested against the `gguf` package (dequantize) and ggml (`quantize_row_q4_K_ref`,
//! `ggml_vec_dot_q4_K_q8_K_generic`) through tests/fixtures.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

pub use crate::k_common::scale_min_k4;
use crate::k_common::{
    dequantize_scale_min_k4, dot_d_dmin, f16_to_f32, f32_to_f16, isums_scale_min_k4,
    make_qkx2_quants, nearest_int, pack_scale_min_k4, Qkx2, QK_K,
};
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_K {
    /// Super-block scale for the sub-block scales, f16.
    pub d: [u8; 2],
    /// Super-block scale for the sub-block mins, f16.
    pub dmin: [u8; 2],
    /// Eight 6-bit scales and eight 6-bit mins.
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_K>() == 144);
const _: () = assert!(std::mem::align_of::<BlockQ4_K>() == 1);

impl Default for BlockQ4_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The block's 256 quants (0..=15) in weight order.
#[inline]
pub fn unpack(b: &BlockQ4_K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            q[64 * c + l] = b.qs[32 * c + l] & 0xf;
            q[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← the blocks' values, computed as `(d·sc)·q − (dmin·m)` in f32.
pub fn dequantize(blocks: &[BlockQ4_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q4_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        dequantize_scale_min_k4(b.d, b.dmin, &b.scales, &unpack(b), o);
    }
}

/// ggml's `quantize_row_q4_K_ref` (no importance weights): per sub-block an asymmetric
/// search weighted by `rms(x) + |x|`, then scales and mins quantized to 6 bits against
/// their maxima and the quants recomputed with the rounded scales.
/// `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ4_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q4_K row length");
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let l = quantize_scale_min_block(&p, xs, &mut b.d, &mut b.dmin, &mut b.scales);
        for c in 0..4 {
            for i in 0..32 {
                b.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// The scale/min part of quantizing one Q4_K/Q5_K block `xs[256]` (shared with Q5_K): fits
/// each sub-block with the asymmetric search `p`, stores `d`, `dmin` and the packed 6-bit
/// scales and mins, and returns the quants (0..=`p.nmax`) recomputed with the stored values.
pub(crate) fn quantize_scale_min_block(
    p: &Qkx2,
    xs: &[f32],
    d: &mut [u8; 2],
    dmin: &mut [u8; 2],
    scales: &mut [u8; 12],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let (sc, mins) = sub_block_fits(p, xs, &mut l);
    quantize_block_from_fits(xs, &sc, &mins, p.nmax, d, dmin, scales, &mut l);
    l
}

/// Per 32-weight sub-block scale and min from the asymmetric search.
fn sub_block_fits(p: &Qkx2, xs: &[f32], l: &mut [u8; QK_K]) -> ([f32; 8], [f32; 8]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for j in 0..8 {
        let x = &xs[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in x {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut w = [0f32; 32];
        for (wi, &v) in w.iter_mut().zip(x) {
            *wi = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(p, x, &w, &mut l[32 * j..32 * j + 32]);
    }
    (scales, mins)
}

/// Rounds the sub-block scales/mins to 6 bits, stores `d`, `dmin` and the packed scales, and
/// recomputes `l` (0..=nmax) with the stored values.
#[allow(clippy::too_many_arguments)]
fn quantize_block_from_fits(
    xs: &[f32],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    d_out: &mut [u8; 2],
    dmin_out: &mut [u8; 2],
    scales_out: &mut [u8; 12],
    l: &mut [u8; QK_K],
) {
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        // ggml stores the rounded value in a u8 (wrapping) before clamping to 63.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    *scales_out = pack_scale_min_k4(&ls, &lm);
    *d_out = f32_to_f16(max_scale / 63.0);
    *dmin_out = f32_to_f16(max_min / 63.0);
    let d = f16_to_f32(*d_out);
    let dmin = f16_to_f32(*dmin_out);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales_out);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((xs[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
}

/// Integer parts of one block's dot with a Q8_K block: `(Σ_j sc_j·Σ q·a, Σ_j m_j·Σ a)`.
#[inline]
pub fn block_isums(b: &BlockQ4_K, a: &BlockQ8_K) -> (i32, i32) {
    isums_scale_min_k4(&b.scales, &unpack(b), a)
}

/// Reference dot of a Q4_K weight row with a Q8_K activation row (same block count):
/// `Σ_b d_a·(d·Σ sc·q·a − dmin·Σ m·a)`, integer sums exact, f32 accumulation.
pub fn dot(w: &[BlockQ4_K], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q4_K dot length");
    dot_d_dmin(w, a, |x| (x.d, x.dmin), block_isums)
}
