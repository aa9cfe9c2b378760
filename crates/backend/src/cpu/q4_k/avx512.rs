//! Q4_K × Q8_K decode (one activation row) for the AVX-512 VNNI driver (256-bit vectors,
//! `vpdpbusd` + `vpdpwssd`); more activation rows run the AVX2 kernel (`avx2.rs`) as before.
//!
//! The AVX2 kernel spends per 32 weights a `maddubs` (pairs to i16), a `madd` with the
//! sub-block scale (to i32), an add and a `pshufb` that broadcasts the scale. A 4-bit code
//! times a 6-bit scale does not fit a byte, so the scale cannot go into the weight as in
//! Q2_K; instead one `vpdpbusd` per 32 weights sums four products per i32 lane (|lane| ≤
//! 4 · 15 · 128, so it fits an i16), `packssdw` puts a chunk's two sub-blocks (low and high
//! nibbles) side by side in one vector of i16 lanes without saturating, and one `vpdpwssd`
//! multiplies them by their scales and adds them to the block's accumulator: per 64 weights
//! two `vpdpbusd`, one pack and one `vpdpwssd` where the AVX2 kernel has two `maddubs`, two
//! `madd`, two `pshufb` and three adds. The block's two integer totals (`Σ sc·q·a` and the
//! mins term from the bsums) come out of one shared horizontal reduction. Two consecutive
//! blocks run interleaved, and the loop prefetches the row stream 4 KiB ahead (see `PF`).
//! Measured on Zen 4 (`tests/bench_q8k_decode.rs`, one thread, CPU time, against the
//! AVX-512VL build of the AVX2 kernel): ×1.25 L2-resident, ×1.24 streamed from an mmap'd
//! file (19.3 → 24.2 GB/s of weights; ×1.13 without the prefetch).
//!
//! Float order: the integer totals are exact (the same as the reference's), and the f32
//! steps are those of the AVX2 kernel's one-row body (llama.cpp's repacked Q4_K GEMV, which
//! the Gemma test model's greedy identity depends on): per block
//! `acc = fma(Σ sc·q·a, d·d_a, acc)`, `acc_min = fma(Σ m·bsum, dmin·d_a, acc_min)` (here as
//! lanes 0 and 1 of one vector, each lane doing exactly that scalar operation), output
//! `acc − acc_min`. Bit-identity with the AVX2 body is tested below; accuracy against the
//! quant crate's `q4_k::dot` in tests/kernels_k.rs.

// Per-block accumulators are indexed inside unrolled constant loops.
#![allow(clippy::needless_range_loop)]

use super::avx2::{prep, Q4K};
use crate::cpu::q8_k::avx2::{load256, Micro};
use std::arch::x86_64::*;

pub(crate) struct Q4KVnni;

/// Software prefetch distance of the decode loop, in bytes ahead of the block being
/// summed (into the next rows of the thread's chunk where the row ends sooner). With the
/// integer work cut, one thread streaming an mmap'd file ran ~12 % below the L2-resident
/// rate; prefetching 4 KiB ahead takes ×1.10 of it (1 KiB ×1.04, 2 KiB ×1.08, 8 KiB ×1.01;
/// `tests/bench_q8k_decode.rs`, one thread).
const PF: usize = 4096;

/// The integer totals of `U` consecutive (weight block, activation block) pairs, their
/// instructions interleaved (independent work for the out-of-order core): lane 0 of
/// result `u` is `Σ sc·q·a`, lane 1 `Σ_j m_j (bsum_2j + bsum_2j+1)`. Also each block's
/// `[d, dmin]` in lanes 0 and 1.
///
/// # Safety
/// Each `wb[u]` a whole Q4_K block and each `ab[u]` a whole Q8_K block; AVX2/FMA/F16C and
/// AVX-512 F/BW/VL/VNNI enabled in the caller.
#[inline(always)]
unsafe fn blocks<const U: usize>(
    wb: [*const u8; U],
    ab: [*const u8; U],
) -> ([__m128i; U], [__m128; U]) {
    // SAFETY (whole body): reads inside the named blocks.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        // Chunk c: i16 lanes [sc_2c × 4, sc_2c+1 × 4] in each 128-bit lane, the layout of
        // `packs_epi32(Σ low nibbles, Σ high nibbles)`. Selects words of `Prep::sc16`.
        let sel: [__m256i; 4] = std::array::from_fn(|c| {
            let (l, h) = ((4 * c) as i8, (4 * c + 2) as i8);
            _mm256_setr_epi8(
                l,
                l + 1,
                l,
                l + 1,
                l,
                l + 1,
                l,
                l + 1,
                h,
                h + 1,
                h,
                h + 1,
                h,
                h + 1,
                h,
                h + 1,
                l,
                l + 1,
                l,
                l + 1,
                l,
                l + 1,
                l,
                l + 1,
                h,
                h + 1,
                h,
                h + 1,
                h,
                h + 1,
                h,
                h + 1,
            )
        });
        let mut sc = [_mm256_setzero_si256(); U];
        let mut mins = [_mm256_setzero_si256(); U];
        let mut dm = [_mm_setzero_ps(); U];
        for u in 0..U {
            let p = prep(wb[u]);
            sc[u] = p.sc16;
            mins[u] = _mm256_madd_epi16(load256(ab[u].add(260)), p.mins);
            dm[u] = _mm_unpacklo_ps(_mm256_castps256_ps128(p.d), _mm256_castps256_ps128(p.dmin));
        }
        let mut sumi = [_mm256_setzero_si256(); U];
        for c in 0..4 {
            for u in 0..U {
                let qv = load256(wb[u].add(16 + 32 * c));
                let lo = _mm256_and_si256(qv, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qv), m4);
                let z = _mm256_setzero_si256();
                let sl = _mm256_dpbusd_epi32(z, lo, load256(ab[u].add(4 + 64 * c)));
                let sh = _mm256_dpbusd_epi32(z, hi, load256(ab[u].add(36 + 64 * c)));
                let s16 = _mm256_shuffle_epi8(sc[u], sel[c]);
                sumi[u] = _mm256_dpwssd_epi32(sumi[u], _mm256_packs_epi32(sl, sh), s16);
            }
        }
        let mut tot = [_mm_setzero_si128(); U];
        for u in 0..U {
            // [s01, s23, m01, m23 | s45, s67, m45, m67] → [Σs, Σm, Σs, Σm] (exact).
            let h = _mm256_hadd_epi32(sumi[u], mins[u]);
            let x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            tot[u] = _mm_hadd_epi32(x, x);
        }
        (tot, dm)
    }
}

