//! IQ4_NL × Q8_0 micro-kernel, AVX2 + FMA + F16C.
//!
//! Block (18 B): `d: f16`, 16 bytes of index pairs (low nibbles = weights 0..16, high =
//! 16..32). The indices become table values with one `pshufb` of `kvalues_iq4nl` (16
//! entries, both lanes); the signed × signed product goes through `maddubs(|v|, sign(a, v))`
//! and `madd`. Tested against the quant crate's `iq4_nl::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16};
use neagari_quant::iq4_nl::KVALUES;
use std::arch::x86_64::*;

pub(crate) struct Iq4Nl;

impl WideMicro for Iq4Nl {
    const BLOCK: usize = 32;
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
        // SAFETY (whole body): block b < nb of the weight row and quants/scales of weights
        // 32b .. 32b + 32 of activation rows i < NA are inside their buffers (trait
        // contract); the caller enables AVX2/FMA/F16C.
        unsafe {
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const _));
            let m4 = _mm_set1_epi8(15);
            let ones16 = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * 18);
                let dw = _mm256_set1_ps(load_f16(wb));
                let raw = _mm_loadu_si128(wb.add(2) as *const _);
                let idx = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                    _mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                );
                let v = _mm256_shuffle_epi8(table, idx);
                let av = _mm256_sign_epi8(v, v);
                for i in 0..NA {
                    let a = load256(qs.add(i * k + 32 * b) as *const u8);
                    let p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(a, v));
                    let isum = _mm256_madd_epi16(p, ones16);
                    let d = _mm256_mul_ps(_mm256_loadu_ps(dl.add(i * k / 4 + 8 * b)), dw);
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), d, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
