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
#[derive(Clone, Copy, PartialEq, Eq)]
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
    pub(crate) fn new(a: &[u8], na: usize, k: usize, perm: Perm) -> Self {
        let nb = k / 32;
        let mut x = WideActs {
            qs: vec![0; na * k],
            dl: vec![0.0; na * k / 4],
            sa: vec![0; na * k / 4],
            k,
        };
        // One row's quants in weight order and its block scales.
        let mut q = vec![0i8; k];
        let mut d = vec![0f32; nb];
        for i in 0..na {
            for b in 0..nb {
                let at = (i * nb + b) * Q8_0_BYTES;
                let blk = &a[at..at + Q8_0_BYTES];
                d[b] = f16_to_f32([blk[0], blk[1]]);
                for (v, &s) in q[32 * b..32 * b + 32].iter_mut().zip(&blk[2..]) {
                    *v = s as i8;
                }
            }
            let row = &mut x.qs[i * k..(i + 1) * k];
            for (p, v) in row.iter_mut().enumerate() {
                *v = q[perm.source(p)];
            }
            for l in 0..k / 4 {
                let o = i * k / 4 + l;
                x.dl[o] = d[perm.source(4 * l) / 32];
                x.sa[o] = row[4 * l..4 * l + 4].iter().map(|&v| v as i32).sum();
            }
        }
        x
    }
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
