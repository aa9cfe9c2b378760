//! Float vector helpers for the non-matmul ops (attention, norms), with an AVX2 path picked
//! at run time and a portable fallback that the tests compare it with.

use std::sync::OnceLock;

fn has_avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `Σ a[i]·b[i]` over the common length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; both slices hold `n` values.
        return unsafe { avx512::dot(&a[..n], &b[..n]) };
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected at run time; both slices hold `n` values.
        return unsafe { avx2::dot(&a[..n], &b[..n]) };
    }
    dot_scalar(&a[..n], &b[..n])
}

pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    // Four partial sums, like the SIMD path, to keep rounding comparable.
    let mut s = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            s[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut t = s.iter().sum::<f32>();
    for i in chunks * 8..a.len() {
        t += a[i] * b[i];
    }
    t
}

/// `y[i] += alpha · x[i]`.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; both slices hold `n` values.
        unsafe { avx512::axpy(&mut y[..n], alpha, &x[..n]) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 and FMA were detected at run time; both slices hold `n` values.
        unsafe { avx2::axpy(&mut y[..n], alpha, &x[..n]) };
        return;
    }
    for i in 0..n {
        y[i] += alpha * x[i];
    }
}

/// `out[i · ld + j] = dot(a_i, b_j)` for the rows `a_i` of `a` (`[na, n]`) and `b_j` of `b`
/// (`[nb, n]`): each value bit-identical to `dot` on that pair (the same lanes, the same
/// order of additions), blocked four rows of `a` × two of `b` where AVX-512 runs, so that one
/// load serves several products.
pub fn dots(a: &[f32], b: &[f32], n: usize, na: usize, nb: usize, out: &mut [f32], ld: usize) {
    if na == 0 || nb == 0 {
        return;
    }
    assert!(
        a.len() >= na * n && b.len() >= nb * n && ld >= nb && out.len() >= (na - 1) * ld + nb,
        "dots: operands too short"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; the assert above bounds every access.
        unsafe { avx512::dots(a, b, n, na, nb, out, ld) };
        return;
    }
    for i in 0..na {
        for j in 0..nb {
            out[i * ld + j] = dot(&a[i * n..(i + 1) * n], &b[j * n..(j + 1) * n]);
        }
    }
}

/// `y_g += Σ_t w[g · ldw + t] · x_t` for the rows `y_g` of `y` (`[ny, n]`) and `x_t` of `x`
/// (`[m, n]`), the terms of each element added in `t` order: bit-identical to `axpy` called
/// for `t = 0, 1, …` on each row, with two rows of `y` held in registers across all `t`
/// where AVX-512 runs.
pub fn axpys(y: &mut [f32], w: &[f32], ldw: usize, x: &[f32], n: usize, ny: usize, m: usize) {
    if ny == 0 || m == 0 {
        return;
    }
    assert!(
        y.len() >= ny * n && ldw >= m && w.len() >= (ny - 1) * ldw + m && x.len() >= m * n,
        "axpys: operands too short"
    );
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; the assert above bounds every access.
        unsafe { avx512::axpys(y, w, ldw, x, n, ny, m) };
        return;
    }
    for g in 0..ny {
        for t in 0..m {
            axpy(
                &mut y[g * n..(g + 1) * n],
                w[g * ldw + t],
                &x[t * n..(t + 1) * n],
            );
        }
    }
}

