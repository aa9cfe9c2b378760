//! Q2_0 (ggml type 42, upstream; the ternary Bonsai `*-Q2_0_g64.gguf` files): 64 weights per
//! block, one f16 scale, 2-bit codes meaning −1, 0, +1, +2; `x = (code − 1) · d`.
//!
//! Layout (ggml-common.h `block_q2_0`, 18 bytes): `d: f16`, `qs: [u8; 16]`; weight `j` is
//! `(qs[j / 4] >> 2(j % 4)) & 3`. Dotted with Q8_0 activations, two per block. The same
//! codec at group 128 is PrismML's PQ2_0 (`pq2_0.rs`) and the legacy group-128 data some
//! older files store under id 42. Tested against ggml's `dequantize_row_q2_0`,
//! `quantize_row_q2_0_ref` and `ggml_vec_dot_q2_0_q8_0` (tests/fixtures,
//! scripts/quant_reference_lowbit.py; gguf-py 0.19 has no Q2_0).

use crate::float::{f16_to_f32, f32_to_f16};
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2_0 {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    /// 2-bit codes, four per byte, LSB first.
    pub qs: [u8; QK / 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ2_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ2_0>() == 1);

/// Code of weight `j` in packed 2-bit codes.
#[inline]
pub(crate) fn code(qs: &[u8], j: usize) -> i32 {
    ((qs[j / 4] >> (2 * (j % 4))) & 3) as i32
}

/// Dequantizes one block of any group size: `o[j] = (code_j − 1) · d`.
#[inline]
pub(crate) fn dequantize_codes(d: [u8; 2], qs: &[u8], o: &mut [f32]) {
    let d = f16_to_f32(d);
    for (j, y) in o.iter_mut().enumerate() {
        *y = (code(qs, j) - 1) as f32 * d;
    }
}

/// ggml's `quantize_row_q2_0_ref` for one block of any group size: `d = max|x|`,
/// `code = clamp(round(x / d) + 1, 0, 3)` (round half away from zero, `x · (1/d)`).
#[inline]
pub(crate) fn quantize_codes(xs: &[f32], d_out: &mut [u8; 2], qs: &mut [u8]) {
    let amax = xs
        .iter()
        .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
    *d_out = f32_to_f16(amax);
    qs.fill(0);
    for (j, &v) in xs.iter().enumerate() {
        // Clamped before the add: `as i32` saturates and `+ 1` would overflow.
        let q = ((v * id).round().clamp(-1.0, 2.0) as i32 + 1).clamp(0, 3);
        qs[j / 4] |= (q as u8) << (2 * (j % 4));
    }
}

/// `Σ (code − 1) · a` over 32 activation quants against the codes of weights
/// `32k .. 32k + 32` of a block.
#[inline]
pub(crate) fn codes_isum(qs: &[u8], k: usize, a: &[i8; 32]) -> i32 {
    let mut s = 0i32;
    for (j, &q) in a.iter().enumerate() {
        s += (code(qs, 32 * k + j) - 1) * q as i32;
    }
    s
}

/// `out[64 · blocks.len()]` ← the blocks' values.
pub fn dequantize(blocks: &[BlockQ2_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "Q2_0 row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        dequantize_codes(b.d, &b.qs, o);
    }
}

/// ggml's `quantize_row_q2_0_ref`. `x.len()` must be `64 · out.len()`.
pub fn quantize_row(x: &[f32], out: &mut [BlockQ2_0]) {
    assert_eq!(x.len(), out.len() * QK, "Q2_0 row length");
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        quantize_codes(xs, &mut b.d, &mut b.qs);
    }
}

/// Reference dot of a Q2_0 row with a Q8_0 row of the same length: per block
/// `d_w · Σ_k d_a,k · isum_k` in f32, as ggml does.
pub fn dot(w: &[BlockQ2_0], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len() * 2, a.len(), "Q2_0 dot length");
    let mut sumf = 0f32;
    for (b, ab) in w.iter().zip(a.chunks_exact(2)) {
        let mut sumi = 0f32;
        for (k, y) in ab.iter().enumerate() {
            sumi += f16_to_f32(y.d) * codes_isum(&b.qs, k, &y.qs) as f32;
        }
        sumf += f16_to_f32(b.d) * sumi;
    }
    sumf
}
