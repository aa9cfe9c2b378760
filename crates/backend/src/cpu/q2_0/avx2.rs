//! Q2_0 / PQ2_0 × Q8_0 micro-kernel, AVX2 + FMA + F16C.
//!
//! Block: `d: f16`, then 8 bytes of 2-bit codes per 32 weights (weight `4i + p` in bits
//! `2p` of byte `i`). One u64 broadcast and shifted by 0, 2, 4, 6 per 64-bit lane, then
//! masked, gives the codes in the order `[p][i]`, which is how the driver laid out the
//! activation (`Perm::Stride4`). `maddubs` (codes unsigned 0..=3) + `madd` sum them into
//! eight i32 lanes; the code offset is `−Σa` per lane from the driver's lane sums.
//! Tested against the quant crate's `q2_0::dot` / `pq2_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16};
use std::arch::x86_64::*;

/// `SUB` 32-weight sub-blocks under one scale.
pub(crate) struct Codes2<const SUB: usize>;

impl<const SUB: usize> WideMicro for Codes2<SUB> {
    const BLOCK: usize = 32 * SUB;
    const BYTES: usize = 2 + 8 * SUB;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        nb: usize,
        qs: *const i8,
        dl: *const f32,
        sa: *const i32,
        k: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): block b < nb of the weight row and quants/lane data of
        // weights BLOCK·b .. BLOCK·(b+1) of activation rows i < NA are inside their buffers
        // (trait contract); the caller enables AVX2/FMA/F16C.
        unsafe {
            let m3 = _mm256_set1_epi8(3);
            let ones16 = _mm256_set1_epi16(1);
            let shifts = _mm256_setr_epi64x(0, 2, 4, 6);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let dw = _mm256_set1_ps(load_f16(wb));
                let mut t = [_mm256_setzero_ps(); NA];
                for s in 0..SUB {
                    let v = (wb.add(2 + 8 * s) as *const i64).read_unaligned();
                    let c = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(v), shifts), m3);
                    for i in 0..NA {
                        let at = Self::BLOCK * b + 32 * s;
                        let a = load256(qs.add(i * k + at) as *const u8);
                        let lane = i * k / 4 + at / 4;
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(c, a), ones16);
                        let isum = _mm256_sub_epi32(p, load256(sa.add(lane) as *const u8));
                        let d = _mm256_loadu_ps(dl.add(lane));
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
