//! Q1_0 × Q8_0 micro-kernel, AVX-512 F/BW/VL/VNNI.
//!
//! Per 64 weights (two activation blocks, one zmm): the 64 sign bits are the mask of a
//! masked byte subtraction (`a` where the bit is set, `0 − a` where clear), and one
//! `vpdpbusd` against ones sums each four bytes into sixteen i32 lanes (lanes 0..8 one
//! activation block, 8..16 the next), which meet their activation scales lane by lane;
//! per 128-weight block the weight scale multiplies once. Q8_0 quants lie in −127..=127,
//! so the negation never wraps. Tested against the quant crate's `q1_0::dot` in
//! tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::load_f16;
use std::arch::x86_64::*;

pub(crate) struct Q1_0;

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
            let mut acc = [_mm512_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * 18);
                let dw = _mm512_set1_ps(load_f16(wb));
                let m0: __mmask64 = (wb.add(2) as *const u64).read_unaligned();
                let m1: __mmask64 = (wb.add(10) as *const u64).read_unaligned();
                for i in 0..NA {
                    let q = qs.add(i * k + 128 * b);
                    let a0 = _mm512_loadu_si512(q as *const _);
                    let a1 = _mm512_loadu_si512(q.add(64) as *const _);
                    let s0 = _mm512_mask_sub_epi8(a0, !m0, zero, a0);
                    let s1 = _mm512_mask_sub_epi8(a1, !m1, zero, a1);
                    let i0 = _mm512_dpbusd_epi32(zero, ones, s0);
                    let i1 = _mm512_dpbusd_epi32(zero, ones, s1);
                    let d = dl.add(i * k / 4 + 32 * b);
                    let t = _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_loadu_ps(d));
                    let t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_loadu_ps(d.add(16)), t);
                    acc[i] = _mm512_fmadd_ps(t, dw, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = _mm512_reduce_add_ps(*v);
            }
        }
    }
}
