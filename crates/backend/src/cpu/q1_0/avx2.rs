//! Q1_0 × Q8_0 micro-kernel, AVX2 + FMA + F16C.
//!
//! Per 32 weights (one activation block): the 32 sign bits become a byte mask (broadcast,
//! `pshufb` byte `j/8` to lane `j`, test bit `j%8`), `psignb` turns `a` into `±a`, and
//! `maddubs` with ones + `madd` with ones sums it into eight i32 lanes; the lanes are scaled
//! by the activation block's scale and, per 128-weight block, by the weight scale.
//! Tested against the quant crate's `q1_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16};
use std::arch::x86_64::*;

pub(crate) struct Q1_0;

/// `−1` in byte `j` where bit `j` of `bits` is clear, `+1` where it is set.
#[inline(always)]
pub(crate) unsafe fn sign_bytes(bits: u32) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let v = _mm256_set1_epi32(bits as i32);
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let clear = _mm256_cmpeq_epi8(
            _mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit),
            _mm256_setzero_si256(),
        );
        _mm256_or_si256(clear, _mm256_set1_epi8(1))
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
        // contract); the caller enables AVX2/FMA/F16C.
        unsafe {
            let ones8 = _mm256_set1_epi8(1);
            let ones16 = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * 18);
                let dw = _mm256_set1_ps(load_f16(wb));
                let mut t = [_mm256_setzero_ps(); NA];
                for s in 0..4 {
                    let sgn = sign_bytes((wb.add(2 + 4 * s) as *const u32).read_unaligned());
                    for i in 0..NA {
                        let a = load256(qs.add(i * k + 128 * b + 32 * s) as *const u8);
                        let p = _mm256_maddubs_epi16(ones8, _mm256_sign_epi8(a, sgn));
                        let isum = _mm256_madd_epi16(p, ones16);
                        let d = _mm256_loadu_ps(dl.add(i * k / 4 + 32 * b + 8 * s));
                        t[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, t[i]);
                    }
                }
                for i in 0..NA {
                    acc[i] = _mm256_fmadd_ps(t[i], dw, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
