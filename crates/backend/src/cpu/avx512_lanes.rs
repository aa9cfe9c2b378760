//! Prefill of the Q8_0 / Q5_0 × Q8_0 matmul with AVX-512 VNNI, weight rows in lanes: the
//! same per-output f32 sequence as the register tile of `avx512_tiles.rs` (llama.cpp's
//! tinyBLAS order), with fewer vector operations per product.
//!
//! That order gives each output 8 f32 partial sums, lane `l` taking the four products
//! `4l..4l+4` of every block as `fma(d_w·d_a, Σ4, acc_l)`, block after block, and then one
//! horizontal sum ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The register tile keeps two
//! outputs × 8 partial sums in a zmm, so every `vpdpbusd` + `vfmadd` pair also needs its own
//! `vmulps` for `d_w·d_a` (16 lanes, two distinct values). Here a zmm holds partial sum `l`
//! of 16 outputs (16 weight rows, one activation row): one `vmulps` of the 16 rows' `d_w`
//! by the broadcast `d_a` serves all 8 partial sums of the block, and the horizontal sum
//! becomes 7 vertical adds over the 8 accumulators, after which the 16 outputs are one
//! store. Per 16 outputs and block: 8 `vpdpbusd` + 8 `vfmadd` + 1 `vmulps` (+ 8
//! `vcvtdq2ps`) where the register tile issued 8 of each of the three.
//!
//! Operands: the 16 rows' unsigned quants of a block are transposed once per weight tile
//! and activation panel (`decode`: dword `j` of vector `l` = bytes `4l..4l+4` of row `j`),
//! the activation's four bytes `4l..4l+4` come in as a `{1to16}` broadcast, and `vpdpbusd`
//! starts from `−o · Σ a[4l..4l+4]` (`init`), prepared once per call with the f32 `d_a`
//! (`prep`). Integer sums are exact, so only the f32 steps above fix the result: every
//! output is bit-identical to the register tile's (tested).
//!
//! Compiled with AVX-512 F/BW/VL/VNNI (plus the AVX2 set); reached only after
//! `avx512_tiles::available()` said yes.

// Register tiles are indexed [c][l] by constant-bound loops: clearer than iterator chains
// here, and unrolled the same.
#![allow(clippy::needless_range_loop)]

use super::avx512_tiles::VnniBlocks;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per tile: the 16 i32 / f32 lanes of a zmm.
pub(crate) const ROWS: usize = 16;
/// Activation rows per register tile: 2 × 8 accumulators + 8 weight vectors fit the 32 zmm
/// registers.
const COLS: usize = 2;
/// Activation rows per panel: a panel's prepared blocks (68 bytes each, ~350 KB at k = 640)
/// stay in L2 while the weight tiles pass, and each weight tile is decoded once per panel.
pub(crate) const PANEL: usize = 256;

/// One activation block as the kernel reads it: the 32 signed quants and, per i32 lane `l`,
/// `−o · Σ q[4l..4l+4]` (the start of `vpdpbusd` against `q + o` weights). One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct ActBlock {
    q: [i8; 32],
    init: [i32; 8],
}

/// 64 bytes, aligned for `vmovdqa64`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Z(pub(crate) [u8; 64]);

pub(crate) const ZERO: Z = Z([0; 64]);

/// Per-thread buffers, kept between calls (a prefill makes a few hundred of them).
#[derive(Default)]
struct Scratch {
    /// `blocks[na × nb]`, `d[na × nb]`: the prepared activation blocks and their f32 scales.
    blocks: Vec<ActBlock>,
    d: Vec<f32>,
    /// `q[nb × 8]`: the weight tile's transposed quants (vector `l` of block `b`); `dw[nb]`:
    /// its 16 rows' f32 scales per block.
    q: Vec<Z>,
    dw: Vec<Z>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Fills `s.blocks` / `s.d` for activation rows `i0..i0+n` (Q8_0 rows of `arb` bytes, `nb`
/// blocks) with offset `o`.
///
/// # Safety
/// The features of `avx512_tiles::available()` are present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prep(s: &mut Scratch, a: &[u8], arb: usize, nb: usize, i0: usize, n: usize, o: i32) {
    let zero = ActBlock {
        q: [0; 32],
        init: [0; 8],
    };
    s.blocks.clear();
    s.blocks.resize(n * nb, zero);
    s.d.clear();
    s.d.resize(n * nb, 0.0);
    let ov = _mm256_set1_epi8(o as u8 as i8);
    for i in 0..n {
        let row = &a[(i0 + i) * arb..(i0 + i) * arb + nb * 34];
        for (b, blk) in row.chunks_exact(34).enumerate() {
            let p = i * nb + b;
            s.d[p] = neagari_quant::float::f16_to_f32([blk[0], blk[1]]);
            // SAFETY: blk[2..34] is 32 readable bytes; the destination is a 64-byte aligned
            // ActBlock (q at 0, init at 32).
            unsafe {
                let q = _mm256_loadu_si256(blk.as_ptr().add(2) as *const __m256i);
                // o · Σ4 q per i32 lane (o as the unsigned operand), negated.
                let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ov, q);
                let init = _mm256_sub_epi32(_mm256_setzero_si256(), sum);
                let dst = s.blocks.as_mut_ptr().add(p) as *mut __m256i;
                _mm256_store_si256(dst, q);
                _mm256_store_si256(dst.add(1), init);
            }
        }
    }
}

