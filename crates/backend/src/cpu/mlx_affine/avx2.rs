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

use super::sign1::{self, Acts, SignRows};

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
pub(super) unsafe fn scale_at(st: ScaleType, bytes: &[u8], i: usize) -> f32 {
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
/// take one broadcast per 16 codes (two shifts of the same word) instead of one per 8. (A
/// nibble split of 4-bit codes — one 16-byte load, and/shift, unpack, widen — measured 15%
/// slower than four broadcast-and-shift steps on Zen 4: it queues on the shuffle port.)
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
pub(super) unsafe fn hsum(v: __m256) -> f32 {
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

/// `−1` in byte `i` where bit `i` of `bits` is clear, `+1` where it is set: the word's
/// bytes spread over the 32 byte lanes (`pshufb`), each lane tests its bit.
#[inline(always)]
unsafe fn sign_bytes(bits: u32) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let v = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
        let clear = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), _mm256_setzero_si256());
        _mm256_or_si256(clear, _mm256_set1_epi8(1))
    }
}

/// 1-bit sign form × Q8_0 activations (`sign1::Sign1GemmFn`). Per 32 codes (one u32 word,
/// one activation block): `psignb` turns the int8 activations into `±a` by the code bits,
/// `maddubs`/`madd` against ones sum them into eight i32 lanes, which meet the block's
/// scale; per group the weight scale `d` (and `m·Σx` where the matrix has offsets). One
/// weight row against up to four activation rows at a time (the sign mask is shared).
pub(super) fn sign1(
    w: &SignRows,
    k: usize,
    nw: usize,
    a: &Acts,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    if !sign1::lengths_ok(w, k, nw, a, na, out, out_stride) {
        return sign1::gemm_scalar(w, k, nw, a, na, out, out_stride);
    }
    for j in 0..nw {
        let mut i0 = 0;
        while i0 < na {
            let nr = (na - i0).min(4);
            // SAFETY: AVX2/FMA/F16C were detected before this kernel was chosen;
            // `lengths_ok` covers weight row j < nw and activation rows i0 .. i0 + nr ≤ na.
            let r = unsafe {
                match nr {
                    4 => sign1_tile::<4>(w, j, k, a, i0),
                    3 => sign1_tile::<3>(w, j, k, a, i0),
                    2 => sign1_tile::<2>(w, j, k, a, i0),
                    _ => sign1_tile::<1>(w, j, k, a, i0),
                }
            };
            for (r, v) in r.iter().take(nr).enumerate() {
                out[(i0 + r) * out_stride + j] = *v;
            }
            i0 += nr;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sign1_tile<const NA: usize>(
    w: &SignRows,
    j: usize,
    k: usize,
    a: &Acts,
    i0: usize,
) -> [f32; 4] {
    let ng = k / w.group;
    let per = w.group / 32;
    let d = &w.d[j * ng * w.dt.size()..];
    // SAFETY (whole body): row j's k/8 code bytes, activation rows i0 .. i0 + NA
    // (quants [k], scales [k/4], sums [ng]) and row j's ng scales/offsets are in bounds
    // (`lengths_ok`); b < k/32 and g < ng below.
    unsafe {
        let cp = w.codes.as_ptr().add(j * k / 8);
        let qp = a.qs.as_ptr().add(i0 * k);
        let dp = a.dl.as_ptr().add(i0 * k / 4);
        let ones8 = _mm256_set1_epi8(1);
        let ones16 = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NA];
        for g in 0..ng {
            let mut t = [_mm256_setzero_ps(); NA];
            for b in g * per..(g + 1) * per {
                let sg = sign_bytes(std::ptr::read_unaligned(cp.add(4 * b) as *const u32));
                for (i, t) in t.iter_mut().enumerate() {
                    let q = _mm256_loadu_si256(qp.add(i * k + 32 * b) as *const __m256i);
                    let p = _mm256_maddubs_epi16(ones8, _mm256_sign_epi8(q, sg));
                    let s32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones16));
                    *t = _mm256_fmadd_ps(s32, _mm256_loadu_ps(dp.add(i * k / 4 + 8 * b)), *t);
                }
            }
            let dg = _mm256_set1_ps(scale_at(w.dt, d, g));
            for (acc, t) in acc.iter_mut().zip(t) {
                *acc = _mm256_fmadd_ps(dg, t, *acc);
            }
        }
        let mut out = [0f32; 4];
        for (o, acc) in out.iter_mut().zip(acc) {
            *o = hsum(acc);
        }
        if let Some(m) = w.m {
            for (i, o) in out.iter_mut().take(NA).enumerate() {
                *o += dot_f32(
                    m.as_ptr().add(j * ng),
                    a.xsum.as_ptr().add((i0 + i) * ng),
                    ng,
                );
            }
        }
        out
    }
}

/// `Σ a[i]·b[i]` over `n` f32 (the `m·Σx` terms of a sign-form row): eight lanes at a time,
/// so the bias terms do not serialise on one scalar FMA chain.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    // SAFETY: the caller guarantees n readable f32 at a and at b.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += *a.add(i) * *b.add(i);
            i += 1;
        }
        s
    }
}
