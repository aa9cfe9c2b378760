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
    if n >= -126 {
        j * f32::from_bits(((n + 127) as u32) << 23)
    } else {
        // Below the normal range: scale in f64 (exact) and round once.
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
