//! What the AVX2 kernels of every format share: the run-time feature check, the tile driver
//! (`run`) that walks the output in register tiles and calls a format's `TileKernel`, and
//! small building blocks (horizontal sums, f16 scale splats, nibble and bit unpacking, the
//! 32-value activation block quantizer).
//!
//! All functions here are compiled with `avx2,fma,f16c` enabled and must only be reached
//! after `available()` said yes. (AVX-512 / AVX-VNNI versions of these building blocks would
//! sit in a sibling `avx512_tiles.rs` and per-format `avx512.rs` files, with VNNI `vpdpbusd`
//! replacing the maddubs + madd pairs; this machine has neither, so none is written yet.)

// Register tiles are indexed [r][c] by constant-bound loops: clearer than iterator chains
// here, and unrolled the same.
#![allow(clippy::needless_range_loop)]

use super::avx2_panels::{PanelFormat, SignedPanel, UnsignedPanel};
use super::tiles::{for_each_tile, Tile};
use std::arch::x86_64::*;

/// AVX2 kernels need AVX2, FMA and F16C together (std caches the CPUID answer).
#[inline]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Raw views of one GEMM's operands, valid for the whole call (bounds checked by
/// `tiles::check` before any kernel runs).
pub(crate) struct Operands<'a> {
    /// Blocks (quant formats) or elements (float formats) per row.
    pub nb: usize,
    /// `w[nw × wrb]`: packed weight rows.
    pub w: *const u8,
    pub wrb: usize,
    /// `a[na × arb]`: activation rows.
    pub a: *const u8,
    pub arb: usize,
    /// `ad[na × nb]`: activation block scales as f32 (empty for f32 activations).
    pub ad: &'a [f32],
    /// `ac[na × nb]` and `corr[na × nb]`: per-activation-block constants of the unsigned
    /// tiles (empty otherwise), see `ActConst`.
    pub ac: &'a [f32],
    pub corr: &'a [[i16; 16]],
}

impl Operands<'_> {
    /// Start of weight row `j`.
    ///
    /// # Safety
    /// `j < nw`.
    #[inline(always)]
    pub unsafe fn wrow(&self, j: usize) -> *const u8 {
        // SAFETY: caller keeps j < nw; the row lies inside `w` (checked by tiles::check).
        unsafe { self.w.add(j * self.wrb) }
    }

    /// Start of activation row `i`.
    ///
    /// # Safety
    /// `i < na`.
    #[inline(always)]
    pub unsafe fn arow(&self, i: usize) -> *const u8 {
        // SAFETY: caller keeps i < na; the row lies inside `a` (checked by tiles::check).
        unsafe { self.a.add(i * self.arb) }
    }
}

/// A format's register tile: the dots of `R` weight rows with `C` activation rows.
pub(crate) trait TileKernel {
    /// Weight rows per tile when there is one activation row (decode).
    const R_DECODE: usize = 4;
    /// Weight rows × activation rows per tile otherwise (prefill).
    const BATCH: (usize, usize) = (2, 4);

    /// `[r][c] = dot(weight row j0 + r, activation row i0 + c)`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; `j0 + R <= nw`, `i0 + C <= na` for the operands.
    unsafe fn tile<const R: usize, const C: usize>(
        ops: &Operands,
        j0: usize,
        i0: usize,
    ) -> [[f32; C]; R];
}

