//! AVX2 kernel for MLX affine matrices, one source for every bit width `B`.
//!
//! Layout: a row's codes are an LSB-first bit stream, so 8 consecutive codes occupy exactly
//! `B` bytes starting on a byte boundary. 1- and 2-bit codes decode through byte tables;
//! 8-bit ones widen directly; 3/4-bit ones are one 32-bit broadcast shifted by `i·B` per
//! lane; 5/6-bit ones are split in halves of four codes (low and high lanes). Codes are
//! unpacked once per weight row and group and multiplied into up to four activation rows.
//! Per group `acc += s · Σ q·x`, with `β · Σ x` from the precomputed group sums.
//! Tested against `neagari_quant::mlx_affine::dot_row` (see `super::tests`).

use std::arch::x86_64::*;

use neagari_quant::mlx_affine::{AffineLayout, ScaleType};

use super::AffineGemmFn;

#[cfg(test)]
use super::AffineQ8GemmFn;

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
                    _ => row_dot1::<B>(l.group, st, k, &row, xs, sums),
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

/// Element `i` of a scales/biases row, converted with F16C (the `half` crate's portable
/// conversion costs more than a whole group's FMAs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_at(st: ScaleType, bytes: &[u8], i: usize) -> f32 {
    // SAFETY: the caller passes i < the row's group count; the row holds that many
    // elements of `st` (checked in `gemm`).
    unsafe {
        match st {
            ScaleType::F16 => {
                let h = std::ptr::read_unaligned(bytes.as_ptr().add(2 * i) as *const u16);
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
            }
            ScaleType::BF16 => {
                let h = std::ptr::read_unaligned(bytes.as_ptr().add(2 * i) as *const u16);
                f32::from_bits((h as u32) << 16)
            }
            ScaleType::F32 => std::ptr::read_unaligned(bytes.as_ptr().add(4 * i) as *const f32),
        }
    }
}

/// Codes of one byte as f32 lanes: 1-bit codes decode by a table lookup, one load per
/// byte instead of a broadcast, shift, mask and convert.
static LUT1: [[f32; 8]; 256] = lut1();

const fn lut1() -> [[f32; 8]; 256] {
    let mut t = [[0f32; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            t[b][i] = ((b >> i) & 1) as f32;
            i += 1;
        }
        b += 1;
    }
    t
}

/// Little-endian integer of the `n ≤ 8` bytes at `p`, built from plain loads (a byte copy
/// into a stack array read back as a wider integer would stall on store forwarding).
#[inline(always)]
unsafe fn load_bits(p: *const u8, n: usize) -> u64 {
    // SAFETY (all arms): the caller guarantees n readable bytes at p.
    unsafe {
        let b = |i: usize| *p.add(i) as u64;
        let w16 = |i: usize| u16::from_le(std::ptr::read_unaligned(p.add(i) as *const u16)) as u64;
        let w32 = |i: usize| u32::from_le(std::ptr::read_unaligned(p.add(i) as *const u32)) as u64;
        match n {
            1 => b(0),
            2 => w16(0),
            3 => w16(0) | b(2) << 16,
            4 => w32(0),
            5 => w32(0) | b(4) << 32,
            6 => w32(0) | w16(4) << 32,
            _ => u64::from_le(std::ptr::read_unaligned(p as *const u64)),
        }
    }
}

/// Eight `B`-bit codes from the `B` bytes at `p`, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack8<const B: usize>(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees B bytes at p (8 codes of B bits); table rows are 32 /
    // 16 bytes.
    unsafe {
        match B {
            1 => _mm256_loadu_ps(LUT1[*p as usize].as_ptr()),
            8 => _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))),
            _ => {
                let v = load_bits(p, B);
                let b = B as i32;
                let mask = _mm256_set1_epi32(((1u32 << B) - 1) as i32);
                let q = if B <= 4 {
                    // Eight codes fit one 32-bit lane: broadcast and shift by i·B.
                    let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
                    _mm256_srlv_epi32(_mm256_set1_epi32(v as u32 as i32), shifts)
                } else {
                    // Halves of four codes each (≤ 32 bits) in the low and high lanes.
                    let lo = v as u32 as i32;
                    let hi = (v >> (4 * B)) as u32 as i32;
                    let both = _mm256_set_m128i(_mm_set1_epi32(hi), _mm_set1_epi32(lo));
                    let shifts = _mm256_setr_epi32(0, b, 2 * b, 3 * b, 0, b, 2 * b, 3 * b);
                    _mm256_srlv_epi32(both, shifts)
                };
                _mm256_cvtepi32_ps(_mm256_and_si256(q, mask))
            }
        }
    }
}

