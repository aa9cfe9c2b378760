//! Portable pieces of the GEMM shared by every weight type that meets Q8_K activations (the
//! K-quants): the `GemmFn` shape contract (checked once per call, so the SIMD code can load
//! without bounds checks), the scalar path over the quant crate's reference dots, and the
//! activation panel size.

use neagari_quant::k_common::QK_K;

/// Bytes of one Q8_K block (f32 d, 256 × i8, 16 × i16).
pub(crate) const Q8K_BYTES: usize = 292;

/// Row geometry of one `GemmFn` call, after [`check`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows {
    /// Blocks per row.
    pub nb: usize,
    /// Bytes of one packed weight row.
    pub wrb: usize,
    /// Bytes of one activation row.
    pub arb: usize,
}

/// Checks the `GemmFn` contract for a weight type of `block_bytes` per 256 values:
/// `w` holds `nw` rows, `a` holds `na` Q8_K rows, and `out[i * out_stride + j]` exists for
/// every `i < na`, `j < nw` without rows overlapping.
///
/// # Panics
/// When the contract is broken. The matmul op sizes these buffers from validated tensor
/// shapes, so input never reaches the panic; the SIMD kernels' unchecked loads rely on it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    k: usize,
    block_bytes: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &[f32],
    out_stride: usize,
) -> Rows {
    assert!(
        k.is_multiple_of(QK_K),
        "gemm: k = {k} is not a multiple of {QK_K}"
    );
    let nb = k / QK_K;
    let (wrb, arb) = (nb * block_bytes, nb * Q8K_BYTES);
    assert!(
        w.len() >= nw * wrb,
        "gemm: {} weight bytes for {nw} rows of {wrb}",
        w.len()
    );
    assert!(
        a.len() >= na * arb,
        "gemm: {} activation bytes for {na} rows of {arb}",
        a.len()
    );
    if na > 0 && nw > 0 {
        assert!(
            na == 1 || out_stride >= nw,
            "gemm: out_stride {out_stride} < nw {nw}"
        );
        let need = (na - 1) * out_stride + nw;
        assert!(
            out.len() >= need,
            "gemm: output of {} for {need}",
            out.len()
        );
    }
    Rows { nb, wrb, arb }
}

/// `out[i * out_stride + j] = dot(weight row j, activation row i)` with a reference dot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scalar_gemm(
    r: Rows,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
    dot: impl Fn(&[u8], &[u8]) -> f32,
) {
    for i in 0..na {
        let ar = &a[i * r.arb..(i + 1) * r.arb];
        for j in 0..nw {
            out[i * out_stride + j] = dot(&w[j * r.wrb..(j + 1) * r.wrb], ar);
        }
    }
}

/// Activation rows per panel: a panel (64 × 2.3 KB at k = 2048) stays in L2 while each
/// weight row streams past it once, so prefill reads the weights `na / 64` times, not `na`.
pub(crate) const ACT_PANEL: usize = 64;
