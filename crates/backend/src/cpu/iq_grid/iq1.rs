//! IQ1_S and IQ1_M × Q8_K micro-kernels, AVX2 + FMA + F16C.
//!
//! Both index, per 8 weights, an 11-bit entry of the IQ1_S grid (8 values in {−1, 0, 1})
//! and shift it by δ = ±1/8 (IQ1_S: one δ per 32 weights; IQ1_M: one per 8). Scaled by 8
//! the weight is the integer `8g + δ'` (δ' = ±1, never 0), so each 8-byte grid row is
//! shifted left by 3 (a 16-bit shift, then the bits that crossed into the next byte masked
//! off) and δ' added. `maddubs` takes its magnitude and `psignb` moves its sign onto the
//! activation; `madd` applies the group scale `2s + 1` while summing into i32 lanes. Per
//! block: `d_w · d_a · Σ / 8`, equal in exact integers to the reference's
//! `Σ ls·Σg·a + Σ ls·δ·Σa / 8` form.
//!
//! IQ1_S block (50 B): `d: f16`, `qs[32]` (low index bytes), `qh: [u16; 8]` (per 32
//! weights: high index bits `3l..3l+3`, scale bits 12..15, δ sign bit 15). IQ1_M block
//! (56 B): `qs[32]`, `qh[16]` (a nibble per 8 weights: high index bits, δ sign bit 3),
//! `scales[8]` (3 bits per 16 weights; the f16 block scale in the top nibbles of the four
//! u16).

// Per-activation-row accumulators are indexed by row inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, Micro};
use neagari_quant::iq_grids::IQ1S_GRID;
use std::arch::x86_64::*;

pub(crate) struct Iq1S;
pub(crate) struct Iq1M;
/// IQ1_S for the AVX-512 VNNI driver (see `Iq1SVnni`'s impl).
pub(crate) struct Iq1SVnni;
/// IQ1_M for the AVX-512 VNNI driver (see `Iq1MVnni`'s impl).
pub(crate) struct Iq1MVnni;

/// `2s + 1` in all 32 bytes, for each 3-bit scale `s`: the unsigned operand of
/// `vpdpbusd`, loaded rather than broadcast.
static LS_BYTES: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut s = 0;
    while s < 8 {
        t[s] = [2 * s as u8 + 1; 32];
        s += 1;
    }
    t
};

/// `8 (2s + 1)` in 16 bytes, for each 3-bit scale `s` (at most 120: still unsigned bytes).
static LS8_BYTES: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut s = 0;
    while s < 8 {
        t[s] = [8 * (2 * s as u8 + 1); 16];
        s += 1;
    }
    t
};

/// One IQ1_S grid row (8 bytes in {−1, 0, 1}) of an 11-bit index.
#[inline(always)]
unsafe fn row(idx: usize) -> i64 {
    // SAFETY: callers pass 11-bit indices (2048 entries).
    unsafe { *IQ1S_GRID.get_unchecked(idx & 2047) as i64 }
}

/// `8g + δ'` for the grid bytes `g` of four rows and ±1 bytes `delta`.
#[inline(always)]
unsafe fn weights(g: __m256i, delta: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; the caller enables AVX2.
    unsafe {
        let g8 = _mm256_and_si256(_mm256_slli_epi16::<3>(g), _mm256_set1_epi8(-8));
        _mm256_add_epi8(g8, delta)
    }
}

