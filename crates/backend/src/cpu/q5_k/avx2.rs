//! Q5_K × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (176 B): `d, dmin: f16`, `scales[12]` (as Q4_K), `qh[32]`, `qs[128]`.
//! Chunk c (weights 64c..64c+64): low nibbles of `qs[32c..]` plus bit 2c of `qh[l]` ·16 =
//! sub-block 2c, high nibbles plus bit 2c+1 = sub-block 2c+1.
//!
//! Per block and row pair: `d_a · (d · Σ_j sc_j Σ q·a − dmin · Σ_j m_j (bsum_2j + bsum_2j+1))`,
//! the Q4_K scheme with 5-bit `q` (|maddubs pair| ≤ 2·31·127 < 2¹⁵). Tested against the
//! quant crate's `q5_k::dot` in tests/kernels_k.rs.

use crate::cpu::q4_k::avx2::{prep, scale_selectors};
use crate::cpu::q8_k::avx2::{hsum_ps, load256, shift16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q5K;

impl Micro for Q5K {
    const BYTES: usize = 176;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let m4 = _mm256_set1_epi8(0x0f);
        let bit4 = _mm256_set1_epi8(0x10);
        let ctrl = scale_selectors();
        let mut acc = [_mm256_setzero_ps(); NA];
        for b in 0..nb {
            // SAFETY (whole block): the weight row and activation rows i < NA are nb blocks
            // long (trait contract), so every offset below is inside block b of its row.
            unsafe {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let p = prep(wb);
                let hv = load256(wb.add(16));
                let mut sumi = [_mm256_setzero_si256(); NA];
                for c in 0..4 {
                    let qv = load256(wb.add(48 + 32 * c));
                    // Move high bit 2c (2c+1) of each byte to bit 4; the 16-bit shifts by
                    // at most 4 left / 3 right never carry a neighbour's bit into bit 4.
                    let c2 = 2 * c as i32;
                    let lo = _mm256_or_si256(
                        _mm256_and_si256(qv, m4),
                        _mm256_and_si256(shift16(hv, 4 - c2), bit4),
                    );
                    let hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4),
                        _mm256_and_si256(shift16(hv, 3 - c2), bit4),
                    );
                    let slo = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c]);
                    let shi = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c + 1]);
                    for i in 0..NA {
                        let pl = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(lo, load256(ab[i].add(4 + 64 * c))),
                            slo,
                        );
                        let ph = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(hi, load256(ab[i].add(36 + 64 * c))),
                            shi,
                        );
                        sumi[i] = _mm256_add_epi32(sumi[i], _mm256_add_epi32(pl, ph));
                    }
                }
                for i in 0..NA {
                    let da = _mm256_set1_ps((ab[i] as *const f32).read_unaligned());
                    let mins =
                        _mm256_cvtepi32_ps(_mm256_madd_epi16(load256(ab[i].add(260)), p.mins));
                    let f = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[i]), p.d);
                    let f = _mm256_fnmadd_ps(mins, p.dmin, f);
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
