//! IQ4_NL (ggml type 20): 32 weights per block, one f16 scale and 4-bit indices into a
//! fixed non-linear table; `x = d · KVALUES[idx]`. 4.5 bits per weight.
//!
//! Layout (ggml-common.h `block_iq4_nl`, 18 bytes): `d: f16`, `qs: [u8; 16]`; weight
//! `j < 16` is the low nibble of `qs[j]`, weight `16 + j` the high nibble. Dotted with
//! Q8_0 activations. Tested against gguf-py (dequantize) and ggml
//! (`ggml_vec_dot_iq4_nl_q8_0_generic`) through tests/fixtures made by
//! scripts/quant_reference_lowbit.py. No quantizer here (ggml's needs a search; optional).

use crate::float::f16_to_f32;
use crate::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Weights per block.
pub const QK: usize = 32;

/// ggml's `kvalues_iq4nl`.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4_NL {
    /// Scale, f16 little-endian.
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIQ4_NL>() == 18);
const _: () = assert!(std::mem::align_of::<BlockIQ4_NL>() == 1);

/// Table values of 16 packed nibble pairs in weight order (low nibbles, then high).
#[inline]
pub(crate) fn unpack16(qs: &[u8]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for j in 0..16 {
        v[j] = KVALUES[(qs[j] & 15) as usize];
        v[j + 16] = KVALUES[(qs[j] >> 4) as usize];
    }
    v
}

/// `out[32 · blocks.len()]` ← `d · KVALUES[idx]`.
pub fn dequantize(blocks: &[BlockIQ4_NL], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * QK, "IQ4_NL row length");
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, v) in o.iter_mut().zip(unpack16(&b.qs)) {
            *y = d * v as f32;
        }
    }
}

/// Reference dot of an IQ4_NL row with a Q8_0 row: `Σ_b (d_a · d_w) · Σ v·a` in f32.
pub fn dot(w: &[BlockIQ4_NL], a: &[BlockQ8_0]) -> f32 {
    assert_eq!(w.len(), a.len(), "IQ4_NL dot length");
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(y.d) * f16_to_f32(x.d);
        let isum: i32 = unpack16(&x.qs)
            .iter()
            .zip(&y.qs)
            .map(|(&v, &q)| v as i32 * q as i32)
            .sum();
        sumf += d * isum as f32;
    }
    sumf
}
