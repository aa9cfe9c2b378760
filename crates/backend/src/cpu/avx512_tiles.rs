//! GEMV and GEMM of the legacy 32-weight block formats with AVX-512 VNNI: the run-time
//! feature check, the register tile shared by every format, and the `GemmFn` driver. A
//! format only says how a block of each of two rows unpacks to 64 unsigned bytes (its
//! `avx512.rs`) and up to how many activation rows it takes these tiles (`MAX_NA`: every
//! count for Q8_0 and Q5_0, whose order must be llama.cpp's; one row for Q4_1 / Q5_1,
//! whose prefill stays on the faster AVX2 panels).
//!
//! Per pair of weight rows and block: one zmm of 64 unsigned quants `q` (row `r`'s block `b`
//! in bytes 0..32, row `r + 1`'s block `b` in 32..64) meets the activation's block `b` (32
//! signed quants, in both halves) in one `vpdpbusd` (u8 × i8, four products summed per i32
//! lane). Every format is written as `x = (q − o) · d [+ m]` with `q` unsigned: Q8_0 flips
//! its sign bits (`o` = 128), Q5_0 is stored that way (`o` = 16), so
//! `Σ(q − o)·a = Σq·a − o·Σa`, and `−o·Σa` per i32 lane depends only on the activation: it
//! is computed once per call and is the accumulator `vpdpbusd` starts from. The lane sums
//! stay exact (|Σ| ≤ 4·255·128 + 4·128·128).
//!
//! Summation order is llama.cpp's (`ggml_vec_dot_q8_0_q8_0` / `_q5_0_q8_0` on AVX2, and
//! tinyBLAS for more rows): per output, 8 f32 lanes, lane `l` the four products `4l..4l+4`
//! of each block, accumulated block after block as `fma(d_w·d_a, lane, acc)`, then one
//! horizontal sum ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Keeping two rows (not two blocks)
//! in a zmm keeps that order while filling all 16 lanes, so the results are bit-identical
//! to llama.cpp's for the same quantized activations.
//!
//! Block scales: the f16 `d` (and `m`) of 16 blocks of a row come in with one gather and one
//! `vcvtph2ps`, are multiplied by the 16 activation scales (converted once per call), and a
//! `vpermt2ps` puts block `b`'s scale of the two rows over their 8 lanes each before one
//! FMA per block. The `m · s` terms of Q4_1 / Q5_1 are one FMA per 16 blocks.
//!
//! All functions here are compiled with AVX-512 F/BW/VL/VNNI (plus the AVX2 set) enabled and
//! must only be reached after `available()` said yes.

// Register tiles are indexed [r][c] by constant-bound loops: clearer than iterator chains
// here, and unrolled the same.
#![allow(clippy::needless_range_loop)]

use super::tiles::{check, for_each_tile, Tile, ACT_PANEL};
use std::arch::x86_64::*;

/// AVX-512 F/BW/VL/VNNI with the AVX2 set (std caches the CPUID answer).
#[inline]
pub(crate) fn available() -> bool {
    super::avx2_tiles::available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// A legacy block format as the VNNI tile sees it: `x = (q − OFFSET) · d [+ m]` with
/// unsigned byte quants `q`, `d` (f16) at byte 0 of a block and `m` (f16) at byte 2.
pub(crate) trait VnniBlocks {
    /// Bytes per 32-weight block.
    const BYTES: usize;
    /// `o` in `(q − o) · d`.
    const OFFSET: i32;
    /// `x = q · d + m` against Q8_1 activations (else Q8_0 activations).
    const HAS_MIN: bool;
    /// Activation rows up to which `gemm` uses these tiles; from there on the AVX2 driver
    /// (row-major tiles or panels) takes over.
    const MAX_NA: usize;
    /// The AVX2 `GemmFn` of the format, for the activation counts above `MAX_NA`.
    const AVX2_GEMM: super::kernels::GemmFn;
    /// 64 unsigned quants: the block at `p0` in bytes 0..32, the block at `p1` in bytes
    /// 32..64, each in weight order.
    ///
    /// # Safety
    /// The features of `available()` are present and `BYTES` bytes at `p0` and at `p1` are
    /// readable.
    unsafe fn pair(p0: *const u8, p1: *const u8) -> __m512i;
}

/// Two blocks' 16 bytes of packed nibbles at `p0` and `p1` → 64 bytes 0..=15: per block,
/// 16 low nibbles then 16 high nibbles (the weight order of Q4_0/Q4_1/Q5_0/Q5_1).
///
/// # Safety
/// The features of `available()` are present; `p0..p0+16` and `p1..p1+16` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn nibbles_pair(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes at each pointer per the caller; no alignment needed.
    let v = unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(p0 as _))),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(p1 as _)),
        )
    };
    // Shift the upper copy of each block down by 4: one variable shift for both blocks.
    let v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
}

