//! Q4_K × Q8_K micro-kernel, AVX2 + FMA + F16C.
//!
//! Weight block (144 B): `d, dmin: f16`, `scales[12]` (8 × 6-bit scale, 8 × 6-bit min),
//! `qs[128]`: chunk c (weights 64c..64c+64) is `qs[32c..32c+32]`, low nibbles = sub-block
//! 2c, high nibbles = sub-block 2c+1. Activation block (292 B): `d: f32`, `qs[256]: i8`,
//! `bsums[16]: i16`.
//!
//! Per block and row pair: `d_a · (d · Σ_j sc_j Σ q·a − dmin · Σ_j m_j (bsum_2j + bsum_2j+1))`,
//! summed as llama.cpp's repacked Q4_K kernels (`ggml_gemv/gemm_q4_K_8x8_q8_K`, which its
//! CPU backend runs on every AVX2 machine) do, so results are bit-identical to theirs: per
//! output, the block's two integer sums are exact, then
//! `acc = fma(Σ sc·q·a, d·d_a, acc)` and `acc_min = fma(Σ m·bsum, dmin·d_a, acc_min)` block
//! after block, and the output is `acc − acc_min`.
//! `maddubs(q, a)` (u8 × i8 → pairs summed to i16; |sum| ≤ 2·15·127, no saturation) then
//! `madd` with the sub-block scale broadcast as i16 gives i32 lanes; the mins term is one
//! `madd` of the bsums with the mins duplicated per 16-group. Tested against the quant
//! crate's `q4_k::dot` in tests/kernels_k.rs. (`vpdpwssd`, AVX512-VNNI / AVX-VNNI, would
//! fuse each scale `madd` with its `add`; `vpdpbusd` does not fit, as the scales apply to
//! 32-weight sums.)

use crate::cpu::q8_k::avx2::{
    hsum8_epi32, hsum_epi32, load256, load_f16x2, pair_sums8_epi32, Micro,
};
use std::arch::x86_64::*;

pub(crate) struct Q4K;

/// The 12 scale bytes at `s` as `[sc0..sc7, m0..m7]` (one byte each).
///
/// # Safety
/// `s` must be valid for reading 12 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scales_mins(s: *const u8) -> __m128i {
    // SAFETY: 12 readable bytes at s (caller).
    let (u0, u1, u2) = unsafe {
        let p = s as *const u32;
        (
            p.read_unaligned(),
            p.add(1).read_unaligned(),
            p.add(2).read_unaligned(),
        )
    };
    let sc_lo = u0 & 0x3f3f_3f3f;
    let mn_lo = u1 & 0x3f3f_3f3f;
    let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
    _mm_setr_epi32(sc_lo as i32, sc_hi as i32, mn_lo as i32, mn_hi as i32)
}

/// Per weight block: what every activation row needs.
pub(crate) struct Prep {
    /// `d` in all lanes.
    pub d: __m256,
    /// `dmin` in all lanes.
    pub dmin: __m256,
    /// The eight scales as i16, in both 128-bit lanes.
    pub sc16: __m256i,
    /// The mins as i16, each twice: `[m0, m0, m1, m1, …, m7, m7]` (one per bsum).
    pub mins: __m256i,
}

/// Decodes the header of the Q4_K/Q5_K block at `wb` (d, dmin, scales at bytes 0..16).
///
/// # Safety
/// `wb` must be valid for reading 16 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn prep(wb: *const u8) -> Prep {
    // SAFETY: 16 readable bytes at wb (caller).
    let (dm, scm) = unsafe { (load_f16x2(wb), scales_mins(wb.add(4))) };
    let dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    Prep {
        d: _mm256_broadcastss_ps(dm),
        dmin: _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
        sc16: _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm)),
        mins: _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scm, dup_mins)),
    }
}

