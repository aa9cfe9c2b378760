//! Attention of one query head against an f16 cache in the floating-point order of ggml's
//! CPU backend without flash attention (as llama.cpp runs it on an AVX-512 build), so its
//! output is bit-identical to llama.cpp's for the same q, cache and positions:
//!
//! - `q` rounded to f16; `s_t = (q·k_t)·scale` with the dot in ggml's order (below);
//! - softmax: `e_t = ggml_v_expf(s_t − max)` (the AVX-512 polynomial, emulated lane by
//!   lane), the sum in f64 of 16-slot chunk sums, `p_t = e_t · (f32)(1 / sum)`;
//! - `p_t` rounded to f16, `out[d] = Σ_t p_t·v_t[d]` in the same dot order over `t`.
//!
//! Dot order: with one query row in the batch ggml runs `ggml_vec_dot_f16` (four 16-lane
//! f32 accumulators, element `i` in accumulator `(i/16) % 4`, lane `i % 16`, one FMA per
//! element; then `a0 + a2`, `a1 + a3`, their sum, and a 16-lane reduction); with more rows,
//! tinyBLAS (one 16-lane accumulator, element `i` in lane `i % 16`; the same reduction).
//! The 16-lane reduction is GCC's `_mm512_reduce_add_ps`: halves, quarters, then
//! `(u0 + u2) + (u1 + u3)`. Over `t` the index is the cache slot (`base + t`), which is
//! the position in llama.cpp's cache as long as it has not wrapped; masked and empty slots
//! contribute exact zeros.

use half::f16;

/// `ggml_v_expf` (AVX-512) for one value: `2^n · P(b)` with `n = round(x / ln 2)`.
#[inline(always)]
fn expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 1.5 · 2^23: adding it rounds to an integer
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    scalef(j, n)
}

/// `j · 2^n` for an integral `n` in [−192, 192], rounded once (`vscalefps`).
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    let n = n as i32;
    if (-126..=127).contains(&n) {
        j * f32::from_bits(((n + 127) as u32) << 23)
    } else {
        // 2^n is not a normal f32: scale in f64 (exact) and round once.
        (j as f64 * 2f64.powi(n)) as f32
    }
}

/// GCC's `_mm512_reduce_add_ps`.
#[inline(always)]
fn reduce16(x: &[f32; 16]) -> f32 {
    let t: [f32; 8] = std::array::from_fn(|i| x[i] + x[i + 8]);
    let u: [f32; 4] = std::array::from_fn(|i| t[i] + t[i + 4]);
    (u[0] + u[2]) + (u[1] + u[3])
}

/// Folds `ggml_vec_dot_f16`'s four accumulators (lanes `16a + l`) into one.
#[inline(always)]
fn fold64(a: &[f32; 64]) -> [f32; 16] {
    std::array::from_fn(|l| (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]))
}

/// `x·y` in `ggml_vec_dot_f16`'s order (`decode`) or tinyBLAS's.
#[inline(always)]
fn dot(x: &[f32], y: &[f32], decode: bool) -> f32 {
    // tinyBLAS takes only lengths that are a multiple of 16; ggml falls back to vec_dot.
    if decode || !x.len().is_multiple_of(16) {
        let n64 = x.len() / 64 * 64;
        let mut a = [0f32; 64];
        for (xc, yc) in x[..n64].chunks_exact(64).zip(y[..n64].chunks_exact(64)) {
            for i in 0..64 {
                a[i] = xc[i].mul_add(yc[i], a[i]);
            }
        }
        let mut s = reduce16(&fold64(&a)) as f64;
        for (xv, yv) in x[n64..].iter().zip(&y[n64..]) {
            s += (xv * yv) as f64;
        }
        s as f32
    } else {
        let mut a = [0f32; 16];
        for (xc, yc) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
            for i in 0..16 {
                a[i] = xc[i].mul_add(yc[i], a[i]);
            }
        }
        reduce16(&a)
    }
}

/// Per-call scratch of `attend`: the slot accumulators over `t` (64 or 16 rows of `hd`).
#[derive(Default)]
pub struct Scratch {
    acc: Vec<f32>,
}