/// Runs the whole GEMM in tiles: `out[i * out_stride + j] = dot(w row j, a row i)`.
///
/// # Safety
/// AVX2, FMA and F16C are available and the operands passed `tiles::check` with these
/// `nw`, `na`, `out` and `out_stride`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run<K: TileKernel>(
    ops: &Operands,
    nw: usize,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    for_each_tile(nw, na, K::R_DECODE, K::BATCH, |t: Tile| {
        // SAFETY: for_each_tile keeps j0 + rn <= nw and i0 + cn <= na; features per caller.
        unsafe {
            match (t.rn, t.cn) {
                (4, 1) => store(out, out_stride, t, K::tile::<4, 1>(ops, t.j0, t.i0)),
                (3, 1) => store(out, out_stride, t, K::tile::<3, 1>(ops, t.j0, t.i0)),
                (2, 1) => store(out, out_stride, t, K::tile::<2, 1>(ops, t.j0, t.i0)),
                (1, 1) => store(out, out_stride, t, K::tile::<1, 1>(ops, t.j0, t.i0)),
                (2, 4) => store(out, out_stride, t, K::tile::<2, 4>(ops, t.j0, t.i0)),
                (2, 3) => store(out, out_stride, t, K::tile::<2, 3>(ops, t.j0, t.i0)),
                (2, 2) => store(out, out_stride, t, K::tile::<2, 2>(ops, t.j0, t.i0)),
                (1, 4) => store(out, out_stride, t, K::tile::<1, 4>(ops, t.j0, t.i0)),
                (1, 3) => store(out, out_stride, t, K::tile::<1, 3>(ops, t.j0, t.i0)),
                (1, 2) => store(out, out_stride, t, K::tile::<1, 2>(ops, t.j0, t.i0)),
                // Shapes no kernel asks for: fall back to single dots.
                _ => {
                    for r in 0..t.rn {
                        for c in 0..t.cn {
                            let one = Tile {
                                j0: t.j0 + r,
                                rn: 1,
                                i0: t.i0 + c,
                                cn: 1,
                            };
                            store(out, out_stride, one, K::tile::<1, 1>(ops, one.j0, one.i0));
                        }
                    }
                }
            }
        }
    });
}

#[inline(always)]
fn store<const R: usize, const C: usize>(
    out: &mut [f32],
    out_stride: usize,
    t: Tile,
    v: [[f32; C]; R],
) {
    for (r, row) in v.iter().enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[(t.i0 + c) * out_stride + t.j0 + r] = x;
        }
    }
}

/// What an unsigned-quant tile needs per activation block besides its scale.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum ActConst {
    None,
    /// Q8_1 activations against `q · d + m` weights: `s / 8` as f32, multiplied by the
    /// weight's `m` in each of the 8 lanes.
    S,
    /// Q8_0 activations against `(q − o) · d` weights unpacked to unsigned `q`: for each
    /// adjacent pair of quants, `o · (a[2k] + a[2k+1])` as i16 — exactly what
    /// `maddubs(q, a)` over-counts in lane k, so subtracting it keeps the integer sums exact.
    Offset(i16),
}

/// Activation-side data of one GEMM, computed once instead of once per weight row:
/// `ad[na × nb]` block scales, `ac[na × nb]` (`ActConst::S`), `corr[na × nb]`
/// (`ActConst::Offset`); the unused ones are empty.
pub(crate) struct ActData {
    pub ad: Vec<f32>,
    pub ac: Vec<f32>,
    pub corr: Vec<[i16; 16]>,
}

pub(crate) fn act_data(a: &[u8], na: usize, nb: usize, arb: usize, konst: ActConst) -> ActData {
    use neagari_quant::float::f16_to_f32;
    let bb = arb / nb.max(1);
    let qoff = if konst == ActConst::S { 4 } else { 2 };
    let mut d = ActData {
        ad: Vec::with_capacity(na * nb),
        ac: Vec::new(),
        corr: Vec::new(),
    };
    for i in 0..na {
        for b in 0..nb {
            let blk = &a[i * arb + b * bb..i * arb + (b + 1) * bb];
            d.ad.push(f16_to_f32([blk[0], blk[1]]));
            match konst {
                ActConst::None => {}
                ActConst::S => d.ac.push(f16_to_f32([blk[2], blk[3]]) * 0.125),
                ActConst::Offset(o) => {
                    let q = &blk[qoff..];
                    d.corr.push(std::array::from_fn(|k| {
                        o * (q[2 * k] as i8 as i16 + q[2 * k + 1] as i8 as i16)
                    }));
                }
            }
        }
    }
    d
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The f16 at `p` widened to f32 in all 8 lanes.
///
/// # Safety
/// `p..p+2` is readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn splat_f16(p: *const u8) -> __m256 {
    // SAFETY: two readable bytes per the caller; read_unaligned has no alignment need.
    let h = unsafe { (p as *const i16).read_unaligned() };
    _mm256_cvtph_ps(_mm_set1_epi16(h))
}

/// 16 bytes of packed nibbles at `p` → 32 bytes 0..=15: lanes 0..16 the low nibbles, lanes
/// 16..32 the high nibbles (the weight order of Q4_0/Q4_1/Q5_0/Q5_1).
///
/// # Safety
/// `p..p+16` is readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes per the caller; the load has no alignment need.
    let v = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i)) };
    // Shift only the upper copy down by 4 (one variable shift instead of shift + insert).
    let v = _mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
}

