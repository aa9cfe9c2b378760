//! Q4_K × Q8_K prefill with AVX-512 VNNI, weight rows in lanes, in the order of llama.cpp's
//! repacked GEMM (`ggml_gemm_q4_K_8x8_q8_K`, activation rows in groups of four; `avx2.rs`
//! `Q4K::body_gemm` is the same order one weight row at a time).
//!
//! That order gives each output two f32 chains: per block `dd = d·d_a`, `dm = dmin·d_a`,
//! then per 64-weight chunk `c` (sub-blocks `2c`, `2c+1`) `acc = fma(S_c, dd, acc)` and
//! `acc_min = fma(M_c, dm, acc_min)`, where `S_c = sc_2c·Σ_2c q·a + sc_2c+1·Σ_2c+1 q·a` and
//! `M_c = m_2c·(bsum_4c + bsum_4c+1) + m_2c+1·(bsum_4c+2 + bsum_4c+3)` are exact integers;
//! the output is `acc − acc_min`. Here a zmm holds one of these values for 16 weight rows
//! (one activation row): the sub-block sums are 8 `vpdpbusd` each (16 rows × 4 nibbles of a
//! transposed weight vector against a `{1to16}` broadcast of 4 activation bytes) with no
//! horizontal reduction at all, and `S_c`, `M_c` are formed in f32, where they are exact
//! (|Σ q·a| ≤ 32·15·127 < 2^16, scales and mins ≤ 63, bsum pairs ≤ 4064: every product and
//! sum stays below 2^24), so each lane's f32 steps are the scalar order's, bit for bit.
//!
//! Weight rows are decoded once per tile of 16 rows and activation panel (nibbles split,
//! transposed by `avx512_lanes::transpose8`; scales and mins as f32 per row); the loop runs
//! block-outer, two activation rows at a time, so a decoded block (5 KB) stays in L1 and the
//! two rows' accumulators wait in a small buffer between blocks.
//!
//! Compiled with AVX-512 F/BW/VL/VNNI (plus the AVX2 set); reached only where
//! `avx512_tiles::available()` said yes.

#![allow(clippy::needless_range_loop)]

use crate::cpu::avx512_lanes::{transpose8, transpose_idx, PANEL, ROWS, Z, ZERO};
use crate::cpu::q8_k::tiles::Rows;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Bytes of a Q4_K block, of a Q8_K block.
const WB: usize = 144;
const AB: usize = 292;

/// A decoded block of a 16-row weight tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block {
    /// `q[c][g]` (g < 8: low nibbles = sub-block 2c, g ≥ 8: high = 2c+1): dword `j` = the
    /// four quants `4(g%8)..4(g%8)+4` of that sub-block of row `j`.
    q: [[Z; 16]; 4],
    /// Per sub-block, the 16 rows' scale and min as f32.
    sc: [Z; 8],
    mn: [Z; 8],
    /// The 16 rows' `d` and `dmin` as f32.
    d: Z,
    dmin: Z,
}

