//! Q1_0 (ggml type 41, PrismML's 1-bit Bonsai): 128 weights per block, one f16 scale and
//! one sign bit per weight; bit 1 → `+d`, bit 0 → `−d`. 1.125 bits per weight.
//!
//! Layout (ggml-common.h `block_q1_0`, 18 bytes): `d: f16`, `qs: [u8; 16]`; weight `j` is
//! bit `j % 8` of `qs[j / 8]`. Dotted with Q8_0 activations, four 32-value activation blocks
//! per weight block (ggml's `ggml_vec_dot_q1_0_q8_0`). Tested against ggml's
//! `dequantize_row_q1_0`, `quantize_row_q1_0_ref` and `ggml_vec_dot_q1_0_q8_0_generic`
//! (gguf-py 0.19 knows the type id but has no codec for it) through tests/fixtures made by
//! scripts/quant_reference_lowbit.py.

use crate::float::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ1_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Sign bits, LSB first.
    pub qs: [u8; QK / 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ1_0>() == 1);

/// `out[128 · blocks.len()]` ← `±d`.
pub fn dequantize(blocks: &[BlockQ1_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q1_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (j, y) in o.iter_mut().enumerate() {
            *y = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                -d
            };
        }
    }
}

/// ggml's `quantize_row_q1_0_ref`: `d` = mean of `|x|` over the block (summed in order in
/// f32), bit = `x ≥ 0`. `x.len()` must be `128 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ1_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q1_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let sum_abs = xs.iter().fold(0f32, |s, v| s + v.abs());
        b.d = f32_to_f16(sum_abs / QK as f32);
        b.qs = [0; QK / 8];
        for (j, &v) in xs.iter().enumerate() {
            if v >= 0.0 {
                b.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

/// `Σ ±a` over 32 activation quants against the 32 sign bits at `bits`.
#[inline]
pub(crate) fn signed_isum(bits: &[u8], a: &[i8; 32]) -> i32 {
    let mut s = 0i32;
    for (j, &q) in a.iter().enumerate() {
        s += if (bits[j / 8] >> (j % 8)) & 1 != 0 {
            q as i32
        } else {
            -(q as i32)
        };
    }
    s
}

/// Reference dot of a Q1_0 row with a Q8_0 row of the same length (4 activation blocks per
/// weight block): `Σ_b d_w · Σ_k d_a,k · isum_k`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ1_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len() * 4, a.len(), "Q1_0 dot length");
    let mut sumf = 0f32;
    for (b, ab) in w.iter().zip(a.chunks_exact(4)) {
        let mut sumi = 0f32;
        for (k, y) in ab.iter().enumerate() {
            let isum = signed_isum(&b.qs[4 * k..4 * k + 4], &y.qs);
            sumi += f16_to_f32(y.d) * isum as f32;
        }
        sumf += f16_to_f32(b.d) * sumi;
    }
    sumf
}