/// Thirty-two `B`-bit codes from the `4B` bytes at `p`, as four vectors of eight. 2-bit codes
/// take one broadcast per 16 codes (two shifts of the same word) instead of one per 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack32<const B: usize>(p: *const u8) -> [__m256; 4] {
    // SAFETY: the caller guarantees 4·B bytes at p.
    unsafe {
        if B == 2 {
            let mask = _mm256_set1_epi32(3);
            let lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
            let hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
            let w0 = _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32));
            let w1 = _mm256_set1_epi32(std::ptr::read_unaligned(p.add(4) as *const i32));
            let f = |w, s| _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(w, s), mask));
            return [f(w0, lo), f(w0, hi), f(w1, lo), f(w1, hi)];
        }
        [
            unpack8::<B>(p),
            unpack8::<B>(p.add(B)),
            unpack8::<B>(p.add(2 * B)),
            unpack8::<B>(p.add(3 * B)),
        ]
    }
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
        let s = _mm256_set1_ps(scale_at(st, w.scales, g));
        let beta = scale_at(st, w.biases, g);
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

/// One weight row against one activation row (decode): four independent accumulators per
/// group, so the FMA latency does not serialise the loop (groups hold a multiple of 32
/// codes, i.e. of four 8-code chunks).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot1<const B: usize>(
    group: usize,
    st: ScaleType,
    k: usize,
    w: &Row,
    x: &[f32],
    sums: &[f32],
) -> [f32; 4] {
    let ng = k / group;
    let mut tot = _mm256_setzero_ps();
    let mut bias = 0f32;
    let cp = w.codes.as_ptr();
    let xp = x.as_ptr();
    for (g, &gsum) in sums.iter().enumerate().take(ng) {
        let mut a = [_mm256_setzero_ps(); 4];
        for c in (0..group / 8).step_by(4) {
            let col = g * group + c * 8;
            // SAFETY: col + 32 ≤ k: the 32 codes at bit col·B lie in the row's k·B/8 bytes
            // and x[col .. col + 32] in the row (lengths checked by the caller).
            unsafe {
                let qs = unpack32::<B>(cp.add(col * B / 8));
                for (u, (acc, q)) in a.iter_mut().zip(qs).enumerate() {
                    *acc = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp.add(col + 8 * u)), *acc);
                }
            }
        }
        let acc = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        tot = _mm256_fmadd_ps(_mm256_set1_ps(scale_at(st, w.scales, g)), acc, tot);
        bias += scale_at(st, w.biases, g) * gsum;
    }
    [hsum(tot) + bias, 0.0, 0.0, 0.0]
}

