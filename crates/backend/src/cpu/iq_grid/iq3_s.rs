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
        // indices are 9 bits (512 entries); the driver enables AVX2/FMA/F16C, and AVX-512 F/BW/VL where `MASK`.
        unsafe {
            let zero = _mm256_setzero_si256();
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let g = wb.add(2 + 8 * ib);
                    let qh = *wb.add(66 + ib) as usize;
                    let grid = |j: usize| {
                        let idx = *g.add(j) as usize | ((qh >> j) & 1) << 8;
                        *IQ3S_GRID.get_unchecked(idx) as i32
                    };
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
