//! IQ2_S × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (82 B): `d: f16`, `qs[32]` (low 8 bits of the 10-bit grid index of each 8
//! weights; 1024-entry table of 8 magnitudes), `signs[32]` (one bit per weight), `qh[8]`
//! (bits 2l, 2l + 1 of byte ib: the top index bits of entry l of group ib), `scales[8]`
//! (4 bits per 16 weights). The 32 sign bits of a group become ±1 bytes with one
//! broadcast, `pshufb` and compare; the two 16-weight scales `2s + 1` (one per 128-bit
//! lane) multiply in the `madd`. Per block: `0.125 · d_w · d_a · Σ`.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q1_0::avx2::sign_bytes;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq_grids::IQ2S_GRID;
use std::arch::x86_64::*;

/// `MASK`: apply the sign bits through a mask register (`0 − a` where set; AVX-512 BW/VL
/// driver only) instead of expanding them to ±1 bytes for `psignb`.
pub(crate) struct Iq2S<const MASK: bool>;

impl<const MASK: bool> Micro for Iq2S<MASK> {
    const BYTES: usize = 82;

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
        // indices are 10 bits (1024 entries) by construction; the driver enables AVX2/FMA/F16C, and AVX-512 F/BW/VL where `MASK`.
        unsafe {
            let zero = _mm256_setzero_si256();
            let m4 = _mm_set1_epi8(15);
            let one8 = _mm_set1_epi8(1);
            let m300 = _mm256_set1_epi16(0x300);
            let mults = _mm256_setr_epi16(
                256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4, 256, 64, 16, 4,
            );
            let spread0 = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            let spread1 = _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
            let split = _mm256_setr_epi8(
                0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                2, 3, 2, 3,
            );
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb) * 0.125;
                let mut sumi = [_mm256_setzero_si256(); NA];
                // The 32 grid indices at once: the low byte from qs, bits 8..10 from bits
                // 2l, 2l + 1 of qh[ib] (entry 4ib + l), as `(qh << (8 − 2l)) & 0x300` with
                // one 16-bit multiply by 2^(8 − 2l).
                let qh8 = _mm_loadl_epi64(wb.add(66) as *const _);
                let mut gi = [0u16; 32];
                for (h, spread) in [spread0, spread1].into_iter().enumerate() {
                    let lo = _mm256_cvtepu8_epi16(_mm_loadu_si128(wb.add(2 + 16 * h) as *const _));
                    let hv = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(qh8, spread));
                    let hi = _mm256_and_si256(_mm256_mullo_epi16(hv, mults), m300);
                    _mm256_storeu_si256(
                        gi.as_mut_ptr().add(16 * h) as *mut _,
                        _mm256_or_si256(lo, hi),
                    );
                }
                // The sixteen 4-bit scales as i16 `2s + 1`, in the order [ib][half].
                let sc = _mm_loadl_epi64(wb.add(74) as *const _);
                let lo = _mm_and_si128(sc, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
                let odd = _mm_add_epi8(
                    _mm_add_epi8(_mm_unpacklo_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)),
                    one8,
                );
                let scales = _mm256_cvtepu8_epi16(odd);
                for ib in 0..8 {
                    let grid = |l: usize| *IQ2S_GRID.get_unchecked(gi[4 * ib + l] as usize) as i64;
                    let q = _mm256_setr_epi64x(grid(0), grid(1), grid(2), grid(3));
                    let bits = (wb.add(34 + 4 * ib) as *const u32).read_unaligned();
                    // A set bit negates: `sign_bytes` gives −1 for clear bits, so invert.
                    let sgn = if MASK { zero } else { sign_bytes(!bits) };
                    // [2s+1 of weights 0..16 ×8 | of weights 16..32 ×8]: i32 lane ib of
                    // `scales` holds both i16; broadcast it, then split the halves.
                    let ls = _mm256_shuffle_epi8(
                        _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(ib as i32)),
                        split,
                    );
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
