//! Portable pieces every GEMM kernel shares: the shape contract of `GemmFn` (checked once per
//! call, so the SIMD code below it can index without bounds checks), the scalar driver that
//! turns a quant crate reference dot into a `GemmFn`, and the order in which the SIMD
//! drivers walk the output in register tiles.

// The tile walk serves only the SIMD drivers, which exist on x86_64 so far.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// Row sizes of one `GemmFn` call, after `check`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Bytes of one packed weight row.
    pub wrb: usize,
    /// Bytes of one activation row.
    pub arb: usize,
}

/// Checks the `GemmFn` contract: `w` holds `nw` rows of `wrb` bytes, `a` holds `na` rows of
/// `arb` bytes, `out[i * out_stride + j]` exists for every `i < na`, `j < nw`, and rows of
/// `out` do not overlap. `k` must be a multiple of `block`.
///
/// # Panics
/// When the contract is broken. Callers (the matmul op) size these buffers from validated
/// tensor shapes, so input never reaches the panic; the SIMD kernels rely on the check.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check(
    k: usize,
    block: usize,
    wrb: usize,
    arb: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &[f32],
    out_stride: usize,
) -> Shape {
    assert!(
        k.is_multiple_of(block),
        "gemm: k = {k} is not a multiple of the block size {block}"
    );
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
    Shape { wrb, arb }
}

/// `out[i * out_stride + j] = dot(weight row j, activation row i)` with a reference dot.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scalar_gemm(
    s: Shape,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
    dot: impl Fn(&[u8], &[u8]) -> f32,
) {
    for i in 0..na {
        let ar = &a[i * s.arb..(i + 1) * s.arb];
        for j in 0..nw {
            out[i * out_stride + j] = dot(&w[j * s.wrb..(j + 1) * s.wrb], ar);
        }
    }
}

/// Activation rows per panel: a panel's activations (≈ 64 × 4.3 KB at k = 4096 in Q8_0)
/// stay in L2 while every weight row streams past them once.
pub(crate) const ACT_PANEL: usize = 64;

/// One register tile of the output: weight rows `j0..j0+rn`, activation rows `i0..i0+cn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    pub j0: usize,
    pub rn: usize,
    pub i0: usize,
    pub cn: usize,
}

/// Walks `out[na × nw]` in tiles of at most `r_decode × 1` when a panel has one activation
/// row (decode: several weight rows share each loaded activation block) and at most
/// `r_batch × c_batch` otherwise (prefill: each decoded weight block meets several
/// activation rows).
pub(crate) fn for_each_tile(
    nw: usize,
    na: usize,
    r_decode: usize,
    (r_batch, c_batch): (usize, usize),
    mut f: impl FnMut(Tile),
) {
    for ip in (0..na).step_by(ACT_PANEL) {
        let pn = ACT_PANEL.min(na - ip);
        let (rstep, cstep) = if pn == 1 {
            (r_decode, 1)
        } else {
            (r_batch, c_batch)
        };
        let mut j0 = 0;
        while j0 < nw {
            let rn = rstep.min(nw - j0);
            let mut i0 = ip;
            while i0 < ip + pn {
                let cn = cstep.min(ip + pn - i0);
                f(Tile { j0, rn, i0, cn });
                i0 += cn;
            }
            j0 += rn;
        }
    }
}

/// Kernel selection and the portable path of a 32-weight legacy format (Q4_1, Q5_0, Q5_1,
/// Q8_0), written once: AVX-512 VNNI tiles for decode, else AVX2 tiles, else the quant
/// crate's reference dot row by row. The format's module supplies `avx2::$T` and
/// `avx512::$T`; `$avx2_gemm` is the AVX2 tile driver of its code signedness.
macro_rules! legacy_format {
    ($name:literal, $q:ident, $T:ident, $act:ident, $act_mod:ident, $avx2_gemm:ident,
     w_bytes: $wb:expr, a_bytes: $ab:expr) => {
        #[doc = concat!("The ", $name, " kernel for this CPU (AVX-512 VNNI for decode, else AVX2, when available and not `scalar_only`).")]
        pub(crate) fn kernel(
            feats: &super::kernels::CpuFeatures,
            scalar_only: bool,
        ) -> super::kernels::MatKernel {
            use super::kernels::{ActFormat, MatKernel};
            #[cfg(target_arch = "x86_64")]
            if feats.has_avx512vnni() && !scalar_only {
                return MatKernel {
                    act: ActFormat::$act,
                    quantize_act: super::$act_mod::quantize_act_avx2,
                    gemm: super::avx512_tiles::gemm::<avx512::$T>,
                    isa: "avx512vnni",
                };
            }
            #[cfg(target_arch = "x86_64")]
            if feats.has_avx2() && !scalar_only {
                return MatKernel {
                    act: ActFormat::$act,
                    quantize_act: super::$act_mod::quantize_act_avx2,
                    gemm: super::avx2_tiles::$avx2_gemm::<avx2::$T>,
                    isa: "avx2",
                };
            }
            let _ = (feats, scalar_only);
            MatKernel {
                act: ActFormat::$act,
                quantize_act: super::$act_mod::quantize_act_scalar,
                gemm: gemm_scalar,
                isa: "scalar",
            }
        }

        fn gemm_scalar(
            k: usize,
            w: &[u8],
            nw: usize,
            a: &[u8],
            na: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            use neagari_quant::$q;
            let nb = k / $q::QK;
            let s = super::tiles::check(k, $q::QK, nb * $wb, nb * $ab, w, nw, a, na, out, out_stride);
            super::tiles::scalar_gemm(s, w, nw, a, na, out, out_stride, |w, a| {
                $q::dot(bytemuck::cast_slice(w), bytemuck::cast_slice(a))
            });
        }
    };
}
pub(crate) use legacy_format;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_the_output_exactly_once() {
        for (nw, na) in [(1, 1), (5, 1), (17, 3), (3, 70), (9, 129)] {
            let mut seen = vec![0u8; nw * na];
            for_each_tile(nw, na, 4, (2, 4), |t| {
                assert!(t.rn >= 1 && t.cn >= 1);
                for i in t.i0..t.i0 + t.cn {
                    for j in t.j0..t.j0 + t.rn {
                        seen[i * nw + j] += 1;
                    }
                }
            });
            assert!(seen.iter().all(|&c| c == 1), "nw {nw} na {na}");
        }
    }
}
