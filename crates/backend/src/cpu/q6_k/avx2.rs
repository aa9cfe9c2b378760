//! Q6_K × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (210 B): `ql[128]`, `qh[64]`, `scales[16]: i8`, `d: f16`. For half h,
//! chunk k (weights 128h + 32k .. +32): low 4 bits from `ql[64h + 32(k&1) ..]` (low nibble
//! for k < 2, high for k ≥ 2), high 2 bits `(qh[32h ..] >> 2k) & 3`; the first 16 weights
//! of the chunk use scale 8h + 2k, the next 16 scale 8h + 2k + 1.
//!
//! Per block and row pair: `d · d_a · (Σ_g s_g Σ q·a − 32 Σ_g s_g bsum_g)` with `q` the
//! unsigned 6-bit value: `maddubs(q, a)` (|pair| ≤ 2·63·127 < 2¹⁵) then `madd` with the
//! chunk's two scales (one per 128-bit lane, matching the two 16-weight groups), and the
//! −32 offset folded into one `madd` of the bsums with 32·scales. Tested against the quant
//! crate's `q6_k::dot` in tests/kernels_k.rs.

use crate::cpu::q4_k::avx2::scale_selectors;
use crate::cpu::q8_k::avx2::{hsum8_epi32, hsum_epi32, hsum_ps, load256, load_f16, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q6K;

/// `Q6K::body` orders: `ggml_vec_dot_q6_K_q8_K`'s.
const VEC_DOT: u8 = 0;
/// llama.cpp's tiled matmul order, one output at a time (the oracle of `TILED_LANES`).
#[cfg_attr(not(test), allow(dead_code))]
const TILED: u8 = 1;
/// The same order with the rows in vector lanes: one transpose-reduce gives the eight
/// rows' block sums, and each lane runs its output's scalar steps (`s · d`, then
/// `fma(·, d_a, acc)`), so the results are bit-identical to `TILED`.
const TILED_LANES: u8 = 2;

impl Micro for Q6K {
    const BYTES: usize = 210;

    /// From 8 activation rows on llama.cpp runs Q6_K through its tiled K-quant matmul.
    fn alt_rows(na: usize) -> usize {
        if na >= 8 {
            na
        } else {
            0
        }
    }

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { Self::body::<NA, VEC_DOT>(w, a, arb, nb, out, stride) }
    }

    #[inline(always)]
    unsafe fn tile_alt<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { Self::body::<NA, TILED_LANES>(w, a, arb, nb, out, stride) }
    }
}