/// Bit `j` of the little-endian u32 at `p` → byte `j` = 0xff if set, else 0.
///
/// # Safety
/// `p..p+4` is readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    // SAFETY: four readable bytes per the caller.
    let qh = unsafe { (p as *const i32).read_unaligned() };
    // Byte j takes a copy of byte j/8 of qh ...
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    // ... and is all ones after OR-ing every bit but bit j%8 exactly when that bit is set.
    let others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1))
}

/// Quantizes the 32 f32 at `x` to i8 at `q` exactly as `quantize_row_q8_0_ref` does (same
/// `d`, same `1/d`, same products, rounding half away from zero) and returns `(d, Σq)`.
///
/// # Safety
/// `x..x+32` is readable as f32 and `q..q+32` writable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_block_q8(x: *const f32, q: *mut i8) -> (f32, i32) {
    // SAFETY: 32 readable f32 per the caller; loadu has no alignment need.
    let v = unsafe {
        [
            _mm256_loadu_ps(x),
            _mm256_loadu_ps(x.add(8)),
            _mm256_loadu_ps(x.add(16)),
            _mm256_loadu_ps(x.add(24)),
        ]
    };
    let sign = _mm256_set1_ps(-0.0);
    let m = _mm256_max_ps(
        _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let amax = _mm_cvtss_f32(m);
    // llama.cpp's run-time quantizer (quantize_row_q8_0 on x86), not the `_ref` one: the
    // multiplier is 127 / amax and rounding is to nearest even. Matching it keeps the int8
    // activations, and so the whole forward pass, closest to llama.cpp's.
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let mut iq = [_mm256_setzero_si256(); 4];
    for (o, &xv) in iq.iter_mut().zip(&v) {
        let y = _mm256_mul_ps(xv, id);
        *o = _mm256_cvtps_epi32(_mm256_round_ps(
            y,
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
        ));
    }
    let sum = _mm256_add_epi32(
        _mm256_add_epi32(iq[0], iq[1]),
        _mm256_add_epi32(iq[2], iq[3]),
    );
    let sum = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b01_00_11_10));
    let sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0b10_11_00_01));
    // Pack 4 × 8 i32 → 32 i8; the packs work per 128-bit lane, the permute restores order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(iq[0], iq[1]),
        _mm256_packs_epi32(iq[2], iq[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: 32 writable bytes per the caller.
    unsafe { _mm256_storeu_si256(q as *mut __m256i, p) };
    (d, _mm_cvtsi128_si32(sum))
}

// ---------------------------------------------------------------------------------------
// Tiles shared by the integer formats. A format only says how one of its blocks unpacks to
// 32 byte-sized quants in weight order (its `avx2.rs`); the loops below are common.

/// Q8_0 / Q8_1 activation blocks: the 32 quants sit after the 2 (Q8_0) or 4 (Q8_1) bytes of
/// d (and s).
const Q8_0_BYTES: usize = 34;
const Q8_1_BYTES: usize = 36;

/// A weight format with signed 8-bit quants (Q8_0), dotted with Q8_0 activations.
pub(crate) trait SignedBlocks {
    /// Bytes per 32-weight block.
    const BYTES: usize;
    /// `(d in all lanes, 32 signed quants)` of the block at `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available and `p..p+BYTES` is readable.
    unsafe fn load(p: *const u8) -> (__m256, __m256i);
}

/// A weight format whose quants unpack to unsigned bytes 0..=31: either `x = (q − o) · d`
/// (Q4_0, Q5_0; dotted with Q8_0) or `x = q · d + m` (Q4_1, Q5_1; dotted with Q8_1).
pub(crate) trait UnsignedBlocks {
    /// Bytes per 32-weight block.
    const BYTES: usize;
    /// True for `q · d + m` formats, false for `(q − OFFSET) · d`.
    const HAS_MIN: bool;
    /// The offset `o` of the `(q − o) · d` formats.
    const OFFSET: i16 = 0;
    /// `(d, m in all lanes (anything when !HAS_MIN), 32 unsigned quants)` of the block at `p`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available and `p..p+BYTES` is readable.
    unsafe fn load(p: *const u8) -> (__m256, __m256, __m256i);
}

/// `TileKernel` of a `SignedBlocks` format.
pub(crate) struct Signed<W>(std::marker::PhantomData<W>);
/// `TileKernel` of an `UnsignedBlocks` format.
pub(crate) struct Unsigned<W>(std::marker::PhantomData<W>);

/// Prefill tile of the integer formats: one decoded weight block meets four activation
/// rows. Wider tiles run out of the 16 ymm registers and spill accumulators.
const INT_BATCH: (usize, usize) = (1, 4);

impl<W: SignedBlocks> TileKernel for Signed<W> {
    const BATCH: (usize, usize) = INT_BATCH;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const C: usize>(
        ops: &Operands,
        j0: usize,
        i0: usize,
    ) -> [[f32; C]; R] {
        let nb = ops.nb;
        let mut w = [std::ptr::null::<u8>(); R];
        let mut a = [std::ptr::null::<u8>(); C];
        let mut ad = [std::ptr::null::<f32>(); C];
        // SAFETY (whole body): j0 + R <= nw and i0 + C <= na per the trait contract, so every
        // row pointer below is inside the checked operands and every block index b < nb.
        unsafe {
            for r in 0..R {
                w[r] = ops.wrow(j0 + r);
            }
            for c in 0..C {
                a[c] = ops.arow(i0 + c).add(2);
                ad[c] = ops.ad.as_ptr().add((i0 + c) * nb);
            }
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..nb {
            let mut av = [_mm256_setzero_si256(); C];
            for c in 0..C {
                av[c] = unsafe { _mm256_loadu_si256(a[c].add(b * Q8_0_BYTES) as *const __m256i) };
            }
            for r in 0..R {
                let (dw, q) = unsafe { W::load(w[r].add(b * W::BYTES)) };
                // maddubs wants unsigned × signed: move the weights' signs onto the
                // activations. |q| ≤ 128 and |a| ≤ 127 keep the i16 pair sums unsaturated.
                let aq = _mm256_sign_epi8(q, q);
                for c in 0..C {
                    let sa = _mm256_sign_epi8(av[c], q);
                    let isum = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sa), ones);
                    let d = _mm256_mul_ps(dw, unsafe { _mm256_broadcast_ss(&*ad[c].add(b)) });
                    acc[r][c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc[r][c]);
                }
            }
        }
        reduce(acc)
    }
}

