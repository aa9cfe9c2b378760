//! IQ2_XXS × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (66 B): `d: f16`, then per 32 weights 8 bytes: four grid indices (256-entry
//! table of 8 magnitudes) and a u32 with four 7-bit sign indices and the 4-bit scale in its
//! top bits. Signs come from the ±1 byte table shared with IQ2_XS (`SIGNS64`); the scale
//! `2s + 1` multiplies in the `madd`. Per block: `0.125 · d_w · d_a · Σ`.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::iq2_xs::avx2::SIGNS64;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ2XXS_GRID;
use std::arch::x86_64::*;

/// `MASK`: apply the signs through a mask register (`0 − a` where set; AVX-512 BW/VL
/// driver only), the sign masks of a whole block computed in SIMD (`sign_masks_7x4`),
/// instead of gathering ±1 bytes from `SIGNS64`.
pub(crate) struct Iq2Xxs<const MASK: bool>;

/// The 32-bit sign masks of eight 32-weight groups: lane ib of `aux` holds four 7-bit
/// sign indices (bits 7l..7l + 7); byte l of the result is index l plus its parity in bit 7
/// (ggml's `ksigns_iq2xs`, so the count of negatives is even).
#[inline(always)]
pub(crate) unsafe fn sign_masks_7x4(aux: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let parity = _mm256_setr_epi8(
            0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0,
            1, 1, 0,
        );
        let m7 = _mm256_set1_epi32(127);
        let m15 = _mm256_set1_epi32(15);
        let one = |s: __m256i| {
            let lo = _mm256_shuffle_epi8(parity, _mm256_and_si256(s, m15));
            let hi = _mm256_shuffle_epi8(parity, _mm256_srli_epi32::<4>(s));
            _mm256_or_si256(s, _mm256_slli_epi32::<7>(_mm256_xor_si256(lo, hi)))
        };
        let b0 = one(_mm256_and_si256(aux, m7));
        let b1 = one(_mm256_and_si256(_mm256_srli_epi32::<7>(aux), m7));
        let b2 = one(_mm256_and_si256(_mm256_srli_epi32::<14>(aux), m7));
        let b3 = one(_mm256_and_si256(_mm256_srli_epi32::<21>(aux), m7));
        _mm256_or_si256(
            _mm256_or_si256(b0, _mm256_slli_epi32::<8>(b1)),
            _mm256_or_si256(_mm256_slli_epi32::<16>(b2), _mm256_slli_epi32::<24>(b3)),
        )
    }
}

impl<const MASK: bool> Micro for Iq2Xxs<MASK> {
    const BYTES: usize = 66;

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
        // (trait contract), so every offset below is inside block b of its row; grid
        // indices are bytes (256 entries) and sign indices are masked to 7 bits; the driver
        // enables AVX2/FMA/F16C, and AVX-512 F/BW/VL where `MASK`.
        unsafe {
            let zero = _mm256_setzero_si256();
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb) * 0.125;
                let mut sumi = [_mm256_setzero_si256(); NA];
                let mut sm = [0u32; 8];
                if MASK {
                    // The odd u32 of each group's 8 bytes: lanes 1, 3, 5, 7 of both halves.
                    let odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
                    let v0 = _mm256_permutevar8x32_epi32(load256(wb.add(2)), odd);
                    let v1 = _mm256_permutevar8x32_epi32(load256(wb.add(34)), odd);
                    let aux = _mm256_blend_epi32::<0xf0>(v0, v1);
                    _mm256_storeu_si256(sm.as_mut_ptr() as *mut _, sign_masks_7x4(aux));
                }
                for ib in 0..8 {
                    let g = wb.add(2 + 8 * ib);
                    let aux = (g.add(4) as *const u32).read_unaligned();
                    let grid = |l: usize| *IQ2XXS_GRID.get_unchecked(*g.add(l) as usize) as i64;
                    let q = _mm256_setr_epi64x(grid(0), grid(1), grid(2), grid(3));
                    let s =
                        |l: u32| *SIGNS64.get_unchecked(((aux >> (7 * l)) & 127) as usize) as i64;
                    let sgn = _mm256_setr_epi64x(s(0), s(1), s(2), s(3));
                    let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
                    for i in 0..NA {
                        let av = load256(ab[i].add(4 + 32 * ib));
                        let av = if MASK {
                            _mm256_mask_sub_epi8(av, sm[ib], zero, av)
                        } else {
                            _mm256_sign_epi8(av, sgn)
                        };
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
