//! Q8_K activations: the quantizer every K-quant kernel's activation rows go through once,
//! and the GEMM driver (shape contract, scalar path, register tiles) the K-quant weight
//! types share.

pub(crate) mod tiles;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use super::kernels::{ActFormat, CpuFeatures, GemmFn, MatKernel, QuantizeActFn};

/// Portable path: the quant crate's port of ggml's `quantize_row_q8_K_ref`.
fn quantize_scalar(x: &[f32], out: &mut [u8]) {
    neagari_quant::q8_k::quantize_row_bytes(x, out);
}

#[cfg(target_arch = "x86_64")]
fn quantize_avx2(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(256) && out.len() == x.len() / 256 * tiles::Q8K_BYTES,
        "Q8_K quantize: {} values into {} bytes",
        x.len(),
        out.len()
    );
    // SAFETY: only handed out by `quantize_act` after AVX2/FMA/F16C were detected; the
    // lengths were checked above.
    unsafe { avx2::quantize_row_q8_k(x, out) }
}

/// The Q8_K quantizer for this CPU and the name of its instruction set.
pub(crate) fn quantize_act(
    feats: &CpuFeatures,
    scalar_only: bool,
) -> (QuantizeActFn, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if feats.has_avx2() && !scalar_only {
        return (quantize_avx2, "avx2");
    }
    let _ = (feats, scalar_only);
    (quantize_scalar, "scalar")
}

/// One K-quant weight type, as the shared kernels below need it.
pub(crate) trait KFormat {
    /// Bytes of one 256-weight block.
    const BYTES: usize;
    /// Reference dot of one packed weight row with one Q8_K activation row (the quant
    /// crate's scalar code: the truth the SIMD kernels are tested against).
    fn dot(w: &[u8], a: &[u8]) -> f32;
    /// The format's AVX2 micro-kernel.
    #[cfg(target_arch = "x86_64")]
    type Micro: avx2::Micro;
    /// The micro-kernel of the AVX-512VL driver: mostly `Micro` again (the same source
    /// with EVEX encodings), or one written for AVX-512 F/BW/VL (mask registers).
    #[cfg(target_arch = "x86_64")]
    type Micro512: avx2::Micro;
    /// `Micro512` uses AVX-512 VNNI (`vpdpbusd`) as well: it then runs in the VNNI build of
    /// the driver where the CPU has VNNI, and `Micro` takes its place in the AVX-512VL
    /// build where it does not.
    const MICRO512_VNNI: bool = false;
}

fn gemm_scalar<F: KFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = tiles::check(k, F::BYTES, w, nw, a, na, out, out_stride);
    tiles::scalar_gemm(r, w, nw, a, na, out, out_stride, F::dot);
}

#[cfg(target_arch = "x86_64")]
fn gemm_avx2<F: KFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = tiles::check(k, F::BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: handed out by `kernel` only after AVX2/FMA/F16C were detected; `r` was
    // checked against these buffers.
    unsafe { avx2::gemm_avx2::<F::Micro>(r, w, nw, a, na, out, out_stride) }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn gemm_avx512vl<F: KFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = tiles::check(k, F::BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: handed out by `kernel` only after AVX2/FMA/F16C and AVX-512F/BW/VL were
    // detected; `r` was checked against these buffers.
    unsafe { avx2::gemm_avx512vl::<F::Micro512>(r, w, nw, a, na, out, out_stride) }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn gemm_avx512vnni<F: KFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = tiles::check(k, F::BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: handed out by `kernel` only after AVX2/FMA/F16C and AVX-512F/BW/VL/VNNI were
    // detected; `r` was checked against these buffers.
    unsafe { avx2::gemm_avx512vnni::<F::Micro512>(r, w, nw, a, na, out, out_stride) }
}

/// The AVX-512VL driver over the AVX2 micro-kernel, for a format whose `Micro512` needs
/// VNNI on a CPU without it.
#[cfg(target_arch = "x86_64")]
fn gemm_avx512vl_plain<F: KFormat>(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let r = tiles::check(k, F::BYTES, w, nw, a, na, out, out_stride);
    // SAFETY: as `gemm_avx512vl`.
    unsafe { avx2::gemm_avx512vl::<F::Micro>(r, w, nw, a, na, out, out_stride) }
}

/// The kernel of K-quant `F` for this CPU: the format's AVX-512 micro-kernel (VNNI build
/// where it needs VNNI, else the AVX-512VL build) where available, else AVX2, else scalar.
pub(crate) fn kernel<F: KFormat>(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    let (quantize_act, isa) = quantize_act(feats, scalar_only);
    let mk = |gemm: GemmFn, isa| MatKernel {
        act: ActFormat::Q8K,
        quantize_act,
        gemm,
        isa,
    };
    #[cfg(target_arch = "x86_64")]
    if isa == "avx2" {
        return if F::MICRO512_VNNI && feats.has_avx512vnni() {
            mk(gemm_avx512vnni::<F>, "avx512vnni")
        } else if F::MICRO512_VNNI && feats.has_avx512vl() {
            mk(gemm_avx512vl_plain::<F>, "avx512vl")
        } else if feats.has_avx512vl() {
            mk(gemm_avx512vl::<F>, "avx512vl")
        } else {
            mk(gemm_avx2::<F>, isa)
        };
    }
    mk(gemm_scalar::<F>, isa)
}
