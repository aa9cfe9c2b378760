//! Q2_K: 256-weight super-blocks of sixteen 16-weight groups, each with a 4-bit scale and a
//! 4-bit min; `x = d·sc_g·q − dmin·m_g` with 2-bit `q`. 2.625 bits per weight.
//!
//! Layout (ggml-common.h `block_q2_K`, 84 bytes): `scales: [u8; 16]` (low nibble scale,
//! high nibble min), `qs: [u8; 64]`, `d: f16`, `dmin: f16`. Weight `128h + 32k + l`
//! (h < 2, k < 4, l < 32) is `(qs[32h + l] >> 2k) & 3`, in group `8h + 2k + l/16`.
//! Dotted with Q8_K activations. Tested against the `gguf` package (dequantize) and ggml
//! (`quantize_row_q2_K_ref`, `ggml_vec_dot_q2_K_q8_K_generic`) through tests/fixtures.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::k_common::{
    dot_d_dmin, f16_to_f32, f32_to_f16, make_qkx2_quants, nearest_int, Qkx2, QK_K,
};
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2_K {
    /// Per group: scale in the low nibble, min in the high nibble.
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: [u8; 2],
    pub dmin: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ2_K>() == 84);
const _: () = assert!(std::mem::align_of::<BlockQ2_K>() == 1);

impl Default for BlockQ2_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The block's 256 quants (0..=3) in weight order.
#[inline]
pub fn unpack(b: &BlockQ2_K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                q[128 * h + 32 * k + l] = (b.qs[32 * h + l] >> (2 * k)) & 3;
            }
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← the blocks' values, `(d·sc)·q − (dmin·m)` in f32.
pub fn dequantize(blocks: &[BlockQ2_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q2_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        let q = unpack(b);
        for g in 0..16 {
            let dl = d * (b.scales[g] & 0xf) as f32;
            let ml = dmin * (b.scales[g] >> 4) as f32;
            for l in 16 * g..16 * g + 16 {
                o[l] = dl * q[l] as f32 - ml;
            }
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`: per group an asymmetric search weighted by `|x|` with
/// absolute error, scales and mins quantized to 4 bits against their maxima, quants
/// recomputed. `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ2_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q2_K row length");
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for g in 0..16 {
            let xg = &xs[16 * g..16 * g + 16];
            let mut w = [0f32; 16];
            for (wi, &v) in w.iter_mut().zip(xg) {
                *wi = v.abs();
            }
            (scales[g], mins[g]) = make_qkx2_quants(&p, xg, &w, &mut l[16 * g..16 * g + 16]);
            if scales[g] > max_scale {
                max_scale = scales[g];
            }
            if mins[g] > max_min {
                max_min = mins[g];
            }
        }
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for g in 0..16 {
                b.scales[g] = nearest_int(iscale * scales[g]) as u8;
            }
            b.d = f32_to_f16(max_scale / 15.0);
        } else {
            b.scales = [0; 16];
            b.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for g in 0..16 {
                b.scales[g] |= (nearest_int(iscale * mins[g]) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / 15.0);
        } else {
            b.dmin = f32_to_f16(0.0);
        }
        let d = f16_to_f32(b.d);
        let dmin = f16_to_f32(b.dmin);
        for g in 0..16 {
            let dg = d * (b.scales[g] & 0xf) as f32;
            if dg == 0.0 {
                continue;
            }
            let dm = dmin * (b.scales[g] >> 4) as f32;
            for i in 16 * g..16 * g + 16 {
                l[i] = nearest_int((xs[i] + dm) / dg).clamp(0, 3) as u8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let q = |k: usize| l[128 * h + 32 * k + i];
                b.qs[32 * h + i] = q(0) | (q(1) << 2) | (q(2) << 4) | (q(3) << 6);
            }
        }
    }
}

/// Integer parts of one block's dot with a Q8_K block: `(Σ_g sc_g·Σ q·a, Σ_g m_g·Σ a)`.
#[inline]
pub fn block_isums(b: &BlockQ2_K, a: &BlockQ8_K) -> (i32, i32) {
    let q = unpack(b);
    let mut sumi = 0i32;
    let mut summ = 0i32;
    for g in 0..16 {
        let mut s = 0i32;
        for l in 16 * g..16 * g + 16 {
            s += q[l] as i32 * a.qs[l] as i32;
        }
        sumi += (b.scales[g] & 0xf) as i32 * s;
        summ += (b.scales[g] >> 4) as i32 * a.bsum(g);
    }
    (sumi, summ)
}

/// Reference dot of a Q2_K weight row with a Q8_K activation row (same block count).
pub fn dot(w: &[BlockQ2_K], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q2_K dot length");
    dot_d_dmin(w, a, |x| (x.d, x.dmin), block_isums)
}
