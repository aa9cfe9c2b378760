//! TQ1_0 × Q8_K micro-kernel, AVX2 + FMA + F16C (also built with AVX-512VL encodings by
//! the shared driver).
//!
//! Weight block (54 B): `qs[48]`, `qh[4]`, `d: f16`. Digit n of a trit byte b is
//! `((b·3ⁿ mod 256)·3) >> 8`: `b·3ⁿ mod 256` is the byte tripled n times with wrapping
//! adds, and the digit is two unsigned compares of it (`trits`). 32 digits at a time meet 32 contiguous
//! activation quants: the 32-byte stage gives weights 32n.., the 16-byte stage two digits
//! per vector (weights 160 + 16n..), and its last digit shares a vector with the 16 `qh`
//! digits (weights 240 + 4n + h). `Σ(t − 1)·a = Σ t·a − Σ a` with `Σ a` from the bsums.
//! Tested against the quant crate's `tq1_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Tq1_0;

/// `q · 3` per byte, wrapping (the next digit's `b · 3ⁿ mod 256`).
#[inline(always)]
pub(crate) unsafe fn x3(q: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe { _mm256_add_epi8(q, _mm256_add_epi8(q, q)) }
}

/// The trit `⌊3q / 256⌋` of each byte `q = b · 3ⁿ mod 256`, as bytes 0..=2: `[q ≥ 86] +
/// [q ≥ 171]` (3 · 85 < 256 ≤ 3 · 86, 3 · 170 < 512 ≤ 3 · 171), from unsigned max +
/// compare. No multiplies: an earlier 16-bit `mullo`/`mulhi` form kept the multiplier ports,
/// which `maddubs`/`madd` need too, busy (TQ1_0 hot 19 -> 28 G weights/s).
#[inline(always)]
pub(crate) unsafe fn trits(q: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let ge = |t: i8| _mm256_cmpeq_epi8(_mm256_max_epu8(q, _mm256_set1_epi8(t)), q);
        _mm256_sub_epi8(
            _mm256_setzero_si256(),
            _mm256_add_epi8(ge(86), ge(171u8 as i8)),
        )
    }
}

/// `q · 3` per byte of an xmm, wrapping.
#[inline(always)]
pub(crate) unsafe fn x3_128(q: __m128i) -> __m128i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe { _mm_add_epi8(q, _mm_add_epi8(q, q)) }
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
                // 32-byte stage: digit n of byte m is weight 32n + m.
                let mut q = load256(wb);
                for n in 0..5 {
                    add(trits(q), 32 * n);
                    if n < 4 {
                        q = x3(q);
                    }
                }
                // 16-byte stage (weight 160 + 16n + m): digits 0 | 1, then 2 | 3, then 4.
                let u = _mm_loadu_si128(wb.add(32) as *const _);
                let q01 = _mm256_setr_m128i(u, x3_128(u));
                add(trits(q01), 160);
                let q23 = x3(x3(q01));
                add(trits(q23), 192);
                // Digit 4 of the 16-byte stage, then the qh bytes h at weight 240 + 4n + h:
                // [h, 3h, 9h, 27h].
                let u81 = x3_128(x3_128(_mm256_castsi256_si128(q23)));
                let h1 = _mm_cvtsi32_si128((wb.add(48) as *const i32).read_unaligned());
                let h3 = x3_128(h1);
                let h9 = x3_128(h3);
                let h27 = x3_128(h9);
                let hq =
                    _mm_unpacklo_epi64(_mm_unpacklo_epi32(h1, h3), _mm_unpacklo_epi32(h9, h27));
                add(trits(_mm256_setr_m128i(u81, hq)), 224);
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
