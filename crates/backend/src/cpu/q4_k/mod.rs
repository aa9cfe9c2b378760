//! Q4_K weights × Q8_K activations: the format's hooks for the shared K-quant kernels in
//! `q8_k` (scalar = the quant crate's reference dot; AVX2 micro-kernel in `avx2.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod lanes;

use super::kernels::{CpuFeatures, MatKernel};
use super::q8_k::KFormat;
use neagari_quant::{q4_k, BlockQ4_K, BlockQ8_K};

struct Format;

impl KFormat for Format {
    const BYTES: usize = 144;

    fn dot(w: &[u8], a: &[u8]) -> f32 {
        q4_k::dot(
            bytemuck::cast_slice::<u8, BlockQ4_K>(w),
            bytemuck::cast_slice::<u8, BlockQ8_K>(a),
        )
    }

    #[cfg(target_arch = "x86_64")]
    type Micro = avx2::Q4K;
    #[cfg(target_arch = "x86_64")]
    type Micro512 = avx512::Q4KVnni;
    const MICRO512_VNNI: bool = true;
}

/// The Q4_K kernel for this CPU: on AVX-512 VNNI, prefill's GEMM-order rows go through the
/// rows-in-lanes kernel (`lanes.rs`).
pub(crate) fn kernel(feats: &CpuFeatures, scalar_only: bool) -> MatKernel {
    let mut k = super::q8_k::kernel::<Format>(feats, scalar_only);
    #[cfg(target_arch = "x86_64")]
    if k.isa == "avx512vnni" {
        k.gemm = gemm_vnni;
    }
    k
}

/// Activation rows from which `gemm_vnni` takes the lanes kernel.
#[cfg(target_arch = "x86_64")]
const LANES_MIN_NA: usize = 8;

/// The VNNI driver (`avx512.rs`'s decode kernel; the AVX-512VL order elsewhere), with the
/// rows llama.cpp sums in its GEMM order (all but the last `na % 4`) through `lanes::gemm`
/// once there are `LANES_MIN_NA` of them.
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
    let split = na - na % 4;
    if split < LANES_MIN_NA {
        return super::q8_k::gemm_avx512vnni::<Format>(k, w, nw, a, na, out, out_stride);
    }
    let r = super::q8_k::tiles::check(k, Format::BYTES, w, nw, a, na, out, out_stride);
    assert!(
        super::avx512_tiles::available(),
        "AVX-512 VNNI kernel called on a CPU without AVX-512 F/BW/VL/VNNI"
    );
    // SAFETY: features checked just above; `r` was checked against these buffers.
    unsafe { lanes::gemm(r, w, nw, a, split, out, out_stride) };
    if split < na {
        // The last na % 4 rows in the GEMV order, as the AVX-512VL driver runs them.
        super::q8_k::gemm_avx512vnni::<Format>(
            k,
            w,
            nw,
            &a[split * r.arb..],
            na - split,
            &mut out[split * out_stride..],
            out_stride,
        );
    }
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
            144,
            &[0, 2],
            0x4c4e,
            crate::cpu::q8_k::gemm_avx512vl::<Format>,
            gemm_vnni,
        );
    }

    /// Tuning only: `cargo test --release -p neagari-backend --lib q4_k_prefill_speed --
    /// --ignored --nocapture` (Gemma 3 270M's ffn_down and attn_output shapes, one thread).
    #[test]
    #[ignore]
    fn q4_k_prefill_speed() {
        if !crate::cpu::avx512_tiles::available() {
            return;
        }
        testdata::lanes_speed(
            144,
            &[0, 2],
            crate::cpu::q8_k::gemm_avx512vl::<Format>,
            gemm_vnni,
        );
    }
}
