//! 1-bit sign form × Q8_0 activations, AVX-512 F/BW/VL/VNNI (`sign1::Sign1GemmFn`).
//!
//! Codes are LSB first, so 64 consecutive codes are one u64 that serves directly as the
//! byte mask of the 64 matching int8 activations (natural order, no permutation): a masked
//! subtraction makes `0 − a` where the bit is set and `a` where it is clear (Q8_0 quants
//! lie in −127..=127, so the negation never wraps; the row's sum is negated once at the
//! end), one `vpdpbusd` against ones sums each
//! four into sixteen i32 lanes, eight per activation block, which meet the spread block
//! scales in one FMA. Groups of 64 or 128 then take their weight scale once per group;
//! groups of 32 (two per 64 codes) take a two-valued scale vector per 64 codes. One weight
//! row against up to four activation rows at a time (the mask is shared). Tested against
//! `neagari_quant::mlx_affine::dot_row_q8` in `sign1::tests`.

use std::arch::x86_64::*;

use super::avx2::scale_at;
use super::sign1::{self, Acts, SignRows};

pub(super) fn sign1(
    w: &SignRows,
    k: usize,
    nw: usize,
    a: &Acts,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    // Groups of 64·n or 32 only (MLX's are 32, 64, 128); anything else takes AVX2.
    if !sign1::lengths_ok(w, k, nw, a, na, out, out_stride)
        || !(w.group == 32 || w.group.is_multiple_of(64))
    {
        return super::avx2::sign1(w, k, nw, a, na, out, out_stride);
    }
    for j in 0..nw {
        let mut i0 = 0;
        while i0 < na {
            let nr = (na - i0).min(4);
            // SAFETY: AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C) were detected before this
            // kernel was chosen; `lengths_ok` covers weight row j < nw and activation rows
            // i0 .. i0 + nr ≤ na.
            let r = unsafe {
                match nr {
                    4 => tile::<4>(w, j, k, a, i0),
                    3 => tile::<3>(w, j, k, a, i0),
                    2 => tile::<2>(w, j, k, a, i0),
                    _ => tile::<1>(w, j, k, a, i0),
                }
            };
            for (r, v) in r.iter().take(nr).enumerate() {
                out[(i0 + r) * out_stride + j] = *v;
            }
            i0 += nr;
        }
    }
}

/// `−Σ σ·a` of the 64 quants at `q` by the 64 bits of `bits` (`σ = +1` where set), as
/// sixteen i32 lanes: negating where the bit is *set* takes the mask as it is (no `knot`);
/// `tile` negates the row sum once at the end.
#[inline(always)]
unsafe fn sdot64(bits: u64, q: *const i8) -> __m512i {
    // SAFETY: the caller guarantees 64 readable bytes at q and enables AVX-512 BW/VNNI.
    unsafe {
        let a = _mm512_loadu_si512(q as *const _);
        let s = _mm512_mask_sub_epi8(a, bits, _mm512_setzero_si512(), a);
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), s)
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const NA: usize>(w: &SignRows, j: usize, k: usize, a: &Acts, i0: usize) -> [f32; 4] {
    let ng = k / w.group;
    let d = &w.d[j * ng * w.dt.size()..];
    let mut acc = [_mm512_setzero_ps(); NA];
    let mut out = [0f32; 4];
    // SAFETY (whole body): row j's k/8 code bytes, activation rows i0 .. i0 + NA (quants
    // [k], spread scales [k/4], sums [ng]) and row j's ng scales/offsets are in bounds
    // (`lengths_ok`); every chunk c < k/64, block 2·(k/64) < k/32 and group g < ng below.
    unsafe {
        let cp = w.codes.as_ptr();
        let cp = cp.add(j * k / 8);
        let qp = a.qs.as_ptr().add(i0 * k);
        let dp = a.dl.as_ptr().add(i0 * k / 4);
        let bits = |c: usize| std::ptr::read_unaligned(cp.add(8 * c) as *const u64);
        if w.group == 32 {
            for c in 0..k / 64 {
                let dv = _mm512_insertf32x8::<1>(
                    _mm512_set1_ps(scale_at(w.dt, d, 2 * c)),
                    _mm256_set1_ps(scale_at(w.dt, d, 2 * c + 1)),
                );
                let m = bits(c);
                for (i, acc) in acc.iter_mut().enumerate() {
                    let s = _mm512_cvtepi32_ps(sdot64(m, qp.add(i * k + 64 * c)));
                    let v = _mm512_mul_ps(s, _mm512_loadu_ps(dp.add(i * k / 4 + 16 * c)));
                    *acc = _mm512_fmadd_ps(v, dv, *acc);
                }
            }
            if k % 64 == 32 {
                // The last block (an odd group count): 32 codes on ymm.
                let b = k / 32 - 1;
                let m = std::ptr::read_unaligned(cp.add(4 * b) as *const u32);
                let dg = scale_at(w.dt, d, b);
                for (i, o) in out.iter_mut().take(NA).enumerate() {
                    let q = _mm256_loadu_si256(qp.add(i * k + 32 * b) as *const __m256i);
                    let s = _mm256_mask_sub_epi8(q, m, _mm256_setzero_si256(), q);
                    let isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), s);
                    let v = _mm256_mul_ps(
                        _mm256_cvtepi32_ps(isum),
                        _mm256_loadu_ps(dp.add(i * k / 4 + 8 * b)),
                    );
                    *o -= dg * super::avx2::hsum(v);
                }
            }
        } else {
            let per = w.group / 64;
            for g in 0..ng {
                let mut t = [_mm512_setzero_ps(); NA];
                for c in g * per..(g + 1) * per {
                    let m = bits(c);
                    for (i, t) in t.iter_mut().enumerate() {
                        let s = _mm512_cvtepi32_ps(sdot64(m, qp.add(i * k + 64 * c)));
                        *t = _mm512_fmadd_ps(s, _mm512_loadu_ps(dp.add(i * k / 4 + 16 * c)), *t);
                    }
                }
                let dg = _mm512_set1_ps(scale_at(w.dt, d, g));
                for (acc, t) in acc.iter_mut().zip(t) {
                    *acc = _mm512_fmadd_ps(dg, t, *acc);
                }
            }
        }
        for (o, acc) in out.iter_mut().zip(acc) {
            *o -= _mm512_reduce_add_ps(acc);
        }
        if let Some(m) = w.m {
            for (i, o) in out.iter_mut().take(NA).enumerate() {
                let xs = a.xsum.as_ptr().add((i0 + i) * ng);
                *o += super::avx2::dot_f32(m.as_ptr().add(j * ng), xs, ng);
            }
        }
    }
    out
}
