//! TQ1_0 × Q8_K micro-kernel, AVX2 + FMA + F16C (also built with AVX-512VL encodings by
//! the shared driver).
//!
//! Weight block (54 B): `qs[48]`, `qh[4]`, `d: f16`. Digit n of a trit byte b is
//! `((b·3ⁿ mod 256)·3) >> 8`: with b in the high byte of a 16-bit lane, `mullo` by 3ⁿ
//! keeps `b·3ⁿ mod 256` there and `mulhi_epu16` by 3 yields the digit, for even and odd
//! bytes separately (one shifted into place). 32 digits at a time meet 32 contiguous
//! activation quants: the 32-byte stage gives weights 32n.., the 16-byte stage two digits
//! per vector (weights 160 + 16n..), and its last digit shares a vector with the 16 `qh`
//! digits (weights 240 + 4n + h). `Σ(t − 1)·a = Σ t·a − Σ a` with `Σ a` from the bsums.
//! Tested against the quant crate's `tq1_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Tq1_0;

/// The digits selected by the per-byte multipliers (3ⁿ at even bytes in `me`'s 16-bit
/// lanes, at odd bytes in `mo`'s) of the 32 bytes of `v`, as bytes 0..=2.
#[inline(always)]
pub(crate) unsafe fn digits(v: __m256i, me: __m256i, mo: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let three = _mm256_set1_epi16(3);
        let even = _mm256_mulhi_epu16(_mm256_mullo_epi16(_mm256_slli_epi16::<8>(v), me), three);
        let hi = _mm256_and_si256(v, _mm256_set1_epi16(0xff00u16 as i16));
        let odd = _mm256_mulhi_epu16(_mm256_mullo_epi16(hi, mo), three);
        _mm256_or_si256(even, _mm256_slli_epi16::<8>(odd))
    }
}

impl Micro for Tq1_0 {
    const BYTES: usize = 54;

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
        // (trait contract), so every offset below is inside block b of its row; the driver
        // enables AVX2/FMA/F16C.
        unsafe {
            let ones16 = _mm256_set1_epi16(1);
            let p = |n: usize| _mm256_set1_epi16([1i16, 3, 9, 27, 81][n]);
            let pair = |n: usize| {
                _mm256_setr_m128i(
                    _mm_set1_epi16([1i16, 3, 9, 27, 81][n]),
                    _mm_set1_epi16([1i16, 3, 9, 27, 81][n + 1]),
                )
            };
            // Last vector: digit 4 of the 16-byte stage, then qh byte h at byte 4n + h
            // with multiplier 3ⁿ (even and odd bytes share n: pairs sit inside one n).
            let last =
                _mm256_setr_m128i(_mm_set1_epi16(81), _mm_setr_epi16(1, 1, 3, 3, 9, 9, 27, 27));
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb.add(52));
                let mut sumi = [_mm256_setzero_si256(); NA];
                let mut add = |t: __m256i, at: usize| {
                    for i in 0..NA {
                        let av = load256(ab[i].add(4 + at));
                        sumi[i] = _mm256_add_epi32(
                            sumi[i],
                            _mm256_madd_epi16(_mm256_maddubs_epi16(t, av), ones16),
                        );
                    }
                };
                let v = load256(wb);
                for n in 0..5 {
                    add(digits(v, p(n), p(n)), 32 * n);
                }
                let u = _mm256_broadcastsi128_si256(_mm_loadu_si128(wb.add(32) as *const _));
                add(digits(u, pair(0), pair(0)), 160);
                add(digits(u, pair(2), pair(2)), 192);
                let h = _mm_set1_epi32((wb.add(48) as *const i32).read_unaligned());
                let x = _mm256_setr_m128i(_mm_loadu_si128(wb.add(32) as *const _), h);
                add(digits(x, last, last), 224);
                for i in 0..NA {
                    let asum = _mm256_madd_epi16(load256(ab[i].add(260)), ones16);
                    let isum = _mm256_sub_epi32(sumi[i], asum);
                    let da = (ab[i] as *const f32).read_unaligned();
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * da), acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
