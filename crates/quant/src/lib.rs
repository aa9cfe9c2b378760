//! Block formats of packed weights: layouts, the scalar reference dequantization and dot
//! product (the truth every SIMD and CUDA kernel is tested against), and quantizers.
//!
//! One file per format. Block structs are `#[repr(C)]` with only byte fields (alignment 1),
//! so a slice of them can be viewed directly over mmap'd file bytes with `bytemuck`.

mod types;
pub use types::{GgmlType, TypeInfo};

pub mod k_common;
pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_k;

pub use q2_k::BlockQ2_K;
pub use q3_k::BlockQ3_K;
pub use q4_k::BlockQ4_K;
pub use q5_k::BlockQ5_K;
pub use q6_k::BlockQ6_K;
pub use q8_k::BlockQ8_K;

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported")]
    Unsupported(String),
    #[error("row of {len} elements is not a multiple of the {ty} block size {block}")]
    Ragged {
        ty: &'static str,
        len: usize,
        block: usize,
    },
    #[error("buffer of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
}

/// Dequantizes one row: `src` holds `out.len()` values of type `ty` (whole blocks).
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if let Some(r) = k_common::dequantize_row_k(ty, src, out) {
        return r;
    }
    Err(QuantError::Unsupported(ty.name().to_string()))
}

/// Quantizes one row `x` into `out` (whole blocks of type `ty`) with ggml's reference
/// (`_ref`) quantizer for that type.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    if let Some(r) = k_common::quantize_row_k(ty, x, out) {
        return r;
    }
    Err(QuantError::Unsupported(ty.name().to_string()))
}
