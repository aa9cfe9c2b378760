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
}