/// Index vectors of the three `vpermt2d` stages that transpose 8 pair vectors (dword `e` of
/// pair `p`: row `2p + e/8`, dword `e%8` of its block) into 8 lane vectors (dword `j` of
/// vector `l`: row `j`, dword `l`). Stage `s` merges the vectors that differ in bit `s` of
/// their index and trades that bit for one bit of the dword index; `[s][t]` builds the
/// output whose index bit `s` is `t`.
pub(crate) fn transpose_idx() -> [[[i32; 16]; 2]; 3] {
    let mut idx = [[[0i32; 16]; 2]; 3];
    for (ti, t) in [0i32, 1].into_iter().enumerate() {
        for pos in 0..16 {
            let b = |k: usize| ((pos >> k) & 1) as i32;
            // Stage 0: position (h, p0, l1, l0) from vector p0's (h, l2 = t, l1, l0).
            idx[0][ti][pos] = b(2) * 16 + b(3) * 8 + t * 4 + b(1) * 2 + b(0);
            // Stage 1: position (h, p0, p1, l0) from vector p1's (h, p0, l1 = t, l0).
            idx[1][ti][pos] = b(1) * 16 + b(3) * 8 + b(2) * 4 + t * 2 + b(0);
            // Stage 2: position j = (p2, p1, p0, h) from vector p2's (h, p0, p1, l0 = t).
            idx[2][ti][pos] = b(3) * 16 + b(0) * 8 + b(1) * 4 + b(2) * 2 + t;
        }
    }
    idx
}

/// Transposes 8 pair vectors (dword `e` of `v[p]`: row `2p + e/8`, dword `e%8`) into 8 lane
/// vectors (dword `j` of `[l]`: row `j`, dword `l`) with the `transpose_idx` stages.
///
/// # Safety
/// The features of `avx512_tiles::available()` are present.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn transpose8(mut v: [__m512i; 8], idx: &[[__m512i; 2]; 3]) -> [__m512i; 8] {
    // Stage s: vectors v and v | 1<<s → outputs with bit s = 0 and = 1.
    for st in 0..3 {
        let bit = 1 << st;
        let mut nv = [_mm512_setzero_si512(); 8];
        for lo in (0..8).filter(|x| x & bit == 0) {
            let hi = lo | bit;
            nv[lo] = _mm512_permutex2var_epi32(v[lo], idx[st][0], v[hi]);
            nv[hi] = _mm512_permutex2var_epi32(v[lo], idx[st][1], v[hi]);
        }
        v = nv;
    }
    // After the stages, vector index bits (2, 1, 0) hold (l0, l1, l2).
    std::array::from_fn(|l| v[((l & 1) << 2) | (l & 2) | (l >> 2)])
}

/// Decodes and transposes the weight rows `min(j, rn − 1)` (`j < 16`) of `wrb` bytes from
/// `w`: `s.q[b·8 + l]` dword `j` = unsigned quants `4l..4l+4` of row `j`'s block `b`,
/// `s.dw[b]` lane `j` = its f32 scale.
///
/// # Safety
/// The features of `avx512_tiles::available()` are present; `1 ≤ rn ≤ 16` rows of `wrb`
/// bytes holding `nb` blocks each are readable at `w`, and `16 · wrb` fits an i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode<W: VnniBlocks>(
    w: *const u8,
    wrb: usize,
    rn: usize,
    nb: usize,
    idx: &[[__m512i; 2]; 3],
    s: &mut Scratch,
) {
    s.q.resize(nb * 8, Z([0; 64]));
    s.dw.resize(nb, Z([0; 64]));
    let row = |j: usize| j.min(rn - 1) * wrb;
    // Byte offsets of the 16 rows, for the scale gather.
    let offs: [i32; ROWS] = std::array::from_fn(|j| row(j) as i32);
    // SAFETY: reading 16 i32 from an array.
    let offs = unsafe { _mm512_loadu_si512(offs.as_ptr() as *const _) };
    for b in 0..nb {
        let mut v = [_mm512_setzero_si512(); 8];
        for p in 0..8 {
            // SAFETY: block b < nb of both rows per the caller.
            v[p] = unsafe {
                W::pair(
                    w.add(row(2 * p) + b * W::BYTES),
                    w.add(row(2 * p + 1) + b * W::BYTES),
                )
            };
        }
        // SAFETY: features per the caller.
        let v = unsafe { transpose8(v, idx) };
        for (l, &x) in v.iter().enumerate() {
            // SAFETY: b · 8 + l < nb · 8, the length of s.q; Z is 64-byte aligned.
            unsafe { _mm512_store_si512(s.q.as_mut_ptr().add(b * 8 + l) as _, x) };
        }
        // SAFETY: lane j reads 4 bytes at the start of block b of row min(j, rn − 1),
        // inside its readable blocks (every block has ≥ 4 bytes); the low 2 are the f16 d.
        let raw = unsafe { _mm512_i32gather_epi32::<1>(offs, w.add(b * W::BYTES) as *const i32) };
        let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
        // SAFETY: b < nb, the length of s.dw; Z is 64-byte aligned.
        unsafe { _mm512_store_ps(s.dw.as_mut_ptr().add(b) as _, dw) };
    }
}