/// `Σ x[i]²`.
pub fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc0,
            );
            i += 8;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let hi = _mm256_extractf128_ps(acc, 1);
        let lo = _mm256_castps256_ps128(acc);
        let s = _mm_add_ps(hi, lo);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        let mut t = _mm_cvtss_f32(s);
        while i < n {
            t += a[i] * b[i];
            i += 1;
        }
        t
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        while i + 8 <= n {
            let py = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                py,
                _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(py)),
            );
            i += 8;
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        // SAFETY (loads): i + 32 <= n, i + 16 <= n and the masked tail keep every lane in bounds.
        unsafe {
            while i + 32 <= n {
                acc0 = _mm512_fmadd_ps(
                    _mm512_loadu_ps(a.as_ptr().add(i)),
                    _mm512_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                acc1 = _mm512_fmadd_ps(
                    _mm512_loadu_ps(a.as_ptr().add(i + 16)),
                    _mm512_loadu_ps(b.as_ptr().add(i + 16)),
                    acc1,
                );
                i += 32;
            }
            if i + 16 <= n {
                acc0 = _mm512_fmadd_ps(
                    _mm512_loadu_ps(a.as_ptr().add(i)),
                    _mm512_loadu_ps(b.as_ptr().add(i)),
                    acc0,
                );
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                acc1 = _mm512_fmadd_ps(
                    _mm512_maskz_loadu_ps(m, a.as_ptr().add(i)),
                    _mm512_maskz_loadu_ps(m, b.as_ptr().add(i)),
                    acc1,
                );
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        let n = y.len();
        let va = _mm512_set1_ps(alpha);
        let mut i = 0;
        // SAFETY (loads/stores): i + 16 <= n, and the masked tail touches only lanes < n.
        unsafe {
            while i + 16 <= n {
                let py = y.as_mut_ptr().add(i);
                _mm512_storeu_ps(
                    py,
                    _mm512_fmadd_ps(va, _mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(py)),
                );
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                let py = y.as_mut_ptr().add(i);
                let v = _mm512_fmadd_ps(
                    va,
                    _mm512_maskz_loadu_ps(m, x.as_ptr().add(i)),
                    _mm512_maskz_loadu_ps(m, py),
                );
                _mm512_mask_storeu_ps(py, m, v);
            }
        }
    }

    /// `dots` over rows `a` (`[na, n]`) × `b` (`[nb, n]`); see `super::dots`.
    ///
    /// # Safety
    /// AVX-512F present; `a`, `b` and `out` hold what `super::dots` asserts.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dots(
        a: &[f32],
        b: &[f32],
        n: usize,
        na: usize,
        nb: usize,
        out: &mut [f32],
        ld: usize,
    ) {
        let mut i = 0;
        while i + 4 <= na {
            let mut j = 0;
            while j + 2 <= nb {
                // SAFETY: rows i..i+4 of a and j..j+2 of b lie within the slices.
                let d = unsafe { dot4x2(a.as_ptr().add(i * n), b.as_ptr().add(j * n), n) };
                for (r, dr) in d.iter().enumerate() {
                    out[(i + r) * ld + j] = dr[0];
                    out[(i + r) * ld + j + 1] = dr[1];
                }
                j += 2;
            }
            for jj in j..nb {
                for r in i..i + 4 {
                    // SAFETY: AVX-512F is present (this function's contract).
                    out[r * ld + jj] =
                        unsafe { dot(&a[r * n..(r + 1) * n], &b[jj * n..(jj + 1) * n]) };
                }
            }
            i += 4;
        }
        for r in i..na {
            for jj in 0..nb {
                // SAFETY: as above.
                out[r * ld + jj] = unsafe { dot(&a[r * n..(r + 1) * n], &b[jj * n..(jj + 1) * n]) };
            }
        }
    }

    /// Four rows of `a` (stride `n`) against two rows of `b`: the accumulation of `dot`
    /// (two accumulators over alternate 16-lane chunks, a 16-lane step, a masked tail into
    /// the second, one reduction of their sum) for each of the eight pairs.
    #[allow(clippy::needless_range_loop)] // register blocks indexed [query][key]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot4x2(a: *const f32, b: *const f32, n: usize) -> [[f32; 2]; 4] {
        let z = _mm512_setzero_ps();
        let mut c0 = [[z; 2]; 4];
        let mut c1 = [[z; 2]; 4];
        let mut i = 0;
        // SAFETY (loads): every index stays below n within its row, as in `dot`.
        unsafe {
            while i + 32 <= n {
                let b0 = [_mm512_loadu_ps(b.add(i)), _mm512_loadu_ps(b.add(n + i))];
                let b1 = [
                    _mm512_loadu_ps(b.add(i + 16)),
                    _mm512_loadu_ps(b.add(n + i + 16)),
                ];
                for r in 0..4 {
                    let a0 = _mm512_loadu_ps(a.add(r * n + i));
                    let a1 = _mm512_loadu_ps(a.add(r * n + i + 16));
                    for j in 0..2 {
                        c0[r][j] = _mm512_fmadd_ps(a0, b0[j], c0[r][j]);
                        c1[r][j] = _mm512_fmadd_ps(a1, b1[j], c1[r][j]);
                    }
                }
                i += 32;
            }
            if i + 16 <= n {
                let b0 = [_mm512_loadu_ps(b.add(i)), _mm512_loadu_ps(b.add(n + i))];
                for r in 0..4 {
                    let a0 = _mm512_loadu_ps(a.add(r * n + i));
                    for j in 0..2 {
                        c0[r][j] = _mm512_fmadd_ps(a0, b0[j], c0[r][j]);
                    }
                }
                i += 16;
            }
            if i < n {
                let m: __mmask16 = (1u32 << (n - i)) as u16 - 1;
                let b1 = [
                    _mm512_maskz_loadu_ps(m, b.add(i)),
                    _mm512_maskz_loadu_ps(m, b.add(n + i)),
                ];
                for r in 0..4 {
                    let a1 = _mm512_maskz_loadu_ps(m, a.add(r * n + i));
                    for j in 0..2 {
                        c1[r][j] = _mm512_fmadd_ps(a1, b1[j], c1[r][j]);
                    }
                }
            }
        }
        let mut out = [[0f32; 2]; 4];
        for r in 0..4 {
            for j in 0..2 {
                out[r][j] = _mm512_reduce_add_ps(_mm512_add_ps(c0[r][j], c1[r][j]));
            }
        }
        out
    }

    /// `axpys`; see `super::axpys`.
    ///
    /// # Safety
    /// AVX-512F present; `y`, `w` and `x` hold what `super::axpys` asserts.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpys(
        y: &mut [f32],
        w: &[f32],
        ldw: usize,
        x: &[f32],
        n: usize,
        ny: usize,
        m: usize,
    ) {
        let mut g = 0;
        while g < ny {
            // SAFETY: rows g.. of y and w exist (asserted by the caller).
            unsafe {
                let (yp, wp) = (y.as_mut_ptr().add(g * n), w.as_ptr().add(g * ldw));
                if g + 2 <= ny {
                    axpys_rows::<2>(yp, wp, ldw, x.as_ptr(), n, m);
                    g += 2;
                } else {
                    axpys_rows::<1>(yp, wp, ldw, x.as_ptr(), n, m);
                    g += 1;
                }
            }
        }
    }

    /// `G` rows of `y` (stride `n`), 128 columns at a time held in `G × 8` registers while
    /// every `x_t` passes: per element `y = fma(w_t, x_t, y)` in `t` order, as `axpy`.
    #[allow(clippy::needless_range_loop)] // register blocks indexed [row][vector]
    #[target_feature(enable = "avx512f")]
    unsafe fn axpys_rows<const G: usize>(
        y: *mut f32,
        w: *const f32,
        ldw: usize,
        x: *const f32,
        n: usize,
        m: usize,
    ) {
        let mut c = 0;
        while c < n {
            let mut mask = [0 as __mmask16; 8];
            for (z, mz) in mask.iter_mut().enumerate() {
                let lanes = n.saturating_sub(c + 16 * z).min(16);
                *mz = ((1u32 << lanes) - 1) as u16;
            }
            let mut acc = [[_mm512_setzero_ps(); 8]; G];
            // SAFETY (loads/stores): masked to lanes below n of rows < G of y and < m of x; the
            // addresses of fully masked vectors are never dereferenced (hence wrapping_add).
            unsafe {
                for (gi, a) in acc.iter_mut().enumerate() {
                    for z in 0..8 {
                        a[z] = _mm512_maskz_loadu_ps(mask[z], y.wrapping_add(gi * n + c + 16 * z));
                    }
                }
                for t in 0..m {
                    let mut p = [_mm512_setzero_ps(); G];
                    for (gi, pg) in p.iter_mut().enumerate() {
                        *pg = _mm512_set1_ps(*w.add(gi * ldw + t));
                    }
                    for z in 0..8 {
                        let xv = _mm512_maskz_loadu_ps(mask[z], x.wrapping_add(t * n + c + 16 * z));
                        for gi in 0..G {
                            acc[gi][z] = _mm512_fmadd_ps(p[gi], xv, acc[gi][z]);
                        }
                    }
                }
                for (gi, a) in acc.iter().enumerate() {
                    for z in 0..8 {
                        _mm512_mask_storeu_ps(y.wrapping_add(gi * n + c + 16 * z), mask[z], a[z]);
                    }
                }
            }
            c += 128;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn simd_matches_scalar() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0usize, 1, 7, 8, 15, 16, 17, 100, 256, 1001] {
            let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - exact).abs() < 1e-4, "n={n}");
            assert!((dot_scalar(&a, &b) as f64 - exact).abs() < 1e-4, "n={n}");
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: AVX2+FMA detected.
                assert!(
                    (unsafe { avx2::dot(&a, &b) } as f64 - exact).abs() < 1e-4,
                    "avx2 n={n}"
                );
            }
            let mut y1 = b.clone();
            axpy(&mut y1, 0.5, &a);
            for i in 0..n {
                assert!((y1[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn blocked_dots_and_axpys_are_bit_identical_to_dot_and_axpy() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for n in [0usize, 1, 15, 16, 17, 31, 32, 40, 129, 256, 300] {
            for (na, nb) in [(1, 1), (4, 2), (5, 3), (9, 4), (8, 7)] {
                let a: Vec<f32> = (0..na * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let b: Vec<f32> = (0..nb * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let ld = nb + 3;
                let mut out = vec![f32::NAN; na * ld];
                dots(&a, &b, n, na, nb, &mut out, ld);
                for i in 0..na {
                    for j in 0..nb {
                        let want = dot(&a[i * n..(i + 1) * n], &b[j * n..(j + 1) * n]);
                        assert_eq!(out[i * ld + j].to_bits(), want.to_bits(), "n={n} ({i},{j})");
                    }
                }
            }
            for (ny, m) in [(1usize, 1usize), (2, 5), (3, 8), (4, 1), (5, 13)] {
                let ldw = m + 2;
                let w: Vec<f32> = (0..ny * ldw).map(|_| rng.gen_range(0.0..1.0)).collect();
                let x: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let y0: Vec<f32> = (0..ny * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let mut y = y0.clone();
                axpys(&mut y, &w, ldw, &x, n, ny, m);
                let mut want = y0;
                for g in 0..ny {
                    for t in 0..m {
                        axpy(
                            &mut want[g * n..(g + 1) * n],
                            w[g * ldw + t],
                            &x[t * n..(t + 1) * n],
                        );
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&want), "n={n} ny={ny} m={m}");
            }
        }
    }
}