/// Adds 16 to byte `j` of `q` where bit `j` of the little-endian u32 at `h0` (bytes 0..32)
/// or at `h1` (bytes 32..64) is set: the fifth bits of Q5_0/Q5_1.
///
/// # Safety
/// The features of `available()` are present; `h0..h0+4` and `h1..h1+4` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn fifth_bits(q: __m512i, h0: *const u8, h1: *const u8) -> __m512i {
    // SAFETY: four readable bytes at each pointer per the caller.
    let (lo, hi) = unsafe {
        (
            (h0 as *const u32).read_unaligned(),
            (h1 as *const u32).read_unaligned(),
        )
    };
    let k: __mmask64 = lo as u64 | (hi as u64) << 32;
    _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16))
}

/// 64 bytes, aligned for `vmovdqa64`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Z([u8; 64]);

const ZERO: Z = Z([0; 64]);

/// Blocks whose scales are gathered at once (the 16 lanes of a zmm).
const GROUP: usize = 16;

/// Activation-side operands of one call, reshaped for the tile.
struct Acts {
    /// Blocks per row, scale groups per row (`⌈nb/16⌉`).
    nb: usize,
    ng: usize,
    /// `q[na × nb]`: block `b`'s 32 signed quants (the tile broadcasts them to both halves).
    q: Vec<Y>,
    /// `init[na × nb]`: per i32 lane `l`, `−OFFSET · Σ q[4l..4l+4]` (as i32).
    init: Vec<Y>,
    /// `d[na × ng]`: the activation block scales as f32, zero past `nb`.
    d: Vec<Z>,
    /// `s[na × ng]`: the Q8_1 `s` of each block as f32 (`HAS_MIN` formats only).
    s: Vec<Z>,
}

/// 32 bytes, aligned for `vmovdqa`.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Y([u8; 32]);

fn acts<W: VnniBlocks>(a: &[u8], na: usize, nb: usize, arb: usize) -> Acts {
    use neagari_quant::float::f16_to_f32;
    let bb = arb / nb.max(1);
    let qoff = if W::HAS_MIN { 4 } else { 2 };
    let ng = nb.div_ceil(GROUP);
    let mut x = Acts {
        nb,
        ng,
        q: vec![Y([0; 32]); na * nb],
        init: vec![Y([0; 32]); na * nb],
        d: vec![ZERO; na * ng],
        s: vec![ZERO; if W::HAS_MIN { na * ng } else { 0 }],
    };
    for i in 0..na {
        let row = &a[i * arb..i * arb + nb * bb];
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let p = i * nb + b;
            let qs: &[u8; 32] = blk[qoff..qoff + 32].try_into().expect("32 quants");
            x.q[p].0 = *qs;
            if W::OFFSET != 0 {
                let init: [i32; 8] = std::array::from_fn(|l| {
                    let q4 = &qs[4 * l..4 * l + 4];
                    -W::OFFSET * q4.iter().map(|&v| v as i8 as i32).sum::<i32>()
                });
                x.init[p].0 = bytemuck::cast(init);
            }
            let (g, at) = (i * ng + b / GROUP, 4 * (b % GROUP));
            x.d[g].0[at..at + 4].copy_from_slice(&f16_to_f32([blk[0], blk[1]]).to_le_bytes());
            if W::HAS_MIN {
                let s = f16_to_f32([blk[2], blk[3]]);
                x.s[g].0[at..at + 4].copy_from_slice(&s.to_le_bytes());
            }
        }
    }
    x
}

