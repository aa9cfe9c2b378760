//! IQ4_NL × Q8_0 micro-kernel, AVX-512 F/BW/VL/VNNI.
//!
//! Two blocks per zmm: their indices become `kvalues_iq4nl + 128` (unsigned) with one
//! `vpshufb`, one `vpdpbusd` against the activation quants, and the +128 offset comes off
//! as `128 · Σa` per lane (the driver's lane sums). Per-lane scales: activation scale times
//! the weight scale of the lane's block. An odd last block runs alone in the low half.
//! Tested against the quant crate's `iq4_nl::dot` in tests/kernels_lowbit.rs.

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_0_wide::x86::WideMicro;
use crate::cpu::q8_k::avx2::load_f16;
use neagari_quant::iq4_nl::KVALUES;
use std::arch::x86_64::*;

pub(crate) struct Iq4Nl;

/// 64 table indices of the blocks at `p0` and `p1` (16 index bytes each), weight order.
#[inline(always)]
unsafe fn indices(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes at each pointer (caller); AVX-512 enabled by the caller.
    unsafe {
        let r = _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(p0 as _))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(p1 as _)),
        );
        let r = _mm512_srlv_epi64(r, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
        _mm512_and_si512(r, _mm512_set1_epi8(15))
    }
}

impl WideMicro for Iq4Nl {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;

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
        // SAFETY (whole body): blocks b, b + 1 < nb of the weight row and quants/lane data
        // of weights 32b .. 32b + 64 of activation rows i < NA are inside their buffers
        // (trait contract; the odd last block reads only its own 32); the caller enables
        // AVX-512 F/BW/VL/VNNI.
        unsafe {
            let mut t = [0u8; 16];
            for (o, v) in t.iter_mut().zip(KVALUES) {
                *o = (v as i32 + 128) as u8;
            }
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const _));
            let zero = _mm512_setzero_si512();
            let mut acc = [_mm512_setzero_ps(); NA];
            let mut b = 0;
            while b < nb {
                let pair = b + 1 < nb;
                let wb = w.add(b * 18);
                let wb1 = if pair { wb.add(18) } else { wb };
                let u = _mm512_shuffle_epi8(table, indices(wb.add(2), wb1.add(2)));
                // (insertf64x4 on the bits: `insertf32x8` is AVX-512DQ, which the driver
                // does not enable, so it compiled to an out-of-line call; hot 9.4 -> 22+ G
                // weights/s.)
                let d1 = _mm256_set1_ps(if pair { load_f16(wb1) } else { 0.0 });
                let dw = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castps_pd(_mm512_set1_ps(load_f16(wb))),
                    _mm256_castps_pd(d1),
                ));
                let lanes: __mmask16 = if pair { 0xffff } else { 0x00ff };
                for i in 0..NA {
                    let at = i * k + 32 * b;
                    let lane = i * k / 4 + 8 * b;
                    let a = _mm512_maskz_loadu_epi32(lanes, qs.add(at) as *const _);
                    let s = _mm512_maskz_loadu_epi32(lanes, sa.add(lane) as *const _);
                    let isum = _mm512_sub_epi32(
                        _mm512_dpbusd_epi32(zero, u, a),
                        _mm512_slli_epi32::<7>(s),
                    );
                    let d = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, dl.add(lane)), dw);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[i]);
                }
                b += 2;
            }
            for (i, v) in acc.iter().enumerate() {
                *out.add(i * stride) = _mm512_reduce_add_ps(*v);
            }
        }
    }
}
