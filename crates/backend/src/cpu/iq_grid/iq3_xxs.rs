//! IQ3_XXS × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (98 B): `d: f16`, 64 grid-index bytes (256-entry table of 4 magnitudes, two
//! entries per 8 weights), then per 32 weights a u32 with four 7-bit sign indices and the
//! 4-bit scale in its top bits. Signs from the ±1 byte table shared with IQ2_XS
//! (`SIGNS64`); the scale `2s + 1` multiplies in the `madd`. Per block:
//! `0.25 · d_w · d_a · Σ`.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use super::iq2_xxs::sign_masks_7x4;
use crate::cpu::iq2_xs::avx2::SIGNS64;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ3XXS_GRID;
use std::arch::x86_64::*;

/// `MASK`: apply the signs through a mask register, as `Iq2Xxs<true>`.
pub(crate) struct Iq3Xxs<const MASK: bool>;

impl<const MASK: bool> Micro for Iq3Xxs<MASK> {
    const BYTES: usize = 98;

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
                let dw = load_f16(wb) * 0.25;
                let mut sumi = [_mm256_setzero_si256(); NA];
                let mut sm = [0u32; 8];
                if MASK {
                    _mm256_storeu_si256(
                        sm.as_mut_ptr() as *mut _,
                        sign_masks_7x4(load256(wb.add(66))),
                    );
                }
                for ib in 0..8 {
                    let g = wb.add(2 + 8 * ib);
                    let aux = (wb.add(66 + 4 * ib) as *const u32).read_unaligned();
                    let grid = |j: usize| *IQ3XXS_GRID.get_unchecked(*g.add(j) as usize) as i32;
                    let q = _mm256_setr_epi32(
                        grid(0),
                        grid(1),
                        grid(2),
                        grid(3),
                        grid(4),
                        grid(5),
                        grid(6),
                        grid(7),
                    );
                    let s =
                        |l: u32| *SIGNS64.get_unchecked(((aux >> (7 * l)) & 127) as usize) as i64;
                    let sgn = if MASK {
                        zero
                    } else {
                        _mm256_setr_epi64x(s(0), s(1), s(2), s(3))
                    };
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
