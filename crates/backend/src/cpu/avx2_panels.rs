//! Prefill GEMM of the integer 32-weight block formats on AVX2 (several activation rows):
//! weight rows are unpacked once per call into row-interleaved panels, then every
//! activation row sweeps each panel.
//!
//! Panel layout: 8 weight rows (`PR`, one per i32 lane of a ymm) × `nb` blocks. Block `b` of
//! a panel is 8 ymm: ymm `t` holds, in lane `r`, the four quants `4t..4t+4` of row `r`'s
//! block `b` (bytes, unsigned 0..=31 or signed as stored). `maddubs` of ymm `t` with the
//! activation's four quants `4t..4t+4` broadcast to every lane, then `madd` with ones, is a
//! partial dot of all 8 rows at once; eight of them make the block's integer dots, one lane
//! per row. The f32 block scales then apply in one `mul` + `fma` for the 8 rows (the
//! row-major tiles of `avx2_tiles` spend a `mul` + `fma` per row and a horizontal sum at
//! the end), and each output is written as 8 contiguous floats.
//!
//! The unpacking (nibbles, fifth bits, an 8 × 8 i32 transpose) costs about as much as one
//! activation row's dots, so the drivers in `avx2_tiles` take this path only from
//! `PanelFormat::MIN_NA` activation rows on; decode (one row) keeps the row-major tiles.
//!
//! Exactness: the integer sums are exact (unsigned quants ≤ 31 against |a| ≤ 128 keep four
//! summed `maddubs` lanes ≤ 31 744; signed quants use the sign trick and widen every
//! `maddubs`), so results differ from the scalar reference only in f32 summation order.

// Register tiles are indexed [c] by constant-bound loops: clearer than iterator chains
// here, and unrolled the same.
#![allow(clippy::needless_range_loop)]

use super::avx2_tiles::{SignedBlocks, UnsignedBlocks};
use std::arch::x86_64::*;

/// Weight rows per panel: the 8 i32 lanes of a ymm.
const PR: usize = 8;
/// Activation rows per register tile. Measured at k = 640 (one thread): 3 beats 2, 4, 6 and
/// 8 for both Q5_0 and Q8_0 (4 was 10–20% slower for Q8_0); 3 accumulators, 3 i32 sums and
/// the 4 (unsigned) or 2 (signed) weight vectors in flight leave registers to spare.
const TC: usize = 3;
/// Weight rows unpacked at a time (8 panels): at k = 4096 their 36 bytes per block
/// (≈ 295 KB) stay in L2 next to an activation panel.
const WSUPER: usize = 64;
/// Activation rows swept per unpacked weight panel set (≈ 278 KB of Q8_0 at k = 4096).
const APANEL: usize = 64;

const Q8_0_BYTES: usize = 34;
const Q8_1_BYTES: usize = 36;

/// What differs between the weight formats once unpacked.
pub(crate) trait PanelFormat {
    /// Bytes per 32-weight block.
    const BYTES: usize;
    /// Quants are signed (Q8_0: sign trick) rather than unsigned 0..=31.
    const SIGNED: bool;
    /// `x = q · d + m` against Q8_1 activations (else `(q − OFFSET) · d` against Q8_0).
    const HAS_MIN: bool;
    const OFFSET: i32;
    /// Activation rows from which `gemm_signed` / `gemm_unsigned` take the panels (measured
    /// at k = 640: unsigned formats gain from 2 rows; signed ones need a `sign` and a
    /// widening `madd` per `maddubs`, so their panels beat the row-major tiles from 8).
    const MIN_NA: usize;
    /// `(d, m, 32 quants in weight order)` of the block at `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available and `p..p+BYTES` is readable.
    unsafe fn unpack(p: *const u8) -> (f32, f32, __m256i);
}

/// `PanelFormat` of a `SignedBlocks` format.
pub(crate) struct SignedPanel<W>(std::marker::PhantomData<W>);
/// `PanelFormat` of an `UnsignedBlocks` format.
pub(crate) struct UnsignedPanel<W>(std::marker::PhantomData<W>);

