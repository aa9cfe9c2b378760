//! Q4_1 weights × Q8_1 activations: kernel selection and the portable path, which is the
//! quant crate's reference dot (`neagari_quant::q4_1::dot`) row by row.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

super::tiles::legacy_format!("Q4_1", q4_1, Q4_1, Q8_1, q8_1, gemm_unsigned, w_bytes: 20, a_bytes: 36);