/// Per-thread buffers, kept between calls.
#[derive(Default)]
struct Scratch {
    /// `[nb]` decoded blocks of the current tile.
    blocks: Vec<Block>,
    /// `[panel rows × 2]`: `acc`, `acc_min` of the 16 rows per activation row.
    acc: Vec<Z>,
    /// `[panel rows × nb × 8]`: per sub-block the activation's bsum pair as f32.
    bsp: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Decodes block `b` of rows `min(j, rn − 1)` (`j < 16`, `wrb` bytes apart from `w`).
///
/// # Safety
/// Features as the module; those rows hold `b + 1` blocks at `w`; `16 · wrb` fits an i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode(
    w: *const u8,
    wrb: usize,
    rn: usize,
    b: usize,
    idx: &[[__m512i; 2]; 3],
    out: &mut Block,
) {
    let row = |j: usize| j.min(rn - 1) * wrb + b * WB;
    let m4 = _mm512_set1_epi8(0x0f);
    for c in 0..4 {
        // SAFETY: 32 quant bytes of chunk c of each named row's block b.
        let v: [__m512i; 8] = std::array::from_fn(|p| unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(
                    w.add(row(2 * p) + 16 + 32 * c) as *const __m256i
                )),
                _mm256_loadu_si256(w.add(row(2 * p + 1) + 16 + 32 * c) as *const __m256i),
            )
        });
        // SAFETY: features per the caller.
        let t = unsafe { transpose8(v, idx) };
        for g in 0..8 {
            // SAFETY: Z is 64 bytes, 64-byte aligned.
            unsafe {
                _mm512_store_si512(out.q[c][g].0.as_mut_ptr() as _, _mm512_and_si512(t[g], m4));
                _mm512_store_si512(
                    out.q[c][8 + g].0.as_mut_ptr() as _,
                    _mm512_and_si512(_mm512_srli_epi16::<4>(t[g]), m4),
                );
            }
        }
    }
    let mut sc = [[0f32; 16]; 8];
    let mut mn = [[0f32; 16]; 8];
    let mut dd = [0f32; 16];
    let mut dm = [0f32; 16];
    for j in 0..ROWS {
        // SAFETY: bytes 0..16 of the block (d, dmin, scales).
        let (s, h) = unsafe {
            let wb = w.add(row(j));
            let mut s = [0u8; 16];
            _mm_storeu_si128(s.as_mut_ptr() as _, super::avx2::scales_mins(wb.add(4)));
            (s, [*wb, *wb.add(1), *wb.add(2), *wb.add(3)])
        };
        for k in 0..8 {
            sc[k][j] = s[k] as f32;
            mn[k][j] = s[8 + k] as f32;
        }
        dd[j] = neagari_quant::float::f16_to_f32([h[0], h[1]]);
        dm[j] = neagari_quant::float::f16_to_f32([h[2], h[3]]);
    }
    let z = |x: [f32; 16]| Z(bytemuck::cast(x));
    for k in 0..8 {
        out.sc[k] = z(sc[k]);
        out.mn[k] = z(mn[k]);
    }
    out.d = z(dd);
    out.dmin = z(dm);
}

/// One block `blk` against activation rows `a0`, `a0 + arb`, … (`C` of them, their block
/// at the pointers' offsets) updating their accumulators `acc[2c]`, `acc[2c + 1]` and
/// reading their bsum pairs at `bsp[c · bstride ..][8]`.
///
/// # Safety
/// Features as the module; `C` activation blocks of 292 bytes readable at `a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const C: usize>(blk: &Block, a: [*const u8; C], bsp: [*const f32; C], acc: *mut Z) {
    let ld = |z: &Z| _mm512_load_ps(z.0.as_ptr() as *const f32);
    // SAFETY (whole body): pointers per the caller; Z is 64-byte aligned.
    unsafe {
        let (d, dmin) = (ld(&blk.d), ld(&blk.dmin));
        let mut st = [[_mm512_setzero_ps(); 2]; C];
        let mut dd = [_mm512_setzero_ps(); C];
        let mut dm = [_mm512_setzero_ps(); C];
        for c in 0..C {
            let da = _mm512_set1_ps((a[c] as *const f32).read_unaligned());
            dd[c] = _mm512_mul_ps(d, da);
            dm[c] = _mm512_mul_ps(dmin, da);
            st[c][0] = _mm512_load_ps(acc.add(2 * c) as *const f32);
            st[c][1] = _mm512_load_ps(acc.add(2 * c + 1) as *const f32);
        }
        for ch in 0..4 {
            let q: [__m512i; 16] =
                std::array::from_fn(|g| _mm512_load_si512(blk.q[ch][g].0.as_ptr() as _));
            for c in 0..C {
                let qa = a[c].add(4 + 64 * ch) as *const i32;
                let mut lo = _mm512_setzero_si512();
                let mut hi = _mm512_setzero_si512();
                for g in 0..8 {
                    lo = _mm512_dpbusd_epi32(
                        lo,
                        q[g],
                        _mm512_set1_epi32(qa.add(g).read_unaligned()),
                    );
                    hi = _mm512_dpbusd_epi32(
                        hi,
                        q[8 + g],
                        _mm512_set1_epi32(qa.add(8 + g).read_unaligned()),
                    );
                }
                // S_c and M_c, exact in f32 (see the module doc).
                let s = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(hi),
                    ld(&blk.sc[2 * ch + 1]),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(lo), ld(&blk.sc[2 * ch])),
                );
                let bp = bsp[c].add(2 * ch);
                let m = _mm512_fmadd_ps(
                    ld(&blk.mn[2 * ch + 1]),
                    _mm512_set1_ps(*bp.add(1)),
                    _mm512_mul_ps(ld(&blk.mn[2 * ch]), _mm512_set1_ps(*bp)),
                );
                st[c][0] = _mm512_fmadd_ps(s, dd[c], st[c][0]);
                st[c][1] = _mm512_fmadd_ps(m, dm[c], st[c][1]);
            }
        }
        for c in 0..C {
            _mm512_store_ps(acc.add(2 * c) as *mut f32, st[c][0]);
            _mm512_store_ps(acc.add(2 * c + 1) as *mut f32, st[c][1]);
        }
    }
}