impl Q6K {
    /// The tile body. `TILED` / `TILED_LANES`: llama.cpp's tiled matmul order (per block
    /// the whole integer sum `s`, then `acc = fma(s · d, d_a, acc)`; GCC contracts its
    /// `acc + (s·d)·d_a`); `VEC_DOT`: `ggml_vec_dot_q6_K_q8_K`'s (8 lanes of
    /// `fma(d·d_a, lane, acc)`, then a horizontal sum). `TILED_LANES` needs `NA ≤ 8`.
    ///
    /// # Safety
    /// As `Micro::tile`.
    #[inline(always)]
    unsafe fn body<const NA: usize, const MODE: u8>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let mut acc1 = [0f32; NA];
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        // Scales reordered even groups first: after widening, lane 0 holds s0, s2, …, s14
        // and lane 1 holds s1, s3, …, s15, so one byte shuffle per chunk puts the chunk's
        // first-group scale in every i16 of lane 0 and its second-group scale in lane 1.
        let evens_odds = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        let ctrl = scale_selectors();
        let mut acc = [_mm256_setzero_ps(); NA];
        // TILED_LANES: lane i is output i's accumulator.
        let mut acc8 = _mm256_setzero_ps();
        const { assert!(MODE != TILED_LANES || NA <= 8) };
        for b in 0..nb {
            // SAFETY (whole block): the weight row and activation rows i < NA are nb blocks
            // long (trait contract), so every offset below is inside block b of its row.
            unsafe {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let raw = _mm_loadu_si128(wb.add(192) as *const __m128i);
                let d = load_f16(wb.add(208));
                let sc_pairs = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, evens_odds));
                let sc32 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), 5);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for h in 0..2 {
                    let ql0 = load256(wb.add(64 * h));
                    let ql1 = load256(wb.add(64 * h + 32));
                    let qh = load256(wb.add(128 + 32 * h));
                    // 16-bit shifts move bits across byte boundaries, but each mask keeps
                    // only bits that came from the same byte.
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, m4),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                            _mm256_and_si256(qh, m30),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                        ),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        let s = _mm256_shuffle_epi8(sc_pairs, ctrl[4 * h + k]);
                        for i in 0..NA {
                            let av = load256(ab[i].add(4 + 128 * h + 32 * k));
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, av), s);
                            sumi[i] = _mm256_add_epi32(sumi[i], p);
                        }
                    }
                }
                if MODE == TILED_LANES {
                    let mut s = [_mm256_setzero_si256(); 8];
                    let mut da = [0f32; 8];
                    for i in 0..NA {
                        da[i] = (ab[i] as *const f32).read_unaligned();
                        s[i] = _mm256_sub_epi32(
                            sumi[i],
                            _mm256_madd_epi16(load256(ab[i].add(260)), sc32),
                        );
                    }
                    let r = _mm256_mul_ps(_mm256_cvtepi32_ps(hsum8_epi32(s)), _mm256_set1_ps(d));
                    acc8 = _mm256_fmadd_ps(r, _mm256_loadu_ps(da.as_ptr()), acc8);
                    continue;
                }
                for i in 0..NA {
                    let da = (ab[i] as *const f32).read_unaligned();
                    let s =
                        _mm256_sub_epi32(sumi[i], _mm256_madd_epi16(load256(ab[i].add(260)), sc32));
                    if MODE == TILED {
                        let r = hsum_epi32(s) as f32 * d;
                        acc1[i] = r.mul_add(da, acc1[i]);
                    } else {
                        acc[i] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * da), acc[i]);
                    }
                }
            }
        }
        if MODE == TILED_LANES {
            let mut r = [0f32; 8];
            // SAFETY: r holds 8 floats.
            unsafe { _mm256_storeu_ps(r.as_mut_ptr(), acc8) };
            acc1.copy_from_slice(&r[..NA]);
        }
        for (i, v) in acc.iter().enumerate() {
            let o = if MODE == VEC_DOT {
                hsum_ps(*v)
            } else {
                acc1[i]
            };
            // SAFETY: output cell i is inside the tile (trait contract).
            unsafe { *out.add(i * stride) = o };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Q6K, TILED, TILED_LANES};
    use crate::cpu::q8_k::avx2::testdata;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Rows `0..na` through the tile of `NA = na` rows in the tiled order: lane-wise or
    /// one output at a time (the oracle).
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; `w` one row of `nb` blocks, `a` `na` rows,
    /// `out[i * stride]` valid for `i < na`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run(
        fast: bool,
        w: &[u8],
        a: &[u8],
        na: usize,
        nb: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let (w, a, o, arb) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr(), nb * 292);
        macro_rules! go {
            ($n:literal) => {
                if fast {
                    Q6K::body::<$n, TILED_LANES>(w, a, arb, nb, o, stride)
                } else {
                    Q6K::body::<$n, TILED>(w, a, arb, nb, o, stride)
                }
            };
        }
        // SAFETY: forwarded contract.
        unsafe {
            match na {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                7 => go!(7),
                _ => go!(8),
            }
        }
    }

    #[test]
    fn tiled_order_lanes_match_one_output_at_a_time() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x6b6b);
        for nb in [1, 2, 3, 7, 11] {
            for na in 1..=8 {
                let w = testdata::weights(210, &[208], nb, 1, &mut rng);
                let a = testdata::acts(nb, na, &mut rng);
                let stride = 3;
                let (mut want, mut got) = (vec![0f32; na * stride], vec![0f32; na * stride]);
                // SAFETY: features detected above; buffers sized for nb blocks, na rows.
                unsafe {
                    run(false, &w, &a, na, nb, &mut want, stride);
                    run(true, &w, &a, na, nb, &mut got, stride);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "nb {nb} na {na}: {got:?} vs {want:?}"
                );
                assert!(
                    want.iter().step_by(stride).all(|x| *x != 0.0),
                    "nb {nb} na {na}"
                );
            }
        }
    }
}
