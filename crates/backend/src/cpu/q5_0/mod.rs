//! Q5_0 weights × Q8_0 activations: kernel selection and the portable path, which is the
//! quant crate's reference dot (`neagari_quant::q5_0::dot`) row by row.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

super::tiles::legacy_format!("Q5_0", q5_0, Q5_0, Q8_0, q8_0, gemm_unsigned, w_bytes: 22, a_bytes: 34);
