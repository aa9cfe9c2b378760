//! AVX2 pieces for the Q8_K side: the activation quantizer (bit-identical to the quant
//! crate's `quantize_row_q8_K_ref` port), load helpers, and the driver that runs a
//! format's micro-kernel over the output, compiled three times: for AVX2, for AVX2 plus
//! AVX-512F/BW/VL (same source, EVEX encodings), and with AVX-512 VNNI as well for the
//! micro-kernels that use `vpdpbusd` (`KFormat::MICRO512_VNNI`: Q2_K).
//!
//! Every function here needs at least AVX2, FMA and F16C; they are reached only through
//! kernels that `kernel_for` picked after detecting those features.

use super::tiles::{Rows, ACT_PANEL, Q8K_BYTES};
use neagari_quant::k_common::QK_K;
use std::arch::x86_64::*;

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of the 8 i32 lanes (exact for the K-quant block sums, which stay far below 2³¹).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Lane `i`: the sum of the 8 i32 lanes of `v[i]`, exact like [`hsum_epi32`]. One
/// transpose-reduce (6 `hadd`, 2 lane permutes, 1 add) for eight rows instead of eight
/// horizontal sums: the integer sums are the same whatever the order of the additions.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8_epi32(v: [__m256i; 8]) -> __m256i {
    // h01: [v0 0+1, v0 2+3, v1 0+1, v1 2+3 | the same for lanes 4..8].
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    // x: [v0..v3 lanes 0..4 | v0..v3 lanes 4..8]; y the same for v4..v7.
    let x = _mm256_hadd_epi32(h01, h23);
    let y = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(x, y),
        _mm256_permute2x128_si256::<0x31>(x, y),
    )
}

/// Lane `i` of result `c`: `v[i][2c] + v[i][2c + 1]` (the four pair sums of eight rows,
/// transposed so that each result holds one pair of every row).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn pair_sums8_epi32(v: [__m256i; 8]) -> [__m256i; 4] {
    // After hadd + the 0,2,1,3 dword shuffle, as i64 lanes: [rows 2r,2r+1 of pair 0, of
    // pair 1 | of pair 2, of pair 3].
    let p: [__m256i; 4] = std::array::from_fn(|r| {
        _mm256_shuffle_epi32::<0b11_01_10_00>(_mm256_hadd_epi32(v[2 * r], v[2 * r + 1]))
    });
    let e01 = _mm256_unpacklo_epi64(p[0], p[1]); // [pair 0 rows 0..4 | pair 2 rows 0..4]
    let o01 = _mm256_unpackhi_epi64(p[0], p[1]); // [pair 1 | pair 3]
    let e23 = _mm256_unpacklo_epi64(p[2], p[3]);
    let o23 = _mm256_unpackhi_epi64(p[2], p[3]);
    [
        _mm256_permute2x128_si256::<0x20>(e01, e23),
        _mm256_permute2x128_si256::<0x20>(o01, o23),
        _mm256_permute2x128_si256::<0x31>(e01, e23),
        _mm256_permute2x128_si256::<0x31>(o01, o23),
    ]
}

/// Two little-endian f16 at `p` as f32 `[p[0..2], p[2..4]]` in lanes 0 and 1.
///
/// # Safety
/// `p` must be valid for reading 4 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_f16x2(p: *const u8) -> __m128 {
    // SAFETY: the caller guarantees 4 readable bytes; read_unaligned has no alignment need.
    let bits = unsafe { (p as *const i32).read_unaligned() };
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits))
}

