//! Q6_K × Q8_K prefill with AVX-512 VNNI, weight rows in lanes, in the order of llama.cpp's
//! tiled K-quant matmul (from 8 activation rows; `avx2.rs` `TILED` is the same order one
//! output at a time): per block the exact integer
//! `S = Σ_g s_g · Σ_{16} (q − 32)·a` (16 groups of 16 weights, `s_g` the i8 scale), then
//! `r = f32(S) · d` and `acc = fma(r, d_a, acc)`, block after block.
//!
//! A zmm holds `S` (then `acc`) for 16 weight rows of one activation row: each group's sum
//! is 4 `vpdpbusd` (16 rows × 4 unsigned quants of a transposed weight vector against a
//! `{1to16}` broadcast of 4 activation bytes) starting from `−32 · bsum_g`, then one
//! `vpmulld` by the rows' scales and a `vpaddd` (|S| < 2^28: i32 is exact). No horizontal
//! sums; the f32 steps are each lane's scalar ones, so outputs are bit-identical.
//!
//! Weights are decoded once per tile of 16 rows, block and activation panel (6-bit quants
//! assembled per row pair, dwords transposed by `avx512_lanes::transpose8`); the loop runs
//! block-outer, two activation rows at a time, accumulators parked in a buffer.
//!
//! Compiled with AVX-512 F/BW/VL/VNNI (plus the AVX2 set); reached only where
//! `avx512_tiles::available()` said yes.

#![allow(clippy::needless_range_loop)]

use crate::cpu::avx512_lanes::{transpose8, transpose_idx, PANEL, ROWS, Z, ZERO};
use crate::cpu::q8_k::tiles::Rows;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Bytes of a Q6_K block, of a Q8_K block.
const WB: usize = 210;
const AB: usize = 292;

/// A decoded block of a 16-row weight tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block {
    /// `q[4g + u]`: dword `j` = unsigned quants `16g + 4u .. +4` (0..=63) of row `j`.
    q: [Z; 64],
    /// Per group, the 16 rows' scales as i32.
    s: [Z; 16],
    /// The 16 rows' `d` as f32.
    d: Z,
}

/// Per-thread buffers, kept between calls.
#[derive(Default)]
struct Scratch {
    block: Vec<Block>,
    /// `[panel rows]`: `acc` of the 16 rows per activation row.
    acc: Vec<Z>,
    /// `[panel rows × nb × 16]`: `−32 · bsum_g` of each activation block.
    init: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Decodes block `b` of rows `min(j, rn − 1)` (`j < 16`, `wrb` bytes apart from `w`).
///
/// # Safety
/// Features as the module; those rows hold `b + 1` blocks at `w`.
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
    // 32 bytes at offset `o` of rows 2p (low half) and 2p + 1 (high half).
    let pair = |p: usize, o: usize| {
        // SAFETY: o + 32 ≤ 192 bytes of each named row's block b.
        unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(w.add(row(2 * p) + o) as *const __m256i)),
                _mm256_loadu_si256(w.add(row(2 * p + 1) + o) as *const __m256i),
            )
        }
    };
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    for h in 0..2 {
        // q[k][p]: chunk (h, k) of rows 2p, 2p + 1 (as in `avx2.rs`, two rows per zmm).
        let mut q = [[_mm512_setzero_si512(); 8]; 4];
        for p in 0..8 {
            let (ql0, ql1, qh) = (pair(p, 64 * h), pair(p, 64 * h + 32), pair(p, 128 + 32 * h));
            q[0][p] = _mm512_or_si512(
                _mm512_and_si512(ql0, m4),
                _mm512_and_si512(_mm512_slli_epi16::<4>(qh), m30),
            );
            q[1][p] = _mm512_or_si512(
                _mm512_and_si512(ql1, m4),
                _mm512_and_si512(_mm512_slli_epi16::<2>(qh), m30),
            );
            q[2][p] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql0), m4),
                _mm512_and_si512(qh, m30),
            );
            q[3][p] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql1), m4),
                _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m30),
            );
        }
        for k in 0..4 {
            // SAFETY: features per the caller.
            let t = unsafe { transpose8(q[k], idx) };
            // Chunk (h, k) is weights 128h + 32k .. +32: dwords 32h + 8k + l.
            for l in 0..8 {
                // SAFETY: Z is 64 bytes, 64-byte aligned.
                unsafe { _mm512_store_si512(out.q[32 * h + 8 * k + l].0.as_mut_ptr() as _, t[l]) };
            }
        }
    }
    let mut s = [[0i32; 16]; 16];
    let mut d = [0f32; 16];
    for j in 0..ROWS {
        // SAFETY: bytes 192..210 of the block (scales, d).
        unsafe {
            let wb = w.add(row(j));
            for g in 0..16 {
                s[g][j] = *wb.add(192 + g) as i8 as i32;
            }
            d[j] = neagari_quant::float::f16_to_f32([*wb.add(208), *wb.add(209)]);
        }
    }
    for g in 0..16 {
        out.s[g] = Z(bytemuck::cast(s[g]));
    }
    out.d = Z(bytemuck::cast(d));
}

