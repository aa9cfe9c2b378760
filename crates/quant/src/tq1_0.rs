//! TQ1_0 (ggml type 34): ternary weights, 256 per block, five trits per byte (base 3) and
//! one f16 scale; `x = (t − 1) · d`. 1.6875 bits per weight.
//!
//! Layout (ggml-common.h `block_tq1_0`, 54 bytes): `qs: [u8; 48]`, `qh: [u8; 4]`, `d: f16`
//! (last). A byte holds trits as `ceil(v · 256 / 243)` for the base-3 number v (first trit
//! most significant); digit n of byte b is `((b · 3ⁿ mod 256) · 3) >> 8`. `qs` is read in
//! stages of 32 then 16 bytes (weight order: digit outer, byte inner), then `qh` (4 digits
//! per byte). PrismML's PTQ1_0 (`ptq1_0.rs`) is the same codec on 128-weight blocks; the
//! staged walk here serves both. Dotted with Q8_K activations. Tested against gguf-py
//! (dequantize, quantize) and ggml (`quantize_row_tq1_0_ref`,
//! `ggml_vec_dot_tq1_0_q8_K_generic`) through tests/fixtures.

use crate::float::{f16_to_f32, f32_to_f16};
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockTQ1_0>() == 54);
const _: () = assert!(std::mem::align_of::<BlockTQ1_0>() == 1);

impl Default for BlockTQ1_0 {
    fn default() -> Self {
        Self::zeroed()
    }
}

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `n` (0 = most significant) of a packed trit byte, 0..=2.
#[inline]
pub(crate) fn trit(b: u8, n: usize) -> u8 {
    ((b.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as u8
}

/// Stage sizes the `qs` bytes are walked in: as many 32s as fit, then 16s, then 8s.
fn stages(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut at = 0;
    let mut out = Vec::with_capacity(3);
    for s in [32, 16, 8] {
        while len - at >= s {
            out.push((at, s));
            at += s;
        }
    }
    out.into_iter()
}

/// Trits (0..=2) of a staged block in weight order: `qs.len() · 5 + qh.len() · 4` of them.
pub(crate) fn unpack_staged(qs: &[u8], qh: &[u8], out: &mut [u8]) {
    let mut w = 0;
    for (at, s) in stages(qs.len()) {
        for n in 0..5 {
            for m in 0..s {
                out[w] = trit(qs[at + m], n);
                w += 1;
            }
        }
    }
    for n in 0..4 {
        for &b in qh {
            out[w] = trit(b, n);
            w += 1;
        }
    }
}

/// `ceil(v · 256 / 243)` of a base-3 number `v` < 243.
#[inline]
fn pack5(v: u16) -> u8 {
    (v * 256).div_ceil(243) as u8
}

/// ggml's reference quantizer for one staged block: `d = max|x|`, `t = round(x/d) + 1`
/// (half away from zero, `x · (1/d)`); the `qh` bytes hold 4 trits shifted up one digit.
pub(crate) fn quantize_staged(xs: &[f32], qs: &mut [u8], qh: &mut [u8], d_out: &mut [u8; 2]) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    *d_out = f32_to_f16(amax);
    // Clamped: a subnormal `amax` makes `id` infinite, and NaN/inf inputs must not overflow.
    let t = |v: f32| ((v * id).round().clamp(-1.0, 1.0) as i32 + 1) as u16;
    let mut x0 = 0;
    for (at, s) in stages(qs.len()) {
        for m in 0..s {
            let mut q = 0u16;
            for n in 0..5 {
                q = q * 3 + t(xs[x0 + m + n * s]);
            }
            qs[at + m] = pack5(q);
        }
        x0 += 5 * s;
    }
    let nh = qh.len();
    for (j, h) in qh.iter_mut().enumerate() {
        let mut q = 0u16;
        for m in 0..4 {
            q = q * 3 + t(xs[x0 + j + m * nh]);
        }
        *h = pack5(q * 3);
    }
}

/// The block's 256 trits (0..=2) in weight order.
#[inline]
pub fn unpack(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    unpack_staged(&b.qs, &b.qh, &mut q);
    q
}

/// `out[256 · blocks.len()]` ← `(t − 1) · d`.
pub fn dequantize(blocks: &[BlockTQ1_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK_K, "TQ1_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (y, q) in o.iter_mut().zip(unpack(b)) {
            *y = (q as i32 - 1) as f32 * d;
        }
    }
}

/// ggml's `quantize_row_tq1_0_ref`. `x.len()` must be `256 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockTQ1_0]) {
    assert_eq!(x.len(), out.len() * QK_K, "TQ1_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        quantize_staged(xs, &mut b.qs, &mut b.qh, &mut b.d);
    }
}

/// `Σ (t − 1) · a` of one block with one Q8_K block.
#[inline]
pub fn block_isum(b: &BlockTQ1_0, a: &BlockQ8_K) -> i32 {
    unpack(b)
        .iter()
        .zip(&a.qs)
        .map(|(&q, &y)| (q as i32 - 1) * y as i32)
        .sum()
}

/// Reference dot of a TQ1_0 row with a Q8_K row (same block count): `Σ isum · (d_w · d_a)`.
pub fn dot(w: &[BlockTQ1_0], a: &[BlockQ8_K]) -> f32 {
    assert_eq!(w.len(), a.len(), "TQ1_0 dot length");
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        sum += block_isum(x, y) as f32 * (f16_to_f32(x.d) * y.d());
    }
    sum
}
