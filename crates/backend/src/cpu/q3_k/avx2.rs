//! Q3_K × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (110 B): `hmask[32]`, `qs[64]`, `scales[12]` (sixteen 6-bit scales,
//! offset 32), `d: f16`. Chunk k of half h (weights 128h + 32k .. +32): low bits
//! `(qs[32h ..] >> 2k) & 3`, high bit `(hmask[l] >> (4h + k)) & 1`; first 16 weights group
//! 8h + 2k, next 16 group 8h + 2k + 1.
//!
//! With `u = low | high << 2` (0..7) the quant is `u − 4`, so per block and row pair:
//! `d · d_a · (Σ_g s_g Σ u·a − 4 Σ_g s_g bsum_g)`: `maddubs(u, a)`, `madd` with the chunk's
//! two scales, and the offset as one `madd` of the bsums with 4·scales. Tested against the
//! quant crate's `q3_k::dot` in tests/kernels_k.rs.

use crate::cpu::q4_k::avx2::scale_selectors;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, shift16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q3K;

/// The twelve scale bytes at `s` as sixteen signed scales (offset removed), one byte each.
///
/// # Safety
/// `s` must be valid for reading 12 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales(s: *const u8) -> __m128i {
    // SAFETY: 12 readable bytes at s (caller).
    let (u0, u1, u2) = unsafe {
        let p = s as *const u32;
        (
            p.read_unaligned(),
            p.add(1).read_unaligned(),
            p.add(2).read_unaligned(),
        )
    };
    const LO: u32 = 0x0f0f_0f0f;
    const HI: u32 = 0x0303_0303;
    let s0 = (u0 & LO) | ((u2 & HI) << 4);
    let s1 = (u1 & LO) | (((u2 >> 2) & HI) << 4);
    let s2 = ((u0 >> 4) & LO) | (((u2 >> 4) & HI) << 4);
    let s3 = ((u1 >> 4) & LO) | (((u2 >> 6) & HI) << 4);
    _mm_sub_epi8(
        _mm_setr_epi32(s0 as i32, s1 as i32, s2 as i32, s3 as i32),
        _mm_set1_epi8(32),
    )
}

impl Micro for Q3K {
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
        let m3 = _mm256_set1_epi8(3);
        let bit2 = _mm256_set1_epi8(4);
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
                let sc = scales(wb.add(96));
                let d = load_f16(wb.add(108));
                let sc_pairs = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, evens_odds));
                let sc4 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc), 2);
                let hv = load256(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for h in 0..2 {
                    let qv = load256(wb.add(32 + 32 * h));
                    for k in 0..4 {
                        // High bit 4h + k of each hmask byte to bit 2: shifts of at most 2
                        // left / 5 right never carry a neighbour's bit into bit 2.
                        let hb = _mm256_and_si256(shift16(hv, 2 - (4 * h + k) as i32), bit2);
                        let q =
                            _mm256_or_si256(_mm256_and_si256(shift16(qv, -2 * k as i32), m3), hb);
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
                    let da = (ab[i] as *const f32).read_unaligned();
                    let s =
                        _mm256_sub_epi32(sumi[i], _mm256_madd_epi16(load256(ab[i].add(260)), sc4));
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * da), acc[i]);
                }
            }
        }
        for (i, v) in acc.iter().enumerate() {
            // SAFETY: output cell i is inside the tile (trait contract).
            unsafe { *out.add(i * stride) = hsum_ps(*v) };
        }
    }
}