/// Row pairs of an `R`-row tile (the last pair repeats its row when `R` is odd).
const fn pairs(r: usize) -> usize {
    r.div_ceil(2)
}

/// `[r][c] = dot(weight row j0 + r, activation row i0 + c)`.
///
/// # Safety
/// The features of `available()` are present; `w` points at `R` consecutive rows of `wrb`
/// bytes holding `x.nb` blocks each; `i0 + C` activation rows exist in `x`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<W: VnniBlocks, const R: usize, const C: usize>(
    x: &Acts,
    w: *const u8,
    wrb: usize,
    i0: usize,
) -> [[f32; C]; R] {
    let (nb, ng) = (x.nb, x.ng);
    // Prefetch the tile PF_TILES ahead into L2, one line at a time. The hardware
    // prefetchers lose track of R interleaved row streams (measured: the AVX2 4-row tile
    // reads 5.6 GB/s from DRAM against 30 GB/s from L2); into L2 rather than L1 so the few
    // L1 miss buffers stay free for the tile's own loads (T0 measured 2.5 GB/s slower).
    // Only for the first activation tile of a panel: the others reuse the same weight rows
    // (in prefill, prefetching for each of them took a third of the tile's time).
    if i0.is_multiple_of(ACT_PANEL) {
        let ahead = w.wrapping_add(PF_TILES * R * wrb);
        let mut off = 0;
        while off < R * wrb {
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(off) as *const i8);
            off += 64;
        }
    }
    let bytes = W::BYTES as i32;
    // Byte offsets of the 16 blocks of a group, for the scale gather.
    let offs = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(bytes),
    );
    // Row pair `p` is rows `2p` (lanes 0..8) and `min(2p + 1, R − 1)` (lanes 8..16).
    let row_b = |p: usize| (2 * p + 1).min(R - 1);
    let mut acc = [[_mm512_setzero_ps(); C]; 2];
    let mut accm = [[_mm512_setzero_ps(); C]; R];
    for g in 0..ng {
        let b0 = g * GROUP;
        let nbg = GROUP.min(nb - b0);
        let mask: __mmask16 = ((1u32 << nbg) - 1) as __mmask16;
        // s[r][c]: d_w · d_a of the group's 16 blocks.
        let mut s = [[_mm512_setzero_ps(); C]; R];
        for r in 0..R {
            // SAFETY: lanes < nbg read 4 bytes at the start of block b0 + lane < nb of row
            // r (every block has ≥ 4 bytes: d plus quants or m); masked lanes read nothing.
            let raw = unsafe {
                _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    mask,
                    offs,
                    w.add(r * wrb + b0 * W::BYTES) as *const i32,
                )
            };
            let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
            let mw = if W::HAS_MIN {
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(raw)))
            } else {
                dw
            };
            for c in 0..C {
                // SAFETY: row i0 + c < na and group g < ng index inside x.d / x.s.
                let da = unsafe { _mm512_load_ps(x.d.as_ptr().add((i0 + c) * ng + g) as _) };
                s[r][c] = _mm512_mul_ps(dw, da);
                if W::HAS_MIN {
                    let sa = unsafe { _mm512_load_ps(x.s.as_ptr().add((i0 + c) * ng + g) as _) };
                    accm[r][c] = _mm512_fmadd_ps(mw, sa, accm[r][c]);
                }
            }
        }
        for bi in 0..nbg {
            let b = b0 + bi;
            // Lanes 0..8 take block b's scale of the pair's first row (table a), lanes 8..16
            // that of its second row (table b, indices 16..32).
            let idx = _mm512_add_epi32(
                _mm512_set1_epi32(bi as i32),
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16),
            );
            let mut q = [_mm512_setzero_si512(); 2];
            for p in 0..pairs(R) {
                // SAFETY: block b < nb of rows 2p and row_b(p) < R is inside the rows.
                q[p] = unsafe {
                    W::pair(
                        w.add(2 * p * wrb + b * W::BYTES),
                        w.add(row_b(p) * wrb + b * W::BYTES),
                    )
                };
            }
            for c in 0..C {
                // SAFETY: block b < nb of activation row i0 + c < na.
                let (av, init) = unsafe {
                    let at = (i0 + c) * nb + b;
                    (
                        _mm512_broadcast_i64x4(_mm256_load_si256(x.q.as_ptr().add(at) as _)),
                        if W::OFFSET != 0 {
                            _mm512_broadcast_i64x4(_mm256_load_si256(x.init.as_ptr().add(at) as _))
                        } else {
                            _mm512_setzero_si512()
                        },
                    )
                };
                for p in 0..pairs(R) {
                    let isum = _mm512_dpbusd_epi32(init, q[p], av);
                    let sc = _mm512_permutex2var_ps(s[2 * p][c], idx, s[row_b(p)][c]);
                    acc[p][c] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(isum), acc[p][c]);
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for p in 0..pairs(R) {
        for c in 0..C {
            let v = acc[p][c];
            let halves = [
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            ];
            for (h, &r) in [2 * p, row_b(p)].iter().enumerate() {
                if h == 1 && r == 2 * p {
                    continue;
                }
                let mut o = super::avx2_tiles::hsum(halves[h]);
                if W::HAS_MIN {
                    o += _mm512_reduce_add_ps(accm[r][c]);
                }
                out[r][c] = o;
            }
        }
    }
    out
}