/// Outputs of the decoded tile against activation rows `c0..c0+C` of the prepared panel:
/// `[c]` = 16 rows' dots.
///
/// # Safety
/// The features of `avx512_tiles::available()` are present; `s.q`, `s.dw` hold `nb` decoded
/// blocks and `s.blocks`, `s.d` hold rows `c0..c0+C` of `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn tile<const C: usize>(s: &Scratch, nb: usize, c0: usize) -> [__m512; C] {
    let mut acc = [[_mm512_setzero_ps(); 8]; C];
    let (qp, dwp) = (
        s.q.as_ptr() as *const __m512i,
        s.dw.as_ptr() as *const __m512,
    );
    let (ap, dap) = (s.blocks.as_ptr(), s.d.as_ptr());
    for b in 0..nb {
        // SAFETY: b < nb decoded blocks; rows c0 + c < the panel's prepared rows.
        unsafe {
            let mut q = [_mm512_setzero_si512(); 8];
            for l in 0..8 {
                q[l] = _mm512_load_si512(qp.add(b * 8 + l) as _);
            }
            let dw = _mm512_load_ps(dwp.add(b) as _);
            for c in 0..C {
                let at = (c0 + c) * nb + b;
                let blk = &*ap.add(at);
                let sc = _mm512_mul_ps(dw, _mm512_set1_ps(*dap.add(at)));
                let qa = blk.q.as_ptr() as *const i32;
                for l in 0..8 {
                    let isum = _mm512_dpbusd_epi32(
                        _mm512_set1_epi32(blk.init[l]),
                        q[l],
                        _mm512_set1_epi32(qa.add(l).read()),
                    );
                    acc[c][l] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum), acc[c][l]);
                }
            }
        }
    }
    // hsum's order, lane-wise: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
    std::array::from_fn(|c| {
        let a = &acc[c];
        let t: [__m512; 4] = std::array::from_fn(|i| _mm512_add_ps(a[i], a[i + 4]));
        _mm512_add_ps(_mm512_add_ps(t[0], t[2]), _mm512_add_ps(t[1], t[3]))
    })
}

/// `out[i · out_stride + j] = dot(weight row j, activation row i)` for `j < nw`, `i < na`,
/// in the register tile's order (see the module doc). A short last weight tile repeats its
/// last row (computed, not stored).
///
/// # Safety
/// The features of `avx512_tiles::available()` are present; the operands passed
/// `tiles::check` for `W` with `k = 32 · nb` (`w`: `nw` rows of `wrb` bytes, `a`: `na` Q8_0
/// rows of `arb` bytes); `W::HAS_MIN` is false.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm<W: VnniBlocks>(
    nb: usize,
    w: &[u8],
    wrb: usize,
    nw: usize,
    a: &[u8],
    arb: usize,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    debug_assert!(!W::HAS_MIN);
    let idx = transpose_idx().map(|st| {
        // SAFETY: reading 16 i32 from an array.
        st.map(|v| unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) })
    });
    SCRATCH.with_borrow_mut(|s| {
        for ip in (0..na).step_by(PANEL) {
            let pn = PANEL.min(na - ip);
            // SAFETY: rows ip..ip+pn < na of arb bytes per the caller; features likewise.
            unsafe { prep(s, a, arb, nb, ip, pn, W::OFFSET) };
            for j0 in (0..nw).step_by(ROWS) {
                let rn = ROWS.min(nw - j0);
                // SAFETY: rows j0..j0+rn < nw of wrb bytes (nb blocks) per the caller; a
                // call chunk's 16 rows are far below 2 GiB.
                unsafe { decode::<W>(w.as_ptr().add(j0 * wrb), wrb, rn, nb, &idx, s) };
                let mask: __mmask16 = ((1u32 << rn) - 1) as __mmask16;
                let mut c0 = 0;
                while c0 < pn {
                    let cn = COLS.min(pn - c0);
                    let v: [__m512; COLS] = if cn == COLS {
                        // SAFETY: rows c0..c0+COLS are prepared; decode filled nb blocks.
                        unsafe { tile::<COLS>(s, nb, c0) }
                    } else {
                        // SAFETY: as above for one row.
                        let [x] = unsafe { tile::<1>(s, nb, c0) };
                        [x; COLS]
                    };
                    for c in 0..cn {
                        let at = (ip + c0 + c) * out_stride + j0;
                        assert!(at + rn <= out.len(), "gemm output of {}", out.len());
                        // SAFETY: lanes < rn write out[at..at + rn], checked just above.
                        unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, v[c]) };
                    }
                    c0 += cn;
                }
            }
        }
    });
}