/// One query head: `out = softmax(scale · q·kᵀ) · v` over cache rows `lo..=hi` of `k`/`v`
/// (`[n, hd]` f32 holding f16 values; row `t` is cache slot `base + t`). `decode`: the
/// batch has one query row. `q` is rounded to f16 in place; `scores` has room for `hi + 1`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    (lo, hi, base): (usize, usize, usize),
    scale: f32,
    decode: bool,
    scores: &mut [f32],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) && z::available() {
        // SAFETY: AVX-512F/FMA/AVX2 are present (checked just above).
        unsafe {
            return z::attend(
                q,
                k,
                v,
                hd,
                (lo, hi, base),
                scale,
                decode,
                scores,
                scratch,
                out,
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: FMA is present (checked just above).
        unsafe {
            return attend_fma(
                q,
                k,
                v,
                hd,
                (lo, hi, base),
                scale,
                decode,
                scores,
                scratch,
                out,
            );
        }
    }
    attend_body(
        q,
        k,
        v,
        hd,
        (lo, hi, base),
        scale,
        decode,
        scores,
        scratch,
        out,
    )
}

/// The same body compiled with FMA, so `mul_add` is one instruction (the results are the
/// same either way: `mul_add` is the IEEE fused multiply-add).
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_fma(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    range: (usize, usize, usize),
    scale: f32,
    decode: bool,
    scores: &mut [f32],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    attend_body(q, k, v, hd, range, scale, decode, scores, scratch, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    hd: usize,
    (lo, hi, base): (usize, usize, usize),
    scale: f32,
    decode: bool,
    scores: &mut [f32],
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    for x in q.iter_mut() {
        *x = f16::from_f32(*x).to_f32();
    }
    let mut max = f32::NEG_INFINITY;
    for t in lo..=hi {
        let s = dot(q, &k[t * hd..(t + 1) * hd], decode) * scale;
        scores[t] = s;
        max = max.max(s);
    }
    for s in &mut scores[lo..=hi] {
        *s = expf(*s - max);
    }
    // Σ over 16-slot chunks of the cache (slots outside lo..=hi hold exact zeros).
    let mut sum = 0f64;
    let (c0, c1) = ((base + lo) / 16, (base + hi) / 16);
    for c in c0..=c1 {
        let chunk: [f32; 16] = std::array::from_fn(|l| {
            let slot = 16 * c + l;
            if slot < base + lo || slot > base + hi {
                0.0
            } else {
                scores[slot - base]
            }
        });
        sum += reduce16(&chunk) as f64;
    }
    let inv = (1.0 / sum) as f32;
    let slots = if decode { 64 } else { 16 };
    let acc = &mut scratch.acc;
    acc.clear();
    acc.resize(slots * hd, 0.0);
    for t in lo..=hi {
        let p = f16::from_f32(scores[t] * inv).to_f32();
        let s = (base + t) % slots;
        let a = &mut acc[s * hd..(s + 1) * hd];
        for (ad, &vd) in a.iter_mut().zip(&v[t * hd..(t + 1) * hd]) {
            *ad = vd.mul_add(p, *ad);
        }
    }
    for (d, o) in out.iter_mut().enumerate().take(hd) {
        *o = if decode {
            let a: [f32; 64] = std::array::from_fn(|s| acc[s * hd + d]);
            reduce16(&fold64(&a))
        } else {
            let a: [f32; 16] = std::array::from_fn(|s| acc[s * hd + d]);
            reduce16(&a)
        };
    }
}

/// The same arithmetic with one zmm per 16-lane accumulator (AVX-512F): the loops over the
/// head dimension run 16 values per instruction, and the reductions over the slot
/// accumulators run vertically, 16 outputs at a time.
#[cfg(target_arch = "x86_64")]
// Register tiles are indexed [head][key or vector] by constant-bound loops.
#[allow(clippy::needless_range_loop)]
mod z {
    use super::{expf, Scratch};
    use half::f16;
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    }

    /// GCC's `_mm512_reduce_add_ps` of `v`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn reduce(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        crate::cpu::avx2_tiles::hsum(_mm256_add_ps(lo, hi))
    }

    /// `x·y` in `ggml_vec_dot_f16`'s order (`decode`) or tinyBLAS's; `x.len() % 16 == 0`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn dot(x: &[f32], y: &[f32], decode: bool) -> f32 {
        let n = x.len();
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        // SAFETY (loads): every offset is below n = x.len() = y.len() (callers' slices).
        unsafe {
            if decode {
                let n64 = n / 64 * 64;
                let mut a = [_mm512_setzero_ps(); 4];
                let mut i = 0;
                while i < n64 {
                    for (j, aj) in a.iter_mut().enumerate() {
                        let o = i + 16 * j;
                        *aj = _mm512_fmadd_ps(
                            _mm512_loadu_ps(xp.add(o)),
                            _mm512_loadu_ps(yp.add(o)),
                            *aj,
                        );
                    }
                    i += 64;
                }
                let b = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                let mut s = reduce(b) as f64;
                for t in n64..n {
                    s += (*xp.add(t) * *yp.add(t)) as f64;
                }
                s as f32
            } else {
                let mut a = _mm512_setzero_ps();
                let mut i = 0;
                while i < n {
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)), a);
                    i += 16;
                }
                reduce(a)
            }
        }
    }

    /// `attend_body` with zmm loops; `hd % 16 == 0`.
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA are available.
    #[target_feature(enable = "avx512f,avx2,fma")]
    // `t` indexes scores and addresses rows of v and the slot accumulators.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) unsafe fn attend(
        q: &mut [f32],
        k: &[f32],
        v: &[f32],
        hd: usize,
        (lo, hi, base): (usize, usize, usize),
        scale: f32,
        decode: bool,
        scores: &mut [f32],
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        for x in q.iter_mut() {
            *x = f16::from_f32(*x).to_f32();
        }
        let mut max = f32::NEG_INFINITY;
        for t in lo..=hi {
            // SAFETY: features per the caller; both slices are hd long.
            let s = unsafe { dot(&q[..hd], &k[t * hd..(t + 1) * hd], decode) } * scale;
            scores[t] = s;
            max = max.max(s);
        }
        for s in &mut scores[lo..=hi] {
            *s = expf(*s - max);
        }
        let mut sum = 0f64;
        let (c0, c1) = ((base + lo) / 16, (base + hi) / 16);
        for c in c0..=c1 {
            let chunk: [f32; 16] = std::array::from_fn(|l| {
                let slot = 16 * c + l;
                if slot < base + lo || slot > base + hi {
                    0.0
                } else {
                    scores[slot - base]
                }
            });
            sum += super::reduce16(&chunk) as f64;
        }
        let inv = (1.0 / sum) as f32;
        let slots = if decode { 64 } else { 16 };
        let acc = &mut scratch.acc;
        acc.clear();
        acc.resize(slots * hd, 0.0);
        let ap = acc.as_mut_ptr();
        // SAFETY (whole loop): slot s < slots and d + 16 <= hd stay inside acc
        // (slots × hd) and inside row t < n of v.
        unsafe {
            for t in lo..=hi {
                let p = _mm512_set1_ps(f16::from_f32(scores[t] * inv).to_f32());
                let s = (base + t) % slots;
                let (a, vr) = (ap.add(s * hd), v.as_ptr().add(t * hd));
                let mut d = 0;
                while d < hd {
                    let x =
                        _mm512_fmadd_ps(_mm512_loadu_ps(vr.add(d)), p, _mm512_loadu_ps(a.add(d)));
                    _mm512_storeu_ps(a.add(d), x);
                    d += 16;
                }
            }
        }
        // Per output d the 16 (or 64) slot accumulators reduce in ggml's order; 16 outputs
        // per step, every add vertical.
        let mut d = 0;
        while d < hd {
            // SAFETY: slot rows < slots, columns d..d + 16 <= hd.
            let x: [__m512; 16] = if decode {
                std::array::from_fn(|l| unsafe {
                    let r = |s: usize| _mm512_loadu_ps(ap.add(s * hd + d));
                    _mm512_add_ps(
                        _mm512_add_ps(r(l), r(32 + l)),
                        _mm512_add_ps(r(16 + l), r(48 + l)),
                    )
                })
            } else {
                std::array::from_fn(|l| unsafe { _mm512_loadu_ps(ap.add(l * hd + d)) })
            };
            let t: [__m512; 8] = std::array::from_fn(|i| _mm512_add_ps(x[i], x[i + 8]));
            let u: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(t[i], t[i + 4]));
            let r = _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]));
            // SAFETY: out has hd values (caller).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(d), r) };
            d += 16;
        }
    }

    pub(super) fn group_available() -> bool {
        available() && is_x86_feature_detected!("f16c")
    }

    /// `ggml_v_expf` (AVX-512), the vector the scalar `expf` emulates lane by lane.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn expf16(x: __m512) -> __m512 {
        let c = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        let r = c(0x4b40_0000);
        let z = _mm512_fmadd_ps(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = _mm512_fnmadd_ps(n, c(0x35bf_be8e), _mm512_fnmadd_ps(n, c(0x3f31_7200), x));
        let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
        let u = _mm512_mul_ps(b, b);
        let j = _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)), u, {
                _mm512_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb))
            }),
            u,
            _mm512_fmadd_ps(c(0x3f7f_fff6), b, _mm512_set1_ps(1.0)),
        );
        let res = _mm512_scalef_ps(j, n);
        if d == 0 {
            return res;
        }
        let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        _mm512_mask_blend_ps(d, res, alt)
    }

    /// `expf16` on an array (tests).
    #[cfg(test)]
    pub(super) fn expf16_for_test(x: [f32; 16]) -> __m512 {
        assert!(group_available());
        // SAFETY: features checked just above.
        unsafe { expf16_arr(x) }
    }

    #[cfg(test)]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn expf16_arr(x: [f32; 16]) -> __m512 {
        // SAFETY: 16 floats.
        expf16(unsafe { _mm512_loadu_ps(x.as_ptr()) })
    }

    /// Lane `4k + j` = GCC's `_mm512_reduce_add_ps` of `x[4j + k]`: the same adds as 16
    /// separate reductions (lanes `i, i+8`, then `i, i+4`, then `(u0+u2) + (u1+u3)`), done
    /// as a butterfly over the 16 vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn reduce16x(x: &[__m512; 16]) -> __m512 {
        let y: [__m512; 8] = std::array::from_fn(|m| {
            let (a, b) = (x[2 * m], x[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xee>(a, b),
            )
        });
        let z: [__m512; 4] = std::array::from_fn(|m| {
            let (a, b) = (y[2 * m], y[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xdd>(a, b),
            )
        });
        let w: [__m512; 2] = std::array::from_fn(|m| {
            let (a, b) = (z[2 * m], z[2 * m + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0x44>(a, b),
                _mm512_shuffle_ps::<0xee>(a, b),
            )
        });
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(w[0], w[1]),
            _mm512_shuffle_ps::<0xdd>(w[0], w[1]),
        )
    }

    /// Scores of `QG` heads (`qh`: `[QG, hd]`, f16-rounded) against rows `lo..=hi` of `k`,
    /// `TK = 16 / QG` keys per register tile: `p[a·n + t] = (q_a·k_t) · scale` in tinyBLAS's
    /// order (one 16-lane accumulator per score, then `_mm512_reduce_add_ps`).
    ///
    /// # Safety
    /// Features as `group_available`; `qh` has `QG · hd`, `k` `(hi + 1) · hd` and `p`
    /// `(QG − 1) · n + hi + 1` readable / writable floats; `hd % 16 == 0`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores<const QG: usize, const TK: usize>(
        qh: *const f32,
        k: *const f32,
        hd: usize,
        (lo, hi): (usize, usize),
        scale: f32,
        p: *mut f32,
        n: usize,
    ) {
        let mut t0 = lo;
        while t0 <= hi {
            // A short last tile repeats row hi (computed, not stored).
            let kt: [usize; TK] = std::array::from_fn(|j| (t0 + j).min(hi) * hd);
            let mut acc = [[_mm512_setzero_ps(); TK]; QG];
            let mut d = 0;
            while d < hd {
                // SAFETY: rows < QG of qh and rows ≤ hi of k, columns d..d + 16 ≤ hd.
                unsafe {
                    let qv: [__m512; QG] =
                        std::array::from_fn(|a| _mm512_loadu_ps(qh.add(a * hd + d)));
                    let kv: [__m512; TK] =
                        std::array::from_fn(|j| _mm512_loadu_ps(k.add(kt[j] + d)));
                    for a in 0..QG {
                        for j in 0..TK {
                            acc[a][j] = _mm512_fmadd_ps(qv[a], kv[j], acc[a][j]);
                        }
                    }
                }
                d += 16;
            }
            // Score (a, j) goes to lane L = a·TK + j, which reduce16x takes from input
            // 4·(L % 4) + L / 4.
            let mut x = [_mm512_setzero_ps(); 16];
            for a in 0..QG {
                for j in 0..TK {
                    let l = a * TK + j;
                    x[4 * (l % 4) + l / 4] = acc[a][j];
                }
            }
            let mut s = [0f32; 16];
            // SAFETY: 16 floats into a 16-float array.
            unsafe {
                _mm512_storeu_ps(
                    s.as_mut_ptr(),
                    _mm512_mul_ps(reduce16x(&x), _mm512_set1_ps(scale)),
                )
            };
            for a in 0..QG {
                for j in 0..TK.min(hi + 1 - t0) {
                    // SAFETY: a < QG, t0 + j ≤ hi.
                    unsafe { *p.add(a * n + t0 + j) = s[a * TK + j] };
                }
            }
            t0 += TK;
        }
    }

    /// Softmax of one head's scores `p[lo..=hi]` in place, as `attend_body`: `ggml_v_expf`
    /// of `s − max`, the f64 sum of 16-slot chunk sums, then `f16(e · (f32)(1/sum))`.
    ///
    /// # Safety
    /// Features as `group_available`; `p` has `hi + 1` floats.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn softmax(p: &mut [f32], (lo, hi, base): (usize, usize, usize)) {
        let n = hi + 1 - lo;
        let ptr = p[lo..=hi].as_mut_ptr();
        let mask = |i: usize| -> __mmask16 {
            let m = n - i;
            if m >= 16 {
                0xffff
            } else {
                ((1u32 << m) - 1) as __mmask16
            }
        };
        let mut mv = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            // SAFETY: lanes < n − i of p[lo + i..].
            let x = unsafe {
                _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), mask(i), ptr.add(i))
            };
            mv = _mm512_max_ps(mv, x);
            i += 16;
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        let mut i = 0;
        while i < n {
            // SAFETY: lanes < n − i of p[lo + i..].
            unsafe {
                let x = _mm512_maskz_loadu_ps(mask(i), ptr.add(i));
                _mm512_mask_storeu_ps(ptr.add(i), mask(i), expf16(_mm512_sub_ps(x, max)));
            }
            i += 16;
        }
        let mut sum = 0f64;
        let (c0, c1) = ((base + lo) / 16, (base + hi) / 16);
        for c in c0..=c1 {
            let chunk: [f32; 16] = std::array::from_fn(|l| {
                let slot = 16 * c + l;
                if slot < base + lo || slot > base + hi {
                    0.0
                } else {
                    p[slot - base]
                }
            });
            sum += super::reduce16(&chunk) as f64;
        }
        let inv = _mm512_set1_ps((1.0 / sum) as f32);
        let mut i = 0;
        while i < n {
            // SAFETY: lanes < n − i of p[lo + i..].
            unsafe {
                let x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask(i), ptr.add(i)), inv);
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                _mm512_mask_storeu_ps(ptr.add(i), mask(i), _mm512_cvtph_ps(h));
            }
            i += 16;
        }
    }

    /// `out[a·hd + d0 ..][64] = Σ_t p[a·n + t] · v_t[d0..d0 + 64]` for `QG` heads in
    /// tinyBLAS's order: 16 slot accumulators (`(base + t) % 16`), `t` ascending in each,
    /// then the slots reduced as `_mm512_reduce_add_ps` orders lanes. Slot by slot, a
    /// register tile of `QG` heads × 4 vectors; `part` keeps the 16 slots' tiles.
    ///
    /// # Safety
    /// Features as `group_available`; `p` has `(QG − 1) · n + hi + 1` floats, `v`
    /// `(hi + 1) · hd`, `out` `(QG − 1) · hd + d0 + 64`, `part` `16 · QG · 64`;
    /// `d0 + 64 ≤ hd`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pv<const QG: usize>(
        p: *const f32,
        n: usize,
        v: *const f32,
        hd: usize,
        d0: usize,
        (lo, hi, base): (usize, usize, usize),
        part: *mut f32,
        out: *mut f32,
    ) {
        const DV: usize = 4;
        for s in 0..16 {
            let mut acc = [[_mm512_setzero_ps(); DV]; QG];
            let mut t = lo + (s + 16 - (base + lo) % 16) % 16;
            while t <= hi {
                // SAFETY: row t ≤ hi of v, columns d0..d0 + 64 ≤ hd; p rows < QG.
                unsafe {
                    let vr = v.add(t * hd + d0);
                    let vv: [__m512; DV] = std::array::from_fn(|i| _mm512_loadu_ps(vr.add(16 * i)));
                    for a in 0..QG {
                        let pb = _mm512_set1_ps(*p.add(a * n + t));
                        for i in 0..DV {
                            acc[a][i] = _mm512_fmadd_ps(vv[i], pb, acc[a][i]);
                        }
                    }
                }
                t += 16;
            }
            for a in 0..QG {
                for i in 0..DV {
                    // SAFETY: inside part's 16 · QG · DV vectors.
                    unsafe { _mm512_storeu_ps(part.add(((s * QG + a) * DV + i) * 16), acc[a][i]) };
                }
            }
        }
        for a in 0..QG {
            for i in 0..DV {
                // SAFETY: as above; out row a < QG, columns d0 + 16i + 16 ≤ hd.
                unsafe {
                    let x: [__m512; 16] = std::array::from_fn(|s| {
                        _mm512_loadu_ps(part.add(((s * QG + a) * DV + i) * 16))
                    });
                    let t: [__m512; 8] = std::array::from_fn(|j| _mm512_add_ps(x[j], x[j + 8]));
                    let u: [__m512; 4] = std::array::from_fn(|j| _mm512_add_ps(t[j], t[j + 4]));
                    let r = _mm512_add_ps(_mm512_add_ps(u[0], u[2]), _mm512_add_ps(u[1], u[3]));
                    _mm512_storeu_ps(out.add(a * hd + d0 + 16 * i), r);
                }
            }
        }
    }

    /// `super::attend_group`.
    ///
    /// # Safety
    /// `group_available()`; `hd % 64 == 0`; `q`, `out` hold `g · hd` floats, `k`, `v`
    /// `(hi + 1) · hd`; `lo ≤ hi`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend_group(
        q: &[f32],
        g: usize,
        k: &[f32],
        v: &[f32],
        hd: usize,
        (lo, hi, base): (usize, usize, usize),
        scale: f32,
        sc: &mut super::GroupScratch,
        out: &mut [f32],
    ) {
        let n = hi + 1;
        sc.q.resize(g * hd, 0.0);
        for (d, s) in sc.q.chunks_exact_mut(16).zip(q[..g * hd].chunks_exact(16)) {
            // SAFETY: 16 floats each.
            unsafe {
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_loadu_ps(s.as_ptr()),
                );
                _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        sc.p.resize(g * n, 0.0);
        sc.part.resize(16 * 4 * 64, 0.0);
        let (qp, kp, vp) = (sc.q.as_ptr(), k.as_ptr(), v.as_ptr());
        let (pp, part, op) = (sc.p.as_mut_ptr(), sc.part.as_mut_ptr(), out.as_mut_ptr());
        let mut g0 = 0;
        while g0 < g {
            let qg = match g - g0 {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            // SAFETY: heads g0..g0 + qg < g of q, p and out; rows ≤ hi of k and v.
            unsafe {
                let (qh, ph) = (qp.add(g0 * hd), pp.add(g0 * n));
                match qg {
                    4 => scores::<4, 4>(qh, kp, hd, (lo, hi), scale, ph, n),
                    2 => scores::<2, 8>(qh, kp, hd, (lo, hi), scale, ph, n),
                    _ => scores::<1, 16>(qh, kp, hd, (lo, hi), scale, ph, n),
                }
                for a in 0..qg {
                    let row = std::slice::from_raw_parts_mut(ph.add(a * n), n);
                    softmax(row, (lo, hi, base));
                }
                let oh = op.add(g0 * hd);
                for d0 in (0..hd).step_by(64) {
                    let r = (lo, hi, base);
                    match qg {
                        4 => pv::<4>(ph, n, vp, hd, d0, r, part, oh),
                        2 => pv::<2>(ph, n, vp, hd, d0, r, part, oh),
                        _ => pv::<1>(ph, n, vp, hd, d0, r, part, oh),
                    }
                }
            }
            g0 += qg;
        }
    }
}

/// Scratch of `attend_group`.
#[derive(Default)]
pub struct GroupScratch {
    /// `[g, hd]`: the query heads rounded to f16.
    q: Vec<f32>,
    /// `[g, hi + 1]`: scores, then softmax weights (rounded to f16), by span row `t`.
    p: Vec<f32>,
    /// `[16 slots, ≤ 4 heads, 4 vectors, 16]`: P·V partial sums per slot.
    part: Vec<f32>,
}

/// Whether `attend_group` serves head dimension `hd` on this CPU.
pub fn group_available(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        hd.is_multiple_of(64) && z::group_available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = hd;
        false
    }
}