impl<W: SignedBlocks> PanelFormat for SignedPanel<W> {
    const BYTES: usize = W::BYTES;
    const SIGNED: bool = true;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 0;
    const MIN_NA: usize = 8;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (f32, f32, __m256i) {
        // SAFETY: per this fn's contract.
        let (d, q) = unsafe { W::load(p) };
        (_mm256_cvtss_f32(d), 0.0, q)
    }
}

impl<W: UnsignedBlocks> PanelFormat for UnsignedPanel<W> {
    const BYTES: usize = W::BYTES;
    const SIGNED: bool = false;
    const HAS_MIN: bool = W::HAS_MIN;
    const OFFSET: i32 = W::OFFSET as i32;
    const MIN_NA: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> (f32, f32, __m256i) {
        // SAFETY: per this fn's contract.
        let (d, m, q) = unsafe { W::load(p) };
        (_mm256_cvtss_f32(d), _mm256_cvtss_f32(m), q)
    }
}

/// Per activation block: its scale, and what the weight format needs besides.
struct ActBlocks {
    /// `ad[na × nb]`: activation block scales.
    ad: Vec<f32>,
    /// `ak[na × nb]`: `OFFSET · Σa` (i32) for `(q − o) · d` formats, or the Q8_1 `s`
    /// (f32 bits) for `q · d + m` formats; empty for signed formats.
    ak: Vec<i32>,
}

/// Reads every activation block's f16 scale (and `s`) and, for offset formats, sums its
/// quants: once per call instead of once per weight panel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_blocks<F: PanelFormat>(a: *const u8, na: usize, nb: usize) -> ActBlocks {
    let abytes = if F::HAS_MIN { Q8_1_BYTES } else { Q8_0_BYTES };
    let need_k = !F::SIGNED;
    let mut ab = ActBlocks {
        ad: Vec::with_capacity(na * nb),
        ak: Vec::with_capacity(if need_k { na * nb } else { 0 }),
    };
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    for blk in 0..na * nb {
        // SAFETY: the caller's operands hold na rows of nb blocks of `abytes` (tiles::check).
        let p = unsafe { a.add(blk * abytes) };
        let h = |o: usize| {
            // SAFETY: the block's first 4 bytes (d, and s for Q8_1) are readable.
            let v = unsafe { (p.add(o) as *const u16).read_unaligned() };
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v as i32)))
        };
        ab.ad.push(h(0));
        if F::HAS_MIN {
            ab.ak.push(h(2).to_bits() as i32);
        } else if need_k {
            // SAFETY: the block's 32 quants follow its 2 bytes of d.
            let q = unsafe { _mm256_loadu_si256(p.add(2) as *const __m256i) };
            // Σa via maddubs(1, a): pairs, then quads, then a horizontal i32 sum.
            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            ab.ak.push(F::OFFSET * _mm_cvtsi128_si32(s));
        }
    }
    ab
}

/// Unpacked weight rows `j0..j0 + rn` (rn ≤ WSUPER), panel after panel.
struct Panels {
    /// `q[panels × nb × 8]`: see the module doc; rows past `rn` are zero.
    q: Vec<__m256i>,
    /// `qa[panels × nb × 8]`: |q| of `q` (signed formats only, else empty).
    qa: Vec<__m256i>,
    /// `d[panels × nb]`, `m[panels × nb]`: per-row block scales and mins, lane = row.
    d: Vec<__m256>,
    m: Vec<__m256>,
}

/// 8 × 8 transpose of i32: `out[t]` lane `r` = `v[r]` lane `t`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    // Per 128-bit half: u0 = dword 0 (low half) / 4 (high half) of rows 0..4, and so on.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256(u0, u4, 0x20),
        _mm256_permute2x128_si256(u1, u5, 0x20),
        _mm256_permute2x128_si256(u2, u6, 0x20),
        _mm256_permute2x128_si256(u3, u7, 0x20),
        _mm256_permute2x128_si256(u0, u4, 0x31),
        _mm256_permute2x128_si256(u1, u5, 0x31),
        _mm256_permute2x128_si256(u2, u6, 0x31),
        _mm256_permute2x128_si256(u3, u7, 0x31),
    ]
}