impl<W: UnsignedBlocks> TileKernel for Unsigned<W> {
    const BATCH: (usize, usize) = INT_BATCH;

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const C: usize>(
        ops: &Operands,
        j0: usize,
        i0: usize,
    ) -> [[f32; C]; R] {
        let nb = ops.nb;
        let (qoff, abytes) = if W::HAS_MIN {
            (4, Q8_1_BYTES)
        } else {
            (2, Q8_0_BYTES)
        };
        let mut w = [std::ptr::null::<u8>(); R];
        let mut a = [std::ptr::null::<u8>(); C];
        let mut ad = [std::ptr::null::<f32>(); C];
        let mut ac = [std::ptr::null::<f32>(); C];
        let mut corr = [std::ptr::null::<[i16; 16]>(); C];
        // SAFETY (whole body): as in Signed::tile.
        unsafe {
            for r in 0..R {
                w[r] = ops.wrow(j0 + r);
            }
            for c in 0..C {
                a[c] = ops.arow(i0 + c).add(qoff);
                ad[c] = ops.ad.as_ptr().add((i0 + c) * nb);
                if W::HAS_MIN {
                    ac[c] = ops.ac.as_ptr().add((i0 + c) * nb);
                } else {
                    corr[c] = ops.corr.as_ptr().add((i0 + c) * nb);
                }
            }
        }
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        for b in 0..nb {
            let mut av = [_mm256_setzero_si256(); C];
            let mut da = [_mm256_setzero_ps(); C];
            let mut ka = [_mm256_setzero_ps(); C];
            for c in 0..C {
                unsafe {
                    av[c] = _mm256_loadu_si256(a[c].add(b * abytes) as *const __m256i);
                    da[c] = _mm256_broadcast_ss(&*ad[c].add(b));
                    if W::HAS_MIN {
                        ka[c] = _mm256_broadcast_ss(&*ac[c].add(b));
                    }
                }
            }
            for r in 0..R {
                let (dw, mw, q) = unsafe { W::load(w[r].add(b * W::BYTES)) };
                for c in 0..C {
                    // q ≤ 31, |a| ≤ 127: the i16 pair sums stay far from saturation.
                    let mut p = _mm256_maddubs_epi16(q, av[c]);
                    if !W::HAS_MIN {
                        // Σ(q − o)·a per pair, still exact: |p| ≤ 7874, |corr| ≤ 4064.
                        let k = unsafe { _mm256_loadu_si256(corr[c].add(b) as *const __m256i) };
                        p = _mm256_sub_epi16(p, k);
                    }
                    let isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                    let v = _mm256_fmadd_ps(_mm256_mul_ps(dw, da[c]), isum, acc[r][c]);
                    acc[r][c] = if W::HAS_MIN {
                        // + m_w · s_a, with s_a / 8 in each of the 8 lanes.
                        _mm256_fmadd_ps(mw, ka[c], v)
                    } else {
                        v
                    };
                }
            }
        }
        reduce(acc)
    }
}

