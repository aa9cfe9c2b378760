//! The GEMM driver for weight formats whose blocks meet Q8_0 activations but are not 32
//! weights of one scale: Q1_0 and PQ2_0 / PTQ1_0 (128 weights, four activation blocks per
//! weight block), Q2_0 (64), IQ4_NL (32, non-linear table). A format gives its block
//! geometry, its reference dot and a micro-kernel per instruction set; this module owns the
//! shape contract, the activation repack and the walk over the output.
//!
//! Activation repack (once per call, L1/L2-resident; the weights stream past it): the Q8_0
//! rows are split into `qs[na × k]` (the signed quants, optionally reordered inside each
//! 32-block, see `Perm`), `dl[na × k/4]` (the block's f32 scale once per four quants, so a
//! micro-kernel's i32 lane `l` meets its scale at lane `l` of one load) and
//! `sa[na × k/4]` (the sum of each four quants, for formats whose codes carry an offset:
//! `Σ(c − o)·a = Σc·a − o·Σa`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use super::kernels::{ActFormat, CpuFeatures, MatKernel};
use super::tiles::{check, scalar_gemm};
use neagari_quant::float::f16_to_f32;

/// Bytes of one Q8_0 activation block.
const Q8_0_BYTES: usize = 34;

/// How the quants of each 32-block are laid out in the repacked activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Perm {
    /// As they are.
    Identity,
    /// `a'[8p + i] = a[4i + p]`: the order in which 2-bit codes packed four to a byte
    /// (weight `4i + p` in bits `2p` of byte `i`) come out of four shifts of one u64.
    Stride4,
    /// Per 128 weights: the first halves (16 quants) of the four 32-blocks, then their
    /// second halves. A 64-byte register then holds 16 quants of each block, one block per
    /// 128-bit lane, so two registers accumulate into the same per-block lanes (Q1_0).
    Halves16,
}

/// One weight format as this driver needs it.
pub(crate) trait WideFormat {
    /// Weights per block (a multiple of 32).
    const BLOCK: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Activation order the micro-kernels expect.
    const PERM: Perm;
    /// Reference dot of one packed weight row with one Q8_0 row (the quant crate's scalar
    /// code: the truth the SIMD kernels are tested against).
    fn dot(w: &[u8], a: &[u8]) -> f32;
}

/// The repacked activation rows of one call (see the module doc).
pub(crate) struct WideActs {
    /// `qs[na × k]`, 64-byte aligned rows when `k` is a multiple of 64.
    pub qs: Vec<i8>,
    /// `dl[na × k/4]`.
    pub dl: Vec<f32>,
    /// `sa[na × k/4]`.
    pub sa: Vec<i32>,
    pub k: usize,
}

impl WideActs {
    fn empty() -> Self {
        WideActs {
            qs: Vec::new(),
            dl: Vec::new(),
            sa: Vec::new(),
            k: 0,
        }
    }

    pub(crate) fn new(a: &[u8], na: usize, k: usize, perm: Perm) -> Self {
        let mut x = WideActs::empty();
        x.fill(a, na, k, perm);
        x
    }