/// Unpacks weight rows `j0..j0 + rn` into `p` (reusing its allocations).
///
/// # Safety
/// AVX2, FMA and F16C are available; rows `j0..j0 + rn` of `wrb` bytes (nb blocks) lie in `w`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_panels<F: PanelFormat>(
    p: &mut Panels,
    w: *const u8,
    wrb: usize,
    nb: usize,
    j0: usize,
    rn: usize,
) {
    let np = rn.div_ceil(PR);
    p.q.clear();
    p.qa.clear();
    p.d.clear();
    p.m.clear();
    for pi in 0..np {
        for b in 0..nb {
            let mut v = [_mm256_setzero_si256(); PR];
            let mut d = [0f32; PR];
            let mut m = [0f32; PR];
            for r in 0..PR.min(rn - pi * PR) {
                // SAFETY: row j0 + pi·8 + r < j0 + rn lies in w; block b < nb lies in the row.
                let (dr, mr, q) =
                    unsafe { F::unpack(w.add((j0 + pi * PR + r) * wrb + b * F::BYTES)) };
                (v[r], d[r], m[r]) = (q, dr, mr);
            }
            let t = transpose8(v);
            p.q.extend_from_slice(&t);
            if F::SIGNED {
                p.qa.extend(t.iter().map(|&x| _mm256_abs_epi8(x)));
            }
            // SAFETY: d and m are 8 f32 each.
            unsafe {
                p.d.push(_mm256_loadu_ps(d.as_ptr()));
                if F::HAS_MIN {
                    p.m.push(_mm256_loadu_ps(m.as_ptr()));
                }
            }
        }
    }
}

/// Dots of one panel (8 weight rows) with activation rows `i0..i0 + C`:
/// `[c]` lane `r` = dot(panel row r, activation row i0 + c).
///
/// # Safety
/// AVX2, FMA and F16C are available; `pi` is a panel of `p`, rows `i0..i0 + C` lie in `a`
/// (`arb` bytes each) and in `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_tile<F: PanelFormat, const C: usize>(
    p: &Panels,
    pi: usize,
    nb: usize,
    a: *const u8,
    arb: usize,
    ab: &ActBlocks,
    i0: usize,
) -> [__m256; C] {
    let (abytes, qoff) = if F::HAS_MIN {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); C];
    // SAFETY (whole body): indices stay inside the panel (pi·nb + b < panels·nb) and the
    // activation rows i0..i0 + C per the caller; every block b < nb.
    unsafe {
        let wq = p.q.as_ptr().add(pi * nb * PR);
        let wa = if F::SIGNED {
            p.qa.as_ptr().add(pi * nb * PR)
        } else {
            wq
        };
        let mut arow = [std::ptr::null::<u8>(); C];
        for c in 0..C {
            arow[c] = a.add((i0 + c) * arb + qoff);
        }
        for b in 0..nb {
            let mut isum = [_mm256_setzero_si256(); C];
            let bq = wq.add(b * PR);
            let ba = wa.add(b * PR);
            if F::SIGNED {
                for t in 0..PR {
                    let (w, wabs) = (*bq.add(t), *ba.add(t));
                    for c in 0..C {
                        let x = (arow[c].add(b * abytes + 4 * t) as *const i32).read_unaligned();
                        // maddubs wants unsigned × signed: move the weights' signs onto the
                        // activations; each pair sum ≤ 2·128·128 needs its own widening.
                        let sa = _mm256_sign_epi8(_mm256_set1_epi32(x), w);
                        let pr = _mm256_maddubs_epi16(wabs, sa);
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(pr, ones));
                    }
                }
            } else {
                for h in 0..2 {
                    let w = [
                        *bq.add(4 * h),
                        *bq.add(4 * h + 1),
                        *bq.add(4 * h + 2),
                        *bq.add(4 * h + 3),
                    ];
                    for c in 0..C {
                        let ap = arow[c].add(b * abytes + 16 * h);
                        let x = |t: usize| {
                            _mm256_set1_epi32((ap.add(4 * t) as *const i32).read_unaligned())
                        };
                        // Four pair sums of q ≤ 31 and |a| ≤ 128 add up to ≤ 31 744 in i16.
                        let s = _mm256_add_epi16(
                            _mm256_add_epi16(
                                _mm256_maddubs_epi16(w[0], x(0)),
                                _mm256_maddubs_epi16(w[1], x(1)),
                            ),
                            _mm256_add_epi16(
                                _mm256_maddubs_epi16(w[2], x(2)),
                                _mm256_maddubs_epi16(w[3], x(3)),
                            ),
                        );
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(s, ones));
                    }
                }
            }
            let dw = *p.d.as_ptr().add(pi * nb + b);
            for c in 0..C {
                let blk = (i0 + c) * nb + b;
                let da = _mm256_set1_ps(*ab.ad.get_unchecked(blk));
                if !F::SIGNED && !F::HAS_MIN {
                    // Σ(q − o)·a = Σq·a − o·Σa.
                    isum[c] =
                        _mm256_sub_epi32(isum[c], _mm256_set1_epi32(*ab.ak.get_unchecked(blk)));
                }
                acc[c] =
                    _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum[c]), acc[c]);
                if F::HAS_MIN {
                    let s = f32::from_bits(*ab.ak.get_unchecked(blk) as u32);
                    let mw = *p.m.as_ptr().add(pi * nb + b);
                    acc[c] = _mm256_fmadd_ps(mw, _mm256_set1_ps(s), acc[c]);
                }
            }
        }
    }
    acc
}