/// `out[i · stride + j] = dot(weight row j, activation row i)` for `j < nw`, `i < na`, in
/// the GEMM order of the module doc (every row of `na`: callers pass the rows llama.cpp
/// runs through its GEMM, a multiple of four).
///
/// # Safety
/// `avx512_tiles::available()`; `r` came from `q8_k::tiles::check` for Q4_K on these
/// buffers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    stride: usize,
) {
    let (nb, wrb, arb) = (r.nb, r.wrb, r.arb);
    if nb == 0 {
        for i in 0..na {
            out[i * stride..i * stride + nw].fill(0.0);
        }
        return;
    }
    let idx = transpose_idx().map(|st| {
        // SAFETY: reading 16 i32 from an array.
        st.map(|v| unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) })
    });
    SCRATCH.with_borrow_mut(|s| {
        s.blocks.resize(
            nb,
            Block {
                q: [[ZERO; 16]; 4],
                sc: [ZERO; 8],
                mn: [ZERO; 8],
                d: ZERO,
                dmin: ZERO,
            },
        );
        for ip in (0..na).step_by(PANEL) {
            let pn = PANEL.min(na - ip);
            // Bsum pairs of the panel's rows as f32: [row][block][sub-block].
            s.bsp.clear();
            for i in ip..ip + pn {
                for b in 0..nb {
                    let bs = &a[i * arb + b * AB + 260..i * arb + b * AB + 292];
                    let v = |k: usize| i16::from_le_bytes([bs[2 * k], bs[2 * k + 1]]) as i32;
                    s.bsp
                        .extend((0..8).map(|j| (v(2 * j) + v(2 * j + 1)) as f32));
                }
            }
            s.acc.resize(2 * pn, ZERO);
            for j0 in (0..nw).step_by(ROWS) {
                let rn = ROWS.min(nw - j0);
                s.acc.fill(ZERO);
                for b in 0..nb {
                    // SAFETY: rows j0..j0 + rn < nw of wrb bytes (nb blocks) per `check`.
                    unsafe { decode(w.as_ptr().add(j0 * wrb), wrb, rn, b, &idx, &mut s.blocks[b]) };
                    let blk = &s.blocks[b];
                    let accp = s.acc.as_mut_ptr();
                    let at = |i: usize| a[(ip + i) * arb + b * AB..].as_ptr();
                    let bp = |i: usize| s.bsp[(i * nb + b) * 8..].as_ptr();
                    let mut i = 0;
                    while i < pn {
                        // SAFETY: activation rows ip + i (+ 1) < na hold block b; their
                        // accumulators are acc[2i..2i + 4].
                        unsafe {
                            if i + 1 < pn {
                                block::<2>(
                                    blk,
                                    [at(i), at(i + 1)],
                                    [bp(i), bp(i + 1)],
                                    accp.add(2 * i),
                                );
                                i += 2;
                            } else {
                                block::<1>(blk, [at(i)], [bp(i)], accp.add(2 * i));
                                i += 1;
                            }
                        }
                    }
                }
                let mask: __mmask16 = ((1u32 << rn) - 1) as __mmask16;
                for i in 0..pn {
                    let o = (ip + i) * stride + j0;
                    assert!(o + rn <= out.len(), "gemm output of {}", out.len());
                    // SAFETY: acc[2i..2i + 2] are 64-byte aligned; lanes < rn write
                    // out[o..o + rn], checked just above.
                    unsafe {
                        let p = s.acc.as_ptr().add(2 * i) as *const f32;
                        let v = _mm512_sub_ps(_mm512_load_ps(p), _mm512_load_ps(p.add(16)));
                        _mm512_mask_storeu_ps(out.as_mut_ptr().add(o), mask, v);
                    }
                }
            }
        }
    });
}
