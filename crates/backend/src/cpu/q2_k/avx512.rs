//! Q2_K × Q8_K micro-kernel for the AVX-512 VNNI driver (256-bit vectors, `vpdpbusd`).
//!
//! The AVX2 kernel (`avx2.rs`) spends per 32 weights and row a `maddubs`, a `madd` with
//! the two group scales and an add. Here the scale goes into the weight instead: a 2-bit
//! code times a 4-bit scale is at most 45, so `q · sc` is still an unsigned byte and one
//! `vpdpbusd` per 32 weights and row sums `Σ sc · q · a` straight into i32 lanes (4 of the
//! 45 · 127 products per lane, far from overflow). The products come from `pshufb` tables
//! built once per block and half (128 weights): in lane `L` (groups of parity `L`), byte
//! `4p + q` of table A is `q · sc` of the half's group `2p + L` (one `pshufb` spreads the
//! scales to dwords, a `vpmulld` by `0x03020100` makes `[0, s, 2s, 3s]`); table B is A
//! transposed (byte `4q + p`). Chunk `k` of a half (weights `32k .. 32k + 32`, codes at
//! bits `2k` of each byte) indexes A with `q | 4k` for even `k` and B with `(q << 2) | k`
//! for odd `k`, where the code bits already lie at bits 0–1 or 2–3 of the byte (`qs` or
//! `qs >> 4`): one shift per half instead of three.
//!
//! Decode (one activation row) is bound by vector-port throughput, not by the loads or
//! the memory stream: it runs two consecutive blocks interleaved (independent work for the
//! out-of-order core on one memory stream). Two or four weight rows per step (sharing the
//! activation loads) were 1.1–1.2× faster on L2-resident rows but 0.3–0.5× on rows
//! streamed from memory, 0.5–0.75× with software prefetch: the hardware prefetchers lose
//! interleaved row streams. Measured on Zen 4 with `tests/bench_q8k_decode.rs` (one thread,
//! CPU time, against the AVX-512VL build of the AVX2 kernel): decode ×1.22 L2-resident,
//! ×1.18 streamed from an mmap'd file (14.2 → 16.8 GB/s of weights); 8-row prefill ×1.45.
//!
//! The integer sums equal the reference's exactly (same products, exact i32 sums); only
//! the f32 accumulation order differs. Tested against the quant crate's `q2_k::dot` in
//! tests/kernels_k.rs.

// Per-row / per-block accumulators are indexed inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use crate::cpu::q8_k::avx2::{hsum_ps, load256, load_f16x2, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q2KVnni;

/// One block's product tables (A and B per half), its mins as i16 lanes in the order of
/// the Q8_K `bsums`, and `d`, `dmin` broadcast.
struct Prep {
    ta: [__m256i; 2],
    tb: [__m256i; 2],
    mins: __m256i,
    d: __m256,
    dmin: __m256,
}

/// Tables, mins and scales of the Q2_K block at `wb`.
///
/// # Safety
/// `wb` must point at a whole 84-byte block; the caller enables AVX2/F16C and AVX-512BW/VL.
#[inline(always)]
unsafe fn prep(wb: *const u8) -> Prep {
    // SAFETY: register intrinsics and reads inside the block.
    unsafe {
        // Dword p of lane L of half h's table A: scale byte 8h + 2p + L in byte 0 (0x80
        // zeroes the rest); times 0x03020100 that is [0, s, 2s, 3s] (3s ≤ 45: no carries).
        let z = -128;
        let sel = [
            _mm256_setr_epi8(
                0, z, z, z, 2, z, z, z, 4, z, z, z, 6, z, z, z, 1, z, z, z, 3, z, z, z, 5, z, z, z,
                7, z, z, z,
            ),
            _mm256_setr_epi8(
                8, z, z, z, 10, z, z, z, 12, z, z, z, 14, z, z, z, 9, z, z, z, 11, z, z, z, 13, z,
                z, z, 15, z, z, z,
            ),
        ];
        let ramp = _mm256_set1_epi32(0x0302_0100);
        // Byte 4q + p of B = byte 4p + q of A.
        let transpose = _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6,
            10, 14, 3, 7, 11, 15,
        );
        // Scale bytes 0..8 (lane 0) and 8..16 (lane 1) widened to i16, as the bsums lie.
        let widen = _mm256_setr_epi8(
            0, z, 1, z, 2, z, 3, z, 4, z, 5, z, 6, z, 7, z, 8, z, 9, z, 10, z, 11, z, 12, z, 13, z,
            14, z, 15, z,
        );
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(wb as *const __m128i));
        let lo = _mm256_and_si256(both, _mm256_set1_epi8(15));
        let mut ta = [_mm256_setzero_si256(); 2];
        let mut tb = [_mm256_setzero_si256(); 2];
        for h in 0..2 {
            ta[h] = _mm256_mullo_epi32(_mm256_shuffle_epi8(lo, sel[h]), ramp);
            tb[h] = _mm256_shuffle_epi8(ta[h], transpose);
        }
        let mins = _mm256_srli_epi16::<4>(_mm256_shuffle_epi8(both, widen));
        let dm = load_f16x2(wb.add(80));
        Prep {
            ta,
            tb,
            mins,
            d: _mm256_broadcastss_ps(dm),
            dmin: _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
        }
    }
}

