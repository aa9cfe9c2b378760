//! Q6_K weights × Q8_K activations: the format's hooks for the shared K-quant kernels in
//! `q8_k` (scalar = the quant crate's reference dot; AVX2 micro-kernel in `avx2.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod lanes;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{q6_k, BlockQ6_K, BlockQ8_K};

struct Format;

impl KFormat for Format {
    const BYTES: usize = 210;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        q6_k::dot(
            bytemuck::cast_slice::<u8, BlockQ6_K>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    }

    #[cfg(target_arch = "x86_64")]
    type Micro = avx2::Q6K;
    #[cfg(target_arch = "x86_64")]
    type Micro512 = avx2::Q6K;
}

/// The Q6_K kernel for this CPU: on AVX-512 VNNI, prefills of 8 rows and more (llama.cpp's
/// tiled order) go through the rows-in-lanes kernel (`lanes.rs`).
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    let mut k = super::q8_k::kernel::<Format>(feats, scalar_only);
    #[cfg(target_arch = "x86_64")]
    if k.isa == "avx512vl" && feats.has_avx512vnni() {
        k.gemm = gemm_vnni;
        k.isa = "avx512vnni";
    }
    k
}

/// The AVX-512VL driver, with `lanes::gemm` from 8 activation rows (where the AVX-512VL
/// driver switches to the tiled order, `avx2::Q6K::alt_rows`).
#[cfg(target_arch = "x86_64")]
fn gemm_vnni(
    k: usize,
    w: &[u8],
    nw: usize,
    a: &[u8],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    if na < 8 {
        return super::q8_k::gemm_avx512vl::<Format>(k, w, nw, a, na, out, out_stride);
    }
    let r = super::q8_k::tiles::check(k, Format::BYTES, w, nw, a, na, out, out_stride);
    assert!(
        super::avx512_tiles::available(),
        "AVX-512 VNNI kernel called on a CPU without AVX-512 F/BW/VL/VNNI"
    );
    // SAFETY: features checked just above; `r` was checked against these buffers.
    unsafe { lanes::gemm(r, w, nw, a, na, out, out_stride) }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::cpu::q8_k::avx2::testdata;

    /// The VNNI driver (rows in lanes for the GEMM-order rows) is bit-identical to the
    /// AVX-512VL driver.
    #[test]
    fn lanes_driver_is_bit_identical_to_the_avx512vl_one() {
        if !crate::cpu::avx512_tiles::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        testdata::vnni_matches_avx512vl(
            210,
            &[208],
            0x3636,
            crate::cpu::q8_k::gemm_avx512vl::<Format>,
            gemm_vnni,
        );
    }

    /// Tuning only: `cargo test --release -p neagari-backend --lib q6_k_prefill_speed --
    /// --ignored --nocapture` (Gemma 3 270M's ffn_down and attn_output shapes, one thread).
    #[test]
    #[ignore]
    fn q6_k_prefill_speed() {
        if !crate::cpu::avx512_tiles::available() {
            return;
        }
        testdata::lanes_speed(
            210,
            &[208],
            crate::cpu::q8_k::gemm_avx512vl::<Format>,
            gemm_vnni,
        );
    }
}
