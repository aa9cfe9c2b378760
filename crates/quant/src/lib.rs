//! Block formats of packed weights: layouts, the scalar reference dequantization and dot
//! product (the truth every SIMD and CUDA kernel is tested against), and quantizers.
//!
//! One file per format. Block structs are `#[repr(C)]` with only byte fields (alignment 1),
//! so a slice of them can be viewed directly over mmap'd file bytes with `bytemuck`.

mod types;
pub use types::{GgmlType, TypeInfo};

#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("tensor type {0} is not supported")]
    Unsupported(String),
    #[error("row of {len} elements is not a multiple of the {ty} block size {block}")]
    Ragged { ty: &'static str, len: usize, block: usize },
    #[error("buffer of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
}