/// Tiles of weight rows prefetched ahead: 2 to 16 measured within noise of each other at
/// k = 640; 8 (≈ 22 KB of Q8_0) leaves room for slower DRAM.
const PF_TILES: usize = 8;

/// Weight rows per tile: 4 keeps 4 row streams and ≤ 16 accumulators in flight.
const R_TILE: usize = 4;
/// Activation rows per tile (the most `MAX_NA` asks for).
const C_TILE: usize = 4;

/// Runs every tile of the output.
///
/// # Safety
/// The features of `available()` are present and the operands passed `tiles::check` with
/// these sizes; `na ≤ 64` is not required (tiles walk activation panels).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<W: VnniBlocks>(
    x: &Acts,
    w: *const u8,
    wrb: usize,
    nw: usize,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    macro_rules! go {
        ($t:expr, $($r:literal, $c:literal);*) => {
            match ($t.rn, $t.cn) {
                $(($r, $c) => store(
                    out,
                    out_stride,
                    $t,
                    // SAFETY: for_each_tile keeps j0 + rn <= nw and i0 + cn <= na.
                    unsafe { tile::<W, $r, $c>(x, w.add($t.j0 * wrb), wrb, $t.i0) },
                ),)*
                _ => unreachable!("tile shapes are bounded by R_TILE × C_TILE"),
            }
        };
    }
    for_each_tile(nw, na, R_TILE, (R_TILE, C_TILE), |t: Tile| {
        go!(t, 4, 1; 3, 1; 2, 1; 1, 1; 4, 2; 3, 2; 2, 2; 1, 2;
               4, 3; 3, 3; 2, 3; 1, 3; 4, 4; 3, 4; 2, 4; 1, 4)
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

/// `GemmFn` of a `VnniBlocks` format: the VNNI tiles up to `W::MAX_NA` activation rows,
/// the format's AVX2 driver above.
///
/// # Panics
/// On a broken `GemmFn` shape contract (see `tiles::check`), or if the CPU lacks the
/// features of `available()`.
pub(crate) fn gemm<W: VnniBlocks>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    if na > W::MAX_NA {
        return (W::AVX2_GEMM)(k, w, nw, a, na, out, out_stride);
    }
    let nb = k / 32;
    let abytes = if W::HAS_MIN { 36 } else { 34 };
    let s = check(
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
        "AVX-512 VNNI kernel called on a CPU without AVX-512 F/BW/VL/VNNI"
    );
    if nb == 0 || nw == 0 || na == 0 {
        for i in 0..na {
            out[i * out_stride..i * out_stride + nw].fill(0.0);
        }
        return;
    }
    if !W::HAS_MIN && na >= PRE_MIN_NA {
        // SAFETY: features checked just above; operands checked by tiles::check.
        return unsafe {
            super::avx512_lanes::gemm::<W>(nb, w, s.wrb, nw, a, s.arb, na, out, out_stride)
        };
    }
    let x = acts::<W>(a, na, nb, s.arb);
    // SAFETY: features checked just above; operands checked by tiles::check.
    unsafe { run::<W>(&x, w.as_ptr(), s.wrb, nw, na, out, out_stride) }
}

/// Activation rows from which `gemm` runs the rows-in-lanes prefill kernel
/// (`avx512_lanes.rs`) instead of the register tiles.
const PRE_MIN_NA: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// `n` rows of `nb` random blocks of `bytes` bytes, each starting with a finite f16
    /// scale (the rest random: quants, `qh`).
    fn rows(rng: &mut StdRng, n: usize, nb: usize, bytes: usize) -> Vec<u8> {
        let mut v = vec![0u8; n * nb * bytes];
        for blk in v.chunks_exact_mut(bytes) {
            rng.fill(&mut blk[2..]);
            let d = half::f16::from_f32(rng.gen_range(-0.05f32..0.05));
            blk[..2].copy_from_slice(&d.to_le_bytes());
        }
        v
    }

    /// llama.cpp's order written out plainly (the truth both kernels must reproduce): per
    /// output, 8 f32 partial sums, lane `l` = `fma(f32(d_w)·f32(d_a), Σ_{i<4} w[4l+i]·a[4l+i],
    /// acc_l)` block after block, with `w` the dequantized integer weights of the
    /// quant crate's reference, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
    fn reference<W: VnniBlocks>(w: &[u8], a: &[u8], nb: usize, nw: usize, na: usize) -> Vec<f32> {
        use neagari_quant::float::f16_to_f32;
        // Integer weights of each block (x = q·d for Q8_0 / Q5_0), from the reference
        // dequantizer with d replaced by 1.
        let ty = if W::BYTES == 34 {
            neagari_quant::GgmlType::Q8_0
        } else {
            neagari_quant::GgmlType::Q5_0
        };
        let ints = |blk: &[u8]| -> Vec<i32> {
            let mut one = blk.to_vec();
            one[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
            let mut x = vec![0f32; 32];
            neagari_quant::dequantize_row(ty, &one, &mut x).expect("one block");
            x.iter().map(|&v| v as i32).collect()
        };
        let mut out = vec![0f32; na * nw];
        for i in 0..na {
            for j in 0..nw {
                let mut acc = [0f32; 8];
                for b in 0..nb {
                    let wb = &w[(j * nb + b) * W::BYTES..(j * nb + b + 1) * W::BYTES];
                    let ab = &a[(i * nb + b) * 34..(i * nb + b + 1) * 34];
                    let wi = ints(wb);
                    let s = f16_to_f32([wb[0], wb[1]]) * f16_to_f32([ab[0], ab[1]]);
                    for (l, al) in acc.iter_mut().enumerate() {
                        let dot: i32 = (4 * l..4 * l + 4)
                            .map(|e| wi[e] * ab[2 + e] as i8 as i32)
                            .sum();
                        *al = s.mul_add(dot as f32, *al);
                    }
                }
                out[i * nw + j] = ((acc[0] + acc[4]) + (acc[2] + acc[6]))
                    + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            }
        }
        out
    }

    /// The register tile (which `gemm` takes below `PRE_MIN_NA` rows) and the
    /// rows-in-lanes prefill kernel against `reference`: every output bit-identical.
    fn same_bits<W: VnniBlocks>() {
        if !available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(7);
        for (nb, nw, na) in [
            (20, 8, 12),
            (17, 7, 70),
            (64, 5, 9),
            (1, 3, 8),
            (33, 12, 131),
            (20, 37, 300),
        ] {
            let w = rows(&mut rng, nw, nb, W::BYTES);
            let a = rows(&mut rng, na, nb, 34);
            let x = acts::<W>(&a, na, nb, nb * 34);
            let (mut o1, mut o2) = (vec![0f32; na * nw], vec![1f32; na * nw]);
            let o3 = reference::<W>(&w, &a, nb, nw, na);
            // SAFETY: features checked above; shapes built to match.
            unsafe {
                run::<W>(&x, w.as_ptr(), nb * W::BYTES, nw, na, &mut o1, nw);
                super::super::avx512_lanes::gemm::<W>(
                    nb,
                    &w,
                    nb * W::BYTES,
                    nw,
                    &a,
                    nb * 34,
                    na,
                    &mut o2,
                    nw,
                );
            }
            for (i, ((p, q), r)) in o1.iter().zip(&o2).zip(&o3).enumerate() {
                assert_eq!(
                    p.to_bits(),
                    r.to_bits(),
                    "tile: nb {nb} nw {nw} na {na} at {i}"
                );
                assert_eq!(
                    q.to_bits(),
                    r.to_bits(),
                    "lanes: nb {nb} nw {nw} na {na} at {i}"
                );
            }
        }
    }

    #[test]
    fn q8_0_prefill_path_is_bit_identical() {
        same_bits::<super::super::q8_0::avx512::Q8_0>();
    }

    #[test]
    fn q5_0_prefill_path_is_bit_identical() {
        same_bits::<super::super::q5_0::avx512::Q5_0>();
    }

    /// Tuning only: on-CPU-ish time of the register-tile path against the panel-decoding
    /// path at Gemma 3 270M's prefill shapes (`cargo test --release -p neagari-backend
    /// --lib prefill_speed -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn prefill_speed() {
        fn one<W: VnniBlocks>(name: &str) {
            let mut rng = StdRng::seed_from_u64(9);
            let (nb, nw, na) = (20, 1024, 128);
            let w = rows(&mut rng, nw, nb, W::BYTES);
            let a = rows(&mut rng, na, nb, 34);
            let x = acts::<W>(&a, na, nb, nb * 34);
            let mut o = vec![0f32; na * nw];
            let mut best = [f64::MAX; 2];
            for _ in 0..15 {
                for (m, b) in best.iter_mut().enumerate() {
                    let t = std::time::Instant::now();
                    // SAFETY: features checked by the caller; shapes built to match.
                    unsafe {
                        if m == 0 {
                            run::<W>(&x, w.as_ptr(), nb * W::BYTES, nw, na, &mut o, nw);
                        } else {
                            super::super::avx512_lanes::gemm::<W>(
                                nb,
                                &w,
                                nb * W::BYTES,
                                nw,
                                &a,
                                nb * 34,
                                na,
                                &mut o,
                                nw,
                            );
                        }
                    }
                    *b = b.min(t.elapsed().as_secs_f64());
                }
            }
            eprintln!(
                "{name}: tile {:.3} ms, rows in lanes {:.3} ms (prepared activations included)",
                best[0] * 1e3,
                best[1] * 1e3,
            );
        }
        if !available() {
            return;
        }
        // As a prefill matmul calls it: 16 chunks of 64 weight rows, 512 activation rows.
        for (chunk, na) in [(64, 512), (1024, 512), (64, 128), (1024, 128), (256, 512)] {
            let mut rng = StdRng::seed_from_u64(10);
            let (nb, nw) = (20, 1024);
            type W = super::super::q5_0::avx512::Q5_0;
            let w = rows(&mut rng, nw, nb, W::BYTES);
            let a = rows(&mut rng, na, nb, 34);
            let mut o = vec![0f32; na * nw];
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for c in 0..nw / chunk {
                    let j0 = c * chunk;
                    gemm::<W>(
                        640,
                        &w[j0 * nb * W::BYTES..(j0 + chunk) * nb * W::BYTES],
                        chunk,
                        &a,
                        na,
                        &mut o[j0..],
                        nw,
                    );
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let gmac = (nw * na * 640) as f64 / 1e9;
            eprintln!(
                "q5_0 chunks of {chunk} rows x {na}: {:.2} ms, {:.1} G mul-add/s",
                best * 1e3,
                gmac / best
            );
        }
        one::<super::super::q8_0::avx512::Q8_0>("q8_0");
        one::<super::super::q5_0::avx512::Q5_0>("q5_0");
    }
}