/// Adds `Σ w·a` of 32 weights `w` (signed bytes, never 0) and activation quants at `p`,
/// scaled per 16-bit pair by `ls`, to `sum`.
#[inline(always)]
unsafe fn dot32(sum: __m256i, w_abs: __m256i, w: __m256i, p: *const u8, ls: __m256i) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p` and enables AVX2.
    unsafe {
        let av = _mm256_sign_epi8(load256(p), w);
        _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, av), ls))
    }
}

/// `0x0101…01` or `0xffff…ff` (eight ±1 bytes) for a clear or set δ sign.
#[inline(always)]
fn delta8(neg: bool) -> i64 {
    if neg {
        -1
    } else {
        0x0101_0101_0101_0101
    }
}

/// The four grid rows of IQ1_S's 32-weight group `ib` of block `wb`, and its `qh` word
/// (high index bits, scale bits 12..15, δ sign bit 15).
#[inline(always)]
unsafe fn iq1s_group(wb: *const u8, ib: usize) -> (__m256i, usize) {
    // SAFETY: the caller passes a whole 50-byte block and ib < 8; indices are 11 bits.
    unsafe {
        let h = (wb.add(34 + 2 * ib) as *const u16).read_unaligned() as usize;
        let idx = |l: usize| *wb.add(2 + 4 * ib + l) as usize | ((h >> (3 * l)) & 7) << 8;
        let g = _mm256_setr_epi64x(row(idx(0)), row(idx(1)), row(idx(2)), row(idx(3)));
        (g, h)
    }
}

/// IQ1_M's block scale (the f16 in the top nibbles of the four scale words), divided by 8.
#[inline(always)]
unsafe fn iq1m_d(wb: *const u8) -> f32 {
    // SAFETY: the caller passes a whole 56-byte block and enables F16C.
    unsafe {
        let sc = |i: usize| (wb.add(48 + 2 * i) as *const u16).read_unaligned();
        let (s0, s1, s2, s3) = (sc(0), sc(1), sc(2), sc(3));
        let d16 = (s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(d16 as i32))) * 0.125
    }
}

/// IQ1_M's group `ib` of block `wb`: the four grid rows, the ±1 δ' bytes, and the 6 scale
/// bits (two 3-bit scales, one per 16 weights).
#[inline(always)]
unsafe fn iq1m_group(wb: *const u8, ib: usize) -> (__m256i, __m256i, usize) {
    // SAFETY: the caller passes a whole 56-byte block, ib < 8, and enables AVX2.
    unsafe {
        let q0 = *wb.add(32 + 2 * ib) as usize;
        let q1 = *wb.add(33 + 2 * ib) as usize;
        let nib = [q0 & 15, q0 >> 4, q1 & 15, q1 >> 4];
        let idx = |l: usize| *wb.add(4 * ib + l) as usize | (nib[l] & 7) << 8;
        let g = _mm256_setr_epi64x(row(idx(0)), row(idx(1)), row(idx(2)), row(idx(3)));
        // δ' bytes: entry l's sign is bit 3 + 4(l % 2) of qh byte 2ib + l / 2; each
        // 128-bit lane takes its byte, tests the two bits per 8 bytes.
        let dspread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
            1, 1, 1,
        );
        let dbits = _mm256_setr_epi8(
            8, 8, 8, 8, 8, 8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128, 8, 8, 8, 8, 8,
            8, 8, 8, -128, -128, -128, -128, -128, -128, -128, -128,
        );
        let qv = _mm256_set1_epi16((wb.add(32 + 2 * ib) as *const i16).read_unaligned());
        let bit = _mm256_and_si256(_mm256_shuffle_epi8(qv, dspread), dbits);
        let dv = _mm256_or_si256(_mm256_cmpeq_epi8(bit, dbits), _mm256_set1_epi8(1));
        let s = (wb.add(48 + 2 * (ib / 2)) as *const u16).read_unaligned() >> (6 * (ib % 2));
        (g, dv, s as usize)
    }
}

/// `acc[i] += f32(sumi[i]) · (dw · d_a)`, `d_a` the f32 that starts activation block `ab[i]`.
#[inline(always)]
unsafe fn scale_into<const NA: usize>(
    acc: &mut [__m256; NA],
    sumi: &[__m256i; NA],
    ab: &[*const u8; NA],
    dw: f32,
) {
    // SAFETY: each `ab[i]` starts a Q8_K block; the caller enables AVX2/FMA.
    unsafe {
        for i in 0..NA {
            let da = (ab[i] as *const f32).read_unaligned();
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[i]), _mm256_set1_ps(dw * da), acc[i]);
        }
    }
}

/// Writes the horizontal sum of `acc[i]` to `out + i · stride`.
#[inline(always)]
unsafe fn store<const NA: usize>(acc: &[__m256; NA], out: *mut f32, stride: usize) {
    // SAFETY: the caller's tile contract makes every `out + i · stride` writable.
    unsafe {
        for (i, v) in acc.iter().enumerate() {
            *out.add(i * stride) = hsum_ps(*v);
        }
    }
}

impl Micro for Iq1S {
    const BYTES: usize = 50;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): the weight row and activation rows i < NA are nb blocks long
        // (trait contract), so every offset below is inside block b of its row; the driver
        // enables AVX2/FMA/F16C.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = crate::cpu::q8_k::avx2::load_f16(wb) * 0.125;
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let (g, h) = iq1s_group(wb, ib);
                    let wv = weights(g, _mm256_set1_epi64x(delta8(h & 0x8000 != 0)));
                    let w_abs = _mm256_abs_epi8(wv);
                    let ls = _mm256_set1_epi16(2 * ((h >> 12) & 7) as i16 + 1);
                    for i in 0..NA {
                        sumi[i] = dot32(sumi[i], w_abs, wv, ab[i].add(4 + 32 * ib), ls);
                    }
                }
                scale_into(&mut acc, &sumi, &ab, dw);
            }
            store(&acc, out, stride);
        }
    }
}

impl Micro for Iq1M {
    const BYTES: usize = 56;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): the weight row and activation rows i < NA are nb blocks long
        // (trait contract), so every offset below is inside block b of its row; the driver
        // enables AVX2/FMA/F16C.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = iq1m_d(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let (g, dv, s) = iq1m_group(wb, ib);
                    let wv = weights(g, dv);
                    let w_abs = _mm256_abs_epi8(wv);
                    let ls = _mm256_setr_m128i(
                        _mm_set1_epi16(2 * (s & 7) as i16 + 1),
                        _mm_set1_epi16(2 * ((s >> 3) & 7) as i16 + 1),
                    );
                    for i in 0..NA {
                        sumi[i] = dot32(sumi[i], w_abs, wv, ab[i].add(4 + 32 * ib), ls);
                    }
                }
                scale_into(&mut acc, &sumi, &ab, dw);
            }
            store(&acc, out, stride);
        }
    }
}

/// IQ1_S with `vpdpbusd`: the grid bytes `g ∈ {−1, 0, 1}` go onto the activation with
/// `psignb` (giving `g · a`), and one `vpdpbusd` with the scale `2s + 1` in every byte sums
/// `ls · Σ g a` into i32 lanes, so per 32 weights and row the grid gather is followed by two
/// operations (AVX2: the `8g + δ'` weights, `abs`, `psignb`, `maddubs`, `madd`, add). The δ
/// part `Σ ls · δ' · Σ a` comes once per block from the Q8_K `bsums` (one `madd` with the
/// signed scales, two per 32 weights); `8 · Σ ls g a + Σ ls δ' Σ a` is the AVX2 kernel's
/// exact integer sum.
impl Micro for Iq1SVnni {
    const BYTES: usize = 50;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): the weight row and activation rows i < NA are nb blocks long
        // (trait contract), so every offset below is inside block b of its row; grid
        // indices are 11 bits; the driver enables AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = crate::cpu::q8_k::avx2::load_f16(wb) * 0.125;
                // Signed scales ±(2s + 1) of the eight 32-weight groups, each twice (one
                // per 16-weight bsum): [g0 g0 g1 g1 g2 g2 g3 g3 | g4 g4 … g7 g7].
                let qh = _mm_loadu_si128(wb.add(34) as *const __m128i);
                let ls = _mm_or_si128(
                    _mm_and_si128(_mm_srli_epi16::<11>(qh), _mm_set1_epi16(14)),
                    _mm_set1_epi16(1),
                );
                let neg = _mm_srai_epi16::<15>(qh);
                let coef = _mm_sub_epi16(_mm_xor_si128(ls, neg), neg);
                let coef2 = _mm256_setr_m128i(
                    _mm_unpacklo_epi16(coef, coef),
                    _mm_unpackhi_epi16(coef, coef),
                );
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let (g, h) = iq1s_group(wb, ib);
                    let lsv = _mm256_loadu_si256(
                        LS_BYTES.get_unchecked((h >> 12) & 7).as_ptr() as *const __m256i
                    );
                    for i in 0..NA {
                        let ga = _mm256_sign_epi8(load256(ab[i].add(4 + 32 * ib)), g);
                        sumi[i] = _mm256_dpbusd_epi32(sumi[i], lsv, ga);
                    }
                }
                for i in 0..NA {
                    let sumd = _mm256_madd_epi16(load256(ab[i].add(260)), coef2);
                    sumi[i] = _mm256_add_epi32(_mm256_slli_epi32::<3>(sumi[i]), sumd);
                }
                scale_into(&mut acc, &sumi, &ab, dw);
            }
            store(&acc, out, stride);
        }
    }
}

