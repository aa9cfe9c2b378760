//! TQ2_0 × Q8_K micro-kernel, AVX2 + FMA + F16C (also built with AVX-512VL encodings by
//! the shared driver).
//!
//! Weight block (66 B): `qs[64]`, `d: f16`. Half c of the block (32 bytes) shifted right by
//! 2l and masked gives the codes of weights 128c + 32l .. +32, which meet 32 contiguous
//! activation quants in one `maddubs` (codes are unsigned 0..=2). The code offset is
//! `Σ(code − 1)·a = Σ code·a − Σ a`, and `Σ a` is the Q8_K block's bsums summed by one
//! `madd`. Tested against the quant crate's `tq2_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16, shift16, Micro};
use std::arch::x86_64::*;

pub(crate) struct TQ2_0;

impl Micro for TQ2_0 {
    const BYTES: usize = 66;

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
            let m3 = _mm256_set1_epi8(3);
            let ones16 = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = load_f16(wb.add(64));
                let mut sumi = [_mm256_setzero_si256(); NA];
                for c in 0..2 {
                    let v = load256(wb.add(32 * c));
                    for l in 0..4 {
                        let q = _mm256_and_si256(shift16(v, -2 * l as i32), m3);
                        for i in 0..NA {
                            let av = load256(ab[i].add(4 + 128 * c + 32 * l));
                            sumi[i] = _mm256_add_epi32(
                                sumi[i],
                                _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), ones16),
                            );
                        }
                    }
                }
                for i in 0..NA {
                    let asum = _mm256_madd_epi16(load256(ab[i].add(260)), ones16);
                    let isum = _mm256_sub_epi32(sumi[i], asum);
                    let da = (ab[i] as *const f32).read_unaligned();
                    acc[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(da * dw), acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
