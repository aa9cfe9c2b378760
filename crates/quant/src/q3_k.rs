//! Q3_K: 256-weight super-blocks of sixteen 16-weight groups, each with a 6-bit signed
//! scale; `x = d·(s_g − 32)·q` with 3-bit `q` in −4..=3. 3.4375 bits per weight.
//!
//! Layout (ggml-common.h `block_q3_K`, 110 bytes): `hmask: [u8; 32]`, `qs: [u8; 64]`,
//! `scales: [u8; 12]`, `d: f16`. Weight `128h + 32k + l` (h < 2, k < 4, l < 32) has low
//! bits `(qs[32h + l] >> 2k) & 3` and high bit `(hmask[l] >> (4h + k)) & 1`; a clear high
//! bit subtracts 4. Its group is `g = 8h + 2k + l/16`. Scale `s_g`: low 4 bits are
//! `scales[g] & 15` (g < 8) or `scales[g − 8] >> 4`, high 2 bits `(scales[8 + g%4] >> 2(g/4)) & 3`.
//! Dotted with Q8_K activations. Tested against the `gguf` package (dequantize) and ggml
//! (`quantize_row_q3_K_ref`, `ggml_vec_dot_q3_K_q8_K_generic`) through tests/fixtures.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::k_common::{f16_to_f32, f32_to_f16, make_q3_quants, nearest_int, QK_K};
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ3_K {
    /// High bit of each quant: bit `4h + k` of `hmask[l]` for weight `128h + 32k + l`.
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales (offset 32).
    pub scales: [u8; 12],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ3_K>() == 110);
const _: () = assert!(std::mem::align_of::<BlockQ3_K>() == 1);

impl Default for BlockQ3_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The sixteen group scales with the offset removed: −32..=31.
#[inline]
pub fn unpack_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (g, o) in out.iter_mut().enumerate() {
        let lo = if g < 8 { s[g] & 0xf } else { s[g - 8] >> 4 };
        let hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// The block's 256 quants, unsigned: `q + 4` in 0..=7 (weight order).
#[inline]
pub fn unpack(b: &BlockQ3_K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let low = (b.qs[32 * h + l] >> (2 * k)) & 3;
                let high = (b.hmask[l] >> (4 * h + k)) & 1;
                q[128 * h + 32 * k + l] = low | (high << 2);
            }
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← the blocks' values, `(d·s)·(q − 4)` in f32.
pub fn dequantize(blocks: &[BlockQ3_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q3_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let sc = unpack_scales(&b.scales);
        let q = unpack(b);
        for g in 0..16 {
            let dl = d * sc[g] as f32;
            for l in 16 * g..16 * g + 16 {
                o[l] = dl * (q[l] as i32 - 4) as f32;
            }
        }
    }
}

/// ggml's `quantize_row_q3_K_ref`: a refined symmetric search per group, group scales
/// quantized to 6 bits against the largest, quants recomputed.
/// `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ3_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q3_K row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for g in 0..16 {
            scales[g] = make_q3_quants(4, &xs[16 * g..16 * g + 16], &mut l[16 * g..16 * g + 16]);
            if scales[g].abs() > amax {
                amax = scales[g].abs();
                max_scale = scales[g];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for g in 0..16 {
                // ggml narrows the rounded value to i8 before clamping.
                let v = (nearest_int(iscale * scales[g]) as i8).clamp(-32, 31) + 32;
                let v = v as u8;
                if g < 8 {
                    b.scales[g] = v & 0xf;
                } else {
                    b.scales[g - 8] |= (v & 0xf) << 4;
                }
                b.scales[g % 4 + 8] |= (v >> 4) << (2 * (g / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.d = f32_to_f16(0.0);
        }
        let d = f16_to_f32(b.d);
        let sc = unpack_scales(&b.scales);
        for g in 0..16 {
            let dg = d * sc[g] as f32;
            if dg == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                l[i] = (nearest_int(xs[i] / dg).clamp(-4, 3) + 4) as i8;
            }
        }
        b.hmask = [0; 32];
        for (j, lj) in l.iter_mut().enumerate() {
            if *lj > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                *lj -= 4;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let q = |k: usize| l[128 * h + 32 * k + i] as u8;
                b.qs[32 * h + i] = q(0) | (q(1) << 2) | (q(2) << 4) | (q(3) << 6);
            }
        }
    }
}

/// Integer part of one block's dot with a Q8_K block: `Σ_g s_g·Σ (q − 4)·a`.
#[inline]
pub fn block_isum(b: &BlockQ3_K, a: &BlockQ8_K) -> i32 {
    let q = unpack(b);
    let sc = unpack_scales(&b.scales);
    let mut sumi = 0i32;
    for g in 0..16 {
        let mut s = 0i32;
        for l in 16 * g..16 * g + 16 {
            s += (q[l] as i32 - 4) * a.qs[l] as i32;
        }
        sumi += sc[g] as i32 * s;
    }
    sumi
}

/// Reference dot of a Q3_K weight row with a Q8_K activation row (same block count).
pub fn dot(w: &[BlockQ3_K], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q3_K dot length");
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += f16_to_f32(x.d) * y.d() * block_isum(x, y) as f32;
    }
    sum
}
