//! Q5_1: 32 weights per block, f16 scale and f16 minimum, 5-bit unsigned quants;
//! `x = q · d + m`.
//!
//! Layout (ggml-common.h `block_q5_1`, 24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`,
//! `qs: [u8; 16]`, bits ordered as Q5_0. Dotted with Q8_1 activations. Tested against the
//! `gguf` Python package (dequantize, quantize) and ggml's `ggml_vec_dot_q5_1_q8_1`
//! (tests/fixtures).

use crate::float::{f16_to_f32, f32_to_f16};
use crate::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// Minimum (offset), f16 little-endian.
    pub m: [u8; 2],
    /// Fifth bits, one per weight: a little-endian u32, bit `j` for weight `j`.
    pub qh: [u8; 4],
    /// Low 4 bits: low nibble = weights 0..16, high nibble = weights 16..32.
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 1);

/// The block's 32 quants in weight order: 0..=31.
#[inline]
pub fn unpack(b: &BlockQ5_1) -> [u8; QK] {
    let qh = u32::from_le_bytes(b.qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        q[j] = (b.qs[j] & 15) | (h0 << 4);
        q[j + QK / 2] = (b.qs[j] >> 4) | (h1 << 4);
    }
    q
}

/// `out[32 · blocks.len()]` ← the blocks' values (`q · d + m`, two roundings, as gguf-py).
pub fn dequantize(blocks: &[BlockQ5_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q5_1 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (y, q) in o.iter_mut().zip(unpack(b)) {
            *y = q as f32 * d + m;
        }
    }
}

/// ggml's `quantize_row_q5_1_ref`: `d = (max − min) / 31`, `m = min`,
/// `q = trunc((x − min)/d + 0.5)` (clamped to 31 as gguf-py does; ggml's values never
/// exceed it). `x.len()` must be `32 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ5_1]) {
    assert_eq!(x.len(), out.len() * QK, "Q5_1 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in xs {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(31);
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let (q0, q1) = (q(xs[j]), q(xs[j + QK / 2]));
            b.qs[j] = (q0 & 15) | ((q1 & 15) << 4);
            qh |= ((q0 >> 4) as u32) << j;
            qh |= ((q1 >> 4) as u32) << (j + QK / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}

/// Reference dot of a Q5_1 weight row with a Q8_1 activation row (same block count):
/// `Σ_b (d_w · d_a) · Σ_j qw_j · qa_j + m_w · s_a`, accumulated in f32 as ggml does.
pub fn dot(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    assert_eq!(w.len(), a.len(), "Q5_1 dot length");
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let isum: i32 = unpack(x)
            .iter()
            .zip(&y.qs)
            .map(|(&q, &a)| q as i32 * a as i32)
            .sum();
        sum +=
            (f16_to_f32(x.d) * f16_to_f32(y.d)) * isum as f32 + f16_to_f32(x.m) * f16_to_f32(y.s);
    }
    sum
}