/// `acc` lanes 0, 1 (`acc`, `acc_min`) after the blocks whose totals are `tot`, in order.
///
/// # Safety
/// `ab[u]` a whole Q8_K block; AVX2/FMA enabled in the caller.
#[inline(always)]
unsafe fn fold<const U: usize>(
    tot: [__m128i; U],
    dm: [__m128; U],
    ab: [*const u8; U],
    mut acc: __m128,
) -> __m128 {
    for u in 0..U {
        // SAFETY: the block's d_a at offset 0.
        let da = _mm_set1_ps(unsafe { (ab[u] as *const f32).read_unaligned() });
        // Lane 0: fma(Σs, d·d_a, acc); lane 1: fma(Σm, dmin·d_a, acc_min).
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(tot[u]), _mm_mul_ps(dm[u], da), acc);
    }
    acc
}

impl Micro for Q4KVnni {
    const BYTES: usize = 144;

    fn alt_rows(na: usize) -> usize {
        Q4K::alt_rows(na)
    }

    #[inline(always)]
    unsafe fn tile<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        if NA != 1 {
            // SAFETY: forwarded contract.
            unsafe { Q4K::tile::<NA>(w, a, arb, nb, out, stride) };
            return;
        }
        // SAFETY (whole body): the weight row and the activation row are nb blocks long
        // (trait contract), so every block named below is inside them; the driver enables
        // AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI.
        unsafe {
            let mut acc = _mm_setzero_ps();
            let mut b = 0;
            while b + 2 <= nb {
                // The two blocks span 4.5 cache lines: five prefetches (only hints, so an
                // address past the buffer is harmless; `wrapping_add` keeps it defined).
                let p = w.wrapping_add(b * 144 + PF) as *const i8;
                for l in 0..5 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l));
                }
                let ab = [a.add(b * 292), a.add((b + 1) * 292)];
                let (tot, dm) = blocks::<2>([w.add(b * 144), w.add((b + 1) * 144)], ab);
                acc = fold::<2>(tot, dm, ab, acc);
                b += 2;
            }
            if b < nb {
                let ab = [a.add(b * 292)];
                let (tot, dm) = blocks::<1>([w.add(b * 144)], ab);
                acc = fold::<1>(tot, dm, ab, acc);
            }
            *out = _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)));
        }
    }

    #[inline(always)]
    unsafe fn tile_alt<const NA: usize>(
        w: *const u8,
        a: *const u8,
        arb: usize,
        nb: usize,
        out: *mut f32,
        stride: usize,
    ) {
        // SAFETY: forwarded contract.
        unsafe { Q4K::tile_alt::<NA>(w, a, arb, nb, out, stride) }
    }
}

#[cfg(test)]
mod tests {
    use super::Q4KVnni;
    use crate::cpu::q4_k::avx2::Q4K;
    use crate::cpu::q8_k::avx2::{testdata, Micro};
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// One output through the VNNI decode tile, or through the AVX2 one-row body it must
    /// match bit for bit.
    ///
    /// # Safety
    /// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI available; `w`, `a` one row of `nb` blocks.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn run(vnni: bool, w: &[u8], a: &[u8], nb: usize) -> f32 {
        let mut o = 0f32;
        // SAFETY: forwarded contract.
        unsafe {
            if vnni {
                Q4KVnni::tile::<1>(w.as_ptr(), a.as_ptr(), nb * 292, nb, &mut o, 1);
            } else {
                Q4K::tile::<1>(w.as_ptr(), a.as_ptr(), nb * 292, nb, &mut o, 1);
            }
        }
        o
    }

    #[test]
    fn decode_is_bit_identical_to_the_avx2_body() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni"))
        {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        let mut rng = StdRng::seed_from_u64(0x4b56);
        for nb in [1, 2, 3, 4, 7, 8, 11, 22] {
            for rep in 0..20 {
                let w = testdata::weights(144, &[0, 2], nb, 1, &mut rng);
                let a = testdata::acts(nb, 1, &mut rng);
                // SAFETY: features detected above; buffers hold nb blocks.
                let (want, got) = unsafe { (run(false, &w, &a, nb), run(true, &w, &a, nb)) };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "nb {nb} rep {rep}: {got} vs {want}"
                );
                assert!(want != 0.0 && want.is_finite(), "nb {nb} rep {rep}");
            }
        }
    }
}
