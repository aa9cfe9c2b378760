//! Q1_0 × Q8_0 micro-kernel, AVX2 + FMA + F16C.
//!
//! The driver lays the activation out in `Perm::Halves16` order (per 128 weights: the first
//! 16 quants of each 32-block, then the second 16). Per 32 of those: the matching 32 sign
//! bits become a byte mask (broadcast, `pshufb` byte `j/8` to lane `j`, test bit `j%8`),
//! `psignb` turns `a` into `±a`, and `maddubs` + `madd` with ones sum it into eight i32
//! lanes, four per activation block; both halves of a block add up in the same lanes
//! before they meet the block's scale, and per 128 weights the weight scale.
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
                // Sign bits of each ymm of the Halves16 layout: 16 bits of block 2r, then
                // 16 of block 2r + 1, first halves (h = 0) or second halves (h = 1).
                let h16 = |blk: usize, h: usize| {
                    (wb.add(2 + 4 * blk + 2 * h) as *const u16).read_unaligned() as u32
                };
                let sgn = |r: usize, h: usize| sign_bytes(h16(2 * r, h) | h16(2 * r + 1, h) << 16);
                let (s00, s10, s01, s11) = (sgn(0, 0), sgn(1, 0), sgn(0, 1), sgn(1, 1));
                for i in 0..NA {
                    let q = qs.add(i * k + 128 * b) as *const u8;
                    let part = |off: usize, s: __m256i| {
                        let p =
                            _mm256_maddubs_epi16(ones8, _mm256_sign_epi8(load256(q.add(off)), s));
                        _mm256_madd_epi16(p, ones16)
                    };
                    // Blocks 0, 1 (first halves at 0, second at 64), then blocks 2, 3.
                    let i01 = _mm256_add_epi32(part(0, s00), part(64, s01));
                    let i23 = _mm256_add_epi32(part(32, s10), part(96, s11));
                    let d = dl.add(i * k / 4 + 32 * b);
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(i01), _mm256_loadu_ps(d));
                    let t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i23), _mm256_loadu_ps(d.add(8)), t);
                    acc[i] = _mm256_fmadd_ps(t, dw, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
