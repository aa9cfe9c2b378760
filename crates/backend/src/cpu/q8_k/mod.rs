//! Q8_K activations: the quantizer every K-quant kernel's activation rows go through once,
//! and the GEMM driver (shape contract, scalar path, register tiles) the K-quant weight
//! types share.

pub(crate) mod tiles;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

use super::kernels::{CpuFeatures, QuantizeActFn};

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