/// Writes lanes `0..rn` of each `v[c]` to `out[(i0 + c) * out_stride + j0 ..]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store<const C: usize>(
    out: &mut [f32],
    out_stride: usize,
    j0: usize,
    rn: usize,
    i0: usize,
    v: [__m256; C],
) {
    for c in 0..C {
        let o = (i0 + c) * out_stride + j0;
        let dst = &mut out[o..o + rn];
        if rn == PR {
            // SAFETY: dst has 8 writable f32 (sliced just above).
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v[c]) };
        } else {
            let mut tmp = [0f32; PR];
            // SAFETY: tmp has 8 writable f32.
            unsafe { _mm256_storeu_ps(tmp.as_mut_ptr(), v[c]) };
            dst.copy_from_slice(&tmp[..rn]);
        }
    }
}

/// The whole GEMM through panels: `out[i * out_stride + j] = dot(w row j, a row i)`.
///
/// # Safety
/// AVX2, FMA and F16C are available and the operands passed `tiles::check` with these
/// `nb` blocks per row, `wrb` / `arb` row bytes, `nw`, `na`, `out` and `out_stride`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemm<F: PanelFormat>(
    nb: usize,
    w: *const u8,
    wrb: usize,
    nw: usize,
    a: *const u8,
    arb: usize,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    // SAFETY: per this fn's contract.
    let ab = unsafe { act_blocks::<F>(a, na, nb) };
    let mut p = Panels {
        q: Vec::new(),
        qa: Vec::new(),
        d: Vec::new(),
        m: Vec::new(),
    };
    for j0 in (0..nw).step_by(WSUPER) {
        let rn = WSUPER.min(nw - j0);
        // SAFETY: rows j0..j0 + rn < nw lie in w.
        unsafe { unpack_panels::<F>(&mut p, w, wrb, nb, j0, rn) };
        for ip in (0..na).step_by(APANEL) {
            let pn = APANEL.min(na - ip);
            for pi in 0..rn.div_ceil(PR) {
                let jp = j0 + pi * PR;
                let prn = PR.min(nw - jp);
                let mut i0 = ip;
                // SAFETY (tiles): pi is a panel of p; i0 + C ≤ ip + pn ≤ na.
                while i0 + TC <= ip + pn {
                    let v = unsafe { panel_tile::<F, TC>(&p, pi, nb, a, arb, &ab, i0) };
                    store(out, out_stride, jp, prn, i0, v);
                    i0 += TC;
                }
                // The ragged end of the activation panel (any TC ≤ 4).
                match ip + pn - i0 {
                    3 => store(out, out_stride, jp, prn, i0, unsafe {
                        panel_tile::<F, 3>(&p, pi, nb, a, arb, &ab, i0)
                    }),
                    2 => store(out, out_stride, jp, prn, i0, unsafe {
                        panel_tile::<F, 2>(&p, pi, nb, a, arb, &ab, i0)
                    }),
                    1 => store(out, out_stride, jp, prn, i0, unsafe {
                        panel_tile::<F, 1>(&p, pi, nb, a, arb, &ab, i0)
                    }),
                    _ => {}
                }
            }
        }
    }
}
