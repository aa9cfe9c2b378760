//! F32 / F16 / BF16 weight rows × f32 activation rows with AVX2 + FMA (F16C widens f16,
//! a 16-bit shift widens bf16). Tested against `neagari_quant::float::dot_*` in
//! tests/kernels_legacy.rs.

// Register tiles are indexed [r][c] by constant-bound loops: clearer than iterator chains
// here, and unrolled the same.
#![allow(clippy::needless_range_loop)]

use crate::cpu::avx2_tiles::{available, hsum, run, Operands, TileKernel};
use crate::cpu::tiles::check;
use std::arch::x86_64::*;

/// One float element type as stored in a weight row.
pub(crate) trait FloatElems {
    const BYTES: usize;
    /// The 8 elements at `p`, widened to f32.
    ///
    /// # Safety
    /// AVX2/FMA/F16C are available and `p..p + 8·BYTES` is readable.
    unsafe fn load8(p: *const u8) -> __m256;
    /// The element at `p`, widened to f32.
    ///
    /// # Safety
    /// `p..p + BYTES` is readable.
    unsafe fn load1(p: *const u8) -> f32;
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;

impl FloatElems for F32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 32 readable bytes per the contract; loadu has no alignment need.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 4 readable bytes per the contract.
        unsafe { (p as *const f32).read_unaligned() }
    }
}

impl FloatElems for F16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes per the contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the contract.
        neagari_quant::float::f16_to_f32(unsafe { (p as *const [u8; 2]).read() })
    }
}

impl FloatElems for BF16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes per the contract.
        let h = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the contract.
        neagari_quant::float::bf16_to_f32(unsafe { (p as *const [u8; 2]).read() })
    }
}

pub(crate) struct Float<E>(std::marker::PhantomData<E>);

impl<E: FloatElems> TileKernel for Float<E> {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const C: usize>(
        ops: &Operands,
        j0: usize,
        i0: usize,
    ) -> [[f32; C]; R] {
        let k = ops.nb;
        // SAFETY (whole body): j0 + R <= nw, i0 + C <= na per the trait contract, and every
        // element index e < k, so all reads stay inside the checked rows.
        let w: [*const u8; R] = std::array::from_fn(|r| unsafe { ops.wrow(j0 + r) });
        let a: [*const u8; C] = std::array::from_fn(|c| unsafe { ops.arow(i0 + c) });
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut acc2 = [[_mm256_setzero_ps(); C]; R];
        let mut e = 0;
        if C == 1 {
            // Decode: two accumulator sets hide the FMA latency with few rows in flight.
            while e + 16 <= k {
                let (a0, a1) = unsafe {
                    (
                        _mm256_loadu_ps(a[0].add(4 * e) as *const f32),
                        _mm256_loadu_ps(a[0].add(4 * e + 32) as *const f32),
                    )
                };
                for r in 0..R {
                    let (w0, w1) = unsafe {
                        (
                            E::load8(w[r].add(e * E::BYTES)),
                            E::load8(w[r].add((e + 8) * E::BYTES)),
                        )
                    };
                    acc[r][0] = _mm256_fmadd_ps(w0, a0, acc[r][0]);
                    acc2[r][0] = _mm256_fmadd_ps(w1, a1, acc2[r][0]);
                }
                e += 16;
            }
        }
        while e + 8 <= k {
            let av: [__m256; C] =
                std::array::from_fn(|c| unsafe { _mm256_loadu_ps(a[c].add(4 * e) as *const f32) });
            for r in 0..R {
                let wv = unsafe { E::load8(w[r].add(e * E::BYTES)) };
                for c in 0..C {
                    acc[r][c] = _mm256_fmadd_ps(wv, av[c], acc[r][c]);
                }
            }
            e += 8;
        }
        let mut res = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let mut s = hsum(_mm256_add_ps(acc[r][c], acc2[r][c]));
                for t in e..k {
                    s += unsafe {
                        E::load1(w[r].add(t * E::BYTES))
                            * (a[c].add(4 * t) as *const f32).read_unaligned()
                    };
                }
                res[r][c] = s;
            }
        }
        res
    }
}

/// `GemmFn` of float weights of element type `E` against f32 activation rows.
///
/// # Panics
/// On a broken `GemmFn` shape contract (see `tiles::check`), or if the CPU lacks AVX2/FMA/F16C.
pub(crate) fn gemm<E: FloatElems>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = check(k, 1, k * E::BYTES, 4 * k, w, nw, a, na, out, out_stride);
    assert!(
        available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    let ops = Operands {
        nb: k,
        w: w.as_ptr(),
        wrb: s.wrb,
        a: a.as_ptr(),
        arb: s.arb,
        ad: &[],
        ac: &[],
        corr: &[],
    };
    // SAFETY: features checked just above; operands checked by tiles::check.
    unsafe { run::<Float<E>>(&ops, nw, na, out, out_stride) }
}
