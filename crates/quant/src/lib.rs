//! Block formats of packed weights: layouts, the scalar reference dequantization and dot
//! product (the truth every SIMD and CUDA kernel is tested against), and quantizers.
//!
//! One file per format. Block structs are `#[repr(C)]` with only byte fields (alignment 1),
//! so a slice of them can be viewed directly over mmap'd file bytes with `bytemuck`.

mod types;
pub use types::{GgmlType, TypeInfo};

pub mod float;
mod legacy;
pub mod mlx_affine;
pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q5_1;
pub mod q8_0;
pub mod q8_1;

pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q8_0::BlockQ8_0;
pub use q8_1::BlockQ8_1;

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

pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
mod iq_common;
mod iq_dispatch;
pub mod iq_grids;
mod lowbit;
pub mod pq2_0;
pub mod ptq1_0;
pub mod q1_0;
pub mod q2_0;
pub mod tq1_0;
pub mod tq2_0;

pub use iq1_m::BlockIQ1_M;
pub use iq1_s::BlockIQ1_S;
pub use iq2_s::BlockIQ2_S;
pub use iq2_xs::BlockIQ2_XS;
pub use iq2_xxs::BlockIQ2_XXS;
pub use iq3_s::BlockIQ3_S;
pub use iq3_xxs::BlockIQ3_XXS;
pub use iq4_nl::BlockIQ4_NL;
pub use iq4_xs::BlockIQ4_XS;
pub use pq2_0::BlockPQ2_0;
pub use ptq1_0::BlockPTQ1_0;
pub use q1_0::BlockQ1_0;
pub use q2_0::BlockQ2_0;
pub use tq1_0::BlockTQ1_0;
pub use tq2_0::BlockTQ2_0;

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

/// Checks that `n` values of `ty` fill whole blocks and take `bytes` bytes.
fn check_row(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let info = ty.info();
    let want = ty.row_bytes(n).ok_or(QuantError::Ragged {
        ty: info.name,
        len: n,
        block: info.block,
    })?;
    if bytes != want {
        return Err(QuantError::Size { got: bytes, want });
    }
    Ok(())
}

/// Views checked bytes as blocks (all block types have alignment 1, so only the length can
/// fail, and `check_row` has already made it a whole number of blocks).
fn blocks<T: bytemuck::Pod>(src: &[u8]) -> Result<&[T], QuantError> {
    bytemuck::try_cast_slice(src).map_err(|_| QuantError::Size {
        got: src.len(),
        want: src.len() / std::mem::size_of::<T>() * std::mem::size_of::<T>(),
    })
}

fn blocks_mut<T: bytemuck::Pod>(dst: &mut [u8]) -> Result<&mut [T], QuantError> {
    let len = dst.len();
    bytemuck::try_cast_slice_mut(dst).map_err(|_| QuantError::Size {
        got: len,
        want: len / std::mem::size_of::<T>() * std::mem::size_of::<T>(),
    })
}

/// Dequantizes one row: `src` holds `out.len()` values of type `ty` (whole blocks).
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_row(ty, out.len(), src.len())?;
    match ty {
        // Unquantized and legacy 32-weight block formats.
        GgmlType::F32 => float::dequantize_f32(src, out),
        GgmlType::F16 => float::dequantize_f16(src, out),
        GgmlType::BF16 => float::dequantize_bf16(src, out),
        GgmlType::Q4_0 => q4_0::dequantize(blocks(src)?, out),
        GgmlType::Q4_1 => q4_1::dequantize(blocks(src)?, out),
        GgmlType::Q5_0 => q5_0::dequantize(blocks(src)?, out),
        GgmlType::Q5_1 => q5_1::dequantize(blocks(src)?, out),
        GgmlType::Q8_0 => q8_0::dequantize(blocks(src)?, out),
        GgmlType::Q8_1 => q8_1::dequantize(blocks(src)?, out),
        _ => {
            if let Some(r) = k_common::dequantize_row_k(ty, src, out) {
                return r;
            }
            if let Some(r) = lowbit::dequantize_row(ty, src, out) {
                return r;
            }
            return Err(QuantError::Unsupported(ty.name().to_string()));
        }
    }
    Ok(())
}

/// Quantizes one row `x` into `out` (whole blocks of type `ty`) with ggml's reference
/// (`_ref`) quantizer for that type.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_row(ty, x.len(), out.len())?;
    match ty {
        // Unquantized and legacy 32-weight block formats.
        GgmlType::F32 => {
            for (c, v) in out.chunks_exact_mut(4).zip(x) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => float::quantize_row_f16(x, out),
        GgmlType::BF16 => float::quantize_row_bf16(x, out),
        GgmlType::Q4_0 => q4_0::quantize_row(x, blocks_mut(out)?),
        GgmlType::Q4_1 => q4_1::quantize_row(x, blocks_mut(out)?),
        GgmlType::Q5_0 => q5_0::quantize_row(x, blocks_mut(out)?),
        GgmlType::Q5_1 => q5_1::quantize_row(x, blocks_mut(out)?),
        GgmlType::Q8_0 => q8_0::quantize_row(x, blocks_mut(out)?),
        GgmlType::Q8_1 => q8_1::quantize_row(x, blocks_mut(out)?),
        _ => {
            if let Some(r) = k_common::quantize_row_k(ty, x, out) {
                return r;
            }
            if let Some(r) = lowbit::quantize_row(ty, x, out) {
                return r;
            }
            return Err(QuantError::Unsupported(ty.name().to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_reject_bad_shapes() {
        let mut out = [0f32; 33];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0; 18], &mut out),
            Err(QuantError::Ragged { .. })
        ));
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q4_0, &[0; 17], &mut out),
            Err(QuantError::Size { got: 17, want: 18 })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::IQ2_XXS, &[0; 18], &mut out),
            Err(QuantError::Ragged { .. })
        ));
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::MXFP4, &[0; 17], &mut out),
            Err(QuantError::Unsupported(_))
        ));
        let mut bytes = [0u8; 17];
        assert!(quantize_row(GgmlType::Q4_0, &[0.0; 32], &mut bytes).is_err());
    }
}

#[cfg(test)]
mod robustness {
    use super::*;

    /// Weights from a damaged checkpoint (inf, NaN, subnormal scales) reach the quantizers
    /// through `neagari quantize`; they must give some blocks, never a panic.
    #[test]
    fn quantizers_survive_non_finite_and_subnormal_rows() {
        let rows: [(&str, f32); 4] = [
            ("inf", f32::INFINITY),
            ("-inf", f32::NEG_INFINITY),
            ("nan", f32::NAN),
            ("subnormal", 1e-42),
        ];
        for id in 0..200 {
            let Some(ty) = GgmlType::from_id(id) else {
                continue;
            };
            let info = ty.info();
            let n = 256usize.div_ceil(info.block) * info.block;
            for (what, v) in rows {
                // One odd value among ordinary ones, and a row of nothing else.
                let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
                x[5] = v;
                let mut out = vec![0u8; n / info.block * info.bytes];
                for row in [x, vec![v; n]] {
                    match quantize_row(ty, &row, &mut out) {
                        Ok(()) | Err(QuantError::Unsupported(_)) => {}
                        Err(e) => panic!("{} on a {what} row: {e}", ty.name()),
                    }
                }
            }
        }
    }
}
