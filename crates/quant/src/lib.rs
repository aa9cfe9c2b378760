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
    Ragged {
        ty: &'static str,
        len: usize,
        block: usize,
    },
    #[error("buffer of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
}

/// Dequantize a row of `out.len()` values of type `ty` from its packed bytes.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let want = ty.row_bytes(out.len()).ok_or(QuantError::Ragged {
        ty: ty.name(),
        len: out.len(),
        block: ty.info().block,
    })?;
    if src.len() != want {
        return Err(QuantError::Size {
            got: src.len(),
            want,
        });
    }
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        _ => return Err(QuantError::Unsupported(ty.name().to_string())),
    }
    Ok(())
}
