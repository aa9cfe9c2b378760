//! Q6_K: 256-weight super-blocks of sixteen 16-weight groups, each with a signed 8-bit
//! scale; `x = d·sc_j·(q − 32)` with 6-bit `q`. 6.5625 bits per weight.
//!
//! Layout (ggml-common.h `block_q6_K`, 210 bytes): `ql: [u8; 128]` (low 4 bits),
//! `qh: [u8; 64]` (high 2 bits), `scales: [i8; 16]`, `d: f16`. For half `h` (weights
//! `128h ..`), `l` in 0..32 and `k` in 0..4, weight `128h + 32k + l` has low bits from
//! `ql[64h + 32(k&1) + l]` (low nibble for k < 2, high nibble otherwise) and high bits
//! `(qh[32h + l] >> 2k) & 3`; its group is `8h + 2k + l/16`. Dotted with Q8_K activations.
//! Tested against the `gguf` package (dequantize) and ggml (`quantize_row_q6_K_ref`,
//! `ggml_vec_dot_q6_K_q8_K_generic`) through tests/fixtures.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::k_common::{f16_to_f32, f32_to_f16, make_qx_quants, nearest_int, GROUP_MAX_EPS, QK_K};
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6_K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ6_K>() == 210);
const _: () = assert!(std::mem::align_of::<BlockQ6_K>() == 1);

impl Default for BlockQ6_K {
    fn default() -> Self {
        Self::zeroed()
    }
}

/// The block's 256 quants (0..=63, offset 32 not removed) in weight order.
#[inline]
pub fn unpack(b: &BlockQ6_K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        for l in 0..32 {
            let ql0 = b.ql[64 * h + l];
            let ql1 = b.ql[64 * h + 32 + l];
            let qh = b.qh[32 * h + l];
            q[128 * h + l] = (ql0 & 0xf) | ((qh & 3) << 4);
            q[128 * h + 32 + l] = (ql1 & 0xf) | (((qh >> 2) & 3) << 4);
            q[128 * h + 64 + l] = (ql0 >> 4) | (((qh >> 4) & 3) << 4);
            q[128 * h + 96 + l] = (ql1 >> 4) | (((qh >> 6) & 3) << 4);
        }
    }
    q
}

/// `out[256 · blocks.len()]` ← the blocks' values, `(d·sc)·(q − 32)` in f32.
pub fn dequantize(blocks: &[BlockQ6_K], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "Q6_K row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let q = unpack(b);
        for g in 0..16 {
            let dg = d * b.scales[g] as f32;
            for l in 16 * g..16 * g + 16 {
                o[l] = dg * (q[l] as i32 - 32) as f32;
            }
        }
    }
}

/// ggml's `quantize_row_q6_K_ref` (no importance weights): a symmetric search per
/// 16-weight group, group scales quantized to i8 against the largest, quants recomputed.
/// `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ6_K]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q6_K row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for g in 0..16 {
            let s = make_qx_quants(32, &xs[16 * g..16 * g + 16], &mut l[16 * g..16 * g + 16]);
            scales[g] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *b = BlockQ6_K::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for g in 0..16 {
            b.scales[g] = nearest_int(iscale * scales[g]).min(127) as i8;
        }
        let d = f16_to_f32(b.d);
        for g in 0..16 {
            let dg = d * b.scales[g] as f32;
            if dg == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                l[i] = (nearest_int(xs[i] / dg).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let q = |k: usize| l[128 * h + 32 * k + i] as u8;
                b.ql[64 * h + i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
                b.ql[64 * h + 32 + i] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
                b.qh[32 * h + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// Integer part of one block's dot with a Q8_K block: `Σ_g sc_g·Σ (q − 32)·a`.
#[inline]
pub fn block_isum(b: &BlockQ6_K, a: &BlockQ8_K) -> i32 {
    let q = unpack(b);
    let mut sumi = 0i32;
    for g in 0..16 {
        let mut s = 0i32;
        for l in 16 * g..16 * g + 16 {
            s += (q[l] as i32 - 32) * a.qs[l] as i32;
        }
        sumi += b.scales[g] as i32 * s;
    }
    sumi
}

/// Reference dot of a Q6_K weight row with a Q8_K activation row (same block count).
pub fn dot(w: &[BlockQ6_K], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q6_K dot length");
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += f16_to_f32(x.d) * y.d() * block_isum(x, y) as f32;
    }
    sum
}