/// Byte-shuffle controls that broadcast i16 element `j` (0..8) of a 128-bit lane to the
/// whole lane. They go through `black_box` so that LLVM keeps one `vpshufb` per use (1 uop)
/// instead of rewriting the splat as shift + `vpbroadcastw` (2 uops), which costs ~8 % of
/// the Q4_K block loop.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn scale_selectors() -> [__m256i; 8] {
    std::hint::black_box(std::array::from_fn(|j| {
        let lo = (2 * j) as i16;
        _mm256_set1_epi16(((lo + 1) << 8) | lo)
    }))
}

impl Q4K {
    /// The tile body. `CHUNKED`: the scale FMAs per 64-weight chunk (two sub-blocks), as
    /// `ggml_gemm_q4_K_8x8_q8_K` does for activation rows in groups of four; otherwise per
    /// block, as `ggml_gemv_q4_K_8x8_q8_K` does for the rest.
    ///
    /// # Safety
    /// As `Micro::tile`.
    #[inline(always)]
    unsafe fn body<const NA: usize, const CHUNKED: bool>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let m4 = _mm256_set1_epi8(0x0f);
        let ctrl = scale_selectors();
        let mut acc = [0f32; NA];
        let mut acc_min = [0f32; NA];
        for b in 0..nb {
            // SAFETY (whole block): the weight row and activation rows i < NA are nb blocks
            // long (trait contract), so every offset below is inside block b of its row.
            unsafe {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let p = prep(wb);
                let (d, dmin) = (_mm256_cvtss_f32(p.d), _mm256_cvtss_f32(p.dmin));
                let da: [f32; NA] = std::array::from_fn(|i| (ab[i] as *const f32).read_unaligned());
                // Lane j: m_j · (bsum_2j + bsum_2j+1), the mins term of sub-block j.
                let mins: [__m256i; NA] =
                    std::array::from_fn(|i| _mm256_madd_epi16(load256(ab[i].add(260)), p.mins));
                let mut sumi = [_mm256_setzero_si256(); NA];
                for c in 0..4 {
                    let qv = load256(wb.add(16 + 32 * c));
                    let lo = _mm256_and_si256(qv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                    let slo = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c]);
                    let shi = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c + 1]);
                    for i in 0..NA {
                        let pl = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(lo, load256(ab[i].add(4 + 64 * c))),
                            slo,
                        );
                        let ph = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(hi, load256(ab[i].add(36 + 64 * c))),
                            shi,
                        );
                        if CHUNKED {
                            let s = hsum_epi32(_mm256_add_epi32(pl, ph));
                            acc[i] = (s as f32).mul_add(d * da[i], acc[i]);
                            let mut m = [0i32; 8];
                            _mm256_storeu_si256(m.as_mut_ptr() as *mut __m256i, mins[i]);
                            let mc = m[2 * c] + m[2 * c + 1];
                            acc_min[i] = (mc as f32).mul_add(dmin * da[i], acc_min[i]);
                        } else {
                            sumi[i] = _mm256_add_epi32(sumi[i], _mm256_add_epi32(pl, ph));
                        }
                    }
                }
                if !CHUNKED {
                    for i in 0..NA {
                        acc[i] = (hsum_epi32(sumi[i]) as f32).mul_add(d * da[i], acc[i]);
                        acc_min[i] = (hsum_epi32(mins[i]) as f32).mul_add(dmin * da[i], acc_min[i]);
                    }
                }
            }
        }
        for i in 0..NA {
            // SAFETY: output cell i is inside the tile (trait contract).
            unsafe { *out.add(i * stride) = acc[i] - acc_min[i] };
        }
    }
}

