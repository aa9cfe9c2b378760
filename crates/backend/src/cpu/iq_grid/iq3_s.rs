//! IQ3_S × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (110 B): `d: f16`, `qs[64]` (low 8 bits of the 9-bit grid indices, two per
//! 8 weights; 512-entry table of 4 magnitudes), `qh[8]` (bit j of byte ib: the ninth bit of
//! index j of group ib), `signs[32]` (one bit per weight), `scales[4]` (4 bits per 32
//! weights). The 32 sign bits of a group become ±1 bytes with one broadcast, `pshufb`
//! and compare; the scale `2s + 1` multiplies in the `madd`. Per block: `d_w · d_a · Σ`.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q1_0::avx2::sign_bytes;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ3S_GRID;
use std::arch::x86_64::*;

/// `MASK`: apply the sign bits through a mask register (`0 − a` where set; AVX-512 BW/VL
/// driver only) instead of expanding them to ±1 bytes for `psignb`.
pub(crate) struct Iq3S<const MASK: bool>;

impl<const MASK: bool> Micro for Iq3S<MASK> {
    const BYTES: usize = 110;

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
        // indices are 9 bits (512 entries) by construction; the driver enables AVX2/FMA/F16C, and AVX-512 F/BW/VL where `MASK`.
        unsafe {
            let zero = _mm256_setzero_si256();
            let m100 = _mm256_set1_epi16(0x100);
            let mults =
                _mm256_setr_epi16(256, 128, 64, 32, 16, 8, 4, 2, 256, 128, 64, 32, 16, 8, 4, 2);
            let spread0 = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                // The 64 grid indices at once: the low byte from qs, bit 8 from bit j of
                // qh[ib] (index j of group ib), as `(qh << (8 − j)) & 0x100` with one 16-bit
                // multiply by 2^(8 − j).
                let qh8 = _mm_loadl_epi64(wb.add(66) as *const _);
                let mut gi = [0u16; 64];
                for h in 0..4 {
                    let lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(wb.add(2 + 16 * h) as *const _));
                    let spread = _mm_add_epi8(spread0, _mm_set1_epi8(2 * h as i8));
                    let hv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(qh8, spread));
                    let hi = _mm256_and_si256(_mm256_mullo_epi16(hv, mults), m100);
                    _mm256_storeu_si256(
                        gi.as_mut_ptr().add(16 * h) as *mut _,
                        _mm256_or_si256(lo, hi),
                    );
                }
                for ib in 0..8 {
                    let grid = |j: usize| *IQ3S_GRID.get_unchecked(gi[8 * ib + j] as usize) as i32;
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
                    let bits = (wb.add(74 + 4 * ib) as *const u32).read_unaligned();
                    // A set bit negates: `sign_bytes` gives −1 for clear bits, so invert.
                    let sgn = if MASK { zero } else { sign_bytes(!bits) };
                    let s = (*wb.add(106 + ib / 2) >> (4 * (ib % 2))) & 15;
                    let ls = _mm256_set1_epi16(2 * s as i16 + 1);
                    for i in 0..NA {
                        let av = load256(ab[i].add(4 + 32 * ib));
                        let av = if MASK {
                            _mm256_mask_sub_epi8(av, bits, zero, av)
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
