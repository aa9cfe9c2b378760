//! The per-format kernel table (ggml's `type_traits_cpu`, inside one binary).
//!
//! A weight matrix `W[out, k]` is stored as `out` packed rows in its GGUF type. The
//! activation rows are quantized once to the weight type's activation format (`ActFormat`)
//! and then every weight row is dotted with every activation row by an integer kernel.

use neagari_quant::GgmlType;

/// How activation rows are laid out before they meet a weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Plain little-endian f32 (F32/F16/BF16 weights).
    F32,
    /// ggml block_q8_0: f16 d, 32 x i8 (34 bytes / 32 values).
    Q8_0,
    /// ggml block_q8_1: f16 d, f16 s = d * sum(qs), 32 x i8 (36 bytes / 32 values).
    Q8_1,
    /// ggml block_q8_K: f32 d, 256 x i8, 16 x i16 bsums (292 bytes / 256 values).
    Q8K,
}

impl ActFormat {
    /// Bytes of one activation row of `k` values.
    pub fn row_bytes(self, k: usize) -> usize {
        match self {
            ActFormat::F32 => 4 * k,
            ActFormat::Q8_0 => k / 32 * 34,
            ActFormat::Q8_1 => k / 32 * 36,
            ActFormat::Q8K => k / 256 * 292,
        }
    }
}

/// Quantize one f32 row `x[k]` into `out[act.row_bytes(k)]`.
pub type QuantizeActFn = fn(x: &[f32], out: &mut [u8]);

/// `out[i * out_stride + j] = dot(weight row j, activation row i)` for `j < nw`, `i < na`.
/// `w` holds `nw` packed weight rows of `k` values back to back; `a` holds `na` activation
/// rows of `k` values in the kernel's `ActFormat`, back to back.
pub type GemmFn =
    fn(k: usize, w: &[u8], nw: usize, a: &[u8], na: usize, out: &mut [f32], out_stride: usize);

/// The kernels for one weight type on this CPU.
#[derive(Clone, Copy)]
pub struct MatKernel {
    pub act: ActFormat,
    pub quantize_act: QuantizeActFn,
    pub gemm: GemmFn,
    /// Which implementation was picked ("avx2", "scalar", ...), for `bench` and `doctor`.
    pub isa: &'static str,
}

/// Instruction-set features detected at run time.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avxvnni: bool,
}

impl CpuFeatures {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                fma: std::arch::is_x86_feature_detected!("fma"),
                f16c: std::arch::is_x86_feature_detected!("f16c"),
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                avx512bw: std::arch::is_x86_feature_detected!("avx512bw"),
                avx512vl: std::arch::is_x86_feature_detected!("avx512vl"),
                avx512vnni: std::arch::is_x86_feature_detected!("avx512vnni"),
                avxvnni: std::arch::is_x86_feature_detected!("avxvnni"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// AVX2 kernels need AVX2, FMA and F16C together.
    pub fn has_avx2(&self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// AVX-512 with 256-bit (VL) and byte/word (BW) instructions on top of the AVX2 set.
    pub fn has_avx512vl(&self) -> bool {
        self.has_avx2() && self.avx512f && self.avx512bw && self.avx512vl
    }

    /// AVX-512 F/BW/VL with VNNI (`vpdpbusd` on zmm) on top of the AVX2 set.
    pub fn has_avx512vnni(&self) -> bool {
        self.has_avx512vl() && self.avx512vnni
    }
}

/// The fastest kernel this CPU has for weights of type `ty`; `None` if the type has no
/// matmul on CPU. `scalar_only` forces the portable path (tests, `--cpu-isa scalar`).
pub fn kernel_for(ty: GgmlType, feats: &CpuFeatures, scalar_only: bool) -> Option<MatKernel> {
    use super::{float, q2_k, q3_k, q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
    match ty {
        // Unquantized and legacy 32-weight block formats.
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::kernel(ty, feats, scalar_only),
        GgmlType::Q4_0 => Some(q4_0::kernel(feats, scalar_only)),
        GgmlType::Q4_1 => Some(q4_1::kernel(feats, scalar_only)),
        GgmlType::Q5_0 => Some(q5_0::kernel(feats, scalar_only)),
        GgmlType::Q5_1 => Some(q5_1::kernel(feats, scalar_only)),
        GgmlType::Q8_0 => Some(q8_0::kernel(feats, scalar_only)),
        // K-quants, dotted with Q8_K activations.
        GgmlType::Q2_K => Some(q2_k::kernel(feats, scalar_only)),
        GgmlType::Q3_K => Some(q3_k::kernel(feats, scalar_only)),
        GgmlType::Q4_K => Some(q4_k::kernel(feats, scalar_only)),
        GgmlType::Q5_K => Some(q5_k::kernel(feats, scalar_only)),
        GgmlType::Q6_K => Some(q6_k::kernel(feats, scalar_only)),
        // Low-bit formats.
        GgmlType::Q1_0 => Some(super::q1_0::kernel(feats, scalar_only)),
        GgmlType::TQ2_0 => Some(super::tq2_0::kernel(feats, scalar_only)),
        GgmlType::Q2_0 => Some(super::q2_0::kernel_q2_0(feats, scalar_only)),
        GgmlType::PQ2_0 => Some(super::q2_0::kernel_pq2_0(feats, scalar_only)),
        GgmlType::IQ4_NL => Some(super::iq4_nl::kernel(feats, scalar_only)),
        GgmlType::PTQ1_0 => Some(super::ptq1_0::kernel(feats, scalar_only)),
        GgmlType::TQ1_0 => Some(super::tq1_0::kernel(feats, scalar_only)),
        GgmlType::IQ4_XS => Some(super::iq4_xs::kernel(feats, scalar_only)),
        GgmlType::IQ2_XXS => Some(super::iq_grid::kernel::<super::iq_grid::Iq2Xxs>(
            feats,
            scalar_only,
        )),
        GgmlType::IQ2_XS => Some(super::iq2_xs::kernel(feats, scalar_only)),
        GgmlType::IQ2_S => Some(super::iq_grid::kernel::<super::iq_grid::Iq2S>(
            feats,
            scalar_only,
        )),
        GgmlType::IQ3_XXS => Some(super::iq_grid::kernel::<super::iq_grid::Iq3Xxs>(
            feats,
            scalar_only,
        )),
        GgmlType::IQ3_S => Some(super::iq_grid::kernel::<super::iq_grid::Iq3S>(
            feats,
            scalar_only,
        )),
        GgmlType::IQ1_S => Some(super::iq_grid::kernel::<super::iq_grid::Iq1S>(
            feats,
            scalar_only,
        )),
        GgmlType::IQ1_M => Some(super::iq_grid::kernel::<super::iq_grid::Iq1M>(
            feats,
            scalar_only,
        )),
        _ => None,
    }
}