/// One little-endian f16 at `p` as f32.
///
/// # Safety
/// `p` must be valid for reading 2 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_f16(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p` must be valid for reading 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; loadu has no alignment need.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// `v` shifted left by `s` bits per 16-bit lane (right for negative `s`), |s| < 8. Callers
/// pass loop indices; once the loop is unrolled the match folds to one shift.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn shift16(v: __m256i, s: i32) -> __m256i {
    match s {
        0 => v,
        1 => _mm256_slli_epi16::<1>(v),
        2 => _mm256_slli_epi16::<2>(v),
        3 => _mm256_slli_epi16::<3>(v),
        4 => _mm256_slli_epi16::<4>(v),
        5 => _mm256_slli_epi16::<5>(v),
        6 => _mm256_slli_epi16::<6>(v),
        7 => _mm256_slli_epi16::<7>(v),
        -1 => _mm256_srli_epi16::<1>(v),
        -2 => _mm256_srli_epi16::<2>(v),
        -3 => _mm256_srli_epi16::<3>(v),
        -4 => _mm256_srli_epi16::<4>(v),
        -5 => _mm256_srli_epi16::<5>(v),
        -6 => _mm256_srli_epi16::<6>(v),
        _ => _mm256_srli_epi16::<7>(v),
    }
}

/// A register-tile micro-kernel of one weight type: dots of one weight row with `NA`
/// Q8_K activation rows, each unpacked weight block serving all `NA` of them.
pub(crate) trait Micro {
    /// Bytes of one weight block.
    const BYTES: usize;

    /// `out[i * stride] = dot(weight row, activation row i)` for `i < NA`, where the
    /// weight row starts at `w` and activation row `i` at `a + i * arb`, each `nb` blocks.
    ///
    /// Implementations are `#[inline(always)]` without `#[target_feature]`: the body is
    /// compiled inside each driver below, once per instruction set.
    ///
    /// # Safety
    /// Only callable from a function with at least AVX2, FMA and F16C enabled, and every
    /// row and output cell named above must be valid (the driver derives them from a
    /// checked `Rows`).
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    );

    /// How many leading activation rows of an `na`-row call llama.cpp sums in another order
    /// than the rest (its repacked Q4_K: GEMM for groups of four rows, GEMV for the
    /// remainder; its tiled K-quant matmul from 8 rows on): the driver runs them through
    /// `tile_alt`, in tiles that do not cross that row.
    #[inline(always)]
    fn alt_rows(na: usize) -> usize {
        let _ = na;
        0
    }

    /// `tile` for the rows below `alt_rows`.
    ///
    /// # Safety
    /// As `tile`.
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
        unsafe { Self::tile::<NA>(w, a, arb, nb, out, stride) }
    }
}

/// Activation rows per tile in prefill: each unpacked weight block serves eight dots.
/// Measured on Zen 4 (Q4_K/Q6_K, k = 2048): 4 rows 51 / 67 G mul-add/s (AVX2 / AVX-512VL
/// build), 8 rows 72 / 76, 12 rows 70 / 76; the f32 accumulators that do not fit in
/// registers are touched once per block, so spilling them costs little.
pub(crate) const TILE_ROWS: usize = 8;

