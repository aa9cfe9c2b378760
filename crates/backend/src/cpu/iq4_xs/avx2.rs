//! IQ4_XS × Q8_K micro-kernel, AVX2 + FMA + F16C (also built with AVX-512VL encodings by
//! the shared driver).
//!
//! Weight block (136 B): `d: f16`, `scales_h: u16`, `scales_l[4]`, `qs[128]`. Per 32-weight
//! group: 16 index bytes → low/high nibbles → `pshufb` of `kvalues_iq4nl` → signed values
//! `v`; `maddubs(|v|, sign(a, v))` then `madd` with the group's `ls − 32` sums into i32
//! lanes, exact per block; per block `d_w · d_a · Σ`. Tested against the quant crate's
//! `iq4_xs::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, Micro};
use neagari_quant::iq4_nl::KVALUES;
use std::arch::x86_64::*;

pub(crate) struct Iq4Xs;

impl Micro for Iq4Xs {
    const BYTES: usize = 136;

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
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr() as *const _));
            let m4 = _mm_set1_epi8(15);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb);
                let sh = (wb.add(2) as *const u16).read_unaligned();
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let lo = (*wb.add(4 + ib / 2) >> (4 * (ib % 2))) & 15;
                    let ls = (lo as i16 | ((((sh >> (2 * ib)) & 3) as i16) << 4)) - 32;
                    let raw = _mm_loadu_si128(wb.add(8 + 16 * ib) as *const _);
                    let idx = _mm256_setr_m128i(
                        _mm_and_si128(raw, m4),
                        _mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                    );
                    let v = _mm256_shuffle_epi8(table, idx);
                    let av = _mm256_sign_epi8(v, v);
                    let s = _mm256_set1_epi16(ls);
                    for i in 0..NA {
                        let q = load256(ab[i].add(4 + 32 * ib));
                        let p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(q, v));
                        sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(p, s));
                    }
                }
                for i in 0..NA {
                    let da = (ab[i] as *const f32).read_unaligned();
                    acc[i] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(sumi[i]),
                        _mm256_set1_ps(dw * da),
                        acc[i],
                    );
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
