//! IQ2_XS × Q8_K micro-kernel for the AVX-512 F/BW/VL driver (256-bit vectors, mask
//! registers).
//!
//! As `avx2.rs`, but the sign patterns are not gathered from a table: once per block the
//! 32 entries' 7-bit sign indices are widened to their 8-bit masks in SIMD (bit 7 = parity
//! of the seven, from a nibble-parity `pshufb`) and narrowed to 32 bytes, so each 32
//! weights' four masks are one u32, which a masked byte subtraction (`0 − a` where a bit
//! is set) applies to the activation. The grid indices are masked in SIMD too. Per 32
//! weights this leaves four grid loads, their inserts, one mask move and, per activation
//! row, load / masked negate / `maddubs` / `madd` / add. Tested against the quant crate's
//! `iq2_xs::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ2XS_GRID;
use std::arch::x86_64::*;

pub(crate) struct Iq2XsMask;

/// The 8-bit sign masks of the sixteen u16 entries in `e` (index `e >> 9` plus its parity
/// in bit 7), one per 16-bit lane.
#[inline(always)]
unsafe fn sign_masks(e: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let parity = _mm256_setr_epi8(
            0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0,
            1, 1, 0,
        );
        let s = _mm256_srli_epi16::<9>(e);
        let lo = _mm256_shuffle_epi8(parity, _mm256_and_si256(s, _mm256_set1_epi16(15)));
        let hi = _mm256_shuffle_epi8(parity, _mm256_srli_epi16::<4>(s));
        _mm256_or_si256(s, _mm256_slli_epi16::<7>(_mm256_xor_si256(lo, hi)))
    }
}

impl Micro for Iq2XsMask {
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
        // (trait contract), so every offset below is inside block b of its row; grid
        // indices are masked to 9 bits (512 entries); the driver enables AVX2/FMA/F16C and
        // AVX-512 F/BW/VL.
        unsafe {
            let m4 = _mm_set1_epi8(15);
            let one8 = _mm_set1_epi8(1);
            let idx_mask = _mm256_set1_epi16(511);
            let zero = _mm256_setzero_si256();
            let split = _mm256_setr_epi8(
                0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                2, 3, 2, 3,
            );
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb) * 0.125;
                let e0 = load256(wb.add(2));
                let e1 = load256(wb.add(34));
                // Sign masks: byte 4ib + l belongs to entry l of group ib.
                let mut sm = [0u32; 8];
                _mm_storeu_si128(
                    sm.as_mut_ptr() as *mut _,
                    _mm256_cvtepi16_epi8(sign_masks(e0)),
                );
                _mm_storeu_si128(
                    sm.as_mut_ptr().add(4) as *mut _,
                    _mm256_cvtepi16_epi8(sign_masks(e1)),
                );
                let mut gi = [0u16; 32];
                _mm256_storeu_si256(gi.as_mut_ptr() as *mut _, _mm256_and_si256(e0, idx_mask));
                _mm256_storeu_si256(
                    gi.as_mut_ptr().add(16) as *mut _,
                    _mm256_and_si256(e1, idx_mask),
                );
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
                    let g = |l: usize| *IQ2XS_GRID.get_unchecked(gi[4 * ib + l] as usize) as i64;
                    let q = _mm256_setr_epi64x(g(0), g(1), g(2), g(3));
                    let neg: __mmask32 = sm[ib];
                    let ls = _mm256_shuffle_epi8(
                        _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(ib as i32)),
                        split,
                    );
                    for i in 0..NA {
                        let av = load256(ab[i].add(4 + 32 * ib));
                        let av = _mm256_mask_sub_epi8(av, neg, zero, av);
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