/// IQ1_M with `vpdpbusd`: per 32 weights and row, `psignb` puts the grid bytes (and, in a
/// second pass, the ±1 δ bytes) onto the activation and two `vpdpbusd` add
/// `8 ls · Σ g a` and `ls · Σ δ' a` with the two 16-weight scales as unsigned bytes
/// (`8 ls ≤ 120`): the AVX2 kernel's exact `Σ ls (8g + δ') a` without forming the weights.
impl Micro for Iq1MVnni {
    const BYTES: usize = 56;

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY (whole body): the weight row and activation rows i < NA are nb blocks long
        // (trait contract), so every offset below is inside block b of its row; grid
        // indices are 11 bits, scale indices 3; the driver enables AVX2/FMA/F16C and
        // AVX-512 F/BW/VL/VNNI.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let dw = iq1m_d(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for ib in 0..8 {
                    let (g, dv, s) = iq1m_group(wb, ib);
                    let (sa, sb) = (s & 7, (s >> 3) & 7);
                    let ls1 = _mm256_setr_m128i(
                        _mm_loadu_si128(LS_BYTES.get_unchecked(sa).as_ptr() as *const __m128i),
                        _mm_loadu_si128(LS_BYTES.get_unchecked(sb).as_ptr() as *const __m128i),
                    );
                    let ls8 = _mm256_setr_m128i(
                        _mm_loadu_si128(LS8_BYTES.get_unchecked(sa).as_ptr() as *const __m128i),
                        _mm_loadu_si128(LS8_BYTES.get_unchecked(sb).as_ptr() as *const __m128i),
                    );
                    for i in 0..NA {
                        let av = load256(ab[i].add(4 + 32 * ib));
                        sumi[i] = _mm256_dpbusd_epi32(sumi[i], ls8, _mm256_sign_epi8(av, g));
                        sumi[i] = _mm256_dpbusd_epi32(sumi[i], ls1, _mm256_sign_epi8(av, dv));
                    }
                }
                scale_into(&mut acc, &sumi, &ab, dw);
            }
            store(&acc, out, stride);
        }
    }
}
