//! Pieces shared by the 32-weight legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, and Q8_0 as a
//! weight): their common bit layout, the range searches of ggml's reference quantizers (the
//! absmax one also serves the K-quants), and the dequantization and dot loops, which differ
//! between formats only in how a block's quants are unpacked.
//!
//! Layout: weight `j < 16` is the low nibble of `qs[j]`, weight `j ≥ 16` the high nibble of
//! `qs[j − 16]`; the 5-bit formats keep bit 4 of weight `j` in bit `j` of the little-endian
//! u32 `qh`.

use crate::float::f16_to_f32;
use crate::q8_0::BlockQ8_0;
use crate::q8_1::BlockQ8_1;

/// Weights per block.
pub(crate) const QK: usize = 32;

/// The 32 4-bit fields of `qs` in weight order.
#[inline]
pub(crate) fn nibbles(qs: &[u8; QK / 2]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = qs[j] & 15;
        q[j + QK / 2] = qs[j] >> 4;
    }
    q
}

/// The 32 5-bit fields of `qs` and `qh` in weight order.
#[inline]
pub(crate) fn fives(qs: &[u8; QK / 2], qh: [u8; 4]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((qh >> j) & 1) as u8) << 4;
    }
    q
}

/// Packs 32 4-bit quants into `qs`.
#[inline]
pub(crate) fn pack_nibbles(q: &[u8; QK]) -> [u8; QK / 2] {
    std::array::from_fn(|j| q[j] | (q[j + QK / 2] << 4))
}

/// Packs 32 5-bit quants into `(qs, qh)`.
#[inline]
pub(crate) fn pack_fives(q: &[u8; QK]) -> ([u8; QK / 2], [u8; 4]) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let (q0, q1) = (q[j], q[j + QK / 2]);
        qs[j] = (q0 & 15) | ((q1 & 15) << 4);
        qh |= ((q0 >> 4) as u32) << j;
        qh |= ((q1 >> 4) as u32) << (j + QK / 2);
    }
    (qs, qh.to_le_bytes())
}

/// The first value of largest magnitude, sign kept (`0` for an all-zero block; NaNs are
/// passed over): the `max` of ggml's symmetric quantizers, which maps it to the most
/// negative quant.
#[inline]
pub(crate) fn first_absmax(xs: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` of a block as ggml's offset quantizers find them.
#[inline]
pub(crate) fn min_max(xs: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xs {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `out[32 · blocks.len()]` ← `q · d` for blocks that `parts` splits into `(d, quants)`.
pub(crate) fn dequantize_scaled<B>(
    blocks: &[B],
    out: &mut [f32],
    parts: impl Fn(&B) -> ([u8; 2], [i8; QK]),
) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, q) = parts(b);
        let d = f16_to_f32(d);
        for (y, q) in o.iter_mut().zip(q) {
            *y = q as f32 * d;
        }
    }
}

/// `out[32 · blocks.len()]` ← `q · d + m` (two roundings, as gguf-py) for blocks that `parts`
/// splits into `(d, m, quants)`.
pub(crate) fn dequantize_offset<B>(
    blocks: &[B],
    out: &mut [f32],
    parts: impl Fn(&B) -> ([u8; 2], [u8; 2], [u8; QK]),
) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m, q) = parts(b);
        let (d, m) = (f16_to_f32(d), f16_to_f32(m));
        for (y, q) in o.iter_mut().zip(q) {
            *y = q as f32 * d + m;
        }
    }
}

/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j` of a row whose blocks `parts` splits into
/// `(d, quants)` with a Q8_0 row of the same block count, accumulated in f32 block by block
/// as ggml does.
pub(crate) fn dot_q8_0<B>(
    w: &[B],
    a: &[BlockQ8_0],
    parts: impl Fn(&B) -> ([u8; 2], [i8; QK]),
) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (d, q) = parts(x);
        let isum: i32 = q
            .iter()
            .zip(&y.qs)
            .map(|(&x, &y)| x as i32 * y as i32)
            .sum();
        sum += (f16_to_f32(d) * f16_to_f32(y.d)) * isum as f32;
    }
    sum
}

/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j + m_w · s_a` of a row whose blocks `parts` splits into
/// `(d, m, quants)` with a Q8_1 row of the same block count, accumulated in f32 as ggml does.
pub(crate) fn dot_q8_1<B>(
    w: &[B],
    a: &[BlockQ8_1],
    parts: impl Fn(&B) -> ([u8; 2], [u8; 2], [u8; QK]),
) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (d, m, q) = parts(x);
        let isum: i32 = q
            .iter()
            .zip(&y.qs)
            .map(|(&q, &a)| q as i32 * a as i32)
            .sum();
        sum += (f16_to_f32(d) * f16_to_f32(y.d)) * isum as f32 + f16_to_f32(m) * f16_to_f32(y.s);
    }
    sum
}