/// Runs `M`'s micro-kernel over the whole output. Decode (one activation row) streams the
/// weight rows through the one-row kernel in a tight loop; prefill walks activation panels
/// of `ACT_PANEL` rows (kept in L2) and, per weight row (kept in L1), tiles of
/// `TILE_ROWS` activation rows.
///
/// # Safety
/// Only callable from a function with at least AVX2, FMA and F16C enabled; `r` must come
/// from `tiles::check` on these very buffers.
#[inline(always)]
unsafe fn gemm_body<M: Micro>(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    let (wp, ap, op) = (w.as_ptr(), a.as_ptr(), out.as_mut_ptr());
    let (wrb, arb, nb) = (r.wrb, r.arb, r.nb);
    // SAFETY (whole body): every weight row j < nw, activation row i < na and output cell
    // i * stride + j named below lies inside the buffers `check` measured; the features
    // are enabled in the calling driver.
    unsafe {
        if na == 1 {
            for j in 0..nw {
                M::tile::<1>(wp.add(j * wrb), ap, arb, nb, op.add(j), stride);
            }
            return;
        }
        let split = M::alt_rows(na);
        for ip in (0..na).step_by(ACT_PANEL) {
            let pn = ACT_PANEL.min(na - ip);
            for j in 0..nw {
                let wj = wp.add(j * wrb);
                let mut i0 = ip;
                while i0 < ip + pn {
                    let mut cn = TILE_ROWS.min(ip + pn - i0);
                    let (at, ot) = (ap.add(i0 * arb), op.add(i0 * stride + j));
                    if i0 < split {
                        cn = cn.min(split - i0);
                        match cn {
                            1 => M::tile_alt::<1>(wj, at, arb, nb, ot, stride),
                            2 => M::tile_alt::<2>(wj, at, arb, nb, ot, stride),
                            3 => M::tile_alt::<3>(wj, at, arb, nb, ot, stride),
                            4 => M::tile_alt::<4>(wj, at, arb, nb, ot, stride),
                            5 => M::tile_alt::<5>(wj, at, arb, nb, ot, stride),
                            6 => M::tile_alt::<6>(wj, at, arb, nb, ot, stride),
                            7 => M::tile_alt::<7>(wj, at, arb, nb, ot, stride),
                            _ => M::tile_alt::<8>(wj, at, arb, nb, ot, stride),
                        }
                        i0 += cn;
                        continue;
                    }
                    match cn {
                        1 => M::tile::<1>(wj, at, arb, nb, ot, stride),
                        2 => M::tile::<2>(wj, at, arb, nb, ot, stride),
                        3 => M::tile::<3>(wj, at, arb, nb, ot, stride),
                        4 => M::tile::<4>(wj, at, arb, nb, ot, stride),
                        5 => M::tile::<5>(wj, at, arb, nb, ot, stride),
                        6 => M::tile::<6>(wj, at, arb, nb, ot, stride),
                        7 => M::tile::<7>(wj, at, arb, nb, ot, stride),
                        _ => M::tile::<8>(wj, at, arb, nb, ot, stride),
                    }
                    i0 += cn;
                }
            }
        }
    }
}

/// The driver compiled for AVX2 + FMA + F16C.
///
/// # Safety
/// Those features must be available and `r` must come from `tiles::check` on these very
/// buffers.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemm_avx2<M: Micro>(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; this function enables the features the body needs.
    unsafe { gemm_body::<M>(r, w, nw, a, na, out, stride) }
}

/// The same driver and micro-kernels compiled with AVX-512F/BW/VL as well: the source is
/// still 256-bit AVX2 intrinsics, but EVEX encoding gives LLVM 32 vector registers (fewer
/// spills in the prefill tile) and `vpternlog` for the and/or bit merges. Measured on
/// Zen 4: Q6_K decode (L2-resident) +18 %, Q4_K decode unchanged, prefill +5–30 %.
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F, AVX-512BW and AVX-512VL must be available and `r` must come
/// from `tiles::check` on these very buffers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn gemm_avx512vl<M: Micro>(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; this function enables the features the body needs.
    unsafe { gemm_body::<M>(r, w, nw, a, na, out, stride) }
}

/// The driver compiled with AVX-512 VNNI on top of `gemm_avx512vl`'s set, for micro-kernels
/// that use `vpdpbusd` (`KFormat::MICRO512_VNNI`).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512F/BW/VL and AVX-512 VNNI must be available and `r` must come
/// from `tiles::check` on these very buffers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm_avx512vnni<M: Micro>(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded contract; this function enables the features the body needs.
    unsafe { gemm_body::<M>(r, w, nw, a, na, out, stride) }
}