/// 1-bit codes × Q8_0 activations, `AffineQ8GemmFn`. Per 32 codes (one uint32 word, one
/// activation block): the word's bytes are spread over the 32 byte lanes (`pshufb`), each
/// lane tests its bit, the resulting 0x00/0xFF mask selects the int8 activations and
/// `maddubs`/`madd` sum them into eight i32 lanes, scaled by the block's `d`. Per group
/// `s·Σ + β·Σx` as in the f32 kernel.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm1_q8(
    l: AffineLayout,
    st: ScaleType,
    k: usize,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    nw: usize,
    a: &[u8],
    xsum: &[f32],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let ng = k / l.group;
    let (cb, sb, ab) = (k / 8, ng * st.size(), k / 32 * 34);
    if l.bits != 1
        || !k.is_multiple_of(l.group)
        || codes.len() < nw * cb
        || scales.len() < nw * sb
        || biases.len() < nw * sb
        || a.len() < na * ab
        || xsum.len() < na * ng
        || (na > 0 && nw > 0 && out.len() < (na - 1) * out_stride + nw)
    {
        return super::gemm_q8_scalar(
            l, st, k, codes, scales, biases, nw, a, xsum, na, out, out_stride,
        );
    }
    // The activation blocks' scales as f32, once for all weight rows.
    let nb = k / 32;
    let ds: Vec<f32> = a[..na * ab]
        .chunks_exact(34)
        .map(|b| neagari_quant::float::f16_to_f32([b[0], b[1]]))
        .collect(); // [na, k/32]
    for j in 0..nw {
        let row = Row {
            codes: &codes[j * cb..(j + 1) * cb],
            scales: &scales[j * sb..(j + 1) * sb],
            biases: &biases[j * sb..(j + 1) * sb],
        };
        for i in 0..na {
            // SAFETY: AVX2/FMA/F16C were detected before this kernel was chosen; the
            // lengths were checked above.
            out[i * out_stride + j] = unsafe {
                row_dot1_q8(
                    l.group,
                    st,
                    k,
                    &row,
                    &a[i * ab..(i + 1) * ab],
                    &ds[i * nb..(i + 1) * nb],
                    &xsum[i * ng..(i + 1) * ng],
                )
            };
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot1_q8(
    group: usize,
    st: ScaleType,
    k: usize,
    w: &Row,
    a: &[u8],
    ds: &[f32],
    sums: &[f32],
) -> f32 {
    let ng = k / group;
    let per = group / 32;
    let (cp, ap, dp) = (w.codes.as_ptr(), a.as_ptr(), ds.as_ptr());
    let mut tot = _mm256_setzero_ps();
    let mut bias = 0f32;
    for (g, &gsum) in sums.iter().enumerate().take(ng) {
        // Four named accumulators (block slots), so consecutive blocks' FMAs do not wait
        // on each other; an indexed array would live on the stack.
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let first = g * per;
        let mut b = 0;
        // SAFETY (all `block1` calls): first + b < k/32, see `block1`.
        unsafe {
            while b + 4 <= per {
                a0 = block1(cp, ap, dp, first + b, a0);
                a1 = block1(cp, ap, dp, first + b + 1, a1);
                a2 = block1(cp, ap, dp, first + b + 2, a2);
                a3 = block1(cp, ap, dp, first + b + 3, a3);
                b += 4;
            }
            while b < per {
                a0 = block1(cp, ap, dp, first + b, a0);
                b += 1;
            }
        }
        let acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        tot = _mm256_fmadd_ps(_mm256_set1_ps(scale_at(st, w.scales, g)), acc, tot);
        bias += scale_at(st, w.biases, g) * gsum;
    }
    hsum(tot) + bias
}

/// `acc + d_blk · Σ_{bit i of word blk set} xq_blk[i]` (eight partial sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block1(cp: *const u8, ap: *const u8, dp: *const f32, blk: usize, acc: __m256) -> __m256 {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    // SAFETY: the caller guarantees blk < k/32: word blk of the row's k/8 code bytes,
    // activation block blk (34 bytes: f16 d, 32 × i8) of the row's k/32·34 bytes, ds[blk].
    unsafe {
        let word = std::ptr::read_unaligned(cp.add(blk * 4) as *const u32);
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(word as i32), spread);
        let sel = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        let q = _mm256_loadu_si256(ap.add(blk * 34 + 2) as *const __m256i);
        let picked = _mm256_and_si256(sel, q);
        let s32 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), picked),
            _mm256_set1_epi16(1),
        );
        _mm256_fmadd_ps(
            _mm256_broadcast_ss(&*dp.add(blk)),
            _mm256_cvtepi32_ps(s32),
            acc,
        )
    }
}

#[cfg(test)]
const _: AffineQ8GemmFn = gemm1_q8;
