//! Q5_1 weights × Q8_1 activations: kernel selection and the portable path, which is the
//! quant crate's reference dot (`neagari_quant::q5_1::dot`) row by row.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

super::tiles::legacy_format!("Q5_1", q5_1, Q5_1, Q8_1, q8_1, gemm_unsigned, w_bytes: 24, a_bytes: 36);