/// The table indices of the four chunks of one half's 32 code bytes `qv` (see the module
/// doc): chunks 0 and 2 index table A, chunks 1 and 3 table B.
#[inline(always)]
unsafe fn indices(qv: __m256i) -> [__m256i; 4] {
    // SAFETY: register intrinsics; the caller enables AVX2 (and AVX-512VL, where LLVM
    // merges each and + or into one `vpternlog`).
    unsafe {
        let (m3, m12) = (_mm256_set1_epi8(3), _mm256_set1_epi8(12));
        let sh = _mm256_srli_epi16::<4>(qv);
        [
            _mm256_and_si256(qv, m3),
            _mm256_or_si256(_mm256_and_si256(qv, m12), _mm256_set1_epi8(1)),
            _mm256_or_si256(_mm256_and_si256(sh, m3), _mm256_set1_epi8(8)),
            _mm256_or_si256(_mm256_and_si256(sh, m12), _mm256_set1_epi8(3)),
        ]
    }
}

/// `acc[u] += d_a · (d · Σ sc q a − dmin · Σ m bsum)` for `U` (weight block, activation
/// block) pairs, their instructions interleaved (independent work for the out-of-order
/// core); each pair's eight `vpdpbusd` alternate between two accumulators.
///
/// # Safety
/// Each `wb[u]` a whole Q2_K block and each `ab[u]` a whole Q8_K block; AVX-512 VNNI
/// enabled in the caller.
#[inline(always)]
unsafe fn blocks<const U: usize>(wb: [*const u8; U], ab: [*const u8; U], acc: &mut [__m256; U]) {
    // SAFETY (whole body): reads inside the named blocks.
    unsafe {
        // (A loop, not `array::from_fn`: closures do not inherit the target features.)
        // SAFETY: `Prep` is plain SIMD registers, for which all-zero bytes are valid.
        let mut p: [Prep; U] = std::mem::zeroed();
        for u in 0..U {
            p[u] = prep(wb[u]);
        }
        let mut part = [[_mm256_setzero_si256(); 2]; U];
        for h in 0..2 {
            for u in 0..U {
                let idx = indices(load256(wb[u].add(16 + 32 * h)));
                for k in 0..4 {
                    let t = if k % 2 == 0 { p[u].ta[h] } else { p[u].tb[h] };
                    let wq = _mm256_shuffle_epi8(t, idx[k]);
                    let av = load256(ab[u].add(4 + 128 * h + 32 * k));
                    part[u][k % 2] = _mm256_dpbusd_epi32(part[u][k % 2], wq, av);
                }
            }
        }
        for u in 0..U {
            let sumi = _mm256_add_epi32(part[u][0], part[u][1]);
            acc[u] = finish(sumi, &p[u], ab[u], acc[u]);
        }
    }
}

/// `acc + d_a · (d · sumi − dmin · Σ m bsum)` for the activation block at `ab`.
///
/// # Safety
/// `ab` must point at a whole Q8_K block; AVX2/FMA enabled in the caller.
#[inline(always)]
unsafe fn finish(sumi: __m256i, p: &Prep, ab: *const u8, acc: __m256) -> __m256 {
    // SAFETY: reads of the block's d (offset 0) and bsums (offset 260).
    unsafe {
        let da = _mm256_set1_ps((ab as *const f32).read_unaligned());
        let summ = _mm256_cvtepi32_ps(_mm256_madd_epi16(load256(ab.add(260)), p.mins));
        let f = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), p.d);
        _mm256_fmadd_ps(_mm256_fnmadd_ps(summ, p.dmin, f), da, acc)
    }
}

impl Micro for Q2KVnni {
    const BYTES: usize = 84;

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
        // enables AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI.
        unsafe {
            if NA == 1 {
                // Decode: two consecutive blocks per step.
                let mut acc = [_mm256_setzero_ps(); 2];
                let mut b = 0;
                while b + 2 <= nb {
                    blocks::<2>(
                        [w.add(b * 84), w.add((b + 1) * 84)],
                        [a.add(b * 292), a.add((b + 1) * 292)],
                        &mut acc,
                    );
                    b += 2;
                }
                let mut last = [acc[1]];
                if b < nb {
                    blocks::<1>([w.add(b * 84)], [a.add(b * 292)], &mut last);
                }
                *out = hsum_ps(_mm256_add_ps(acc[0], last[0]));
                return;
            }
            // Prefill: each block's tables and indices serve all NA rows, which leaves one
            // `vpdpbusd` per 32 weights and row.
            let mut acc = [_mm256_setzero_ps(); NA];
            for b in 0..nb {
                let wb = w.add(b * Self::BYTES);
                let ab: [*const u8; NA] = std::array::from_fn(|i| a.add(i * arb + b * 292));
                let p = prep(wb);
                let mut sumi = [_mm256_setzero_si256(); NA];
                for h in 0..2 {
                    let idx = indices(load256(wb.add(16 + 32 * h)));
                    for k in 0..4 {
                        let t = if k % 2 == 0 { p.ta[h] } else { p.tb[h] };
                        let wq = _mm256_shuffle_epi8(t, idx[k]);
                        for i in 0..NA {
                            let av = load256(ab[i].add(4 + 128 * h + 32 * k));
                            sumi[i] = _mm256_dpbusd_epi32(sumi[i], wq, av);
                        }
                    }
                }
                for i in 0..NA {
                    acc[i] = finish(sumi[i], &p, ab[i], acc[i]);
                }
            }
            for (i, v) in acc.iter().enumerate() {
                // SAFETY: output cell i is inside the tile (trait contract).
                *out.add(i * stride) = hsum_ps(*v);
            }
        }
    }
}