/// Horizontal sums of a tile's accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce<const R: usize, const C: usize>(acc: [[__m256; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = hsum(acc[r][c]);
        }
    }
    out
}

/// `GemmFn` of a `SignedBlocks` weight format against Q8_0 activation rows: row-major tiles
/// for few activation rows, `avx2_panels` from `PanelFormat::MIN_NA` rows on.
///
/// # Panics
/// On a broken `GemmFn` shape contract (see `tiles::check`), or if the CPU lacks AVX2/FMA/F16C.
pub(crate) fn gemm_signed<W: SignedBlocks>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = k / 32;
    let s = super::tiles::check(
        k,
        32,
        nb * W::BYTES,
        nb * Q8_0_BYTES,
        w,
        nw,
        a,
        na,
        out,
        out_stride,
    );
    assert!(
        available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    if na >= SignedPanel::<W>::MIN_NA {
        // SAFETY: features checked just above; operands checked by tiles::check.
        unsafe {
            return super::avx2_panels::gemm::<SignedPanel<W>>(
                nb,
                w.as_ptr(),
                s.wrb,
                nw,
                a.as_ptr(),
                s.arb,
                na,
                out,
                out_stride,
            );
        }
    }
    let d = act_data(a, na, nb, s.arb, ActConst::None);
    let ops = Operands {
        nb,
        w: w.as_ptr(),
        wrb: s.wrb,
        a: a.as_ptr(),
        arb: s.arb,
        ad: &d.ad,
        ac: &d.ac,
        corr: &d.corr,
    };
    // SAFETY: features checked just above; operands checked by tiles::check.
    unsafe { run::<Signed<W>>(&ops, nw, na, out, out_stride) }
}

/// `GemmFn` of an `UnsignedBlocks` weight format against Q8_1 (`HAS_MIN`) or Q8_0
/// activation rows: row-major tiles for few activation rows, `avx2_panels` from
/// `PanelFormat::MIN_NA` rows on.
///
/// # Panics
/// On a broken `GemmFn` shape contract (see `tiles::check`), or if the CPU lacks AVX2/FMA/F16C.
pub(crate) fn gemm_unsigned<W: UnsignedBlocks>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let nb = k / 32;
    let (abytes, konst) = if W::HAS_MIN {
        (Q8_1_BYTES, ActConst::S)
    } else {
        (Q8_0_BYTES, ActConst::Offset(W::OFFSET))
    };
    let s = super::tiles::check(
        k,
        32,
        nb * W::BYTES,
        nb * abytes,
        w,
        nw,
        a,
        na,
        out,
        out_stride,
    );
    assert!(
        available(),
        "AVX2 kernel called on a CPU without AVX2/FMA/F16C"
    );
    if na >= UnsignedPanel::<W>::MIN_NA {
        // SAFETY: features checked just above; operands checked by tiles::check.
        unsafe {
            return super::avx2_panels::gemm::<UnsignedPanel<W>>(
                nb,
                w.as_ptr(),
                s.wrb,
                nw,
                a.as_ptr(),
                s.arb,
                na,
                out,
                out_stride,
            );
        }
    }
    let d = act_data(a, na, nb, s.arb, konst);
    let ops = Operands {
        nb,
        w: w.as_ptr(),
        wrb: s.wrb,
        a: a.as_ptr(),
        arb: s.arb,
        ad: &d.ad,
        ac: &d.ac,
        corr: &d.corr,
    };
    // SAFETY: features checked just above; operands checked by tiles::check.
    unsafe { run::<Unsigned<W>>(&ops, nw, na, out, out_stride) }
}