/// Quantizes `x[256 n]` into `n` Q8_K blocks at `out[292 n]`, bit-identical to the
/// reference: `max` = first value of largest magnitude, `q = min(127, rne(x · (−127/max)))`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `x.len()` is a multiple of 256 and
/// `out.len() == x.len() / 256 * 292`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // packs_epi16 of two packs_epi32 results leaves 4-lane groups in order 0,2,4,6,1,3,5,7.
    let unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (xs, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8K_BYTES)) {
        let xp = xs.as_ptr();
        let op = ob.as_mut_ptr();
        // SAFETY: xs has 256 floats and ob 292 bytes; all offsets below stay inside them.
        unsafe {
            let mut vmax = _mm256_setzero_ps();
            for c in 0..32 {
                // NaN lanes lose the max (max_ps returns its second operand on NaN), like the
                // scalar `>` comparison.
                vmax = _mm256_max_ps(
                    _mm256_and_ps(_mm256_loadu_ps(xp.add(8 * c)), abs_mask),
                    vmax,
                );
            }
            let m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            if amax == 0.0 {
                std::ptr::write_bytes(op, 0, Q8K_BYTES);
                continue;
            }
            // The reference keeps the first value whose magnitude is the maximum.
            let va = _mm256_set1_ps(amax);
            let mut max = 0f32;
            for c in 0..32 {
                let v = _mm256_and_ps(_mm256_loadu_ps(xp.add(8 * c)), abs_mask);
                let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, va));
                if hit != 0 {
                    max = xs[8 * c + hit.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let vs = _mm256_set1_ps(iscale);
            let cap = _mm256_set1_epi32(127);
            let mut sums = [_mm256_setzero_si256(); 16];
            for c in 0..8 {
                let base = xp.add(32 * c);
                let (q0, q1) = (round8(base, vs, cap), round8(base.add(8), vs, cap));
                let (q2, q3) = (round8(base.add(16), vs, cap), round8(base.add(24), vs, cap));
                sums[2 * c] = _mm256_add_epi32(q0, q1);
                sums[2 * c + 1] = _mm256_add_epi32(q2, q3);
                let p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
                let p = _mm256_permutevar8x32_epi32(p, unshuffle);
                _mm256_storeu_si256(op.add(4 + 32 * c) as *mut __m256i, p);
            }
            // Reduce the 16 vectors of partial sums to 16 i32 totals, four at a time.
            for g in 0..4 {
                let h01 = _mm256_hadd_epi32(sums[4 * g], sums[4 * g + 1]);
                let h23 = _mm256_hadd_epi32(sums[4 * g + 2], sums[4 * g + 3]);
                let h = _mm256_hadd_epi32(h01, h23);
                let t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                // |sum| ≤ 16 · 127, so the i16 pack never saturates.
                let t16 = _mm_packs_epi32(t, t);
                _mm_storel_epi64(op.add(260 + 8 * g) as *mut __m128i, t16);
            }
            (op as *mut f32).write_unaligned(1.0 / iscale);
        }
    }
}

/// `min(127, rne(x[0..8] · s))` as i32 lanes.
///
/// # Safety
/// `x` must be valid for reading 8 floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round8(x: *const f32, s: __m256, cap: __m256i) -> __m256i {
    // SAFETY: the caller guarantees 8 readable floats.
    let v = unsafe { _mm256_loadu_ps(x) };
    _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v, s)), cap)
}

/// Random operands for the micro-kernel bit-identity tests.
#[cfg(test)]
pub(crate) mod testdata {
    use rand::rngs::StdRng;
    use rand::Rng;