/// One block `blk` against `C` activation rows' block `b` (at `a`), with their
/// `−32 · bsum` at `init`, updating their accumulators at `acc[c]`.
///
/// # Safety
/// Features as the module; `C` activation blocks of 292 bytes readable at `a`, 16 i32 at
/// each `init`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const C: usize>(
    blk: &Block,
    a: [*const u8; C],
    init: [*const i32; C],
    acc: *mut Z,
) {
    // SAFETY (whole body): pointers per the caller; Z is 64-byte aligned.
    unsafe {
        let mut s = [_mm512_setzero_si512(); C];
        for g in 0..16 {
            let q: [__m512i; 4] =
                std::array::from_fn(|u| _mm512_load_si512(blk.q[4 * g + u].0.as_ptr() as _));
            let sg = _mm512_load_si512(blk.s[g].0.as_ptr() as _);
            for c in 0..C {
                let qa = a[c].add(4 + 16 * g) as *const i32;
                let mut t = _mm512_set1_epi32(*init[c].add(g));
                for u in 0..4 {
                    t = _mm512_dpbusd_epi32(t, q[u], _mm512_set1_epi32(qa.add(u).read_unaligned()));
                }
                s[c] = _mm512_add_epi32(s[c], _mm512_mullo_epi32(t, sg));
            }
        }
        let d = _mm512_load_ps(blk.d.0.as_ptr() as *const f32);
        for c in 0..C {
            let da = _mm512_set1_ps((a[c] as *const f32).read_unaligned());
            let r = _mm512_mul_ps(_mm512_cvtepi32_ps(s[c]), d);
            let p = acc.add(c) as *mut f32;
            _mm512_store_ps(p, _mm512_fmadd_ps(r, da, _mm512_load_ps(p)));
        }
    }
}

/// `out[i · stride + j] = dot(weight row j, activation row i)` for `j < nw`, `i < na`, in
/// the tiled order of the module doc (callers pass `na ≥ 8`, where llama.cpp runs it).
///
/// # Safety
/// `avx512_tiles::available()`; `r` came from `q8_k::tiles::check` for Q6_K on these
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
        s.block.resize(
            1,
            Block {
                q: [ZERO; 64],
                s: [ZERO; 16],
                d: ZERO,
            },
        );
        for ip in (0..na).step_by(PANEL) {
            let pn = PANEL.min(na - ip);
            s.init.clear();
            for i in ip..ip + pn {
                for b in 0..nb {
                    let bs = &a[i * arb + b * AB + 260..i * arb + b * AB + 292];
                    s.init.extend(
                        (0..16)
                            .map(|g| -32 * i16::from_le_bytes([bs[2 * g], bs[2 * g + 1]]) as i32),
                    );
                }
            }
            s.acc.resize(pn, ZERO);
            for j0 in (0..nw).step_by(ROWS) {
                let rn = ROWS.min(nw - j0);
                s.acc.fill(ZERO);
                for b in 0..nb {
                    // SAFETY: rows j0..j0 + rn < nw of wrb bytes (nb blocks) per `check`.
                    unsafe { decode(w.as_ptr().add(j0 * wrb), wrb, rn, b, &idx, &mut s.block[0]) };
                    let blk = &s.block[0];
                    let accp = s.acc.as_mut_ptr();
                    let at = |i: usize| a[(ip + i) * arb + b * AB..].as_ptr();
                    let ini = |i: usize| s.init[(i * nb + b) * 16..].as_ptr();
                    let mut i = 0;
                    while i < pn {
                        // SAFETY: activation rows ip + i (+ 1) < na hold block b; their
                        // accumulators are acc[i..i + 2].
                        unsafe {
                            if i + 1 < pn {
                                block::<2>(
                                    blk,
                                    [at(i), at(i + 1)],
                                    [ini(i), ini(i + 1)],
                                    accp.add(i),
                                );
                                i += 2;
                            } else {
                                block::<1>(blk, [at(i)], [ini(i)], accp.add(i));
                                i += 1;
                            }
                        }
                    }
                }
                let mask: __mmask16 = ((1u32 << rn) - 1) as __mmask16;
                for i in 0..pn {
                    let o = (ip + i) * stride + j0;
                    assert!(o + rn <= out.len(), "gemm output of {}", out.len());
                    // SAFETY: acc[i] is 64-byte aligned; lanes < rn write out[o..o + rn],
                    // checked just above.
                    unsafe {
                        let v = _mm512_load_ps(s.acc.as_ptr().add(i) as *const f32);
                        _mm512_mask_storeu_ps(out.as_mut_ptr().add(o), mask, v);
                    }
                }
            }
        }
    });
}