    /// Repacks `na` Q8_0 rows of `k` values from `a`, reusing the allocations.
    fn fill(&mut self, a: &[u8], na: usize, k: usize, perm: Perm) {
        let nb = k / 32;
        self.k = k;
        self.qs.clear();
        self.qs.resize(na * k, 0);
        self.dl.clear();
        self.dl.resize(na * k / 4, 0.0);
        self.sa.clear();
        self.sa.resize(na * k / 4, 0);
        // The permutation repeats every 128 quants (or is the identity).
        let period: [u16; 128] = std::array::from_fn(|p| perm.source(p) as u16);
        let rows = a.chunks_exact(nb * Q8_0_BYTES).take(na);
        let outs = self.qs.chunks_exact_mut(k.max(1));
        for (i, (src, row)) in rows.zip(outs).enumerate() {
            // Quant of weight `s` of this row.
            let q = |s: usize| src[s / 32 * Q8_0_BYTES + 2 + s % 32] as i8;
            if perm == Perm::Identity || !k.is_multiple_of(128) {
                for (p, v) in row.iter_mut().enumerate() {
                    *v = q(perm.source(p));
                }
            } else {
                for (c, chunk) in row.chunks_exact_mut(128).enumerate() {
                    for (v, &s) in chunk.iter_mut().zip(&period) {
                        *v = q(128 * c + s as usize);
                    }
                }
            }
            let dl = &mut self.dl[i * k / 4..(i + 1) * k / 4];
            let sa = &mut self.sa[i * k / 4..(i + 1) * k / 4];
            for (l, (d, s)) in dl.iter_mut().zip(sa.iter_mut()).enumerate() {
                let at = perm.source(4 * l) / 32 * Q8_0_BYTES;
                *d = f16_to_f32([src[at], src[at + 1]]);
                *s = row[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum();
            }
        }
    }
}

/// The last repacked activation of this thread and what it was made from.
struct ActCache {
    src: Vec<u8>,
    na: usize,
    perm: Perm,
    acts: WideActs,
}

thread_local! {
    static ACT_CACHE: std::cell::RefCell<ActCache> = std::cell::RefCell::new(ActCache {
        src: Vec::new(),
        na: 0,
        perm: Perm::Identity,
        acts: WideActs::empty(),
    });
}

/// Runs `f` on the repacked form of the Q8_0 rows `a`. A matmul hands the same activation
/// to every chunk of weight rows, so each thread repacks it once per matmul instead of once
/// per chunk: the repack is a pure function of (bytes, rows, k, order), and a cached copy
/// is reused only when all four are equal (one compare of the Q8_0 bytes, ~2 KB in decode).
pub(crate) fn with_acts<R>(
    a: &[u8],
    na: usize,
    k: usize,
    perm: Perm,
    f: impl FnOnce(&WideActs) -> R,
) -> R {
    let a = &a[..na * (k / 32) * Q8_0_BYTES];
    ACT_CACHE.with(|c| match c.try_borrow_mut() {
        Ok(mut c) => {
            if !(c.na == na && c.acts.k == k && c.perm == perm && c.src == a) {
                c.acts.fill(a, na, k, perm);
                c.src.clear();
                c.src.extend_from_slice(a);
                c.na = na;
                c.perm = perm;
            }
            f(&c.acts)
        }
        // Re-entered from inside `f` (not done today): repack without the cache.
        Err(_) => f(&WideActs::new(a, na, k, perm)),
    })
}

impl Perm {
    /// The weight index whose activation quant sits at repacked position `p`.
    #[inline]
    fn source(self, p: usize) -> usize {
        match self {
            Perm::Identity => p,
            Perm::Stride4 => {
                let j = p % 32;
                p - j + 4 * (j % 8) + j / 8
            }
            Perm::Halves16 => {
                let j = p % 128;
                let (h, q, r) = (j / 64, (j % 64) / 16, j % 16);
                p - j + 32 * q + 16 * h + r
            }
        }
    }
}

/// The kernel of format `F` on this CPU: the AVX-512 VNNI micro-kernel `V`, else the AVX2
/// micro-kernel `A`, else the scalar reference.
#[cfg(target_arch = "x86_64")]
pub(crate) fn kernel<F: WideFormat, A: x86::WideMicro, V: x86::WideMicro>(
    feats: &CpuFeatures,
    scalar_only: bool,
) -> MatKernel {
    if !scalar_only && feats.has_avx512vnni() {
        return MatKernel {
            act: ActFormat::Q8_0,
            quantize_act: super::q8_0::quantize_act_avx2,
            gemm: x86::gemm_avx512vnni::<F, V>,
            isa: "avx512vnni",
        };
    }
    if !scalar_only && feats.has_avx2() {
        return MatKernel {
            act: ActFormat::Q8_0,
            quantize_act: super::q8_0::quantize_act_avx2,
            gemm: x86::gemm_avx2::<F, A>,
            isa: "avx2",
        };
    }
    scalar_kernel::<F>()
}

/// The scalar reference kernel of format `F` (the only one off x86).
pub(crate) fn scalar_kernel<F: WideFormat>() -> MatKernel {
    MatKernel {
        act: ActFormat::Q8_0,
        quantize_act: super::q8_0::quantize_act_scalar,
        gemm: gemm_scalar::<F>,
        isa: "scalar",
    }
}

/// Portable `GemmFn` body: the format's reference dot row by row.
pub(crate) fn gemm_scalar<F: WideFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let s = shape::<F>(k, w, nw, a, na, out, out_stride);
    scalar_gemm(s, w, nw, a, na, out, out_stride, F::dot);
}

/// Checks the `GemmFn` contract for format `F`.
fn shape<F: WideFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &[f32],
    out_stride: usize,
) -> super::tiles::Shape {
    check(
        k,
        F::BLOCK,
        k / F::BLOCK * F::BYTES,
        k / 32 * Q8_0_BYTES,
        w,
        nw,
        a,
        na,
        out,
        out_stride,
    )
}
