//! AVX2 kernel for MLX affine matrices, one source for every bit width `B`.
//!
//! Layout: a row's codes are an LSB-first bit stream, so 8 consecutive codes occupy exactly
//! `B` bytes starting on a byte boundary. They are read as one little-endian integer `v`,
//! split in halves (`v` and `v >> 4B`, each ≤ 32 bits), broadcast to the low and high four
//! lanes and shifted by `[0, B, 2B, 3B]` per lane: eight codes as i32, then f32. Codes are
//! unpacked once per weight row and group and multiplied into up to four activation rows.
//! Per group `acc += s · Σ q·x`, with `β · Σ x` from the precomputed group sums.
//! Tested against `neagari_quant::mlx_affine::dot_row` (see `super::tests`).

use std::arch::x86_64::*;

use neagari_quant::mlx_affine::{AffineLayout, ScaleType};

use super::AffineGemmFn;

pub(super) fn gemm_for(bits: u32) -> Option<AffineGemmFn> {
    Some(match bits {
        1 => gemm::<1>,
        2 => gemm::<2>,
        3 => gemm::<3>,
        4 => gemm::<4>,
        5 => gemm::<5>,
        6 => gemm::<6>,
        8 => gemm::<8>,
        _ => return None,
    })
}

#[allow(clippy::too_many_arguments)]
fn gemm<const B: usize>(
    l: AffineLayout,
    st: ScaleType,
    k: usize,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    nw: usize,
    x: &[f32],
    xsum: &[f32],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let ng = k / l.group;
    let (cb, sb) = (k * B / 8, ng * st.size());
    // The kernel reads through raw pointers; these bounds make every read in range.
    if B != l.bits as usize
        || codes.len() < nw * cb
        || scales.len() < nw * sb
        || biases.len() < nw * sb
        || x.len() < na * k
        || xsum.len() < na * ng
        || (na > 0 && nw > 0 && out.len() < (na - 1) * out_stride + nw)
    {
        return super::gemm_scalar(
            l, st, k, codes, scales, biases, nw, x, xsum, na, out, out_stride,
        );
    }
    for j in 0..nw {
        let row = Row {
            codes: &codes[j * cb..(j + 1) * cb],
            scales: &scales[j * sb..(j + 1) * sb],
            biases: &biases[j * sb..(j + 1) * sb],
        };
        let mut i0 = 0;
        while i0 < na {
            let nr = (na - i0).min(4);
            let xs = &x[i0 * k..(i0 + nr) * k];
            let sums = &xsum[i0 * ng..(i0 + nr) * ng];
            // SAFETY: AVX2/FMA/F16C were detected before this kernel was chosen; the
            // slices above hold exactly `nr` activation rows and one weight row.
            let r = unsafe {
                match nr {
                    4 => row_dot::<B, 4>(l.group, st, k, &row, xs, sums),
                    3 => row_dot::<B, 3>(l.group, st, k, &row, xs, sums),
                    2 => row_dot::<B, 2>(l.group, st, k, &row, xs, sums),
                    _ => row_dot::<B, 1>(l.group, st, k, &row, xs, sums),
                }
            };
            for (r, v) in r.iter().take(nr).enumerate() {
                out[(i0 + r) * out_stride + j] = *v;
            }
            i0 += nr;
        }
    }
}

struct Row<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    biases: &'a [u8],
}

/// Eight `B`-bit codes from the `B` bytes at `p`, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack8<const B: usize>(p: *const u8) -> __m256 {
    let mut t = [0u8; 8];
    // SAFETY: the caller guarantees B bytes at p (8 codes of B bits).
    unsafe { std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), B) };
    let v = u64::from_le_bytes(t);
    let lo = v as u32 as i32;
    let hi = (v >> (4 * B)) as u32 as i32;
    let both = _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo));
    let b = B as i32;
    let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
    let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
    _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(both, shifts), mask))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// One weight row against `R` activation rows (`xs` `[R, k]`, `sums` `[R, k/group]`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot<const B: usize, const R: usize>(
    group: usize,
    st: ScaleType,
    k: usize,
    w: &Row,
    xs: &[f32],
    sums: &[f32],
) -> [f32; 4] {
    let ng = k / group;
    let mut tot = [_mm256_setzero_ps(); R];
    let mut bias = [0f32; R];
    let cp = w.codes.as_ptr();
    let xp = xs.as_ptr();
    for g in 0..ng {
        let s = _mm256_set1_ps(st.get(w.scales, g));
        let beta = st.get(w.biases, g);
        let mut acc = [_mm256_setzero_ps(); R];
        for c in 0..group / 8 {
            let col = g * group + c * 8;
            // SAFETY: col < k, so the 8 codes at bit col·B lie in the row's k·B/8 bytes and
            // x[r·k + col .. + 8] inside row r (the caller checked both lengths).
            unsafe {
                let q = unpack8::<B>(cp.add(col * B / 8));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp.add(r * k + col)), *a);
                }
            }
        }
        for r in 0..R {
            tot[r] = _mm256_fmadd_ps(s, acc[r], tot[r]);
            bias[r] += beta * sums[r * ng + g];
        }
    }
    let mut out = [0f32; 4];
    for r in 0..R {
        out[r] = hsum(tot[r]) + bias[r];
    }
    out
}