impl Q4K {
    /// The `CHUNKED` order of [`Q4K::body`], bit-identical to it, with the per-output work
    /// done across rows: per 64-weight chunk the eight rows' integer sums come out of one
    /// transpose-reduce as one vector (lane i = row i), and the f32 steps
    /// (`d · d_a`, `fma(Σ, d·d_a, acc)`, the mins chain, `acc − acc_min`) run lane-wise, each
    /// lane doing exactly the scalar operations of its output in the same order.
    ///
    /// # Safety
    /// As `Micro::tile`, with `NA ≤ 8`.
    #[inline(always)]
    unsafe fn body_gemm<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        const { assert!(NA <= 8) };
        let m4 = _mm256_set1_epi8(0x0f);
        let ctrl = scale_selectors();
        // Lane i: output i's accumulators (lanes ≥ NA stay unused).
        let mut acc = _mm256_setzero_ps();
        let mut acc_min = _mm256_setzero_ps();
        for b in 0..nb {
            // SAFETY (whole block): the weight row and activation rows i < NA are nb blocks
            // long (trait contract), so every offset below is inside block b of its row.
            unsafe {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let p = prep(wb);
                let mut da = [0f32; 8];
                for i in 0..NA {
                    da[i] = (ab[i] as *const f32).read_unaligned();
                }
                let da = _mm256_loadu_ps(da.as_ptr());
                let dd = _mm256_mul_ps(p.d, da);
                let dm = _mm256_mul_ps(p.dmin, da);
                // Row i, lane j: m_j · (bsum_2j + bsum_2j+1); mc[c] lane i: chunk c's mins
                // term of row i.
                let mut mins = [_mm256_setzero_si256(); 8];
                for i in 0..NA {
                    mins[i] = _mm256_madd_epi16(load256(ab[i].add(260)), p.mins);
                }
                let mc = pair_sums8_epi32(mins);
                for c in 0..4 {
                    let qv = load256(wb.add(16 + 32 * c));
                    let lo = _mm256_and_si256(qv, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), m4);
                    let slo = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c]);
                    let shi = _mm256_shuffle_epi8(p.sc16, ctrl[2 * c + 1]);
                    let mut s = [_mm256_setzero_si256(); 8];
                    for i in 0..NA {
                        let pl = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(lo, load256(ab[i].add(4 + 64 * c))),
                            slo,
                        );
                        let ph = _mm256_madd_epi16(
                            _mm256_maddubs_epi16(hi, load256(ab[i].add(36 + 64 * c))),
                            shi,
                        );
                        s[i] = _mm256_add_epi32(pl, ph);
                    }
                    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hsum8_epi32(s)), dd, acc);
                    acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mc[c]), dm, acc_min);
                }
            }
        }
        let mut r = [0f32; 8];
        // SAFETY: r holds 8 floats.
        unsafe { _mm256_storeu_ps(r.as_mut_ptr(), _mm256_sub_ps(acc, acc_min)) };
        for (i, v) in r.iter().take(NA).enumerate() {
            // SAFETY: output cell i is inside the tile (trait contract).
            unsafe { *out.add(i * stride) = *v };
        }
    }
}

impl Micro for Q4K {
    const BYTES: usize = 144;

    fn alt_rows(na: usize) -> usize {
        na - na % 4
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
        unsafe { Self::body::<NA, false>(w, a, arb, nb, out, stride) }
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
        unsafe { Self::body_gemm::<NA>(w, a, arb, nb, out, stride) }
    }
}

#[cfg(test)]
mod tests {
    use super::Q4K;
    use crate::cpu::q8_k::avx2::testdata;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// Rows `0..na` through the tile of `NA = na` rows: the fast GEMM-order body, or the
    /// one-output-at-a-time one it must match bit for bit.
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
                    Q4K::body_gemm::<$n>(w, a, arb, nb, o, stride)
                } else {
                    Q4K::body::<$n, true>(w, a, arb, nb, o, stride)
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
    fn gemm_order_lanes_match_one_output_at_a_time() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            eprintln!("skipped: no AVX2/FMA/F16C");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x4b4b);
        for nb in [1, 2, 3, 7, 11] {
            for na in 1..=8 {
                let w = testdata::weights(144, &[0, 2], nb, 1, &mut rng);
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
