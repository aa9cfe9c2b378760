//! Q2_K × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (84 B): `scales[16]` (low nibble scale, high nibble min per 16-weight
//! group), `qs[64]`, `d, dmin: f16`. Chunk k of half h (weights 128h + 32k .. +32) is
//! `(qs[32h ..] >> 2k) & 3`; its first 16 weights are group 8h + 2k, the next 16 group
//! 8h + 2k + 1.
//!
//! Per block and row pair: `d_a · (d · Σ_g sc_g Σ q·a − dmin · Σ_g m_g bsum_g)`:
//! `maddubs(q, a)` then `madd` with the chunk's two scales (one per 128-bit lane), and the
//! mins as one `madd` of the bsums. Tested against the quant crate's `q2_k::dot` in
//! tests/kernels_k.rs.

use crate::cpu::q4_k::avx2::scale_selectors;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16x2, shift16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q2K;

impl Micro for Q2K {
    const BYTES: usize = 84;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        // Even groups' scales to lane 0, odd groups' to lane 1 (see q6_k::avx2).
        let evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let ctrl = scale_selectors();
        let mut acc = [_mm256_setzero_ps(); NA];
        for b in 0..nb {
            // SAFETY (whole block): the weight row and activation rows i < NA are nb blocks
            // long (trait contract), so every offset below is inside block b of its row.
            unsafe {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let raw = _mm_loadu_si128(wb as *const __m128i);
                let sc_pairs =
                    _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_and_si128(raw, m4), evens_odds));
                let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
                let dm = load_f16x2(wb.add(80));
                let (d, dmin) = (
                    _mm256_broadcastss_ps(dm),
                    _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
                );
                let mut sumi = [_mm256_setzero_si256(); NA];
                for h in 0..2 {
                    let qv = load256(wb.add(16 + 32 * h));
                    for k in 0..4 {
                        let q = _mm256_and_si256(shift16(qv, -2 * k as i32), m3);
                        let s = _mm256_shuffle_epi8(sc_pairs, ctrl[4 * h + k]);
                        for i in 0..NA {
                            let av = load256(ab[i].add(4 + 128 * h + 32 * k));
                            sumi[i] = _mm256_add_epi32(
                                sumi[i],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), s),
                            );
                        }
                    }
                }
                for i in 0..NA {
                    let da = _mm256_set1_ps((ab[i] as *const f32).read_unaligned());
                    let summ = _mm256_cvtepi32_ps(_mm256_madd_epi16(load256(ab[i].add(260)), mins));
                    let f = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[i]), d);
                    let f = _mm256_fnmadd_ps(summ, dmin, f);
                    acc[i] = _mm256_fmadd_ps(f, da, acc[i]);
                }
            }
        }
        for (i, v) in acc.iter().enumerate() {
            // SAFETY: output cell i is inside the tile (trait contract).
            unsafe { *out.add(i * stride) = hsum_ps(*v) };
        }
    }
}
