//! PTQ1_0 × Q8_0 micro-kernel, AVX2 + FMA + F16C.
//!
//! Block (28 B): `qs[24]`, `qh[2]`, `d: f16`. The trits come in stages: the 16 bytes at 0
//! give weights 16n + m (digit n, byte m), the 8 bytes at 16 give 80 + 8n + m, the two qh
//! bytes give 120 + 2n + h. Digits are extracted as in TQ1_0 (`tq1_0::avx2::trits`: the
//! byte tripled n times, wrapping, then two unsigned compares); the stages are first placed so that each
//! ymm holds 32 consecutive weights, i.e. one Q8_0 activation block (`Perm::Identity`):
//! [s1·1 | s1·3], [s1·9 | s1·27], [s1·81 | s2·1, s2·3], [s2·9, s2·27 | s2·81, qh·1,3,9,27].
//! `maddubs` (codes unsigned 0..=2) + `madd` sum into eight i32 lanes; the code offset is
//! `−Σa` per lane from the driver's lane sums. Tested against the quant crate's
//! `ptq1_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16};
use crate::cpu::tq1_0::avx2::{trits, x3, x3_128};
use std::arch::x86_64::*;

pub(crate) struct Ptq1_0;

impl WideMicro for Ptq1_0 {
    const BLOCK: usize = 128;
    const BYTES: usize = 28;

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
        // weights 128b .. 128(b+1) of activation rows i < NA are inside their buffers
        // (trait contract); the caller enables AVX2/FMA/F16C.
        unsafe {
            let ones16 = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let dw = _mm256_set1_ps(load_f16(wb.add(26)));
                let s1 = _mm_loadu_si128(wb as *const _);
                let s2 = _mm_loadl_epi64(wb.add(16) as *const _);
                let h1 = _mm_cvtsi32_si128((wb.add(24) as *const u16).read_unaligned() as i32);
                // Bytes times 3ⁿ (wrapping), placed as in the module doc.
                let q01 = _mm256_setr_m128i(s1, x3_128(s1));
                let q23 = x3(x3(q01));
                let s1_81 = x3_128(x3_128(_mm256_castsi256_si128(q23)));
                let s2_01 = _mm_unpacklo_epi64(s2, x3_128(s2));
                let s2_23 = x3_128(x3_128(s2_01));
                let s2_4 = x3_128(_mm_unpackhi_epi64(s2_23, s2_23));
                let (h3, h9) = (x3_128(h1), x3_128(x3_128(h1)));
                let h27 = x3_128(h9);
                let hq =
                    _mm_unpacklo_epi32(_mm_unpacklo_epi16(h1, h3), _mm_unpacklo_epi16(h9, h27));
                let c = [
                    trits(q01),
                    trits(q23),
                    trits(_mm256_setr_m128i(s1_81, s2_01)),
                    trits(_mm256_setr_m128i(s2_23, _mm_unpacklo_epi64(s2_4, hq))),
                ];
                let mut t = [_mm256_setzero_ps(); NA];
                for (s, &c) in c.iter().enumerate() {
                    for i in 0..NA {
                        let at = 128 * b + 32 * s;
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
