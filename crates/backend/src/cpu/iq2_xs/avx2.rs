//! IQ2_XS × Q8_K micro-kernel, AVX2 + FMA + F16C (also built with AVX-512VL encodings by
//! the shared driver).
//!
//! Weight block (74 B): `d: f16`, 32 u16 entries (9-bit grid index, 7-bit sign index),
//! `scales[8]`. Per 32 weights (4 entries): the four grid rows (8 unsigned magnitudes each)
//! are gathered into one ymm with scalar loads, the four sign patterns likewise from a ±1
//! byte table (`SIGNS64`), applied to the activation with `psignb`, `maddubs` multiplies, and one `madd`
//! applies the two 16-weight scales `2s + 1` (one per 128-bit lane, unpacked once per block) while summing into
//! i32 lanes, exact per block. Per block: `0.125 · d_w · d_a · Σ`. Tested against the quant
//! crate's `iq2_xs::dot` in tests/kernels_lowbit.rs.

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ2XS_GRID;
use std::arch::x86_64::*;

pub(crate) struct Iq2Xs;

/// ggml's `ksigns_iq2xs` as ±1 bytes: entry i has byte j = −1 where bit j of the sign
/// mask of index i is set. The mask is i plus, in bit 7, the parity of i (so the count of
/// negatives is even); a test checks this against the table from ggml-common.h.
pub(crate) static SIGNS64: [u64; 128] = signs64();

const fn signs64() -> [u64; 128] {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mask = i as u32 | ((i as u32).count_ones() & 1) << 7;
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if mask & (1 << j) != 0 { 0xff } else { 0x01 };
            v |= byte << (8 * j);
            j += 1;
        }
        t[i] = v;
        i += 1;
    }
    t
}

impl Micro for Iq2Xs {
    const BYTES: usize = 74;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): the weight row and activation rows i < NA are nb blocks long
        // (trait contract), so every offset below is inside block b of its row; grid and
        // sign indices are masked to their tables' sizes; the driver enables AVX2/FMA/F16C.
        unsafe {
            let m4 = _mm_set1_epi8(15);
            let one8 = _mm_set1_epi8(1);
            let split = _mm256_setr_epi8(
                0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                2, 3, 2, 3,
            );
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb) * 0.125;
                // The sixteen 4-bit scales as i16 `2s + 1`, in the order [ib][half].
                let sc = _mm_loadl_epi64(wb.add(66) as *const _);
                let lo = _mm_and_si128(sc, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
                let odd = _mm_add_epi8(
                    _mm_add_epi8(_mm_unpacklo_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)),
                    one8,
                );
                let scales = _mm256_cvtepu8_epi16(odd);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let e = |l: usize| (wb.add(2 + 8 * ib + 2 * l) as *const u16).read_unaligned();
                    let (e0, e1, e2, e3) = (e(0), e(1), e(2), e(3));
                    let g = |q: u16| *IQ2XS_GRID.get_unchecked((q & 511) as usize) as i64;
                    let q = _mm256_setr_epi64x(g(e0), g(e1), g(e2), g(e3));
                    let s = |q: u16| *SIGNS64.get_unchecked((q >> 9) as usize) as i64;
                    let sgn = _mm256_setr_epi64x(s(e0), s(e1), s(e2), s(e3));
                    // [2s+1 of weights 0..16 ×8 | of weights 16..32 ×8]: i32 lane ib of
                    // `scales` holds both i16; broadcast it, then split the halves.
                    let ls = _mm256_shuffle_epi8(
                        _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(ib as i32)),
                        split,
                    );
                    for i in 0..NA {
                        let av = _mm256_sign_epi8(load256(ab[i].add(4 + 32 * ib)), sgn);
                        let p = _mm256_maddubs_epi16(q, av);
                        sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(p, ls));
                    }
                }
                for i in 0..NA {
                    let da = (ab[i] as *const f32).read_unaligned();
                    acc[i] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sumi[i]),
                        _mm256_set1_ps(dw * da),
                        acc[i],
                    );
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SIGNS64;
    use neagari_quant::iq_grids::KSIGNS_IQ2XS;

    #[test]
    fn sign_table_matches_ggml() {
        for (i, (&v, &mask)) in SIGNS64.iter().zip(&KSIGNS_IQ2XS).enumerate() {
            for j in 0..8 {
                let want: u8 = if mask & (1 << j) != 0 { 0xff } else { 1 };
                assert_eq!((v >> (8 * j)) as u8, want, "entry {i} byte {j}");
            }
        }
    }
}