/// `attend` for all `g` query heads of one row of a batch of several rows (tinyBLAS's
/// order; `decode` false), as register-blocked matmuls: `q` and `out` are `[g, hd]`, the
/// heads share the cache rows `lo..=hi` of `k`/`v`. Every output is bit-identical to
/// `attend`'s for each head.
///
/// # Panics
/// If `group_available(hd)` is false.
#[allow(clippy::too_many_arguments)]
pub fn attend_group(
    q: &[f32],
    g: usize,
    k: &[f32],
    v: &[f32],
    hd: usize,
    range: (usize, usize, usize),
    scale: f32,
    scratch: &mut GroupScratch,
    out: &mut [f32],
) {
    assert!(group_available(hd), "attend_group: hd {hd} on this CPU");
    let (lo, hi, _) = range;
    assert!(lo <= hi && (hi + 1) * hd <= k.len() && (hi + 1) * hd <= v.len());
    assert!(q.len() >= g * hd && out.len() >= g * hd);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: features checked by group_available; slice sizes checked just above.
    unsafe {
        z::attend_group(q, g, k, v, hd, range, scale, scratch, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_is_within_two_ulp_of_exp_and_saturates() {
        for i in -2000..=800 {
            let x = i as f32 * 0.05;
            let (got, want) = (expf(x), (x as f64).exp());
            if want < 1e-37 {
                assert!(got < 1e-36, "{x}: {got}");
                continue;
            }
            let rel = ((got as f64 - want) / want).abs();
            assert!(rel < 3e-7, "{x}: {got} vs {want}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
    }

    #[test]
    fn the_zmm_path_equals_the_portable_one_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if z::available() {
            let hd = 256;
            let n = 150;
            let f = |i: usize, s: f32| f16::from_f32((i as f32 * s).sin() * 1.5).to_f32();
            let k: Vec<f32> = (0..n * hd).map(|i| f(i, 0.37)).collect();
            let v: Vec<f32> = (0..n * hd).map(|i| f(i, 0.11)).collect();
            for decode in [true, false] {
                for (lo, hi, base) in [(0, n - 1, 0), (7, 100, 3), (40, 41, 0)] {
                    let (mut qa, mut qb) = ((0..hd).map(|i| f(i, 0.7)).collect::<Vec<_>>(), vec![]);
                    qb.extend_from_slice(&qa);
                    let (mut sa, mut sb) = (vec![0f32; n], vec![0f32; n]);
                    let (mut oa, mut ob) = (vec![0f32; hd], vec![0f32; hd]);
                    let (mut ca, mut cb) = (Scratch::default(), Scratch::default());
                    let r = (lo, hi, base);
                    attend_body(
                        &mut qa, &k, &v, hd, r, 0.5, decode, &mut sa, &mut ca, &mut oa,
                    );
                    // SAFETY: z::available() said yes.
                    unsafe {
                        z::attend(
                            &mut qb, &k, &v, hd, r, 0.5, decode, &mut sb, &mut cb, &mut ob,
                        )
                    };
                    assert_eq!(
                        oa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        ob.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "decode {decode}, range {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_vector_expf_equals_the_scalar_one_bit_for_bit() {
        #[cfg(target_arch = "x86_64")]
        if z::group_available() {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let mut xs: Vec<f32> = (0..20_000)
                .map(|_| rng.gen_range(-110.0f32..90.0))
                .collect();
            xs.extend((0..20_000).map(|_| rng.gen_range(-30.0f32..0.0)));
            xs.extend([
                f32::NEG_INFINITY,
                -0.0,
                0.0,
                -87.5,
                -103.0,
                -150.0,
                88.7,
                89.0,
            ]);
            for c in xs.chunks(16) {
                let mut a = [0f32; 16];
                a[..c.len()].copy_from_slice(c);
                // SAFETY: features checked above.
                let got: [f32; 16] = unsafe { std::mem::transmute(z::expf16_for_test(a)) };
                for (x, g) in a.iter().zip(got) {
                    assert_eq!(expf(*x).to_bits(), g.to_bits(), "expf({x})");
                }
            }
        }
    }

    /// The grouped, register-blocked prefill form against `attend` head by head, on fresh
    /// random f16 data: every output bit-identical.
    #[test]
    fn attend_group_equals_attend_per_head_bit_for_bit() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for hd in [64, 256] {
            if !group_available(hd) {
                eprintln!("skipped: no AVX-512F/F16C");
                return;
            }
            let n = 300;
            let mut h = |s: f32| f16::from_f32(rng.gen_range(-s..s)).to_f32();
            let k: Vec<f32> = (0..n * hd).map(|_| h(2.0)).collect();
            let v: Vec<f32> = (0..n * hd).map(|_| h(1.5)).collect();
            for g in [1, 2, 3, 4, 5, 8] {
                let q: Vec<f32> = (0..g * hd).map(|_| h(3.0)).collect();
                for (lo, hi, base) in [
                    (0, n - 1, 0),
                    (7, 100, 3),
                    (40, 41, 0),
                    (5, 5, 9),
                    (0, 16, 16),
                    (33, 250, 1),
                ] {
                    let mut want = vec![0f32; g * hd];
                    let mut sc = Scratch::default();
                    for a in 0..g {
                        let mut qa = q[a * hd..(a + 1) * hd].to_vec();
                        let mut scores = vec![0f32; n];
                        attend(
                            &mut qa,
                            &k,
                            &v,
                            hd,
                            (lo, hi, base),
                            0.0625,
                            false,
                            &mut scores,
                            &mut sc,
                            &mut want[a * hd..(a + 1) * hd],
                        );
                    }
                    let mut got = vec![1f32; g * hd];
                    let mut gs = GroupScratch::default();
                    attend_group(&q, g, &k, &v, hd, (lo, hi, base), 0.0625, &mut gs, &mut got);
                    for (i, (w, x)) in want.iter().zip(&got).enumerate() {
                        assert_eq!(
                            w.to_bits(),
                            x.to_bits(),
                            "hd {hd} g {g} range {:?} at {i}: {w} vs {x}",
                            (lo, hi, base)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn attend_matches_an_f64_softmax() {
        let hd = 64;
        let n = 40;
        let f = |i: usize, s: f32| f16::from_f32(((i as f32 * s).sin()) * 0.5).to_f32();
        let k: Vec<f32> = (0..n * hd).map(|i| f(i, 0.37)).collect();
        let v: Vec<f32> = (0..n * hd).map(|i| f(i, 0.11)).collect();
        let q0: Vec<f32> = (0..hd).map(|i| f(i, 0.73) * 2.0).collect();
        for decode in [true, false] {
            let (lo, hi, base) = (3, n - 1, 5);
            let mut q = q0.clone();
            let mut scores = vec![0f32; n];
            let mut out = vec![0f32; hd];
            let mut sc = Scratch::default();
            attend(
                &mut q,
                &k,
                &v,
                hd,
                (lo, hi, base),
                0.125,
                decode,
                &mut scores,
                &mut sc,
                &mut out,
            );
            let s: Vec<f64> = (lo..=hi)
                .map(|t| {
                    (0..hd)
                        .map(|d| q[d] as f64 * k[t * hd + d] as f64)
                        .sum::<f64>()
                        * 0.125
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for d in 0..hd {
                let want: f64 = (lo..=hi)
                    .map(|t| (s[t - lo] - m).exp() / z * v[t * hd + d] as f64)
                    .sum();
                assert!(
                    (out[d] as f64 - want).abs() < 2e-3,
                    "{d}: {} vs {want}",
                    out[d]
                );
            }
        }
    }
}