    /// `na` Q8_K rows of `nb` blocks: `d` of either sign, `qs` in −127..=127 as the
    /// quantizer writes them, and matching `bsums`.
    pub(crate) fn acts(nb: usize, na: usize, rng: &mut StdRng) -> Vec<u8> {
        let mut out = Vec::with_capacity(na * nb * 292);
        for _ in 0..na * nb {
            let d: f32 = rng.gen_range(1e-3f32..1.0) * if rng.gen_bool(0.5) { 1.0 } else { -1.0 };
            out.extend_from_slice(&d.to_le_bytes());
            let qs: Vec<i8> = (0..256).map(|_| rng.gen_range(-127i8..=127)).collect();
            out.extend(qs.iter().map(|&q| q as u8));
            for g in qs.chunks(16) {
                let s: i16 = g.iter().map(|&q| q as i16).sum();
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
        out
    }

    /// `nw` weight rows of `nb` blocks of `bytes` random bytes, with the f16 fields at
    /// `f16_at` (block offsets) set to finite normal values of either sign.
    pub(crate) fn weights(
        bytes: usize,
        f16_at: &[usize],
        nb: usize,
        nw: usize,
        rng: &mut StdRng,
    ) -> Vec<u8> {
        let mut w: Vec<u8> = (0..bytes * nb * nw).map(|_| rng.gen()).collect();
        for blk in w.chunks_mut(bytes) {
            for &o in f16_at {
                let bits: u16 =
                    rng.gen_range(0x1400u16..0x4400) | if rng.gen_bool(0.5) { 0x8000 } else { 0 };
                blk[o..o + 2].copy_from_slice(&bits.to_le_bytes());
            }
        }
        w
    }

    /// The K-quant VNNI drivers' test: `vnni` against the AVX-512VL driver whose order the
    /// Gemma test pins to llama.cpp's, every output bit-identical, on fresh random blocks
    /// of `bytes` (f16 fields at `f16_at`) for tile, panel and remainder edges.
    pub(crate) fn vnni_matches_avx512vl(
        bytes: usize,
        f16_at: &[usize],
        seed: u64,
        avx512vl: crate::cpu::kernels::GemmFn,
        vnni: crate::cpu::kernels::GemmFn,
    ) {
        use rand::SeedableRng;
        let mut rng = StdRng::seed_from_u64(seed);
        for (nb, nw, na) in [
            (1, 16, 8),
            (4, 40, 13),
            (8, 7, 9),
            (2, 33, 300),
            (3, 16, 515),
        ] {
            let w = weights(bytes, f16_at, nb, nw, &mut rng);
            let a = acts(nb, na, &mut rng);
            let stride = nw + 3;
            let (mut want, mut got) = (vec![0f32; na * stride], vec![0f32; na * stride]);
            let k = 256 * nb;
            avx512vl(k, &w, nw, &a, na, &mut want, stride);
            vnni(k, &w, nw, &a, na, &mut got, stride);
            for (i, (x, y)) in want.iter().zip(&got).enumerate() {
                assert_eq!(x.to_bits(), y.to_bits(), "nb {nb} nw {nw} na {na} at {i}");
            }
            assert!(want.iter().filter(|x| **x != 0.0).count() >= na * nw / 2);
        }
    }

    /// Tuning only (the K-quant lanes drivers' ignored speed tests): `avx512vl` against
    /// `lanes` called in weight-row chunks as the matmul tasks call it, at Gemma 3 270M's
    /// ffn_down and attn_output shapes, one thread; prints G mul-add/s of each.
    pub(crate) fn lanes_speed(
        bytes: usize,
        f16_at: &[usize],
        avx512vl: crate::cpu::kernels::GemmFn,
        lanes: crate::cpu::kernels::GemmFn,
    ) {
        use rand::SeedableRng;
        let mut rng = StdRng::seed_from_u64(5);
        for (nb, na, chunk) in [(4, 128, 640), (8, 128, 640), (4, 512, 48), (8, 512, 48)] {
            let nw = 640;
            let w = weights(bytes, f16_at, nb, nw, &mut rng);
            let a = acts(nb, na, &mut rng);
            let mut o = vec![0f32; na * nw];
            let mut best = [f64::MAX; 2];
            for _ in 0..10 {
                for (m, b) in best.iter_mut().enumerate() {
                    let t = std::time::Instant::now();
                    if m == 0 {
                        avx512vl(256 * nb, &w, nw, &a, na, &mut o, nw);
                    } else {
                        for j0 in (0..nw).step_by(chunk) {
                            let c = chunk.min(nw - j0);
                            let wr = nb * bytes;
                            lanes(
                                256 * nb,
                                &w[j0 * wr..(j0 + c) * wr],
                                c,
                                &a,
                                na,
                                &mut o[j0..],
                                nw,
                            );
                        }
                    }
                    *b = b.min(t.elapsed().as_secs_f64());
                }
            }
            let gmac = (nw * na * 256 * nb) as f64 / 1e9;
            eprintln!(
                "k {} na {na} chunks of {chunk}: avx512vl {:.1} G mul-add/s, lanes {:.1}",
                256 * nb,
                gmac / best[0],
                gmac / best[1]
            );
        }
    }
}
