//! Q2_0 / PQ2_0 × Q8_0 micro-kernel, AVX-512 F/BW/VL/VNNI.
//!
//! As `avx2.rs`, 64 weights per zmm: two u64 of codes, each broadcast over a 256-bit half
//! and shifted by 0, 2, 4, 6 per 64-bit lane, masked; one `vpdpbusd` (codes unsigned) per
//! 64 weights, minus the driver's lane sums for the code offset. Tested against the quant
//! crate's `q2_0::dot` / `pq2_0::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::load_f16;
use std::arch::x86_64::*;

/// `SUB` 32-weight sub-blocks under one scale (even).
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
        // (trait contract); the caller enables AVX-512 F/BW/VL/VNNI.
        unsafe {
            let m3 = _mm512_set1_epi8(3);
            let zero = _mm512_setzero_si512();
            let shifts = _mm512_setr_epi64(0, 2, 4, 6, 0, 2, 4, 6);
            let mut acc = [_mm512_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let dw = _mm512_set1_ps(load_f16(wb));
                let mut t = [_mm512_setzero_ps(); NA];
                for s in 0..SUB / 2 {
                    let v0 = (wb.add(2 + 16 * s) as *const i64).read_unaligned();
                    let v1 = (wb.add(10 + 16 * s) as *const i64).read_unaligned();
                    let v = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(_mm256_set1_epi64x(v0)),
                        _mm256_set1_epi64x(v1),
                    );
                    let c = _mm512_and_si512(_mm512_srlv_epi64(v, shifts), m3);
                    for i in 0..NA {
                        let at = Self::BLOCK * b + 64 * s;
                        let a = _mm512_loadu_si512(qs.add(i * k + at) as *const _);
                        let lane = i * k / 4 + at / 4;
                        let isum = _mm512_sub_epi32(
                            _mm512_dpbusd_epi32(zero, c, a),
                            _mm512_loadu_si512(sa.add(lane) as *const _),
                        );
                        let d = _mm512_loadu_ps(dl.add(lane));
                        t[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, t[i]);
                    }
                }
                for i in 0..NA {
                    acc[i] = _mm512_fmadd_ps(t[i], dw, acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = _mm512_reduce_add_ps(*v);
            }
        }
    }
}
