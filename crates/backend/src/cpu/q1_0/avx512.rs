//! Q1_0 × Q8_0 micro-kernel, AVX-512 F/BW/VL/VNNI.
//!
//! The driver lays the activation out in `Perm::Halves16` order: per 128 weights, one zmm
//! holds the first 16 quants of each of the four 32-weight activation blocks (one block per
//! 128-bit lane), the next zmm their second 16. The weight's 128 sign bits are regrouped
//! to match (u16 halves of each block's u32, one `pshufb`) and become the masks of masked
//! byte subtractions (`a` where the bit is set, `0 − a` where clear; Q8_0 quants lie in
//! −127..=127, so the negation never wraps). Two chained `vpdpbusd` against ones sum both
//! zmm into the same sixteen i32 lanes, four per block, which meet their activation scales
//! in one FMA per 128 weights (scaled by the weight's f16 scale). Tested against the quant
//! crate's `q1_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::load_f16;
use std::arch::x86_64::*;

pub(crate) struct Q1_0;

/// The horizontal sums of four accumulators, in lanes 0..4.
#[inline(always)]
pub(crate) unsafe fn hsum4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m128 {
    // SAFETY: register-only intrinsics; the caller enables AVX-512F.
    unsafe {
        let half = |v: __m512| {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            _mm256_add_ps(_mm512_castps512_ps256(v), hi)
        };
        let ab = _mm256_hadd_ps(half(a), half(b));
        let cd = _mm256_hadd_ps(half(c), half(d));
        let h = _mm256_hadd_ps(ab, cd);
        _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h))
    }
}

impl WideMicro for Q1_0 {
    const BLOCK: usize = 128;
    const BYTES: usize = 18;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        nb: usize,
        qs: *const i8,
        dl: *const f32,
        _sa: *const i32,
        k: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): block b < nb of the weight row and quants/scales
        // 128b .. 128b + 128 of activation rows i < NA are inside their buffers (trait
        // contract); the caller enables AVX-512 F/BW/VL/VNNI.
        unsafe {
            let ones = _mm512_set1_epi8(1);
            let zero = _mm512_setzero_si512();
            // u16 halves 0, 2, 4, 6 (first 16 bits of each block) then 1, 3, 5, 7.
            let regroup = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
            let mut acc = [_mm512_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * 18);
                let dw = _mm512_set1_ps(load_f16(wb));
                let bits = _mm_shuffle_epi8(_mm_loadu_si128(wb.add(2) as *const _), regroup);
                let m0: __mmask64 = _mm_cvtsi128_si64(bits) as u64;
                let m1: __mmask64 = _mm_extract_epi64::<1>(bits) as u64;
                for i in 0..NA {
                    let q = qs.add(i * k + 128 * b);
                    let a0 = _mm512_loadu_si512(q as *const _);
                    let a1 = _mm512_loadu_si512(q.add(64) as *const _);
                    let s0 = _mm512_mask_sub_epi8(a0, !m0, zero, a0);
                    let s1 = _mm512_mask_sub_epi8(a1, !m1, zero, a1);
                    let isum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, ones, s0), ones, s1);
                    let d = _mm512_mul_ps(_mm512_loadu_ps(dl.add(i * k / 4 + 32 * b)), dw);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = _mm512_reduce_add_ps(*v);
            }
        }
    }

    /// Four weight rows against one activation row: the activation quants and their
    /// negation are loaded once per block for all four; each row then only turns its sign
    /// bits into two blends and two `vpdpbusd`.
    #[inline(always)]
    unsafe fn rows4(
        w: *const u8,
        wrb: usize,
        nb: usize,
        qs: *const i8,
        dl: *const f32,
        _sa: *const i32,
        _k: usize,
        out: *mut f32,
    ) {
        // SAFETY (whole body): blocks b < nb of weight rows r < 4 (`wrb` apart) and quants
        // / scales 128b .. 128b + 128 of the activation row are inside their buffers
        // (trait contract); four outputs follow `out`; the caller enables AVX-512
        // F/BW/VL/VNNI.
        unsafe {
            let ones = _mm512_set1_epi8(1);
            let zero = _mm512_setzero_si512();
            let regroup = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
            let mut acc = [_mm512_setzero_ps(); 4];
            for b in 0..nb {
                let q = qs.add(128 * b);
                let a0 = _mm512_loadu_si512(q as *const _);
                let a1 = _mm512_loadu_si512(q.add(64) as *const _);
                let (n0, n1) = (_mm512_sub_epi8(zero, a0), _mm512_sub_epi8(zero, a1));
                let d = _mm512_loadu_ps(dl.add(32 * b));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let wb = w.add(r * wrb + b * 18);
                    let bits = _mm_shuffle_epi8(_mm_loadu_si128(wb.add(2) as *const _), regroup);
                    let m0: __mmask64 = _mm_cvtsi128_si64(bits) as u64;
                    let m1: __mmask64 = _mm_extract_epi64::<1>(bits) as u64;
                    let s0 = _mm512_mask_blend_epi8(m0, n0, a0);
                    let s1 = _mm512_mask_blend_epi8(m1, n1, a1);
                    let isum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, ones, s0), ones, s1);
                    let t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d);
                    *acc = _mm512_fmadd_ps(t, _mm512_set1_ps(load_f16(wb)), *acc);
                }
            }
            _mm_storeu_ps(out, hsum4(acc[0], acc[1], acc[2], acc[3]));
        }
    }
}
